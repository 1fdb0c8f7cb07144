"""The word-vector app end to end, as a user runs it: the CLI on one node, under adapm-run on two
real node processes, and with --baseline; its JSON lines, its export (read back by a plain parser
of the word2vec formats, which recomputes the app's analogy accuracy) and its errors on bad files
and flags."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from adapm.apps import wv_data, wv_eval

from app_cli import LAUNCHER, PY, records, run

SENTENCES = 20_000
EPOCHS = 10
TRAIN_FLAGS = ["--dim", "32", "--epochs", str(EPOCHS), "--progress", "off", "--min-count", "3",
               "--json", "-"]
DOCUMENTED = {"epoch", "train_seconds", "points_per_s", "words", "words_per_s", "loss",
              "analogy", "analogy_questions", "similarity", "stats"}




@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("wv")
    run([PY, "-m", "adapm.apps.wv", "generate", str(out), "--sentences", str(SENTENCES),
         "--seed", "1"])
    return {"dir": out, "corpus": out / "corpus.txt", "analogies": out / "questions-words.txt",
            "similarity": out / "similarity.txt"}


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """One node, two nodes and the baseline, trained once for all the tests below."""
    out = tmp_path_factory.mktemp("runs")
    app = [PY, "-m", "adapm.apps.wv", "--corpus", str(data["corpus"]), "--analogies",
           str(data["analogies"]), "--similarity", str(data["similarity"]), *TRAIN_FLAGS]
    single = run([*app, "--workers", "2", "--export", str(out / "one"), "--json",
                  str(out / "one.jsonl")])
    two = run([*LAUNCHER, "-n", "2", *app, "--export", str(out / "two")])
    base = run([*app, "--baseline", "--workers", "2"])
    one1 = run([*app, "--workers", "1"])
    base1 = run([*app, "--baseline", "--workers", "1"])
    return {"one": records((out / "one.jsonl").read_text()), "two": records(two.stdout),
            "baseline": records(base.stdout), "one1": records(one1.stdout),
            "baseline1": records(base1.stdout), "dir": out,
            "one_stdout": single.stdout}


def test_every_epoch_has_one_json_line_with_every_field(trained):
    for name in ("one", "two", "baseline"):
        lines = trained[name]
        assert [r["epoch"] for r in lines] == list(range(1, EPOCHS + 1)), name
        for r in lines:
            assert DOCUMENTED <= set(r), (name, DOCUMENTED - set(r))
            assert r["train_seconds"] > 0 and math.isfinite(r["loss"])
            assert r["words"] > SENTENCES * 8  # every sentence has >= 8 tokens
            assert r["words_per_s"] == pytest.approx(r["words"] / r["train_seconds"], rel=0.01)
    # With --json FILE, stdout has the summary lines only.
    assert [line.split(":")[0] for line in trained["one_stdout"].splitlines()] == \
        [f"epoch {e}" for e in range(1, EPOCHS + 1)], trained["one_stdout"]
    assert len(trained["two"][0]["stats"]) == 2  # every node's stats
    for node_stats in trained["two"][-1]["stats"]:
        assert node_stats["local_pull_keys"] > 0
        assert node_stats["sampled_keys"] > 0
        # The default naive sampling signals each batch's draws as intent with its other keys,
        # a batch pulls them when they are local (0 remote draws in every run measured); the
        # local scheme's "never remote" is tests/test_sampling.py's.
        assert node_stats["sampled_remote_keys"] <= 0.001 * node_stats["sampled_keys"]


def test_quality_far_above_chance_and_close_to_the_baseline(trained):
    # Chance: one right answer among ~2,000 words.
    for name in ("one", "two", "baseline"):
        last = trained[name][-1]
        assert last["analogy"] > 0.5, (name, last["analogy"])
        assert last["similarity"] > 0.5, (name, last["similarity"])
        assert last["analogy_questions"] == 2400
    # Two racing threads land on one of two levels, ~0.90 or ~0.98, over six runs of the same
    # command, the baseline as the PM on one node (with one thread both compute exactly the
    # same: test_one_worker_computes_what_the_baseline_computes). Two nodes draw negatives
    # from the whole distribution, as the baseline (naive sampling, the default).
    base = trained["baseline"][-1]
    for name, tolerance in (("one", 0.15), ("two", 0.15)):
        last = trained[name][-1]
        assert abs(last["analogy"] - base["analogy"]) < tolerance, (name, last, base)
        assert abs(last["similarity"] - base["similarity"]) < 0.1, (name, last, base)
    # Training lowers the loss.
    for name in ("one", "two", "baseline"):
        assert trained[name][-1]["loss"] < trained[name][0]["loss"]


def test_one_worker_computes_what_the_baseline_computes(trained):
    # The same sentences, order, subsampling, windows and negatives (the baseline draws from
    # the same streams, in the same order, as the PM's naive sampling, which draws a batch's
    # negatives when it signals the batch's intent): the same model.
    for ours, theirs in zip(trained["one1"], trained["baseline1"]):
        for field in ("loss", "analogy", "similarity", "words"):
            assert ours[field] == theirs[field], (field, ours[field], theirs[field])


def _read_text_format(path: Path) -> tuple[list[str], np.ndarray]:
    """A plain parser of word2vec's text format (no adapm, no gensim)."""
    lines = path.read_bytes().split(b"\n")
    count, dim = (int(x) for x in lines[0].split())
    words, rows = [], []
    for line in lines[1:1 + count]:
        fields = line.split(b" ")
        words.append(fields[0].decode())
        rows.append([float(x) for x in fields[1:]])
    assert all(len(r) == dim for r in rows)
    return words, np.array(rows, dtype=np.float32)


