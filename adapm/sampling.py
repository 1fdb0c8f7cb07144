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

Every draw is O(n) numpy work (or a few rounds of it), never a scan over the domain: a node keeps
a *pool* of its held domain keys, updated in one native call whenever keys move in or out
(``native/sampling.c``).

This module imports no other part of adapm but errors and the native loader (``config`` imports
it); the store and worker pass themselves in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import numpy as np

from ._native_loader import load as _load_native
from .errors import AdaPMError, ConfigError, InvalidArgument, InvalidType, StateError

if TYPE_CHECKING:  # pragma: no cover
    from .worker import Worker

_native = _load_native()

SCHEMES = ("local", "naive")

# Redraw rounds before a draw gives up: each round redraws only the keys that failed (not held
# here, or a duplicate without replacement). With a fraction p of the distribution's mass held
# here, n (1 - p)^rounds keys are still missing: 1000 rounds cover p >= 2% for n = 10^6.
_MAX_REDRAW_ROUNDS = 1000
# With weights, redraws are by rejection (from all keys, keeping those held here) this many
# times, then by weight among the held keys directly (Sampler._draw_held_weighted).
_WEIGHTED_REJECTIONS = 8


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
            weights = np.array(self.weights, dtype=np.float64)  # a private copy
            if weights.ndim != 1 or len(weights) != self.size:
                raise ConfigError(f"sampling.weights needs one weight per key of [low, high) "
                                  f"({self.size}), got shape {weights.shape}")
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
        """``n`` keys from the whole domain's distribution (with replacement), int64."""
        if self.weights is None:
            return rng.integers(self.low, self.high, n, dtype=np.int64)
        prob, alias, _ = self._alias
        index = rng.integers(0, self.size, n, dtype=np.int64)
        take_alias = rng.random(n) >= prob[index]
        index[take_alias] = alias[index[take_alias]]
        return index + self.low

    def replace(self, **changes) -> "Sampling":
        return dataclasses.replace(self, **changes)


class SamplePool:
    """A node's held keys of the sampling domain, for the ``local`` scheme: ``keys[:count]``.

    The native store keeps it (``Store.keep_pool``): every insert and remove of a key, by any
    path (the engine, the transport serving a SYNC), changes it in the same native call.
    Workers read ``keys[:count]`` at any time and must check that a drawn key is still held
    (the store's gather does).
    """

    def __init__(self, sampling: Sampling, store) -> None:
        self.low = sampling.low
        # Entries past count keep old, in-domain keys: a racing reader draws a valid key.
        self.keys = np.full(sampling.size, sampling.low, dtype=np.int64)
        self._pos = np.full(sampling.size, -1, dtype=np.int64)
        self._count = np.zeros(1, dtype=np.int64)
        store.keep_pool(self.keys, self._pos, self._count, self.low)

    @property
    def count(self) -> int:
        """How many keys the pool holds now (a snapshot)."""
        return int(self._count[0])


