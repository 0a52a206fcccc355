/* A batch of records read into arrays, in one call: the Kafka worker's batch path
 * (connectors/task/batch.py, connectors/serializers/batches.py). JSON (`read_json`) and Avro
 * behind a Schema Registry (`read_avro`).
 *
 * A record's *skeleton* is the record with its numbers taken out. A JSON record's: its objects,
 * arrays, keys, strings, booleans and nulls as written, without whitespace, a number as `#`. An
 * Avro record's: its frame (the schema id), then what its plan (connectors/serializers/
 * avro_events.py) reads of it but its numbers: a union's branch, a boolean, an enum's index, a
 * category's string. Records of one skeleton give events of one shape: the same feature names
 * in the same order, the same category indicators and booleans, values that differ only by
 * their numbers. So the worker decodes the first record of a skeleton through its codec (the
 * reference, connectors/serializers/mapping.py), learns from it which number is which feature
 * (batches.py), and reads the later ones here: the skeleton is compared with the known ones, the
 * numbers go to an array.
 *
 * The id and the label are not part of the skeleton (`@` and `$`: their values are read, not
 * compared), nor are the fields the mapping does not read (JSON's `~`: validated as JSON, then
 * skipped; Avro's skipped fields: checked as the plan checks them).
 *
 * What this reads is a strict subset of what the codec reads, and it reads it the same way.
 * JSON: RFC 8259 JSON as UTF-8, strings without escapes, numbers converted to the nearest
 * float64 as Python's and msgspec's parsers do (correctly rounded; an integer as its value),
 * nothing deeper than MAX_DEPTH. Avro: what `events.c` reads with the same plan, with the same
 * checks (a finite double or float, an int within 32 bits, an enum's index within its symbols,
 * UTF-8 strings, a category of at most MAX_CATEGORY characters, nothing after the record), and
 * a string id that needs no escape in JSON. Anything else (an escape, a number beyond float64,
 * invalid UTF-8, bad JSON, a field twice, a value too large, a payload that does not decode) is
 * *undecided*: the record takes the per-record path, which decides and words any dead letter. A
 * record is untrusted: every read is checked against the end of its bytes, nothing is allocated
 * for what a record claims.
 *
 * Built by `streammargin.jit.aot` (`streammargin warmup`) beside the package's other compiled
 * modules, under the same stamp; without it every record takes the per-record path.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A record's status (`read_json`'s `status` array). */
#define ROW 0        /* read into a row */
#define UNDECIDED 1  /* the per-record path decides */
#define NEW_SHAPE 2  /* well formed, of a skeleton not known yet (the caller may learn it) */
#define REFUSED 3    /* of a skeleton whose records take the per-record path */
#define NEW_LABEL 4  /* of a known skeleton, its label's text not known yet */
#define FULL 5       /* not read: the arrays are full (call again from it) */

/* Markers of the skeleton. */
#define HOLE '#'
#define ID_SLOT '@'
#define LABEL_SLOT '$'
#define SKIPPED '~'
#define ANY_STRING '"'

#define MAX_DEPTH 64
/* The most bytes of a number's text converted by strtod (a longer one is undecided). */
#define MAX_NUMBER 400

typedef struct {
    const unsigned char *data;
    Py_ssize_t pos, end;
} cursor;

typedef struct {
    unsigned char *data;
    Py_ssize_t size, capacity;
} buffer;

static int put(buffer *b, const void *bytes, Py_ssize_t n) {
    if (b->size + n > b->capacity) {
        Py_ssize_t capacity = b->capacity ? b->capacity : 256;
        while (capacity < b->size + n) {
            capacity *= 2;
        }
        unsigned char *grown = PyMem_Realloc(b->data, (size_t)capacity);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->capacity = capacity;
    }
    memcpy(b->data + b->size, bytes, (size_t)n);
    b->size += n;
    return 0;
}

static int put_byte(buffer *b, unsigned char c) { return put(b, &c, 1); }

/* Status of a parse step: OK, UNDECIDED (the record takes the per-record path) or ERROR (a
 * Python exception is set: no memory). */
#define OK 0
#define NO 1
#define ERROR 2

static void skip_space(cursor *c) {
    while (c->pos < c->end) {
        unsigned char b = c->data[c->pos];
        if (b != ' ' && b != '\t' && b != '\n' && b != '\r') {
            return;
        }
        c->pos++;
    }
}

/* The length of a valid UTF-8 sequence at p (at most `left` bytes), or 0. */
static int utf8_length(const unsigned char *p, Py_ssize_t left) {
    unsigned char b = p[0];
    if (b < 0x80) {
        return 1;
    }
    if (b >= 0xC2 && b <= 0xDF) {
        return left >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    }
    if (b >= 0xE0 && b <= 0xEF) {
        if (left < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) {
            return 0;
        }
        if (b == 0xE0 && p[1] < 0xA0) {
            return 0; /* overlong */
        }
        if (b == 0xED && p[1] >= 0xA0) {
            return 0; /* a surrogate */
        }
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (left < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
            (p[3] & 0xC0) != 0x80) {
            return 0;
        }
        if ((b == 0xF0 && p[1] < 0x90) || (b == 0xF4 && p[1] >= 0x90)) {
            return 0; /* overlong, or beyond U+10FFFF */
        }
        return 4;
    }
    return 0;
}

/* A string at c (its opening quote): its contents' span, which holds no escape, no control
 * character and valid UTF-8 only; NO otherwise. */
static int read_string(cursor *c, Py_ssize_t *start, Py_ssize_t *length) {
    if (c->pos >= c->end || c->data[c->pos] != '"') {
        return NO;
    }
    Py_ssize_t at = c->pos + 1;
    *start = at;
    while (at < c->end) {
        unsigned char b = c->data[at];
        if (b == '"') {
            *length = at - *start;
            c->pos = at + 1;
            return OK;
        }
        if (b < 0x20 || b == '\\') {
            return NO;
        }
        if (b < 0x80) {
            at++;
            continue;
        }
        int n = utf8_length(c->data + at, c->end - at);
        if (n == 0) {
            return NO;
        }
        at += n;
    }
    return NO;
}

#if LDBL_MANT_DIG == 64 && defined(__x86_64__)
/* 10^0 ... 10^27, exact in x87's 64-bit significand (5^27 < 2^64). */
static const long double LONG_POWERS[] = {
    1e0L, 1e1L, 1e2L, 1e3L, 1e4L, 1e5L, 1e6L, 1e7L, 1e8L, 1e9L, 1e10L, 1e11L, 1e12L, 1e13L,
    1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L,
    1e27L};
#endif

static const double POWERS[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21,
                                 1e22};

/* A number at c, converted as Python converts its JSON (an integer: the nearest float64 to its
 * value, 0.0 for -0; a fraction or an exponent: correctly rounded); NO for text that is not a
 * JSON number, or whose value is not finite. */
