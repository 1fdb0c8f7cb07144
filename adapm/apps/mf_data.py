"""Sparse matrices for the matrix-factorisation app: :func:`read_matrix` and :func:`generate`.

Three formats, told apart by the first line:

- MatrixMarket coordinate: ``%%MatrixMarket matrix coordinate real general`` (``integer``
  instead of ``real``, ``symmetric`` instead of ``general``), ``%`` comment lines, a size line
  ``rows cols entries``, then one ``row col value`` line per entry, 1-based. The entries must
  match the size line in number and range. A symmetric file stores one triangle (the format
  says the lower); each entry off the diagonal is also read as its mirror image, so the matrix
  has both triangles (``entries`` counts the file's lines, as the format).
- Text: ``row<TAB>col<TAB>value`` lines (blanks work too), 0-based; the shape is the largest ids
  plus one (over the train and the test file, see :func:`read_pair`).
- A table, as ratings are shipped (``userId,movieId,rating,timestamp``): a header line (its
  first character a letter, a quote or ``_``), fields separated by commas or by tabs, told by
  the header; or, with ``delimiter`` (the app's ``--delimiter``), any separator of 1-4
  characters (``;``, ``|``, MovieLens 1M's ``::``), with or without a header. The first three
  fields are the row label, the column label (integers, any values) and the value, further
  fields are ignored. Labels become rows and columns in sorted order over all files of a run
  (the matrix's ``row_labels`` and ``col_labels`` keep them: row i of the model is label
  ``row_labels[i]``).

Parsing runs in native code over blocks of the file (``native/kernels/mf.c``). Bad files raise
:class:`~.datafiles.DataError` as ``FILE:LINE: message``.

:func:`generate` writes a train and a test file drawn from a planted low-rank matrix plus
Gaussian noise, with Zipf-skewed row and column ids, deterministically from a seed. The cells
are drawn in one piece, so memory grows with the entries: 100M entries peaked at 9.6 GB here.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from .. import _argtypes
from .._native_loader import load as _load
from .datafiles import DataError, write_atomically
from .outputs import directory_problem

_kernels = _load("adapm._kernels")

_BLOCK = 1 << 26  # bytes parsed per native call (see wv_data._BLOCK)
MM_HEADER = "%%matrixmarket"
_BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark
_MM_FIELDS = ("real", "integer")
_MM_SYMMETRIES = ("general", "symmetric")


@dataclass(frozen=True, eq=False)
class Matrix:
    """Entries (rows[i], cols[i], vals[i]) of a num_rows x num_cols matrix."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    num_rows: int
    num_cols: int
    row_labels: Optional[np.ndarray] = None  # a table's labels of rows 0, 1, ... (else None)
    col_labels: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.rows)


def _mm_header(path, f) -> tuple[int, int, int, int, bool]:
    """(rows, cols, entries, lines of the header, symmetric) of the MatrixMarket file open as f,
    read up to and including its size line (comments may run for any length)."""
    first = f.readline()
    text = first.decode("utf-8", "replace").strip()
    banner = text.lower().split()
    if (len(banner) != 5 or banner[0] != MM_HEADER or banner[1] != "matrix"
            or banner[2] != "coordinate" or banner[3] not in _MM_FIELDS
            or banner[4] not in _MM_SYMMETRIES):
        raise DataError(f"{path}:1: expected '%%MatrixMarket matrix coordinate real general' "
                        f"(or integer, or symmetric), got '{_shorten(text)}'")
    symmetric = banner[4] == "symmetric"
    number = 1
    for line in iter(f.readline, b""):
        number += 1
        text = line.decode("utf-8", "replace").strip()
        if not text or text.startswith("%"):
            continue
        fields = text.split()
        try:
            rows, cols, entries = (int(f) for f in fields)
            if rows < 1 or cols < 1 or entries < 0:
                raise ValueError
        except ValueError:
            raise DataError(f"{path}:{number}: expected the size line 'rows cols entries' "
                            f"(positive), got '{_shorten(text)}'") from None
        if symmetric and rows != cols:
            raise DataError(f"{path}:{number}: a symmetric matrix must be square, the size "
                            f"line says {rows} x {cols}")
        return rows, cols, entries, number, symmetric
    raise DataError(f"{path}: no size line 'rows cols entries' after the MatrixMarket header")


