"""What goes into the engine (events) and what comes out (instructions), and the ``Call``
through which a worker thread waits for its request.

Events: :class:`Received` (a message from a peer), :class:`Submitted` (a worker's request),
:class:`Tick` (time passed; a round may be due). Instructions: :class:`Send` (a message for a
peer), :class:`SendRound` (a round's SYNCs, one per peer) and :class:`Finish` (complete a
call). ``NodeState.handle`` takes one event and returns the
instructions, in order; whoever runs it carries them out (the engine loop, or the simulator).
"""

from __future__ import annotations

import _thread
import enum
from typing import Optional

import numpy as np

from .._wire.protocol import Encoded, Kind


class Op(enum.IntEnum):
    """What a worker can ask of its engine."""

    PULL = 1  # keys, positions -> answers (positions, rows)
    PUSH = 2  # keys, positions, rows -> acknowledged
    SET = 3  # keys, positions, rows -> acknowledged
    WAIT_SYNC = 4  # worker, clock: a round after which the worker's active intents are served
    ROUND = 5  # a round that starts after the call (replicas refreshed)
    BARRIER = 6  # epoch, tag (the collective's kind): all nodes arrived
    # worker, clock: as WAIT_SYNC, for an access that found the worker's intent late; over
    # channels, only those where an intent of the worker active at clock is still late
    AWAIT_INTENT = 7


# The states of a worker's call through the transport's native I/O (a PullCall of ZmqIO.pull or
# ZmqIO.push; native/zmq_calls.c): queued by the worker, open (routed, answers awaited), done,
# declined (nothing sent: the engine's path takes it), failed.
NATIVE_QUEUED, NATIVE_OPEN, NATIVE_DONE, NATIVE_DECLINED, NATIVE_FAILED = 0, 1, 2, 3, 4


class Call:
    """One request of a worker thread to its engine, completed once by the engine thread.

    The worker blocks in :meth:`wait`. ``parts`` are the answer messages (their arrays are views
    that stay valid while the call is referenced). ``waiting_on``: rank -> how many entries of
    the request that rank holds unanswered, as far as this node knows (sent there, or passed on
    there by another node, which says so in a FORWARDED notice); for error messages, so that a
    timeout names the rank actually waited for, not the first hop. ``forwarded``: some entry
    was passed on. ``waiting_for``: keys the engine holds the request for because they are on
    their way here (for error messages). ``abandoned``: the worker gave up (timeout); a late
    answer is then only counted.
    """

    __slots__ = ("what", "waiting_on", "forwarded", "_latch", "_done", "parts", "error",
                 "abandoned", "waiting_for")

    def __init__(self, what: str) -> None:
        self.what = what
        self.waiting_on: dict[int, int] = {}  # written by the engine thread only
        self.forwarded = False
        # A lock held until finish: waiting on it and releasing it are single C calls (a
        # threading.Event is a Condition in Python: ~10 us of the engine thread per finish).
        self._latch = _thread.allocate_lock()
        self._latch.acquire()
        self._done = False
        self.parts: list = []
        self.error: Optional[BaseException] = None
        self.abandoned = False
        self.waiting_for: Optional[np.ndarray] = None

    def ranks_waited_for(self) -> list[int]:
        """Ranks holding unanswered entries of this call (a snapshot; any thread: the dict is
        copied in one step under the GIL)."""
        return sorted(rank for rank, n in dict(self.waiting_on).items() if n > 0)

    @property
    def done(self) -> bool:
        return self._done

    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` (>= 0) for :meth:`finish`; whether the call is finished.
        Any number of threads may wait."""
        if self._done:
            return True
        if self._latch.acquire(timeout=timeout_s):
            self._latch.release()  # the next waiter, if any, passes too
            return True
        return self._done

    def finish(self, parts: list, error: Optional[BaseException] = None) -> None:
        """Complete the call and wake its worker (engine side; once per call)."""
        if self._done:
            raise AssertionError(f"{self.what} finished twice")
        self.parts, self.error = parts, error
        self._done = True
        self._latch.release()


class HandedPush(Call):
    """A worker's push that the transport could not route itself (``ZmqIO.handoffs``), on the
    state machine's path (the engine loop and the simulator submit it): finishing it completes
    the transport's call, which its worker waits on."""

    __slots__ = ("native_call", "io")

    def __init__(self, what: str, native_call, io) -> None:
        super().__init__(what)
        self.native_call = native_call
        self.io = io

    def finish(self, parts: list, error: Optional[BaseException] = None) -> None:
        super().finish(parts, error)
        self.io.complete(self.native_call, error)


def handed_pushes(io) -> list:
    """The workers' pushes the native I/O ``io`` could not route itself (``ZmqIO.handoffs``:
    a key on its way here, or one whose intent this node reported and whose owner has not
    answered), as the :class:`Submitted` events that put them on the state machine's path,
    in the order they were queued; finishing each completes the transport's call."""
    events = []
    for native_call, keys, positions, rows, worker, clock in io.handoffs():
        keys = np.frombuffer(keys, dtype=np.int64)
        call = HandedPush(f"PUSH of {len(keys)} keys", native_call, io)
        events.append(Submitted(call, Request(
            Op.PUSH, keys, np.frombuffer(positions, dtype=np.int64),
            np.frombuffer(rows, dtype=np.float32), worker=worker, clock=clock)))
    return events


class Request:
    """A submitted operation (see :class:`Op`); arrays are owned by the engine once submitted."""

    __slots__ = ("op", "keys", "positions", "rows", "worker", "clock", "epoch", "tag")

    def __init__(self, op: Op, keys=None, positions=None, rows=None, worker: int = -1,
                 clock: int = 0, epoch: int = 0, tag: str = "barrier") -> None:
        self.op = op
        self.keys = keys
        self.positions = positions
        self.rows = rows
        self.worker = worker
        self.clock = clock
        self.epoch = epoch
        self.tag = tag


class Received:
    __slots__ = ("message",)

    def __init__(self, message) -> None:
        self.message = message


class Submitted:
    __slots__ = ("call", "request")

    def __init__(self, call: Call, request: Request) -> None:
        self.call = call
        self.request = request


class Tick:
    """Time passed (the time comes with ``handle``); ``clocks[i]``: worker i's clock now."""

    __slots__ = ("clocks",)

    def __init__(self, clocks: list[int]) -> None:
        self.clocks = clocks


class Send:
    __slots__ = ("dst", "message")

    def __init__(self, dst: int, message) -> None:
        self.dst = dst
        self.message = message


class SendRound:
    """A sync round's SYNCs from ``src``, encoded already (``Directory.round_build``): ``parts``,
    one ``(dst, req_id, frames, nbytes)`` per peer. Each goes to its peer after whatever was
    posted to that peer before this instruction, as a :class:`Send` would; a transport may send
    them all in one call (``send_round``)."""

    __slots__ = ("src", "parts")

    def __init__(self, src: int, parts: list) -> None:
        self.src = src
        self.parts = parts

    def sends(self) -> list:
        """The same as a :class:`Send` of an :class:`~.._wire.protocol.Encoded` per peer, in
        order."""
        src = self.src
        return [Send(dst, Encoded(Kind.SYNC, src, req_id, frames, nbytes))
                for dst, req_id, frames, nbytes in self.parts]


class Finish:
    """Complete ``call`` with ``parts`` or ``error``."""

    __slots__ = ("call", "parts", "error")

    def __init__(self, call: Call, parts: list, error: Optional[BaseException] = None) -> None:
        self.call = call
        self.parts = parts
        self.error = error
