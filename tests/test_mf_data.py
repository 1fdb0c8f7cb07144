"""Matrix-factorisation data (adapm.apps.mf_data): read_matrix on MatrixMarket and text files
(block by block, with the line numbers of errors counted over the whole file), read_pair, and the
generator of planted low-rank matrices."""

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm.apps import mf_data
from adapm.apps.datafiles import DataError
from adapm.apps.mf_data import Matrix, generate, read_matrix, read_pair

BANNER = "%%MatrixMarket matrix coordinate real general\n"
HEAD = 1 << 16  # read_matrix reads the first 64 KiB apart from the blocks

# ------------------------------------------------------------------------------ helpers


def write(tmp_path, content, name="m.mtx"):
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    return path


def as_tuple(m):
    return (m.rows.tolist(), m.cols.tolist(), m.vals.tolist(), m.num_rows, m.num_cols)


def error_of(fn, path, *args, **kwargs):
    with pytest.raises(DataError) as info:
        fn(path, *args, **kwargs)
    msg = str(info.value)
    assert str(path) in msg, msg
    return msg


def big_text(n, start_line=1, base=0, rows=50, cols=37):
    """(text, rows, cols, vals) of n entry lines: ids i % rows, i % cols (plus base)."""
    i = np.arange(n)
    r, c = i % rows, (i * 7) % cols
    v = (i * 0.25 - 100.0).astype(np.float32)
    seps = ["\t", " ", " \t"]
    text = "".join(f"{r[k] + base}{seps[k % 3]}{c[k] + base}{seps[k % 3]}{float(v[k])!r}\n"
                   for k in range(n))
    return text, r.tolist(), c.tolist(), v.tolist()


# ---------------------------------------------------------------------------- MatrixMarket


MM_SMALL = (BANNER + "% a comment\n%\n   \n3 4 3\n% a comment after the size line\n"
            "1 1 1.5\n3 4 -2\n\n2 2 1e3\n")


def test_matrix_market_by_hand(tmp_path):
    m = read_matrix(write(tmp_path, MM_SMALL))
    assert isinstance(m, Matrix) and len(m) == 3
    assert as_tuple(m) == ([0, 2, 1], [0, 3, 1], [1.5, -2.0, 1000.0], 3, 4)
    assert m.rows.dtype == np.int64 and m.cols.dtype == np.int64 and m.vals.dtype == np.float32


@pytest.mark.parametrize("name,text", [
    ("crlf.mtx", MM_SMALL.replace("\n", "\r\n")),
    ("nofinal.mtx", MM_SMALL.rstrip("\n")),
    ("nofinal_crlf.mtx", MM_SMALL.replace("\n", "\r\n").rstrip("\r\n")),
    ("case.mtx", MM_SMALL.replace(BANNER, "%%matrixmarket MATRIX Coordinate REAL General\n")),
    ("integer.mtx", MM_SMALL.replace("real", "integer").replace("1.5", "2").replace(
        "1e3", "1000")),
    ("blanks.mtx", MM_SMALL.replace("3 4 3", " 3\t4  3 ").replace("1 1 1.5", "\t1\t1\t1.5 ")),
])
def test_matrix_market_variants(tmp_path, name, text):
    m = read_matrix(write(tmp_path, text, name))
    want_vals = [2.0, -2.0, 1000.0] if name == "integer.mtx" else [1.5, -2.0, 1000.0]
    assert as_tuple(m) == ([0, 2, 1], [0, 3, 1], want_vals, 3, 4)


def test_matrix_market_shape_is_the_declared_one(tmp_path):
    m = read_matrix(write(tmp_path, BANNER + "100 200 1\n1 1 1\n"))
    assert (m.num_rows, m.num_cols) == (100, 200)
    # shape= is for text files: a MatrixMarket file keeps its own
    m = read_matrix(write(tmp_path, BANNER + "100 200 1\n1 1 1\n"), shape=(5, 5))
    assert (m.num_rows, m.num_cols) == (100, 200)


def test_matrix_market_corner_ids(tmp_path):
    m = read_matrix(write(tmp_path, BANNER + "3 4 2\n3 4 1\n1 1 2\n"))
    assert as_tuple(m) == ([2, 0], [3, 0], [1.0, 2.0], 3, 4)


# ---------------------------------------------------------------------------- text files


def test_text_by_hand(tmp_path):
    m = read_matrix(write(tmp_path, "0\t0\t1\n2 3 -1.5\n\n1\t0\t2e-3\n", "m.tsv"))
    assert as_tuple(m) == ([0, 2, 1], [0, 3, 0], [1.0, -1.5, np.float32(2e-3).item()], 3, 4)


@pytest.mark.parametrize("text", ["0\t0\t1\r\n2\t3\t-1.5\r\n", "0 0 1\n2 3 -1.5",
                                  "  0  0 1 \n\n\n2\t 3\t-1.5\t\n\n"])
