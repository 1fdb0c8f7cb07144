"""Checkpoint and restore (Node.checkpoint, adapm.init(restore=...), adapm.checkpoint).

A checkpoint written by 3 real node processes while keys are relocated and replicated (intents
active) holds every key's value exactly once; restoring it on 1 and on 2 nodes gives the very
same bits, and training goes on after the checkpoint with exact sums. A checkpoint process
killed at any step leaves a complete checkpoint to load; mismatched jobs and damaged files give
errors that name the path and the difference.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from app_cli import ENV, LAUNCHER, PY, records
from app_cli import run as app_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adapm
from adapm import checkpoint as ckpt
from adapm._store import OWNER, REPLICA
from adapm.testing import run_cluster

FAST = {"connect_timeout_s": 20, "request_timeout_s": 20}
NUM_KEYS = 48
UNIFORM = 3
PER_KEY = (np.arange(NUM_KEYS) % 4 + 1).astype(np.int64)  # 1..4 floats per key
# Intents that stay active while the checkpoint is written (clocks [1, 1000)): keys wanted by
# one node only are relocated to it, keys wanted by two or more are replicated.
INTENTS = {0: np.arange(0, 16), 1: np.arange(10, 26), 2: np.r_[np.arange(22, 34), 3]}
PUSH_ROUNDS = 3


def cluster(fn, world_size, *, args=(), timeout_s=90, restore=None, **config):
    return run_cluster(fn, world_size, args=args, timeout_s=timeout_s, restore=restore,
                       config={**FAST, **config})


def lengths_of(value_length) -> np.ndarray:
    return np.broadcast_to(np.asarray(value_length, dtype=np.int64), (NUM_KEYS,))


def initial(value_length) -> np.ndarray:
    """Every key's first value, packed: eighths, so that sums of small integers stay exact."""
    total = int(lengths_of(value_length).sum())
    return (((np.arange(total) * 37) % 101 - 50) / 8).astype(np.float32)


REMOTE_KEY = NUM_KEYS - 1  # nobody signals intent for it: every rank pushes to it remotely


def expected_after_pushes(value_length) -> np.ndarray:
    """The initial values plus what :func:`_train_job` pushes before its checkpoint."""
    per_key = np.zeros(NUM_KEYS, dtype=np.float32)
    for rank, keys in INTENTS.items():
        per_key[keys] += PUSH_ROUNDS * (rank + 1)
    per_key[REMOTE_KEY] += PUSH_ROUNDS * len(INTENTS)
    return initial(value_length) + np.repeat(per_key, lengths_of(value_length))


def as_rows(flat: np.ndarray, value_length):
    """What push/set take for these keys: (n, L) for a uniform length, flat otherwise."""
    return flat.reshape(-1, value_length) if isinstance(value_length, int) else flat


def ones(keys, value_length, scale=1.0) -> np.ndarray:
    return np.full(int(lengths_of(value_length)[keys].sum()), scale, dtype=np.float32)


def _train_job(node, path, value_length):
    """Initial values, pushes under active intents (relocations and replicas), a checkpoint
    while the intents are still active, then one more push of 1 to every key by every rank."""
    w = node.worker()
    keys = np.arange(NUM_KEYS)
    home = keys[keys % node.world_size == node.rank]
    values = initial(value_length)
    starts = np.cumsum(lengths_of(value_length)) - lengths_of(value_length)
    mine = np.concatenate([values[s:s + n] for s, n in
                           zip(starts[home], lengths_of(value_length)[home])])
    w.set(home, as_rows(mine, value_length))
    w.wait()
    node.barrier()
    wanted = INTENTS[node.rank]
    w.intent(wanted, 1, 1000)
    w.advance_clock()
    w.wait_sync()
    node.barrier()  # every node's keys arrived
    for _ in range(PUSH_ROUNDS):
        w.push(wanted, as_rows(ones(wanted, value_length, node.rank + 1), value_length))
        w.push([REMOTE_KEY], as_rows(ones([REMOTE_KEY], value_length), value_length))
        w.advance_clock()
    state = node.store.snapshot()["state"]
    seen = {"replicas": int((state == REPLICA).sum()),
            "relocated_in": int(node.stats()["relocations_in"]),
            "owned": np.flatnonzero(state == OWNER).tolist()}
    node.checkpoint(path, meta={"written_by": node.world_size})
    w.push(keys, as_rows(ones(keys, value_length), value_length))
    w.wait_sync()
    node.barrier()
    seen["after"] = w.pull(keys).reshape(-1)
    return seen


