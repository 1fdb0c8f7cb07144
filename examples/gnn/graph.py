"""A graph with planted communities for the GNN example: generate, save, load, sample.

The graph is a degree-corrected stochastic block model (DC-SBM). Every node belongs to one of
``C`` communities (its label, classes of equal size) and has a weight drawn from a Pareto
(power-law) distribution. An edge's first endpoint is drawn proportional to weight; its second
endpoint is drawn proportional to weight among the first one's community with probability
``p_in``, else among the nodes of all other communities. Degrees follow the weights, so they are
heavy-tailed (a few hubs, many nodes of degree 1 or 2), and the label of a node can be inferred
from its neighbourhood, though not always: ``1 - p_in`` of the edges cross communities. Every
node is the first endpoint of one edge, so no node is isolated. The edges are undirected,
without self loops or duplicates, stored as CSR (``indptr``, ``indices``: the neighbours of node
``v`` are ``indices[indptr[v]:indptr[v + 1]]``, ascending).

The nodes are split into training, validation and test nodes (10% / 10% / 30% by default); the
rest are unlabelled but stay in the graph. Everything is vectorised numpy and deterministic for
a seed.

    python examples/gnn/graph.py generate DIR [--nodes N] [--communities C] [--seed S] ...
    python examples/gnn/graph.py info DIR

``generate`` writes ``DIR/graph.npz``; ``info`` loads it and prints its statistics. A missing
or malformed file stops either with a message naming it and exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import zipfile
from dataclasses import dataclass

import numpy as np

from adapm._argtypes import float_in, int_in

FILE_NAME = "graph.npz"
ARRAYS = ("indptr", "indices", "labels", "train", "val", "test", "num_communities")
# Seeds go to numpy and torch (torch.manual_seed takes 64 bits).
MAX_SEED = 2 ** 63 - 1
# Rounds of redrawing the self loops among the drawn edges (each round redraws only the loops
# left) before the last ones are redrawn outside their community.
_SELF_LOOP_ROUNDS = 32


class GraphError(ValueError):
    """A graph file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Graph:
    """An undirected graph in CSR form with node labels and a node split."""

    indptr: np.ndarray   # int64 (N + 1,)
    indices: np.ndarray  # int64 (2 * edges,), each row ascending
    labels: np.ndarray   # int64 (N,), in [0, num_communities)
    train: np.ndarray    # int64, ascending node ids
    val: np.ndarray
    test: np.ndarray
    num_communities: int

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def num_edges(self) -> int:
        """Undirected edges (each is stored twice)."""
        return len(self.indices) // 2

    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    def stats(self) -> dict:
        """Sizes, degree distribution and the share of edges within a community."""
        deg = self.degrees()
        rows = np.repeat(np.arange(self.num_nodes), deg)
        within = float(np.mean(self.labels[rows] == self.labels[self.indices])) \
            if len(rows) else 0.0
        return {"nodes": self.num_nodes, "edges": self.num_edges,
                "communities": self.num_communities, "mean_degree": float(deg.mean()),
                "median_degree": float(np.median(deg)), "max_degree": int(deg.max()),
                "isolated": int(np.sum(deg == 0)), "within_share": round(within, 4),
                "train": len(self.train), "val": len(self.val), "test": len(self.test)}


# --- generation --------------------------------------------------------------------------------


