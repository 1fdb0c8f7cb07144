"""A large key space on few nodes: init time, memory per node, and the adaptive workload over it.

    python bench/keyspace.py                          # 10^8 keys x 8 floats on 2 nodes, 10,000 clocks
    python bench/keyspace.py --num-keys 10000000      # a quicker look

Per node it reports
- ready (s): from the process's start (Python's own start-up included) to a node that has met
  its peers: store, directory and engine state for every key, home keys inserted;
- dense (B/key): bytes of this node's per-key arrays (the store's word per home key, the home
  table's owner per home key), divided by the number of keys;
- records, B/record: the records of keys held or active at the end, in the store's held map
  (keys held beyond the home keys' owner copies: row, version, sync time; native/held.h), the
  native directory (hints, forward pointers, epochs, the owner's masks; native/records.h) and
  the intent counts (native/intents.h), and their bytes (maps and spare capacity included) per
  record;
- RSS ready / RSS end (GB): resident memory after the first barrier, and after the workload
  (values included: 32 B per key of 8 floats for the keys held here, committed as written);
- the workload: ``--clocks`` clocks of ``--batch`` keys per worker, 90% from the node's own
  partition and 10% from a shared region (10% of the keys), Zipf 1.1 over key ids in both (the
  structure of bench/adaptive.py, drawn with numpy's zipf instead of an exact finite CDF, which
  would take 0.4 GB per process at this size); intent ``--ahead`` clocks early; throughput in
  keys/s and the remote share.

Correctness: afterwards rank 0 pulls every key that was accessed and checks that it equals its
access count (every access pushes 1 to every float).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from adapm.testing import run_cluster
from adaptive import access_counts  # bench/adaptive.py, next to this script


def sequence(o: dict, nodes: int, node: int) -> np.ndarray:
    """Keys of every batch of node ``node``'s worker: int64 (clocks, batch)."""
    shared = max(1, o["num_keys"] // 10)
    part = (o["num_keys"] - shared) // nodes
    rng = np.random.default_rng([o["seed"], nodes, node])
    shape = (o["clocks"], o["batch"])
    own = (rng.zipf(1.1, shape) - 1) % part
    hot = (rng.zipf(1.1, shape) - 1) % shared
    local = rng.random(shape) < 0.9
    return np.where(local, shared + node * part + own, hot).astype(np.int64)


def _process_age_s() -> float:
    """Seconds since this process started (Linux /proc)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1e6
    return float("nan")


def _metadata_bytes(node) -> tuple[int, int, int]:
    """(bytes over the whole key space, records of active keys, their bytes)."""
    # The store: a word per home key (dense) and the held map of keys beyond those (records).
    held, store_bytes = node.store.memory()
    home_words = node.store.home.nbytes
    records, record_bytes = held, store_bytes - home_words
    if node.engine is not None:
        memory = node.engine.state.memory()
        directory_records, directory_bytes = memory["directory"]
        home_table = 4 * len(range(node.rank, node.store.num_keys, node.world_size))
        dense = home_table
        records += directory_records
        record_bytes += directory_bytes - home_table
        counted, count_bytes = memory["intent_counts"]  # records of keys with intent
        records += counted
        record_bytes += count_bytes
    else:
        dense = 0
    return home_words + dense, records, record_bytes


def _job(node, o: dict) -> dict:
    node.barrier()
    ready_s, rss_ready = _process_age_s(), _rss_gb()
    seq = sequence(o, node.world_size, node.rank)
    w = node.worker()
    vals = np.empty((o["batch"], o["value_length"]), dtype=np.float32)
    ones = np.ones_like(vals)
    ahead, clocks = o["ahead"], o["clocks"]
    for t in range(min(ahead, clocks)):
        w.intent(seq[t], t, t + 1)
    w.wait_sync()
    node.barrier()
    start = time.perf_counter()
    for t in range(clocks):
        if t + ahead < clocks:
            w.intent(seq[t + ahead], t + ahead, t + ahead + 1)
        w.pull(seq[t], out=vals)
        w.push(seq[t], ones)
        w.advance_clock()
    w.wait()
    elapsed = time.perf_counter() - start
    stats = node.stats()
    w.wait_sync()
    node.barrier()
    bad = None
    if node.rank == 0:  # every accessed key equals its access count
        keys, counts = np.unique(np.concatenate(
            [sequence(o, node.world_size, r).reshape(-1) for r in range(node.world_size)]),
            return_counts=True)
        got = w.pull(keys)
        wrong = np.flatnonzero(np.any(got != counts[:, None].astype(np.float32), axis=1))
        bad = int(len(wrong))
    node.barrier()
    return {"ready_s": ready_s, "rss_ready": rss_ready, "rss_end": _rss_gb(),
            "metadata": _metadata_bytes(node), "elapsed": elapsed, "keys": clocks * o["batch"],
            "stats": stats, "wrong": bad}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--num-keys", type=int, default=100_000_000)
    parser.add_argument("--value-length", type=int, default=8)
    parser.add_argument("--clocks", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--ahead", type=int, default=100)
    parser.add_argument("--management", default="adaptive")
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args(argv)
    o = {"num_keys": opts.num_keys, "value_length": opts.value_length, "clocks": opts.clocks,
         "batch": opts.batch, "ahead": opts.ahead, "seed": opts.seed}
    t0 = time.perf_counter()
    results = run_cluster(_job, world_size=opts.nodes, args=(o,), timeout_s=1800,
                          config={"num_keys": opts.num_keys, "value_length": opts.value_length,
                                  "management": opts.management})
    wall = time.perf_counter() - t0
    if results[0]["wrong"]:
        raise SystemExit(f"WRONG VALUES: {results[0]['wrong']} accessed keys differ from their "
                         "access counts")
    keys = sum(r["keys"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    st = [r["stats"] for r in results]
    accessed, remote = access_counts(st)
    print(f"{opts.num_keys:,} keys x {opts.value_length} floats on {opts.nodes} nodes "
          f"({opts.management}); {opts.clocks} clocks x {opts.batch} keys per node, intent "
          f"{opts.ahead} clocks ahead; machine: nproc={os.cpu_count()}, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB")
    print("\n| rank | ready (s) | dense (B/key) | records | B/record | RSS ready (GB) | "
          "RSS end (GB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rank, r in enumerate(results):
        dense, records, record_bytes = r["metadata"]
        print(f"| {rank} | {r['ready_s']:.1f} | {dense / opts.num_keys:.1f} | {records:,} | "
              f"{record_bytes / max(records, 1):.0f} | {r['rss_ready']:.2f} | "
              f"{r['rss_end']:.2f} |")
    print(f"\nworkload: {keys / elapsed:,.0f} keys/s over all nodes, remote share "
          f"{remote / accessed:.4%}, relocations {sum(s['relocations_in'] for s in st):,}, "
          f"replica set-ups {sum(s['replica_setups'] for s in st):,}; every accessed key "
          f"verified; whole bench {wall:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
