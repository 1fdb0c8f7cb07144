"""What `make demo` trained, how good it is against the baseline, and what its remote share
means: the demo's last lines, read from the two runs' JSON lines.

    python examples/explain_demo.py .demo/epochs.jsonl .demo/baseline.jsonl .demo/model

The first file is the adapm run's (2 nodes), the second the baseline's (the same kernels, data
order and threads in one process over a plain array, without the parameter manager), the
directory the adapm run exported its model to (for the number of entities).
"""

from __future__ import annotations

import json
import os
import sys


# The remote share the design aims at (at most).
_AIM = 1e-4


def _lines(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def remote_share(line: dict) -> float:
    """The epoch's remote share over all nodes: remote pulls and pushes over all accesses."""
    accessed = remote = 0
    for stats in line["stats"]:
        remote += stats["remote_pull_keys"] + stats["remote_push_keys"]
        accessed += sum(stats[k] for k in ("local_pull_keys", "waited_pull_keys",
                                           "remote_pull_keys", "local_push_keys",
                                           "remote_push_keys"))
    return remote / accessed if accessed else 0.0


def random_mrr(entities: int) -> float:
    """The expected MRR of a uniformly random ranking of ``entities`` candidates."""
    return sum(1.0 / r for r in range(1, entities + 1)) / entities


def explain(adapm_lines: list[dict], baseline_lines: list[dict], entities: int) -> str:
    """A few lines for a newcomer; both runs must have evaluated their last epoch."""
    run, base = adapm_lines[-1], baseline_lines[-1]
    nodes = len(run["stats"])
    seconds = sum(line["train_seconds"] for line in adapm_lines)
    base_seconds = sum(line["train_seconds"] for line in baseline_lines)
    shares = [remote_share(line) for line in adapm_lines]
    reads = sum(s["remote_pull_keys"] for line in adapm_lines for s in line["stats"])
    writes = sum(s["remote_push_keys"] for line in adapm_lines for s in line["stats"])
    ratio = run["mrr"] / base["mrr"] if base["mrr"] else float("nan")
    # The demo runs one worker per node: each node's share of the training time.
    waited = sum(s.get("access_wait_s", 0.0) for line in adapm_lines for s in line["stats"])
    deferred = sum(s.get("deferred_reports", 0) for line in adapm_lines for s in line["stats"])
    return "\n".join([
        f"What was trained: ComplEx knowledge-graph embeddings, {len(adapm_lines)} epochs on "
        f"{nodes} node processes, {seconds:.1f} s of training in all.",
        f"How good: filtered MRR {run['mrr']:.3f} and Hits@10 {run['hits@10']:.3f} on the "
        f"validation triples (the rank of the true entity among all {entities:,}; a random "
        f"ranking scores {random_mrr(entities):.4f}). The baseline, the same model on one "
        f"process without the parameter manager, reached MRR {base['mrr']:.3f} in {base_seconds:.1f} s of "
        f"training: adapm's MRR is {ratio:.2f}x that (runs differ by several percent), its "
        f"time {seconds / base_seconds:.1f}x (here both share this machine's cores, and "
        f"adapm's nodes also run their communication threads and talk over loopback).",
        f"Remote share {min(shares):.4%} to {max(shares):.4%} per epoch: the share of "
        f"parameter reads and writes that had to go to another node. Each node signalled "
        f"which keys it would use a few batches ahead, and adapm moved those keys (or kept "
        f"replicas) there in time, so nearly every access was local; the design aims at "
        f"almost none (0.01% or less)." + (
            f" This run is above that aim: {reads:,} reads and {writes:,} writes of single "
            f"keys went to another node in all, where the key left before its use or arrived "
            f"after it."
            if max(shares) > _AIM else ""),
        f"Waiting: the workers spent {waited:.2f} s in all ({waited / (nodes * seconds):.0%} "
        f"of their training time) waiting for keys that were still on their way, local in "
        f"the end, or, rarely, for values from another node. A key is late when the node "
        f"holding it still uses it (a key in that node's negative sample stays there until "
        f"the sample's push, so a request to move it waits for a later round: {deferred:,} "
        f"times in this run; a replica handed over at once instead cost model quality, "
        f"docs/quality.md), or when its intent reached a sync round late, which signalling "
        f"intent further ahead (`--ahead`) trades for keys moved earlier." if seconds else "",
    ])


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    with open(os.path.join(argv[2], "entities.tsv")) as f:
        entities = sum(1 for _ in f)
    print(explain(_lines(argv[0]), _lines(argv[1]), entities))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
