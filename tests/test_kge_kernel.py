"""adapm._kernels: the KGE training kernel against a float64 numpy reference, its input checks,
and the plain shared array table ops."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm import _kernels as K

MODELS = (K.MODEL_COMPLEX, K.MODEL_DISTMULT, K.MODEL_RESCAL)
LR, REG_E, REG_R = 0.1, 0.01, 0.02


# ---- float64 reference of the kernel's semantics -------------------------------------------------

def widths(model, d):
    return {K.MODEL_COMPLEX: (2 * d, 2 * d), K.MODEL_DISTMULT: (d, d),
            K.MODEL_RESCAL: (d, d * d)}[model]


def softplus(x):
    return max(x, 0.0) + np.log1p(np.exp(-abs(x)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x)) if x >= 0 else np.exp(x) / (1.0 + np.exp(x))


def score_and_partials(model, d, s, r, o):
    """f(s, r, o) and its partial derivatives for s, r, o."""
    if model == K.MODEL_COMPLEX:
        sr, si, rr, ri, orr, oi = s[:d], s[d:], r[:d], r[d:], o[:d], o[d:]
        f = np.sum(rr * sr * orr + rr * si * oi + ri * sr * oi - ri * si * orr)
        gs = np.concatenate([rr * orr + ri * oi, rr * oi - ri * orr])
        gr = np.concatenate([sr * orr + si * oi, sr * oi - si * orr])
        go = np.concatenate([rr * sr - ri * si, rr * si + ri * sr])
        return f, gs, gr, go
    if model == K.MODEL_DISTMULT:
        return np.sum(s * r * o), r * o, s * o, s * r
    m = r.reshape(d, d)
    return s @ m @ o, m @ o, np.outer(s, o).ravel(), m.T @ s


def ref_step(model, d, vals, offs, s, r, o, label, lr, reg_e, reg_r):
    """One step on float64 vals in place; returns (bce, reg)."""
    we, wr = widths(model, d)
    rows = [(s, we), (r, wr), (o, we)]
    emb = [vals[offs[i]:offs[i] + w].copy() for i, w in rows]
    f, *grads = score_and_partials(model, d, *emb)
    dl = sigmoid(f) - label
    bce = softplus(-f) if label else softplus(f)
    grads = [dl * g for g in grads]
    reg = 0.0
    if label:
        weights = (reg_e, reg_r, reg_e)
        grads = [g + w * e for g, w, e in zip(grads, weights, emb)]
        reg = sum(w * float(e @ e) for w, e in zip(weights, emb))
    for (i, w), g in zip(rows, grads):  # s, r, o in this order, a repeated row twice
        off = offs[i]
        acc = vals[off + w:off + 2 * w] + g * g
        vals[off + w:off + 2 * w] = acc
        with np.errstate(divide="ignore", invalid="ignore"):
            delta = np.where(acc > 0, -lr * g / np.sqrt(acc), 0.0)
        vals[off:off + w] += delta
    return bce, reg


def ref_batch(model, d, values, offs, triples, neg_heads, neg_tails, lr, reg_e, reg_r):
    """Returns (values after, bce sum, reg sum); lr and the weights rounded to float32 as the
    kernel uses them."""
    lr, reg_e, reg_r = (float(np.float32(x)) for x in (lr, reg_e, reg_r))
    vals = values.astype(np.float64)
    triples = np.asarray(triples).reshape(-1, 3)
    neg_heads, neg_tails = np.ravel(neg_heads), np.ravel(neg_tails)
    b = len(triples)
    k = len(neg_heads) // b if b else 0
    bce = reg = 0.0
    for i, (h, r, t) in enumerate(triples):
        steps = [(h, r, t, 1)]
        for j in range(k):
            steps += [(h, r, neg_tails[i * k + j], 0), (neg_heads[i * k + j], r, t, 0)]
        for s, rr, o, label in steps:
            lb, lr_ = ref_step(model, d, vals, offs, s, rr, o, label, lr, reg_e, reg_r)
            bce += lb
            reg += lr_
    return vals, bce, reg


# ---- batch construction ------------------------------------------------------------------------

def make_rows(rng, model, d, n_ent, n_rel, acc_low=0.05, scale=0.5):
    """values holding n_ent entity rows then n_rel relation rows, shuffled, with gaps between
    them (the kernel must touch neither the gaps nor their updates). Returns (values, offsets,
    gap mask)."""
    we, wr = widths(model, d)
    lens = [2 * we] * n_ent + [2 * wr] * n_rel
    order = rng.permutation(len(lens))
    offs = np.zeros(len(lens), np.int64)
    pos = int(rng.integers(0, 3))
    for i in order:
        offs[i] = pos
        pos += lens[i] + int(rng.integers(0, 3))
    values = np.full(pos + int(rng.integers(0, 3)), 7.5, np.float32)
    gap = np.ones(len(values), bool)
    for i, n in enumerate(lens):
        w = n // 2
        o = offs[i]
        values[o:o + w] = rng.normal(0, scale, w)
        values[o + w:o + n] = rng.uniform(acc_low, 1.0, w)
        gap[o:o + n] = False
    return values, offs, gap


def run_kernel(model, d, values, offs, triples, neg_heads, neg_tails, lr=LR, reg_e=REG_E,
               reg_r=REG_R):
    """Runs the kernel on a copy; returns (values after, updates, bce, reg)."""
    after = values.copy()
    updates = np.full(len(values), np.nan, np.float32)  # garbage the kernel must overwrite
    bce, reg = K.kge_train_batch(model, d, after, offs, triples, neg_heads, neg_tails, updates,
                                 lr, reg_e, reg_r)
    return after, updates, bce, reg


def check_against_reference(model, d, values, offs, gap, triples, neg_heads, neg_tails,
                            lr=LR, reg_e=REG_E, reg_r=REG_R):
    after, updates, bce, reg = run_kernel(model, d, values, offs, triples, neg_heads, neg_tails,
                                          lr, reg_e, reg_r)
    want, want_bce, want_reg = ref_batch(model, d, values, offs, triples, neg_heads, neg_tails,
                                         lr, reg_e, reg_r)
    np.testing.assert_allclose(after, want, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(values.astype(np.float64) + updates, after, rtol=0, atol=2e-5)
    assert np.all(updates[gap] == 0) and np.all(after[gap] == values[gap])
    assert isinstance(bce, float) and isinstance(reg, float)
    assert bce == pytest.approx(want_bce, rel=2e-4, abs=1e-6)
    assert reg == pytest.approx(want_reg, rel=2e-4, abs=1e-7)


def random_batch(rng, n_ent, n_rel, b, k):
    """Row indices: entities are rows [0, n_ent), relations [n_ent, n_ent + n_rel)."""
    triples = np.stack([rng.integers(0, n_ent, b), rng.integers(n_ent, n_ent + n_rel, b),
                        rng.integers(0, n_ent, b)], axis=1).astype(np.int64)
    neg_heads = rng.integers(0, n_ent, b * k).astype(np.int64)
    neg_tails = rng.integers(0, n_ent, b * k).astype(np.int64)
    return triples, neg_heads, neg_tails


# ---- the kernel against the reference ------------------------------------------------------------

def test_widths_and_constants():
    assert (K.MODEL_COMPLEX, K.MODEL_DISTMULT, K.MODEL_RESCAL) == (0, 1, 2)
    assert K.kge_widths(K.MODEL_COMPLEX, 100) == (200, 200)
    assert K.kge_widths(K.MODEL_DISTMULT, 7) == (7, 7)
    assert K.kge_widths(K.MODEL_RESCAL, 5) == (5, 25)
    assert K.kge_widths(model=K.MODEL_RESCAL, dim=1) == (1, 1)
    for model, dim in ((3, 4), (-1, 4), (K.MODEL_COMPLEX, 0), (K.MODEL_DISTMULT, -2)):
        with pytest.raises(ValueError):
            K.kge_widths(model, dim)


@given(model=st.sampled_from(MODELS), d=st.integers(1, 8), b=st.integers(1, 5),
       k=st.integers(0, 3), n_ent=st.integers(1, 6), n_rel=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_matches_reference(model, d, b, k, n_ent, n_rel, seed):
    # Few entity rows: heads equal to tails, negatives equal to the positive and rows shared by
    # several triples all come up often.
    rng = np.random.default_rng(seed)
    values, offs, gap = make_rows(rng, model, d, n_ent, n_rel)
    triples, neg_heads, neg_tails = random_batch(rng, n_ent, n_rel, b, k)
    check_against_reference(model, d, values, offs, gap, triples, neg_heads, neg_tails)


@pytest.mark.parametrize("model", MODELS)
def test_aliased_rows(model):
    """h == t, negatives equal to the positive's rows, one row in every triple."""
    rng = np.random.default_rng(model)
    d = 4
    values, offs, gap = make_rows(rng, model, d, 3, 2)
    triples = np.array([[0, 3, 0], [0, 4, 1], [1, 3, 1], [2, 3, 0]], np.int64)
    neg_tails = np.array([0, 0, 1, 0, 1, 1, 0, 2], np.int64)   # [0] and [2]: t itself
    neg_heads = np.array([0, 2, 0, 0, 1, 1, 2, 2], np.int64)   # [0]: h itself (and t)
    check_against_reference(model, d, values, offs, gap, triples, neg_heads, neg_tails)


