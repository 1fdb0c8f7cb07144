/* A node's directory beyond the store: where keys went (forward pointers, location hints,
 * ownership epochs), the home table of the keys homed here, and the owner's per-key intent and
 * replica masks (see adapm/_engine/routing.py and policy.py). Relocations change all of it
 * together with the store, so they run here in one pass per batch: numpy needed ~15 calls per
 * relocated batch on each side (bench/adaptive.py, 2 nodes: ~0.15 ms per relocation message
 * taken in, ~15% of the engine thread's CPU). Touches no Python object.
 */
#ifndef ADAPM_DIRECTORY_H
#define ADAPM_DIRECTORY_H

#include <stdint.h>

#include "store.h"

typedef struct {
    const store_t *store;
    int64_t rank, world_size, words; /* words: uint64 words per mask (ceil(world_size / 64)) */
    int32_t *hint, *forward;         /* per key */
    int64_t *epoch;                  /* per key: ownership epoch while owned here */
    int32_t *home_owner;             /* per key homed here, by key / world_size */
    int64_t *home_epoch;
    int64_t num_home;
    uint64_t *intent, *replicas;     /* per key: `words` words (S and R) */
} directory_t;

/* Keys (unique, owned here) leave for dst: copies out their values (packed, key order),
 * versions, masks (S, R: `words` per key, then zeroed here) and new epochs (epoch + 1), marks
 * them not held, points their forward pointer and hint to dst, and writes each key's freed
 * slot. Returns n, or -1 - i if keys[i] is not owned here (then nothing changed), or -1 - n if
 * values is too small. */
int64_t dir_relocate_out(const directory_t *d, const int64_t *keys, int64_t n, int64_t dst,
                         float *values, int64_t values_floats, int64_t *versions,
                         uint64_t *s_out, uint64_t *r_out, int64_t *epochs, int64_t *slots_out);

/* Keys (unique, not owned here) arrive as main copies with values (packed, key order),
 * versions, masks and epochs: a replica held here is promoted (its unsent updates are added),
 * other keys are inserted at slots[j] (the j-th key that was not a replica). The new owner's
 * replica bit is cleared, the epoch installed, the hint set to this node and, for keys homed
 * here, the home table updated if the epoch is newer. was_replica[i] says which were
 * promoted. Returns n, or -1 - i if keys[i] is owned here already, or -1 - n if values or
 * slots are too short or a slot is outside the slab; then nothing changed. */
int64_t dir_relocate_in(const directory_t *d, const int64_t *keys, int64_t n,
                        const float *values, int64_t values_floats, const int64_t *versions,
                        const uint64_t *s_in, const uint64_t *r_in, const int64_t *epochs,
                        const int64_t *slots, int64_t nslots, int8_t *was_replica);

#endif
