"""What authentication (ZeroMQ CURVE) costs a training job on one machine: the KGE app on 2
nodes under adapm-run, CURVE off and on, alternating, in one run.

    python bench/auth.py             # the figure in the README and docs/failures.md (a few minutes)
    python bench/auth.py --quick     # fewer, shorter runs

adapm-run leaves authentication off when every rank is on loopback (the job token in each
connection's identity keeps local strangers from speaking for a rank; docs/security.md). This
measures what switching it on (``ADAPM_AUTH=1``) would cost such a job: the mean training time
per epoch of each mode over its runs (``train_seconds`` of the app's JSON lines), and their
ratio. Runs alternate (off, on, off, on, ...) so that a change in the machine's load falls on
both modes alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from app_runs import sh  # bench/ is the script's directory: on sys.path

PY = sys.executable


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 runs of 2 epochs per mode")
    p.add_argument("--triples", type=int, default=60_000, help="KG size (the demo's)")
    p.add_argument("--dim", type=int, default=32)
    opts = p.parse_args(argv)
    runs, epochs = (2, 2) if opts.quick else (4, 3)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        data = str(Path(tmp) / "kg")
        sh([PY, "-m", "adapm.apps.kge", "generate", data, "--triples", str(opts.triples),
            "--seed", "1"], env)
        seconds = {"off": [], "on": []}
        for _ in range(runs):
            for mode in ("off", "on"):
                lines = sh([PY, "-m", "adapm.launch", "-n", "2", PY, "-m", "adapm.apps.kge",
                            "--data", data, "--dim", str(opts.dim), "--epochs", str(epochs),
                            "--eval-every", str(epochs + 1), "--progress", "off",
                            "--json", "-"],
                           {**env, "ADAPM_AUTH": "1" if mode == "on" else "0"})
                seconds[mode].append(statistics.mean(r["train_seconds"] for r in lines))
    off, on = statistics.mean(seconds["off"]), statistics.mean(seconds["on"])
    print(f"machine: nproc={os.cpu_count()}, {platform.machine()}, python "
          f"{platform.python_version()}; KGE {opts.triples} triples, ComplEx d={opts.dim}, "
          f"2 nodes x 1 under adapm-run, {runs} runs of {epochs} epochs per mode")
    print("| CURVE | epoch s (mean of runs) | runs | ratio |")
    print("|---|---:|---|---:|")
    print(f"| off | {off:.3f} | {', '.join(f'{s:.3f}' for s in seconds['off'])} | 1.00 |")
    print(f"| on | {on:.3f} | {', '.join(f'{s:.3f}' for s in seconds['on'])} | "
          f"{on / off:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