@pytest.mark.parametrize("model", MODELS)
def test_flat_triples_and_2d_negatives(model):
    rng = np.random.default_rng(10 + model)
    values, offs, gap = make_rows(rng, model, 3, 5, 2)
    triples, neg_heads, neg_tails = random_batch(rng, 5, 2, 4, 2)
    check_against_reference(model, 3, values, offs, gap, triples.ravel(),
                            neg_heads.reshape(4, 2), neg_tails.reshape(4, 2))


def test_each_step_sees_values_before_it():
    """A single positive with s == o: gradients from the pre-step values, then AdaGrad on the
    row twice; written out by hand for DistMult d=1."""
    s, acc_s, r, acc_r = 0.5, 0.25, 2.0, 1.0
    values = np.array([s, acc_s, r, acc_r], np.float32)
    offs = np.array([0, 2], np.int64)
    after, updates, bce, reg = run_kernel(K.MODEL_DISTMULT, 1, values, offs,
                                          np.array([[0, 1, 0]], np.int64),
                                          np.empty(0, np.int64), np.empty(0, np.int64),
                                          lr=0.5, reg_e=0.0, reg_r=0.0)
    f = s * r * s
    dl = 1 / (1 + np.exp(-f)) - 1
    g_s, g_r, g_o = dl * r * s, dl * s * s, dl * s * r
    a1 = acc_s + g_s ** 2
    e1 = s - 0.5 * g_s / np.sqrt(a1)
    a2 = a1 + g_o ** 2
    e2 = e1 - 0.5 * g_o / np.sqrt(a2)
    ar = acc_r + g_r ** 2
    np.testing.assert_allclose(after, [e2, a2, r - 0.5 * g_r / np.sqrt(ar), ar], rtol=1e-6)
    np.testing.assert_allclose(values + updates, after, rtol=1e-6)
    assert bce == pytest.approx(np.log1p(np.exp(-f)), rel=1e-6)
    assert reg == 0.0


