"""The batch floor: the Kafka pipeline of a test-then-train ALMA with nothing but its work.

A contender of `benchmarks/kafka_throughput.py` (``floor``, and ``floor-1000`` writing 1,000
predictions a message): what the worker's pipeline costs on one core when nothing but the work
is done, records taken a batch at a time. It has none of the worker's duties (no scaler, metrics,
drift detector, checkpoints, offset commits, dead letters, delivery checks, rebalances, formats
other than the benchmark's envelope with its ten features in order) and its JSON parse and float
formatting are not exact (17 digits, no correct rounding): a lower bound on the time a record
takes, to measure the worker against. Per poll:

1. `consume(10000)` on librdkafka (confluent-kafka), with `fetch.queue.backoff.ms` = 10 (at its
   default of 1,000 ms a fast consumer waits on its own prefetch queue: see kafka_throughput.py);
2. one numba pass that parses the batch's JSON envelopes into arrays (features, label, id);
3. per partition, one numba call of ALMA's test-then-train (streammargin's own compiled step:
   `streammargin.jit.alma`) over its rows in offset order;
4. one numba pass that writes the predictions (the worker's fields) into one buffer;
5. one `produce` a prediction (the input's key and timestamp, the input's partition), or one a
   thousand predictions (`{"predictions": [...]}`, the worker's `--predictions-per-message`).

Run by the harness: `python benchmarks/kafka_throughput.py --contenders floor,floor-1000,...`.
"""

from __future__ import annotations

import signal

import numba
import numpy as np

from streammargin import ALMAClassifier
from streammargin.jit import alma as alma_jit
from streammargin.jit import calibration

N_FEATURES = 10
MODEL = b"ALMAClassifier"
_POW10 = np.array([10.0**k for k in range(23)])


@numba.njit(cache=True)
def _number(buf, at, end):
    """(value, next position) of the JSON number at buf[at] (17 digits at most kept)."""
    negative = False
    if buf[at] == 45:  # -
        negative = True
        at += 1
    mantissa = 0
    digits = 0
    scale = 0
    while at < end and 48 <= buf[at] <= 57:
        if digits < 18:
            mantissa = mantissa * 10 + (buf[at] - 48)
            digits += 1
        else:
            scale += 1
        at += 1
    if at < end and buf[at] == 46:  # .
        at += 1
        while at < end and 48 <= buf[at] <= 57:
            if digits < 18:
                mantissa = mantissa * 10 + (buf[at] - 48)
                digits += 1
                scale -= 1
            at += 1
    if at < end and (buf[at] == 101 or buf[at] == 69):  # e E
        at += 1
        sign = 1
        if buf[at] == 45:
            sign = -1
            at += 1
        elif buf[at] == 43:
            at += 1
        exponent = 0
        while at < end and 48 <= buf[at] <= 57:
            exponent = exponent * 10 + (buf[at] - 48)
            at += 1
        scale += sign * exponent
    value = float(mantissa)
    while scale < -22:
        value /= 1e22
        scale += 22
    while scale > 22:
        value *= 1e22
        scale -= 22
    value = value / _POW10[-scale] if scale < 0 else value * _POW10[scale]
    return (-value if negative else value), at


@numba.njit(cache=True)
def _after(buf, at, end, byte):
    while at < end and buf[at] != byte:
        at += 1
    return at + 1


@numba.njit(cache=True)
def parse(buf, starts, X, y, id_starts, id_ends):
    """Each envelope `{"id": "...", "x": {"k": v, ...}, "y": true}` of buf[starts[i]:starts[i
    + 1]] into X[i] (its N_FEATURES values in order), y[i] (+1.0, -1.0, 0.0 without a label)
    and the span of its id."""
    for i in range(starts.shape[0] - 1):
        at, end = starts[i], starts[i + 1]
        at = _after(buf, at, end, 58)  # "id":
        at = _after(buf, at, end, 34)  # its opening quote
        id_starts[i] = at
        at = _after(buf, at, end, 34)
        id_ends[i] = at - 1
        at = _after(buf, at, end, 123)  # "x": {
        for j in range(X.shape[1]):
            at = _after(buf, at, end, 58)  # "k":
            while buf[at] == 32:
                at += 1
            X[i, j], at = _number(buf, at, end)
        at = _after(buf, at, end, 58)  # "y":
        while buf[at] == 32:
            at += 1
        y[i] = 1.0 if buf[at] == 116 else -1.0 if buf[at] == 102 else 0.0


@numba.njit(cache=True)
def test_then_train(vectors, st, X, y, rows, signed):
    """ALMA's prediction (signed: +P(True) if the label is True, else -P(True)) then its trial
    on each of X[rows], in order: the model's own compiled step."""
    idx = np.arange(1, X.shape[1] + 1)
    xh = np.empty(X.shape[1])
    for k in range(rows.shape[0]):
        r = rows[k]
        margin = alma_jit._served_margin(vectors, st, idx, X[r], xh)
        signed[r] = calibration.signed_proba(st[alma_jit.PLATT :], margin)
        if y[r] != 0.0:
            alma_jit._learn(vectors, st, idx, X[r], y[r], xh)


@numba.njit(cache=True)
def _digits(out, at, value):
    if value == 0:
        out[at] = 48
        return at + 1
    start = at
    while value > 0:
        out[at] = 48 + value % 10
        value //= 10
        at += 1
    out[start:at] = out[start:at][::-1].copy()
    return at


@numba.njit(cache=True)
def _put(out, at, text):
    out[at : at + text.shape[0]] = text
    return at + text.shape[0]


