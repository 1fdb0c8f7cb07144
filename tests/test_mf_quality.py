"""Quality of the matrix-factorisation app that does not depend on how it is run: the RMSE per
epoch with 1, 2 and 4 baseline workers; early stopping on a validation split with the best
epoch's model exported (one node and two real node processes); ratings as users have them (a
CSV with a header, labels for ids)."""

from __future__ import annotations

import numpy as np
import pytest

from adapm.apps import mf_data

from app_cli import LAUNCHER, PY, records, run


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> dict:
    """A small generated matrix with ~100 entries per row: 3 epochs come near its noise."""
    out = tmp_path_factory.mktemp("mf_dense")
    run([PY, "-m", "adapm.apps.mf", "generate", str(out), "--rows", "4000", "--cols", "1000",
         "--entries", "400000", "--seed", "1"])
    return {"train": out / "train.mmc", "test": out / "test.mmc"}


def test_rmse_per_epoch_does_not_depend_on_the_number_of_workers(dense):
    # Before the rows schedule, the default (columnwise: each worker's own rotation through
    # the columns) ended epoch 3 here at 0.263 (1 worker), 0.350 (2) and 0.303 (4); more
    # workers learned less per epoch. Since, the means agree within 0.2%. With several
    # threads a run's RMSE also depends on how their batches interleave (20 runs of 2 workers:
    # 0.2321-0.2381; docs/quality.md), so each worker count is judged by the median of three
    # runs: the worker count's effect, not one run's thread timing (a single run each failed
    # the bound about once in six full suites).
    app = [PY, "-m", "adapm.apps.mf", "--train", str(dense["train"]), "--test",
           str(dense["test"]), "--epochs", "3", "--progress", "off", "--baseline", "--json", "-"]
    runs = {w: [records(run([*app, "--workers", str(w)]).stdout)[-1]["rmse"] for _ in range(3)]
            for w in (1, 2, 4)}
    assert len(set(runs[1])) == 1, runs  # one worker: no threads to interleave, deterministic
    rmse = {w: float(np.median(r)) for w, r in runs.items()}
    assert max(rmse.values()) <= 1.02 * min(rmse.values()), runs
    assert max(rmse.values()) < 0.5, runs  # and it learned: the values have variance ~1


@pytest.fixture(scope="module")
def noisy(tmp_path_factory) -> dict:
    """A small, noisy matrix that overfits within a few epochs without L2, split into train,
    validation and test files."""
    out = tmp_path_factory.mktemp("mf_noisy")
    run([PY, "-m", "adapm.apps.mf", "generate", str(out), "--rows", "300", "--cols", "200",
         "--entries", "12000", "--noise", "1.0", "--format", "tsv", "--seed", "3"])
    lines = (out / "train.tsv").read_text().splitlines(keepends=True)
    (out / "valid.tsv").write_text("".join(lines[:1200]))
    (out / "train_part.tsv").write_text("".join(lines[1200:]))
    return {"train": out / "train_part.tsv", "valid": out / "valid.tsv",
            "test": out / "test.tsv", "dir": out}


def _rmse(w, h, m) -> float:
    predicted = (w[m.rows] * h[m.cols]).sum(axis=1)
    return float(np.sqrt(np.mean((m.vals.astype(np.float64) - predicted) ** 2)))


