"""Filtered link-prediction evaluation: ranks, additive rank sums, MRR and hits@k.

For an eval triple (h, r, t), the tail query scores (h, r, e) for every entity e and the head
query scores (e, r, t). *Filtered* (Bordes et al. 2013): every other answer known to be true
(any triple of train, valid or test, given to :class:`FilterIndex`) is removed from the
candidates; the true answer itself stays. Ties count as the mean of the optimistic and the
pessimistic rank::

    rank = 1 + #(score > s_true) + #(score == s_true, other candidates) / 2

Scores are float32 matrix products (BLAS), one batch of queries against all entities at a time;
the true score is read from the same matrix, so ties between candidates are ties exactly.

Score functions (``ent``: (E, We), ``rel``: (R, Wr) float32; d = embedding dim):

- ``complex``: We = Wr = 2d, real parts in columns [0, d), imaginary in [d, 2d);
  score = Re(<h, r, conj(t)>) = Σ h_re r_re t_re + h_im r_re t_im + h_re r_im t_im − h_im r_im t_re
- ``distmult``: We = Wr = d; score = Σ h r t
- ``rescal``: We = d, Wr = d²: a relation row is its d×d matrix, row-major; score = hᵀ R t
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgument

MODELS = ("complex", "distmult", "rescal")
SCORE_BYTES = 64 << 20  # the default batch keeps each float32 score matrix around this size

# rank_sums() layout: count, Σ 1/rank, Σ rank, then #rank <= k for each k of HITS_AT.
HITS_AT = (1, 3, 10)


class FilterIndex:
    """All known true triples, indexed for the filtered setting.

    Built once from train + valid + test (int64, shape (n, 3); duplicates are fine). Two sorted
    CSR-like tables: (h, r) -> true tails and (r, t) -> true heads, each keyed by one int64.
    """

    def __init__(self, triples: np.ndarray) -> None:
        t = _as_triples(triples, "triples")
        if len(t) and t.min() < 0:
            raise InvalidArgument("triples: ids must be >= 0")
        self._num_relations = int(t[:, 1].max()) + 1 if len(t) else 0
        self._tail_keys, self._tail_vals = self._table(t[:, 0], t[:, 1], t[:, 2])
        self._head_keys, self._head_vals = self._table(t[:, 2], t[:, 1], t[:, 0])

    def _table(self, entity, relation, answer):
        """(sorted keys, answers) with key = entity * R + relation, duplicates removed."""
        keys = entity * self._num_relations + relation
        order = np.lexsort((answer, keys))
        keys, answer = keys[order], answer[order]
        fresh = np.ones(len(keys), bool)
        fresh[1:] = (keys[1:] != keys[:-1]) | (answer[1:] != answer[:-1])
        return keys[fresh], answer[fresh]

    def tails(self, heads: np.ndarray, relations: np.ndarray):
        """The true tails of each query (heads[i], relations[i], ·) as pairs (rows, entities):
        entity ``entities[k]`` completes query ``rows[k]`` to a known true triple."""
        return self._lookup(self._tail_keys, self._tail_vals, heads, relations)

    def heads(self, relations: np.ndarray, tails: np.ndarray):
        """The true heads of each query (·, relations[i], tails[i]), as :meth:`tails` does."""
        return self._lookup(self._head_keys, self._head_vals, tails, relations)

    def _lookup(self, keys, vals, entity, relation):
        entity = np.asarray(entity, np.int64)
        relation = np.asarray(relation, np.int64)
        query = entity * self._num_relations + relation
        # A relation the index never saw would alias another key: give it no match.
        query[(relation < 0) | (relation >= self._num_relations)] = -1
        lo = np.searchsorted(keys, query, side="left")
        hi = np.searchsorted(keys, query, side="right")
        counts = hi - lo
        rows = np.repeat(np.arange(len(query)), counts)
        # Position k of the output reads vals[lo[row] + (k - start of row's run)].
        run_start = np.cumsum(counts) - counts
        pos = np.arange(len(rows)) - np.repeat(run_start - lo, counts)
        return rows, vals[pos]


def rank(model: str, ent: np.ndarray, rel: np.ndarray, triples: np.ndarray,
         filter_index: FilterIndex, batch_size: int | None = None) -> np.ndarray:
    """Filtered ranks (float64, length 2n): ``[:n]`` of the true tails, ``[n:]`` of the heads.

    ``batch_size``: queries scored at once; default keeps the (batch, E) float32 score matrix
    near :data:`SCORE_BYTES`.
    """
    if model not in MODELS:
        raise InvalidArgument(f"model={model!r} is not one of {MODELS}")
    ent, rel = _as_embeddings(model, ent, rel)
    t = _as_triples(triples, "triples")
    E, R = len(ent), len(rel)
    for col, size, what in ((0, E, "head"), (1, R, "relation"), (2, E, "tail")):
        if len(t) and (t[:, col].min() < 0 or t[:, col].max() >= size):
            raise InvalidArgument(f"triples: a {what} id is outside [0, {size})")
    if batch_size is None:
        batch_size = max(1, SCORE_BYTES // (4 * E))
    elif batch_size < 1:
        raise InvalidArgument(f"batch_size={batch_size} must be >= 1")

    n = len(t)
    ranks = np.empty(2 * n, np.float64)
    for start in range(0, n, batch_size):
        b = t[start:start + batch_size]
        h, r, tl = b[:, 0], b[:, 1], b[:, 2]
        scores = _query(model, ent, rel, h, r, tl, tails=True) @ ent.T
        ranks[start:start + len(b)] = _filtered_ranks(scores, tl, *filter_index.tails(h, r))
        scores = _query(model, ent, rel, h, r, tl, tails=False) @ ent.T
        ranks[n + start:n + start + len(b)] = _filtered_ranks(scores, h,
                                                              *filter_index.heads(r, tl))
    return ranks


def _query(model, ent, rel, h, r, t, tails: bool) -> np.ndarray:
    """Per-query vectors q with score(candidate e) = q · ent[e]."""
    if model == "distmult":
        return ent[h] * rel[r] if tails else rel[r] * ent[t]
    if model == "complex":
        d = ent.shape[1] // 2
        r_re, r_im = rel[r, :d], rel[r, d:]
        x = ent[h] if tails else ent[t]
        x_re, x_im = x[:, :d], x[:, d:]
        if tails:  # Σ t_re (h_re r_re − h_im r_im) + t_im (h_re r_im + h_im r_re)
            return np.concatenate([x_re * r_re - x_im * r_im, x_re * r_im + x_im * r_re], axis=1)
        # Σ h_re (r_re t_re + r_im t_im) + h_im (r_re t_im − r_im t_re)
        return np.concatenate([r_re * x_re + r_im * x_im, r_re * x_im - r_im * x_re], axis=1)
    d = ent.shape[1]  # rescal
    mats = rel[r].reshape(-1, d, d)
    if tails:  # hᵀ R
        return np.einsum("bi,bij->bj", ent[h], mats)
    return np.einsum("bij,bj->bi", mats, ent[t])  # R t


def _filtered_ranks(scores: np.ndarray, true: np.ndarray, rows: np.ndarray,
                    known: np.ndarray) -> np.ndarray:
    """Ranks of ``true[i]`` in row i of ``scores`` with the ``known`` answers of row i removed."""
    idx = np.arange(len(true))
    s_true = scores[idx, true].copy()
    if not np.isfinite(s_true).all():
        raise InvalidArgument("a true triple's score is not finite (embeddings overflow?)")
    scores[rows, known] = -np.inf  # removes every known answer, the true one too ...
    scores[idx, true] = s_true  # ... which is put back
    col = s_true[:, None]
    greater = np.count_nonzero(scores > col, axis=1)
    ties = np.count_nonzero(scores == col, axis=1) - 1  # minus the true answer itself
    return 1.0 + greater + ties / 2.0


def _as_triples(triples, name: str) -> np.ndarray:
    t = np.asarray(triples)
    if t.dtype.kind not in "iu" or t.ndim != 2 or t.shape[1] != 3:
        raise InvalidArgument(f"{name} must be an integer array of shape (n, 3), "
                              f"got {t.dtype} {t.shape}")
    return t.astype(np.int64, copy=False)


def _as_embeddings(model: str, ent, rel):
    """``ent``/``rel`` as float32 2-d arrays, widths checked against ``model``."""
    ent, rel = np.asarray(ent), np.asarray(rel)
    for name, a in (("ent", ent), ("rel", rel)):
        if a.dtype.kind != "f" or a.ndim != 2:
            raise InvalidArgument(f"{name} must be a 2-d float array, got {a.dtype} {a.shape}")
        if not np.isfinite(a).all():
            raise InvalidArgument(f"{name} holds NaN or infinite values")
    We, Wr = ent.shape[1], rel.shape[1]
    ok = {"complex": We == Wr and We % 2 == 0 and We > 0,
          "distmult": We == Wr and We > 0,
          "rescal": Wr == We * We and We > 0}[model]
    if not ok:
        want = {"complex": "equal even widths", "distmult": "equal widths",
                "rescal": "rel width = ent width squared"}[model]
        raise InvalidArgument(f"model={model!r} needs {want}; got ent width {We}, "
                              f"rel width {Wr}")
    return ent.astype(np.float32, copy=False), rel.astype(np.float32, copy=False)


def rank_sums(ranks: np.ndarray) -> np.ndarray:
    """float64 ``[count, Σ 1/rank, Σ rank, #rank<=1, #rank<=3, #rank<=10]``.

    Additive: the sums of disjoint rank sets add up, so nodes of a distributed evaluation can
    sum theirs before calling :func:`metrics`.
    """
    r = np.asarray(ranks, np.float64).reshape(-1)
    if len(r) and not (r >= 1).all():
        raise InvalidArgument("ranks must be >= 1")
    return np.array([len(r), (1.0 / r).sum(), r.sum(), *((r <= k).sum() for k in HITS_AT)],
                    np.float64)


def metrics(sums: np.ndarray) -> dict:
    """``{"mrr", "mr", "hits@1", "hits@3", "hits@10"}`` (means over the count) from
    :func:`rank_sums` output, possibly summed over nodes."""
    s = np.asarray(sums, np.float64)
    if s.shape != (3 + len(HITS_AT),):
        raise InvalidArgument(f"sums must have shape ({3 + len(HITS_AT)},), got {s.shape}")
    count = s[0]
    if count <= 0:
        raise InvalidArgument("sums hold no ranks (count is 0)")
    out = {"mrr": float(s[1] / count), "mr": float(s[2] / count)}
    out.update({f"hits@{k}": float(v / count) for k, v in zip(HITS_AT, s[3:])})
    return out
