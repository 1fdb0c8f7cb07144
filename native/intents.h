/* Intent bookkeeping of a node: per-key counts of acted-on intents (see adapm/_engine/intents.py).
 *
 * Only a count's crossings of zero matter to owners (0->1: "this node has intent", 1->0: "its
 * intent ended"). One pass over a round's keys finds them and collects each crossed key once
 * (a mark byte per key), where numpy needs a sort to count duplicates and another to dedupe.
 * Touches no Python object.
 */
#ifndef ADAPM_INTENTS_H
#define ADAPM_INTENTS_H

#include <stdint.h>

/* Adds delta (+1 or -1) to counts[keys[i]] for every i, in order. A key whose count crosses
 * zero (0 -> 1 for +1, 1 -> 0 for -1) and is not marked yet is marked and appended to
 * dirty[ndirty...]; dirty must have room for n more keys. Returns the new number of dirty keys,
 * or -1 - i if keys[i] is outside [0, num_keys) or its count would go negative; then keys[0..i)
 * have been applied (and recorded as dirty). */
int64_t intents_count(int32_t *counts, int64_t num_keys, const int64_t *keys, int64_t n,
                      int delta, uint8_t *mark, int64_t *dirty, int64_t ndirty);

/* For each dirty key (unmarking it): has_intent = counts[key] > 0; if that differs from
 * told[key], appends the key to out_keys and has_intent to out_flags. Returns how many. */
int64_t intents_changes(const int32_t *counts, const uint8_t *told, uint8_t *mark,
                        const int64_t *dirty, int64_t ndirty, int64_t *out_keys,
                        uint8_t *out_flags);

#endif
