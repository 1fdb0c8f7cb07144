"""adapm.torch: intent from the data loader, adapm-backed embeddings and their optimizers.

Loader wrappers against a recording worker (what intent was signalled for which clock); the
embeddings and optimizers against torch's own on one node, step by step; bad input; and a real
job on 2 nodes (tests/torch_job.py) with loader worker processes forked after the node started.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from app_cli import ENV, LAUNCHER, PY, records, run
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

import adapm
from adapm.torch import (
    DenseSync,
    Embedding,
    EmbeddingBag,
    EmbeddingBagCollection,
    IntentCollate,
    IntentLoader,
    KeyedBatch,
    optim,
)
from adapm.torch.data import distinct

# torch's own default, said out loud: its sparse Adagrad (the peer here) warns otherwise that
# the checks are "implicitly disabled".
torch.sparse.check_sparse_tensor_invariants.disable()

torch.set_num_threads(1)


# --- the loader wrappers -------------------------------------------------------------------------


class RecordingWorker:
    """Has a worker's intent/clock interface; records every intent with the clock it came at."""

    def __init__(self) -> None:
        self.clock = 0
        self.intents: list[tuple[np.ndarray, int, int, int]] = []  # keys, start, end, at clock
        self.syncs: list[tuple[int, int]] = []  # (clock, intents signalled) at each wait_sync

    def intent(self, keys, start, end):
        self.intents.append((np.array(keys), start, end, self.clock))

    def advance_clock(self):
        self.clock += 1
        return self.clock

    def wait_sync(self):
        self.syncs.append((self.clock, len(self.intents)))


def ids_of(batch):
    return batch[0]


def _loader(num_samples: int, batch_size: int, num_workers: int) -> DataLoader:
    ids = torch.arange(3 * num_samples).reshape(num_samples, 3) % 17
    return DataLoader(TensorDataset(ids), batch_size=batch_size, num_workers=num_workers,
                      collate_fn=IntentCollate(None, ids_of))


def _check_intents(worker: RecordingWorker, trained: list, ahead: int) -> None:
    """Each batch trained at clock c had its keys signalled for [c, c + 1), at a clock at least
    min(ahead, c - first) earlier; nothing else was signalled for clocks it trained."""
    by_start = {start: (keys, end, at) for keys, start, end, at in worker.intents}
    assert len(by_start) == len(worker.intents), "two intents for one clock"
    first = trained[0][0] if trained else 0
    for clock, batch in trained:
        keys, end, at = by_start[clock]
        assert end == clock + 1
        np.testing.assert_array_equal(np.sort(keys), np.unique(batch[0].numpy()))
        assert clock - at >= min(ahead, clock - first), (clock, at)
    # no intent outlives the iteration
    assert all(end <= worker.clock for _, _, end, _ in worker.intents)
    # one wait for the first batch's keys (it has no lead), after its intent, before training it
    if trained:
        assert len(worker.syncs) == 1
        clock, signalled = worker.syncs[0]
        assert clock == first and signalled >= 1
        assert any(start == first for _, start, _, _ in worker.intents[:signalled])
    else:
        assert not worker.syncs


@pytest.mark.parametrize("num_workers", [0, 2])
@settings(max_examples=8, deadline=None)
@given(num_samples=st.integers(0, 23), batch_size=st.integers(1, 5), ahead=st.integers(1, 6),
       stop_after=st.one_of(st.none(), st.integers(0, 6)))
def test_loader_signals_each_batch_at_the_clock_it_is_trained(num_workers, num_samples,
                                                              batch_size, ahead, stop_after):
    loader = _loader(num_samples, batch_size, num_workers)
    worker = RecordingWorker()
    wrapped = IntentLoader(loader, worker, ahead=ahead)
    for epoch in range(2):  # epochs continue the clock
        trained = []
        for batch in wrapped:
            trained.append((worker.clock, batch))
            if stop_after is not None and len(trained) > stop_after:
                break
        expected = -(-num_samples // batch_size)
        if stop_after is not None:
            expected = min(expected, stop_after + 1)
        assert len(trained) == expected
        if trained:  # the last, short batch included
            assert len(trained[-1][1][0]) == (num_samples - 1) % batch_size + 1 or \
                stop_after is not None
        _check_intents(worker, trained, ahead)
        worker.intents.clear()
        worker.syncs.clear()


def test_collate_returns_distinct_keys_in_order_of_first_appearance_and_pickles():
    import pickle

    collate = IntentCollate(None, ids_of)
    out = collate([(torch.tensor([5, 3, 5]),), (torch.tensor([1, 3, 9]),)])
    assert isinstance(out, KeyedBatch)
    np.testing.assert_array_equal(out.keys, [5, 3, 1, 9])
    assert out.keys.dtype == np.int64
    again = pickle.loads(pickle.dumps(collate))
    np.testing.assert_array_equal(again([(torch.tensor([2]),)]).keys, [2])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-2**62, 2**62), max_size=300), st.integers(1, 40))
