/* CPython binding of wv_run.c: a run of WV batches planned (wv_plan_run) and trained over the
 * baseline's table (wv_train_table) or a node's store (wv_train_rows). Conventions as module.c:
 * every buffer checked while holding the GIL, one call into wv_run.c with the GIL released,
 * nothing written when a check fails, the buffers stay the caller's.
 */
#include "rows_binding.h"
#include "wv.h"
#include "wv_run.h"

/* The batch table: int64 (nb, WV_B_COLS), C-contiguous. NULL with an error set. */
static Py_buffer *take_batches(views_t *vs, PyObject *o, const char *fn, int writable) {
    Py_buffer *v = take(vs, o, fn, "batches", I64, writable, 2);
    if (v && (v->ndim != 2 || v->shape[1] != WV_B_COLS)) {
        PyErr_Format(PyExc_ValueError, "%s: batches must have shape (batches, %d)", fn,
                     WV_B_COLS);
        return NULL;
    }
    return v;
}

/* The plan's positions array: int64 (3, cap). NULL with an error set. */
static Py_buffer *take_rows3(views_t *vs, PyObject *o, const char *fn, int writable) {
    Py_buffer *v = take(vs, o, fn, "plan_rows", I64, writable, 2);
    if (v && (v->ndim != 2 || v->shape[0] != 3)) {
        PyErr_Format(PyExc_ValueError, "%s: plan_rows must have shape (3, cap)", fn);
        return NULL;
    }
    return v;
}

static int check_written(views_t *vs, int first, const char *fn) {
    for (int i = first; i < vs->n; i++)
        if (check_no_overlap(vs, &vs->v[i], fn, "an output") < 0) return -1;
    return 0;
}

static PyObject *py_wv_plan_run(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "wv_plan_run";
    static char *kwlist[] = {"tokens", "starts", "lengths", "keep", "window", "batches",
                             "row_of", "plan_rows", "ends", "keys", NULL};
    PyObject *o[9];
    long long window;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOLOOOOO", kwlist, &o[0], &o[1], &o[2],
                                     &o[3], &window, &o[4], &o[5], &o[6], &o[7], &o[8]))
        return NULL;
    if (window < 1) return PyErr_Format(PyExc_ValueError, "%s: window must be >= 1", fn);
    views_t vs = {.n = 0};
    Py_buffer *tokens, *starts, *lengths, *keep, *batches, *row_of, *rows3, *ends, *keys;
    if (!(tokens = take(&vs, o[0], fn, "tokens", I32, 0, 1)) ||
        !(starts = take(&vs, o[1], fn, "starts", I64, 0, 1)) ||
        !(lengths = take(&vs, o[2], fn, "lengths", I64, 0, 1)) ||
        !(keep = take(&vs, o[3], fn, "keep", F64, 0, 1)) ||
        !(batches = take_batches(&vs, o[4], fn, 1)) ||
        !(row_of = take(&vs, o[5], fn, "row_of", I32, 1, 1)) ||
        !(rows3 = take_rows3(&vs, o[6], fn, 1)) ||
        !(ends = take(&vs, o[7], fn, "ends", I64, 1, 1)) ||
        !(keys = take(&vs, o[8], fn, "keys", I64, 1, 1)))
        goto fail;
    if (check_written(&vs, 4, fn) < 0) goto fail;
    const int64_t nsent = count(starts), vocab = count(keep), nb = batches->shape[0];
    const int64_t cap = rows3->shape[1];
    int64_t *table = batches->buf, sentences = 0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t s = table[b * WV_B_COLS + WV_B_SENTENCES];
        const int64_t p = table[b * WV_B_COLS + WV_B_PLAN_SEED];
        if (s < 0 || s > nsent - sentences || p < 0) {
            PyErr_Format(PyExc_ValueError, "%s: batch %lld: %lld sentences (of %lld left) and "
                         "plan seed %lld: both must be >= 0 and within the sentences given",
                         fn, (long long)b, (long long)s, (long long)(nsent - sentences),
                         (long long)p);
            goto fail;
        }
        sentences += s;
    }
    const int64_t *len = lengths->buf;
    int64_t total = 0;
    for (int64_t s = 0; s < nsent; s++) {
        if (len[s] < 0 || len[s] > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: lengths[%lld] = %lld is outside [0, 2^31)", fn,
                         (long long)s, (long long)len[s]);
            goto fail;
        }
        total += len[s];
    }
    if (sentences != nsent || count(lengths) != nsent || count(ends) < nsent ||
        count(row_of) < 2 * vocab || cap < total || count(keys) < 2 * total) {
        PyErr_Format(PyExc_ValueError, "%s: the batches need all %lld sentences (they take "
                     "%lld), starts and lengths one item per sentence, ends room for them, "
                     "row_of 2 * len(keep) items, plan_rows (3, cap >= %lld) and keys room for "
                     "%lld", fn, (long long)nsent, (long long)sentences, (long long)total,
                     (long long)(2 * total));
        goto fail;
    }
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = wv_plan_run(tokens->buf, count(tokens), starts->buf, lengths->buf, nb, table, keep->buf,
                    vocab, window, row_of->buf, rows3->buf, cap, ends->buf, keys->buf);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "%s: sentence %lld lies outside tokens or holds a word "
                     "outside [0, len(keep))", fn, (long long)(-1 - n));
        goto fail;
    }
    release_views(&vs);
    return PyLong_FromLongLong(n);
