"""Word vectors on adapm: ``python -m adapm.apps.wv --corpus FILE``.

    python -m adapm.apps.wv generate data/wv --sentences 100000       # planted relations
    python -m adapm.apps.wv --corpus data/wv/corpus.txt \\
        --analogies data/wv/questions-words.txt --similarity data/wv/similarity.txt
    adapm-run -n 2 python -m adapm.apps.wv --corpus data/wv/corpus.txt   # two nodes

Skip-gram with negative sampling as word2vec and gensim train it (dynamic window, subsampling of
frequent words, ``--min-count``), by default with their plain SGD, the learning rate falling
linearly from ``--lr`` (0.025) to 1e-4 over the run (gensim's alpha and min_alpha); with
``--optimizer adagrad`` AdaGrad as the original AdaPM word2vec app (the accumulator lives in each
key's value, after the vector; measured on real text it learns less: ``bench/quality.py``). Keys: word
w's input vector is key w, its output vector key V + w (V words), so the output vectors form the
sampling domain [V, 2V), drawn with unigram^0.75 weights by the PM's ``naive`` sampling: from
the whole domain, a batch's draws signalled as intent with its other keys, so that they are
local when it trains (``--sampling local`` draws among the output vectors held on the node
instead: on 2 nodes it cost 2-6% of WordSim-353 per epoch against the baseline, naive none, at
the same speed: docs/quality.md). A data
point is a sentence (a line, cut every 10,000 tokens); sentences are split randomly across nodes
and threads, and intent is signalled ``--ahead`` sentences ahead (2000, as the paper).

One native kernel call per mini-batch of sentences (``native/kernels/wv.c``): the batch's
rows are pulled once, trained in order as word2vec trains them, and their changes pushed once;
a worker's batches run many to a native call with the GIL released (``WVTrainer.chunked``,
``native/kernels/wv_run.c``), with the same numbers as batch by batch. Each
pair's negatives are drawn from a pool of one PM sample per word of the batch (drawing a PM sample
per negative would copy ~30 rows per word); the pool follows the unigram^0.75 distribution, so
each negative does too, but the negatives of one batch share the pool's words.

Quality (``--analogies``, ``--similarity``): analogy accuracy and Spearman correlation as gensim
computes them (``wv_eval``). Export (``--export DIR``): ``vectors.txt`` (word2vec text format) and
``vectors.bin`` (word2vec binary format), the input vectors, as gensim's
``KeyedVectors.load_word2vec_format`` reads them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np

import adapm

from .. import _argtypes
from .._native_loader import load as _load
from . import runner, wv_data, wv_eval
from .baseline import ArrayWorker
from .datafiles import DataError, write_atomically

_kernels = _load("adapm._kernels")

# Initial values: input vectors uniform in [-1, 1) / dim with SGD, as gensim 4 draws them
# (word2vec.c's [-0.5, 0.5) / dim learned 2-3 points less analogy accuracy in 3 epochs on the
# generated corpus, docs/quality.md), and in [-0.5, 0.5) / dim with AdaGrad, the original
# AdaPM app's; output vectors zero; AdaGrad accumulators at that app's 1e-6 (SGD leaves them).
INIT_ACCUMULATOR = 1e-6
# word2vec's floor of the decayed learning rate, as a fraction of the starting one (AdaGrad).
MIN_LR_FRACTION = 1e-4
# gensim's min_alpha: SGD's learning rate falls linearly from --lr to this over all epochs.
MIN_SGD_LR = 1e-4
_INIT_BLOCK = 4096  # keys per deterministic block of initial values


# Beyond this many nodes plain SGD merges replica updates averaged (see below).
SUM_UP_TO_NODES = 4


def default_replica_updates(sgd: bool, world_size: int) -> str:
    """The default of --replica-updates. Plain SGD on rows that many nodes train at once
    overshoots when their stale steps are summed: 8 nodes diverged (docs/benchmarks.md, the
    16-core section; docs/quality.md, "replica updates"), so beyond SUM_UP_TO_NODES nodes an
    owner averages them (local SGD's model average). Up to 4 nodes the sum was stable and
    learned the most per epoch, and averaging cost quality (at 2 nodes WordSim-353 5-8% below
    the baseline against 1-2% above summed). AdaGrad damps its own steps: always summed."""
    return "average" if sgd and world_size > SUM_UP_TO_NODES else "sum"


@dataclass
class _Plan:
    keys: np.ndarray      # the batch's distinct keys, in order of first use
    in_rows: np.ndarray   # per position: row of its input vector in keys
    out_rows: np.ndarray  # per position: row of its output vector
    windows: np.ndarray   # per position: reduced window
    ends: np.ndarray      # per sentence: exclusive end in positions
    words: int            # words of the batch before subsampling
    sample_size: int      # the negative pool: one draw per position


class WVTask:
    """The WV app as a runner task (see :class:`adapm.apps.runner.Task`)."""

    name = "wv"
    shape_flags = ("--dim", "--optimizer")  # what sets a key's value length (resume names them)
    unit = "words"

    def __init__(self, corpus: wv_data.Corpus, opts: argparse.Namespace) -> None:
        self.corpus = corpus
        self.dim, self.window, self.neg = opts.dim, opts.window, opts.neg
        self.lr, self.seed = opts.lr, opts.seed
        self.sgd = getattr(opts, "optimizer", "sgd") == "sgd"
        self.replica_updates = getattr(opts, "replica_updates", None) or \
            default_replica_updates(self.sgd, adapm.Config.from_env(num_keys=1).world_size)
        V = self.vocab_size = len(corpus.words)
        self.num_keys = 2 * V
        # A row is [vector | AdaGrad accumulator]; SGD keeps no accumulator, so its rows are the
        # vector alone: half the bytes every pull, push, relocation and replica sync moves.
        self.value_length = self.dim if self.sgd else 2 * self.dim
        self.sampling = adapm.Sampling(V, 2 * V, weights=corpus.counts ** 0.75,
                                       scheme=getattr(opts, "sampling", "naive"),
                                       seed=opts.seed)
        self.keep = wv_data.keep_probabilities(corpus.counts, opts.sample)
        self.starts, self.ends = corpus.starts, corpus.ends
        self.analogies = opts.analogy_questions
        self.similarity = opts.similarity_pairs

    def worker_points(self, part: int, parts: int) -> np.ndarray:
        """A random split of the sentences: the same for a seed, whatever the node count."""
        order = np.random.default_rng([self.seed, 2]).permutation(self.corpus.num_sentences)
        return np.sort(np.array_split(order, parts)[part])

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        """The initial values (see INIT_ACCUMULATOR); a function of the seed and key."""
        d, V = self.dim, self.vocab_size
        half_width = 1.0 if self.sgd else 0.5
        rows = np.zeros((len(keys), self.value_length), dtype=np.float32)
        rows[:, d:] = INIT_ACCUMULATOR  # AdaGrad's (SGD's rows end at the vector)
        inputs = np.flatnonzero(keys < V)
        blocks = keys[inputs] // _INIT_BLOCK
        for block in np.unique(blocks):  # a loop over blocks of keys, not over keys
            mine = inputs[blocks == block]
            rng = np.random.default_rng([self.seed, 3, int(block)])
            values = (rng.random((_INIT_BLOCK, d)) * 2.0 - 1.0) * half_width / d
            rows[mine, :d] = values.astype(np.float32)[keys[mine] % _INIT_BLOCK]
        return rows.reshape(-1)

    def trainer(self, batch_size: int, points: np.ndarray, epochs: int) -> "WVTrainer":
        return WVTrainer(self, points, epochs, batch_size)

    # --- evaluation and export ---------------------------------------------------------------

    def vectors(self, worker) -> np.ndarray:
        """The input vectors of all words (no optimizer state), pulled through ``worker``."""
        V, d = self.vocab_size, self.dim
        out = np.empty((V, d), dtype=np.float32)
        chunk = 1 << 15
        for i in range(0, V, chunk):
            keys = np.arange(i, min(i + chunk, V), dtype=np.int64)
            out[i:i + len(keys)] = worker.pull(keys).reshape(len(keys), -1)[:, :d]
        return out

    def evaluate(self, worker, part: int, parts: int) -> list:
        """[analogies right, answered, Spearman (part 0), 1 (part 0)]: summed over parts."""
        if not self.analogies and not self.similarity:
            return [0.0, 0.0, 0.0, 0.0]
        vectors = self.vectors(worker)
        right = answered = 0
        if self.analogies:
            mine = [q for _, qs in self.analogies for q in qs][part::parts]
            right, answered = wv_eval.analogy_counts(vectors, self.corpus.words, mine)
        rho, flag = 0.0, 0.0
        if self.similarity and part == 0:
            rho, _ = wv_eval.similarity_spearman(vectors, self.corpus.words, self.similarity)
            flag = 1.0
        return [float(right), float(answered), rho, flag]

    def metrics(self, sums: np.ndarray) -> dict:
        out = {}
        if self.analogies:
            out["analogy"] = sums[0] / sums[1] if sums[1] else float("nan")
            out["analogy_questions"] = int(sums[1])
        if self.similarity:
            out["similarity"] = float(sums[2] / sums[3]) if sums[3] else float("nan")
        return out

    def export(self, worker, directory: str) -> None:
        write_word2vec(directory, self.corpus.words, self.vectors(worker))


class WVTrainer:
    """One worker thread's batches: buffers grown as needed, one kernel call per batch; or many
    batches in two native calls (:meth:`chunked`)."""

    def __init__(self, task: WVTask, points: np.ndarray, epochs: int,
                 batch_size: int = 64) -> None:
        self.task = task
        self.batch_size = batch_size
        # Seeded by the part's first sentence: a part draws the same streams whatever the node
        # count (parts are disjoint, so no two threads share a stream).
        self.rng = np.random.default_rng([task.seed, 4, int(points[0]) if len(points) else 0])
        lengths = task.ends[points] - task.starts[points]
        self.epoch_words = int(lengths.sum())
        self.epoch_batches = -(-len(points) // batch_size)
        self.total_words = max(1, self.epoch_words * epochs)  # for the learning-rate decay
        self.done_words = 0
        self.values = np.empty(0, dtype=np.float32)
        self.updates = np.empty(0, dtype=np.float32)
        self.row_of = np.full(task.num_keys, -1, dtype=np.int32)  # native scratch, key -> row
        self._chunked: Optional[dict] = None  # the epoch's chunked run (chunked, intent_keys)

    def state(self) -> dict:
        """For checkpoints: the random stream (words seen follow from the epochs done)."""
        return {"rng": self.rng.bit_generator.state}

    def resume(self, epochs_done: int, state: Optional[dict]) -> None:
        """Continue after ``epochs_done`` epochs: the learning rate where it was, and the
        random stream where it was if ``state`` has it."""
        self.done_words = epochs_done * self.epoch_words
        if state is not None:
            self.rng.bit_generator.state = state["rng"]

    def plan(self, points: np.ndarray) -> _Plan:
        """Subsampling, windows and the batch's rows in one native call (wv_plan)."""
        task = self.task
        starts = task.starts[points]
        lengths = task.ends[points] - starts
        total = int(lengths.sum())
        rows = np.empty((3, total), dtype=np.int64)  # in_rows, out_rows, windows
        ends = np.empty(len(points), dtype=np.int64)
        keys = np.empty(2 * total, dtype=np.int64)
        n, nk = _kernels.wv_plan(task.corpus.tokens, starts, lengths, task.keep, task.window,
                                 int(self.rng.integers(0, 1 << 63)), self.row_of, rows[0],
                                 rows[1], rows[2], ends, keys)
        return _Plan(keys[:nk], rows[0, :n], rows[1, :n], rows[2, :n], ends, total,
                     n if task.neg and n else 0)

    def _buffers(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        width = self.task.value_length
        if len(self.values) < rows * width:
            self.values = np.empty(2 * rows * width, dtype=np.float32)
            self.updates = np.empty_like(self.values)
        return (self.values[:rows * width].reshape(rows, width),
                self.updates[:rows * width].reshape(rows, width))

    def _lr(self, progress):
        """The learning rate at ``progress`` (words done over all epochs' words; a float or an
        array, the same float64 arithmetic either way)."""
        task = self.task
        if task.sgd:  # gensim's alpha: linear from lr to min_alpha
            return np.maximum(MIN_SGD_LR, task.lr - (task.lr - MIN_SGD_LR) * progress)
        return task.lr * np.maximum(MIN_LR_FRACTION, 1.0 - progress)

    def step(self, worker, plan: _Plan, sample: Optional[int]) -> tuple[float, int, int]:
        drawn = drawn_values = None
        if plan.sample_size:
            drawn, drawn_values = worker.pull_sample(sample)
        lr = float(self._lr(self.done_words / self.total_words))
        seed = int(self.rng.integers(0, 1 << 63))
        loss, pairs = self._train(worker, plan, drawn, drawn_values, lr, seed)
        self.done_words += plan.words
        return loss, pairs * (1 + self.task.neg), plan.words

    def _train(self, worker, plan: _Plan, drawn, drawn_values, lr: float,
               seed: int) -> tuple[float, int]:
        """One batch through the worker's pull and push: its pool (``drawn``, with its values
        as pulled), the kernel, the updates pushed."""
        task = self.task
        nk = len(plan.keys)
        extra_keys = plan.keys[:0]
        pool = np.empty(0, dtype=np.int64)
        if drawn is not None:
            pool = np.empty(len(drawn), dtype=np.int64)
            extra = np.empty((2, len(drawn)), dtype=np.int64)  # keys, first drawn at
            # Room for every drawn row after the batch's: the merge copies the extra keys'
            # rows there in its GIL-released call (a numpy copy held the GIL ~30 us a batch).
            values, updates = self._buffers(nk + len(drawn))
            ne = _kernels.wv_merge_pool(plan.keys, drawn, self.row_of, pool, extra[0], extra[1],
                                        drawn_values=drawn_values, extra_values=values[nk:])
            extra_keys = extra[0, :ne]
            values, updates = values[:nk + ne], updates[:nk + ne]
        else:
            values, updates = self._buffers(nk)
        worker.pull(plan.keys, out=values[:nk])
        loss, pairs = _kernels.wv_train_batch(task.dim, values, updates, plan.in_rows,
                                              plan.out_rows, plan.windows, plan.ends, pool,
                                              task.neg, lr, seed, task.sgd, task.value_length)
        keys = np.concatenate([plan.keys, extra_keys]) if len(extra_keys) else plan.keys
        worker.push(keys, updates)
        return loss, pairs

    # --- many batches per native call ----------------------------------------------------------

    def _epoch_seeds(self, ahead: int) -> tuple[np.ndarray, np.ndarray]:
        """Each batch's plan and train seeds for an epoch, drawn from the trainer's stream in
        the order the per-batch path draws them (the runner plans ``ahead`` batches ahead of
        its steps: plans 0..ahead, then a step and the next plan in turn), in one draw: the
        same numbers, and the stream left where that path leaves it."""
        n = self.epoch_batches
        if n == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        draws = self.rng.integers(0, 1 << 63, size=2 * n)
        first = min(ahead, n - 1) + 1  # plans before the first step
        i = np.arange(n)
        step_at = first + i + np.clip(np.minimum(i, n - 1 - ahead), 0, None)
        plan_at = np.arange(n)
        plan_at[first:] = step_at[np.arange(first, n) - ahead] - 1  # plan i + ahead before step i
        return draws[plan_at], draws[step_at]

    def _plan_run(self, worker, points: np.ndarray, seeds: tuple, first: int) -> "_Run":
        """Batches ``first``.. of the epoch (``points``, batch_size each) planned in one native
        call, and their pools drawn, batch after batch, from the worker's sampling stream
        (``sample_keys``: what prepare_sample and pull_sample draw)."""
        task, bs = self.task, self.batch_size
        starts = task.starts[points]
        lengths = task.ends[points] - starts
        nb = -(-len(points) // bs)
        table = np.zeros((nb, _kernels.WV_BATCH_COLUMNS), dtype=np.int64)
        table[:, 0] = bs
        if nb:
            table[-1, 0] = len(points) - bs * (nb - 1)
        table[:, 1] = seeds[0][first:first + nb]
        table[:, 2] = seeds[1][first:first + nb]
        total = int(lengths.sum())
        rows = np.empty((3, total), dtype=np.int64)
        ends = np.empty(len(points), dtype=np.int64)
        keys = np.empty(2 * total, dtype=np.int64)
        _kernels.wv_plan_run(task.corpus.tokens, starts, lengths, task.keep, task.window, table,
                             self.row_of, rows, ends, keys)
        positions = table[:, 3]
        pools = positions if task.neg else np.zeros_like(positions)
        samples = np.empty(int(pools.sum()), dtype=np.int64)
        at = 0
        for n in pools.tolist():  # one draw per batch, as the per-batch path's
            if n:
                worker.sample_keys(n, 1, out=samples[at:at + n])
                at += n
        words = np.add.reduceat(lengths, np.arange(0, len(points), bs)) if nb else lengths
        return _Run(table, rows, ends, keys, samples, pools, words)

    def intent_keys(self, points: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """For a chunked run on a node that acts on intent (see :meth:`chunked`): plans the
        epoch's next batches (``points``), draws their pools and keeps both for the run; returns
        each batch's keys and pool back to back and their number per batch, for the intent the
        per-batch path signals (its plan's keys, then prepare_sample's draws)."""
        state = self._chunked
        if state is None or batch_size != self.batch_size:
            raise RuntimeError("intent_keys: call chunked(worker) for the epoch first, with "
                               "this trainer's batch size")
        run = self._plan_run(state["worker"], points, state["seeds"], state["planned"])
        state["planned"] += len(run.table)
        state["queue"].append(run)
        nk, nd = run.table[:, 4], run.pools
        k0, d0 = (np.cumsum(nk) - nk).tolist(), (np.cumsum(nd) - nd).tolist()
        parts = []
        for b, (k, d) in enumerate(zip(nk.tolist(), nd.tolist())):  # a batch's keys, its pool
            parts += [run.keys[k0[b]:k0[b] + k], run.samples[d0[b]:d0[b] + d]]
        return (np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)), nk + nd

    def chunked(self, worker, ahead: int = 0):
        """A ``run(points, batch_size) -> (losses, steps, words)`` that trains many batches
        in two native calls with the GIL released (per batch what plan and step do, with the
        same arithmetic and the same random numbers: the trainer's seeds drawn in the per-batch
        path's order, for a runner that plans ``ahead`` batches ahead, and each batch's pool from
        the worker's sampling stream, ``sample_keys``), over the baseline's plain shared array
        (``ArrayWorker.table``) or a node's store (``Worker.native_rows``). On a node that acts
        on intent, the runner signals each batch's keys ahead through :meth:`intent_keys`, which
        plans the batches then; the run trains what it planned. Call once per epoch, before the
        epoch's first batch. None (the per-batch path) without rows, and on a node of a
        multi-node job under ``local`` sampling (drawn among the keys held when pulled, and
        pinned: a run cannot draw ahead). Over a store, a batch with a key held elsewhere goes
        through the worker's pull and push, with its plan and pool as made."""
        task = self.task
        if isinstance(worker, ArrayWorker):
            data, offsets, lens = worker.table()
            rows = None
            intent = False
        else:
            rows = worker.native_rows()
            intent = worker.acts_on_intent
            if rows is None or (intent and task.sampling.scheme != "naive"):
                self._chunked = None
                return None
        seeds = self._epoch_seeds(ahead)
        state = self._chunked = {"worker": worker, "seeds": seeds, "planned": 0,
                                 "queue": deque()}
        width, neg = task.value_length, task.neg
        scratch: dict = {}

        def buffer(name: str, n: int, dtype) -> np.ndarray:
            if name not in scratch or len(scratch[name]) < n:
                scratch[name] = np.empty(n, dtype=dtype)
            return scratch[name][:n]

        def train(run: "_Run", first: int, last: int) -> tuple[list, int, int]:
            """Batches [first, last) of ``run``, any that stops the native loop through the
            worker."""
            nb = len(run.table)
            lrs = self._lr((self.done_words + run.words_before(first, last)) / self.total_words)
            losses = buffer("losses", nb, np.float64)
            counts = buffer("counts", 2 * nb, np.int64)
            big = int((run.table[:, 4] + run.pools).max()) if nb else 0
            values = buffer("values", big * width, np.float32)
            updates = buffer("updates", big * width, np.float32)
            iscratch = buffer("iscratch", 4 * big, np.int64)
            all_lrs = np.zeros(nb)
            all_lrs[first:last] = lrs
            out: list = []
            at = first
            while at < last:
                if rows is None:
                    done = _kernels.wv_train_table(
                        task.dim, neg, task.sgd, run.table, run.rows, run.ends, run.keys,
                        run.samples, all_lrs, data, offsets, lens, self.row_of, iscratch,
                        values, updates, losses, counts, at, last, width)
                    stop = left = 0
                else:
                    left_keys = buffer("left_keys", big, np.int64)
                    left_rows = buffer("left_rows", big * width, np.float32)
                    done, stop, left = _kernels.wv_train_rows(
                        task.dim, neg, task.sgd, run.table, run.rows, run.ends, run.keys,
                        run.samples, all_lrs, rows, left_keys, left_rows, self.row_of,
                        iscratch, values, updates, losses, counts, at, last, width)
                trained = slice(at, at + done)
                pulled = int(run.table[trained, 4].sum() + run.pools[trained].sum())
                worker.count_accesses(pulled, int(counts[2 * at + 1:2 * (at + done):2].sum()))
                out += [(float(loss), int(pairs)) for loss, pairs in
                        zip(losses[trained].tolist(), counts[2 * at:2 * (at + done):2].tolist())]
                at += done
                if stop == _kernels.WV_STOP_PUSH:
                    worker.push(left_keys[:left], left_rows[:left * width].reshape(left, width))
                elif stop == _kernels.WV_STOP_PULL:
                    plan, drawn = run.batch(at)
                    drawn_values = worker.pull(drawn) if drawn is not None else None
                    out.append(self._train(worker, plan, drawn, drawn_values,
                                           float(all_lrs[at]), int(run.table[at, 2])))
                    at += 1
            words = int(run.words[first:last].sum())
            self.done_words += words
            return [loss for loss, _ in out], sum(p for _, p in out) * (1 + neg), words

        def run(points: np.ndarray, batch_size: int) -> tuple[list, int, int]:
            if batch_size != self.batch_size:
                raise ValueError(f"batches of {batch_size} sentences; this trainer plans "
                                 f"{self.batch_size}")
            if not intent:
                planned = self._plan_run(worker, points, state["seeds"], state["planned"])
                state["planned"] += len(planned.table)
                return train(planned, 0, len(planned.table))
            # What intent_keys planned, in order (a run may span two of its calls).
            losses, steps, words = [], 0, 0
            need = -(-len(points) // batch_size)
            queue = state["queue"]
            while need:
                if not queue:
                    raise RuntimeError("a chunked run on a node that acts on intent needs its "
                                       "batches' intent_keys first")
                head = queue[0]
                last = min(len(head.table), head.cursor + need)
                more = train(head, head.cursor, last)
                losses += more[0]
                steps += more[1]
                words += more[2]
                need -= last - head.cursor
                head.cursor = last
                if head.cursor == len(head.table):
                    queue.popleft()
            return losses, steps, words

        return run


@dataclass
class _Run:
    """A run of planned batches (wv_plan_run's outputs, see native/kernels/wv_run.h), their pools
    and words; ``cursor``: the batches trained so far."""
    table: np.ndarray    # (batches, WV_BATCH_COLUMNS): sentences, seeds, positions, keys
    rows: np.ndarray     # (3, cap): in_rows, out_rows, windows, batch after batch
    ends: np.ndarray     # per sentence: its end among its batch's positions
    keys: np.ndarray     # the batches' distinct keys, back to back
    samples: np.ndarray  # the batches' pools, back to back
    pools: np.ndarray    # per batch: its pool's size (its positions, or 0 without negatives)
    words: np.ndarray    # per batch: its words before subsampling
    cursor: int = 0

    def words_before(self, first: int, last: int) -> np.ndarray:
        """Per batch of [first, last): the words of the batches from first up to it."""
        words = self.words[first:last]
        return np.cumsum(words) - words

    def batch(self, b: int) -> tuple[_Plan, Optional[np.ndarray]]:
        """Batch b's plan and pool (None without one), for the worker's pull and push."""
        t = self.table
        s0, p0, k0 = (int(x) for x in t[:b, [0, 3, 4]].sum(axis=0))
        d0 = int(self.pools[:b].sum())
        ns, n, nk, nd = int(t[b, 0]), int(t[b, 3]), int(t[b, 4]), int(self.pools[b])
        plan = _Plan(self.keys[k0:k0 + nk], self.rows[0, p0:p0 + n], self.rows[1, p0:p0 + n],
                     self.rows[2, p0:p0 + n], self.ends[s0:s0 + ns], int(self.words[b]), nd)
        return plan, (self.samples[d0:d0 + nd] if nd else None)


def write_word2vec(directory: str, words: list[str], vectors: np.ndarray) -> None:
    """``vectors.txt`` and ``vectors.bin`` in word2vec's formats (each written atomically):
    a ``count dim`` header line, then per word its bytes, a space, and the vector as text
    (``%g``-style floats separated by spaces) or as dim little-endian float32, then a newline."""
    os.makedirs(directory, exist_ok=True)
    count, dim = vectors.shape
    encoded = [w.encode("utf-8", "surrogateescape") for w in words]
    header = f"{count} {dim}\n".encode()

    def text(f) -> None:
        f.write(header)
        rows = np.char.mod("%.8g", vectors.astype(np.float64))
        for word, row in zip(encoded, rows):
            f.write(word + b" " + " ".join(row).encode() + b"\n")

    def binary(f) -> None:
        f.write(header)
        data = vectors.astype("<f4")
        for word, row in zip(encoded, data):
            f.write(word + b" " + row.tobytes() + b"\n")

    write_atomically(os.path.join(directory, "vectors.txt"), text)
    write_atomically(os.path.join(directory, "vectors.bin"), binary)
    # A word read from bytes that are not UTF-8 holds surrogates (see wv_data.read_corpus).
    foreign = sum(not w.isascii() and any("\udc80" <= c <= "\udcff" for c in w) for w in words)
    if foreign:  # the corpus's bytes, as they were: gensim reads UTF-8 unless told otherwise
        utf8 = sum(not w.isascii() for w in words) - foreign  # words UTF-8 would garble
        how = ("encoding='latin-1' (or the corpus's encoding)" if not utf8 else
               f"unicode_errors='replace' (the other {utf8} non-ASCII words are UTF-8: the "
               f"corpus mixes encodings)")
        print(f"{directory}: {foreign} of {count} words are not UTF-8; they are exported as the "
              f"corpus's bytes: read them with gensim's load_word2vec_format(..., {how})",
              file=sys.stderr, flush=True)


def parser() -> argparse.ArgumentParser:
    p = runner.AppParser(
        prog="python -m adapm.apps.wv", formatter_class=runner.HelpFormatter,
        description="Train word vectors (skip-gram, negative sampling) on adapm (or: generate "
                    "OUT_DIR ... to write a corpus with planted relations; see 'generate "
                    "--help').")
    p.add_argument("--corpus", required=True, metavar="FILE",
                   help="plain text, one sentence per line, whitespace-separated tokens")
    p.add_argument("--dim", type=_argtypes.positive_int, default=100, help="vector dimension")
    p.add_argument("--window", type=_argtypes.positive_int, default=5,
                   help="largest context window (each position draws its own, 1..window)")
    p.add_argument("--neg", type=_argtypes.non_negative_int, default=5,
                   help="negatives per (word, context) pair")
    p.add_argument("--min-count", type=_argtypes.positive_int, default=5,
                   help="ignore words seen fewer times")
    p.add_argument("--sample", type=_argtypes.non_negative_float, default=1e-3,
                   help="subsampling threshold of frequent words (0: off)")
    p.add_argument("--optimizer", choices=("sgd", "adagrad"), default="sgd",
                   help="sgd: word2vec's and gensim's (the learning rate falls linearly to "
                        "1e-4); adagrad: the original AdaPM app's (the rate falls linearly to "
                        "1e-4 of itself, the accumulator after each vector)")
    p.add_argument("--replica-updates", choices=("sum", "average"), default=None,
                   help="how an owner merges the updates of a word's replicas on other nodes "
                        "(adapm.Config.replica_updates; default: sum, but average with sgd on "
                        "more than 4 nodes, where summed stale steps diverged)")
    p.add_argument("--lr", type=_argtypes.positive_float, default=0.025,
                   help="starting learning rate (gensim's alpha)")
    p.add_argument("--sampling", choices=("naive", "local"), default="naive",
                   help="negative sampling scheme (naive: drawn from the whole unigram^0.75 "
                        "distribution, as the baseline draws, and signalled as intent with the "
                        "batch's keys; local: drawn among the output vectors held on the node, "
                        "never remote, but a biased draw on several nodes that costs similarity "
                        "quality; both per epoch: bench/quality.py --per-epoch wv)")
    p.add_argument("--max-sentence", type=_argtypes.positive_int, default=wv_data.MAX_SENTENCE,
                   help="cut longer lines into sentences of this many tokens")
    p.add_argument("--analogies", metavar="FILE", default=None,
                   help="analogy questions (questions-words format) for the accuracy")
    p.add_argument("--similarity", metavar="FILE", default=None,
                   help="word pairs with scores ('word1 word2 score') for Spearman's rho")
    runner.add_common_flags(p, ahead=2000, batch_size=64, epochs=5)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "generate":
        return wv_data.generate_main(argv[1:])
    p = parser()
    opts = p.parse_args(argv)
    runner.check_flags(p, opts)
    try:
        opts.analogy_questions = wv_data.read_analogies(opts.analogies) if opts.analogies \
            else None
        opts.similarity_pairs = wv_data.read_similarity(opts.similarity) if opts.similarity \
            else None
        corpus = wv_data.read_corpus(opts.corpus, opts.min_count, opts.max_sentence)
    except DataError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    runner.run(WVTask(corpus, opts), opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
