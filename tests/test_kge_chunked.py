"""The KGE app's native loops over the baseline's array and one node's store (issue 29: many
batches per native call, the GIL released): the same numbers as the per-batch path, bit for bit,
the same draws of negatives (``sample_keys``), and the loops' checks."""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adapm
from adapm import Config
from adapm._native_loader import load
from adapm.apps import kge, kge_data
from adapm.apps.baseline import ArrayNode
from adapm.errors import InvalidArgument, StateError
from adapm.testing import run_cluster

from app_cli import LAUNCHER, PY, counting_job, records, run
from store_rows import SplitWorker, store_with

K = load("adapm._kernels")
N = load()
F32 = np.float32
# 4,500 training triples in batches of 31: 146 batches an epoch, three native calls
# (CHUNK_BATCHES 64), the last batch 5 triples.
TRIPLES, BATCH = 5000, 31


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("kge-chunked")
    assert kge.main(["generate", str(out), "--triples", str(TRIPLES), "--seed", "3"]) == 0
    return out


def _train(data, out, *flags):
    """The app in this process; returns its JSON lines and exported embeddings."""
    lines = out.with_suffix(".jsonl")
    assert kge.main(["--data", str(data), "--dim", "8", "--neg", "3", "--epochs", "2",
                     "--batch-size", str(BATCH), "--eval-max", "300", "--progress", "off",
                     "--seed", "5", "--export", str(out), "--json", str(lines), *flags]) == 0
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    return (records, np.load(out / "entity_embeddings.npy"),
            np.load(out / "relation_embeddings.npy"))


def _numbers(records):
    """What must not change: loss, MRR and the access and sample counters of each epoch."""
    keep = ("local_pull_keys", "local_push_keys", "remote_pull_keys", "remote_push_keys",
            "sampled_keys", "sampled_local_keys", "sampled_remote_keys")
    return [(r["loss"], r["mrr"], {k: r["stats"][0].get(k) for k in keep}) for r in records]


def _count_calls(monkeypatch, name):
    calls = []
    original = getattr(K, name)

    def counted(*args, **kwargs):
        calls.append(args[5])  # batch_size
        return original(*args, **kwargs)

    monkeypatch.setattr(K, name, counted)
    return calls


@pytest.mark.parametrize("model,setup", [
    ("complex", ["--baseline"]), ("distmult", ["--baseline"]),
    ("complex", []), ("distmult", []), ("complex", ["--sampling", "naive"])])
def test_native_loops_compute_the_per_batch_path(data, tmp_path, monkeypatch, model, setup):
    """The baseline's table or one PM node's store, many batches per native call, and the
    per-batch path: the same losses, MRR, counters and model, bit for bit."""
    name = "kge_train_table" if "--baseline" in setup else "kge_train_rows"
    calls = _count_calls(monkeypatch, name)
    chunked = _train(data, tmp_path / "chunked", "--model", model, *setup)
    assert len(calls) == 2 * 3 and set(calls) == {BATCH}  # three calls an epoch
    monkeypatch.setattr(kge.KGETrainer, "chunked", lambda self, worker, ahead=0: None)
    per_batch = _train(data, tmp_path / "per-batch", "--model", model, *setup)
    assert len(calls) == 6  # the per-batch path made none
    assert _numbers(chunked[0]) == _numbers(per_batch[0])
    assert chunked[0][0]["stats"][0]["sampled_keys"] == 4500 * 2 * 3
    assert np.array_equal(chunked[1], per_batch[1]) and np.array_equal(chunked[2], per_batch[2])


