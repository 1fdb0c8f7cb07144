/* The fast paths inside ZmqIO.poll (zmq_io.h): a received ZeroMQ message handed to the
 * transport-independent ones (serve_wire.h) with libzmq's frames, its answer sent on the
 * peer's connection; or a worker's pull answered (zmq_calls.c). */
#include "zmq_io.h"

#define ZMQ_FRAMES_MAX 128 /* frames of a message the fast paths look at */

/* An answer as two libzmq messages, sent on the peer's connection (libzmq owns them after). */
typedef struct {
    wsink_t sink;
    zmsg_t hm, pm;
    void *peer;
    int sent; /* an answer went out */
} zmq_sink_t;

static int zmq_open(wsink_t *sink, size_t hsize, size_t psize, uint8_t **h, uint8_t **p) {
    zmq_sink_t *z = (zmq_sink_t *)sink;
    if (Z.msg_init_size(&z->hm, hsize) < 0) return -1;
    if (Z.msg_init_size(&z->pm, psize) < 0) {
        Z.msg_close(&z->hm);
        return -1;
    }
    *h = Z.msg_data(&z->hm);
    *p = Z.msg_data(&z->pm);
    return 0;
}

static int zmq_send(wsink_t *sink) {
    zmq_sink_t *z = (zmq_sink_t *)sink;
    const int e = zmq_send_pair(z->peer, &z->hm, &z->pm);
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
