/* CPython binding of mf.c: the MF batch trainer and the data file parser and writer.
 * Conventions as module.c: every buffer checked while holding the GIL, one call into mf.c with
 * the GIL released, nothing written when a check fails, the buffers stay the caller's.
 */
#include "rows_binding.h"
#include "mf.h"
#include "radix.h"

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

static PyObject *py_mf_columns(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "mf_columns";
    static char *kwlist[] = {"cols", "num_rows", "row_of", "points", "batch_size", "keys",
                             "counts", NULL};
    PyObject *ocols, *orow_of, *opoints, *okeys, *ocounts;
    long long num_rows, batch_size;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OLOOLOO", kwlist, &ocols, &num_rows,
                                     &orow_of, &opoints, &batch_size, &okeys, &ocounts))
        return NULL;
    if (batch_size < 1)
        return PyErr_Format(PyExc_ValueError, "%s: batch_size must be positive, got %lld", fn,
                            batch_size);
    views_t vs = {.n = 0};
    Py_buffer *cols, *points, *row_of, *keys, *counts;
    if (!(cols = take(&vs, ocols, fn, "cols", I64, 0, 1)) ||
        !(points = take(&vs, opoints, fn, "points", I64, 0, 1)) ||
        !(row_of = take(&vs, orow_of, fn, "row_of", I32, 1, 1)) ||
        !(keys = take(&vs, okeys, fn, "keys", I64, 1, 1)) ||
        !(counts = take(&vs, ocounts, fn, "counts", I64, 1, 1)))
        goto fail;
    for (int i = 2; i < vs.n; i++)
        if (check_no_overlap(&vs, &vs.v[i], fn, "an output") < 0) goto fail;
    const int64_t n = count(points), nkeys = count(row_of);
    if (num_rows < 0 || num_rows > nkeys || nkeys > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: row_of needs one item per key (at most 2**31 - 1), "
                     "num_rows %lld of them", fn, num_rows);
        goto fail;
    }
    if (count(keys) < n || count(counts) < (n + batch_size - 1) / batch_size) {
        PyErr_Format(PyExc_ValueError, "%s: keys needs len(points) = %lld items, counts one per "
                     "batch", fn, (long long)n);
        goto fail;
    }
    const mf_plan_t plan = {.cols = cols->buf, .num_entries = count(cols),
                            .num_rows = num_rows, .num_keys = nkeys, .row_of = row_of->buf};
    int64_t total;
    Py_BEGIN_ALLOW_THREADS
    total = mf_columns(&plan, points->buf, n, batch_size, keys->buf, counts->buf);
    Py_END_ALLOW_THREADS
    if (total < 0) {
        const int64_t i = -1 - total;
        PyErr_Format(PyExc_ValueError, "%s: points[%lld] = %lld is not an entry of the %lld "
                     "given, or its column is outside the matrix", fn, (long long)i,
                     (long long)((const int64_t *)points->buf)[i], (long long)count(cols));
        goto fail;
    }
    release_views(&vs);
    return PyLong_FromLongLong(total);
fail:
    release_views(&vs);
    return NULL;
}

PyDoc_STRVAR(mf_columns_doc,
"mf_columns(cols, num_rows, row_of, points, batch_size, keys, counts) -> keys written\n"
"\n"
"Each batch's distinct column keys (num_rows + column; batch b: points[b * batch_size, ...)),\n"
"in order of first appearance, back to back in keys (int64, room for len(points)), and their\n"
"number per batch in counts (int64, one per batch): what a worker signals as intent per\n"
"batch. row_of: int32 scratch, one per key, all -1 (and left so). The GIL is released;\n"
"ValueError (nothing written) for a point outside cols or a column outside the matrix.");

/* What mf_train_table and mf_train_rows share: the arguments before the rows (rank, lr,
 * batch_size, rows, cols, vals, num_rows, reg_of, row_of, points), the scratch and outputs
 * after them (iscratch, fscratch, losses, keys), their checks, and the error of a failed run.
 * The rows' buffers (a table's) and outputs (left_keys, left_rows) are the caller's. */
typedef struct {
    const char *fn;
    long long rank, batch_size, num_rows;
    double lr;
    views_t vs;
    Py_buffer *points;
    double *losses;
    int64_t *keys;
    int64_t ne, n, nkeys, batches;
    mf_run_t run;  /* run.rows is set by take_rows */
} run_args_t;

/* o: rows, cols, vals, reg_of, row_of, points, then nrows_args objects for take_rows (which
 * takes the rows' buffers and sets run.rows), then iscratch, fscratch, losses, keys.
 * int_scratch: iscratch's items per batch_size (4 for a table, whose gather reports no missing
 * keys; 6 with the missing positions' scratch). 0, or -1 with an error (the caller releases
 * the views). */
