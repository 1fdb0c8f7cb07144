"""Configuration: one frozen, validated dataclass. This module is the only reader of the environment.

Where a job's rank and world size come from, in order of precedence:

1. explicit ``Config(rank=..., world_size=...)`` arguments,
2. ``ADAPM_RANK`` / ``ADAPM_WORLD_SIZE`` (set by ``adapm-run``),
3. mpirun: ``OMPI_COMM_WORLD_RANK`` / ``OMPI_COMM_WORLD_SIZE``, or ``PMI_RANK`` / ``PMI_SIZE``,
4. srun: ``SLURM_PROCID`` / ``SLURM_NTASKS``,
5. torchrun: ``RANK`` / ``WORLD_SIZE``,
6. otherwise a single node (rank 0 of 1), which needs no sockets.

The rendezvous address (rank 0 hosts it) comes from ``ADAPM_RENDEZVOUS`` (``host:port``), or under
torchrun from ``MASTER_ADDR`` and ``MASTER_PORT + 1`` (torchrun's own agent already listens on
``MASTER_PORT``), or under mpirun (Open MPI) and srun with every rank on this host from the
launcher's job id (``adapm.launch.derived_rendezvous``).

The job secret that authenticates its nodes (``Config.secret``, see docs/security.md) comes from
``ADAPM_SECRET`` (set by ``adapm-run``) or ``ADAPM_SECRET_FILE`` (a file only its owner can
read; checked); ``ADAPM_AUTH`` sets ``Config.auth``.

Nothing falls back silently: an ``ADAPM_*`` variable adapm does not know (a typo) and a rank
variable without its world-size partner (or the reverse) are ConfigErrors, and a ``Config``
given to ``adapm.init`` under a launcher takes the launcher's rank, world size and rendezvous
(:func:`under_launcher`) instead of running as one of N unrelated single nodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import ipaddress
import math
import os
import stat
from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

import numpy as np

from . import _argtypes
from .errors import ConfigError
from .sampling import Sampling

MANAGEMENT_VARIANTS = (
    "adaptive",
    "replication_only",
    "relocation_only",
    "static_partition",
    "full_replication",
)
# Config.replica_updates: how an owner merges a replica's updates (native/sync_serve.c).
REPLICA_UPDATES = ("sum", "average")
# Most channels per node (the native store's shards: STORE_MAX_SHARDS in native/store.h).
MAX_CHANNELS = 64

# A shorter secret could be guessed offline from one recorded handshake; adapm-run's has 43.
MIN_SECRET_LENGTH = 16
# A secret file larger than this is not a secret file (a wrong path, most likely).
_MAX_SECRET_FILE_BYTES = 4096


# Every ADAPM_* variable adapm reads, with its meaning; any other ADAPM_* name is an error.
ENV_VARIABLES = {
    "ADAPM_RANK": "this process's rank (set by adapm-run)",
    "ADAPM_WORLD_SIZE": "number of processes in the job (set by adapm-run)",
    "ADAPM_RENDEZVOUS": "host:port of rank 0's rendezvous (set by adapm-run)",
    "ADAPM_JOB": "Config.job: an id the job's ranks share (set by adapm-run)",
    "ADAPM_DEBUG": "1: the apps show a traceback for configuration and launch errors too",
    "ADAPM_TERMINAL": "1: the launcher's stderr is a terminal, so the apps draw their progress "
                      "bars (set by adapm-run)",
    "ADAPM_HOST": "address this node binds and advertises (Config.host)",
    "ADAPM_MANAGEMENT": "Config.management",
    "ADAPM_CHANNELS": "Config.channels",
    "ADAPM_REQUEST_TIMEOUT_S": "Config.request_timeout_s",
    "ADAPM_CONNECT_TIMEOUT_S": "Config.connect_timeout_s",
    "ADAPM_FAILURE_TIMEOUT_S": "Config.failure_timeout_s",
    "ADAPM_TRACE_DIR": "Config.trace_dir",
    "ADAPM_TRACE_KEYS": 'Config.trace_keys: "all", N, or keys separated by commas',
    "ADAPM_AUTH": "Config.auth: 1 (on), 0 (off; loopback only) or auto",
    "ADAPM_SECRET": "Config.secret: the job's secret (set by adapm-run)",
    "ADAPM_SECRET_FILE": "path of a file readable only by its owner that holds Config.secret "
                         "(for mpirun, srun, torchrun)",
}

# Launchers' (rank, world size) variables, in order of precedence. For the first three a
# variable without its partner is an error; SLURM_PROCID without SLURM_NTASKS is a batch script
# run without --ntasks, and RANK alone is set by unrelated tools, so those mean "no launcher".
LAUNCHER_PAIRS = (
    ("ADAPM_RANK", "ADAPM_WORLD_SIZE", True),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", True),
    ("PMI_RANK", "PMI_SIZE", True),
    ("SLURM_PROCID", "SLURM_NTASKS", False),
    ("RANK", "WORLD_SIZE", False),
)


def _help(text: str, **kw):
    return field(metadata={"help": text}, **kw)


@dataclass(frozen=True, eq=False)
class Config:
    """All settings of one node. Frozen and validated on construction.

    ``help(adapm.Config)`` and :meth:`describe` list every field with its meaning.
    """

    num_keys: int = _help("Number of keys; keys are the integers [0, num_keys).")
    value_length: Union[int, np.ndarray] = _help(
        "Floats per key: one int for all keys, or an int array of length num_keys.", default=1
    )
    rank: int = _help("This node's rank in [0, world_size).", default=0)
    world_size: int = _help("Number of nodes (processes) in the job.", default=1)
    rendezvous: Optional[str] = _help(
        "host:port where rank 0 hosts the rendezvous; required when world_size > 1.", default=None
    )
    host: Optional[str] = _help(
        "Address this node binds and advertises to peers. None: loopback when the rendezvous is on "
        "loopback, else the local address that routes to the rendezvous host.",
        default=None,
    )
    management: str = _help(
        "Parameter management variant: " + ", ".join(MANAGEMENT_VARIANTS) + ".",
        default="adaptive",
    )
    action_timing: bool = _help(
        "Act on intents when the action timer says so (paper, Algorithm 1); False: next round.",
        default=True,
    )
    timing_alpha: float = _help("Smoothing factor of the clocks-per-round estimate.", default=0.1)
    timing_p: float = _help("Poisson quantile used by the action timer.", default=0.9999)
    timing_lambda0: float = _help("Initial clocks-per-round estimate.", default=10.0)
    sampling: Optional[Sampling] = _help(
        "The sampling domain of prepare_sample/pull_sample (adapm.Sampling); None: no sampling.",
        default=None,
    )
    replica_updates: str = _help(
        "How an owner merges a replica's updates: 'sum' (every push adds, exactly: the default) "
        "or 'average' (a replica's update is divided by the number of nodes that use the key "
        "at the time: local SGD's model average, for plain SGD, whose summed stale steps "
        "overshoot when many nodes train the same rows; pushes are then not exact sums).",
        default="sum",
    )
    channels: int = _help(
        "Engine threads per node (as the C++ AdaPM's --sys.channels): the keys are split over "
        "this many channels, key k to channel (k // world_size) % channels, each with an engine "
        "thread, sockets and a share of the store of its own, so that a node with many "
        "workers is not held to one engine core. The same on every node; at most "
        f"{MAX_CHANNELS}.", default=1
    )
    max_rounds_per_s: Optional[float] = _help(
        "Optional cap on sync rounds per second; None: next round as soon as the last is answered.",
        default=None,
    )
    request_timeout_s: float = _help(
        "Longest wait for a peer's answer to one request before AdaPMTimeout.", default=60.0
    )
    connect_timeout_s: float = _help(
        "Longest wait for all nodes to join the rendezvous, and for a barrier.", default=120.0
    )
    failure_timeout_s: float = _help(
        "A peer that sends nothing (not even a heartbeat) for this long is declared failed: "
        "every call on every other node then raises NodeFailure naming it.", default=4.0
    )

    trace_dir: Optional[str] = _help(
        "Record a parameter-placement trace into this directory (Parquet; see adapm.trace). "
        "None: no trace, at no cost.", default=None
    )
    trace_keys: Union[str, int, np.ndarray] = _help(
        'Keys a trace records: "all", a list of keys, or an int N for a random sample of N keys '
        "(seeded: the same keys on every node and run).", default="all"
    )
    auth: Optional[bool] = _help(
        "Authenticate and encrypt all traffic between nodes, rendezvous included (ZeroMQ CURVE, "
        "keys derived from secret; see docs/security.md). None: on whenever the rendezvous or "
        "host is not loopback; True: on, also on loopback; False: off, allowed only when the "
        "rendezvous and host are loopback.", default=None
    )
    job: Optional[str] = _help(
        "An id that every rank of this job shares and no other job on the same rendezvous "
        "does: the rendezvous refuses a rank whose id differs, so two jobs started on one port "
        "cannot pair up. adapm-run sets one per job (ADAPM_JOB); under srun, mpirun (Open MPI) "
        "and torchrun their own job ids are taken; None: no check.", default=None
    )
    secret: Optional[str] = _help(
        "The job's shared secret (the same on every rank, at least 16 characters) from which "
        "every rank's CURVE keys derive; needed when auth is on. adapm-run makes one per job; "
        "other launchers: ADAPM_SECRET_FILE or ADAPM_SECRET. Never shown in repr or errors.",
        default=None, repr=False
    )

    def __post_init__(self) -> None:
        _check_int("num_keys", self.num_keys, low=1)
        if self.job is not None and (not isinstance(self.job, str) or not self.job
                                     or len(self.job) > 200 or not self.job.isprintable()):
            raise ConfigError(f"job must be a printable string of 1 to 200 characters, got "
                              f"{self.job!r:.80}")
        vl = self.value_length
        if isinstance(vl, (int, np.integer)) and not isinstance(vl, bool):
            _check_int("value_length", int(vl), low=1)
            object.__setattr__(self, "value_length", int(vl))
        else:
            try:
                arr = np.asarray(vl)
            except Exception as exc:  # pragma: no cover - numpy accepts nearly anything
                raise ConfigError(f"value_length: cannot convert {type(vl).__name__}") from exc
            if arr.ndim != 1 or arr.dtype.kind not in "iu":
                raise ConfigError(
                    "value_length must be a positive int or a 1-d integer array of per-key lengths, "
                    f"got dtype={arr.dtype} ndim={arr.ndim}"
                )
            if arr.shape[0] != self.num_keys:
                raise ConfigError(
                    f"value_length has {arr.shape[0]} entries but num_keys is {self.num_keys}"
                )
            if arr.size and int(arr.min()) < 1:
                raise ConfigError("value_length entries must all be >= 1")
            arr = np.array(arr, dtype=np.int64)
            arr.setflags(write=False)
            object.__setattr__(self, "value_length", arr)
        _check_int("world_size", self.world_size, low=1)
        _check_int("rank", self.rank, low=0)
        if self.rank >= self.world_size:
            raise ConfigError(f"rank {self.rank} is not below world_size {self.world_size}")
        if self.world_size > 1:
            if not self.rendezvous:
                raise ConfigError(
                    "world_size > 1 needs a rendezvous address: set ADAPM_RENDEZVOUS=host:port, "
                    "MASTER_ADDR/MASTER_PORT, or Config(rendezvous=...); adapm-run sets it for you"
                )
            parse_address(self.rendezvous, "rendezvous")
        if self.replica_updates not in REPLICA_UPDATES:
            raise ConfigError(
                f"replica_updates must be one of {REPLICA_UPDATES}, got {self.replica_updates!r}"
            )
        if self.management not in MANAGEMENT_VARIANTS:
            raise ConfigError(
                f"management must be one of {MANAGEMENT_VARIANTS}, got {self.management!r}"
            )
        if self.sampling is not None:
            if not isinstance(self.sampling, Sampling):
                raise ConfigError(f"sampling must be an adapm.Sampling, got "
                                  f"{type(self.sampling).__name__}")
            if self.sampling.high > self.num_keys:
                raise ConfigError(f"sampling: domain [{self.sampling.low}, {self.sampling.high}) "
                                  f"reaches past num_keys {self.num_keys}")
        if not 0.0 < self.timing_alpha <= 1.0:
            raise ConfigError(f"timing_alpha must be in (0, 1], got {self.timing_alpha}")
        if not 0.0 < self.timing_p < 1.0:
            raise ConfigError(f"timing_p must be in (0, 1), got {self.timing_p}")
        if not self.timing_lambda0 > 0:
            raise ConfigError(f"timing_lambda0 must be > 0, got {self.timing_lambda0}")
        _check_int("channels", self.channels, low=1)
        if self.channels > MAX_CHANNELS:
            raise ConfigError(f"channels must be at most {MAX_CHANNELS}, got {self.channels}")
        if self.max_rounds_per_s is not None and not self.max_rounds_per_s > 0:
            raise ConfigError(f"max_rounds_per_s must be > 0 or None, got {self.max_rounds_per_s}")
        for name in ("request_timeout_s", "connect_timeout_s", "failure_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float))
                                               and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
        if self.trace_dir is not None and not (isinstance(self.trace_dir, str)
                                               and self.trace_dir):
            raise ConfigError(f"trace_dir must be a directory path or None, got "
                              f"{self.trace_dir!r}")
        object.__setattr__(self, "trace_keys", _trace_keys(self.trace_keys, self.num_keys))
        self._check_auth()

    def _check_auth(self) -> None:
        """Validate ``auth`` and ``secret`` (never putting the secret in a message)."""
        if self.auth is not None and not isinstance(self.auth, bool):
            raise ConfigError(f"auth must be True, False or None (automatic), got {self.auth!r}")
        if self.secret is not None:
            if not isinstance(self.secret, str):
                raise ConfigError(f"secret must be a str, got {type(self.secret).__name__}")
            if len(self.secret) < MIN_SECRET_LENGTH or not self.secret.isprintable() or \
                    self.secret.strip() != self.secret:
                raise ConfigError(
                    f"secret must be at least {MIN_SECRET_LENGTH} printable characters without "
                    "surrounding spaces (the one given is not shown); make one with: python -c "
                    "'import secrets; print(secrets.token_urlsafe(32))'"
                )
        if self.world_size == 1:
            return  # a single node opens no sockets
        if self.auth is False and not self.loopback_only:
            where = f"the rendezvous is {self.rendezvous!r}" + (
                f" and the host {self.host!r}" if self.host is not None else "")
            raise ConfigError(
                f"auth=False (ADAPM_AUTH=0) is allowed only when the rendezvous and this node's "
                f"host are loopback addresses, but {where}: across machines every rank needs "
                "the job's secret instead (adapm-run passes one; see Config.secret)"
            )
        if self.authenticated and self.secret is None:
            why = ("auth=True (ADAPM_AUTH=1)" if self.auth else
                   "the rendezvous or host is not a loopback address")
            raise ConfigError(
                f"authentication is on ({why}) but there is no job secret: adapm-run makes one "
                "per job; under mpirun, srun or torchrun give every rank the same secret with "
                "ADAPM_SECRET_FILE=path (a file only you can read: chmod 600) or ADAPM_SECRET, "
                "or pass Config(secret=...); make one with: python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'"
            )

    @property
    def loopback_only(self) -> bool:
        """Whether the rendezvous and this node's host (when given) are loopback addresses, so
        that no other machine can reach this node's sockets."""
        if self.rendezvous is None:
            return True
        host = parse_address(self.rendezvous, "rendezvous")[0]
        return is_loopback(host) and (self.host is None or is_loopback(self.host))

    @property
    def authenticated(self) -> bool:
        """Whether this node's traffic is authenticated and encrypted (``auth``, or when None,
        whether it leaves loopback); always False for a single node, which opens no sockets."""
        if self.world_size == 1:
            return False
        return self.auth if self.auth is not None else not self.loopback_only

    @property
    def uniform_length(self) -> int:
        """The common value length, or 0 when lengths differ per key."""
        return self.value_length if isinstance(self.value_length, int) else 0

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, **overrides) -> "Config":
        """Build a Config from launcher variables (see module docstring), then ``overrides``.

        ``env`` defaults to ``os.environ``; this is the only place adapm reads it.
        """
        env = os.environ if env is None else env
        check_env_names(env)
        found = detect_cluster(env)
        found.update(env_settings(env))
        found.update(env_auth(env))
        names = [f.name for f in dataclasses.fields(cls)]
        for name in overrides:
            if name not in names:  # as Python's TypeError would, but naming the closest field
                close = difflib.get_close_matches(name, names, n=1)
                raise ConfigError(f"{name}: not a setting of adapm.Config"
                                  + (f"; did you mean {close[0]}?" if close else "")
                                  + " (adapm.Config.describe() lists them)")
        found.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**found)

    @classmethod
    def describe(cls) -> str:
        """One line per field: name, default and help text."""
        lines = []
        for f in dataclasses.fields(cls):
            default = "required" if f.default is dataclasses.MISSING else repr(f.default)
            lines.append(f"{f.name} ({default}): {f.metadata.get('help', '')}")
        return "\n".join(lines)


