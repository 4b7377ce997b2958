/* kvobs.kernels._native.HookCall and AttrPath (kernels/_hookcall.c): added to the module at
 * import. */
#ifndef KVOBS_HOOKCALL_H
#define KVOBS_HOOKCALL_H
#include <Python.h>

/* Ready the HookCall and AttrPath types and add them to `module`: 0, or -1 with an exception
 * set. */
int hookcall_add(PyObject *module);

#endif
