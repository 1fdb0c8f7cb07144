"""The MF app's native loops over the baseline's array and one node's store (issue 29: many
batches per native call, the GIL released): the same numbers as the per-batch path, bit for
bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from adapm._native_loader import load
from adapm.apps import mf, runner

K = load("adapm._kernels")
# 150 batches of 100 entries an epoch: three native calls (CHUNK_BATCHES 64), the last short.
ROWS, COLS, ENTRIES, BATCH = 600, 300, 16_600, 100


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("mf-chunked")
    assert mf.main(["generate", str(out), "--rows", str(ROWS), "--cols", str(COLS),
                    "--entries", str(ENTRIES), "--seed", "3"]) == 0
    return out


def _train(data, out, *flags):
    """The app in this process; returns its JSON lines and exported W, H."""
    lines = out.with_suffix(".jsonl")
    assert mf.main(["--train", str(data / "train.mmc"), "--test", str(data / "test.mmc"),
                    "--epochs", "2", "--batch-size", str(BATCH), "--progress", "off",
                    "--seed", "5", "--export", str(out), "--json", str(lines), *flags]) == 0
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    return records, np.load(out / "W.npy"), np.load(out / "H.npy")


def _numbers(records):
    """What must not change: loss, RMSE and the access counters of each epoch."""
    keep = ("local_pull_keys", "local_push_keys")
    return [(r["loss"], r["rmse"], {k: r["stats"][0][k] for k in keep}) for r in records]


def _count_calls(monkeypatch, name):
    calls = []
    original = getattr(K, name)

    def counted(*args):
        calls.append(args[2])
        return original(*args)

    monkeypatch.setattr(K, name, counted)
    return calls


def test_native_loops_compute_the_per_batch_path(data, tmp_path, monkeypatch):
    """The baseline's table and one PM node's store, each many batches per native call, and both
    per batch: the same losses, RMSE, access counts and model, bit for bit."""
    assert hasattr(K, "mf_train_rows"), "adapm._kernels built from before mf_train_rows"
    table_calls = _count_calls(monkeypatch, "mf_train_table")
    rows_calls = _count_calls(monkeypatch, "mf_train_rows")
    native = _train(data, tmp_path / "native", "--baseline")
    assert len(table_calls) == 2 * 3 and set(table_calls) == {BATCH}  # three calls an epoch
    node = _train(data, tmp_path / "node")
    assert len(rows_calls) == 2 * 3 and set(rows_calls) == {BATCH}
    monkeypatch.setattr(mf.MFTrainer, "chunked", lambda self, worker, ahead=0: None)
    per_batch = _train(data, tmp_path / "per-batch", "--baseline")
    node_per_batch = _train(data, tmp_path / "node-per-batch")
    assert len(table_calls) == 6 and len(rows_calls) == 6  # the per-batch paths called neither
    for other in (node, per_batch, node_per_batch):
        assert _numbers(native[0]) == _numbers(other[0])
        assert np.array_equal(native[1], other[1]) and np.array_equal(native[2], other[2])


def test_the_runner_advances_one_clock_per_batch(data, tmp_path):
    """The chunked path's clocks: one per batch, as the per-batch loop's."""
    seen = []
    original = runner._Thread._run_chunks

    def spy(self, run, order, bs, ahead):
        before = self.worker.clock
        original(self, run, order, bs, ahead)
        seen.append((self.worker.clock - before, -(-len(order) // bs), self.done))

    runner._Thread._run_chunks = spy
    try:
        _train(data, tmp_path / "clocks", "--baseline", "--workers", "2")
    finally:
        runner._Thread._run_chunks = original
    assert len(seen) == 4  # 2 workers x 2 epochs
    assert all(advanced == batches == done for advanced, batches, done in seen)