def test_rescal_and_naive_sampling_on_two_nodes_keep_the_per_batch_path(data, tmp_path):
    """RESCAL's keys have two lengths; on a node of a multi-node job a naive sample is
    signalled as intent when it is prepared, ahead: neither has a chunked run. A local one
    has (test_two_nodes_train_in_native_runs)."""
    task = kge.KGETask(kge_data.load(str(data)), _opts(model="rescal"))
    node = ArrayNode(task.num_keys, task.value_length, task.sampling, seed=5)
    assert task.trainer(BATCH).chunked(node.worker()) is None
    for scheme, chunked in (("naive", False), ("local", True)):
        assert run_cluster(_chunked_on_two_nodes, 2, args=(str(data), scheme), timeout_s=90,
                           config=dict(num_keys=300, value_length=16,
                                       sampling=adapm.Sampling(0, 249, scheme=scheme))) == \
            [chunked, chunked]


def _chunked_on_two_nodes(node, data, scheme):
    w = node.worker()
    task = kge.KGETask(kge_data.load(data), _opts(dim=4, sampling=scheme))
    return task.trainer(BATCH).chunked(w) is not None


def test_two_nodes_train_in_native_runs(data, tmp_path):
    """Two real nodes under the launcher, local sampling (the default): every node trains in
    native runs of ahead/4 batches, each batch's keys signalled ahead (intent_keys), the run's
    samples drawn among the keys that stay and pinned; it learns, and its accesses stay
    local."""
    job = counting_job(tmp_path, "kge", "kge_train_rows")
    app = ["--data", str(data), "--dim", "8", "--neg", "3", "--epochs", "3", "--batch-size",
           str(BATCH), "--eval-max", "300", "--progress", "off", "--seed", "5", "--json", "-"]
    proc = run([*LAUNCHER, "-n", "2", "--prefix", "off", PY, str(job), *app])
    counts = [int(n) for n in re.findall(r"native runs (\d+)", proc.stderr)]
    # 2,250 triples a node: 73 batches an epoch of 31; runs of ahead/4 = 33 // 4 = 8 batches
    # (--ahead 1000 triples), a run more where a batch stops one (a key not here yet)
    assert len(counts) == 2 and all(c >= 3 * (73 // 8) for c in counts), counts
    lines = records(proc.stdout)
    # (What it learns against the baseline: test_kge_app, on a KG large enough for it; epochs
    # of 10-20 ms here move MRR after 3 epochs between 0.02 and 0.21.)
    assert len(lines) == 3 and lines[-1]["loss"] < lines[0]["loss"]
    for line in lines:
        stats = line["stats"]
        remote = sum(s["remote_pull_keys"] + s["remote_push_keys"] for s in stats)
        assert remote <= 1e-3 * sum(s["local_pull_keys"] + s["local_push_keys"] for s in stats)


def _opts(**changes):
    opts = dict(model="complex", dim=4, neg=2, lr=0.1, reg=1e-3, seed=5, sampling="local",
                eval_on="valid", eval_max=0)
    return argparse.Namespace(**dict(opts, **changes))


# ---- sample_keys: the draws of prepare_sample + pull_sample, without the values -------------


def _pairs(worker, n, count):
    return [worker.pull_sample(worker.prepare_sample(n, worker.clock))[0]
            for _ in range(count)]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["local", "naive"]), st.booleans(), st.booleans(), st.integers(1, 40),
       st.integers(0, 6), st.integers(0, 2**31))
def test_sample_keys_are_the_pairs_draws(scheme, weighted, replacement, n, count, seed):
    """One node: ``count`` samples by sample_keys, then ``count`` by prepare + pull pairs, in a
    node with the same seed: the same keys, sample by sample, and the same sample counters."""
    domain = 50
    weights = np.random.default_rng(seed).random(domain) if weighted else None
    sampling = adapm.Sampling(10, 10 + domain, weights=weights, replacement=replacement,
                              scheme=scheme, seed=seed)
    drawn = []
    for way in ("sample_keys", "pairs"):
        with adapm.init(config=Config(num_keys=100, value_length=2, sampling=sampling)) as node:
            w = node.worker()
            if way == "sample_keys":
                keys = w.sample_keys(n, count)
                assert keys.dtype == np.int64 and keys.shape == (n * count,)
                drawn.append((np.split(keys, count) if count else [], node.stats()))
            else:
                drawn.append((_pairs(w, n, count), node.stats()))
    (keys, stats), (want, want_stats) = drawn
    assert len(keys) == len(want) and all(np.array_equal(a, b) for a, b in zip(keys, want))
    for name in ("sampled_keys", "sampled_local_keys", "sampled_remote_keys"):
        assert stats[name] == want_stats[name] == (n * count if name != "sampled_remote_keys"
                                                   else 0)


