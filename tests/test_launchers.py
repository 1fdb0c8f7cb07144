"""Launchers without extra flags (issue 28, item 4): under mpirun (Open MPI) and srun with every
rank on one host the ranks derive their rendezvous from the launcher's job id (the KGE app runs
under a real mpirun and a simulated srun, without ADAPM_RENDEZVOUS); across hosts a clear
error says what to set. adapm-run's per-rank output prefixes ("[rank R]: ")."""

from __future__ import annotations

import ipaddress
import os
import select
import shutil
import socket
import subprocess
import sys
import uuid

import pytest
from app_cli import ENV, LAUNCHER, PY, records, run

from adapm.config import Config, detect_cluster
from adapm.errors import ConfigError
from adapm.launch import DERIVED_PORTS, derived_port, derived_rendezvous, prefix_lines

MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")
# Open MPI refuses root unless told; CI containers run as root.
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _ompi(rank: int, size: int = 2, local: int | None = None, job="prterun-vm-123@1") -> dict:
    env = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
           "OMPI_COMM_WORLD_LOCAL_SIZE": str(size if local is None else local)}
    if job is not None:
        env["PMIX_NAMESPACE"] = job
    return env


def _slurm(rank: int, size: int = 2, nodes: int = 1, job="4242", step="0") -> dict:
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size), "SLURM_JOB_ID": job,
            "SLURM_STEP_ID": step, "SLURM_STEP_NUM_NODES": str(nodes)}


# --- the derivation (pure) ----------------------------------------------------------------


@pytest.mark.parametrize("env_of", [_ompi, _slurm])
def test_every_rank_of_a_local_job_derives_the_same_loopback_rendezvous(env_of):
    found = [detect_cluster(env_of(rank, 3)) for rank in range(3)]
    assert [f["rank"] for f in found] == [0, 1, 2]
    addresses = {f["rendezvous"] for f in found}
    assert len(addresses) == 1
    host, port = addresses.pop().rsplit(":", 1)
    assert host == "127.0.0.1" and DERIVED_PORTS[0] <= int(port) < DERIVED_PORTS[1]
    # the job id the rendezvous checks is the launcher's too
    assert len({f["job"] for f in found}) == 1
    config = Config.from_env(env=env_of(1, 3), num_keys=10)
    assert config.rendezvous == f"127.0.0.1:{port}" and config.world_size == 3
    assert not config.authenticated  # loopback only: no secret needed


def test_other_jobs_get_other_ports():
    ports = {derived_port(f"prterun-vm-{pid}@1") for pid in range(1000, 1200)}
    assert len(ports) >= 190  # 200 ids over 22,768 ports: a few collisions at most
    assert all(DERIVED_PORTS[0] <= p < DERIVED_PORTS[1] for p in ports)
    assert derived_rendezvous(_slurm(0, step="0")) != derived_rendezvous(_slurm(0, step="1"))


def test_across_hosts_the_error_says_what_to_set():
    with pytest.raises(ConfigError, match=r"several hosts.*-x ADAPM_RENDEZVOUS="):
        Config.from_env(env=_ompi(0, size=4, local=2), num_keys=10)
    with pytest.raises(ConfigError, match=r"on 2 nodes.*ADAPM_RENDEZVOUS=\$\(scontrol"):
        Config.from_env(env=_slurm(0, size=4, nodes=2), num_keys=10)
    # an explicit rendezvous is taken as given, on any number of hosts
    env = {**_ompi(0, size=4, local=2), "ADAPM_RENDEZVOUS": "10.0.0.1:29500",
           "ADAPM_SECRET": "a-test-secret-of-enough-length"}
    assert Config.from_env(env=env, num_keys=10).rendezvous == "10.0.0.1:29500"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", socket.gethostname()])
