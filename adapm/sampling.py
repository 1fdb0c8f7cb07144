"""Negative sampling (DESIGN section 4): draws from a key range, local where possible.

The sampling domain is set once per job, in ``Config(sampling=Sampling(...))``: a key range
``[low, high)``, a distribution over it (uniform, or a weight per key drawn through an alias
table, e.g. unigram^0.75 for word vectors), with or without replacement, and a scheme:

- ``naive``: ``prepare_sample`` draws the keys and signals them as intent for ``[start, end)``,
  so that by the time ``pull_sample`` pulls them they are local (if the intent came early
  enough; otherwise the pull is remote, and counted so);
- ``local`` (default, as in AdaPM): ``pull_sample`` draws among the keys of the domain that are
  held on this node at that moment (main copy or replica), so it never goes remote. The draws
  follow the domain's distribution restricted to those keys.

Every draw is O(n) numpy or native work (or a few rounds of it), never a scan over the domain:
a node keeps a *pool* of its held domain keys, updated in one native call whenever keys move in
or out (``native/sampling.c``; ``_store.SamplePool``). A worker's draws are
``_sampler.WorkerSampler``'s.

This module is config's floor: it imports no other part of adapm but errors and the native
loader (``config`` imports it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ._native_loader import load as _load_native
from .errors import ConfigError

_native = _load_native()

SCHEMES = ("local", "naive")


def _help(text: str, **kw):
    return field(metadata={"help": text}, **kw)


@dataclass(frozen=True, eq=False)
class Sampling:
    """The sampling domain of a job (the same on every node). Frozen and validated."""

    low: int = _help("First key of the domain.")
    high: int = _help("One past the last key of the domain (high > low).")
    weights: Optional[np.ndarray] = _help(
        "None: uniform over [low, high). Else one finite weight >= 0 per key of the domain (a "
        "positive sum); keys are drawn with probability weight / sum.", default=None)
    replacement: bool = _help(
        "With replacement (default), or without: the keys of one sample are distinct.",
        default=True)
    scheme: str = _help("'local' (draw among keys held here; never remote) or 'naive' (draw "
                        "at prepare time and signal them as intent).", default="local")
    seed: int = _help("Seed of the draws; each worker of each node draws its own stream.",
                      default=0)

    def __post_init__(self) -> None:
        for name in ("low", "high", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ConfigError(f"sampling.{name} must be an int, got {type(value).__name__}")
            object.__setattr__(self, name, int(value))
        if self.low < 0 or self.high <= self.low:
            raise ConfigError(f"sampling: need 0 <= low < high, got low={self.low} "
                              f"high={self.high}")
        if self.scheme not in SCHEMES:
            raise ConfigError(f"sampling.scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if not isinstance(self.replacement, bool):
            raise ConfigError("sampling.replacement must be a bool")
        if self.weights is not None:
            try:
                weights = np.array(self.weights, dtype=np.float64)  # a private copy
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"sampling.weights must be numbers, one per key of "
                                  f"[low, high) ({exc})") from None
            if weights.ndim != 1 or len(weights) != self.size:
                raise ConfigError(f"sampling.weights needs one weight per key of [low, high) "
                                  f"({self.size}), got shape {weights.shape}")
            if self.size >= 2**32:  # the native draw's bound (_native.alias_draw)
                raise ConfigError(f"sampling.weights: a weighted domain has fewer than 2**32 "
                                  f"keys, got {self.size}")
            prob, alias = np.empty_like(weights), np.empty(len(weights), dtype=np.int64)
            try:
                _native.alias_build(weights, prob, alias)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            positive = int(np.count_nonzero(weights))
            weights.setflags(write=False)
            object.__setattr__(self, "weights", weights)
            object.__setattr__(self, "_alias", (prob, alias, positive))

    @property
    def size(self) -> int:
        """Number of keys in the domain."""
        return self.high - self.low

    @property
    def support(self) -> int:
        """Number of keys that can be drawn (non-zero weight)."""
        return self.size if self.weights is None else self._alias[2]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` keys from the whole domain's distribution (with replacement), int64.

        By weight: ``i = rng.integers(0, size, n)``, ``u = rng.random(n)``, ``alias[i]`` where
        ``u >= prob[i]``, else ``i`` (Vose's alias method), in one native call that reads the
        same numbers off ``rng``'s bit generator as those numpy calls (``_native.alias_draw``:
        2-3x faster than the numpy steps, ~9 against ~20 us for 700 keys, which a word-vector
        batch draws holding the GIL)."""
        if self.weights is None:
            return rng.integers(self.low, self.high, n, dtype=np.int64)
        prob, alias, _ = self._alias
        out = np.empty(n, dtype=np.int64)
        bits = rng.bit_generator
        with bits.lock:  # as numpy's own draws hold it
            _native.alias_draw(bits, prob, alias, self.low, out)
        return out

    def replace(self, **changes) -> "Sampling":
        return dataclasses.replace(self, **changes)
