/* A node's ZeroMQ I/O in C (adapm/_wire/zmq_transport.py): one call polls the node's ROUTER
 * (and the eventfd that wakes it, and the handshake monitor) with the GIL released, receives
 * every waiting message and parses it (wire_module.c); one call encodes a peer's messages and
 * sends them. Through pyzmq each received message cost ~10 Python calls (the poller, two event
 * queries, a receive per frame, a RCVMORE query per frame) and each sent one a call per frame:
 * bench/engine.py measured the pyzmq echo at 2-3x a C echo's CPU per message on this machine.
 *
 * The sockets stay pyzmq's (created, configured, bound and closed there): this file reaches
 * their libzmq handles (pyzmq's Socket.underlying) through the libzmq that pyzmq loaded, found
 * among the process's shared objects by its symbols, so there is one libzmq in the process and
 * nothing to link at build time. ZmqIO() raises ImportError where no loaded object exports
 * libzmq's API (a pyzmq built some other way); the transport then uses pyzmq.
 *
 * Frames received are not copied: each is a Frame object (the buffer protocol over the libzmq
 * message), and the parsed arrays are numpy views of them. Arrays sent in frames of their own
 * (64 KiB or more, wire_module.c) are not copied either: libzmq's I/O thread releases them when
 * sent, through a queue that the sending thread empties on its next call (no Python in the I/O
 * thread). Thread safety: a ZmqIO is for its engine thread only, as the sockets are. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "zmq_io.h"

zapi_t Z;
static int z_loaded; /* 1 loaded, -1 looked for in vain */

static int find_libzmq(struct dl_phdr_info *info, size_t size, void *data) {
    if (!info->dlpi_name || !info->dlpi_name[0]) return 0;
    void *h = dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return 0;
    if (!dlsym(h, "zmq_msg_recv") || !dlsym(h, "zmq_poll")) {
        dlclose(h);
        return 0;
    }
    *(void **)data = h; /* kept open: the process's libzmq for good */
    return 1;
}

#define BIND(field, name) ok &= (*(void **)&Z.field = dlsym(h, name)) != NULL
static int load_libzmq(void) {
    if (z_loaded) return z_loaded;
    void *h = NULL;
    dl_iterate_phdr(find_libzmq, &h);
    int ok = h != NULL;
    if (ok) {
        BIND(msg_init, "zmq_msg_init");
        BIND(msg_init_size, "zmq_msg_init_size");
        BIND(msg_init_data, "zmq_msg_init_data");
        BIND(msg_recv, "zmq_msg_recv");
        BIND(msg_send, "zmq_msg_send");
        BIND(msg_close, "zmq_msg_close");
        BIND(msg_move, "zmq_msg_move");
        BIND(msg_data, "zmq_msg_data");
        BIND(msg_size, "zmq_msg_size");
        BIND(msg_more, "zmq_msg_more");
        BIND(msg_gets, "zmq_msg_gets");
        BIND(getsockopt, "zmq_getsockopt");
        BIND(errno_, "zmq_errno");
        BIND(strerror, "zmq_strerror");
    }
    return z_loaded = ok ? 1 : -1;
}

/* --- arrays sent without copying: released by libzmq's I/O thread, freed by a Python one ---- */

typedef struct released {
    Py_buffer view;
    struct released *next;
} released_t;
/* Process-wide: a message may be sent after its ZmqIO is gone (linger), and freed after it. */
static pthread_mutex_t released_lock = PTHREAD_MUTEX_INITIALIZER;
static released_t *released_head;

static void on_sent(void *data, void *hint) { /* libzmq's I/O thread: no Python here */
    released_t *r = hint;
    pthread_mutex_lock(&released_lock);
    r->next = released_head;
    released_head = r;
    pthread_mutex_unlock(&released_lock);
}

