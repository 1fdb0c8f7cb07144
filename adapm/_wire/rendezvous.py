"""Ranks and rendezvous: how the nodes of a job find each other.

Rank 0 hosts the rendezvous at ``Config.rendezvous``. Every node first binds its own ROUTER on a
port the OS picks (so two jobs on one machine never collide), then tells rank 0 its address and a
fingerprint of its configuration. When all ``world_size`` nodes have checked in, rank 0 answers
each with the table of addresses (or with an error when ranks or configurations disagree).

With authentication on (``Config.authenticated``) the rendezvous is a CURVE server with rank 0's
keys and only the job's members get through (:mod:`adapm._wire.auth`); a hello whose rank is
not the rank its sender authenticated as is ignored, so nobody takes another rank's place. Both
sides count failed handshakes, so that a timeout can say that a peer's secret differs.

Nothing waits longer than it must. A member that checked in says so again every quarter of
``failure_timeout_s``, and rank 0 answers each hello at once with the ranks it still waits
for: so a member learns within ``failure_timeout_s`` that rank 0 died (NodeFailure naming
rank 0), and rank 0 that a member died after checking in (every member is told, NodeFailure
naming it). Rank 0 refuses the job at once, telling every member, when a hello disagrees:
another world size (named as such), another configuration, or a second process as a rank
already checked in. A hello for a rank outside the job is ignored (a stranger cannot stop the
job), and so is one of another job (``Config.job``: adapm-run's id, or the launcher's), which
is told so: two jobs started on one port do not pair up. The table carries a fresh random job
token, which the nodes put in their connections' identities
(:mod:`adapm._wire.zmq_transport`).

Hardened like the data path: frames are size-limited (ZMQ_MAXMSGSIZE), a hello that is not a
well-formed one (a map with an integer rank, a tcp address and a fingerprint) is ignored and
counted, and a member that gets a malformed answer raises TransportError naming the rendezvous
instead of failing somewhere later.
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
import zlib

import msgpack
import numpy as np
import zmq

from ..config import MAX_CHANNELS, Config, is_loopback, parse_address
from ..errors import AdaPMTimeout, ConfigError, NodeFailure, TransportError
from .auth import HandshakeWatch, JobKeys, authenticated_rank
from .protocol import Kind

# How long the rendezvous host keeps its socket open after answering, so the answers get out.
_ANSWER_LINGER_MS = 5000
# Largest rendezvous message: a hello is an address and a short fingerprint, an answer an
# address per rank; a larger frame disconnects its sender before it is buffered.
_MAX_HELLO_BYTES = 4096
_MAX_ADDRESS_CHARS = 300
# Hellos (a member) and answers (rank 0) per failure_timeout_s while the job forms.
_HELLOS_PER_TIMEOUT = 4
_TOKEN_BYTES = 16

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
    return [config.world_size, config.num_keys, length_sig, config.management,
            config.replica_updates, config.channels]


def rendezvous(config: Config, my_address: str | list[str], context: zmq.Context,
               keys: JobKeys | None = None) -> tuple[list, str]:
    """Block until every node has checked in; returns all nodes' addresses indexed by rank and
    the job token (see the module docstring). With channels (``Config.channels`` > 1) a node's
    address is a list of its channels' addresses, ``my_address`` too.

    ``keys``: the job's keys when authentication is on (the context must then have a running
    :class:`~adapm._wire.auth.ZapHandler`). Raises AdaPMTimeout after
    ``config.connect_timeout_s`` naming the ranks still missing (and failed handshakes, if
    any), NodeFailure within ``failure_timeout_s`` of rank 0, or a member that checked in,
    going silent, ConfigError when nodes disagree on the job's configuration.
    """
    host, port = parse_address(config.rendezvous, "rendezvous")
    endpoint = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    deadline = time.monotonic() + config.connect_timeout_s
    hello = {"k": int(Kind.HELLO), "s": config.rank, "addr": my_address,
             "fp": fingerprint(config), "job": config.job}
    if config.rank == 0:
        return _host_rendezvous(config, endpoint, hello, context, deadline, keys)
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE,
                    _MAX_HELLO_BYTES + _MAX_ADDRESS_CHARS * config.world_size * config.channels)
    # A routing id of its own, secret, and kept if the connection is made again: rank 0 answers
    # this rank's hellos only on it (a copy of the hello from elsewhere gets nothing).
    sock.setsockopt(zmq.ROUTING_ID, b"\x01" + secrets.token_bytes(15))
    watch = None
    try:
        if ":" in host:
            sock.setsockopt(zmq.IPV6, 1)
        if keys is not None:
            keys.make_client(sock, 0)
        watch = HandshakeWatch(sock)
        sock.connect(endpoint)
        packed = msgpack.packb(hello)
        sock.send(packed)
        return _await_table(sock, watch, packed, config, my_address, endpoint, deadline)
    except zmq.ZMQError as exc:
        raise TransportError(f"rank {config.rank}: rendezvous at {endpoint}: {exc}") from exc
    finally:
        if watch is not None:
            watch.close()
        sock.close()


def _await_table(sock, watch, packed: bytes, config: Config, my_address, endpoint: str,
                 deadline: float) -> tuple[list, str]:
    """A member's wait for the table: until rank 0 first answers, up to the deadline; from then
    on a hello every interval, and rank 0 must answer within ``failure_timeout_s``."""
    interval = config.failure_timeout_s / _HELLOS_PER_TIMEOUT
    heard = None  # when rank 0 last answered
    missing: list = []
    next_hello = float("inf")
    last_look = time.monotonic()
    while True:
        now = time.monotonic()
        if heard is not None and now - last_look > config.failure_timeout_s / 2:
            heard = now  # this process did not run (stopped, starved): the silence was ours
        last_look = now
        if heard is not None and now - heard > config.failure_timeout_s:
            raise NodeFailure(
                f"rank {config.rank}: the rendezvous host, rank 0, at {endpoint} stopped "
                f"answering: nothing from it for {now - heard:.1f}s (failure_timeout_s="
                f"{config.failure_timeout_s:g}) while it waited for ranks {missing}; did rank "
                "0 die?", 0, "the rendezvous")
        if now >= deadline:
            waited = (f"; rank 0 answered, still waiting for ranks {missing}" if heard is not None
                      else "; is rank 0 running?")
            raise AdaPMTimeout(
                f"rank {config.rank}: no address table from the rendezvous (rank 0) at {endpoint} "
                f"within {config.connect_timeout_s:g}s{waited}" + watch.describe())
        limit = deadline if heard is None else \
            min(deadline, next_hello, heard + config.failure_timeout_s + 0.001)
        if _wait(sock, watch, limit):
            answer = _answer_of(sock.recv(), config, my_address, endpoint)
            if answer[0] == "waiting":
                if heard is None:
                    next_hello = time.monotonic() + interval
                heard, missing = time.monotonic(), answer[1]
                continue
            return answer[1], answer[2]
        if heard is not None and time.monotonic() >= next_hello:
            sock.send(packed)  # still here (rank 0 fails the job if a member goes silent)
            next_hello = time.monotonic() + interval


def _answer_of(raw: bytes, config: Config, my_address, endpoint: str) -> tuple:
    """Rank 0's answer, checked: ("waiting", missing ranks) or ("table", addresses, token);
    ConfigError or NodeFailure for a refusal, TransportError for anything that is not a
    well-formed answer."""
    try:
        answer = msgpack.unpackb(raw)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        answer = exc
    kind = answer.get("k") if isinstance(answer, dict) else None
    if kind == Kind.ERROR and isinstance(answer.get("msg"), str):
        text = f"rank {config.rank}: rendezvous refused: {answer['msg'][:2000]}"
        failed = answer.get("r")
        if type(failed) is int and 0 <= failed < config.world_size:
            raise NodeFailure(text, failed, "the rendezvous")
        raise ConfigError(text)
    missing = answer.get("missing") if kind == Kind.WAITING else None
    if isinstance(missing, list) and len(missing) < config.world_size and \
            all(type(r) is int for r in missing):
        return "waiting", missing
    addrs = answer.get("addrs") if kind == Kind.TABLE else None
    token = answer.get("tok") if kind == Kind.TABLE else None
    if not (isinstance(addrs, list) and len(addrs) == config.world_size
            and all(_is_advert(a, config.channels) for a in addrs)
            and addrs[config.rank] == my_address
            and isinstance(token, str) and len(token) == 2 * _TOKEN_BYTES):
        raise TransportError(f"rank {config.rank}: the rendezvous at {endpoint} answered with "
                             f"something that is not this job's address table: "
                             f"{raw[:120]!r}")
    return "table", list(addrs), token


def _is_address(value) -> bool:
    """A node address as nodes advertise it: ``tcp://host:port``."""
    if not isinstance(value, str) or len(value) > _MAX_ADDRESS_CHARS or \
            not value.startswith("tcp://"):
        return False
    host, _, port = value[6:].rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _is_advert(value, channels: int | None = None) -> bool:
    """What a node advertises: its address, or with channels (``Config.channels`` > 1) a list
    of one address per channel; ``channels``: how many the job has (None: any)."""
    if isinstance(value, list):
        return 1 < len(value) <= MAX_CHANNELS and channels in (None, len(value)) and \
            all(_is_address(a) for a in value)
    return channels in (None, 1) and _is_address(value)


