/* What the ZeroMQ I/O files share: zmq_io.c (libzmq reached through pyzmq's, received frames,
 * the ZmqIO type: poll and send), zmq_serve.c (a received message handed to the fast paths of
 * serve_wire.h inside poll, its answer sent with libzmq) and zmq_calls.c (a worker's pull or
 * push of keys held elsewhere, sent and answered inside poll). Engine thread only, as the
 * sockets are, except where zmq_calls.c says otherwise. */
#ifndef ADAPM_ZMQ_IO_H
#define ADAPM_ZMQ_IO_H

#include <pthread.h>

#include "module.h"
#include "serve_wire.h"
#include "wire.h"

/* libzmq's ABI (zmq.h, stable since 4.x). */
typedef struct {
    _Alignas(void *) unsigned char _[64];
} zmsg_t;
#define Z_POLLIN 1
#define Z_DONTWAIT 1
#define Z_SNDMORE 2
#define Z_EVENTS 15
#define Z_FD 14
typedef void(zfree_fn)(void *data, void *hint);

typedef struct {
    int (*msg_init)(zmsg_t *);
    int (*msg_init_size)(zmsg_t *, size_t);
    int (*msg_init_data)(zmsg_t *, void *, size_t, zfree_fn *, void *);
    int (*msg_recv)(zmsg_t *, void *, int);
    int (*msg_send)(zmsg_t *, void *, int);
    int (*msg_close)(zmsg_t *);
    int (*msg_move)(zmsg_t *, zmsg_t *);
    void *(*msg_data)(zmsg_t *);
    size_t (*msg_size)(const zmsg_t *);
    int (*msg_more)(const zmsg_t *);
    const char *(*msg_gets)(const zmsg_t *, const char *);
    int (*getsockopt)(void *, int, void *, size_t *);
    int (*errno_)(void);
    const char *(*strerror)(int);
} zapi_t;
extern zapi_t Z; /* zmq_io.c: bound to the process's libzmq by load_libzmq */

typedef struct {
    PyObject_HEAD
    void *router, *watch;
    int router_fd, watch_fd; /* their ZMQ_FD (edge-triggered: see wait in zmq_io.c) */
    int router_idle;         /* the last look at the router found nothing to receive (its
                              * commands processed): poll() may wait on router_fd */
    int wake_fd;
    int authenticated;
    Py_ssize_t world;
    void **peers;          /* by rank; NULL: no connection (this node) */
    zmsg_t *parts;         /* receive scratch: frames of up to POLL_BATCH messages */
    Py_ssize_t cap;
    int *ends;             /* per message: index after its last frame in parts */
    /* The owner's fast path (serve_owned): */
    PyObject *directory;   /* the node's Directory; NULL: off */
    int32_t rank;
    PyObject **idents;     /* by rank: the identity its connection names (bytes; no auth) */
    uint8_t *passed;       /* by rank, per poll: a message of it went to Python (order) */
    uint8_t *heard;        /* by rank, per poll: a message of it was served here */
    double *heard_at;      /* by rank: when a poll last served a message of it (heard_at()) */
    double *sent_at;       /* by rank: when this object last sent it something itself (an
                            * answer served here, a worker's pull or push; CLOCK_MONOTONIC
                            * seconds, 0: never), for the failure detector's heartbeats */
    int64_t *missing;      /* scratch for the store calls */
    int64_t missing_cap;
    int send_failed;       /* errno of a fast answer libzmq refused (0: none; -1 keys vanished,
                            * -2 a served SYNC failed: fatal says why) */
    const char *fatal;
    int synced;            /* a SYNC was served, or an answer taken, in this poll: Python
                            * has things to take up */
    int answered;          /* an answer to this node's round was taken in this poll */
    int64_t counts[FAST_COUNTERS];
    /* A worker's pulls and pushes without Python (zmq_calls.c): */
    int pull_fd;                     /* eventfd: a call was queued (-1: none yet) */
    pthread_mutex_t pull_lock;       /* guards the queue: workers append, the engine takes */
    int pull_lock_ready;
    struct PullCallObject **queue, **taking, **open, **finished, **handed;
    Py_ssize_t nqueue, qcap, ntaking, tcap, nopen, ocap, nfinished, fcap, nhanded, hcap;
    int64_t next_req;
    int64_t *hop;                    /* routing scratch */
    int64_t hop_cap;
    int64_t pushed_here;             /* keys of pushes applied here: they had arrived (any
                                      * thread reads it; the engine thread adds) */
    int64_t handed_open;             /* pushes handed to the engine loop, not completed yet */
    /* In-process mode (no sockets: router NULL; the simulator's transport): what the calls
     * send waits here, as (rank, frame, frame), until ZmqIO.route_queued hands it over. */
    struct outgoing *outbox;
    Py_ssize_t nout, outcap;
} ZmqIOObject;

