/* Rows that a native training loop of adapm._kernels reads and adds to by key, without the GIL,
 * wherever they live: the baseline's plain shared table (table.h: table_rows), or a node's
 * store (adapm._native's Store.rows(): a PyCapsule named ROWS_CAPSULE holding a rows_t; the
 * capsule keeps the store alive while it lives).
 *
 * gather copies the rows of keys[0..n) into out back to back (request order); scatter_add adds
 * vals (rows back to back, request order) to them, duplicates adding up. Both write the
 * positions of keys whose rows are not held here (a node's keys held by another node) to
 * missing (room for n) and return how many there are: those rows of out are left as they were,
 * those vals are not added. They return -1, writing nothing, where the keys' rows do not add up
 * to out_floats / vals_floats (or, for a table, a key's row is not inside it). Keys must lie in
 * [0, num_keys). Any thread, concurrently; no Python object is touched.
 *
 * The struct is shared by two extension modules built from one tree: abi says which layout a
 * capsule holds, so that a module never reads a struct of another version.
 */
#ifndef ADAPM_KERNELS_ROWS_H
#define ADAPM_KERNELS_ROWS_H

#include <stdint.h>
#include <string.h>

#define ROWS_CAPSULE "adapm._native.rows"
#define ROWS_ABI 2

typedef struct {
    int abi;             /* ROWS_ABI */
    void *ctx;           /* the functions' first argument */
    int64_t num_keys;    /* keys [0, num_keys) */
    int64_t row_floats;  /* every row's length; 0: per key (a table's key_len) */
    int64_t (*gather)(void *ctx, const int64_t *keys, int64_t n, float *out, int64_t out_floats,
                      int64_t *missing);
    int64_t (*scatter_add)(void *ctx, const int64_t *keys, int64_t n, const float *vals,
                           int64_t vals_floats, int64_t *missing);
    /* The positions of keys[0..n) whose rows are not held here now, to missing (room for n),
     * and how many there are; nothing is read or written (a snapshot: a key may come or go
     * right after). -1 where a key lies outside [0, num_keys). */
    int64_t (*missing)(void *ctx, const int64_t *keys, int64_t n, int64_t *missing);
} rows_t;

/* A training loop's STOP_PUSH: scatter_add found `left` keys of a batch gone (positions in
 * missing) between its gather and its write. Their keys and update rows (width floats each, in
 * updates by position) go to left_keys and left_rows, for the caller to push through the node. */
static inline void rows_hand_back(const int64_t *keys, const float *updates, int64_t width,
                                  const int64_t *missing, int64_t left, int64_t *left_keys,
                                  float *left_rows) {
    for (int64_t j = 0; j < left; j++) {
        const int64_t pos = missing[j];
        left_keys[j] = keys[pos];
        memcpy(left_rows + j * width, updates + pos * width, (size_t)width * sizeof(float));
    }
}

#endif
