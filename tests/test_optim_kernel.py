"""adapm._kernels, the row updates of adapm.torch's optimizers (sgd_rows, adagrad_rows) against
float32 numpy references (bit for bit: the kernels are built without floating-point contraction
and do the same float operations in the same order), and their input checks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm._native_loader import load

K = load("adapm._kernels")
F32 = np.float32


def ref_sgd(grads, width, lr, maximize):
    out = np.zeros((len(grads), width), F32)
    out[:, :grads.shape[1]] = (lr if maximize else -lr) * grads
    return out


def ref_adagrad(rows, grads, lr, eps, initial, maximize):
    dim = grads.shape[1]
    g = -grads if maximize else grads
    squared = g * g
    acc = rows[:, dim:2 * dim] + F32(initial) + squared
    out = np.zeros_like(rows)
    out[:, :dim] = -lr * (g / (np.sqrt(acc) + F32(eps)))
    out[:, dim:2 * dim] = squared
    return out


@st.composite
def updates(draw):
    n, dim = draw(st.integers(0, 40)), draw(st.integers(1, 20))
    width = 2 * dim + draw(st.integers(0, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = rng.standard_normal((n, width)).astype(F32)
    rows[:, dim:2 * dim] = np.abs(rows[:, dim:2 * dim])  # sums of squares
    grads = (rng.standard_normal((n, dim)) * draw(st.sampled_from([1e-3, 1.0, 1e3]))).astype(F32)
    return rows, grads, draw(st.floats(1e-4, 1.0)), draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(updates(), st.sampled_from([0.0, 1e-10, 1e-3]), st.sampled_from([0.0, 0.1]))
def test_adagrad_rows_is_the_numpy_formula(case, eps, initial):
    rows, grads, lr, maximize = case
    out = np.full_like(rows, np.nan)  # every float written: the columns past 2 dim are zeroed
    K.adagrad_rows(rows, grads, out, grads.shape[1], lr, eps, initial, maximize)
    np.testing.assert_array_equal(out, ref_adagrad(rows, grads, lr, eps, initial, maximize))


@settings(max_examples=60, deadline=None)
@given(updates())
def test_sgd_rows_is_the_numpy_formula(case):
    rows, grads, lr, maximize = case
    out = np.full_like(rows, np.nan)
    K.sgd_rows(grads, out, grads.shape[1], lr, maximize)
    np.testing.assert_array_equal(out, ref_sgd(grads, rows.shape[1], lr, maximize))


def _bufs():
    rows = np.ones((4, 6), F32)
    return rows, np.ones((4, 3), F32), np.full((4, 6), 7.0, F32)


@pytest.mark.parametrize("change,exc,match", [
    (lambda r, g, o: (r, g.astype(np.float64), o, 3), TypeError, "grads must be float32"),
    (lambda r, g, o: (r.astype(np.float64), g, o, 3), TypeError, "rows must be float32"),
    (lambda r, g, o: (r, g, o, 5), ValueError, "not rows of dim = 5"),
    (lambda r, g, o: (r, g, o, 0), ValueError, "dim must be >= 1"),
    (lambda r, g, o: (r, g, o[:, :5].copy(), 3), ValueError, "out has 20 floats, not 4 rows of "
                                                             "at least 6"),
    (lambda r, g, o: (r[:3].copy(), g, o, 3), ValueError, "rows has 18 floats, out 24"),
    (lambda r, g, o: (r, g, r, 3), ValueError, "out"),  # out is rows: shares memory
])
def test_adagrad_rows_refuses_bad_buffers_before_writing(change, exc, match):
    rows, grads, out = _bufs()
    r, g, o, dim = change(rows, grads, out)
    before = o.copy()
    with pytest.raises(exc, match=match):
        K.adagrad_rows(r, g, o, dim, 0.1, 1e-10, 0.0)
    np.testing.assert_array_equal(o, before)


def test_sgd_rows_refuses_bad_buffers_before_writing():
    _, grads, out = _bufs()
    frozen = out.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError):
        K.sgd_rows(grads, frozen, 3, 0.1)
    with pytest.raises(ValueError, match="not 4 rows of at least 7"):
        K.sgd_rows(np.ones((4, 7), F32), out, 7, 0.1)
    np.testing.assert_array_equal(out, np.full((4, 6), 7.0, F32))
