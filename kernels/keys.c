/*
 * Block keys (see keys.h): hash((key,)) without building the tuple, the hashes of a call's
 * keys, the KeyTable's delete and the KeyLru bounded recency list.
 */
#include "keys.h"
#include <string.h>

/* ---- key hashes ---------------------------------------------------------------------- */

/* CPython's tuple hash (xxHash-based) of a 1-tuple whose item hashes to `lane`. */
#define XXPRIME_1 11400714785074694791ULL
#define XXPRIME_2 14029467366897019727ULL
#define XXPRIME_5 2870177450012600261ULL

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

/* tuple1_hash(hash(k)) against hash((k,)), on a few ints. */
int check_tuple_hash(void)
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

int key_tuple_hash(PyObject *key, int replica_ok, Py_hash_t *out)
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

static int sample_hash_ok = -1; /* check_tuple_hash(), once */

Py_ssize_t hash_keys(PyObject *keys, int sampled, uint64_t threshold, uint64_t mask,
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

/* ---- KeyTable -------------------------------------------------------------------------- */

void ktab_delete(KeyTable *t, Py_ssize_t i)
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

/* ---- KeyLru --------------------------------------------------------------------------- */

#define LRU_INITIAL 4096
#define LRU_NIL (-1)

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

void lru_drop(KeyLru *l, int32_t e, Py_ssize_t row)
{
    lru_unlink(l, e);
    ktab_delete(&l->tbl, row);
    l->next[e] = l->free;
    l->free = e;
    l->count--;
}

void lru_free_arrays(KeyLru *l)
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

int lru_init(KeyLru *l, Py_ssize_t max, int width, const char *what)
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

int lru_ready(const KeyLru *l, const char *what)
{
    if (l->key != NULL)
        return 1;
    PyErr_Format(PyExc_RuntimeError, "%s was not initialised", what);
    return 0;
}

int32_t lru_touch(KeyLru *l, uint64_t bits, long long *forgotten)
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
