/*
 * The block pool walk of kvobs.adapters.vllm.block_pool, in C.
 *
 * walk_slots(blocks, hash_member, count_member) -> (hashed, in_use, cached)
 *     `blocks` a list of objects of one __slots__ class; `hash_member` / `count_member` the
 *     class's member descriptors of the prefix hash (None: no hash) and the reference count
 *     (an int). Counts blocks holding a hash, blocks with a reference, and unreferenced
 *     blocks holding a hash. Reads each block's two slots at their offsets (~10 ns a block),
 *     holding the GIL throughout: the engine cannot move in the middle of the walk. An
 *     object of another type, or a count that is not an int, is a TypeError.
 */
#include "native.h"
#include <structmember.h>

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

static PyMethodDef pool_walk_methods[] = {
    {"walk_slots", walk_slots, METH_VARARGS,
     "walk_slots(blocks, hash_member, count_member): (hashed, in_use, cached) of a pool."},
    {NULL, NULL, 0, NULL},
};

int pool_walk_add(PyObject *module)
{
    return PyModule_AddFunctions(module, pool_walk_methods);
}
