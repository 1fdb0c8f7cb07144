/* The Directory object (adapm._native.Directory) and what its three binding files share:
 * directory_module.c (the type, its state and the single passes: relocations in, replicas in,
 * hints, homes, checks), serve_module.c (the owner's side and a worker's own request: decide and
 * hold moves, serve a SYNC, take a carrier's moves in, route a request, check its answer) and
 * round_module.c (a node's sync round: build it, take its answers and redirects in). */
#ifndef ADAPM_DIRECTORY_OBJECT_H
#define ADAPM_DIRECTORY_OBJECT_H

#include "check.h"
#include "directory.h"
#include "growable.h"
#include "module.h"
#include "outbox.h"
#include "sync_fast.h"

typedef struct {
    PyObject_HEAD
    directory_t d;
    PyObject *store;         /* the StoreObject whose store_t d.store points into */
    replica_set_t held;      /* the keys held here as replicas (d.held) */
    records_t recs;          /* d.recs */
    pins_t pins;             /* d.pins */
    check_scratch_t scratch; /* check_message's and check_sync_answer's */
    outbox_t outbox;         /* moves decided here, held per peer until sent (outbox.h) */
    scratch_buf_t decide_buf[5]; /* dm_decide's */
    scratch_buf_t round_buf[8];  /* a round's build (round_module.c: round_buffers) */
    sync_fast_t fast;        /* SYNCs served inside the transport (sync_fast.h) */
    PyObject *counts;        /* the IntentCounts whose counts d.counts points into, or NULL */
    int ready;
} DirectoryObject;

/* --- helpers (directory_module.c) ------------------------------------------------------- */

/* The store's repeated-key check (module.h) for this directory's batches. */
int dm_refuse_repeated(DirectoryObject *self, const int64_t *keys, int64_t n, const char *what);
/* Room for n new records, or MemoryError (-1). */
int dm_reserve(DirectoryObject *self, int64_t n);
/* 0, or -1 with IndexError naming the first key outside the key space. */
int dm_check_keys(const DirectoryObject *self, const int64_t *keys, int64_t n);
/* A new bytearray of n entries of itemsize bytes; its data in *ptr. */
PyObject *dm_new_array(Py_ssize_t n, Py_ssize_t itemsize, void **ptr);
/* A numpy int64 array holding a copy of keys[0..n). NULL with an exception set. */
PyObject *dm_keys_copy(const int64_t *keys, int64_t n);
/* A tuple of count new bytearrays of the given byte sizes, their data pointers in ptrs. */
PyObject *dm_new_buffers(int count, const Py_ssize_t *bytes, void **ptrs);
/* The n bytearrays as numpy views of the codec's dtypes (roles: check.c's letters). */
PyObject *dm_as_views(PyObject *const *bufs, const char *roles, int n);
/* Intent counts of this node's (an IntentCounts), or NULL with an exception set. */
intent_counts_t *dm_intent_counts(PyObject *obj, const char *what);
/* Borrows keys (int64, checked in range) and, if other is not NULL, a second buffer of itemsize
 * bytes per key; 0, or -1 with an exception set (nothing borrowed). */
int dm_keyed_buffers(DirectoryObject *self, PyObject *okeys, Py_buffer *kv, PyObject *other,
                     Py_buffer *ov, Py_ssize_t itemsize, const char *what);

/* A decision carried out by dm_decide: replicas dropped; keys relocated away, grouped by
 * destination (per_rank: world_size counts). The arrays live in the directory's scratch until
 * its next decision. */
typedef struct {
    int64_t dropped, relocated;
    const int64_t *keys, *per_rank;
} dm_decision_t;

/* The policy's verdict on node's reports for keys[0..n) (owned here, unique) with flags,
 * carried out: relocations and replica set-ups executed and their moves held for the peers
 * (outbox.h). No Python: callable without the GIL (engine thread). 0; -1 out of memory, -2 a
 * mask named a rank outside the world, -3 a key was not owned here (callers check first).
 * own_acked: see dir_policy_decide. */
int dm_decide(DirectoryObject *self, int variant, int64_t node, const int64_t *keys, int64_t n,
              const uint8_t *flags, int own_acked, dm_decision_t *out);

