/* CPython binding of kge_rows.c: a run of KGE batches over the baseline's table
 * (kge_train_table) or a node's store (kge_train_rows). Conventions as module.c: every buffer
 * checked while holding the GIL, the configuration parsed once per call, one call into
 * kge_rows.c with the GIL released, nothing written when a check fails, the buffers stay the
 * caller's.
 */
#include "rows_binding.h"
#include "kge.h"
#include "kge_rows.h"

/* Largest negatives per side accepted: keeps every size below far from int64 overflow. */
#define KGE_RUN_MAX_NEG ((int64_t)1 << 20)

/* rows_missing lets the GIL go from this many keys on (a look-up is ~10-20 ns). */
#define MISSING_RELEASES_GIL_FROM 32768

/* What both runs share: the scalars, points and samples before the rows' arguments, the
 * scratch and outputs after them, their checks, and the error of a failed run. The rows'
 * buffers (a table's) and outputs (left_keys, left_rows) are taken by take_rows. */
typedef struct {
    const char *fn;
    int model;
    long long dim, batch_size, neg, num_entities;
    double lr, reg_entity, reg_relation;
    views_t vs;
    Py_buffer *points, *samples;
    double *losses;
    int64_t *keys;
    int64_t n, batches, width, max_rows;
    kge_run_t run; /* run.rows (and left_*) set by take_rows */
} run_args_t;

/* Both runs' arguments: 8 scalars, then 10 objects into o, by the caller's keyword names.
 * 0 with an error set. */
static int parse_run(PyObject *args, PyObject *kwargs, char **kwlist, run_args_t *a,
                     PyObject **o) {
    return PyArg_ParseTupleAndKeywords(args, kwargs, "iLdddLLLOOOOOOOOOO", kwlist, &a->model,
                                       &a->dim, &a->lr, &a->reg_entity, &a->reg_relation,
                                       &a->batch_size, &a->neg, &a->num_entities, &o[0], &o[1],
                                       &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9]);
}

/* The scalars' checks: a uniform model, sizes that cannot overflow. 0, or -1 with an error. */
static int check_scalars(run_args_t *a) {
    const char *fn = a->fn;
    int64_t we, wr;
    if (kge_widths(a->model, a->dim, &we, &wr) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: unknown model %d or dim %lld outside [1, %lld]", fn,
                     a->model, a->dim, (long long)KGE_MAX_DIM);
        return -1;
    }
    if (we != wr) {
        PyErr_Format(PyExc_ValueError, "%s: model %d has relation rows of %lld floats and entity "
                     "rows of %lld (RESCAL): keys of two lengths, train its batches with "
                     "kge_train_batch", fn, a->model, (long long)wr, (long long)we);
        return -1;
    }
    if (a->neg < 0 || a->neg > KGE_RUN_MAX_NEG) {
        PyErr_Format(PyExc_ValueError, "%s: neg %lld outside [0, %lld]", fn, a->neg,
                     (long long)KGE_RUN_MAX_NEG);
        return -1;
    }
    a->width = 2 * we;
    const int64_t per_triple = KGE_RUN_ROWS_PER_TRIPLE(a->neg);
    /* unique_inverse takes fewer than 2^31 keys (3 a triple); the float scratch's size must
     * fit an int64 */
    if (a->batch_size < 1 || a->batch_size > INT32_MAX / 4 ||
        a->batch_size > INT64_MAX / 8 / per_triple / a->width) {
        PyErr_Format(PyExc_ValueError, "%s: batch_size %lld must be positive (and not absurdly "
                     "large)", fn, a->batch_size);
        return -1;
    }
    a->max_rows = per_triple * a->batch_size;
    if (a->num_entities < 0) {
        PyErr_Format(PyExc_ValueError, "%s: num_entities %lld is negative", fn,
                     a->num_entities);
        return -1;
    }
    return 0;
}

/* o: points, samples, then 3 objects for take_rows (which takes the rows' buffers and sets
 * run.rows), then iscratch, values, updates, losses, keys. 0, or -1 with an error (the caller
 * releases the views). */
