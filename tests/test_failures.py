"""A dead or frozen rank, under every launcher: every survivor raises NodeFailure naming it,
well before any request timeout, shuts down at once and exits non-zero.

Real processes on loopback (tests/failure_job.py): started by hand (the ``ADAPM_*`` variables
a user would set), under ``adapm-run``, and under Open MPI's ``mpirun`` (the PyPI wheel, in the
dev extra). A rank is killed with SIGKILL or frozen with SIGSTOP once all ranks train.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import adapm
from adapm.launch import free_port
from adapm.testing import run_cluster

from app_cli import ENV

JOB = str(Path(__file__).with_name("failure_job.py"))
FAILURE_TIMEOUT_S = 2.0
# Survivors must fail by detection, not by a request or barrier timeout: those are far away.
REQUEST_TIMEOUT_S = 60.0
JOB_ENV = {**ENV, "ADAPM_FAILURE_TIMEOUT_S": str(FAILURE_TIMEOUT_S),
           "ADAPM_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S),
           "ADAPM_CONNECT_TIMEOUT_S": str(REQUEST_TIMEOUT_S)}
RUN_TIMEOUT_S = 90


class Job:
    """Processes of one job whose JSON lines are collected as they come."""

    def __init__(self, procs: list) -> None:
        self.procs = procs
        self.records: list[dict] = []
        self.text: list[str] = []
        self._lock = threading.Lock()
        self._readers = [threading.Thread(target=self._read, args=(p,), daemon=True)
                         for p in procs]
        for reader in self._readers:
            reader.start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            with self._lock:
                self.text.append(line)
                if line.startswith("{"):
                    self.records.append(json.loads(line))

    def wait_until(self, condition, what: str, give_up_at_first_exit: bool = False):
        """``condition(records)`` once it is truthy; AssertionError (with the output) when the
        processes exited (one of them, with ``give_up_at_first_exit``) or time ran out."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        gave_up = any if give_up_at_first_exit else all
        while time.monotonic() < deadline:
            with self._lock:
                found = condition(list(self.records))
            if found:
                return found
            if gave_up(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"no {what}; output:\n{''.join(self.text)}")

    def ready(self, world_size: int) -> dict:
        """rank -> pid, once every rank trains."""
        def pids(records):
            found = {r["ready"]: r["pid"] for r in records if "ready" in r}
            return found if len(found) == world_size else None
        return self.wait_until(pids, "start of every rank", give_up_at_first_exit=True)

    def finish(self) -> list[int]:
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=RUN_TIMEOUT_S))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"a process hung; output:\n{''.join(self.text)}") from None
        for reader in self._readers:
            reader.join(timeout=10)
        return codes

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def start(argv_per_rank: list[list[str]], env_per_rank: list[dict]) -> Job:
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
             for argv, env in zip(argv_per_rank, env_per_rank)]
    return Job(procs)


def by_hand(world_size: int, channels: int = 1) -> Job:
    """Ranks started one by one, as a user would without a launcher."""
    rendezvous = f"127.0.0.1:{free_port()}"
    envs = [{**JOB_ENV, "ADAPM_RANK": str(r), "ADAPM_WORLD_SIZE": str(world_size),
             "ADAPM_RENDEZVOUS": rendezvous, "ADAPM_CHANNELS": str(channels)}
            for r in range(world_size)]
    return start([[sys.executable, JOB]] * world_size, envs)


def stop_rank(pid: int, how: str) -> float:
    os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    return time.time()


def check_survivors(job: Job, victim: int, world_size: int, since: float) -> None:
    """Every other rank reported NodeFailure naming ``victim`` (not a timeout, not itself)."""
    survivors = [r for r in range(world_size) if r != victim]

    def errors_of_all(records):
        found = {r["rank"]: r for r in records if "error" in r and r["rank"] != victim}
        return found if sorted(found) == survivors else None

    errors = job.wait_until(errors_of_all, "error from every survivor")
    for rank, record in errors.items():
        assert record["error"] == "NodeFailure", record
        assert record["failed_rank"] == victim, record
        assert f"rank {victim} failed" in record["message"], record
        # Noticed by detection: long before the request and barrier timeouts could fire.
        assert record["at"] - since < REQUEST_TIMEOUT_S / 2, record
        print(f"rank {rank}: NodeFailure {record['at'] - since:.2f}s after the signal")
    # And then shut down at once (shutdown() raises the failure again, without waiting).
    job.wait_until(lambda records: {r["closed"] for r in records if "closed" in r} >= set(errors),
                   "shutdown of every survivor")


@pytest.mark.parametrize("how,channels", [("kill", 1), ("stop", 1), ("kill", 3), ("stop", 2)])
def test_by_hand_every_survivor_names_the_dead_rank(how, channels):
    """With channels, each channel's engine watches the peers on its own sockets."""
    world_size, victim = 3, 2
    job = by_hand(world_size, channels)
    try:
        pids = job.ready(world_size)
        since = stop_rank(pids[victim], how)
        check_survivors(job, victim, world_size, since)
        codes = [p.wait(timeout=RUN_TIMEOUT_S) for r, p in enumerate(job.procs) if r != victim]
    finally:
        job.kill()  # the frozen victim never exits by itself
    assert codes == [3] * (world_size - 1), job.text


