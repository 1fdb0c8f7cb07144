"""The main demo job (for now): N nodes push and pull under static partitioning.

Run it with the launcher:  adapm-run -n 2 python examples/push_pull.py
or alone (a single node): python examples/push_pull.py

Every node pushes +1 (as float32) to every key from 2 worker threads, then all meet at a
barrier and every node checks that it reads exactly 2 * world_size for every key.
"""

import threading

import numpy as np

import adapm

NUM_KEYS, DIM, THREADS = 10_000, 16, 2


def work(worker, keys):
    for batch in np.array_split(keys, 10):
        worker.push(batch, np.ones((len(batch), DIM), np.float32))
    worker.wait()


def main():
    with adapm.init(num_keys=NUM_KEYS, value_length=DIM) as node:
        workers = [node.worker() for _ in range(THREADS)]
        rng = np.random.default_rng(node.rank)
        keys = rng.permutation(NUM_KEYS)
        threads = [threading.Thread(target=work, args=(w, keys)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        node.barrier()
        values = workers[0].pull(np.arange(NUM_KEYS))
        expected = THREADS * node.world_size
        ok = bool(np.all(values == expected))
        s = node.stats()
        print(f"rank {node.rank}/{node.world_size}: pushed {THREADS}x{NUM_KEYS} keys, pulled "
              f"{NUM_KEYS}; every value == {expected}: {ok}; remote share "
              f"{s['remote_access_share']:.2f}; sent {s['messages_sent']} messages, "
              f"{s['bytes_sent'] / 1e6:.2f} MB", flush=True)
        if not ok:
            raise SystemExit(f"rank {node.rank}: wrong sums")


if __name__ == "__main__":
    main()
