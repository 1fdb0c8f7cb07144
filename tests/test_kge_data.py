"""KG datasets (load / write / generate) and filtered link-prediction metrics (kge_eval)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm.apps import kge_data, kge_eval
from adapm.apps.kge_data import DataError, KG, generate, load, write
from adapm.apps.kge_eval import FilterIndex, metrics, rank, rank_sums
from adapm.errors import AdaPMError, InvalidArgument

# ------------------------------------------------------------------------------ helpers


def make_dataset(root, train="a\tr\tb\n", valid="a\tr\tb\n", test="b\tr\ta\n", mode="w"):
    """Write the three files (None: leave a file out; bytes: write them raw)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, content in (("train", train), ("valid", valid), ("test", test)):
        if content is None:
            continue
        path = root / f"{name}.txt"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", newline="")
    return root


def named(kg, split):
    """A split as a set of (head name, relation name, tail name)."""
    t = getattr(kg, split)
    e, r = np.array(kg.entities, object), np.array(kg.relations, object)
    return set(zip(e[t[:, 0]], r[t[:, 1]], e[t[:, 2]]))


def keys_of(t, E, R):
    return (t[:, 0] * R + t[:, 1]) * E + t[:, 2]


# --------------------------------------------------------------------------------- load


def test_ids_are_numbered_by_first_appearance_in_train(tmp_path):
    root = make_dataset(tmp_path, train="b\tp\ta\na\tq\tc\nd\tp\tb\n",
                        valid="c\tq\td\n", test="a\tp\ta\n")
    kg = load(root)
    assert kg.entities == ["b", "a", "c", "d"]  # heads before tails on a line
    assert kg.relations == ["p", "q"]
    assert kg.num_entities == 4 and kg.num_relations == 2
    np.testing.assert_array_equal(kg.train, [[0, 0, 1], [1, 1, 2], [3, 0, 0]])
    np.testing.assert_array_equal(kg.valid, [[2, 1, 3]])
    np.testing.assert_array_equal(kg.test, [[1, 0, 1]])
    assert all(getattr(kg, s).dtype == np.int64 for s in kge_data.SPLITS)


def test_crlf_bom_and_missing_final_newline_load(tmp_path):
    root = make_dataset(tmp_path, train=b"\xef\xbb\xbfx y\tlikes\tz\r\nz\tlikes\tx y\r\n",
                        valid=b"z\tlikes\tx y", test=b"x y\tlikes\tz\r")
    kg = load(root)
    assert kg.entities == ["x y", "z"] and kg.relations == ["likes"]
    np.testing.assert_array_equal(kg.test, [[0, 0, 1]])
    np.testing.assert_array_equal(kg.valid, [[1, 0, 0]])


def test_names_are_arbitrary_strings(tmp_path):
    root = make_dataset(tmp_path, train="/m/0ä\t/people/ρ.x\t  spaced  \n",
                        valid="/m/0ä\t/people/ρ.x\t  spaced  \n",
                        test="  spaced  \t/people/ρ.x\t/m/0ä\n")
    kg = load(root)
    assert kg.entities == ["/m/0ä", "  spaced  "]


def test_blank_lines_and_comments_are_skipped(tmp_path):
    """A trailing blank line, blank lines between triples and '#' lines without a tab before
    the first triple (comments) are not triples: skipped (a blank line was an error). A '#'
    line of three fields is a triple whose head starts with '#' (a sorted file puts them
    first), and so is a line of blank names."""
    root = make_dataset(tmp_path, train="# made by hand\n#\n\n#tag\tr\ta\na\tr\tb\n  \n"
                                        "b\tr\ta\n \t \t \n\n\n",
                        valid="a\tr\tb\n\n", test="\nb\tr\ta\n")
    kg = load(root)
    assert kg.entities == ["#tag", "a", "b", " "] and kg.relations == ["r", " "]
    np.testing.assert_array_equal(kg.train, [[0, 0, 1], [1, 0, 2], [2, 0, 1], [3, 1, 3]])
    np.testing.assert_array_equal(kg.valid, [[1, 0, 2]])


