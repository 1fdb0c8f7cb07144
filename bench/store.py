"""Local store throughput: adapm's public pull/push on one node vs the equivalent numpy calls.

    python bench/store.py            # full run (< 2 minutes)
    python bench/store.py --quick    # smaller run (a few seconds)

One node without a launcher (world size 1), so every key is local and every call takes the
native path. For each value length the node and an equivalent ``(num_keys, dim)`` float32 numpy
array hold the same values; both sides then see the same random key batches (drawn with
replacement, so batches contain duplicates). Measurements of adapm and numpy alternate within one
run (this machine is shared and noisy), and each figure is the best (min) time of several
repetitions. The table reports million keys per second and the ratio adapm / peer (numpy, or torch).

Compared operations:

- ``pull out=``  ``w.pull(keys, out=buf)``   vs ``np.take(arr, keys, axis=0, out=buf2,
  mode="clip")`` (with its default mode="raise" numpy copies through a buffer, 1.2-2.2x slower:
  "clip", right for keys known to be in range, is the fastest numpy call)
- ``pull alloc`` ``w.pull(keys)``            vs ``np.take(arr, keys, axis=0)``
- ``push``       ``w.push(keys, updates)``   vs ``np.add.at(arr, keys, updates)`` (scatter-add:
  duplicates add up, same semantics; numpy's only such call, and a slow one)
- ``push vs torch``  ``w.push``              vs ``torch.index_add_`` on the same memory, one torch
  thread (the same semantics, and the fastest scatter-add a user has at hand; with torch)
- ``push vs fancy +=``  ``w.push``           vs ``arr[keys] += updates`` (NOT equivalent with
  duplicate keys: numpy keeps one update per key; only a reference for unique-key batches)

By default every call of a repetition gets its own batch (keys spread over the whole table, as
a training epoch sees them). The ``hot`` rows instead cycle 8 batches, so the touched rows stay in
cache and fixed per-call and per-key CPU costs dominate. Values and updates are multiples of
1/1024, so every sum is exact and the final state of adapm must equal numpy's bit for bit
(checked at the end of each dim).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

import adapm

try:  # the push's strongest peer, where torch is installed (adapm[torch])
    import torch

    torch.set_num_threads(1)  # as adapm's push: one thread per call
except ImportError:
    torch = None

# (dim, num_keys): the sizes, 64 MB and 100 MB of values.
SIZES = ((16, 1_000_000), (128, 200_000))
BATCHES = (1_000, 10_000, 100_000)
HOT_BATCHES = 8


def _time_once(fn, calls: int) -> float:
    """Seconds for ``calls`` calls of ``fn`` (one repetition)."""
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    return time.perf_counter() - t0


def _compare(pairs, reps: int):
    """Alternate the given (name, fn, calls) timings ``reps`` times; best seconds per name."""
    best = {name: float("inf") for name, _, _ in pairs}
    for _ in range(reps):
        for name, fn, calls in pairs:
            best[name] = min(best[name], _time_once(fn, calls))
    return best


def bench_dim(dim: int, num_keys: int, batches, reps: int, keys_per_rep: int, rng) -> list:
    rows = []
    # Multiples of 1/1024 of modest size: every sum below is exact in float32, so adapm and numpy
    # must agree bit for bit whatever order they add duplicates in (checked at the end).
    values = (rng.integers(-1000, 1000, (num_keys, dim)) / 1024).astype(np.float32)
    node = adapm.init(num_keys=num_keys, value_length=dim)
    try:
        w = node.worker()
        chunk = 100_000
        for lo in range(0, num_keys, chunk):
            hi = min(num_keys, lo + chunk)
            w.set(np.arange(lo, hi, dtype=np.int64), values[lo:hi])
        arr = values  # the numpy side (same values, already touched)
        fancy_arr = values.copy()  # target of the non-equivalent arr[k] += rows
        for batch in batches:
            # Every call of a repetition gets its own random batch (the same batches for adapm
            # and numpy, and in every repetition): keys_per_rep keys spread over the whole table,
            # not a few batches cycled in cache.
            calls = max(1, keys_per_rep // batch)
            banks = [rng.integers(0, num_keys, batch, dtype=np.int64) for _ in range(calls)]
            nupd = 2  # update rows are read sequentially; two arrays suffice
            upd = [(rng.integers(-4, 5, (batch, dim)) / 1024).astype(np.float32)
                   for _ in range(nupd)]
            buf = np.empty((batch, dim), np.float32)
            buf2 = np.empty((batch, dim), np.float32)

            # correctness first: same data, same answer
            w.pull(banks[0], out=buf)
            np.take(arr, banks[0], axis=0, out=buf2, mode="clip")
            assert np.array_equal(buf, buf2), "adapm pull differs from numpy.take"

            t = _compare([
                ("adapm", lambda i: w.pull(banks[i], out=buf), calls),
                ("numpy", lambda i: np.take(arr, banks[i], axis=0, out=buf2, mode="clip"), calls),
            ], reps)
            rows.append(("pull out= vs np.take(out=, mode='clip')", batch, dim, t["adapm"],
                         t["numpy"], calls))

            t = _compare([
                ("adapm", lambda i: w.pull(banks[i]), calls),
                ("numpy", lambda i: np.take(arr, banks[i], axis=0), calls),
            ], reps)
            rows.append(("pull (allocating) vs np.take", batch, dim, t["adapm"], t["numpy"], calls))

            t = _compare([
                ("adapm", lambda i: w.push(banks[i], upd[i % nupd]), calls),
                ("numpy", lambda i: np.add.at(arr, banks[i], upd[i % nupd]), calls),
            ], reps)
            rows.append(("push vs np.add.at", batch, dim, t["adapm"], t["numpy"], calls))

            if torch is not None:  # both sides push reps times: arr and adapm stay equal
                rows_t, banks_t = torch.from_numpy(arr), [torch.from_numpy(b) for b in banks]
                upd_t = [torch.from_numpy(u) for u in upd]
                t = _compare([
                    ("adapm", lambda i: w.push(banks[i], upd[i % nupd]), calls),
                    ("torch", lambda i: rows_t.index_add_(0, banks_t[i], upd_t[i % nupd]),
                     calls),
                ], reps)
                rows.append(("push vs torch index_add_ (1 thread)", batch, dim, t["adapm"],
                             t["torch"], calls))

            def fancy(i):
                fancy_arr[banks[i]] += upd[i % nupd]

            t = _compare([
                ("adapm", lambda i: w.push(banks[i], upd[i % nupd]), calls),
                ("numpy", fancy, calls),
            ], reps)
            rows.append(("push vs arr[k] += (equal only for unique keys)", batch, dim,
                         t["adapm"], t["numpy"], calls))
            # That row pushed to adapm but not to arr: catch arr up (untimed; sums are exact).
            for i in range(calls):
                np.add.at(arr, banks[i], upd[i % nupd] * np.float32(reps))

            # Cache-hot variant: the same few batches over and over, so the rows they touch stay
            # in cache and the per-call cost (validation, indirection through the directory,
            # the seqlock) shows instead of DRAM latency.
            hot = min(HOT_BATCHES, calls)
            t = _compare([
                ("adapm", lambda i: w.pull(banks[i % hot], out=buf), calls),
                ("numpy", lambda i: np.take(arr, banks[i % hot], axis=0, out=buf2,
                                            mode="clip"), calls),
            ], reps)
            rows.append((f"pull out= vs np.take(out=, mode='clip'), hot ({hot} batches cycled)",
                         batch, dim,
                         t["adapm"], t["numpy"], calls))
            t = _compare([
                ("adapm", lambda i: w.push(banks[i % hot], upd[i % nupd]), calls),
                ("numpy", lambda i: np.add.at(arr, banks[i % hot], upd[i % nupd]), calls),
            ], reps)
            rows.append((f"push vs np.add.at, hot ({hot} batches cycled)", batch, dim,
                         t["adapm"], t["numpy"], calls))

        everything = w.pull(np.arange(num_keys, dtype=np.int64))
        assert np.array_equal(everything, arr), "adapm push result differs from np.add.at"
    finally:
        node.shutdown()
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller data")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per figure (best kept)")
    opts = parser.parse_args(argv)
    reps = opts.reps or (3 if opts.quick else 9)
    keys_per_rep = 100_000 if opts.quick else 200_000
    sizes = SIZES if not opts.quick else ((16, 200_000), (128, 50_000))
    rng = np.random.default_rng(12345)

    t0 = time.perf_counter()
    rows = []
    for dim, num_keys in sizes:
        rows += bench_dim(dim, num_keys, BATCHES, reps, keys_per_rep, rng)

    print(f"machine: nproc={os.cpu_count()} (affinity {len(os.sched_getaffinity(0))}), "
          f"{platform.machine()}, python {platform.python_version()}, numpy {np.__version__}, "
          f"adapm {adapm.__version__}")
    print("keys drawn with replacement from num_keys = "
          + ", ".join(f"{n:,} (dim {d})" for d, n in sizes)
          + f"; best of {reps} repetitions, {keys_per_rep:,} keys per repetition\n")
    print("| op | batch | dim | adapm (M keys/s) | peer (M keys/s) | ratio adapm/peer |")
    print("|---|---:|---:|---:|---:|---:|")
    for op, batch, dim, ta, tn, calls in rows:
        n = batch * calls
        print(f"| {op} | {batch:,} | {dim} | {n / ta / 1e6:.1f} | {n / tn / 1e6:.1f} | "
              f"{ta and tn / ta:.2f} |")
    print(f"\n(total bench time {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
