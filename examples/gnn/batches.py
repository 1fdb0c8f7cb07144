"""The batches of the GNN example: a DataLoader's collate that samples each batch's 2-hop
neighbourhood, and the batch's adapm keys.

In a module of its own (not in the script ``train.py``), so that the batches pickle by a module
name that loader worker processes can import whatever ``__main__`` is (a profiler, torchrun).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from graph import Graph, sample_neighbours


class SageBatch(NamedTuple):
    """One mini-batch: the sampled nodes and, for each role, positions into them."""

    nodes: torch.Tensor   # (U,) the distinct sampled node ids, ascending
    seeds: torch.Tensor   # (B,) positions in ``nodes`` of the batch's training nodes
    hop1: torch.Tensor    # (B, f1) positions of their sampled neighbours
    hop2: torch.Tensor    # (B, f1, f2) positions of the neighbours' sampled neighbours
    labels: torch.Tensor  # (B,) the training nodes' classes
    seed: int             # seeds this batch's dropout mask


class NeighbourCollate:
    """``collate_fn``: a list of training node ids -> :class:`SageBatch` with a 2-hop sampled
    neighbourhood (``fanouts[0]`` neighbours per node, ``fanouts[1]`` per neighbour, uniform
    with replacement).

    The generator of a batch is seeded by ``(seed, epoch, its node ids)``: the samples do not
    depend on which process builds the batch (loader workers included) nor on the world size.
    Set ``epoch`` before each epoch's ``iter(loader)`` (workers are forked at ``iter``).
    Picklable (a module-level class of arrays and ints), as loader workers need."""

    def __init__(self, graph: Graph, fanouts: tuple[int, int], seed: int) -> None:
        self.indptr, self.indices, self.labels = graph.indptr, graph.indices, graph.labels
        self.fanouts = tuple(fanouts)
        self.seed = seed
        self.epoch = 0

    def __call__(self, samples) -> SageBatch:
        seeds = np.asarray(samples, dtype=np.int64).reshape(-1)
        rng = np.random.default_rng(np.concatenate([[self.seed, self.epoch], seeds]))
        hop1 = sample_neighbours(self.indptr, self.indices, seeds, self.fanouts[0], rng)
        hop2 = sample_neighbours(self.indptr, self.indices, hop1, self.fanouts[1], rng)
        nodes, inverse = np.unique(np.concatenate([seeds, hop1.ravel(), hop2.ravel()]),
                                   return_inverse=True)
        b, n1 = len(seeds), hop1.size
        return SageBatch(torch.from_numpy(nodes), torch.from_numpy(inverse[:b]),
                         torch.from_numpy(inverse[b:b + n1].reshape(hop1.shape)),
                         torch.from_numpy(inverse[b + n1:].reshape(hop2.shape)),
                         torch.from_numpy(self.labels[seeds]),
                         int(rng.integers(2 ** 62)))


class TableKeys:
    """``keys_fn`` of IntentCollate: a batch's adapm keys are its sampled nodes plus the
    embedding table's offset (the table's keys are ``[offset, offset + num_nodes)``)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def __call__(self, batch: SageBatch) -> torch.Tensor:
        return batch.nodes + self.offset