def test_text_variants(tmp_path, text):
    m = read_matrix(write(tmp_path, text, "m.tsv"))
    assert as_tuple(m) == ([0, 2], [0, 3], [1.0, -1.5], 3, 4)


def test_text_with_a_shape(tmp_path):
    path = write(tmp_path, "0\t0\t1\n2\t3\t-1.5\n", "m.tsv")
    m = read_matrix(path, shape=(10, 20))
    assert (m.num_rows, m.num_cols) == (10, 20)
    msg = error_of(read_matrix, path, shape=(2, 20))
    assert ":2:" in msg and "row id 2" in msg
    msg = error_of(read_matrix, path, shape=(3, 3))
    assert ":2:" in msg and "column id 3" in msg


# ---------------------------------------------------------------------------- blocks


@pytest.mark.parametrize("block", [1, 2, 7, 64])
def test_text_file_over_blocks(tmp_path, monkeypatch, block):
    """A text file past the 64 KiB head, read in small blocks, reads as one block does."""
    text, r, c, v = big_text(6000)
    assert HEAD < len(text) < HEAD + 40_000
    path = write(tmp_path, text.rstrip("\n"), "big.tsv")  # and no final newline
    whole = read_matrix(path)
    assert as_tuple(whole) == (r, c, v, 50, 37)
    monkeypatch.setattr(mf_data, "_BLOCK", block)
    assert as_tuple(read_matrix(path)) == as_tuple(whole)


@pytest.mark.parametrize("block", [1, 2, 7, 64])
def test_matrix_market_entries_across_the_head(tmp_path, monkeypatch, block):
    """Entries start inside the 64 KiB head and go on past it; small blocks read the rest."""
    text, r, c, v = big_text(6000, base=1)
    header = BANNER + "% comment\n" * 3 + "50 37 6000\n% after\n"
    path = write(tmp_path, header + text)
    whole = read_matrix(path)
    assert as_tuple(whole) == (r, c, v, 50, 37)
    monkeypatch.setattr(mf_data, "_BLOCK", block)
    assert as_tuple(read_matrix(path)) == as_tuple(whole)


def test_blocks_of_a_small_file(tmp_path, monkeypatch):
    monkeypatch.setattr(mf_data, "_BLOCK", 1)
    assert as_tuple(read_matrix(write(tmp_path, MM_SMALL))) == (
        [0, 2, 1], [0, 3, 1], [1.5, -2.0, 1000.0], 3, 4)


@pytest.mark.parametrize("block", [None, 1, 7, 64, 4096])
@pytest.mark.parametrize("bad_line", [20, 5000, 5999])
def test_bad_entry_line_number_over_the_whole_file(tmp_path, monkeypatch, block, bad_line):
    """An unparsable entry: its line number counted over the whole file, whether it lies in the
    64 KiB head or past it, whatever the block size."""
    text, *_ = big_text(6000)
    lines = text.split("\n")
    lines[bad_line - 1] = "3 4 x"
    path = write(tmp_path, "\n".join(lines), "big.tsv")
    if block:
        monkeypatch.setattr(mf_data, "_BLOCK", block)
    msg = error_of(read_matrix, path)
    assert f":{bad_line}:" in msg and "3 4 x" in msg


@pytest.mark.parametrize("block", [None, 1, 7])
@pytest.mark.parametrize("bad_entry", [10, 5500])
def test_bad_entry_line_number_in_a_matrix_market_file(tmp_path, monkeypatch, block, bad_entry):
    text, *_ = big_text(6000, base=1)
    header = BANNER + "% c\n" + "50 37 6000\n"  # 3 lines before the entries
    lines = text.split("\n")
    lines[bad_entry - 1] = "1 2 3 4"
    path = write(tmp_path, header + "\n".join(lines))
    if block:
        monkeypatch.setattr(mf_data, "_BLOCK", block)
    msg = error_of(read_matrix, path)
    assert f":{bad_entry + 3}:" in msg
    # an id outside the declared shape, past the head
    lines[bad_entry - 1] = "51 2 3"
    path = write(tmp_path, header + "\n".join(lines))
    msg = error_of(read_matrix, path)
    assert f":{bad_entry + 3}:" in msg and "row id 51" in msg


@given(entries=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 6),
                                  st.floats(-1e6, 1e6, width=32)), min_size=1, max_size=20),
       market=st.booleans(), short=st.integers(0, 400), block=st.integers(1, 40),
       crlf=st.booleans(), sep=st.sampled_from([" ", "\t", " \t "]),
       bad=st.none() | st.integers(0, 19))
