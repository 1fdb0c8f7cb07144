/* The answers to this node's sync-round requests taken in by the transport, without Python.
 *
 * A round sends one SYNC per owner (adapm/_engine/state.py); each is answered by a SYNC_RESP
 * (from the owner, or from the node an entry was passed on to), with the moves held for this
 * node. Python took every one of them: checks, moves, redirected reports, returned deltas,
 * the answered entries' hints, refreshes and acknowledgements (NodeState._apply_sync_answer), its
 * request's bookkeeping; at 4 and 8 nodes the larger part of the engine loop's Python per
 * round. Here the transport's receive call takes an answer in itself when Python registered
 * the request (Directory.round_open): its moves, its redirected reports (hints corrected, those
 * owned here by now decided, the rest reported again), its returned deltas whose keys are owned
 * here once the moves are in, and its answered entries. A returned delta whose key moved on
 * (Python passes it on), and anything the checks refuse (Python drops it and counts), take the
 * Python path. What NodeState does besides is left for it, as for a SYNC served here
 * (sync_fast.h): the entries answered per request (it finishes the round when none is left),
 * whether a replica was refreshed, the redirected reports' bookkeeping, and, applied to the
 * intent counts with the GIL at native_taken, the reports acknowledged or to report again (the
 * workers read the counts holding the GIL).
 *
 * The number of unanswered entries of a registered request lives here, for both paths: Python
 * takes its part through Directory.round_answered and checks an answer against round_answered's
 * count, so the two never disagree. */
#define _GNU_SOURCE /* clock_gettime */
#include <time.h>

#include "directory_object.h"

static round_ctx_t *find_round(sync_fast_t *f, int64_t req) {
    for (int64_t i = 0; i < f->nrounds; i++)
        if (f->rounds[i].req == req) return &f->rounds[i];
    return NULL;
}

static void release_views(round_ctx_t *c) { /* with the GIL */
    Py_buffer *v = c->views;
    if (!v) return;
    PyBuffer_Release(&v[0]);
    PyBuffer_Release(&v[1]);
    PyMem_Free(v);
    c->views = NULL;
}

/* Drops the requests with no entry left (with the GIL). */
static void forget_done(sync_fast_t *f) {
    int64_t kept = 0;
    for (int64_t i = 0; i < f->nrounds; i++) {
        if (f->rounds[i].remaining <= 0) release_views(&f->rounds[i]);
        else f->rounds[kept++] = f->rounds[i];
    }
    f->nrounds = kept;
}

void answer_fast_free(sync_fast_t *f, int release) {
    for (int64_t i = 0; release && i < f->nrounds; i++) release_views(&f->rounds[i]);
    free(f->rounds);
    free(f->answers);
    free(f->acks);
    free(f->ack_flags);
    free(f->again);
    for (int i = 0; i < (int)(sizeof f->abuf / sizeof f->abuf[0]); i++) scratch_free(&f->abuf[i]);
    f->rounds = NULL;
    f->answers = f->acks = f->again = NULL;
    f->ack_flags = NULL;
    f->nrounds = f->rounds_cap = f->alen = f->acap = f->aklen = f->akcap = 0;
    f->againlen = f->againcap = 0;
}

static int grow64(int64_t **p, int64_t *cap, int64_t need, int64_t first) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? 2 * *cap : first;
    while (c < need) c *= 2;
    int64_t *grown = realloc(*p, (size_t)c * sizeof(int64_t));
    if (!grown) return -1;
    *p = grown;
    *cap = c;
    return 0;
}

/* Room for `more` answer triples, `acks` acknowledgements and `again` keys to report again;
 * 0, or -1 (nothing that was there changed). */
static int answers_room(sync_fast_t *f, int64_t more, int64_t acks, int64_t again) {
    if (grow64(&f->answers, &f->acap, f->alen + 3 * more, 96) < 0
        || grow64(&f->again, &f->againcap, f->againlen + again, 256) < 0)
        return -1;
    if (f->aklen + acks > f->akcap) {
        int64_t cap = f->akcap;
        if (grow64(&f->acks, &cap, f->aklen + acks, 1024) < 0) return -1;
        uint8_t *flags = realloc(f->ack_flags, (size_t)cap);
        if (!flags) return -1; /* the keys' room stays: harmless */
        f->ack_flags = flags;
        f->akcap = cap;
    }
    return 0;
}

/* NodeState._redirected without Python (Directory.redirected's pass): intent reports of this node
 * that reached a node not owning their key, which says where it is (ranks). Their hints are
 * corrected; those owned here by now (the relocation came with the answer) and not pinned by
 * a worker's local sample are decided at once (their acknowledgements journalled); the rest
 * are reported again by the next round (journalled, applied to the counts at native_taken),
 * which starts at once unless src only deferred them. Room was made by the caller. 0, or -1
 * (fatal says why). */