def test_triples_naming_what_train_lacks_are_left_out_and_counted(tmp_path):
    """WN18RR's test split names entities its train split lacks: such valid/test triples cannot
    be scored, and are left out and counted, as PyKEEN and LibKGE do (the whole dataset was
    refused); the counts name the first one's line, column and name."""
    root = make_dataset(tmp_path, train="a\tr\tb\nb\tr\ta\n",
                        valid="a\tr\tb\na\tunseen_rel\tb\n\nghost\tr\ta\n",
                        test="# h r t\nb\tr\tnew_one\nb\tr\ta\n")
    kg = load(root)
    np.testing.assert_array_equal(kg.valid, [[0, 0, 1]])
    np.testing.assert_array_equal(kg.test, [[1, 0, 0]])
    assert kg.left_out == {"valid": (2, 2, "relation", "unseen_rel"),
                           "test": (1, 2, "tail", "new_one")}
    assert load(make_dataset(tmp_path / "clean")).left_out == {}


@pytest.mark.parametrize("files, where, words", [
    (dict(train="a\tr\tb\nc\tr\n"), "train.txt:2", ["3 tab-separated columns, got 2", "'c\\tr'"]),
    (dict(train="a\tr\tb\tx\n"), "train.txt:1", ["got 4"]),
    (dict(valid="a\tr\tb\n\na\tr\tb\nc\tr\n"), "valid.txt:4", ["got 2"]),  # after a blank
    (dict(test="# h\tr\tt\n\nb\tr\ta\n#x\tr\tb\n\nb\tr\n"), "test.txt:6", ["got 2"]),
    (dict(train="a\tr\tb\n a r b\n"), "train.txt:2", ["got 1"]),
    (dict(train="a\tr\tb\nc\t\tb\n"), "train.txt:2", ["empty relation"]),
    (dict(test="b\tr\tnew_one\nghost\tr\ta\n"), "test.txt",
     ["none of its 2 triples has its entities and relations in train.txt",
      "line 1: tail 'new_one'"]),
    (dict(train=b"a\tr\tb\na\tr\t\xff\xfe\n"), "train.txt:2", ["UTF-8"]),
    (dict(train="a\tr\tb\n" * 3 + "x" * 500 + "\n"), "train.txt:4", ["got 1", "..."]),
])
def test_bad_lines_name_file_and_line(tmp_path, files, where, words):
    root = make_dataset(tmp_path, **files)
    with pytest.raises(DataError) as info:
        load(root)
    msg = str(info.value)
    assert where in msg, msg
    for w in words:
        assert w in msg, msg
    assert len(msg) < len(str(root)) + 200  # long lines are shortened


@pytest.mark.parametrize("split", kge_data.SPLITS)
@pytest.mark.parametrize("content, words", [(None, "missing file"), ("", "empty file"),
                                            ("\n", "empty file"), ("\r\n", "empty file")])
def test_missing_or_empty_files(tmp_path, split, content, words):
    root = make_dataset(tmp_path, **{split: content})
    with pytest.raises(DataError, match=words) as info:
        load(root)
    assert f"{split}.txt" in str(info.value)


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match="no such dataset directory") as info:
        load(tmp_path / "nope")
    assert "nope" in str(info.value)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="not a directory"):
        load(tmp_path / "file")


def test_data_error_is_value_error():
    assert issubclass(DataError, ValueError)
    assert issubclass(DataError, AdaPMError)


# -------------------------------------------------------------------------------- write


def test_generate_write_load_round_trip(tmp_path):
    kg = generate(3000, seed=3)
    write(kg, tmp_path / "kg")
    back = load(tmp_path / "kg")
    for split in kge_data.SPLITS:
        assert named(back, split) == named(kg, split)
        # generate numbers by first appearance in train, as load does: ids survive too.
        np.testing.assert_array_equal(getattr(back, split), getattr(kg, split))
    assert back.entities == kg.entities and back.relations == kg.relations
    assert (tmp_path / "kg" / "train.txt").read_text().splitlines()[0].count("\t") == 2