@settings(max_examples=40, deadline=None)
def test_read_matrix_matches_reference(entries, market, short, block, crlf, sep, bad):
    """Entries straddling the end of the 64 KiB head (blank lines pad the file so that it ends
    `short` bytes before it), random block sizes: the entries, the shape, and a bad line's
    number."""
    base = 1 if market else 0
    head = (BANNER + "% c\n10 7 " + str(len(entries)) + "\n") if market else ""
    body = [f"{r + base}{sep}{c + base}{sep}{v!r}" for r, c, v in entries]
    if bad is not None:
        bad %= len(entries)
        body[bad] = f"{entries[bad][0]}{sep}x{sep}1"
    pad = max(0, HEAD - short - len(head))
    end = "\r\n" if crlf else "\n"
    text = head + "\n" * pad + end.join(body) + end
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        path = Path(tmp) / "m.txt"
        path.write_bytes(text.encode())
        mp.setattr(mf_data, "_BLOCK", block)
        if bad is not None:
            msg = error_of(read_matrix, path)
            number = head.count("\n") + pad + bad + 1
            assert f":{number}:" in msg, msg
            return
        m = read_matrix(path)
    rows, cols, vals = zip(*entries, strict=True)
    shape = (10, 7) if market else (max(rows) + 1, max(cols) + 1)
    assert as_tuple(m) == (list(rows), list(cols), [float(np.float32(v)) for v in vals], *shape)


def test_matrix_market_header_longer_than_the_head(tmp_path):
    comments = "% " + "x" * 78 + "\n"
    header = BANNER + comments * (HEAD // len(comments) + 10) + "3 3 2\n"
    assert len(header) > HEAD
    m = read_matrix(write(tmp_path, header + "1 1 1\n3 3 2\n"))
    assert as_tuple(m) == ([0, 2], [0, 2], [1.0, 2.0], 3, 3)


# ---------------------------------------------------------------------------- errors


def test_missing_file(tmp_path):
    msg = error_of(read_matrix, tmp_path / "nope.mtx")
    assert "cannot open" in msg


@pytest.mark.parametrize("content", [b"", b"\n", b"\n  \n\t\r\n"])
def test_empty_file(tmp_path, content):
    msg = error_of(read_matrix, write(tmp_path, content, "e.tsv"))
    assert "no entries" in msg


@pytest.mark.parametrize("banner", [
    "%%MatrixMarket matrix coordinate pattern general",
    "%%MatrixMarket matrix array real general",
    "%%MatrixMarket matrix coordinate real skew-symmetric",
    "%%MatrixMarket matrix coordinate complex general",
    "%%MatrixMarket matrix coordinate real",
    "%%MatrixMarket matrix coordinate real general extra",
    "%%MatrixMarket vector coordinate real general",
    "%%MatrixMarket",
])
def test_wrong_banner(tmp_path, banner):
    path = write(tmp_path, banner + "\n3 3 1\n1 1 1\n")
    msg = error_of(read_matrix, path)
    assert msg.startswith(f"{path}:1: expected") and f"got '{banner}'" in msg, msg


# ----------------------------------------------------- MatrixMarket as scipy.io reads it


def _dense(m: Matrix) -> np.ndarray:
    out = np.zeros((m.num_rows, m.num_cols), np.float64)
    np.add.at(out, (m.rows, m.cols), m.vals)
    return out


@pytest.mark.parametrize("field, symmetry, body", [
    ("real", "general", "1 1 1.5\n3 2 -2.25\n2 4 4e1\n"),
    ("integer", "general", "1 1 3\n4 4 -7\n"),
    ("real", "symmetric", "1 1 1.5\n3 2 -2.25\n4 1 0.5\n4 4 2\n"),
    ("integer", "symmetric", "2 1 5\n3 3 -1\n4 2 9\n"),
    ("real", "symmetric", "1 2 7\n"),  # the upper triangle, which the format does not use
])
def test_matrix_market_reads_as_scipy_io(tmp_path, field, symmetry, body):
    """General and symmetric, real and integer: the same matrix as scipy.io.mmread (a
    symmetric file's entries off the diagonal stand for both triangles)."""
    from scipy.io import mmread

    entries = len(body.strip().splitlines())
    path = write(tmp_path, f"%%MatrixMarket matrix coordinate {field} {symmetry}\n"
                           f"% a comment\n4 4 {entries}\n{body}")
    m = read_matrix(path)
    np.testing.assert_allclose(_dense(m), mmread(str(path)).toarray())
    off = sum(1 for line in body.splitlines() if line.split()[0] != line.split()[1])
    assert len(m) == entries + (off if symmetry == "symmetric" else 0)


def test_a_symmetric_file_trains_both_triangles_in_read_files(tmp_path):
    train = write(tmp_path, "%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n"
                            "2 1 1.0\n3 3 2.0\n", "train.mtx")
    test = write(tmp_path, BANNER + "3 3 1\n1 2 1.0\n", "test.mtx")
    got, _ = read_pair(train, test)
    assert sorted(zip(got.rows.tolist(), got.cols.tolist(), got.vals.tolist())) == \
        [(0, 1, 1.0), (1, 0, 1.0), (2, 2, 2.0)]


# ------------------------------------------------------------------ tables with a delimiter


@pytest.mark.parametrize("delimiter, text", [
    (None, "userId,movieId,rating,timestamp\n10,7,4.5,881250949\n3,7,1,881250950\n"),
    (None, "user\titem\trating\n10\t7\t4.5\n3\t7\t1\n"),
    (",", "10,7,4.5,881250949\n3,7,1,881250950\n"),  # no header: --delimiter says it is a table
    ("\t", "10\t7\t4.5\n3\t7\t1\n"),
    (";", "userId;movieId;rating\n10;7;4.5\n3;7;1\n"),
    ("::", "10::7::4.5::881250949\n3::7::1::881250950\n"),  # MovieLens 1M's ratings.dat
    ("|", "u|i|r\r\n10|7|4.5\r\n3|7|1\r\n"),
])
def test_tables_with_a_header_or_a_delimiter(tmp_path, delimiter, text):
    path = write(tmp_path, text, "ratings.csv")
    m = read_matrix(path, delimiter=delimiter)
    assert (m.rows.tolist(), m.cols.tolist(), m.vals.tolist()) == ([10, 3], [7, 7], [4.5, 1.0])
    assert m.row_labels.tolist() == [3, 10] and m.col_labels.tolist() == [7]
    train, test = mf_data.read_files(path, path, delimiter=delimiter)
    assert (train.rows.tolist(), train.cols.tolist(), train.num_rows, train.num_cols) == \
        ([1, 0], [0, 0], 2, 1)


@pytest.mark.parametrize("delimiter, text", [
    (None, "userId,movieId,rating,timestamp\n10,7,4.5,881250949\n3,7,1,881250950\n"),
    (",", "10,7,4.5\n3,7,1\n"),
    (None, "10 7 4.5\n3 7 1\n"),
    (None, BANNER + "11 8 2\n11 8 4.5\n4 8 1\n"),
])
def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path, delimiter, text):
    """Excel's "CSV UTF-8" starts the file with a UTF-8 byte order mark: read as without it
    (it was taken for the header's first characters, and the file refused)."""
    plain = write(tmp_path, text, "plain.csv")
    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())
    got = read_matrix(marked, delimiter=delimiter)
    assert got.rows.tolist() and as_tuple(got) == as_tuple(read_matrix(plain, delimiter=delimiter))
    train, test = mf_data.read_files(marked, plain, delimiter=delimiter)
    assert (train.num_rows, train.num_cols) == (test.num_rows, test.num_cols)