def test_distinct_is_unique_with_inverse_in_order_of_first_appearance(values, spread):
    keys = np.array(values, dtype=np.int64) // spread  # repeats, negatives, huge keys
    unique, inverse = distinct(keys)
    np.testing.assert_array_equal(unique[inverse], keys)
    _, first = np.unique(keys, return_index=True)
    np.testing.assert_array_equal(unique, keys[np.sort(first)])


def test_two_loaders_in_one_process_keep_their_own_clocks():
    a, b = RecordingWorker(), RecordingWorker()
    la, lb = IntentLoader(_loader(10, 3, 0), a, ahead=2), IntentLoader(_loader(4, 1, 0), b)
    for _ in zip(la, lb):
        pass
    assert a.clock >= 3 and b.clock == 4
    assert all(end <= a.clock for _, _, end, _ in a.intents)


# --- embeddings and optimizers against torch, one node -----------------------------------------


@pytest.fixture
def node(no_launcher):
    n = adapm.init(num_keys=400, value_length=8)
    yield n
    n.shutdown()


def _torch_twin(table, kind):
    """A torch table with the same weights as the adapm one (sparse gradients; torch has none
    for mode "max", where dense ones update the same rows: the others' gradients are zero)."""
    if kind == "bag":
        twin = torch.nn.EmbeddingBag(table.num_embeddings, table.embedding_dim, mode=table.mode,
                                     sparse=table.mode != "max", padding_idx=table.padding_idx,
                                     include_last_offset=table.include_last_offset)
    else:
        twin = torch.nn.Embedding(table.num_embeddings, table.embedding_dim, sparse=True,
                                  padding_idx=table.padding_idx)
    with torch.no_grad():
        twin.weight.copy_(table.weight)
    return twin


OPTIMIZERS = {
    "sgd": (lambda t: optim.SGD(t, lr=0.3), lambda p: torch.optim.SGD(p, lr=0.3)),
    "adagrad": (lambda t: optim.Adagrad(t, lr=0.2, lr_decay=0.05, initial_accumulator_value=0.1,
                                        eps=1e-8),
                lambda p: torch.optim.Adagrad(p, lr=0.2, lr_decay=0.05,
                                              initial_accumulator_value=0.1, eps=1e-8)),
    "sgd-maximize": (lambda t: optim.SGD(t, lr=0.3, maximize=True),
                     lambda p: torch.optim.SGD(p, lr=0.3, maximize=True)),
    "adagrad-maximize": (lambda t: optim.Adagrad(t, lr=0.2, maximize=True),
                         lambda p: torch.optim.Adagrad(p, lr=0.2, maximize=True)),
}



def test_a_table_over_part_of_another_tables_keys_is_refused(node):
    """A forgotten offset (items at 25 where users hold [0, 50)) re-initialised half of the
    users' rows, silently: refused now before anything is written, naming both ranges. The
    same range again (a model built again) and a range a gone table held are fine."""
    w = node.worker()
    users = Embedding(50, 4, worker=w, seed=1)
    before = users.weight.clone()
    for first, n in ((25, 50), (0, 10), (49, 1), (10, 20)):
        with pytest.raises(adapm.InvalidArgument,
                           match=rf"keys \[{first}, {first + n}\) overlap those of a live "
                                 r"table on this node, \[0, 50\) \(Embedding\)"):
            EmbeddingBag(n, 4, worker=w, offset=first, seed=2)
    assert torch.equal(users.weight, before)
    items = Embedding(50, 4, worker=w, offset=50)  # adjacent: fine
    again = Embedding(50, 4, worker=w, seed=1)  # the same keys: a model built again
    assert torch.equal(again.weight, before)
    del users, again
    gc.collect()
    Embedding(20, 4, worker=w, offset=30)  # [0, 50) is free again
    with pytest.raises(adapm.InvalidArgument, match=r"\[50, 100\)"):
        Embedding(30, 4, worker=w, offset=40)
    assert items.weight.shape == (50, 4)
    # two features of one size, one offset forgotten: the collection refuses them
    f1 = EmbeddingBag(100, 4, mode="sum", worker=w, offset=200)
    f2 = EmbeddingBag(100, 4, mode="sum", worker=w, offset=200)
    with pytest.raises(adapm.InvalidArgument, match="tables 'a' and 'b' share keys"):
        EmbeddingBagCollection({"a": f1, "b": f2})

