/* The fast paths inside ZmqIO.poll (zmq_io.h): a received ZeroMQ message handed to the
 * transport-independent ones (serve_wire.h) with libzmq's frames, its answer sent on the
 * peer's connection; or a worker's pull answered (zmq_calls.c). */
#include "zmq_io.h"

#define ZMQ_FRAMES_MAX 128 /* frames of a message the fast paths look at */

/* An answer as two or three libzmq messages, sent on the peer's connection (libzmq owns them
 * after). */
typedef struct {
    wsink_t sink;
    zmsg_t m[3];
    int nm;
    void *peer;
    int sent; /* an answer went out */
} zmq_sink_t;

static void free_own(void *data, void *hint) { free(data); } /* libzmq's, once sent */

static int zmq_open(wsink_t *sink, size_t hsize, size_t psize, void *own, size_t own_bytes,
                    uint8_t **h, uint8_t **p) {
    zmq_sink_t *z = (zmq_sink_t *)sink;
    if (own && Z.msg_init_data(&z->m[2], own, own_bytes, free_own, NULL) < 0) {
        free(own);
        return -1;
    }
    const int head = Z.msg_init_size(&z->m[0], hsize) == 0;
    if (!head || Z.msg_init_size(&z->m[1], psize) < 0) {
        if (head) Z.msg_close(&z->m[0]);
        if (own) Z.msg_close(&z->m[2]); /* frees own */
        return -1;
    }
    z->nm = own ? 3 : 2;
    *h = Z.msg_data(&z->m[0]);
    *p = Z.msg_data(&z->m[1]);
    return 0;
}

static int zmq_send(wsink_t *sink) {
    zmq_sink_t *z = (zmq_sink_t *)sink;
    const int e = zmq_send_msgs(z->peer, z->m, z->nm);
    z->sent = !e;
    return e;
}

int zmq_frames(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end, wframe_t *f, int max) {
    const Py_ssize_t nf = end - first;
    if (nf > max) return -1;
    for (Py_ssize_t i = 0; i < nf; i++) {
        f[i].p = Z.msg_data(&self->parts[first + i]);
        f[i].n = Z.msg_size(&self->parts[first + i]);
    }
    return (int)nf;
}

int try_fast(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end) {
    if (end - first < 3) return 0;
    const int rank = sender_of(self, &self->parts[first], &self->parts[end - 1]);
    if (rank < 0 || rank == self->rank || !self->peers[rank]) return 0;
    if (!self->passed[rank]) {
        if (pulls_take_answer(self, first, end, rank)) return 1;
        wframe_t f[ZMQ_FRAMES_MAX];
        const int nf = zmq_frames(self, first + 1, end, f, ZMQ_FRAMES_MAX);
        if (nf > 0) {
            wserve_t s = {.directory = self->directory, .rank = self->rank,
                          .counts = self->counts, .missing = self->missing,
                          .missing_cap = self->missing_cap};
            zmq_sink_t sink = {.sink = {zmq_open, zmq_send}, .peer = self->peers[rank]};
            const int served = wire_serve(&s, &sink.sink, rank, f, nf);
            self->missing = s.missing;
            self->missing_cap = s.missing_cap;
            if (s.failed && !self->send_failed) {
                self->send_failed = s.failed;
                self->fatal = s.fatal;
            }
            if (s.synced) self->synced = 1;
            if (s.answered) self->answered = 1;
            if (served) {
                self->heard[rank] = 1;
                if (sink.sent) self->sent_at[rank] = zmq_io_now();
                return 1;
            }
        }
    }
    /* Python takes it, and every later message of this peer in this poll: they are handled
     * in the order they came (a worker's push before its next pull of the same key). */
    self->passed[rank] = 1;
    return 0;
}
