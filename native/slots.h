/* Where values live in a node's slab: the slot allocator (see adapm/_store.py).
 *
 * Keys homed here have fixed rows at the bottom of the slab (store.h); the allocator hands
 * those back as they are and manages the rest of the slab for keys homed elsewhere. The slab
 * reserves address space for every key's value but is committed only where written, so
 * slots are handed out from the bottom up (a bump pointer) and freed slots are reused first,
 * most recently freed first (cache-warm), one free list per value length. So a node's memory
 * follows the number of keys it holds at once. Owned by the Store object; used by the thread
 * that moves keys in and out (the engine thread), never concurrently. Touches no Python object.
 */
#ifndef ADAPM_SLOTS_H
#define ADAPM_SLOTS_H

#include <stdint.h>

#include "store.h"

typedef struct {
    int64_t *items;
    int64_t len, cap;
} slot_stack_t;

typedef struct {
    int64_t start;          /* the first float above the home rows */
    int64_t bump, capacity; /* floats handed out from the bottom; the slab's size */
    int64_t nlengths, cap_lengths;
    int64_t *lengths;    /* distinct value lengths seen so far, ascending */
    slot_stack_t *free;  /* per length: freed slots */
} slot_alloc_t;

void slots_init(slot_alloc_t *a, int64_t start, int64_t capacity);
void slots_free_all(slot_alloc_t *a);

/* Slots for keys[0..n) (their value lengths from s), written to slots. Returns 0, or -1 if out
 * of memory or the slab is full (cannot happen while each key is held at most once); then the
 * slots taken so far are given back. */
int slots_take(slot_alloc_t *a, const store_t *s, const int64_t *keys, int64_t n,
               int64_t *slots);

/* The slots of keys[0..n) are free again (negative slots and home rows are skipped). Returns 0, or -1 if out
 * of memory (the slots are then lost to reuse, not to correctness). */
int slots_give(slot_alloc_t *a, const store_t *s, const int64_t *keys, const int64_t *slots,
               int64_t n);

/* Number of free slots of every length, and (when out is not NULL) the slots themselves. */
int64_t slots_free_list(const slot_alloc_t *a, int64_t *out);

#endif