fail:
    release_views(&vs);
    return NULL;
}

/* What both runs share. */
typedef struct {
    const char *fn;
    long long dim, negatives;
    int sgd;
    views_t vs;
    Py_buffer *batches, *rows3, *ends, *keys, *samples, *lrs, *losses, *counts;
    long long first, last; /* the batches to train: [first, last) */
    long long width;       /* floats per row (0: 2 * dim) */
    int64_t left_room; /* rows left_keys and left_rows hold (take_store) */
    wv_run_t run;      /* run.rows (and left_*) set by take_rows */
} run_args_t;

static int parse_run(PyObject *args, PyObject *kwargs, char **kwlist, run_args_t *a,
                     PyObject **o) {
    a->first = 0;
    a->last = -1;
    a->width = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLpOOOOOOOOOOOOOOO|LLL", kwlist, &a->dim,
                                     &a->negatives, &a->sgd, &o[0], &o[1], &o[2], &o[3], &o[4],
                                     &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12],
                                     &o[13], &o[14], &a->first, &a->last, &a->width))
        return 0;
    if (a->width == 0) a->width = 2 * a->dim;
    return 1;
}

/* o: batches, plan_rows, ends, keys, samples, lrs, then 3 objects for take_rows, then row_of,
 * iscratch, values, updates, losses, counts. 0, or -1 with an error (the caller releases). */
