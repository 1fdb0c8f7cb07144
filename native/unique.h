/* Distinct keys of a batch and where each position's key is among them: the step before every
 * embedding lookup on pulled rows (adapm.torch), in one O(n) pass instead of a sort. */
#ifndef ADAPM_UNIQUE_H
#define ADAPM_UNIQUE_H

#include <stdint.h>

/* Writes the distinct keys of keys[0..n) to unique (in order of first appearance) and, for each
 * position i, the index of keys[i] in unique to inverse[i]. Both outputs hold n entries; n must
 * be below 2^31. Returns the number of distinct keys, or -1 when out of memory (outputs then
 * undefined). Thread-safe: its only scratch is its own allocation. */
int64_t unique_inverse(const int64_t *keys, int64_t n, int64_t *unique, int64_t *inverse);

#endif
