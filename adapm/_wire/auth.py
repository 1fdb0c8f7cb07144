"""Authentication of the job's members: CURVE keys from the job's secret, and a ZAP handler.

Keys. Rank ``r``'s CURVE secret key is the 32 bytes ``HMAC-SHA256(secret, "adapm curve rank
r")`` (Curve25519 takes any 32 bytes as a secret key) and its public key is
``zmq.curve_public`` of it. So every node derives every member's public key from the job's
secret alone: nothing is exchanged, and nothing about the keys is ever published.

Who gets in. Every node's ROUTER, and rank 0's rendezvous socket, is a CURVE server with its
rank's key pair; every DEALER is a CURVE client with its own rank's key pair that knows the
server's public key. The CURVE handshake (libzmq's, with libsodium's crypto) proves that the
client holds the secret key of the public key it presents; then libzmq asks the context's ZAP
handler (:class:`ZapHandler`), which admits the client only if that key is a member's, and names
it by its rank (the ZAP user id). libzmq attaches the user id to every message received on the
connection (the frame property ``User-Id``), which :func:`authenticated_rank` reads, so a
receiver can check that a message's header names its true sender. A client that does not know
the server's public key cannot complete the handshake at all; a client without CURVE (plain
ZeroMQ) fails at the mechanism check. Everything after the handshake is encrypted and
authenticated per message. The trust model is written down in docs/security.md.

Failing closed: server sockets set ``ZAP_ENFORCE_DOMAIN``, so while no ZAP handler is bound in
their context they refuse every client rather than admit any key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from .._native_loader import name_thread
from ..errors import ConfigError, TransportError

# libzmq asks the ZAP handler bound at this fixed endpoint of the socket's context (RFC 27).
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"adapm"
_ZAP_VERSION = b"1.0"
_KEY_LABEL = "adapm curve rank {}"
# Socket-monitor events of a failed handshake: mechanism mismatch (a plain peer, or a CURVE peer
# meeting a plain socket), a key the ZAP handler refused, or a server key that is not the
# server's (the peer derived its keys from another secret).
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def rank_secret_key(secret: str, rank: int) -> bytes:
    """Rank ``rank``'s CURVE secret key (z85, 40 bytes), derived from the job's ``secret``."""
    digest = hmac.new(secret.encode(), _KEY_LABEL.format(rank).encode(), hashlib.sha256).digest()
    return z85.encode(digest)


class JobKeys:
    """The job's CURVE keys as one node sees them: its own key pair and every member's public key.

    Immutable after construction; any thread may use it. Holds no other rank's secret key and
    never shows a secret in its repr.
    """

    __slots__ = ("_members", "_secret_key", "public_keys", "rank", "world_size")

    def __init__(self, secret: str, world_size: int, rank: int) -> None:
        if not zmq.has("curve"):
            raise ConfigError("authentication is on, but this pyzmq's libzmq was built without "
                              "CURVE; install pyzmq from its wheels (they bundle libsodium)")
        self.rank = rank
        self.world_size = world_size
        self._secret_key = rank_secret_key(secret, rank)
        # World size derivations (an HMAC and a scalar multiplication each, ~0.1 ms): done once.
        publics = tuple(zmq.curve_public(rank_secret_key(secret, r)) for r in range(world_size))
        self.public_keys = publics
        self._members = {z85.decode(public): r for r, public in enumerate(publics)}

    @classmethod
    def for_config(cls, config) -> JobKeys | None:
        """The keys of ``config``'s node, or None when its traffic is not authenticated."""
        if not config.authenticated:
            return None
        return cls(config.secret, config.world_size, config.rank)

    def member(self, public_key: bytes) -> int | None:
        """The rank whose public key (32 raw bytes) this is; None for a key outside the job."""
        return self._members.get(public_key)

    def make_server(self, sock: zmq.Socket) -> None:
        """Make ``sock`` (not yet bound) a CURVE server with this rank's key pair."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._secret_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_keys[self.rank])
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)

    def make_client(self, sock: zmq.Socket, server_rank: int) -> None:
        """Make ``sock`` (not yet connected) a CURVE client of rank ``server_rank``'s server."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.public_keys[server_rank])
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_keys[self.rank])
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._secret_key)

    def __repr__(self) -> str:
        return f"<JobKeys rank={self.rank} world_size={self.world_size}>"