static int take_run(run_args_t *a, PyObject **o, int (*take_rows)(run_args_t *, PyObject **)) {
    const char *fn = a->fn;
    if (a->dim < 1 || a->dim > WV_MAX_DIM) {
        PyErr_Format(PyExc_ValueError, "%s: dim %lld outside [1, %d]", fn, a->dim, WV_MAX_DIM);
        return -1;
    }
    if (a->width < (a->sgd ? a->dim : 2 * a->dim) || a->width > 2 * (long long)WV_MAX_DIM) {
        PyErr_Format(PyExc_ValueError, "%s: width %lld: rows need the vector (dim = %lld floats)"
                     "%s, and at most %d floats", fn, a->width, a->dim,
                     a->sgd ? "" : " and its AdaGrad accumulator (2 * dim)", 2 * WV_MAX_DIM);
        return -1;
    }
    if (a->negatives < 0 || a->negatives > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: negatives %lld outside [0, 2^31)", fn, a->negatives);
        return -1;
    }
    views_t *vs = &a->vs;
    Py_buffer *row_of, *iscratch, *values, *updates;
    if (!(a->batches = take_batches(vs, o[0], fn, 0)) ||
        !(a->rows3 = take_rows3(vs, o[1], fn, 0)) ||
        !(a->ends = take(vs, o[2], fn, "ends", I64, 0, 1)) ||
        !(a->keys = take(vs, o[3], fn, "keys", I64, 0, 1)) ||
        !(a->samples = take(vs, o[4], fn, "samples", I64, 0, 1)) ||
        !(a->lrs = take(vs, o[5], fn, "lrs", F64, 0, 1)))
        return -1;
    const int first_written = vs->n;
    if (take_rows(a, o + 6) < 0 || !(row_of = take(vs, o[9], fn, "row_of", I32, 1, 1)) ||
        !(iscratch = take(vs, o[10], fn, "iscratch", I64, 1, 1)) ||
        !(values = take(vs, o[11], fn, "values", F32, 1, 0)) ||
        !(updates = take(vs, o[12], fn, "updates", F32, 1, 0)) ||
        !(a->losses = take(vs, o[13], fn, "losses", F64, 1, 1)) ||
        !(a->counts = take(vs, o[14], fn, "counts", I64, 1, 0)))
        return -1;
    if (check_written(vs, first_written, fn) < 0) return -1;
    /* The table's sizes against the plan's arrays, and the largest batch (keys plus pool). */
    const int64_t nb = a->batches->shape[0], cap = a->rows3->shape[1];
    const int64_t *table = a->batches->buf;
    int64_t sentences = 0, positions = 0, keys = 0, samples = 0, max_rows = 0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t *row = table + b * WV_B_COLS;
        const int64_t ns = row[WV_B_SENTENCES], np = row[WV_B_POSITIONS], nk = row[WV_B_KEYS];
        if (ns < 0 || np < 0 || nk < 0 || row[WV_B_TRAIN_SEED] < 0 || np > INT32_MAX ||
            nk > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: batch %lld: sentences %lld, positions %lld, "
                         "keys %lld and the train seed must be >= 0 (and below 2^31)", fn,
                         (long long)b, (long long)ns, (long long)np, (long long)nk,
                         (long long)row[WV_B_TRAIN_SEED]);
            return -1;
        }
        const int64_t nd = WV_POOL(a->negatives, np);
        sentences += ns;
        positions += np;
        keys += nk;
        samples += nd;
        if (nk + nd > max_rows) max_rows = nk + nd;
        if (sentences > count(a->ends) || positions > cap || keys > count(a->keys) ||
            samples > count(a->samples)) {
            PyErr_Format(PyExc_ValueError, "%s: batches 0..%lld take more sentences, positions, "
                         "keys or samples than ends (%lld), plan_rows (%lld), keys (%lld) or "
                         "samples (%lld) hold", fn, (long long)b, (long long)count(a->ends),
                         (long long)cap, (long long)count(a->keys),
                         (long long)count(a->samples));
            return -1;
        }
    }
    if (samples != count(a->samples)) {
        PyErr_Format(PyExc_ValueError, "%s: samples holds %lld keys, the batches' pools %lld", fn,
                     (long long)count(a->samples), (long long)samples);
        return -1;
    }
    const int64_t width = a->width, num_keys = count(row_of);
    if (num_keys > a->run.rows->num_keys) {
        PyErr_Format(PyExc_ValueError, "%s: row_of has %lld items, one per key of the run, but "
                     "the rows hold %lld keys", fn, (long long)num_keys,
                     (long long)a->run.rows->num_keys);
        return -1;
    }
    if (count(iscratch) < 4 * max_rows ||
        count(values) < max_rows * width || count(updates) < max_rows * width ||
        count(a->lrs) < nb || count(a->losses) < nb || count(a->counts) < 2 * nb) {
        PyErr_Format(PyExc_ValueError, "%s: iscratch needs 4 * %lld items (the largest batch's "
                     "keys and pool), values and updates %lld rows of %lld floats, lrs and "
                     "losses one item per batch, counts two", fn, (long long)max_rows,
                     (long long)max_rows, (long long)width);
        return -1;
    }
    if (a->run.left_keys && max_rows > a->left_room) {
        PyErr_Format(PyExc_ValueError, "%s: left_keys and left_rows need room for %lld keys and "
                     "rows (the largest batch's keys and pool)", fn, (long long)max_rows);
        return -1;
    }
    if (a->last < 0) a->last = nb;
    if (a->first < 0 || a->first > a->last || a->last > nb) {
        PyErr_Format(PyExc_ValueError, "%s: first %lld and last %lld must satisfy 0 <= first <= "
                     "last <= %lld batches", fn, a->first, a->last, (long long)nb);
        return -1;
    }
    a->run.dim = a->dim;
    a->run.width = a->width;
    a->run.negatives = a->negatives;
    a->run.sgd = a->sgd;
    a->run.num_keys = num_keys;
    a->run.row_of = row_of->buf;
    a->run.iscratch = iscratch->buf;
    a->run.values = values->buf;
    a->run.updates = updates->buf;
    a->run.max_rows = max_rows;
    return 0;
}