@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_trains_as_torch_does(node, opt, padding_idx):
    w = node.worker()
    table = Embedding(50, 4, padding_idx=padding_idx, worker=w, offset=100, seed=5)
    twin = _torch_twin(table, "emb")
    ours, theirs = OPTIMIZERS[opt][0](table), OPTIMIZERS[opt][1](twin.parameters())
    rng = np.random.default_rng(0)
    for step in range(6):
        idx = torch.from_numpy(rng.integers(0, 50, (7, 3)))  # repeats within and across rows
        target = torch.from_numpy(rng.standard_normal((7, 3, 4)).astype(np.float32))
        for model, optimizer in ((table, ours), (twin, theirs)):
            optimizer.zero_grad()
            # used twice in one step: gradients add up before the update
            loss = ((model(idx) - target) ** 2).sum() + model(idx[:2]).pow(3).sum()
            loss.backward()
            optimizer.step()
        np.testing.assert_allclose(table.weight.numpy(), twin.weight.detach().numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
    if padding_idx is not None:
        assert not table.weight[padding_idx].any()


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_zero_grad_between_forward_and_backward_trains_as_torch_does(node, opt):
    """``loss = f(model(x)); opt.zero_grad(); loss.backward(); opt.step()``, common in torch
    code, trained nothing here (zero_grad dropped the forward's rows). Also gradient
    accumulation over two backward calls and a forward whose output is never differentiated
    (its rows go at the second zero_grad; torch never sees them)."""
    table = Embedding(50, 4, worker=node.worker(), offset=100, seed=5)
    twin = _torch_twin(table, "emb")
    ours, theirs = OPTIMIZERS[opt][0](table), OPTIMIZERS[opt][1](twin.parameters())
    rng = np.random.default_rng(1)
    for step in range(4):
        idx = [torch.from_numpy(rng.integers(0, 50, (5, 2))) for _ in range(3)]
        for model, optimizer in ((table, ours), (twin, theirs)):
            model(idx[2]).sum()  # never differentiated
            first = (model(idx[0]) ** 2).sum()
            optimizer.zero_grad()
            first.backward()
            (model(idx[1]) ** 3).sum().backward()
            optimizer.step()
        np.testing.assert_allclose(table.weight.numpy(), twin.weight.detach().numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
    assert table.pending == []
    table(idx[0]).sum()  # spared by one zero_grad, dropped by the next
    ours.zero_grad()
    assert len(table.pending) == 1
    ours.zero_grad()
    assert table.pending == []


SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda epoch: 1 / (1 + epoch)),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 10),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(
        o, max_lr=0.5, total_steps=10, cycle_momentum=False),
}


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_torch_lr_schedulers_drive_the_optimizers_as_torchs(node, opt, scheduler):
    """torch's schedulers refused these optimizers ("is not an Optimizer"): now each sets the
    same rates as on torch's optimizer, the rows train alike, and a state_dict keeps what the
    scheduler added to the groups (a resumed scheduler needs "initial_lr")."""
    table = Embedding(50, 4, worker=node.worker(), offset=100, seed=5)
    twin = _torch_twin(table, "emb")
    ours, theirs = OPTIMIZERS[opt][0](table), OPTIMIZERS[opt][1](twin.parameters())
    assert isinstance(ours, torch.optim.Optimizer)
    ticks = []
    ours.register_step_post_hook(lambda optimizer, args, kwargs: ticks.append(optimizer))
    schedules = [SCHEDULERS[scheduler](ours), SCHEDULERS[scheduler](theirs)]
    rng = np.random.default_rng(2)
    for step in range(4):
        idx = torch.from_numpy(rng.integers(0, 50, (6, 2)))
        for model, optimizer, schedule in ((table, ours, schedules[0]),
                                           (twin, theirs, schedules[1])):
            optimizer.zero_grad()
            (model(idx) ** 2).sum().backward()
            optimizer.step()
            schedule.step()
        assert ours.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"])
        np.testing.assert_allclose(table.weight.numpy(), twin.weight.detach().numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
    assert ticks == [ours] * 4  # torch's step hooks run
    again = OPTIMIZERS[opt][0](table)
    again.load_state_dict(ours.state_dict())
    assert again.param_groups[0]["initial_lr"] == theirs.param_groups[0]["initial_lr"]
    torch.optim.lr_scheduler.StepLR(again, 1, last_epoch=3)  # resumes: needs initial_lr
    with pytest.raises(TypeError, match=r"save optimizer.state_dict\(\) instead"):
        pickle.dumps(ours)


def test_from_pretrained_and_weight_start_from_given_rows_as_torchs(node):
    w = node.worker()
    rows = torch.from_numpy(np.random.default_rng(3).standard_normal((12, 4)).astype(np.float32))
    idx = torch.tensor([[1, 2], [11, 0]])
    frozen = Embedding.from_pretrained(rows, worker=w, offset=100)
    theirs = torch.nn.Embedding.from_pretrained(rows)
    torch.testing.assert_close(frozen(idx), theirs(idx))
    assert not frozen(idx).requires_grad  # freeze=True, as torch's default
    trained = Embedding(12, 4, padding_idx=0, _weight=rows, worker=w, offset=120)
    assert trained(idx).requires_grad
    torch.testing.assert_close(trained.weight, rows)  # the padding row as given, as torch's
    assert not w.pull(np.arange(120, 132))[:, 4:].any()  # the rest of each row zero
    bag = EmbeddingBag.from_pretrained(rows, freeze=False, mode="sum", worker=w, offset=140)
    torch.testing.assert_close(bag(idx), torch.nn.EmbeddingBag.from_pretrained(
        rows, mode="sum")(idx))
    before = w.pull(np.arange(200, 300)).copy()
    for call, error in ((lambda: Embedding.from_pretrained(rows[0], worker=w, offset=200),
                         adapm.InvalidArgument),
                        (lambda: Embedding(12, 5, _weight=rows, worker=w, offset=200),
                         adapm.InvalidArgument),
                        (lambda: EmbeddingBag(12, 4, _weight=rows.long(), worker=w, offset=200),
                         adapm.InvalidType)):
        with pytest.raises(error, match="weights"):
            call()
    np.testing.assert_array_equal(w.pull(np.arange(200, 300)), before)  # nothing written


def test_the_optimizers_take_torchs_implementation_flags(node):
    table = Embedding(10, 4, worker=node.worker())
    optim.SGD(table, lr=0.1, foreach=None, fused=None, differentiable=False)
    optim.Adagrad(table, lr=0.1, foreach=True, fused=False, differentiable=False)
    with pytest.raises(adapm.InvalidArgument, match="differentiable is not supported"):
        optim.Adagrad(table, differentiable=True)
    grouped = optim.SGD(table, lr=0.1)
    grouped.add_param_group({"params": Embedding(5, 4, worker=node.worker(), offset=20),
                             "lr": 0.5})
    assert [g["lr"] for g in grouped.param_groups] == [0.1, 0.5]
    with pytest.raises(adapm.InvalidArgument, match="a table is given twice"):
        grouped.add_param_group({"params": table})
    assert len(grouped.param_groups) == 2 and len(grouped.state) == 2


def test_a_table_restored_from_a_checkpoint_trains_on_as_torch_does(no_launcher, tmp_path):
    """Three AdaGrad steps (with lr_decay, which depends on the step count), a checkpoint, a
    new process's worth of objects from it (``init="keep"``, the optimizer's state_dict), three
    more steps: the rows equal torch's after six uninterrupted steps."""
    rng = np.random.default_rng(4)
    batches = [torch.from_numpy(rng.integers(0, 50, (7, 3))) for _ in range(6)]
    make_ours, make_theirs = OPTIMIZERS["adagrad"]

    def train(table, optimizer, steps):
        for idx in steps:
            optimizer.zero_grad()
            (table(idx) ** 2).sum().backward()
            optimizer.step()

    with adapm.init(num_keys=400, value_length=8) as node:
        table = Embedding(50, 4, worker=node.worker(), offset=100, seed=5)
        twin = _torch_twin(table, "emb")
        ours = make_ours(table)
        train(table, ours, batches[:3])
        node.checkpoint(str(tmp_path / "ck"), meta={"optimizer": ours.state_dict(with_rows=False)})
    theirs = make_theirs(twin.parameters())
    train(twin, theirs, batches)
    path = str(tmp_path / "ck")
    with adapm.init(num_keys=400, value_length=8, restore=path) as node:
        table = Embedding(50, 4, worker=node.worker(), offset=100, init="keep")
        ours = make_ours(table)
        ours.load_state_dict(adapm.checkpoint_meta(path)["optimizer"])
        train(table, ours, batches[3:])
        np.testing.assert_allclose(table.weight.numpy(), twin.weight.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
        with pytest.raises(adapm.InvalidArgument, match="load_state_dict"):
            ours.load_state_dict({"steps": [1, 2]})


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode,weighted,layout", [
    ("sum", False, "offsets"), ("sum", True, "offsets"), ("mean", False, "offsets"),
    ("max", False, "offsets"), ("mean", False, "2d"), ("sum", True, "last_offset"),
    ("sum", False, "padding"),
])
def test_embedding_bag_trains_as_torch_does(node, opt, mode, weighted, layout):
    w = node.worker()
    padding_idx = 2 if layout == "padding" else None
    table = EmbeddingBag(30, 4, mode=mode, include_last_offset=layout == "last_offset",
                         padding_idx=padding_idx, worker=w, offset=7, init="uniform", scale=0.5,
                         seed=9)
    twin = _torch_twin(table, "bag")
    ours, theirs = OPTIMIZERS[opt][0](table), OPTIMIZERS[opt][1](twin.parameters())
    rng = np.random.default_rng(1)
    for step in range(5):
        if layout == "2d":
            idx, offsets = torch.from_numpy(rng.integers(0, 30, (6, 4))), None
        else:
            idx = torch.from_numpy(rng.integers(0, 30, 20))
            starts = np.sort(rng.choice(np.arange(1, 20), 4, replace=False))
            offsets = torch.from_numpy(np.concatenate(([0], starts)))
            if layout == "last_offset":
                offsets = torch.cat([offsets, torch.tensor([20])])
        psw = torch.from_numpy(rng.random(idx.shape).astype(np.float32)) if weighted else None
        for model, optimizer in ((table, ours), (twin, theirs)):
            optimizer.zero_grad()
            out = model(idx, offsets, per_sample_weights=psw)
            (out.sin() * torch.arange(out.shape[1])).sum().backward()
            optimizer.step()
        np.testing.assert_allclose(table.weight.numpy(), twin.weight.detach().numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=f"step {step}")


