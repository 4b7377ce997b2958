/*
 * kvobs.kernels._native.HookCall: an adapter's wrapper of one engine method, in C.
 *
 * kvobs.adapters._hooks generates a Python wrapper per hooked engine method; a call then
 * pays a Python frame for the wrapper alone (about a microsecond in a real vLLM scheduler
 * step, whose own work has pushed the frame's code and data out of the caches). HookCall
 * does what that generated wrapper does, with no frame of its own:
 *
 *   count hook   result = original(...); count(<the count argument>)
 *   reader hook  state = before(inst, *params); result = original(...);
 *                after(inst, state, result, *params)
 *
 * The engine's call goes to `original` exactly as it came (its arguments, keywords and
 * result or exception untouched). The readers get the method's parameters bound by
 * position, defaults filled in, as the generated wrapper passes them. A reader (or the
 * count) that raises an Exception is reported as error(component, exc) and the engine
 * call goes on: a failing `before` skips `after` (there is no state to read); anything
 * that is not an Exception (KeyboardInterrupt) propagates, as `except Exception` lets it.
 *
 * An argument a reader iterates as well as the engine (`reiterable`) that is not a list
 * or a tuple (an iterator, a set) is turned into a list first, passed to the engine and
 * the readers alike, as the generated wrapper does. Calls whose arguments cannot be bound
 * here (too many, an unknown or repeated keyword, a required parameter missing) go to
 * `fallback`, the generated Python wrapper with the same meaning, which raises as Python
 * does.
 *
 *   HookCall(original, params, defaults, inst, error, component, fallback, *,
 *            before=None, after=None, count=None, count_at=-1, reiterable=(),
 *            gate_at=-1, gate_attr=None, gate_next=False)
 *
 * params: the method's parameter names (after self), defaults: its __defaults__ (or
 * None), count_at: the index in params of the argument `count` is called with, and
 * reiterable: indices in params of the arguments `fallback` must list first.
 *
 * A gate (an adapter's `when` of the plain forms: a parameter, an attribute of `inst`, or
 * the next item of an iterator that is one): gate_at, the index in params of the
 * argument, or gate_attr, the attribute's name (with gate_next: next(attribute)); where
 * it is false, the engine's method runs with no reader at all (its arguments untouched),
 * as where it raises an Exception (reported to error() first).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include "_hookcall.h"

/* Parameters bound on the stack; a method with more goes to `fallback`. */
#define HOOK_MAX_PARAMS 12
/* Slots in front of the bound parameters: the offset slot, inst, state, result. */
#define HOOK_HEAD 4

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original, *params, *defaults, *inst, *error, *component, *fallback;
    PyObject *before, *after, *count;
    Py_ssize_t count_at;
    Py_ssize_t reiterable[HOOK_MAX_PARAMS];
    Py_ssize_t n_reiterable;
    Py_ssize_t gate_at;  /* the param whose truth lets the readers run, or -1 */
    PyObject *gate_attr; /* or the attribute of inst whose truth does, or NULL */
    int gate_next;       /* gate_attr is an iterator: the truth of its next item */
    PyObject *dict; /* __name__, __wrapped__... (functools.update_wrapper) */
} HookCall;

/* Bind the call's arguments to params into out[0..n-1], and where[i] the index in args
 * of out[i] (-1: a default): 1 done, 0 not bindable here (the fallback decides), never
 * an error. */
static int bind(HookCall *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                PyObject **out, Py_ssize_t *where)
{
    Py_ssize_t n = PyTuple_GET_SIZE(self->params);
    if (nargs > n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = i < nargs ? args[i] : NULL;
        where[i] = i < nargs ? i : -1;
    }
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t found = -1;
        for (Py_ssize_t i = nargs; i < n && found < 0; i++)
            if (kw == PyTuple_GET_ITEM(self->params, i))
                found = i;
        for (Py_ssize_t i = nargs; i < n && found < 0; i++)
            if (PyUnicode_Compare(kw, PyTuple_GET_ITEM(self->params, i)) == 0)
                found = i;
        if (found < 0 || out[found] != NULL)
            return 0;
        out[found] = args[nargs + k];
        where[found] = nargs + k;
    }
    Py_ssize_t n_defaults = self->defaults ? PyTuple_GET_SIZE(self->defaults) : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (out[i] != NULL)
            continue;
        Py_ssize_t d = i - (n - n_defaults);
        if (d < 0)
            return 0;
        out[i] = PyTuple_GET_ITEM(self->defaults, d);
    }
    return 1;
}