def _pull_job(node, value_length):
    """Every key's value as this node reads it, packed; and which keys it holds."""
    return node.worker().pull(np.arange(NUM_KEYS)).reshape(-1), node.local_keys().tolist()


def _restore_and_checkpoint_again_job(node, value_length, path):
    """Pull everything after a restore, then checkpoint again, where rank 1's first shard misses
    a key, as if it were still on its way to it (the shards must be written again)."""
    pulled = _pull_job(node, value_length)
    calls = []
    if node.rank == 1:
        from adapm._store import Store

        original = Store.owned_keys

        def owned_keys(store):
            calls.append(1)
            keys = original(store)
            return keys[1:] if len(calls) == 1 else keys

        Store.owned_keys = owned_keys
    node.checkpoint(path)
    return pulled, len(calls)


@pytest.fixture(scope="module", params=["uniform", "per_key"])
def written(request, tmp_path_factory):
    """A checkpoint written by 3 nodes under the adaptive variant, and what they saw."""
    value_length = UNIFORM if request.param == "uniform" else PER_KEY
    path = tmp_path_factory.mktemp(request.param) / "ckpt"
    seen = cluster(_train_job, 3, args=(str(path), value_length), num_keys=NUM_KEYS,
                   value_length=value_length, management="adaptive")
    return {"path": path, "value_length": value_length, "seen": seen}


def test_the_scenario_relocates_and_replicates_while_it_checkpoints(written):
    seen = written["seen"]
    assert sum(s["replicas"] for s in seen) > 0
    assert sum(s["relocated_in"] for s in seen) > 0
    owners = np.zeros(NUM_KEYS, dtype=int)
    for s in seen:
        owners[s["owned"]] += 1
    assert np.all(owners == 1)


