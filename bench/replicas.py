"""What replicas cost a node's store: a worker's gather and scatter-add of a batch whose keys are
owned here or replicas, and the engine's refresh of replicas from their owner's answer.

    python bench/replicas.py            # about 20 s
    python bench/replicas.py --quick    # a few seconds

One node's store as a 2-node job lays it out (rank 0 of 2: its home keys owned, the other
half held as the case says), no engine and no network: the native calls a worker's batch and an
engine's answer make (``Store.gather``, ``Store.scatter_add``, ``Store.refresh``), timed alone.
A replica's update is added to its row and to its delta row (what the next round sends its
owner), so its scatter writes twice what an owned key's does; a refresh writes the owner's value
plus the updates made since the delta was taken. Batches are random keys of the whole table
(60,000 keys of 400 floats: 96 MB, KGE's ComplEx d=100 rows with AdaGrad's sums), so most rows
miss the cache, as in training. Each figure is the best of several repetitions, in us per call
and ns per row.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

import adapm
from adapm._engine.routing import home_keys
from adapm._store import OWNER, REPLICA, Store

NUM_KEYS, LENGTH = 60_000, 400
BATCH = 1_450  # a KGE batch's rows: 100 triples, 6 negatives a side (~3 + 12 rows a triple)


def _store(other) -> Store:
    """Rank 0 of 2: home keys owned; the other rank's home keys held as ``other`` (None: not
    held; OWNER: relocated here; REPLICA)."""
    config = adapm.Config(num_keys=NUM_KEYS, value_length=LENGTH, world_size=2, rank=0,
                          rendezvous="127.0.0.1:1")
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 2), OWNER)
    if other is not None:
        theirs = home_keys(1, NUM_KEYS, 2)
        store.insert(theirs, other, np.zeros((len(theirs), LENGTH), np.float32))
    return store


def _best(fn, batches, reps: int) -> float:
    """Best seconds per call of ``fn(batch)`` over ``reps`` passes over ``batches``."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for batch in batches:
            fn(batch)
        best = min(best, (time.perf_counter() - start) / len(batches))
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and repetitions")
    opts = parser.parse_args(argv)
    nbatches, reps = (16, 3) if opts.quick else (64, 7)
    rng = np.random.default_rng(0)
    print(f"machine: nproc={len(os.sched_getaffinity(0))}, {platform.machine()}, "
          f"python {platform.python_version()}, numpy {np.__version__}; {NUM_KEYS:,} keys x "
          f"{LENGTH} floats, rank 0 of 2")
    print(f"batches of {BATCH:,} keys drawn from the keys named; us per call (ns per row)")
    print("| batch's keys | gather | scatter-add |")
    print("|---|---:|---:|")
    cases = (("owned at home (a single node's layout)", None, home_keys(0, NUM_KEYS, 2)),
             ("half owned at home, half relocated here", OWNER, np.arange(NUM_KEYS)),
             ("half owned at home, half replicas", REPLICA, np.arange(NUM_KEYS)),
             ("replicas", REPLICA, home_keys(1, NUM_KEYS, 2)))
    refresh = None
    for name, other, domain in cases:
        store = _store(other)
        batches = [rng.choice(domain, BATCH, replace=False).astype(np.int64)
                   for _ in range(nbatches)]
        out = np.empty((BATCH, LENGTH), np.float32)
        update = np.full((BATCH, LENGTH), 1 / 1024, np.float32)
        missing = np.empty(BATCH, np.int64)
        if store.gather(batches[0], out, missing):
            raise SystemExit(f"{name}: a key of the batch is not held")
        gather = _best(lambda b: store.gather(b, out, missing), batches, reps)
        scatter = _best(lambda b: store.scatter_add(b, update, missing), batches, reps)
        print(f"| {name} | {1e6 * gather:.0f} ({1e9 * gather / BATCH:.0f}) | "
              f"{1e6 * scatter:.0f} ({1e9 * scatter / BATCH:.0f}) |")
        if other is REPLICA and len(domain) < NUM_KEYS:
            versions = np.zeros(BATCH, np.int64)
            # Every replica has updates since its delta was taken (the scatter above).
            refresh = _best(lambda b: store.refresh(b, update, versions), batches, reps)
    if refresh is not None:
        print(f"\nrefresh of {BATCH:,} replicas from their owner's answer: {1e6 * refresh:.0f} us "
              f"({1e9 * refresh / BATCH:.0f} ns per row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
