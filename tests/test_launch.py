"""Tests of the ``adapm-run`` launcher and of how adapm.config reads launcher variables.

The launcher tests start real processes (``python -m adapm.launch ...``); children are tiny Python
programs that record their pid so the tests can check nothing outlives the launcher.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm.config import Config, detect_cluster
from adapm.errors import ConfigError
from adapm.launch import (
    _parser,
    _plan,
    build_env,
    describe_status,
    iface_address,
    main,
    plan_ranks,
    remote_command,
)

REPO = Path(__file__).resolve().parents[1]
# Generous: a stopped job returns in a few seconds; the children would otherwise sleep 60 s.
STOP_BOUND_S = 30

# A child that records its pid, then behaves as argv[1] says:
#   sleep       - sleep 60 s
#   fail        - rank 1 exits 3 once every rank has recorded its pid; the others sleep
#   sigkill     - rank 1 kills itself with SIGKILL likewise; the others sleep
#   ignore_term - like fail, but every rank ignores SIGTERM (needs the SIGKILL escalation)
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path

    mode, out = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ["ADAPM_RANK"])
    size = int(os.environ["ADAPM_WORLD_SIZE"])
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tmp = out / f"pid.{rank}.tmp"
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, out / f"pid.{rank}")  # atomic: readers never see a partial pid

    def all_started():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all((out / f"pid.{r}").exists() for r in range(size)):
                return
            time.sleep(0.02)

    if rank == 1 and mode in ("fail", "ignore_term"):
        all_started()
        sys.exit(3)
    if rank == 1 and mode == "sigkill":
        all_started()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
    """
)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # Stale launcher variables from the calling shell must not leak into the expectations.
    for var in list(env):
        if var.startswith("ADAPM_"):
            del env[var]
    return env


def _launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "adapm.launch", *args]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        _launcher(*args), env=_env(), capture_output=True, text=True, timeout=timeout
    )


def _child(tmp_path: Path, mode: str) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return [sys.executable, str(script), mode, str(tmp_path)]


def _pids(tmp_path: Path, n: int) -> list[int]:
    return [int((tmp_path / f"pid.{r}").read_text()) for r in range(n)]


