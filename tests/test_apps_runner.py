"""The apps' runner pieces: collectives through the PM (real processes), per-phase stats."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

import numpy as np
import pytest

import adapm
from adapm.apps.exchange import PAYLOAD_BYTES, Exchange
from adapm.apps.runner import _delta
from adapm.testing import run_cluster

from app_cli import ENV, LAUNCHER, PY, run

FAST = dict(connect_timeout_s=20, request_timeout_s=20)


def _exchange_job(node, row, uniform, base):
    w = node.worker()
    ex = Exchange(node, w, base, row, uniform)
    got = []
    for round_ in range(3):  # repeated rounds reuse the same keys
        doc = {"rank": node.rank, "round": round_, "text": "ünïcode ✓" * node.rank,
               "floats": [0.1, float("inf"), -2.5e300], "big": 2 ** 60 + node.rank}
        got.append(ex.allgather(doc))
    try:
        ex.allgather({"x": "y" * PAYLOAD_BYTES})
    except adapm.AdaPMError as exc:
        too_big = str(exc)
    else:
        too_big = None
    return got, too_big


@pytest.mark.parametrize("management", ["adaptive", "full_replication"])
@pytest.mark.parametrize("uniform", [True, False])
def test_allgather_through_reserved_keys(management, uniform):
    row, base = 16, 10
    world = 3
    num_keys = base + Exchange.num_keys(world, row)
    lengths = row if uniform else np.full(num_keys, row, dtype=np.int64)
    results = run_cluster(_exchange_job, world, args=(row, uniform, base), timeout_s=120,
                          config=dict(num_keys=num_keys, value_length=lengths,
                                      management=management, **FAST))
    for rank, (got, too_big) in enumerate(results):
        for round_, docs in enumerate(got):
            assert [d["rank"] for d in docs] == [0, 1, 2]
            assert all(d["round"] == round_ for d in docs)
            assert docs[2]["text"] == "ünïcode ✓" * 2 and docs[1]["big"] == 2 ** 60 + 1
            assert docs[0]["floats"] == [0.1, float("inf"), -2.5e300]
        assert too_big is not None and "exceeds" in too_big and f"rank {rank}" in too_big


def test_delta_counts_one_phase():
    before = {"local_pull_keys": 10, "remote_pull_keys": 1, "rounds": 4, "mean_round_ms": 2.0,
              "replica_reads": 0, "mean_staleness_ms": 0.0, "remote_access_share": 0.5,
              "engine_cpu_s": 1.25}
    after = {"local_pull_keys": 40, "remote_pull_keys": 1, "rounds": 6, "mean_round_ms": 3.0,
             "replica_reads": 10, "mean_staleness_ms": 1.5, "remote_access_share": 0.01,
             "engine_cpu_s": 2.0}
    d = _delta(before, after)
    assert d["engine_cpu_s"] == pytest.approx(0.75)  # the phase's CPU, not the run's so far
    assert d["local_pull_keys"] == 30 and d["remote_pull_keys"] == 0
    assert d["rounds"] == 2 and d["mean_round_ms"] == pytest.approx((18 - 8) / 2)
    assert d["mean_staleness_ms"] == pytest.approx(1.5)
    assert d["remote_access_share"] == 0.0


@pytest.mark.parametrize("app", ["kge", "wv", "mf"])
def test_help_shows_each_default_once_and_none_for_required_flags(app):
    """--help: a flag's default where it has one (once: --management names its own), none for
    a required flag, a switch or a flag without a default."""
    import importlib

    parser = importlib.import_module(f"adapm.apps.{app}").parser()
    text = " ".join(parser.format_help().split())  # argparse wraps at the terminal's width
    assert "(default: None)" not in text and "(default: False)" not in text, text
    assert text.count("(default: adaptive)") == 1 and "(default: auto)" in text, text
    required = [a for a in parser._actions if a.required]
    assert required, "every app has a required data flag"
    options = text[text.index("options:"):]
    for action in required:
        entry = options[options.index(f"{action.option_strings[0]} {action.metavar} "):]
        entry = entry[:entry.index(" --", 3)]  # up to the next flag
        assert "default" not in entry, entry


def test_the_apps_evaluate_on_one_blas_thread(tmp_path, monkeypatch):
    """numpy's OpenBLAS keeps its idle threads spinning ~0.1 s after each call, on the cores
    of the workers' next epoch: an app keeps it to the caller's thread while it runs (every
    BLAS product of the evaluation sees one thread), and leaves the process's limit as it
    found it."""
    import threadpoolctl

    from adapm.apps import mf

    def blas_threads():
        return [lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                if lib["user_api"] == "blas"]

    before = blas_threads()
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):  # as on a 2-core machine
        seen = []
        dot = np.dot

        def counting_dot(*args, **kwargs):
            seen.append(blas_threads())
            return dot(*args, **kwargs)

        monkeypatch.setattr(np, "dot", counting_dot)
        assert mf.main(["generate", str(tmp_path), "--rows", "200", "--cols", "50",
                        "--entries", "4000", "--seed", "1"]) == 0
        assert mf.main(["--train", str(tmp_path / "train.mmc"), "--test",
                        str(tmp_path / "test.mmc"), "--epochs", "2", "--baseline",
                        "--progress", "off", "--json", str(tmp_path / "out.json")]) == 0
        monkeypatch.undo()
        assert seen and all(threads == [1] * len(threads) for threads in seen), seen
        assert blas_threads() == [2] * len(before)
    assert blas_threads() == before


@pytest.mark.parametrize("program", [
    ["-m", "adapm.apps.kge", "--data", "no-such-kg"],
    ["-m", "adapm.apps.wv", "--corpus", "no-such-corpus.txt"],
    ["-m", "adapm.apps.mf", "--train", "no-train.mmc", "--test", "no-test.mmc"],
    ["examples/gnn/train.py"],
    ["examples/ctr/train.py", "--data", "no-such-data"],
], ids=["kge", "wv", "mf", "gnn", "ctr"])
def test_the_baseline_refuses_a_launcher(program, tmp_path):
    """--baseline is one process: under a launcher's environment every rank would train the
    whole baseline and write the same outputs, so each app and example says so and stops
    before reading its data or writing anything."""
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "epochs.jsonl"
    proc = run([PY, *program, "--baseline", "--json", str(out)], expect=2, cwd=root,
               env={"ADAPM_RANK": "1", "ADAPM_WORLD_SIZE": "2",
                    "ADAPM_RENDEZVOUS": "127.0.0.1:9"}, timeout=120)
    assert "--baseline runs in one process; start it without a launcher" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("program", [
    ["-m", "adapm.apps.kge", "generate", "{out}", "--triples", "100"],
    ["-m", "adapm.apps.wv", "generate", "{out}", "--sentences", "100"],
    ["-m", "adapm.apps.mf", "generate", "{out}", "--rows", "100", "--cols", "100", "--entries",
     "500"],
    ["examples/ctr/criteo.py", "generate", "{out}", "--rows", "100"],
    ["examples/gnn/graph.py", "generate", "{out}"],
], ids=["kge", "wv", "mf", "ctr", "gnn"])
def test_a_generator_refuses_an_output_it_cannot_write_in_one_line(program, tmp_path):
    """Every data generator: an output path that is a file, or under one, is one line and exit
    code 2 (it was a traceback and exit 1), and nothing is written."""
    root = Path(__file__).resolve().parent.parent
    blocker = tmp_path / "a-file"
    blocker.write_text("data\n")
    for out in (blocker, blocker / "kg"):
        proc = run([PY, *[str(out) if arg == "{out}" else arg for arg in program]], expect=2,
                   cwd=root, timeout=120)
        assert "Traceback" not in proc.stderr and str(blocker) in proc.stderr, proc.stderr
    assert blocker.read_text() == "data\n" and sorted(tmp_path.iterdir()) == [blocker]


def _on_a_terminal(cmd, cwd) -> str:
    """What ``cmd`` writes to a pseudo-terminal as its stdout and stderr (a user's terminal)."""
    leader, follower = pty.openpty()
    # 24 x 120 characters (a new pty has 0 x 0, and tqdm draws a bar that wide)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(cmd, stdout=follower, stderr=follower, cwd=cwd, env=ENV)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: every writer closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_the_progress_bar_shows_on_a_terminal_through_the_launcher(tmp_path):
    """--progress auto draws rank 0's bar when the user's terminal is adapm-run's: a rank's
    own stderr is a pipe to the launcher (the bar was missing under adapm-run), and no bar
    goes into a pipe or a file."""
    data = tmp_path / "kg"
    run([PY, "-m", "adapm.apps.kge", "generate", str(data), "--triples", "2000"])
    app = [PY, "-m", "adapm.apps.kge", "--data", str(data), "--dim", "8", "--epochs", "1",
           "--eval-max", "0"]
    for cmd in (app, [*LAUNCHER, "-n", "2", *app]):
        shown = _on_a_terminal(cmd, tmp_path)
        assert "batch/s]" in shown and "epoch 1:" in shown, shown
        piped = run(cmd, cwd=tmp_path)
        assert "batch/s" not in piped.stderr + piped.stdout, piped.stderr


def test_ctrl_c_is_one_line_and_a_batch_beyond_the_data_is_one_batch(tmp_path):
    """SIGINT mid-run (Ctrl-C; adapm-run passes it to every rank): "interrupted" and exit code
    130, not each rank's traceback. A --batch-size beyond the data trains as one batch (its
    scratch was sized by the flag: 2 TiB asked for 10^8)."""
    data = tmp_path / "kg"
    run([PY, "-m", "adapm.apps.kge", "generate", str(data), "--triples", "2000"])
    app = [PY, "-m", "adapm.apps.kge", "--data", str(data), "--dim", "8", "--eval-max", "0",
           "--progress", "off"]
    whole = run([*app, "--epochs", "1", "--batch-size", "100000000", "--json", "-"])
    assert "Traceback" not in whole.stderr and '"epoch": 1' in whole.stdout
    for signals in (1, 2):
        # twice: Ctrl-C under adapm-run comes twice (the terminal's group signal, and
        # adapm-run's); the second, in the middle of the node's release, killed the rank
        code, err = _interrupted([*app, "--epochs", "100000"], signals)
        assert code == 130 and err.strip() == "interrupted", (signals, code, err)


def _interrupted(cmd: list, signals: int) -> tuple:
    """``cmd`` sent SIGINT ``signals`` times, 2 ms apart, once it trained an epoch: its exit
    code and stderr. SIGINT starts at its default in the app (a shell's background job, as a
    CI runner may start the suite, ignores it, and the app would inherit that)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().startswith("epoch 1:")  # training
        for i in range(signals):
            time.sleep(0.002 if i else 0)
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, err


def test_a_peer_that_dies_mid_run_is_one_line_naming_it(tmp_path):
    """Two KGE ranks started by hand; rank 1 is killed once both train: rank 0 reports the
    failed node in one line and exits 1, not a traceback through the app's frames."""
    from app_cli import peer_dies_mid_run

    data = tmp_path / "kg"
    run([PY, "-m", "adapm.apps.kge", "generate", str(data), "--triples", "20000"])
    err = peer_dies_mid_run([PY, "-m", "adapm.apps.kge", "--data", str(data), "--dim", "8",
                             "--eval-max", "0", "--progress", "off", "--epochs", "100000"],
                            "peer-dies")
    assert err.startswith("python -m adapm.apps.kge: error: rank 0: rank 1 failed"), err


def test_an_app_run_in_process_gives_the_callers_sigint_handler_back(tmp_path, no_launcher):
    """The runner ignores a second Ctrl-C while it releases its node (adapm-run passes the
    terminal's on: the copy killed the rank); a run that was not interrupted puts the caller's
    handler back (a notebook's Ctrl-C goes on working)."""
    from adapm.apps import kge

    data = tmp_path / "kg"
    run([PY, "-m", "adapm.apps.kge", "generate", str(data), "--triples", "2000"])
    # Python's own handler, as a user's main thread has it (a suite started in a shell's
    # background inherits SIGINT ignored, which the runner leaves alone)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        kge.main(["--data", str(data), "--dim", "8", "--epochs", "1", "--eval-max", "0",
                  "--progress", "off", "--json", str(tmp_path / "e.jsonl")])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