def test_write_refuses_what_load_would_refuse(tmp_path):
    t = np.array([[0, 0, 1]], np.int64)
    empty = np.empty((0, 3), np.int64)
    with pytest.raises(InvalidArgument, match="empty"):
        write(KG(["a", "b"], ["r"], t, empty, t), tmp_path)
    with pytest.raises(InvalidArgument, match="tab"):
        write(KG(["a\tx", "b"], ["r"], t, t, t), tmp_path)
    with pytest.raises(InvalidArgument, match="unique"):
        write(KG(["a", "a"], ["r"], t, t, t), tmp_path)
    with pytest.raises(InvalidArgument, match="absent from train"):
        write(KG(["a", "b", "c"], ["r"], t, np.array([[0, 0, 2]]), t), tmp_path)
    assert not (tmp_path / "train.txt").exists()


def test_kg_checks_its_arrays():
    t = np.array([[0, 0, 1]], np.int64)
    with pytest.raises(InvalidArgument, match="outside"):
        KG(["a"], ["r"], t, t, t)
    with pytest.raises(InvalidArgument, match="int64"):
        KG(["a", "b"], ["r"], t.astype(np.int32), t, t)


# ----------------------------------------------------------------------------- generate


def test_generate_is_deterministic_per_seed():
    a, b, c = generate(2000, seed=7), generate(2000, seed=7), generate(2000, seed=8)
    for split in kge_data.SPLITS:
        np.testing.assert_array_equal(getattr(a, split), getattr(b, split))
    assert a.entities == b.entities
    assert named(a, "train") != named(c, "train")


@pytest.mark.parametrize("n", [200, 5000, 60_000])
def test_generate_sizes_and_splits(n):
    kg = generate(n, seed=1)
    E, R = kg.num_entities, kg.num_relations
    n_eval = min(5000, round(0.05 * n))
    assert len(kg.train) == n - 2 * n_eval
    assert 0.9 * n_eval <= len(kg.valid) <= n_eval and 0.9 * n_eval <= len(kg.test) <= n_eval
    assert E <= kge_data.default_num_entities(n) and E >= 0.5 * kge_data.default_num_entities(n)
    assert R == kge_data.default_num_relations(n)
    assert kg.entities[:3] == ["e0", "e1", "e2"] and kg.relations[0] == "r0"
    # No duplicate within or across splits.
    keys = np.concatenate([keys_of(getattr(kg, s), E, R) for s in kge_data.SPLITS])
    assert len(np.unique(keys)) == len(keys)
    # Everything in valid/test was seen in train; train uses every entity and relation.
    seen = np.zeros(E, bool)
    seen[kg.train[:, [0, 2]].ravel()] = True
    assert seen.all()
    assert set(np.unique(kg.train[:, 1])) == set(range(R))
    for s in ("valid", "test"):
        t = getattr(kg, s)
        assert np.isin(t[:, [0, 2]], kg.train[:, [0, 2]]).all()
        assert np.isin(t[:, 1], kg.train[:, 1]).all()
    assert (kg.train[:, 0] != kg.train[:, 2]).all()  # no self loops


def test_generate_overrides():
    kg = generate(3000, num_entities=300, num_relations=9, seed=2, max_eval=40)
    assert kg.num_relations == 9 and kg.num_entities <= 300
    assert len(kg.valid) <= 40 and len(kg.train) == 3000 - 80


