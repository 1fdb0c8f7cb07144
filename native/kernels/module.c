/* CPython binding of the training kernels: module adapm._kernels.
 *
 * Each function takes its buffers through the buffer protocol, checks dtype (TypeError),
 * C-contiguity, writability, shapes and sizes (ValueError) while holding the GIL, then releases
 * the GIL around exactly one call into kge.c / table.c. That call checks every index before it
 * writes anything, so a rejected call leaves all buffers as they were.
 * The buffers stay owned by the caller; nothing is kept after a call returns.
 */
#include "binding.h"
#include "kge.h"
#include "kge_rows.h"
#include "mf.h"
#include "table.h"
#include "wv.h"
#include "wv_run.h"

/* ---- KGE ------------------------------------------------------------------------------------ */

static PyObject *py_kge_widths(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"model", "dim", NULL};
    int model;
    long long dim;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iL", kwlist, &model, &dim)) return NULL;
    int64_t we, wr;
    if (kge_widths(model, dim, &we, &wr) < 0)
        return PyErr_Format(PyExc_ValueError,
                            "kge_widths: unknown model %d or dim %lld outside [1, %lld]", model,
                            dim, (long long)KGE_MAX_DIM);
    return Py_BuildValue("(LL)", (long long)we, (long long)wr);
}

static const char *fault_name(int where) {
    switch (where) {
    case KGE_AT_HEAD: return "triples[%lld, 0] (head)";
    case KGE_AT_RELATION: return "triples[%lld, 1] (relation)";
    case KGE_AT_TAIL: return "triples[%lld, 2] (tail)";
    case KGE_AT_NEG_HEAD: return "neg_heads[%lld]";
    default: return "neg_tails[%lld]";
    }
}

static void raise_fault(const kge_batch_t *b, const kge_fault_t *f) {
    char where[64];
    PyOS_snprintf(where, sizeof where, fault_name(f->where), (long long)f->position);
    if (!f->bad_offset) {
        PyErr_Format(PyExc_ValueError,
                     "kge_train_batch: %s = %lld is outside [0, %lld) (the length of offsets)",
                     where, (long long)f->row, (long long)b->num_rows);
        return;
    }
    int64_t we, wr;
    kge_widths(b->model, b->dim, &we, &wr);
    const int64_t width = f->where == KGE_AT_RELATION ? wr : we;
    PyErr_Format(PyExc_ValueError,
                 "kge_train_batch: %s = %lld: offsets[%lld] = %lld does not place its row of "
                 "%lld floats (embedding and accumulator) inside values (%lld floats)",
                 where, (long long)f->row, (long long)f->row, (long long)b->offsets[f->row],
                 (long long)(2 * width), (long long)b->num_values);
}