static int redirected(DirectoryObject *self, int64_t src, const int64_t *keys,
                      const uint8_t *flags, const int64_t *moved, const int64_t *ranks,
                      int64_t n, int64_t *mine, uint8_t *mine_flags, const char **fatal) {
    sync_fast_t *f = &self->fast;
    const directory_t *d = &self->d;
    pins_t *locked = f->variant >= 0 ? &self->pins : NULL;
    if (locked) pins_lock(locked);
    int64_t deferred = 0, na = 0, nmine = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[moved[i]];
        const uint8_t flag = flags[moved[i]];
        rec_set_hint(&self->recs, key, ranks[i]);
        const int owner = store_state(d->store, key) == KEY_OWNER;
        const int pinned = owner && locked && !flag && pins_has(locked, key);
        deferred += ranks[i] == src || pinned; /* neither starts a round of its own */
        if (owner && !pinned) {
            mine[nmine] = key;
            mine_flags[nmine++] = flag;
        } else {
            f->again[f->againlen + na++] = key;
        }
    }
    if (nmine) {
        dm_decision_t dec;
        const int ok = dm_decide(self, f->variant, d->rank, mine, nmine, mine_flags, 0, &dec);
        if (ok < 0) {
            if (locked) pins_unlock(locked);
            *fatal = ok == -1 ? "out of memory deciding on redirected reports"
                              : "a decision on redirected reports broke an invariant";
            return -1;
        }
        f->counters[SF_RELOCATIONS_OUT] += dec.relocated;
        f->counters[SF_DROPS_AT_OWNER] += dec.dropped;
        for (int64_t i = 0; i < nmine; i++) {
            f->acks[f->aklen] = mine[i];
            f->ack_flags[f->aklen++] = mine_flags[i];
        }
        f->arrived = 1;
    }
    if (locked) pins_unlock(locked);
    f->againlen += na;
    f->counters[SF_REDIRECTED] += n;
    if (na) {
        f->deferred_again += deferred;
        f->redirected_now |= na > deferred;
    }
    return 0;
}

/* Whether key is among keys[0..n). */
static int among(const int64_t *keys, int64_t n, int64_t key) {
    for (int64_t i = 0; i < n; i++)
        if (keys[i] == key) return 1;
    return 0;
}

