/* A run of WV batches in two calls (the WV app, adapm/apps/wv.py: WVTrainer.chunked), over rows
 * wherever they live (rows.h: the baseline's table, a node's store), so that a worker's loop
 * over many batches holds the GIL a few times per run instead of several times per batch.
 *
 * wv_plan_run plans every batch of a run (wv_plan per batch: subsampling, windows, distinct
 * keys) into one set of arrays; the caller then draws each batch's negative pool (one PM sample
 * of a key per position, as WVTrainer.step's pull_sample) and wv_train_run trains the batches:
 * per batch what WVTrainer.step does, in the same order with the same arithmetic (wv_merge_pool,
 * one gather of [keys | extra pool keys], wv_train_batch, one scatter_add of the updates).
 *
 * A run's batch table: int64, WV_B_COLS per batch (see the enum). Its plan: positions back to
 * back over the batches (in_rows, out_rows and windows: rows 0, 1 and 2 of a 3 x cap array;
 * the rows of batch b count from its first key), each sentence's end counted from its batch's
 * first position, the batches' distinct keys back to back, the samples back to back (batch b
 * has WV_POOL(negatives, positions) of them).
 *
 * Memory is the caller's; no Python, no global state: runs on distinct scratch may run in
 * parallel over the same rows (Hogwild reads, adds serialised per key by the rows' owner).
 */
#ifndef ADAPM_KERNELS_WV_RUN_H
#define ADAPM_KERNELS_WV_RUN_H

#include <stdint.h>

#include "rows.h"

/* The batch table's columns. Sentences, seeds: the caller's; positions, keys: wv_plan_run's. */
enum {
    WV_B_SENTENCES,  /* sentences of the batch (the run's next ones) */
    WV_B_PLAN_SEED,  /* wv_plan's seed (subsampling and windows), in [0, 2^63) */
    WV_B_TRAIN_SEED, /* wv_train_batch's seed (the draws from the pool), in [0, 2^63) */
    WV_B_POSITIONS,  /* positions kept */
    WV_B_KEYS,       /* distinct keys */
    WV_B_COLS
};

/* A batch's pool: one draw per position where it has negatives and positions (as
 * WVTrainer.plan's sample_size). */
#define WV_POOL(negatives, positions) ((negatives) > 0 && (positions) > 0 ? (positions) : 0)

/* Why wv_train_run returned, and its errors (negative; *at says where). */
enum { WV_RUN_DONE = 0, WV_RUN_STOP_PULL = 1, WV_RUN_STOP_PUSH = 2 };
enum {
    WV_RUN_BAD_PLAN = -1,    /* batch *at: a row, window or sentence end outside its plan */
    WV_RUN_BAD_KEY = -2,     /* keys[*at] is outside [0, num_keys) or repeated in its batch */
    WV_RUN_BAD_SAMPLE = -3,  /* samples[*at] is outside [0, num_keys) */
    WV_RUN_ROWS_FAILED = -4, /* batch *at: the rows did not take its keys (see rows.h) */
};

/* Plans the batches of batches[0..nb) from the sentences [starts[s], starts[s] + lengths[s]) of
 * tokens (word ids < vocab), batch after batch, each with its plan seed: writes each batch's
 * positions and keys to the table, its positions to rows3 (3 x cap: in_rows, out_rows,
 * windows), its sentences' ends to ends and its keys to keys, back to back. cap must be at
 * least the run's tokens; keys needs room for 2 * cap. row_of: 2 * vocab int32, all -1 (left
 * so). Returns the run's positions, or -1 - s if sentence s (of the run) lies outside tokens
 * or holds a word not < vocab (the table's and plan's outputs are then undefined). */
int64_t wv_plan_run(const int32_t *tokens, int64_t num_tokens, const int64_t *starts,
                    const int64_t *lengths, int64_t nb, int64_t *batches, const double *keep,
                    int64_t vocab, int64_t window, int32_t *row_of, int64_t *rows3, int64_t cap,
                    int64_t *ends, int64_t *keys);

typedef struct {
    int64_t dim;
    int64_t width;     /* floats per row (wv_batch_t's: >= 2 * dim under AdaGrad, >= dim under
                        * SGD) */
    int64_t negatives; /* per (word, context) pair */
    int sgd;           /* wv_train_batch's */
    const rows_t *rows;
    int64_t num_keys;  /* the run's keys lie in [0, num_keys), num_keys <= rows->num_keys */
    /* Scratch: row_of, num_keys int32, all -1 (left so); iscratch, 4 * max_rows int64;
     * values and updates, max_rows rows each, not overlapping; max_rows at least a batch's keys
     * plus its pool. */
    int32_t *row_of;
    int64_t *iscratch;
    float *values, *updates;
    int64_t max_rows;
    /* WV_RUN_STOP_PUSH's outputs: room for max_rows keys and rows (NULL over a table). */
    int64_t *left_keys;
    float *left_rows;
} wv_run_t;

/* Trains the planned batches first..last-1 of the table (wv_plan_run's plan, cap as there;
 * samples back to back, WV_POOL per batch; the batches before first only give the offsets) with learning rate lrs[b] (cast to float, as wv_train_batch's
 * binding casts it) and the train seed. losses[b] gets batch b's loss, counts[2 b] its pairs
 * and counts[2 b + 1] the keys it gathered and scatter-added (its keys and its pool's others).
 *
 * The whole run is checked before anything is written: WV_RUN_BAD_PLAN, WV_RUN_BAD_KEY and
 * WV_RUN_BAD_SAMPLE with *at as the enum says (the table's own sizes are the binding's to
 * check). A batch whose rows fail returns WV_RUN_ROWS_FAILED with *at its number: the batches
 * before it were trained, nothing of it was written.
 *
 * Else it returns the number of batches trained (from first), and *stop says why it returned:
 * - WV_RUN_DONE: every batch;
 * - WV_RUN_STOP_PULL: the next batch has keys whose rows are not held here; nothing of it was
 *   written (the caller trains it through the node and calls again from the batch after it);
 * - WV_RUN_STOP_PUSH: the last batch trained had keys that left between its gather and its
 *   scatter_add: their keys went to left_keys and their updates to left_rows, *num_left of
 *   them (the caller pushes them). */
int64_t wv_train_run(const wv_run_t *r, int64_t first, int64_t last, const int64_t *batches,
                     const int64_t *rows3,
                     int64_t cap, const int64_t *ends, const int64_t *keys,
                     const int64_t *samples, const double *lrs, double *losses, int64_t *counts,
                     int *stop, int64_t *num_left, int64_t *at);

#endif
