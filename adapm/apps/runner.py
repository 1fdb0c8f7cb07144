"""The app runner shared by the native training apps (``python -m adapm.apps.kge|wv|mf``).

What every app gets from here:

- the common flags (``--epochs --batch-size --workers --management --channels --seed
  --eval-every --export --json --baseline --ahead``, ...) and their validation;
- the node: ``adapm.init`` under any launcher (or alone), or with ``--baseline`` the same
  kernels over a plain shared array in one process (:mod:`adapm.apps.baseline`);
- the split of the data: node r of N and its thread t train the part of global worker
  ``g = r * workers + t`` of ``N * workers``, so ``--baseline --workers N*W`` trains the same
  parts in the same order as N nodes of W threads;
- each worker's order of its points per epoch: random, or the task's ``epoch_order`` (MF's
  columnwise and DSGD schedules);
- one clock per mini-batch; intent for each batch (and its negative sample) signalled a fixed
  number of data points ahead (``--ahead``, the app's default: 1000 triples for KGE and 2000
  sentences for WV, as the paper; 100,000 entries for MF, see adapm.apps.mf), never tuned per
  task; keys a worker wants all epoch long (the task's ``standing_keys``: MF's rows) are
  signalled once per epoch for all its clocks;
- per epoch: a progress bar on rank 0 (tqdm, on a terminal), then a summary line on stdout and
  one JSON line, appended to ``--json FILE`` (on stdout with ``--json -``, the summary then on
  stderr), with
  ``epoch``, ``train_seconds`` (first worker start to last worker end over all nodes, the
  epoch's schedule included), ``points_per_s``, the task's unit and its rate (WV: ``words``,
  ``words_per_s``), ``loss``, the app's quality metrics when evaluated, and ``stats``: every
  node's ``stats()`` counted over the training phase of this epoch only (evaluation's pulls
  are not in it);
- export of the trained model on rank 0;
- checkpoints (``--checkpoint-dir D``, every ``--checkpoint-every N`` epochs and after the last:
  every key's value, optimizer state included, with the completed epoch count and the workers'
  random streams in the manifest's ``meta``) and ``--resume``, which starts from the checkpoint
  in D at the next epoch, on any number of nodes. With the same nodes and workers, a resumed run
  draws what the uninterrupted run would have drawn (one node with one worker computes the same
  numbers); with others, each worker's stream restarts from the seed.

An app is a *task* object (see :class:`Task`) and a per-thread *trainer*; the runner owns
threads, clocks, intent, timing, collectives and output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from typing import Optional, Protocol, Sequence

import numpy as np

import adapm

from .. import checkpoint as checkpoints
from .._argtypes import non_negative_int, positive_int, trace_keys
from .._native_loader import name_thread
from ..config import MANAGEMENT_VARIANTS
from ..errors import (
    AdaPMTimeout, CheckpointError, ConfigError, NodeFailure, PeerError, TransportError,
)
from .baseline import ArrayNode
from .outputs import directory_problem, file_problem
from .datafiles import DataError
from .exchange import Exchange, LocalExchange

# Batches per call of a trainer's native loop (Trainer.chunked): Python (progress, the loss
# sum, clocks) enters between calls. 64 MF batches of 1,000 entries: ~20 ms; 64 KGE batches of
# 100 triples (ComplEx d=100, 6 negatives a side): ~80 ms.
CHUNK_BATCHES = 64

# Counters whose per-epoch value is not a difference: means, recomputed from their weights.
_MEANS = {"mean_round_ms": "rounds", "mean_staleness_ms": "replica_reads"}
# Counters that are floats (seconds) and grow over the run: an epoch's line shows its own part.
_FLOAT_COUNTERS = ("engine_cpu_s", "access_wait_s")


class Plan(Protocol):
    """What a trainer prepared for one batch, ahead of time."""

    keys: np.ndarray         # the batch's keys, pulled when trained and signalled as intent
                             # (or only `intent_keys`, when a plan has them: the rest are the
                             # task's standing keys)
    sample_size: int         # negative sample size of the batch (0: none)


class Trainer(Protocol):
    """One worker thread's model code. Used by that thread only."""

    def plan(self, points: np.ndarray) -> Plan:
        """Prepare a batch of data points (cheap, called ``--ahead`` points in advance)."""

    def step(self, worker, plan: Plan, sample: Optional[int]) -> tuple:
        """Train one batch: pull, one native kernel call, push. Returns (loss sum, steps), or
        (loss sum, steps, units) for a task with a ``unit`` (e.g. words)."""

    # Optional: ``chunked(worker, ahead=0) -> run or None``, called at the start of each epoch
    # (``ahead``: the batches the per-batch path would plan ahead of its steps, for a trainer
    # whose plans and steps draw from one random stream): ``run(points, batch_size) -> (losses,
    # steps)`` or ``(losses, steps, units)`` trains the epoch's next batches, ``points``
    # (batch_size each, the last maybe fewer), or a prefix of them (at least one batch: the
    # runner gives the rest to the next call), in a few native calls with the GIL released and
    # returns each batch's loss sum (in order), the steps (and units); the runner then advances
    # one clock per batch. For a worker that acts on intent (``Worker.acts_on_intent``) the
    # trainer also needs ``intent_keys(points, batch_size) -> (keys, counts)``: each batch's
    # intent keys back to back and their number per batch (what ``plan(...).intent_keys``
    # would give), which the runner signals ahead, for the same batches in the same order as
    # its runs. None: the per-batch path (plan, intent, step).
    #
    # Optional, for a trainer that carries state from epoch to epoch (a random stream, a
    # learning-rate schedule): ``state() -> dict`` (JSON-serialisable; stored in checkpoints)
    # and ``resume(epochs_done, state)``: continue after ``epochs_done`` epochs, from ``state``
    # if the checkpoint has this worker's (same nodes and workers), else from the seed.


