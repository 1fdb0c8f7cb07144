"""The GNN example's (examples/gnn) handling of user mistakes and of Ctrl-C: a checkpoint that
does not fit the run, bad flag values, too few training nodes, empty evaluation splits. Each is
one line and exit code 2 (130 for Ctrl-C), before any training, never a traceback."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest
from app_cli import ENV, LAUNCHER, PY, one_line_error, records, run

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "gnn")
sys.path.insert(0, EXAMPLE)

import graph as gnn_graph  # examples/gnn is not a package: imported from its folder

TRAIN = os.path.join(EXAMPLE, "train.py")
GRAPH = os.path.join(EXAMPLE, "graph.py")


def _example_main():
    """train.py's main, imported under a name of its own (the CTR example has a train.py)."""
    spec = importlib.util.spec_from_file_location("gnn_train", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """Small graphs: one to train on, a larger one, one of the same size from another seed."""
    root = tmp_path_factory.mktemp("gnn-checks")
    paths = {}
    for name, nodes, seed in (("small", 1_000, 0), ("large", 1_500, 0), ("other", 1_000, 1)):
        paths[name] = str(root / name)
        gnn_graph.save(gnn_graph.generate(nodes, 4, seed=seed), paths[name])
    return paths


@pytest.fixture(scope="module")
def checkpoint(graphs, tmp_path_factory):
    """A checkpoint after 1 epoch on the small graph."""
    ck = str(tmp_path_factory.mktemp("gnn-ck") / "ck")
    run([PY, TRAIN, "--graph", graphs["small"], "--epochs", "1", "--progress", "off",
         "--loader-workers", "0", "--checkpoint-dir", ck], timeout=120)
    return ck


@pytest.mark.parametrize("flags,words", [
    (["--graph", "large"], ["another graph", "1500 nodes"]),
    (["--graph", "other"], ["another graph"]),  # as many nodes, other edges
    (["--dim", "16"], ["--dim 32", "--dim 16"]),
    (["--hidden", "65"], ["--hidden 64", "--hidden 65"]),
    (["--seed", "3"], ["--seed 3"]),
    (["--epochs", "1"], ["1 epochs done", "--epochs above 1"]),
])
def test_resume_refuses_a_checkpoint_of_another_graph_or_model(graphs, checkpoint, flags,
                                                               words):
    args = {"--graph": graphs["small"], "--epochs": "2", **dict(zip(flags[::2], flags[1::2]))}
    if args["--graph"] in graphs:
        args["--graph"] = graphs[args["--graph"]]
    proc = run([PY, TRAIN, *[x for pair in args.items() for x in pair], "--progress", "off",
                "--checkpoint-dir", checkpoint, "--resume"], timeout=120, expect=2)
    one_line_error(proc, *words)


def test_resume_from_a_missing_or_damaged_checkpoint_is_one_line(graphs, checkpoint, tmp_path):
    common = [PY, TRAIN, "--graph", graphs["small"], "--epochs", "2", "--progress", "off",
              "--resume", "--checkpoint-dir"]
    one_line_error(run([*common, str(tmp_path / "nowhere")], timeout=120, expect=2),
                    "nowhere", "manifest.json")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in os.listdir(checkpoint):
        (damaged / name).write_bytes(open(os.path.join(checkpoint, name), "rb").read())
    values = np.load(damaged / "shard-00000.values.npy")
    values[3] += 1
    np.save(damaged / "shard-00000.values.npy", values)
    one_line_error(run([*common, str(damaged)], timeout=120, expect=2),
                    "shard-00000.values.npy is corrupt")
    # the checkpoint itself still resumes
    resumed = run([*common, checkpoint, "--json", "-", "--loader-workers", "0"], timeout=120)
    assert [r["epoch"] for r in records(resumed.stdout)] == [2]


@pytest.mark.parametrize("flags,words", [
    (["--train-frac", "0"], ["--train-frac"]),
    (["--edges-per-node", "inf"], ["--edges-per-node"]),
    (["--edges-per-node", "nan"], ["--edges-per-node"]),
    (["--p-in", "1.5"], ["--p-in"]),
    (["--alpha", "nan"], ["--alpha"]),
    (["--communities", "1"], ["--communities"]),
    (["--nodes", "10", "--communities", "8"], ["--nodes", "--communities"]),
    (["--val-frac", "0.8"], ["--train-frac, --val-frac and --test-frac"]),
    (["--seed", "99999999999999999999"], ["--seed"]),
    (["--batch-size", "99999999999999999999"], ["--batch-size"]),
    (["--checkpoint-dir", "FILE"], ["--checkpoint-dir", "not a directory"]),
    (["--trace-dir", "FILE"], ["--trace-dir", "not a directory"]),
])
def test_bad_flag_values_are_one_line_naming_the_flag(tmp_path, capsys, flags, words):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    flags = [str(a_file) if x == "FILE" else x for x in flags]
    with pytest.raises(SystemExit) as info:
        _example_main()(["--epochs", "1", *flags])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


def test_graph_py_refuses_a_graph_without_training_nodes(tmp_path):
    proc = run([PY, GRAPH, "generate", str(tmp_path / "g"), "--train-frac", "0"], timeout=60,
               expect=2)
    assert "--train-frac" in proc.stderr and "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "g")


def test_fewer_training_nodes_than_ranks_is_one_line_naming_the_graph(tmp_path):
    directory = str(tmp_path / "tiny")
    run([PY, GRAPH, "generate", directory, "--nodes", "16", "--communities", "2",
         "--train-frac", "0.05"], timeout=60)
    proc = run([*LAUNCHER, "-n", "2", PY, TRAIN, "--graph", directory, "--epochs", "1",
                "--progress", "off"], timeout=120, expect=2)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "graph.npz: 1 training node(s) for 2 ranks" in proc.stderr, proc.stderr
    proc = run([PY, TRAIN, "--graph", directory, "--epochs", "1", "--baseline", "--shards", "2"],
               timeout=120, expect=2)
    one_line_error(proc, "graph.npz: 1 training node(s) for 2 shards")


def test_empty_evaluation_splits_are_null_without_warnings_and_the_bar_shows_under_adapm_run():
    """No validation or test nodes: null accuracies, not NaN (invalid JSON) and numpy's warning;
    the baseline without torch's sparse-check warning; the progress bar shown where adapm-run
    says its stderr is a terminal (ADAPM_TERMINAL=1)."""
    proc = run([PY, TRAIN, "--nodes", "400", "--communities", "2", "--val-frac", "0",
                "--test-frac", "0", "--epochs", "1", "--baseline", "--json", "-"],
               timeout=120, env={"ADAPM_TERMINAL": "1"})
    (record,) = records(proc.stdout)
    assert record["val_acc"] is None and record["test_acc"] is None
    assert "NaN" not in proc.stdout and "Warning" not in proc.stderr, proc.stderr
    assert "epoch 1" in proc.stderr and "batch" in proc.stderr  # the bar
    assert "val acc n/a" in proc.stderr  # the summary line (stderr with --json -)


def test_ctrl_c_under_adapm_run_is_interrupted_and_exit_130(graphs):
    """SIGINT to the whole job, as Ctrl-C on a terminal sends it (each rank gets it twice:
    from the terminal and from adapm-run): "interrupted" per rank, no traceback."""
    from app_cli import ctrl_c_under_the_launcher

    ctrl_c_under_the_launcher([PY, TRAIN, "--graph", graphs["small"], "--epochs", "100000",
                               "--progress", "off"])


def test_a_peer_that_dies_mid_run_is_one_line_naming_it(graphs):
    """Rank 1 killed mid-run: rank 0 names the failed node in one line and exits 1."""
    from app_cli import peer_dies_mid_run

    peer_dies_mid_run([PY, TRAIN, "--graph", graphs["small"], "--epochs", "100000",
                       "--progress", "off"], "gnn-peer-dies")
