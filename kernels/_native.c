/*
 * kvobs.kernels._native: the hot loops of the block mover and the reuse profile, in plain C.
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
 *   ReuseCore: the sampled path of kvobs.reuse.ReuseProfile (see its section below).
 *   sample_bits(threshold, mask, keys): the keyed trackers' sampling (kvobs.residency).
 *   ThrashCore, ResidencyCore: per-key bookkeeping of kvobs.thrash and kvobs.residency, one
 *       C call per keyed event (see their sections below).
 *   walk_slots(blocks, hash_member, count_member) -> (hashed, in_use, cached): one pass
 *       over a vLLM BlockPool's blocks (kvobs.adapters.vllm.block_pool.walk), reading two
 *       __slots__ fields by their offsets.
 *   new_blocks_before / new_blocks_after: the readers of a vLLM BlockPool's
 *       get_new_blocks (allocations and the capacity evictions it makes); PoolReader: the
 *       two bound to one pool, in one object.
 *   release_before / release_after: the readers of a vLLM KVCacheManager's releases of a
 *       request's blocks (its answer's blocks into the reuse profile).
 *   HookCall: an adapter's wrapper of one engine method (kernels/_hookcall.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include "_hookcall.h"
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

/* ---- reuse-distance profile core (kvobs.reuse) ----------------------------------------
 *
 * ReuseCore(max_keys, threshold, weight, bounds[, track]) holds the sampled part of a
 * kvobs.reuse.ReuseProfile: the same algorithm as its pure-Python fallback, step for step,
 * so both give the same counts on the same input (tests/core/test_reuse_native.py).
 *
 *   reference(keys, counted) -> None
 *       For each key: bits = hash((key,)) (CPython's tuple hash of a 1-tuple, computed
 *       without building the tuple); the key is tracked when the low 24 bits of bits are
 *       below `track` (default `threshold`). A tracked key's reuse distance (distinct
 *       tracked keys since its previous reference, + itself, times SPACE / track, or
 *       `weight` once track has come down to threshold; when scaled, at most the number
 *       of references, every key of every call, since that one) is counted in the first
 *       bucket whose bound is >= it (cold references: the last one) when `counted` is
 *       true; otherwise (a block written into the cache) only its recency is updated.
 *       Counts are in samples at `threshold` (the exported counters' unit): a counted
 *       reference adds track_weight / weight (1 at threshold; 1/16 at rate 1/16 while
 *       every key is tracked: sixteen tracked references stand for one sample). When
 *       max_keys keys are live and a new one arrives, `track` is halved (not below
 *       threshold) and the keys above it are dropped, until one fits; at threshold, the
 *       least recently used key is forgotten instead.
 *
 * With `near` (a second ReuseCore of threshold and track 2**24 and weight 1: every key
 * tracked, distances exact, the least recently used key forgotten beyond its max_keys),
 * every key of every call is profiled there first, from the same hash: its counts are
 * exact for every distance up to its max_keys. This core then counts only the references
 * the near core did not find (a distance beyond its max_keys, or cold): a tracked one at
 * its distance (at least max_keys + 1: a sampled estimate never puts it within), weighing
 * the untracked ones since too (a ratio estimate, reuse_count_far); an untracked one adds
 * nothing itself. kvobs.reuse.ReuseProfile adds the two.
 *
 * State: an open-addressing table (bits -> slot, linear probing, backward-shift delete), a
 * bitmap over 4 x max_live time slots (a set bit marks a key's latest slot) with a Fenwick
 * tree over its 64-slot words (a distance reads a few words, not a path through a tree
 * as large as the slots: a cache miss or two per sampled reference), the key of each
 * slot; slots are renumbered in recency order when they run out.
 *
 * The arrays are sized for max_live keys, starting at REUSE_INITIAL_LIVE and doubled (up to
 * max_keys) when that many are live: an engine whose blocks repeat keeps a table that
 * stays in the CPU's caches instead of megabytes it touches at random, and the counts do
 * not depend on the sizing (distances come from the live keys, not from slot numbers).
 */

/* KeyTable: the open-addressing index both per-key cores use (64-bit key hashes -> an int32
 * row of the core's own arrays; linear probing, backward-shift delete, val -1 = empty). */
typedef struct {
    uint64_t *key;
    int32_t *val;
    Py_ssize_t mask; /* capacity - 1 (a power of two) */
    int shift;       /* 64 - log2(capacity) */
} KeyTable;

static inline Py_ssize_t ktab_home(const KeyTable *t, uint64_t bits)
{
    return (Py_ssize_t)((bits * 0x9E3779B97F4A7C15ULL) >> t->shift);
}

/* The position holding bits, or the empty position where it would go. */
static inline Py_ssize_t ktab_find(const KeyTable *t, uint64_t bits)
{
    Py_ssize_t i = ktab_home(t, bits);
    while (t->val[i] >= 0 && t->key[i] != bits)
        i = (i + 1) & t->mask;
    return i;
}

static void ktab_delete(KeyTable *t, Py_ssize_t i)
{
    Py_ssize_t j = i;
    t->val[i] = -1;
    for (;;) {
        j = (j + 1) & t->mask;
        if (t->val[j] < 0)
            return;
        Py_ssize_t home = ktab_home(t, t->key[j]);
        /* move j back to i unless its home lies cyclically in (i, j] */
        if ((i <= j) ? (i < home && home <= j) : (i < home || home <= j))
            continue;
        t->key[i] = t->key[j];
        t->val[i] = t->val[j];
        t->val[j] = -1;
        i = j;
    }
}

#define REUSE_INITIAL_LIVE 4096

#define REUSE_LOW_BITS ((1ULL << 24) - 1)
#define XXPRIME_1 11400714785074694791ULL
#define XXPRIME_2 14029467366897019727ULL
#define XXPRIME_5 2870177450012600261ULL

typedef struct {
    PyObject_HEAD
    Py_ssize_t max_keys, max_live, slots, live, clock;
    uint64_t threshold;           /* counted: the sampling rate's threshold (its weight) */
    double weight;
    uint64_t track;               /* tracked: threshold <= track, halved down to it as */
    double track_weight;          /* keys arrive (scale of a distance: SPACE / track) */
    double count_weight;          /* what a counted reference adds: track_weight / weight */
    Py_ssize_t n_bounds;
    double *bounds;
    double *counts;               /* n_bounds + 1, in samples at `threshold` */
    int32_t *tree;                /* Fenwick over the words of live_bits: words + 1 */
    uint64_t *slot_key;           /* slots */
    int64_t *slot_when;           /* slots: the reference number of the slot's reference */
    uint64_t *live_bits;          /* words = slots / 64 */
    Py_ssize_t words;
    KeyTable tbl;                 /* key bits -> slot */
    double sampled;               /* counted references, in samples at `threshold` */
    long long total, forgotten;
    long long refs;               /* every reference seen, sampled or not, counted or not */
    int sampling;                 /* a distance may be scaled: slot_when kept */
    int tuple_hash_ok;            /* the replica below equals hash((key,)) here */
    int busy;                     /* calls reading keys (a key's __hash__ runs Python) */
    PyObject *near;               /* an exact core fed every key (see `near`), or NULL */
    long long far_refs;           /* with `near`: references beyond its reach, and of */
    long long far_tracked;        /* them those tracked, since the tracked share changed */
    int nears;                    /* cores holding this one as their near core */
} ReuseCore;

static uint64_t tuple1_hash(uint64_t lane)
{
    uint64_t acc = XXPRIME_5;
    acc += lane * XXPRIME_2;
    acc = (acc << 31) | (acc >> 33);
    acc *= XXPRIME_1;
    acc += 1 ^ (XXPRIME_5 ^ 3527539ULL);
    if (acc == (uint64_t)-1)
        return 1546275796ULL;
    return acc;
}

/* Whether tuple1_hash(hash(k)) equals hash((k,)) in this interpreter: checked once on a few
 * ints; 1 yes, 0 no (then tuples are built), -1 with an exception set. */
static int check_tuple_hash(void)
{
    static const long long probes[] = {0, 1, -2, 12345678901LL, 1LL << 40};
    int ok = 1;
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        PyObject *k = PyLong_FromLongLong(probes[i]);
        PyObject *t = k ? PyTuple_Pack(1, k) : NULL;
        Py_hash_t real = t ? PyObject_Hash(t) : -1;
        Py_hash_t lane = k ? PyObject_Hash(k) : -1;
        Py_XDECREF(t);
        Py_XDECREF(k);
        if (PyErr_Occurred())
            return -1;
        if ((uint64_t)real != tuple1_hash((uint64_t)lane))
            ok = 0;
    }
    return ok;
}

/* hash((key,)) (without building the tuple where `replica_ok`); -1 with an exception set
 * on failure. */
static int key_tuple_hash(PyObject *key, int replica_ok, Py_hash_t *out)
{
    Py_hash_t h;
    if (replica_ok) {
        h = PyObject_Hash(key);
        if (h == -1 && PyErr_Occurred())
            return -1;
        *out = (Py_hash_t)tuple1_hash((uint64_t)h);
        return 0;
    }
    PyObject *t = PyTuple_Pack(1, key);
    if (t == NULL)
        return -1;
    h = PyObject_Hash(t);
    Py_DECREF(t);
    if (h == -1 && PyErr_Occurred())
        return -1;
    *out = h;
    return 0;
}

/* Item i of a PySequence_Fast result as a new reference, or NULL past its end (no exception
 * set). Read again for every item: a key's __hash__ may run Python code that changes a
 * list the caller passed (then the loop sees the list as it is, never freed memory). */
static inline PyObject *fast_item(PyObject *fast, Py_ssize_t i)
{
    if (i >= PySequence_Fast_GET_SIZE(fast))
        return NULL;
    PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
    Py_INCREF(item);
    return item;
}

/* hash((key,)) as an unsigned 64-bit pattern; -1 with an exception set on failure. */
static int key_bits(ReuseCore *self, PyObject *key, uint64_t *bits)
{
    Py_hash_t h;
    if (key_tuple_hash(key, self->tuple_hash_ok, &h) < 0)
        return -1;
    *bits = (uint64_t)h;
    return 0;
}

static inline int slot_live(ReuseCore *self, Py_ssize_t slot)
{
    return (int)((self->live_bits[slot >> 6] >> (slot & 63)) & 1);
}

/* Mark `slot` live (delta 1) or dead (delta -1). */
static inline void tree_add(ReuseCore *self, Py_ssize_t slot, int32_t delta)
{
    uint64_t bit = 1ULL << (slot & 63);
    if (delta > 0)
        self->live_bits[slot >> 6] |= bit;
    else
        self->live_bits[slot >> 6] &= ~bit;
    int32_t *tree = self->tree;
    for (Py_ssize_t i = (slot >> 6) + 1; i <= self->words; i += i & -i)
        tree[i] += delta;
}

static inline long long tree_prefix(ReuseCore *self, Py_ssize_t n) /* slots 0..n-1 */
{
    long long total = 0;
    for (Py_ssize_t i = n >> 6; i > 0; i -= i & -i)
        total += self->tree[i];
    if (n & 63)
        total += __builtin_popcountll(self->live_bits[n >> 6] & ((1ULL << (n & 63)) - 1));
    return total;
}

/* The lowest live slot (the least recently used key); there is one. */
static Py_ssize_t tree_first(ReuseCore *self)
{
    Py_ssize_t pos = 0, step = 1;
    while (step * 2 <= self->words)
        step *= 2;
    for (; step > 0; step /= 2) {
        if (pos + step <= self->words && self->tree[pos + step] < 1)
            pos += step;
    }
    return (pos << 6) + __builtin_ctzll(self->live_bits[pos]);
}

/* Mark live slots 0..n-1 of `words` x 64 slots (all others dead) and build the tree. */
static void tree_fill(int32_t *tree, uint64_t *live_bits, Py_ssize_t words, Py_ssize_t n)
{
    memset(live_bits, 0, sizeof(uint64_t) * (size_t)words);
    for (Py_ssize_t w = 0; w < n >> 6; w++)
        live_bits[w] = ~0ULL;
    if (n & 63)
        live_bits[n >> 6] = (1ULL << (n & 63)) - 1;
    memset(tree, 0, sizeof(int32_t) * (size_t)(words + 1));
    for (Py_ssize_t i = 1; i <= words; i++) {
        tree[i] += __builtin_popcountll(live_bits[i - 1]);
        Py_ssize_t parent = i + (i & -i);
        if (parent <= words)
            tree[parent] += tree[i];
    }
}