def _wait_for_pids(tmp_path: Path, n: int, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((tmp_path / f"pid.{r}").exists() for r in range(n)):
            return _pids(tmp_path, n)
        time.sleep(0.02)
    pytest.fail(f"children did not all start within {timeout} s")


def _say(fmt: str, *env_vars: str) -> str:
    """``python -c`` code that writes ``fmt % (values of env_vars)`` plus a newline to stdout
    with one os.write.

    The ranks share adapm-run's stdout (one pipe here). print() may split a line into several
    write(2) calls (one per argument and separator when the stream is unbuffered, e.g. with
    PYTHONUNBUFFERED=1), so lines of concurrent ranks could interleave. One write of fewer than
    PIPE_BUF bytes to a pipe is atomic, so each rank's line arrives whole.
    """
    values = ", ".join(f"os.environ.get({v!r})" for v in env_vars)
    return f"import os; os.write(1, ({fmt + chr(10)!r} % ({values},)).encode())"


def _assert_gone(pids: list[int], timeout: float = 5) -> None:
    """Every pid is gone (the launcher reaped its children, so none is even a zombie)."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        still = []
        for pid in alive:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            still.append(pid)
        alive = still
        if alive:
            time.sleep(0.05)
    assert not alive, f"processes still alive: {alive}"


# ---------------------------------------------------------------------------------------------
# Real jobs


def test_three_ranks_see_their_variables():
    code = _say("R %s %s %s %s", "ADAPM_RANK", "ADAPM_WORLD_SIZE", "ADAPM_RENDEZVOUS",
                "ADAPM_HOST")
    res = _run("-n", "3", sys.executable, "-c", code)
    assert res.returncode == 0, res.stderr
    # Every rank's stdout passes through adapm-run, one whole line each, and nothing else.
    rows = [line.split() for line in res.stdout.splitlines()]
    assert all(len(r) == 5 and r[0] == "R" for r in rows), res.stdout
    assert sorted(int(r[1]) for r in rows) == [0, 1, 2]
    assert {r[2] for r in rows} == {"3"}
    rendezvous = {r[3] for r in rows}
    assert len(rendezvous) == 1
    host, port = rendezvous.pop().rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536
    assert {r[4] for r in rows} == {"None"}  # no --iface: ADAPM_HOST is not set


def test_double_dash_and_iface_address():
    code = _say("H %s", "ADAPM_HOST")
    res = _run("-n", "2", "--iface", "127.0.0.1", "--", sys.executable, "-c", code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["H 127.0.0.1"] * 2, res.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIOCGIFADDR is Linux-only")
def test_iface_name_is_resolved():
    code = _say("H %s", "ADAPM_HOST")
    res = _run("-n", "1", "--iface", "lo", sys.executable, "-c", code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["H 127.0.0.1"], res.stdout


def test_unknown_iface_is_a_usage_error():
    res = _run("-n", "2", "--iface", "nosuchif0", "true")
    assert res.returncode == 2
    assert "--iface" in res.stderr


def test_failing_rank_stops_the_others(tmp_path):
    start = time.monotonic()
    res = _run("-n", "3", *_child(tmp_path, "fail"))
    assert time.monotonic() - start < STOP_BOUND_S
    assert res.returncode == 3  # the failed rank's own status
    lines = [l for l in res.stderr.splitlines() if l.startswith("adapm-run:")]
    assert len(lines) == 1, res.stderr
    assert "rank 1" in lines[0] and "status 3" in lines[0]
    _assert_gone(_pids(tmp_path, 3))


def test_rank_killed_by_signal(tmp_path):
    res = _run("-n", "3", *_child(tmp_path, "sigkill"))
    assert res.returncode != 0
    assert "rank 1" in res.stderr and "SIGKILL" in res.stderr
    _assert_gone(_pids(tmp_path, 3))


def test_sigterm_is_escalated_to_sigkill(tmp_path):
    start = time.monotonic()
    res = _run("-n", "3", "--grace", "0.5", *_child(tmp_path, "ignore_term"))
    assert time.monotonic() - start < STOP_BOUND_S
    assert res.returncode == 3
    _assert_gone(_pids(tmp_path, 3))


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_launcher_is_forwarded(tmp_path, sig, status):
    proc = subprocess.Popen(
        _launcher("-n", "3", *_child(tmp_path, "sleep")),
        env=_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = _wait_for_pids(tmp_path, 3)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=STOP_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status, err
    assert f"received {signal.Signals(sig).name}; stopping 3 processes" in err, err
    _assert_gone(pids)



def test_missing_program_fails_cleanly():
    res = _run("-n", "2", "/nonexistent/program")
    assert res.returncode == 127
    assert "rank 0" in res.stderr


# ---------------------------------------------------------------------------------------------
# Usage errors


@pytest.mark.parametrize("n", ["0", "-1", "x", "1.5"])
def test_bad_n_is_a_usage_error(n, capsys):
    assert main(["-n", n, "true"]) == 2
    assert "-n" in capsys.readouterr().err


def test_missing_n_is_a_usage_error(capsys):
    assert main(["true"]) == 2
    assert "-n" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["-n", "2"], ["-n", "2", "--"]])
def test_missing_command_is_a_usage_error(argv, capsys):
    assert main(argv) == 2
    assert "command" in capsys.readouterr().err


def test_bad_hosts_and_grace_are_usage_errors(capsys):
    assert main(["-n", "2", "--hosts", "a,,b", "true"]) == 2
    assert "--hosts" in capsys.readouterr().err
    assert main(["-n", "2", "--grace", "-1", "true"]) == 2
    assert "--grace" in capsys.readouterr().err


def test_usage_errors_exit_2_from_the_command_line():
    for args in (["-n", "0", "true"], ["-n", "x", "true"], ["-n", "2"]):
        res = _run(*args)
        assert res.returncode == 2, args
        assert "-n" in res.stderr or "command" in res.stderr


# ---------------------------------------------------------------------------------------------
# Pure helpers


def test_plan_ranks_examples():
    assert plan_ranks(3, None) == ["localhost"] * 3
    assert plan_ranks(4, ["a", "b"]) == ["a", "a", "b", "b"]
    assert plan_ranks(5, ["a", "b"]) == ["a", "a", "a", "b", "b"]
    assert plan_ranks(3, ["a", "b", "c"]) == ["a", "b", "c"]
    assert plan_ranks(1, ["a", "b"]) == ["a"]
    with pytest.raises(ValueError):
        plan_ranks(0, ["a"])


@given(st.integers(1, 200), st.integers(1, 20))
def test_plan_ranks_contiguous_balanced_blocks(n, num_hosts):
    hosts = [f"h{i}" for i in range(num_hosts)]
    plan = plan_ranks(n, hosts)
    assert len(plan) == n and plan[0] == "h0"
    order = [hosts.index(h) for h in plan]
    assert order == sorted(order)  # contiguous blocks in host order
    counts = [plan.count(h) for h in hosts if h in plan]
    assert max(counts) - min(counts) <= 1
    if n >= num_hosts:
        assert set(plan) == set(hosts)


def test_build_env():
    assert build_env(2, 4, "10.0.0.1:5000", None) == {
        "ADAPM_RANK": "2",
        "ADAPM_WORLD_SIZE": "4",
        "ADAPM_RENDEZVOUS": "10.0.0.1:5000",
    }
    assert build_env(0, 1, "127.0.0.1:1", "10.0.0.7")["ADAPM_HOST"] == "10.0.0.7"


@given(st.integers(1, 1000).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))))
def test_build_env_round_trips_through_config(rank_size):
    rank, size = rank_size
    cfg = Config.from_env(env=build_env(rank, size, "127.0.0.1:4000", "127.0.0.1"), num_keys=10)
    assert (cfg.rank, cfg.world_size, cfg.rendezvous, cfg.host) == (
        rank, size, "127.0.0.1:4000", "127.0.0.1"
    )


def test_describe_status():
    assert describe_status(3) == "exited with status 3"
    assert describe_status(-signal.SIGKILL) == "was killed by signal SIGKILL"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIOCGIFADDR is Linux-only")
def test_iface_address():
    assert iface_address("10.1.2.3") == "10.1.2.3"
    assert iface_address("lo") == "127.0.0.1"
    with pytest.raises(LookupError):
        iface_address("nosuchif0")
    with pytest.raises(LookupError):
        iface_address("x" * 40)


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX shell")
def test_remote_command_runs_and_propagates_status(tmp_path):
    # What ssh would hand the remote login shell, run here by a local shell instead.
    code = "import os, sys; print(os.getcwd(), os.environ['ADAPM_RANK']); sys.exit(5)"
    command = remote_command([sys.executable, "-c", code], {"ADAPM_RANK": "4"}, str(tmp_path), 1)
    proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.wait(timeout=30) == 5
        assert proc.stdout.read().split() == [str(tmp_path), "4"]
    finally:
        proc.stdin.close()
        proc.stdout.close()


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX shell")
def test_remote_command_dies_when_the_connection_closes(tmp_path):
    # Closing stdin is what a remote rank sees when its ssh client is stopped or dies;
    # the rank ignores SIGTERM, so this also covers the SIGKILL after the grace period.
    code = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f" open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    command = remote_command([sys.executable, "-c", code], {}, str(tmp_path), 1)
    proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
            assert time.monotonic() < deadline, "remote command did not start"
            time.sleep(0.02)
        pid = int((tmp_path / "pid").read_text())
        proc.stdin.close()
        assert proc.wait(timeout=STOP_BOUND_S) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _assert_gone([pid])


# ---------------------------------------------------------------------------------------------
# adapm.config: where rank, world size and rendezvous come from

RV = {"ADAPM_RENDEZVOUS": "127.0.0.1:7000"}
SECRET = {"ADAPM_SECRET": "a-test-secret-of-enough-length"}
LAUNCHER_PAIRS = [
    ("ADAPM_RANK", "ADAPM_WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("RANK", "WORLD_SIZE"),
]
rank_and_size = st.integers(1, 4096).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n)))


def test_no_launcher_means_single_node():
    assert detect_cluster({}) == {}
    cfg = Config.from_env(env={}, num_keys=10)
    assert (cfg.rank, cfg.world_size, cfg.rendezvous) == (0, 1, None)


@pytest.mark.parametrize("rank_var, size_var", LAUNCHER_PAIRS)
@settings(max_examples=30)
@given(rank_size=rank_and_size)
def test_each_launcher_is_detected(rank_var, size_var, rank_size):
    rank, size = rank_size
    env = {rank_var: str(rank), size_var: str(size), **RV}
    expected = {"rank": rank, "world_size": size, "rendezvous": RV["ADAPM_RENDEZVOUS"]}
    assert detect_cluster(env) == expected
    cfg = Config.from_env(env=env, num_keys=10, management="static_partition")  # any size
    assert (cfg.rank, cfg.world_size) == (rank, size)


@given(st.data())
def test_launchers_that_agree_are_one_launch(data):
    # Several launchers' variables naming the same rank and size: that rank.
    chosen = data.draw(st.lists(st.sampled_from(range(len(LAUNCHER_PAIRS))), min_size=1,
                                unique=True))
    env = dict(RV)
    for i in chosen:
        env[LAUNCHER_PAIRS[i][0]] = "3"
        env[LAUNCHER_PAIRS[i][1]] = "8"
    cfg = Config.from_env(env=env, num_keys=10)
    assert cfg.rank == 3 and cfg.world_size == 8


@given(st.data())
def test_launchers_that_disagree_are_an_error(data):
    # Give two launchers different ranks: an error naming the first in LAUNCHER_PAIRS and the
    # other, never one of them silently.
    first, other = sorted(data.draw(st.lists(st.sampled_from(range(len(LAUNCHER_PAIRS))),
                                             min_size=2, max_size=2, unique=True)))
    env = dict(RV, **SECRET)
    for i, rank in ((first, 1), (other, 2)):
        env[LAUNCHER_PAIRS[i][0]] = str(rank)
        env[LAUNCHER_PAIRS[i][1]] = "8"
    with pytest.raises(ConfigError, match=f"{LAUNCHER_PAIRS[first][0]}.* say rank 1 of 8, but "
                                          f"{LAUNCHER_PAIRS[other][0]}.* say rank 2 of 8"):
        Config.from_env(env=env, num_keys=10)


def test_a_stale_single_node_setting_under_mpirun_is_an_error():
    # ADAPM_RANK=0 ADAPM_WORLD_SIZE=1 left in a shell, then mpirun -n 4: not 4 single nodes.
    env = {"ADAPM_RANK": "0", "ADAPM_WORLD_SIZE": "1", "ADAPM_RENDEZVOUS": "10.0.0.1:9000",
           "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", **SECRET}
    with pytest.raises(ConfigError, match="ADAPM_RANK/ADAPM_WORLD_SIZE say rank 0 of 1, but "
                                          "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE say rank 3 "
                                          "of 4; a stale setting"):
        Config.from_env(env=env, num_keys=10)
    # The same under torchrun.
    env = {"ADAPM_RANK": "0", "ADAPM_WORLD_SIZE": "1", "RANK": "1", "WORLD_SIZE": "2",
           "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", **SECRET}
    with pytest.raises(ConfigError, match="RANK/WORLD_SIZE say rank 1 of 2"):
        Config.from_env(env=env, num_keys=10)


def test_adapm_run_ranks_do_not_inherit_other_launchers_variables(monkeypatch):
    # An sbatch script's SLURM_PROCID=0/SLURM_NTASKS=4 around adapm-run -n 4 would contradict
    # each rank's ADAPM_RANK: adapm-run is the launcher of its ranks.
    for name in ("SLURM_PROCID", "RANK", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.setenv(name, "0")
    for name in ("SLURM_NTASKS", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.setenv(name, "4")
    ranks = _plan(_parser().parse_args(["-n", "2", "python", "x.py"]), _parser())
    for rank in ranks:
        assert not {"SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE"} & set(rank.env)
        assert rank.env["ADAPM_RANK"] == str(rank.rank)
    jobs = {rank.env["ADAPM_JOB"] for rank in ranks}
    assert len(jobs) == 1 and len(jobs.pop()) >= 16  # one id, shared, not guessable


def _own_address():
    """This machine's address on its default route, or None (no route: nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 22))
        except OSError:
            return None
        return probe.getsockname()[0]


def test_this_machines_own_address_starts_its_ranks_without_ssh():
    own = _own_address()
    if own is None:
        pytest.skip("no default route: this machine has no address to name")
    args = ["-n", "3", "--hosts", f"{socket.gethostname()},{own},localhost", "python", "x.py"]
    ranks = _plan(_parser().parse_args(args), _parser())
    assert [rank.remote for rank in ranks] == [False, False, False]
    assert ranks[0].env["ADAPM_RENDEZVOUS"].startswith("127.0.0.1:")


def test_across_hosts_the_rendezvous_is_an_address_the_others_reach():
    """Rank 0 here, rank 1 on another host: the rendezvous the ranks get must not be a name
    that resolves to loopback here (Debian's /etc/hosts maps the host name to 127.0.x.1:
    rank 0 listened where no other host reached it), and ssh gives up connecting in bounded
    time."""
    if _own_address() is None:
        pytest.skip("no default route")
    args = ["-n", "2", "--hosts", f"{socket.gethostname()},198.51.100.7", "python", "x.py"]
    ranks = _plan(_parser().parse_args(args), _parser())
    assert [rank.remote for rank in ranks] == [False, True]
    host = ranks[0].env["ADAPM_RENDEZVOUS"].rpartition(":")[0]
    resolved = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    assert not any(ipaddress.ip_address(a).is_loopback for a in resolved), (host, resolved)
    assert f"ADAPM_RENDEZVOUS={ranks[0].env['ADAPM_RENDEZVOUS']}" in ranks[1].argv[-1]
    assert ranks[1].argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30"]


def test_torchrun_rendezvous_is_master_port_plus_one():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500",
           **SECRET}
    cfg = Config.from_env(env=env, num_keys=10)
    assert (cfg.rank, cfg.world_size, cfg.rendezvous) == (1, 2, "10.0.0.5:29501")


