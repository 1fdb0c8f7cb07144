"""Model quality against the tools users compare with, side by side in one run (issue 27).

    python bench/quality.py              # every table below
    python bench/quality.py --only mf-real,mf-workers

Tables:

- ``mf-real``: matrix factorisation on MovieLens-100k (100,000 real ratings; the file ships
  inside the ``recbole`` wheel from PyPI, fetched once with ``pip download --no-deps`` into a
  cache folder and written as ``userId,movieId,rating,timestamp`` CSV files, split 80/10/10 at
  random with a fixed seed). adapm with its defaults (rank 10, ``--valid`` early stopping, the
  best epoch's test RMSE), as the baseline with 1 worker and on 2 nodes x 1, against a plain
  PyTorch MF of the same rank and objective (squared error plus 0.05 (|w|^2 + |h|^2) per entry,
  ``torch.optim.Adagrad`` over sparse embeddings, N(0, 0.1) initial factors, shuffled
  mini-batches of 256) with its own best learning rate of (0.03, 0.1, 0.3) and its own best
  epoch, both chosen on the validation split.
- ``mf-workers``: ``--baseline`` with 1, 2 and 4 workers on a generated 50,000 x 20,000 matrix
  (2M entries), test RMSE after each of 3 epochs, for the default schedule (rows) and the
  original columnwise one.

Needs the bench extra (``pip install -e '.[bench]'``: torch for the MF peer).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from app_runs import sh  # bench/ is the script's directory: on sys.path

PY = sys.executable
CACHE = Path(os.environ.get("ADAPM_BENCH_CACHE", Path(tempfile.gettempdir()) / "adapm-bench"))
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
LAUNCH2 = [PY, "-m", "adapm.launch", "-n", "2"]
# The wheel that ships MovieLens-100k (recbole/dataset_example/ml-100k/ml-100k.inter, a TSV with
# the header user_id:token, item_id:token, rating:float, timestamp:float).
ML100K_WHEEL = "recbole==1.2.1"
ML100K_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"


# ------------------------------------------------------------------------------------ data


def movielens_100k() -> Path:
    """A folder with train.csv, valid.csv and test.csv of MovieLens-100k (80/10/10, seed 0)."""
    out = CACHE / "ml-100k"
    if (out / "test.csv").exists():
        return out
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob("recbole-*.whl")):
        subprocess.run([PY, "-m", "pip", "download", "--quiet", "--no-deps", "--dest",
                        str(wheels), ML100K_WHEEL], check=True)
    wheel = next(wheels.glob("recbole-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        lines = z.read(ML100K_MEMBER).decode().splitlines()[1:]
    table = np.array([line.split("\t") for line in lines if line.strip()], dtype=np.float64)
    order = np.random.default_rng(0).permutation(len(table))
    cut = [int(0.8 * len(table)), int(0.9 * len(table))]
    out.mkdir(parents=True, exist_ok=True)
    for name, part in zip(("train", "valid", "test"), np.split(order, cut)):
        rows = table[part]
        text = "".join(f"{int(u)},{int(i)},{r:g},{int(t)}\n" for u, i, r, t in rows)
        (out / f"{name}.csv").write_text("userId,movieId,rating,timestamp\n" + text)
    return out


def generated(rows: int, cols: int, entries: int) -> Path:
    data = CACHE / f"mf-{rows}x{cols}-{entries}"
    if not (data / "test.mmc").exists():
        sh([PY, "-m", "adapm.apps.mf", "generate", str(data), "--rows", str(rows), "--cols",
            str(cols), "--entries", str(entries), "--seed", "1"], ENV)
    return data


# ------------------------------------------------------------------------- the MF peer


def _read_csv(path: Path):
    table = np.loadtxt(path, delimiter=",", skiprows=1)
    return table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2]


def torch_mf(folder: Path, rank: int, reg: float, lr: float, epochs: int, patience: int,
             seed: int = 0) -> dict:
    """A plain PyTorch AdaGrad MF: (best epoch by validation RMSE, its test RMSE, seconds)."""
    import torch

    torch.manual_seed(seed)
    splits = [_read_csv(folder / f"{n}.csv") for n in ("train", "valid", "test")]
    users = np.unique(np.concatenate([s[0] for s in splits]))
    items = np.unique(np.concatenate([s[1] for s in splits]))
    tr, va, te = [(torch.from_numpy(np.searchsorted(users, u)),
                   torch.from_numpy(np.searchsorted(items, i)),
                   torch.from_numpy(r.astype(np.float32))) for u, i, r in splits]
    w = torch.nn.Embedding(len(users), rank, sparse=True)
    h = torch.nn.Embedding(len(items), rank, sparse=True)
    for table in (w, h):
        torch.nn.init.normal_(table.weight, 0.0, 0.1)
    opt = torch.optim.Adagrad([w.weight, h.weight], lr=lr)

    def rmse(split) -> float:
        with torch.no_grad():
            pred = (w(split[0]) * h(split[1])).sum(1)
            return float((pred - split[2]).pow(2).mean().sqrt())

    best = (float("inf"), 0, float("nan"))
    started = time.perf_counter()
    for epoch in range(1, epochs + 1):
        for b in torch.randperm(len(tr[2])).split(256):
            u, i, x = tr[0][b], tr[1][b], tr[2][b]
            wu, hi = w(u), h(i)
            loss = ((wu * hi).sum(1) - x).pow(2).sum() + reg * (wu.pow(2).sum() + hi.pow(2).sum())
            opt.zero_grad()
            loss.backward()
            opt.step()
        valid = rmse(va)
        if valid < best[0]:
            best = (valid, epoch, rmse(te))
        elif epoch - best[1] >= patience:
            break
    return {"valid": best[0], "epoch": best[1], "test": best[2], "lr": lr,
            "seconds": time.perf_counter() - started}


# ---------------------------------------------------------------------------- tables


def best_of(lines: list[dict]) -> dict:
    """The record of the best epoch (by validation RMSE) of an app run with --valid."""
    best = lines[-1]["best_epoch"]
    return next(r for r in lines if r["epoch"] == best)


def mf_real(opts) -> None:
    folder = movielens_100k()
    app = [PY, "-m", "adapm.apps.mf", "--train", str(folder / "train.csv"), "--valid",
           str(folder / "valid.csv"), "--test", str(folder / "test.csv"), "--epochs",
           str(opts.mf_epochs), "--progress", "off"]
    rows = []
    for name, cmd in (("adapm --baseline", [*app, "--baseline"]),
                      ("adapm 2 nodes x 1", [*LAUNCH2, *app])):
        for seed in range(opts.seeds):
            lines = sh([*cmd, "--seed", str(seed)], ENV)
            r = best_of(lines)
            rows.append((name, seed, r["epoch"], r["valid_rmse"], r["rmse"], len(lines)))
    peers = [torch_mf(folder, 10, 0.05, lr, opts.mf_epochs, 5, seed)
             for lr in (0.03, 0.1, 0.3) for seed in range(opts.seeds)]
    by_lr = {}
    for p in peers:
        by_lr.setdefault(p["lr"], []).append(p)
    lr = min(by_lr, key=lambda k: np.mean([p["valid"] for p in by_lr[k]]))
    print(f"\nMF on MovieLens-100k ({folder}: 80,000 / 10,000 / 10,000 ratings), rank 10, "
          f"L2 0.05 per entry, best epoch by validation RMSE\n")
    print("| run | seed | best epoch | valid RMSE | test RMSE | epochs run |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, seed, epoch, valid, test, ran in rows:
        print(f"| {name} | {seed} | {epoch} | {valid:.4f} | {test:.4f} | {ran} |")
    for p in by_lr[lr]:
        print(f"| PyTorch AdaGrad MF (lr {lr}) | - | {p['epoch']} | {p['valid']:.4f} | "
              f"{p['test']:.4f} | - |")
    peer = float(np.mean([p["test"] for p in by_lr[lr]]))
    for name in ("adapm --baseline", "adapm 2 nodes x 1"):
        ours = float(np.mean([r[4] for r in rows if r[0] == name]))
        print(f"\n{name}: mean test RMSE {ours:.4f}, PyTorch {peer:.4f}: "
              f"{100 * (ours / peer - 1):+.2f}% (target: within 1%)", end="")
    print("\n(PyTorch per lr, mean best-epoch test RMSE: " + ", ".join(
        f"{k}: {np.mean([p['test'] for p in v]):.4f}" for k, v in by_lr.items()) + ")")


def mf_workers(opts) -> None:
    data = generated(50_000, 20_000, 2_000_000)
    app = [PY, "-m", "adapm.apps.mf", "--train", str(data / "train.mmc"), "--test",
           str(data / "test.mmc"), "--epochs", "3", "--progress", "off", "--baseline"]
    print(f"\nMF --baseline on a generated 50,000 x 20,000 matrix (2M entries), test RMSE "
          f"after each epoch\n")
    print("| schedule | workers | RMSE per epoch | epoch 3 vs 1 worker |")
    print("|---|---:|---|---:|")
    for schedule in ("rows", "columnwise"):
        one = None
        for workers in (1, 2, 4):
            lines = sh([*app, "--schedule", schedule, "--workers", str(workers)], ENV)
            rmse = [r["rmse"] for r in lines]
            one = rmse[-1] if one is None else one
            print(f"| {schedule} | {workers} | {', '.join(f'{x:.4f}' for x in rmse)} | "
                  f"{100 * (rmse[-1] / one - 1):+.1f}% |", flush=True)


TABLES = {"mf-real": mf_real, "mf-workers": mf_workers}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(TABLES), help="tables to measure, of: "
                   + ", ".join(TABLES))
    p.add_argument("--seeds", type=int, default=2, help="seeds per MF run on real data")
    p.add_argument("--mf-epochs", type=int, default=100, help="most epochs of an MF run")
    opts = p.parse_args()
    for name in opts.only.split(","):
        TABLES[name](opts)


if __name__ == "__main__":
    main()