/* The reiterable arguments that are no list or tuple, listed: in out[] (the readers) and
 * in a copy of the call's arguments (the engine), into *call_args (args itself when
 * nothing was listed). The lists are held in held[] (*n_held of them). 0, or -1 with the
 * iterator's exception set. */
static int relist(HookCall *self, PyObject *const *args, Py_ssize_t n_given, PyObject **out,
                  const Py_ssize_t *where, PyObject **copy, PyObject *const **call_args,
                  PyObject **held, int *n_held)
{
    *call_args = args;
    *n_held = 0;
    for (Py_ssize_t r = 0; r < self->n_reiterable; r++) {
        Py_ssize_t i = self->reiterable[r];
        if (PyList_Check(out[i]) || PyTuple_Check(out[i]))
            continue;
        PyObject *list = PySequence_List(out[i]);
        if (list == NULL)
            return -1;
        held[(*n_held)++] = list;
        out[i] = list;
        if (where[i] < 0)
            continue; /* a default: the engine takes its own */
        if (*call_args == args) { /* copy[0]: the slot PY_VECTORCALL_ARGUMENTS_OFFSET lends */
            memcpy(copy + 1, args, n_given * sizeof(PyObject *));
            *call_args = copy + 1;
        }
        copy[1 + where[i]] = list;
    }
    return 0;
}

/* A reader raised. An Exception is handed to error(component, exc) and cleared: 0. Any
 * other exception stays set, and so does one raised by error() itself: -1. */
static int reader_failed(HookCall *self)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *value = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    PyObject *call[2] = {self->component, value != NULL ? value : Py_None};
    PyObject *r = PyObject_Vectorcall(self->error, call, 2, NULL);
    Py_XDECREF(value);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *hookcall_call(HookCall *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames, PyObject **slots);

/* The gate's truth: 1 read, 0 do not, -1 do not (an Exception was reported), -2 an
 * exception that is not an Exception is set. */
static int gate_open(HookCall *self, PyObject **bound)
{
    int open;
    if (self->gate_at >= 0) {
        open = PyObject_IsTrue(bound[self->gate_at]);
    } else {
        PyObject *value = PyObject_GetAttr(self->inst, self->gate_attr);
        if (value != NULL && self->gate_next) { /* next(value), as the builtin calls it */
            PyObject *iterator = value;
            value = NULL;
            if (!PyIter_Check(iterator))
                PyErr_Format(PyExc_TypeError, "'%.200s' object is not an iterator",
                             Py_TYPE(iterator)->tp_name);
            else if ((value = (*Py_TYPE(iterator)->tp_iternext)(iterator)) == NULL
                     && !PyErr_Occurred())
                PyErr_SetNone(PyExc_StopIteration); /* exhausted: StopIteration(value) kept */
            Py_DECREF(iterator);
        }
        open = value == NULL ? -1 : PyObject_IsTrue(value);
        Py_XDECREF(value);
    }
    if (open < 0)
        return reader_failed(self) < 0 ? -2 : -1;
    return open;
}

