"""ZeroMQ transport: the only module that touches sockets (besides the rendezvous in cluster.py).

Topology (as ps-lite's van): every node binds one ROUTER on which it receives everything,
requests and answers alike, and connects one DEALER to each peer's ROUTER for everything it sends.
So the communication thread polls two sockets (ROUTER, inbox), whatever the number of nodes.

Threads: the sockets in :class:`Transport` belong to the communication thread. Worker threads get
a :class:`Client` each (a PUSH socket on the in-process inbox), through which the communication
thread forwards their requests; sockets are never shared between threads.

Zero copy: frames are sent with ``copy=False``; pyzmq copies frames below its ``COPY_THRESHOLD``
(64 KiB) itself, since tracking a zero-copy buffer costs more than copying a small one. Small
arrays are packed into one frame before that (:mod:`adapm.protocol`).

Counters: ``messages_*`` and ``bytes_*`` count logical messages (and per kind); a ZeroMQ message
may carry several (``wire_messages_*``). Per-kind bytes are each message's header and arrays;
the totals also include the alignment padding.
"""

from __future__ import annotations

import itertools
import struct
from typing import Iterable

import zmq

from .errors import TransportError
from .protocol import Kind, Message, encode, frame_bytes

# Prefix frame on the inbox: destination rank, message kind.
_PREFIX = struct.Struct("<iB")
_inbox_ids = itertools.count()
_SNDMORE = int(zmq.SNDMORE)
_COUNTER_NAMES: dict = {}  # (direction, kind) -> counter names
_TOTAL_NAMES = {d: (f"wire_messages_{d}", f"messages_{d}", f"bytes_{d}")
                for d in ("sent", "received")}


