"""KGE training on adapm against its single-node baseline, every management variant, one run.

    python bench/kge.py              # the table in docs/benchmarks.md (about 20 minutes here)
    python bench/kge.py --quick      # a small KG, a minute or two

One generated KG (ComplEx d=100, 6 negatives per side, as the issue's benchmark), trained for
the same epochs by:

- the baseline: ``--baseline --workers 2``, one process, 2 threads over a plain shared array;
- 2 node processes x 1 worker thread under ``adapm-run``, for each management variant.

Both train the same data parts in the same order. The table shows the mean epoch time and its
ratio to the baseline's, triples/s, filtered MRR on the first ``--eval-max`` validation triples
after the last epoch, the training remote-access share (keys pulled or pushed remotely over all
keys accessed, all nodes), MB sent per node per epoch, and CPU seconds per node and epoch of
the worker threads and of the whole process (the difference is the PM's communication thread
and ZeroMQ), and each node's sync rounds per epoch with its engine thread's CPU per round.
Every figure comes from the apps' own JSON lines.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from app_runs import sh  # bench/ is the script's directory: on sys.path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
VARIANTS = ("adaptive", "static_partition", "full_replication", "replication_only",
            "relocation_only")


def summarise(name: str, lines: list[dict], nodes: int, threads: int) -> dict:
    seconds = [r["train_seconds"] for r in lines]
    points = sum(r["points_per_s"] * r["train_seconds"] for r in lines)
    stats = [s for r in lines for s in r["stats"]]
    accessed = sum(s.get(k, 0) for s in stats for k in (
        "local_pull_keys", "waited_pull_keys", "remote_pull_keys", "local_push_keys",
        "remote_push_keys"))
    remote = sum(s.get("remote_pull_keys", 0) + s.get("remote_push_keys", 0) for s in stats)
    sent = sum(s.get("bytes_sent", 0) for s in stats) / nodes / len(lines)
    per_node_epoch = nodes * len(lines)
    worker_cpu = sum(s.get("worker_cpu_s", 0.0) for s in stats) / per_node_epoch
    process_cpu = sum(s.get("process_cpu_s", 0.0) for s in stats) / per_node_epoch
    # Engine thread CPU per sync round (each node's own rounds; the baseline runs none).
    rounds = sum(s.get("rounds", 0) for s in stats)
    round_us = 1e6 * sum(s.get("engine_cpu_s", 0.0) for s in stats) / rounds if rounds else 0.0
    return {"name": name, "setup": f"{nodes} x {threads}", "epoch_s": sum(seconds) / len(seconds),
            "triples_s": points / sum(seconds), "mrr": lines[-1]["mrr"],
            "remote": remote / accessed if accessed else 0.0, "mb_sent": sent / 1e6,
            "worker_cpu": worker_cpu, "process_cpu": process_cpu, "round_us": round_us,
            "rounds": rounds / per_node_epoch}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small KG (60,000 triples)")
    p.add_argument("--triples", type=int, default=None, help="KG size (default 3,000,000: a baseline epoch of 20 s or more here)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--neg", type=int, default=6)
    p.add_argument("--eval-max", type=int, default=1000)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--data", default=None, help="KG directory (generated there if missing)")
    opts = p.parse_args()
    triples = opts.triples or (60_000 if opts.quick else 3_000_000)
    epochs = opts.epochs or 2
    data = Path(opts.data or Path(tempfile.gettempdir()) / f"adapm-bench-kge-{triples}")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    if not (data / "train.txt").exists():
        sh([PY, "-m", "adapm.apps.kge", "generate", str(data), "--triples", str(triples),
            "--seed", "1"], env)
    app = [PY, "-m", "adapm.apps.kge", "--data", str(data), "--dim", str(opts.dim), "--neg",
           str(opts.neg), "--epochs", str(epochs), "--eval-every", "0", "--eval-max",
           str(opts.eval_max), "--progress", "off", "--json", "-"]
    rows = [summarise("baseline (shared array)", sh([*app, "--baseline", "--workers", "2"], env),
                      1, 2)]
    for variant in opts.variants.split(","):
        lines = sh([PY, "-m", "adapm.launch", "-n", "2", *app, "--management", variant], env)
        rows.append(summarise(variant, lines, 2, 1))
    base = rows[0]
    print(f"\nKG: {data} ({triples:,} triples asked), ComplEx d={opts.dim}, {opts.neg} negatives "
          f"per side, {epochs} epochs, MRR on {opts.eval_max} validation triples\n")
    print("| run | nodes x threads | epoch (s) | epoch / baseline's | triples/s | MRR | "
          "remote share | MB sent/node/epoch | CPU s/node/epoch: workers, process | "
          "rounds/node/epoch | engine CPU/round (us) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        rounds = f"{r['rounds']:.0f} | {r['round_us']:.0f}" if r["rounds"] else "- | -"
        print(f"| {r['name']} | {r['setup']} | {r['epoch_s']:.2f} | "
              f"{r['epoch_s'] / base['epoch_s']:.2f}x | {r['triples_s']:,.0f} | {r['mrr']:.4f} | "
              f"{100 * r['remote']:.4f}% | {r['mb_sent']:.1f} | "
              f"{r['worker_cpu']:.1f}, {r['process_cpu']:.1f} | {rounds} |")


if __name__ == "__main__":
    main()