def test_a_delimiter_leaves_matrix_market_files_alone(tmp_path):
    path = write(tmp_path, BANNER + "2 2 1\n2 1 1.5\n")
    assert as_tuple(read_matrix(path, delimiter=";")) == as_tuple(read_matrix(path)) == \
        ([1], [0], [1.5], 2, 2)


@pytest.mark.parametrize("delimiter, text, expected", [
    (";", "userId;movieId;rating\n10;7;4.5\n3;7;x\n",
     ":3: expected 'row;column;value' (two labels and a finite number), got '3;7;x'"),
    (";", "userId,movieId,rating\n10;7;4.5\n",
     ":1: a header line needs three fields (row, column, value) separated by ';'"),
    ("::", "10::7::4.5\n3::7::1\t5\n", ":2: a tab in a file read with --delimiter '::'"),
    ("\t", "10\t7\n", ":1: expected 'row<TAB>column<TAB>value'"),
    (None, "userId movieId rating\n10 7 4.5\n",
     ":1: a header line needs three fields (row, column, value) separated by commas or tabs "
     "(or give --delimiter)"),
])
def test_bad_tables_name_the_file_and_the_line(tmp_path, delimiter, text, expected):
    path = write(tmp_path, text, "ratings.csv")
    msg = error_of(read_matrix, path, delimiter=delimiter)
    assert msg.startswith(f"{path}{expected}"), msg


@pytest.mark.parametrize("label", ["0345417623", "+345417623", "-0", "007", "A2XYZ", "B00 1"])
@pytest.mark.parametrize("column", [0, 1])
def test_labels_that_are_not_plain_integers_are_text(tmp_path, label, column):
    """An ISBN's '0345417623' was read as the integer 345417623, one item with '345417623'
    (silently); ids such as 'A2XYZ' were refused. A table whose labels are not all plain
    integers is read with its labels as text: each spelling its own row or column, exported
    as written; every file of the run then as text (a plain integer's text is itself)."""
    fields = ["5", "8"]
    fields[column] = label
    plain = "5" if column == 0 else "8"
    train = write(tmp_path, f"u,i,r\n0,-3,1\n{','.join(fields)},2\n{plain},{plain},3\n",
                  "train.csv")
    m = read_matrix(train)
    assert m.row_labels.dtype == m.col_labels.dtype == object
    assert m.vals.tolist() == [1.0, 2.0, 3.0]
    assert label in (m.row_labels if column == 0 else m.col_labels).tolist()
    test = write(tmp_path, "u,i,r\n0,-3,4\n5,8,5\n", "test.csv")  # plain integers only
    assert read_matrix(test).row_labels.dtype.kind == "i"  # the native path
    tr, te = mf_data.read_files(train, test)
    labels = (tr.row_labels if column == 0 else tr.col_labels).tolist()
    assert label in labels and plain in labels and len(set(labels)) == len(labels)
    # the test file's 0 and -3 are the train file's: one row and one column
    assert (te.rows[0], te.cols[0]) == (tr.rows[0], tr.cols[0])
    assert tr.row_labels[tr.rows].tolist() == ["0", *(
        [label, plain] if column == 0 else ["5", plain])]


