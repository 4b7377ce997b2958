/*
 * The reuse-distance profile of kvobs.reuse, in C (its oracle: tests/reuse_oracle.py).
 *
 * ReuseCore(max_keys, threshold, weight, bounds, track=threshold, near=None, samples=False)
 * holds the stacks of a kvobs.reuse.ReuseProfile and counts their references.
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
 *   written_then_reference(written, keys[, miss_from, miss_to, capacity[, kept_at]]):
 *       reference(written, False) of the list `written` (emptied), then reference(keys,
 *       True), in one call; given a lookup's missed keys (keys[miss_from:miss_to]) and a
 *       capacity in blocks, returns their causes (cold, evicted, kept, recoverable: the
 *       evicted ones within twice the capacity, see reuse_miss_class), and appends the
 *       kept keys' positions in keys to the list kept_at where one is given.
 *   counts() -> [per bucket]; stats() -> (total, sampled, forgotten, live).
 *   hits(size) -> float: with `samples` (every counted distance kept, exactly: the
 *       offline what-if of kvobs.whatif), the counted references at a distance <= size.
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

#include "keys.h"
#include <math.h>
#include <structmember.h>

#define REUSE_INITIAL_LIVE 4096

#define REUSE_LOW_BITS ((1ULL << 24) - 1)
/* The weight a tracked reference keeps per later one in the odds an untracked key is cold:
 * about the last 32 tracked references count, so a workload that turns from new prompts to
 * repeats is followed within a few hundred references at a sampling rate of 1/8. */
#define REUSE_MISS_DECAY (31.0 / 32.0)
/* The capacity step a missed evicted key is told recoverable at: twice the capacity. */
#define REUSE_MISS_WIDER 2.0

/* A counted reference kept with `samples`: its distance (inf: cold) and what it counts. */
typedef struct {
    double distance, weight;
} Kept;

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
    double far_cold, far_seen;    /* the recent counted tracked references beyond `near` */
                                  /* (every one without it), cold / all, each decayed by */
                                  /* REUSE_MISS_DECAY a reference: the odds an untracked */
                                  /* missed key is cold (reuse_miss_class) */
    int nears;                    /* cores holding this one as their near core */
    int keep;                     /* `samples`: every counted distance kept, exact */
    Kept *kept;                   /* kept_len of kept_cap: (distance, weight) in order */
    Py_ssize_t kept_len, kept_cap;
} ReuseCore;

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