@pytest.mark.parametrize("model", MODELS)
def test_zero_accumulator_and_zero_gradient_stay_finite(model):
    """All-zero rows: every gradient is 0 and every accumulator stays 0; nothing becomes NaN."""
    d = 3
    we, wr = widths(model, d)
    values = np.zeros(2 * (2 * we) + 2 * wr, np.float32)
    offs = np.array([0, 2 * we, 4 * we], np.int64)
    after, updates, bce, reg = run_kernel(model, d, values, offs, np.array([[0, 2, 1]]),
                                          np.array([1, 0], np.int64), np.array([0, 0], np.int64))
    assert np.all(after == 0) and np.all(updates == 0)
    assert bce == pytest.approx(5 * np.log(2)) and reg == 0.0


@pytest.mark.parametrize("model", MODELS)
def test_zero_accumulator_with_gradient(model):
    """Accumulators start at 0 (acc_low=0 rows would be too ill-conditioned for random data:
    the first step moves each element by exactly -lr * sign(g)); checked on random rows with
    a tolerance that allows for the few elements whose float32 gradient is near 0."""
    rng = np.random.default_rng(20 + model)
    values, offs, gap = make_rows(rng, model, 2, 2, 1, acc_low=0.0)
    for i in range(3):  # zero the accumulators
        w = widths(model, 2)[i == 2]
        values[offs[i] + w:offs[i] + 2 * w] = 0
    after, updates, _, _ = run_kernel(model, 2, values, offs, np.array([[0, 2, 1]]),
                                      np.empty(0, np.int64), np.empty(0, np.int64))
    want, _, _ = ref_batch(model, 2, values, offs, np.array([[0, 2, 1]]), [], [], LR, REG_E,
                           REG_R)
    assert np.all(np.isfinite(after))
    np.testing.assert_allclose(after, want, rtol=1e-4, atol=1e-5)