@settings(max_examples=20, deadline=None)
@given(st.booleans(), st.integers(1, 40), st.integers(0, 6), st.integers(0, 2**31))
def test_the_baselines_sample_keys_are_its_pairs_draws(weighted, n, count, seed):
    weights = np.random.default_rng(seed).random(30) if weighted else None
    sampling = adapm.Sampling(5, 35, weights=weights)
    a, b = (ArrayNode(40, 2, sampling, seed=seed).worker() for _ in range(2))
    out = np.full(n * count, -1, np.int64)
    assert a.sample_keys(n, count, out=out) is out
    want = _pairs(b, n, count)
    assert np.array_equal(out, np.concatenate(want) if want else out[:0])
    assert a.counters["sampled_keys"] == b.counters["sampled_keys"] == n * count


def test_sample_keys_checks_its_arguments(no_launcher):
    with adapm.init(config=Config(num_keys=100, value_length=2,
                                  sampling=adapm.Sampling(0, 50))) as node:
        w = node.worker()
        for bad in (0, -1):
            with pytest.raises(InvalidArgument, match="n"):
                w.sample_keys(bad)
        with pytest.raises(InvalidArgument, match="count"):
            w.sample_keys(3, -1)
        for out in (np.empty(5, np.int64), np.empty(6, np.int32), np.empty(12, np.int64)[::2]):
            with pytest.raises(InvalidArgument, match="out must be"):
                w.sample_keys(3, 2, out=out)
        assert node.stats()["sampled_keys"] == 0
        assert w.sample_keys(3, 0).shape == (0,)
    with adapm.init(num_keys=10, value_length=2) as node:
        with pytest.raises(StateError, match="no sampling domain"):
            node.worker().sample_keys(3)
    with pytest.raises(InvalidArgument, match="out must be"):
        ArrayNode(10, 2, adapm.Sampling(0, 10)).worker().sample_keys(2, 2, out=np.empty(3))


# ---- the kernels: kge_train_table and kge_train_rows -------------------------------------------


def _inputs(model, dim, num_entities, num_relations, n, neg, seed):
    """A table of random rows (embeddings, positive accumulators), n random triples and their
    2 * neg negatives each."""
    rng = np.random.default_rng(seed)
    we = K.kge_widths(model, dim)[0]
    nkeys, width = num_entities + num_relations, 2 * we
    data = np.empty((nkeys, width), F32)
    data[:, :we] = rng.normal(0.0, 0.3, (nkeys, we))
    data[:, we:] = rng.uniform(0.01, 0.5, (nkeys, we))
    points = np.stack([rng.integers(0, num_entities, n), rng.integers(0, num_relations, n),
                       rng.integers(0, num_entities, n)], axis=1).astype(np.int64)
    samples = rng.integers(0, num_entities, 2 * neg * n).astype(np.int64)
    offsets, lens = np.arange(nkeys, dtype=np.int64) * width, np.full(nkeys, width, np.int64)
    return data.reshape(-1), offsets, lens, points, samples


