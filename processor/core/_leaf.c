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

/* freeze(value[, depth]): processor.core.freezing.freeze in C (the compiled
 * build's copy of the walk; the same result, the same refusals).  Exact
 * dicts, lists and tuples are copied once into the frozen types (their
 * nested containers frozen first; FrozenDict(dict(src)) copied twice) and
 * settled; scalars and frozen values come back as they are; anything else
 * (a dict or list subclass) goes to the Python walk, which calls back here
 * for its parts.  freezer() sets the types and the fallback once. */
static PyTypeObject *freeze_dict;
static PyTypeObject *freeze_list;
static PyObject *freeze_error;    /* JsonDepthError: called with no arguments */
static PyObject *freeze_fallback; /* the Python walk: fallback(value, depth) */
static Py_ssize_t freeze_max_depth;
static PyObject *freeze_no_args; /* () for dict's tp_new */

static PyObject *freeze_walk(PyObject *value, Py_ssize_t depth);

static inline int
freeze_done(PyObject *v)
{
    PyTypeObject *t = Py_TYPE(v);
    return t == &PyUnicode_Type || t == &PyLong_Type || t == &PyBool_Type
           || t == &PyFloat_Type || v == Py_None || t == freeze_dict || t == freeze_list;
}

static PyObject *
freeze_too_deep(void)
{
    PyObject *exc = PyObject_CallNoArgs(freeze_error);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *
freeze_dict_of(PyObject *src, Py_ssize_t depth)
{
    PyObject *out = PyDict_Type.tp_new(freeze_dict, freeze_no_args, NULL);
    if (out == NULL) {
        return NULL;
    }
    if (PyDict_Merge(out, src, 1) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    /* walk the source (the copy's values are replaced as it goes) */
    while (PyDict_Next(src, &pos, &k, &v)) {
        if (freeze_done(v)) {
            continue;
        }
        PyObject *f = freeze_walk(v, depth + 1);
        if (f == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        int rc = PyDict_SetItem(out, k, f);
        Py_DECREF(f);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    settle_one(out);
    return out;
}

static PyObject *
freeze_list_of(PyObject *src, Py_ssize_t depth)
{
    /* src: an exact list or tuple */
    PyObject *out = PyType_GenericAlloc(freeze_list, 0);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(src);
    if (n > 0) {
        PyObject **items = PyMem_New(PyObject *, n);
        if (items == NULL) {
            Py_DECREF(out);
            return PyErr_NoMemory();
        }
        PyObject **from = PySequence_Fast_ITEMS(src);
        for (Py_ssize_t i = 0; i < n; i++) {
            items[i] = Py_NewRef(from[i]);
        }
        ((PyListObject *)out)->ob_item = items;
        ((PyListObject *)out)->allocated = n;
        Py_SET_SIZE(out, n);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = items[i];
            if (freeze_done(v)) {
                continue;
            }
            PyObject *f = freeze_walk(v, depth + 1);
            if (f == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            items[i] = f;
            Py_DECREF(v);
        }
    }
    settle_one(out);
    return out;
}

static PyObject *
freeze_walk(PyObject *value, Py_ssize_t depth)
{
    PyTypeObject *t = Py_TYPE(value);
    if (t == &PyDict_Type || t == &PyList_Type || t == &PyTuple_Type) {
        if (depth >= freeze_max_depth) {
            return freeze_too_deep();
        }
        if (Py_EnterRecursiveCall(" in freeze")) {
            return NULL;
        }
        PyObject *out = t == &PyDict_Type ? freeze_dict_of(value, depth)
                                          : freeze_list_of(value, depth);
        Py_LeaveRecursiveCall();
        return out;
    }
    if (freeze_done(value)) {
        return Py_NewRef(value);
    }
    PyObject *d = PyLong_FromSsize_t(depth);
    if (d == NULL) {
        return NULL;
    }
    PyObject *out = PyObject_CallFunctionObjArgs(freeze_fallback, value, d, NULL);
    Py_DECREF(d);
    return out;
}

static PyObject *
freeze(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (freeze_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "freeze() before freezer()");
        return NULL;
    }
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "freeze(value[, depth])");
        return NULL;
    }
    Py_ssize_t depth = 0;
    if (nargs == 2) {
        depth = PyLong_AsSsize_t(args[1]);
        if (depth == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    return freeze_walk(args[0], depth);
}

/* freeze_item(d, key): d[key] = freeze(d[key]) for a dict d the caller has
 * just decoded and holds the only reference to (an orjson result it drops):
 * each dict and list that only its parent (at the top: d) refers to becomes
 * the frozen type in place, as adopt() does, its parts first; anything
 * shared, a tuple or a subclass is copied by freeze().  The same value and
 * types as freeze(); nothing that anyone else could see changes type.  In
 * place only where adopt() may change types (ADOPT_IN_PLACE) and the
 * frozen types are the ones adopts() took.  A refusal (JsonDepthError)
 * leaves d[key] as deep as it was (its parts frozen or not: the same value). */
static PyObject *
owned_walk(PyObject *value, Py_ssize_t depth)
{
    PyTypeObject *t = Py_TYPE(value);
    int in_place = Py_REFCNT(value) == 1
                   && ((t == &PyDict_Type && frozen_dict != NULL && frozen_dict == freeze_dict)
                       || (t == &PyList_Type && frozen_list != NULL
                           && frozen_list == freeze_list));
    if (!in_place) {
        return freeze_walk(value, depth);
    }
    if (depth >= freeze_max_depth) {
        return freeze_too_deep();
    }
    if (Py_EnterRecursiveCall(" in freeze_item")) {
        return NULL;
    }
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(value, &pos, &k, &v)) {
            if (freeze_done(v)) {
                continue;
            }
            PyObject *f = owned_walk(v, depth + 1);
            if (f == NULL) {
                Py_LeaveRecursiveCall();
                return NULL;
            }
            if (f == v) {
                Py_DECREF(f);
                continue;
            }
            /* an existing key: the value is replaced, the table does not move */
            int rc = PyDict_SetItem(value, k, f);
            Py_DECREF(f);
            if (rc < 0) {
                Py_LeaveRecursiveCall();
                return NULL;
            }
        }
    }
    else {
        Py_ssize_t n = PyList_GET_SIZE(value);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyList_GET_ITEM(value, i);
            if (freeze_done(v)) {
                continue;
            }
            PyObject *f = owned_walk(v, depth + 1);
            if (f == NULL) {
                Py_LeaveRecursiveCall();
                return NULL;
            }
            if (f == v) {
                Py_DECREF(f);
                continue;
            }
            PyList_SET_ITEM(value, i, f);
            Py_DECREF(v);
        }
    }
    Py_LeaveRecursiveCall();
    /* still only ours: no call above could have taken a reference to it */
    Py_SET_TYPE(value, (PyTypeObject *)Py_NewRef(t == &PyDict_Type ? frozen_dict : frozen_list));
    settle_one(value);
    return Py_NewRef(value);
}