def test_large_scores_give_finite_losses():
    values = np.array([100, 1, 100, 1, 100, 1, -100, 1], np.float32)  # DistMult d=1, 4 rows
    offs = np.array([0, 2, 4, 6], np.int64)
    after, updates, bce, reg = run_kernel(K.MODEL_DISTMULT, 1, values, offs,
                                          np.array([[0, 1, 2]]), np.array([3], np.int64),
                                          np.array([2], np.int64), reg_e=0.0, reg_r=0.0)
    # positive: score 1e6 (bce ~0); tail negative: score 1e6 (bce 1e6); head negative: -1e6 (~0)
    assert np.isfinite(bce) and bce == pytest.approx(1e6, rel=1e-6)
    assert np.all(np.isfinite(after))


def test_empty_batch_zeroes_updates():
    values = np.arange(8, dtype=np.float32)
    updates = np.full(8, 3.0, np.float32)
    got = K.kge_train_batch(K.MODEL_DISTMULT, 2, values, np.zeros(0, np.int64),
                            np.zeros((0, 3), np.int64), np.zeros(0, np.int64),
                            np.zeros(0, np.int64), updates, LR, REG_E, REG_R)
    assert got == (0.0, 0.0)
    assert np.all(updates == 0) and np.all(values == np.arange(8))


def test_keywords():
    rng = np.random.default_rng(3)
    values, offs, _ = make_rows(rng, K.MODEL_COMPLEX, 2, 3, 1)
    a, b = values.copy(), values.copy()
    ua, ub = np.empty_like(values), np.empty_like(values)
    tr = np.array([[0, 3, 1]], np.int64)
    nh, nt = np.array([2], np.int64), np.array([1], np.int64)
    got = K.kge_train_batch(K.MODEL_COMPLEX, 2, a, offs, tr, nh, nt, ua, LR, REG_E, REG_R)
    got_kw = K.kge_train_batch(model=K.MODEL_COMPLEX, dim=2, values=b, offsets=offs, triples=tr,
                               neg_heads=nh, neg_tails=nt, updates=ub, lr=LR, reg_entity=REG_E,
                               reg_relation=REG_R)
    assert got == got_kw
    assert np.array_equal(a, b) and np.array_equal(ua, ub)


# ---- rejected calls ------------------------------------------------------------------------------

@pytest.fixture
def batch():
    """A valid ComplEx d=2 batch: rows 0..3 entities, 4..5 relations; B=2, K=2."""
    rng = np.random.default_rng(7)
    values, offs, _ = make_rows(rng, K.MODEL_COMPLEX, 2, 4, 2)
    args = dict(model=K.MODEL_COMPLEX, dim=2, values=values, offsets=offs,
                triples=np.array([[0, 4, 1], [2, 5, 3]], np.int64),
                neg_heads=np.array([1, 2, 3, 0], np.int64),
                neg_tails=np.array([0, 1, 2, 3], np.int64),
                updates=np.full(len(values), 9.0, np.float32),
                lr=LR, reg_entity=REG_E, reg_relation=REG_R)
    return args