def _trace_keys(value, num_keys: int):
    """``trace_keys`` validated: "all", an int sample size >= 1, or a read-only sorted array of
    distinct keys in [0, num_keys)."""
    if isinstance(value, str):
        if value != "all":
            raise ConfigError(f'trace_keys must be "all", a list of keys or an int, got {value!r}')
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        _check_int("trace_keys", int(value), low=1)
        return int(value)
    try:
        arr = np.asarray(value)
    except Exception as exc:  # pragma: no cover - numpy accepts nearly anything
        raise ConfigError(f"trace_keys: cannot read {type(value).__name__} as keys") from exc
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ConfigError(f"trace_keys must be a 1-d list of integer keys, got dtype={arr.dtype} "
                          f"ndim={arr.ndim}")
    arr = np.unique(arr.astype(np.int64))
    if arr.size and (arr[0] < 0 or arr[-1] >= num_keys):
        bad = int(arr[0] if arr[0] < 0 else arr[-1])
        raise ConfigError(f"trace_keys: key {bad} is outside [0, {num_keys})")
    arr.setflags(write=False)
    return arr


def debug(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``ADAPM_DEBUG`` asks for tracebacks of user errors (the apps)."""
    env = os.environ if env is None else env
    return env.get("ADAPM_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def on_terminal(stream, env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``stream`` reaches a terminal: itself, or through adapm-run, which relays a
    rank's output through a pipe and says in ``ADAPM_TERMINAL`` that its own stderr is one."""
    env = os.environ if env is None else env
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or closed
        pass
    return env.get("ADAPM_TERMINAL", "").strip() == "1"


def check_env_names(env: Mapping[str, str]) -> None:
    """ConfigError for an ``ADAPM_*`` variable adapm does not read (naming the closest known
    one), so that a misspelt setting is not silently ignored."""
    for name in sorted(env):
        if name.startswith("ADAPM_") and name not in ENV_VARIABLES:
            close = difflib.get_close_matches(name, ENV_VARIABLES, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"unknown environment variable {name}{hint} (adapm reads: "
                              f"{', '.join(sorted(ENV_VARIABLES))})")


def detect_cluster(env: Mapping[str, str]) -> dict:
    """Rank, world size and rendezvous address from launcher variables; {} for a single node.

    ConfigError when a launcher's rank variable is set without its world size, or the reverse
    (see :data:`LAUNCHER_PAIRS`).
    """
    out: dict = {}
    for rank_var, size_var, strict in LAUNCHER_PAIRS:
        if strict and (rank_var in env) != (size_var in env):
            have, missing = (rank_var, size_var) if rank_var in env else (size_var, rank_var)
            raise ConfigError(f"environment variable {have} is set but {missing} is not; a "
                              f"launcher sets both (unset {have} to run a single node)")
    found = [(rank_var, size_var, _env_int(env, rank_var), _env_int(env, size_var))
             for rank_var, size_var, _ in LAUNCHER_PAIRS if rank_var in env and size_var in env]
    if found:
        first = found[0]
        out["rank"], out["world_size"] = first[2], first[3]
        for other in found[1:]:
            # A stale ADAPM_RANK=0 ADAPM_WORLD_SIZE=1 under mpirun would make N unrelated
            # single nodes that all "succeed": two launchers that disagree are an error.
            if other[2:] != first[2:]:
                raise ConfigError(
                    f"environment variables {first[0]}/{first[1]} say rank {first[2]} of "
                    f"{first[3]}, but {other[0]}/{other[1]} say rank {other[2]} of {other[3]}; "
                    f"a stale setting from another launch? unset the one that is wrong")
    job = _launcher_job(env)
    if job is not None:
        out["job"] = job
    if "ADAPM_RENDEZVOUS" in env:
        out["rendezvous"] = env["ADAPM_RENDEZVOUS"]
    elif "MASTER_ADDR" in env and "MASTER_PORT" in env:
        out["rendezvous"] = f"{env['MASTER_ADDR']}:{_env_int(env, 'MASTER_PORT') + 1}"
    elif out.get("world_size", 1) > 1:
        # mpirun or srun with every rank on this host: one the ranks derive alike from the
        # launcher's job id (adapm.launch.derived_rendezvous; across hosts a ConfigError)
        from .launch import derived_rendezvous

        derived = derived_rendezvous(env)
        if derived is not None:
            out["rendezvous"] = derived
    spread = _across_hosts(env)
    if spread and out.get("rendezvous"):
        host = parse_address(out["rendezvous"], "rendezvous")[0]
        looped = _loopback_here(host)
        if looped:
            named = "ADAPM_RENDEZVOUS" if "ADAPM_RENDEZVOUS" in env else "MASTER_ADDR"
            raise ConfigError(
                f"{spread}, but the rendezvous {out['rendezvous']} is {looped} on this host, "
                f"which the other hosts cannot reach: give {named} rank 0's address on their "
                "network (`hostname -I` on rank 0's host lists them), or map its host name to "
                "that address in /etc/hosts")
    return out


def _across_hosts(env: Mapping[str, str]) -> Optional[str]:
    """What a launcher says of ranks on several hosts ("mpirun started 4 ranks on several
    hosts"), or None when it says they share one or does not say."""
    pairs = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun"),
             ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "torchrun"))
    for world, local, launcher in pairs:
        if env.get(world, "").strip().isdigit() and env.get(local, "").strip().isdigit() and \
                int(env[local]) < int(env[world]):
            return f"{launcher} started {env[world]} ranks on several hosts ({env[local]} here)"
    nodes = env.get("SLURM_STEP_NUM_NODES", "").strip()
    if nodes.isdigit() and int(nodes) > 1:
        return f"srun started its tasks on {nodes} nodes"
    return None


