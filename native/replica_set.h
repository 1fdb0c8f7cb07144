/* The keys held here as replicas, sorted: what each sync round sends deltas or versions for.
 * Changes come in batches (replicas set up, dropped, promoted) that are small next to the set,
 * so a batch is merged in (or cut out) in one pass over the set. Used by the engine thread
 * only. Touches no Python object. */
#ifndef ADAPM_REPLICA_SET_H
#define ADAPM_REPLICA_SET_H

#include <stdint.h>

typedef struct {
    int64_t *keys; /* ascending */
    int64_t len, cap;
} replica_set_t;

void rs_free(replica_set_t *rs);

/* Adds keys[0..n) (unique, none of them in the set; any order). Returns 0, or -1 if out of
 * memory (then the set is unchanged). */
int rs_add(replica_set_t *rs, const int64_t *keys, int64_t n);

/* Removes those of keys[0..n) that are in the set. */
void rs_remove(replica_set_t *rs, const int64_t *keys, int64_t n);

#endif