/* Free the arrays sized for max_live (the table, the slots, the tree). */
static void reuse_free_sized(ReuseCore *self)
{
    PyMem_Free(self->tree);
    PyMem_Free(self->slot_key);
    PyMem_Free(self->slot_when);
    PyMem_Free(self->live_bits);
    PyMem_Free(self->tbl.key);
    PyMem_Free(self->tbl.val);
    self->tree = NULL;
    self->slot_key = NULL;
    self->slot_when = NULL;
    self->live_bits = NULL;
    self->tbl.key = NULL;
    self->tbl.val = NULL;
}

/* Resize every array for `max_live` live keys, renumbering the live slots 0..n-1 in
 * recency order; -1 with MemoryError set (the old arrays are kept) on failure. */
static int reuse_resize(ReuseCore *self, Py_ssize_t max_live)
{
    Py_ssize_t words = (4 * max_live + 63) / 64, slots = 64 * words, cap = 2;
    int bits = 1;
    while (cap < 2 * max_live) {
        cap *= 2;
        bits++;
    }
    int32_t *tree = PyMem_Malloc(sizeof(int32_t) * (size_t)(words + 1));
    uint64_t *slot_key = PyMem_Calloc((size_t)slots, sizeof(uint64_t));
    /* reference numbers: only a sampled profile caps its distances with them */
    int64_t *slot_when = self->sampling ? PyMem_Calloc((size_t)slots, sizeof(int64_t)) : NULL;
    uint64_t *live_bits = PyMem_Malloc(sizeof(uint64_t) * (size_t)words);
    uint64_t *tbl_key = PyMem_Calloc((size_t)cap, sizeof(uint64_t));
    int32_t *tbl_slot = PyMem_Malloc(sizeof(int32_t) * (size_t)cap);
    if (!tree || !slot_key || (self->sampling && !slot_when) || !live_bits || !tbl_key
            || !tbl_slot) {
        PyMem_Free(tree);
        PyMem_Free(slot_key);
        PyMem_Free(slot_when);
        PyMem_Free(live_bits);
        PyMem_Free(tbl_key);
        PyMem_Free(tbl_slot);
        PyErr_NoMemory();
        return -1;
    }
    memset(tbl_slot, 0xff, sizeof(int32_t) * (size_t)cap);
    Py_ssize_t n = 0;
    for (Py_ssize_t s = 0; s < self->clock; s++) {
        if (!slot_live(self, s))
            continue;
        uint64_t key = self->slot_key[s];
        Py_ssize_t i = (Py_ssize_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
        while (tbl_slot[i] >= 0)
            i = (i + 1) & (cap - 1);
        tbl_key[i] = key;
        tbl_slot[i] = (int32_t)n;
        slot_key[n] = key;
        if (slot_when != NULL)
            slot_when[n] = self->slot_when[s];
        n++;
    }
    tree_fill(tree, live_bits, words, n);
    reuse_free_sized(self);
    self->tree = tree;
    self->slot_key = slot_key;
    self->slot_when = slot_when;
    self->live_bits = live_bits;
    self->words = words;
    self->tbl.key = tbl_key;
    self->tbl.val = tbl_slot;
    self->max_live = max_live;
    self->slots = slots;
    self->tbl.mask = cap - 1;
    self->tbl.shift = 64 - bits;
    self->clock = n;
    return 0;
}

static void reuse_compact(ReuseCore *self)
{
    Py_ssize_t n = 0, slots = self->slots;
    for (Py_ssize_t s = 0; s < slots; s++) {
        if (!slot_live(self, s))
            continue;
        uint64_t bits = self->slot_key[s];
        self->tbl.val[ktab_find(&self->tbl, bits)] = (int32_t)n;
        self->slot_key[n] = bits;
        if (self->sampling)
            self->slot_when[n] = self->slot_when[s];
        n++;
    }
    tree_fill(self->tree, self->live_bits, self->words, n);
    self->clock = n;
}

/* Track the keys below `track` (threshold <= track <= SPACE): the scale of a distance and
 * what a counted reference adds follow from it (at threshold: the rate's own weight, 1). */
static void reuse_set_track(ReuseCore *self, uint64_t track)
{
    int at_rate = track == self->threshold;
    self->track = track;
    self->far_refs = self->far_tracked = 0; /* the ratio of the share before */
    self->track_weight = at_rate ? self->weight : (double)(REUSE_LOW_BITS + 1) / (double)track;
    self->count_weight = at_rate ? 1.0 : self->track_weight / self->weight;
}

/* Halve `track` (not below threshold) and drop the live keys above it, until fewer than
 * max_keys keys are live or track is down to threshold. */
static void reuse_lower_track(ReuseCore *self)
{
    while (self->live >= self->max_keys && self->track > self->threshold) {
        uint64_t half = self->track / 2;
        reuse_set_track(self, half > self->threshold ? half : self->threshold);
        for (Py_ssize_t s = 0; s < self->clock; s++) {
            uint64_t key = self->slot_key[s];
            if (!slot_live(self, s) || (key & REUSE_LOW_BITS) < self->track)
                continue;
            self->live_bits[s >> 6] &= ~(1ULL << (s & 63)); /* the tree: rebuilt below */
            ktab_delete(&self->tbl, ktab_find(&self->tbl, key));
            self->live--;
        }
        reuse_compact(self);
    }
}

/* The bucket of a distance (the first bound >= it); a negative one (cold): the last. */
static Py_ssize_t reuse_bucket(const ReuseCore *self, double distance)
{
    if (distance < 0)
        return self->n_bounds;
    Py_ssize_t lo = 0, hi = self->n_bounds; /* bisect_left */
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (self->bounds[mid] < distance)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* reuse_sample's results besides a bucket (0..n_bounds, the last one cold): the key is not
 * tracked (above the threshold, or dropped earlier in the call), or an error is set. */
#define REUSE_UNTRACKED (-2)
#define REUSE_ERROR (-3)

/* One tracked reference, the `when`-th reference the core has seen (tracked or not); a
 * distance found is at least `floor` (the near core found the block no nearer). Counted
 * (`counted`) in its bucket; returns the bucket (n_bounds: cold), REUSE_UNTRACKED, or
 * REUSE_ERROR with an exception set. */
static Py_ssize_t reuse_sample(ReuseCore *self, uint64_t bits, int counted, int64_t when,
                               double floor)
{
    if ((bits & REUSE_LOW_BITS) >= self->track) /* dropped earlier in this call */
        return REUSE_UNTRACKED;
    Py_ssize_t pos = ktab_find(&self->tbl, bits);
    if (self->tbl.val[pos] < 0 && self->live >= self->max_live
            && self->max_live < self->max_keys) {
        Py_ssize_t grown = 2 * self->max_live;
        if (reuse_resize(self, grown < self->max_keys ? grown : self->max_keys) < 0)
            return REUSE_ERROR;
        pos = ktab_find(&self->tbl, bits);
    }
    if (self->tbl.val[pos] < 0 && self->live >= self->max_keys
            && self->track > self->threshold) {
        reuse_lower_track(self);
        if ((bits & REUSE_LOW_BITS) >= self->track)
            return REUSE_UNTRACKED;
        pos = ktab_find(&self->tbl, bits);
    }
    if (self->clock == self->slots) {
        reuse_compact(self);
        pos = ktab_find(&self->tbl, bits);
    }
    Py_ssize_t now = self->clock++;
    double distance = -1.0; /* cold */
    if (self->tbl.val[pos] < 0) {
        if (self->live >= self->max_keys) {
            Py_ssize_t oldest = tree_first(self);
            tree_add(self, oldest, -1);
            ktab_delete(&self->tbl, ktab_find(&self->tbl, self->slot_key[oldest]));
            self->live--;
            self->forgotten++;
            pos = ktab_find(&self->tbl, bits);
        }
        self->tbl.key[pos] = bits;
        self->live++;
    } else {
        Py_ssize_t previous = self->tbl.val[pos];
        double gap = (double)(now - previous) * self->track_weight;
        if (gap <= self->bounds[0]) {
            distance = gap;
        } else {
            if (self->sampling)
                __builtin_prefetch(&self->slot_when[previous]);
            long long older = tree_prefix(self, previous + 1);
            distance = (double)(self->live - older + 1) * self->track_weight;
            /* No more distinct blocks than references since: a bound the scaled sample
             * can overshoot (a loop of exactly a bucket bound's length lands on it).
             * Every key tracked, the distance is exact and never above it. */
            if (self->track_weight > 1.0) {
                double elapsed = (double)(when - self->slot_when[previous]);
                if (elapsed < distance)
                    distance = elapsed;
            }
        }
        if (distance < floor)
            distance = floor;
        tree_add(self, previous, -1);
    }
    self->tbl.val[pos] = (int32_t)now;
    self->slot_key[now] = bits;
    if (self->sampling)
        self->slot_when[now] = when;
    tree_add(self, now, 1);
    Py_ssize_t b = reuse_bucket(self, distance);
    if (counted) {
        self->sampled += self->count_weight;
        self->counts[b] += self->count_weight;
    }
    return b;
}

/* A reference beyond the near core's reach (it did not find the block), into this core's
 * counts, which then hold those references alone. A tracked one (`bucket` >= 0, where
 * this core put it) stands for as many of them as there were per tracked one since the
 * tracked share last changed (far_refs / far_tracked, itself included), each weighing one
 * reference (1 / weight, in samples at the threshold): the counts so add up to about every
 * such reference, however many more or fewer of them the sample holds than the share
 * expects (a ratio estimate: what SHARDS-adj corrects at the shortest distances, which
 * are the near core's here). An untracked one is only counted in far_refs. */
static void reuse_count_far(ReuseCore *self, Py_ssize_t bucket)
{
    self->far_refs++;
    if (bucket < 0)
        return;
    self->far_tracked++;
    double w = 1.0 / self->weight * (double)self->far_refs / (double)self->far_tracked;
    self->sampled += w;
    self->counts[bucket] += w;
}

/* The sampled keys' bits of one call, hashed before any is sampled (as the Python path
 * does: an unhashable key changes nothing), with their table rows prefetched on the way:
 * the cache misses of a call's keys overlap instead of following one another. */
#define REUSE_STACK_KEYS 64

static int reuse_ready(ReuseCore *self);
static PyTypeObject ReuseCoreType;

/* reuse_record's work, `busy` held. With a near core, every key read goes there first (in
 * order); a sampled key the near core found within its max_keys (its exact distance counted
 * there) only updates this core's recency, and one it did not is counted here at a distance
 * beyond max_keys: this core counts the references beyond the near core's reach alone. */
static int reuse_record_keys(ReuseCore *self, PyObject *keys, int counted)
{
    PyObject *fast = PySequence_Fast(keys, "keys must be a sequence of hashable block keys");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), m = 0;
    uint64_t stack[REUSE_STACK_KEYS];
    int64_t stack_at[REUSE_STACK_KEYS];
    uint64_t near_stack[REUSE_STACK_KEYS];
    unsigned char found_stack[REUSE_STACK_KEYS];
    uint64_t *picked = stack;
    int64_t *picked_at = stack_at; /* the picked keys' positions in the call */
    ReuseCore *near = (ReuseCore *)self->near; /* fixed while `busy` (no __init__ then) */
    uint64_t *every = near != NULL ? near_stack : NULL; /* every key's bits, for `near` */
    unsigned char *found = near != NULL ? found_stack : NULL; /* the near core found it */
    const int sampling = self->sampling; /* fixed while `busy` */
    if (n > REUSE_STACK_KEYS) {
        picked = PyMem_Malloc(sizeof(uint64_t) * (size_t)n);
        picked_at = PyMem_Malloc(sizeof(int64_t) * (size_t)n);
        every = near != NULL ? PyMem_Malloc(sizeof(uint64_t) * (size_t)n) : NULL;
        found = near != NULL ? PyMem_Malloc((size_t)n) : NULL;
    }
    int rc = -1;
    if (picked == NULL || picked_at == NULL || (near != NULL && (every == NULL || found == NULL))) {
        PyErr_NoMemory();
        goto done;
    }
    if (counted)
        self->total += n;
    for (Py_ssize_t i = 0; i < n && i < 8; i++)
        __builtin_prefetch(PySequence_Fast_GET_ITEM(fast, i));
    PyObject *key;
    Py_ssize_t i; /* at the end: the keys read (fewer than n if a key's hash shrank them) */
    for (i = 0; i < n && (key = fast_item(fast, i)) != NULL; i++) {
        if (i + 8 < PySequence_Fast_GET_SIZE(fast)) /* the key's header: its cached hash */
            __builtin_prefetch(PySequence_Fast_GET_ITEM(fast, i + 8));
        uint64_t bits;
        int failed = key_bits(self, key, &bits) < 0;
        Py_DECREF(key);
        if (failed)
            goto done;
        if (every != NULL) {
            every[i] = bits;
            Py_ssize_t row = ktab_home(&near->tbl, bits);
            __builtin_prefetch(&near->tbl.key[row]);
            __builtin_prefetch(&near->tbl.val[row]);
        }
        if ((bits & REUSE_LOW_BITS) < self->track) {
            Py_ssize_t row = ktab_home(&self->tbl, bits);
            __builtin_prefetch(&self->tbl.key[row]);
            __builtin_prefetch(&self->tbl.val[row]);
            picked_at[m] = i;
            picked[m++] = bits;
        }
    }
    int64_t first = self->refs + 1; /* the call's first key is reference number `first` */
    self->refs += i;
    if (near == NULL) {
        for (Py_ssize_t j = 0; j < m; j++) {
            if (reuse_sample(self, picked[j], counted, sampling ? first + picked_at[j] : 0,
                             0.0) == REUSE_ERROR)
                goto done;
        }
        rc = 0;
        goto done;
    }
    /* The near core first: every key read, in order (a key's __hash__ may have
     * re-initialised it above; one never initialised, or now unusable, raises). */
    if (reuse_ready(near) < 0)
        goto done;
    if (counted)
        near->total += n;
    near->refs += i;
    for (Py_ssize_t j = 0; j < i; j++) {
        Py_ssize_t b = reuse_sample(near, every[j], counted, 0, 0.0);
        if (b == REUSE_ERROR)
            goto done;
        found[j] = b < near->n_bounds; /* a distance found: within its max_keys */
    }
    /* Then this core, key by key in order: the picked keys update their recency, and every
     * key the near core did not find goes to reuse_count_far (a tracked one counted at its
     * distance for itself and the untracked ones since, an untracked one only tallied). */
    double floor = (double)near->max_keys + 1.0;
    for (Py_ssize_t j = 0, k = 0; j < i; j++) {
        int far = counted && !found[j];
        Py_ssize_t b = REUSE_UNTRACKED;
        if (k < m && picked_at[k] == j) {
            b = reuse_sample(self, picked[k], 0, sampling ? first + j : 0, floor);
            k++;
            if (b == REUSE_ERROR)
                goto done;
        }
        if (far)
            reuse_count_far(self, b);
    }
    rc = 0;
done:
    if (picked != stack) {
        PyMem_Free(picked);
        PyMem_Free(picked_at);
        PyMem_Free(every);
        PyMem_Free(found);
    }
    Py_DECREF(fast);
    return rc;
}

/* 0 if the core was initialised; else -1 with RuntimeError set (a core made by
 * ReuseCore.__new__ alone has no arrays). */
static int reuse_ready(ReuseCore *self)
{
    if (self->counts != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "ReuseCore is not initialised: "
                    "ReuseCore(max_keys, threshold, weight, bounds[, track])");
    return -1;
}

/* Sample and profile `keys` (counted, or written); -1 with an exception set on failure.
 * `busy` is held while it runs: a key's __hash__ may run Python, which may not
 * re-initialise the core under it (its buffers are sized by the core's settings). */
static int reuse_record(ReuseCore *self, PyObject *keys, int counted)
{
    if (reuse_ready(self) < 0)
        return -1;
    self->busy++;
    int rc = reuse_record_keys(self, keys, counted);
    self->busy--;
    return rc;
}
static PyObject *reuse_reference(ReuseCore *self, PyObject *args)
{
    PyObject *keys;
    int counted = 1;
    if (!PyArg_ParseTuple(args, "O|p", &keys, &counted))
        return NULL;
    return reuse_record(self, keys, counted) < 0 ? NULL : Py_NewRef(Py_None);
}

/* written_then_reference(written, keys): the blocks written since the last lookup (a list,
 * taken and emptied first, even when a key fails), then a lookup's keys, counted: one call
 * where the recorder made two, with a Python frame (kvobs.recorder.Recorder.lookup). */
static PyObject *reuse_written_then_reference(ReuseCore *self, PyObject *const *args,
                                              Py_ssize_t nargs)
{
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError,
                            "written_then_reference() takes 2 arguments (%zd given)", nargs);
    if (reuse_ready(self) < 0)
        return NULL;
    PyObject *written = args[0];
    if (!PyList_Check(written))
        return PyErr_Format(PyExc_TypeError, "written_then_reference(): written must be a "
                            "list, not %.100s", Py_TYPE(written)->tp_name);
    if (PyList_GET_SIZE(written)) {
        /* Taken, then emptied, then recorded (as the Python twin): keys written while the
         * call runs (a key's __hash__, another thread then) wait for the next lookup. */
        PyObject *taken = PyList_GetSlice(written, 0, PY_SSIZE_T_MAX);
        if (taken == NULL)
            return NULL;
        int failed = PyList_SetSlice(written, 0, PyList_GET_SIZE(taken), NULL) < 0 ||
                     reuse_record(self, taken, 0) < 0;
        Py_DECREF(taken);
        if (failed)
            return NULL;
    }
    return reuse_record(self, args[1], 1) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *reuse_counts(ReuseCore *self, PyObject *unused)
{
    if (reuse_ready(self) < 0)
        return NULL;
    PyObject *out = PyList_New(self->n_bounds + 1);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i <= self->n_bounds; i++) {
        PyObject *v = PyFloat_FromDouble(self->counts[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *reuse_stats(ReuseCore *self, PyObject *unused)
{
    if (reuse_ready(self) < 0)
        return NULL;
    return Py_BuildValue("(LdLn)", self->total, self->sampled, self->forgotten, self->live);
}

static void reuse_free_arrays(ReuseCore *self)
{
    PyMem_Free(self->bounds);
    PyMem_Free(self->counts);
    self->bounds = NULL;
    self->counts = NULL;
    reuse_free_sized(self);
}

/* Let go of the near core (not while a call reads keys: __init__ refuses then). */
static void reuse_drop_near(ReuseCore *self)
{
    ReuseCore *near = (ReuseCore *)self->near;
    if (near == NULL)
        return;
    self->near = NULL;
    near->nears--;
    Py_DECREF(near);
}

static void reuse_dealloc(ReuseCore *self)
{
    reuse_drop_near(self);
    reuse_free_arrays(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int reuse_init(ReuseCore *self, PyObject *args, PyObject *kwds)
{
    Py_ssize_t max_keys;
    double weight;
    PyObject *threshold_arg, *bounds, *track_arg = Py_None, *near_arg = Py_None;
    if (!PyArg_ParseTuple(args, "nOdO|OO", &max_keys, &threshold_arg, &weight, &bounds,
                          &track_arg, &near_arg))
        return -1;
    /* as unsigned integers, range-checked (an out-of-range int is an error, not wrapped) */
    unsigned long long threshold = PyLong_AsUnsignedLongLong(threshold_arg);
    if (threshold == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (threshold < 1 || threshold > REUSE_LOW_BITS + 1) {
        PyErr_SetString(PyExc_ValueError, "threshold must be in [1, 2**24]");
        return -1;
    }
    unsigned long long track = threshold;
    if (track_arg != Py_None) {
        track = PyLong_AsUnsignedLongLong(track_arg);
        if (track == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
    }
    if (track < threshold || track > REUSE_LOW_BITS + 1) {
        PyErr_SetString(PyExc_ValueError, "track must be in [threshold, 2**24]");
        return -1;
    }
    if (!(weight >= 1.0) || isinf(weight)) { /* NaN fails the first test */
        PyErr_SetString(PyExc_ValueError, "weight must be a finite number >= 1");
        return -1;
    }
    if (max_keys <= 0 || max_keys > (1 << 28)) {
        PyErr_SetString(PyExc_ValueError, "max_keys must be in [1, 2**28]");
        return -1;
    }
    /* The bounds first, into a buffer of their own: a bound's __float__ runs Python, which
     * must not find the core half set up (nor reset it under this call). */
    PyObject *fast = PySequence_Fast(bounds, "bounds must be a sequence of numbers");
    if (fast == NULL)
        return -1;
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(fast);
    if (nb < 1) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "bounds must not be empty");
        return -1;
    }
    double *parsed = PyMem_Malloc(sizeof(double) * (size_t)nb);
    if (parsed == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        if (i >= PySequence_Fast_GET_SIZE(fast)) { /* a __float__ shrank the list */
            PyErr_SetString(PyExc_ValueError, "bounds changed while they were read");
            PyMem_Free(parsed);
            Py_DECREF(fast);
            return -1;
        }
        double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1.0 && PyErr_Occurred()) {
            PyMem_Free(parsed);
            Py_DECREF(fast);
            return -1;
        }
        parsed[i] = v;
    }
    Py_DECREF(fast);
    /* Nothing is reset while a call reads this core's keys: a key's __hash__ re-initialising
     * the core that is reading it, or a bound's __float__ above starting a call on it. */
    if (self->busy) {
        PyMem_Free(parsed);
        PyErr_SetString(PyExc_RuntimeError, "ReuseCore.__init__ while a call reads its keys");
        return -1;
    }
    /* A core another one feeds keeps its settings (that one counts on them being exact). */
    if (self->nears) {
        PyMem_Free(parsed);
        PyErr_SetString(PyExc_RuntimeError, "ReuseCore.__init__ of a core another core "
                        "holds as its near core");
        return -1;
    }
    /* The near core: exact (every key tracked, weight 1), and no chain: it has no near core
     * of its own (and, held, takes none: above), so the feed is one level deep. */
    ReuseCore *near = NULL;
    if (near_arg != Py_None) {
        const char *why = NULL;
        if (Py_TYPE(near_arg) != &ReuseCoreType)
            why = "near must be a ReuseCore";
        else if (near_arg == (PyObject *)self)
            why = "near must be another ReuseCore";
        else if (((ReuseCore *)near_arg)->counts == NULL)
            why = "near is not initialised";
        else if (((ReuseCore *)near_arg)->threshold != REUSE_LOW_BITS + 1
                 || ((ReuseCore *)near_arg)->track != REUSE_LOW_BITS + 1
                 || ((ReuseCore *)near_arg)->weight != 1.0)
            why = "near must track every key (threshold and track 2**24, weight 1)";
        else if (((ReuseCore *)near_arg)->near != NULL)
            why = "near has a near core of its own";
        if (why != NULL) {
            PyMem_Free(parsed);
            PyErr_SetString(PyExc_ValueError, why);
            return -1;
        }
        near = (ReuseCore *)Py_NewRef(near_arg);
        near->nears++;
    }
    reuse_drop_near(self);
    self->near = (PyObject *)near;
    reuse_free_arrays(self);
    self->max_keys = max_keys;
    self->threshold = threshold;
    self->weight = weight;
    reuse_set_track(self, track);
    /* the reference numbers cap scaled distances: kept whenever a distance may be scaled */
    self->sampling = weight > 1.0 || track > threshold;
    self->n_bounds = nb;
    self->live = self->clock = 0;
    self->bounds = PyMem_Malloc(sizeof(double) * (size_t)nb);
    self->counts = PyMem_Calloc((size_t)nb + 1, sizeof(double));
    if (!self->bounds || !self->counts
            || reuse_resize(self, max_keys < REUSE_INITIAL_LIVE ? max_keys
                                                                : REUSE_INITIAL_LIVE) < 0) {
        PyMem_Free(parsed);
        reuse_free_arrays(self);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    memcpy(self->bounds, parsed, sizeof(double) * (size_t)nb);
    PyMem_Free(parsed);
    self->live = self->clock = 0;
    self->sampled = 0.0;
    self->total = self->forgotten = self->refs = 0;
    /* Check the tuple-hash replica against the interpreter once; else build tuples. */
    self->tuple_hash_ok = check_tuple_hash();
    return self->tuple_hash_ok < 0 ? -1 : 0;
}

static int sample_hash_ok = -1; /* check_tuple_hash(), once */

/* The 64-bit hashes of `keys` (any iterable), in order, into *out (`stack`, room for
 * KEY_STACK_KEYS, or malloc'd: the caller frees it when it is not `stack`): hash(key) of
 * every key, or with `sampled` hash((key,)) of the keys whose bits & mask < threshold.
 * The count, or -1 with an exception set. Shared by sample_bits and the thrash and
 * residency cores. */
#define KEY_STACK_KEYS 64

static Py_ssize_t hash_keys(PyObject *keys, int sampled, uint64_t threshold, uint64_t mask,
                            uint64_t *stack, uint64_t **out)
{
    if (sampled && sample_hash_ok < 0 && (sample_hash_ok = check_tuple_hash()) < 0)
        return -1;
    PyObject *fast = PySequence_Fast(keys, "keys must be an iterable of hashable block keys");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), count = 0;
    uint64_t *bits = n <= KEY_STACK_KEYS ? stack : PyMem_Malloc(sizeof(uint64_t) * (size_t)n);
    if (bits == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key;
    for (Py_ssize_t i = 0; i < n && (key = fast_item(fast, i)) != NULL; i++) {
        Py_hash_t h;
        int failed;
        if (sampled) {
            failed = key_tuple_hash(key, sample_hash_ok, &h) < 0;
        } else {
            h = PyObject_Hash(key);
            failed = h == -1 && PyErr_Occurred();
        }
        Py_DECREF(key);
        if (failed) {
            if (bits != stack)
                PyMem_Free(bits);
            Py_DECREF(fast);
            return -1;
        }
        if (!sampled || ((uint64_t)h & mask) < threshold)
            bits[count++] = (uint64_t)h;
    }
    Py_DECREF(fast);
    *out = bits;
    return count; /* with every key: fewer than n only if a __hash__ shortened the list */
}

/* sample_bits(threshold, mask, keys) -> [hash((key,)) for key in keys if that & mask <
 * threshold]: the keyed trackers' sampling (kvobs.residency), in one call instead of a
 * tuple and a hash per key in Python. Exactly Python's values (signed), so a tracker
 * keys its tables alike with or without the extension. The keys come last so that a
 * functools.partial over the two settings is the tracker's sampler, called with no
 * Python frame. */
static PyObject *sample_bits(PyObject *unused, PyObject *args)
{
    PyObject *keys;
    unsigned long long threshold, mask;
    if (!PyArg_ParseTuple(args, "KKO", &threshold, &mask, &keys))
        return NULL;
    uint64_t stack[KEY_STACK_KEYS], *bits;
    Py_ssize_t n = hash_keys(keys, 1, threshold, mask, stack, &bits);
    if (n < 0)
        return NULL;
    PyObject *picked = PyList_New(n);
    for (Py_ssize_t i = 0; picked != NULL && i < n; i++) {
        PyObject *v = PyLong_FromSsize_t((Py_ssize_t)bits[i]); /* Python's signed value */
        if (v == NULL)
            Py_CLEAR(picked);
        else
            PyList_SET_ITEM(picked, i, v);
    }
    if (bits != stack)
        PyMem_Free(bits);
    return picked;
}

/* ---- block pool walk (kvobs.adapters.vllm.block_pool) ---------------------------------
 *
 * walk_slots(blocks, hash_member, count_member) -> (hashed, in_use, cached)
 *     `blocks` a list of objects of one __slots__ class; `hash_member` / `count_member` the
 *     class's member descriptors of the prefix hash (None: no hash) and the reference count
 *     (an int). Counts blocks holding a hash, blocks with a reference, and unreferenced
 *     blocks holding a hash. Reads each block's two slots at their offsets, holding the GIL
 *     throughout: the engine cannot move in the middle of the walk. An object of another
 *     type, or a count that is not an int, is a TypeError (the caller then walks in Python).
 */

static Py_ssize_t member_offset(PyObject *descr, PyTypeObject **owner)
{
    if (!PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
        PyErr_SetString(PyExc_TypeError, "walk_slots: expected a __slots__ member descriptor");
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX && member->type != T_OBJECT) {
        PyErr_SetString(PyExc_TypeError, "walk_slots: the member does not hold an object");
        return -1;
    }
    *owner = PyDescr_TYPE(descr);
    return member->offset;
}

static PyObject *walk_slots(PyObject *unused, PyObject *args)
{
    PyObject *blocks, *hash_member, *count_member;
    if (!PyArg_ParseTuple(args, "O!OO", &PyList_Type, &blocks, &hash_member, &count_member))
        return NULL;
    PyTypeObject *hash_type, *count_type;
    Py_ssize_t hash_at = member_offset(hash_member, &hash_type);
    if (hash_at < 0)
        return NULL;
    Py_ssize_t count_at = member_offset(count_member, &count_type);
    if (count_at < 0)
        return NULL;
    Py_ssize_t hashed_used = 0, cached = 0, used = 0, n = PyList_GET_SIZE(blocks);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *block = PyList_GET_ITEM(blocks, i);
        if (!PyObject_TypeCheck(block, hash_type) || !PyObject_TypeCheck(block, count_type)) {
            PyErr_SetString(PyExc_TypeError, "walk_slots: a block of another type");
            return NULL;
        }
        PyObject *hash = *(PyObject **)((char *)block + hash_at);
        PyObject *count = *(PyObject **)((char *)block + count_at);
        if (count == NULL || !PyLong_CheckExact(count)) {
            PyErr_SetString(PyExc_TypeError, "walk_slots: a reference count that is no int");
            return NULL;
        }
        int referenced = PyObject_IsTrue(count); /* an exact int: its own bool, no Python */
        if (hash != NULL && hash != Py_None) {
            if (referenced)
                hashed_used++;
            else
                cached++;
        } else if (referenced) {
            used++;
        }
    }
    return Py_BuildValue("(nnn)", hashed_used + cached, used + hashed_used, cached);
}

static PyMemberDef reuse_members[] = {
    {"track", T_ULONGLONG, offsetof(ReuseCore, track), READONLY,
     "The tracking threshold now (threshold <= track <= 2**24)."},
    {"near", T_OBJECT, offsetof(ReuseCore, near), READONLY,
     "The exact core fed every key, or None."},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef reuse_methods[] = {
    {"reference", (PyCFunction)reuse_reference, METH_VARARGS,
     "reference(keys, counted=True): sample and profile block keys."},
    {"written_then_reference", (PyCFunction)(void (*)(void))reuse_written_then_reference,
     METH_FASTCALL, "written_then_reference(written, keys): written blocks (the list is "
     "emptied), then a lookup's keys."},
    {"counts", (PyCFunction)reuse_counts, METH_NOARGS,
     "Counted references per bucket, in samples at threshold (the last: beyond every "
     "bound, cold)."},
    {"stats", (PyCFunction)reuse_stats, METH_NOARGS,
     "(total references, counted references in samples, forgotten keys, live keys)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReuseCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvobs.kernels._native.ReuseCore",
    .tp_basicsize = sizeof(ReuseCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sampled reuse-distance profile core (see kvobs.reuse).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reuse_init,
    .tp_dealloc = (destructor)reuse_dealloc,
    .tp_methods = reuse_methods,
    .tp_members = reuse_members,
};

/* ---- KeyLru: bounded per-key state in recency order (the thrash and residency cores) ----
 *
 * Entries of `width` int64 values each, found by a key's 64-bit hash through a KeyTable and
 * kept in a doubly linked list (oldest first) with a free list. The arrays start at
 * LRU_INITIAL entries and double up to `max` entries; past that, the oldest entry makes
 * room for a new key. No Python object is held: a core that changes its list without
 * running Python code is atomic under the GIL and needs no lock of its own.
 */

#define LRU_INITIAL 4096
#define LRU_NIL (-1)

typedef struct {
    Py_ssize_t max, entries, count;
    int width;            /* int64 values per entry */
    uint64_t *key;        /* entries */
    int64_t *data;        /* entries x width */
    int32_t *prev, *next; /* entries: the recency list; next doubles as the free list */
    int32_t head, tail, free;
    KeyTable tbl;         /* key bits -> entry; 2 x entries rows or more */
} KeyLru;

static void lru_unlink(KeyLru *l, int32_t e)
{
    int32_t p = l->prev[e], n = l->next[e];
    if (p == LRU_NIL)
        l->head = n;
    else
        l->next[p] = n;
    if (n == LRU_NIL)
        l->tail = p;
    else
        l->prev[n] = p;
}

static void lru_append(KeyLru *l, int32_t e)
{
    l->prev[e] = l->tail;
    l->next[e] = LRU_NIL;
    if (l->tail == LRU_NIL)
        l->head = e;
    else
        l->next[l->tail] = e;
    l->tail = e;
}

/* Forget entry e (its table row at `row`). */
static void lru_drop(KeyLru *l, int32_t e, Py_ssize_t row)
{
    lru_unlink(l, e);
    ktab_delete(&l->tbl, row);
    l->next[e] = l->free;
    l->free = e;
    l->count--;
}

static void lru_free_arrays(KeyLru *l)
{
    PyMem_Free(l->key);
    PyMem_Free(l->data);
    PyMem_Free(l->prev);
    PyMem_Free(l->next);
    PyMem_Free(l->tbl.key);
    PyMem_Free(l->tbl.val);
    l->key = NULL;
    l->data = NULL;
    l->prev = l->next = NULL;
    l->tbl.key = NULL;
    l->tbl.val = NULL;
}

/* Size the arrays for `entries` keys, keeping the tracked ones in order; -1 on no memory
 * (the old arrays are kept). */
static int lru_resize(KeyLru *l, Py_ssize_t entries)
{
    Py_ssize_t cap = 1;
    int bits = 0;
    while (cap < 2 * entries) {
        cap <<= 1;
        bits++;
    }
    size_t w = (size_t)l->width;
    uint64_t *key = PyMem_Malloc(sizeof(uint64_t) * (size_t)entries);
    int64_t *data = PyMem_Malloc(sizeof(int64_t) * w * (size_t)entries);
    int32_t *prev = PyMem_Malloc(sizeof(int32_t) * (size_t)entries);
    int32_t *next = PyMem_Malloc(sizeof(int32_t) * (size_t)entries);
    uint64_t *tbl_key = PyMem_Malloc(sizeof(uint64_t) * (size_t)cap);
    int32_t *tbl_entry = PyMem_Malloc(sizeof(int32_t) * (size_t)cap);
    if (!key || !data || !prev || !next || !tbl_key || !tbl_entry) {
        PyMem_Free(key);
        PyMem_Free(data);
        PyMem_Free(prev);
        PyMem_Free(next);
        PyMem_Free(tbl_key);
        PyMem_Free(tbl_entry);
        PyErr_NoMemory();
        return -1;
    }
    memset(tbl_entry, 0xff, sizeof(int32_t) * (size_t)cap);
    Py_ssize_t n = 0;
    for (int32_t e = l->head; e != LRU_NIL; e = l->next[e], n++) {
        key[n] = l->key[e];
        memcpy(data + w * (size_t)n, l->data + w * (size_t)e, sizeof(int64_t) * w);
        prev[n] = (int32_t)(n - 1);
        next[n] = (int32_t)(n + 1);
    }
    lru_free_arrays(l);
    l->key = key;
    l->data = data;
    l->prev = prev;
    l->next = next;
    l->tbl.key = tbl_key;
    l->tbl.val = tbl_entry;
    l->entries = entries;
    l->tbl.mask = cap - 1;
    l->tbl.shift = 64 - bits;
    l->head = n ? 0 : LRU_NIL;
    l->tail = n ? (int32_t)(n - 1) : LRU_NIL;
    if (n)
        next[n - 1] = LRU_NIL;
    l->free = LRU_NIL;
    for (Py_ssize_t e = entries - 1; e >= n; e--) {
        next[e] = l->free;
        l->free = (int32_t)e;
    }
    for (Py_ssize_t e = 0; e < n; e++) {
        Py_ssize_t row = ktab_find(&l->tbl, key[e]);
        tbl_key[row] = key[e];
        tbl_entry[row] = (int32_t)e;
    }
    return 0;
}

/* An empty list of at most `max` keys; -1 with an exception set. */
static int lru_init(KeyLru *l, Py_ssize_t max, int width, const char *what)
{
    if (max <= 0 || max > (1 << 30)) {
        PyErr_Format(PyExc_ValueError, "%s must be in 1..2**30, got %zd", what, max);
        return -1;
    }
    lru_free_arrays(l);
    l->max = max;
    l->width = width;
    l->count = 0;
    l->head = l->tail = LRU_NIL;
    return lru_resize(l, max < LRU_INITIAL ? max : LRU_INITIAL);
}

/* Whether the list was initialised (a core made by __new__ alone has no arrays); if not, a
 * RuntimeError naming `what` is set. */
static int lru_ready(const KeyLru *l, const char *what)
{
    if (l->key != NULL)
        return 1;
    PyErr_Format(PyExc_RuntimeError, "%s was not initialised", what);
    return 0;
}

/* The entry of `bits`, or -1; *row gets its table row (or where it would go). */
static inline int32_t lru_find(const KeyLru *l, uint64_t bits, Py_ssize_t *row)
{
    *row = ktab_find(&l->tbl, bits);
    return l->tbl.val[*row];
}

/* The entry of `bits` made the newest: found, or added (its data left for the caller to
 * set). Adding grows the arrays while under `max`, else forgets the oldest entry and
 * adds one to *forgotten. */
static int32_t lru_touch(KeyLru *l, uint64_t bits, long long *forgotten)
{
    Py_ssize_t row;
    int32_t e = lru_find(l, bits, &row);
    if (e >= 0) {
        lru_unlink(l, e);
        lru_append(l, e);
        return e;
    }
    if (l->count == l->entries && l->entries < l->max) {
        Py_ssize_t grown = l->entries * 2 > l->max ? l->max : l->entries * 2;
        if (lru_resize(l, grown) == 0)
            row = ktab_find(&l->tbl, bits);
        else
            PyErr_Clear(); /* no memory to grow: forget the oldest instead */
    }
    if (l->count == l->entries) {
        int32_t old = l->head;
        lru_drop(l, old, ktab_find(&l->tbl, l->key[old]));
        (*forgotten)++;
        row = ktab_find(&l->tbl, bits);
    }
    e = l->free;
    l->free = l->next[e];
    l->key[e] = bits;
    l->tbl.key[row] = bits;
    l->tbl.val[row] = e;
    l->count++;
    lru_append(l, e);
    return e;
}

static inline long long monotonic_ns(void) /* the clock of Python's time.monotonic_ns */
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- thrash classification (kvobs.thrash) -----------------------------------------------
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
 * about 50 bytes per tracked block (the Python tracker: about 150 plus the key).
 */

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

/* ---- residency and reuse gaps (kvobs.residency) -----------------------------------------
 *
 * ResidencyCore(threshold, mask, max_keys, buffer_limit): the sampled blocks of one tier,
 * by hash((key,)), each with its birth and last-use time, at most max_keys of them (the
 * oldest birth forgotten first); a key is sampled when its bits & mask < threshold (what
 * sample_bits picks).
 *     born(keys) -> None: sampled keys are born now (birth = last use = now) and become
 *         the newest.
 *     reused(keys) -> None: a tracked sampled key's gap since its last use (seconds) is one
 *         reuse-gap sample; its last use becomes now.
 *     evicted(keys) -> None: a tracked sampled key's time since birth is one residency
 *         sample; it is forgotten.
 *     drain() -> (residency seconds, reuse-gap seconds): the buffered samples, taken.
 *     clock: None (CLOCK_MONOTONIC, read in C) or a callable returning int ns (a
 *         simulation's clock); read once per call, and only when the call sampled a key.
 * The samples wait in two rings of buffer_limit doubles (the oldest overwritten first), as
 * the Python tracker's bounded deques keep them. One call per event: no Python frame
 * between the engine and the table (the Python tracker: a sampling call, then a method).
 */

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

/* ---- a tier's event counters (kvobs.recorder.TierRecorder) --------------------------------
 *
 * TierCore: the base of kvobs.recorder.TierRecorder where the extension is built (the
 * pure-Python twin is kvobs.recorder.PyTierCore; tests/core/test_counters_native.py holds the two
 * to the same counts and the same keyed calls). The event methods of kvobs.events.TierEvents
 * in C: an adapter's reader then pays a C call per event, not a Python frame.
 *     allocate(n=1, keys=None)   allocations += n; keys -> residency.born(keys)
 *     free(n=1, cached=False)    frees_to_cache or frees_to_free += n
 *     reuse(n=1, keys=None)      reuses += n; keys -> thrash.onloaded, residency.reused
 *     store(n=1, keys=None)      stores += n; keys -> thrash.offloaded, residency.born
 *     evict(n=1, reason="capacity", keys=None)
 *                                keys -> thrash.evicted, residency.evicted; then
 *                                evictions_capacity += n, or evictions[reason] += n
 *                                (evictions["other"] for a reason it does not hold)
 * Counts are C long long (n: any int, or an object with __index__); thrash and residency
 * are None or objects with those methods, set by the subclass.
 */

typedef struct {
    PyObject_HEAD
    long long allocations, frees_to_cache, frees_to_free, reuses, stores, evictions_capacity;
    PyObject *evictions, *thrash, *residency;
} TierCore;

static PyObject *s_n, *s_keys, *s_cached, *s_reason, *s_capacity, *s_other, *s_born,
    *s_reused, *s_evicted, *s_offloaded, *s_onloaded, *s_one;

/* The arguments of a METH_FASTCALL | METH_KEYWORDS call, by position or by name, into
 * out[0..n-1] (NULL where not given); -1 with TypeError set for too many, unknown or
 * repeated arguments, or, `lenient` (a reader whose Python twin takes *args, **kwargs),
 * for repeated ones only: the others are ignored. names[] are interned: a keyword is
 * matched by pointer first. */
static int fast_args(const char *fname, PyObject *const *args, Py_ssize_t nargsf,
                     PyObject *kwnames, PyObject *const *names, int n, PyObject **out,
                     int lenient)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs > n && !lenient) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, n,
                     nargs);
        return -1;
    }
    for (int i = 0; i < n; i++)
        out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);
        int found = -1;
        for (int i = 0; i < n && found < 0; i++)
            if (kw == names[i])
                found = i;
        for (int i = 0; i < n && found < 0; i++)
            if (PyUnicode_Compare(kw, names[i]) == 0)
                found = i;
        if (found < 0) {
            if (lenient)
                continue;
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", fname,
                         kw);
            return -1;
        }
        if (out[found] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument %R", fname,
                         kw);
            return -1;
        }
        out[found] = args[nargs + k];
    }
    return 0;
}

