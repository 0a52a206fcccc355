/* The prediction records of a run of rows, written in one call: the batch path's output step
 * (connectors/task/batch.py), byte for byte what the per-record path's f-strings write
 * (connectors/task/records.py, the formats of docs/kafka.md):
 *
 *   binary      {"topic","partition","model","offset":O,"id":ID,"y_pred":B,"p_true":P,"y":Y}
 *   multiclass  {"topic","partition","model","offset":O,"id":ID,"y_pred":L,"proba":{...},"y":L}
 *
 * P and the probabilities as Python's repr of a float (`PyOS_double_to_string`, 'r'), the id
 * as the batch reader gives its JSON. The predictions are written into one buffer, then each
 * becomes a bytes object of the output's column of values, with the input record's key, its
 * timestamp (None for a negative one) and its headers (all, or none) in the other columns.
 *
 * Built by `streammargin.jit.aot` (`streammargin warmup`) beside the package's other compiled
 * modules, under the same stamp; without it the batch path writes in Python.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
} buffer;

static int reserve(buffer *b, Py_ssize_t n) {
    if (b->size + n <= b->capacity) {
        return 0;
    }
    Py_ssize_t capacity = b->capacity ? b->capacity : 4096;
    while (capacity < b->size + n) {
        capacity *= 2;
    }
    char *grown = PyMem_Realloc(b->data, (size_t)capacity);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = grown;
    b->capacity = capacity;
    return 0;
}

static int put(buffer *b, const char *bytes, Py_ssize_t n) {
    if (reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->data + b->size, bytes, (size_t)n);
    b->size += n;
    return 0;
}

static int put_text(buffer *b, const char *text) { return put(b, text, (Py_ssize_t)strlen(text)); }

static int put_bytes(buffer *b, PyObject *bytes) {
    return put(b, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
}

/* A float as Python's repr writes it. */
static int put_float(buffer *b, double value) {
    char *text = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) {
        return -1;
    }
    int failed = put_text(b, text);
    PyMem_Free(text);
    return failed;
}

static int put_long(buffer *b, long long value) {
    char text[24];
    int n = snprintf(text, sizeof text, "%lld", value);
    return put(b, text, n);
}

