"""make demo's last lines (examples/explain_demo.py): what was trained, how good against the
baseline, what the remote share means, computed from the runs' JSON lines."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

EXPLAIN = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "explain_demo.py")


def _module():
    spec = importlib.util.spec_from_file_location("explain_demo", EXPLAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(epoch, seconds, mrr, remote, local=999, waited=0.0, deferred=0):
    stats = {"local_pull_keys": local, "waited_pull_keys": 0, "remote_pull_keys": remote,
             "local_push_keys": 1000, "remote_push_keys": 0, "access_wait_s": waited,
             "deferred_reports": deferred}
    return {"epoch": epoch, "train_seconds": seconds, "mrr": mrr, "hits@10": 2 * mrr,
            "stats": [stats, dict(stats, remote_pull_keys=0, local_pull_keys=local + remote)]}


def test_random_mrr_is_the_mean_reciprocal_rank_of_a_uniform_rank():
    explain = _module()
    assert explain.random_mrr(1) == 1.0
    assert explain.random_mrr(4) == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)


def test_the_explanation_names_quality_ratio_time_and_remote_share(tmp_path):
    run = [_line(1, 1.0, 0.1, 2, waited=0.25, deferred=600), _line(2, 1.5, 0.2, 0, deferred=7)]
    base = [_line(1, 0.5, 0.0, 0), _line(2, 0.5, 0.25, 0)]
    (tmp_path / "run.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run))
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "entities.tsv").write_text("".join(f"{i}\te{i}\n" for i in range(4)))
    proc = subprocess.run([sys.executable, EXPLAIN, str(tmp_path / "run.jsonl"),
                           str(tmp_path / "base.jsonl"), str(tmp_path / "model")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "2 epochs on 2 node processes, 2.5 s of training" in text, text
    assert "MRR 0.200 and Hits@10 0.400" in text and "among all 4; a random ranking scores " \
           "0.5208" in text, text
    assert "reached MRR 0.250 in 1.0 s of training: adapm's MRR is 0.80x that" in text, text
    assert "its time 2.5x" in text, text
    # Epoch 1: 2 remote of 4,000 accesses (0.05%); epoch 2: none.
    assert "Remote share 0.0000% to 0.0500% per epoch" in text, text
    assert "This run is above that aim: 2 reads and 0 writes" in text, text  # 0.05% > 0.01%
    # 0.25 s on each of the 2 nodes in epoch 1: 0.5 s of 2 nodes x 2.5 s of training.
    assert "the workers spent 0.50 s in all (10% of their training time) waiting" in text, text
    # Both nodes' deferred reports in both epochs: 2 x (600 + 7).
    assert "waits for a later round: 1,214 times in this run" in text, text


def test_wrong_arguments_say_how_to_call_it():
    proc = subprocess.run([sys.executable, EXPLAIN], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "explain_demo.py .demo/epochs.jsonl" in proc.stderr
