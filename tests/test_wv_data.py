"""Word-vector data (adapm.apps.wv_data: corpus reading, subsampling, evaluation files, the
generator) and evaluation (adapm.apps.wv_eval: analogies and word-pair similarity)."""

import math
import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr

from adapm.apps import wv_data, wv_eval
from adapm.apps.datafiles import DataError
from adapm.apps.wv_data import (
    generate,
    keep_probabilities,
    read_analogies,
    read_corpus,
    read_similarity,
)
from adapm.apps.wv_eval import analogy_counts, similarity_spearman

# ------------------------------------------------------------------------------ helpers


def write(tmp_path, content, name="corpus.txt"):
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    return path


def ref_corpus(data, min_count, max_sentence):
    """read_corpus in plain Python: (words, counts, tokens, ends, raw_tokens)."""
    sentences = []
    for line in data.split(b"\n"):
        toks = [t for t in re.split(rb"[ \t\r\x0b\x0c]+", line) if t]
        sentences += [toks[k:k + max_sentence] for k in range(0, len(toks), max_sentence)]
    counts = Counter(t for s in sentences for t in s)  # insertion order: first appearance
    vocab = sorted((w for w in counts if counts[w] >= min_count), key=lambda w: -counts[w])
    ids = {w: i for i, w in enumerate(vocab)}
    tokens, ends = [], []
    for s in sentences:
        kept = [ids[t] for t in s if t in ids]
        if kept:
            tokens += kept
            ends.append(len(tokens))
    words = [w.decode("utf-8", "surrogateescape") for w in vocab]
    return words, [counts[w] for w in vocab], tokens, ends, sum(map(len, sentences))


def as_tuple(corpus):
    return (corpus.words, corpus.counts.tolist(), corpus.tokens.tolist(), corpus.ends.tolist(),
            corpus.raw_tokens)


def error_of(fn, path, *args, **kwargs):
    with pytest.raises(DataError) as info:
        fn(path, *args, **kwargs)
    msg = str(info.value)
    assert str(path) in msg, msg
    return msg


# ---------------------------------------------------------------------------- read_corpus


def test_vocabulary_order_tokens_and_ends(tmp_path):
    path = write(tmp_path, "b a c a\nc b a\nd\ne e e e\n")
    c = read_corpus(path, min_count=1)
    # e: 4, a: 3, then b and c (2 each) in order of first appearance, then d
    assert c.words == ["e", "a", "b", "c", "d"]
    assert c.counts.tolist() == [4, 3, 2, 2, 1]
    assert c.tokens.tolist() == [2, 1, 3, 1, 3, 2, 1, 4, 0, 0, 0, 0]
    assert c.ends.tolist() == [4, 7, 8, 12]
    assert c.raw_tokens == 12
    assert c.num_sentences == 4 and c.starts.tolist() == [0, 4, 7, 8]
    assert c.tokens.dtype == np.int32 and c.ends.dtype == np.int64
    assert c.counts.dtype == np.int64


def test_min_count_filters_words_and_drops_empty_sentences(tmp_path):
    path = write(tmp_path, "b a c a\nd\nc b a\nd x\nx y z a\n")
    c = read_corpus(path, min_count=2)
    assert c.words == ["a", "b", "c", "d", "x"]
    assert c.counts.tolist() == [4, 2, 2, 2, 2]
    # y and z (once each) vanish from the last sentence
    assert c.tokens.tolist() == [1, 0, 2, 0, 3, 2, 1, 0, 3, 4, 4, 0]
    assert c.ends.tolist() == [4, 5, 8, 10, 12]
    c = read_corpus(path, min_count=3)
    assert c.words == ["a"] and c.counts.tolist() == [4]
    assert c.tokens.tolist() == [0] * 4
    assert c.ends.tolist() == [2, 3, 4]  # sentences 2 and 4 are left empty: dropped
    assert c.raw_tokens == 14


