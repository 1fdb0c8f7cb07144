"""Every app's training remote share on 2 nodes x 1 worker, per epoch, from its JSON lines.

    python bench/remote_share.py              # every app once (about a minute here)
    python bench/remote_share.py --repeat 3   # three runs of each
    python bench/remote_share.py --apps demo,gnn

The issue's bar (issue 25): at most 0.01% of a training epoch's accesses remote, in every app
at 2 nodes. Each app runs with its defaults on generated data under ``adapm-run -n 2``:

- ``demo``: the job ``make demo`` runs (KGE, ComplEx d=32, 6 epochs, the 60k-triple KG);
- ``kge``: the KGE app's defaults (ComplEx d=100, 6 negatives per side), the same KG, 3 epochs;
- ``wv``: the word-vector app's defaults on a generated corpus of 50,000 sentences, 3 epochs;
- ``mf``: the MF app's defaults (the ``rows`` schedule) on 20,000 x 5,000 with 1M entries,
  3 epochs;
- ``ctr``: the Wide & Deep example (examples/ctr) on 100,000 generated rows, 2 epochs;
- ``gnn``: the GNN example (examples/gnn) on its 50,000-node graph, 10 epochs.

An epoch's remote share is remote pulled and pushed keys over all keys pulled and pushed in
its training (the KGE, WV and MF apps: all nodes' ``stats``; the examples: the ``remote_share``
they print, rank 0's for CTR, all nodes' for GNN). The table gives, per app, the runs and
epochs, the mean epoch's share, the worst epoch's, and how many epochs were over the bar;
for the apps also the worst epoch's share of keys that waited (for a sync round acting on a
late intent, or for a key on its way here: local in the end, not counted remote) and of the
workers' time blocked in pull and push, which is what those waits cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

from app_runs import sh  # bench/ is the script's directory: on sys.path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
LAUNCH = [PY, "-m", "adapm.launch", "-n", "2"]
BAR = 1e-4  # 0.01%
APPS = ("demo", "kge", "wv", "mf", "ctr", "gnn")
TMP = Path(tempfile.gettempdir())


def stats_share(line: dict) -> tuple:
    """An app's epoch (KGE, WV, MF), all nodes: (remote over all pulled and pushed keys, keys
    that waited for a round or for their arrival over the same, the share of the workers' time
    blocked in pull and push). A waited key is local in the end, so not in the first figure;
    what its wait cost is in the third."""
    accessed = remote = waited = 0
    blocked = 0.0
    for s in line["stats"]:
        remote += s["remote_pull_keys"] + s["remote_push_keys"]
        waited += s["waited_pull_keys"]
        blocked += s.get("access_wait_s", 0.0)
        accessed += sum(s[k] for k in ("local_pull_keys", "waited_pull_keys", "remote_pull_keys",
                                       "local_push_keys", "remote_push_keys"))
    seconds = line["train_seconds"] * len(line["stats"])
    return (remote / accessed if accessed else 0.0, waited / accessed if accessed else 0.0,
            blocked / seconds if seconds else 0.0)


def command(app: str, env: dict) -> tuple[list[str], Callable[[dict], float]]:
    """The app's 2-node command line (its data generated once, in the temp dir) and how to read
    an epoch's share from one of its JSON lines."""
    out = ["--progress", "off", "--json", "-"]
    if app in ("demo", "kge"):
        kg = TMP / "adapm-bench-kge-60000"  # bench/kge.py --quick's KG: make demo's recipe
        if not (kg / "train.txt").exists():
            sh([PY, "-m", "adapm.apps.kge", "generate", str(kg), "--triples", "60000", "--seed",
                "1"], env)
        model = ["--dim", "32", "--epochs", "6"] if app == "demo" else ["--epochs", "3"]
        return ([*LAUNCH, PY, "-m", "adapm.apps.kge", "--data", str(kg), *model,
                 "--eval-every", "0", "--eval-max", "1000", *out], stats_share)
    if app == "wv":
        data = TMP / "adapm-bench-scale-wv-50000"  # bench/scale.py's small corpus
        if not (data / "corpus.txt").exists():
            sh([PY, "-m", "adapm.apps.wv", "generate", str(data), "--sentences", "50000",
                "--families", "8", "--pairs", "100", "--seed", "1"], env)
        return ([*LAUNCH, PY, "-m", "adapm.apps.wv", "--corpus", str(data / "corpus.txt"),
                 "--epochs", "3", "--eval-every", "0", *out], stats_share)
    if app == "mf":
        data = TMP / "adapm-bench-scale-mf-20000-5000-1000000"  # bench/scale.py's small matrix
        if not (data / "test.mmc").exists():
            sh([PY, "-m", "adapm.apps.mf", "generate", str(data), "--rows", "20000", "--cols",
                "5000", "--entries", "1000000", "--seed", "1"], env)
        return ([*LAUNCH, PY, "-m", "adapm.apps.mf", "--train", str(data / "train.mmc"),
                 "--test", str(data / "test.mmc"), "--epochs", "3", *out], stats_share)
    if app == "ctr":
        data = TMP / "adapm-bench-ctr-100000-100000"  # bench/ctr.py --quick's data
        if not (data / "train.tsv").exists():
            sh([PY, str(REPO / "examples/ctr/criteo.py"), "generate", str(data), "--rows",
                "100000", "--vocab", "100000", "--seed", "1"], env)
        return ([*LAUNCH, PY, str(REPO / "examples/ctr/train.py"), "--data", str(data),
                 "--epochs", "2", *out], lambda line: (line["remote_share"], None, None))
    data = TMP / "adapm-bench-gnn-50000-8"  # the graph of tests/test_gnn_example.py
    if not (data / "graph.npz").exists():
        sh([PY, str(REPO / "examples/gnn/graph.py"), "generate", str(data), "--nodes", "50000",
            "--communities", "8", "--seed", "3"], env)
    return ([*LAUNCH, PY, str(REPO / "examples/gnn/train.py"), "--graph", str(data),
             "--epochs", "10", "--seed", "1", *out],
            lambda line: (line["remote_share"], None, None))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--apps", default=",".join(APPS), help=f"comma-separated, of {APPS}")
    p.add_argument("--repeat", type=int, default=1, help="runs of each app")
    opts = p.parse_args()
    apps = opts.apps.split(",")
    for app in apps:
        if app not in APPS:
            p.error(f"unknown app {app!r}; choose from {APPS}")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    rows = []
    for app in apps:
        cmd, share = command(app, env)
        shares = [share(line) for _ in range(opts.repeat) for line in sh(cmd, env)
                  if "epoch" in line]
        if not shares:
            sys.exit(f"{app}: no epoch's JSON line")
        rows.append((app, shares))
    print(f"\n2 nodes x 1 worker, each app's defaults, {opts.repeat} run(s) each; bar: "
          f"<= {100 * BAR:.2f}% of an epoch's accesses remote\n")
    print("| app | epochs (all runs) | mean epoch | worst epoch | epochs over the bar | waited "
          "keys, worst epoch | workers' time blocked, worst epoch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for app, figures in rows:
        shares = [f[0] for f in figures]
        over = sum(s > BAR for s in shares)
        waited = [f[1] for f in figures if f[1] is not None]
        blocked = [f[2] for f in figures if f[2] is not None]
        print(f"| {app} | {len(shares)} | {100 * sum(shares) / len(shares):.4f}% | "
              f"{100 * max(shares):.4f}% | {over} | "
              + (f"{100 * max(waited):.4f}%" if waited else "-") + " | "
              + (f"{100 * max(blocked):.1f}%" if blocked else "-") + " |")
    print("\nwaited keys: pulled keys that were on their way here, or whose intent a round had yet "
          "to act on, and were waited for: local in the end, so not remote, but the worker "
          "blocked (the examples print no such count: -)")


if __name__ == "__main__":
    main()
