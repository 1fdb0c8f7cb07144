"""The trace recorder: a sink of the engine's event stream that writes Parquet files.

The engine thread hands it batches of keys per event and one record per sync round
(``adapm._engine.stream``); it keeps them in memory as they come (the engine's arrays are its to
keep; the ``trace_keys`` selection is applied by the writer, in bulk) and every :data:`FLUSH_S` seconds or :data:`FLUSH_ROWS` rows hands them to its
own writer thread, which builds an Arrow table and writes it as one Parquet part (see
:mod:`.schema`). The engine thread never waits for the disk: when the writer falls
:data:`MAX_PENDING` parts behind, further rows are dropped and counted (``dropped_rows`` in the
node's metadata) rather than piling up in memory. A writer that fails stops recording; the
failure surfaces as an :class:`~adapm.errors.AdaPMError` from ``node.stats()`` and
``node.shutdown()`` of that node, naming the rank and the file.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
from collections.abc import Callable

import numpy as np

from .._native_loader import name_thread
from ..errors import AdaPMError, ConfigError
from . import schema

FLUSH_S = 1.0           # at most this long between parts: a crash loses about this much
FLUSH_ROWS = 1 << 18    # or this many buffered event rows (about 8 MB of columns)
MAX_PENDING = 16        # parts queued for the writer before rows are dropped
SAMPLE_SEED = 0         # of trace_keys=N
MAX_LISTED = 100_000    # recorded keys listed in the metadata at most
# node.stats()'s per-kind traffic counters: they go to the traffic table, one row per kind.
_PER_KIND = re.compile(r"(messages|bytes)_(sent|received)_(\w+)")
_FLOAT_STATS = ("remote_access_share", "access_wait_s", "mean_staleness_ms", "mean_round_ms",
                "engine_cpu_s")


def selection(config) -> np.ndarray | None:
    """The keys ``config.trace_keys`` selects (sorted int64), or None for all keys. A sample
    of N keys is drawn with a fixed seed: the same keys on every node and in every run."""
    keys = config.trace_keys
    if isinstance(keys, str):
        return None
    if isinstance(keys, int):
        if keys >= config.num_keys:
            return None
        rng = np.random.default_rng(SAMPLE_SEED)
        return np.sort(rng.choice(config.num_keys, keys, replace=False)).astype(np.int64)
    return np.asarray(keys, dtype=np.int64)


class TraceRecorder:
    """Records this node's events for ``selection`` (sorted int64 keys, or None for all keys)
    under ``directory``. ``node_stats`` returns the node's statistics (called on the engine
    thread once per round: it must be quick). Methods ``on_keys``/``on_round`` are called on
    the engine thread only; ``close`` and ``check`` from any one thread."""

    def __init__(self, directory: str, rank: int, meta: dict,
                 selection: np.ndarray | None, node_stats: Callable[[], dict]) -> None:
        import pyarrow  # noqa: F401 - fail here, in init, when pyarrow is missing

        self.directory = directory
        self.rank = rank
        self.selection = selection
        self.node_stats = node_stats
        # Engine times are time.monotonic(); the trace holds wall-clock times, comparable
        # between nodes (as far as their clocks agree).
        self.wall_offset = time.time() - time.monotonic()
        self._events: list[tuple] = []
        self._event_rows = 0
        self._rounds: list[dict] = []
        self._marks: list[tuple] = []  # (wall time, label, stats), from any thread
        self._marks_lock = threading.Lock()
        self._epoch_open: int | None = None  # the epoch between its start and end marks
        self._epoch_last = 0                  # the highest epoch marked
        self._epoch_auto = False              # the open epoch was numbered here
        self.round_columns: dict | None = None  # at the first round (the engine is up)
        self._last_flush = time.monotonic()
        self._parts = {kind: 0 for kind in schema.KINDS}
        self._traffic_last: dict = {}  # kind -> its last written counters (the writer's)
        self.dropped_rows = 0
        self.error: BaseException | None = None
        self._closed = False
        self.meta = {"format": schema.FORMAT, "version": schema.VERSION, **meta,
                     "started": time.time()}
        # Which keys a reader may ask about (Trace.location and the rest refuse the others):
        # null for all, else the list, unless too long for a JSON file (then not checked).
        if selection is None or len(selection) <= MAX_LISTED:
            self.meta["recorded_keys"] = None if selection is None else selection.tolist()
        try:
            earlier = schema.earlier_trace(directory, rank, meta.get("world_size", 1))
        except OSError as exc:
            raise ConfigError(f"trace_dir {directory!r}: cannot read it ({exc})") from exc
        if earlier is not None:
            raise ConfigError(f"trace_dir {directory!r} holds an earlier job's trace ({earlier}):"
                              f" a trace needs a directory of its own (choose a new one, or "
                              f"remove that trace)")
        try:
            for kind in schema.KINDS:
                os.makedirs(os.path.join(directory, kind), exist_ok=True)
            self._write_meta()
        except OSError as exc:
            raise ConfigError(f"trace_dir {directory!r}: cannot write a trace there ({exc})") \
                from exc
        self._queue: queue.Queue = queue.Queue(MAX_PENDING)
        self._writer = threading.Thread(target=self._write_loop, name=f"adapm-trace-{rank}",
                                        daemon=True)
        self._writer.start()

    # --- the engine thread's side ---------------------------------------------------------

    def on_keys(self, event, keys: np.ndarray, now: float, clock: int, peer: int) -> None:
        # The engine's arrays are ours to keep (see adapm._engine.stream): no copy here, and
        # the selection is applied by the writer, in bulk: this runs many times per round.
        if len(keys):
            self._events.append((keys, int(event), now, clock, peer))
            self._event_rows += len(keys)
            if self._event_rows >= FLUSH_ROWS:
                self._flush()

    def on_round(self, record) -> None:
        row = {"round": record.number, "channel": record.channel,
               "start": record.start + self.wall_offset,
               "end": record.end + self.wall_offset, "empty": record.empty, "final": False}
        stats = self.node_stats()
        if self.round_columns is None:
            self.round_columns = _round_columns(stats)
        row.update(_numeric(stats))
        self._rounds.append(row)
        if record.end - self._last_flush >= FLUSH_S:
            self._flush()

    def mark(self, label: str, stats: dict) -> None:
        """A named point in time (e.g. "epoch 3 start") with the node's statistics then, from
        any thread; written with the next part.

        ``"epoch start"`` and ``"epoch end"`` (no number; adapm.torch.IntentLoader's) are
        numbered here: the epoch after the highest one marked so far. Inside an epoch that the
        program marked itself they are left out, so a script's own (e.g. resumed) numbering
        wins and no epoch is marked twice."""
        with self._marks_lock:
            if label in ("epoch start", "epoch end"):
                label = self._number_epoch(label == "epoch start")
                if label is None:
                    return
            else:
                parts = label.split()
                if len(parts) == 3 and parts[0] == "epoch" and parts[1].isdigit() and \
                        parts[2] in ("start", "end"):
                    number = int(parts[1])
                    self._epoch_last = max(self._epoch_last, number)
                    self._epoch_open = number if parts[2] == "start" else None
                    self._epoch_auto = False
            self._marks.append((time.time(), label, _numeric(stats)))

    def _number_epoch(self, start: bool) -> str | None:
        """The label of an unnumbered epoch mark, or None to leave it out (see mark)."""
        if start:
            if self._epoch_open is not None:
                return None
            self._epoch_last += 1
            self._epoch_open, self._epoch_auto = self._epoch_last, True
            return f"epoch {self._epoch_last} start"
        if self._epoch_open is None or not self._epoch_auto:
            return None
        number, self._epoch_open, self._epoch_auto = self._epoch_open, None, False
        return f"epoch {number} end"

    def _flush(self, wait: bool = False) -> None:
        """Hand the buffered rows to the writer: on the engine thread without waiting (rows
        are dropped and counted when it is MAX_PENDING parts behind); at close, waiting."""
        self._last_flush = time.monotonic()
        with self._marks_lock:
            marks, self._marks = self._marks, []
        for kind, rows, count in (("events", self._events, self._event_rows),
                                  ("rounds", self._rounds, len(self._rounds)),
                                  ("marks", marks, len(marks))):
            if not rows:
                continue
            if self.error is None:
                try:
                    self._queue.put((kind, rows), block=wait)
                except queue.Full:
                    self.dropped_rows += count
            else:
                self.dropped_rows += count
        self._events, self._event_rows, self._rounds = [], 0, []

    # --- the writer thread --------------------------------------------------------------------

    def _write_loop(self) -> None:
        name_thread("adapm-trace")
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, rows = item
            if self.error is not None:
                continue
            try:
                if kind == "events":
                    self._write_part(kind, self._events_table(rows))
                elif kind == "rounds":
                    self._write_part(kind, self._rounds_table(rows))
                    traffic = self._traffic_table(rows)
                    if traffic is not None:
                        self._write_part("traffic", traffic)
                else:
                    self._write_part(kind, self._marks_table(rows))
            except BaseException as exc:  # surfaces in the caller's thread via check()
                self.error = exc

    def _events_table(self, rows: list[tuple]):
        import pyarrow as pa

        lengths = np.array([len(r[0]) for r in rows])
        keys = np.concatenate([r[0] for r in rows]).astype(np.int64, copy=False)
        keep = slice(None)
        if self.selection is not None:  # the traced keys only
            at = np.searchsorted(self.selection, keys)
            at[at == len(self.selection)] = 0
            keep = self.selection[at] == keys if len(self.selection) else \
                np.zeros(len(keys), dtype=bool)
        names = pa.array(schema.EVENTS, type=pa.string())
        codes = np.repeat(np.array([r[1] for r in rows], dtype=np.int8) - 1, lengths)[keep]
        keys = keys[keep]
        return pa.table({
            "time": _times(np.repeat(np.array([r[2] for r in rows]) + self.wall_offset,
                                     lengths)[keep]),
            "clock": np.repeat(np.array([r[3] for r in rows], dtype=np.int64), lengths)[keep],
            "rank": np.full(len(keys), self.rank, dtype=np.int32),
            "key": keys,
            "event": pa.DictionaryArray.from_arrays(pa.array(codes), names),
            "peer": np.repeat(np.array([r[4] for r in rows], dtype=np.int32), lengths)[keep],
        })

    def _rounds_table(self, rows: list[dict]):
        import pyarrow as pa

        columns = {"rank": np.full(len(rows), self.rank, dtype=np.int32),
                   "round": np.array([r["round"] for r in rows], dtype=np.int64),
                   "channel": np.array([r["channel"] for r in rows], dtype=np.int32),
                   "start": _times(np.array([r["start"] for r in rows])),
                   "end": _times(np.array([r["end"] for r in rows])),
                   "empty": np.array([r["empty"] for r in rows], dtype=bool),
                   "final": np.array([r["final"] for r in rows], dtype=bool)}
        for name, kind in self.round_columns.items():
            columns[name] = np.array([r.get(name, 0) for r in rows], dtype=kind)
        return pa.table(columns)

    def _traffic_table(self, rows: list[dict]):
        """Per message kind, its counters at each round where they changed (every kind at the
        final row); None when none changed."""
        import pyarrow as pa

        out = {name: [] for name in schema.TRAFFIC_COLUMNS}
        for row in rows:
            kinds: dict = {}
            for name, value in row.items():
                match = _PER_KIND.fullmatch(name)
                if match:
                    what, direction, kind = match.groups()
                    kinds.setdefault(kind, {})[f"{what}_{direction}"] = int(value)
            for kind in sorted(kinds):
                counts = tuple(kinds[kind].get(c, 0) for c in schema.TRAFFIC_COUNTS)
                if counts == self._traffic_last.get(kind) and not row["final"]:
                    continue
                self._traffic_last[kind] = counts
                for name, value in zip(("time", "rank", "round", "channel", "kind"),
                                       (row["end"], self.rank, row["round"], row["channel"],
                                        kind)):
                    out[name].append(value)
                for name, value in zip(schema.TRAFFIC_COUNTS, counts):
                    out[name].append(value)
        if not out["kind"]:
            return None
        return pa.table({
            "time": _times(np.array(out["time"])),
            "rank": np.array(out["rank"], dtype=np.int32),
            "round": np.array(out["round"], dtype=np.int64),
            "channel": np.array(out["channel"], dtype=np.int32),
            "kind": pa.array(out["kind"], pa.string()),
            **{name: np.array(out[name], dtype=np.int64) for name in schema.TRAFFIC_COUNTS}})

    def _marks_table(self, rows: list[tuple]):
        import pyarrow as pa

        columns = {"time": _times(np.array([t for t, _, _ in rows])),
                   "rank": np.full(len(rows), self.rank, dtype=np.int32),
                   "label": pa.array([label for _, label, _ in rows], pa.string())}
        for name, kind in (self.round_columns or _round_columns(rows[0][2])).items():
            columns[name] = np.array([stats.get(name, 0) for _, _, stats in rows], dtype=kind)
        return pa.table(columns)

    def _write_part(self, kind: str, table) -> None:
        import pyarrow.parquet as pq

        name = schema.part_name(self.rank, self._parts[kind])
        self._parts[kind] += 1
        path = os.path.join(self.directory, kind, name)
        # hidden while written: dataset readers skip names that start with "."
        temporary = os.path.join(self.directory, kind, f".{name}.tmp")
        try:
            pq.write_table(table, temporary)
            os.replace(temporary, path)
        except OSError as exc:
            raise AdaPMError(f"rank {self.rank}: cannot write trace file {path}: {exc}") from exc

    def _write_meta(self) -> None:
        path = os.path.join(self.directory, schema.meta_name(self.rank))
        with open(path + ".tmp", "w") as f:
            json.dump(self.meta, f, indent=1)
        os.replace(path + ".tmp", path)

    # --- any thread -------------------------------------------------------------------------

    def check(self) -> None:
        """Raise the writer's failure, if any, in the caller's thread."""
        if self.error is not None:
            raise AdaPMError(f"rank {self.rank}: the trace writer failed ({self.error}); "
                             f"tracing stopped, {self.dropped_rows} rows were dropped") \
                from self.error

    def close(self, final_stats: dict | None) -> None:
        """Write what is buffered (and, after a clean run, a final row with ``final_stats``),
        wait for the writer, and complete the metadata. Call after the engine stopped."""
        if self._closed:
            return
        self._closed = True
        if final_stats is not None:
            now = time.time()
            row = {"round": -1, "channel": -1, "start": now, "end": now, "empty": True,
                   "final": True}
            row.update(_numeric(final_stats))
            if self.round_columns is None:
                self.round_columns = _round_columns(final_stats)
            self._rounds.append(row)
        self._flush(wait=True)
        self._queue.put(None)
        self._writer.join()
        self.meta.update({"finished": time.time(), "dropped_rows": self.dropped_rows,
                          "complete": final_stats is not None and self.error is None})
        try:
            self._write_meta()
        except OSError as exc:
            self.error = self.error or exc
        self.check()


def _round_columns(stats: dict) -> dict:
    """The statistics columns of the rounds and marks tables, with their dtypes: the same in
    every part (a counter that has not counted yet is 0), so that any reader takes the parts
    as one table. The documented ones (schema.ROUND_STATS) first, always; then any other
    counter the node has (not per-kind traffic: that is the traffic table's)."""
    numeric = _numeric(stats)
    columns = {name: np.float64 if name in _FLOAT_STATS else np.int64
               for name in schema.ROUND_STATS}
    for name, value in numeric.items():
        if name not in columns and not _PER_KIND.fullmatch(name):
            columns[name] = np.float64 if isinstance(value, (float, np.floating)) else np.int64
    return columns


def _times(seconds: np.ndarray):
    """Unix seconds (float64) as an Arrow timestamp array (schema.time_type())."""
    import pyarrow as pa

    micros = np.round(np.asarray(seconds, dtype=np.float64) * 1e6).astype(np.int64)
    return pa.array(micros, type=schema.time_type())


def _numeric(stats: dict) -> dict:
    return {k: v for k, v in stats.items()
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)}
