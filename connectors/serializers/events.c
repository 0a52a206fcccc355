/* The records' events in C: an Avro record's, read from its payload
 * (`connectors.serializers.avro_events`), and the features of a decoded JSON object
 * (`connectors.serializers.mapping`, `map_object` below).
 *
 * `avro_events` compiles a schema and a field mapping into a plan: one instruction per field of
 * the record (the id, the label, a feature of a given name, a field to skip), for the field types
 * a plan can hold. `read_event(value, start, plan, names, tables, caches)` runs it over one
 * framed record and returns `(id, x, label, indicators)`, where `x` is the feature dict, or None
 * where it cannot decide: a payload that does not decode, a value the mapping refuses (NaN, an
 * enum index out of range, a string of more than MAX_CATEGORY bytes, invalid UTF-8). The caller
 * then takes the general path, which decides and words the dead letter; the tests compare the
 * two on generated and mutated records.
 *
 * A payload is untrusted: every read is checked against the buffer's end before it is made,
 * a varint is at most ten bytes and 64 bits, a length is checked against what is left before a
 * byte of it is read, and nothing is allocated but the event's own objects. A plan is this
 * project's own (made from a schema by `avro_events`): it is checked as it is read all the same
 * (an opcode or an index out of range raises ValueError, a bug).
 *
 * Built by `streammargin.jit.aot` (`streammargin warmup`) beside the package's other compiled
 * modules, under the same stamp; without it the plan runs in Python (avro_events).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The plan's instructions: an opcode byte, then (where said) a 2-byte little-endian index. */
enum {
    OP_ID_STRING = 1,   /* the id: a string */
    OP_ID_LONG = 2,     /* the id: an int or a long */
    OP_LABEL_BOOL = 3,  /* the label: a boolean */
    OP_DOUBLE = 4,      /* + name: a double feature */
    OP_FLOAT = 5,       /* + name: a float feature */
    OP_INT = 6,         /* + name: an int feature (32 bits) */
    OP_LONG = 7,        /* + name: a long feature */
    OP_BOOL = 8,        /* + name: a boolean feature, 0 or 1 */
    OP_ENUM = 9,        /* + table: a one-hot enum, the table holds each symbol's feature name */
    OP_CATEGORY = 10,   /* + name: a one-hot string; caches[name] maps a value to its feature */
    OP_OPTIONAL = 11,   /* a union [null, T]: T's instruction follows, skipped on null */
    OP_SKIP_BOOL = 20,
    OP_SKIP_VARINT = 21, /* int, long, enum */
    OP_SKIP_FLOAT = 22,
    OP_SKIP_DOUBLE = 23,
    OP_SKIP_BYTES = 24, /* bytes, string */
    OP_SKIP_NULL = 25,
    OP_INT_ID = 26,     /* the id: an int (32 bits) */
    OP_SKIP_STRING = 27, /* a string: skipped, but UTF-8 it must be (as the tree reads it) */
    OP_SKIP_INT = 28,    /* an int: skipped, within 32 bits */
    OP_SKIP_ENUM = 29,   /* + count: an enum's index, skipped, below count */
};

/* A category longer than this many characters is refused (mapping.MAX_CATEGORY_CHARS), and the
 * caches stop growing at CACHE_LIMIT entries a field (mapping's own cache is emptied then; here the
 * name is made again instead). */
#define MAX_CATEGORY 256
#define CACHE_LIMIT 4096

typedef struct {
    const unsigned char *data;
    Py_ssize_t pos, end;
} cursor;

/* Avro's zigzag long; -1 past the end, beyond ten bytes or beyond 64 bits. */
static int read_long(cursor *c, int64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    for (;;) {
        if (c->pos >= c->end) {
            return -1;
        }
        unsigned char byte = c->data[c->pos++];
        if (shift == 63 && (byte & 0x7e)) {
            return -1;
        }
        value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            break;
        }
        shift += 7;
        if (shift >= 64) {
            return -1;
        }
    }
    *out = (int64_t)((value >> 1) ^ (~(value & 1) + 1));
    return 0;
}