static PyObject *hookcall_vectorcall(HookCall *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *slots[HOOK_HEAD + HOOK_MAX_PARAMS];
    PyObject **bound = slots + HOOK_HEAD;
    Py_ssize_t where[HOOK_MAX_PARAMS];
    if (!bind(self, args, nargs, kwnames, bound, where))
        return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    if (self->gate_at >= 0 || self->gate_attr != NULL) {
        int open = gate_open(self, bound);
        if (open == -2)
            return NULL;
        if (open <= 0)
            return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    if (self->n_reiterable == 0)
        return hookcall_call(self, args, nargsf, kwnames, slots);
    PyObject *copy[1 + HOOK_MAX_PARAMS], *held[HOOK_MAX_PARAMS];
    PyObject *const *call_args;
    int n_held;
    Py_ssize_t n_given = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    if (relist(self, args, n_given, bound, where, copy, &call_args, held, &n_held) < 0)
        return NULL;
    if (call_args != args)
        nargsf = (size_t)nargs | PY_VECTORCALL_ARGUMENTS_OFFSET;
    PyObject *result = hookcall_call(self, call_args, nargsf, kwnames, slots);
    for (int i = 0; i < n_held; i++)
        Py_DECREF(held[i]);
    return result;
}

/* The wrapped call: the engine's with `args` as given, the readers' with the parameters
 * bound at slots + HOOK_HEAD. */
static PyObject *hookcall_call(HookCall *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames, PyObject **slots)
{
    Py_ssize_t n = PyTuple_GET_SIZE(self->params);
    PyObject **bound = slots + HOOK_HEAD;
    if (self->count != NULL) {
        PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        if (result == NULL)
            return NULL;
        PyObject *r = PyObject_Vectorcall(self->count, &bound[self->count_at], 1, NULL);
        if (r != NULL)
            Py_DECREF(r);
        else if (reader_failed(self) < 0)
            Py_CLEAR(result);
        return result;
    }

    /* Each reader call borrows the slots in front of the parameters it takes. */
    PyObject *state;
    if (self->before != NULL) {
        slots[HOOK_HEAD - 1] = self->inst;
        state = PyObject_Vectorcall(self->before, slots + HOOK_HEAD - 1,
                                    (size_t)(1 + n) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (state == NULL) {
            if (reader_failed(self) < 0)
                return NULL;
            return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        }
    } else {
        state = Py_NewRef(Py_None);
    }
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (result != NULL && self->after != NULL) {
        slots[1] = self->inst;
        slots[2] = state;
        slots[3] = result;
        PyObject *r = PyObject_Vectorcall(self->after, slots + 1,
                                          (size_t)(3 + n) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                          NULL);
        if (r != NULL)
            Py_DECREF(r);
        else if (reader_failed(self) < 0)
            Py_CLEAR(result);
    }
    Py_DECREF(state);
    return result;
}

/* Every reference a HookCall owns, once: traverse and clear both expand it. */
#define HOOKCALL_REFERENCES(X) \
    X(original) X(params) X(defaults) X(inst) X(error) X(component) X(fallback) \
    X(before) X(after) X(count) X(gate_attr) X(dict)

static int hookcall_traverse(HookCall *self, visitproc visit, void *arg)
{
#define HOOKCALL_VISIT(member) Py_VISIT(self->member);
    HOOKCALL_REFERENCES(HOOKCALL_VISIT)
#undef HOOKCALL_VISIT
    return 0;
}

static int hookcall_clear(HookCall *self)
{
#define HOOKCALL_CLEAR(member) Py_CLEAR(self->member);
    HOOKCALL_REFERENCES(HOOKCALL_CLEAR)
#undef HOOKCALL_CLEAR
    return 0;
}

static void hookcall_dealloc(HookCall *self)
{
    PyObject_GC_UnTrack(self);
    hookcall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* NULL for None, else the object (a new reference either way: NULL needs none). */
static PyObject *optional(PyObject *obj)
{
    return obj == NULL || obj == Py_None ? NULL : Py_NewRef(obj);
}

static PyObject *hookcall_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"original", "params", "defaults", "inst", "error", "component",
                             "fallback", "before", "after", "count", "count_at", "reiterable",
                             "gate_at", "gate_attr", "gate_next", NULL};
    PyObject *original, *params, *defaults, *inst, *error, *component, *fallback;
    PyObject *before = NULL, *after = NULL, *count = NULL, *reiterable = NULL;
    PyObject *gate_attr = NULL;
    Py_ssize_t count_at = -1, gate_at = -1;
    int gate_next = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOOUO|$OOOnOnOp", kwlist, &original,
                                     &PyTuple_Type, &params, &defaults, &inst, &error,
                                     &component, &fallback, &before, &after, &count,
                                     &count_at, &reiterable, &gate_at, &gate_attr,
                                     &gate_next))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(params);
    if (n > HOOK_MAX_PARAMS)
        return PyErr_Format(PyExc_ValueError, "HookCall: %zd params, at most %d", n,
                            HOOK_MAX_PARAMS);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(params, i)))
            return PyErr_Format(PyExc_TypeError, "HookCall: params[%zd] is not a str", i);
    if (defaults != Py_None && (!PyTuple_Check(defaults) || PyTuple_GET_SIZE(defaults) > n))
        return PyErr_Format(PyExc_TypeError, "HookCall: defaults must be None or a tuple of "
                                             "at most %zd values", n);
    PyObject *callables[] = {original, error, fallback, before, after, count};
    static const char *const callable_names[] = {"original", "error", "fallback", "before",
                                                  "after", "count"};
    for (int i = 0; i < 6; i++) /* the first three required, the rest None or callable */
        if (callables[i] != NULL && (i < 3 || callables[i] != Py_None)
                && !PyCallable_Check(callables[i]))
            return PyErr_Format(PyExc_TypeError, "HookCall: %s is not callable",
                                callable_names[i]);
    int has_count = count != NULL && count != Py_None;
    if (has_count && (count_at < 0 || count_at >= n))
        return PyErr_Format(PyExc_ValueError, "HookCall: count_at %zd is not a param index",
                            count_at);
    if (has_count && ((before && before != Py_None) || (after && after != Py_None)))
        return PyErr_Format(PyExc_ValueError, "HookCall: a count hook has no readers");
    if (gate_attr == Py_None)
        gate_attr = NULL;
    if (gate_attr != NULL && !PyUnicode_Check(gate_attr))
        return PyErr_Format(PyExc_TypeError, "HookCall: gate_attr must be a str or None");
    if (gate_at < -1 || gate_at >= n || (gate_at >= 0 && gate_attr != NULL))
        return PyErr_Format(PyExc_ValueError, "HookCall: gate_at %zd is not a param index "
                            "(or gate_attr is given too)", gate_at);
    if (has_count && (gate_at >= 0 || gate_attr != NULL))
        return PyErr_Format(PyExc_ValueError, "HookCall: a count hook has no gate");
    if (gate_next && gate_attr == NULL)
        return PyErr_Format(PyExc_ValueError, "HookCall: gate_next needs gate_attr");
    HookCall *self = (HookCall *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)hookcall_vectorcall;
    self->original = Py_NewRef(original);
    self->params = Py_NewRef(params);
    self->defaults = optional(defaults);
    self->inst = Py_NewRef(inst);
    self->error = Py_NewRef(error);
    self->component = Py_NewRef(component);
    self->fallback = Py_NewRef(fallback);
    self->before = optional(before);
    self->after = optional(after);
    self->count = has_count ? Py_NewRef(count) : NULL;
    self->count_at = count_at;
    self->gate_at = gate_at;
    self->gate_attr = gate_attr != NULL ? Py_NewRef(gate_attr) : NULL;
    self->gate_next = gate_next;
    if (reiterable != NULL && reiterable != Py_None) {
        PyObject *seq = PySequence_Fast(reiterable, "HookCall: reiterable must be a sequence");
        if (seq == NULL) {
            Py_DECREF(self);
            return NULL;
        }
        Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t r = 0; r < m; r++) {
            Py_ssize_t at = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, r));
            if (at < 0 || at >= n) {
                Py_DECREF(seq);
                Py_DECREF(self);
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "HookCall: reiterable %zd is not a "
                                                   "param index", at);
                return NULL;
            }
            for (Py_ssize_t q = 0; q < self->n_reiterable; q++)
                if (self->reiterable[q] == at) { /* distinct: at most n fit the array */
                    Py_DECREF(seq);
                    Py_DECREF(self);
                    return PyErr_Format(PyExc_ValueError, "HookCall: reiterable %zd is "
                                                          "repeated", at);
                }
            self->reiterable[self->n_reiterable++] = at;
        }
        Py_DECREF(seq);
    }
    return (PyObject *)self;
}

