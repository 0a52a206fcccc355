/* The records of a fetched Kafka record batch (message format v2), read in C; the records of
 * a batch to produce, written in C (`append_records`, below); and confluent-kafka's messages
 * and sends a batch at a time (`message_records`, `produce_many`, `DeliveryCount`).
 *
 * kafka-python reads a fetched batch one record at a time in Python: a varint decoder call per
 * field, a `DefaultRecord` object, then the fetcher's `ConsumerRecord` and its sizes, about
 * 10 us a record on this project's machine, the largest part of the worker's poll.
 * `parse_records` reads every record of a batch in one call (about 1 us a record) and makes the
 * fetcher's `ConsumerRecord`s directly; `connectors.kafka.fetched_records` calls it where
 * kafka-python's fetcher would read the records, after kafka-python has checked the batch's
 * CRC, skipped control and aborted batches, and decompressed it.
 *
 * A fetched batch is untrusted: whatever its bytes, this raises ValueError (which the caller
 * turns into kafka-python's `CorruptRecordError`) where kafka-python's reader raises, and never
 * reads outside the buffer, never allocates for a count it has not read records for, and runs
 * no Python code. It is stricter than kafka-python only where kafka-python would accept an
 * impossible number: a varint beyond 64 bits, an offset or timestamp beyond int64.
 *
 * Built by `streammargin.jit.aot` (`streammargin warmup`) beside the package's other compiled
 * modules, under the same stamp; without the built module the fetcher reads as kafka-python does.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Fields of kafka-python's ConsumerRecord, in its order (checked by the caller). */
#define RECORD_FIELDS 13

/* A zigzag varint (Kafka's varint and varlong) at *pos, as kafka-python's decode_varint reads
 * it; -1 past the end of the buffer or beyond 64 bits. */
static int read_varint(const unsigned char *buffer, Py_ssize_t end, Py_ssize_t *pos,
                       int64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    Py_ssize_t at = *pos;
    for (;;) {
        if (at >= end) {
            return -1;
        }
        unsigned char byte = buffer[at++];
        if (shift == 63 && (byte & 0x7e)) {
            return -1; /* bits beyond the 64th */
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
    *pos = at;
    *out = (int64_t)((value >> 1) ^ (~(value & 1) + 1));
    return 0;
}

static PyObject *corrupt(const char *what, Py_ssize_t record, Py_ssize_t at) {
    PyErr_Format(PyExc_ValueError, "%s (record %zd of the batch, byte %zd)", what, record, at);
    return NULL;
}

/* Bytes of length `length` at *pos (None for a negative length), or NULL with ValueError. */
static PyObject *read_bytes(const unsigned char *buffer, Py_ssize_t end, Py_ssize_t *pos,
                            int64_t length) {
    if (length < 0) {
        Py_RETURN_NONE;
    }
    if (length > end - *pos) {
        PyErr_SetString(PyExc_ValueError, "a length beyond the batch");
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)buffer + *pos, (Py_ssize_t)length);
    *pos += (Py_ssize_t)length;
    return bytes;
}

/* The headers of a record: a list of (str, bytes or None), and their size as kafka-python's
 * fetcher counts it (key bytes + value bytes, -1 without headers). */
static PyObject *read_headers(const unsigned char *buffer, Py_ssize_t end, Py_ssize_t *pos,
                              int64_t *size) {
    int64_t count;
    if (read_varint(buffer, end, pos, &count) < 0) {
        PyErr_SetString(PyExc_ValueError, "an unreadable header count");
        return NULL;
    }
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "a negative header count");
        return NULL;
    }
    PyObject *headers = PyList_New(0);
    if (headers == NULL) {
        return NULL;
    }
    *size = count ? 0 : -1;
    /* Each header takes at least two bytes: a count beyond the buffer fails before it allocates. */
    for (int64_t i = 0; i < count; i++) {
        int64_t key_length, value_length;
        if (read_varint(buffer, end, pos, &key_length) < 0 || key_length < 0 ||
            key_length > end - *pos) {
            PyErr_SetString(PyExc_ValueError, "an unreadable header key");
            goto fail;
        }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)buffer + *pos,
                                             (Py_ssize_t)key_length, "strict");
        if (key == NULL) {
            goto fail; /* UnicodeDecodeError, a ValueError, as kafka-python's decode raises */
        }
        *pos += (Py_ssize_t)key_length;
        if (read_varint(buffer, end, pos, &value_length) < 0) {
            Py_DECREF(key);
            PyErr_SetString(PyExc_ValueError, "an unreadable header value length");
            goto fail;
        }
        PyObject *value = read_bytes(buffer, end, pos, value_length);
        if (value == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        *size += key_length + (value_length >= 0 ? value_length : 0);
        PyObject *pair = PyTuple_Pack(2, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (pair == NULL || PyList_Append(headers, pair) < 0) {
            Py_XDECREF(pair);
            goto fail;
        }
        Py_DECREF(pair);
    }
    return headers;
fail:
    Py_DECREF(headers);
    return NULL;
}