def _check_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Transport:
    """Sockets of one node. All methods but :meth:`client` are for the communication thread."""

    def __init__(self, rank: int, host: str, context: zmq.Context | None = None) -> None:
        self.rank = rank
        self.context = context or zmq.Context()
        self._own_context = context is None
        try:
            self.router = self.context.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.RCVHWM, 0)  # never drop or block: we bound traffic by design
            self.router.setsockopt(zmq.LINGER, 0)
            if ":" in host:
                self.router.setsockopt(zmq.IPV6, 1)
            port = self.router.bind_to_random_port(f"tcp://{_check_host(host)}")
            self.address = f"tcp://{_check_host(host)}:{port}"
            self.inbox_address = f"inproc://adapm-inbox-{next(_inbox_ids)}"
            self.inbox = self.context.socket(zmq.PULL)
            self.inbox.setsockopt(zmq.RCVHWM, 0)
            self.inbox.setsockopt(zmq.LINGER, 0)
            self.inbox.bind(self.inbox_address)
        except zmq.ZMQError as exc:
            raise TransportError(f"rank {rank}: cannot bind on host {host!r}: {exc}") from exc
        self.peers: dict[int, zmq.Socket] = {}
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.inbox, zmq.POLLIN)
        self.counters = {"messages_sent": 0, "messages_received": 0, "bytes_sent": 0,
                         "bytes_received": 0, "wire_messages_sent": 0, "wire_messages_received": 0}
        self.by_kind: dict[str, int] = {}

    def connect(self, addresses: list[str]) -> None:
        """Connect a DEALER to every other node's ROUTER (addresses indexed by rank)."""
        for peer, address in enumerate(addresses):
            if peer == self.rank:
                continue
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, str(self.rank).encode())
            if address.startswith("tcp://["):
                sock.setsockopt(zmq.IPV6, 1)
            try:
                sock.connect(address)
            except zmq.ZMQError as exc:
                raise TransportError(f"rank {self.rank}: cannot connect to rank {peer} at "
                                     f"{address}: {exc}") from exc
            self.peers[peer] = sock

    def client(self) -> "Client":
        """A sending handle for one worker thread (any thread may call this)."""
        return Client(self.context, self.inbox_address)

    def send(self, dst: int, messages: list[Message]) -> None:
        """Send ``messages`` (in order) to peer ``dst`` in one ZeroMQ message."""
        frames = encode(messages)
        self._send_frames(dst, messages[0].kind, frames)
        self._count("sent", frames, [(m.kind, m.nbytes) for m in messages])

    def send_frames(self, dst: int, kind: Kind, frames: list) -> None:
        """Pass on a ZeroMQ message encoded elsewhere (a worker's request, one ``kind`` message)."""
        self._send_frames(dst, kind, frames)
        self._count("sent", frames, [(kind, frame_bytes(frames))])

    def _send_frames(self, dst: int, kind: Kind, frames: list) -> None:
        try:
            sock = self.peers[dst]
        except KeyError:
            raise TransportError(f"rank {self.rank}: no connection to rank {dst}") from None
        try:
            # One send per frame with a plain int flag: send_multipart builds an IntFlag per
            # frame (enum arithmetic, a few us each).
            last = len(frames) - 1
            for i, frame in enumerate(frames):
                sock.send(frame, 0 if i == last else _SNDMORE, copy=False)
        except zmq.ZMQError as exc:
            raise TransportError(f"rank {self.rank}: sending {kind.name} to rank {dst}: {exc}") from exc

    def poll(self, timeout_ms: int) -> Iterable[tuple[str, list]]:
        """Messages that arrived: ("peer", frames) from the ROUTER, ("inbox", frames) from workers.

        ROUTER frames come without the routing identity; inbox frames keep their prefix frame.
        Reads at most a batch per socket per call so neither source can starve the other.
        """
        try:
            ready = dict(self.poller.poll(timeout_ms))
            out = []
            if self.router in ready:
                for _ in range(256):
                    try:
                        frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    out.append(("peer", frames[1:]))
            if self.inbox in ready:
                for _ in range(256):
                    try:
                        out.append(("inbox", self.inbox.recv_multipart(zmq.NOBLOCK, copy=False)))
                    except zmq.Again:
                        break
            return out
        except zmq.ZMQError as exc:
            raise TransportError(f"rank {self.rank}: receive failed: {exc}") from exc

    def count_received(self, messages: list[Message], frames: list) -> None:
        self._count("received", frames, [(m.kind, m.nbytes) for m in messages])

    def _count(self, direction: str, frames: list, parts: list[tuple[Kind, int]]) -> None:
        """One ZeroMQ message of ``frames`` carrying ``parts``: (kind, bytes) per message."""
        wire, logical, size = _TOTAL_NAMES[direction]
        counters, by_kind = self.counters, self.by_kind
        counters[wire] += 1
        counters[logical] += len(parts)
        counters[size] += frame_bytes(frames)
        for kind, nbytes in parts:
            names = _COUNTER_NAMES.get((direction, kind))
            if names is None:
                name = kind.name.lower()
                names = _COUNTER_NAMES[direction, kind] = (f"messages_{direction}_{name}",
                                                          f"bytes_{direction}_{name}")
            by_kind[names[0]] = by_kind.get(names[0], 0) + 1
            by_kind[names[1]] = by_kind.get(names[1], 0) + nbytes

    def close(self, linger_ms: int = 0) -> None:
        for sock in [self.router, self.inbox]:
            sock.close(linger=0)
        for sock in self.peers.values():
            sock.close(linger=linger_ms)
        self.peers.clear()
        if self._own_context:
            self.context.term()


class Client:
    """A worker thread's way to the communication thread. Not thread-safe: one per thread."""

    def __init__(self, context: zmq.Context, inbox_address: str) -> None:
        self.sock = context.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(inbox_address)

    def send(self, dst: int, kind: Kind, frames: list) -> None:
        try:
            self.sock.send_multipart([_PREFIX.pack(dst, int(kind)), *frames], copy=False)
        except zmq.ZMQError as exc:
            raise TransportError(f"handing a {kind.name} for rank {dst} to the I/O thread: {exc}") from exc

    def close(self) -> None:
        self.sock.close(linger=0)


def unpack_prefix(frame) -> tuple[int, Kind]:
    dst, kind = _PREFIX.unpack(frame.bytes if hasattr(frame, "bytes") else frame)
    return dst, Kind(kind)