def test_adapm_run_frozen_rank_fails_the_job():
    """adapm-run sees a dead rank itself; a frozen one only the survivors can notice."""
    world_size, victim = 3, 1
    job = start([[sys.executable, "-m", "adapm.launch", "-n", str(world_size), "--grace", "1",
                  sys.executable, JOB]], [JOB_ENV])
    try:
        pids = job.ready(world_size)
        since = stop_rank(pids[victim], "stop")
        check_survivors(job, victim, world_size, since)
        code = job.finish()[0]
    finally:
        job.kill()
    assert code == 3, job.text  # the first survivor's exit status
    assert any("exited with status 3" in line for line in job.text), job.text


MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun is not installed (dev extra)")
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_mpirun_dead_or_frozen_rank(how):
    world_size, victim = 3, 1
    env = {**JOB_ENV, "ADAPM_RENDEZVOUS": f"127.0.0.1:{free_port()}",
           # Open MPI refuses root unless told; CI containers run as root.
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    job = start([[MPIRUN, "--oversubscribe", "-n", str(world_size), sys.executable, JOB]],
                [env])
    try:
        pids = job.ready(world_size)
        since = stop_rank(pids[victim], how)
        if how == "stop":
            check_survivors(job, victim, world_size, since)
        code = job.finish()[0]
    finally:
        job.kill()
    assert code != 0, job.text


def test_clean_job_by_hand_exits_zero():
    """Heartbeats and goodbyes cause no false failure: a short job ends cleanly everywhere."""
    rendezvous = f"127.0.0.1:{free_port()}"
    envs = [{**JOB_ENV, "ADAPM_RANK": str(r), "ADAPM_WORLD_SIZE": "3",
             "ADAPM_RENDEZVOUS": rendezvous} for r in range(3)]
    job = start([[sys.executable, JOB, "300"]] * 3, envs)
    job.ready(3)
    codes = job.finish()
    assert codes == [0, 0, 0] and len([r for r in job.records if "done" in r]) == 3, job.text


# --- inside one job: idle is not dead, collectives of different kinds do not pair ---------------

def _idle_job(node, idle_s):
    w = node.worker()
    w.push([node.rank], np.ones((1, 1), np.float32))
    w.wait()
    time.sleep(idle_s)  # no call at all: only heartbeats show the peers alive
    node.barrier()
    return w.pull(np.arange(3))[:, 0].tolist()


def test_idle_nodes_are_not_declared_failed():
    results = run_cluster(_idle_job, 3, args=(3 * 1.0,), timeout_s=RUN_TIMEOUT_S,
                          config=dict(num_keys=3, failure_timeout_s=1.0))
    assert results == [[1.0, 1.0, 1.0]] * 3


def _mismatched_collectives_job(node):
    started = time.monotonic()
    try:
        if node.rank == 0:
            node.barrier()
        else:
            node.shutdown()
    except adapm.AdaPMError as exc:
        node._release()  # leave without meeting anyone, as after any failure
        return type(exc).__name__, str(exc), time.monotonic() - started
    return "no error", "", time.monotonic() - started


def test_barrier_never_pairs_with_shutdown():
    results = run_cluster(_mismatched_collectives_job, 2, timeout_s=RUN_TIMEOUT_S,
                          config=dict(num_keys=4, connect_timeout_s=REQUEST_TIMEOUT_S))
    for kind, text, seconds in results:
        assert "does not match across nodes" in text, results
        assert "rank 0 barrier()" in text and "rank 1 shutdown()" in text, results
        assert seconds < REQUEST_TIMEOUT_S / 2, results  # told at once, not timed out


def _late_peer_job(node):
    """Rank 0's barrier times out and is called again; rank 1 arrives between the two."""
    w = node.worker()
    timed_out = False
    if node.rank == 0:
        try:
            node.barrier(timeout_s=0.5)
        except adapm.AdaPMTimeout:
            timed_out = True
        node.barrier(timeout_s=REQUEST_TIMEOUT_S)  # the retry
        w.push([0], np.ones((1, 1), np.float32))
        w.wait()
    else:
        time.sleep(3.0)  # well past rank 0's first timeout, on a loaded machine too
        node.barrier()
    node.barrier()  # the next collective pairs with the next, not off by one
    return timed_out, float(w.pull([0])[0, 0])


def test_a_barrier_that_timed_out_can_be_called_again():
    """The timed-out arrival still counted, so the retry started collective #1 while rank 1
    met #0 with it and passed at once; the next collectives were off by one and failed."""
    results = run_cluster(_late_peer_job, 2, timeout_s=RUN_TIMEOUT_S,
                          config=dict(num_keys=4, value_length=1,
                                      connect_timeout_s=REQUEST_TIMEOUT_S))
    assert results == [(True, 1.0), (False, 1.0)], results


@pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun is not installed (dev extra)")
def test_a_stale_single_node_setting_under_mpirun_fails_every_rank():
    """ADAPM_RANK=0 ADAPM_WORLD_SIZE=1 left in the environment, then mpirun -n 2: not two
    unrelated single nodes that both exit 0, but an error on each naming both settings."""
    code = "import adapm; adapm.init(num_keys=4)"
    env = {**os.environ, "ADAPM_RANK": "0", "ADAPM_WORLD_SIZE": "1",
           "ADAPM_RENDEZVOUS": f"127.0.0.1:{free_port()}",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    proc = subprocess.run([MPIRUN, "--oversubscribe", "-n", "2", sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    assert "ADAPM_RANK/ADAPM_WORLD_SIZE say rank 0 of 1, but OMPI_COMM_WORLD_RANK/" \
           "OMPI_COMM_WORLD_SIZE say rank" in text, text


def test_a_rank_resumed_after_sigstop_learns_it_was_declared_failed():
    """Rank 1 frozen past the timeout: rank 0 declares it failed and tells it too, so when rank
    1 resumes it raises NodeFailure naming itself, instead of blaming rank 0 (whose engine has
    stopped meanwhile) once its own failure timeout passes."""
    job = by_hand(2)
    try:
        pids = job.ready(2)
        since = stop_rank(pids[1], "stop")
        check_survivors(job, 1, 2, since)
        os.kill(pids[1], signal.SIGCONT)
        record = job.wait_until(
            lambda records: next((r for r in records if "error" in r and r["rank"] == 1), None),
            "error from the resumed rank")
        codes = job.finish()
    finally:
        job.kill()
    assert record["error"] == "NodeFailure" and record["failed_rank"] == 1, record
    assert "rank 0 declared this node failed" in record["message"], record
    assert codes[1] != 0, job.text


_STALLED_PEER = """
import json, os, signal, sys, threading, time
import numpy as np
import adapm

mode = sys.argv[1]
node = adapm.init(num_keys=64, value_length=2)
node.barrier()
if node.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # alive, silent: the test kills it
w = node.worker()
out = {}
def in_wait_sync():
    try:
        w.intent(np.arange(1, 64, 2), w.clock, w.clock + 100)  # keys homed on rank 1
        w.wait_sync()
        out["wait_sync"] = "returned"
    except adapm.AdaPMError as exc:
        out["wait_sync"] = type(exc).__name__
if mode == "shutdown":
    thread = threading.Thread(target=in_wait_sync)
    thread.start()
    time.sleep(1)
    start = time.monotonic()
    try:
        node.shutdown(timeout_s=3)
        out["shutdown"] = "returned"
    except adapm.AdaPMError as exc:
        out["shutdown"] = type(exc).__name__
    out["shutdown_s"] = time.monotonic() - start
    thread.join()
else:  # the round times out (request_timeout_s), then a barrier is asked for
    in_wait_sync()
    try:
        node.barrier()
    except adapm.AdaPMError as exc:
        out["barrier"] = str(exc)
print(json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("mode", ["shutdown", "barrier"])
def test_a_stalled_peer_bounds_shutdown_and_a_dead_node_says_why(mode):
    """Rank 1 stops (SIGSTOP: alive to the failure detector for 30 s, answering nothing).
    ``shutdown(timeout_s=3)`` on rank 0, while another thread waits in ``wait_sync``, comes
    back in about 3 s (its round waited request_timeout_s, 20 s, before); after the node died
    of its round's timeout, a barrier raises that error (it said the barrier timed out)."""
    timeouts = ({"ADAPM_REQUEST_TIMEOUT_S": "20"} if mode == "shutdown" else
                {"ADAPM_REQUEST_TIMEOUT_S": "2", "ADAPM_CONNECT_TIMEOUT_S": "20"})
    env = {**ENV, "ADAPM_WORLD_SIZE": "2", "ADAPM_RENDEZVOUS": f"127.0.0.1:{free_port()}",
           "ADAPM_FAILURE_TIMEOUT_S": "30", **timeouts}
    procs = [subprocess.Popen([sys.executable, "-c", _STALLED_PEER, mode], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**env, "ADAPM_RANK": str(rank)}) for rank in (0, 1)]
    try:
        out, err = procs[0].communicate(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert procs[0].returncode == 0, err
    result = json.loads(out)
    if mode == "shutdown":
        assert result["shutdown"] == "AdaPMTimeout" and result["shutdown_s"] < 12, result
        assert result["wait_sync"] in ("StateError", "AdaPMTimeout"), result
    else:
        assert result["wait_sync"] == "AdaPMTimeout", result
        assert "sync round" in result["barrier"] and "did not arrive" not in result["barrier"], \
            result