def _read_binary_format(path: Path) -> tuple[list[str], np.ndarray]:
    data = path.read_bytes()
    header_end = data.index(b"\n")
    count, dim = (int(x) for x in data[:header_end].split())
    at, words, rows = header_end + 1, [], []
    for _ in range(count):
        space = data.index(b" ", at)
        words.append(data[at:space].decode())
        rows.append(np.frombuffer(data, dtype="<f4", count=dim, offset=space + 1))
        at = space + 1 + 4 * dim
        assert data[at:at + 1] == b"\n"
        at += 1
    assert at == len(data)
    return words, np.array(rows)


@pytest.mark.parametrize("run_name", ["one", "two"])
def test_the_export_reproduces_the_accuracy(trained, data, run_name):
    export = trained["dir"] / run_name
    words, vectors = _read_text_format(export / "vectors.txt")
    bwords, bvectors = _read_binary_format(export / "vectors.bin")
    assert bwords == words
    np.testing.assert_allclose(vectors, bvectors, rtol=1e-6, atol=1e-7)
    questions = [q for _, qs in wv_data.read_analogies(data["analogies"]) for q in qs]
    right, answered = wv_eval.analogy_counts(bvectors, bwords, questions)
    assert right / answered == pytest.approx(trained[run_name][-1]["analogy"], abs=1e-9)
    # The vocabulary is the corpus's, most frequent first.
    corpus = wv_data.read_corpus(data["corpus"], min_count=3)
    assert words == corpus.words


def test_gensim_reads_the_export(trained):
    import gensim  # a dev dependency: this test must run, not skip
    export = trained["dir"] / "one"
    text = gensim.models.KeyedVectors.load_word2vec_format(str(export / "vectors.txt"))
    binary = gensim.models.KeyedVectors.load_word2vec_format(str(export / "vectors.bin"),
                                                             binary=True)
    words, vectors = _read_binary_format(export / "vectors.bin")
    assert list(binary.index_to_key) == words == list(text.index_to_key)
    np.testing.assert_array_equal(binary.vectors, vectors)