def _shorten(text: str) -> str:
    """``text`` for a message: at most 80 characters."""
    return text if len(text) <= 80 else text[:77] + "..."


def read_matrix(path, shape: tuple[int, int] | None = None,
                delimiter: Optional[str] = None) -> Matrix:
    """Read ``path`` in either format (see the module doc). ``shape`` bounds a text file's ids
    (a MatrixMarket file has its own); without it the shape is the largest ids plus one.
    ``delimiter`` (see :func:`check_delimiter`) reads the file as a table with that separator,
    with or without a header line (a MatrixMarket file is read as such all the same); None tells
    a table by its header line, comma or tab."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror}") from None
    with f:
        # A UTF-8 byte order mark (Excel's "CSV UTF-8") is not part of the first line.
        start = len(_BOM) if f.read(len(_BOM)) == _BOM else 0
        f.seek(start)
        market = f.read(len(MM_HEADER)).lower() == MM_HEADER.encode()
        f.seek(start)
        declared, line_base, carry, symmetric = None, 0, b"", False
        if market:  # its own format: a delimiter is for tables
            *declared, line_base, symmetric = _mm_header(path, f)
            delimiter = None
        else:
            delimiter, line_base = _table_header(path, f, delimiter)
        header_lines = line_base
        # The native parser splits tables at a comma or a tab; another delimiter becomes a tab
        # first (one bytes.replace per block), in a file that must then hold no tab itself.
        sep = delimiter if delimiter in (None, ",", "\t") else "\t"
        parts = []
        while True:
            block = f.read(_BLOCK)
            data = carry + block
            if not data:
                break
            cut = len(data) if not block else data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            text, carry = data[:cut], data[cut:]
            parsed = text
            if delimiter is not None and sep != delimiter:
                if b"\t" in text:
                    number = line_base + text.count(b"\n", 0, text.index(b"\t")) + 1
                    raise DataError(f"{path}:{number}: a tab in a file read with --delimiter "
                                    f"{delimiter!r} (give --delimiter tab, or remove the tabs)")
                if delimiter == " ":  # columns aligned by runs of spaces: one separator
                    parsed = _SPACE_RUN.sub(b"\t", _EDGE_SPACES.sub(b"", text))
                else:
                    parsed = text.replace(delimiter.encode(), b"\t")
            room = text.count(b"\n") + 1
            rows, cols = np.empty(room, np.int64), np.empty(room, np.int64)
            vals, lines = np.empty(room, np.float32), np.empty(room, np.int64)
            got = _kernels.mf_parse(parsed, market, 1 if market else 0, rows, cols, vals, lines,
                                    sep=sep or "\0")
            if got < 0:
                shown = "<TAB>" if delimiter == "\t" else delimiter
                expected = ("'row col value' (two integers and a finite number)"
                            if delimiter is None else
                            f"'row{shown}column{shown}value' (two labels and a finite number)")
                bad = _line(text, -got)
                if delimiter is not None and _text_labels(_line(text, -got, None), delimiter):
                    return _read_text_table(path, delimiter, start, header_lines)
                hint = ""
                if delimiter is None and "," in bad:
                    hint = (" (a comma-separated file needs a header line, e.g. "
                            "'userId,movieId,rating', or --delimiter ,)")
                elif delimiter is None and not market and len(bad.split()) > 3:
                    hint = (" (a table with more columns, such as MovieLens' u.data with its "
                            "timestamps, needs a header line or --delimiter tab)")
                raise DataError(f"{path}:{line_base - got}: expected {expected}, got "
                                f"'{bad}'{hint}")
            parts.append((rows[:got].copy(), cols[:got].copy(), vals[:got].copy(),
                          lines[:got] + line_base))
            line_base += text.count(b"\n")
    if not parts or not sum(len(p[0]) for p in parts):
        raise DataError(f"{path}: no entries")
    rows, cols, vals, lines = (np.concatenate(column) for column in zip(*parts))
    if delimiter is not None:  # labels: read_files maps them to rows and columns over all files
        return Matrix(rows, cols, vals, 0, 0, np.unique(rows), np.unique(cols))
    if market:
        num_rows, num_cols, entries = declared
        if entries != len(rows):
            raise DataError(f"{path}: the size line declares {entries} entries, the file has "
                            f"{len(rows)}")
    elif shape is not None:
        num_rows, num_cols = shape
    else:
        num_rows, num_cols = int(rows.max()) + 1, int(cols.max()) + 1
    for ids, size, what in ((rows, num_rows, "row"), (cols, num_cols, "column")):
        bad = np.flatnonzero((ids < 0) | (ids >= size))
        if len(bad):
            i = bad[0]
            shown = ids[i] + (1 if market else 0)
            raise DataError(f"{path}:{lines[i]}: {what} id {shown} is outside "
                            f"[{1 if market else 0}, {size + (1 if market else 0)})")
    if symmetric:
        rows, cols, vals = _mirror(rows, cols, vals)
    return Matrix(rows, cols, vals, num_rows, num_cols)


def _mirror(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> tuple:
    """A symmetric MatrixMarket file's entries, both triangles: each off-diagonal entry (i, j)
    also as (j, i). (The format stores one triangle; which one the file used does not matter.)"""
    off = rows != cols
    return (np.concatenate([rows, cols[off]]), np.concatenate([cols, rows[off]]),
            np.concatenate([vals, vals[off]]))


# --delimiter space: the spaces at a line's ends go, each run of spaces between is one separator.
_EDGE_SPACES = re.compile(rb"^ +| +(?=\r?$)", re.MULTILINE)
_SPACE_RUN = re.compile(rb" +")

# Names a delimiter may be given by on the command line, besides itself.
_DELIMITER_NAMES = {"tab": "\t", "comma": ",", "semicolon": ";", "pipe": "|", "space": " "}


def check_delimiter(text: str) -> str:
    """A table delimiter from the command line: ``tab``, ``comma``, ``semicolon``, ``pipe``,
    ``space`` or the characters themselves (1 to 4, e.g. ``::`` as MovieLens 1M's
    ``ratings.dat``). Raises ValueError for one that could be part of a number or a line end."""
    delimiter = _DELIMITER_NAMES.get(text.lower(), text)
    if not 1 <= len(delimiter) <= 4 or any(c in "0123456789.+-eE\r\n" for c in delimiter) \
            or (delimiter.isspace() and delimiter not in (" ", "\t")):
        raise ValueError(f"a delimiter is 1 to 4 characters that cannot be part of a number "
                         f"(or tab, comma, semicolon, pipe, space), got {text!r}")
    return delimiter


def _table_header(path, f, delimiter: Optional[str]) -> tuple[Optional[str], int]:
    """(the table delimiter, lines of the header: 0 or 1) of the file open as f, which is left
    after its header line if it has one: a first line that starts with a letter, a quote or
    '_' and whose third field is not a number (one that is, such as 'A1XY,0345417623,5.0', is
    the first entry of a table without a header). Without ``delimiter`` the first line tells a
    comma or a tab; with neither the file is not a table (None, 0)."""
    at = f.tell()  # after a byte order mark, if any
    first = f.readline()
    text = first.decode("utf-8", "replace").strip()
    if not text or not (text[0].isalpha() or text[0] in "\"'_,\t"):
        f.seek(at)
        return delimiter, 0
    raw = first.decode("utf-8", "replace").rstrip("\r\n")  # strip() would take a leading tab
    seps = [delimiter] if delimiter is not None else [s for s in (",", "\t") if s in raw]
    for sep in seps:
        fields = _fields(raw, sep)
        if len(fields) < 3:
            continue
        if _finite32(fields[2]) is not None:  # an entry: a table without a header
            f.seek(at)
            return sep, 0
        if not fields[0]:
            raise DataError(f"{path}:1: the header's first column has no name, as pandas' "
                            f"to_csv() (or R's write.csv) writes its index: write the table "
                            f"without it (index=False, row.names=FALSE) or drop that column, "
                            f"got '{_shorten(text)}'")
        return sep, 1
    if text[0] in ",\t":
        f.seek(at)
        return delimiter, 0
    shown = repr(delimiter) if delimiter is not None else "commas or tabs (or give --delimiter)"
    raise DataError(f"{path}:1: a header line needs three fields (row, column, value) "
                    f"separated by {shown}, got '{_shorten(text)}'")


def _fields(line: str, delimiter: str) -> list[str]:
    """A table line's fields: split at ``delimiter`` as a CSV reader does (quotes taken off, a
    delimiter inside quotes kept) for one character, at runs of spaces for ' ', else at each
    occurrence; blanks around each field taken off."""
    if delimiter == " ":
        return line.split()
    if len(delimiter) == 1:
        return [f.strip() for f in next(csv.reader([line], delimiter=delimiter))]
    return [f.strip().strip('"') for f in line.split(delimiter)]


def _text_labels(line: str, delimiter: str) -> bool:
    """Whether a table's line that the native parser refused (it takes plain int64 labels,
    unquoted) is an entry all the same: its labels then are text, such as 'A2XYZ', an ISBN's
    '0345417623' (which as an integer would be one item with '345417623'), a quoted label or
    a 64-bit hash."""
    fields = _fields(line, delimiter)
    return len(fields) >= 3 and all(fields[:2]) and _finite32(fields[2]) is not None


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _finite32(text: str) -> Optional[float]:
    """The number ``text`` holds if it is one that float32 holds finitely, else None."""
    if "_" in text:  # Python's float() takes '1_000'; the native parser does not
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and abs(value) <= _FLOAT32_MAX else None


def _read_text_table(path, delimiter: str, start: int, header_lines: int) -> Matrix:
    """A table whose labels are not all plain integers, read in Python with its labels as text
    (the native parser takes tables of integer labels, much faster). ``start``: the bytes of a
    byte order mark; ``header_lines``: 0 or 1."""
    data = Path(path).read_bytes()[start:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{path}:{line}: not valid UTF-8") from None
    shown = "<TAB>" if delimiter == "\t" else delimiter
    rows, cols, vals = [], [], []
    for number, line in enumerate(text.split("\n"), 1):
        if number <= header_lines or not line.strip():
            continue
        fields = _fields(line, delimiter)
        value = _finite32(fields[2]) if len(fields) >= 3 and all(fields[:2]) else None
        if value is None:
            raise DataError(f"{path}:{number}: expected 'row{shown}column{shown}value' (two "
                            f"labels and a finite number), got '{line.strip()[:80]}'")
        rows.append(fields[0])
        cols.append(fields[1])
        vals.append(value)
    if not rows:
        raise DataError(f"{path}: no entries")
    # object arrays (references to the strs): a fixed-width str array of one long label's
    # width would hold every label at that width
    rows, cols = np.array(rows, dtype=object), np.array(cols, dtype=object)
    return Matrix(rows, cols, np.array(vals, np.float32), 0, 0, np.unique(rows), np.unique(cols))


def _line(text: bytes, number: int, limit: Optional[int] = 80) -> str:
    line = text.split(b"\n")[number - 1]
    return line[:limit].decode("utf-8", "replace")


def read_pair(train_path, test_path, delimiter: Optional[str] = None) -> tuple[Matrix, Matrix]:
    """The train and the test matrix (see :func:`read_files`)."""
    train, test = read_files(train_path, test_path, delimiter=delimiter)
    return train, test


def read_files(train_path, *others, delimiter: Optional[str] = None) -> list[Matrix]:
    """The train matrix and the others (test, validation), of one shape: a MatrixMarket file's
    declared one (all must agree), the largest ids of all files plus one, or for tables (a
    header line, or ``delimiter``) the labels of all files, sorted."""
    matrices = [read_matrix(p, delimiter=delimiter) for p in (train_path, *others)]
    paths = [train_path, *others]
    labelled = [m.row_labels is not None for m in matrices]
    if any(labelled):
        if not all(labelled):
            bad = paths[labelled.index(False)]
            raise DataError(f"{bad}: not a table (no header line, or MatrixMarket), while "
                            f"{paths[labelled.index(True)]} is one (give every file in one "
                            f"format)")
        # Text labels in one file: every file's as text (a plain integer's is its decimal form).
        if any(m.row_labels.dtype == object or m.col_labels.dtype == object
               for m in matrices):
            matrices = [_as_text(m) for m in matrices]
        row_labels = np.unique(np.concatenate([m.row_labels for m in matrices]))
        col_labels = np.unique(np.concatenate([m.col_labels for m in matrices]))
        return [Matrix(np.searchsorted(row_labels, m.rows), np.searchsorted(col_labels, m.cols),
                       m.vals, len(row_labels), len(col_labels), row_labels, col_labels)
                for m in matrices]
    shape = (max(m.num_rows for m in matrices), max(m.num_cols for m in matrices))
    for m, path in zip(matrices, paths):
        if (m.num_rows, m.num_cols) != shape and _is_market(path):
            raise DataError(f"{path}: its shape {m.num_rows} x {m.num_cols} differs from the "
                            f"other file's")
    return [Matrix(m.rows, m.cols, m.vals, *shape) for m in matrices]


def _as_text(m: Matrix) -> Matrix:
    """``m`` with text labels (object arrays of str): integer ones as their decimal text,
    made once per distinct label."""
    def text(ids: np.ndarray, labels: np.ndarray) -> tuple:
        if labels.dtype == object:
            return ids, labels
        names = np.array([str(x) for x in labels.tolist()], dtype=object)
        return names[np.searchsorted(labels, ids)], names

    (rows, row_labels), (cols, col_labels) = text(m.rows, m.row_labels), text(m.cols, m.col_labels)
    return Matrix(rows, cols, m.vals, 0, 0, row_labels, col_labels)


def _is_market(path) -> bool:
    """Whether the file starts with the MatrixMarket banner (read_matrix's test)."""
    with open(path, "rb") as f:
        head = f.read(len(_BOM) + len(MM_HEADER))
    return head.removeprefix(_BOM)[:len(MM_HEADER)].lower() == MM_HEADER.encode()


# -------------------------------------------------------------------------------- generator


def generate(out_dir, rows: int = 2000, cols: int = 500, entries: int = 50_000, *,
             rank: int = 10, noise: float = 0.1, skew: float = 0.8, test_fraction: float = 0.1,
             fmt: str = "mm", seed: int = 0) -> dict:
    """``train`` and ``test`` files (``.mmc``: MatrixMarket, or ``.tsv``) in ``out_dir``:
    ``entries`` distinct cells of a rows x cols matrix, ids drawn Zipf(``skew``) over a random
    order of the rows and of the columns, values ``<W*[i], H*[j]> + noise * N(0, 1)`` with W*, H*
    normal with standard deviation rank^-1/4 (so the planted values have variance about 1); a random
    ``test_fraction`` of the cells goes to the test file."""
    if rows < 1 or cols < 1 or entries < 2 or entries > rows * cols // 2:
        raise ValueError("generate: need rows, cols >= 1 and 2 <= entries <= rows * cols / 2")
    test_n = max(1, int(round(entries * test_fraction)))  # the test file is never empty
    if not (0 <= test_fraction < 1 and test_n < entries):
        raise ValueError(f"generate: test_fraction must leave both files entries, got "
                         f"{test_fraction}")
    if rank < 1 or not noise >= 0 or fmt not in ("mm", "tsv"):
        raise ValueError("generate: need rank >= 1, noise >= 0 and fmt 'mm' or 'tsv'")
    rng = np.random.default_rng([seed, 31])

    cells = np.empty(0, dtype=np.int64)
    row_w = 1.0 / np.arange(1, rows + 1) ** skew
    col_w = 1.0 / np.arange(1, cols + 1) ** skew
    row_cdf, col_cdf = np.cumsum(row_w / row_w.sum()), np.cumsum(col_w / col_w.sum())
    row_ids, col_ids = rng.permutation(rows), rng.permutation(cols)
    while len(cells) < entries:  # distinct cells: draw, drop repeats, draw the rest again
        n = int((entries - len(cells)) * 1.2) + 16
        r = row_ids[np.minimum(np.searchsorted(row_cdf, rng.random(n)), rows - 1)]
        c = col_ids[np.minimum(np.searchsorted(col_cdf, rng.random(n)), cols - 1)]
        cells = np.unique(np.concatenate([cells, r.astype(np.int64) * cols + c]))
    cells = cells[rng.permutation(len(cells))[:entries]]
    r, c = cells // cols, cells % cols
    scale = rank ** -0.25  # each product w_z h_z has variance 1 / rank: their sum about 1
    w = rng.normal(0.0, scale, (rows, rank)).astype(np.float32)
    h = rng.normal(0.0, scale, (cols, rank)).astype(np.float32)
    vals = np.empty(entries, dtype=np.float32)
    chunk = 1 << 20
    for i in range(0, entries, chunk):
        vals[i:i + chunk] = np.einsum("ij,ij->i", w[r[i:i + chunk]], h[c[i:i + chunk]])
    vals += (noise * rng.standard_normal(entries)).astype(np.float32)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ".mmc" if fmt == "mm" else ".tsv"
    paths = {}
    for name, sl in (("train", slice(test_n, None)), ("test", slice(0, test_n))):
        path = out / f"{name}{suffix}"
        _write(path, r[sl], c[sl], vals[sl], rows, cols, fmt)
        paths[name] = str(path)
    return {**paths, "rows": rows, "cols": cols, "train_entries": entries - test_n,
            "test_entries": test_n}


def _write(path: Path, r, c, v, rows: int, cols: int, fmt: str) -> None:
    def write(f) -> None:
        if fmt == "mm":
            f.write(f"%%MatrixMarket matrix coordinate real general\n"
                    f"% generated by python -m adapm.apps.mf generate\n"
                    f"{rows} {cols} {len(r)}\n".encode())
        base, sep = (1, " ") if fmt == "mm" else (0, "\t")
        chunk = 1 << 20
        for i in range(0, len(r), chunk):
            f.write(_kernels.mf_format(r[i:i + chunk], c[i:i + chunk], v[i:i + chunk], base,
                                       sep))

    write_atomically(path, write)


def generate_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m adapm.apps.mf generate",
                                description="Write train and test files of a planted low-rank "
                                            "matrix plus noise, Zipf-skewed ids.")
    p.add_argument("out_dir")
    p.add_argument("--rows", type=_argtypes.positive_int, default=2000)
    p.add_argument("--cols", type=_argtypes.positive_int, default=500)
    p.add_argument("--entries", type=_argtypes.positive_int, default=50_000,
                   help="distinct cells, train and test together")
    p.add_argument("--rank", type=_argtypes.positive_int, default=10, help="planted rank")
    p.add_argument("--noise", type=_argtypes.non_negative_float, default=0.1,
                   help="standard deviation of the Gaussian noise")
    p.add_argument("--skew", type=_argtypes.non_negative_float, default=0.8,
                   help="Zipf exponent of the row and column ids")
    p.add_argument("--format", choices=("mm", "tsv"), default="mm")
    p.add_argument("--seed", type=_argtypes.non_negative_int, default=0)
    opts = p.parse_args(argv)
    if opts.entries < 2 or opts.entries > opts.rows * opts.cols // 2:
        p.error("--entries must be in [2, rows * cols / 2]")
    problem = directory_problem(opts.out_dir)
    if problem:
        p.error(problem)
    try:
        info = generate(opts.out_dir, opts.rows, opts.cols, opts.entries, rank=opts.rank,
                        noise=opts.noise, skew=opts.skew, fmt=opts.format, seed=opts.seed)
    except OSError as exc:
        p.error(f"{opts.out_dir}: cannot write: {exc}")
    print(f"wrote {info['train']} ({info['train_entries']} entries) and {info['test']} "
          f"({info['test_entries']}), {opts.rows} x {opts.cols}")
    return 0