static int read_buffer(PyObject *object, Py_buffer *view, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* write_predictions(records, first, labels, predicted, proba, classes, prefix, ids, id_ends,
 *                   id_first, copy_headers, values, keys, headers, timestamps) -> waiting
 *
 * The prediction of each row r of `labels` (int64: the row's label code, -1 none), for the
 * record records[first + r]: binary when `classes` is None (`predicted`, float64: +P(True) if
 * the label is True, else -P(True)), else multiclass (`predicted`, int64: the class code, -1
 * none; `proba`, float64 rows of the class probabilities; `classes`, a tuple of (label JSON,
 * key JSON) by class code). The id of row r is ids[id_ends[id_first + r - 1]:id_ends[id_first
 * + r]] (from 0 for the first). `copy_headers`: 1 the input's headers, 0 none. Appends to the
 * four lists; returns the rows without a label, as a list of 0 (an id: waiting) or 1 (no id). */
static PyObject *write_predictions(PyObject *self, PyObject *args) {
    PyObject *records, *labels_object, *predicted_object, *proba_object, *classes, *prefix;
    PyObject *ids_object, *id_ends_object, *values, *keys, *headers, *timestamps;
    Py_ssize_t first, id_first;
    int copy_headers;
    if (!PyArg_ParseTuple(args, "O!nOOOOSOOnpO!O!O!O!", &PyList_Type, &records, &first,
                          &labels_object, &predicted_object, &proba_object, &classes, &prefix,
                          &ids_object, &id_ends_object, &id_first, &copy_headers, &PyList_Type,
                          &values, &PyList_Type, &keys, &PyList_Type, &headers, &PyList_Type,
                          &timestamps)) {
        return NULL;
    }
    int binary = classes == Py_None;
    if (!binary && !PyTuple_Check(classes)) {
        PyErr_SetString(PyExc_TypeError, "classes must be None or a tuple");
        return NULL;
    }
    Py_buffer labels_view, predicted_view, proba_view, ids_view, id_ends_view;
    if (read_buffer(labels_object, &labels_view, 8, "labels") < 0) {
        return NULL;
    }
    if (read_buffer(predicted_object, &predicted_view, 8, "predicted") < 0) {
        PyBuffer_Release(&labels_view);
        return NULL;
    }
    if (read_buffer(binary ? predicted_object : proba_object, &proba_view, 8, "proba") < 0) {
        PyBuffer_Release(&labels_view);
        PyBuffer_Release(&predicted_view);
        return NULL;
    }
    if (read_buffer(ids_object, &ids_view, 1, "ids") < 0) {
        PyBuffer_Release(&labels_view);
        PyBuffer_Release(&predicted_view);
        PyBuffer_Release(&proba_view);
        return NULL;
    }
    if (read_buffer(id_ends_object, &id_ends_view, 8, "id_ends") < 0) {
        PyBuffer_Release(&labels_view);
        PyBuffer_Release(&predicted_view);
        PyBuffer_Release(&proba_view);
        PyBuffer_Release(&ids_view);
        return NULL;
    }
    Py_ssize_t n = labels_view.len / 8;
    const int64_t *labels = labels_view.buf;
    const int64_t *id_ends = id_ends_view.buf;
    const char *ids = ids_view.buf;
    Py_ssize_t n_classes = binary ? 0 : PyTuple_GET_SIZE(classes);
    Py_ssize_t width = n_classes > 2 ? n_classes : 2; /* (proba's row length) */
    PyObject *result = NULL, *waiting = NULL;
    PyObject *offset_name = PyUnicode_InternFromString("offset");
    PyObject *key_name = PyUnicode_InternFromString("key");
    PyObject *timestamp_name = PyUnicode_InternFromString("timestamp");
    PyObject *headers_name = PyUnicode_InternFromString("headers");
    Py_ssize_t *ends = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    buffer out = {NULL, 0, 0};
    if (offset_name == NULL || key_name == NULL || timestamp_name == NULL ||
        headers_name == NULL || ends == NULL) {
        if (ends == NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    if (first < 0 || first + n > PyList_GET_SIZE(records) || id_first < 0 ||
        id_first + n > id_ends_view.len / 8 ||
        predicted_view.len / 8 < n || (!binary && proba_view.len / 8 < n * width)) {
        PyErr_SetString(PyExc_ValueError, "write_predictions: rows beyond the arrays");
        goto done;
    }
    for (Py_ssize_t k = 0; k < n_classes; k++) {
        PyObject *pair = PyTuple_GET_ITEM(classes, k);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(pair, 0)) || !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "classes must be (label JSON, key JSON) pairs");
            goto done;
        }
    }
    waiting = PyList_New(0);
    if (waiting == NULL) {
        goto done;
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *record = PyList_GET_ITEM(records, first + r);
        PyObject *offset = PyObject_GetAttr(record, offset_name);
        if (offset == NULL) {
            goto done;
        }
        long long offset_value = PyLong_AsLongLong(offset);
        Py_DECREF(offset);
        if (offset_value == -1 && PyErr_Occurred()) {
            goto done;
        }
        Py_ssize_t at = id_first + r;
        Py_ssize_t id_start = at ? (Py_ssize_t)id_ends[at - 1] : 0;
        Py_ssize_t id_end = (Py_ssize_t)id_ends[at];
        if (id_start < 0 || id_end < id_start || id_end > ids_view.len) {
            PyErr_SetString(PyExc_ValueError, "write_predictions: an id beyond the ids");
            goto done;
        }
        long long label = labels[r];
        if (put_bytes(&out, prefix) || put_long(&out, offset_value) ||
            put_text(&out, ",\"id\":") || put(&out, ids + id_start, id_end - id_start)) {
            goto done;
        }
        if (binary) {
            double signed_p = ((const double *)predicted_view.buf)[r];
            double p = signed_p < 0 ? -signed_p : signed_p;
            if (put_text(&out, signed_p > 0.0 ? ",\"y_pred\":true,\"p_true\":"
                                              : ",\"y_pred\":false,\"p_true\":") ||
                put_float(&out, p) ||
                put_text(&out, label < 0 ? ",\"y\":null}" : label ? ",\"y\":true}"
                                                                  : ",\"y\":false}")) {
                goto done;
            }
        } else {
            long long code = ((const int64_t *)predicted_view.buf)[r];
            if (code >= n_classes || label >= n_classes) {
                PyErr_SetString(PyExc_ValueError, "write_predictions: a class beyond classes");
                goto done;
            }
            if (put_text(&out, ",\"y_pred\":") ||
                (code < 0 ? put_text(&out, "null")
                          : put_bytes(&out, PyTuple_GET_ITEM(PyTuple_GET_ITEM(classes, code), 0))) ||
                put_text(&out, ",\"proba\":{")) {
                goto done;
            }
            const double *row = (const double *)proba_view.buf + r * width;
            Py_ssize_t shown = code < 0 ? 0 : n_classes; /* (no class yet: an empty object) */
            for (Py_ssize_t c = 0; c < shown; c++) {
                if ((c && put_text(&out, ",")) ||
                    put_bytes(&out, PyTuple_GET_ITEM(PyTuple_GET_ITEM(classes, c), 1)) ||
                    put_text(&out, ":") || put_float(&out, row[c])) {
                    goto done;
                }
            }
            if (put_text(&out, "},\"y\":") ||
                (label < 0 ? put_text(&out, "null")
                           : put_bytes(&out, PyTuple_GET_ITEM(PyTuple_GET_ITEM(classes, label), 0))) ||
                put_text(&out, "}")) {
                goto done;
            }
        }
        ends[r] = out.size;
        if (label < 0) {
            int has_id = !(id_end - id_start == 4 && memcmp(ids + id_start, "null", 4) == 0);
            PyObject *item = PyLong_FromSsize_t(r);
            PyObject *kind = PyLong_FromLong(has_id ? 0 : 1);
            PyObject *pair = item && kind ? PyTuple_Pack(2, item, kind) : NULL;
            Py_XDECREF(item);
            Py_XDECREF(kind);
            if (pair == NULL || PyList_Append(waiting, pair) < 0) {
                Py_XDECREF(pair);
                goto done;
            }
            Py_DECREF(pair);
        }
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *record = PyList_GET_ITEM(records, first + r);
        Py_ssize_t start = r ? ends[r - 1] : 0;
        PyObject *value = PyBytes_FromStringAndSize(out.data + start, ends[r] - start);
        PyObject *key = PyObject_GetAttr(record, key_name);
        PyObject *timestamp = PyObject_GetAttr(record, timestamp_name);
        PyObject *header = copy_headers ? PyObject_GetAttr(record, headers_name)
                                        : Py_NewRef(Py_None);
        int failed = value == NULL || key == NULL || timestamp == NULL || header == NULL;
        if (!failed && timestamp != Py_None) {
            long long stamp = PyLong_AsLongLong(timestamp);
            if (stamp == -1 && PyErr_Occurred()) {
                failed = 1;
            } else if (stamp < 0) {
                Py_SETREF(timestamp, Py_NewRef(Py_None));
            }
        }
        if (!failed) {
            failed = PyList_Append(values, value) || PyList_Append(keys, key) ||
                     PyList_Append(headers, header) || PyList_Append(timestamps, timestamp);
        }
        Py_XDECREF(value);
        Py_XDECREF(key);
        Py_XDECREF(timestamp);
        Py_XDECREF(header);
        if (failed) {
            goto done;
        }
    }
    result = Py_NewRef(waiting);
done:
    Py_XDECREF(waiting);
    Py_XDECREF(offset_name);
    Py_XDECREF(key_name);
    Py_XDECREF(timestamp_name);
    Py_XDECREF(headers_name);
    PyMem_Free(ends);
    PyMem_Free(out.data);
    PyBuffer_Release(&labels_view);
    PyBuffer_Release(&predicted_view);
    PyBuffer_Release(&proba_view);
    PyBuffer_Release(&ids_view);
    PyBuffer_Release(&id_ends_view);
    return result;
}

static PyMethodDef methods[] = {
    {"write_predictions", write_predictions, METH_VARARGS,
     "write_predictions(records, first, labels, predicted, proba, classes, prefix, ids, id_ends, "
     "id_first, copy_headers, values, keys, headers, timestamps) -> rows without a label "
     "(see predictions.c)"},
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
    PyModuleDef_HEAD_INIT, NAME_TEXT(MODULE), "prediction records written in one call (see "
    "predictions.c)", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC INIT_FUNCTION(MODULE)(void) {
    return PyModule_Create(&definition);
}
