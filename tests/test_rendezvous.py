"""The rendezvous never waits longer than it must, and never pairs two jobs: real processes on
loopback, each a rank started by hand (ADAPM_RANK, ADAPM_WORLD_SIZE, ADAPM_RENDEZVOUS)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import msgpack
import zmq

from adapm.testing import free_port, listening

# A rank: joins, pushes ones, sums, prints "SUM <rank> <sum>"; or prints the error's class and
# text on one line and exits 1.
RANK = """
import sys, numpy as np, adapm
try:
    with adapm.init(num_keys=4) as node:
        w = node.worker()
        w.push(np.arange(4), np.ones((4, 1), np.float32))
        w.wait()
        node.barrier()
        print("SUM", node.rank, float(w.pull(np.arange(4)).sum()), flush=True)
except adapm.AdaPMError as exc:
    print("ERROR", type(exc).__name__, str(exc).replace("\\n", " "), flush=True)
    sys.exit(1)
"""
FAILURE_S = 2.0


def _start(rank: int, size: int, port: int, **env) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("ADAPM_", "OMPI_", "PMI_", "SLURM_"))
             and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    clean.update(ADAPM_RANK=str(rank), ADAPM_WORLD_SIZE=str(size),
                 ADAPM_RENDEZVOUS=f"127.0.0.1:{port}", ADAPM_CONNECT_TIMEOUT_S="120",
                 ADAPM_FAILURE_TIMEOUT_S=str(FAILURE_S), **env)
    return subprocess.Popen([sys.executable, "-c", RANK], env=clean, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out + err


def _await_listening(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not listening(port):
        assert proc.poll() is None and time.monotonic() < deadline, "rank 0 never listened"
        time.sleep(0.05)


def _kill_during_rendezvous(victim: int) -> tuple[int, str, float]:
    """Ranks 0 and 1 of a 3-node job meet (rank 2 never comes); ``victim`` of them is killed
    once both wait. Returns the other's exit code, output and seconds from the kill to its
    exit."""
    port = free_port()
    ranks = [_start(0, 3, port)]
    try:
        _await_listening(port, ranks[0])
        ranks.append(_start(1, 3, port))
        time.sleep(3)  # rank 1 checked in and was told to wait
        ranks[victim].send_signal(signal.SIGKILL)
        start = time.monotonic()
        code, out = _finish(ranks[1 - victim])
        return code, out, time.monotonic() - start
    finally:
        for proc in ranks:
            proc.kill()


def test_a_member_learns_within_the_failure_timeout_that_rank_0_died():
    code, out, waited = _kill_during_rendezvous(victim=0)
    assert code == 1, out
    assert "ERROR NodeFailure" in out and "the rendezvous host, rank 0" in out, out
    assert "did rank 0 die?" in out, out
    assert waited < 4 * FAILURE_S + 5, waited  # not connect_timeout_s (120 s)


def test_rank_0_learns_within_the_failure_timeout_that_a_member_died():
    code, out, waited = _kill_during_rendezvous(victim=1)
    assert code == 1, out
    assert "ERROR NodeFailure" in out and "rank 1 checked in and then went silent" in out, out
    assert waited < 4 * FAILURE_S + 5, waited


def test_a_world_size_mismatch_is_named_at_once():
    port = free_port()
    rank0 = _start(0, 3, port)
    rank1 = _start(1, 2, port)
    start = time.monotonic()
    results = [_finish(rank0), _finish(rank1)]
    assert time.monotonic() - start < 60
    for code, out in results:
        assert code == 1, out
        assert "rank 1 was started for a job of 2 nodes, rank 0 for 3" in out, out


def test_two_jobs_on_one_port_do_not_pair():
    """Job b's rank 1 comes first to job a's rendezvous: refused at once, naming both jobs;
    job a forms with its own rank 1."""
    port = free_port()
    a0 = _start(0, 2, port, ADAPM_JOB="job-a")
    try:
        _await_listening(port, a0)
        b1 = _start(1, 2, port, ADAPM_JOB="job-b")
        code_b, out_b = _finish(b1)
        a1 = _start(1, 2, port, ADAPM_JOB="job-a")
        results = [_finish(a0), _finish(a1)]
    finally:
        a0.kill()
    assert code_b == 1 and "ERROR ConfigError" in out_b, out_b
    assert "belongs to job job-a; this process to job-b: two jobs on one port" in out_b, out_b
    for code, out in results:
        assert code == 0 and "SUM" in out and " 8.0" in out, out


def test_a_hello_without_an_address_per_channel_is_ignored():
    """A job of two channels per node: a hello with the job's fingerprint but one address (not
    one per channel) would make a table no member can use. Rank 0 ignores it, counts it, and
    the real rank 1 takes its place."""
    port = free_port()
    rank0 = _start(0, 2, port, ADAPM_CHANNELS="2")
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    try:
        _await_listening(port, rank0)
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send(msgpack.packb({"k": 40, "s": 1, "addr": "tcp://127.0.0.1:9",
                                 "fp": [2, 4, 1, "adaptive", "sum", 2], "job": None}))
        assert not sock.poll(2_000), "the hello was answered"
        rank1 = _start(1, 2, port, ADAPM_CHANNELS="2")
        results = [_finish(rank0), _finish(rank1)]
    finally:
        sock.close(linger=0)
        context.term()
        rank0.kill()
    for code, out in results:
        assert code == 0 and " 8.0" in out, out
    assert "whose address is not one per channel (2)" in results[0][1], results[0][1]


def test_a_hello_for_a_rank_outside_the_job_is_ignored():
    """Without authentication any local process can send rank 0 a hello: one for rank 99 of
    this job's size is answered with a refusal, and the job still forms."""
    port = free_port()
    rank0 = _start(0, 2, port)
    context = zmq.Context()
    try:
        _await_listening(port, rank0)
        sock = context.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{port}")
        # Rank 0's fingerprint: 2 nodes, 4 keys, 1 float, adaptive, summed replica updates, one
        # channel.
        sock.send(msgpack.packb({"k": 40, "s": 99, "addr": "tcp://127.0.0.1:9",
                                 "fp": [2, 4, 1, "adaptive", "sum", 1], "job": None}))
        assert sock.poll(30_000), "no answer to the stranger"
        answer = msgpack.unpackb(sock.recv())
        assert answer["k"] == 13 and "rank 99 is not in this job of 2 nodes" in answer["msg"]
        sock.close(linger=0)
        rank1 = _start(1, 2, port)
        results = [_finish(rank0), _finish(rank1)]
    finally:
        context.term()
        rank0.kill()
    for code, out in results:
        assert code == 0 and " 8.0" in out, out