static PyObject *py_kge_train_batch(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "kge_train_batch";
    static char *kwlist[] = {"model", "dim", "values", "offsets", "triples", "neg_heads",
                             "neg_tails", "updates", "lr", "reg_entity", "reg_relation", NULL};
    int model;
    long long dim;
    PyObject *ovalues, *ooffsets, *otriples, *oneg_heads, *oneg_tails, *oupdates;
    double lr, reg_entity, reg_relation;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iLOOOOOOddd", kwlist, &model, &dim,
                                     &ovalues, &ooffsets, &otriples, &oneg_heads, &oneg_tails,
                                     &oupdates, &lr, &reg_entity, &reg_relation))
        return NULL;
    int64_t we, wr;
    if (kge_widths(model, dim, &we, &wr) < 0)
        return PyErr_Format(PyExc_ValueError, "%s: unknown model %d or dim %lld outside [1, %lld]",
                            fn, model, dim, (long long)KGE_MAX_DIM);

    views_t vs = {.n = 0};
    Py_buffer *values, *offsets, *triples, *neg_heads, *neg_tails, *updates;
    if (!(values = take(&vs, ovalues, fn, "values", F32, 1, 1)) ||
        !(offsets = take(&vs, ooffsets, fn, "offsets", I64, 0, 1)) ||
        !(triples = take(&vs, otriples, fn, "triples", I64, 0, 2)) ||
        !(neg_heads = take(&vs, oneg_heads, fn, "neg_heads", I64, 0, 0)) ||
        !(neg_tails = take(&vs, oneg_tails, fn, "neg_tails", I64, 0, 0)) ||
        !(updates = take(&vs, oupdates, fn, "updates", F32, 1, 1)))
        goto fail;

    const int64_t nvalues = count(values), ntriple_items = count(triples);
    const int64_t nneg = count(neg_heads);
    if (count(updates) != nvalues) {
        PyErr_Format(PyExc_ValueError, "%s: updates has %lld floats, values %lld", fn,
                     (long long)count(updates), (long long)nvalues);
        goto fail;
    }
    if ((triples->ndim == 2 && triples->shape[1] != 3) || ntriple_items % 3) {
        PyErr_Format(PyExc_ValueError, "%s: triples must have shape (B, 3) or length 3 * B", fn);
        goto fail;
    }
    const int64_t ntriples = ntriple_items / 3;
    if (count(neg_tails) != nneg) {
        PyErr_Format(PyExc_ValueError, "%s: neg_heads has %lld items, neg_tails %lld", fn,
                     (long long)nneg, (long long)count(neg_tails));
        goto fail;
    }
    if (ntriples ? nneg % ntriples != 0 : nneg != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s: len(neg_heads) = %lld is not a multiple of the number of triples %lld",
                     fn, (long long)nneg, (long long)ntriples);
        goto fail;
    }
    if (check_no_overlap(&vs, values, fn, "values") < 0 ||
        check_no_overlap(&vs, updates, fn, "updates") < 0)
        goto fail;

    const kge_batch_t batch = {
        .model = model,
        .dim = dim,
        .values = values->buf,
        .num_values = nvalues,
        .offsets = offsets->buf,
        .num_rows = count(offsets),
        .triples = triples->buf,
        .num_triples = ntriples,
        .neg_heads = neg_heads->buf,
        .neg_tails = neg_tails->buf,
        .negs_per_side = ntriples ? nneg / ntriples : 0,
        .updates = updates->buf,
        .lr = (float)lr,
        .reg_entity = (float)reg_entity,
        .reg_relation = (float)reg_relation,
    };
    double bce, reg;
    kge_fault_t fault;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kge_train_batch(&batch, &bce, &reg, &fault);
    Py_END_ALLOW_THREADS
    if (rc == KGE_BAD_ROW) {
        raise_fault(&batch, &fault);
        goto fail;
    }
    if (rc == KGE_NO_MEMORY) {
        PyErr_NoMemory();
        goto fail;
    }
    release_views(&vs);
    return Py_BuildValue("(dd)", bce, reg);
fail:
    release_views(&vs);
    return NULL;
}

/* ---- plain shared array table ---------------------------------------------------------------- */

/* Shared by table_gather (scatter 0) and table_scatter_add (scatter 1). */
static PyObject *table_op(PyObject *args, PyObject *kwargs, int scatter) {
    const char *fn = scatter ? "table_scatter_add" : "table_gather";
    const char *rows_name = scatter ? "upd" : "out";
    static char *kw_gather[] = {"data", "key_offset", "key_len", "keys", "out", NULL};
    static char *kw_scatter[] = {"data", "key_offset", "key_len", "keys", "upd", NULL};
    PyObject *odata, *ooffset, *olen, *okeys, *orows;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO", scatter ? kw_scatter : kw_gather,
                                     &odata, &ooffset, &olen, &okeys, &orows))
        return NULL;
    views_t vs = {.n = 0};
    Py_buffer *data, *key_offset, *key_len, *keys, *rows;
    if (!(data = take(&vs, odata, fn, "data", F32, scatter, 0)) ||
        !(key_offset = take(&vs, ooffset, fn, "key_offset", I64, 0, 1)) ||
        !(key_len = take(&vs, olen, fn, "key_len", I64, 0, 1)) ||
        !(keys = take(&vs, okeys, fn, "keys", I64, 0, 0)) ||
        !(rows = take(&vs, orows, fn, rows_name, F32, !scatter, 0)))
        goto fail;
    if (count(key_offset) != count(key_len)) {
        PyErr_Format(PyExc_ValueError, "%s: key_offset has %lld items, key_len %lld", fn,
                     (long long)count(key_offset), (long long)count(key_len));
        goto fail;
    }
    if (check_no_overlap(&vs, scatter ? data : rows, fn, scatter ? "data" : rows_name) < 0)
        goto fail;

    const table_t t = {
        .data = data->buf,
        .data_floats = count(data),
        .key_offset = key_offset->buf,
        .key_len = key_len->buf,
        .num_keys = count(key_offset),
    };
    const int64_t *k = keys->buf;
    const int64_t n = count(keys), nrows = count(rows);
    int64_t bad;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (scatter) rc = table_scatter_add(&t, k, n, rows->buf, nrows, &bad);
    else rc = table_gather(&t, k, n, rows->buf, nrows, &bad);
    Py_END_ALLOW_THREADS
    switch (rc) {
    case TABLE_OK:
        release_views(&vs);
        Py_RETURN_NONE;
    case TABLE_KEY_RANGE:
        PyErr_Format(PyExc_ValueError, "%s: keys[%lld] = %lld is outside [0, %lld)", fn,
                     (long long)bad, (long long)k[bad], (long long)t.num_keys);
        break;
    case TABLE_ROW_OUTSIDE:
        PyErr_Format(PyExc_ValueError,
                     "%s: keys[%lld] = %lld: its row (key_offset %lld, key_len %lld) is not "
                     "inside data (%lld floats)",
                     fn, (long long)bad, (long long)k[bad], (long long)t.key_offset[k[bad]],
                     (long long)t.key_len[k[bad]], (long long)t.data_floats);
        break;
    default:
        PyErr_Format(PyExc_ValueError,
                     "%s: %s has %lld floats, which is not the total length of the rows of keys",
                     fn, rows_name, (long long)nrows);
        break;
    }
