"""The action timer (paper, Algorithm 1): pure tests against scipy's Poisson quantile."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import poisson

from adapm._engine.timing import ActionTimer, ImmediateTimer, poisson_quantile, quantile_brackets


@given(st.floats(1e-6, 1 - 1e-9), st.floats(0.0, 5000.0))
@settings(max_examples=300, deadline=None)
def test_quantile_matches_scipy(p, mu):
    assert poisson_quantile(p, mu) == int(poisson.ppf(p, mu))


@given(st.floats(1e-6, 1 - 1e-9), st.floats(0.0, 5000.0), st.floats(-1.0, 1.0))
@settings(max_examples=300, deadline=None)
def test_the_quantile_is_the_same_over_its_bracket(p, mu, where):
    """The timer reuses a quantile for every mu in its bracket: any mu there has it."""
    k = poisson_quantile(p, mu)
    (lo,), (hi,) = quantile_brackets(p, k, k + 1)
    if mu > 0:  # mu's quantile is k: mu lies in k's bracket (up to the bracket's margins)
        assert lo * (1 - 1e-6) <= mu <= hi * (1 + 1e-6), (lo, mu, hi)
    inside = lo + (hi - lo) * (0.5 + 0.5 * where) if hi > lo else hi
    if lo < inside <= hi:
        assert poisson_quantile(p, inside) == k


def test_first_round_uses_lambda0():
    timer = ActionTimer(alpha=0.1, p=0.9999, lambda0=10)
    # Δ = 0 in the first round: λ stays 10, horizon = 0 + Q(2·10).
    assert timer.horizon(0) == int(poisson.ppf(0.9999, 20))
    assert timer.lam == 10


def test_no_update_when_clock_did_not_move():
    timer = ActionTimer(lambda0=10)
    timer.horizon(5)  # Δ = 5 -> λ = 0.9·10 + 0.1·5 = 9.5
    lam = timer.lam
    assert math.isclose(lam, 9.5)
    horizon = timer.horizon(5)  # Δ = 0: λ unchanged
    assert timer.lam == lam
    assert horizon == 5 + int(poisson.ppf(0.9999, 2 * lam))


def test_uses_max_of_lambda_and_delta():
    timer = ActionTimer(lambda0=1)
    # A sudden jump of 100 clocks: λ only moves to 10.9, but the quantile uses Δ = 100.
    horizon = timer.horizon(100)
    assert math.isclose(timer.lam, 0.9 * 1 + 0.1 * 100)
    assert horizon == 100 + int(poisson.ppf(0.9999, 200))


@given(st.lists(st.integers(0, 50), min_size=1, max_size=40),
       st.floats(0.01, 1.0), st.floats(0.5, 0.99999), st.floats(0.1, 100.0))
@settings(max_examples=100, deadline=None)
def test_matches_reference_algorithm(steps, alpha, p, lambda0):
    timer = ActionTimer(alpha=alpha, p=p, lambda0=lambda0)
    lam, clock, prev = lambda0, 0, 0
    for step in steps:
        clock += step
        delta = clock - prev
        prev = clock
        if delta > 0:
            lam = (1 - alpha) * lam + alpha * delta
        expected = clock + int(poisson.ppf(p, 2 * max(lam, delta)))
        assert timer.horizon(clock) == expected
        assert math.isclose(timer.lam, lam)


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=30),
       st.floats(0.01, 1.0), st.floats(1e-6, 1 - 1e-9), st.floats(0.0, 3000.0))
@settings(max_examples=150, deadline=None)
def test_matches_scipy_over_large_jumps(steps, alpha, p, lambda0):
    """Clocks that jump by thousands per round, and any p: the timer's table of brackets
    (grown as mu grows) gives scipy's quantile every time."""
    timer = ActionTimer(alpha=alpha, p=p, lambda0=lambda0)
    lam, clock = lambda0, 0
    for step in steps:
        clock += step
        if step > 0:
            lam = (1 - alpha) * lam + alpha * step
        assert timer.horizon(clock) == clock + int(poisson.ppf(p, 2 * max(lam, step)))


def test_immediate_timer_acts_on_everything():
    timer = ImmediateTimer()
    assert timer.horizon(3) > 10**12
