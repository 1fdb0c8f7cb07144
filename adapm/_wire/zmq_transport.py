"""ZeroMQ transport: the only module that touches sockets (besides the rendezvous).

Topology (as ps-lite's van): every node binds one ROUTER on which it receives everything,
requests and answers alike, and connects one DEALER to each peer's ROUTER for everything it sends.
So the engine thread polls one socket, whatever the number of nodes, plus an eventfd through
which other threads wake it (:meth:`Transport.wake`).

Threads: the sockets belong to the engine thread; only :meth:`Transport.wake` may be called from
any thread. Workers never touch sockets: they hand requests to the engine (see
:mod:`adapm._engine.loop`).

Native I/O: receiving (the poll, every frame, the parse) and sending (encode, every frame) are
one C call each (``adapm._native.ZmqIO``, native/zmq_io.c), over the libzmq handles of the
pyzmq sockets created here; pyzmq's Python layer cost more per message than the engine's C
work (bench/engine.py prints the pyzmq echo beside it). Where pyzmq's libzmq cannot be reached
from C, or with ``native_io=False``, the same is done through pyzmq.

The owner's fast path (:meth:`Transport.serve_owned`, called by the engine loop): a peer's
pull, push or set whose keys are all owned here is checked, served and answered inside that C
call, as the engine state would (``NodeState._serve``), without the GIL and without a pass of the
engine loop; the loop only learns that the peer was heard from (``ZmqIO.heard_at``, when it
looks after its peers). Everything else (a key not
here, a forwarded request, a message that fails a check, which the engine then drops and
counts) goes to the engine as before, and so does every later message of the same peer in the
same poll, so that a peer's requests take effect in the order it sent them.

Zero copy: arrays of 64 KiB or more travel in frames of their own, not copied (smaller ones are
packed into one frame, :mod:`adapm._wire.protocol`); received frames are not copied either.

Counters: ``messages_*`` and ``bytes_*`` count logical messages (and per kind); a ZeroMQ message
may carry several (``wire_messages_*``). Per-kind bytes are each message's header and arrays;
the totals also include the alignment padding.

Who sent a message. Every DEALER connects with the identity ``b"<rank>:<job token>"``, the
token being the random one rank 0 handed out at the rendezvous. Without authentication, a
received ZeroMQ message counts as coming from rank r only if its connection's identity is
exactly rank r's (``b"1"`` or ``b"01:<token>"`` name nobody), and every header in it must name
r; anything else is dropped and counted (``dropped_forged_messages``). libzmq refuses a second
connection with an identity in use, and a stranger does not know the token, so no stranger can
speak for a rank: not a parameter write, not a goodbye, a failure notice or a barrier arrival.

Authentication (``keys`` given, see :mod:`adapm._wire.auth`): the ROUTER is a CURVE server and
every DEALER a CURVE client, and the transport runs the context's ZAP handler, so only the job's
members connect and all traffic is encrypted. A received ZeroMQ message whose headers name
another sender than the rank its connection authenticated as is dropped before the engine sees
it, and counted (``dropped_forged_messages``); a connection refused at the handshake (no
member's key, or no CURVE) is counted too (``refused_handshakes``).

Bounded receive buffers: at most :data:`RECEIVE_HWM` unread messages per connection, and no
frame over ``max_frame_bytes`` (a larger one disconnects its sender). Sends never block and are
never dropped (no send high-water mark): the engine must not stall on a slow peer, and a peer
that reads slowly holds the sender's messages back in the sender.
"""

from __future__ import annotations

import logging
import os

import zmq

from ..errors import TransportError
from .auth import HandshakeWatch, JobKeys, ZapHandler, authenticated_rank
from .._native_loader import load as _load_native
from .protocol import (
    Encoded, Kind, Message, decode, encode, frame_bytes, messages_from, runs, specs,
)
from .traffic import Traffic

_log = logging.getLogger("adapm.wire")

_SNDMORE = int(zmq.SNDMORE)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


# Messages a node's socket buffers per connection before it stops reading from it (libzmq's
# own default high-water mark; unread messages then wait in the sender, see Transport).
RECEIVE_HWM = 1000

# Connections whose bad messages are logged; after that, bad messages are only counted.
_MAX_WARNED_CONNECTIONS = 8


def identity_of(rank: int, token: str) -> bytes:
    """The identity rank ``rank``'s DEALERs connect with in the job of ``token``."""
    return f"{rank}:{token}".encode()


