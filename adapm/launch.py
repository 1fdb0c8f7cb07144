"""``adapm-run``: start the processes of one adapm job and watch them.

Usage::

    adapm-run -n N [--hosts h1,h2,...] [--iface IFACE] [--grace S] [--prefix auto|on|off]
              [--log-dir DIR] cmd args...

Each of the N processes runs ``cmd args...`` with ``ADAPM_RANK``, ``ADAPM_WORLD_SIZE``,
``ADAPM_RENDEZVOUS`` and ``ADAPM_SECRET`` set (and ``ADAPM_HOST`` when ``--iface`` is given);
``adapm.Config.from_env`` reads them. Without ``--hosts`` all processes run on this machine and
meet on 127.0.0.1.

The job secret (see ``adapm.Config.secret`` and docs/security.md) is made fresh for each job
(``secrets.token_urlsafe(32)``), unless adapm-run's own environment already has
``ADAPM_SECRET`` or ``ADAPM_SECRET_FILE``, which then apply. Local ranks get it in their
environment; remote ranks get it as the first line of their ssh channel's stdin, so that it
never appears on a command line (which ``ps`` shows every user of a host).

Output: with ``--prefix on`` every line a rank writes to stdout or stderr reaches adapm-run's
stdout or stderr behind ``[rank R]: `` (as torchrun's log prefix), each line written whole, so
two ranks' lines never mix within a line. ``auto`` (the default) prefixes a stream when there
are several ranks and that stream of adapm-run is a terminal; output going to a file or a pipe
keeps the ranks' lines as they wrote them, without the prefix (rank 0's JSON lines for a program
that reads them), each line whole.
``off``: the ranks write straight to adapm-run's stdout and stderr. ``--log-dir DIR``
(as torchrun's ``--log-dir`` with ``--tee``) also writes each rank's output, as it wrote it,
to ``DIR/rank-R.stdout`` and ``DIR/rank-R.stderr`` (created or overwritten).

The job fails as a whole: when one process exits non-zero or is killed by a signal, adapm-run
prints one line naming its rank, sends SIGTERM to the others, waits ``--grace`` seconds, kills what
is left with SIGKILL, reaps everything and exits non-zero. SIGINT/SIGTERM sent to adapm-run are
passed on to the processes in the same way (exit status 130 / 143).

:func:`derived_rendezvous` is what ``adapm.config`` uses under mpirun and srun without
``ADAPM_RENDEZVOUS`` (docs/operations.md). Besides adapm's argument types and errors this
module uses only the standard library. Linux only (SIOCGIFADDR, PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import ipaddress
import math
import os
import re
import secrets
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from . import __version__
from ._argtypes import non_negative_float, positive_int
from .errors import ConfigError

PROG = "adapm-run"
# How often the monitor loop looks at the children; bounds how late a failure is noticed.
POLL_S = 0.05
DEFAULT_GRACE_S = 5.0
LOOPBACK = "127.0.0.1"
_LOCAL_NAMES = ("localhost", LOOPBACK)
# Linux <linux/sockios.h>: get an interface's IPv4 address (struct ifreq).
_SIOCGIFADDR = 0x8915
_IFNAMSIZ = 16
# Linux <linux/prctl.h>: signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1
# Ports of a rendezvous derived from a launcher's job id: below Linux's ephemeral range
# (32768-60999, net.ipv4.ip_local_port_range), so that the OS does not hand them out as the
# source ports of outgoing connections.
DERIVED_PORTS = (10000, 32768)
# How long adapm-run waits, after the ranks are reaped, for their last output to be relayed
# (a process the rank started may keep the pipe open).
RELAY_JOIN_S = 5.0


# ---------------------------------------------------------------------------------------------
# Pure helpers (unit-tested)


def plan_ranks(n: int, hosts: Optional[Sequence[str]] = None) -> list[str]:
    """The host of each rank: ranks fill ``hosts`` in contiguous blocks of (nearly) equal size.

    Rank ``r`` runs on ``hosts[r * len(hosts) // n]``, so rank 0 is on ``hosts[0]`` and block
    sizes differ by at most one. Without hosts every rank runs on ``"localhost"``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not hosts:
        return ["localhost"] * n
    hosts = list(hosts)
    return [hosts[r * len(hosts) // n] for r in range(n)]


# Rank and world-size variables of the other launchers adapm reads (adapm.config.LAUNCHER_PAIRS;
# written out here so that adapm-run starts without importing numpy).
OTHER_LAUNCHER_VARIABLES = frozenset({
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
    "SLURM_NTASKS", "RANK", "WORLD_SIZE"})


def build_env(rank: int, n: int, rendezvous: str, host_addr: Optional[str] = None,
              job: Optional[str] = None, terminal: bool = False) -> dict:
    """The ``ADAPM_*`` variables for one rank (only those; the caller merges them into its env).

    ``ADAPM_HOST`` is present only when ``host_addr`` is given, ``ADAPM_JOB`` when ``job`` is,
    ``ADAPM_TERMINAL`` when ``terminal`` (adapm-run's stderr is a terminal: a rank's own is a
    pipe to adapm-run, which relays a progress bar's redrawn lines as they come).
    """
    env = {
        "ADAPM_RANK": str(rank),
        "ADAPM_WORLD_SIZE": str(n),
        "ADAPM_RENDEZVOUS": rendezvous,
    }
    if job is not None:
        env["ADAPM_JOB"] = job
    if host_addr is not None:
        env["ADAPM_HOST"] = host_addr
    if terminal:
        env["ADAPM_TERMINAL"] = "1"
    return env


def is_ipv4(text: str) -> bool:
    """Whether ``text`` is a dotted-quad IPv4 address."""
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def iface_address(iface: str) -> str:
    """``iface`` itself if it is an IPv4 address, else the IPv4 address of that local interface.

    Raises LookupError when there is no such interface or it has no IPv4 address.
    """
    if is_ipv4(iface):
        return iface
    name = iface.encode()
    if not name or len(name) >= _IFNAMSIZ or b"\0" in name:
        raise LookupError(f"{iface!r} is neither an IPv4 address nor an interface name")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            ifreq = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name))
        except OSError as exc:
            raise LookupError(
                f"no IPv4 address for interface {iface!r}: {exc.strerror or exc}"
            ) from None
    # struct ifreq: 16-byte name, then sockaddr_in (family 2 bytes, port 2 bytes, address 4 bytes).
    return socket.inet_ntoa(ifreq[_IFNAMSIZ + 4 : _IFNAMSIZ + 8])


# Where free_port looks first: above the registered ports most services use, below the range the
# OS hands out to bind(0) and to outgoing connections (read from /proc where there is one).
_FREE_PORT_LOW = 20000
_EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default ip_local_port_range


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_DEFAULT[0]


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now, for the rendezvous that rank 0 binds a
    moment later. Chosen at random below the OS's ephemeral range where there is room: a port
    the OS picked (bind to port 0) could be handed out again meanwhile, to another rank's own
    socket or an outgoing connection's source port, which made rank 0's bind fail now and then
    (the test suite, many jobs on one machine). Another process binding the same port on purpose
    can still take it; rank 0 then reports the port as taken."""
    top = _ephemeral_low()
    if top - _FREE_PORT_LOW >= 1000:
        pick = secrets.SystemRandom()
        for _ in range(64):
            port = pick.randrange(_FREE_PORT_LOW, top)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:  # in use (or in TIME_WAIT): another one
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def is_local_host(host: str) -> bool:
    """Whether ``host`` names this machine (so its ranks start without ssh): loopback, its
    host name or full name, or a name or address that resolves to an address of its own (one
    a socket here can bind)."""
    if host in _LOCAL_NAMES or host in (socket.gethostname(), socket.getfqdn()):
        return True
    addresses = _addresses(host)
    return bool(addresses) and all(_own_address(a) for a in addresses)


def _addresses(host: str) -> list[str]:
    """The IPv4 addresses ``host`` resolves to here ([] if it does not)."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)})
    except (OSError, UnicodeError):
        return []


def _own_address(address: str) -> bool:
    """Whether ``address`` is one of this machine's (a socket binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


# A destination for looking up the default route only (TEST-NET-3, RFC 5737): nothing is sent.
_ANYWHERE = "203.0.113.1"


def _route_address(host: str) -> Optional[str]:
    """This machine's address on the route to ``host`` (a UDP connect sends nothing), or on
    the default route when ``host`` does not resolve here (an ssh alias, say); None if there
    is no route."""
    addresses = _addresses(host) or [_ANYWHERE]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((addresses[0], 22))
            return sock.getsockname()[0]
        except OSError:
            return None


# How long ssh may take to connect to a host before the rank counts as failed (ssh waits for
# the TCP stack's own timeout otherwise: minutes for an address that drops packets).
SSH_CONNECT_TIMEOUT_S = 30


def remote_command(
    cmd: Sequence[str],
    env: dict,
    cwd: str,
    grace: float,
    iface: Optional[str] = None,
    secret_on_stdin: bool = False,
) -> str:
    """The command line ssh hands to the remote login shell to run one rank.

    It runs ``cmd`` in ``cwd`` with ``env`` added, and exits with its status. A watchdog reads
    the ssh channel's stdin: when it closes (adapm-run stopped the ssh client, or died), the
    command gets SIGTERM and, ``grace`` seconds later, SIGKILL, so no rank outlives the launcher.
    ``iface`` (an interface name) sets ``ADAPM_HOST`` to that interface's IPv4 address on the
    remote host (via ``ip``). ``secret_on_stdin``: the first line of stdin is the job secret,
    which the command gets as ``ADAPM_SECRET`` (in its environment, never on a command line).
    """
    q = shlex.quote
    assigns = " ".join(f"{k}={q(v)}" for k, v in env.items())
    parts = []
    if secret_on_stdin:
        # sh's read takes exactly one line from a pipe (byte by byte), so the rest of stdin is
        # left for the watchdog. An exported shell variable reaches the command's environment
        # without ever being an argument of a process.
        parts.append(
            "IFS= read -r ADAPM_SECRET || "
            f'{{ echo "{PROG}: no job secret on stdin" >&2; exit 2; }}'
        )
        parts.append("export ADAPM_SECRET")
    parts.append(f"cd {q(cwd)} || exit 1")
    if iface is not None:
        parts.append(
            f"h=$(ip -4 -o addr show dev {q(iface)} 2>/dev/null"
            " | sed -n 's/.* inet \\([0-9.]*\\).*/\\1/p' | head -n 1)"
        )
        parts.append(
            f'[ -n "$h" ] || {{ echo "{PROG}: no IPv4 address for interface '
            f'{q(iface)} on $(hostname)" >&2; exit 2; }}'
        )
        assigns += ' ADAPM_HOST="$h"'
    # fd 3 keeps the channel's stdin for the watchdog: a non-interactive shell gives background
    # jobs /dev/null as stdin unless it is redirected explicitly.
    parts.append("exec 3<&0")
    parts.append(f"env {assigns} {shlex.join(cmd)} </dev/null 3<&- & pid=$!")
    sleep_s = max(0, math.ceil(grace))  # POSIX sleep takes whole seconds
    parts.append(
        f'{{ cat >/dev/null; kill -TERM "$pid"; sleep {sleep_s}; kill -KILL "$pid"; }}'
        " <&3 >/dev/null 2>&1 & wd=$!"
    )
    parts.append("exec 3<&-")
    # The command ended by itself: stop the watchdog so it never signals a reused pid.
    parts.append('wait "$pid"; st=$?; kill "$wd" 2>/dev/null; exit "$st"')
    # Run under sh whatever the remote login shell is.
    return "exec sh -c " + q("; ".join(parts))


def ssh_argv(host: str, command: str) -> list[str]:
    """The local argv that runs ``command`` (from :func:`remote_command`) on ``host``."""
    return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}", host,
            command]


def derived_port(job: str) -> int:
    """The rendezvous port for launcher job id ``job``: the same on every rank, and spread
    evenly over :data:`DERIVED_PORTS` (BLAKE2b of the id), so two jobs of one host meet on the
    same port only with probability 1/22768."""
    digest = hashlib.blake2b(job.encode(), digest_size=8).digest()
    low, high = DERIVED_PORTS
    return low + int.from_bytes(digest, "big") % (high - low)


def derived_rendezvous(env) -> Optional[str]:
    """A rendezvous address for ranks started by mpirun (Open MPI) or srun without
    ``ADAPM_RENDEZVOUS``, when every rank runs on this host: ``127.0.0.1:PORT`` with PORT
    :func:`derived_port` of the launcher's job id (Open MPI's ``PMIX_NAMESPACE``, or
    ``OMPI_MCA_ess_base_jobid`` / ``OMPI_MCA_orte_hnp_uri`` before Open MPI 5; Slurm's
    ``SLURM_JOB_ID.SLURM_STEP_ID``). None when the launcher is neither, or does not say its job
    or how many hosts it uses. ConfigError when the ranks span several hosts: rank 0's host is
    not known to the others then, and the user names it (the message says how).

    Another job whose id maps to the same port, or another program on that port, makes rank 0
    fail to bind it (or the rendezvous refuse the other job's ranks: ``Config.job``); set
    ``ADAPM_RENDEZVOUS`` then."""
    if "OMPI_COMM_WORLD_SIZE" in env:
        job = next((env[k] for k in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                                     "OMPI_MCA_orte_hnp_uri") if env.get(k)), None)
        world, local = env["OMPI_COMM_WORLD_SIZE"], env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
        if job is None or local is None:
            return None
        if local != world:
            raise ConfigError(
                f"mpirun started {world} ranks on several hosts ({local} on this one) and "
                "ADAPM_RENDEZVOUS is not set: on one host adapm finds the rendezvous itself, "
                "across hosts give every rank rank 0's host and a free port, e.g. mpirun -x "
                "ADAPM_RENDEZVOUS=$(hostname):29500 -x ADAPM_SECRET_FILE=... -n N ... (from "
                "rank 0's host)")
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        # SLURM_STEP_*: set by srun for its step (a batch script's own shell has none)
        if not (env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID")
                and env.get("SLURM_STEP_NUM_NODES")):
            return None
        job = f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
        if env["SLURM_STEP_NUM_NODES"].strip() != "1":
            raise ConfigError(
                f"srun started its {env['SLURM_NTASKS']} tasks on "
                f"{env['SLURM_STEP_NUM_NODES']} nodes and ADAPM_RENDEZVOUS is not set: on one "
                "node adapm finds the rendezvous itself, across nodes give every task the first "
                "node and a free port, e.g. export ADAPM_RENDEZVOUS=$(scontrol show hostnames "
                "\"$SLURM_JOB_NODELIST\" | head -n 1):29500 before srun (and ADAPM_SECRET_FILE)")
    else:
        return None
    return f"{LOOPBACK}:{derived_port(job)}"


# A rank's output, split after each line end: after "\n", and after "\r" (a progress bar
# redrawing its line) unless "\n" follows it.
_LINE_END = re.compile(rb"(?<=\n)|(?<=\r)(?=[^\n])")


def prefix_lines(prefix: bytes, data: bytes) -> tuple[bytes, bytes]:
    """``(out, rest)``: the complete lines of ``data`` each behind ``prefix``, and the
    incomplete last line (to be completed by the next read). A trailing "\r" waits for the
    next read, which may bring its "\n"."""
    parts = _LINE_END.split(data)
    rest = parts.pop()
    return b"".join(prefix + part for part in parts), rest


def _relay(pipe, sink, prefix: bytes, lock: threading.Lock, log=None) -> None:
    """Copy a rank's output from ``pipe`` to ``sink`` (a binary stream), each line behind
    ``prefix`` and written whole under ``lock``, until the pipe closes; and as it comes to
    ``log`` (a binary file, closed at the end), when given."""
    rest = b""
    fd = pipe.fileno()
    try:
        while True:
            try:
                chunk = os.read(fd, 1 << 16)  # what is there now: progress shows promptly
            except OSError:
                break
            if not chunk:
                break
            if log is not None:
                try:
                    log.write(chunk)
                    log.flush()
                except OSError as exc:  # a full disk: the terminal still gets the output
                    _err(f"cannot write {log.name}: {exc}; no more of it is logged")
                    log.close()
                    log = None
            out, rest = prefix_lines(prefix, rest + chunk)
            if out:
                with lock:
                    sink.write(out)
                    sink.flush()
        if rest:  # a last line without its end
            with lock:
                sink.write(prefix + rest + (b"" if rest.endswith(b"\r") else b"\n"))
                sink.flush()
    except (OSError, ValueError):  # our own stdout/stderr closed: nothing to write to
        pass
    finally:
        pipe.close()
        if log is not None:
            log.close()


def use_prefix(mode: str, n: int, stream) -> bool:
    """Whether a rank's lines on ``stream`` (adapm-run's stdout or stderr) get the prefix."""
    if mode != "auto":
        return mode == "on"
    try:
        return n > 1 and stream.isatty()
    except (AttributeError, ValueError):
        return False


def describe_status(returncode: int) -> str:
    """``exited with status N`` or ``was killed by signal SIGNAME`` for a Popen returncode."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = str(-returncode)
    return f"was killed by signal {name}"


