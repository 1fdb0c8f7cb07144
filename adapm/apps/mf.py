"""Matrix factorisation on adapm: ``python -m adapm.apps.mf --train FILE --test FILE``.

    python -m adapm.apps.mf generate data/mf --rows 20000 --cols 5000 --entries 1000000
    python -m adapm.apps.mf --train data/mf/train.mmc --test data/mf/test.mmc --workers 2
    adapm-run -n 2 python -m adapm.apps.mf --train data/mf/train.mmc --test data/mf/test.mmc

Latent factors of rank ``--rank``: the prediction of cell (i, j) is <W[i], H[j]>. Loss: squared
error plus ``--reg`` * (|W[i]|^2 + |H[j]|^2) per training entry (i, j), the L2 term of LIBMF,
Spark's ALS-WR and the usual PyTorch MF; AdaGrad with its accumulator in each key's value,
after the factor, starting at 0.1 (torch's ``initial_accumulator_value``). Initial factors: N(0, 0.03) around a constant that makes every initial
prediction the training mean (ratings do not start at 0). Keys: row i is key i, column j key
rows + j. The defaults (``--lr`` 0.2, ``--reg`` 0.05) match a PyTorch AdaGrad MF on MovieLens-100k
(``bench/quality.py``).

Schedules: the rows are split randomly across nodes and threads (a row is trained by one worker
only). With ``--schedule rows`` (default) each worker trains its rows one after the other, the
rows in an order shuffled per epoch, all entries of a row together: the order of every row's
updates is the same whatever the number of workers, and so is the RMSE per epoch (1, 2 and 4
workers within 1-2% after 3 epochs, where ``columnwise`` lost 15-30%; ``bench/quality.py``).
Each batch touches columns all over the matrix, so under the PM the popular columns are
replicated on every node. With ``columnwise`` (the original AdaPM app's) each worker trains the
entries of its rows column by column, the columns in an order shuffled per epoch and rotated per
worker, so that workers visit different columns at a time: a column factor is wanted by one
worker after another, each signalling intent ``--ahead`` entries before it gets there (100,000
entries by default, see ``parser``), so columns relocate instead of being replicated (a sixteenth
of the bytes of ``rows`` on 2 nodes). Its price is quality per epoch: each column then sees one
worker's rows at a time, for a long stretch, and is pulled toward fitting them (measured in a
deterministic, race-free replay of the schedule, see docs/quality.md). With ``dsgd`` the columns
form one block per worker and each worker trains the blocks in a rotated order, a block's
entries shuffled (see ``MFTask.epoch_order``). A worker's row keys are signalled once per epoch.
One native call per mini-batch of entries (``native/kernels/mf.c``).

With ``--valid FILE``: the validation RMSE after each epoch, early stopping after ``--patience``
epochs without a better one, and the best epoch's model exported (after ``--resume``: the best
epoch of the resumed run; checkpoints do not keep the best model).

After each evaluated epoch: test RMSE. Export (``--export DIR``): ``W.npy`` (rows x rank) and
``H.npy`` (cols x rank), float32, prediction W[i] . H[j]; for a table with a header, also
``rows.tsv`` and ``cols.tsv`` (``index<TAB>label``: row i of W is label ...).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import _argtypes
from .._native_loader import load as _load
from . import mf_data, runner
from .baseline import ArrayWorker
from .datafiles import DataError, write_atomically

_kernels = _load("adapm._kernels")

# Initial factors ~ N(0, INIT_STD) around the centring offset. 0.03 rather than 0.1
# (bench/quality.py): MovieLens-100k test RMSE 0.925 against 0.936, and 1, 2 and 4 baseline
# workers within 1.8% after 3 epochs on the generated 50k x 20k matrix, against 2.3% (0.01:
# 0.921, but 3.3%).
INIT_STD = 0.03
# AdaGrad's accumulators start here, not at 0. From 0 a coordinate's first step is lr times
# the sign of its gradient (0.2, as large as the factors): two workers whose first batches of
# an epoch-1 column overlap in time both take it from the same value, and whether they overlap
# is thread timing. 3-epoch RMSE of 20 runs of 2 baseline workers on the quality test's matrix:
# 0.2328-0.2454 from 0, 0.2321-0.2381 from 0.1; on the 50k x 20k matrix 0.447 -> 0.422 (1 to 4
# workers); MovieLens-100k unchanged (0.9233 / 0.9269 -> 0.9239 / 0.9275). docs/quality.md.
ACCUMULATOR_INIT = 0.1
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
    shape_flags = ("--rank",)  # what sets a key's value length (a resume names them)
    unit = None  # a data point is an entry: points_per_s says entries/s
    sampling = None

    def __init__(self, train: mf_data.Matrix, test: mf_data.Matrix,
                 opts: argparse.Namespace, valid: Optional[mf_data.Matrix] = None) -> None:
        self.train, self.test, self.valid = train, test, valid
        self.patience = getattr(opts, "patience", 0)
        self.best_epoch, self.best_valid = 0, math.inf
        self._best: Optional[tuple] = None     # rank 0: (W, H) of the best epoch so far
        self._latest: Optional[tuple] = None   # (W, H) pulled by the last evaluation
        self.rank, self.lr, self.seed = opts.rank, opts.lr, opts.seed
        self.schedule = opts.schedule
        self.num_rows, self.num_cols = train.num_rows, train.num_cols
        self.num_keys = self.num_rows + self.num_cols
        self.value_length = 2 * self.rank
        # The kernel's L2 weight of each key per entry: 2 reg (the gradient of reg |w|^2).
        self.reg = np.full(self.num_keys, 2.0 * opts.reg, dtype=np.float32)
        # Initial factors centred so that every initial prediction is the training mean: a
        # factor of row i is offset + noise, of column j sign * offset + noise, where
        # rank * offset^2 = |mean| (see init_rows). Measured on MovieLens-100k: test RMSE 0.943
        # against 0.950 from N(0, 0.1) alone (lr 0.1, the L2 then spread over entries).
        mean = float(np.mean(train.vals, dtype=np.float64)) if len(train) else 0.0
        self.init_offset = math.sqrt(abs(mean) / self.rank)
        self.init_sign = 1.0 if mean >= 0 else -1.0
        self._parts = 1  # workers over all nodes (worker_points learns it)

    def worker_points(self, part: int, parts: int) -> np.ndarray:
        """The entries of a random share of the rows (the same for a seed, whatever the node
        count), sorted by column."""
        self._parts = parts
        owner = np.random.default_rng([self.seed, 2]).permutation(self.num_rows) % parts
        points = np.flatnonzero(owner[self.train.rows] == part)
        return points[np.argsort(self.train.cols[points], kind="stable")]

    def epoch_order(self, points: np.ndarray, part: int, epoch: int, rng) -> np.ndarray:
        """rows: row by row, the rows in an order shuffled per epoch (one order for all workers:
        each trains its rows in it), the entries of a row shuffled.
        columnwise: column by column, the columns in an order shuffled per epoch (the same
        for every worker) and rotated by the worker's part, the entries of a column shuffled.
        dsgd: the shuffled columns cut into one block per worker; worker p trains block
        (p + s) mod P in its s-th sub-epoch, the entries of a block shuffled together (DSGD's
        stratum schedule, without a barrier between sub-epochs: intent moves each block's
        columns to its next worker)."""
        if self.schedule == "rows":
            rows = np.random.default_rng([self.seed, 6, epoch]).permutation(self.num_rows)
            key = (rows[self.train.rows[points]].astype(np.int64) << 32) | rng.integers(
                0, 1 << 32, len(points))
            return points[_argsort(key)]
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
        return points[_argsort(key)]

    def standing_keys(self, points: np.ndarray) -> np.ndarray:
        """A worker's row keys: it wants them for the whole epoch (signalled once per epoch, not
        with each batch: ~1,000 keys less per clock at the default batch)."""
        held = np.zeros(self.num_rows, dtype=bool)  # np.unique's result without its sort
        held[self.train.rows[points]] = True
        return np.flatnonzero(held)

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        """N(0, INIT_STD) factors around the centring offset, accumulators at ACCUMULATOR_INIT;
        a function of the seed, the training mean and the key only."""
        k = self.rank
        rows = np.full((len(keys), 2 * k), ACCUMULATOR_INIT, dtype=np.float32)
        blocks = keys // _INIT_BLOCK
        for block in np.unique(blocks):  # a loop over blocks of keys, not over keys
            mine = blocks == block
            rng = np.random.default_rng([self.seed, 3, int(block)])
            values = rng.normal(0.0, INIT_STD, (_INIT_BLOCK, k)).astype(np.float32)
            rows[mine, :k] = values[keys[mine] % _INIT_BLOCK]
        if self.init_offset:
            rows[:, :k] += np.where(keys < self.num_rows, 1.0, self.init_sign)[:, None].astype(
                np.float32) * np.float32(self.init_offset)
        return rows.reshape(-1)

    def trainer(self, batch_size: int, points: np.ndarray, epochs: int) -> "MFTrainer":
        return MFTrainer(self, batch_size)

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
        """[squared errors, entries] of this node's share of the test entries, then of the
        validation entries (with ``--valid``)."""
        w, h = self._latest = self.factors(worker)
        sums = []
        for t in (self.test, self.valid):
            if t is None:
                continue
            mine = slice(part, None, parts)
            predicted = np.einsum("ij,ij->i", w[t.rows[mine]], h[t.cols[mine]])
            errors = t.vals[mine].astype(np.float64) - predicted
            sums += [float(np.dot(errors, errors)), float(len(errors))]
        return sums

    def metrics(self, sums: np.ndarray) -> dict:
        out = {"rmse": float(np.sqrt(sums[0] / sums[1])) if sums[1] else float("nan")}
        if self.valid is not None:
            out["valid_rmse"] = float(np.sqrt(sums[2] / sums[3])) if sums[3] else float("nan")
        return out

    def after_evaluation(self, epoch: int, metrics: dict, keep: bool) -> tuple[dict, bool]:
        """Early stopping on the validation RMSE (``--valid``): remembers the best epoch (its
        factors when ``keep``: rank 0, which exports them) and stops once ``--patience``
        epochs have passed since the best one (only evaluated epochs can be best: see
        --eval-every). Returns (fields for the JSON line, stop)."""
        if self.valid is None:
            return {}, False
        if metrics["valid_rmse"] < self.best_valid:
            self.best_valid, self.best_epoch = metrics["valid_rmse"], epoch
            if keep:
                self._best = self._latest
        self._latest = None
        stop = bool(self.patience) and epoch - self.best_epoch >= self.patience
        return {"best_epoch": self.best_epoch}, stop

    def exported_epoch(self, last: int) -> int:
        """The epoch whose model :meth:`export` writes (rank 0) when training stopped after
        epoch ``last``: the best one while its factors are kept here, else ``last`` (a run
        resumed after its best epoch)."""
        return self.best_epoch if self._best is not None else last

    def checkpoint_state(self) -> dict:
        """What a resumed run needs of the early stopping: the best epoch and its RMSE (a
        checkpoint holds the last epoch's model, not the best one's)."""
        return {"best_epoch": self.best_epoch,
                "best_valid": None if math.isinf(self.best_valid) else self.best_valid}

    def resume_state(self, state: dict) -> None:
        """Takes :meth:`checkpoint_state` back: early stopping and ``best_epoch`` go on as in
        an uninterrupted run."""
        if state.get("best_valid") is not None:
            self.best_epoch, self.best_valid = int(state["best_epoch"]), float(state["best_valid"])

    def export(self, worker, directory: str) -> None:
        """W.npy and H.npy: of the best epoch under ``--valid``, else the last; with labelled
        input (a table with a header) also rows.tsv and cols.tsv (index<TAB>label). A run
        resumed after its best epoch that found none better has only the last epoch's model:
        exported, and said so on stderr."""
        if self._best is None and self.valid is not None and self.best_epoch:
            print(f"the best epoch ({self.best_epoch}) came before this run resumed, and a "
                  f"checkpoint keeps the last epoch's model only: {directory} gets the last "
                  "epoch's", file=sys.stderr, flush=True)
        w, h = self._best if self._best is not None else self.factors(worker)
        os.makedirs(directory, exist_ok=True)
        for name, array in (("W.npy", w), ("H.npy", h)):
            write_atomically(os.path.join(directory, name),
                             lambda f, a=array: np.save(f, a.astype(np.float32)))
        for name, labels in (("rows.tsv", self.train.row_labels),
                             ("cols.tsv", self.train.col_labels)):
            if labels is not None:
                text = "".join(f"{i}\t{label}\n" for i, label in enumerate(labels.tolist()))
                write_atomically(os.path.join(directory, name),
                                 lambda f, t=text: f.write(t.encode()))


class MFTrainer:
    """One worker thread's batches: buffers grown as needed, one kernel call per batch; or, over
    the baseline's array, many batches per native call (:meth:`chunked`)."""

    def __init__(self, task: MFTask, batch_size: int = 1000) -> None:
        self.task = task
        self.batch_size = batch_size
        self._scratch: Optional[tuple] = None  # chunked's, allocated on first use
        self.values = np.empty(0, dtype=np.float32)
        self.updates = np.empty(0, dtype=np.float32)
        t = task.train
        # mf_plan's inputs as it takes them (no copy when they already are) and its scratch.
        self._entries = (np.ascontiguousarray(t.rows, dtype=np.int64),
                         np.ascontiguousarray(t.cols, dtype=np.int64),
                         np.ascontiguousarray(t.vals, dtype=np.float32))
        self._row_of = np.full(task.num_keys, -1, dtype=np.int32)

    def plan(self, points: np.ndarray) -> _Plan:
        """The batch's distinct keys (ascending), each entry's rows in them, values and L2
        weights: one native call with the GIL released (mf_plan), the arrays numpy's
        unique(rows, num_rows + cols, return_inverse) gives."""
        task, n = self.task, len(points)
        keys = np.empty(2 * n, dtype=np.int64)
        rows = np.empty((2, n), dtype=np.int64)
        x = np.empty(n, dtype=np.float32)
        reg = np.empty(2 * n, dtype=np.float32)
        nk, row_keys = _kernels.mf_plan(*self._entries, task.num_rows, task.reg, self._row_of,
                                        points, keys, rows[0], rows[1], x, reg)
        return _Plan(keys[:nk], rows[0], rows[1], x, reg[:nk], keys[row_keys:nk])

    def intent_keys(self, points: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The column keys each batch of ``points`` signals as intent (``plan(...).intent_keys``
        of each batch, in order of first appearance rather than ascending): (keys back to back,
        their number per batch), one native call for many batches (see ``chunked``)."""
        keys = np.empty(len(points), dtype=np.int64)
        counts = np.empty(-(-len(points) // batch_size), dtype=np.int64)
        total = _kernels.mf_columns(self._entries[1], self.task.num_rows, self._row_of, points,
                                    batch_size, keys, counts)
        return keys[:total], counts

    def chunked(self, worker, ahead: int = 0):
        """A ``run(points, batch_size) -> (losses, steps)`` that trains many batches in one
        native call with the GIL released (per batch what plan, pull, step and push do, with the
        same arithmetic), over the baseline's plain shared array or a node's store
        (``Worker.native_rows``); None where the worker offers no rows. Over a store, a batch
        with a key held elsewhere goes through ``step`` (pull and push route it); the runner
        signals intent (``intent_keys``) and advances the clocks. ``ahead`` is the runner's
        (``runner.Trainer``); MF's plans draw no random numbers, so it changes nothing here."""
        if isinstance(worker, ArrayWorker):
            if not hasattr(_kernels, "mf_train_table"):
                return None  # a build of the kernels from before the call
            data, offsets, lens = worker.table()
            rows = None
        else:
            if not hasattr(_kernels, "mf_train_rows"):
                return None
            rows = worker.native_rows()
            if rows is None:
                return None
        task = self.task
        if self._scratch is None:
            bs, width = self.batch_size, 2 * task.rank
            self._scratch = (np.empty(6 * bs, dtype=np.int64),
                             np.empty(3 * bs + 4 * bs * width, dtype=np.float32),
                             np.empty(runner.CHUNK_BATCHES, dtype=np.float64),
                             np.empty(runner.CHUNK_BATCHES, dtype=np.int64),
                             np.empty(2 * bs, dtype=np.int64),
                             np.empty((2 * bs, width), dtype=np.float32))
        iscratch, fscratch, losses, keys, left_keys, left_rows = self._scratch

        def check(batch_size: int) -> None:
            if batch_size > self.batch_size:
                raise ValueError(f"batches of {batch_size} entries; this trainer's scratch "
                                 f"holds {self.batch_size}")

        def run_table(points: np.ndarray, batch_size: int) -> tuple[list, int]:
            check(batch_size)
            batches = _kernels.mf_train_table(
                task.rank, task.lr, batch_size, *self._entries, task.num_rows, task.reg,
                self._row_of, points, data, offsets, lens, iscratch, fscratch,
                losses, keys)
            touched = int(keys[:batches].sum())
            worker.count_accesses(touched, touched)
            return losses[:batches].tolist(), len(points)

        def run_rows(points: np.ndarray, batch_size: int) -> tuple[list, int]:
            # A batch whose keys are not all here (STOP_PULL), or whose keys left before its
            # push (STOP_PUSH), goes through the worker's pull and push, which route them.
            check(batch_size)
            out: list = []
            steps = len(points)
            while len(points):
                batches, stop, left = _kernels.mf_train_rows(
                    task.rank, task.lr, batch_size, *self._entries, task.num_rows, task.reg,
                    self._row_of, points, rows, left_keys, left_rows, iscratch, fscratch,
                    losses, keys)
                touched = int(keys[:batches].sum())
                worker.count_accesses(touched, touched - left)
                out += losses[:batches].tolist()
                points = points[batches * batch_size:]
                if stop == _kernels.MF_STOP_PUSH:
                    worker.push(left_keys[:left], left_rows[:left])  # not kept
                elif stop == _kernels.MF_STOP_PULL:
                    out.append(self.step(worker, self.plan(points[:batch_size]), None)[0])
                    points = points[batch_size:]
            return out, steps

        return run_table if rows is None else run_rows

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


def _argsort(key: np.ndarray) -> np.ndarray:
    """np.argsort(key, kind="stable") by the kernels' radix sort, GIL released (numpy's sort
    took more than half of an MF worker's CPU per batch: 0.8 s against 0.3 s for 5M keys). Ties
    (a row's two entries with one 32-bit tie-break, about one an epoch in 16 at 10M entries)
    keep their order; numpy's default sort, used before, may swap them."""
    order = np.empty(len(key), dtype=np.int64)
    _kernels.radix_argsort(key, order)
    return order


def _delimiter(text: str) -> str:
    """--delimiter's type: mf_data.check_delimiter's ValueError as a usage error."""
    try:
        return mf_data.check_delimiter(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = runner.AppParser(
        prog="python -m adapm.apps.mf", formatter_class=runner.HelpFormatter,
        description="Train a matrix factorisation on adapm (or: generate OUT_DIR ... to write a "
                    "planted low-rank matrix; see 'generate --help').")
    p.add_argument("--train", required=True, metavar="FILE",
                   help="training entries: MatrixMarket coordinate (general or symmetric, "
                        "real or integer), row<TAB>col<TAB>value lines (0-based), or a table "
                        "with a header line such as userId,movieId,rating,timestamp")
    p.add_argument("--test", required=True, metavar="FILE", help="test entries, same formats")
    p.add_argument("--valid", metavar="FILE", default=None,
                   help="validation entries, same formats: early stopping on their RMSE, the "
                        "best epoch's model exported")
    p.add_argument("--delimiter", type=_delimiter, default=None, metavar="SEP",
                   help="read the files as tables with this field separator (tab, comma, "
                        "semicolon, pipe, space or the characters, e.g. '::'), with or without "
                        "a header line; the first three fields are row label, column label, "
                        "value (default: a header line's comma or tab)")
    p.add_argument("--patience", type=_argtypes.non_negative_int, default=5,
                   help="with --valid: stop once this many epochs have passed since the one "
                        "with the best validation RMSE (0: train every epoch)")
    p.add_argument("--rank", type=_argtypes.positive_int, default=10, help="factor rank")
    # Defaults measured in bench/quality.py (MovieLens-100k against a PyTorch AdaGrad MF, and
    # 1, 2 and 4 baseline workers on generated data).
    p.add_argument("--lr", type=_argtypes.positive_float, default=0.2,
                   help="AdaGrad learning rate")
    p.add_argument("--reg", type=_argtypes.non_negative_float, default=0.05,
                   help="L2 weight lambda on |W[i]|^2 + |H[j]|^2 per training entry (i, j)")
    p.add_argument("--schedule", choices=("rows", "columnwise", "dsgd"), default="rows",
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
    try:
        train, test, *valid = mf_data.read_files(opts.train, opts.test,
                                                 *([opts.valid] if opts.valid else []),
                                                 delimiter=opts.delimiter)
    except DataError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    runner.run(MFTask(train, test, opts, valid[0] if valid else None), opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
