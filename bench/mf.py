"""Matrix factorisation on adapm: every management variant against its single-node baseline.

    python bench/mf.py               # the table in docs/benchmarks.md: 200,000 x 50,000, ~9.9M train entries
    python bench/mf.py --quick       # 20,000 x 5,000, 1M entries, under a minute

One generated matrix (Zipf(0.8)-skewed row and column ids, a planted rank-10 matrix plus
Gaussian noise of standard deviation 0.1), rank 10, the same epochs for:

- ``--baseline --workers 2``: the same kernels over a plain shared array, no PM;
- adapm on 1 node x 2 threads, 2 nodes x 2 threads and 2 nodes x 1 thread (adaptive), the
  setups the original C++ AdaPM was measured on;
- 2 nodes x 1 thread under every other management variant.

Epoch time is ``train_seconds`` (first worker start to last worker end), RMSE the test RMSE after
each epoch, MB sent per node and epoch from ``stats()``, the remote share the keys pulled or
pushed remotely over all keys accessed in training (all nodes). Every figure comes from the
app's own JSON lines.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from app_runs import sh  # bench/ is the script's directory: on sys.path

PY = sys.executable
VARIANTS = ("adaptive", "static_partition", "full_replication", "replication_only",
            "relocation_only")


def summarise(name: str, setup: str, lines: list[dict]) -> dict:
    stats = [s for r in lines for s in r["stats"]]
    nodes = len(lines[0]["stats"])
    accessed = sum(s.get(k, 0) for s in stats for k in (
        "local_pull_keys", "waited_pull_keys", "remote_pull_keys", "local_push_keys",
        "remote_push_keys"))
    remote = sum(s.get("remote_pull_keys", 0) + s.get("remote_push_keys", 0) for s in stats)
    return {"name": name, "setup": setup,
            "epoch_s": sum(r["train_seconds"] for r in lines) / len(lines),
            "rmse": [r["rmse"] for r in lines],
            "mb_sent": sum(s.get("bytes_sent", 0) for s in stats) / nodes / len(lines) / 1e6,
            "remote": remote / accessed if accessed else 0.0,
            "process_cpu": sum(s.get("process_cpu_s", 0.0) for s in stats) / nodes / len(lines)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20,000 x 5,000 with 1M entries")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    opts = p.parse_args()
    rows, cols, entries = (20_000, 5_000, 1_000_000) if opts.quick else \
        (200_000, 50_000, 11_000_000)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    data = Path(tempfile.gettempdir()) / f"adapm-bench-mf-{rows}x{cols}-{entries}"
    if not (data / "test.mmc").exists():
        sh([PY, "-m", "adapm.apps.mf", "generate", str(data), "--rows", str(rows), "--cols",
            str(cols), "--entries", str(entries), "--seed", "1"], env)
    # The columnwise schedule: the one whose columns relocate from worker to worker, what this
    # benchmark of the management variants measures (the app's default, rows, replicates the
    # popular columns on every node instead; bench/quality.py compares the two schedules).
    app = [PY, "-m", "adapm.apps.mf", "--train", str(data / "train.mmc"), "--test",
           str(data / "test.mmc"), "--epochs", str(opts.epochs), "--progress", "off",
           "--json", "-", "--schedule", "columnwise"]
    launch = [PY, "-m", "adapm.launch", "-n", "2"]
    rows_out = [
        summarise("baseline (shared array)", "1 x 2", sh([*app, "--baseline", "--workers", "2"],
                                                         env)),
        summarise("adaptive", "1 x 2", sh([*app, "--workers", "2"], env)),
        summarise("adaptive", "2 x 2", sh([*launch, *app, "--workers", "2"], env)),
    ]
    for variant in opts.variants.split(","):
        rows_out.append(summarise(variant, "2 x 1",
                                  sh([*launch, *app, "--management", variant], env)))
    base = rows_out[0]
    print(f"\nmatrix: {data} ({rows:,} x {cols:,}, {entries:,} entries: 90% train, 10% test), "
          f"rank 10, {opts.epochs} epochs\n")
    print("| run | nodes x threads | epoch (s) | epoch / baseline's | test RMSE per epoch | "
          "MB sent/node/epoch | remote share | process CPU s/node/epoch |")
    print("|---|---|---:|---:|---|---:|---:|---:|")
    for r in rows_out:
        rmse = ", ".join(f"{x:.4f}" for x in r["rmse"])
        print(f"| {r['name']} | {r['setup']} | {r['epoch_s']:.2f} | "
              f"{r['epoch_s'] / base['epoch_s']:.2f}x | {rmse} | {r['mb_sent']:.1f} | "
              f"{100 * r['remote']:.4f}% | {r['process_cpu']:.2f} |")
    by = {(r["name"], r["setup"]): r for r in rows_out}
    if ("adaptive", "2 x 1") in by and ("replication_only", "2 x 1") in by:
        adaptive, replication = by[("adaptive", "2 x 1")], by[("replication_only", "2 x 1")]
        ratio = replication["mb_sent"] / adaptive["mb_sent"] if adaptive["mb_sent"] else 0.0
        print(f"\nreplication_only sends {ratio:.1f}x the bytes of adaptive (target >= 9x)")


if __name__ == "__main__":
    main()
