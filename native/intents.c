/* Intent counts: see intents.h. */
#include "intents.h"

#include <stdlib.h>

#include "growable.h"
#include <string.h>

int ic_init(intent_counts_t *c) {
    memset(c, 0, sizeof(*c));
    return km_init(&c->map);
}

void ic_free(intent_counts_t *c) {
    km_free(&c->map);
    free(c->rec);
    free(c->free_list);
    free(c->dirty);
    memset(c, 0, sizeof(*c));
}


int ic_reserve(intent_counts_t *c, int64_t more) {
    if (km_reserve(&c->map, more) < 0) return -1;
    if (c->ndirty + more > c->dirty_cap) {
        int64_t cap = c->dirty_cap ? c->dirty_cap : 1024;
        while (cap < c->ndirty + more) cap *= 2;
        if (grow_to((void **)&c->dirty, cap, sizeof(int64_t)) < 0) return -1;
        c->dirty_cap = cap;
    }
    const int64_t fresh = more - c->nfree;
    if (fresh <= 0 || c->len + fresh <= c->cap) return 0;
    int64_t cap = c->cap ? c->cap : 64;
    while (cap < c->len + fresh) cap *= 2;
    if (cap > INT32_MAX) return -1;
    if (grow_to((void **)&c->rec, cap, sizeof(ic_rec_t)) < 0
        || grow_to((void **)&c->free_list, cap, sizeof(int32_t)) < 0)
        return -1;
    c->cap = cap;
    return 0;
}

/* The key's record, created empty if it has none (needs room). */
static int32_t ic_get(intent_counts_t *c, int64_t key) {
    int32_t i = km_get(&c->map, key);
    if (i >= 0) return i;
    i = c->nfree ? c->free_list[--c->nfree] : (int32_t)c->len++;
    c->rec[i] = (ic_rec_t){.key = key};
    km_put(&c->map, key, i);
    return i;
}

static void ic_tidy(intent_counts_t *c, int32_t i) {
    const ic_rec_t *e = &c->rec[i];
    if (e->count || e->told || e->mark) return;
    km_del(&c->map, e->key);
    c->free_list[c->nfree++] = i;
}

static void mark_dirty(intent_counts_t *c, int32_t i) {
    if (c->rec[i].mark) return;
    c->rec[i].mark = 1;
    c->dirty[c->ndirty++] = c->rec[i].key;
}

int64_t intents_count(intent_counts_t *c, const int64_t *keys, int64_t n, int delta) {
    for (int64_t i = 0; i < n; i++) {
        if (i + KM_AHEAD < n) km_prefetch(&c->map, keys[i + KM_AHEAD]);
        int32_t r;
        int crossed;
        if (delta > 0) {
            r = ic_get(c, keys[i]);
            crossed = c->rec[r].count++ == 0;
        } else {
            r = km_get(&c->map, keys[i]);
            if (r < 0 || c->rec[r].count <= 0) return -1 - i;
            crossed = --c->rec[r].count == 0;
        }
        if (crossed) mark_dirty(c, r);
    }
    return 0;
}

int64_t intents_changes(intent_counts_t *c, int64_t *out_keys, uint8_t *out_flags) {
    int64_t m = 0;
    for (int64_t i = 0; i < c->ndirty; i++) {
        if (i + KM_AHEAD < c->ndirty) km_prefetch(&c->map, c->dirty[i + KM_AHEAD]);
        const int64_t key = c->dirty[i];
        const int32_t r = km_get(&c->map, key); /* marked: has a record */
        c->rec[r].mark = 0;
        const uint8_t want = c->rec[r].count > 0;
        if (want != c->rec[r].told) {
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
        if (i + KM_AHEAD < n) km_prefetch(&c->map, keys[i + KM_AHEAD]);
        int32_t r = km_get(&c->map, keys[i]);
        if (r < 0) {
            if (!flags[i]) continue;
            r = ic_get(c, keys[i]);
        }
        c->rec[r].told = flags[i] != 0;
        ic_tidy(c, r);
    }
}

void ic_report_again(intent_counts_t *c, const int64_t *keys, int64_t n) {
    for (int64_t i = 0; i < n; i++) mark_dirty(c, ic_get(c, keys[i]));
}

int64_t ic_bytes(const intent_counts_t *c) {
    return km_bytes(&c->map) + c->cap * (int64_t)(sizeof(ic_rec_t) + sizeof(int32_t))
           + c->dirty_cap * (int64_t)sizeof(int64_t);
}

void ic_set_counts(intent_counts_t *c, const int64_t *keys, const int32_t *counts, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const int32_t r = ic_get(c, keys[i]);
        c->rec[r].count = counts[i];
        ic_tidy(c, r);
    }
}
