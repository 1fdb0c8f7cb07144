"""adapm._kernels, matrix factorisation: mf_train_batch (squared loss, L2, AdaGrad) against a
float32 numpy reference that replays the kernel entry by entry, its input checks, and the data
file parser and writer (mf_parse / mf_format) against Python references."""

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm._native_loader import load
from store_rows import store_with

K = load("adapm._kernels")

F32 = np.float32
EPS = F32(1e-6)  # MF_ADAGRAD_EPS
MAX_RANK = 4096

# ---- float32 reference of mf_train_batch ---------------------------------------------------------
#
# The kernel is built with -std=c11 (no floating-point contraction into FMA), its dot product is a
# plain sequential float sum and every other step is elementwise, so each float operation is one
# IEEE float32 operation; the reference performs the same ones in the same order and matches the
# kernel bit for bit.


def ref_train(rank, values, w_rows, h_rows, x, reg, lr):
    """Returns (values after, loss); values is not changed."""
    v = np.array(values, F32).reshape(-1, 2 * rank)
    reg = np.asarray(reg, F32)
    lr = F32(lr)
    loss = 0.0
    for wr, hr, xe in zip(w_rows, h_rows, x, strict=True):
        w, h = v[wr, :rank], v[hr, :rank]
        dot = F32(0.0)
        for z in range(rank):  # sequential float sum, z = 0 .. rank - 1
            dot = F32(dot + w[z] * h[z])
        err = F32(xe) - dot
        loss += float(err) * float(err)
        # both gradients from the values before the step (new arrays, not views)
        gw = F32(-2.0) * err * h + reg[wr] * w
        gh = F32(-2.0) * err * w + reg[hr] * h
        for row, g in ((wr, gw), (hr, gh)):  # w, then h: the same row twice if wr == hr
            a = v[row, rank:] + g * g
            v[row, rank:] = a
            v[row, :rank] -= lr * g / np.sqrt(a + EPS)
    return v.reshape(np.shape(values)), loss


# ---- helpers -------------------------------------------------------------------------------------


def i64(xs):
    return np.asarray(xs, dtype=np.int64)


def f32(xs):
    return np.asarray(xs, dtype=F32)


def make_values(rng, rank, rows, scale=0.5, acc_low=0.0):
    v = np.empty((rows, 2 * rank), F32)
    v[:, :rank] = rng.normal(0, scale, (rows, rank))
    v[:, rank:] = rng.uniform(acc_low, 1.0, (rows, rank))
    return v.ravel()


def run_kernel(rank, values, w_rows, h_rows, x, reg, lr):
    """Runs the kernel on a copy of values; returns (values after, updates, loss)."""
    after = values.copy()
    updates = np.full(values.shape, np.nan, F32)  # garbage the kernel must overwrite
    loss = K.mf_train_batch(rank, after, updates, i64(w_rows), i64(h_rows), f32(x), f32(reg), lr)
    assert isinstance(loss, float)
    return after, updates, loss


def check_against_reference(rank, values, w_rows, h_rows, x, reg, lr):
    after, updates, loss = run_kernel(rank, values, w_rows, h_rows, x, reg, lr)
    want, want_loss = ref_train(rank, values, list(w_rows), list(h_rows), list(f32(x)), reg, lr)
    assert np.array_equal(after, want), np.max(np.abs(after - want))
    assert loss == want_loss
    # updates are the float32 difference after minus before, exactly
    assert np.array_equal(updates, after - values)
    return after, updates, loss


# ---- the kernel against the reference ------------------------------------------------------------


@st.composite
def batches(draw):
    rank = draw(st.integers(1, 17))
    rows = draw(st.integers(1, 8))  # few rows: rows repeat, and a w row can be its h row
    n = draw(st.integers(0, 30))
    row = st.integers(0, rows - 1)
    w_rows = draw(st.lists(row, min_size=n, max_size=n))
    h_rows = draw(st.lists(row, min_size=n, max_size=n))
    x = draw(st.lists(st.floats(-5.0, 5.0, width=32), min_size=n, max_size=n))
    reg = draw(st.one_of(
        st.lists(st.sampled_from([0.0, 0.01, 0.5, 2.0]), min_size=rows, max_size=rows),
        st.lists(st.floats(0.0, 3.0, width=32), min_size=rows, max_size=rows)))
    lr = draw(st.sampled_from([1e-3, 0.05, 0.1, 0.3, 1.0]) | st.floats(1e-4, 2.0))
    scale = draw(st.sampled_from([0.01, 0.3, 1.0]))
    acc_low = draw(st.sampled_from([0.0, 0.0, 0.5]))
    zero_acc = draw(st.booleans())
    values_seed = draw(st.integers(0, 2**32 - 1))
    return {"rank": rank, "rows": rows, "w_rows": w_rows, "h_rows": h_rows, "x": x, "reg": reg,
            "lr": lr, "scale": scale, "acc_low": acc_low, "zero_acc": zero_acc,
            "values_seed": values_seed}


@given(b=batches())
@settings(max_examples=60, deadline=None)
def test_matches_reference(b):
    rank, rows = b["rank"], b["rows"]
    values = make_values(np.random.default_rng(b["values_seed"]), rank, rows, b["scale"],
                         b["acc_low"])
    if b["zero_acc"]:
        values.reshape(rows, 2 * rank)[:, rank:] = 0.0
    after, updates, loss = check_against_reference(rank, values, b["w_rows"], b["h_rows"],
                                                   b["x"], b["reg"], b["lr"])
    assert np.all(np.isfinite(after)) and math.isfinite(loss) and loss >= 0.0
    width = 2 * rank
    for r in set(range(rows)) - set(b["w_rows"]) - set(b["h_rows"]):
        # rows no entry names are neither read nor written; their updates are zero
        assert np.array_equal(after[r * width:(r + 1) * width], values[r * width:(r + 1) * width])
        assert np.all(updates[r * width:(r + 1) * width] == 0)
    # the accumulators never decrease
    assert np.all(after.reshape(rows, width)[:, rank:] >= values.reshape(rows, width)[:, rank:])


@pytest.mark.parametrize("rank", [1, 2, 7, 8, 9, 16, 17, 33, 100, MAX_RANK])
def test_ranks_against_reference(rank):
    rng = np.random.default_rng(rank)
    values = make_values(rng, rank, 4, scale=1.0 / math.sqrt(rank))
    check_against_reference(rank, values, [0, 1, 2, 3, 2, 0], [3, 2, 1, 1, 2, 0],
                            [1.0, -0.5, 2.0, 0.25, -1.0, 0.75], [0.1, 0.0, 0.5, 0.02], 0.1)


def test_one_entry_by_hand():
    """rank 1, w = 2 (acc 0), h = 1 (acc 3), x = 5, reg 0.5 and 0.25, lr 0.5:
    dot 2, err 3; g_w = -2*3*1 + 0.5*2 = -5, g_h = -2*3*2 + 0.25*1 = -11.75;
    acc_w = 25, w = 2 + 0.5*5/sqrt(25) = 2.5; acc_h = 3 + 138.0625 = 141.0625,
    h = 1 + 0.5*11.75/sqrt(141.0625)."""
    values = f32([2.0, 0.0, 1.0, 3.0])
    after, updates, loss = run_kernel(1, values, [0], [1], [5.0], [0.5, 0.25], 0.5)
    assert loss == 9.0
    want = [2.5, 25.0, 1.0 + 5.875 / math.sqrt(141.0625), 141.0625]
    np.testing.assert_allclose(after, want, rtol=1e-6)
    np.testing.assert_allclose(updates, [0.5, 25.0, 5.875 / math.sqrt(141.0625), 138.0625],
                               rtol=1e-6)


