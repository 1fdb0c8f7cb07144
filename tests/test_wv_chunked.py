"""The WV app's native runs (issue 29: many batches per native call, the GIL released): over the
baseline's array and one node's store the same numbers as the per-batch path, bit for bit; on
two real nodes under the launcher, the runs with their intents signalled ahead; a batch with a
key held elsewhere through the worker; and the runs' checks."""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest

from adapm._native_loader import load
from adapm.apps import wv, wv_data

from app_cli import LAUNCHER, PY, counting_job, records, run
from store_rows import SplitWorker, store_with

K = load("adapm._kernels")
F32 = np.float32
SENTENCES = 600


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("wv-chunked")
    assert wv.main(["generate", str(out), "--sentences", str(SENTENCES), "--seed", "3"]) == 0
    return out


def _train(data, out, *flags):
    """The app in this process; returns its JSON lines and its exported vectors (bytes)."""
    lines = out.with_suffix(".jsonl")
    assert wv.main(["--corpus", str(data / "corpus.txt"), "--dim", "8", "--epochs", "2",
                    "--min-count", "1", "--batch-size", "16", "--progress", "off", "--seed", "5",
                    "--export", str(out), "--json", str(lines), *flags]) == 0
    return ([json.loads(line) for line in lines.read_text().splitlines()],
            (out / "vectors.bin").read_bytes())


def _numbers(records):
    """What must not change: loss, words and the access and sample counters of each epoch."""
    keep = ("local_pull_keys", "local_push_keys", "remote_pull_keys", "remote_push_keys",
            "sampled_keys", "sampled_local_keys", "sampled_remote_keys")
    return [(r["loss"], r["words"], {k: r["stats"][0].get(k) for k in keep}) for r in records]


