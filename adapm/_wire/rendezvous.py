"""Ranks and rendezvous: how the nodes of a job find each other.

Rank 0 hosts the rendezvous at ``Config.rendezvous``. Every node first binds its own ROUTER on a
port the OS picks (so two jobs on one machine never collide), then tells rank 0 its address and a
fingerprint of its configuration. When all ``world_size`` nodes have checked in, rank 0 answers
each with the table of addresses (or with an error when ranks or configurations disagree).

With authentication on (``Config.authenticated``) the rendezvous is a CURVE server with rank 0's
keys and only the job's members get through (:mod:`adapm._wire.auth`); a hello whose rank is
not the rank its sender authenticated as is ignored, so nobody takes another rank's place. Both
sides count failed handshakes, so that a timeout can say that a peer's secret differs.

Hardened like the data path: frames are size-limited (ZMQ_MAXMSGSIZE), a hello that is not a
well-formed one (a map with an integer rank, a tcp address and a fingerprint) is ignored and
counted, and a member that gets a malformed answer raises TransportError naming the rendezvous
instead of failing somewhere later.
"""

from __future__ import annotations

import logging
import socket
import time
import zlib

import msgpack
import numpy as np
import zmq

from ..config import Config, is_loopback, parse_address
from ..errors import AdaPMTimeout, ConfigError, TransportError
from .auth import HandshakeWatch, JobKeys, authenticated_rank
from .protocol import Kind

# How long the rendezvous host keeps its socket open after answering, so the answers get out.
_ANSWER_LINGER_MS = 5000
# Largest rendezvous message: a hello is an address and a short fingerprint, an answer an
# address per rank; a larger frame disconnects its sender before it is buffered.
_MAX_HELLO_BYTES = 4096
_MAX_ADDRESS_CHARS = 300

_log = logging.getLogger("adapm.wire")


def resolve_host(config: Config) -> str:
    """The address this node binds and advertises (see ``Config.host``)."""
    if config.host:
        return config.host
    rdv_host, rdv_port = parse_address(config.rendezvous, "rendezvous")
    if is_loopback(rdv_host):
        return "127.0.0.1"
    # The local address of the route to the rendezvous host: a UDP connect sends nothing.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(rdv_host), rdv_port))
            return probe.getsockname()[0]
    except OSError as exc:
        raise ConfigError(f"cannot find a local address that reaches the rendezvous host "
                          f"{rdv_host!r} ({exc}); set ADAPM_HOST or Config(host=...)") from exc


def fingerprint(config: Config) -> list:
    """What all nodes of a job must agree on."""
    lengths = config.value_length
    length_sig = lengths if isinstance(lengths, int) else zlib.crc32(np.asarray(lengths).tobytes())
    return [config.world_size, config.num_keys, length_sig, config.management]


def rendezvous(config: Config, my_address: str, context: zmq.Context,
               keys: JobKeys | None = None) -> list[str]:
    """Block until every node has checked in; returns all nodes' addresses indexed by rank.

    ``keys``: the job's keys when authentication is on (the context must then have a running
    :class:`~adapm._wire.auth.ZapHandler`). Raises AdaPMTimeout after
    ``config.connect_timeout_s`` naming the ranks still missing (and failed handshakes, if
    any), ConfigError when nodes disagree on the job's configuration.
    """
    host, port = parse_address(config.rendezvous, "rendezvous")
    endpoint = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    deadline = time.monotonic() + config.connect_timeout_s
    hello = {"k": int(Kind.HELLO), "s": config.rank, "addr": my_address, "fp": fingerprint(config)}
    if config.rank == 0:
        return _host_rendezvous(config, endpoint, hello, context, deadline, keys)
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, _MAX_HELLO_BYTES + _MAX_ADDRESS_CHARS * config.world_size)
    watch = None
    try:
        if ":" in host:
            sock.setsockopt(zmq.IPV6, 1)
        if keys is not None:
            keys.make_client(sock, 0)
        watch = HandshakeWatch(sock)
        sock.connect(endpoint)
        sock.send(msgpack.packb(hello))
        if not _wait(sock, watch, deadline):
            raise AdaPMTimeout(
                f"rank {config.rank}: no address table from the rendezvous (rank 0) at {endpoint} "
                f"within {config.connect_timeout_s:g}s; is rank 0 running?" + watch.describe()
            )
        raw = sock.recv()
    except zmq.ZMQError as exc:
        raise TransportError(f"rank {config.rank}: rendezvous at {endpoint}: {exc}") from exc
    finally:
        if watch is not None:
            watch.close()
        sock.close()
    return _table(raw, config, my_address, endpoint)


def _table(raw: bytes, config: Config, my_address: str, endpoint: str) -> list[str]:
    """The address table in rank 0's answer, checked; ConfigError for a refusal,
    TransportError for anything that is not a well-formed answer."""
    try:
        answer = msgpack.unpackb(raw)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        answer = exc
    if isinstance(answer, dict) and answer.get("k") == Kind.ERROR and \
            isinstance(answer.get("msg"), str):
        raise ConfigError(f"rank {config.rank}: rendezvous refused: {answer['msg'][:2000]}")
    addrs = answer.get("addrs") if isinstance(answer, dict) and \
        answer.get("k") == Kind.TABLE else None
    if not (isinstance(addrs, list) and len(addrs) == config.world_size
            and all(_is_address(a) for a in addrs) and addrs[config.rank] == my_address):
        raise TransportError(f"rank {config.rank}: the rendezvous at {endpoint} answered with "
                             f"something that is not this job's address table: "
                             f"{raw[:120]!r}")
    return list(addrs)