static int take_run(run_args_t *a, PyObject **o, int nrows_args, int int_scratch,
                    int (*take_rows)(run_args_t *, PyObject **)) {
    const char *fn = a->fn;
    const long long rank = a->rank, batch_size = a->batch_size;
    if (rank < 1 || rank > MF_MAX_RANK) {
        PyErr_Format(PyExc_ValueError, "%s: rank %lld outside [1, %d]", fn, rank, MF_MAX_RANK);
        return -1;
    }
    if (batch_size < 1 || batch_size > (INT64_MAX / 64) / (4 * rank)) {
        PyErr_Format(PyExc_ValueError, "%s: batch_size %lld must be positive (and not absurdly "
                     "large)", fn, batch_size);
        return -1;
    }
    views_t *vs = &a->vs;
    Py_buffer *rows, *cols, *vals, *reg_of, *row_of, *iscratch, *fscratch, *losses, *keys;
    PyObject **tail = o + 6 + nrows_args;
    if (!(rows = take(vs, o[0], fn, "rows", I64, 0, 1)) ||
        !(cols = take(vs, o[1], fn, "cols", I64, 0, 1)) ||
        !(vals = take(vs, o[2], fn, "vals", F32, 0, 1)) ||
        !(reg_of = take(vs, o[3], fn, "reg_of", F32, 0, 1)) ||
        !(a->points = take(vs, o[5], fn, "points", I64, 0, 1)))
        return -1;
    const int first_written = vs->n;
    if (!(row_of = take(vs, o[4], fn, "row_of", I32, 1, 1)) || take_rows(a, o + 6) < 0 ||
        !(iscratch = take(vs, tail[0], fn, "iscratch", I64, 1, 1)) ||
        !(fscratch = take(vs, tail[1], fn, "fscratch", F32, 1, 1)) ||
        !(losses = take(vs, tail[2], fn, "losses", F64, 1, 1)) ||
        !(keys = take(vs, tail[3], fn, "keys", I64, 1, 1)))
        return -1;
    for (int i = first_written; i < vs->n; i++) /* the written buffers: row_of onwards */
        if (check_no_overlap(vs, &vs->v[i], fn, "an output") < 0) return -1;
    a->ne = count(rows);
    a->n = count(a->points);
    a->nkeys = count(reg_of);
    const int64_t width = 2 * rank;
    a->batches = (a->n + batch_size - 1) / batch_size;
    if (check_matrix(fn, a->ne, count(cols), count(vals), a->nkeys, count(row_of),
                     a->num_rows) < 0)
        return -1;
    if (count(iscratch) < int_scratch * batch_size ||
        count(fscratch) < 3 * batch_size + 4 * batch_size * width) {
        PyErr_Format(PyExc_ValueError, "%s: iscratch needs %d * batch_size = %lld items, "
                     "fscratch 3 * batch_size + 8 * batch_size * rank = %lld", fn, int_scratch,
                     int_scratch * batch_size, 3 * batch_size + 4 * batch_size * width);
        return -1;
    }
    if (count(losses) < a->batches || count(keys) < a->batches) {
        PyErr_Format(PyExc_ValueError, "%s: losses and keys need one item per batch, %lld", fn,
                     (long long)a->batches);
        return -1;
    }
    int64_t *is = iscratch->buf;
    float *fs = fscratch->buf;
    a->losses = losses->buf;
    a->keys = keys->buf;
    a->run = (mf_run_t){
        .rows = a->run.rows, .left_keys = a->run.left_keys, .left_rows = a->run.left_rows,
        .plan = {.rows = rows->buf, .cols = cols->buf, .vals = vals->buf, .num_entries = a->ne,
                 .num_rows = a->num_rows, .num_keys = a->nkeys, .reg_of = reg_of->buf,
                 .row_of = row_of->buf},
        .rank = rank, .lr = (float)a->lr, .batch_size = batch_size,
        .scratch_keys = is, .w_rows = is + 2 * batch_size, .h_rows = is + 3 * batch_size,
        .missing = int_scratch >= 6 ? is + 4 * batch_size : NULL,
        .x = fs, .reg = fs + batch_size, .values = fs + 3 * batch_size,
        .updates = fs + 3 * batch_size + 2 * batch_size * width};
    return 0;
}

/* The error of a run that returned rc < 0 (see mf_train_rows); what: the rows' words. */
static void run_error(const run_args_t *a, int64_t rc, const char *what) {
    if (-1 - rc < a->n) {
        const int64_t i = -1 - rc, e = ((const int64_t *)a->points->buf)[i];
        PyErr_Format(PyExc_ValueError, "%s: points[%lld] = %lld is not an entry of the %lld "
                     "given, or its row or column is outside the %lld x %lld matrix (nothing "
                     "trained)", a->fn, (long long)i, (long long)e, (long long)a->ne,
                     a->num_rows, (long long)(a->nkeys - a->num_rows));
        return;
    }
    PyErr_Format(PyExc_ValueError, "%s: batch %lld: %s (the batches before it were trained)",
                 a->fn, (long long)(-1 - rc - a->n), what);
}

