"""The engine thread: feeds a :class:`~.state.NodeState` its events and carries out what it says.

One thread per node polls the transport (messages from peers; woken by worker threads), hands
each message, each submitted request and a periodic :class:`~.events.Tick` to
``NodeState.handle``, and carries out the instructions: messages go out bundled, one wire
message per peer per handled wire message (or submission, or tick), in the order posted — an
owner that posts a relocation before its answer delivers them in that order; finished calls wake
their worker.

Worker threads reach the engine only through :meth:`EngineLoop.submit` (a request in, a
:class:`~.events.Call` back) and :meth:`EngineLoop.wait`; they never touch sockets or the state.

A failure in this thread is not lost in a log: it is stored, every waiting call raises it (an
:class:`AdaPMError` naming this rank, ``raise ... from`` the cause), and so does every later call.

Liveness is the loop's too (:mod:`.liveness`; the state machine never sees it): heartbeats to
idle peers, a goodbye at a clean shutdown, and when a peer stays silent past
``Config.failure_timeout_s`` (dead, frozen, cut off), :class:`NodeFailure` naming it for every
call here, and a FAILED notice to the other peers so they stop with the same cause rather than
time out one by one. A sync round that waits longer than ``request_timeout_s`` fails the node
too: nothing can go on without it.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
import traceback
from typing import Optional

from .._native_loader import name_thread
from .._wire.protocol import Kind, message
from ..errors import AdaPMError, AdaPMTimeout, NodeFailure
from .events import Call, Finish, Received, Request, Submitted, Tick, handed_pushes
from .liveness import Liveness
from .posting import Outbox
from .state import CLOCK_POLL_S
from .validate import problem

_log = logging.getLogger("adapm")

_LIVENESS = frozenset({Kind.HEARTBEAT, Kind.GOODBYE, Kind.FAILED})
# How often a waiting worker checks whether the engine thread failed.
_FAILURE_CHECK_S = 0.5
# Longest time between two looks after the peers and the round's deadline.
_LOOK_S = 0.05


class EngineLoop:
    """Runs one node's engine on a background thread (the :class:`~.contracts.Engine`
    contract). ``submit``/``wait``/``wake`` are for any thread; everything else is called by the
    node."""

    def __init__(self, state, transport, request_timeout_s: float) -> None:
        self.state = state
        self.transport = transport
        self.rank = state.rank
        self.request_timeout_s = request_timeout_s
        self.error: Optional[AdaPMError] = None
        self.counters = {"late_answers": 0, "dropped_messages": 0}
        self._warned: set[int] = set()  # peers whose bad messages were logged once
        self._submissions: collections.deque = collections.deque()
        self._workers: list = []  # Worker handles, by index: their clocks go into each Tick
        self._live: set[Call] = set()  # submitted, not finished (engine thread only)
        self._outbox = Outbox()
        self._stop = threading.Event()
        self._goodbye = False  # at stop: tell the peers this node leaves on purpose
        self.liveness: Optional[Liveness] = None  # created on the engine thread
        self._final_cpu_s = 0.0  # the thread's CPU time when it ended
        self.passes = 0  # loop passes completed (quiesce waits for one that saw `closing`)
        # Until when the loop's poll sleeps (time.monotonic; inf before the first): wake()
        # leaves it asleep when it wakes by then anyway.
        self._asleep_until = math.inf
        channel = f"-c{state.channel}" if state.channel else ""  # channel 0: as ever
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"adapm-engine-{self.rank}{channel}")
        # A peer's pulls, pushes and sets of keys all owned here are served by the transport
        # in C, as the state would serve them (Transport.serve_owned): this loop never sees
        # them. A worker's pull of keys held elsewhere goes through the native I/O when it can
        # (Worker._pull_missing; native/zmq_calls.c); answers to it that reach this loop are
        # handed back there (NodeState.serve_through).
        self.native = None
        self.native_error: Optional[AdaPMError] = None  # what fail_pending failed them with
        if transport.serve_owned(state.directory):
            self.native = transport.native_io()
            state.serve_through(self.native)

    # --- any thread --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def register_worker(self, worker):
        """A new worker (the node calls this under its lock, in index order); returns the
        worker's intents queue, or None when nothing acts on intent."""
        self._workers.append(worker)
        return self.state.register_worker(worker.clock)

    def submit(self, request: Request, what: str) -> Call:
        """Hand ``request`` to the engine thread; returns the Call to :meth:`wait` on.

        Never blocks. The request's arrays belong to the engine from now on.
        """
        self.raise_if_failed()
        call = Call(what)
        self._submissions.append((call, request))
        self.transport.wake()
        if self.error is not None:  # failed meanwhile: the loop may not have seen this call
            raise self.error
        return call

    def wake(self) -> None:
        """An intent was signalled: make an idle engine look at its workers now.

        Only where that could start a round sooner. A running round is left alone: the next one
        starts as soon as it is answered, and waking the engine thread for every intent (once
        per clock) made it compete with the workers for the GIL (bench/adaptive.py: rounds took
        3-4 ms instead of ~1.8). So is a loop that sleeps until the next round may start (the
        pacing spaces rounds that sent nothing, as when every key is owned here): a wake-up per
        intent there cost the worker ~6 us of CPU a clock in GIL hand-overs and system calls,
        and the loop a pass each, for nothing. A loop that sleeps longer (nothing was pending
        when it went to sleep) is woken, once until its next pass.
        """
        state = self.state
        if not state.round_running and \
                self._asleep_until > max(state.next_round_at, time.monotonic()):
            # Woken: the intents signalled until its next pass publishes a deadline need not
            # wake it again (each did while it waited for the GIL: ~1,000 of 2,000 intents).
            # Marked before the wake, so that the deadline of the pass it causes stands.
            self._asleep_until = 0.0
            self.transport.wake()

    def wait(self, call: Call, timeout_s: Optional[float] = None,
             deadline: Optional[float] = None) -> list:
        """Block until ``call`` is finished; returns its parts or raises its error.

        AdaPMTimeout names this rank, the ranks asked and what was awaited. ``deadline``
        (time.monotonic) lets a caller share one ``timeout_s`` between calls.
        """
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        if deadline is None:
            deadline = time.monotonic() + timeout_s
        while not call.wait(min(_FAILURE_CHECK_S, max(0.0, deadline - time.monotonic()))):
            if self.error is not None:
                raise self.error
            if time.monotonic() >= deadline:
                call.abandoned = True
                raise AdaPMTimeout(self._timeout_text(call, timeout_s))
        if call.error is not None:
            raise call.error
        return call.parts

    def wait_native(self, call, timeout_s: float) -> int:
        """Block up to ``timeout_s`` (GIL released) until a call of the native I/O ends; its
        state. The engine thread routes and answers it meanwhile."""
        return call.wait(timeout_s)

    def wait_routed(self, call, timeout_s: float) -> int:
        """Block up to ``timeout_s`` until a call of the native I/O is routed; its state."""
        return call.wait_routed(timeout_s)

    def _timeout_text(self, call: Call, timeout_s: float) -> str:
        waited = call.ranks_waited_for()
        if waited:
            ranks = f"rank {waited[0]}" if len(waited) == 1 else f"ranks {waited}"
            via = " (passed on there by another node)" if call.forwarded else ""
            return (f"rank {self.rank}: no answer from {ranks}{via} to {call.what} within "
                    f"{timeout_s:g}s")
        if call.waiting_for is not None:
            return (f"rank {self.rank}: {call.what} waited {timeout_s:g}s for keys "
                    f"{call.waiting_for[:5].tolist()} whose intent this node reported; the sync "
                    f"round waits for ranks {self.state.round_waiting_on()}")
        return (f"rank {self.rank}: {call.what} not finished within {timeout_s:g}s; the sync "
                f"round waits for ranks {self.state.round_waiting_on()}")

    def cpu_seconds(self) -> float:
        """CPU time the engine thread has used so far (its own clock; any thread may ask)."""
        ident = self._thread.ident
        if ident is not None and self._thread.is_alive():
            try:
                return time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (OSError, AttributeError):  # ended meanwhile, or not a POSIX system
                pass
        return self._final_cpu_s

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def quiesce(self, timeout_s: float) -> None:
        """Start no more sync rounds; wait until the running one is answered (shutdown,
        checkpoint). Waits for a whole loop pass that began after ``closing`` was set: the pass
        running at that moment may have passed its check and be starting a round."""
        seen = self.passes
        first = seen + 2
        self.state.closing = True
        self.transport.wake()
        deadline = time.monotonic() + timeout_s
        while ((self.passes < first and self._thread.is_alive()) or self.state.round_running) \
                and self.error is None and time.monotonic() < deadline:
            if self.passes != seen:  # the next pass starts now, not after its poll timeout
                seen = self.passes
                self.transport.wake()
            time.sleep(0.001)

    def resume(self) -> None:
        """Start sync rounds again after :meth:`quiesce` (a checkpoint is done; training goes
        on). Any thread."""
        self.state.closing = False
        self.transport.wake()

    def stop(self, goodbye: bool = False) -> None:
        """End the engine thread. ``goodbye``: a clean shutdown; tell the peers, so that this
        node's silence from now on is not taken for a failure."""
        self._goodbye = goodbye
        self._stop.set()
        self.transport.wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def fail_pending(self, error: AdaPMError) -> None:
        """After :meth:`stop`: fail every call still waiting (a worker thread inside a pull
        while another thread shut the node down) at once, instead of letting it time out."""
        if self._thread.is_alive():
            return  # the engine thread still owns the calls
        if self.native is not None:
            self.native_error = error
            self.native.fail_native(str(error))
        while self._submissions:
            self._live.add(self._submissions.popleft()[0])
        for call in self._live:
            if not call.done:
                call.finish([], error)
        self._live.clear()

    # --- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        # The OS thread's name leaves out the rank (its process says it): 15 bytes at most.
        name_thread("adapm-engine" + (f"-c{self.state.channel}" if self.state.channel else ""))
        state, transport, clock = self.state, self.transport, time.monotonic
        workers, submissions = self._workers, self._submissions
        now = clock()
        liveness = self.liveness = Liveness(self.rank, state.world_size,
                                            state.config.failure_timeout_s, now)
        # When the peers and the sync round are next looked after (heartbeats, silence,
        # the round's deadline): not every pass, which cost O(peers) Python calls each.
        next_look = now
        try:
            while not self._stop.is_set():
                wait_s = state.poll_timeout_s(now)
                timeout_s = min(wait_s, next_look - now)
                self._asleep_until = now + max(timeout_s, 0.0)
                if wait_s > CLOCK_POLL_S and not state.round_running:
                    # Nothing was pending. An intent signalled while the line above looked
                    # read the old deadline in wake() and may have left the loop asleep: look
                    # again, now that the new one is published (later intents read it).
                    timeout_s = min(timeout_s, state.poll_timeout_s(now))
                    self._asleep_until = now + max(timeout_s, 0.0)
                for src, messages in transport.poll(math.ceil(max(timeout_s, 0.0) * 1000),
                                                    state.poll_hold()):
                    now = clock()
                    liveness.heard_from(src, now)
                    for msg in messages:
                        why = problem(msg, state)
                        if why is not None:
                            self._drop(msg, why)
                            continue
                        if msg.kind in _LIVENESS:
                            failure = self._liveness_message(msg)
                            if failure is not None:
                                return self._fail(failure)
                            continue
                        self._carry_out(state.handle(Received(msg), now))
                    # What this message caused goes out now, not after the whole batch: a
                    # worker may be blocked on it (bench/adaptive.py: from post to send took
                    # ~1.1 ms on average when sends waited for the end of the pass, ~0.65 ms so).
                    if self._outbox:
                        self._flush(now)
                now = clock()
                if self.native is not None:  # before submissions: they may follow these
                    self._take_handoffs(now)
                while submissions:
                    call, request = submissions.popleft()
                    self._live.add(call)
                    self._carry_out(state.handle(Submitted(call, request), now))
                self._carry_out(state.handle(Tick([w.clock for w in workers]), now))
                if self._outbox:
                    self._flush(now)
                if now >= next_look:
                    failure = self._look_after_peers(now)
                    if failure is not None:
                        return self._fail(failure)
                    # Sends since only postpone heartbeats, so looking again then is early
                    # enough; the round's deadline and silent peers are checked at least every
                    # _LOOK_S.
                    next_look = now + min(liveness.next_look_s(now), _LOOK_S)
                self.passes += 1
            if self._goodbye:
                self._broadcast(message(Kind.GOODBYE, self.rank, 0))
            self._final_cpu_s = time.thread_time()
        except BaseException as exc:  # surfaces in callers' threads, not only in a log
            error = AdaPMError(f"rank {self.rank}: communication thread failed: {exc!r}\n"
                               + traceback.format_exc())
            error.__cause__ = exc
            self._fail(error)

    def _take_handoffs(self, now: float) -> None:
        """Workers' pushes the transport could not route (a key on its way here, one whose
        intent this node reported and whose owner has not answered): submitted to the state
        machine as the worker would have."""
        for event in handed_pushes(self.native):
            self._live.add(event.call)
            self._carry_out(self.state.handle(event, now))

    def _fail(self, error: AdaPMError) -> None:
        """End the loop with ``error``: every waiting call raises it, and every later one."""
        self._final_cpu_s = time.thread_time()
        self.error = error
        if self.native is not None:  # workers waiting in a native pull wake and raise it
            self.native.fail_native(str(error))
        submissions = self._submissions
        while submissions:
            self._live.add(submissions.popleft()[0])
        for call in self._live:
            call.finish([], error)
        self._live.clear()

    def _drop(self, msg, why: str) -> None:
        """A message unfit to handle: counted, logged once per sender, otherwise ignored."""
        self.counters["dropped_messages"] += 1
        if msg.src not in self._warned:
            self._warned.add(msg.src)
            _log.warning("rank %d: dropped a %s from rank %d: %s (further bad messages from it "
                         "are only counted: stats()['dropped_messages'])", self.rank,
                         msg.kind.name, msg.src, why)

    def _in_progress(self) -> str:
        whats = sorted({call.what for call in list(self._live)})
        if not whats:
            return "no call was waiting"
        more = f" and {len(whats) - 3} more" if len(whats) > 3 else ""
        return "waiting: " + "; ".join(whats[:3]) + more

    def _look_after_peers(self, now: float) -> Optional[AdaPMError]:
        """Heartbeats to idle peers; the error that ends this node, if a peer is silent too
        long or the sync round hangs."""
        liveness = self.liveness
        if self.native is not None:
            # What the transport sent itself (answers, pulls, pushes, rounds' SYNCs), and whom
            # it heard from through requests it served itself: noted there, read here.
            for dst, sent in enumerate(self.native.sent_at()):
                liveness.sent_to(dst, sent)
            for src, heard in enumerate(self.native.heard_at()):
                liveness.heard_until(src, heard)
        for dst in liveness.heartbeats_due(now):
            self.transport.send(dst, [message(Kind.HEARTBEAT, self.rank, 0)])
            liveness.sent_to(dst, now)
        silent = liveness.failed(now)
        if silent is not None:
            rank, seconds = silent
            what = self._in_progress()
            text = (f"rank {self.rank}: rank {rank} failed: nothing came from it for "
                    f"{seconds:.1f}s (failure_timeout_s={liveness.timeout_s:g}); {what}")
            # The failed rank too: if it was only frozen (SIGSTOP, a long swap), it learns on
            # waking that the job stopped because of it, rather than blame a healthy peer
            # whose engine has stopped meanwhile.
            self._broadcast(message(Kind.FAILED, self.rank, 0, r=rank, msg=text))
            return NodeFailure(text, rank, what)
        state = self.state
        started = state.round_started_at
        if started is not None and now - started > self.request_timeout_s:
            return AdaPMTimeout(f"rank {self.rank}: sync round #{state.rounds_started} not "
                                f"answered within {self.request_timeout_s:g}s by ranks "
                                f"{state.round_waiting_on()}")
        return None

    def _liveness_message(self, msg) -> Optional[NodeFailure]:
        """A heartbeat (nothing to do: hearing from the peer was the point), a goodbye, or a
        peer's notice that a rank failed (the error that ends this node)."""
        if msg.kind == Kind.GOODBYE:
            self.liveness.said_goodbye(msg.src)
        elif msg.kind == Kind.FAILED:
            rank = msg.header.get("r")
            rank = rank if type(rank) is int else -1
            what = self._in_progress()
            if rank == self.rank:
                return NodeFailure(f"rank {self.rank}: rank {msg.src} declared this node failed "
                                   f"(was this process stopped, starved or cut off?): "
                                   f"{str(msg.header.get('msg'))[:500]}; here, {what}", rank, what)
            return NodeFailure(f"rank {self.rank}: rank {rank} failed, as rank {msg.src} "
                               f"found: {str(msg.header.get('msg'))[:500]}; here, {what}",
                               rank, what)
        return None

    def _broadcast(self, msg, but=()) -> None:
        """``msg`` to every peer still here (best effort: this node is leaving or failing)."""
        for dst in self.liveness.peers:
            if dst in but or dst in self.liveness.gone:
                continue
            try:
                self.transport.send(dst, [msg])
            except AdaPMError:
                pass

    def _carry_out(self, instructions: list) -> None:
        for ins in self._outbox.carry(instructions):
            self._finish(ins)

    def _finish(self, ins: Finish) -> None:
        call = ins.call
        self._live.discard(call)
        if call.abandoned:
            self.counters["late_answers"] += 1
        call.finish(ins.parts, ins.error)

    def _flush(self, now: float) -> None:
        round_peers, peers = self._outbox.flush(self.transport)
        if self.native is None:  # else the native I/O noted the round's sends (sent_at)
            peers += round_peers
        liveness = self.liveness
        for dst in peers:
            liveness.sent_to(dst, now)
