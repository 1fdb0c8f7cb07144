"""Worker handles: the API that training code calls for every batch.

A handle belongs to one thread (it keeps per-thread buffers, a socket and a logical clock); a node
may have any number of them. Locally held keys are read and written in the node's store directly
(one native call per batch, GIL released). The rest go to their owner as one grouped message per
destination node.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

import numpy as np

from . import args, routing
from .comm import Pending
from .errors import AdaPMError, AdaPMTimeout, InvalidArgument, StateError
from .protocol import Kind, encode_one
from .sampling import WorkerSampler
from .store import NONE

if TYPE_CHECKING:
    from .node import Node

# Pushes may be issued without waiting; answered ones are pruned once this many are pending.
_PRUNE_OUTSTANDING = 1024

# kind -> (operation name for errors, local counter, remote counter)
_UPDATE_NAMES = {
    Kind.PUSH: ("push", "local_push_keys", "remote_push_keys"),
    Kind.SET: ("set", "local_set_keys", "remote_set_keys"),
}


class Worker:
    """One worker thread's handle: pull, push, set, intent, clock. Not thread-safe."""

    COUNTERS = ("local_pull_keys", "remote_pull_keys", "waited_pull_keys", "local_push_keys",
                "remote_push_keys", "local_set_keys", "remote_set_keys", "intents_signalled",
                "intents_acted", "sampled_keys", "sampled_local_keys", "sampled_remote_keys")

    def __init__(self, node: "Node", index: int) -> None:
        self._node = node
        self._store = node.store
        self.index = index
        self.clock = 0
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self._missing = np.empty(1024, dtype=np.int64)
        self._outstanding: list[tuple[int, Pending]] = []
        self._client = None
        sync = node.comm.sync if node.comm is not None else None
        # Intents go to the sync loop; under static partitioning (or on one node) nobody acts.
        self._intents = sync.new_worker_intents(self) if sync is not None else None
        sampling = node.config.sampling
        self._sampler = WorkerSampler(self, sampling, node.rank) if sampling is not None else None

    # --- data access -------------------------------------------------------------------------

    def pull(self, keys, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Current values of ``keys`` (duplicates allowed, request order). Blocking.

        Returns float32 of shape (len(keys), L) for a uniform length L, else the values packed
        back to back. With ``out`` (same shape, float32, C-contiguous) it fills ``out`` and returns
        it without allocating. Remote keys cost one round trip per owner node, in parallel.
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
            positions = self._await_arrivals(keys, out, self._missing[:nmiss].copy())
            self.counters["waited_pull_keys"] += nmiss - len(positions)
            if len(positions):
                self.counters["remote_pull_keys"] += len(positions)
                self._pull_remote(keys, out, positions)
        return out

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

    def push(self, keys, updates) -> None:
        """Add ``updates`` to the values of ``keys`` (duplicates add up). Non-blocking for remote keys.

        The local part is applied before return; the remote part is sent and acknowledged later
        (see :meth:`wait`). ``updates`` is not kept: the caller may reuse it at once.
        """
        self._update(keys, updates, Kind.PUSH, "updates")

    def set(self, keys, values) -> None:
        """Overwrite the values of ``keys``. Local part applied before return, remote part queued.

        A key held here as a replica counts as remote: the set goes to the main copy, and the
        replica shows it after the next sync round (``wait_sync``). Pushes this node made to
        that replica before the set and not yet synced are merged after it: set replicated
        keys between rounds of pushes (``wait_sync`` first) when that order matters.
        """
        self._update(keys, values, Kind.SET, "values")

    # --- intent and clocks -------------------------------------------------------------------

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
            self._intents.signal(keys.copy(), start, end)

    def _check_window(self, start, end) -> tuple[int, int]:
        start = args.as_clock(start, "start")
        end = start + 1 if end is None else args.as_clock(end, "end")
        if end <= start:
            raise InvalidArgument(f"end must be > start, got start={start} end={end}")
        return start, end

    # --- sampling ----------------------------------------------------------------------------

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
        """Raise this worker's logical clock by one; returns the new clock. O(1)."""
        self.clock += 1
        return self.clock

    # --- completion --------------------------------------------------------------------------

    def wait(self, timeout_s: Optional[float] = None) -> None:
        """Block until every queued operation of this worker is acknowledged.

        Raises the first failure (AdaPMTimeout naming the peer rank, PeerError, ...) after
        waiting for all of them. ``timeout_s`` (default ``Config.request_timeout_s``) bounds the
        whole call, however many operations are queued.
        """
        self._node._check_open("wait")
        first_error: Optional[BaseException] = None
        outstanding, self._outstanding = self._outstanding, []
        if outstanding:
            comm = self._node.comm
            timeout_s = comm.request_timeout_s if timeout_s is None else timeout_s
            deadline = time.monotonic() + timeout_s
        for req_id, pending in outstanding:
            try:
                comm.wait(req_id, pending, timeout_s, deadline=deadline)
            except AdaPMError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def wait_sync(self, timeout_s: Optional[float] = None) -> None:
        """Block until keys with active intent of this worker are local (main copy or replica) and
        every earlier push of this worker is merged into the main copy.

        Acts on all active intents at once, whatever the action timer says, and waits for a sync
        round that starts after this call. Raises AdaPMTimeout after ``timeout_s`` (default
        ``Config.request_timeout_s``).
        """
        self.wait(timeout_s)
        if self._intents is None:
            return
        comm = self._node.comm
        req_id, pending = comm.new_request(self._node.rank, "wait_sync (a sync round)", 1)
        self._client_socket().send(self._node.rank, Kind.WAKE,
                                   encode_one(Kind.WAKE, self._node.rank, req_id,
                                              w=self.index))
        try:
            comm.wait(req_id, pending, timeout_s)
        except AdaPMTimeout as exc:
            raise AdaPMTimeout(f"rank {self._node.rank}: wait_sync of worker {self.index} timed "
                               f"out; the sync round waits for ranks "
                               f"{comm.sync.waiting_on()}") from exc

    # --- internals ---------------------------------------------------------------------------

    def _update(self, keys, values, kind: Kind, name: str) -> None:
        # Per-call strings precomputed (Enum.name and f-strings cost ~0.5 us per call, a tenth
        # of a 100-key push): bench/store.py.
        what, local_counter, remote_counter = _UPDATE_NAMES[kind]
        self._node._check_open(what)
        store = self._store
        nmiss = None
        if type(keys) is np.ndarray and type(values) is np.ndarray and store.uniform_length:
            # Fast path, as in pull: None (nothing changed) unless layout and keys are fine.
            if kind is Kind.PUSH:
                nmiss = store.scatter_add_fast(keys, values, self._missing)
            else:
                nmiss = store.scatter_set_fast(keys, values, self._missing)
        if nmiss is None:
            keys, values, nmiss = self._update_checked(keys, values, kind, name)
        self.counters[local_counter] += len(keys) - nmiss
        if not nmiss:
            return
        self.counters[remote_counter] += nmiss
        positions = self._missing[:nmiss].copy()
        for dst, group in routing.group_by_node(self._owners(keys[positions])):
            pos = positions[group]
            rows = store.select_rows(values.reshape(-1), keys, pos)
            self._outstanding.append(self._send_request(dst, kind, keys, pos, [rows]))
        if len(self._outstanding) > _PRUNE_OUTSTANDING:
            self._prune()

    def _update_checked(self, keys, values, kind: Kind, name: str):
        """Local part of a push/set with full validation (bad input raises before any change)."""
        store = self._store
        # As in pull: the native call range-checks the whole batch before it changes anything.
        lazy = bool(store.uniform_length)
        keys = args.as_keys(keys, store, check_range=not lazy)
        try:
            values = args.as_values(values, store, keys, name)
            missing = self._missing_buffer(len(keys))
            if kind is Kind.PUSH:
                nmiss = store.scatter_add(keys, values, missing)
            else:
                nmiss = store.scatter_set(keys, values, missing)
        except Exception:
            if lazy:
                args.check_range_of(keys, store)  # a bad key is reported first, as InvalidArgument
            raise
        return keys, values, nmiss

    def _await_arrivals(self, keys: np.ndarray, out: np.ndarray,
                        positions: np.ndarray) -> np.ndarray:
        """Wait for missing keys that are on their way here; read them; return the rest.

        A key is on its way while this node has acted on an intent for it and the owner has not
        yet answered that report: the owner sends the key (relocation or replica) before its
        answer. Waiting for it costs at most the rest of the sync round, a remote pull at least
        a round trip, and the request would only chase the key back here (bench/adaptive.py:
        most late pulls were forwarded back to their origin). Keys that do not come (the owner
        decided otherwise, or the intent ended) are returned for a remote pull.
        """
        comm = self._node.comm
        sync = comm.sync if comm is not None else None
        if sync is None:
            return positions
        store = self._store
        missing = keys[positions]
        if not sync.node.in_flight(missing).any():
            return positions
        deadline = time.monotonic() + comm.request_timeout_s
        with comm.arrivals:
            while True:
                comm.raise_if_failed()
                coming = sync.node.in_flight(missing) & (store.state[missing] == NONE)
                if not coming.any():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AdaPMTimeout(
                        f"rank {self._node.rank}: pull of worker {self.index} waited "
                        f"{comm.request_timeout_s:g}s for keys {missing[coming][:5].tolist()} "
                        f"whose intent this node reported; the sync round waits for ranks "
                        f"{sync.waiting_on()}")
                comm.arrivals.wait(min(left, 0.5))
        values = np.empty(store.floats_for(missing), dtype=np.float32)
        nmiss = store.gather(missing, values, self._missing_buffer(len(missing)))
        still = self._missing[:nmiss].copy()
        found = np.ones(len(missing), dtype=bool)
        found[still] = False
        if store.uniform_length:
            rows = values.reshape(len(missing), -1)
            out.reshape(len(keys), -1)[positions[found]] = rows[found]
        else:
            offsets = self._row_offsets(keys)
            lens = store.lens[missing]
            flat_found = routing.segment_index((np.cumsum(lens) - lens)[found], lens[found])
            out.reshape(-1)[routing.segment_index(offsets[positions[found]],
                                                  lens[found])] = values[flat_found]
        return positions[still]

    def _pull_remote(self, keys: np.ndarray, out: np.ndarray, positions: np.ndarray) -> None:
        requests = [self._send_request(dst, Kind.PULL, keys, positions[group], [])
                    for dst, group in routing.group_by_node(self._owners(keys[positions]))]
        comm = self._node.comm
        deadline = time.monotonic() + comm.request_timeout_s
        flat = out.reshape(-1)
        offsets = self._row_offsets(keys) if not self._store.uniform_length else None
        for req_id, pending in requests:
            # An answer may come in parts (from the nodes a request was forwarded to).
            for part in comm.wait(req_id, pending, deadline=deadline):
                pos, values = part.arrays
                comm.learn_owner(keys[pos], part.src)
                if offsets is None:
                    out.reshape(len(keys), -1)[pos] = values.reshape(len(pos), -1)
                else:
                    flat[routing.segment_index(offsets[pos], self._store.lens[keys[pos]])] = values

    def _send_request(self, dst: int, kind: Kind, keys: np.ndarray, positions: np.ndarray,
                      extra: list) -> tuple[int, Pending]:
        """Send keys[positions] (and ``extra`` arrays) to ``dst``; answers name the positions."""
        comm = self._node.comm
        req_id, pending = comm.new_request(dst, f"{kind.name} of {len(positions)} keys",
                                           len(positions))
        frames = encode_one(kind, self._node.rank, req_id,
                            [keys[positions], positions, *extra], o=self._node.rank)
        self._client_socket().send(dst, kind, frames)
        return req_id, pending

    def _client_socket(self):
        if self._client is None:
            self._client = self._node.transport.client()
        return self._client

    def _owners(self, keys: np.ndarray) -> np.ndarray:
        """Where we believe the owners of ``keys`` are (a hint; wrong guesses get forwarded)."""
        if self._node.comm is None:
            raise StateError("a single node holds every key; nothing should be remote")
        return self._node.comm.hint[keys]

    def _row_offsets(self, keys: np.ndarray) -> np.ndarray:
        lengths = self._store.lens[keys]
        return np.cumsum(lengths) - lengths

    def _missing_buffer(self, n: int) -> np.ndarray:
        if len(self._missing) < n:
            self._missing = np.empty(max(n, 2 * len(self._missing)), dtype=np.int64)
        return self._missing

    def _prune(self) -> None:
        done = [item for item in self._outstanding if item[1].event.is_set()]
        if not done:
            return
        self._outstanding = [item for item in self._outstanding if not item[1].event.is_set()]
        for req_id, pending in done:
            if pending.error is not None:
                raise pending.error

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __repr__(self) -> str:
        return f"<adapm.Worker rank={self._node.rank} index={self.index} clock={self.clock}>"
