/* CPython binding of one worker's intent queue (intent_queue.h): type adapm._native.IntentQueue.
 *
 * Every method keeps the GIL for its whole call: the worker thread signals while the engine
 * thread collects, and holding the GIL is what makes each call atomic to the other. The work of
 * a call is bounded by the keys it acts on or expires (a few thousand per round in
 * bench/adaptive.py, ~10 us).
 */
#include "intent_queue.h"
#include "module.h"

typedef struct {
    PyObject_HEAD
    intent_queue_t q;
    int64_t num_keys;
} IntentQueueObject;

static void IntentQueue_dealloc(IntentQueueObject *self) {
    iq_free(&self->q);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int IntentQueue_init(IntentQueueObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"num_keys", NULL};
    long long num_keys;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L", kwlist, &num_keys)) return -1;
    if (num_keys < 0) {
        PyErr_SetString(PyExc_ValueError, "IntentQueue: num_keys must be >= 0");
        return -1;
    }
    iq_free(&self->q); /* a second __init__ starts empty */
    self->num_keys = num_keys;
    return 0;
}

/* signal(keys, start, end) -> None */
static PyObject *IntentQueue_signal(IntentQueueObject *self, PyObject *args) {
    PyObject *okeys;
    long long start, end;
    if (!PyArg_ParseTuple(args, "OLL", &okeys, &start, &end)) return NULL;
    if (end <= start) {
        PyErr_SetString(PyExc_ValueError, "signal: end must be > start");
        return NULL;
    }
    Py_buffer kv;
    if (borrow(okeys, &kv, 8, 0, "signal: keys") < 0) return NULL;
    PyObject *result = NULL;
    const int64_t n = kv.len / 8;
    const int64_t bad = store_check_keys(kv.buf, n, self->num_keys);
    if (bad >= 0)
        PyErr_Format(PyExc_IndexError, "signal: keys[%lld] = %lld is outside [0, %lld)",
                     (long long)bad, (long long)((int64_t *)kv.buf)[bad],
                     (long long)self->num_keys);
    else if (iq_signal(&self->q, kv.buf, n, start, end) < 0)
        PyErr_NoMemory();
    else
        result = Py_NewRef(Py_None);
    PyBuffer_Release(&kv);
    return result;
}

/* collect(clock, horizon, counts, mark, dirty, ndirty) -> (ndirty, acted keys, changed) */
static PyObject *IntentQueue_collect(IntentQueueObject *self, PyObject *args) {
    long long clock, horizon, ndirty;
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "LLOOOL", &clock, &horizon, &o[0], &o[1], &o[2], &ndirty))
        return NULL;
    Py_buffer v[3];
    const Py_ssize_t sizes[3] = {4, 1, 8};
    int got = 0;
    PyObject *result = NULL;
    for (; got < 3; got++)
        if (borrow(o[got], &v[got], sizes[got], 1, "collect") < 0) goto done;
    if (v[0].len / 4 != self->num_keys || v[1].len != self->num_keys || ndirty < 0
        || v[2].len / 8 < ndirty) {
        PyErr_SetString(PyExc_ValueError, "collect: counts and mark need one entry per key, "
                                          "dirty at least ndirty");
        goto done;
    }
    if (v[2].len / 8 < ndirty + self->q.queued_keys) {
        /* A worker signalled since the caller sized dirty: nothing done, grow and call again. */
        result = Py_NewRef(Py_None);
        goto done;
    }
    int64_t nd = ndirty, acted = 0;
    int changed = 0;
    if (iq_collect(&self->q, clock, horizon, v[0].buf, self->num_keys, v[1].buf, v[2].buf,
                   &nd, &acted, &changed) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "collect: out of memory, or an intent count went "
                                            "negative (the counts were changed elsewhere)");
        goto done;
    }
    result = Py_BuildValue("LLO", (long long)nd, (long long)acted, changed ? Py_True : Py_False);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* served(clock, told) -> bool */
static PyObject *IntentQueue_served(IntentQueueObject *self, PyObject *args) {
    long long clock;
    PyObject *otold;
    if (!PyArg_ParseTuple(args, "LO", &clock, &otold)) return NULL;
    Py_buffer tv;
    if (borrow(otold, &tv, 1, 0, "served: told") < 0) return NULL;
    PyObject *result = NULL;
    if (tv.len != self->num_keys)
        PyErr_SetString(PyExc_ValueError, "served: told needs one entry per key");
    else
        result = PyBool_FromLong(iq_served(&self->q, clock, tv.buf));
    PyBuffer_Release(&tv);
    return result;
}

static PyObject *IntentQueue_empty(IntentQueueObject *self, PyObject *unused) {
    return PyBool_FromLong(!self->q.pending.len && !self->q.acted.len);
}

static PyObject *IntentQueue_fresh(IntentQueueObject *self, PyObject *unused) {
    return PyBool_FromLong(self->q.signalled > 0);
}

static PyObject *IntentQueue_queued_keys(IntentQueueObject *self, PyObject *unused) {
    return PyLong_FromLongLong(self->q.queued_keys);
}

static PyMethodDef IntentQueue_methods[] = {
    {"signal", (PyCFunction)IntentQueue_signal, METH_VARARGS,
     "signal(keys, start, end) -> None. Copies keys (int64) as a batch for clocks "
     "[start, end). IndexError for a key outside [0, num_keys) (nothing queued)."},
    {"collect", (PyCFunction)IntentQueue_collect, METH_VARARGS,
     "collect(clock, horizon, counts, mark, dirty, ndirty) -> (ndirty, acted keys, changed) "
     "or None. A round at the worker's clock: acts on batches with start < horizon and "
     "expires acted ones with end <= clock, counting their keys in int32 counts (keys whose "
     "count crossed zero are marked and appended to dirty). None, with nothing done, when "
     "dirty has no room for ndirty + queued_keys() keys (a worker may signal in between: "
     "grow it and call again)."},
    {"served", (PyCFunction)IntentQueue_served, METH_VARARGS,
     "served(clock, told) -> bool. Every intent active at clock was acted on, and all its "
     "keys are told (told: one byte per key)."},
    {"empty", (PyCFunction)IntentQueue_empty, METH_NOARGS,
     "empty() -> bool. No batch pending or acted on."},
    {"fresh", (PyCFunction)IntentQueue_fresh, METH_NOARGS,
     "fresh() -> bool. A batch was signalled since the last collect."},
    {"queued_keys", (PyCFunction)IntentQueue_queued_keys, METH_NOARGS,
     "queued_keys() -> int. Keys of all batches held (pending and acted on)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject IntentQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adapm._native.IntentQueue",
    .tp_basicsize = sizeof(IntentQueueObject),
    .tp_dealloc = (destructor)IntentQueue_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "IntentQueue(num_keys): one worker's intent batches (see native/intent_queue.h).",
    .tp_methods = IntentQueue_methods,
    .tp_init = (initproc)IntentQueue_init,
    .tp_new = PyType_GenericNew,
};

int register_intent_queue_type(PyObject *module) {
    return add_type(module, &IntentQueueType, "IntentQueue");
}