/* One wire message a call sent in in-process mode: its two frames, copied (PyMem_Raw). */
struct outgoing {
    int64_t rank;
    void *frame[2];
    size_t size[2];
};

/* zmq_io.c */
/* The rank whose connection sent the message whose routing id is id and last frame last, or
 * -1 (see there). */
int sender_of(ZmqIOObject *self, zmsg_t *id, zmsg_t *last);
/* Seconds on CLOCK_MONOTONIC (Python's time.monotonic). */
double zmq_io_now(void);
/* Sends a wire message of a header frame hm and a payload frame pm to peer (libzmq owns them
 * after, sent or not): 0, or an errno. */
int zmq_send_pair(void *peer, zmsg_t *hm, zmsg_t *pm);
/* Sends a wire message of the n frames m[0..n) to peer (libzmq owns them after, sent or not):
 * 0, or an errno. */
int zmq_send_msgs(void *peer, zmsg_t *m, int n);

/* zmq_serve.c */
/* Serves the ZeroMQ message in parts[first..end) inside poll if a fast path takes it: a
 * worker's pull answered (zmq_calls.c), or what serve_wire.h serves (a peer's pulls, pushes and
 * sets of keys owned here; a SYNC answered here; an answer to this node's round request taken
 * in): 1 if so (the caller closes the parts), 0 if Python is to take it. Without the GIL. */
int try_fast(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end);
/* The frames parts[first..end) as wframe_t (at most max): their number, or -1 if more. */
int zmq_frames(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end, wframe_t *f, int max);

/* zmq_io.c: sends the two frames hm, pm to peer rank (libzmq owns them after, sent or not):
 * over its connection, or in in-process mode into the outbox. 0, or an errno. */
int io_send_pair(ZmqIOObject *self, int64_t rank, zmsg_t *hm, zmsg_t *pm);

/* zmq_calls.c: a worker's pull or push of keys not held here, without Python: queued by the
 * worker (ZmqIO.pull, ZmqIO.push), routed and sent by the engine thread inside poll
 * (pulls_send), answered there (pulls_take_answer, in the place of try_fast), the worker woken;
 * a push the engine loop must route is handed to it (ZmqIO.handoffs; pulls_handed says there
 * is one). pulls_init/pulls_free with the object; pulls_settle drops the references of finished
 * calls (with the GIL). */
int pulls_init(ZmqIOObject *self);
void pulls_free(ZmqIOObject *self);
void pulls_send(ZmqIOObject *self);
int pulls_take_answer(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end, int rank);
/* The same for a wire message of two frames (header, payload) from rank: 1 if taken. */
int pulls_take_frames(ZmqIOObject *self, const wframe_t *wf, int rank);
void pulls_settle(ZmqIOObject *self);
static inline int pulls_handed(const ZmqIOObject *self) { return self->nhanded > 0; }
int register_pull_call_type(PyObject *module);
PyObject *ZmqIO_pull(ZmqIOObject *self, PyObject *args);
PyObject *ZmqIO_push(ZmqIOObject *self, PyObject *args);
PyObject *ZmqIO_handoffs(ZmqIOObject *self, PyObject *unused);
PyObject *ZmqIO_complete(ZmqIOObject *self, PyObject *args);
PyObject *ZmqIO_pushed_here(ZmqIOObject *self, PyObject *unused);
PyObject *ZmqIO_native_answer(ZmqIOObject *self, PyObject *args);
PyObject *ZmqIO_fail_native(ZmqIOObject *self, PyObject *arg);

#endif