/* parse_records(buffer, pos, count, base_offset, first_timestamp, max_timestamp,
 *               log_append_time, record_type, topic, partition, leader_epoch, timestamp_type)
 * -> (list of record_type, bytes read)
 *
 * The `count` records of a v2 batch whose (decompressed) records start at `pos` of `buffer`, as
 * kafka-python's fetcher yields them: ConsumerRecord(topic, partition, leader_epoch, offset,
 * timestamp, timestamp_type, key, value, headers, None, key size, value size, header size).
 * `bytes read` is the sum of the records' lengths (the fetcher's bytes_read). The records must
 * end exactly at the end of the buffer. */
static PyObject *parse_records(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, count;
    long long base_offset, first_timestamp, max_timestamp;
    int log_append_time;
    PyObject *record_type, *topic, *partition, *leader_epoch, *timestamp_type;
    if (!PyArg_ParseTuple(args, "y*nnLLLpOOOOO", &view, &pos, &count, &base_offset,
                          &first_timestamp, &max_timestamp, &log_append_time, &record_type,
                          &topic, &partition, &leader_epoch, &timestamp_type)) {
        return NULL;
    }
    PyObject *records = NULL;
    const unsigned char *buffer = (const unsigned char *)view.buf;
    Py_ssize_t end = view.len;
    int64_t bytes_read = 0;
    if (!PyType_Check(record_type) || !PyType_IsSubtype((PyTypeObject *)record_type,
                                                        &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        goto done;
    }
    if (pos < 0 || pos > end || count < 0) {
        PyErr_SetString(PyExc_ValueError, "a position or count outside the batch");
        goto done;
    }
    records = PyList_New(0);
    if (records == NULL) {
        goto done;
    }
    PyTypeObject *type = (PyTypeObject *)record_type;
    /* Each record takes at least 7 bytes: a count beyond the buffer fails before it allocates. */
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, attributes, timestamp_delta, offset_delta, key_length, value_length;
        int64_t offset, timestamp, header_size;
        Py_ssize_t start = pos;
        if (read_varint(buffer, end, &pos, &length) < 0) {
            corrupt("an unreadable record length", i, start);
            goto fail;
        }
        Py_ssize_t body = pos;
        if (read_varint(buffer, end, &pos, &attributes) < 0 ||
            read_varint(buffer, end, &pos, &timestamp_delta) < 0 ||
            read_varint(buffer, end, &pos, &offset_delta) < 0) {
            corrupt("an unreadable record header", i, start);
            goto fail;
        }
        if (log_append_time) {
            timestamp = max_timestamp;
        } else if (__builtin_add_overflow((int64_t)first_timestamp, timestamp_delta, &timestamp)) {
            corrupt("a timestamp beyond int64", i, start);
            goto fail;
        }
        if (__builtin_add_overflow((int64_t)base_offset, offset_delta, &offset)) {
            corrupt("an offset beyond int64", i, start);
            goto fail;
        }
        if (read_varint(buffer, end, &pos, &key_length) < 0) {
            corrupt("an unreadable key length", i, start);
            goto fail;
        }
        PyObject *key = read_bytes(buffer, end, &pos, key_length);
        if (key == NULL) {
            goto fail;
        }
        if (read_varint(buffer, end, &pos, &value_length) < 0) {
            Py_DECREF(key);
            corrupt("an unreadable value length", i, start);
            goto fail;
        }
        PyObject *value = read_bytes(buffer, end, &pos, value_length);
        if (value == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        PyObject *headers = read_headers(buffer, end, &pos, &header_size);
        if (headers == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
            goto fail;
        }
        if (pos - body != length) {
            Py_DECREF(key);
            Py_DECREF(value);
            Py_DECREF(headers);
            corrupt("a record whose length is not what it holds", i, start);
            goto fail;
        }
        PyObject *record = type->tp_alloc(type, RECORD_FIELDS);
        if (record == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
            Py_DECREF(headers);
            goto fail;
        }
        PyObject *fields[RECORD_FIELDS] = {
            Py_NewRef(topic), Py_NewRef(partition), Py_NewRef(leader_epoch),
            PyLong_FromLongLong(offset), PyLong_FromLongLong(timestamp),
            Py_NewRef(timestamp_type), key, value, headers, Py_NewRef(Py_None),
            PyLong_FromLongLong(key_length >= 0 ? key_length : -1),
            PyLong_FromLongLong(value_length >= 0 ? value_length : -1),
            PyLong_FromLongLong(header_size),
        };
        int failed = 0;
        for (int f = 0; f < RECORD_FIELDS; f++) {
            if (fields[f] == NULL) {
                failed = 1;
                fields[f] = Py_NewRef(Py_None);
            }
            PyTuple_SET_ITEM(record, f, fields[f]);
        }
        if (failed || PyList_Append(records, record) < 0) {
            Py_DECREF(record);
            goto fail;
        }
        Py_DECREF(record);
        bytes_read += length;
    }
    if (pos != end) {
        corrupt("bytes left after the batch's last record", count, pos);
        goto fail;
    }
    PyObject *result = Py_BuildValue("(NL)", records, (long long)bytes_read);
    PyBuffer_Release(&view);
    return result;
fail:
    Py_CLEAR(records);
done:
    PyBuffer_Release(&view);
    return NULL;
}

/* Writing ----------------------------------------------------------------------------------- */

/* The bytes of Kafka's zigzag varint of v. */
static int varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static unsigned char *put_varint(unsigned char *at, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z >= 0x80) {
        *at++ = (unsigned char)(0x80 | (z & 0x7f));
        z >>= 7;
    }
    *at++ = (unsigned char)z;
    return at;
}

