/* CPython binding of the directory (directory.h): type adapm._native.Directory.
 *
 * A Directory keeps a reference to the node's Store object and buffer views of the directory's
 * numpy arrays (hint, forward, epoch, home table, intent and replica masks), checked once here;
 * each method checks the sizes of its batch buffers and makes one call into directory.c.
 */
#include "directory.h"
#include "module.h"

typedef struct {
    PyObject_HEAD
    directory_t d;
    PyObject *store; /* the StoreObject whose store_t d.store points into */
    Py_buffer views[8];
    int nviews;
} DirectoryObject;

static void Directory_dealloc(DirectoryObject *self) {
    for (int i = 0; i < self->nviews; i++) PyBuffer_Release(&self->views[i]);
    Py_XDECREF(self->store);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A persistent view of one directory array; its element count goes to *count. */
static void *keep(DirectoryObject *self, PyObject *obj, Py_ssize_t itemsize, const char *name,
                  Py_ssize_t *count) {
    Py_buffer *view = &self->views[self->nviews];
    if (borrow(obj, view, itemsize, 1, name) < 0) return NULL;
    self->nviews++;
    *count = view->len / itemsize;
    return view->buf;
}

static int Directory_init(DirectoryObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"store", "hint", "forward", "epoch", "home_owner", "home_epoch",
                             "intent", "replicas", "rank", "world_size", NULL};
    PyObject *store, *arrays[7];
    long long rank, world_size;
    if (self->nviews || self->store) {
        PyErr_SetString(PyExc_RuntimeError, "Directory is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOOOOLL", kwlist, &StoreType, &store,
                                     &arrays[0], &arrays[1], &arrays[2], &arrays[3], &arrays[4],
                                     &arrays[5], &arrays[6], &rank, &world_size))
        return -1;
    if (world_size < 1 || rank < 0 || rank >= world_size) {
        PyErr_SetString(PyExc_ValueError, "Directory: rank must be in [0, world_size)");
        return -1;
    }
    Py_INCREF(store);
    self->store = store;
    directory_t *d = &self->d;
    d->store = &((StoreObject *)store)->s;
    d->rank = rank;
    d->world_size = world_size;
    d->words = (world_size + 63) / 64;
    Py_ssize_t nhint, nforward, nepoch, nhome, nhome_epoch, nintent, nreplicas;
    if (!(d->hint = keep(self, arrays[0], 4, "hint", &nhint))) return -1;
    if (!(d->forward = keep(self, arrays[1], 4, "forward", &nforward))) return -1;
    if (!(d->epoch = keep(self, arrays[2], 8, "epoch", &nepoch))) return -1;
    if (!(d->home_owner = keep(self, arrays[3], 4, "home_owner", &nhome))) return -1;
    if (!(d->home_epoch = keep(self, arrays[4], 8, "home_epoch", &nhome_epoch))) return -1;
    if (!(d->intent = keep(self, arrays[5], 8, "intent", &nintent))) return -1;
    if (!(d->replicas = keep(self, arrays[6], 8, "replicas", &nreplicas))) return -1;
    const int64_t num_keys = d->store->num_keys;
    const int64_t homed = num_keys > rank ? (num_keys - rank + world_size - 1) / world_size : 0;
    if (nhint != num_keys || nforward != num_keys || nepoch != num_keys || nhome != homed
        || nhome_epoch != homed || nintent != num_keys * d->words
        || nreplicas != num_keys * d->words) {
        PyErr_SetString(PyExc_ValueError, "Directory: hint, forward and epoch need one entry "
                                          "per key, the home table one per key homed here, "
                                          "the masks ceil(world_size / 64) words per key");
        return -1;
    }
    d->num_home = homed;
    return 0;
}

static int check_keys(const DirectoryObject *self, const int64_t *keys, int64_t n) {
    const int64_t bad = store_check_keys(keys, n, self->d.store->num_keys);
    if (bad >= 0) {
        PyErr_Format(PyExc_IndexError, "keys[%lld] = %lld is outside [0, %lld)", (long long)bad,
                     (long long)keys[bad], (long long)self->d.store->num_keys);
        return -1;
    }
    return 0;
}

