/* Owner decisions: see policy.h. */
#include "policy.h"

int64_t policy_decide(int variant, int rank, int node, uint64_t *intent, uint64_t *replicas,
                      const int64_t *keys, int64_t n, const uint8_t *has_intent,
                      int64_t *relocate_to, uint64_t *setup) {
    const uint64_t bit = (uint64_t)1 << node, own = (uint64_t)1 << rank;
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        const uint64_t before = intent[key];
        const uint64_t after = has_intent[i] ? (before | bit) : (before & ~bit);
        intent[key] = after;
        uint64_t held = replicas[key];
        const uint64_t stale = held & ~after; /* holders whose intent ended dropped theirs */
        if (stale) {
            held &= after;
            dropped += __builtin_popcountll(stale);
        }
        int64_t dst = -1;
        uint64_t want = 0;
        if (variant == POLICY_ADAPTIVE) {
            const uint64_t others = after & ~own;
            const int count = __builtin_popcountll(after);
            if (count == 1 && others) dst = __builtin_ctzll(after); /* S = {r}, r != owner */
            else if (count >= 2) want = others & ~held;              /* a replica at the rest */
        } else if (variant == POLICY_REPLICATION_ONLY) {
            want = after & ~own & ~held;
        } else { /* relocation only: follow every node that newly signals intent */
            if (node != rank && has_intent[i] && !(before & bit)) dst = node;
        }
        replicas[key] = held | want;
        relocate_to[i] = dst;
        setup[i] = want;
    }
    return dropped;
}
