/*
 * kvobs.kernels._native: one extension module, one C file per concern. Each file adds its
 * functions and types to the module (module.c calls them in turn); nothing else is shared
 * between them but the block-key helpers of keys.h.
 *
 *   copy.c        the host block-copy loops of kvobs.kernels (plan, copy, memcpy)
 *   pool_walk.c   walk_slots: one pass over a vLLM BlockPool's blocks
 *   reuse.c       ReuseCore: the reuse-distance profile of kvobs.reuse
 *   thrash.c      ThrashCore: the offload / onload bookkeeping of kvobs.thrash
 *   residency.c   ResidencyCore: the sampled residency and reuse gaps of kvobs.residency
 *   keys.c        block keys: their hashes, an index by hash, a bounded recency list
 */
#ifndef KVOBS_NATIVE_H
#define KVOBS_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Each adds its functions and types to the module; 0, or -1 with an exception set. */
int copy_add(PyObject *module);
int pool_walk_add(PyObject *module);
int reuse_add(PyObject *module);
int thrash_add(PyObject *module);
int residency_add(PyObject *module);

#endif
