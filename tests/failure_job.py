"""One rank of a training-like job for tests/test_failures.py, started by a launcher or by hand.

Every rank signals intent, pushes, pulls and syncs in a loop until it has done ``steps`` steps
(or forever, with 0). It prints JSON lines: ``{"ready": ...}`` with its pid once all ranks met,
and at the end ``{"done": ...}`` or ``{"error": ...}`` (with the failed rank and when the error
came) before exiting 0, or 3 after an AdaPMError.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import adapm

NUM_KEYS, DIM = 600, 4


def emit(record: dict) -> None:
    os.write(1, (json.dumps(record) + "\n").encode())  # one write: ranks never interleave


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    node = adapm.init(num_keys=NUM_KEYS, value_length=DIM)
    rank = node.rank
    try:
        w = node.worker()
        rng = np.random.default_rng(rank)
        node.barrier()
        emit({"ready": rank, "pid": os.getpid(), "world_size": node.world_size})
        step = 0
        while steps == 0 or step < steps:
            keys = rng.choice(NUM_KEYS, 32, replace=False)
            w.intent(keys, w.clock + 1, w.clock + 3)
            w.push(keys, np.ones((len(keys), DIM), np.float32))
            w.pull(rng.choice(NUM_KEYS, 32))
            w.advance_clock()
            if step % 10 == 9:
                w.wait_sync()
            step += 1
        node.shutdown()
        emit({"done": rank})
        return 0
    except adapm.AdaPMError as exc:
        emit({"error": type(exc).__name__, "rank": rank, "at": time.time(),
              "failed_rank": getattr(exc, "rank", None), "message": str(exc)[:2000]})
        try:
            node.shutdown()  # must come back at once: the failure is known, nobody is waited for
        except adapm.AdaPMError:
            pass
        emit({"closed": rank, "at": time.time()})
        return 3


if __name__ == "__main__":
    sys.exit(main())