/* Room for one more kept sample (grown by half); -1 with MemoryError set. */
static int reuse_keep_room(ReuseCore *self)
{
    if (self->kept_len < self->kept_cap)
        return 0;
    Py_ssize_t cap = self->kept_cap < 1024 ? 1024 : self->kept_cap + self->kept_cap / 2;
    Kept *grown = PyMem_Realloc(self->kept, sizeof(Kept) * (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->kept = grown;
    self->kept_cap = cap;
    return 0;
}

/* One tracked reference, the `when`-th reference the core has seen (tracked or not); a
 * distance found is at least `floor` (the near core found the block no nearer). Counted
 * (`counted`) in its bucket; returns the bucket (n_bounds: cold), REUSE_UNTRACKED, or
 * REUSE_ERROR with an exception set. */
static Py_ssize_t reuse_sample(ReuseCore *self, uint64_t bits, int counted, int64_t when,
                               double floor)
{
    if ((bits & REUSE_LOW_BITS) >= self->track) /* dropped earlier in this call */
        return REUSE_UNTRACKED;
    if (counted && self->keep && reuse_keep_room(self) < 0)
        return REUSE_ERROR;
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
        if (gap <= self->bounds[0] && !self->keep) { /* the first bucket, whatever it is */
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
        if (self->keep)
            self->kept[self->kept_len++] = (Kept){distance < 0 ? INFINITY : distance,
                                                  self->count_weight};
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

/* The sampled keys' bits of one call, hashed before any is sampled (an unhashable key
 * changes no count but the call's total), with their table rows prefetched on the way:
 * the cache misses of a call's keys overlap instead of following one another. */
#define REUSE_STACK_KEYS 64

static int reuse_ready(ReuseCore *self);
static PyTypeObject ReuseCoreType;

/* The missed keys of one lookup (its keys from..to-1), by cause: cold (first reference
 * within the profile's horizon), evicted (seen, farther than `capacity`: an LRU cache of
 * that size had evicted it) or kept (within `capacity`: LRU would have kept it, the
 * engine missed it anyway). */
typedef struct {
    Py_ssize_t from, to;
    double capacity;
    long long cold, evicted, kept;
    long long recoverable;        /* of the evicted, those within REUSE_MISS_WIDER x capacity */
    PyObject *kept_at;            /* a list the kept keys' positions are appended to, or NULL */
    int failed;                   /* appending failed: an exception is set */
} Miss;

/* The cause of key j (its `bits`) in `bucket` of `core`'s bounds (n_bounds: cold), when j
 * is one of the lookup's missed keys. An untracked key (REUSE_UNTRACKED: sampled out, so
 * cold or farther than the exact stack reaches) is classed cold or evicted by the upper
 * hash bits against the share of recent tracked ones found cold (integer counts). */
static void reuse_miss_class(ReuseCore *self, const ReuseCore *core, Miss *miss, Py_ssize_t j,
                             Py_ssize_t bucket, uint64_t bits)
{
    if (miss == NULL || j < miss->from || j >= miss->to)
        return;
    if (bucket == REUSE_UNTRACKED) {
        double cold_share = (self->far_cold + 1.0) / (self->far_seen + 1.0);
        double draw = (double)(bits >> 40) / (double)(1ULL << 24);
        miss->cold += draw < cold_share;
        miss->evicted += draw >= cold_share;
    } else if (bucket >= core->n_bounds) {
        miss->cold++;
    } else if (core->bounds[bucket] <= miss->capacity) {
        miss->kept++;
        if (miss->kept_at != NULL && !miss->failed) {
            PyObject *at = PyLong_FromSsize_t(j);
            miss->failed = at == NULL || PyList_Append(miss->kept_at, at) < 0;
            Py_XDECREF(at);
        }
    } else {
        miss->evicted++;
        miss->recoverable += core->bounds[bucket] <= REUSE_MISS_WIDER * miss->capacity;
    }
}

/* A counted tracked reference beyond the near core (every one without it), into the odds
 * that an untracked one is cold (the recent ones weigh most: REUSE_MISS_DECAY). */
static inline void reuse_far_seen(ReuseCore *self, Py_ssize_t bucket)
{
    if (bucket < 0)
        return;
    self->far_seen = self->far_seen * REUSE_MISS_DECAY + 1.0;
    self->far_cold = self->far_cold * REUSE_MISS_DECAY + (bucket >= self->n_bounds);
}

/* reuse_record's work, `busy` held. With a near core, every key read goes there first (in
 * order); a sampled key the near core found within its max_keys (its exact distance counted
 * there) only updates this core's recency, and one it did not is counted here at a distance
 * beyond max_keys: this core counts the references beyond the near core's reach alone. */
static int reuse_record_keys(ReuseCore *self, PyObject *keys, int counted, Miss *miss)
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
    const int all_bits = near != NULL || miss != NULL; /* every key's bits kept */
    uint64_t *every = all_bits ? near_stack : NULL; /* every key's bits: `near`, `miss` */
    unsigned char *found = near != NULL ? found_stack : NULL; /* the near core found it */
    const int sampling = self->sampling; /* fixed while `busy` */
    if (n > REUSE_STACK_KEYS) {
        picked = PyMem_Malloc(sizeof(uint64_t) * (size_t)n);
        picked_at = PyMem_Malloc(sizeof(int64_t) * (size_t)n);
        every = all_bits ? PyMem_Malloc(sizeof(uint64_t) * (size_t)n) : NULL;
        found = near != NULL ? PyMem_Malloc((size_t)n) : NULL;
    }
    int rc = -1;
    if (picked == NULL || picked_at == NULL || (all_bits && every == NULL)
            || (near != NULL && found == NULL)) {
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
        if (every != NULL)
            every[i] = bits;
        if (near != NULL) {
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
        for (Py_ssize_t j = 0, k = 0; j < i; j++) {
            Py_ssize_t b = REUSE_UNTRACKED;
            if (k < m && picked_at[k] == j) {
                b = reuse_sample(self, picked[k], counted, sampling ? first + j : 0, 0.0);
                k++;
                if (b == REUSE_ERROR)
                    goto done;
                if (counted)
                    reuse_far_seen(self, b);
            }
            if (miss != NULL)
                reuse_miss_class(self, self, miss, j, b, every[j]);
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
        if (found[j] && miss != NULL)
            reuse_miss_class(self, near, miss, j, b, every[j]);
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
        if (far) {
            reuse_count_far(self, b);
            reuse_far_seen(self, b);
        }
        if (!found[j] && miss != NULL)
            reuse_miss_class(self, self, miss, j, b, every[j]);
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
static int reuse_record(ReuseCore *self, PyObject *keys, int counted, Miss *miss)
{
    if (reuse_ready(self) < 0)
        return -1;
    self->busy++;
    int rc = reuse_record_keys(self, keys, counted, miss);
    self->busy--;
    return rc;
}
static PyObject *reuse_reference(ReuseCore *self, PyObject *args)
{
    PyObject *keys;
    int counted = 1;
    if (!PyArg_ParseTuple(args, "O|p", &keys, &counted))
        return NULL;
    return reuse_record(self, keys, counted, NULL) < 0 ? NULL : Py_NewRef(Py_None);
}

/* written_then_reference(written, keys[, miss_from, miss_to, capacity[, kept_at]]): the
 * blocks written since the last lookup (a list, taken and emptied first, even when a key
 * fails), then a lookup's keys, counted: one call where the recorder made two, with a
 * Python frame (kvobs.recorder.Recorder.lookup). Given the lookup's missed keys
 * (keys[miss_from:miss_to]) and a capacity in blocks, returns their causes (cold, evicted,
 * kept) and how many of the evicted twice the capacity would have kept, else None; the
 * kept ones' positions in keys are appended to the list kept_at. */
static PyObject *reuse_written_then_reference(ReuseCore *self, PyObject *const *args,
                                              Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 5 && nargs != 6)
        return PyErr_Format(PyExc_TypeError, "written_then_reference() takes 2, 5 or 6 "
                            "arguments (%zd given)", nargs);
    if (reuse_ready(self) < 0)
        return NULL;
    PyObject *written = args[0];
    if (!PyList_Check(written))
        return PyErr_Format(PyExc_TypeError, "written_then_reference(): written must be a "
                            "list, not %.100s", Py_TYPE(written)->tp_name);
    Miss miss = {0, 0, 0.0, 0, 0, 0, 0, NULL, 0};
    if (nargs == 6) {
        if (!PyList_Check(args[5]))
            return PyErr_Format(PyExc_TypeError, "written_then_reference(): kept_at must be "
                                "a list, not %.100s", Py_TYPE(args[5])->tp_name);
        miss.kept_at = args[5];
    }
    if (nargs >= 5) {
        miss.from = PyLong_AsSsize_t(args[2]);
        miss.to = PyLong_AsSsize_t(args[3]);
        miss.capacity = PyFloat_AsDouble(args[4]);
        if (PyErr_Occurred())
            return NULL;
        if (miss.from < 0 || miss.to < miss.from)
            return PyErr_Format(PyExc_ValueError, "written_then_reference(): the missed keys "
                                "must be keys[miss_from:miss_to] with 0 <= miss_from <= "
                                "miss_to, got %zd:%zd", miss.from, miss.to);
    }
    if (PyList_GET_SIZE(written)) {
        /* Taken, then emptied, then recorded: keys written while the
         * call runs (a key's __hash__, another thread then) wait for the next lookup. */
        PyObject *taken = PyList_GetSlice(written, 0, PY_SSIZE_T_MAX);
        if (taken == NULL)
            return NULL;
        int failed = PyList_SetSlice(written, 0, PyList_GET_SIZE(taken), NULL) < 0 ||
                     reuse_record(self, taken, 0, NULL) < 0;
        Py_DECREF(taken);
        if (failed)
            return NULL;
    }
    if (reuse_record(self, args[1], 1, nargs >= 5 ? &miss : NULL) < 0 || miss.failed)
        return NULL;
    if (nargs == 2)
        return Py_NewRef(Py_None);
    return Py_BuildValue("(LLLL)", miss.cold, miss.evicted, miss.kept, miss.recoverable);
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

/* hits(size): the weights of the kept samples at a distance <= size, added in order. */
static PyObject *reuse_hits(ReuseCore *self, PyObject *arg)
{
    if (reuse_ready(self) < 0)
        return NULL;
    if (!self->keep) {
        PyErr_SetString(PyExc_ValueError, "hits() needs a core that keeps its samples: "
                        "ReuseCore(..., samples=True)");
        return NULL;
    }
    double size = PyFloat_AsDouble(arg);
    if (size == -1.0 && PyErr_Occurred())
        return NULL;
    double hits = 0.0;
    for (Py_ssize_t i = 0; i < self->kept_len; i++) {
        if (self->kept[i].distance <= size)
            hits += self->kept[i].weight;
    }
    return PyFloat_FromDouble(hits);
}

static void reuse_free_arrays(ReuseCore *self)
{
    PyMem_Free(self->bounds);
    PyMem_Free(self->counts);
    PyMem_Free(self->kept);
    self->bounds = NULL;
    self->counts = NULL;
    self->kept = NULL;
    self->kept_len = self->kept_cap = 0;
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
    static char *kwlist[] = {"max_keys", "threshold", "weight", "bounds", "track", "near",
                             "samples", NULL};
    Py_ssize_t max_keys;
    double weight;
    PyObject *threshold_arg, *bounds, *track_arg = Py_None, *near_arg = Py_None;
    int keep = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nOdO|OOp", kwlist, &max_keys, &threshold_arg,
                                     &weight, &bounds, &track_arg, &near_arg, &keep))
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
    self->keep = keep;
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
    self->far_cold = self->far_seen = 0.0;
    /* Check the tuple-hash replica against the interpreter once; else build tuples. */
    self->tuple_hash_ok = check_tuple_hash();
    return self->tuple_hash_ok < 0 ? -1 : 0;
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
     METH_FASTCALL, "written_then_reference(written, keys[, miss_from, miss_to, capacity]): "
     "written blocks (the list is emptied), then a lookup's keys; given its missed keys, "
     "their causes (cold, evicted, kept)."},
    {"counts", (PyCFunction)reuse_counts, METH_NOARGS,
     "Counted references per bucket, in samples at threshold (the last: beyond every "
     "bound, cold)."},
    {"hits", (PyCFunction)reuse_hits, METH_O,
     "hits(size): with samples=True, the counted references at a distance <= size, in "
     "samples at threshold."},
    {"stats", (PyCFunction)reuse_stats, METH_NOARGS,
     "(total references, counted references in samples, forgotten keys, live keys)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReuseCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvobs.kernels._native.ReuseCore",
    .tp_basicsize = sizeof(ReuseCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The reuse-distance profile core (see kvobs.reuse).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reuse_init,
    .tp_dealloc = (destructor)reuse_dealloc,
    .tp_methods = reuse_methods,
    .tp_members = reuse_members,
};

int reuse_add(PyObject *module)
{
    return PyModule_AddType(module, &ReuseCoreType);
}
