/* A node's sync round over its Directory (directory_object.h): building a round's requests in
 * one call (round_build; round_requests for the replicas' part alone) and taking its answers
 * in (apply_answer, redirected). */
#include "directory_object.h"
#include "policy.h"
#include "serve_wire.h"

/* A round's requests for reports rkeys[0..nr) with rflags (checked in range, unique, not
 * owned here) and the replicas held here: a new tuple of the 13 bytearrays (drop_keys, counts,
 * keys, ikeys, ipos, iflags, dkeys, dpos, drows, dver, ckeys, cpos, cver; see the docstring of
 * round_requests), or NULL with an exception set. release: pins the caller locked, unlocked
 * here in any case (as soon as the dropped replicas have left), or NULL. */
static PyObject *round_buffers(DirectoryObject *self, const int64_t *rkeys, const uint8_t *rflags,
                               int64_t nr, pins_t *release, int exact) {
    const directory_t *d = &self->d;
    PyObject *result = NULL, *out[13] = {NULL};
    void *scratch[8];
    round_in_t in = {rkeys, rflags, nr, release, exact};
    round_sizes_t z;
    dir_round_sizes(d, &in, &z);
    const int64_t nh = d->held->len, world = d->world_size, most = z.drops + nh;
    const Py_ssize_t bytes[13] = {z.drops * 8, 3 * world * 8, (nr + most) * 8, nr * 8, nr * 8,
                                  nr, most * 8, most * 8, (z.drop_floats + z.held_floats) * 4,
                                  most * 8, nh * 8, nh * 8, nh * 8};
    void *p[13];
    if (!(result = dm_new_buffers(13, bytes, p))) goto done;
    for (int i = 0; i < 13; i++) out[i] = PyTuple_GET_ITEM(result, i);
    round_out_t r = {p[0], NULL, p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[9], p[8], p[10],
                     p[11], p[12]};
    const size_t scratch_bytes[8] = {(size_t)nh * 8, (size_t)(nr + nh) * 8,
                                     (size_t)(nr + nh) * 8, (size_t)(nr + nh) * 8,
                                     (size_t)world * 8, (size_t)nh,
                                     (size_t)z.drop_floats * 4, (size_t)z.drops * 8};
    /* The directory's, kept from round to round: their pages stay mapped (fresh buffers of a
     * round's size were faulted in again each round). */
    for (int i = 0; i < 8; i++)
        if (!(scratch[i] = scratch_room(&self->round_buf[i], (int64_t)scratch_bytes[i]))) {
            PyErr_NoMemory();
            Py_CLEAR(result);
            goto done;
        }
    r.s_live = scratch[0]; r.s_ver = scratch[1]; r.s_at = scratch[2]; r.s_off = scratch[3];
    r.s_cursor = scratch[4]; r.s_nonzero = scratch[5]; r.s_rows = scratch[6];
    r.drop_slots = scratch[7];
    int64_t ok;
    NOGIL_BEGIN(nr + nh + z.held_floats)
    ok = dir_round_build(d, &in, &z, &r); /* unlocks release */
    NOGIL_END
    release = NULL;
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
    if (release) pins_unlock(release); /* failed before dir_round_build */
    return result;
}

#define ROUND_ROLES "kckkpfkprvkpv" /* round_buffers' 13, as role letters (check.h) */

/* One array of a SYNC being encoded: its bytes, and whether it travels in a frame of its own. */
typedef struct {
    const uint8_t *p;
    int64_t len;
    int own;
} enc_array_t;

/* The frames of a SYNC to dst with request id req and arrays a[0..narr) (the 10 keyed ones,
 * then dst's 12 held moves if narr is 22, read from the outbox), as wire_encode would encode it
 * alone: [headers (bytes), payload (bytes)], and own (a memoryview of the rows the request
 * carries, sent without copying) when a[5].own. A new list, or NULL with an exception set. */