def test_a_corpus_in_another_encoding_exports_its_bytes_and_says_so(tmp_path):
    """A Latin-1 corpus: its words are exported as its bytes (gensim's default UTF-8 reading
    failed with a UnicodeDecodeError, and nothing said why); a line on stderr says so and how
    gensim reads them, and that way gensim gets the words back."""
    import gensim  # a dev dependency
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(("café naïve Zürich plain " * 10 + "\n").encode("latin-1") * 200)
    proc = run([PY, "-m", "adapm.apps.wv", "--corpus", str(corpus), "--dim", "8", "--epochs",
                "1", "--progress", "off", "--export", str(tmp_path / "ex")])
    assert "3 of 4 words are not UTF-8" in proc.stderr, proc.stderr
    assert "encoding='latin-1'" in proc.stderr
    kv = gensim.models.KeyedVectors.load_word2vec_format(str(tmp_path / "ex" / "vectors.bin"),
                                                         binary=True, encoding="latin-1")
    assert sorted(kv.index_to_key) == sorted(["café", "naïve", "Zürich", "plain"])
    # a corpus of both encodings: latin-1 would garble its UTF-8 words, so not that advice
    corpus.write_bytes(("café plain " * 10 + "\n").encode("latin-1") * 100
                       + ("über plain " * 10 + "\n").encode("utf-8") * 100)
    proc = run([PY, "-m", "adapm.apps.wv", "--corpus", str(corpus), "--dim", "8", "--epochs",
                "1", "--progress", "off", "--export", str(tmp_path / "ex2")])
    assert "1 of 3 words are not UTF-8" in proc.stderr, proc.stderr
    assert "unicode_errors='replace' (the other 1 non-ASCII words are UTF-8" in proc.stderr

@pytest.mark.parametrize("optimizer,half_width", [("sgd", 1.0), ("adagrad", 0.5)])
def test_initial_vectors_as_gensim_draws_them(data, optimizer, half_width):
    """With SGD (the default) the input vectors start as gensim 4's, uniform in [-1, 1) / dim
    (word2vec.c's half as wide learned less in the same epochs, docs/quality.md); AdaGrad keeps
    the original AdaPM app's [-0.5, 0.5) / dim; output vectors start at zero either way."""
    import argparse

    import gensim  # a dev dependency
    from adapm.apps import wv
    dim = 50
    corpus = wv_data.read_corpus(str(data["corpus"]), min_count=3)
    task = wv.WVTask(corpus, argparse.Namespace(
        dim=dim, window=5, neg=5, lr=0.025, seed=1, sample=1e-3, optimizer=optimizer,
        replica_updates="sum", sampling="naive", analogy_questions=None, similarity_pairs=None))
    V = task.vocab_size
    rows = task.init_rows(np.arange(2 * V, dtype=np.int64)).reshape(2 * V, -1)
    ours, outputs = rows[:V, :dim], rows[V:, :dim]
    assert not outputs.any()
    # gensim's own draw for as many words (its vocabulary built, nothing trained)
    model = gensim.models.Word2Vec(vector_size=dim, min_count=1, seed=1)
    model.build_vocab([[f"w{i}" for i in range(V)]])
    theirs = model.wv.vectors * half_width  # gensim's width is 1
    assert np.abs(ours).max() < half_width / dim
    assert np.abs(ours).max() > 0.99 * half_width / dim
    assert ours.std() == pytest.approx(theirs.std(), rel=0.02)
    assert abs(ours.mean()) < 0.02 * half_width / dim


def _app(*args) -> list[str]:
    return [PY, "-m", "adapm.apps.wv", *args, "--epochs", "1", "--progress", "off"]


