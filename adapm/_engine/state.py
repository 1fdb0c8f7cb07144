"""One node's engine state and its only entry point, ``NodeState.handle(event, now)``.

The state is everything the protocol knows on a node: the store's directory (which keys are held
here, as main copy or replica), the native directory (routing, epochs, and the owner's per-key
intent and replica sets that the management :mod:`~.policy` decides on), this node's intents (:mod:`~.intents`), the
requests this node is waiting on, the requests waiting here for keys on their way, and the sync
round. ``handle`` takes one event (a message arrived, a worker submitted a request, time passed)
and returns instructions (send a message, finish a worker's call). It does no I/O and reads no
clock: time comes with each event. So the same code runs behind the ZeroMQ loop, and in one test
thread for many simulated nodes with a chosen message order (:mod:`.sim`).

The store's values are read and written here too (serving, relocations, replicas), under the
store's own per-key locks, while worker threads read and write them directly.

Split over three modules by role: this one (dispatch, requests, answers, barrier),
:mod:`.serve` (the owner side: serve, forward, queue, relocate, replicate) and :mod:`.rounds`
(the requester side: intents, replica deltas and version checks, waiters).
"""

from __future__ import annotations

import collections
import logging
import time

import numpy as np

from .._native_loader import load as _load_native
from .._store import NONE, REPLICA
from .._wire.protocol import (
    ANSWERS, CARRIERS, KEYED, MOVE_SECTIONS, NATIVE_REQUESTS, Kind, Message, message, subset,
)
from .._wire.protocol import NO_MOVES as _NO_MOVES
from ..errors import PeerError, StateError
from .events import Call, Finish, Op, Received, Request, Send, Submitted, Tick
from .collectives import Collectives
from .intents import NodeIntents
from .policy import make_policy
from .rounds import Rounds
from .stream import Event
from .serve import Serving
from .validate import problem

_log = logging.getLogger("adapm")

_native = _load_native()


class Outstanding:
    """A request this node sent and waits on. ``call`` is None for a sync round's requests.

    ``keys``/``positions``: what a worker's request asked for, by position in the worker's call
    (positions ascend), so an answer's positions name the keys it answers for. ``at``: rank ->
    entries unanswered there (the call's ``waiting_on``; for error messages only).
    """

    __slots__ = ("call", "remaining", "keys", "positions", "parts", "round", "clock", "at")

    def __init__(self, call, remaining: int, keys=None, positions=None, round=None,
                 clock: int = 0) -> None:
        self.call = call
        self.clock = clock  # the worker's clock when it asked (for the event stream)
        self.remaining = remaining
        self.keys = keys
        self.positions = positions
        self.parts: list[Message] = []
        self.round = round
        self.at: dict[int, int] = call.waiting_on if call is not None else {}


# Counters kept by the state (stats() reads a copy); every name exists from the start so that a
# copy taken from another thread never sees the dict change size.
COUNTERS = ("late_answers", "relocations_in", "relocations_out", "replica_setups",
            "replica_setups_discarded", "replica_drops", "replica_drops_at_owner",
            "forwarded_keys", "redirected_keys", "returned_deltas", "queued_keys", "awaited_keys",
            "intents_acted", "dropped_local_messages", "deferred_reports")


_MOVE_ROLES = [role for section in MOVE_SECTIONS for role in section]
_DIRECTORY_VIEW = (("hint", np.int32), ("forward", np.int32), ("epoch", np.int64),
                   ("home_owner", np.int32), ("home_epoch", np.int64), ("intent", np.uint64),
                   ("replicas", np.uint64))


