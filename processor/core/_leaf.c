/* processor.core._leaf: frozen JSON values out of the cyclic collector.
 *
 * A kept event is ~5 containers (the Event and its FrozenDict/FrozenList
 * parts).  CPython untracks exact dicts and tuples whose contents cannot be
 * part of a cycle, never instances of subclasses, so every frozen container
 * stays tracked and every young collection walks it and each of its values
 * (~0.35 us per container on a kept 30,000-event log, measured with
 * bench/lab/gc_cost.py).  The frozen values are immutable and built bottom-up, so none of
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
 * adopt(v) turns a dict or list the caller has just built, and holds the
 * only reference to, into the frozen dict or list type in place: the type
 * pointer changes, nothing is copied (FrozenDict(d) allocated a second dict
 * and keys table, copied them and freed the first; the fold does that for
 * every transcript entry it keeps).  With any other reference to v, v could
 * be seen or changed as a plain dict or list afterwards, so it is copied as
 * FrozenDict(v) would.  Either way the result is settled.  The frozen types
 * must be dict/list subclasses with their base's layout (no __dict__, no
 * __weakref__, no finalizer): adopts(type) checks that and says whether
 * adopt may make instances of it.
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

static void
settle_one(PyObject *obj)
{
    if (is_leaf_type(Py_TYPE(obj)) && PyObject_GC_IsTracked(obj)) {
        traverseproc traverse = Py_TYPE(obj)->tp_traverse;
        if (traverse != NULL && traverse(obj, visit, obj) == 0) {
            PyObject_GC_UnTrack(obj);
        }
    }
}

static PyObject *
settle(PyObject *module, PyObject *obj)
{
    settle_one(obj);
    return Py_NewRef(obj);
}

/* adopt() changes a value's type in place when Py_REFCNT(v) == 1, taking that
 * to mean "the caller holds the only reference".  CPython promises that only
 * where we have checked it: 3.11 with the GIL, the interpreter CI builds and
 * tests.  Later versions changed reference counting (immortal objects in
 * 3.12, stack references that are not counted in 3.14, per-thread counts on
 * free-threaded builds), so there adopts() says no and every frozen value is
 * a copy, as in the pure build.  Widen this only with CI running that version. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(Py_GIL_DISABLED)
#define ADOPT_IN_PLACE 1
#else
#define ADOPT_IN_PLACE 0
#endif

/* the frozen dict and list types adopt() makes (NULL until adopts() took one) */
static PyTypeObject *frozen_dict;
static PyTypeObject *frozen_list;

static PyObject *
adopts(PyObject *module, PyObject *arg)
{
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "adopts() needs a type");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)arg;
    PyTypeObject *base = tp->tp_base;
    PyTypeObject **slot = base == &PyDict_Type ? &frozen_dict
                          : base == &PyList_Type ? &frozen_list : NULL;
    /* an instance must be its base's object in every byte, freed as any
     * instance of the subclass is (subtype_dealloc, then the base's dealloc,
     * which sends a subclass instance to tp_free, never to its free list) */
    int same_layout = slot != NULL
        && (tp->tp_flags & Py_TPFLAGS_HEAPTYPE)
        && (tp->tp_flags & Py_TPFLAGS_HAVE_GC)
        && tp->tp_basicsize == base->tp_basicsize
        && tp->tp_itemsize == base->tp_itemsize
        && tp->tp_dictoffset == 0
        && tp->tp_weaklistoffset == base->tp_weaklistoffset
        && tp->tp_free == base->tp_free
        && tp->tp_finalize == NULL
        && tp->tp_del == NULL
        && is_leaf_type(tp);
    if (!ADOPT_IN_PLACE || !same_layout) {
        Py_RETURN_FALSE;
    }
    if (*slot == NULL) {
        *slot = (PyTypeObject *)Py_NewRef(arg); /* kept for good */
    }
    return PyBool_FromLong(*slot == tp);
}

static PyObject *
adopt(PyObject *module, PyObject *obj)
{
    PyTypeObject *tp = PyDict_CheckExact(obj) ? frozen_dict
                       : PyList_CheckExact(obj) ? frozen_list : NULL;
    if (tp == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "adopt() takes a dict or list whose frozen type adopts() took");
        return NULL;
    }
    if (Py_REFCNT(obj) == 1) {
        /* the caller's argument is the only reference: no one else can see
         * the value change type (an instance of a heap type holds its type) */
        Py_SET_TYPE(obj, (PyTypeObject *)Py_NewRef(tp));
        settle_one(obj);
        return Py_NewRef(obj);
    }
    PyObject *copy = PyObject_CallOneArg((PyObject *)tp, obj);
    if (copy != NULL) {
        settle_one(copy);
    }
    return copy;
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
    {"adopts", adopts, METH_O,
     "adopts(type) -> bool: may adopt() make instances of this frozen dict or list type."},
    {"adopt", adopt, METH_O,
     "adopt(v) -> frozen dict or list: v itself when the caller holds its only "
     "reference, else a copy; settled."},
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
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ADOPT_IN_PLACE", ADOPT_IN_PLACE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
