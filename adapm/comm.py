"""The communication thread: owns the sockets, serves peers, runs the sync rounds.

One thread does all of it, so the directory (which keys live here), the owner decisions and the
round state change in one place, in message order, without locks. Worker threads never block
this thread and never touch its sockets: they register a :class:`Pending` under a fresh request
id, hand the request over through their :class:`~adapm.transport.Client`, and wait on the
Pending with a timeout. Answers to one request may come in parts, from different nodes (a request
can be split and forwarded); each part names the positions it answers.

Sending: the communication thread *posts* messages. Messages to this node are dispatched after
the current message, in order, without encoding; messages to a peer wait in an outbox and go in
one ZeroMQ message per peer once the message (or round start) that caused them is handled, in
the order posted: an owner that posts a relocation before its answer delivers them in that order.

A failure in this thread is not lost in a log: it is stored, every waiting call raises it (an
:class:`AdaPMError` naming this rank, ``raise ... from`` the cause), and so does every later call.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import traceback
from typing import Callable, Optional

import numpy as np

from . import routing
from .errors import AdaPMError, AdaPMTimeout, PeerError, StateError
from .owner import Owner
from .protocol import ANSWERS, KEYED, Kind, Message, decode, message
from .store import OWNER, Store
from .sync import IDLE_POLL_MS, SyncLoop
from .transport import Transport, unpack_prefix



class Pending:
    """One request awaiting its answers. Completed by the communication thread.

    ``remaining`` counts the positions still unanswered; ``parts`` collects the answer messages
    (their arrays stay valid: they are views of frames the message keeps alive).
    ``on_part``, if given, is called on the communication thread for each part instead.
    """

    __slots__ = ("event", "parts", "remaining", "error", "dst", "what", "on_part", "internal")

    def __init__(self, dst: int, what: str, count: int,
                 on_part: Optional[Callable[[Message], None]] = None, internal=False) -> None:
        self.event = threading.Event()
        self.parts: list[Message] = []
        self.remaining = count
        self.error: Optional[BaseException] = None
        self.dst = dst
        self.what = what
        self.on_part = on_part
        self.internal = internal

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.event.set()


class Comm:
    """Runs the communication loop of one node on a background thread."""

    def __init__(self, rank: int, world_size: int, transport: Transport, store: Store,
                 config) -> None:
        self.rank = rank
        self.world_size = world_size
        self.transport = transport
        self.store = store
        self.request_timeout_s = config.request_timeout_s
        self.pending: dict[int, Pending] = {}
        self._ids = itertools.count(1)
        self.error: Optional[AdaPMError] = None
        self._stop = threading.Event()
        self._barrier_waiting: dict[int, list[tuple[int, int]]] = {}  # rank 0: epoch -> waiters
        self.counters = {"late_answers": 0, "replica_drops_at_owner": 0}
        # Where we believe each key's owner is: a hint, corrected by every answer.
        self.hint = routing.home_of(np.arange(store.num_keys, dtype=np.int64),
                                    world_size).astype(np.int32)
        self._scratch = np.empty(1024, dtype=np.int64)
        # Notified whenever keys may have arrived (relocation, replica, answered intent report);
        # workers wait on it for keys on their way here (Worker._await_arrivals).
        self.arrivals = threading.Condition()
        self._local: collections.deque[Message] = collections.deque()  # posted to this node
        self._outbox: dict[int, list] = {}  # peer -> [Message or (kind, encoded frames)]
        self.owner = Owner(self, config.management)
        self.sync: Optional[SyncLoop] = (
            None if config.management == "static_partition" else SyncLoop(self, config))
        self._thread = threading.Thread(target=self._run, name=f"adapm-comm-{rank}", daemon=True)

    # --- used by other threads ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def new_request(self, dst: int, what: str, count: int) -> tuple[int, Pending]:
        """Register a request (before sending it, so that its answer always finds it)."""
        self.raise_if_failed()
        req_id = next(self._ids)
        pending = Pending(dst, what, count)
        self.pending[req_id] = pending
        return req_id, pending

    def wait(self, req_id: int, pending: Pending, timeout_s: Optional[float] = None,
             deadline: Optional[float] = None) -> list[Message]:
        """Block until every part has arrived; returns the parts.

        AdaPMTimeout names this rank, the peer and what was awaited. ``deadline``
        (time.monotonic) lets a caller share one ``timeout_s`` between requests.
        """
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        if deadline is None:
            deadline = time.monotonic() + timeout_s
        # Wake up now and then to notice a failed communication thread.
        while not pending.event.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
            if self.error is not None:
                self.pending.pop(req_id, None)
                raise self.error
            if time.monotonic() >= deadline:
                self.pending.pop(req_id, None)
                raise AdaPMTimeout(
                    f"rank {self.rank}: no answer from rank {pending.dst} to {pending.what} "
                    f"within {timeout_s:g}s"
                )
        if pending.error is not None:
            raise pending.error
        return pending.parts

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def quiesce(self, timeout_s: float) -> None:
        """Start no more sync rounds; wait until the running one is answered (shutdown)."""
        if self.sync is None:
            return
        self.sync.closing = True
        deadline = time.monotonic() + timeout_s
        while self.sync._open and self.error is None and time.monotonic() < deadline:
            time.sleep(0.001)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    # --- helpers for the owner and sync parts (communication thread) -------------------------

    def new_internal_request(self, dst: int, kind: Kind, count: int,
                             on_part: Callable[[Message], None]) -> tuple[int, Pending]:
        req_id = next(self._ids)
        pending = Pending(dst, f"sync round {kind.name} of {count} keys", count, on_part,
                          internal=True)
        self.pending[req_id] = pending
        return req_id, pending

    def post(self, dst: int, kind: Kind, req_id: int, arrays=(), **fields) -> None:
        """Queue a message for ``dst`` (this node included); sent by the next ``_flush``."""
        self.post_message(dst, message(kind, self.rank, req_id, arrays, **fields))

    def post_message(self, dst: int, msg: Message) -> None:
        if dst == self.rank:
            self._local.append(msg)
        else:
            self._outbox.setdefault(dst, []).append(msg)

    def reply(self, dst: int, kind: Kind, req_id: int, arrays=(), **fields) -> None:
        self.post(dst, kind, req_id, arrays, **fields)

    def _flush(self) -> None:
        """Dispatch what was posted here, then send every peer its messages."""
        while self._local:
            self._dispatch(self._local.popleft())
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, {}
        for dst, items in outbox.items():
            run: list[Message] = []
            for item in items:
                if isinstance(item, Message):
                    run.append(item)
                    continue
                if run:  # keep the order: messages posted before the forwarded frames go first
                    self.transport.send(dst, run)
                    run = []
                self.transport.send_frames(dst, *item)
            if run:
                self.transport.send(dst, run)

    def learn_owner(self, keys: np.ndarray, rank: int) -> None:
        """``rank`` answered for ``keys``: point the hint there, except for keys owned here.

        An owner may relocate a key to us right after answering for it, and the relocation
        arrives first (it is sent first): the answer must not point the hint away again, or
        every later request for the key would travel to the old owner and back
        (bench/adaptive.py: ~22k intent reports per node were forwarded home that way).
        Any thread may call this (a racing write only costs a forward).
        """
        elsewhere = keys[self.store.state[keys] != OWNER]
        self.hint[elsewhere] = rank

    def notify_arrivals(self) -> None:
        with self.arrivals:
            self.arrivals.notify_all()

    def scratch(self, n: int) -> np.ndarray:
        if len(self._scratch) < n:
            self._scratch = np.empty(max(n, 2 * len(self._scratch)), dtype=np.int64)
        return self._scratch

    # --- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                timeout = IDLE_POLL_MS if self.sync is None else self.sync.poll_timeout_ms()
                for source, frames in self.transport.poll(timeout):
                    if source == "inbox":
                        self._forward(frames)
                    else:
                        messages = decode(frames)
                        self.transport.count_received(messages, frames)
                        for msg in messages:
                            self._dispatch(msg)
                    # What this message caused goes out now, not after the whole batch: a
                    # worker may be blocked on it (bench/adaptive.py: from post to send took
                    # ~1.1 ms on average when sends waited for the end of the pass, ~0.65 ms so).
                    self._flush()
                if self.sync is not None:
                    self.sync.tick(time.monotonic())
                    self._flush()
        except BaseException as exc:  # surfaces in callers' threads, not only in a log
            error = AdaPMError(f"rank {self.rank}: communication thread failed: {exc!r}\n"
                               + traceback.format_exc())
            error.__cause__ = exc
            self.error = error
            for pending in list(self.pending.values()):
                pending.fail(error)
            self.pending.clear()
            self.notify_arrivals()

    def _forward(self, frames: list) -> None:
        """A local thread's message: for this node, or passed on to a peer as it is."""
        dst, kind = unpack_prefix(frames[0])
        if dst == self.rank:
            for msg in decode(frames[1:]):
                self._dispatch(msg)
        else:
            self._outbox.setdefault(dst, []).append((kind, frames[1:]))

    def _dispatch(self, message: Message) -> None:
        kind = message.kind
        if kind in ANSWERS:
            self._answer(message)
        elif kind in KEYED:
            self.owner.handle(message)
        elif kind == Kind.RELOCATE:
            self.owner.relocate_in(message)
        elif kind == Kind.SETUP:
            self.owner.setup_in(message)
        elif kind == Kind.OWNER_UPDATE:
            keys, owners, epochs = message.arrays
            self.owner.update_home(keys, owners, epochs)
        elif kind == Kind.BARRIER:
            self._serve_barrier(message)
        elif kind == Kind.WAKE:
            self._serve_wake(message)
        else:
            raise StateError(f"rank {self.rank}: unexpected {kind.name} from rank {message.src}")

    def _answer(self, message: Message) -> None:
        pending = self.pending.get(message.req_id)
        if pending is None:  # its waiter timed out and left
            self.counters["late_answers"] += 1
            return
        if message.kind == Kind.ERROR:
            del self.pending[message.req_id]
            error = PeerError(f"rank {self.rank}: rank {message.src} could not serve "
                              f"{pending.what}: {message.header.get('msg')}")
            if pending.internal:
                raise error
            pending.fail(error)
            return
        if message.kind == Kind.BARRIER_RELEASE:
            pending.remaining = 0
        else:
            pending.remaining -= len(message.arrays[0])
            if pending.on_part is not None:
                pending.on_part(message)
            else:
                pending.parts.append(message)
        if pending.remaining <= 0:
            del self.pending[message.req_id]
            pending.event.set()
            if pending.internal:
                self.sync.answered(message.req_id)

    def _serve_barrier(self, message: Message) -> None:
        epoch = message.header["e"]
        waiters = self._barrier_waiting.setdefault(epoch, [])
        waiters.append((message.src, message.req_id))
        if len(waiters) == self.world_size:
            del self._barrier_waiting[epoch]
            for src, req_id in waiters:
                self.reply(src, Kind.BARRIER_RELEASE, req_id, e=epoch)

    def _serve_wake(self, message: Message) -> None:
        """A local thread waits for a sync round (wait_sync: "w" = worker index; barrier: -1)."""
        pending = self.pending.get(message.req_id)
        if pending is None:
            return

        def done() -> None:
            if self.pending.pop(message.req_id, None) is not None:
                pending.event.set()

        index = message.header["w"]
        if self.sync is None:
            done()
            return
        condition = None
        if index >= 0:
            worker = self.sync.worker_by_index(index)
            condition = lambda: self.sync.worker_intents_served(worker)  # noqa: E731
        self.sync.request_round(done, worker_index=index if index >= 0 else None,
                                condition=condition)

    # --- statistics --------------------------------------------------------------------------

    def stats(self) -> dict:
        out = dict(self.counters)
        out.update(self.owner.counters)
        if self.sync is not None:
            out.update(self.sync.stats())
        return out
