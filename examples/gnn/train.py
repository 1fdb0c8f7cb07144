"""GraphSAGE node classification with learnable node embeddings whose rows live in adapm.

The task of the AdaPM paper's GNN experiment, on a generated graph (``graph.py``: a
degree-corrected stochastic block model, communities as labels, power-law degrees): every node
has a learnable embedding (its input features), a 2-layer GraphSAGE with mean aggregation maps
a node's sampled 2-hop neighbourhood to its community.

- The embeddings are an ``adapm.torch.Embedding`` (one key per node) trained with AdaGrad
  (``adapm.torch.optim.Adagrad``, the accumulator stored with the row).
- The dense layers are trained by ``torch.optim.Adam`` on every rank and kept equal on all ranks
  by ``adapm.torch.DenseSync``.
- A ``torch.utils.data.DataLoader`` over the rank's training nodes builds the batches: its
  ``collate_fn=IntentCollate(NeighbourCollate(...), TableKeys(...))`` (``batches.py``) samples
  the neighbourhood (fanouts 10 and 5, with replacement, a seeded generator per batch) in the
  loader's worker processes and emits the sampled nodes as the batch's adapm keys;
  ``IntentLoader`` signals them ``--ahead`` batches before the batch is trained, so adapm
  relocates or replicates those rows in time.
- Dropout on the embeddings (``--dropout``, 0.8) keeps the training nodes' own embeddings from
  memorising their labels, which would stop their neighbours from learning; its mask is seeded
  per batch too, so every batch is computed the same way on any number of ranks.
- Rank r of w trains shard r of the training nodes (a fixed random split), shuffled per epoch.
  After each epoch, rank 0 evaluates over all validation and test nodes with full-neighbourhood
  (not sampled) mean aggregation while the other ranks wait at a barrier.

On the default graph the test accuracy reaches about 0.92 in 10 epochs (chance: 1/8), on one
rank as on two; one rank computes the very model of the baseline.

``--baseline`` trains the same model in one plain process with ``torch.nn.Embedding(sparse=True)``
and ``torch.optim.Adagrad`` for the rows: the same initial values, hyper-parameters, samples and
data order (``--shards N`` interleaves the batches of N ranks' shards, as N ranks train them
concurrently), without adapm.

    python examples/gnn/train.py --epochs 5                          # one node
    python -m adapm.launch -n 2 python examples/gnn/train.py         # 2 nodes (adapm-run)
    torchrun --nproc-per-node 2 examples/gnn/train.py                # 2 nodes under torchrun
    python examples/gnn/train.py --baseline --shards 2               # no adapm, same batches
    python examples/gnn/train.py --epochs 5 --checkpoint-dir ck      # a checkpoint per epoch
    python examples/gnn/train.py --epochs 10 --checkpoint-dir ck --resume   # epochs 6 to 10

``--checkpoint-dir DIR`` writes a checkpoint (``Node.checkpoint``: the embeddings with their
AdaGrad sums, the dense parameters, and in its meta the epoch reached, the seed and rank 0's
Adam state) every ``--checkpoint-every`` epochs and after the last; ``--resume`` continues
from it at the next epoch, on any number of ranks. Shuffles, neighbour samples and dropout
masks depend on the epoch only, so on one rank a resumed run computes what the uninterrupted
run computes; on several, every rank starts from rank 0's Adam state. The meta also holds the
graph's node and edge counts and a digest of its contents, ``--dim`` and ``--hidden``: a
checkpoint of another graph, seed or model shape is refused (one line, exit code 2), as one
with ``--epochs`` epochs done.

Output, as the apps' (``adapm.apps.runner``): per epoch rank 0 prints a summary line on stdout
and appends one JSON line to ``--json FILE`` (with ``--json -`` the JSON lines go to stdout and
the summary lines to stderr, so that stdout holds JSON lines only): ``epoch``,
``train_seconds`` (first rank's start to last rank's end of the training loop), ``examples_per_s``
(training nodes per second over all ranks), ``loss`` (mean cross-entropy over all ranks'
training nodes), ``val_acc``, ``test_acc`` (null for a split without nodes), ``world_size``,
and for adapm runs ``remote_share``: remote pulled + pushed keys over all keys pulled and pushed
in this epoch's training loops, summed over all ranks (evaluation is not counted). Output paths
are checked before training; bad flag values, graphs and checkpoints are one line naming the
flag or file and exit code 2; Ctrl-C is "interrupted" and exit code 130, as the apps'. The
progress bar shows on a terminal, also under adapm-run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from batches import NeighbourCollate, SageBatch, TableKeys
from graph import (
    GENERATION_DEFAULTS,
    MAX_SEED,
    Graph,
    GraphError,
    add_generation_flags,
    check_generation_flags,
    digest,
    generate,
    generation_kwargs,
    graph_file,
    load,
)
from torch import nn
from torch.utils.data import DataLoader

import adapm
from adapm import CheckpointError, ConfigError
from adapm._argtypes import float_in, int_in, positive_float
from adapm.apps.outputs import directory_problem
from adapm.apps.runner import AppParser, check_flags, failure_exit, interrupt_once
from adapm.trace import keys_argument

# Initial embeddings: N(0, INIT_SCALE^2), drawn in chunks of INIT_CHUNK rows, chunk k from its
# own generator: the values depend on the seed only, not on the world size or the writer.
INIT_SCALE = 0.1
INIT_CHUNK = 4096
# Offset of the embedding table in the node's key space (DenseSync's keys and the per-epoch
# exchange slots follow it).
TABLE_OFFSET = 0
# How long the training process waits for a batch from a loader worker process.
LOADER_TIMEOUT_S = 120
# Per-rank numbers gathered on rank 0 after each epoch: loop start, loop end, loss sum,
# examples, remote keys, keys accessed.
_GATHERED = 6


# --- data ------------------------------------------------------------------------------------


def shards(train: np.ndarray, parts: int, seed: int) -> list[np.ndarray]:
    """The training nodes of each of ``parts`` ranks: a fixed random split."""
    perm = np.random.default_rng([seed, 1]).permutation(train)
    return [perm[r::parts] for r in range(parts)]


def make_loader(shard: np.ndarray, collate: NeighbourCollate, opts) -> DataLoader:
    """The DataLoader of one shard: shuffled per epoch (see :func:`reseed`), batches built
    by ``collate`` wrapped in IntentCollate (its keys are simply unused by the baseline)."""
    from adapm.torch import IntentCollate

    generator = torch.Generator()
    # A batch that a worker process fails to send (an error while pickling it is only printed
    # by the queue's thread) would otherwise be waited for forever.
    timeout = LOADER_TIMEOUT_S if opts.loader_workers else 0
    return DataLoader(shard, batch_size=opts.batch_size, shuffle=True, generator=generator,
                      num_workers=opts.loader_workers, timeout=timeout,
                      collate_fn=IntentCollate(collate, TableKeys(TABLE_OFFSET)))


def reseed(loader: DataLoader, seed: int, epoch: int, part: int) -> None:
    """The shuffle of shard ``part`` in ``epoch`` depends on these three only."""
    state = np.random.SeedSequence([seed, 2, epoch, part]).generate_state(1, np.uint64)[0]
    loader.generator.manual_seed(int(state >> np.uint64(1)))


def initial_rows(seed: int, num_nodes: int, dim: int, chunk: int) -> np.ndarray:
    """The initial embeddings of chunk ``chunk`` (rows ``[chunk * INIT_CHUNK, ...)``)."""
    first = chunk * INIT_CHUNK
    count = min(INIT_CHUNK, num_nodes - first)
    rng = np.random.default_rng([seed, 3, chunk])
    return rng.standard_normal((count, dim), dtype=np.float32) * np.float32(INIT_SCALE)


# --- the model ---------------------------------------------------------------------------------


class Sage(nn.Module):
    """The dense part of a 2-layer GraphSAGE with mean aggregation (the embeddings, its input
    features, live outside: in adapm or in a torch table): layer l computes
    ``self_l(h_v) + neigh_l(mean of h_u over v's neighbours u)``, ReLU after layer 1."""

    def __init__(self, dim: int, hidden: int, classes: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout
        self.self1 = nn.Linear(dim, hidden)
        self.neigh1 = nn.Linear(dim, hidden, bias=False)
        self.self2 = nn.Linear(hidden, classes)
        self.neigh2 = nn.Linear(hidden, classes, bias=False)

    def _layer1(self, own: torch.Tensor, neighbours_mean: torch.Tensor) -> torch.Tensor:
        return F.relu(self.self1(own) + self.neigh1(neighbours_mean))

    def forward(self, x: torch.Tensor, batch: SageBatch) -> torch.Tensor:
        """Logits of the batch's training nodes; ``x`` holds the rows of ``batch.nodes``."""
        if self.training and self.dropout > 0:
            # The mask depends on the batch only, not on the process that trains it: a run on
            # N ranks and the baseline with --shards N train the very same batches.
            keep = torch.rand(x.shape, generator=torch.Generator().manual_seed(batch.seed))
            x = x * (keep >= self.dropout) / (1.0 - self.dropout)
        h_seeds = self._layer1(x[batch.seeds], x[batch.hop1].mean(1))
        h_hop1 = self._layer1(x[batch.hop1], x[batch.hop2].mean(2))
        return self.self2(h_seeds) + self.neigh2(h_hop1.mean(1))

    def full(self, x: torch.Tensor, mean_adj: torch.Tensor) -> torch.Tensor:
        """Logits of every node from all of its neighbours (inference): ``x`` is the whole
        embedding table, ``mean_adj`` the row-normalised adjacency."""
        h = self._layer1(x, mean_adj @ x)
        return self.self2(h) + self.neigh2(mean_adj @ h)


def mean_adjacency(graph: Graph) -> torch.Tensor:
    """The row-normalised adjacency as a sparse (COO) tensor; a node without neighbours is its
    own neighbour, as in :func:`graph.sample_neighbours`."""
    n = graph.num_nodes
    deg = graph.degrees()
    isolated = np.flatnonzero(deg == 0)
    rows = np.concatenate([np.repeat(np.arange(n), deg), isolated])
    cols = np.concatenate([graph.indices, isolated])
    values = (1.0 / np.maximum(deg, 1)).astype(np.float32)[rows]
    coo = torch.sparse_coo_tensor(torch.from_numpy(np.stack([rows, cols])),
                                  torch.from_numpy(values), (n, n), check_invariants=True)
    return coo.coalesce()


@torch.no_grad()
def evaluate(model: Sage, x: torch.Tensor, mean_adj: torch.Tensor,
             graph: Graph) -> tuple[float | None, float | None]:
    """Accuracy on the validation and on the test nodes (full neighbourhoods); None for a
    split without nodes."""
    model.eval()
    predicted = model.full(x, mean_adj).argmax(1).numpy()
    model.train()
    correct = predicted == graph.labels
    return tuple(float(correct[nodes].mean()) if len(nodes) else None
                 for nodes in (graph.val, graph.test))


def step(table, model: Sage, batch: SageBatch, optimizers) -> float:
    """One training step on ``batch``; returns its mean loss."""
    for opt in optimizers:
        opt.zero_grad()
    loss = F.cross_entropy(model(table(batch.nodes), batch), batch.labels)
    loss.backward()
    for opt in optimizers:
        opt.step()
    return loss.item()


# --- adapm -------------------------------------------------------------------------------------


def accesses(node) -> tuple[int, int]:
    """(remote, all) keys pulled and pushed by this node so far."""
    s = node.stats()
    remote = s["remote_pull_keys"] + s["remote_push_keys"]
    return remote, remote + s["local_pull_keys"] + s["waited_pull_keys"] + s["local_push_keys"]


class Gather:
    """Rank 0 collects a few float64 numbers from every rank through adapm keys: rank r writes
    them to its own keys (each float64 as four uint16s, exact in float32), everybody meets at a
    barrier, rank 0 pulls all ranks' keys. Collective."""

    def __init__(self, node, worker, base: int, value_length: int) -> None:
        self.node, self.worker = node, worker
        self.per_rank = self.keys_needed(1, value_length)
        self.base = base
        self.value_length = value_length

    @staticmethod
    def keys_needed(world_size: int, value_length: int) -> int:
        return world_size * -(-4 * _GATHERED // value_length)

    def __call__(self, values: list[float]) -> np.ndarray | None:
        """(world_size, len(values)) on rank 0, None elsewhere. Ends with a barrier."""
        node, w = self.node, self.worker
        slot = np.zeros(self.per_rank * self.value_length, dtype=np.float32)
        slot[:4 * _GATHERED] = np.asarray(values, dtype=np.float64).view(np.uint16)
        mine = self.base + node.rank * self.per_rank + np.arange(self.per_rank)
        w.set(mine, slot.reshape(self.per_rank, -1))
        w.wait()
        node.barrier()
        if node.rank != 0:
            return None
        every = w.pull(self.base + np.arange(node.world_size * self.per_rank)).reshape(
            node.world_size, -1)[:, :4 * _GATHERED]
        return every.astype(np.uint16).view(np.float64)


# --- checkpoints -------------------------------------------------------------------------------


def resume_point(opts, graph: Graph, model: "Sage", dense_keys: int):
    """The checkpoint of ``--checkpoint-dir`` and its meta, checked against this run (before
    the node starts): the same example, seed, graph and model shapes, epochs left to train."""
    from adapm import checkpoint

    reader = checkpoint.load(opts.checkpoint_dir)
    meta = reader.meta
    where = f"checkpoint {reader.directory}"
    if meta.get("example") != "gnn" or meta.get("seed") != opts.seed:
        raise CheckpointError(f"{where} is not of this example with --seed {opts.seed} "
                              f"(its meta: example {meta.get('example')!r}, seed "
                              f"{meta.get('seed')!r})")
    n = graph.num_nodes
    theirs = meta.get("graph")
    if theirs is not None and theirs != graph_meta(graph):
        raise CheckpointError(
            f"{where} was trained on another graph ({theirs.get('nodes')} nodes, "
            f"{theirs.get('edges')} edges, digest {str(theirs.get('digest'))[:12]}), this run's "
            f"has {n} nodes, {graph.num_edges} edges, digest {digest(graph)[:12]}; resume on "
            f"the same graph")
    if reader.uniform != 2 * opts.dim or meta.get("dim", opts.dim) != opts.dim:
        raise CheckpointError(f"{where} holds embeddings of --dim {reader.uniform // 2} (rows of "
                              f"{reader.uniform} floats with their AdaGrad sums), this run has "
                              f"--dim {opts.dim}")
    if meta.get("hidden", opts.hidden) != opts.hidden or not _adam_fits(meta, model):
        raise CheckpointError(f"{where} holds dense layers of another shape (--hidden "
                              f"{meta.get('hidden', '?')}), this run has --hidden {opts.hidden}")
    # Older checkpoints have no graph in the meta: their key count must be this graph's.
    expected = n + dense_keys + Gather.keys_needed(int(meta.get("world_size", 0)), 2 * opts.dim)
    if reader.num_keys != expected:
        raise CheckpointError(f"{where} holds {reader.num_keys} keys, a checkpoint of this graph "
                              f"and model holds {expected} (another graph?)")
    if meta["epoch"] >= opts.epochs:
        raise CheckpointError(f"{where} has {meta['epoch']} epochs done; to continue, give "
                              f"--epochs above {meta['epoch']}")
    return reader, meta


def graph_meta(graph: Graph) -> dict:
    """What a checkpoint records of the graph it was trained on, for --resume to compare."""
    return {"nodes": graph.num_nodes, "edges": graph.num_edges, "digest": digest(graph)}


def _adam_fits(meta: dict, model: "Sage") -> bool:
    """Whether the checkpoint's Adam state has one entry of each parameter's shape."""
    params = list(model.parameters())
    state = meta.get("adam", {}).get("state", {})
    for index, entry in state.items():
        if not index.isdigit() or int(index) >= len(params):
            return False
        shape = tuple(params[int(index)].shape)
        for value in entry.values():
            if isinstance(value, dict) and "tensor" in value and \
                    np.shape(value["tensor"]) not in (shape, ()):
                return False
    return True


def load_flat(params, flat: np.ndarray) -> None:
    """Parameters from their values back to back (DenseSync's layout)."""
    at = 0
    with torch.no_grad():
        for p in params:
            p.copy_(torch.from_numpy(flat[at:at + p.numel()].copy()).reshape(p.shape))
            at += p.numel()


def optimizer_state(optimizer) -> dict:
    """A torch optimizer's state as JSON (tensors as nested lists)."""
    def plain(value):
        if isinstance(value, torch.Tensor):
            return {"tensor": value.tolist(), "dtype": str(value.dtype).split(".")[-1]}
        return value

    state = optimizer.state_dict()
    return {"state": {str(k): {name: plain(v) for name, v in entry.items()}
                      for k, entry in state["state"].items()},
            "param_groups": state["param_groups"]}


def load_optimizer_state(optimizer, document: dict) -> None:
    def tensor(value):
        if isinstance(value, dict) and "tensor" in value:
            return torch.tensor(value["tensor"], dtype=getattr(torch, value["dtype"]))
        return value

    optimizer.load_state_dict({
        "state": {int(k): {name: tensor(v) for name, v in entry.items()}
                  for k, entry in document["state"].items()},
        "param_groups": document["param_groups"]})


def train_adapm(opts, graph: Graph) -> None:
    """Training on this rank's shard, with the rows in adapm (any world size)."""
    from adapm.torch import DenseSync, Embedding, IntentLoader, optim

    n, dim = graph.num_nodes, opts.dim
    value_length = 2 * dim  # a row and its AdaGrad accumulator
    torch.manual_seed(opts.seed)
    model = Sage(dim, opts.hidden, graph.num_communities, opts.dropout)
    dense_keys = DenseSync.keys_needed(model.parameters(), value_length)
    world = adapm.Config.from_env(num_keys=1).world_size
    check_shards(opts, graph, world, "ranks")
    reader, meta = resume_point(opts, graph, model, dense_keys) if opts.resume else \
        (None, {"epoch": 0})
    num_keys = n + dense_keys + Gather.keys_needed(world, value_length)
    with adapm.init(num_keys=num_keys, value_length=value_length, trace_dir=opts.trace_dir,
                    trace_keys=opts.trace_keys) as node:
        w = node.worker()
        rank = node.rank
        table = Embedding(n, dim, worker=w, offset=TABLE_OFFSET, init="zeros")
        # Our own initial rows (those of the baseline), or the checkpoint's; chunk k written
        # by rank k % world.
        for chunk in range(rank, -(-n // INIT_CHUNK), world):
            keys = TABLE_OFFSET + chunk * INIT_CHUNK + np.arange(min(INIT_CHUNK,
                                                                     n - chunk * INIT_CHUNK))
            if reader is not None:
                values = reader.read(keys).reshape(len(keys), value_length)
            else:
                values = np.zeros((len(keys), value_length), dtype=np.float32)
                values[:, :dim] = initial_rows(opts.seed, n, dim, chunk)
            w.set(keys, values)
        w.wait()
        node.barrier()
        dense = TABLE_OFFSET + n + np.arange(dense_keys)
        if reader is not None:  # DenseSync then hands rank 0's (these) values to every rank
            load_flat(model.parameters(), reader.read(dense))
        sync = DenseSync(model.parameters(), worker=w, offset=TABLE_OFFSET + n)
        gather = Gather(node, w, TABLE_OFFSET + n + dense_keys, value_length)
        adam = torch.optim.Adam(model.parameters(), lr=opts.dense_lr)
        if reader is not None:
            load_optimizer_state(adam, meta["adam"])
        optimizers = [optim.Adagrad(table, lr=opts.lr), adam, _Synced(sync)]
        collate = NeighbourCollate(graph, opts.fanouts, opts.seed)
        loader = make_loader(shards(graph.train, world, opts.seed)[rank], collate, opts)
        batches = IntentLoader(loader, w, ahead=opts.ahead)
        mean_adj = mean_adjacency(graph) if rank == 0 else None
        described = graph_meta(graph) if opts.checkpoint_dir else None
        for epoch in range(meta["epoch"] + 1, opts.epochs + 1):
            collate.epoch = epoch
            reseed(loader, opts.seed, epoch, rank)
            node.barrier()
            node.trace_mark(f"epoch {epoch} start")
            bar = _progress(opts, rank, epoch, len(loader))
            before = accesses(node)
            start, loss_sum, examples = time.time(), 0.0, 0
            for batch in batches:
                loss_sum += step(table, model, batch, optimizers) * len(batch.labels)
                examples += len(batch.labels)
                if bar is not None:
                    bar.update()
            after = accesses(node)
            node.trace_mark(f"epoch {epoch} end")
            end = time.time()
            if bar is not None:
                bar.close()
            # This rank's updates, replica deltas included, reach the main copies; after the
            # barrier (in gather) rank 0's replicas are refreshed and it reads all of them.
            w.wait_sync()
            every = gather([start, end, loss_sum, examples, after[0] - before[0],
                            after[1] - before[1]])
            w.wait_sync()
            sync.step()  # the merged dense parameters (nothing of this rank's is pending)
            if rank == 0:
                val_acc, test_acc = evaluate(model, table.weight, mean_adj, graph)
                record = _record(epoch, every, val_acc, test_acc, world)
                record["remote_share"] = float(every[:, 4].sum() / max(every[:, 5].sum(), 1))
                _emit(record, opts)
            node.barrier()  # the other ranks wait for rank 0's evaluation
            if opts.checkpoint_dir and (epoch == opts.epochs or
                                        epoch % opts.checkpoint_every == 0):
                node.checkpoint(opts.checkpoint_dir, meta={
                    "example": "gnn", "epoch": epoch, "seed": opts.seed,
                    "world_size": world, "graph": described, "dim": dim,
                    "hidden": opts.hidden, "adam": optimizer_state(adam)})


class _Synced:
    """DenseSync in the optimizer list: ``step()`` after the dense optimizer's."""

    def __init__(self, sync) -> None:
        self.sync = sync

    def zero_grad(self) -> None:
        pass

    def step(self) -> None:
        self.sync.step()


# --- baseline ----------------------------------------------------------------------------------


def train_baseline(opts, graph: Graph) -> None:
    """The same training in one plain process: torch's sparse embedding and AdaGrad, the
    batches of ``--shards`` shards interleaved (round robin)."""
    check_shards(opts, graph, opts.shards, "shards (--shards)")
    # torch's sparse AdaGrad warns on every run that it skips its invariant checks.
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    n, dim = graph.num_nodes, opts.dim
    torch.manual_seed(opts.seed)
    model = Sage(dim, opts.hidden, graph.num_communities, opts.dropout)
    table = nn.Embedding(n, dim, sparse=True)
    with torch.no_grad():
        table.weight.copy_(torch.from_numpy(np.concatenate(
            [initial_rows(opts.seed, n, dim, k) for k in range(-(-n // INIT_CHUNK))])))
    optimizers = [torch.optim.Adagrad(table.parameters(), lr=opts.lr),
                  torch.optim.Adam(model.parameters(), lr=opts.dense_lr)]
    collate = NeighbourCollate(graph, opts.fanouts, opts.seed)
    loaders = [make_loader(s, collate, opts) for s in shards(graph.train, opts.shards, opts.seed)]
    mean_adj = mean_adjacency(graph)
    for epoch in range(1, opts.epochs + 1):
        collate.epoch = epoch
        for part, loader in enumerate(loaders):
            reseed(loader, opts.seed, epoch, part)
        bar = _progress(opts, 0, epoch, sum(len(loader) for loader in loaders))
        start, loss_sum, examples = time.time(), 0.0, 0
        for keyed in _round_robin(loaders):
            batch = keyed.batch
            loss_sum += step(table, model, batch, optimizers) * len(batch.labels)
            examples += len(batch.labels)
            if bar is not None:
                bar.update()
        end = time.time()
        if bar is not None:
            bar.close()
        val_acc, test_acc = evaluate(model, table.weight.detach(), mean_adj, graph)
        every = np.array([[start, end, loss_sum, examples]])
        _emit(_record(epoch, every, val_acc, test_acc, 1), opts)


def check_shards(opts, graph: Graph, parts: int, what: str) -> None:
    """GraphError unless every one of ``parts`` shards gets a training node."""
    if len(graph.train) < parts:
        source = graph_file(opts.graph) if opts.graph is not None else "the generated graph"
        raise GraphError(f"{source}: {len(graph.train)} training node(s) for {parts} {what}: "
                         f"each needs one at least (more --train-frac or --nodes, or fewer "
                         f"{what.split()[0]})")


def _round_robin(loaders):
    """The batches of several loaders, one of each in turn, until all are exhausted."""
    iterators = [iter(loader) for loader in loaders]
    while iterators:
        alive = []
        for it in iterators:
            item = next(it, None)
            if item is not None:
                alive.append(it)
                yield item
        iterators = alive


# --- output ------------------------------------------------------------------------------------


def _record(epoch: int, every: np.ndarray, val_acc: float, test_acc: float,
            world: int) -> dict:
    """The epoch's JSON record from every rank's (start, end, loss sum, examples, ...)."""
    seconds = float(every[:, 1].max() - every[:, 0].min())
    examples = float(every[:, 3].sum())
    return {"epoch": epoch, "train_seconds": round(seconds, 4),
            "examples_per_s": round(examples / seconds, 1) if seconds > 0 else None,
            "loss": float(every[:, 2].sum() / examples) if examples else None,
            "val_acc": val_acc, "test_acc": test_acc, "world_size": world}


def _emit(record: dict, opts) -> None:
    """An epoch's output, as the apps' (``adapm.apps.runner``): the summary line on stdout and
    the JSON line appended to ``--json FILE``; with ``--json -`` the JSON line on stdout and the
    summary on stderr."""
    line = json.dumps(record)
    summary = (f"epoch {record['epoch']}: {record['train_seconds']:.2f} s, "
               f"{record['examples_per_s'] or 0:,.0f} examples/s, loss {record['loss']:.4f}, "
               f"val acc {_accuracy(record['val_acc'])}, "
               f"test acc {_accuracy(record['test_acc'])}")
    if "remote_share" in record:
        summary += f", remote accesses {100 * record['remote_share']:.4f}%"
    if opts.json == "-":
        print(line, flush=True)
        print(summary, file=sys.stderr, flush=True)
        return
    print(summary, flush=True)
    if opts.json:
        with open(opts.json, "a") as f:
            f.write(line + "\n")


def _accuracy(value: float | None) -> str:
    return "n/a (no such nodes)" if value is None else f"{value:.4f}"


def _progress(opts, rank: int, epoch: int, total: int):
    """Rank 0's progress bar on stderr (auto: only on a terminal), or None."""
    if rank != 0 or opts.progress == "off":
        return None
    from tqdm import tqdm

    # auto: a bar on a terminal, also through adapm-run (its stderr a terminal: on_terminal).
    shown = opts.progress == "on" or adapm.config.on_terminal(sys.stderr)
    return tqdm(total=total, desc=f"epoch {epoch}", unit="batch", leave=False, file=sys.stderr,
                disable=not shown)


# --- command line ------------------------------------------------------------------------------


def _fanouts(text: str) -> tuple[int, int]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two integers like 10,5, got {text!r}") \
            from None
    if len(values) != 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected two integers >= 1 like 10,5 (one per "
                                         f"layer), got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = AppParser(prog="train.py", description=__doc__.splitlines()[0])
    parser.add_argument("--graph", metavar="DIR", default=None,
                        help="a graph written by 'python examples/gnn/graph.py generate DIR' "
                             "(default: generate one from the flags below)")
    add_generation_flags(parser, required_defaults=False)
    t = parser.add_argument_group("training")
    t.add_argument("--seed", type=int_in(0, MAX_SEED), default=0,
                   help="seed of the generated graph, initial values, shards, shuffles and "
                        "neighbour samples (default 0)")
    t.add_argument("--epochs", type=int_in(1), default=10,
                   help="epochs to train (default 10)")
    t.add_argument("--batch-size", type=int_in(1, sys.maxsize), default=64,
                   help="training nodes per mini-batch, i.e. per step of a rank (default 64)")
    t.add_argument("--dim", type=int_in(1), default=32,
                   help="node embedding size (default 32)")
    t.add_argument("--hidden", type=int_in(1), default=64,
                   help="width of the hidden GraphSAGE layer (default 64)")
    t.add_argument("--fanouts", type=_fanouts, default=(10, 5),
                   help="neighbours sampled per node at hop 1 and hop 2 (default 10,5)")
    t.add_argument("--dropout", type=float_in(0, 1, high_open=True), default=0.8,
                   help="share of the embeddings' entries dropped in training; high, because "
                        "a training node's own embedding otherwise memorises its label and "
                        "its neighbours stop learning (default 0.8)")
    t.add_argument("--lr", type=positive_float, default=0.1,
                   help="AdaGrad learning rate of the node embeddings (default 0.1)")
    t.add_argument("--dense-lr", type=positive_float, default=0.005,
                   help="Adam learning rate of the dense layers (default 0.005)")
    t.add_argument("--loader-workers", type=int_in(0), default=1,
                   help="DataLoader worker processes per rank that sample the batches "
                        "(0: in the training process; default 1)")
    t.add_argument("--ahead", type=int_in(1), default=8,
                   help="signal a batch's keys as intent this many batches before it is "
                        "trained (default 8)")
    t.add_argument("--baseline", action="store_true",
                   help="one plain process without adapm: torch.nn.Embedding(sparse=True) and "
                        "torch.optim.Adagrad for the rows, otherwise the same")
    t.add_argument("--shards", type=int_in(1), default=1,
                   help="with --baseline: train the shards of this many ranks, their batches "
                        "interleaved, to match a run on that many ranks (default 1)")
    o = parser.add_argument_group("output")
    o.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help="rank 0's progress bar on stderr: on a terminal only (auto), always "
                        "(on), never (off)")
    o.add_argument("--json", metavar="FILE", default=None,
                   help="append the per-epoch JSON lines to FILE (rank 0); '-': to stdout, and "
                        "the summary lines to stderr")
    o.add_argument("--trace-dir", metavar="DIR", default=None,
                   help="record a parameter-placement trace there (adapm trace summary DIR)")
    o.add_argument("--trace-keys", type=keys_argument, default="all", metavar="KEYS",
                   help="keys the trace records: all, a sample size N, or k1,k2,...")
    c = parser.add_argument_group("checkpoints")
    c.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                   help="write a checkpoint there (replacing the last one atomically; on a "
                        "filesystem every rank shares)")
    c.add_argument("--checkpoint-every", type=int_in(1), default=1, metavar="N",
                   help="with --checkpoint-dir: every N epochs, and after the last (default 1)")
    c.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir at the epoch after "
                        "it (any number of ranks; --epochs counts from the first run's start)")
    opts = parser.parse_args(argv)
    given = [f"--{name.replace('_', '-')}" for name in ("nodes", "communities",
             "edges_per_node", "p_in", "alpha", "train_frac", "val_frac", "test_frac")
             if getattr(opts, name) is not None]
    if opts.graph is not None and given:
        parser.error(f"--graph reads a graph; {', '.join(given)} apply only when generating "
                     "one (without --graph)")
    if opts.shards > 1 and not opts.baseline:
        parser.error("--shards applies to --baseline only (an adapm run has one shard per rank)")
    if opts.graph is None:
        check_generation_flags(parser, opts, GENERATION_DEFAULTS)
    # The directories' flags named in their errors (check_flags names the path only).
    for flag, path in (("--trace-dir", opts.trace_dir),
                       ("--checkpoint-dir", None if opts.resume else opts.checkpoint_dir)):
        problem = directory_problem(path)
        if problem:
            parser.error(f"{flag} {problem}")
    # --resume and --baseline against the checkpoint flags, and the output paths (--json,
    # --trace-dir, --checkpoint-dir), as the apps check them: before the graph is built.
    check_flags(parser, opts)
    return opts


def load_graph(opts) -> Graph:
    """The graph of ``--graph``, or one generated from the flags (the same on every rank)."""
    if opts.graph is not None:
        return load(opts.graph)
    return generate(opts.nodes or 20_000, opts.communities or 8, seed=opts.seed,
                    **generation_kwargs(opts))


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)  # small dense layers: threads would only contend for the cores
    opts = parse_args(argv)
    interrupt_once()
    try:
        graph = load_graph(opts)
    except ValueError as exc:  # GraphError: the file; ValueError: the generator's arguments
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 2
    try:
        if opts.baseline:
            train_baseline(opts, graph)
        else:
            train_adapm(opts, graph)
    except BaseException as exc:
        # The graph, the checkpoint or the launch (the user's to fix), Ctrl-C, another node's
        # failure: one line, as the apps. The node, if any, was released on the way out.
        code = failure_exit(exc, "train.py",
                            user_errors=(GraphError, CheckpointError, ConfigError))
        if code is None:
            raise
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