static int get_int64(PyObject *object, const char *name, int64_t *out) {
    PyObject *value = PyObject_GetAttrString(object, name);
    if (value == NULL) {
        return -1;
    }
    long long number = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (number == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = number;
    return 0;
}

static int set_int64(PyObject *object, const char *name, int64_t value) {
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) {
        return -1;
    }
    int failed = PyObject_SetAttrString(object, name, number);
    Py_DECREF(number);
    return failed;
}

/* A record's key or value: 1 with its bytes, 0 for None, -1 for anything else. */
static int bytes_field(PyObject *item, const char **data, Py_ssize_t *size) {
    if (item == Py_None) {
        return 0;
    }
    if (!PyBytes_CheckExact(item)) {
        return -1;
    }
    *data = PyBytes_AS_STRING(item);
    *size = PyBytes_GET_SIZE(item);
    return 1;
}

/* append_records(builder, values, keys, headers, timestamps, start, limit)
 *   -> (next index, largest record, stopped for Python)
 *
 * kafka-python's `DefaultRecordBatchBuilder.append` for records[start:], written into the
 * builder's buffer the same way (attributes, timestamp and offset deltas, key, value, headers,
 * each as kafka-python encodes it; a header without value empty, as `send_many` sends it), until the batch is full (a record would take it past the
 * builder's batch size, the first record always fits) or the records end; the builder's
 * timestamps, last offset and count are kept as `append` keeps them. A fresh builder, or one
 * only this and `append` wrote: a record's offset is the number of records before it. Stops,
 * for the caller to take with `append`, before a record it does not write: a timestamp None
 * (the producer's clock), a key or value other than bytes or None, odd headers, or a key, value
 * and headers of more than `limit` bytes (the producer checks those against its request limit).
 * The largest record is the `size` of the records' metadata (`max_record_size`). */