static PyObject *encode_sync(DirectoryObject *self, int64_t dst, int64_t req,
                             const enc_array_t *a, int narr, PyObject *own) {
    const int64_t hsize = WIRE_HEADER_BYTES + 8 * narr;
    int64_t psize = 0, lengths[10 + OUTBOX_ARRAYS];
    for (int i = 0; i < narr; i++) {
        lengths[i] = a[i].own ? -a[i].len : a[i].len;
        if (!a[i].own) psize += (int64_t)padded((size_t)a[i].len);
    }
    PyObject *h = PyBytes_FromStringAndSize(NULL, hsize);
    PyObject *pl = h ? PyBytes_FromStringAndSize(NULL, psize) : NULL;
    PyObject *frames = pl ? PyList_New(own ? 3 : 2) : NULL;
    if (!frames) {
        Py_XDECREF(h);
        Py_XDECREF(pl);
        return NULL;
    }
    uint8_t *pp = (uint8_t *)PyBytes_AS_STRING(pl);
    for (int i = 0; i < narr; i++) {
        if (a[i].own) continue;
        if (i >= 10) outbox_copy(&self->outbox, dst, i - 10, pp);
        else if (a[i].len) memcpy(pp, a[i].p, (size_t)a[i].len);
        memset(pp + a[i].len, 0, padded((size_t)a[i].len) - (size_t)a[i].len);
        pp += padded((size_t)a[i].len);
    }
    put_header((uint8_t *)PyBytes_AS_STRING(h), WIRE_SYNC, narr, (int32_t)self->d.rank, req,
               (int32_t)self->d.rank, lengths);
    PyList_SET_ITEM(frames, 0, h);
    PyList_SET_ITEM(frames, 1, pl);
    if (own) PyList_SET_ITEM(frames, 2, Py_NewRef(own));
    return frames;
}

/* Each rank's SYNC of a round, cut from round_buffers' 13 buffers and encoded for the wire
 * (encode_sync), with the moves held for that rank (taken out of the outbox: the SYNC carries
 * them, as Posting.post_message makes a carrier do): a tuple of (dst, entries, request id,
 * nbytes, frames) per rank that gets entries, request ids first_req, first_req + 1, ... in
 * rank order; nbytes the message's share of the wire (header and arrays). NULL with an
 * exception set (the moves are then still held). */
static PyObject *round_encoded(DirectoryObject *self, PyObject *const *b, int64_t first_req) {
    const directory_t *d = &self->d;
    const int64_t world = d->world_size, *counts = (const int64_t *)PyByteArray_AS_STRING(b[1]);
    const int64_t *dkeys = (const int64_t *)PyByteArray_AS_STRING(b[6]);
    const int64_t *dver = (const int64_t *)PyByteArray_AS_STRING(b[9]);
    outbox_t *ob = &self->outbox;
    int64_t parts = 0;
    for (int64_t r = 0; r < world; r++)
        parts += counts[r] + counts[world + r] + counts[2 * world + r] > 0;
    PyObject *out = PyTuple_New(parts), *rows = NULL;
    if (!out) return NULL;
    const uint8_t *base[13];
    for (int i = 3; i < 13; i++) base[i] = (const uint8_t *)PyByteArray_AS_STRING(b[i]);
    int64_t at[3] = {0, 0, 0}, row = 0; /* entries of each section before rank r; drows floats */
    for (int64_t r = 0, part = 0; r < world; r++) {
        const int64_t ni = counts[r], nd = counts[world + r], nc = counts[2 * world + r];
        int64_t floats = 0; /* of rank r's delta rows (narrow ones take half) */
        for (int64_t j = at[1]; j < at[1] + nd; j++)
            floats += delta_row_floats(key_len(d->store, dkeys[j]), dver[j]);
        if (ni + nd + nc) {
            const int narr = outbox_holds(ob, r) ? 10 + OUTBOX_ARRAYS : 10;
            enc_array_t a[10 + OUTBOX_ARRAYS] = {
                {base[3] + 8 * at[0], 8 * ni, 0}, {base[4] + 8 * at[0], 8 * ni, 0},
                {base[5] + at[0], ni, 0},         {base[6] + 8 * at[1], 8 * nd, 0},
                {base[7] + 8 * at[1], 8 * nd, 0}, {base[8] + 4 * row, 4 * floats, 0},
                {base[9] + 8 * at[1], 8 * nd, 0}, {base[10] + 8 * at[2], 8 * nc, 0},
                {base[11] + 8 * at[2], 8 * nc, 0}, {base[12] + 8 * at[2], 8 * nc, 0}};
            int64_t nbytes = WIRE_HEADER_BYTES + 8 * narr;
            for (int i = 10; i < narr; i++) a[i] = (enc_array_t){NULL, outbox_bytes(ob, r, i - 10), 0};
            for (int i = 0; i < narr; i++) nbytes += a[i].len;
            PyObject *own = NULL;
            if ((a[5].own = a[5].len >= WIRE_OWN_FRAME_BYTES)) {
                if (!rows && !(rows = PyMemoryView_FromObject(b[8]))) goto fail;
                if (!(own = PySequence_GetSlice(rows, 4 * row, 4 * (row + floats)))) goto fail;
            }
            PyObject *frames = encode_sync(self, r, first_req + part, a, narr, own);
            Py_XDECREF(own);
            PyObject *item = frames ? Py_BuildValue("LLLLN", (long long)r, (long long)(ni + nd + nc),
                                                    (long long)(first_req + part),
                                                    (long long)nbytes, frames)
                                    : NULL;
            if (!item) goto fail;
            PyTuple_SET_ITEM(out, part++, item);
        }
        at[0] += ni;
        at[1] += nd;
        at[2] += nc;
        row += floats;
    }
    /* Encoded: the moves are the SYNCs' now. */
    for (int64_t r = 0; r < world; r++)
        if (counts[r] + counts[world + r] + counts[2 * world + r] > 0 && outbox_holds(ob, r))
            outbox_clear(ob, r);
    Py_XDECREF(rows);
    return out;
fail:
    Py_XDECREF(rows);
    Py_DECREF(out);
    return NULL;
}