def test_w_row_equal_to_h_row_by_hand():
    """One row as w and h: both gradients from the value before (w = 1, x = 3: err 2,
    g = -4 each); the w step gives acc 16, w = 1 + 0.5*4/4 = 1.5; the h step then sees the
    stepped row: acc 16 + 16 = 32, w = 1.5 + 0.5*4/sqrt(32)."""
    after, _, loss = run_kernel(1, f32([1.0, 0.0]), [0], [0], [3.0], [0.0], 0.5)
    assert loss == 4.0
    np.testing.assert_allclose(after, [1.5 + 2.0 / math.sqrt(32.0), 32.0], rtol=1e-6)
    check_against_reference(1, f32([1.0, 0.0]), [0], [0], [3.0], [0.0], 0.5)
    # rank 3, with L2 and a nonzero accumulator
    rng = np.random.default_rng(1)
    check_against_reference(3, make_values(rng, 3, 1), [0, 0, 0], [0, 0, 0], [1.0, -2.0, 0.5],
                            [0.3], 0.2)


def test_loss_is_summed_before_each_step():
    """The same entry twice: the second error is measured after the first step (smaller)."""
    values = f32([1.0, 0.0, 1.0, 0.0])
    _, _, once = run_kernel(1, values, [0], [1], [3.0], [0.0, 0.0], 0.1)
    _, _, twice = run_kernel(1, values, [0, 0], [1, 1], [3.0, 3.0], [0.0, 0.0], 0.1)
    assert once == 4.0 and once < twice < 2 * once


def test_loss_is_accumulated_in_double():
    """Many entries of err 1/3: a float32 sum would drift visibly."""
    n = 3000
    values = np.zeros(4, F32)
    _, _, loss = run_kernel(1, values, [0] * n, [1] * n, [F32(1 / 3)] * n, [0.0, 0.0], 0.0)
    e = float(F32(1 / 3))
    assert loss == pytest.approx(n * e * e, rel=1e-12)


def test_zero_accumulator_stays_finite():
    """Accumulator 0 and gradient 0: 0 / sqrt(0 + eps) is 0, not NaN."""
    values = np.zeros(2 * 3 * 2, F32)
    after, updates, loss = run_kernel(3, values, [0, 1, 0], [1, 1, 0], [0.0, 0.0, 0.0],
                                      [0.5, 0.5], 0.1)
    assert loss == 0.0
    assert np.all(after == 0) and np.all(updates == 0)
    assert not np.any(np.signbit(after))  # 0 - 0 stays +0


def test_zero_accumulator_with_gradient_moves_by_about_lr():
    """First step from a zero accumulator: g / sqrt(g^2 + eps), about lr * sign(g)."""
    values = f32([0.5, 0.0, 0.25, 0.0])  # w, h; err = 1 - 0.125 > 0: g_w, g_h < 0
    after = check_against_reference(1, values, [0], [1], [1.0], [0.0, 0.0], 0.125)[0]
    np.testing.assert_allclose(after[0::2], [0.625, 0.375], atol=1e-6)


def test_tiny_gradient_is_damped_by_eps():
    """g^2 far below eps: the step is lr * g / sqrt(eps) = lr * g * 1000, not lr * sign(g)."""
    g = 1e-5
    # w = 0, h = 1, x = g / 2: err = g / 2, g_w = -2 * err * h = -g
    values = f32([0.0, 0.0, 1.0, 0.0])
    after, _, _ = check_against_reference(1, values, [0], [1], [g / 2], [0.0, 0.0], 0.1)
    step = 0.1 * g / math.sqrt(g * g + 1e-6)
    assert after[0] == pytest.approx(step, rel=1e-4)
    assert after[0] < 0.1 / 50  # far from lr * sign(g)


def test_empty_batch_returns_zero_and_zeroes_updates():
    values = np.arange(8, dtype=F32)
    updates = np.full(8, 3.0, F32)
    got = K.mf_train_batch(2, values, updates, i64([]), i64([]), f32([]), f32([1.0, 2.0]), 0.1)
    assert got == 0.0 and isinstance(got, float)
    assert np.all(updates == 0) and np.array_equal(values, np.arange(8))
    # no rows at all either
    assert K.mf_train_batch(3, f32([]), f32([]), i64([]), i64([]), f32([]), f32([]), 0.1) == 0.0


def test_updates_are_after_minus_before_even_when_large():
    """Big steps (lr 10, tiny values): updates still equal after - before in float32."""
    rng = np.random.default_rng(3)
    values = make_values(rng, 5, 3, scale=1e-3)
    _, updates, _ = check_against_reference(5, values, [0, 1, 2], [1, 2, 0], [3.0, -3.0, 1.0],
                                            [0.1, 0.1, 0.1], 10.0)
    assert np.max(np.abs(updates)) > 1.0


def test_keywords_and_2d_values():
    rng = np.random.default_rng(8)
    values = make_values(rng, 3, 4)
    a, b = values.copy(), values.copy().reshape(4, 6)
    ua, ub = np.empty_like(a), np.empty_like(b)
    args = (i64([0, 1, 2]), i64([3, 2, 1]), f32([1.0, 2.0, -1.0]), f32([0.1, 0.2, 0.3, 0.4]))
    got = K.mf_train_batch(3, a, ua, *args, 0.1)
    got_kw = K.mf_train_batch(rank=3, values=b, updates=ub, w_rows=args[0], h_rows=args[1],
                              x=args[2], reg=args[3], lr=0.1)
    assert got == got_kw
    assert np.array_equal(a, b.ravel()) and np.array_equal(ua, ub.ravel())


def test_read_only_inputs_are_accepted():
    rng = np.random.default_rng(11)
    values = make_values(rng, 2, 3)
    ins = [i64([0, 1]), i64([2, 2]), f32([1.0, -1.0]), f32([0.1, 0.1, 0.1])]
    for a in ins:
        a.flags.writeable = False
    after = values.copy()
    K.mf_train_batch(2, after, np.empty_like(values), *ins, 0.1)
    want, _ = ref_train(2, values, [0, 1], [2, 2], f32([1.0, -1.0]), [0.1] * 3, 0.1)
    assert np.array_equal(after, want)


def test_lr_is_rounded_to_float32():
    rng = np.random.default_rng(9)
    values = make_values(rng, 2, 3)
    a = run_kernel(2, values, [0, 1], [1, 2], [1.0, 2.0], [0.1] * 3, 0.1 + 1e-12)
    b = run_kernel(2, values, [0, 1], [1, 2], [1.0, 2.0], [0.1] * 3, 0.1)
    assert np.array_equal(a[0], b[0]) and a[2] == b[2]