/* A length (bytes, string): -1 when negative or beyond what is left. */
static int read_length(cursor *c, Py_ssize_t *out) {
    int64_t length;
    if (read_long(c, &length) < 0 || length < 0 || length > (int64_t)(c->end - c->pos)) {
        return -1;
    }
    *out = (Py_ssize_t)length;
    return 0;
}

static int read_fixed(cursor *c, void *out, Py_ssize_t size) {
    if (c->end - c->pos < size) {
        return -1;
    }
    memcpy(out, c->data + c->pos, (size_t)size);
    c->pos += size;
    return 0;
}

/* Status of one instruction: OK, UNDECIDED (the general path decides), or ERROR (a Python
 * exception is set: a bug or no memory). */
#define OK 0
#define UNDECIDED 1
#define ERROR 2

static int set_item(PyObject *x, PyObject *name, PyObject *value) {
    if (value == NULL) {
        return ERROR;
    }
    int failed = PyDict_SetItem(x, name, value);
    Py_DECREF(value);
    return failed ? ERROR : OK;
}

/* Whether an instruction has a 2-byte index (a name's, a table's, or a count). */
static int takes_index(unsigned char op) {
    return (op >= OP_DOUBLE && op <= OP_CATEGORY) || op == OP_SKIP_ENUM;
}