static int read_number(cursor *c, double *value) {
    const unsigned char *d = c->data;
    Py_ssize_t at = c->pos, end = c->end, start = c->pos;
    int negative = 0, integer = 1;
    if (at < end && d[at] == '-') {
        negative = 1;
        at++;
    }
    if (at >= end) {
        return NO;
    }
    uint64_t mantissa = 0;
    int digits = 0;    /* significant digits in mantissa */
    int dropped = 0;   /* integer digits beyond 19 */
    int exponent = 0;  /* of the mantissa's last digit */
    if (d[at] == '0') {
        at++;
    } else if (d[at] >= '1' && d[at] <= '9') {
        while (at < end && d[at] >= '0' && d[at] <= '9') {
            if (digits < 19) {
                mantissa = mantissa * 10 + (uint64_t)(d[at] - '0');
                digits++;
            } else {
                dropped++;
            }
            at++;
        }
    } else {
        return NO;
    }
    exponent = dropped;
    if (at < end && d[at] == '.') {
        integer = 0;
        at++;
        if (at >= end || d[at] < '0' || d[at] > '9') {
            return NO;
        }
        while (at < end && d[at] >= '0' && d[at] <= '9') {
            if (digits < 19 && !(digits == 0 && d[at] == '0')) {
                mantissa = mantissa * 10 + (uint64_t)(d[at] - '0');
                digits++;
                exponent--;
            } else if (digits == 0) {
                exponent--; /* a leading zero of the fraction */
            } else {
                dropped++;
            }
            at++;
        }
    }
    if (at < end && (d[at] == 'e' || d[at] == 'E')) {
        integer = 0;
        at++;
        int sign = 1;
        if (at < end && (d[at] == '+' || d[at] == '-')) {
            sign = d[at] == '-' ? -1 : 1;
            at++;
        }
        if (at >= end || d[at] < '0' || d[at] > '9') {
            return NO;
        }
        int e = 0;
        while (at < end && d[at] >= '0' && d[at] <= '9') {
            if (e < 100000) {
                e = e * 10 + (d[at] - '0');
            }
            at++;
        }
        exponent += sign * e;
    }
    c->pos = at;
    if (integer && digits <= 18 && dropped == 0) { /* exact in int64: converted once */
        *value = (double)(int64_t)mantissa;
        if (negative && mantissa != 0) { /* (-0 is the integer 0) */
            *value = -*value;
        }
        return OK;
    }
    if (!integer && dropped == 0 && mantissa <= (1ULL << 53) && exponent >= -22 &&
        exponent <= 22) {
        /* Clinger's fast path: both exact, one correctly rounded operation. */
        double m = (double)mantissa;
        *value = exponent < 0 ? m / POWERS[-exponent] : m * POWERS[exponent];
        if (negative) {
            *value = -*value;
        }
        return OK;
    }
#if LDBL_MANT_DIG == 64 && defined(__x86_64__)
    if (dropped == 0 && mantissa != 0 && exponent >= -27 && exponent <= 27) {
        /* The same in x87's 64-bit significand, for the 17-19 digits of a float's repr: the
         * significand and 10^|e| are exact there, the one operation correctly rounded to 64
         * bits, then to 53. Rounding twice is the nearest double unless the 64-bit result is
         * within an ulp of halfway between two doubles (its 11 low bits 0x3ff-0x401): those
         * (3 in 2048) and subnormal results take strtod below. */
        long double m = (long double)mantissa;
        long double r = exponent < 0 ? m / LONG_POWERS[-exponent] : m * LONG_POWERS[exponent];
        uint64_t significand;
        memcpy(&significand, &r, sizeof significand); /* (x87: the low 8 bytes) */
        unsigned extra = (unsigned)(significand & 0x7ff);
        if ((extra < 0x3ff || extra > 0x401) && r >= (long double)DBL_MIN &&
            r <= (long double)DBL_MAX) {
            *value = (double)r;
            if (negative) {
                *value = -*value;
            }
            return OK;
        }
    }
#endif
    Py_ssize_t length = at - start;
    if (length > MAX_NUMBER) {
        return NO;
    }
    char text[MAX_NUMBER + 1];
    memcpy(text, d + start, (size_t)length);
    text[length] = '\0';
    errno = 0;
    char *stop;
    double parsed = strtod(text, &stop); /* glibc: correctly rounded */
    if (stop != text + length || !isfinite(parsed)) {
        return NO;
    }
    if (integer && parsed == 0.0) {
        parsed = 0.0; /* -0 is the integer 0 */
    }
    *value = parsed;
    return OK;
}

static int literal(cursor *c, const char *word, Py_ssize_t n) {
    if (c->end - c->pos < n || memcmp(c->data + c->pos, word, (size_t)n) != 0) {
        return NO;
    }
    c->pos += n;
    return OK;
}

/* Only validate the JSON value at c (a field the mapping does not read). */
static int skip_value(cursor *c, int depth) {
    if (depth > MAX_DEPTH || c->pos >= c->end) {
        return NO;
    }
    unsigned char b = c->data[c->pos];
    Py_ssize_t start, length;
    double number;
    switch (b) {
    case '"':
        return read_string(c, &start, &length);
    case 't':
        return literal(c, "true", 4);
    case 'f':
        return literal(c, "false", 5);
    case 'n':
        return literal(c, "null", 4);
    case '{':
    case '[': {
        unsigned char close = b == '{' ? '}' : ']';
        c->pos++;
        skip_space(c);
        if (c->pos < c->end && c->data[c->pos] == close) {
            c->pos++;
            return OK;
        }
        for (;;) {
            if (b == '{') {
                if (read_string(c, &start, &length) != OK) {
                    return NO;
                }
                skip_space(c);
                if (c->pos >= c->end || c->data[c->pos] != ':') {
                    return NO;
                }
                c->pos++;
                skip_space(c);
            }
            int status = skip_value(c, depth + 1);
            if (status != OK) {
                return status;
            }
            skip_space(c);
            if (c->pos >= c->end) {
                return NO;
            }
            if (c->data[c->pos] == close) {
                c->pos++;
                return OK;
            }
            if (c->data[c->pos] != ',') {
                return NO;
            }
            c->pos++;
            skip_space(c);
        }
    }
    default:
        return read_number(c, &number);
    }
}

typedef struct {
    buffer skeleton;
    double *holes;
    Py_ssize_t n_holes, holes_capacity;
    int strings_matter; /* strings are categories (one-hot, hashed) or dropped */
} reading;

static int add_hole(reading *r, double value) {
    if (r->n_holes >= r->holes_capacity) {
        return NO; /* (the caller made room for what a record of its length can hold) */
    }
    r->holes[r->n_holes++] = value;
    return OK;
}

