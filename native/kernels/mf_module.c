/* CPython binding of mf.c: the MF batch trainer and the data file parser and writer.
 * Conventions as module.c: every buffer checked while holding the GIL, one call into mf.c with
 * the GIL released, nothing written when a check fails, the buffers stay the caller's.
 */
#include "binding.h"
#include "mf.h"

static PyObject *py_mf_train_batch(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "mf_train_batch";
    static char *kwlist[] = {"rank", "values", "updates", "w_rows", "h_rows", "x", "reg", "lr",
                             NULL};
    long long rank;
    double lr;
    PyObject *ovalues, *oupdates, *ow, *oh, *ox, *oreg;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LOOOOOOd", kwlist, &rank, &ovalues,
                                     &oupdates, &ow, &oh, &ox, &oreg, &lr))
        return NULL;
    if (rank < 1 || rank > MF_MAX_RANK)
        return PyErr_Format(PyExc_ValueError, "%s: rank %lld outside [1, %d]", fn, rank,
                            MF_MAX_RANK);
    views_t vs = {.n = 0};
    Py_buffer *values, *updates, *w_rows, *h_rows, *x, *reg;
    if (!(values = take(&vs, ovalues, fn, "values", F32, 1, 0)) ||
        !(updates = take(&vs, oupdates, fn, "updates", F32, 1, 0)) ||
        !(w_rows = take(&vs, ow, fn, "w_rows", I64, 0, 1)) ||
        !(h_rows = take(&vs, oh, fn, "h_rows", I64, 0, 1)) ||
        !(x = take(&vs, ox, fn, "x", F32, 0, 1)) ||
        !(reg = take(&vs, oreg, fn, "reg", F32, 0, 1)))
        goto fail;
    const int64_t nvalues = count(values), n = count(w_rows);
    if (nvalues % (2 * rank)) {
        PyErr_Format(PyExc_ValueError, "%s: values has %lld floats, not a whole number of rows "
                     "of 2 * rank = %lld", fn, (long long)nvalues, 2 * rank);
        goto fail;
    }
    const int64_t nrows = nvalues / (2 * rank);
    if (count(updates) != nvalues || count(reg) != nrows) {
        PyErr_Format(PyExc_ValueError, "%s: updates needs %lld floats (got %lld) and reg one "
                     "per row, %lld (got %lld)", fn, (long long)nvalues,
                     (long long)count(updates), (long long)nrows, (long long)count(reg));
        goto fail;
    }
    if (count(h_rows) != n || count(x) != n) {
        PyErr_Format(PyExc_ValueError, "%s: w_rows, h_rows and x need one item per entry, got "
                     "%lld, %lld, %lld", fn, (long long)n, (long long)count(h_rows),
                     (long long)count(x));
        goto fail;
    }
    if (check_no_overlap(&vs, values, fn, "values") < 0 ||
        check_no_overlap(&vs, updates, fn, "updates") < 0)
        goto fail;
    const mf_batch_t batch = {.rank = rank, .values = values->buf, .updates = updates->buf,
                              .num_rows = nrows, .w_rows = w_rows->buf, .h_rows = h_rows->buf,
                              .x = x->buf, .num_entries = n, .reg = reg->buf, .lr = (float)lr};
    double loss;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mf_train_batch(&batch, &loss);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        const int64_t e = -1 - rc;
        PyErr_Format(PyExc_ValueError, "%s: entry %lld names row (w %lld, h %lld) outside "
                     "[0, %lld)", fn, (long long)e, (long long)batch.w_rows[e],
                     (long long)batch.h_rows[e], (long long)nrows);
        goto fail;
    }
    release_views(&vs);
    return PyFloat_FromDouble(loss);
fail:
    release_views(&vs);
    return NULL;
}

