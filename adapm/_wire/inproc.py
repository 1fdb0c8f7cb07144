"""In-process transport: N nodes in one process, the same methods as the ZeroMQ transport.

Every message is encoded to frames on send and decoded on receipt, exactly as on the wire, so
the engine sees the same read-only arrays, the same validation and the same byte counters as
over ZeroMQ. Order is kept per link (sender, receiver), as a ZeroMQ connection keeps it; the
protocol relies on that and on nothing more. Once :meth:`InprocTransport.serve_owned` is on, a
received message goes first where ZeroMQ's receive call sends it: to the native fast paths
(``Directory.serve_wire``, native/serve_wire.h), which serve a peer's requests and SYNCs and
take in answers to this node's round without Python, the answer put on the link back; only
what they leave is decoded for the engine. A worker's pull or push of keys held elsewhere goes
through the native I/O as over ZeroMQ (``ZmqIO.pull``/``push``, native/zmq_calls.c), here a
``ZmqIO`` without sockets: what it routes and sends is handed over by :meth:`route_queued` and
put on the links, and an answer to it is taken in before the fast paths look at a message. So
the simulator's schedules run the C paths that production runs.

Two ways to run it:

- threaded: each node's engine loop calls :meth:`InprocTransport.poll`, which blocks until a
  message arrives or :meth:`InprocTransport.wake` is called (a worker's native pull or push
  does not wake it, as over ZeroMQ it does: the call is routed by the next poll, at the
  latest after the loop's poll timeout; nothing runs this mode but the contract's test);
- simulated (:mod:`adapm._engine.sim`): one thread picks which link delivers next
  (:meth:`InprocNetwork.links_with_mail`, :meth:`InprocNetwork.take`), so a test chooses the
  interleaving and can replay or shrink it.
"""

from __future__ import annotations

import collections
import threading
from typing import Optional

import numpy as np

from .._native_loader import load as _load_native
from ..errors import TransportError
from .protocol import Encoded, Kind, Message, decode, encode, frame_bytes, runs
from .traffic import Traffic

_native = _load_native()