# ---------------------------------------------------------------------------------------------
# Command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Start N processes of an adapm job and stop them all if one fails.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} (adapm) {__version__}")
    parser.add_argument("-n", type=positive_int, required=True, metavar="N",
                        help="number of processes (ranks), >= 1")
    parser.add_argument("--hosts", metavar="H1,H2,...",
                        help="spread the ranks in contiguous blocks over these hosts (ssh for "
                             "hosts other than this one); rank 0's host hosts the rendezvous")
    parser.add_argument("--iface", metavar="IFACE",
                        help="IPv4 address or interface name each process binds and advertises "
                             "(sets ADAPM_HOST)")
    parser.add_argument("--grace", type=non_negative_float, default=DEFAULT_GRACE_S, metavar="S",
                        help="seconds between SIGTERM and SIGKILL when stopping (default 5)")
    parser.add_argument("--prefix", choices=("auto", "on", "off"), default="auto",
                        help="put '[rank R]: ' before each line of a rank's output; auto (the "
                             "default): with several ranks, on a stream that is a terminal")
    parser.add_argument("--log-dir", metavar="DIR",
                        help="also write each rank's output to DIR/rank-R.stdout and "
                             "DIR/rank-R.stderr (as written, without prefixes)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program to run and its arguments ('--' before it is allowed)")
    return parser


