"""What a trace directory holds: file names and columns, shared by the recorder and the reader.

Per node ``r`` (written by that node's recorder):

- ``node-r{r}.json``: the node's metadata (``format``, ``version``, ``rank``, ``world_size``,
  ``num_keys``, ``management``, ``trace_keys``, ``started`` and, after a clean shutdown,
  ``finished`` and ``dropped_rows``);
- ``events-r{r}-{part}.parquet``: the events, one row per key and event: ``time`` (wall clock,
  Unix seconds, float64), ``clock`` (int64: the node's smallest worker clock; for
  ``remote_access`` the clock of the worker whose access it was), ``rank`` (int32), ``key``
  (int64), ``event`` (string: one of :data:`EVENTS`) and ``peer`` (int32: for ``alloc`` the node
  the main copy came from, ``dealloc`` where it went, ``replica_setup`` the owner that sent it,
  ``remote_access`` the node that served it; -1 otherwise);
- ``rounds-r{r}-{part}.parquet``: one row per sync round: ``rank``, ``round``, ``start`` and
  ``end`` (wall clock), ``empty``, ``final`` (False; True for the row a clean shutdown adds with
  the node's final statistics), then every numeric field of ``node.stats()`` at the round's end
  (counts since ``init``: bytes and messages by kind, relocations, replica set-ups and drops,
  pulls and pushes local and remote, mean replica staleness, ...).

- ``marks-r{r}-{part}.parquet``: named points in time (``node.trace_mark(label)``): ``time``,
  ``rank``, ``label`` and the node's statistics then (the columns of the rounds); the apps mark ``epoch N start`` and ``epoch N end`` around each epoch's
  training, and ``Trace.summary(per_epoch=True)`` splits the statistics by them.

Parts are written whole, each under a temporary name and then renamed, so a crash loses at most
the rows not yet written and never leaves a half-written ``.parquet`` file. pandas, polars and
duckdb read a directory of them as one table (``pd.read_parquet(dir)`` reads both kinds:
select by file name, e.g. ``duckdb.sql("select * from 'DIR/events-*.parquet'")``).
"""

from __future__ import annotations

FORMAT = "adapm-trace"
VERSION = 1

# The event names, in the order of adapm._engine.stream.Event's values (1, 2, ...).
EVENTS = ("alloc", "dealloc", "replica_setup", "replica_drop", "intent_start", "intent_stop",
          "remote_access")

EVENT_COLUMNS = ("time", "clock", "rank", "key", "event", "peer")
ROUND_COLUMNS = ("rank", "round", "start", "end", "empty", "final")


def meta_name(rank: int) -> str:
    return f"node-r{rank}.json"


def part_name(kind: str, rank: int, part: int) -> str:
    return f"{kind}-r{rank}-{part:06d}.parquet"
