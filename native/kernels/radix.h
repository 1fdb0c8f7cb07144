/* A stable argsort of int64 keys by least-significant-digit radix sort: the order numpy's
 * argsort(kind="stable") gives, in O(n) passes (16-bit digits; a digit every key shares costs
 * no pass). MF's epoch schedule sorts a worker's entries by (row or column position, random
 * tie-break) packed into one int64 every epoch: numpy's sort took ~0.75 s for 5M entries here,
 * more than half of an MF worker's CPU per batch. Memory is the caller's but for the sort's
 * scratch (24 bytes per key); no Python, no global state. */
#ifndef ADAPM_KERNELS_RADIX_H
#define ADAPM_KERNELS_RADIX_H

#include <stdint.h>

/* order[0..n) gets the positions of keys[0..n) in ascending key order, equal keys in their
 * order in keys. Returns 0, -1 when out of memory, -2 when n is 2^32 or more (nothing written
 * then). */
int radix_argsort(const int64_t *keys, int64_t n, int64_t *order);

#endif
