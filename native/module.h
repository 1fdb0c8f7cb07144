/* What the binding files of adapm._native share: the Store object (store_module.c), buffer
 * borrowing, and what each file adds to the module at init (native_module.c). */
#ifndef ADAPM_MODULE_H
#define ADAPM_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "check.h"
#include "slots.h"
#include "intents.h"
#include "sampling.h"
#include "store.h"
#include "sync_fast.h"

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

/* Batches at least this long release the GIL for a range check of their own; shorter ones are
 * checked while holding it: the vectorised pass takes ~0.25 ns a key (2.5 us for 10k keys on the
 * bench/store.py machine), so a short batch holds the GIL for less time than handing it over
 * and taking it back costs when another thread wants it. */
#define CHECK_RELEASES_GIL_FROM 16384

typedef struct {
    PyObject_HEAD
    store_t s;
    Py_buffer views[9]; /* home, slab, delta, seqs, access_stats, lens; the pool's three */
    int nviews;
    /* The keys held here beyond the home rows (held.h), a map per channel (store.h) */
    held_map_t held[STORE_MAX_SHARDS];
    int held_ready;     /* maps initialised */
    int64_t *home_off;  /* with per-key lengths: each home key's row */
    /* Where values go in the slab (slots.h): an allocator per channel, each in a region of its
     * own above the home rows. */
    slot_alloc_t alloc[STORE_MAX_SHARDS];
    int pool_lock;      /* store.h: pool_lock */
    int64_t *repeat_set; /* scratch of first_repeat (below) */
    int64_t repeat_cap;
} StoreObject;

/* Index of the first key of keys[0..n) (checked in range) that repeats an earlier one, -1 if
 * none, or -2 if out of memory. Batches that move keys in or out may come from the network, and
 * a repeated key would be removed or inserted twice (a slot handed out twice). Ascending batches
 * (a node's home keys) pass in one scan; others go through a hash set in the store's scratch
 * (sized by the batch, not the key space). Holds the GIL (the scratch is shared). */
static inline int64_t first_repeat(StoreObject *store, const int64_t *keys, int64_t n) {
    if (keys_ascend(keys, n)) return -1;
    const int64_t cap = repeat_set_cap(n);
    if (cap > store->repeat_cap) {
        int64_t *grown = PyMem_Realloc(store->repeat_set, (size_t)cap * sizeof(int64_t));
        if (!grown) return -2;
        store->repeat_set = grown;
        store->repeat_cap = cap;
    }
    return repeat_scan(store->repeat_set, cap, keys, n);
}

/* 0, or -1 with ValueError naming the first repeated key (MemoryError if out of memory). */
static inline int refuse_repeats(StoreObject *store, const int64_t *keys, int64_t n,
                                 const char *what) {
    const int64_t at = first_repeat(store, keys, n);
    if (at == -1) return 0;
    if (at == -2) {
        PyErr_NoMemory();
        return -1;
    }
    PyErr_Format(PyExc_ValueError, "%s: key %lld appears more than once", what,
                 (long long)keys[at]);
    return -1;
}

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

/* borrow for three buffers of 8-byte items at once (writable: a bit per buffer, 1 << i): all of
 * them, or none (those taken are released) and -1. */
static inline int borrow3(PyObject *const obj[3], Py_buffer view[3], int writable,
                          const char *const what[3]) {
    for (int i = 0; i < 3; i++)
        if (borrow(obj[i], &view[i], 8, (writable >> i) & 1, what[i]) < 0) {
            while (i--) PyBuffer_Release(&view[i]);
            return -1;
        }
    return 0;
}

/* The C interface of a numpy BitGenerator (its capsule "BitGenerator"), or NULL with TypeError
 * naming what. The caller holds the generator's lock while it draws (native_module.c). */
np_bitgen_t *np_bitgen_of(PyObject *obj, const char *what);

extern PyTypeObject StoreType;

