/*
 * The host block-copy loops of kvobs.kernels (cpu_copy.py, plan.py), in plain C.
 *
 * Everything crosses the boundary as integers: raw addresses of tensors that the
 * Python side owns and has validated (pool layers, the pair array, the run buffer, the
 * duplicate-detection scratch). No torch headers, no build-time torch dependency.
 *
 *   plan_pairs(pairs_addr, n, src_blocks, dst_blocks, seen_addr, stamp, runs_addr) -> runs
 *   plan_seq(pairs, src_blocks, dst_blocks, seen_addr, stamp, runs_addr) -> runs
 *       Validate (ids in range, destination ids unique) and coalesce consecutive pairs
 *       (s, d), (s+1, d+1), ... into runs (src, dst, count) written as int64 triples.
 *       `seen` is a uint32 array with one slot per destination block; a slot equal to
 *       `stamp` marks a destination already used in this call, so no clearing per call.
 *   copy_runs(layers_addr, n_layers, runs_addr, n_runs, stream_bytes) -> bytes copied
 *       Each layer is five int64: dst address, src address, dst block stride, src block
 *       stride, block bytes. A run over densely packed blocks is one copy. The GIL is
 *       released while bytes move. When the whole call moves at least `stream_bytes`,
 *       stores bypass the cache (non-temporal, as glibc's memcpy does for large copies):
 *       a batch that large would evict the cache anyway, and skipping the read-for-
 *       ownership of each destination line saves a third of the memory traffic.
 *   memcpy(dst_addr, src_addr, nbytes): plain libc memcpy, the benchmark's baseline.
 *   has_stream_copy() -> bool: whether non-temporal stores exist here (SSE2).
 */
#include "native.h"
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

/* Below this many bytes, dropping and re-taking the GIL costs more than it frees. */
#define RELEASE_GIL_BYTES (64 * 1024)

typedef struct {
    int64_t src_blocks, dst_blocks;
    uint32_t *seen;
    uint32_t stamp;
    int64_t *runs;
    Py_ssize_t n_runs;
} Planner;

/* Accept pair i; on bad input set a ValueError and return -1. */
static int planner_accept(Planner *p, Py_ssize_t i, int64_t s, int64_t d)
{
    if (s < 0 || s >= p->src_blocks) {
        PyErr_Format(PyExc_ValueError,
                     "mapping[%zd]: source block id %lld is out of range [0, %lld); "
                     "use ids of the source pool",
                     i, (long long)s, (long long)p->src_blocks);
        return -1;
    }
    if (d < 0 || d >= p->dst_blocks) {
        PyErr_Format(PyExc_ValueError,
                     "mapping[%zd]: destination block id %lld is out of range [0, %lld); "
                     "use ids of the destination pool",
                     i, (long long)d, (long long)p->dst_blocks);
        return -1;
    }
    if (p->seen[d] == p->stamp) {
        PyErr_Format(PyExc_ValueError,
                     "mapping[%zd]: destination block id %lld appears twice; "
                     "each destination block may be written once per call",
                     i, (long long)d);
        return -1;
    }
    p->seen[d] = p->stamp;
    if (p->n_runs > 0) {
        int64_t *last = p->runs + 3 * (p->n_runs - 1);
        if (last[0] + last[2] == s && last[1] + last[2] == d) {
            last[2] += 1;
            return 0;
        }
    }
    int64_t *run = p->runs + 3 * p->n_runs;
    run[0] = s;
    run[1] = d;
    run[2] = 1;
    p->n_runs += 1;
    return 0;
}

static int planner_init(Planner *p, long long src_blocks, long long dst_blocks,
                        unsigned long long seen_addr, unsigned long stamp,
                        unsigned long long runs_addr)
{
    if (stamp == 0 || stamp > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "stamp must be in [1, 2**32)");
        return -1;
    }
    p->src_blocks = src_blocks;
    p->dst_blocks = dst_blocks;
    p->seen = (uint32_t *)(uintptr_t)seen_addr;
    p->stamp = (uint32_t)stamp;
    p->runs = (int64_t *)(uintptr_t)runs_addr;
    p->n_runs = 0;
    return 0;
}

static PyObject *plan_pairs(PyObject *self, PyObject *args)
{
    unsigned long long pairs_addr, seen_addr, runs_addr;
    Py_ssize_t n;
    long long src_blocks, dst_blocks;
    unsigned long stamp;
    Planner p;
    if (!PyArg_ParseTuple(args, "KnLLKkK", &pairs_addr, &n, &src_blocks, &dst_blocks,
                          &seen_addr, &stamp, &runs_addr))
        return NULL;
    if (planner_init(&p, src_blocks, dst_blocks, seen_addr, stamp, runs_addr) < 0)
        return NULL;
    const int64_t *pairs = (const int64_t *)(uintptr_t)pairs_addr;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (planner_accept(&p, i, pairs[2 * i], pairs[2 * i + 1]) < 0)
            return NULL;
    }
    return PyLong_FromSsize_t(p.n_runs);
}