/* mf_train_rows with the GIL released: the batches trained, or -1 with the error set (what:
 * the rows' failure in words, for run_error). */
static int64_t train(run_args_t *a, const char *what, int *stop, int64_t *left) {
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mf_train_rows(&a->run, a->points->buf, a->n, a->losses, a->keys, stop, left);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        run_error(a, rc, what);
        return -1;
    }
    return rc;
}

/* Both runs' arguments: rank, lr, batch_size, then 13 objects into o (num_rows after the
 * third), by the caller's keyword names. 0 with an error set. */
static int parse_run(PyObject *args, PyObject *kwargs, char **kwlist, run_args_t *a,
                     PyObject **o) {
    return PyArg_ParseTupleAndKeywords(args, kwargs, "LdLOOOLOOOOOOOOOO", kwlist, &a->rank,
                                       &a->lr, &a->batch_size, &o[0], &o[1], &o[2],
                                       &a->num_rows, &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                                       &o[9], &o[10], &o[11], &o[12]);
}

/* The table's buffers: data, key_offset, key_len (after points). */
typedef struct {
    run_args_t a;
    table_t table;
    rows_t rows;
} table_run_t;

static int take_table(run_args_t *a, PyObject **o) {
    table_run_t *t = (table_run_t *)a;
    if (take_table_rows(&a->vs, o[0], o[1], o[2], a->fn, &t->table, &t->rows) < 0) return -1;
    a->run.rows = &t->rows;
    return 0;
}

static PyObject *py_mf_train_table(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"rank", "lr", "batch_size", "rows", "cols", "vals", "num_rows",
                             "reg_of", "row_of", "points", "data", "key_offset", "key_len",
                             "iscratch", "fscratch", "losses", "keys", NULL};
    table_run_t t = {.a = {.fn = "mf_train_table", .vs = {.n = 0}}};
    run_args_t *a = &t.a;
    PyObject *o[13];
    if (!parse_run(args, kwargs, kwlist, a, o)) return NULL;
    if (take_run(a, o, 3, 4, take_table) < 0) goto fail;
    if (t.table.num_keys != a->nkeys) {
        PyErr_Format(PyExc_ValueError, "%s: key_offset and key_len need one item per key, %lld "
                     "(got %lld)", a->fn, (long long)a->nkeys, (long long)t.table.num_keys);
        goto fail;
    }
    int64_t left;
    int stop;
    const int64_t rc = train(a, "a key's row (key_offset, key_len) is not inside data, or its "
                                "length is not 2 * rank", &stop, &left);
    if (rc < 0) goto fail;
    release_views(&a->vs);
    return PyLong_FromLongLong(rc);
fail:
    release_views(&a->vs);
    return NULL;
}

/* A node's rows: the capsule of Store.rows() (rows.h), then left_keys and left_rows. */
static int take_store(run_args_t *a, PyObject **o) {
    const int64_t width = 2 * a->rank;
    const rows_t *rows = store_rows(o[0], a->fn, "store_rows", width, "2 * rank");
    if (!rows) return -1;
    Py_buffer *left_keys, *left_rows;
    if (!(left_keys = take(&a->vs, o[1], a->fn, "left_keys", I64, 1, 1)) ||
        !(left_rows = take(&a->vs, o[2], a->fn, "left_rows", F32, 1, 0)))
        return -1;
    if (count(left_keys) < 2 * a->batch_size || count(left_rows) < 2 * a->batch_size * width) {
        PyErr_Format(PyExc_ValueError, "%s: left_keys needs 2 * batch_size = %lld items, "
                     "left_rows 2 * batch_size rows of 2 * rank floats", a->fn,
                     2 * a->batch_size);
        return -1;
    }
    a->run.rows = rows;
    a->run.left_keys = left_keys->buf;
    a->run.left_rows = left_rows->buf;
    return 0;
}

