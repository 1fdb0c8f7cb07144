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


def load(directory: str) -> Trace:
    """The trace recorded under ``directory`` (every node's files). Raises TraceError for a
    missing directory, one without an adapm trace, or one recorded by an adapm with another
    trace format (record it again). A part file that cannot be read (cut off by a crash, say)
    is skipped with a warning; the rest loads (``Trace.skipped``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not os.path.isdir(directory):
        raise TraceError(f"{directory}: no such trace directory")
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
        metas.append(meta)
    if not metas:
        raise TraceError(f"{directory}: not an adapm trace (no node-r*.json: record one with "
                         "Config(trace_dir=...) or an app's --trace-dir)")
    metas.sort(key=lambda m: m["rank"])
    world = {m["world_size"] for m in metas}
    if len(world) != 1 or {m["num_keys"] for m in metas}.__len__() != 1:
        raise TraceError(f"{directory}: the nodes' metadata disagree (several jobs in one "
                         "directory?)")
    skipped = []
    tables = {}
    for kind in schema.KINDS:
        parts = []
        for path in sorted(glob.glob(os.path.join(directory, kind, "r*-*.parquet"))):
            try:
                parts.append(pq.read_table(path))
            except (OSError, pa.ArrowException) as exc:
                warnings.warn(f"adapm.trace: skipping {path}: {exc}", stacklevel=2)
                skipped.append(path)
        tables[kind] = pa.concat_tables(parts, promote_options="default") if parts else None
    return Trace(directory, metas, tables["events"], tables["rounds"], skipped, tables["marks"],
                 tables["traffic"])


class Trace:
    """A loaded trace: ``events``, ``rounds``, ``traffic`` and ``marks`` (Arrow tables, every
    node's rows, columns as in adapm.trace.schema and docs/traces.md; ``events`` and ``marks``
    sorted by time; ``traffic`` and ``marks`` None when there were none), ``nodes`` (each
    node's metadata), ``world_size``, ``num_keys``, ``start`` and ``end`` (UTC datetimes: the
    first node's start, the last node's end or last event), ``skipped`` (part files that could
    not be read)."""

    def __init__(self, directory: str, nodes: list, events, rounds, skipped: list,
                 marks=None, traffic=None) -> None:
        import pyarrow as pa

        self.directory = directory
        self.nodes = nodes
        self.world_size = int(nodes[0]["world_size"])
        self.num_keys = int(nodes[0]["num_keys"])
        self.skipped = skipped
        if events is None:
            events = pa.table({"time": pa.array([], schema.time_type()),
                               "clock": pa.array([], pa.int64()),
                               "rank": pa.array([], pa.int32()), "key": pa.array([], pa.int64()),
                               "event": pa.array([], pa.string()),
                               "peer": pa.array([], pa.int32())})
        else:
            events = events.set_column(events.schema.get_field_index("event"), "event",
                                       events["event"].cast(pa.string()))
        self.events = events.sort_by([("time", "ascending")])
        self.rounds = rounds
        self.traffic = traffic
        self.marks = marks.sort_by([("time", "ascending")]) if marks is not None else None
        self._times = _micros(self.events["time"])  # int64 µs since the epoch, for queries
        self._start = int(round(min(m["started"] for m in nodes) * 1e6))
        ends = [int(round(m["finished"] * 1e6)) for m in nodes if m.get("finished")] + \
            ([int(self._times.max())] if len(self._times) else [])
        self._end = max(ends) if ends else self._start
        self._keys = self.events["key"].to_numpy()
        # The recorded keys (sorted), None for all, or False where the metadata does not say.
        listed = nodes[0].get("recorded_keys", False)
        self._recorded = np.asarray(listed, dtype=np.int64) if listed else listed
        self._names = np.asarray(self.events["event"].to_numpy(zero_copy_only=False))

    def __repr__(self) -> str:
        return (f"<adapm.trace.Trace {self.directory!r}: {self.world_size} nodes, "
                f"{len(self.events)} events>")

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
        try:
            key = int(key)
        except (TypeError, ValueError):
            raise TraceError(f"key must be an int, got {key!r}") from None
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

    def timeline(self, key):
        """The events of ``key`` on every node, in time order (an Arrow table)."""
        key = self._check_key(key)
        return self.events.filter(self._mask(key))

    def _mask(self, key: int):
        import pyarrow as pa

        return pa.array(self._keys == key)

    def location(self, key, at=None) -> int:
        """The rank holding ``key``'s main copy at time ``at`` (default: the trace's end; a
        datetime, numpy.datetime64 or Unix seconds): its home, or the node of the last
        ``alloc`` of it up to then."""
        key = self._check_key(key)
        rows = self._rows(key, ("alloc",), None if at is None else _to_micros(at))
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
        mask = (self._keys == key) & np.isin(self._names, names)
        times = self._times[mask]
        ranks = self.events["rank"].to_numpy()[mask]
        kinds = self._names[mask]
        if at is not None:
            keep = times <= at
            times, ranks, kinds = times[keep], ranks[keep], kinds[keep]
        return [(int(t), int(r), str(k)) for t, r, k in zip(times, ranks, kinds)]

    def hot_keys(self, n: int) -> np.ndarray:
        """The ``n`` keys with the most events (placement activity and remote accesses; local
        accesses are not events), most first."""
        if not len(self._keys):
            return np.empty(0, dtype=np.int64)
        keys, counts = np.unique(self._keys, return_counts=True)
        order = np.lexsort((keys, -counts))
        return keys[order[:n]]

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
