"""The engine's three contracts: the state machine, what runs it, and what carries its messages.

:class:`EngineState` is the whole surface of a node's state machine
(:class:`~.state.NodeState`) for everything outside it: the runners, the node and its workers,
the benchmarks. :class:`Engine` is what a :class:`~adapm.node.Node` and its workers use of the
thing that runs the state: :class:`~.loop.EngineLoop` (a thread per node) and, in tests,
:class:`~.sim.SimEngine` (many nodes in one thread). :class:`Transport` is what those use of
the thing that moves whole messages between ranks: the ZeroMQ transport
(:class:`adapm._wire.zmq_transport.Transport`) and the in-process one
(:class:`adapm._wire.inproc.InprocTransport`). ``tests/test_engine_properties.py`` checks that
each implementation offers every member with the same parameters.
"""

from __future__ import annotations

from typing import Optional, Protocol

from ..errors import AdaPMError
from .events import Call, Request


class EngineState(Protocol):
    """One node's engine state machine: events in, instructions out (``handle``), over the
    native engine (``directory``: routing, decisions, relocations, the rounds' and the fast
    paths' wire work). ``handle`` and the set-up calls are for the thread that runs it (one at a
    time); the queries for any thread (snapshots)."""

    rank: int
    world_size: int
    config: object  # the node's Config
    policy: object  # the management variant's policy (adapm._engine.policy)
    directory: object  # the native Directory, which a transport serves through (serve_owned)
    counters: dict  # the state's event counts (stats() reads a copy)
    closing: bool  # set: start no more sync rounds (quiesce); cleared: start them again
    rounds_started: int

    def handle(self, event, now: float) -> list:
        """One event (Received, Submitted, Tick) at time ``now``: the instructions it causes
        (Send, SendRound, Finish), in order."""

    def register_worker(self, clock: int) -> object:
        """A new worker's intents queue (index order), or None when nothing acts on intent."""

    def serve_through(self, native_calls=None) -> None:
        """The transport serves natively and takes round answers in; ``native_calls``: its
        native I/O that workers' calls go through, or None."""

    def replicate_everything(self, read=None) -> None:
        """``full_replication``: a replica of every key homed elsewhere, in sync now."""

    def poll_timeout_s(self, now: float) -> float:
        """How long the runner may sleep before the next Tick is worth handling."""

    def poll_hold(self) -> bool:
        """Whether a poll may go on waiting after the transport served a peer's SYNC or took
        in an answer that is not the round's last."""

    @property
    def round_running(self) -> bool:
        """A sync round is open."""

    @property
    def round_started_at(self) -> Optional[float]:
        """When the running round started, or None."""

    @property
    def next_round_at(self) -> float:
        """No round starts before this (the engine's clock)."""

    def round_waiting_on(self) -> list:
        """Ranks the running round still waits for."""

    def subscribe(self, sink) -> None:
        """Report events to ``sink`` (an EventSink) from now on."""

    def stats(self) -> dict: ...

    def staying(self, keys): ...

    def sample_pins(self): ...

    def held_draw(self): ...

    def replicas_held(self) -> int: ...

    def moves_held(self) -> bool: ...

    def memory(self) -> dict: ...

    def directory_view(self) -> dict: ...

    def held_moves(self) -> dict: ...

    def barrier_missing(self, epoch: int) -> list: ...

    def own_updates_served_here(self) -> tuple: ...


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

    def wait_native(self, call, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for a worker's call through the native I/O (``native``'s
        pull or push) to end: its state (PullCall.wait's)."""

    def wait_routed(self, call, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until such a call is routed: its state
        (PullCall.wait_routed's)."""

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

    def send_round(self, parts: list) -> None:
        """A sync round's SYNCs, encoded already: ``parts``, one ``(dst, req_id, frames,
        nbytes)`` per peer, each as a wire message of its own to its peer, in order."""

    def poll(self, timeout_ms: int, hold: bool = False) -> list:
        """[(source rank, messages)] that arrived within ``timeout_ms`` or until woken; a rank
        with no messages was heard from (the transport served what it sent itself; one that
        serves natively leaves such ranks out: its native I/O's ``heard_at`` tells when it last
        heard from each, read by the loop when it looks after its peers).
        ``hold``: the caller's round is open and nothing of it waits for keys to arrive, so a
        peer's SYNC the transport served need not end the wait, nor an answer it took in while
        others of the caller's round are outstanding (a transport may return anyway); the
        answer that leaves none outstanding still does."""

    def wake(self) -> None:
        """Make a blocked :meth:`poll` return now; any thread, never blocks."""

    def serve_owned(self, directory) -> bool:
        """From now on serve in C what the native fast paths take (native/serve_wire.h)
        before :meth:`poll` returns anything; False if this transport cannot."""

    def native_io(self) -> object:
        """The native I/O that workers' pulls may go through, or None."""

    def close(self, linger_ms: int = 0) -> None: ...
