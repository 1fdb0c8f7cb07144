"""Per-key placement timelines as PNG (matplotlib), after the AdaPM paper's Figure 15.

One row per node; along the time axis (seconds since the trace started) a node's row is dark
where it held the key's main copy, light where it held a replica, and empty where it held no
copy. Below each bar a thin orange strip shows when that node had intent for the key (from its
``intent_start`` to its ``intent_stop``: the window in which the manager brought the key there),
and red ticks show the node's remote accesses to the key (each ``remote_access`` event): an
access outside any intent window, or a window that began too late, is what a remote share is
made of. Vertical lines mark each epoch's start (solid) and end (dashed), labelled above the
first panel; other marked spans (``"NAME start"`` / ``"NAME end"``, e.g. an evaluation) are
shaded grey. ``--hot N`` stacks the N keys with the most events in one figure.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import AdaPMError
from .query import Trace, TraceError


MAIN_COLOUR = "#1f4e79"     # main copy
REPLICA_COLOUR = "#9dc3e6"  # replica
INTENT_COLOUR = "#f4b183"   # an intent window
REMOTE_COLOUR = "#c00000"   # a remote access
EPOCH_COLOUR = "#595959"    # epoch marks
SPAN_COLOUR = "#d9d9d9"     # other marked spans (evaluation, ...)


class PlotUnavailable(AdaPMError, ImportError):
    """matplotlib, which the plots need, is not installed (it comes with ``adapm[plot]``)."""


def _pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display), or PlotUnavailable."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("the trace plots need matplotlib, which this installation of "
                              "adapm lacks: pip install 'adapm[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def spans(trace: Trace, key: int) -> dict:
    """``{rank: {"main": [(start, end)], "replica": [...], "intent": [...]}}`` for ``key``, in
    seconds since the trace's start. An intent window still open at the end ends there."""
    key = trace._check_key(key)
    out = {rank: {"main": [], "replica": [], "intent": []} for rank in range(trace.world_size)}
    owner, since = key % trace.world_size, trace._start
    for time, rank, _ in trace._rows(key, ("alloc",), None):
        out[owner]["main"].append((since, time))
        owner, since = rank, time
    out[owner]["main"].append((since, trace._end))
    for rank, intervals in trace._replica_spans(key).items():
        out[rank]["replica"].extend(intervals)
    opened: dict = {}
    for time, rank, name in trace._rows(key, ("intent_start", "intent_stop"), None):
        if name == "intent_start":
            opened.setdefault(rank, time)
        elif rank in opened:
            out[rank]["intent"].append((opened.pop(rank), time))
    for rank, time in opened.items():
        out[rank]["intent"].append((time, trace._end))
    return {rank: {what: [((a - trace._start) / 1e6, (b - trace._start) / 1e6)
                          for a, b in intervals if b > a]
                   for what, intervals in kinds.items()} for rank, kinds in out.items()}


def remote_accesses(trace: Trace, key: int) -> dict:
    """``{rank: seconds since the start}`` of ``key``'s remote accesses by each node."""
    key = trace._check_key(key)
    out: dict = {}
    for time, rank, _ in trace._rows(key, ("remote_access",), None):
        out.setdefault(rank, []).append((time - trace._start) / 1e6)
    return out


def figure(trace: Trace, keys, intents: bool = True, remote: bool = True):
    """A matplotlib Figure with the timelines of ``keys`` (one panel each, one row per node),
    the epoch marks and marked spans; ``intents``/``remote``: draw intent windows and remote
    accesses. Artists carry a gid: ``"epoch N start"``/``"epoch N end"`` (the mark lines),
    ``"span NAME"``, ``"intent"``, ``"remote"``. Close it with ``matplotlib.pyplot.close``."""
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    keys = [int(k) for k in keys]
    nodes = trace.world_size
    fig, axes = plt.subplots(len(keys), 1, squeeze=False, sharex=True,
                             figsize=(8, 0.9 + len(keys) * (0.4 * nodes + 0.5)))
    duration = max(trace.duration_s, 1e-9)
    marked = {name: (min(trace.seconds(a) for a, _ in ranks.values()),
                     max(trace.seconds(b) for _, b in ranks.values()))
              for name, ranks in trace.spans().items()}
    for ax, key in zip(axes[:, 0], keys):
        for name, (a, b) in marked.items():
            if name.startswith("epoch "):
                ax.axvline(a, color=EPOCH_COLOUR, lw=0.8, ls="-", gid=f"{name} start")
                ax.axvline(b, color=EPOCH_COLOUR, lw=0.8, ls="--", gid=f"{name} end")
            else:
                ax.axvspan(a, b, color=SPAN_COLOUR, alpha=0.6, lw=0, gid=f"span {name}")
        for rank, kinds in spans(trace, key).items():
            for what, colour in (("main", MAIN_COLOUR), ("replica", REPLICA_COLOUR)):
                bars = [(a, b - a) for a, b in kinds[what]]
                if bars:
                    ax.broken_barh(bars, (rank - 0.4, 0.55), facecolors=colour)
            if intents and kinds["intent"]:
                ax.broken_barh([(a, b - a) for a, b in kinds["intent"]], (rank + 0.2, 0.18),
                               facecolors=INTENT_COLOUR, gid="intent")
        if remote:
            for rank, times in remote_accesses(trace, key).items():
                ax.plot(times, [rank - 0.12] * len(times), ls="none", marker="|", ms=9,
                        mew=1.2, color=REMOTE_COLOUR, gid="remote")
        ax.set_ylim(-0.6, nodes - 0.4)
        ax.set_yticks(np.arange(nodes))
        ax.set_yticklabels([f"node {r}" for r in range(nodes)])
        ax.invert_yaxis()
        ax.set_xlim(0, duration)
        # on the right: the epoch labels run along the top panel's upper edge from the left
        ax.set_title(f"key {key}", fontsize=9, loc="right")
    top = axes[0, 0]
    for name, (a, _) in marked.items():
        if name.startswith("epoch "):
            top.text(a, 1.01, f" {name}", fontsize=7, color=EPOCH_COLOUR, va="bottom",
                     ha="left", transform=top.get_xaxis_transform(), clip_on=False)
    axes[-1, 0].set_xlabel("seconds since the trace started")
    handles = [Patch(color=MAIN_COLOUR, label="main copy"),
               Patch(color=REPLICA_COLOUR, label="replica")]
    if intents:
        handles.append(Patch(color=INTENT_COLOUR, label="intent"))
    if remote:
        handles.append(Line2D([], [], ls="none", marker="|", color=REMOTE_COLOUR,
                              label="remote access"))
    if any(name.startswith("epoch ") for name in marked):
        handles.append(Line2D([], [], color=EPOCH_COLOUR, lw=0.8, label="epoch start/end"))
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def plot_keys(trace: Trace, keys, path: str, intents: bool = True, remote: bool = True) -> None:
    """Write the timelines of ``keys`` (:func:`figure`) to ``path``: PNG, or another format
    matplotlib writes, by the name's extension (TraceError, before drawing, for one it does
    not)."""
    plt = _pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    extension = os.path.splitext(path)[1][1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if extension and extension not in formats:
        raise TraceError(f"{path}: matplotlib writes no {extension!r} files; name a .png "
                         f"(or {', '.join('.' + f for f in sorted(formats) if f != 'png')})")
    fig = figure(trace, keys, intents=intents, remote=remote)
    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