int directory_answer_fast(PyObject *directory, int64_t src, int64_t req, const carr_t *in,
                          int narrays, const char **fatal) {
    DirectoryObject *self = (DirectoryObject *)directory;
    sync_fast_t *f = &self->fast;
    const directory_t *d = &self->d;
    if (!self->ready || !f->on || (narrays != 8 && narrays != 20) || src < 0
        || src >= d->world_size || src == d->rank)
        return 0;
    round_ctx_t *c = find_round(f, req);
    if (!c || c->remaining <= 0) return 0;
    carr_t a[20];
    memset(a, 0, sizeof a);
    memcpy(a, in, (size_t)narrays * sizeof(carr_t));
    const Py_buffer *v = c->views;
    const int64_t *keys = v[0].buf;
    const uint8_t *flags = v[1].buf;
    char why[CHECK_WHY];
    if (check_message(d, WIRE_SYNC_RESP, a, &self->scratch, why) != 0
        || check_sync_answer(d, keys, c->nkeys, c->ni, c->nd, c->remaining, req, a,
                             &self->scratch, why) != 0)
        return 0; /* Python drops it, saying why */
    const int64_t n = a[0].n, *pos = a[0].p, nm = a[4].n, *moved = a[4].p, *mranks = a[5].p;
    const int64_t nb = a[6].n, *back = a[6].p, *rkeys = a[8].p, nrel = a[8].n;
    if (nm && f->variant < 0) return 0; /* nothing decides here: Python's (not reached) */
    /* A returned delta is added here where its key is owned once the moves are in (its owner
     * relocated it to this node); one whose key moved on takes the Python path, which passes
     * it on (NodeState._returned). */
    int64_t nbd = 0, scanned = 0;
    for (int64_t i = 0; i < nb; i++) {
        if (back[i] >= c->ni + c->nd) continue; /* a returned check: nothing to do */
        const int64_t key = keys[back[i]];
        nbd++;
        if (store_state(d->store, key) == KEY_OWNER) continue;
        if ((scanned += nrel) > (1 << 16) || !among(rkeys, nrel, key)) return 0;
    }
    int64_t acks = nm;
    for (int64_t i = 0; i < n; i++) acks += pos[i] < c->ni;
    int64_t *by_pos = scratch_room(&f->abuf[0], 8 * (c->nkeys ? c->nkeys : 1));
    int64_t *mine = scratch_room(&f->abuf[1], 8 * (nm ? nm : 1));
    uint8_t *mine_flags = scratch_room(&f->abuf[2], nm ? nm : 1);
    int64_t *bkeys = scratch_room(&f->abuf[3], 8 * (nbd ? nbd : 1));
    if (!by_pos || !mine || !mine_flags || !bkeys || answers_room(f, 1, acks, nm) < 0
        || fast_moves_room(self, a + 8, n + nm) < 0)
        return 0; /* out of memory: Python tries, and says so */
    /* The moves first (NodeState._moves_in): a relocation before the answer that reports it. */
    if (fast_moves_in(self, src, a + 8, fatal) < 0) return -1;
    /* Returned deltas before the redirected reports, whose decisions may relocate a key away
     * (a dropped replica's ended intent is a report and a delta of one key): added to the
     * value it leaves with, where Python passes the delta on after it. */
    if (nbd) { /* NodeState._returned: all owned here now (checked above) */
        for (int64_t i = 0, j = 0; i < nb; i++)
            if (back[i] < c->ni + c->nd) bkeys[j++] = keys[back[i]];
        int64_t *missing = by_pos; /* scratch until the answer's entries below */
        if (store_scatter(d->store, bkeys, nbd, a[7].p, a[7].n, missing, 0) != 0) {
            *fatal = "a returned delta's key was not owned here after the moves";
            return -1;
        }
        f->counters[SF_RETURNED] += nbd;
    }
    if (nm && redirected(self, src, keys, flags, moved, mranks, nm, mine, mine_flags, fatal) < 0)
        return -1;
    memset(by_pos, 0xff, (size_t)c->nkeys * sizeof(int64_t)); /* Directory.apply_answer's */
    for (int64_t i = 0; i < n; i++)
        if (pos[i] >= c->ni) by_pos[pos[i]] = 1;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t); /* the clock of Python's time.monotonic */
    const int64_t reports = dir_apply_answer(d, keys, c->nkeys, flags, c->ni, src, pos, a[1].p,
                                             n, a[2].p, a[2].n, a[3].p, a[3].n,
                                             (double)t.tv_sec + 1e-9 * (double)t.tv_nsec, by_pos);
    for (int64_t i = 0; i < n; i++)
        if (pos[i] < c->ni) {
            f->acks[f->aklen] = keys[pos[i]];
            f->ack_flags[f->aklen++] = flags[pos[i]];
        }
    c->remaining -= n + nm + nb;
    f->answers[f->alen++] = req;
    f->answers[f->alen++] = src;
    f->answers[f->alen++] = n + nm + nb;
    f->arrived |= reports > 0;
    f->refreshed |= a[2].n > 0;
    f->changed = 1;
    return 1;
}

int directory_round_answered(PyObject *directory) {
    const sync_fast_t *f = &((DirectoryObject *)directory)->fast;
    for (int64_t i = 0; i < f->nrounds; i++)
        if (f->rounds[i].remaining > 0) return 0;
    return 1;
}

PyObject *answer_fast_taken(DirectoryObject *self) {
    sync_fast_t *f = &self->fast;
    if (!f->counts_obj) f->aklen = f->againlen = 0; /* no counts: no reports were sent */
    if (f->aklen || f->againlen) {
        /* The counts given with serve_syncs (answers are taken only while it is on); in the
         * order Python applies them (NodeState._redirected, then apply_answer). */
        intent_counts_t *told = &((IntentCountsObject *)f->counts_obj)->c;
        if (ic_reserve(told, f->aklen + f->againlen) < 0) return PyErr_NoMemory();
        ic_acknowledge(told, f->acks, f->ack_flags, f->aklen);
        ic_report_again(told, f->again, f->againlen);
        f->aklen = f->againlen = 0;
    }
    PyObject *answers = dm_keys_copy(f->answers, f->alen);
    if (!answers) return NULL;
    PyObject *result = Py_BuildValue("NOLO", answers, f->refreshed ? Py_True : Py_False,
                                     (long long)f->deferred_again,
                                     f->redirected_now ? Py_True : Py_False);
    if (!result) return NULL;
    f->alen = f->deferred_again = 0;
    f->refreshed = f->redirected_now = 0;
    forget_done(f);
    return result;
}

/* Room for n more open requests; -1 with MemoryError set. */
static int reserve_rounds(sync_fast_t *f, int64_t n) {
    if (f->nrounds + n <= f->rounds_cap) return 0;
    int64_t cap = f->rounds_cap ? 2 * f->rounds_cap : 16;
    while (cap < f->nrounds + n) cap *= 2;
    round_ctx_t *grown = realloc(f->rounds, (size_t)cap * sizeof(round_ctx_t));
    if (!grown) {
        PyErr_NoMemory();
        return -1;
    }
    f->rounds = grown;
    f->rounds_cap = cap;
    return 0;
}