def test_default_min_count_is_five(tmp_path):
    path = write(tmp_path, "a b\n" * 5 + "a c\n")
    c = read_corpus(path)
    assert c.words == ["a", "b"] and c.counts.tolist() == [6, 5]


def test_long_lines_are_cut(tmp_path):
    path = write(tmp_path, "a b c d e\nf g\n\nh i j k\n")
    c = read_corpus(path, min_count=1, max_sentence=2)
    assert c.ends.tolist() == [2, 4, 5, 7, 9, 11]
    assert len(c.tokens) == 11 == c.raw_tokens
    c = read_corpus(path, min_count=1, max_sentence=1)
    assert c.ends.tolist() == list(range(1, 12))
    assert read_corpus(path, min_count=1).ends.tolist() == [5, 7, 11]  # word2vec's 10,000


def test_cut_chunks_left_empty_are_dropped(tmp_path):
    path = write(tmp_path, "a rare1 rare2 rare3 a\nb a\nb\n")
    c = read_corpus(path, min_count=2, max_sentence=2)
    # chunks: [a rare1] [rare2 rare3] [a] [b a] [b] -> [a] [] [a] [b a] [b]
    assert c.words == ["a", "b"]
    assert c.tokens.tolist() == [0, 0, 1, 0, 1]
    assert c.ends.tolist() == [1, 2, 4, 5]


def test_crlf_other_whitespace_and_no_final_newline(tmp_path):
    lf = read_corpus(write(tmp_path, "a b\nc a\n\n", "lf.txt"), min_count=1)
    for name, text in (("crlf.txt", b"a b\r\nc a\r\n\r\n"),
                       ("mixed.txt", b"  a\t\tb \x0b\r\n\x0cc  a\r\n"),
                       ("nofinal.txt", b"a b\nc a"),
                       ("nofinal_cr.txt", b"a b\r\nc a\r"),
                       ("blank_lines.txt", b"\n\n  \na b\n \t\n\nc a\n\n")):
        got = read_corpus(write(tmp_path, text, name), min_count=1)
        assert as_tuple(got) == as_tuple(lf), name


def test_a_byte_order_mark_is_not_part_of_the_first_word(tmp_path, monkeypatch):
    monkeypatch.setattr(wv_data, "_BLOCK", 2)  # the mark is read apart from the blocks
    c = read_corpus(write(tmp_path, b"\xef\xbb\xbfab cd\nab\n"), min_count=1)
    assert c.words == ["ab", "cd"] and c.counts.tolist() == [2, 1]
    c = read_corpus(write(tmp_path, b"\xef\xbbx\n"), min_count=1)  # not a whole mark
    assert [w.encode("utf-8", "surrogateescape") for w in c.words] == [b"\xef\xbbx"]


def test_non_utf8_bytes_survive(tmp_path):
    raw_words = [b"caf\xc3\xa9", b"caf\xe9", b"\xff\xfe", b"na\xefve", b"\xe2\x82", b"ok"]
    path = write(tmp_path, b" ".join(raw_words) + b"\n" + raw_words[0] + b"\n")
    c = read_corpus(path, min_count=1)
    assert c.words[0] == "café"
    assert [w.encode("utf-8", "surrogateescape") for w in c.words] == (
        [raw_words[0]] + raw_words[1:])
    assert c.counts.tolist() == [2, 1, 1, 1, 1, 1]


def test_tokens_are_case_sensitive_and_punctuation_is_kept(tmp_path):
    c = read_corpus(write(tmp_path, "The the THE the. the,\n"), min_count=1)
    assert c.words == ["The", "the", "THE", "the.", "the,"]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 16, 64])