/* wv_train_run with the GIL released: the batches trained, or -1 with the error set. */
static int64_t train(run_args_t *a, const char *what, int *stop, int64_t *left) {
    int64_t rc, at = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = wv_train_run(&a->run, a->first, a->last, a->batches->buf, a->rows3->buf,
                      a->rows3->shape[1],
                      a->ends->buf, a->keys->buf, a->samples->buf, a->lrs->buf, a->losses->buf,
                      a->counts->buf, stop, left, &at);
    Py_END_ALLOW_THREADS
    if (rc >= 0) return rc;
    switch (rc) {
    case WV_RUN_BAD_PLAN:
        PyErr_Format(PyExc_ValueError, "%s: batch %lld: a row, window or sentence end lies "
                     "outside its plan (nothing trained)", a->fn, (long long)at);
        break;
    case WV_RUN_BAD_KEY:
        PyErr_Format(PyExc_ValueError, "%s: keys[%lld] = %lld is outside [0, %lld) or repeated "
                     "in its batch (nothing trained)", a->fn, (long long)at,
                     (long long)((const int64_t *)a->keys->buf)[at],
                     (long long)a->run.num_keys);
        break;
    case WV_RUN_BAD_SAMPLE:
        PyErr_Format(PyExc_ValueError, "%s: samples[%lld] = %lld is outside [0, %lld) (nothing "
                     "trained)", a->fn, (long long)at,
                     (long long)((const int64_t *)a->samples->buf)[at],
                     (long long)a->run.num_keys);
        break;
    default:
        PyErr_Format(PyExc_ValueError, "%s: batch %lld: %s (the batches before it were "
                     "trained)", a->fn, (long long)at, what);
        break;
    }
    return -1;
}

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

static PyObject *py_wv_train_table(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"dim", "negatives", "sgd", "batches", "plan_rows", "ends", "keys",
                             "samples", "lrs", "data", "key_offset", "key_len", "row_of",
                             "iscratch", "values", "updates", "losses", "counts", "first", "last",
                             "width", NULL};
    table_run_t t = {.a = {.fn = "wv_train_table", .vs = {.n = 0}}};
    run_args_t *a = &t.a;
    PyObject *o[15];
    if (!parse_run(args, kwargs, kwlist, a, o)) return NULL;
    if (take_run(a, o, take_table) < 0) goto fail;
    int64_t left;
    int stop;
    const int64_t rc = train(a, "a key's row (key_offset, key_len) is not inside data, or is "
                                "not 2 * dim floats", &stop, &left);
    if (rc < 0) goto fail;
    release_views(&a->vs);
    return PyLong_FromLongLong(rc);
fail:
    release_views(&a->vs);
    return NULL;
}

/* A node's rows: the capsule of Store.rows(), then left_keys and left_rows. */
static int take_store(run_args_t *a, PyObject **o) {
    const int64_t width = a->width;
    const rows_t *rows = store_rows(o[0], a->fn, "store_rows", width, "width");
    if (!rows) return -1;
    Py_buffer *left_keys, *left_rows;
    if (!(left_keys = take(&a->vs, o[1], a->fn, "left_keys", I64, 1, 1)) ||
        !(left_rows = take(&a->vs, o[2], a->fn, "left_rows", F32, 1, 0)))
        return -1;
    a->run.rows = rows;
    a->run.left_keys = left_keys->buf;
    a->run.left_rows = left_rows->buf;
    /* take_run checks the largest batch against this room */
    a->left_room = count(left_keys) < count(left_rows) / width ? count(left_keys)
                                                               : count(left_rows) / width;
    return 0;
}

static PyObject *py_wv_train_rows(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"dim", "negatives", "sgd", "batches", "plan_rows", "ends", "keys",
                             "samples", "lrs", "store_rows", "left_keys", "left_rows", "row_of",
                             "iscratch", "values", "updates", "losses", "counts", "first", "last",
                             "width", NULL};
    run_args_t args_ = {.fn = "wv_train_rows", .vs = {.n = 0}}, *a = &args_;
    PyObject *o[15];
    if (!parse_run(args, kwargs, kwlist, a, o)) return NULL;
    if (take_run(a, o, take_store) < 0) goto fail;
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

