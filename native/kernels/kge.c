/* KGE training kernel (see kge.h for the contract).
 *
 * A step runs in three passes over short contiguous vectors, each a loop that gcc -O3
 * vectorises: (1) the partial derivatives of the score for the three rows, into scratch; the
 * score itself is a dot product of the object row with its partials, summed in double;
 * (2) for a positive, the L2 terms are added to the gradients (from the values before the step);
 * (3) AdaGrad, row by row. Because (1) and (2) finish before (3) writes anything, rows that occur
 * twice in a step (s == o, or a negative equal to the positive) see the pre-step values.
 */
#include "kge.h"

#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
/* The build targets baseline x86-64 (SSE2); an AVX variant of the batch loop is picked at run
 * time where the CPU has it. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KGE_HAVE_AVX 1
#else
#define KGE_HAVE_AVX 0
#endif

/* Helpers of a step: inlined into both variants of the batch loop, so they get its target. */
#define INLINE static inline __attribute__((always_inline))

#include "common.h"

int kge_widths(int model, int64_t dim, int64_t *entity_width, int64_t *relation_width) {
    if (dim < 1 || dim > KGE_MAX_DIM) return -1;
    switch (model) {
    case KGE_COMPLEX:
        *entity_width = 2 * dim;
        *relation_width = 2 * dim;
        return 0;
    case KGE_DISTMULT:
        *entity_width = dim;
        *relation_width = dim;
        return 0;
    case KGE_RESCAL:
        *entity_width = dim;
        *relation_width = dim * dim;
        return 0;
    default:
        return -1;
    }
}

/* ---- pass 1: partial derivatives and score ------------------------------------------------ */

/* ComplEx, real parts in [0, d), imaginary in [d, 2d). score = Re(<s, r, conj(o)>) = o . go. */
INLINE double complex_partials(int64_t d, const float *restrict s, const float *restrict r,
                               const float *restrict o, float *restrict gs, float *restrict gr,
                               float *restrict go) {
    const float *restrict s_im = s + d, *restrict r_im = r + d, *restrict o_im = o + d;
    float *restrict gs_im = gs + d, *restrict gr_im = gr + d, *restrict go_im = go + d;
    for (int64_t i = 0; i < d; i++) {
        const float sr = s[i], si = s_im[i], rr = r[i], ri = r_im[i], orr = o[i], oi = o_im[i];
        gs[i] = rr * orr + ri * oi;
        gs_im[i] = rr * oi - ri * orr;
        gr[i] = sr * orr + si * oi;
        gr_im[i] = sr * oi - si * orr;
        go[i] = rr * sr - ri * si;
        go_im[i] = rr * si + ri * sr;
    }
    return dot_f64(o, go, 2 * d);
}

/* DistMult: score = sum s_i r_i o_i = o . (s * r). */
INLINE double distmult_partials(int64_t d, const float *restrict s, const float *restrict r,
                                const float *restrict o, float *restrict gs, float *restrict gr,
                                float *restrict go) {
    for (int64_t i = 0; i < d; i++) {
        gs[i] = r[i] * o[i];
        gr[i] = s[i] * o[i];
        go[i] = s[i] * r[i];
    }
    return dot_f64(o, go, d);
}

/* RESCAL, m row-major d x d: score = s^T m o. gs = m o (row dots in double), go = m^T s (axpy
 * over the rows of m, so every inner loop walks memory forward), gr = s o^T. */
INLINE double rescal_partials(int64_t d, const float *restrict s, const float *restrict m,
                              const float *restrict o, float *restrict gs, float *restrict gr,
                              float *restrict go) {
    double score = 0.0;
    for (int64_t j = 0; j < d; j++) go[j] = 0.0f;
    for (int64_t i = 0; i < d; i++) {
        const float si = s[i];
        const float *restrict mi = m + i * d;
        float *restrict gri = gr + i * d;
        const double row = dot_f64(mi, o, d);
        gs[i] = (float)row;
        score += (double)si * row;
        for (int64_t j = 0; j < d; j++) {
            go[j] += si * mi[j];
            gri[j] = si * o[j];
        }
    }
    return score;
}

/* ---- pass 2: gradients of a positive --------------------------------------------------------- */

/* g = dl * g + reg * e (e: the embedding before the step). */
INLINE void add_l2(float *restrict g, const float *restrict e, int64_t n, float dl, float reg) {
    for (int64_t j = 0; j < n; j++) g[j] = dl * g[j] + reg * e[j];
}

/* ---- pass 3: AdaGrad ------------------------------------------------------------------------ */

/* For g_j = scale * p[j]: acc_j += g_j^2; emb_j -= lr * g_j / sqrt(acc_j) (the new acc_j, as
 * AdaPM does), and the same two deltas are added to the row's updates. An element whose new
 * accumulator is not positive (only possible with g_j == 0 and a zero accumulator) is left as it
 * is instead of becoming 0/0 = NaN.
 * The division and the square root dominate a step, and gcc vectorises neither sqrtf (errno)
 * nor this loop on its own, so the bodies below are the scalar loop written with SSE2 / AVX
 * intrinsics. All three give bit-identical results: the same IEEE operations in the same order,
 * no contraction into FMAs. */