static int run(cursor *c, const unsigned char *plan, Py_ssize_t *at, Py_ssize_t plan_size,
               PyObject *names, PyObject *tables, PyObject *caches, PyObject *x,
               PyObject **id, PyObject **label, long *indicators) {
    if (*at >= plan_size) {
        PyErr_SetString(PyExc_ValueError, "an Avro plan ends inside an instruction");
        return ERROR;
    }
    unsigned char op = plan[(*at)++];
    Py_ssize_t index = -1;
    if (takes_index(op)) {
        if (*at + 2 > plan_size) {
            PyErr_SetString(PyExc_ValueError, "an Avro plan's index is cut");
            return ERROR;
        }
        index = plan[*at] | (plan[*at + 1] << 8);
        *at += 2;
        PyObject *pool = op == OP_ENUM ? tables : names;
        if (op != OP_SKIP_ENUM && index >= PyTuple_GET_SIZE(pool)) {
            PyErr_SetString(PyExc_ValueError, "an Avro plan's index is out of range");
            return ERROR;
        }
    }
    int64_t integer;
    switch (op) {
    case OP_ID_STRING: {
        Py_ssize_t length;
        if (read_length(c, &length) < 0) {
            return UNDECIDED;
        }
        PyObject *text = PyUnicode_DecodeUTF8((const char *)c->data + c->pos, length, NULL);
        if (text == NULL) {
            PyErr_Clear();
            return UNDECIDED;
        }
        c->pos += length;
        Py_XSETREF(*id, text);
        return OK;
    }
    case OP_ID_LONG:
    case OP_INT_ID: {
        if (read_long(c, &integer) < 0) {
            return UNDECIDED;
        }
        if (op == OP_INT_ID && (integer < INT32_MIN || integer > INT32_MAX)) {
            return UNDECIDED;
        }
        PyObject *number = PyLong_FromLongLong(integer);
        if (number == NULL) {
            return ERROR;
        }
        Py_XSETREF(*id, number);
        return OK;
    }
    case OP_LABEL_BOOL:
    case OP_BOOL: {
        if (c->pos >= c->end || c->data[c->pos] > 1) {
            return UNDECIDED;
        }
        int value = c->data[c->pos++];
        if (op == OP_LABEL_BOOL) {
            PyObject *truth = value ? Py_True : Py_False;
            Py_INCREF(truth);
            Py_XSETREF(*label, truth);
            return OK;
        }
        return set_item(x, PyTuple_GET_ITEM(names, index), PyLong_FromLong(value));
    }
    case OP_DOUBLE: {
        double value;
        if (read_fixed(c, &value, 8) < 0 || !isfinite(value)) {
            return UNDECIDED;
        }
        return set_item(x, PyTuple_GET_ITEM(names, index), PyFloat_FromDouble(value));
    }
    case OP_FLOAT: {
        float value;
        if (read_fixed(c, &value, 4) < 0 || !isfinite(value)) {
            return UNDECIDED;
        }
        return set_item(x, PyTuple_GET_ITEM(names, index), PyFloat_FromDouble((double)value));
    }
    case OP_INT:
    case OP_LONG: {
        if (read_long(c, &integer) < 0) {
            return UNDECIDED;
        }
        if (op == OP_INT && (integer < INT32_MIN || integer > INT32_MAX)) {
            return UNDECIDED;
        }
        return set_item(x, PyTuple_GET_ITEM(names, index), PyLong_FromLongLong(integer));
    }
    case OP_ENUM: {
        PyObject *table = PyTuple_GET_ITEM(tables, index);
        if (!PyTuple_Check(table)) {
            PyErr_SetString(PyExc_ValueError, "an Avro plan's enum table is not a tuple");
            return ERROR;
        }
        if (read_long(c, &integer) < 0 || integer < 0 || integer >= PyTuple_GET_SIZE(table)) {
            return UNDECIDED;
        }
        Py_INCREF(Py_True);
        if (set_item(x, PyTuple_GET_ITEM(table, (Py_ssize_t)integer), Py_True) != OK) {
            return ERROR;
        }
        (*indicators)++;
        return OK;
    }
    case OP_CATEGORY: {
        Py_ssize_t length;
        if (read_length(c, &length) < 0) {
            return UNDECIDED;
        }
        PyObject *value = PyUnicode_DecodeUTF8((const char *)c->data + c->pos, length, NULL);
        if (value == NULL) {
            PyErr_Clear();
            return UNDECIDED;
        }
        c->pos += length;
        if (PyUnicode_GET_LENGTH(value) > MAX_CATEGORY) {
            Py_DECREF(value);
            return UNDECIDED;
        }
        if (index >= PyTuple_GET_SIZE(caches) || !PyDict_CheckExact(PyTuple_GET_ITEM(caches, index))) {
            Py_DECREF(value);
            PyErr_SetString(PyExc_ValueError, "an Avro plan's category cache is missing");
            return ERROR;
        }
        PyObject *cache = PyTuple_GET_ITEM(caches, index);
        PyObject *feature = PyDict_GetItemWithError(cache, value); /* borrowed */
        if (feature == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(value);
                return ERROR;
            }
            feature = PyUnicode_FromFormat("%U=%U", PyTuple_GET_ITEM(names, index), value);
            if (feature == NULL) {
                Py_DECREF(value);
                return ERROR;
            }
            if (PyDict_GET_SIZE(cache) < CACHE_LIMIT && PyDict_SetItem(cache, value, feature)) {
                Py_DECREF(value);
                Py_DECREF(feature);
                return ERROR;
            }
        } else {
            Py_INCREF(feature);
        }
        Py_DECREF(value);
        int failed = PyDict_SetItem(x, feature, Py_True);
        Py_DECREF(feature);
        if (failed) {
            return ERROR;
        }
        (*indicators)++;
        return OK;
    }
    case OP_OPTIONAL: {
        if (read_long(c, &integer) < 0 || (integer != 0 && integer != 1)) {
            return UNDECIDED;
        }
        if (integer == 1) {
            return run(c, plan, at, plan_size, names, tables, caches, x, id, label, indicators);
        }
        /* null: the next instruction is not run, but read past */
        if (*at >= plan_size) {
            PyErr_SetString(PyExc_ValueError, "an Avro plan's optional has no instruction");
            return ERROR;
        }
        unsigned char next = plan[(*at)++];
        if (takes_index(next)) {
            *at += 2;
        }
        if (next == OP_ID_STRING || next == OP_ID_LONG || next == OP_INT_ID) {
            Py_XSETREF(*id, Py_NewRef(Py_None));
        } else if (next == OP_LABEL_BOOL) {
            Py_XSETREF(*label, Py_NewRef(Py_None));
        }
        return OK;
    }
    case OP_SKIP_NULL:
        return OK;
    case OP_SKIP_BOOL:
        if (c->pos >= c->end || c->data[c->pos] > 1) {
            return UNDECIDED;
        }
        c->pos++;
        return OK;
    case OP_SKIP_VARINT:
        return read_long(c, &integer) < 0 ? UNDECIDED : OK;
    case OP_SKIP_INT:
        if (read_long(c, &integer) < 0 || integer < INT32_MIN || integer > INT32_MAX) {
            return UNDECIDED;
        }
        return OK;
    case OP_SKIP_ENUM:
        if (read_long(c, &integer) < 0 || integer < 0 || integer >= index) {
            return UNDECIDED;
        }
        return OK;
    case OP_SKIP_FLOAT:
    case OP_SKIP_DOUBLE: {
        Py_ssize_t size = op == OP_SKIP_FLOAT ? 4 : 8;
        if (c->end - c->pos < size) {
            return UNDECIDED;
        }
        c->pos += size;
        return OK;
    }
    case OP_SKIP_BYTES:
    case OP_SKIP_STRING: {
        Py_ssize_t length;
        if (read_length(c, &length) < 0) {
            return UNDECIDED;
        }
        if (op == OP_SKIP_STRING) {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)c->data + c->pos, length, NULL);
            if (text == NULL) {
                PyErr_Clear();
                return UNDECIDED;
            }
            Py_DECREF(text);
        }
        c->pos += length;
        return OK;
    }
    default:
        PyErr_Format(PyExc_ValueError, "an Avro plan's unknown opcode %d", (int)op);
        return ERROR;
    }
}

