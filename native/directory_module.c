/* CPython binding of the directory (directory.h): type adapm._native.Directory.
 *
 * A Directory keeps a reference to the node's Store object and owns the rest of the directory:
 * the home table's owners and the records of active keys (records.h). Each method checks its
 * batch buffers, reserves the records its pass may create, and makes one call into
 * directory.c.
 */
#include "check.h"
#include "directory.h"
#include "module.h"
#include "outbox.h"
#include "policy.h"

typedef struct {
    PyObject_HEAD
    directory_t d;
    PyObject *store; /* the StoreObject whose store_t d.store points into */
    replica_set_t held; /* the keys held here as replicas (d.held) */
    records_t recs;     /* d.recs */
    pins_t pins;        /* d.pins */
    check_scratch_t scratch; /* check_message's and check_sync_answer's */
    outbox_t outbox;    /* moves decided here, held per peer until sent (outbox.h) */
    int ready;
} DirectoryObject;

/* The store's repeated-key check (module.h) for this directory's batches. */
static int refuse_repeated(DirectoryObject *self, const int64_t *keys, int64_t n,
                           const char *what) {
    return refuse_repeats((StoreObject *)self->store, keys, n, what);
}

static void Directory_dealloc(DirectoryObject *self) {
    rs_free(&self->held);
    check_scratch_free(&self->scratch);
    outbox_free(&self->outbox);
    if (self->ready) {
        rec_free(&self->recs);
        pins_free(&self->pins);
    }
    free(self->d.home_owner);
    Py_XDECREF(self->store);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Room for n new records, or MemoryError. */
static int reserve(DirectoryObject *self, int64_t n) {
    if (dir_reserve(&self->d, n) == 0) return 0;
    PyErr_NoMemory();
    return -1;
}

static int Directory_init(DirectoryObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"store", "rank", "world_size", "masks", "average", NULL};
    PyObject *store;
    long long rank, world_size;
    int masks, average = 0;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Directory is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!LLp|p", kwlist, &StoreType, &store,
                                     &rank, &world_size, &masks, &average))
        return -1;
    if (world_size < 1 || world_size > INT32_MAX || rank < 0 || rank >= world_size) {
        PyErr_SetString(PyExc_ValueError, "Directory: rank must be in [0, world_size)");
        return -1;
    }
    directory_t *d = &self->d;
    d->store = &((StoreObject *)store)->s;
    d->rank = rank;
    d->world_size = world_size;
    d->words = (world_size + 63) / 64;
    d->masks = masks;
    d->average = average;
    const int64_t num_keys = d->store->num_keys;
    d->num_home = num_keys > rank ? (num_keys - rank + world_size - 1) / world_size : 0;
    if (!(d->home_owner = malloc((size_t)(d->num_home ? d->num_home : 1) * sizeof(int32_t)))
        || rec_init(&self->recs, world_size, masks ? d->words : 0) < 0) {
        free(d->home_owner);
        d->home_owner = NULL;
        PyErr_NoMemory();
        return -1;
    }
    if (outbox_init(&self->outbox, world_size, d->words) < 0 || pins_init(&self->pins) < 0) {
        outbox_free(&self->outbox);
        rec_free(&self->recs);
        free(d->home_owner);
        d->home_owner = NULL;
        PyErr_NoMemory();
        return -1;
    }
    d->pins = &self->pins;
    for (int64_t h = 0; h < d->num_home; h++) d->home_owner[h] = (int32_t)rank;
    Py_INCREF(store);
    self->store = store;
    d->recs = &self->recs;
    d->alloc = &((StoreObject *)store)->alloc;
    d->held = &self->held;
    self->ready = 1;
    return 0;
}

static int check_keys(const DirectoryObject *self, const int64_t *keys, int64_t n) {
    const int64_t bad = store_check_keys(keys, n, self->d.store->num_keys);
    if (bad >= 0) {
        PyErr_Format(PyExc_IndexError, "keys[%lld] = %lld is outside [0, %lld)", (long long)bad,
                     (long long)keys[bad], (long long)self->d.store->num_keys);
        return -1;
    }
    return 0;
}

