"""One worker's negative sampling: the draws behind ``Worker.prepare_sample``, ``pull_sample``
and ``sample_keys``, from the job's :class:`~adapm.sampling.Sampling` (which says what the
``local`` and ``naive`` schemes mean).

A :class:`WorkerSampler` is handed what it uses instead of the worker: the store's reads
(:class:`SampleStore`), the node's pool of held domain keys (``_store.SamplePool``, which the
native store keeps), the worker's counters and its calls (window check, intent, pull, scratch,
pin), and which keys stay here (``NodeState.staying``). So it reads no worker or engine
internals, and this module imports no other part of adapm but errors at run time.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable, Optional, Protocol

import numpy as np

from .errors import AdaPMError, InvalidArgument, InvalidType, StateError

if TYPE_CHECKING:  # pragma: no cover
    from ._store import SamplePool
    from .sampling import Sampling

# Sample handles, unique in the process (next() of a count is atomic under the GIL): a handle
# of another worker is never taken for one of this worker's.
_HANDLES = itertools.count()

# Redraw rounds before a draw gives up: each round redraws only the keys that failed (not held
# here, or a duplicate without replacement). With a fraction p of the distribution's mass held
# here, n (1 - p)^rounds keys are still missing: 1000 rounds cover p >= 2% for n = 10^6.
_MAX_REDRAW_ROUNDS = 1000
# With weights, redraws are by rejection (from all keys, keeping those held here) this many
# times, then by weight among the keys that fit directly (WorkerSampler._draw_weighted_among).
_WEIGHTED_REJECTIONS = 8


class SampleStore(Protocol):
    """What the sampler reads of the node's store (``_store.Store``)."""

    uniform_length: int  # the one value length of every key, or 0 under per-key lengths
    lens: Optional[np.ndarray]  # per-key value lengths (int64); None with a uniform length

    def floats_for(self, keys: np.ndarray) -> int: ...

    def gather(self, keys: np.ndarray, out: np.ndarray, missing: np.ndarray) -> int: ...


