/* CPython binding of optim.c: the row updates of adapm.torch's optimizers. Conventions as
 * module.c: every buffer checked while holding the GIL, one call into optim.c with the GIL
 * released, nothing written when a check fails, the buffers stay the caller's.
 */
#include "binding.h"
#include "optim.h"

/* One update: checks the buffers (n from grads, n x dim floats; width from out, n x width; rows,
 * AdaGrad's, as out), then runs `update` on them with the scalars of `r` and the GIL released.
 * Returns None, or NULL with an exception set and nothing written. */
static PyObject *run_update(const char *fn, PyObject *orows, PyObject *ograds, PyObject *oout,
                            long long dim, int64_t min_width, optim_rows_t r,
                            void (*update)(const optim_rows_t *)) {
    views_t vs = {.n = 0};
    Py_buffer *rows = NULL, *grads, *out;
    if (dim < 1) {
        PyErr_Format(PyExc_ValueError, "%s: dim must be >= 1, got %lld", fn, dim);
        return NULL;
    }
    if ((orows && !(rows = take(&vs, orows, fn, "rows", F32, 0, 2))) ||
        !(grads = take(&vs, ograds, fn, "grads", F32, 0, 2)) ||
        !(out = take(&vs, oout, fn, "out", F32, 1, 2)))
        goto fail;
    const int64_t floats = count(grads);
    if (floats % dim) {
        PyErr_Format(PyExc_ValueError, "%s: grads has %lld floats, not rows of dim = %lld", fn,
                     (long long)floats, dim);
        goto fail;
    }
    const int64_t n = floats / dim, width = n ? count(out) / n : min_width;
    if (n ? count(out) % n || width < min_width : count(out) != 0) {
        PyErr_Format(PyExc_ValueError, "%s: out has %lld floats, not %lld rows of at least "
                     "%lld", fn, (long long)count(out), (long long)n, (long long)min_width);
        goto fail;
    }
    if (rows && count(rows) != count(out)) {
        PyErr_Format(PyExc_ValueError, "%s: rows has %lld floats, out %lld: they must match",
                     fn, (long long)count(rows), (long long)count(out));
        goto fail;
    }
    if (check_no_overlap(&vs, out, fn, "out") < 0) goto fail;
    r.rows = rows ? rows->buf : NULL;
    r.grads = grads->buf;
    r.out = out->buf;
    r.n = n;
    r.dim = dim;
    r.width = width;
    Py_BEGIN_ALLOW_THREADS
    update(&r);
    Py_END_ALLOW_THREADS
    release_views(&vs);
    Py_RETURN_NONE;
fail:
    release_views(&vs);
    return NULL;
}

static PyObject *py_sgd_rows(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"grads", "out", "dim", "lr", "maximize", NULL};
    PyObject *ograds, *oout;
    long long dim;
    double lr;
    int maximize = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOLd|p", kwlist, &ograds, &oout, &dim, &lr,
                                     &maximize))
        return NULL;
    const optim_rows_t r = {.lr = (float)lr, .maximize = maximize};
    return run_update("sgd_rows", NULL, ograds, oout, dim, dim, r, optim_sgd_rows);
}

static PyObject *py_adagrad_rows(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"rows", "grads", "out", "dim", "lr", "eps", "initial_accumulator",
                             "maximize", NULL};
    PyObject *orows, *ograds, *oout;
    long long dim;
    double lr, eps, initial;
    int maximize = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOLddd|p", kwlist, &orows, &ograds, &oout,
                                     &dim, &lr, &eps, &initial, &maximize))
        return NULL;
    if (dim > INT64_MAX / 2)
        return PyErr_Format(PyExc_ValueError, "adagrad_rows: dim %lld is too large", dim);
    const optim_rows_t r = {.lr = (float)lr, .eps = (float)eps,
                            .initial_accumulator = (float)initial, .maximize = maximize};
    return run_update("adagrad_rows", orows, ograds, oout, dim, 2 * dim, r, optim_adagrad_rows);
}

PyDoc_STRVAR(sgd_rows_doc,
"sgd_rows(grads, out, dim, lr, maximize=False) -> None\n"
"\n"
"SGD's update of n rows: out (n x width floats, width >= dim) gets -lr * grads (n x dim;\n"
"+lr with maximize) in its first dim columns and 0 in the rest. float32 C-contiguous buffers;\n"
"out writable and apart from grads. Nothing is written when a check fails. Blocking; the GIL\n"
"is released for the update.");

PyDoc_STRVAR(adagrad_rows_doc,
"adagrad_rows(rows, grads, out, dim, lr, eps, initial_accumulator, maximize=False) -> None\n"
"\n"
"AdaGrad's update of n rows as torch.optim.Adagrad: rows (n x width floats, width >= 2 dim)\n"
"hold each row's vector and, at [dim, 2 dim), its sums of squared gradients; with\n"
"sum = sums + initial_accumulator + grad^2, out gets -lr * grad / (sqrt(sum) + eps) in its\n"
"first dim columns, grad^2 in the next dim (the sums grow by what is pushed) and 0 in the\n"
"rest (maximize flips the gradient's sign first). Checks and GIL as sgd_rows.");

PyMethodDef optim_methods[] = {
    {"sgd_rows", (PyCFunction)(void (*)(void))py_sgd_rows, METH_VARARGS | METH_KEYWORDS,
     sgd_rows_doc},
    {"adagrad_rows", (PyCFunction)(void (*)(void))py_adagrad_rows, METH_VARARGS | METH_KEYWORDS,
     adagrad_rows_doc},
    {NULL, NULL, 0, NULL},
};