static void drain_released(void) { /* with the GIL */
    if (!__atomic_load_n(&released_head, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&released_lock);
    released_t *r = released_head;
    released_head = NULL;
    pthread_mutex_unlock(&released_lock);
    while (r) {
        released_t *next = r->next;
        PyBuffer_Release(&r->view);
        PyMem_RawFree(r);
        r = next;
    }
}

/* --- Frame: one received message part, as a read-only buffer ---------------------------- */

typedef struct {
    PyObject_HEAD
    zmsg_t msg;
    Py_ssize_t exports;
} FrameObject;

static void Frame_dealloc(FrameObject *self) {
    Z.msg_close(&self->msg);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Frame_getbuffer(FrameObject *self, Py_buffer *view, int flags) {
    if (PyBuffer_FillInfo(view, (PyObject *)self, Z.msg_data(&self->msg),
                          (Py_ssize_t)Z.msg_size(&self->msg), 1, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void Frame_releasebuffer(FrameObject *self, Py_buffer *view) { self->exports--; }

static Py_ssize_t Frame_len(FrameObject *self) { return (Py_ssize_t)Z.msg_size(&self->msg); }

static PyBufferProcs Frame_as_buffer = {(getbufferproc)Frame_getbuffer,
                                        (releasebufferproc)Frame_releasebuffer};
static PySequenceMethods Frame_as_sequence = {.sq_length = (lenfunc)Frame_len};

static PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adapm._native.Frame",
    .tp_basicsize = sizeof(FrameObject),
    .tp_dealloc = (destructor)Frame_dealloc,
    .tp_as_buffer = &Frame_as_buffer,
    .tp_as_sequence = &Frame_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A received ZeroMQ message part (read-only buffer; not copied).",
};

/* --- ZmqIO ------------------------------------------------------------------------------ */

#define POLL_BATCH 256 /* messages per poll at most: a busy peer cannot starve the loop */

/* The rank whose connection sent the message whose routing id is id and last frame last: the
 * ZAP user id of its connection (with authentication), else the rank whose identity the
 * connection named; -1 if none. Without the GIL: the identities are compared as bytes. */
int sender_of(ZmqIOObject *self, zmsg_t *id, zmsg_t *last) {
    if (self->authenticated) {
        const char *uid = Z.msg_gets(last, "User-Id");
        if (!uid || !*uid) return -1;
        char *end;
        errno = 0;
        const long r = strtol(uid, &end, 10);
        return *end || errno || r < 0 || r >= self->world ? -1 : (int)r;
    }
    const size_t len = Z.msg_size(id);
    const void *data = Z.msg_data(id);
    for (Py_ssize_t r = 0; r < self->world; r++) {
        PyObject *b = self->idents[r];
        if (b && (size_t)PyBytes_GET_SIZE(b) == len && !memcmp(PyBytes_AS_STRING(b), data, len))
            return (int)r;
    }
    return -1;
}

static PyObject *zmq_failed(const char *what);

static int ZmqIO_init(ZmqIOObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"router", "wake_fd", "watch", "peers", "identities",
                             "authenticated", NULL};
    unsigned long long router, watch;
    int wake_fd, authenticated;
    PyObject *peers, *identities;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KiKO!O!p", kwlist, &router, &wake_fd, &watch,
                                     &PyList_Type, &peers, &PyDict_Type, &identities,
                                     &authenticated))
        return -1;
    if (load_libzmq() < 0) {
        PyErr_SetString(PyExc_ImportError, "ZmqIO: no loaded shared object exports libzmq's "
                                           "API (pyzmq built without a shared libzmq?)");
        return -1;
    }
    if (self->peers) {
        PyErr_SetString(PyExc_RuntimeError, "ZmqIO: already initialised");
        return -1;
    }
    const Py_ssize_t world = PyList_GET_SIZE(peers);
    if (!(self->peers = PyMem_Calloc((size_t)(world ? world : 1), sizeof(void *)))
        || !(self->ends = PyMem_Calloc(POLL_BATCH, sizeof(int)))) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t r = 0; r < world; r++) {
        const unsigned long long h = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(peers, r));
        if (h == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        self->peers[r] = (void *)(uintptr_t)h;
    }
    self->world = world;
    if (!(self->idents = PyMem_Calloc((size_t)(world ? world : 1), sizeof(PyObject *)))
        || !(self->passed = PyMem_Calloc((size_t)(world ? world : 1), 1))
        || !(self->heard = PyMem_Calloc((size_t)(world ? world : 1), 1))
        || !(self->heard_at = PyMem_Calloc((size_t)(world ? world : 1), sizeof(double)))
        || !(self->sent_at = PyMem_Calloc((size_t)(world ? world : 1), sizeof(double)))) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t at = 0;
    while (PyDict_Next(identities, &at, &key, &value)) {
        const long r = PyLong_AsLong(value);
        if (r == -1 && PyErr_Occurred()) return -1;
        if (!PyBytes_Check(key) || r < 0 || r >= world) continue;
        Py_XSETREF(self->idents[r], Py_NewRef(key));
    }
    if (!self->pull_lock_ready && pulls_init(self) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->router = (void *)(uintptr_t)router;
    self->watch = (void *)(uintptr_t)watch;
    self->wake_fd = wake_fd;
    self->authenticated = authenticated;
    if (!self->router) { /* in-process mode: no sockets (the simulator's transport) */
        self->watch = NULL;
        self->router_fd = self->watch_fd = -1;
        return 0;
    }
    size_t len = sizeof(int);
    if (Z.getsockopt(self->router, Z_FD, &self->router_fd, &len) < 0
        || (self->watch && (len = sizeof(int),
                            Z.getsockopt(self->watch, Z_FD, &self->watch_fd, &len) < 0))) {
        zmq_failed("ZmqIO: zmq_getsockopt(ZMQ_FD)");
        return -1;
    }
    if (!self->watch) self->watch_fd = -1;
    self->router_idle = 0; /* not known: look before the first wait */
    return 0;
}

double zmq_io_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double now_s(void) { return zmq_io_now(); }

int zmq_send_msgs(void *peer, zmsg_t *m, int n) {
    for (int i = 0; i < n; i++) {
        if (Z.msg_send(&m[i], peer, i + 1 < n ? Z_SNDMORE : 0) < 0) {
            const int e = Z.errno_();
            for (int j = i; j < n; j++) Z.msg_close(&m[j]);
            return e ? e : EIO;
        }
    }
    return 0;
}

int zmq_send_pair(void *peer, zmsg_t *hm, zmsg_t *pm) {
    if (Z.msg_send(hm, peer, Z_SNDMORE) < 0) {
        const int e = Z.errno_();
        Z.msg_close(hm);
        Z.msg_close(pm);
        return e ? e : EIO;
    }
    if (Z.msg_send(pm, peer, 0) < 0) {
        const int e = Z.errno_();
        Z.msg_close(pm);
        return e ? e : EIO;
    }
    return 0;
}

int io_send_pair(ZmqIOObject *self, int64_t rank, zmsg_t *hm, zmsg_t *pm) {
    if (self->router) return zmq_send_pair(self->peers[rank], hm, pm);
    int e = 0;
    if (self->nout == self->outcap) {
        const Py_ssize_t cap = self->outcap ? 2 * self->outcap : 16;
        struct outgoing *grown = PyMem_RawRealloc(self->outbox, (size_t)cap * sizeof *grown);
        if (grown) {
            self->outbox = grown;
            self->outcap = cap;
        } else {
            e = ENOMEM;
        }
    }
    struct outgoing o = {.rank = rank};
    zmsg_t *m[2] = {hm, pm};
    for (int i = 0; i < 2 && !e; i++) {
        o.size[i] = Z.msg_size(m[i]);
        if (!(o.frame[i] = PyMem_RawMalloc(o.size[i] ? o.size[i] : 1))) e = ENOMEM;
        else memcpy(o.frame[i], Z.msg_data(m[i]), o.size[i]);
    }
    Z.msg_close(hm);
    Z.msg_close(pm);
    if (e) {
        PyMem_RawFree(o.frame[0]);
        PyMem_RawFree(o.frame[1]);
        return e;
    }
    self->outbox[self->nout++] = o;
    return 0;
}

/* In-process mode only: TypeError and 0 otherwise. */
static int in_process(ZmqIOObject *self, const char *what) {
    if (self->router || !self->peers) {
        PyErr_Format(PyExc_TypeError, "%s: only for a ZmqIO without sockets", what);
        return 0;
    }
    return 1;
}

/* route_queued() -> [(rank, [header, payload])]: see the method table. */
static PyObject *ZmqIO_route_queued(ZmqIOObject *self, PyObject *unused) {
    if (!in_process(self, "route_queued")) return NULL;
    if (self->directory) pulls_send(self);
    pulls_settle(self);
    PyObject *out = PyList_New(self->nout);
    for (Py_ssize_t i = 0; out && i < self->nout; i++) {
        const struct outgoing *o = &self->outbox[i];
        PyObject *item = Py_BuildValue("(L[y#y#])", (long long)o->rank, (const char *)o->frame[0],
                                       (Py_ssize_t)o->size[0], (const char *)o->frame[1],
                                       (Py_ssize_t)o->size[1]);
        if (!item) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, item);
    }
    for (Py_ssize_t i = 0; i < self->nout; i++) {
        PyMem_RawFree(self->outbox[i].frame[0]);
        PyMem_RawFree(self->outbox[i].frame[1]);
    }
    self->nout = 0;
    if (self->send_failed && out) { /* as poll's caller learns of it */
        Py_DECREF(out);
        PyErr_Format(PyExc_OSError, "route_queued: a call could not be sent (%d)",
                     self->send_failed);
        return NULL;
    }
    return out;
}