def _check_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Transport:
    """Sockets of one node. All methods but :meth:`wake` are for the engine thread."""

    def __init__(self, rank: int, host: str, context: zmq.Context | None = None,
                 keys: JobKeys | None = None, max_frame_bytes: int = -1,
                 native_io: bool = True, zap: bool = True) -> None:
        """``keys``: the job's keys to authenticate with (None: plain ZeroMQ). The transport
        then runs the ZAP handler of ``context``, which serves the rendezvous too, unless
        ``zap`` is False (another transport of the context runs it: a node's other channels;
        close that one last).
        ``max_frame_bytes``: a peer that sends a larger frame is disconnected by libzmq before
        the frame is buffered (ZMQ_MAXMSGSIZE; -1: no limit). ``native_io``: receive and send
        in C where possible (see the module docstring); False: through pyzmq."""
        self.rank = rank
        self._native_io = native_io
        self._io = None  # the native I/O, from connect() on
        self.context = context or zmq.Context()
        self._own_context = context is None
        self._keys = keys
        self._zap = None
        self._warned: set[int] = set()  # peers already logged for a forged message
        self._warned_identities: set[bytes] = set()  # connections logged for a bad message
        try:
            if keys is not None and zap:
                # Before binding: a CURVE server without a ZAP handler refuses everyone.
                self._zap = ZapHandler(self.context, keys, f"adapm-zap-{rank}")
            self.router = self.context.socket(zmq.ROUTER)
            # What a node buffers for a connection is bounded: once RECEIVE_HWM messages wait
            # unread, libzmq stops reading that connection (TCP holds the rest back, then the
            # sender's libzmq queues them: the sender pays for its own flood, and nothing is
            # dropped, which would lose an update); no single frame may be larger than a node
            # could legitimately be sent; and authentication keeps strangers out.
            self.router.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
            self.router.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
            self.router.setsockopt(zmq.LINGER, 0)
            if ":" in host:
                self.router.setsockopt(zmq.IPV6, 1)
            if keys is not None:
                keys.make_server(self.router)
            port = self.router.bind_to_random_port(f"tcp://{_check_host(host)}")
            self.address = f"tcp://{_check_host(host)}:{port}"
        except zmq.ZMQError as exc:
            if getattr(self, "router", None) is not None:
                self.router.close(linger=0)
            if self._zap is not None:
                self._zap.close()
            raise TransportError(f"rank {rank}: cannot bind on host {host!r}: {exc}") from exc
        self.peers: dict[int, zmq.Socket] = {}
        self._ranks: dict[bytes, int] = {}  # connection identity -> rank (see connect)
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        # With authentication: connections refused at the handshake (no member's key, or no
        # CURVE at all), counted as they happen (refused_handshakes).
        self._watch = HandshakeWatch(self.router) if keys is not None else None
        if self._watch is not None:
            self.poller.register(self._watch.socket, zmq.POLLIN)
        # Other threads wake a blocked poll through this counter (one syscall, no socket).
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.poller.register(self._wake_fd, zmq.POLLIN)
        self.traffic = Traffic()

    def connect(self, addresses: list[str], token: str) -> None:
        """Connect a DEALER to every other node's ROUTER (addresses indexed by rank), as this
        rank of the job whose rendezvous handed out ``token``; from now on only the job's ranks'
        identities are taken for them."""
        self._ranks = {identity_of(r, token): r for r in range(len(addresses))}
        for peer, address in enumerate(addresses):
            if peer == self.rank:
                continue
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, identity_of(self.rank, token))
            if address.startswith("tcp://["):
                sock.setsockopt(zmq.IPV6, 1)
            if self._keys is not None:
                self._keys.make_client(sock, peer)
            try:
                sock.connect(address)
            except zmq.ZMQError as exc:
                raise TransportError(f"rank {self.rank}: cannot connect to rank {peer} at "
                                     f"{address}: {exc}") from exc
            self.peers[peer] = sock
        if self._native_io:
            self._io = _native_io(self, len(addresses))

    def send(self, dst: int, messages: list) -> None:
        """Send ``messages`` (in order) to peer ``dst`` in one ZeroMQ message; an
        :class:`~.protocol.Encoded` one goes as a ZeroMQ message of its own, in its place."""
        if any(type(m) is Encoded for m in messages):
            for run in runs(messages):
                if type(run) is Encoded:
                    self._send_encoded(dst, run)
                else:
                    self._send_messages(dst, run)
            return
        self._send_messages(dst, messages)

    def send_round(self, parts: list) -> None:
        """A sync round's SYNCs, encoded already: ``parts``, one ``(dst, req_id, frames,
        nbytes)`` per peer, each a ZeroMQ message of its own, in order; in one native call
        (``ZmqIO.send_round``, which also notes when each peer was last sent something) where
        the native I/O is there."""
        if self._io is None:
            for dst, req_id, frames, nbytes in parts:
                self._send_encoded(dst, Encoded(Kind.SYNC, self.rank, req_id, frames, nbytes))
            return
        try:
            wire = self._io.send_round([(dst, frames) for dst, _, frames, _ in parts])
        except KeyError as exc:
            raise TransportError(f"rank {self.rank}: {exc.args[0]}") from None
        except OSError as exc:
            raise TransportError(f"rank {self.rank}: sending a round's SYNCs: {exc}") from exc
        self.traffic.count_round("sent", Kind.SYNC, len(parts), wire,
                                 sum(part[3] for part in parts))

    def _send_encoded(self, dst: int, m: Encoded) -> None:
        if self._io is not None:
            try:
                wire = self._io.send_frames(dst, m.frames)
            except KeyError:
                raise TransportError(f"rank {self.rank}: no connection to rank {dst}") from None
            except OSError as exc:
                raise TransportError(f"rank {self.rank}: sending {m.kind.name} to rank {dst}: "
                                     f"{exc}") from exc
        else:
            self._send_frames(dst, m.kind, m.frames)
            wire = frame_bytes(m.frames)
        self.traffic.count("sent", wire, (m,))

    def _send_messages(self, dst: int, messages: list[Message]) -> None:
        if self._io is not None:
            try:
                sizes, wire = self._io.send(dst, specs(messages))
            except KeyError:
                raise TransportError(f"rank {self.rank}: no connection to rank {dst}") from None
            except OSError as exc:
                raise TransportError(f"rank {self.rank}: sending {messages[0].kind.name} to "
                                     f"rank {dst}: {exc}") from exc
            for m, size in zip(messages, sizes):
                m.nbytes = size
            self.traffic.count("sent", wire, messages)
            return
        frames = encode(messages)
        self._send_frames(dst, messages[0].kind, frames)
        self.traffic.count("sent", frame_bytes(frames), messages)

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

    def wake(self) -> None:
        """Make a blocked :meth:`poll` return now. Any thread; never blocks. Through the native
        I/O where there is one: it keeps the GIL (os.eventfd_write lets it go, and the woken
        engine thread takes it)."""
        if self._io is not None:
            self._io.wake()
        else:
            os.eventfd_write(self._wake_fd, 1)

    def poll(self, timeout_ms: int, hold: bool = False) -> list[tuple[int, list[Message]]]:
        """Messages that arrived within ``timeout_ms`` (or until woken): [(source rank, messages)].

        ``hold``: a peer's SYNC that the transport served itself (``serve_owned``) does not end
        the wait, nor does an answer to this node's round that it took in while others are
        outstanding; the last one does (see the contract).
        Reads at most a batch per call, so a busy peer cannot starve the caller's other work.
        A message that cannot be parsed raises TransportError. With authentication, a message
        that names another sender than its connection's rank is dropped (see module docstring).
        """
        if self._io is not None:
            return self._poll_native(timeout_ms, hold)
        try:
            ready = self.poller.poll(timeout_ms)
            if not ready:
                return []
            ready = dict(ready)
            if self._wake_fd in ready:
                try:
                    os.eventfd_read(self._wake_fd)
                except BlockingIOError:  # another read took it first
                    pass
            if self._watch is not None and self._watch.socket in ready:
                self._watch.drain()
                self.traffic.counters["refused_handshakes"] = self._watch.failures
            out = []
            if self.router in ready:
                router = self.router
                for i in range(256):
                    # After the first (the poll said one is there), asked first, not found out
                    # by zmq.Again: raising and catching it cost more than the rest of
                    # receiving a small message (py-spy, bench/engine.py).
                    if i and not router.get(_EVENTS) & _POLLIN:
                        break
                    try:
                        frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    try:
                        messages = decode(frames[1:])
                    except TransportError as exc:
                        self._reject(frames[0].bytes, "malformed", str(exc))
                        continue
                    if self._keys is not None:
                        if not self._from_sender(frames, messages):
                            continue
                    elif not self._from_identity(frames[0].bytes, messages):
                        continue
                    self.traffic.count("received", frame_bytes(frames[1:]), messages)
                    out.append((messages[0].src if messages else -1, messages))
            return out
        except zmq.ZMQError as exc:
            raise TransportError(f"rank {self.rank}: receive failed: {exc}") from exc

    def _poll_native(self, timeout_ms: int, hold: bool) -> list[tuple[int, list[Message]]]:
        """:meth:`poll` in one C call (``ZmqIO.poll``): the same checks, on what it parsed."""
        try:
            events, received, heard = self._io.poll(timeout_ms, hold)
        except OSError as exc:
            raise TransportError(f"rank {self.rank}: receive failed: {exc}") from exc
        if events & 2:
            self._watch.drain()
            self.traffic.counters["refused_handshakes"] = self._watch.failures
        out = []
        for rank, identity, parsed, why, wire in received:
            if why is None:
                try:
                    messages = messages_from(parsed)
                except TransportError as exc:
                    why = str(exc)
            if why is not None:
                self._reject(identity, "malformed", why)
                continue
            if self._keys is not None:
                if not self._from_rank(rank, messages):
                    continue
            elif not self._from_identity(identity, messages, rank):
                continue
            self.traffic.count("received", wire, messages)
            out.append((messages[0].src if messages else -1, messages))
        # Peers whose requests were served in C (heard) left nothing to handle; the failure
        # detector reads when it last heard from each (ZmqIO.heard_at) when it looks, rather
        # than a Python call per peer and pass here (8 nodes: ~10 a round).
        return out

    def native_io(self):
        """The native I/O once :meth:`serve_owned` made it serve here: workers' pulls go
        through it without the engine loop (``ZmqIO.pull``, native/zmq_calls.c), and the loop
        hands it the answers to them that reach Python. None otherwise."""
        io = self._io
        return io if io is not None and self.traffic.extra is not None else None

    def serve_owned(self, directory) -> bool:
        """From now on serve a peer's pulls, pushes and sets of keys all owned here inside
        :meth:`poll`, in C (``ZmqIO.serve_owned``), as ``NodeState`` would serve them; they
        are counted with the rest (``messages_served_natively`` of them). False where the
        native I/O is off. Engine thread, or before it starts."""
        if self._io is None:
            return False
        self._io.serve_owned(directory, self.rank)
        self.traffic.extra = self._io.counters
        return True

    def _from_identity(self, identity: bytes, messages: list[Message],
                       rank: int | None = None) -> bool:
        """Without authentication: whether every header names the rank whose identity the
        sending DEALER connected with (see the module docstring); if not, drop and count."""
        if rank is None:
            rank = self._ranks.get(identity, -1)
        for m in messages:
            if m.src != rank or rank < 0:
                claimed = sorted({m.src for m in messages})
                self._reject(identity, "forged", f"headers name rank(s) {claimed}")
                return False
        return True

    def _reject(self, identity: bytes, what: str, why: str) -> None:
        """Count a dropped wire message; log the first one from each sender."""
        self.traffic.counters[f"dropped_{what}_messages"] += 1
        # Once per connection, and not for ever more connections (a stranger can open many).
        if identity not in self._warned_identities and \
                len(self._warned_identities) < _MAX_WARNED_CONNECTIONS:
            self._warned_identities.add(identity)
            _log.warning("rank %d: dropped a %s message from connection %r: %s (further ones "
                         "are only counted: stats()['dropped_%s_messages'])", self.rank, what,
                         identity[:32], why[:300], what)

    def _from_sender(self, frames: list, messages: list[Message]) -> bool:
        """Whether every header of a received ZeroMQ message names the rank its connection
        authenticated as; if not, count the message as dropped and log it once per peer."""
        return self._from_rank(authenticated_rank(frames[-1]), messages)

    def _from_rank(self, sender: int, messages: list[Message]) -> bool:
        """:meth:`_from_sender` with the authenticated rank known (-1: none)."""
        if all(m.src == sender for m in messages):
            return True
        self.traffic.counters["dropped_forged_messages"] += 1
        if sender not in self._warned:
            self._warned.add(sender)
            claimed = sorted({m.src for m in messages} - {sender})
            _log.warning("rank %d: dropped a message from rank %d whose headers name rank(s) %s "
                         "(further ones are only counted: stats()['dropped_forged_messages'])",
                         self.rank, sender, claimed)
        return False

    def close(self, linger_ms: int = 0) -> None:
        self._io = None  # before the sockets it uses
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self.router.close(linger=0)
        os.close(self._wake_fd)
        for sock in self.peers.values():
            sock.close(linger=linger_ms)
        self.peers.clear()
        if self._zap is not None:  # last: its socket must be closed before the context ends
            self._zap.close()
            self._zap = None
        if self._own_context:
            self.context.term()


def _native_io(transport: Transport, world_size: int):
    """The native I/O over ``transport``'s sockets, or None where pyzmq's libzmq cannot be
    reached from C (then pyzmq does the same work)."""
    peers = [transport.peers[r].underlying if r in transport.peers else 0
             for r in range(world_size)]
    watch = transport._watch.socket.underlying if transport._watch is not None else 0
    try:
        return _load_native().ZmqIO(transport.router.underlying, transport._wake_fd, watch,
                                    peers, dict(transport._ranks),
                                    transport._keys is not None)
    except ImportError as exc:
        _log.debug("rank %d: receiving and sending through pyzmq: %s", transport.rank, exc)
        return None