def test_tables_share_the_key_space_through_offsets_and_init_is_reproducible(no_launcher):
    with adapm.init(num_keys=300, value_length=6) as node:
        w = node.worker()
        a = Embedding(100, 3, worker=w, seed=1)
        b = Embedding(200, 3, worker=w, offset=100, init="zeros")
        optim.SGD([a, b], lr=1.0)
        first = a.weight.numpy().copy()
        assert not b.weight.numpy().any()
        assert abs(first.std() - 1.0) < 0.15  # torch's default N(0, 1)
        c = Embedding(100, 3, worker=w, seed=1)  # rewrites the same rows, same values
        np.testing.assert_array_equal(c.weight.numpy(), first)
        assert not w.pull(np.arange(100))[:, 3:].any()  # optimizer state starts at zero


def test_tables_and_dense_sync_on_a_node_whose_keys_differ_in_length(no_launcher):
    """Each table takes the length of its own keys (a deep table with AdaGrad state, a wide one
    of one weight and its accumulator, dense keys of 5): the values go packed, training is
    still torch's."""
    lengths = np.concatenate([np.full(40, 8), np.full(40, 2), np.full(10, 5)])
    with adapm.init(num_keys=90, value_length=lengths) as node:
        w = node.worker()
        deep = Embedding(40, 4, worker=w, seed=2)
        wide = EmbeddingBag(40, 1, mode="sum", worker=w, offset=40, seed=3)
        twins = [_torch_twin(deep, "emb"), _torch_twin(wide, "bag")]
        ours = optim.Adagrad([deep, wide], lr=0.2)
        theirs = torch.optim.Adagrad([p for t in twins for p in t.parameters()], lr=0.2)
        layer = torch.nn.Linear(4, 2)
        sync = DenseSync(layer.parameters(), worker=w, offset=80)
        assert len(sync.keys) == DenseSync.keys_needed(layer.parameters(), 5) == 2
        rng = np.random.default_rng(3)
        for _ in range(4):
            idx = torch.from_numpy(rng.integers(0, 40, (6, 3)))
            for (emb, bag), optimizer in (((deep, wide), ours), (twins, theirs)):
                optimizer.zero_grad()
                (emb(idx).sum(1) * bag(idx)).pow(2).sum().backward()
                optimizer.step()
            sync.step()
        for table, twin in zip((deep, wide), twins):
            np.testing.assert_allclose(table.weight.numpy(), twin.weight.detach().numpy(),
                                       rtol=1e-5, atol=1e-6)
        with pytest.raises(adapm.InvalidArgument, match="one value length"):
            DenseSync(torch.nn.Linear(4, 4).parameters(), worker=w, offset=75)


