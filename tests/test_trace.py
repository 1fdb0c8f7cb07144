"""Parameter-placement traces: recorded on real nodes (the 3-node scenario of DESIGN section 8),
read back, queried, summarised against node.stats(), drawn (pixels checked), and the failures a
reader meets (a cut-off part file, a missing or foreign directory)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_adaptive import SCENARIO
from test_adaptive import _scenario_job as adaptive_scenario_job

import adapm
from adapm.testing import run_cluster
from adapm.trace import TraceError, load
from adapm.trace.plot import MAIN_COLOUR, REPLICA_COLOUR

FAST = dict(connect_timeout_s=20, request_timeout_s=20)
# stats that the shutdown after a job does not change
STABLE = ("relocations_in", "relocations_out", "replica_setups", "replica_drops",
          "local_pull_keys", "remote_pull_keys", "local_push_keys", "remote_push_keys")


def _scenario_job(node):
    """DESIGN section 8's scenario (tests/test_adaptive.py): intents for {3, 4} at rank 0 and
    {1, 3, 6} at rank 2 for clock 1, pushes meanwhile, the intents end, then every rank pulls
    every key. Returns the keys held at the end and the node's stats."""
    after = adaptive_scenario_job(node)[2]
    return after, node.stats()


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("trace"))
    results = run_cluster(_scenario_job, 3, timeout_s=90,
                          config={**FAST, "num_keys": 9, "value_length": 2,
                                  "trace_dir": directory})
    return directory, results


def _events(trace, **match) -> set:
    rows = trace.events.to_pylist()
    return {(r["rank"], r["key"], r["event"], r["peer"]) for r in rows
            if all(r[k] == v for k, v in match.items())}


def test_the_scenario_records_exactly_the_expected_events(scenario):
    directory, results = scenario
    trace = load(directory)
    assert trace.world_size == 3 and trace.num_keys == 9 and not trace.skipped
    frame = trace.to_pandas()
    assert list(frame.columns) == ["time", "clock", "rank", "key", "event", "peer"]
    assert len(frame) == len(trace.events) and frame["time"].is_monotonic_increasing
    assert str(frame["time"].dtype) == "datetime64[us, UTC]"  # an Arrow timestamp, not floats
    assert all(node["complete"] and node["dropped_rows"] == 0 for node in trace.nodes)
    # keys only one node wanted: relocated from their home, and they stay
    moves = {(1, 1, "dealloc", 2), (2, 1, "alloc", 1),   # key 1: home 1 -> rank 2
             (1, 4, "dealloc", 0), (0, 4, "alloc", 1),   # key 4: home 1 -> rank 0
             (0, 6, "dealloc", 2), (2, 6, "alloc", 0)}   # key 6: home 0 -> rank 2
    placement = _events(trace) - _events(trace, event="remote_access")
    key3 = {e for e in placement if e[1] == 3}
    assert placement - key3 == moves | {
        (rank, key, what, -1) for rank, keys in SCENARIO.items() for key in keys if key != 3
        for what in ("intent_start", "intent_stop")}
    # key 3 (home 0), wanted by ranks 0 and 2: the order of their reports decides where the
    # main copy goes (several valid histories); each must hold together: it was replicated
    # while both wanted it, every alloc takes it from the owner before, with a dealloc there,
    # and the last alloc leaves it where it is.
    starts_stops = {(r, 3, w, -1) for r in (0, 2) for w in ("intent_start", "intent_stop")}
    assert starts_stops <= key3
    assert any(e[2] == "replica_setup" for e in key3)
    assert {e[2] for e in key3 - starts_stops} <= {"alloc", "dealloc", "replica_setup",
                                                    "replica_drop"}
    owner = 0
    for row in trace.timeline(3).to_pylist():
        if row["event"] == "alloc":
            assert row["peer"] == owner, trace.timeline(3).to_pylist()
            owner = row["rank"]
    assert sorted((r, p) for r, _, e, p in key3 if e == "dealloc") == \
        sorted((p, r) for r, _, e, p in key3 if e == "alloc")
    assert [rank for rank, (after, _) in enumerate(results) if 3 in after] == [owner]
    # the final pulls: exactly the keys not held, each served by where it is
    for rank, (after, _) in enumerate(results):
        remote = _events(trace, rank=rank, event="remote_access")
        assert {key for _, key, _, _ in remote} == set(range(9)) - set(after)
        assert all(peer == trace.location(key) for _, key, _, peer in remote)


