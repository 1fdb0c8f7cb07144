/* The owner's decision on intent reports (see adapm/_engine/policy.py), one pass per batch.
 *
 * Per owned key the owner keeps two bit masks over ranks: intent (S, nodes with acted-on
 * intent, the owner included) and replicas (R, nodes holding a replica), each `words` uint64
 * words per key (rank r is bit r % 64 of word r / 64). A batch of reports from one node updates
 * S, drops replicas whose holder no longer has intent (R <- R & S), and decides per key:
 * relocate to one node, or set up replicas at some nodes. numpy needed ~20 calls per batch for
 * this (~0.2 ms for a few hundred keys on bench/adaptive.py, 2 nodes). Touches no Python object.
 */
#ifndef ADAPM_POLICY_H
#define ADAPM_POLICY_H

#include <stdint.h>

enum { POLICY_ADAPTIVE = 0, POLICY_REPLICATION_ONLY = 1, POLICY_RELOCATION_ONLY = 2 };

/* Node `node` reports for keys[i] (unique, owned by `rank`) has_intent[i]. Updates intent[] and
 * replicas[] ([num_keys][words]) of the keys; writes relocate_to[i] (destination rank, or -1)
 * and setup[i][0..words) (the nodes that get a new replica; already added to replicas[]).
 * Returns the number of replicas removed from R because their holder's intent ended. Keys and
 * ranks must be checked by the caller. */
/* One key's decision: node reports has_intent for a key with masks s and r (words each,
 * updated in place); the new replicas go to want (words), replicas whose holder's intent ended
 * are counted into *dropped. Returns the destination rank, or -1. */
int64_t policy_decide_key(int variant, int64_t rank, int64_t node, int64_t words, uint64_t *s,
                          uint64_t *r, int has_intent, uint64_t *want, int64_t *dropped);

/* The batch form over dense masks (the reference the tests hold the records against). */
int64_t policy_decide(int variant, int64_t rank, int64_t node, int64_t words, uint64_t *intent,
                      uint64_t *replicas, const int64_t *keys, int64_t n,
                      const uint8_t *has_intent, int64_t *relocate_to, uint64_t *setup);

#endif
