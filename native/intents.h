/* Intent bookkeeping of a node: per-key counts of acted-on intents, and what owners were told
 * (see adapm/_engine/intents.py).
 *
 * Only a count's crossings of zero matter to owners (0->1: "this node has intent", 1->0: "its
 * intent ended"). One pass over a round's keys finds them and collects each crossed key once
 * (a mark per key), where numpy needs a sort to count duplicates and another to dedupe.
 *
 * Memory: a record (count, told, mark) only for keys with a nonzero count, told or marked, in a
 * hash table of its own: dense arrays cost 6 B per key and node for every key of the key space.
 * Not thread-safe: the bindings keep the GIL whenever they touch the counts. Touches no Python
 * object.
 */
#ifndef ADAPM_INTENTS_H
#define ADAPM_INTENTS_H

#include <stddef.h>
#include <stdint.h>

#include "openaddr.h"

/* A key's record: its key and fields in one 16-byte slot of an open-addressing table (four to
 * a cache line). The table is the map: a lookup finds the record in the slot it probes, one
 * cache line per count, change and acknowledgement. (A key map to an index into a record array
 * cost three: the map's keys, its values and the record; intents_count was a fifth of the
 * engine thread's CPU in bench/adaptive.py, most of it waiting on those loads.) */
typedef struct {
    int64_t key; /* IC_EMPTY or a key */
    int32_t count;
    uint8_t told, mark;
} ic_rec_t;

enum { IC_EMPTY = OA_EMPTY };

_Static_assert(offsetof(ic_rec_t, key) == 0, "openaddr.h: the key comes first in a slot");

typedef struct {
    ic_rec_t *slots; /* capacity a power of two, at most 3/4 full; linear probing */
    int64_t mask;    /* capacity - 1 */
    int64_t live;    /* keys with a record */
    int64_t *dirty;  /* marked keys, in the order they were marked */
    int64_t ndirty, dirty_cap;
} intent_counts_t;

int ic_init(intent_counts_t *c);
void ic_free(intent_counts_t *c);

/* Room for `more` new records and `more` more dirty keys. 0, or -1 if out of memory. */
int ic_reserve(intent_counts_t *c, int64_t more);

/* The key's first slot (openaddr.h). */
static inline int64_t ic_home(const intent_counts_t *c, int64_t key) {
    return oa_home(key, c->mask);
}

/* The key's record, or NULL. Valid until the next change of the counts. */
static inline const ic_rec_t *ic_find(const intent_counts_t *c, int64_t key) {
    for (int64_t i = ic_home(c, key);; i = (i + 1) & c->mask) {
        const ic_rec_t *e = &c->slots[i];
        if (e->key == key) return e;
        if (e->key == IC_EMPTY) return NULL;
    }
}

static inline int32_t ic_count(const intent_counts_t *c, int64_t key) {
    const ic_rec_t *e = ic_find(c, key);
    return e ? e->count : 0;
}

static inline int ic_told(const intent_counts_t *c, int64_t key) {
    const ic_rec_t *e = ic_find(c, key);
    return e && e->told;
}

/* Adds delta (+1 or -1) to the count of keys[i] for every i, in order. A key whose count
 * crosses zero (0 -> 1 for +1, 1 -> 0 for -1) and is not marked yet is marked and joins the
 * dirty keys. Needs room for n (ic_reserve). Returns 0, or -1 - i if keys[i]'s count would go
 * negative; then keys[0..i) have been applied (and recorded as dirty). */
int64_t intents_count(intent_counts_t *c, const int64_t *keys, int64_t n, int delta);

/* For each dirty key (unmarking it): has_intent = count > 0; if that differs from told, appends
 * the key to out_keys and has_intent to out_flags (room: c->ndirty). Returns how many; the
 * dirty list is empty afterwards. */
int64_t intents_changes(intent_counts_t *c, int64_t *out_keys, uint8_t *out_flags);

/* told = flags[i] for keys[i] (needs room for n). */
void ic_acknowledge(intent_counts_t *c, const int64_t *keys, const uint8_t *flags, int64_t n);

/* Keys that changes() must look at again: marked and dirty unless they are (needs room). */
void ic_report_again(intent_counts_t *c, const int64_t *keys, int64_t n);

/* Sets counts (>= 0) without marking (tests; needs room for n). */
void ic_set_counts(intent_counts_t *c, const int64_t *keys, const int32_t *counts, int64_t n);

/* Bytes held. */
int64_t ic_bytes(const intent_counts_t *c);

#endif
