/* A worker's pull or push of keys not held here, without Python (zmq_io.h): the requester's
 * side of a remote pull or push, as the owner's side is in zmq_serve.c.
 *
 * Through the engine loop a remote pull cost ~120-140 us of the requester's engine thread
 * (bench/engine.py): the worker's submission woke a loop pass, the state machine routed and
 * posted it, and the answer took another pass (decode, checks, dispatch, finish). Here the
 * worker queues a PullCall and waits on it with the GIL released; the engine thread, inside
 * its receive call, routes it (Directory.route_own's choice, directory_route_pull), serves the
 * keys that arrived meanwhile, sends one PULL per owner, takes the answers in (checked as
 * validate.py checks them), learns the answering ranks and wakes the worker.
 *
 * A call goes back to the worker unserved (declined, nothing sent) when routing needs the state
 * machine: a key whose intent this node reported and whose owner has not answered yet, one on
 * its way here, or while sinks listen. The worker then submits it as before. Answers that reach
 * Python all the same (in one wire message with others, behind a message of the same peer that
 * went to Python, errors, forward notices) are handed back here by NodeState
 * (ZmqIO.native_answer). Request ids of these calls start at PULL_BASE, far above the engine's.
 *
 * Threads: ZmqIO.pull runs on the worker's thread with the GIL (a mutex guards the queue);
 * everything else on the engine thread. A call's state changes under its own mutex and wakes
 * its waiter. The engine holds a reference to every call it knows; it drops the references of
 * finished calls with the GIL (pulls_settle).
 *
 * Pushes (ZmqIO.push) go the same way, with two differences. The caller does not wait for a
 * push, so its keys, positions and rows are copied into the call, and a push is never declined:
 * one that routing cannot take (as above) is handed to the engine loop (ZmqIO.handoffs), which
 * submits it to the state machine and completes the call when the state machine finishes it
 * (ZmqIO.complete); until then workers' pulls take the loop's path too, since one served here
 * could miss that push. Keys that arrived meanwhile are added to here. The owners' ACKs come back
 * many to a wire message (serve_wire.c answers a bundle of requests with one), and are taken in
 * here bundle and all. Through the engine loop a push and its ACK cost the requester's engine
 * thread ~23 us, bundled (bench/engine.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "zmq_io.h"

#define PULL_BASE ((int64_t)1 << 62)

enum { PULL_QUEUED = 0, PULL_OPEN = 1, PULL_DONE = 2, PULL_DECLINED = 3, PULL_FAILED = 4 };

typedef struct PullCallObject {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready;     /* mutex and condition made */
    int state;     /* PULL_*; read and written under mu */
    int abandoned; /* the worker gave up (timeout): the engine forgets the call */
    int forwarded; /* an owner passed entries on (for the worker's error text) */
    int64_t req;
    int kind;             /* WIRE_PULL or WIRE_PUSH */
    int handed;           /* a push handed to the engine loop, which completes it (1; 2 once
                           * ZmqIO.complete ran) */
    Py_buffer kv, pv, ov; /* a pull's keys, positions (ascending), out rows: held while the
                           * call lives */
    int held;             /* how many of kv, pv, ov are held */
    const int64_t *keys, *pos; /* the call's keys and positions (a pull's views, a push's copy) */
    float *rows;          /* a pull's out; a push's rows, one per key (the copy) */
    void *copy;           /* a push's copy of keys, positions and rows (malloc) */
    int64_t worker, clock; /* a push's worker index and clock, for the engine loop */
    PyObject *exc;        /* a handed push's failure: the engine loop's exception, or NULL */
    int64_t n, row;       /* keys; floats per row of out */
    int64_t remaining, waited;
    int64_t world;
    int64_t *at;       /* per rank: entries unanswered there */
    uint8_t *answered; /* per key */
    char *error;       /* the failure's text (PULL_FAILED) */
} PullCallObject;

static PyTypeObject PullCallType;

/* --- the call ---------------------------------------------------------------------------- */

