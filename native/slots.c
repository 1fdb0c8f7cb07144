/* The slot allocator: see slots.h. */
#include "slots.h"

#include "growable.h"

#include <stdlib.h>
#include <string.h>

void slots_init(slot_alloc_t *a, int64_t start, int64_t capacity) {
    memset(a, 0, sizeof(*a));
    a->bump = a->start = start;
    a->capacity = capacity;
}

void slots_free_all(slot_alloc_t *a) {
    for (int64_t i = 0; i < a->nlengths; i++) free(a->free[i].items);
    free(a->free);
    free(a->lengths);
    slots_init(a, a->start, a->capacity);
}

/* The free list of value length len, added if new (few distinct lengths: a sorted array). */
static slot_stack_t *stack_of(slot_alloc_t *a, int64_t len) {
    int64_t lo = 0, hi = a->nlengths;
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (a->lengths[mid] < len) lo = mid + 1;
        else hi = mid;
    }
    if (lo < a->nlengths && a->lengths[lo] == len) return &a->free[lo];
    if (a->nlengths == a->cap_lengths) {
        const int64_t cap = a->cap_lengths ? 2 * a->cap_lengths : 4;
        int64_t *lengths = realloc(a->lengths, (size_t)cap * sizeof(int64_t));
        if (!lengths) return NULL;
        a->lengths = lengths;
        slot_stack_t *stacks = realloc(a->free, (size_t)cap * sizeof(slot_stack_t));
        if (!stacks) return NULL;
        a->free = stacks;
        a->cap_lengths = cap;
    }
    memmove(a->lengths + lo + 1, a->lengths + lo, (size_t)(a->nlengths - lo) * sizeof(int64_t));
    memmove(a->free + lo + 1, a->free + lo, (size_t)(a->nlengths - lo) * sizeof(slot_stack_t));
    a->lengths[lo] = len;
    memset(&a->free[lo], 0, sizeof(slot_stack_t));
    a->nlengths++;
    return &a->free[lo];
}

static int push(slot_stack_t *st, int64_t slot) {
    if (grow_for_one((void **)&st->items, st->len, &st->cap, sizeof(int64_t)) < 0) return -1;
    st->items[st->len++] = slot;
    return 0;
}

int slots_take(slot_alloc_t *a, const store_t *s, const int64_t *keys, int64_t n,
               int64_t *slots) {
    int64_t homed = 0;
    for (int64_t i = 0; i < n; i++) homed += is_home(s, keys[i]);
    if (homed) { /* the fixed rows of home keys, and the others one by one */
        for (int64_t i = 0; i < n; i++) {
            if (is_home(s, keys[i])) {
                slots[i] = home_row(s, keys[i]);
            } else if (slots_take(a, s, keys + i, 1, slots + i) < 0) {
                slots_give(a, s, keys, slots, i);
                return -1;
            }
        }
        return 0;
    }
    if (s->uniform_len) { /* one length: reuse what is free, then new slots in one run */
        const int64_t len = s->uniform_len;
        slot_stack_t *st = stack_of(a, len);
        if (!st) return -1;
        const int64_t reused = st->len < n ? st->len : n;
        if (a->bump + (n - reused) * len > a->capacity) return -1;
        for (int64_t i = 0; i < reused; i++) slots[i] = st->items[--st->len];
        for (int64_t i = reused; i < n; i++, a->bump += len) slots[i] = a->bump;
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t len = key_len(s, keys[i]);
        slot_stack_t *st = stack_of(a, len);
        if (st && st->len) {
            slots[i] = st->items[--st->len];
        } else if (st && a->bump + len <= a->capacity) {
            slots[i] = a->bump;
            a->bump += len;
        } else {
            slots_give(a, s, keys, slots, i);
            return -1;
        }
    }
    return 0;
}

int slots_give(slot_alloc_t *a, const store_t *s, const int64_t *keys, const int64_t *slots,
               int64_t n) {
    int ok = 0;
    for (int64_t i = 0; i < n; i++) {
        if (slots[i] < 0 || is_home(s, keys[i])) continue; /* a fixed row */
        slot_stack_t *st = stack_of(a, key_len(s, keys[i]));
        if (!st || push(st, slots[i]) < 0) ok = -1;
    }
    return ok;
}

int64_t slots_free_list(const slot_alloc_t *a, int64_t *out) {
    int64_t total = 0;
    for (int64_t i = 0; i < a->nlengths; i++) {
        if (out) memcpy(out + total, a->free[i].items, (size_t)a->free[i].len * sizeof(int64_t));
        total += a->free[i].len;
    }
    return total;
}