def rejected(args, exc, **change):
    """The call with `change` applied raises exc and writes nothing."""
    args = dict(args, **change)
    values = args["values"]
    before, upd_before = values.copy(), args["updates"].copy()
    with pytest.raises(exc):
        K.kge_train_batch(**args)
    assert np.array_equal(values, before)
    assert np.array_equal(args["updates"], upd_before, equal_nan=True)


def test_valid_fixture_batch_runs(batch):
    args = dict(batch, values=batch["values"].copy())
    K.kge_train_batch(**args)


@pytest.mark.parametrize("name,dtype", [
    ("values", np.float64), ("updates", np.float64), ("offsets", np.int32),
    ("offsets", np.uint64), ("triples", np.int32), ("triples", np.float64),
    ("neg_heads", np.int32), ("neg_tails", np.float32)])
def test_wrong_dtype(batch, name, dtype):
    rejected(batch, TypeError, **{name: batch[name].astype(dtype)})


def test_not_a_buffer(batch):
    rejected(batch, TypeError, triples=[[0, 4, 1], [2, 5, 3]])


def test_wrong_shapes_and_sizes(batch):
    n = len(batch["values"])
    rejected(batch, ValueError, updates=np.zeros(n - 1, np.float32))
    rejected(batch, ValueError, updates=np.zeros(n + 1, np.float32))
    rejected(batch, ValueError, triples=np.array([[0, 4], [1, 2]], np.int64))
    rejected(batch, ValueError, triples=np.array([0, 4, 1, 2], np.int64))
    rejected(batch, ValueError, triples=np.zeros((1, 2, 3), np.int64))
    rejected(batch, ValueError, neg_heads=np.array([1, 2, 3], np.int64))   # length mismatch
    rejected(batch, ValueError, neg_heads=np.array([1, 2, 3], np.int64),
             neg_tails=np.array([0, 1, 2], np.int64))                      # 3 % B != 0
    rejected(batch, ValueError, triples=np.zeros((0, 3), np.int64))       # B = 0 with negatives
    rejected(batch, ValueError, values=batch["values"].reshape(-1, 1))
    rejected(batch, ValueError, model=3)
    rejected(batch, ValueError, dim=0)


def test_layout_and_aliasing(batch):
    v = batch["values"]
    strided = np.zeros(2 * len(v), np.float32)[::2]
    rejected(batch, ValueError, values=strided)
    rejected(batch, ValueError, updates=strided)
    ro = v.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        K.kge_train_batch(**dict(batch, values=ro))
    rejected(batch, ValueError, updates=v)                       # updates is values
    both = np.zeros(2 * len(v), np.float32)
    both[:len(v)] = v
    rejected(dict(batch, values=both[:len(v)]), ValueError, updates=both[1:len(v) + 1])


@pytest.mark.parametrize("where", ["head", "relation", "tail", "neg_heads", "neg_tails"])
@pytest.mark.parametrize("bad", [-1, 6, 1 << 40])
def test_row_index_out_of_range(batch, where, bad):
    if where in ("neg_heads", "neg_tails"):
        arr = batch[where].copy()
        arr[3] = bad
        rejected(batch, ValueError, **{where: arr})
    else:
        tr = batch["triples"].copy()
        tr[1, ("head", "relation", "tail").index(where)] = bad
        rejected(batch, ValueError, triples=tr)


def test_row_count_is_the_length_of_offsets(batch):
    """Row 6 lies just past offsets' end, where memory holds a valid offset: still rejected."""
    longer = np.concatenate([batch["offsets"], batch["offsets"][:1]])
    tr = batch["triples"].copy()
    tr[0, 2] = 6
    rejected(batch, ValueError, offsets=longer[:6], triples=tr)


def test_bad_offsets(batch):
    n = len(batch["values"])
    for row, off in [(1, -1), (1, -(1 << 62)), (1, n - 7), (1, n), (1, 1 << 62),
                     (5, n - 7), (3, n - 1)]:
        offs = batch["offsets"].copy()
        offs[row] = off  # entity rows need 8 floats, relation rows 8 (ComplEx d=2)
        rejected(batch, ValueError, offsets=offs)


