"""Click-through-rate prediction with Wide & Deep on Criteo-layout data, embeddings in adapm.

Run it alone, under any launcher, or as the plain PyTorch baseline::

    python examples/ctr/criteo.py generate data/ctr             # Criteo-like data (or real Criteo)
    python examples/ctr/train.py --data data/ctr                # one process, rows in adapm
    adapm-run -n 2 python examples/ctr/train.py --data data/ctr # two nodes
    torchrun --nproc-per-node 2 examples/ctr/train.py --data data/ctr [--dense ddp]
    python examples/ctr/train.py --data data/ctr --baseline     # torch's nn.Embedding(sparse)

What the adapm run does: the categorical values' deep embeddings and wide weights are
``adapm.torch.Embedding`` / ``EmbeddingBag`` tables (rows in adapm, AdaGrad state in the row);
each rank trains on its own share of the training rows (rank r takes every world-th row from
r; all ranks take equally many), through a DataLoader whose ``collate_fn`` is an
``IntentCollate`` naming each batch's rows
and an ``IntentLoader`` that signals them ``--ahead`` batches before they are trained; the MLP
and the wide layer on the integer features are trained by torch's AdaGrad on every rank and
kept equal by ``DenseSync`` (asynchronously, through adapm) or, with ``--dense ddp`` under
torchrun, by torch's ``DistributedDataParallel`` (synchronously, over gloo; adapm then uses
``MASTER_PORT + 1``). The baseline is the same model, data order (of one rank) and
optimizers with torch's tables in one process. ``--device cuda`` puts the model on a GPU: the
adapm tables stay in adapm's host memory (each batch's rows pulled into pinned memory and copied
over, gradients back the same way), the baseline's tables go to the GPU with the rest.

Output, as the apps' (``adapm.apps.runner``): a progress bar on rank 0 (on a terminal), and per
epoch a summary line on rank 0's stdout and one JSON line, appended to ``--json FILE`` (written
to stdout with ``--json -``, the summary lines then going to stderr, so that stdout holds JSON
lines only), with ``epoch``, ``examples`` (trained over all ranks), ``train_seconds`` (from the
epoch's start to the last rank's end), ``examples_per_s``, ``train_logloss`` (rank 0's
batches), ``test_logloss`` and ``test_auc`` (rank 0 evaluates the whole test file),
``adapm_seconds`` (rank 0's time inside adapm calls: pulls, pushes, intent, clock, dense sync)
and ``remote_share`` (rank 0's remote pulled and pushed keys over all its keys, training loop
only). At the end every rank gives its own training totals the same way: a summary line, and a
JSON line (``"rank"``, ``"final"``) that every rank appends to ``--json FILE`` (or writes to
stdout with ``--json -``). A test file of one class has no AUC: ``"test_auc": null``. Output
paths are checked before the data is read; bad flag values, data files and checkpoints are one
line naming the flag or file (and line) and exit code 2, before any training; Ctrl-C is
"interrupted" and exit code 130, as the apps'.

Checkpoints (adapm runs; the default data has 313 batches per epoch on one process)::

    python examples/ctr/train.py --data data/ctr --epochs 2 --checkpoint-dir ck \
        --checkpoint-every 100 --max-batches 450            # stops in epoch 2, batch 137
    python examples/ctr/train.py --data data/ctr --epochs 2 --checkpoint-dir ck --resume

``--checkpoint-dir DIR`` writes a checkpoint (``Node.checkpoint``, atomic) every
``--checkpoint-every`` batches and when training ends: the tables with their AdaGrad state, the
dense parameters, every rank's own AdaGrad state of them (each rank its own key range), and in
the meta where training stands (epoch, batches done in it, rank 0's partial loss). ``--resume``
continues from there: the same batches follow (each epoch's order is a function of the seed,
the rank and the epoch), so on one process a resumed run gives exactly the numbers of an
uninterrupted one. It needs the same number of ranks as the run that wrote the checkpoint
(each rank's data share and dense optimizer state are its own), the same ``--seed``,
``--batch-size``, ``--dim``, ``--hidden`` and ``--min-count``, and the same data (the meta holds
the size and digest of train.tsv and test.tsv); anything else is refused before the node starts.
``--max-batches N`` stops after N batches in all (a time-boxed run, to be resumed if it has a
``--checkpoint-dir``). The default ``--checkpoint-every`` (1000 batches) suits click logs of
Criteo's size (its Kaggle set: about 88,000 batches an epoch on one process); an epoch of the
default generated data is shorter (313 batches on one process, 157 per rank on two), so there
only the checkpoint at the end is written unless ``--checkpoint-every`` is lowered.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
import types
import warnings

import criteo
import numpy as np
import torch
import torch.nn.functional as F
from model import WideAndDeep
from torch.utils.data import DataLoader, Dataset

import adapm
from adapm import CheckpointError, ConfigError
from adapm._argtypes import (
    int_in, non_negative_float, non_negative_int, positive_float, positive_int,
)
from adapm.apps.outputs import directory_problem
from adapm.apps.runner import (
    AppParser, HelpFormatter, check_flags, data_fingerprint, failure_exit, interrupt_once,
)
from adapm.trace import keys_argument

# Each dense key holds this many floats of the MLP's parameters (fewer keys to sync per round).
DENSE_KEY_FLOATS = 256
# Bounds of flags whose values reach C code: torch.manual_seed takes 64 bits; torch's thread
# pools are not made for millions of threads (set_num_threads(10**6) crashes at exit).
MAX_SEED = 2 ** 63 - 1
MAX_THREADS = 1024


# --- data ---------------------------------------------------------------------------------------


class ExampleSet(Dataset):
    """Examples by index, fetched a whole batch at a time (``__getitems__``: no per-example
    Python in the loader)."""

    def __init__(self, examples: criteo.Examples) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitems__(self, indices) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = self.examples.rows(np.asarray(indices))
        return (torch.from_numpy(rows.dense), torch.from_numpy(rows.categorical),
                torch.from_numpy(rows.labels))


def as_batch(batch):
    """The collate step: ``__getitems__`` already built the batch."""
    return batch


def batch_keys(batch, table_size: int) -> torch.Tensor:
    """A batch's adapm keys: its categorical indices in the deep table (keys from 0) and in the
    wide table (keys from ``table_size``)."""
    categorical = batch[1]
    return torch.cat([categorical.reshape(-1), categorical.reshape(-1) + table_size])


class EpochOrder(torch.utils.data.Sampler):
    """A rank's examples in a random order per epoch that depends on (seed, rank, epoch) only,
    from position ``start`` on: a resumed epoch goes on with the batches it had not trained."""

    def __init__(self, size: int, seed: int, rank: int) -> None:
        self.size, self.seed, self.rank = size, seed, rank
        self.epoch, self.start = 1, 0

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.rank, self.epoch]).permutation(self.size)
        return iter(order[self.start:].tolist())

    def __len__(self) -> int:
        return self.size - self.start


def loader(examples: criteo.Examples, opts, rank: int, collate) -> tuple[DataLoader, EpochOrder]:
    order = EpochOrder(len(examples), opts.seed, rank)
    return DataLoader(ExampleSet(examples), batch_size=opts.batch_size, sampler=order,
                      num_workers=opts.loader_workers, collate_fn=collate), order


# --- the two runs -------------------------------------------------------------------------------


class TimedWorker:
    """An adapm worker that adds up the time spent in its calls (``seconds``)."""

    _TIMED = ("pull", "push", "set", "intent", "advance_clock", "wait", "wait_sync")

    def __init__(self, worker) -> None:
        self._worker = worker
        self.seconds = 0.0

    def __getattr__(self, name):
        attr = getattr(self._worker, name)
        if name not in self._TIMED:
            return attr

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


class AdapmRun:
    """Rows in adapm; the dense parameters kept equal over the ranks by DenseSync (``--dense
    adapm``) or by torch's DistributedDataParallel over gloo (``--dense ddp``, under torchrun).

    Keys: the deep table, the wide table, the dense parameters (DenseSync's, or under DDP only
    written for checkpoints), then per rank a copy of that size for the rank's own AdaGrad
    state of them (written for checkpoints)."""

    def __init__(self, opts, table_size: int) -> None:
        from adapm.torch import DenseSync, Embedding, EmbeddingBag, IntentCollate, optim

        self.opts = opts
        torch.manual_seed(opts.seed)
        skeleton = WideAndDeep(torch.nn.Identity(), torch.nn.Identity(), opts.dim,
                               opts.hidden)
        dense_keys = DenseSync.keys_needed(skeleton.dense_parameters(), DENSE_KEY_FLOATS)
        world = adapm.Config.from_env(num_keys=1).world_size
        lengths = np.concatenate([np.full(table_size, 2 * opts.dim),  # weights, AdaGrad's sums
                                  np.full(table_size, 2),
                                  np.full((1 + world) * dense_keys, DENSE_KEY_FLOATS)])
        # Before the node starts: a checkpoint that does not fit fails alone, not in a job.
        self.resumed = resume_point(opts, world, table_size, lengths) if opts.resume else None
        self.node = adapm.init(num_keys=len(lengths), value_length=lengths,
                               trace_dir=opts.trace_dir, trace_keys=opts.trace_keys,
                               restore=opts.checkpoint_dir if opts.resume else None)
        self.rank, self.world = self.node.rank, self.node.world_size
        self.worker = TimedWorker(self.node.worker())
        init = "keep" if self.resumed else None
        deep = Embedding(table_size, opts.dim, worker=self.worker, scale=opts.init_scale,
                         seed=opts.seed, init=init or "normal")
        wide = EmbeddingBag(table_size, 1, mode="sum", worker=self.worker, offset=table_size,
                            init=init or "zeros")
        self.model = WideAndDeep(deep, wide, opts.dim, opts.hidden)
        self.model.load_state_dict(skeleton.state_dict(), strict=False)
        # On a GPU the tables stay in adapm's host memory: each batch's rows are pulled into
        # pinned memory and copied over; their indices stay on the host, where pulls need them.
        self.model.to(opts.device)
        self.index_device = torch.device("cpu")
        self.dense_params = self.model.dense_parameters()
        self.dense_keys = 2 * table_size + np.arange(dense_keys, dtype=np.int64)
        # This rank's AdaGrad state of the dense parameters, in checkpoints.
        self.state_keys = self.dense_keys + (1 + self.rank) * dense_keys
        if self.resumed:  # before DenseSync and DDP hand rank 0's parameters to every rank
            _load_flat(self.dense_params, self.worker.pull(self.dense_keys))
        self.forward = self.model
        self.sync = None
        if opts.dense == "adapm":
            self.sync = DenseSync(self.dense_params, worker=self.worker,
                                  offset=int(self.dense_keys[0]))
        else:
            # torch.distributed from torchrun's variables (MASTER_PORT; adapm took the next port).
            torch.distributed.init_process_group("gloo")
            self.forward = torch.nn.parallel.DistributedDataParallel(self.model)
        self.row_opt = optim.Adagrad([deep, wide], lr=opts.lr)
        self.dense_opt = torch.optim.Adagrad(self.dense_params, lr=opts.dense_lr)
        if self.resumed:
            self.row_opt.load_state_dict(self.resumed["row_optimizer"])
            sums = self.worker.pull(self.state_keys)
            at = 0
            for p in self.dense_params:
                state = self.dense_opt.state[p]
                state["sum"].copy_(torch.from_numpy(sums[at:at + p.numel()].copy())
                                   .reshape(p.shape))
                state["step"].fill_(self.resumed["dense_steps"])
                at += p.numel()
        self.collate = IntentCollate(as_batch, functools.partial(batch_keys,
                                                                 table_size=table_size))
        self.ahead = opts.ahead
        self.table_size = table_size

    def checkpoint(self, directory: str, meta: dict) -> None:
        """Collective: this rank's dense AdaGrad state (and under DDP rank 0's parameters)
        into its keys, then ``Node.checkpoint`` with ``meta`` (rank 0's is kept)."""
        state = self.dense_opt.state
        self.worker.set(self.state_keys, _flat(
            [state[p]["sum"] for p in self.dense_params], len(self.state_keys)))
        if self.sync is None and self.rank == 0:
            self.worker.set(self.dense_keys, _flat(self.dense_params, len(self.dense_keys)))
        steps = float(state[self.dense_params[0]]["step"])  # one step count for all of them
        # The rows' AdaGrad sums are in the checkpoint's keys: the meta takes the step counts.
        row_state = self.row_opt.state_dict(with_rows=False)
        # What a resumed run must match: the model's shape and the data (rank 0's meta is kept).
        model = {"table_size": self.table_size,
                 "data": data_contents(self.opts) if self.rank == 0 else None}
        self.node.checkpoint(directory, meta={**meta, **model, "row_optimizer": row_state,
                                              "dense_steps": steps})

    def batches(self, data: DataLoader):
        from adapm.torch import IntentLoader

        return IntentLoader(data, self.worker, ahead=self.ahead)

    def step(self, loss: torch.Tensor) -> None:
        loss.backward()
        self.row_opt.step()
        self.dense_opt.step()
        if self.sync is not None:
            self.sync.step()

    def zero_grad(self) -> None:
        self.row_opt.zero_grad()
        self.dense_opt.zero_grad()

    def barrier(self) -> None:
        if self.world > 1:
            self.node.barrier()

    def mark(self, label: str) -> None:
        self.node.trace_mark(label)

    def accesses(self) -> np.ndarray:
        """Keys this rank pulled and pushed so far: (remote pulls, remote pushes, all)."""
        s = self.node.stats()
        return np.array([s["remote_pull_keys"], s["remote_push_keys"],
                         s["remote_pull_keys"] + s["remote_push_keys"] + s["local_pull_keys"] +
                         s["waited_pull_keys"] + s["local_push_keys"]])

    def close(self, failed: bool) -> None:
        if self.forward is not self.model:
            torch.distributed.destroy_process_group()
        if failed:
            self.node._release()  # do not wait for peers in shutdown after a failure here
        else:
            self.node.shutdown()


class BaselineRun:
    """torch's own sparse tables and AdaGrad in one process: what adapm is compared with."""

    rank, world = 0, 1
    resumed = None  # no checkpoints (refused by main)

    def __init__(self, opts, table_size: int) -> None:
        # torch's sparse AdaGrad warns on every run that it skips its invariant checks.
        warnings.filterwarnings("ignore", message="Sparse invariant checks")
        torch.manual_seed(opts.seed)
        skeleton = WideAndDeep(torch.nn.Identity(), torch.nn.Identity(), opts.dim,
                               opts.hidden)
        deep = torch.nn.Embedding(table_size, opts.dim, sparse=True)
        torch.nn.init.normal_(deep.weight, std=opts.init_scale)
        wide = torch.nn.EmbeddingBag(table_size, 1, mode="sum", sparse=True)
        torch.nn.init.zeros_(wide.weight)
        self.model = WideAndDeep(deep, wide, opts.dim, opts.hidden)
        self.model.load_state_dict(skeleton.state_dict(), strict=False)
        self.model.to(opts.device)  # the whole model, tables included
        self.index_device = torch.device(opts.device)
        self.forward = self.model
        self.row_opt = torch.optim.Adagrad([deep.weight, wide.weight], lr=opts.lr)
        self.dense_opt = torch.optim.Adagrad(self.model.dense_parameters(), lr=opts.dense_lr)
        self.collate = as_batch

    def batches(self, data: DataLoader):
        return data

    def step(self, loss: torch.Tensor) -> None:
        loss.backward()
        self.row_opt.step()
        self.dense_opt.step()

    def zero_grad(self) -> None:
        self.row_opt.zero_grad()
        self.dense_opt.zero_grad()

    def barrier(self) -> None:
        pass

    def mark(self, label: str) -> None:
        pass

    def accesses(self) -> np.ndarray:
        return np.zeros(3, dtype=np.int64)

    def close(self, failed: bool) -> None:
        pass


# --- training -----------------------------------------------------------------------------------


def evaluate(run, examples: criteo.Examples, device, batch: int = 8192) -> dict:
    """Test logloss and AUC of the whole of ``examples`` (``run.model`` on ``device``)."""
    model = run.model
    model.eval()
    scores = np.empty(len(examples), dtype=np.float32)
    with torch.no_grad():
        for at in range(0, len(examples), batch):
            part = examples.rows(slice(at, at + batch))
            logits = model(torch.from_numpy(part.dense).to(device),
                           torch.from_numpy(part.categorical).to(run.index_device))
            scores[at:at + batch] = torch.sigmoid(logits).cpu().numpy()
    model.train()
    auc = criteo.auc(scores, examples.labels)
    # No AUC when the test file holds one class only: null in the JSON line, not NaN.
    return {"test_logloss": round(criteo.logloss(scores, examples.labels), 5),
            "test_auc": None if math.isnan(auc) else round(auc, 5)}


def progress(opts, rank: int, total: int, epoch: int):
    from tqdm import tqdm

    # auto: a bar on a terminal, also through adapm-run (its stderr a terminal: on_terminal).
    shown = rank == 0 and (opts.progress == "on" or
                           opts.progress == "auto" and adapm.config.on_terminal(sys.stderr))
    return tqdm(total=total, desc=f"epoch {epoch}", unit="batch", leave=False, file=sys.stderr,
                disable=not shown)


def train(run, opts, train_rows: criteo.Examples, test_rows: criteo.Examples) -> None:
    # Equal shares (the last world - 1 rows may go untrained): DDP needs every rank to take
    # the same number of steps, and checkpoints are collective at the same step on every rank.
    share = len(train_rows) // run.world
    mine = train_rows.rows(slice(run.rank, share * run.world, run.world))
    data, order = loader(mine, opts, run.rank, run.collate)
    per_epoch = -(-share // opts.batch_size)
    if run.resumed is not None and run.resumed["share"] != share:
        raise CheckpointError(f"checkpoint {opts.checkpoint_dir} was written training "
                              f"{run.resumed['share']} rows per rank, this run has {share}: "
                              f"other data?")
    at = run.resumed or {"epoch": 1, "batch": 0, "steps": 0, "loss_sum": 0.0, "seen": 0}
    if at["batch"] == per_epoch:  # the checkpoint closed its epoch
        at = {**at, "epoch": at["epoch"] + 1, "batch": 0, "loss_sum": 0.0, "seen": 0}
    steps, saved_at = at["steps"], at["steps"]
    stopped = None
    examples, accessed = 0, np.zeros(3, dtype=np.int64)
    for epoch in range(at["epoch"], opts.epochs + 1):
        first = at["batch"] if epoch == at["epoch"] else 0
        order.epoch, order.start = epoch, first * opts.batch_size
        loss_sum, seen = (at["loss_sum"], at["seen"]) if first else (0.0, 0)
        run.barrier()
        run.mark(f"epoch {epoch} start")
        start, adapm_before = time.perf_counter(), _adapm_seconds(run)
        accessed_before = run.accesses()
        bar = progress(opts, run.rank, len(data), epoch)
        batch = first
        for dense, categorical, labels in run.batches(data):
            dense, labels = dense.to(opts.device), labels.to(opts.device)
            categorical = categorical.to(run.index_device)
            run.zero_grad()
            loss = F.binary_cross_entropy_with_logits(run.forward(dense, categorical), labels)
            run.step(loss)
            loss_sum += loss.item() * len(labels)
            seen += len(labels)
            examples += len(labels)
            batch += 1
            steps += 1
            bar.update()
            if opts.checkpoint_dir and steps % opts.checkpoint_every == 0:
                run.checkpoint(opts.checkpoint_dir, _where(opts, run, share, epoch, batch,
                                                           steps, loss_sum, seen))
                saved_at = steps
            if opts.max_batches is not None and steps >= opts.max_batches:
                stopped = {"epoch": epoch, "batch": batch, "loss_sum": loss_sum, "seen": seen}
                break
        bar.close()
        remote_pulls, remote_pushes, accesses = run.accesses() - accessed_before
        accessed += (remote_pulls, remote_pushes, accesses)
        mine_seconds = _adapm_seconds(run) - adapm_before
        if stopped is not None and batch < per_epoch:
            break  # mid-epoch: no epoch line (a resumed run gives it)
        run.barrier()  # every rank's training of this epoch is done
        run.mark(f"epoch {epoch} end")
        seconds = time.perf_counter() - start
        if run.rank == 0:
            trained = (batch - first) * opts.batch_size if batch < per_epoch else \
                share - first * opts.batch_size
            record = {"epoch": epoch, "examples": share * run.world,
                      "train_seconds": round(seconds, 3),
                      "examples_per_s": round(trained * run.world / seconds, 1),
                      "train_logloss": round(loss_sum / max(seen, 1), 5),
                      **evaluate(run, test_rows, opts.device),
                      "adapm_seconds": round(mine_seconds, 3),
                      "remote_share": _share(remote_pulls + remote_pushes, accesses),
                      "world": run.world, "baseline": isinstance(run, BaselineRun)}
            if first:
                record["resumed_at_batch"] = first
            emit(record, _epoch_summary(record), opts.json)
        run.barrier()  # rank 0's evaluation is done
        if stopped is not None:
            break
    if opts.checkpoint_dir and steps != saved_at:  # where training ended
        where = stopped or {"epoch": min(epoch, opts.epochs), "batch": per_epoch,
                            "loss_sum": loss_sum, "seen": seen}
        run.checkpoint(opts.checkpoint_dir, _where(opts, run, share, where["epoch"],
                                                   where["batch"], steps,
                                                   where["loss_sum"], where["seen"]))
    final = {"rank": run.rank, "final": True, "examples": examples,
             "training_accesses": int(accessed[2]), "remote_pulls": int(accessed[0]),
             "remote_pushes": int(accessed[1]),
             "remote_share": _share(accessed[0] + accessed[1], accessed[2])}
    if stopped is not None:
        final["stopped_at"] = {"epoch": stopped["epoch"], "batch": stopped["batch"]}
    emit(final, _final_summary(final, opts.checkpoint_dir), opts.json)


def _where(opts, run, share: int, epoch: int, batch: int, steps: int, loss_sum: float,
           seen: int) -> dict:
    """A checkpoint's meta: where training stands (``batch``: batches done in ``epoch``) and
    what a resumed run must match."""
    return {"example": "ctr", "seed": opts.seed, "world_size": run.world,
            "batch_size": opts.batch_size, "dim": opts.dim, "hidden": list(opts.hidden),
            "min_count": opts.min_count, "share": share, "epoch": epoch, "batch": batch,
            "steps": steps, "loss_sum": loss_sum, "seen": seen}


def resume_point(opts, world: int, table_size: int, lengths: np.ndarray) -> dict:
    """The meta of the checkpoint in ``--checkpoint-dir``, checked against this run (its
    ranks, vocabulary size, keys' ``lengths`` and data files) before the node starts."""
    from adapm import checkpoint

    reader = checkpoint.load(opts.checkpoint_dir)
    meta = reader.meta
    where = f"checkpoint {reader.directory}"
    if meta.get("example") != "ctr" or meta.get("seed") != opts.seed or \
            meta.get("batch_size") != opts.batch_size:
        raise CheckpointError(f"{where} is not of this example with --seed {opts.seed} and "
                              f"--batch-size {opts.batch_size} (its meta: example "
                              f"{meta.get('example')!r}, seed {meta.get('seed')!r}, batch size "
                              f"{meta.get('batch_size')!r})")
    if meta.get("world_size") != world:
        raise CheckpointError(f"{where} was written by {meta.get('world_size')} ranks; resume "
                              f"it with as many (here {world}): each rank's data share and "
                              f"dense optimizer state are its own")
    mine = {"dim": opts.dim, "hidden": list(opts.hidden), "min_count": opts.min_count}
    differ = [f"--{flag.replace('_', '-')} {_flag_value(meta[flag])} (this run: "
              f"{_flag_value(value)})" for flag, value in mine.items()
              if flag in meta and meta[flag] != value]
    if differ:
        raise CheckpointError(f"{where} was trained with {', '.join(differ)}")
    if meta.get("data") is not None and meta["data"] != data_contents(opts):
        names = dict.fromkeys(entry[0] for entry in data_contents(opts) + meta["data"])
        changed = [name for name in names
                   if [e for e in meta["data"] if e[0] == name] !=
                   [e for e in data_contents(opts) if e[0] == name]]
        files = [os.path.join(opts.data, name) for name in changed]
        raise CheckpointError(f"{where} was trained on other data ({' and '.join(files)} "
                              f"differ{'s' if len(files) == 1 else ''} in size or content); "
                              f"resume on the same files")
    if meta.get("table_size", table_size) != table_size:
        raise CheckpointError(f"{where} holds tables of {meta['table_size']} rows, the "
                              f"vocabulary of this run's {opts.data}/train.tsv has {table_size} "
                              f"(other data?)")
    theirs = reader.lengths if reader.lengths is not None else \
        np.full(reader.num_keys, reader.uniform)
    if not np.array_equal(theirs, lengths):  # what a meta without the flags leaves to tell
        raise CheckpointError(f"{where} holds a model of another shape (another --dim, "
                              f"--hidden, --min-count or data?)")
    per_epoch = -(-meta["share"] // opts.batch_size)
    if meta["epoch"] > opts.epochs or (meta["epoch"] == opts.epochs and
                                       meta["batch"] >= per_epoch):
        raise CheckpointError(f"{where} has {meta['epoch']} epochs done; to continue, give "
                              f"--epochs above {meta['epoch']}")
    return meta


def _flag_value(value) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)


def data_contents(opts) -> list:
    """[file name, size, BLAKE2b digest] of train.tsv and test.tsv (the runner's
    data_fingerprint; without the directory, which may differ between hosts and runs): what a
    resumed run must read again. Hashed once a run."""
    return [list(entry) for entry in _contents(opts.data)]


@functools.lru_cache(maxsize=None)
def _contents(directory: str) -> tuple:
    files = types.SimpleNamespace(train=os.path.join(directory, "train.tsv"),
                                  test=os.path.join(directory, "test.tsv"))
    return tuple((name, size, digest) for _, name, size, digest in data_fingerprint(files))


def _flat(tensors, keys: int) -> np.ndarray:
    """Tensors' values back to back, zero-padded to ``keys`` dense keys (their packed layout)."""
    flat = np.zeros(keys * DENSE_KEY_FLOATS, dtype=np.float32)
    at = 0
    for t in tensors:
        flat[at:at + t.numel()] = t.detach().reshape(-1).cpu().numpy()
        at += t.numel()
    return flat


def _load_flat(params, flat: np.ndarray) -> None:
    at = 0
    with torch.no_grad():
        for p in params:
            p.copy_(torch.from_numpy(flat[at:at + p.numel()].copy()).reshape(p.shape))
            at += p.numel()


def emit(record: dict, summary: str, json_path) -> None:
    """A record's output, as the apps' (``adapm.apps.runner``): ``summary`` on stdout and the
    JSON line appended to ``json_path``; with ``--json -`` the JSON line on stdout and the
    summary on stderr. Each line in one write: ranks share the terminal, pipe or file, and
    ``print`` makes two writes (text, then newline) when Python runs unbuffered."""
    line = json.dumps(record)
    if json_path == "-":
        _write(sys.stdout, line)
        _write(sys.stderr, summary)
        return
    _write(sys.stdout, summary)
    if json_path:
        with open(json_path, "a") as f:  # O_APPEND: every rank's final line lands whole
            f.write(line + "\n")


def _write(stream, line: str) -> None:
    stream.write(line + "\n")
    stream.flush()


def _epoch_summary(r: dict) -> str:
    auc = "n/a (one class only in test.tsv)" if r["test_auc"] is None else \
        f"{r['test_auc']:.4f}"
    text = (f"epoch {r['epoch']}: {r['train_seconds']:.2f} s, {r['examples_per_s']:,.0f} "
            f"examples/s, train logloss {r['train_logloss']:.4f}, test logloss "
            f"{r['test_logloss']:.4f}, test AUC {auc}")
    if not r["baseline"]:
        text += (f", in adapm {r['adapm_seconds']:.2f} s, remote accesses "
                 f"{100 * r['remote_share']:.4f}%")
    if "resumed_at_batch" in r:
        text += f" (resumed at batch {r['resumed_at_batch']})"
    return text


def _final_summary(r: dict, checkpoint_dir) -> str:
    text = f"rank {r['rank']}: {r['examples']:,} examples trained"
    if r["training_accesses"]:
        text += (f", remote accesses {100 * r['remote_share']:.4f}% of "
                 f"{r['training_accesses']:,}")
    if "stopped_at" in r:
        text += (f"; stopped at epoch {r['stopped_at']['epoch']}, batch "
                 f"{r['stopped_at']['batch']} ")
        text += (f"(--resume goes on from the checkpoint in {checkpoint_dir})" if checkpoint_dir
                 else "(no checkpoint written: a run to resume needs --checkpoint-dir)")
    return text


def _share(part, whole) -> float:
    return float(part / whole) if whole else 0.0


def _adapm_seconds(run) -> float:
    worker = getattr(run, "worker", None)
    return worker.seconds if worker is not None else 0.0


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected widths like 256,128, got {text!r}") from None
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"widths must be >= 1, got {text!r}")
    return widths


def parser() -> argparse.ArgumentParser:
    p = AppParser(prog="examples/ctr/train.py", description=__doc__.split("\n")[0],
                  formatter_class=HelpFormatter)
    p.add_argument("--data", required=True, metavar="DIR",
                   help="directory with train.tsv and test.tsv (Criteo layout)")
    p.add_argument("--epochs", type=positive_int, default=1,
                   help="epochs to train (one is the rule on click logs; more overfit)")
    p.add_argument("--batch-size", type=int_in(1, sys.maxsize), default=512,
                   help="examples per batch and rank")
    p.add_argument("--dim", type=positive_int, default=16, help="width of the deep embeddings")
    p.add_argument("--hidden", type=_widths, default=(256, 128), metavar="W,W",
                   help="widths of the MLP's hidden layers")
    p.add_argument("--lr", type=positive_float, default=0.05,
                   help="AdaGrad's step size for the tables")
    p.add_argument("--dense-lr", type=positive_float, default=0.02,
                   help="AdaGrad's step size for the MLP and the wide layer")
    p.add_argument("--init-scale", type=non_negative_float, default=0.05,
                   help="deep embeddings start from N(0, scale^2); wide weights from 0")
    p.add_argument("--min-count", type=positive_int, default=2,
                   help="categorical values seen fewer times in train.tsv share one row")
    p.add_argument("--ahead", type=positive_int, default=8,
                   help="batches of intent ahead of training")
    p.add_argument("--loader-workers", type=non_negative_int, default=0,
                   help="DataLoader worker processes")
    p.add_argument("--threads", type=int_in(1, MAX_THREADS), default=1,
                   help="torch threads (torch.set_num_threads)")
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0,
                   help="seed of the model and data order")
    p.add_argument("--device", default="cpu",
                   help="device of the model: cuda keeps the adapm tables in host memory and "
                        "copies each batch's rows to the GPU (the baseline's tables go there)")
    p.add_argument("--dense", choices=("adapm", "ddp"), default="adapm",
                   help="keep the MLP equal over the ranks with adapm's DenseSync (asynchronous)"
                        " or torch's DistributedDataParallel (synchronous; needs torchrun)")
    p.add_argument("--baseline", action="store_true",
                   help="plain PyTorch in one process: nn.Embedding/EmbeddingBag(sparse=True)")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="append the JSON lines to FILE (rank 0's per epoch, every rank's at "
                        "the end); '-': to stdout, and the summary lines to stderr")
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help="rank 0's progress bar: on a terminal (auto), always, never")
    p.add_argument("--trace-dir", metavar="DIR", default=None,
                   help="record a parameter-placement trace there (adapm trace summary DIR)")
    p.add_argument("--trace-keys", type=keys_argument, default="all", metavar="KEYS",
                   help="keys the trace records: all, a sample size N, or k1,k2,...")
    p.add_argument("--max-batches", type=positive_int, default=None, metavar="N",
                   help="stop after N batches in all, counted from the first epoch (a "
                        "time-boxed run; resume it with --resume)")
    c = p.add_argument_group("checkpoints")
    c.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                   help="write a checkpoint there (replacing the last one atomically) every "
                        "--checkpoint-every batches and when training ends")
    c.add_argument("--checkpoint-every", type=positive_int, default=1000, metavar="N",
                   help="with --checkpoint-dir: every N batches (and at the end); an epoch of "
                        "the default generated data is 313 batches on one process")
    c.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir where it stopped")
    return p


