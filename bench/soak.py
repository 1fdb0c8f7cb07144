"""A soak run: the apps on several nodes, over and over, until one fails or the time is up.

    python bench/soak.py --minutes 30                    # every configuration, in turn
    python bench/soak.py --minutes 60 --configs kge2,kge4 --out /tmp/soak

Rare failures (a race that kills a node once in a few hundred runs) do not show in the test
suite's single runs. This runs each configuration below under ``adapm-run`` on small generated
data, a new seed each time, with Python's fault handler on (a native crash prints every
thread's stack), and counts a run as failed when it exits non-zero, runs past ``--timeout``
(a hang) or prints fewer epoch lines than asked. A failed run's output is kept in ``--out``.
The configurations cover the apps (KGE, WV, MF), 2 to 4 nodes, two worker threads per node,
two engine channels, the managements and options whose paths differ (replication only,
``local`` sampling of WV, averaged replica updates, MF's columnwise schedule), and the two
PyTorch examples (CTR with forked DataLoader workers, GNN).

It prints a line per failure as it happens and a table at the end; exit status 1 if any run
failed. Timing is not measured: the machine is meant to be busy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

PY = sys.executable
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def datasets(root: Path) -> dict[str, list[str]]:
    """Generates the small data sets once (in ``root``); each program's command and data
    arguments (the GNN example generates its graph itself)."""
    kge, wv, mf, ctr = (root / "kge-20000", root / "wv-50000", root / "mf-20000x5000",
                        root / "ctr-20000")
    generate = [
        (kge / "train.txt", ["-m", "adapm.apps.kge", "generate", str(kge), "--triples", "20000"]),
        (wv / "corpus.txt", ["-m", "adapm.apps.wv", "generate", str(wv), "--sentences",
                             "50000"]),
        (mf / "test.mmc", ["-m", "adapm.apps.mf", "generate", str(mf), "--rows", "20000",
                           "--cols", "5000", "--entries", "1000000"]),
        (ctr / "test.tsv", [str(EXAMPLES / "ctr" / "criteo.py"), "generate", str(ctr),
                            "--rows", "20000"]),
    ]
    for marker, cmd in generate:
        if not marker.exists():
            subprocess.run([PY, *cmd, "--seed", "1"], check=True, capture_output=True)
    return {"kge": ["-m", "adapm.apps.kge", "--data", str(kge), "--eval-max", "200"],
            "wv": ["-m", "adapm.apps.wv", "--corpus", str(wv / "corpus.txt")],
            "mf": ["-m", "adapm.apps.mf", "--train", str(mf / "train.mmc"), "--test",
                   str(mf / "test.mmc")],
            # DataLoader workers forked after the node started, and torch's own threads
            "ctr": [str(EXAMPLES / "ctr" / "train.py"), "--data", str(ctr), "--dim", "8",
                    "--hidden", "64,32", "--loader-workers", "2"],
            "gnn": [str(EXAMPLES / "gnn" / "train.py"), "--nodes", "4000", "--communities",
                    "4"]}


# name -> (nodes, app, epochs, extra flags)
CONFIGS = {
    "kge2": (2, "kge", 3, []),
    "kge4": (4, "kge", 2, []),
    "kge2-channels": (2, "kge", 2, ["--channels", "2"]),
    "kge3-replication": (3, "kge", 2, ["--management", "replication_only"]),
    "kge4-threads": (4, "kge", 2, ["--workers", "2"]),
    "wv2": (2, "wv", 2, []),
    "wv3-local": (3, "wv", 1, ["--sampling", "local"]),
    "wv2-average": (2, "wv", 1, ["--replica-updates", "average", "--workers", "2",
                                 "--channels", "2"]),
    "mf2": (2, "mf", 3, []),
    "mf3-threads": (3, "mf", 2, ["--channels", "2", "--workers", "2"]),
    "mf2-columnwise": (2, "mf", 2, ["--schedule", "columnwise"]),
    "ctr2": (2, "ctr", 2, []),
    "gnn2": (2, "gnn", 2, []),
}


def run_once(name: str, data: dict, seed: int, timeout_s: float, out: Path) -> str | None:
    """One run of configuration ``name``; None if it went through, else why not (its output
    kept in ``out``)."""
    nodes, app, epochs, extra = CONFIGS[name]
    cmd = [PY, "-m", "adapm.launch", "-n", str(nodes), PY, *data[app], "--epochs", str(epochs),
           "--progress", "off", "--json", "-", "--seed", str(seed), *extra]
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        stdout, stderr, why = proc.stdout, proc.stderr, None
        if proc.returncode:
            why = f"exit status {proc.returncode}"
    except subprocess.TimeoutExpired as exc:  # the launcher's children go with it
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        why = f"no end within {timeout_s:g} s"
    if why is None:
        lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        lines = [r for r in lines if "epoch" in r and not r.get("final")]  # CTR: finals too
        if len(lines) != epochs:
            why = f"{len(lines)} epoch lines of {epochs}"
    if why is not None:
        log = out / f"{name}-seed{seed}-{time.strftime('%H%M%S')}.log"
        log.write_text(f"{' '.join(cmd)}\n{why}\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
        return f"{why} (output: {log})"
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long to go on")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"configurations to run, in turn (of: {', '.join(CONFIGS)})")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a run may take before it counts as hung")
    p.add_argument("--out", default=None, help="where failed runs' output goes (default: a "
                   "new temporary directory)")
    opts = p.parse_args()
    names = opts.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)} (of: {', '.join(CONFIGS)})")
    out = Path(opts.out or tempfile.mkdtemp(prefix="adapm-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    data = datasets(Path(tempfile.gettempdir()) / "adapm-soak-data")
    runs = {n: 0 for n in names}
    failures = {n: 0 for n in names}
    deadline = time.monotonic() + 60 * opts.minutes
    seed = 0
    with tqdm(total=round(60 * opts.minutes), unit="s", desc="soak",
              bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} s{postfix}") as bar:
        started = time.monotonic()
        while time.monotonic() < deadline:
            for name in names:
                if time.monotonic() >= deadline:
                    break
                why = run_once(name, data, seed, opts.timeout, out)
                runs[name] += 1
                if why is not None:
                    failures[name] += 1
                    tqdm.write(f"FAILED {name} seed {seed}: {why}")
                bar.n = min(bar.total, round(time.monotonic() - started))
                bar.set_postfix_str(f"{sum(runs.values())} runs, "
                                    f"{sum(failures.values())} failed")
            seed += 1
    print("\n| configuration | runs | failed |\n|---|---:|---:|")
    for name in names:
        print(f"| {name} | {runs[name]} | {failures[name]} |")
    total = sum(failures.values())
    print(f"\n{sum(runs.values())} runs, {total} failed" +
          (f"; their output in {out}" if total else ""))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