def test_blocks_give_the_same_corpus(tmp_path, monkeypatch, block):
    """A file of many blocks (lines longer than a block, CRLF, a NUL-free last line without a
    newline) reads as one block does."""
    rng = np.random.default_rng(block)
    vocab = ["a", "bb", "ccc", "dddd", "eeeeeeeeeeeeeeeeeeee", "f\xe9"]
    lines = []
    for _ in range(40):
        n = int(rng.integers(0, 9))
        lines.append(" ".join(rng.choice(vocab, n)) + ("\r" if rng.random() < 0.2 else ""))
    text = "\n".join(lines)  # no final newline
    path = write(tmp_path, text.encode("latin-1"))
    whole = read_corpus(path, min_count=2, max_sentence=3)
    monkeypatch.setattr(wv_data, "_BLOCK", block)
    parts = read_corpus(path, min_count=2, max_sentence=3)
    assert as_tuple(parts) == as_tuple(whole)
    assert as_tuple(whole) == ref_corpus(text.encode("latin-1"), 2, 3)


def test_line_longer_than_several_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(wv_data, "_BLOCK", 7)
    text = b"x y\n" + b" ".join([b"long"] * 30) + b"\nz x\n" + b"w" * 50 + b" x\n"
    c = read_corpus(write(tmp_path, text), min_count=1, max_sentence=7)
    assert as_tuple(c) == ref_corpus(text, 1, 7)
    assert c.words[:2] == ["long", "x"] and c.ends.tolist() == [2, 9, 16, 23, 30, 32, 34, 36]


@given(data=st.lists(st.sampled_from([b"a", b"b", b"c", b"\xff", b"\xc3\xa9", b" ", b"\t",
                                      b"\r", b"\n", b"\n"]), max_size=60).map(b"".join),
       block=st.integers(1, 12), min_count=st.integers(1, 3), max_sentence=st.integers(1, 4))
@settings(max_examples=100, deadline=None)
def test_read_corpus_matches_reference(data, block, min_count, max_sentence):
    want = ref_corpus(data, min_count, max_sentence)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        path = Path(tmp) / "c.txt"
        path.write_bytes(data)
        mp.setattr(wv_data, "_BLOCK", block)
        if want[4] == 0 or not want[0]:
            with pytest.raises(DataError):
                read_corpus(path, min_count, max_sentence)
        else:
            assert as_tuple(read_corpus(path, min_count, max_sentence)) == want


@given(lines=st.lists(st.sampled_from(["a b", "", "c", "dd ee ff"]), min_size=1, max_size=12),
       nul_line=st.integers(0, 11), nul_col=st.integers(0, 8), block=st.integers(1, 20))
@settings(max_examples=60, deadline=None)
def test_nul_byte_names_its_line(lines, nul_line, nul_col, block):
    nul_line %= len(lines)
    line = lines[nul_line]
    lines[nul_line] = line[:nul_col] + "\0" + line[nul_col:]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        path = Path(tmp) / "c.txt"
        path.write_text("\n".join(lines) + "\n")
        mp.setattr(wv_data, "_BLOCK", block)
        msg = error_of(read_corpus, path, min_count=1)
    assert f":{nul_line + 1}:" in msg and "NUL" in msg


def test_nul_byte_on_line_3(tmp_path):
    path = write(tmp_path, b"a b\nc d\ne\x00f\ng\n")
    msg = error_of(read_corpus, path, min_count=1)
    assert ":3:" in msg and "NUL" in msg


@pytest.mark.parametrize("content", [b"", b"\n", b"   \t \r\n\n\x0b\x0c\n", b" "])
def test_corpus_without_tokens(tmp_path, content):
    msg = error_of(read_corpus, write(tmp_path, content), min_count=1)
    assert "no tokens" in msg


def test_missing_or_unreadable_corpus(tmp_path):
    msg = error_of(read_corpus, tmp_path / "nope.txt")
    assert "cannot open" in msg
    msg = error_of(read_corpus, tmp_path)  # a directory
    assert "cannot open" in msg


def test_no_word_reaches_min_count(tmp_path):
    path = write(tmp_path, "a b a\nc\n")
    msg = error_of(read_corpus, path, min_count=3)
    assert "min_count=3" in msg and "3 distinct tokens" in msg and "2 times" in msg
    assert read_corpus(path, min_count=2).words == ["a"]


def test_data_error_is_value_error():
    assert issubclass(DataError, ValueError)