static PyObject *append_records(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *builder, *values, *keys, *headers, *timestamps;
    Py_ssize_t start, limit;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!nn", &builder, &PyList_Type, &values, &PyList_Type,
                          &keys, &PyList_Type, &headers, &PyList_Type, &timestamps, &start,
                          &limit)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(headers) != n ||
        PyList_GET_SIZE(timestamps) != n || start < 0 || start > n) {
        PyErr_SetString(PyExc_ValueError, "append_records: columns of different lengths");
        return NULL;
    }
    PyObject *buffer = PyObject_GetAttrString(builder, "_buffer");
    if (buffer == NULL) {
        return NULL;
    }
    if (!PyByteArray_CheckExact(buffer)) {
        Py_DECREF(buffer);
        PyErr_SetString(PyExc_TypeError, "append_records: the builder's buffer is not a bytearray");
        return NULL;
    }
    PyObject *first_object = PyObject_GetAttrString(builder, "_first_timestamp");
    int64_t batch_size, max_timestamp = 0, count, last_offset, first_timestamp = 0;
    int has_first = first_object != NULL && first_object != Py_None;
    PyObject *result = NULL;
    if (first_object == NULL || get_int64(builder, "_batch_size", &batch_size) < 0 ||
        get_int64(builder, "_num_records", &count) < 0 ||
        get_int64(builder, "_last_offset", &last_offset) < 0 ||
        (has_first && (get_int64(builder, "_first_timestamp", &first_timestamp) < 0 ||
                       get_int64(builder, "_max_timestamp", &max_timestamp) < 0))) {
        goto done;
    }
    Py_ssize_t i = start, largest = 0;
    int slow = 0;
    for (; i < n; i++) {
        const char *key = NULL, *value = NULL;
        Py_ssize_t key_size = 0, value_size = 0;
        int has_key = bytes_field(PyList_GET_ITEM(keys, i), &key, &key_size);
        int has_value = bytes_field(PyList_GET_ITEM(values, i), &value, &value_size);
        PyObject *stamp = PyList_GET_ITEM(timestamps, i);
        PyObject *record_headers = PyList_GET_ITEM(headers, i);
        if (has_key < 0 || has_value < 0 || !PyLong_CheckExact(stamp) ||
            (record_headers != Py_None && !PyList_CheckExact(record_headers))) {
            slow = 1;
            break;
        }
        int64_t timestamp = PyLong_AsLongLong(stamp);
        if (timestamp == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            slow = 1;
            break;
        }
        Py_ssize_t n_headers = record_headers == Py_None ? 0 : PyList_GET_SIZE(record_headers);
        Py_ssize_t fields_size = key_size + value_size, headers_size = varint_size(n_headers);
        int odd = 0;
        for (Py_ssize_t h = 0; h < n_headers && !odd; h++) {
            PyObject *pair = PyList_GET_ITEM(record_headers, h);
            if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0))) {
                odd = 1;
                break;
            }
            Py_ssize_t name_size;
            if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &name_size) == NULL) {
                PyErr_Clear();
                odd = 1;
                break;
            }
            PyObject *header = PyTuple_GET_ITEM(pair, 1);
            const char *ignored;
            Py_ssize_t header_size = 0;
            int has_header = bytes_field(header, &ignored, &header_size);
            if (has_header < 0) {
                odd = 1;
                break;
            }
            /* (a header without value goes out empty, as the worker's sends have it) */
            headers_size += varint_size(name_size) + name_size + varint_size(header_size) +
                            header_size;
            fields_size += name_size + header_size;
        }
        if (odd || fields_size > limit) {
            slow = 1;
            break;
        }
        int first_message = !has_first;
        int64_t delta = first_message ? 0 : timestamp - first_timestamp;
        Py_ssize_t body = 1 + varint_size(delta) + varint_size(count) +
                          (has_key ? varint_size(key_size) + key_size : 1) +
                          (has_value ? varint_size(value_size) + value_size : 1) + headers_size;
        Py_ssize_t required = body + varint_size(body);
        Py_ssize_t size = PyByteArray_GET_SIZE(buffer);
        if (required + size > batch_size && !first_message) {
            break; /* full */
        }
        if (PyByteArray_Resize(buffer, size + required) < 0) {
            goto done;
        }
        unsigned char *at = (unsigned char *)PyByteArray_AS_STRING(buffer) + size;
        at = put_varint(at, body);
        *at++ = 0; /* attributes */
        at = put_varint(at, delta);
        at = put_varint(at, count);
        if (has_key) {
            at = put_varint(at, key_size);
            memcpy(at, key, (size_t)key_size);
            at += key_size;
        } else {
            *at++ = 1; /* -1: null */
        }
        if (has_value) {
            at = put_varint(at, value_size);
            memcpy(at, value, (size_t)value_size);
            at += value_size;
        } else {
            *at++ = 1;
        }
        at = put_varint(at, n_headers);
        for (Py_ssize_t h = 0; h < n_headers; h++) {
            PyObject *pair = PyList_GET_ITEM(record_headers, h);
            Py_ssize_t name_size;
            const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &name_size);
            at = put_varint(at, name_size);
            memcpy(at, name, (size_t)name_size);
            at += name_size;
            const char *header = NULL;
            Py_ssize_t header_size = 0;
            bytes_field(PyTuple_GET_ITEM(pair, 1), &header, &header_size); /* (None: empty) */
            at = put_varint(at, header_size);
            if (header_size) {
                memcpy(at, header, (size_t)header_size);
                at += header_size;
            }
        }
        if (first_message) {
            has_first = 1;
            first_timestamp = max_timestamp = timestamp;
        }
        if (max_timestamp < timestamp) {
            max_timestamp = timestamp;
        }
        last_offset = count;
        count++;
        if (required > largest) {
            largest = required;
        }
    }
    if (has_first) {
        if (set_int64(builder, "_first_timestamp", first_timestamp) < 0 ||
            set_int64(builder, "_max_timestamp", max_timestamp) < 0) {
            goto done;
        }
    }
    if (set_int64(builder, "_num_records", count) < 0 ||
        set_int64(builder, "_last_offset", last_offset) < 0) {
        goto done;
    }
    result = Py_BuildValue("(nnO)", i, largest, slow ? Py_True : Py_False);