def test_dense_sync_on_one_node_keeps_the_optimizers_changes(no_launcher):
    with adapm.init(num_keys=50, value_length=4) as node:
        w = node.worker()
        layer = torch.nn.Linear(3, 2)
        before = [p.detach().clone() for p in layer.parameters()]
        sync = DenseSync(layer.parameters(), worker=w, offset=10)
        assert all(torch.equal(p, q) for p, q in zip(layer.parameters(), before))
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            layer(torch.ones(5, 3)).sum().backward()
            opt.step()
            expected = [p.detach().clone() for p in layer.parameters()]
            sync.step()
            for p, q in zip(layer.parameters(), expected):
                torch.testing.assert_close(p.detach(), q)
        assert DenseSync.keys_needed(layer.parameters(), 4) == 2


# --- bad input ---------------------------------------------------------------------------------


def test_bad_input_gives_a_clear_error_and_changes_nothing(node):
    w = node.worker()
    emb = Embedding(20, 4, worker=w)
    bag = EmbeddingBag(20, 4, mode="sum", worker=w, offset=20)
    narrow = Embedding(10, 5, worker=w, offset=40)  # rows of 8 floats: no room for AdaGrad's
    before = w.pull(np.arange(50)).copy()
    cases = [
        (lambda: emb(torch.tensor([0.0, 1.0])), adapm.InvalidType, "integer tensor"),
        (lambda: emb(torch.tensor([1, 20])), adapm.InvalidArgument, "index 20"),
        (lambda: emb(torch.tensor([-1])), adapm.InvalidArgument, "index -1"),
        (lambda: emb([1, 2]), adapm.InvalidType, "tensor of indices"),
        (lambda: bag(torch.tensor([1, 2, 3]), torch.tensor([1, 2])), adapm.InvalidArgument,
         "offsets\\[0\\] must be 0"),
        (lambda: bag(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1])), adapm.InvalidArgument,
         "non-decreasing"),
        (lambda: bag(torch.tensor([1, 2, 3]), torch.tensor([0, 5])), adapm.InvalidArgument,
         "past the end"),
        (lambda: bag(torch.tensor([1, 2, 3])), adapm.InvalidArgument, "needs offsets"),
        (lambda: bag(torch.tensor([[1, 2]]), torch.tensor([0])), adapm.InvalidArgument,
         "must be None"),
        (lambda: bag(torch.tensor([1, 2]), torch.tensor([0.0])), adapm.InvalidType, "offsets"),
        (lambda: bag(torch.tensor([1, 2]), torch.tensor([0]), torch.ones(3)),
         adapm.InvalidArgument, "per_sample_weights"),
        (lambda: bag(torch.tensor([1, 2]), torch.tensor([0]), torch.ones(2, dtype=torch.float64)),
         adapm.InvalidType, "per_sample_weights must be float32"),
        (lambda: DenseSync([torch.ones(2)], w, "3"), adapm.InvalidType, "offset must be an int"),
        (lambda: DenseSync([torch.ones(2)], w, 1.5), adapm.InvalidType, "offset must be an int"),
        (lambda: Embedding(500, 4, worker=w), adapm.InvalidArgument, "do not fit"),
        (lambda: Embedding(10, 9, worker=w), adapm.InvalidArgument, "at least embedding_dim"),
        (lambda: Embedding(10, 4), adapm.InvalidArgument, "worker="),
        (lambda: Embedding(10, 4, worker=w, init="xavier"), adapm.InvalidArgument, "init"),
        (lambda: Embedding(10, 4, worker=w, max_norm=1.0), adapm.InvalidArgument, "max_norm"),
        (lambda: Embedding(10.0, 4, worker=w), adapm.InvalidType, "num_embeddings"),
        (lambda: EmbeddingBag(10, 4, mode="median", worker=w), adapm.InvalidArgument, "mode"),
        (lambda: optim.Adagrad(narrow), adapm.InvalidArgument, "accumulator"),
        (lambda: optim.SGD(emb, momentum=0.9), adapm.InvalidArgument, "momentum"),
        (lambda: optim.SGD(torch.nn.Linear(2, 2)), adapm.InvalidArgument, "no adapm"),
        (lambda: optim.SGD([torch.nn.Parameter(torch.ones(2))]), adapm.InvalidType,
         "torch optimizer"),
        (lambda: optim.Adagrad(emb, lr=-1), adapm.InvalidArgument, "lr"),
        (lambda: IntentLoader(_loader(3, 1, 0), None), adapm.InvalidArgument, "needs a worker"),
        (lambda: IntentLoader(_loader(3, 1, 0), object()), adapm.InvalidType, "Worker"),
        (lambda: IntentLoader(_loader(3, 1, 0), w, ahead=0), adapm.InvalidArgument, "ahead"),
        (lambda: list(IntentLoader(DataLoader(TensorDataset(torch.arange(3))), w)),
         adapm.InvalidType, "IntentCollate"),
        (lambda: IntentCollate(None, None), adapm.InvalidArgument, "keys_fn"),
        (lambda: list(IntentLoader(DataLoader(
            TensorDataset(torch.arange(3)), collate_fn=IntentCollate(
                None, lambda b: b[0] + 10_000)), w)),
         adapm.InvalidArgument, r"keys_fn gave for a batch: .*outside .* table.offset \+ indices"),
        (lambda: IntentCollate(None, lambda b: b.float())([torch.ones(2)]), adapm.InvalidType,
         "integers"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text):
            call()
    np.testing.assert_array_equal(w.pull(np.arange(50)), before)
    assert emb(torch.tensor([1])).shape == (1, 4)  # still working
    # int32 indices and offsets, as torch accepts them
    same = bag(torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32))
    torch.testing.assert_close(same, bag(torch.tensor([1, 2, 3]), torch.tensor([0, 1])))


