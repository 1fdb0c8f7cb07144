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
/* served(clock, counts) -> bool */
static PyObject *IntentQueue_served(IntentQueueObject *self, PyObject *args) {
    long long clock;
    IntentCountsObject *counts;
    if (!PyArg_ParseTuple(args, "LO!", &clock, &IntentCountsType, &counts)) return NULL;
    if (!counts->ready) {
        PyErr_SetString(PyExc_ValueError, "served: counts are not initialised");
        return NULL;
    }
    return PyBool_FromLong(iq_served(&self->q, clock, &counts->c));
}

/* late(clock) -> bool */
static PyObject *IntentQueue_late(IntentQueueObject *self, PyObject *arg) {
    const long long clock = PyLong_AsLongLong(arg);
    if (clock == -1 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(iq_late(&self->q, clock));
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
    {"served", (PyCFunction)IntentQueue_served, METH_VARARGS,
     "served(clock, counts) -> bool. Every intent active at clock was acted on, and all its "
     "keys are told (in counts, an IntentCounts)."},
    {"late", (PyCFunction)IntentQueue_late, METH_O,
     "late(clock) -> bool. An intent active at clock was not acted on yet (no round has "
     "reached it since it was signalled, or since the worker's clock passed its horizon)."},
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

/* --- IntentCounts: the node's counts of acted-on intents (intents.h) --------------------- */

static void IntentCounts_dealloc(IntentCountsObject *self) {
    if (self->ready) ic_free(&self->c);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int IntentCounts_init(IntentCountsObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"num_keys", NULL};
    long long num_keys;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L", kwlist, &num_keys)) return -1;
    if (num_keys < 0) {
        PyErr_SetString(PyExc_ValueError, "IntentCounts: num_keys must be >= 0");
        return -1;
    }
    if (self->ready) ic_free(&self->c); /* a second __init__ starts empty */
    self->ready = 0;
    if (ic_init(&self->c) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    self->num_keys = num_keys;
    self->ready = 1;
    return 0;
}

static int counts_ready(IntentCountsObject *self) {
    if (self->ready) return 0;
    PyErr_SetString(PyExc_ValueError, "IntentCounts is not initialised");
    return -1;
}

/* Borrows keys (int64, in range); 0, or -1 with an exception set. */
static int counted_keys(IntentCountsObject *self, PyObject *okeys, Py_buffer *kv,
                        const char *what) {
    if (counts_ready(self) < 0 || borrow(okeys, kv, 8, 0, what) < 0) return -1;
    const int64_t bad = store_check_keys(kv->buf, kv->len / 8, self->num_keys);
    if (bad < 0) return 0;
    PyErr_Format(PyExc_IndexError, "%s: keys[%lld] = %lld is outside [0, %lld)", what,
                 (long long)bad, (long long)((int64_t *)kv->buf)[bad], (long long)self->num_keys);
    PyBuffer_Release(kv);
    return -1;
}

/* collect(queue, clock, horizon) -> (acted keys, changed) */
static PyObject *IntentCounts_collect(IntentCountsObject *self, PyObject *args) {
    IntentQueueObject *queue;
    long long clock, horizon;
    if (!PyArg_ParseTuple(args, "O!LL", &IntentQueueType, &queue, &clock, &horizon)
        || counts_ready(self) < 0)
        return NULL;
    if (queue->num_keys > self->num_keys) {
        PyErr_SetString(PyExc_ValueError, "collect: the queue's key space is larger");
        return NULL;
    }
    /* The GIL is held throughout: no worker signals between reserving and counting. */
    if (ic_reserve(&self->c, queue->q.queued_keys) < 0) return PyErr_NoMemory();
    int64_t acted = 0;
    int changed = 0;
    if (iq_collect(&queue->q, clock, horizon, &self->c, &acted, &changed) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "collect: out of memory, or an intent count went "
                                            "negative");
        return NULL;
    }
    return Py_BuildValue("LO", (long long)acted, changed ? Py_True : Py_False);
}

/* changes() -> (keys, flags) bytearrays (int64, uint8) */
static PyObject *IntentCounts_changes(IntentCountsObject *self, PyObject *unused) {
    if (counts_ready(self) < 0) return NULL;
    const int64_t n = self->c.ndirty;
    PyObject *keys = PyByteArray_FromStringAndSize(NULL, n * 8);
    PyObject *flags = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *result = NULL;
    if (keys && flags) {
        const int64_t m = intents_changes(&self->c, (int64_t *)PyByteArray_AS_STRING(keys),
                                          (uint8_t *)PyByteArray_AS_STRING(flags));
        if (PyByteArray_Resize(keys, m * 8) == 0 && PyByteArray_Resize(flags, m) == 0)
            result = PyTuple_Pack(2, keys, flags);
    }
    Py_XDECREF(keys);
    Py_XDECREF(flags);
    return result;
}

static PyObject *IntentCounts_pending(IntentCountsObject *self, PyObject *unused) {
    if (counts_ready(self) < 0) return NULL;
    return PyBool_FromLong(self->c.ndirty > 0);
}

/* report_again(keys) -> None */
static PyObject *IntentCounts_report_again(IntentCountsObject *self, PyObject *okeys) {
    Py_buffer kv;
    if (counted_keys(self, okeys, &kv, "report_again") < 0) return NULL;
    PyObject *result = NULL;
    const int64_t n = kv.len / 8;
    if (ic_reserve(&self->c, n) < 0) PyErr_NoMemory();
    else {
        ic_report_again(&self->c, kv.buf, n);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&kv);
    return result;
}

/* acknowledge(keys, flags) -> None */
static PyObject *IntentCounts_acknowledge(IntentCountsObject *self, PyObject *args) {
    PyObject *okeys, *oflags;
    if (!PyArg_ParseTuple(args, "OO", &okeys, &oflags)) return NULL;
    Py_buffer kv, fv;
    if (counted_keys(self, okeys, &kv, "acknowledge") < 0) return NULL;
    if (borrow(oflags, &fv, 1, 0, "acknowledge: flags") < 0) {
        PyBuffer_Release(&kv);
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t n = kv.len / 8;
    if (fv.len != n) PyErr_SetString(PyExc_ValueError, "acknowledge: one flag per key");
    else if (ic_reserve(&self->c, n) < 0) PyErr_NoMemory();
    else {
        ic_acknowledge(&self->c, kv.buf, fv.buf, n);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&kv);
    PyBuffer_Release(&fv);
    return result;
}

/* wants(keys) / in_flight(keys) -> bytearray, one byte per key */
static PyObject *per_key(IntentCountsObject *self, PyObject *okeys, int in_flight) {
    Py_buffer kv;
    if (counted_keys(self, okeys, &kv, in_flight ? "in_flight" : "wants") < 0) return NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    PyObject *result = PyByteArray_FromStringAndSize(NULL, n);
    if (result) {
        uint8_t *out = (uint8_t *)PyByteArray_AS_STRING(result);
        for (int64_t i = 0; i < n; i++) {
            const ic_rec_t *e = ic_find(&self->c, keys[i]);
            out[i] = e && e->count > 0 && !(in_flight && e->told);
        }
    }
    PyBuffer_Release(&kv);
    return result;
}

static PyObject *IntentCounts_wants(IntentCountsObject *self, PyObject *okeys) {
    return per_key(self, okeys, 0);
}

static PyObject *IntentCounts_in_flight(IntentCountsObject *self, PyObject *okeys) {
    return per_key(self, okeys, 1);
}

/* dense() -> (counts int32, told uint8) bytearrays over the key space (tests, inspection) */
static PyObject *IntentCounts_dense(IntentCountsObject *self, PyObject *unused) {
    if (counts_ready(self) < 0) return NULL;
    const int64_t k = self->num_keys;
    PyObject *counts = PyByteArray_FromStringAndSize(NULL, k * 4);
    PyObject *told = PyByteArray_FromStringAndSize(NULL, k);
    PyObject *result = NULL;
    if (counts && told) {
        int32_t *c = (int32_t *)PyByteArray_AS_STRING(counts);
        uint8_t *t = (uint8_t *)PyByteArray_AS_STRING(told);
        memset(c, 0, (size_t)k * 4);
        memset(t, 0, (size_t)k);
        for (int64_t slot = 0; slot <= self->c.mask; slot++) {
            const ic_rec_t *e = &self->c.slots[slot];
            if (e->key < 0 || e->key >= k) continue;
            c[e->key] = e->count;
            t[e->key] = e->told;
        }
        result = PyTuple_Pack(2, counts, told);
    }
    Py_XDECREF(counts);
    Py_XDECREF(told);
    return result;
}

/* set_counts(keys, counts) -> None: for tests, as if rounds had acted on intents whose
 * reports are not sent yet (the keys are not collected for changes(); owners are not told). */
static PyObject *IntentCounts_set_counts(IntentCountsObject *self, PyObject *args) {
    PyObject *okeys, *ocounts;
    if (!PyArg_ParseTuple(args, "OO", &okeys, &ocounts)) return NULL;
    Py_buffer kv, cv;
    if (counted_keys(self, okeys, &kv, "set_counts") < 0) return NULL;
    if (borrow(ocounts, &cv, 4, 0, "set_counts: counts") < 0) {
        PyBuffer_Release(&kv);
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t n = kv.len / 8, *keys = kv.buf;
    const int32_t *counts = cv.buf;
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (counts[i] < 0) bad = i;
    if (cv.len / 4 != n || bad >= 0)
        PyErr_SetString(PyExc_ValueError, "set_counts: one count >= 0 per key");
    else if (ic_reserve(&self->c, n) < 0) PyErr_NoMemory();
    else {
        ic_set_counts(&self->c, keys, counts, n);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&kv);
    PyBuffer_Release(&cv);
    return result;
}

/* memory() -> (records, bytes) */
static PyObject *IntentCounts_memory(IntentCountsObject *self, PyObject *unused) {
    if (counts_ready(self) < 0) return NULL;
    return Py_BuildValue("LL", (long long)self->c.live, (long long)ic_bytes(&self->c));
}

/* activity(queues) -> int: bit 0 keys wait for changes(), bit 1 a queue of queues (a tuple of
 * IntentQueue) had a batch signalled since its last collect, bit 2 every queue is empty. */
static PyObject *IntentCounts_activity(IntentCountsObject *self, PyObject *queues) {
    if (counts_ready(self) < 0) return NULL;
    if (!PyTuple_Check(queues)) {
        PyErr_SetString(PyExc_TypeError, "activity: queues must be a tuple of IntentQueue");
        return NULL;
    }
    long bits = self->c.ndirty > 0 ? 1 : 0, empty = 4;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(queues); i++) {
        PyObject *q = PyTuple_GET_ITEM(queues, i);
        if (!PyObject_TypeCheck(q, &IntentQueueType)) {
            PyErr_SetString(PyExc_TypeError, "activity: queues must be a tuple of IntentQueue");
            return NULL;
        }
        const intent_queue_t *iq = &((IntentQueueObject *)q)->q;
        if (iq->signalled > 0) bits |= 2;
        if (iq->pending.len || iq->acted.len) empty = 0;
    }
    return PyLong_FromLong(bits | empty);
}

static PyMethodDef IntentCounts_methods[] = {
    {"collect", (PyCFunction)IntentCounts_collect, METH_VARARGS,
     "collect(queue, clock, horizon) -> (acted keys, changed). A round at the worker's clock "
     "(queue: its IntentQueue): acts on batches with start < horizon and expires acted ones "
     "with end <= clock, counting their keys in and out; keys whose count crossed zero are "
     "collected for changes()."},
    {"activity", (PyCFunction)IntentCounts_activity, METH_O,
     "activity(queues) -> int. What a round would find, in one call: bit 0 keys wait for "
     "changes() (pending), bit 1 a queue of queues (a tuple of the node's IntentQueues) had a "
     "batch signalled since its last collect (fresh), bit 2 every queue is empty."},
    {"changes", (PyCFunction)IntentCounts_changes, METH_NOARGS,
     "changes() -> (keys, flags). The collected keys whose state (count > 0) differs from "
     "what owners were told, each once, in the order they were collected (int64, uint8 "
     "bytearrays); clears the collection."},
    {"pending", (PyCFunction)IntentCounts_pending, METH_NOARGS,
     "pending() -> bool. Keys are collected for changes()."},
    {"report_again", (PyCFunction)IntentCounts_report_again, METH_O,
     "report_again(keys) -> None. Keys changes() looks at again."},
    {"acknowledge", (PyCFunction)IntentCounts_acknowledge, METH_VARARGS,
     "acknowledge(keys, flags) -> None. Owners were told flags (uint8 per key)."},
    {"wants", (PyCFunction)IntentCounts_wants, METH_O,
     "wants(keys) -> bytearray. Per key: 1 if this node has acted-on intent for it."},
    {"in_flight", (PyCFunction)IntentCounts_in_flight, METH_O,
     "in_flight(keys) -> bytearray. Per key: 1 if intent was acted on and the owner has not "
     "acknowledged it yet."},
    {"dense", (PyCFunction)IntentCounts_dense, METH_NOARGS,
     "dense() -> (counts, told). Over the key space (int32, uint8 bytearrays): tests."},
    {"set_counts", (PyCFunction)IntentCounts_set_counts, METH_VARARGS,
     "set_counts(keys, counts) -> None. Tests: sets int32 counts without collecting the keys "
     "(owners are not told)."},
    {"memory", (PyCFunction)IntentCounts_memory, METH_NOARGS,
     "memory() -> (records, bytes). Keys with a record, and the bytes held."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject IntentCountsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adapm._native.IntentCounts",
    .tp_basicsize = sizeof(IntentCountsObject),
    .tp_dealloc = (destructor)IntentCounts_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "IntentCounts(num_keys): a node's counts of acted-on intents per key and what "
              "owners were told, kept only for keys with intent (native/intents.h). Every "
              "method keeps the GIL, and the Directory reads and writes the counts only with "
              "it: any thread may call.",
    .tp_methods = IntentCounts_methods,
    .tp_init = (initproc)IntentCounts_init,
    .tp_new = PyType_GenericNew,
};

int register_intent_queue_type(PyObject *module) {
    if (add_type(module, &IntentQueueType, "IntentQueue") < 0) return -1;
    return add_type(module, &IntentCountsType, "IntentCounts");
}
