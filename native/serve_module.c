/* The owner's side of a Directory (directory_object.h) and a worker's own request: the policy's
 * decisions carried out and their moves held per peer (decide, take_moves, held_peers), a SYNC
 * served (serve_sync), a carrier's moves taken in (moves_in), a worker's request routed
 * (route_own) and its answer checked (check_answer). */
#include "directory_object.h"
#include "policy.h"

int dm_decide(DirectoryObject *self, int variant, int64_t node, const int64_t *keys, int64_t n,
              const uint8_t *flags, int own_acked, dm_decision_t *out) {
    const directory_t *d = &self->d;
    const int64_t w = d->words, world = d->world_size;
    scratch_buf_t *b = self->decide_buf;
    memset(out, 0, sizeof *out);
    int64_t *relocate_to = scratch_room(&b[0], (n ? n : 1) * (int64_t)sizeof(int64_t));
    uint64_t *setup = scratch_room(&b[1], (n ? n * w : 1) * (int64_t)sizeof(uint64_t));
    if (!relocate_to || !setup || dir_reserve(d, n) < 0) return -1; /* the keys' masks, then
                                                                     * their forward pointers */
    out->dropped = dir_policy_decide(d, variant, node, keys, n, flags, relocate_to, setup,
                                     own_acked);
    decide_sizes_t z;
    dir_decide_sizes(d, keys, n, relocate_to, setup, &z);
    if (z.relocations < 0) return -2; /* masks only name real ranks (relocate_in checks them) */
    if (!z.relocations && !z.setups) return 0; /* the common case: nothing moves */
    /* Scratch for the decision (decide_out_t), copied to the held moves after; everything
     * that can fail comes before dir_decide_execute changes anything. */
    const int64_t r = z.relocations, sp = z.setups, h = z.home_updates;
    const int64_t nints = 3 * world + 4 * r + 2 * sp + 3 * h + (world > sp ? world : sp);
    int64_t *ints = scratch_room(&b[2], nints * (int64_t)sizeof(int64_t));
    uint64_t *masks = scratch_room(&b[3], (r ? 2 * r * w : 1) * (int64_t)sizeof(uint64_t));
    float *floats = scratch_room(&b[4], (z.relocation_floats + z.setup_floats + 1)
                                            * (int64_t)sizeof(float));
    if (!ints || !masks || !floats) return -1;
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
    int64_t *cursor = at;
    o.r_s = masks;
    o.r_r = masks + r * w;
    o.r_values = floats;
    o.s_values = floats + z.relocation_floats;
    if (outbox_reserve_decision(&self->outbox, d, keys, n, relocate_to, setup) < 0) return -1;
    if (dir_decide_execute(d, keys, n, relocate_to, setup, &z, &o, cursor) < 0) return -3;
    outbox_append_decision(&self->outbox, d, &o, &z);
    out->relocated = r;
    out->keys = o.r_keys;
    out->per_rank = o.r_count;
    return 0;
}

/* The decision on node's reports for keys[0..n) with flags (keys checked in range, unique):
 * (dropped, relocated, per_rank), see the docstring of decide; its moves join the peers' held
 * moves (outbox.h). NULL with an exception set (nothing changed) if a key is not owned here. */