def test_location_and_replicas_answer_at_chosen_times(scenario):
    trace = load(scenario[0])
    for key, home, where in ((1, 1, 2), (4, 1, 0), (6, 0, 2), (0, 0, 0)):
        assert trace.location(key, at=trace.start) == home
        assert trace.location(key) == where
        alloc = [r["time"] for r in trace.timeline(key).to_pylist() if r["event"] == "alloc"]
        if alloc:
            assert trace.location(key, at=alloc[0] - dt.timedelta(microseconds=1)) == home
            assert trace.location(key, at=alloc[0]) == where
            # the same instants as numpy datetimes and as Unix seconds
            assert trace.location(key, at=np.datetime64(alloc[0].replace(tzinfo=None))) == where
            assert trace.location(key, at=alloc[0].timestamp() - 1e-6) == home
    held = {rank for rank, (after, _) in enumerate(scenario[1]) if 3 in after}
    assert {trace.location(3)} == held
    replicas = trace.replicas(3)
    assert len(replicas) == 1 and all(a <= b for spans_ in replicas.values() for a, b in spans_)
    assert trace.replicas(1) == {}
    timeline = trace.timeline(1).to_pylist()
    assert [r["time"] for r in timeline] == sorted(r["time"] for r in timeline)
    with pytest.raises(TraceError, match="outside"):
        trace.location(9)


def test_summary_agrees_with_node_stats(scenario):
    directory, results = scenario
    rows = {row["node"]: row for row in load(directory).summary().to_pylist()}
    assert set(rows) == {"0", "1", "2", "total"}
    for rank, (_, stats) in enumerate(results):
        row = rows[str(rank)]
        assert row["complete"]
        for name in STABLE:
            assert row[name] == stats[name], (rank, name)
        # the shutdown after the job sends a little more
        for name in ("bytes_sent", "messages_sent", "bytes_received", "messages_received"):
            assert row[name] >= stats[name] > 0
    for name in STABLE:
        assert rows["total"][name] == sum(s[name] for _, s in results)
    assert rows["total"]["relocations_in"] == rows["total"]["relocations_out"] >= 3
    remote = sum(s["remote_pull_keys"] for _, s in results)
    assert rows["total"]["remote_access_share"] > 0 and remote > 0