/* relocate_out(keys, dst, values, versions, s_out, r_out, epochs, slots) -> None */
static PyObject *Directory_relocate_out(DirectoryObject *self, PyObject *args) {
    PyObject *o[7];
    long long dst;
    if (!PyArg_ParseTuple(args, "OLOOOOOO", &o[0], &dst, &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6]))
        return NULL;
    Py_buffer v[7];
    const Py_ssize_t sizes[7] = {8, 4, 8, 8, 8, 8, 8};
    const int writable[7] = {0, 1, 1, 1, 1, 1, 1};
    int got = 0;
    PyObject *result = NULL;
    for (; got < 7; got++)
        if (borrow(o[got], &v[got], sizes[got], writable[got], "relocate_out") < 0) goto done;
    const int64_t n = v[0].len / 8, w = self->d.words;
    if (dst < 0 || dst >= self->d.world_size || dst == self->d.rank || v[2].len / 8 != n
        || v[3].len / 8 != n * w || v[4].len / 8 != n * w || v[5].len / 8 != n
        || v[6].len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "relocate_out: dst must be another rank; versions, "
                                          "epochs and slots one per key, masks words per key");
        goto done;
    }
    if (check_keys(self, v[0].buf, n) < 0) goto done;
    int64_t r;
    NOGIL_BEGIN(v[1].len / 4)
    r = dir_relocate_out(&self->d, v[0].buf, n, dst, v[1].buf, v[1].len / 4, v[2].buf,
                         v[3].buf, v[4].buf, v[5].buf, v[6].buf);
    NOGIL_END
    if (r == -1 - n) PyErr_SetString(PyExc_ValueError, "relocate_out: values too short");
    else if (r < 0)
        PyErr_Format(PyExc_ValueError, "relocate_out: key %lld is not owned here",
                     (long long)((int64_t *)v[0].buf)[-1 - r]);
    else result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* relocate_in(keys, values, versions, s_in, r_in, epochs, slots, was_replica) -> None */
static PyObject *Directory_relocate_in(DirectoryObject *self, PyObject *args) {
    PyObject *o[8];
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7]))
        return NULL;
    Py_buffer v[8];
    const Py_ssize_t sizes[8] = {8, 4, 8, 8, 8, 8, 8, 1};
    const int writable[8] = {0, 0, 0, 0, 0, 0, 0, 1};
    int got = 0;
    PyObject *result = NULL;
    for (; got < 8; got++)
        if (borrow(o[got], &v[got], sizes[got], writable[got], "relocate_in") < 0) goto done;
    const int64_t n = v[0].len / 8, w = self->d.words;
    if (v[2].len / 8 != n || v[3].len / 8 != n * w || v[4].len / 8 != n * w
        || v[5].len / 8 != n || v[7].len != n) {
        PyErr_SetString(PyExc_ValueError, "relocate_in: versions, epochs and was_replica one "
                                          "per key, masks words per key");
        goto done;
    }
    if (check_keys(self, v[0].buf, n) < 0) goto done;
    int64_t r;
    NOGIL_BEGIN(v[1].len / 4)
    r = dir_relocate_in(&self->d, v[0].buf, n, v[1].buf, v[1].len / 4, v[2].buf, v[3].buf,
                        v[4].buf, v[5].buf, v[6].buf, v[6].len / 8, v[7].buf);
    NOGIL_END
    if (r == -1 - n)
        PyErr_SetString(PyExc_ValueError, "relocate_in: values or slots too short, or a slot "
                                          "outside the slab");
    else if (r < 0)
        PyErr_Format(PyExc_ValueError, "relocate_in: key %lld is owned here already",
                     (long long)((int64_t *)v[0].buf)[-1 - r]);
    else result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

static PyMethodDef Directory_methods[] = {
    {"relocate_out", (PyCFunction)Directory_relocate_out, METH_VARARGS,
     "relocate_out(keys, dst, values, versions, s_out, r_out, epochs, slots) -> None. Owned "
     "keys leave for dst: values, versions, masks and new epochs out, forward and hint to dst, "
     "freed slots out. ValueError (nothing changed) if a key is not owned here."},
    {"relocate_in", (PyCFunction)Directory_relocate_in, METH_VARARGS,
     "relocate_in(keys, values, versions, s_in, r_in, epochs, slots, was_replica) -> None. "
     "Keys arrive as main copies (replicas promoted, others inserted at slots in order). "
     "ValueError (nothing changed) if a key is owned here already."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DirectoryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "adapm._native.Directory",
    .tp_basicsize = sizeof(DirectoryObject),
    .tp_dealloc = (destructor)Directory_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Relocations over a node's store and directory arrays (see native/directory.h).",
    .tp_methods = Directory_methods,
    .tp_init = (initproc)Directory_init,
    .tp_new = PyType_GenericNew,
};

int register_directory_type(PyObject *module) {
    if (PyType_Ready(&DirectoryType) < 0) return -1;
    Py_INCREF(&DirectoryType);
    if (PyModule_AddObject(module, "Directory", (PyObject *)&DirectoryType) < 0) {
        Py_DECREF(&DirectoryType);
        return -1;
    }
    return 0;
}