static PyObject *py_mf_parse(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "mf_parse";
    static char *kwlist[] = {"text", "skip_percent", "base", "rows", "cols", "vals", "lines",
                             "sep", NULL};
    PyObject *otext, *orows, *ocols, *ovals, *olines;
    int skip_percent, sep = 0;
    long long base;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OpLOOOO|C", kwlist, &otext, &skip_percent,
                                     &base, &orows, &ocols, &ovals, &olines, &sep))
        return NULL;
    if (sep != 0 && sep != ',' && sep != '\t') {
        PyErr_Format(PyExc_ValueError, "%s: sep must be ',' or a tab", fn);
        return NULL;
    }
    Py_buffer text;
    if (PyObject_GetBuffer(otext, &text, PyBUF_SIMPLE) < 0) return NULL;
    views_t vs = {.n = 0};
    Py_buffer *rows, *cols, *vals, *lines;
    if (!(rows = take(&vs, orows, fn, "rows", I64, 1, 1)) ||
        !(cols = take(&vs, ocols, fn, "cols", I64, 1, 1)) ||
        !(vals = take(&vs, ovals, fn, "vals", F32, 1, 1)) ||
        !(lines = take(&vs, olines, fn, "lines", I64, 1, 1)))
        goto fail;
    for (int i = 0; i < vs.n; i++)
        if (check_no_overlap(&vs, &vs.v[i], fn, "an output") < 0) goto fail;
    for (int i = 0; i < vs.n; i++) {
        if (overlap(&text, &vs.v[i])) {
            PyErr_Format(PyExc_ValueError, "%s: text shares memory with an output", fn);
            goto fail;
        }
    }
    const char *t = text.buf;
    int64_t newlines = 0;
    for (Py_ssize_t i = 0; i < text.len; i++) newlines += t[i] == '\n';
    const int64_t need = newlines + 1;
    if (count(rows) < need || count(cols) < need || count(vals) < need || count(lines) < need) {
        PyErr_Format(PyExc_ValueError, "%s: rows, cols, vals and lines need room for %lld "
                     "entries (one per line)", fn, (long long)need);
        goto fail;
    }
    int64_t got;
    Py_BEGIN_ALLOW_THREADS
    got = mf_parse_sep(t, text.len, skip_percent, base, (char)sep, rows->buf, cols->buf,
                       vals->buf, lines->buf);
    Py_END_ALLOW_THREADS
    release_views(&vs);
    PyBuffer_Release(&text);
    return PyLong_FromLongLong(got);
fail:
    release_views(&vs);
    PyBuffer_Release(&text);
    return NULL;
}

static PyObject *py_mf_format(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "mf_format";
    static char *kwlist[] = {"rows", "cols", "vals", "base", "sep", NULL};
    PyObject *orows, *ocols, *ovals;
    long long base;
    int sep;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOLC", kwlist, &orows, &ocols, &ovals,
                                     &base, &sep))
        return NULL;
    if (sep != ' ' && sep != '\t')
        return PyErr_Format(PyExc_ValueError, "%s: sep must be a space or a tab", fn);
    views_t vs = {.n = 0};
    Py_buffer *rows, *cols, *vals;
    if (!(rows = take(&vs, orows, fn, "rows", I64, 0, 1)) ||
        !(cols = take(&vs, ocols, fn, "cols", I64, 0, 1)) ||
        !(vals = take(&vs, ovals, fn, "vals", F32, 0, 1)))
        goto fail;
    const int64_t n = count(rows);
    if (count(cols) != n || count(vals) != n) {
        PyErr_Format(PyExc_ValueError, "%s: rows, cols and vals differ in length", fn);
        goto fail;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * MF_FORMAT_MAX_LINE));
    if (!out) goto fail;
    int64_t written;
    char *buf = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    written = mf_format(rows->buf, cols->buf, vals->buf, n, base, (char)sep, buf,
                        n * MF_FORMAT_MAX_LINE);
    Py_END_ALLOW_THREADS
    release_views(&vs);
    if (written < 0) {
        Py_DECREF(out);
        return PyErr_Format(PyExc_ValueError, "%s: an entry does not fit a line", fn);
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)written) < 0) return NULL;
    return out;
fail:
    release_views(&vs);
    return NULL;
}

/* The checks mf_plan and mf_train_table share: one cols and vals item per entry (rows), and
 * one reg_of and row_of item per key, num_rows of them matrix rows. 0, or -1 with an error. */
static int check_matrix(const char *fn, int64_t ne, int64_t ncols, int64_t nvals, int64_t nkeys,
                        int64_t nrow_of, long long num_rows) {
    if (ncols != ne || nvals != ne) {
        PyErr_Format(PyExc_ValueError, "%s: rows, cols and vals need one item per entry, got "
                     "%lld, %lld, %lld", fn, (long long)ne, (long long)ncols, (long long)nvals);
        return -1;
    }
    if (num_rows < 0 || num_rows > nkeys || nrow_of != nkeys || nkeys > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: reg_of and row_of need one item per key (got %lld "
                     "and %lld, at most 2**31 - 1), num_rows %lld of them", fn,
                     (long long)nkeys, (long long)nrow_of, num_rows);
        return -1;
    }
    return 0;
}