def test_generated_degrees_are_zipf_skewed():
    kg = generate(100_000, seed=0)
    deg = np.bincount(kg.train[:, [0, 2]].ravel(), minlength=kg.num_entities)
    top = np.sort(deg)[::-1]
    share = top[: kg.num_entities // 100].sum() / deg.sum()
    assert share > 0.15, share  # the top 1% of entities hold well over 1% of mentions
    assert top[0] > 50 * np.median(deg)


def test_generated_facts_are_inferable_from_train():
    # A rule learned from train alone -- "(h, r, t) comes with (t, inv[r], h)", inv[r] the
    # relation most often seen reversed with r -- finds most held-out facts' partners in train:
    # the inverse / symmetric structure ComplEx learns. A random pairing finds almost none.
    kg = generate(50_000, seed=4)
    E, R = kg.num_entities, kg.num_relations
    train_keys = np.sort(keys_of(kg.train, E, R))
    pair = kg.train[:, 0] * E + kg.train[:, 2]
    order = np.argsort(pair)
    rev = kg.train[:, 2] * E + kg.train[:, 0]
    pos = np.minimum(np.searchsorted(pair[order], rev), len(pair) - 1)
    hit = pair[order][pos] == rev
    counts = np.bincount(kg.train[hit, 1] * R + kg.train[order[pos[hit]], 1],
                         minlength=R * R).reshape(R, R)
    inv = counts.argmax(axis=1)
    for split in ("valid", "test"):
        t = getattr(kg, split)
        partner = np.stack([t[:, 2], inv[t[:, 1]], t[:, 0]], axis=1)
        assert np.isin(keys_of(partner, E, R), train_keys).mean() > 0.75
        noise = np.stack([t[:, 2], inv[t[:, 1]], np.roll(t[:, 0], 1)], axis=1)
        assert np.isin(keys_of(noise, E, R), train_keys).mean() < 0.1


def test_generate_bad_arguments():
    with pytest.raises(InvalidArgument, match="num_triples"):
        generate(10)
    with pytest.raises(InvalidArgument, match="num_triples"):
        generate(1000.0)
    with pytest.raises(InvalidArgument, match="num_relations"):
        generate(1000, num_relations=0)
    with pytest.raises(InvalidArgument, match="inverse_prob"):
        generate(1000, inverse_prob=1.5)
    with pytest.raises(InvalidArgument, match="num_types"):
        generate(1000, num_entities=100, num_types=50)
    with pytest.raises(InvalidArgument, match="distinct triples"):
        generate(20_000, num_entities=10, num_relations=1)


def test_generate_main(tmp_path, capsys):
    out = tmp_path / "kg"
    assert kge_data.generate_main([str(out), "--triples", "1000", "--entities", "80",
                                   "--relations", "8", "--seed", "5"]) == 0
    kg = load(out)
    assert kg.num_relations == 8 and kg.num_entities <= 80
    line = capsys.readouterr().out.strip()
    assert line.count("\n") == 0 and str(out) in line and f"{len(kg.train)} train" in line
    with pytest.raises(SystemExit):
        kge_data.generate_main([str(out), "--triples", "5"])


# ------------------------------------------------------------------------------ kge_eval


def ref_score(model, ent, rel, h, r, t):
    e, R = ent.astype(np.float64), rel.astype(np.float64)
    if model == "distmult":
        return float(np.sum(e[h] * R[r] * e[t]))
    if model == "complex":
        d = e.shape[1] // 2
        hr, hi, rr, ri, tr, ti = e[h, :d], e[h, d:], R[r, :d], R[r, d:], e[t, :d], e[t, d:]
        return float(np.sum(hr * rr * tr + hi * rr * ti + hr * ri * ti - hi * ri * tr))
    d = e.shape[1]
    return float(e[h] @ R[r].reshape(d, d) @ e[t])


def ref_ranks(model, ent, rel, triples, known):
    """Brute force, one triple and one candidate at a time."""
    known = set(map(tuple, known.tolist()))
    E = len(ent)
    tails, heads = [], []
    for h, r, t in triples.tolist():
        for out, make, true in ((tails, lambda e: (h, r, e), t), (heads, lambda e: (e, r, t), h)):
            s = ref_score(model, ent, rel, h, r, t)
            greater = ties = 0
            for e in range(E):
                if e == true or make(e) in known:
                    continue
                se = ref_score(model, ent, rel, *make(e))
                greater += se > s
                ties += se == s
            out.append(1 + greater + ties / 2)
    return np.array(tails + heads)


WIDTHS = {"complex": lambda d: (2 * d, 2 * d), "distmult": lambda d: (d, d),
          "rescal": lambda d: (d, d * d)}


def int_embeddings(rng, model, E, R, d, low=-2, high=3):
    """Small-integer embeddings: every score is exact in float32, so ties are exact."""
    we, wr = WIDTHS[model](d)
    return (rng.integers(low, high, (E, we)).astype(np.float32),
            rng.integers(low, high, (R, wr)).astype(np.float32))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(kge_eval.MODELS),
       E=st.integers(2, 9), R=st.integers(1, 3), d=st.integers(1, 3),
       n_eval=st.integers(1, 6), n_known=st.integers(0, 30), batch=st.integers(1, 7))
