/* CPython binding of the store primitives: the Store type of module adapm._native (the module
 * itself, its free functions and its init are native_module.c's).
 *
 * A Store object keeps buffer views of the numpy arrays that make up a node's store (so they stay
 * alive and their pointers stay valid) and exposes one method per batch operation. Each method
 * parses its batch buffers, releases the GIL, and makes exactly one call into store.c.
 * dtypes and contiguity are checked by the Python wrapper (adapm/_store.py); here we check sizes
 * so that no call can read or write outside a buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "kernels/rows.h"
#include "module.h"
#include "sampling.h"
#include "seqlock.h"
#include "store.h"

static void Store_dealloc(StoreObject *self) {
    for (int i = 0; i < self->nviews; i++) PyBuffer_Release(&self->views[i]);
    for (int i = 0; i < STORE_MAX_SHARDS; i++) slots_free_all(&self->alloc[i]);
    for (int i = 0; i < self->held_ready; i++) held_free(&self->held[i]);
    PyMem_Free(self->home_off);
    PyMem_Free(self->repeat_set);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int take_view(StoreObject *self, PyObject *obj, int writable, Py_ssize_t itemsize,
                     const char *name, void **ptr, Py_ssize_t *count) {
    Py_buffer *view = &self->views[self->nviews];
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    self->nviews++;
    if (view->len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: byte length %zd is not a multiple of %zd", name,
                     view->len, itemsize);
        return -1;
    }
    *ptr = view->buf;
    *count = view->len / itemsize;
    return 0;
}

static int Store_init(StoreObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"num_keys", "rank", "world_size", "home", "slab", "delta", "seqs",
                             "access_stats", "lens", "uniform_len", "channels", NULL};
    PyObject *home, *slab, *delta, *seqs, *access_stats, *lens;
    long long num_keys, rank, world, uniform_len, channels = 1;
    if (self->nviews) {
        PyErr_SetString(PyExc_RuntimeError, "Store is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLLOOOOOOL|L", kwlist, &num_keys, &rank,
                                     &world, &home, &slab, &delta, &seqs, &access_stats, &lens,
                                     &uniform_len, &channels))
        return -1;
    if (num_keys < 1 || world < 1 || rank < 0 || rank >= world) {
        PyErr_SetString(PyExc_ValueError, "Store: need num_keys >= 1 and 0 <= rank < world_size");
        return -1;
    }
    if (channels < 1 || channels > STORE_MAX_SHARDS) {
        PyErr_Format(PyExc_ValueError, "Store: channels must be in [1, %d]", STORE_MAX_SHARDS);
        return -1;
    }
    const int64_t num_home = num_keys > rank ? (num_keys - rank + world - 1) / world : 0;
    Py_ssize_t nhome, nslab, ndelta, nseqs, nstats, nlens = 0;
    void *p;
    if (take_view(self, home, 1, 4, "home", &p, &nhome) < 0) return -1;
    self->s.home = p;
    if (take_view(self, slab, 1, 4, "slab", &p, &nslab) < 0) return -1;
    self->s.slab = p;
    if (take_view(self, delta, 1, 4, "delta", &p, &ndelta) < 0) return -1;
    self->s.delta = p;
    if (take_view(self, seqs, 1, 8, "seqs", &p, &nseqs) < 0) return -1;
    self->s.seqs = p;
    if (take_view(self, access_stats, 1, 8, "access_stats", &p, &nstats) < 0) return -1;
    self->s.access_stats = p;
    self->s.lens = NULL;
    if (lens != Py_None) {
        if (take_view(self, lens, 0, 8, "lens", &p, &nlens) < 0) return -1;
        self->s.lens = p;
    }
    if (nhome != num_home || ndelta != nslab || (lens != Py_None && nlens != num_keys) ||
        nstats < 3) {
        PyErr_SetString(PyExc_ValueError, "Store: home/lens or slab/delta sizes differ");
        return -1;
    }
    if (nseqs < SEQ_STRIDE || (nseqs & (nseqs - 1))) {
        PyErr_Format(PyExc_ValueError, "Store: seqs must hold a power of two stripes of %d "
                     "words each", SEQ_STRIDE);
        return -1;
    }
    if ((uniform_len <= 0) != (lens != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "Store: give uniform_len > 0 or lens, not both");
        return -1;
    }
    self->s.num_keys = num_keys;
    self->s.rank = rank;
    self->s.world = world;
    self->s.home_shift = -1;
    if (!(world & (world - 1)))
        for (self->s.home_shift = 0; ((int64_t)1 << self->s.home_shift) < world;)
            self->s.home_shift++;
    self->s.uniform_len = uniform_len > 0 ? uniform_len : 0;
    self->s.slab_floats = nslab;
    self->s.stripe_mask = (uint64_t)(nseqs / SEQ_STRIDE) - 1;
    if (self->s.uniform_len) {
        self->s.home_floats = num_home * self->s.uniform_len;
    } else { /* the home rows back to back, in home order */
        if (!(self->home_off = PyMem_Malloc((size_t)(num_home ? num_home : 1) * 8))) {
            PyErr_NoMemory();
            return -1;
        }
        int64_t at = 0;
        for (int64_t i = 0; i < num_home; i++) {
            self->home_off[i] = at;
            at += self->s.lens[rank + i * world];
        }
        self->s.home_off = self->home_off;
        self->s.home_floats = at;
    }
    if (self->s.home_floats > nslab) {
        PyErr_SetString(PyExc_ValueError, "Store: the slab is smaller than the home rows");
        return -1;
    }
    self->s.shards = channels;
    for (; self->held_ready < channels; self->held_ready++)
        if (held_init(&self->held[self->held_ready]) < 0) {
            PyErr_NoMemory();
            return -1;
        }
    self->s.held = self->held;
    self->pool_lock = 0;
    self->s.pool_lock = &self->pool_lock;
    if (channels == 1) {
        slots_init(&self->alloc[0], self->s.home_floats, nslab);
        return 0;
    }
    /* Channel c's region holds the rows of its keys homed elsewhere (a home key's row is fixed,
     * a replica's too), so the regions together are the slab above the home rows. */
    int64_t need[STORE_MAX_SHARDS] = {0};
    for (int64_t key = 0; key < num_keys; key++)
        if (!is_home(&self->s, key)) need[store_shard(&self->s, key)] += key_len(&self->s, key);
    int64_t start = self->s.home_floats;
    for (int64_t c = 0; c < channels; c++) {
        if (start + need[c] > nslab) {
            PyErr_SetString(PyExc_ValueError, "Store: the slab is smaller than every key's row");
            return -1;
        }
        slots_init(&self->alloc[c], start, start + need[c]);
        start += need[c];
    }
    return 0;
}

