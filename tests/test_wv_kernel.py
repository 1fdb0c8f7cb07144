"""adapm._kernels, word vectors: wv_train_batch (skip-gram with negative sampling and AdaGrad)
against a float32 numpy reference that replays the kernel step by step (same sigmoid table, same
splitmix64 pool draws, same order of operations), its input checks, and the corpus tokenizer
(vocab_new / vocab_feed / vocab_size / vocab_export) against a Python reference."""

import itertools
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm._native_loader import load

K = load("adapm._kernels")

F32 = np.float32
MASK64 = (1 << 64) - 1

# ---- float32 reference of wv_train_batch ---------------------------------------------------------
#
# The kernel is built with -std=c11 (no floating-point contraction), so every float operation is
# one IEEE float32 operation; the reference performs the same ones in the same order, which keeps
# it within rounding of the kernel (the table lookups then agree too: a score near a boundary
# between two table entries would otherwise flip the entry).

SCORE_LIMIT, TABLE_STEPS = 8.0, 4096


def _softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


_X = [(2.0 * i / TABLE_STEPS - 1.0) * SCORE_LIMIT for i in range(TABLE_STEPS + 1)]
SIGMOID_TABLE = [F32(_sigmoid(x)) for x in _X]
LOG_SIGMOID_TABLE = [F32(-_softplus(-x)) for x in _X]


def table_index(x):
    """(int)((x + 8.0f) * 256.0f + 0.5f), in float32."""
    return int((F32(x) + F32(SCORE_LIMIT)) * F32(TABLE_STEPS / (2 * SCORE_LIMIT)) + F32(0.5))


def score_gradient(score, label):
    """(label - sigmoid(score) as float32, the loss term as the kernel adds it)."""
    if -SCORE_LIMIT < score < SCORE_LIMIT:
        i = table_index(score)
        s, log_s, log_not_s = (SIGMOID_TABLE[i], LOG_SIGMOID_TABLE[i],
                               LOG_SIGMOID_TABLE[TABLE_STEPS - i])
    else:
        x = float(score)
        s, log_s, log_not_s = F32(_sigmoid(x)), F32(-_softplus(-x)), F32(-_softplus(x))
    return F32(label) - s, float(log_s if label else log_not_s)


def splitmix64(state):
    """(new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def dot8(a, b):
    """The kernel's dot product: eight partial sums, the tail into the first, then pairwise."""
    n = len(a)
    n8 = n - n % 8
    p = np.zeros(8, F32)
    for i in range(0, n8, 8):
        p += a[i:i + 8] * b[i:i + 8]
    for i in range(n8, n):
        p[0] = p[0] + a[i] * b[i]
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))


def adagrad_row(values, row, g, lr, dim):
    vec, acc = values[row, :dim], values[row, dim:]
    a = acc + g * g
    acc[:] = a
    vec += lr * g / (np.sqrt(a) + (a == 0).astype(F32))


def sgd_row(values, row, g, lr, dim):
    values[row, :dim] += lr * g


def ref_train(dim, values, in_rows, out_rows, windows, ends, pool, negatives, lr, seed,
              sgd=False):
    """Returns (values after, loss, pairs); values is not changed. sgd: word2vec's update in
    place of AdaGrad's."""
    update = sgd_row if sgd else adagrad_row
    vals = np.array(values, F32).reshape(-1, 2 * dim)
    lr = F32(lr)
    rng = seed & MASK64
    loss, pairs, start = 0.0, 0, 0
    for end in ends:
        for i in range(start, end):
            center, w = out_rows[i], windows[i]
            for c in range(max(i - w, start), min(i + w, end - 1) + 1):
                if c == i:
                    continue
                pairs += 1
                inr = in_rows[c]
                neu1e = np.zeros(dim, F32)
                for d in range(negatives + 1):
                    target = center
                    if d > 0:
                        rng, z = splitmix64(rng)
                        target = pool[((z >> 32) * len(pool)) >> 32]
                        if target == center:
                            continue
                    vin, vout = vals[inr, :dim].copy(), vals[target, :dim].copy()
                    g, term = score_gradient(dot8(vin, vout), d == 0)
                    loss -= term
                    neu1e += g * vout
                    update(vals, target, g * vin, lr, dim)
                update(vals, inr, neu1e, lr, dim)
        start = end
    return vals.reshape(np.shape(values)), loss, pairs


# ---- helpers ---------------------------------------------------------------------------------------

def i64(xs):
    return np.asarray(xs, dtype=np.int64)


def make_values(rng, dim, rows, scale=0.5, acc_low=0.0):
    v = np.empty((rows, 2 * dim), F32)
    v[:, :dim] = rng.normal(0, scale, (rows, dim))
    v[:, dim:] = rng.uniform(acc_low, 1.0, (rows, dim))
    return v.ravel()


def run_kernel(dim, values, in_rows, out_rows, windows, ends, pool, negatives, lr, seed,
               sgd=False):
    """Runs the kernel on a copy of values; returns (values after, updates, loss, pairs)."""
    after = values.copy()
    updates = np.full(values.shape, np.nan, F32)  # garbage the kernel must overwrite
    loss, pairs = K.wv_train_batch(dim, after, updates, i64(in_rows), i64(out_rows),
                                   i64(windows), i64(ends), i64(pool), negatives, lr, seed,
                                   sgd=sgd)
    assert isinstance(loss, float) and isinstance(pairs, int)
    return after, updates, loss, pairs