class Task(Protocol):
    """An app: its model's keys, data, trainer, evaluation and export."""

    name: str
    unit: Optional[str]                # what steps count besides points (e.g. "words"), or None
    num_keys: int                      # model keys [0, num_keys)
    value_length: object               # int, or an int array of num_keys lengths
    sampling: Optional[adapm.Sampling]

    def worker_points(self, part: int, parts: int) -> np.ndarray:
        """Data points (rows) of global worker ``part`` of ``parts``."""

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        """Initial values of ``keys`` (packed float32), a function of the seed and key only."""

    def trainer(self, batch_size: int, points: np.ndarray, epochs: int) -> Trainer:
        """A worker thread's trainer for its ``points`` (of worker_points), over ``epochs``."""

    def evaluate(self, worker, part: int, parts: int) -> list:
        """Additive evaluation sums of this node's part (pulls what it needs)."""

    def metrics(self, sums: np.ndarray) -> dict: ...

    # Optional: ``epoch_order(points, part, epoch, rng) -> points`` orders a worker's points for
    # an epoch (default: a random permutation), e.g. by column for matrix factorisation; and
    # ``standing_keys(points) -> keys``: keys a worker wants for every batch of an epoch,
    # signalled once per epoch for all its clocks rather than with each batch; and
    # ``after_evaluation(epoch, metrics, keep) -> (fields, stop)`` after each evaluation (extra
    # fields for the JSON line, and whether to stop training: early stopping), with
    # ``checkpoint_state() -> dict`` (JSON, kept in a checkpoint) and ``resume_state(dict)``
    # (given it back on --resume) for what it remembers across epochs, and
    # ``exported_epoch(last) -> epoch`` whose model export writes after an early stop at
    # ``last`` (default: the best epoch); and ``replica_updates``, the node's
    # Config.replica_updates (default "sum"); ``shape_flags``, the flags that set a key's
    # value length (named when a checkpoint's lengths differ from the run's).

    def export(self, worker, directory: str) -> None: ...


class AppParser(argparse.ArgumentParser):
    """The apps' argument parser: a usage error is one line (the flag, what is wrong, where the
    help is) and exit code 2, not argparse's usage block above it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """The apps' ``--help``: each flag's default, where it has one worth showing. Not for a
    required flag, a switch (``store_true``: off unless given), a flag without a default (None)
    or one whose help already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.required or action.default in (None, False, argparse.SUPPRESS)
                or "%(default)" in text or "default:" in text):
            return text
        return super()._get_help_string(action)


def add_common_flags(parser: argparse.ArgumentParser, *, ahead: int, batch_size: int,
                     epochs: int) -> None:
    common = parser.add_argument_group("runner (common to every app)")
    common.add_argument("--epochs", type=positive_int, default=epochs, help="epochs to train")
    common.add_argument("--batch-size", type=positive_int, default=batch_size,
                        help="data points per mini-batch (one clock each)")
    common.add_argument("--workers", type=positive_int, default=1,
                        help="worker threads per node")
    common.add_argument("--management", choices=MANAGEMENT_VARIANTS, default=None,
                        help="parameter management variant (default: adaptive)")
    common.add_argument("--channels", type=positive_int, default=None,
                        help="engine threads per node, the keys split over them "
                             "(Config.channels; default 1, or ADAPM_CHANNELS)")
    common.add_argument("--seed", type=non_negative_int, default=0,
                        help="seed of the data split, shuffles, initial values and samples")
    common.add_argument("--eval-every", type=non_negative_int, default=1,
                        help="evaluate every N epochs (0: only after the last)")
    common.add_argument("--ahead", type=non_negative_int, default=ahead,
                        help="signal intent this many data points ahead (the app's default "
                             "follows the paper; not a tuning knob)")
    common.add_argument("--export", metavar="DIR", default=None,
                        help="write the trained model to DIR (rank 0)")
    common.add_argument("--json", metavar="FILE", default=None,
                        help="append each epoch's JSON line to FILE (rank 0); '-': to stdout, "
                             "and the summary lines to stderr")
    common.add_argument("--baseline", action="store_true",
                        help="one process, the same kernels, data order and threads over a "
                             "plain shared array, without the parameter manager")
    common.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                        help="rank 0's progress bar: on a terminal (auto), always, never")
    common.add_argument("--trace-dir", metavar="DIR", default=None,
                        help="record a parameter-placement trace there (adapm.trace; "
                             "'adapm trace summary DIR' reads it)")
    common.add_argument("--trace-keys", type=trace_keys, default="all", metavar="KEYS",
                        help="keys the trace records: all, a sample size N, or k1,k2,...")
    common.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                        help="write a checkpoint (every key's value and the epoch reached) to "
                             "DIR, replacing the last one atomically; on a filesystem every "
                             "node shares")
    common.add_argument("--checkpoint-every", type=positive_int, default=1, metavar="N",
                        help="with --checkpoint-dir: every N epochs, and after the last")
    common.add_argument("--resume", action="store_true",
                        help="start from the checkpoint in --checkpoint-dir and continue at the "
                             "epoch after it (any number of nodes; --epochs counts from the "
                             "start of the first run)")


