/*
 * The sampled residency and reuse gaps of kvobs.residency, in C.
 *
 * ResidencyCore(threshold, mask, max_keys, buffer_limit): the sampled blocks of one tier,
 * by hash((key,)), each with its birth and last-use time, at most max_keys of them (the
 * oldest birth forgotten first); a key is sampled when hash((key,)) & mask < threshold.
 *     born(keys) -> None: sampled keys are born now (birth = last use = now) and become
 *         the newest.
 *     reused(keys) -> None: a tracked sampled key's gap since its last use (seconds) is one
 *         reuse-gap sample; its last use becomes now.
 *     evicted(keys) -> None: a tracked sampled key's time since birth is one residency
 *         sample; it is forgotten.
 *     drain() -> (residency seconds, reuse-gap seconds): the buffered samples, taken.
 *     clock: None (CLOCK_MONOTONIC, read in C) or a callable returning int ns (a
 *         simulation's clock); read once per call, and only when the call sampled a key.
 * The samples wait in two rings of buffer_limit doubles (the oldest overwritten first). One
 * call per event: no Python frame between the engine and the table.
 */
#include "keys.h"

typedef struct {
    double *value;
    Py_ssize_t cap, start, len;
} Ring;

static void ring_push(Ring *r, double v)
{
    if (r->value == NULL) { /* allocated at the first sample: most tiers take none */
        r->value = PyMem_New(double, (size_t)r->cap);
        if (r->value == NULL)
            return; /* no memory: the sample is lost, as a full ring would lose one */
    }
    Py_ssize_t at = r->start + r->len;
    r->value[at >= r->cap ? at - r->cap : at] = v;
    if (r->len < r->cap)
        r->len++;
    else if (++r->start == r->cap)
        r->start = 0;
}

/* The ring's samples, oldest first, as a new list; the ring emptied. NULL on no memory. */
static PyObject *ring_take(Ring *r)
{
    PyObject *list = PyList_New(r->len);
    for (Py_ssize_t i = 0; list != NULL && i < r->len; i++) {
        Py_ssize_t at = r->start + i;
        PyObject *v = PyFloat_FromDouble(r->value[at >= r->cap ? at - r->cap : at]);
        if (v == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, v);
    }
    if (list != NULL)
        r->start = r->len = 0;
    return list;
}

typedef struct {
    PyObject_HEAD
    KeyLru lru;           /* two int64 per entry: birth, last use */
    uint64_t threshold, mask;
    long long forgotten;
    Ring stays, gaps;
    PyObject *clock;      /* None: CLOCK_MONOTONIC */
} ResidencyCore;

enum { BORN, REUSED, EVICTED };

/* (to - from) / 1e9, exact in int64 (as Python's int arithmetic) unless that overflows. */
static inline double seconds_between(int64_t from, int64_t to)
{
    int64_t d;
    if (__builtin_sub_overflow(to, from, &d))
        return ((double)to - (double)from) / 1e9;
    return (double)d / 1e9;
}