def test_a_loader_on_a_node_that_was_shut_down_says_so(no_launcher):
    node = adapm.init(num_keys=20, value_length=2)
    w = node.worker()
    node.shutdown()
    with pytest.raises(adapm.StateError, match="shut"):
        next(iter(IntentLoader(_loader(3, 1, 0), w)))


def test_import_adapm_does_not_import_torch():
    code = "import sys, adapm; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=ENV, timeout=60)


# --- real processes --------------------------------------------------------------------------

JOB = os.path.join(os.path.dirname(__file__), "torch_job.py")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nodes", [1, 2])
def test_a_torch_job_trains_exactly_on_real_nodes_with_loader_workers(nodes):
    launcher = [*LAUNCHER, "-n", str(nodes)] if nodes > 1 else []
    out = records(run([*launcher, PY, JOB], timeout=360).stdout)
    assert sorted(r["rank"] for r in out) == list(range(nodes))
    for r in out:
        assert r["exact"], f"rank {r['rank']}: an update was lost"
        assert r["losses"][-1] < 0.8 * r["losses"][0], r["losses"]
    assert all(r["dense"] == out[0]["dense"] for r in out), "dense layers differ between nodes"
    # intent 4 batches ahead (and the loader's wait for each iteration's first batch) keeps
    # the training loops' accesses local: at most 0.01% remote over the job (measured: 0-0.0024%
    # per rank on a quiet machine). How early the engine acts depends on the CPU it gets, so one
    # rank of a run beside other jobs saw 0.011%: per rank the bound is 0.1%, as in the GNN test.
    shares = {r["rank"]: r["remote_share"] for r in out}
    assert all(share <= 1e-3 for share in shares.values()), shares
    assert sum(shares.values()) / len(shares) <= 1e-4, shares