def test_parallel_calls_on_distinct_buffers():
    """The GIL is released: batches on distinct buffers in threads give the sequential results."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(10)
    rank, rows, n = 16, 40, 2000
    values = make_values(rng, rank, rows, scale=0.1)
    w_rows, h_rows = rng.integers(0, rows, n), rng.integers(0, rows, n)
    x, reg = rng.normal(0, 1, n).astype(F32), rng.uniform(0, 0.1, rows).astype(F32)

    def one(lr):
        return run_kernel(rank, values, w_rows, h_rows, x, reg, lr)

    lrs = [0.01, 0.02, 0.05, 0.1]
    want = [one(lr) for lr in lrs]
    with ThreadPoolExecutor(2) as ex:
        got = list(ex.map(one, lrs))
    for (a, ua, la), (b, ub, lb) in zip(got, want, strict=True):
        assert np.array_equal(a, b) and np.array_equal(ua, ub) and la == lb


# ---- rejected calls ------------------------------------------------------------------------------


@pytest.fixture
def batch():
    """A valid batch: rank 3, 4 rows, 5 entries."""
    rng = np.random.default_rng(7)
    values = make_values(rng, 3, 4)
    return {"rank": 3, "values": values, "updates": np.full(len(values), 9.0, F32),
            "w_rows": i64([0, 1, 2, 3, 0]), "h_rows": i64([3, 2, 1, 0, 0]),
            "x": f32([1.0, 2.0, -1.0, 0.5, 0.0]), "reg": f32([0.1, 0.2, 0.3, 0.4]), "lr": 0.1}


def rejected(args, exc, **change):
    """The call with `change` applied raises exc and writes neither values nor updates."""
    args = dict(args, **change)
    values, updates = args["values"], args["updates"]
    before = np.array(values, copy=True)
    upd_before = np.array(updates, copy=True)
    with pytest.raises(exc):
        K.mf_train_batch(**args)
    assert np.array_equal(np.asarray(values), before, equal_nan=True)
    assert np.array_equal(np.asarray(updates), upd_before, equal_nan=True)


def test_valid_fixture_batch_runs(batch):
    values = batch["values"].copy()
    K.mf_train_batch(**dict(batch, values=values))
    assert not np.array_equal(values, batch["values"])


@pytest.mark.parametrize("name,dtype", [
    ("values", np.float64), ("values", np.float16), ("values", np.int32),
    ("updates", np.float64), ("w_rows", np.int32), ("w_rows", np.uint64),
    ("w_rows", np.float64), ("h_rows", np.int32), ("x", np.float64), ("x", np.int32),
    ("reg", np.float64), ("reg", np.int64)])
def test_wrong_dtype(batch, name, dtype):
    rejected(batch, TypeError, **{name: batch[name].astype(dtype)})


@pytest.mark.parametrize("name", ["values", "updates", "w_rows", "h_rows", "x", "reg"])
def test_not_a_buffer(batch, name):
    rejected(batch, TypeError, **{name: batch[name].tolist()})


def test_wrong_sizes(batch):
    n = len(batch["values"])  # 24 = 4 rows of 6
    rejected(batch, ValueError, values=batch["values"][:n - 1].copy(),
             updates=np.zeros(n - 1, F32))                                # not whole rows
    rejected(batch, ValueError, values=batch["values"][:n - 3].copy(),
             updates=np.zeros(n - 3, F32))                                # half a row
    rejected(batch, ValueError, updates=np.zeros(n - 1, F32))
    rejected(batch, ValueError, updates=np.zeros(n + 1, F32))
    rejected(batch, ValueError, updates=np.zeros(n + 6, F32))             # one row more
    rejected(batch, ValueError, reg=f32([0.1, 0.2, 0.3]))                 # not one per row
    rejected(batch, ValueError, reg=f32([0.1] * 5))
    rejected(batch, ValueError, w_rows=i64([0, 1, 2, 3]))
    rejected(batch, ValueError, h_rows=i64([0, 1, 2, 3, 0, 1]))
    rejected(batch, ValueError, x=f32([1.0, 2.0, 3.0, 4.0]))
    rejected(batch, ValueError, x=f32([1.0] * 6))
    rejected(batch, ValueError, rank=5)  # 24 floats are not rows of 10
    rejected(batch, ValueError, rank=2)  # 6 rows of 4: reg (4 floats) is not one per row


def test_rank_two_reading_of_the_same_buffer_runs(batch):
    """The same 24 floats are 6 rows of rank 2: a valid call (the rank defines the rows)."""
    values = batch["values"].copy()
    K.mf_train_batch(**dict(batch, values=values, rank=2, reg=f32([0.1] * 6)))


@pytest.mark.parametrize("rank", [0, -1, -3, MAX_RANK + 1, 1 << 40])
def test_rank_outside_range(batch, rank):
    rejected(batch, ValueError, rank=rank)


def test_largest_rank_is_accepted():
    values = np.zeros(2 * 2 * MAX_RANK, F32)
    values[2 * MAX_RANK:3 * MAX_RANK] = 1.0  # h = 1, w = 0: err 1, g_w = -2
    K.mf_train_batch(MAX_RANK, values, np.empty_like(values), i64([0]), i64([1]), f32([1.0]),
                     f32([0.0, 0.0]), 0.1)
    assert np.all(values[:MAX_RANK] == F32(0.1) * F32(2.0) / np.sqrt(F32(4.0) + EPS))
    assert np.all(values[MAX_RANK:2 * MAX_RANK] == 4.0)


@pytest.mark.parametrize("where", ["w_rows", "h_rows"])
@pytest.mark.parametrize("bad", [-1, 4, 5, 1 << 40, -(1 << 62), -(1 << 63), (1 << 63) - 1])
def test_row_index_out_of_range(batch, where, bad):
    arr = batch[where].copy()
    arr[-1] = bad  # the last entry: the earlier, valid ones must not be trained either
    rejected(batch, ValueError, **{where: arr})


def test_row_index_out_of_range_names_the_entry(batch):
    arr = batch["h_rows"].copy()
    arr[2] = 4
    with pytest.raises(ValueError, match=r"entry 2 .*outside \[0, 4\)"):
        K.mf_train_batch(**dict(batch, values=batch["values"].copy(), h_rows=arr))


def test_layout_and_aliasing(batch):
    v = batch["values"]
    n = len(v)
    rejected(batch, ValueError, values=np.repeat(v, 2)[::2])                # strided
    rejected(batch, ValueError, updates=np.zeros(2 * n, F32)[::2])
    rejected(batch, ValueError, w_rows=np.repeat(batch["w_rows"], 2)[::2])
    rejected(batch, ValueError, h_rows=np.repeat(batch["h_rows"], 2)[::2])
    rejected(batch, ValueError, x=np.repeat(batch["x"], 2)[::2])
    rejected(batch, ValueError, reg=np.repeat(batch["reg"], 2)[::2])
    rejected(batch, ValueError, values=np.asfortranarray(v.reshape(4, 6)))   # not C order
    rejected(batch, ValueError, w_rows=batch["w_rows"].reshape(5, 1))        # 2-D indices
    rejected(batch, ValueError, x=batch["x"].reshape(1, 5))
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


def test_written_buffers_overlapping_an_input(batch):
    """values (or updates) sharing memory with x, reg or an index array, through raw bytes."""
    n = len(batch["values"])
    raw = np.zeros(4 * n + 64, np.uint8)
    values = raw[:4 * n].view(F32)
    values[:] = batch["values"]
    x = raw[4 * n - 4:4 * n + 16].view(F32)  # its first item is values' last float
    x[:] = 0.0
    rejected(batch, ValueError, values=values, x=x)
    rejected(batch, ValueError, updates=values, x=x)
    reg = raw[4 * n - 8:4 * n + 8].view(F32)
    rejected(batch, ValueError, values=values, reg=reg)
    rows = raw[4 * n - 8:4 * n + 32].view(np.int64)
    rows[:] = 0
    rejected(batch, ValueError, values=values, w_rows=rows)
    rejected(batch, ValueError, updates=values, h_rows=rows)


# ---- mf_parse ------------------------------------------------------------------------------------

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def parse(text, skip_percent=True, base=0, room=None):
    """(count, rows, cols, vals, lines) of mf_parse (the outputs cut to the count)."""
    room = text.count(b"\n") + 1 if room is None else room
    rows, cols = np.full(room, -7, np.int64), np.full(room, -7, np.int64)
    vals, lines = np.full(room, np.nan, F32), np.full(room, -7, np.int64)
    got = K.mf_parse(text, skip_percent, base, rows, cols, vals, lines)
    assert isinstance(got, int)
    k = max(got, 0)
    return got, rows[:k].tolist(), cols[:k].tolist(), vals[:k].copy(), lines[:k].tolist()


def ref_parse(text, skip_percent=True, base=0):
    """mf_parse on valid lines in Python: (count, rows, cols, vals, lines)."""
    rows, cols, vals, lines = [], [], [], []
    for number, line in enumerate(text.split(b"\n"), 1):
        s = line.strip(b" \t\r")
        if not s or (skip_percent and s.startswith(b"%")):
            continue
        r, c, v = re.split(rb"[ \t\r]+", s)
        rows.append(int(r) - base)
        cols.append(int(c) - base)
        vals.append(F32(float(v)))
        lines.append(number)
    return len(rows), rows, cols, np.array(vals, F32), lines


def same_floats(a, b):
    """Bitwise equal float32 arrays (tells -0.0 from 0.0)."""
    return np.array_equal(np.asarray(a, F32).view(np.uint32), np.asarray(b, F32).view(np.uint32))


def number_texts():
    """A finite value (within float32 range) as text in one of several notations."""
    small_int = st.integers(-10**6, 10**6).map(str)
    as_repr = st.floats(-1e38, 1e38, allow_nan=False).map(repr)
    exp = st.tuples(st.floats(-1e38, 1e38, allow_nan=False), st.integers(0, 12),
                    st.sampled_from(["e", "E"])).map(lambda t: f"{t[0]:.{t[1]}{t[2]}}")
    plus = st.tuples(st.floats(0.0, 1e30), st.sampled_from(["e", "E"])).map(
        lambda t: "+" + f"{t[0]:{t[1]}}")  # "+1.000000E+02"
    fixed = st.tuples(st.integers(-10**6, 10**6), st.integers(0, 999)).map(
        lambda t: f"{t[0]}.{t[1]:03d}")
    special = st.sampled_from(["1", "-2.5", "3e-4", "+1E+2", "0", "-0", "-0.0", ".5", "5.",
                               "1e-50", "-1e-45", "3.4028234e38", "1.17549435e-38",
                               "007", "+0.0"])
    return st.one_of(small_int, as_repr, exp, plus, fixed, special)


SEP = st.text(alphabet=" \t", min_size=1, max_size=3)
OPT_BLANKS = st.text(alphabet=" \t", max_size=3)
INTS = st.integers(INT64_MIN + 1, INT64_MAX - 1) | st.integers(-1000, 1000)


@st.composite
def entry_lines(draw):
    r, c = draw(INTS), draw(INTS)
    sign = draw(st.sampled_from(["", "", "+"]))
    fields = [(sign if r >= 0 else "") + str(r), str(c), draw(number_texts())]
    return (draw(OPT_BLANKS) + fields[0] + draw(SEP) + fields[1] + draw(SEP) + fields[2]
            + draw(OPT_BLANKS))


def other_lines():
    return st.one_of(st.just(""), OPT_BLANKS, st.just("\r"),
                     st.tuples(OPT_BLANKS, st.text(alphabet="abc %1 \t", max_size=20)).map(
                         lambda t: t[0] + "%" + t[1]))


@st.composite
def texts(draw):
    lines = draw(st.lists(entry_lines() | other_lines(), max_size=25))
    ends = [draw(st.sampled_from(["\n", "\r\n"])) for _ in lines]
    text = "".join(line + end for line, end in zip(lines, ends, strict=True))
    if lines and draw(st.booleans()):
        text = text.rstrip("\n")  # no final newline
    return text.encode()


@given(text=texts(), base=st.sampled_from([0, 1]))
@settings(max_examples=150, deadline=None)
def test_parse_matches_reference(text, base):
    got = parse(text, True, base)
    want = ref_parse(text, True, base)
    assert got[0] == want[0]
    assert got[1:3] == want[1:3] and got[4] == want[4]
    assert same_floats(got[3], want[3])


BAD_LINES = ["1 2", "1", "1 2 abc", "1 2 3 4", "1.5 2 3", "1 2.5 3", "1 2 nan", "1 2 NaN",
             "1 2 inf", "1 2 -inf", "1 2 Infinity", "1 2 1e400", "a 1 2", "1 2 3x", "1,2,3",
             "- 1 2", "1 - 2", "1 2 -", "1 2 3 %", "1 2 3.0.0", "0x1 2 3", "1 2 \x003",
             "1\x00 2 3", "1 2 3\x00", "1 2 " + "0" * 252 + "1"]


@given(before=st.lists(entry_lines() | other_lines(), max_size=8),
       after=st.lists(entry_lines() | other_lines(), max_size=4),
       bad=st.sampled_from(BAD_LINES), base=st.sampled_from([0, 1]))
@settings(max_examples=80, deadline=None)
def test_bad_line_returns_minus_its_number(before, after, bad, base):
    text = "\n".join(before + [bad] + after).encode()
    assert parse(text, True, base)[0] == -(len(before) + 1)


@pytest.mark.parametrize("bad", BAD_LINES)
def test_each_bad_line_by_itself(bad):
    assert parse(bad.encode())[0] == -1
    assert parse(b"% c\n0 0 1\n\n" + bad.encode() + b"\n1 1 1\n")[0] == -4


def test_parse_by_hand():
    text = b"% header\n1 2 3\n\n  -4\t+5 \t-2.5e1  \r\n% 1 2 x\n7 8 .25"
    got = parse(text, True, 1)
    assert got[:3] == (3, [0, -5, 6], [1, 4, 7])
    assert got[3].tolist() == [3.0, -25.0, 0.25] and got[4] == [2, 4, 6]
    # with skip_percent off, the first line is an error
    assert parse(text, False, 1)[0] == -1
    assert parse(b"1 2 3\n  % x\n", False)[0] == -2
    assert parse(b"1 2 3\n  % x\n", True)[0] == 1  # '%' after blanks is a comment too


def test_parse_value_is_rounded_to_float32():
    got = parse(b"0 0 0.1\n0 0 16777217\n0 0 1e-46\n0 0 -1e-46\n")
    assert same_floats(got[3], [F32(0.1), F32(16777216.0), F32(0.0), F32(-0.0)])


def test_line_lengths():
    """A line of 255 bytes parses, one of 256 does not; blank or comment lines of any length
    are skipped."""
    line = b"1 2 " + b"0" * 250 + b"1"
    assert len(line) == 255 and parse(line)[:2] == (1, [1])
    assert parse(line + b"0")[0] == -1
    assert parse(b"1 1 1\n" + b" " * 1000 + b"\n" + b"% " + b"x" * 1000 + b"\n2 2 2")[0] == 2


def test_empty_and_blank_texts():
    got = parse(b"")
    assert got[0] == 0 and got[1:3] == ([], []) and got[4] == []
    assert parse(b"\n\n \t\r\n")[0] == 0
    assert parse(b"%only\n% comments")[0] == 0


def test_parse_int_extremes():
    got = parse(f"{INT64_MAX} {INT64_MIN} 1\n".encode())
    assert got[:3] == (1, [INT64_MAX], [INT64_MIN])
    got = parse(f"{INT64_MAX} {INT64_MIN + 1} 1\n".encode(), base=1)
    assert got[:3] == (1, [INT64_MAX - 1], [INT64_MIN])


@pytest.mark.parametrize("line,base", [("99999999999999999999 0 1", 0),
                                       ("0 -99999999999999999999 1", 0),
                                       (f"{INT64_MIN} 1 1", 1)])
def test_ids_beyond_int64_are_rejected(line, base):
    assert parse(line.encode(), base=base)[0] == -1


@pytest.mark.parametrize("value", ["1e39", "-3.5e38", "1e300"])
def test_values_beyond_float32_are_rejected(value):
    assert parse(f"0 0 {value}".encode())[0] == -1


def test_parse_accepts_other_text_buffers_and_keywords():
    rows, cols = np.zeros(2, np.int64), np.zeros(2, np.int64)
    vals, lines = np.zeros(2, F32), np.zeros(2, np.int64)
    for text in (b"3 4 5\n", bytearray(b"3 4 5\n"), memoryview(b"3 4 5\n"),
                 np.frombuffer(b"3 4 5\n", np.uint8)):
        assert K.mf_parse(text=text, skip_percent=True, base=0, rows=rows, cols=cols,
                          vals=vals, lines=lines) == 1
        assert (rows[0], cols[0], vals[0], lines[0]) == (3, 4, 5.0, 1)
    with pytest.raises(TypeError):
        K.mf_parse("3 4 5\n", True, 0, rows, cols, vals, lines)


@pytest.fixture
def outs():
    return {"rows": np.zeros(3, np.int64), "cols": np.zeros(3, np.int64),
            "vals": np.zeros(3, F32), "lines": np.zeros(3, np.int64)}


def parse_rejected(outs, exc, text=b"1 2 3\n4 5 6\n", **change):
    args = dict(outs, **change)
    before = {k: np.array(v, copy=True) for k, v in args.items()}
    with pytest.raises(exc):
        K.mf_parse(text, True, 0, args["rows"], args["cols"], args["vals"], args["lines"])
    for k, v in args.items():
        assert np.array_equal(np.asarray(v), before[k]), k


@pytest.mark.parametrize("name", ["rows", "cols", "vals", "lines"])
def test_parse_output_too_small(outs, name):
    """Room for one entry per line (newlines + 1) in every output."""
    parse_rejected(outs, ValueError, **{name: outs[name][:2].copy()})
    parse_rejected(outs, ValueError, text=b"1 1 1\n\n\n", **{name: outs[name][:3].copy()})


def test_parse_output_room_is_lines_not_entries(outs):
    # 2 newlines: room 3 even though the last line is empty
    assert K.mf_parse(b"1 2 3\n4 5 6\n", True, 0, outs["rows"], outs["cols"], outs["vals"],
                      outs["lines"]) == 2


@pytest.mark.parametrize("name,dtype", [("rows", np.int32), ("cols", np.float64),
                                        ("vals", np.float64), ("lines", np.int32),
                                        ("vals", np.int32)])
def test_parse_output_wrong_dtype(outs, name, dtype):
    parse_rejected(outs, TypeError, **{name: outs[name].astype(dtype)})


def test_parse_outputs_sharing_memory(outs):
    parse_rejected(outs, ValueError, cols=outs["rows"])
    parse_rejected(outs, ValueError, lines=outs["rows"])
    raw = np.zeros(8 * 7, np.uint8)
    parse_rejected(outs, ValueError, rows=raw[:24].view(np.int64),
                   cols=raw[16:40].view(np.int64))
    parse_rejected(outs, ValueError, vals=raw[:12].view(F32), lines=raw[8:32].view(np.int64))
    # the text sharing memory with an output
    buf = np.zeros(6, np.int64)
    text = memoryview(buf).cast("B")
    text[:6] = b"1 2 3\n"
    parse_rejected(outs, ValueError, text=text, rows=buf)


def test_parse_outputs_read_only_or_strided(outs):
    ro = outs["vals"].copy()
    ro.flags.writeable = False
    parse_rejected(outs, ValueError, vals=ro)
    parse_rejected(outs, ValueError, rows=np.zeros(6, np.int64)[::2])
    parse_rejected(outs, ValueError, lines=np.zeros((3, 2), np.int64))  # 2-D


# ---- mf_format -----------------------------------------------------------------------------------


def test_format_by_hand():
    got = K.mf_format(i64([0, 5]), i64([1, 2]), f32([1.5, -0.1]), 1, " ")
    assert got == b"1 2 1.5\n6 3 -0.100000001\n"
    got = K.mf_format(i64([0]), i64([7]), f32([-0.0]), 0, "\t")
    assert got == b"0\t7\t-0\n"
    assert K.mf_format(rows=i64([]), cols=i64([]), vals=f32([]), base=1, sep=" ") == b""
    got = K.mf_format(i64([INT64_MAX]), i64([INT64_MIN]), f32([3.4028235e38]), 0, "\t")
    assert got == f"{INT64_MAX}\t{INT64_MIN}\t3.40282347e+38\n".encode()


FLOAT32S = st.floats(width=32, allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 1.17549435e-38, 3.4028235e38, -3.4028235e38,
     0.1, 1 / 3])


@given(entries=st.lists(st.tuples(st.integers(INT64_MIN + 1, INT64_MAX - 1),
                                  st.integers(INT64_MIN + 1, INT64_MAX - 1), FLOAT32S),
                        max_size=30),
       base=st.sampled_from([0, 1]), sep=st.sampled_from([" ", "\t"]))
@settings(max_examples=100, deadline=None)
def test_format_parses_back(entries, base, sep):
    rows = i64([e[0] for e in entries])
    cols = i64([e[1] for e in entries])
    vals = f32([e[2] for e in entries])
    text = K.mf_format(rows, cols, vals, base, sep)
    assert isinstance(text, bytes)
    assert text.count(b"\n") == len(entries) and (not entries or text.endswith(b"\n"))
    other = "\t" if sep == " " else " "
    assert other.encode() not in text
    got = parse(text, False, base)
    assert got[0] == len(entries)
    assert got[1] == rows.tolist() and got[2] == cols.tolist()
    assert same_floats(got[3], vals)
    assert got[4] == list(range(1, len(entries) + 1))
    # the ids as written are the ids plus base
    for line, r, c in zip(text.split(b"\n"), rows.tolist(), cols.tolist()):
        a, b, _ = line.split(sep.encode())
        assert (int(a), int(b)) == (r + base, c + base)


@pytest.mark.parametrize("sep", [",", "\n", "x", "\r", "\x00"])
def test_format_bad_sep(sep):
    with pytest.raises(ValueError):
        K.mf_format(i64([0]), i64([0]), f32([1.0]), 0, sep)


@pytest.mark.parametrize("sep", ["", "  ", b" ", 32])
def test_format_sep_not_one_char(sep):
    with pytest.raises(TypeError):
        K.mf_format(i64([0]), i64([0]), f32([1.0]), 0, sep)


def test_format_mismatched_lengths():
    with pytest.raises(ValueError):
        K.mf_format(i64([0, 1]), i64([0]), f32([1.0, 2.0]), 0, " ")
    with pytest.raises(ValueError):
        K.mf_format(i64([0]), i64([0]), f32([1.0, 2.0]), 0, " ")
    with pytest.raises(ValueError):
        K.mf_format(i64([0, 1]), i64([0, 1]), f32([1.0]), 0, " ")


@pytest.mark.parametrize("which,dtype", [(0, np.int32), (1, np.float64), (2, np.float64),
                                         (2, np.int32)])
def test_format_wrong_dtype(which, dtype):
    args = [i64([0, 1]), i64([2, 3]), f32([1.0, 2.0])]
    args[which] = args[which].astype(dtype)
    with pytest.raises(TypeError):
        K.mf_format(*args, 0, " ")
    with pytest.raises(TypeError):
        K.mf_format([0, 1], [2, 3], [1.0, 2.0], 0, " ")


def test_format_read_only_inputs_and_layout():
    rows = i64([0, 1, 2, 3])
    rows.flags.writeable = False
    got = K.mf_format(rows, i64([4, 5, 6, 7]), f32([1, 2, 3, 4]), 0, " ")
    assert got == b"0 4 1\n1 5 2\n2 6 3\n3 7 4\n"
    with pytest.raises(ValueError):  # strided
        K.mf_format(i64([0, 1, 2, 3])[::2], i64([4, 5]), f32([1, 2]), 0, " ")
    with pytest.raises(ValueError):  # 2-D
        K.mf_format(i64([[0, 1], [2, 3]]), i64([4, 5, 6, 7]), f32([1, 2, 3, 4]), 0, " ")


# ---- mf_plan: one batch's keys, rows and weights -------------------------------------------------


def _plan_inputs(num_rows, num_cols, entries, seed=0):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, num_rows, entries).astype(np.int64)
    cols = rng.integers(0, num_cols, entries).astype(np.int64)
    vals = rng.random(entries).astype(F32)
    reg_of = rng.random(num_rows + num_cols).astype(F32)
    return rows, cols, vals, reg_of


def _plan(rows, cols, vals, num_rows, reg_of, points, row_of=None):
    n = len(points)
    row_of = np.full(len(reg_of), -1, np.int32) if row_of is None else row_of
    keys, w, h = np.empty(2 * n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    x, reg = np.empty(n, F32), np.empty(2 * n, F32)
    nk, nr = K.mf_plan(rows, cols, vals, num_rows, reg_of, row_of, points, keys, w, h, x, reg)
    return keys[:nk], nr, w, h, x, reg[:nk], row_of


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 3000), st.integers(1, 4000), st.integers(0, 3000),
       st.integers(0, 2**32 - 1))
def test_plan_matches_numpy_unique(num_rows, num_cols, entries, n, seed):
    """The arrays the MF app computed with numpy before (apps/mf.py: MFTrainer.plan), exactly:
    keys ascending, each entry's rows in them, values, per-key weights; row keys first."""
    rows, cols, vals, reg_of = _plan_inputs(num_rows, num_cols, entries, seed)
    points = np.random.default_rng(seed).integers(0, entries, n).astype(np.int64)
    keys, nr, w, h, x, reg, row_of = _plan(rows, cols, vals, num_rows, reg_of, points)
    expect, inverse = np.unique(np.concatenate([rows[points], num_rows + cols[points]]),
                                return_inverse=True)
    assert np.array_equal(keys, expect)
    assert np.array_equal(w, inverse[:n]) and np.array_equal(h, inverse[n:])
    assert np.array_equal(x, vals[points]) and np.array_equal(reg, reg_of[expect])
    assert np.array_equal(keys[nr:], expect[expect >= num_rows])
    assert (row_of == -1).all()  # the scratch is left as it was found