class WorkerSampler:
    """One worker's sample handles and random stream (used by that worker's thread only).

    ``rank`` and ``index`` (the node's and the worker's) seed the stream with ``sampling.seed``
    and name the node in errors. ``counters`` is the worker's ``stats()`` dict, which the
    sampler adds its counts to. ``check_window(start, end)`` returns the checked window of
    ``prepare_sample``; ``intent(keys, start, end)`` and ``pull(keys, out)`` are the worker's
    own (the ``naive`` scheme's signal and fetch); ``missing_buffer(n)`` is int64 scratch of at
    least ``n``; ``pin(keys, add=False)`` pins the keys of a local sample before they are read
    (until the worker's next clock), in place of or (``add``) beside the keys pinned already.
    ``staying(keys)`` says per key whether it is held here and stays (the ``local`` scheme
    draws only those); None on a single node, which holds every key for good.
    ``draw_held(bit_generator, pool, out, rounds) -> int`` (``NodeState.held_draw``), where
    given, draws a uniform sample with replacement among the pool's keys that stay and pins
    each as it keeps it, in one call; ``pin(keys, add=True, held=True)`` then only notes them.
    """

    def __init__(self, sampling: "Sampling", store: SampleStore, pool: "SamplePool", *,
                 rank: int, index: int, counters: dict,
                 check_window: Callable[[object, object], tuple[int, int]],
                 intent: Callable[[np.ndarray, int, int], None],
                 pull: Callable[[np.ndarray, Optional[np.ndarray]], np.ndarray],
                 missing_buffer: Callable[[int], np.ndarray],
                 pin: Callable[..., None],
                 staying: Optional[Callable[[np.ndarray], np.ndarray]],
                 draw_held: Optional[Callable[..., int]] = None) -> None:
        self._sampling = sampling
        self._store = store
        self._pool = pool
        self._rank = rank
        self._counters = counters
        self._check_window = check_window
        self._intent = intent
        self._pull = pull
        self._missing_buffer = missing_buffer
        self._pin = pin
        self._staying = staying
        self._draw_held = draw_held
        self._rng = np.random.default_rng([sampling.seed, rank, index])
        self._prepared: dict[int, tuple[int, Optional[np.ndarray]]] = {}
        if store.uniform_length:
            self._row_length = store.uniform_length
        else:  # pull_sample(out=) needs to know the size of n rows before it draws them
            lens = store.lens[sampling.low:sampling.high]
            self._row_length = int(lens[0]) if np.all(lens == lens[0]) else 0

    @property
    def scheme(self) -> str:
        """The job's sampling scheme: ``local`` or ``naive``."""
        return self._sampling.scheme

    def rng_state(self) -> dict:
        """The random stream's state (JSON-serialisable), so that a run resumed from a
        checkpoint draws what the uninterrupted run would have drawn."""
        return self._rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state

    def prepare(self, n, start, end) -> int:
        """``Worker.prepare_sample``: a handle for :meth:`pull`."""
        s = self._sampling
        n = _as_count(n)
        if not s.replacement and n > s.support:
            raise InvalidArgument(f"n: {n} distinct keys asked for, but the sampling domain "
                                  f"has {s.support} keys that can be drawn")
        start, end = self._check_window(start, end)  # before the draw moves the stream
        keys = None
        if s.scheme == "naive":
            keys = self._draw(n, local=False)
            self._intent(keys, start, end)
        handle = next(_HANDLES)
        self._prepared[handle] = (n, keys)
        return handle

    def pull(self, handle, out: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``Worker.pull_sample``: the prepared sample's ``(keys, values)``."""
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
        counters = self._counters
        if keys is not None:  # naive: the keys were drawn and signalled at prepare time
            local_before = counters["local_pull_keys"] + counters["waited_pull_keys"]
            values = self._pull(keys, out)
            local = counters["local_pull_keys"] + counters["waited_pull_keys"] - local_before
        else:
            keys, values = self._pull_local(n, out)
            local = n
        # Used up once pulled: a pull that raised (no key held here to draw) may be tried again.
        del self._prepared[int(handle)]
        counters["sampled_keys"] += n
        counters["sampled_local_keys"] += local
        counters["sampled_remote_keys"] += n - local
        return keys, values

    def keys(self, n, count, out: Optional[np.ndarray]) -> np.ndarray:
        """The keys of ``count`` successive samples of ``n`` (see ``Worker.sample_keys``): the
        draws of ``count`` prepare + pull pairs, in order, without reading values; under the
        ``local`` scheme on a node of a multi-node job (drawn at once there when uniform)
        pinned (beside this clock's pins) and drawn again where a key left before its pin, as
        a pull draws again where its read misses one."""
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
        local = s.scheme == "local"
        pool = self._pool
        if local and pool.count == 0:
            raise StateError(f"sample_keys: rank {self._rank} holds no key of the "
                             f"sampling domain [{s.low}, {s.high}), so the local scheme has "
                             f"nothing to draw from")
        several = local and self._staying is not None  # a node of a multi-node job
        if local and s.weights is None and s.replacement and not several:
            # _draw's steps for this case, one numpy draw per sample (the same stream: each
            # sample's positions, then one lookup of all of them in the pool). On one node no
            # drawn key is unfit (_unfit), so there is nothing to draw again.
            for i in range(count):
                out[i * n:(i + 1) * n] = self._rng.integers(0, pool.count, n, dtype=np.int64)
            out[:] = pool.keys[out]
        elif several and s.weights is None and s.replacement and self._held_drawn(out):
            pass  # drawn among the keys that stay and pinned, in one native call
        elif several and s.weights is None and s.replacement:
            # A node of a multi-node job: its draws depend on which keys stay here anyway, so
            # no sequence is kept: one draw of all the samples, one look at which stay, where
            # a draw per sample took a numpy draw and a staying() call each (KGE on 2 nodes:
            # 2 samples a run, ~5% of a worker's time in these calls).
            # (At least 1: keys may all have left since the check above; _redraw then draws
            # again until some are held, as _draw would.)
            held = max(pool.count, 1)
            out[:] = pool.keys[self._rng.integers(0, held, total, dtype=np.int64)]
            bad = self._unfit(out, local=True)
            if bad.any():
                self._redraw(out, bad, local=True)
            self._hold(out)
        else:
            for i in range(count):
                out[i * n:(i + 1) * n] = self._draw(n, local=local)
            if several:
                self._hold(out)
        counters = self._counters
        counters["sampled_keys"] += total
        counters["sampled_local_keys"] += total
        return out

    def _held_drawn(self, out: np.ndarray) -> bool:
        """``out`` drawn among the keys that stay here and pinned beside this clock's pins, by
        ``draw_held`` (one native pass that tests and pins each key under the pins' lock, so
        nothing the engine decides falls between the two, where :meth:`_hold` tests again
        after pinning). False, nothing drawn, where there is no such call or the pins are busy
        (the engine thread has them): the caller takes the steps one by one."""
        if self._draw_held is None:
            return False
        bit_generator = self._rng.bit_generator
        with bit_generator.lock:
            got = self._draw_held(bit_generator, self._pool, out, 1 + _MAX_REDRAW_ROUNDS)
        if got == -2:
            raise self._gave_up(len(out))
        if got == 0:
            self._pin(out, add=True, held=True)
        return got == 0

    def _hold(self, keys: np.ndarray) -> None:
        """Pins ``keys`` (drawn among the keys that stay here) beside this clock's pins, then
        draws again, and pins, any that stopped staying between the draw and the pin (a pinned
        key that stays does not leave before the worker's next clock)."""
        fresh = keys
        for _ in range(_MAX_REDRAW_ROUNDS):
            self._pin(fresh, add=True)
            bad = ~self._staying(keys)
            if not bad.any():
                return
            before = keys.copy()
            self._redraw(keys, bad, local=True)  # in place (and wherever else a key went)
            fresh = keys[keys != before]
        raise self._gave_up(len(keys))

    def _check_out(self, out, n: int) -> None:
        if not self._row_length:
            raise InvalidArgument("out: the keys of the sampling domain differ in value length, "
                                  "so the size of a sample is not known before it is drawn")
        shape = ((n, self._row_length) if self._store.uniform_length
                 else (n * self._row_length,))
        if not isinstance(out, np.ndarray):
            raise InvalidType(f"out must be a numpy float32 array, got {type(out).__name__}")
        if out.dtype != np.float32:
            raise InvalidType(f"out must have dtype float32, got {out.dtype}")
        if out.shape != shape or not out.flags.c_contiguous or not out.flags.writeable:
            raise InvalidArgument(f"out must be C-contiguous and writable of shape {shape} for "
                                  f"a sample of {n} keys, got shape {out.shape}")

    # --- drawing -----------------------------------------------------------------------------

    def _pull_local(self, n: int, out: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        store = self._store
        if self._pool.count == 0:
            raise StateError(f"pull_sample: rank {self._rank} holds no key of the "
                             f"sampling domain [{self._sampling.low}, {self._sampling.high}) "
                             f"now, so the local scheme has nothing to draw from")
        keys = self._draw(n, local=True)
        values = np.empty(store.floats_for(keys), dtype=np.float32) if out is None else out
        for _ in range(_MAX_REDRAW_ROUNDS):
            missing = self._missing_buffer(n)
            # Pinned before they are read (until the next clock, Worker.advance_clock): none of
            # them leaves between the read and this worker's push of them, which stays local.
            self._pin(keys)
            nmiss = store.gather(keys, values, missing)  # one C call, GIL released
            if not nmiss:
                self._counters["local_pull_keys"] += n
                if store.uniform_length and values.ndim == 1:
                    values = values.reshape(n, store.uniform_length)
                return keys, values
            # A key moved away between the draw and the read: draw those positions again.
            bad = np.zeros(n, dtype=bool)
            bad[missing[:nmiss]] = True
            keys = self._redraw(keys, bad, local=True)
            if not self._row_length:
                values = np.empty(store.floats_for(keys), dtype=np.float32)
        raise self._gave_up(n)

    def _draw(self, n: int, local: bool) -> np.ndarray:
        """n keys from the distribution, restricted to keys held here (the pool) if ``local``."""
        s, rng = self._sampling, self._rng
        if local and s.weights is None:
            pool = self._pool
            count = pool.count
            if not s.replacement and count < n:
                raise StateError(f"pull_sample: {n} distinct keys asked for, but rank "
                                 f"{self._rank} holds only {count} keys of the "
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
        bad = self._unfit(keys, local)
        return self._redraw(keys, bad, local) if bad.any() else keys

    def _redraw(self, keys: np.ndarray, bad: np.ndarray, local: bool) -> np.ndarray:
        """Draw again where ``bad`` until every key fits (held here; distinct if asked).

        With replacement only the keys drawn again are looked at again (a look at which keys
        stay is one pass over the keys asked: KGE on 2 nodes draws 2,400 a run and nearly
        always a few again). What keeps a key here is its pin, and the callers look after
        pinning: ``_hold`` at which keys stay, ``_pull_local`` by reading them."""
        replacement = self._sampling.replacement
        for attempt in range(_MAX_REDRAW_ROUNDS):
            where = np.flatnonzero(bad)
            if local and self._sampling.weights is None:
                pool = self._pool
                fresh = pool.keys[self._rng.integers(0, max(pool.count, 1), len(where))]
            elif attempt >= _WEIGHTED_REJECTIONS and (local or not replacement):
                # by weight among the keys that fit, without those already drawn: a heavy key
                # drawn again and again made rejection give up (replacement=False, one node)
                fresh = self._draw_weighted_among(len(where), local,
                                                  None if replacement else keys[~bad])
            else:
                fresh = self._sampling.draw(self._rng, len(where))
            keys[where] = fresh
            if replacement:
                unfit = self._unfit(fresh, local)
                if not unfit.any():
                    return keys
                bad = np.zeros(len(keys), dtype=bool)
                bad[where[unfit]] = True
            else:
                bad = self._unfit(keys, local)
                if not bad.any():
                    return keys
        raise self._gave_up(len(keys))

    def _draw_weighted_among(self, n: int, local: bool,
                             drawn: Optional[np.ndarray]) -> np.ndarray:
        """n keys by weight among the keys that fit (the distribution that drawing from all
        keys and rejecting the others converges to), for when rejection keeps failing: a node
        that holds little of a skewed distribution (8 nodes under relocation_only held ~1/8 of
        WV's output vectors, and drawing 596 of them by rejection gave up), or distinct keys of
        a distribution with a few heavy ones. ``local``: among the keys held here that stay,
        else among the whole domain; ``drawn`` (without replacement): keys already in the
        sample, left out, and the n drawn distinct. One pass over the candidates."""
        s = self._sampling
        if local:
            pool = self._pool
            candidates = pool.keys[:pool.count]
            if self._staying is not None and len(candidates):
                candidates = candidates[self._staying(candidates)]
        else:
            candidates = np.arange(s.low, s.high, dtype=np.int64)
        if drawn is not None and len(candidates):
            candidates = candidates[~np.isin(candidates, drawn)]
        weights = s.weights[candidates - s.low] if len(candidates) else candidates
        if drawn is not None and np.count_nonzero(weights) < n:
            raise self._gave_up(n)
        total = float(weights.sum()) if len(candidates) else 0.0
        if not total > 0:
            raise self._gave_up(n)
        return self._rng.choice(candidates, n, replace=drawn is None, p=weights / total)

    def _unfit(self, keys: np.ndarray, local: bool) -> np.ndarray:
        """Positions to draw again: keys not held here or about to leave (if ``local``: a
        replica whose intent here ended, whose push after the pull would go remote), later
        duplicates (if without replacement)."""
        if not local or self._staying is None:
            # naive, or one node: every key of the domain is held here, and none ever leaves
            bad = np.zeros(len(keys), dtype=bool)
        else:
            bad = ~self._staying(keys)
        if not self._sampling.replacement and len(keys) > 1:
            order = np.argsort(keys, kind="stable")
            ordered = keys[order]
            repeat = np.zeros(len(keys), dtype=bool)
            repeat[order[1:]] = ordered[1:] == ordered[:-1]
            bad |= repeat
        return bad

    def _gave_up(self, n: int) -> AdaPMError:
        s = self._sampling
        return StateError(f"sample: rank {self._rank} could not draw {n} keys "
                          f"in {_MAX_REDRAW_ROUNDS} rounds: too little of the sampling "
                          f"distribution over [{s.low}, {s.high}) is held here now "
                          f"(scheme {s.scheme!r}, replacement={s.replacement})")


def samples_out(out: Optional[np.ndarray], n: int, count: int) -> np.ndarray:
    """Where ``sample_keys`` writes ``count`` samples of ``n`` keys: ``out`` after its checks
    (int64, C-contiguous, writable, ``count * n`` long; InvalidArgument otherwise), or a new
    array. Shared with the baseline's worker (``apps/baseline.py``)."""
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
