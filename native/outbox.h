/* The moves an owner decided (relocations, replica set-ups, home updates: protocol.py's
 * MOVE_SECTIONS), held per peer until a message to that peer carries them (Posting.post_message,
 * adapm/_engine/posting.py; see Posting.release for when they go alone).
 *
 * They were held in Python: a list per peer and section of the decision's arrays, cut per
 * destination (~10 numpy calls and a list of tuples per decision) and concatenated when sent
 * (cProfile of a 2-node KGE run: ~11% of the engine thread). Here a decision is appended to each
 * peer's twelve byte buffers in the same native call that makes it, and a carrier takes a peer's
 * moves out in one call. Touches no Python object; engine thread only.
 *
 * Within a peer and section, entries keep the order in which they were decided (as the Python
 * lists did), so what a peer receives is unchanged. */
#ifndef ADAPM_OUTBOX_H
#define ADAPM_OUTBOX_H

#include <stdint.h>

#include "directory.h"

#define OUTBOX_ARRAYS 12 /* relocations 6 (keys, values, versions, S, R, epochs), set-ups 3
                          * (keys, values, versions), home updates 3 (keys, owners, epochs) */
#define OUTBOX_ROLES "krvmmvkrvknv" /* their role letters (check.h) */

typedef struct {
    uint8_t *p;
    int64_t len, cap; /* bytes */
} outbox_buf_t;

typedef struct {
    outbox_buf_t a[OUTBOX_ARRAYS];
} outbox_peer_t;

typedef struct {
    outbox_peer_t *peers; /* world_size */
    int64_t world_size, words;
    int64_t *need;        /* scratch: OUTBOX_ARRAYS bytes per peer for the next decision */
} outbox_t;

/* Empty buffers for every peer. 0, or -1 if out of memory (then outbox_free is safe). */
int outbox_init(outbox_t *ob, int64_t world_size, int64_t words);
void outbox_free(outbox_t *ob);

/* Room in each peer's buffers for what dir_decide_execute will append for the decision on
 * keys[0..n) (relocate_to and setup as dir_policy_decide made them), so that appending it
 * cannot fail halfway. 0, or -1 if out of memory (nothing held changed). */
int outbox_reserve_decision(outbox_t *ob, const directory_t *d, const int64_t *keys, int64_t n,
                            const int64_t *relocate_to, const uint64_t *setup);

/* Appends an executed decision (decide_out_t, sized by sizes) to the peers' buffers, each
 * destination's runs to its own; room was reserved by outbox_reserve_decision. */
void outbox_append_decision(outbox_t *ob, const directory_t *d, const decide_out_t *o,
                            const decide_sizes_t *sizes);

/* Whether anything is held for dst. */
static inline int outbox_holds(const outbox_t *ob, int64_t dst) {
    const outbox_peer_t *p = &ob->peers[dst];
    return p->a[0].len || p->a[6].len || p->a[9].len; /* each section's keys */
}

/* Bytes of array i held for dst. */
static inline int64_t outbox_bytes(const outbox_t *ob, int64_t dst, int i) {
    return ob->peers[dst].a[i].len;
}

/* Copies array i held for dst to out (outbox_bytes of it); outbox_clear empties dst's after. */
void outbox_copy(const outbox_t *ob, int64_t dst, int i, void *out);
void outbox_clear(outbox_t *ob, int64_t dst);

/* Bytes the buffers hold room for (memory accounting). */
int64_t outbox_capacity(const outbox_t *ob);

#endif