def test_rank_matches_brute_force(seed, model, E, R, d, n_eval, n_known, batch):
    rng = np.random.default_rng(seed)
    ent, rel = int_embeddings(rng, model, E, R, d, -1 if seed % 2 else -2, 2)
    triples = np.stack([rng.integers(0, E, n_eval), rng.integers(0, R, n_eval),
                        rng.integers(0, E, n_eval)], axis=1)
    extra = np.stack([rng.integers(0, E, n_known), rng.integers(0, R, n_known),
                      rng.integers(0, E, n_known)], axis=1)
    known = np.concatenate([extra, triples])
    got = rank(model, ent, rel, triples, FilterIndex(known), batch_size=batch)
    np.testing.assert_array_equal(got, ref_ranks(model, ent, rel, triples, known))
    assert got.dtype == np.float64 and got.shape == (2 * n_eval,)


@pytest.mark.parametrize("model", kge_eval.MODELS)
def test_all_equal_scores_rank_in_the_middle(model):
    E, R, d = 11, 2, 3
    we, wr = WIDTHS[model](d)
    ent, rel = np.zeros((E, we), np.float32), np.zeros((R, wr), np.float32)
    triples = np.array([[0, 0, 1], [2, 1, 3], [4, 1, 4]], np.int64)
    # Filter holds the eval triples only: all E candidates tie -> rank 1 + (E - 1) / 2.
    np.testing.assert_array_equal(rank(model, ent, rel, triples, FilterIndex(triples)),
                                  np.full(6, 1 + (E - 1) / 2))
    # Two more true tails of (0, 0, ·) leave E - 2 candidates for that query.
    known = np.concatenate([triples, [[0, 0, 5], [0, 0, 6]]])
    got = rank(model, ent, rel, triples, FilterIndex(known))
    assert got[0] == 1 + (E - 3) / 2 and got[1] == 1 + (E - 1) / 2
    np.testing.assert_array_equal(got, ref_ranks(model, ent, rel, triples, known))


def test_filtering_removes_better_known_answers():
    # distmult, d = 1: score(h, r, t) = ent[h] * rel[r] * ent[t]; entity 2 beats the true tail 1.
    ent = np.array([[1.0], [2.0], [3.0], [0.5]], np.float32)
    rel = np.array([[1.0]], np.float32)
    triple = np.array([[0, 0, 1]])
    unfiltered = rank("distmult", ent, rel, triple, FilterIndex(triple))
    filtered = rank("distmult", ent, rel, triple, FilterIndex(np.array([[0, 0, 1], [0, 0, 2]])))
    assert unfiltered[0] == 2 and filtered[0] == 1
    # Head query (·, 0, 1): entity 2 also scores higher than head 0, and (2, 0, 1) is unknown.
    assert unfiltered[1] == 3 and filtered[1] == 3
    # A true triple under another relation does not filter this one.
    other = np.array([[0, 0, 1], [0, 1, 2]])
    rel2 = np.array([[1.0], [1.0]], np.float32)
    assert rank("distmult", ent, rel2, triple, FilterIndex(other))[0] == 2


def test_complex_is_asymmetric_and_matches_formula():
    rng = np.random.default_rng(0)
    ent = rng.standard_normal((6, 4)).astype(np.float32)
    rel = rng.standard_normal((2, 4)).astype(np.float32)
    d = 2
    h = ent[:, :d] + 1j * ent[:, d:]
    r = rel[:, :d] + 1j * rel[:, d:]
    truth = np.real(np.einsum("hd,rd,td->hrt", h, r, np.conj(h)))
    assert not np.allclose(truth, truth.transpose(2, 1, 0))
    for (a, b, c) in [(0, 1, 2), (3, 0, 5)]:
        assert ref_score("complex", ent, rel, a, b, c) == pytest.approx(truth[a, b, c], rel=1e-5)
    # Large random triples: rank must agree with a float64 ranking by that formula.
    triples = np.array([[0, 1, 2], [3, 0, 5]])
    got = rank("complex", ent, rel, triples, FilterIndex(triples))
    want_tail = [1 + (truth[0, 1] > truth[0, 1, 2]).sum(), 1 + (truth[3, 0] > truth[3, 0, 5]).sum()]
    want_head = [1 + (truth[:, 1, 2] > truth[0, 1, 2]).sum(),
                 1 + (truth[:, 0, 5] > truth[3, 0, 5]).sum()]
    np.testing.assert_array_equal(got, want_tail + want_head)


