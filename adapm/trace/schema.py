"""What a trace directory holds: layout, file names and columns, shared by the recorder and the
reader. docs/traces.md is the user's description of the same (a test checks they agree).

One Parquet dataset per kind of row, each a directory with one file per node and part, so that
``pd.read_parquet(DIR / "events")``, ``pl.read_parquet(DIR / "events")`` and duckdb's
``read_parquet('DIR/events')`` read every node's rows as one table, without globs::

    DIR/node-r{r}.json             node r's metadata (format, version, rank, world_size,
                                   num_keys, management, trace_keys, recorded_keys, started;
                                   after a clean shutdown finished, dropped_rows, complete)
    DIR/events/r{r}-{part}.parquet one row per key and event  (EVENT_COLUMNS)
    DIR/rounds/r{r}-{part}.parquet one row per sync round     (ROUND_COLUMNS + ROUND_STATS)
    DIR/traffic/r{r}-{part}.parquet messages and bytes per message kind (TRAFFIC_COLUMNS)
    DIR/marks/r{r}-{part}.parquet  named points in time       (MARK_COLUMNS + ROUND_STATS)

Times are Arrow timestamps (microseconds, UTC: :data:`TIME_TYPE`). A part is written under a
hidden temporary name (``.r{r}-{part}.parquet.tmp``, which pyarrow, pandas, polars and duckdb
skip) and then renamed, so a crash loses at most the rows not yet written and readers never
see a half-written file.
"""

from __future__ import annotations

import os
import re

FORMAT = "adapm-trace"
# 1: flat directory, float Unix seconds, per-kind traffic as round columns. 2: this layout.
VERSION = 2

KINDS = ("events", "rounds", "traffic", "marks")

# The event names, in the order of adapm._engine.stream.Event's values (1, 2, ...).
EVENTS = ("alloc", "dealloc", "replica_setup", "replica_drop", "intent_start", "intent_stop",
          "remote_access")

TIME_UNIT = "us"
TIME_ZONE = "UTC"

EVENT_COLUMNS = {
    "time": "when (timestamp, UTC)",
    "clock": "the smallest clock then of the node's workers that have advanced theirs (0 before "
             "any has); for remote_access the clock of the worker whose access it was",
    "rank": "the node where it happened",
    "key": "the key",
    "event": "one of " + ", ".join(EVENTS),
    "peer": "alloc: the node the main copy came from; dealloc: where it went; replica_setup: the "
            "owner that sent it; remote_access: the node that served it; -1 otherwise",
}

ROUND_COLUMNS = {
    "rank": "the node",
    "round": "the round's number on that node (-1 for the final row); with channels, each "
             "channel numbers its own",
    "channel": "the node's engine channel that ran the round (Config.channels; 0 with one, -1 "
               "for the final row)",
    "start": "when the round started (timestamp, UTC)",
    "end": "when its answers were applied (timestamp, UTC)",
    "empty": "whether the round had nothing to send",
    "final": "True only for the row a clean shutdown adds, with the node's final statistics",
}