def test_text_labels_longer_than_an_error_shows(tmp_path):
    url = "https://example.org/items/" + "x" * 100
    m = read_matrix(write(tmp_path, f"u,i,r\n1,2,3\n1,{url},4\n", "urls.csv"))
    assert m.col_labels.tolist() == ["2", url] and m.vals.tolist() == [3.0, 4.0]


def test_a_text_table_with_a_bad_line_names_it(tmp_path):
    msg = error_of(read_matrix, write(tmp_path, "u;i;r\nA;B;1\nC;D\n", "t.csv"), delimiter=";")
    assert ":3: expected 'row;column;value' (two labels and a finite number), got 'C;D'" in msg
    msg = error_of(read_matrix, write(tmp_path, "u,i,r\nA,B,1\nC,D,1e999\n", "big.csv"))
    assert ":3: expected" in msg


def test_fields_past_the_third_may_be_long(tmp_path):
    """A review or a genre list after the rating: ignored as the docs say, whatever its length
    (a line of 256 bytes or more was refused as "expected 'row,column,value'")."""
    review = "x" * 5000
    path = write(tmp_path, f"userId,movieId,rating,review\n1,10,4.0,{review}\n2,11,3,\"a, b\"\n",
                 "ratings.csv")
    m = read_matrix(path)
    assert (m.rows.tolist(), m.cols.tolist(), m.vals.tolist()) == ([1, 2], [10, 11], [4.0, 3.0])
    # a label beyond int64 (300 digits) is text
    m = read_matrix(write(tmp_path, f"u,i,r\n1,{'1' * 300},4\n", "long.csv"))
    assert m.cols.tolist() == ["1" * 300]


def test_space_delimited_columns_aligned_by_runs_of_spaces(tmp_path):
    """--delimiter space: a file whose columns line up with several spaces, or with spaces at
    a line's ends (each space was a separator: '1  10' held an empty field)."""
    path = write(tmp_path, "user item rating\n1  10 4.0\n2 11 3.5 \n  3   11   2\r\n",
                 "aligned.txt")
    m = read_matrix(path, delimiter=" ")
    assert (m.rows.tolist(), m.cols.tolist(), m.vals.tolist()) == \
        ([1, 2, 3], [10, 11, 11], [4.0, 3.5, 2.0])


@pytest.mark.parametrize("header", [",userId,movieId,rating", "\tuser\titem\trating",
                                    '"","user","item","rating"'])
def test_an_index_column_is_named(tmp_path, header):
    """pandas' to_csv() and R's write.csv write their index first, under an empty name: the
    hint said the file needs a header line (it has one), or R's was read as data."""
    sep = "\t" if "\t" in header else ","
    path = write(tmp_path, f"{header}\n0{sep}1{sep}3{sep}4.0\n", "p.csv")
    msg = error_of(read_matrix, path)
    assert msg.startswith(f"{path}:1: the header's first column has no name, as pandas' "
                          f"to_csv() (or R's write.csv) writes its index"), msg


@pytest.mark.parametrize("delimiter", [",", " ", "\t"])
def test_a_table_without_a_header_whose_first_label_is_text(tmp_path, delimiter):
    """'A1XY,0345417623,5.0' first: an entry, not a header (it was taken for one, and the
    first rating of every such file was lost)."""
    d = delimiter
    path = write(tmp_path, f"A1XY{d}0345417623{d}5.0{d}1\nA2XY{d}0345417623{d}4.0{d}1\n"
                           f"A1XY{d}0123456789{d}3.0{d}1\n", "a.csv")
    m = read_matrix(path, delimiter=delimiter)
    assert m.vals.tolist() == [5.0, 4.0, 3.0]
    assert m.row_labels.tolist() == ["A1XY", "A2XY"]
    if delimiter != " ":  # told by its first line without --delimiter too
        assert read_matrix(path).vals.tolist() == [5.0, 4.0, 3.0]