def test_every_key_once_with_a_manifest(written):
    path, value_length = written["path"], written["value_length"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format_version"] == ckpt.FORMAT_VERSION
    assert manifest["num_keys"] == NUM_KEYS and manifest["world_size"] == 3
    assert manifest["num_shards"] == 3 and manifest["meta"] == {"written_by": 3}
    keys = np.concatenate([np.load(path / s["keys"]) for s in manifest["shards"]])
    np.testing.assert_array_equal(np.sort(keys), np.arange(NUM_KEYS))
    # The files are plain .npy: the values of a shard are its keys' values back to back.
    lengths = lengths_of(value_length)
    expected = expected_after_pushes(value_length)
    starts = np.cumsum(lengths) - lengths
    for shard in manifest["shards"]:
        shard_keys = np.load(path / shard["keys"])
        values = np.load(path / shard["values"])
        want = np.concatenate([expected[starts[k]:starts[k] + lengths[k]] for k in shard_keys]
                              ) if len(shard_keys) else np.empty(0, np.float32)
        np.testing.assert_array_equal(values, want)
    assert not Path(str(path) + ckpt.PARTIAL_SUFFIX).exists()
    assert not Path(str(path) + ckpt.PREVIOUS_SUFFIX).exists()


def test_training_goes_on_after_the_checkpoint(written):
    expected = expected_after_pushes(written["value_length"]) + 3  # one more 1 from each rank
    for s in written["seen"]:
        np.testing.assert_array_equal(s["after"], expected)


def test_restore_on_one_process_without_launcher(written, no_launcher):
    value_length = written["value_length"]
    with adapm.init(restore=written["path"]) as node:
        assert node.world_size == 1 and node.config.num_keys == NUM_KEYS
        values = node.worker().pull(np.arange(NUM_KEYS)).reshape(-1)
    np.testing.assert_array_equal(values, expected_after_pushes(value_length))
    assert adapm.checkpoint_meta(written["path"]) == {"written_by": 3}


def test_restore_on_two_nodes_and_checkpoint_again_with_a_retry(written, tmp_path):
    value_length, again = written["value_length"], tmp_path / "again"
    results = cluster(_restore_and_checkpoint_again_job, 2, args=(value_length, str(again)),
                      restore=str(written["path"]), num_keys=NUM_KEYS,
                      value_length=value_length)
    expected = expected_after_pushes(value_length)
    assert results[1][1] >= 2  # rank 1 wrote its shard again
    for rank, ((values, held), _) in enumerate(results):
        np.testing.assert_array_equal(values, expected)
        assert held == list(range(rank, NUM_KEYS, 2))  # home keys, wherever they were before
    restored = ckpt.load(again)
    assert restored.world_size == 2
    np.testing.assert_array_equal(restored.read(np.arange(NUM_KEYS)), expected)


def test_restore_under_full_replication_fills_the_replicas(written):
    value_length = written["value_length"]
    results = cluster(_pull_job, 2, args=(value_length,), restore=str(written["path"]),
                      num_keys=NUM_KEYS, value_length=value_length,
                      management="full_replication")
    for values, held in results:
        assert held == list(range(NUM_KEYS))  # every key local: the replicas hold it too
        np.testing.assert_array_equal(values, expected_after_pushes(value_length))


def _failing_job(node, path):
    """A checkpoint, then one whose shard rank 1 cannot write, then one whose directory rank 0
    cannot prepare, then another that works: every node raises at the failures (none waits
    for a timeout), and the node goes on each time."""
    from adapm import checkpoint as files

    w = node.worker()
    w.push([node.rank], [[1.0]])
    node.checkpoint(path)
    errors = []
    for who, method in ((1, "write_shard"), (0, "prepare")):
        original = getattr(files.ShardWriter, method)
        if node.rank == who:
            def fail(self, *args, method=method):
                raise OSError(f"{method}: no space left on device")

            setattr(files.ShardWriter, method, fail)
        w.push([node.rank], [[1.0]])
        try:
            node.checkpoint(path)
        except adapm.CheckpointError as exc:
            errors.append(str(exc))
        setattr(files.ShardWriter, method, original)
        node.barrier()
    w.push([node.rank], [[1.0]])
    node.checkpoint(path)
    return errors


def test_a_node_that_cannot_write_fails_the_checkpoint_on_every_node(tmp_path):
    path = tmp_path / "ckpt"
    results = cluster(_failing_job, 2, args=(str(path),), num_keys=4, request_timeout_s=60,
                      connect_timeout_s=60, timeout_s=60)
    for errors in results:
        assert len(errors) == 2
        assert "write_shard: no space left" in errors[0] and "previous one is left" in errors[0]
        assert "cannot prepare" in errors[1] or "no verdict" in errors[1]
    np.testing.assert_array_equal(ckpt.load(path).read(np.arange(4)), [4, 4, 0, 0])
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_directory_that_cannot_be_made_is_named_as_the_cause(tmp_path, no_launcher):
    """A checkpoint under a file: rank 0 says it cannot make the directory (it said it found
    no verdict of its own, and to see rank 0's error, which was itself)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with adapm.init(num_keys=4) as node:
        with pytest.raises(adapm.CheckpointError) as info:
            node.checkpoint(str(blocker / "ckpt"))
        assert "cannot prepare" in str(info.value) and "Not a directory" in str(info.value)
        assert "no verdict" not in str(info.value)
        node.checkpoint(str(tmp_path / "ckpt"))  # the node goes on
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "file"]


# --- a checkpoint killed at any step leaves one to load ----------------------------------------

# Run as a separate process: a node writes values of 2.0 over the checkpoint at argv[1] and
# dies (os._exit) at the step named by argv[2].
_CRASHING = """
import os, sys
import numpy as np
import adapm
from adapm import checkpoint as ckpt

path, step = sys.argv[1], sys.argv[2]
node = adapm.init(num_keys=20, value_length=2)
node.worker().set(np.arange(20), np.full((20, 2), 2.0, np.float32))
if step == "after_the_shard":
    write_shard = ckpt.ShardWriter.write_shard

    def crash_after(self, *args):
        write_shard(self, *args)
        os._exit(3)

    ckpt.ShardWriter.write_shard = crash_after
elif step == "between_the_renames":
    rename = os.rename

    def crash_after(src, dst):
        rename(src, dst)
        if dst.endswith(ckpt.PREVIOUS_SUFFIX):
            os._exit(3)

    ckpt.os.rename = crash_after
elif step == "before_removing_the_old_one":
    def crash(*args, **kwargs):
        os._exit(3)

    ckpt.shutil.rmtree = crash
node.checkpoint(path)
os._exit(4)  # the step was never reached
"""


def _checkpoint_of(path, value: float) -> None:
    with adapm.init(num_keys=20, value_length=2) as node:
        node.worker().set(np.arange(20), np.full((20, 2), value, np.float32))
        node.checkpoint(path)


def _restored_values(path) -> np.ndarray:
    with adapm.init(restore=path) as node:
        return node.worker().pull(np.arange(20))


@pytest.mark.parametrize("step, survivor", [("after_the_shard", 1.0),
                                            ("between_the_renames", 1.0),
                                            ("before_removing_the_old_one", 2.0)])
def test_a_killed_checkpoint_leaves_a_complete_one(tmp_path, no_launcher, step, survivor):
    path = tmp_path / "ckpt"
    _checkpoint_of(path, 1.0)
    proc = subprocess.run([PY, "-c", _CRASHING, str(path), step], check=False, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    # The old checkpoint until the new one was swapped in, the new one after.
    np.testing.assert_array_equal(_restored_values(path), np.full((20, 2), survivor))
    # The next checkpoint to the same path cleans up after the crashed one.
    _checkpoint_of(path, 5.0)
    np.testing.assert_array_equal(_restored_values(path), np.full((20, 2), 5.0))
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


# --- errors ------------------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path, no_launcher):
    """A checkpoint of 20 keys of length 2 (values 1.0)."""
    path = tmp_path / "ckpt"
    _checkpoint_of(path, 1.0)
    return path


def test_a_job_of_another_shape_is_refused_naming_the_difference(small):
    with pytest.raises(adapm.ConfigError, match=r"num_keys=20.*num_keys=21") as info:
        adapm.init(num_keys=21, value_length=2, restore=small)
    assert str(small) in str(info.value)
    with pytest.raises(adapm.ConfigError, match="key 0: 2 floats in the checkpoint, 3 in "):
        adapm.init(num_keys=20, value_length=3, restore=small)
    lengths = np.full(20, 2)
    lengths[7] = 1
    with pytest.raises(adapm.ConfigError, match="key 7: 2 floats in the checkpoint, 1 in "):
        adapm.init(num_keys=20, value_length=lengths, restore=small)
    # Per-key lengths that are all 2 are the same job.
    with adapm.init(num_keys=20, value_length=np.full(20, 2), restore=small) as node:
        np.testing.assert_array_equal(node.worker().pull([3]), [1.0, 1.0])


def test_a_damaged_checkpoint_is_refused_naming_the_file(small):
    values = small / ckpt.shard_files(0)[1]
    data = bytearray(values.read_bytes())
    data[-1] ^= 1
    values.write_bytes(bytes(data))
    with pytest.raises(adapm.CheckpointError, match="shard-00000.values.npy is corrupt") as info:
        adapm.init(restore=small)
    assert str(small) in str(info.value)
    values.unlink()
    with pytest.raises(adapm.CheckpointError, match="cannot read shard-00000.values.npy"):
        adapm.init(restore=small)
    adapm.init(num_keys=1).shutdown()  # no node was left behind by the failures


def test_an_unknown_format_version_or_no_checkpoint_is_refused(small, tmp_path):
    manifest = json.loads((small / "manifest.json").read_text())
    manifest["format_version"] = 99
    (small / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(adapm.CheckpointError, match="format version 99"):
        adapm.init(restore=small)
    (small / "manifest.json").write_text("{not json")
    with pytest.raises(adapm.CheckpointError, match="unreadable manifest.json"):
        adapm.checkpoint_meta(small)
    with pytest.raises(adapm.CheckpointError, match="no manifest.json"):
        adapm.init(restore=tmp_path / "nothing-here")


def test_checkpoint_refuses_to_replace_what_is_not_a_checkpoint(tmp_path, no_launcher):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (tmp_path / "file").write_text("keep me too")
    with adapm.init(num_keys=4) as node:
        with pytest.raises(adapm.CheckpointError, match="not a checkpoint"):
            node.checkpoint(mine)
        with pytest.raises(adapm.CheckpointError, match="not a directory"):
            node.checkpoint(tmp_path / "file")
        with pytest.raises(adapm.InvalidArgument, match="meta"):
            node.checkpoint(tmp_path / "new", meta={"x": object()})
        node.worker().push([1], [[1.0]])  # the node goes on
    assert (mine / "notes.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["file", "mine"]


# --- any shape, any values, bit for bit ---------------------------------------------------------

layouts = st.one_of(
    st.integers(1, 5),
    st.lists(st.integers(1, 5), min_size=1, max_size=40).map(lambda xs: np.array(xs)),
)


# no_launcher only clears environment variables: the same for every example.
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(num_keys=st.integers(1, 40), layout=layouts, seed=st.integers(0, 2**32 - 1),
       meta=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5),
                            max_size=3))
def test_restore_gives_back_every_bit(tmp_path, no_launcher, num_keys, layout, seed, meta):
    if not isinstance(layout, int):
        layout = np.resize(layout, num_keys)
    lengths = np.broadcast_to(np.asarray(layout), (num_keys,))
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, int(lengths.sum()), dtype=np.uint32)
    values = bits.view(np.float32)  # any pattern: NaNs, infinities, -0.0, subnormals
    path = tmp_path / "ckpt"  # the same path for every example: each overwrites the last
    with adapm.init(num_keys=num_keys, value_length=layout) as node:
        w = node.worker()
        w.set(np.arange(num_keys), values.reshape(num_keys, -1) if isinstance(layout, int)
              else values)
        node.checkpoint(path, meta={"first": True})
        node.checkpoint(path, meta=meta)  # over the first one
    with adapm.init(restore=path) as node:
        back = node.worker().pull(np.arange(num_keys)).reshape(-1)
    np.testing.assert_array_equal(back.view(np.uint32), bits)
    assert adapm.checkpoint_meta(path) == meta
    reader = ckpt.load(path)
    keys = rng.integers(0, num_keys, 7)
    starts = np.cumsum(lengths) - lengths
    want = np.concatenate([bits[starts[k]:starts[k] + lengths[k]] for k in keys])
    np.testing.assert_array_equal(reader.read(keys).view(np.uint32), want)


# --- the apps: --checkpoint-dir, --checkpoint-every, --resume -----------------------------------

KGE_FLAGS = ["--dim", "16", "--eval-max", "200", "--progress", "off", "--json", "-"]


@pytest.fixture(scope="module")
def kg(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kg")
    app_run([PY, "-m", "adapm.apps.kge", "generate", str(out), "--triples", "4000",
             "--seed", "1"])
    return out


def kge(kg, *flags) -> list:
    return [PY, "-m", "adapm.apps.kge", "--data", str(kg), *KGE_FLAGS, *flags]


def test_a_resumed_app_run_continues_where_it_stopped(kg, tmp_path):
    """One node, one worker: the run is deterministic, so the resumed epoch is the very epoch
    of the uninterrupted run."""
    ck, lines = tmp_path / "ck", tmp_path / "lines.jsonl"
    straight = records(app_run(kge(kg, "--epochs", "3")).stdout)
    app_run(kge(kg, "--epochs", "2", "--checkpoint-dir", str(ck), "--json", str(lines)))
    first = records(lines.read_text())
    assert adapm.checkpoint_meta(ck)["epoch"] == 2
    app_run(kge(kg, "--epochs", "3", "--checkpoint-dir", str(ck), "--resume", "--json",
                str(lines)))
    resumed = records(lines.read_text())[len(first):]  # --json appends
    assert [r["epoch"] for r in first] == [1, 2] and [r["epoch"] for r in resumed] == [3]
    for name in ("loss", "mrr", "hits@10"):
        assert resumed[0][name] == straight[2][name], name
    assert adapm.checkpoint_meta(ck)["epoch"] == 3


def test_an_app_checkpoint_resumes_on_another_number_of_nodes(kg, tmp_path):
    ck = tmp_path / "ck"
    two = records(app_run([*LAUNCHER, "-n", "2", *kge(kg, "--epochs", "2", "--checkpoint-dir",
                                                      str(ck), "--checkpoint-every", "2")]
                          ).stdout)
    assert [r["epoch"] for r in two] == [1, 2] and len(two[0]["stats"]) == 2
    meta = adapm.checkpoint_meta(ck)
    assert (meta["epoch"], meta["world_size"]) == (2, 2)
    one = records(app_run(kge(kg, "--epochs", "3", "--checkpoint-dir", str(ck), "--resume")
                          ).stdout)
    assert [r["epoch"] for r in one] == [3] and len(one[0]["stats"]) == 1
    # Trained on: not back at the random start (MRR of a random ranking is ~0.007 here).
    assert one[0]["mrr"] > 0.5 * two[-1]["mrr"]


# A word-vector run killed right after its checkpoint of epoch 2 (of 3): what a preempted job
# leaves behind. argv: the app's flags.
_KILLED_APP = """
import os, sys
from adapm.apps import runner, wv

checkpoint = runner._checkpoint


def then_die(task, opts, node, exchange, threads, epoch):
    checkpoint(task, opts, node, exchange, threads, epoch)
    if epoch == 2:
        os._exit(0)


runner._checkpoint = then_die
wv.main(sys.argv[1:])
"""


def test_a_killed_app_resumes_to_the_numbers_of_an_uninterrupted_run(tmp_path):
    """Word vectors carry a random stream and a learning-rate schedule from epoch to epoch:
    both continue from the checkpoint."""
    app_run([PY, "-m", "adapm.apps.wv", "generate", str(tmp_path / "wv"), "--sentences",
             "3000", "--seed", "1"])
    flags = ["--corpus", str(tmp_path / "wv" / "corpus.txt"), "--dim", "16", "--min-count",
             "3", "--progress", "off", "--json", "-", "--epochs", "3", "--checkpoint-dir",
             str(tmp_path / "ck")]
    straight = records(app_run([PY, "-m", "adapm.apps.wv", *flags[:-2]]).stdout)
    killed = records(app_run([PY, "-c", _KILLED_APP, *flags]).stdout)
    assert [r["epoch"] for r in killed] == [1, 2]
    resumed = records(app_run([PY, "-m", "adapm.apps.wv", *flags, "--resume"]).stdout)
    assert [r["epoch"] for r in resumed] == [3]
    assert resumed[0]["loss"] == straight[2]["loss"]
    assert resumed[0]["words"] == straight[2]["words"]


def test_app_resume_errors(kg, tmp_path):
    no_dir = app_run(kge(kg, "--epochs", "2", "--resume"), expect=2)
    assert "--resume needs --checkpoint-dir" in no_dir.stderr
    ck = tmp_path / "ck"
    app_run(kge(kg, "--epochs", "1", "--checkpoint-dir", str(ck)))
    # A user's mistake: one line naming it, exit 2, no traceback.
    other = app_run(kge(kg, "--epochs", "2", "--checkpoint-dir", str(ck), "--resume", "--dim",
                        "8"), expect=2)
    assert "value lengths differ" in other.stderr and str(ck) in other.stderr
    assert "(another --model or --dim?)" in other.stderr
    done = app_run(kge(kg, "--epochs", "1", "--checkpoint-dir", str(ck), "--resume"), expect=2)
    assert "give --epochs above 1" in done.stderr
    for proc in (other, done):
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


GNN = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "gnn", "train.py")


def test_the_gnn_example_resumes_to_the_numbers_of_an_uninterrupted_run(tmp_path):
    """examples/gnn: rows, dense parameters and Adam's state from the checkpoint; on one rank
    the resumed epoch is the uninterrupted run's, and two ranks go on from it."""
    pytest.importorskip("torch")
    flags = [GNN, "--nodes", "1500", "--communities", "4", "--seed", "2", "--progress", "off",
             "--loader-workers", "0", "--json", "-"]
    ck = ["--checkpoint-dir", str(tmp_path / "ck")]
    straight = records(app_run([PY, *flags, "--epochs", "3"]).stdout)
    first = records(app_run([PY, *flags, "--epochs", "2", *ck]).stdout)
    resumed = records(app_run([PY, *flags, "--epochs", "3", *ck, "--resume"]).stdout)
    assert [r["epoch"] for r in first] == [1, 2] and [r["epoch"] for r in resumed] == [3]
    for name in ("loss", "val_acc", "test_acc"):
        assert resumed[0][name] == straight[2][name], name
    two = records(app_run([*LAUNCHER, "-n", "2", PY, *flags, "--epochs", "4", *ck, "--resume"]
                          ).stdout)
    assert [(r["epoch"], r["world_size"]) for r in two] == [(4, 2)]
    assert adapm.checkpoint_meta(tmp_path / "ck")["epoch"] == 4