PyObject *dm_decide_batch(DirectoryObject *self, int variant, int64_t node,
                          const int64_t *keys, int64_t n, const uint8_t *flags, int owned,
                          int own_acked) {
    const directory_t *d = &self->d;
    if (!d->masks) {
        PyErr_SetString(PyExc_ValueError, "decide: this directory keeps no intent masks "
                                          "(the variant does not act on intent)");
        return NULL;
    }
    for (int64_t i = 0; i < n && !owned; i++) /* before anything changes */
        if (store_state(d->store, keys[i]) != KEY_OWNER) {
            PyErr_Format(PyExc_ValueError, "decide: key %lld is not owned here",
                         (long long)keys[i]);
            return NULL;
        }
    dm_decision_t got;
    int ok;
    NOGIL_BEGIN(n * d->words)
    ok = dm_decide(self, variant, node, keys, n, flags, own_acked, &got);
    NOGIL_END
    if (ok == -1) return PyErr_NoMemory();
    if (ok == -2) {
        PyErr_SetString(PyExc_RuntimeError, "decide: a mask named a rank outside the world");
        return NULL;
    }
    if (ok < 0) { /* cannot happen: ownership was checked above, and only this thread moves keys */
        PyErr_SetString(PyExc_RuntimeError, "decide: a key vanished while it was relocated");
        return NULL;
    }
    if (!got.relocated) return Py_BuildValue("LOO", (long long)got.dropped, Py_None, Py_None);
    void *kp, *rp;
    PyObject *relocated = dm_new_array(got.relocated, 8, &kp);
    PyObject *per_rank = relocated ? dm_new_array(d->world_size, 8, &rp) : NULL;
    if (!per_rank) {
        Py_XDECREF(relocated);
        return NULL;
    }
    memcpy(kp, got.keys, (size_t)got.relocated * 8);
    memcpy(rp, got.per_rank, (size_t)d->world_size * 8);
    return Py_BuildValue("LNN", (long long)got.dropped, relocated, per_rank);
}

/* take_moves(dst) -> None, or the 12 move arrays held for dst (numpy views of one new buffer,
 * the shared empties where a section is empty); nothing is held for dst afterwards. */
