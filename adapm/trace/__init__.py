"""Parameter-placement traces: record what the manager did, query it, draw it.

Record: ``adapm.init(..., trace_dir="trace/", trace_keys="all")`` (or ``ADAPM_TRACE_DIR``, or an
app's ``--trace-dir``): each node writes its events and per-round statistics as Parquet files
(:mod:`.schema` describes them), which pandas, polars and duckdb read directly.

Query::

    trace = adapm.trace.load("trace/")
    trace.events                 # Arrow table: time, clock, rank, key, event, peer
    trace.location(42, at=t)     # which node held key 42's main copy at wall time t
    trace.replicas(42)           # {rank: [(start, end), ...]}
    trace.timeline(42)           # key 42's events in time order
    trace.summary()              # per node and in total: bytes, messages, relocations, ...

An app's ``--trace-keys`` flag: ``parser.add_argument("--trace-keys", type=keys_argument)``
parses "all", a sample size N, or keys ``k1,k2,...`` into what ``Config.trace_keys`` takes.

Command line: ``adapm trace summary DIR [--json] [--per-epoch]``, ``adapm trace plot DIR --key K -o out.png``
and ``adapm trace plot DIR --hot N -o out.png``.

``import adapm`` does not import this package; importing it does not import pyarrow (``load``
does) or matplotlib (the plots do).
"""

from __future__ import annotations

from .._argtypes import trace_keys as keys_argument
from .plot import PlotUnavailable
from .query import Trace, TraceError, load

__all__ = ["PlotUnavailable", "Trace", "TraceError", "keys_argument", "load"]
