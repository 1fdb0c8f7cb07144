"""The apps refuse to train when ranks read different data: each rank's data files (sizes and a
BLAKE2b digest) are compared with rank 0's at the start, and every rank stops with one line
naming what differs (exit 2), instead of training on a silent mix."""

from __future__ import annotations

import shutil
import subprocess

from app_cli import ENV, PY, run

from adapm.testing import free_port


def _rank(rank: int, port: int, train: str, test: str) -> subprocess.Popen:
    env = dict(ENV, ADAPM_RANK=str(rank), ADAPM_WORLD_SIZE="2", ADAPM_JOB="same-data-test",
               ADAPM_RENDEZVOUS=f"127.0.0.1:{port}")
    return subprocess.Popen([PY, "-m", "adapm.apps.mf", "--train", train, "--test", test,
                             "--rank", "4", "--epochs", "1"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _job(tmp_path, train1: str) -> list:
    data = tmp_path / "mf"
    port = free_port()
    procs = [_rank(0, port, str(data / "train.mmc"), str(data / "test.mmc")),
             _rank(1, port, train1, str(data / "test.mmc"))]
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=180)
        finally:
            proc.kill()
        out.append((proc.returncode, stdout, stderr))
    return out


def _generate(tmp_path):
    run([PY, "-m", "adapm.apps.mf", "generate", str(tmp_path / "mf"), "--rows", "300", "--cols",
         "200", "--entries", "6000", "--seed", "3"])
    return tmp_path / "mf"


def test_ranks_reading_different_training_files_refuse_to_train(tmp_path):
    data = _generate(tmp_path)
    other = tmp_path / "other.mmc"
    lines = (data / "train.mmc").read_text().splitlines(keepends=True)
    # The same size and entries, one rating changed: only the digest tells them apart.
    last = lines[-1].split()
    last[-1] = "9" * len(last[-1]) if last[-1] != "9" * len(last[-1]) else "8" * len(last[-1])
    other.write_text("".join(lines[:-1]) + " ".join(last) + "\n")
    assert other.stat().st_size == (data / "train.mmc").stat().st_size
    for code, stdout, stderr in _job(tmp_path, str(other)):
        assert code == 2, stderr
        assert "rank 1 reads other data than rank 0" in stderr and "--train" in stderr, stderr
        assert "Traceback" not in stderr, stderr
        assert not [line for line in stdout.splitlines() if line.startswith("{")]  # no epoch


def test_ranks_reading_the_same_data_from_different_paths_train(tmp_path):
    data = _generate(tmp_path)
    copy = tmp_path / "copy.mmc"
    shutil.copy(data / "train.mmc", copy)
    results = _job(tmp_path, str(copy))
    for code, _, stderr in results:
        assert code == 0, stderr
