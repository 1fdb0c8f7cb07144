"""Worker handles: the API that training code calls for every batch.

A handle belongs to one thread (it keeps per-thread buffers and a logical clock); a node may have
any number of them. Locally held keys are read and written in the node's store directly (one
native call per batch, GIL released). The rest are handed to the node's engine as one request
(:meth:`adapm._engine.loop.EngineLoop.submit`), which routes them to their owners.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import TYPE_CHECKING, Optional

import numpy as np

from . import args
from ._engine import routing
from ._engine.events import (
    NATIVE_DECLINED, NATIVE_DONE, NATIVE_FAILED, NATIVE_QUEUED, Call, Op, Request,
)
from ._sampler import WorkerSampler
from .errors import AdaPMError, AdaPMTimeout, InvalidArgument, PeerError, StateError

if TYPE_CHECKING:
    from .node import Node

# Pushes may be issued without waiting; answered ones are pruned once this many are pending.
_PRUNE_OUTSTANDING = 1024

# How often a worker waiting in a native pull checks whether the engine thread failed.
_FAILURE_CHECK_S = 0.5

# op -> (operation name for errors, local counter, remote counter)
_UPDATE_NAMES = {
    Op.PUSH: ("push", "local_push_keys", "remote_push_keys"),
    Op.SET: ("set", "local_set_keys", "remote_set_keys"),
}


def _one_thread_at_a_time(method):
    """A call on a handle another thread is inside of raises StateError instead of mixing the
    two calls' scratch buffers and requests. Passing a handle from one thread to another
    between calls is fine; the same thread may re-enter (RLock)."""
    name = method.__name__

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if not self._in_use.acquire(blocking=False):
            raise StateError(f"{name}: worker {self.index} of rank {self._node.rank} is in a "
                             f"call from another thread right now; give each thread its own "
                             f"handle (node.worker())")
        try:
            return method(self, *args, **kwargs)
        finally:
            self._in_use.release()

    return guarded


_NO_KEYS = np.empty(0, dtype=np.int64)

# Gives the calling thread's core to another runnable thread, the GIL released (os.sched_yield
# does both; time.sleep(0) releases the GIL where there is no sched_yield).
_yield_core = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


class Worker:
    """One worker thread's handle: pull, push, set, intent, clock. Use it from one thread at a
    time: a call while another thread is inside one raises StateError."""

    COUNTERS = ("local_pull_keys", "remote_pull_keys", "waited_pull_keys", "local_push_keys",
                "remote_push_keys", "local_set_keys", "remote_set_keys", "intents_signalled",
                "intents_acted", "sampled_keys", "sampled_local_keys", "sampled_remote_keys")

    def __init__(self, node: "Node", index: int) -> None:
        self._node = node
        self._store = node.store
        self.index = index
        self.clock = 0
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        # Seconds this worker was blocked inside pull, push or set, waiting on other nodes or
        # the engine (stats()["access_wait_s"]): the time the remote and waited counts cost.
        self.access_wait_s = 0.0
        self._missing = np.empty(1024, dtype=np.int64)
        self._in_use = threading.RLock()  # see _one_thread_at_a_time
        self._outstanding: list[Call] = []
        # Pushes the transport sends without the engine loop (ZmqIO.push): (call, keys).
        self._native_pushes: list = []
        self._engine = node.engine  # None on a single node: everything is local
        # Intents go to the engine; under static partitioning (or on one node) nobody acts.
        self._intents = self._engine.register_worker(self) if self._engine is not None else None
        sampling = node.config.sampling
        # The keys of this worker's last local sample stay pinned until its next clock (see
        # NodeState.sample_pins): its push of them is then local.
        self._repin = self._engine.state.sample_pins() \
            if self._engine is not None and sampling is not None else None
        self._pinned: Optional[np.ndarray] = None
        self._sampler: Optional[WorkerSampler] = None
        if sampling is not None:
            self._sampler = WorkerSampler(
                sampling, self._store, self._store.sample_pool, rank=node.rank, index=index,
                counters=self.counters, check_window=self._check_window, intent=self.intent,
                pull=self.pull, missing_buffer=self._missing_buffer, pin=self._pin_sample,
                # What the local sampler may draw: keys that stay here (None: every key, for
                # good, on a single node).
                staying=self._engine.state.staying if self._engine is not None else None,
                draw_held=self._engine.state.held_draw() if self._engine is not None else None)

    @property
    def node(self) -> "Node":
        """The node this handle belongs to."""
        return self._node

    # --- data access -------------------------------------------------------------------------

    @_one_thread_at_a_time
    def pull(self, keys, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Current values of ``keys`` (duplicates allowed, request order). Blocking.

        Returns float32 of shape (len(keys), L) for a uniform length L, else the values packed
        back to back. With ``out`` (same shape, float32, C-contiguous) it fills ``out`` and returns
        it without allocating. Remote keys cost one round trip per owner node, in parallel.

        Where this worker's intent for the current clock is still waiting for the engine (the
        worker got there before a sync round did: a round held up by a slow or stalled peer),
        the pull first waits for the round that acts on it, as :meth:`wait_sync` does, and
        reads the keys that came here then (``waited_pull_keys``): the keys would otherwise be
        pulled from the same owners, who are the ones the round waits for.
        """
        self._node._check_open("pull")
        store = self._store
        nmiss = None
        if type(keys) is np.ndarray and keys.ndim == 1 and store.uniform_length:
            # Fast path: one C call checks the usual layout and gathers (Store.gather_fast);
            # anything else, every bad input included, returns None and takes the path below.
            if out is None:
                out = np.empty((len(keys), store.uniform_length), dtype=np.float32)
            if type(out) is np.ndarray:
                nmiss = store.gather_fast(keys, out, self._missing)
        if nmiss is None:
            keys, out, nmiss = self._pull_checked(keys, out)
        self.counters["local_pull_keys"] += len(keys) - nmiss
        if nmiss:
            started = time.perf_counter()
            try:
                positions = self._missing[:nmiss].copy()
                if self._intents is not None and self._intents.late(self.clock):
                    positions = self._pull_after_round(keys, out, positions)
                if len(positions):
                    self._pull_missing(keys, out, positions)
            finally:
                self.access_wait_s += time.perf_counter() - started
        return out

    def _pull_after_round(self, keys: np.ndarray, out: np.ndarray,
                          positions: np.ndarray) -> np.ndarray:
        """Wait for the round that acts on this worker's late intent, then read the keys at
        ``positions`` that are here now; returns the positions still missing."""
        self._await_round()
        store = self._store
        wanted = keys[positions]
        if store.uniform_length:
            rows = np.empty((len(wanted), store.uniform_length), dtype=np.float32)
        else:
            rows = np.empty(int(store.lens[wanted].sum()), dtype=np.float32)
        missing = self._missing_buffer(len(wanted))
        nmiss = store.gather(wanted, rows, missing)  # one C call, GIL released
        # Rows still missing are written too (unset): the remote pull overwrites them.
        if store.uniform_length:
            out.reshape(len(keys), -1)[positions] = rows
        else:
            lengths = store.lens[wanted]
            out.reshape(-1)[routing.segment_index(self._row_offsets(keys)[positions],
                                                  lengths)] = rows
        self.counters["waited_pull_keys"] += len(wanted) - nmiss
        return positions[missing[:nmiss]]

    def _await_round(self, what: Optional[str] = None, timeout_s: Optional[float] = None
                     ) -> None:
        """Block until a sync round that starts from now on has acted on every intent of this
        worker active at its clock and their owners have answered (the keys are here then).
        Raises AdaPMTimeout, naming ``what``, after ``timeout_s`` (default
        ``Config.request_timeout_s``). Without ``what``: for an access that found an intent
        late (only the channels where it is late run a round for it)."""
        op = Op.WAIT_SYNC
        if what is None:
            op = Op.AWAIT_INTENT
            what = f"the sync round acting on worker {self.index}'s intent for clock {self.clock}"
        self._native_routed()
        call = self._engine.submit(Request(op, worker=self.index, clock=self.clock), what)
        self._engine.wait(call, timeout_s)

    def _round_came(self) -> bool:
        """For a push or set: :meth:`_await_round`, True once it returned. False if it
        failed: the update then goes to the keys' owners as it would have without the late
        intent, its part held here already applied (it must not be lost, nor be applied twice
        by a caller who repeats a push that raised); a failure of the node shows as for any
        remote update (from the push, or at :meth:`wait`)."""
        started = time.perf_counter()
        try:
            self._await_round()
        except AdaPMError:
            return False
        finally:
            self.access_wait_s += time.perf_counter() - started
        return True

    def _pull_checked(self, keys, out):
        """Pull with full validation (bad input raises here, before anything is read)."""
        store = self._store
        # With a uniform length nothing below needs the key values before the native call,
        # which range-checks the batch itself: skip a pass here (see args.as_keys).
        lazy = bool(store.uniform_length)
        keys = args.as_keys(keys, store, check_range=not lazy)
        try:
            if out is None:
                out = np.empty(args.value_shape(store, keys), dtype=np.float32)
            else:
                out = args.check_out(out, store, keys)
            missing = self._missing_buffer(len(keys))
            nmiss = store.gather(keys, out, missing)  # one C call, GIL released
        except Exception:
            if lazy:
                args.check_range_of(keys, store)  # a bad key is reported first, as InvalidArgument
            raise
        return keys, out, nmiss

    @_one_thread_at_a_time
    def push(self, keys, updates) -> None:
        """Add ``updates`` to the values of ``keys`` (duplicates add up). Non-blocking for remote keys.

        The local part is applied before return; the remote part is sent and acknowledged later
        (see :meth:`wait`). ``updates`` is not kept: the caller may reuse it at once. Like
        :meth:`pull`, a push (or :meth:`set`) that reaches keys of this worker's intent before
        a sync round acted on it blocks for that round and adds to the keys that came.
        """
        self._update(keys, updates, Op.PUSH, "updates")

    @_one_thread_at_a_time
    def set(self, keys, values) -> None:
        """Overwrite the values of ``keys``. Local part applied before return, remote part queued.

        A key held here as a replica counts as remote: the set goes to the main copy, and the
        replica shows it after the next sync round (``wait_sync``). Pushes this node made to
        that replica before the set and not yet synced are merged after it: set replicated
        keys between rounds of pushes (``wait_sync`` first) when that order matters.
        """
        self._update(keys, values, Op.SET, "values")

    # --- native training loops ----------------------------------------------------------------

    @property
    def acts_on_intent(self) -> bool:
        """Whether :meth:`intent` changes anything: False on a single node (every key is
        local) and under static partitioning (keys never move), so a caller may skip working
        out its intents."""
        return self._intents is not None

    def native_rows(self):
        """The node's rows for a native training loop of ``adapm._kernels`` (``mf_train_rows``,
        ``kge_train_rows``): a capsule through which the loop gathers and adds to rows by key
        with the GIL released, many batches per call, as :meth:`pull` and :meth:`push` do for
        keys held here (a loop that draws negatives takes their keys from
        :meth:`sample_keys`); or None where such a loop would rarely find its keys here (a
        node of a multi-node job under static partitioning) or with per-key value lengths.

        The capsule keeps the store's memory alive while it lives. The loop stops at a batch
        with a key held elsewhere instead of reading it (the caller takes that batch through
        :meth:`pull` and :meth:`push`, which route its keys), and hands back the updates of keys
        that left between a batch's read and its write (the caller pushes them). The caller
        signals intent (where :attr:`acts_on_intent`), advances the clock per batch, and counts
        what the loop accessed with :meth:`count_accesses`. Raises StateError after shutdown.
        """
        self._node._check_open("native_rows")
        if (self._engine is not None and self._intents is None) or not self._store.uniform_length:
            return None
        return self._store.native.rows()

    def count_accesses(self, pulled: int, pushed: int) -> None:
        """Counts keys read and added to through :meth:`native_rows` in ``stats()``, as local
        pulls and pushes."""
        self.counters["local_pull_keys"] += pulled
        self.counters["local_push_keys"] += pushed

    @_one_thread_at_a_time
    def sample_keys(self, n: int, count: int = 1, out: Optional[np.ndarray] = None
                    ) -> np.ndarray:
        """The keys of ``count`` successive samples of ``n`` keys each, without their values:
        for a native training loop that reads and adds to the rows itself (:meth:`native_rows`).

        The keys are those that ``count`` pairs of :meth:`prepare_sample` (n) and
        :meth:`pull_sample`, one pair after the other, would give: the same random stream, in
        the same order, so a run that draws through either gives the same numbers. Returns
        int64 of ``count * n`` keys, sample after sample (in ``out``, when given: int64,
        C-contiguous, writable, of that length). Nothing is read. On a single node every key
        of the domain is held here for good: nothing else is done. On a node of a multi-node
        job, under the ``naive`` scheme the draws do not depend on where keys are, and the
        caller signals their intent before its loop reads them (as prepare_sample does); under
        the ``local`` scheme they are drawn among the keys held here that stay, as pull_sample
        draws them (uniform without weights: all samples in one draw, as which keys stay
        decides the numbers there anyway), and pinned until this worker's next clock beside
        any pinned already (as pull_sample pins its sample), so that the loop that reads them
        right after finds them and its adds to them stay local. Raises StateError without a
        sampling domain. Non-blocking; O(count * n), holding the GIL. Counted in
        ``stats()`` as ``sampled_keys`` and ``sampled_local_keys`` (the loop reads every key
        here; one it finds elsewhere it pulls through the worker, which counts that pull as
        remote); the loop counts its reads and adds of the keys with :meth:`count_accesses`,
        as pull_sample's read is counted.
        """
        self._node._check_open("sample_keys")
        if self._sampler is None:
            raise StateError("sample_keys: this job has no sampling domain; set "
                             "Config(sampling=adapm.Sampling(low, high, ...))")
        return self._sampler.keys(n, count, out)

    # --- intent and clocks -------------------------------------------------------------------

    @_one_thread_at_a_time
    def intent(self, keys, start: int, end: Optional[int] = None) -> None:
        """Signal that this worker will access ``keys`` in clocks [start, end) (end=start+1).

        Non-blocking and O(1) apart from one copy of ``keys`` (the caller may reuse its array):
        the sync loop does the bookkeeping. Intents may be signalled far ahead. Under static
        partitioning, or on a single node, intent changes nothing.
        """
        self._node._check_open("intent")
        keys = args.as_keys(keys, self._store)
        start, end = self._check_window(start, end)
        self.counters["intents_signalled"] += len(keys)
        if self._intents is not None and len(keys):
            self._intents.signal(keys, start, end)  # copies them
            self._engine.wake()

    def _check_window(self, start, end) -> tuple[int, int]:
        start = args.as_clock(start, "start")
        end = start + 1 if end is None else args.as_clock(end, "end")
        if end <= start:
            raise InvalidArgument(f"end must be > start, got start={start} end={end}")
        return start, end

    # --- sampling ----------------------------------------------------------------------------

    @_one_thread_at_a_time
    def prepare_sample(self, n: int, start: int, end: Optional[int] = None) -> int:
        """Prepare a sample of ``n`` keys to be pulled in clocks [start, end) (end=start+1).

        Returns a handle for :meth:`pull_sample`. The domain, distribution and scheme are set
        once per job in ``Config(sampling=adapm.Sampling(...))``. Scheme ``naive`` draws the
        keys now and signals them as intent for [start, end), ``local`` draws at pull time
        among the keys held on this node. Non-blocking; O(n). Raises InvalidArgument for a bad
        ``n``, ``start`` or ``end`` (nothing is kept), StateError without a sampling domain.
        """
        self._node._check_open("prepare_sample")
        if self._sampler is None:
            raise StateError("prepare_sample: this job has no sampling domain; set "
                             "Config(sampling=adapm.Sampling(low, high, ...))")
        return self._sampler.prepare(n, start, end)

    @_one_thread_at_a_time
    def pull_sample(self, handle: int, out: Optional[np.ndarray] = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw (``local``) or fetch (``naive``) the prepared sample: ``(keys, values)``.

        ``keys`` is int64 of length n; ``values`` as :meth:`pull` returns them. With ``out``
        (float32, C-contiguous, writable; shape (n, L) in a job with one value length L, flat
        (n * L,) under per-key lengths, which needs every key of the domain to have length L)
        the values are written there and ``out`` is returned; a bad ``out`` raises before the
        handle is used, so the call can be repeated. Blocking like
        :meth:`pull`; the ``local`` scheme never goes remote (a key that moves away while it is
        read is drawn again). Each handle can be pulled once; a used or unknown handle raises
        InvalidArgument. Counted in ``stats()`` as ``sampled_keys`` (``sampled_local_keys``,
        ``sampled_remote_keys``), and as pulled keys.
        """
        self._node._check_open("pull_sample")
        if self._sampler is None:
            raise StateError("pull_sample: this job has no sampling domain; set "
                             "Config(sampling=adapm.Sampling(low, high, ...))")
        return self._sampler.pull(handle, out)

    def advance_clock(self) -> int:
        """Raise this worker's logical clock by one; returns the new clock. O(1) (after a
        ``local`` sample, one C call that releases its keys' pins).

        When the node's engine has not collected this worker's waiting intents for longer than
        two of its mean round times (``WorkerIntents.behind``), the thread also yields its core
        once
        (``os.sched_yield``, GIL released): where the workers keep every core busy (2 nodes of
        a worker, an engine thread and ZeroMQ's I/O thread on 2 cores), each thread a sync
        round passes through (ZeroMQ's, on both nodes, and the engines) waits for a core up to a
        scheduler slice at each wake-up, a round then takes 5-30 ms instead of ~1, and the
        intents signalled meanwhile wait for it: the remote bursts of the 2-node KGE demo
        (docs/benchmarks.md, "Remote bursts"). A yield with nothing else runnable costs a
        system call (~1 us)."""
        if self._node._closed:  # the one check here: this is O(1), once per batch
            self._node._check_open("advance_clock")
        if self._pinned is not None:
            self._repin(self._pinned, _NO_KEYS)
            self._pinned = None
        self.clock += 1
        intents = self._intents
        if intents is not None and intents.behind(time.monotonic()):
            _yield_core()
        return self.clock

    def _pin_sample(self, keys: np.ndarray, add: bool = False, held: bool = False) -> None:
        """Pin the keys of a local sample just read (until the next clock; see __init__): in
        place of the keys pinned so far this clock, or with ``add`` beside them; ``held``: they
        are pinned already (``NodeState.held_draw``), to be released with the others."""
        if self._repin is not None:
            pinned, take = self._pinned, _NO_KEYS if held else keys
            if add and pinned is not None:
                if len(take):
                    self._repin(_NO_KEYS, take)
                self._pinned = np.concatenate([pinned, keys])
            else:
                release = _NO_KEYS if pinned is None or add else pinned
                if len(release) or len(take):
                    self._repin(release, take)
                self._pinned = keys.copy()  # the caller owns ``keys``

    # --- completion --------------------------------------------------------------------------

    @_one_thread_at_a_time
    def wait(self, timeout_s: Optional[float] = None) -> None:
        """Block until every queued operation of this worker is acknowledged.

        Raises the first failure (AdaPMTimeout naming the peer rank, PeerError, ...) after
        waiting for all of them. ``timeout_s`` (default ``Config.request_timeout_s``) bounds the
        whole call, however many operations are queued.
        """
        self._node._check_open("wait")
        timeout_s = args.as_timeout(timeout_s)
        first_error: Optional[BaseException] = None
        outstanding, self._outstanding = self._outstanding, []
        pushes, self._native_pushes = self._native_pushes, []
        if outstanding or pushes:
            engine = self._engine
            timeout_s = engine.request_timeout_s if timeout_s is None else timeout_s
            deadline = time.monotonic() + timeout_s
        for call in outstanding:
            try:
                engine.wait(call, timeout_s, deadline=deadline)
            except AdaPMError as exc:
                first_error = first_error or exc
        for call, n in pushes:
            try:
                self._await_push(call, n, timeout_s, deadline)
            except AdaPMError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    @_one_thread_at_a_time
    def wait_sync(self, timeout_s: Optional[float] = None) -> None:
        """Block until keys with active intent of this worker are local (main copy or replica) and
        every earlier push of this worker is merged into the main copy.

        Acts on all active intents at once, whatever the action timer says, and waits for a sync
        round that starts after this call. Raises AdaPMTimeout after ``timeout_s`` (default
        ``Config.request_timeout_s``).
        """
        self._node._check_open("wait_sync")
        timeout_s = args.as_timeout(timeout_s)
        self.wait(timeout_s)
        if self._intents is None:
            return
        self._await_round(f"wait_sync of worker {self.index}", timeout_s)

    def _flush_at_shutdown(self, timeout_s: Optional[float]) -> None:
        """``wait_sync`` for shutdown; skipped when another thread is inside a call of this
        handle (shutdown then fails that call with StateError instead of waiting for it)."""
        if not self._in_use.acquire(blocking=False):
            return
        try:
            self.wait_sync(timeout_s)
        finally:
            self._in_use.release()

    # --- internals ---------------------------------------------------------------------------

    def _update(self, keys, values, kind: Op, name: str) -> None:
        # Per-call strings precomputed (Enum.name and f-strings cost ~0.5 us per call, a tenth
        # of a 100-key push): bench/store.py.
        what, local_counter, remote_counter = _UPDATE_NAMES[kind]
        self._node._check_open(what)
        store = self._store
        nmiss = None
        if type(keys) is np.ndarray and type(values) is np.ndarray and store.uniform_length:
            # Fast path, as in pull: None (nothing changed) unless layout and keys are fine.
            if kind is Op.PUSH:
                nmiss = store.scatter_add_fast(keys, values, self._missing)
            else:
                nmiss = store.scatter_set_fast(keys, values, self._missing)
        if nmiss is None:
            keys, values, nmiss = self._update_checked(keys, values, kind, name)
        self.counters[local_counter] += len(keys) - nmiss
        if not nmiss:
            return
        positions = self._missing[:nmiss].copy()
        rows = store.select_rows(values.reshape(-1), keys, positions)
        if self._intents is not None and self._intents.late(self.clock) and self._round_came():
            # As in pull: the round that acts on the late intent first, then what is here.
            wanted = keys[positions]
            missing = self._missing_buffer(len(wanted))
            if kind is Op.PUSH:
                nmiss = store.scatter_add(wanted, rows, missing)
            else:
                nmiss = store.scatter_set(wanted, rows, missing)
            self.counters[local_counter] += len(wanted) - nmiss
            if not nmiss:
                return
            still = missing[:nmiss].copy()
            positions, rows = positions[still], store.select_rows(rows, wanted, still)
        self.counters[remote_counter] += nmiss
        engine = self._engine
        native = engine.native
        # Through the transport, without the engine loop (native/zmq_calls.c), unless a request
        # of this worker is still on the loop's path: a push must not overtake it (a set).
        if kind is Op.PUSH and native is not None and store.uniform_length and \
                not self._requests_open():
            call = native.push(keys[positions], positions, rows, store.uniform_length,
                               self.index, self.clock)
            if call is not None:
                self._native_pushes.append((call, nmiss))
                if len(self._native_pushes) > _PRUNE_OUTSTANDING:
                    self._prune()
                return
        self._native_routed()
        self._outstanding.append(engine.submit(
            Request(kind, keys[positions], positions, rows, worker=self.index, clock=self.clock),
            f"{kind.name} of {nmiss} keys"))
        if len(self._outstanding) > _PRUNE_OUTSTANDING:
            self._prune()

    def _update_checked(self, keys, values, kind: Op, name: str):
        """Local part of a push/set with full validation (bad input raises before any change)."""
        store = self._store
        # As in pull: the native call range-checks the whole batch before it changes anything.
        lazy = bool(store.uniform_length)
        keys = args.as_keys(keys, store, check_range=not lazy)
        try:
            values = args.as_values(values, store, keys, name)
            missing = self._missing_buffer(len(keys))
            if kind is Op.PUSH:
                nmiss = store.scatter_add(keys, values, missing)
            else:
                nmiss = store.scatter_set(keys, values, missing)
        except Exception:
            if lazy:
                args.check_range_of(keys, store)  # a bad key is reported first, as InvalidArgument
            raise
        return keys, values, nmiss

    def _pull_missing(self, keys: np.ndarray, out: np.ndarray, positions: np.ndarray) -> None:
        """Get the keys at ``positions`` (not held here a moment ago) through the engine.

        The engine serves keys that arrived meanwhile, holds the request for keys on their way
        here (this node acted on an intent and the owner has not answered yet: the owner sends
        the key before its answer), and sends the rest to their owners. Parts served here count
        as ``waited_pull_keys``, the others as ``remote_pull_keys``.
        """
        if self._engine is None:
            raise StateError("a single node holds every key; nothing should be remote")
        engine = self._engine
        what = f"PULL of {len(positions)} keys"
        store = self._store
        # Through the transport, without the engine loop (native/zmq_calls.c), unless a push or
        # set of this worker is still on the loop's path: a pull must not overtake it.
        native = engine.native
        if native is not None and store.uniform_length and not self._requests_open():
            call = native.pull(keys[positions], positions, out, store.uniform_length)
            if call is not None and self._await_native(call, what):
                self.counters["waited_pull_keys"] += call.waited
                self.counters["remote_pull_keys"] += len(positions) - call.waited
                return
        self._native_routed()
        call = engine.submit(Request(Op.PULL, keys[positions], positions, worker=self.index,
                                     clock=self.clock), what)
        flat = out.reshape(-1)
        offsets = self._row_offsets(keys) if not store.uniform_length else None
        rank, waited = self._node.rank, 0
        for part in engine.wait(call):
            pos, values = part.arrays
            if part.src == rank:
                waited += len(pos)
            if offsets is None:
                out.reshape(len(keys), -1)[pos] = values.reshape(len(pos), -1)
            else:
                flat[routing.segment_index(offsets[pos], store.lens[keys[pos]])] = values
        self.counters["waited_pull_keys"] += waited
        self.counters["remote_pull_keys"] += len(positions) - waited

    def _requests_open(self) -> bool:
        """Whether a push or set of this worker on the engine loop's path still waits for its
        answer (newest first: an open one is usually among the last)."""
        return any(not call.done for call in reversed(self._outstanding))

    def _native_routed(self) -> None:
        """Before a request takes the engine loop's path: every push this worker queued with
        the transport has been routed (sent, or handed to the loop, which takes it before
        what is submitted from now on), so that the request does not overtake one (a set
        after a push of the same key, a pull after it). Usually at once: the engine routes
        a queued push on its next look."""
        if not self._native_pushes or self._native_pushes[-1][0].wait_routed(0) != NATIVE_QUEUED:
            return  # the engine routes queued pushes in order: the newest is the last
        engine = self._engine
        deadline = time.monotonic() + engine.request_timeout_s
        call = self._native_pushes[-1][0]
        while engine.wait_routed(call, min(_FAILURE_CHECK_S,
                                           max(0.0, deadline - time.monotonic()))) \
                == NATIVE_QUEUED:
            engine.raise_if_failed()
            if time.monotonic() >= deadline:
                raise AdaPMTimeout(f"rank {self._node.rank}: the communication thread did not "
                                   f"take a push of worker {self.index} within "
                                   f"{engine.request_timeout_s:g}s")

    def _await_push(self, call, n: int, timeout_s: float, deadline: float) -> None:
        """Wait until a push the transport sent (``ZmqIO.push``) is acknowledged; raises its
        failure, or AdaPMTimeout naming the ranks waited for after ``deadline``."""
        engine = self._engine
        while True:
            state = engine.wait_native(
                call, min(_FAILURE_CHECK_S, max(0.0, deadline - time.monotonic())))
            if state == NATIVE_DONE:
                return
            if state == NATIVE_FAILED:
                raise self._push_failure(call)
            engine.raise_if_failed()
            if time.monotonic() >= deadline:
                call.abandon()
                ranks = call.waiting_on()
                via = " (passed on there by another node)" if call.forwarded else ""
                who = (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}") if ranks \
                    else "the communication thread"
                raise AdaPMTimeout(f"rank {self._node.rank}: no answer from {who}{via} to PUSH "
                                   f"of {n} keys within {timeout_s:g}s")

    def _push_failure(self, call) -> BaseException:
        engine = self._engine
        if call.exception is not None:  # handed to the engine loop, which failed it
            return call.exception
        if engine.error is not None:
            return engine.error
        if engine.native_error is not None:  # the node was shut down meanwhile
            return engine.native_error
        return PeerError(call.error)

    def _await_native(self, call, what: str) -> bool:
        """Wait for a pull the transport serves (``ZmqIO.pull``): True when ``out`` holds every
        row, False if it was declined (nothing was sent: the engine's path takes it). Raises
        the engine's error if it failed meanwhile, PeerError if an owner could not serve it,
        and AdaPMTimeout (naming the ranks waited for) after ``Config.request_timeout_s``."""
        engine = self._engine
        timeout_s = engine.request_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            state = engine.wait_native(
                call, min(_FAILURE_CHECK_S, max(0.0, deadline - time.monotonic())))
            if state == NATIVE_DONE:
                return True
            if state == NATIVE_DECLINED:
                return False
            engine.raise_if_failed()
            if state == NATIVE_FAILED:
                if engine.native_error is not None:  # the node was shut down meanwhile
                    raise engine.native_error
                raise PeerError(call.error)
            if time.monotonic() >= deadline:
                call.abandon()
                ranks = call.waiting_on()
                via = " (passed on there by another node)" if call.forwarded else ""
                who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
                raise AdaPMTimeout(f"rank {self._node.rank}: no answer from {who}{via} to "
                                   f"{what} within {timeout_s:g}s")

    def _row_offsets(self, keys: np.ndarray) -> np.ndarray:
        lengths = self._store.lens[keys]
        return np.cumsum(lengths) - lengths

    def _missing_buffer(self, n: int) -> np.ndarray:
        if len(self._missing) < n:
            self._missing = np.empty(max(n, 2 * len(self._missing)), dtype=np.int64)
        return self._missing

    def _prune(self) -> None:
        pushes = self._native_pushes
        if pushes and pushes[0][0].done:
            self._native_pushes = [entry for entry in pushes if not entry[0].done]
            for call, _ in pushes:
                if call.done and call.wait(0) == NATIVE_FAILED:
                    raise self._push_failure(call)
        done = [call for call in self._outstanding if call.done]
        if not done:
            return
        self._outstanding = [call for call in self._outstanding if not call.done]
        for call in done:
            if call.error is not None:
                raise call.error

    def __repr__(self) -> str:
        return f"<adapm.Worker rank={self._node.rank} index={self.index} clock={self.clock}>"