static PyObject *py_mf_plan(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "mf_plan";
    static char *kwlist[] = {"rows", "cols", "vals", "num_rows", "reg_of", "row_of", "points",
                             "keys", "w_rows", "h_rows", "x", "reg", NULL};
    PyObject *o[11];
    long long num_rows;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOLOOOOOOOO", kwlist, &o[0], &o[1], &o[2],
                                     &num_rows, &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9],
                                     &o[10]))
        return NULL;
    views_t vs = {.n = 0};
    Py_buffer *rows, *cols, *vals, *reg_of, *points, *row_of, *keys, *w_rows, *h_rows, *x, *reg;
    if (!(rows = take(&vs, o[0], fn, "rows", I64, 0, 1)) ||
        !(cols = take(&vs, o[1], fn, "cols", I64, 0, 1)) ||
        !(vals = take(&vs, o[2], fn, "vals", F32, 0, 1)) ||
        !(reg_of = take(&vs, o[3], fn, "reg_of", F32, 0, 1)) ||
        !(points = take(&vs, o[5], fn, "points", I64, 0, 1)) ||
        !(row_of = take(&vs, o[4], fn, "row_of", I32, 1, 1)) ||
        !(keys = take(&vs, o[6], fn, "keys", I64, 1, 1)) ||
        !(w_rows = take(&vs, o[7], fn, "w_rows", I64, 1, 1)) ||
        !(h_rows = take(&vs, o[8], fn, "h_rows", I64, 1, 1)) ||
        !(x = take(&vs, o[9], fn, "x", F32, 1, 1)) ||
        !(reg = take(&vs, o[10], fn, "reg", F32, 1, 1)))
        goto fail;
    for (int i = 5; i < vs.n; i++) /* the written buffers: row_of onwards */
        if (check_no_overlap(&vs, &vs.v[i], fn, "an output") < 0) goto fail;
    const int64_t ne = count(rows), n = count(points), nkeys = count(reg_of);
    if (check_matrix(fn, ne, count(cols), count(vals), nkeys, count(row_of), num_rows) < 0)
        goto fail;
    if (count(keys) < 2 * n || count(reg) < 2 * n || count(w_rows) < n || count(h_rows) < n ||
        count(x) < n) {
        PyErr_Format(PyExc_ValueError, "%s: keys and reg need room for 2 * len(points) = %lld "
                     "items, w_rows, h_rows and x for %lld", fn, (long long)(2 * n),
                     (long long)n);
        goto fail;
    }
    const mf_plan_t plan = {.rows = rows->buf, .cols = cols->buf, .vals = vals->buf,
                            .num_entries = ne, .num_rows = num_rows, .num_keys = nkeys,
                            .reg_of = reg_of->buf, .row_of = row_of->buf};
    int64_t nk, row_keys = 0;
    Py_BEGIN_ALLOW_THREADS
    nk = mf_plan(&plan, points->buf, n, keys->buf, w_rows->buf, h_rows->buf, x->buf, reg->buf,
                 &row_keys);
    Py_END_ALLOW_THREADS
    if (nk < 0) {
        const int64_t i = -1 - nk, e = ((const int64_t *)points->buf)[i];
        PyErr_Format(PyExc_ValueError, "%s: points[%lld] = %lld is not an entry of the %lld "
                     "given, or its row or column is outside the %lld x %lld matrix", fn,
                     (long long)i, (long long)e, (long long)ne, num_rows,
                     (long long)(nkeys - num_rows));
        goto fail;
    }
    release_views(&vs);
    return Py_BuildValue("(LL)", (long long)nk, (long long)row_keys);
fail:
    release_views(&vs);
    return NULL;
}