def test_the_cli_prints_the_summary_and_draws_the_keys(scenario, tmp_path):
    directory, _ = scenario
    cli = [sys.executable, "-m", "adapm.cli", "trace"]
    text = subprocess.run(cli + ["summary", directory], capture_output=True, text=True,
                          check=True).stdout
    assert "remote share" in text and "total" in text
    lines = subprocess.run(cli + ["summary", directory, "--json"], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert [json.loads(line)["node"] for line in lines] == ["0", "1", "2", "total"]
    png = tmp_path / "key1.png"
    subprocess.run(cli + ["plot", directory, "--key", "1", "-o", str(png)], check=True,
                   capture_output=True)
    bands = _colour_bands(png, MAIN_COLOUR)
    # key 1: main copy at node 1 (its home) until it moves, then at node 2 to the end: two
    # bands, node 1's above node 2's (one row per node, node 0 on top), one after the other
    assert len(bands) == 2, bands
    (top, x_top), (bottom, x_bottom) = bands
    assert top < bottom and x_top[0] < x_bottom[0] and x_top[1] <= x_bottom[0] + 2 and \
        x_bottom[1] > x_top[1], bands
    assert not _colour_bands(png, REPLICA_COLOUR)
    hot = tmp_path / "hot.png"
    out = subprocess.run(cli + ["plot", directory, "--hot", "3", "-o", str(hot)], check=True,
                         capture_output=True, text=True).stdout
    assert "keys 3" in out  # key 3 had the most events
    assert len(_colour_bands(hot, REPLICA_COLOUR)) >= 1


def _colour_bands(path, colour: str) -> list:
    """Horizontal bands of pixels of ``colour`` in the panels: [(mean row, (first column,
    last column))]."""
    from matplotlib import colors, image

    pixels = image.imread(str(path))[:, :, :3]
    assert pixels.shape[0] > 100 and pixels.shape[1] > 300  # a real PNG picture
    hit = np.all(np.abs(pixels - np.array(colors.to_rgb(colour))) < 0.02, axis=2)
    hit[:int(0.1 * len(hit))] = False  # the legend's patches, above the panels
    rows = np.flatnonzero(hit.any(axis=1))
    if not len(rows):
        return []
    groups = np.split(rows, np.flatnonzero(np.diff(rows) > 1) + 1)
    out = []
    for group in groups:
        cols = np.flatnonzero(hit[group].any(axis=0))
        out.append((float(group.mean()), (int(cols[0]), int(cols[-1]))))
    return out


def test_a_cut_off_part_is_skipped_and_the_rest_loads(scenario, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(scenario[0], copy)
    parts = sorted(p for p in os.listdir(copy / "events") if p.startswith("r1-"))
    data = (copy / "events" / parts[0]).read_bytes()
    (copy / "events" / parts[0]).write_bytes(data[:len(data) // 2])  # a writer killed mid-file
    (copy / "events" / ".r0-000099.parquet.tmp").write_bytes(b"PAR1")  # never renamed: not read
    with pytest.warns(UserWarning, match="skipping"):
        trace = load(str(copy))
    assert trace.skipped == [str(copy / "events" / parts[0])]
    assert set(trace.events["rank"].to_pylist()) == {0, 2}
    assert len(trace.events) == len(load(scenario[0]).events.filter(
        load(scenario[0]).events["rank"].to_numpy() != 1))


def test_missing_and_foreign_directories_are_clear_errors(tmp_path):
    with pytest.raises(TraceError, match="no such trace directory"):
        load(str(tmp_path / "nowhere"))
    with pytest.raises(TraceError, match="not an adapm trace"):
        load(str(tmp_path))
    (tmp_path / "node-r0.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(TraceError, match="not adapm trace metadata"):
        load(str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "adapm.cli", "trace", "summary",
                           str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert proc.returncode == 2 and "nowhere: no such trace directory" in proc.stderr


def _cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "adapm.cli", "trace", *args],
                          capture_output=True, text=True, timeout=120, **kwargs)


def test_a_damaged_trace_is_summarised_with_one_line_per_loss_and_exit_1(scenario, tmp_path):
    import shutil

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    lost = tmp_path / "lost"
    shutil.copytree(scenario[0], lost)
    parts = sorted(p for p in os.listdir(lost / "rounds") if p.startswith("r1-"))
    for part in parts:  # node 1's rounds without its final row, as if that part were lost
        table = pq.read_table(lost / "rounds" / part)
        pq.write_table(table.filter(pc.invert(table["final"])), lost / "rounds" / part)
    (lost / "rounds" / "r1-000099.parquet").write_bytes(b"")  # the lost part
    proc = _cli("summary", str(lost))
    assert proc.returncode == 1, proc
    assert proc.stderr.splitlines() == [
        f"adapm trace: warning: skipping {lost / 'rounds' / 'r1-000099.parquet'}: Could not "
        f"open Parquet input source '{lost / 'rounds' / 'r1-000099.parquet'}': Parquet file "
        "size is 0 bytes"]
    # node 1 did shut down cleanly (its metadata says so): not "did not shut down cleanly"
    assert "node 1: the final statistics are in a part that could not be read" in proc.stdout
    assert "did not shut down cleanly" not in proc.stdout
    for part in parts:  # and now none of node 1's statistics: the total is the others'
        (lost / "rounds" / part).write_bytes(b"")
    proc = _cli("summary", str(lost))
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == len(parts) + 1
    assert "(node 1: no statistics could be read: the total is the others')" in proc.stdout
    no_meta = tmp_path / "no_meta"
    shutil.copytree(scenario[0], no_meta)
    (no_meta / "node-r2.json").unlink()
    proc = _cli("summary", str(no_meta))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"adapm trace: warning: {no_meta}: no metadata of node 2 (node-r2.json): its rows "
        "load, its start and end do not count"]
    meta = json.loads((no_meta / "node-r0.json").read_text())
    del meta["started"]
    (no_meta / "node-r0.json").write_text(json.dumps(meta))
    proc = _cli("summary", str(no_meta))
    assert proc.returncode == 2 and proc.stderr.strip().endswith(
        "node-r0.json: damaged trace metadata (no number for started)"), proc
    proc = _cli("summary", str(no_meta / "node-r1.json"))
    assert proc.returncode == 2 and "node-r1.json: not a directory" in proc.stderr


def test_a_reader_that_stops_early_ends_the_cli_quietly(scenario):
    read, write = os.pipe()
    os.close(read)  # as `adapm trace summary DIR | head -1` once head has its line
    try:
        proc = subprocess.run([sys.executable, "-m", "adapm.cli", "trace", "summary",
                               scenario[0]], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc


def test_the_events_are_read_only_when_a_query_needs_them(scenario, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(scenario[0], copy)
    whole = load(scenario[0])
    trace = load(str(copy))
    shutil.rmtree(copy / "events")  # after load: what needs the events finds them gone
    assert trace.num_events == len(whole.events) > 0 and trace.end == whole.end
    assert trace.summary().to_pylist() == whole.summary().to_pylist()
    with pytest.warns(UserWarning, match="skipping"):
        assert len(trace.events) == 0
    assert trace.skipped and trace.location(1) == 1  # no events: every key at its home


@pytest.mark.parametrize("call, message", [
    (lambda t: t.location(1, at=float("nan")), "a time must be finite"),
    (lambda t: t.location(1, at=float("inf")), "a time must be finite"),
    (lambda t: t.location(1, at=0), "is outside the trace"),
    (lambda t: t.location(1, at=t.end.timestamp() + 3600), "is outside the trace"),
    (lambda t: t.location(1.5), "key must be an int"),
    (lambda t: t.timeline(True), "key must be an int"),
    (lambda t: t.hot_keys(-1), "n must be a positive int"),
    (lambda t: t.hot_keys(0), "n must be a positive int"),
])
def test_bad_queries_are_trace_errors(scenario, call, message):
    with pytest.raises(TraceError, match=message):
        call(load(scenario[0]))


def _selected_job(node):
    w = node.worker()
    w.intent(np.arange(6), 1)
    w.advance_clock()
    w.wait_sync()
    node.barrier()
    return 0


def test_trace_keys_selects_what_is_recorded(tmp_path):
    listed, sampled = str(tmp_path / "listed"), str(tmp_path / "sampled")
    run_cluster(_selected_job, 2, timeout_s=60, config={**FAST, "num_keys": 12,
                                                        "trace_dir": listed, "trace_keys": [1, 4]})
    assert set(load(listed).events["key"].to_pylist()) <= {1, 4}
    assert 1 in load(listed).events["key"].to_pylist()  # rank 1 wanted key 1... of rank 1's
    run_cluster(_selected_job, 2, timeout_s=60, config={**FAST, "num_keys": 12,
                                                        "trace_dir": sampled, "trace_keys": 3})
    from adapm.trace.recorder import selection

    chosen = selection(adapm.Config(num_keys=12, trace_keys=3))
    assert len(chosen) == 3 and set(load(sampled).events["key"].to_pylist()) <= set(chosen)
    # A key the trace did not record has no answer: its home and no replicas would be a guess.
    for directory, recorded in ((listed, [1, 4]), (sampled, chosen.tolist())):
        trace = load(directory)
        other = next(k for k in range(12) if k not in recorded)
        for question in (trace.location, trace.replicas, trace.timeline):
            with pytest.raises(TraceError, match=f"key {other} was not recorded"):
                question(other)
            question(recorded[0])


@settings(max_examples=30, deadline=None)
@given(st.one_of(st.text(max_size=5), st.integers(-3, 0), st.just([12]), st.just([[1]]),
                 st.just([1.5])))
def test_bad_trace_settings_are_refused(value):
    if value == "all":
        return
    with pytest.raises(adapm.ConfigError, match="trace_keys"):
        adapm.Config(num_keys=12, trace_keys=value)


def test_an_unwritable_trace_dir_is_a_clear_error(tmp_path, no_launcher):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(adapm.ConfigError, match="cannot write a trace there"):
        adapm.init(num_keys=4, trace_dir=str(blocker / "trace"))
    with adapm.init(num_keys=4, trace_dir=str(tmp_path / "one")) as node:  # one node: stats
        node.worker().push([1], [[1.0]])
    rows = load(str(tmp_path / "one")).summary().to_pylist()
    assert rows[0]["local_push_keys"] == 1 and rows[0]["complete"]


def test_a_trace_dir_with_an_earlier_trace_is_refused(tmp_path, no_launcher):
    """A second job into the same directory would replace some of the first one's parts and
    leave the rest, and readers would take the mix for one run: refused, nothing written."""
    first = tmp_path / "first"
    with adapm.init(num_keys=4, trace_dir=str(first)) as node:
        node.worker().push([1], [[1.0]])
    before = sorted(p.name for p in first.rglob("*"))
    with pytest.raises(adapm.ConfigError, match=r"earlier job's trace \(node-r0\.json\)"):
        adapm.init(num_keys=4, trace_dir=str(first))
    assert sorted(p.name for p in first.rglob("*")) == before
    assert load(str(first)).summary().to_pylist()[0]["local_push_keys"] == 1
    # A part of this rank without its metadata, or the metadata of a rank this job lacks.
    for leftover in ("events/r0-000003.parquet", "node-r2.json"):
        other = tmp_path / leftover.replace("/", "-")
        (other / leftover).parent.mkdir(parents=True)
        (other / leftover).write_text("")
        with pytest.raises(adapm.ConfigError, match=leftover.replace(".", r"\.")):
            adapm.init(num_keys=4, trace_dir=str(other))
    # The apps say so before they start, in one line.
    from app_cli import PY

    data = tmp_path / "kg"
    subprocess.run([PY, "-m", "adapm.apps.kge", "generate", str(data), "--triples", "300"],
                   check=True, capture_output=True, timeout=120)
    again = subprocess.run([PY, "-m", "adapm.apps.kge", "--data", str(data), "--epochs", "1",
                            "--trace-dir", str(first)], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 2, again.stderr
    assert f"error: --trace-dir {first}: holds an earlier run's trace (node-r0.json); " \
        "choose a new directory or remove that trace" in again.stderr.strip().splitlines()[-1]
    assert "Traceback" not in again.stderr


def test_import_adapm_loads_neither_pyarrow_nor_matplotlib():
    code = ("import sys, adapm; import adapm.trace; "
            "assert 'pyarrow' not in sys.modules and 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_an_app_run_traced_per_epoch_agrees_with_its_own_epoch_lines(tmp_path):
    """--trace-dir on a training app (KGE, 2 nodes): the trace's per-epoch summary, between
    the runner's epoch marks, equals each node's training stats in the app's JSON lines."""
    from app_cli import LAUNCHER, PY, records, run

    data, trace_dir = tmp_path / "kg", tmp_path / "trace"
    run([PY, "-m", "adapm.apps.kge", "generate", str(data), "--triples", "6000", "--seed", "2"])
    out = run([*LAUNCHER, "-n", "2", PY, "-m", "adapm.apps.kge", "--data", str(data), "--dim",
               "8", "--epochs", "2", "--progress", "off", "--json", "-", "--trace-dir",
               str(trace_dir),
               "--trace-keys", "all"]).stdout
    lines = records(out)
    assert [line["epoch"] for line in lines] == [1, 2] and len(lines[0]["stats"]) == 2
    trace = load(str(trace_dir))
    # the clock of placement events is the training workers' (the runner's own worker for
    # evaluation and export never advances its clock: it pinned every event at 0)
    frame = trace.to_pandas()
    placement = frame[frame["event"] != "remote_access"]
    for rank in (0, 1):  # one training worker a node: its clock, rising through both epochs
        clocks = placement[placement["rank"] == rank]["clock"]
        assert clocks.is_monotonic_increasing and clocks.max() > 20, clocks.describe()
    rows = trace.summary(per_epoch=True).to_pylist()
    assert sorted({r["epoch"] for r in rows}) == [1, 2]
    for line in lines:
        for rank, stats in enumerate(line["stats"]):
            row = next(r for r in rows if r["epoch"] == line["epoch"] and r["node"] == str(rank))
            for name in STABLE:
                assert row[name] == stats[name], (line["epoch"], rank, name)
    text = subprocess.run([sys.executable, "-m", "adapm.cli", "trace", "summary",
                           str(trace_dir), "--per-epoch"], capture_output=True, text=True,
                          check=True).stdout
    assert "epoch 1 (training):" in text and "epoch 2 (training):" in text