@dataclass(frozen=True)
class _Rank:
    """How to start one rank: argv, full environment (None: inherit), whether via ssh, and
    what to write to its stdin first (the job secret of a remote rank)."""

    rank: int
    host: str
    argv: list
    env: Optional[dict] = field(repr=False)
    remote: bool
    stdin_data: Optional[bytes] = field(default=None, repr=False)


def _job_secret(parser: argparse.ArgumentParser) -> tuple[Optional[str], bool]:
    """(the job secret to hand out, whether adapm-run made it). None when the user gave
    ``ADAPM_SECRET_FILE``: each rank reads that file on its own host."""
    given = os.environ.get("ADAPM_SECRET")
    if given is not None and "ADAPM_SECRET_FILE" in os.environ:
        parser.error("ADAPM_SECRET and ADAPM_SECRET_FILE are both set; set only one")
    if "ADAPM_SECRET_FILE" in os.environ:
        return None, False
    if given is not None:
        if not given or "\n" in given or "\r" in given:
            parser.error("ADAPM_SECRET must be one non-empty line")
        return given, False
    return secrets.token_urlsafe(32), True


def _plan(args, parser: argparse.ArgumentParser) -> list[_Rank]:
    """Turn parsed arguments into one start description per rank; usage errors exit 2."""
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error("missing command: give the program to run after the options, "
                     f"e.g. {PROG} -n 2 python train.py")
    n = args.n
    if args.log_dir is not None:
        try:
            os.makedirs(args.log_dir, exist_ok=True)
        except OSError as exc:
            parser.error(f"argument --log-dir: cannot create {args.log_dir!r}: "
                         f"{exc.strerror or exc}")
        if not os.access(args.log_dir, os.W_OK | os.X_OK):
            parser.error(f"argument --log-dir: {args.log_dir!r} is not writable")
    hosts = None
    if args.hosts is not None:
        hosts = [h.strip() for h in args.hosts.split(",")]
        if not all(hosts):
            parser.error(f"argument --hosts: empty host name in {args.hosts!r}")
    placement = plan_ranks(n, hosts)
    here = {h: is_local_host(h) for h in set(placement)}  # each host resolved once
    local = [here[h] for h in placement]

    local_addr = None
    if args.iface is not None and any(local):
        try:
            local_addr = iface_address(args.iface)
        except LookupError as exc:
            parser.error(f"argument --iface: {exc}")
    remote_iface = None
    if args.iface is not None and not all(local):
        if is_ipv4(args.iface):
            if len(set(placement)) > 1:
                parser.error("argument --iface: an IPv4 address belongs to one host; "
                             "with several hosts give an interface name")
        else:
            remote_iface = args.iface  # resolved on each remote host

    # Rank 0 hosts the rendezvous; every rank gets the same address for it.
    if all(local):
        rv_host = LOOPBACK
    elif local[0]:
        # Remote ranks cannot reach our loopback: name this machine in a way they can.
        if placement[0] in _LOCAL_NAMES:
            rv_host = local_addr or socket.gethostname()
        else:
            rv_host = placement[0]
        looped = [a for a in _addresses(rv_host) if ipaddress.ip_address(a).is_loopback]
        if local_addr is None and looped:
            # The name is loopback here (/etc/hosts maps the host name to 127.0.1.1 on many
            # systems): rank 0 would listen where no other host reaches. Our address on the
            # way to the first remote host instead.
            remote = placement[local.index(False)]
            rv_host_name, rv_host = rv_host, _route_address(remote)
            if rv_host is None:
                parser.error(f"rank 0's host name {rv_host_name!r} resolves to {looped[0]} "
                             f"here, which {remote} cannot reach, and this machine has no route "
                             "to it: give --iface (the interface or address the other hosts "
                             "reach this one on)")
    else:
        rv_host = placement[0]
    # Checked on this machine only; if rank 0 is remote and the port is taken there, rank 0
    # reports it.
    port = free_port(LOOPBACK if all(local) else "")
    rendezvous = f"{rv_host}:{port}"

    secret, made = _job_secret(parser)
    # Remote ranks do not inherit our environment: pass on the user's other ADAPM_* settings
    # (not ADAPM_HOST, an address of this machine; not ADAPM_SECRET, which goes over stdin).
    forwarded = {
        k: v for k, v in os.environ.items()
        if k.startswith("ADAPM_") and k not in ("ADAPM_HOST", "ADAPM_SECRET", "ADAPM_TERMINAL")
    }
    # One id per job: the rendezvous refuses a rank of another job on the same port.
    job = os.environ.get("ADAPM_JOB") or secrets.token_hex(8)
    # adapm-run is these processes' launcher: another launcher's rank variables (an sbatch
    # script's SLURM_PROCID, a shell's stale RANK) would contradict ours (adapm.Config refuses
    # that), so the ranks do not inherit them.
    inherited = {k: v for k, v in os.environ.items()
                 if k not in OTHER_LAUNCHER_VARIABLES and k != "ADAPM_TERMINAL"}
    cwd = os.getcwd()
    terminal = sys.stderr.isatty()
    ranks = []
    for r, host in enumerate(placement):
        if local[r]:
            env = {**inherited, **build_env(r, n, rendezvous, local_addr, job, terminal)}
            if made:
                env["ADAPM_SECRET"] = secret
            ranks.append(_Rank(r, host, cmd, env, remote=False))
        else:
            addr = args.iface if (args.iface is not None and remote_iface is None) else None
            env = {**forwarded, **build_env(r, n, rendezvous, addr, job, terminal)}
            command = remote_command(cmd, env, cwd, args.grace, iface=remote_iface,
                                     secret_on_stdin=secret is not None)
            stdin_data = None if secret is None else (secret + "\n").encode()
            ranks.append(_Rank(r, host, ssh_argv(host, command), None, remote=True,
                               stdin_data=stdin_data))
    return ranks