def test_quoted_fields_as_a_csv_reader_reads_them(tmp_path):
    """A label holding the delimiter in quotes, quoted numbers (Book-Crossing's
    '"276725";"034545104X";"0"'), a 64-bit id: read as CSV (they were split at the comma
    inside the quotes, kept their quotes, or refused)."""
    m = read_matrix(write(tmp_path, 'user,item,rating\n"Smith, J",42,4\nbob,"42",5\n'
                                    '18446744073709551615,7,1\n', "q.csv"))
    assert (m.rows.tolist(), m.cols.tolist(), m.vals.tolist()) == \
        (["Smith, J", "bob", "18446744073709551615"], ["42", "42", "7"], [4.0, 5.0, 1.0])
    m = read_matrix(write(tmp_path, '"User-ID";"ISBN";"Book-Rating"\n"276725";"034545104X";"0"\n'
                                    '"276726";"0155061224";"5"\n', "bx.csv"), delimiter=";")
    assert m.cols.tolist() == ["034545104X", "0155061224"] and m.vals.tolist() == [0.0, 5.0]
    m = read_matrix(write(tmp_path, 'u;i;r\n"1";"2";"3"\n', "quoted.csv"), delimiter=";")
    assert (m.rows.tolist(), m.cols.tolist(), m.vals.tolist()) == (["1"], ["2"], [3.0])
    msg = error_of(read_matrix, write(tmp_path, "u,i,r\nA,B,1_000\n", "under.csv"))
    assert ":2: expected" in msg  # a number as the native parser reads it


@pytest.mark.parametrize("given, expected", [
    ("tab", "\t"), ("comma", ","), ("semicolon", ";"), ("pipe", "|"), ("space", " "),
    (";", ";"), ("::", "::"), ("\t", "\t")])
def test_delimiter_names(given, expected):
    assert mf_data.check_delimiter(given) == expected


@pytest.mark.parametrize("given", ["", "1", ".", "-", "e", "abcde", "\n", "a\rb"])
def test_delimiters_that_could_be_part_of_a_number_are_refused(given):
    with pytest.raises(ValueError, match="delimiter"):
        mf_data.check_delimiter(given)


@pytest.mark.parametrize("content", [BANNER, BANNER + "% only comments\n%\n",
                                     BANNER + "% no final newline"])
def test_no_size_line(tmp_path, content):
    msg = error_of(read_matrix, write(tmp_path, content))
    assert "no size line" in msg


@pytest.mark.parametrize("size", ["3 3", "3 3 2 1", "3 x 2", "3 3 1.0", "0 3 1", "3 0 1",
                                  "3 3 -1", "-3 3 1", "1 1 1 %"])
def test_bad_size_line(tmp_path, size):
    msg = error_of(read_matrix, write(tmp_path, BANNER + "% c\n" + size + "\n1 1 1\n"))
    assert ":3:" in msg and "size line" in msg


@pytest.mark.parametrize("declared,entries", [(3, 2), (1, 2), (5, 4)])
def test_entries_fewer_or_more_than_declared(tmp_path, declared, entries):
    body = "".join(f"{k + 1} 1 {k}\n" for k in range(entries))
    msg = error_of(read_matrix, write(tmp_path, BANNER + f"9 9 {declared}\n" + body))
    assert f"declares {declared}" in msg and f"has {entries}" in msg


def test_zero_entries_declared(tmp_path):
    msg = error_of(read_matrix, write(tmp_path, BANNER + "3 3 0\n"))
    assert "no entries" in msg


@pytest.mark.parametrize("entry,what,shown", [("0 1 1", "row", 0), ("4 1 1", "row", 4),
                                              ("1 0 1", "column", 0), ("1 5 1", "column", 5),
                                              ("-2 1 1", "row", -2)])
def test_matrix_market_id_out_of_range(tmp_path, entry, what, shown):
    text = BANNER + "3 4 3\n1 1 1\n% c\n" + entry + "\n2 2 2\n"
    msg = error_of(read_matrix, write(tmp_path, text))
    assert f":5: {what} id {shown} " in msg


@pytest.mark.parametrize("entry", ["1 2", "1 2 x", "1 2 3 4", "1.5 2 3", "1 2 nan", "1 2 inf",
                                   "1 2 3\x00"])
def test_unparsable_entry_line(tmp_path, entry):
    msg = error_of(read_matrix, write(tmp_path, BANNER + "3 4 3\n1 1 1\n" + entry + "\n2 2 2\n"))
    assert ":4:" in msg


def test_text_file_negative_id(tmp_path):
    msg = error_of(read_matrix, write(tmp_path, "0 0 1\n1 1 1\n-1 2 3\n", "n.tsv"))
    assert ":3: row id -1 " in msg
    msg = error_of(read_matrix, write(tmp_path, "0 0 1\n\n1 -5 3\n", "n.tsv"))
    assert ":3: column id -5 " in msg


@pytest.mark.parametrize("content", ["% only\n% comments\n", "%\n"])
def test_text_file_of_only_comments(tmp_path, content):
    # '%' lines are comments in MatrixMarket files only: here they are bad lines
    msg = error_of(read_matrix, write(tmp_path, content, "c.tsv"))
    assert ":1:" in msg


def test_text_line_in_the_middle_of_comments(tmp_path):
    msg = error_of(read_matrix, write(tmp_path, "0 0 1\n% a comment\n", "c.tsv"))
    assert ":2:" in msg