def test_across_hosts_a_rendezvous_on_loopback_here_is_refused(host):
    """docs/operations.md's mpirun -x ADAPM_RENDEZVOUS=$(hostname):29500 where the host name
    resolves to loopback (Debian's /etc/hosts): rank 0 would listen where no other host
    reaches it, and every rank waited the connect timeout out. Refused at once, naming why."""
    resolved = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    if not all(ipaddress.ip_address(a).is_loopback for a in resolved):
        pytest.skip(f"{host} is not loopback on this machine")
    secret = {"ADAPM_SECRET": "a-test-secret-of-enough-length"}
    for env in ({**_ompi(0, size=4, local=2), "ADAPM_RENDEZVOUS": f"{host}:29500", **secret},
                {**_slurm(1, size=4, nodes=2), "ADAPM_RENDEZVOUS": f"{host}:29500", **secret},
                {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": host,
                 "MASTER_PORT": "29500", **secret}):
        with pytest.raises(ConfigError, match=r"several hosts|on 2 nodes") as caught:
            Config.from_env(env=env, num_keys=10)
        assert "loopback address on this host, which the other hosts cannot reach" in \
            str(caught.value)
    # on one host the same rendezvous is right
    env = {**_ompi(0, size=4, local=4), "ADAPM_RENDEZVOUS": f"{host}:29500", **secret}
    assert Config.from_env(env=env, num_keys=10).rendezvous == f"{host}:29500"


@pytest.mark.parametrize("env", [
    _ompi(0, job=None),                                   # no job id: nothing to agree on
    {k: v for k, v in _ompi(0).items() if k != "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7"},  # a batch script's shell
    {"PMI_RANK": "0", "PMI_SIZE": "2"},                   # MPICH: not derived
])
def test_without_what_it_needs_there_is_no_derived_rendezvous(env):
    assert derived_rendezvous(env) is None
    with pytest.raises(ConfigError, match="needs a rendezvous address"):
        Config.from_env(env=env, num_keys=10)


# --- real launches -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    data = tmp_path_factory.mktemp("kg") / "kg"
    run([PY, "-m", "adapm.apps.kge", "generate", str(data), "--triples", "3000", "--seed", "3"])
    return data


def _kge(kg) -> list:
    return [PY, "-m", "adapm.apps.kge", "--data", str(kg), "--dim", "8", "--epochs", "1",
            "--progress", "off", "--json", "-"]


def _check_trained(stdout: str, world_size: int) -> None:
    lines = records(stdout)
    assert [line["epoch"] for line in lines] == [1], stdout[-2000:]
    assert len(lines[0]["stats"]) == world_size and lines[0]["mrr"] > 0


@pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun is not installed (dev extra)")
def test_the_kge_app_runs_under_mpirun_without_a_rendezvous(kg):
    assert "ADAPM_RENDEZVOUS" not in ENV
    proc = subprocess.run([MPIRUN, "--oversubscribe", "-n", "2", *_kge(kg)],
                          env={**ENV, **AS_ROOT}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_trained(proc.stdout, 2)


def test_the_kge_app_runs_under_a_simulated_srun(kg):
    job = str(uuid.uuid4().int % 10**7)  # a job id of its own: another run's port differs
    procs = [subprocess.Popen(_kge(kg), env={**ENV, **_slurm(rank, 2, job=job)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    _check_trained(outs[0][0], 2)
    assert not records(outs[1][0])  # rank 1 prints no records


# --- per-rank output prefixes ------------------------------------------------------------


def test_prefix_lines_splits_whole_lines_only():
    assert prefix_lines(b"[rank 1]: ", b"a\nb\r\nc") == (b"[rank 1]: a\n[rank 1]: b\r\n", b"c")
    # a progress bar redrawing its line: each redraw is prefixed; a trailing \r waits
    assert prefix_lines(b"P ", b"10%\r20%\r") == (b"P 10%\r", b"20%\r")
    assert prefix_lines(b"P ", b"20%\r" + b"\n") == (b"P 20%\r\n", b"")
    assert prefix_lines(b"P ", b"") == (b"", b"")


RANK_OUTPUT = ("import os, sys\n"
               "r = os.environ['ADAPM_RANK']\n"
               "print(f'out {r}', flush=True)\n"
               "print(f'err {r}\\nsecond {r}', file=sys.stderr, flush=True)\n"
               "sys.stdout.write(f'unended {r}')\n")


def test_prefix_on_marks_every_line_of_every_rank():
    proc = run([*LAUNCHER, "--prefix", "on", "-n", "2", PY, "-c", RANK_OUTPUT], timeout=60)
    assert sorted(proc.stdout.splitlines()) == ["[rank 0]: out 0", "[rank 0]: unended 0",
                                                "[rank 1]: out 1", "[rank 1]: unended 1"]
    assert sorted(proc.stderr.splitlines()) == ["[rank 0]: err 0", "[rank 0]: second 0",
                                                "[rank 1]: err 1", "[rank 1]: second 1"]


def test_prefix_auto_leaves_pipes_alone_and_marks_a_terminal():
    proc = run([*LAUNCHER, "-n", "2", PY, "-c", RANK_OUTPUT], timeout=60)
    # unprefixed, each line whole (an unended one ended at the rank's exit)
    assert sorted(proc.stdout.splitlines()) == ["out 0", "out 1", "unended 0", "unended 1"]
    assert sorted(proc.stderr.splitlines()) == ["err 0", "err 1", "second 0", "second 1"]
    assert "[rank" not in proc.stdout + proc.stderr
    lines = _on_a_terminal(2).splitlines()
    assert sorted(lines) == sorted(f"[rank {r}]: {what} {r}" for r in (0, 1)
                                   for what in ("out", "err", "second", "unended")), lines
    assert "[rank " not in _on_a_terminal(1)  # one rank: nothing to tell apart


# Lines written in two pieces, each flushed (print(x, end=""), then the rest; a program's
# buffer that fills within a line does the same), with pauses between them now and then.
MANY_LINES = ("import os, sys, time\n"
              "r = os.environ['ADAPM_RANK']\n"
              "for i in range(600):\n"
              "    print(f'rank {r} line {i:05d} ', end='', flush=True)\n"
              "    if i % 20 == 0:\n"
              "        time.sleep(0.002)\n"
              "    print(r * 80, flush=True)\n")


def test_two_ranks_lines_into_a_pipe_stay_whole():
    """Into a file or a pipe (no prefix), each rank's lines reach adapm-run's output whole:
    written straight, a line a rank wrote in pieces could have the other rank's output between
    them (a user saw 2 such lines in 4,000 of a 2-node KGE run's log)."""
    proc = run([*LAUNCHER, "-n", "2", PY, "-c", MANY_LINES], timeout=120)
    lines = proc.stdout.splitlines()
    expected = [f"rank {r} line {i:05d} " + str(r) * 80 for r in (0, 1) for i in range(600)]
    assert sorted(lines) == expected, [line for line in lines if line not in expected][:3]
    # each rank's in its order
    for r in (0, 1):
        assert [x for x in lines if x.startswith(f"rank {r} ")] == expected[600 * r:600 * (r + 1)]


def _on_a_terminal(n: int) -> str:
    """adapm-run's output with its stdout and stderr a terminal (a pty)."""
    leader, follower = os.openpty()
    proc = subprocess.Popen([*LAUNCHER, "-n", str(n), PY, "-c", RANK_OUTPUT], env=ENV,
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            assert ready, "no output for 60 s"
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()
        os.close(leader)
    return b"".join(chunks).decode()


def test_log_dir_keeps_each_ranks_output_as_written(tmp_path):
    logs = tmp_path / "logs" / "job"  # created
    proc = run([*LAUNCHER, "--prefix", "on", "--log-dir", str(logs), "-n", "2", PY, "-c",
                RANK_OUTPUT], timeout=60)
    assert len(proc.stdout.splitlines()) == 4  # the terminal still gets every line
    for r in (0, 1):
        assert (logs / f"rank-{r}.stdout").read_text() == f"out {r}\nunended {r}"
        assert (logs / f"rank-{r}.stderr").read_text() == f"err {r}\nsecond {r}\n"
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = run([*LAUNCHER, "--log-dir", str(blocker / "logs"), "-n", "2", PY, "-c", "pass"],
              expect=2, timeout=60)
    assert "--log-dir" in bad.stderr and "Traceback" not in bad.stderr


def test_a_bad_prefix_mode_is_a_usage_error():
    proc = run([*LAUNCHER, "--prefix", "sometimes", "-n", "2", PY, "-c", "pass"], expect=2,
               timeout=60)
    assert "--prefix" in proc.stderr and "Traceback" not in proc.stderr