README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")

# Runs the README's script exactly as written (runpy) and records, per epoch, the examples the
# sampler handed this rank (with their ids, read from the sampler's dataset) and the batches
# the training loop received from IntentLoader and stepped on.
README_RECORDER = """
import json, os, runpy, sys
import torch.utils.data as tud
import adapm.torch, adapm.torch.optim
epochs, steps = [], [0]
sampled = tud.DistributedSampler.__iter__
def sampler_iter(self):
    indices = list(sampled(self))
    epochs.append({"epoch": self.epoch, "indices": indices, "trained": [],
                   "ids": self.dataset.tensors[0][indices].tolist()})
    return iter(indices)
tud.DistributedSampler.__iter__ = sampler_iter
class RecordingLoader(adapm.torch.IntentLoader):
    def __iter__(self):
        for batch in super().__iter__():
            epochs[-1]["trained"] += batch[0].tolist()
            yield batch
adapm.torch.IntentLoader = RecordingLoader
stepped = adapm.torch.optim.Adagrad.step
def step(self, closure=None):
    steps[0] += 1
    return stepped(self, closure)
adapm.torch.optim.Adagrad.step = step
runpy.run_path(sys.argv[1], run_name="__main__")
# A file per process: lines this long from two ranks would interleave on the shared pipe.
with open(f"record-{os.getpid()}.json", "w") as f:
    json.dump({"epochs": epochs, "steps": steps[0]}, f)
"""