def test_plan_wide_key_span_and_duplicates():
    """Keys spread over a large range (several radix passes) and repeated entries."""
    num_rows, num_cols = 3, 5_000_000
    rows = np.array([2, 0, 2, 1], np.int64)
    cols = np.array([4_999_999, 0, 123_456, 4_999_999], np.int64)
    vals = np.arange(4, dtype=F32)
    reg_of = np.zeros(num_rows + num_cols, F32)
    points = np.array([0, 1, 2, 3, 0, 2], np.int64)
    keys, nr, w, h, x, reg, _ = _plan(rows, cols, vals, num_rows, reg_of, points)
    assert keys.tolist() == [0, 1, 2, 3, 3 + 123_456, 3 + 4_999_999]
    assert nr == 3 and w.tolist() == [2, 0, 2, 1, 2, 2] and h.tolist() == [5, 3, 4, 5, 5, 4]


@pytest.mark.parametrize("bad", ["point", "row", "col"])
def test_plan_out_of_range_writes_nothing(bad):
    rows, cols, vals, reg_of = _plan_inputs(10, 10, 50)
    points = np.arange(20, dtype=np.int64)
    if bad == "point":
        points[7] = 50
    elif bad == "row":
        rows[7] = 10
    else:
        cols[7] = -1
    row_of = np.full(20, -1, np.int32)
    with pytest.raises(ValueError, match=r"points\[7\]"):
        _plan(rows, cols, vals, 10, reg_of, points, row_of)
    assert (row_of == -1).all()


