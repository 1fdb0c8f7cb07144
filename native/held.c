/* The map of held keys: see held.h. */
#include "held.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "seqlock.h"

enum { HELD_MIN_CAPACITY = 64 };

static held_table_t *table_new(int64_t capacity) {
    held_table_t *t = malloc(sizeof(*t));
    held_entry_t *e = malloc((size_t)capacity * sizeof(held_entry_t));
    if (!t || !e) {
        free(t);
        free(e);
        return NULL;
    }
    for (int64_t i = 0; i < capacity; i++) e[i].key = HELD_EMPTY;
    t->entries = e;
    t->mask = capacity - 1;
    return t;
}

static void table_free(held_table_t *t) {
    if (!t) return;
    free(t->entries);
    free(t);
}

int held_init(held_map_t *m) {
    memset(m, 0, sizeof(*m));
    return (m->table = table_new(HELD_MIN_CAPACITY)) ? 0 : -1;
}

void held_free(held_map_t *m) {
    table_free(m->table);
    m->table = NULL;
}

/* Every reader that may hold the table replaced before this call has left its section. */
static void wait_for_readers(held_map_t *m) {
    const uint64_t g = __atomic_load_n(&m->gen, __ATOMIC_SEQ_CST);
    __atomic_store_n(&m->gen, g + 1, __ATOMIC_SEQ_CST);
    int spins = 0;
    while (__atomic_load_n(&m->readers[g & 1], __ATOMIC_SEQ_CST)) {
        if (++spins > SPINS_BEFORE_YIELD) { sched_yield(); spins = 0; } else CPU_RELAX();
    }
}

static void put_plain(held_table_t *t, const held_entry_t *src) {
    int64_t i = held_slot(t, src->key);
    while (t->entries[i].key != HELD_EMPTY) i = (i + 1) & t->mask;
    t->entries[i] = *src;
}

int held_reserve(held_map_t *m, int64_t more, uint64_t *seqs, int64_t nstripes) {
    held_table_t *old = m->table;
    const int64_t capacity = old->mask + 1;
    if (4 * (m->filled + more) <= 3 * capacity) return 0;
    int64_t grown = HELD_MIN_CAPACITY;
    while (2 * (m->live + more) > grown) grown *= 2; /* at most half full after a rehash */
    held_table_t *next = table_new(grown);
    if (!next) return -1;
    /* Values written by workers (versions) change only under a stripe lock: with all of them
     * held, the copy is exact, and every reader of the old table will retry. */
    for (int64_t s = 0; s < nstripes; s++) write_lock(&seqs[s * SEQ_STRIDE]);
    for (int64_t i = 0; i < capacity; i++)
        if (old->entries[i].key >= 0) put_plain(next, &old->entries[i]);
    __atomic_store_n(&m->table, next, __ATOMIC_SEQ_CST);
    for (int64_t s = 0; s < nstripes; s++) write_unlock(&seqs[s * SEQ_STRIDE]);
    m->filled = m->live;
    wait_for_readers(m);
    table_free(old);
    return 0;
}

held_entry_t *held_put(held_map_t *m, int64_t key, int64_t raw, int64_t version,
                       double synced_at) {
    held_table_t *t = m->table;
    int64_t i = held_slot(t, key);
    while (t->entries[i].key >= 0) i = (i + 1) & t->mask;
    held_entry_t *e = &t->entries[i];
    if (e->key == HELD_EMPTY) m->filled++;
    m->live++;
    e->raw = raw; /* readers look at these only once they see the key (release, below) */
    e->version = version;
    e->synced_at = synced_at;
    __atomic_store_n(&e->key, key, __ATOMIC_RELEASE);
    return e;
}

void held_del(held_map_t *m, held_entry_t *e) {
    __atomic_store_n(&e->key, (int64_t)HELD_TOMB, __ATOMIC_RELEASE);
    m->live--;
}

int64_t held_bytes(const held_map_t *m) {
    return (int64_t)sizeof(held_table_t) + (m->table->mask + 1) * (int64_t)sizeof(held_entry_t);
}

int64_t held_keys(const held_map_t *m, int64_t *out, int64_t max) {
    const held_table_t *t = m->table;
    int64_t n = 0;
    for (int64_t i = 0; i <= t->mask; i++) {
        const int64_t k = t->entries[i].key;
        if (k < 0) continue;
        if (n < max) out[n] = k;
        n++;
    }
    return n;
}
