/*
 * The thrash classification of kvobs.thrash, in C.
 *
 * ThrashCore(max_blocks, window_ns=10 s): the offloaded blocks of one host tier, by key,
 * oldest offload first, at most max_blocks (the oldest forgotten first and counted as
 * untracked).
 *     offloaded(keys, now_ns=CLOCK_MONOTONIC) -> None: each key's offload time becomes now
 *         (its "reused" mark cleared) and it becomes the newest entry.
 *     onloaded(keys, now_ns=CLOCK_MONOTONIC, window_ns=the core's) -> None: for each
 *         tracked key, an onload within window_ns of its offload counts as in-window; its
 *         first onload since the offload counts it as reused.
 * Without now_ns the core reads CLOCK_MONOTONIC itself (time.monotonic_ns's clock), so the
 * tracker can hand the engine's calls straight to it: no Python frame per event.
 *     evicted(keys) -> None: tracked keys are forgotten; those never onloaded count as
 *         evicted unused.
 *     counts() -> (onloads_in_window, offloaded_reused, offloaded_evicted_unused, tracked,
 *         untracked).
 *
 * A key is told apart by its 64-bit hash (bytes digests and ints below 2**61 never collide;
 * two keys of equal hash are one block here). Every call hashes its keys first, then
 * changes its KeyLru (offload order; one int64 per entry: offload time ns * 2 + reused),
 * about 50 bytes per tracked block.
 */
#include "keys.h"

typedef struct {
    PyObject_HEAD
    KeyLru lru;
    long long in_window, reused, evicted_unused, untracked;
    long long window_ns;  /* onloaded's default window */
} ThrashCore;

static PyObject *thrash_offloaded(ThrashCore *self, PyObject *args)
{
    PyObject *keys;
    long long now = 0;
    if (!PyArg_ParseTuple(args, "O|L", &keys, &now))
        return NULL;
    if (PyTuple_GET_SIZE(args) < 2) /* no time given (a simulation's may be negative) */
        now = monotonic_ns();
    uint64_t stack[KEY_STACK_KEYS], *bits;
    if (!lru_ready(&self->lru, "ThrashCore"))
        return NULL;
    Py_ssize_t n = hash_keys(keys, 0, 0, 0, stack, &bits);
    if (n < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t e = lru_touch(&self->lru, bits[i], &self->untracked); /* may move data */
        self->lru.data[e] = (int64_t)now * 2;
    }
    if (bits != stack)
        PyMem_Free(bits);
    Py_RETURN_NONE;
}

static PyObject *thrash_onloaded(ThrashCore *self, PyObject *args)
{
    PyObject *keys;
    long long now = 0, window = self->window_ns;
    if (!PyArg_ParseTuple(args, "O|LL", &keys, &now, &window))
        return NULL;
    if (PyTuple_GET_SIZE(args) < 2) /* no time given (a simulation's may be negative) */
        now = monotonic_ns();
    uint64_t stack[KEY_STACK_KEYS], *bits;
    if (!lru_ready(&self->lru, "ThrashCore"))
        return NULL;
    Py_ssize_t n = hash_keys(keys, 0, 0, 0, stack, &bits);
    if (n < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t row;
        int32_t e = lru_find(&self->lru, bits[i], &row);
        if (e < 0)
            continue;
        int64_t stamp = self->lru.data[e];
        if ((int64_t)now - (stamp >> 1) <= (int64_t)window)
            self->in_window++;
        if (!(stamp & 1)) {
            self->lru.data[e] = stamp | 1;
            self->reused++;
        }
    }
    if (bits != stack)
        PyMem_Free(bits);
    Py_RETURN_NONE;
}

static PyObject *thrash_evicted(ThrashCore *self, PyObject *keys)
{
    uint64_t stack[KEY_STACK_KEYS], *bits;
    if (!lru_ready(&self->lru, "ThrashCore"))
        return NULL;
    Py_ssize_t n = hash_keys(keys, 0, 0, 0, stack, &bits);
    if (n < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t row;
        int32_t e = lru_find(&self->lru, bits[i], &row);
        if (e < 0)
            continue;
        if (!(self->lru.data[e] & 1))
            self->evicted_unused++;
        lru_drop(&self->lru, e, row);
    }
    if (bits != stack)
        PyMem_Free(bits);
    Py_RETURN_NONE;
}

static PyObject *thrash_counts(ThrashCore *self, PyObject *unused)
{
    return Py_BuildValue("(LLLnL)", self->in_window, self->reused, self->evicted_unused,
                         self->lru.count, self->untracked);
}

static int thrash_init(ThrashCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_blocks", "window_ns", NULL};
    Py_ssize_t max_blocks;
    long long window_ns = 10000000000LL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|L", kwlist, &max_blocks, &window_ns))
        return -1;
    if (window_ns <= 0) {
        PyErr_Format(PyExc_ValueError, "window_ns must be > 0, got %lld", window_ns);
        return -1;
    }
    self->window_ns = window_ns;
    self->in_window = self->reused = self->evicted_unused = self->untracked = 0;
    return lru_init(&self->lru, max_blocks, 1, "max_blocks");
}

static void thrash_dealloc(ThrashCore *self)
{
    lru_free_arrays(&self->lru);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef thrash_methods[] = {
    {"offloaded", (PyCFunction)thrash_offloaded, METH_VARARGS,
     "offloaded(keys, now_ns=CLOCK_MONOTONIC): blocks copied into the host tier at now_ns."},
    {"onloaded", (PyCFunction)thrash_onloaded, METH_VARARGS,
     "onloaded(keys, now_ns=CLOCK_MONOTONIC, window_ns=the core's): blocks copied back to "
     "the GPU at now_ns."},
    {"evicted", (PyCFunction)thrash_evicted, METH_O,
     "evicted(keys): blocks dropped from the host tier."},
    {"counts", (PyCFunction)thrash_counts, METH_NOARGS,
     "(onloads_in_window, offloaded_reused, offloaded_evicted_unused, tracked, untracked)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ThrashCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvobs.kernels._native.ThrashCore",
    .tp_basicsize = sizeof(ThrashCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Offload / onload bookkeeping of one host tier (see kvobs.thrash).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)thrash_init,
    .tp_dealloc = (destructor)thrash_dealloc,
    .tp_methods = thrash_methods,
};
int thrash_add(PyObject *module)
{
    return PyModule_AddType(module, &ThrashCoreType);
}