# ------------------------------------------------------------------------ keep_probabilities


def test_keep_probabilities_match_word2vec():
    counts = np.array([1, 10, 100, 1000, 10_000, 100_000], np.int64)
    sample = 1e-3
    total = counts.sum()
    want = []
    for cn in counts:  # word2vec.c: ran = (sqrt(cn / (sample * train_words)) + 1) *
        #                               (sample * train_words) / cn; kept when ran > random
        ran = (math.sqrt(cn / (sample * total)) + 1) * (sample * total) / cn
        want.append(min(1.0, ran))
    got = keep_probabilities(counts, sample)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got.dtype == np.float64
    assert got[0] == 1.0 and got[-1] < 0.2
    assert np.all(np.diff(got) <= 0) and np.all(got > 0)


@pytest.mark.parametrize("sample", [0, 0.0, -1e-3])
def test_keep_probabilities_without_sampling(sample):
    got = keep_probabilities(np.array([5, 1, 1_000_000]), sample)
    assert got.tolist() == [1.0, 1.0, 1.0]


def test_keep_probabilities_one_word():
    # a single word: T = c, so (sqrt(c / (s c)) + 1) * s c / c = (sqrt(1 / s) + 1) * s
    got = keep_probabilities(np.array([1000]), 1e-2)
    assert got[0] == pytest.approx((math.sqrt(100) + 1) * 1e-2)


# ------------------------------------------------------------------------- read_analogies


def test_read_analogies(tmp_path):
    path = write(tmp_path, "\ufeff: capital-common\r\nAthens Greece Baghdad Iraq\r\n\r\n"
                           "Athens Greece Bangkok Thailand\n:family\nboy girl brother sister\n"
                           ": empty\n\n")
    got = read_analogies(path)
    assert got == [("capital-common", [("Athens", "Greece", "Baghdad", "Iraq"),
                                       ("Athens", "Greece", "Bangkok", "Thailand")]),
                   ("family", [("boy", "girl", "brother", "sister")]),
                   ("empty", [])]


@pytest.mark.parametrize("text, line, words", [
    (": s\na b c d\na b c\n", 3, ["expected 4 words", "'a b c'"]),
    (": s\na b c d\n\na b c d e\n", 4, ["expected 4 words"]),
    ("a b c d\n: s\na b c d\n", 1, ["before the first ': section'"]),
    ("\n\n  \na b c d\n: s\n", 4, ["before the first ': section'"]),
    (": s\n" + "x" * 300 + "\n", 2, ["expected 4 words"]),
])
def test_bad_analogy_lines(tmp_path, text, line, words):
    msg = error_of(read_analogies, write(tmp_path, text, "q.txt"))
    assert f":{line}:" in msg, msg
    for w in words:
        assert w in msg, msg
    assert len(msg) < len(str(tmp_path)) + 200  # long lines are shortened


@pytest.mark.parametrize("text", [": a\n: b\n", "", "\n\n", ": only\n\n \n"])
def test_analogies_without_questions(tmp_path, text):
    msg = error_of(read_analogies, write(tmp_path, text, "q.txt"))
    assert "no analogy questions" in msg


def test_analogies_not_utf8(tmp_path):
    msg = error_of(read_analogies, write(tmp_path, b": s\na b c d\na \xff c d\n", "q.txt"))
    assert ":3:" in msg and "UTF-8" in msg
    msg = error_of(read_analogies, tmp_path / "missing.txt")
    assert "cannot open" in msg


# ------------------------------------------------------------------------- read_similarity


def test_read_similarity(tmp_path):
    path = write(tmp_path, "# word1 word2 score\n\nold  new\t1.58\r\n  # indented comment\n"
                           "tiger\tcat\t7.35\nx y -2\nx x 1e1\n", "s.txt")
    assert read_similarity(path) == [("old", "new", 1.58), ("tiger", "cat", 7.35),
                                     ("x", "y", -2.0), ("x", "x", 10.0)]