def _count_calls(monkeypatch, name):
    calls = []
    original = getattr(K, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(K, name, counted)
    return calls


# 600 sentences in batches of 16: 38 an epoch (the last of 8; of 7: 86, the last of 5); --ahead
# is in sentences (0, 48 and the default 2,000: plans 0, 3 and every batch ahead of the steps).
@pytest.mark.parametrize("setup", [
    ["--baseline"], ["--baseline", "--ahead", "0"], ["--baseline", "--ahead", "48"], [],
    ["--ahead", "48"], ["--optimizer", "adagrad"], ["--sampling", "local"], ["--neg", "0"],
    ["--baseline", "--batch-size", "7", "--window", "2"]])
def test_native_runs_compute_the_per_batch_path(data, tmp_path, monkeypatch, setup):
    """The baseline's table or one PM node's store, many batches per native call, and the
    per-batch path: the same losses, words, counters and vectors, bit for bit (the trainer's
    seeds are drawn in the per-batch path's order, whatever --ahead)."""
    name = "wv_train_table" if "--baseline" in setup else "wv_train_rows"
    calls = _count_calls(monkeypatch, name)
    chunked = _train(data, tmp_path / "chunked", *setup)
    runs = 2 * (2 if "7" in setup else 1)  # 38 or 86 batches an epoch, CHUNK_BATCHES 64
    assert len(calls) == runs
    monkeypatch.setattr(wv.WVTrainer, "chunked", lambda self, worker, ahead=0: None)
    per_batch = _train(data, tmp_path / "per-batch", *setup)
    assert len(calls) == runs  # the per-batch path made none
    assert _numbers(chunked[0]) == _numbers(per_batch[0])
    assert chunked[1] == per_batch[1]


@pytest.mark.parametrize("sampling,native", [("naive", True), ("local", False)])
def test_two_nodes_train_in_native_runs_under_naive_sampling(data, tmp_path, sampling, native):
    """Two real nodes under the launcher: with naive sampling (the default) every node trains
    in native runs, its batches' keys and pools signalled ahead (intent_keys), all of them
    local; under local sampling (drawn among the keys held when pulled) the per-batch path."""
    job = counting_job(tmp_path, "wv", "wv_train_rows")
    proc = run([*LAUNCHER, "-n", "2", "--prefix", "off", PY, str(job), "--corpus",
                str(data / "corpus.txt"), "--dim", "16", "--epochs", "3", "--min-count", "1",
                "--batch-size", "16",
                "--progress", "off", "--sampling", sampling, "--json", "-"])
    counts = [int(n) for n in re.findall(r"native runs (\d+)", proc.stderr)]
    assert len(counts) == 2
    # 300 sentences a node: 19 batches an epoch, runs of ahead/4 = 31 batches: one an epoch
    assert all(c >= 3 for c in counts) if native else counts == [0, 0], counts
    lines = records(proc.stdout)
    assert len(lines) == 3 and lines[-1]["loss"] < lines[0]["loss"]  # (quality: test_wv_app)
    for line in lines:
        stats = line["stats"]
        remote = sum(s["remote_pull_keys"] + s["remote_push_keys"] for s in stats)
        assert remote <= 1e-4 * sum(s["local_pull_keys"] + s["local_push_keys"] for s in stats)


# ---- a batch with a key held elsewhere goes through the worker -----------------------------


def _task(data, **changes):
    opts = dict(dim=4, window=3, neg=2, lr=0.025, seed=5, sample=1e-3, optimizer="sgd",
                replica_updates="sum", sampling="naive", analogy_questions=None,
                similarity_pairs=None)
    corpus = wv_data.read_corpus(str(data / "corpus.txt"), min_count=1)
    return wv.WVTask(corpus, argparse.Namespace(**dict(opts, **changes)))


def test_a_batch_with_keys_held_elsewhere_goes_through_the_worker(data):
    """A run over a store that lacks a word's output vector: the batches that meet it stop the
    native loop (STOP_PULL) and go through the worker's pull and push with their plan and pool
    as made; the run ends as the per-batch path over the same worker, bit for bit: losses,
    steps, words, accesses and rows, here and elsewhere."""
    task = _task(data)
    points = np.arange(300, dtype=np.int64)  # 19 batches of 16
    bs, batches = 16, 19
    width = task.value_length
    init = task.init_rows(np.arange(task.num_keys, dtype=np.int64)).reshape(-1, width)
    init[:, :task.dim] += 0.01  # output vectors not all zero, so that what is pushed shows
    # a mid-frequency word's output vector elsewhere: some batches meet it, some do not
    counts = task.corpus.counts
    word = int(np.argsort(counts)[len(counts) * 3 // 4])
    held = np.setdiff1d(np.arange(task.num_keys), [task.vocab_size + word])
    results = []
    for chunked in (True, False):
        store = store_with(init.reshape(-1), width, held)
        worker = SplitWorker(store, init.copy(), task.sampling, seed=2)
        trainer = task.trainer(bs, points, 1)
        if chunked:
            stepped = []
            through = trainer._train
            trainer._train = lambda *args: stepped.append(1) or through(*args)
            losses, steps, words = trainer.chunked(worker, ahead=batches)(points, bs)
            assert 0 < len(stepped) < batches  # both ways
        else:  # the runner's per-batch path with every batch planned ahead
            plans = [trainer.plan(points[i:i + bs]) for i in range(0, len(points), bs)]
            samples = [worker.prepare_sample(p.sample_size, 0) for p in plans]
            losses, steps, words = [], 0, 0
            for plan, sample in zip(plans, samples):
                loss, s, w = trainer.step(worker, plan, sample)
                losses.append(loss)
                steps, words = steps + s, words + w
        rows = np.empty((len(held), width), F32)
        store.gather(held, rows, np.empty(len(held), np.int64))
        results.append((losses, steps, words, worker.accessed, rows, worker.elsewhere))
    got, want = results
    assert len(got[0]) == batches and got[2] == int((task.ends - task.starts)[points].sum())
    assert got[:4] == want[:4]
    assert np.array_equal(got[4], want[4]) and np.array_equal(got[5], want[5])
    assert not np.array_equal(got[5], init)  # batches went through the worker and pushed there


# ---- the native calls' checks ----------------------------------------------------------------


def _planned(data, neg=2, bs=5, sentences=40):
    """A planned run of the corpus's first sentences, its pools drawn, over a table of random
    rows: the arguments of wv_train_table."""
    task = _task(data, neg=neg)
    rng = np.random.default_rng(1)
    width = task.value_length
    points = np.arange(sentences, dtype=np.int64)
    starts = task.starts[points]
    lengths = task.ends[points] - starts
    nb = -(-sentences // bs)
    table = np.zeros((nb, K.WV_BATCH_COLUMNS), np.int64)
    table[:, 0] = bs
    table[-1, 0] = sentences - bs * (nb - 1)
    table[:, 1:3] = rng.integers(0, 2**62, (nb, 2))
    total = int(lengths.sum())
    plan_rows = np.empty((3, total), np.int64)
    ends = np.empty(sentences, np.int64)
    keys = np.empty(2 * total, np.int64)
    row_of = np.full(task.num_keys, -1, np.int32)
    n = K.wv_plan_run(task.corpus.tokens, starts, lengths, task.keep, task.window, table, row_of,
                      plan_rows, ends, keys)
    assert n == table[:, 3].sum() and (row_of == -1).all()
    pools = table[:, 3] if neg else np.zeros(nb, np.int64)
    samples = rng.integers(task.vocab_size, task.num_keys, int(pools.sum()))
    big = int((table[:, 4] + pools).max())
    data_ = rng.normal(0, 0.1, (task.num_keys, width)).astype(F32).reshape(-1)
    return dict(dim=task.dim, width=width, negatives=neg, sgd=True, batches=table,
                plan_rows=plan_rows,
                ends=ends, keys=keys[:int(table[:, 4].sum())], samples=samples,
                lrs=np.full(nb, 0.025), data=data_,
                key_offset=np.arange(task.num_keys, dtype=np.int64) * width,
                key_len=np.full(task.num_keys, width, np.int64), row_of=row_of,
                iscratch=np.empty(4 * big, np.int64), values=np.empty((big, width), F32),
                updates=np.empty((big, width), F32), losses=np.zeros(nb),
                counts=np.zeros(2 * nb, np.int64))


def test_a_run_is_its_batches_one_by_one(data):
    """Batches [first, last) of a planned run, in pieces, train what the whole run trains."""
    whole = _planned(data)
    nb = len(whole["batches"])
    assert K.wv_train_table(**whole) == nb
    pieces = _planned(data)
    for first, last in ((0, 3), (3, 4), (4, 4), (4, nb)):
        assert K.wv_train_table(**pieces, first=first, last=last) == last - first
    for name in ("data", "losses", "counts"):
        assert np.array_equal(whole[name], pieces[name]), name
    assert (whole["counts"][::2] > 0).all() and (whole["row_of"] == -1).all()


def _bad_plan(args):
    args["plan_rows"] = args["plan_rows"].copy()
    args["plan_rows"][1, 7] = 10**6  # an output row past its batch's keys


@pytest.mark.parametrize("change,exc,match", [
    (lambda a: a["keys"].__setitem__(4, -1), ValueError, r"keys\[4\] = -1 is outside"),
    (lambda a: a["keys"].__setitem__(1, a["keys"][0]), ValueError, "repeated in its batch"),
    (lambda a: a["samples"].__setitem__(9, 10**6), ValueError, r"samples\[9\] = 1000000"),
    (_bad_plan, ValueError, "outside its plan"),
    (lambda a: a["ends"].__setitem__(0, -1), ValueError, "outside its plan"),
    (lambda a: a.update(samples=a["samples"][:-1]), ValueError, "samples"),
    (lambda a: a.update(batches=a["batches"][:, :4].copy()), ValueError, "shape"),
    (lambda a: a.update(lrs=a["lrs"].astype(F32)), TypeError, "lrs must be float64"),
    (lambda a: a.update(updates=a["values"]), ValueError, "shares memory"),
    (lambda a: a.update(iscratch=a["iscratch"][:-1]), ValueError, "iscratch needs"),
    (lambda a: a.update(row_of=np.full(len(a["key_len"]) + 1, -1, np.int32)), ValueError,
     "row_of has"),
    (lambda a: a.update(first=2, last=1), ValueError, "first 2 and last 1"),
    (lambda a: a.update(dim=0), ValueError, "dim 0"),
    (lambda a: a.update(sgd=False), ValueError, "width 4: .* AdaGrad accumulator"),
])
def test_a_bad_run_trains_nothing(data, change, exc, match):
    args = _planned(data)
    before = args["data"].copy()
    change(args)
    with pytest.raises(exc, match=match):
        K.wv_train_table(**args)
    assert np.array_equal(args["data"], before)
    assert (args["row_of"] == -1).all()


def test_plan_run_checks_its_sentences(data):
    args = _planned(data)
    task = _task(data)
    starts = task.starts[:40].copy()
    lengths = (task.ends - task.starts)[:40]
    plan = dict(tokens=task.corpus.tokens, starts=starts, lengths=lengths, keep=task.keep,
                window=3, batches=args["batches"], row_of=args["row_of"],
                plan_rows=args["plan_rows"], ends=args["ends"],
                keys=np.empty(len(args["plan_rows"][0]) * 2, np.int64))
    starts[17] = len(task.corpus.tokens)
    with pytest.raises(ValueError, match="sentence 17 lies outside tokens"):
        K.wv_plan_run(**plan)
    starts[17] = task.starts[17]
    with pytest.raises(ValueError, match="batch 7: 5 sentences \\(of 4 left\\)"):
        K.wv_plan_run(**dict(plan, starts=starts[:39], lengths=lengths[:39]))
    with pytest.raises(ValueError, match="plan_rows"):
        K.wv_plan_run(**dict(plan, plan_rows=args["plan_rows"][:, :10].copy()))
    assert K.wv_plan_run(**plan) == args["batches"][:, 3].sum()
    assert (args["row_of"] == -1).all()


def test_sample_keys_on_two_nodes():
    """sample_keys on a node of a multi-node job: naive draws (which do not depend on where
    keys are) are prepare_sample's, in the same stream; local ones are drawn among the keys held
    here and pinned until the next clock: read at once, none is remote."""
    import adapm
    from adapm.testing import run_cluster

    def config(scheme):
        return dict(num_keys=100, value_length=4,
                    sampling=adapm.Sampling(10, 90, weights=np.arange(1.0, 81.0), scheme=scheme,
                                            seed=3))

    drawn = run_cluster(_sample_keys_job, 2, args=("sample_keys",), timeout_s=90,
                        config=config("naive"))
    prepared = run_cluster(_sample_keys_job, 2, args=("prepare",), timeout_s=90,
                           config=config("naive"))
    assert drawn == prepared and drawn[0] != drawn[1]  # the ranks' streams differ
    local = run_cluster(_sample_keys_job, 2, args=("local",), timeout_s=90,
                        config=config("local"))
    assert all(len(keys) == 21 for keys in local)


def _sample_keys_job(node, way):
    w = node.worker()
    if way == "prepare":
        handles = [w.prepare_sample(7, w.clock + 1) for _ in range(3)]
        w.advance_clock()
        keys = np.concatenate([w.pull_sample(h)[0] for h in handles])
    else:
        keys = w.sample_keys(7, 3)
    if way == "local":
        w.pull(keys)  # at once: every key is held here, pinned
        assert node.stats()["remote_pull_keys"] == 0
    assert node.stats()["sampled_keys"] == 21
    return keys.tolist()