def _loopback_here(host: str) -> Optional[str]:
    """How ``host`` is a loopback address here ("127.0.0.1", "vm, 127.0.1.1 here"), or None
    (not, or it does not resolve: the rendezvous says so then)."""
    if is_loopback(host):
        return "a loopback address"
    import socket

    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except (OSError, UnicodeError):
        return None
    if found and all(ipaddress.ip_address(a).is_loopback for a in found):
        return f"{host}, which resolves to {sorted(found)[0]}, a loopback address"
    return None


# Job ids of launchers, in order of precedence (ADAPM_JOB first): every rank of a job sees the
# same value, another job another one.
_JOB_VARIABLES = (("ADAPM_JOB",), ("SLURM_JOB_ID", "SLURM_STEP_ID"), ("PMIX_NAMESPACE",),
                  ("OMPI_MCA_ess_base_jobid",), ("TORCHELASTIC_RUN_ID",))


def _launcher_job(env: Mapping[str, str]) -> Optional[str]:
    for names in _JOB_VARIABLES:
        if names[0] in env:
            return ".".join(env.get(name, "") for name in names)[:200] or None
    return None


# The job secret taken out of this process's environment by remove_secret_from_env(), with the
# rendezvous it was for: later reads in this process, for the same job, still find it, while
# the processes a rank starts do not inherit it.
_secret_taken: Optional[tuple[str, Optional[str]]] = None


