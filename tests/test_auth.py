"""Authenticated transport (ZeroMQ CURVE from a per-job secret, adapm._wire.auth).

Real processes on loopback with authentication switched on explicitly (``auth=True``): a job
still computes exact sums; sockets without the job's keys (plain ZeroMQ, CURVE with keys of no
member, keys derived from another secret) can deliver nothing to a node and cannot join the
rendezvous; a member's keys used with another rank's number in the header are dropped. Each
intrusion test has a control run with authentication off in which the same socket gets
through, so that the test can fail. Waits are bounded by handshake events and counters, never
by sleeping; no wall-clock assertions. Also: Config, ADAPM_* variables and the secret file, and
how adapm-run hands the secret to local and remote ranks.
"""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from adapm._wire.auth import JobKeys, rank_secret_key
from adapm._wire.protocol import Kind, encode, message
from adapm.config import Config, under_launcher
from adapm.errors import ConfigError
from adapm.launch import _parser, _plan, main, remote_command
from adapm.testing import free_port, listening, run_cluster

REPO = Path(__file__).resolve().parents[1]
SECRET = "the-test-job-secret-" + "k" * 12
OTHER_SECRET = "another-jobs-secret-" + "q" * 12
# Bounds on waits for things that do happen (a handshake, a counter); generous for a loaded
# machine, never reached when all is well.
WAIT_S = 30
N, L = 40, 2
FORGED = 1000.0  # what each intruder tries to add to key 0 (homed on rank 0)
HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def _clean_env(**extra) -> dict:
    """This process's environment without any launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADAPM_", "OMPI_", "PMI_",
                                                                     "SLURM_"))}
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


# ---------------------------------------------------------------------------------------------
# Keys


def test_keys_are_derived_per_rank_from_the_secret():
    k0, k2 = JobKeys(SECRET, 3, 0), JobKeys(SECRET, 3, 2)
    assert k0.public_keys == k2.public_keys  # every node derives every member's public key
    assert len(set(k0.public_keys)) == 3
    assert k0.public_keys[1] == zmq.curve_public(rank_secret_key(SECRET, 1))
    assert not set(JobKeys(OTHER_SECRET, 3, 0).public_keys) & set(k0.public_keys)
    assert [k0.member(z85.decode(p)) for p in k0.public_keys] == [0, 1, 2]
    assert k0.member(z85.decode(zmq.curve_keypair()[0])) is None
    assert SECRET not in repr(k0) and rank_secret_key(SECRET, 0).decode() not in repr(k0)


# ---------------------------------------------------------------------------------------------
# Config


def _cfg(**kw) -> Config:
    return Config(num_keys=10, **{"world_size": 2, "rank": 1, **kw})


def test_auth_is_automatic_off_loopback_only():
    assert not _cfg(rendezvous="127.0.0.1:5000").authenticated
    assert not _cfg(rendezvous="localhost:5000", host="::1").authenticated
    assert _cfg(rendezvous="127.0.0.1:5000", auth=True, secret=SECRET).authenticated
    assert _cfg(rendezvous="10.0.0.1:5000", secret=SECRET).authenticated
    # On loopback, but this node binds an address other machines can reach.
    assert _cfg(rendezvous="127.0.0.1:5000", host="0.0.0.0", secret=SECRET).authenticated
    assert not Config(num_keys=10, auth=True).authenticated  # one node opens no sockets


def test_auth_off_across_hosts_is_an_error():
    with pytest.raises(ConfigError, match="loopback"):
        _cfg(rendezvous="10.0.0.1:5000", auth=False, secret=SECRET)
    with pytest.raises(ConfigError, match="loopback"):
        _cfg(rendezvous="127.0.0.1:5000", host="10.0.0.2", auth=False)
    assert not _cfg(rendezvous="127.0.0.1:5000", auth=False).authenticated


@pytest.mark.parametrize("env", [
    {"ADAPM_RANK": "1", "ADAPM_WORLD_SIZE": "2", "ADAPM_RENDEZVOUS": "10.0.0.1:5000"},
    {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "node17", "MASTER_PORT": "29500"},
    {"ADAPM_RANK": "1", "ADAPM_WORLD_SIZE": "2", "ADAPM_RENDEZVOUS": "127.0.0.1:5000",
     "ADAPM_AUTH": "1"},
])
def test_authentication_without_a_secret_says_how_to_give_one(env):
    with pytest.raises(ConfigError, match="ADAPM_SECRET_FILE") as info:
        Config.from_env(env=env, num_keys=10)
    assert "chmod 600" in str(info.value)


def test_secret_from_the_environment_and_never_shown():
    env = {"ADAPM_RANK": "1", "ADAPM_WORLD_SIZE": "2", "ADAPM_RENDEZVOUS": "10.0.0.1:5000",
           "ADAPM_SECRET": SECRET}
    config = Config.from_env(env=env, num_keys=10)
    assert config.secret == SECRET and config.authenticated
    assert SECRET not in repr(config) and SECRET not in Config.describe()
    # A Config given to init under a launcher takes the launcher's secret too.
    assert under_launcher(Config(num_keys=10), env).secret == SECRET
    with pytest.raises(ConfigError) as info:
        Config(num_keys=10, secret="short-secret")
    assert "short-secret" not in str(info.value)


@pytest.mark.parametrize("value, expected", [("1", True), ("on", True), ("0", False),
                                             ("false", False), ("auto", None)])
def test_adapm_auth_values(value, expected):
    config = Config.from_env(env={"ADAPM_AUTH": value}, num_keys=10)
    assert config.auth is expected


def test_bad_adapm_auth_is_an_error():
    with pytest.raises(ConfigError, match="ADAPM_AUTH"):
        Config.from_env(env={"ADAPM_AUTH": "maybe"}, num_keys=10)


def test_secret_file(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    env = {"ADAPM_SECRET_FILE": str(path)}
    assert Config.from_env(env=env, num_keys=10).secret == SECRET
    for mode in (0o644, 0o640, 0o604):
        path.chmod(mode)
        with pytest.raises(ConfigError, match="chmod 600") as info:
            Config.from_env(env=env, num_keys=10)
        assert SECRET not in str(info.value)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="both set"):
        Config.from_env(env={**env, "ADAPM_SECRET": SECRET}, num_keys=10)


@pytest.mark.parametrize("problem, message", [
    ("missing", "cannot open it"), ("directory", "not a regular file"), ("empty", "is empty"),
    ("two lines", "holds 2 lines; a secret file holds one")])
def test_unusable_secret_file_is_an_error(tmp_path, problem, message):
    path = tmp_path / "secret"
    if problem == "directory":
        path.mkdir(mode=0o700)
    elif problem in ("empty", "two lines"):
        path.write_text("\n" if problem == "empty" else f"{SECRET}\n{SECRET}\n")
        path.chmod(0o600)
    with pytest.raises(ConfigError, match="ADAPM_SECRET_FILE") as info:
        Config.from_env(env={"ADAPM_SECRET_FILE": str(path)}, num_keys=10)
    assert message in str(info.value) and SECRET not in str(info.value)


# ---------------------------------------------------------------------------------------------
# A job with authentication on: adapm-run makes the secret, every socket is CURVE

JOB = textwrap.dedent(
    """
    import os
    import numpy as np
    import adapm

    N, L, REPS = 60, 3, 3
    secret = os.environ["ADAPM_SECRET"]
    node = adapm.init(num_keys=N, value_length=L)
    rank, size = node.rank, node.world_size
    assert node.config.authenticated and node.transport.router.curve_server
    assert secret not in repr(node.config)
    w = node.worker()
    keys = np.arange(N, dtype=np.int64)
    mine = keys[keys % size == (rank + 1) % size]  # homed elsewhere: relocations, replicas
    w.intent(mine, 0, REPS)
    for rep in range(REPS):
        w.push(keys, np.full((N, L), rank + 1, np.float32))
        w.advance_clock()
    w.wait_sync(30)
    node.barrier(30)
    values = w.pull(keys)
    expected = REPS * size * (size + 1) / 2
    assert (values == expected).all(), values
    stats = node.stats()
    assert stats["messages_received"] > 0 and stats["dropped_forged_messages"] == 0, stats
    node.shutdown(30)
    # One write: the ranks share adapm-run's stdout, and print() writes text and newline
    # separately when Python runs unbuffered (PYTHONUNBUFFERED), so lines could interleave.
    os.write(1, f"AUTH-OK rank={rank} secret_length={len(secret)}\\n".encode())
    """
)


def test_job_with_authentication_computes_exact_sums(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = _clean_env(ADAPM_AUTH="1", ADAPM_CONNECT_TIMEOUT_S="60")
    proc = subprocess.run([sys.executable, "-m", "adapm.launch", "-n", "3", sys.executable,
                           str(script)], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("AUTH-OK"))
    # adapm-run's own secret: secrets.token_urlsafe(32) has 43 characters.
    assert lines == [f"AUTH-OK rank={r} secret_length=43" for r in range(3)], proc.stdout


# ---------------------------------------------------------------------------------------------
# Intruders against a node's ROUTER


def _forged_push(claimed_rank: int) -> list:
    """A well-formed PUSH of FORGED to key 0 that claims to come from ``claimed_rank``; its
    answer goes to rank 1 (which counts an answer to nothing it asked as late)."""
    arrays = [np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(L, FORGED, np.float32)]
    return encode([message(Kind.PUSH, claimed_rank, 10**9, arrays, o=1)])


def _intrude(endpoint: str, keys: JobKeys | None, server_key: bytes | None,
             frames: list) -> str:
    """Connect a DEALER of its own context to ``endpoint`` (as a CURVE client with ``keys``'s
    own pair, or with a fresh pair when ``keys`` is None, when ``server_key`` is given; plain
    ZeroMQ otherwise), send ``frames``, and return how its first handshake ended:
    "succeeded" or "failed"."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    try:
        if server_key is not None:
            if keys is not None:
                keys.make_client(sock, 0)
            else:
                public, secret = zmq.curve_keypair()
                sock.curve_publickey, sock.curve_secretkey = public, secret
            sock.curve_serverkey = server_key
        monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
        sock.connect(endpoint)
        sock.send_multipart(frames, copy=False)
        if not monitor.poll(WAIT_S * 1000):
            raise AssertionError(f"no handshake with {endpoint} within {WAIT_S}s")
        event = recv_monitor_message(monitor)["event"]
        outcome = "succeeded" if event == zmq.EVENT_HANDSHAKE_SUCCEEDED else "failed"
        sock.disable_monitor()
        monitor.close(linger=0)
        # After a handshake the message goes out with the close; a failed one never will.
        sock.close(linger=WAIT_S * 1000 if outcome == "succeeded" else 0)
        return outcome
    finally:
        sock.close(linger=0)
        context.term()


