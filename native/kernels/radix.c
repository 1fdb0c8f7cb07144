/* See radix.h. */
#include "radix.h"

#include <stdlib.h>
#include <string.h>

#define BITS 16 /* 4 passes at most (11-bit digits, 6 passes, measured no faster) */
#define DIGITS ((64 + BITS - 1) / BITS)
#define BUCKETS (1 << BITS)
#define MASK (BUCKETS - 1)

int radix_argsort(const int64_t *keys, int64_t n, int64_t *order) {
    if (n < 0 || (uint64_t)n > UINT32_MAX) return -2;
    if (n == 0) return 0;
    uint64_t *ka = malloc((size_t)n * sizeof(uint64_t)), *kb = malloc((size_t)n * sizeof(uint64_t));
    uint32_t *ia = malloc((size_t)n * sizeof(uint32_t)), *ib = malloc((size_t)n * sizeof(uint32_t));
    uint64_t(*count)[BUCKETS] = calloc(DIGITS, sizeof *count);
    int rc = -1;
    if (!ka || !kb || !ia || !ib || !count) goto done;
    /* The sign bit flipped: unsigned order is then the signed keys' order. One pass counts
     * every digit. */
    for (int64_t i = 0; i < n; i++) {
        const uint64_t k = (uint64_t)keys[i] ^ (UINT64_C(1) << 63);
        ka[i] = k;
        ia[i] = (uint32_t)i;
        for (int d = 0; d < DIGITS; d++) count[d][(k >> (BITS * d)) & MASK]++;
    }
    for (int d = 0; d < DIGITS; d++) {
        const int shift = BITS * d;
        uint64_t *c = count[d];
        if (c[(ka[0] >> shift) & MASK] == (uint64_t)n) continue; /* every key shares it */
        uint64_t at = 0;
        for (int b = 0; b < BUCKETS; b++) { /* each bucket's first position */
            const uint64_t m = c[b];
            c[b] = at;
            at += m;
        }
        for (int64_t i = 0; i < n; i++) { /* in order: stable */
            const uint64_t k = ka[i];
            const uint64_t pos = c[(k >> shift) & MASK]++;
            kb[pos] = k;
            ib[pos] = ia[i];
        }
        uint64_t *kt = ka;
        ka = kb;
        kb = kt;
        uint32_t *it = ia;
        ia = ib;
        ib = it;
    }
    for (int64_t i = 0; i < n; i++) order[i] = ia[i];
    rc = 0;
done:
    free(ka);
    free(kb);
    free(ia);
    free(ib);
    free(count);
    return rc;
}
