/* Row optimizers of adapm.torch: see optim.h. */
#include "optim.h"

#include <math.h>
#include <string.h>

void optim_sgd_rows(const optim_rows_t *r) {
    const int64_t dim = r->dim, width = r->width;
    const float step = r->maximize ? r->lr : -r->lr;
    for (int64_t i = 0; i < r->n; i++) {
        const float *g = r->grads + i * dim;
        float *o = r->out + i * width;
        for (int64_t j = 0; j < dim; j++) o[j] = step * g[j];
        memset(o + dim, 0, (size_t)(width - dim) * sizeof(float));
    }
}

void optim_adagrad_rows(const optim_rows_t *r) {
    const int64_t dim = r->dim, width = r->width;
    const float step = -r->lr, sign = r->maximize ? -1.0f : 1.0f;
    for (int64_t i = 0; i < r->n; i++) {
        const float *g = r->grads + i * dim, *sums = r->rows + i * width + dim;
        float *o = r->out + i * width;
        for (int64_t j = 0; j < dim; j++) {
            const float gj = sign * g[j], squared = gj * gj;
            const float sum = sums[j] + r->initial_accumulator + squared;
            o[j] = step * (gj / (sqrtf(sum) + r->eps));
            o[dim + j] = squared;
        }
        memset(o + 2 * dim, 0, (size_t)(width - 2 * dim) * sizeof(float));
    }
}
