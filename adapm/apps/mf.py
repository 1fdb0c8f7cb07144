"""Matrix factorisation on adapm: ``python -m adapm.apps.mf --train FILE --test FILE``.

    python -m adapm.apps.mf generate data/mf --rows 20000 --cols 5000 --entries 1000000
    python -m adapm.apps.mf --train data/mf/train.mmc --test data/mf/test.mmc --workers 2
    adapm-run -n 2 python -m adapm.apps.mf --train data/mf/train.mmc --test data/mf/test.mmc

Latent factors of rank ``--rank``: the prediction of cell (i, j) is <W[i], H[j]>. Loss: squared
error over the training entries plus ``--reg`` * (|W|^2 + |H|^2), the L2 term spread over the
entries of each row and column (an entry of row i weighs it by 1 / its row's entries), as the
original AdaPM MF app; AdaGrad with its accumulator in each key's value, after the factor.
Keys: row i is key i, column j key rows + j.

Schedules (the reference's): the rows are split randomly across nodes and threads. With
``--schedule columnwise`` (default) each worker trains the entries of its rows column by column,
the columns in an order shuffled per epoch and rotated per worker, so that workers visit
different columns at a time; with ``dsgd`` the columns form one block per worker and each worker
trains the blocks in a rotated order, a block's entries shuffled (see ``MFTask.epoch_order``). Row factors
are only ever wanted by their one worker (they move to it once and stay); a column factor is
wanted by one worker after another, each signalling intent ``--ahead`` entries before it gets
there (100,000 entries by default, see ``parser``). One native call per mini-batch of entries (``native/kernels/mf.c``).

After each evaluated epoch: test RMSE. Export (``--export DIR``): ``W.npy`` (rows x rank) and
``H.npy`` (cols x rank), float32, prediction W[i] . H[j].
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np

import adapm

from .. import _argtypes
from .._native_loader import load as _load
from . import mf_data, runner
from .datafiles import DataError, write_atomically

_kernels = _load("adapm._kernels")

INIT_STD = 0.1  # initial factors ~ N(0, INIT_STD); accumulators start at 0
_INIT_BLOCK = 4096


@dataclass
class _Plan:
    keys: np.ndarray     # the batch's distinct keys (rows, then rows + columns)
    w_rows: np.ndarray   # per entry: the row of its row factor in keys
    h_rows: np.ndarray   # per entry: the row of its column factor
    x: np.ndarray        # per entry: its value
    reg: np.ndarray      # per key: its L2 weight
    intent_keys: np.ndarray  # the batch's column keys (rows: standing_keys)
    sample_size: int = 0


class MFTask:
    """The MF app as a runner task (see :class:`adapm.apps.runner.Task`)."""

    name = "mf"
    unit = None  # a data point is an entry: points_per_s says entries/s
    sampling = None

    def __init__(self, train: mf_data.Matrix, test: mf_data.Matrix,
                 opts: argparse.Namespace) -> None:
        self.train, self.test = train, test
        self.rank, self.lr, self.seed = opts.rank, opts.lr, opts.seed
        self.schedule = opts.schedule
        self.num_rows, self.num_cols = train.num_rows, train.num_cols
        self.num_keys = self.num_rows + self.num_cols
        self.value_length = 2 * self.rank
        # The L2 weight of each key per entry: 2 reg / (entries of its row or column).
        counts = np.concatenate([np.bincount(train.rows, minlength=self.num_rows),
                                 np.bincount(train.cols, minlength=self.num_cols)])
        self.reg = (2.0 * opts.reg / np.maximum(counts, 1)).astype(np.float32)
        self._parts = 1  # workers over all nodes (worker_points learns it)

    def worker_points(self, part: int, parts: int) -> np.ndarray:
        """The entries of a random share of the rows (the same for a seed, whatever the node
        count), sorted by column."""
        self._parts = parts
        owner = np.random.default_rng([self.seed, 2]).permutation(self.num_rows) % parts
        points = np.flatnonzero(owner[self.train.rows] == part)
        return points[np.argsort(self.train.cols[points], kind="stable")]

    def epoch_order(self, points: np.ndarray, part: int, epoch: int, rng) -> np.ndarray:
        """columnwise: column by column, the columns in an order shuffled per epoch (the same
        for every worker) and rotated by the worker's part, the entries of a column shuffled.
        dsgd: the shuffled columns cut into one block per worker; worker p trains block
        (p + s) mod P in its s-th sub-epoch, the entries of a block shuffled together (DSGD's
        stratum schedule, without a barrier between sub-epochs: intent moves each block's
        columns to its next worker)."""
        columns = np.random.default_rng([self.seed, 5, epoch]).permutation(self.num_cols)
        position = np.empty(self.num_cols, dtype=np.int64)
        position[columns] = np.arange(self.num_cols)
        where = position[self.train.cols[points]]
        if self.schedule == "dsgd":
            where = (where * self._parts // self.num_cols - part) % self._parts
        else:
            where = (where - part * self.num_cols // self._parts) % self.num_cols
        # One sort of (column position, random tie-break) packed into an int64: a sixth of the
        # time of np.lexsort on two keys (0.32 s against 2.2 s for 5M entries here).
        key = (where.astype(np.int64) << 32) | rng.integers(0, 1 << 32, len(points))
        return points[np.argsort(key)]

    def standing_keys(self, points: np.ndarray) -> np.ndarray:
        """A worker's row keys: it wants them for the whole epoch (signalled once per epoch, not
        with each batch: ~1,000 keys less per clock at the default batch)."""
        return np.unique(self.train.rows[points])

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        """N(0, INIT_STD) factors, zero accumulators; a function of the seed and key only."""
        k = self.rank
        rows = np.zeros((len(keys), 2 * k), dtype=np.float32)
        blocks = keys // _INIT_BLOCK
        for block in np.unique(blocks):  # a loop over blocks of keys, not over keys
            mine = blocks == block
            rng = np.random.default_rng([self.seed, 3, int(block)])
            values = rng.normal(0.0, INIT_STD, (_INIT_BLOCK, k)).astype(np.float32)
            rows[mine, :k] = values[keys[mine] % _INIT_BLOCK]
        return rows.reshape(-1)

    def trainer(self, batch_size: int, points: np.ndarray, epochs: int) -> "MFTrainer":
        return MFTrainer(self)

    # --- evaluation and export ---------------------------------------------------------------

    def factors(self, worker) -> tuple[np.ndarray, np.ndarray]:
        """W and H (no optimizer state), pulled through ``worker``."""
        out = np.empty((self.num_keys, self.rank), dtype=np.float32)
        chunk = 1 << 15
        for i in range(0, self.num_keys, chunk):
            keys = np.arange(i, min(i + chunk, self.num_keys), dtype=np.int64)
            out[i:i + len(keys)] = worker.pull(keys).reshape(len(keys), -1)[:, :self.rank]
        return out[:self.num_rows], out[self.num_rows:]

    def evaluate(self, worker, part: int, parts: int) -> list:
        """[squared test errors, test entries] of this node's share of the test entries."""
        w, h = self.factors(worker)
        t = self.test
        mine = slice(part, None, parts)
        predicted = np.einsum("ij,ij->i", w[t.rows[mine]], h[t.cols[mine]])
        errors = t.vals[mine].astype(np.float64) - predicted
        return [float(np.dot(errors, errors)), float(len(errors))]

    def metrics(self, sums: np.ndarray) -> dict:
        return {"rmse": float(np.sqrt(sums[0] / sums[1])) if sums[1] else float("nan")}

    def export(self, worker, directory: str) -> None:
        w, h = self.factors(worker)
        os.makedirs(directory, exist_ok=True)
        for name, array in (("W.npy", w), ("H.npy", h)):
            write_atomically(os.path.join(directory, name),
                             lambda f, a=array: np.save(f, a.astype(np.float32)))


