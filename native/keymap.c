/* The key map: see keymap.h. */
#include "keymap.h"

#include <stdlib.h>
#include <string.h>

enum { KM_MIN_CAPACITY = 64 };

static int km_alloc(keymap_t *m, int64_t capacity) {
    km_slot_t *slots = oa_new(sizeof(km_slot_t), capacity);
    if (!slots) return -1;
    m->slots = slots;
    m->mask = capacity - 1;
    m->live = 0;
    return 0;
}

int km_init(keymap_t *m) { return km_alloc(m, KM_MIN_CAPACITY); }

void km_free(keymap_t *m) {
    free(m->slots);
    m->slots = NULL;
}

int km_reserve(keymap_t *m, int64_t more) {
    const int64_t capacity = m->mask + 1;
    if (4 * (m->live + more) <= 3 * capacity) return 0;
    int64_t grown = KM_MIN_CAPACITY;
    while (2 * (m->live + more) > grown) grown *= 2; /* at most half full after a rehash */
    keymap_t next;
    if (km_alloc(&next, grown) < 0) return -1;
    for (int64_t i = 0; i < capacity; i++)
        if (m->slots[i].key >= 0) km_put(&next, m->slots[i].key, m->slots[i].val);
    km_free(m);
    *m = next;
    return 0;
}

void km_put(keymap_t *m, int64_t key, int32_t val) {
    int64_t i = km_slot(m, key);
    while (m->slots[i].key >= 0) i = (i + 1) & m->mask;
    m->slots[i].key = key;
    m->slots[i].val = val;
    m->live++;
}

int32_t km_del(keymap_t *m, int64_t key) {
    int64_t i = km_slot(m, key);
    for (;; i = (i + 1) & m->mask) {
        const int64_t k = m->slots[i].key;
        if (k == KM_EMPTY) return -1;
        if (k == key) break;
    }
    const int32_t val = m->slots[i].val;
    oa_delete((unsigned char *)m->slots, sizeof(km_slot_t), m->mask, i);
    m->live--;
    return val;
}

int32_t km_add(keymap_t *m, int64_t key, int32_t delta) {
    int64_t i = km_slot(m, key);
    for (;; i = (i + 1) & m->mask) {
        const int64_t k = m->slots[i].key;
        if (k == key) break;
        if (k == KM_EMPTY) {
            if (delta <= 0) return 0;
            m->slots[i].key = key;
            m->slots[i].val = delta;
            m->live++;
            return delta;
        }
    }
    const int32_t val = m->slots[i].val + delta;
    if (val > 0) {
        m->slots[i].val = val;
        return val;
    }
    oa_delete((unsigned char *)m->slots, sizeof(km_slot_t), m->mask, i);
    m->live--;
    return 0;
}

int64_t km_bytes(const keymap_t *m) {
    return (m->mask + 1) * (int64_t)sizeof(km_slot_t);
}