static void finish(PullCallObject *c, int state, const char *error) {
    pthread_mutex_lock(&c->mu);
    if (c->state == PULL_QUEUED || c->state == PULL_OPEN) {
        if (error && !c->error) c->error = strdup(error);
        c->state = state;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

/* The engine has routed the call (sent it, or handed it to the engine loop): a waiter of
 * PullCall.wait_routed wakes. */
static void opened(PullCallObject *c) {
    pthread_mutex_lock(&c->mu);
    if (c->state == PULL_QUEUED) {
        c->state = PULL_OPEN;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static void PullCall_dealloc(PullCallObject *self) {
    if (self->held > 0) PyBuffer_Release(&self->kv);
    if (self->held > 1) PyBuffer_Release(&self->pv);
    if (self->held > 2) PyBuffer_Release(&self->ov);
    if (self->ready) {
        pthread_mutex_destroy(&self->mu);
        pthread_cond_destroy(&self->cv);
    }
    free(self->at);
    free(self->answered);
    free(self->error);
    free(self->copy);
    Py_XDECREF(self->exc);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Blocks (GIL released) up to timeout seconds while the call's state is at most below; the
 * state then. */
static PyObject *wait_beyond(PullCallObject *self, PyObject *arg, int below) {
    const double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred()) return NULL;
    int state;
    Py_BEGIN_ALLOW_THREADS
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    const double secs = timeout > 0 ? timeout : 0;
    until.tv_sec += (time_t)secs;
    until.tv_nsec += (long)((secs - (double)(time_t)secs) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&self->mu);
    while (self->state <= below
           && pthread_cond_timedwait(&self->cv, &self->mu, &until) != ETIMEDOUT) {
    }
    state = self->state;
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(state);
}

/* wait(timeout_s) -> state: see the method table. */
static PyObject *PullCall_wait(PullCallObject *self, PyObject *arg) {
    return wait_beyond(self, arg, PULL_OPEN);
}

/* wait_routed(timeout_s) -> state: see the method table. */
static PyObject *PullCall_wait_routed(PullCallObject *self, PyObject *arg) {
    return wait_beyond(self, arg, PULL_QUEUED);
}



/* Under the call's mutex, which the engine holds while it writes rows into out: once abandon
 * returns, out is the caller's again (the engine writes rows only after checking abandoned). */
static PyObject *PullCall_abandon(PullCallObject *self, PyObject *unused) {
    pthread_mutex_lock(&self->mu);
    __atomic_store_n(&self->abandoned, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* waiting_on() -> sorted ranks that hold unanswered entries (a snapshot). */
static PyObject *PullCall_waiting_on(PullCallObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    for (int64_t r = 0; out && r < self->world; r++) {
        if (__atomic_load_n(&self->at[r], __ATOMIC_RELAXED) <= 0) continue;
        PyObject *v = PyLong_FromLongLong(r);
        if (!v || PyList_Append(out, v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    return out;
}

static PyObject *PullCall_get_waited(PullCallObject *self, void *unused) {
    return PyLong_FromLongLong(self->waited);
}

static PyObject *PullCall_get_forwarded(PullCallObject *self, void *unused) {
    return PyBool_FromLong(self->forwarded);
}

static PyObject *PullCall_get_error(PullCallObject *self, void *unused) {
    if (!self->error) Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(self->error, (Py_ssize_t)strlen(self->error), "replace");
}

static PyObject *PullCall_get_exception(PullCallObject *self, void *unused) {
    return Py_NewRef(self->exc ? self->exc : Py_None);
}

static PyObject *PullCall_get_done(PullCallObject *self, void *unused) {
    return PyBool_FromLong(__atomic_load_n(&self->state, __ATOMIC_ACQUIRE) >= PULL_DONE);
}

static PyMethodDef PullCall_methods[] = {
    {"wait", (PyCFunction)PullCall_wait, METH_O,
     "wait(timeout_s) -> state. Blocks (GIL released) up to timeout_s until the call ends: 2 "
     "done (out holds every row), 3 declined (nothing was sent: take the engine's path), 4 "
     "failed (error says why, or the engine stopped; a handed push: exception); 0 (queued) "
     "or 1 (sent) when the time is up first."},
    {"wait_routed", (PyCFunction)PullCall_wait_routed, METH_O,
     "wait_routed(timeout_s) -> state. Blocks (GIL released) up to timeout_s until the engine "
     "has routed the call: sent it, answered it here, declined it, or handed a push to the "
     "engine loop (which takes it before the requests submitted after this returns)."},
    {"abandon", (PyCFunction)PullCall_abandon, METH_NOARGS,
     "abandon() -> None. The worker gives up (timeout); later answers are late ones."},
    {"waiting_on", (PyCFunction)PullCall_waiting_on, METH_NOARGS,
     "waiting_on() -> list of the ranks holding unanswered entries."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PullCall_getset[] = {
    {"waited", (getter)PullCall_get_waited, NULL, "keys served here (they had arrived)", NULL},
    {"forwarded", (getter)PullCall_get_forwarded, NULL, "an owner passed entries on", NULL},
    {"error", (getter)PullCall_get_error, NULL, "why it failed, or None", NULL},
    {"exception", (getter)PullCall_get_exception, NULL,
     "a handed push's failure as the engine loop raised it, or None", NULL},
    {"done", (getter)PullCall_get_done, NULL, "finished (done or failed)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PullCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adapm._native.PullCall",
    .tp_basicsize = sizeof(PullCallObject),
    .tp_dealloc = (destructor)PullCall_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A worker's pull or push of keys not held here, served by the transport without "
              "the engine loop (ZmqIO.pull, ZmqIO.push; native/zmq_calls.c).",
    .tp_methods = PullCall_methods,
    .tp_getset = PullCall_getset,
};

int register_pull_call_type(PyObject *module) { return add_type(module, &PullCallType, "PullCall"); }

/* --- the engine's lists ------------------------------------------------------------------ */

/* Room for one more call in a list of n (capacity *cap); 0, or -1 if out of memory. */
static int room_for_one(PullCallObject ***list, Py_ssize_t n, Py_ssize_t *cap) {
    if (n < *cap) return 0;
    const Py_ssize_t grown = *cap ? 2 * *cap : 16;
    PullCallObject **p = PyMem_RawRealloc(*list, (size_t)grown * sizeof(*p));
    if (!p) return -1;
    *list = p;
    *cap = grown;
    return 0;
}

static int push_call(PullCallObject ***list, Py_ssize_t *n, Py_ssize_t *cap, PullCallObject *c) {
    if (room_for_one(list, *n, cap) < 0) return -1;
    (*list)[(*n)++] = c;
    return 0;
}

/* The call leaves the engine's hands: its reference is dropped with the GIL (pulls_settle). If
 * even that list cannot grow, the reference is kept for good (a leak, not a crash). */
static void retire(ZmqIOObject *self, PullCallObject *c) {
    (void)push_call(&self->finished, &self->nfinished, &self->fcap, c);
}

int pulls_init(ZmqIOObject *self) {
    self->pull_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->pull_fd < 0) return -1;
    if (pthread_mutex_init(&self->pull_lock, NULL)) {
        close(self->pull_fd);
        return -1;
    }
    self->pull_lock_ready = 1;
    self->next_req = PULL_BASE;
    return 0;
}

void pulls_settle(ZmqIOObject *self) {
    Py_ssize_t n = self->nfinished;
    self->nfinished = 0;
    for (Py_ssize_t i = 0; i < n; i++) Py_DECREF((PyObject *)self->finished[i]);
}

/* Fails every call the engine knows (queued or open) with text; with the GIL. */
static void fail_all(ZmqIOObject *self, const char *text) {
    if (self->pull_lock_ready) {
        pthread_mutex_lock(&self->pull_lock);
        for (Py_ssize_t i = 0; i < self->nqueue; i++) {
            finish(self->queue[i], PULL_FAILED, text);
            retire(self, self->queue[i]);
        }
        self->nqueue = 0;
        pthread_mutex_unlock(&self->pull_lock);
    }
    for (Py_ssize_t i = 0; i < self->nopen; i++) {
        finish(self->open[i], PULL_FAILED, text);
        retire(self, self->open[i]);
    }
    self->nopen = 0;
    for (Py_ssize_t i = 0; i < self->nhanded; i++) { /* not taken by the engine loop yet */
        finish(self->handed[i], PULL_FAILED, text);
        retire(self, self->handed[i]);
        self->handed_open--;
    }
    self->nhanded = 0;
    pulls_settle(self);
}

void pulls_free(ZmqIOObject *self) {
    if (!self->pull_lock_ready) return; /* pulls_init never ran, or failed */
    fail_all(self, "the transport was closed");
    close(self->pull_fd);
    pthread_mutex_destroy(&self->pull_lock);
    PyMem_RawFree(self->queue);
    PyMem_RawFree(self->taking);
    PyMem_RawFree(self->open);
    PyMem_RawFree(self->finished);
    PyMem_RawFree(self->handed);
    PyMem_RawFree(self->hop);
    for (Py_ssize_t i = 0; i < self->nout; i++) {
        PyMem_RawFree(self->outbox[i].frame[0]);
        PyMem_RawFree(self->outbox[i].frame[1]);
    }
    PyMem_RawFree(self->outbox);
}

/* --- the worker's side: queue a call ----------------------------------------------------- */

/* A new call of kind for rows of row floats (nothing borrowed or copied yet), or NULL. */
static PullCallObject *new_call(ZmqIOObject *self, int kind, int64_t row) {
    PullCallObject *c = PyObject_New(PullCallObject, &PullCallType);
    if (!c) {
        PyErr_Clear();
        return NULL;
    }
    c->ready = c->held = 0;
    c->kind = kind;
    c->handed = 0;
    c->keys = c->pos = NULL;
    c->rows = NULL;
    c->copy = NULL;
    c->exc = NULL;
    c->worker = c->clock = 0;
    c->n = 0;
    c->at = NULL;
    c->answered = NULL;
    c->error = NULL;
    c->state = PULL_QUEUED;
    c->abandoned = c->forwarded = 0;
    c->waited = 0;
    c->world = self->world;
    c->row = row;
    if (pthread_mutex_init(&c->mu, NULL)) {
        Py_DECREF(c);
        return NULL;
    }
    if (pthread_cond_init(&c->cv, NULL)) {
        pthread_mutex_destroy(&c->mu);
        Py_DECREF(c);
        return NULL;
    }
    c->ready = 1;
    return c;
}

/* The call (its keys and positions set) into the engine's queue, the engine woken: 0, or -1
 * (nothing queued). */
static int queue_call(ZmqIOObject *self, PullCallObject *c) {
    c->remaining = c->n;
    c->at = calloc((size_t)self->world, sizeof(int64_t));
    c->answered = calloc((size_t)c->n, 1);
    if (!c->at || !c->answered) return -1;
    c->req = self->next_req++; /* workers call this with the GIL: one at a time */
    pthread_mutex_lock(&self->pull_lock);
    const int queued = push_call(&self->queue, &self->nqueue, &self->qcap, c) == 0;
    pthread_mutex_unlock(&self->pull_lock);
    if (!queued) return -1;
    Py_INCREF(c); /* the engine's */
    const uint64_t one = 1;
    if (write(self->pull_fd, &one, sizeof one) < 0) { /* EAGAIN: a wake-up is pending */
    }
    return 0;
}

/* pull(keys, positions, out, row) -> PullCall or None: see the method table (zmq_io.c). */
PyObject *ZmqIO_pull(ZmqIOObject *self, PyObject *args) {
    PyObject *okeys, *opos, *oout;
    long long row;
    if (!PyArg_ParseTuple(args, "OOOL", &okeys, &opos, &oout, &row)) return NULL;
    if (!self->directory || !self->pull_lock_ready || row <= 0) Py_RETURN_NONE;
    PullCallObject *c = new_call(self, WIRE_PULL, row);
    if (!c) goto refuse;
    if (borrow(okeys, &c->kv, 8, 0, "pull: keys") < 0) goto fail;
    c->held = 1;
    if (borrow(opos, &c->pv, 8, 0, "pull: positions") < 0) goto fail;
    c->held = 2;
    if (borrow(oout, &c->ov, 4, 1, "pull: out") < 0) goto fail;
    c->held = 3;
    c->n = c->kv.len / 8;
    c->keys = c->kv.buf;
    c->pos = c->pv.buf;
    c->rows = c->ov.buf;
    if (!c->n || c->pv.len / 8 != c->n || c->pos[0] < 0 || !keys_ascend(c->pos, c->n)
        || (c->pos[c->n - 1] + 1) * row > c->ov.len / 4)
        goto refuse; /* not the worker's usual request: the engine's path checks it */
    if (queue_call(self, c) < 0) goto refuse;
    return (PyObject *)c;
fail:
    PyErr_Clear(); /* the engine's path reports what is wrong with the request */
refuse:
    Py_XDECREF(c);
    Py_RETURN_NONE;
}

/* push(keys, positions, rows, row, worker, clock) -> PullCall or None: see the method table
 * (zmq_io.c). */
PyObject *ZmqIO_push(ZmqIOObject *self, PyObject *args) {
    PyObject *okeys, *opos, *orows;
    long long row, worker, clock;
    if (!PyArg_ParseTuple(args, "OOOLLL", &okeys, &opos, &orows, &row, &worker, &clock))
        return NULL;
    if (!self->directory || !self->pull_lock_ready || row <= 0) Py_RETURN_NONE;
    Py_buffer kv, pv, rv;
    if (borrow(okeys, &kv, 8, 0, "push: keys") < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (borrow(opos, &pv, 8, 0, "push: positions") < 0) {
        PyErr_Clear();
        PyBuffer_Release(&kv);
        Py_RETURN_NONE;
    }
    if (borrow(orows, &rv, 4, 0, "push: rows") < 0) {
        PyErr_Clear();
        PyBuffer_Release(&kv);
        PyBuffer_Release(&pv);
        Py_RETURN_NONE;
    }
    const int64_t n = kv.len / 8;
    const int64_t *pos = pv.buf;
    PullCallObject *c = NULL;
    if (n && pv.len / 8 == n && rv.len / 4 == n * row && pos[0] >= 0 && keys_ascend(pos, n)
        && (c = new_call(self, WIRE_PUSH, row))) {
        /* The caller may reuse its arrays at once: the call keeps a copy. */
        c->copy = malloc((size_t)(16 * n + 4 * n * row));
        if (c->copy) {
            int64_t *k = c->copy;
            memcpy(k, kv.buf, (size_t)(8 * n));
            memcpy(k + n, pv.buf, (size_t)(8 * n));
            memcpy(k + 2 * n, rv.buf, (size_t)(4 * n * row));
            c->n = n;
            c->keys = k;
            c->pos = k + n;
            c->rows = (float *)(k + 2 * n);
            c->worker = worker;
            c->clock = clock;
        }
    }
    PyBuffer_Release(&kv);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&rv);
    if (!c || !c->copy || queue_call(self, c) < 0) { /* the engine's path takes it */
        Py_XDECREF(c);
        Py_RETURN_NONE;
    }
    return (PyObject *)c;
}

/* --- the engine's side: route, serve what is here, send ---------------------------------- */

/* A request sent to rank: its time (for the heartbeats) and counters, message bytes under
 * kind (C_PULL_OUT or C_PUSH_OUT; its bytes counter follows), padding in the wire bytes only. */
static void count_sent(ZmqIOObject *self, int64_t rank, int64_t bytes, int kind,
                       int64_t padding) {
    self->sent_at[rank] = zmq_io_now();
    self->counts[C_WIRE_OUT]++;
    self->counts[C_MSGS_OUT]++;
    self->counts[C_BYTES_OUT] += bytes + padding;
    self->counts[kind]++;
    self->counts[kind + 1] += bytes;
}

/* One PULL of the call's keys with hop == rank to that rank. 0, or an errno. */
static int send_part(ZmqIOObject *self, PullCallObject *c, const int64_t *hop, int64_t rank,
                     int64_t m) {
    const int64_t *keys = c->keys, *pos = c->pos;
    int64_t lengths[2] = {8 * m, 8 * m};
    zmsg_t hm, pm;
    if (Z.msg_init_size(&hm, WIRE_HEADER_BYTES + 16) < 0) return ENOMEM;
    if (Z.msg_init_size(&pm, (size_t)(16 * m)) < 0) {
        Z.msg_close(&hm);
        return ENOMEM;
    }
    put_header(Z.msg_data(&hm), WIRE_PULL, 2, self->rank, c->req, self->rank, lengths);
    int64_t *k = Z.msg_data(&pm), *p = k + m;
    for (int64_t i = 0, j = 0; i < c->n; i++)
        if (hop[i] == rank) {
            k[j] = keys[i];
            p[j++] = pos[i];
        }
    const int e = io_send_pair(self, rank, &hm, &pm);
    if (!e) count_sent(self, rank, WIRE_HEADER_BYTES + 16 + 16 * m, C_PULL_OUT, 0);
    return e;
}

/* One PUSH of the call's keys with hop == rank to that rank: keys, positions and rows in the
 * payload frame. 0, or an errno. */
static int send_push_part(ZmqIOObject *self, PullCallObject *c, const int64_t *hop,
                          int64_t rank, int64_t m) {
    const int64_t row = c->row;
    int64_t lengths[3] = {8 * m, 8 * m, 4 * m * row};
    const size_t rows_bytes = padded((size_t)lengths[2]);
    zmsg_t hm, pm;
    if (Z.msg_init_size(&hm, WIRE_HEADER_BYTES + 24) < 0) return ENOMEM;
    if (Z.msg_init_size(&pm, (size_t)(16 * m) + rows_bytes) < 0) {
        Z.msg_close(&hm);
        return ENOMEM;
    }
    put_header(Z.msg_data(&hm), WIRE_PUSH, 3, self->rank, c->req, self->rank, lengths);
    uint8_t *payload = Z.msg_data(&pm);
    int64_t *k = (int64_t *)payload, *p = k + m;
    float *v = (float *)(payload + 16 * m);
    for (int64_t i = 0, j = 0; i < c->n; i++)
        if (hop[i] == rank) {
            k[j] = c->keys[i];
            p[j] = c->pos[i];
            memcpy(v + j * row, c->rows + i * row, (size_t)row * sizeof(float));
            j++;
        }
    memset((uint8_t *)v + lengths[2], 0, rows_bytes - (size_t)lengths[2]);
    const int e = io_send_pair(self, rank, &hm, &pm);
    if (!e)
        count_sent(self, rank, WIRE_HEADER_BYTES + 24 + 16 * m + lengths[2], C_PUSH_OUT,
                   (int64_t)rows_bytes - lengths[2]);
    return e;
}

/* Routes the call's keys into self->hop (directory_route_pull): how many are held here, or -1
 * where the call must take the engine loop's path (routing needs the state machine, a key's
 * owner is this node or no peer, or no room in the open list: nothing may fail once parts are
 * sent). */
static int64_t route(ZmqIOObject *self, const PullCallObject *c) {
    int64_t *hop = self->hop;
    int64_t here = directory_route_pull(self->directory, c->keys, c->n, hop);
    for (int64_t i = 0; here >= 0 && i < c->n; i++)
        if (hop[i] >= 0 && (hop[i] == self->rank || !self->peers[hop[i]])) here = -1;
    if (here >= 0 && room_for_one(&self->open, self->nopen, &self->ocap) < 0) here = -1;
    return here;
}

typedef int (*send_part_fn)(ZmqIOObject *, PullCallObject *, const int64_t *, int64_t, int64_t);

/* Sends the call's parts (c->at[r] keys to each rank r, by send), then finishes it if
 * nothing is left to wait for, or keeps it open for its answers. */
static void send_parts(ZmqIOObject *self, PullCallObject *c, send_part_fn send,
                       const char *failed) {
    for (int64_t r = 0; r < self->world; r++) {
        if (!c->at[r]) continue;
        const int e = send(self, c, self->hop, r, c->at[r]);
        if (e) { /* the node cannot go on (as when the engine's send fails) */
            self->send_failed = e;
            finish(c, PULL_FAILED, failed);
            return retire(self, c);
        }
    }
    opened(c);
    if (!c->remaining) {
        finish(c, PULL_DONE, NULL);
        return retire(self, c);
    }
    self->open[self->nopen++] = c;
}

/* A push that routing cannot take goes to the engine loop (ZmqIO.handoffs), which submits it
 * to the state machine before any request the worker submits after it (wait_routed). */
static void hand_off(ZmqIOObject *self, PullCallObject *c) {
    if (push_call(&self->handed, &self->nhanded, &self->hcap, c) < 0) {
        finish(c, PULL_FAILED, "out of memory handing a push to the engine loop");
        return retire(self, c);
    }
    c->handed = 1;
    self->handed_open++;
    self->counts[C_PUSHES_HANDED]++;
    opened(c);
}

/* Routes a queued push: adds the rows of keys that arrived meanwhile here, sends one PUSH per
 * owner, or hands the push to the engine loop. */
static void start_push(ZmqIOObject *self, PullCallObject *c) {
    const int64_t n = c->n, *keys = c->keys, *hop = self->hop;
    const int64_t here = route(self, c);
    if (here < 0) return hand_off(self, c);
    int64_t *count = c->at; /* per rank, counted here first */
    for (int64_t i = 0; i < n; i++) {
        if (hop[i] >= 0) {
            count[hop[i]]++;
        } else { /* held here now (only this thread removes keys: it is there) */
            if (directory_scatter_one(self->directory, keys[i], c->rows + i * c->row, c->row))
                self->send_failed = -1;
            c->answered[i] = 1;
        }
    }
    c->waited = here;
    c->remaining = n - here;
    __atomic_fetch_add(&self->pushed_here, here, __ATOMIC_RELAXED);
    self->counts[C_PUSHES_NATIVE]++;
    send_parts(self, c, send_push_part, "sending the push failed");
}

/* Routes and sends one queued call (or declines it). */
static void start(ZmqIOObject *self, PullCallObject *c) {
    if (__atomic_load_n(&c->abandoned, __ATOMIC_ACQUIRE)) {
        finish(c, PULL_FAILED, "abandoned");
        return retire(self, c);
    }
    const int64_t n = c->n, *keys = c->keys, *pos = c->pos;
    if (n > self->hop_cap) {
        int64_t *grown = PyMem_RawRealloc(self->hop, (size_t)n * sizeof(int64_t));
        if (!grown) {
            if (c->kind == WIRE_PUSH) return hand_off(self, c);
            finish(c, PULL_DECLINED, NULL);
            return retire(self, c);
        }
        self->hop = grown;
        self->hop_cap = n;
    }
    if (c->kind == WIRE_PUSH) return start_push(self, c);
    const int64_t *hop = self->hop;
    /* While a push handed to the engine loop is not done, a pull takes the loop's path too:
     * its keys may have arrived meanwhile, and a pull served here would miss the push. */
    const int64_t here = self->handed_open ? -1 : route(self, c);
    int64_t *count = c->at; /* per rank, counted here first */
    if (here < 0) {
        finish(c, PULL_DECLINED, NULL);
        return retire(self, c);
    }
    float *out = c->rows;
    pthread_mutex_lock(&c->mu); /* out is written only while the worker still waits */
    const int abandoned = c->abandoned;
    for (int64_t i = 0; i < n; i++) {
        if (hop[i] >= 0) {
            count[hop[i]]++;
        } else {
            if (!abandoned)
                directory_gather_one(self->directory, keys[i], out + pos[i] * c->row, c->row);
            c->answered[i] = 1;
        }
    }
    pthread_mutex_unlock(&c->mu);
    c->waited = here;
    c->remaining = n - here;
    self->counts[C_PULLS_NATIVE]++;
    send_parts(self, c, send_part, "sending the pull failed");
}

void pulls_send(ZmqIOObject *self) {
    if (!self->pull_lock_ready) return;
    uint64_t count;
    if (read(self->pull_fd, &count, sizeof count) < 0) { /* EAGAIN: nothing new */
    }
    /* Calls abandoned while open: forgotten (their answers are late ones). */
    for (Py_ssize_t i = 0; i < self->nopen;) {
        PullCallObject *c = self->open[i];
        if (__atomic_load_n(&c->abandoned, __ATOMIC_ACQUIRE)) {
            finish(c, PULL_FAILED, "abandoned");
            retire(self, c);
            self->open[i] = self->open[--self->nopen];
        } else {
            i++;
        }
    }
    pthread_mutex_lock(&self->pull_lock);
    PullCallObject **q = self->queue;
    const Py_ssize_t n = self->nqueue;
    self->queue = self->taking;
    self->qcap ^= self->tcap, self->tcap ^= self->qcap, self->qcap ^= self->tcap;
    self->taking = q;
    self->nqueue = 0;
    pthread_mutex_unlock(&self->pull_lock);
    for (Py_ssize_t i = 0; i < n; i++) start(self, q[i]);
}

/* --- answers ----------------------------------------------------------------------------- */

static PullCallObject *open_call(ZmqIOObject *self, int64_t req, Py_ssize_t *at) {
    if (req < PULL_BASE) return NULL;
    for (Py_ssize_t i = 0; i < self->nopen; i++)
        if (self->open[i]->req == req) {
            *at = i;
            return self->open[i];
        }
    return NULL;
}

/* Index of position p among the call's (ascending) positions, or -1. */
static int64_t index_of(const PullCallObject *c, int64_t p) {
    const int64_t *pos = c->pos;
    int64_t lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (pos[mid] == p) return mid;
        if (pos[mid] < p) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Whether a PULL_RESP's positions (n of them) and values (floats) fit the call: positions it
 * asked for and still waits for, each once, one row each. NULL if so, else why. The positions
 * are marked answered on the way (a repeat is then caught); unless keep, or when unfit, the
 * marks are taken back. */
static const char *answer_unfit(PullCallObject *c, const int64_t *positions, int64_t n,
                                int64_t floats, int keep) {
    if (n > c->remaining) return "more answers than the call waits for";
    if (c->kind == WIRE_PULL && floats != n * c->row)
        return "values that are not one row per position";
    const char *why = NULL;
    int64_t i = 0;
    for (; i < n; i++) {
        const int64_t j = index_of(c, positions[i]);
        if (j < 0 || c->answered[j]) {
            why = "a position the call did not ask for, or one answered already";
            break;
        }
        c->answered[j] = 1;
    }
    if (why || !keep)
        while (i-- > 0) c->answered[index_of(c, positions[i])] = 0;
    return why;
}

/* Applies an answer from src that answer_unfit passed (and marked): a PULL_RESP's values (rows
 * into out only while the worker waits: not abandoned), or a push's ACK (values NULL);
 * finishes the call (index at in open) when complete. */
static void apply_answer(ZmqIOObject *self, PullCallObject *c, Py_ssize_t at, int64_t src,
                         const int64_t *positions, int64_t n, const float *values) {
    const int64_t *keys = c->keys;
    float *out = c->kind == WIRE_PULL ? c->rows : NULL;
    int64_t *learnt = self->hop; /* scratch of at least c->n entries (start grew it) */
    pthread_mutex_lock(&c->mu);
    const int abandoned = c->abandoned;
    for (int64_t i = 0; i < n; i++) {
        const int64_t j = index_of(c, positions[i]);
        if (!abandoned && out && values)
            memcpy(out + positions[i] * c->row, values + i * c->row,
                   (size_t)c->row * sizeof(float));
        learnt[i] = keys[j];
    }
    pthread_mutex_unlock(&c->mu);
    if (src != self->rank) (void)directory_learn_native(self->directory, learnt, n, src);
    c->remaining -= n;
    __atomic_store_n(&c->at[src], c->at[src] - n, __ATOMIC_RELAXED);
    if (!c->remaining) {
        finish(c, PULL_DONE, NULL);
        self->open[at] = self->open[--self->nopen];
        retire(self, c);
    }
}

/* One answer of a bundle, checked (and its positions marked) before any is applied. */
typedef struct {
    int64_t req, n, bytes;
    const int64_t *positions;
    const float *values; /* a PULL_RESP's; NULL for an ACK */
    PullCallObject *c;
} taken_t;

/* Takes back the marks answer_unfit left for answers t[0..k). */
static void unmark(taken_t *t, int64_t k) {
    for (int64_t j = k; j-- > 0;)
        for (int64_t i = 0; i < t[j].n; i++)
            t[j].c->answered[index_of(t[j].c, t[j].positions[i])] = 0;
}

int pulls_take_answer(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end, int rank) {
    if (!self->nopen || end - first != 3) return 0;
    wframe_t wf[2];
    zmq_frames(self, first + 1, end, wf, 2);
    return pulls_take_frames(self, wf, rank);
}

int pulls_take_frames(ZmqIOObject *self, const wframe_t *wf, int rank) {
    if (!self->nopen) return 0;
    const uint8_t *h = wf[0].p;
    const size_t hlen = wf[0].n;
    /* The owner answers a bundle of requests with one message of their answers (serve_wire.c):
     * every one must answer an open call of this node, or Python takes the message whole. */
    enum { TAKE_STACK = 16 };
    taken_t stack[TAKE_STACK], *t = stack;
    const int64_t cap = (int64_t)(hlen / WIRE_HEADER_BYTES);
    if (cap > TAKE_STACK && !(t = PyMem_RawMalloc((size_t)cap * sizeof *t))) return 0;
    size_t at = 0, pat = 0;
    int own = 2, ok = 1;
    int64_t k = 0;
    while (at < hlen) {
        wire_header_t w;
        if (k == cap || wire_header(h + at, hlen - at, &w) < 0 || w.extra || w.src != rank) {
            ok = 0;
            break;
        }
        const int resp = w.kind == WIRE_PULL_RESP && w.narrays == 2;
        Py_ssize_t idx;
        PullCallObject *c = open_call(self, w.req, &idx);
        if ((!resp && (w.kind != WIRE_ACK || w.narrays != 1)) || !c
            || (c->kind == WIRE_PULL) != resp) {
            ok = 0;
            break;
        }
        carr_t a[2];
        const int64_t bytes = take_arrays(&w, wf, 2, wf[1].p, wf[1].n, &pat, &own, a);
        if (bytes < 0 || answer_unfit(c, a[0].p, a[0].n, resp ? a[1].n : 0, 1)) {
            ok = 0; /* Python drops it (validate.py, through native_answer) */
            break;
        }
        t[k++] = (taken_t){.req = w.req, .n = a[0].n, .bytes = (int64_t)w.size + bytes,
                           .positions = a[0].p, .values = resp ? a[1].p : NULL, .c = c};
        at += w.size;
    }
    if (!ok || !k) {
        unmark(t, k);
        if (t != stack) PyMem_RawFree(t);
        return 0;
    }
    for (int64_t j = 0; j < k; j++) {
        Py_ssize_t idx;
        PullCallObject *c = open_call(self, t[j].req, &idx);
        if (c) apply_answer(self, c, idx, rank, t[j].positions, t[j].n, t[j].values);
        const int resp = t[j].values != NULL;
        self->counts[resp ? C_PULL_RESP_IN : C_ACK_IN]++;
        self->counts[resp ? C_PULL_RESP_IN_BYTES : C_ACK_IN_BYTES] += t[j].bytes;
    }
    self->counts[C_WIRE_IN]++;
    self->counts[C_MSGS_IN] += k;
    self->counts[C_BYTES_IN] += (int64_t)(hlen + wf[1].n);
    self->heard[rank] = 1;
    if (t != stack) PyMem_RawFree(t);
    return 1;
}

/* --- answers that reached Python, and failure -------------------------------------------- */

/* native_answer(kind, req_id, src, arrays, text, apply) -> see the method table (zmq_io.c). */
PyObject *ZmqIO_native_answer(ZmqIOObject *self, PyObject *args) {
    int kind, apply;
    long long req, src;
    PyObject *arrays, *text;
    if (!PyArg_ParseTuple(args, "iLLOOp", &kind, &req, &src, &arrays, &text, &apply))
        return NULL;
    Py_ssize_t at;
    PullCallObject *c = open_call(self, req, &at);
    if (!c || src < 0 || src >= self->world) Py_RETURN_FALSE;
    if ((kind == WIRE_PULL_RESP && c->kind != WIRE_PULL)
        || (kind == WIRE_ACK && c->kind != WIRE_PUSH))
        return PyUnicode_FromFormat("a %s answers a %s", kind == WIRE_ACK ? "ACK" : "PULL_RESP",
                                    c->kind == WIRE_PULL ? "pull" : "push");
    if (kind == WIRE_ACK) {
        PyObject *seq = PySequence_Fast(arrays, "native_answer: arrays must be a sequence");
        if (!seq) return NULL;
        PyObject *result = NULL;
        Py_buffer a;
        if (PySequence_Fast_GET_SIZE(seq) != 1) {
            PyErr_SetString(PyExc_ValueError, "native_answer: an ACK has one array");
        } else if (borrow(PySequence_Fast_GET_ITEM(seq, 0), &a, 8, 0, "native_answer") == 0) {
            const int64_t n = a.len / 8;
            const char *why = answer_unfit(c, a.buf, n, 0, apply);
            if (why) result = PyUnicode_FromString(why);
            else if (apply) apply_answer(self, c, at, src, a.buf, n, NULL);
            if (!result) result = Py_NewRef(Py_None);
            PyBuffer_Release(&a);
        }
        Py_DECREF(seq);
        if (result && apply) pulls_settle(self);
        return result;
    }
    if (kind == WIRE_PULL_RESP || kind == WIRE_FORWARDED) {
        PyObject *seq = PySequence_Fast(arrays, "native_answer: arrays must be a sequence");
        if (!seq) return NULL;
        PyObject *result = NULL;
        Py_buffer a, b;
        if (PySequence_Fast_GET_SIZE(seq) != 2) {
            PyErr_SetString(PyExc_ValueError, "native_answer: two arrays");
        } else if (borrow(PySequence_Fast_GET_ITEM(seq, 0), &a, 8, 0, "native_answer") == 0) {
            if (borrow(PySequence_Fast_GET_ITEM(seq, 1), &b, kind == WIRE_PULL_RESP ? 4 : 8, 0,
                       "native_answer") == 0) {
                const int64_t n = a.len / 8;
                if (kind == WIRE_PULL_RESP) {
                    const char *why = answer_unfit(c, a.buf, n, b.len / 4, apply);
                    if (why) result = PyUnicode_FromString(why);
                    else if (apply) apply_answer(self, c, at, src, a.buf, n, b.buf);
                } else if (apply) { /* entries passed on from src to ranks (checked in Python) */
                    const int64_t *ranks = a.buf, *counts = b.buf;
                    int64_t moved = 0;
                    for (int64_t i = 0; i < n && i < b.len / 8; i++) {
                        c->at[ranks[i]] += counts[i];
                        moved += counts[i];
                    }
                    c->at[src] -= moved;
                    c->forwarded = 1;
                }
                if (!result) result = Py_NewRef(Py_None);
                PyBuffer_Release(&b);
            }
            PyBuffer_Release(&a);
        }
        Py_DECREF(seq);
        if (result && apply) pulls_settle(self);
        return result;
    }
    if (kind == WIRE_ERROR) {
        if (apply) {
            PyObject *bytes = PyUnicode_AsUTF8String(text);
            if (!bytes) return NULL;
            finish(c, PULL_FAILED, PyBytes_AS_STRING(bytes));
            Py_DECREF(bytes);
            self->open[at] = self->open[--self->nopen];
            retire(self, c);
            pulls_settle(self);
        }
        Py_RETURN_NONE;
    }
    return PyUnicode_FromFormat("a %d answers a %s", kind, c->kind == WIRE_PULL ? "pull" : "push");
}

/* handoffs() -> list: see the method table (zmq_io.c). With the GIL, on the engine thread. */
PyObject *ZmqIO_handoffs(ZmqIOObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < self->nhanded; i++) {
        PullCallObject *c = self->handed[i];
        const int64_t n = c->n;
        PyObject *item = Py_BuildValue(
            "(Oy#y#y#LL)", (PyObject *)c, (const char *)c->keys, (Py_ssize_t)(8 * n),
            (const char *)c->pos, (Py_ssize_t)(8 * n), (const char *)c->rows,
            (Py_ssize_t)(4 * n * c->row), (long long)c->worker, (long long)c->clock);
        if (!item || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL; /* the calls stay handed: the next look takes them */
        }
        Py_DECREF(item);
    }
    for (Py_ssize_t i = 0; i < self->nhanded; i++) Py_DECREF((PyObject *)self->handed[i]);
    self->nhanded = 0; /* the list's items hold the calls now */
    return out;
}

/* complete(call, error) -> None: see the method table (zmq_io.c). */
PyObject *ZmqIO_complete(ZmqIOObject *self, PyObject *args) {
    PyObject *call, *error;
    if (!PyArg_ParseTuple(args, "O!O", &PullCallType, &call, &error)) return NULL;
    PullCallObject *c = (PullCallObject *)call;
    if (!c->handed || c->handed == 2) {
        PyErr_SetString(PyExc_ValueError, "complete: not a push handed to the engine loop, or "
                                          "one completed already");
        return NULL;
    }
    c->handed = 2;
    self->handed_open--;
    if (error != Py_None && !c->exc) c->exc = Py_NewRef(error);
    finish(c, error == Py_None ? PULL_DONE : PULL_FAILED, NULL);
    Py_RETURN_NONE;
}

/* pushed_here() -> int: see the method table (zmq_io.c). Any thread. */
PyObject *ZmqIO_pushed_here(ZmqIOObject *self, PyObject *unused) {
    return PyLong_FromLongLong(__atomic_load_n(&self->pushed_here, __ATOMIC_RELAXED));
}

/* fail_native(text) -> None: every call fails with text. */
PyObject *ZmqIO_fail_native(ZmqIOObject *self, PyObject *arg) {
    PyObject *bytes = PyUnicode_AsUTF8String(arg);
    if (!bytes) return NULL;
    fail_all(self, PyBytes_AS_STRING(bytes));
    Py_DECREF(bytes);
    Py_RETURN_NONE;
}
