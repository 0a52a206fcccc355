/* The per-record work on a feature dict, in C: the hot loops numba cannot compile (they read
 * a Python dict): a model's encoding of a record, and the StandardScaler's step (`scale_known`
 * and `apply_scaled`, below).
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
 * same stamp; `streammargin.features` and `streammargin.scaler` use it when it is there.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
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

/* The StandardScaler's step for a record of known names (`streammargin.scaler`), the numba
 * `scale_record` and `apply_update` of `streammargin/jit/scaler.py` with the same arithmetic in
 * the same order (see there: River's to the last bit, `pow(var, half)` with half = 0.5 given at
 * run time so the compiler cannot make it a sqrt), without the Python around them: a record's
 * names checked against the last record's, its values read, both scalings made into dicts. */

/* Per feature, in the update `scale_known` returns: whether its statistics learn, then them. */
#define UPDATE_FIELDS 3

static int stats_buffers(PyObject *const *args, Py_buffer *views, int writable) {
    /* args: columns (int64), counts (int64), means, variances (float64) */
    for (int k = 0; k < 4; k++) {
        int flags = PyBUF_C_CONTIGUOUS | (k > 0 && writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[k], &views[k], flags) < 0) {
            for (int done = 0; done < k; done++) {
                PyBuffer_Release(&views[done]);
            }
            return -1;
        }
    }
    return 0;
}

static void release_buffers(Py_buffer *views) {
    for (int k = 0; k < 4; k++) {
        PyBuffer_Release(&views[k]);
    }
}

/* Whether the columns are within the statistics' length (they are: the scaler made both). */
static int columns_fit(const Py_buffer *views, Py_ssize_t n) {
    if (views[0].len != n * (Py_ssize_t)sizeof(int64_t) || views[1].len % sizeof(int64_t)
            || views[2].len != views[1].len || views[3].len != views[1].len) {
        return 0;
    }
    const int64_t *columns = views[0].buf;
    int64_t size = views[1].len / (Py_ssize_t)sizeof(int64_t);
    for (Py_ssize_t j = 0; j < n; j++) {
        if (columns[j] < 0 || columns[j] >= size) {
            return 0;
        }
    }
    return 1;
}

/* `scale_known(x, names, columns, counts, means, variances, half)`: for a dict whose keys are
 * `names` in that order (the same objects, or equal exact str) and whose values are finite
 * floats, ints or bools, `(before, after, update, overflow)`: the dicts of x scaled with the
 * statistics before and after learning it, the update `apply_scaled` writes, and how many
 * features it leaves unchanged (an overflow). None for any other dict, or a count at its
 * maximum (the caller's other paths handle them). Changes nothing. */
