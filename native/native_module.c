/* Module adapm._native: its free functions (a batch's range check, the owner's decision, alias
 * tables, a batch's distinct keys) and its init, which adds what the other binding files
 * define: Store (store_module.c), Directory (directory_module.c), IntentQueue and IntentCounts
 * (intent_queue_module.c), the wire codec's functions (wire_module.c), ZmqIO, Frame and
 * PullCall (zmq_io.c, zmq_calls.c), SERVE_WIRE_COUNTERS (serve_wire.c), and the store's
 * constants.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <string.h>

#include "module.h"
#include "policy.h"
#include "sampling.h"
#include "seqlock.h"
#include "serve_wire.h"
#include "store.h"
#include "unique.h"

/* check_keys(keys, num_keys) -> index of the first key outside [0, num_keys), or -1 */
static PyObject *check_keys(PyObject *module, PyObject *args) {
    PyObject *okeys;
    long long num_keys;
    if (!PyArg_ParseTuple(args, "OL", &okeys, &num_keys)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(okeys, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    int64_t bad;
    if (view.len / 8 < CHECK_RELEASES_GIL_FROM) {
        bad = store_check_keys(view.buf, view.len / 8, num_keys);
    } else {
        Py_BEGIN_ALLOW_THREADS
        bad = store_check_keys(view.buf, view.len / 8, num_keys);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(bad);
}


/* policy_decide(variant, rank, node, world_size, intent, replicas, keys, has_intent,
 *               relocate_to, setup) -> replicas dropped (see policy.h) */
static PyObject *policy_decide_py(PyObject *module, PyObject *args) {
    int variant;
    long long rank, node, world_size;
    PyObject *objs[6];
    if (!PyArg_ParseTuple(args, "iLLLOOOOOO", &variant, &rank, &node, &world_size, &objs[0],
                          &objs[1], &objs[2], &objs[3], &objs[4], &objs[5]))
        return NULL;
    if (variant < POLICY_ADAPTIVE || variant > POLICY_RELOCATION_ONLY || world_size < 1
        || rank < 0 || rank >= world_size || node < 0 || node >= world_size) {
        PyErr_SetString(PyExc_ValueError, "policy_decide: bad variant, rank, node or world size");
        return NULL;
    }
    const int64_t words = (world_size + 63) / 64;
    Py_buffer v[6];
    const Py_ssize_t sizes[6] = {8, 8, 8, 1, 8, 8};
    const int writable[6] = {1, 1, 0, 0, 1, 1};
    int got_views = 0;
    PyObject *result = NULL;
    for (; got_views < 6; got_views++)
        if (borrow(objs[got_views], &v[got_views], sizes[got_views], writable[got_views],
                   "policy_decide") < 0)
            goto done;
    const int64_t num_keys = v[0].len / 8 / words, n = v[2].len / 8;
    if (v[0].len != num_keys * words * 8 || v[1].len != v[0].len || v[3].len != n
        || v[4].len / 8 != n || v[5].len / 8 != n * words) {
        PyErr_SetString(PyExc_ValueError, "policy_decide: intent and replicas must be "
                                          "(num_keys, words); has_intent and relocate_to one "
                                          "per key; setup (len(keys), words)");
        goto done;
    }
    const int64_t bad = store_check_keys(v[2].buf, n, num_keys);
    if (bad >= 0) {
        PyErr_Format(PyExc_IndexError, "policy_decide: keys[%lld] = %lld is outside [0, %lld)",
                     (long long)bad, (long long)((int64_t *)v[2].buf)[bad], (long long)num_keys);
        goto done;
    }
    int64_t dropped;
    NOGIL_BEGIN(n * words)
    dropped = policy_decide(variant, rank, node, words, v[0].buf, v[1].buf, v[2].buf, n,
                            v[3].buf, v[4].buf, v[5].buf);
    NOGIL_END
    result = PyLong_FromLongLong(dropped);
done:
    for (int i = 0; i < got_views; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* alias_build(weights, prob, alias): float64 weights in, float64 prob and int64 alias out. */
static PyObject *alias_build_py(PyObject *module, PyObject *args) {
    PyObject *ow, *oprob, *oalias;
    if (!PyArg_ParseTuple(args, "OOO", &ow, &oprob, &oalias)) return NULL;
    Py_buffer v[3];
    if (borrow3((PyObject *[3]){ow, oprob, oalias}, v, 6,
                (const char *[3]){"alias_build weights", "alias_build prob",
                                  "alias_build alias"}) < 0)
        return NULL;
    Py_buffer w = v[0], prob = v[1], alias = v[2];
    PyObject *result = NULL;
    const int64_t m = w.len / 8;
    int64_t *scratch = NULL;
    if (prob.len != w.len || alias.len != w.len || m == 0) {
        PyErr_SetString(PyExc_ValueError, "alias_build: weights, prob and alias need one equal, "
                                          "non-zero length");
    } else if (!(scratch = PyMem_RawMalloc((size_t)m * 8))) {
        PyErr_NoMemory();
    } else {
        int64_t got;
        Py_BEGIN_ALLOW_THREADS
        got = alias_build(w.buf, m, prob.buf, alias.buf, scratch);
        Py_END_ALLOW_THREADS
        if (got == -1 - m) {
            PyErr_SetString(PyExc_ValueError, "sampling weights: the sum must be positive and finite");
        } else if (got < 0) {
            /* PyErr_Format has no %g: the number through Python's own repr of a float */
            char *text = PyOS_double_to_string(((double *)w.buf)[-1 - got], 'r', 0, 0, NULL);
            PyErr_Format(PyExc_ValueError, "sampling weights: entry %lld is %s; weights must be "
                         "finite and >= 0", (long long)(-1 - got), text ? text : "not a number");
            PyMem_Free(text);
        } else {
            result = Py_NewRef(Py_None);
        }
    }
    PyMem_RawFree(scratch);
    PyBuffer_Release(&w);
    PyBuffer_Release(&prob);
    PyBuffer_Release(&alias);
    return result;
}

/* unique_inverse(keys, unique, inverse) -> count (see unique.h) */
static PyObject *unique_inverse_py(PyObject *module, PyObject *args) {
    PyObject *objs[3];
    if (!PyArg_ParseTuple(args, "OOO", &objs[0], &objs[1], &objs[2])) return NULL;
    static const char *names[3] = {"keys", "unique", "inverse"};
    Py_buffer views[3];
    int held = 0;
    int64_t count = 0;
    for (; held < 3; held++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (held ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[held], &views[held], flags) < 0) goto done;
        const char *f = views[held].format;
        if (views[held].ndim != 1 || views[held].itemsize != 8 || !f
            || (strcmp(f, "l") && strcmp(f, "q"))) {
            PyErr_Format(PyExc_TypeError, "unique_inverse: %s must be a 1-d C-contiguous int64 "
                         "buffer%s", names[held], held ? " (writable)" : "");
            held++;
            goto done;
        }
    }
    const Py_ssize_t n = views[0].len / 8;
    if (views[1].len / 8 < n || views[2].len / 8 < n) {
        PyErr_SetString(PyExc_ValueError, "unique_inverse: unique and inverse need len(keys) entries");
        goto done;
    }
    if (n >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "unique_inverse: at most 2**31 - 1 keys per call");
        goto done;
    }
    /* A batch's keys (a few hundred: ~5 us) keep the GIL: letting it go and taking it back
     * from the engine thread cost a KGE worker on 2 nodes ~15 us a call. */
    NOGIL_BEGIN(n)
    count = unique_inverse(views[0].buf, n, views[1].buf, views[2].buf);
    NOGIL_END
    if (count < 0) PyErr_NoMemory();
done:
    for (int i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    return PyErr_Occurred() ? NULL : PyLong_FromLongLong(count);
}

np_bitgen_t *np_bitgen_of(PyObject *obj, const char *what) {
    PyObject *capsule = PyObject_GetAttrString(obj, "capsule");
    np_bitgen_t *g = NULL;
    if (capsule) {
        if (PyCapsule_IsValid(capsule, "BitGenerator"))
            g = PyCapsule_GetPointer(capsule, "BitGenerator");
        Py_DECREF(capsule); /* the bit generator, which the caller holds, keeps its state */
    } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
    } else {
        return NULL;
    }
    if (!g)
        PyErr_Format(PyExc_TypeError, "%s: bit_generator must be a numpy BitGenerator (its "
                     "capsule 'BitGenerator')", what);
    return g;
}

/* alias_draw(bit_generator, prob, alias, low, out, sizes=None) -> None: see the method table. */
static PyObject *alias_draw_py(PyObject *module, PyObject *args) {
    PyObject *obitgen, *oprob, *oalias, *oout, *osizes = Py_None;
    long long low;
    if (!PyArg_ParseTuple(args, "OOOLO|O", &obitgen, &oprob, &oalias, &low, &oout, &osizes))
        return NULL;
    np_bitgen_t *g = np_bitgen_of(obitgen, "alias_draw");
    if (!g) return NULL;
    Py_buffer v[4];
    int got = 0;
    PyObject *result = NULL;
    int64_t one, *sizes = &one, nsizes = 1;
    if (borrow(oprob, &v[0], 8, 0, "alias_draw prob") < 0) goto done;
    got++;
    if (borrow(oalias, &v[1], 8, 0, "alias_draw alias") < 0) goto done;
    got++;
    if (borrow(oout, &v[2], 8, 1, "alias_draw out") < 0) goto done;
    got++;
    const int64_t m = v[0].len / 8, nout = v[2].len / 8;
    if (osizes == Py_None) {
        one = nout;
    } else {
        if (borrow(osizes, &v[3], 8, 0, "alias_draw sizes") < 0) goto done;
        got++;
        sizes = v[3].buf;
        nsizes = v[3].len / 8;
    }
    int64_t total = 0;
    for (int64_t i = 0; i < nsizes; i++) {
        if (sizes[i] < 0 || sizes[i] > nout - total) {
            PyErr_SetString(PyExc_ValueError, "alias_draw: sizes must be >= 0 and add up to at "
                                              "most len(out)");
            goto done;
        }
        total += sizes[i];
    }
    if (v[1].len != v[0].len || m == 0 || (uint64_t)m - 1 >= 0xFFFFFFFFULL) {
        PyErr_SetString(PyExc_ValueError, "alias_draw: prob (float64) and alias (int64) need "
                                          "one equal length m, 0 < m < 2**32");
        goto done;
    }
    NOGIL_BEGIN(2 * total)
    alias_draw(g, v[0].buf, v[1].buf, m, low, sizes, nsizes, v[2].buf);
    NOGIL_END
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* name_thread(name) -> None: see the method table. */
static PyObject *name_thread_py(PyObject *module, PyObject *arg) {
    Py_ssize_t len;
    const char *name = PyUnicode_AsUTF8AndSize(arg, &len);
    if (!name) return NULL;
#ifdef __linux__
    char shown[16]; /* Linux keeps 15 bytes and the terminator */
    const size_t n = len < 15 ? (size_t)len : 15;
    memcpy(shown, name, n);
    shown[n] = 0;
    pthread_setname_np(pthread_self(), shown); /* only a label: a failure changes nothing */
#endif
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"unique_inverse", unique_inverse_py, METH_VARARGS,
     "unique_inverse(keys, unique, inverse) -> count. The distinct int64 keys in order of first "
     "appearance into unique[:count], each position's index among them into inverse; O(n), the "
     "GIL released from 32,768 keys on."},
    {"check_keys", check_keys, METH_VARARGS,
     "check_keys(keys, num_keys) -> int. Index of the first key outside [0, num_keys), or -1."},
    {"policy_decide", policy_decide_py, METH_VARARGS,
     "policy_decide(variant, rank, node, world_size, intent, replicas, keys, has_intent, "
     "relocate_to, setup) -> int. One batch of intent reports of `node` for owned keys: updates the S and R "
     "masks, writes each key's relocation target (-1: none) and new replica mask; returns the "
     "number of replicas dropped from R."},
    {"alias_build", alias_build_py, METH_VARARGS,
     "alias_build(weights, prob, alias) -> None. Vose's alias table of float64 weights into "
     "float64 prob and int64 alias (same length), GIL released; ValueError on a bad weight."},
    {"alias_draw", alias_draw_py, METH_VARARGS,
     "alias_draw(bit_generator, prob, alias, low, out, sizes=None) -> None. Draws keys from "
     "alias_build's table into out (int64): as many as out holds, or one sample per entry of "
     "sizes (int64, back to back), each what numpy's Generator over bit_generator would give "
     "for `i = integers(0, m, n); u = random(n); where(u >= prob[i], alias[i], i) + low`, bit "
     "for bit, the generator left alike (sampling.h). The caller holds bit_generator.lock. "
     "Long draws release the GIL."},
    {"name_thread", name_thread_py, METH_O,
     "name_thread(name) -> None. Names the calling OS thread (what top -H, ps -L, perf and gdb "
     "show; Python's threading does not before 3.14): its first 15 bytes on Linux, nothing "
     "elsewhere."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_native",
    "Native store primitives and training kernels of adapm (see native/ in the source tree).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    if (add_type(m, &StoreType, "Store") < 0 || register_directory_type(m) < 0
        || register_intent_queue_type(m) < 0 || register_wire_functions(m) < 0
        || register_zmq_io_type(m) < 0 || register_serve_wire(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "KEY_NONE", KEY_NONE);
    PyModule_AddIntConstant(m, "KEY_OWNER", KEY_OWNER);
    PyModule_AddIntConstant(m, "KEY_REPLICA", KEY_REPLICA);
    PyModule_AddIntConstant(m, "SEQ_STRIDE", SEQ_STRIDE);
    return m;
}
