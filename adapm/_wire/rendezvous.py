"""Ranks and rendezvous: how the nodes of a job find each other.

Rank 0 hosts the rendezvous at ``Config.rendezvous``. Every node first binds its own ROUTER on a
port the OS picks (so two jobs on one machine never collide), then tells rank 0 its address and a
fingerprint of its configuration. When all ``world_size`` nodes have checked in, rank 0 answers
each with the table of addresses (or with an error when ranks or configurations disagree).
"""

from __future__ import annotations

import ipaddress
import socket
import time
import zlib

import msgpack
import numpy as np
import zmq

from ..config import Config, parse_address
from ..errors import AdaPMTimeout, ConfigError, TransportError
from .protocol import Kind

# How long the rendezvous host keeps its socket open after answering, so the answers get out.
_ANSWER_LINGER_MS = 5000


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


def rendezvous(config: Config, my_address: str, context: zmq.Context) -> list[str]:
    """Block until every node has checked in; returns all nodes' addresses indexed by rank.

    Raises AdaPMTimeout after ``config.connect_timeout_s`` naming the ranks still missing,
    ConfigError when nodes disagree on the job's configuration.
    """
    host, port = parse_address(config.rendezvous, "rendezvous")
    endpoint = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    deadline = time.monotonic() + config.connect_timeout_s
    hello = {"k": int(Kind.HELLO), "s": config.rank, "addr": my_address, "fp": fingerprint(config)}
    if config.rank == 0:
        return _host_rendezvous(config, endpoint, hello, context, deadline)
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(msgpack.packb(hello))
        if not sock.poll(_remaining_ms(deadline)):
            raise AdaPMTimeout(
                f"rank {config.rank}: no address table from the rendezvous (rank 0) at {endpoint} "
                f"within {config.connect_timeout_s:g}s; is rank 0 running?"
            )
        answer = msgpack.unpackb(sock.recv())
    except zmq.ZMQError as exc:
        raise TransportError(f"rank {config.rank}: rendezvous at {endpoint}: {exc}") from exc
    finally:
        sock.close()
    if answer["k"] == Kind.ERROR:
        raise ConfigError(f"rank {config.rank}: rendezvous refused: {answer['msg']}")
    return list(answer["addrs"])


def _host_rendezvous(config: Config, endpoint: str, own: dict, context: zmq.Context,
                     deadline: float) -> list[str]:
    sock = context.socket(zmq.ROUTER)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise TransportError(f"rank 0: cannot host the rendezvous at {endpoint}: {exc} "
                             "(port taken? pick another ADAPM_RENDEZVOUS port)") from exc
    try:
        hellos = {0: own}
        identities = {}
        problems = []
        while len(hellos) < config.world_size:
            if not sock.poll(_remaining_ms(deadline)):
                missing = sorted(set(range(config.world_size)) - set(hellos))
                raise AdaPMTimeout(
                    f"rank 0: rendezvous at {endpoint}: ranks {missing} did not check in within "
                    f"{config.connect_timeout_s:g}s"
                )
            identity, payload = sock.recv_multipart()
            hello = msgpack.unpackb(payload)
            rank = hello.get("s")
            if not isinstance(rank, int) or not 0 <= rank < config.world_size or rank in hellos:
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
        sock.close(linger=_ANSWER_LINGER_MS)


def _answer(sock: zmq.Socket, identity: bytes, kind: Kind, **fields) -> None:
    sock.send_multipart([identity, msgpack.packb({"k": int(kind), "s": 0, **fields})])


def _remaining_ms(deadline: float) -> int:
    return max(0, int((deadline - time.monotonic()) * 1000))