/* Slots for keys[0..n) from their channels' allocators; 0, or -1 (none taken) when out of
 * memory. */
static int take_slots(StoreObject *self, const int64_t *keys, int64_t n, int64_t *slots) {
    const store_t *s = &self->s;
    if (s->shards == 1) return slots_take(&self->alloc[0], s, keys, n, slots);
    for (int64_t i = 0; i < n; i++)
        if (slots_take(&self->alloc[store_shard(s, keys[i])], s, &keys[i], 1, &slots[i]) < 0) {
            for (int64_t j = 0; j < i; j++)
                slots_give(&self->alloc[store_shard(s, keys[j])], s, &keys[j], &slots[j], 1);
            return -1;
        }
    return 0;
}

/* The slots of keys[0..n) back to their channels' allocators (negative slots skipped). */
static void give_slots(StoreObject *self, const int64_t *keys, const int64_t *slots, int64_t n) {
    const store_t *s = &self->s;
    if (s->shards == 1) {
        slots_give(&self->alloc[0], s, keys, slots, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        slots_give(&self->alloc[store_shard(s, keys[i])], s, &keys[i], &slots[i], 1);
}

/* Batch buffers of one call; released by release_batch. */
typedef struct {
    Py_buffer b[5];
    int n;
} batch_t;

static void release_batch(batch_t *bt) {
    for (int i = 0; i < bt->n; i++) PyBuffer_Release(&bt->b[i]);
}

/* The buffer of obj as items of itemsize bytes whose format is one of the letters in kinds (a
 * leading '@', '=' or '<' allowed: this machine's byte order), C-contiguous, and writable if
 * asked; *count of them. NULL with a TypeError naming the argument otherwise. */
static void *batch_view(batch_t *bt, PyObject *obj, int writable, Py_ssize_t itemsize,
                        const char *kinds, const char *name, Py_ssize_t *count) {
    Py_buffer *view = &bt->b[bt->n];
    if (PyObject_GetBuffer(obj, view,
                           PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0))
        < 0)
        return NULL;
    bt->n++;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (view->itemsize != itemsize || !f[0] || f[1] || !strchr(kinds, f[0])) {
        PyErr_Format(PyExc_TypeError, "%s: a C-contiguous%s buffer of %zd-byte items ('%s'), "
                     "got format '%s' of %zd-byte items", name, writable ? ", writable" : "",
                     itemsize, kinds, view->format ? view->format : "B", view->itemsize);
        return NULL;
    }
    *count = view->len / itemsize;
    return view->buf;
}

static int key_range_error(const StoreObject *self, const int64_t *keys, int64_t bad) {
    if (bad >= 0) {
        PyErr_Format(PyExc_IndexError, "keys[%lld] = %lld is outside [0, %lld)", (long long)bad,
                     (long long)keys[bad], (long long)self->s.num_keys);
        return -1;
    }
    return 0;
}

static int check_keys_in_range(const StoreObject *self, const int64_t *keys, Py_ssize_t n) {
    int64_t bad;
    if (n < CHECK_RELEASES_GIL_FROM) {
        bad = store_check_keys(keys, n, self->s.num_keys);
    } else {
        Py_BEGIN_ALLOW_THREADS
        bad = store_check_keys(keys, n, self->s.num_keys);
        Py_END_ALLOW_THREADS
    }
    return key_range_error(self, keys, bad);
}

/* gather(keys, out, missing), scatter_add(keys, vals, missing) and scatter_set(...) -> the
 * number of positions of keys not held here (written to missing[:n]). op: 0 add, 1 set (as
 * store_scatter's mode), GATHER; rows: out (written) or vals (read). The whole batch is
 * range-checked before the first row is read or written, both in one GIL-released region. */
enum { GATHER = -1 };

static PyObject *keyed_rows(StoreObject *self, PyObject *args, int op) {
    PyObject *okeys, *orows, *omiss;
    if (!PyArg_ParseTuple(args, "OOO", &okeys, &orows, &omiss)) return NULL;
    const char *rows_name = op == GATHER ? "out" : "vals";
    batch_t bt = {.n = 0};
    Py_ssize_t n, nrows, nmiss_cap;
    int64_t *keys = batch_view(&bt, okeys, 0, 8, "lq", "keys", &n);
    float *rows = keys ? batch_view(&bt, orows, op == GATHER, 4, "f", rows_name, &nrows) : NULL;
    int64_t *missing = rows ? batch_view(&bt, omiss, 1, 8, "lq", "missing", &nmiss_cap) : NULL;
    if (!missing) goto fail;
    if (nmiss_cap < n) {
        PyErr_SetString(PyExc_ValueError, "missing buffer is shorter than keys");
        goto fail;
    }
    int64_t r = 0, bad;
    NOGIL_BEGIN(n + nrows)
    bad = store_check_keys(keys, n, self->s.num_keys);
    if (bad < 0)
        r = op == GATHER ? store_gather(&self->s, keys, n, rows, nrows, missing)
                         : store_scatter(&self->s, keys, n, rows, nrows, missing, op);
    NOGIL_END
    if (key_range_error(self, keys, bad) < 0) goto fail;
    release_batch(&bt);
    if (r < 0)
        return PyErr_Format(PyExc_ValueError, op == GATHER
                                                  ? "out is too small for the requested keys"
                                                  : "values are too short for the given keys");
    return PyLong_FromLongLong(r);
fail:
    release_batch(&bt);
    return NULL;
}

static PyObject *Store_gather(StoreObject *self, PyObject *args) {
    return keyed_rows(self, args, GATHER);
}

/* The fast path of Worker.pull/push, for the layout training loops pass: keys a 1-d C-contiguous
 * int64 buffer, values a C-contiguous float32 (len(keys), uniform_len) buffer, every key in
 * range, missing long enough. Anything else (or a store without a uniform length) returns None
 * before touching anything, and the caller takes its validating path, which raises the right
 * error. One C call instead of four Python-level checks: bench/store.py, batches <= 1k keys. */
static int fast_keys(Py_buffer *v, PyObject *obj) {
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = v->format;
    if (v->ndim == 1 && v->itemsize == 8 && f && (!strcmp(f, "l") || !strcmp(f, "q"))) return 1;
    PyBuffer_Release(v);
    return 0;
}

static int fast_values(Py_buffer *v, PyObject *obj, int writable, Py_ssize_t n, int64_t len) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = v->format;
    if (v->ndim == 2 && v->shape[0] == n && v->shape[1] == len && v->itemsize == 4 && f &&
        !strcmp(f, "f"))
        return 1;
    PyBuffer_Release(v);
    return 0;
}