static PyObject *py_mf_train_rows(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"rank", "lr", "batch_size", "rows", "cols", "vals", "num_rows",
                             "reg_of", "row_of", "points", "store_rows", "left_keys",
                             "left_rows", "iscratch", "fscratch", "losses", "keys", NULL};
    run_args_t args_ = {.fn = "mf_train_rows", .vs = {.n = 0}}, *a = &args_;
    PyObject *o[13];
    if (!parse_run(args, kwargs, kwlist, a, o)) return NULL;
    if (take_run(a, o, 3, 6, take_store) < 0) goto fail;
    if (a->run.rows->num_keys < a->nkeys) {
        PyErr_Format(PyExc_ValueError, "%s: the matrix has %lld keys, the store %lld", a->fn,
                     (long long)a->nkeys, (long long)a->run.rows->num_keys);
        goto fail;
    }
    int64_t left;
    int stop;
    const int64_t rc = train(a, "the store could not take its rows", &stop, &left);
    if (rc < 0) goto fail;
    release_views(&a->vs);
    return Py_BuildValue("(LiL)", (long long)rc, stop, (long long)left);
fail:
    release_views(&a->vs);
    return NULL;
}

PyDoc_STRVAR(mf_train_rows_doc,
"mf_train_rows(rank, lr, batch_size, rows, cols, vals, num_rows, reg_of, row_of, points,\n"
"              store_rows, left_keys, left_rows, iscratch, fscratch, losses, keys)\n"
"    -> (batches, stop, left)\n"
"\n"
"mf_train_table over a node's store instead of a table: store_rows is Store.rows() (a\n"
"capsule; rows of 2 * rank floats), through which each batch is gathered and its updates\n"
"added without the GIL. Returns the batches trained and why it returned: stop 0, all of\n"
"them; 1 (STOP_PULL), the next batch has keys not held here (nothing of it written: train it\n"
"through the node and call again from the batch after it); 2 (STOP_PUSH), the last batch's\n"
"updates of `left` keys that left meanwhile are in left_keys (int64) and left_rows (float32;\n"
"room for 2 * batch_size keys and rows each): push them through the node. iscratch needs\n"
"6 * batch_size items; the rest as mf_train_table.");

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

static PyObject *py_radix_argsort(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "radix_argsort";
    static char *kwlist[] = {"keys", "order", NULL};
    PyObject *okeys, *oorder;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO", kwlist, &okeys, &oorder)) return NULL;
    views_t vs = {.n = 0};
    Py_buffer *keys, *order;
    if (!(keys = take(&vs, okeys, fn, "keys", I64, 0, 1)) ||
        !(order = take(&vs, oorder, fn, "order", I64, 1, 1)) ||
        check_no_overlap(&vs, order, fn, "order") < 0)
        goto fail;
    if (count(order) != count(keys)) {
        PyErr_Format(PyExc_ValueError, "%s: order needs one item per key (%lld, got %lld)", fn,
                     (long long)count(keys), (long long)count(order));
        goto fail;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = radix_argsort(keys->buf, count(keys), order->buf);
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        PyErr_NoMemory();
        goto fail;
    }
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError, "%s: %lld keys: at most 2^32 - 1", fn,
                     (long long)count(keys));
        goto fail;
    }
    release_views(&vs);
    Py_RETURN_NONE;
fail:
    release_views(&vs);
    return NULL;
}

PyDoc_STRVAR(radix_argsort_doc,
"radix_argsort(keys, order) -> None\n"
"\n"
"order (int64, writable, len(keys)) gets the positions of keys (int64) in ascending order, equal\n"
"keys in their order in keys: numpy's argsort(keys, kind='stable'), by radix sort (O(n), 24\n"
"bytes of scratch per key). MF's epoch schedule. Blocking; the GIL is released.");

PyMethodDef mf_methods[] = {
    {"radix_argsort", (PyCFunction)(void (*)(void))py_radix_argsort,
     METH_VARARGS | METH_KEYWORDS, radix_argsort_doc},
    {"mf_train_batch", (PyCFunction)(void (*)(void))py_mf_train_batch,
     METH_VARARGS | METH_KEYWORDS, mf_train_batch_doc},
    {"mf_plan", (PyCFunction)(void (*)(void))py_mf_plan, METH_VARARGS | METH_KEYWORDS,
     mf_plan_doc},
    {"mf_train_table", (PyCFunction)(void (*)(void))py_mf_train_table,
     METH_VARARGS | METH_KEYWORDS, mf_train_table_doc},
    {"mf_train_rows", (PyCFunction)(void (*)(void))py_mf_train_rows,
     METH_VARARGS | METH_KEYWORDS, mf_train_rows_doc},
    {"mf_columns", (PyCFunction)(void (*)(void))py_mf_columns, METH_VARARGS | METH_KEYWORDS,
     mf_columns_doc},
    {"mf_parse", (PyCFunction)(void (*)(void))py_mf_parse, METH_VARARGS | METH_KEYWORDS,
     mf_parse_doc},
    {"mf_format", (PyCFunction)(void (*)(void))py_mf_format, METH_VARARGS | METH_KEYWORDS,
     mf_format_doc},
    {NULL, NULL, 0, NULL},
};