@pytest.mark.parametrize("nodes", [1, 2])
def test_valid_stops_early_and_exports_the_best_epoch(noisy, tmp_path, nodes):
    export = tmp_path / "model"
    app = [PY, "-m", "adapm.apps.mf", "--train", str(noisy["train"]), "--valid",
           str(noisy["valid"]), "--test", str(noisy["test"]), "--epochs", "30", "--patience",
           "3", "--reg", "0", "--progress", "off", "--json", "-", "--export", str(export)]
    proc = run([*LAUNCHER, "-n", "2", *app] if nodes == 2 else app)
    lines = records(proc.stdout)
    best = lines[-1]["best_epoch"]
    valid = [r["valid_rmse"] for r in lines]
    # It overfits, so it stops: three epochs after the best, which has the lowest RMSE.
    assert len(lines) == best + 3 < 30, valid
    # ... and says so, once.
    notice = (f"stopped early after epoch {len(lines)} of 30: the validation figure did not "
              f"improve since epoch {best}; {export} gets epoch {best}'s model")
    assert proc.stderr.count(notice) == 1, proc.stderr
    assert valid[best - 1] == min(valid) < valid[-1], valid
    assert [r["best_epoch"] for r in lines] == [
        int(np.argmin(valid[:i + 1])) + 1 for i in range(len(lines))]
    # The export is the best epoch's model, not the last one.
    train, test, valid_m = mf_data.read_files(noisy["train"], noisy["test"], noisy["valid"])
    w, h = np.load(export / "W.npy"), np.load(export / "H.npy")
    assert _rmse(w, h, valid_m) == pytest.approx(valid[best - 1], rel=1e-4)
    assert _rmse(w, h, test) == pytest.approx(lines[best - 1]["rmse"], rel=1e-4)
    assert not (export / "rows.tsv").exists()  # ids without labels: no label files


def test_a_resumed_run_keeps_its_best_epoch(noisy, tmp_path):
    """--valid with --resume: the best epoch, early stopping and the JSON lines go on as in
    the uninterrupted run (the best epoch was forgotten: best_epoch restarted at the resume,
    and so did the patience); the export says when the best epoch's model is gone."""
    app = [PY, "-m", "adapm.apps.mf", "--train", str(noisy["train"]), "--valid",
           str(noisy["valid"]), "--test", str(noisy["test"]), "--patience", "3", "--reg", "0",
           "--progress", "off", "--json", "-"]
    whole = records(run([*app, "--epochs", "30"]).stdout)
    best = whole[-1]["best_epoch"]
    assert len(whole) == best + 3 < 30
    ckpt, export = str(tmp_path / "ckpt"), tmp_path / "model"
    first = records(run([*app, "--epochs", str(best + 1), "--checkpoint-dir", ckpt]).stdout)
    proc = run([*app, "--epochs", "30", "--checkpoint-dir", ckpt, "--resume", "--export",
                str(export)])
    resumed = records(proc.stdout)
    assert [r["best_epoch"] for r in first + resumed] == [r["best_epoch"] for r in whole]
    assert [r["valid_rmse"] for r in first + resumed] == [r["valid_rmse"] for r in whole]
    assert f"the best epoch ({best}) came before this run resumed" in proc.stderr, proc.stderr
    # The early stop's notice names the epoch the export gets: the last (it named the best)
    last = len(first + resumed)
    assert f"{export} gets epoch {last}'s model" in proc.stderr, proc.stderr
    assert f"gets epoch {best}'s model" not in proc.stderr, proc.stderr
    train, test, valid_m = mf_data.read_files(noisy["train"], noisy["test"], noisy["valid"])
    w, h = np.load(export / "W.npy"), np.load(export / "H.npy")
    assert _rmse(w, h, valid_m) == pytest.approx(resumed[-1]["valid_rmse"], rel=1e-4)



def test_a_resume_with_another_rank_names_the_flag(noisy, tmp_path):
    """The checkpoint's rows are 2 x rank floats: a resume with another --rank is refused in one
    line naming --rank (it asked for "another --model or --dim", KGE's flags)."""
    app = [PY, "-m", "adapm.apps.mf", "--train", str(noisy["train"]), "--test",
           str(noisy["test"]), "--progress", "off", "--checkpoint-dir", str(tmp_path / "ck")]
    run([*app, "--epochs", "1", "--rank", "4"])
    proc = run([*app, "--epochs", "2", "--rank", "5", "--resume"], expect=2)
    assert "value lengths differ from this run's (another --rank?)" in proc.stderr, proc.stderr
    assert "--model" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    # a matrix of another shape: other data (not WV's "--min-count?")
    small = tmp_path / "small.tsv"
    small.write_text("0\t0\t1.0\n400\t300\t2.0\n")  # a larger shape: more keys
    other = [*app[:4], str(small), *app[5:]]
    proc = run([*other, "--epochs", "2", "--rank", "4", "--resume"], expect=2)
    assert "this run's has" in proc.stderr and "(other data)" in proc.stderr, proc.stderr