static PyObject *read_event(PyObject *self, PyObject *args) {
    Py_buffer value, plan;
    Py_ssize_t start;
    PyObject *names, *tables, *caches;
    if (!PyArg_ParseTuple(args, "y*ny*O!O!O!", &value, &start, &plan, &PyTuple_Type, &names,
                          &PyTuple_Type, &tables, &PyTuple_Type, &caches)) {
        return NULL;
    }
    PyObject *result = NULL, *id = Py_NewRef(Py_None), *label = Py_NewRef(Py_None);
    PyObject *x = PyDict_New();
    long indicators = 0;
    int status = OK;
    if (x == NULL) {
        status = ERROR;
    } else if (start < 0 || start > value.len) {
        status = UNDECIDED;
    } else {
        cursor c = {(const unsigned char *)value.buf, start, value.len};
        Py_ssize_t at = 0;
        while (status == OK && at < plan.len) {
            status = run(&c, (const unsigned char *)plan.buf, &at, plan.len, names, tables,
                         caches, x, &id, &label, &indicators);
        }
        if (status == OK && c.pos != c.end) {
            status = UNDECIDED; /* bytes after the value */
        }
    }
    if (status == OK) {
        result = Py_BuildValue("(OOOl)", id, x, label, indicators);
    } else if (status == UNDECIDED) {
        result = Py_NewRef(Py_None);
    }
    Py_XDECREF(x);
    Py_DECREF(id);
    Py_DECREF(label);
    PyBuffer_Release(&value);
    PyBuffer_Release(&plan);
    return result;
}


