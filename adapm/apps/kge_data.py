"""Knowledge graphs on disk and synthetic ones: :func:`load`, :func:`write`, :func:`generate`.

Dataset layout (the one PyKEEN, LibKGE and OpenKE use): a directory with ``train.txt``,
``valid.txt`` and ``test.txt``; each line is ``head<TAB>relation<TAB>tail``, where names are
arbitrary non-empty strings without tabs or newlines. Files are UTF-8 (a BOM is skipped),
``\\r\\n`` line ends are accepted; blank lines, and ``#`` lines without a tab before the first
triple (comments), are skipped. Every file must hold at least one triple.

Ids: entities and relations are numbered in order of first appearance in ``train.txt`` (the head
before the tail on a line), so the numbering depends only on train.txt. A triple of
valid.txt/test.txt with an entity or relation that train.txt lacks cannot be scored: it is left
out and counted (``KG.left_out``), as PyKEEN and LibKGE do (WN18RR's test split has such
triples); a split left with none is an error. Duplicate lines are kept as they are.

Bad files raise :class:`DataError` naming the file, the 1-based line number and the offending
text; bad arguments raise :class:`~adapm.errors.InvalidArgument`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import InvalidArgument
from .datafiles import DataError
from .outputs import directory_problem

SPLITS = ("train", "valid", "test")
_COLUMNS = ("head", "relation", "tail")


@dataclass(frozen=True, eq=False)
class KG:
    """A knowledge graph split into train/valid/test.

    ``entities[i]`` / ``relations[i]`` are the names of entity / relation id ``i``; each split is
    an int64 array of shape (n, 3) holding (head id, relation id, tail id) rows. Construction
    checks shapes, dtypes and id ranges. (``eq=False``: arrays have no single truth value.)
    """

    entities: list[str]
    relations: list[str]
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    # split -> (triples left out, the first one's line, "head"/"relation"/"tail", its name):
    # valid/test triples naming what train.txt lacks
    left_out: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for split in SPLITS:
            t = getattr(self, split)
            if not isinstance(t, np.ndarray) or t.dtype != np.int64 or t.ndim != 2 \
                    or t.shape[1] != 3:
                raise InvalidArgument(f"KG.{split} must be an int64 array of shape (n, 3)")
            if len(t) == 0:
                continue
            for col, size in ((0, self.num_entities), (1, self.num_relations),
                              (2, self.num_entities)):
                if t[:, col].min() < 0 or t[:, col].max() >= size:
                    raise InvalidArgument(f"KG.{split}: a {_COLUMNS[col]} id is outside "
                                          f"[0, {size})")

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        return len(self.relations)


# ----------------------------------------------------------------------------------- loading


def load(directory) -> KG:
    """Read ``train.txt``, ``valid.txt`` and ``test.txt`` of ``directory`` (see module doc).

    Runs at C speed (whole-file string operations, dict lookups via ``map``): about a second
    per million lines.
    """
    root = Path(directory)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "no such dataset directory"
        raise DataError(f"{root}: {what} (expected train.txt, valid.txt, test.txt in it)")

    path = root / "train.txt"
    ents, rels, numbers = _read_triples(path)
    # dict.fromkeys keeps first-appearance order; ents interleaves (head, tail) per line.
    entities = list(dict.fromkeys(ents))
    relations = list(dict.fromkeys(rels))
    ent_id = dict(zip(entities, range(len(entities))))
    rel_id = dict(zip(relations, range(len(relations))))
    splits = {"train": _to_ids(path, ents, rels, numbers, ent_id, rel_id)[0]}
    left_out = {}
    for split in SPLITS[1:]:
        path = root / f"{split}.txt"
        splits[split], unknown = _to_ids(path, *_read_triples(path), ent_id, rel_id)
        if unknown is not None:
            left_out[split] = unknown
    return KG(entities, relations, **splits, left_out=left_out)


def _read_triples(path: Path) -> tuple[list[str], list[str], Sequence[int]]:
    """The names of a triple file: (heads and tails interleaved per line, relations, each
    triple's line number in the file)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: missing file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        bad = raw[max(0, exc.start - 20):exc.start + 20]
        raise DataError(f"{path}:{line}: not valid UTF-8: {bad!r}") from None
    text = text.replace("\r\n", "\n")
    if text.endswith("\r"):  # a last line ending in a bare \r
        text = text[:-1]
    if text.endswith("\n"):
        text = text[:-1]
    lines = text.split("\n")
    # Blank lines (a file's trailing ones) and comments before the first triple ('#' lines
    # without a tab: a '#' line of three fields is a triple whose head starts with '#') are
    # skipped; ``number`` keeps each kept line's number in the file for the errors.
    # Only lines without a tab can be skipped: those are looked at one by one.
    tabs = np.fromiter(map(str.count, lines, repeat("\t")), np.int64, len(lines))
    untabbed = np.flatnonzero(tabs == 0).tolist()
    head = 0
    while head < len(lines) and _no_triple(lines[head], comment=True):
        head += 1
    skip = set(range(head)) | {i for i in untabbed if _no_triple(lines[i])}
    number = range(1, len(lines) + 1)  # no list of a million ints for a file without any
    if skip:
        keep = np.ones(len(lines), dtype=bool)
        keep[list(skip)] = False
        number = (np.flatnonzero(keep) + 1).tolist()
        lines = [lines[i - 1] for i in number]
        tabs = tabs[keep]
        text = "\n".join(lines)
    if not lines or not text:
        raise DataError(f"{path}: empty file (needs at least one triple)")

    bad = np.flatnonzero(tabs != 2)
    if len(bad):
        i = int(bad[0])
        raise DataError(f"{path}:{number[i]}: expected 3 tab-separated columns, got "
                        f"{tabs[i] + 1}: {_show(lines[i])}")

    fields = text.replace("\n", "\t").split("\t")  # 3 per line: h, r, t, h, r, t, ...
    if "" in fields:
        i = fields.index("")
        raise DataError(f"{path}:{number[i // 3]}: empty {_COLUMNS[i % 3]} name: "
                        f"{_show(lines[i // 3])}")
    rels = fields[1::3]
    del fields[1::3]  # leaves h, t, h, t, ...
    return fields, rels, number


def _no_triple(line: str, comment: bool = False) -> bool:
    """A blank line (no tab, only blanks), or with ``comment`` also a '#' line without a tab."""
    return "\t" not in line and (not line.strip() or (comment and line[0] == "#"))


def _to_ids(path: Path, ents: list[str], rels: list[str], numbers: Sequence[int], ent_id: dict,
            rel_id: dict) -> tuple[np.ndarray, Optional[tuple]]:
    """(n, 3) int64 ids of a file's names, without the triples naming what ``*_id`` lacks
    (never train.txt's own), and (how many were left out, the first one's line in the file,
    its column, its name), or None when none was. None left: a DataError naming the first."""
    n = len(rels)
    e = np.fromiter(map(ent_id.get, ents, repeat(-1)), np.int64, len(ents))
    r = np.fromiter(map(rel_id.get, rels, repeat(-1)), np.int64, n)
    unknown = None
    if (e < 0).any() or (r < 0).any():
        bad = (e[0::2] < 0) | (r < 0) | (e[1::2] < 0)
        line = int(np.flatnonzero(bad)[0])
        what, name = next((w, x) for w, x, ok in (("head", ents[2 * line], e[2 * line] >= 0),
                                                  ("relation", rels[line], r[line] >= 0),
                                                  ("tail", ents[2 * line + 1],
                                                   e[2 * line + 1] >= 0)) if not ok)
        unknown = (int(bad.sum()), numbers[line], what, name)
        if bad.all():
            raise DataError(f"{path}: none of its {n} triples has its entities and relations in "
                            f"train.txt (line {numbers[line]}: {what} {_show(name)})")
        keep = ~bad
        e = e.reshape(-1, 2)[keep].reshape(-1)
        r = r[keep]
        n = len(r)
    out = np.empty((n, 3), np.int64)
    out[:, 0] = e[0::2]
    out[:, 1] = r
    out[:, 2] = e[1::2]
    return out, unknown


def _show(text: str, limit: int = 60) -> str:
    """``text`` quoted, shortened to about ``limit`` characters for an error message."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


# ----------------------------------------------------------------------------------- writing


def write(kg: KG, directory) -> None:
    """Write ``kg`` as ``train.txt``, ``valid.txt``, ``test.txt`` into ``directory`` (created).

    ``load(directory)`` then gives the same triples by name, and the same ids whenever ``kg``
    is numbered by first appearance in train (as :func:`load` and :func:`generate` number).
    Refuses (InvalidArgument) what could not be loaded back: an empty split, an empty, duplicate
    or tab/newline-holding name, a valid/test entity or relation absent from train.
    """
    for kind, names in (("entity", kg.entities), ("relation", kg.relations)):
        joined = "\x00".join(names)
        if "\t" in joined or "\n" in joined or "\r" in joined:
            raise InvalidArgument(f"an {kind} name contains a tab or line break")
        if "" in names:
            raise InvalidArgument(f"an {kind} name is empty")
        if len(set(names)) != len(names):
            raise InvalidArgument(f"{kind} names are not unique")
    for split in SPLITS:
        if len(getattr(kg, split)) == 0:
            raise InvalidArgument(f"KG.{split} is empty; load() would refuse the file")
    seen_e, seen_r = _seen(kg.train, kg.num_entities, kg.num_relations)
    for split in SPLITS[1:]:
        t = getattr(kg, split)
        if not (seen_e[t[:, 0]].all() and seen_r[t[:, 1]].all() and seen_e[t[:, 2]].all()):
            raise InvalidArgument(f"KG.{split} mentions an entity or relation absent from train")

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    ents = np.array(kg.entities, dtype=object)
    rels = np.array(kg.relations, dtype=object)
    for split in SPLITS:
        t = getattr(kg, split)
        text = "\n".join(map("\t".join, zip(ents[t[:, 0]], rels[t[:, 1]], ents[t[:, 2]])))
        with open(root / f"{split}.txt", "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.write("\n")


def _seen(train: np.ndarray, num_entities: int, num_relations: int):
    """Boolean masks of the entities and relations that occur in ``train``."""
    seen_e = np.zeros(num_entities, bool)
    seen_e[train[:, 0]] = True
    seen_e[train[:, 2]] = True
    seen_r = np.zeros(num_relations, bool)
    seen_r[train[:, 1]] = True
    return seen_e, seen_r


# -------------------------------------------------------------------------------- generating

MIN_TRIPLES = 50
_MAX_ROUNDS = 25
_MIN_YIELD = 0.02  # fewer new distinct triples per drawn fact than this: the space is exhausted


def default_num_entities(num_triples: int) -> int:
    """About 20 triples per entity (40 mentions on average), at least 100 entities."""
    return max(100, num_triples // 20)


def default_num_relations(num_triples: int) -> int:
    """Grows with log(num_triples): 6 for <= 200 triples, 13 for 1k, 53 for 1M, at most 100."""
    return int(np.clip(round(4 * math.log2(max(num_triples, 1) / 100)), 6, 100))


def default_num_types(num_entities: int, community_size: int = 64) -> int:
    """One type per 10,000 entities, between 1 and 8 (and at most one per community)."""
    return max(1, min(num_entities // 10_000, 8, num_entities // community_size))


def generate(num_triples: int, *, num_entities: int | None = None,
             num_relations: int | None = None, seed: int = 0, num_types: int | None = None,
             community_size: int = 64, inverse_prob: float = 0.9, noise: float = 0.01,
             eval_fraction: float = 0.05, max_eval: int = 5000) -> KG:
    """A synthetic KG with learnable planted structure and Zipf-skewed entity degrees.

    The model (all draws from one ``numpy`` generator seeded with ``seed``: deterministic):

    - Entities fall into ``num_types`` types, each type into communities of about
      ``community_size`` entities. Entity popularity is Zipf: weight 1 / (rank + 1) for a random
      global popularity rank, so a few entities occur very often and most rarely.
    - Relations: about 1/5 are symmetric, the rest come in pairs (r, r_inverse). A base relation
      (one of a pair, or a symmetric one) has a head type and a tail type (symmetric: equal) and
      maps each head community to a tail community (symmetric: by an involution).
    - A fact draws a base relation (mildly skewed frequencies), a head from the relation's head
      type by popularity, and a tail by popularity from the community the relation maps the
      head's community to, so tails are predictable from (head, relation) up to a small
      neighbourhood. It is emitted as (h, r, t) and as (t, r_inverse, h) with probability
      ``inverse_prob`` (symmetric relations: always as (t, r, h)), which makes held-out facts
      inferable as in FB15k. A fraction ``noise`` of extra random triples is added; self loops
      are dropped.

    Facts are drawn until ``num_triples`` distinct triples exist (a random subset of exactly that
    many is kept), shuffled and split: valid and test get ``min(max_eval, round(eval_fraction *
    num_triples))`` each (at least 1), train the rest; valid/test triples with an entity or
    relation absent from train are then dropped, so they may end up slightly smaller. Entities
    and relations are renumbered by first appearance in train and named ``e<id>`` / ``r<id>``;
    those never drawn are absent, so ``num_entities`` is an upper bound on the result's.

    Defaults: :func:`default_num_entities`, :func:`default_num_relations`,
    :func:`default_num_types`. About a second per million triples.
    """
    n = _int_arg("num_triples", num_triples, MIN_TRIPLES)
    E = _int_arg("num_entities", default_num_entities(n) if num_entities is None
                 else num_entities, 10)
    R = _int_arg("num_relations", default_num_relations(n) if num_relations is None
                 else num_relations, 1)
    m = _int_arg("community_size", community_size, 2)
    T = default_num_types(E, m) if num_types is None else _int_arg("num_types", num_types, 1)
    if T > max(1, E // m):
        raise InvalidArgument(f"num_types={T} leaves fewer than community_size={m} entities "
                              f"per type (num_entities={E})")
    if not 0.0 <= inverse_prob <= 1.0:
        raise InvalidArgument(f"inverse_prob={inverse_prob} is outside [0, 1]")
    if not 0.0 <= noise < 1.0:
        raise InvalidArgument(f"noise={noise} is outside [0, 1)")
    if not 0.0 < eval_fraction < 0.5:
        raise InvalidArgument(f"eval_fraction={eval_fraction} is outside (0, 0.5)")
    max_eval = _int_arg("max_eval", max_eval, 1)
    if E * E * R >= 2**62:
        raise InvalidArgument(f"num_entities={E}, num_relations={R}: too many to key triples")

    rng = np.random.default_rng(seed)
    planted = _Planted(rng, E, R, T, m)
    keys = _distinct_keys(rng, planted, n, inverse_prob, noise)
    keys = keys[rng.permutation(len(keys))[:n]]  # random subset of n, random order
    triples = np.empty((n, 3), np.int64)
    triples[:, 2] = keys % E
    triples[:, 1] = (keys // E) % R
    triples[:, 0] = keys // (E * R)

    n_eval = min(max_eval, max(1, round(eval_fraction * n)))
    valid, test, train = triples[:n_eval], triples[n_eval:2 * n_eval], triples[2 * n_eval:]
    seen_e, seen_r = _seen(train, E, R)
    valid, test = (t[seen_e[t[:, 0]] & seen_r[t[:, 1]] & seen_e[t[:, 2]]] for t in (valid, test))
    if len(valid) == 0 or len(test) == 0:
        raise InvalidArgument(f"num_triples={n} is too few: no valid or test triple has all its "
                              f"entities in train")
    return _renumbered(train, valid, test, E, R)


def _int_arg(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidArgument(f"{name}={value} is below the minimum {minimum}")
    return int(value)


class _Planted:
    """The generator's hidden structure (types, communities, popularity, relation rules)."""

    def __init__(self, rng: np.random.Generator, E: int, R: int, T: int, m: int) -> None:
        self.E, self.R = E, R
        # Types are contiguous position ranges; positions double as raw entity ids.
        self.type_lo = np.linspace(0, E, T + 1).round().astype(np.int64)
        sizes = np.diff(self.type_lo)
        self.n_comm = np.maximum(1, sizes // m)
        self.type_comm_lo = np.concatenate([[0], np.cumsum(self.n_comm)])
        comm_type = np.repeat(np.arange(T), self.n_comm)
        local = np.arange(len(comm_type)) - self.type_comm_lo[comm_type]
        starts = self.type_lo[comm_type] + local * sizes[comm_type] // self.n_comm[comm_type]
        self.comm_lo = np.append(starts, E)
        self.comm_of = np.repeat(np.arange(len(starts)), np.diff(self.comm_lo))
        # Zipf(1) popularity over a random ranking; cum[i] = total weight of positions < i.
        weight = 1.0 / (rng.permutation(E) + 1.0)
        self.cum = np.concatenate([[0.0], np.cumsum(weight)])

        n_sym = max(1, round(0.2 * R))
        n_sym += (R - n_sym) % 2
        n_pairs = (R - n_sym) // 2
        self.rel = np.concatenate([2 * np.arange(n_pairs), 2 * n_pairs + np.arange(n_sym)])
        self.inv = np.concatenate([2 * np.arange(n_pairs) + 1, np.full(n_sym, -1)])
        self.sym = self.inv < 0
        B = len(self.rel)
        self.head_type = rng.permutation(np.resize(np.arange(T), B))  # every type, if B >= T
        self.tail_type = np.where(self.sym, self.head_type, rng.integers(T, size=B))
        self.mult = rng.integers(1, 1 << 20, size=B)
        self.off = rng.integers(0, 1 << 20, size=B)
        p = 1.0 / np.sqrt(rng.permutation(B) + 1.0)
        self.base_p = p / p.sum()

    def expected_per_fact(self, inverse_prob: float, noise: float) -> float:
        """Triples emitted per drawn fact, on average."""
        sym_share = float(self.base_p[self.sym].sum())
        return 1.0 + sym_share + (1.0 - sym_share) * inverse_prob + noise

    def sample(self, rng: np.random.Generator, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """One position per range [lo, hi), drawn by popularity (inverse CDF)."""
        u = self.cum[lo] + rng.random(len(lo)) * (self.cum[hi] - self.cum[lo])
        return np.clip(np.searchsorted(self.cum, u, side="right") - 1, lo, hi - 1)

    def draw(self, rng: np.random.Generator, n_facts: int, inverse_prob: float,
             noise: float) -> np.ndarray:
        """Keys ((h * R + r) * E + t) of the triples emitted by ``n_facts`` facts plus noise."""
        b = rng.choice(len(self.rel), size=n_facts, p=self.base_p)
        ht, tt = self.head_type[b], self.tail_type[b]
        h = self.sample(rng, self.type_lo[ht], self.type_lo[ht + 1])
        i = self.comm_of[h] - self.type_comm_lo[ht]
        n_tail = self.n_comm[tt]
        sym = self.sym[b]
        j = np.where(sym, (self.off[b] - i) % n_tail, (self.mult[b] * i + self.off[b]) % n_tail)
        g = self.type_comm_lo[tt] + j
        t = self.sample(rng, self.comm_lo[g], self.comm_lo[g + 1])
        r = self.rel[b]

        back = sym | (rng.random(n_facts) < inverse_prob)
        k = rng.binomial(n_facts, noise)
        everywhere = (np.zeros(k, np.int64), np.full(k, self.E, np.int64))
        heads = np.concatenate([h, t[back], self.sample(rng, *everywhere)])
        rels = np.concatenate([r, np.where(sym, r, self.inv[b])[back],
                               rng.integers(self.R, size=k)])
        tails = np.concatenate([t, h[back], self.sample(rng, *everywhere)])
        keep = heads != tails
        return (heads[keep] * self.R + rels[keep]) * self.E + tails[keep]


def _distinct_keys(rng, planted: _Planted, n: int, inverse_prob: float,
                   noise: float) -> np.ndarray:
    """At least ``n`` distinct triple keys, sorted; drawn in rounds sized by the last yield."""
    keys = np.empty(0, np.int64)
    n_facts = math.ceil(n / planted.expected_per_fact(inverse_prob, noise) * 1.1) + 16
    for _ in range(_MAX_ROUNDS):
        before = len(keys)
        keys = _unique(np.concatenate([keys, planted.draw(rng, n_facts, inverse_prob, noise)]))
        if len(keys) >= n:
            return keys
        gained = (len(keys) - before) / n_facts
        if gained < _MIN_YIELD:
            break
        n_facts = min(math.ceil((n - len(keys)) / gained * 1.2) + 16, 4 * n)
    raise InvalidArgument(f"found only {len(keys)} distinct triples of the {n} asked for: "
                          f"give more entities or relations")


def _unique(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of ``a`` (sort-based: numpy's hash-based unique is slower)."""
    a.sort()
    return a[np.concatenate([[True], a[1:] != a[:-1]])]


def _renumbered(train, valid, test, E: int, R: int) -> KG:
    """The KG with ids renumbered by first appearance in train and names e<id>, r<id>."""
    ent = _first_appearance(train[:, [0, 2]].ravel(), E)
    rel = _first_appearance(train[:, 1], R)

    def remap(t):
        return np.stack([ent[t[:, 0]], rel[t[:, 1]], ent[t[:, 2]]], axis=1)

    n_e, n_r = int(ent.max()) + 1, int(rel.max()) + 1
    return KG(list(map("e{}".format, range(n_e))), list(map("r{}".format, range(n_r))),
              remap(train), remap(valid), remap(test))


def _first_appearance(seq: np.ndarray, size: int) -> np.ndarray:
    """old id -> new id, new ids in order of first occurrence in ``seq`` (-1: absent)."""
    first = np.full(size, len(seq), np.int64)
    np.minimum.at(first, seq, np.arange(len(seq)))  # ~40x faster than unique(return_index)
    present = np.flatnonzero(first < len(seq))
    mapping = np.full(size, -1, np.int64)
    mapping[present[np.argsort(first[present])]] = np.arange(len(present))
    return mapping


# ------------------------------------------------------------------------------------- CLI


def generate_main(argv: list[str]) -> int:
    """``python -m adapm.apps.kge generate OUT_DIR --triples N [...]``: generate and write."""
    parser = argparse.ArgumentParser(
        prog="python -m adapm.apps.kge generate",
        description="Write a synthetic knowledge graph (train/valid/test.txt) to OUT_DIR.")
    parser.add_argument("out_dir", metavar="OUT_DIR")
    parser.add_argument("--triples", type=int, required=True, help="distinct triples in all")
    parser.add_argument("--entities", type=int, help="entities (default: triples / 20)")
    parser.add_argument("--relations", type=int, help="relations (default: ~4 log2(triples/100))")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    problem = directory_problem(args.out_dir)
    if problem:
        parser.error(problem)
    try:
        kg = generate(args.triples, num_entities=args.entities, num_relations=args.relations,
                      seed=args.seed)
        write(kg, args.out_dir)
    except InvalidArgument as exc:
        parser.error(str(exc))
    except OSError as exc:
        parser.error(f"{args.out_dir}: cannot write: {exc}")
    print(f"wrote {args.out_dir}: {kg.num_entities} entities, {kg.num_relations} relations, "
          f"{len(kg.train)} train / {len(kg.valid)} valid / {len(kg.test)} test triples")
    return 0