def test_value_beyond_float32_is_a_bad_line(tmp_path):
    msg = error_of(read_matrix, write(tmp_path, "0\t0\t1\n1\t1\t1e39\n", "inf.tsv"))
    assert ":2:" in msg


def test_id_beyond_int64_is_a_bad_line(tmp_path):
    msg = error_of(read_matrix, write(tmp_path, "0\t0\t1\n99999999999999999999\t0\t1\n",
                                      "huge.tsv"))
    assert ":2:" in msg


# ---------------------------------------------------------------------------- read_pair


def test_pair_of_text_files_shares_the_shape(tmp_path):
    train = write(tmp_path, "0 0 1\n2 3 1\n", "train.tsv")
    test = write(tmp_path, "4 1 1\n", "test.tsv")
    a, b = read_pair(train, test)
    assert (a.num_rows, a.num_cols) == (b.num_rows, b.num_cols) == (5, 4)
    assert as_tuple(a)[:3] == ([0, 2], [0, 3], [1.0, 1.0])
    assert as_tuple(b)[:3] == ([4], [1], [1.0])


def test_pair_of_matrix_market_files(tmp_path):
    train = write(tmp_path, BANNER + "6 7 2\n1 1 1\n2 2 2\n", "train.mtx")
    test = write(tmp_path, BANNER + "6 7 1\n3 3 3\n", "test.mtx")
    a, b = read_pair(train, test)
    assert (a.num_rows, a.num_cols, b.num_rows, b.num_cols) == (6, 7, 6, 7)


@pytest.mark.parametrize("train_shape,test_shape,bad", [
    ("6 7", "6 8", "train"), ("6 7", "5 7", "test"), ("9 9", "6 7", "test")])
def test_pair_of_matrix_market_files_of_other_shapes(tmp_path, train_shape, test_shape, bad):
    train = write(tmp_path, BANNER + f"{train_shape} 1\n1 1 1\n", "train.mtx")
    test = write(tmp_path, BANNER + f"{test_shape} 1\n1 1 1\n", "test.mtx")
    with pytest.raises(DataError) as info:
        read_pair(train, test)
    path = train if bad == "train" else test
    assert str(path) in str(info.value) and "shape" in str(info.value)


def test_pair_with_an_error_names_its_file(tmp_path):
    train = write(tmp_path, "0 0 1\n", "train.tsv")
    test = write(tmp_path, "0 0 1\n1 x 1\n", "test.tsv")
    with pytest.raises(DataError) as info:
        read_pair(train, test)
    assert str(test) in str(info.value) and ":2:" in str(info.value)


# ---------------------------------------------------------------------------- generate


def read_generated(info):
    train, test = read_pair(info["train"], info["test"])
    return train, test


def cells(m, cols):
    return m.rows * cols + m.cols


@pytest.mark.parametrize("fmt,suffix", [("mm", ".mmc"), ("tsv", ".tsv")])
def test_generate_is_deterministic(tmp_path, fmt, suffix):
    a = generate(tmp_path / "a", 300, 100, 3000, fmt=fmt, seed=5)
    b = generate(tmp_path / "b", 300, 100, 3000, fmt=fmt, seed=5)
    c = generate(tmp_path / "c", 300, 100, 3000, fmt=fmt, seed=6)
    for name in ("train", "test"):
        assert a[name].endswith(name + suffix)
        assert Path(a[name]).read_bytes() == Path(b[name]).read_bytes()
        assert Path(a[name]).read_bytes() != Path(c[name]).read_bytes()
    assert {k: v for k, v in a.items() if k not in ("train", "test")} == {
        "rows": 300, "cols": 100, "train_entries": 2700, "test_entries": 300}
    assert not list((tmp_path / "a").glob("*.tmp"))


def test_generate_formats_read_back_alike(tmp_path):
    mm = read_generated(generate(tmp_path / "mm", 200, 150, 4000, fmt="mm", seed=1))
    tsv = read_generated(generate(tmp_path / "tsv", 200, 150, 4000, fmt="tsv", seed=1))
    for a, b in zip(mm, tsv, strict=True):
        assert a.rows.tolist() == b.rows.tolist() and a.cols.tolist() == b.cols.tolist()
        assert np.array_equal(a.vals.view(np.uint32), b.vals.view(np.uint32))
        assert (a.num_rows, a.num_cols) == (200, 150)
        assert b.num_rows <= 200 and b.num_cols <= 150  # a text file's shape: its largest ids
    text = Path(tmp_path / "mm" / "train.mmc").read_text().split("\n")
    assert text[0] == BANNER.strip() and text[2] == "200 150 3600"


