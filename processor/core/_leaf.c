/* processor.core._leaf: frozen JSON values out of the cyclic collector.
 *
 * A kept event is ~5 containers (the Event and its FrozenDict/FrozenList
 * parts).  CPython untracks exact dicts and tuples whose contents cannot be
 * part of a cycle, never instances of subclasses, so every frozen container
 * stays tracked and every young collection walks it and each of its values
 * (~0.35 us per container on a kept 30,000-event log; BENCHMARKS.md, branch
 * gcev).  The frozen values are immutable and built bottom-up, so none of
 * them can be part of a reference cycle: settle() applies CPython's own
 * tuple rule to them.
 *
 * settle(obj) untracks obj when its type is a registered leaf type and
 * everything it refers to (its tp_traverse) is
 *   - not a GC object (str, int, float, bool, None), or
 *   - its own type (heap types refer to their class), or
 *   - a registered inert object (a singleton such as ABSENT), or
 *   - an untracked instance of a registered leaf type (settled before it).
 * Anything else (a plain list inside a hand-built FrozenDict) keeps obj
 * tracked.  It returns obj.
 *
 * Mutation through the base class (dict.__setitem__(frozen, ...)) re-tracks
 * a dict (CPython's dict insert does that); a list changed that way stays
 * untracked, and a cycle through it would then never be collected (a leak,
 * never a crash: an untracked object's references count as external).
 *
 * The compiled build only; without this module the frozen values stay
 * tracked (processor/core/leaf.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_KINDS 8

static PyTypeObject *leaf_types[MAX_KINDS];
static int n_leaf_types;
static PyObject *inert[MAX_KINDS];
static int n_inert;

static int
is_leaf_type(PyTypeObject *tp)
{
    for (int i = 0; i < n_leaf_types; i++) {
        if (tp == leaf_types[i]) {
            return 1;
        }
    }
    return 0;
}

/* 0: ref cannot lead back to the container; 1: it might (stop, keep tracked) */
static int
visit(PyObject *ref, void *arg)
{
    PyObject *self = (PyObject *)arg;
    if (!PyObject_IS_GC(ref) || ref == (PyObject *)Py_TYPE(self)) {
        return 0;
    }
    for (int i = 0; i < n_inert; i++) {
        if (ref == inert[i]) {
            return 0;
        }
    }
    if (!PyObject_GC_IsTracked(ref) && is_leaf_type(Py_TYPE(ref))) {
        return 0;
    }
    return 1;
}

static PyObject *
settle(PyObject *module, PyObject *obj)
{
    if (is_leaf_type(Py_TYPE(obj)) && PyObject_GC_IsTracked(obj)) {
        traverseproc traverse = Py_TYPE(obj)->tp_traverse;
        if (traverse != NULL && traverse(obj, visit, obj) == 0) {
            PyObject_GC_UnTrack(obj);
        }
    }
    return Py_NewRef(obj);
}

static PyObject *
register_leaf(PyObject *module, PyObject *args)
{
    PyObject *types, *objects;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &types, &PyTuple_Type, &objects)) {
        return NULL;
    }
    Py_ssize_t nt = PyTuple_GET_SIZE(types), no = PyTuple_GET_SIZE(objects);
    if (n_leaf_types + nt > MAX_KINDS || n_inert + no > MAX_KINDS) {
        PyErr_SetString(PyExc_ValueError, "too many leaf types or inert objects");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nt; i++) {
        if (!PyType_Check(PyTuple_GET_ITEM(types, i))) {
            PyErr_SetString(PyExc_TypeError, "leaf types must be types");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *tp = PyTuple_GET_ITEM(types, i);
        if (!is_leaf_type((PyTypeObject *)tp)) {
            leaf_types[n_leaf_types++] = (PyTypeObject *)Py_NewRef(tp); /* kept for good */
        }
    }
    for (Py_ssize_t i = 0; i < no; i++) {
        PyObject *obj = PyTuple_GET_ITEM(objects, i);
        int known = 0;
        for (int j = 0; j < n_inert; j++) {
            known |= inert[j] == obj;
        }
        if (!known) {
            inert[n_inert++] = Py_NewRef(obj); /* kept for good */
        }
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"settle", settle, METH_O,
     "settle(obj) -> obj: untrack a frozen value that cannot be part of a cycle."},
    {"register", register_leaf, METH_VARARGS,
     "register(types, objects): the leaf types settle() may untrack, and the inert "
     "objects their instances may refer to."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "processor.core._leaf",
    "Frozen JSON values out of the cyclic collector (see _leaf.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__leaf(void)
{
    return PyModule_Create(&module);
}