def test_entity_index_checked_with_entity_width():
    """RESCAL: a relation row (2*d*d floats) placed where only an entity row (2*d) fits."""
    d = 3
    values = np.zeros(2 * d * d + 4 * d, np.float32)      # 30 floats: relation row first
    offs = np.array([18, 24, 0], np.int64)                # entity, entity, relation
    ok = dict(model=K.MODEL_RESCAL, dim=d, values=values, offsets=offs,
              triples=np.array([[0, 2, 1]], np.int64), neg_heads=np.zeros(0, np.int64),
              neg_tails=np.zeros(0, np.int64), updates=np.zeros_like(values), lr=LR,
              reg_entity=REG_E, reg_relation=REG_R)
    K.kge_train_batch(**dict(ok, values=values.copy()))
    rejected(ok, ValueError, triples=np.array([[0, 1, 1]], np.int64))   # entity row as relation
    rejected(ok, ValueError, offsets=np.array([18, 24, 13], np.int64))  # 13 + 18 > 30


def test_unchecked_rows_are_not_needed():
    """Rows of offsets that no triple uses may be anything (they are never read)."""
    rng = np.random.default_rng(5)
    values, offs, gap = make_rows(rng, K.MODEL_DISTMULT, 2, 3, 1)
    offs = np.concatenate([offs, [-5, 1 << 50]]).astype(np.int64)
    check_against_reference(K.MODEL_DISTMULT, 2, values, offs, gap, np.array([[0, 3, 1]]),
                            np.array([2], np.int64), np.array([0], np.int64))


# ---- table ops -----------------------------------------------------------------------------------

def make_table(rng, lens):
    """Rows of the given lengths at shuffled offsets in a flat float32 array with gaps."""
    offs = np.zeros(len(lens), np.int64)
    pos = 0
    for i in rng.permutation(len(lens)):
        offs[i] = pos
        pos += lens[i] + int(rng.integers(0, 2))
    data = rng.normal(size=pos + 1).astype(np.float32)
    return data, offs, np.asarray(lens, np.int64)


@given(lens=st.lists(st.integers(0, 5), min_size=1, max_size=8),
       picks=st.lists(st.integers(0, 1000), max_size=20), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=150, deadline=None)
def test_table_ops_match_numpy(lens, picks, seed):
    rng = np.random.default_rng(seed)
    data, offs, key_len = make_table(rng, lens)
    keys = np.array([p % len(lens) for p in picks], np.int64)   # duplicates likely
    want = [data[offs[k]:offs[k] + key_len[k]] for k in keys]
    want = np.concatenate(want) if len(want) else np.zeros(0, np.float32)
    out = np.full(int(key_len[keys].sum()), np.nan, np.float32)
    assert K.table_gather(data, offs, key_len, keys, out) is None
    assert np.array_equal(out, want)

    upd = rng.normal(size=len(out)).astype(np.float32)
    expect = data.copy()
    pos = 0
    for k in keys:
        n = int(key_len[k])
        expect[offs[k]:offs[k] + n] += upd[pos:pos + n]
        pos += n
    assert K.table_scatter_add(data, offs, key_len, keys, upd) is None
    np.testing.assert_array_equal(data, expect)


def test_table_accepts_2d_rows():
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    offs, lens = np.array([0, 3, 6, 9], np.int64), np.full(4, 3, np.int64)
    out = np.zeros((2, 3), np.float32)
    K.table_gather(data, offs, lens, np.array([2, 0], np.int64), out)
    assert np.array_equal(out, data[[2, 0]])
    K.table_scatter_add(data=data, key_offset=offs, key_len=lens, keys=np.array([[1, 1]]),
                        upd=np.ones((2, 3), np.float32))
    assert np.array_equal(data[1], [5, 6, 7])


