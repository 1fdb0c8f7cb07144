/* Buffer checks shared by the bindings of adapm._kernels (module.c, wv_module.c, mf_module.c,
 * kge_rows_module.c): each call takes C-contiguous views of its buffers, checks dtype
 * (TypeError), writability and overlap (ValueError) while holding the GIL, and releases them
 * together. The native loops' rows (a table, a store's capsule): rows_binding.h.
 */
#ifndef ADAPM_KERNELS_BINDING_H
#define ADAPM_KERNELS_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* ---- buffer views --------------------------------------------------------------------------- */

enum { F32, I64, I32, F64 };

/* The most buffers one call takes (mf_train_table: 13). */
#define VIEWS_MAX 16

/* The views of one call; released together by release_views. */
typedef struct {
    Py_buffer v[VIEWS_MAX];
    int n;
} views_t;

static inline void release_views(views_t *vs) {
    for (int i = 0; i < vs->n; i++) PyBuffer_Release(&vs->v[i]);
    vs->n = 0;
}

/* Whether the buffer holds float32 (F32) or int64 (I64) items in native byte order. */
static inline int has_type(const Py_buffer *v, int type) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || (*f == '<' && PY_LITTLE_ENDIAN) ||
        ((*f == '>' || *f == '!') && !PY_LITTLE_ENDIAN))
        f++;
    if (type == F32) return v->itemsize == 4 && !strcmp(f, "f");
    if (type == I32) return v->itemsize == 4 && (!strcmp(f, "i") || !strcmp(f, "l"));
    if (type == F64) return v->itemsize == 8 && !strcmp(f, "d");
    return v->itemsize == 8 && (!strcmp(f, "l") || !strcmp(f, "q"));
}

/* Takes a C-contiguous view of obj into vs. max_ndim 0: any number of dimensions (read flat).
 * Returns NULL with an exception set; the views taken so far stay in vs for release_views. */
static inline Py_buffer *take(views_t *vs, PyObject *obj, const char *fn, const char *name, int type,
                       int writable, int max_ndim) {
    if (vs->n == VIEWS_MAX) {
        PyErr_Format(PyExc_SystemError, "%s: more than %d buffers", fn, VIEWS_MAX);
        return NULL;
    }
    Py_buffer *v = &vs->v[vs->n];
    if (PyObject_GetBuffer(obj, v, PyBUF_RECORDS_RO) < 0) return NULL;
    vs->n++;
    if (!has_type(v, type)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be %s, got buffer format '%s' (itemsize %zd)",
                     fn, name, type == F32 ? "float32" : type == I32 ? "int32" : type == F64 ? "float64" : "int64", v->format ? v->format : "B",
                     v->itemsize);
        return NULL;
    }
    if (!PyBuffer_IsContiguous(v, 'C')) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be C-contiguous", fn, name);
        return NULL;
    }
    if (writable && v->readonly) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be writable", fn, name);
        return NULL;
    }
    if (max_ndim && v->ndim > max_ndim) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have at most %d dimension(s), got %d", fn,
                     name, max_ndim, v->ndim);
        return NULL;
    }
    return v;
}

static inline int64_t count(const Py_buffer *v) { return (int64_t)(v->len / v->itemsize); }

/* Whether the memory of a and b overlaps (compared as integers: they are distinct objects). */
static inline int overlap(const Py_buffer *a, const Py_buffer *b) {
    const uintptr_t a0 = (uintptr_t)a->buf, b0 = (uintptr_t)b->buf;
    return a->len > 0 && b->len > 0 && a0 < b0 + (uintptr_t)b->len &&
           b0 < a0 + (uintptr_t)a->len;
}

/* A buffer the kernel writes must share no memory with any other buffer of the call. */
static inline int check_no_overlap(views_t *vs, const Py_buffer *written, const char *fn,
                            const char *name) {
    for (int i = 0; i < vs->n; i++) {
        if (&vs->v[i] != written && overlap(&vs->v[i], written)) {
            PyErr_Format(PyExc_ValueError, "%s: %s shares memory with another argument", fn,
                         name);
            return -1;
        }
    }
    return 0;
}

/* Functions of wv_module.c, wv_run_module.c, mf_module.c, kge_rows_module.c and optim_module.c,
 * added to the module at init. */
extern PyMethodDef wv_methods[];
extern PyMethodDef mf_methods[];
extern PyMethodDef kge_rows_methods[];
extern PyMethodDef wv_run_methods[];
extern PyMethodDef optim_methods[];

#endif
