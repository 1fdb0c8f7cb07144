/* CPython binding of the directory (directory.h): type adapm._native.Directory.
 *
 * A Directory keeps a reference to the node's Store object and owns the rest of the directory:
 * the home table's owners and the records of active keys (records.h). Each method checks its
 * batch buffers, reserves the records its pass may create, and makes one call into
 * directory.c.
 */
#include "directory_object.h"
#include "policy.h"
#include "serve_wire.h"


/* The store's repeated-key check (module.h) for this directory's batches. */
int dm_refuse_repeated(DirectoryObject *self, const int64_t *keys, int64_t n,
                       const char *what) {
    return refuse_repeats((StoreObject *)self->store, keys, n, what);
}

static void Directory_dealloc(DirectoryObject *self) {
    rs_free(&self->held);
    check_scratch_free(&self->scratch);
    outbox_free(&self->outbox);
    for (size_t i = 0; i < sizeof self->decide_buf / sizeof self->decide_buf[0]; i++)
        scratch_free(&self->decide_buf[i]);
    for (size_t i = 0; i < sizeof self->round_buf / sizeof self->round_buf[0]; i++)
        scratch_free(&self->round_buf[i]);
    answer_fast_free(&self->fast, 1);
    sync_fast_free(&self->fast);
    Py_XDECREF((PyObject *)self->fast.counts_obj);
    Py_XDECREF(self->counts);
    if (self->ready) {
        rec_free(&self->recs);
        pins_free(&self->pins);
    }
    free(self->d.home_owner);
    Py_XDECREF(self->store);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Room for n new records, or MemoryError. */
int dm_reserve(DirectoryObject *self, int64_t n) {
    if (dir_reserve(&self->d, n) == 0) return 0;
    PyErr_NoMemory();
    return -1;
}

static int Directory_init(DirectoryObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"store", "rank", "world_size", "masks", "average", "channel", NULL};
    PyObject *store;
    long long rank, world_size, channel = 0;
    int masks, average = 0;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Directory is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!LLp|pL", kwlist, &StoreType, &store,
                                     &rank, &world_size, &masks, &average, &channel))
        return -1;
    if (world_size < 1 || world_size > INT32_MAX || rank < 0 || rank >= world_size) {
        PyErr_SetString(PyExc_ValueError, "Directory: rank must be in [0, world_size)");
        return -1;
    }
    const store_t *s = &((StoreObject *)store)->s;
    if (s->rank != rank || s->world != world_size || channel < 0 || channel >= s->shards) {
        PyErr_SetString(PyExc_ValueError, "Directory: rank and world_size must be the store's, "
                                          "channel one of its channels");
        return -1;
    }
    directory_t *d = &self->d;
    d->store = s;
    d->channel = channel;
    d->channels = s->shards;
    d->rank = rank;
    d->world_size = world_size;
    d->words = (world_size + 63) / 64;
    d->masks = masks;
    d->average = average;
    const int64_t num_keys = d->store->num_keys;
    /* This channel's home keys: every channels-th of the node's, from the channel's. */
    const int64_t node_home = num_keys > rank ? (num_keys - rank + world_size - 1) / world_size : 0;
    d->num_home = node_home > channel ? (node_home - channel + d->channels - 1) / d->channels : 0;
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
    d->alloc = &((StoreObject *)store)->alloc[channel];
    d->held = &self->held;
    self->ready = 1;
    return 0;
}

int dm_check_keys(const DirectoryObject *self, const int64_t *keys, int64_t n) {
    const int64_t bad = store_check_keys(keys, n, self->d.store->num_keys);
    if (bad >= 0) {
        PyErr_Format(PyExc_IndexError, "keys[%lld] = %lld is outside [0, %lld)", (long long)bad,
                     (long long)keys[bad], (long long)self->d.store->num_keys);
        return -1;
    }
    const directory_t *d = &self->d;
    if (d->channels > 1)
        for (int64_t i = 0; i < n; i++)
            if (!dir_in_channel(d, keys[i])) {
                PyErr_Format(PyExc_IndexError, "keys[%lld] = %lld is not of channel %lld of %lld",
                             (long long)i, (long long)keys[i], (long long)d->channel,
                             (long long)d->channels);
                return -1;
            }
    return 0;
}

