/* Intent bookkeeping of a node: per-key counts of acted-on intents (see adapm/intents.py).
 *
 * Only a count's crossings of zero matter to owners (0->1: "this node has intent", 1->0: "its
 * intent ended"). One pass over a round's keys finds them, where numpy needs a sort to count
 * duplicates first. Called with the GIL released; touches no Python object.
 */
#ifndef ADAPM_INTENTS_H
#define ADAPM_INTENTS_H

#include <stdint.h>

/* Adds delta (+1 or -1) to counts[keys[i]] for every i, in order. Writes to crossed the keys
 * whose count went 0 -> 1 (delta +1) or 1 -> 0 (delta -1), each time it happened, and returns
 * how many. Returns -1 - i if keys[i] is outside [0, num_keys) or a count would go negative;
 * then keys[0..i) have been applied. */
int64_t intents_count(int32_t *counts, int64_t num_keys, const int64_t *keys, int64_t n,
                      int delta, int64_t *crossed);

#endif