PyDoc_STRVAR(wv_plan_run_doc,
"wv_plan_run(tokens, starts, lengths, keep, window, batches, row_of, plan_rows, ends, keys)\n"
"    -> positions\n"
"\n"
"Plans a run of WV batches in one call with the GIL released: per batch what wv_plan does\n"
"(subsampling by keep, windows in [1, window], the batch's distinct keys), batch after batch.\n"
"starts, lengths: int64, the run's sentences in tokens (int32 word ids); batches: int64\n"
"(batches, 5): per batch its sentences (the run's next ones) and plan seed (columns 0 and 1,\n"
"read), its positions and keys (columns 3 and 4, written); column 2 (the train seed) is left\n"
"alone. Writes the positions back to back to plan_rows (int64 (3, cap), cap at least the\n"
"run's tokens: in_rows, out_rows, windows; each batch's rows count from its first key), each\n"
"sentence's end (from its batch's first position) to ends and the keys back to back to keys\n"
"(room for 2 * cap). row_of: int32 scratch, 2 * len(keep) items, all -1 (left so). Returns the\n"
"run's positions; ValueError for a sentence outside tokens or a word outside [0, len(keep)).\n"
"Blocking; the GIL is released.");

PyDoc_STRVAR(wv_train_table_doc,
"wv_train_table(dim, negatives, sgd, batches, plan_rows, ends, keys, samples, lrs, data,\n"
"               key_offset, key_len, row_of, iscratch, values, updates, losses, counts,\n"
"               first=0, last=-1, width=2*dim) -> batches\n"
"\n"
"Trains batches [first, last) (last -1: to the end) of a planned run (wv_plan_run's outputs)\n"
"over the baseline's table in one call with the GIL released: per batch what WVTrainer.step\n"
"does, in the same order with the same arithmetic (wv_merge_pool of its pool, one gather of\n"
"its keys and the pool's others, wv_train_batch with lr lrs[b] and the batch's train seed,\n"
"one scatter-add). samples: int64,\n"
"each batch's pool back to back (one key per position where negatives > 0). row_of: int32,\n"
"one per key of the run's key space (keys and samples below its length, which may not exceed\n"
"the rows'), all -1 (left so); iscratch: int64, 4 rows' worth of the largest batch (its keys\n"
"plus its pool); values, updates: float32, as many rows of width floats (wv_train_batch's).\n"
"losses: float64 per batch; counts: int64, per batch its pairs and the keys it gathered and\n"
"scatter-added.\n"
"\n"
"Batches [first, last) are checked before anything is written (ValueError naming the first\n"
"bad plan entry, key or sample; TypeError for a dtype, ValueError for a size, a layout or\n"
"shared memory). Returns the number of batches trained. Blocking; the GIL is released for the\n"
"run.\n"
"Thread-safe over one table on distinct scratch.");

PyDoc_STRVAR(wv_train_rows_doc,
"wv_train_rows(dim, negatives, sgd, batches, plan_rows, ends, keys, samples, lrs, store_rows,\n"
"              left_keys, left_rows, row_of, iscratch, values, updates, losses, counts,\n"
"              first=0, last=-1, width=2*dim) -> (batches, stop, left)\n"
"\n"
"wv_train_table over a node's store (store_rows: Store.rows(), rows of width floats).\n"
"Returns the batches trained and why it returned: stop 0, all of them; WV_STOP_PULL, the\n"
"next batch has keys not held here (nothing of it written: train it through the worker and\n"
"call again from the batch after it); WV_STOP_PUSH, the last batch trained had keys that left\n"
"between its gather and its scatter-add: their keys and updates are in left_keys and\n"
"left_rows (room for the largest batch's keys plus pool), `left` of them, for the caller to\n"
"push. Checks and errors as wv_train_table. Blocking; the GIL is released for the run.");

PyMethodDef wv_run_methods[] = {
    {"wv_plan_run", (PyCFunction)(void (*)(void))py_wv_plan_run, METH_VARARGS | METH_KEYWORDS,
     wv_plan_run_doc},
    {"wv_train_table", (PyCFunction)(void (*)(void))py_wv_train_table,
     METH_VARARGS | METH_KEYWORDS, wv_train_table_doc},
    {"wv_train_rows", (PyCFunction)(void (*)(void))py_wv_train_rows,
     METH_VARARGS | METH_KEYWORDS, wv_train_rows_doc},
    {NULL, NULL, 0, NULL},
};
