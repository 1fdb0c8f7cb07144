"""Reading a trace directory and answering placement questions about it (``adapm.trace.load``).

The tables' times are Arrow timestamps (UTC, microseconds); the query methods return
timezone-aware ``datetime`` objects and take a ``datetime`` (naive ones are read as UTC), a
``numpy.datetime64`` or pandas ``Timestamp``, or Unix seconds (int or float). A key starts at its home node
(``key % world_size``) as the main copy; ``alloc`` events move the main copy, ``replica_setup``
and ``replica_drop`` open and close replica intervals (a replica that becomes the main copy ends
its interval with the ``alloc``).
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import math
import numbers
import os
import warnings

import numpy as np

from .. import __version__
from ..errors import AdaPMError
from . import schema

# What summary() shows per node, from the node's final statistics (or its last round's).
SUMMARY_COUNTS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received",
                  "relocations_in", "relocations_out", "replica_setups", "replica_drops",
                  "local_pull_keys", "waited_pull_keys", "remote_pull_keys", "local_push_keys",
                  "remote_push_keys", "replica_reads", "rounds")


class TraceError(AdaPMError):
    """A directory that is not a readable adapm trace."""


# Each node's metadata must have these (numbers); the rest is read where it is there.
_REQUIRED = ("rank", "world_size", "num_keys", "started")


def load(directory: str) -> Trace:
    """The trace recorded under ``directory`` (every node's files). Raises TraceError for a
    missing directory, one without an adapm trace, or one recorded by an adapm with another
    trace format (record it again). A part file that cannot be read (cut off by a crash, say)
    is skipped with a warning, and so is a node whose metadata file is missing; the rest loads
    (``Trace.skipped``).

    Cheap for any size of trace: the rounds, marks and traffic tables are read now, the events
    (most of a trace) when first used (``Trace.events``, the per-key queries, ``hot_keys``);
    ``summary()`` never reads them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not os.path.exists(directory):
        raise TraceError(f"{directory}: no such trace directory")
    if not os.path.isdir(directory):
        raise TraceError(f"{directory}: not a directory (a trace is the directory an app's "
                         "--trace-dir or Config(trace_dir=...) names)")
    metas = []
    for path in sorted(glob.glob(os.path.join(directory, "node-r*.json"))):
        try:
            with open(path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as exc:
            raise TraceError(f"{path}: unreadable trace metadata ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != schema.FORMAT:
            raise TraceError(f"{path}: not adapm trace metadata (no format {schema.FORMAT!r})")
        if meta.get("version") != schema.VERSION:
            raise TraceError(f"{path}: trace format version {meta.get('version')}, this adapm "
                             f"{__version__} reads version {schema.VERSION} only (one Parquet "
                             "directory per table, timestamps): record the trace again")
        lacking = [name for name in _REQUIRED if isinstance(meta.get(name), bool)
                   or not isinstance(meta.get(name), (int, float))]
        if lacking:
            raise TraceError(f"{path}: damaged trace metadata (no number for "
                             f"{', '.join(lacking)})")
        metas.append(meta)
    if not metas:
        raise TraceError(f"{directory}: not an adapm trace (no node-r*.json: record one with "
                         "Config(trace_dir=...) or an app's --trace-dir)")
    metas.sort(key=lambda m: m["rank"])
    world = {m["world_size"] for m in metas}
    ranks = [m["rank"] for m in metas]
    if len(world) != 1 or len({m["num_keys"] for m in metas}) != 1 or \
            len(set(ranks)) != len(ranks) or not all(0 <= r < metas[0]["world_size"]
                                                      for r in ranks):
        raise TraceError(f"{directory}: the nodes' metadata disagree (several jobs in one "
                         "directory?)")
    absent = sorted(set(range(int(metas[0]["world_size"]))) - set(ranks))
    if absent:
        warnings.warn(f"adapm.trace: {directory}: no metadata of node "
                      f"{', '.join(map(str, absent))} ({schema.meta_name(absent[0])}"
                      f"{' and more' if len(absent) > 1 else ''}): its rows load, its start "
                      "and end do not count", stacklevel=2)
    skipped = []
    tables = {}
    for kind in ("rounds", "traffic", "marks"):
        parts = []
        for path in _parts(directory, kind):
            try:
                parts.append(pq.read_table(path))
            except (OSError, pa.ArrowException) as exc:
                _skip(path, exc, skipped)
        tables[kind] = pa.concat_tables(parts, promote_options="default") if parts else None
    events = _EventParts()
    for path in _parts(directory, "events"):
        try:  # the footer only: a part cut off by a crash fails here
            events.add(path, pq.ParquetFile(path).metadata)
        except (OSError, pa.ArrowException) as exc:
            _skip(path, exc, skipped)
    return Trace(directory, metas, events, tables["rounds"], skipped, tables["marks"],
                 tables["traffic"])


def _parts(directory: str, kind: str) -> list:
    return sorted(glob.glob(os.path.join(directory, kind, "r*-*.parquet")))


def _skip(path: str, exc: BaseException, skipped: list) -> None:
    warnings.warn(f"adapm.trace: skipping {path}: {exc}", stacklevel=3)
    skipped.append(path)


class _EventParts:
    """The events' part files, their row count and latest time, from their footers."""

    def __init__(self) -> None:
        self.paths: list = []
        self.rows = 0
        self.latest: int | None = None  # µs since the epoch; None: no statistics said

    def add(self, path: str, metadata) -> None:
        latest = None
        column = metadata.schema.names.index("time") if "time" in metadata.schema.names else -1
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(column).statistics if column >= 0 else None
            if stats is None or not stats.has_min_max:
                latest = None
                break
            latest = stats.max_raw if latest is None else max(latest, stats.max_raw)
        if latest is None and metadata.num_rows:
            import pyarrow.parquet as pq

            times = _micros(pq.read_table(path, columns=["time"])["time"])
            latest = int(times.max()) if len(times) else None
        self.paths.append(path)
        self.rows += metadata.num_rows
        if latest is not None:
            self.latest = int(latest) if self.latest is None else max(self.latest, int(latest))

    def read(self, skipped: list):
        """The events of every part that reads (the others skipped, with a warning)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        parts = []
        for path in self.paths:
            try:
                parts.append(pq.read_table(path))
            except (OSError, pa.ArrowException) as exc:
                _skip(path, exc, skipped)
        return pa.concat_tables(parts, promote_options="default") if parts else None


class Trace:
    """A loaded trace: ``events``, ``rounds``, ``traffic`` and ``marks`` (Arrow tables, every
    node's rows, columns as in adapm.trace.schema and docs/traces.md; ``events`` and ``marks``
    sorted by time; ``traffic`` and ``marks`` None when there were none), ``nodes`` (each
    node's metadata), ``world_size``, ``num_keys``, ``start`` and ``end`` (UTC datetimes: the
    first node's start, the last node's end or last event), ``num_events``, ``skipped`` (part
    files that could not be read).

    The events are read from their files when first used, and the per-key queries
    (``location``, ``replicas``, ``timeline``) index them by key once: O(log n) each after."""

    def __init__(self, directory: str, nodes: list, events, rounds, skipped: list,
                 marks=None, traffic=None) -> None:
        """``events``: an Arrow table, None, or the part files to read when first used."""
        self.directory = directory
        self.nodes = nodes
        self.world_size = int(nodes[0]["world_size"])
        self.num_keys = int(nodes[0]["num_keys"])
        self.skipped = skipped
        self.rounds = rounds
        self.traffic = traffic
        self.marks = marks.sort_by([("time", "ascending")]) if marks is not None else None
        self._parts = events if isinstance(events, _EventParts) else None
        self._events = None if self._parts is not None else self._prepare(events)
        self._by_key = None  # (order, sorted keys): the events by key, built at the first query
        self._start = int(round(min(m["started"] for m in nodes) * 1e6))
        latest = self._parts.latest if self._parts is not None else (
            int(self._times.max()) if len(self._times) else None)
        ends = [int(round(m["finished"] * 1e6)) for m in nodes if m.get("finished")] + \
            ([latest] if latest is not None else [])
        self._end = max(ends) if ends else self._start
        # The recorded keys (sorted), None for all, or False where the metadata does not say.
        listed = nodes[0].get("recorded_keys", False)
        self._recorded = np.asarray(listed, dtype=np.int64) if listed else listed

    def _prepare(self, events):
        import pyarrow as pa
        import pyarrow.compute as pc

        if events is None:
            events = pa.table({"time": pa.array([], schema.time_type()),
                               "clock": pa.array([], pa.int64()),
                               "rank": pa.array([], pa.int32()), "key": pa.array([], pa.int64()),
                               "event": pa.array([], pa.string()),
                               "peer": pa.array([], pa.int32())})
        else:
            events = events.set_column(events.schema.get_field_index("event"), "event",
                                       events["event"].cast(pa.string()))
        events = events.sort_by([("time", "ascending")])
        self._times = _micros(events["time"])  # int64 µs since the epoch, for queries
        self._keys = events["key"].to_numpy()
        self._ranks = events["rank"].to_numpy()
        # each event's name as its index in schema.EVENTS (one byte, not a Python string)
        self._codes = pc.index_in(events["event"], value_set=pa.array(schema.EVENTS)) \
            .fill_null(-1).to_numpy().astype(np.int8)
        return events

    @property
    def events(self):
        """Every node's events in time order (an Arrow table; read when first used)."""
        if self._events is None:
            self._events = self._prepare(self._parts.read(self.skipped))
        return self._events

    @property
    def num_events(self) -> int:
        """How many events the trace holds (from the files' footers until they are read)."""
        return len(self._events) if self._events is not None else self._parts.rows

    def __repr__(self) -> str:
        return (f"<adapm.trace.Trace {self.directory!r}: {self.world_size} nodes, "
                f"{self.num_events} events>")

    @property
    def start(self) -> dt.datetime:
        return _datetime(self._start)

    @property
    def end(self) -> dt.datetime:
        return _datetime(self._end)

    @property
    def duration_s(self) -> float:
        """Seconds from ``start`` to ``end``."""
        return (self._end - self._start) / 1e6

    def to_pandas(self):
        """The events as a pandas DataFrame (needs pandas)."""
        return self.events.to_pandas()

    def seconds(self, when) -> float:
        """``when`` (see the module docstring for what it may be) in seconds since ``start``."""
        return (_to_micros(when) - self._start) / 1e6

    # --- one key ----------------------------------------------------------------------------

    def _check_key(self, key) -> int:
        if isinstance(key, bool) or not isinstance(key, numbers.Integral):
            raise TraceError(f"key must be an int, got {key!r}")
        key = int(key)
        if not 0 <= key < self.num_keys:
            raise TraceError(f"key {key} is outside [0, {self.num_keys})")
        recorded = self._recorded
        if recorded is not False and recorded is not None:
            at = int(np.searchsorted(recorded, key))
            if at == len(recorded) or recorded[at] != key:
                raise TraceError(f"key {key} was not recorded: the trace holds the events of "
                                 f"{len(recorded)} keys (trace_keys="
                                 f"{self.nodes[0].get('trace_keys')!r}); record the key too "
                                 "for its location, replicas and timeline")
        return key

    def _check_time(self, at) -> int:
        micros = _to_micros(at)
        if not self._start <= micros <= self._end:
            raise TraceError(f"time {at!r} is outside the trace ({self.start.isoformat()} to "
                             f"{self.end.isoformat()})")
        return micros

    def _of_key(self, key: int) -> np.ndarray:
        """The positions of ``key``'s events in ``events``, in time order."""
        if self._by_key is None:
            self.events  # noqa: B018 (read the files)
            order = np.argsort(self._keys, kind="stable")  # stable: time order within a key
            self._by_key = (order, self._keys[order])
        order, keys = self._by_key
        return order[np.searchsorted(keys, key, "left"):np.searchsorted(keys, key, "right")]

    def timeline(self, key):
        """The events of ``key`` on every node, in time order (an Arrow table)."""
        return self.events.take(self._of_key(self._check_key(key)))

    def location(self, key, at=None) -> int:
        """The rank holding ``key``'s main copy at time ``at`` (default: the trace's end; a
        datetime, numpy.datetime64 or Unix seconds within the trace, ``start`` to ``end``):
        its home, or the node of the last ``alloc`` of it up to then."""
        key = self._check_key(key)
        rows = self._rows(key, ("alloc",), None if at is None else self._check_time(at))
        return int(rows[-1][1]) if rows else key % self.world_size

    def replicas(self, key) -> dict:
        """``{rank: [(start, end), ...]}``: when each node held a replica of ``key`` (UTC
        datetimes; an interval still open at the trace's end ends there)."""
        return {rank: [(_datetime(a), _datetime(b)) for a, b in spans]
                for rank, spans in self._replica_spans(key).items()}

    def _replica_spans(self, key) -> dict:
        """replicas() in µs since the epoch."""
        key = self._check_key(key)
        out: dict = {}
        open_at: dict = {}
        for time, rank, name in self._rows(key, ("replica_setup", "replica_drop", "alloc"), None):
            if name == "replica_setup":
                open_at[rank] = time
            elif rank in open_at:  # replica_drop, or the replica became the main copy
                out.setdefault(rank, []).append((open_at.pop(rank), time))
        for rank, time in open_at.items():
            out.setdefault(rank, []).append((time, self._end))
        return {rank: sorted(spans) for rank, spans in sorted(out.items())}

    def _rows(self, key: int, names: tuple, at: int | None) -> list:
        """(time in µs since the epoch, rank, event) of ``key``'s events named ``names``, up
        to ``at`` (µs; None: all)."""
        at_key = self._of_key(key)
        codes = [schema.EVENTS.index(name) for name in names]
        at_key = at_key[np.isin(self._codes[at_key], codes)]
        if at is not None:
            at_key = at_key[self._times[at_key] <= at]
        return [(int(self._times[i]), int(self._ranks[i]), schema.EVENTS[self._codes[i]])
                for i in at_key]

    def hot_keys(self, n: int) -> np.ndarray:
        """The ``n`` keys (a positive int) with the most events (placement activity and
        remote accesses; local accesses are not events), most first."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise TraceError(f"hot_keys: n must be a positive int, got {n!r}")
        self.events  # noqa: B018 (read the files)
        if not len(self._keys):
            return np.empty(0, dtype=np.int64)
        keys, counts = np.unique(self._keys, return_counts=True)
        order = np.lexsort((keys, -counts))
        return keys[order[:int(n)]]

    # --- the nodes ----------------------------------------------------------------------------

    def summary(self, per_epoch: bool = False):
        """Per node and in total (an Arrow table, one row per node and a ``total`` row): bytes
        and messages sent and received, relocations in and out, replica set-ups and drops, the
        mean replica staleness (ms, averaged over replica reads) and the remote-access share
        (remote pulled and pushed keys over all), from each node's final statistics (or its
        last round's, for a node that did not shut down cleanly: ``complete`` False).

        ``per_epoch``: the same per epoch (an ``epoch`` column), between each node's
        ``"epoch N start"`` and ``"epoch N end"`` marks (the apps and IntentLoader set them
        around training), from the statistics each mark recorded."""
        import pyarrow as pa

        if self.rounds is None or not len(self.rounds):
            raise TraceError(f"{self.directory}: the trace has no statistics rows")
        by_rank: dict = {}
        for row in self.rounds.to_pylist():
            by_rank.setdefault(row["rank"], []).append(row)
        for rows in by_rank.values():  # rounds in time order, the final row last
            rows.sort(key=lambda r: (r["final"], r["end"]))
        if not per_epoch:
            table = [_entry(str(rank), rows[-1], None, bool(rows[-1]["final"]))
                     for rank, rows in sorted(by_rank.items())]
            return pa.Table.from_pylist(table + [_total("total", table)])
        table = []
        for epoch, windows in self._epochs().items():
            # each node's statistics as its marks recorded them (a node that runs no rounds,
            # a single one, has only those)
            entries = [_entry(str(rank), end, start, True)
                       for rank, (start, end) in sorted(windows.items())]
            table += [{"epoch": epoch, **e} for e in entries + [_total("total", entries)]]
        if not table:
            raise TraceError(f"{self.directory}: no epochs marked (\"epoch N start\" / "
                             "\"epoch N end\" marks; the apps set them)")
        return pa.Table.from_pylist(table)

    def _epochs(self) -> dict:
        """{epoch: {rank: (start mark row, end mark row)}} from the marks."""
        return {int(name.split()[1]): ranks for name, ranks in self._span_marks().items()
                if name.startswith("epoch ") and name.split()[1].isdigit()
                and len(name.split()) == 2}

    def spans(self) -> dict:
        """``{name: {rank: (start, end)}}`` from the ``"NAME start"`` / ``"NAME end"`` marks
        (e.g. ``"epoch 3"``), in the order they started, as UTC datetimes. Marks of the same
        span repeated on a node (a script's own around IntentLoader's) give the widest span:
        the first start, the last end. A span without its end is left out."""
        return {name: {rank: (a["time"], b["time"]) for rank, (a, b) in ranks.items()}
                for name, ranks in self._span_marks().items()}

    def _span_marks(self) -> dict:
        """spans(), with the mark rows (time, label, statistics) instead of times."""
        out: dict = {}
        if self.marks is None:
            return out
        for row in self.marks.to_pylist():  # in time order
            name, _, edge = row["label"].rpartition(" ")
            if not name or edge not in ("start", "end"):
                continue
            span = out.setdefault(name, {}).setdefault(row["rank"], [None, None])
            if edge == "start":
                span[0] = span[0] or row
            else:
                span[1] = row
        done = {name: {rank: tuple(span) for rank, span in sorted(ranks.items())
                       if None not in span} for name, ranks in out.items()}
        done = {name: ranks for name, ranks in done.items() if ranks}
        return dict(sorted(done.items(), key=lambda item: min(s["time"] for s, _ in
                                                              item[1].values())))


def _micros(column) -> np.ndarray:
    """An Arrow timestamp column as int64 µs since the epoch."""
    import pyarrow as pa

    column = column.cast(schema.time_type())
    return np.asarray(column.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def _datetime(micros: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=micros)


def _to_micros(when) -> int:
    """A time given as a datetime (naive: UTC), numpy.datetime64 or Unix seconds, in µs."""
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(when, np.datetime64):
        return int(when.astype("datetime64[us]").astype(np.int64))
    if isinstance(when, numbers.Real) and not isinstance(when, bool):
        if not math.isfinite(float(when)):
            raise TraceError(f"a time must be finite, got {when!r}")
        return int(round(float(when) * 1e6))
    raise TraceError(f"a time must be a datetime, numpy.datetime64 or Unix seconds, got "
                     f"{when!r}")


def _entry(node: str, row: dict | None, since: dict | None, complete: bool) -> dict:
    """A summary row: ``row``'s counters less those of ``since`` (None: since init)."""
    entry = {"node": node, "complete": complete}
    for name in SUMMARY_COUNTS:
        entry[name] = int((row or {}).get(name) or 0) - int((since or {}).get(name) or 0)
    # staleness: a mean over replica reads, so windows take the difference of the sums
    def stale_sum(r):
        return float((r or {}).get("mean_staleness_ms") or 0.0) * int((r or {}).get(
            "replica_reads") or 0)
    reads = entry["replica_reads"]
    entry["mean_staleness_ms"] = (stale_sum(row) - stale_sum(since)) / reads if reads else 0.0
    return _shares(entry)


def _total(node: str, entries: list) -> dict:
    total = {"node": node, "complete": all(e["complete"] for e in entries)}
    total.update({name: sum(e[name] for e in entries) for name in SUMMARY_COUNTS})
    reads = total["replica_reads"]
    total["mean_staleness_ms"] = (sum(e["mean_staleness_ms"] * e["replica_reads"]
                                      for e in entries) / reads) if reads else 0.0
    return _shares(total)


def _shares(entry: dict) -> dict:
    remote = entry["remote_pull_keys"] + entry["remote_push_keys"]
    accessed = remote + entry["local_pull_keys"] + entry["waited_pull_keys"] + \
        entry["local_push_keys"]
    entry["remote_access_share"] = remote / accessed if accessed else 0.0
    return entry