def remove_secret_from_env() -> None:
    """Take ``ADAPM_SECRET`` out of ``os.environ`` (adapm.init calls this once the node's Config
    is built): a rank's children (data loader workers, a shell, a tool) do not inherit it."""
    global _secret_taken
    secret = os.environ.pop("ADAPM_SECRET", None)
    if secret is not None:
        _secret_taken = (secret, os.environ.get("ADAPM_RENDEZVOUS"))


def env_auth(env: Mapping[str, str]) -> dict:
    """``auth`` and ``secret`` from ``ADAPM_AUTH``, ``ADAPM_SECRET`` and ``ADAPM_SECRET_FILE``
    (only those set). ConfigError for a bad ``ADAPM_AUTH``, both secret variables at once, or a
    secret file that :func:`read_secret_file` refuses."""
    out: dict = {}
    if "ADAPM_AUTH" in env:
        text = env["ADAPM_AUTH"].strip().lower()
        if text in ("1", "true", "yes", "on"):
            out["auth"] = True
        elif text in ("0", "false", "no", "off"):
            out["auth"] = False
        elif text != "auto":
            raise ConfigError(f"environment variable ADAPM_AUTH must be 1, 0 or auto, got "
                              f"{env['ADAPM_AUTH']!r}")
    if "ADAPM_SECRET" in env and "ADAPM_SECRET_FILE" in env:
        raise ConfigError("environment variables ADAPM_SECRET and ADAPM_SECRET_FILE are both set; "
                          "set only one")
    if "ADAPM_SECRET" in env:
        out["secret"] = env["ADAPM_SECRET"]
    elif "ADAPM_SECRET_FILE" in env:
        out["secret"] = read_secret_file(env["ADAPM_SECRET_FILE"])
    elif env is os.environ and _secret_taken is not None and \
            _secret_taken[1] == env.get("ADAPM_RENDEZVOUS"):
        out["secret"] = _secret_taken[0]  # this job's, removed from the environment at init
    return out