/* Registers one round request (round_open's work for one (req, count) pair); -1 with an
 * exception set. */
static int open_one(DirectoryObject *self, long long req, PyObject *okeys, PyObject *oflags,
                    long long ni, long long nd, long long count) {
    sync_fast_t *f = &self->fast;
    if (find_round(f, req)) {
        PyErr_Format(PyExc_ValueError, "round_open: request %lld is open already", req);
        return -1;
    }
    Py_buffer *v = PyMem_Malloc(2 * sizeof(Py_buffer));
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    if (PyObject_GetBuffer(okeys, &v[0], PyBUF_C_CONTIGUOUS) < 0) {
        PyMem_Free(v);
        return -1;
    }
    if (PyObject_GetBuffer(oflags, &v[1], PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&v[0]);
        PyMem_Free(v);
        return -1;
    }
    round_ctx_t c = {req, v[0].len / 8, ni, nd, count, v};
    if (v[0].len % 8 || v[0].itemsize != 8 || v[1].itemsize != 1 || ni < 0 || nd < 0
        || ni + nd > c.nkeys || v[1].len < ni || count <= 0 || count > c.nkeys
        || dm_check_keys(self, v[0].buf, c.nkeys) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "round_open: int64 keys, a uint8 flag per intent "
                                              "report, 0 <= num_intents + num_deltas <= keys, "
                                              "0 < count <= keys");
        release_views(&c);
        return -1;
    }
    if (reserve_rounds(f, 1) < 0) {
        release_views(&c);
        return -1;
    }
    f->rounds[f->nrounds++] = c;
    return 0;
}

/* round_open(requests, keys, flags, num_intents, num_deltas) -> None: see the method table.
 * One call per round: the requests (a list of (req, count) pairs) share the round's keys. All
 * are checked before any is registered. */
PyObject *Directory_round_open(DirectoryObject *self, PyObject *args) {
    long long ni, nd;
    PyObject *requests, *okeys, *oflags;
    if (!PyArg_ParseTuple(args, "O!OOLL", &PyList_Type, &requests, &okeys, &oflags, &ni, &nd))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(requests);
    Py_buffer kv;
    if (PyObject_GetBuffer(okeys, &kv, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    const long long nkeys = kv.len / 8;
    PyBuffer_Release(&kv);
    long long *pairs = PyMem_Malloc((size_t)(n ? n : 1) * 2 * sizeof(long long));
    if (!pairs) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(requests, i);
        long long *rc = pairs + 2 * i;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
            || !PyLong_Check(PyTuple_GET_ITEM(pair, 0))
            || !PyLong_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "round_open: requests is a list of (request, "
                                             "count) tuples of ints");
            goto fail;
        }
        rc[0] = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 0));
        rc[1] = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
        if (PyErr_Occurred()) goto fail;
        int taken = find_round(&self->fast, rc[0]) != NULL;
        for (Py_ssize_t j = 0; j < i; j++) taken |= pairs[2 * j] == rc[0];
        if (taken) {
            PyErr_Format(PyExc_ValueError, "round_open: request %lld is open already", rc[0]);
            goto fail;
        }
        if (rc[1] <= 0 || rc[1] > nkeys) {
            PyErr_SetString(PyExc_ValueError, "round_open: 0 < count <= keys");
            goto fail;
        }
    }
    /* What is left to fail is the same for every request (the shared buffers): the first open
     * fails before anything is registered. */
    if (reserve_rounds(&self->fast, n) < 0) goto fail;
    for (Py_ssize_t i = 0; i < n; i++)
        if (open_one(self, pairs[2 * i], okeys, oflags, ni, nd, pairs[2 * i + 1]) < 0) goto fail;
    PyMem_Free(pairs);
    Py_RETURN_NONE;
fail:
    PyMem_Free(pairs);
    return NULL;
}

/* round_answered(req, n) -> remaining or None: see the method table. */
PyObject *Directory_round_answered(DirectoryObject *self, PyObject *args) {
    long long req, n;
    if (!PyArg_ParseTuple(args, "LL", &req, &n)) return NULL;
    round_ctx_t *c = find_round(&self->fast, req);
    if (!c) Py_RETURN_NONE;
    if (n < 0 || n > c->remaining) {
        PyErr_Format(PyExc_ValueError, "round_answered: %lld entries of request %lld, which "
                     "waits for %lld", n, req, (long long)c->remaining);
        return NULL;
    }
    c->remaining -= n;
    const long long left = c->remaining;
    if (left <= 0) forget_done(&self->fast);
    return PyLong_FromLongLong(left);
}