static PyObject *py_mf_train_table(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "mf_train_table";
    static char *kwlist[] = {"rank", "lr", "batch_size", "rows", "cols", "vals", "num_rows",
                             "reg_of", "row_of", "points", "data", "key_offset", "key_len",
                             "iscratch", "fscratch", "losses", "keys", NULL};
    long long rank, batch_size, num_rows;
    double lr;
    PyObject *o[14];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LdLOOOLOOOOOOOOOO", kwlist, &rank, &lr,
                                     &batch_size, &o[0], &o[1], &o[2], &num_rows, &o[3], &o[4],
                                     &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12]))
        return NULL;
    if (rank < 1 || rank > MF_MAX_RANK)
        return PyErr_Format(PyExc_ValueError, "%s: rank %lld outside [1, %d]", fn, rank,
                            MF_MAX_RANK);
    if (batch_size < 1 || batch_size > (INT64_MAX / 64) / (4 * rank))
        return PyErr_Format(PyExc_ValueError, "%s: batch_size %lld must be positive (and not "
                            "absurdly large)", fn, batch_size);
    views_t vs = {.n = 0};
    Py_buffer *rows, *cols, *vals, *reg_of, *points, *key_offset, *key_len, *row_of, *data,
        *iscratch, *fscratch, *losses, *keys;
    if (!(rows = take(&vs, o[0], fn, "rows", I64, 0, 1)) ||
        !(cols = take(&vs, o[1], fn, "cols", I64, 0, 1)) ||
        !(vals = take(&vs, o[2], fn, "vals", F32, 0, 1)) ||
        !(reg_of = take(&vs, o[3], fn, "reg_of", F32, 0, 1)) ||
        !(points = take(&vs, o[5], fn, "points", I64, 0, 1)) ||
        !(key_offset = take(&vs, o[7], fn, "key_offset", I64, 0, 1)) ||
        !(key_len = take(&vs, o[8], fn, "key_len", I64, 0, 1)) ||
        !(row_of = take(&vs, o[4], fn, "row_of", I32, 1, 1)) ||
        !(data = take(&vs, o[6], fn, "data", F32, 1, 0)) ||
        !(iscratch = take(&vs, o[9], fn, "iscratch", I64, 1, 1)) ||
        !(fscratch = take(&vs, o[10], fn, "fscratch", F32, 1, 1)) ||
        !(losses = take(&vs, o[11], fn, "losses", F64, 1, 1)) ||
        !(keys = take(&vs, o[12], fn, "keys", I64, 1, 1)))
        goto fail;
    for (int i = 7; i < vs.n; i++) /* the written buffers: row_of onwards */
        if (check_no_overlap(&vs, &vs.v[i], fn, "an output") < 0) goto fail;
    const int64_t ne = count(rows), n = count(points), nkeys = count(reg_of);
    const int64_t width = 2 * rank, batches = (n + batch_size - 1) / batch_size;
    if (check_matrix(fn, ne, count(cols), count(vals), nkeys, count(row_of), num_rows) < 0)
        goto fail;
    if (count(key_offset) != nkeys || count(key_len) != nkeys) {
        PyErr_Format(PyExc_ValueError, "%s: key_offset and key_len need one item per key, %lld "
                     "(got %lld and %lld)", fn, (long long)nkeys, (long long)count(key_offset),
                     (long long)count(key_len));
        goto fail;
    }
    if (count(iscratch) < 4 * batch_size ||
        count(fscratch) < 3 * batch_size + 4 * batch_size * width) {
        PyErr_Format(PyExc_ValueError, "%s: iscratch needs 4 * batch_size = %lld items, "
                     "fscratch 3 * batch_size + 8 * batch_size * rank = %lld", fn,
                     4 * batch_size, 3 * batch_size + 4 * batch_size * width);
        goto fail;
    }
    if (count(losses) < batches || count(keys) < batches) {
        PyErr_Format(PyExc_ValueError, "%s: losses and keys need one item per batch, %lld",
                     fn, (long long)batches);
        goto fail;
    }
    const table_t table = {.data = data->buf, .data_floats = count(data),
                           .key_offset = key_offset->buf, .key_len = key_len->buf,
                           .num_keys = nkeys};
    int64_t *is = iscratch->buf;
    float *fs = fscratch->buf;
    const mf_run_t run = {
        .plan = {.rows = rows->buf, .cols = cols->buf, .vals = vals->buf, .num_entries = ne,
                 .num_rows = num_rows, .num_keys = nkeys, .reg_of = reg_of->buf,
                 .row_of = row_of->buf},
        .table = &table, .rank = rank, .lr = (float)lr, .batch_size = batch_size,
        .scratch_keys = is, .w_rows = is + 2 * batch_size, .h_rows = is + 3 * batch_size,
        .x = fs, .reg = fs + batch_size, .values = fs + 3 * batch_size,
        .updates = fs + 3 * batch_size + 2 * batch_size * width};
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mf_train_table(&run, points->buf, n, losses->buf, keys->buf);
    Py_END_ALLOW_THREADS
    if (rc < 0 && -1 - rc < n) {
        const int64_t i = -1 - rc, e = ((const int64_t *)points->buf)[i];
        PyErr_Format(PyExc_ValueError, "%s: points[%lld] = %lld is not an entry of the %lld "
                     "given, or its row or column is outside the %lld x %lld matrix (nothing "
                     "trained)", fn, (long long)i, (long long)e, (long long)ne, num_rows,
                     (long long)(nkeys - num_rows));
        goto fail;
    }
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError, "%s: batch %lld: a key's row (key_offset, key_len) is "
                     "not inside data, or its length is not 2 * rank (the batches before it "
                     "were trained)", fn, (long long)(-1 - rc - n));
        goto fail;
    }
    release_views(&vs);
    return PyLong_FromLongLong(batches);