def test_plan_checks_its_buffers():
    rows, cols, vals, reg_of = _plan_inputs(10, 10, 50)
    points = np.arange(20, dtype=np.int64)
    row_of = np.full(20, -1, np.int32)
    keys, w, h = np.empty(40, np.int64), np.empty(20, np.int64), np.empty(20, np.int64)
    x, reg = np.empty(20, F32), np.empty(40, F32)
    args = [rows, cols, vals, 10, reg_of, row_of, points, keys, w, h, x, reg]
    with pytest.raises(TypeError, match="rows must be int64"):
        K.mf_plan(rows.astype(np.int32), *args[1:])
    with pytest.raises(ValueError, match="room for 2"):
        K.mf_plan(*args[:7], keys[:39], *args[8:])
    with pytest.raises(ValueError, match="one item per key"):
        K.mf_plan(*args[:5], row_of[:19], *args[6:])
    with pytest.raises(ValueError, match="shares memory"):
        K.mf_plan(*args[:8], keys[:20], *args[9:])
    with pytest.raises(ValueError, match="writable"):
        x.flags.writeable = False
        K.mf_plan(*args)


# ---- mf_train_table: a run of batches over the baseline's table ----------------------------------


def _table_run_inputs(num_rows, num_cols, entries, rank, seed):
    rows, cols, vals, reg_of = _plan_inputs(num_rows, num_cols, entries, seed)
    reg_of *= F32(0.1)
    rng = np.random.default_rng(seed + 1)
    nkeys, width = num_rows + num_cols, 2 * rank
    data = np.empty((nkeys, width), F32)
    data[:, :rank] = rng.normal(0.0, 0.3, (nkeys, rank))
    data[:, rank:] = rng.uniform(0.0, 0.5, (nkeys, rank))
    lens = np.full(nkeys, width, np.int64)
    return rows, cols, vals, reg_of, data.reshape(-1), np.arange(nkeys) * width, lens