def check_flags(parser: argparse.ArgumentParser, opts: argparse.Namespace) -> None:
    """argparse errors for combinations of the common flags that cannot work, and for output
    paths that could not be written (checked now, not after the training: no wasted run)."""
    if opts.resume and not opts.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir (the checkpoint to resume from)")
    if opts.baseline and opts.checkpoint_dir:
        parser.error("--checkpoint-dir and --resume need the parameter manager, not --baseline")
    try:
        launched = adapm.Config.from_env(num_keys=1)
    except ConfigError as exc:
        # The launcher's environment, not a flag: one line naming it, without the usage.
        if adapm.config.debug():
            raise
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if opts.baseline and launched.world_size > 1:
        # Every rank would train the whole baseline, each writing the same outputs.
        parser.error("--baseline runs in one process; start it without a launcher")
    # Rank 0 writes the JSON lines and the export; every rank its trace and checkpoint part.
    lead = opts.baseline or launched.rank == 0
    trace_dir = getattr(opts, "trace_dir", None)
    problem = (lead and file_problem(getattr(opts, "json", None))) or \
        (lead and directory_problem(getattr(opts, "export", None), "--export")) or \
        directory_problem(trace_dir, "--trace-dir") or \
        _trace_problem(trace_dir, launched.rank, launched.world_size) or \
        (not opts.resume and directory_problem(getattr(opts, "checkpoint_dir", None),
                                               "--checkpoint-dir")) or \
        (not opts.resume and getattr(opts, "checkpoint_dir", None) and
         checkpoints.path_problem(opts.checkpoint_dir))
    if problem:
        parser.error(problem)


def _trace_problem(path, rank: int, world_size: int) -> Optional[str]:
    """Why --trace-dir ``path`` cannot take this rank's trace (it holds an earlier one), or
    None."""
    from ..trace.schema import earlier_trace

    earlier = earlier_trace(path, rank, world_size) if path else None
    if earlier is None:
        return None
    return (f"--trace-dir {path}: holds an earlier run's trace ({earlier}); choose a new "
            f"directory or remove that trace")


def run(task: Task, opts: argparse.Namespace, *, out=None) -> list[dict]:
    """Train ``task`` as ``opts`` say; returns rank 0's JSON records (other ranks: [])."""
    # numpy's BLAS (OpenBLAS) runs the evaluations' products on a thread per core and then
    # keeps those threads spinning for ~0.1 s after each call (its THREAD_TIMEOUT): into the
    # next epoch, on the cores of the workers, of this node and of the others on the machine
    # (2 cores, MF, evaluated every epoch: the baseline's epochs 0.149 s on average with them,
    # 0.106 s without). The cores are the workers'; one BLAS thread, the caller's, evaluates.
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _run(task, opts, sys.stdout if out is None else out)


def _run(task: Task, opts: argparse.Namespace, out) -> list[dict]:
    # A second Ctrl-C must not break the release after the first. The caller's handler comes
    # back at the end of a run that was not interrupted (a notebook that runs an app goes on as
    # it was); after a Ctrl-C the process is on its way out (exit 130) and adapm-run's copy of
    # the signal may still come, so SIGINT stays ignored.
    before = interrupt_once() if threading.current_thread() is threading.main_thread() else None
    try:
        return _run_node(task, opts, out)
    finally:
        if before is not None and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, before)


