"""The requester side of :class:`~.state.NodeState`: sync rounds.

A round
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
barrier). When one may start, and how long quiet rounds space out, is :mod:`.pacing`'s; an
idle node holding no replicas runs no rounds at all.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .._store import OWNER
from .._wire.protocol import NO_MOVES, Encoded, Kind, Message, decode
from .events import Finish, Send
from .intents import MIN_PATIENCE_S, PATIENCE_ROUNDS, WorkerIntents
from .pacing import RoundPacer
from .stream import Event, RoundRecord
from .timing import ActionTimer, ImmediateTimer

# How long the loop may sleep when no round is due: bounds how late an idle node notices that
# a worker's clock moved (advance_clock does not wake the engine; intent() does).
CLOCK_POLL_S = 0.005
# Longest sleep while a round runs (how quickly the loop notices a stop request).
IDLE_POLL_S = 0.05
# IntentCounts.activity's bits: keys wait for changes(), a queue had intents signalled since its
# last collect, every queue is empty.
_PENDING, _FRESH, _EMPTY = 1, 2, 4


class _Round:
    """Context of a round's SYNC requests (one object for all of them): the round's keys by
    position (an answer's positions index them), and the reports' flags."""

    __slots__ = ("keys", "num_intents", "num_deltas", "flags")

    def __init__(self, keys: np.ndarray, num_intents: int, num_deltas: int,
                 flags: np.ndarray) -> None:
        self.keys = keys
        self.num_intents = num_intents
        self.num_deltas = num_deltas
        self.flags = flags


class _Waiter:
    __slots__ = ("call", "worker", "clock", "first_round")

    def __init__(self, call, worker, clock: int, first_round: int) -> None:
        self.call = call
        self.worker = worker
        self.clock = clock
        self.first_round = first_round


class Rounds:
    """Mixin of NodeState (see there for the attributes)."""

    def __init__(self) -> None:
        config = self.config
        self.worker_intents: list[WorkerIntents] = []
        self.pacer = RoundPacer(config.max_rounds_per_s)
        self.closing = False  # shutdown: start no more rounds
        self._open: set[int] = set()  # request ids of the running round
        self._forced: set[int] = set()
        self._redirected_now = False  # reports of the running round were redirected
        # Reports to send again only because their owner, or this node, deferred them (a key in
        # a worker's local sample): they do not make a round count as busy, so they wait for
        # the next round due anyway instead of keeping rounds back to back.
        self._deferred_again = 0
        self._waiters: list[_Waiter] = []
        # The workers' intent queues, for IntentCounts.activity (a tuple: replaced whole when a
        # worker registers, so the engine thread reads a consistent one).
        self._queues: tuple = ()
        self._last_clocks: list[int] = []

    # --- registration (any thread) -----------------------------------------------------------

    def register_worker(self, clock: int) -> Optional[WorkerIntents]:
        """Intents of a new worker (index = number registered before), or None when nothing
        acts on intent. Call from one thread at a time (the node does, under its lock); the
        engine thread sees it on its next round."""
        if not self.policy.runs_rounds:
            return None
        config = self.config
        if config.action_timing:
            timer = ActionTimer(config.timing_alpha, config.timing_p, config.timing_lambda0, clock)
        else:
            timer = ImmediateTimer(clock)
        intents = WorkerIntents(timer, self.store.num_keys)
        self.worker_intents.append(intents)  # list.append is atomic
        self._queues = (*self._queues, intents.queue)
        return intents

    # --- replicas held here ------------------------------------------------------------------

    # --- waiting -----------------------------------------------------------------------------

    def _add_waiter(self, call, worker, clock: int) -> None:
        """Finish ``call`` after a round that starts from now on; for ``worker`` (wait_sync),
        once its intents active at ``clock`` are served (acting on all of them at once)."""
        if worker is not None:
            self._forced.add(worker)
        self._waiters.append(_Waiter(call, worker, clock, self.pacer.started + 1))
        self.pacer.hurry()

    def poll_timeout_s(self, now: float) -> float:
        """How long the loop may sleep before the next :class:`Tick` is worth handling."""
        if not self.policy.runs_rounds or self._open or self.closing:
            return IDLE_POLL_S
        if not (self._waiters or self.directory.replica_count()) and (
                self.intents.native.activity(self._queues) & (_PENDING | _EMPTY)) == _EMPTY:
            return IDLE_POLL_S  # nothing depends on clocks; intent() wakes the loop
        wait = self.pacer.next_at - now
        return min(wait, CLOCK_POLL_S) if wait > 0 else CLOCK_POLL_S

    def poll_hold(self) -> bool:
        """Whether the loop's poll may go on waiting after the transport served a peer's SYNC
        (``Transport.poll``'s ``hold``): this node's round is open, so its answer ends the wait,
        and nothing waits for keys to arrive, so what the served SYNC left (counters, keys that
        came or left, reports to send again) can be taken up with that answer. Saves a loop
        pass per served SYNC while a round runs (most of the time in a busy job)."""
        return bool(self._open) and not self.awaiting and not self.queued

    @property
    def round_running(self) -> bool:
        """A sync round is open: its requests are not all answered (any thread; a snapshot)."""
        return bool(self._open)

    @property
    def round_started_at(self) -> Optional[float]:
        """When the running round started (the engine's clock), or None when none runs."""
        return self.pacer.start_time if self._open else None

    @property
    def rounds_started(self) -> int:
        """Rounds started so far (for error messages: the round a timeout names)."""
        return self.pacer.started

    def round_waiting_on(self) -> list[int]:
        """Ranks the running round still waits for: those holding unanswered entries of its
        requests, where the requests were passed on too (a snapshot, for error messages; any
        thread)."""
        ranks = set()
        for req_id in list(self._open):
            req = self.requests.get(req_id)
            if req is not None and req.round is not None:
                ranks.update(rank for rank, n in dict(req.at).items() if n > 0)
        return sorted(ranks)

    # --- the round ---------------------------------------------------------------------------

    def _tick(self, clocks: list[int]) -> None:
        """Start a round if none runs, one is due and one is needed."""
        if self.awaiting:  # an intent may have ended meanwhile: its keys are not coming
            self._arrived = True
        if self.sinks:
            self.clock = min(clocks) if clocks else 0
        if not self.policy.runs_rounds or self._open or self.closing:
            return
        if not self.pacer.due(self.now) or not self._round_needed(clocks):
            return
        # Quiet: nobody waits and no worker moved; stays so if the round changes nothing.
        self.pacer.start(self.now, quiet=not self._waiters and clocks == self._last_clocks)
        self._last_clocks = list(clocks)
        self._redirected_now = False
        self._post_round(self._build_round(clocks))
        self._release_all()  # moves for peers this round sends nothing to: now, alone
        if not self._open:
            self._finish_round(empty=True)

    def _round_needed(self, clocks: list[int]) -> bool:
        if self._waiters or self.directory.replica_count() or clocks != self._last_clocks:
            return True
        # Reports to send (again, if redirected), or intents signalled since the last round.
        return bool(self.intents.native.activity(self._queues) & (_PENDING | _FRESH))

    def _round_request_done(self, req_id: int) -> None:
        self._open.discard(req_id)
        if not self._open:
            self._finish_round(empty=False)

    def _post_round(self, requests: list) -> None:
        """The round's SYNCs, encoded by ``Directory.round_build`` with the moves held for
        their owners (so they go in the order a carrier's moves go), go out as they are."""
        # Where the transport serves natively, it takes an answer in itself when it needs
        # nothing of ours (native/answer_fast.c): it learns the request's entries here, and
        # counts the unanswered ones for both paths from now on (_answers_taken, _answer).
        native = self.native_answers
        rank, out, requests_open = self.rank, self._out, self.requests
        for dst, count, req_id, nbytes, frames, context in requests:
            # round_build numbered them from _next_id on, in this order
            if self._new_round_request(count, context) != req_id:
                raise AssertionError(f"rank {rank}: round request {req_id} out of order")
            requests_open[req_id].at[dst] = count
            self._open.add(req_id)
            if native:
                self.directory.round_open(req_id, context.keys, context.flags.view(np.uint8),
                                          context.num_intents, context.num_deltas, count)
            if dst == rank:  # reports for keys on their way here: handled as _post_message does
                self._local.extend(decode(frames))
            else:
                out.append(Send(dst, Encoded(Kind.SYNC, rank, req_id, frames, nbytes)))

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

    def _finish_round(self, empty: bool) -> None:
        pacer = self.pacer
        if self._redirected_now:  # reports wait for the next round: start it now
            pacer.busy()
        pacer.finish(self.now, empty)
        if self.sinks:
            record = RoundRecord(pacer.done, pacer.start_time, self.now, empty,
                                 dict(self.counters))
            for sink in self.sinks:
                sink.on_round(record)
        still = []
        for waiter in self._waiters:
            if pacer.done >= waiter.first_round and (
                    waiter.worker is None or self._intents_served(waiter.worker, waiter.clock)):
                self._out.append(Finish(waiter.call, []))
            else:
                if pacer.done >= waiter.first_round:
                    waiter.first_round = pacer.done + 1
                    pacer.hurry()
                    if waiter.worker is not None:
                        self._forced.add(waiter.worker)
                still.append(waiter)
        self._waiters = still

    def _build_round(self, clocks: list[int]) -> list:
        """This round's requests: [(owner, number of entries, request id, wire bytes, the
        SYNC's frames, _Round)].

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
        # How long a worker's intents may wait uncollected before the worker yields its core to
        # let the late round finish (WorkerIntents.behind; Worker.advance_clock).
        patience = max(MIN_PATIENCE_S, PATIENCE_ROUNDS * self.pacer.mean_s())
        for index, worker in enumerate(list(self.worker_intents)):
            clock = clocks[index] if index < len(clocks) else 0
            worker.patience_s = patience
            forced = index in self._forced
            if not forced and worker.idle(clock):
                # An app's lead worker while the others train: collecting it would change
                # nothing, so only the time of the look is kept.
                worker.collected_at = self.now
                continue
            acted, changed = intents.collect(worker, clock, force=forced)
            if changed:
                self.pacer.busy()
            self.counters["intents_acted"] += acted
        self._forced.clear()
        again, self._deferred_again = self._deferred_again, 0
        # Request ids from _next_id on, one per owner the round sends to (taken below).
        built = self.directory.round_build(intents.native, self.variant,
                                           self.policy.reports_intents, self._next_id)
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
        context = _Round(keys, reports, deltas, np.frombuffer(flags, dtype=bool))
        return [(*part, context) for part in parts]

    def _apply_sync_answer(self, context: _Round, msg: Message) -> None:
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
        context = _Round(keys, 0, n, np.empty(0, dtype=bool))
        req_id = self._new_round_request(n, context)
        self.requests[req_id].at[self.rank] = n
        self._open.add(req_id)
        self._post(self.rank, Kind.SYNC, req_id,
                   [none, none, np.empty(0, dtype=np.int8), keys, np.arange(n, dtype=np.int64),
                    rows, np.full(n, -1, dtype=np.int64), none, none, none, *NO_MOVES],
                   o=self.rank)

    def _emit_intents(self, keys: np.ndarray, has_intent: np.ndarray) -> None:
        self._emit(Event.INTENT_START, keys[has_intent])
        self._emit(Event.INTENT_STOP, keys[~has_intent])

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

    # --- queries -----------------------------------------------------------------------------

    def _intents_served(self, worker: int, clock: int) -> bool:
        """Owners have taken in every intent of ``worker`` active at ``clock``.

        An owner answers an intent report only after it sent the relocation or replica it
        decided on, over the same connection, so the keys have arrived by then. (Under
        ``relocation_only`` a key that several nodes want follows the latest of them, so it may
        have moved on again.)
        """
        return self.worker_intents[worker].served(clock, self.intents)

    def round_stats(self) -> dict:
        """``rounds``: rounds run (``empty_rounds`` of them had nothing to send);
        ``mean_round_ms``: mean time from start to last answer of the others."""
        return self.pacer.stats()
