"""examples/ctr: the Criteo-layout data, the metrics, and Wide & Deep trained on 2 real nodes
(under adapm-run and under torchrun) against the plain PyTorch baseline."""

from __future__ import annotations

import os
import socket
import sys

import numpy as np
import pytest
from app_cli import LAUNCHER, PY, records, run
from hypothesis import given, settings
from hypothesis import strategies as st

CTR = os.path.join(os.path.dirname(__file__), "..", "examples", "ctr")
sys.path.insert(0, CTR)
import criteo

TRAIN = [PY, os.path.join(CTR, "train.py")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("ctr"))
    # Enough rows per value that 2 epochs do not overfit: then the runs' AUCs compare the
    # training, not how fast each memorises the training split.
    meta = criteo.generate(directory, rows=150_000, vocab=2_000, test_share=0.2, seed=3)
    return directory, meta


# --- data and metrics ----------------------------------------------------------------------------


def test_generated_data_reads_back_in_the_criteo_layout(data):
    directory, meta = data
    with open(os.path.join(directory, "train.tsv")) as f:
        line = f.readline().rstrip("\n").split("\t")
    assert len(line) == 40 and line[0] in ("0", "1")
    assert all(len(v) in (0, 8) and all(c in "0123456789abcdef" for c in v) for v in line[14:])
    vocabulary = criteo.build_vocabulary(os.path.join(directory, "train.tsv"), min_count=2)
    train = criteo.read(os.path.join(directory, "train.tsv"), vocabulary)
    test = criteo.read(os.path.join(directory, "test.tsv"), vocabulary)
    assert len(train) == meta["train_rows"] and len(test) == meta["test_rows"]
    assert train.dense.shape == (len(train), 13) and train.categorical.shape == (len(train), 26)
    offsets = vocabulary.offsets
    # every value lands in its own field's range of the shared table
    assert ((train.categorical >= offsets[:-1]) & (train.categorical < offsets[1:])).all()
    assert ((test.categorical >= offsets[:-1]) & (test.categorical < offsets[1:])).all()
    assert 0.15 < train.labels.mean() < 0.4  # Criteo-like click rate
    assert (train.dense >= 0).all()
    # Zipf: each large field's most frequent value covers far more rows than its median one
    field = int(np.argmax(np.diff(offsets)))
    counts = np.bincount(train.categorical[:, field] - offsets[field])[1:]
    assert counts.max() > 50 * max(np.median(counts[counts > 0]), 1)
    # the planted model is learnable but not perfectly
    assert 0.7 < meta["planted_auc"] < 0.95
    again = criteo.build_vocabulary(os.path.join(directory, "train.tsv"), min_count=2)
    assert vocabulary.size == again.size  # deterministic


@pytest.mark.parametrize("content,message", [
    ("1\t2\n", "Criteo layout"),
    ("2" + "\t" * 39 + "\n", "line 1: the label"),
    ("1\tx" + "\t" * 38 + "\n", "line 1: column 2 "),
    ("0" + "\t" * 39 + "\n" + "\t" * 39 + "\n", "line 2: the label"),
])
def test_malformed_files_give_an_error_naming_the_file(tmp_path, content, message):
    path = tmp_path / "train.tsv"
    path.write_text(content)
    with pytest.raises(criteo.DataError, match=message) as info:
        criteo.read(str(path), criteo.build_vocabulary(str(path)))
    assert str(path) in str(info.value)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=60))
def test_auc_is_the_share_of_correctly_ordered_pairs(pairs):
    scores = np.array([s for s, _ in pairs], dtype=float)
    labels = np.array([y for _, y in pairs])
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        assert np.isnan(criteo.auc(scores, labels))
        return
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert criteo.auc(scores, labels) == pytest.approx(pairwise)


def test_logloss_matches_its_definition():
    p, y = np.array([0.9, 0.2, 0.5]), np.array([1, 0, 1])
    expected = -(np.log(0.9) + np.log(0.8) + np.log(0.5)) / 3
    assert criteo.logloss(p, y) == pytest.approx(expected)


# --- training on real nodes ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(cmd, data_dir, *flags, json_file=None):
    """The run's epoch lines and final lines: from stdout (``--json -``) or from ``json_file``
    (``--json FILE``; stdout then holds the summary lines only)."""
    proc = run(cmd + ["--data", data_dir, "--epochs", "2", "--progress", "off", "--dim", "8",
                      "--hidden", "64,32", "--json", json_file or "-", *flags],
               timeout=240)
    if json_file:  # a summary line per epoch (rank 0) and per rank at the end
        assert proc.stdout and all(line.startswith(("epoch ", "rank "))
                                   for line in proc.stdout.splitlines()), proc.stdout
        with open(json_file) as f:
            out = records(f.read())
    else:
        out = records(proc.stdout)
    epochs = [r for r in out if "epoch" in r]
    finals = [r for r in out if r.get("final")]
    return epochs, finals