def test_table_concurrent_adds_are_never_lost():
    """Threads adding to the same rows (and to keys 2**20 apart, which share a lock) lose no
    add: every row ends at its exact count (small integers: float32 sums are exact)."""
    import threading

    num_keys, width, threads, rounds = (1 << 20) + 8, 4, 4, 300
    offs = np.arange(num_keys, dtype=np.int64) * width
    lens = np.full(num_keys, width, np.int64)
    data = np.zeros(num_keys * width, np.float32)
    # A few hot rows, each many times a call, so that the threads' adds overlap in time.
    keys = np.tile(np.array([0, 1, 1 << 20, (1 << 20) + 1, 5], np.int64), 2000)
    upd = np.ones(len(keys) * width, np.float32)

    def add():
        for _ in range(rounds):
            K.table_scatter_add(data, offs, lens, keys, upd)

    pool = [threading.Thread(target=add) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    rows = data.reshape(num_keys, width)
    for k in set(keys.tolist()):
        assert (rows[k] == threads * rounds * int((keys == k).sum())).all(), k


@pytest.fixture
def table():
    data = np.arange(10, dtype=np.float32)
    return dict(data=data, key_offset=np.array([0, 2, 5], np.int64),
                key_len=np.array([2, 3, 4], np.int64), keys=np.array([2, 0, 2], np.int64))


@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_table_key_count_is_the_length_of_key_offset(op):
    """Key 3 lies just past the key arrays' end, where memory holds a valid row: rejected."""
    data = np.arange(10, dtype=np.float32)
    offs, lens = np.array([0, 2, 5, 0], np.int64), np.array([2, 3, 4, 1], np.int64)
    rows = np.zeros(7, np.float32)
    fn = K.table_gather if op == "gather" else K.table_scatter_add
    with pytest.raises(ValueError):
        fn(data, offs[:3], lens[:3], np.array([2, 3, 0], np.int64), rows)
    assert np.array_equal(data, np.arange(10)) and np.all(rows == 0)


@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_table_bad_inputs(table, op):
    fn = K.table_gather if op == "gather" else K.table_scatter_add
    rows_name = "out" if op == "gather" else "upd"

    def rejected_table(exc, **change):
        args = dict(table)
        args[rows_name] = np.full(10, 4.0, np.float32)
        args.update(change)
        data_before, rows_before = args["data"].copy(), args[rows_name].copy()
        with pytest.raises(exc):
            fn(**args)
        assert np.array_equal(args["data"], data_before)
        assert np.array_equal(args[rows_name], rows_before)

    args = dict(table, **{rows_name: np.zeros(10, np.float32)})
    fn(**dict(args, data=table["data"].copy()))  # valid as given
    rejected_table(ValueError, **{rows_name: np.zeros(9, np.float32)})
    rejected_table(ValueError, **{rows_name: np.zeros(11, np.float32)})
    rejected_table(ValueError, keys=np.array([2, 3, 0], np.int64))
    rejected_table(ValueError, keys=np.array([-1, 0, 2], np.int64))
    rejected_table(ValueError, key_offset=np.array([0, 2, 7], np.int64))     # row past the end
    rejected_table(ValueError, key_offset=np.array([-1, 2, 5], np.int64))
    rejected_table(ValueError, key_offset=np.array([0, 2, 1 << 62], np.int64))
    rejected_table(ValueError, key_len=np.array([2, 3, -1], np.int64))
    rejected_table(ValueError, key_len=np.array([2, 3], np.int64))         # num_keys mismatch
    rejected_table(TypeError, data=table["data"].astype(np.float64))
    rejected_table(TypeError, keys=table["keys"].astype(np.int32))
    rejected_table(TypeError, key_offset=table["key_offset"].astype(np.float64))
    rejected_table(TypeError, key_len=table["key_len"].astype(np.int32))
    rejected_table(TypeError, **{rows_name: np.zeros(10, np.float64)})
    rejected_table(ValueError, **{rows_name: np.zeros(20, np.float32)[::2]})
    written = table["data"] if op == "scatter" else np.zeros(10, np.float32)
    written.flags.writeable = False
    try:
        with pytest.raises(ValueError):
            fn(**dict(args, **({"data": written} if op == "scatter" else {rows_name: written})))
    finally:
        table["data"].flags.writeable = True
    # the written buffer sharing memory with the table
    if op == "gather":
        with pytest.raises(ValueError):
            fn(**dict(table, out=table["data"]))
    else:
        with pytest.raises(ValueError):
            fn(**dict(table, upd=table["data"]))