@numba.njit(cache=True)
def encode(buf, prefixes, prefix_lengths, order, partitions, offsets, id_starts, id_ends, signed,
           y, out, ends):
    """The predictions of rows `order` (a partition's rows together, each in offset order) into
    `out`, in that order: ends[k] is where the k-th ends, and a comma follows each but the last,
    so that a run of them is the items of a JSON array."""
    at = 0
    n = order.shape[0]
    for k in range(n):
        i = order[k]
        partition = partitions[i]
        at = _put(out, at, prefixes[partition, : prefix_lengths[partition]])
        at = _digits(out, at, offsets[i])
        at = _put(out, at, np.frombuffer(b',"id":"', np.uint8))
        at = _put(out, at, buf[id_starts[i] : id_ends[i]])
        positive = signed[i] > 0.0
        at = _put(out, at, np.frombuffer(b'","y_pred":true,"p_true":' if positive
                                         else b'","y_pred":false,"p_true":', np.uint8))
        p = abs(signed[i])
        if p >= 1.0:
            at = _put(out, at, np.frombuffer(b"1.0", np.uint8))
        else:
            at = _put(out, at, np.frombuffer(b"0.", np.uint8))
            scaled = int(p * 1e16)
            for digit in range(15, -1, -1):
                out[at + digit] = 48 + scaled % 10
                scaled //= 10
            at += 16
        at = _put(out, at, np.frombuffer(b',"y":true}' if y[i] > 0 else b',"y":false}'
                                         if y[i] < 0 else b',"y":null}', np.uint8))
        ends[k] = at
        if k + 1 < n:
            out[at] = 44  # ,
            at += 1
    return at


def _prefixes(topic: str, partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Each partition's prediction prefix (up to its offset) as rows of uint8, and lengths."""
    texts = [b'{"topic":"' + topic.encode() + b'","partition":' + str(p).encode()
             + b',"model":"' + MODEL + b'","offset":' for p in range(partitions)]
    table = np.zeros((partitions, max(map(len, texts))), np.uint8)
    for p, text in enumerate(texts):
        table[p, : len(text)] = np.frombuffer(text, np.uint8)
    return table, np.array([len(text) for text in texts], np.int64)


def run(bootstrap: str, topic: str, out: str, group: str, per_message: int = 1) -> None:
    """Consume `topic`, write a prediction per record (or per `per_message`) to `out`, until
    SIGTERM."""
    from confluent_kafka import Consumer, Producer

    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
        "fetch.queue.backoff.ms": 10, "log_level": 0,
    })
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "queue.buffering.max.messages": 2_000_000, "log_level": 0})
    consumer.subscribe([topic])
    models: dict[int, ALMAClassifier] = {}
    prefixes: tuple = ()
    produce = producer.produce
    opening, closing = b'{"predictions":[', b"]}"
    while not stopping:
        # (a short wait: at 0.2 s the tail of a stream waited for a batch that never filled)
        messages = consumer.consume(10_000, 0.01)
        if not messages:
            continue
        messages = [m for m in messages if m.error() is None]
        n = len(messages)
        if not n:
            continue
        values = [m.value() for m in messages]
        partitions = np.fromiter((m.partition() for m in messages), np.int64, n)
        offsets = np.fromiter((m.offset() for m in messages), np.int64, n)
        starts = np.zeros(n + 1, np.int64)
        np.cumsum([len(v) for v in values], out=starts[1:])
        buf = np.frombuffer(b"".join(values), np.uint8)
        X = np.empty((n, N_FEATURES))
        y = np.empty(n)
        id_starts = np.empty(n, np.int64)
        id_ends = np.empty(n, np.int64)
        parse(buf, starts, X, y, id_starts, id_ends)
        signed = np.empty(n)
        order = np.argsort(partitions, kind="stable")  # each partition's rows, in offset order
        present, first_rows = np.unique(partitions[order], return_index=True)
        bounds = [*first_rows.tolist(), n]
        for j, partition in enumerate(present.tolist()):
            model = models.get(partition)
            if model is None:
                model = models[partition] = ALMAClassifier()
                model._reserve(N_FEATURES + 1)
                prefixes = _prefixes(topic, max(models) + 1)
            test_then_train(model._vectors, model._st, X, y, order[bounds[j] : bounds[j + 1]],
                            signed)
        encoded = np.empty(int(starts[-1]) + 200 * n, np.uint8)
        ends = np.empty(n, np.int64)
        encode(buf, prefixes[0], prefixes[1], order, partitions, offsets, id_starts, id_ends,
               signed, y, encoded, ends)
        predictions = encoded.tobytes()
        if per_message == 1:
            start = 0
            for i, end in zip(order.tolist(), ends.tolist()):
                message = messages[i]
                value = predictions[start:end]
                start = end + 1
                try:
                    produce(out, value, message.key(), partition=message.partition(),
                            timestamp=message.timestamp()[1])
                except BufferError:
                    producer.poll(0.05)
                    produce(out, value, message.key(), partition=message.partition(),
                            timestamp=message.timestamp()[1])
        else:
            for j, partition in enumerate(present.tolist()):
                for first in range(bounds[j], bounds[j + 1], per_message):
                    last = min(first + per_message, bounds[j + 1]) - 1
                    start = ends[first - 1] + 1 if first else 0
                    produce(out, opening + predictions[start : ends[last]] + closing,
                            partition=partition,
                            timestamp=messages[int(order[last])].timestamp()[1])
        producer.poll(0)
    producer.flush()
    consumer.close()