def test_launcher_settings_pass_through():
    env = {"ADAPM_HOST": "10.0.0.3", "ADAPM_MANAGEMENT": "static_partition",
           "ADAPM_REQUEST_TIMEOUT_S": "2.5", "ADAPM_CONNECT_TIMEOUT_S": "7"}
    cfg = Config.from_env(env=env, num_keys=10)
    assert cfg.host == "10.0.0.3" and cfg.management == "static_partition"
    assert cfg.request_timeout_s == 2.5 and cfg.connect_timeout_s == 7.0


def test_a_whole_config_takes_the_launchers_host_and_says_what_it_leaves():
    """adapm.init(config=...) under adapm-run --iface: the launcher's ADAPM_HOST applies where
    the Config leaves host out (it bound where --iface did not say); other ADAPM_* settings
    the Config does not have are named (they were ignored without a word)."""
    from adapm.config import unapplied_env, under_launcher

    env = {"ADAPM_RANK": "1", "ADAPM_WORLD_SIZE": "2", **RV, **SECRET, "ADAPM_HOST": "10.0.0.3",
           "ADAPM_REQUEST_TIMEOUT_S": "3", "ADAPM_MANAGEMENT": "adaptive"}
    cfg = under_launcher(Config(num_keys=10), env)
    assert cfg.host == "10.0.0.3" and cfg.rank == 1
    assert unapplied_env(cfg, env) == ["ADAPM_REQUEST_TIMEOUT_S"]  # adaptive is the default
    assert unapplied_env(cfg.replace(request_timeout_s=3.0), env) == []
    assert under_launcher(Config(num_keys=10, host="10.0.0.9"), env).host == "10.0.0.9"