class _Refused(Exception):
    """The rendezvous cannot form the job: every member checked in so far is told ``text``."""

    def __init__(self, text: str, failed: int = -1) -> None:
        super().__init__(text)
        self.text, self.failed = text, failed


def _host_rendezvous(config: Config, endpoint: str, own: dict, context: zmq.Context,
                     deadline: float, keys: JobKeys | None) -> tuple[list, str]:
    sock = context.socket(zmq.ROUTER)
    watch = None
    try:
        if endpoint.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, _MAX_HELLO_BYTES + _MAX_ADDRESS_CHARS * config.channels)
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
    gather = _Gathering(config, own, keys)
    try:
        try:
            gather.run(sock, watch, endpoint, deadline)
        except _Refused as refused:
            for identity in gather.identities.values():
                _answer(sock, identity, Kind.ERROR, msg=refused.text, r=refused.failed)
            text = f"rank 0: rendezvous refused: {refused.text}"
            if refused.failed >= 0:
                raise NodeFailure(text, refused.failed, "the rendezvous") from None
            raise ConfigError(text) from None
        addrs = [gather.hellos[r]["addr"] for r in range(config.world_size)]
        token = secrets.token_hex(_TOKEN_BYTES)
        for identity in gather.identities.values():
            _answer(sock, identity, Kind.TABLE, addrs=addrs, tok=token)
        return addrs, token
    finally:
        watch.close()
        sock.close(linger=_ANSWER_LINGER_MS)