fail:
    release_views(&vs);
    return NULL;
}

PyDoc_STRVAR(mf_train_table_doc,
"mf_train_table(rank, lr, batch_size, rows, cols, vals, num_rows, reg_of, row_of, points,\n"
"               data, key_offset, key_len, iscratch, fscratch, losses, keys) -> batches\n"
"\n"
"A run of MF batches over the baseline's plain shared table (table_gather's data, key_offset,\n"
"key_len) in one call with the GIL released: for each batch of batch_size points (the last\n"
"may be shorter), what mf_plan, table_gather, mf_train_batch and table_scatter_add do one\n"
"after the other, with the same arithmetic (the table ends as that per-batch path leaves it).\n"
"rows, cols, vals, num_rows, reg_of, row_of: as mf_plan. losses (float64) gets each batch's\n"
"loss, keys (int64) its number of distinct keys (one item per batch each). Scratch: iscratch,\n"
"int64, 4 * batch_size items; fscratch, float32, 3 * batch_size + 8 * batch_size * rank.\n"
"Every point is checked before anything is written (ValueError).");

PyDoc_STRVAR(mf_plan_doc,
"mf_plan(rows, cols, vals, num_rows, reg_of, row_of, points, keys, w_rows, h_rows, x, reg)\n"
"    -> (keys written, row keys among them)\n"
"\n"
"One MF batch's plan from the training entries (rows, cols: int64, vals: float32) at points\n"
"(int64): the batch's distinct keys ascending into keys (row i is key i, column j key\n"
"num_rows + j; room for 2 * len(points)), per entry the position of its row key in keys into\n"
"w_rows and of its column key into h_rows (int64), its value into x (float32), per key\n"
"reg_of[key] into reg (float32; room for 2 * len(points)). The row keys come first. row_of:\n"
"int32 scratch, one per key, all -1 (and left so). The arrays numpy's\n"
"unique(concatenate([rows[points], num_rows + cols[points]]), return_inverse=True) gives.\n"
"The GIL is released.");

PyDoc_STRVAR(mf_train_batch_doc,
"mf_train_batch(rank, values, updates, w_rows, h_rows, x, reg, lr) -> loss_sum\n"
"\n"
"Trains one batch of matrix entries in place with AdaGrad, entry by entry (see\n"
"native/kernels/mf.h for the exact step). values: float32, writable, rows of 2*rank floats\n"
"([factor | AdaGrad accumulator]); updates: its size, not overlapping it: receives values after\n"
"minus values before. w_rows, h_rows: int64 per entry, the rows of its row and column factor;\n"
"x: float32 per entry, its value; reg: float32 per row, its L2 weight. Returns the sum of the\n"
"squared errors before each step. Every row index is checked before anything is written\n"
"(ValueError; TypeError for a dtype). The GIL is released for the computation.");

PyDoc_STRVAR(mf_parse_doc,
"mf_parse(text, skip_percent, base, rows, cols, vals, lines) -> entries or -line\n"
"\n"
"Parses complete lines of '<int> <int> <number>' (blanks or tabs between; empty lines, and\n"
"lines starting with '%' if skip_percent, skipped) into rows, cols (int64, minus base), vals\n"
"(float32) and lines (int64: each entry's 1-based line number in text); each needs room for\n"
"one entry per line. Returns the number of entries, or minus the number of the first line that\n"
"does not parse. The GIL is released while parsing.");

PyDoc_STRVAR(mf_format_doc,
"mf_format(rows, cols, vals, base, sep) -> bytes\n"
"\n"
"'<row+base><sep><col+base><sep><value>\\n' per entry (int64, int64, float32; the value with 9\n"
"significant digits, which reads back as the same float32). The GIL is released.");

PyMethodDef mf_methods[] = {
    {"mf_train_batch", (PyCFunction)(void (*)(void))py_mf_train_batch,
     METH_VARARGS | METH_KEYWORDS, mf_train_batch_doc},
    {"mf_plan", (PyCFunction)(void (*)(void))py_mf_plan, METH_VARARGS | METH_KEYWORDS,
     mf_plan_doc},
    {"mf_train_table", (PyCFunction)(void (*)(void))py_mf_train_table,
     METH_VARARGS | METH_KEYWORDS, mf_train_table_doc},
    {"mf_parse", (PyCFunction)(void (*)(void))py_mf_parse, METH_VARARGS | METH_KEYWORDS,
     mf_parse_doc},
    {"mf_format", (PyCFunction)(void (*)(void))py_mf_format, METH_VARARGS | METH_KEYWORDS,
     mf_format_doc},
    {NULL, NULL, 0, NULL},
};