def test_overrides_win_over_env():
    env = {"ADAPM_RANK": "1", "ADAPM_WORLD_SIZE": "2", **RV}
    cfg = Config.from_env(env=env, num_keys=10, rank=0)
    assert cfg.rank == 0


@pytest.mark.parametrize(
    "env",
    [
        {"ADAPM_RANK": "x", "ADAPM_WORLD_SIZE": "2", **RV},
        {"ADAPM_RANK": "0", "ADAPM_WORLD_SIZE": "two", **RV},
        {"ADAPM_RANK": "2", "ADAPM_WORLD_SIZE": "2", **RV},  # rank not below world size
        {"ADAPM_RANK": "-1", "ADAPM_WORLD_SIZE": "2", **RV},
        {"ADAPM_RANK": "0", "ADAPM_WORLD_SIZE": "0"},
        {"SLURM_PROCID": "1.0", "SLURM_NTASKS": "2", **RV},
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "port"},
        {"ADAPM_RANK": "0", "ADAPM_WORLD_SIZE": "2", "ADAPM_RENDEZVOUS": "no-port"},
        {"ADAPM_RANK": "0", "ADAPM_WORLD_SIZE": "2", "ADAPM_RENDEZVOUS": "h:99999"},
        {"ADAPM_REQUEST_TIMEOUT_S": "soon"},
        {"ADAPM_CONNECT_TIMEOUT_S": "-1"},
        {"ADAPM_MANAGEMENT": "magic"},
    ],
)
def test_bad_values_raise_config_error(env):
    with pytest.raises(ConfigError):
        Config.from_env(env=env, num_keys=10)


@given(rank_size=rank_and_size.filter(lambda rs: rs[1] > 1),
       pair=st.sampled_from(LAUNCHER_PAIRS))
def test_several_nodes_need_a_rendezvous(rank_size, pair):
    rank, size = rank_size
    with pytest.raises(ConfigError, match="rendezvous"):
        Config.from_env(env={pair[0]: str(rank), pair[1]: str(size)}, num_keys=10)
