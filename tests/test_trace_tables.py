"""Traces that open anywhere (issue 28, item 7): pandas, duckdb and polars (when installed) read
a trace's tables with the code of docs/traces.md as written; every column is documented; the
plot draws the epoch marks, marked spans, intent windows and remote accesses (checked on the
figure's artists); an old trace is refused with a clear message; IntentLoader marks epochs."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import adapm
from adapm.testing import run_cluster
from adapm.trace import TraceError, load, schema

DOCS = Path(__file__).resolve().parent.parent / "docs" / "traces.md"
FAST = dict(connect_timeout_s=20, request_timeout_s=20)
EPOCHS = 2


def _marked_job(node):
    """Two marked epochs on 2 nodes, an evaluation span after each. Rank 1 announces keys
    {0, 2} (home 0) and trains them (they move to it); rank 0 pulls keys {1, 3} (home 1)
    without intent (remote accesses)."""
    w = node.worker()
    for epoch in range(1, EPOCHS + 1):
        node.barrier()
        node.trace_mark(f"epoch {epoch} start")
        if node.rank == 1:
            w.intent([0, 2], w.clock + 1, w.clock + 3)
            w.advance_clock()
            w.wait_sync()
            w.push([0, 2], np.ones((2, 2), np.float32))
            w.advance_clock()
            w.advance_clock()
            w.wait_sync()
        else:
            w.pull([1, 3])
        node.barrier()
        node.trace_mark(f"epoch {epoch} end")
        node.trace_mark(f"evaluation {epoch} start")
        node.trace_mark(f"evaluation {epoch} end")
    return 0


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("trace") / "run"
    run_cluster(_marked_job, 2, timeout_s=90,
                config={**FAST, "num_keys": 8, "value_length": 2, "trace_dir": str(directory)})
    return directory


def _doc_block(needle: str) -> str:
    """The ```python block of docs/traces.md that contains ``needle``."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    found = [b for b in blocks if needle in b]
    assert len(found) == 1, f"docs/traces.md: {len(found)} python blocks with {needle!r}"
    return found[0]


def _run_doc(needle: str, trace_dir: Path) -> dict:
    scope = {"trace_dir": str(trace_dir)}
    exec(compile(_doc_block(needle), f"docs/traces.md ({needle})", "exec"), scope)
    return scope


def test_the_directory_holds_one_dataset_per_table(trace_dir):
    assert {p.name for p in trace_dir.iterdir()} == \
        set(schema.KINDS) | {"node-r0.json", "node-r1.json"}
    for kind in schema.KINDS:
        files = sorted(p.name for p in (trace_dir / kind).iterdir())
        assert files and all(re.fullmatch(r"r[01]-\d{6}\.parquet", f) for f in files), files


def test_pandas_reads_the_events_directory_as_the_docs_write_it(trace_dir):
    scope = _run_doc("import pandas", trace_dir)
    events = scope["events"]
    assert list(events.columns) == list(schema.EVENT_COLUMNS)
    assert str(events["time"].dtype) == "datetime64[us, UTC]"
    assert len(events) == len(load(str(trace_dir)).events) and set(events["rank"]) == {0, 1}
    # rank 0's pulls of keys 1 and 3 without intent were remote, once per epoch each
    assert scope["remote"].to_dict() == {0: 2 * EPOCHS}


def test_duckdb_reads_the_events_directory_as_the_docs_write_it(trace_dir):
    pytest.importorskip("duckdb")
    scope = _run_doc("import duckdb", trace_dir)
    # keys 0 and 2 moved from their home (rank 0) to rank 1 in the first epoch
    assert scope["moves"] == [(1, 2)]
    import duckdb

    kinds = dict(duckdb.sql(f"describe select * from read_parquet('{trace_dir}/events')")
                 .fetchall() and [(r[0], r[1]) for r in duckdb.sql(
                     f"describe select * from read_parquet('{trace_dir}/events')").fetchall()])
    assert kinds["time"] == "TIMESTAMP WITH TIME ZONE", kinds


@pytest.mark.skipif(importlib.util.find_spec("polars") is None, reason="polars not installed")
def test_polars_reads_the_rounds_directory_as_the_docs_write_it(trace_dir):
    rounds = _run_doc("import polars", trace_dir)["rounds"]
    assert rounds.columns == load(str(trace_dir)).rounds.column_names


def test_every_column_is_documented(trace_dir):
    """Each table's columns, as recorded, are the documented ones (a new statistic in
    node.stats() needs its line in adapm/trace/schema.py and docs/traces.md)."""
    trace = load(str(trace_dir))
    text = DOCS.read_text()
    stats = list(schema.ROUND_STATS)
    expected = {"events": list(schema.EVENT_COLUMNS),
                "rounds": list(schema.ROUND_COLUMNS) + stats,
                "traffic": list(schema.TRAFFIC_COLUMNS),
                "marks": list(schema.MARK_COLUMNS) + stats}
    for kind, names in expected.items():
        table = getattr(trace, kind)
        assert table.column_names == names, (kind, set(table.column_names) ^ set(names))
        # the docs' table lists the columns as the files hold them, in order
        section = text[text.index(f"### `{kind}`"):]
        section = section[:section.index("\n##", 1)] if "\n##" in section[1:] else section
        documented = re.findall(r"^\| `(\w+)` \|", section, re.M)
        if kind == "marks":  # "and the statistics columns of `rounds`"
            documented += stats
        assert documented == names, (kind, [(a, b) for a, b in zip(documented, names) if a != b])
    for kind in ("events", "rounds", "traffic", "marks"):
        for name in ("time", "start", "end"):
            if name in getattr(trace, kind).column_names:
                assert str(getattr(trace, kind).schema.field(name).type) == "timestamp[us, tz=UTC]"
    traffic = trace.traffic.to_pylist()
    assert {"sync", "pull"} <= {r["kind"] for r in traffic}
    final = [r for r in traffic if r["round"] == -1 and r["kind"] == "pull" and r["rank"] == 0]
    assert final and final[0]["messages_sent"] >= EPOCHS  # rank 0 pulled remotely each epoch


def test_the_plot_marks_epochs_spans_intents_and_remote_accesses(trace_dir):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from adapm.trace.plot import figure

    trace = load(str(trace_dir))
    spans = trace.spans()
    assert list(spans) == [n for e in range(1, EPOCHS + 1) for n in (f"epoch {e}",
                                                                    f"evaluation {e}")]
    fig = figure(trace, [0, 1])
    try:
        for ax in fig.axes[:2]:
            lines = {line.get_gid(): line for line in ax.lines if line.get_gid()}
            for epoch in range(1, EPOCHS + 1):
                ranks = spans[f"epoch {epoch}"]
                start = trace.seconds(min(a for a, _ in ranks.values()))
                end = trace.seconds(max(b for _, b in ranks.values()))
                assert 0 < start < end < trace.duration_s
                for gid, at in ((f"epoch {epoch} start", start), (f"epoch {epoch} end", end)):
                    assert gid in lines, sorted(lines)
                    assert np.allclose(lines[gid].get_xdata(), at), (gid, at)
            shaded = [p for p in ax.patches if (p.get_gid() or "").startswith("span ")]
            assert sorted(p.get_gid() for p in shaded) == ["span evaluation 1",
                                                           "span evaluation 2"]
        key0, key1 = fig.axes[:2]
        # key 0: rank 1's intent windows; key 1: rank 0's remote accesses, one per epoch
        intents = [c for c in key0.collections if c.get_gid() == "intent"]
        assert len(intents) == 1 and len(intents[0].get_paths()) == EPOCHS
        ticks = [line for line in key1.lines if line.get_gid() == "remote"]
        assert len(ticks) == 1 and len(ticks[0].get_xdata()) == EPOCHS
        assert not [line for line in key0.lines if line.get_gid() == "remote"]
    finally:
        plt.close(fig)
    bare = figure(trace, [1], intents=False, remote=False)
    try:
        assert not [a for a in bare.axes[0].get_children() if a.get_gid() in ("intent",
                                                                               "remote")]
    finally:
        plt.close(bare)


def test_a_plot_to_a_format_matplotlib_lacks_is_one_line_before_drawing(trace_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "keys.jpgg"
    proc = subprocess.run([sys.executable, "-m", "adapm.cli", "trace", "plot", str(trace_dir),
                           "--key", "0", "-o", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"adapm trace: error: {out}: matplotlib writes no 'jpgg' "
                                  "files; name a .png"), proc.stderr
    assert not out.exists()
    svg = tmp_path / "keys.svg"  # another format matplotlib writes is drawn as named
    proc = subprocess.run([sys.executable, "-m", "adapm.cli", "trace", "plot", str(trace_dir),
                           "--key", "0", "-o", str(svg)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and svg.read_text().lstrip().startswith("<?xml"), proc.stderr


def test_a_per_epoch_total_says_when_a_node_did_not_mark_the_epoch(trace_dir, tmp_path):
    """A node that died before it marked an epoch has no row there, and the total is the
    others': the table says so (it summed them without a word)."""
    whole = subprocess.run([sys.executable, "-m", "adapm.cli", "trace", "summary",
                            str(trace_dir), "--per-epoch"], capture_output=True, text=True,
                           timeout=60)
    assert whole.returncode == 0 and "did not mark" not in whole.stdout, whole.stdout
    cut = tmp_path / "cut"
    shutil.copytree(trace_dir, cut)
    for part in (cut / "marks").glob("r1-*.parquet"):  # rank 1's marks: as if it died first
        part.unlink()
    proc = subprocess.run([sys.executable, "-m", "adapm.cli", "trace", "summary", str(cut),
                           "--per-epoch"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    notice = "(1 of 2 nodes did not mark this epoch: the total is the others')"
    assert proc.stdout.count(notice) == EPOCHS, proc.stdout


def test_a_trace_of_the_old_format_is_refused_clearly(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "node-r0.json").write_text(json.dumps({
        "format": schema.FORMAT, "version": 1, "rank": 0, "world_size": 1, "num_keys": 4,
        "started": 0.0}))
    (old / "events-r0-000000.parquet").write_bytes(b"PAR1")
    with pytest.raises(TraceError, match="version 1.*record the trace again"):
        load(str(old))
    proc = subprocess.run([sys.executable, "-m", "adapm.cli", "trace", "summary", str(old)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "record the trace again" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_intent_loader_marks_epochs_for_per_epoch_summaries(tmp_path, no_launcher):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from adapm.torch import IntentCollate, IntentLoader

    directory = tmp_path / "torch"
    data = [torch.tensor([i % 6, (i + 1) % 6]) for i in range(12)]
    loader = DataLoader(data, batch_size=3, collate_fn=IntentCollate(
        keys_fn=lambda batch: batch.reshape(-1).numpy()))
    def train(batches, times=1):
        for _ in range(times):
            for batch in batches:
                w.push(batch.reshape(-1).numpy(), np.ones((batch.numel(), 2), np.float32))

    with adapm.init(num_keys=6, value_length=2, trace_dir=str(directory)) as node:
        w = node.worker()
        train(IntentLoader(loader, w, ahead=2), EPOCHS)   # epochs 1 and 2
        train(IntentLoader(loader, w, ahead=2))           # a new loader goes on: epoch 3
        train(IntentLoader(loader, w, ahead=2, mark_epochs=False))  # not an epoch
        node.trace_mark("epoch 7 start")  # a script's own numbering (a resumed run, say)
        train(IntentLoader(loader, w, ahead=2))           # inside it: not marked again
        node.trace_mark("epoch 7 end")
        train(IntentLoader(loader, w, ahead=2))           # after it: epoch 8
    rows = load(str(directory)).summary(per_epoch=True).to_pylist()
    pushes = {r["epoch"]: r["local_push_keys"] for r in rows if r["node"] == "0"}
    assert pushes == {e: 2 * len(data) for e in (1, 2, 3, 7, 8)}, pushes
    proc = subprocess.run([sys.executable, "-m", "adapm.cli", "trace", "summary",
                           str(directory), "--per-epoch"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "epoch 8 (training):" in proc.stdout and "epoch 4" not in proc.stdout
