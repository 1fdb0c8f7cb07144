"""Knowledge-graph embeddings on adapm: ``python -m adapm.apps.kge --data DIR``.

    python -m adapm.apps.kge generate data/kg --triples 20000      # a KG with planted structure
    python -m adapm.apps.kge --data data/kg --epochs 5              # one node
    adapm-run -n 2 python -m adapm.apps.kge --data data/kg          # two nodes
    python -m adapm.apps.kge --data data/kg --baseline --workers 2  # no PM, one shared array

Models: ComplEx (default), DistMult, RESCAL. Keys: entity e is key e, relation r is key E + r.
Each key's value is its embedding followed by its AdaGrad accumulator (RESCAL: a relation is a
d×d matrix, so keys have two lengths). Loss: logistic, over each positive triple and ``--neg``
corrupted tails plus ``--neg`` corrupted heads, the corrupting entities drawn by the PM's
``local`` sampling; L2 on the positives' rows. Training is per example inside one native call
per mini-batch (``native/kernels/kge.c``), as the original AdaPM app trains per data point; with
``--baseline`` and on one node (ComplEx, DistMult), many mini-batches per native call
(``native/kernels/kge_rows.c``, see ``KGETrainer.chunked``), with the same numbers.
Evaluation: filtered MRR, MR, Hits@1/3/10 over head and tail prediction (``kge_eval``).

Export (``--export DIR``; outside tools read it): ``entities.tsv``, ``relations.tsv``
(``id<TAB>name``), ``entity_embeddings.npy``, ``relation_embeddings.npy`` (float32, (n, width),
no optimizer state), ``model.json`` (``{"model": ..., "dim": d}``). ComplEx: width 2d, real
parts in columns [0, d), imaginary in [d, 2d), score Re(<h, r, conj(t)>); DistMult: width d,
score sum(h*r*t); RESCAL: a relation row is its d×d matrix row-major, score h^T R t.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np

import adapm

from .. import _argtypes
from .._native_loader import load as _load
from . import kge_data, kge_eval, runner
from .baseline import ArrayWorker
from .datafiles import write_atomically

_kernels = _load("adapm._kernels")
_native = _load()

MODELS = {"complex": _kernels.MODEL_COMPLEX, "distmult": _kernels.MODEL_DISTMULT,
          "rescal": _kernels.MODEL_RESCAL}
# Initial values as the original AdaPM KGE app: embeddings ~ N(0, 0.1), AdaGrad accumulators
# at a small positive constant (so the first step divides by a non-zero square root).
INIT_STD = 0.1
INIT_ACCUMULATOR = 1e-6
# Keys per deterministic block of initial values: a key's initial value depends only on the
# seed and the key, whichever node creates it.
_INIT_BLOCK = 4096


@dataclass
class _Plan:
    keys: np.ndarray       # the batch's distinct keys (entity e is e, relation r is E + r)
    rows: np.ndarray       # (B, 3): each triple's (head, relation, tail) as indices into keys
    sample_size: int       # 2 * neg * B: corrupted tails, then corrupted heads


class KGETask:
    """The KGE app as a runner task (see :class:`adapm.apps.runner.Task`)."""

    name = "kge"
    shape_flags = ("--model", "--dim")  # what sets a key's value length (a resume names them)
    unit = None

    def __init__(self, kg: kge_data.KG, opts: argparse.Namespace) -> None:
        self.kg = kg
        self.model = opts.model
        self.code = MODELS[opts.model]
        self.dim = opts.dim
        self.neg = opts.neg
        self.lr, self.reg = opts.lr, opts.reg
        self.seed = opts.seed
        self.ent_width, self.rel_width = _kernels.kge_widths(self.code, self.dim)
        E, R = kg.num_entities, kg.num_relations
        self.num_entities = E
        self.num_keys = E + R
        if self.ent_width == self.rel_width:
            self.value_length = 2 * self.ent_width
        else:
            self.value_length = np.concatenate([np.full(E, 2 * self.ent_width, np.int64),
                                                np.full(R, 2 * self.rel_width, np.int64)])
        self.sampling = adapm.Sampling(0, E, scheme=opts.sampling, seed=opts.seed)
        split = getattr(kg, opts.eval_on)
        self.eval_triples = split[:opts.eval_max] if opts.eval_max else split
        self._filter = None  # built on first evaluation

    # --- data and initial values -------------------------------------------------------------

    def worker_points(self, part: int, parts: int) -> np.ndarray:
        """A random split of train.txt: the same for a given seed, whatever the node count."""
        order = np.random.default_rng([self.seed, 2]).permutation(len(self.kg.train))
        return self.kg.train[np.array_split(order, parts)[part]]

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        """Packed initial rows of ``keys``: N(0, INIT_STD) embeddings, accumulators at
        INIT_ACCUMULATOR; a function of the seed and the key only (whichever node calls)."""
        E = self.num_entities
        is_entity = keys < E
        lengths = 2 * np.where(is_entity, self.ent_width, self.rel_width)
        starts = np.cumsum(lengths) - lengths
        out = np.empty(int(lengths.sum()), dtype=np.float32)
        for where, base, width in ((np.flatnonzero(is_entity), 0, self.ent_width),
                                   (np.flatnonzero(~is_entity), E, self.rel_width)):
            if not len(where):
                continue
            rows = np.empty((len(where), 2 * width), dtype=np.float32)
            rows[:, width:] = INIT_ACCUMULATOR
            index = keys[where] - base
            blocks = index // _INIT_BLOCK
            for block in np.unique(blocks):  # a loop over blocks of keys, not over keys
                mine = blocks == block
                rng = np.random.default_rng([self.seed, 3, int(base > 0), int(block)])
                values = rng.normal(0.0, INIT_STD, (_INIT_BLOCK, width)).astype(np.float32)
                rows[mine, :width] = values[index[mine] % _INIT_BLOCK]
            out[starts[where][:, None] + np.arange(2 * width)] = rows
        return out

    def trainer(self, batch_size: int, points=None, epochs: int = 1) -> "KGETrainer":
        return KGETrainer(self, batch_size)

    # --- evaluation and export ---------------------------------------------------------------

    def embeddings(self, worker) -> tuple[np.ndarray, np.ndarray]:
        """All entity and relation embeddings (no optimizer state), pulled through ``worker``."""
        E, R = self.num_entities, self.num_keys - self.num_entities
        ent = np.empty((E, self.ent_width), dtype=np.float32)
        chunk = 1 << 15
        for i in range(0, E, chunk):
            keys = np.arange(i, min(i + chunk, E), dtype=np.int64)
            ent[i:i + len(keys)] = worker.pull(keys).reshape(len(keys), -1)[:, :self.ent_width]
        rel = worker.pull(E + np.arange(R, dtype=np.int64)).reshape(R, -1)[:, :self.rel_width]
        return ent, np.ascontiguousarray(rel)

    def evaluate(self, worker, part: int, parts: int) -> list:
        if self._filter is None:
            kg = self.kg
            self._filter = kge_eval.FilterIndex(np.concatenate([kg.train, kg.valid, kg.test]))
        ent, rel = self.embeddings(worker)
        mine = self.eval_triples[part::parts]
        if not (np.isfinite(ent).all() and np.isfinite(rel).all()):
            # A diverged model: report NaN quality (honestly) rather than ranking garbage.
            return [2.0 * len(mine)] + [float("nan")] * (len(kge_eval.rank_sums(np.ones(1))) - 1)
        ranks = kge_eval.rank(self.model, ent, rel, mine, self._filter)
        return kge_eval.rank_sums(ranks).tolist()

    def metrics(self, sums: np.ndarray) -> dict:
        return kge_eval.metrics(np.asarray(sums, dtype=np.float64))

    def export(self, worker, directory: str) -> None:
        ent, rel = self.embeddings(worker)
        write_export(directory, self.model, self.dim, self.kg.entities, self.kg.relations,
                     ent, rel)


class KGETrainer:
    """One worker thread's batches: buffers allocated once, one kernel call per batch; or, over
    the baseline's array or one node's store, many batches per native call (:meth:`chunked`)."""

    def __init__(self, task: KGETask, batch_size: int) -> None:
        self.task = task
        self.batch_size = batch_size
        self.E = task.num_entities
        k, b = task.neg, batch_size
        self.uniform = isinstance(task.value_length, int)
        ent_row, rel_row = 2 * task.ent_width, 2 * task.rel_width
        max_rows = 3 * b + 2 * k * b
        if self.uniform:
            self.values = np.empty((max_rows, ent_row), dtype=np.float32)
            self.updates = np.empty_like(self.values)
            self.row_offsets = np.arange(max_rows, dtype=np.int64) * ent_row
        else:
            floats = 2 * b * ent_row + b * rel_row + 2 * k * b * ent_row
            self.values = np.empty(floats, dtype=np.float32)
            self.updates = np.empty_like(self.values)
            self.lens = task.value_length
        self.ent_row = ent_row
        self.negatives = np.arange(2 * k * b, dtype=np.int64)

    def plan(self, points: np.ndarray) -> _Plan:
        """The batch's distinct keys in order of first appearance and each triple's rows in
        them: one O(n) native call (~5 us; numpy's unique sorted them, ~13 us more per batch).
        The order of the keys changes no number: the kernel reads and changes each row by its
        index, and the sample's rows follow all of them in the push, as before."""
        b = len(points)
        flat = np.concatenate([points[:, 0], points[:, 1] + self.E, points[:, 2]]).astype(
            np.int64, copy=False)
        keys, inverse = np.empty(3 * b, dtype=np.int64), np.empty(3 * b, dtype=np.int64)
        count = _native.unique_inverse(flat, keys, inverse)
        return _Plan(keys[:count], np.ascontiguousarray(inverse.reshape(3, b).T),
                     2 * self.task.neg * b)

    def intent_keys(self, points: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Each batch's distinct keys (``plan(...).keys``, what the per-batch path signals as
        intent: a ``local`` sample is drawn among the keys held here) back to back, and their
        number per batch."""
        parts = [self.plan(points[i:i + batch_size]).keys
                 for i in range(0, len(points), batch_size)]
        keys = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return keys, np.array([len(p) for p in parts], dtype=np.int64)

    def chunked(self, worker, ahead: int = 0):
        """A ``run(points, batch_size) -> (losses, steps)`` that trains many batches in one
        native call with the GIL released (per batch what plan and step do, with the same
        arithmetic), over the baseline's plain shared array (``ArrayWorker.table``) or a node's
        store (``Worker.native_rows``). Each batch's negatives are drawn before the call, batch
        after batch from the worker's sampling stream (``sample_keys``): the draws the
        per-batch path makes, in its order, so on one node the numbers are the same. On a node
        of a multi-node job a ``local`` sample is drawn among the keys held here that stay and
        pinned until the worker's next clock, as pull_sample does, for the whole run (at most
        ahead/4 batches there: 2 at KGE's default), once the run's batches are known to have
        their keys here (a run trains the leading batches that have; a first batch without
        goes alone through the per-batch path, whose pull waits for its keys before it pins
        anything); the runner signals each batch's keys ahead (:meth:`intent_keys`). None (the
        per-batch path) for RESCAL (keys of two lengths), without rows, and under ``naive``
        sampling on several nodes (a naive sample is signalled as intent when it is prepared,
        ahead). Over a store, a batch with a key held elsewhere goes through ``step`` with its
        sample as drawn.
        ``ahead`` is the runner's (see ``runner.Trainer``); KGE's plans draw no random numbers,
        so it changes nothing here."""
        task = self.task
        if not self.uniform:
            return None
        if isinstance(worker, ArrayWorker):
            data, offsets, lens = worker.table()
            rows = None
        else:
            rows = worker.native_rows()
            if rows is None or (worker.acts_on_intent and task.sampling.scheme != "local"):
                return None
        intent = not isinstance(worker, ArrayWorker) and worker.acts_on_intent
        width = self.ent_row
        k2, per_point = 2 * task.neg, 1 + 2 * task.neg
        max_rows = len(self.values)  # (3 + 2 neg) batch_size rows: kge_train_rows's scratch
        iscratch = np.empty(6 * max_rows, dtype=np.int64)
        left_keys = np.empty(max_rows if rows is not None else 0, dtype=np.int64)
        left_rows = np.empty((len(left_keys), width), dtype=np.float32)
        # grown on demand: a call's samples, and per batch its loss and keys touched
        out = {"samples": np.empty(0, dtype=np.int64), "losses": np.empty(0),
               "keys": np.empty(0, dtype=np.int64), "flat": np.empty(0, dtype=np.int64),
               "missing": np.empty(0, dtype=np.int64)}

        def buffer(name: str, n: int) -> np.ndarray:
            if len(out[name]) < n:
                out[name] = np.empty(n, dtype=out[name].dtype)
            return out[name][:n]

        def prepare(points: np.ndarray, batch_size: int) -> tuple:
            """The scratch of a run and its batches' samples, drawn one batch after another."""
            if batch_size > self.batch_size:
                raise ValueError(f"batches of {batch_size} triples; this trainer's scratch "
                                 f"holds {self.batch_size}")
            n = len(points)
            batches = -(-n // batch_size)
            samples = buffer("samples", k2 * n)
            full, rest = divmod(n, batch_size)
            if k2 and full:
                worker.sample_keys(k2 * batch_size, full, out=samples[:k2 * batch_size * full])
            if k2 and rest:
                worker.sample_keys(k2 * rest, 1, out=samples[k2 * batch_size * full:])
            return samples, buffer("losses", batches), buffer("keys", batches)

        def run_table(points: np.ndarray, batch_size: int) -> tuple[list, int]:
            samples, losses, keys = prepare(points, batch_size)
            batches = _kernels.kge_train_table(
                task.code, task.dim, task.lr, task.reg, task.reg, batch_size, task.neg, self.E,
                points, samples, data, offsets, lens, iscratch, self.values, self.updates,
                losses, keys)
            touched = int(keys[:batches].sum())
            worker.count_accesses(touched, touched)
            return losses[:batches].tolist(), len(points) * per_point

        def held_batches(points: np.ndarray, batch_size: int) -> int:
            """How many leading batches of ``points`` have every key here now (a snapshot)."""
            n = len(points)
            flat = buffer("flat", 3 * n)
            flat[:n], flat[n:2 * n], flat[2 * n:] = points[:, 0], points[:, 1] + self.E, \
                points[:, 2]
            missing = buffer("missing", 3 * n)
            nmiss = _kernels.rows_missing(rows, flat, missing)
            if not nmiss:
                return -(-n // batch_size)
            return int((missing[:nmiss] % n).min()) // batch_size

        def run_rows(points: np.ndarray, batch_size: int) -> tuple[list, int]:
            # A batch whose keys are not all here (STOP_PULL), or whose keys left before its
            # push (STOP_PUSH), goes through the worker's pull and push, which route them.
            if intent:
                # The run's samples are pinned until the next clock: a pull that waits for
                # keys on their way must not wait with them pinned (a peer that waits the same
                # way for keys pinned here would never get them). So the run trains the
                # batches whose keys are all here; a first batch with a key still to come
                # goes alone through the per-batch path (its pull waits, then it draws and pins
                # its sample), and the runner calls again for the rest.
                ok = held_batches(points, batch_size)
                if ok == 0:
                    plan = self.plan(points[:batch_size])
                    sample = worker.prepare_sample(plan.sample_size, worker.clock) \
                        if plan.sample_size else None
                    loss, steps = self.step(worker, plan, sample)
                    return [loss], steps
                points = points[:ok * batch_size]
            samples, losses, keys = prepare(points, batch_size)
            result: list = []
            at, n = 0, len(points)
            while at < n:
                batches, stop, left = _kernels.kge_train_rows(
                    task.code, task.dim, task.lr, task.reg, task.reg, batch_size, task.neg,
                    self.E, points[at:], samples[k2 * at:k2 * n], rows, left_keys, left_rows,
                    iscratch, self.values, self.updates, losses, keys)
                touched = int(keys[:batches].sum())
                worker.count_accesses(touched, touched - left)
                result += losses[:batches].tolist()
                at += batches * batch_size
                if stop == _kernels.KGE_STOP_PUSH:
                    worker.push(left_keys[:left], left_rows[:left])  # not kept
                elif stop == _kernels.KGE_STOP_PULL:
                    end = min(at + batch_size, n)
                    result.append(self.step(worker, self.plan(points[at:end]), None,
                                            sampled=samples[k2 * at:k2 * end])[0])
                    at = end
            return result, n * per_point

        return run_table if rows is None else run_rows

    def step(self, worker, plan: _Plan, sample: Optional[int],
             sampled: Optional[np.ndarray] = None) -> tuple[float, int]:
        """Trains one batch: pull, the kernel, push. ``sample``: the handle of its prepared
        sample (pulled here); or, with ``sampled``, its sample's keys as drawn already (by
        ``chunked``: pulled here as keys)."""
        task = self.task
        nu, ns = len(plan.keys), plan.sample_size
        if self.uniform:
            values = self.values[:nu + ns]
            updates = self.updates[:nu + ns]
            worker.pull(plan.keys, out=values[:nu])
            sampled = self._pull_sample(worker, sample, sampled, values[nu:], plan)
            offsets = self.row_offsets[:nu + ns]
        else:
            lens = self.lens[plan.keys]
            nf = int(lens.sum())
            values = self.values[:nf + ns * self.ent_row]
            updates = self.updates[:len(values)]
            worker.pull(plan.keys, out=values[:nf])
            sampled = self._pull_sample(worker, sample, sampled, values[nf:], plan)
            offsets = np.concatenate([np.cumsum(lens) - lens,
                                      nf + self.negatives[:ns] * self.ent_row])
        half = ns // 2
        neg_tails = self.negatives[:half] + nu
        neg_heads = self.negatives[half:ns] + nu
        bce, reg = _kernels.kge_train_batch(task.code, task.dim, values.reshape(-1), offsets,
                                            plan.rows, neg_heads, neg_tails,
                                            updates.reshape(-1), task.lr, task.reg, task.reg)
        keys = np.concatenate([plan.keys, sampled]) if ns else plan.keys
        worker.push(keys, updates)
        b = len(plan.rows)
        return bce + reg, b * (1 + 2 * task.neg)

    @staticmethod
    def _pull_sample(worker, sample, sampled, out: np.ndarray, plan: _Plan) -> np.ndarray:
        """The batch's sample into ``out``: by its handle, or its keys drawn already."""
        if not plan.sample_size:
            return plan.keys[:0]
        if sampled is None:
            return worker.pull_sample(sample, out=out)[0]
        worker.pull(sampled, out=out)
        return sampled


def write_export(directory: str, model: str, dim: int, entities, relations,
                 ent: np.ndarray, rel: np.ndarray) -> None:
    """The export format of DESIGN section 9 (files replaced whole, each written atomically)."""
    os.makedirs(directory, exist_ok=True)

    def atomic(name: str, write) -> None:
        write_atomically(os.path.join(directory, name), write)

    def names(items):
        return "".join(f"{i}\t{name}\n" for i, name in enumerate(items)).encode()

    atomic("entities.tsv", lambda f: f.write(names(entities)))
    atomic("relations.tsv", lambda f: f.write(names(relations)))
    atomic("entity_embeddings.npy", lambda f: np.save(f, ent.astype(np.float32)))
    atomic("relation_embeddings.npy", lambda f: np.save(f, rel.astype(np.float32)))
    atomic("model.json", lambda f: f.write(json.dumps({"model": model, "dim": dim}).encode()))


def parser() -> argparse.ArgumentParser:
    p = runner.AppParser(
        prog="python -m adapm.apps.kge", formatter_class=runner.HelpFormatter,
        description="Train knowledge-graph embeddings on adapm (or: generate OUT_DIR ... to "
                    "write a KG with planted structure; see 'generate --help').")
    p.add_argument("--data", required=True, metavar="DIR",
                   help="directory with train.txt, valid.txt, test.txt (head<TAB>relation<TAB>tail)")
    p.add_argument("--model", choices=sorted(MODELS), default="complex", help="score function")
    p.add_argument("--dim", type=_argtypes.positive_int, default=100,
                   help="embedding dimension d (ComplEx rows hold 2d floats)")
    p.add_argument("--neg", type=_argtypes.non_negative_int, default=6,
                   help="negatives per positive and side (corrupted tails, corrupted heads)")
    p.add_argument("--lr", type=_argtypes.positive_float, default=0.1, help="AdaGrad learning rate")
    p.add_argument("--reg", type=_argtypes.non_negative_float, default=1e-3,
                   help="L2 weight on the rows of positive triples")
    p.add_argument("--sampling", choices=("local", "naive"), default="local",
                   help="negative sampling scheme (local: never remote)")
    p.add_argument("--eval-on", choices=("valid", "test"), default="valid",
                   help="the split that quality is measured on")
    p.add_argument("--eval-max", type=_argtypes.non_negative_int, default=5000,
                   help="evaluate on the first N triples of the split (0: all)")
    runner.add_common_flags(p, ahead=1000, batch_size=100, epochs=10)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "generate":
        return kge_data.generate_main(argv[1:])
    p = parser()
    opts = p.parse_args(argv)
    runner.check_flags(p, opts)
    try:
        kg = kge_data.load(opts.data)
    except kge_data.DataError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    if runner.lead_rank():
        for split, (count, line, what, name) in kg.left_out.items():
            print(f"{os.path.join(opts.data, split + '.txt')}: {count} triples left out of the "
                  f"evaluation: their entities or relations are not in train.txt (the first: "
                  f"line {line}, {what} {name!r})", file=sys.stderr, flush=True)
    runner.run(KGETask(kg, opts), opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
