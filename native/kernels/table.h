/* Baseline "plain shared array" table of the apps' single-node baseline: every key's row lives
 * at a fixed float offset of one flat float32 array; threads read it without locks (Hogwild
 * style) and add to it under a per-key spinlock, so no update is lost. Pure C over
 * caller-owned memory; no allocation, no Python.
 */
#ifndef ADAPM_KERNELS_TABLE_H
#define ADAPM_KERNELS_TABLE_H

#include <stdint.h>

#include "rows.h"

typedef struct {
    float *data;               /* the table */
    int64_t data_floats;
    const int64_t *key_offset; /* float offset of key k's row in data */
    const int64_t *key_len;    /* floats in key k's row */
    int64_t num_keys;          /* length of key_offset and key_len */
} table_t;

/* What table_check_keys found wrong (first failing position). */
enum { TABLE_OK = 0, TABLE_KEY_RANGE = 1, TABLE_ROW_OUTSIDE = 2, TABLE_PACKED_SIZE = 3 };

/* Checks keys[0..n): each in [0, num_keys), each row inside data, and the rows' lengths adding
 * up to exactly packed_floats. Returns TABLE_OK, or an error code with *bad_pos set to the first
 * failing position (for TABLE_PACKED_SIZE: -1 when the rows are short of packed_floats, else the
 * position where their sum passed it). */
int table_check_keys(const table_t *t, const int64_t *keys, int64_t n, int64_t packed_floats,
                     int64_t *bad_pos);

/* Checks (as table_check_keys), then copies the rows of keys into out back to back, in request
 * order. Nothing is written when the check fails. */
int table_gather(const table_t *t, const int64_t *keys, int64_t n, float *out, int64_t out_floats,
                 int64_t *bad_pos);

/* Checks, then adds upd (rows packed back to back in key order) to the rows of keys;
 * duplicate keys add up. Adds to one row are serialised (a spinlock per key), so concurrent
 * adds from several threads are never lost. Nothing is written when the check fails. */
int table_scatter_add(const table_t *t, const int64_t *keys, int64_t n, const float *upd,
                      int64_t upd_floats, int64_t *bad_pos);

/* The table as rows (rows.h) for the native training loops: no key is ever missing; a key whose
 * row is outside the table or whose rows do not add up to the floats given fails the call (-1,
 * nothing written). t must outlive the result. */
rows_t table_rows(const table_t *t);

#endif
