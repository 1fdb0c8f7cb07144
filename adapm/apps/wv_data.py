"""Corpora for the word-vector app: :func:`read_corpus`, the evaluation files, and a generator.

Corpus: plain text, one sentence per line, tokens separated by ASCII whitespace (word2vec's
convention; any bytes but whitespace make up a token, so any encoding works and exported words
are the corpus's bytes). Lines longer than ``max_sentence`` tokens are cut into chunks (word2vec
cuts at 10,000). Tokenizing and counting run in native code over blocks of the file
(``native/kernels/wv.c``), never a per-token Python loop; the vocabulary keeps the words seen at
least ``min_count`` times, ordered by falling count (ties: first appearance), as word2vec and
gensim order it.

Evaluation files (the formats gensim's ``evaluate_word_analogies`` and ``evaluate_word_pairs``
read): analogies in the questions-words format (``: section`` lines, then ``a b c d`` meaning
a : b :: c : d); word-pair similarity as ``word1 word2 score`` lines (tabs or spaces), ``#``
comments. Bad files raise :class:`~.datafiles.DataError` naming the file and the line.

:func:`generate` writes a corpus with planted relations, its analogy questions and similarity
pairs, deterministically from a seed: analogy accuracy is measurable without any download.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _argtypes
from .._native_loader import load as _load
from .datafiles import DataError, line_at, write_atomically
from .outputs import directory_problem

_kernels = _load("adapm._kernels")

# Bytes of the corpus tokenized per native call: large enough that the call's overhead vanishes,
# small enough that the token buffers of one block stay modest (a quarter of this in int32 ids).
_BLOCK = 1 << 26
_UTF8_BOM = b"\xef\xbb\xbf"
# word2vec's cut of over-long lines (MAX_SENTENCE_LENGTH in word2vec.c).
MAX_SENTENCE = 10_000


@dataclass(frozen=True, eq=False)
class Corpus:
    """A tokenized corpus: ``words[i]`` is word id ``i`` (count ``counts[i]``, falling);
    ``tokens`` the in-vocabulary tokens (int32 word ids) of all sentences back to back;
    ``ends`` each sentence's exclusive end in ``tokens`` (sentences left empty by the
    vocabulary are dropped); ``raw_tokens`` every token of the file, in the vocabulary or not."""

    words: list[str]
    counts: np.ndarray
    tokens: np.ndarray
    ends: np.ndarray
    raw_tokens: int

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate(([0], self.ends[:-1])).astype(np.int64)

    @property
    def num_sentences(self) -> int:
        return len(self.ends)


def read_corpus(path, min_count: int = 5, max_sentence: int = MAX_SENTENCE) -> Corpus:
    """Tokenize and count ``path`` (see the module doc). Raises DataError for a missing or
    unreadable file, a NUL byte (not a text file), a corpus without tokens, or one where no
    word occurs ``min_count`` times."""
    path = Path(path)
    vocab = _kernels.vocab_new()
    id_parts, end_parts, total = [], [], 0
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot open the corpus: {exc.strerror}") from None
    with f:
        carry, line_base = b"", 0
        head = f.read(len(_UTF8_BOM))
        if head != _UTF8_BOM:  # a byte-order mark is not part of the first word
            carry = head
        while True:
            block = f.read(_BLOCK)
            data = carry + block
            if not data:
                break
            cut = len(data) if not block else data.rfind(b"\n") + 1
            if cut == 0:  # no newline yet: read on (a line longer than a block)
                carry = data
                continue
            text, carry = data[:cut], data[cut:]
            nul = text.find(b"\0")
            if nul >= 0:
                line, _ = line_at(text, nul)
                raise DataError(f"{path}:{line_base + line}: a NUL byte; the corpus must "
                                f"be plain text, one sentence per line")
            line_base += text.count(b"\n")
            ids = np.empty(len(text) // 2 + 1, dtype=np.int32)
            ends = np.empty(text.count(b"\n") + len(text) // max_sentence + 1, dtype=np.int64)
            nid, nend = _kernels.vocab_feed(vocab, text, max_sentence, ids, ends)
            id_parts.append(ids[:nid].copy())
            end_parts.append(ends[:nend] + total)
            total += nid
    size, nbytes = _kernels.vocab_size(vocab)
    if total == 0:
        raise DataError(f"{path}: the corpus holds no tokens")
    raw = bytearray(nbytes)
    offsets = np.empty(size + 1, dtype=np.int64)
    counts = np.empty(size, dtype=np.int64)
    _kernels.vocab_export(vocab, raw, offsets, counts)
    del vocab
    keep = np.flatnonzero(counts >= min_count)
    if len(keep) == 0:
        raise DataError(f"{path}: no word occurs min_count={min_count} times "
                        f"({size} distinct tokens, the most frequent {int(counts.max())} times)")
    order = keep[np.argsort(-counts[keep], kind="stable")]
    remap = np.full(size, -1, dtype=np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    tokens = remap[np.concatenate(id_parts)]
    kept = tokens >= 0
    before = np.cumsum(kept, dtype=np.int64)  # kept tokens up to and including each position
    ends = before[np.concatenate(end_parts) - 1]
    ends = ends[np.diff(ends, prepend=0) > 0]  # drop sentences left empty
    view = bytes(raw)
    words = [view[offsets[i]:offsets[i + 1]].decode("utf-8", "surrogateescape") for i in order]
    return Corpus(words, counts[order], tokens[kept], ends, total)


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """word2vec's subsampling: a token of word w is kept with probability
    (sqrt(c_w / (s T)) + 1) (s T) / c_w, capped at 1 (T: all counted tokens); s = 0: all kept."""
    counts = counts.astype(np.float64)
    if sample <= 0:
        return np.ones(len(counts))
    threshold = sample * counts.sum()
    return np.minimum(1.0, (np.sqrt(counts / threshold) + 1.0) * threshold / counts)


# ------------------------------------------------------------------------- evaluation files


def _read_text(path, what: str) -> list[str]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot open the {what} file: {exc.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, _ = line_at(data, exc.start)
        raise DataError(f"{path}:{line}: not UTF-8") from None
    # Lines end at "\n" only (as line_at counts them): str.splitlines would also break at
    # form feeds, U+2028 and more, and then name the wrong line.
    return [line.rstrip("\r") for line in text.split("\n")]


def read_analogies(path) -> list[tuple[str, list[tuple[str, str, str, str]]]]:
    """Sections of the questions-words format: [(name, [(a, b, c, d), ...]), ...]."""
    sections: list = []
    for number, line in enumerate(_read_text(path, "analogy"), 1):
        if not line.strip():
            continue
        if line.startswith(":"):
            sections.append((line[1:].strip(), []))
            continue
        fields = line.split()
        if len(fields) != 4:
            raise DataError(f"{path}:{number}: expected 4 words (a b c d) or ': section',"
                            f" got {line.strip()[:80]!r}")
        if not sections:
            raise DataError(f"{path}:{number}: a question before the first ': section' "
                            f"line")
        sections[-1][1].append(tuple(fields))
    if not any(q for _, q in sections):
        raise DataError(f"{path}: no analogy questions")
    return sections


def read_similarity(path) -> list[tuple[str, str, float]]:
    """Word pairs with a score: [(word1, word2, score), ...]. A line holds two words and a
    score: three tab-separated fields as gensim's ``evaluate_word_pairs`` reads them (an entry
    may then hold spaces), else fields separated by any whitespace; ``#`` lines are comments,
    and the file's first line is a header if its score is not a number (WordSim-353's ``Word
    1<TAB>Word 2<TAB>Human (mean)``)."""
    pairs = []
    for number, line in enumerate(_read_text(path, "similarity"), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        text = line.strip()
        fields = [f.strip() for f in text.split("\t")]
        if len(fields) != 3:  # separated by spaces, or by both
            fields = text.split()
        try:
            if len(fields) != 3 or not all(fields):
                raise ValueError
            score = float(fields[2])
            if not np.isfinite(score):
                raise ValueError
        except ValueError:
            if number == 1 and len(fields) == 3 and not _is_number(fields[2]):
                continue  # the header
            raise DataError(f"{path}:{number}: expected 'word1 word2 score' with a finite "
                            f"score, got {text[:80]!r}") from None
        pairs.append((fields[0], fields[1], score))
    if not pairs:
        raise DataError(f"{path}: no word pairs")
    return pairs



def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

# -------------------------------------------------------------------------------- generator


def generate(out_dir, sentences: int = 100_000, *, families: int = 4, pairs: int = 25,
             seed: int = 0) -> dict:
    """A corpus with planted relations, written to ``out_dir``: ``corpus.txt``,
    ``questions-words.txt`` and ``similarity.txt``. Returns the paths and counts.

    Each of ``families`` relations has ``pairs`` word pairs (x, y). A sentence is about one pair
    and one side of it: the side's word, words of the pair's topic, role words of that side of
    the family (shared by all its pairs), words of the family, and Zipf-distributed filler. So
    y - x points along the family's role difference for every pair, and x_i : y_i :: x_j : y_j
    is answerable from co-occurrence alone. Similarity pairs score topic words of one pair 9,
    of one family 5, of different families 1.
    """
    if sentences < 1 or families < 1 or pairs < 2:
        raise ValueError("generate: need sentences >= 1, families >= 1 and pairs >= 2")
    rng = np.random.default_rng([seed, 17])
    topic_words, role_words, family_words, fillers = 8, 6, 6, 400
    zipf = 1.0 / np.arange(1, fillers + 1) ** 1.1
    zipf /= zipf.sum()
    f = rng.integers(0, families, sentences)
    p = rng.integers(0, pairs, sentences)
    side = rng.integers(0, 2, sentences)
    length = rng.integers(8, 17, sentences)
    lines = []
    # Columns of a sentence, drawn in bulk: 2 topic, 2 role, 1 family word, the rest filler.
    topic = rng.integers(0, topic_words, (sentences, 2))
    role = rng.integers(0, role_words, (sentences, 2))
    fam = rng.integers(0, family_words, sentences)
    filler = rng.choice(fillers, (sentences, 11), p=zipf)
    for s in range(sentences):  # the generator is not the hot path; a readable loop is fine
        fs, ps, side_name = int(f[s]), int(p[s]), "xy"[side[s]]
        words = [f"{side_name}{fs}_{ps}",
                 f"t{fs}_{ps}_{topic[s, 0]}", f"t{fs}_{ps}_{topic[s, 1]}",
                 f"r{side_name}{fs}_{role[s, 0]}", f"r{side_name}{fs}_{role[s, 1]}",
                 f"f{fs}_{fam[s]}"]
        words += [f"w{j}" for j in filler[s, :length[s] - len(words)]]
        lines.append(" ".join(words[i] for i in rng.permutation(len(words))))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "corpus.txt", "\n".join(lines) + "\n")
    questions = []
    for fam_id in range(families):
        questions.append(f": family-{fam_id}")
        questions += [f"x{fam_id}_{i} y{fam_id}_{i} x{fam_id}_{j} y{fam_id}_{j}"
                      for i in range(pairs) for j in range(pairs) if i != j]
    _write(out / "questions-words.txt", "\n".join(questions) + "\n")
    sim_rng = np.random.default_rng([seed, 18])
    similarity = ["# word1 word2 score: topic words of one pair 9, of one family 5, else 1"]
    for _ in range(300):
        f1, f2 = sim_rng.integers(0, families, 2)
        p1, p2 = sim_rng.integers(0, pairs, 2)
        kind = sim_rng.integers(0, 3)
        if kind == 0:
            f2, p2 = f1, p1
        elif kind == 1:
            f2 = f1
        t1, t2 = sim_rng.choice(topic_words, 2, replace=False)
        score = 9 if (f1, p1) == (f2, p2) else 5 if f1 == f2 else 1
        similarity.append(f"t{f1}_{p1}_{t1}\tt{f2}_{p2}_{t2}\t{score}")
    _write(out / "similarity.txt", "\n".join(similarity) + "\n")
    return {"corpus": str(out / "corpus.txt"), "analogies": str(out / "questions-words.txt"),
            "similarity": str(out / "similarity.txt"), "sentences": sentences,
            "questions": len(questions) - families}


def _write(path: Path, text: str) -> None:
    write_atomically(path, lambda f: f.write(text.encode()))


def generate_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m adapm.apps.wv generate",
                                description="Write a corpus with planted relations, its analogy "
                                            "questions and similarity pairs.")
    p.add_argument("out_dir")
    p.add_argument("--sentences", type=_argtypes.positive_int, default=100_000)
    p.add_argument("--families", type=_argtypes.positive_int, default=4,
                   help="relations (analogy sections)")
    p.add_argument("--pairs", type=_argtypes.positive_int, default=25,
                   help="word pairs per relation (>= 2)")
    p.add_argument("--seed", type=_argtypes.non_negative_int, default=0)
    opts = p.parse_args(argv)
    if opts.pairs < 2:
        p.error("--pairs must be >= 2")
    problem = directory_problem(opts.out_dir)
    if problem:
        p.error(problem)
    try:
        info = generate(opts.out_dir, opts.sentences, families=opts.families, pairs=opts.pairs,
                        seed=opts.seed)
    except OSError as exc:
        p.error(f"{opts.out_dir}: cannot write: {exc}")
    print(f"wrote {info['corpus']} ({info['sentences']} sentences), {info['analogies']} "
          f"({info['questions']} questions), {info['similarity']}")
    return 0