/* map_object(x, fields, prefix, at, excluded_at, names, onehot, depth) -> indicators or None
 *
 * `EventMapper._object` in C: the features of a decoded object's `fields` into `x`, named
 * `prefix` + key (nested objects flattened with dots), the keys in `excluded_at[at]` left out,
 * strings one-hot (`onehot`; else dropped) through the mapper's own cache of indicator names
 * (`names`: name -> value -> feature). Returns the indicators added, or None where the mapper
 * must decide (a value that is no feature, NaN, a number beyond float64, a long string, objects
 * nested beyond MAX_DEPTH): the caller then runs the mapper's Python on a fresh dict, which
 * words the dead letter. */
#define MAX_DEPTH 32
#define NAME_CACHE_LIMIT 4096

static PyObject *concat(PyObject *a, PyObject *b) {
    if (PyUnicode_GET_LENGTH(a) == 0) {
        return Py_NewRef(b);
    }
    return PyUnicode_Concat(a, b);
}

static int map_fields(PyObject *x, PyObject *fields, PyObject *prefix, PyObject *at,
                      PyObject *excluded_at, PyObject *names, int onehot, int depth,
                      long *indicators) {
    PyObject *skip = PyDict_GetItemWithError(excluded_at, at); /* borrowed, or NULL */
    if (skip == NULL && PyErr_Occurred()) {
        return ERROR;
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(fields, &position, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) {
            return UNDECIDED;
        }
        if (skip != NULL) {
            int skipped = PySet_Contains(skip, key);
            if (skipped < 0) {
                return ERROR;
            }
            if (skipped) {
                continue;
            }
        }
        if (value == Py_None) {
            continue;
        }
        PyTypeObject *kind = Py_TYPE(value);
        if (kind == &PyFloat_Type || kind == &PyLong_Type || kind == &PyBool_Type) {
            PyObject *number;
            if (kind == &PyFloat_Type) {
                if (!isfinite(PyFloat_AS_DOUBLE(value))) {
                    return UNDECIDED;
                }
                number = Py_NewRef(value);
            } else if (kind == &PyBool_Type) {
                number = PyLong_FromLong(value == Py_True);
            } else {
                double as_double = PyLong_AsDouble(value);
                if (as_double == -1.0 && PyErr_Occurred()) {
                    PyErr_Clear();
                    return UNDECIDED; /* beyond float64 */
                }
                if (fabs(as_double) >= DBL_MAX) {
                    return UNDECIDED; /* at the edge, rounded: the mapper compares exactly */
                }
                number = Py_NewRef(value);
            }
            if (number == NULL) {
                return ERROR;
            }
            PyObject *name = concat(prefix, key);
            if (name == NULL) {
                Py_DECREF(number);
                return ERROR;
            }
            int failed = PyDict_SetItem(x, name, number);
            Py_DECREF(name);
            Py_DECREF(number);
            if (failed) {
                return ERROR;
            }
        } else if (kind == &PyUnicode_Type) {
            if (!onehot) {
                continue;
            }
            if (PyUnicode_GET_LENGTH(value) > MAX_CATEGORY) {
                return UNDECIDED;
            }
            PyObject *name = concat(prefix, key);
            if (name == NULL) {
                return ERROR;
            }
            PyObject *cache = PyDict_GetItemWithError(names, name); /* borrowed */
            if (cache == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(name);
                    return ERROR;
                }
                cache = PyDict_New();
                if (cache == NULL || PyDict_SetItem(names, name, cache)) {
                    Py_XDECREF(cache);
                    Py_DECREF(name);
                    return ERROR;
                }
                Py_DECREF(cache); /* (names holds it) */
            } else if (!PyDict_CheckExact(cache)) {
                Py_DECREF(name);
                PyErr_SetString(PyExc_ValueError, "the mapper's name cache holds a non-dict");
                return ERROR;
            }
            PyObject *feature = PyDict_GetItemWithError(cache, value); /* borrowed */
            if (feature == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(name);
                    return ERROR;
                }
                feature = PyUnicode_FromFormat("%U=%U", name, value);
                if (feature == NULL) {
                    Py_DECREF(name);
                    return ERROR;
                }
                if (PyDict_GET_SIZE(cache) < NAME_CACHE_LIMIT
                        && PyDict_SetItem(cache, value, feature)) {
                    Py_DECREF(feature);
                    Py_DECREF(name);
                    return ERROR;
                }
            } else {
                Py_INCREF(feature);
            }
            Py_DECREF(name);
            int failed = PyDict_SetItem(x, feature, Py_True);
            Py_DECREF(feature);
            if (failed) {
                return ERROR;
            }
            (*indicators)++;
        } else if (kind == &PyDict_Type) {
            if (depth >= MAX_DEPTH) {
                return UNDECIDED;
            }
            PyObject *inner_prefix = PyUnicode_FromFormat("%U%U.", prefix, key);
            PyObject *inner_at = PyUnicode_FromFormat("%U%U.", at, key);
            if (inner_prefix == NULL || inner_at == NULL) {
                Py_XDECREF(inner_prefix);
                Py_XDECREF(inner_at);
                return ERROR;
            }
            int status = map_fields(x, value, inner_prefix, inner_at, excluded_at, names, onehot,
                                    depth + 1, indicators);
            Py_DECREF(inner_prefix);
            Py_DECREF(inner_at);
            if (status != OK) {
                return status;
            }
        } else {
            return UNDECIDED; /* an array, bytes: the mapper words the dead letter */
        }
    }
    return OK;
}

