/* Store primitives: gather / scatter-add / set over key batches.
 *
 * The store's memory is owned by Python (numpy arrays); these functions only get pointers.
 * Concurrency: one seqlock per stripe of keys (key & stripe_mask). Readers (gather) take no lock:
 * they copy and retry if a writer touched the stripe meanwhile. Writers (push, set, insert,
 * remove) spin on the stripe's sequence word. This keeps the common case, a pull of local keys,
 * free of atomic read-modify-writes, and it makes a key's directory entry and value change
 * together: a reader never sees a slot that was freed and reused under it.
 *
 * All functions are called with the GIL released and touch no Python object.
 */
#ifndef ADAPM_STORE_H
#define ADAPM_STORE_H

#include <stdint.h>

enum { KEY_NONE = 0, KEY_OWNER = 1, KEY_REPLICA = 2 };

typedef struct {
    int64_t num_keys;
    int64_t uniform_len;   /* > 0: every key has this many floats; 0: see lens */
    const int64_t *lens;   /* per-key lengths when uniform_len == 0 */
    int64_t *slot;         /* per key: offset (in floats) into slab, -1 when not held here;
                              a replica's slot also has REPLICA_BIT set (see below) */
    int8_t *state;         /* per key: KEY_NONE / KEY_OWNER / KEY_REPLICA */
    float *slab;           /* values of held keys */
    float *delta;          /* replicas: updates not yet sent to the owner (same offsets as slab) */
    int64_t slab_floats;   /* capacity of slab and delta, for bounds checks */
    uint64_t *seqs;        /* stripe sequence words; odd while a writer holds the stripe */
    uint64_t stripe_mask;  /* number of stripes - 1 (a power of two) */
    int64_t *version;      /* per key: owner: bumped by every write; replica: owner's version
                              when last synced */
    double *synced_at;     /* per key: replicas: CLOCK_MONOTONIC seconds of the last sync */
    int64_t *access_stats; /* [replica reads, sum of read times (us), sum of synced_at (us)] */
} store_t;

/* Replica-ness is a bit of the slot word, so that a read, which must not touch more cache lines
 * than it needs, learns it from the slot it loads anyway (the state byte is another miss). */
#define REPLICA_BIT ((int64_t)1 << 62)
#define SLOT_OFFSET(raw) ((raw) & (REPLICA_BIT - 1))

static inline int64_t key_len(const store_t *s, int64_t key) {
    return s->uniform_len ? s->uniform_len : s->lens[key];
}

/* Index of the first key outside [0, num_keys), or -1 when all are valid. The functions below
 * expect checked keys (they prefetch directory entries of keys ahead of the one they work on). */
int64_t store_check_keys(const int64_t *keys, int64_t n, int64_t num_keys);

/* Copies the values of locally held keys into out (request order, rows packed back to back).
 * Positions of keys not held here go to missing[]; their rows in out are left untouched.
 * Returns the number of missing positions, or -1 if out is too small (out_floats). */
int64_t store_gather(const store_t *s, const int64_t *keys, int64_t n, float *out,
                     int64_t out_floats, int64_t *missing);

/* Adds vals to locally held keys (replicas also record the update in delta). Same conventions.
 * mode 0: add; mode 1: set (owner copies only: a replica's set is sent to the owner). */
int64_t store_scatter(const store_t *s, const int64_t *keys, int64_t n, const float *vals,
                      int64_t vals_floats, int64_t *missing, int mode);

/* Makes keys held here: value from vals (or zeros when vals is NULL), at the given slots,
 * with the given state and versions (zeros when NULL); replica deltas start at zero. */
int64_t store_insert(const store_t *s, const int64_t *keys, int64_t n, const int64_t *slots,
                     int8_t new_state, const float *vals, int64_t vals_floats,
                     const int64_t *versions);

/* Replicas only: moves each key's delta out (zeroing it), atomically per key; nonzero[i] tells
 * whether key i had any update. Only the rows of keys with updates are written, packed back to
 * back in key order (what the sync round sends). Returns the number of floats written, or -1 if
 * out is too small (out_floats). Keys that are not replicas count as without updates. */
int64_t store_take_deltas(const store_t *s, const int64_t *keys, int64_t n, float *out,
                          int64_t out_floats, int8_t *nonzero);

/* Replicas only (others are skipped): value = vals + delta (updates made here since the delta
 * was last taken stay visible), version = versions[i]. promote != 0 also makes the key the owner
 * copy (its delta is folded in and cleared). Returns the number of keys changed. */
int64_t store_refresh(const store_t *s, const int64_t *keys, int64_t n, const float *vals,
                      int64_t vals_floats, const int64_t *versions, int promote);

/* Removes keys: copies value (and delta into deltas_out when not NULL) out, then marks them
 * not held. Writes each key's former slot into slots_out (-1 if it was not held). */
int64_t store_remove(const store_t *s, const int64_t *keys, int64_t n, float *vals_out,
                     float *deltas_out, int64_t out_floats, int64_t *slots_out);

#endif