/* A value of the record's features (or any part of it the mapping reads) into the skeleton. */
static int read_value(cursor *c, reading *r, int depth) {
    if (depth > MAX_DEPTH || c->pos >= c->end) {
        return NO;
    }
    unsigned char b = c->data[c->pos];
    Py_ssize_t start, length;
    switch (b) {
    case '"':
        if (read_string(c, &start, &length) != OK) {
            return NO;
        }
        if (!r->strings_matter) {
            return put_byte(&r->skeleton, ANY_STRING) ? ERROR : OK;
        }
        return put(&r->skeleton, c->data + start - 1, length + 2) ? ERROR : OK;
    case 't':
        return literal(c, "true", 4) == OK ? (put(&r->skeleton, "true", 4) ? ERROR : OK) : NO;
    case 'f':
        return literal(c, "false", 5) == OK ? (put(&r->skeleton, "false", 5) ? ERROR : OK) : NO;
    case 'n':
        return literal(c, "null", 4) == OK ? (put(&r->skeleton, "null", 4) ? ERROR : OK) : NO;
    case '{':
    case '[': {
        unsigned char close = b == '{' ? '}' : ']';
        if (put_byte(&r->skeleton, b)) {
            return ERROR;
        }
        c->pos++;
        skip_space(c);
        if (c->pos < c->end && c->data[c->pos] == close) {
            c->pos++;
            return put_byte(&r->skeleton, close) ? ERROR : OK;
        }
        for (;;) {
            if (b == '{') {
                if (read_string(c, &start, &length) != OK) {
                    return NO;
                }
                if (put(&r->skeleton, c->data + start - 1, length + 2) ||
                    put_byte(&r->skeleton, ':')) {
                    return ERROR;
                }
                skip_space(c);
                if (c->pos >= c->end || c->data[c->pos] != ':') {
                    return NO;
                }
                c->pos++;
                skip_space(c);
            }
            int status = read_value(c, r, depth + 1);
            if (status != OK) {
                return status;
            }
            skip_space(c);
            if (c->pos >= c->end) {
                return NO;
            }
            if (c->data[c->pos] == close) {
                c->pos++;
                return put_byte(&r->skeleton, close) ? ERROR : OK;
            }
            if (c->data[c->pos] != ',') {
                return NO;
            }
            if (put_byte(&r->skeleton, ',')) {
                return ERROR;
            }
            c->pos++;
            skip_space(c);
        }
    }
    default: {
        double value;
        if (read_number(c, &value) != OK) {
            return NO;
        }
        if (add_hole(r, value) != OK) {
            return NO;
        }
        return put_byte(&r->skeleton, HOLE) ? ERROR : OK;
    }
    }
}

/* The mapping's top-level fields, from Python: the id's and the label's names, and which
 * fields are read (`keep`, a tuple of names; None: every field but those of `skip`). */
typedef struct {
    const char *id;
    Py_ssize_t id_length;
    const char *label;
    Py_ssize_t label_length;
    PyObject *keep, *skip; /* tuples of bytes, or None */
} fields;

static int named(const unsigned char *key, Py_ssize_t n, PyObject *names) {
    if (names == Py_None) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (PyBytes_GET_SIZE(name) == n && memcmp(PyBytes_AS_STRING(name), key, (size_t)n) == 0) {
            return 1;
        }
    }
    return 0;
}

/* A record's id and label, as read. */
#define ID_NULL 0    /* absent or null */
#define ID_JSON 1    /* its JSON text (a JSON record's string with its quotes, or integer) */
#define ID_STRING 2  /* a string's UTF-8, which needs no escape in JSON (quoted when written) */
#define ID_INTEGER 3 /* an integer (`id_integer`) */

typedef struct {
    const unsigned char *id; /* ID_JSON, ID_STRING: the text */
    Py_ssize_t id_length;
    int id_kind;
    int64_t id_integer;
    const unsigned char *label; /* the label's JSON text (NULL: absent) */
    Py_ssize_t label_length;
} slots;

/* One record's JSON: its skeleton in r->skeleton, its numbers in r->holes, its id and label in
 * s; NO if this cannot read it. */
static int read_record(const unsigned char *data, Py_ssize_t size, const fields *f, reading *r,
                       slots *s) {
    cursor c = {data, 0, size};
    s->id = s->label = NULL;
    s->id_length = s->label_length = 0;
    s->id_kind = ID_NULL;
    r->skeleton.size = 0;
    skip_space(&c);
    if (c.pos >= c.end || c.data[c.pos] != '{') {
        return NO;
    }
    if (put_byte(&r->skeleton, '{')) {
        return ERROR;
    }
    c.pos++;
    skip_space(&c);
    int first = 1;
    if (c.pos < c.end && c.data[c.pos] == '}') {
        c.pos++;
        first = -1; /* empty */
    }
    while (first >= 0) {
        Py_ssize_t start, length;
        if (read_string(&c, &start, &length) != OK) {
            return NO;
        }
        if (!first && put_byte(&r->skeleton, ',')) {
            return ERROR;
        }
        first = 0;
        if (put(&r->skeleton, data + start - 1, length + 2) || put_byte(&r->skeleton, ':')) {
            return ERROR;
        }
        skip_space(&c);
        if (c.pos >= c.end || c.data[c.pos] != ':') {
            return NO;
        }
        c.pos++;
        skip_space(&c);
        const unsigned char *key = data + start;
        int status;
        if (length == f->id_length && memcmp(key, f->id, (size_t)length) == 0) {
            if (s->id != NULL || s->id_kind < 0) {
                return NO; /* twice */
            }
            Py_ssize_t at = c.pos;
            if (c.pos < c.end && c.data[c.pos] == '"') {
                Py_ssize_t value_start, value_length;
                if (read_string(&c, &value_start, &value_length) != OK) {
                    return NO;
                }
                s->id_kind = ID_JSON;
            } else if (literal(&c, "null", 4) == OK) {
                s->id_kind = -1; /* (seen: null) */
            } else {
                double ignored;
                if (c.pos >= c.end || (c.data[c.pos] != '-' && (c.data[c.pos] < '0' ||
                                                                 c.data[c.pos] > '9'))) {
                    return NO;
                }
                if (read_number(&c, &ignored) != OK) {
                    return NO;
                }
                for (Py_ssize_t i = at; i < c.pos; i++) {
                    if (c.data[i] == '.' || c.data[i] == 'e' || c.data[i] == 'E') {
                        return NO; /* not an integer: the mapping refuses it */
                    }
                }
                if (c.pos - at == 2 && c.data[at] == '-' && c.data[at + 1] == '0') {
                    return NO; /* -0: its JSON would be 0 */
                }
                s->id_kind = ID_JSON;
            }
            s->id = data + at;
            s->id_length = c.pos - at;
            status = put_byte(&r->skeleton, ID_SLOT) ? ERROR : OK;
        } else if (length == f->label_length && memcmp(key, f->label, (size_t)length) == 0) {
            if (s->label != NULL) {
                return NO;
            }
            Py_ssize_t at = c.pos;
            status = skip_value(&c, 1);
            if (status != OK) {
                return status;
            }
            if (c.data[at] == '{' || c.data[at] == '[') {
                return NO; /* not a label */
            }
            s->label = data + at;
            s->label_length = c.pos - at;
            status = put_byte(&r->skeleton, LABEL_SLOT) ? ERROR : OK;
        } else if ((f->keep != Py_None && !named(key, length, f->keep)) ||
                   named(key, length, f->skip)) {
            status = skip_value(&c, 1);
            if (status == OK) {
                status = put_byte(&r->skeleton, SKIPPED) ? ERROR : OK;
            }
        } else {
            status = read_value(&c, r, 1);
        }
        if (status != OK) {
            return status;
        }
        skip_space(&c);
        if (c.pos >= c.end) {
            return NO;
        }
        if (c.data[c.pos] == '}') {
            c.pos++;
            break;
        }
        if (c.data[c.pos] != ',') {
            return NO;
        }
        c.pos++;
        skip_space(&c);
    }
    if (s->id_kind < 0) {
        s->id_kind = ID_NULL;
        s->id = NULL;
    }
    skip_space(&c);
    if (c.pos != c.end) {
        return NO;
    }
    return put_byte(&r->skeleton, '}') ? ERROR : OK;
}