static PyObject *map_object(PyObject *self, PyObject *args) {
    PyObject *x, *fields, *prefix, *at, *excluded_at, *names;
    int onehot, depth;
    if (!PyArg_ParseTuple(args, "O!O!UUO!O!pi", &PyDict_Type, &x, &PyDict_Type, &fields, &prefix,
                          &at, &PyDict_Type, &excluded_at, &PyDict_Type, &names, &onehot,
                          &depth)) {
        return NULL;
    }
    long indicators = 0;
    int status = map_fields(x, fields, prefix, at, excluded_at, names, onehot, depth,
                            &indicators);
    if (status == ERROR) {
        return NULL;
    }
    if (status == UNDECIDED) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(indicators);
}

/* split_indicators(x) -> (numbers, indicators): `mapping.split_indicators` in C (the features
 * of value True apart: `--scale` passes them to the model unscaled). */
static PyObject *split_indicators(PyObject *self, PyObject *x) {
    if (!PyDict_CheckExact(x)) {
        PyErr_SetString(PyExc_TypeError, "split_indicators takes a dict");
        return NULL;
    }
    PyObject *numbers = PyDict_New(), *indicators = PyDict_New();
    if (numbers == NULL || indicators == NULL) {
        Py_XDECREF(numbers);
        Py_XDECREF(indicators);
        return NULL;
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(x, &position, &key, &value)) {
        if (PyDict_SetItem(value == Py_True ? indicators : numbers, key, value)) {
            Py_DECREF(numbers);
            Py_DECREF(indicators);
            return NULL;
        }
    }
    PyObject *result = PyTuple_Pack(2, numbers, indicators);
    Py_DECREF(numbers);
    Py_DECREF(indicators);
    return result;
}

static PyMethodDef methods[] = {
    {"split_indicators", split_indicators, METH_O,
     "split_indicators(x) -> (numbers, indicators) (see events.c)"},
    {"read_event", read_event, METH_VARARGS,
     "read_event(value, start, plan, names, tables, caches) -> (id, x, label, indicators) or "
     "None (see events.c)"},
    {"map_object", map_object, METH_VARARGS,
     "map_object(x, fields, prefix, at, excluded_at, names, onehot, depth) -> indicators or None "
     "(see events.c)"},
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
    PyModuleDef_HEAD_INIT, NAME_TEXT(MODULE), "records' events (see events.c)",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC INIT_FUNCTION(MODULE)(void) {
    return PyModule_Create(&definition);
}
