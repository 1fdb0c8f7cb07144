"""The engine's two contracts: what runs a node's engine state, and what carries its messages.

:class:`Engine` is what a :class:`~adapm.node.Node` and its workers use of the thing that runs
the node's :class:`~.state.NodeState`: :class:`~.loop.EngineLoop` (a thread per node) and, in
tests, :class:`~.sim.SimEngine` (many nodes in one thread). :class:`Transport` is what those
use of the thing that moves whole messages between ranks: the ZeroMQ transport
(:class:`adapm._wire.zmq_transport.Transport`) and the in-process one
(:class:`adapm._wire.inproc.InprocTransport`). ``tests/test_engine_properties.py`` checks that
each implementation offers every member with the same parameters.
"""

from __future__ import annotations

from typing import Optional, Protocol

from ..errors import AdaPMError
from .events import Call, Request


class Engine(Protocol):
    """Runs one node's engine state. ``submit``, ``wait``, ``wake``, ``raise_if_failed`` and
    ``cpu_seconds`` are for any thread; the rest for the node that owns it."""

    state: object  # the NodeState
    rank: int
    request_timeout_s: float
    error: Optional[AdaPMError]  # what ended it; every later call raises it
    counters: dict  # late_answers, dropped_messages
    native: object  # the transport's native I/O that workers' pulls go through, or None
    native_error: Optional[AdaPMError]  # what fail_pending failed native pulls with

    def start(self) -> None: ...

    def register_worker(self, worker) -> object:
        """A new worker (index order); its intents queue, or None when nothing acts on intent."""

    def submit(self, request: Request, what: str) -> Call:
        """Hand a request over; never blocks. The request's arrays are the engine's now."""

    def wait(self, call: Call, timeout_s: Optional[float] = None,
             deadline: Optional[float] = None) -> list:
        """Block until ``call`` is finished: its parts, or its error (AdaPMTimeout naming this
        rank and what was awaited after ``timeout_s``)."""

    def wake(self) -> None:
        """An intent was signalled: look at the workers soon."""

    def cpu_seconds(self) -> float: ...

    def raise_if_failed(self) -> None: ...

    def quiesce(self, timeout_s: float) -> None:
        """Start no more sync rounds; return when the running one is answered."""

    def resume(self) -> None:
        """Start sync rounds again after :meth:`quiesce`."""

    def stop(self, goodbye: bool = False) -> None: ...

    def fail_pending(self, error: AdaPMError) -> None:
        """After :meth:`stop`: fail every call still waiting with ``error``."""


class Transport(Protocol):
    """Moves whole logical messages between ranks, in order per pair, and counts them; knows
    nothing of keys. All but ``wake`` for the engine's thread."""

    address: str
    traffic: object  # the counters (adapm._wire.traffic.Traffic)

    def send(self, dst: int, messages: list) -> None:
        """``messages`` (in order) to ``dst`` as one wire message."""

    def poll(self, timeout_ms: int, hold: bool = False) -> list:
        """[(source rank, messages)] that arrived within ``timeout_ms`` or until woken; a rank
        with no messages was heard from (the transport served what it sent itself).
        ``hold``: the caller's round is open and nothing of it waits for keys to arrive, so a
        peer's SYNC the transport served need not end the wait (a transport may return
        anyway); an answer to the caller's round that the transport took in still does."""

    def wake(self) -> None:
        """Make a blocked :meth:`poll` return now; any thread, never blocks."""

    def serve_owned(self, directory) -> bool:
        """From now on serve in C what the native fast paths take (native/serve_wire.h)
        before :meth:`poll` returns anything; False if this transport cannot."""

    def native_io(self) -> object:
        """The native I/O that workers' pulls may go through, or None."""

    def close(self, linger_ms: int = 0) -> None: ...
