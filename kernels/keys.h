/*
 * Block keys in C (keys.c): the reuse, thrash and residency cores tell blocks apart by a
 * 64-bit hash of their key, find them through a KeyTable, and the thrash and residency
 * cores keep them in a bounded KeyLru.
 */
#ifndef KVOBS_KEYS_H
#define KVOBS_KEYS_H

#include "native.h"
#include <stdint.h>
#include <time.h>

/* ---- key hashes ---- */

/* Whether hash((k,)) is computed here without building the tuple in this interpreter:
 * checked once on a few ints; 1 yes, 0 no (then tuples are built), -1 with an exception
 * set. */
int check_tuple_hash(void);

/* hash((key,)) (without building the tuple where `replica_ok`); -1 with an exception set
 * on failure. */
int key_tuple_hash(PyObject *key, int replica_ok, Py_hash_t *out);

/* The 64-bit hashes of `keys` (any iterable), in order, into *out (`stack`, room for
 * KEY_STACK_KEYS, or malloc'd: the caller frees it when it is not `stack`): hash(key) of
 * every key, or with `sampled` hash((key,)) of the keys whose bits & mask < threshold.
 * The count, or -1 with an exception set. */
#define KEY_STACK_KEYS 64
Py_ssize_t hash_keys(PyObject *keys, int sampled, uint64_t threshold, uint64_t mask,
                     uint64_t *stack, uint64_t **out);

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

/* ---- KeyTable: 64-bit key hashes -> an int32 row of a core's own arrays (open addressing,
 * linear probing, backward-shift delete, val -1 = empty) ---- */

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

void ktab_delete(KeyTable *t, Py_ssize_t i);

/* ---- KeyLru: bounded per-key state in recency order (the thrash and residency cores) ----
 *
 * Entries of `width` int64 values each, found by a key's 64-bit hash through a KeyTable and
 * kept in a doubly linked list (oldest first) with a free list. The arrays start at
 * LRU_INITIAL entries and double up to `max` entries; past that, the oldest entry makes
 * room for a new key. No Python object is held: a core that changes its list without
 * running Python code is atomic under the GIL and needs no lock of its own.
 */

typedef struct {
    Py_ssize_t max, entries, count;
    int width;            /* int64 values per entry */
    uint64_t *key;        /* entries */
    int64_t *data;        /* entries x width */
    int32_t *prev, *next; /* entries: the recency list; next doubles as the free list */
    int32_t head, tail, free;
    KeyTable tbl;         /* key bits -> entry; 2 x entries rows or more */
} KeyLru;

/* An empty list of at most `max` keys; -1 with an exception set. */
int lru_init(KeyLru *l, Py_ssize_t max, int width, const char *what);

/* Whether the list was initialised (a core made by __new__ alone has no arrays); if not, a
 * RuntimeError naming `what` is set. */
int lru_ready(const KeyLru *l, const char *what);

void lru_free_arrays(KeyLru *l);

/* The entry of `bits`, or -1; *row gets its table row (or where it would go). */
static inline int32_t lru_find(const KeyLru *l, uint64_t bits, Py_ssize_t *row)
{
    *row = ktab_find(&l->tbl, bits);
    return l->tbl.val[*row];
}

/* The entry of `bits` made the newest: found, or added (its data left for the caller to
 * set). Adding grows the arrays while under `max`, else forgets the oldest entry and
 * adds one to *forgotten. */
int32_t lru_touch(KeyLru *l, uint64_t bits, long long *forgotten);

/* Forget entry e (its table row at `row`). */
void lru_drop(KeyLru *l, int32_t e, Py_ssize_t row);

static inline long long monotonic_ns(void) /* the clock of Python's time.monotonic_ns */
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#endif
