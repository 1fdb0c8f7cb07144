/* The directory's work for the transport without Python: a peer's SYNC served inside the
 * transport's receive call (sync_fast.h) and the two Directory methods around it, serve_syncs
 * (on, off) and native_taken (what NodeState does after); a worker's pull routed, served where
 * its keys arrived, and its answers' hints learnt (zmq_calls.c). */
#define _GNU_SOURCE /* clock_gettime */
#include <time.h>

#include "directory_object.h"
#include "policy.h"
#include "wire.h"

/* Scratch buffers of one served SYNC (sync_fast_t.buf). */
enum {
    B_WHERE, B_HOP, B_POS, B_VERS, B_REFRESH, B_VALUES, B_RPOS, B_RRANKS, B_BPOS, B_BROWS,
    B_REST, B_RHOP, B_IKEYS, B_IFLAGS, B_SKEYS, B_SROWS, B_MISSING, B_BEHIND, B_RSLOTS, B_WAS,
    B_TAKEN, B_TROWS, B_TVERS, B_TSLOTS, B_WANTED, B_MOVED
};
_Static_assert(B_MOVED < SF_BUFS, "sync_fast_t.buf holds every scratch buffer");

#define ROOM(i, bytes) scratch_room(&f->buf[i], (int64_t)(bytes))

static double monotonic_s(void) { /* the clock of Python's time.monotonic */
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Whether key is among the ascending keys[0..n). */
static int among_sorted(const int64_t *keys, int64_t n, int64_t key) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && keys[lo] == key;
}