PyObject *Directory_take_moves(DirectoryObject *self, PyObject *arg) {
    const long long dst = PyLong_AsLongLong(arg);
    if (dst == -1 && PyErr_Occurred()) return NULL;
    if (dst < 0 || dst >= self->d.world_size) {
        PyErr_SetString(PyExc_ValueError, "take_moves: rank outside the world");
        return NULL;
    }
    outbox_t *ob = &self->outbox;
    if (!outbox_holds(ob, dst)) Py_RETURN_NONE;
    static const char roles[] = OUTBOX_ROLES;
    int64_t offset[OUTBOX_ARRAYS], total = 0;
    for (int i = 0; i < OUTBOX_ARRAYS; i++) {
        offset[i] = total;
        total += (outbox_bytes(ob, dst, i) + 7) & ~(int64_t)7; /* each view 8-aligned */
    }
    void *base;
    PyObject *buf = dm_new_array(total, 1, &base);
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
PyObject *Directory_held_peers(DirectoryObject *self, PyObject *unused) {
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
PyObject *Directory_decide(DirectoryObject *self, PyObject *args) {
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
    else if (dm_check_keys(self, kv.buf, n) == 0
             && dm_refuse_repeated(self, kv.buf, n, "decide") == 0)
        result = dm_decide_batch(self, variant, node, kv.buf, n, fv.buf, 0, 0);
    PyBuffer_Release(&kv);
    PyBuffer_Release(&fv);
    return result;
}

/* serve_sync(variant, origin, ikeys, ipos, iflags, dkeys, dpos, drows, dver, ckeys, cpos, cver)
 *   -> (answer, decision, rest_index, rest_hop) */
PyObject *Directory_serve_sync(DirectoryObject *self, PyObject *args) {
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
    pins_t *locked = NULL; /* from the plan until the decision is carried out (dir_sync_pins) */
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
    if (dm_check_keys(self, r.ikeys, r.ni) < 0 || dm_check_keys(self, r.dkeys, r.nd) < 0
        || dm_check_keys(self, r.ckeys, r.nc) < 0
        || dm_refuse_repeated(self, r.ikeys, r.ni, "serve_sync: intent reports") < 0)
        goto done;
    int64_t row_floats = 0; /* as sent: a narrow row (bfloat16) takes half */
    for (int64_t i = 0; i < r.nd; i++) row_floats += delta_row_floats(key_len(st, r.dkeys[i]),
                                                                      r.dver[i]);
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
    if (dm_reserve(self, r.ni) < 0) goto done; /* the decision on the owned reports */
    const int64_t n = r.ni + r.nd + r.nc;
    where = PyMem_Malloc((size_t)(n ? n : 1));
    hop = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!where || !hop) {
        PyErr_NoMemory();
        goto done;
    }
    sync_plan_t p = {where, hop};
    if ((locked = dir_sync_pins(d, &r))) pins_lock(locked);
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
        if (!(arrays[i] = dm_new_array(counts[i], i == 3 || i == 7 ? 4 : 8, &ptr[i]))) goto done;
    a.positions = ptr[0]; a.versions = ptr[1]; a.refresh_pos = ptr[2]; a.values = ptr[3];
    a.redirect_pos = ptr[4]; a.redirect_ranks = ptr[5]; a.back_pos = ptr[6];
    a.back_rows = ptr[7];
    void *rp[2];
    if (!(rest[0] = dm_new_array(p.rest, 8, &rp[0]))
        || !(rest[1] = dm_new_array(p.rest, 8, &rp[1])))
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
    /* The plan found these owned (SYNC_OWNED), and nothing has moved since. */
    if (oi && !(decision = dm_decide_batch(self, variant, origin, ikeys, oi, iflags, 1, 0)))
        goto done;
    if (locked) {
        pins_unlock(locked);
        locked = NULL;
    }
    PyObject *answer = owned || p.redirects || p.backs ? dm_as_views(arrays, "pvprpnpr", 8)
                                                       : Py_NewRef(Py_None);
    if (!answer) goto done;
    result = Py_BuildValue("NOOO", answer, decision ? decision : Py_None,
                           p.rest ? rest[0] : Py_None, p.rest ? rest[1] : Py_None);
done:
    if (locked) pins_unlock(locked);
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

/* moves_in(src, moves, counts, now) -> None or (relocated, taken, discarded) */
PyObject *Directory_moves_in(DirectoryObject *self, PyObject *args) {
    long long src;
    double now;
    PyObject *omoves, *ocounts;
    if (!PyArg_ParseTuple(args, "LOOd", &src, &omoves, &ocounts, &now)) return NULL;
    PyObject *seq = PySequence_Fast(omoves, "moves_in: moves must be a sequence of 12 arrays");
    if (!seq) return NULL;
    PyObject *result = NULL, *was = NULL, *taken = NULL, *r = NULL;
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
    if (!(was = dm_new_array(n[0], 1, &p))) goto done;
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
    } else if (!(taken = dm_new_array(0, 8, &p))) {
        goto done;
    }
    if (n[2]) {
        PyObject *a = Py_BuildValue("(OOO)", m[9], m[10], m[11]);
        r = a ? Directory_update_home(self, a) : NULL;
        Py_XDECREF(a);
        if (!r) goto done;
        Py_CLEAR(r);
    }
    const Py_ssize_t ntaken = PyByteArray_GET_SIZE(taken) / 8;
    result = Py_BuildValue("OOn", m[0], taken, n[1] - ntaken);
done:
    Py_XDECREF(was);
    Py_XDECREF(taken);
    Py_DECREF(seq);
    return result;
}

/* route_own(keys, is_set, counts) -> (here, coming, queued, groups): see the docstring. */
/* staying(keys, counts) -> bytearray of one 0/1 per key: see the method table. */
PyObject *Directory_staying(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *ocounts;
    if (!PyArg_ParseTuple(args, "OO", &okeys, &ocounts)) return NULL;
    const intent_counts_t *c = NULL;
    if (ocounts != Py_None && !(c = dm_intent_counts(ocounts, "staying"))) return NULL;
    Py_buffer kv;
    if (dm_keyed_buffers(self, okeys, &kv, NULL, NULL, 0, "staying") < 0) return NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    int8_t *out;
    PyObject *result = dm_new_array(n, 1, (void **)&out);
    if (result) {
        /* The GIL stays held: the engine thread changes the counts holding it. */
        store_states(self->d.store, keys, n, out);
        /* An owned key that a peer's report waits for (deferred less than PINS_MAX_DEFER_MS
         * ago because a sample here had it pinned, pins.h) does not stay: the local sampler
         * does not draw it again, so its pin ends with the sample that has it, and the report,
         * coming again with the peer's next round, moves it. Drawn again (KGE on 2 nodes: a
         * run draws most of a node's entities), it was pinned anew and the report deferred
         * again, round after round. The deferred keys are read under the pins' lock, taken
         * only if free (the engine thread may hold it while it waits for the GIL); when it is
         * not, this call lets them stay. */
        pins_t *pins = &self->pins;
        const int locked = __atomic_load_n(&pins->deferred.live, __ATOMIC_RELAXED)
                           && pthread_mutex_trylock(&pins->lock) == 0;
        const int waits = locked && pins->deferred.live;
        const int32_t now = waits ? pins_now_ms() : 0;
        for (int64_t i = 0; i < n; i++) {
            if (out[i] == KEY_REPLICA) {
                const ic_rec_t *e = c ? ic_find(c, keys[i]) : NULL;
                out[i] = !c || (e && e->count > 0);
            } else {
                out[i] = out[i] == KEY_OWNER && !(waits && pins_waited(pins, keys[i], now));
            }
        }
        if (locked) pins_unlock(pins);
    }
    PyBuffer_Release(&kv);
    return result;
}

PyObject *Directory_route_own(DirectoryObject *self, PyObject *args) {
    PyObject *okeys, *ocounts;
    int is_set;
    if (!PyArg_ParseTuple(args, "OpO", &okeys, &is_set, &ocounts)) return NULL;
    const intent_counts_t *c = NULL;
    if (ocounts != Py_None && !(c = dm_intent_counts(ocounts, "route_own"))) return NULL;
    Py_buffer kv;
    if (dm_keyed_buffers(self, okeys, &kv, NULL, NULL, 0, "route_own") < 0) return NULL;
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
    for (int64_t i = 0; i < n; i++) { /* dm_route_hop says what -1, -2 and -3 mean */
        hop[i] = dm_route_hop(d, c, keys[i], is_set);
        if (hop[i] >= world) { /* hints and forward pointers only ever name ranks */
            PyErr_SetString(PyExc_RuntimeError, "route_own: a hint names a rank outside the "
                                                "world");
            goto done;
        }
        count[hop[i] < 0 ? world - 1 - hop[i] : hop[i]]++;
    }
    void *p[3];
    for (int k = 0; k < 3; k++)
        if (!(bufs[k] = dm_new_array(count[world + k], 8, &p[k]))) goto done;
    int64_t at[3] = {0, 0, 0}, parts = 0;
    for (int64_t i = 0; i < n; i++)
        if (hop[i] < 0) ((int64_t *)p[-1 - hop[i]])[at[-1 - hop[i]]++] = i;
    for (int64_t r = 0; r < world; r++) parts += count[r] > 0;
    if (!(groups = PyTuple_New(parts))) goto done;
    for (int64_t r = 0, part = 0; r < world; r++) {
        if (!count[r]) continue;
        int64_t *idx;
        PyObject *b = dm_new_array(count[r], 8, (void **)&idx);
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
PyObject *Directory_check_answer(DirectoryObject *self, PyObject *args) {
    PyObject *oasked, *okeys, *opos;
    long long remaining, floats;
    if (!PyArg_ParseTuple(args, "OOOLL", &oasked, &okeys, &opos, &remaining, &floats))
        return NULL;
    Py_buffer v[3];
    if (borrow3((PyObject *[3]){oasked, okeys, opos}, v, 0,
                (const char *[3]){"check_answer: asked", "check_answer: keys",
                                  "check_answer: positions"}) < 0)
        return NULL;
    Py_buffer av = v[0], kv = v[1], pv = v[2];
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