def _ratings_csv(path, m: mf_data.Matrix, sep=",") -> None:
    """``m`` as a ratings table: userId = 1000 + 7 row, movieId = 3 + 5 col, a timestamp."""
    rows = [f"{1000 + 7 * r}{sep}{3 + 5 * c}{sep}{v:.9g}{sep}{881250949 + i}\n"
            for i, (r, c, v) in enumerate(zip(m.rows.tolist(), m.cols.tolist(),
                                              m.vals.tolist()))]
    path.write_text(f"userId{sep}movieId{sep}rating{sep}timestamp\n" + "".join(rows))


@pytest.mark.parametrize("sep", [",", "\t"])
def test_a_ratings_table_with_a_header(noisy, tmp_path, sep):
    train, test = mf_data.read_pair(noisy["train"], noisy["test"])
    _ratings_csv(tmp_path / "train.csv", train, sep)
    _ratings_csv(tmp_path / "test.csv", test, sep)
    export = tmp_path / "model"
    lines = records(run([PY, "-m", "adapm.apps.mf", "--train", str(tmp_path / "train.csv"),
                         "--test", str(tmp_path / "test.csv"), "--epochs", "3", "--progress",
                         "off", "--json", "-", "--export", str(export)]).stdout)
    assert lines[-1]["rmse"] < lines[0]["rmse"]
    users = np.unique(np.concatenate([train.rows, test.rows]))
    movies = np.unique(np.concatenate([train.cols, test.cols]))
    w, h = np.load(export / "W.npy"), np.load(export / "H.npy")
    assert w.shape == (len(users), 10) and h.shape == (len(movies), 10)
    assert (export / "rows.tsv").read_text() == "".join(
        f"{i}\t{1000 + 7 * u}\n" for i, u in enumerate(users.tolist()))
    assert (export / "cols.tsv").read_text() == "".join(
        f"{i}\t{3 + 5 * c}\n" for i, c in enumerate(movies.tolist()))
    # Row i of W is the user of label rows.tsv[i]: the export predicts the test entries.
    test_rows = np.searchsorted(users, test.rows)
    test_cols = np.searchsorted(movies, test.cols)
    predicted = (w[test_rows] * h[test_cols]).sum(axis=1)
    rmse = float(np.sqrt(np.mean((test.vals.astype(np.float64) - predicted) ** 2)))
    assert rmse == pytest.approx(lines[-1]["rmse"], rel=1e-4)


@pytest.mark.parametrize("train,test,expected", [
    ("userId,movieId,rating\n1,2,4\n2,x,y\n", "userId,movieId,rating\n1,2,4\n",
     "train.csv:3: expected 'row,column,value' (two labels and a finite number)"),
    ("userId,movieId,rating\n1,2,4\n1,2\n", "userId,movieId,rating\n1,2,4\n",
     "train.csv:3: expected"),
    ("userId,movieId,rating\n1,2,4\n", "userId,movieId,rating\n1,2,nan\n",
     "test.csv:2: expected"),
    ("userId,movieId\n1,2\n", "userId,movieId,rating\n1,2,4\n",
     "train.csv:1: a header line needs three fields"),
    ("userId,movieId,rating\n1,2,4\n", "0\t0\t1.5\n",
     "test.csv: not a table (no header line, or MatrixMarket), while"),
    ("196\t242\t3\t881250949\n", "1\t2\t4\t881250950\n",
     "train.csv:1: expected 'row col value' (two integers and a finite number), got "
     "'196\t242\t3\t881250949' (a table with more columns, such as MovieLens' u.data with its "
     "timestamps, needs a header line or --delimiter tab)"),
    ("1,2,4\n2,3,5\n", "1,2,4\n",
     "train.csv:1: expected 'row col value' (two integers and a finite number), got "
     "'1,2,4' (a comma-separated file needs a header line"),
])
def test_bad_ratings_tables_give_a_clear_error(tmp_path, train, test, expected):
    (tmp_path / "train.csv").write_text(train)
    (tmp_path / "test.csv").write_text(test)
    proc = run([PY, "-m", "adapm.apps.mf", "--train", str(tmp_path / "train.csv"), "--test",
                str(tmp_path / "test.csv"), "--epochs", "1", "--progress", "off"], expect=2)
    assert expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
