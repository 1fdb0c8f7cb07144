/* Relocations over the store and the directory: see directory.h. */
#include "directory.h"

#include <string.h>

#include "policy.h"

int64_t dir_relocate_out(const directory_t *d, const int64_t *keys, int64_t n, int64_t dst,
                         float *values, int64_t values_floats, int64_t *versions,
                         uint64_t *s_out, uint64_t *r_out, int64_t *epochs, int64_t *slots) {
    const store_t *s = d->store;
    int64_t need = 0;
    for (int64_t i = 0; i < n; i++) {
        if (store_state(s, keys[i]) != KEY_OWNER) return -1 - i;
        need += key_len(s, keys[i]);
    }
    if (need > values_floats) return -1 - n;
    /* Their masks go along, this node's own bit of S included: taken into a record while the
     * keys are still owned here (dir_rec_get), as a key without one keeps it as a told flag. */
    for (int64_t i = 0; i < n; i++) (void)dir_rec_get(d, keys[i]);
    store_remove(s, keys, n, values, NULL, values_floats, slots, versions);
    slots_give(d->alloc, s, keys, slots, n); /* out of memory: those slots are not reused */
    const int64_t w = d->words;
    records_t *recs = d->recs;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        const int32_t r = rec_get(recs, key); /* made above */
        uint64_t *masks = rec_mask_words(recs, r);
        rec_t *e = rec_at(recs, r);
        if (recs->words) {
            memcpy(s_out + i * w, masks, (size_t)w * sizeof(uint64_t));
            memcpy(r_out + i * w, masks + w, (size_t)w * sizeof(uint64_t));
            memset(masks, 0, (size_t)2 * w * sizeof(uint64_t));
        } else {
            memset(s_out + i * w, 0, (size_t)w * sizeof(uint64_t));
            memset(r_out + i * w, 0, (size_t)w * sizeof(uint64_t));
        }
        epochs[i] = e->epoch + 1;
        e->epoch = 0; /* kept only while owned here */
        e->forward = (int32_t)dst;
        e->hint = (int32_t)dst;
    }
    return n;
}

int64_t dir_relocate_in(const directory_t *d, const int64_t *keys, int64_t n,
                        const float *values, int64_t values_floats, const int64_t *versions,
                        const uint64_t *s_in, const uint64_t *r_in, const int64_t *epochs,
                        int64_t *slots, int8_t *was_replica) {
    const store_t *s = d->store;
    int64_t need = 0;
    for (int64_t i = 0; i < n; i++) {
        if (store_state(s, keys[i]) == KEY_OWNER) return -1 - i;
        need += key_len(s, keys[i]);
    }
    if (need > values_floats) return -1 - n;
    if (store_reserve(s, d->channel, n) < 0) return -2 - n;
    /* A slot for each key that is not a replica here (slots[j]: the j-th such key's). */
    int64_t fresh = 0;
    for (int64_t i = 0; i < n; i++) {
        if (store_state(s, keys[i]) == KEY_REPLICA) continue;
        if (slots_take(d->alloc, s, &keys[i], 1, &slots[fresh]) < 0) {
            for (int64_t k = 0, j = 0; j < fresh; k++) /* give back what was taken */
                if (store_state(s, keys[k]) != KEY_REPLICA) {
                    slots_give(d->alloc, s, &keys[k], &slots[j], 1);
                    j++;
                }
            return -2 - n;
        }
        fresh++;
    }
    const int64_t w = d->words, own_word = d->rank / 64;
    const uint64_t own_bit = (uint64_t)1 << (d->rank % 64);
    int64_t off = 0, j = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i], len = key_len(s, key);
        was_replica[i] = store_state(s, key) == KEY_REPLICA;
        if (was_replica[i]) /* value = the owner's + our unsent updates */
            store_refresh(s, keys + i, 1, values + off, len, versions + i, 1, 0.0);
        else /* the j-th fresh key: slots[j] was taken for it above */
            store_insert(s, keys + i, 1, slots + j++, KEY_OWNER, values + off, len, versions + i,
                         0.0);
        off += len;
        records_t *recs = d->recs;
        const int32_t r = rec_get(recs, key);
        rec_t *e = rec_at(recs, r);
        if (recs->words) {
            uint64_t *masks = rec_mask_words(recs, r);
            memcpy(masks, s_in + i * w, (size_t)w * sizeof(uint64_t));
            memcpy(masks + w, r_in + i * w, (size_t)w * sizeof(uint64_t));
            masks[w + own_word] &= ~own_bit; /* the owner holds no replica of its own */
        }
        e->epoch = epochs[i];
        e->hint = (int32_t)d->rank;
        if (key % d->world_size == d->rank && epochs[i] > e->home_epoch) {
            d->home_owner[dir_home_index(d, key)] = (int32_t)d->rank;
            e->home_epoch = epochs[i];
        }
        rec_tidy(recs, r);
    }
    /* Promoted replicas leave the replica set (slots[] is free scratch by now). */
    int64_t promoted = 0;
    for (int64_t i = 0; i < n; i++)
        if (was_replica[i]) slots[promoted++] = keys[i];
    rs_remove(d->held, slots, promoted);
    return n;
}