class _Gathering:
    """Rank 0's side of the rendezvous: the hellos so far, and what was ignored."""

    def __init__(self, config: Config, own: dict, keys: JobKeys | None) -> None:
        self.config, self.own, self.keys = config, own, keys
        self.hellos = {0: own}
        self.identities: dict[int, bytes] = {}  # rank -> connection, for the answers
        self.heard: dict[int, float] = {}  # rank -> last hello
        self.ignored = {"impostor": 0, "malformed": 0, "outside": 0, "other job": 0,
                        "copied": 0}

    def missing(self) -> list[int]:
        return sorted(set(range(self.config.world_size)) - set(self.hellos))

    def run(self, sock, watch, endpoint: str, deadline: float) -> None:
        config = self.config
        last_look = time.monotonic()
        while len(self.hellos) < config.world_size:
            now = time.monotonic()
            if now - last_look > config.failure_timeout_s / 2:
                # This process did not run (stopped, starved): the members' silence was ours.
                self.heard = dict.fromkeys(self.heard, now)
            last_look = now
            if self.heard:
                rank = min(self.heard, key=self.heard.get)
                silent = now - self.heard[rank]
                if silent > config.failure_timeout_s:
                    raise _Refused(f"rank {rank} checked in and then went silent for "
                                   f"{silent:.1f}s (failure_timeout_s={config.failure_timeout_s:g})"
                                   f"; did it die?", rank)
            if now >= deadline:
                raise AdaPMTimeout(
                    f"rank 0: rendezvous at {endpoint}: ranks {self.missing()} did not check in "
                    f"within {config.connect_timeout_s:g}s" + watch.describe() + self._ignored())
            # Looks at least every quarter timeout (a longer gap means this process stalled).
            limit = deadline if not self.heard else \
                min(deadline, min(self.heard.values()) + config.failure_timeout_s + 0.001,
                    now + config.failure_timeout_s / _HELLOS_PER_TIMEOUT)
            if _wait(sock, watch, limit):
                self._take(sock, sock.recv_multipart(copy=False))

    def _ignored(self) -> str:
        return "".join(f"; ignored {n} {what} hello(s)" if what != "malformed" else
                       f"; ignored {n} message(s) that were not a valid hello"
                       for what, n in self.ignored.items() if n)

    def _ignore(self, what: str, text: str) -> None:
        self.ignored[what] += 1
        if self.ignored[what] == 1:  # once: whoever sends them could send many
            _log.warning("rank 0: rendezvous: ignored %s (further ones are only counted)", text)

    def _take(self, sock, frames: list) -> None:
        """One message to the rendezvous: a hello taken in and answered, or ignored."""
        config, own = self.config, self.own
        hello = _hello(frames)
        if hello is None:  # not a hello: ignored (a node never dies of a message)
            return self._ignore("malformed", "a message that is not a valid hello")
        identity, payload = frames[0].bytes, frames[1]
        rank = hello["s"]
        sender = authenticated_rank(payload) if self.keys is not None else rank
        if rank != sender:
            # A member's keys with another rank's number: never let it take that place.
            return self._ignore("impostor", f"a hello that names rank {rank!r} from a connection "
                                            f"authenticated as rank {sender}")
        if hello.get("job") != own["job"]:
            _answer(sock, identity, Kind.ERROR,
                    msg=f"the rendezvous at {config.rendezvous} belongs to job "
                        f"{own['job'] or '(no job id)'}; this process to "
                        f"{hello.get('job') or '(no job id)'}: two jobs on one port, or ADAPM_JOB "
                        "set on some ranks only?")
            return self._ignore("other job", f"a hello of job {hello.get('job')!r}")
        theirs = hello["fp"]
        # The rank first: a stranger's "rank 99" of another world size is no member to refuse
        # the job for (it stopped the job)
        if not 0 <= rank < config.world_size:
            _answer(sock, identity, Kind.ERROR,
                    msg=f"rank {rank} is not in this job of {config.world_size} nodes")
            return self._ignore("outside", f"a hello for rank {rank!r}, outside the job")
        if theirs and theirs[0] != own["fp"][0]:
            self.identities[-1] = identity  # told too
            raise _Refused(f"rank {rank} was started for a job of {theirs[0]!r} nodes, rank 0 "
                           f"for {own['fp'][0]}: every rank needs the same world size")
        if rank in self.hellos:
            if rank != 0 and self.hellos[rank]["addr"] == hello["addr"]:
                if identity != self.identities[rank]:
                    # The same hello from another connection: a copy (a member's connection
                    # keeps its routing id, even reconnected); the table goes where it came
                    # first, the copy gets nothing (it took the table and the token).
                    return self._ignore("copied", f"a copy of rank {rank}'s hello from "
                                                  "another connection")
                self.heard[rank] = time.monotonic()  # the same member, still waiting
                _answer(sock, identity, Kind.WAITING, missing=self.missing())
                return None
            self.identities[-1] = identity
            raise _Refused(f"two processes checked in as rank {rank} (at "
                           f"{self.hellos[rank]['addr']} and {hello['addr']}); every rank "
                           "needs its own number")
        if theirs != own["fp"]:
            self.identities[-1] = identity
            raise _Refused(f"rank {rank} has configuration {theirs} but rank 0 has {own['fp']} "
                           "(world_size, num_keys, value lengths, management, replica_updates, "
                           "channels)")
        if not _is_advert(hello["addr"], config.channels):  # the table would not be one
            return self._ignore("malformed", f"a hello of rank {rank} whose address is not "
                                             f"one per channel ({config.channels})")
        self.hellos[rank] = hello
        self.identities[rank] = identity
        self.heard[rank] = time.monotonic()
        _answer(sock, identity, Kind.WAITING, missing=self.missing())
        return None


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
            not _is_advert(hello.get("addr")) or not isinstance(hello.get("fp"), list) or \
            not (hello.get("job") is None or isinstance(hello.get("job"), str)):
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