# The statistics columns of rounds and marks: node.stats() at the row's time, counts since
# init (DESIGN section 6). Every part has all of them (0 before a counter first counts).
ROUND_STATS = {
    "local_pull_keys": "keys pulled from a local main copy or replica",
    "waited_pull_keys": "keys pulled locally after waiting for their arrival",
    "remote_pull_keys": "keys pulled from another node (remote accesses)",
    "local_push_keys": "keys pushed locally",
    "remote_push_keys": "keys pushed to another node (remote accesses)",
    "local_set_keys": "keys set locally",
    "remote_set_keys": "keys set on another node",
    "remote_access_share": "(remote pulls + pushes) / all pulls and pushes",
    "access_wait_s": "seconds workers were blocked in pull, push and set waiting on other "
                     "nodes: for a sync round acting on a late intent, for keys on their way "
                     "here, for remote values",
    "intents_signalled": "keys of intent() calls",
    "intents_acted": "intents the action timer acted on",
    "sampled_keys": "keys drawn by prepare_sample",
    "sampled_local_keys": "drawn keys that were local at pull_sample",
    "sampled_remote_keys": "drawn keys that were pulled remotely",
    "relocations_in": "main copies that moved to this node",
    "relocations_out": "main copies that moved away",
    "replica_setups": "replicas set up here",
    "replica_setups_discarded": "replicas that arrived after the intent for them had ended",
    "replica_drops": "replicas dropped here",
    "replica_drops_at_owner": "replicas of keys owned here that their holders dropped",
    "replica_reads": "accesses that read a replica",
    "mean_staleness_ms": "mean time since a read replica's last refresh (ms)",
    "rounds": "sync rounds run",
    "empty_rounds": "rounds that had nothing to send",
    "mean_round_ms": "mean round duration (ms)",
    "engine_cpu_s": "CPU seconds of the engine thread(s)",
    "messages_sent": "messages sent (several may share one wire message)",
    "messages_received": "messages received",
    "bytes_sent": "bytes sent",
    "bytes_received": "bytes received",
    "wire_messages_sent": "wire (ZeroMQ) messages sent",
    "wire_messages_received": "wire messages received",
    "messages_served_natively": "peers' pulls, pushes and sets of keys owned here, served by "
                                "the transport in C without the engine loop",
    "syncs_served_natively": "peers' sync-round requests answered by the transport in C "
                             "without the engine loop (moves, deltas, checks and reports)",
    "pulls_sent_natively": "workers' pulls of keys held elsewhere that the transport routed, "
                           "sent and took the answers of in C, without the engine loop",
    "pushes_sent_natively": "workers' pushes of keys held elsewhere that the transport routed, "
                            "sent and took the acknowledgements of in C, without the engine "
                            "loop",
    "pushes_handed_to_engine": "workers' pushes the transport could not route (a key on its "
                               "way here, or one whose intent this node reported and whose "
                               "owner has not answered): the engine loop took them",
    "answers_taken_natively": "answers to this node's sync-round requests that the transport "
                              "took in in C without the engine loop (moves, hints, refreshes "
                              "and acknowledgements)",
    "forwarded_keys": "request entries forwarded to where their key went",
    "queued_keys": "request entries held here until their key arrived",
    "awaited_keys": "local requests that waited for a key already on its way here",
    "redirected_keys": "intent reports that reached a node no longer owning the key, or "
                       "whose owner deferred them (to report again)",
    "returned_deltas": "replica deltas that came back (the owner had moved the key here)",
    "late_answers": "answers that came after their request had finished",
    "dropped_messages": "received messages dropped as invalid (all causes)",
    "dropped_local_messages": "messages dropped by the state machine",
    "deferred_reports": "intent reports this owner deferred: their key would have left while "
                        "a worker here had it in a local sample not pushed yet",
    "dropped_malformed_messages": "wire messages that could not be decoded",
    "dropped_forged_messages": "wire messages naming another sender than their connection",
    "refused_handshakes": "connections refused at the security handshake",
}

# Per message kind, cumulative since init; a row when any of the four changed in a round
# (and in the final row), so a kind never sent has no rows.
TRAFFIC_COLUMNS = {
    "time": "the end of the round (timestamp, UTC)",
    "rank": "the node",
    "round": "the round (-1: the final row)",
    "channel": "the engine channel whose round it was (0 with one channel, -1: the final "
               "row); the counts are the node's, over every channel",
    "kind": "the message kind (pull, push, sync, sync_resp, moves, ...)",
    "messages_sent": "messages of this kind sent since init",
    "bytes_sent": "their bytes",
    "messages_received": "messages of this kind received since init",
    "bytes_received": "their bytes",
}
# The traffic table's counts (its columns after ``kind``).
TRAFFIC_COUNTS = ("messages_sent", "bytes_sent", "messages_received", "bytes_received")

MARK_COLUMNS = {
    "time": "when (timestamp, UTC)",
    "rank": "the node that marked it",
    "label": 'the label: "epoch N start" / "epoch N end" (apps, IntentLoader), or any text '
             '(node.trace_mark); "NAME start" / "NAME end" pairs are drawn as spans',
}


def meta_name(rank: int) -> str:
    return f"node-r{rank}.json"


def part_name(rank: int, part: int) -> str:
    """A part's name inside its kind's directory."""
    return f"r{rank}-{part:06d}.parquet"


_META = re.compile(r"node-r(\d+)\.json")


def earlier_trace(directory: str, rank: int, world_size: int) -> str | None:
    """What of an earlier job's trace ``directory`` holds that a node ``rank`` of a job of
    ``world_size`` nodes would write beside (its own metadata or parts, or the metadata of a
    rank this job does not have), or None. A new job's parts would replace some of the old
    ones and leave the rest: readers would take the mix for one run. Reads names only."""
    if not os.path.isdir(directory):
        return None
    names = os.listdir(directory)
    if meta_name(rank) in names:
        return meta_name(rank)
    prefix = part_name(rank, 0)[:-len("000000.parquet")]
    for kind in KINDS:
        folder = os.path.join(directory, kind)
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                if name.startswith(prefix) and name.endswith(".parquet"):
                    return os.path.join(kind, name)
    if rank == 0:
        for name in names:
            match = _META.fullmatch(name)
            if match and int(match.group(1)) >= world_size:
                return name
    return None


def time_type():
    """The Arrow type of every time column."""
    import pyarrow as pa

    return pa.timestamp(TIME_UNIT, tz=TIME_ZONE)
