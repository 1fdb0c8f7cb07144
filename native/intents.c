/* Intent counts: see intents.h. */
#include "intents.h"

#include <stdlib.h>

#include "growable.h"
#include <string.h>

/* How many keys ahead the batch loops prefetch a slot: a miss to memory outlasts ~8 hits. */
enum { IC_MIN_CAPACITY = 64, IC_AHEAD = 24 };

static int ic_alloc(intent_counts_t *c, int64_t capacity) {
    ic_rec_t *slots = oa_new(sizeof(ic_rec_t), capacity);
    if (!slots) return -1;
    c->slots = slots;
    c->mask = capacity - 1;
    c->live = 0;
    return 0;
}

int ic_init(intent_counts_t *c) {
    memset(c, 0, sizeof(*c));
    return ic_alloc(c, IC_MIN_CAPACITY);
}

void ic_free(intent_counts_t *c) {
    free(c->slots);
    free(c->dirty);
    memset(c, 0, sizeof(*c));
}

/* The slot where key's record is, or the empty slot where it would go. */
static inline int64_t ic_probe(const intent_counts_t *c, int64_t key) {
    int64_t i = ic_home(c, key);
    while (c->slots[i].key != key && c->slots[i].key != IC_EMPTY) i = (i + 1) & c->mask;
    return i;
}

int ic_reserve(intent_counts_t *c, int64_t more) {
    if (c->ndirty + more > c->dirty_cap) {
        int64_t cap = c->dirty_cap ? c->dirty_cap : 1024;
        while (cap < c->ndirty + more) cap *= 2;
        if (grow_to((void **)&c->dirty, cap, sizeof(int64_t)) < 0) return -1;
        c->dirty_cap = cap;
    }
    const int64_t capacity = c->mask + 1;
    if (4 * (c->live + more) <= 3 * capacity) return 0;
    int64_t grown = IC_MIN_CAPACITY;
    while (2 * (c->live + more) > grown) grown *= 2; /* at most half full after a rehash */
    intent_counts_t next = *c;
    if (ic_alloc(&next, grown) < 0) return -1;
    for (int64_t i = 0; i < capacity; i++) {
        if (c->slots[i].key == IC_EMPTY) continue;
        next.slots[ic_probe(&next, c->slots[i].key)] = c->slots[i];
        next.live++;
    }
    free(c->slots);
    *c = next;
    return 0;
}

/* The key's record, created empty if it has none (needs room): its slot. */
static inline int64_t ic_get(intent_counts_t *c, int64_t key) {
    const int64_t i = ic_probe(c, key);
    if (c->slots[i].key == IC_EMPTY) {
        c->slots[i] = (ic_rec_t){.key = key};
        c->live++;
    }
    return i;
}

/* Drops the record in slot i if it holds nothing (openaddr.h: moves other records, so no slot
 * index may be kept across it). */
static void ic_tidy(intent_counts_t *c, int64_t i) {
    const ic_rec_t *e = &c->slots[i];
    if (e->count || e->told || e->mark) return;
    oa_delete((unsigned char *)c->slots, sizeof(ic_rec_t), c->mask, i);
    c->live--;
}

static inline void ic_prefetch(const intent_counts_t *c, int64_t key) {
    __builtin_prefetch(&c->slots[ic_home(c, key)]);
}

static inline void mark_dirty(intent_counts_t *c, ic_rec_t *e) {
    if (e->mark) return;
    e->mark = 1;
    c->dirty[c->ndirty++] = e->key;
}

int64_t intents_count(intent_counts_t *c, const int64_t *keys, int64_t n, int delta) {
    for (int64_t i = 0; i < n; i++) {
        if (i + IC_AHEAD < n) ic_prefetch(c, keys[i + IC_AHEAD]);
        ic_rec_t *e;
        int crossed;
        if (delta > 0) {
            e = &c->slots[ic_get(c, keys[i])];
            crossed = e->count++ == 0;
        } else {
            e = &c->slots[ic_probe(c, keys[i])];
            if (e->key == IC_EMPTY || e->count <= 0) return -1 - i;
            crossed = --e->count == 0;
        }
        if (crossed) mark_dirty(c, e);
    }
    return 0;
}

int64_t intents_changes(intent_counts_t *c, int64_t *out_keys, uint8_t *out_flags) {
    int64_t m = 0;
    for (int64_t i = 0; i < c->ndirty; i++) {
        if (i + IC_AHEAD < c->ndirty) ic_prefetch(c, c->dirty[i + IC_AHEAD]);
        const int64_t key = c->dirty[i];
        const int64_t r = ic_probe(c, key); /* marked: has a record */
        ic_rec_t *e = &c->slots[r];
        e->mark = 0;
        const uint8_t want = e->count > 0;
        if (want != e->told) {
            out_keys[m] = key;
            out_flags[m++] = want;
        }
        ic_tidy(c, r);
    }
    c->ndirty = 0;
    return m;
}

void ic_acknowledge(intent_counts_t *c, const int64_t *keys, const uint8_t *flags, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (i + IC_AHEAD < n) ic_prefetch(c, keys[i + IC_AHEAD]);
        int64_t r = ic_probe(c, keys[i]);
        if (c->slots[r].key == IC_EMPTY) {
            if (!flags[i]) continue;
            r = ic_get(c, keys[i]);
        }
        c->slots[r].told = flags[i] != 0;
        ic_tidy(c, r);
    }
}

void ic_report_again(intent_counts_t *c, const int64_t *keys, int64_t n) {
    for (int64_t i = 0; i < n; i++) mark_dirty(c, &c->slots[ic_get(c, keys[i])]);
}

int64_t ic_bytes(const intent_counts_t *c) {
    return (c->mask + 1) * (int64_t)sizeof(ic_rec_t) + c->dirty_cap * (int64_t)sizeof(int64_t);
}

void ic_set_counts(intent_counts_t *c, const int64_t *keys, const int32_t *counts, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = ic_get(c, keys[i]);
        c->slots[r].count = counts[i];
        ic_tidy(c, r);
    }
}
