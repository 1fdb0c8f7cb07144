/* Sampling support: alias tables for weighted draws (adapm/sampling.py), and the pool of a
 * node's locally held keys of the sampling domain, for draws that must never go remote
 * (adapm/_store.py's SamplePool; the draws are adapm/_sampler.py's).
 *
 * Called with the GIL released; touches no Python object.
 */
#ifndef ADAPM_SAMPLING_H
#define ADAPM_SAMPLING_H

#include <stdint.h>

/* Vose's alias method: from m weights (finite, >= 0, positive sum) builds prob[] and alias[] so
 * that "i uniform in [0, m); u uniform in [0, 1); i if u < prob[i] else alias[i]" draws i with
 * probability w[i] / sum(w). scratch holds m int64. Returns 0, or -1 - i for a bad weight w[i],
 * or -1 - m when the sum is not positive. O(m). */
int64_t alias_build(const double *w, int64_t m, double *prob, int64_t *alias, int64_t *scratch);

/* The C interface of a numpy BitGenerator (the bitgen_t of numpy's numpy/random/bitgen.h, a
 * stable part of numpy's C API: what its capsule "BitGenerator" points to). */
typedef struct {
    void *state;
    uint64_t (*next_uint64)(void *state);
    uint32_t (*next_uint32)(void *state);
    double (*next_double)(void *state);
    uint64_t (*next_raw)(void *state);
} np_bitgen_t;

/* Draws from an alias table (alias_build's prob and alias, m entries, m - 1 < 2^32 - 1) with a
 * numpy BitGenerator, sample after sample: for each of the nsizes samples, its n = sizes[i]
 * keys are what numpy's Generator over the same bit generator gives for
 *     i = rng.integers(0, m, n); u = rng.random(n); i = where(u >= prob[i], alias[i], i)
 * plus low, bit for bit and leaving the generator in the same state: first n bounded integers
 * (Lemire's method over next_uint32, as numpy's Generator.integers draws them below 2^32), then
 * n doubles (next_double). The samples go to out back to back. The caller holds the bit
 * generator's lock. */
void alias_draw(np_bitgen_t *g, const double *prob, const int64_t *alias, int64_t m,
                int64_t low, const int64_t *sizes, int64_t nsizes, int64_t *out);

/* A uniform integer in [0, bound), 0 < bound: below 2^32 as alias_draw's (Lemire's method over
 * next_uint32), else over next_uint64. */
uint64_t sample_bounded(np_bitgen_t *g, uint64_t bound);

/* The pool: pool[0..count) are the keys of [low, high) held here, in no order; pos[k - low] is
 * k's index in pool, or -1. One writer (the thread that moves keys in and out); readers may read
 * pool[] concurrently and must check that a drawn key is still held. */
typedef struct {
    int64_t *pool;
    int64_t *pos;
    int64_t low, high;
} pool_t;

/* Adds keys (those outside [low, high) or already in the pool are skipped); returns the new
 * count. */
int64_t pool_add(const pool_t *p, int64_t count, const int64_t *keys, int64_t n);

/* Removes keys (those outside [low, high) or not in the pool are skipped) by moving the last
 * entry into the freed place; returns the new count. */
int64_t pool_remove(const pool_t *p, int64_t count, const int64_t *keys, int64_t n);

#endif
