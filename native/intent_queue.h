/* One worker's intents (see adapm/_engine/intents.py): signalled -> acted on -> expired.
 *
 * A worker signals a batch of keys for clocks [start, end); the engine's sync round acts on the
 * batches whose start is below the action timer's horizon and expires acted batches whose end
 * has passed, counting each batch's keys in and out of the node's per-key counts
 * (intents_count). Two binary heaps of batches: pending by (start, order signalled), acted by
 * (end, order signalled). In Python this was ~4 heap operations and a tuple per batch and
 * clock, plus concatenating a round's batches before counting them (bench/adaptive.py, 2
 * nodes: ~120 us of a ~1.5 ms round). Touches no Python object; not thread-safe (the binding
 * keeps the GIL for every call, which serialises the worker's signal and the engine's collect).
 */
#ifndef ADAPM_INTENT_QUEUE_H
#define ADAPM_INTENT_QUEUE_H

#include <stdint.h>

#include "intents.h"

typedef struct {
    int64_t order; /* start (pending) or end (acted): the heap's order */
    int64_t start, end, seq, n;
    int64_t *keys; /* owned: malloc'd copy */
} intent_batch_t;

typedef struct {
    intent_batch_t *items;
    int64_t len, cap;
} batch_heap_t;

typedef struct {
    batch_heap_t pending, acted;
    batch_heap_t expired; /* scratch of iq_collect */
    int64_t next_seq;
    int64_t queued_keys; /* keys of all batches held (pending and acted) */
    int64_t signalled;   /* batches signalled since the last collect */
} intent_queue_t;

void iq_init(intent_queue_t *q);
void iq_free(intent_queue_t *q);

/* Copies keys[0..n) as a batch for [start, end). Returns 0, or -1 if out of memory. */
int iq_signal(intent_queue_t *q, const int64_t *keys, int64_t n, int64_t start, int64_t end);

/* A round with the worker at `clock`: acts on pending batches with start < horizon (those over
 * already, end <= clock, are dropped uncounted), counting their keys +1 into the node's counts,
 * then expires acted batches with end <= clock, counting theirs -1 (intents_count; counts need
 * room for q->queued_keys keys). Writes the number of keys acted on, and whether any batch was
 * acted on or expired. Returns 0, or -1 if out of memory or a count would go negative (the
 * counts were changed elsewhere: cannot happen). */
int iq_collect(intent_queue_t *q, int64_t clock, int64_t horizon, intent_counts_t *counts,
               int64_t *acted_keys, int *changed);

/* Whether an intent active at `clock` (start <= clock < end) waits for a round to act on it:
 * the worker has reached it before the engine did. O(pending batches). */
int iq_late(const intent_queue_t *q, int64_t clock);

/* Whether every intent active at `clock` (start <= clock < end) was acted on and every key of
 * those is told: what wait_sync waits for. */
int iq_served(const intent_queue_t *q, int64_t clock, const intent_counts_t *counts);

#endif