def authenticated_rank(frame: zmq.Frame) -> int:
    """The rank that the ZAP handler gave the connection ``frame`` came in on (a frame received
    with ``copy=False`` on a CURVE server socket); -1 if it has none (not authenticated)."""
    try:
        user_id = frame.get("User-Id")
    except zmq.ZMQError:  # no such property: the connection was not authenticated
        return -1
    try:
        return int(user_id)
    except (TypeError, ValueError):
        return -1


class ZapHandler:
    """Answers the ZAP requests of one context on a thread of its own: admits a CURVE client
    whose public key is a member's, with its rank as user id, and refuses everything else.

    Construct it before binding any of the context's server sockets (the constructor binds the
    ZAP endpoint and starts the thread) and :meth:`close` it before terminating the context.
    ``denied`` (refused requests) may be read from any thread; the rest is for the owner.
    """

    def __init__(self, context: zmq.Context, keys: JobKeys, name: str) -> None:
        self.keys = keys
        self.denied = 0
        self._sock = context.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            self._sock.close()
            raise TransportError(f"rank {keys.rank}: cannot start the authentication (ZAP) "
                                 f"handler: {exc}") from exc
        self._stop_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # The socket moves to the handler thread; Thread.start is the memory barrier that
        # ZeroMQ asks for when a socket changes threads.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        name_thread("adapm-zap")
        sock = self._sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._stop_fd, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._stop_fd in ready:
                    return
                while True:
                    try:
                        request = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    sock.send_multipart(self._answer(request))
        except zmq.ZMQError:
            # The context is being terminated under us: nothing is left to authenticate.
            return
        finally:
            sock.close(linger=0)

    def _answer(self, request: list) -> list:
        """The ZAP reply (RFC 27) to one request: 200 with the rank as user id, or 400."""
        if len(request) < 6 or request[0] != _ZAP_VERSION:
            self.denied += 1
            request_id = request[1] if len(request) > 1 else b""
            return [_ZAP_VERSION, request_id, b"500", b"malformed ZAP request", b"", b""]
        request_id, domain, mechanism, credentials = request[1], request[2], request[5], \
            request[6:]
        rank = None
        if domain == ZAP_DOMAIN and mechanism == b"CURVE" and len(credentials) == 1:
            rank = self.keys.member(credentials[0])
        if rank is None:
            self.denied += 1
            return [_ZAP_VERSION, request_id, b"400", b"not a member of this job", b"", b""]
        return [_ZAP_VERSION, request_id, b"200", b"OK", str(rank).encode(), b""]

    def close(self) -> None:
        """Stop the thread and close its socket. Idempotent."""
        if self._stop_fd < 0:
            return
        os.eventfd_write(self._stop_fd, 1)
        self._thread.join()
        os.close(self._stop_fd)
        self._stop_fd = -1


class HandshakeWatch:
    """Counts failed security handshakes on one socket (a socket monitor), so that a rank that
    waits in vain can say why: its peers' secret or authentication setting differs from its own.

    Use from the socket's thread; poll :attr:`socket` for readiness, then :meth:`drain`.
    """

    def __init__(self, sock: zmq.Socket) -> None:
        self._watched = sock
        self.socket = sock.get_monitor_socket(_HANDSHAKE_FAILED)
        self.failures = 0

    def drain(self) -> None:
        """Count the failures reported so far (never blocks)."""
        while self.socket.poll(0):
            recv_monitor_message(self.socket)
            self.failures += 1

    def describe(self) -> str:
        """A sentence for a timeout message; empty when no handshake failed."""
        self.drain()
        if not self.failures:
            return ""
        return (f"; {self.failures} connection attempt(s) failed the security handshake: a peer "
                "whose job secret (ADAPM_SECRET / ADAPM_SECRET_FILE) or ADAPM_AUTH setting "
                "differs from this rank's, or a process outside the job")

    def close(self) -> None:
        """Stop monitoring; the watched socket stays open."""
        try:
            self._watched.disable_monitor()
        except zmq.ZMQError:
            pass
        self.socket.close(linger=0)