def _run_node(task: Task, opts: argparse.Namespace, out) -> list[dict]:
    try:
        node, resume = _start(task, opts)
    except _STARTUP_ERRORS as exc:
        # A configuration, checkpoint or launch problem: one line naming it, as the apps' data
        # errors, not a traceback (ADAPM_DEBUG=1 shows the traceback).
        if adapm.config.debug():
            raise
        print(f"{_prog(task)}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        records = _train(task, opts, node, out, resume)
    except BaseException as exc:
        if not opts.baseline:
            node._release()  # do not wait for peers in shutdown after a failure here
        # as the apps' own data errors: a checkpoint that turned out damaged when read, or
        # cannot be written, is the user's to fix
        code = failure_exit(exc, _prog(task), user_errors=(DataError, CheckpointError))
        if code is None:
            raise
        raise SystemExit(code) from None
    node.shutdown()
    return records


def failure_exit(exc: BaseException, prog: str, *, user_errors: tuple = ()) -> Optional[int]:
    """How a run (an app, an example) that raised ``exc`` ends when ``exc`` is no bug: its one
    line on stderr, and the exit code returned: 130 for Ctrl-C ("interrupted"; adapm-run passes
    it to every rank), 2 for ``user_errors`` (data, a checkpoint, the launch: the user's to
    fix), 1 for another node's failure (RUN_FAILURES: the error names the rank and what was
    awaited; each rank's traceback through the app's frames adds nothing). None, for the caller
    to raise ``exc`` on, for anything else and for everything under ADAPM_DEBUG=1."""
    if adapm.config.debug():
        return None
    if isinstance(exc, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return 130
    if isinstance(exc, user_errors):
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, RUN_FAILURES):
        print(f"{prog}: error: {exc} (ADAPM_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    return None


def lead_rank() -> bool:
    """Whether this process is rank 0 of its job (or runs alone), before any node starts: for
    the notices one rank prints. A bad launcher environment counts as rank 0 (the run's start
    then says what is wrong)."""
    try:
        return adapm.Config.from_env(num_keys=1).rank == 0
    except adapm.AdaPMError:
        return True


def _prog(task: Task) -> str:
    """The app's command, as its argument parser names it in its errors."""
    return f"python -m adapm.apps.{task.name}"


# Errors of a run's start that are the user's to fix (configuration, launcher, checkpoint,
# a taken port, a rank that never came): reported in one line.
_STARTUP_ERRORS = (ConfigError, CheckpointError, TransportError, AdaPMTimeout, NodeFailure)
# Errors of a running job that another node caused (it failed, stopped answering, or disagreed
# in a collective): reported in one line, exit 1 (by the apps, and by examples/ that import it).
RUN_FAILURES = (NodeFailure, PeerError, AdaPMTimeout, TransportError)


def interrupt_once():
    """From now on the first SIGINT raises KeyboardInterrupt and any later one is ignored:
    Ctrl-C on a terminal reaches each rank twice (from the terminal, and passed on by
    adapm-run), and the second must not interrupt the node's release with a traceback of its
    own. Main thread only; leaves a SIGINT that is ignored (a background job) or handled by
    someone else as it is. Returns the handler it replaced (None if it replaced none), for
    ``signal.signal`` to put back."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return None

    def interrupted(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, interrupted)


def _start(task: Task, opts):
    """The node (or the baseline's array) and the checkpoint to resume from, if any."""
    # Before the node starts: a missing or mismatched checkpoint fails alone, not in a job.
    resume = _resume_point(task, opts) if getattr(opts, "resume", False) else None
    if opts.baseline:
        return ArrayNode(task.num_keys, task.value_length, task.sampling, opts.seed), resume
    uniform, row = _uniform(task), _exchange_row(task)
    probe = adapm.Config.from_env(num_keys=1)
    exchange_keys = Exchange.num_keys(probe.world_size, row)
    lengths = task.value_length if uniform else np.concatenate(
        [task.value_length, np.full(exchange_keys, _REPORT_ROW, dtype=np.int64)])
    node = adapm.init(config=adapm.Config.from_env(
        num_keys=task.num_keys + exchange_keys, value_length=lengths,
        management=opts.management, sampling=task.sampling,
        channels=getattr(opts, "channels", None),
        replica_updates=getattr(task, "replica_updates", "sum"),
        trace_dir=getattr(opts, "trace_dir", None),
        trace_keys=getattr(opts, "trace_keys", "all")))
    return node, resume


# Value length of the exchange keys when the model's keys differ in length.
_REPORT_ROW = 1024


def _uniform(task: Task) -> bool:
    """Whether all of the task's keys have one value length."""
    return isinstance(task.value_length, (int, np.integer))


def _exchange_row(task: Task) -> int:
    """Value length of the exchange keys: the model's, or _REPORT_ROW under per-key lengths."""
    return int(task.value_length) if _uniform(task) else _REPORT_ROW


class _Resume:
    """Where a resumed run starts: the checkpoint, the epochs it completed, and the workers'
    states by global worker id (only when the job has the same nodes and workers)."""

    def __init__(self, reader: "checkpoints.Checkpoint", epochs_done: int,
                 states: dict) -> None:
        self.reader = reader
        self.epochs_done = epochs_done
        self.states = states


def _resume_point(task: Task, opts) -> _Resume:
    """The checkpoint in ``--checkpoint-dir``, checked against this run (CheckpointError)."""
    reader = checkpoints.load(opts.checkpoint_dir)
    meta = reader.meta
    where = f"checkpoint {reader.directory}"
    if meta.get("app") != task.name:
        raise CheckpointError(f"{where} was written by app {meta.get('app')!r}, not "
                              f"{task.name!r}")
    if meta.get("seed") != opts.seed:
        raise CheckpointError(f"{where} was trained with --seed {meta.get('seed')}, this run "
                              f"has --seed {opts.seed} (another data split and order)")
    if reader.num_keys < task.num_keys or meta.get("model_keys", task.num_keys) != task.num_keys:
        cause = "other data" + (", or another vocabulary: --min-count?" if task.name == "wv"
                                else "")
        raise CheckpointError(f"{where} holds a model of {meta.get('model_keys', reader.num_keys)}"
                              f" keys, this run's has {task.num_keys} ({cause})")
    mine = _data_contents(opts) if "data" in meta else None  # older checkpoints: no digests
    if mine is not None and meta["data"] != mine:
        flags = {entry[0] for entry in meta["data"] + mine}
        differ = sorted(f"--{flag}" for flag in flags
                        if [e for e in meta["data"] if e[0] == flag] != [e for e in mine
                                                                         if e[0] == flag])
        raise CheckpointError(f"{where} was trained on other data (the files of "
                              f"{', '.join(differ)} differ in size or content); resume on the "
                              "same files")
    theirs = (np.full(task.num_keys, reader.uniform) if reader.lengths is None
              else reader.lengths[:task.num_keys])
    if not np.array_equal(theirs, np.broadcast_to(task.value_length, (task.num_keys,))):
        flags = " or ".join(getattr(task, "shape_flags", ()))
        raise CheckpointError(f"{where}: the model's value lengths differ from this run's"
                              + (f" (another {flags}?)" if flags else ""))
    epochs_done = int(meta["epoch"])
    if epochs_done >= opts.epochs:
        raise CheckpointError(f"{where} has {epochs_done} epochs done; to continue, give "
                              f"--epochs above {epochs_done}")
    probe = adapm.Config.from_env(num_keys=1)
    same = [meta.get("world_size"), meta.get("workers")] == [probe.world_size, opts.workers]
    hook = getattr(task, "resume_state", None)
    if hook is not None:  # the task's checkpoint_state() back (MF: its best epoch so far)
        hook(meta.get("task", {}))
    return _Resume(reader, epochs_done, meta.get("states", {}) if same else {})


def _train(task: Task, opts, node, out, resume: Optional[_Resume] = None) -> list[dict]:
    workers = [node.worker() for _ in range(opts.workers)]
    lead = node.worker()  # the main thread's: initial values, exchanges, evaluation, export
    if opts.baseline:
        exchange = LocalExchange()
    else:
        exchange = Exchange(node, lead, task.num_keys, _exchange_row(task), _uniform(task))
        _same_data(node, exchange, opts)
    _initialise(task, node, lead, resume.reader if resume is not None else None)
    parts = node.world_size * opts.workers
    threads = [_Thread(task, opts, w, node.rank * opts.workers + t, parts)
               for t, w in enumerate(workers)]
    first = 1
    if resume is not None:
        first = resume.epochs_done + 1
        for t in threads:
            t.resume(resume.epochs_done, resume.states.get(str(t.part)))
    ahead_clocks = math.ceil(opts.ahead / opts.batch_size)
    records = []
    for epoch in range(first, opts.epochs + 1):
        node.barrier()
        node.trace_mark(f"epoch {epoch} start")
        before = node.stats()
        bar = _progress(opts, node, epoch, sum(t.num_batches for t in threads))
        cpu_before = time.process_time()
        runners = [threading.Thread(target=t.run_epoch, args=(epoch, ahead_clocks),
                                    name=f"adapm-worker-{i}") for i, t in enumerate(threads)]
        for r in runners:
            r.start()
        _watch(runners, threads, bar)
        for t in threads:
            if t.error is not None:
                raise t.error
        node.barrier()  # every node's training of this epoch is done
        node.trace_mark(f"epoch {epoch} end")
        stats = _delta(before, node.stats())
        # Where the CPU went (the PM's threads against the workers'): this process over the
        # training phase, and the worker threads alone.
        stats["process_cpu_s"] = round(time.process_time() - cpu_before, 3)
        stats["worker_cpu_s"] = round(sum(t.cpu for t in threads), 3)
        mine = {"start": min(t.started for t in threads), "end": max(t.ended for t in threads),
                "loss": sum(t.loss for t in threads), "steps": sum(t.steps for t in threads),
                "points": sum(t.points for t in threads),
                "units": sum(t.units for t in threads), "stats": stats}
        last = epoch == opts.epochs
        evaluate = last or (opts.eval_every and epoch % opts.eval_every == 0)
        if evaluate:
            mine["eval"] = [float(x) for x in task.evaluate(lead, node.rank, node.world_size)]
        every = exchange.allgather(mine)
        extra, stop = _after_evaluation(task, epoch, every, node.rank == 0) if evaluate else \
            ({}, False)
        if node.rank == 0:
            record = _record(task, epoch, every, evaluate)
            record.update(extra)
            records.append(record)
            _emit(record, out, opts.json)
        last = last or stop
        if getattr(opts, "checkpoint_dir", None) and (last or epoch % opts.checkpoint_every == 0):
            _checkpoint(task, opts, node, exchange, threads, epoch)
        if stop:
            if node.rank == 0:  # a notice, on stderr: stdout may be a pipe of JSON lines
                best = extra.get("best_epoch", epoch)
                exported = getattr(task, "exported_epoch", lambda last: best)(epoch)
                print(f"stopped early after epoch {epoch} of {opts.epochs}: the validation "
                      f"figure did not improve since epoch {best}"
                      + (f"; {opts.export} gets epoch {exported}'s model" if opts.export
                         else ""), file=sys.stderr, flush=True)
            break
    if opts.export and node.rank == 0:
        task.export(lead, opts.export)
    node.barrier()
    return records


def _after_evaluation(task: Task, epoch: int, every: list, rank0: bool) -> tuple[dict, bool]:
    """The task's optional ``after_evaluation(epoch, metrics, keep) -> (fields, stop)`` (e.g.
    early stopping on a validation split): every node calls it with the same gathered sums, so
    all stop at the same epoch; ``keep`` is true on rank 0, which exports."""
    hook = getattr(task, "after_evaluation", None)
    if hook is None:
        return {}, False
    return hook(epoch, task.metrics(np.sum([e["eval"] for e in every], axis=0)), rank0)


# The flags that name an app's data files (kge --data DIR; wv --corpus; mf --train/--test/--valid)
# and the files of a --data directory.
_DATA_FLAGS = ("data", "corpus", "train", "test", "valid")
_DATA_DIR_FILES = ("train.txt", "valid.txt", "test.txt")


def data_fingerprint(opts) -> list:
    """[flag, file name, size, BLAKE2b digest] of every data file the flags name (the name is
    for messages: the same data may lie at other paths on other hosts)."""
    out = []
    for flag in _DATA_FLAGS:
        path = getattr(opts, flag, None)
        if not isinstance(path, str):
            continue
        files = [os.path.join(path, name) for name in _DATA_DIR_FILES] \
            if os.path.isdir(path) else [path]
        for name in files:
            if not os.path.isfile(name):
                continue
            digest = hashlib.blake2b(digest_size=16)
            with open(name, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            out.append([flag, os.path.basename(name), os.path.getsize(name), digest.hexdigest()])
    return out


def _same_data(node, exchange, opts) -> None:
    """Collective: every rank compares its data files' fingerprints with rank 0's, and all
    raise DataError naming the ranks and files that differ (a job whose ranks read different
    files would train on a silent mix of them)."""
    every = exchange.allgather(data_fingerprint(opts))
    contents = [[(flag, size, digest) for flag, _, size, digest in fp] for fp in every]
    differ = [(rank, every[rank]) for rank, mine in enumerate(contents) if mine != contents[0]]
    if differ:
        rank, theirs = differ[0]
        show = lambda fp: "; ".join(f"--{f} {n}: {size} bytes, {h[:12]}" for f, n, size, h in fp)
        raise DataError(f"rank {rank} reads other data than rank 0 (ranks "
                        f"{[r for r, _ in differ]} differ): rank 0 has {show(every[0]) or 'none'}"
                        f", rank {rank} has {show(theirs) or 'none'}; every rank must read the "
                        f"same files")


def _checkpoint(task: Task, opts, node, exchange, threads, epoch: int) -> None:
    """Every key's value and what the run needs to continue after ``epoch`` (collective)."""
    states = {}
    for document in exchange.allgather({str(t.part): t.state() for t in threads}):
        states.update(document)
    node.checkpoint(opts.checkpoint_dir, meta={
        "app": task.name, "epoch": epoch, "seed": opts.seed, "world_size": node.world_size,
        "workers": opts.workers, "states": states, "model_keys": task.num_keys,
        "data": _data_contents(opts), "task": _task_state(task)})


def _task_state(task: Task) -> dict:
    """The task's optional ``checkpoint_state() -> dict`` (JSON: MF's early stopping)."""
    hook = getattr(task, "checkpoint_state", None)
    return hook() if hook is not None else {}


def _data_contents(opts) -> list:
    """[flag, size, digest] of each data file (data_fingerprint without the names, which may
    differ between hosts and runs): what a resumed run must read again. Hashed once a run."""
    key = tuple(sorted((f, str(getattr(opts, f, None))) for f in _DATA_FLAGS))
    if key not in _CONTENTS:
        _CONTENTS[key] = [[flag, size, digest] for flag, _, size, digest in data_fingerprint(opts)]
    return _CONTENTS[key]


_CONTENTS: dict = {}


class _Thread:
    """One worker thread's data, trainer and per-epoch results."""

    def __init__(self, task: Task, opts, worker, part: int, parts: int) -> None:
        self.task, self.opts, self.worker = task, opts, worker
        self.part = part  # the global worker id: shuffles depend on it, not on the node count
        self.points = 0
        self._data = task.worker_points(part, parts)
        # No batch holds more than the worker's points: a --batch-size beyond them sizes no
        # buffer (the trainers' scratch grows with it: 2 TiB asked for a 10^8 KGE batch), and
        # its batches are the same
        self.batch_size = max(1, min(opts.batch_size, len(self._data)))
        self._trainer = task.trainer(self.batch_size, self._data, opts.epochs)
        self.num_batches = math.ceil(len(self._data) / opts.batch_size)
        self.done = 0
        self.error: Optional[BaseException] = None
        self.started = self.ended = 0.0
        self.loss, self.steps, self.units = 0.0, 0, 0
        self.cpu = 0.0

    def state(self) -> dict:
        """What a checkpoint keeps of this worker: its trainer's state, its sampling stream."""
        trainer_state = getattr(self._trainer, "state", None)
        sampler = getattr(self.worker, "_sampler", None)
        return {"trainer": trainer_state() if trainer_state is not None else None,
                "sampler": sampler.rng_state() if sampler is not None else None}

    def resume(self, epochs_done: int, state: Optional[dict]) -> None:
        """Continue after ``epochs_done`` epochs, from ``state`` (of :meth:`state`) if given."""
        resume = getattr(self._trainer, "resume", None)
        if resume is not None:
            resume(epochs_done, state["trainer"] if state else None)
        sampler = getattr(self.worker, "_sampler", None)
        if state and state["sampler"] is not None and sampler is not None:
            sampler.set_rng_state(state["sampler"])

    def run_epoch(self, epoch: int, ahead: int) -> None:
        name_thread(threading.current_thread().name)
        try:
            self._run_epoch(epoch, ahead)
        except BaseException as exc:  # surfaced in the main thread
            self.error = exc

    def _run_epoch(self, epoch: int, ahead: int) -> None:
        w, trainer, bs = self.worker, self._trainer, self.batch_size
        self.started = time.time()  # the epoch's schedule is part of its time
        cpu = time.thread_time()
        rng = np.random.default_rng([self.opts.seed, 1, self.part, epoch])
        schedule = getattr(self.task, "epoch_order", None)
        if schedule is None:
            order = self._data[rng.permutation(len(self._data))]
        else:
            order = schedule(self._data, self.part, epoch, rng)
        self.done, self.loss, self.steps, self.units = 0, 0.0, 0, 0
        self.points = len(order)
        chunked = getattr(trainer, "chunked", None)
        run = chunked(w, ahead=ahead) if chunked is not None else None
        intent = getattr(w, "acts_on_intent", False)
        if run is not None and intent and not hasattr(trainer, "intent_keys"):
            run = None  # the trainer cannot say a run's intents: batch by batch
        if run is not None:
            self._run_chunks(run, order, bs, ahead if intent else None)
        else:
            self._run_batches(order, bs, ahead)
        # Every update of this epoch in the main copies (replica deltas too), so that
        # evaluation and export after the barrier read all of them.
        w.wait_sync()
        self.ended = time.time()
        self.cpu = time.thread_time() - cpu

    def _run_chunks(self, run, order: np.ndarray, bs: int, ahead: Optional[int]) -> None:
        """The epoch's batches through the trainer's native loop (see ``Trainer.chunked``):
        CHUNK_BATCHES batches a call, the GIL released inside; the clock advanced and the loss
        summed per batch, as the per-batch loop does. With ``ahead`` (a worker that acts on
        intent), each batch's intent is signalled ``ahead`` batches or more in advance, as the
        per-batch loop does, a call's worth at a time (``Trainer.intent_keys``); the calls are
        then shorter, so that the clock the engine reads lags a quarter of the lead at most."""
        w = self.worker
        chunk = CHUNK_BATCHES if ahead is None else max(1, min(CHUNK_BATCHES, ahead // 4))
        span = chunk * bs
        signal = self._intent_signaller(order, bs, ahead) if ahead is not None else None
        start = 0
        while start < len(order):
            if signal is not None:
                signal(start // bs + chunk + ahead)
            losses, steps, *units = run(order[start:start + span], bs)
            if not losses:
                raise RuntimeError("a trainer's run trained no batch")
            for loss in losses:
                self.loss += loss
                w.advance_clock()
            self.steps += steps
            self.units += sum(units)
            self.done += len(losses)
            start += len(losses) * bs  # a run may train a prefix of the batches given

    def _intent_signaller(self, order: np.ndarray, bs: int, ahead: int):
        """For the chunked loop: signals the epoch's standing keys, then the intents of batches
        0..ahead and waits for them (as the per-batch loop does); returns ``signal(upto)``,
        which signals every batch before ``upto`` not signalled yet, one clock each."""
        w, trainer = self.worker, self._trainer
        batches = -(-len(order) // bs)
        base = w.clock
        standing = getattr(self.task, "standing_keys", None)
        if standing is not None and batches:
            w.intent(standing(self._data), base, base + batches)
        done = 0

        def signal(upto: int) -> None:
            nonlocal done
            upto = min(upto, batches)
            if upto <= done:
                return
            keys, counts = trainer.intent_keys(order[done * bs:upto * bs], bs)
            at = 0
            for j, n in enumerate(counts.tolist(), start=done):
                w.intent(keys[at:at + n], base + j)
                at += n
            done = upto

        signal(ahead + 1)
        w.wait_sync()  # the first batches' keys are here before the first step
        return signal

    def _run_batches(self, order: np.ndarray, bs: int, ahead: int) -> None:
        """The epoch's batches one by one: plans and intents ``ahead`` batches in advance, one
        clock per batch."""
        w, trainer = self.worker, self._trainer
        batches = [order[i:i + bs] for i in range(0, len(order), bs)]
        base = w.clock
        plans: deque = deque()

        standing = getattr(self.task, "standing_keys", None)
        if standing is not None and batches:  # wanted for the whole epoch: signalled once
            w.intent(standing(self._data), base, base + len(batches))

        def plan(j: int) -> None:
            p = trainer.plan(batches[j])
            w.intent(getattr(p, "intent_keys", p.keys), base + j)
            sample = w.prepare_sample(p.sample_size, base + j) if p.sample_size else None
            plans.append((p, sample))

        for j in range(min(ahead + 1, len(batches))):
            plan(j)
        w.wait_sync()  # the first batches' keys are here before the first step
        for i in range(len(batches)):
            if i > 0 and i + ahead < len(batches):
                plan(i + ahead)
            p, sample = plans.popleft()
            result = trainer.step(w, p, sample)
            self.loss += result[0]
            self.steps += result[1]
            if len(result) > 2:
                self.units += result[2]
            w.advance_clock()
            self.done += 1


def _initialise(task: Task, node, lead, restored=None) -> None:
    """Every node sets the initial values of the model keys it owns at the start: its home keys
    (k % world_size == rank; under full_replication it also holds replicas of the others), from
    the task's initial values, or from checkpoint ``restored``."""
    keys = np.arange(node.rank, task.num_keys, node.world_size, dtype=np.int64)
    chunk = 1 << 16
    for i in range(0, len(keys), chunk):
        part = keys[i:i + chunk]
        rows = task.init_rows(part) if restored is None else restored.read(part)
        lead.set(part, rows.reshape(len(part), -1) if _uniform(task) else rows)
    lead.wait()
    node.barrier()


def _delta(before: dict, after: dict) -> dict:
    """Counters of one training phase: after - before; means re-weighted; shares recomputed."""
    out = {}
    for name, value in after.items():
        if name in _MEANS or name == "remote_access_share":
            continue
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            out[name] = int(value) - int(before.get(name, 0))
        elif name in _FLOAT_COUNTERS:
            out[name] = round(float(value) - float(before.get(name, 0.0)), 6)
        else:
            out[name] = value
    for name, weight in _MEANS.items():
        if name in after and weight in after:
            n = after[weight] - before.get(weight, 0)
            total = after[name] * after[weight] - before.get(name, 0.0) * before.get(weight, 0)
            out[name] = total / n if n else 0.0
    accessed = sum(out.get(k, 0) for k in ("local_pull_keys", "waited_pull_keys",
                                           "remote_pull_keys", "local_push_keys",
                                           "remote_push_keys"))
    remote = out.get("remote_pull_keys", 0) + out.get("remote_push_keys", 0)
    out["remote_access_share"] = remote / accessed if accessed else 0.0
    return out


def _record(task: Task, epoch: int, every: list, evaluated: bool) -> dict:
    seconds = max(e["end"] for e in every) - min(e["start"] for e in every)
    steps = sum(e["steps"] for e in every)
    record = {"epoch": epoch, "train_seconds": round(seconds, 4),
              "points_per_s": round(sum(e["points"] for e in every) / seconds, 1) if seconds else None,
              "loss": sum(e["loss"] for e in every) / steps if steps else None}
    unit = getattr(task, "unit", None)
    if unit:
        units = sum(e["units"] for e in every)
        record[unit] = units
        record[f"{unit}_per_s"] = round(units / seconds, 1) if seconds else None
    if evaluated:
        sums = np.sum([e["eval"] for e in every], axis=0)
        record.update(task.metrics(sums))
    record["stats"] = [e["stats"] for e in every]
    return record


def _summary(record: dict) -> str:
    """One human-readable line per epoch (the JSON line has everything)."""
    nodes = record["stats"]
    accessed = sum(s.get(k, 0) for s in nodes for k in (
        "local_pull_keys", "waited_pull_keys", "remote_pull_keys", "local_push_keys",
        "remote_push_keys"))
    remote = sum(s.get("remote_pull_keys", 0) + s.get("remote_push_keys", 0) for s in nodes)
    rates = [name for name in record if name.endswith("_per_s") and record[name]]
    parts = [f"epoch {record['epoch']}: {record['train_seconds']:.2f} s"]
    parts += [f"{record[name]:,.0f} {name[:-len('_per_s')]}/s" for name in rates]
    parts += [f"loss {record['loss']:.4f}" if record["loss"] is not None else ""]
    parts += [f"{name} {record[name]:.4f}" for name in QUALITY if name in record]
    parts.append(f"remote accesses {100 * remote / accessed if accessed else 0:.4f}%")
    if len(nodes) > 1:  # what the remote and late accesses cost: intent too late shows here
        waited = sum(s.get("access_wait_s", 0.0) for s in nodes)
        parts.append(f"waited for keys {waited:.2f} s")
    return ", ".join(p for p in parts if p)


# Quality metrics shown in the summary line, when an app reports them.
QUALITY = ("mrr", "hits@10", "analogy", "similarity", "rmse", "valid_rmse")


def _emit(record: dict, out, json_path: Optional[str]) -> None:
    """Rank 0's output of an epoch: its summary line on ``out`` (stdout) and its JSON line
    appended to ``json_path``; with ``--json -`` the JSON line on ``out`` instead and the
    summary on stderr, so that stdout holds only JSON lines (for a pipe into jq)."""
    line = json.dumps(record)
    if json_path == "-":
        print(line, file=out, flush=True)
        print(_summary(record), file=sys.stderr, flush=True)
        return
    print(_summary(record), file=out, flush=True)
    if json_path:
        with open(json_path, "a") as f:
            f.write(line + "\n")


def _progress(opts, node, epoch: int, total: int):
    if node.rank != 0 or opts.progress == "off":
        return None
    from tqdm import tqdm

    # auto: a bar on a terminal, also through adapm-run (its stderr a terminal: on_terminal).
    shown = opts.progress == "on" or adapm.config.on_terminal(sys.stderr)
    return tqdm(total=total, desc=f"epoch {epoch}", unit="batch", leave=False,
                disable=not shown, file=sys.stderr)


def _watch(runners: Sequence[threading.Thread], threads: Sequence[_Thread], bar) -> None:
    """Join the worker threads, updating rank 0's progress bar meanwhile."""
    shown = 0
    while True:
        alive = [r for r in runners if r.is_alive()]
        if not alive:
            break
        alive[0].join(0.2)
        if bar is not None:
            done = sum(t.done for t in threads)
            bar.update(done - shown)
            shown = done
    if bar is not None:
        bar.close()