@pytest.mark.timeout(400)
def test_the_readme_script_trains_each_example_once_per_epoch_on_2_ranks(tmp_path):
    """The PyTorch script of the README, as written, under the launcher on 2 ranks: per epoch
    the ranks train disjoint shares that together are the dataset, each example once, in
    another order each epoch; the loss falls; rank 0 saves the whole table."""
    text = open(README).read()
    start = text.index("```python\n# train.py") + len("```python\n")
    (tmp_path / "train.py").write_text(text[start:text.index("```", start)])
    (tmp_path / "recorder.py").write_text(README_RECORDER)
    proc = subprocess.run([*LAUNCHER, "-n", "2", PY, "recorder.py", "train.py"], env=ENV,
                          cwd=tmp_path, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = [json.loads(path.read_text()) for path in tmp_path.glob("record-*.json")]
    assert len(out) == 2, proc.stdout[-2000:]
    size, batch = 4000, 256
    for epoch in range(4):
        shares = [r["epochs"][epoch] for r in out]
        assert all(s["epoch"] == epoch for s in shares)  # set_epoch reached the sampler
        indices = [i for s in shares for i in s["indices"]]
        assert sorted(indices) == list(range(size))  # disjoint, and together the dataset
        for s in shares:
            assert s["trained"] == s["ids"], "the loop trained other examples than sampled"
    for r in out:
        orders = [e["indices"] for e in r["epochs"]]
        assert len(orders) == 4 and orders[0] != orders[1]  # another order each epoch
        assert r["steps"] == 4 * -(-size // 2 // batch)  # one step per batch
    # The ranks share the launcher's stdout, and an unbuffered print writes its line and its
    # newline in two calls: one rank's line can land before the other's newline.
    losses = {(int(rank), int(epoch)): float(loss) for rank, epoch, loss in re.findall(
        r"rank (\d+) epoch (\d+) loss (\d+\.\d{4})", proc.stdout)}
    assert len(losses) == 8, proc.stdout[-2000:]
    assert all(losses[(r, 3)] < 0.45 for r in (0, 1)), losses  # 0.69 at the start
    state = torch.load(tmp_path / "model.pt")
    assert state["model"]["emb.weight"].shape == (3000, 8)
    assert state["optim"]["state"][0]["sum"].shape == (3000, 8)
    assert state["optim"]["state"][0]["sum"].sum() > 0