def test_read_similarity_as_wordsim353_ships(tmp_path):
    """WordSim-353's TSV with its header line (refused as a bad line before), and a
    tab-separated entry holding a space (gensim's reader splits on tabs)."""
    path = write(tmp_path, "Word 1\tWord 2\tHuman (mean)\nlove\tsex\t6.77\n"
                           "new york\tcity\t5.5\n", "ws.tsv")
    assert read_similarity(path) == [("love", "sex", 6.77), ("new york", "city", 5.5)]
    # only a first line can be a header: a later line whose score is no number is an error
    msg = error_of(read_similarity, write(tmp_path, "a b 1\nWord 1\tWord 2\tHuman\n", "h.tsv"))
    assert ":2:" in msg and "finite score" in msg


@pytest.mark.parametrize("bad", ["a b high", "a b inf", "a b -inf", "a b nan", "a b NaN",
                                 "a b", "a b 1 2", "a", "a b 1e999"])
def test_bad_similarity_lines(tmp_path, bad):
    path = write(tmp_path, f"# c\na b 1\n{bad}\nc d 2\n", "s.txt")
    msg = error_of(read_similarity, path)
    assert ":3:" in msg and "finite score" in msg and repr(bad) in msg


@pytest.mark.parametrize("text", ["", "# only\n# comments\n", "\n \n#x y 1\n"])
def test_similarity_without_pairs(tmp_path, text):
    msg = error_of(read_similarity, write(tmp_path, text, "s.txt"))
    assert "no word pairs" in msg


def test_similarity_not_utf8(tmp_path):
    msg = error_of(read_similarity, write(tmp_path, b"a b 1\n\xc3\x28 b 2\n", "s.txt"))
    assert ":2:" in msg and "UTF-8" in msg


@pytest.mark.parametrize("reader, content", [
    (read_similarity, b"# pairs\x0c\na b 1\nc d\n"),                   # form feed
    (read_analogies, b": s\na b c d\xe2\x80\xa8\na b c\n"),            # U+2028
    (read_analogies, b": s\x1c\na b c d\na b c\n"),                    # \x1c
])
def test_error_line_counts_newlines_only(tmp_path, reader, content):
    msg = error_of(reader, write(tmp_path, content, "eval.txt"))
    assert ":3:" in msg, msg


# ------------------------------------------------------------------------------- generate


def test_generate_is_deterministic_and_readable(tmp_path):
    kw = {"families": 3, "pairs": 4, "seed": 5}
    info = generate(tmp_path / "a", 400, **kw)
    again = generate(tmp_path / "b", 400, **kw)
    other = generate(tmp_path / "c", 400, **dict(kw, seed=6))
    for name in ("corpus", "analogies", "similarity"):
        a = Path(info[name]).read_bytes()
        assert a == Path(again[name]).read_bytes(), name
        if name != "analogies":  # the questions do not depend on the seed
            assert a != Path(other[name]).read_bytes(), name
    assert info["sentences"] == 400 and info["questions"] == 3 * 4 * 3
    assert not list((tmp_path / "a").glob("*.tmp"))

    sections = read_analogies(info["analogies"])
    assert [name for name, _ in sections] == ["family-0", "family-1", "family-2"]
    questions = [q for _, qs in sections for q in qs]
    assert len(questions) == info["questions"] and len(set(questions)) == len(questions)
    assert all(len(qs) == 4 * 3 for _, qs in sections)
    assert ("x1_0", "y1_0", "x1_3", "y1_3") in questions

    pairs = read_similarity(info["similarity"])
    assert len(pairs) == 300 and {s for _, _, s in pairs} <= {1.0, 5.0, 9.0}

    corpus = read_corpus(info["corpus"], min_count=1)
    assert corpus.num_sentences == 400
    lengths = np.diff(corpus.ends, prepend=0)
    assert lengths.min() >= 8 and lengths.max() <= 16
    assert corpus.raw_tokens == len(corpus.tokens)
    words = set(corpus.words)
    for w1, w2, _ in pairs:
        assert re.fullmatch(r"t\d_\d_\d", w1) and re.fullmatch(r"t\d_\d_\d", w2)
    assert sum(q[0] in words and q[1] in words for q in questions) > len(questions) // 2


