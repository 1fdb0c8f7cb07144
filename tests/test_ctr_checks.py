"""The CTR example's (examples/ctr) handling of user mistakes and of Ctrl-C: a checkpoint of
another model or data, malformed data, bad flag values, too few rows for the ranks, a test file
of one class. Each is one line and exit code 2 (130 for Ctrl-C) before any training, never a
traceback; JSON lines stay JSON (null, not NaN)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import pytest
from app_cli import ENV, LAUNCHER, PY, one_line_error, records, run

CTR = os.path.join(os.path.dirname(__file__), "..", "examples", "ctr")
sys.path.insert(0, CTR)
import criteo  # examples/ctr is not a package: imported from its folder

TRAIN = [PY, os.path.join(CTR, "train.py")]
CRITEO = [PY, os.path.join(CTR, "criteo.py")]
SMALL = ["--progress", "off", "--dim", "4", "--hidden", "16,8", "--batch-size", "64"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Small data sets: one, the same with its training labels flipped (as many rows and the
    same vocabulary), and one of another vocabulary."""
    root = tmp_path_factory.mktemp("ctr-checks")
    paths = {name: str(root / name) for name in ("one", "flipped", "other")}
    criteo.generate(paths["one"], rows=3_000, vocab=300, seed=1)
    criteo.generate(paths["other"], rows=3_000, vocab=300, seed=2)
    shutil.copytree(paths["one"], paths["flipped"])
    with open(os.path.join(paths["one"], "train.tsv")) as f:
        lines = f.read().splitlines()
    with open(os.path.join(paths["flipped"], "train.tsv"), "w") as f:
        f.writelines(("1" if line[0] == "0" else "0") + line[1:] + "\n" for line in lines)
    return paths


@pytest.fixture(scope="module")
def checkpoint(data, tmp_path_factory):
    """A checkpoint of a run on data "one" stopped after 5 batches."""
    ck = str(tmp_path_factory.mktemp("ctr-ck") / "ck")
    proc = run([*TRAIN, "--data", data["one"], *SMALL, "--max-batches", "5", "--checkpoint-dir",
                ck, "--checkpoint-every", "2"], timeout=120)
    return ck, proc.stdout


@pytest.mark.parametrize("flags,words", [
    (["--dim", "8"], ["--dim 4 (this run: 8)"]),
    (["--hidden", "16,4"], ["--hidden 16,8 (this run: 16,4)"]),
    (["--min-count", "3"], ["--min-count 2 (this run: 3)"]),
    (["--data", "other"], ["other data", "train.tsv and", "test.tsv differ"]),
    (["--data", "flipped"], ["other data", "flipped/train.tsv differs"]),
])
def test_resume_refuses_another_model_or_other_data(data, checkpoint, flags, words):
    checkpoint, _ = checkpoint
    args = {"--data": data["one"], **dict(zip(SMALL[::2], SMALL[1::2])),
            **dict(zip(flags[::2], flags[1::2]))}
    args["--data"] = data.get(args["--data"], args["--data"])
    proc = run([*TRAIN, *[x for pair in args.items() for x in pair], "--checkpoint-dir",
                checkpoint, "--resume"], timeout=120, expect=2)
    one_line_error(proc, *words)


def test_the_same_data_resumes(data, checkpoint, tmp_path):
    checkpoint, stopped = checkpoint
    assert f"--resume goes on from the checkpoint in {checkpoint}" in stopped, stopped
    ck = tmp_path / "ck"
    shutil.copytree(checkpoint, ck)
    proc = run([*TRAIN, "--data", data["one"], *SMALL, "--checkpoint-dir", str(ck),
                "--resume", "--json", "-"], timeout=120)
    (epoch,) = [r for r in records(proc.stdout) if "epoch" in r]
    assert epoch["resumed_at_batch"] == 5


def test_max_batches_without_a_checkpoint_says_so(data):
    proc = run([*TRAIN, "--data", data["one"], *SMALL, "--max-batches", "3"], timeout=120)
    assert "stopped at epoch 1, batch 3 (no checkpoint written" in proc.stdout, proc.stdout
    assert "--resume goes on" not in proc.stdout


@pytest.mark.parametrize("line,words", [
    (lambda row: row.rsplit("\t", 1)[0], ["line 2: 39 columns, expected 40"]),
    (lambda row: "1\tabc" + row[row.index("\t", 2):], ["line 2: column 2 (integer feature I1)",
                                                       "('abc')"]),
    (lambda row: row[:-4] + "\udcff\udcfe\x01\x02", ["line 2: column 40", "not UTF-8"]),
    (lambda row: "1\t\udc80\udc81\x00" + row[row.index("\t", 2):], ["line 2: column 2"]),
])
def test_a_malformed_line_is_named_without_echoing_it(data, tmp_path, line, words):
    with open(os.path.join(data["one"], "train.tsv")) as f:
        rows = f.read().splitlines()[:3]
    rows[1] = line(rows[1])
    path = tmp_path / "train.tsv"
    path.write_bytes("\n".join(rows).encode("utf-8", "surrogateescape") + b"\n")
    with pytest.raises(criteo.DataError) as info:
        criteo.read(str(path), criteo.build_vocabulary(str(path)))
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    for word in words:
        assert word in message, message
    assert "\t" not in message and "\\x" not in message and len(message) < 250, message


