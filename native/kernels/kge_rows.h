/* A run of KGE batches in one call (the KGE app, adapm/apps/kge.py: KGETrainer.chunked), over
 * rows wherever they live (rows.h: the baseline's table, a node's store), so that a worker's
 * loop over many batches holds the GIL once per run instead of several times per batch.
 *
 * Per batch it does what KGETrainer.plan and KGETrainer.step do, in the same order with the same
 * arithmetic: the batch's distinct keys in order of first appearance among [heads | relations +
 * num_entities | tails] and each triple's rows in them (unique_inverse, native/unique.c), one
 * gather of [keys | sample] (the keys' rows, then the negatives'), kge_train_batch with the
 * negatives' rows after the keys' (neg_tails: the first half of the sample, neg_heads: the
 * second), and one scatter_add of [keys | sample] with the updates in that order.
 *
 * Uniform rows only (ComplEx, DistMult: entity and relation rows of the same width); RESCAL's
 * relation rows are longer, and its batches go through kge_train_batch.
 *
 * Memory is the caller's; no Python, no global state: runs on distinct scratch may run in
 * parallel (over the same rows, as the per-batch path's threads do: Hogwild reads, adds
 * serialised per key by the rows' owner).
 */
#ifndef ADAPM_KERNELS_KGE_ROWS_H
#define ADAPM_KERNELS_KGE_ROWS_H

#include <stdint.h>

#include "rows.h"

/* Why kge_train_rows returned (see there). */
enum { KGE_DONE = 0, KGE_STOP_PULL = 1, KGE_STOP_PUSH = 2 };

/* Its errors (returned, negative; *at says where). */
enum {
    KGE_RUN_BAD_POINT = -1,   /* points[*at] names an entity or relation outside the keys */
    KGE_RUN_BAD_SAMPLE = -2,  /* samples[*at] is not an entity key */
    KGE_RUN_ROWS_FAILED = -3, /* batch *at: the rows did not take its keys (see rows.h) */
    KGE_RUN_NO_MEMORY = -4,   /* batch *at: a per-batch allocation failed */
};

/* Rows of scratch per batch_size triples: every int scratch region and the float buffers hold
 * this many rows (3 keys per triple and 2 * neg negatives). */
#define KGE_RUN_ROWS_PER_TRIPLE(neg) (3 + 2 * (neg))
/* int64 scratch regions (each KGE_RUN_ROWS_PER_TRIPLE(neg) * batch_size items). */
#define KGE_RUN_INT_REGIONS 6

typedef struct {
    int model;                 /* KGE_COMPLEX or KGE_DISTMULT (uniform rows) */
    int64_t dim;
    float lr, reg_entity, reg_relation;
    int64_t num_entities;      /* entity e is key e, relation r key num_entities + r */
    int64_t negs_per_side;     /* K: each triple's sample holds 2 K entity keys */
    int64_t batch_size;
    const rows_t *rows;        /* num_keys keys of 2 * entity_width floats */
    /* Scratch: iscratch, KGE_RUN_INT_REGIONS * max_rows int64, max_rows =
     * KGE_RUN_ROWS_PER_TRIPLE(negs_per_side) * batch_size; values and updates, max_rows rows of
     * 2 * entity_width floats each, not overlapping. */
    int64_t *iscratch;
    float *values, *updates;
    /* KGE_STOP_PUSH's outputs: room for max_rows keys and rows. */
    int64_t *left_keys;
    float *left_rows;
} kge_run_t;

/* Trains the n triples of points (n x (head, relation, tail), entity and relation ids) as
 * batches of batch_size (the last maybe fewer): batch b is points[b * batch_size, ...). samples
 * holds each batch's negatives back to back, 2 K per triple: batch b's start at
 * 2 K b batch_size; the first half of a batch's are its corrupted tails, the second its
 * corrupted heads (as KGETrainer.step reads a pull_sample of 2 K m keys). losses[b] gets batch
 * b's loss (BCE plus L2, kge_train_batch's sums added), keys[b] the keys it gathered and
 * scatter-added (its distinct keys plus its sample).
 *
 * Every point and sample key is checked before anything is written: KGE_RUN_BAD_POINT with *at
 * the first bad triple, KGE_RUN_BAD_SAMPLE with *at the first sample key outside
 * [0, num_entities). A batch whose rows fail (KGE_RUN_ROWS_FAILED: a table whose rows are not
 * 2 * entity_width floats) or that cannot allocate (KGE_RUN_NO_MEMORY) returns that error with
 * *at its number: the batches before it were trained, nothing of it was written.
 *
 * Else it returns the number of batches trained, and *stop says why it returned:
 * - KGE_DONE: every batch;
 * - KGE_STOP_PULL: the next batch has keys whose rows are not held here; nothing of it was
 *   written (the caller trains it through the node, with its sample as drawn, and calls again
 *   from the batch after it);
 * - KGE_STOP_PUSH: the last batch trained had keys that left between its gather and its
 *   scatter_add (another thread moved them away): their keys went to left_keys and their
 *   updates to left_rows, *num_left of them; the caller pushes them through the node. */
int64_t kge_train_rows(const kge_run_t *r, const int64_t *points, int64_t n,
                       const int64_t *samples, double *losses, int64_t *keys, int *stop,
                       int64_t *num_left, int64_t *at);

#endif