static int read_fields(PyObject *config, fields *f, int *strings_matter,
                       Py_ssize_t *max_record_bytes) {
    PyObject *id, *label, *keep, *skip;
    if (!PyArg_ParseTuple(config, "SSOOpn", &id, &label, &keep, &skip, strings_matter,
                          max_record_bytes)) {
        return -1;
    }
    if ((keep != Py_None && !PyTuple_Check(keep)) || (skip != Py_None && !PyTuple_Check(skip))) {
        PyErr_SetString(PyExc_TypeError, "keep and skip must be tuples of bytes or None");
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *names = k ? skip : keep;
        if (names == Py_None) {
            continue;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
            if (!PyBytes_Check(PyTuple_GET_ITEM(names, i))) {
                PyErr_SetString(PyExc_TypeError, "keep and skip must be tuples of bytes");
                return -1;
            }
        }
    }
    f->id = PyBytes_AS_STRING(id);
    f->id_length = PyBytes_GET_SIZE(id);
    f->label = PyBytes_AS_STRING(label);
    f->label_length = PyBytes_GET_SIZE(label);
    f->keep = keep;
    f->skip = skip;
    return 0;
}

/* The code of a label's text in `labels` (a tuple of (bytes, code)); absent: `absent`;
 * -3 when the text is not there. */
static long label_code(const slots *s, PyObject *labels, long absent) {
    if (s->label == NULL) {
        return absent;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(labels); i++) {
        PyObject *pair = PyTuple_GET_ITEM(labels, i);
        PyObject *text = PyTuple_GET_ITEM(pair, 0);
        if (PyBytes_GET_SIZE(text) == s->label_length &&
            memcmp(PyBytes_AS_STRING(text), s->label, (size_t)s->label_length) == 0) {
            return PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
        }
    }
    return -3;
}

/* The most bytes an id's JSON takes beyond its record's size (quotes, or a long's digits). */
#define ID_ROOM 24

/* The JSON of a record's id into `out` (room for its record's size + ID_ROOM bytes); its
 * length. */
static Py_ssize_t put_id(unsigned char *out, const slots *s) {
    switch (s->id_kind) {
    case ID_JSON:
        memcpy(out, s->id, (size_t)s->id_length);
        return s->id_length;
    case ID_STRING:
        out[0] = '"';
        memcpy(out + 1, s->id, (size_t)s->id_length);
        out[s->id_length + 1] = '"';
        return s->id_length + 2;
    case ID_INTEGER: {
        char digits[ID_ROOM];
        int n = snprintf(digits, sizeof digits, "%lld", (long long)s->id_integer);
        memcpy(out, digits, (size_t)n);
        return n;
    }
    default:
        memcpy(out, "null", 4);
        return 4;
    }
}

static int check_labels(PyObject *labels) {
    if (!PyTuple_Check(labels)) {
        PyErr_SetString(PyExc_TypeError, "labels must be a tuple of (bytes, int)");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(labels); i++) {
        PyObject *pair = PyTuple_GET_ITEM(labels, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(pair, 0)) || !PyLong_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "labels must be a tuple of (bytes, int)");
            return -1;
        }
    }
    return 0;
}

