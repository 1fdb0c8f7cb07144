/* The sorted replica set: see replica_set.h. */
#include "replica_set.h"

#include <stdlib.h>
#include <string.h>

void rs_free(replica_set_t *rs) {
    free(rs->keys);
    memset(rs, 0, sizeof(*rs));
}

static int ascending(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int rs_add(replica_set_t *rs, const int64_t *keys, int64_t n) {
    if (!n) return 0;
    int64_t *sorted = malloc((size_t)n * sizeof(int64_t));
    if (!sorted) return -1;
    memcpy(sorted, keys, (size_t)n * sizeof(int64_t));
    int in_order = 1;
    for (int64_t i = 1; i < n && in_order; i++) in_order = sorted[i] > sorted[i - 1];
    if (!in_order) qsort(sorted, (size_t)n, sizeof(int64_t), ascending);
    if (rs->len + n > rs->cap) {
        int64_t cap = rs->cap ? 2 * rs->cap : 1024;
        while (cap < rs->len + n) cap *= 2;
        int64_t *grown = realloc(rs->keys, (size_t)cap * sizeof(int64_t));
        if (!grown) {
            free(sorted);
            return -1;
        }
        rs->keys = grown;
        rs->cap = cap;
    }
    /* Merge from the back, in place. */
    int64_t i = rs->len - 1, j = n - 1, at = rs->len + n - 1;
    while (j >= 0) {
        if (i >= 0 && rs->keys[i] > sorted[j]) rs->keys[at--] = rs->keys[i--];
        else rs->keys[at--] = sorted[j--];
    }
    rs->len += n;
    free(sorted);
    return 0;
}

void rs_remove(replica_set_t *rs, const int64_t *keys, int64_t n) {
    if (!n || !rs->len) return;
    int64_t *sorted = malloc((size_t)n * sizeof(int64_t));
    if (!sorted) { /* out of memory: one binary search per key instead, removing as found */
        for (int64_t k = 0; k < n; k++) {
            int64_t lo = 0, hi = rs->len;
            while (lo < hi) {
                const int64_t mid = lo + (hi - lo) / 2;
                if (rs->keys[mid] < keys[k]) lo = mid + 1;
                else hi = mid;
            }
            if (lo < rs->len && rs->keys[lo] == keys[k]) {
                memmove(rs->keys + lo, rs->keys + lo + 1,
                        (size_t)(rs->len - lo - 1) * sizeof(int64_t));
                rs->len--;
            }
        }
        return;
    }
    memcpy(sorted, keys, (size_t)n * sizeof(int64_t));
    int in_order = 1;
    for (int64_t i = 1; i < n && in_order; i++) in_order = sorted[i] > sorted[i - 1];
    if (!in_order) qsort(sorted, (size_t)n, sizeof(int64_t), ascending);
    /* One pass over both, keeping the set's keys that are not removed. */
    int64_t w = 0, j = 0;
    for (int64_t r = 0; r < rs->len; r++) {
        const int64_t key = rs->keys[r];
        while (j < n && sorted[j] < key) j++;
        if (j < n && sorted[j] == key) continue;
        rs->keys[w++] = key;
    }
    rs->len = w;
    free(sorted);
}
