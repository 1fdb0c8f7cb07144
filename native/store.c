#include "store.h"

#include <sched.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

/* Spins this many times before yielding the core: a writer holds a stripe for well under a
 * microsecond, but with more threads than cores the holder may be descheduled. */
#define SPINS_BEFORE_YIELD 64

static inline uint64_t *stripe(const store_t *s, int64_t key) {
    return &s->seqs[(uint64_t)key & s->stripe_mask];
}

static inline uint64_t read_begin(const uint64_t *seq) {
    int spins = 0;
    for (;;) {
        uint64_t v = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (!(v & 1)) return v;
        if (++spins > SPINS_BEFORE_YIELD) { sched_yield(); spins = 0; } else CPU_RELAX();
    }
}

static inline int read_changed(const uint64_t *seq, uint64_t v) {
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(seq, __ATOMIC_RELAXED) != v;
}

static inline void write_lock(uint64_t *seq) {
    int spins = 0;
    for (;;) {
        uint64_t v = __atomic_load_n(seq, __ATOMIC_RELAXED);
        if (!(v & 1) &&
            __atomic_compare_exchange_n(seq, &v, v + 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            /* Readers must see the odd sequence before any data store below. */
            __atomic_thread_fence(__ATOMIC_RELEASE);
            return;
        }
        if (++spins > SPINS_BEFORE_YIELD) { sched_yield(); spins = 0; } else CPU_RELAX();
    }
}

static inline void write_unlock(uint64_t *seq) {
    __atomic_store_n(seq, __atomic_load_n(seq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
}

int64_t store_check_keys(const int64_t *keys, int64_t n, int64_t num_keys) {
    for (int64_t i = 0; i < n; i++) {
        /* One unsigned compare catches negatives too. */
        if ((uint64_t)keys[i] >= (uint64_t)num_keys) return i;
    }
    return -1;
}

int64_t store_gather(const store_t *s, const int64_t *keys, int64_t n, float *out,
                     int64_t out_floats, int64_t *missing) {
    int64_t nmiss = 0, off = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        const int64_t len = key_len(s, key);
        if (off + len > out_floats) return -1;
        const uint64_t *seq = stripe(s, key);
        for (;;) {
            const uint64_t v = read_begin(seq);
            const int64_t slot = s->slot[key];
            if (slot < 0) {
                if (read_changed(seq, v)) continue;
                missing[nmiss++] = i;
                break;
            }
            memcpy(out + off, s->slab + slot, (size_t)len * sizeof(float));
            if (!read_changed(seq, v)) break;
        }
        off += len;
    }
    return nmiss;
}

int64_t store_scatter(const store_t *s, const int64_t *keys, int64_t n, const float *vals,
                      int64_t vals_floats, int64_t *missing, int mode) {
    int64_t nmiss = 0, off = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        const int64_t len = key_len(s, key);
        if (off + len > vals_floats) return -1;
        uint64_t *seq = stripe(s, key);
        const float *src = vals + off;
        off += len;
        write_lock(seq);
        const int8_t st = s->state[key];
        const int64_t slot = s->slot[key];
        if (st == KEY_OWNER || (st == KEY_REPLICA && mode == 0)) {
            float *dst = s->slab + slot;
            if (mode == 0) {
                for (int64_t j = 0; j < len; j++) dst[j] += src[j];
                if (st == KEY_REPLICA) {
                    float *d = s->delta + slot;
                    for (int64_t j = 0; j < len; j++) d[j] += src[j];
                }
            } else {
                memcpy(dst, src, (size_t)len * sizeof(float));
            }
        } else {
            missing[nmiss++] = i;
        }
        write_unlock(seq);
    }
    return nmiss;
}

int64_t store_insert(const store_t *s, const int64_t *keys, int64_t n, const int64_t *slots,
                     int8_t new_state, const float *vals, int64_t vals_floats) {
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        const int64_t len = key_len(s, key);
        const int64_t slot = slots[i];
        if (slot < 0 || slot + len > s->slab_floats) return -1;
        if (vals && off + len > vals_floats) return -1;
        uint64_t *seq = stripe(s, key);
        write_lock(seq);
        if (vals) memcpy(s->slab + slot, vals + off, (size_t)len * sizeof(float));
        else memset(s->slab + slot, 0, (size_t)len * sizeof(float));
        memset(s->delta + slot, 0, (size_t)len * sizeof(float));
        s->slot[key] = slot;
        s->state[key] = new_state;
        write_unlock(seq);
        off += len;
    }
    return n;
}

int64_t store_remove(const store_t *s, const int64_t *keys, int64_t n, float *vals_out,
                     float *deltas_out, int64_t out_floats, int64_t *slots_out) {
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        const int64_t len = key_len(s, key);
        if (off + len > out_floats) return -1;
        uint64_t *seq = stripe(s, key);
        write_lock(seq);
        const int64_t slot = s->slot[key];
        slots_out[i] = slot;
        if (slot >= 0) {
            if (vals_out) memcpy(vals_out + off, s->slab + slot, (size_t)len * sizeof(float));
            if (deltas_out) memcpy(deltas_out + off, s->delta + slot, (size_t)len * sizeof(float));
            s->slot[key] = -1;
            s->state[key] = KEY_NONE;
        }
        write_unlock(seq);
        off += len;
    }
    return n;
}
