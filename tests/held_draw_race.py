"""The local sampler's draw beside a held map that is copied and freed, for tests/test_sampling.py.

One node's store (rank 0 of 2, none of its home keys held) and directory; a thread plays the
engine's part: it inserts a batch of keys homed on the other node and removes them again, over
and over, with the GIL released (as the transport's receive call takes moves in), so the held
map sheds its tombstones by copying itself into a new table and freeing the old one. The main
thread meanwhile draws local samples (``Directory.draw_held``), which test each drawn key's state
in that map, and releases their pins. Exits 0 after ``seconds`` (argv[1]); a draw that read a
freed table ends the process with SIGSEGV. Prints how many draws and copies it made.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

import adapm
from adapm._engine.routing import home_keys
from adapm._engine.state import NodeState
from adapm._store import OWNER, Store

NUM_KEYS = 400_000
# Keys inserted a time: enough for the store's call to release the GIL (module.h,
# RELEASE_GIL_FROM) and for a copy of the map to take a while.
CHURN = 40_000


def main() -> int:
    seconds = float(sys.argv[1])
    config = adapm.Config(num_keys=NUM_KEYS, value_length=1, world_size=2, rank=0,
                          rendezvous="127.0.0.1:1", management="adaptive",
                          sampling=adapm.Sampling(0, NUM_KEYS))
    store = Store(config)
    node = NodeState(0, 2, store, config)
    theirs = home_keys(1, NUM_KEYS, 2)
    stop = threading.Event()
    copies = [0]

    def churn() -> None:
        rng = np.random.default_rng(1)
        while not stop.is_set():
            keys = np.unique(rng.choice(theirs, CHURN))
            store.insert(keys, OWNER)
            store.remove(keys)
            copies[0] += 1

    thread = threading.Thread(target=churn)
    thread.start()
    pool, bits = store.sample_pool, np.random.default_rng(0).bit_generator
    out, none = np.empty(4000, np.int64), np.empty(0, np.int64)
    draws = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            if node.directory.draw_held(bits, pool.keys, pool.counter, None, out, 5) == 0:
                node.directory.repin(out, none)
            draws += 1
    finally:
        stop.set()
        thread.join()
    print(f"draws {draws} copies {copies[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
