/* What the bindings of the native training loops (mf_module.c, kge_rows_module.c) take for the
 * rows they train: the baseline's table (three buffers) or a node's store (the capsule of
 * Store.rows()), both as a rows_t (rows.h). Checked with the GIL held, as binding.h's views.
 */
#ifndef ADAPM_KERNELS_ROWS_BINDING_H
#define ADAPM_KERNELS_ROWS_BINDING_H

#include "binding.h"
#include "rows.h"
#include "table.h"

/* The table's buffers (data float32; key_offset, key_len int64, one per key) into vs, as
 * *table and its *rows. 0, or -1 with an error set (the views taken stay in vs). */
static inline int take_table_rows(views_t *vs, PyObject *odata, PyObject *ooffset,
                                  PyObject *olen, const char *fn, table_t *table,
                                  rows_t *rows) {
    Py_buffer *data, *key_offset, *key_len;
    if (!(key_offset = take(vs, ooffset, fn, "key_offset", I64, 0, 1)) ||
        !(key_len = take(vs, olen, fn, "key_len", I64, 0, 1)) ||
        !(data = take(vs, odata, fn, "data", F32, 1, 0)))
        return -1;
    const int64_t nkeys = count(key_offset);
    if (count(key_len) != nkeys) {
        PyErr_Format(PyExc_ValueError, "%s: key_offset and key_len need one item per key (got "
                     "%lld and %lld)", fn, (long long)nkeys, (long long)count(key_len));
        return -1;
    }
    *table = (table_t){.data = data->buf, .data_floats = count(data),
                       .key_offset = key_offset->buf, .key_len = key_len->buf,
                       .num_keys = nkeys};
    *rows = table_rows(table);
    return 0;
}

/* A node's rows: the capsule of Store.rows() (`name` in the errors), of this build's layout.
 * NULL with an error set. */
static inline const rows_t *store_rows_any(PyObject *o, const char *fn, const char *name) {
    const rows_t *rows = PyCapsule_GetPointer(o, ROWS_CAPSULE);
    if (!rows) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a store's rows (Store.rows(): a capsule "
                     "named '%s')", fn, name, ROWS_CAPSULE);
        return NULL;
    }
    if (rows->abi != ROWS_ABI) {
        PyErr_Format(PyExc_TypeError, "%s: %s come from a build of adapm._native of another "
                     "layout (%d, this module reads %d): rebuild both", fn, name, rows->abi,
                     ROWS_ABI);
        return NULL;
    }
    return rows;
}

/* store_rows_any's rows, with rows of `width` floats (`what`, e.g. "2 * rank", in the error). */
static inline const rows_t *store_rows(PyObject *o, const char *fn, const char *name,
                                       int64_t width, const char *what) {
    const rows_t *rows = store_rows_any(o, fn, name);
    if (!rows) return NULL;
    if (rows->row_floats != width) {
        PyErr_Format(PyExc_ValueError, "%s: the store's rows are %lld floats, not %s = %lld", fn,
                     (long long)rows->row_floats, what, (long long)width);
        return NULL;
    }
    return rows;
}

#endif
