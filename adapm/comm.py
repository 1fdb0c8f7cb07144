"""The communication thread: owns the sockets, serves peers' requests, completes our own.

Worker threads never block the communication thread and never touch its sockets: they register a
:class:`Pending` under a fresh request id, hand the request to this thread through their
:class:`~adapm.transport.Client`, and wait on the Pending with a timeout. This thread forwards the
request, and completes the Pending when the answer arrives.

A failure in this thread is not lost in a log: it is stored, every waiting call raises it (as
:class:`AdaPMError` naming this rank, ``raise ... from`` the cause), and so does every later call.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback

import numpy as np

from .errors import AdaPMError, AdaPMTimeout, PeerError, StateError
from .protocol import ANSWERS, Kind, Message, decode, encode
from .store import Store
from .transport import Transport, unpack_prefix

# Poll timeout of the loop: how quickly the thread notices a stop request when idle.
_IDLE_POLL_MS = 50


class Pending:
    """One request awaiting its answer. Completed by the communication thread."""

    __slots__ = ("event", "message", "error", "dst", "what")

    def __init__(self, dst: int, what: str) -> None:
        self.event = threading.Event()
        self.message: Message | None = None
        self.error: BaseException | None = None
        self.dst = dst
        self.what = what

    def complete(self, message: Message | None = None, error: BaseException | None = None) -> None:
        self.message = message
        self.error = error
        self.event.set()


class Comm:
    """Runs the communication loop of one node on a background thread."""

    def __init__(self, rank: int, world_size: int, transport: Transport, store: Store,
                 request_timeout_s: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.transport = transport
        self.store = store
        self.request_timeout_s = request_timeout_s
        self.pending: dict[int, Pending] = {}
        self._ids = itertools.count(1)
        self.error: AdaPMError | None = None
        self._stop = threading.Event()
        self._barrier_waiting: dict[int, list[tuple[int, int]]] = {}  # rank 0: epoch -> waiters
        self.late_answers = 0
        self._thread = threading.Thread(target=self._run, name=f"adapm-comm-{rank}", daemon=True)
        self._missing = np.empty(1024, dtype=np.int64)

    # --- used by other threads ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def new_request(self, dst: int, what: str) -> tuple[int, Pending]:
        """Register a request before sending it (so its answer always finds it)."""
        self.raise_if_failed()
        req_id = next(self._ids)
        pending = Pending(dst, what)
        self.pending[req_id] = pending
        return req_id, pending

    def wait(self, req_id: int, pending: Pending, timeout_s: float | None = None,
             deadline: float | None = None) -> Message:
        """Block until the answer arrives; AdaPMTimeout naming both ranks and what was awaited.

        ``deadline`` (time.monotonic) lets a caller share one ``timeout_s`` between requests.
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
        return pending.message

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    # --- the loop (communication thread only) ------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for source, frames in self.transport.poll(_IDLE_POLL_MS):
                    if source == "inbox":
                        self._forward(frames)
                    else:
                        self._receive(frames)
        except BaseException as exc:  # surfaces in callers' threads, not only in a log
            error = AdaPMError(f"rank {self.rank}: communication thread failed: {exc!r}\n"
                               + traceback.format_exc())
            error.__cause__ = exc
            self.error = error
            for pending in list(self.pending.values()):
                pending.complete(error=error)
            self.pending.clear()

    def _forward(self, frames: list) -> None:
        dst, kind = unpack_prefix(frames[0])
        if dst == self.rank:
            self._dispatch(decode(frames[1:]), frames[1:])
        else:
            self.transport.send(dst, kind, frames[1:])

    def _receive(self, frames: list) -> None:
        message = decode(frames)
        self.transport.count_received(message.kind, frames)
        self._dispatch(message, frames)

    def _dispatch(self, message: Message, frames: list) -> None:
        kind = message.kind
        if kind in ANSWERS:
            pending = self.pending.pop(message.req_id, None)
            if pending is None:  # its waiter timed out and left
                self.late_answers += 1
            elif kind == Kind.ERROR:
                pending.complete(error=PeerError(
                    f"rank {self.rank}: rank {message.src} could not serve {pending.what}: "
                    f"{message.header.get('msg')}"))
            else:
                pending.complete(message)
        elif kind == Kind.PULL:
            self._serve_pull(message)
        elif kind in (Kind.PUSH, Kind.SET):
            self._serve_update(message)
        elif kind == Kind.BARRIER:
            self._serve_barrier(message)
        else:
            raise StateError(f"rank {self.rank}: unexpected {kind.name} from rank {message.src}")

    def _reply(self, dst: int, kind: Kind, req_id: int, arrays=(), **fields) -> None:
        frames = encode(kind, self.rank, req_id, arrays, **fields)
        if dst == self.rank:
            self._dispatch(decode(frames), frames)
        else:
            self.transport.send(dst, kind, frames)

    def _missing_buffer(self, n: int) -> np.ndarray:
        if len(self._missing) < n:
            self._missing = np.empty(max(n, 2 * len(self._missing)), dtype=np.int64)
        return self._missing

    def _serve_pull(self, message: Message) -> None:
        keys = message.arrays[0]
        values = np.empty(self.store.floats_for(keys), dtype=np.float32)
        nmiss = self.store.gather(keys, values, self._missing_buffer(len(keys)))
        if nmiss:
            self._refuse(message, keys, nmiss)
        else:
            self._reply(message.src, Kind.PULL_RESP, message.req_id, [values])

    def _serve_update(self, message: Message) -> None:
        keys, values = message.arrays
        missing = self._missing_buffer(len(keys))
        if message.kind == Kind.PUSH:
            nmiss = self.store.scatter_add(keys, values, missing)
        else:
            nmiss = self.store.scatter_set(keys, values, missing)
        if nmiss:
            self._refuse(message, keys, nmiss)
        else:
            self._reply(message.src, Kind.ACK, message.req_id)

    def _refuse(self, message: Message, keys: np.ndarray, nmiss: int) -> None:
        # Under static partitioning a request only reaches a key's home, which owns it; anything
        # else is a bug worth reporting loudly to the requester.
        sample = keys[self._missing[: min(nmiss, 5)]].tolist()
        self._reply(message.src, Kind.ERROR, message.req_id,
                    msg=f"{nmiss} keys not held by rank {self.rank} (e.g. {sample})")

    def _serve_barrier(self, message: Message) -> None:
        epoch = message.header["e"]
        waiters = self._barrier_waiting.setdefault(epoch, [])
        waiters.append((message.src, message.req_id))
        if len(waiters) == self.world_size:
            del self._barrier_waiting[epoch]
            for src, req_id in waiters:
                self._reply(src, Kind.BARRIER_RELEASE, req_id, e=epoch)