@pytest.mark.parametrize("content,expected", [
    (b"", ": the corpus holds no tokens"),
    (b"  \n\t\n", ": the corpus holds no tokens"),
    (b"a b\nc \x00 d\n", ":2: a NUL byte"),
    (b"a b c\n", ": no word occurs min_count=5 times"),
])
def test_bad_corpus_gives_a_clear_error(tmp_path, content, expected):
    """FILE:LINE: message (as KGE's and MF's), one line, exit 2, nothing trained."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(content)
    proc = run(_app("--corpus", str(corpus)), expect=2)
    assert f"{corpus}{expected}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


@pytest.mark.parametrize("flag,content,expected", [
    ("--analogies", ": s\na b c\n", ":2: expected 4 words"),
    ("--analogies", "a b c d\n", ":1: a question before the first"),
    ("--similarity", "# c\na b x\n", ":2: expected 'word1 word2 score'"),
    ("--similarity", "a b nan\n", ":1: expected 'word1 word2 score'"),
])
def test_bad_evaluation_files_give_a_clear_error(tmp_path, data, flag, content, expected):
    path = tmp_path / "eval.txt"
    path.write_text(content)
    proc = run(_app("--corpus", str(data["corpus"]), flag, str(path)), expect=2)
    assert f"{path}{expected}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_missing_corpus(tmp_path):
    proc = run(_app("--corpus", str(tmp_path / "nope.txt")), expect=2)
    assert "nope.txt: cannot open the corpus" in proc.stderr


def test_adagrad_as_the_original_app(data, trained):
    # --optimizer adagrad: the PM on one node with one worker computes what the baseline
    # computes, it learns, and it is another model than the default SGD's.
    app = [PY, "-m", "adapm.apps.wv", "--corpus", str(data["corpus"]), "--analogies",
           str(data["analogies"]), "--similarity", str(data["similarity"]), *TRAIN_FLAGS,
           "--optimizer", "adagrad", "--workers", "1"]
    one = records(run(app).stdout)
    base = records(run([*app, "--baseline"]).stdout)
    for ours, theirs in zip(one, base):
        for field in ("loss", "analogy", "similarity", "words"):
            assert ours[field] == theirs[field], (field, ours[field], theirs[field])
    assert one[-1]["analogy"] > 0.5 and one[-1]["loss"] < one[0]["loss"]
    assert [r["loss"] for r in one] != [r["loss"] for r in trained["one1"]]


@pytest.mark.parametrize("flags,expected", [
    (["--optimizer", "adam"], "--optimizer: invalid choice"),
    (["--dim", "0"], "--dim: must be an integer >= 1"),
    (["--window", "-1"], "--window: must be an integer >= 1"),
    (["--sample", "nan"], "--sample: must be a finite number >= 0"),
])
def test_bad_flags_are_usage_errors(data, flags, expected):
    proc = run(_app("--corpus", str(data["corpus"]), *flags), expect=2)
    assert expected in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "usage:" not in proc.stderr, proc.stderr  # one line


@pytest.mark.parametrize("sgd,world_size,expected", [
    (True, 1, "sum"), (True, 2, "sum"), (True, 4, "sum"), (True, 5, "average"),
    (True, 8, "average"), (False, 2, "sum"), (False, 8, "sum"),
])
def test_replica_updates_default_sums_up_to_4_nodes_and_averages_sgd_beyond(
        sgd, world_size, expected):
    # docs/quality.md, "replica updates": summed, SGD learned the most per epoch on 2 and 4
    # nodes and diverged on 8; averaged it is stable on 8 but lags on 2 and 4.
    from adapm.apps import wv

    assert wv.default_replica_updates(sgd, world_size) == expected


def test_replica_updates_default_follows_the_launchers_world_size(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from adapm.apps import wv

    path = tmp_path / "corpus.txt"
    path.write_text("the cat sat on the mat\nthe dog sat on the cat\n")
    corpus = wv_data.read_corpus(path, min_count=1)
    opts = SimpleNamespace(dim=4, window=2, neg=1, lr=0.025, seed=0, sample=0.0,
                           analogy_questions=None, similarity_pairs=None)
    monkeypatch.setenv("ADAPM_RENDEZVOUS", "127.0.0.1:1")  # read, never dialled here
    monkeypatch.setenv("ADAPM_RANK", "0")
    seen = {}
    for size, optimizer, flag in ((2, "sgd", None), (8, "sgd", None), (8, "adagrad", None),
                                  (8, "sgd", "sum"), (2, "sgd", "average")):
        monkeypatch.setenv("ADAPM_WORLD_SIZE", str(size))
        task = wv.WVTask(corpus, SimpleNamespace(**vars(opts), optimizer=optimizer,
                                                 replica_updates=flag))
        seen[size, optimizer, flag] = task.replica_updates
    assert seen == {(2, "sgd", None): "sum", (8, "sgd", None): "average",
                    (8, "adagrad", None): "sum", (8, "sgd", "sum"): "sum",
                    (2, "sgd", "average"): "average"}