int64_t dir_setup_in(const directory_t *d, int64_t src, const int64_t *keys, int64_t n,
                     const float *values, const int64_t *versions, const uint8_t *wanted,
                     double now, int64_t *taken, float *rows, int64_t *vers, int64_t *slots) {
    const store_t *s = d->store;
    int64_t m = 0, off = 0, floats = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i], len = key_len(s, key);
        if (wanted && wanted[i] && store_state(s, key) == KEY_NONE) {
            taken[m] = key;
            vers[m++] = versions[i];
            memcpy(rows + floats, values + off, (size_t)len * sizeof(float));
            floats += len;
        }
        off += len;
    }
    if (!m) return 0;
    if (store_reserve(s, d->channel, m) < 0 || slots_take(d->alloc, s, taken, m, slots) < 0) return -1;
    if (rs_add(d->held, taken, m) < 0) {
        slots_give(d->alloc, s, taken, slots, m);
        return -1;
    }
    store_insert(s, taken, m, slots, KEY_REPLICA, rows, floats, vers, now); /* room reserved */
    for (int64_t i = 0; i < n; i++)
        if (store_state(s, keys[i]) != KEY_OWNER) rec_set_hint(d->recs, keys[i], src);
    return m;
}

int64_t dir_policy_decide(const directory_t *d, int variant, int64_t node, const int64_t *keys,
                          int64_t n, const uint8_t *has_intent, int64_t *relocate_to,
                          uint64_t *setup, int own_acked) {
    records_t *recs = d->recs;
    const int64_t w = d->words;
    int64_t dropped = 0;
    own_acked = own_acked && node == d->rank && d->counts;
    for (int64_t i = 0; i < n; i++) {
        /* Two stages ahead: the map slot of a key 2 * KM_AHEAD on, the record of one KM_AHEAD
         * on (its slot loaded by now), so that their misses overlap this key's work. */
        if (i + 2 * KM_AHEAD < n) km_prefetch(&recs->map, keys[i + 2 * KM_AHEAD]);
        if (i + KM_AHEAD < n) {
            const int32_t ahead = rec_find(recs, keys[i + KM_AHEAD]);
            if (ahead >= 0) __builtin_prefetch(rec_at(recs, ahead), 1);
        }
        if (own_acked && rec_find(recs, keys[i]) < 0) { /* S: at most this node's own bit */
            relocate_to[i] = -1;
            memset(setup + i * w, 0, (size_t)w * sizeof(uint64_t));
            continue;
        }
        const int32_t r = dir_rec_get(d, keys[i]);
        uint64_t *masks = rec_mask_words(recs, r);
        relocate_to[i] = policy_decide_key(variant, d->rank, node, w, masks, masks + w,
                                           has_intent[i], setup + i * w, &dropped);
        rec_tidy(recs, r);
    }
    return dropped;
}