class InprocNetwork:
    """The links between ``world_size`` in-process nodes: one FIFO queue per (src, dst)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._links: dict[tuple[int, int], collections.deque] = {}
        self._ready = [threading.Condition() for _ in range(world_size)]
        self._woken = [False] * world_size

    def endpoint(self, rank: int) -> "InprocTransport":
        return InprocTransport(self, rank)

    def put(self, src: int, dst: int, frames: list) -> None:
        if not 0 <= dst < self.world_size or dst == src:
            raise TransportError(f"rank {src}: no connection to rank {dst}")
        with self._ready[dst]:
            self._links.setdefault((src, dst), collections.deque()).append(frames)
            self._ready[dst].notify()

    def links_with_mail(self) -> list[tuple[int, int]]:
        """Links that have a message waiting, in a fixed order (sorted)."""
        return sorted(link for link, queue in self._links.items() if queue)

    def take(self, src: int, dst: int) -> list:
        """The oldest message on link (src, dst), as frames."""
        return self._links[src, dst].popleft()

    def wait_for_mail(self, dst: int, timeout_s: float) -> list[tuple[int, list]]:
        """Everything waiting for ``dst`` (per-link order kept); blocks up to ``timeout_s``."""
        ready = self._ready[dst]
        with ready:
            if not self._woken[dst] and not self._has_mail(dst):
                ready.wait(timeout_s)
            self._woken[dst] = False
            out = []
            for (src, to), queue in self._links.items():
                if to == dst:
                    while queue:
                        out.append((src, queue.popleft()))
            return out

    def wake(self, dst: int) -> None:
        with self._ready[dst]:
            self._woken[dst] = True
            self._ready[dst].notify()

    def _has_mail(self, dst: int) -> bool:
        return any(queue for (_, to), queue in self._links.items() if to == dst)


class InprocTransport:
    """One node's end of an :class:`InprocNetwork`. Same interface as the ZeroMQ transport:
    ``send``, ``poll``, ``wake``, ``close``, ``traffic``. ``wake`` may be called from any thread."""

    def __init__(self, network: InprocNetwork, rank: int) -> None:
        self.network = network
        self.rank = rank
        self.address = f"inproc-node-{rank}"
        self.traffic = Traffic()
        self._directory = None  # serve_owned's
        self._served: Optional[np.ndarray] = None  # what the native paths counted
        self._io = None  # the native I/O of workers' calls (a ZmqIO without sockets)

    def serve_owned(self, directory) -> bool:
        """From now on, hand each received message to the native fast paths first, as the
        ZeroMQ transport's receive call does (see the module docstring); they count what they
        serve with the rest. Always True."""
        self._directory = directory
        self._served = np.zeros(len(_native.SERVE_WIRE_COUNTERS), dtype=np.int64)
        world = self.network.world_size
        # No sockets (router 0) and no eventfd (-1: InprocTransport.wake wakes the engine);
        # a peer "connected" where its entry is not 0.
        self._io = _native.ZmqIO(0, -1, 0, [int(r != self.rank) for r in range(world)], {},
                                 False)
        self._io.serve_owned(directory, self.rank)
        self.traffic.extra = self._native_counters
        return True

    def _native_counters(self) -> dict:
        """What the fast paths and the native I/O counted, by the transport's names."""
        out = dict(zip(_native.SERVE_WIRE_COUNTERS, self._served.tolist()))
        for name, value in self._io.counters().items():
            out[name] = out.get(name, 0) + value
        return out

    def native_io(self):
        """The native I/O that workers' pulls and pushes go through once :meth:`serve_owned`
        is on (a ``ZmqIO`` without sockets; see the module docstring), else None."""
        return self._io

    def route_queued(self) -> None:
        """Route the workers' pulls and pushes queued with the native I/O since the last look
        and put what they send on the links (the ZeroMQ transport does so first in every
        poll). The engine's thread (the simulator's)."""
        if self._io is None:
            return
        for dst, frames in self._io.route_queued():
            self.network.put(self.rank, dst, frames)

    def serve(self, src: int, frames: list) -> bool:
        """Whether the native fast paths served or took in the wire message ``frames`` from
        ``src`` (its answer, if any, is on the link back to ``src`` now); False: decode it
        with :meth:`receive` for the engine. Engine thread."""
        if self._directory is None:
            return False
        if self._io.take_answer(src, frames):  # answers to workers' native pulls and pushes
            return True
        answer = self._directory.serve_wire(src, frames, self._served)
        if answer is None:
            return False
        if answer:
            self.network.put(self.rank, src, answer)
        return True

    def send(self, dst: int, messages: list) -> None:
        """Send ``messages`` (in order) to ``dst`` as one wire message (an
        :class:`~.protocol.Encoded` one as a wire message of its own). Copies the arrays."""
        for run in runs(messages):
            encoded = type(run) is Encoded
            frames = [bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f
                      for f in (run.frames if encoded else encode(run))]
            self.network.put(self.rank, dst, frames)
            self.traffic.count("sent", frame_bytes(frames), (run,) if encoded else run)

    def send_round(self, parts: list) -> None:
        """A sync round's SYNCs, encoded already (``(dst, req_id, frames, nbytes)`` each), each
        to its peer as a wire message of its own, in order."""
        for dst, req_id, frames, nbytes in parts:
            self.send(dst, [Encoded(Kind.SYNC, self.rank, req_id, frames, nbytes)])

    def receive(self, frames: list) -> list[Message]:
        """Decode and count one wire message that arrived here."""
        messages = decode(frames)
        self.traffic.count("received", frame_bytes(frames), messages)
        return messages

    def poll(self, timeout_ms: int, hold: bool = False) -> list[tuple[int, list[Message]]]:
        # hold changes nothing here: every mail ends the wait, served or not (the simulator
        # drives the state event by event anyway).
        self.route_queued()
        out, passed = [], set()
        for src, frames in self.network.wait_for_mail(self.rank, timeout_ms / 1000.0):
            # As ZeroMQ's poll: once a message of a peer goes to Python, so does every later
            # one of it in this poll (they are handled in the order they came).
            if src not in passed and self.serve(src, frames):
                out.append((src, []))
            else:
                passed.add(src)
                out.append((src, self.receive(frames)))
        return out

    def wake(self) -> None:
        self.network.wake(self.rank)

    def connect(self, addresses) -> None:  # every node of the network is reachable already
        pass

    def close(self, linger_ms: int = 0) -> None:
        pass