@pytest.mark.parametrize("families, pairs", [(1, 2), (2, 5)])
def test_generate_question_count(tmp_path, families, pairs):
    info = generate(tmp_path, 20, families=families, pairs=pairs, seed=1)
    assert info["questions"] == families * pairs * (pairs - 1)
    assert sum(len(q) for _, q in read_analogies(info["analogies"])) == info["questions"]


@pytest.mark.parametrize("kw", [{"sentences": 0}, {"families": 0}, {"pairs": 1}])
def test_generate_bad_arguments(tmp_path, kw):
    args = dict({"sentences": 10}, **kw)
    with pytest.raises(ValueError):
        generate(tmp_path, args.pop("sentences"), **args)


# --------------------------------------------------------------------------------- wv_eval


# 3-d vectors: man -> woman is +y, man -> king is +z; queen = woman + king - man exactly.
WORDS = ["man", "woman", "king", "queen", "Prince", "prince", "apple"]
VECTORS = np.array([[1, 0, 0],      # man
                    [1, 1, 0],      # woman
                    [1, 0, 1],      # king
                    [1, 1, 1],      # queen
                    [1, 0.2, 1],    # Prince (the most frequent spelling of PRINCE)
                    [1, 1, 0.9],    # prince: close to queen, but shadowed by Prince
                    [-1, 0, 0]],    # apple
                   np.float32)


def test_analogy_parallelogram():
    q = [("man", "woman", "king", "queen"),     # right
         ("man", "king", "woman", "queen"),     # right
         ("man", "woman", "king", "Prince"),    # wrong: queen wins
         ("woman", "man", "queen", "king"),     # right
         ("man", "woman", "king", "unknown"),   # skipped
         ("zzz", "woman", "king", "queen")]     # skipped
    assert analogy_counts(VECTORS, WORDS, q) == (3, 4)
    assert analogy_counts(VECTORS, WORDS, []) == (0, 0)
    assert analogy_counts(VECTORS, WORDS, q[4:]) == (0, 0)
    assert analogy_counts(VECTORS.astype(np.float64), WORDS, q) == (3, 4)


def test_analogy_matches_case_insensitively():
    """Question words match any spelling; each maps to its most frequent spelling (the first in
    the vocabulary), for the answer d too."""
    words = ["man", "woman", "king", "Queen", "queen"]
    right, far = [1, 1, 1], [-1, 0, 0]
    vectors = np.array(VECTORS[:3].tolist() + [right, far], np.float32)
    q = [("MAN", "Woman", "kInG", "queen")]   # QUEEN is "Queen", the right vector
    assert analogy_counts(vectors, words, q) == (1, 1)
    # "queen" (far) first: QUEEN is the far one, while the right vector (now "Queen") answers
    vectors = np.array(VECTORS[:3].tolist() + [far, right], np.float32)
    assert analogy_counts(vectors, words[:3] + ["queen", "Queen"], q) == (0, 1)
    # PRINCE is "Prince", not "prince": wrong although prince is close to the answer
    assert analogy_counts(VECTORS, WORDS, [("man", "woman", "king", "prince")]) == (0, 1)


def test_analogy_excludes_the_question_words():
    """b - a + c == b when a == c: b itself (cosine 1) is excluded, the next best answers."""
    words = ["a", "b", "near_b", "far"]
    vectors = np.array([[1, 0], [0, 1], [0.3, 1], [1, -1]], np.float32)
    assert analogy_counts(vectors, words, [("a", "b", "a", "near_b")]) == (1, 1)
    # king - man + woman is nearest to woman itself here; excluded, so queen answers
    words = ["man", "woman", "king", "queen"]
    vectors = np.array([[1, 0, 0], [0.2, 1, 0], [1, 0, 0.1], [0, 1, 0.5]], np.float32)
    assert analogy_counts(vectors, words, [("man", "king", "woman", "queen")]) == (1, 1)