static PyObject *scale_known(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "scale_known(x, names, columns, counts, means, variances, half)");
        return NULL;
    }
    PyObject *x = args[0], *names = args[1];
    if (!PyDict_CheckExact(x) || !PyTuple_CheckExact(names)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n < 1 || PyDict_GET_SIZE(x) != n
            || (size_t)n > PY_SSIZE_T_MAX / (UPDATE_FIELDS * sizeof(double))) {
        Py_RETURN_NONE;
    }
    double half = PyFloat_AsDouble(args[6]);
    if (half == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer views[4];
    if (stats_buffers(args + 2, views, 0) < 0) {
        return NULL;
    }
    PyObject *result = NULL, *before = NULL, *after = NULL, *update = NULL;
    if (!columns_fit(views, n)) {
        goto miss;
    }
    const int64_t *columns = views[0].buf, *counts = views[1].buf;
    const double *means = views[2].buf, *variances = views[3].buf;
    before = PyDict_New();
    after = PyDict_New();
    update = PyBytes_FromStringAndSize(NULL, n * UPDATE_FIELDS * (Py_ssize_t)sizeof(double));
    if (before == NULL || after == NULL || update == NULL) {
        goto done;
    }
    double *out = (double *)PyBytes_AS_STRING(update);
    Py_ssize_t position = 0, j = 0, overflow = 0;
    PyObject *name, *raw;
    while (PyDict_Next(x, &position, &name, &raw)) {
        if (j >= n) {
            goto miss;
        }
        PyObject *expected = PyTuple_GET_ITEM(names, j);
        if (name != expected && (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(expected)
                                 || PyUnicode_Compare(name, expected) != 0)) {
            goto miss;
        }
        double value;
        if (!plain_value(raw, &value)) {
            goto miss;
        }
        int64_t column = columns[j];
        int64_t count = counts[column];
        if (count == INT64_MAX) {
            goto miss;
        }
        double old_mean = means[column], old_var = variances[column];
        double scaled_before = old_var != 0.0 ? (value - old_mean) / pow(old_var, half) : 0.0;
        count += 1;
        double mean = old_mean + (value - old_mean) / (double)count;
        double var = old_var + ((value - old_mean) * (value - mean) - old_var) / (double)count;
        double scaled_after;
        double *field = out + j * UPDATE_FIELDS;
        if (-DBL_MAX <= mean && mean <= DBL_MAX && 0.0 <= var && var <= DBL_MAX) {
            field[0] = 1.0;
            field[1] = mean;
            field[2] = var;
            scaled_after = var != 0.0 ? (value - mean) / pow(var, half) : 0.0;
        } else { /* an overflow (or NaN) would poison this feature for ever */
            overflow++;
            field[0] = 0.0;
            field[1] = old_mean;
            field[2] = old_var;
            scaled_after = scaled_before;
        }
        PyObject *first = PyFloat_FromDouble(scaled_before);
        PyObject *second = PyFloat_FromDouble(scaled_after);
        int failed = first == NULL || second == NULL || PyDict_SetItem(before, name, first) < 0
                     || PyDict_SetItem(after, name, second) < 0;
        Py_XDECREF(first);
        Py_XDECREF(second);
        if (failed) {
            goto done;
        }
        j++;
    }
    if (j != n) {
        goto miss;
    }
    result = Py_BuildValue("(OOOn)", before, after, update, overflow);
    goto done;
miss:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(before);
    Py_XDECREF(after);
    Py_XDECREF(update);
    release_buffers(views);
    return result;
}

/* `apply_scaled(columns, counts, means, variances, update)`: write the update `scale_known`
 * returned for these columns into the statistics (a feature that would overflow keeps its). */
static PyObject *apply_scaled(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5 || !PyBytes_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "apply_scaled(columns, counts, means, variances, update: bytes)");
        return NULL;
    }
    Py_buffer views[4];
    if (stats_buffers(args, views, 1) < 0) {
        return NULL;
    }
    Py_ssize_t n = views[0].len / (Py_ssize_t)sizeof(int64_t);
    if (PyBytes_GET_SIZE(args[4]) != n * UPDATE_FIELDS * (Py_ssize_t)sizeof(double)
            || !columns_fit(views, n)) {
        release_buffers(views);
        PyErr_SetString(PyExc_ValueError, "apply_scaled: an update of other columns");
        return NULL;
    }
    const int64_t *columns = views[0].buf;
    int64_t *counts = views[1].buf;
    double *means = views[2].buf, *variances = views[3].buf;
    const double *in = (const double *)PyBytes_AS_STRING(args[4]);
    for (Py_ssize_t j = 0; j < n; j++) {
        const double *field = in + j * UPDATE_FIELDS;
        if (field[0] != 0.0) {
            int64_t column = columns[j];
            counts[column] += 1;
            means[column] = field[1];
            variances[column] = field[2];
        }
    }
    release_buffers(views);
    Py_RETURN_NONE;
}

