/* A peer's SYNC served inside the transport's receive call (zmq_serve.c), without Python: the
 * message's moves taken in, its entries served (dir_sync_plan, dir_sync_serve), the owned
 * intent reports decided (dm_decide) and the answer's arrays handed back for the transport to
 * encode and send, with the moves held for the peer. What NodeState would do besides is left
 * for it in this state: the counters, and whether keys arrived (requests waiting for them go
 * on); the local sampler's pool follows the store by itself (store.h). NodeState takes it at
 * its next event (Directory.native_taken).
 *
 * Only a SYNC whose every entry is answered here qualifies: owned (or relocated here by the
 * message's own moves), or a report or delta the answer redirects or returns. That is decided
 * before anything changes, conservatively; anything else (forwards, keys on their way here, a
 * message the checks refuse) goes to Python as before, which drops and counts what is unfit.
 * Measured on a 2-node KGE run: every SYNC qualified (rest 0 of 905). */
#ifndef ADAPM_SYNC_FAST_H
#define ADAPM_SYNC_FAST_H

#include <stdint.h>

#include "check.h"
#include "growable.h"
#include "intents.h"

/* NodeState's counters (adapm/_engine/state.py COUNTERS) that a served SYNC adds to. */
enum {
    SF_RELOCATIONS_IN, SF_RELOCATIONS_OUT, SF_REPLICA_SETUPS, SF_SETUPS_DISCARDED,
    SF_DROPS_AT_OWNER, SF_DEFERRED, SF_REDIRECTED, SF_RETURNED, SF_COUNTERS
};
#define SF_COUNTER_NAMES                                                                       \
    {"relocations_in", "relocations_out", "replica_setups", "replica_setups_discarded",         \
     "replica_drops_at_owner", "deferred_reports", "redirected_keys", "returned_deltas"}

#define SF_BUFS 26

/* A round request of this node that the transport may take the answers of (answer_fast.c,
 * Directory.round_open): its entries' keys (intent reports, ni of them, with their flags; then
 * nd deltas and the checks) as Python keeps them (the buffers held until it is done), and how
 * many entries are still unanswered. */
typedef struct {
    int64_t req, nkeys, ni, nd, remaining;
    void *views; /* two Py_buffers (keys, flags), released with the GIL */
} round_ctx_t;

typedef struct {
    int on;                        /* Directory.serve_syncs: serve SYNCs natively */
    int variant;                   /* the policy's (policy.h), -1: none acts on intent */
    void *counts_obj;              /* the IntentCounts kept alive (a PyObject *), or NULL */
    const intent_counts_t *counts; /* its counts (engine thread: only it writes them) */
    scratch_buf_t buf[SF_BUFS];
    int64_t counters[SF_COUNTERS];
    int arrived, relocated_in, changed;
    /* Answers to this node's round requests taken in by the transport (answer_fast.c): the
     * open requests; per answer (request, answering rank, entries answered) for NodeState;
     * the intent reports they acknowledged (keys and flags), applied to the counts with the
     * GIL at native_taken; whether a replica was refreshed. */
    round_ctx_t *rounds;
    int64_t nrounds, rounds_cap;
    int64_t *answers, *acks;
    uint8_t *ack_flags;
    int64_t alen, acap, aklen, akcap;
    int refreshed;
    /* Redirected intent reports (NodeState._redirected): the keys to report again with the next
     * round (applied to the counts at native_taken, with the GIL), how many of them only
     * because their owner deferred them, and whether others were redirected. */
    int64_t *again;
    int64_t againlen, againcap, deferred_again;
    int redirected_now;
    scratch_buf_t abuf[4]; /* answer_fast.c's scratch */
} sync_fast_t;

/* The answer's arrays: SYNC_RESP's 8, then the 12 move arrays held for the origin (narrays
 * 20), or only the 8 when none are held. Valid until the directory's next call. own: NULL, or
 * the refreshed values' buffer (a[3]) when they are large enough for a frame of their own
 * (WIRE_OWN_FRAME_BYTES): malloc'd, taken from the directory's scratch, now the caller's to
 * hand to the transport (or free), so that they are not copied into the payload. */
typedef struct {
    carr_t a[20];
    int narrays;
    void *own;
} sync_fast_answer_t;

#endif
