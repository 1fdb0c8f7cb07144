"""The apps on N workers: adapm on N nodes x 1, N/2 x 2 and 2 x N/2 against the baseline 1 x N.

    python bench/scale.py                               # N = 2, small data: a few minutes here
    python bench/scale.py --workers 8 --size full       # a 16-core machine: the issue's data
    python bench/scale.py --workers 8 --size full --apps kge,wv --setups 2x4 --channels 1,2,4

For each app (KGE, WV, MF; ``--apps``) one generated data set, the same epochs and settings for:

- the baseline: ``--baseline --workers N``, one process, N threads over a plain shared array;
- adapm with the default management (adaptive) on ``n`` node processes x ``N/n`` worker threads
  under ``adapm-run``, for n = N, N/2 and 2 (each setup once; ``--setups`` picks some), with
  each number of engine channels per node of ``--channels`` (``Config.channels``, through
  ``ADAPM_CHANNELS``; default 1).

Per run the table shows the mean epoch time and its ratio to the baseline's (>= 1 is faster),
the app's quality after the last epoch (KGE: filtered MRR on ``--eval-max`` validation triples;
WV: analogy accuracy; MF: test RMSE), the training remote share (keys pulled or pushed remotely
over all keys accessed, all nodes), and per node and epoch: the engine thread's CPU seconds and
its share of the epoch (``engine busy``: 100% means the engine thread never idles; with
channels their threads' CPU adds up, so K channels can reach K x 100%), the engine CPU of all
nodes per worker clock (a batch of one worker: what the engine costs per unit of training,
which predicts a larger machine's engine load from a small one's), MB sent, the worker
threads' CPU seconds and the process's (the rest of it is ZeroMQ's I/O thread, and the main
thread's evaluation between epochs is not in it). Every figure comes from the apps' own
JSON lines.

``full`` is the data of the engine issue's 16-core table: KGE 1M triples asked (990k train),
ComplEx d=100, 6 negatives per side; WV a 6M-word generated corpus, d=100; MF 200,000 x 50,000
with 11M entries (9.9M train), rank 10, the columnwise schedule. ``small`` is about a tenth.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from app_runs import sh  # bench/ is the script's directory: on sys.path

PY = sys.executable
SIZES = {  # app -> size -> its generator's size arguments
    "kge": {"small": ["--triples", "100000"], "full": ["--triples", "1000000"]},
    "wv": {"small": ["--sentences", "50000"], "full": ["--sentences", "500000"]},
    "mf": {"small": ["--rows", "20000", "--cols", "5000", "--entries", "1000000"],
           "full": ["--rows", "200000", "--cols", "50000", "--entries", "11000000"]},
}
BATCH = {"kge": 100, "wv": 64, "mf": 1000}  # data points per batch, a clock (the apps' defaults)


def data_and_command(app: str, size: str, epochs: int, eval_max: int, env: dict) -> list[str]:
    """Generates the app's data once (in the temp dir) and returns its command line, less the
    setup (baseline or nodes x workers)."""
    args = SIZES[app][size]
    data = Path(tempfile.gettempdir()) / f"adapm-bench-scale-{app}-{'-'.join(args[1::2])}"
    common = ["--epochs", str(epochs), "--batch-size", str(BATCH[app]), "--progress", "off",
              "--json", "-"]
    if app == "kge":
        if not (data / "train.txt").exists():
            sh([PY, "-m", "adapm.apps.kge", "generate", str(data), *args, "--seed", "1"], env)
        return [PY, "-m", "adapm.apps.kge", "--data", str(data), "--dim", "100", "--neg", "6",
                "--eval-every", "0", "--eval-max", str(eval_max), *common]
    if app == "wv":
        if not (data / "corpus.txt").exists():
            sh([PY, "-m", "adapm.apps.wv", "generate", str(data), *args, "--families", "8",
                "--pairs", "100", "--seed", "1"], env)
        return [PY, "-m", "adapm.apps.wv", "--corpus", str(data / "corpus.txt"), "--analogies",
                str(data / "questions-words.txt"), "--dim", "100", "--eval-every", "0",
                "--seed", "1", *common]
    if not (data / "test.mmc").exists():
        sh([PY, "-m", "adapm.apps.mf", "generate", str(data), *args, "--seed", "1"], env)
    return [PY, "-m", "adapm.apps.mf", "--train", str(data / "train.mmc"), "--test",
            str(data / "test.mmc"), "--schedule", "columnwise", *common]


QUALITY = {"kge": ("MRR", "mrr"), "wv": ("analogy", "analogy"), "mf": ("RMSE", "rmse")}


def summarise(app: str, setup: str, lines: list[dict]) -> dict:
    stats = [s for r in lines for s in r["stats"]]
    nodes = len(lines[0]["stats"])
    per_node_epoch = nodes * len(lines)
    accessed = sum(s.get(k, 0) for s in stats for k in (
        "local_pull_keys", "waited_pull_keys", "remote_pull_keys", "local_push_keys",
        "remote_push_keys"))
    remote = sum(s.get("remote_pull_keys", 0) + s.get("remote_push_keys", 0) for s in stats)
    epoch_s = sum(r["train_seconds"] for r in lines) / len(lines)
    engine = sum(s.get("engine_cpu_s", 0.0) for s in stats) / per_node_epoch
    # Worker clocks of an epoch, all workers: the points it trained over the batch size (a
    # worker's last batch may be short: at most one clock per worker undercounted).
    clocks = sum(r["points_per_s"] * r["train_seconds"] for r in lines) / len(lines) / BATCH[app]
    return {"app": app, "setup": setup, "epoch_s": epoch_s,
            "engine_per_clock_us": 1e6 * engine * nodes / clocks if clocks else 0.0,
            "quality": lines[-1].get(QUALITY[app][1]),
            "remote": remote / accessed if accessed else 0.0,
            "engine_s": engine, "engine_busy": engine / epoch_s if nodes > 1 else None,
            "mb_sent": sum(s.get("bytes_sent", 0) for s in stats) / per_node_epoch / 1e6,
            "worker_cpu": sum(s.get("worker_cpu_s", 0.0) for s in stats) / per_node_epoch,
            "process_cpu": sum(s.get("process_cpu_s", 0.0) for s in stats) / per_node_epoch}


def setups(workers: int) -> list[tuple[int, int]]:
    """(nodes, threads per node) with nodes x threads = workers: N x 1, N/2 x 2, 2 x N/2."""
    out = []
    for nodes in (workers, workers // 2, 2):
        if nodes >= 2 and workers % nodes == 0 and (nodes, workers // nodes) not in out:
            out.append((nodes, workers // nodes))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="N: worker threads in all (even)")
    p.add_argument("--size", choices=("small", "full"), default="small")
    p.add_argument("--apps", default="kge,wv,mf")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--eval-max", type=int, default=500)
    p.add_argument("--setups", default=None,
                   help="only these adapm setups, as NODESxTHREADS separated by commas (2x4)")
    p.add_argument("--channels", default="1",
                   help="engine channels per node (Config.channels) to run each setup with, "
                        "separated by commas")
    p.add_argument("--prepare", action="store_true",
                   help="only generate the data sets that are missing, then exit")
    opts = p.parse_args()
    if opts.workers < 2 or opts.workers % 2:
        p.error("--workers must be an even number >= 2")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    try:
        channels = [int(c) for c in opts.channels.split(",")]
        chosen = None if opts.setups is None else \
            [tuple(int(x) for x in s.split("x")) for s in opts.setups.split(",")]
    except ValueError:
        p.error("--channels: integers separated by commas; --setups: NODESxTHREADS, ...")
    rows = []
    for app in opts.apps.split(","):
        if app not in SIZES:
            p.error(f"--apps: unknown app {app!r} (kge, wv, mf)")
        cmd = data_and_command(app, opts.size, opts.epochs, opts.eval_max, env)
        if opts.prepare:
            continue
        rows.append(summarise(app, f"baseline 1 x {opts.workers}", sh(
            [*cmd, "--baseline", "--workers", str(opts.workers)], env)))
        for nodes, threads in setups(opts.workers):
            if chosen is not None and (nodes, threads) not in chosen:
                continue
            for k in channels:
                label = f"adapm {nodes} x {threads}" + (f", {k} channels" if k > 1 else "")
                rows.append(summarise(app, label, sh(
                    [PY, "-m", "adapm.launch", "-n", str(nodes), *cmd, "--workers", str(threads)],
                    # unset for 1, the default: older trees, which know no channels, run too
                    {**env, **({"ADAPM_CHANNELS": str(k)} if k > 1 else {})})))
    if opts.prepare:
        return
    print(f"\n{opts.workers} workers in all, {opts.size} data, {opts.epochs} epochs, "
          f"{os.cpu_count()} cores\n")
    print("| app | setup | epoch (s) | vs baseline | quality | remote share | "
          "engine CPU s/node/epoch | engine busy | engine CPU us/worker-clock | "
          "MB sent/node/epoch | worker CPU s/node/epoch | process CPU s/node/epoch |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    for r in rows:
        if r["setup"].startswith("baseline"):
            base = r
        name, _ = QUALITY[r["app"]]
        quality = "-" if r["quality"] is None else f"{name} {r['quality']:.4f}"
        busy = "-" if r["engine_busy"] is None else f"{100 * r['engine_busy']:.0f}%"
        per_clock = "-" if r["engine_busy"] is None else f"{r['engine_per_clock_us']:.0f}"
        print(f"| {r['app']} | {r['setup']} | {r['epoch_s']:.2f} | "
              f"{base['epoch_s'] / r['epoch_s']:.2f}x | {quality} | {100 * r['remote']:.4f}% | "
              f"{r['engine_s']:.2f} | {busy} | {per_clock} | "
              f"{r['mb_sent']:.1f} | {r['worker_cpu']:.2f} | "
              f"{r['process_cpu']:.2f} |")


if __name__ == "__main__":
    main()