def generate(nodes: int, communities: int, *, edges_per_node: float = 5.0, p_in: float = 0.7,
             alpha: float = 2.0, train_frac: float = 0.1, val_frac: float = 0.1,
             test_frac: float = 0.3, seed: int = 0) -> Graph:
    """A DC-SBM graph (see the module docstring) of ``nodes`` nodes in ``communities``
    communities, about ``edges_per_node`` undirected edges per node (a little less after
    duplicates are removed, so the mean degree is about twice that), Pareto weights with tail
    index ``alpha`` (smaller: heavier tail), and the node split by the three fractions."""
    if communities < 2:
        raise ValueError(f"communities must be >= 2, got {communities}")
    if nodes < 2 * communities:
        raise ValueError(f"nodes must be >= 2 * communities = {2 * communities}, got {nodes}")
    if edges_per_node < 1:
        raise ValueError(f"edges_per_node must be >= 1, got {edges_per_node}")
    if not 0.0 <= p_in <= 1.0:
        raise ValueError(f"p_in must be in [0, 1], got {p_in}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    fracs = (train_frac, val_frac, test_frac)
    if min(fracs) < 0 or sum(fracs) > 1:
        raise ValueError(f"split fractions must be >= 0 and sum to <= 1, got {fracs}")
    rng = np.random.default_rng(seed)
    # Balanced classes: community sizes differ by at most one.
    labels = (rng.permutation(nodes) % communities).astype(np.int64)
    weight = rng.pareto(alpha, nodes) + 1.0  # Pareto with minimum 1: heavy-tailed degrees
    sampler = _WeightedByCommunity(labels, weight, communities)

    # One edge from every node (no node isolated), the rest from weight-proportional nodes.
    extra = round(nodes * (edges_per_node - 1))
    first = np.concatenate([np.arange(nodes, dtype=np.int64), sampler.anywhere(rng, extra)])
    inside = rng.random(len(first)) < p_in
    second = sampler.partner(rng, first, inside)
    for _ in range(_SELF_LOOP_ROUNDS):
        loops = np.flatnonzero(first == second)
        if not len(loops):
            break
        second[loops] = sampler.partner(rng, first[loops], inside[loops])
    # Loops left (a hub with nearly all of a small community's weight keeps drawing itself)
    # get a partner drawn uniformly among the other members of the community.
    loops = np.flatnonzero((first == second) & inside)
    second[loops] = sampler.other_member(rng, first[loops])
    keep = first != second  # only a rounding accident could still leave a loop
    return Graph(*to_csr(nodes, first[keep], second[keep]), labels,
                 *split(nodes, fracs, rng), communities)


class _WeightedByCommunity:
    """Draws nodes proportional to weight: among all nodes, within a community, or outside one.

    Nodes are ordered by community and their weights summed up in that order, so community
    ``c`` is the interval ``[lo[c], hi[c])`` of the cumulative weight: a draw is a uniform number
    in the right interval, looked up with one ``searchsorted`` for the whole batch."""

    def __init__(self, labels: np.ndarray, weight: np.ndarray, communities: int) -> None:
        self.order = np.argsort(labels, kind="stable")
        self.position = np.empty_like(self.order)
        self.position[self.order] = np.arange(len(self.order))
        self.cum = np.cumsum(weight[self.order])
        sizes = np.bincount(labels, minlength=communities)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        cum0 = np.concatenate([[0.0], self.cum])
        self.lo, self.hi = cum0[starts[:-1]], cum0[starts[1:]]
        self.first_pos, self.last_pos = starts[:-1], starts[1:] - 1
        self.labels = labels
        self.total = self.cum[-1]

    def other_member(self, rng: np.random.Generator, nodes: np.ndarray) -> np.ndarray:
        """For each of ``nodes``, another node of its community, uniformly (sizes >= 2)."""
        c = self.labels[nodes]
        others = self.last_pos[c] - self.first_pos[c]  # community size - 1
        pos = self.first_pos[c] + (rng.random(len(nodes)) * others).astype(np.int64)
        # Skip the node's own position: positions after it move up by one.
        return self.order[pos + (pos >= self.position[nodes])]

    def _lookup(self, u: np.ndarray, low: np.ndarray | int = 0,
                high: np.ndarray | int | None = None) -> np.ndarray:
        pos = np.searchsorted(self.cum, u, side="right")
        # Clipping guards against rounding at an interval's upper end.
        pos = np.clip(pos, low, len(self.cum) - 1 if high is None else high)
        return self.order[pos]

    def anywhere(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self._lookup(rng.random(n) * self.total)

    def partner(self, rng: np.random.Generator, first: np.ndarray,
                inside: np.ndarray) -> np.ndarray:
        """A second endpoint for each of ``first``: in its community where ``inside``, else in
        another community, proportional to weight either way."""
        c = self.labels[first]
        lo, hi = self.lo[c], self.hi[c]
        u = rng.random(len(first))
        within = self._lookup(lo + u * (hi - lo), self.first_pos[c], self.last_pos[c])
        # Outside c: a uniform point in the total weight less c's, shifted past c's interval.
        v = u * (self.total - (hi - lo))
        v = np.where(v >= lo, v + (hi - lo), v)
        return np.where(inside, within, self._lookup(v))


def to_csr(nodes: int, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr, indices) of the undirected edges {a[i], b[i]}: both directions, duplicates
    removed, each row ascending. Self loops must already be gone."""
    lo, hi = np.minimum(a, b).astype(np.int64), np.maximum(a, b).astype(np.int64)
    codes = np.unique(lo * nodes + hi)
    lo, hi = codes // nodes, codes % nodes
    src, dst = np.concatenate([lo, hi]), np.concatenate([hi, lo])
    order = np.argsort(src * nodes + dst, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=nodes))]).astype(np.int64)
    return indptr, dst[order].astype(np.int64)


def split(nodes: int, fracs: tuple[float, float, float],
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint random train, validation and test node sets (ascending) of the given shares."""
    perm = rng.permutation(nodes)
    ends = np.cumsum([round(f * nodes) for f in fracs])
    return tuple(np.sort(perm[start:end]).astype(np.int64)
                 for start, end in zip(np.concatenate([[0], ends[:-1]]), ends))


# --- sampling ----------------------------------------------------------------------------------


def sample_neighbours(indptr: np.ndarray, indices: np.ndarray, nodes: np.ndarray, fanout: int,
                      rng: np.random.Generator) -> np.ndarray:
    """``fanout`` neighbours of each of ``nodes`` (any shape), drawn uniformly with replacement:
    an array of shape ``nodes.shape + (fanout,)``. A node without neighbours gets itself."""
    flat = np.asarray(nodes, dtype=np.int64).reshape(-1)
    start = indptr[flat]
    deg = indptr[flat + 1] - start
    # rng.random() < 1, so the offset is < deg; nodes of degree 0 are patched below.
    offset = (rng.random((len(flat), fanout)) * deg[:, None]).astype(np.int64)
    picked = indices[np.minimum(start[:, None] + offset, len(indices) - 1)] if len(indices) \
        else np.zeros((len(flat), fanout), dtype=np.int64)
    isolated = deg == 0
    if isolated.any():
        picked[isolated] = flat[isolated, None]
    return picked.reshape(np.shape(nodes) + (fanout,))


# --- files -------------------------------------------------------------------------------------


def graph_file(path: str) -> str:
    """The graph file of ``path``: ``path`` itself when it names a ``.npz`` file, else
    ``path/graph.npz`` (a directory, as ``generate`` writes it)."""
    return path if path.endswith(".npz") and not os.path.isdir(path) else \
        os.path.join(path, FILE_NAME)


def digest(graph: Graph) -> str:
    """A BLAKE2b digest of the graph's contents (edges, labels, split, communities): equal for
    equal graphs however they were made, generated from flags or loaded from a file."""
    h = hashlib.blake2b(digest_size=16)
    for name in ARRAYS[:-1]:
        array = np.ascontiguousarray(getattr(graph, name), dtype=np.int64)
        h.update(np.int64(len(array)).tobytes())
        h.update(array.tobytes())
    h.update(np.int64(graph.num_communities).tobytes())
    return h.hexdigest()


def save(graph: Graph, directory: str) -> str:
    """Writes ``directory/graph.npz`` (the directory is created); returns the file's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, FILE_NAME)
    tmp = path + ".tmp.npz"
    np.savez(tmp, indptr=graph.indptr, indices=graph.indices, labels=graph.labels,
             train=graph.train, val=graph.val, test=graph.test,
             num_communities=np.int64(graph.num_communities))
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def load(path: str) -> Graph:
    """Reads a graph written by :func:`save` (a directory holding ``graph.npz``, or the file)
    and checks it; raises :class:`GraphError` naming the file when it is missing or bad."""
    file = graph_file(path)
    if not os.path.isfile(file):
        what = "no such file" if os.path.isdir(os.path.dirname(file) or ".") else \
            "no such file or directory"
        raise GraphError(f"{file}: {what} (write a graph with: python examples/gnn/graph.py "
                         f"generate DIR)")
    try:
        with np.load(file, allow_pickle=False) as data:
            missing = [name for name in ARRAYS if name not in data.files]
            if missing:
                raise GraphError(f"{file}: missing array(s) {', '.join(missing)} (a graph file "
                                 f"has {', '.join(ARRAYS)})")
            arrays = {name: data[name] for name in ARRAYS}
    except GraphError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise GraphError(f"{file}: not a graph file readable by numpy.load ({exc})") from None
    return _checked(file, arrays)


def _checked(file: str, a: dict) -> Graph:
    """The graph of the loaded arrays, after checking they are consistent."""
    for name, value in a.items():
        if value.dtype.kind not in "iu":
            raise GraphError(f"{file}: array {name} must hold integers, got {value.dtype}")
    communities = int(a["num_communities"].reshape(-1)[0]) if a["num_communities"].size else 0
    indptr, indices, labels = (a[n].astype(np.int64).reshape(-1)
                               for n in ("indptr", "indices", "labels"))
    nodes = len(indptr) - 1

    def bad(what: str) -> GraphError:
        return GraphError(f"{file}: {what}")

    if communities < 2:
        raise bad(f"num_communities must be >= 2, got {communities}")
    if nodes < 1 or indptr[0] != 0 or indptr[-1] != len(indices) or np.any(np.diff(indptr) < 0):
        raise bad("indptr must start at 0, never decrease and end at len(indices)")
    if len(indices) and (indices.min() < 0 or indices.max() >= nodes):
        raise bad(f"indices must be node ids in [0, {nodes})")
    if len(labels) != nodes:
        raise bad(f"labels has {len(labels)} entries for {nodes} nodes")
    if labels.min() < 0 or labels.max() >= communities:
        raise bad(f"labels must be in [0, {communities})")
    splits = {}
    for name in ("train", "val", "test"):
        ids = a[name].astype(np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= nodes):
            raise bad(f"{name} must be node ids in [0, {nodes})")
        splits[name] = ids
    if not len(splits["train"]):
        raise bad("train is empty: no node to train on")
    together = np.concatenate(list(splits.values()))
    if len(np.unique(together)) != len(together):
        raise bad("train, val and test must be disjoint sets of distinct nodes")
    return Graph(indptr, indices, labels, splits["train"], splits["val"], splits["test"],
                 communities)


# --- command line ------------------------------------------------------------------------------


def add_generation_flags(parser: argparse.ArgumentParser, *, required_defaults: bool) -> None:
    """The generator's flags (shared with train.py, where they apply without --graph). With
    ``required_defaults`` False the defaults are None, so that a caller can tell which were
    given."""
    def d(value):
        return value if required_defaults else None

    g = parser.add_argument_group("graph generation")
    g.add_argument("--nodes", type=int_in(1), default=d(20_000),
                   help="number of nodes (default 20000)")
    g.add_argument("--communities", type=int_in(2), default=d(8),
                   help="number of communities, i.e. classes (default 8)")
    g.add_argument("--edges-per-node", type=float_in(1.0, None), default=d(5.0),
                   help="undirected edges drawn per node; the mean degree is about twice this "
                        "(default 5)")
    g.add_argument("--p-in", type=float_in(0.0, 1.0), default=d(0.7),
                   help="probability that an edge stays within its first endpoint's community "
                        "(default 0.7: about 90%% test accuracy, not 100%%)")
    g.add_argument("--alpha", type=float_in(0.0, None, low_open=True), default=d(2.0),
                   help="tail index of the Pareto node weights: smaller means more extreme hubs "
                        "(default 2)")
    g.add_argument("--train-frac", type=float_in(0.0, 1.0, low_open=True), default=d(0.1),
                   help="share of nodes labelled for training, > 0 (default 0.1)")
    g.add_argument("--val-frac", type=float_in(0.0, 1.0), default=d(0.1),
                   help="share of nodes labelled for validation (default 0.1)")
    g.add_argument("--test-frac", type=float_in(0.0, 1.0), default=d(0.3),
                   help="share of nodes labelled for testing (default 0.3)")


def check_generation_flags(parser: argparse.ArgumentParser, opts: argparse.Namespace,
                           defaults: dict) -> None:
    """``parser.error`` for generation flags that are fine alone but not together (the values
    not given taken from ``defaults``): before anything is generated."""
    value = {name: getattr(opts, name) if getattr(opts, name) is not None else defaults[name]
             for name in defaults}
    if value["nodes"] < 2 * value["communities"]:
        parser.error(f"--nodes must be >= 2 * --communities = {2 * value['communities']}, "
                     f"got {value['nodes']}")
    fracs = [value[name] for name in ("train_frac", "val_frac", "test_frac")]
    if sum(fracs) > 1:
        parser.error(f"--train-frac, --val-frac and --test-frac must sum to <= 1, got "
                     f"{' + '.join(str(f) for f in fracs)}")
    if round(value["train_frac"] * value["nodes"]) < 1:
        parser.error(f"--train-frac {value['train_frac']} of --nodes {value['nodes']} is no "
                     f"training node")


# The defaults of the generation flags, for check_generation_flags.
GENERATION_DEFAULTS = {"nodes": 20_000, "communities": 8, "train_frac": 0.1, "val_frac": 0.1,
                       "test_frac": 0.3}


def generation_kwargs(opts: argparse.Namespace, defaults: dict | None = None) -> dict:
    """The keyword arguments of :func:`generate` from parsed flags (None: the default)."""
    names = ("edges_per_node", "p_in", "alpha", "train_frac", "val_frac", "test_frac")
    kwargs = {n: getattr(opts, n) for n in names if getattr(opts, n) is not None}
    return {**(defaults or {}), **kwargs}


def main(argv: list[str] | None = None) -> int:
    """``generate DIR`` or ``info DIR``; exit code 2 on bad input, with a one-line message."""
    parser = argparse.ArgumentParser(prog="graph.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write DIR/graph.npz")
    gen.add_argument("dir", metavar="DIR", help="output directory (created if needed)")
    add_generation_flags(gen, required_defaults=True)
    gen.add_argument("--seed", type=int_in(0, MAX_SEED), default=0,
                     help="seed of the generator (default 0)")
    info = sub.add_parser("info", help="load DIR/graph.npz and print its statistics")
    info.add_argument("dir", metavar="DIR", help="a directory holding graph.npz, or the file")
    opts = parser.parse_args(argv)
    if opts.command == "generate":
        check_generation_flags(gen, opts, GENERATION_DEFAULTS)
    try:
        if opts.command == "generate":
            graph = generate(opts.nodes, opts.communities, seed=opts.seed,
                             **generation_kwargs(opts))
            path = save(graph, opts.dir)
            print(json.dumps({"file": path, **graph.stats()}))
        else:
            path = graph_file(opts.dir)
            print(json.dumps({"file": path, **load(opts.dir).stats()}))
    except (GraphError, ValueError, OSError) as exc:
        print(f"graph.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