def read_secret_file(path: str) -> str:
    """The job secret held in ``path`` (surrounding whitespace removed).

    ConfigError if the file is missing or unreadable, not a regular file, owned by another user,
    open to its group or to others in any way (as ssh does for private keys: ``chmod 600``),
    or empty. The mode is checked on the file that was opened, not on the path beforehand.
    """
    where = f"ADAPM_SECRET_FILE {path!r}"
    try:
        # O_NONBLOCK: a FIFO (or a device) would block the open until a writer comes; it is
        # refused below as not a regular file. Reads from a regular file ignore the flag.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot open it: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{where} is not a regular file")
        if info.st_uid != os.geteuid():
            raise ConfigError(f"{where} belongs to uid {info.st_uid}, not to this user: whoever "
                              "owns it can read the secret; use a file of your own (chmod 600)")
        if info.st_mode & 0o077:
            raise ConfigError(f"{where} has mode {stat.S_IMODE(info.st_mode):04o}, so other "
                              f"users can read or change the job secret; make it readable only "
                              f"by you: chmod 600 {path}")
        data = os.read(fd, _MAX_SECRET_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"{where} is larger than {_MAX_SECRET_FILE_BYTES} bytes; a secret file "
                          "holds one line")
    try:
        secret = data.decode().strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text") from None
    if not secret:
        raise ConfigError(f"{where} is empty")
    if len(secret.splitlines()) > 1:
        raise ConfigError(f"{where} holds {len(secret.splitlines())} lines; a secret file holds "
                          "one (the secret, on one line)")
    return secret


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is a loopback address; only ``localhost`` counts
    among names (nothing is resolved here)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def env_settings(env: Mapping[str, str]) -> dict:
    """The Config fields that ``ADAPM_*`` settings give (timeouts, host, management, channels,
    trace): only those set; ConfigError for a value that does not parse."""
    found: dict = {}
    for name in ("request_timeout_s", "connect_timeout_s", "failure_timeout_s"):
        var = "ADAPM_" + name.upper()
        if var in env:
            found[name] = _env_float(env, var)
    if "ADAPM_HOST" in env:
        found["host"] = env["ADAPM_HOST"]
    if "ADAPM_MANAGEMENT" in env:
        found["management"] = env["ADAPM_MANAGEMENT"]
    if "ADAPM_CHANNELS" in env:
        found["channels"] = _env_int(env, "ADAPM_CHANNELS")
    if "ADAPM_TRACE_DIR" in env:
        found["trace_dir"] = env["ADAPM_TRACE_DIR"]
    if "ADAPM_TRACE_KEYS" in env:
        try:  # as --trace-keys reads it
            found["trace_keys"] = _argtypes.trace_keys(env["ADAPM_TRACE_KEYS"])
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"environment variable ADAPM_TRACE_KEYS: {exc}") from None
    return found