/* relocate_in(keys, values, versions, s_in, r_in, epochs, slots, was_replica) -> None */
PyObject *Directory_relocate_in(DirectoryObject *self, PyObject *args) {
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
    if (dm_check_keys(self, v[0].buf, n) < 0
        || dm_refuse_repeated(self, v[0].buf, n, "relocate_in") < 0)
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
    if (dm_reserve(self, n) < 0) goto done;
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
PyObject *dm_new_array(Py_ssize_t n, Py_ssize_t itemsize, void **ptr) {
    PyObject *b = PyByteArray_FromStringAndSize(NULL, n * itemsize);
    if (b) *ptr = PyByteArray_AS_STRING(b);
    return b;
}

PyObject *dm_keys_copy(const int64_t *keys, int64_t n) {
    void *p;
    PyObject *buf = dm_new_array(n, 8, &p);
    if (!buf) return NULL;
    if (n) memcpy(p, keys, (size_t)n * 8);
    PyObject *view = wire_view(buf, 'k', n, 0);
    Py_DECREF(buf);
    return view;
}

/* A tuple of `count` new bytearrays of the given byte sizes, their data pointers in ptrs. */
PyObject *dm_new_buffers(int count, const Py_ssize_t *bytes, void **ptrs) {
    PyObject *tuple = PyTuple_New(count);
    if (!tuple) return NULL;
    for (int i = 0; i < count; i++) {
        PyObject *b = dm_new_array(bytes[i], 1, &ptrs[i]);
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
PyObject *dm_as_views(PyObject *const *bufs, const char *roles, int n) {
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

/* Intent counts of this node's (an IntentCounts), or NULL with an exception set. */
intent_counts_t *dm_intent_counts(PyObject *obj, const char *what) {
    if (!PyObject_TypeCheck(obj, &IntentCountsType) || !((IntentCountsObject *)obj)->ready) {
        PyErr_Format(PyExc_TypeError, "%s: counts must be an initialised IntentCounts", what);
        return NULL;
    }
    return &((IntentCountsObject *)obj)->c;
}

/* setup_in(src, keys, values, versions, counts, now) -> bytearray of the keys taken */
PyObject *Directory_setup_in(DirectoryObject *self, PyObject *args) {
    long long src;
    double now;
    PyObject *o[3], *ocounts;
    if (!PyArg_ParseTuple(args, "LOOOOd", &src, &o[0], &o[1], &o[2], &ocounts, &now))
        return NULL;
    const intent_counts_t *counts = NULL;
    if (ocounts != Py_None && !(counts = dm_intent_counts(ocounts, "setup_in"))) return NULL;
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
    if (dm_check_keys(self, keys, n) < 0 || dm_refuse_repeated(self, keys, n, "setup_in") < 0)
        goto done;
    int64_t floats = 0;
    for (int64_t i = 0; i < n; i++) floats += key_len(d->store, keys[i]);
    if (floats != v[1].len / 4) {
        PyErr_Format(PyExc_ValueError, "setup_in: the values hold %lld floats, their keys need "
                     "%lld", (long long)(v[1].len / 4), (long long)floats);
        goto done;
    }
    void *taken_ptr;
    if (dm_reserve(self, n) < 0 || !(result = dm_new_array(n, 8, &taken_ptr))) goto done;
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
    if (dm_check_keys(self, keys, n) == 0) {
        int64_t i = 0;
        while (i < n && store_state(self->d.store, keys[i]) == KEY_REPLICA) i++;
        if (i < n)
            PyErr_Format(PyExc_ValueError, "replicas_added: key %lld is not a replica here",
                         (long long)keys[i]);
        else if (dm_refuse_repeated(self, keys, n, "replicas_added") == 0) {
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

/* Borrows keys (int64, checked in range) and, if `other` is not NULL, a second buffer of
 * `itemsize` bytes per key; 0, or -1 with an exception set (nothing borrowed). */
int dm_keyed_buffers(DirectoryObject *self, PyObject *okeys, Py_buffer *kv, PyObject *other,
                     Py_buffer *ov, Py_ssize_t itemsize, const char *what) {
    if (borrow(okeys, kv, 8, 0, what) < 0) return -1;
    if (dm_check_keys(self, kv->buf, kv->len / 8) < 0) {
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

/* next_hop(keys) -> bytearray of int64 ranks (-1: on its way here) */
static PyObject *Directory_next_hop(DirectoryObject *self, PyObject *okeys) {
    Py_buffer kv;
    if (dm_keyed_buffers(self, okeys, &kv, NULL, NULL, 0, "next_hop") < 0) return NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    int64_t *out;
    PyObject *result = dm_new_array(n, 8, (void **)&out);
    if (result)
        for (int64_t i = 0; i < n; i++) out[i] = dir_next_hop(&self->d, keys[i]);
    PyBuffer_Release(&kv);
    return result;
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
    if (dm_keyed_buffers(self, okeys, &kv, NULL, NULL, 0, "learn") < 0) return NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    PyObject *result = NULL;
    if (dm_reserve(self, n) == 0) {
        for (int64_t i = 0; i < n; i++)
            if (store_state(self->d.store, keys[i]) != KEY_OWNER)
                rec_set_hint(&self->recs, keys[i], rank);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&kv);
    return result;
}

/* update_home(keys, owners, epochs) -> None: home updates for keys homed here; the newest
 * epoch wins (updates from old and new owners may cross). */
PyObject *Directory_update_home(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *oowners, *oepochs;
    if (!PyArg_ParseTuple(args, "OOO", &okeys, &oowners, &oepochs)) return NULL;
    Py_buffer kv, ov, ev;
    if (dm_keyed_buffers(self, okeys, &kv, oowners, &ov, 8, "update_home") < 0) return NULL;
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
    if (dm_reserve(self, n) < 0) goto release;
    for (int64_t i = 0; i < n; i++) {
        if (epochs[i] <= rec_home_epoch(d->recs, keys[i])) continue;
        const int32_t r = dir_rec_get(d, keys[i]);
        rec_at(d->recs, r)->home_epoch = epochs[i];
        d->home_owner[dir_home_index(d, keys[i])] = (int32_t)owners[i];
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
    if (dm_keyed_buffers(self, okeys, &kv, NULL, NULL, 0, "set_masks") < 0) return NULL;
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
    else if (dm_refuse_repeated(self, keys, n, "set_masks") == 0 && dm_reserve(self, n) == 0) {
        for (int64_t i = 0; i < n; i++) {
            const int32_t r = rec_get(&self->recs, keys[i]);
            uint64_t *m = rec_mask_words(&self->recs, r);
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
    PyObject *result = dm_new_buffers(7, bytes, p);
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
        const int64_t key = recs->map.slots[slot].key;
        if (key < 0) continue;
        const int32_t r = recs->map.slots[slot].val;
        const rec_t *e = rec_at(recs, r);
        hint[key] = e->hint;
        forward[key] = e->forward;
        epoch[key] = e->epoch;
        if (key % d->world_size == d->rank) home_epoch[dir_home_index(d, key)] = e->home_epoch;
        if (recs->words) {
            memcpy((uint64_t *)p[5] + key * w, rec_mask_words(recs, r), (size_t)w * 8);
            memcpy((uint64_t *)p[6] + key * w, rec_mask_words(recs, r) + w,
                   (size_t)w * 8);
        }
    }
    /* Owned keys without a record keep this node's own bit of S as a told flag. */
    if (recs->words && d->counts)
        for (int64_t key = 0; key < k; key++)
            if (rec_find(recs, key) < 0 && store_state(d->store, key) == KEY_OWNER
                && dir_own_told(d, key))
                ((uint64_t *)p[5])[key * w + d->rank / 64] |= (uint64_t)1 << (d->rank % 64);
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
    if (dm_check_keys(self, rv.buf, rv.len / 8) == 0
        && dm_check_keys(self, tv.buf, tv.len / 8) == 0) {
        int rc;
        const int64_t nr = rv.len / 8, nt = tv.len / 8;
        /* The GIL is let go only if the pins are busy (or the keys many): the engine thread
         * may hold them while it needs the GIL (it keeps them locked from a check to the keys'
         * leaving; see dir_sync_pins), so a worker must not wait for them holding it. Letting
         * it go for every change cost a KGE worker on 2 nodes ~90 us a call, waiting to take
         * the GIL back from the engine thread, for ~20 us of work. */
        if (nr + nt >= RELEASE_GIL_FROM
            || !pins_try_change(&self->pins, rv.buf, nr, tv.buf, nt, &rc)) {
            Py_BEGIN_ALLOW_THREADS
            rc = pins_change(&self->pins, rv.buf, nr, tv.buf, nt);
            Py_END_ALLOW_THREADS
        }
        if (rc < 0)
            PyErr_NoMemory();
        else
            result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&rv);
    PyBuffer_Release(&tv);
    return result;
}

/* use_counts(counts) -> None: this node's intent counts (engine thread; once). */
static PyObject *Directory_use_counts(DirectoryObject *self, PyObject *ocounts) {
    const intent_counts_t *c = dm_intent_counts(ocounts, "use_counts");
    if (!c) return NULL;
    if (self->counts && self->counts != ocounts) {
        PyErr_SetString(PyExc_ValueError, "use_counts: this directory has other counts");
        return NULL;
    }
    if (!self->counts) self->counts = Py_NewRef(ocounts);
    self->d.counts = c;
    Py_RETURN_NONE;
}

/* pinned(keys) -> bytes of int32: how many times each key is pinned now (0: not). For tests and
 * inspection; any thread. */
static PyObject *Directory_pinned(DirectoryObject *self, PyObject *okeys) {
    Py_buffer kv;
    if (dm_keyed_buffers(self, okeys, &kv, NULL, NULL, 0, "pinned") < 0) return NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    int32_t *out;
    PyObject *result = dm_new_array(n, 4, (void **)&out);
    if (result) {
        pins_lock(&self->pins);
        for (int64_t i = 0; i < n; i++) {
            const int32_t count = km_get(&self->pins.map, keys[i]);
            out[i] = count > 0 ? count : 0;
        }
        pins_unlock(&self->pins);
    }
    PyBuffer_Release(&kv);
    return result;
}

static PyMethodDef Directory_methods[] = {
    {"repin", (PyCFunction)Directory_repin, METH_VARARGS,
     "repin(release, take) -> None. Release one pin of each key of release (int64), then pin "
     "each key of take once. An intent report that would relocate a pinned key owned here is "
     "answered with a redirect to this node (report again), so the key leaves only when its "
     "pins are gone. Any thread; the pins have their own lock."},
    {"use_counts", (PyCFunction)Directory_use_counts, METH_O,
     "use_counts(counts) -> None. This node's IntentCounts: a key owned here whose only state "
     "is this node's own intent then needs no record (its told flag is that bit of S). Once, "
     "before the first round; engine thread."},
    {"pinned", (PyCFunction)Directory_pinned, METH_O,
     "pinned(keys) -> bytes of int32: how many times each key is pinned now (tests)."},
    {"check_message", (PyCFunction)Directory_check_message, METH_VARARGS,
     "check_message(kind, arrays) -> None or str. Whether a received message's arrays (flat "
     "over its sections, as protocol.Message.arrays) fit this node: a keyed request's keys, "
     "per-key arrays and rows, and a carrier's moves (native/check.h); the reason if not. "
     "Changes nothing."},
    {"check_sync_answer", (PyCFunction)Directory_check_sync_answer, METH_VARARGS,
     "check_sync_answer(keys, num_intents, num_deltas, remaining, req_id, arrays) -> None or "
     "str. Whether a SYNC_RESP's 8 answer arrays fit the round request they answer (its "
     "entries' keys, how many are intent reports and deltas, how many are unanswered)."},
    {"next_hop", (PyCFunction)Directory_next_hop, METH_O,
     "next_hop(keys) -> bytearray (int64). Where to pass requests for keys not owned here: "
     "keys homed here to the owner the home table names, others to where this node sent "
     "them; -1: on its way here."},
    {"learn", (PyCFunction)Directory_learn, METH_VARARGS,
     "learn(keys, rank) -> None. rank answered for keys: their hints point there, except for "
     "keys owned here."},
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
     "round_build(counts, variant, reports, first_req, exact=True) -> None or (deferred, "
     "told_keys, "
     "told_flags, decided, decision, reports_sent, drop_keys, deltas, parts, keys, flags). A "
     "sync round after its workers' intents were collected into counts (this node's "
     "IntentCounts), in one call: the keys whose intent state changed, less those deferred (an "
     "ended intent for a key a worker here has pinned: reported again next round; deferred "
     "says how many); with reports false (nothing acts on intent) all are taken as told; else "
     "the keys owned here are decided on (variant; decision as decide returns it, or None) and "
     "taken as told (decided: how many), and the others (reports_sent of them) go with the "
     "replicas' deltas and checks into each owner's SYNC (round_requests). told_keys, "
     "told_flags: bytearrays (int64, uint8) of the keys taken as told here; drop_keys: the "
     "replicas dropped; deltas: how many deltas are sent; parts: per rank with entries, in "
     "rank order, (rank, entries, request id, nbytes, frames): the SYNC encoded for the wire "
     "(request ids first_req, first_req + 1, ...; with the moves held for the rank, which it "
     "now carries; frames [headers, payload] and the replicas' rows when large, as a "
     "memoryview; nbytes its share of the wire); keys: every entry's key; flags: the sent "
     "reports' flags (uint8 bytearray). None when nothing changed and no replica is held (an "
     "idle round). exact false: the live replicas' deltas go as bfloat16 (their versions "
     "marked, native/store.h: DELTA_NARROW), what rounding leaves staying in their delta rows "
     "for a later delta; true: every delta in float32, those leftovers included."},
    {"round_requests", (PyCFunction)Directory_round_requests, METH_VARARGS,
     "round_requests(rkeys, rflags) -> (drop_keys, counts, keys, ikeys, ipos, iflags, "
     "dkeys, dpos, drows, dver, ckeys, cpos, cver), numpy arrays of the codec's dtypes. A sync "
     "round's SYNC requests (directory.h, dir_round_*): reports rkeys (not owned here, "
     "unique; uint8 flags) and the replicas held here. Replicas whose intent ended are "
     "dropped (their "
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
     "moves_in(src, moves, counts, now) -> None or (relocated, taken, discarded). A "
     "carrier's 12 move arrays from src taken in, in one call: relocations (relocate_in), "
     "replica set-ups (setup_in, with this node's IntentCounts or None), home updates "
     "(update_home), raising as those do. relocated: the relocations' keys (the array "
     "given); taken: the replicas taken (int64 bytearray); discarded: the set-ups not taken. "
     "None when every section is empty."},
    {"redirected", (PyCFunction)Directory_redirected, METH_VARARGS,
     "redirected(keys, flags, ranks, src, counts, variant) -> (deferred, again, owned_keys, "
     "owned_flags, decision). Intent reports (unique keys, uint8 flags) that src answered "
     "with where to report them (ranks): the keys' hints point there; keys owned here by now "
     "(the relocation came with the answer) are decided on (variant; decision as decide "
     "returns it, or None) and taken as told in counts (this node's IntentCounts), except an "
     "ended intent for one a worker here has pinned; the others (again of them) are reported "
     "again by the next round. deferred: of those, how many src deferred (their rank names "
     "src itself: a worker there uses the key now) or were pinned here; owned_keys, "
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
    {"staying", (PyCFunction)Directory_staying, METH_VARARGS,
     "staying(keys, counts) -> bytearray, a 0/1 per key: held here and not about to leave on "
     "this node's account: owned (and no peer's report on it deferred because a sample here "
     "had it pinned, as far as the pins' lock is free to tell), or a replica that counts (this "
     "node's IntentCounts) has acted-on intent for (every replica when counts is None). Any "
     "thread, holding the GIL; a snapshot."},
    {"draw_held", (PyCFunction)Directory_draw_held, METH_VARARGS,
     "draw_held(bit_generator, pool, pool_count, counts, out, rounds) -> int. Fills out (int64) "
     "with keys drawn uniformly from pool[:pool_count[0]] (the count read live) with the numpy "
     "BitGenerator (the caller holds its lock), keeping each key that stays (staying's test) "
     "and pinning it once as it is kept, under the pins' lock; a key that does not stay is "
     "drawn again, up to rounds times. 0: every key pinned; -1: the pins were busy, nothing "
     "drawn (take the other path); -2: gave up, nothing pinned. Any thread, holding the GIL "
     "throughout (one channel only)."},
    {"check_answer", (PyCFunction)Directory_check_answer, METH_VARARGS,
     "check_answer(asked, keys, positions, remaining, floats) -> None or str. Whether an "
     "answer's positions (int64) answer a worker's request of this node that asked for keys "
     "at positions asked (ascending), at most remaining of them, and (floats >= 0: a pull's "
     "answer) whether its values hold the floats those keys need; the reason if not."},
    {"serve_syncs", (PyCFunction)Directory_serve_syncs, METH_VARARGS,
     "serve_syncs(variant, counts=None) -> None. Lets the transport serve a peer's SYNC "
     "itself, without Python (native/sync_fast.h: which qualify), deciding its reports by "
     "variant (policy.h; -1: none acts on intent) and taking replicas this node still wants by "
     "counts (this node's IntentCounts, which cannot change later). serve_syncs(None): no "
     "more (while sinks listen, every event must pass through NodeState). What a served "
     "SYNC leaves for NodeState: native_taken()."},
    {"serve_wire", (PyCFunction)Directory_serve_wire, METH_VARARGS,
     "serve_wire(rank, frames, counts) -> None or list. A transport without native I/O (the "
     "in-process one of the simulator) hands a wire message from peer rank here, as ZmqIO's "
     "poll hands its own (native/serve_wire.h): frames (a list of bytes-like: header, payload, "
     "own frames). None: Python is to take it (nothing changed). Else it was served or taken "
     "in here: the answer's frames to send back to rank (a list of two bytes), or [] if there "
     "is none; counts (FAST_COUNTERS writable int64, see serve_wire_counters) has what was "
     "served added. RuntimeError if the node cannot go on. Engine thread; releases the GIL."},
    {"native_taken", (PyCFunction)Directory_native_taken, METH_NOARGS,
     "native_taken() -> None if no SYNC was served and no answer taken natively since the "
     "last call, else (counters, arrived, relocated_in, (answers, refreshed, deferred_again, "
     "redirected_now)): counters {NodeState counter name: to add}; arrived: keys came in "
     "(relocated or replicated) or intent reports were acknowledged; relocated_in: some were "
     "relocated here; answers (int64) a (request, answering rank, entries answered) triple "
     "per answer to a round request taken in natively (native/answer_fast.c); refreshed: a "
     "replica took a newer value. The reports those answers acknowledged are applied to the "
     "intent counts now. Engine thread, with the GIL."},
    {"round_open", (PyCFunction)Directory_round_open, METH_VARARGS,
     "round_open(requests, keys, flags, num_intents, num_deltas) -> None. The transport may "
     "take the answers to a round's requests in itself (native/answer_fast.c): requests, a "
     "list of (request id, entries to answer) tuples, one per SYNC of the round; the round's "
     "entries' keys (int64: the intent reports first, with a uint8 flag each, then deltas, "
     "then checks; the buffers are held until each request is done). From now on "
     "round_answered counts each request's unanswered entries. A bad request raises with the "
     "requests before it registered. Engine thread."},
    {"round_answered", (PyCFunction)Directory_round_answered, METH_VARARGS,
     "round_answered(req, n) -> int or None. n more entries of round request req were "
     "answered on Python's path: how many are still unanswered (n = 0: only asks), or None "
     "if req was not opened with round_open or is done. ValueError for more than it waits "
     "for. Engine thread."},
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
