"""The ``adapm`` command: ``adapm trace summary DIR [--json]``, ``adapm trace plot DIR (--key K |
--hot N) -o out.png``. Exit codes: 0 done, 1 done from a damaged trace (a warning on stderr
names each part or node file it went without), 2 bad usage or an unreadable trace (the message
names the directory or file)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Optional

from . import __version__
from ._argtypes import non_negative_int, positive_int

# summary's table: column title, field, format
_COLUMNS = (("node", "node", "{}"), ("MB sent", "bytes_sent", "{:.2f}"),
            ("MB recv", "bytes_received", "{:.2f}"), ("msgs sent", "messages_sent", "{:,}"),
            ("msgs recv", "messages_received", "{:,}"), ("reloc in", "relocations_in", "{:,}"),
            ("reloc out", "relocations_out", "{:,}"), ("replica set-ups", "replica_setups", "{:,}"),
            ("replica drops", "replica_drops", "{:,}"),
            ("staleness ms", "mean_staleness_ms", "{:.2f}"),
            ("remote share", "remote_access_share", "{:.4%}"))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="adapm", description="adapm's command line tools")
    p.add_argument("--version", action="version", version=f"adapm {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    trace = sub.add_parser("trace", help="read parameter-placement traces (adapm.trace)")
    what = trace.add_subparsers(dest="action", required=True)
    summary = what.add_parser("summary", help="per node and in total: bytes, messages, "
                              "relocations, replicas, staleness, remote share")
    summary.add_argument("directory", metavar="DIR", help="a trace directory")
    summary.add_argument("--json", action="store_true", help="one JSON object per row")
    summary.add_argument("--per-epoch", action="store_true",
                         help="one table per epoch the app marked (its training only)")
    plot = what.add_parser("plot", help="where a key's main copy and replicas were over time")
    plot.add_argument("directory", metavar="DIR", help="a trace directory")
    keys = plot.add_mutually_exclusive_group(required=True)
    keys.add_argument("--key", type=non_negative_int, action="append", metavar="K",
                      help="a key to draw (repeat for several)")
    keys.add_argument("--hot", type=positive_int, metavar="N",
                      help="the N keys with the most events")
    plot.add_argument("-o", "--output", required=True, metavar="PNG",
                      help="the picture to write (PNG; .svg or .pdf by the name)")
    plot.add_argument("--no-intents", action="store_true",
                      help="leave out the intent windows (orange strips)")
    plot.add_argument("--no-remote", action="store_true",
                      help="leave out the remote accesses (red ticks)")
    return p


def main(argv: Optional[list] = None) -> int:
    opts = parser().parse_args(argv)
    from .errors import AdaPMError
    from .trace import TraceError, load

    damaged = []
    try:
        with warnings.catch_warnings(record=True) as damaged:
            warnings.simplefilter("always")  # a damaged part: one line each, below
            trace = load(opts.directory)
            if opts.action == "summary":
                _summary(trace, opts.json, opts.per_epoch)
            else:
                from .trace.plot import plot_keys

                keys = opts.key if opts.key else trace.hot_keys(opts.hot).tolist()
                if not keys:
                    raise TraceError(f"{opts.directory}: the trace has no events to draw")
                plot_keys(trace, keys, opts.output, intents=not opts.no_intents,
                          remote=not opts.no_remote)
                print(f"wrote {opts.output}: keys {', '.join(map(str, keys))}")
            sys.stdout.flush()
    except BrokenPipeError:  # `adapm trace summary DIR | head`: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a tool that SIGPIPE ended (128 + 13)
    except (AdaPMError, OSError) as exc:  # an unreadable trace, matplotlib missing
        _warn(damaged)
        print(f"adapm trace: error: {exc}", file=sys.stderr)
        return 2
    _warn(damaged)
    return 1 if any(_ours(w) for w in damaged) else 0


def _ours(warning) -> bool:
    return str(warning.message).startswith("adapm.trace: ")


def _warn(caught: list) -> None:
    """Warnings as one line each, as the errors (not Python's two with the source line)."""
    for w in caught:
        text = str(w.message)
        print(f"adapm trace: warning: {text.removeprefix('adapm.trace: ')}" if _ours(w)
              else f"adapm trace: warning: {w.category.__name__}: {text}", file=sys.stderr)


def _summary(trace, as_json: bool, per_epoch: bool) -> None:
    rows = trace.summary(per_epoch=per_epoch).to_pylist()
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    nodes = "1 node" if trace.world_size == 1 else f"{trace.world_size} nodes"
    print(f"{trace.directory}: {nodes}, {trace.num_keys:,} keys, "
          f"{trace.num_events:,} events over {trace.duration_s:.2f} s")
    groups = [(None, rows)] if not per_epoch else [
        (epoch, [r for r in rows if r["epoch"] == epoch])
        for epoch in dict.fromkeys(r["epoch"] for r in rows)]
    for epoch, group in groups:
        if epoch is not None:
            print(f"\nepoch {epoch} (training):")
        _table(group)
        missing = sorted(set(range(trace.world_size)) - {int(row["node"]) for row in group
                                                          if row["node"] != "total"})
        if missing and epoch is not None:  # a node died before it marked the epoch
            print(f"({len(missing)} of {trace.world_size} nodes did not mark this epoch: the "
                  "total is the others')")
        elif missing:  # its statistics rows are in parts that could not be read (or none)
            print(f"(node {', '.join(map(str, missing))}: no statistics could be read: the "
                  "total is the others')")
    shut_down = {int(m["rank"]): m.get("complete") for m in trace.nodes}
    partial = {int(row["node"]) for row in rows if row["node"] != "total" and not row["complete"]}
    lost = sorted(r for r in partial if shut_down.get(r))
    if partial - set(lost):
        print("(a node did not shut down cleanly: its figures are from its last recorded round)")
    if lost:  # its metadata says it shut down cleanly, but its final row did not load
        print(f"(node {', '.join(map(str, lost))}: the final statistics are in a part that "
              "could not be read: its figures are from its last round that could)")


def _table(rows: list) -> None:
    cells = [[title for title, _, _ in _COLUMNS]]
    for row in rows:
        cells.append([fmt.format(row[field] / 1e6 if field.startswith("bytes") else row[field])
                      for _, field, fmt in _COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    sys.exit(main())