/* *field += n (1 when n was not given); -1 with TypeError set when n is no int, or
 * OverflowError when the sum leaves 64 bits (the field unchanged). */
static inline int count_add(long long *field, PyObject *n)
{
    long long v = 1;
    if (n != NULL) {
        v = PyLong_AsLongLong(n);
        if (v == -1 && PyErr_Occurred())
            return -1;
    }
    if (__builtin_add_overflow(*field, v, field)) {
        *field -= v; /* __builtin_add_overflow stored the wrapped sum */
        PyErr_SetString(PyExc_OverflowError, "a kvobs counter would leave 64 bits");
        return -1;
    }
    return 0;
}

/* owner.<method>(keys) where owner is not None, held for the call (the call may run
 * Python code that replaces the tier's tracker); -1 with its exception on failure, or
 * AttributeError where the tracker was deleted (as the Python twin's slot read says). */
static inline int keyed_call(PyObject *owner, const char *what, PyObject *method,
                             PyObject *keys)
{
    if (owner == NULL) {
        PyErr_Format(PyExc_AttributeError, "the tier's %s is not set", what);
        return -1;
    }
    if (owner == Py_None)
        return 0;
    Py_INCREF(owner);
    PyObject *call[2] = {owner, keys};
    PyObject *r = PyObject_VectorcallMethod(method, call, 2, NULL);
    Py_DECREF(owner);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static inline int given(PyObject *keys) { return keys != NULL && keys != Py_None; }

/* allocate / reuse / store: *field += n, then the keys (where given) to the tier's thrash
 * tracker's thrash_method (none where NULL), then to its residency tracker's. */
static PyObject *tier_counted(TierCore *self, const char *fname, long long *field,
                              PyObject *thrash_method, PyObject *residency_method,
                              PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames)
{
    PyObject *const names[] = {s_n, s_keys};
    PyObject *a[2];
    if (fast_args(fname, args, nargsf, kwnames, names, 2, a, 0) < 0 ||
        count_add(field, a[0]) < 0)
        return NULL;
    if (given(a[1]) &&
        ((thrash_method && keyed_call(self->thrash, "thrash", thrash_method, a[1]) < 0) ||
         keyed_call(self->residency, "residency", residency_method, a[1]) < 0))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *tier_allocate(TierCore *self, PyObject *const *args, Py_ssize_t nargsf,
                               PyObject *kwnames)
{
    return tier_counted(self, "allocate", &self->allocations, NULL, s_born, args, nargsf,
                        kwnames);
}

static PyObject *tier_reuse(TierCore *self, PyObject *const *args, Py_ssize_t nargsf,
                            PyObject *kwnames)
{
    return tier_counted(self, "reuse", &self->reuses, s_onloaded, s_reused, args, nargsf,
                        kwnames);
}

static PyObject *tier_store(TierCore *self, PyObject *const *args, Py_ssize_t nargsf,
                            PyObject *kwnames)
{
    return tier_counted(self, "store", &self->stores, s_offloaded, s_born, args, nargsf,
                        kwnames);
}

static PyObject *tier_free(TierCore *self, PyObject *const *args, Py_ssize_t nargsf,
                           PyObject *kwnames)
{
    PyObject *const names[] = {s_n, s_cached};
    PyObject *a[2];
    if (fast_args("free", args, nargsf, kwnames, names, 2, a, 0) < 0)
        return NULL;
    int cached = a[1] == NULL ? 0 : PyObject_IsTrue(a[1]);
    if (cached < 0 || count_add(cached ? &self->frees_to_cache : &self->frees_to_free, a[0]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *tier_evict(TierCore *self, PyObject *const *args, Py_ssize_t nargsf,
                            PyObject *kwnames)
{
    PyObject *const names[] = {s_n, s_reason, s_keys};
    PyObject *a[3];
    if (fast_args("evict", args, nargsf, kwnames, names, 3, a, 0) < 0)
        return NULL;
    if (given(a[2]) && (keyed_call(self->thrash, "thrash", s_evicted, a[2]) < 0 ||
                        keyed_call(self->residency, "residency", s_evicted, a[2]) < 0))
        return NULL;
    PyObject *reason = a[1];
    int capacity = reason == NULL || reason == s_capacity;
    if (!capacity && (capacity = PyObject_RichCompareBool(reason, s_capacity, Py_EQ)) < 0)
        return NULL;
    if (capacity)  /* the common case skips the dict */
        return count_add(&self->evictions_capacity, a[0]) < 0 ? NULL : Py_NewRef(Py_None);
    /* Python code may run below (the reason's __hash__ / __eq__, n's __index__): every
     * object used across it is held here, never borrowed from the tier. */
    PyObject *count = a[0] == NULL ? Py_NewRef(s_one) : PyNumber_Index(a[0]);
    if (count == NULL)
        return NULL;
    PyObject *evictions = self->evictions, *sum = NULL;
    if (evictions == NULL || !PyDict_Check(evictions)) {
        PyErr_SetString(evictions == NULL ? PyExc_AttributeError : PyExc_TypeError,
                        "evict(): the tier's evictions are not set to a dict");
        goto done;
    }
    Py_INCREF(evictions);
    PyObject *held = PyDict_GetItemWithError(evictions, reason);
    if (held == NULL && !PyErr_Occurred()) {  /* a reason it does not hold: other */
        reason = s_other;
        held = PyDict_GetItemWithError(evictions, reason);
        if (held == NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "evict(): the tier's evictions hold no 'other'");
    }
    if (held != NULL) {
        Py_INCREF(held);
        sum = PyNumber_Add(held, count);
        Py_DECREF(held);
        if (sum != NULL && PyDict_SetItem(evictions, reason, sum) < 0)
            Py_CLEAR(sum);
    }
    Py_DECREF(evictions);
done:
    Py_DECREF(count);
    if (sum == NULL)
        return NULL;
    Py_DECREF(sum);
    Py_RETURN_NONE;
}

static int tier_traverse(TierCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->evictions);
    Py_VISIT(self->thrash);
    Py_VISIT(self->residency);
    return 0;
}

static int tier_clear(TierCore *self)
{
    Py_CLEAR(self->evictions);
    Py_CLEAR(self->thrash);
    Py_CLEAR(self->residency);
    return 0;
}

static void tier_dealloc(TierCore *self)
{
    PyObject_GC_UnTrack(self);
    tier_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define TIER_CALL(fn) (PyCFunction)(void (*)(void))(fn), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef tier_methods[] = {
    {"allocate", TIER_CALL(tier_allocate), "allocate($self, /, n=1, keys=None)\n--\n\n"
     "n free blocks were handed to requests (free -> in use)."},
    {"free", TIER_CALL(tier_free), "free($self, /, n=1, cached=False)\n--\n\n"
     "n blocks were released: kept as cached data if cached, else emptied."},
    {"reuse", TIER_CALL(tier_reuse), "reuse($self, /, n=1, keys=None)\n--\n\n"
     "n cached blocks were taken back into use by a prefix hit (cached -> in use)."},
    {"store", TIER_CALL(tier_store), "store($self, /, n=1, keys=None)\n--\n\n"
     "n blocks were written into this tier as cached data (free -> cached)."},
    {"evict", TIER_CALL(tier_evict),
     "evict($self, /, n=1, reason='capacity', keys=None)\n--\n\n"
     "n cached blocks were dropped (cached -> free); unknown reasons count as other."},
    {NULL, NULL, 0, NULL},
};

/* The counters as attributes: ints that fit in 64 bits. A failed assignment leaves the
 * counter as it was (a plain T_LONGLONG member would store -1 first), and none can be
 * deleted. The closure is the field's offset. */
static PyObject *counter_get(PyObject *self, void *offset)
{
    return PyLong_FromLongLong(*(long long *)((char *)self + (size_t)offset));
}

static int counter_set(PyObject *self, PyObject *value, void *offset)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "a kvobs counter cannot be deleted");
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *(long long *)((char *)self + (size_t)offset) = v;
    return 0;
}

#define COUNTER(type, field) \
    {#field, counter_get, counter_set, NULL, (void *)offsetof(type, field)}

static PyGetSetDef tier_getset[] = {
    COUNTER(TierCore, allocations),
    COUNTER(TierCore, frees_to_cache),
    COUNTER(TierCore, frees_to_free),
    COUNTER(TierCore, reuses),
    COUNTER(TierCore, stores),
    COUNTER(TierCore, evictions_capacity),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef tier_members[] = {
    {"evictions", T_OBJECT_EX, offsetof(TierCore, evictions), 0,
     "evictions by reason (a dict; 'capacity' counts in evictions_capacity)"},
    {"thrash", T_OBJECT_EX, offsetof(TierCore, thrash), 0,
     "thrash tracker fed by keyed events, or None"},
    {"residency", T_OBJECT_EX, offsetof(TierCore, residency), 0,
     "residency tracker fed by keyed events, or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject TierCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvobs.kernels._native.TierCore",
    .tp_basicsize = sizeof(TierCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A tier's event counters (the base of kvobs.recorder.TierRecorder).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)tier_dealloc,
    .tp_traverse = (traverseproc)tier_traverse,
    .tp_clear = (inquiry)tier_clear,
    .tp_methods = tier_methods,
    .tp_members = tier_members,
    .tp_getset = tier_getset,
};

/* ---- a transfer link's event counters (kvobs.recorder.LinkRecorder) -----------------------
 *
 * LinkCore: the base of kvobs.recorder.LinkRecorder where the extension is built (the
 * pure-Python twin is kvobs.recorder.PyLinkCore, held to the same counts by
 * tests/core/test_counters_native.py). The kvobs.events.LinkEvents methods in C:
 *     transfer(blocks, nbytes, seconds=None)  operations += 1, blocks, bytes += ...;
 *                                             timed(seconds) where seconds is given
 *     completed(blocks, nbytes, seconds)      transfer, as kvobs.kernels names it
 *     timed(seconds)                          seconds += ...; sample(seconds)
 *     sample(seconds)                         seconds into durations (a deque) while it
 *                                             holds fewer than buffer_limit, else
 *                                             dropped_samples += 1
 *     add_seconds(seconds)                    seconds += ... (no sample)
 *     fail(blocks, nbytes=0) / failed         failures += blocks
 *     drop(blocks)                            drops += blocks
 */

typedef struct {
    PyObject_HEAD
    long long operations, blocks, bytes, failures, drops, dropped_samples;
    double seconds;
    Py_ssize_t buffer_limit;
    PyObject *durations;
} LinkCore;

static PyObject *s_blocks, *s_nbytes, *s_seconds, *s_append;

/* durations.append(seconds) below buffer_limit, else one dropped sample. */
static int link_sample_one(LinkCore *self, PyObject *seconds)
{
    PyObject *durations = self->durations; /* held: its __len__ may replace it */
    if (durations == NULL || durations == Py_None) {
        PyErr_SetString(PyExc_AttributeError, "sample(): the link's durations are not set");
        return -1;
    }
    Py_INCREF(durations);
    int rc = 0;
    Py_ssize_t held = PyObject_Size(durations);
    if (held < 0) {
        rc = -1;
    } else if (held >= self->buffer_limit) {
        self->dropped_samples++;
    } else {
        PyObject *call[2] = {durations, seconds};
        PyObject *r = PyObject_VectorcallMethod(s_append, call, 2, NULL);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(durations);
    return rc;
}

static int link_timed_one(LinkCore *self, PyObject *seconds)
{
    double s = PyFloat_AsDouble(seconds);
    if (s == -1.0 && PyErr_Occurred())
        return -1;
    self->seconds += s;
    return link_sample_one(self, seconds);
}

/* transfer / completed: a batch landed (timed where seconds is given and not None). The
 * counts move only once every argument was read (a bad one changes nothing). */
static PyObject *link_landed(LinkCore *self, const char *fname, int need_seconds,
                             PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames)
{
    PyObject *const names[] = {s_blocks, s_nbytes, s_seconds};
    PyObject *a[3];
    if (fast_args(fname, args, nargsf, kwnames, names, 3, a, 0) < 0)
        return NULL;
    for (int i = 0; i < 2 + need_seconds; i++)
        if (a[i] == NULL)
            return PyErr_Format(PyExc_TypeError, "%s() missing required argument %R", fname,
                                names[i]);
    long long blocks = PyLong_AsLongLong(a[0]), nbytes = 0;
    if ((blocks == -1 && PyErr_Occurred()) ||
        ((nbytes = PyLong_AsLongLong(a[1])) == -1 && PyErr_Occurred()))
        return NULL;
    long long operations, moved, sized;
    if (__builtin_add_overflow(self->operations, 1, &operations) ||
        __builtin_add_overflow(self->blocks, blocks, &moved) ||
        __builtin_add_overflow(self->bytes, nbytes, &sized))
        return PyErr_Format(PyExc_OverflowError, "%s(): a kvobs counter would leave 64 bits",
                            fname);
    self->operations = operations;
    self->blocks = moved;
    self->bytes = sized;
    if (given(a[2]) && link_timed_one(self, a[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *link_transfer(LinkCore *self, PyObject *const *args, Py_ssize_t nargsf,
                               PyObject *kwnames)
{
    return link_landed(self, "transfer", 0, args, nargsf, kwnames);
}

static PyObject *link_completed(LinkCore *self, PyObject *const *args, Py_ssize_t nargsf,
                                PyObject *kwnames)
{
    return link_landed(self, "completed", 1, args, nargsf, kwnames);
}

/* The one argument `name` of fname(name), by position or keyword; NULL with TypeError. */
static PyObject *one_arg(const char *fname, PyObject *name, PyObject *const *args,
                         Py_ssize_t nargsf, PyObject *kwnames)
{
    PyObject *const names[] = {name};
    PyObject *a[1];
    if (fast_args(fname, args, nargsf, kwnames, names, 1, a, 0) < 0)
        return NULL;
    if (a[0] == NULL)
        PyErr_Format(PyExc_TypeError, "%s() missing required argument %R", fname, name);
    return a[0];
}

static PyObject *link_timed(LinkCore *self, PyObject *const *args, Py_ssize_t nargsf,
                            PyObject *kwnames)
{
    PyObject *seconds = one_arg("timed", s_seconds, args, nargsf, kwnames);
    return seconds == NULL || link_timed_one(self, seconds) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *link_sample(LinkCore *self, PyObject *const *args, Py_ssize_t nargsf,
                             PyObject *kwnames)
{
    PyObject *seconds = one_arg("sample", s_seconds, args, nargsf, kwnames);
    return seconds == NULL || link_sample_one(self, seconds) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *link_add_seconds(LinkCore *self, PyObject *const *args, Py_ssize_t nargsf,
                                  PyObject *kwnames)
{
    PyObject *seconds = one_arg("add_seconds", s_seconds, args, nargsf, kwnames);
    if (seconds == NULL)
        return NULL;
    double v = PyFloat_AsDouble(seconds);
    if (v == -1.0 && PyErr_Occurred())
        return NULL;
    self->seconds += v;
    Py_RETURN_NONE;
}

static PyObject *link_add_bytes(LinkCore *self, PyObject *const *args, Py_ssize_t nargsf,
                                PyObject *kwnames)
{
    PyObject *nbytes = one_arg("add_bytes", s_nbytes, args, nargsf, kwnames);
    return nbytes == NULL || count_add(&self->bytes, nbytes) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *link_fail(LinkCore *self, PyObject *const *args, Py_ssize_t nargsf,
                           PyObject *kwnames)
{
    PyObject *const names[] = {s_blocks, s_nbytes};
    PyObject *a[2];
    if (fast_args("fail", args, nargsf, kwnames, names, 2, a, 0) < 0)
        return NULL;
    if (a[0] == NULL)
        return PyErr_Format(PyExc_TypeError, "fail() missing required argument 'blocks'");
    return count_add(&self->failures, a[0]) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *link_drop(LinkCore *self, PyObject *const *args, Py_ssize_t nargsf,
                           PyObject *kwnames)
{
    PyObject *blocks = one_arg("drop", s_blocks, args, nargsf, kwnames);
    return blocks == NULL || count_add(&self->drops, blocks) < 0 ? NULL : Py_NewRef(Py_None);
}

static int link_traverse(LinkCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->durations);
    return 0;
}

static int link_clear(LinkCore *self)
{
    Py_CLEAR(self->durations);
    return 0;
}

static void link_dealloc(LinkCore *self)
{
    PyObject_GC_UnTrack(self);
    link_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef link_methods[] = {
    {"transfer", TIER_CALL(link_transfer), "transfer($self, /, blocks, nbytes, seconds=None)\n"
     "--\n\nA batch of blocks (nbytes bytes) landed, in seconds if timed."},
    {"completed", TIER_CALL(link_completed), "completed($self, /, blocks, nbytes, seconds)\n"
     "--\n\ntransfer, as kvobs.kernels.link.TransferLink names it."},
    {"timed", TIER_CALL(link_timed), "timed($self, /, seconds)\n--\n\n"
     "One transfer took seconds (device time where there is a device)."},
    {"sample", TIER_CALL(link_sample), "sample($self, /, seconds)\n--\n\n"
     "A duration sample alone (its seconds summed elsewhere)."},
    {"add_seconds", TIER_CALL(link_add_seconds), "add_seconds($self, /, seconds)\n--\n\n"
     "Seconds spent moving, summed over transfers (no duration sample)."},
    {"add_bytes", TIER_CALL(link_add_bytes), "add_bytes($self, /, nbytes)\n--\n\n"
     "Bytes moved, summed over transfers (counted apart from them)."},
    {"fail", TIER_CALL(link_fail), "fail($self, /, blocks, nbytes=0)\n--\n\n"
     "A batch of blocks failed to move."},
    {"failed", TIER_CALL(link_fail), "failed($self, /, blocks, nbytes=0)\n--\n\n"
     "fail, as kvobs.kernels.link.TransferLink names it."},
    {"drop", TIER_CALL(link_drop), "drop($self, /, blocks)\n--\n\n"
     "Distinct blocks refused because the destination tier was full."},
    {NULL, NULL, 0, NULL},
};

static PyObject *seconds_get(LinkCore *self, void *unused)
{
    return PyFloat_FromDouble(self->seconds);
}

static int seconds_set(LinkCore *self, PyObject *value, void *unused)
{
    double v = value == NULL ? -1.0 : PyFloat_AsDouble(value);
    if (value == NULL)
        PyErr_SetString(PyExc_TypeError, "a kvobs counter cannot be deleted");
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    self->seconds = v;
    return 0;
}

static PyObject *limit_get(LinkCore *self, void *unused)
{
    return PyLong_FromSsize_t(self->buffer_limit);
}

static int limit_set(LinkCore *self, PyObject *value, void *unused)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "buffer_limit cannot be deleted");
        return -1;
    }
    Py_ssize_t v = PyLong_AsSsize_t(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    self->buffer_limit = v;
    return 0;
}

static PyGetSetDef link_getset[] = {
    COUNTER(LinkCore, operations),
    COUNTER(LinkCore, blocks),
    COUNTER(LinkCore, bytes),
    COUNTER(LinkCore, failures),
    COUNTER(LinkCore, drops),
    COUNTER(LinkCore, dropped_samples),
    {"seconds", (getter)seconds_get, (setter)seconds_set, "seconds spent moving", NULL},
    {"buffer_limit", (getter)limit_get, (setter)limit_set,
     "most duration samples held between collections", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef link_members[] = {
    {"durations", T_OBJECT_EX, offsetof(LinkCore, durations), 0,
     "duration samples waiting for collection (a deque)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LinkCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvobs.kernels._native.LinkCore",
    .tp_basicsize = sizeof(LinkCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A transfer link's event counters (the base of kvobs.recorder.LinkRecorder).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)link_dealloc,
    .tp_traverse = (traverseproc)link_traverse,
    .tp_clear = (inquiry)link_clear,
    .tp_methods = link_methods,
    .tp_members = link_members,
    .tp_getset = link_getset,
};

/* ---- vLLM get_new_blocks readers (kvobs.adapters.vllm.block_pool) ----------------------
 *
 * new_blocks_before(inst, num_blocks) -> int
 *     The blocks BlockPool.get_new_blocks(num_blocks) is about to evict: of the first
 *     num_blocks blocks linked after the free queue's fake head (those it pops), the ones
 *     holding a prefix hash. inst.free_walk is (head, next_member, hash_member): the fake
 *     head and the block class's __slots__ descriptors of next_free_block and _block_hash
 *     (None, None: read as attributes). A block of another type than the descriptors' is
 *     read as attributes too. What block_pool.python_new_blocks_before does; it runs on
 *     every allocation, holding the GIL (the engine cannot move under the walk).
 * new_blocks_after(inst, evicted, result, num_blocks) -> None
 *     The call returned: inst.tier.allocate(num_blocks), then, where evicted is not 0,
 *     inst.tier.evict(evicted, "capacity"); added to a C TierCore's counters in place
 *     (what those two calls do without keys), else through the two methods. What
 *     block_pool.python_new_blocks_after does.
 * Arguments may also come by keyword (the wrappers of engines whose signature is not
 * plain), and more may follow (ignored, as the Python twins' *args / **kwargs).
 */

static PyObject *s_free_walk, *s_next_free_block, *s_block_hash, *s_tier, *s_allocate,
    *s_evict;
static PyObject *s_before_args[2], *s_after_args[4];

/* `block`'s slot at `at` (of type `owner`), or its attribute `name` where it is of another
 * type or at is -1: a new reference, None for an empty slot, NULL with an error set. */
static PyObject *slot_or_attr(PyObject *block, Py_ssize_t at, PyTypeObject *owner,
                              PyObject *name)
{
    if (at >= 0 && PyObject_TypeCheck(block, owner)) {
        PyObject *v = *(PyObject **)((char *)block + at);
        return Py_NewRef(v != NULL ? v : Py_None);
    }
    return PyObject_GetAttr(block, name);
}

/* Of the first `n` blocks linked after `head` (through next_free_block), those holding a
 * prefix hash (_block_hash not None), each read by its slot offset where the block is of
 * the slot's type, else as an attribute; -1 with an error set. */
static Py_ssize_t hashed_after_head(PyObject *head, Py_ssize_t n, Py_ssize_t next_at,
                                    PyTypeObject *next_type, Py_ssize_t hash_at,
                                    PyTypeObject *hash_type)
{
    PyObject *block = Py_NewRef(head);
    Py_ssize_t hashed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *next = slot_or_attr(block, next_at, next_type, s_next_free_block);
        Py_DECREF(block);
        if (next == NULL)
            return -1;
        block = next;
        if (block == Py_None)
            break;
        PyObject *hash = slot_or_attr(block, hash_at, hash_type, s_block_hash);
        if (hash == NULL) {
            Py_DECREF(block);
            return -1;
        }
        hashed += hash != Py_None;
        Py_DECREF(hash);
    }
    Py_DECREF(block);
    return hashed;
}

/* get_new_blocks returned: num_blocks allocations, evicted of them capacity evictions
 * (`any`: evicted is true), added to a C tier's counters in place; -1 with an error set. */
static int tier_core_new_blocks(TierCore *core, PyObject *num_blocks, PyObject *evicted,
                                int any)
{
    return count_add(&core->allocations, num_blocks) < 0 ||
           (any && count_add(&core->evictions_capacity, evicted) < 0) ? -1 : 0;
}

static PyObject *new_blocks_before(PyObject *unused, PyObject *const *args, Py_ssize_t nargsf,
                                   PyObject *kwnames)
{
    PyObject *a[2];
    if (fast_args("new_blocks_before", args, nargsf, kwnames, s_before_args, 2, a, 1) < 0)
        return NULL;
    if (a[0] == NULL || a[1] == NULL)
        return PyErr_Format(PyExc_TypeError, "new_blocks_before: missing %U",
                            s_before_args[a[0] == NULL ? 0 : 1]);
    Py_ssize_t n = PyLong_AsSsize_t(a[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    PyObject *walk = PyObject_GetAttr(a[0], s_free_walk);
    if (walk == NULL)
        return NULL;
    if (!PyTuple_Check(walk) || PyTuple_GET_SIZE(walk) != 3) {
        Py_DECREF(walk);
        return PyErr_Format(PyExc_TypeError, "new_blocks_before: free_walk must be a tuple "
                                             "(head, next_member, hash_member)");
    }
    Py_ssize_t next_at = -1, hash_at = -1;
    PyTypeObject *next_type = NULL, *hash_type = NULL;
    PyObject *next_member = PyTuple_GET_ITEM(walk, 1), *hash_member = PyTuple_GET_ITEM(walk, 2);
    if (next_member != Py_None && hash_member != Py_None &&
        ((next_at = member_offset(next_member, &next_type)) < 0 ||
         (hash_at = member_offset(hash_member, &hash_type)) < 0)) {
        Py_DECREF(walk);
        return NULL;
    }
    Py_ssize_t hashed = hashed_after_head(PyTuple_GET_ITEM(walk, 0), n, next_at, next_type,
                                          hash_at, hash_type);
    Py_DECREF(walk);
    return hashed < 0 ? NULL : PyLong_FromSsize_t(hashed);
}


static PyObject *new_blocks_after(PyObject *unused, PyObject *const *args, Py_ssize_t nargsf,
                                  PyObject *kwnames)
{
    PyObject *a[4];
    if (fast_args("new_blocks_after", args, nargsf, kwnames, s_after_args, 4, a, 1) < 0)
        return NULL;
    for (int i = 0; i < 4; i++)
        if (a[i] == NULL)
            return PyErr_Format(PyExc_TypeError, "new_blocks_after: missing %U",
                                s_after_args[i]);
    PyObject *evicted = a[1], *num_blocks = a[3];
    int any = PyObject_IsTrue(evicted);
    if (any < 0)
        return NULL;
    PyObject *tier = PyObject_GetAttr(a[0], s_tier);
    if (tier == NULL)
        return NULL;
    int rc = 0;
    if (PyObject_TypeCheck(tier, &TierCoreType)) {
        rc = tier_core_new_blocks((TierCore *)tier, num_blocks, evicted, any);
    } else {
        PyObject *r = PyObject_CallMethodOneArg(tier, s_allocate, num_blocks);
        if (r != NULL && any) {
            Py_DECREF(r);
            PyObject *call[3] = {tier, evicted, s_capacity};
            r = PyObject_VectorcallMethod(s_evict, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                          NULL);
        }
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(tier);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* PoolReader(head, next_member, hash_member, tier): new_blocks_before and new_blocks_after
 * bound to one pool, as one callable: called as the `before` (inst, num_blocks) it counts
 * the hashed blocks among the num_blocks linked after `head`; as the `after` (inst,
 * evicted, result, num_blocks) it adds num_blocks to tier's allocations and evicted to its
 * capacity evictions. The same counts as the two functions (and their Python twins), with
 * what they read held in one object (the slot offsets resolved once, the tier a C TierCore),
 * so an allocation touches no attribute of inst, and one object for both readers. num_blocks
 * may come by keyword. Holds the head block (which links the pool's blocks, which hold
 * the pool, which holds its wrappers): collected as a cycle. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *head, *tier, *next_member, *hash_member;
    Py_ssize_t next_at, hash_at;
    PyTypeObject *next_type, *hash_type;
} PoolReader;

static PyObject *s_num_blocks;

static PyObject *pool_reader_call(PoolReader *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *num_blocks = nargs > 0 ? args[nargs - 1] : NULL;
    Py_ssize_t given = nargs;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        if (PyTuple_GET_SIZE(kwnames) != 1 ||
            PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_num_blocks) != 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "PoolReader: only num_blocks may come by "
                                                 "keyword");
            return NULL;
        }
        num_blocks = args[nargs];
        given = nargs + 1;
    }
    if (given == 2) { /* before(inst, num_blocks) */
        Py_ssize_t n = PyLong_AsSsize_t(num_blocks);
        if (n == -1 && PyErr_Occurred())
            return NULL;
        Py_ssize_t hashed = hashed_after_head(self->head, n, self->next_at, self->next_type,
                                              self->hash_at, self->hash_type);
        return hashed < 0 ? NULL : PyLong_FromSsize_t(hashed);
    }
    if (given == 4) { /* after(inst, evicted, result, num_blocks) */
        int any = PyObject_IsTrue(args[1]);
        if (any < 0 || tier_core_new_blocks((TierCore *)self->tier, num_blocks, args[1], any) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    return PyErr_Format(PyExc_TypeError, "PoolReader: called with %zd arguments: 2 (a "
                        "before) or 4 (an after)", given);
}

static PyObject *pool_reader_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"head", "next_member", "hash_member", "tier", NULL};
    PyObject *head, *next_member, *hash_member, *tier;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO", kwlist, &head, &next_member,
                                     &hash_member, &tier))
        return NULL;
    if (!PyObject_TypeCheck(tier, &TierCoreType))
        return PyErr_Format(PyExc_TypeError, "PoolReader: tier must be a TierCore");
    PyTypeObject *next_type, *hash_type;
    Py_ssize_t next_at = member_offset(next_member, &next_type);
    if (next_at < 0)
        return NULL;
    Py_ssize_t hash_at = member_offset(hash_member, &hash_type);
    if (hash_at < 0)
        return NULL;
    PoolReader *self = (PoolReader *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)pool_reader_call;
    self->head = Py_NewRef(head);
    self->tier = Py_NewRef(tier);
    /* the descriptors hold their types and members: kept for as long as the offsets */
    self->next_member = Py_NewRef(next_member);
    self->hash_member = Py_NewRef(hash_member);
    self->next_at = next_at;
    self->hash_at = hash_at;
    self->next_type = next_type;
    self->hash_type = hash_type;
    return (PyObject *)self;
}

static int pool_reader_traverse(PoolReader *self, visitproc visit, void *arg)
{
    Py_VISIT(self->head);
    Py_VISIT(self->tier);
    Py_VISIT(self->next_member);
    Py_VISIT(self->hash_member);
    return 0;
}

static int pool_reader_clear(PoolReader *self)
{
    Py_CLEAR(self->head);
    Py_CLEAR(self->tier);
    Py_CLEAR(self->next_member);
    Py_CLEAR(self->hash_member);
    return 0;
}

static void pool_reader_dealloc(PoolReader *self)
{
    PyObject_GC_UnTrack(self);
    pool_reader_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pool_reader_self(PyObject *self, PyObject *unused)
{
    return Py_NewRef(self);
}

static PyMethodDef pool_reader_methods[] = {
    {"__copy__", pool_reader_self, METH_NOARGS, NULL}, /* kept under copy, as a function is */
    {"__deepcopy__", pool_reader_self, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PoolReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvobs.kernels._native.PoolReader",
    .tp_basicsize = sizeof(PoolReader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "PoolReader(head, next_member, hash_member, tier): a vLLM pool's get_new_blocks "
              "readers, before and after, bound to it (kvobs.adapters.vllm.block_pool).",
    .tp_new = pool_reader_new,
    .tp_dealloc = (destructor)pool_reader_dealloc,
    .tp_traverse = (traverseproc)pool_reader_traverse,
    .tp_clear = (inquiry)pool_reader_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PoolReader, vectorcall),
    .tp_methods = pool_reader_methods,
};

/* ---- vLLM release readers (kvobs.adapters.vllm.lookups) --------------------------------
 *
 * release_before(inst, request) -> list or None
 *     Before KVCacheManager.free / pop_blocks_for_free: the block hashes of the blocks
 *     `request` cached beyond its prompt, request.block_hashes[start:end] with start =
 *     request.num_prompt_tokens // inst.hash_size and end = inst.cached_blocks.get(
 *     request.request_id, 0) * inst.hashes_per_block (vLLM's count, which the call pops);
 *     None where start >= end. What lookups.python_release_before does.
 * release_after(inst, keys, result, request) -> None
 *     The call returned: keys (where not None or empty) are written into the reuse profile:
 *     appended to inst.written_to (the recorder's written_pending list) while it stays
 *     under WRITTEN_MAX (kvobs.recorder.WRITTEN_MAX), else handed to inst.rec.written(),
 *     which flushes. What lookups.python_release_after does (through rec.written).
 * Arguments may also come by keyword, and more may follow (ignored).
 */

#define WRITTEN_MAX 4096

static PyObject *s_cached_blocks, *s_request_id, *s_hashes_per_block, *s_hash_size,
    *s_num_prompt_tokens, *s_block_hashes, *s_written_to, *s_rec, *s_written;
static PyObject *s_release_before_args[2], *s_release_after_args[4];

static int attr_ssize(PyObject *obj, PyObject *name, Py_ssize_t *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *release_before(PyObject *unused, PyObject *const *args, Py_ssize_t nargsf,
                                PyObject *kwnames)
{
    PyObject *a[2];
    if (fast_args("release_before", args, nargsf, kwnames, s_release_before_args, 2, a, 1) < 0)
        return NULL;
    if (a[0] == NULL || a[1] == NULL)
        return PyErr_Format(PyExc_TypeError, "release_before: missing %U",
                            s_release_before_args[a[0] == NULL ? 0 : 1]);
    PyObject *inst = a[0], *request = a[1];
    PyObject *cached = PyObject_GetAttr(inst, s_cached_blocks);
    if (cached == NULL)
        return NULL;
    if (!PyDict_Check(cached)) {
        Py_DECREF(cached);
        return PyErr_Format(PyExc_TypeError, "release_before: cached_blocks is not a dict");
    }
    PyObject *rid = PyObject_GetAttr(request, s_request_id);
    if (rid == NULL) {
        Py_DECREF(cached);
        return NULL;
    }
    PyObject *count = PyDict_GetItemWithError(cached, rid); /* borrowed */
    Py_XINCREF(count);
    Py_DECREF(rid);
    Py_DECREF(cached);
    if (count == NULL && PyErr_Occurred())
        return NULL;
    Py_ssize_t blocks = 0, per, hash_size, prompt;
    if (count != NULL) {
        blocks = PyLong_AsSsize_t(count);
        Py_DECREF(count);
        if (blocks == -1 && PyErr_Occurred())
            return NULL;
    }
    if (attr_ssize(inst, s_hashes_per_block, &per) < 0 ||
        attr_ssize(inst, s_hash_size, &hash_size) < 0 ||
        attr_ssize(request, s_num_prompt_tokens, &prompt) < 0)
        return NULL;
    if (hash_size <= 0)
        return PyErr_Format(PyExc_ZeroDivisionError, "release_before: hash_size %zd",
                            hash_size);
    /* Python's floor division, for any sign */
    Py_ssize_t start = prompt / hash_size - ((prompt % hash_size) < 0);
    Py_ssize_t end = blocks * per;
    if (start >= end)
        Py_RETURN_NONE;
    PyObject *hashes = PyObject_GetAttr(request, s_block_hashes);
    if (hashes == NULL)
        return NULL;
    PyObject *keys = PySequence_GetSlice(hashes, start, end);
    Py_DECREF(hashes);
    return keys;
}

static PyObject *release_after(PyObject *unused, PyObject *const *args, Py_ssize_t nargsf,
                               PyObject *kwnames)
{
    PyObject *a[4];
    if (fast_args("release_after", args, nargsf, kwnames, s_release_after_args, 4, a, 1) < 0)
        return NULL;
    for (int i = 0; i < 4; i++)
        if (a[i] == NULL)
            return PyErr_Format(PyExc_TypeError, "release_after: missing %U",
                                s_release_after_args[i]);
    PyObject *inst = a[0], *keys = a[1];
    int any = PyObject_IsTrue(keys);
    if (any <= 0)
        return any < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *pending = PyObject_GetAttr(inst, s_written_to);
    if (pending == NULL)
        return NULL;
    Py_ssize_t held = PyList_CheckExact(pending) ? PyList_GET_SIZE(pending) : -1;
    Py_ssize_t n = PyList_CheckExact(keys) ? PyList_GET_SIZE(keys) : -1;
    int rc;
    if (held >= 0 && n >= 0 && held + n <= WRITTEN_MAX) {
        rc = PyList_SetSlice(pending, held, held, keys);
    } else {
        PyObject *rec = PyObject_GetAttr(inst, s_rec);
        PyObject *out = rec ? PyObject_CallMethodOneArg(rec, s_written, keys) : NULL;
        Py_XDECREF(rec);
        rc = out == NULL ? -1 : 0;
        Py_XDECREF(out);
    }
    Py_DECREF(pending);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"has_stream_copy", has_stream_copy, METH_NOARGS, "True where non-temporal stores exist."},
    {"plan_pairs", plan_pairs, METH_VARARGS, "Validate an int64 pair array and coalesce runs."},
    {"plan_seq", plan_seq, METH_VARARGS, "Validate a sequence of pairs and coalesce runs."},
    {"copy_runs", copy_runs, METH_VARARGS, "Copy planned runs for every layer."},
    {"memcpy", native_memcpy, METH_VARARGS, "libc memcpy between two addresses."},
    {"walk_slots", walk_slots, METH_VARARGS,
     "walk_slots(blocks, hash_member, count_member): (hashed, in_use, cached) of a pool."},
    {"sample_bits", sample_bits, METH_VARARGS,
     "sample_bits(threshold, mask, keys): hash((key,)) of the keys whose low bits sample."},
    {"new_blocks_before", (PyCFunction)(void (*)(void))new_blocks_before,
     METH_FASTCALL | METH_KEYWORDS,
     "new_blocks_before(inst, num_blocks): the hashed blocks get_new_blocks will evict "
     "(kvobs.adapters.vllm.block_pool)."},
    {"new_blocks_after", (PyCFunction)(void (*)(void))new_blocks_after,
     METH_FASTCALL | METH_KEYWORDS,
     "new_blocks_after(inst, evicted, result, num_blocks): count get_new_blocks's "
     "allocations and capacity evictions (kvobs.adapters.vllm.block_pool)."},
    {"release_before", (PyCFunction)(void (*)(void))release_before,
     METH_FASTCALL | METH_KEYWORDS,
     "release_before(inst, request): the block hashes a request cached beyond its prompt "
     "(kvobs.adapters.vllm.lookups)."},
    {"release_after", (PyCFunction)(void (*)(void))release_after,
     METH_FASTCALL | METH_KEYWORDS,
     "release_after(inst, keys, result, request): write them into the reuse profile "
     "(kvobs.adapters.vllm.lookups)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_native",
    .m_doc = "Native block-copy loops for kvobs.kernels.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    if (!(s_block_hash = PyUnicode_InternFromString("_block_hash")) ||
        !(s_free_walk = PyUnicode_InternFromString("free_walk")) ||
        !(s_next_free_block = PyUnicode_InternFromString("next_free_block")) ||
        !(s_tier = PyUnicode_InternFromString("tier")) ||
        !(s_allocate = PyUnicode_InternFromString("allocate")) ||
        !(s_evict = PyUnicode_InternFromString("evict")) ||
        !(s_num_blocks = PyUnicode_InternFromString("num_blocks")) ||
        !(s_cached_blocks = PyUnicode_InternFromString("cached_blocks")) ||
        !(s_request_id = PyUnicode_InternFromString("request_id")) ||
        !(s_hashes_per_block = PyUnicode_InternFromString("hashes_per_block")) ||
        !(s_hash_size = PyUnicode_InternFromString("hash_size")) ||
        !(s_num_prompt_tokens = PyUnicode_InternFromString("num_prompt_tokens")) ||
        !(s_block_hashes = PyUnicode_InternFromString("block_hashes")) ||
        !(s_written_to = PyUnicode_InternFromString("written_to")) ||
        !(s_rec = PyUnicode_InternFromString("rec")) ||
        !(s_written = PyUnicode_InternFromString("written")) ||
        !(s_n = PyUnicode_InternFromString("n")) ||
        !(s_keys = PyUnicode_InternFromString("keys")) ||
        !(s_cached = PyUnicode_InternFromString("cached")) ||
        !(s_reason = PyUnicode_InternFromString("reason")) ||
        !(s_capacity = PyUnicode_InternFromString("capacity")) ||
        !(s_other = PyUnicode_InternFromString("other")) ||
        !(s_born = PyUnicode_InternFromString("born")) ||
        !(s_reused = PyUnicode_InternFromString("reused")) ||
        !(s_evicted = PyUnicode_InternFromString("evicted")) ||
        !(s_offloaded = PyUnicode_InternFromString("offloaded")) ||
        !(s_onloaded = PyUnicode_InternFromString("onloaded")) ||
        !(s_one = PyLong_FromLong(1)) ||
        !(s_blocks = PyUnicode_InternFromString("blocks")) ||
        !(s_nbytes = PyUnicode_InternFromString("nbytes")) ||
        !(s_seconds = PyUnicode_InternFromString("seconds")) ||
        !(s_append = PyUnicode_InternFromString("append")))
        return NULL;
    static const char *const before_names[] = {"inst", "num_blocks"};
    static const char *const after_names[] = {"inst", "evicted", "result", "num_blocks"};
    for (int i = 0; i < 2; i++)
        if (!(s_before_args[i] = PyUnicode_InternFromString(before_names[i])))
            return NULL;
    for (int i = 0; i < 4; i++)
        if (!(s_after_args[i] = PyUnicode_InternFromString(after_names[i])))
            return NULL;
    static const char *const release_names[] = {"inst", "keys", "result", "request"};
    for (int i = 0; i < 4; i++)
        if (!(s_release_after_args[i] = PyUnicode_InternFromString(release_names[i])))
            return NULL;
    s_release_before_args[0] = s_release_after_args[0];
    s_release_before_args[1] = s_release_after_args[3];
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    /* each type readied and added under its own name (tp_name's last part) */
    PyTypeObject *types[] = {&ReuseCoreType, &ThrashCoreType, &ResidencyCoreType,
                             &TierCoreType, &LinkCoreType, &PoolReaderType};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (PyModule_AddType(m, types[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    if (hookcall_add(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