def _per_batch(rank, lr, bs, rows, cols, vals, num_rows, reg_of, points, data, offsets, lens):
    """The MF app's per-batch path over the table: plan, pull, step, push (mf.MFTrainer)."""
    data = data.copy()
    losses, counts = [], []
    for start in range(0, len(points), bs):
        keys, _, w, h, x, reg, _ = _plan(rows, cols, vals, num_rows, reg_of,
                                         points[start:start + bs])
        values = np.empty((len(keys), 2 * rank), F32)
        updates = np.empty_like(values)
        K.table_gather(data, offsets, lens, keys, values)
        losses.append(K.mf_train_batch(rank, values, updates, w, h, x, reg, lr))
        K.table_scatter_add(data, offsets, lens, keys, updates)
        counts.append(len(keys))
    return data, losses, counts


def _table_run(rank, lr, bs, rows, cols, vals, num_rows, reg_of, points, data, offsets, lens,
               row_of=None):
    batches = -(-len(points) // bs)
    row_of = np.full(len(reg_of), -1, np.int32) if row_of is None else row_of
    losses, counts = np.full(batches, -1.0), np.full(batches, -1, np.int64)
    iscratch = np.empty(4 * bs, np.int64)
    fscratch = np.empty(3 * bs + 8 * bs * rank, F32)
    got = K.mf_train_table(rank, lr, bs, rows, cols, vals, num_rows, reg_of, row_of, points,
                           data, offsets, lens, iscratch, fscratch, losses, counts)
    assert got == batches and (row_of == -1).all()
    return losses.tolist(), counts.tolist()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 2000), st.integers(0, 900),
       st.integers(1, 200), st.integers(1, 12), st.sampled_from([0.01, 0.2, 1.0]),
       st.integers(0, 2**31))