/* One keyed event: sample `keys`, read the clock once if any was picked, apply. */
static PyObject *residency_event(ResidencyCore *self, PyObject *keys, int what)
{
    if (!lru_ready(&self->lru, "ResidencyCore"))
        return NULL;
    uint64_t stack[KEY_STACK_KEYS], *picked;
    Py_ssize_t count = hash_keys(keys, 1, self->threshold, self->mask, stack, &picked);
    if (count < 0)
        return NULL;
    PyObject *result = NULL;
    if (count) {
        long long now;
        if (self->clock == NULL || self->clock == Py_None) {
            now = monotonic_ns();
        } else {
            PyObject *clock = self->clock;
            Py_INCREF(clock); /* the clock may reset core.clock while it runs */
            PyObject *t = PyObject_CallNoArgs(clock);
            Py_DECREF(clock);
            now = t ? PyLong_AsLongLong(t) : -1;
            Py_XDECREF(t);
            if (now == -1 && PyErr_Occurred()) {
                if (PyErr_ExceptionMatches(PyExc_TypeError) ||
                    PyErr_ExceptionMatches(PyExc_OverflowError)) {
                    PyErr_Clear();
                    PyErr_SetString(PyExc_TypeError, "a residency clock must return int "
                                                     "nanoseconds that fit in 64 bits");
                }
                goto done;
            }
        }
        KeyLru *l = &self->lru;
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t row;
            int32_t e;
            if (what == BORN) {
                e = lru_touch(l, picked[i], &self->forgotten);
                l->data[2 * e] = l->data[2 * e + 1] = now;
            } else if ((e = lru_find(l, picked[i], &row)) >= 0) {
                if (what == REUSED) {
                    ring_push(&self->gaps, seconds_between(l->data[2 * e + 1], now));
                    l->data[2 * e + 1] = now;
                } else {
                    ring_push(&self->stays, seconds_between(l->data[2 * e], now));
                    lru_drop(l, e, row);
                }
            }
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    if (picked != stack)
        PyMem_Free(picked);
    return result;
}

static PyObject *residency_born(ResidencyCore *self, PyObject *keys)
{
    return residency_event(self, keys, BORN);
}

static PyObject *residency_reused(ResidencyCore *self, PyObject *keys)
{
    return residency_event(self, keys, REUSED);
}

static PyObject *residency_evicted(ResidencyCore *self, PyObject *keys)
{
    return residency_event(self, keys, EVICTED);
}

static PyObject *residency_drain(ResidencyCore *self, PyObject *unused)
{
    PyObject *stays = ring_take(&self->stays);
    PyObject *gaps = stays ? ring_take(&self->gaps) : NULL;
    if (gaps == NULL) {
        Py_XDECREF(stays);
        return NULL;
    }
    return Py_BuildValue("(NN)", stays, gaps);
}

static PyObject *residency_counts(ResidencyCore *self, PyObject *unused)
{
    return Py_BuildValue("(nL)", self->lru.count, self->forgotten);
}

static int residency_init(ResidencyCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"threshold", "mask", "max_keys", "buffer_limit", NULL};
    unsigned long long threshold, mask;
    Py_ssize_t max_keys, buffer_limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KKnn", kwlist, &threshold, &mask, &max_keys,
                                     &buffer_limit))
        return -1;
    if (buffer_limit <= 0 || buffer_limit > (1 << 30)) {
        PyErr_Format(PyExc_ValueError, "buffer_limit must be in 1..2**30, got %zd", buffer_limit);
        return -1;
    }
    if (max_keys <= 0 || max_keys > (1 << 30)) { /* checked before any state changes */
        PyErr_Format(PyExc_ValueError, "max_keys must be in 1..2**30, got %zd", max_keys);
        return -1;
    }
    self->threshold = threshold;
    self->mask = mask;
    self->forgotten = 0;
    PyMem_Free(self->stays.value);
    PyMem_Free(self->gaps.value);
    self->stays = (Ring){NULL, buffer_limit, 0, 0};
    self->gaps = (Ring){NULL, buffer_limit, 0, 0};
    Py_INCREF(Py_None);
    Py_XSETREF(self->clock, Py_None);
    return lru_init(&self->lru, max_keys, 2, "max_keys");
}

static int residency_traverse(ResidencyCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->clock); /* a simulation's clock may close over the tracker's owner */
    return 0;
}

static int residency_clear(ResidencyCore *self)
{
    Py_CLEAR(self->clock);
    return 0;
}

static void residency_dealloc(ResidencyCore *self)
{
    PyObject_GC_UnTrack(self);
    lru_free_arrays(&self->lru);
    PyMem_Free(self->stays.value);
    PyMem_Free(self->gaps.value);
    Py_CLEAR(self->clock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *residency_get_clock(ResidencyCore *self, void *unused)
{
    PyObject *clock = self->clock ? self->clock : Py_None;
    Py_INCREF(clock);
    return clock;
}

static int residency_set_clock(ResidencyCore *self, PyObject *clock, void *unused)
{
    if (clock == NULL || (clock != Py_None && !PyCallable_Check(clock))) {
        PyErr_SetString(PyExc_TypeError, "clock must be None (CLOCK_MONOTONIC) or a callable "
                                         "returning nanoseconds");
        return -1;
    }
    Py_INCREF(clock);
    Py_XSETREF(self->clock, clock);
    return 0;
}

static PyMethodDef residency_methods[] = {
    {"born", (PyCFunction)residency_born, METH_O,
     "born(keys): sampled blocks now hold data in this tier."},
    {"reused", (PyCFunction)residency_reused, METH_O,
     "reused(keys): sampled blocks were hit; the gap since their last use is a sample."},
    {"evicted", (PyCFunction)residency_evicted, METH_O,
     "evicted(keys): sampled blocks left the tier; their time in it is a sample."},
    {"drain", (PyCFunction)residency_drain, METH_NOARGS,
     "(residency seconds, reuse-gap seconds) buffered since the last drain."},
    {"counts", (PyCFunction)residency_counts, METH_NOARGS,
     "(tracked sampled keys, keys forgotten by the max_keys bound)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef residency_getset[] = {
    {"clock", (getter)residency_get_clock, (setter)residency_set_clock,
     "None (CLOCK_MONOTONIC, read in C) or a callable returning int nanoseconds.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ResidencyCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvobs.kernels._native.ResidencyCore",
    .tp_basicsize = sizeof(ResidencyCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Sampled residency and reuse-gap bookkeeping of one tier (see kvobs.residency).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)residency_init,
    .tp_dealloc = (destructor)residency_dealloc,
    .tp_traverse = (traverseproc)residency_traverse,
    .tp_clear = (inquiry)residency_clear,
    .tp_methods = residency_methods,
    .tp_getset = residency_getset,
};
int residency_add(PyObject *module)
{
    return PyModule_AddType(module, &ResidencyCoreType);
}
