/* The per-record encoding of a feature dict, in C: the one hot loop numba cannot compile (it
 * reads a Python dict).
 *
 * `sorted_known(x, index)` is `streammargin.features.FeatureSpace`'s encoding of a record whose
 * names all have columns of their own, to the byte: the names, the value objects, the int64
 * columns and the native float64 values, in column order (`canonical_order`), whatever the
 * order of x's keys. It returns None, and the caller takes its Python path, for anything else:
 * a name that is not a str or has no column, a value that is not a float, an int or a bool, an
 * int beyond float64, a value that is not finite. It never raises on what a record holds and
 * runs no Python code: names are exact str (their hash and equality are C), the index's own
 * names are the types a FeatureSpace accepts (str, int, float, bool, None, tuples of these), so
 * nothing can change x while it is read. It also returns the names in x's order and where each
 * goes in column order, which the cache keeps for `pack_as`: the values of the next dict with
 * the same names in the same order (a dense stream's next record), without a lookup per name.
 *
 * Built by `streammargin.jit.aot` (`streammargin warmup`) beside the numba modules, under the
 * same stamp; `streammargin.features` uses it when it is there.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t column;
    double value;
    PyObject *name;  /* borrowed from x */
    PyObject *raw;   /* borrowed from x */
    Py_ssize_t at;   /* its position in x's order */
} Entry;

/* Below this many entries an insertion sort; from it on qsort (columns are distinct, so
 * either gives the one order by column). */
#define INSERTION_SORT_MAX 32

static int compare_columns(const void *a, const void *b) {
    int64_t left = ((const Entry *)a)->column, right = ((const Entry *)b)->column;
    return (left > right) - (left < right);
}

static void sort_by_column(Entry *entries, Py_ssize_t n) {
    if (n > INSERTION_SORT_MAX) {
        qsort(entries, (size_t)n, sizeof(Entry), compare_columns);
        return;
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        Entry moving = entries[i];
        Py_ssize_t j = i;
        while (j > 0 && entries[j - 1].column > moving.column) {
            entries[j] = entries[j - 1];
            j--;
        }
        entries[j] = moving;
    }
}

static int plain_value(PyObject *raw, double *value);

/* 1: read into *entry; 0: not a known name with a plain finite value (the Python path);
 * -1: an error is set (out of memory, say). */