/* rows_of_dicts(xs, start, names, indicators, split) -> (next index, packed values)
 *
 * The values of the dicts xs[start:] whose keys are `names`, in that order (a run of rows of
 * one shape: `streammargin.progressive.predict_many`), as native float64 bytes, each dict's in
 * its order but those at the positions where `indicators` (bytes, one a name) is 1, which must
 * be True (a category indicator, not a value of the row; with `split`, True anywhere else is
 * another shape's indicator). It stops at the first dict that differs, or has a value that is
 * not a finite float, int or bool (an int beyond float64). */
static PyObject *rows_of_dicts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5 || !PyList_Check(args[0]) || !PyLong_Check(args[1]) ||
        !PyTuple_Check(args[2]) || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "rows_of_dicts(xs, start, names, indicators, split)");
        return NULL;
    }
    int split = PyObject_IsTrue(args[4]);
    if (split < 0) {
        return NULL;
    }
    PyObject *xs = args[0], *names = args[2];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(xs), width = PyTuple_GET_SIZE(names);
    if (PyBytes_GET_SIZE(args[3]) != width || start < 0) {
        PyErr_SetString(PyExc_ValueError, "rows_of_dicts: an indicator flag a name");
        return NULL;
    }
    const char *flags = PyBytes_AS_STRING(args[3]);
    Py_ssize_t holes = 0;
    for (Py_ssize_t j = 0; j < width; j++) {
        holes += flags[j] ? 0 : 1;
    }
    Py_ssize_t capacity = (n > start ? n - start : 1) * (holes ? holes : 1);
    double *out = PyMem_Malloc((size_t)capacity * sizeof(double));
    if (out == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t i = start, used = 0;
    for (; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(xs, i);
        if (!PyDict_CheckExact(x) || PyDict_GET_SIZE(x) != width) {
            break;
        }
        Py_ssize_t position = 0, j = 0, at = used;
        PyObject *key, *raw;
        int same = 1;
        while (PyDict_Next(x, &position, &key, &raw)) {
            PyObject *name = PyTuple_GET_ITEM(names, j);
            if (key != name) {
                int equal = PyUnicode_CheckExact(key) && PyUnicode_CheckExact(name)
                                ? PyUnicode_Compare(key, name) == 0 : 0;
                if (!equal) {
                    same = 0;
                    break;
                }
            }
            if (flags[j]) {
                if (raw != Py_True) {
                    same = 0;
                    break;
                }
            } else {
                double value;
                if ((split && raw == Py_True) || !plain_value(raw, &value)) {
                    same = 0;
                    break;
                }
                out[at++] = value;
            }
            j++;
        }
        if (!same || j != width) {
            break;
        }
        used = at;
    }
    PyObject *packed = PyBytes_FromStringAndSize((const char *)out, used * (Py_ssize_t)sizeof(double));
    PyMem_Free(out);
    if (packed == NULL) {
        return NULL;
    }
    return Py_BuildValue("(nN)", i, packed);
}

static PyMethodDef methods[] = {
    {"sorted_known", (PyCFunction)(void (*)(void))sorted_known, METH_FASTCALL,
     "sorted_known(x, index) -> (names, values, columns, packed, dict_names, ranks) or None"},
    {"pack_as", (PyCFunction)(void (*)(void))pack_as, METH_FASTCALL,
     "pack_as(x, dict_names, ranks) -> (values, packed) or None"},
    {"scale_known", (PyCFunction)(void (*)(void))scale_known, METH_FASTCALL,
     "scale_known(x, names, columns, counts, means, variances, half) -> "
     "(before, after, update, overflow) or None"},
    {"apply_scaled", (PyCFunction)(void (*)(void))apply_scaled, METH_FASTCALL,
     "apply_scaled(columns, counts, means, variances, update)"},
    {"rows_of_dicts", (PyCFunction)(void (*)(void))rows_of_dicts, METH_FASTCALL,
     "rows_of_dicts(xs, start, names, indicators, split) -> (next index, packed values)"},
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