class NodeState(Serving, Rounds):
    """See the module docstring. Not thread-safe: one thread calls ``handle``; other threads
    may read ``counters`` and ``stats()`` (snapshots)."""

    def __init__(self, rank: int, world_size: int, store, config) -> None:
        self.rank = rank
        self.world_size = world_size
        self.store = store
        self.config = config
        self.policy = make_policy(config.management)
        # Routing (hints, forward pointers, the home table), epochs and the owner's masks (only
        # for the variants that act on intent) live in the native directory, which serves
        # SYNCs, decides and relocates over them and the store.
        self.variant = self.policy.variant  # native/policy.h; -1: no masks
        masks = self.variant >= 0
        self.directory = _native.Directory(store.native, rank, world_size, masks,
                                           average=config.replica_updates == "average")
        self.intents = NodeIntents(store.num_keys) if self.policy.runs_rounds else None
        if masks and self.intents is not None:  # an owner's own bit of S may be a told flag
            self.directory.use_counts(self.intents.native)
        self.requests: dict[int, Outstanding] = {}
        self._next_id = 1
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
        self._local: collections.deque[Message] = collections.deque()
        self._out: list = []
        self._arrived = False  # keys came in: retry what waits for them
        self._scratch_buffer = np.empty(1024, dtype=np.int64)
        self.sinks: list = []  # event stream subscribers (see .stream)
        # The transport's native I/O when workers' pulls go through it: the answers to those
        # pulls that reach this object are handed back to it (_answer). See serve_through.
        self.native_calls = None
        # The transport serves and takes in what it can itself: the round's requests are
        # registered with the directory, which may take their answers in. See serve_through.
        self.native_answers = False
        self.clock = 0  # smallest worker clock at the last Tick (kept while a sink listens)
        Rounds.__init__(self)
        # A transport that can serve a peer's SYNC itself does (native/sync_fast.h; what it leaves
        # for this object is taken up at the next event, _native_served).
        self.directory.serve_syncs(self.variant,
                                   self.intents.native if self.intents is not None else None)

    # --- set-up (before the engine runs) -----------------------------------------------------

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
        values = read(others) if read is not None else None
        self.store.insert(others, REPLICA, values, synced_at=time.monotonic())
        self.directory.replicas_added(others)

    # --- queries (any thread; snapshots) -----------------------------------------------------

    def replicas_held(self) -> int:
        """Replicas held here (of keys owned elsewhere)."""
        return self.directory.replica_count()

    def moves_held(self) -> bool:
        """Relocations, replica set-ups or home updates wait here for a message to a peer
        (the engine thread's view; for the simulator's check that nothing is left)."""
        return bool(self.directory.held_peers())

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
        a round later (:meth:`_build_round`). Before, such keys left between the worker's pull
        and its push, which then went remote: most of KGE's remote accesses. The key still
        goes where it is wanted, a round or so later (an earlier try gave the other node a
        replica instead, and the staleness of those replicas cost KGE quality). None for the
        variants that do not act on intent."""
        return self.directory.repin if self.variant >= 0 else None

    def staying(self, keys: np.ndarray) -> np.ndarray:
        """Per key (bool): held here and not about to leave on this node's own account: owned,
        or a replica this node still has acted-on intent for (one without is dropped by the
        next round). Any thread (a snapshot: the store's states and the intent counts are
        safe to read while the engine works). The ``local`` sampler draws only these, so a
        sampled key's push stays local (with the pins of :meth:`sample_pins`)."""
        # One native pass (Directory.staying); replicas of every key (full replication, no
        # intent counts) never go.
        counts = self.intents.native if self.intents is not None else None
        return np.frombuffer(self.directory.staying(keys, counts), dtype=bool)

    def directory_view(self) -> dict:
        """The native directory as dense numpy arrays (copies; for tests and inspection, not
        for hot paths): ``hint``, ``forward`` (int32), ``epoch`` (int64) per key;
        ``home_owner`` (int32), ``home_epoch`` (int64) per key homed here, by key //
        world_size; ``intent``, ``replicas`` (uint64, ceil(world_size / 64) words per key)."""
        return {name: np.frombuffer(b, dtype=dtype)
                for (name, dtype), b in zip(_DIRECTORY_VIEW, self.directory.dense())}

    # --- the event stream --------------------------------------------------------------------

    def subscribe(self, sink) -> None:
        """Report events to ``sink`` from now on (an :class:`~.stream.EventSink`). Any thread
        (list.append is atomic); the sink is called on the engine thread. The transport stops
        serving SYNCs itself first (their events would pass this object by); one it is serving
        at this moment is not reported."""
        self.directory.serve_syncs(None)
        self.sinks.append(sink)

    def _emit(self, event: Event, keys: np.ndarray, peer: int = -1, clock=None) -> None:
        """To every sink. Callers check ``self.sinks`` first, so that off costs one check."""
        clock = self.clock if clock is None else clock
        for sink in self.sinks:
            sink.on_keys(event, keys, self.now, clock, peer)

    # --- the entry point ---------------------------------------------------------------------

    def handle(self, event, now: float) -> list:
        """Take one event; return the instructions it causes (Send, Finish), in order.

        Messages this node posts to itself are handled before returning, after the event, in
        the order posted. An exception means a broken invariant or a peer's bad message: the
        node cannot go on (the loop fails every waiting call with it).
        """
        self.now = now
        out = self._out = []
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
            if not self._open:  # during a round, moves wait for a carrier (see _post_message)
                self._release_all()
        else:
            raise TypeError(f"not an engine event: {event!r}")
        while self._local or self._arrived:
            while self._local:
                msg = self._local.popleft()
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
        self._out = []
        return out

    def _drop_local(self, msg: Message, why: str) -> None:
        self.counters["dropped_local_messages"] += 1
        if self.counters["dropped_local_messages"] == 1:  # once: a peer could cause many
            _log.warning("rank %d: dropped a %s it posted to itself: %s (further ones are only "
                         "counted: stats()['dropped_messages'])", self.rank, msg.kind.name, why)

    # --- posting -----------------------------------------------------------------------------

    def _post(self, dst: int, kind: Kind, req_id: int, arrays=(), **fields) -> None:
        self._post_message(dst, message(kind, self.rank, req_id, arrays, **fields))

    def _post_message(self, dst: int, msg: Message) -> None:
        if dst == self.rank:
            self._local.append(msg)
        elif msg.kind in CARRIERS:
            moves = self.directory.take_moves(dst)
            if moves is not None:  # the moves held for dst ride along
                msg.arrays[-len(_MOVE_ROLES):] = moves
            self._out.append(Send(dst, msg))
        else:
            self._release(dst)  # moves for dst go first
            self._out.append(Send(dst, msg))

    def _release(self, dst: int) -> None:
        """Send the moves held for ``dst`` on their own (one MOVES message).

        A decision's relocations, replica set-ups and home updates are held per peer in the
        native directory (native/outbox.h) and wait for a message that carries them: every
        round exchanges a SYNC and a SYNC_RESP with each peer it has business with, so a
        relocation or replica decided while serving a peer's SYNC goes out with the answer, and
        home updates with the next round's SYNC (bench/adaptive.py, 2 nodes: ~5.5 messages per
        node and round when each kind went on its own, one after the other). Held moves for a
        peer always go before any other message to it (a relocation before the answer that
        reports it, before a request forwarded to the new owner); and when a round starts, or
        at a Tick with no round running, whatever waits goes alone, so nothing waits longer
        than a round.
        """
        moves = self.directory.take_moves(dst)
        if moves is not None:
            self._out.append(Send(dst, message(Kind.MOVES, self.rank, 0, moves)))

    def _release_all(self) -> None:
        for dst in self.directory.held_peers():
            self._release(dst)

    def held_moves(self) -> dict:
        """Takes the moves held for every peer: {rank: the 12 move arrays} (tests, and the
        simulator's check that nothing is left to send)."""
        return {dst: list(self.directory.take_moves(dst)) for dst in self.directory.held_peers()}

    def _scratch(self, n: int) -> np.ndarray:
        """Room for the missing positions of a store call (the engine expects none)."""
        if len(self._scratch_buffer) < n:
            self._scratch_buffer = np.empty(max(n, 2 * len(self._scratch_buffer)), dtype=np.int64)
        return self._scratch_buffer

    def _new_request(self, outstanding: Outstanding) -> int:
        req_id = self._next_id
        self._next_id += 1
        self.requests[req_id] = outstanding
        return req_id

    def _new_round_request(self, count: int, context) -> int:
        return self._new_request(Outstanding(None, count, round=context))

    # --- dispatch ----------------------------------------------------------------------------

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

    def _moves_in(self, msg: Message) -> None:
        moves = msg.moves()
        if moves[0] is _NO_MOVES[0]:  # the decoder's empties: nothing moved (the usual case)
            return
        self._take_moves(msg.src, moves)

    # --- requests of this node's workers -----------------------------------------------------

    def _submitted(self, call: Call, request: Request) -> None:
        op = request.op
        if op in (Op.PULL, Op.PUSH, Op.SET):
            kind = Kind(int(op))  # Op and Kind share the numbers of the keyed requests
            keys, positions = request.keys, request.positions
            req_id = self._new_request(Outstanding(call, len(keys), keys, positions,
                                                   clock=request.clock))
            arrays = [keys, positions] if op == Op.PULL else [keys, positions, request.rows]
            self._route_own(message(kind, self.rank, req_id, arrays, o=self.rank))
        elif op == Op.BARRIER:
            req_id = self._new_request(Outstanding(call, 1))
            if self.rank == 0:
                self._serve_barrier(0, req_id, request.epoch, request.tag)
            else:
                call.waiting_on[0] = 1
                self._post(0, Kind.BARRIER, req_id, e=request.epoch, t=request.tag)
        elif op in (Op.WAIT_SYNC, Op.ROUND):
            if not self.policy.runs_rounds:
                self._out.append(Finish(call, []))
            else:
                self._add_waiter(call, request.worker if op == Op.WAIT_SYNC else None,
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
            self._post_message(peer, part)

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

    # --- answers -----------------------------------------------------------------------------

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
            self._out.append(Finish(req.call, [], error))
            return
        if msg.kind == Kind.BARRIER_RELEASE:
            req.remaining = 0
        else:
            positions = msg.arrays[0]
            answered = len(positions)
            if msg.kind == Kind.SYNC_RESP:  # redirected reports, returned deltas and checks
                answered += len(msg.arrays[4]) + len(msg.arrays[6])
            left = self.directory.round_answered(msg.req_id, answered) \
                if req.round is not None else None  # see Rounds._post_round
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
                self._out.append(Finish(req.call, req.parts))

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

    # --- barrier (rank 0 counts arrivals) ----------------------------------------------------

    def _serve_barrier(self, src: int, req_id: int, epoch: int, tag) -> None:
        """Rank 0: ``src`` arrived at collective ``epoch`` of kind ``tag`` (:mod:`.collectives`
        decides whom to release or fail)."""
        answer, error = self.collectives.arrive(src, req_id, epoch, tag)
        for rank, req in answer:
            if error is None:
                self._post(rank, Kind.BARRIER_RELEASE, req, e=epoch)
            else:
                self._post(rank, Kind.ERROR, req, msg=error)

    def barrier_missing(self, epoch: int) -> list[int]:
        """Ranks that have not arrived at barrier ``epoch`` (rank 0; a snapshot)."""
        return self.collectives.missing(epoch)

    # --- statistics --------------------------------------------------------------------------

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

