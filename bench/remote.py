"""Remote access: pull and push from rank 0 to keys homed on rank 1, two real local nodes.

    python bench/remote.py            # full run, CURVE off and on side by side (~1 minute)
    python bench/remote.py --quick    # smaller run
    python bench/remote.py --auth off # one mode only (off: plain ZeroMQ; on: CURVE)

Two node processes on loopback (``adapm.testing.run_cluster``: spawned, fresh rendezvous port,
hard timeout, exit codes checked). Rank 0 measures; rank 1 only serves (its communication
thread answers) until the final barrier. Every key used is odd, so homed on and owned by rank 1
(``k % 2 == 1``), and every access is remote: the worker sends one request to rank 1 and (for a
pull, or a push followed by ``wait()``) blocks on the answer.

- latency rows (batches of 1 and 100 keys): one operation at a time; mean and 99th percentile
  of the per-call time.
- throughput rows (batches of 1k and 10k keys): ``pull``, and ``push+wait`` per batch, one at a
  time; ``push xN, wait`` issues a whole repetition's pushes back to back and waits once.
  MB/s counts value bytes (batch * dim * 4) only, not keys or headers.

Each figure is the best (min) over several repetitions of the same calls. The machine is shared
and has 2 cores for 3 busy threads here (rank 0's worker and communication threads, rank 1's
communication thread): treat absolute numbers as a floor, compare ratios measured in one run.

Authentication (docs/security.md): with ``--auth both`` (the default) every size runs twice,
first with plain ZeroMQ, then with CURVE (``Config(auth=True)``: the same loopback job,
authenticated and encrypted as it would be across hosts), and the table puts the two side by
side with the ratio of their mean times per call (on / off: 1.25 means CURVE takes 25% longer).
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import sys
import time

import numpy as np
import zmq

from adapm.testing import run_cluster

SIZES = ((16, 1_000_000), (128, 200_000))
LATENCY_BATCHES = (1, 100)
THROUGHPUT_BATCHES = (1_000, 10_000)


def _odd_keys(rng, num_keys: int, batch: int) -> np.ndarray:
    """Random keys homed on rank 1 of 2 (odd), drawn with replacement."""
    return rng.integers(0, num_keys // 2, batch, dtype=np.int64) * 2 + 1


def _job(node, dim: int, num_keys: int, quick: bool, auth: bool = False) -> list:
    """Runs on every rank: rank 0 measures, rank 1 serves. Module-level for spawn."""
    assert node.config.authenticated == auth
    assert bool(node.transport.router.getsockopt(zmq.CURVE_SERVER)) == auth
    rows = []
    if node.rank == 0:
        w = node.worker()
        rng = np.random.default_rng(7)
        reps = 3 if quick else 5
        # warm-up: connections, allocator, first-touch of rank 1's slab pages
        for _ in range(50):
            k = _odd_keys(rng, num_keys, 100)
            w.pull(k)
            w.push(k, np.zeros((100, dim), np.float32))
        w.wait()

        for batch in LATENCY_BATCHES:
            calls = (300 if quick else 1000) // (1 if batch == 1 else 2)
            keys = [_odd_keys(rng, num_keys, batch) for _ in range(calls)]
            upd = np.ones((batch, dim), np.float32)
            buf = np.empty((batch, dim), np.float32)
            rows.append(_latency("pull", batch, dim, reps, keys,
                                 lambda k: w.pull(k, out=buf)))

            def push_wait(k):
                w.push(k, upd)
                w.wait()
            rows.append(_latency("push+wait", batch, dim, reps, keys, push_wait))

        for batch in THROUGHPUT_BATCHES:
            total = (50_000 if quick else 200_000) if dim == 16 else (20_000 if quick else 100_000)
            calls = max(2, total // batch)
            keys = [_odd_keys(rng, num_keys, batch) for _ in range(calls)]
            upd = np.ones((batch, dim), np.float32)
            buf = np.empty((batch, dim), np.float32)
            rows.append(_latency("pull", batch, dim, reps, keys,
                                 lambda k: w.pull(k, out=buf)))

            def push_wait(k):
                w.push(k, upd)
                w.wait()
            rows.append(_latency("push+wait", batch, dim, reps, keys, push_wait))

            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                for k in keys:
                    w.push(k, upd)
                w.wait()
                best = min(best, time.perf_counter() - t0)
            rows.append(("push xN, wait", batch, dim, best / calls * 1e6, None, calls * batch / best))

        # Every push above added 1 (or 0 in the warm-up) to odd keys only: spot-check a few.
        s = node.stats()
        assert s["remote_pull_keys"] > 0 and s["local_pull_keys"] == 0, s
        even = w.pull(np.arange(0, min(num_keys, 2000), 2, dtype=np.int64))
        assert not even.any(), "a push reached an even key (homed on rank 0)"
    node.barrier()
    return rows


def _latency(op, batch, dim, reps, keys, fn):
    """(op, batch, dim, mean us, p99 us, keys/s): best repetition by mean."""
    best = None
    times = np.empty(len(keys))
    for _ in range(reps):
        for i, k in enumerate(keys):
            t0 = time.perf_counter()
            fn(k)
            times[i] = time.perf_counter() - t0
        mean = times.mean()
        if best is None or mean < best[0]:
            best = (mean, float(np.percentile(times, 99)))
    mean, p99 = best
    return (op, batch, dim, mean * 1e6, p99 * 1e6, batch / mean)


def _measure(dim: int, num_keys: int, quick: bool, auth: bool) -> list:
    config = {"num_keys": num_keys, "value_length": dim}
    if auth:
        config.update(auth=True, secret=secrets.token_urlsafe(32))
    result = run_cluster(_job, world_size=2, args=(dim, num_keys, quick, auth), timeout_s=110,
                         config=config)
    return result[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repetitions")
    parser.add_argument("--auth", choices=("both", "off", "on"), default="both",
                        help="CURVE off, on, or both side by side (default)")
    opts = parser.parse_args(argv)
    sizes = SIZES if not opts.quick else ((16, 200_000), (128, 50_000))
    modes = {"both": (False, True), "off": (False,), "on": (True,)}[opts.auth]

    t0 = time.perf_counter()
    rows: dict[bool, list] = {mode: [] for mode in modes}
    for dim, num_keys in sizes:
        for mode in modes:  # off then on, per size: both see the machine in the same state
            rows[mode] += _measure(dim, num_keys, opts.quick, mode)

    print(f"machine: nproc={os.cpu_count()}, {platform.machine()}, python "
          f"{platform.python_version()}, numpy {np.__version__}, pyzmq {zmq.__version__} "
          f"(libzmq {zmq.zmq_version()}, CURVE {'yes' if zmq.has('curve') else 'no'}); "
          "2 nodes on loopback, rank 0 -> keys of rank 1")
    print("num_keys = " + ", ".join(f"{n:,} (dim {d})" for d, n in sizes) + "\n")
    if len(modes) == 1:
        print(f"CURVE {'on' if modes[0] else 'off'}\n")
        print("| op | batch | dim | mean latency, best repetition (µs) | its p99 (µs) | "
              "throughput (M keys/s) "
              "| MB/s (values) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for op, batch, dim, mean_us, p99_us, keys_per_s in rows[modes[0]]:
            print(f"| {op} | {batch:,} | {dim} | {mean_us:,.0f} | {_p99(p99_us)} | "
                  f"{keys_per_s / 1e6:.3f} | {keys_per_s * dim * 4 / 1e6:,.1f} |")
    else:
        # each figure from the repetition with the lowest mean (_latency)
        print("| op | batch | dim | mean µs, off | mean µs, CURVE | p99 µs, off | p99 µs, CURVE "
              "| MB/s (values), off | MB/s (values), CURVE | time CURVE / off |")
        print("(mean and p99 of the best repetition, by mean, of each)\n", file=sys.stderr)
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for off, on in zip(rows[False], rows[True]):
            op, batch, dim = off[:3]
            assert on[:3] == (op, batch, dim)
            print(f"| {op} | {batch:,} | {dim} | {off[3]:,.0f} | {on[3]:,.0f} | {_p99(off[4])} | "
                  f"{_p99(on[4])} | {off[5] * dim * 4 / 1e6:,.1f} | "
                  f"{on[5] * dim * 4 / 1e6:,.1f} | {on[3] / off[3]:.2f} |")
    print(f"\n(total bench time {time.perf_counter() - t0:.0f} s)")


def _p99(p99_us) -> str:
    return f"{p99_us:,.0f}" if p99_us is not None else "-"


if __name__ == "__main__":
    sys.exit(main())
