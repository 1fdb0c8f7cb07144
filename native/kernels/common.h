/* Helpers shared by the sources of adapm._kernels (kge.c, table.c). Pure C: no Python here.
 *
 * The build has no -ffast-math (IEEE semantics are kept), so gcc will not vectorise a float
 * reduction by reassociating it. The helpers below spell out independent partial sums instead,
 * which keeps the result deterministic for a given length and still lets gcc use SIMD.
 */
#ifndef ADAPM_KERNELS_COMMON_H
#define ADAPM_KERNELS_COMMON_H

#include <math.h>
#include <stdint.h>

/* Sum of a[i] * b[i], in double. The product of two floats is exact in double, so the only
 * rounding is in the four partial sums. */
static inline double dot_f64(const float *restrict a, const float *restrict b, int64_t n) {
    double p0 = 0.0, p1 = 0.0, p2 = 0.0, p3 = 0.0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        p0 += (double)a[i] * (double)b[i];
        p1 += (double)a[i + 1] * (double)b[i + 1];
        p2 += (double)a[i + 2] * (double)b[i + 2];
        p3 += (double)a[i + 3] * (double)b[i + 3];
    }
    for (; i < n; i++) p0 += (double)a[i] * (double)b[i];
    return (p0 + p1) + (p2 + p3);
}

/* log(1 + exp(x)) without overflow for large |x| (and without losing small results). */
static inline double softplus(double x) {
    return (x > 0.0 ? x : 0.0) + log1p(exp(-fabs(x)));
}

/* 1 / (1 + exp(-x)), evaluated so that exp never overflows. */
static inline double sigmoid(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

/* Whether [off, off + len) lies inside [0, total); written so that nothing can overflow. */
static inline int range_inside(int64_t off, int64_t len, int64_t total) {
    return off >= 0 && len >= 0 && len <= total && off <= total - len;
}

#endif
