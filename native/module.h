/* What the binding files of adapm._native share: the Store object and buffer borrowing. */
#ifndef ADAPM_MODULE_H
#define ADAPM_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "store.h"

/* Short calls keep the GIL. Releasing it is cheap, but taking it back waits until the thread
 * that took it lets go, and on a busy machine that costs far more than the call: in
 * bench/adaptive.py (2 nodes on 2 cores) the engine thread's count_intents over ~5k keys took
 * ~0.27 ms of wall time per call, most of it waiting to get the GIL back after a ~10 us pass. So
 * a call releases the GIL only when it moves at least this many elements (keys plus floats,
 * ~10-20 us of work); the worker fast path (fast_call) always releases it, since that is where
 * the engine thread gets its turn. */
#define RELEASE_GIL_FROM 32768
#define NOGIL_BEGIN(work) { PyThreadState *_nogil_save = (work) >= RELEASE_GIL_FROM ? PyEval_SaveThread() : NULL;
#define NOGIL_END if (_nogil_save) PyEval_RestoreThread(_nogil_save); }

typedef struct {
    PyObject_HEAD
    store_t s;
    Py_buffer views[9]; /* slot, state, slab, delta, seqs, version, synced_at, access_stats, lens */
    int nviews;
} StoreObject;

/* Borrows a C-contiguous buffer of the given item size (writable or not); 0 on success. */
static inline int borrow(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable,
                  const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: item size must be %zd, got %zd", what, itemsize,
                     view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

extern PyTypeObject StoreType;

/* Adds the Directory type (directory_module.c) to the module; 0 on success. */
int register_directory_type(PyObject *module);

/* Adds the IntentQueue type (intent_queue_module.c) to the module; 0 on success. */
int register_intent_queue_type(PyObject *module);

#endif
