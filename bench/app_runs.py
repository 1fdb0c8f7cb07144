"""Running an app for the app benchmarks (bench/kge.py, wv.py, mf.py): its JSON lines, or stop."""

from __future__ import annotations

import json
import subprocess
import sys
import time


def sh(cmd: list[str], env: dict) -> list[dict]:
    """Run an app's command line; returns its JSON lines, or exits naming the command and its
    stderr's tail when it fails. Prints the time it took (stderr)."""
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    print(f"  {time.monotonic() - started:6.1f} s  {' '.join(cmd[-14:])}", file=sys.stderr)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