def main(argv=None) -> int:
    p = parser()
    opts = p.parse_args(argv)
    if opts.dense == "ddp" and ("MASTER_ADDR" not in os.environ or opts.baseline):
        p.error("--dense ddp needs torchrun (torch.distributed's MASTER_ADDR and "
                "MASTER_PORT) and is not for --baseline")
    try:
        if torch.device(opts.device).type not in ("cpu", "cuda"):
            raise RuntimeError("not cpu or cuda")
    except RuntimeError:
        p.error(f"--device must be cpu or cuda[:n], got {opts.device!r}")
    if torch.device(opts.device).type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {opts.device}: torch sees no CUDA device here")
    # The directories' flags named in their errors (check_flags names the path only).
    for flag, path in (("--trace-dir", opts.trace_dir),
                       ("--checkpoint-dir", None if opts.resume else opts.checkpoint_dir)):
        problem = directory_problem(path)
        if problem:
            p.error(f"{flag} {problem}")
    # --resume and --baseline against the checkpoint flags, and the output paths (--json,
    # --trace-dir, --checkpoint-dir), as the apps check them: before the data is read.
    check_flags(p, opts)
    if opts.json and opts.json != "-":  # every rank, not only rank 0, appends its final line
        try:
            open(opts.json, "a").close()
        except OSError as exc:
            p.error(f"--json {opts.json}: cannot write: {exc.strerror}")
    torch.set_num_threads(opts.threads)
    interrupt_once()
    try:
        return _main(opts)
    except BaseException as exc:
        # Ctrl-C or another node's failure: one line, as the apps (the node, if any, was
        # released on the way: run.close)
        code = failure_exit(exc, "train.py")
        if code is None:
            raise
        return code


def _main(opts) -> int:
    world = 1 if opts.baseline else adapm.Config.from_env(num_keys=1).world_size
    train_path = os.path.join(opts.data, "train.tsv")
    try:
        vocabulary = criteo.build_vocabulary(train_path, opts.min_count)
        train_rows = criteo.read(train_path, vocabulary)
        if len(train_rows) < world:  # no rank may go without a share
            raise criteo.DataError(f"{train_path}: {len(train_rows)} example(s) for {world} "
                                   f"ranks: every rank trains a share of one at least")
        test_rows = criteo.read(os.path.join(opts.data, "test.tsv"), vocabulary)
    except criteo.DataError as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 2
    try:
        run = (BaselineRun if opts.baseline else AdapmRun)(opts, vocabulary.size)
    except (CheckpointError, ConfigError) as exc:
        # The checkpoint does not fit this run (or the launch is wrong): say so, no traceback.
        if adapm.config.debug():
            raise
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 2
    failed = True
    try:
        train(run, opts, train_rows, test_rows)
        failed = False
    except CheckpointError as exc:  # every rank finds the same: no peer waits for this one
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 2
    finally:
        run.close(failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