/* A writable C-contiguous buffer of `itemsize` items, at least `count` of them. */
static int writable(PyObject *object, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t count,
                    const char *name) {
    if (PyObject_GetBuffer(object, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->itemsize != itemsize && !(itemsize == 1 && view->itemsize == 1)) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    if (view->len / itemsize < count) {
        PyErr_Format(PyExc_ValueError, "%s: room for %zd items expected", name, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* A format's reader of one record: OK (its skeleton in r->skeleton, its numbers added to
 * r->holes, its id and label in s), NO (undecided), ERROR, or (Avro) UNPLANNED: a schema
 * without a plan yet (the caller may learn it), PLANLESS: a schema whose records take the
 * per-record path. */
#define UNPLANNED 3
#define PLANLESS 4
typedef int (*record_reader)(const unsigned char *data, Py_ssize_t size, void *format,
                             reading *r, slots *s);

static int json_record(const unsigned char *data, Py_ssize_t size, void *format, reading *r,
                       slots *s) {
    return read_record(data, size, (const fields *)format, r, s);
}

/* The loop of `read_json` and `read_avro` (see `read_json`), after their config. */
static PyObject *read_batch(PyObject *args, record_reader read_one, void *format, reading *r,
                            Py_ssize_t max_record_bytes) {
    PyObject *records, *config, *skeletons, *labels;
    PyObject *status_object, *rows_object, *holes_object, *ids_object, *id_ends_object;
    PyObject *type_object;
    Py_ssize_t start, end, value_at;
    long absent;
    if (!PyArg_ParseTuple(args, "O!nnO!O!O!lOOOOOOn", &PyList_Type, &records, &start, &end,
                          &PyTuple_Type, &config, &PyDict_Type, &skeletons, &PyTuple_Type,
                          &labels, &absent, &status_object, &rows_object, &holes_object,
                          &ids_object, &id_ends_object, &type_object, &value_at)) {
        return NULL;
    }
    /* The records' type where they are named tuples, whose value is the field `value_at`. */
    PyTypeObject *record_type = NULL;
    if (type_object != Py_None && PyType_Check(type_object) && value_at >= 0 &&
        PyType_IsSubtype((PyTypeObject *)type_object, &PyTuple_Type)) {
        record_type = (PyTypeObject *)type_object;
    }
    if (check_labels(labels) < 0) {
        return NULL;
    }
    if (start < 0 || end > PyList_GET_SIZE(records) || start > end) {
        PyErr_SetString(PyExc_ValueError, "read: start and end outside the records");
        return NULL;
    }
    Py_ssize_t n = end - start;
    Py_buffer status_view, rows_view, holes_view, ids_view, id_ends_view;
    if (writable(status_object, &status_view, 1, n, "status") < 0) {
        return NULL;
    }
    if (writable(rows_object, &rows_view, 8, 3 * n, "rows") < 0) {
        PyBuffer_Release(&status_view);
        return NULL;
    }
    if (writable(holes_object, &holes_view, 8, 0, "holes") < 0) {
        PyBuffer_Release(&status_view);
        PyBuffer_Release(&rows_view);
        return NULL;
    }
    if (writable(ids_object, &ids_view, 1, 0, "ids") < 0) {
        PyBuffer_Release(&status_view);
        PyBuffer_Release(&rows_view);
        PyBuffer_Release(&holes_view);
        return NULL;
    }
    if (writable(id_ends_object, &id_ends_view, 8, n, "id_ends") < 0) {
        PyBuffer_Release(&status_view);
        PyBuffer_Release(&rows_view);
        PyBuffer_Release(&holes_view);
        PyBuffer_Release(&ids_view);
        return NULL;
    }
    int8_t *status = status_view.buf;
    int64_t *rows = rows_view.buf;
    int64_t *id_ends = id_ends_view.buf;
    unsigned char *ids = ids_view.buf;
    Py_ssize_t ids_capacity = ids_view.len, ids_used = 0;
    r->holes = holes_view.buf;
    Py_ssize_t holes_capacity = holes_view.len / 8;
    PyObject *value_name = PyUnicode_InternFromString("value");
    PyObject *result = NULL;
    PyObject *last_skeleton = NULL; /* the last record's skeleton, and its shape */
    long last_shape = -1;
    Py_ssize_t i = 0;
    if (value_name == NULL) {
        goto done;
    }
    for (; i < n; i++) {
        PyObject *record = PyList_GET_ITEM(records, start + i);
        PyObject *value;
        if (PyBytes_CheckExact(record)) {
            value = Py_NewRef(record); /* (a record's value itself: a server's request) */
        } else if (Py_TYPE(record) == record_type && value_at < PyTuple_GET_SIZE(record)) {
            value = Py_NewRef(PyTuple_GET_ITEM(record, value_at)); /* (a named tuple's field) */
        } else {
            value = PyObject_GetAttr(record, value_name);
        }
        if (value == NULL) {
            goto done;
        }
        if (!PyBytes_Check(value) || PyBytes_GET_SIZE(value) > max_record_bytes) {
            Py_DECREF(value);
            status[i] = UNDECIDED;
            id_ends[i] = ids_used;
            continue;
        }
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(value);
        Py_ssize_t size = PyBytes_GET_SIZE(value);
        /* A record of `size` bytes holds at most size + 1 numbers (JSON: size / 2 + 1; Avro: a
         * byte a number at least) and an id of size + ID_ROOM bytes. */
        if (holes_capacity - r->n_holes < size + 1 || ids_capacity - ids_used < size + ID_ROOM) {
            Py_DECREF(value);
            for (Py_ssize_t k = i; k < n; k++) {
                status[k] = FULL;
            }
            break;
        }
        Py_ssize_t first_hole = r->n_holes;
        r->holes_capacity = holes_capacity;
        slots s;
        int read = read_one(data, size, format, r, &s);
        if (read == ERROR) {
            Py_DECREF(value);
            goto done;
        }
        id_ends[i] = ids_used;
        if (read != OK) {
            r->n_holes = first_hole;
            status[i] = read == UNPLANNED ? NEW_SHAPE : read == PLANLESS ? REFUSED : UNDECIDED;
            Py_DECREF(value);
            continue;
        }
        long shape;
        if (last_skeleton != NULL && PyBytes_GET_SIZE(last_skeleton) == r->skeleton.size &&
            memcmp(PyBytes_AS_STRING(last_skeleton), r->skeleton.data,
                   (size_t)r->skeleton.size) == 0) {
            shape = last_shape;
        } else {
            PyObject *key = PyBytes_FromStringAndSize((const char *)r->skeleton.data,
                                                      r->skeleton.size);
            if (key == NULL) {
                Py_DECREF(value);
                goto done;
            }
            PyObject *found = PyDict_GetItemWithError(skeletons, key); /* borrowed */
            if (found == NULL && PyErr_Occurred()) {
                Py_DECREF(key);
                Py_DECREF(value);
                goto done;
            }
            shape = -2;
            if (found != NULL) {
                shape = PyLong_AsLong(found);
                if (shape == -1 && PyErr_Occurred()) {
                    Py_DECREF(key);
                    Py_DECREF(value);
                    goto done;
                }
            }
            Py_XSETREF(last_skeleton, key); /* (a run of one skeleton: one lookup) */
            last_shape = shape;
        }
        if (shape < 0) {
            r->n_holes = first_hole;
            status[i] = shape == -1 ? REFUSED : NEW_SHAPE;
            Py_DECREF(value);
            continue;
        }
        long code = label_code(&s, labels, absent);
        if (code == -1 && PyErr_Occurred()) {
            Py_DECREF(value);
            goto done;
        }
        if (code < -1) {
            r->n_holes = first_hole;
            status[i] = NEW_LABEL;
            Py_DECREF(value);
            continue;
        }
        ids_used += put_id(ids + ids_used, &s);
        id_ends[i] = ids_used;
        rows[3 * i] = shape;
        rows[3 * i + 1] = first_hole;
        rows[3 * i + 2] = code;
        status[i] = ROW;
        Py_DECREF(value);
    }
    result = Py_BuildValue("(nnn)", i, r->n_holes, ids_used);
done:
    Py_XDECREF(last_skeleton);
    Py_XDECREF(value_name);
    PyBuffer_Release(&status_view);
    PyBuffer_Release(&rows_view);
    PyBuffer_Release(&holes_view);
    PyBuffer_Release(&ids_view);
    PyBuffer_Release(&id_ends_view);
    return result;
}

/* read_json(records, start, end, config, skeletons, labels, absent_label, status, rows,
 *           holes, ids, id_ends, record_type, value_at) -> (records read, holes used, id bytes
 *           used)
 *
 * Each record of records[start:end] (`.value`): its status (ROW, UNDECIDED, NEW_SHAPE, REFUSED,
 * NEW_LABEL, FULL) in status[i - start]; a ROW's (shape, first hole, label code) in rows[i -
 * start] (int64, 3 a row), its numbers in `holes` (float64), the JSON of its id in `ids` (uint8:
 * the string with its quotes, the integer, or null) up to id_ends[i - start]. `config` is (id
 * field, label field, keep, skip, strings matter, max record bytes) (see `fields`), `skeletons`
 * a dict {skeleton: shape, or -1 for a refused one}, `labels` ((label text, code), ...), a
 * record without a label `absent_label`. A record of `record_type` (a named tuple, or None) is
 * read at its field `value_at`, a `bytes` is the value itself, any other is read at its
 * attribute `value`. Stops before a record its
 * arrays have no room for (FULL): the caller calls again from there. */
static PyObject *read_json(PyObject *self, PyObject *args) {
    if (PyTuple_GET_SIZE(args) < 4 || !PyTuple_Check(PyTuple_GET_ITEM(args, 3))) {
        PyErr_SetString(PyExc_TypeError, "read_json: a config tuple expected");
        return NULL;
    }
    fields f;
    reading r = {{NULL, 0, 0}, NULL, 0, 0, 1};
    Py_ssize_t max_record_bytes;
    if (read_fields(PyTuple_GET_ITEM(args, 3), &f, &r.strings_matter, &max_record_bytes) < 0) {
        return NULL;
    }
    PyObject *result = read_batch(args, json_record, &f, &r, max_record_bytes);
    PyMem_Free(r.skeleton.data);
    return result;
}

/* describe(value, reader, format, max record bytes) -> (skeleton, numbers, id text or None,
 * label text or None), or None where the reader would not read the record: what the caller
 * learns a new skeleton from (its numbers in order, compared with the codec's event). */
static PyObject *describe(Py_buffer *value, record_reader read_one, void *format, reading *r,
                          Py_ssize_t max_record_bytes) {
    if (value->len > max_record_bytes) {
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    r->holes_capacity = value->len + 1;
    r->holes = PyMem_Malloc((size_t)r->holes_capacity * sizeof(double));
    unsigned char *id_text = PyMem_Malloc((size_t)(value->len + ID_ROOM));
    if (r->holes == NULL || id_text == NULL) {
        PyMem_Free(r->holes);
        PyMem_Free(id_text);
        return PyErr_NoMemory();
    }
    slots s;
    int read = read_one(value->buf, value->len, format, r, &s);
    if (read == ERROR) {
        goto done;
    }
    if (read != OK) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *numbers = PyList_New(r->n_holes);
    if (numbers == NULL) {
        goto done;
    }
    for (Py_ssize_t k = 0; k < r->n_holes; k++) {
        PyObject *number = PyFloat_FromDouble(r->holes[k]);
        if (number == NULL) {
            Py_DECREF(numbers);
            goto done;
        }
        PyList_SET_ITEM(numbers, k, number);
    }
    PyObject *id = s.id_kind == ID_NULL
                       ? Py_NewRef(Py_None)
                       : PyBytes_FromStringAndSize((const char *)id_text, put_id(id_text, &s));
    PyObject *label = s.label == NULL
                          ? Py_NewRef(Py_None)
                          : PyBytes_FromStringAndSize((const char *)s.label, s.label_length);
    if (id != NULL && label != NULL) {
        result = Py_BuildValue("(y#NOO)", (const char *)r->skeleton.data, r->skeleton.size,
                               numbers, id, label);
    } else {
        Py_DECREF(numbers);
    }
    Py_XDECREF(id);
    Py_XDECREF(label);
done:
    PyMem_Free(r->holes);
    PyMem_Free(id_text);
    return result;
}

/* describe_json(value, config) -> see `describe`. */
static PyObject *describe_json(PyObject *self, PyObject *args) {
    Py_buffer value;
    PyObject *config;
    if (!PyArg_ParseTuple(args, "y*O!", &value, &PyTuple_Type, &config)) {
        return NULL;
    }
    fields f;
    reading r = {{NULL, 0, 0}, NULL, 0, 0, 1};
    Py_ssize_t max_record_bytes;
    PyObject *result = NULL;
    if (read_fields(config, &f, &r.strings_matter, &max_record_bytes) == 0) {
        result = describe(&value, json_record, &f, &r, max_record_bytes);
    }
    PyMem_Free(r.skeleton.data);
    PyBuffer_Release(&value);
    return result;
}

/* Avro ------------------------------------------------------------------------------------ */

/* The opcodes of a plan (events.c, connectors/serializers/avro_events.py: the same numbers). */
enum {
    OP_ID_STRING = 1,
    OP_ID_LONG = 2,
    OP_LABEL_BOOL = 3,
    OP_DOUBLE = 4,
    OP_FLOAT = 5,
    OP_INT = 6,
    OP_LONG = 7,
    OP_BOOL = 8,
    OP_ENUM = 9,
    OP_CATEGORY = 10,
    OP_OPTIONAL = 11,
    OP_SKIP_BOOL = 20,
    OP_SKIP_VARINT = 21,
    OP_SKIP_FLOAT = 22,
    OP_SKIP_DOUBLE = 23,
    OP_SKIP_BYTES = 24,
    OP_SKIP_NULL = 25,
    OP_INT_ID = 26,
    OP_SKIP_STRING = 27,
    OP_SKIP_INT = 28,
    OP_SKIP_ENUM = 29,
};

/* mapping.MAX_CATEGORY_CHARS, as events.c */
#define MAX_CATEGORY 256

static int takes_index(unsigned char op) {
    return (op >= OP_DOUBLE && op <= OP_CATEGORY) || op == OP_SKIP_ENUM;
}

/* Avro's zigzag long; NO past the end, beyond ten bytes or beyond 64 bits (events.c's). */
static int avro_long(cursor *c, int64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    for (;;) {
        if (c->pos >= c->end) {
            return NO;
        }
        unsigned char byte = c->data[c->pos++];
        if (shift == 63 && (byte & 0x7e)) {
            return NO;
        }
        value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            break;
        }
        shift += 7;
        if (shift >= 64) {
            return NO;
        }
    }
    *out = (int64_t)((value >> 1) ^ (~(value & 1) + 1));
    return OK;
}

/* A length (bytes, string): NO when negative or beyond what is left. */
static int avro_length(cursor *c, Py_ssize_t *out) {
    int64_t length;
    if (avro_long(c, &length) != OK || length < 0 || length > (int64_t)(c->end - c->pos)) {
        return NO;
    }
    *out = (Py_ssize_t)length;
    return OK;
}

/* The characters of `n` bytes of UTF-8, or -1 where they are not valid UTF-8 (as Python's
 * decoder decides); `plain`: -1 also for what JSON escapes (a quote, a backslash, a control
 * character). */
static Py_ssize_t utf8_chars(const unsigned char *p, Py_ssize_t n, int plain) {
    Py_ssize_t chars = 0, at = 0;
    while (at < n) {
        unsigned char b = p[at];
        if (b < 0x80) {
            if (plain && (b < 0x20 || b == '"' || b == '\\')) {
                return -1;
            }
            at++;
        } else {
            int k = utf8_length(p + at, n - at);
            if (k == 0) {
                return -1;
            }
            at += k;
        }
        chars++;
    }
    return chars;
}

/* A string at c: its span, checked as `utf8_chars` checks it; NO otherwise. */
static int avro_string(cursor *c, const unsigned char **text, Py_ssize_t *length,
                       Py_ssize_t *chars, int plain) {
    if (avro_length(c, length) != OK) {
        return NO;
    }
    *text = c->data + c->pos;
    *chars = utf8_chars(*text, *length, plain);
    if (*chars < 0) {
        return NO;
    }
    c->pos += *length;
    return OK;
}

static int put_long(buffer *b, int64_t value) { return put(b, &value, 8); }

/* A schema's plan, where the batch looks it up. */
typedef struct {
    PyObject *plans;          /* {frame (5 bytes): (plan, enum tables) or None} */
    unsigned char frame[5];   /* the last frame looked up... */
    int looked_up;
    PyObject *entry;          /* ...and its entry (NULL: none) */
    const unsigned char *plan;
    Py_ssize_t plan_size;
    PyObject *tables;
} avro_format;

/* One instruction of the plan at plan[*at] over the record at c (events.c's `run`, into the
 * skeleton, the holes and the slots). */
static int avro_op(cursor *c, const avro_format *a, Py_ssize_t *at, reading *r, slots *s) {
    const unsigned char *plan = a->plan;
    if (*at >= a->plan_size) {
        PyErr_SetString(PyExc_ValueError, "an Avro plan ends inside an instruction");
        return ERROR;
    }
    unsigned char op = plan[(*at)++];
    Py_ssize_t index = -1;
    if (takes_index(op)) {
        if (*at + 2 > a->plan_size) {
            PyErr_SetString(PyExc_ValueError, "an Avro plan's index is cut");
            return ERROR;
        }
        index = plan[*at] | (plan[*at + 1] << 8);
        *at += 2;
    }
    int64_t integer;
    const unsigned char *text;
    Py_ssize_t length, chars;
    switch (op) {
    case OP_ID_STRING:
        if (avro_string(c, &text, &length, &chars, 1) != OK) {
            return NO;
        }
        s->id = text;
        s->id_length = length;
        s->id_kind = ID_STRING;
        return put_byte(&r->skeleton, ID_SLOT) ? ERROR : OK;
    case OP_ID_LONG:
    case OP_INT_ID:
        if (avro_long(c, &integer) != OK ||
            (op == OP_INT_ID && (integer < INT32_MIN || integer > INT32_MAX))) {
            return NO;
        }
        s->id_integer = integer;
        s->id_kind = ID_INTEGER;
        return put_byte(&r->skeleton, ID_SLOT) ? ERROR : OK;
    case OP_LABEL_BOOL:
        if (c->pos >= c->end || c->data[c->pos] > 1) {
            return NO;
        }
        s->label = (const unsigned char *)(c->data[c->pos] ? "true" : "false");
        s->label_length = c->data[c->pos] ? 4 : 5;
        c->pos++;
        return put_byte(&r->skeleton, LABEL_SLOT) ? ERROR : OK;
    case OP_BOOL:
        if (c->pos >= c->end || c->data[c->pos] > 1) {
            return NO;
        }
        return put_byte(&r->skeleton, c->data[c->pos++]) ? ERROR : OK;
    case OP_DOUBLE: {
        double value;
        if (c->end - c->pos < 8) {
            return NO;
        }
        memcpy(&value, c->data + c->pos, 8);
        c->pos += 8;
        if (!isfinite(value) || add_hole(r, value) != OK) {
            return NO;
        }
        return put_byte(&r->skeleton, HOLE) ? ERROR : OK;
    }
    case OP_FLOAT: {
        float value;
        if (c->end - c->pos < 4) {
            return NO;
        }
        memcpy(&value, c->data + c->pos, 4);
        c->pos += 4;
        if (!isfinite(value) || add_hole(r, (double)value) != OK) {
            return NO;
        }
        return put_byte(&r->skeleton, HOLE) ? ERROR : OK;
    }
    case OP_INT:
    case OP_LONG:
        if (avro_long(c, &integer) != OK ||
            (op == OP_INT && (integer < INT32_MIN || integer > INT32_MAX))) {
            return NO;
        }
        /* (converted as Python converts the int the per-record path gives: to nearest) */
        if (add_hole(r, (double)integer) != OK) {
            return NO;
        }
        return put_byte(&r->skeleton, HOLE) ? ERROR : OK;
    case OP_ENUM: {
        if (index >= PyTuple_GET_SIZE(a->tables) ||
            !PyTuple_Check(PyTuple_GET_ITEM(a->tables, index))) {
            PyErr_SetString(PyExc_ValueError, "an Avro plan's enum table is out of range");
            return ERROR;
        }
        Py_ssize_t count = PyTuple_GET_SIZE(PyTuple_GET_ITEM(a->tables, index));
        if (avro_long(c, &integer) != OK || integer < 0 || integer >= count) {
            return NO;
        }
        return put_long(&r->skeleton, integer) ? ERROR : OK;
    }
    case OP_CATEGORY:
        if (avro_string(c, &text, &length, &chars, 0) != OK || chars > MAX_CATEGORY) {
            return NO;
        }
        return put_long(&r->skeleton, length) || put(&r->skeleton, text, length) ? ERROR : OK;
    case OP_OPTIONAL:
        if (avro_long(c, &integer) != OK || (integer != 0 && integer != 1)) {
            return NO;
        }
        if (put_byte(&r->skeleton, (unsigned char)integer)) {
            return ERROR;
        }
        if (integer == 1) {
            return avro_op(c, a, at, r, s);
        }
        /* null: the next instruction is not run, but read past */
        if (*at >= a->plan_size) {
            PyErr_SetString(PyExc_ValueError, "an Avro plan's optional has no instruction");
            return ERROR;
        }
        op = plan[(*at)++];
        if (takes_index(op)) {
            *at += 2;
        }
        if (op == OP_LABEL_BOOL) {
            s->label = (const unsigned char *)"null";
            s->label_length = 4;
        } else if (op == OP_ID_STRING || op == OP_ID_LONG || op == OP_INT_ID) {
            s->id_kind = ID_NULL;
        }
        return OK;
    case OP_SKIP_NULL:
        return OK;
    case OP_SKIP_BOOL:
        if (c->pos >= c->end || c->data[c->pos] > 1) {
            return NO;
        }
        c->pos++;
        return OK;
    case OP_SKIP_VARINT:
        return avro_long(c, &integer);
    case OP_SKIP_INT:
        if (avro_long(c, &integer) != OK || integer < INT32_MIN || integer > INT32_MAX) {
            return NO;
        }
        return OK;
    case OP_SKIP_ENUM:
        if (avro_long(c, &integer) != OK || integer < 0 || integer >= index) {
            return NO;
        }
        return OK;
    case OP_SKIP_FLOAT:
    case OP_SKIP_DOUBLE: {
        Py_ssize_t size = op == OP_SKIP_FLOAT ? 4 : 8;
        if (c->end - c->pos < size) {
            return NO;
        }
        c->pos += size;
        return OK;
    }
    case OP_SKIP_BYTES:
        if (avro_length(c, &length) != OK) {
            return NO;
        }
        c->pos += length;
        return OK;
    case OP_SKIP_STRING:
        return avro_string(c, &text, &length, &chars, 0);
    default:
        PyErr_Format(PyExc_ValueError, "an Avro plan's unknown opcode %d", (int)op);
        return ERROR;
    }
}

/* One framed Avro record (Confluent's frame: a zero byte and the schema id, then the payload)
 * through its schema's plan. */
static int avro_record(const unsigned char *data, Py_ssize_t size, void *format, reading *r,
                       slots *s) {
    avro_format *a = format;
    s->id = s->label = NULL;
    s->id_length = s->label_length = 0;
    s->id_kind = ID_NULL;
    r->skeleton.size = 0;
    if (size < 5 || data[0] != 0) {
        return NO;
    }
    if (!a->looked_up || memcmp(a->frame, data, 5) != 0) {
        PyObject *key = PyBytes_FromStringAndSize((const char *)data, 5);
        if (key == NULL) {
            return ERROR;
        }
        PyObject *entry = PyDict_GetItemWithError(a->plans, key); /* borrowed */
        Py_DECREF(key);
        if (entry == NULL && PyErr_Occurred()) {
            return ERROR;
        }
        if (entry != NULL && entry != Py_None) {
            if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 ||
                !PyBytes_Check(PyTuple_GET_ITEM(entry, 0)) ||
                !PyTuple_Check(PyTuple_GET_ITEM(entry, 1))) {
                PyErr_SetString(PyExc_TypeError, "an Avro plan must be (bytes, tuple) or None");
                return ERROR;
            }
            a->plan = (const unsigned char *)PyBytes_AS_STRING(PyTuple_GET_ITEM(entry, 0));
            a->plan_size = PyBytes_GET_SIZE(PyTuple_GET_ITEM(entry, 0));
            a->tables = PyTuple_GET_ITEM(entry, 1);
        }
        Py_XINCREF(entry);
        Py_XSETREF(a->entry, entry); /* (held: its plan is read from it) */
        memcpy(a->frame, data, 5);
        a->looked_up = 1;
    }
    if (a->entry == NULL) {
        return UNPLANNED;
    }
    if (a->entry == Py_None) {
        return PLANLESS;
    }
    if (put(&r->skeleton, data, 5)) {
        return ERROR;
    }
    cursor c = {data, 5, size};
    Py_ssize_t at = 0;
    while (at < a->plan_size) {
        int status = avro_op(&c, a, &at, r, s);
        if (status != OK) {
            return status;
        }
    }
    return c.pos == c.end ? OK : NO; /* (bytes after the record: undecided) */
}

static int avro_config(PyObject *config, avro_format *a, Py_ssize_t *max_record_bytes) {
    memset(a, 0, sizeof *a);
    if (!PyArg_ParseTuple(config, "O!n", &PyDict_Type, &a->plans, max_record_bytes)) {
        return -1;
    }
    return 0;
}

/* read_avro(records, start, end, config, ...) -> `read_json`'s, for framed Avro records:
 * `config` is (plans, max record bytes), `plans` {frame (5 bytes): (plan, enum tables) of its
 * schema, or None: its records take the per-record path}. A record of a frame not in `plans`
 * is NEW_SHAPE (the caller may learn its plan and skeleton). */
static PyObject *read_avro(PyObject *self, PyObject *args) {
    if (PyTuple_GET_SIZE(args) < 4 || !PyTuple_Check(PyTuple_GET_ITEM(args, 3))) {
        PyErr_SetString(PyExc_TypeError, "read_avro: a config tuple expected");
        return NULL;
    }
    avro_format a;
    reading r = {{NULL, 0, 0}, NULL, 0, 0, 1};
    Py_ssize_t max_record_bytes;
    if (avro_config(PyTuple_GET_ITEM(args, 3), &a, &max_record_bytes) < 0) {
        return NULL;
    }
    PyObject *result = read_batch(args, avro_record, &a, &r, max_record_bytes);
    Py_XDECREF(a.entry);
    PyMem_Free(r.skeleton.data);
    return result;
}

/* describe_avro(value, config) -> see `describe` (None also for a frame without a plan). */
static PyObject *describe_avro(PyObject *self, PyObject *args) {
    Py_buffer value;
    PyObject *config;
    if (!PyArg_ParseTuple(args, "y*O!", &value, &PyTuple_Type, &config)) {
        return NULL;
    }
    avro_format a;
    reading r = {{NULL, 0, 0}, NULL, 0, 0, 1};
    Py_ssize_t max_record_bytes;
    PyObject *result = NULL;
    if (avro_config(config, &a, &max_record_bytes) == 0) {
        result = describe(&value, avro_record, &a, &r, max_record_bytes);
    }
    Py_XDECREF(a.entry);
    PyMem_Free(r.skeleton.data);
    PyBuffer_Release(&value);
    return result;
}

static PyMethodDef methods[] = {
    {"read_json", read_json, METH_VARARGS,
     "read_json(records, start, end, config, skeletons, labels, absent_label, status, rows, "
     "holes, ids, id_ends, record_type, value_at) -> (records read, holes used, id bytes used) "
     "(see event_batches.c)"},
    {"describe_json", describe_json, METH_VARARGS,
     "describe_json(value, config) -> (skeleton, numbers, id, label) or None (see "
     "event_batches.c)"},
    {"read_avro", read_avro, METH_VARARGS,
     "read_avro(records, start, end, config, skeletons, labels, absent_label, status, rows, "
     "holes, ids, id_ends, record_type, value_at) -> (records read, holes used, id bytes used) "
     "(see event_batches.c)"},
    {"describe_avro", describe_avro, METH_VARARGS,
     "describe_avro(value, config) -> (skeleton, numbers, id, label) or None (see "
     "event_batches.c)"},
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
    PyModuleDef_HEAD_INIT, NAME_TEXT(MODULE), "Records read a batch at a time (see "
    "event_batches.c)", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC INIT_FUNCTION(MODULE)(void) {
    return PyModule_Create(&definition);
}
