/* Plain shared array table ops (see table.h). */
#include "table.h"

#include <stdatomic.h>
#include <string.h>

#include "common.h"

/* Spinlocks serialise adds to a row, so no update is lost between threads (a baseline that
 * dropped concurrent adds to hot rows, e.g. KGE relations, trained measurably worse:
 * bench/kge.py). Reads take no lock. One lock byte per key (key mod 2^20: keys a million apart
 * share one, which only serialises them), shared by all tables: the locks of the keys a thread
 * adds to lie where its rows' keys do. The earlier 4,096 stripes by row offset fitted in 64
 * cache lines, so that every batch of two threads wrote every one of those lines: scatter_add
 * of 1,500 random rows of 20 floats took 29-32 us of CPU a call with one thread and 44-45 us
 * each with two; with a lock per key 29 us and 29-30 us. A lock is held for one row's adds. */
#define LOCK_BITS 20
static atomic_uchar key_locks[1 << LOCK_BITS]; /* 1 MiB, committed as keys touch it */

static inline atomic_uchar *lock_of(int64_t key) {
    return &key_locks[(uint64_t)key & ((UINT64_C(1) << LOCK_BITS) - 1)];
}

static inline void lock_key(int64_t key) {
    atomic_uchar *l = lock_of(key);
    while (atomic_exchange_explicit(l, 1, memory_order_acquire))
        while (atomic_load_explicit(l, memory_order_relaxed)) {}
}

static inline void unlock_key(int64_t key) {
    atomic_store_explicit(lock_of(key), 0, memory_order_release);
}

int table_check_keys(const table_t *t, const int64_t *keys, int64_t n, int64_t packed_floats,
                     int64_t *bad_pos) {
    int64_t sum = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = keys[i];
        *bad_pos = i;
        if (k < 0 || k >= t->num_keys) return TABLE_KEY_RANGE;
        const int64_t len = t->key_len[k];
        if (!range_inside(t->key_offset[k], len, t->data_floats)) return TABLE_ROW_OUTSIDE;
        /* len <= data_floats, so sum stays below packed_floats + data_floats: no overflow */
        sum += len;
        if (sum > packed_floats) return TABLE_PACKED_SIZE;
    }
    *bad_pos = -1;
    return sum == packed_floats ? TABLE_OK : TABLE_PACKED_SIZE;
}

int table_gather(const table_t *t, const int64_t *keys, int64_t n, float *out, int64_t out_floats,
                 int64_t *bad_pos) {
    const int err = table_check_keys(t, keys, n, out_floats, bad_pos);
    if (err != TABLE_OK) return err;
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = keys[i], len = t->key_len[k];
        memcpy(out, t->data + t->key_offset[k], (size_t)len * sizeof(float));
        out += len;
    }
    return TABLE_OK;
}

int table_scatter_add(const table_t *t, const int64_t *keys, int64_t n, const float *upd,
                      int64_t upd_floats, int64_t *bad_pos) {
    const int err = table_check_keys(t, keys, n, upd_floats, bad_pos);
    if (err != TABLE_OK) return err;
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = keys[i], len = t->key_len[k];
        float *restrict row = t->data + t->key_offset[k];
        const float *restrict src = upd;
        lock_key(k);
        for (int64_t j = 0; j < len; j++) row[j] += src[j];
        unlock_key(k);
        upd += len;
    }
    return TABLE_OK;
}

static int64_t rows_gather(void *ctx, const int64_t *keys, int64_t n, float *out,
                           int64_t out_floats, int64_t *missing) {
    int64_t bad;
    return table_gather(ctx, keys, n, out, out_floats, &bad) == TABLE_OK ? 0 : -1;
}

static int64_t rows_scatter_add(void *ctx, const int64_t *keys, int64_t n, const float *vals,
                                int64_t vals_floats, int64_t *missing) {
    int64_t bad;
    return table_scatter_add(ctx, keys, n, vals, vals_floats, &bad) == TABLE_OK ? 0 : -1;
}

static int64_t rows_missing(void *ctx, const int64_t *keys, int64_t n, int64_t *missing) {
    const table_t *t = ctx;
    for (int64_t i = 0; i < n; i++)
        if (keys[i] < 0 || keys[i] >= t->num_keys) return -1;
    return 0; /* the table holds every key */
}

rows_t table_rows(const table_t *t) {
    return (rows_t){.abi = ROWS_ABI, .ctx = (void *)t, .num_keys = t->num_keys, .row_floats = 0,
                    .gather = rows_gather, .scatter_add = rows_scatter_add,
                    .missing = rows_missing};
}