class MFTrainer:
    """One worker thread's batches: buffers grown as needed, one kernel call per batch."""

    def __init__(self, task: MFTask) -> None:
        self.task = task
        self.values = np.empty(0, dtype=np.float32)
        self.updates = np.empty(0, dtype=np.float32)

    def plan(self, points: np.ndarray) -> _Plan:
        task, t = self.task, self.task.train
        n = len(points)
        keys, inverse = np.unique(np.concatenate([t.rows[points], task.num_rows
                                                  + t.cols[points]]), return_inverse=True)
        return _Plan(keys, inverse[:n].astype(np.int64), inverse[n:].astype(np.int64),
                     t.vals[points], task.reg[keys], keys[keys >= task.num_rows])

    def step(self, worker, plan: _Plan, sample) -> tuple[float, int]:
        width = 2 * self.task.rank
        rows = len(plan.keys)
        if len(self.values) < rows * width:
            self.values = np.empty(2 * rows * width, dtype=np.float32)
            self.updates = np.empty_like(self.values)
        values = self.values[:rows * width].reshape(rows, width)
        updates = self.updates[:rows * width].reshape(rows, width)
        worker.pull(plan.keys, out=values)
        loss = _kernels.mf_train_batch(self.task.rank, values, updates, plan.w_rows,
                                       plan.h_rows, plan.x, plan.reg, self.task.lr)
        worker.push(plan.keys, updates)
        return loss, len(plan.x)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m adapm.apps.mf", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train a matrix factorisation on adapm (or: generate OUT_DIR ... to write a "
                    "planted low-rank matrix; see 'generate --help').")
    p.add_argument("--train", required=True, metavar="FILE",
                   help="training entries: MatrixMarket coordinate, or row<TAB>col<TAB>value")
    p.add_argument("--test", required=True, metavar="FILE", help="test entries, same formats")
    p.add_argument("--rank", type=_argtypes.positive_int, default=10, help="factor rank")
    p.add_argument("--lr", type=_argtypes.positive_float, default=0.1,
                   help="AdaGrad learning rate")
    p.add_argument("--reg", type=_argtypes.non_negative_float, default=0.05,
                   help="L2 weight lambda on |W|^2 + |H|^2")
    p.add_argument("--schedule", choices=("columnwise", "dsgd"), default="columnwise",
                   help="the order each worker trains its entries in (see the module doc)")
    # The reference signals a column's intent 1000 columns before its worker gets there: on the
    # benchmark's matrix (~200 entries per column) ~200,000 entries. 100,000 entries (100
    # batches) keeps the lead far above a sync round; 1,000 entries (one batch) measured 0.1%
    # remote accesses and 3.5x the epoch time on 2 nodes (bench/mf.py --quick).
    runner.add_common_flags(p, ahead=100_000, batch_size=1000, epochs=10)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "generate":
        return mf_data.generate_main(argv[1:])
    p = parser()
    opts = p.parse_args(argv)
    runner.check_flags(p, opts)
    if opts.baseline and adapm.Config.from_env(num_keys=1).world_size > 1:
        p.error("--baseline runs in one process; start it without a launcher")
    try:
        train, test = mf_data.read_pair(opts.train, opts.test)
    except DataError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    runner.run(MFTask(train, test, opts), opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