/* Readies a static type and adds it to the module under name; 0 on success. */
static inline int add_type(PyObject *module, PyTypeObject *type, const char *name) {
    if (PyType_Ready(type) < 0) return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

/* Adds the Directory type (directory_module.c) to the module; 0 on success. */
int register_directory_type(PyObject *module);

/* Adds the wire format's encode and decode functions (wire_module.c) to the module; 0 on
 * success. */
int register_wire_functions(PyObject *module);

/* The codec of one wire message for other C files (zmq_io.c): wire_decode and wire_encode as
 * the module functions of those names. New references, NULL with an exception. */
PyObject *wire_decode_list(PyObject *buffers);
PyObject *wire_encode_list(PyObject *specs);

/* The owner's fast path (directory_module.c, for zmq_io.c): a peer's PULL, PUSH or SET served
 * without Python. Engine thread only (the checks' scratch), GIL held or not.
 * directory_owns_request: 1 if the arrays (wire_count(kind) of them) pass check_message and
 * every key is owned here; 0 if not (the Python path takes the message, and drops and counts
 * what it refuses); -1 out of memory. Then directory_request_floats: the floats of the keys'
 * rows (a PULL's answer); directory_serve_owned: a PULL's rows gathered into values (floats of
 * them), or a PUSH added / a SET written; the number of keys missing (0: only the engine thread
 * removes keys), or -1 if values is too small. missing: room for a[0].n positions. */
int directory_check(PyObject *o); /* whether o is a Directory */
int directory_owns_request(PyObject *directory, int kind, const carr_t *a);
int64_t directory_request_floats(PyObject *directory, const carr_t *a);
int64_t directory_serve_owned(PyObject *directory, int kind, const carr_t *a, float *values,
                              int64_t floats, int64_t *missing);

/* A peer's SYNC served without Python (sync_fast.c; sync_fast.h says which qualify), for
 * zmq_io.c. a: the message's arrays (narrays 10, or 22 with its moves), from origin. Returns
 * 1 if served (*out holds the answer: call directory_sync_sent once it is sent), 0 if Python is
 * to take the message (nothing changed), -1 if the node cannot go on (*fatal says why: out of
 * memory, or a broken invariant). Engine thread only, without the GIL. */
int directory_sync_fast(PyObject *directory, int64_t origin, const carr_t *a, int narrays,
                        sync_fast_answer_t *out, const char **fatal);
/* The answer directory_sync_fast made for origin was sent: the moves it carried are no longer
 * held. */
void directory_sync_sent(PyObject *directory, int64_t origin);

/* A SYNC_RESP from src to this node's round request req taken in without Python
 * (answer_fast.c says which qualify). a: its arrays (narrays 8, or 20 with its moves). Returns
 * 1 if taken, 0 if Python is to take the message (nothing changed), -1 if the node cannot go
 * on (*fatal says why). Engine thread only, without the GIL. */
int directory_answer_fast(PyObject *directory, int64_t src, int64_t req, const carr_t *a,
                          int narrays, const char **fatal);
/* Whether every round request registered with Directory.round_open has all its entries
 * answered (the round may end: what Python waits for while poll holds). Engine thread, without
 * the GIL. */
int directory_round_answered(PyObject *directory);

/* A worker's pull or push for the transport (zmq_calls.c, sync_fast.c), engine thread, without the GIL.
 * directory_route_pull: for keys[0..n) (not held here a moment ago) hop[i] = -1 if held here
 * now, else the rank to ask (Directory.route_own's choice); returns how many are held here, or
 * -1 if the pull must take the Python path (a key whose intent this node reported and whose
 * owner has not answered, one on its way here, a key out of range, or native work is off
 * while sinks listen). directory_gather_one: key's row (floats of it) into row; 0, or -1 if
 * it is not held here. directory_learn_native: rank answered for keys (Directory.learn); 0, or
 * -1 if out of memory. */
int64_t directory_route_pull(PyObject *directory, const int64_t *keys, int64_t n, int64_t *hop);
int directory_gather_one(PyObject *directory, int64_t key, float *row, int64_t floats);
/* directory_scatter_one: adds row (floats of it) to key's, for a worker's push (zmq_calls.c);
 * 0, or -1 if key is not held here. Engine thread, without the GIL. */
int directory_scatter_one(PyObject *directory, int64_t key, const float *row, int64_t floats);
int directory_learn_native(PyObject *directory, const int64_t *keys, int64_t n, int64_t rank);

/* Adds the ZmqIO and Frame types (zmq_io.c) to the module; 0 on success. */
int register_zmq_io_type(PyObject *module);

/* Adds the IntentQueue and IntentCounts types (intent_queue_module.c) to the module; 0 on
 * success. */
int register_intent_queue_type(PyObject *module);

/* A node's intent counts (intents.h), which the Directory's methods read and write. */
typedef struct {
    PyObject_HEAD
    intent_counts_t c;
    int64_t num_keys;
    int ready;
} IntentCountsObject;

extern PyTypeObject IntentCountsType;

/* A numpy view (the codec's dtype of role, a letter of check.c) of count items at byte offset
 * of buf; the shared empty array of role when count is 0 (wire_module.c; after wire_setup). */
PyObject *wire_view(PyObject *buf, char role, int64_t count, int64_t offset);

#endif
