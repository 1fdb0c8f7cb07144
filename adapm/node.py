"""Wiring: a Node (one per process) and its Worker handles (one per worker thread)."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Optional

import numpy as np
import zmq

from . import checkpoint as _checkpoint
from ._engine import routing
from ._engine.channels import ChannelEngine, LockedSink
from ._engine.events import Op, Request
from ._engine.loop import EngineLoop
from ._engine.state import COUNTERS as _ENGINE_COUNTERS
from ._engine.state import NodeState
from ._store import OWNER, Store
from ._wire import auth, rendezvous
from ._wire.traffic import Traffic
from ._wire.zmq_transport import Transport
from .args import as_timeout
from .config import Config, remove_secret_from_env, unapplied_env, under_launcher
from .errors import (AdaPMError, AdaPMTimeout, CheckpointError, ConfigError, InvalidArgument,
                     StateError)
from .worker import Worker

# Pause between two attempts to write a checkpoint's shards (keys were still on their way
# between nodes): an idle engine sends what it holds for a peer within its idle poll (50 ms).
_SETTLE_PAUSE_S = 0.05
# A transport's counters, by name (stats() shows them on one node too, at 0).
_TRAFFIC_NAMES = tuple(Traffic().snapshot())

_active_lock = threading.Lock()
_active: Optional["Node"] = None


def init(num_keys: Optional[int] = None, value_length=None, *, config: Optional[Config] = None,
         restore=None, **settings) -> "Node":
    """Start this process's node and return it. Blocks until all nodes of the job have joined.

    Give either ``config`` or the settings (``num_keys``, ``value_length`` and any other
    :class:`Config` field); settings not given come from the launcher's environment (see
    :mod:`adapm.config`). Under a launcher a ``config`` takes the launcher's rank, world size and
    rendezvous (ConfigError if it names others). Without a launcher this is a single node that
    needs no sockets. Raises StateError if this process already has a running node.

    ``restore``: a checkpoint directory (:meth:`Node.checkpoint`) to start from, on any number
    of nodes: each node reads its home keys' values (``k % world_size == rank``) from it into
    its store before it joins its peers, so every key starts with its value there (the
    checkpoint must be readable by every node: a shared filesystem or a copy per host). Without
    ``config`` and ``num_keys``, ``num_keys`` and ``value_length`` come from the checkpoint.
    Raises ConfigError (naming the path and the difference) when the job's num_keys or value
    lengths differ from the checkpoint's, CheckpointError when it is missing, corrupt (every
    file read is checked against its sha256) or of an unknown format version.
    """
    if config is not None and (num_keys is not None or value_length is not None or settings):
        raise InvalidArgument("config: give either config=Config(...) or keyword settings, not both")
    if restore is not None and not isinstance(restore, _checkpoint.Checkpoint):
        restore = _checkpoint.load(restore)
    if config is None:
        if num_keys is None and restore is not None:
            num_keys = restore.num_keys
            value_length = restore.value_length if value_length is None else value_length
        if num_keys is None:
            raise InvalidArgument("num_keys: required (or pass config=Config(...))")
        if value_length is not None:
            settings["value_length"] = value_length
        config = Config.from_env(num_keys=num_keys, **settings)
    else:
        config = under_launcher(config)
        unapplied = unapplied_env(config)
        if unapplied:  # the Config wins, but not silently
            warnings.warn(f"adapm.init(config=...): {', '.join(unapplied)} set in the "
                          "environment do not apply: the Config's own values do (give the "
                          "settings as keywords, adapm.init(num_keys=..., ...), to take the "
                          "environment's)", stacklevel=2)
    remove_secret_from_env()  # the node has it now; the processes it starts need not
    global _active
    with _active_lock:
        if _active is not None:
            raise StateError(
                f"init: this process already runs node rank {_active.rank}; call shutdown() first"
            )
        node = Node(config, restore=restore)
        _active = node
    return node


def _left(deadline: Optional[float]) -> Optional[float]:
    """Seconds until ``deadline`` (time.monotonic), as a timeout (> 0: what is past is spent);
    None for None (the callee's default)."""
    return None if deadline is None else max(deadline - time.monotonic(), 1e-3)


class _KeysMoved(CheckpointError):
    """Keys left this node while its checkpoint shard was read (the shards are written again)."""


def _max_frame_bytes(config: Config) -> int:
    """The largest frame a peer may send: one that moves every key of the job at once (values,
    and per key up to eight 8-byte fields of keys, positions, versions, masks and epochs),
    plus room for the headers. Anything larger cannot be legitimate."""
    lengths = config.value_length
    longest = lengths if isinstance(lengths, int) else int(np.max(lengths))
    per_key = 4 * longest + 8 * (8 + (config.world_size + 63) // 64)
    return config.num_keys * per_key + (1 << 20)


class Node:
    """One process of a job: the store, the engine thread and the worker handles.

    Thread safety: ``worker()``, ``stats()`` and ``local_keys()`` may be called from any thread;
    ``barrier()``, ``checkpoint()`` and ``shutdown()`` are collective (every node calls them,
    one thread each).
    """

    def __init__(self, config: Config, *, transport=None, engine_class=EngineLoop,
                 restore=None) -> None:
        """``transport``: an already connected transport (in-process clusters; with channels a
        list of one per channel); by default a ZeroMQ transport per channel connected through
        the rendezvous when ``world_size > 1``.
        ``engine_class``: what runs the engine state (a thread; the simulator in tests).
        ``restore``: a checkpoint (path or :class:`adapm.checkpoint.Checkpoint`) whose values
        this node's keys start with (see :func:`init`)."""
        self.config = config
        self.rank = config.rank
        self.world_size = config.world_size
        restored = self._restored(restore)
        self.store = Store(config)
        home = routing.home_keys(self.rank, config.num_keys, self.world_size)
        self.store.insert(home, OWNER, restored.read(home) if restored is not None else None)
        self._workers: list[Worker] = []
        self._workers_lock = threading.Lock()
        self._barrier_epoch = 0
        self._timed_out = None  # (kind, epoch, call) of the last collective if it timed out
        self._closed = False
        self._clean = False  # shutdown met all nodes: sockets may linger to flush
        self._context = None
        self.engine = None  # an EngineLoop; a ChannelEngine over one per channel
        given = transport if isinstance(transport, list) else \
            [transport] if transport is not None else []
        self.transport = given[0] if given else None  # channel 0's; all in self.transports
        self.transports: list = list(given)
        # Before connecting: an unusable trace_dir fails here, not after the peers joined.
        self._trace = self._start_trace() if config.trace_dir is not None else None
        if self.world_size > 1:
            try:
                if transport is None:
                    self._connect()
                elif len(self.transports) != config.channels:
                    raise ConfigError(f"channels={config.channels}: give one transport per "
                                      f"channel, got {len(self.transports)}")
            except BaseException:
                if self._trace is not None:
                    self._trace.close(None)
                raise
            states = [self.make_state(config, self.store, restored, channel)
                      for channel in range(config.channels)]
            if self._trace is not None:
                sink = self._trace if len(states) == 1 else LockedSink(self._trace)
                for state in states:
                    state.subscribe(sink)
            if len(states) == 1:
                self.engine = engine_class(states[0], self.transport, config.request_timeout_s)
            else:
                self.engine = ChannelEngine(
                    [engine_class(state, transport, config.request_timeout_s)
                     for state, transport in zip(states, self.transports)], self.store)
            self.engine.start()

    def _restored(self, restore) -> Optional["_checkpoint.Checkpoint"]:
        """The checkpoint to restore from, checked against this node's config (ConfigError,
        CheckpointError before anything starts), or None."""
        if restore is None:
            return None
        if not isinstance(restore, _checkpoint.Checkpoint):
            restore = _checkpoint.load(restore)
        restore.check_matches(self.config.num_keys, self.config.value_length)
        return restore

    @staticmethod
    def make_state(config: Config, store: Store, restored=None, channel: int = 0) -> NodeState:
        """The engine state of a node whose store holds its home partition (restored from
        checkpoint ``restored``, if given), for its keys of ``channel``."""
        state = NodeState(config.rank, config.world_size, store, config, channel)
        if state.policy.replicates_everything:
            # Every node holds every key: replicas of all keys homed elsewhere, synced each round.
            state.replicate_everything(restored.read if restored is not None else None)
        return state

    def _start_trace(self):
        """A trace recorder (adapm.trace), to subscribe to the engine's event stream. A single
        node has no engine: its trace holds its final statistics only."""
        from .trace.recorder import TraceRecorder, selection

        config = self.config
        keys = config.trace_keys
        meta = {"rank": self.rank, "world_size": self.world_size, "num_keys": config.num_keys,
                "management": config.management,
                "trace_keys": keys if isinstance(keys, (str, int)) else
                f"{len(keys)} keys listed", "home": "key % world_size"}
        return TraceRecorder(config.trace_dir, self.rank, meta, selection(config),
                             self._round_stats)

    def _round_stats(self) -> dict:
        """stats() for the trace, on the engine thread at each round's end."""
        return self._stats()

    def _connect(self) -> None:
        """A ZeroMQ transport per channel, connected to the same channel of every peer through
        the rendezvous (where a node's address is the list of its channels' then)."""
        context = zmq.Context()
        config = self.config
        try:
            keys = auth.JobKeys.for_config(config)  # None: plain ZeroMQ (loopback)
            host = rendezvous.resolve_host(config)
            for channel in range(config.channels):  # channel 0's runs the context's ZAP
                self.transports.append(Transport(self.rank, host, context, keys=keys,
                                                 max_frame_bytes=_max_frame_bytes(config),
                                                 zap=channel == 0))
            self.transport = self.transports[0]
            mine = [t.address for t in self.transports]
            addresses, token = rendezvous.rendezvous(
                config, mine if config.channels > 1 else mine[0], context, keys)
            for channel, transport in enumerate(self.transports):
                transport.connect([a[channel] if config.channels > 1 else a for a in addresses],
                                  token)
        except BaseException:
            for transport in reversed(self.transports):  # channel 0's ZAP handler last
                transport.close()
            context.term()
            raise
        self._context = context

    # --- handles and queries -----------------------------------------------------------------

    def worker(self) -> Worker:
        """A new worker handle with its own logical clock. Use each handle from one thread."""
        self._check_open("worker")
        with self._workers_lock:
            handle = Worker(self, len(self._workers))
            self._workers.append(handle)
        return handle

    def local_keys(self) -> np.ndarray:
        """Keys with a main copy or a replica on this node now (int64, ascending; a snapshot).
        Any thread; O(num_keys) (a scan of every key's state), for inspection, not hot paths."""
        self._check_open("local_keys")
        # Any thread: the scan reads each key's state safely while the engine thread moves keys
        # (store.local_keys() reads the held map, which only the engine thread may do then).
        if self.engine is None:
            return self.store.local_keys()
        return self.store.held_keys_snapshot()

    def trace_mark(self, label: str) -> None:
        """Record a named point in time, with this node's ``stats()`` then, in its trace
        (nothing when not tracing). ``"epoch N start"`` / ``"epoch N end"`` split
        ``Trace.summary(per_epoch=True)``. Any thread; non-blocking."""
        if not isinstance(label, str):
            raise InvalidArgument(f"trace_mark: label must be a str, got {type(label).__name__}")
        if self._trace is not None:
            self._trace.mark(label, self._stats())

    def stats(self) -> dict:
        """Counters since init, this node only (see DESIGN section 6 for their meaning).
        Raises the trace writer's failure, if tracing failed (AdaPMError)."""
        if self._trace is not None:
            self._trace.check()
        return self._stats()

    def _stats(self) -> dict:
        # Read before the workers' counters: a worker counts a key as remote before the engine
        # can count it as applied here, so the remote counts never dip below zero.
        served_here = self.engine.state.own_updates_served_here() \
            if self.engine is not None else (0, 0)
        totals = {name: 0 for name in Worker.COUNTERS}
        with self._workers_lock:
            workers = list(self._workers)
        for handle in workers:
            for name, value in handle.counters.items():
                totals[name] += value
        totals["access_wait_s"] = sum(handle.access_wait_s for handle in workers)
        for kind, here in zip(("push", "set"), served_here):
            # A push or set that waited for keys on their way here is a local one.
            totals[f"remote_{kind}_keys"] -= here
            totals[f"local_{kind}_keys"] += here
        totals.update({"messages_sent": 0, "messages_received": 0, "bytes_sent": 0,
                       "bytes_received": 0, "messages_served_natively": 0,
                       "syncs_served_natively": 0, "pulls_sent_natively": 0,
                       "answers_taken_natively": 0, "pushes_sent_natively": 0,
                       "pushes_handed_to_engine": 0})
        for transport in self.transports:  # every channel's
            for name, value in transport.traffic.snapshot().items():
                totals[name] = totals.get(name, 0) + value
        # The same keys on one node (no transport, no engine) as on many, from the start.
        totals.update({name: 0 for name in (*_TRAFFIC_NAMES, *_ENGINE_COUNTERS)
                       if name not in totals})
        totals.update({"relocations_in": 0, "relocations_out": 0, "replica_setups": 0,
                       "replica_drops": 0, "rounds": 0, "empty_rounds": 0,
                       "mean_round_ms": 0.0, "engine_cpu_s": 0.0, "dropped_messages": 0})
        if self.engine is not None:
            totals.update(self.engine.state.stats())
            totals["late_answers"] += self.engine.counters["late_answers"]
            # Every message dropped on the way in: undecodable or forged (transport), or unfit
            # for the state (engine); the transport's own counters give the breakdown.
            totals["dropped_messages"] = (self.engine.counters["dropped_messages"]
                                          + totals["dropped_local_messages"]
                                          + totals.get("dropped_malformed_messages", 0)
                                          + totals.get("dropped_forged_messages", 0))
            totals["engine_cpu_s"] = self.engine.cpu_seconds()
        totals["mean_staleness_ms"] = self.store.mean_staleness_ms()
        totals["replica_reads"] = int(self.store.access_stats[0])
        accessed = totals["local_pull_keys"] + totals["waited_pull_keys"] + \
            totals["remote_pull_keys"] + totals["local_push_keys"] + totals["remote_push_keys"]
        remote = totals["remote_pull_keys"] + totals["remote_push_keys"]
        totals["remote_access_share"] = remote / accessed if accessed else 0.0
        return totals

    # --- collectives -------------------------------------------------------------------------

    def barrier(self, timeout_s: Optional[float] = None, *, name: Optional[str] = None) -> None:
        """Block until every node has called barrier() as often as this one.

        Call it from one thread per node. Updates that a worker had acknowledged before its node
        entered the barrier (``wait()``; ``wait_sync()`` for updates to replicas) are visible on
        every node afterwards: after the nodes meet, each runs a sync round that refreshes its
        replicas. Raises AdaPMTimeout after ``Config.connect_timeout_s`` (or ``timeout_s``)
        naming the ranks that did not arrive. This node's arrival still counts then: the same
        call again waits on for the nodes to meet there (a retry), while any other collective
        comes after it.

        ``name`` says what the nodes meet for (a library's collective step, say): nodes meet
        only at collectives of the same name, so a node in ``barrier(name="load")`` and one in
        a plain ``barrier()`` (or ``shutdown()``, ``checkpoint()``) both raise PeerError naming
        what each called, instead of passing each other.
        """
        self._check_open("barrier")
        if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 200
                                 or name in ("shutdown", "checkpoint")):
            raise InvalidArgument(f"barrier: name must be a str of 1 to 200 characters other "
                                  f"than 'shutdown' and 'checkpoint' (the nodes' own), got "
                                  f"{name!r:.80}")
        self._barrier(as_timeout(timeout_s), kind="barrier" if name is None else name)

    def _barrier(self, timeout_s: Optional[float], refresh: bool = True,
                 kind: str = "barrier") -> None:
        """Meet every node at this node's next collective, of ``kind`` (the method name, so
        that a node in ``barrier()`` never pairs with one in ``shutdown()``)."""
        if self.engine is None:
            return
        timeout_s = self.config.connect_timeout_s if timeout_s is None else timeout_s
        pending, self._timed_out = self._timed_out, None
        if pending is not None and pending[0] == kind:
            # The same collective again after it timed out here: this node's arrival counted
            # (the others meet it there), so the call goes on waiting for that collective.
            _, epoch, call = pending
            call.abandoned = False
        else:
            epoch = self._barrier_epoch
            self._barrier_epoch += 1
            call = self.engine.submit(Request(Op.BARRIER, epoch=epoch, tag=kind),
                                      f"{kind} (collective #{epoch})")
        try:
            self.engine.wait(call, timeout_s)
        except AdaPMTimeout as exc:
            if exc is self.engine.error:  # the node had died of its own timeout: say that one
                raise
            self._timed_out = (kind, epoch, call)
            if self.rank == 0:
                missing = self.engine.state.barrier_missing(epoch)
                raise AdaPMTimeout(f"rank 0: {kind} (collective #{epoch}): ranks {missing} did "
                                   f"not arrive within {timeout_s:g}s") from exc
            raise
        if refresh:
            # Replicas here catch up with every update acknowledged before the barrier.
            call = self.engine.submit(Request(Op.ROUND),
                                      f"replica refresh after {kind} (collective #{epoch})")
            self.engine.wait(call, timeout_s)

    def checkpoint(self, path, timeout_s: Optional[float] = None, *, meta=None) -> None:
        """Write every key's value exactly once into directory ``path``, atomically.

        Collective and blocking: every node calls it (one thread each) while none of its
        workers is inside a call; training may go on after it returns. The files (see
        :mod:`adapm.checkpoint`): per node a shard of the keys whose main copy it holds, with
        their values (optimizer state kept in a value is part of it), and a manifest; restore
        with ``adapm.init(..., restore=path)`` on any number of nodes. ``meta``: a JSON document
        stored in the manifest (rank 0's; read it back with ``adapm.checkpoint_meta(path)``).

        Atomic: until the new checkpoint is complete and verified, ``path`` keeps the previous
        one; a crash at any moment leaves a complete checkpoint to load, and the next
        checkpoint to ``path`` cleans up after it. Every node writes into ``<path>.partial``,
        which must be on a filesystem that all nodes share (a relative ``path`` is taken from
        each process's working directory).

        Consistency: every worker of this node is flushed as in ``shutdown`` (its pushes are in
        the main copies), sync rounds stop, the nodes meet (after which no key starts moving),
        each node writes the keys it holds as main copy, and rank 0 checks that the shards
        together hold every key exactly once; a key still on its way between two nodes shows
        as missing, and the shards are written again once it arrived. ``timeout_s`` bounds each
        wait (default: ``Config.request_timeout_s`` for flushing and for shards to settle,
        ``connect_timeout_s`` for meeting, where nodes wait for the slowest node's shard: give
        more for shards that take longer to write). Raises CheckpointError (on every node, the
        previous checkpoint left in place) when a node cannot write or the path is not a
        checkpoint directory, InvalidArgument for a bad ``path`` or ``meta``.
        """
        self._check_open("checkpoint")
        timeout_s = as_timeout(timeout_s)
        config = self.config
        writer = _checkpoint.ShardWriter(path, self.rank, self.world_size, config.num_keys,
                                         config.value_length, meta)
        writer.check_path()  # every node, before anything collective: all raise alike
        with self._workers_lock:
            workers = list(self._workers)
        for handle in workers:
            handle.wait_sync(timeout_s)  # replica updates reach their owners too
        try:
            if self.engine is not None:
                # No round starts any more, on any node once all have met: no owner decides
                # to move a key, so keys only finish moves already on their way.
                self.engine.quiesce(config.request_timeout_s)
            self._write_checkpoint(writer, timeout_s)
        finally:
            if self.engine is not None:
                self.engine.resume()

    def _write_checkpoint(self, writer: "_checkpoint.ShardWriter",
                          timeout_s: Optional[float]) -> None:
        """The collective part of :meth:`checkpoint`. Every node meets the others the same
        number of times whatever fails, and raises after the meeting that tells it; so no
        node waits for one that gave up."""
        settle_s = self.config.request_timeout_s if timeout_s is None else timeout_s
        tag = f"{self.config.rendezvous}#{self._barrier_epoch}"  # this job's this checkpoint
        # A node that cannot take part (rank 0 could not prepare the directory, another node
        # cannot see it) still meets the others until the verdict, which is then an error.
        failure: Optional[BaseException] = None
        if self.rank == 0:
            try:
                writer.prepare(tag)
            except (OSError, AdaPMError) as exc:
                failure = CheckpointError(f"rank 0: checkpoint {writer.path}: cannot prepare "
                                          f"{writer.partial}: {exc}")
                failure.__cause__ = exc
        self._meet(timeout_s)  # every node is quiet; rank 0 prepared the directory
        if failure is None:
            try:
                writer.check_prepared(tag)
            except CheckpointError as exc:
                failure = exc
                writer.report_failure(exc)
        deadline = time.monotonic() + settle_s
        attempt = 0
        while True:
            if failure is None:
                try:
                    writer.write_shard(self.store.owned_keys(), self._checkpoint_values)
                except _KeysMoved as exc:
                    writer.report_failure(exc, retry=True)
                except (OSError, AdaPMError) as exc:
                    failure = exc
                    writer.report_failure(exc)
            self._meet(timeout_s)  # every shard written
            if self.rank == 0:
                try:
                    verdict = (_checkpoint.Verdict("error", str(failure)) if failure is not None
                               else writer.verify(give_up=time.monotonic() > deadline))
                    writer.post_verdict(attempt, verdict)
                except (OSError, ValueError, AdaPMError) as exc:
                    failure = failure or exc
            self._meet(timeout_s)  # rank 0's verdict posted
            verdict = writer.read_verdict(attempt)
            if verdict.status == "error" and self.rank == 0 and failure is not None:
                # rank 0's own cause, not that its verdict could not be read back (it could
                # not write one into a directory it could not make)
                verdict = _checkpoint.Verdict("error", str(failure))
            if verdict.status == "ok":
                break
            if verdict.status != "retry":
                raise CheckpointError(f"rank {self.rank}: checkpoint {writer.path} not "
                                      f"written, the previous one is left: {verdict.message}"
                                      ) from failure
            attempt += 1
            time.sleep(_SETTLE_PAUSE_S)  # keys on their way arrive meanwhile
        self._meet(timeout_s)  # every node read the verdict: rank 0 may swap the directory
        if self.rank == 0:
            try:
                writer.commit(verdict.id)
            except (OSError, AdaPMError) as exc:
                failure = exc
        self._meet(timeout_s)  # the new checkpoint is in place (or rank 0 failed)
        if failure is not None:
            raise CheckpointError(f"rank 0: checkpoint {writer.path}: cannot put it in place: "
                                  f"{failure}") from failure
        writer.check_committed(verdict.id)

    def _meet(self, timeout_s: Optional[float]) -> None:
        self._barrier(timeout_s, refresh=False, kind="checkpoint")

    def _checkpoint_values(self, keys: np.ndarray) -> np.ndarray:
        """Packed values of ``keys`` (main copies here), in one store call."""
        out = np.empty(self.store.floats_for(keys), dtype=np.float32)
        missing = np.empty(len(keys), dtype=np.int64)
        if self.store.gather(keys, out, missing):
            raise _KeysMoved(f"rank {self.rank}: keys left this node while they were written")
        return out

    def shutdown(self, timeout_s: Optional[float] = None) -> None:
        """Flush every worker's queued operations, meet all nodes, then close. Idempotent.

        Collective: every node must call it. ``timeout_s`` bounds the whole call: the flush,
        the running round and the meeting share it (None: each waits up to its own default,
        ``request_timeout_s``, and ``connect_timeout_s`` for the nodes to meet). After it
        returns, every call on this node or its workers that reads or changes values, waits or
        meets raises StateError (``stats()`` still reads the final counters). A call another
        thread is still waiting in fails with StateError when the sockets close, at the end.
        Sockets and the engine thread are released even when flushing or meeting fails (the
        error is raised after cleanup).
        """
        if self._closed:
            return
        timeout_s = as_timeout(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        error: Optional[BaseException] = None
        try:
            with self._workers_lock:
                workers = list(self._workers)
            for handle in workers:  # replica updates reach their owners too
                handle._flush_at_shutdown(_left(deadline))
            if self.engine is not None:
                self.engine.quiesce(_left(deadline) or self.config.request_timeout_s)
            final = self._stats() if self._trace is not None else None
            self._barrier(_left(deadline), refresh=False, kind="shutdown")
            self._clean = True
        except BaseException as exc:
            error = exc
        finally:
            self._release()
        if self._trace is not None:
            try:
                self._trace.close(final if self._clean else None)
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error

    def _release(self) -> None:
        """Stop the engine thread and close every socket; unregister the node."""
        global _active
        if self._closed:
            return
        self._closed = True
        with _active_lock:
            if _active is self:
                _active = None
        if self.engine is not None:
            self.engine.stop(goodbye=self._clean)
            self.engine.fail_pending(StateError(f"rank {self.rank}: the node was shut down "
                                                f"while this call waited"))
        for transport in reversed(self.transports):  # channel 0's ZAP handler last
            # A clean shutdown lets queued messages (e.g. a barrier release) go out; errors do not wait.
            transport.close(linger_ms=1000 if self._clean else 0)
        if self._context is not None:
            self._context.term()
        if self._trace is not None and not self._clean:
            try:  # what was recorded until the failure; the writer's own error is not raised
                self._trace.close(None)
            except AdaPMError:
                pass

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StateError(f"{what}: node rank {self.rank} is shut down")
        if self.engine is not None and self.engine.error is not None:
            raise self.engine.error

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.shutdown()
        else:
            # Leaving on an error: do not wait for peers that may never come; just release.
            self._release()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<adapm.Node rank={self.rank} world_size={self.world_size} {state}>"


__all__ = ["init", "Node", "AdaPMError"]
