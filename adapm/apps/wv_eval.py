"""Quality of word vectors, as gensim measures it.

- :func:`analogy_counts`: ``evaluate_word_analogies`` — for a : b :: c : d, the answer is the
  word whose vector has the highest cosine with unit(b) - unit(a) + unit(c), a, b and c excluded;
  questions with a word outside the vocabulary's ``restrict`` most frequent words are skipped;
  words match case-insensitively (the most frequent spelling wins).
- :func:`similarity_spearman`: ``evaluate_word_pairs`` — Spearman's rank correlation between the
  cosine of each pair and its score, over the pairs whose words are both known.

Both are matrix products over the whole (normalised) embedding matrix, in chunks.
"""

from __future__ import annotations

import numpy as np

# gensim's default restrict_vocab of evaluate_word_analogies.
RESTRICT_VOCAB = 300_000
# Scores computed per chunk of questions: at most this many floats at once (256 MB).
_CHUNK_FLOATS = 1 << 26


def _index(words: list[str], restrict: int) -> dict[str, int]:
    """Upper-cased word -> id of its most frequent spelling, among the first ``restrict``."""
    out: dict[str, int] = {}
    for i, w in enumerate(words[:restrict]):
        out.setdefault(w.upper(), i)
    return out


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def analogy_counts(vectors: np.ndarray, words: list[str], questions,
                   restrict: int = RESTRICT_VOCAB) -> tuple[int, int]:
    """(correct, answered) over ``questions`` [(a, b, c, d), ...]; see the module doc."""
    index = _index(words, restrict)
    ids = [[index.get(w.upper(), -1) for w in q] for q in questions]
    ids = np.array([q for q in ids if min(q) >= 0], dtype=np.int64).reshape(-1, 4)
    if len(ids) == 0:
        return 0, 0
    unit = unit_rows(vectors[:min(restrict, len(vectors))])
    chunk = max(1, _CHUNK_FLOATS // len(unit))
    correct = 0
    for i in range(0, len(ids), chunk):
        q = ids[i:i + chunk]
        target = unit_rows(unit[q[:, 1]] - unit[q[:, 0]] + unit[q[:, 2]])
        scores = target @ unit.T
        rows = np.arange(len(q))
        for col in range(3):
            scores[rows, q[:, col]] = -np.inf
        correct += int((scores.argmax(axis=1) == q[:, 3]).sum())
    return correct, len(ids)


def similarity_spearman(vectors: np.ndarray, words: list[str], pairs) -> tuple[float, int]:
    """(Spearman's rho, pairs used) over ``pairs`` [(w1, w2, score), ...]; NaN when fewer than
    two pairs are known."""
    from scipy.stats import spearmanr

    index = _index(words, len(words))
    known = [(index[a.upper()], index[b.upper()], s) for a, b, s in pairs
             if a.upper() in index and b.upper() in index]
    if len(known) < 2:
        return float("nan"), len(known)
    a, b, score = (np.array(col) for col in zip(*known))
    unit = unit_rows(vectors)
    cosine = (unit[a] * unit[b]).sum(axis=1)
    rho = spearmanr(cosine, score).statistic
    return float(rho), len(known)