def _await(node, counter: str, value: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while node.stats().get(counter, 0) < value:
        assert time.monotonic() < deadline, f"{counter} did not reach {value}: {node.stats()}"
        time.sleep(0.02)


def _intrusion_job(node, auth: bool) -> dict:
    """Rank 1 attacks rank 0's ROUTER with sockets of its own; rank 0 checks what arrived;
    then the real job pushes and every key must hold the exact sum. Module-level for spawn."""
    w = node.worker()
    outcomes = {}
    if node.rank == 1:
        endpoint = node.transport.peers[0].getsockopt(zmq.LAST_ENDPOINT).decode()
        server_key = JobKeys(SECRET, 2, 1).public_keys[0]
        outcomes["plain"] = _intrude(endpoint, None, None, _forged_push(1))
        if auth:
            outcomes["unknown key"] = _intrude(endpoint, None, server_key, _forged_push(1))
            outcomes["other secret"] = _intrude(endpoint, JobKeys(OTHER_SECRET, 2, 1),
                                                JobKeys(OTHER_SECRET, 2, 1).public_keys[0],
                                                _forged_push(1))
            # A member's own keys (rank 1's), with rank 0's number in the header.
            outcomes["member, forged rank"] = _intrude(endpoint, JobKeys(SECRET, 2, 1),
                                                       server_key, _forged_push(0))
    node.barrier(WAIT_S)
    if node.rank == 0:
        # With authentication: the member's message, and only it. Without (the control): the
        # plain socket's message reached the transport, which drops it only because its
        # connection did not name itself rank 1 (Transport._from_identity).
        _await(node, "dropped_forged_messages", 1)
        if auth:  # the server side's handshake events may come after the client's
            _await(node, "refused_handshakes", 3)
        stats = node.stats()
        outcomes["received_pushes"] = stats.get("messages_received_push", 0)
        outcomes["dropped_forged"] = stats["dropped_forged_messages"]
        outcomes["refused"] = stats["refused_handshakes"]
        outcomes["key0_before"] = float(w.pull(np.zeros(1, np.int64))[0, 0])
    node.barrier(WAIT_S)
    keys = np.arange(N, dtype=np.int64)
    w.push(keys, np.ones((N, L), np.float32))
    w.wait(WAIT_S)
    node.barrier(WAIT_S)
    outcomes["values"] = w.pull(keys)[:, 0].tolist()
    return outcomes


@pytest.mark.parametrize("auth", [True, False], ids=["auth", "control-no-auth"])
def test_intruders_cannot_deliver_messages(auth):
    config = {"num_keys": N, "value_length": L, "auth": auth,
              "secret": SECRET if auth else None, "connect_timeout_s": 60}
    rank0, rank1 = run_cluster(_intrusion_job, 2, args=(auth,), config=config, timeout_s=90)
    if auth:
        assert rank1 == {"plain": "failed", "unknown key": "failed", "other secret": "failed",
                         "member, forged rank": "succeeded", "values": rank1["values"]}
        assert rank0["received_pushes"] == 0 and rank0["dropped_forged"] == 1, rank0
        # The plain socket, the unknown key and the other job's key: refused, and counted.
        assert rank0["refused"] == 3, rank0
        assert rank0["key0_before"] == 0.0
        assert rank0["values"] == rank1["values"] == [2.0] * N
    else:  # the same plain socket gets through to the node when authentication is off
        assert rank1["plain"] == "succeeded"
        assert rank0["dropped_forged"] == 1 and rank0["refused"] == 0, rank0
        assert rank0["values"] == rank1["values"] == [2.0] * N


# ---------------------------------------------------------------------------------------------
# Intruders against the rendezvous, and ranks with different secrets

RANK = textwrap.dedent(
    """
    import numpy as np
    import adapm

    node = adapm.init(num_keys=8, value_length=1)
    w = node.worker()
    keys = np.arange(8, dtype=np.int64)
    w.push(keys, np.ones((8, 1), np.float32))
    w.wait(30)
    node.barrier(30)
    assert (w.pull(keys) == node.world_size).all()
    node.shutdown(30)
    print(f"RANK-OK {node.rank}", flush=True)
    """
)


class _Rank:
    """One rank of a 2-node job on loopback; its output collected as it comes."""

    def __init__(self, tmp_path: Path, rank: int, port: int, **env) -> None:
        script = tmp_path / "rank.py"
        script.write_text(RANK)
        self.lines: queue.Queue = queue.Queue()  # stderr lines not yet looked at
        self.stdout: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=_clean_env(ADAPM_RANK=str(rank), ADAPM_WORLD_SIZE="2",
                                      ADAPM_RENDEZVOUS=f"127.0.0.1:{port}", **env))
        self._readers = [threading.Thread(target=self._read, args=args, daemon=True) for args in
                         ((self.proc.stdout, self.stdout.append),
                          (self.proc.stderr, self.lines.put))]
        for reader in self._readers:
            reader.start()
        self.stderr: list[str] = []

    @staticmethod
    def _read(stream, put) -> None:
        for line in stream:
            put(line)

    def wait_for(self, text: str) -> None:
        """Until the rank writes ``text`` to stderr (bounded by WAIT_S)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"rank never wrote {text!r}; stderr: {self.stderr}") from None
            self.stderr.append(line)
            if text in line:
                return

    def finish(self) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) once the rank has exited (killed after 60 s)."""
        try:
            self.proc.wait(timeout=60)
        finally:
            self.kill()
        for reader in self._readers:
            reader.join(5)
        while not self.lines.empty():
            self.stderr.append(self.lines.get())
        return self.proc.returncode, "".join(self.stdout), "".join(self.stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _hello(rank: int) -> list:
    return [msgpack.packb({"k": int(Kind.HELLO), "s": rank, "addr": "tcp://127.0.0.1:9",
                           "fp": [2, 8, 1, "adaptive", "sum", 1]})]


def test_outsiders_cannot_join_the_rendezvous(tmp_path):
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    env = {"ADAPM_AUTH": "1", "ADAPM_SECRET": SECRET, "ADAPM_CONNECT_TIMEOUT_S": "60"}
    rank0 = _Rank(tmp_path, 0, port, **env)
    try:
        server_key = JobKeys(SECRET, 2, 0).public_keys[0]
        # Each claims rank 1; had one got in, the real rank 1 would be refused as a duplicate.
        assert _intrude(endpoint, None, None, _hello(1)) == "failed"
        assert _intrude(endpoint, None, server_key, _hello(1)) == "failed"
        other = JobKeys(OTHER_SECRET, 2, 1)
        assert _intrude(endpoint, other, other.public_keys[0], _hello(1)) == "failed"
        # Rank 0's own keys (a member's) with rank 1's number: admitted, then ignored.
        assert _intrude(endpoint, JobKeys(SECRET, 2, 0), server_key, _hello(1)) == "succeeded"
        rank0.wait_for("ignored a hello that names rank 1")
        rank1 = _Rank(tmp_path, 1, port, **env)
        results = [rank0.finish(), rank1.finish()]
    finally:
        rank0.kill()
    for rank, (code, out, err) in enumerate(results):
        assert code == 0 and f"RANK-OK {rank}" in out, err


def test_control_without_auth_an_outsider_takes_a_rank(tmp_path):
    """The control of the test above: with authentication off, a plain socket that says it is
    rank 1 completes the rendezvous and gets the job's address table."""
    port = free_port()
    rank0 = _Rank(tmp_path, 0, port, ADAPM_CONNECT_TIMEOUT_S="60")
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send_multipart(_hello(1))
        answer = {"k": Kind.WAITING}
        while answer["k"] == Kind.WAITING:  # "still waiting for ranks ...", then the table
            assert sock.poll(WAIT_S * 1000), "rank 0 never answered the outsider"
            answer = msgpack.unpackb(sock.recv())
        assert answer["k"] == Kind.TABLE and answer["addrs"][1] == "tcp://127.0.0.1:9"
    finally:
        sock.close(linger=0)
        context.term()
        rank0.kill()


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp")
def test_ranks_with_different_secrets_time_out_naming_the_handshake(tmp_path):
    # Each rank must see the other's attempts: rank 1 starts once rank 0 listens, and rank 0
    # waits longer than rank 1 (whose start may take seconds on a loaded machine).
    port = free_port()
    ranks = [_Rank(tmp_path, 0, port, ADAPM_SECRET=SECRET, ADAPM_AUTH="1",
                   ADAPM_CONNECT_TIMEOUT_S="12")]
    try:
        deadline = time.monotonic() + WAIT_S
        while not listening(port):
            assert ranks[0].proc.poll() is None and time.monotonic() < deadline, \
                "rank 0 did not start its rendezvous"
            time.sleep(0.02)
        ranks.append(_Rank(tmp_path, 1, port, ADAPM_SECRET=OTHER_SECRET, ADAPM_AUTH="1",
                           ADAPM_CONNECT_TIMEOUT_S="4"))
        results = [rank.finish() for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    for code, _, err in results:
        assert code != 0, err
        assert "AdaPMTimeout" in err and "failed the security handshake" in err, err
        assert SECRET not in err and OTHER_SECRET not in err


# ---------------------------------------------------------------------------------------------
# adapm-run hands the secret to remote ranks over stdin, never on a command line


def _plan_for(argv: list[str]):
    parser = _parser()
    return _plan(parser.parse_args(argv), parser)


def test_adapm_run_makes_a_secret_and_keeps_it_off_command_lines(monkeypatch):
    for var in ("ADAPM_SECRET", "ADAPM_SECRET_FILE"):
        monkeypatch.delenv(var, raising=False)
    local, remote = _plan_for(["-n", "2", "--hosts", "localhost,far-away-host", "python", "x"])
    secret = local.env["ADAPM_SECRET"]
    assert len(secret) == 43
    assert not any(secret in arg for arg in remote.argv)
    assert remote.stdin_data == (secret + "\n").encode()
    assert secret not in repr(local) and secret not in repr(remote)
    # Each job gets its own.
    assert _plan_for(["-n", "1", "python", "x"])[0].env["ADAPM_SECRET"] != secret


def test_adapm_run_passes_on_the_users_secret(monkeypatch, tmp_path):
    monkeypatch.setenv("ADAPM_SECRET", SECRET)
    local, remote = _plan_for(["-n", "2", "--hosts", "localhost,far-away-host", "python", "x"])
    assert local.env["ADAPM_SECRET"] == SECRET and remote.stdin_data == (SECRET + "\n").encode()
    assert not any(SECRET in arg for arg in remote.argv)
    monkeypatch.delenv("ADAPM_SECRET")
    monkeypatch.setenv("ADAPM_SECRET_FILE", str(tmp_path / "secret"))
    local, remote = _plan_for(["-n", "2", "--hosts", "localhost,far-away-host", "python", "x"])
    assert "ADAPM_SECRET" not in local.env and remote.stdin_data is None
    assert any("ADAPM_SECRET_FILE=" in arg for arg in remote.argv)  # a path, read remotely
    monkeypatch.setenv("ADAPM_SECRET", SECRET)
    assert main(["-n", "2", "true"]) == 2  # both set


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX shell")
def test_remote_command_takes_the_secret_from_stdin(tmp_path):
    # What ssh would hand the remote login shell, run here by a local shell instead: the rank
    # gets the secret in its environment, and the watchdog still reads the rest of stdin.
    code = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f" open({str(tmp_path / 'seen')!r}, 'w').write(os.environ['ADAPM_SECRET']);"
        f" os.replace({str(tmp_path / 'seen')!r}, {str(tmp_path / 'secret')!r});"
        " time.sleep(60)"
    )
    command = remote_command([sys.executable, "-c", code], {"ADAPM_RANK": "1"}, str(tmp_path),
                             1, secret_on_stdin=True)
    assert SECRET not in command
    secret = secrets.token_urlsafe(32)
    proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE)
    try:
        proc.stdin.write((secret + "\n").encode())
        proc.stdin.flush()
        deadline = time.monotonic() + WAIT_S
        while not (tmp_path / "secret").exists():
            assert time.monotonic() < deadline, "the remote command did not start"
            time.sleep(0.02)
        assert (tmp_path / "secret").read_text() == secret
        proc.stdin.close()  # adapm-run gone: the watchdog must stop the rank
        assert proc.wait(timeout=WAIT_S) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- the secret: out of the environment once read, never from a FIFO -----------------------------

