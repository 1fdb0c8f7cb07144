"""A PyTorch training job on adapm, run by tests/test_torch.py alone or under the launcher.

Each rank trains on its own shard through a DataLoader with 2 worker processes (forked after the
node started), IntentCollate and IntentLoader:

1. exact sums: ``Embedding`` and ``EmbeddingBag`` (sum) rows start at zero, the loss is the sum of
   the outputs and SGD has lr 1, so every row ends at minus its number of uses over all ranks:
   no update may be lost while keys move between nodes;
2. a logistic regression on planted data with Adagrad rows and a dense layer kept equal on all
   nodes by DenseSync: the loss must fall.

Prints one JSON line per rank with what the test checks.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import adapm
from adapm.torch import (
    DenseSync,
    Embedding,
    EmbeddingBag,
    IntentCollate,
    IntentLoader,
    optim,
)

NUM_IDS = 2_000
DIM = 8
FIELDS = 4
SAMPLES = 3_000  # per rank
AHEAD = int(sys.argv[1]) if len(sys.argv) > 1 else 4  # batches of intent ahead


def shard(rank: int) -> np.ndarray:
    """Rank's samples: FIELDS ids each, mostly from the rank's own range (locality)."""
    rng = np.random.default_rng(100 + rank)
    own = rng.integers(0, NUM_IDS // 2, (SAMPLES, FIELDS)) + (rank % 2) * (NUM_IDS // 2)
    shared = rng.integers(0, 50, (SAMPLES, FIELDS))
    return np.where(rng.random((SAMPLES, FIELDS)) < 0.9, own, shared).astype(np.int64)


def keys_of_both_tables(batch):
    """The batch's adapm keys: its ids in the table at offset 0 and in the one at NUM_IDS."""
    return torch.cat([batch[0], batch[0] + NUM_IDS])


def keys_of_model(batch):
    """The batch's adapm keys in the model's table (offset 2 NUM_IDS)."""
    return batch[0] + 2 * NUM_IDS


def accesses(node) -> tuple[int, int]:
    """(remote, all) keys pulled and pushed by this node so far."""
    s = node.stats()
    remote = s["remote_pull_keys"] + s["remote_push_keys"]
    return remote, remote + s["local_pull_keys"] + s["waited_pull_keys"] + s["local_push_keys"]


def main() -> None:
    torch.set_num_threads(1)
    # keys: tables [0, NUM_IDS), [NUM_IDS, 2 NUM_IDS), [2 NUM_IDS, 3 NUM_IDS), the dense layer
    node = adapm.init(num_keys=3 * NUM_IDS + 64, value_length=2 * DIM)
    w = node.worker()
    rank, world = node.rank, node.world_size
    ids = torch.from_numpy(shard(rank))

    # --- 1. exact sums ---
    emb = Embedding(NUM_IDS, DIM, worker=w, init="zeros")
    bag = EmbeddingBag(NUM_IDS, DIM, mode="sum", worker=w, offset=NUM_IDS, init="zeros")
    opt = optim.SGD([emb, bag], lr=1.0)
    loader = DataLoader(TensorDataset(ids), batch_size=64, num_workers=2,
                        collate_fn=IntentCollate(None, keys_of_both_tables))
    for batch in IntentLoader(loader, w, ahead=AHEAD):
        opt.zero_grad()
        (emb(batch[0]).sum() + bag(batch[0]).sum()).backward()
        opt.step()
    training = [accesses(node)]
    w.wait_sync()
    node.barrier()
    w.wait_sync()
    expected = np.zeros(NUM_IDS)
    for r in range(world):
        np.add.at(expected, shard(r).ravel(), 1.0)
    exact = bool(np.array_equal(emb.weight.numpy(), -np.repeat(expected[:, None], DIM, 1)) and
                 np.array_equal(bag.weight.numpy(), -np.repeat(expected[:, None], DIM, 1)))

    # --- 2. logistic regression: planted weights per id, Adagrad rows, a DenseSync'd layer ---
    planted = np.random.default_rng(7).standard_normal(NUM_IDS).astype(np.float32)
    labels = torch.from_numpy((planted[shard(rank)].sum(1) > 0).astype(np.float32))
    model_emb = EmbeddingBag(NUM_IDS, DIM, mode="sum", worker=w, offset=2 * NUM_IDS, scale=0.1,
                             seed=1)
    head = torch.nn.Linear(DIM, 1)
    sync = DenseSync(head.parameters(), worker=w, offset=3 * NUM_IDS)
    rows_opt = optim.Adagrad(model_emb, lr=0.1)
    dense_opt = torch.optim.SGD(head.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(ids, labels), batch_size=64, shuffle=True, num_workers=2,
                        collate_fn=IntentCollate(None, keys_of_model))
    losses = []
    training.append(accesses(node))
    for epoch in range(4):
        total = 0.0
        for x, y in IntentLoader(loader, w, ahead=AHEAD):
            rows_opt.zero_grad()
            dense_opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                head(model_emb(x)).squeeze(1), y)
            loss.backward()
            rows_opt.step()
            dense_opt.step()
            sync.step()
            total += loss.item() * len(y)
        losses.append(total / SAMPLES)
    training.append(accesses(node))
    w.wait_sync()
    node.barrier()
    w.wait_sync()
    sync.step()
    dense = np.concatenate([p.detach().numpy().ravel() for p in head.parameters()])
    # remote share of the training loops' pulls and pushes (not of the checks between them)
    remote = training[0][0] + training[2][0] - training[1][0]
    total = training[0][1] + training[2][1] - training[1][1]
    # One write per line: the ranks share the pipe (print writes the newline separately when
    # Python runs unbuffered).
    sys.stdout.write(json.dumps({"rank": rank, "world": world, "exact": exact, "losses": losses,
                                 "dense": dense.tolist(), "remote_share": remote / total,
                                 "clock": w.clock}) + "\n")
    sys.stdout.flush()
    node.shutdown()


if __name__ == "__main__":
    sys.exit(main())
