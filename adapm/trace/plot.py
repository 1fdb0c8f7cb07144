"""Per-key placement timelines as PNG (matplotlib), after the AdaPM paper's Figure 15.

One row per node; along the time axis (seconds since the trace started) a node's row is dark
where it held the key's main copy, light where it held a replica, and empty where it held no
copy. ``--hot N`` stacks the N keys with the most events in one figure.
"""

from __future__ import annotations

import numpy as np

from ..errors import AdaPMError
from .query import Trace


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

MAIN_COLOUR = "#1f4e79"     # main copy
REPLICA_COLOUR = "#9dc3e6"  # replica


def spans(trace: Trace, key: int) -> dict:
    """``{rank: {"main": [(start, end)], "replica": [(start, end)]}}`` for ``key``, in seconds
    since the trace's start."""
    key = trace._check_key(key)
    out = {rank: {"main": [], "replica": []} for rank in range(trace.world_size)}
    owner, since = key % trace.world_size, trace.start
    for time, rank, _ in trace._rows(key, ("alloc",), None):
        out[owner]["main"].append((since, time))
        owner, since = rank, time
    out[owner]["main"].append((since, trace.end))
    for rank, intervals in trace.replicas(key).items():
        out[rank]["replica"].extend(intervals)
    return {rank: {what: [(a - trace.start, b - trace.start) for a, b in intervals if b > a]
                   for what, intervals in kinds.items()} for rank, kinds in out.items()}


def plot_keys(trace: Trace, keys, path: str) -> None:
    """Write the timelines of ``keys`` (one panel each, one row per node) to ``path`` (PNG)."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    keys = [int(k) for k in keys]
    nodes = trace.world_size
    fig, axes = plt.subplots(len(keys), 1, squeeze=False, sharex=True,
                             figsize=(8, 0.6 + len(keys) * (0.35 * nodes + 0.5)))
    duration = max(trace.end - trace.start, 1e-9)
    for ax, key in zip(axes[:, 0], keys):
        for rank, kinds in spans(trace, key).items():
            for what, colour in (("main", MAIN_COLOUR), ("replica", REPLICA_COLOUR)):
                bars = [(a, b - a) for a, b in kinds[what]]
                if bars:
                    ax.broken_barh(bars, (rank - 0.4, 0.8), facecolors=colour)
        ax.set_ylim(-0.6, nodes - 0.4)
        ax.set_yticks(np.arange(nodes))
        ax.set_yticklabels([f"node {r}" for r in range(nodes)])
        ax.invert_yaxis()
        ax.set_xlim(0, duration)
        ax.set_title(f"key {key}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds since the trace started")
    fig.legend(handles=[Patch(color=MAIN_COLOUR, label="main copy"),
                        Patch(color=REPLICA_COLOUR, label="replica")],
               loc="upper right", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