/* relocate_in(keys, values, versions, s_in, r_in, epochs, slots, was_replica) -> None */
static PyObject *Directory_relocate_in(DirectoryObject *self, PyObject *args) {
    PyObject *o[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    Py_buffer v[7]; /* keys values versions s_in r_in epochs was_replica */
    const Py_ssize_t sizes[7] = {8, 4, 8, 8, 8, 8, 1};
    const int writable[7] = {0, 0, 0, 0, 0, 0, 1};
    int got = 0;
    PyObject *result = NULL;
    int64_t *slots = NULL;
    for (; got < 7; got++)
        if (borrow(o[got], &v[got], sizes[got], writable[got], "relocate_in") < 0) goto done;
    const int64_t n = v[0].len / 8, w = self->d.words;
    if (v[2].len / 8 != n || v[3].len / 8 != n * w || v[4].len / 8 != n * w
        || v[5].len / 8 != n || v[6].len != n) {
        PyErr_SetString(PyExc_ValueError, "relocate_in: versions, epochs and was_replica one "
                                          "per key, masks words per key");
        goto done;
    }
    if (check_keys(self, v[0].buf, n) < 0 || refuse_repeated(self, v[0].buf, n, "relocate_in") < 0)
        goto done;
    if (!self->d.masks) {
        PyErr_SetString(PyExc_ValueError, "relocate_in: this directory keeps no intent masks "
                                          "(the variant never relocates)");
        goto done;
    }
    if (stray_rank_bits(&self->d, v[3].buf, n) || stray_rank_bits(&self->d, v[4].buf, n)) {
        PyErr_Format(PyExc_ValueError, "relocate_in: a mask names a rank >= world size %lld",
                     (long long)self->d.world_size);
        goto done;
    }
    if (!(slots = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    if (reserve(self, n) < 0) goto done;
    int64_t r;
    NOGIL_BEGIN(v[1].len / 4)
    r = dir_relocate_in(&self->d, v[0].buf, n, v[1].buf, v[1].len / 4, v[2].buf, v[3].buf,
                        v[4].buf, v[5].buf, slots, v[6].buf);
    NOGIL_END
    if (r == -1 - n)
        PyErr_SetString(PyExc_ValueError, "relocate_in: values too short for the keys");
    else if (r == -2 - n)
        PyErr_NoMemory();
    else if (r < 0)
        PyErr_Format(PyExc_ValueError, "relocate_in: key %lld is owned here already",
                     (long long)((int64_t *)v[0].buf)[-1 - r]);
    else result = Py_NewRef(Py_None);
done:
    PyMem_Free(slots);
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* A new bytearray of n entries of itemsize bytes; its data in *ptr. */
static PyObject *new_array(Py_ssize_t n, Py_ssize_t itemsize, void **ptr) {
    PyObject *b = PyByteArray_FromStringAndSize(NULL, n * itemsize);
    if (b) *ptr = PyByteArray_AS_STRING(b);
    return b;
}

/* A tuple of `count` new bytearrays of the given byte sizes, their data pointers in ptrs. */
static PyObject *new_buffers(int count, const Py_ssize_t *bytes, void **ptrs) {
    PyObject *tuple = PyTuple_New(count);
    if (!tuple) return NULL;
    for (int i = 0; i < count; i++) {
        PyObject *b = new_array(bytes[i], 1, &ptrs[i]);
        if (!b) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, b);
    }
    return tuple;
}

/* The n bytearrays as numpy views of the codec's dtypes (roles: check.c's letters): a new
 * tuple, or NULL with an exception set. A view pins its bytearray's size: resize first. */
static PyObject *as_views(PyObject *const *bufs, const char *roles, int n) {
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (int i = 0; i < n; i++) {
        const int64_t items = PyByteArray_GET_SIZE(bufs[i]) / wire_itemsize(roles[i]);
        PyObject *view = wire_view(bufs[i], roles[i], items, 0);
        if (!view) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, view);
    }
    return t;
}

/* The decision on node's reports for keys[0..n) with flags (keys checked in range, unique):
 * (dropped, relocated, per_rank), see the docstring of decide; its moves join the peers' held
 * moves (outbox.h). NULL with an exception set (nothing changed) if a key is not owned here. */
static PyObject *decide_batch(DirectoryObject *self, int variant, int64_t node,
                              const int64_t *keys, int64_t n, const uint8_t *flags) {
    const directory_t *d = &self->d;
    PyObject *result = NULL, *relocated = NULL, *per_rank = NULL;
    int64_t *relocate_to = NULL, *cursor = NULL, *ints = NULL;
    uint64_t *setup = NULL, *masks = NULL;
    float *floats = NULL;
    const int64_t w = d->words, world = d->world_size;
    if (!d->masks) {
        PyErr_SetString(PyExc_ValueError, "decide: this directory keeps no intent masks "
                                          "(the variant does not act on intent)");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) /* before anything changes */
        if (store_state(d->store, keys[i]) != KEY_OWNER) {
            PyErr_Format(PyExc_ValueError, "decide: key %lld is not owned here",
                         (long long)keys[i]);
            return NULL;
        }
    relocate_to = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    setup = PyMem_Malloc((size_t)(n ? n * w : 1) * sizeof(uint64_t));
    if (!relocate_to || !setup) {
        PyErr_NoMemory();
        goto done;
    }
    if (reserve(self, n) < 0) goto done; /* the keys' masks, then their forward pointers */
    int64_t dropped;
    decide_sizes_t z;
    NOGIL_BEGIN(n * w)
    dropped = dir_policy_decide(d, variant, node, keys, n, flags, relocate_to, setup);
    dir_decide_sizes(d, keys, n, relocate_to, setup, &z);
    NOGIL_END
    if (z.relocations < 0) { /* masks only name real ranks (relocate_in checks them) */
        PyErr_SetString(PyExc_RuntimeError, "decide: a mask named a rank outside the world");
        goto done;
    }
    if (!z.relocations && !z.setups) { /* the common case: nothing moves */
        result = Py_BuildValue("LOO", (long long)dropped, Py_None, Py_None);
        goto done;
    }
    /* Scratch for the decision (decide_out_t), copied to the held moves after; everything
     * that can fail comes before dir_decide_execute changes anything. */
    const int64_t r = z.relocations, sp = z.setups, h = z.home_updates;
    const int64_t nints = 3 * world + 4 * r + 2 * sp + 3 * h + (world > sp ? world : sp);
    ints = PyMem_Malloc((size_t)nints * sizeof(int64_t));
    masks = PyMem_Malloc((size_t)(r ? 2 * r * w : 1) * sizeof(uint64_t));
    floats = PyMem_Malloc((size_t)(z.relocation_floats + z.setup_floats + 1) * sizeof(float));
    if (!ints || !masks || !floats) {
        PyErr_NoMemory();
        goto done;
    }
    void *kp;
    if (r && (!(relocated = new_array(r, 8, &kp)) || !(per_rank = new_array(world, 8, &kp))))
        goto done;
    decide_out_t o;
    int64_t *at = ints;
    o.r_count = at, at += world;
    o.s_count = at, at += world;
    o.h_count = at, at += world;
    o.r_keys = at, at += r;
    o.r_versions = at, at += r;
    o.r_epochs = at, at += r;
    o.r_slots = at, at += r;
    o.s_keys = at, at += sp;
    o.s_versions = at, at += sp;
    o.h_keys = at, at += h;
    o.h_owners = at, at += h;
    o.h_epochs = at, at += h;
    cursor = at;
    o.r_s = masks;
    o.r_r = masks + r * w;
    o.r_values = floats;
    o.s_values = floats + z.relocation_floats;
    if (outbox_reserve_decision(&self->outbox, d, keys, n, relocate_to, setup) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t ok;
    NOGIL_BEGIN(z.relocation_floats + z.setup_floats + n)
    ok = dir_decide_execute(d, keys, n, relocate_to, setup, &z, &o, cursor);
    if (ok >= 0) outbox_append_decision(&self->outbox, d, &o, &z);
    NOGIL_END
    if (ok < 0) { /* cannot happen: ownership was checked above, and only this thread moves keys */
        PyErr_SetString(PyExc_RuntimeError, "decide: a key vanished while it was relocated");
        goto done;
    }
    if (r) {
        memcpy(PyByteArray_AS_STRING(relocated), o.r_keys, (size_t)r * 8);
        memcpy(PyByteArray_AS_STRING(per_rank), o.r_count, (size_t)world * 8);
    }
    result = Py_BuildValue("LOO", (long long)dropped, r ? relocated : Py_None,
                           r ? per_rank : Py_None);
done:
    Py_XDECREF(relocated);
    Py_XDECREF(per_rank);
    PyMem_Free(relocate_to);
    PyMem_Free(setup);
    PyMem_Free(ints);
    PyMem_Free(masks);
    PyMem_Free(floats);
    return result;
}

/* take_moves(dst) -> None, or the 12 move arrays held for dst (numpy views of one new buffer,
 * the shared empties where a section is empty); nothing is held for dst afterwards. */
static PyObject *Directory_take_moves(DirectoryObject *self, PyObject *arg) {
    const long long dst = PyLong_AsLongLong(arg);
    if (dst == -1 && PyErr_Occurred()) return NULL;
    if (dst < 0 || dst >= self->d.world_size) {
        PyErr_SetString(PyExc_ValueError, "take_moves: rank outside the world");
        return NULL;
    }
    outbox_t *ob = &self->outbox;
    if (!outbox_holds(ob, dst)) Py_RETURN_NONE;
    static const char roles[OUTBOX_ARRAYS] = {'k', 'r', 'v', 'm', 'm', 'v',
                                              'k', 'r', 'v', 'k', 'n', 'v'};
    int64_t offset[OUTBOX_ARRAYS], total = 0;
    for (int i = 0; i < OUTBOX_ARRAYS; i++) {
        offset[i] = total;
        total += (outbox_bytes(ob, dst, i) + 7) & ~(int64_t)7; /* each view 8-aligned */
    }
    void *base;
    PyObject *buf = new_array(total, 1, &base);
    if (!buf) return NULL;
    PyObject *out = PyTuple_New(OUTBOX_ARRAYS);
    if (!out) {
        Py_DECREF(buf);
        return NULL;
    }
    for (int i = 0; i < OUTBOX_ARRAYS; i++) {
        outbox_copy(ob, dst, i, (char *)base + offset[i]);
        const int64_t items = outbox_bytes(ob, dst, i) / (roles[i] == 'r' ? 4 : 8);
        PyObject *view = wire_view(buf, roles[i], items, offset[i]);
        if (!view) {
            Py_DECREF(out);
            Py_DECREF(buf);
            return NULL; /* still held */
        }
        PyTuple_SET_ITEM(out, i, view);
    }
    Py_DECREF(buf);
    outbox_clear(ob, dst);
    return out;
}

/* held_peers() -> tuple of the ranks moves are held for. */
static PyObject *Directory_held_peers(DirectoryObject *self, PyObject *unused) {
    const outbox_t *ob = &self->outbox;
    int64_t count = 0;
    for (int64_t r = 0; r < self->d.world_size; r++) count += outbox_holds(ob, r);
    PyObject *out = PyTuple_New(count);
    if (!out) return NULL;
    for (int64_t r = 0, at = 0; r < self->d.world_size && at < count; r++) {
        if (!outbox_holds(ob, r)) continue;
        PyObject *rank = PyLong_FromLongLong(r);
        if (!rank) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, at++, rank);
    }
    return out;
}

/* decide(variant, node, keys, has_intent) -> (dropped, relocations, setups, home_updates) */
static PyObject *Directory_decide(DirectoryObject *self, PyObject *args) {
    int variant;
    long long node;
    PyObject *okeys, *oflags;
    if (!PyArg_ParseTuple(args, "iLOO", &variant, &node, &okeys, &oflags)) return NULL;
    if (variant < POLICY_ADAPTIVE || variant > POLICY_RELOCATION_ONLY || node < 0
        || node >= self->d.world_size) {
        PyErr_SetString(PyExc_ValueError, "decide: bad variant, or node outside the ranks");
        return NULL;
    }
    Py_buffer kv, fv;
    if (borrow(okeys, &kv, 8, 0, "decide: keys") < 0) return NULL;
    if (borrow(oflags, &fv, 1, 0, "decide: has_intent") < 0) {
        PyBuffer_Release(&kv);
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t n = kv.len / 8;
    if (fv.len != n)
        PyErr_SetString(PyExc_ValueError, "decide: has_intent needs one entry per key");
    else if (check_keys(self, kv.buf, n) == 0 && refuse_repeated(self, kv.buf, n, "decide") == 0)
        result = decide_batch(self, variant, node, kv.buf, n, fv.buf);
    PyBuffer_Release(&kv);
    PyBuffer_Release(&fv);
    return result;
}

/* serve_sync(variant, origin, ikeys, ipos, iflags, dkeys, dpos, drows, dver, ckeys, cpos, cver)
 *   -> (answer, decision, rest_index, rest_hop) */
static PyObject *Directory_serve_sync(DirectoryObject *self, PyObject *args) {
    int variant;
    long long origin;
    PyObject *o[10];
    if (!PyArg_ParseTuple(args, "iLOOOOOOOOOO", &variant, &origin, &o[0], &o[1], &o[2], &o[3],
                          &o[4], &o[5], &o[6], &o[7], &o[8], &o[9]))
        return NULL;
    const directory_t *d = &self->d;
    const store_t *st = d->store;
    if (origin < 0 || origin >= d->world_size) {
        PyErr_SetString(PyExc_ValueError, "serve_sync: origin outside the ranks");
        return NULL;
    }
    Py_buffer v[10]; /* ikeys ipos iflags dkeys dpos drows dver ckeys cpos cver */
    const Py_ssize_t sizes[10] = {8, 8, 1, 8, 8, 4, 8, 8, 8, 8};
    int got = 0;
    PyObject *result = NULL, *arrays[8] = {NULL}, *decision = NULL, *rest[2] = {NULL, NULL};
    int8_t *where = NULL;
    int64_t *hop = NULL, *skeys = NULL, *missing = NULL, *ikeys = NULL;
    uint8_t *iflags = NULL, *behind = NULL;
    float *srows = NULL;
    for (; got < 10; got++)
        if (borrow(o[got], &v[got], sizes[got], 0, "serve_sync") < 0) goto done;
    sync_request_t r = {origin, v[0].buf, v[1].buf, v[2].buf, v[0].len / 8,
                        v[3].buf, v[4].buf, v[6].buf, v[5].buf, v[3].len / 8,
                        v[7].buf, v[8].buf, v[9].buf, v[7].len / 8, variant};
    /* A SYNC comes from the network: check it all before anything changes. */
    if (v[1].len / 8 != r.ni || v[2].len != r.ni || v[4].len / 8 != r.nd
        || v[6].len / 8 != r.nd || v[8].len / 8 != r.nc || v[9].len / 8 != r.nc) {
        PyErr_SetString(PyExc_ValueError, "serve_sync: every section needs one position, flag "
                                          "and version per key");
        goto done;
    }
    if (check_keys(self, r.ikeys, r.ni) < 0 || check_keys(self, r.dkeys, r.nd) < 0
        || check_keys(self, r.ckeys, r.nc) < 0
        || refuse_repeated(self, r.ikeys, r.ni, "serve_sync: intent reports") < 0)
        goto done;
    int64_t row_floats = 0;
    for (int64_t i = 0; i < r.nd; i++) row_floats += key_len(st, r.dkeys[i]);
    if (row_floats != v[5].len / 4) {
        PyErr_Format(PyExc_ValueError, "serve_sync: the deltas' rows hold %lld floats, their "
                     "keys need %lld", (long long)(v[5].len / 4), (long long)row_floats);
        goto done;
    }
    if (r.ni && (variant < POLICY_ADAPTIVE || variant > POLICY_RELOCATION_ONLY || !d->masks)) {
        PyErr_SetString(PyExc_ValueError, "serve_sync: intent reports, but this directory's "
                                          "variant does not act on intent");
        goto done;
    }
    if (reserve(self, r.ni) < 0) goto done; /* the decision on the owned reports */
    const int64_t n = r.ni + r.nd + r.nc;
    where = PyMem_Malloc((size_t)(n ? n : 1));
    hop = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!where || !hop) {
        PyErr_NoMemory();
        goto done;
    }
    sync_plan_t p = {where, hop};
    dir_sync_plan(d, &r, &p);
    const int64_t os = p.owned_syncs, oi = p.owned_intents, owned = oi + os;
    sync_answer_t a;
    memset(&a, 0, sizeof(a));
    skeys = PyMem_Malloc((size_t)(os ? os : 1) * sizeof(int64_t));
    missing = PyMem_Malloc((size_t)(os ? os : 1) * sizeof(int64_t));
    behind = PyMem_Malloc((size_t)(os ? os : 1));
    srows = PyMem_Malloc((size_t)(p.owned_sync_floats ? p.owned_sync_floats : 1) * sizeof(float));
    ikeys = PyMem_Malloc((size_t)(oi ? oi : 1) * sizeof(int64_t));
    iflags = PyMem_Malloc((size_t)(oi ? oi : 1));
    if (!skeys || !missing || !behind || !srows || !ikeys || !iflags) {
        PyErr_NoMemory();
        goto done;
    }
    a.skeys = skeys; a.missing = missing; a.behind = behind; a.srows = srows;
    a.ikeys = ikeys; a.iflags = iflags;
    void *ptr[8];
    const Py_ssize_t counts[8] = {owned, owned, os, p.owned_sync_floats, p.redirects,
                                  p.redirects, p.backs, p.back_floats};
    for (int i = 0; i < 8; i++)
        if (!(arrays[i] = new_array(counts[i], i == 3 || i == 7 ? 4 : 8, &ptr[i]))) goto done;
    a.positions = ptr[0]; a.versions = ptr[1]; a.refresh_pos = ptr[2]; a.values = ptr[3];
    a.redirect_pos = ptr[4]; a.redirect_ranks = ptr[5]; a.back_pos = ptr[6];
    a.back_rows = ptr[7];
    void *rp[2];
    if (!(rest[0] = new_array(p.rest, 8, &rp[0])) || !(rest[1] = new_array(p.rest, 8, &rp[1])))
        goto done;
    a.rest_index = rp[0]; a.rest_hop = rp[1];
    int64_t ok;
    NOGIL_BEGIN(n + p.owned_sync_floats)
    ok = dir_sync_serve(d, &r, &p, &a);
    NOGIL_END
    if (ok < 0) {
        PyErr_SetString(PyExc_RuntimeError, "serve_sync: an owned key vanished while serving");
        goto done;
    }
    if (PyByteArray_Resize(arrays[2], a.nrefresh * 8) < 0
        || PyByteArray_Resize(arrays[3], a.nvalues * 4) < 0)
        goto done;
    if (oi && !(decision = decide_batch(self, variant, origin, ikeys, oi, iflags))) goto done;
    PyObject *answer = owned || p.redirects || p.backs ? as_views(arrays, "pvprpnpr", 8)
                                                       : Py_NewRef(Py_None);
    if (!answer) goto done;
    result = Py_BuildValue("NOOO", answer, decision ? decision : Py_None,
                           p.rest ? rest[0] : Py_None, p.rest ? rest[1] : Py_None);
done:
    for (int i = 0; i < 8; i++) Py_XDECREF(arrays[i]);
    Py_XDECREF(decision);
    Py_XDECREF(rest[0]);
    Py_XDECREF(rest[1]);
    PyMem_Free(where);
    PyMem_Free(hop);
    PyMem_Free(skeys);
    PyMem_Free(missing);
    PyMem_Free(behind);
    PyMem_Free(srows);
    PyMem_Free(ikeys);
    PyMem_Free(iflags);
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* Intent counts of this node's (an IntentCounts), or NULL with an exception set. */
static intent_counts_t *intent_counts(PyObject *obj, const char *what) {
    if (!PyObject_TypeCheck(obj, &IntentCountsType) || !((IntentCountsObject *)obj)->ready) {
        PyErr_Format(PyExc_TypeError, "%s: counts must be an initialised IntentCounts", what);
        return NULL;
    }
    return &((IntentCountsObject *)obj)->c;
}

/* A round's requests for reports rkeys[0..nr) with rflags (checked in range, unique, not
 * owned here) and the replicas held here: a new tuple of the 13 bytearrays (drop_keys, counts,
 * keys, ikeys, ipos, iflags, dkeys, dpos, drows, dver, ckeys, cpos, cver; see the docstring of
 * round_requests), or NULL with an exception set. */
static PyObject *round_buffers(DirectoryObject *self, const int64_t *rkeys, const uint8_t *rflags,
                               int64_t nr) {
    const directory_t *d = &self->d;
    PyObject *result = NULL, *out[13] = {NULL};
    void *scratch[8] = {NULL};
    round_in_t in = {rkeys, rflags, nr};
    round_sizes_t z;
    dir_round_sizes(d, &in, &z);
    const int64_t nh = d->held->len, world = d->world_size, most = z.drops + nh;
    const Py_ssize_t bytes[13] = {z.drops * 8, 3 * world * 8, (nr + most) * 8, nr * 8, nr * 8,
                                  nr, most * 8, most * 8, (z.drop_floats + z.held_floats) * 4,
                                  most * 8, nh * 8, nh * 8, nh * 8};
    void *p[13];
    if (!(result = new_buffers(13, bytes, p))) goto done;
    for (int i = 0; i < 13; i++) out[i] = PyTuple_GET_ITEM(result, i);
    round_out_t r = {p[0], NULL, p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[9], p[8], p[10],
                     p[11], p[12]};
    const size_t scratch_bytes[8] = {(size_t)nh * 8, (size_t)(nr + nh) * 8,
                                     (size_t)(nr + nh) * 8, (size_t)(nr + nh) * 8,
                                     (size_t)world * 8, (size_t)nh,
                                     (size_t)(z.drop_floats + z.held_floats) * 4,
                                     (size_t)z.drops * 8};
    for (int i = 0; i < 8; i++)
        if (!(scratch[i] = PyMem_Malloc(scratch_bytes[i] ? scratch_bytes[i] : 1))) {
            PyErr_NoMemory();
            Py_CLEAR(result);
            goto done;
        }
    r.s_live = scratch[0]; r.s_ver = scratch[1]; r.s_at = scratch[2]; r.s_off = scratch[3];
    r.s_cursor = scratch[4]; r.s_nonzero = scratch[5]; r.s_rows = scratch[6];
    r.drop_slots = scratch[7];
    int64_t ok;
    NOGIL_BEGIN(nr + nh + z.held_floats)
    ok = dir_round_build(d, &in, &z, &r);
    NOGIL_END
    if (ok < 0) {
        PyErr_SetString(PyExc_RuntimeError, "round_requests: a location hint names a rank "
                                            "outside the world");
        Py_CLEAR(result);
        goto done;
    }
    /* Sections of unknown size were allocated for the most they could hold. */
    if (PyByteArray_Resize(out[2], (nr + r.nd + r.nc) * 8) < 0
        || PyByteArray_Resize(out[6], r.nd * 8) < 0 || PyByteArray_Resize(out[7], r.nd * 8) < 0
        || PyByteArray_Resize(out[8], r.delta_floats * 4) < 0
        || PyByteArray_Resize(out[9], r.nd * 8) < 0
        || PyByteArray_Resize(out[10], r.nc * 8) < 0 || PyByteArray_Resize(out[11], r.nc * 8) < 0
        || PyByteArray_Resize(out[12], r.nc * 8) < 0)
        Py_CLEAR(result);
done:
    for (int i = 0; i < 8; i++) PyMem_Free(scratch[i]);
    return result;
}

#define ROUND_ROLES "kckkpfkprvkpv"

/* Each rank's SYNC of a round, cut from round_buffers' 13 buffers: a tuple of (dst, entries,
 * the request's 10 keyed arrays as views), one per rank that gets entries; NULL with an
 * exception set. */
static PyObject *round_parts(DirectoryObject *self, PyObject *const *b) {
    const directory_t *d = &self->d;
    const int64_t world = d->world_size, *counts = (const int64_t *)PyByteArray_AS_STRING(b[1]);
    const int64_t *dkeys = (const int64_t *)PyByteArray_AS_STRING(b[6]);
    int64_t parts = 0;
    for (int64_t r = 0; r < world; r++)
        parts += counts[r] + counts[world + r] + counts[2 * world + r] > 0;
    PyObject *out = PyTuple_New(parts);
    if (!out) return NULL;
    int64_t at[3] = {0, 0, 0}, row = 0; /* entries of each section before rank r; drows floats */
    for (int64_t r = 0, part = 0; r < world; r++) {
        const int64_t ni = counts[r], nd = counts[world + r], nc = counts[2 * world + r];
        int64_t floats = 0;
        for (int64_t i = at[1]; i < at[1] + nd; i++) floats += key_len(d->store, dkeys[i]);
        if (ni + nd + nc) {
            PyObject *arrays = PyTuple_New(10);
            if (!arrays) goto fail;
            PyObject *v[10] = {
                wire_view(b[3], 'k', ni, 8 * at[0]), wire_view(b[4], 'p', ni, 8 * at[0]),
                wire_view(b[5], 'f', ni, at[0]), wire_view(b[6], 'k', nd, 8 * at[1]),
                wire_view(b[7], 'p', nd, 8 * at[1]), wire_view(b[8], 'r', floats, 4 * row),
                wire_view(b[9], 'v', nd, 8 * at[1]), wire_view(b[10], 'k', nc, 8 * at[2]),
                wire_view(b[11], 'p', nc, 8 * at[2]), wire_view(b[12], 'v', nc, 8 * at[2])};
            int ok = 1;
            for (int i = 0; i < 10; i++) {
                ok &= v[i] != NULL;
                if (v[i]) PyTuple_SET_ITEM(arrays, i, v[i]);
                else PyTuple_SET_ITEM(arrays, i, Py_NewRef(Py_None));
            }
            PyObject *item = ok ? Py_BuildValue("LLN", (long long)r, (long long)(ni + nd + nc),
                                                arrays)
                                : NULL;
            if (!ok) Py_DECREF(arrays);
            if (!item) goto fail;
            PyTuple_SET_ITEM(out, part++, item);
        }
        at[0] += ni;
        at[1] += nd;
        at[2] += nc;
        row += floats;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* round_build(counts, variant, reports) -> None, or (deferred, told_keys, told_flags, decided,
 * decision, reports_sent, drop_keys, deltas, parts, keys, flags): see the method's docstring. */
static PyObject *Directory_round_build(DirectoryObject *self, PyObject *args) {
    PyObject *ocounts;
    int variant, reports;
    if (!PyArg_ParseTuple(args, "Oip", &ocounts, &variant, &reports)) return NULL;
    intent_counts_t *c = intent_counts(ocounts, "round_build");
    if (!c) return NULL;
    const directory_t *d = &self->d;
    if (variant >= 0 && (variant < POLICY_ADAPTIVE || variant > POLICY_RELOCATION_ONLY
                         || !d->masks)) {
        PyErr_SetString(PyExc_ValueError, "round_build: a variant this directory cannot act on");
        return NULL;
    }
    const int64_t n = c->ndirty;
    if (!n && !d->held->len) Py_RETURN_NONE; /* an idle round: nothing to report or sync */
    PyObject *result = NULL, *told[2] = {NULL, NULL}, *decision = NULL, *buffers = NULL;
    PyObject *parts = NULL, *keys_view = NULL, *drops = NULL, *flags_out = NULL;
    int64_t *keys = PyMem_Malloc((size_t)(n ? n : 1) * 8);
    uint8_t *flags = PyMem_Malloc((size_t)(n ? n : 1));
    int64_t *other = PyMem_Malloc((size_t)(n ? n : 1) * 8); /* pinned, then owned keys */
    uint8_t *other_flags = PyMem_Malloc((size_t)(n ? n : 1));
    if (!keys || !flags || !other || !other_flags || ic_reserve(c, n) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t m = intents_changes(c, keys, flags), deferred = 0, ntold = 0, decided = 0;
    if (variant >= 0 && m) {
        /* An intent that ended for a key a worker here has pinned (its local sample, not pushed
         * yet; NodeState.sample_pins) is reported with the next round: the report would drop
         * a replica (or relocate an owned key) under the worker's push, which would then go
         * remote. */
        int64_t kept = 0;
        pins_lock(&self->pins);
        for (int64_t i = 0; i < m; i++) {
            if (!flags[i] && pins_has(&self->pins, keys[i])) {
                other[deferred++] = keys[i];
                continue;
            }
            keys[kept] = keys[i];
            flags[kept++] = flags[i];
        }
        pins_unlock(&self->pins);
        if (deferred && ic_reserve(c, deferred) == 0) ic_report_again(c, other, deferred);
        else if (deferred) {
            PyErr_NoMemory();
            goto done;
        }
        m = kept;
    }
    if (ic_reserve(c, m) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (!reports) { /* nothing acts on them: taken as told, so that wait_sync sees them served */
        ic_acknowledge(c, keys, flags, m);
        memcpy(other, keys, (size_t)m * 8);
        memcpy(other_flags, flags, (size_t)m);
        ntold = m;
        m = 0;
    } else if (m) {
        /* Keys owned here are decided now, without a message to itself (bench/adaptive.py: most
         * reports are about a node's own keys). */
        int64_t kept = 0;
        for (int64_t i = 0; i < m; i++) {
            if (store_state(d->store, keys[i]) == KEY_OWNER) {
                other[ntold] = keys[i];
                other_flags[ntold++] = flags[i];
                continue;
            }
            keys[kept] = keys[i];
            flags[kept++] = flags[i];
        }
        m = kept;
        if (ntold) {
            decided = ntold;
            if (variant >= 0
                && !(decision = decide_batch(self, variant, d->rank, other, ntold, other_flags)))
                goto done;
            ic_acknowledge(c, other, other_flags, ntold);
        }
    }
    void *p;
    if (!(told[0] = new_array(ntold, 8, &p))) goto done;
    memcpy(p, other, (size_t)ntold * 8);
    if (!(told[1] = new_array(ntold, 1, &p))) goto done;
    memcpy(p, other_flags, (size_t)ntold);
    if (!(flags_out = new_array(m, 1, &p))) goto done;
    memcpy(p, flags, (size_t)m);
    int64_t deltas = 0;
    if (m || d->held->len) {
        if (!(buffers = round_buffers(self, keys, flags, m))) goto done;
        PyObject *b[13];
        for (int i = 0; i < 13; i++) b[i] = PyTuple_GET_ITEM(buffers, i);
        deltas = PyByteArray_GET_SIZE(b[6]) / 8;
        const int64_t nkeys = PyByteArray_GET_SIZE(b[2]) / 8;
        if (!(parts = round_parts(self, b)) || !(keys_view = wire_view(b[2], 'k', nkeys, 0))
            || !(drops = wire_view(b[0], 'k', PyByteArray_GET_SIZE(b[0]) / 8, 0)))
            goto done;
    } else {
        if (!(parts = PyTuple_New(0)) || !(keys_view = wire_view(flags_out, 'k', 0, 0))
            || !(drops = wire_view(flags_out, 'k', 0, 0)))
            goto done;
    }
    result = Py_BuildValue("LOOLOLOLOOO", (long long)deferred, told[0], told[1],
                           (long long)decided, decision ? decision : Py_None, (long long)m, drops,
                           (long long)deltas, parts, keys_view, flags_out);
done:
    Py_XDECREF(told[0]);
    Py_XDECREF(told[1]);
    Py_XDECREF(decision);
    Py_XDECREF(buffers);
    Py_XDECREF(parts);
    Py_XDECREF(keys_view);
    Py_XDECREF(drops);
    Py_XDECREF(flags_out);
    PyMem_Free(keys);
    PyMem_Free(flags);
    PyMem_Free(other);
    PyMem_Free(other_flags);
    return result;
}

/* round_requests(rkeys, rflags) -> (drop_keys, counts, keys, ikeys, ipos, iflags, dkeys, dpos,
 * drows, dver, ckeys, cpos, cver) */
static PyObject *Directory_round_requests(DirectoryObject *self, PyObject *args) {
    PyObject *o[2];
    if (!PyArg_ParseTuple(args, "OO", &o[0], &o[1])) return NULL;
    Py_buffer v[2];
    const Py_ssize_t sizes[2] = {8, 1};
    int got = 0;
    PyObject *result = NULL;
    for (; got < 2; got++)
        if (borrow(o[got], &v[got], sizes[got], 0, "round_requests") < 0) goto done;
    const int64_t nr = v[0].len / 8;
    if (v[1].len != nr) {
        PyErr_SetString(PyExc_ValueError, "round_requests: one flag per report");
        goto done;
    }
    if (check_keys(self, v[0].buf, nr) < 0
        || refuse_repeated(self, v[0].buf, nr, "round_requests: reports") < 0)
        goto done;
    PyObject *buffers = round_buffers(self, v[0].buf, v[1].buf, nr);
    if (buffers) {
        PyObject *b[13];
        for (int i = 0; i < 13; i++) b[i] = PyTuple_GET_ITEM(buffers, i);
        result = as_views(b, ROUND_ROLES, 13);
        Py_DECREF(buffers);
    }
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* setup_in(src, keys, values, versions, counts, now) -> bytearray of the keys taken */
static PyObject *Directory_setup_in(DirectoryObject *self, PyObject *args) {
    long long src;
    double now;
    PyObject *o[3], *ocounts;
    if (!PyArg_ParseTuple(args, "LOOOOd", &src, &o[0], &o[1], &o[2], &ocounts, &now))
        return NULL;
    const intent_counts_t *counts = NULL;
    if (ocounts != Py_None && !(counts = intent_counts(ocounts, "setup_in"))) return NULL;
    const directory_t *d = &self->d;
    if (src < 0 || src >= d->world_size) {
        PyErr_SetString(PyExc_ValueError, "setup_in: src outside the ranks");
        return NULL;
    }
    Py_buffer v[3]; /* keys values versions */
    const Py_ssize_t sizes[3] = {8, 4, 8};
    int got = 0;
    PyObject *result = NULL;
    void *scratch[4] = {NULL};
    for (; got < 3; got++)
        if (borrow(o[got], &v[got], sizes[got], 0, "setup_in") < 0) goto done;
    const int64_t n = v[0].len / 8, *keys = v[0].buf;
    if (v[2].len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "setup_in: one version per key");
        goto done;
    }
    if (check_keys(self, keys, n) < 0 || refuse_repeated(self, keys, n, "setup_in") < 0)
        goto done;
    int64_t floats = 0;
    for (int64_t i = 0; i < n; i++) floats += key_len(d->store, keys[i]);
    if (floats != v[1].len / 4) {
        PyErr_Format(PyExc_ValueError, "setup_in: the values hold %lld floats, their keys need "
                     "%lld", (long long)(v[1].len / 4), (long long)floats);
        goto done;
    }
    void *taken_ptr;
    if (reserve(self, n) < 0 || !(result = new_array(n, 8, &taken_ptr))) goto done;
    const size_t bytes[4] = {(size_t)floats * 4, (size_t)n * 8, (size_t)n * 8, (size_t)n};
    for (int i = 0; i < 4; i++)
        if (!(scratch[i] = PyMem_Malloc(bytes[i] ? bytes[i] : 1))) {
            PyErr_NoMemory();
            Py_CLEAR(result);
            goto done;
        }
    /* The counts are read here, with the GIL (their methods keep it: any thread may call). */
    uint8_t *wanted = scratch[3];
    for (int64_t i = 0; i < n && counts; i++) wanted[i] = ic_count(counts, keys[i]) > 0;
    int64_t m;
    NOGIL_BEGIN(n + floats)
    m = dir_setup_in(d, src, keys, n, v[1].buf, v[2].buf, counts ? wanted : NULL, now,
                     taken_ptr, scratch[0], scratch[1], scratch[2]);
    NOGIL_END
    if (m < 0) {
        PyErr_NoMemory();
        Py_CLEAR(result);
    } else if (PyByteArray_Resize(result, m * 8) < 0) {
        Py_CLEAR(result);
    }
done:
    for (int i = 0; i < 4; i++) PyMem_Free(scratch[i]);
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* replicas_added(keys) -> None: keys the caller inserted as replicas join the set */
static PyObject *Directory_replicas_added(DirectoryObject *self, PyObject *args) {
    PyObject *okeys;
    if (!PyArg_ParseTuple(args, "O", &okeys)) return NULL;
    Py_buffer kv;
    if (borrow(okeys, &kv, 8, 0, "replicas_added") < 0) return NULL;
    PyObject *result = NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    if (check_keys(self, keys, n) == 0) {
        int64_t i = 0;
        while (i < n && store_state(self->d.store, keys[i]) == KEY_REPLICA) i++;
        if (i < n)
            PyErr_Format(PyExc_ValueError, "replicas_added: key %lld is not a replica here",
                         (long long)keys[i]);
        else if (refuse_repeated(self, keys, n, "replicas_added") == 0) {
            /* keys already in the set stay once: take them out first */
            rs_remove(&self->held, keys, n);
            if (rs_add(&self->held, keys, n) < 0) PyErr_NoMemory();
            else result = Py_NewRef(Py_None);
        }
    }
    PyBuffer_Release(&kv);
    return result;
}

static PyObject *Directory_replica_keys(DirectoryObject *self, PyObject *unused) {
    return PyByteArray_FromStringAndSize((const char *)self->held.keys, self->held.len * 8);
}

static PyObject *Directory_replica_count(DirectoryObject *self, PyObject *unused) {
    return PyLong_FromLongLong(self->held.len);
}

/* apply_answer(keys, flags, ni, src, pos, versions, refresh, values, counts, now) -> reports */
static PyObject *Directory_apply_answer(DirectoryObject *self, PyObject *args) {
    long long ni, src;
    double now;
    PyObject *o[6], *ocounts;
    if (!PyArg_ParseTuple(args, "OOLLOOOOOd", &o[0], &o[1], &ni, &src, &o[2], &o[3], &o[4],
                          &o[5], &ocounts, &now))
        return NULL;
    intent_counts_t *told = intent_counts(ocounts, "apply_answer");
    if (!told) return NULL;
    const directory_t *d = &self->d;
    Py_buffer v[6]; /* keys flags pos versions refresh values */
    const Py_ssize_t sizes[6] = {8, 1, 8, 8, 8, 4};
    int got = 0;
    PyObject *result = NULL;
    int64_t *by_pos = NULL;
    for (; got < 6; got++)
        if (borrow(o[got], &v[got], sizes[got], 0, "apply_answer") < 0) goto done;
    const int64_t nkeys = v[0].len / 8, n = v[2].len / 8, nr = v[4].len / 8;
    const int64_t *keys = v[0].buf, *pos = v[2].buf, *refresh = v[4].buf;
    if (ni < 0 || ni > nkeys || v[1].len < ni || v[3].len / 8 != n || src < 0
        || src >= d->world_size) {
        PyErr_SetString(PyExc_ValueError, "apply_answer: a flag per report, a version per "
                                          "position, src a rank");
        goto done;
    }
    if (check_keys(self, keys, nkeys) < 0) goto done;
    /* An answer comes from the network: its positions must name entries of this round, and
     * a refresh an answered replica entry (not a report), with the values its keys need. */
    if (!(by_pos = PyMem_Malloc((size_t)(nkeys ? nkeys : 1) * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    memset(by_pos, 0xff, (size_t)nkeys * sizeof(int64_t)); /* -1: not answered here */
    for (int64_t i = 0; i < n; i++) {
        if (pos[i] < 0 || pos[i] >= nkeys) {
            PyErr_Format(PyExc_ValueError, "apply_answer: position %lld outside the round's "
                         "%lld entries", (long long)pos[i], (long long)nkeys);
            goto done;
        }
        if (pos[i] >= ni) by_pos[pos[i]] = 1;
    }
    int64_t floats = 0;
    for (int64_t j = 0; j < nr; j++) {
        if (refresh[j] < ni || refresh[j] >= nkeys || by_pos[refresh[j]] != 1) {
            PyErr_Format(PyExc_ValueError, "apply_answer: refresh position %lld is not an "
                         "answered replica entry", (long long)refresh[j]);
            goto done;
        }
        floats += key_len(d->store, keys[refresh[j]]);
    }
    if (floats != v[5].len / 4) {
        PyErr_Format(PyExc_ValueError, "apply_answer: the values hold %lld floats, the "
                     "refreshed keys need %lld", (long long)(v[5].len / 4), (long long)floats);
        goto done;
    }
    if (reserve(self, n) < 0) goto done;
    if (ic_reserve(told, n) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t reports;
    NOGIL_BEGIN(n + floats)
    reports = dir_apply_answer(d, keys, nkeys, v[1].buf, ni, src, pos, v[3].buf, n, refresh,
                               nr, v[5].buf, floats, now, by_pos);
    NOGIL_END
    /* Reports acknowledged, with the GIL (the counts' methods keep it: any thread may call). */
    for (int64_t i = 0; i < n; i++)
        if (pos[i] < ni) ic_acknowledge(told, &keys[pos[i]], (const uint8_t *)v[1].buf + pos[i], 1);
    result = PyLong_FromLongLong(reports);
done:
    PyMem_Free(by_pos);
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* Borrows keys (int64, checked in range) and, if `other` is not NULL, a second buffer of
 * `itemsize` bytes per key; 0, or -1 with an exception set (nothing borrowed). */
static int keyed_buffers(DirectoryObject *self, PyObject *okeys, Py_buffer *kv, PyObject *other,
                         Py_buffer *ov, Py_ssize_t itemsize, const char *what) {
    if (borrow(okeys, kv, 8, 0, what) < 0) return -1;
    if (check_keys(self, kv->buf, kv->len / 8) < 0) {
        PyBuffer_Release(kv);
        return -1;
    }
    if (!other) return 0;
    if (borrow(other, ov, itemsize, 0, what) < 0) {
        PyBuffer_Release(kv);
        return -1;
    }
    if (ov->len / itemsize != kv->len / 8) {
        PyErr_Format(PyExc_ValueError, "%s: one entry per key", what);
        PyBuffer_Release(kv);
        PyBuffer_Release(ov);
        return -1;
    }
    return 0;
}

/* first_hop(keys) / next_hop(keys) -> bytearray of int64 ranks (-1: on its way here) */
static PyObject *hops(DirectoryObject *self, PyObject *okeys, int first) {
    Py_buffer kv;
    if (keyed_buffers(self, okeys, &kv, NULL, NULL, 0, first ? "first_hop" : "next_hop") < 0)
        return NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    int64_t *out;
    PyObject *result = new_array(n, 8, (void **)&out);
    if (result) {
        const directory_t *d = &self->d;
        for (int64_t i = 0; i < n; i++) {
            const int64_t hint = first ? rec_hint(d->recs, keys[i]) : d->rank;
            out[i] = hint == d->rank ? dir_next_hop(d, keys[i]) : hint;
        }
    }
    PyBuffer_Release(&kv);
    return result;
}

static PyObject *Directory_first_hop(DirectoryObject *self, PyObject *okeys) {
    return hops(self, okeys, 1);
}

static PyObject *Directory_next_hop(DirectoryObject *self, PyObject *okeys) {
    return hops(self, okeys, 0);
}

/* learn(keys, rank) -> None: rank answered for keys; their hint points there, except for
 * keys owned here (a relocation that came before the answer must not be pointed away). */
static PyObject *Directory_learn(DirectoryObject *self, PyObject *args) {
    PyObject *okeys;
    long long rank;
    if (!PyArg_ParseTuple(args, "OL", &okeys, &rank)) return NULL;
    if (rank < 0 || rank >= self->d.world_size) {
        PyErr_SetString(PyExc_ValueError, "learn: rank outside the ranks");
        return NULL;
    }
    Py_buffer kv;
    if (keyed_buffers(self, okeys, &kv, NULL, NULL, 0, "learn") < 0) return NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    PyObject *result = NULL;
    if (reserve(self, n) == 0) {
        for (int64_t i = 0; i < n; i++)
            if (store_state(self->d.store, keys[i]) != KEY_OWNER)
                rec_set_hint(&self->recs, keys[i], rank);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&kv);
    return result;
}

/* set_hints(keys, ranks) -> None: where others say keys are (int64 ranks, checked). */
static PyObject *Directory_set_hints(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *oranks;
    if (!PyArg_ParseTuple(args, "OO", &okeys, &oranks)) return NULL;
    Py_buffer kv, rv;
    if (keyed_buffers(self, okeys, &kv, oranks, &rv, 8, "set_hints") < 0) return NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf, *ranks = rv.buf;
    PyObject *result = NULL;
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (ranks[i] < 0 || ranks[i] >= self->d.world_size) bad = i;
    if (bad >= 0)
        PyErr_Format(PyExc_ValueError, "set_hints: rank %lld of key %lld is outside the ranks",
                     (long long)ranks[bad], (long long)keys[bad]);
    else if (reserve(self, n) == 0) {
        for (int64_t i = 0; i < n; i++) rec_set_hint(&self->recs, keys[i], ranks[i]);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&kv);
    PyBuffer_Release(&rv);
    return result;
}

/* update_home(keys, owners, epochs) -> None: home updates for keys homed here; the newest
 * epoch wins (updates from old and new owners may cross). */
static PyObject *Directory_update_home(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *oowners, *oepochs;
    if (!PyArg_ParseTuple(args, "OOO", &okeys, &oowners, &oepochs)) return NULL;
    Py_buffer kv, ov, ev;
    if (keyed_buffers(self, okeys, &kv, oowners, &ov, 8, "update_home") < 0) return NULL;
    PyObject *result = NULL;
    const directory_t *d = &self->d;
    const int64_t n = kv.len / 8, *keys = kv.buf, *owners = ov.buf;
    if (borrow(oepochs, &ev, 8, 0, "update_home") < 0) goto done;
    const int64_t *epochs = ev.buf;
    if (ev.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "update_home: one epoch per key");
        goto release;
    }
    for (int64_t i = 0; i < n; i++) {
        if (keys[i] % d->world_size != d->rank || owners[i] < 0 || owners[i] >= d->world_size
            || epochs[i] < 0) {
            PyErr_Format(PyExc_ValueError, "update_home: key %lld is not homed at rank %lld, "
                         "or its owner %lld or epoch %lld is bad", (long long)keys[i],
                         (long long)d->rank, (long long)owners[i], (long long)epochs[i]);
            goto release;
        }
    }
    if (reserve(self, n) < 0) goto release;
    for (int64_t i = 0; i < n; i++) {
        if (epochs[i] <= rec_home_epoch(d->recs, keys[i])) continue;
        const int32_t r = rec_get(d->recs, keys[i]);
        d->recs->home_epoch[r] = epochs[i];
        d->home_owner[keys[i] / d->world_size] = (int32_t)owners[i];
    }
    result = Py_NewRef(Py_None);
release:
    PyBuffer_Release(&ev);
done:
    PyBuffer_Release(&kv);
    PyBuffer_Release(&ov);
    return result;
}

/* set_masks(keys, intent, replicas) -> None: the owner's masks of keys (words per key each);
 * for tests, which set up states the protocol reaches only through many rounds. */
static PyObject *Directory_set_masks(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *os, *orr;
    if (!PyArg_ParseTuple(args, "OOO", &okeys, &os, &orr)) return NULL;
    if (!self->d.masks) {
        PyErr_SetString(PyExc_ValueError, "set_masks: this directory keeps no masks");
        return NULL;
    }
    Py_buffer kv, sv, rv;
    if (keyed_buffers(self, okeys, &kv, NULL, NULL, 0, "set_masks") < 0) return NULL;
    PyObject *result = NULL;
    const int64_t n = kv.len / 8, w = self->d.words, *keys = kv.buf;
    if (borrow(os, &sv, 8, 0, "set_masks") < 0) goto done;
    if (borrow(orr, &rv, 8, 0, "set_masks") < 0) {
        PyBuffer_Release(&sv);
        goto done;
    }
    if (sv.len / 8 != n * w || rv.len / 8 != n * w
        || stray_rank_bits(&self->d, sv.buf, n) || stray_rank_bits(&self->d, rv.buf, n))
        PyErr_SetString(PyExc_ValueError, "set_masks: masks need `words` words per key and "
                                          "only bits of ranks in the world");
    else if (refuse_repeated(self, keys, n, "set_masks") == 0 && reserve(self, n) == 0) {
        for (int64_t i = 0; i < n; i++) {
            const int32_t r = rec_get(&self->recs, keys[i]);
            uint64_t *m = self->recs.masks + (int64_t)r * 2 * w;
            memcpy(m, (uint64_t *)sv.buf + i * w, (size_t)w * sizeof(uint64_t));
            memcpy(m + w, (uint64_t *)rv.buf + i * w, (size_t)w * sizeof(uint64_t));
            rec_tidy(&self->recs, r);
        }
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
done:
    PyBuffer_Release(&kv);
    return result;
}

/* dense() -> (hint, forward, epoch, home_owner, home_epoch, intent, replicas) bytearrays: the
 * whole directory as dense arrays (int32, int32, int64 per key; int32, int64 per key homed
 * here; uint64 masks, words per key, zeros without masks), for tests and inspection. */
static PyObject *Directory_dense(DirectoryObject *self, PyObject *unused) {
    const directory_t *d = &self->d;
    const int64_t k = d->store->num_keys, h = d->num_home, w = d->words;
    const Py_ssize_t bytes[7] = {k * 4, k * 4, k * 8, h * 4, h * 8, k * w * 8, k * w * 8};
    void *p[7];
    PyObject *result = new_buffers(7, bytes, p);
    if (!result) return NULL;
    int32_t *hint = p[0], *forward = p[1];
    int64_t *epoch = p[2], *home_epoch = p[4];
    memcpy(p[3], d->home_owner, (size_t)h * sizeof(int32_t));
    memset(p[5], 0, (size_t)bytes[5]);
    memset(p[6], 0, (size_t)bytes[6]);
    for (int64_t key = 0; key < k; key++) {
        hint[key] = (int32_t)(key % d->world_size);
        forward[key] = -1;
        epoch[key] = 0;
    }
    for (int64_t i = 0; i < h; i++) home_epoch[i] = 0;
    const records_t *recs = &self->recs;
    for (int64_t slot = 0; slot <= recs->map.mask; slot++) {
        const int64_t key = recs->map.keys[slot];
        if (key < 0) continue;
        const int32_t r = recs->map.vals[slot];
        hint[key] = recs->hint[r];
        forward[key] = recs->forward[r];
        epoch[key] = recs->epoch[r];
        if (key % d->world_size == d->rank) home_epoch[key / d->world_size] = recs->home_epoch[r];
        if (recs->words) {
            memcpy((uint64_t *)p[5] + key * w, recs->masks + (int64_t)r * 2 * w, (size_t)w * 8);
            memcpy((uint64_t *)p[6] + key * w, recs->masks + (int64_t)r * 2 * w + w,
                   (size_t)w * 8);
        }
    }
    return result;
}

/* memory() -> (records, bytes): active keys with a record, and the bytes the directory holds
 * beyond the store (home table, records, their map, the replica set). */
static PyObject *Directory_memory(DirectoryObject *self, PyObject *unused) {
    const int64_t bytes = self->d.num_home * (int64_t)sizeof(int32_t) + rec_bytes(&self->recs)
                          + self->held.cap * (int64_t)sizeof(int64_t)
                          + outbox_capacity(&self->outbox);
    return Py_BuildValue("LL", (long long)rec_count(&self->recs), (long long)bytes);
}

/* The arrays of obj (a sequence of `count` buffers) with the item sizes of roles; 0, or -1 with
 * an exception (the borrowed views released). */
static int borrow_roles(PyObject *obj, const char *roles, int count, Py_buffer *v, carr_t *a,
                        const char *what) {
    PyObject *seq = PySequence_Fast(obj, "arrays must be a sequence");
    if (!seq) return -1;
    if (PySequence_Fast_GET_SIZE(seq) != count) {
        PyErr_Format(PyExc_ValueError, "%s: %zd arrays, expected %d", what,
                     PySequence_Fast_GET_SIZE(seq), count);
        Py_DECREF(seq);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int got = 0;
    for (; *roles && got < count; roles++) {
        if (*roles == '|') continue;
        if (borrow(items[got], &v[got], wire_itemsize(*roles), 0, what) < 0) {
            while (got--) PyBuffer_Release(&v[got]);
            Py_DECREF(seq);
            return -1;
        }
        a[got].p = v[got].buf;
        a[got].n = v[got].len / v[got].itemsize;
        got++;
    }
    Py_DECREF(seq);
    return 0;
}

static PyObject *check_result(int r, const char *why) {
    if (r < 0) return PyErr_NoMemory();
    if (r) return PyUnicode_FromString(why);
    Py_RETURN_NONE;
}

#define MAX_ARRAYS 24

/* check_message(kind, arrays) -> None, or why the message is unfit (check.h) */
static PyObject *Directory_check_message(DirectoryObject *self, PyObject *args) {
    int kind;
    PyObject *arrays;
    if (!PyArg_ParseTuple(args, "iO", &kind, &arrays)) return NULL;
    const char *roles = wire_roles(kind);
    if (!roles) Py_RETURN_NONE;
    const int count = wire_count(kind);
    Py_buffer v[MAX_ARRAYS];
    carr_t a[MAX_ARRAYS];
    if (borrow_roles(arrays, roles, count, v, a, "check_message") < 0) return NULL;
    char why[CHECK_WHY];
    const int r = check_message(&self->d, kind, a, &self->scratch, why);
    for (int i = 0; i < count; i++) PyBuffer_Release(&v[i]);
    return check_result(r, why);
}

/* check_sync_answer(keys, num_intents, num_deltas, remaining, req_id, arrays) -> None or why */
static PyObject *Directory_check_sync_answer(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *arrays;
    long long ni, nd, remaining, req_id;
    if (!PyArg_ParseTuple(args, "OLLLLO", &okeys, &ni, &nd, &remaining, &req_id, &arrays))
        return NULL;
    Py_buffer kv, v[8];
    carr_t a[8];
    if (borrow(okeys, &kv, 8, 0, "check_sync_answer: keys") < 0) return NULL;
    if (borrow_roles(arrays, "pvprpnpr", 8, v, a, "check_sync_answer") < 0) {
        PyBuffer_Release(&kv);
        return NULL;
    }
    char why[CHECK_WHY];
    const int r = check_sync_answer(&self->d, kv.buf, kv.len / 8, ni, nd, remaining, req_id, a,
                                    &self->scratch, why);
    for (int i = 0; i < 8; i++) PyBuffer_Release(&v[i]);
    PyBuffer_Release(&kv);
    return check_result(r, why);
}

/* repin(release, take) -> None: any thread (the pins have their own lock). */
static PyObject *Directory_repin(DirectoryObject *self, PyObject *args) {
    PyObject *orel, *otake;
    if (!PyArg_ParseTuple(args, "OO", &orel, &otake)) return NULL;
    Py_buffer rv, tv;
    if (borrow(orel, &rv, 8, 0, "repin: release") < 0) return NULL;
    if (borrow(otake, &tv, 8, 0, "repin: take") < 0) {
        PyBuffer_Release(&rv);
        return NULL;
    }
    PyObject *result = NULL;
    if (check_keys(self, rv.buf, rv.len / 8) == 0 && check_keys(self, tv.buf, tv.len / 8) == 0) {
        if (pins_change(&self->pins, rv.buf, rv.len / 8, tv.buf, tv.len / 8) < 0)
            PyErr_NoMemory();
        else
            result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&rv);
    PyBuffer_Release(&tv);
    return result;
}

/* pinned(keys) -> bytearray: 1 per key pinned now (a snapshot). */
static PyObject *Directory_pinned(DirectoryObject *self, PyObject *okeys) {
    Py_buffer kv;
    if (borrow(okeys, &kv, 8, 0, "pinned") < 0) return NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n);
    if (out) {
        uint8_t *flags = (uint8_t *)PyByteArray_AS_STRING(out);
        pins_lock(&self->pins);
        for (int64_t i = 0; i < n; i++) flags[i] = (uint8_t)pins_has(&self->pins, keys[i]);
        pins_unlock(&self->pins);
    }
    PyBuffer_Release(&kv);
    return out;
}

/* moves_in(src, moves, counts, now) -> None or (relocated, inserted, taken, discarded) */
static PyObject *Directory_moves_in(DirectoryObject *self, PyObject *args) {
    long long src;
    double now;
    PyObject *omoves, *ocounts;
    if (!PyArg_ParseTuple(args, "LOOd", &src, &omoves, &ocounts, &now)) return NULL;
    PyObject *seq = PySequence_Fast(omoves, "moves_in: moves must be a sequence of 12 arrays");
    if (!seq) return NULL;
    PyObject *result = NULL, *was = NULL, *taken = NULL, *inserted = NULL, *r = NULL;
    if (PySequence_Fast_GET_SIZE(seq) != 12) {
        PyErr_SetString(PyExc_ValueError, "moves_in: moves must be a sequence of 12 arrays");
        goto done;
    }
    PyObject **m = PySequence_Fast_ITEMS(seq);
    Py_ssize_t n[3];
    for (int i = 0; i < 3; i++) {
        Py_buffer kv;
        if (borrow(m[(int[]){0, 6, 9}[i]], &kv, 8, 0, "moves_in: keys") < 0) goto done;
        n[i] = kv.len / 8;
        PyBuffer_Release(&kv);
    }
    if (!n[0] && !n[1] && !n[2]) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* In the order a carrier's moves are taken in: relocations (a promoted replica's unsent
     * updates join the value that came), replica set-ups, home updates. */
    void *p;
    if (!(was = new_array(n[0], 1, &p))) goto done;
    if (n[0]) {
        PyObject *a = Py_BuildValue("(OOOOOOO)", m[0], m[1], m[2], m[3], m[4], m[5], was);
        r = a ? Directory_relocate_in(self, a) : NULL;
        Py_XDECREF(a);
        if (!r) goto done;
        Py_CLEAR(r);
    }
    if (n[1]) {
        PyObject *a = Py_BuildValue("(LOOOOd)", src, m[6], m[7], m[8], ocounts, now);
        taken = a ? Directory_setup_in(self, a) : NULL;
        Py_XDECREF(a);
        if (!taken) goto done;
    } else if (!(taken = new_array(0, 8, &p))) {
        goto done;
    }
    if (n[2]) {
        PyObject *a = Py_BuildValue("(OOO)", m[9], m[10], m[11]);
        r = a ? Directory_update_home(self, a) : NULL;
        Py_XDECREF(a);
        if (!r) goto done;
        Py_CLEAR(r);
    }
    /* The keys new in the store: those relocated here that were not replicas, and the
     * replicas taken. */
    const Py_ssize_t ntaken = PyByteArray_GET_SIZE(taken) / 8;
    const int8_t *promoted = (const int8_t *)PyByteArray_AS_STRING(was);
    Py_ssize_t fresh = 0;
    for (Py_ssize_t i = 0; i < n[0]; i++) fresh += !promoted[i];
    if (!(inserted = new_array(fresh + ntaken, 8, &p))) goto done;
    int64_t *out = p;
    if (fresh) {
        Py_buffer kv;
        if (borrow(m[0], &kv, 8, 0, "moves_in: keys") < 0) goto done;
        const int64_t *keys = kv.buf;
        for (Py_ssize_t i = 0; i < n[0]; i++)
            if (!promoted[i]) *out++ = keys[i];
        PyBuffer_Release(&kv);
    }
    memcpy(out, PyByteArray_AS_STRING(taken), (size_t)ntaken * 8);
    result = Py_BuildValue("OOOn", m[0], inserted, taken, n[1] - ntaken);
done:
    Py_XDECREF(was);
    Py_XDECREF(taken);
    Py_XDECREF(inserted);
    Py_DECREF(seq);
    return result;
}

/* redirected(keys, flags, ranks, src, counts, variant) -> (deferred, again, owned_keys,
 * owned_flags, decision): see the method's docstring. */
static PyObject *Directory_redirected(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *oflags, *oranks, *ocounts;
    long long src;
    int variant;
    if (!PyArg_ParseTuple(args, "OOOLOi", &okeys, &oflags, &oranks, &src, &ocounts, &variant))
        return NULL;
    intent_counts_t *c = intent_counts(ocounts, "redirected");
    if (!c) return NULL;
    const directory_t *d = &self->d;
    if (src < 0 || src >= d->world_size) {
        PyErr_SetString(PyExc_ValueError, "redirected: src outside the ranks");
        return NULL;
    }
    Py_buffer kv, rv, fv;
    if (keyed_buffers(self, okeys, &kv, oranks, &rv, 8, "redirected") < 0) return NULL;
    PyObject *result = NULL, *owned[2] = {NULL, NULL}, *decision = NULL;
    int64_t *again = NULL, *mine = NULL;
    uint8_t *mine_flags = NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf, *ranks = rv.buf;
    if (borrow(oflags, &fv, 1, 0, "redirected: flags") < 0) goto release;
    const uint8_t *flags = fv.buf;
    if (fv.len != n) {
        PyErr_SetString(PyExc_ValueError, "redirected: one flag per key");
        goto done;
    }
    for (int64_t i = 0; i < n; i++)
        if (ranks[i] < 0 || ranks[i] >= d->world_size) {
            PyErr_Format(PyExc_ValueError, "redirected: rank %lld of key %lld is outside the "
                         "ranks", (long long)ranks[i], (long long)keys[i]);
            goto done;
        }
    if (refuse_repeated(self, keys, n, "redirected") < 0) goto done;
    again = PyMem_Malloc((size_t)(n ? n : 1) * 8);
    mine = PyMem_Malloc((size_t)(n ? n : 1) * 8);
    mine_flags = PyMem_Malloc((size_t)(n ? n : 1));
    if (!again || !mine || !mine_flags || reserve(self, n) < 0 || ic_reserve(c, n) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    /* Where the owner says they are; keys owned here by now (the relocation came with the
     * answer) are decided at once, the rest are reported again by the next round. */
    int64_t deferred = 0, na = 0, nm = 0;
    for (int64_t i = 0; i < n; i++) {
        rec_set_hint(&self->recs, keys[i], ranks[i]);
        deferred += ranks[i] == src;
        if (store_state(d->store, keys[i]) == KEY_OWNER) {
            mine[nm] = keys[i];
            mine_flags[nm++] = flags[i];
        } else {
            again[na++] = keys[i];
        }
    }
    if (nm) {
        if (variant >= 0
            && !(decision = decide_batch(self, variant, d->rank, mine, nm, mine_flags)))
            goto done;
        ic_acknowledge(c, mine, mine_flags, nm);
    }
    if (na) ic_report_again(c, again, na);
    void *p;
    if (!(owned[0] = new_array(nm, 8, &p))) goto done;
    memcpy(p, mine, (size_t)nm * 8);
    if (!(owned[1] = new_array(nm, 1, &p))) goto done;
    memcpy(p, mine_flags, (size_t)nm);
    result = Py_BuildValue("LLOOO", (long long)deferred, (long long)na, owned[0], owned[1],
                           decision ? decision : Py_None);
done:
    PyBuffer_Release(&fv);
release:
    PyBuffer_Release(&kv);
    PyBuffer_Release(&rv);
    Py_XDECREF(owned[0]);
    Py_XDECREF(owned[1]);
    Py_XDECREF(decision);
    PyMem_Free(again);
    PyMem_Free(mine);
    PyMem_Free(mine_flags);
    return result;
}

/* route_own(keys, is_set, counts) -> (here, coming, queued, groups): see the docstring. */
static PyObject *Directory_route_own(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *ocounts;
    int is_set;
    if (!PyArg_ParseTuple(args, "OpO", &okeys, &is_set, &ocounts)) return NULL;
    const intent_counts_t *c = NULL;
    if (ocounts != Py_None && !(c = intent_counts(ocounts, "route_own"))) return NULL;
    Py_buffer kv;
    if (keyed_buffers(self, okeys, &kv, NULL, NULL, 0, "route_own") < 0) return NULL;
    const directory_t *d = &self->d;
    const int64_t n = kv.len / 8, *keys = kv.buf, world = d->world_size;
    PyObject *result = NULL, *bufs[3] = {NULL, NULL, NULL}, *groups = NULL;
    int64_t *hop = NULL, *count = NULL;
    int64_t nhere = 0;
    for (int64_t i = 0; i < n; i++) {
        const int st = store_state(d->store, keys[i]);
        nhere += is_set ? st == KEY_OWNER : st != KEY_NONE;
    }
    if (nhere == n) { /* the usual case with intent: everything is here */
        result = Py_BuildValue("OOOO", Py_True, Py_None, Py_None, Py_None);
        goto done;
    }
    hop = PyMem_Malloc((size_t)(n ? n : 1) * 8);
    count = PyMem_Calloc((size_t)world + 3, 8); /* per rank, then here, coming, queued */
    if (!hop || !count) {
        PyErr_NoMemory();
        goto done;
    }
    /* -1 here, -2 on its way here as this node's intent is answered (an owner answers a
     * report only after sending the key: wait here rather than chase it), -3 on its way here
     * (a relocation not received yet: queued), else the rank to send it to. */
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        const int st = store_state(d->store, key);
        if (is_set ? st == KEY_OWNER : st != KEY_NONE) {
            hop[i] = -1;
        } else {
            int32_t r = c ? km_get(&c->map, key) : -1;
            if (r >= 0 && c->count[r] > 0 && !c->told[r]) {
                hop[i] = -2;
            } else {
                const int64_t hint = rec_hint(d->recs, key);
                const int64_t h = hint == d->rank ? dir_next_hop(d, key) : hint;
                hop[i] = h < 0 ? -3 : h;
            }
        }
        count[hop[i] < 0 ? world - 1 - hop[i] : hop[i]]++;
    }
    void *p[3];
    for (int k = 0; k < 3; k++)
        if (!(bufs[k] = new_array(count[world + k], 8, &p[k]))) goto done;
    int64_t at[3] = {0, 0, 0}, parts = 0;
    for (int64_t i = 0; i < n; i++)
        if (hop[i] < 0) ((int64_t *)p[-1 - hop[i]])[at[-1 - hop[i]]++] = i;
    for (int64_t r = 0; r < world; r++) parts += count[r] > 0;
    if (!(groups = PyTuple_New(parts))) goto done;
    for (int64_t r = 0, part = 0; r < world; r++) {
        if (!count[r]) continue;
        int64_t *idx;
        PyObject *b = new_array(count[r], 8, (void **)&idx);
        if (!b) goto done;
        for (int64_t i = 0, j = 0; i < n; i++)
            if (hop[i] == r) idx[j++] = i;
        PyObject *view = wire_view(b, 'k', count[r], 0);
        Py_DECREF(b);
        PyObject *item = view ? Py_BuildValue("LN", (long long)r, view) : NULL;
        if (!item) goto done;
        PyTuple_SET_ITEM(groups, part++, item);
    }
    PyObject *v[3];
    for (int k = 0; k < 3; k++) v[k] = wire_view(bufs[k], 'k', count[world + k], 0);
    if (v[0] && v[1] && v[2]) result = Py_BuildValue("NNNO", v[0], v[1], v[2], groups);
    else
        for (int k = 0; k < 3; k++) Py_XDECREF(v[k]);
done:
    for (int k = 0; k < 3; k++) Py_XDECREF(bufs[k]);
    Py_XDECREF(groups);
    PyMem_Free(hop);
    PyMem_Free(count);
    PyBuffer_Release(&kv);
    return result;
}

/* check_answer(asked, keys, positions, remaining, floats) -> None or why: see the docstring. */
static PyObject *Directory_check_answer(DirectoryObject *self, PyObject *args) {
    PyObject *oasked, *okeys, *opos;
    long long remaining, floats;
    if (!PyArg_ParseTuple(args, "OOOLL", &oasked, &okeys, &opos, &remaining, &floats))
        return NULL;
    Py_buffer av, kv, pv;
    if (borrow(oasked, &av, 8, 0, "check_answer: asked") < 0) return NULL;
    if (borrow(okeys, &kv, 8, 0, "check_answer: keys") < 0) {
        PyBuffer_Release(&av);
        return NULL;
    }
    if (borrow(opos, &pv, 8, 0, "check_answer: positions") < 0) {
        PyBuffer_Release(&av);
        PyBuffer_Release(&kv);
        return NULL;
    }
    const int64_t na = av.len / 8, n = pv.len / 8, *asked = av.buf, *keys = kv.buf,
                  *pos = pv.buf;
    PyObject *result = NULL;
    if (kv.len / 8 != na) {
        PyErr_SetString(PyExc_ValueError, "check_answer: one key per asked position");
        goto done;
    }
    if (n > remaining) {
        result = PyUnicode_FromString("more answers than the request waits for");
        goto done;
    }
    int64_t need = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t lo = 0, hi = na; /* asked ascends: the first entry >= pos[i] */
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (asked[mid] < pos[i]) lo = mid + 1;
            else hi = mid;
        }
        if (lo == na || asked[lo] != pos[i]) {
            result = PyUnicode_FromString("answer positions that the request did not ask for");
            goto done;
        }
        if (floats >= 0) {
            const int64_t key = keys[lo];
            if (key < 0 || key >= self->d.store->num_keys) {
                PyErr_SetString(PyExc_ValueError, "check_answer: a key outside the key space");
                goto done;
            }
            need += key_len(self->d.store, key);
        }
    }
    if (floats >= 0 && need != floats)
        result = PyUnicode_FromFormat("%lld floats for %lld keys that hold %lld", floats,
                                      (long long)n, (long long)need);
    else
        result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&av);
    PyBuffer_Release(&kv);
    PyBuffer_Release(&pv);
    return result;
}

static PyMethodDef Directory_methods[] = {
    {"pinned", (PyCFunction)Directory_pinned, METH_O,
     "pinned(keys) -> bytearray. Per key: 1 if a worker has it pinned now (repin)."},
    {"repin", (PyCFunction)Directory_repin, METH_VARARGS,
     "repin(release, take) -> None. Release one pin of each key of release (int64), then pin "
     "each key of take once. An intent report that would relocate a pinned key owned here is "
     "answered with a redirect to this node (report again), so the key leaves only when its "
     "pins are gone. Any thread; the pins have their own lock."},
    {"check_message", (PyCFunction)Directory_check_message, METH_VARARGS,
     "check_message(kind, arrays) -> None or str. Whether a received message's arrays (flat "
     "over its sections, as protocol.Message.arrays) fit this node: a keyed request's keys, "
     "per-key arrays and rows, and a carrier's moves (native/check.h); the reason if not. "
     "Changes nothing."},
    {"check_sync_answer", (PyCFunction)Directory_check_sync_answer, METH_VARARGS,
     "check_sync_answer(keys, num_intents, num_deltas, remaining, req_id, arrays) -> None or "
     "str. Whether a SYNC_RESP's 8 answer arrays fit the round request they answer (its "
     "entries' keys, how many are intent reports and deltas, how many are unanswered)."},
    {"first_hop", (PyCFunction)Directory_first_hop, METH_O,
     "first_hop(keys) -> bytearray (int64). Where a request of this node's own for keys (not "
     "owned here) goes first: the hint, unless it names this node; then next_hop."},
    {"next_hop", (PyCFunction)Directory_next_hop, METH_O,
     "next_hop(keys) -> bytearray (int64). Where to pass requests for keys not owned here: "
     "keys homed here to the owner the home table names, others to where this node sent "
     "them; -1: on its way here."},
    {"learn", (PyCFunction)Directory_learn, METH_VARARGS,
     "learn(keys, rank) -> None. rank answered for keys: their hints point there, except for "
     "keys owned here."},
    {"set_hints", (PyCFunction)Directory_set_hints, METH_VARARGS,
     "set_hints(keys, ranks) -> None. Hints where others say keys are (ValueError for a rank "
     "outside the world, nothing changed)."},
    {"update_home", (PyCFunction)Directory_update_home, METH_VARARGS,
     "update_home(keys, owners, epochs) -> None. Home updates for keys homed here (int64 "
     "each); the newest epoch wins. ValueError (nothing changed) for a key homed elsewhere or "
     "a bad owner or epoch."},
    {"set_masks", (PyCFunction)Directory_set_masks, METH_VARARGS,
     "set_masks(keys, intent, replicas) -> None. Sets owned keys' masks (tests)."},
    {"dense", (PyCFunction)Directory_dense, METH_NOARGS,
     "dense() -> 7 bytearrays. The directory as dense arrays (tests, inspection): hint, "
     "forward (int32), epoch (int64) per key, home_owner (int32), home_epoch (int64) per key "
     "homed here, intent, replicas (uint64, words per key)."},
    {"memory", (PyCFunction)Directory_memory, METH_NOARGS,
     "memory() -> (records, bytes). Active keys with a record, and the directory's bytes."},
    {"apply_answer", (PyCFunction)Directory_apply_answer, METH_VARARGS,
     "apply_answer(keys, flags, ni, src, pos, versions, refresh, values, counts, now) -> "
     "reports acknowledged. A SYNC_RESP's answers taken in at the round's origin "
     "(directory.h, dir_apply_answer): hints learned, reports acknowledged in counts (this "
     "node's IntentCounts), replicas refreshed and synced. Checks the answer against the "
     "round first (ValueError, nothing changed)."},
    {"setup_in", (PyCFunction)Directory_setup_in, METH_VARARGS,
     "setup_in(src, keys, values, versions, counts, now) -> bytearray. Replicas from their "
     "owner src (directory.h, dir_setup_in): the keys not held here that this node still "
     "wants (intent count > 0 in counts, an IntentCounts, or None: none wanted) become "
     "replicas (synced at now) and join the replica set; returns them (int64). ValueError "
     "(nothing changed) for repeated keys or sizes that disagree."},
    {"replicas_added", (PyCFunction)Directory_replicas_added, METH_VARARGS,
     "replicas_added(keys) -> None. Keys inserted as replicas by the caller join the set."},
    {"replica_keys", (PyCFunction)Directory_replica_keys, METH_NOARGS,
     "replica_keys() -> bytearray. The keys held here as replicas, ascending (int64)."},
    {"replica_count", (PyCFunction)Directory_replica_count, METH_NOARGS,
     "replica_count() -> int. How many keys are held here as replicas."},
    {"round_build", (PyCFunction)Directory_round_build, METH_VARARGS,
     "round_build(counts, variant, reports) -> None or (deferred, told_keys, told_flags, "
     "decided, decision, reports_sent, drop_keys, deltas, parts, keys, flags). A sync round "
     "after its workers' intents were collected into counts (this node's IntentCounts), in "
     "one call: the keys whose intent state changed, less those deferred (an ended intent for "
     "a key a worker here has pinned: reported again next round; deferred says how many); "
     "with reports false (nothing acts on intent) all are taken as told; else the keys owned "
     "here are decided on (variant; decision as decide returns it, or None) and taken as told "
     "(decided: how many), and the others (reports_sent of them) go with the replicas' "
     "deltas and checks into each owner's SYNC (round_requests). told_keys, told_flags: "
     "bytearrays (int64, uint8) of the keys taken as told here; drop_keys: the replicas "
     "dropped; deltas: how many deltas are sent; parts: per rank with entries (rank, entries, "
     "the SYNC's 10 keyed arrays); keys: every entry's key; flags: the sent reports' flags "
     "(uint8 bytearray). None when nothing changed and no replica is held (an idle round)."},
    {"round_requests", (PyCFunction)Directory_round_requests, METH_VARARGS,
     "round_requests(rkeys, rflags) -> (drop_keys, counts, keys, ikeys, ipos, iflags, "
     "dkeys, dpos, drows, dver, ckeys, cpos, cver), numpy arrays of the codec's dtypes. A sync "
     "round's SYNC requests (directory.h, dir_round_*): reports rkeys (not owned here, unique; uint8 "
     "flags) and the replicas held here. Replicas whose intent ended are dropped (their "
     "keys; their slots are free again), the others send their delta or their version; every entry "
     "(keys: all, numbered intents, deltas, checks) is grouped by its hint: counts[section * "
     "world_size + rank] entries of each section go to each rank."},
    {"serve_sync", (PyCFunction)Directory_serve_sync, METH_VARARGS,
     "serve_sync(variant, origin, ikeys, ipos, iflags, dkeys, dpos, drows, dver, ckeys, cpos, "
     "cver) -> (answer, decision, rest_index, rest_hop). Serves a SYNC from origin (its three "
     "sections; see directory.h, dir_sync_*): merges the owned deltas, answers owned deltas "
     "and checks, decides on owned intent reports (decision as decide returns it, or None), "
     "redirects reports for keys elsewhere and returns deltas and checks for keys that went "
     "to origin. answer: the 8 keyed arrays of the SYNC_RESP (numpy arrays: positions, "
     "versions, refresh positions, values, redirect positions, ranks, back positions, rows), "
     "or None when nothing is answered here; rest_index, rest_hop: the entries left (numbered "
     "over the sections) and where they go next (-1: on their way here), or None. Checks "
     "every buffer first (keys in range, intent reports unique, sizes that agree): ValueError "
     "or IndexError, nothing changed."},
    {"decide", (PyCFunction)Directory_decide, METH_VARARGS,
     "decide(variant, node, keys, has_intent) -> (dropped, relocated, per_rank). Node `node` "
     "reports whether it has intent for keys (unique, uint8 flags), all owned here: the "
     "policy decides and its decision is carried out (directory.h, dir_decide_*). The "
     "relocations, replica set-ups and home updates it makes join the moves held for each "
     "peer (take_moves). dropped: replicas dropped; relocated: the keys that left (int64, "
     "ordered by destination; per_rank: how many went to each rank), both None when none "
     "left. ValueError (nothing changed) if a key is not owned here."},
    {"moves_in", (PyCFunction)Directory_moves_in, METH_VARARGS,
     "moves_in(src, moves, counts, now) -> None or (relocated, inserted, taken, discarded). A "
     "carrier's 12 move arrays from src taken in, in one call: relocations (relocate_in), "
     "replica set-ups (setup_in, with this node's IntentCounts or None), home updates "
     "(update_home), raising as those do. relocated: the relocations' keys (the array "
     "given); inserted: the keys new in the store (relocated keys that were not replicas, "
     "and the replicas taken; int64 bytearray); taken: the replicas taken (int64 bytearray); "
     "discarded: the set-ups not taken. None when every section is empty."},
    {"redirected", (PyCFunction)Directory_redirected, METH_VARARGS,
     "redirected(keys, flags, ranks, src, counts, variant) -> (deferred, again, owned_keys, "
     "owned_flags, decision). Intent reports (unique keys, uint8 flags) that src answered "
     "with where to report them (ranks): the keys' hints point there; keys owned here by now "
     "(the relocation came with the answer) are decided on (variant; decision as decide "
     "returns it, or None) and taken as told in counts (this node's IntentCounts); the others "
     "(again of them) are reported again by the next round. deferred: how many ranks name "
     "src itself (it deferred them: a worker there uses the key now); owned_keys, "
     "owned_flags: bytearrays (int64, uint8) of the keys decided here."},
    {"route_own", (PyCFunction)Directory_route_own, METH_VARARGS,
     "route_own(keys, is_set, counts) -> (here, coming, queued, groups). Where this node's own "
     "keyed request for keys goes, in one pass: here (True when every key is: held here, or "
     "owned here for a set) or the indices of those held here; coming: of those not here "
     "whose intent this node reported and the owner has not answered yet (counts, this "
     "node's IntentCounts, or None: none; the key comes with the answer, so the request waits "
     "here); queued: of those on their way here (a relocation not received yet); groups: "
     "((rank, indices), ...) of the rest, by the rank to send them to (the hint, else the next "
     "hop). Indices ascend (int64 arrays); None for each when here is True."},
    {"check_answer", (PyCFunction)Directory_check_answer, METH_VARARGS,
     "check_answer(asked, keys, positions, remaining, floats) -> None or str. Whether an "
     "answer's positions (int64) answer a worker's request of this node that asked for keys "
     "at positions asked (ascending), at most remaining of them, and (floats >= 0: a pull's "
     "answer) whether its values hold the floats those keys need; the reason if not."},
    {"take_moves", (PyCFunction)Directory_take_moves, METH_O,
     "take_moves(dst) -> None or a tuple of 12 numpy arrays. The moves held for rank dst, as "
     "a carrier's move sections (protocol.MOVE_SECTIONS; each section's entries in the order "
     "decided); nothing is held for dst afterwards. Engine thread."},
    {"held_peers", (PyCFunction)Directory_held_peers, METH_NOARGS,
     "held_peers() -> tuple of ints. The ranks that moves are held for."},
    {"relocate_in", (PyCFunction)Directory_relocate_in, METH_VARARGS,
     "relocate_in(keys, values, versions, s_in, r_in, epochs, was_replica) -> None. Keys "
     "arrive as main copies (replicas promoted, others get a slot and are inserted). "
     "ValueError (nothing changed) if a key is owned here already or repeats, or a buffer "
     "disagrees with the keys."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DirectoryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adapm._native.Directory",
    .tp_basicsize = sizeof(DirectoryObject),
    .tp_dealloc = (destructor)Directory_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Directory(store, rank, world_size, masks): serving SYNCs, the owner's "
              "decisions and relocations over a node's store and its directory "
              "(native/directory.h), which it owns: the home table and the records of active "
              "keys. masks: whether the variant keeps intent and replica masks (acts on "
              "intent).",
    .tp_methods = Directory_methods,
    .tp_init = (initproc)Directory_init,
    .tp_new = PyType_GenericNew,
};

/* --- the owner's fast path for zmq_io.c (module.h) ------------------------------------- */

int directory_check(PyObject *o) { return PyObject_TypeCheck(o, &DirectoryType); }

int directory_owns_request(PyObject *directory, int kind, const carr_t *a) {
    DirectoryObject *self = (DirectoryObject *)directory;
    if (!self->ready || (kind != WIRE_PULL && kind != WIRE_PUSH && kind != WIRE_SET)) return 0;
    char why[CHECK_WHY];
    const int r = check_message(&self->d, kind, a, &self->scratch, why);
    if (r) return r < 0 ? -1 : 0; /* refused: the Python path drops and counts it */
    const int64_t *keys = a[0].p;
    for (int64_t i = 0; i < a[0].n; i++)
        if (store_state(self->d.store, keys[i]) != KEY_OWNER) return 0;
    return 1;
}

int64_t directory_request_floats(PyObject *directory, const carr_t *a) {
    const store_t *s = ((DirectoryObject *)directory)->d.store;
    const int64_t *keys = a[0].p;
    int64_t floats = 0;
    for (int64_t i = 0; i < a[0].n; i++) floats += key_len(s, keys[i]);
    return floats;
}

int64_t directory_serve_owned(PyObject *directory, int kind, const carr_t *a, float *values,
                              int64_t floats, int64_t *missing) {
    const store_t *s = ((DirectoryObject *)directory)->d.store;
    if (kind == WIRE_PULL) return store_gather(s, a[0].p, a[0].n, values, floats, missing);
    return store_scatter(s, a[0].p, a[0].n, a[2].p, a[2].n, missing, kind == WIRE_SET);
}

int register_directory_type(PyObject *module) {
    return add_type(module, &DirectoryType, "Directory");
}