void dir_decide_sizes(const directory_t *d, const int64_t *keys, int64_t n,
                      const int64_t *relocate_to, const uint64_t *setup, decide_sizes_t *out) {
    const store_t *s = d->store;
    const int64_t w = d->words;
    decide_sizes_t z = {0, 0, 0, 0, 0};
    const int64_t used = d->world_size % 64;
    const uint64_t stray = used ? ~(((uint64_t)1 << used) - 1) : 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i], len = key_len(s, key), dst = relocate_to[i];
        if (dst >= d->world_size || (setup[i * w + w - 1] & stray)) {
            out->relocations = -1;
            return;
        }
        if (dst >= 0) {
            z.relocations++;
            z.relocation_floats += len;
            const int64_t home = key % d->world_size;
            if (home != dst && home != d->rank) z.home_updates++;
        }
        int64_t bits = 0;
        for (int64_t j = 0; j < w; j++) /* most keys set up none: no libgcc popcount call */
            if (setup[i * w + j]) bits += __builtin_popcountll(setup[i * w + j]);
        z.setups += bits;
        z.setup_floats += bits * len;
    }
    *out = z;
}

/* Starts of each rank's run in an output ordered by rank, from the counts: cursor[r]. */
static void run_starts(const int64_t *count, int64_t world_size, int64_t *cursor) {
    int64_t at = 0;
    for (int64_t r = 0; r < world_size; r++) {
        cursor[r] = at;
        at += count[r];
    }
}

int64_t dir_decide_execute(const directory_t *d, const int64_t *keys, int64_t n,
                           const int64_t *relocate_to, const uint64_t *setup,
                           const decide_sizes_t *sizes, decide_out_t *o, int64_t *cursor) {
    const store_t *s = d->store;
    const int64_t w = d->words, world = d->world_size;
    /* Relocations: keys ordered by destination, then one dir_relocate_out per destination. */
    memset(o->r_count, 0, (size_t)world * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++)
        if (relocate_to[i] >= 0) o->r_count[relocate_to[i]]++;
    run_starts(o->r_count, world, cursor);
    for (int64_t i = 0; i < n; i++)
        if (relocate_to[i] >= 0) o->r_keys[cursor[relocate_to[i]]++] = keys[i];
    int64_t at = 0, floats = 0;
    for (int64_t dst = 0; dst < world; dst++) {
        const int64_t m = o->r_count[dst];
        if (!m) continue;
        int64_t run_floats = 0;
        for (int64_t i = at; i < at + m; i++) run_floats += key_len(s, o->r_keys[i]);
        if (dir_relocate_out(d, o->r_keys + at, m, dst, o->r_values + floats, run_floats,
                             o->r_versions + at, o->r_s + at * w, o->r_r + at * w,
                             o->r_epochs + at, o->r_slots + at) < 0)
            return -1;
        at += m;
        floats += run_floats;
    }
    /* Home updates: the new owner updates the homes it is itself; the old one tells the rest,
     * and its own home table takes the newest epoch (updates from old and new owners cross). */
    memset(o->h_count, 0, (size_t)world * sizeof(int64_t));
    at = 0;
    for (int64_t dst = 0; dst < world; dst++) {
        for (int64_t i = at; i < at + o->r_count[dst]; i++) {
            const int64_t key = o->r_keys[i], home = key % world;
            if (home == d->rank) {
                const int32_t r = rec_get(d->recs, key); /* relocate_out made it */
                if (o->r_epochs[i] > rec_at(d->recs, r)->home_epoch) {
                    rec_at(d->recs, r)->home_epoch = o->r_epochs[i];
                    d->home_owner[dir_home_index(d, key)] = (int32_t)dst;
                }
            } else if (home != dst) {
                o->h_count[home]++;
            }
        }
        at += o->r_count[dst];
    }
    run_starts(o->h_count, world, cursor);
    at = 0;
    for (int64_t dst = 0; dst < world; dst++) {
        for (int64_t i = at; i < at + o->r_count[dst]; i++) {
            const int64_t key = o->r_keys[i], home = key % world;
            if (home == dst || home == d->rank) continue;
            const int64_t j = cursor[home]++;
            o->h_keys[j] = key;
            o->h_owners[j] = dst;
            o->h_epochs[j] = o->r_epochs[i];
        }
        at += o->r_count[dst];
    }
    /* Set-ups: (key, node) pairs ordered by node; versions read before the values (a version
     * sent must never be newer than the value sent with it: workers here may write between). */
    memset(o->s_count, 0, (size_t)world * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < w; j++)
            for (uint64_t bits = setup[i * w + j]; bits; bits &= bits - 1)
                o->s_count[j * 64 + __builtin_ctzll(bits)]++;
    run_starts(o->s_count, world, cursor);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < w; j++)
            for (uint64_t bits = setup[i * w + j]; bits; bits &= bits - 1)
                o->s_keys[cursor[j * 64 + __builtin_ctzll(bits)]++] = keys[i];
    for (int64_t i = 0; i < sizes->setups; i++) {
        const int64_t key = o->s_keys[i];
        if (store_state(s, key) != KEY_OWNER) return -1;
        o->s_versions[i] = store_version(s, key);
    }
    /* None missing: every key is owned, and only this thread removes keys. */
    if (sizes->setups && store_gather(s, o->s_keys, sizes->setups, o->s_values,
                                      sizes->setup_floats, cursor) != 0)
        return -1;
    return 0;
}