@pytest.mark.parametrize("entries,fraction", [(2, 0.1), (3000, 0.1), (1001, 0.25), (50, 0.0)])
def test_generate_counts_and_distinct_cells(tmp_path, entries, fraction):
    rows, cols = 100, 80
    info = generate(tmp_path, rows, cols, entries, test_fraction=fraction, seed=2)
    train, test = read_generated(info)
    n_test = max(1, round(entries * fraction))
    assert (len(train), len(test)) == (entries - n_test, n_test)
    assert (info["train_entries"], info["test_entries"]) == (len(train), len(test))
    both = np.concatenate([cells(train, cols), cells(test, cols)])
    assert len(np.unique(both)) == entries  # no cell twice, within or across the files
    assert np.all((train.rows >= 0) & (train.rows < rows) & (train.cols >= 0)
                  & (train.cols < cols))


def test_generate_at_the_entries_limit(tmp_path):
    info = generate(tmp_path, 10, 10, 50, seed=3)  # rows * cols / 2
    train, test = read_generated(info)
    assert len(np.unique(np.concatenate([cells(train, 10), cells(test, 10)]))) == 50


def test_generate_ids_are_skewed(tmp_path):
    train, test = read_generated(generate(tmp_path / "s", 2000, 500, 20000, seed=0))
    for ids, size in ((np.concatenate([train.rows, test.rows]), 2000),
                      (np.concatenate([train.cols, test.cols]), 500)):
        counts = np.bincount(ids, minlength=size)
        assert counts.max() > 10 * np.median(counts)
        # the frequent ids are spread over the id range (a random order), not the first ones
        top = np.argsort(-counts)[:20]
        assert top.max() > size // 4
    # without skew the ids are about uniform
    train, test = read_generated(generate(tmp_path / "u", 2000, 500, 20000, skew=0.0, seed=0))
    counts = np.bincount(np.concatenate([train.rows, test.rows]), minlength=2000)
    assert counts.max() < 4 * np.median(counts)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generate_values_have_variance_about_one(tmp_path, seed):
    train, test = read_generated(generate(tmp_path, 2000, 500, 20000, seed=seed))
    vals = np.concatenate([train.vals, test.vals]).astype(np.float64)
    assert 0.5 < vals.var() < 2.0
    assert abs(vals.mean()) < 0.2


def dense_block(tmp_path, noise, seed, rank=10):
    """The largest fully observed block (rows with the most entries, and the columns full on
    them) of a generated matrix, train and test together. The generator fills at most half the
    cells, so a dense 40 x 30 with 600 entries has too small a full block for rank 10; 100 x 80
    with 4000 skewed entries has one of about 17 x 17 and more."""
    rows, cols = 100, 80
    info = generate(tmp_path / f"d{noise}_{seed}", rows, cols, 4000, rank=rank, noise=noise,
                    seed=seed)
    m = np.full((rows, cols), np.nan)
    for part in read_generated(info):
        m[part.rows, part.cols] = part.vals
    seen = ~np.isnan(m)
    order = np.argsort(-seen.sum(1), kind="stable")
    best = (0, None, None)
    for k in range(2, rows + 1):
        full = np.flatnonzero(seen[order[:k]].all(0))
        if min(k, len(full)) > best[0]:
            best = (min(k, len(full)), order[:k], full)
    _, r, c = best
    assert min(len(r), len(c)) >= 15
    return m[np.ix_(r, c)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generate_plants_the_rank(tmp_path, seed):
    # without noise: rank 10 up to float32 rounding
    s = np.linalg.svd(dense_block(tmp_path, 0.0, seed), compute_uv=False)
    assert s[10] < 1e-5 * s[0] and s[9] > 1e-2 * s[0]
    # noise 0.01: the 11th singular value far below the 10th, and what rank 10 leaves out is
    # about the noise
    block = dense_block(tmp_path, 0.01, seed)
    s = np.linalg.svd(block, compute_uv=False)
    assert s[10] < s[9] / 5
    n, k = block.shape
    rest = math.sqrt(np.sum(s[10:] ** 2) / ((n - 10) * (k - 10)))
    assert 0.005 < rest < 0.02


@pytest.mark.parametrize("rank", [1, 3])
def test_generate_other_ranks(tmp_path, rank):
    s = np.linalg.svd(dense_block(tmp_path, 0.0, 4, rank=rank), compute_uv=False)
    assert s[rank] < 1e-5 * s[0] and s[rank - 1] > 1e-2 * s[0]


@pytest.mark.parametrize("args", [(0, 10, 5), (10, 0, 5), (-1, 10, 5), (10, 10, 1),
                                  (10, 10, 0), (10, 10, 51), (1, 1, 2), (3, 3, 5)])
def test_generate_invalid_arguments(tmp_path, args):
    with pytest.raises(ValueError):
        generate(tmp_path / "x", *args)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("fraction", [1.0, 1.5])
def test_generate_test_fraction_outside_the_unit_interval(tmp_path, fraction):
    try:
        info = generate(tmp_path, 10, 10, 20, test_fraction=fraction)
    except ValueError:
        return
    train, test = read_generated(info)  # both files must be readable
    assert (info["train_entries"], info["test_entries"]) == (len(train), len(test))