/* mode: 0 gather, 1 scatter add, 2 scatter set */
static PyObject *fast_call(StoreObject *self, PyObject *args, int mode) {
    PyObject *okeys, *ovals, *omiss;
    if (!PyArg_ParseTuple(args, "OOO", &okeys, &ovals, &omiss)) return NULL;
    if (!self->s.uniform_len) Py_RETURN_NONE;
    Py_buffer kv, vv, mv;
    if (!fast_keys(&kv, okeys)) Py_RETURN_NONE;
    const Py_ssize_t n = kv.shape[0];
    if (!fast_values(&vv, ovals, mode == 0, n, self->s.uniform_len)) {
        PyBuffer_Release(&kv);
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(omiss, &mv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&vv);
        PyBuffer_Release(&kv);
        Py_RETURN_NONE;
    }
    const int64_t *keys = kv.buf;
    int64_t r = -1, bad;
    if (mv.len / 8 >= n) {
        Py_BEGIN_ALLOW_THREADS
        bad = store_check_keys(keys, n, self->s.num_keys);
        if (bad < 0) {
            const int64_t nfloats = (int64_t)n * self->s.uniform_len;
            if (mode == 0) r = store_gather(&self->s, keys, n, vv.buf, nfloats, mv.buf);
            else r = store_scatter(&self->s, keys, n, vv.buf, nfloats, mv.buf, mode - 1);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&mv);
    PyBuffer_Release(&vv);
    PyBuffer_Release(&kv);
    if (r < 0) Py_RETURN_NONE; /* short missing buffer or a key out of range: nothing changed */
    return PyLong_FromLongLong(r);
}

static PyObject *Store_gather_fast(StoreObject *self, PyObject *args) { return fast_call(self, args, 0); }
static PyObject *Store_scatter_add_fast(StoreObject *self, PyObject *args) { return fast_call(self, args, 1); }
static PyObject *Store_scatter_set_fast(StoreObject *self, PyObject *args) { return fast_call(self, args, 2); }

/* Store.rows(): the store's rows for the kernels' native training loops (kernels/rows.h). The
 * capsule owns its rows_t and a reference to the Store, so the store's memory outlives every
 * loop that holds the capsule. The functions are store_gather, store_scatter (add) and
 * store_missing: keys held elsewhere come back as missing, as for a worker's pull and push. */
static int64_t rows_gather(void *ctx, const int64_t *keys, int64_t n, float *out,
                           int64_t out_floats, int64_t *missing) {
    return store_gather(ctx, keys, n, out, out_floats, missing);
}

static int64_t rows_scatter_add(void *ctx, const int64_t *keys, int64_t n, const float *vals,
                                int64_t vals_floats, int64_t *missing) {
    return store_scatter(ctx, keys, n, vals, vals_floats, missing, 0);
}

static int64_t rows_missing(void *ctx, const int64_t *keys, int64_t n, int64_t *missing) {
    return store_missing(ctx, keys, n, missing);
}

static void rows_capsule_free(PyObject *capsule) {
    PyMem_Free(PyCapsule_GetPointer(capsule, ROWS_CAPSULE));
    Py_XDECREF((PyObject *)PyCapsule_GetContext(capsule));
}

static PyObject *Store_rows(StoreObject *self, PyObject *unused) {
    if (!self->s.uniform_len)
        return PyErr_Format(PyExc_ValueError, "Store.rows: keys of different value lengths");
    rows_t *rows = PyMem_Malloc(sizeof *rows);
    if (!rows) return PyErr_NoMemory();
    *rows = (rows_t){.abi = ROWS_ABI, .ctx = &self->s, .num_keys = self->s.num_keys,
                     .row_floats = self->s.uniform_len, .gather = rows_gather,
                     .scatter_add = rows_scatter_add, .missing = rows_missing};
    PyObject *capsule = PyCapsule_New(rows, ROWS_CAPSULE, rows_capsule_free);
    if (!capsule) {
        PyMem_Free(rows);
        return NULL;
    }
    Py_INCREF(self);
    if (PyCapsule_SetContext(capsule, self) < 0) { /* not reached: the capsule is valid */
        Py_DECREF(self);
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

static PyObject *Store_scatter_add(StoreObject *self, PyObject *args) {
    return keyed_rows(self, args, 0);
}
static PyObject *Store_scatter_set(StoreObject *self, PyObject *args) {
    return keyed_rows(self, args, 1);
}


/* insert(keys, state, vals_or_None, versions_or_None, now) */
static PyObject *Store_insert(StoreObject *self, PyObject *args) {
    PyObject *okeys, *ovals, *oversions;
    int new_state;
    double now;
    if (!PyArg_ParseTuple(args, "OiOOd", &okeys, &new_state, &ovals, &oversions, &now))
        return NULL;
    batch_t bt = {.n = 0};
    Py_ssize_t n, nvals = 0, nversions = 0;
    int64_t *keys = batch_view(&bt, okeys, 0, 8, "lq", "keys", &n), *slots = NULL;
    float *vals = NULL;
    int64_t *versions = NULL;
    if (!keys) goto fail;
    if (ovals != Py_None && !(vals = batch_view(&bt, ovals, 0, 4, "f", "vals", &nvals))) goto fail;
    if (oversions != Py_None && !(versions = batch_view(&bt, oversions, 0, 8, "lq", "versions",
                                                        &nversions)))
        goto fail;
    if (check_keys_in_range(self, keys, n) < 0
        || refuse_repeats(self, keys, n, "insert") < 0)
        goto fail;
    if ((versions && nversions != n) || (vals && nvals != store_floats_of(&self->s, keys, n))
        || (new_state != KEY_OWNER && new_state != KEY_REPLICA)) {
        PyErr_SetString(PyExc_ValueError, "insert: values and versions must match the keys; "
                                          "state owner or replica");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (store_state(&self->s, keys[i]) != KEY_NONE) {
            PyErr_Format(PyExc_ValueError, "insert: key %lld is held here already",
                         (long long)keys[i]);
            goto fail;
        }
    if (!(slots = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto fail;
    }
    if (take_slots(self, keys, n, slots) < 0) {
        PyErr_SetString(PyExc_MemoryError, "insert: no slot for a value (out of memory)");
        goto fail;
    }
    int64_t done;
    NOGIL_BEGIN(n + nvals)
    done = store_insert(&self->s, keys, n, slots, (int8_t)new_state, vals, nvals, versions, now);
    NOGIL_END
    if (done < 0) {
        give_slots(self, keys, slots, n);
        PyErr_SetString(PyExc_MemoryError, "insert: no room for the keys (out of memory)");
        goto fail;
    }
    PyMem_Free(slots);
    release_batch(&bt);
    Py_RETURN_NONE;
fail:
    PyMem_Free(slots);
    release_batch(&bt);
    return NULL;
}

/* take_deltas(keys, out, nonzero_out) */
static PyObject *Store_take_deltas(StoreObject *self, PyObject *args) {
    PyObject *okeys, *oout, *ononzero;
    if (!PyArg_ParseTuple(args, "OOO", &okeys, &oout, &ononzero)) return NULL;
    batch_t bt = {.n = 0};
    Py_ssize_t n, nout, nnonzero;
    int64_t *keys = batch_view(&bt, okeys, 0, 8, "lq", "keys", &n);
    float *out = keys ? batch_view(&bt, oout, 1, 4, "f", "out", &nout) : NULL;
    int8_t *nonzero = out ? batch_view(&bt, ononzero, 1, 1, "b", "nonzero", &nnonzero) : NULL;
    if (!nonzero || check_keys_in_range(self, keys, n) < 0) goto fail;
    if (nnonzero < n) {
        PyErr_SetString(PyExc_ValueError, "take_deltas: nonzero is shorter than keys");
        goto fail;
    }
    int64_t r;
    NOGIL_BEGIN(n + nout)
    r = store_take_deltas(&self->s, keys, n, out, nout, nonzero);
    NOGIL_END
    release_batch(&bt);
    if (r < 0) return PyErr_Format(PyExc_ValueError, "take_deltas: out is too small");
    return PyLong_FromLongLong(r);
fail:
    release_batch(&bt);
    return NULL;
}

/* refresh(keys, vals, versions, promote) -> number of replicas changed */
static PyObject *Store_refresh(StoreObject *self, PyObject *args) {
    PyObject *okeys, *ovals, *oversions;
    int promote;
    if (!PyArg_ParseTuple(args, "OOOp", &okeys, &ovals, &oversions, &promote)) return NULL;
    batch_t bt = {.n = 0};
    Py_ssize_t n, nvals, nversions;
    int64_t *keys = batch_view(&bt, okeys, 0, 8, "lq", "keys", &n);
    float *vals = keys ? batch_view(&bt, ovals, 0, 4, "f", "vals", &nvals) : NULL;
    int64_t *versions =
        vals ? batch_view(&bt, oversions, 0, 8, "lq", "versions", &nversions) : NULL;
    if (!versions || check_keys_in_range(self, keys, n) < 0) goto fail;
    if (nversions != n) {
        PyErr_SetString(PyExc_ValueError, "refresh: versions must match keys");
        goto fail;
    }
    int64_t r;
    NOGIL_BEGIN(n + nvals)
    r = store_refresh(&self->s, keys, n, vals, nvals, versions, promote, 0.0);
    NOGIL_END
    release_batch(&bt);
    if (r < 0) return PyErr_Format(PyExc_ValueError, "refresh: values are too short");
    return PyLong_FromLongLong(r);
fail:
    release_batch(&bt);
    return NULL;
}

/* remove(keys, vals_out_or_None, deltas_out_or_None) */
static PyObject *Store_remove(StoreObject *self, PyObject *args) {
    PyObject *okeys, *ovals, *odeltas;
    if (!PyArg_ParseTuple(args, "OOO", &okeys, &ovals, &odeltas)) return NULL;
    batch_t bt = {.n = 0};
    Py_ssize_t n, nvals = 0, ndeltas = 0;
    float *vals = NULL, *deltas = NULL;
    int64_t *keys = batch_view(&bt, okeys, 0, 8, "lq", "keys", &n), *slots = NULL;
    if (!keys) goto fail;
    if (ovals != Py_None && !(vals = batch_view(&bt, ovals, 1, 4, "f", "vals_out", &nvals)))
        goto fail;
    if (odeltas != Py_None) {
        if (!(deltas = batch_view(&bt, odeltas, 1, 4, "f", "deltas_out", &ndeltas))) goto fail;
    }
    if (check_keys_in_range(self, keys, n) < 0
        || refuse_repeats(self, keys, n, "remove") < 0)
        goto fail;
    const int64_t need = store_floats_of(&self->s, keys, n);
    if ((vals && nvals < need) || (deltas && ndeltas < need)) {
        PyErr_SetString(PyExc_ValueError, "remove: output buffers too small");
        goto fail;
    }
    if (!(slots = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto fail;
    }
    NOGIL_BEGIN(n + (vals || deltas ? need : 0))
    store_remove(&self->s, keys, n, vals, deltas, need, slots, NULL);
    NOGIL_END
    give_slots(self, keys, slots, n); /* not held: slot -1, skipped */
    PyMem_Free(slots);
    release_batch(&bt);
    Py_RETURN_NONE;
fail:
    PyMem_Free(slots);
    release_batch(&bt);
    return NULL;
}

/* free_slots() -> bytearray of the free slots (int64), every value length */
static PyObject *Store_free_slots(StoreObject *self, PyObject *unused) {
    int64_t n = 0;
    for (int64_t c = 0; c < self->s.shards; c++) n += slots_free_list(&self->alloc[c], NULL);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * 8);
    if (!out) return NULL;
    int64_t at = 0;
    for (int64_t c = 0; c < self->s.shards; c++)
        at += slots_free_list(&self->alloc[c], (int64_t *)PyByteArray_AS_STRING(out) + at);
    return out;
}

/* inspect(keys, states_or_None, versions_or_None, synced_or_None, slots_or_None): per key, what
 * the store holds (a snapshot, from any thread). */
/* keep_pool(keys, pos, count, low) -> None: see the method table. */
static PyObject *Store_keep_pool(StoreObject *self, PyObject *args) {
    PyObject *okeys, *opos, *ocount;
    long long low;
    if (!PyArg_ParseTuple(args, "OOOL", &okeys, &opos, &ocount, &low)) return NULL;
    if (self->s.pool.pool) {
        PyErr_SetString(PyExc_RuntimeError, "keep_pool: the store keeps a pool already");
        return NULL;
    }
    const int first = self->nviews;
    void *keys, *pos, *count;
    Py_ssize_t nkeys, npos, ncount;
    if (take_view(self, okeys, 1, 8, "keep_pool: keys", &keys, &nkeys) < 0
        || take_view(self, opos, 1, 8, "keep_pool: pos", &pos, &npos) < 0
        || take_view(self, ocount, 1, 8, "keep_pool: count", &count, &ncount) < 0)
        goto fail;
    if (nkeys != npos || ncount != 1 || low < 0 || low + nkeys > self->s.num_keys
        || *(int64_t *)count != 0) {
        PyErr_SetString(PyExc_ValueError, "keep_pool: keys and pos of the domain's length "
                                          "(int64, inside [0, num_keys) from low), count one "
                                          "int64 at 0");
        goto fail;
    }
    /* Every key held now joins it: the pool is kept from here on. */
    self->s.pool = (pool_t){keys, pos, low, low + nkeys};
    self->s.pool_count = count;
    for (int64_t i = 0; i < nkeys; i++) ((int64_t *)pos)[i] = -1;
    int64_t held = 0;
    for (int64_t k = low; k < low + nkeys; k++)
        if (store_state(&self->s, k) != KEY_NONE) held = pool_add(&self->s.pool, held, &k, 1);
    __atomic_store_n(self->s.pool_count, held, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
fail:
    while (self->nviews > first) PyBuffer_Release(&self->views[--self->nviews]);
    return NULL;
}

static PyObject *Store_inspect(StoreObject *self, PyObject *args) {
    PyObject *o[5];
    if (!PyArg_ParseTuple(args, "OOOOO", &o[0], &o[1], &o[2], &o[3], &o[4])) return NULL;
    static const Py_ssize_t itemsize[5] = {8, 1, 8, 8, 8};
    static const char *kinds[5] = {"lq", "b", "lq", "d", "lq"};
    static const char *names[5] = {"keys", "states", "versions", "synced_at", "slots"};
    batch_t bt = {.n = 0};
    void *ptr[5] = {NULL};
    Py_ssize_t n = 0, count;
    for (int i = 0; i < 5; i++) {
        if (i > 0 && o[i] == Py_None) continue;
        if (!(ptr[i] = batch_view(&bt, o[i], i > 0, itemsize[i], kinds[i], names[i], &count)))
            goto fail;
        if (i == 0) n = count;
        else if (count != n) {
            PyErr_Format(PyExc_ValueError, "inspect: %s must have one item per key", names[i]);
            goto fail;
        }
    }
    const int64_t *keys = ptr[0];
    if (check_keys_in_range(self, keys, n) < 0) goto fail;
    const uint64_t tokens = store_enter(&self->s);
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint64_t *seq = store_stripe(&self->s, keys[i]);
        int state;
        int64_t version, slot;
        double synced;
        uint64_t v;
        do { /* one consistent view of the key */
            v = read_begin(seq);
            held_entry_t *e;
            const int64_t raw = store_lookup(&self->s, keys[i], &e);
            state = raw < 0 ? KEY_NONE : (raw & REPLICA_BIT) ? KEY_REPLICA : KEY_OWNER;
            slot = raw < 0 ? -1 : SLOT_OFFSET(raw);
            version = store_version(&self->s, keys[i]);
            synced = state == KEY_REPLICA ? e->synced_at : 0.0;
        } while (read_changed(seq, v));
        if (ptr[1]) ((int8_t *)ptr[1])[i] = (int8_t)state;
        if (ptr[2]) ((int64_t *)ptr[2])[i] = version;
        if (ptr[3]) ((double *)ptr[3])[i] = synced;
        if (ptr[4]) ((int64_t *)ptr[4])[i] = slot;
    }
    store_exit(&self->s, tokens);
    release_batch(&bt);
    Py_RETURN_NONE;
fail:
    release_batch(&bt);
    return NULL;
}

/* held_keys() -> bytearray (int64): the keys held here, unordered. Inserting thread only. */
static PyObject *Store_held_keys(StoreObject *self, PyObject *unused) {
    const store_t *s = &self->s;
    const int64_t num_home = self->views[0].len / 4;
    int64_t owned = 0;
    for (int64_t i = 0; i < num_home; i++) owned += (s->home[i] & HOME_OWNED) != 0;
    int64_t others = 0;
    for (int64_t c = 0; c < s->shards; c++) others += held_keys(&self->held[c], NULL, 0);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (owned + others) * 8);
    if (!out) return NULL;
    int64_t *keys = (int64_t *)PyByteArray_AS_STRING(out), at = 0;
    for (int64_t i = 0; i < num_home; i++)
        if (s->home[i] & HOME_OWNED) keys[at++] = s->rank + i * s->world;
    for (int64_t c = 0; c < s->shards; c++)
        at += held_keys(&self->held[c], keys + at, held_keys(&self->held[c], NULL, 0));
    return out;
}

/* set_synced(keys, versions, now): replicas (others skipped) stand at versions, synced now. */
static PyObject *Store_set_synced(StoreObject *self, PyObject *args) {
    PyObject *okeys, *oversions;
    double now;
    if (!PyArg_ParseTuple(args, "OOd", &okeys, &oversions, &now)) return NULL;
    batch_t bt = {.n = 0};
    Py_ssize_t n, nversions;
    int64_t *keys = batch_view(&bt, okeys, 0, 8, "lq", "keys", &n);
    int64_t *versions =
        keys ? batch_view(&bt, oversions, 0, 8, "lq", "versions", &nversions) : NULL;
    if (!versions || check_keys_in_range(self, keys, n) < 0) goto fail;
    if (nversions != n) {
        PyErr_SetString(PyExc_ValueError, "set_synced: one version per key");
        goto fail;
    }
    store_set_synced(&self->s, keys, n, versions, now);
    release_batch(&bt);
    Py_RETURN_NONE;
fail:
    release_batch(&bt);
    return NULL;
}

/* memory() -> (held entries, bytes of per-key state: home words, home rows' offsets, map) */
static PyObject *Store_memory(StoreObject *self, PyObject *unused) {
    const store_t *s = &self->s;
    const int64_t num_home = self->views[0].len / 4;
    int64_t bytes = num_home * 4 + (s->home_off ? num_home * 8 : 0), live = 0;
    for (int64_t c = 0; c < s->shards; c++) {
        bytes += held_bytes(&self->held[c]);
        live += self->held[c].live;
    }
    return Py_BuildValue("LL", (long long)live, (long long)bytes);
}

static PyMethodDef Store_methods[] = {
    {"gather", (PyCFunction)Store_gather, METH_VARARGS,
     "gather(keys, out, missing) -> int. Copy values of local keys into out (request order); "
     "positions of non-local keys go to missing[:result]. Lock-free reads, GIL released."},
    {"scatter_add", (PyCFunction)Store_scatter_add, METH_VARARGS,
     "scatter_add(keys, vals, missing) -> int. Add vals to local keys (replicas: also to delta)."},
    {"scatter_set", (PyCFunction)Store_scatter_set, METH_VARARGS,
     "scatter_set(keys, vals, missing) -> int. Overwrite owned keys; replicas count as missing."},
    {"gather_fast", (PyCFunction)Store_gather_fast, METH_VARARGS,
     "gather_fast(keys, out, missing) -> int or None. gather() for exactly 1-d int64 keys and a "
     "float32 (len(keys), uniform_len) out, all keys in range; None (nothing done) otherwise."},
    {"scatter_add_fast", (PyCFunction)Store_scatter_add_fast, METH_VARARGS,
     "scatter_add_fast(keys, vals, missing) -> int or None. Like gather_fast, for scatter_add."},
    {"scatter_set_fast", (PyCFunction)Store_scatter_set_fast, METH_VARARGS,
     "scatter_set_fast(keys, vals, missing) -> int or None. Like gather_fast, for scatter_set."},
    {"rows", (PyCFunction)Store_rows, METH_NOARGS,
     "rows() -> capsule. The store's rows for the kernels' native training loops "
     "(adapm._kernels.mf_train_rows): gather and scatter-add by key without the GIL, keys held "
     "elsewhere reported as missing (native/kernels/rows.h). Uniform value lengths only."},
    {"insert", (PyCFunction)Store_insert, METH_VARARGS,
     "insert(keys, state, vals, versions, now) -> None. Make keys (unique, not held here) local: "
     "each gets a slot, its value (zeros when vals is None) and version (0 when None); "
     "replicas are synced at now. MemoryError (nothing changed) if out of memory. "
     "ValueError (nothing changed) for a key held already or repeated, or sizes that differ."},
    {"take_deltas", (PyCFunction)Store_take_deltas, METH_VARARGS,
     "take_deltas(keys, out, nonzero) -> floats written. Replicas: move deltas out (zeroing "
     "them), only the rows of keys with updates, packed in key order."},
    {"refresh", (PyCFunction)Store_refresh, METH_VARARGS,
     "refresh(keys, vals, versions, promote) -> int. Replicas: value = vals + delta."},
    {"remove", (PyCFunction)Store_remove, METH_VARARGS,
     "remove(keys, vals_out, deltas_out) -> None. Copy values (and replicas' deltas) out, "
     "packed in key order, and drop the keys (unique); their slots are free again. Keys not "
     "held here are skipped (their rows in the outputs are left as they were)."},
    {"free_slots", (PyCFunction)Store_free_slots, METH_NOARGS,
     "free_slots() -> bytearray. The free slots (int64 float offsets), for checks."},
    {"keep_pool", (PyCFunction)Store_keep_pool, METH_VARARGS,
     "keep_pool(keys, pos, count, low) -> None. From now on the store keeps the local "
     "sampler's pool of its held keys of the domain [low, low + len(keys)) (native/sampling.h) "
     "as keys are inserted and removed, whatever inserts and removes them: keys[:count[0]] are "
     "those keys in no order, pos[k - low] is k's index there or -1 (int64 buffers, kept; count "
     "one int64, 0 now, written with release order). The keys held now join. Once per store; "
     "the thread that inserts and removes keys, before others draw."},
    {"inspect", (PyCFunction)Store_inspect, METH_VARARGS,
     "inspect(keys, states, versions, synced_at, slots) -> None. Per key (outputs may be None): "
     "KEY_NONE/OWNER/REPLICA, version (-1 if not held), a replica's sync time (0.0 otherwise), "
     "value offset (-1). A consistent snapshot per key; any thread."},
    {"held_keys", (PyCFunction)Store_held_keys, METH_NOARGS,
     "held_keys() -> bytearray (int64). The keys held here, unordered. Inserting thread only."},
    {"set_synced", (PyCFunction)Store_set_synced, METH_VARARGS,
     "set_synced(keys, versions, now) -> None. Replicas (others skipped) now stand at versions, "
     "synced at now. Inserting thread only."},
    {"memory", (PyCFunction)Store_memory, METH_NOARGS,
     "memory() -> (entries, bytes). Keys in the held map, and bytes of per-key state (home "
     "words, home row offsets, held map)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adapm._native.Store",
    .tp_basicsize = sizeof(StoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Native view of a node's store (directory arrays, value slabs, stripe seqlocks).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Store_init,
    .tp_dealloc = (destructor)Store_dealloc,
    .tp_methods = Store_methods,
};