def unapplied_env(config: Config, env: Optional[Mapping[str, str]] = None) -> list[str]:
    """The ``ADAPM_*`` settings in ``env`` whose value ``config`` (given whole to
    ``adapm.init(config=...)``, which takes them from nowhere else) does not have."""
    env = os.environ if env is None else env
    differ = []
    for name, value in env_settings(env).items():
        mine = getattr(config, name)
        same = np.array_equal(mine, value) if name == "trace_keys" and not isinstance(
            value, str) and not isinstance(mine, str) else mine == value
        if not same:
            differ.append("ADAPM_" + name.upper())
    return differ


def under_launcher(config: Config, env: Optional[Mapping[str, str]] = None) -> Config:
    """``config`` as it applies in this process: under a launcher (``world_size > 1`` in the
    environment), a config left at rank 0 of 1 takes the launcher's rank, world size and
    rendezvous; one that names other ranks than the launcher is a ConfigError. Without a
    launcher, ``config`` itself."""
    env = os.environ if env is None else env
    check_env_names(env)
    found = detect_cluster(env)
    if found.get("world_size", 1) <= 1:
        return config
    # The launcher's job secret, auth setting, job id and host (adapm-run --iface) apply where
    # the Config leaves them out.
    auth = {k: v for k, v in env_auth(env).items() if getattr(config, k) is None}
    if config.host is None and env.get("ADAPM_HOST"):
        auth["host"] = env["ADAPM_HOST"]
    job = found.pop("job", None)
    if config.job is None and job is not None:
        auth["job"] = job
    if config.world_size == 1 and config.rank == 0:
        return config.replace(**{k: v for k, v in found.items()
                                 if config.rendezvous is None or k != "rendezvous"}, **auth)
    if (config.rank, config.world_size) != (found["rank"], found["world_size"]):
        raise ConfigError(f"Config says rank {config.rank} of {config.world_size}, but the "
                          f"launcher started this process as rank {found['rank']} of "
                          f"{found['world_size']}; leave rank and world_size out of the Config")
    return config.replace(**auth) if auth else config


def parse_address(address: str, what: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` too); ConfigError naming ``what`` if malformed."""
    host, sep, port = str(address).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} must look like host:port, got {address!r}")
    return host, int(port)


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")


def _env_int(env: Mapping[str, str], var: str) -> int:
    try:
        return int(env[var])
    except ValueError:
        raise ConfigError(f"environment variable {var} must be an integer, got {env[var]!r}") from None


def _env_float(env: Mapping[str, str], var: str) -> float:
    try:
        return float(env[var])
    except ValueError:
        raise ConfigError(f"environment variable {var} must be a number, got {env[var]!r}") from None
