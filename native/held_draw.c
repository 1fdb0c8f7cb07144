/* The local sampler's draw on a node of a multi-node job (adapm/_sampler.py: WorkerSampler.keys,
 * uniform, with replacement): keys drawn among the pool of held keys of the sampling domain,
 * each kept only if it stays here (Directory.staying's test) and pinned as it is kept, under
 * the pins' lock, so that no decision of the engine falls between the test and the pin (the
 * engine holds the pins from its own test of a key to the key's leaving: dir_sync_pins); the
 * others drawn again. One call where the sampler took a numpy draw, two staying passes, a pin
 * pass and numpy's work between them (KGE on 2 nodes: 11% of a worker's CPU then, half now). */
#include "directory_object.h"
#include "pins.h"
#include "sampling.h"

/* Whether key stays here: owned and no peer's report on it deferred now (waits: the deferrals
 * are read), or a replica this node has acted-on intent for (c NULL: every replica stays). */
static int stays(const DirectoryObject *self, const intent_counts_t *c, int64_t key, int waits,
                 int32_t now) {
    const int state = store_state(self->d.store, key);
    if (state == KEY_REPLICA) {
        const ic_rec_t *e = c ? ic_find(c, key) : NULL;
        return !c || (e && e->count > 0);
    }
    return state == KEY_OWNER && !(waits && pins_waited(&self->pins, key, now));
}

/* The draws: out[i] for each i of todo[0..ntodo), drawn again up to `rounds` times while it
 * does not stay; each kept key pinned once. Returns how many are left unfit (their positions
 * in todo[0..left)). The pins are locked. */
static int64_t draw_pinned(DirectoryObject *self, const intent_counts_t *c, np_bitgen_t *g,
                           const int64_t *pool, int64_t size, const int64_t *count,
                           int64_t *out, int64_t *todo, int64_t ntodo, int rounds) {
    pins_t *pins = &self->pins;
    const int64_t num_keys = self->d.store->num_keys;
    const int waits = pins->deferred.live != 0;
    const int32_t now = waits ? pins_now_ms() : 0;
    for (int r = 0; r < rounds && ntodo; r++) {
        /* The pool's count as the store keeps it now (keys come and go meanwhile; an entry
         * past it holds an old in-domain key, which the test refuses if it left). */
        int64_t held = __atomic_load_n(count, __ATOMIC_ACQUIRE);
        held = held < 1 ? 1 : held > size ? size : held;
        /* The store keeps the pool to keys of the domain, inside the key space; a key outside
         * it (none) would not stay rather than be looked up. */
        for (int64_t j = 0; j < ntodo; j++) {
            const int64_t key = pool[sample_bounded(g, (uint64_t)held)];
            out[todo[j]] = key >= 0 && key < num_keys ? key : -1;
        }
        /* Then the tests and pins, their look-ups started STORE_AHEAD keys ahead: most miss
         * the cache (a run of KGE on 2 nodes draws 2,400 among ~2,500 held keys). */
        int64_t left = 0;
        for (int64_t j = 0; j < ntodo; j++) {
            if (j + STORE_AHEAD < ntodo) {
                const int64_t next = out[todo[j + STORE_AHEAD]];
                if (next >= 0) {
                    store_prefetch(self->d.store, next);
                    km_prefetch(&pins->map, next);
                }
            }
            const int64_t at = todo[j], key = out[at];
            if (key >= 0 && stays(self, c, key, waits, now))
                km_add(&pins->map, key, 1);
            else
                todo[left++] = at;
        }
        ntodo = left;
    }
    return ntodo;
}

/* draw_held(bit_generator, pool, pool_count, counts, out, rounds) -> int: see the method
 * table (directory_module.c). */
PyObject *Directory_draw_held(DirectoryObject *self, PyObject *args) {
    PyObject *obitgen, *opool, *ocount, *ocounts, *oout;
    int rounds;
    if (!PyArg_ParseTuple(args, "OOOOOi", &obitgen, &opool, &ocount, &ocounts, &oout, &rounds))
        return NULL;
    const intent_counts_t *c = NULL;
    if (ocounts != Py_None && !(c = dm_intent_counts(ocounts, "draw_held"))) return NULL;
    np_bitgen_t *g = np_bitgen_of(obitgen, "draw_held");
    if (!g) return NULL;
    Py_buffer v[3];
    if (borrow3((PyObject *[3]){opool, ocount, oout}, v, 4,
                (const char *[3]){"draw_held: pool", "draw_held: pool_count", "draw_held: out"})
        < 0)
        return NULL;
    Py_buffer pv = v[0], cv = v[1], ov = v[2];
    PyObject *result = NULL;
    const int64_t n = ov.len / 8, size = pv.len / 8;
    int64_t *todo = NULL;
    if (cv.len != 8 || size < 1 || rounds < 1) {
        PyErr_SetString(PyExc_ValueError, "draw_held: pool_count must hold one int64, the pool "
                                          "a key or more, rounds be positive");
        goto done;
    }
    if (self->d.channels > 1) { /* a sample spans the channels; each has pins of its own */
        PyErr_SetString(PyExc_ValueError, "draw_held: the directory of one channel of several");
        goto done;
    }
    todo = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!todo) {
        PyErr_NoMemory();
        goto done;
    }
    for (int64_t i = 0; i < n; i++) todo[i] = i;
    pins_t *pins = &self->pins;
    /* Only if free, holding the GIL: the engine thread may hold the pins while it waits for the
     * GIL (see repin). Busy: -1, nothing drawn; the caller takes its other path. */
    if (pthread_mutex_trylock(&pins->lock) != 0) {
        result = PyLong_FromLong(-1);
        goto done;
    }
    if (km_reserve(&pins->map, n) < 0) {
        pins_unlock(pins);
        PyErr_NoMemory();
        goto done;
    }
    /* The GIL stays held: the engine thread changes the counts holding it. But not the store:
     * it inserts and removes keys inside its receive call, without the GIL, and a held map
     * that grows or sheds its tombstones is copied and the old table freed (held.h): the tests
     * read the maps inside a reader's section, as the store's batch calls do. Without it a
     * draw that lost its core between reading a table's address and probing the table read
     * freed memory (a node's SIGSEGV in about one 2-node KGE run of 300; tests/test_sampling.py
     * provokes it). */
    const uint64_t tokens = store_enter(self->d.store);
    const int64_t left = draw_pinned(self, c, g, pv.buf, size, cv.buf, ov.buf, todo, n, rounds);
    store_exit(self->d.store, tokens);
    if (left) { /* gave up: the keys pinned here are released; out is the caller's to drop */
        int64_t *keys = ov.buf;
        for (int64_t j = 0; j < left; j++) keys[todo[j]] = -1; /* never pinned */
        for (int64_t i = 0; i < n; i++)
            if (keys[i] >= 0) km_add(&pins->map, keys[i], -1);
    }
    pins_unlock(pins);
    result = PyLong_FromLong(left ? -2 : 0);
done:
    PyMem_Free(todo);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&cv);
    PyBuffer_Release(&ov);
    return result;
}