class WorkerSampler:
    """One worker's sample handles and random stream (used by that worker's thread only)."""

    def __init__(self, worker: "Worker", sampling: Sampling, rank: int) -> None:
        self._worker = worker
        self._sampling = sampling
        self._rng = np.random.default_rng([sampling.seed, rank, worker.index])
        self._prepared: dict[int, tuple[int, Optional[np.ndarray]]] = {}
        self._next_handle = 0
        store = worker._store
        if store.uniform_length:
            self._row_length = store.uniform_length
        else:  # pull_sample(out=) needs to know the size of n rows before it draws them
            lens = store.lens[sampling.low:sampling.high]
            self._row_length = int(lens[0]) if np.all(lens == lens[0]) else 0

    def rng_state(self) -> dict:
        """The random stream's state (JSON-serialisable), so that a run resumed from a
        checkpoint draws what the uninterrupted run would have drawn."""
        return self._rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state

    def prepare(self, n, start, end) -> int:
        s = self._sampling
        n = _as_count(n)
        if not s.replacement and n > s.support:
            raise InvalidArgument(f"n: {n} distinct keys asked for, but the sampling domain "
                                  f"has {s.support} keys that can be drawn")
        worker = self._worker
        start, end = worker._check_window(start, end)  # before the draw moves the stream
        keys = None
        if s.scheme == "naive":
            keys = self._draw(n, held=None)
            worker.intent(keys, start, end)
        handle = self._next_handle
        self._next_handle += 1
        self._prepared[handle] = (n, keys)
        return handle

    def pull(self, handle, out: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(handle, bool) or not isinstance(handle, (int, np.integer)):
            raise InvalidType(f"handle: expected an int from prepare_sample, got "
                              f"{type(handle).__name__}")
        prepared = self._prepared.get(int(handle))
        if prepared is None:
            raise InvalidArgument(f"handle: {handle} is not a prepared sample of this worker "
                                  f"(each handle can be pulled once)")
        n, keys = prepared
        if out is not None:
            self._check_out(out, n)
        del self._prepared[int(handle)]
        worker = self._worker
        counters = worker.counters
        if keys is not None:  # naive: the keys were drawn and signalled at prepare time
            local_before = counters["local_pull_keys"] + counters["waited_pull_keys"]
            values = worker.pull(keys, out)
            local = counters["local_pull_keys"] + counters["waited_pull_keys"] - local_before
        else:
            keys, values = self._pull_local(n, out)
            local = n
        counters["sampled_keys"] += n
        counters["sampled_local_keys"] += local
        counters["sampled_remote_keys"] += n - local
        return keys, values

    def keys(self, n, count, out: Optional[np.ndarray]) -> np.ndarray:
        """The keys of ``count`` successive samples of ``n`` (see ``Worker.sample_keys``): the
        draws of ``count`` prepare + pull pairs, in order, without reading values. Only where
        every key of the domain is held here for good (one node): the caller checks."""
        s = self._sampling
        n = _as_count(n)
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise InvalidArgument(f"count: expected an int >= 0 number of samples, got {count!r}")
        count = int(count)
        if not s.replacement and n > s.support:
            raise InvalidArgument(f"n: {n} distinct keys asked for, but the sampling domain "
                                  f"has {s.support} keys that can be drawn")
        total = n * count
        out = samples_out(out, n, count)
        store = self._worker._store
        local = s.scheme == "local"
        if local and store.sample_pool.count == 0:
            raise StateError(f"sample_keys: rank {self._worker._node.rank} holds no key of the "
                             f"sampling domain [{s.low}, {s.high}), so the local scheme has "
                             f"nothing to draw from")
        if local and s.weights is None and s.replacement:
            # _draw's steps for this case, one numpy draw per sample (the same stream: each
            # sample's positions, then one lookup of all of them in the pool). On one node no
            # drawn key is unfit (_unfit), so there is nothing to draw again.
            pool = store.sample_pool
            for i in range(count):
                out[i * n:(i + 1) * n] = self._rng.integers(0, pool.count, n, dtype=np.int64)
            out[:] = pool.keys[out]
        else:
            for i in range(count):
                out[i * n:(i + 1) * n] = self._draw(n, held=store if local else None)
        counters = self._worker.counters
        counters["sampled_keys"] += total
        counters["sampled_local_keys"] += total
        return out

    def _check_out(self, out, n: int) -> None:
        store = self._worker._store
        if not self._row_length:
            raise InvalidArgument("out: the keys of the sampling domain differ in value length, "
                                  "so the size of a sample is not known before it is drawn")
        shape = (n, self._row_length) if store.uniform_length else (n * self._row_length,)
        if not isinstance(out, np.ndarray):
            raise InvalidType(f"out must be a numpy float32 array, got {type(out).__name__}")
        if out.dtype != np.float32:
            raise InvalidType(f"out must have dtype float32, got {out.dtype}")
        if out.shape != shape or not out.flags.c_contiguous or not out.flags.writeable:
            raise InvalidArgument(f"out must be C-contiguous and writable of shape {shape} for "
                                  f"a sample of {n} keys, got shape {out.shape}")

    # --- drawing -----------------------------------------------------------------------------

    def _pull_local(self, n: int, out: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        store = self._worker._store
        if store.sample_pool.count == 0:
            raise StateError(f"pull_sample: rank {self._worker._node.rank} holds no key of the "
                             f"sampling domain [{self._sampling.low}, {self._sampling.high}) "
                             f"now, so the local scheme has nothing to draw from")
        keys = self._draw(n, held=store)
        values = np.empty(store.floats_for(keys), dtype=np.float32) if out is None else out
        for _ in range(_MAX_REDRAW_ROUNDS):
            missing = self._worker._missing_buffer(n)
            # Pinned before they are read (until the next clock, Worker.advance_clock): none of
            # them leaves between the read and this worker's push of them, which stays local.
            self._worker._pin_sample(keys)
            nmiss = store.gather(keys, values, missing)  # one C call, GIL released
            if not nmiss:
                self._worker.counters["local_pull_keys"] += n
                if store.uniform_length and values.ndim == 1:
                    values = values.reshape(n, store.uniform_length)
                return keys, values
            # A key moved away between the draw and the read: draw those positions again.
            bad = np.zeros(n, dtype=bool)
            bad[missing[:nmiss]] = True
            keys = self._redraw(keys, bad, store)
            if not self._row_length:
                values = np.empty(store.floats_for(keys), dtype=np.float32)
        raise self._gave_up(n)

    def _draw(self, n: int, held) -> np.ndarray:
        """n keys from the distribution, restricted to keys held in ``held`` (a Store) if given."""
        s, rng = self._sampling, self._rng
        if held is not None and s.weights is None:
            pool = held.sample_pool
            count = pool.count
            if not s.replacement and count < n:
                raise StateError(f"pull_sample: {n} distinct keys asked for, but rank "
                                 f"{self._worker._node.rank} holds only {count} keys of the "
                                 f"sampling domain now (scheme 'local')")
            if s.replacement:
                index = rng.integers(0, count, n, dtype=np.int64)
            else:
                index = rng.choice(count, n, replace=False).astype(np.int64)
            keys = pool.keys[index]
        elif not s.replacement and s.weights is None:
            keys = rng.choice(s.size, n, replace=False).astype(np.int64) + s.low
        else:
            keys = s.draw(rng, n)
        bad = self._unfit(keys, held)
        return self._redraw(keys, bad, held) if bad.any() else keys

    def _redraw(self, keys: np.ndarray, bad: np.ndarray, held) -> np.ndarray:
        """Draw again where ``bad`` until every key fits (held here; distinct if asked)."""
        for attempt in range(_MAX_REDRAW_ROUNDS):
            if held is not None and self._sampling.weights is None:
                pool = held.sample_pool
                fresh = pool.keys[self._rng.integers(0, max(pool.count, 1), int(bad.sum()))]
            elif held is not None and attempt >= _WEIGHTED_REJECTIONS:
                fresh = self._draw_held_weighted(held, int(bad.sum()))
            else:
                fresh = self._sampling.draw(self._rng, int(bad.sum()))
            keys[bad] = fresh
            bad = self._unfit(keys, held)
            if not bad.any():
                return keys
        raise self._gave_up(len(keys))

    def _draw_held_weighted(self, held, n: int) -> np.ndarray:
        """n keys by weight among the keys held here that stay (the distribution that drawing
        from all keys and rejecting the others converges to), for when rejection keeps failing:
        a node that holds little of a skewed distribution (8 nodes under relocation_only held
        ~1/8 of WV's output vectors, and drawing 596 of them by rejection gave up). One pass
        over the held keys of the domain."""
        s = self._sampling
        pool = held.sample_pool
        candidates = pool.keys[:pool.count]
        if self._worker._staying is not None and len(candidates):
            candidates = candidates[self._worker._staying(candidates)]
        weights = s.weights[candidates - s.low] if len(candidates) else candidates
        total = float(weights.sum()) if len(candidates) else 0.0
        if not total > 0:
            raise self._gave_up(n)
        return self._rng.choice(candidates, n, p=weights / total)

    def _unfit(self, keys: np.ndarray, held) -> np.ndarray:
        """Positions to draw again: keys not held here (if ``held``), or held but about to leave
        (a replica whose intent here ended: the push after the pull would go remote), later
        duplicates (if without replacement)."""
        if held is None or self._worker._engine is None:
            # naive, or one node: every key of the domain is held here, and none ever leaves
            bad = np.zeros(len(keys), dtype=bool)
        elif self._worker._staying is not None:
            bad = ~self._worker._staying(keys)
        else:
            bad = ~held.holds(keys)
        if not self._sampling.replacement and len(keys) > 1:
            order = np.argsort(keys, kind="stable")
            ordered = keys[order]
            repeat = np.zeros(len(keys), dtype=bool)
            repeat[order[1:]] = ordered[1:] == ordered[:-1]
            bad |= repeat
        return bad

    def _gave_up(self, n: int) -> AdaPMError:
        s = self._sampling
        return StateError(f"pull_sample: rank {self._worker._node.rank} could not draw {n} keys "
                          f"in {_MAX_REDRAW_ROUNDS} rounds: too little of the sampling "
                          f"distribution over [{s.low}, {s.high}) is held here now "
                          f"(scheme {s.scheme!r}, replacement={s.replacement})")


def samples_out(out: Optional[np.ndarray], n: int, count: int) -> np.ndarray:
    """Where ``sample_keys`` writes ``count`` samples of ``n`` keys: ``out`` after its checks
    (int64, C-contiguous, writable, ``count * n`` long; InvalidArgument otherwise), or a new
    array."""
    total = n * count
    if out is None:
        return np.empty(total, dtype=np.int64)
    if not (isinstance(out, np.ndarray) and out.dtype == np.int64 and out.shape == (total,)
            and out.flags.c_contiguous and out.flags.writeable):
        raise InvalidArgument(f"out must be a writable C-contiguous int64 array of shape "
                              f"({total},) for {count} samples of {n} keys")
    return out


def _as_count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise InvalidType(f"n: expected an int number of keys, got {type(n).__name__}")
    if n < 1:
        raise InvalidArgument(f"n: must be >= 1, got {n}")
    return int(n)