/* round_build(counts, variant, reports, first_req) -> None, or (deferred, told_keys, told_flags,
 * decided, decision, reports_sent, drop_keys, deltas, parts, keys, flags): see the method's
 * docstring. */
PyObject *Directory_round_build(DirectoryObject *self, PyObject *args) {
    PyObject *ocounts;
    int variant, reports, exact = 1;
    long long first_req;
    if (!PyArg_ParseTuple(args, "OipL|p", &ocounts, &variant, &reports, &first_req, &exact))
        return NULL;
    intent_counts_t *c = dm_intent_counts(ocounts, "round_build");
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
    pins_t *locked = NULL; /* from the pins' check until the keys have left (below) */
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
         * remote. The pins stay locked until the decisions and the drops below are carried
         * out (round_buffers unlocks them; see dir_sync_pins in directory.h: a worker's pin
         * waits for them). */
        int64_t kept = 0;
        pins_lock(locked = &self->pins);
        for (int64_t i = 0; i < m; i++) {
            if (!flags[i] && pins_has(&self->pins, keys[i])) {
                other[deferred++] = keys[i];
                continue;
            }
            keys[kept] = keys[i];
            flags[kept++] = flags[i];
        }
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
            if (i + STORE_AHEAD < m) store_prefetch(d->store, keys[i + STORE_AHEAD]);
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
                && !(decision = dm_decide_batch(self, variant, d->rank, other, ntold, other_flags,
                                                1, c == d->counts))) /* found owned above; */
                goto done;                      /* acknowledged next */
            ic_acknowledge(c, other, other_flags, ntold);
        }
    }
    void *p;
    if (!(told[0] = dm_new_array(ntold, 8, &p))) goto done;
    memcpy(p, other, (size_t)ntold * 8);
    if (!(told[1] = dm_new_array(ntold, 1, &p))) goto done;
    memcpy(p, other_flags, (size_t)ntold);
    if (!(flags_out = dm_new_array(m, 1, &p))) goto done;
    memcpy(p, flags, (size_t)m);
    int64_t deltas = 0;
    if (m || d->held->len) {
        buffers = round_buffers(self, keys, flags, m, locked, exact);
        locked = NULL; /* round_buffers unlocked it, once the dropped replicas had left */
        if (!buffers) goto done;
        PyObject *b[13];
        for (int i = 0; i < 13; i++) b[i] = PyTuple_GET_ITEM(buffers, i);
        deltas = PyByteArray_GET_SIZE(b[6]) / 8;
        const int64_t nkeys = PyByteArray_GET_SIZE(b[2]) / 8;
        if (!(parts = round_encoded(self, b, first_req)) || !(keys_view = wire_view(b[2], 'k', nkeys, 0))
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
    if (locked) pins_unlock(locked);
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
PyObject *Directory_round_requests(DirectoryObject *self, PyObject *args) {
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
    if (dm_check_keys(self, v[0].buf, nr) < 0
        || dm_refuse_repeated(self, v[0].buf, nr, "round_requests: reports") < 0)
        goto done;
    PyObject *buffers = round_buffers(self, v[0].buf, v[1].buf, nr, NULL, 1);
    if (buffers) {
        PyObject *b[13];
        for (int i = 0; i < 13; i++) b[i] = PyTuple_GET_ITEM(buffers, i);
        result = dm_as_views(b, ROUND_ROLES, 13);
        Py_DECREF(buffers);
    }
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* apply_answer(keys, flags, ni, src, pos, versions, refresh, values, counts, now) -> reports */
PyObject *Directory_apply_answer(DirectoryObject *self, PyObject *args) {
    long long ni, src;
    double now;
    PyObject *o[6], *ocounts;
    if (!PyArg_ParseTuple(args, "OOLLOOOOOd", &o[0], &o[1], &ni, &src, &o[2], &o[3], &o[4],
                          &o[5], &ocounts, &now))
        return NULL;
    intent_counts_t *told = dm_intent_counts(ocounts, "apply_answer");
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
    if (dm_check_keys(self, keys, nkeys) < 0) goto done;
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
    if (dm_reserve(self, n) < 0) goto done;
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

/* redirected(keys, flags, ranks, src, counts, variant) -> (deferred, again, owned_keys,
 * owned_flags, decision): see the method's docstring. */
PyObject *Directory_redirected(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *oflags, *oranks, *ocounts;
    long long src;
    int variant;
    if (!PyArg_ParseTuple(args, "OOOLOi", &okeys, &oflags, &oranks, &src, &ocounts, &variant))
        return NULL;
    intent_counts_t *c = dm_intent_counts(ocounts, "redirected");
    if (!c) return NULL;
    const directory_t *d = &self->d;
    if (src < 0 || src >= d->world_size) {
        PyErr_SetString(PyExc_ValueError, "redirected: src outside the ranks");
        return NULL;
    }
    Py_buffer kv, rv, fv;
    if (dm_keyed_buffers(self, okeys, &kv, oranks, &rv, 8, "redirected") < 0) return NULL;
    PyObject *result = NULL, *owned[2] = {NULL, NULL}, *decision = NULL;
    int64_t *again = NULL, *mine = NULL;
    uint8_t *mine_flags = NULL;
    pins_t *locked = NULL;
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
    if (dm_refuse_repeated(self, keys, n, "redirected") < 0) goto done;
    again = PyMem_Malloc((size_t)(n ? n : 1) * 8);
    mine = PyMem_Malloc((size_t)(n ? n : 1) * 8);
    mine_flags = PyMem_Malloc((size_t)(n ? n : 1));
    if (!again || !mine || !mine_flags || dm_reserve(self, n) < 0 || ic_reserve(c, n) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    /* Where the owner says they are; keys owned here by now (the relocation came with the
     * answer) are decided at once, the rest are reported again by the next round, and so is
     * an ended intent for an owned key a worker here has pinned (as in round_build; the pins
     * stay locked until the decision is carried out, see dir_sync_pins). */
    int64_t deferred = 0, na = 0, nm = 0;
    if (variant >= 0) pins_lock(locked = &self->pins);
    for (int64_t i = 0; i < n; i++) {
        rec_set_hint(&self->recs, keys[i], ranks[i]);
        const int owner = store_state(d->store, keys[i]) == KEY_OWNER;
        const int pinned = owner && locked && !flags[i] && pins_has(locked, keys[i]);
        deferred += ranks[i] == src || pinned; /* neither starts a round of its own */
        if (owner && !pinned) {
            mine[nm] = keys[i];
            mine_flags[nm++] = flags[i];
        } else {
            again[na++] = keys[i];
        }
    }
    if (nm) {
        if (variant >= 0
            && !(decision = dm_decide_batch(self, variant, d->rank, mine, nm, mine_flags, 1, 0)))
            goto done;
        ic_acknowledge(c, mine, mine_flags, nm);
    }
    if (locked) {
        pins_unlock(locked);
        locked = NULL;
    }
    if (na) ic_report_again(c, again, na);
    void *p;
    if (!(owned[0] = dm_new_array(nm, 8, &p))) goto done;
    memcpy(p, mine, (size_t)nm * 8);
    if (!(owned[1] = dm_new_array(nm, 1, &p))) goto done;
    memcpy(p, mine_flags, (size_t)nm);
    result = Py_BuildValue("LLOOO", (long long)deferred, (long long)na, owned[0], owned[1],
                           decision ? decision : Py_None);
done:
    if (locked) pins_unlock(locked);
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
