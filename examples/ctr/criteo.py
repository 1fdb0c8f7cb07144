"""Click-through data in the Criteo layout: a generator of Criteo-like data and a reader.

The layout (Criteo's Kaggle and Terabyte sets): one example per line, tab-separated, 40 columns:
the label (0 or 1), 13 integer features (counts; may be empty) and 26 categorical features
(hashed values written as hex strings; may be empty).

``generate`` writes ``train.tsv`` and ``test.tsv`` of such data, drawn from a planted model:
each categorical field has its own cardinality (spread over several orders of magnitude, as
Criteo's) and Zipf-distributed values; the integer features are log-normal counts; the label is
a Bernoulli draw from a logistic model with a weight per categorical value, pairwise
interactions between some fields, and weights on the log counts. The best AUC is below 1, as on
real data, and ``planted_auc`` in ``meta.json`` says what the planted model itself reaches on
the test split.

``read`` turns a file into arrays a model eats: integer features as ``log(1 + max(x, 0))``
(0 when missing), and each categorical value as an index into one shared table, field by field:
field ``f`` owns the indices ``[offsets[f], offsets[f + 1])``; its index 0 stands for a missing
value or one seen fewer than ``min_count`` times in the training file (the vocabulary is built
from the training file alone, so test values it never saw map there too).

Command line: ``python examples/ctr/criteo.py generate DIR [--rows N] [--seed S]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

NUM_INTEGER = 13
NUM_CATEGORICAL = 26
COLUMNS = (["label"] + [f"I{i}" for i in range(1, NUM_INTEGER + 1)] +
           [f"C{i}" for i in range(1, NUM_CATEGORICAL + 1)])


class DataError(Exception):
    """A data file that cannot be used; the message names the file."""


# --- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocabulary:
    """Per categorical field, the training values kept (seen at least ``min_count`` times)."""

    values: tuple  # NUM_CATEGORICAL pyarrow string arrays
    min_count: int

    @property
    def offsets(self) -> np.ndarray:
        """Field f owns table indices [offsets[f], offsets[f + 1]); its first is "other"."""
        sizes = np.array([len(v) + 1 for v in self.values], dtype=np.int64)
        return np.concatenate(([0], np.cumsum(sizes)))

    @property
    def size(self) -> int:
        """Rows of the shared table."""
        return int(self.offsets[-1])


@dataclass(frozen=True)
class Examples:
    """Examples as arrays: ``dense`` float32 (n, 13), ``categorical`` int64 (n, 26) indices
    into the shared table, ``labels`` float32 (n,)."""

    dense: np.ndarray
    categorical: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def rows(self, index) -> Examples:
        return Examples(self.dense[index], self.categorical[index], self.labels[index])


def _read_table(path: str):
    """The file as an Arrow table of the 40 typed columns; a clear DataError otherwise."""
    import pyarrow as pa
    from pyarrow import csv

    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file (make one with: python examples/ctr/criteo.py "
                        "generate DIR)")
    types = {"label": pa.int8(), **{c: pa.int64() for c in COLUMNS[1:1 + NUM_INTEGER]},
             **{c: pa.string() for c in COLUMNS[1 + NUM_INTEGER:]}}
    try:
        table = csv.read_csv(
            path, read_options=csv.ReadOptions(column_names=COLUMNS),
            parse_options=csv.ParseOptions(delimiter="\t", quote_char=False),
            convert_options=csv.ConvertOptions(column_types=types, strings_can_be_null=True,
                                               null_values=[""]))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Arrow's message quotes the row (binary garbage too) and not its line: find the line.
        bad = _first_bad_line(path)
        if bad is None:
            raise DataError(f"{path}: not in {_LAYOUT}") from None
        line, what = bad
        raise DataError(f"{path}: line {line}: {what}" if line else f"{path}: {what}") \
            from None
    if not len(table):
        raise DataError(f"{path}: no examples (the file has no lines)")
    return table


_LAYOUT = "the Criteo layout: label, 13 integers, 26 categorical values, tab-separated"


def _first_bad_line(path: str) -> tuple[int, str] | None:
    """(line number, what is wrong) of the file's first line outside the Criteo layout, (0,
    "no examples...") for a file without lines, or None when every line is fine. Reads the file
    line by line in Python: only for a file that Arrow refused."""
    lines = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            fields = raw.rstrip(b"\r\n").split(b"\t")
            if fields == [b""]:
                continue  # empty lines are skipped, by Arrow too
            lines += 1
            if len(fields) != len(COLUMNS):
                return number, f"{len(fields)} columns, expected {len(COLUMNS)} ({_LAYOUT})"
            if fields[0] not in (b"0", b"1"):
                return number, f"the label must be 0 or 1{_shown(fields[0])}"
            for j, field in enumerate(fields[1:1 + NUM_INTEGER], start=1):
                if field and not (re.fullmatch(rb"[+-]?[0-9]+", field) and
                                  -2 ** 63 <= int(field) < 2 ** 63):
                    return number, (f"column {j + 1} (integer feature I{j}) is not a 64-bit "
                                    f"integer{_shown(field)}")
            for j, field in enumerate(fields[1 + NUM_INTEGER:], start=1):
                try:
                    field.decode("utf-8")
                except UnicodeDecodeError:
                    return number, (f"column {j + 1 + NUM_INTEGER} (categorical feature C{j}) "
                                    f"is not UTF-8 text")
    return (0, "no examples (the file has no lines)") if not lines else None


def _shown(field: bytes) -> str:
    """`` ('text')`` for a short printable field, else nothing (no binary garbage echoed)."""
    if len(field) <= 24 and all(32 <= c < 127 for c in field):
        return f" ({field.decode()!r})"
    return ""


def build_vocabulary(path: str, min_count: int = 1) -> Vocabulary:
    """The vocabulary of the training file ``path``: per field, the values seen at least
    ``min_count`` times, in order of first appearance."""
    import pyarrow.compute as pc

    if min_count < 1:
        raise DataError(f"min_count must be >= 1, got {min_count}")
    table = _read_table(path)
    values = []
    for name in COLUMNS[1 + NUM_INTEGER:]:
        counts = pc.value_counts(table[name].drop_null())
        keep = pc.greater_equal(counts.field("counts"), min_count)
        values.append(counts.field("values").filter(keep))
    return Vocabulary(tuple(values), min_count)


def read(path: str, vocabulary: Vocabulary) -> Examples:
    """Examples of the file ``path`` (Criteo layout) with categorical values looked up in
    ``vocabulary``. Raises DataError naming the file for anything malformed."""
    import pyarrow.compute as pc

    table = _read_table(path)
    labels = table["label"].to_numpy(zero_copy_only=False)
    if table["label"].null_count or not np.isin(labels, (0, 1)).all():
        bad = int(np.flatnonzero(~np.isin(labels, (0, 1)))[0]) if not \
            table["label"].null_count else int(np.flatnonzero(
                table["label"].is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{path}: line {bad + 1}: the label must be 0 or 1")
    dense = np.zeros((len(table), NUM_INTEGER), dtype=np.float32)
    for j, name in enumerate(COLUMNS[1:1 + NUM_INTEGER]):
        counts = table[name].fill_null(0).to_numpy()
        dense[:, j] = np.log1p(np.maximum(counts, 0))
    offsets = vocabulary.offsets
    categorical = np.empty((len(table), NUM_CATEGORICAL), dtype=np.int64)
    for f, name in enumerate(COLUMNS[1 + NUM_INTEGER:]):
        at = pc.index_in(table[name], value_set=vocabulary.values[f])
        categorical[:, f] = at.fill_null(-1).to_numpy(zero_copy_only=False) + 1 + offsets[f]
    return Examples(dense, categorical, labels.astype(np.float32))


# --- generating ----------------------------------------------------------------------------------

# Criteo's cardinalities run from a handful of values to tens of millions per field; these are
# spread geometrically from _SMALLEST up to the --vocab size, in a seeded order over the fields.
_SMALLEST = 4
_ZIPF = 1.1               # exponent of the values' power law (heavy head, long tail)
_POSITIVES = 0.25         # logits shifted so that a quarter are positive (labels: ~31% clicks)
_INTERACTIONS = 8         # field pairs with a planted interaction
_LATENT = 4               # dimension of the planted interaction vectors


# What generate holds in memory at its peak (measured): about this many bytes per categorical
# value (of all fields: weights, latent vectors, hex strings, Zipf tables) and per row (the
# columns, the table, the CSV writer's buffers), and a base.
_BYTES_PER_VALUE = 60
_BYTES_PER_ROW = 800
_BYTES_BASE = 200 << 20


def _needed_bytes(rows: int, vocab: int) -> float:
    values = float(np.geomspace(_SMALLEST, float(vocab), NUM_CATEGORICAL).sum())
    return _BYTES_BASE + _BYTES_PER_VALUE * values + _BYTES_PER_ROW * float(rows)


def _available_bytes() -> float | None:
    """Memory available to a new allocation (MemAvailable), or None where it is not known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _check_memory(rows: int, vocab: int) -> None:
    """DataError, before anything is allocated, when ``rows`` and ``vocab`` need more memory
    than is available (the system would kill the process part way, without a word)."""
    available = _available_bytes()
    if available is None or _needed_bytes(rows, vocab) <= available:
        return
    gib = 1 << 30
    fits = _SMALLEST
    if _needed_bytes(rows, _SMALLEST) <= available:  # the largest vocab that fits, by bisection
        high = vocab
        while high - fits > max(1, fits // 100):
            middle = (fits + high) // 2
            fits, high = (middle, high) if _needed_bytes(rows, middle) <= available else \
                (fits, middle)
    advice = (f"with --rows {rows}, a --vocab up to about {fits:,} fits" if fits > _SMALLEST
              else "fewer --rows")
    raise DataError(f"generate: --rows {rows:,} and --vocab {vocab:,} need about "
                    f"{_needed_bytes(rows, vocab) / gib:,.1f} GiB of memory (the values of all "
                    f"26 fields, up to --vocab each, and the rows are held in memory), "
                    f"{available / gib:,.1f} GiB are available: {advice}")


def _finite(value: float) -> float | None:
    """``value``, or None for NaN (JSON has no NaN)."""
    return None if math.isnan(value) else value


def _cardinalities(vocab: int, rng) -> np.ndarray:
    sizes = np.geomspace(_SMALLEST, vocab, NUM_CATEGORICAL).astype(np.int64)
    return rng.permutation(sizes)


def _hex_strings(codes: np.ndarray):
    """uint32 codes as 8-digit lowercase hex strings (an Arrow string array), vectorised."""
    import pyarrow as pa

    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    chars = digits[(codes[:, None] >> shifts) & 0xF].astype(np.uint8)
    offsets = np.arange(0, 8 * len(codes) + 1, 8, dtype=np.int32)
    return pa.StringArray.from_buffers(len(codes), pa.py_buffer(offsets),
                                       pa.py_buffer(chars.tobytes()))


def _value_codes(field: int, cardinality: int) -> np.ndarray:
    """Distinct 32-bit codes standing for a field's values (as Criteo's hashed values): an
    invertible mix of (field, rank), so no two values of a field share one."""
    x = (np.arange(cardinality, dtype=np.uint64) + np.uint64(field) * np.uint64(2 ** 27))
    x = (x * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x2C1B3C6D)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(12)
    return x.astype(np.uint32)


def _zipf_ranks(cardinality: int, n: int, rng) -> np.ndarray:
    """n value ranks of one field, P(rank r) proportional to (r + 1) ** -_ZIPF."""
    weights = np.arange(1, cardinality + 1, dtype=np.float64) ** -_ZIPF
    cdf = np.cumsum(weights)
    return np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right").clip(0, cardinality - 1)


def generate(directory: str, rows: int = 200_000, vocab: int = 100_000, test_share: float = 0.2,
             seed: int = 0) -> dict:
    """Write ``train.tsv``, ``test.tsv`` (Criteo layout) and ``meta.json`` under ``directory``;
    returns the meta data. Deterministic for a seed."""
    import pyarrow as pa
    from pyarrow import csv

    if rows < 10 or not 0 < test_share < 1 or vocab < _SMALLEST:
        raise DataError(f"generate: need rows >= 10, 0 < test_share < 1, vocab >= {_SMALLEST}")
    _check_memory(rows, vocab)
    rng = np.random.default_rng(seed)
    cards = _cardinalities(vocab, rng)
    missing = rng.choice([0.0, 0.0, 0.05, 0.3], NUM_CATEGORICAL)  # share of empty values
    logit = np.zeros(rows)
    columns = {}
    # Integer features: log-normal counts, some missing; planted weights on their logs.
    for j in range(NUM_INTEGER):
        counts = np.floor(np.exp(rng.normal(rng.uniform(0, 3), 1.2, rows))).astype(np.int64) - 1
        logit += rng.normal(0, 0.15) * np.log1p(np.maximum(counts, 0))
        empty = rng.random(rows) < rng.choice([0.0, 0.2, 0.4])
        columns[COLUMNS[1 + j]] = pa.array(counts, mask=empty)
    # Categorical features: Zipf values with a planted weight each, and latent vectors for
    # the pairwise interactions.
    ranks = np.empty((rows, NUM_CATEGORICAL), dtype=np.int64)
    present = np.empty((rows, NUM_CATEGORICAL), dtype=bool)
    latent = []
    for f in range(NUM_CATEGORICAL):
        ranks[:, f] = _zipf_ranks(int(cards[f]), rows, rng)
        present[:, f] = rng.random(rows) >= missing[f]
        weight = rng.normal(0, 0.3, cards[f])
        logit += np.where(present[:, f], weight[ranks[:, f]], 0.0)
        latent.append(rng.normal(0, 0.4, (cards[f], _LATENT)))
        strings = _hex_strings(_value_codes(f, int(cards[f])))
        columns[COLUMNS[1 + NUM_INTEGER + f]] = pa.DictionaryArray.from_arrays(
            pa.array(ranks[:, f], mask=~present[:, f]), strings).cast(pa.string())
    pairs = rng.choice(NUM_CATEGORICAL, (_INTERACTIONS, 2), replace=True)
    for f, g in pairs:
        both = present[:, f] & present[:, g]
        logit += np.where(both, (latent[f][ranks[:, f]] * latent[g][ranks[:, g]]).sum(1), 0.0)
    # A quarter of the logits positive; the labels, Bernoulli draws, have more clicks (~31%):
    # the other three quarters' probabilities are not 0.
    logit -= np.quantile(logit, 1 - _POSITIVES)
    probability = 1 / (1 + np.exp(-logit))
    labels = (rng.random(rows) < probability).astype(np.int8)
    table = pa.table({"label": labels, **columns})
    os.makedirs(directory, exist_ok=True)
    test_rows = max(1, int(rows * test_share))
    options = csv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    csv.write_csv(table.slice(0, rows - test_rows), os.path.join(directory, "train.tsv"), options)
    csv.write_csv(table.slice(rows - test_rows), os.path.join(directory, "test.tsv"), options)
    meta = {"rows": rows, "train_rows": rows - test_rows, "test_rows": test_rows,
            "vocab": vocab, "seed": seed, "positives": float(labels.mean()),
            "cardinalities": cards.tolist(),
            # None (null) when the test split holds one class only: no AUC exists then.
            "planted_auc": _finite(auc(probability[rows - test_rows:], labels[rows - test_rows:]))}
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return meta


# --- metrics ------------------------------------------------------------------------------------


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a random positive scores above a random
    negative, ties counting half (Mann-Whitney U from average ranks)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels) > 0.5
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    # Average rank (1-based) of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    run_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(run_rank, ends - starts)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def logloss(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy (natural log), probabilities clipped away from 0 and 1."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels, dtype=np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def main(argv=None) -> int:
    # here: the reader needs no adapm
    from adapm._argtypes import float_in, int_in, non_negative_int

    parser = argparse.ArgumentParser(prog="python examples/ctr/criteo.py",
                                     description="Criteo-like click data: generate it.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write train.tsv, test.tsv and meta.json to DIR")
    gen.add_argument("directory", metavar="DIR")
    gen.add_argument("--rows", type=int_in(10), default=200_000,
                     help="examples in all (at least 10)")
    gen.add_argument("--vocab", type=int_in(_SMALLEST), default=100_000,
                     help="values of the largest categorical field (the others have fewer); "
                          "what fits in memory")
    gen.add_argument("--test-share", type=float_in(0, 1, low_open=True, high_open=True),
                     default=0.2,
                     help="share of rows held out, in (0, 1)")
    gen.add_argument("--seed", type=non_negative_int, default=0,
                     help="seed of the data and planted model")
    opts = parser.parse_args(argv)
    try:
        meta = generate(opts.directory, opts.rows, opts.vocab, opts.test_share, opts.seed)
    except DataError as exc:
        print(f"criteo.py: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output path that is a file, or not writable
        print(f"criteo.py: error: {opts.directory}: cannot write: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in meta.items() if k != "cardinalities"}))
    if meta["planted_auc"] is None:
        print("note: the test split holds one class only: no planted AUC (null)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
