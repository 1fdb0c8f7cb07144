#include "unique.h"

#include <stdlib.h>
#include <string.h>

/* Open addressing with linear probing over a power-of-two table at most half full, each slot the
 * index of a distinct key (-1: empty). Fibonacci hashing spreads keys that are consecutive
 * integers, as table rows are. */
int64_t unique_inverse(const int64_t *keys, int64_t n, int64_t *unique, int64_t *inverse) {
    if (n <= 0) return 0;
    int bits = 1;
    while (((int64_t)1 << bits) < 2 * n) bits++;
    const size_t cap = (size_t)1 << bits, mask = cap - 1;
    int32_t *slots = malloc(cap * sizeof *slots);
    if (!slots) return -1;
    memset(slots, 0xff, cap * sizeof *slots);
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        size_t h = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
        for (;;) {
            const int32_t s = slots[h];
            if (s < 0) {
                slots[h] = (int32_t)count;
                unique[count] = key;
                inverse[i] = count++;
                break;
            }
            if (unique[s] == key) {
                inverse[i] = s;
                break;
            }
            h = (h + 1) & mask;
        }
    }
    free(slots);
    return count;
}