def test_analogy_restrict():
    # with restrict 4, queen (id 3) is the last candidate; Prince (id 4) is outside
    assert analogy_counts(VECTORS, WORDS, [("man", "woman", "king", "queen")], restrict=4) == (
        1, 1)
    # a word beyond restrict makes the question unanswered
    assert analogy_counts(VECTORS, WORDS, [("man", "woman", "king", "queen")], restrict=3) == (
        0, 0)
    # a closer candidate beyond restrict is not considered
    words = ["man", "woman", "king", "queen", "better"]
    vectors = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 0.5], [1, 1, 1]], np.float32)
    q = [("man", "woman", "king", "queen")]
    assert analogy_counts(vectors, words, q) == (0, 1)
    assert analogy_counts(vectors, words, q, restrict=4) == (1, 1)


def test_analogy_chunks(monkeypatch):
    """Many questions over chunks of the score matrix count as one chunk does."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(50)]
    vectors = rng.normal(size=(50, 8)).astype(np.float32)
    q = [tuple(f"w{j}" for j in rng.integers(0, 50, 4)) for _ in range(200)]
    whole = analogy_counts(vectors, words, q)
    monkeypatch.setattr(wv_eval, "_CHUNK_FLOATS", 50 * 7)
    assert analogy_counts(vectors, words, q) == whole
    # brute force
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    right = 0
    for a, b, c, d in ([int(w[1:]) for w in qq] for qq in q):
        t = unit[b] - unit[a] + unit[c]
        s = unit @ (t / np.linalg.norm(t))
        s[[a, b, c]] = -np.inf
        right += int(np.argmax(s) == d)
    assert whole == (right, 200)


def test_similarity_against_scipy():
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(12)]
    vectors = rng.normal(size=(12, 5)).astype(np.float32)
    pairs = [(f"w{a}", f"W{b}", float(rng.integers(0, 4))) for a, b in rng.integers(0, 12,
                                                                                   (20, 2))]
    pairs += [("w1", "nope", 3.0), ("nope", "w2", 1.0)]
    rho, n = similarity_spearman(vectors, words, pairs)
    assert n == 20
    cos = [float(vectors[int(a[1:])] @ vectors[int(b[1:])]
                 / np.linalg.norm(vectors[int(a[1:])]) / np.linalg.norm(vectors[int(b[1:])]))
           for a, b, _ in pairs[:20]]
    want = spearmanr(cos, [s for _, _, s in pairs[:20]]).statistic
    assert rho == pytest.approx(want, rel=1e-9)
    assert isinstance(rho, float)


def test_similarity_perfect_and_reversed():
    words = ["a", "b", "c", "d"]
    vectors = np.array([[1, 0], [1, 0.1], [1, 1], [0, 1]], np.float32)
    pairs = [("a", "b", 9.0), ("a", "c", 5.0), ("a", "d", 1.0)]
    assert similarity_spearman(vectors, words, pairs) == (pytest.approx(1.0), 3)
    pairs = [(a, b, -s) for a, b, s in pairs]
    assert similarity_spearman(vectors, words, pairs) == (pytest.approx(-1.0), 3)


def test_similarity_needs_two_known_pairs():
    words = ["a", "b"]
    vectors = np.eye(2, dtype=np.float32)
    for pairs, n in (([], 0), ([("a", "b", 1.0)], 1), ([("a", "b", 1.0), ("a", "x", 2.0)], 1),
                     ([("x", "y", 1.0), ("y", "x", 2.0)], 0)):
        rho, got_n = similarity_spearman(vectors, words, pairs)
        assert math.isnan(rho) and got_n == n


def test_unit_rows_keeps_zero_rows():
    u = wv_eval.unit_rows(np.array([[3, 4], [0, 0]], np.float32))
    np.testing.assert_allclose(u, [[0.6, 0.8], [0, 0]])
    assert u.dtype == np.float32
