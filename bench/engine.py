"""Engine CPU: what one node's engine thread costs per message, per moved row, per replica sync
and per empty round. Two real node processes on loopback.

    python bench/engine.py            # the table (about a minute here)
    python bench/engine.py --quick    # smaller counts

The engine thread's own CPU clock (``stats()["engine_cpu_s"]``, the thread's
``pthread_getcpuclockid``) is read before and after each workload on both nodes, so the
workers' CPU and ZeroMQ's I/O threads are not in it. Each workload isolates one cost:

- **small messages**: rank 0 pulls one key homed on rank 1, one call at a time. Per message:
  both nodes' engine CPU over the logical messages both received (request and answer). This
  is all the engine thread does for it: the wake-up by the worker, the loop's passes and ticks,
  decoding, validation, serving, encoding. Then each side alone: the owner (rank 1, whose
  transport serves the pull in C, native/zmq_io.c) and the requester (rank 0, whose engine
  loop takes the worker's call, sends it and hands the answer back: Python per message).
- **pushes in flight**: rank 0 pushes one key homed on rank 1 at a time, as fast as its worker
  makes them, then waits for them all: requests and their acknowledgements queue up while the
  engine threads work, so one wake-up takes in many messages. Per message: both nodes' engine
  CPU over the logical messages both received (the pushes and their acknowledgements); then
  each side alone, as above (both in C: the owner serves the pushes, native/serve_wire.c, and
  the requester's transport sends them and takes the acknowledgements in, native/zmq_calls.c).
  The ping-pong above is the worst case, a wake-up per message; this is the other end: the
  work per message itself. 50,000 pushes (10,000 until session 35: the start of the burst,
  before requests pile up, weighed 1.5-2x more per message then; 2,000 with ``--quick``).
- **moved rows**: each clock, one node intends a batch of keys the other holds, alone, so the
  owner relocates them (and back, the next clock, from the other side). Per moved row: engine
  CPU of both nodes over rows relocated in, minus their messages at the small-message cost
  (the per-row part: copy, slot, directory, masks).
- **replica sync**: both nodes intend the same keys for the whole run and push to them every
  clock, so every round each holder sends its deltas and gets the merged rows back. Per
  replicated key and round (a delta out and a refresh in), engine CPU of both nodes.
- **empty rounds**: ``wait_sync()`` with no intent at all. Per round.
- **a wake-up alone** (the floor under the empty round): one process, two threads, no
  engine: a "worker" thread writes an eventfd and waits on a lock; an "engine" thread, blocked
  in a pyzmq poll of a ROUTER socket and that eventfd (as the engine's poll), reads the eventfd
  and releases the lock. Per round trip, the "engine" thread's CPU: what a Python loop pays to
  be woken for a worker's call and to wake the worker again, before it does any work. The
  empty round's line less this one is the engine's own work per round.
- **a worker's clock** (the worker's side of the engine): on rank 0, clocks of intent (for
  the batch 100 clocks on), pull, an update, push and ``advance_clock`` over 100 keys owned
  here, then the same clocks without intent; the worker thread's own CPU per clock, and the
  engine loop's passes meanwhile. The rounds decide such keys here and send nothing, so the
  pacing spaces them out: an intent that woke the idle loop for nothing would show as passes
  and as the worker's CPU (GIL hand-overs, system calls).
- **ZeroMQ alone** (the floor under the first line): two processes that only echo a small
  message over the same sockets (a ROUTER to receive, a DEALER per peer to send, a poll on
  the ROUTER and an eventfd), through pyzmq as the engine uses it, no engine at all. Per
  received message, both sides' thread CPU over both sides' received messages: what one
  wake-up, receive and send cost here before the engine does anything.

The targets (issue: the engine at native speed) are at most 1.5 us per moved row, 5 us per
message plus its per-key work, 5 us per empty round. The machine has 2 cores for 4 busy threads
here; compare runs made in one sitting.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

from adapm.testing import run_cluster

import multiprocessing as mp

DIM = 16


def _cpu(node) -> float:
    return node.stats()["engine_cpu_s"]


def _received(node) -> int:
    return node.stats()["messages_received"]


def _job(node, counts: dict) -> dict:
    """On both ranks; module-level for spawn. Returns this node's engine CPU and counters per
    workload (rank 0 drives the small messages; both drive the rest)."""
    w = node.worker()
    out = {}
    rng = np.random.default_rng(node.rank)

    def measure(name, body):
        node.barrier()
        before = dict(node.stats(), passes=node.engine.passes)
        started = time.perf_counter()
        body()
        node.barrier()
        after = dict(node.stats(), passes=node.engine.passes)
        out[name] = {k: after[k] - before[k] for k in (
            "engine_cpu_s", "messages_received", "wire_messages_received", "messages_sent",
            "relocations_in",
            "rounds", "bytes_sent", "passes")}
        out[name]["wall_s"] = time.perf_counter() - started

    def small_messages():
        if node.rank == 0:
            for i in range(counts["pulls"]):
                w.pull(np.array([2 * (i % 1000) + 1]))  # odd: homed on rank 1

    def pushes_in_flight():
        if node.rank == 0:
            one = np.ones((1, DIM), np.float32)
            for i in range(counts["pushes"]):
                w.push(np.array([2 * (i % 1000) + 1]), one)  # odd: homed on rank 1
            w.wait()

    def moved_rows():
        batch, clocks = counts["batch"], counts["clocks"]
        base = 100_000  # keys [base, base + 2 * batch): away from the other workloads' keys
        for clock in range(clocks):
            # Even clocks rank 0 wants the batch, odd clocks rank 1: it moves every clock.
            if clock % 2 == node.rank:
                keys = np.arange(base, base + batch, dtype=np.int64)
                w.intent(keys, w.clock + 1)
            w.advance_clock()
            w.wait_sync()
            node.barrier()

    def replica_sync():
        keys = np.arange(200_000, 200_000 + counts["replicated"], dtype=np.int64)
        w.intent(keys, w.clock + 1, w.clock + 1 + counts["clocks"] + 1)
        w.advance_clock()
        w.wait_sync()
        ones = np.ones((len(keys), DIM), np.float32)
        for _ in range(counts["clocks"]):
            w.push(keys, ones)
            w.advance_clock()
            w.wait_sync()

    def empty_rounds():
        for _ in range(counts["empty"]):
            w.wait_sync()

    measure("small messages", small_messages)
    measure("pushes in flight", pushes_in_flight)
    measure("moved rows", moved_rows)
    measure("replica sync", replica_sync)
    # The replica sync's intents end one clock after its last push: move past them, so that
    # the rounds below are empty (with the replicas still held, each round checked them all).
    for _ in range(2):
        w.advance_clock()
        w.wait_sync()
    node.barrier()
    w.wait_sync()
    held = node.engine.state.replicas_held()
    if held:
        raise RuntimeError(f"rank {node.rank}: {held} replicas still held before the empty rounds")
    measure("empty rounds", empty_rounds)
    out["worker clock"] = _worker_clock(node, w, counts["worker_clocks"])
    return out


def _worker_clock(node, w, clocks: int) -> dict:
    """What a worker's clock costs the worker thread itself (its own CPU clock) on rank 0:
    intent for the batch 100 clocks on, pull, an update, push and advance_clock, 100 keys owned
    here (so rounds decide them here and send nothing, and the pacing spaces them out); then
    the same clocks without intent. With the engine loop's passes meanwhile: an intent that woke
    it for nothing cost the worker GIL hand-overs and system calls."""
    result = {}
    node.barrier()
    if node.rank == 0:
        rng = np.random.default_rng(7)
        owned = 300_000 + 2 * np.arange(2000, dtype=np.int64)  # even: homed on rank 0
        batches = [rng.choice(owned, 100) for _ in range(clocks + 100)]
        vals = np.empty((100, DIM), np.float32)
        for t in range(100):
            w.intent(batches[t], w.clock + t)
        w.wait_sync()
        for name, intent in (("with intent", True), ("without intent", False)):
            passes, cpu = node.engine.passes, time.thread_time()
            for t in range(clocks):
                if intent:
                    w.intent(batches[t + 100], w.clock + 100)
                w.pull(batches[t], out=vals)
                vals *= 0.5
                w.push(batches[t], vals)
                w.advance_clock()
            result[name] = {"cpu_s": time.thread_time() - cpu,
                            "passes": node.engine.passes - passes}
            w.wait_sync()
    node.barrier()
    return result


def _wakeup_floor(n: int) -> float:
    """Thread CPU of the woken thread per worker -> engine -> worker round trip (see the
    module docstring), best of three runs (the machine's noise only adds)."""
    import _thread
    import threading

    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind_to_random_port("tcp://127.0.0.1")
    wake = os.eventfd(0, os.EFD_NONBLOCK)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(wake, zmq.POLLIN)
    best = float("inf")
    for _ in range(3):
        latch: list = [None]
        cpu: list = [0.0]

        def engine() -> None:
            started, done = time.thread_time(), 0
            while done < n:
                if not poller.poll(1000):
                    continue
                try:
                    os.eventfd_read(wake)
                except BlockingIOError:
                    continue
                latch[0].release()
                done += 1
            cpu[0] = time.thread_time() - started

        thread = threading.Thread(target=engine)
        thread.start()
        for _ in range(n):
            lock = _thread.allocate_lock()
            lock.acquire()
            latch[0] = lock
            os.eventfd_write(wake, 1)
            if not lock.acquire(timeout=60):
                raise RuntimeError("the wake-up floor's engine thread did not answer")
        thread.join(60)
        best = min(best, cpu[0] / n)
    os.close(wake)
    ctx.destroy(linger=0)
    return best


def _echo(port_q, n: int) -> None:
    """The far side of :func:`_zmq_floor`: receive and answer ``n`` messages."""
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port_q.put(router.bind_to_random_port("tcp://127.0.0.1"))
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(port_q.get())
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    wake = os.eventfd(0, os.EFD_NONBLOCK)
    poller.register(wake, zmq.POLLIN)
    dealer.send(b"ready")
    started = time.thread_time()
    for _ in range(n):
        while not poller.poll(1000):
            pass
        frames = router.recv_multipart(copy=False)
        dealer.send_multipart(frames[1:], copy=False)
    port_q.put(time.thread_time() - started)
    ctx.destroy(linger=0)


def _zmq_floor(n: int) -> float:
    """Thread CPU (both processes) per received message of a small-message echo over pyzmq."""
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    q = mp.get_context("spawn").Queue()
    child = mp.get_context("spawn").Process(target=_echo, args=(q, n))
    child.start()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{q.get(timeout=60)}")
    q.put(f"tcp://127.0.0.1:{port}")
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    wake = os.eventfd(0, os.EFD_NONBLOCK)
    poller.register(wake, zmq.POLLIN)
    router.recv_multipart()  # the far side is connected both ways
    header, payload = bytes(56), bytes(16)  # a 1-key pull's frames
    started = time.thread_time()
    for _ in range(n):
        dealer.send_multipart([header, payload], copy=False)
        while not poller.poll(1000):
            pass
        router.recv_multipart(copy=False)
    mine = time.thread_time() - started
    theirs = q.get(timeout=60)
    child.join(60)
    ctx.destroy(linger=0)
    return (mine + theirs) / (2 * n)


def _table(results: list[dict], counts: dict, floor_s: float, wakeup_s: float) -> list[str]:
    clock = results[0].pop("worker clock")  # rank 0's alone
    for r in results[1:]:
        r.pop("worker clock")
    both = {name: {k: sum(r[name][k] for r in results) for k in results[0][name]}
            for name in results[0]}
    small = both["small messages"]
    per_message = small["engine_cpu_s"] / max(small["messages_received"], 1)
    side = [r["small messages"] for r in results]
    per_side = [s["engine_cpu_s"] / max(s["messages_received"], 1) for s in side]
    flight = both["pushes in flight"]
    per_flight = flight["engine_cpu_s"] / max(flight["messages_received"], 1)
    bside = [r["pushes in flight"] for r in results]
    per_bside = [s["engine_cpu_s"] / max(s["messages_received"], 1) for s in bside]
    moved = both["moved rows"]
    rows_moved = moved["relocations_in"]
    per_row = ((moved["engine_cpu_s"] - per_message * moved["messages_received"])
               / max(rows_moved, 1))
    replica = both["replica sync"]
    replica_units = counts["replicated"] * counts["clocks"]  # key-rounds per holder
    per_replica = replica["engine_cpu_s"] / max(replica_units, 1)
    empty = both["empty rounds"]
    per_round = empty["engine_cpu_s"] / max(empty["rounds"], 1)
    lines = [
        "| cost | engine CPU (both nodes) | count | per unit | target |",
        "|---|---:|---:|---:|---:|",
        f"| per received message (1-key pull and its answer) | {small['engine_cpu_s']:.3f} s | "
        f"{small['messages_received']} messages | **{per_message * 1e6:.1f} us** | 5 us |",
        f"| ... at the owner (rank 1: the pulls it served) | {side[1]['engine_cpu_s']:.3f} s | "
        f"{side[1]['messages_received']} messages | **{per_side[1] * 1e6:.1f} us** | 5 us |",
        f"| ... at the requester (rank 0: the answers) | {side[0]['engine_cpu_s']:.3f} s | "
        f"{side[0]['messages_received']} messages | **{per_side[0] * 1e6:.1f} us** | 5 us |",
        f"| per received message, 1-key pushes as fast as a worker makes them (in flight) | "
        f"{flight['engine_cpu_s']:.3f} s | {flight['messages_received']} messages "
        f"({flight['wire_messages_received']} wire) | **{per_flight * 1e6:.1f} us** | |",
        f"| ... at the owner (rank 1: the pushes it served) | {bside[1]['engine_cpu_s']:.3f} s | "
        f"{bside[1]['messages_received']} messages | **{per_bside[1] * 1e6:.1f} us** | |",
        f"| ... at the requester (rank 0: the acknowledgements) | "
        f"{bside[0]['engine_cpu_s']:.3f} s | {bside[0]['messages_received']} messages | "
        f"**{per_bside[0] * 1e6:.1f} us** | |",
        f"| per moved row, all in ({counts['batch']} keys a clock, d={DIM}) | "
        f"{moved['engine_cpu_s']:.3f} s | {rows_moved} rows, {moved['messages_received']} "
        f"messages | **{moved['engine_cpu_s'] / max(rows_moved, 1) * 1e6:.1f} us** | |",
        f"| per moved row, the messages at the first line's cost taken off | | | "
        f"**{per_row * 1e6:.1f} us** | 1.5 us |",
        f"| per replicated key and round (delta out, refresh in; {counts['replicated']} keys) | "
        f"{replica['engine_cpu_s']:.3f} s | {replica_units} key-rounds | "
        f"**{per_replica * 1e6:.1f} us** | |",
        f"| per empty round (wait_sync, no intent) | {empty['engine_cpu_s']:.3f} s | "
        f"{empty['rounds']} rounds | **{per_round * 1e6:.1f} us** | 5 us |",
        f"| ... a wake-up alone: a Python loop woken by a worker's call and waking it again "
        f"(no engine, best of 3) | | {counts['empty']} round trips | "
        f"**{wakeup_s * 1e6:.1f} us** | |",
        f"| ... the empty round less the wake-up: the engine's own work per round | | | "
        f"**{(per_round - wakeup_s) * 1e6:.1f} us** | |",
        f"| ZeroMQ alone: per received message of a small-message echo (pyzmq, no engine) | | "
        f"{2 * counts['pulls']} messages | **{floor_s * 1e6:.1f} us** | |",
        f"| a worker's clock: intent, pull, push of 100 keys owned here (the worker thread's "
        f"CPU, rank 0) | | {counts['worker_clocks']} clocks | "
        f"**{clock['with intent']['cpu_s'] / counts['worker_clocks'] * 1e6:.1f} us** | |",
        f"| ... the same clocks without intent | | {counts['worker_clocks']} clocks | "
        f"**{clock['without intent']['cpu_s'] / counts['worker_clocks'] * 1e6:.1f} us** | |",
        "",
        f"engine loop passes during the worker's clocks: {clock['with intent']['passes']} with "
        f"intent, {clock['without intent']['passes']} without",
        "engine loop passes (both nodes) and wall time: " + "; ".join(
            f"{name}: {v['passes']} passes, {v['wall_s'] / 2:.2f} s" for name, v in both.items()),
        f"bytes sent per moved row: {moved['bytes_sent'] / max(rows_moved, 1):.0f} "
        f"(a row is {DIM * 4} bytes of values); per replicated key and round: "
        f"{replica['bytes_sent'] / max(2 * replica_units, 1):.0f}",
    ]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller counts")
    opts = p.parse_args(argv)
    counts = (dict(pulls=500, pushes=2000, batch=500, clocks=40, replicated=500,
                        empty=200, worker_clocks=1000) if opts.quick
              else dict(pulls=3000, pushes=50000, batch=2000, clocks=100,
                        replicated=2000, empty=1000, worker_clocks=3000))
    results = run_cluster(_job, 2, args=(counts,), timeout_s=600,
                          config=dict(num_keys=400_000, value_length=DIM,
                                      request_timeout_s=120, connect_timeout_s=60))
    print(f"machine: nproc={os.cpu_count()}, {platform.machine()}, python "
          f"{platform.python_version()}, numpy {np.__version__}; 2 nodes on loopback")
    floor_s = _zmq_floor(counts["pulls"])
    wakeup_s = _wakeup_floor(counts["empty"])
    print("\n".join(_table(results, counts, floor_s, wakeup_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
