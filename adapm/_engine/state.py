"""One node's engine state and its only entry point, ``NodeState.handle(event, now)``.

The state is everything the protocol knows on a node: the store's directory (which keys are held
here, as main copy or replica), the native directory (routing, epochs, and the owner's per-key
intent and replica sets that the management :mod:`~.policy` decides on), this node's intents
(:mod:`~.intents`), the requests this node is waiting on, the requests waiting here for keys on
their way, and the sync round. ``handle`` takes one event (a message arrived, a worker submitted
a request, time passed) and returns instructions (send a message, finish a worker's call). It
does no I/O and reads no clock: time comes with each event. So the same code runs behind the
ZeroMQ loop, and in one test thread for many simulated nodes with a chosen message order
(:mod:`.sim`). The store's values are read and written here too (serving, relocations,
replicas), under the store's own per-key locks, while worker threads read and write them
directly.

**Owner side.** Every keyed request (pull, push, set, and a sync round's intent reports,
replica deltas and version checks) carries the keys and their positions in the origin's
request. A node serves the keys it owns and answers the origin directly (with those positions);
forwards keys it does not own to the next hop (``Directory.next_hop``); and holds keys that are
in flight *to* it in a queue, serving them when they arrive (requests wait where the key is
going instead of bouncing). Forward pointers always lead to a newer owner, so forwarding cannot
loop; a hop limit turns any bug into a loud error instead. Most of it runs in C before this
object sees it (the transport serves SYNCs and owned requests: native/sync_fast.h,
native/serve_wire.h); what is here is what those fast paths leave.

**Requester side: sync rounds.** A round

1. collects every worker's intents (the action timer decides which to act on now),
2. reports to owners, per key, the node's intent state where it changed (0→1, 1→0); a replica
   whose intent ended is dropped here first and its last delta goes along (nothing is lost),
3. sends every replica's accumulated delta or, if it has none, its version to the owner, which
   merges and answers with the new value only where the replica is behind,
4. groups all of that per destination node: one SYNC message per node (sections: intent
   reports, deltas, version checks), and none to nodes with nothing to say,
5. completes when every position of every request is answered (answers may come from the node
   a request was forwarded to). An intent report sent to a node that no longer owns the key
   comes back with where to send it: the key's location hint is corrected and the report,
   still not taken in, goes with the next round, which then starts at once, together with
   everything else that round has for the same owner (a report redirected to this node, whose
   key came with the answer, is decided here at once).

A round starts only when one is needed: a worker's clock moved or it signalled intents, a
replica is held here (deltas and checks), or someone waits (``wait_sync``, the refresh after a
barrier). When one may start, and how long quiet rounds space out, is :mod:`.pacing`'s; whom a
round lets go, :mod:`.waiters`'; an idle node holding no replicas runs no rounds at all.

Pure parts live beside this object: :mod:`.posting` (where messages go, moves first),
:mod:`.pacing`, :mod:`.waiters`, :mod:`.collectives` (rank 0's barriers), :mod:`.validate`
(what a received message must be before it gets here).
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import numpy as np

from .._native_loader import load as _load_native
from .._store import NONE, OWNER, REPLICA
from .._wire.protocol import (
    ANSWERS, CARRIERS, KEYED, NATIVE_REQUESTS, NO_MOVES, Kind, Message, decode, message,
    subset, widened,
)
from ..errors import PeerError, StateError
from . import native, routing
from .collectives import Collectives
from .events import Call, Op, Received, Request, Submitted, Tick
from .intents import NodeIntents, WorkerIntents
from .outstanding import Outstanding, Requests, RoundContext
from .pacing import RoundPacer
from .policy import make_policy
from .posting import Posting
from .routing import group_by_node
from .stream import Event, RoundRecord
from .validate import problem
from .waiters import Waiters

_log = logging.getLogger("adapm")

_native = _load_native()

# How long the loop may sleep when no round is due: bounds how late an idle node notices that
# a worker's clock moved (advance_clock does not wake the engine; intent() does).
CLOCK_POLL_S = 0.005
# Longest sleep while a round runs (how quickly the loop notices a stop request).
IDLE_POLL_S = 0.05
# IntentCounts.activity's bits: keys wait for changes(), a queue had intents signalled since its
# last collect, every queue is empty.
_PENDING, _FRESH, _EMPTY = 1, 2, 4

# Counters kept by the state (stats() reads a copy); every name exists from the start so that a
# copy taken from another thread never sees the dict change size.
COUNTERS = ("late_answers", "relocations_in", "relocations_out", "replica_setups",
            "replica_setups_discarded", "replica_drops", "replica_drops_at_owner",
            "forwarded_keys", "redirected_keys", "returned_deltas", "queued_keys", "awaited_keys",
            "intents_acted", "dropped_local_messages", "deferred_reports")

_DIRECTORY_VIEW = (("hint", np.int32), ("forward", np.int32), ("epoch", np.int64),
                   ("home_owner", np.int32), ("home_epoch", np.int64), ("intent", np.uint64),
                   ("replicas", np.uint64))


class NodeState:
    """See the module docstring. Not thread-safe: one thread calls ``handle``; other threads
    may read ``counters`` and ``stats()`` (snapshots), and call the methods that say so."""

    # --- set-up (before the engine runs) ---------------------------------------------------------

    def __init__(self, rank: int, world_size: int, store, config, channel: int = 0) -> None:
        """``channel``: which of the node's ``config.channels`` this state runs; it sees only
        that channel's keys (:func:`~.routing.channel_of`), over the store's share of them."""
        self.rank = rank
        self.world_size = world_size
        self.channel = channel
        self.store = store
        self.config = config
        self.policy = make_policy(config.management)
        # Routing (hints, forward pointers, the home table), epochs and the owner's masks (for
        # the variants that act on intent) live in the native directory, which serves SYNCs.
        self.variant = self.policy.variant  # native/policy.h; -1: no masks
        masks = self.variant >= 0
        self.directory = _native.Directory(store.native, rank, world_size, masks,
                                           average=config.replica_updates == "average",
                                           channel=channel)
        self.intents = NodeIntents(store.num_keys) if self.policy.runs_rounds else None
        if masks and self.intents is not None:  # an owner's own bit of S may be a told flag
            self.directory.use_counts(self.intents.native)
        self.posting = Posting(rank, self.directory)
        self.requests = Requests()
        self.queued: list[Message] = []  # keyed requests for keys on their way here
        self.awaiting: list[Message] = []  # own requests for keys whose intent was reported
        self.collectives = Collectives(world_size)  # rank 0 gathers the nodes' collectives
        self.counters = dict.fromkeys(COUNTERS, 0)
        # Keys of this node's workers' pushes and sets that their worker found missing (and
        # counted as remote) but that were applied here: held for keys on their way here, or
        # the keys arrived before the request was routed. [push keys, set keys]; stats() moves
        # them from the remote to the local counts (own_updates_served_here).
        self._own_updates_here = [0, 0]
        self.max_hops = 4 * world_size
        self.now = 0.0
        self._arrived = False  # keys came in: retry what waits for them
        self._scratch_buffer = np.empty(1024, dtype=np.int64)
        self.sinks: list = []  # event stream subscribers (see .stream)
        # The transport's native I/O when workers' pulls go through it: the answers to those
        # pulls that reach this object are handed back to it (_answer). See serve_through.
        self.native_calls = None
        # The transport serves and takes in what it can itself: the round's requests are
        # registered with the directory, which may take their answers in. See serve_through.
        self.native_answers = False
        # At the last Tick, while a sink listens: the smallest clock of the workers that advanced
        # theirs (one that never does, as the apps' for evaluation, would pin it at 0).
        self.clock = 0
        self.worker_intents: list[WorkerIntents] = []
        self.pacer = RoundPacer(config.max_rounds_per_s)
        self.waiters = Waiters()
        self.closing = False  # shutdown: start no more rounds
        self._open: set[int] = set()  # request ids of the running round
        self._redirected_now = False  # reports of the running round were redirected
        # Reports to send again only because their owner, or this node, deferred them (a key in
        # a worker's local sample): they do not make a round count as busy, so they wait for
        # the next round due anyway instead of keeping rounds back to back.
        self._deferred_again = 0
        # The workers' intent queues, for IntentCounts.activity (a tuple: replaced whole when a
        # worker registers, so the engine thread reads a consistent one).
        self._queues: tuple = ()
        self._last_clocks: list[int] = []
        # A transport that can serve a peer's SYNC itself does (native/sync_fast.h; what it leaves
        # for this object is taken up at the next event, _native_served).
        self.directory.serve_syncs(self.variant,
                                   self.intents.native if self.intents is not None else None)

    def serve_through(self, native_calls=None) -> None:
        """The transport serves what the native fast paths take (its ``serve_owned`` was given
        ``self.directory`` and said yes; native/serve_wire.h, for ZeroMQ and the simulator's
        in-process transport alike) and takes answers to this node's rounds in itself.
        ``native_calls``: the transport's native I/O that workers' pulls and pushes go through
        (``ZmqIO``), or None. Call before the engine runs."""
        self.native_answers = True
        self.native_calls = native_calls

    def replicate_everything(self, read=None) -> None:
        """``full_replication``: hold a replica of every key homed elsewhere, in sync with its
        owner as of now (version 0; staleness counts from here). ``read(keys)``: their values
        (a checkpoint being restored), zeros without. Call before the engine runs."""
        others = np.setdiff1d(np.arange(self.store.num_keys, dtype=np.int64),
                              self.store.local_keys(), assume_unique=True)
        if self.config.channels > 1:  # this channel's
            others = others[routing.channel_of(others, self.world_size, self.config.channels)
                            == self.channel]
        values = read(others) if read is not None else None
        self.store.insert(others, REPLICA, values, synced_at=time.monotonic())
        self.directory.replicas_added(others)

    def register_worker(self, clock: int) -> Optional[WorkerIntents]:
        """Intents of a new worker (index = number registered before), or None when nothing
        acts on intent. Call from one thread at a time (the node does, under its lock); the
        engine thread sees it on its next round."""
        if not self.policy.runs_rounds:
            return None
        intents = WorkerIntents.configured(self.config, clock, self.store.num_keys)
        self.worker_intents.append(intents)  # list.append is atomic
        self._queues = (*self._queues, intents.queue)
        return intents

    def subscribe(self, sink) -> None:
        """Report events to ``sink`` from now on (an :class:`~.stream.EventSink`). Any thread
        (list.append is atomic); the sink is called on the engine thread. The transport stops
        serving SYNCs itself first (their events would pass this object by); one it is serving
        at this moment is not reported."""
        self.directory.serve_syncs(None)
        self.sinks.append(sink)

    # --- the entry point -------------------------------------------------------------------------

    def handle(self, event, now: float) -> list:
        """Take one event; return the instructions it causes (Send, Finish), in order.

        Messages this node posts to itself are handled before returning, after the event, in
        the order posted. An exception means a broken invariant or a peer's bad message: the
        node cannot go on (the loop fails every waiting call with it)."""
        self.now = now
        self.posting.out = []
        taken = self.directory.native_taken()
        if taken is not None:  # SYNCs the transport served since the last event
            self._native_served(*taken)
            if self._arrived:
                # Requests that waited for keys which came meanwhile go on before this event: a
                # worker's pull submitted now must not be served ahead of its earlier push.
                self._arrived = False
                self._retry_awaiting()
        kind = type(event)
        if kind is Received:
            self._dispatch(event.message)
        elif kind is Submitted:
            self._submitted(event.call, event.request)
        elif kind is Tick:
            self._tick(event.clocks)
            if not self._open:  # during a round, moves wait for a carrier (see .posting)
                self.posting.release_all()
        else:
            raise TypeError(f"not an engine event: {event!r}")
        while self.posting.local or self._arrived:
            while self.posting.local:
                msg = self.posting.local.popleft()
                # An answer to itself carries what the peer that passed the request back put
                # in it: checked as any received message.
                why = problem(msg, self, local=True)
                if why is None:
                    self._dispatch(msg)
                else:
                    self._drop_local(msg, why)
            if self._arrived:
                self._arrived = False
                self._retry_awaiting()
        return self.posting.take()

    def _dispatch(self, msg: Message) -> None:
        kind = msg.kind
        if kind in CARRIERS:  # moves first: a relocation before the answer that reports it
            self._moves_in(msg)
            if kind == Kind.MOVES:
                return
        if kind in ANSWERS:
            self._answer(msg)
        elif kind == Kind.FORWARDED:
            self._forwarded(msg)
        elif kind in KEYED:
            self._keyed(msg)
        elif kind == Kind.BARRIER:
            self._serve_barrier(msg.src, msg.req_id, msg.header["e"], msg.header.get("t"))
        else:
            raise StateError(f"rank {self.rank}: unexpected {kind.name} from rank {msg.src}")

    def _drop_local(self, msg: Message, why: str) -> None:
        self.counters["dropped_local_messages"] += 1
        if self.counters["dropped_local_messages"] == 1:  # once: a peer could cause many
            _log.warning("rank %d: dropped a %s it posted to itself: %s (further ones are only "
                         "counted: stats()['dropped_messages'])", self.rank, msg.kind.name, why)

    def _moves_in(self, msg: Message) -> None:
        moves = msg.moves()
        if moves[0] is NO_MOVES[0]:  # the decoder's empties: nothing moved (the usual case)
            return
        self._take_moves(msg.src, moves)

    # --- requests of this node's workers ---------------------------------------------------------

    def _submitted(self, call: Call, request: Request) -> None:
        op = request.op
        if op in (Op.PULL, Op.PUSH, Op.SET):
            kind = Kind(int(op))  # Op and Kind share the numbers of the keyed requests
            keys, positions = request.keys, request.positions
            req_id = self.requests.add(Outstanding(call, len(keys), keys, positions,
                                                   clock=request.clock))
            arrays = [keys, positions] if op == Op.PULL else [keys, positions, request.rows]
            self._route_own(message(kind, self.rank, req_id, arrays, o=self.rank))
        elif op == Op.BARRIER:
            req_id = self.requests.add(Outstanding(call, 1))
            if self.rank == 0:
                self._serve_barrier(0, req_id, request.epoch, request.tag)
            else:
                call.waiting_on[0] = 1
                self.posting.post(0, Kind.BARRIER, req_id, e=request.epoch, t=request.tag)
        elif op in (Op.WAIT_SYNC, Op.AWAIT_INTENT, Op.ROUND):
            if not self.policy.runs_rounds:
                self.posting.finish(call, [])
            else:
                self._add_waiter(call, None if op == Op.ROUND else request.worker,
                                 request.clock)
        else:
            raise StateError(f"rank {self.rank}: unknown request {op!r}")

    def _route_own(self, msg: Message, retry: bool = False) -> None:
        """A worker's keyed request: serve what is here now, hold what is on its way here, send
        the rest to where we believe its owner is (one native pass, ``Directory.route_own``,
        says which keys go where). ``retry``: it waited for keys in flight (counted then).

        A replica serves pulls and pushes (its delta goes to the owner with the next round); a
        set goes to the main copy. A key whose intent this node reported, and whose owner has
        not answered yet, comes with that answer (the owner answers only after sending it,
        relocation or replica): the request waits here for it rather than chase it
        (bench/adaptive.py: most late pulls were forwarded back to their origin)."""
        counts = self.intents.native if self.intents is not None else None
        here, coming, queued, groups = self.directory.route_own(
            msg.arrays[0], msg.kind == Kind.SET, counts)
        if here is True:
            self._serve(msg)
            return
        store = self.store
        if len(here):
            self._serve(subset(msg, here, store))
        if len(coming):
            self.awaiting.append(subset(msg, coming, store))
            if not retry:
                self.counters["awaited_keys"] += len(coming)
            self.requests[msg.req_id].call.waiting_for = msg.arrays[0][coming]
        if len(queued):  # on its way here (a relocation we have not received yet)
            self.queued.append(subset(msg, queued, store))
            self.counters["queued_keys"] += len(queued)
        if not groups:
            return
        at = self.requests[msg.req_id].at
        n = len(msg.arrays[0])
        for peer, index in groups:
            part = msg if len(index) == n else subset(msg, index, store)
            at[peer] = at.get(peer, 0) + len(index)
            self.posting.post_message(peer, part)

    def _retry_awaiting(self) -> None:
        """Keys arrived, or reports were answered: go on with own requests that waited.

        A request none of whose keys came yet (and all still in flight) keeps waiting as it is:
        keys arrive in several messages per round, and each arrival retries every waiting
        request (bench/adaptive.py, 2 nodes: ~3 retries per round, most of them for nothing).
        """
        awaiting, self.awaiting = self.awaiting, []
        store, intents = self.store, self.intents
        for msg in awaiting:
            if msg.req_id not in self.requests:
                continue
            keys = msg.arrays[0]
            if (store.states(keys) == NONE).all() and intents.in_flight(keys).all():
                self.awaiting.append(msg)
            else:
                self._route_own(msg, retry=True)

    def _add_waiter(self, call, worker, clock: int) -> None:
        """Finish ``call`` after a round that starts from now on; for ``worker`` (wait_sync),
        once its intents active at ``clock`` are served (acting on all of them at once)."""
        self.waiters.add(call, worker, clock, self.pacer.started + 1)
        self.pacer.hurry()

    # --- the owner side: serve, forward, queue ---------------------------------------------------

    def _keyed(self, msg: Message) -> None:
        """A keyed request: serve what is owned here, forward or queue the rest."""
        if msg.kind == Kind.SYNC:
            self._sync(msg)
            return
        keys = msg.keys()
        owned = self.store.states(keys) == OWNER
        if owned.all():
            self._serve(msg)
            return
        rest_index = np.flatnonzero(~owned)
        if len(rest_index) < len(keys):
            self._serve(subset(msg, np.flatnonzero(owned), self.store))
        self._pass_on(msg, rest_index, np.frombuffer(
            self.directory.next_hop(keys[rest_index]), dtype=np.int64))

    def _sync(self, msg: Message) -> None:
        """A sync round's request, served in one native pass (``Directory.serve_sync``, its
        reference in numpy is in tests/test_directory.py): deltas merged first (a dropped
        replica's last delta is in before its key can move), replicas answered with the version
        and, where behind, the value, then intent reports decided on; the answer is posted
        after the moves the decision causes, so the origin receives those first.

        Entries for keys not owned here: an intent report is answered with where to report it
        (the next hop): the origin reports it there with its next round, one message per owner,
        not one forward per misrouted report (bench/adaptive.py, 4 nodes: ~12 forwarded SYNC
        messages per node and round, half of them forwarded again). A delta or check for a key
        that went to the origin itself (it crossed the relocation) goes back in the answer,
        which carries the relocation too. A key on its way here waits here; other deltas and
        checks are forwarded (a delta must reach the owner)."""
        answer, decision, rest_index, rest_hop = self.directory.serve_sync(
            self.variant, msg.header["o"], *msg.arrays[:10])
        if decision is not None:
            self._decided(decision)
        if answer is not None:
            arrays = answer
            if len(arrays[5]):  # redirects to this node: reports deferred (keys pinned here)
                self.counters["deferred_reports"] += int(np.count_nonzero(arrays[5] == self.rank))
            self.posting.post(msg.header["o"], Kind.SYNC_RESP, msg.req_id, [*arrays, *NO_MOVES])
        if rest_index is not None:
            self._pass_on(widened(msg, self.store), np.frombuffer(rest_index, dtype=native.KEYS),
                          np.frombuffer(rest_hop, dtype=native.KEYS))

    def _pass_on(self, msg: Message, rest_index: np.ndarray, nxt: np.ndarray) -> None:
        """The entries at ``rest_index`` of a keyed request are not owned here: wait here for
        those on their way here (``nxt`` -1), forward the others to ``nxt``."""
        if not len(rest_index):
            return
        rest = subset(msg, rest_index, self.store)
        here = np.flatnonzero(nxt < 0)
        if len(here):
            self.queued.append(subset(rest, here, self.store))
            self.counters["queued_keys"] += len(here)
        onward = np.flatnonzero(nxt >= 0)
        if not len(onward):
            return
        hops = rest.header.get("h", 0) + 1  # forwards so far, this one included
        if hops > self.max_hops:
            keys = rest.keys()
            self.posting.post(rest.header["o"], Kind.ERROR, rest.req_id,
                              msg=f"routing loop: keys {keys[onward[:5]].tolist()} "
                                  f"passed {hops} nodes (last rank {self.rank})")
            return
        ranks, counts = [], []
        for dst, positions in group_by_node(nxt[onward]):
            part = subset(rest, onward[positions], self.store)
            part.header["h"] = hops
            part.header["s"] = part.src = self.rank
            self.counters["forwarded_keys"] += len(positions)
            self.posting.post_message(dst, part)
            ranks.append(dst)
            counts.append(len(positions))
        # The origin learns whom it waits for now (a timeout names that rank, not this one).
        self.posting.post(rest.header["o"], Kind.FORWARDED, rest.req_id,
                          [np.array(ranks, dtype=np.int64), np.array(counts, dtype=np.int64)])

    def _native_served(self, counters: dict, arrived: bool, relocated_in: bool,
                       answered: tuple) -> None:
        """What the SYNCs the transport served, and the answers it took in, without Python
        (native/sync_fast.h, native/answer_fast.c) leave for this object: the counters; where
        keys arrived, the requests that wait for them go on (as :meth:`_take_moves` would);
        then the round requests answered (``answered``: :meth:`_answers_taken`). (The local
        sampler's pool followed the store in C.)"""
        mine = self.counters
        for name, value in counters.items():
            mine[name] += value
        if relocated_in and self.queued:
            self._retry_queued()
        if arrived:
            self._arrived = True
        if len(answered[0]) or answered[1] or answered[2] or answered[3]:
            self._answers_taken(*answered)

    def _retry_queued(self) -> None:
        """Keys arrived: serve (or pass on) what waited for them."""
        queued, self.queued = self.queued, []
        for msg in queued:
            self._keyed(msg)

    def _serve(self, msg: Message) -> None:
        """Serve a pull, push or set all of whose keys are owned here."""
        kind, origin = msg.kind, msg.header["o"]
        keys, positions = msg.arrays[0], msg.arrays[1]
        store = self.store
        if kind == Kind.PULL:
            values = np.empty(store.floats_for(keys), dtype=np.float32)
            self._expect_none_missing(store.gather(keys, values, self._scratch(len(keys))))
            self.posting.post(origin, Kind.PULL_RESP, msg.req_id, [positions, values])
        elif kind in (Kind.PUSH, Kind.SET):
            values = msg.arrays[2]
            scatter = store.scatter_add if kind == Kind.PUSH else store.scatter_set
            self._expect_none_missing(scatter(keys, values, self._scratch(len(keys))))
            if origin == self.rank:  # counted as remote by its worker, applied here
                self._own_updates_here[kind == Kind.SET] += len(keys)
            self.posting.post(origin, Kind.ACK, msg.req_id, [positions])
        else:
            raise ValueError(f"not a keyed request: {kind.name}")

    def _expect_none_missing(self, nmiss: int) -> None:
        if nmiss:
            # Only the engine removes keys, and it checked ownership just before.
            raise AssertionError(f"rank {self.rank}: {nmiss} owned keys vanished while serving")

    # --- carrying out the policy's decisions -----------------------------------------------------

    def _decided(self, decision: tuple) -> None:
        """What a native decision (``serve_sync``, ``round_build``, ``redirected``; each runs
        native/directory.c's ``dir_decide_*``, whose numpy reference is in
        tests/engine_reference.py) did: its moves are held for the peers in the directory
        already (``take_moves``); here the keys that left are counted (and reported to the
        event stream)."""
        dropped, relocated, per_rank = decision
        self.counters["replica_drops_at_owner"] += dropped
        if relocated is None:
            return
        keys = np.frombuffer(relocated, dtype=native.KEYS)
        self.counters["relocations_out"] += len(keys)
        if self.sinks:
            count = np.frombuffer(per_rank, dtype=native.KEYS)
            ends = np.cumsum(count)
            for dst in np.flatnonzero(count):
                self._emit(Event.DEALLOC, keys[ends[dst] - count[dst]:ends[dst]], int(dst))

    def _take_moves(self, src: int, moves) -> None:
        """A carrier's moves from ``src`` (its 12 move arrays), in one native pass
        (``Directory.moves_in``): keys relocated here (a replica held here is promoted: its
        unsent updates are added to the value that came; others are inserted; masks, epochs,
        hints and the home table change in the same pass), replicas from their owner that
        this node still wants, and home updates."""
        counts = self.intents.native if self.intents is not None else None
        got = self.directory.moves_in(src, moves, counts, self.now)
        if got is None:
            return
        relocated, taken, discarded = got
        taken = np.frombuffer(taken, dtype=native.KEYS)
        counters = self.counters
        counters["relocations_in"] += len(relocated)
        counters["replica_setups"] += len(taken)
        counters["replica_setups_discarded"] += discarded
        if self.sinks:
            if len(relocated):
                self._emit(Event.ALLOC, relocated, src)
            if len(taken):
                self._emit(Event.REPLICA_SETUP, taken, src)
        if len(relocated) or len(taken):
            self._arrived = True
        if len(relocated) and self.queued:
            self._retry_queued()

    # --- answers ---------------------------------------------------------------------------------

    def _answer(self, msg: Message) -> None:
        req = self.requests.get(msg.req_id)
        if req is None:
            if msg.req_id >= NATIVE_REQUESTS and self.native_calls is not None:
                # A worker's pull or push sent by the transport (native/zmq_calls.c), whose
                # answer came this way (with other messages, or after one of its sender's that
                # did).
                text = (f"rank {self.rank}: rank {msg.src} could not serve a request: "
                        f"{msg.header.get('msg')}" if msg.kind == Kind.ERROR else None)
                if self.native_calls.native_answer(int(msg.kind), msg.req_id, msg.src,
                                                   msg.arrays, text, True) is not False:
                    return
            # Only a request this node gave up on can be answered after it was complete.
            self.counters["late_answers"] += 1
            return
        if msg.kind == Kind.ERROR:
            del self.requests[msg.req_id]  # validate.py: never a sync round's request
            error = PeerError(f"rank {self.rank}: rank {msg.src} could not serve "
                              f"{req.call.what}: {msg.header.get('msg')}")
            self.posting.finish(req.call, [], error)
            return
        if msg.kind == Kind.BARRIER_RELEASE:
            req.remaining = 0
        else:
            positions = msg.arrays[0]
            answered = len(positions)
            if msg.kind == Kind.SYNC_RESP:  # redirected reports, returned deltas and checks
                answered += len(msg.arrays[4]) + len(msg.arrays[6])
            left = self.directory.round_answered(msg.req_id, answered) \
                if req.round is not None else None  # see _post_round
            req.remaining = req.remaining - answered if left is None else left
            req.at[msg.src] = req.at.get(msg.src, 0) - answered
            if req.remaining < 0:
                raise StateError(f"rank {self.rank}: request {msg.req_id} answered twice "
                                 f"(last part from rank {msg.src})")
            if req.round is not None:
                self._apply_sync_answer(req.round, msg)
            else:
                if msg.src != self.rank and len(positions):
                    keys = req.keys[np.searchsorted(req.positions, positions)]
                    self.directory.learn(keys, msg.src)
                    if self.sinks:
                        self._emit(Event.REMOTE_ACCESS, keys, msg.src, req.clock)
                req.parts.append(msg)
        if req.remaining <= 0:
            del self.requests[msg.req_id]
            if req.round is not None:
                self._round_request_done(msg.req_id)
            else:
                self.posting.finish(req.call, req.parts)

    def _forwarded(self, msg: Message) -> None:
        """Entries of a request of ours were passed on by ``msg.src``: note where they are now
        (an answer may have come first, on another connection: counts can dip below zero for a
        while, and only positive ones name a rank)."""
        req = self.requests.get(msg.req_id)
        if req is None:
            if msg.req_id >= NATIVE_REQUESTS and self.native_calls is not None:
                self.native_calls.native_answer(int(msg.kind), msg.req_id, msg.src, msg.arrays,
                                                None, True)
            return  # answered already, or given up on
        at = req.at
        ranks, counts = msg.arrays
        at[msg.src] = at.get(msg.src, 0) - int(counts.sum())
        for rank, count in zip(ranks.tolist(), counts.tolist()):  # one per next hop: a few
            at[rank] = at.get(rank, 0) + count
        if req.call is not None:
            req.call.forwarded = True

    def _answers_taken(self, answers: np.ndarray, refreshed: bool, deferred_again: int,
                       redirected_now: bool) -> None:
        """Answers to this node's round requests that the transport took in itself
        (``Directory.native_taken``; what :meth:`_apply_sync_answer` does is done): a
        (request, answering rank, entries) triple each; whether a replica was refreshed; and
        :meth:`_redirected`'s bookkeeping of their redirected reports. A request with nothing
        left unanswered is done."""
        if refreshed:
            self.pacer.busy()
        self._deferred_again += deferred_again
        self._redirected_now = self._redirected_now or redirected_now
        for req_id, src, n in answers.reshape(-1, 3).tolist():
            req = self.requests.get(req_id)
            if req is None:  # not reached: taken in only while the request is open
                continue
            req.remaining -= n
            req.at[src] = req.at.get(src, 0) - n
            if req.remaining <= 0:
                del self.requests[req_id]
                self._round_request_done(req_id)

    def _apply_sync_answer(self, context: RoundContext, msg: Message) -> None:
        """A (partial) SYNC_RESP: intent reports taken in or redirected; replicas' versions and
        values. What concerns keys of the round is one native pass
        (``Directory.apply_answer``); reports redirected and deltas returned are rare."""
        positions, versions, refresh_positions, values, moved, ranks, back, rows = msg.arrays[:8]
        keys = context.keys
        if len(moved):
            self._redirected(keys[moved], context.flags[moved], ranks, msg.src)
        if len(back):
            deltas = back[back < context.num_intents + context.num_deltas]
            if len(deltas):
                self._returned(keys[deltas], rows)
        reports = self.directory.apply_answer(
            keys, context.flags.view(np.uint8), context.num_intents, msg.src, positions,
            versions, refresh_positions, values, self.intents.native, self.now)
        if reports:
            self._arrived = True
            if self.sinks:
                reported = positions[positions < context.num_intents]
                self._emit_intents(keys[reported], context.flags[reported])
        if len(refresh_positions):
            self.pacer.busy()

    def _redirected(self, keys: np.ndarray, flags: np.ndarray, ranks: np.ndarray,
                    src: int) -> None:
        """Intent reports that went to a node that does not own the keys; ``ranks``: where it
        says they are. Keys owned here by now (the relocation came with the answer) are decided
        at once; the rest are reported again by the next round (to the corrected hint), which
        starts at once, unless ``src`` only deferred them (a redirect to itself: a worker there
        uses the key now; see ``SYNC_REDIRECT`` in native/directory.h): those go with the next
        round that is due anyway (an extra round for each deferral doubled the rounds of a
        2-node KGE run and slowed its epochs). One native pass (``Directory.redirected``)."""
        self.counters["redirected_keys"] += len(keys)
        deferred, again, owned_keys, owned_flags, decision = self.directory.redirected(
            keys, flags.view(np.uint8), ranks, src, self.intents.native, self.variant)
        if len(owned_keys):
            if decision is not None:
                self._decided(decision)
            self._arrived = True
            if self.sinks:
                self._emit_intents(np.frombuffer(owned_keys, dtype=np.int64),
                                   np.frombuffer(owned_flags, dtype=bool))
        if again:
            self._deferred_again += deferred
            self._redirected_now = self._redirected_now or again > deferred

    def _returned(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Replica deltas for ``keys`` came back: their owner had relocated them to this node
        (the relocation came with or before the answer). Applied here where this node owns the
        keys; sent on where they moved on since (version checks that came back need nothing:
        the replica is gone)."""
        store = self.store
        self.counters["returned_deltas"] += len(keys)
        owned = store.states(keys) == OWNER
        if owned.any():
            mine = keys[owned]
            missing = store.scatter_add(mine, store.select_rows(rows, keys, owned),
                                        self._scratch(len(mine)))
            self._expect_none_missing(missing)
        if owned.all():
            return
        # Moved on: a SYNC of this round to this node, which forwards the deltas (an answer's
        # version -1 is never taken for a replica's: these keys are not replicas here).
        keys, rows = keys[~owned], store.select_rows(rows, keys, ~owned)
        n = len(keys)
        none = np.empty(0, dtype=np.int64)
        context = RoundContext(keys, 0, n, np.empty(0, dtype=bool))
        req_id = self.requests.add_round(n, context)
        self.requests[req_id].at[self.rank] = n
        self._open.add(req_id)
        self.posting.post(self.rank, Kind.SYNC, req_id,
                          [none, none, np.empty(0, dtype=np.int8), keys,
                           np.arange(n, dtype=np.int64), rows, np.full(n, -1, dtype=np.int64),
                           none, none, none, *NO_MOVES],
                          o=self.rank)

    # --- sync rounds -----------------------------------------------------------------------------

    def _tick(self, clocks: list[int]) -> None:
        """Start a round if none runs, one is due and one is needed."""
        if self.awaiting:  # an intent may have ended meanwhile: its keys are not coming
            self._arrived = True
        if self.sinks:
            self.clock = min((c for c in clocks if c), default=0)
        if not self.policy.runs_rounds or self._open or self.closing:
            return
        if not self.pacer.due(self.now) or not self._round_needed(clocks):
            return
        # Quiet: nobody waits and no worker moved; stays so if the round changes nothing.
        self.pacer.start(self.now, quiet=not self.waiters and clocks == self._last_clocks)
        self._last_clocks = list(clocks)
        self._redirected_now = False
        self._post_round(self._build_round(clocks))
        self.posting.release_all()  # moves for peers this round sends nothing to: now, alone
        if not self._open:
            self._finish_round(empty=True)

    def _round_needed(self, clocks: list[int]) -> bool:
        if self.waiters or self.directory.replica_count() or clocks != self._last_clocks:
            return True
        # Reports to send (again, if redirected), or intents signalled since the last round.
        return bool(self.intents.native.activity(self._queues) & (_PENDING | _FRESH))

    def _build_round(self, clocks: list[int]) -> list:
        """This round's requests: [(owner, number of entries, request id, wire bytes, the
        SYNC's frames, RoundContext)].

        Each worker's intents are collected (the action timer says which to act on now); the
        rest is one native pass (``Directory.round_build``): the keys whose intent state
        changed are reported, except an ended intent for a key a worker here has pinned (its
        local sample, not pushed yet; NodeState.sample_pins), which is reported with the next
        round (the report would drop a replica, or relocate an owned key, under the worker's
        push, which would then go remote); keys owned here are decided at once, without a
        message to itself (bench/adaptive.py: most reports are about a node's own keys); a
        replica whose intent ended is dropped and its last delta travels with the report; the
        other replicas send their delta or version; all grouped by owner (hint)."""
        intents = self.intents
        acted, changed = intents.collect_all(list(self.worker_intents), clocks,
                                             self.waiters.take_forced(), self.now,
                                             self.pacer.mean_s())
        if changed:
            self.pacer.busy()
        self.counters["intents_acted"] += acted
        again, self._deferred_again = self._deferred_again, 0
        # Request ids from next_id on, one per owner the round sends to (taken below).
        # Someone waits for this round (wait_sync: every push merged): every delta in float32;
        # else replicas' deltas go as bfloat16, what rounding leaves following later.
        built = self.directory.round_build(intents.native, self.variant,
                                           self.policy.reports_intents, self.requests.next_id,
                                           bool(self.waiters))
        if built is None:
            return []  # nothing to report or to sync: no array work (an idle round)
        (deferred, told_keys, told_flags, decided, decision, reports, drop_keys, deltas, parts,
         keys, flags) = built
        self._deferred_again += deferred
        if decision is not None:
            self._decided(decision)
        if decided:
            self._arrived = True
        if self.sinks and len(told_keys):
            self._emit_intents(np.frombuffer(told_keys, dtype=np.int64),
                               np.frombuffer(told_flags, dtype=bool))
        if reports > again or deltas:
            self.pacer.busy()
        if len(drop_keys):
            self.counters["replica_drops"] += len(drop_keys)
            if self.sinks:
                self._emit(Event.REPLICA_DROP, drop_keys)
        if not parts:
            return []
        context = RoundContext(keys, reports, deltas, np.frombuffer(flags, dtype=bool))
        return [(*part, context) for part in parts]

    def _post_round(self, requests: list) -> None:
        """The round's SYNCs, encoded by ``Directory.round_build`` with the moves held for
        their owners, go out as they are, one :class:`~.events.SendRound` for all peers."""
        # Where the transport serves natively, it takes an answer in itself when it needs
        # nothing of ours (native/answer_fast.c): it learns the requests' entries here (one
        # call a round), and counts the unanswered ones for both paths from now on.
        rank, outstanding, opened = self.rank, self.requests, self._open
        parts, native, context = [], [], None
        for dst, count, req_id, nbytes, frames, context in requests:
            # round_build numbered them from next_id on, in this order
            if outstanding.add_round(count, context) != req_id:
                raise AssertionError(f"rank {rank}: round request {req_id} out of order")
            outstanding[req_id].at[dst] = count
            opened.add(req_id)
            native.append((req_id, count))
            if dst == rank:  # reports for keys on their way here: handled as posted ones are
                self.posting.local.extend(decode(frames))
            else:
                parts.append((dst, req_id, frames, nbytes))
        if self.native_answers and native:
            self.directory.round_open(native, context.keys, context.flags.view(np.uint8),
                                      context.num_intents, context.num_deltas)
        if parts:
            self.posting.send_round(parts)

    def _round_request_done(self, req_id: int) -> None:
        self._open.discard(req_id)
        if not self._open:
            self._finish_round(empty=False)

    def _finish_round(self, empty: bool) -> None:
        pacer = self.pacer
        if self._redirected_now:  # reports wait for the next round: start it now
            pacer.busy()
        pacer.finish(self.now, empty)
        if self.sinks:
            record = RoundRecord(pacer.done, pacer.start_time, self.now, empty,
                                 dict(self.counters), self.channel)
            for sink in self.sinks:
                sink.on_round(record)
        finished, again = self.waiters.round_done(pacer.done, self._intents_served)
        for call in finished:
            self.posting.finish(call, [])
        if again:
            pacer.hurry()

    def _intents_served(self, worker: int, clock: int) -> bool:
        """Owners have taken in every intent of ``worker`` active at ``clock``.

        An owner answers an intent report only after it sent the relocation or replica it
        decided on, over the same connection, so the keys have arrived by then. (Under
        ``relocation_only`` a key that several nodes want follows the latest of them, so it may
        have moved on again.)"""
        return self.worker_intents[worker].served(clock, self.intents)

    # --- barrier (rank 0 counts arrivals) --------------------------------------------------------

    def _serve_barrier(self, src: int, req_id: int, epoch: int, tag) -> None:
        """Rank 0: ``src`` arrived at collective ``epoch`` of kind ``tag`` (:mod:`.collectives`
        decides whom to release or fail)."""
        answer, error = self.collectives.arrive(src, req_id, epoch, tag)
        for rank, req in answer:
            if error is None:
                self.posting.post(rank, Kind.BARRIER_RELEASE, req, e=epoch)
            else:
                self.posting.post(rank, Kind.ERROR, req, msg=error)

    # --- helpers ---------------------------------------------------------------------------------

    def _scratch(self, n: int) -> np.ndarray:
        """Room for the missing positions of a store call (the engine expects none)."""
        if len(self._scratch_buffer) < n:
            self._scratch_buffer = np.empty(max(n, 2 * len(self._scratch_buffer)), dtype=np.int64)
        return self._scratch_buffer

    def _emit(self, event: Event, keys: np.ndarray, peer: int = -1, clock=None) -> None:
        """To every sink. Callers check ``self.sinks`` first, so that off costs one check."""
        clock = self.clock if clock is None else clock
        for sink in self.sinks:
            sink.on_keys(event, keys, self.now, clock, peer)

    def _emit_intents(self, keys: np.ndarray, has_intent: np.ndarray) -> None:
        self._emit(Event.INTENT_START, keys[has_intent])
        self._emit(Event.INTENT_STOP, keys[~has_intent])

    # --- queries (any thread; snapshots) ---------------------------------------------------------

    def replicas_held(self) -> int:
        """Replicas held here (of keys owned elsewhere)."""
        return self.directory.replica_count()

    def moves_held(self) -> bool:
        """Relocations, replica set-ups or home updates wait here for a message to a peer
        (the engine thread's view; for the simulator's check that nothing is left)."""
        return bool(self.directory.held_peers())

    def held_moves(self) -> dict:
        """Takes the moves held for every peer: {rank: the 12 move arrays} (tests; engine
        thread)."""
        return self.posting.take_held()

    def memory(self) -> dict:
        """The engine's metadata beside the store: ``directory`` (records, bytes; the home
        table included) and ``intent_counts`` (records, bytes; (0, 0) when nothing acts on
        intent)."""
        counts = self.intents.native.memory() if self.intents is not None else (0, 0)
        return {"directory": tuple(self.directory.memory()), "intent_counts": tuple(counts)}

    def sample_pins(self):
        """``repin(release, take)`` for this node's workers (any thread): the keys of a local
        sample a worker pulled and has not pushed yet are pinned, and a key does not leave
        while pinned: a report that would relocate it is answered "report again" (native
        ``dir_sync_plan``), and the end of this node's intent for a pinned replica is reported
        a round later (:meth:`_build_round`); else the push would go remote (most of KGE's
        remote accesses once). None for the variants that do not act on intent."""
        return self.directory.repin if self.variant >= 0 else None

    def held_draw(self):
        """``draw(bit_generator, pool, out, rounds) -> int`` for the ``local`` sampler: ``out``
        drawn among the pool's keys that stay, each pinned as kept (``Directory.draw_held``;
        any thread, the generator's lock held). None for the variants that do not pin."""
        counts = self.intents.native if self.intents is not None else None
        return None if self.variant < 0 else lambda bitgen, pool, out, rounds: \
            self.directory.draw_held(bitgen, pool.keys, pool.counter, counts, out, rounds)

    def staying(self, keys: np.ndarray) -> np.ndarray:
        """Per key (bool): held here and not about to leave on this node's own account: owned
        (and no peer's report on it deferred for a pin, see :meth:`sample_pins`), or a replica
        this node still has acted-on intent for (one without is dropped by the next round).
        Any thread (a snapshot). The ``local`` sampler draws only these, so a sampled key's
        push stays local (with the pins), and a key a peer waits for is not pinned anew."""
        # One native pass (Directory.staying); without intent counts every replica stays.
        counts = self.intents.native if self.intents is not None else None
        return np.frombuffer(self.directory.staying(keys, counts), dtype=bool)

    def directory_view(self) -> dict:
        """The native directory as dense numpy arrays (copies; for tests and inspection, not
        for hot paths): ``hint``, ``forward`` (int32), ``epoch`` (int64) per key;
        ``home_owner`` (int32), ``home_epoch`` (int64) per key homed here, by key //
        world_size; ``intent``, ``replicas`` (uint64, ceil(world_size / 64) words per key)."""
        return {name: np.frombuffer(b, dtype=dtype)
                for (name, dtype), b in zip(_DIRECTORY_VIEW, self.directory.dense())}

    @property
    def round_running(self) -> bool:
        """A sync round is open: its requests are not all answered (any thread; a snapshot)."""
        return bool(self._open)

    @property
    def round_started_at(self) -> Optional[float]:
        """When the running round started (the engine's clock), or None when none runs."""
        return self.pacer.start_time if self._open else None

    @property
    def next_round_at(self) -> float:
        """No round starts before this (time.monotonic; the pacing's; any thread, a
        snapshot): until then a woken loop could start none."""
        return self.pacer.next_at

    @property
    def rounds_started(self) -> int:
        """Rounds started so far (for error messages: the round a timeout names)."""
        return self.pacer.started

    def round_waiting_on(self) -> list[int]:
        """Ranks the running round still waits for: those holding unanswered entries of its
        requests, where the requests were passed on too (a snapshot, for error messages; any
        thread)."""
        return self.requests.ranks_waited_for(self._open)

    def poll_timeout_s(self, now: float) -> float:
        """How long the loop may sleep before the next :class:`Tick` is worth handling."""
        if not self.policy.runs_rounds or self._open or self.closing:
            return IDLE_POLL_S
        if not (self.waiters or self.directory.replica_count()) and (
                self.intents.native.activity(self._queues) & (_PENDING | _EMPTY)) == _EMPTY:
            return IDLE_POLL_S  # nothing depends on clocks; intent() wakes the loop
        wait = self.pacer.next_at - now
        return min(wait, CLOCK_POLL_S) if wait > 0 else CLOCK_POLL_S

    def poll_hold(self) -> bool:
        """Whether the loop's poll may go on waiting after the transport served a peer's SYNC
        or took in an answer that leaves others of this round outstanding (``Transport.poll``'s
        ``hold``): this node's round is open, so its last answer ends the wait, and nothing
        waits for keys to arrive, so what the served SYNC or the earlier answers left
        (counters, keys that came or left, reports to send again) can be taken up with it.
        Saves a loop pass per served SYNC while a round runs (most of the time in a busy job),
        and one per answer but the last (4 nodes, KGE: 2.2-2.5 passes per round -> 1.9-2.1)."""
        return bool(self._open) and not self.awaiting and not self.queued

    def barrier_missing(self, epoch: int) -> list[int]:
        """Ranks that have not arrived at barrier ``epoch`` (rank 0; a snapshot)."""
        return self.collectives.missing(epoch)

    def own_updates_served_here(self) -> tuple[int, int]:
        """(push keys, set keys) of this node's workers that the worker counted as remote and
        that were applied here after all (any thread; each count only grows, and only after the
        worker counted the keys)."""
        push, set_ = self._own_updates_here
        if self.native_calls is not None:  # pushes the transport routed (ZmqIO.push)
            push += self.native_calls.pushed_here()
        return push, set_

    def stats(self) -> dict:
        out = dict(self.counters)
        out.update(self.round_stats())
        return out

    def round_stats(self) -> dict:
        """``rounds``: rounds run (``empty_rounds`` of them had nothing to send);
        ``mean_round_ms``: mean time from start to last answer of the others."""
        return self.pacer.stats()