static PyObject *hookcall_repr(HookCall *self)
{
    return PyUnicode_FromFormat("<kvobs HookCall %U of %R>", self->component, self->original);
}

/* copy.copy / copy.deepcopy: the wrapper itself, as for the Python function it stands in
 * for (an engine object copied with its wrappers keeps calling the same readers). */
static PyObject *hookcall_self(PyObject *self, PyObject *unused)
{
    return Py_NewRef(self);
}

static PyMethodDef hookcall_methods[] = {
    {"__copy__", hookcall_self, METH_NOARGS, NULL},
    {"__deepcopy__", hookcall_self, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef hookcall_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef hookcall_members[] = {
    {"fallback", T_OBJECT, offsetof(HookCall, fallback), READONLY,
     "the generated Python wrapper: calls this type does not bind go there"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject HookCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvobs.kernels._native.HookCall",
    .tp_basicsize = sizeof(HookCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "An adapter's wrapper of one engine method, in C "
              "(kvobs.adapters._hooks; see kernels/_hookcall.c).",
    .tp_new = hookcall_new,
    .tp_dealloc = (destructor)hookcall_dealloc,
    .tp_traverse = (traverseproc)hookcall_traverse,
    .tp_clear = (inquiry)hookcall_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(HookCall, vectorcall),
    .tp_dictoffset = offsetof(HookCall, dict),
    .tp_methods = hookcall_methods,
    .tp_getset = hookcall_getset,
    .tp_members = hookcall_members,
    .tp_repr = (reprfunc)hookcall_repr,
};

/*
 * AttrPath("a.b"): a reader that returns its first argument's attribute a.b, whatever else
 * it is given: reader(inst, *params) -> inst.a.b, with no Python frame (a `before` that
 * only reads the engine's own count, say). kvobs.adapters._hooks.attr_path is its Python
 * twin where the extension is not built.
 */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *names; /* tuple of str: the path's attributes in order */
    PyObject *path;  /* the dotted text (repr) */
} AttrPath;

static PyObject *attrpath_vectorcall(AttrPath *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) < 1)
        return PyErr_Format(PyExc_TypeError, "AttrPath(%R) needs the object to read",
                            self->path);
    PyObject *value = Py_NewRef(args[0]);
    for (Py_ssize_t i = 0; value != NULL && i < PyTuple_GET_SIZE(self->names); i++)
        Py_SETREF(value, PyObject_GetAttr(value, PyTuple_GET_ITEM(self->names, i)));
    return value;
}

static PyObject *attrpath_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", NULL};
    PyObject *path;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U", kwlist, &path))
        return NULL;
    PyObject *dot = PyUnicode_FromString(".");
    PyObject *names = dot ? PyUnicode_Split(path, dot, -1) : NULL;
    Py_XDECREF(dot);
    if (names == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        if (!PyUnicode_IsIdentifier(name)) {
            Py_DECREF(names);
            return PyErr_Format(PyExc_ValueError, "AttrPath: %R is not a dotted path of "
                                "attribute names", path);
        }
        PyUnicode_InternInPlace(&PyList_GET_ITEM(names, i));
    }
    AttrPath *self = (AttrPath *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(names);
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)attrpath_vectorcall;
    self->names = PyList_AsTuple(names);
    Py_DECREF(names);
    self->path = Py_NewRef(path);
    if (self->names == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void attrpath_dealloc(AttrPath *self)
{
    Py_XDECREF(self->names);
    Py_XDECREF(self->path);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *attrpath_repr(AttrPath *self)
{
    return PyUnicode_FromFormat("AttrPath(%R)", self->path);
}

static PyMethodDef attrpath_methods[] = {
    {"__copy__", hookcall_self, METH_NOARGS, NULL}, /* kept under copy, as a function is */
    {"__deepcopy__", hookcall_self, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef attrpath_members[] = {
    {"path", T_OBJECT, offsetof(AttrPath, path), READONLY, "the dotted attribute path"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AttrPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvobs.kernels._native.AttrPath",
    .tp_basicsize = sizeof(AttrPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "AttrPath(path)(obj, *args, **kwargs) -> obj.<path> (a reader in C).",
    .tp_new = attrpath_new,
    .tp_dealloc = (destructor)attrpath_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(AttrPath, vectorcall),
    .tp_methods = attrpath_methods,
    .tp_members = attrpath_members,
    .tp_repr = (reprfunc)attrpath_repr,
};

int hookcall_add(PyObject *module)
{
    return PyModule_AddIntConstant(module, "HOOK_MAX_PARAMS", HOOK_MAX_PARAMS) < 0 ||
           PyModule_AddType(module, &HookCallType) < 0 ||
           PyModule_AddType(module, &AttrPathType) < 0 ? -1 : 0;
}