done:
    Py_XDECREF(first_object);
    Py_DECREF(buffer);
    return result;
}

/* librdkafka (confluent-kafka) ------------------------------------------------------------- */

static PyObject *call_method(PyObject *object, PyObject *name) {
    return PyObject_CallMethodNoArgs(object, name);
}

/* message_records(messages, start, record_type)
 *   -> (runs, next index, value bytes, values)
 *
 * The records of confluent-kafka's consumed `messages[start:]` as `record_type`s (a tuple type
 * of the fields topic, partition, offset, timestamp, key, value, headers: the timestamp's
 * milliseconds, the headers a list, [] for none), in runs of one partition, [(topic, partition,
 * [records]), ...], up to the first message with an error (its index is the next index: the
 * caller looks at it); with the bytes and the count of the values that are not None. */
static PyObject *message_records(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *messages, *record_type;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!nO", &PyList_Type, &messages, &start, &record_type)) {
        return NULL;
    }
    if (!PyType_Check(record_type) ||
        !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)record_type;
    static PyObject *names[8] = {NULL};
    static const char *texts[8] = {"error", "topic", "partition", "offset", "timestamp", "key",
                                   "value", "headers"};
    for (int k = 0; k < 8; k++) {
        if (names[k] == NULL && (names[k] = PyUnicode_InternFromString(texts[k])) == NULL) {
            return NULL;
        }
    }
    PyObject *runs = PyList_New(0), *run = NULL, *run_topic = NULL, *run_partition = NULL;
    if (runs == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(messages), i = start < 0 ? 0 : start;
    long long value_bytes = 0, values = 0;
    for (; i < n; i++) {
        PyObject *message = PyList_GET_ITEM(messages, i);
        PyObject *error = call_method(message, names[0]);
        if (error == NULL) {
            goto fail;
        }
        int has_error = error != Py_None;
        Py_DECREF(error);
        if (has_error) {
            break;
        }
        PyObject *fields[7] = {NULL};
        for (int k = 0; k < 7; k++) {
            fields[k] = call_method(message, names[k + 1]);
            if (fields[k] == NULL) {
                for (int j = 0; j < k; j++) {
                    Py_DECREF(fields[j]);
                }
                goto fail;
            }
        }
        /* timestamp: (type, milliseconds); headers: None for none */
        PyObject *stamp = fields[3];
        if (!PyTuple_Check(stamp) || PyTuple_GET_SIZE(stamp) != 2) {
            for (int k = 0; k < 7; k++) {
                Py_DECREF(fields[k]);
            }
            PyErr_SetString(PyExc_TypeError, "a message's timestamp is not (type, ms)");
            goto fail;
        }
        fields[3] = Py_NewRef(PyTuple_GET_ITEM(stamp, 1));
        Py_DECREF(stamp);
        if (fields[6] == Py_None) {
            Py_DECREF(fields[6]);
            fields[6] = PyList_New(0);
            if (fields[6] == NULL) {
                for (int k = 0; k < 6; k++) {
                    Py_DECREF(fields[k]);
                }
                goto fail;
            }
        }
        if (fields[5] != Py_None && PyBytes_Check(fields[5])) {
            value_bytes += PyBytes_GET_SIZE(fields[5]);
            values++;
        }
        int same = run != NULL && PyObject_RichCompareBool(fields[0], run_topic, Py_EQ) == 1 &&
                   PyObject_RichCompareBool(fields[1], run_partition, Py_EQ) == 1;
        if (!same) {
            PyObject *records = PyList_New(0);
            PyObject *entry = records ? PyTuple_Pack(3, fields[0], fields[1], records) : NULL;
            Py_XDECREF(records);
            if (entry == NULL || PyList_Append(runs, entry) < 0) {
                Py_XDECREF(entry);
                for (int k = 0; k < 7; k++) {
                    Py_DECREF(fields[k]);
                }
                goto fail;
            }
            run = PyTuple_GET_ITEM(entry, 2); /* (borrowed: runs holds it) */
            run_topic = PyTuple_GET_ITEM(entry, 0);
            run_partition = PyTuple_GET_ITEM(entry, 1);
            Py_DECREF(entry);
        }
        PyObject *record = type->tp_alloc(type, 7);
        if (record == NULL) {
            for (int k = 0; k < 7; k++) {
                Py_DECREF(fields[k]);
            }
            goto fail;
        }
        for (int k = 0; k < 7; k++) {
            PyTuple_SET_ITEM(record, k, fields[k]);
        }
        int failed = PyList_Append(run, record);
        Py_DECREF(record);
        if (failed) {
            goto fail;
        }
    }
    return Py_BuildValue("(NnLL)", runs, i, value_bytes, values);
fail:
    Py_DECREF(runs);
    return NULL;
}

