"""A model with adapm tables saved at one world size and loaded at another
(tests/test_torch_state.py).

    torch_state_job.py save DIR     # under the launcher with 2 ranks
    torch_state_job.py load DIR     # alone (1 rank) or under the launcher (3 ranks)

``save``: every rank trains the tables (AdaGrad, ``lr_decay`` so the step count matters) on its
own data, the ranks meet, and every rank computes the loss of a fixed batch (``before``). Rank 0
writes ``torch.save({"model": model.state_dict(), "optim": opt.state_dict()})``; all ranks write
a DCP checkpoint of the sharded state (``sharded_state_dict``, each rank its rows). Then rank 0
alone takes one more AdaGrad step on the fixed batch and computes the loss again (``after``:
it depends on the accumulated sums and the step count, i.e. on the optimizer state).

``load``: the same model built from other initial rows, loaded twice, each time computing
``before`` on every rank and ``after`` on rank 0 as above: from ``torch.load`` of rank 0's
file (every rank loads it), then from the DCP checkpoint (sharded across the ranks when there
are several, whole tables on one), then the model's state only (a fresh optimizer: ``after``
must differ).

Each rank prints one JSON line; the test compares the numbers.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import adapm
from adapm.torch import Embedding, EmbeddingBag, optim, sharded_state_dict

NUM_IDS = 500
DIM = 4
FIELDS = 3


class Model(torch.nn.Module):
    def __init__(self, worker, seed: int) -> None:
        super().__init__()
        self.emb = Embedding(NUM_IDS, DIM, worker=worker, seed=seed, scale=0.3)
        self.bag = EmbeddingBag(NUM_IDS, DIM, mode="sum", worker=worker, offset=NUM_IDS,
                                init="uniform", scale=0.2, seed=seed + 1)
        torch.manual_seed(seed)  # the same head on every rank of a run, another per seed
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, ids):
        return self.head(self.emb(ids).sum(1) + self.bag(ids)).squeeze(1)


def batch(seed: int):
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(0, NUM_IDS, (64, FIELDS)))
    return ids, torch.from_numpy((rng.random(64) < 0.5).astype(np.float32))


def loss_of(model, ids, labels):
    return torch.nn.functional.binary_cross_entropy_with_logits(model(ids), labels)


def make_optimizer(model):
    return optim.Adagrad(model, lr=0.3, lr_decay=0.1, initial_accumulator_value=0.05)


def evaluate_and_step(node, worker, model, opt) -> dict:
    """``before`` on every rank, then rank 0 alone takes a step and computes ``after``."""
    ids, labels = batch(99)
    with torch.no_grad():
        before = loss_of(model, ids, labels).item()
    node.barrier()
    after = None
    if node.rank == 0:
        opt.zero_grad()
        loss_of(model, ids, labels).backward()
        opt.step()
        worker.wait()
        with torch.no_grad():
            after = loss_of(model, ids, labels).item()
    node.barrier()
    return {"before": before, "after": after}


def settle(node, worker) -> None:
    """Every rank's pushes in the main copies, replicas refreshed."""
    worker.wait_sync()
    node.barrier()
    worker.wait_sync()


def process_group(node, path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=node.rank,
                            world_size=node.world_size)


def save(directory: str) -> dict:
    node = adapm.init(num_keys=2 * NUM_IDS, value_length=2 * DIM)
    w = node.worker()
    process_group(node, os.path.join(directory, "pg-save"))
    model = Model(w, seed=1)
    opt = make_optimizer(model)
    for step in range(6):
        ids, labels = batch(1000 * node.rank + step)
        opt.zero_grad()
        loss_of(model, ids, labels).backward()
        opt.step()
    settle(node, w)
    if node.rank == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()},
                   os.path.join(directory, "full.pt"))
    dcp.save({"model": sharded_state_dict(model), "optim": sharded_state_dict(opt)},
             checkpoint_id=os.path.join(directory, "dcp"))
    out = {"rank": node.rank, "saved": evaluate_and_step(node, w, model, opt),
           "steps": opt.steps}
    dist.destroy_process_group()
    node.shutdown()
    return out


def load(directory: str) -> dict:
    node = adapm.init(num_keys=2 * NUM_IDS, value_length=2 * DIM)
    w = node.worker()
    sharded = node.world_size > 1
    if sharded:
        process_group(node, os.path.join(directory, f"pg-load-{node.world_size}"))
    out = {"rank": node.rank, "world": node.world_size}

    model = Model(w, seed=7)
    opt = make_optimizer(model)
    ids, labels = batch(99)
    with torch.no_grad():
        out["fresh"] = loss_of(model, ids, labels).item()
    state = torch.load(os.path.join(directory, "full.pt"))
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    out["torch"] = evaluate_and_step(node, w, model, opt)

    model = Model(w, seed=11)  # rewrites every row: nothing of the first load is left
    opt = make_optimizer(model)
    if sharded:
        state = {"model": sharded_state_dict(model), "optim": sharded_state_dict(opt)}
    else:
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=os.path.join(directory, "dcp"))
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    out["dcp"] = evaluate_and_step(node, w, model, opt)
    out["steps"] = opt.steps

    # The weights without the optimizer's state: the same loss before, another after the step
    # (so the test sees that the sums and step counts travelled).
    model = Model(w, seed=13)
    opt = make_optimizer(model)
    model.load_state_dict(torch.load(os.path.join(directory, "full.pt"))["model"])
    out["weights_only"] = evaluate_and_step(node, w, model, opt)
    if sharded:
        dist.destroy_process_group()
    node.shutdown()
    return out


def main() -> None:
    torch.set_num_threads(1)
    mode, directory = sys.argv[1], sys.argv[2]
    out = save(directory) if mode == "save" else load(directory)
    # One write per line: the ranks share the pipe.
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