#define ADAGRAD_SCALAR_TAIL                                                                      \
    for (; j < n; j++) {                                                                         \
        const float g = scale * p[j];                                                            \
        const float g2 = g * g;                                                                  \
        const float a = acc[j] + g2;                                                             \
        acc[j] = a;                                                                              \
        upd_acc[j] += g2;                                                                        \
        const float delta = a > 0.0f ? -lr * g / sqrtf(a) : 0.0f;                                \
        emb[j] += delta;                                                                         \
        upd_emb[j] += delta;                                                                     \
    }

static void adagrad_row(float *restrict emb, float *restrict acc, float *restrict upd_emb,
                        float *restrict upd_acc, const float *restrict p, int64_t n, float scale,
                        float lr) {
    int64_t j = 0;
#if defined(__SSE2__)
    const __m128 vscale = _mm_set1_ps(scale), vneg_lr = _mm_set1_ps(-lr);
    const __m128 zero = _mm_setzero_ps();
    for (; j + 4 <= n; j += 4) {
        const __m128 g = _mm_mul_ps(vscale, _mm_loadu_ps(p + j));
        const __m128 g2 = _mm_mul_ps(g, g);
        const __m128 a = _mm_add_ps(_mm_loadu_ps(acc + j), g2);
        _mm_storeu_ps(acc + j, a);
        _mm_storeu_ps(upd_acc + j, _mm_add_ps(_mm_loadu_ps(upd_acc + j), g2));
        __m128 delta = _mm_div_ps(_mm_mul_ps(vneg_lr, g), _mm_sqrt_ps(a));
        delta = _mm_and_ps(delta, _mm_cmpgt_ps(a, zero));
        _mm_storeu_ps(emb + j, _mm_add_ps(_mm_loadu_ps(emb + j), delta));
        _mm_storeu_ps(upd_emb + j, _mm_add_ps(_mm_loadu_ps(upd_emb + j), delta));
    }
#endif
    ADAGRAD_SCALAR_TAIL
}

#if KGE_HAVE_AVX
/* Twice the width: 1.5x the triples/s of ComplEx d=100 with rows in cache (Zen 3). */
__attribute__((target("avx"))) static void adagrad_row_avx(
    float *restrict emb, float *restrict acc, float *restrict upd_emb, float *restrict upd_acc,
    const float *restrict p, int64_t n, float scale, float lr) {
    int64_t j = 0;
    const __m256 vscale = _mm256_set1_ps(scale), vneg_lr = _mm256_set1_ps(-lr);
    const __m256 zero = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        const __m256 g = _mm256_mul_ps(vscale, _mm256_loadu_ps(p + j));
        const __m256 g2 = _mm256_mul_ps(g, g);
        const __m256 a = _mm256_add_ps(_mm256_loadu_ps(acc + j), g2);
        _mm256_storeu_ps(acc + j, a);
        _mm256_storeu_ps(upd_acc + j, _mm256_add_ps(_mm256_loadu_ps(upd_acc + j), g2));
        __m256 delta = _mm256_div_ps(_mm256_mul_ps(vneg_lr, g), _mm256_sqrt_ps(a));
        delta = _mm256_and_ps(delta, _mm256_cmp_ps(a, zero, _CMP_GT_OQ));
        _mm256_storeu_ps(emb + j, _mm256_add_ps(_mm256_loadu_ps(emb + j), delta));
        _mm256_storeu_ps(upd_emb + j, _mm256_add_ps(_mm256_loadu_ps(upd_emb + j), delta));
    }
    ADAGRAD_SCALAR_TAIL
}
#endif

typedef void (*adagrad_fn)(float *restrict, float *restrict, float *restrict, float *restrict,
                           const float *restrict, int64_t, float, float);

/* ---- steps and the batch -------------------------------------------------------------------- */

typedef struct {
    const kge_batch_t *b;
    int64_t we, wr; /* embedding widths */
    float *gs, *gr, *go;
    double bce, reg;
} run_t;

