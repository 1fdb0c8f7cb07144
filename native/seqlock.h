/* The store's per-stripe seqlocks (see store.h): readers copy and retry if a writer touched the
 * stripe meanwhile; writers spin on the stripe's sequence word, odd while held. */
#ifndef ADAPM_SEQLOCK_H
#define ADAPM_SEQLOCK_H

#include <sched.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

/* uint64 words per stripe in the store's seqs array: each stripe's sequence word alone on its
 * 64-byte cache line. Packed 8 to a line, two threads adding to different keys wrote the same
 * lines (a batch of ~1,500 random keys touches most of 2,048 lines), and each write took the
 * line from the other core: bench/threads.py, WV on one node, 2 threads, 1.14x the CPU per
 * batch of 1 thread. */
#define SEQ_STRIDE 8

/* Spins this many times before yielding the core: a writer holds a stripe for well under a
 * microsecond, but with more threads than cores the holder may be descheduled. */
#define SPINS_BEFORE_YIELD 64

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

/* A plain spin lock for short critical sections between threads (0: free, 1: held). */
static inline void spin_lock(int *lock) {
    int spins = 0;
    for (;;) {
        int free_ = 0;
        if (__atomic_compare_exchange_n(lock, &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return;
        if (++spins > SPINS_BEFORE_YIELD) { sched_yield(); spins = 0; } else CPU_RELAX();
    }
}

static inline void spin_unlock(int *lock) { __atomic_store_n(lock, 0, __ATOMIC_RELEASE); }

#endif