def test_table_run_is_the_per_batch_path_exactly(num_rows, num_cols, entries, n, bs, rank, lr,
                                                  seed):
    """Plan, gather, train and scatter per batch, in one call: the same table, losses and key
    counts as the calls one by one, bit for bit (the last batch short, repeated points)."""
    rows, cols, vals, reg_of, data, offsets, lens = _table_run_inputs(num_rows, num_cols,
                                                                      entries, rank, seed)
    points = np.random.default_rng(seed).integers(0, entries, n).astype(np.int64)
    want, want_losses, want_counts = _per_batch(rank, lr, bs, rows, cols, vals, num_rows,
                                                reg_of, points, data, offsets, lens)
    losses, counts = _table_run(rank, lr, bs, rows, cols, vals, num_rows, reg_of, points, data,
                                offsets, lens)
    assert np.array_equal(data, want)
    assert losses == want_losses and counts == want_counts


@pytest.mark.parametrize("bad", ["point", "row", "col"])
def test_table_run_checks_every_point_before_training(bad):
    rows, cols, vals, reg_of, data, offsets, lens = _table_run_inputs(10, 10, 50, 2, 3)
    points = np.arange(40, dtype=np.int64)
    if bad == "point":
        points[37] = 50
    elif bad == "row":
        rows[37] = 10
    else:
        cols[37] = 10
    before = data.copy()
    row_of = np.full(20, -1, np.int32)
    with pytest.raises(ValueError, match=r"points\[37\].*nothing trained"):
        _table_run(2, 0.1, 8, rows, cols, vals, 10, reg_of, points, data, offsets, lens, row_of)
    assert np.array_equal(data, before) and (row_of == -1).all()


def test_table_run_checks_its_buffers():
    rank, bs = 2, 8
    rows, cols, vals, reg_of, data, offsets, lens = _table_run_inputs(10, 10, 50, rank, 3)
    points = np.arange(40, dtype=np.int64)
    args = {"rank": rank, "lr": 0.1, "batch_size": bs, "rows": rows, "cols": cols,
            "vals": vals, "num_rows": 10, "reg_of": reg_of, "row_of": np.full(20, -1, np.int32),
            "points": points, "data": data, "key_offset": offsets, "key_len": lens,
            "iscratch": np.empty(4 * bs, np.int64), "fscratch": np.empty(3 * bs + 8 * bs * rank, F32),
            "losses": np.empty(5), "keys": np.empty(5, np.int64)}
    before = data.copy()
    bad = [({"iscratch": np.empty(4 * bs - 1, np.int64)}, ValueError, "iscratch"),
           ({"fscratch": np.empty(3 * bs + 8 * bs * rank - 1, F32)}, ValueError, "fscratch"),
           ({"losses": np.empty(4)}, ValueError, "one item per batch"),
           ({"keys": np.empty(5, np.int32)}, TypeError, "keys"),
           ({"losses": np.empty(5, F32)}, TypeError, "losses"),
           ({"key_len": lens[:-1]}, ValueError, "key_len"),
           ({"rank": 0}, ValueError, "rank"), ({"batch_size": 0}, ValueError, "batch_size"),
           ({"fscratch": data}, ValueError, "shares memory"),
           ({"data": before.copy()[::2]}, ValueError, "contiguous")]
    for change, exc, match in bad:
        with pytest.raises(exc, match=match):
            K.mf_train_table(**dict(args, **change))
    assert np.array_equal(data, before)
    # a table whose rows are not 2 * rank floats: the first batch meets it, nothing is trained
    with pytest.raises(ValueError, match="batch 0"):
        K.mf_train_table(**dict(args, key_len=np.full(20, 2 * rank + 1, np.int64)))
    assert np.array_equal(data, before)
    assert K.mf_train_table(**args) == 5 and not np.array_equal(data, before)