/* produce_many(produce, topic, partition, values, keys, headers, timestamps, on_delivery,
 *              start) -> next index
 *
 * confluent-kafka's `produce(topic, value, key, partition=..., on_delivery=...,
 * timestamp=...[, headers=...])` for records[start:], in order, in C; it stops before a record
 * the caller must produce itself (a timestamp None, a header without value, a full queue, a
 * client error: its index is returned, nothing of it queued). */
static PyObject *produce_many(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *produce, *topic, *partition, *values, *keys, *headers, *timestamps, *on_delivery;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OOOO!O!O!O!On", &produce, &topic, &partition, &PyList_Type,
                          &values, &PyList_Type, &keys, &PyList_Type, &headers, &PyList_Type,
                          &timestamps, &on_delivery, &start)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(headers) != n ||
        PyList_GET_SIZE(timestamps) != n) {
        PyErr_SetString(PyExc_ValueError, "produce_many: columns of different lengths");
        return NULL;
    }
    PyObject *plain = Py_BuildValue("(sss)", "partition", "on_delivery", "timestamp");
    PyObject *with_headers = Py_BuildValue("(ssss)", "partition", "on_delivery", "timestamp",
                                           "headers");
    if (plain == NULL || with_headers == NULL) {
        Py_XDECREF(plain);
        Py_XDECREF(with_headers);
        return NULL;
    }
    Py_ssize_t i = start < 0 ? 0 : start;
    PyObject *result = NULL;
    for (; i < n; i++) {
        PyObject *timestamp = PyList_GET_ITEM(timestamps, i);
        PyObject *record_headers = PyList_GET_ITEM(headers, i);
        if (timestamp == Py_None) {
            break;
        }
        int has_headers = record_headers != Py_None && PyList_Check(record_headers) &&
                          PyList_GET_SIZE(record_headers) > 0;
        if (has_headers) {
            int plain_headers = 1;
            for (Py_ssize_t h = 0; h < PyList_GET_SIZE(record_headers); h++) {
                PyObject *pair = PyList_GET_ITEM(record_headers, h);
                if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                    !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)) ||
                    !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
                    plain_headers = 0;
                    break;
                }
            }
            if (!plain_headers) {
                break; /* (the caller makes them sendable) */
            }
        } else if (record_headers != Py_None && !PyList_Check(record_headers)) {
            break;
        }
        PyObject *call[8] = {NULL, topic, PyList_GET_ITEM(values, i), PyList_GET_ITEM(keys, i),
                             partition, on_delivery, timestamp, record_headers};
        PyObject *done = PyObject_Vectorcall(produce, call + 1,
                                             3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                             has_headers ? with_headers : plain);
        if (done == NULL) {
            if (PyErr_ExceptionMatches(PyExc_BufferError) ||
                PyErr_ExceptionMatches(PyExc_Exception)) {
                PyErr_Clear(); /* (the caller produces it again, and words any error) */
                break;
            }
            goto done;
        }
        Py_DECREF(done);
    }
    result = PyLong_FromSsize_t(i);