static int pair_item(PyObject *pair, Py_ssize_t i, int64_t *s, int64_t *d)
{
    PyObject *fast = PySequence_Fast(pair, "");
    if (fast == NULL || PySequence_Fast_GET_SIZE(fast) != 2) {
        Py_XDECREF(fast);
        PyErr_Format(PyExc_ValueError,
                     "mapping[%zd]: expected a (src_block_id, dst_block_id) pair", i);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    long long sv = PyLong_AsLongLong(items[0]);
    long long dv = (sv == -1 && PyErr_Occurred()) ? -1 : PyLong_AsLongLong(items[1]);
    Py_DECREF(fast);
    if ((sv == -1 || dv == -1) && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError,
                     "mapping[%zd]: block ids must be Python or torch integers", i);
        return -1;
    }
    *s = sv;
    *d = dv;
    return 0;
}

static PyObject *plan_seq(PyObject *self, PyObject *args)
{
    PyObject *seq;
    unsigned long long seen_addr, runs_addr;
    long long src_blocks, dst_blocks;
    unsigned long stamp;
    Planner p;
    if (!PyArg_ParseTuple(args, "OLLKkK", &seq, &src_blocks, &dst_blocks, &seen_addr, &stamp,
                          &runs_addr))
        return NULL;
    if (planner_init(&p, src_blocks, dst_blocks, seen_addr, stamp, runs_addr) < 0)
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "mapping must be a sequence of pairs");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s, d;
        if (pair_item(items[i], i, &s, &d) < 0 || planner_accept(&p, i, s, d) < 0) {
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    return PyLong_FromSsize_t(p.n_runs);
}

typedef void *(*copy_fn)(void *, const void *, size_t);

#if defined(__SSE2__)
/* memcpy with non-temporal stores: 64 bytes (one cache line) per iteration. */
static void *stream_copy(void *dst, const void *src, size_t n)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        _mm_prefetch(s + i + 1024, _MM_HINT_NTA);
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, n - i);
    return dst;
}
#define HAVE_STREAM_COPY 1
#else
#define HAVE_STREAM_COPY 0
#endif

static void copy_layer(const int64_t *layer, const int64_t *runs, Py_ssize_t n_runs,
                       copy_fn copy)
{
    char *dst = (char *)(uintptr_t)layer[0];
    const char *src = (const char *)(uintptr_t)layer[1];
    const int64_t dst_stride = layer[2], src_stride = layer[3], block = layer[4];
    const int dense = dst_stride == block && src_stride == block;
    for (Py_ssize_t r = 0; r < n_runs; r++) {
        const int64_t *run = runs + 3 * r;
        char *d = dst + run[1] * dst_stride;
        const char *s = src + run[0] * src_stride;
        if (dense) {
            copy(d, s, (size_t)(run[2] * block));
            continue;
        }
        for (int64_t b = 0; b < run[2]; b++)
            copy(d + b * dst_stride, s + b * src_stride, (size_t)block);
    }
}

static PyObject *copy_runs(PyObject *self, PyObject *args)
{
    unsigned long long layers_addr, runs_addr;
    Py_ssize_t n_layers, n_runs;
    long long stream_bytes;
    if (!PyArg_ParseTuple(args, "KnKnL", &layers_addr, &n_layers, &runs_addr, &n_runs,
                          &stream_bytes))
        return NULL;
    const int64_t *layers = (const int64_t *)(uintptr_t)layers_addr;
    const int64_t *runs = (const int64_t *)(uintptr_t)runs_addr;
    int64_t blocks = 0, bytes_per_block = 0;
    for (Py_ssize_t r = 0; r < n_runs; r++)
        blocks += runs[3 * r + 2];
    for (Py_ssize_t l = 0; l < n_layers; l++)
        bytes_per_block += layers[5 * l + 4];
    const int64_t total = blocks * bytes_per_block;
    copy_fn copy = memcpy;
#if HAVE_STREAM_COPY
    if (stream_bytes >= 0 && total >= stream_bytes)
        copy = stream_copy;
#endif
    if (total >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t l = 0; l < n_layers; l++)
            copy_layer(layers + 5 * l, runs, n_runs, copy);
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t l = 0; l < n_layers; l++)
            copy_layer(layers + 5 * l, runs, n_runs, copy);
    }
#if HAVE_STREAM_COPY
    if (copy == stream_copy)
        _mm_sfence(); /* make the streamed stores visible before the caller reads them */
#endif
    return PyLong_FromLongLong(total);
}

static PyObject *native_memcpy(PyObject *self, PyObject *args)
{
    unsigned long long dst, src, nbytes;
    if (!PyArg_ParseTuple(args, "KKK", &dst, &src, &nbytes))
        return NULL;
    if (nbytes >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, (size_t)nbytes);
        Py_END_ALLOW_THREADS
    } else {
        memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, (size_t)nbytes);
    }
    Py_RETURN_NONE;
}

static PyObject *has_stream_copy(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(HAVE_STREAM_COPY);
}

static PyMethodDef copy_methods[] = {
    {"has_stream_copy", has_stream_copy, METH_NOARGS, "True where non-temporal stores exist."},
    {"plan_pairs", plan_pairs, METH_VARARGS, "Validate an int64 pair array and coalesce runs."},
    {"plan_seq", plan_seq, METH_VARARGS, "Validate a sequence of pairs and coalesce runs."},
    {"copy_runs", copy_runs, METH_VARARGS, "Copy planned runs for every layer."},
    {"memcpy", native_memcpy, METH_VARARGS, "libc memcpy between two addresses."},
    {NULL, NULL, 0, NULL},
};

int copy_add(PyObject *module)
{
    return PyModule_AddFunctions(module, copy_methods);
}