/* Where a worker's own request sends key (Directory.route_own; and a pull the transport sends
 * itself, sync_fast.c): -1 held here (a pull: owner or replica; a set: owner), -2 on its way
 * here as this node's reported intent is answered (an owner answers a report only after
 * sending the key: wait here rather than chase it), -3 on its way here (a relocation not
 * received yet), else the rank to ask; world_size or more only if a hint is broken. c: this
 * node's intent counts, or NULL. */
static inline int64_t dm_route_hop(const directory_t *d, const intent_counts_t *c, int64_t key,
                                   int is_set) {
    const int st = store_state(d->store, key);
    if (is_set ? st == KEY_OWNER : st != KEY_NONE) return -1;
    const ic_rec_t *e = c ? ic_find(c, key) : NULL;
    if (e && e->count > 0 && !e->told) return -2;
    const int64_t hint = rec_hint(d->recs, key);
    const int64_t h = hint == d->rank ? dir_next_hop(d, key) : hint;
    return h < 0 ? -3 : h;
}

/* The decision on node's reports for keys[0..n) (serve_module.c): see Directory.decide. owned:
 * the caller has just found every key owned here (else each is checked first: ValueError).
 * own_acked: see dir_policy_decide. */
PyObject *dm_decide_batch(DirectoryObject *self, int variant, int64_t node, const int64_t *keys,
                          int64_t n, const uint8_t *flags, int owned, int own_acked);

/* --- methods defined outside directory_module.c (their docstrings are in its table) ------- */

PyObject *Directory_relocate_in(DirectoryObject *self, PyObject *args);
PyObject *Directory_setup_in(DirectoryObject *self, PyObject *args);
PyObject *Directory_update_home(DirectoryObject *self, PyObject *args);

PyObject *Directory_take_moves(DirectoryObject *self, PyObject *arg);
PyObject *Directory_held_peers(DirectoryObject *self, PyObject *unused);
PyObject *Directory_decide(DirectoryObject *self, PyObject *args);
PyObject *Directory_serve_sync(DirectoryObject *self, PyObject *args);
PyObject *Directory_moves_in(DirectoryObject *self, PyObject *args);
PyObject *Directory_route_own(DirectoryObject *self, PyObject *args);
PyObject *Directory_staying(DirectoryObject *self, PyObject *args);
PyObject *Directory_draw_held(DirectoryObject *self, PyObject *args); /* held_draw.c */
PyObject *Directory_check_answer(DirectoryObject *self, PyObject *args);

void sync_fast_free(sync_fast_t *f); /* sync_fast.c */
/* A carrier's 12 move arrays m (wire order) from origin, taken in as NodeState._take_moves
 * does (relocations, replica set-ups, home updates; the counters of sync_fast_t follow them).
 * fast_moves_room first makes room for them and for more_records records besides: 0, or -1
 * out of memory (nothing changed). Then fast_moves_in: 0, or -1 (fatal says why; the node
 * cannot go on). Engine thread, no GIL. */
int fast_moves_room(DirectoryObject *self, const carr_t *m, int64_t more_records);
int fast_moves_in(DirectoryObject *self, int64_t origin, const carr_t *m, const char **fatal);
/* Round requests the transport may take answers of (answer_fast.c). */
void answer_fast_free(sync_fast_t *f, int release);
PyObject *Directory_round_open(DirectoryObject *self, PyObject *args);
PyObject *Directory_round_answered(DirectoryObject *self, PyObject *args);
/* native_taken's part for the answers taken natively: (answers, refreshed, deferred_again,
 * redirected_now) to Python, their acknowledgements and reports to send again applied to the
 * intent counts (with the GIL), finished requests released. NULL with an exception set. */
PyObject *answer_fast_taken(DirectoryObject *self);
PyObject *Directory_serve_syncs(DirectoryObject *self, PyObject *args);
PyObject *Directory_native_taken(DirectoryObject *self, PyObject *unused);

PyObject *Directory_round_build(DirectoryObject *self, PyObject *args);
PyObject *Directory_round_requests(DirectoryObject *self, PyObject *args);
PyObject *Directory_apply_answer(DirectoryObject *self, PyObject *args);
PyObject *Directory_redirected(DirectoryObject *self, PyObject *args);

#endif
