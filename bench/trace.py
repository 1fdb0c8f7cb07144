"""What recording a parameter-placement trace costs a training run, one run.

    python bench/trace.py            # the figures in docs/benchmarks.md (about 5 minutes here)
    python bench/trace.py --quick    # a small KG, a minute

The KGE app (ComplEx, 2 nodes x 1 worker thread under adapm-run) trains one generated KG
three ways, in turns (``--repeat`` rounds, medians reported): without a trace (the default:
no sink is subscribed, so each event site costs one check of an empty list per batch), with
``--trace-keys 1000`` (a sample) and with ``--trace-keys all``. Columns: the mean epoch time
(from the app's JSON lines), its ratio to the run without a trace, the trace's size on disk and
its event rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from app_runs import sh  # bench/ is the script's directory: on sys.path

PY = sys.executable


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small KG (60,000 triples)")
    p.add_argument("--triples", type=int, default=None, help="KG size (default 600,000)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    opts = p.parse_args()
    triples = opts.triples or (60_000 if opts.quick else 600_000)
    work = Path(tempfile.gettempdir()) / f"adapm-bench-trace-{triples}"
    data = work / "kg"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    if not (data / "train.txt").exists():
        sh([PY, "-m", "adapm.apps.kge", "generate", str(data), "--triples", str(triples),
            "--seed", "1"], env)
    app = [PY, "-m", "adapm.launch", "-n", "2", PY, "-m", "adapm.apps.kge", "--data", str(data),
           "--dim", "64", "--epochs", str(opts.epochs), "--eval-every", "0", "--eval-max", "200",
           "--progress", "off", "--json", "-"]
    runs = {"no trace": None, "trace 1000 keys": "1000", "trace all keys": "all"}
    times: dict = {name: [] for name in runs}
    sizes: dict = {}
    for _ in range(opts.repeat):
        for name, keys in runs.items():
            trace = work / "trace"
            shutil.rmtree(trace, ignore_errors=True)
            flags = [] if keys is None else ["--trace-dir", str(trace), "--trace-keys", keys]
            lines = sh(app + flags, env)
            times[name].append(statistics.mean(r["train_seconds"] for r in lines))
            if keys is not None:
                sizes[name] = _size(trace)
    base = statistics.median(times["no trace"])
    print(f"\nKG: {data} ({triples:,} triples), ComplEx d=64, 2 nodes x 1 thread, "
          f"{opts.epochs} epochs, medians of {opts.repeat} rounds\n")
    print("| run | epoch (s) | vs no trace | trace size | event rows |")
    print("|---|---:|---:|---:|---:|")
    for name in runs:
        t = statistics.median(times[name])
        size, rows = sizes.get(name, (0, 0))
        print(f"| {name} | {t:.2f} | {t / base:.2f}x | "
              f"{size / 1e6:.1f} MB | {rows:,} |" if name in sizes else
              f"| {name} | {t:.2f} | 1.00x | - | - |")


def _size(directory: Path) -> tuple[int, int]:
    from adapm.trace import load

    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    return size, len(load(str(directory)).events)


if __name__ == "__main__":
    main()