def _per_batch(model, dim, bs, neg, num_entities, points, samples, data, offsets, lens):
    """The KGE app's per-batch path over the table (KGETrainer.plan and step): the distinct
    keys by unique_inverse, a pull of keys and sample, kge_train_batch, a push."""
    data = data.copy()
    width = int(lens[0])
    losses, counts = [], []
    for start in range(0, len(points), bs):
        p = points[start:start + bs]
        m = len(p)
        flat = np.concatenate([p[:, 0], p[:, 1] + num_entities, p[:, 2]])
        keys, inverse = np.empty(3 * m, np.int64), np.empty(3 * m, np.int64)
        nu = N.unique_inverse(flat, keys, inverse)
        sample = samples[2 * neg * start:2 * neg * (start + m)]
        ns = len(sample)
        pulled = np.concatenate([keys[:nu], sample])
        values = np.empty((nu + ns, width), F32)
        updates = np.empty_like(values)
        K.table_gather(data, offsets, lens, pulled, values)
        bce, reg = K.kge_train_batch(model, dim, values.reshape(-1),
                                     np.arange(nu + ns, dtype=np.int64) * width,
                                     inverse.reshape(3, m).T.copy(),
                                     nu + np.arange(ns // 2, ns, dtype=np.int64),
                                     nu + np.arange(ns // 2, dtype=np.int64),
                                     updates.reshape(-1), 0.1, 0.01, 0.02)
        K.table_scatter_add(data, offsets, lens, pulled, updates)
        losses.append(bce + reg)
        counts.append(nu + ns)
    return data, losses, counts


def _scratch(model, dim, bs, neg, batches):
    width = 2 * K.kge_widths(model, dim)[0]
    rows = (3 + 2 * neg) * bs
    return {"iscratch": np.empty(6 * rows, np.int64), "values": np.empty((rows, width), F32),
            "updates": np.empty((rows, width), F32), "losses": np.full(batches, -1.0),
            "keys": np.full(batches, -1, np.int64)}


def _table_args(model, dim, bs, neg, num_entities, points, samples, data, offsets, lens):
    return dict(model=model, dim=dim, lr=0.1, reg_entity=0.01, reg_relation=0.02,
                batch_size=bs, neg=neg, num_entities=num_entities, points=points,
                samples=samples, data=data, key_offset=offsets, key_len=lens,
                **_scratch(model, dim, bs, neg, -(-len(points) // bs)))


MODELS = st.sampled_from([K.MODEL_COMPLEX, K.MODEL_DISTMULT])


@settings(max_examples=60, deadline=None)
@given(MODELS, st.integers(1, 6), st.integers(1, 60), st.integers(1, 8), st.integers(0, 300),
       st.integers(1, 40), st.integers(0, 4), st.integers(0, 2**31))
def test_table_run_is_the_per_batch_path_exactly(model, dim, num_entities, num_relations, n,
                                                  bs, neg, seed):
    """Plan, gather, train and scatter per batch in one call: the same table, losses and key
    counts as the app's calls one by one, bit for bit (the last batch short, repeated keys,
    negatives equal to the batch's own entities)."""
    data, offsets, lens, points, samples = _inputs(model, dim, num_entities, num_relations, n,
                                                   neg, seed)
    want, want_losses, want_counts = _per_batch(model, dim, bs, neg, num_entities, points,
                                                samples, data, offsets, lens)
    args = _table_args(model, dim, bs, neg, num_entities, points, samples, data, offsets, lens)
    assert K.kge_train_table(**args) == -(-n // bs)
    assert np.array_equal(data, want)
    assert args["losses"].tolist() == want_losses and args["keys"].tolist() == want_counts


def _rows_args(model, dim, bs, neg, num_entities, points, samples, store):
    width = 2 * K.kge_widths(model, dim)[0]
    rows = (3 + 2 * neg) * bs
    return dict(model=model, dim=dim, lr=0.1, reg_entity=0.01, reg_relation=0.02,
                batch_size=bs, neg=neg, num_entities=num_entities, points=points,
                samples=samples, store_rows=store.native.rows(),
                left_keys=np.empty(rows, np.int64), left_rows=np.empty((rows, width), F32),
                **_scratch(model, dim, bs, neg, -(-len(points) // bs)))


@settings(max_examples=40, deadline=None)
@given(MODELS, st.integers(1, 4), st.integers(2, 60), st.integers(1, 6), st.integers(1, 200),
       st.integers(1, 20), st.integers(0, 3), st.integers(0, 2**31), st.booleans())
def test_store_run_is_the_table_run_up_to_a_key_held_elsewhere(model, dim, num_entities,
                                                                num_relations, n, bs, neg, seed,
                                                                all_held):
    """Over a node's store: the per-batch path's rows, losses and key counts, bit for bit, for
    every batch before the first one with a key not held here (a triple's or a negative's);
    that batch and the rest are left untouched (STOP_PULL), for the caller to train."""
    data, offsets, lens, points, samples = _inputs(model, dim, num_entities, num_relations, n,
                                                   neg, seed)
    nkeys, width = num_entities + num_relations, int(lens[0])
    rng = np.random.default_rng(seed)
    held = np.arange(nkeys, dtype=np.int64)
    if not all_held:  # a key of some batch (a triple's or, if any, a negative), and a few others
        pick = rng.integers(0, n)
        candidates = [points[pick, 0], num_entities + points[pick, 1], points[pick, 2],
                      *samples[2 * neg * pick:2 * neg * (pick + 1)]]
        away = [candidates[rng.integers(0, len(candidates))]]
        held = np.setdiff1d(held[rng.random(nkeys) < 0.99], away)
    store = store_with(data, width, held)
    args = _rows_args(model, dim, bs, neg, num_entities, points, samples, store)
    got = K.kge_train_rows(**args)
    away = np.setdiff1d(np.arange(nkeys), held)

    def needs(b):  # batch b's keys
        p, s = points[b * bs:(b + 1) * bs], samples[2 * neg * b * bs:2 * neg * (b + 1) * bs]
        return np.concatenate([p[:, 0], num_entities + p[:, 1], p[:, 2], s])

    batches = -(-n // bs)
    first = next((b for b in range(batches) if np.isin(needs(b), away).any()), None)
    trained = batches if first is None else first
    assert got == (trained, 0 if first is None else K.KGE_STOP_PULL, 0)
    want, want_losses, want_counts = _per_batch(model, dim, bs, neg, num_entities,
                                                points[:trained * bs], samples, data, offsets,
                                                lens)
    values = np.empty((len(held), width), F32)
    assert store.gather(held, values, np.empty(len(held), np.int64)) == 0
    assert np.array_equal(values, want.reshape(nkeys, width)[held])
    assert args["losses"][:trained].tolist() == want_losses
    assert args["keys"][:trained].tolist() == want_counts


def test_table_run_checks_its_buffers():
    model, dim, bs, neg, E = K.MODEL_COMPLEX, 2, 8, 2, 12
    data, offsets, lens, points, samples = _inputs(model, dim, E, 3, 40, neg, 3)
    args = _table_args(model, dim, bs, neg, E, points, samples, data, offsets, lens)
    before = data.copy()
    width = int(lens[0])
    rows = (3 + 2 * neg) * bs
    bad = [({"iscratch": np.empty(6 * rows - 1, np.int64)}, ValueError, "iscratch needs"),
           ({"values": np.empty((rows - 1, width), F32)}, ValueError, "values and updates"),
           ({"updates": np.empty(rows * width - 1, F32)}, ValueError, "values and updates"),
           ({"losses": np.empty(4)}, ValueError, "one item per batch"),
           ({"keys": np.empty(5, np.int32)}, TypeError, "keys must be int64"),
           ({"losses": np.empty(5, F32)}, TypeError, "losses must be float64"),
           ({"points": points.astype(np.int32)}, TypeError, "points must be int64"),
           ({"points": points[:, :2].copy()}, ValueError, r"shape \(n, 3\)"),
           ({"points": np.asfortranarray(points)}, ValueError, "points must be C-contiguous"),
           ({"samples": samples[:-1]}, ValueError, "samples needs 2 \\* neg = 4 keys per point"),
           ({"samples": samples.astype(F32)}, TypeError, "samples must be int64"),
           ({"key_len": lens[:-1]}, ValueError, "key_len"),
           ({"data": before.copy()[::2]}, ValueError, "data must be C-contiguous"),
           ({"iscratch": np.empty(6 * rows, np.int64)[::-1]}, ValueError, "contiguous"),
           ({"model": K.MODEL_RESCAL}, ValueError, "RESCAL"), ({"model": 7}, ValueError, "model"),
           ({"dim": 0}, ValueError, "dim"), ({"neg": -1}, ValueError, "neg"),
           ({"batch_size": 0}, ValueError, "batch_size"),
           ({"num_entities": 16}, ValueError, "num_entities 16 is more than the rows' 15"),
           ({"num_entities": -1}, ValueError, "negative")]
    for change, exc, match in bad:
        with pytest.raises(exc, match=match):
            K.kge_train_table(**dict(args, **change))
    shared = dict(args)
    shared["updates"] = shared["values"]
    with pytest.raises(ValueError, match="shares memory"):
        K.kge_train_table(**shared)
    read_only = args["values"].copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="values must be writable"):
        K.kge_train_table(**dict(args, values=read_only))
    assert np.array_equal(data, before)
    # a table whose rows are not 2 * entity_width floats: the first batch meets it
    with pytest.raises(ValueError, match="batch 0: a key's row"):
        K.kge_train_table(**dict(args, key_len=np.full(15, width - 1, np.int64)))
    assert np.array_equal(data, before)
    assert K.kge_train_table(**args) == 5 and not np.array_equal(data, before)


@pytest.mark.parametrize("bad", ["head", "relation", "tail", "sample", "negative sample"])
def test_a_bad_id_anywhere_in_the_run_trains_nothing(bad):
    model, dim, bs, neg, E = K.MODEL_DISTMULT, 3, 8, 2, 12
    data, offsets, lens, points, samples = _inputs(model, dim, E, 3, 40, neg, 4)
    if bad == "head":
        points[37, 0] = E
    elif bad == "relation":
        points[37, 1] = 3
    elif bad == "tail":
        points[37, 2] = -1
    else:
        samples[150] = E if bad == "sample" else -2
    before = data.copy()
    match = r"points\[37\].*nothing trained" if bad in ("head", "relation", "tail") else \
        r"samples\[150\] = .* is not an entity key, in \[0, 12\) \(nothing trained\)"
    args = _table_args(model, dim, bs, neg, E, points, samples, data, offsets, lens)
    with pytest.raises(ValueError, match=match):
        K.kge_train_table(**args)
    assert np.array_equal(data, before)


def test_store_run_checks_its_rows():
    model, dim, bs, neg, E = K.MODEL_COMPLEX, 2, 8, 1, 12
    data, offsets, lens, points, samples = _inputs(model, dim, E, 3, 40, neg, 5)
    width = int(lens[0])
    store = store_with(data, width, np.arange(15, dtype=np.int64))
    args = _rows_args(model, dim, bs, neg, E, points, samples, store)
    other = store_with(np.zeros(15 * 6, F32), 6, np.arange(15, dtype=np.int64))
    rows = (3 + 2 * neg) * bs
    bad = [({"store_rows": object()}, TypeError, "Store.rows"),
           ({"store_rows": other.native.rows()}, ValueError, "6 floats, not 2 \\* entity_width"),
           ({"left_keys": np.empty(rows - 1, np.int64)}, ValueError, "left_keys needs"),
           ({"left_rows": np.empty((rows, width - 1), F32)}, ValueError, "left_keys needs"),
           ({"left_rows": args["values"]}, ValueError, "shares memory"),
           ({"num_entities": 16}, ValueError, "num_entities")]
    for change, exc, match in bad:
        with pytest.raises(exc, match=match):
            K.kge_train_rows(**dict(args, **change))
    values = np.empty((15, width), F32)
    store.gather(np.arange(15, dtype=np.int64), values, np.empty(15, np.int64))
    assert np.array_equal(values.reshape(-1), data)  # nothing trained by a failed call
    assert K.kge_train_rows(**args) == (5, 0, 0)


# ---- the trainer's fallback: a batch with keys held elsewhere goes through step ---------------


@pytest.mark.parametrize("model", ["complex", "distmult"])
def test_a_batch_with_keys_held_elsewhere_goes_through_step(data, model):
    """A run over a store that lacks some keys: the batches with them stop the native loop
    (STOP_PULL) and go through step with their samples as drawn; the run ends as the per-batch
    path over the same worker, bit for bit, losses, accesses and rows."""
    task = kge.KGETask(kge_data.load(str(data)), _opts(model=model, dim=3))
    points = np.ascontiguousarray(task.kg.train[:700])
    width = 2 * task.ent_width
    init = task.init_rows(np.arange(task.num_keys, dtype=np.int64)).reshape(-1, width)
    # the rarest entity elsewhere: ~40% of the batches meet it (among 124 negatives each)
    rare = np.argmin(np.bincount(points[:, [0, 2]].ravel(), minlength=task.num_entities))
    held = np.setdiff1d(np.arange(task.num_keys), [rare])
    batches = -(-len(points) // BATCH)
    results = []
    for chunked in (True, False):
        store = store_with(init.reshape(-1), width, held)
        worker = SplitWorker(store, init.copy(), task.sampling, seed=2)
        trainer = task.trainer(BATCH)
        if chunked:
            run = trainer.chunked(worker)
            assert run is not None
            stepped = []
            trainer.step = lambda *args, **kwargs: stepped.append(1) or \
                kge.KGETrainer.step(trainer, *args, **kwargs)
            losses, steps = run(points, BATCH)
            assert batches // 4 < len(stepped) < batches * 3 // 4  # both ways, often
        else:
            losses, steps = [], 0
            for start in range(0, len(points), BATCH):
                plan = trainer.plan(points[start:start + BATCH])
                loss, s = trainer.step(worker, plan, worker.prepare_sample(plan.sample_size, 0))
                losses.append(loss)
                steps += s
        rows = np.empty((len(held), width), F32)
        store.gather(held, rows, np.empty(len(held), np.int64))
        results.append((losses, steps, worker.accessed, rows, worker.elsewhere))
    (losses, steps, accessed, rows, elsewhere), want = results
    assert len(losses) == batches and steps == 700 * (1 + 2 * task.neg)
    assert (losses, steps, accessed) == want[:3]
    assert np.array_equal(rows, want[3]) and np.array_equal(elsewhere, want[4])
    assert not np.array_equal(elsewhere, init)  # batches went through step and pushed there


def test_rows_missing_names_the_keys_not_held():
    """rows_missing over a node's store: the positions of the keys it does not hold (in request
    order, duplicates each), nothing for the keys it does; a key outside the store fails."""
    width = 4
    data = np.arange(20 * width, dtype=F32)
    held = np.array([0, 3, 4, 7, 19], dtype=np.int64)
    store = store_with(data, width, held)
    keys = np.array([3, 5, 19, 5, 0, 18, 7], dtype=np.int64)
    missing = np.full(len(keys), -1, np.int64)
    assert K.rows_missing(store.native.rows(), keys, missing) == 3
    assert missing[:3].tolist() == [1, 3, 5]
    assert K.rows_missing(store.native.rows(), held, missing) == 0
    with pytest.raises(ValueError, match=r"outside \[0, 20\)"):
        K.rows_missing(store.native.rows(), np.array([2, 20], np.int64), missing)
    with pytest.raises(ValueError, match="missing needs room for 7"):
        K.rows_missing(store.native.rows(), keys, missing[:6])
    with pytest.raises(TypeError, match="Store.rows"):
        K.rows_missing(object(), keys, missing)