# ---------------------------------------------------------------------------------------------
# Running and monitoring


def _die_with_parent():
    """Build a preexec_fn that makes a child get SIGKILL if adapm-run dies without cleaning up
    (e.g. SIGKILL), so no rank is orphaned; None where prctl is unavailable."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _err(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _plural(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def _stop(procs: list, sig: int, grace: float, received: list) -> None:
    """Send ``sig`` to the running children, SIGKILL whatever is left after ``grace`` seconds
    (at once on a further SIGINT/SIGTERM to adapm-run), then reap every child."""
    signals_seen = len(received)
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:  # exited between poll and kill
                pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if len(received) > signals_seen:
            break
        time.sleep(POLL_S)
    _reap(procs)


def _reap(procs: list) -> None:
    """SIGKILL every child still running, wait for all and close their pipes."""
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()
        if p.stdin is not None:
            try:
                p.stdin.close()  # flushes what ssh never read: the pipe may be broken
            except BrokenPipeError:
                pass


def _monitor(ranks: list[_Rank], procs: list, grace: float, received: list) -> int:
    """Wait until all children exit 0 (-> 0), one fails, or adapm-run gets a signal."""
    while True:
        if received:
            sig = received[0]
            running = sum(p.poll() is None for p in procs)
            # The signal often reached the ranks too (Ctrl-C and `timeout` signal the process
            # group): those already gone are not "stopped".
            _err(f"received {signal.Signals(sig).name}; "
                 + (f"stopping {_plural(running)}" if running else
                    f"every rank had already exited ({len(procs)} started)"))
            _stop(procs, sig, grace, received)
            return 128 + sig
        failed = None
        running = 0
        for spec, p in zip(ranks, procs):
            rc = p.poll()
            if rc is None:
                running += 1
            elif rc != 0 and failed is None:
                failed = (spec, rc)
        if failed is not None:
            spec, rc = failed
            where = f" (host {spec.host})" if spec.remote else ""
            line = f"rank {spec.rank}{where} {describe_status(rc)}"
            if running:
                line += f"; stopping the other {_plural(running)}"
            _err(line)
            _stop(procs, signal.SIGTERM, grace, received)
            # A signal death has no exit code of its own; report plain failure.
            return rc if rc > 0 else 1
        if running == 0:
            return 0
        time.sleep(POLL_S)


def _run(ranks: list[_Rank], grace: float, prefix: str = "off",
         log_dir: Optional[str] = None) -> int:
    received: list[int] = []
    n = len(ranks)
    streams = {"stdout": sys.stdout, "stderr": sys.stderr}
    prefixed = {name for name, stream in streams.items() if use_prefix(prefix, n, stream)}
    # The streams adapm-run relays, a line at a time (the others go straight to its own).
    # Under auto, several ranks' output is relayed into a file or a pipe too, without the
    # prefix: written straight, each rank's buffer (8 KiB) cut lines of another in two.
    sinks = {name: stream for name, stream in streams.items()
             if name in prefixed or log_dir is not None or (prefix == "auto" and n > 1)}
    lock = threading.Lock()
    relays: list[threading.Thread] = []

    def on_signal(signum, frame):
        received.append(signum)

    previous = {}
    # Handlers can only be installed from the main thread (main() may be called from others).
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    procs: list = []
    try:
        preexec = _die_with_parent()
        for spec in ranks:
            if received:
                break
            try:
                procs.append(subprocess.Popen(
                    spec.argv,
                    env=spec.env,
                    stdin=subprocess.PIPE if spec.remote else None,
                    stdout=subprocess.PIPE if "stdout" in sinks else None,
                    stderr=subprocess.PIPE if "stderr" in sinks else None,
                    preexec_fn=preexec,
                ))
            except OSError as exc:
                stopping = f"; stopping {_plural(len(procs))}" if procs else ""
                _err(f"cannot start rank {spec.rank}: {exc}{stopping}")
                _stop(procs, signal.SIGTERM, grace, received)
                # Shell conventions: 127 not found, 126 found but not executable.
                return 127 if isinstance(exc, FileNotFoundError) else 126
            for name, sink in sinks.items():
                log = None
                if log_dir is not None:
                    try:
                        log = open(os.path.join(log_dir, f"rank-{spec.rank}.{name}"), "wb")
                    except OSError as exc:
                        _err(f"cannot write the log of rank {spec.rank}: {exc}")
                tag = f"[rank {spec.rank}]: ".encode() if name in prefixed else b""
                relay = threading.Thread(
                    target=_relay, name=f"{PROG}-relay-{spec.rank}-{name}", daemon=True,
                    args=(getattr(procs[-1], name), sink.buffer, tag, lock, log))
                relay.start()
                relays.append(relay)
            if spec.stdin_data is not None:
                # One short line: the pipe buffers it whatever ssh is doing. The pipe stays
                # open: closing it is how the remote watchdog learns that adapm-run is gone.
                try:
                    procs[-1].stdin.write(spec.stdin_data)
                    procs[-1].stdin.flush()
                except BrokenPipeError:  # ssh is already gone; the monitor reports its status
                    pass
        return _monitor(ranks[: len(procs)], procs, grace, received)
    finally:
        _reap(procs)  # last resort on an unexpected error; a no-op after _monitor
        deadline = time.monotonic() + RELAY_JOIN_S
        for relay in relays:  # the ranks' last lines, before adapm-run's own verdict
            relay.join(max(0.0, deadline - time.monotonic()))
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``adapm-run`` with ``argv`` (default ``sys.argv[1:]``); return the exit status.

    0: all ranks exited 0. 2: usage error. 128+sig: stopped by SIGINT/SIGTERM. Otherwise the
    failed rank's exit status, or 1 if it was killed by a signal.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        ranks = _plan(args, parser)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return _run(ranks, args.grace, args.prefix, args.log_dir)


if __name__ == "__main__":
    sys.exit(main())
