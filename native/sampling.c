/* Sampling support: see sampling.h. */
#include "sampling.h"

#include <math.h>

int64_t alias_build(const double *w, int64_t m, double *prob, int64_t *alias, int64_t *scratch) {
    double total = 0.0;
    for (int64_t i = 0; i < m; i++) {
        if (!(w[i] >= 0.0) || isinf(w[i])) return -1 - i; /* also catches NaN */
        total += w[i];
    }
    if (!(total > 0.0) || isinf(total)) return -1 - m;
    /* scratch holds the "small" indices from the bottom up and the "large" ones from the top
     * down, so one array of m serves both stacks. */
    int64_t nsmall = 0, nlarge = 0;
    for (int64_t i = 0; i < m; i++) {
        prob[i] = w[i] * (double)m / total;
        alias[i] = i;
        if (prob[i] < 1.0) scratch[nsmall++] = i;
        else scratch[m - 1 - nlarge++] = i;
    }
    while (nsmall && nlarge) {
        const int64_t s = scratch[--nsmall];
        const int64_t l = scratch[m - nlarge]; /* top of the large stack */
        alias[s] = l;
        prob[l] -= 1.0 - prob[s];
        if (prob[l] < 1.0) { /* l becomes small: move it from one stack to the other */
            nlarge--;
            scratch[nsmall++] = l;
        }
    }
    /* What is left is 1 up to rounding. */
    while (nlarge) prob[scratch[m - nlarge--]] = 1.0;
    while (nsmall) prob[scratch[--nsmall]] = 1.0;
    return 0;
}

/* A uniform integer in [0, bound) from the bit generator's 32-bit stream, by Lemire's method
 * (D. Lemire, "Fast random integer generation in an interval", 2019): the high half of a
 * 32 x 32-bit product, drawn again while the low half falls in the biased sliver. 0 < bound <
 * 2^32. numpy's Generator.integers draws its bounded integers below 2^32 this way, so the two
 * read the same numbers off a generator. */
static inline uint32_t bounded_u32(np_bitgen_t *g, uint32_t bound) {
    uint64_t m = (uint64_t)g->next_uint32(g->state) * bound;
    uint32_t low = (uint32_t)m;
    if (low < bound) {
        const uint32_t threshold = (uint32_t)(-bound) % bound; /* 2^32 mod bound */
        while (low < threshold) {
            m = (uint64_t)g->next_uint32(g->state) * bound;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

uint64_t sample_bounded(np_bitgen_t *g, uint64_t bound) {
    if (bound - 1 < 0xFFFFFFFFULL) return bounded_u32(g, (uint32_t)bound);
    unsigned __int128 m = (unsigned __int128)g->next_uint64(g->state) * bound;
    uint64_t low = (uint64_t)m;
    if (low < bound) {
        const uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound */
        while (low < threshold) {
            m = (unsigned __int128)g->next_uint64(g->state) * bound;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

void alias_draw(np_bitgen_t *g, const double *prob, const int64_t *alias, int64_t m,
                int64_t low, const int64_t *sizes, int64_t nsizes, int64_t *out) {
    for (int64_t s = 0; s < nsizes; s++) {
        const int64_t n = sizes[s];
        /* A table of one entry draws no integer (numpy reads nothing off the generator for an
         * empty range), but still its doubles. */
        if (m == 1) {
            for (int64_t i = 0; i < n; i++) out[i] = 0;
        } else {
            for (int64_t i = 0; i < n; i++) out[i] = bounded_u32(g, (uint32_t)m);
        }
        for (int64_t i = 0; i < n; i++) {
            const int64_t k = out[i];
            out[i] = (g->next_double(g->state) >= prob[k] ? alias[k] : k) + low;
        }
        out += n;
    }
}

int64_t pool_add(const pool_t *p, int64_t count, const int64_t *keys, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = keys[i];
        if (k < p->low || k >= p->high || p->pos[k - p->low] >= 0) continue;
        p->pos[k - p->low] = count;
        p->pool[count++] = k;
    }
    return count;
}

int64_t pool_remove(const pool_t *p, int64_t count, const int64_t *keys, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = keys[i];
        if (k < p->low || k >= p->high) continue;
        const int64_t at = p->pos[k - p->low];
        if (at < 0) continue;
        const int64_t last = p->pool[--count];
        p->pool[at] = last;
        p->pos[last - p->low] = at;
        p->pos[k - p->low] = -1;
    }
    return count;
}