def test_wide_and_deep_on_two_nodes_matches_the_pytorch_baseline(data):
    directory, _ = data
    baseline, _ = _train(TRAIN, directory, "--baseline")
    launched, finals = _train(LAUNCHER + ["-n", "2"] + TRAIN, directory)
    port = _free_port()
    torchrun = [os.path.join(os.path.dirname(PY), "torchrun"), "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(port)]
    # torch's DDP for the dense layers (torch.distributed on MASTER_PORT, adapm on the next),
    # and forked loader workers.
    under_torchrun, torch_finals = _train(torchrun + TRAIN[1:], directory, "--dense", "ddp",
                                          "--loader-workers", "2")
    for epochs in (baseline, launched, under_torchrun):
        assert [r["epoch"] for r in epochs] == [1, 2]
        assert epochs[0]["test_auc"] > 0.7  # well above chance, as the planted model allows
    assert baseline[0]["world"] == 1 and launched[0]["world"] == under_torchrun[0]["world"] == 2
    for epochs in (launched, under_torchrun):
        for ours, theirs in zip(epochs, baseline):
            assert abs(ours["test_auc"] - theirs["test_auc"]) <= 0.005, (ours, theirs)
    for finals_of_run in (finals, torch_finals):
        assert sorted(r["rank"] for r in finals_of_run) == [0, 1]
        for r in finals_of_run:
            # every rank trained its half, its keys local thanks to intent
            assert r["examples"] == 2 * len(range(r["rank"], 120_000, 2))
            assert r["training_accesses"] > 0
            assert r["remote_share"] <= 1e-4, r


def test_a_missing_data_directory_is_a_clear_error(tmp_path):
    proc = run(TRAIN + ["--data", str(tmp_path / "nowhere")], expect=2)
    assert "nowhere/train.tsv: no such file" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("flag", ["--json", "--trace-dir"])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_data_is_read(tmp_path,
                                                                                   flag):
    target = str(tmp_path / "missing" / "out.jsonl") if flag == "--json" else \
        str(tmp_path / "a-file" / "trace")
    (tmp_path / "a-file").write_text("")
    # --data does not exist either: the output path is refused first, in one line.
    proc = run(TRAIN + ["--data", str(tmp_path / "nowhere"), flag, target], expect=2)
    assert proc.stderr.count("\n") == 1 and "error: " in proc.stderr, proc.stderr
    assert "nowhere" not in proc.stderr and "Traceback" not in proc.stderr and not proc.stdout


# --- checkpoints ---------------------------------------------------------------------------------

# What differs between two runs of the same training: the clock.
_TIMING = ("train_seconds", "examples_per_s", "adapm_seconds", "resumed_at_batch")


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("ctr-small"))
    criteo.generate(directory, rows=30_000, vocab=1_000, test_share=0.2, seed=5)
    return directory


def _epochs_without_timing(epochs):
    return [{k: v for k, v in r.items() if k not in _TIMING} for r in epochs]


def test_a_run_resumed_mid_epoch_gives_exactly_the_uninterrupted_numbers(small_data, tmp_path):
    """One process: stopped after 30 batches (checkpoints every 7 and at the stop), then
    resumed: both epochs' lines equal the uninterrupted run's, train loss included."""
    lines = str(tmp_path / "whole.jsonl")
    whole, finals = _train(TRAIN, small_data, json_file=lines)  # --json FILE: JSON lines there
    assert [r["epoch"] for r in whole] == [1, 2] and [r["rank"] for r in finals] == [0]
    ck = str(tmp_path / "ck")
    stopped, finals = _train(TRAIN, small_data, "--max-batches", "30", "--checkpoint-dir", ck,
                             "--checkpoint-every", "7")
    assert stopped == [] and finals[0]["stopped_at"] == {"epoch": 1, "batch": 30}
    resumed, _ = _train(TRAIN, small_data, "--checkpoint-dir", ck, "--resume")
    assert resumed[0]["resumed_at_batch"] == 30 and "resumed_at_batch" not in resumed[1]
    assert _epochs_without_timing(resumed) == _epochs_without_timing(whole)


def test_a_two_node_run_resumes_where_it_stopped(small_data, tmp_path):
    ck = str(tmp_path / "ck")
    two = LAUNCHER + ["-n", "2"] + TRAIN
    _, finals = _train(two, small_data, "--max-batches", "12", "--checkpoint-dir", ck,
                       "--checkpoint-every", "5")
    assert [r["stopped_at"] for r in finals] == [{"epoch": 1, "batch": 12}] * 2
    import adapm

    assert adapm.checkpoint_meta(ck)["steps"] == 12
    resumed, finals = _train(two, small_data, "--checkpoint-dir", ck, "--resume")
    assert [r["epoch"] for r in resumed] == [1, 2] and resumed[0]["resumed_at_batch"] == 12
    assert resumed[-1]["test_auc"] > 0.7
    # each rank trained the rest of its share: 24,000 rows in 2 shares, 2 epochs, 12 batches done
    assert [r["examples"] for r in finals] == [2 * 12_000 - 12 * 512] * 2
    meta = adapm.checkpoint_meta(ck)
    assert (meta["epoch"], meta["batch"], meta["steps"]) == (2, 24, 48)
    # on another number of ranks: a clear error, no traceback
    proc = run(TRAIN + ["--data", small_data, "--epochs", "3", "--dim", "8", "--hidden", "64,32",
                        "--checkpoint-dir", ck, "--resume"], expect=2)
    assert "written by 2 ranks; resume it with as many (here 1)" in proc.stderr
    assert "Traceback" not in proc.stderr