def _is_address(value) -> bool:
    """A node address as nodes advertise it: ``tcp://host:port``."""
    if not isinstance(value, str) or len(value) > _MAX_ADDRESS_CHARS or \
            not value.startswith("tcp://"):
        return False
    host, _, port = value[6:].rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _host_rendezvous(config: Config, endpoint: str, own: dict, context: zmq.Context,
                     deadline: float, keys: JobKeys | None) -> list[str]:
    sock = context.socket(zmq.ROUTER)
    watch = None
    try:
        if endpoint.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, _MAX_HELLO_BYTES)
        if keys is not None:
            keys.make_server(sock)
        watch = HandshakeWatch(sock)
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        if watch is not None:
            watch.close()
        sock.close(linger=0)
        raise TransportError(f"rank 0: cannot host the rendezvous at {endpoint}: {exc} "
                             "(port taken? pick another ADAPM_RENDEZVOUS port)") from exc
    try:
        hellos = {0: own}
        identities = {}
        problems = []
        impostors = malformed = 0
        while len(hellos) < config.world_size:
            if not _wait(sock, watch, deadline):
                missing = sorted(set(range(config.world_size)) - set(hellos))
                ignored = (f"; ignored {impostors} hello(s) that named another rank than the "
                           "sender's keys" if impostors else "")
                if malformed:
                    ignored += f"; ignored {malformed} message(s) that were not a valid hello"
                raise AdaPMTimeout(
                    f"rank 0: rendezvous at {endpoint}: ranks {missing} did not check in within "
                    f"{config.connect_timeout_s:g}s" + watch.describe() + ignored
                )
            frames = sock.recv_multipart(copy=False)
            hello = _hello(frames)
            if hello is None:  # not a hello: ignored (a node never dies of a message)
                malformed += 1
                if malformed == 1:
                    _log.warning("rank 0: rendezvous: ignored a message that is not a valid "
                                 "hello (further ones are only counted)")
                continue
            identity, payload = frames
            rank = hello["s"]
            sender = authenticated_rank(payload) if keys is not None else rank
            if rank != sender:
                # A member's keys with another rank's number: never let it take that place.
                impostors += 1
                if impostors == 1:  # once: whoever sends them could send many
                    _log.warning("rank 0: rendezvous: ignored a hello that names rank %r from a "
                                 "connection authenticated as rank %d", rank, sender)
                continue
            identity = identity.bytes
            if not 0 <= rank < config.world_size or rank in hellos:
                problems.append(f"a node checked in with rank {rank!r} (duplicate or out of range)")
                _answer(sock, identity, Kind.ERROR, msg=problems[-1])
                continue
            if hello.get("fp") != own["fp"]:
                problems.append(f"rank {rank} has configuration {hello.get('fp')} but rank 0 has "
                                f"{own['fp']} (world_size, num_keys, value lengths, management)")
            hellos[rank] = hello
            identities[rank] = identity
        addrs = [hellos[r]["addr"] for r in range(config.world_size)]
        for rank, identity in identities.items():
            if problems:
                _answer(sock, identity, Kind.ERROR, msg="; ".join(problems))
            else:
                _answer(sock, identity, Kind.TABLE, addrs=addrs)
        if problems:
            raise ConfigError("rank 0: rendezvous refused: " + "; ".join(problems))
        return addrs
    finally:
        watch.close()
        sock.close(linger=_ANSWER_LINGER_MS)


def _hello(frames: list):
    """The hello in a message received by the rendezvous host, or None when it is none: an
    identity frame and one map with an integer rank "s", a node address "addr" and a
    fingerprint list "fp"."""
    if len(frames) != 2:
        return None
    try:
        hello = msgpack.unpackb(frames[1].bytes)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if not isinstance(hello, dict) or type(hello.get("s")) is not int or \
            not _is_address(hello.get("addr")) or not isinstance(hello.get("fp"), list):
        return None
    return hello


def _wait(sock: zmq.Socket, watch: HandshakeWatch, deadline: float) -> bool:
    """Wait until ``sock`` has a message (True) or the deadline passes (False), counting failed
    handshakes on the way."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(watch.socket, zmq.POLLIN)
    while True:
        ready = dict(poller.poll(_remaining_ms(deadline)))
        if watch.socket in ready:
            watch.drain()
        if sock in ready:
            return True
        if time.monotonic() >= deadline:
            return False


def _answer(sock: zmq.Socket, identity: bytes, kind: Kind, **fields) -> None:
    sock.send_multipart([identity, msgpack.packb({"k": int(kind), "s": 0, **fields})])


def _remaining_ms(deadline: float) -> int:
    return max(0, int((deadline - time.monotonic()) * 1000))