CHILD_ENV_JOB = textwrap.dedent(
    """
    import os, subprocess, sys
    import adapm

    had = "ADAPM_SECRET" in os.environ
    node = adapm.init(num_keys=4)
    child = subprocess.run([sys.executable, "-c",
                            "import os; print('ADAPM_SECRET' in os.environ)"],
                           capture_output=True, text=True, check=True)
    node.barrier()
    node.shutdown()
    os.write(1, f"SECRET-ENV rank={node.rank} before={had} after={'ADAPM_SECRET' in os.environ}"
                f" child={child.stdout.strip()}\\n".encode())
    """
)


def test_the_secret_is_not_inherited_by_a_ranks_children(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(CHILD_ENV_JOB)
    env = _clean_env(ADAPM_AUTH="1", ADAPM_CONNECT_TIMEOUT_S="60")
    proc = subprocess.run([sys.executable, "-m", "adapm.launch", "-n", "2", sys.executable,
                           str(script)], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("SECRET-ENV"))
    assert lines == [f"SECRET-ENV rank={r} before=True after=False child=False"
                     for r in range(2)], proc.stdout


def test_a_fifo_as_secret_file_is_refused_without_waiting(tmp_path):
    import threading

    fifo = tmp_path / "secret"
    os.mkfifo(fifo, 0o600)
    outcome = []

    def read():
        try:
            Config.from_env(env={"ADAPM_SECRET_FILE": str(fifo)}, num_keys=4)
        except ConfigError as exc:
            outcome.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the open before failing, so the thread can end
        with open(fifo, "w"):
            pass
    assert outcome and "is not a regular file" in outcome[0], outcome
