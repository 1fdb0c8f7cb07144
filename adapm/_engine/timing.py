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

import math


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


def quantile_bracket(p: float, k: int) -> tuple[float, float]:
    """(lo, hi): the quantile is k for every mu with lo < mu <= hi (a slightly narrower range
    than the exact one, so that rounding in the inversion never makes it wrong; NaN bounds
    hold for no mu). Q(mu) = k exactly when P[Poisson(mu) <= k] >= p and, for k > 0,
    P[Poisson(mu) <= k - 1] < p; both sides are decreasing in mu, and ``pdtri`` inverts them."""
    from scipy import special

    hi = float(special.pdtri(k, p)) * (1.0 - 1e-9)
    lo = float(special.pdtri(k - 1, p)) * (1.0 + 1e-9) if k > 0 else 0.0
    return lo, hi


_BRACKETS = 8  # quantile brackets an ActionTimer keeps


class ActionTimer:
    """λ estimate and action horizon of one worker. Not thread-safe (the sync loop owns it)."""

    __slots__ = ("alpha", "p", "lam", "last_clock", "_cache")

    def __init__(self, alpha: float = 0.1, p: float = 0.9999, lambda0: float = 10.0,
                 clock: int = 0) -> None:
        self.alpha = alpha
        self.p = p
        self.lam = float(lambda0)
        self.last_clock = clock
        # [(lo, hi, quantile)]: the quantile is the same for every mu in (lo, hi], and λ moves a
        # little every busy round (an incomplete-gamma call per worker and round was ~3% of a
        # 2-node KGE run's engine thread). Filled now, on the thread that creates the worker:
        # the quantile's first call imports scipy (a third of a second), which in the engine
        # thread's first round stalled every node's engine (bench/engine.py).
        k = poisson_quantile(p, 2.0 * self.lam)
        self._cache = [(*quantile_bracket(p, k), k)]

    def horizon(self, clock: int) -> int:
        """Round with the worker at ``clock``: update λ, return h. Act on intents with start < h."""
        delta = clock - self.last_clock
        self.last_clock = clock
        if delta > 0:
            self.lam = (1.0 - self.alpha) * self.lam + self.alpha * delta
        mu = 2.0 * max(self.lam, float(max(delta, 0)))
        for lo, hi, k in self._cache:
            if lo < mu <= hi:
                return clock + k
        k = poisson_quantile(self.p, mu)
        # A few brackets: mu follows the clocks a round advanced (Δ) when they exceed λ, so
        # it moves among a few quantiles from round to round.
        self._cache = [(*quantile_bracket(self.p, k), k), *self._cache[:_BRACKETS - 1]]
        return clock + k


class ImmediateTimer:
    """``Config(action_timing=False)``: act on every signalled intent in the next round."""

    __slots__ = ("last_clock",)

    def __init__(self, clock: int = 0) -> None:
        self.last_clock = clock

    def horizon(self, clock: int) -> float:
        self.last_clock = clock
        return math.inf