/* Inlined into each variant of the batch loop; adagrad is a constant there (a direct call). */
INLINE void step(run_t *run, int64_t s_row, int64_t r_row, int64_t o_row, int label,
                 adagrad_fn adagrad) {
    const kge_batch_t *b = run->b;
    const int64_t we = run->we, wr = run->wr;
    const int64_t so = b->offsets[s_row], ro = b->offsets[r_row], oo = b->offsets[o_row];
    float *s = b->values + so, *r = b->values + ro, *o = b->values + oo;
    float *gs = run->gs, *gr = run->gr, *go = run->go;

    double score;
    switch (b->model) {
    case KGE_COMPLEX: score = complex_partials(b->dim, s, r, o, gs, gr, go); break;
    case KGE_DISTMULT: score = distmult_partials(b->dim, s, r, o, gs, gr, go); break;
    default: score = rescal_partials(b->dim, s, r, o, gs, gr, go); break;
    }
    /* -log sigmoid(y * score), y = +1 / -1 */
    run->bce += label ? softplus(-score) : softplus(score);
    const float dl = (float)(sigmoid(score) - (double)label);

    float scale = dl;
    if (label) {
        run->reg += (double)b->reg_entity * dot_f64(s, s, we) +
                    (double)b->reg_relation * dot_f64(r, r, wr) +
                    (double)b->reg_entity * dot_f64(o, o, we);
        add_l2(gs, s, we, dl, b->reg_entity);
        add_l2(gr, r, wr, dl, b->reg_relation);
        add_l2(go, o, we, dl, b->reg_entity);
        scale = 1.0f; /* the gradients are final; 1 * g is exact */
    }
    float *u = b->updates;
    adagrad(s, s + we, u + so, u + so + we, gs, we, scale, b->lr);
    adagrad(r, r + wr, u + ro, u + ro + wr, gr, wr, scale, b->lr);
    adagrad(o, o + we, u + oo, u + oo + we, go, we, scale, b->lr);
}

static int check_row(const kge_batch_t *b, int64_t row, int64_t width, int where, int64_t pos,
                     kge_fault_t *fault) {
    if (row >= 0 && row < b->num_rows && range_inside(b->offsets[row], 2 * width, b->num_values))
        return 0;
    fault->where = where;
    fault->position = pos;
    fault->row = row;
    fault->bad_offset = row >= 0 && row < b->num_rows;
    return -1;
}

int kge_check_batch(const kge_batch_t *b, kge_fault_t *fault) {
    int64_t we, wr;
    if (kge_widths(b->model, b->dim, &we, &wr) < 0) return -1;
    for (int64_t i = 0; i < b->num_triples; i++) {
        const int64_t *t = b->triples + 3 * i;
        if (check_row(b, t[0], we, KGE_AT_HEAD, i, fault) < 0 ||
            check_row(b, t[1], wr, KGE_AT_RELATION, i, fault) < 0 ||
            check_row(b, t[2], we, KGE_AT_TAIL, i, fault) < 0)
            return -1;
    }
    const int64_t nneg = b->num_triples * b->negs_per_side;
    for (int64_t i = 0; i < nneg; i++) {
        if (check_row(b, b->neg_heads[i], we, KGE_AT_NEG_HEAD, i, fault) < 0 ||
            check_row(b, b->neg_tails[i], we, KGE_AT_NEG_TAIL, i, fault) < 0)
            return -1;
    }
    return 0;
}

/* The batch loop, compiled twice: for the build's baseline target and for AVX, where the
 * vectorised loops of a step (all inlined) run twice as wide; a few percent more triples/s than
 * the AVX AdaGrad pass alone. */
INLINE void train_steps(run_t *run, adagrad_fn adagrad) {
    const kge_batch_t *b = run->b;
    const int64_t k = b->negs_per_side;
    for (int64_t i = 0; i < b->num_triples; i++) {
        const int64_t h = b->triples[3 * i], r = b->triples[3 * i + 1], t = b->triples[3 * i + 2];
        step(run, h, r, t, 1, adagrad);
        for (int64_t j = 0; j < k; j++) {
            step(run, h, r, b->neg_tails[i * k + j], 0, adagrad);
            step(run, b->neg_heads[i * k + j], r, t, 0, adagrad);
        }
    }
}

static void train_baseline(run_t *run) { train_steps(run, adagrad_row); }

#if KGE_HAVE_AVX
__attribute__((target("avx"))) static void train_avx(run_t *run) {
    train_steps(run, adagrad_row_avx);
}
#endif

int kge_train_batch(const kge_batch_t *b, double *bce_sum, double *reg_sum, kge_fault_t *fault) {
    *bce_sum = 0.0;
    *reg_sum = 0.0;
    if (kge_check_batch(b, fault) < 0) return KGE_BAD_ROW;
    run_t run = {.b = b};
    kge_widths(b->model, b->dim, &run.we, &run.wr);
    float *scratch = NULL;
    /* Only with a triple: then the check has seen rows of both widths inside values, which bounds
     * this allocation by the caller's buffer (RESCAL's d*d could otherwise be huge). */
    if (b->num_triples > 0) {
        scratch = malloc((size_t)(2 * run.we + run.wr) * sizeof(float));
        if (!scratch) return KGE_NO_MEMORY;
        run.gs = scratch;
        run.go = scratch + run.we;
        run.gr = scratch + 2 * run.we;
    }
    if (b->num_values > 0) memset(b->updates, 0, (size_t)b->num_values * sizeof(float));
    /* No software prefetch of the next step's rows: measured with ComplEx d=100 (10k-30k rows,
     * beyond the L3 cache) and DistMult d=16 (10k-100k rows) it gained nothing over the
     * hardware prefetcher. */
#if KGE_HAVE_AVX
    if (__builtin_cpu_supports("avx")) train_avx(&run);
    else train_baseline(&run);
#else
    train_baseline(&run);
#endif
    free(scratch);
    *bce_sum = run.bce;
    *reg_sum = run.reg;
    return KGE_OK;
}