fail:
    release_views(&vs);
    return NULL;
}

static PyObject *py_table_gather(PyObject *module, PyObject *args, PyObject *kwargs) {
    return table_op(args, kwargs, 0);
}

static PyObject *py_table_scatter_add(PyObject *module, PyObject *args, PyObject *kwargs) {
    return table_op(args, kwargs, 1);
}

/* ---- module --------------------------------------------------------------------------------- */

PyDoc_STRVAR(kge_widths_doc,
"kge_widths(model, dim) -> (entity_width, relation_width)\n"
"\n"
"Floats in the embedding part of an entity row and of a relation row (each row holds that\n"
"many floats of embedding followed by as many of AdaGrad accumulator). MODEL_COMPLEX: (2*dim,\n"
"2*dim); MODEL_DISTMULT: (dim, dim); MODEL_RESCAL: (dim, dim*dim). ValueError for an unknown\n"
"model or dim outside [1, 2**20].");

PyDoc_STRVAR(kge_train_batch_doc,
"kge_train_batch(model, dim, values, offsets, triples, neg_heads, neg_tails, updates, lr,\n"
"                reg_entity, reg_relation) -> (bce_loss_sum, reg_loss_sum)\n"
"\n"
"Trains one batch of a KGE model in place, sample by sample with AdaGrad (per-example SGD, as\n"
"the AdaPM KGE app does per data point).\n"
"\n"
"values: float32, 1-d, writable: the rows of the batch's unique keys; an entity row is\n"
"[embedding | accumulator] of entity_width floats each, a relation row likewise with\n"
"relation_width (see kge_widths). offsets: int64, 1-d: float offset of unique row i in values.\n"
"triples: int64 (B, 3) or 3*B: (head, relation, tail) as indices into offsets. neg_heads,\n"
"neg_tails: int64, B*K each (K >= 0 negatives per side, K = len(neg_heads) // B): entity row\n"
"indices. updates: float32, len(values), writable, not overlapping values: zeroed, then receives\n"
"every change made to values (embedding and accumulator deltas), so values_before + updates ==\n"
"values_after up to float rounding.\n"
"\n"
"For each positive i in order: step(h, r, t, 1), then for j < K: step(h, r, neg_tails[i*K+j],\n"
"0) and step(neg_heads[i*K+j], r, t, 0). A step scores f(E_s, R_r, E_o), adds -log sigmoid(\n"
"+-score) to the BCE sum, and takes gradients (sigmoid(score) - label) * df for the three rows,\n"
"all from the values before the step; a positive also adds reg * row to each gradient and\n"
"reg * |row|^2 to the regularisation sum. AdaGrad then updates rows s, r, o in this order:\n"
"acc += g^2; emb -= lr * g / sqrt(acc) (elements whose accumulator stays 0 are left alone).\n"
"A row used twice in a step (s == o) is updated twice, in sequence. lr and the reg weights are\n"
"used as float32.\n"
"\n"
"Every index is checked (in range of offsets, row inside values) before anything is written:\n"
"TypeError for a wrong dtype, ValueError for a wrong shape, size, index or offset, MemoryError\n"
"if the step scratch cannot be allocated; values and updates are untouched then.\n"
"Blocking; the GIL is released for the whole computation. The buffers remain the caller's;\n"
"nothing is kept. Thread-safe for calls on distinct buffers (the same values from two threads\n"
"at once races).");