def check_against_reference(dim, values, in_rows, out_rows, windows, ends, pool, negatives,
                            lr=0.1, seed=1, sgd=False):
    after, updates, loss, pairs = run_kernel(dim, values, in_rows, out_rows, windows, ends,
                                             pool, negatives, lr, seed, sgd)
    want, want_loss, want_pairs = ref_train(dim, values, list(in_rows), list(out_rows),
                                            list(windows), list(ends), list(pool), negatives,
                                            lr, seed, sgd)
    assert pairs == want_pairs
    np.testing.assert_allclose(after, want, rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(want_loss, rel=1e-6, abs=1e-6)
    # updates are the float32 difference, exactly
    assert np.array_equal(updates, after - values)
    return after, updates, loss, pairs


def pairs_of(lengths, windows):
    """(word, context) pairs of sentences of the given lengths (windows per position)."""
    total, pos = 0, 0
    for n in lengths:
        for i in range(n):
            w = windows[pos + i]
            total += min(i + w, n - 1) - max(i - w, 0)
        pos += n
    return total


# ---- the kernel against the reference --------------------------------------------------------------

@st.composite
def batches(draw):
    dim = draw(st.integers(1, 20))
    rows = draw(st.integers(1, 6))  # few rows: input and output rows alias across positions
    lengths = draw(st.lists(st.integers(0, 8), min_size=0, max_size=3))
    n = sum(lengths)
    row = st.integers(0, rows - 1)
    in_rows = draw(st.lists(row, min_size=n, max_size=n))
    out_rows = draw(st.lists(row, min_size=n, max_size=n))
    windows = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    negatives = draw(st.integers(0, 4))
    pool = draw(st.lists(row, min_size=1 if negatives else 0, max_size=6))
    ends = list(np.cumsum(lengths, dtype=np.int64)) if lengths else []
    scale = draw(st.sampled_from([0.05, 0.5, 2.0]))  # 2.0: some scores beyond the table
    acc_low = draw(st.sampled_from([0.0, 0.1]))
    lr = draw(st.sampled_from([0.025, 0.1, 0.5]))
    seed = draw(st.integers(0, 2**64 - 1))
    values_seed = draw(st.integers(0, 2**32 - 1))
    sgd = draw(st.booleans())
    return {"sgd": sgd, "dim": dim, "rows": rows, "lengths": lengths, "in_rows": in_rows,
            "out_rows": out_rows, "windows": windows, "ends": ends, "pool": pool,
            "negatives": negatives, "scale": scale, "acc_low": acc_low, "lr": lr, "seed": seed,
            "values_seed": values_seed}


@given(b=batches())
@settings(max_examples=60, deadline=None)
def test_matches_reference(b):
    rng = np.random.default_rng(b["values_seed"])
    values = make_values(rng, b["dim"], b["rows"], b["scale"], b["acc_low"])
    after, _, loss, pairs = check_against_reference(
        b["dim"], values, b["in_rows"], b["out_rows"], b["windows"], b["ends"], b["pool"],
        b["negatives"], b["lr"], b["seed"], b["sgd"])
    assert pairs == pairs_of(b["lengths"], b["windows"])
    if b["sgd"]:  # SGD leaves the accumulators alone
        width = 2 * b["dim"]
        acc = np.arange(len(values)) % width >= b["dim"]
        assert np.array_equal(after[acc], values[acc])
    assert np.all(np.isfinite(after)) and math.isfinite(loss)
    used = set(b["in_rows"]) | set(b["out_rows"]) | set(b["pool"])
    untouched = np.setdiff1d(np.arange(b["rows"]), list(used))
    width = 2 * b["dim"]
    for r in untouched:  # rows nobody names are neither read nor written
        assert np.array_equal(after[r * width:(r + 1) * width], values[r * width:(r + 1) * width])


@pytest.mark.parametrize("sgd", [False, True])
@pytest.mark.parametrize("dim", [1, 7, 8, 9, 17, 64, 4096])
def test_dims_against_reference(dim, sgd):
    """Lengths around the eight-lane blocks of the dot product, and the largest dim."""
    rng = np.random.default_rng(dim)
    values = make_values(rng, dim, 5, scale=1.0 / math.sqrt(dim))
    check_against_reference(dim, values, [0, 1, 2, 3, 0], [4, 3, 2, 1, 4], [2, 1, 3, 2, 1],
                            [2, 5], [0, 1, 2, 3, 4], 2, lr=0.1, seed=dim, sgd=sgd)


def test_aliased_rows():
    """One row as input and output of every position, and a pool of the same row plus another:
    the output updates must be seen by the following scores of the same pair."""
    rng = np.random.default_rng(0)
    values = make_values(rng, 3, 2)
    check_against_reference(3, values, [0, 0, 0, 0], [0, 0, 0, 0], [3, 3, 3, 3], [4],
                            [0, 1, 0], 4, lr=0.5, seed=99)
    check_against_reference(3, values, [0, 1, 0], [1, 0, 1], [1, 2, 1], [3], [1, 0], 3)


def test_two_word_sentence_by_hand():
    """Sentence [a, b], window 1, no negatives, dim 1: the input vector of b predicts a's output
    vector, then the input of a predicts b's output. Scores 1 and -2 fall exactly on table
    points, so sigmoid is exact (rounded to float32)."""
    lr = 0.25
    # rows: in(a) = 0, in(b) = 1, out(a) = 2, out(b) = 3; [vector, accumulator] each
    values = np.array([2.0, 1.0, 1.0, 0.5, 1.0, 0.0, -1.0, 3.0], F32)
    after, updates, loss, pairs = run_kernel(1, values, [0, 1], [2, 3], [1, 1], [2], [], 0, lr,
                                             0)
    assert pairs == 2

    def step(vec, acc, g):
        acc = acc + g * g
        return vec + lr * g / math.sqrt(acc), acc

    want = values.astype(np.float64)
    # pair 1: in(b) = 1.0 . out(a) = 1.0 -> score 1
    g = 1 - _sigmoid(1.0)
    want[4], want[5] = step(1.0, 0.0, g * 1.0)   # out(a): gradient g * in(b)
    want[2], want[3] = step(1.0, 0.5, g * 1.0)   # in(b): gradient g * out(a) (before its step)
    # pair 2: in(a) = 2.0 . out(b) = -1.0 -> score -2
    g2 = 1 - _sigmoid(-2.0)
    want[6], want[7] = step(-1.0, 3.0, g2 * 2.0)
    want[0], want[1] = step(2.0, 1.0, g2 * -1.0)
    np.testing.assert_allclose(after, want, rtol=1e-6)
    assert loss == pytest.approx(_softplus(-1.0) + _softplus(2.0), rel=1e-6)
    np.testing.assert_allclose(values + updates, after, rtol=1e-6)


def test_pairs_count_by_hand():
    values = np.zeros(2 * 4 * 3, F32)
    # one sentence of 3, window 1: 0-1, 1-0, 1-2, 2-1
    assert run_kernel(4, values, [0, 1, 2], [0, 1, 2], [1, 1, 1], [3], [], 0, 0.1, 0)[3] == 4
    # window 2 on every position: all 6 ordered pairs
    assert run_kernel(4, values, [0, 1, 2], [0, 1, 2], [2, 2, 2], [3], [], 0, 0.1, 0)[3] == 6
    # per-position windows: position 0 sees 1 context, 1 sees 2, 2 sees 1 (window 1)
    assert run_kernel(4, values, [0, 1, 2], [0, 1, 2], [1, 5, 1], [3], [], 0, 0.1, 0)[3] == 4
    # empty sentences around one of 2 words
    assert run_kernel(4, values, [0, 1], [0, 1], [1, 1], [0, 0, 2, 2], [], 0, 0.1, 0)[3] == 2


def test_window_larger_than_sentence_is_clipped():
    rng = np.random.default_rng(3)
    values = make_values(rng, 5, 4)
    args = ([0, 1, 2], [1, 2, 3], None, [3], [0, 1, 2, 3], 2)
    results = []
    for w in ([2, 2, 2], [4, 4, 4], [1000, 1000, 1000], [2**63 - 1] * 3):  # no overflow
        a = list(args)
        a[2] = w
        results.append(run_kernel(5, values, *a, lr=0.1, seed=5))
        check_against_reference(5, values, *a, lr=0.1, seed=5)
    for got in results[1:]:
        assert np.array_equal(got[0], results[0][0]) and got[2:] == results[0][2:]
    assert results[0][3] == 6


def test_sentences_never_mix():
    """Sentence [a, b] then [c] on disjoint rows: c has no context (the pair b-c would span two
    sentences), so c's rows stay as they are; sentences of one word train nothing at all."""
    rng = np.random.default_rng(4)
    values = make_values(rng, 3, 6)
    after, updates, loss, pairs = check_against_reference(3, values, [0, 1, 2], [3, 4, 5],
                                                          [4, 4, 4], [2, 3], [], 0)
    assert pairs == 2
    w = 6
    for r in (2, 5):  # c's input and output rows
        assert np.array_equal(after[r * w:(r + 1) * w], values[r * w:(r + 1) * w])
        assert np.all(updates[r * w:(r + 1) * w] == 0)
    # the same words as one sentence do mix
    assert run_kernel(3, values, [0, 1, 2], [3, 4, 5], [4, 4, 4], [3], [], 0, 0.1, 1)[3] == 6
    # three sentences of one word: no pairs, no loss, nothing changes
    after, updates, loss, pairs = run_kernel(3, values, [0, 1, 2], [3, 4, 5], [4, 4, 4],
                                             [1, 2, 3], [0, 1], 3, 0.1, 1)
    assert (loss, pairs) == (0.0, 0)
    assert np.array_equal(after, values) and np.all(updates == 0)


def test_draw_equal_to_center_is_skipped():
    """A pool holding only the center's own output row: every draw is skipped, so training
    equals training without negatives; with another row in the pool it does not."""
    rng = np.random.default_rng(5)
    values = make_values(rng, 4, 3)
    plain = run_kernel(4, values, [0, 0], [1, 1], [1, 1], [2], [], 0, 0.1, 7)
    skipped = check_against_reference(4, values, [0, 0], [1, 1], [1, 1], [2], [1, 1], 3, 0.1, 7)
    assert np.array_equal(plain[0], skipped[0]) and plain[2:] == skipped[2:]
    other = check_against_reference(4, values, [0, 0], [1, 1], [1, 1], [2], [1, 2], 3, 0.1, 7)
    assert other[2] > plain[2]


def test_pool_draws_follow_splitmix64():
    """dim 1, zero input vector: every score is 0, so each scored negative adds exactly log 2 to
    the loss and output rows get no update. The loss counts the draws that missed the center;
    which ones those are comes from splitmix64 alone."""
    values = np.zeros(2 * 1 * 8, F32)
    pool = [0, 1, 2, 3, 4, 5, 6, 7]
    for seed in (0, 1, 12345, 2**64 - 1):
        _, _, loss, pairs = run_kernel(1, values, [0, 0], [3, 3], [1, 1], [2], pool, 4, 0.1,
                                       seed)
        state, scored = seed, 0
        for _ in range(pairs * 4):
            state, z = splitmix64(state)
            scored += pool[((z >> 32) * len(pool)) >> 32] != 3
        assert loss == pytest.approx((pairs + scored) * math.log(2), rel=1e-6)


def test_seed_determines_the_draws():
    rng = np.random.default_rng(6)
    values = make_values(rng, 4, 12)
    args = ([0, 1, 2, 3], [4, 5, 6, 7], [2, 2, 2, 2], [4], list(range(12)), 3)
    a = run_kernel(4, values, *args, lr=0.1, seed=11)
    b = run_kernel(4, values, *args, lr=0.1, seed=11)
    c = run_kernel(4, values, *args, lr=0.1, seed=12)
    assert np.array_equal(a[0], b[0]) and a[2:] == b[2:]
    assert not np.array_equal(a[0], c[0])


def test_zero_rows_stay_zero_and_finite():
    """All-zero rows: every score is 0 and every gradient 0, the accumulators stay 0 (the
    division by sqrt(0) must not produce NaN); each score costs log 2."""
    values = np.zeros(2 * 3 * 4, F32)
    after, updates, loss, pairs = run_kernel(3, values, [0, 1, 2], [1, 2, 3], [1, 1, 1], [3],
                                             [0, 1, 2, 3], 2, 0.1, 3)
    assert np.all(after == 0) and np.all(updates == 0)
    # count the draws that miss the center (positions in order, contexts in order)
    state, scored = 3, 0
    centers = [1, 2, 2, 3]  # pairs: (0,1), (1,0), (1,2), (2,1) -> centers out_rows[i]
    for center in centers:
        for _ in range(2):
            state, z = splitmix64(state)
            scored += [0, 1, 2, 3][((z >> 32) * 4) >> 32] != center
    assert pairs == 4
    assert loss == pytest.approx((pairs + scored) * math.log(2), rel=1e-6)


def test_zero_accumulator_with_gradient():
    """Accumulators at 0 and a nonzero gradient: each row's first step is lr * sign(g)."""
    # dim 1; rows: in(a), out(a), in(b), out(b)
    values = np.array([0.5, 0.0, 0.25, 0.0, -0.5, 0.0, 0.25, 0.0], F32)
    after = check_against_reference(1, values, [0, 2], [1, 3], [1, 1], [2], [], 0, lr=0.125)[0]
    assert np.all(np.isfinite(after))
    # pair 1: in(b) . out(a) = -0.125, g > 0: out(a) moves by -lr, in(b) by +lr; pair 2:
    # in(a) . out(b) = 0.125, g > 0: both move by +lr
    np.testing.assert_allclose(after[0::2], [0.625, 0.125, -0.375, 0.375], atol=1e-6)


@pytest.mark.parametrize("scale", [100.0, 1e18])
def test_large_scores_give_finite_losses(scale):
    """Scores far beyond the table (+-1e4, +-1e36) are computed exactly: finite losses."""
    # dim 1; rows 0, 1, 2; each pair: in(0) . out(1), then one negative: row 2 (never the
    # center, row 1)
    right = np.array([scale, 1.0, scale, 1.0, -scale, 1.0], F32)
    after, _, loss, pairs = check_against_reference(1, right, [0, 0], [1, 1], [1, 1], [2], [2],
                                                    1)
    assert pairs == 2 and loss == pytest.approx(0.0, abs=1e-6)  # both scores right, by far
    assert np.all(np.isfinite(after))
    wrong = np.array([scale, 1.0, -scale, 1.0, scale, 1.0], F32)
    after, updates, loss, pairs = check_against_reference(1, wrong, [0, 0], [1, 1], [1, 1], [2],
                                                          [2], 1)
    # every score wrong by about scale^2 (the steps move the vectors by about lr)
    assert math.isfinite(loss) and loss == pytest.approx(4 * scale * scale, rel=1e-2)
    assert np.all(np.isfinite(after)) and np.all(np.isfinite(updates))


def test_empty_batch_zeroes_updates():
    values = np.arange(8, dtype=F32)
    updates = np.full(8, 3.0, F32)
    got = K.wv_train_batch(2, values, updates, i64([]), i64([]), i64([]), i64([]), i64([]), 5,
                           0.1, 0)
    assert got == (0.0, 0)
    assert np.all(updates == 0) and np.array_equal(values, np.arange(8))
    # no sentences at all, or only empty ones
    got = K.wv_train_batch(2, values, updates, i64([]), i64([]), i64([]), i64([0, 0]), i64([]),
                           0, 0.1, 0)
    assert got == (0.0, 0)


def test_keywords_and_2d_values():
    rng = np.random.default_rng(8)
    values = make_values(rng, 3, 4)
    a, b = values.copy(), values.copy().reshape(4, 6)
    ua, ub = np.empty_like(a), np.empty_like(b)
    args = (i64([0, 1, 2]), i64([3, 2, 1]), i64([1, 2, 1]), i64([3]), i64([0, 3]))
    got = K.wv_train_batch(3, a, ua, *args, 2, 0.1, 5)
    got_kw = K.wv_train_batch(dim=3, values=b, updates=ub, in_rows=args[0], out_rows=args[1],
                              windows=args[2], sentence_ends=args[3], pool=args[4], negatives=2,
                              lr=0.1, seed=5)
    assert got == got_kw
    assert np.array_equal(a, b.ravel()) and np.array_equal(ua, ub.ravel())


def test_parallel_calls_on_distinct_buffers():
    """The GIL is released: batches on distinct buffers in threads give the sequential
    results."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(10)
    dim, rows, n = 32, 50, 2000
    values = make_values(rng, dim, rows, scale=0.1)
    in_rows, out_rows = rng.integers(0, rows, n), rng.integers(0, rows, n)
    windows = rng.integers(1, 6, n)
    ends = np.append(np.sort(rng.choice(np.arange(1, n), 40, replace=False)), n)
    pool = rng.integers(0, rows, 100)

    def one(seed):
        return run_kernel(dim, values, in_rows, out_rows, windows, ends, pool, 5, 0.05, seed)

    seeds = list(range(6))
    want = [one(s) for s in seeds]
    with ThreadPoolExecutor(3) as ex:
        got = list(ex.map(one, seeds))
    for (a, ua, la, pa), (b, ub, lb, pb) in zip(got, want, strict=True):
        assert np.array_equal(a, b) and np.array_equal(ua, ub) and (la, pa) == (lb, pb)


def test_lr_is_rounded_to_float32():
    rng = np.random.default_rng(9)
    values = make_values(rng, 2, 3)
    lr = 0.1 + 1e-12  # rounds to the same float32 as 0.1
    a = run_kernel(2, values, [0, 1], [1, 2], [1, 1], [2], [0], 1, lr, 4)
    b = run_kernel(2, values, [0, 1], [1, 2], [1, 1], [2], [0], 1, 0.1, 4)
    assert np.array_equal(a[0], b[0])


# ---- rejected calls ----------------------------------------------------------------------------------

@pytest.fixture
def batch():
    """A valid batch: dim 3, 5 rows, sentences [0, 3) and [3, 5), 2 negatives."""
    rng = np.random.default_rng(7)
    values = make_values(rng, 3, 5)
    return {"dim": 3, "values": values, "updates": np.full(len(values), 9.0, F32),
            "in_rows": i64([0, 1, 2, 3, 4]), "out_rows": i64([4, 3, 2, 1, 0]),
            "windows": i64([1, 2, 1, 1, 3]), "sentence_ends": i64([3, 5]),
            "pool": i64([0, 2, 4]), "negatives": 2, "lr": 0.1, "seed": 1}


def rejected(args, exc, **change):
    """The call with `change` applied raises exc and writes neither values nor updates."""
    args = dict(args, **change)
    values, updates = args["values"], args["updates"]
    before = np.array(values, copy=True)
    upd_before = np.array(updates, copy=True)
    with pytest.raises(exc):
        K.wv_train_batch(**args)
    assert np.array_equal(np.asarray(values), before, equal_nan=True)
    assert np.array_equal(np.asarray(updates), upd_before, equal_nan=True)


def test_valid_fixture_batch_runs(batch):
    K.wv_train_batch(**dict(batch, values=batch["values"].copy()))


@pytest.mark.parametrize("seed,exc", [(-1, ValueError), (1 << 64, ValueError),
                                      (1.0, TypeError), ("1", TypeError)])
def test_seed_outside_uint64_is_refused(batch, seed, exc):
    rejected(batch, exc, seed=seed)


def test_largest_seed_is_accepted(batch):
    K.wv_train_batch(**dict(batch, values=batch["values"].copy(), seed=(1 << 64) - 1))


@pytest.mark.parametrize("name,dtype", [
    ("values", np.float64), ("values", np.float16), ("values", np.int32),
    ("updates", np.float64), ("in_rows", np.int32), ("in_rows", np.uint64),
    ("in_rows", np.float64), ("out_rows", np.int32), ("windows", np.int32),
    ("sentence_ends", np.int32), ("pool", np.int32), ("pool", np.float64)])
def test_wrong_dtype(batch, name, dtype):
    rejected(batch, TypeError, **{name: batch[name].astype(dtype)})


@pytest.mark.parametrize("name", ["values", "updates", "in_rows", "pool", "sentence_ends"])
def test_not_a_buffer(batch, name):
    rejected(batch, TypeError, **{name: list(batch[name])})


def test_wrong_sizes(batch):
    n = len(batch["values"])
    rejected(batch, ValueError, values=batch["values"][:n - 1].copy(),
             updates=np.zeros(n - 1, F32))                                # not whole rows
    rejected(batch, ValueError, values=batch["values"][:n - 3].copy(),
             updates=np.zeros(n - 3, F32))                                # half a row
    rejected(batch, ValueError, updates=np.zeros(n - 1, F32))
    rejected(batch, ValueError, updates=np.zeros(n + 1, F32))
    rejected(batch, ValueError, updates=np.zeros(n + 6, F32))             # one row more
    rejected(batch, ValueError, in_rows=i64([0, 1, 2, 3]))
    rejected(batch, ValueError, out_rows=i64([0, 1, 2, 3, 4, 0]))
    rejected(batch, ValueError, windows=i64([1, 1, 1, 1]))
    rejected(batch, ValueError, dim=2)  # 30 floats are not rows of 4
    rejected(batch, ValueError, dim=0)
    rejected(batch, ValueError, dim=-3)
    rejected(batch, ValueError, dim=4097)
    rejected(batch, ValueError, negatives=-1)


@pytest.mark.parametrize("where", ["in_rows", "out_rows", "pool"])
@pytest.mark.parametrize("bad", [-1, 5, 1 << 40, -(1 << 62)])
def test_row_index_out_of_range(batch, where, bad):
    arr = batch[where].copy()
    arr[-1] = bad
    rejected(batch, ValueError, **{where: arr})


def test_pool_checked_even_without_negatives(batch):
    rejected(batch, ValueError, pool=i64([0, 5]), negatives=0)


@pytest.mark.parametrize("windows", [[1, 0, 1, 1, 1], [1, 1, 1, 1, -2], [-(1 << 62)] * 5])
def test_window_below_one(batch, windows):
    rejected(batch, ValueError, windows=i64(windows))


@pytest.mark.parametrize("ends", [[3, 2, 5], [4, 3], [3, 4], [3, 6], [6], [-1, 5], [], [5, 3],
                                  [0, 0], [3, 5, 6]])
def test_bad_sentence_ends(batch, ends):
    rejected(batch, ValueError, sentence_ends=i64(ends))


def test_empty_pool(batch):
    rejected(batch, ValueError, pool=i64([]))
    # fine without negatives, or without positions
    K.wv_train_batch(**dict(batch, values=batch["values"].copy(), pool=i64([]), negatives=0))
    got = K.wv_train_batch(**dict(batch, values=batch["values"].copy(), pool=i64([]),
                                  in_rows=i64([]), out_rows=i64([]), windows=i64([]),
                                  sentence_ends=i64([])))
    assert got == (0.0, 0)


def test_layout_and_aliasing(batch):
    v = batch["values"]
    n = len(v)
    rejected(batch, ValueError, values=np.repeat(v, 2)[::2])               # strided
    rejected(batch, ValueError, updates=np.zeros(2 * n, F32)[::2])
    rejected(batch, ValueError, in_rows=np.repeat(batch["in_rows"], 2)[::2])
    rejected(batch, ValueError, pool=np.repeat(batch["pool"], 2)[::2])
    rejected(batch, ValueError, values=np.asfortranarray(v.reshape(6, 5)))  # not C order
    ro = v.copy()
    ro.flags.writeable = False
    rejected(batch, ValueError, values=ro)
    ro_upd = np.zeros(n, F32)
    ro_upd.flags.writeable = False
    rejected(batch, ValueError, updates=ro_upd)
    rejected(batch, ValueError, updates=v)                                  # the same array
    both = np.zeros(2 * n, F32)
    both[:n] = v
    rejected(dict(batch, values=both[:n]), ValueError, updates=both[1:n + 1])  # overlapping
    rejected(dict(batch, values=both[1:n + 1]), ValueError, updates=both[:n])


def test_written_buffers_overlapping_an_index_array(batch):
    """values (or updates) sharing memory with an index array, through a raw byte buffer."""
    n = len(batch["values"])
    raw = np.zeros(4 * n + 8 * 8, np.uint8)
    values = raw[:4 * n].view(F32)
    values[:] = batch["values"]
    pool = raw[4 * n - 8:4 * n + 16].view(np.int64)  # its first entry is values' last 2 floats
    pool[:] = 0
    rejected(batch, ValueError, values=values, pool=pool)
    rejected(batch, ValueError, updates=values, pool=pool)


def test_rejected_batch_writes_nothing_before_the_bad_entry(batch):
    """The bad index is the last position's: nothing of the earlier, valid positions is trained
    (every check runs before anything is written)."""
    arr = batch["in_rows"].copy()
    arr[-1] = 99
    rejected(batch, ValueError, in_rows=arr)
    rejected(batch, ValueError, sentence_ends=i64([3, 4]))


# ---- tokenizer ------------------------------------------------------------------------------------

SPACE = b" \t\n\r\x0b\x0c"


def ref_tokenize(chunks, max_tokens):
    """Per chunk: (ids, ends); then (words in id order, counts)."""
    ids_of, words, counts, out = {}, [], [], []
    for text in chunks:
        ids, ends = [], []
        for line in text.split(b"\n"):
            toks = [t for t in re.split(rb"[ \t\r\x0b\x0c]+", line) if t]
            for k in range(0, len(toks), max_tokens):
                for t in toks[k:k + max_tokens]:
                    if t not in ids_of:
                        ids_of[t] = len(words)
                        words.append(t)
                        counts.append(0)
                    counts[ids_of[t]] += 1
                    ids.append(ids_of[t])
                ends.append(len(ids))
        out.append((ids, ends))
    return out, words, counts


def feed(vocab, text, max_tokens):
    ids = np.full(len(text) // 2 + 1, -7, np.int32)
    ends = np.full(text.count(b"\n") + len(text) // max_tokens + 1, -7, np.int64)
    nid, nend = K.vocab_feed(vocab, text, max_tokens, ids, ends)
    return ids[:nid].tolist(), ends[:nend].tolist()


def export(vocab):
    size, nbytes = K.vocab_size(vocab)
    raw = bytearray(nbytes)
    offsets = np.full(size + 1, -1, np.int64)
    counts = np.full(size, -1, np.int64)
    assert K.vocab_export(vocab, raw, offsets, counts) is None
    words = [bytes(raw[offsets[i]:offsets[i + 1]]) for i in range(size)]
    assert offsets[0] == 0 and offsets[-1] == nbytes
    return words, counts.tolist()


@st.composite
def chunked_texts(draw):
    alphabet = st.sampled_from([b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c", b"a", b"b", b"c",
                                b"A", b"\xc3", b"\xa9", b"\xff", b"\x00", b"\x1c"])
    text = b"".join(draw(st.lists(alphabet, max_size=80)))
    # split at newlines into 1-3 chunks (each of complete lines, the last may lack its newline)
    cuts = [i + 1 for i, c in enumerate(text) if c == ord("\n")]
    chosen = sorted(draw(st.lists(st.sampled_from(cuts), max_size=2, unique=True))
                    if cuts else [])
    bounds = [0, *chosen, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@given(chunks=chunked_texts(), max_tokens=st.integers(1, 5))
@settings(max_examples=200, deadline=None)
def test_tokenizer_matches_reference(chunks, max_tokens):
    vocab = K.vocab_new()
    want, words, counts = ref_tokenize(chunks, max_tokens)
    for text, (ids, ends) in zip(chunks, want):
        assert feed(vocab, text, max_tokens) == (ids, ends)
    assert K.vocab_size(vocab) == (len(words), sum(map(len, words)))
    assert export(vocab) == (words, counts)


def test_tokenizer_by_hand():
    vocab = K.vocab_new()
    assert feed(vocab, b"the cat\tsat\r\n\n  \n the\x0bdog\x0c the end", 10) == (
        [0, 1, 2, 0, 3, 0, 4], [3, 7])
    assert feed(vocab, b"a b c d e\n", 2) == ([5, 6, 7, 8, 9], [2, 4, 5])
    assert feed(vocab, b"a b\n", 2) == ([5, 6], [2])     # a cut at the line's end: one end
    assert feed(vocab, b"", 3) == ([], [])
    assert feed(vocab, b"\n\n \t\r\n", 3) == ([], [])
    assert feed(vocab, b"cat", 1) == ([1], [1])           # no final newline
    words, counts = export(vocab)
    assert words == [b"the", b"cat", b"sat", b"dog", b"end", b"a", b"b", b"c", b"d", b"e"]
    assert counts == [3, 2, 1, 1, 1, 2, 2, 1, 1, 1]
    assert K.vocab_size(vocab) == (10, 20)


def test_tokenizer_accepts_other_buffers_and_keywords():
    vocab = K.vocab_new()
    ids = np.zeros(10, np.int32)
    ends = np.zeros(10, np.int64)
    assert K.vocab_feed(vocab=vocab, text=bytearray(b"x y\n"), max_tokens=5, ids=ids,
                        ends=ends) == (2, 1)
    assert K.vocab_feed(vocab, memoryview(b"y z"), 5, ids, ends) == (2, 1)
    assert K.vocab_feed(vocab, np.frombuffer(b"z x", np.uint8), 5, ids, ends) == (2, 1)
    assert ids[:2].tolist() == [2, 0]
    assert export(vocab) == ([b"x", b"y", b"z"], [2, 2, 2])


def test_tokenizer_grows_its_tables():
    """More ids than the first allocation (1024), more tokens than half the first hash table
    (65536 slots), more bytes than the first byte buffer (64 KiB), and one token of 200 KB."""
    n = 40_000
    words = [b"w%d" % i for i in range(n)] + [b"L" * 200_000]
    text = b"\n".join(b" ".join(words[i:i + 7]) for i in range(0, len(words), 7)) + b"\n"
    vocab = K.vocab_new()
    ids, ends = feed(vocab, text, 10_000)
    assert ids == list(range(n + 1))
    assert ends == list(range(7, n + 1, 7)) + ([n + 1] if (n + 1) % 7 else [])
    ids2, _ = feed(vocab, b" ".join(words[::-1]), 100_000)   # every word seen again
    assert ids2 == list(range(n, -1, -1))
    got_words, counts = export(vocab)
    assert got_words == words and counts == [2] * (n + 1)


def test_tokens_that_share_bytes_are_distinct():
    """Tokens that are prefixes of each other, and equal lengths with different bytes."""
    vocab = K.vocab_new()
    text = b"a aa aaa a\x00 a\x00b ab ba aa a\n"
    ids, _ = feed(vocab, text, 100)
    assert ids == [0, 1, 2, 3, 4, 5, 6, 1, 0]


def test_tokenizer_buffer_sizes():
    vocab = K.vocab_new()
    text = b"a b c\nd e\n"  # 10 bytes, 2 lines: ids need 6, ends 2 + 10 // 3 + 1 = 6
    ok_ids, ok_ends = np.zeros(6, np.int32), np.zeros(6, np.int64)
    assert K.vocab_feed(vocab, text, 3, ok_ids, ok_ends) == (5, 2)
    vocab = K.vocab_new()
    for ids, ends in ((np.zeros(5, np.int32), ok_ends), (ok_ids, np.zeros(5, np.int64))):
        ids_before, ends_before = ids.copy(), ends.copy()
        with pytest.raises(ValueError):
            K.vocab_feed(vocab, text, 3, ids, ends)
        assert np.array_equal(ids, ids_before) and np.array_equal(ends, ends_before)
    assert K.vocab_size(vocab) == (0, 0)  # nothing was counted


def test_tokenizer_bad_arguments():
    vocab = K.vocab_new()
    ids, ends = np.zeros(8, np.int32), np.zeros(8, np.int64)
    for bad in (None, 3, "vocab", object()):
        with pytest.raises(TypeError):
            K.vocab_feed(bad, b"a b", 3, ids, ends)
        with pytest.raises(TypeError):
            K.vocab_size(bad)
        with pytest.raises(TypeError):
            K.vocab_export(bad, bytearray(), np.zeros(1, np.int64), np.zeros(0, np.int64))
    with pytest.raises(TypeError):                                  # a capsule of another kind
        K.vocab_size(_foreign_capsule())
    with pytest.raises(TypeError):
        K.vocab_feed(vocab, "a b", 3, ids, ends)                    # str is not bytes
    with pytest.raises(TypeError):
        K.vocab_feed(vocab, b"a b", 3, ids.astype(np.int64), ends)
    with pytest.raises(TypeError):
        K.vocab_feed(vocab, b"a b", 3, ids, ends.astype(np.int32))
    with pytest.raises(ValueError):
        K.vocab_feed(vocab, b"a b", 0, ids, ends)
    with pytest.raises(ValueError):
        K.vocab_feed(vocab, b"a b", -1, ids, ends)
    ro = np.zeros(8, np.int32)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        K.vocab_feed(vocab, b"a b", 3, ro, ends)
    with pytest.raises(ValueError):
        K.vocab_feed(vocab, b"a b", 3, np.zeros(16, np.int32)[::2], ends)
    assert K.vocab_size(vocab) == (0, 0)


def _foreign_capsule():
    """A PyCapsule that is not a vocabulary (from the datetime C API)."""
    import datetime

    return datetime.datetime_CAPI


def test_export_sizes_must_match():
    vocab = K.vocab_new()
    feed(vocab, b"ab c ab\n", 5)
    raw, offs, cnt = bytearray(3), np.zeros(3, np.int64), np.zeros(2, np.int64)
    K.vocab_export(vocab, raw, offs, cnt)
    assert (bytes(raw), offs.tolist(), cnt.tolist()) == (b"abc", [0, 2, 3], [2, 1])
    for args in ((bytearray(2), offs, cnt), (bytearray(4), offs, cnt),
                 (raw, np.zeros(2, np.int64), cnt), (raw, offs, np.zeros(3, np.int64))):
        with pytest.raises(ValueError):
            K.vocab_export(vocab, *args)
    with pytest.raises(BufferError):  # CPython's refusal of a writable view of bytes
        K.vocab_export(vocab, b"abc", offs, cnt)
    with pytest.raises(TypeError):
        K.vocab_export(vocab, raw, offs.astype(np.int32), cnt)


def test_feed_rejects_ids_overlapping_ends():
    vocab = K.vocab_new()
    raw = np.zeros(64, np.uint8)
    ids, ends = raw[:32].view(np.int32), raw.view(np.int64)   # ids lie inside ends
    with pytest.raises(ValueError, match="shares memory"):
        K.vocab_feed(vocab, b"x y z\nq\n", 5, ids, ends)
    assert K.vocab_size(vocab) == (0, 0)  # refused before tokenizing


def test_export_rejects_overlapping_outputs():
    vocab = K.vocab_new()
    feed(vocab, b"ab c ab\n", 5)
    raw = np.zeros(24, np.int64)
    with pytest.raises(ValueError):
        K.vocab_export(vocab, raw[:2].view(np.uint8)[:3], raw[:3], raw[1:3])


def test_empty_vocab_exports_nothing():
    vocab = K.vocab_new()
    assert K.vocab_size(vocab) == (0, 0)
    assert export(vocab) == ([], [])


def test_vocabularies_are_independent():
    a, b = K.vocab_new(), K.vocab_new()
    assert feed(a, b"x y\n", 5) == ([0, 1], [2])
    assert feed(b, b"y x\n", 5) == ([0, 1], [2])
    assert export(a)[0] == [b"x", b"y"] and export(b)[0] == [b"y", b"x"]
    del a
    assert export(b)[0] == [b"y", b"x"]



# ------------------------------------------------------------------------- batch building


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_plan_builds_the_batch_from_the_sentences(data):
    vocab = data.draw(st.integers(1, 12))
    tokens = np.array(data.draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=40)),
                      dtype=np.int32)
    n = len(tokens)
    sentences = data.draw(st.lists(st.tuples(st.integers(0, n), st.integers(0, n)),
                                   max_size=6))
    starts = np.array([min(a, b) for a, b in sentences], dtype=np.int64)
    lengths = np.array([abs(a - b) for a, b in sentences], dtype=np.int64)
    keep = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.3, 1.0]), min_size=vocab,
                                       max_size=vocab)), dtype=np.float64)
    window = data.draw(st.integers(1, 5))
    seed = data.draw(st.integers(0, 2**64 - 1))
    row_of = np.full(2 * vocab, -1, dtype=np.int32)
    total = int(lengths.sum())
    in_rows, out_rows, windows = (np.full(total, -7, np.int64) for _ in range(3))
    ends = np.empty(len(starts), np.int64)
    keys = np.empty(2 * total, np.int64)
    got, nk = K.wv_plan(tokens, starts, lengths, keep, window, seed, row_of, in_rows, out_rows,
                        windows, ends, keys)
    assert (row_of == -1).all()  # left as it was found
    keys = keys[:nk]
    assert len(set(keys.tolist())) == nk  # distinct
    # The positions are each sentence's tokens in order, some dropped; never a token of
    # keep 0, always one of keep 1.
    at = 0
    for s in range(len(starts)):
        sentence = tokens[starts[s]:starts[s] + lengths[s]]
        mine = keys[in_rows[at:ends[s]]]
        assert (keys[out_rows[at:ends[s]]] == mine + vocab).all()
        assert (mine < vocab).all()
        it = iter(sentence.tolist())
        assert all(any(w == t for t in it) for w in mine.tolist())  # a subsequence
        assert not np.isin(mine, np.flatnonzero(keep == 0)).any()
        assert (sentence[keep[sentence] == 1.0].tolist()
                == [w for w in mine.tolist() if keep[w] == 1.0])
        at = ends[s]
    assert at == got
    assert ((windows[:got] >= 1) & (windows[:got] <= window)).all()
    # Keys in order of first use: each key's row is where it first appears.
    order = np.stack([keys[in_rows[:got]], keys[out_rows[:got]]], axis=1).reshape(-1)
    assert keys.tolist() == list(dict.fromkeys(order.tolist()))
    # The same seed draws the same batch.
    again = [np.empty_like(a) for a in (in_rows, out_rows, windows, ends)]
    keys2 = np.empty(2 * total, np.int64)
    assert K.wv_plan(tokens, starts, lengths, keep, window, seed, row_of, *again,
                     keys2) == (got, nk)
    assert (again[0][:got] == in_rows[:got]).all() and (keys2[:nk] == keys).all()


def test_plan_refuses_bad_input_before_writing():
    tokens = np.array([0, 1, 2], np.int32)
    keep = np.ones(3)
    row_of = np.full(6, -1, np.int32)
    out = [np.full(3, -7, np.int64) for _ in range(3)] + [np.empty(1, np.int64),
                                                         np.empty(6, np.int64)]
    for starts, lengths, tok in (([2], [2], tokens), ([-1], [1], tokens),
                                 ([0], [3], np.array([0, 3, 1], np.int32))):
        with pytest.raises(ValueError, match="sentence 0"):
            K.wv_plan(tok, np.array(starts, np.int64), np.array(lengths, np.int64), keep, 2,
                      1, row_of, *out)
    assert all((a == -7).all() for a in out[:3]) and (row_of == -1).all()
    with pytest.raises(ValueError, match="row_of"):
        K.wv_plan(tokens, np.array([0], np.int64), np.array([3], np.int64), keep, 2, 1,
                  row_of[:5], *out)
    with pytest.raises(ValueError, match="window"):
        K.wv_plan(tokens, np.array([0], np.int64), np.array([3], np.int64), keep, 0, 1,
                  row_of, *out)
    with pytest.raises(TypeError):
        K.wv_plan(tokens.astype(np.int64), np.array([0], np.int64), np.array([3], np.int64),
                  keep, 2, 1, row_of, *out)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_merge_pool_gives_every_drawn_key_its_row(data):
    size = data.draw(st.integers(1, 20))
    keys = np.array(data.draw(st.lists(st.integers(0, size - 1), unique=True, max_size=size)),
                    dtype=np.int64)
    drawn = np.array(data.draw(st.lists(st.integers(0, size - 1), max_size=30)), dtype=np.int64)
    row_of = np.full(size, -1, np.int32)
    pool, extra_keys, extra_first = (np.empty(len(drawn), np.int64) for _ in range(3))
    ne = K.wv_merge_pool(keys, drawn, row_of, pool, extra_keys, extra_first)
    assert (row_of == -1).all()
    every = np.concatenate([keys, extra_keys[:ne]])
    assert (every[pool] == drawn).all()
    assert len(set(every.tolist())) == len(every)  # extras are new and distinct
    assert (drawn[extra_first[:ne]] == extra_keys[:ne]).all()
    assert extra_keys[:ne].tolist() == [k for k in dict.fromkeys(drawn.tolist())
                                        if k not in set(keys.tolist())]


def test_merge_pool_refuses_bad_keys_and_leaves_the_scratch_clean():
    row_of = np.full(5, -1, np.int32)
    out = [np.empty(3, np.int64) for _ in range(3)]
    for keys, drawn in (([0, 1], [1, 5, 2]), ([0, 5], [1, 2, 3]), ([1, 2, 1], [0, 0, 0])):
        with pytest.raises(ValueError):
            K.wv_merge_pool(np.array(keys, np.int64), np.array(drawn, np.int64), row_of, *out)
        assert (row_of == -1).all()


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_merge_pool_copies_the_extra_rows(data):
    """With drawn_values and extra_values: the extra keys' rows, as the app copied them with
    numpy before (values[nk:] = drawn_values[extra_first[:ne]]); nothing past them written."""
    size = data.draw(st.integers(1, 20))
    width = data.draw(st.integers(1, 7))
    keys = np.array(data.draw(st.lists(st.integers(0, size - 1), unique=True, max_size=size)),
                    dtype=np.int64)
    drawn = np.array(data.draw(st.lists(st.integers(0, size - 1), max_size=30)), dtype=np.int64)
    drawn_values = np.random.default_rng(len(drawn)).random((len(drawn), width)).astype(F32)
    row_of = np.full(size, -1, np.int32)
    pool, extra_keys, extra_first = (np.empty(len(drawn), np.int64) for _ in range(3))
    extra_values = np.full((len(drawn), width), -7.0, F32)
    ne = K.wv_merge_pool(keys, drawn, row_of, pool, extra_keys, extra_first,
                         drawn_values=drawn_values, extra_values=extra_values)
    assert ne == K.wv_merge_pool(keys, drawn, row_of, *(np.empty(len(drawn), np.int64)
                                                       for _ in range(3)))
    assert np.array_equal(extra_values[:ne], drawn_values[extra_first[:ne]])
    assert (extra_values[ne:] == -7.0).all()


def test_merge_pool_copy_checks_its_buffers():
    keys, drawn = np.array([0, 1], np.int64), np.array([1, 2, 3], np.int64)
    row_of = np.full(5, -1, np.int32)
    out = [np.empty(3, np.int64) for _ in range(3)]
    rows = np.zeros((3, 4), F32)
    with pytest.raises(TypeError, match="together"):
        K.wv_merge_pool(keys, drawn, row_of, *out, drawn_values=rows)
    with pytest.raises(ValueError, match="one row per drawn key"):
        K.wv_merge_pool(keys, drawn, row_of, *out, drawn_values=np.zeros(7, F32),
                        extra_values=np.zeros((3, 4), F32))
    with pytest.raises(ValueError, match="one row per drawn key"):
        K.wv_merge_pool(keys, drawn, row_of, *out, drawn_values=rows,
                        extra_values=np.zeros((2, 4), F32))
    with pytest.raises(ValueError, match="shares memory"):
        K.wv_merge_pool(keys, drawn, row_of, *out, drawn_values=rows, extra_values=rows)
    with pytest.raises(TypeError, match="float32"):
        K.wv_merge_pool(keys, drawn, row_of, *out, drawn_values=rows.astype(np.float64),
                        extra_values=np.zeros((3, 4), F32))
    assert (row_of == -1).all()