done:
    Py_DECREF(plain);
    Py_DECREF(with_headers);
    return result;
}

/* DeliveryCount(count, on_error): confluent-kafka's delivery callback for `count` records
 * without a Python call a record: each delivery counts down `pending` (the last message stays
 * in `last`); a failure calls on_error(error, message). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t pending;
    PyObject *last;
    PyObject *on_error;
} DeliveryCount;

static int delivery_init(DeliveryCount *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t count;
    PyObject *on_error;
    if (!PyArg_ParseTuple(args, "nO", &count, &on_error)) {
        return -1;
    }
    self->pending = count;
    Py_XSETREF(self->on_error, Py_NewRef(on_error));
    return 0;
}

static PyObject *delivery_call(DeliveryCount *self, PyObject *args, PyObject *kwargs) {
    PyObject *error, *message;
    if (!PyArg_ParseTuple(args, "OO", &error, &message)) {
        return NULL;
    }
    if (error != Py_None) {
        return PyObject_CallFunctionObjArgs(self->on_error, error, message, NULL);
    }
    if (--self->pending == 0) {
        Py_XSETREF(self->last, Py_NewRef(message));
    }
    Py_RETURN_NONE;
}

static int delivery_traverse(DeliveryCount *self, visitproc visit, void *arg) {
    Py_VISIT(self->last);
    Py_VISIT(self->on_error);
    return 0;
}

static int delivery_clear(DeliveryCount *self) {
    Py_CLEAR(self->last);
    Py_CLEAR(self->on_error);
    return 0;
}

static void delivery_dealloc(DeliveryCount *self) {
    PyObject_GC_UnTrack(self);
    delivery_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *delivery_pending(DeliveryCount *self, void *closure) {
    return PyLong_FromSsize_t(self->pending);
}

static PyObject *delivery_last(DeliveryCount *self, void *closure) {
    return Py_NewRef(self->last ? self->last : Py_None);
}

static PyGetSetDef delivery_fields[] = {
    {"pending", (getter)delivery_pending, NULL, "records not delivered yet", NULL},
    {"last", (getter)delivery_last, NULL, "the last record's message, once all are", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DeliveryCountType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "record_batch.DeliveryCount",
    .tp_basicsize = sizeof(DeliveryCount),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "DeliveryCount(count, on_error): delivery callbacks counted in C",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)delivery_init,
    .tp_call = (ternaryfunc)delivery_call,
    .tp_traverse = (traverseproc)delivery_traverse,
    .tp_clear = (inquiry)delivery_clear,
    .tp_dealloc = (destructor)delivery_dealloc,
    .tp_getset = delivery_fields,
};

static PyMethodDef methods[] = {
    {"parse_records", parse_records, METH_VARARGS,
     "The records of a decompressed v2 record batch as the fetcher's ConsumerRecords."},
    {"append_records", append_records, METH_VARARGS,
     "append_records(builder, values, keys, headers, timestamps, start, limit) -> (next index, "
     "largest record, stopped for Python): kafka-python's record batch, written in C."},
    {"message_records", message_records, METH_VARARGS,
     "message_records(messages, start, record_type) -> (runs, next index, value bytes, "
     "values): confluent-kafka's messages as records."},
    {"produce_many", produce_many, METH_VARARGS,
     "produce_many(produce, topic, partition, values, keys, headers, timestamps, on_delivery, "
     "start) -> next index: confluent-kafka's produce, a record at a time, in C."},
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
    PyModuleDef_HEAD_INIT, NAME_TEXT(MODULE), "a fetched record batch's records (see record_batch.c)",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC INIT_FUNCTION(MODULE)(void) {
    if (PyType_Ready(&DeliveryCountType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&definition);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "DeliveryCount", (PyObject *)&DeliveryCountType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