static PyObject *
freeze_item(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (freeze_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "freeze_item() before freezer()");
        return NULL;
    }
    if (nargs != 2 || !PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "freeze_item(dict, key)");
        return NULL;
    }
    PyObject *d = args[0], *key = args[1];
    PyObject *value = PyDict_GetItemWithError(d, key); /* borrowed: d's reference */
    if (value == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetObject(PyExc_KeyError, key);
        }
        return NULL;
    }
    PyObject *frozen = ADOPT_IN_PLACE ? owned_walk(value, 0) : freeze_walk(value, 0);
    if (frozen == NULL) {
        return NULL;
    }
    int rc = frozen == value ? 0 : PyDict_SetItem(d, key, frozen);
    Py_DECREF(frozen);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
freezer(PyObject *module, PyObject *args)
{
    PyObject *dict_type, *list_type, *error, *fallback;
    Py_ssize_t max_depth;
    if (!PyArg_ParseTuple(args, "O!O!OOn", &PyType_Type, &dict_type, &PyType_Type,
                          &list_type, &error, &fallback, &max_depth)) {
        return NULL;
    }
    /* instances are their base's object in every byte (as for adopt) */
    if (!PyType_IsSubtype((PyTypeObject *)dict_type, &PyDict_Type)
        || !PyType_IsSubtype((PyTypeObject *)list_type, &PyList_Type)
        || ((PyTypeObject *)dict_type)->tp_basicsize != PyDict_Type.tp_basicsize
        || ((PyTypeObject *)list_type)->tp_basicsize != PyList_Type.tp_basicsize
        || ((PyTypeObject *)dict_type)->tp_dictoffset != 0
        || ((PyTypeObject *)list_type)->tp_dictoffset != 0
        || !is_leaf_type((PyTypeObject *)dict_type)
        || !is_leaf_type((PyTypeObject *)list_type)) {
        Py_RETURN_FALSE;
    }
    if (freeze_fallback == NULL && fallback == Py_None) {
        Py_RETURN_FALSE; /* a question (are these the types?) before any set-up */
    }
    if (freeze_fallback != NULL) {
        /* once per process: later calls must name the same types */
        return PyBool_FromLong(freeze_dict == (PyTypeObject *)dict_type
                               && freeze_list == (PyTypeObject *)list_type);
    }
    freeze_no_args = PyTuple_New(0);
    if (freeze_no_args == NULL) {
        return NULL;
    }
    freeze_dict = (PyTypeObject *)Py_NewRef(dict_type); /* kept for good, as below */
    freeze_list = (PyTypeObject *)Py_NewRef(list_type);
    freeze_error = Py_NewRef(error);
    freeze_max_depth = max_depth;
    freeze_fallback = Py_NewRef(fallback);
    Py_RETURN_TRUE;
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
    {"freeze", (PyCFunction)(void (*)(void))freeze, METH_FASTCALL,
     "freeze(value[, depth]) -> a deep-frozen copy (processor.core.freezing.freeze)."},
    {"freeze_item", (PyCFunction)(void (*)(void))freeze_item, METH_FASTCALL,
     "freeze_item(d, key): d[key] = freeze(d[key]), its unshared dicts and lists frozen "
     "in place: for a dict the caller has just decoded and holds the only reference to."},
    {"freezer", freezer, METH_VARARGS,
     "freezer(dict_type, list_type, error, fallback, max_depth) -> bool: set freeze()'s "
     "types once (later: are these they?); False where they do not fit (freeze() is "
     "then not to be used)."},
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
