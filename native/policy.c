/* Owner decisions: see policy.h. */
#include "policy.h"

int64_t policy_decide_key(int variant, int64_t rank, int64_t node, int64_t words, uint64_t *s,
                          uint64_t *r, int has_intent, uint64_t *want, int64_t *dropped) {
    const int64_t node_word = node / 64, own_word = rank / 64;
    const uint64_t bit = (uint64_t)1 << (node % 64), own = (uint64_t)1 << (rank % 64);
    const int was_on = (s[node_word] & bit) != 0;
    if (has_intent) s[node_word] |= bit;
    else s[node_word] &= ~bit;
    /* |S| as 0, 1 or 2 (two or more), and the one member when |S| = 1. Without a popcount:
     * the build targets baseline x86-64, where __builtin_popcountll is a libgcc call (0.7-1.4%
     * of the engine thread's samples in bench/adaptive.py, one per report). */
    int64_t count = 0, only = -1;
    for (int64_t w = 0; w < words && count < 2; w++) {
        const uint64_t x = s[w];
        if (!x) continue;
        if (count == 0 && !(x & (x - 1))) {
            count = 1;
            only = w * 64 + __builtin_ctzll(x);
        } else {
            count = 2;
        }
    }
    int64_t dst = -1;
    for (int64_t w = 0; w < words; w++) {
        const uint64_t stale = r[w] & ~s[w]; /* holders whose intent ended dropped theirs */
        if (stale) {
            r[w] &= s[w];
            *dropped += __builtin_popcountll(stale);
        }
        const uint64_t others = w == own_word ? s[w] & ~own : s[w];
        uint64_t add = 0;
        if (variant == POLICY_ADAPTIVE) {
            if (count >= 2) add = others & ~r[w]; /* a replica at the rest of S */
        } else if (variant == POLICY_REPLICATION_ONLY) {
            add = others & ~r[w];
        }
        r[w] |= add;
        want[w] = add;
    }
    if (variant == POLICY_ADAPTIVE) {
        if (count == 1 && only != rank) dst = only; /* S = {r}, r != owner */
    } else if (variant == POLICY_RELOCATION_ONLY) {
        /* follow every node that newly signals intent */
        if (node != rank && has_intent && !was_on) dst = node;
    }
    return dst;
}

int64_t policy_decide(int variant, int64_t rank, int64_t node, int64_t words, uint64_t *intent,
                      uint64_t *replicas, const int64_t *keys, int64_t n,
                      const uint8_t *has_intent, int64_t *relocate_to, uint64_t *setup) {
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; i++)
        relocate_to[i] = policy_decide_key(variant, rank, node, words, intent + keys[i] * words,
                                           replicas + keys[i] * words, has_intent[i],
                                           setup + i * words, &dropped);
    return dropped;
}