static int ascending(const void *x, const void *y) {
    const int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* Whether every entry of r is answered here once the message's moves (a[10..22)) are in:
 * owned now or relocated here by them, or a report with a next hop to redirect it to, or a
 * delta or check for a key that went to the origin (returned). The moves change the routing
 * only of their own keys, so an entry whose key a set-up or home update names is not judged:
 * Python takes the message. Changes nothing. */
static int answered_here(sync_fast_t *f, const directory_t *d, const sync_request_t *r,
                         const carr_t *a) {
    const store_t *s = d->store;
    const int64_t *rk = a[10].p, *sk = a[16].p, *hk = a[19].p;
    const int64_t nr = a[10].n, ns = a[16].n, nh = a[19].n;
    /* The moves' keys, sorted at the first entry that needs them (the relocations' apart from
     * the others), for a binary search per entry: a linear one, bounded, sent 12-19% of 2-node
     * WV's SYNCs (hundreds of moves and entries each) to Python. */
    int64_t *sorted = NULL;
    for (int64_t e = 0, n = r->ni + r->nd + r->nc; e < n; e++) {
        int section;
        if (e + STORE_AHEAD < n) store_prefetch(s, sync_entry_key(r, e + STORE_AHEAD, &section));
        const int64_t key = sync_entry_key(r, e, &section);
        if (store_state(s, key) == KEY_OWNER) continue;
        if (!sorted) {
            if (!(sorted = ROOM(B_MOVED, 8 * (nr + ns + nh)))) return 0;
            if (nr) memcpy(sorted, rk, 8 * (size_t)nr); /* an empty array may have no data */
            if (ns) memcpy(sorted + nr, sk, 8 * (size_t)ns);
            if (nh) memcpy(sorted + nr + ns, hk, 8 * (size_t)nh);
            qsort(sorted, (size_t)nr, 8, ascending);
            qsort(sorted + nr, (size_t)(ns + nh), 8, ascending);
        }
        if (among_sorted(sorted, nr, key)) continue;
        if (among_sorted(sorted + nr, ns + nh, key)) return 0;
        const int64_t nxt = dir_next_hop(d, key);
        if (section == 0 ? nxt < 0 : nxt != r->origin) return 0;
    }
    return 1;
}

int fast_moves_room(DirectoryObject *self, const carr_t *m, int64_t more_records) {
    sync_fast_t *f = &self->fast;
    const int64_t nr = m[0].n, ns = m[6].n;
    if (!ROOM(B_RSLOTS, 8 * nr) || !ROOM(B_TAKEN, 8 * ns) || !ROOM(B_WAS, nr)
        || !ROOM(B_TROWS, 4 * m[7].n) || !ROOM(B_TVERS, 8 * ns) || !ROOM(B_TSLOTS, 8 * ns)
        || !ROOM(B_WANTED, ns) || dir_reserve(&self->d, nr + ns + m[9].n + more_records) < 0)
        return -1;
    return 0;
}

int fast_moves_in(DirectoryObject *self, int64_t origin, const carr_t *m, const char **fatal) {
    sync_fast_t *f = &self->fast;
    const directory_t *d = &self->d;
    const int64_t nr = m[0].n, ns = m[6].n;
    int64_t *rslots = f->buf[B_RSLOTS].p, *taken = f->buf[B_TAKEN].p;
    int8_t *was = f->buf[B_WAS].p;
    float *trows = f->buf[B_TROWS].p;
    int64_t *tvers = f->buf[B_TVERS].p, *tslots = f->buf[B_TSLOTS].p;
    uint8_t *wanted = f->buf[B_WANTED].p;
    int64_t *counters = f->counters;
    if (nr) {
        const int64_t *keys = m[0].p;
        if (dir_relocate_in(d, keys, nr, m[1].p, m[1].n, m[2].p, m[3].p, m[4].p, m[5].p,
                            rslots, was) < 0) {
            *fatal = "out of memory taking a relocation in";
            return -1;
        }
        counters[SF_RELOCATIONS_IN] += nr;
        f->arrived = f->relocated_in = f->changed = 1;
    }
    if (ns) {
        const int64_t *keys = m[6].p;
        for (int64_t i = 0; i < ns && f->counts; i++) wanted[i] = ic_count(f->counts, keys[i]) > 0;
        const int64_t got = dir_setup_in(d, origin, keys, ns, m[7].p, m[8].p,
                                         f->counts ? wanted : NULL, monotonic_s(), taken, trows,
                                         tvers, tslots);
        if (got < 0) {
            *fatal = "out of memory taking a replica in";
            return -1;
        }
        counters[SF_REPLICA_SETUPS] += got;
        counters[SF_SETUPS_DISCARDED] += ns - got;
        f->arrived |= got > 0;
        f->changed = 1;
    }
    const int64_t *hkeys = m[9].p, *howners = m[10].p, *hepochs = m[11].p;
    for (int64_t i = 0; i < m[9].n; i++) { /* Directory.update_home: the newest epoch wins */
        if (hepochs[i] <= rec_home_epoch(d->recs, hkeys[i])) continue;
        const int32_t rec = dir_rec_get(d, hkeys[i]);
        rec_at(d->recs, rec)->home_epoch = hepochs[i];
        d->home_owner[dir_home_index(d, hkeys[i])] = (int32_t)howners[i];
    }
    return 0;
}

int directory_sync_fast(PyObject *directory, int64_t origin, const carr_t *in, int narrays,
                        sync_fast_answer_t *out, const char **fatal) {
    DirectoryObject *self = (DirectoryObject *)directory;
    sync_fast_t *f = &self->fast;
    const directory_t *d = &self->d;
    const store_t *st = d->store;
    if (!self->ready || !f->on || (narrays != 10 && narrays != 22) || origin < 0
        || origin >= d->world_size || origin == d->rank)
        return 0;
    carr_t a[22];
    memset(a, 0, sizeof a);
    memcpy(a, in, (size_t)narrays * sizeof(carr_t));
    char why[CHECK_WHY];
    if (check_message(d, WIRE_SYNC, a, &self->scratch, why) != 0) return 0; /* Python drops it */
    const sync_request_t r = {origin, a[0].p, a[1].p, a[2].p, a[0].n,
                              a[3].p, a[4].p, a[6].p, a[5].p, a[3].n,
                              a[7].p, a[8].p, a[9].p, a[7].n, f->variant};
    const int64_t n = r.ni + r.nd + r.nc;
    if (!n || (r.ni && f->variant < 0) || !answered_here(f, d, &r, a)) return 0;
    /* Everything that can fail short of the store's own room, before anything changes. */
    /* The deltas' rows as floats (narrow ones came in half the bytes), then the checks'. */
    const int64_t delta_floats = store_floats_of(st, r.dkeys, r.nd);
    int64_t floats = delta_floats;
    for (int64_t i = 0; i < r.nc; i++) floats += key_len(st, r.ckeys[i]);
    const int64_t n8 = 8 * n;
    int8_t *where = ROOM(B_WHERE, n);
    int64_t *hop = ROOM(B_HOP, n8);
    sync_answer_t s = {.positions = ROOM(B_POS, n8), .versions = ROOM(B_VERS, n8),
                       .refresh_pos = ROOM(B_REFRESH, n8), .values = ROOM(B_VALUES, 4 * floats),
                       .redirect_pos = ROOM(B_RPOS, n8), .redirect_ranks = ROOM(B_RRANKS, n8),
                       .back_pos = ROOM(B_BPOS, n8), .back_rows = ROOM(B_BROWS, 4 * delta_floats),
                       .rest_index = ROOM(B_REST, n8), .rest_hop = ROOM(B_RHOP, n8),
                       .ikeys = ROOM(B_IKEYS, n8), .iflags = ROOM(B_IFLAGS, n),
                       .skeys = ROOM(B_SKEYS, n8), .srows = ROOM(B_SROWS, 4 * floats),
                       .missing = ROOM(B_MISSING, n8), .behind = ROOM(B_BEHIND, n)};
    if (!where || !hop || !s.positions || !s.versions || !s.refresh_pos || !s.values
        || !s.redirect_pos || !s.redirect_ranks || !s.back_pos || !s.back_rows || !s.rest_index
        || !s.rest_hop || !s.ikeys || !s.iflags || !s.skeys || !s.srows || !s.missing
        || !s.behind || fast_moves_room(self, a + 10, r.ni) < 0)
        return 0; /* out of memory: Python tries, and says so */
    int64_t *counters = f->counters;
    /* The moves first (NodeState._moves_in): relocations, replica set-ups, home updates. */
    if (fast_moves_in(self, origin, a + 10, fatal) < 0) return -1;
    /* The entries (NodeState._sync). */
    sync_plan_t p = {.where = where, .hop = hop};
    pins_t *pins = dir_sync_pins(d, &r); /* locked from the plan to the decision's end */
    if (pins) pins_lock(pins);
    dir_sync_plan(d, &r, &p);
    if (p.rest) {
        if (pins) pins_unlock(pins);
        *fatal = "a SYNC judged answerable here needs forwarding (sync_fast.c: answered_here)";
        return -1;
    }
    if (dir_sync_serve(d, &r, &p, &s) < 0) {
        if (pins) pins_unlock(pins);
        *fatal = "an owned key vanished while a SYNC was served";
        return -1;
    }
    counters[SF_DEFERRED] += p.deferred;
    f->changed = 1;
    if (p.owned_intents) {
        dm_decision_t dec;
        const int ok = dm_decide(self, f->variant, origin, s.ikeys, p.owned_intents, s.iflags,
                                 0, &dec);
        if (pins) pins_unlock(pins);
        pins = NULL;
        if (ok < 0) {
            *fatal = ok == -1 ? "out of memory deciding on a SYNC's reports"
                              : "a decision on a SYNC's reports broke an invariant";
            return -1;
        }
        counters[SF_RELOCATIONS_OUT] += dec.relocated;
        counters[SF_DROPS_AT_OWNER] += dec.dropped;
    }
    if (pins) pins_unlock(pins); /* no owned report: nothing was decided */
    /* The answer: positions and versions of the owned entries, refreshed values, redirects,
     * returned deltas; then the moves held for the origin. */
    const int64_t owned = p.owned_intents + p.owned_syncs;
    const carr_t answer[8] = {{s.positions, owned}, {s.versions, owned},
                              {s.refresh_pos, s.nrefresh}, {s.values, s.nvalues},
                              {s.redirect_pos, p.redirects}, {s.redirect_ranks, p.redirects},
                              {s.back_pos, p.backs}, {s.back_rows, p.back_floats}};
    memcpy(out->a, answer, sizeof answer);
    out->narrays = 8;
    out->own = NULL;
    if (4 * s.nvalues >= WIRE_OWN_FRAME_BYTES) {
        /* The values go as a frame of their own: the transport frees the buffer once sent,
         * and the next SYNC takes a new one. Copying the answer into its payload was 4.5% of a
         * 4-node KGE run's engine samples, 1.2% without the values (perf; docs/benchmarks.md,
         * session 35). */
        out->own = f->buf[B_VALUES].p;
        f->buf[B_VALUES] = (scratch_buf_t){NULL, 0};
    }
    const outbox_t *ob = &self->outbox;
    if (outbox_holds(ob, origin)) {
        static const char roles[] = OUTBOX_ROLES;
        for (int i = 0; i < OUTBOX_ARRAYS; i++)
            out->a[8 + i] = (carr_t){ob->peers[origin].a[i].p,
                                     outbox_bytes(ob, origin, i) / wire_itemsize(roles[i])};
        out->narrays = 20;
    }
    return 1;
}

void directory_sync_sent(PyObject *directory, int64_t origin) {
    DirectoryObject *self = (DirectoryObject *)directory;
    if (outbox_holds(&self->outbox, origin)) outbox_clear(&self->outbox, origin);
}

void sync_fast_free(sync_fast_t *f) {
    for (int i = 0; i < SF_BUFS; i++) scratch_free(&f->buf[i]);
}

/* serve_syncs(variant, counts) -> None: see the method table. */
PyObject *Directory_serve_syncs(DirectoryObject *self, PyObject *args) {
    PyObject *ovariant, *ocounts = Py_None;
    if (!PyArg_ParseTuple(args, "O|O", &ovariant, &ocounts)) return NULL;
    sync_fast_t *f = &self->fast;
    if (ovariant == Py_None) { /* off; the counts stay referenced (the engine may be serving) */
        f->on = 0;
        Py_RETURN_NONE;
    }
    const long variant = PyLong_AsLong(ovariant);
    if (variant == -1 && PyErr_Occurred()) return NULL;
    if (variant < -1 || variant > POLICY_RELOCATION_ONLY || (variant >= 0 && !self->d.masks)) {
        PyErr_SetString(PyExc_ValueError, "serve_syncs: a variant of policy.h that this "
                                          "directory keeps masks for, or -1");
        return NULL;
    }
    const intent_counts_t *counts = NULL;
    if (ocounts != Py_None && !(counts = dm_intent_counts(ocounts, "serve_syncs"))) return NULL;
    if (f->counts_obj && f->counts_obj != (void *)ocounts) {
        PyErr_SetString(PyExc_ValueError, "serve_syncs: the intent counts cannot change");
        return NULL;
    }
    if (!f->counts_obj && counts) f->counts_obj = Py_NewRef(ocounts);
    f->counts = counts;
    f->variant = (int)variant;
    f->on = 1;
    Py_RETURN_NONE;
}

/* native_taken() -> None, or (counters, arrived, relocated_in, (answers, refreshed, ...)):
 * see the method table. */
PyObject *Directory_native_taken(DirectoryObject *self, PyObject *unused) {
    sync_fast_t *f = &self->fast;
    if (!f->changed) Py_RETURN_NONE;
    static const char *names[SF_COUNTERS] = SF_COUNTER_NAMES;
    PyObject *counters = PyDict_New();
    for (int i = 0; counters && i < SF_COUNTERS; i++) {
        if (!f->counters[i]) continue;
        PyObject *v = PyLong_FromLongLong(f->counters[i]);
        if (!v || PyDict_SetItemString(counters, names[i], v) < 0) Py_CLEAR(counters);
        Py_XDECREF(v);
    }
    if (!counters) return NULL;
    PyObject *answered = answer_fast_taken(self);
    if (!answered) {
        Py_DECREF(counters);
        return NULL;
    }
    PyObject *result = Py_BuildValue("NOON", counters, f->arrived ? Py_True : Py_False,
                                     f->relocated_in ? Py_True : Py_False, answered);
    if (!result) return NULL;
    memset(f->counters, 0, sizeof f->counters);
    f->arrived = f->relocated_in = f->changed = 0;
    return result;
}

/* --- a worker's pull routed for the transport (zmq_calls.c) ------------------------------- */

int64_t directory_route_pull(PyObject *directory, const int64_t *keys, int64_t n, int64_t *hop) {
    DirectoryObject *self = (DirectoryObject *)directory;
    const directory_t *d = &self->d;
    const intent_counts_t *c = self->fast.counts;
    if (!self->ready || !self->fast.on) return -1;
    int64_t here = 0;
    for (int64_t i = 0; i < n; i++) { /* Directory.route_own's choice, for a pull */
        if (keys[i] < 0 || keys[i] >= d->store->num_keys || !dir_in_channel(d, keys[i]))
            return -1;
        hop[i] = dm_route_hop(d, c, keys[i], 0);
        if (hop[i] < -1 || hop[i] >= d->world_size) return -1; /* on its way here, or no rank */
        here += hop[i] == -1;
    }
    return here;
}

int directory_gather_one(PyObject *directory, int64_t key, float *row, int64_t floats) {
    const store_t *s = ((DirectoryObject *)directory)->d.store;
    int64_t missing;
    return store_gather(s, &key, 1, row, floats, &missing) == 0 ? 0 : -1;
}

int directory_scatter_one(PyObject *directory, int64_t key, const float *row, int64_t floats) {
    const store_t *s = ((DirectoryObject *)directory)->d.store;
    int64_t missing;
    return store_scatter(s, &key, 1, row, floats, &missing, 0) == 0 ? 0 : -1;
}

int directory_learn_native(PyObject *directory, const int64_t *keys, int64_t n, int64_t rank) {
    DirectoryObject *self = (DirectoryObject *)directory;
    if (dir_reserve(&self->d, n) < 0) return -1;
    for (int64_t i = 0; i < n; i++) /* Directory.learn */
        if (store_state(self->d.store, keys[i]) != KEY_OWNER) rec_set_hint(&self->recs, keys[i], rank);
    return 0;
}