static int take_run(run_args_t *a, PyObject **o, int (*take_rows)(run_args_t *, PyObject **)) {
    const char *fn = a->fn;
    if (check_scalars(a) < 0) return -1;
    views_t *vs = &a->vs;
    Py_buffer *iscratch, *values, *updates, *losses, *keys;
    if (!(a->points = take(vs, o[0], fn, "points", I64, 0, 2)) ||
        !(a->samples = take(vs, o[1], fn, "samples", I64, 0, 1)))
        return -1;
    const int first_written = vs->n;
    if (take_rows(a, o + 2) < 0 ||
        !(iscratch = take(vs, o[5], fn, "iscratch", I64, 1, 1)) ||
        !(values = take(vs, o[6], fn, "values", F32, 1, 0)) ||
        !(updates = take(vs, o[7], fn, "updates", F32, 1, 0)) ||
        !(losses = take(vs, o[8], fn, "losses", F64, 1, 1)) ||
        !(keys = take(vs, o[9], fn, "keys", I64, 1, 1)))
        return -1;
    for (int i = first_written; i < vs->n; i++) /* the written buffers: the rows' onwards */
        if (check_no_overlap(vs, &vs->v[i], fn, "an output") < 0) return -1;
    const Py_buffer *p = a->points;
    if ((p->ndim == 2 && p->shape[1] != 3) || count(p) % 3) {
        PyErr_Format(PyExc_ValueError, "%s: points must have shape (n, 3) or length 3 * n", fn);
        return -1;
    }
    a->n = count(p) / 3;
    if (a->n > INT64_MAX / 2 / (a->neg ? a->neg : 1) || count(a->samples) != 2 * a->neg * a->n) {
        PyErr_Format(PyExc_ValueError, "%s: samples needs 2 * neg = %lld keys per point, %lld "
                     "(got %lld)", fn, 2 * a->neg, (long long)(2 * a->neg * a->n),
                     (long long)count(a->samples));
        return -1;
    }
    const int64_t num_keys = a->run.rows->num_keys;
    if (a->num_entities > num_keys) {
        PyErr_Format(PyExc_ValueError, "%s: num_entities %lld is more than the rows' %lld keys",
                     fn, a->num_entities, (long long)num_keys);
        return -1;
    }
    const int64_t floats = a->max_rows * a->width;
    if (count(iscratch) < KGE_RUN_INT_REGIONS * a->max_rows || count(values) < floats ||
        count(updates) < floats) {
        PyErr_Format(PyExc_ValueError, "%s: iscratch needs %d * (3 + 2 * neg) * batch_size = "
                     "%lld items, values and updates (3 + 2 * neg) * batch_size rows of %lld "
                     "floats (%lld) each", fn, KGE_RUN_INT_REGIONS,
                     (long long)(KGE_RUN_INT_REGIONS * a->max_rows), (long long)a->width,
                     (long long)floats);
        return -1;
    }
    a->batches = (a->n + a->batch_size - 1) / a->batch_size;
    if (count(losses) < a->batches || count(keys) < a->batches) {
        PyErr_Format(PyExc_ValueError, "%s: losses and keys need one item per batch, %lld", fn,
                     (long long)a->batches);
        return -1;
    }
    a->losses = losses->buf;
    a->keys = keys->buf;
    a->run = (kge_run_t){
        .model = a->model, .dim = a->dim, .lr = (float)a->lr,
        .reg_entity = (float)a->reg_entity, .reg_relation = (float)a->reg_relation,
        .num_entities = a->num_entities, .negs_per_side = a->neg, .batch_size = a->batch_size,
        .rows = a->run.rows, .iscratch = iscratch->buf, .values = values->buf,
        .updates = updates->buf, .left_keys = a->run.left_keys, .left_rows = a->run.left_rows};
    return 0;
}

/* kge_train_rows with the GIL released: the batches trained, or -1 with the error set (what:
 * the rows' failure in words). */
static int64_t train(run_args_t *a, const char *what, int *stop, int64_t *left) {
    int64_t rc, at = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = kge_train_rows(&a->run, a->points->buf, a->n, a->samples->buf, a->losses, a->keys,
                        stop, left, &at);
    Py_END_ALLOW_THREADS
    if (rc >= 0) return rc;
    const int64_t *p = a->points->buf;
    switch (rc) {
    case KGE_RUN_BAD_POINT:
        PyErr_Format(PyExc_ValueError, "%s: points[%lld] = (%lld, %lld, %lld) names an entity "
                     "outside [0, %lld) or a relation outside [0, %lld) (nothing trained)",
                     a->fn, (long long)at, (long long)p[3 * at], (long long)p[3 * at + 1],
                     (long long)p[3 * at + 2], a->num_entities,
                     (long long)(a->run.rows->num_keys - a->num_entities));
        break;
    case KGE_RUN_BAD_SAMPLE:
        PyErr_Format(PyExc_ValueError, "%s: samples[%lld] = %lld is not an entity key, in "
                     "[0, %lld) (nothing trained)", a->fn, (long long)at,
                     (long long)((const int64_t *)a->samples->buf)[at], a->num_entities);
        break;
    case KGE_RUN_NO_MEMORY:
        PyErr_Format(PyExc_MemoryError, "%s: batch %lld: out of memory (the batches before it "
                     "were trained)", a->fn, (long long)at);
        break;
    default:
        PyErr_Format(PyExc_ValueError, "%s: batch %lld: %s (the batches before it were "
                     "trained)", a->fn, (long long)at, what);
        break;
    }
    return -1;
}

