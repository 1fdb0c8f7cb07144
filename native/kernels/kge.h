/* Training kernel of the knowledge graph embedding (KGE) app: one batch of positives and their
 * negatives, trained sample by sample with AdaGrad, as the original AdaPM C++ KGE app does per
 * data point (so a batch equals per-example SGD over its samples in order).
 *
 * Memory is the caller's: the kernel works on rows of `values` (an entity row is
 * [embedding | AdaGrad accumulator], each entity_width floats; a relation row the same with
 * relation_width) and records every change it makes in `updates`. One allocation per call (the
 * gradients of a step), no Python, no global state: calls on distinct buffers may run in
 * parallel.
 */
#ifndef ADAPM_KERNELS_KGE_H
#define ADAPM_KERNELS_KGE_H

#include <stdint.h>

enum { KGE_COMPLEX = 0, KGE_DISTMULT = 1, KGE_RESCAL = 2 };

/* Largest dim accepted: keeps every width and offset sum far from int64 overflow. */
#define KGE_MAX_DIM ((int64_t)1 << 20)

/* Embedding widths (floats, accumulators not counted) of model at dimension dim.
 * ComplEx: (2d, 2d); DistMult: (d, d); RESCAL: (d, d*d). Returns -1 for an unknown model or a
 * dim outside [1, KGE_MAX_DIM], else 0. */
int kge_widths(int model, int64_t dim, int64_t *entity_width, int64_t *relation_width);

typedef struct {
    int model;                /* KGE_COMPLEX, KGE_DISTMULT or KGE_RESCAL */
    int64_t dim;
    float *values;            /* rows of the batch's unique keys */
    int64_t num_values;       /* floats in values (and in updates) */
    const int64_t *offsets;   /* float offset of unique row i in values */
    int64_t num_rows;         /* length of offsets */
    const int64_t *triples;   /* num_triples x (head, relation, tail), indices into offsets */
    int64_t num_triples;
    const int64_t *neg_heads; /* num_triples x negs_per_side entity rows */
    const int64_t *neg_tails; /* same shape */
    int64_t negs_per_side;
    float *updates;           /* num_values floats; must not overlap values */
    float lr, reg_entity, reg_relation;
} kge_batch_t;

/* Return codes of kge_train_batch. */
enum { KGE_OK = 0, KGE_BAD_ROW = -1, KGE_NO_MEMORY = -2 };

/* Where the bounds check found the first bad index. */
enum { KGE_AT_HEAD, KGE_AT_RELATION, KGE_AT_TAIL, KGE_AT_NEG_HEAD, KGE_AT_NEG_TAIL };

typedef struct {
    int where;        /* KGE_AT_* */
    int64_t position; /* triple number (head/relation/tail) or position in the negatives array */
    int64_t row;      /* the bad index into offsets */
    int bad_offset;   /* 0: row outside [0, num_rows); 1: offsets[row] puts it outside values */
} kge_fault_t;

/* Checks every row index of the batch: inside [0, num_rows), and its row (2 * width floats)
 * inside values. Returns 0, or -1 with *fault describing the first bad index. */
int kge_check_batch(const kge_batch_t *b, kge_fault_t *fault);

/* Zeroes updates, then trains the batch: for each positive (h, r, t) in order, step(h, r, t, 1),
 * then for j < negs_per_side: step(h, r, neg_tails[i*K+j], 0), step(neg_heads[i*K+j], r, t, 0).
 * Each step computes all three gradients from the values before the step, then applies AdaGrad
 * to the rows s, r, o in that order (a row used twice in one step, e.g. s == o, is updated twice
 * in sequence). Adds the binary cross-entropy of every step to *bce_sum and the L2 penalty of
 * every positive to *reg_sum (both are set, not accumulated into).
 * Runs kge_check_batch first: returns KGE_BAD_ROW with *fault set and nothing written when it
 * fails; KGE_NO_MEMORY (nothing written) when the step scratch (2 * entity_width +
 * relation_width floats, allocated once per call) cannot be had; else KGE_OK. The model and dim
 * must be valid for kge_widths. */
int kge_train_batch(const kge_batch_t *b, double *bce_sum, double *reg_sum, kge_fault_t *fault);

#endif
