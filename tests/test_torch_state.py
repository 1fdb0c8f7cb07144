"""adapm.torch and torch's state habits: state_dict / load_state_dict carry the tables, the
optimizer's carries AdaGrad's sums, DCP reshards them; nothing saves an empty table.

Real processes (tests/torch_state_job.py): a model trained on 2 nodes, saved with
``torch.save(model.state_dict())`` on rank 0 and with DCP (sharded, each rank its rows), loaded
on 1 and on 3 nodes, where it computes the saved loss on the same batch, and the same loss
after one more AdaGrad step (which depends on the optimizer's sums and step counts).
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
from app_cli import LAUNCHER, PY, records, run

import adapm
from adapm.torch import Embedding, EmbeddingBag, optim, sharded_state_dict

torch.set_num_threads(1)

JOB = os.path.join(os.path.dirname(__file__), "torch_state_job.py")


@pytest.mark.timeout(600)
def test_a_model_saved_on_2_nodes_loads_on_1_and_3_nodes(tmp_path):
    saved = records(run([*LAUNCHER, "-n", "2", PY, JOB, "save", str(tmp_path)],
                        timeout=240).stdout)
    assert sorted(r["rank"] for r in saved) == [0, 1]
    rank0 = next(r for r in saved if r["rank"] == 0)["saved"]
    assert all(r["saved"]["before"] == rank0["before"] for r in saved), saved
    assert abs(rank0["after"] - rank0["before"]) > 1e-4, rank0  # the step moved the loss
    assert os.path.getsize(tmp_path / "full.pt") > 2 * 500 * 4 * 4  # both tables, whole
    for world in (1, 3):
        launcher = [*LAUNCHER, "-n", str(world)] if world > 1 else []
        out = records(run([*launcher, PY, JOB, "load", str(tmp_path)], timeout=240).stdout)
        assert sorted(r["rank"] for r in out) == list(range(world))
        for r in out:
            assert abs(r["fresh"] - rank0["before"]) > 1e-3, "the fresh model is no test"
            for how in ("torch", "dcp", "weights_only"):
                assert r[how]["before"] == pytest.approx(rank0["before"], rel=1e-6, abs=0), \
                    (world, how, r)
            # loaded 6 per table, then rank 0 took one step
            assert r["steps"] == ([7, 7] if r["rank"] == 0 else [6, 6]), r
        first = next(r for r in out if r["rank"] == 0)
        for how in ("torch", "dcp"):
            assert first[how]["after"] == pytest.approx(rank0["after"], rel=1e-6, abs=0), \
                (world, how, first)
        # without the optimizer's state the same step gives another loss
        assert abs(first["weights_only"]["after"] - rank0["after"]) > 1e-5, first


# --- one process ---------------------------------------------------------------------------------


@pytest.fixture
def node(no_launcher):
    n = adapm.init(num_keys=300, value_length=8)
    yield n
    n.shutdown()


def test_state_dict_holds_the_whole_table_and_loads_it_back(node, tmp_path):
    w = node.worker()
    model = torch.nn.ModuleDict({"emb": Embedding(40, 3, worker=w, seed=1),
                                 "bag": EmbeddingBag(50, 4, worker=w, offset=40, seed=2)})
    state = model.state_dict()
    assert sorted(state) == ["bag.weight", "emb.weight"]
    assert state["emb.weight"].shape == (40, 3) and state["bag.weight"].shape == (50, 4)
    torch.testing.assert_close(state["emb.weight"], model["emb"].weight)
    rows = w.pull(np.arange(40, 90))
    np.testing.assert_array_equal(state["bag.weight"].numpy(), rows[:, :4])
    torch.save(state, tmp_path / "m.pt")
    other = torch.nn.ModuleDict({"emb": Embedding(40, 3, worker=w, seed=5),
                                 "bag": EmbeddingBag(50, 4, worker=w, offset=40, seed=6)})
    assert not torch.equal(other["emb"].weight, state["emb.weight"])
    w.push(np.arange(40, 90), np.ones((50, 8), dtype=np.float32))  # optimizer state too
    result = other.load_state_dict(torch.load(tmp_path / "m.pt"))
    assert not result.missing_keys and not result.unexpected_keys
    torch.testing.assert_close(other["emb"].weight, state["emb.weight"])
    torch.testing.assert_close(other["bag"].weight, state["bag.weight"])
    # loading the weights keeps the rest of each row (the optimizer's state)
    assert (w.pull(np.arange(40, 90))[:, 4:] == rows[:, 4:] + 1).all()
    # strict=False with the tables missing (a model's dense part alone) leaves the rows
    assert other.load_state_dict({}, strict=False).missing_keys == ["emb.weight", "bag.weight"]
    with pytest.raises(RuntimeError, match="Missing key"):
        other.load_state_dict({})
    # the model itself cannot be saved or copied: its rows are in adapm
    for whole in (lambda: torch.save(other, tmp_path / "model.pt"), lambda: copy.deepcopy(other)):
        with pytest.raises(TypeError, match=r"torch.save\(model.state_dict\(\)\) instead"):
            whole()
    # a key under a table's name that is not its weight is unexpected, as torch's tables say
    typo = {**state, "emb.weight_typo": torch.zeros(1)}
    assert other.load_state_dict(typo, strict=False).unexpected_keys == ["emb.weight_typo"]
    with pytest.raises(RuntimeError,
                       match='Unexpected key\\(s\\) in state_dict: "emb.weight_typo"'):
        other.load_state_dict(typo)


def test_a_table_too_big_to_pull_whole_raises_naming_node_checkpoint(node):
    w = node.worker()
    table = Embedding(100, 4, worker=w)
    table.full_state_limit = 100 * 4 * 4 - 1
    model = torch.nn.Sequential(table)
    for call in (model.state_dict, lambda: table.weight,
                 lambda: optim.Adagrad(model).state_dict()):
        with pytest.raises(adapm.CheckpointError, match="node.checkpoint") as info:
            call()
        assert "sharded_state_dict" in str(info.value)
    table.full_state_limit = 100 * 4 * 4
    assert model.state_dict()["0.weight"].shape == (100, 4)
    # no torch process group: the sharded form says what to do
    with pytest.raises(adapm.StateError, match="init_process_group"):
        sharded_state_dict(model)
    with pytest.raises(adapm.InvalidType, match="module"):
        sharded_state_dict(table.weight)


def test_loading_a_wrong_state_raises_before_any_row_changes(node):
    w = node.worker()
    table = Embedding(20, 4, worker=w, seed=1)
    opt = optim.Adagrad(table, lr=0.1)
    before = w.pull(np.arange(20)).copy()
    good = opt.state_dict()
    cases = [
        (lambda: table.load_state_dict({"weight": torch.zeros(20, 3)}), adapm.InvalidArgument,
         "shape"),
        (lambda: table.load_state_dict({"weight": torch.zeros(20, 4, dtype=torch.long)}),
         adapm.InvalidType, "floating"),
        (lambda: table.load_state_dict({"weight": torch.zeros(20, 4, device="meta")}),
         adapm.InvalidArgument, "meta"),
        (lambda: table.load_state_dict({"weight": [[0.0] * 4] * 20}), adapm.InvalidType,
         "tensor"),
        (lambda: opt.load_state_dict({"state": {0: {"step": 1, "sum": torch.zeros(3, 4)}},
                                      "param_groups": good["param_groups"]}),
         adapm.InvalidArgument, "sum of table 0"),
        (lambda: opt.load_state_dict({"state": {0: {"step": -1}},
                                      "param_groups": good["param_groups"]}),
         adapm.InvalidArgument, "step"),
        (lambda: opt.load_state_dict({"state": {}, "param_groups": good["param_groups"]}),
         adapm.InvalidArgument, "tables"),
        (lambda: opt.load_state_dict({**good, "param_groups": []}), adapm.InvalidArgument,
         "groups"),
        (lambda: optim.SGD(table).load_state_dict(good), adapm.InvalidArgument, "sums"),
        (lambda: opt.load_state_dict([1]), adapm.InvalidArgument, "state_dict"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text):
            call()
    np.testing.assert_array_equal(w.pull(np.arange(20)), before)
    assert opt.steps == [0]


def test_optimizer_state_dict_is_torchs_layout_and_json_without_rows(node):
    w = node.worker()
    deep, wide = Embedding(30, 2, worker=w), Embedding(30, 2, worker=w, offset=30)
    opt = optim.Adagrad([{"params": deep, "lr": 0.5}, {"params": [wide]}], lr=0.1,
                        initial_accumulator_value=0.25)
    twin = [torch.nn.Embedding(30, 2, sparse=True) for _ in range(2)]
    with torch.no_grad():
        for t, ours in zip(twin, (deep, wide)):
            t.weight.copy_(ours.weight)
    theirs = torch.optim.Adagrad([{"params": twin[0].parameters(), "lr": 0.5},
                                  {"params": twin[1].parameters()}], lr=0.1,
                                 initial_accumulator_value=0.25)
    idx = torch.tensor([[1, 2, 2], [5, 1, 0]])
    for model, o in (((deep, wide), opt), (twin, theirs)):
        o.zero_grad()
        (model[0](idx).pow(2).sum() + model[1](idx).sum()).backward()
        o.step()
    ours, torchs = opt.state_dict(), theirs.state_dict()
    assert [g["lr"] for g in ours["param_groups"]] == [0.5, 0.1]
    assert [g["params"] for g in ours["param_groups"]] == [g["params"] for g in
                                                           torchs["param_groups"]]
    for i in (0, 1):
        assert float(ours["state"][i]["step"]) == float(torchs["state"][i]["step"]) == 1
        torch.testing.assert_close(ours["state"][i]["sum"], torchs["state"][i]["sum"])
        torch.testing.assert_close((deep, wide)[i].weight, twin[i].weight.detach())
    light = json.loads(json.dumps(opt.state_dict(with_rows=False)))
    assert light["state"] == {"0": {"step": 1}, "1": {"step": 1}}
    opt.param_groups[0]["lr"] = 0.0  # changed between steps, as torch's
    again = optim.Adagrad([{"params": deep}, {"params": wide}], lr=0.1,
                          initial_accumulator_value=0.25)
    again.load_state_dict(light)  # the group options come with it
    assert [g["lr"] for g in again.param_groups] == [0.5, 0.1] and again.steps == [1, 1]
    before = deep.weight.clone()
    opt.zero_grad()
    deep(idx).sum().backward()
    opt.step()
    torch.testing.assert_close(deep.weight, before)  # lr 0 in its group: unchanged


def test_optimizers_take_what_torch_users_pass_or_say_what_to_do(node):
    w = node.worker()
    model = torch.nn.ModuleDict({"emb": Embedding(10, 2, worker=w),
                                 "head": torch.nn.Linear(2, 1)})
    assert optim.SGD(model).tables == [model["emb"]]
    assert optim.SGD(model.modules()).tables == [model["emb"]]
    assert optim.SGD([{"params": model}]).tables == [model["emb"]]
    cases = [
        (lambda: optim.SGD(model.parameters()), adapm.InvalidType, "torch optimizer"),
        (lambda: optim.SGD(torch.nn.Linear(2, 2)), adapm.InvalidArgument, "no adapm"),
        (lambda: optim.SGD(iter([])), adapm.InvalidArgument, "model.parameters"),
        (lambda: optim.SGD(3), adapm.InvalidType, "cannot take int"),
        (lambda: optim.SGD([{"lr": 1.0}]), adapm.InvalidArgument, "'params'"),
        (lambda: optim.SGD([{"params": model}, model]), adapm.InvalidArgument, "not both"),
        (lambda: optim.SGD([{"params": model, "momentum": 0.9}]), adapm.InvalidArgument,
         "unknown option"),
        (lambda: optim.SGD([{"params": model}, {"params": model["emb"]}]),
         adapm.InvalidArgument, "twice"),
        (lambda: optim.Adagrad([{"params": model, "eps": -1}]), adapm.InvalidArgument, "eps"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text):
            call()


def test_weight_is_a_pulled_copy_and_devices_are_checked(node):
    w = node.worker()
    table = Embedding(10, 2, worker=w)
    copy = table.weight
    copy += 1.0  # a copy: adapm's rows are unchanged
    assert not torch.equal(table.weight, copy)
    with pytest.raises(adapm.StateError, match="load_state_dict"):
        table.weight = torch.zeros(10, 2)
    model = torch.nn.Sequential(table, torch.nn.Linear(2, 2))
    assert model.to("cpu") is model and table.device == torch.device("cpu")
    cases = [
        (lambda: table.to("meta"), adapm.InvalidArgument, "meta"),
        (lambda: model.to("meta"), adapm.InvalidArgument, "meta"),
        (lambda: model.to_empty(device="meta"), adapm.InvalidArgument, "meta"),
        (lambda: model.half(), adapm.InvalidType, "float32"),
        (lambda: table.to(torch.float64), adapm.InvalidType, "float32"),
        (lambda: Embedding(10, 2, worker=w, device="meta"), adapm.InvalidArgument, "meta"),
        (lambda: Embedding(10, 2, worker=w, device="nowhere"), adapm.InvalidArgument,
         "device"),
    ]
    if not torch.cuda.is_available():
        cases.append((lambda: table.cuda(), adapm.InvalidArgument, "cannot move"))
        cases.append((lambda: Embedding(10, 2, worker=w, device="cuda"), adapm.InvalidArgument,
                      "no CUDA device"))
    for call, error, text in cases:
        with pytest.raises(error, match=text):
            call()
    assert table.device == torch.device("cpu")
    assert table(torch.tensor([1, 2])).device == torch.device("cpu")


def test_a_distributed_sampler_for_other_ranks_is_refused_by_the_loader(node):
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from adapm.torch import IntentCollate, IntentLoader

    dataset = TensorDataset(torch.arange(10))
    collate = IntentCollate(None, lambda batch: batch[0])
    wrong = DataLoader(dataset, sampler=DistributedSampler(dataset, num_replicas=2, rank=1),
                       collate_fn=collate)
    with pytest.raises(adapm.InvalidArgument, match="num_replicas=node.world_size"):
        IntentLoader(wrong, node.worker())
    right = DataLoader(dataset, batch_size=4, collate_fn=collate,
                       sampler=DistributedSampler(dataset, num_replicas=node.world_size,
                                                  rank=node.rank, shuffle=False))
    assert [b[0].tolist() for b in IntentLoader(right, node.worker())] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def _load_on_rank_0_alone(node):
    """Rank 0 loads a table as torch users often do (on rank 0 alone); rank 1 does not."""
    import time

    table = Embedding(20, 2, worker=node.worker())
    if node.rank == 0:
        table.load_state_dict({"weight": torch.ones(20, 2)})
    else:
        time.sleep(8)  # past rank 0's timeout, without a collective call
    return "loaded"


def _load_on_rank_0_then_meet(node):
    """Rank 0 loads alone, then both meet at a barrier of their own: the load's collective
    paired with rank 1's barrier, and the load returned with rank 1's half unwritten."""
    table = Embedding(20, 2, worker=node.worker())
    if node.rank == 0:
        try:
            table.load_state_dict({"weight": torch.ones(20, 2)})
        except adapm.PeerError as exc:
            return f"load: {exc}"
    try:
        node.barrier()
    except adapm.PeerError as exc:
        return f"barrier: {exc}"
    return "met"


@pytest.mark.timeout(120)
def test_loading_on_one_rank_is_refused_where_the_other_meets_a_barrier():
    from adapm.testing import run_cluster

    out = run_cluster(_load_on_rank_0_then_meet, world_size=2, timeout_s=90,
                      config={"num_keys": 40, "value_length": 2, "connect_timeout_s": 20})
    mismatch = ("collective #1 does not match across nodes: rank 0 "
                "Embedding.load_state_dict(), rank 1 barrier()")
    assert out[0].startswith("load: ") and mismatch in out[0], out
    assert out[1].startswith("barrier: ") and mismatch in out[1], out


@pytest.mark.timeout(120)
def test_loading_on_one_rank_alone_says_that_loading_is_collective():
    from adapm.testing import run_cluster

    out = run_cluster(_load_on_rank_0_alone, world_size=2, timeout_s=90, expect_failure=True,
                      config={"num_keys": 40, "value_length": 2, "connect_timeout_s": 3})
    status, text = out[0]
    assert status == "error", out
    assert "AdaPMTimeout" in text and "collective: every rank calls load_state_dict" in text, text