/* The table's buffers: data, key_offset, key_len. */
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

static PyObject *py_kge_train_table(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"model", "dim", "lr", "reg_entity", "reg_relation", "batch_size",
                             "neg", "num_entities", "points", "samples", "data", "key_offset",
                             "key_len", "iscratch", "values", "updates", "losses", "keys",
                             NULL};
    table_run_t t = {.a = {.fn = "kge_train_table", .vs = {.n = 0}}};
    run_args_t *a = &t.a;
    PyObject *o[10];
    if (!parse_run(args, kwargs, kwlist, a, o)) return NULL;
    if (take_run(a, o, take_table) < 0) goto fail;
    int64_t left;
    int stop;
    const int64_t rc = train(a, "a key's row (key_offset, key_len) is not inside data, or is "
                                "not 2 * entity_width floats", &stop, &left);
    if (rc < 0) goto fail;
    release_views(&a->vs);
    return PyLong_FromLongLong(rc);
fail:
    release_views(&a->vs);
    return NULL;
}

/* A node's rows: the capsule of Store.rows() (rows.h), then left_keys and left_rows. */
static int take_store(run_args_t *a, PyObject **o) {
    const rows_t *rows = store_rows(o[0], a->fn, "store_rows", a->width, "2 * entity_width");
    if (!rows) return -1;
    Py_buffer *left_keys, *left_rows;
    if (!(left_keys = take(&a->vs, o[1], a->fn, "left_keys", I64, 1, 1)) ||
        !(left_rows = take(&a->vs, o[2], a->fn, "left_rows", F32, 1, 0)))
        return -1;
    if (count(left_keys) < a->max_rows || count(left_rows) < a->max_rows * a->width) {
        PyErr_Format(PyExc_ValueError, "%s: left_keys needs (3 + 2 * neg) * batch_size = %lld "
                     "items, left_rows as many rows of %lld floats", a->fn,
                     (long long)a->max_rows, (long long)a->width);
        return -1;
    }
    a->run.rows = rows;
    a->run.left_keys = left_keys->buf;
    a->run.left_rows = left_rows->buf;
    return 0;
}

static PyObject *py_kge_train_rows(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"model", "dim", "lr", "reg_entity", "reg_relation", "batch_size",
                             "neg", "num_entities", "points", "samples", "store_rows",
                             "left_keys", "left_rows", "iscratch", "values", "updates",
                             "losses", "keys", NULL};
    run_args_t args_ = {.fn = "kge_train_rows", .vs = {.n = 0}}, *a = &args_;
    PyObject *o[10];
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

PyDoc_STRVAR(kge_train_table_doc,
"kge_train_table(model, dim, lr, reg_entity, reg_relation, batch_size, neg, num_entities,\n"
"                points, samples, data, key_offset, key_len, iscratch, values, updates,\n"
"                losses, keys) -> batches\n"
"\n"
"Trains a run of KGE batches over the baseline's table in one call with the GIL released:\n"
"per batch what KGETrainer.plan and step do (its distinct keys by unique_inverse, a gather of\n"
"[keys | sample], kge_train_batch, a scatter-add of the updates), in the same order with the\n"
"same arithmetic. model: MODEL_COMPLEX or MODEL_DISTMULT (uniform rows; RESCAL: ValueError).\n"
"points: int64 (n, 3) or 3 * n, (head, relation, tail) ids (relation r is key num_entities +\n"
"r); batch b is points[b * batch_size, ...), the last maybe shorter. samples: int64, 2 * neg\n"
"entity keys per point, each batch's back to back (its corrupted tails, then its corrupted\n"
"heads). data, key_offset, key_len: the table (table_gather's); every key's row must be\n"
"2 * entity_width floats. Scratch: iscratch, int64, 6 * (3 + 2 * neg) * batch_size items;\n"
"values and updates, float32, (3 + 2 * neg) * batch_size rows of 2 * entity_width floats\n"
"each. losses: float64, one per batch (BCE plus L2, as kge_train_batch's two sums added);\n"
"keys: int64, one per batch (keys gathered and scatter-added: distinct keys plus sample).\n"
"\n"
"Every point and sample key is checked before anything is written (ValueError naming the\n"
"first bad one; TypeError for a dtype, ValueError for a size, a layout or shared memory).\n"
"Returns the number of batches. Blocking; the GIL is released for the run. Thread-safe over\n"
"one table on distinct scratch (adds to a row are serialised, reads are Hogwild).");

