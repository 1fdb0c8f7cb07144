"""The raw API at work: workers signal intent ahead, adapm moves keys to where they will be used.
(`make demo` trains knowledge-graph embeddings instead; this is the smallest complete job.)

    adapm-run -n 2 python examples/demo.py          # 2 nodes on this machine
    python examples/demo.py                          # a single node: everything is local

Every node runs 2 worker threads for 300 clocks. At each clock a worker pulls a batch of keys,
pushes +1 to each (float32 ones), and advances its clock. 90% of a node's keys come from its own
slice of the key space (as the rows of a matrix-factorisation shard), 10% from a small hot set
shared by all nodes. Each worker signals its intent 100 clocks ahead. At the end all nodes check
that every key holds exactly the number of pushes made to it, and print what adapm did: how many
accesses were remote, how many keys were relocated here or replicated here, and the traffic.
"""

import argparse
import threading

import numpy as np

import adapm

NUM_KEYS, DIM, BATCH, THREADS, HOT = 20_000, 16, 256, 2, 64


def access_plan(rank, world_size, thread, clocks):
    """The keys each clock of one worker touches (deterministic, so every node can count them)."""
    rng = np.random.default_rng(1000 * rank + thread)
    # This node's contiguous slice (the hot set excluded). Homes are k % world_size, so most of
    # the slice lives elsewhere at first: adapm relocates it here.
    span = (NUM_KEYS - HOT) // world_size
    own = np.arange(HOT + rank * span, HOT + (rank + 1) * span)
    plan = []
    for _ in range(clocks):
        local = rng.choice(own, int(BATCH * 0.9))
        hot = rng.integers(0, HOT, BATCH - len(local))
        plan.append(np.concatenate([local, hot]))
    return plan


def work(worker, plan, ahead):
    for clock in range(min(ahead, len(plan))):
        worker.intent(plan[clock], clock)
    worker.wait_sync()  # the first batch's keys are here before we start
    ones = np.ones((BATCH, DIM), np.float32)
    for clock, keys in enumerate(plan):
        if clock + ahead < len(plan):
            worker.intent(plan[clock + ahead], clock + ahead)
        worker.pull(keys)
        worker.push(keys, ones)
        worker.advance_clock()
    worker.wait_sync()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clocks", type=int, default=300)
    parser.add_argument("--ahead", type=int, default=100, help="signal intent this many clocks ahead")
    opts = parser.parse_args()
    with adapm.init(num_keys=NUM_KEYS, value_length=DIM) as node:
        plans = [access_plan(node.rank, node.world_size, t, opts.clocks) for t in range(THREADS)]
        workers = [node.worker() for _ in range(THREADS)]
        threads = [threading.Thread(target=work, args=(w, p, opts.ahead))
                   for w, p in zip(workers, plans)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        node.barrier()
        s = node.stats()  # before the check below, which reads every key from everywhere
        expected = np.zeros(NUM_KEYS)
        for rank in range(node.world_size):
            for t in range(THREADS):
                for keys in access_plan(rank, node.world_size, t, opts.clocks):
                    np.add.at(expected, keys, 1)
        values = workers[0].pull(np.arange(NUM_KEYS))
        exact = bool(np.all(values == expected[:, None]))
        print(f"rank {node.rank}/{node.world_size}: {2 * THREADS * opts.clocks} batches of "
              f"{BATCH} keys; sums exact on all {NUM_KEYS} keys: {exact}; remote accesses "
              f"{100 * s['remote_access_share']:.2f}%; relocated here {s['relocations_in']}, "
              f"replicas set up here {s['replica_setups']}; {s['rounds']} sync rounds "
              f"({s['mean_round_ms']:.2f} ms each); sent {s['bytes_sent'] / 1e6:.1f} MB",
              flush=True)
        if not exact:
            raise SystemExit(f"rank {node.rank}: wrong sums")


if __name__ == "__main__":
    main()