PyDoc_STRVAR(table_gather_doc,
"table_gather(data, key_offset, key_len, keys, out) -> None\n"
"\n"
"Copies the rows data[key_offset[k] : key_offset[k] + key_len[k]] of each k in keys into out,\n"
"back to back in request order. data, out: float32 (any shape, taken flat; out writable and not\n"
"overlapping the other arguments); key_offset, key_len: int64, one item per key; keys: int64.\n"
"len(out) must equal the sum of key_len[keys]. Every key is checked to be in [0, num_keys) and\n"
"its row to lie inside data before anything is copied (ValueError otherwise, TypeError for a\n"
"wrong dtype; out untouched then). Blocking; the GIL is released for the check and the copy.\n"
"No locks: a row being written by another thread at the same time may be read half-updated\n"
"(Hogwild style plain shared array).");

PyDoc_STRVAR(table_scatter_add_doc,
"table_scatter_add(data, key_offset, key_len, keys, upd) -> None\n"
"\n"
"Adds upd, the rows of keys packed back to back, to data[key_offset[k] : ... + key_len[k]] for\n"
"each k in keys; duplicate keys add up. Same layout, checks and errors as table_gather (data is\n"
"the writable one; len(upd) must equal the sum of key_len[keys]); nothing is added when a check\n"
"fails. Blocking; the GIL is released for the check and the adds. Adds to one row are\n"
"serialised by striped spinlocks, so concurrent adds from several threads are never lost.");

static PyMethodDef module_methods[] = {
    {"kge_widths", (PyCFunction)(void (*)(void))py_kge_widths, METH_VARARGS | METH_KEYWORDS,
     kge_widths_doc},
    {"kge_train_batch", (PyCFunction)(void (*)(void))py_kge_train_batch,
     METH_VARARGS | METH_KEYWORDS, kge_train_batch_doc},
    {"table_gather", (PyCFunction)(void (*)(void))py_table_gather, METH_VARARGS | METH_KEYWORDS,
     table_gather_doc},
    {"table_scatter_add", (PyCFunction)(void (*)(void))py_table_scatter_add,
     METH_VARARGS | METH_KEYWORDS, table_scatter_add_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "Training kernels of adapm's apps: the KGE, word-vector and matrix-factorisation batch\n"
    "trainers, the apps' data parsers, the plain shared array table ops of the\n"
    "single-node baseline, and the row updates of adapm.torch's optimizers (see\n"
    "native/kernels/ in the source tree).",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    wv_init_tables();
    if (PyModule_AddFunctions(m, wv_methods) < 0 || PyModule_AddFunctions(m, mf_methods) < 0 ||
        PyModule_AddFunctions(m, kge_rows_methods) < 0 ||
        PyModule_AddFunctions(m, wv_run_methods) < 0 ||
        PyModule_AddFunctions(m, optim_methods) < 0 ||
        PyModule_AddIntConstant(m, "MODEL_COMPLEX", KGE_COMPLEX) < 0 ||
        PyModule_AddIntConstant(m, "MODEL_DISTMULT", KGE_DISTMULT) < 0 ||
        PyModule_AddIntConstant(m, "MODEL_RESCAL", KGE_RESCAL) < 0 ||
        PyModule_AddIntConstant(m, "MF_STOP_PULL", MF_STOP_PULL) < 0 ||
        PyModule_AddIntConstant(m, "MF_STOP_PUSH", MF_STOP_PUSH) < 0 ||
        PyModule_AddIntConstant(m, "KGE_STOP_PULL", KGE_STOP_PULL) < 0 ||
        PyModule_AddIntConstant(m, "KGE_STOP_PUSH", KGE_STOP_PUSH) < 0 ||
        PyModule_AddIntConstant(m, "WV_STOP_PULL", WV_RUN_STOP_PULL) < 0 ||
        PyModule_AddIntConstant(m, "WV_STOP_PUSH", WV_RUN_STOP_PUSH) < 0 ||
        PyModule_AddIntConstant(m, "WV_BATCH_COLUMNS", WV_B_COLS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
