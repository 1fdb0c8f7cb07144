"""When to act on an intent: the action timer of the AdaPM paper (Algorithm 1). Pure, no I/O.

Per worker, the timer keeps λ, an estimate of how many clocks the worker advances per sync
round. At round t, with Δ = C_t − C_{t−1} (clocks advanced since the previous round):

    if Δ > 0:  λ ← (1 − α)·λ + α·Δ                 (no update when the worker did not move)
    act on an intent iff  start < C_t + Q_Poisson(2·max(λ, Δ), p)

The Poisson quantile over-estimates how far the worker can get before the next round's actions
take effect (two rounds: this one and the next), so that a key is local in time with
probability p. Acting early costs little; acting late makes accesses remote. The defaults
(α = 0.1, p = 0.9999, λ₀ = 10) are the paper's and are the same for every task.
"""

from __future__ import annotations

import bisect
import math

import numpy as np


def poisson_quantile(p: float, mu: float) -> int:
    """Smallest k with P[Poisson(mu) <= k] >= p (equals scipy.stats.poisson.ppf(p, mu)).

    Uses the incomplete-gamma ufuncs directly: scipy.stats' generic machinery costs ~100 µs per
    call, this a few µs, and it runs once per worker per round.
    """
    if mu <= 0:
        return 0
    # Imported here, not at the top: `import adapm` stays free of scipy (a quarter second); the
    # first call comes when a worker is created (ActionTimer), and a repeated import is a
    # dictionary look-up.
    from scipy import special

    k = math.ceil(special.pdtrik(p, mu))
    below = max(k - 1, 0)
    return below if special.pdtr(below, mu) >= p else k


def quantile_brackets(p: float, start: int, stop: int) -> tuple[list, list]:
    """(los, his) for k in [start, stop): the quantile is k for every mu with
    los[i] < mu <= his[i], i = k - start (a slightly narrower range than the exact one, so
    that rounding in the inversion never makes it wrong; NaN bounds hold for no mu). Q(mu) = k
    exactly when P[Poisson(mu) <= k] >= p and, for k > 0, P[Poisson(mu) <= k - 1] < p; both
    sides are decreasing in mu, and ``pdtri`` inverts them (one vectorised call)."""
    from scipy import special

    edges = special.pdtri(np.arange(start - 1, stop), p)
    his = (edges[1:] * (1.0 - 1e-9)).tolist()
    los = (edges[:-1] * (1.0 + 1e-9)).tolist()
    if start == 0:
        los[0] = 0.0  # pdtri(-1, p) is NaN: nothing is below the quantile 0
    return los, his


# The table grows to the brackets of mu up to this (~70,000 of them, ~4 MB); beyond, each
# quantile is computed (a worker 50,000 clocks a round ahead of its rounds).
_TABLE_MU = 65536.0


class ActionTimer:
    """λ estimate and action horizon of one worker. Not thread-safe (the sync loop owns it)."""

    __slots__ = ("alpha", "p", "lam", "last_clock", "_his", "_los", "_limit")

    def __init__(self, alpha: float = 0.1, p: float = 0.9999, lambda0: float = 10.0,
                 clock: int = 0) -> None:
        self.alpha = alpha
        self.p = p
        self.lam = float(lambda0)
        self.last_clock = clock
        # The quantile's brackets in a table: the quantile is k for every mu in
        # (_los[k], _his[k]] (quantile_brackets' margins), found by bisection. mu follows the
        # clocks a round advanced when they exceed λ, so it jumps around from round to round:
        # a cache of the last 8 brackets still missed in 141 of 222 rounds of bench/adaptive.py
        # (an incomplete-gamma inversion each, ~35 us). Built now, on the thread that creates
        # the worker: the first call imports scipy (a third of a second), which in the engine
        # thread's first round stalled every node's engine (bench/engine.py).
        self._his: list[float] = []
        self._los: list[float] = []
        self._limit = _TABLE_MU  # the table grows for mu up to this
        self._extend(2.0 * self.lam)

    def _extend(self, mu: float) -> None:
        """Grow the table to the brackets up to mu's (at least twice as many as now)."""
        start = len(self._his)
        stop = min(max(2 * start, int(mu + 10.0 * math.sqrt(mu) + 32)),
                   int(_TABLE_MU + 10.0 * math.sqrt(_TABLE_MU) + 32))
        los, his = quantile_brackets(self.p, start, stop)
        for lo, hi in zip(los, his):
            if not (math.isfinite(hi) and math.isfinite(lo)):
                break  # beyond what the inversion gives: computed per call
            self._his.append(hi)
            self._los.append(lo)
        if not self._his or mu > self._his[-1]:  # it cannot grow that far: no more tries
            self._limit = self._his[-1] if self._his else 0.0

    def _quantile(self, mu: float) -> int:
        his = self._his
        if his and his[-1] < mu <= self._limit:
            self._extend(mu)
        k = bisect.bisect_left(his, mu)
        if k < len(his) and mu > self._los[k]:
            return k
        # Within a rounding margin of a bracket's edge, past the table, or mu <= 0.
        return poisson_quantile(self.p, mu)

    def horizon(self, clock: int) -> int:
        """Round with the worker at ``clock``: update λ, return h. Act on intents with start < h."""
        delta = clock - self.last_clock
        self.last_clock = clock
        if delta > 0:
            self.lam = (1.0 - self.alpha) * self.lam + self.alpha * delta
        return clock + self._quantile(2.0 * max(self.lam, float(max(delta, 0))))


class ImmediateTimer:
    """``Config(action_timing=False)``: act on every signalled intent in the next round."""

    __slots__ = ("last_clock",)

    def __init__(self, clock: int = 0) -> None:
        self.last_clock = clock

    def horizon(self, clock: int) -> float:
        self.last_clock = clock
        return math.inf