static int read_entry(PyObject *index, PyObject *name, PyObject *raw, Entry *entry) {
    if (!PyUnicode_CheckExact(name)) {
        return 0;
    }
    PyObject *column = PyDict_GetItemWithError(index, name); /* borrowed */
    if (column == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if (!PyLong_CheckExact(column)) {
        return 0;
    }
    long long column_number = PyLong_AsLongLong(column);
    if (column_number < 0) {
        if (PyErr_Occurred()) {
            PyErr_Clear();
        }
        return 0;
    }
    double value; /* an int correctly rounded, as struct's "d" packs it; beyond float64: 0 */
    if (!plain_value(raw, &value)) {
        return 0;
    }
    entry->column = (int64_t)column_number;
    entry->value = value;
    entry->name = name;
    entry->raw = raw;
    return 1;
}

/* A value as float64: 1; 0 when it is not a finite float, int or bool (no error set). */
static int plain_value(PyObject *raw, double *value) {
    if (PyFloat_CheckExact(raw)) {
        *value = PyFloat_AS_DOUBLE(raw);
    } else if (PyBool_Check(raw)) {
        *value = raw == Py_True ? 1.0 : 0.0;
    } else if (PyLong_CheckExact(raw)) {
        *value = PyLong_AsDouble(raw);
        if (*value == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else {
        return 0;
    }
    return isfinite(*value);
}

/* The result of `sorted_known`; entries in column order. A dict that was in column order
 * already has its names once and None for ranks (each name stays where it is). */
static PyObject *build_result(const Entry *entries, Py_ssize_t n, int in_order) {
    PyObject *names = PyTuple_New(n);
    PyObject *values = PyTuple_New(n);
    PyObject *columns = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    PyObject *packed = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(double));
    PyObject *dict_names, *ranks;
    if (in_order) {
        dict_names = names;
        Py_XINCREF(dict_names);
        ranks = Py_None;
        Py_INCREF(ranks);
    } else {
        dict_names = PyTuple_New(n);
        ranks = PyTuple_New(n);
    }
    if (names == NULL || values == NULL || columns == NULL || packed == NULL
            || dict_names == NULL || ranks == NULL) {
        goto failed;
    }
    for (Py_ssize_t i = 0; !in_order && i < n; i++) {
        PyObject *rank = PyLong_FromSsize_t(i);
        if (rank == NULL) {
            goto failed;
        }
        PyTuple_SET_ITEM(ranks, entries[i].at, rank);
        Py_INCREF(entries[i].name);
        PyTuple_SET_ITEM(dict_names, entries[i].at, entries[i].name);
    }
    int64_t *column_out = (int64_t *)PyByteArray_AS_STRING(columns);
    double *value_out = (double *)PyBytes_AS_STRING(packed);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(entries[i].name);
        PyTuple_SET_ITEM(names, i, entries[i].name);
        Py_INCREF(entries[i].raw);
        PyTuple_SET_ITEM(values, i, entries[i].raw);
        memcpy(column_out + i, &entries[i].column, sizeof(int64_t));
        memcpy(value_out + i, &entries[i].value, sizeof(double));
    }
    return Py_BuildValue("(NNNNNN)", names, values, columns, packed, dict_names, ranks);
failed:
    Py_XDECREF(names);
    Py_XDECREF(values);
    Py_XDECREF(columns);
    Py_XDECREF(packed);
    Py_XDECREF(dict_names);
    Py_XDECREF(ranks);
    return NULL;
}

static PyObject *sorted_known(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "sorted_known(x, index) takes two dicts");
        return NULL;
    }
    PyObject *x = args[0], *index = args[1];
    if (!PyDict_CheckExact(x) || !PyDict_CheckExact(index)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyDict_GET_SIZE(x);
    if (n < 1 || (size_t)n > PY_SSIZE_T_MAX / sizeof(Entry)) {
        Py_RETURN_NONE;
    }
    Entry *entries = PyMem_Malloc((size_t)n * sizeof(Entry));
    if (entries == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    Py_ssize_t position = 0, i = 0;
    PyObject *name, *raw;
    int in_order = 1;
    while (PyDict_Next(x, &position, &name, &raw)) {
        if (i >= n) { /* cannot happen: nothing here runs Python code */
            goto miss;
        }
        int read = read_entry(index, name, raw, &entries[i]);
        entries[i].at = i;
        if (read < 0) {
            goto done;
        }
        if (read == 0) {
            goto miss;
        }
        if (i > 0 && entries[i - 1].column > entries[i].column) {
            in_order = 0;
        }
        i++;
    }
    if (i != n) {
        goto miss;
    }
    if (!in_order) {
        sort_by_column(entries, n);
    }
    for (Py_ssize_t j = 1; j < n; j++) {
        if (entries[j - 1].column == entries[j].column) { /* two names, one column */
            goto miss;
        }
    }
    result = build_result(entries, n, in_order);
    goto done;
miss:
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(entries);
    return result;
}

/* `pack_as(x, names, ranks)`: `(values, packed)` of a dict whose keys are `names` in that order
 * (the same objects, or equal exact str), its values in column order: value i goes to position
 * ranks[i] (ranks None: to position i). `names` and `ranks` are what `sorted_known` returned for
 * an earlier dict (or the Python path's same), so values are what
 * `operator.itemgetter(*column_ordered_names)(x)` gives. None for any other dict, or a value
 * that is not a finite float, int or bool. */
static PyObject *pack_as(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pack_as(x, names, ranks) takes three arguments");
        return NULL;
    }
    PyObject *x = args[0], *names = args[1], *ranks = args[2];
    int in_order = ranks == Py_None;
    if (!PyDict_CheckExact(x) || !PyTuple_CheckExact(names)
            || !(in_order || PyTuple_CheckExact(ranks))) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n < 1 || PyDict_GET_SIZE(x) != n || !(in_order || PyTuple_GET_SIZE(ranks) == n)) {
        Py_RETURN_NONE;
    }
    PyObject *values = PyTuple_New(n);
    PyObject *packed = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(double));
    if (values == NULL || packed == NULL) {
        Py_XDECREF(values);
        Py_XDECREF(packed);
        return NULL;
    }
    double *out = (double *)PyBytes_AS_STRING(packed);
    Py_ssize_t position = 0, i = 0;
    PyObject *name, *raw;
    while (PyDict_Next(x, &position, &name, &raw)) {
        if (i >= n) {
            goto miss;
        }
        PyObject *expected = PyTuple_GET_ITEM(names, i);
        if (name != expected) {
            /* str == str is C; anything else must be the very object */
            if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(expected)
                    || PyUnicode_Compare(name, expected) != 0) {
                goto miss;
            }
        }
        Py_ssize_t at = i;
        if (!in_order) {
            PyObject *rank = PyTuple_GET_ITEM(ranks, i);
            at = PyLong_CheckExact(rank) ? PyLong_AsSsize_t(rank) : -1;
        }
        if (at < 0 || at >= n || PyTuple_GET_ITEM(values, at) != NULL) {
            PyErr_Clear();
            goto miss; /* not a permutation: not ours */
        }
        double value;
        if (!plain_value(raw, &value)) {
            goto miss;
        }
        Py_INCREF(raw);
        PyTuple_SET_ITEM(values, at, raw);
        out[at] = value;
        i++;
    }
    if (i != n) {
        goto miss;
    }
    return Py_BuildValue("(NN)", values, packed);
miss:
    Py_DECREF(values); /* (a tuple with empty slots deallocates fine) */
    Py_DECREF(packed);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sorted_known", (PyCFunction)(void (*)(void))sorted_known, METH_FASTCALL,
     "sorted_known(x, index) -> (names, values, columns, packed, dict_names, ranks) or None"},
    {"pack_as", (PyCFunction)(void (*)(void))pack_as, METH_FASTCALL,
     "pack_as(x, dict_names, ranks) -> (values, packed) or None"},
    {NULL, NULL, 0, NULL},
};

/* The module's name comes from the build (-DMODULE=<name>): it carries the sources' stamp. */
#ifndef MODULE
#error "compile with -DMODULE=<the module's name>"
#endif
#define TEXT(name) #name
#define NAME_TEXT(name) TEXT(name)
#define JOIN(a, b) a##b
#define INIT_FUNCTION(name) JOIN(PyInit_, name)

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT, NAME_TEXT(MODULE), "streammargin's record encoder (see records.c)", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC INIT_FUNCTION(MODULE)(void) {
    return PyModule_Create(&definition);
}