def test_table_run_threads_lose_no_update():
    """The GIL is released: two threads' runs on one table, on disjoint keys (so that neither
    reads what the other writes), give the sequential result exactly."""
    from concurrent.futures import ThreadPoolExecutor

    rank, bs = 4, 50
    rows, cols, vals, reg_of, data, offsets, lens = _table_run_inputs(200, 200, 4000, rank, 5)
    # thread 0 trains entries of rows < 100 and columns < 100, thread 1 the others
    low = np.flatnonzero((rows < 100) & (cols < 100)).astype(np.int64)
    high = np.flatnonzero((rows >= 100) & (cols >= 100)).astype(np.int64)
    want = data.copy()
    for points in (low, high):
        want = _per_batch(rank, 0.1, bs, rows, cols, vals, 200, reg_of, points, want, offsets,
                          lens)[0]
    with ThreadPoolExecutor(2) as ex:
        list(ex.map(lambda p: _table_run(rank, 0.1, bs, rows, cols, vals, 200, reg_of, p, data,
                                         offsets, lens), [low, high]))
    assert np.array_equal(data, want)


# ---- mf_train_rows: the same run over a node's store -------------------------------------------


def _rows_run(rank, lr, bs, rows, cols, vals, num_rows, reg_of, points, store):
    batches = -(-len(points) // bs)
    row_of = np.full(len(reg_of), -1, np.int32)
    losses, counts = np.full(batches, -1.0), np.full(batches, -1, np.int64)
    left_keys, left_rows = np.empty(2 * bs, np.int64), np.empty((2 * bs, 2 * rank), F32)
    got = K.mf_train_rows(rank, lr, bs, rows, cols, vals, num_rows, reg_of, row_of, points,
                          store.native.rows(), left_keys, left_rows, np.empty(6 * bs, np.int64),
                          np.empty(3 * bs + 8 * bs * rank, F32), losses, counts)
    assert (row_of == -1).all()
    return got, losses.tolist(), counts.tolist()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 100), st.integers(1, 100), st.integers(1, 600), st.integers(1, 400),
       st.integers(1, 20), st.integers(1, 6), st.integers(0, 2**31), st.booleans())
def test_store_run_is_the_table_run_up_to_a_key_held_elsewhere(num_rows, num_cols, entries, n,
                                                                bs, rank, seed, all_held):
    """Over a node's store: the table run's rows, losses and key counts, bit for bit, for every
    batch before the first one with a key not held here; that batch and the rest are left
    untouched (STOP_PULL), for the caller to train through the node."""
    rows, cols, vals, reg_of, data, offsets, lens = _table_run_inputs(num_rows, num_cols,
                                                                      entries, rank, seed)
    nkeys, width = num_rows + num_cols, 2 * rank
    rng = np.random.default_rng(seed)
    points = rng.integers(0, entries, n).astype(np.int64)
    held = np.arange(nkeys, dtype=np.int64)
    if not all_held:  # a key of some point (so some batch has it), and a few others
        p = points[rng.integers(0, n)]
        away = [rows[p] if rng.random() < 0.5 else num_rows + cols[p]]
        held = np.setdiff1d(held[rng.random(nkeys) < 0.998], away)
    store = store_with(data, width, held)
    got, losses, counts = _rows_run(rank, 0.1, bs, rows, cols, vals, num_rows, reg_of, points,
                                    store)
    # the batches before the first one with a key not held here
    away = np.setdiff1d(np.arange(nkeys), held)
    first = next((b for b, start in enumerate(range(0, n, bs))
                  if np.isin(np.concatenate([rows[points[start:start + bs]], num_rows +
                                             cols[points[start:start + bs]]]), away).any()),
                 None)
    trained = -(-n // bs) if first is None else first
    assert got == (trained, 0 if first is None else K.MF_STOP_PULL, 0)
    want, want_losses, want_counts = _per_batch(rank, 0.1, bs, rows, cols, vals, num_rows,
                                                reg_of, points[:trained * bs], data, offsets,
                                                lens)
    values = np.empty((len(held), width), F32)
    assert store.gather(held, values, np.empty(len(held), np.int64)) == 0
    assert np.array_equal(values, want.reshape(nkeys, width)[held])
    assert losses[:trained] == want_losses and counts[:trained] == want_counts


def test_store_run_checks_its_rows():
    rank, bs = 2, 8
    rows, cols, vals, reg_of, data, offsets, lens = _table_run_inputs(10, 10, 50, rank, 3)
    store = store_with(data, 2 * rank, np.arange(20, dtype=np.int64))
    args = {"rank": rank, "lr": 0.1, "batch_size": bs, "rows": rows, "cols": cols,
            "vals": vals, "num_rows": 10, "reg_of": reg_of, "row_of": np.full(20, -1, np.int32),
            "points": np.arange(40, dtype=np.int64), "store_rows": store.native.rows(),
            "left_keys": np.empty(2 * bs, np.int64),
            "left_rows": np.empty((2 * bs, 2 * rank), F32),
            "iscratch": np.empty(6 * bs, np.int64),
            "fscratch": np.empty(3 * bs + 8 * bs * rank, F32),
            "losses": np.empty(5), "keys": np.empty(5, np.int64)}
    other = store_with(np.zeros(20 * 6, F32), 6, np.arange(20, dtype=np.int64))
    bad = [({"store_rows": object()}, TypeError, "Store.rows"),
           ({"store_rows": other.native.rows()}, ValueError, "6 floats, not 2 \\* rank = 4"),
           ({"iscratch": np.empty(6 * bs - 1, np.int64)}, ValueError, "iscratch needs 6"),
           ({"left_keys": np.empty(2 * bs - 1, np.int64)}, ValueError, "left_keys"),
           ({"left_rows": np.empty((2 * bs, 2 * rank - 1), F32)}, ValueError, "left_keys"),
           ({"reg_of": np.ones(30, F32), "row_of": np.full(30, -1, np.int32)}, ValueError,
            "the matrix has 30 keys, the store 20")]
    for change, exc, match in bad:
        with pytest.raises(exc, match=match):
            K.mf_train_rows(**dict(args, **change))
    values = np.empty((20, 2 * rank), F32)
    store.gather(np.arange(20, dtype=np.int64), values, np.empty(20, np.int64))
    assert np.array_equal(values.reshape(-1), data)  # nothing trained by a failed call
    assert K.mf_train_rows(**args) == (5, 0, 0)


# ---- the epoch schedule's sort ----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=300), st.integers(1, 40),
       st.booleans())
def test_radix_argsort_is_numpys_stable_argsort(values, spread, small):
    """Any int64 keys, duplicates and negatives included (few distinct ones, or a range that
    leaves some digits shared by every key): numpy's argsort(kind="stable"), exactly."""
    keys = np.array(values, dtype=np.int64)
    if small:
        keys = keys % spread - spread // 2
    order = np.full(len(keys), -1, np.int64)
    assert K.radix_argsort(keys, order) is None
    assert np.array_equal(order, np.argsort(keys, kind="stable"))


def test_radix_argsort_checks_its_buffers():
    keys = np.arange(5, dtype=np.int64)[::-1].copy()
    with pytest.raises(ValueError, match="order needs one item per key"):
        K.radix_argsort(keys, np.empty(4, np.int64))
    with pytest.raises(TypeError, match="keys must be int64"):
        K.radix_argsort(keys.astype(np.int32), np.empty(5, np.int64))
    with pytest.raises(ValueError, match="shares memory"):
        K.radix_argsort(keys, keys)
    order = np.empty(5, np.int64)
    K.radix_argsort(keys, order)
    assert order.tolist() == [4, 3, 2, 1, 0]