int64_t dir_apply_answer(const directory_t *d, const int64_t *keys, int64_t nkeys,
                         const uint8_t *flags, int64_t ni, int64_t src, const int64_t *pos,
                         const int64_t *versions, int64_t n, const int64_t *refresh, int64_t nr,
                         const float *values, int64_t nvalues, double now, int64_t *by_pos) {
    const store_t *s = d->store;
    records_t *recs = d->recs;
    int64_t reports = 0;
    /* Each pass looks its keys up in the store's and the records' tables, and the refreshes
     * write rows: their loads start some keys ahead (perf, 2-node WV: the record's and the
     * store's misses in these passes were ~20% of the engine thread). */
    for (int64_t i = 0; i < n; i++) {
        if (i + STORE_AHEAD < n) {
            store_prefetch(s, keys[pos[i + STORE_AHEAD]]);
            km_prefetch(&recs->map, keys[pos[i + STORE_AHEAD]]);
        }
        if (i + KM_AHEAD < n) {
            const int32_t ahead = rec_find(recs, keys[pos[i + KM_AHEAD]]);
            if (ahead >= 0) __builtin_prefetch(rec_at(recs, ahead), 1);
        }
        const int64_t p = pos[i], key = keys[p];
        if (store_state(s, key) != KEY_OWNER) rec_set_hint(recs, key, src);
        if (p < ni) {
            reports++;
        } else {
            by_pos[p] = versions[i];
        }
    }
    /* Behind: the value that came plus the updates made here since the delta was taken, synced
     * at now in the same step (their entry then needs no second look-up below). */
    enum { REFRESHED = -2 }; /* by_pos[p] once p was refreshed (versions are >= 0) */
    for (int64_t j = 0, off = 0; j < nr; j++) {
        if (j + STORE_AHEAD < nr) store_prefetch(s, keys[refresh[j + STORE_AHEAD]]);
        if (j + STORE_AHEAD / 2 < nr) store_prefetch_rows(s, keys[refresh[j + STORE_AHEAD / 2]], 0);
        const int64_t key = keys[refresh[j]], len = key_len(s, key);
        if (off + len > nvalues) break; /* checked by the caller */
        store_refresh(s, &key, 1, values + off, len, &by_pos[refresh[j]], 0, now);
        by_pos[refresh[j]] = REFRESHED;
        off += len;
    }
    for (int64_t i = 0; i < n; i++) {
        if (i + STORE_AHEAD < n && pos[i + STORE_AHEAD] >= ni) {
            const int64_t ahead = keys[pos[i + STORE_AHEAD]];
            store_prefetch(s, ahead);
            __builtin_prefetch(store_stripe(s, ahead), 1);
        }
        const int64_t p = pos[i];
        if (p >= ni && by_pos[p] != REFRESHED) /* replicas only */
            store_set_synced(s, &keys[p], 1, &versions[i], now);
    }
    (void)nkeys;
    return reports;
}