def test_default_batch_size_and_rank_bounds():
    rng = np.random.default_rng(1)
    kg = generate(2000, seed=1)
    ent, rel = int_embeddings(rng, "complex", kg.num_entities, kg.num_relations, 4)
    known = np.concatenate([kg.train, kg.valid, kg.test])
    fi = FilterIndex(known)
    a = rank("complex", ent, rel, kg.valid, fi)
    b = rank("complex", ent, rel, kg.valid, fi, batch_size=7)
    np.testing.assert_array_equal(a, b)
    assert (a >= 1).all() and (a <= kg.num_entities).all()
    # A node with no eval triples contributes nothing.
    none = rank("complex", ent, rel, np.empty((0, 3), np.int64), fi)
    assert none.shape == (0,)
    np.testing.assert_array_equal(rank_sums(none), np.zeros(6))


def test_filter_index_lookups():
    known = np.array([[0, 0, 1], [0, 0, 2], [0, 0, 2], [0, 1, 3], [4, 0, 2], [5, 0, 2]])
    fi = FilterIndex(known)
    rows, ents = fi.tails(np.array([0, 0, 4, 9]), np.array([0, 1, 0, 0]))
    assert sorted(zip(rows.tolist(), ents.tolist())) == [(0, 1), (0, 2), (1, 3), (2, 2)]
    rows, ents = fi.heads(np.array([0, 7, 1]), np.array([2, 2, 3]))
    assert sorted(zip(rows.tolist(), ents.tolist())) == [(0, 0), (0, 4), (0, 5), (2, 0)]
    rows, ents = FilterIndex(np.empty((0, 3), np.int64)).tails(np.array([0]), np.array([0]))
    assert len(rows) == 0 and len(ents) == 0


def test_rank_bad_arguments():
    ent, rel = np.zeros((3, 4), np.float32), np.zeros((2, 4), np.float32)
    fi = FilterIndex(np.array([[0, 0, 1]]))
    t = np.array([[0, 0, 1]])
    with pytest.raises(InvalidArgument, match="model"):
        rank("transe", ent, rel, t, fi)
    with pytest.raises(InvalidArgument, match="rescal"):
        rank("rescal", ent, rel, t, fi)
    with pytest.raises(InvalidArgument, match="even"):
        rank("complex", np.zeros((3, 3), np.float32), np.zeros((2, 3), np.float32), t, fi)
    with pytest.raises(InvalidArgument, match="outside"):
        rank("distmult", ent, rel, np.array([[0, 2, 1]]), fi)
    with pytest.raises(InvalidArgument, match="NaN"):
        rank("distmult", np.full((3, 4), np.nan, np.float32), rel, t, fi)
    with pytest.raises(InvalidArgument, match="shape"):
        rank("distmult", ent, rel, np.array([0, 0, 1]), fi)
    with pytest.raises(InvalidArgument, match=">= 0"):
        FilterIndex(np.array([[0, -1, 1]]))


def test_rank_sums_and_metrics_by_hand():
    ranks = np.array([1.0, 2.0, 4.0, 10.0, 11.5, 1.5])
    sums = rank_sums(ranks)
    inv = 1 + 1 / 2 + 1 / 4 + 1 / 10 + 1 / 11.5 + 1 / 1.5
    np.testing.assert_allclose(sums, [6, inv, 30.0, 1, 3, 5])
    m = metrics(sums)
    assert set(m) == {"mrr", "mr", "hits@1", "hits@3", "hits@10"}
    assert m["mrr"] == pytest.approx(inv / 6) and m["mr"] == 5.0
    assert m["hits@1"] == pytest.approx(1 / 6) and m["hits@3"] == 0.5
    assert m["hits@10"] == pytest.approx(5 / 6)
    # Additive: sums of parts are the sums of the whole.
    np.testing.assert_allclose(rank_sums(ranks[:2]) + rank_sums(ranks[2:]), sums)
    with pytest.raises(InvalidArgument):
        metrics(rank_sums(np.empty(0)))
    with pytest.raises(InvalidArgument):
        rank_sums(np.array([0.5]))