def test_an_empty_file_is_named(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("")
    with pytest.raises(criteo.DataError, match="train.tsv: no examples"):
        criteo.build_vocabulary(str(path))


def test_fewer_training_rows_than_ranks_is_refused_naming_the_file(data, tmp_path):
    directory = tmp_path / "tiny"
    directory.mkdir()
    with open(os.path.join(data["one"], "train.tsv")) as f:
        (directory / "train.tsv").write_text(f.readline())
    shutil.copy(os.path.join(data["one"], "test.tsv"), directory / "test.tsv")
    proc = run([*LAUNCHER, "-n", "2", *TRAIN, "--data", str(directory), *SMALL], timeout=120,
               expect=2)
    assert "train.tsv: 1 example(s) for 2 ranks" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "epoch" not in proc.stdout


def test_one_class_in_the_test_file_is_a_null_auc_and_the_bar_shows_under_adapm_run(data,
                                                                                    tmp_path):
    directory = tmp_path / "negatives"
    directory.mkdir()
    shutil.copy(os.path.join(data["one"], "train.tsv"), directory / "train.tsv")
    with open(os.path.join(data["one"], "test.tsv")) as f:
        (directory / "test.tsv").write_text("".join(r for r in f if r.startswith("0")))
    # ADAPM_TERMINAL=1: adapm-run says that its stderr, which relays the ranks', is a terminal.
    proc = run([*TRAIN, "--data", str(directory), *SMALL, "--progress", "auto", "--json", "-"],
               timeout=120, env={"ADAPM_TERMINAL": "1", "PYTHONWARNINGS": "default"})
    (epoch,) = [r for r in records(proc.stdout) if "epoch" in r]
    assert epoch["test_auc"] is None and "NaN" not in proc.stdout
    assert "test AUC n/a" in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    assert "batch/s" in proc.stderr, proc.stderr  # tqdm's bar


def _example_main():
    """train.py's main, imported under a name of its own (the GNN example has a train.py)."""
    spec = importlib.util.spec_from_file_location("ctr_train", os.path.join(CTR, "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("flags,flag", [
    (["--seed", "-1"], "--seed"),
    (["--seed", "-1", "--baseline"], "--seed"),
    (["--seed", "99999999999999999999"], "--seed"),
    (["--batch-size", "99999999999999999999"], "--batch-size"),
    (["--init-scale", "-1", "--baseline"], "--init-scale"),
    (["--init-scale", "nan"], "--init-scale"),
    (["--lr", "inf"], "--lr"),
    (["--lr", "0"], "--lr"),
    (["--dense-lr", "0"], "--dense-lr"),
    (["--loader-workers", "-1"], "--loader-workers"),
    (["--threads", "1000000"], "--threads"),
    (["--checkpoint-dir", "FILE"], "--checkpoint-dir"),
    (["--trace-dir", "FILE"], "--trace-dir"),
])
def test_bad_flag_values_are_one_line_naming_the_flag(tmp_path, capsys, flags, flag):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    flags = [str(a_file) if x == "FILE" else x for x in flags]
    with pytest.raises(SystemExit) as info:
        _example_main()(["--data", str(tmp_path / "nowhere"), *flags])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1, err
    others = {"--seed", "--batch-size", "--init-scale", "--lr", "--dense-lr", "--loader-workers",
              "--threads", "--checkpoint-dir", "--trace-dir"} - {flag}
    assert flag in err and not any(f"{other} " in err for other in others), err


def test_the_generator_refuses_bad_values_and_writes_no_nan(tmp_path):
    proc = run([*CRITEO, "generate", str(tmp_path / "a"), "--seed", "-1"], timeout=60, expect=2)
    assert "--seed" in proc.stderr and "Traceback" not in proc.stderr
    # 10^11 values a field: refused before anything is allocated, saying what fits
    proc = run([*CRITEO, "generate", str(tmp_path / "b"), "--vocab", "100000000000"],
               timeout=60, expect=2)
    assert "GiB of memory" in proc.stderr and "--vocab up to about" in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "b")
    # one test row: one class, no AUC
    proc = run([*CRITEO, "generate", str(tmp_path / "c"), "--rows", "11", "--test-share",
                "0.01"], timeout=60)
    (meta,) = records(proc.stdout)
    assert meta["planted_auc"] is None and "NaN" not in proc.stdout
    with open(tmp_path / "c" / "meta.json") as f:
        assert "NaN" not in f.read()


def test_the_generated_share_of_clicks_is_what_the_docs_say(tmp_path):
    meta = criteo.generate(str(tmp_path / "d"), rows=20_000, vocab=1_000, seed=0)
    assert 0.29 < meta["positives"] < 0.34  # "about 31%" (criteo.py, docs/examples.md)


def test_ctrl_c_under_adapm_run_is_interrupted_and_exit_130(data):
    """SIGINT to the whole job, as Ctrl-C on a terminal sends it (each rank gets it twice:
    from the terminal and from adapm-run): "interrupted" per rank, no traceback."""
    from app_cli import ctrl_c_under_the_launcher

    ctrl_c_under_the_launcher([*TRAIN, "--data", data["one"], *SMALL, "--epochs", "100000"])


def test_a_peer_that_dies_mid_run_is_one_line_naming_it(data):
    """Rank 1 killed mid-run: rank 0 names the failed node in one line and exits 1."""
    from app_cli import peer_dies_mid_run

    peer_dies_mid_run([*TRAIN, "--data", data["one"], *SMALL, "--epochs", "100000"],
                      "ctr-peer-dies")