PyDoc_STRVAR(kge_train_rows_doc,
"kge_train_rows(model, dim, lr, reg_entity, reg_relation, batch_size, neg, num_entities,\n"
"               points, samples, store_rows, left_keys, left_rows, iscratch, values,\n"
"               updates, losses, keys) -> (batches, stop, left)\n"
"\n"
"kge_train_table over a node's store instead of a table: store_rows is Store.rows() (a\n"
"capsule; rows of 2 * entity_width floats), through which each batch is gathered and its\n"
"updates added without the GIL. Returns the batches trained and why it returned: stop 0, all\n"
"of them; KGE_STOP_PULL, the next batch has keys not held here (nothing of it written: train\n"
"it through the worker, with its sample as drawn, and call again from the batch after it);\n"
"KGE_STOP_PUSH, the last batch trained had keys that left between its gather and its\n"
"scatter-add: their keys and updates are in left_keys and left_rows (int64 and float32, room\n"
"for (3 + 2 * neg) * batch_size keys and rows), `left` of them, for the caller to push.\n"
"Checks and errors as kge_train_table. Blocking; the GIL is released for the run.");

static PyObject *py_rows_missing(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "rows_missing";
    static char *kwlist[] = {"store_rows", "keys", "missing", NULL};
    PyObject *orows, *okeys, *omissing;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO", kwlist, &orows, &okeys, &omissing))
        return NULL;
    const rows_t *rows = store_rows_any(orows, fn, "store_rows");
    if (!rows) return NULL;
    views_t vs = {.n = 0};
    Py_buffer *keys, *missing;
    if (!(keys = take(&vs, okeys, fn, "keys", I64, 0, 1)) ||
        !(missing = take(&vs, omissing, fn, "missing", I64, 1, 1)) ||
        check_no_overlap(&vs, missing, fn, "missing") < 0)
        goto fail;
    if (count(missing) < count(keys)) {
        PyErr_Format(PyExc_ValueError, "%s: missing needs room for %lld positions", fn,
                     (long long)count(keys));
        goto fail;
    }
    int64_t n;
    if (count(keys) < MISSING_RELEASES_GIL_FROM) {
        /* A run's keys (KGE: 3 a triple, a few hundred) take ~10 us: letting the GIL go and
         * taking it back from the engine thread cost ~120 us a call on 2 nodes. Nothing here
         * waits for another thread (a store's look-ups take no lock: store.h). */
        n = rows->missing(rows->ctx, keys->buf, count(keys), missing->buf);
    } else {
        Py_BEGIN_ALLOW_THREADS
        n = rows->missing(rows->ctx, keys->buf, count(keys), missing->buf);
        Py_END_ALLOW_THREADS
    }
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "%s: a key lies outside [0, %lld)", fn,
                     (long long)rows->num_keys);
        goto fail;
    }
    release_views(&vs);
    return PyLong_FromLongLong(n);
fail:
    release_views(&vs);
    return NULL;
}

PyDoc_STRVAR(rows_missing_doc,
"rows_missing(store_rows, keys, missing) -> count\n"
"\n"
"Which of keys (int64) a node's store (store_rows: Store.rows()) does not hold now: their\n"
"positions go to missing (int64, room for len(keys)), and their number is returned. Nothing\n"
"is read or written: a snapshot, for a native loop's caller that wants its keys here before\n"
"it draws and pins anything. ValueError for a key outside the store's keys. The GIL is\n"
"released; any thread.");

PyMethodDef kge_rows_methods[] = {
    {"rows_missing", (PyCFunction)(void (*)(void))py_rows_missing, METH_VARARGS | METH_KEYWORDS,
     rows_missing_doc},
    {"kge_train_table", (PyCFunction)(void (*)(void))py_kge_train_table,
     METH_VARARGS | METH_KEYWORDS, kge_train_table_doc},
    {"kge_train_rows", (PyCFunction)(void (*)(void))py_kge_train_rows,
     METH_VARARGS | METH_KEYWORDS, kge_train_rows_doc},
    {NULL, NULL, 0, NULL},
};
