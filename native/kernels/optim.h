/* The row optimizers of adapm.torch (optim.SGD, optim.Adagrad): a step's update of one table's
 * rows, computed in one pass over caller-owned memory (no allocation, no Python), so that the
 * binding makes one call with the GIL released per table and step instead of a dozen numpy
 * operations that each take the GIL back.
 */
#ifndef ADAPM_KERNELS_OPTIM_H
#define ADAPM_KERNELS_OPTIM_H

#include <stdint.h>

typedef struct {
    const float *rows;  /* n x width, the rows as pulled: AdaGrad reads its sums at [dim, 2 dim) */
    const float *grads; /* n x dim, the rows' gradients */
    float *out;         /* n x width: the update to push; the columns not updated are zeroed */
    int64_t n, dim, width;
    float lr;           /* the step's rate (AdaGrad: lr / (1 + (step - 1) * lr_decay)) */
    float eps, initial_accumulator;
    int maximize;       /* ascend instead of descend */
} optim_rows_t;

/* out[:, :dim] = -lr * grad (+lr with maximize), the rest 0. */
void optim_sgd_rows(const optim_rows_t *r);

/* As torch.optim.Adagrad per row: sum = rows[:, dim:2 dim] + initial_accumulator + grad^2;
 * out[:, :dim] = -lr * grad / (sqrt(sum) + eps), out[:, dim:2 dim] = grad^2 (the sums grow by
 * what is pushed), the rest 0. With maximize the gradient's sign is flipped first. */
void optim_adagrad_rows(const optim_rows_t *r);

#endif