def test_a_copy_of_a_members_hello_gets_neither_the_table_nor_the_job(tmp_path):
    """Without authentication a local process can copy a member's hello (its rank and the
    address it listens on, which `ss` shows): rank 0 answered the copy as the member, the
    table and the job token went to the copy, and the real rank 1 never got them. Now the
    copy gets nothing; and a hello for rank 99 of another world size no longer stops the job."""
    port = free_port()
    rank0 = _start(0, 3, port)
    context = zmq.Context()
    try:
        _await_listening(port, rank0)
        outside = context.socket(zmq.DEALER)
        outside.connect(f"tcp://127.0.0.1:{port}")
        outside.send(msgpack.packb({"k": 40, "s": 99, "addr": "tcp://127.0.0.1:9", "fp": [5],
                                    "job": None}))
        assert outside.poll(30_000) and msgpack.unpackb(outside.recv())["k"] == 13
        rank1 = _start(1, 3, port)
        listen = _rank_address(rank1.pid, rendezvous=port)
        time.sleep(0.5)  # rank 1's own hello, sent as it connected, is in (the first one wins)
        copy = context.socket(zmq.DEALER)
        copy.connect(f"tcp://127.0.0.1:{port}")
        hello = msgpack.packb({"k": 40, "s": 1, "addr": listen,
                               "fp": [3, 4, 1, "adaptive", "sum", 1], "job": None})
        copy.send(hello)
        rank2 = _start(2, 3, port)
        got = []
        deadline = time.monotonic() + 20
        while rank2.poll() is None and time.monotonic() < deadline:
            copy.send(hello)
            while copy.poll(50):
                got.append(msgpack.unpackb(copy.recv())["k"])
        results = [_finish(rank0), _finish(rank1), _finish(rank2)]
    finally:
        context.destroy(linger=0)
        rank0.kill()
    assert 41 not in got, got  # never the table
    for code, out in results:
        assert code == 0 and " 12.0" in out, out
    assert "copy of rank 1's hello from another connection" in results[0][1], results[0][1]


def _rank_address(pid: int, rendezvous: int, timeout_s: float = 60) -> str:
    """The data address a rank process listens on, as its hello advertises it
    ("tcp://127.0.0.1:PORT"), once it is connected to the rendezvous port: its TCP sockets,
    from /proc."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        listening, connected = None, False
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[9] not in inodes:
                    continue
                if fields[3] == "0A":  # LISTEN
                    listening = f"tcp://127.0.0.1:{int(fields[1].split(':')[1], 16)}"
                elif fields[3] == "01" and int(fields[2].split(":")[1], 16) == rendezvous:
                    connected = True  # ESTABLISHED, to the rendezvous
        if listening and connected:
            return listening
    raise AssertionError("rank 1 never listened and met the rendezvous")
