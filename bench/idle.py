"""CPU an idle node costs: a 2-node job that does nothing for a while, measured per process.

Three phases of ``--seconds`` each, CPU time of each node process (all its threads) over wall
time: right after init (no worker has done anything), after keys moved and replicas are held
(intents of both nodes on shared keys, then nothing: replicas still need version checks), and
after those intents ended (nothing held but the node's own keys). The engine runs no round when
nothing needs one, and rounds that change nothing space out (DESIGN section 4).

    python bench/idle.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from adapm.testing import run_cluster


def _phase(seconds: float) -> float:
    start_cpu, start = time.process_time(), time.monotonic()
    time.sleep(seconds)
    return (time.process_time() - start_cpu) / (time.monotonic() - start)


def _job(node, seconds: float) -> dict:
    w = node.worker()
    out = {"after init": _phase(seconds)}
    shared = np.arange(0, 1000, dtype=np.int64)  # both nodes: replicas of the other's half
    w.intent(shared, 0, 10)
    w.wait_sync()
    node.barrier()
    held = len(node.local_keys())
    out["replicas held"] = _phase(seconds)
    for _ in range(11):
        w.advance_clock()
    w.wait_sync()
    node.barrier()
    out["intents ended"] = _phase(seconds)
    out["rounds"] = node.stats()["rounds"]
    out["held"] = held
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    opts = parser.parse_args(argv)
    results = run_cluster(_job, world_size=2, args=(opts.seconds,), timeout_s=120 + 6 * opts.seconds,
                          config={"num_keys": 100_000, "value_length": 16})
    print("| phase | rank 0: CPU (% of a core) | rank 1 |")
    print("|---|---:|---:|")
    for phase in ("after init", "replicas held", "intents ended"):
        print(f"| {phase} | {100 * results[0][phase]:.2f}% | {100 * results[1][phase]:.2f}% |")
    print(f"\nkeys held during 'replicas held': {results[0]['held']:,} / {results[1]['held']:,}; "
          f"rounds over the whole run: {results[0]['rounds']} / {results[1]['rounds']}")


if __name__ == "__main__":
    main()