/* take_answer(rank, frames) -> bool: see the method table. */
static PyObject *ZmqIO_take_answer(ZmqIOObject *self, PyObject *args) {
    int rank;
    PyObject *frames;
    if (!PyArg_ParseTuple(args, "iO!", &rank, &PyList_Type, &frames)) return NULL;
    if (!in_process(self, "take_answer")) return NULL;
    if (!self->directory || PyList_GET_SIZE(frames) != 2 || rank < 0 || rank >= self->world
        || rank == self->rank)
        Py_RETURN_FALSE;
    Py_buffer b[2];
    if (PyObject_GetBuffer(PyList_GET_ITEM(frames, 0), &b[0], PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(PyList_GET_ITEM(frames, 1), &b[1], PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&b[0]);
        return NULL;
    }
    const wframe_t wf[2] = {{b[0].buf, (size_t)b[0].len}, {b[1].buf, (size_t)b[1].len}};
    const int taken = pulls_take_frames(self, wf, rank);
    PyBuffer_Release(&b[0]);
    PyBuffer_Release(&b[1]);
    pulls_settle(self);
    return PyBool_FromLong(taken);
}

static void close_parts(ZmqIOObject *self, Py_ssize_t from, Py_ssize_t to) {
    for (Py_ssize_t i = from; i < to; i++) Z.msg_close(&self->parts[i]);
}

static void ZmqIO_dealloc(ZmqIOObject *self) {
    pulls_free(self);
    if (self->idents)
        for (Py_ssize_t r = 0; r < self->world; r++) Py_XDECREF(self->idents[r]);
    PyMem_Free(self->idents);
    PyMem_Free(self->passed);
    PyMem_Free(self->heard);
    PyMem_Free(self->heard_at);
    PyMem_Free(self->sent_at);
    PyMem_RawFree(self->missing);
    Py_XDECREF(self->directory);
    PyMem_Free(self->peers);
    PyMem_Free(self->ends);
    PyMem_RawFree(self->parts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *zmq_failed(const char *what) {
    const int e = Z.errno_();
    PyErr_Format(PyExc_OSError, "%s: %s", what, Z.strerror(e));
    return NULL;
}

/* Room for one more frame in parts (growing outside the GIL: PyMem_Raw*). */
static int room(ZmqIOObject *self, Py_ssize_t n) {
    if (n < self->cap) return 0;
    const Py_ssize_t cap = self->cap ? 2 * self->cap : 1024;
    zmsg_t *grown = PyMem_RawRealloc(self->parts, (size_t)cap * sizeof(zmsg_t));
    if (!grown) return -1;
    self->parts = grown;
    self->cap = cap;
    return 0;
}

/* serve_owned(directory, rank): from now on, a peer's pulls, pushes and sets of keys all owned
 * here are served inside poll(), without Python (see try_fast). */
static PyObject *ZmqIO_serve_owned(ZmqIOObject *self, PyObject *args) {
    PyObject *directory;
    int rank;
    if (!PyArg_ParseTuple(args, "Oi", &directory, &rank)) return NULL;
    if (!directory_check(directory)) {
        PyErr_SetString(PyExc_TypeError, "serve_owned: directory must be a Directory");
        return NULL;
    }
    if (rank < 0 || rank >= self->world) {
        PyErr_SetString(PyExc_ValueError, "serve_owned: rank out of range");
        return NULL;
    }
    self->rank = rank;
    Py_XSETREF(self->directory, Py_NewRef(directory));
    Py_RETURN_NONE;
}

/* wake() -> None: see the method table. */
static PyObject *ZmqIO_wake(ZmqIOObject *self, PyObject *unused) {
    const uint64_t one = 1;
    /* Holding the GIL: a write to a non-blocking eventfd never waits (EAGAIN: a wake-up is
     * pending already). os.eventfd_write let the GIL go, and the engine thread it woke took
     * it: the worker then waited for the engine's pass (~100 us a wake-up on 2 nodes). */
    if (write(self->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* A list of n floats (one per rank). */
static PyObject *floats_by_rank(const double *at, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t r = 0; out && r < n; r++) {
        PyObject *v = PyFloat_FromDouble(at[r]);
        if (!v) Py_CLEAR(out);
        else PyList_SET_ITEM(out, r, v);
    }
    return out;
}

/* sent_at() -> [seconds]: see the method table. */
static PyObject *ZmqIO_sent_at(ZmqIOObject *self, PyObject *unused) {
    return floats_by_rank(self->sent_at, self->world);
}

/* heard_at() -> [seconds]: see the method table. */
static PyObject *ZmqIO_heard_at(ZmqIOObject *self, PyObject *unused) {
    return floats_by_rank(self->heard_at, self->world);
}

/* counters() -> {name: count} of the fast path (traffic names, added to the transport's). */
static PyObject *ZmqIO_counters(ZmqIOObject *self, PyObject *unused) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int i = 0; i < FAST_COUNTERS; i++) {
        PyObject *v = PyLong_FromLongLong(self->counts[i]);
        if (!v || PyDict_SetItemString(d, counter_names[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

/* Receives what waits at the router: up to POLL_BATCH messages for Python (their frames in
 * parts, *nmsg of them, self->ends), those a fast path takes served and closed at once
 * (try_fast). Sets router_idle when it stopped because nothing more was there: it asked libzmq
 * (a receive without waiting, or ZMQ_EVENTS), which processes the socket's commands and so
 * resets its edge-triggered ZMQ_FD, after which a wait on that descriptor cannot miss a message.
 * A receive that finds a message costs no system call; the look that finds none costs libzmq a
 * poll() and a getpid(). Without the GIL. */
static void receive(ZmqIOObject *self, int fast, int *nmsg, Py_ssize_t *nparts, int *failed) {
    self->router_idle = 0;
    for (int taken = 0; *nmsg < POLL_BATCH && taken < 4 * POLL_BATCH; taken++) {
        if (taken) { /* the first is asked for by receiving it; the others: ask first */
            int ev = 0;
            size_t len = sizeof ev;
            if (Z.getsockopt(self->router, Z_EVENTS, &ev, &len) < 0) {
                *failed = 1;
                return;
            }
            if (!(ev & Z_POLLIN)) {
                self->router_idle = 1;
                return;
            }
        }
        int more = 1, flags = Z_DONTWAIT;
        const Py_ssize_t first = *nparts;
        while (more) {
            if (room(self, *nparts) < 0) {
                *failed = 2;
                break;
            }
            Z.msg_init(&self->parts[*nparts]);
            if (Z.msg_recv(&self->parts[*nparts], self->router, flags) < 0) {
                Z.msg_close(&self->parts[*nparts]);
                /* EAGAIN on a first frame: nothing there (the commands were processed);
                 * otherwise a failure (a message's frames come together or not at all) */
                if (*nparts == first && Z.errno_() == EAGAIN) self->router_idle = 1;
                else *failed = 1;
                break;
            }
            more = Z.msg_more(&self->parts[*nparts]);
            (*nparts)++;
            flags = 0;
        }
        if (more || *nparts == first) { /* cut short: drop what came of it */
            for (Py_ssize_t i = first; i < *nparts; i++) Z.msg_close(&self->parts[i]);
            *nparts = first;
            return;
        }
        if (fast && try_fast(self, first, *nparts)) { /* served: nothing for Python */
            close_parts(self, first, *nparts);
            *nparts = first;
            continue;
        }
        self->ends[(*nmsg)++] = (int)*nparts;
    }
}

/* Whether the handshake monitor has something for Python (its ZMQ_FD is edge-triggered too: its
 * events are asked for, which resets the descriptor). */
static int watch_ready(ZmqIOObject *self, int *failed) {
    int ev = 0;
    size_t len = sizeof ev;
    if (Z.getsockopt(self->watch, Z_EVENTS, &ev, &len) < 0) {
        *failed = 1;
        return 0;
    }
    return (ev & Z_POLLIN) != 0;
}

/* poll(timeout_ms, hold=False) -> (events, received, heard). events: bit 0 the eventfd was
 * written (and is read now), bit 1 the handshake monitor has something, bit 2 a SYNC was served
 * here (serve_sync). received: per ZeroMQ message, (sender rank or -1, connection identity bytes,
 * messages or None, why or None, wire bytes): messages as wire_decode parses them (None with why
 * when the framing is bad). heard: the ranks whose messages were served here (serve_owned), for
 * the failure detector. hold: a peer's SYNC served here is no reason to return, nor an answer
 * to this node's round taken in while others are outstanding (the one that leaves none is), as
 * a served pull never is.
 *
 * It waits with poll() on the sockets' ZMQ_FDs and the eventfds itself rather than through
 * zmq_poll, which asks each socket's events before and after every wait (a poll() and a
 * getpid() each, in libzmq): a served 1-key pull cost its engine thread 7 poll() and 7 getpid()
 * calls that way (strace, bench/engine.py's small messages), 3 and 3 this way. */
static PyObject *ZmqIO_poll(ZmqIOObject *self, PyObject *args) {
    long timeout;
    int hold = 0;
    if (!PyArg_ParseTuple(args, "l|p", &timeout, &hold)) return NULL;
    if (!self->router) {
        PyErr_SetString(PyExc_TypeError, "poll: a ZmqIO without sockets (route_queued)");
        return NULL;
    }
    drain_released();
    pulls_settle(self);
    /* The router, the eventfd the engine loop is woken by, workers' pulls (zmq_calls.c), and
     * the handshake monitor if any. */
    struct pollfd fds[4] = {{self->router_fd, POLLIN, 0}, {self->wake_fd, POLLIN, 0},
                            {self->pull_fd, POLLIN, 0}, {self->watch_fd, POLLIN, 0}};
    const int nfds = self->watch ? 4 : 3;
    int nmsg = 0, failed = 0, events = 0, perr = 0;
    Py_ssize_t nparts = 0;
    const int fast = self->directory != NULL;
    if (fast) {
        memset(self->passed, 0, (size_t)self->world);
        memset(self->heard, 0, (size_t)self->world);
    }
    self->synced = self->answered = 0;
    /* Requests served here need nothing of Python: go on waiting (the time left) until
     * something does, so that the engine loop does not run a pass per served request. */
    const double deadline = timeout >= 0 ? now_s() + timeout / 1000.0 : 0.0;
    Py_BEGIN_ALLOW_THREADS
    if (fast) pulls_send(self); /* workers' pulls queued since the last poll */
    if (self->watch && watch_ready(self, &failed)) events |= 2;
    for (;;) {
        if (!self->router_idle && !failed) receive(self, fast, &nmsg, &nparts, &failed);
        /* A served SYNC leaves NodeState work (Directory.native_taken: keys that arrived or
         * left, moves held for other peers): not worth waiting on, unless the caller holds
         * (its round is open, and nothing waits for keys to arrive: the work can wait for the
         * round's answer). */
        if (nmsg || events || failed || self->send_failed || pulls_handed(self)
            || (self->synced && !(hold && !self->answered)))
            break;
        long wait = -1;
        if (!self->router_idle) { /* a full batch was served: more may wait, the router is */
            wait = 0;             /* asked again after a look at the rest, without waiting */
        } else if (timeout >= 0) {
            const double left = deadline - now_s();
            wait = left > 0 ? (long)(left * 1000.0 + 0.999) : 0;
        }
        for (int i = 0; i < nfds; i++) fds[i].revents = 0;
        const int rc = poll(fds, (nfds_t)nfds, wait > INT32_MAX ? INT32_MAX : (int)wait);
        if (rc < 0) {
            perr = errno;
            break;
        }
        if (fds[1].revents & POLLIN) {
            uint64_t count;
            if (read(self->wake_fd, &count, sizeof count) < 0) { /* EAGAIN: taken already */
            }
            events |= 1;
        }
        if (fast && fds[2].revents & POLLIN) pulls_send(self); /* nothing for Python */
        if (nfds == 4 && fds[3].revents & POLLIN && watch_ready(self, &failed)) events |= 2;
        if (fds[0].revents & POLLIN) self->router_idle = 0;
        if (!rc && self->router_idle && wait >= 0 && deadline - now_s() <= 0)
            break; /* the time is up */
    }
    Py_END_ALLOW_THREADS
    pulls_settle(self);
    if (self->synced) events |= 4;
    if (fast) { /* the failure detector's: read at its looks (heard_at), not per message */
        double t = 0.0;
        for (Py_ssize_t r = 0; r < self->world; r++)
            if (self->heard[r]) self->heard_at[r] = t ? t : (t = now_s());
    }
    if (perr) {
        close_parts(self, 0, nparts);
        if (perr == EINTR && !nmsg) return Py_BuildValue("(i[][])", events);
        errno = perr;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (self->send_failed) {
        const int e = self->send_failed;
        self->send_failed = 0;
        close_parts(self, 0, nparts);
        if (e == -2)
            PyErr_Format(PyExc_RuntimeError, "serving a SYNC or taking an answer: %s", self->fatal);
        else if (e < 0)
            PyErr_SetString(PyExc_RuntimeError, "keys owned here vanished while served");
        else
            PyErr_Format(PyExc_OSError, "sending an answer: %s", Z.strerror(e));
        return NULL;
    }
    if (failed == 2) {
        close_parts(self, 0, nparts);
        return PyErr_NoMemory();
    }
    if (failed && !nmsg) return zmq_failed("zmq_msg_recv");
    PyObject *out = PyList_New(nmsg);
    if (!out) {
        close_parts(self, 0, nparts);
        return NULL;
    }
    Py_ssize_t at = 0;
    for (int m = 0; m < nmsg; m++) {
        const Py_ssize_t end = self->ends[m];
        PyObject *identity = NULL, *frames = NULL, *item = NULL;
        if (!(identity = PyBytes_FromStringAndSize(Z.msg_data(&self->parts[at]),
                                                   (Py_ssize_t)Z.msg_size(&self->parts[at])))
            || !(frames = PyList_New(end - at - 1)))
            goto fail;
        const long rank = sender_of(self, &self->parts[at], &self->parts[end - 1]);
        for (Py_ssize_t i = at + 1; i < end; i++) { /* the frames move into Frame objects */
            FrameObject *f = PyObject_New(FrameObject, &FrameType);
            if (!f) goto fail;
            Z.msg_init(&f->msg);
            Z.msg_move(&f->msg, &self->parts[i]); /* parts[i] is empty now: closing it is a no-op */
            f->exports = 0;
            PyList_SET_ITEM(frames, i - at - 1, (PyObject *)f);
        }
        PyObject *parsed = wire_decode_list(frames);
        if (!parsed) goto fail;
        Py_ssize_t wire = 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(frames); i++)
            wire += (Py_ssize_t)Z.msg_size(&((FrameObject *)PyList_GET_ITEM(frames, i))->msg);
        item = Py_BuildValue("(lOOOn)", rank, identity, PyTuple_GET_ITEM(parsed, 0),
                             PyTuple_GET_ITEM(parsed, 1), wire);
        Py_DECREF(parsed);
        if (!item) goto fail;
        PyList_SET_ITEM(out, m, item);
        Py_DECREF(identity);
        Py_DECREF(frames);
        close_parts(self, at, end);
        at = end;
        continue;
    fail:
        Py_XDECREF(identity);
        Py_XDECREF(frames);
        close_parts(self, at, nparts);
        Py_DECREF(out);
        return NULL;
    }
    PyObject *heard = PyList_New(0);
    if (!heard) {
        Py_DECREF(out);
        return NULL;
    }
    for (Py_ssize_t r = 0; fast && r < self->world; r++)
        if (self->heard[r]) {
            PyObject *v = PyLong_FromSsize_t(r);
            if (!v || PyList_Append(heard, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(heard);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(v);
        }
    return Py_BuildValue("(iNN)", events, out, heard);
}

/* Sends one frame: bytes-like objects of fewer than 64 KiB copied, larger ones (the arrays
 * wire_encode leaves in frames of their own) handed to libzmq as they are. */
static int send_frame(void *sock, PyObject *obj, int flags, Py_ssize_t *bytes) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    *bytes += view.len;
    zmsg_t msg;
    if (view.len >= WIRE_OWN_FRAME_BYTES) {
        released_t *r = PyMem_RawMalloc(sizeof *r);
        if (!r) {
            PyBuffer_Release(&view);
            PyErr_NoMemory();
            return -1;
        }
        r->view = view; /* released by drain_released once libzmq is done with it */
        if (Z.msg_init_data(&msg, view.buf, (size_t)view.len, on_sent, r) < 0) {
            PyBuffer_Release(&r->view);
            PyMem_RawFree(r);
            zmq_failed("zmq_msg_init_data");
            return -1;
        }
    } else {
        if (Z.msg_init_size(&msg, (size_t)view.len) < 0) {
            PyBuffer_Release(&view);
            zmq_failed("zmq_msg_init_size");
            return -1;
        }
        memcpy(Z.msg_data(&msg), view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
    }
    if (Z.msg_send(&msg, sock, flags) < 0) {
        Z.msg_close(&msg); /* the release, if any, runs through on_sent */
        zmq_failed("zmq_msg_send");
        return -1;
    }
    return 0;
}

/* send_frames(dst, frames) -> wire bytes: a message encoded already (a list of buffers: headers,
 * payload, own frames) to peer dst as one ZeroMQ message. OSError if libzmq refuses. */
static PyObject *ZmqIO_send_frames(ZmqIOObject *self, PyObject *args) {
    Py_ssize_t dst;
    PyObject *frames;
    if (!PyArg_ParseTuple(args, "nO!", &dst, &PyList_Type, &frames)) return NULL;
    if (dst < 0 || dst >= self->world || !self->peers[dst] || !self->router) {
        PyErr_Format(PyExc_KeyError, "no connection to rank %zd", dst);
        return NULL;
    }
    drain_released();
    const Py_ssize_t n = PyList_GET_SIZE(frames);
    Py_ssize_t wire = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (send_frame(self->peers[dst], PyList_GET_ITEM(frames, i), i + 1 < n ? Z_SNDMORE : 0,
                       &wire) < 0)
            return NULL;
    return PyLong_FromSsize_t(wire);
}

/* send_round(parts) -> wire bytes: a round's messages, encoded already ((dst, frames) tuples),
 * each to its peer as one ZeroMQ message, in order; when each peer was last sent something
 * (sent_at) follows. KeyError for a rank without a connection (nothing sent: all are checked
 * first), OSError if libzmq refuses. */
static PyObject *ZmqIO_send_round(ZmqIOObject *self, PyObject *args) {
    PyObject *parts;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &parts)) return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(parts);
    for (Py_ssize_t p = 0; p < n; p++) {
        PyObject *part = PyList_GET_ITEM(parts, p);
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 2
            || !PyLong_Check(PyTuple_GET_ITEM(part, 0))
            || !PyList_Check(PyTuple_GET_ITEM(part, 1))) {
            PyErr_SetString(PyExc_TypeError, "send_round: a list of (dst, frames) tuples");
            return NULL;
        }
        const Py_ssize_t dst = PyLong_AsSsize_t(PyTuple_GET_ITEM(part, 0));
        if (dst == -1 && PyErr_Occurred()) return NULL;
        if (dst < 0 || dst >= self->world || !self->peers[dst] || !self->router) {
            PyErr_Format(PyExc_KeyError, "no connection to rank %zd", dst);
            return NULL;
        }
    }
    drain_released();
    Py_ssize_t wire = 0;
    const double now = now_s();
    for (Py_ssize_t p = 0; p < n; p++) {
        PyObject *part = PyList_GET_ITEM(parts, p);
        const Py_ssize_t dst = PyLong_AsSsize_t(PyTuple_GET_ITEM(part, 0));
        PyObject *frames = PyTuple_GET_ITEM(part, 1);
        const Py_ssize_t nf = PyList_GET_SIZE(frames);
        for (Py_ssize_t i = 0; i < nf; i++)
            if (send_frame(self->peers[dst], PyList_GET_ITEM(frames, i),
                           i + 1 < nf ? Z_SNDMORE : 0, &wire) < 0)
                return NULL;
        self->sent_at[dst] = now;
    }
    return PyLong_FromSsize_t(wire);
}

/* send(dst, specs) -> (sizes, wire bytes): the messages (wire_encode's specs) to peer dst as one
 * ZeroMQ message. OSError if libzmq refuses (the caller names the peer). */
static PyObject *ZmqIO_send(ZmqIOObject *self, PyObject *args) {
    Py_ssize_t dst;
    PyObject *specs;
    if (!PyArg_ParseTuple(args, "nO", &dst, &specs)) return NULL;
    if (dst < 0 || dst >= self->world || !self->peers[dst] || !self->router) {
        PyErr_Format(PyExc_KeyError, "no connection to rank %zd", dst);
        return NULL;
    }
    drain_released();
    PyObject *encoded = wire_encode_list(specs);
    if (!encoded) return NULL;
    PyObject *frames = PyTuple_GET_ITEM(encoded, 0);
    const Py_ssize_t n = PyList_GET_SIZE(frames);
    Py_ssize_t wire = 0; /* bytes on the wire: every frame's */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (send_frame(self->peers[dst], PyList_GET_ITEM(frames, i), i + 1 < n ? Z_SNDMORE : 0,
                       &wire) < 0) {
            Py_DECREF(encoded);
            return NULL;
        }
    }
    PyObject *r = Py_BuildValue("(On)", PyTuple_GET_ITEM(encoded, 1), wire);
    Py_DECREF(encoded);
    return r;
}

static PyMethodDef ZmqIO_methods[] = {
    {"poll", (PyCFunction)ZmqIO_poll, METH_VARARGS,
     "poll(timeout_ms, hold=False) -> (events, received, heard). Blocks up to timeout_ms (GIL "
     "released) until a message, a wake-up or a monitor event; receives up to 256 waiting "
     "messages. hold: a SYNC served here does not end the wait, nor an answer taken in while "
     "others of this node's round are outstanding (the last one does). "
     "events: bit 0 woken through the eventfd (read now), bit 1 the monitor socket is "
     "readable, bit 2 a SYNC was served here (Directory.native_taken has its aftermath). "
     "received: per message (sender rank or -1, identity, messages or None, why or None, "
     "wire bytes). heard: ranks whose requests poll served itself (serve_owned)."},
    {"serve_owned", (PyCFunction)ZmqIO_serve_owned, METH_VARARGS,
     "serve_owned(directory, rank) -> None. From now on poll() serves a peer's pulls, pushes "
     "and sets of keys all owned here itself (checks, store, answer), without Python; and "
     "its SYNCs, while the directory allows (Directory.serve_syncs)."},
    {"pull", (PyCFunction)ZmqIO_pull, METH_VARARGS,
     "pull(keys, positions, out, row) -> PullCall or None. A worker's pull of keys (int64) not "
     "held here a moment ago, at ascending positions of its batch (int64), into out (float32 "
     "rows of row floats, writable; row p at p * row), served without the engine loop "
     "(native/zmq_calls.c): the engine thread routes it inside poll, serves what arrived "
     "meanwhile, asks the owners and fills out from their answers. None where it cannot (no "
     "directory, an unusual request). Any thread, with the GIL; never blocks. Wait on the "
     "call (PullCall.wait); keys, positions and out must not change until it ends."},
    {"push", (PyCFunction)ZmqIO_push, METH_VARARGS,
     "push(keys, positions, rows, row, worker, clock) -> PullCall or None. A worker's push of "
     "keys (int64) not held here a moment ago, at ascending positions of its batch (int64), "
     "rows (float32, row floats per key, in the order of keys), sent without the engine loop "
     "(native/zmq_calls.c): the engine thread routes it inside poll, adds the rows of keys "
     "that arrived meanwhile here, sends one PUSH per owner and takes their ACKs in; a push "
     "routing cannot take goes to the engine loop (handoffs). Copies its arrays (the caller "
     "may reuse them at once). None where it cannot (no directory, an unusual request). Any "
     "thread, with the GIL; never blocks. PullCall.wait says when it is acknowledged."},
    {"handoffs", (PyCFunction)ZmqIO_handoffs, METH_NOARGS,
     "handoffs() -> [(call, keys, positions, rows, worker, clock)]: pushes of ZmqIO.push that "
     "routing could not take (a key on its way here, one whose intent this node reported and "
     "whose owner has not answered): the engine loop submits them and completes each call "
     "(complete). keys, positions (int64) and rows (float32) as bytes. Engine thread; "
     "poll returns when there are some."},
    {"complete", (PyCFunction)ZmqIO_complete, METH_VARARGS,
     "complete(call, error) -> None. The engine loop finished a push that handoffs gave it: "
     "error None (done) or the exception its worker is to raise (failed). Until then the "
     "workers' pulls take the engine loop's path (one could miss the push). Engine thread."},
    {"pushed_here", (PyCFunction)ZmqIO_pushed_here, METH_NOARGS,
     "pushed_here() -> int. Keys of pushes of ZmqIO.push that were added to here: they had "
     "arrived by the time the engine routed the push (their workers counted them as remote). "
     "Any thread."},
    {"native_answer", (PyCFunction)ZmqIO_native_answer, METH_VARARGS,
     "native_answer(kind, req_id, src, arrays, text, apply) -> None, a reason (str) or "
     "False. An answer to a pull of ZmqIO.pull or a push of ZmqIO.push that reached the "
     "engine loop (a PULL_RESP or ACK, an ERROR with text, a FORWARDED notice): checked "
     "(apply false: None if fit, else why) or taken in (apply true). False: no such call is "
     "open (a late answer). Engine thread."},
    {"fail_native", (PyCFunction)ZmqIO_fail_native, METH_O,
     "fail_native(text) -> None. Every pull and push of ZmqIO.pull and ZmqIO.push still "
     "queued, open or handed fails with text (the engine stopped); their waiters wake."},
    {"wake", (PyCFunction)ZmqIO_wake, METH_NOARGS,
     "wake() -> None. Makes a blocked poll() return now, as os.eventfd_write on its eventfd "
     "would, without letting the GIL go. Any thread; never blocks."},
    {"sent_at", (PyCFunction)ZmqIO_sent_at, METH_NOARGS,
     "sent_at() -> [seconds] by rank: when poll last sent that peer something itself (an "
     "answer it served, a worker's pull or push; a round's SYNCs, send_round), on "
     "time.monotonic's clock; 0.0: never. "
     "For the failure detector: such a message spares the peer a heartbeat."},
    {"route_queued", (PyCFunction)ZmqIO_route_queued, METH_NOARGS,
     "route_queued() -> [(rank, [header, payload])]. Without sockets (router 0: the "
     "simulator's in-process transport) only: routes the workers' pulls and pushes queued "
     "since (as poll does first), and returns what they send, in order, for the caller to "
     "deliver. With the GIL."},
    {"take_answer", (PyCFunction)ZmqIO_take_answer, METH_VARARGS,
     "take_answer(rank, frames) -> bool. Without sockets only: a wire message from rank "
     "(its frames, buffers) taken in if it answers pulls or pushes of this object only (as "
     "poll takes them before serve_wire's fast paths); False: the caller serves it as any "
     "other. With the GIL."},
    {"counters", (PyCFunction)ZmqIO_counters, METH_NOARGS,
     "counters() -> dict. What poll() served itself, in the transport's counter names."},
    {"heard_at", (PyCFunction)ZmqIO_heard_at, METH_NOARGS,
     "heard_at() -> [seconds] by rank: when poll last served a message of that peer itself "
     "(the ranks poll returns as heard), on time.monotonic's clock; 0.0: never. For the "
     "failure detector, which reads it when it looks rather than per message."},
    {"send_frames", (PyCFunction)ZmqIO_send_frames, METH_VARARGS,
     "send_frames(dst, frames) -> wire bytes. A message encoded already (Directory.round_build's "
     "SYNCs): its frames (buffers; large ones sent without copying) to peer dst as one ZeroMQ "
     "message. KeyError without a connection to dst, OSError if libzmq refuses."},
    {"send_round", (PyCFunction)ZmqIO_send_round, METH_VARARGS,
     "send_round(parts) -> wire bytes. A round's SYNCs (Directory.round_build's): parts, a list "
     "of (dst, frames) tuples, each sent as send_frames sends it, in order, in one call; "
     "sent_at() follows. KeyError (nothing sent) for a rank without a connection, OSError if "
     "libzmq refuses."},
    {"send", (PyCFunction)ZmqIO_send, METH_VARARGS,
     "send(dst, specs) -> (sizes, wire_bytes). Encodes specs (see wire_encode) and sends them "
     "to rank dst as one ZeroMQ message, without blocking."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ZmqIOType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adapm._native.ZmqIO",
    .tp_basicsize = sizeof(ZmqIOObject),
    .tp_dealloc = (destructor)ZmqIO_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ZmqIO(router, wake_fd, watch, peers, identities, authenticated): a node's "
              "receive and send over pyzmq's sockets' libzmq handles (see native/zmq_io.c). "
              "router, watch (0: none) and peers (by rank, 0 for this node) are "
              "Socket.underlying values; identities maps connection identities to ranks. For "
              "one thread (the sockets' owner).",
    .tp_methods = ZmqIO_methods,
    .tp_init = (initproc)ZmqIO_init,
    .tp_new = PyType_GenericNew,
};

int register_zmq_io_type(PyObject *module) {
    if (add_type(module, &FrameType, "Frame") < 0 || register_pull_call_type(module) < 0)
        return -1;
    return add_type(module, &ZmqIOType, "ZmqIO");
}
