"""The batch path gives what the per-record path gives, bit for bit (connectors/task/batch.py).

The per-record path (`RecordSteps.process`) is the reference. A task whose batch path is off
(`task._batch = None`) and one whose batch path is on take the same records in the same calls;
every output record (value, key, headers, timestamp), every dead letter and metrics event, the
model, the scaler, the metrics and the pending store (their saved states' bytes), the counters
and the offsets must be the same. Record mixes come from hypothesis: labelled and unlabelled
events, events waiting for their label and the labels, a label topic, bad records, categories,
booleans, nested objects, numbers in every JSON spelling, new names.

The batch reader (`event_batches.c`) is checked against hostile bytes;
`tests/test_progressive.py` checks the compiled steps against the models' own calls.
"""

from __future__ import annotations

import collections
import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.codec import DeadLetter
from connectors.serializers.mapping import FieldMapping
from connectors.serializers.registry_codec import SchemaRegistryCodec
from connectors.serializers.schema_registry import (
    RegisteredSchema,
    SchemaRegistry,
    UnknownSchema,
)
from connectors.task import PartitionTask, TaskSettings
from connectors.task import partition as partition_module
from streammargin import state
from streammargin.jit import aot

Record = collections.namedtuple("Record", "topic partition offset timestamp key value headers")

pytestmark = pytest.mark.skipif(
    aot.native("event_batches") is None or aot.native("predictions") is None,
    reason="the batch path's C modules are not built (streammargin warmup)")

# Numbers as JSON can spell them (the reader must convert each as Python's parser does).
NUMBER_TEXTS = ["0", "-0", "0.0", "-0.0", "1", "-1", "12", "0.1", "1e3", "1E-3", "1.5e+2",
                "123456789012345678", "12345678901234567890123", "9007199254740993",
                "0.30000000000000004", "2.2250738585072014e-308", "4.9e-324", "1e-400",
                "1.7976931348623157e308", "1e400", "-3.25", "0.000001234", "6.02214076e23"]


class Raw(str):
    """A number written as its text."""


def dumps(value, rng: random.Random) -> str:
    """JSON with the spacing of a few producers."""
    sep, colon = rng.choice([(",", ":"), (", ", ": "), (" ,", " : "), (",\n", ":\t")])
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + sep.join(json.dumps(k) + colon + dumps(v, rng) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + sep.join(dumps(v, rng) for v in value) + "]"
    return json.dumps(value)


KINDS = ["labelled"] * 12 + ["unlabelled", "unjoinable", "waiting", "label", "bad", "newname",
                             "category", "boolean", "nested", "array", "numbers", "escape",
                             "extra", "duplicate", "label_topic", "null_label"]


def record_stream(seed: int, n: int, multiclass: bool, flat: bool, label_topic: bool,
                  labels: list | None = None):
    """`n` records: stretches of labelled, unlabelled and waiting events (the batch path's
    runs) between stretches of every kind."""
    rng = random.Random(seed)
    waiting: list = []
    records = []
    if labels is None:
        labels = ["cat", "dog", "fox"] if multiclass else [True, False, 1, 0]
    stretch, mixed = 0, False
    for i in range(n):
        if stretch == 0:
            stretch, mixed = rng.randint(5, 60), rng.random() < 0.4
        stretch -= 1
        kind = rng.choice(KINDS if mixed else KINDS[:12] + ["unlabelled", "unjoinable",
                                                            "waiting", "label"])
        topic = "t"
        names = rng.sample(["a", "b", "c", "d"], rng.randint(2, 4)) if mixed else ["a", "b", "c"]
        x: dict = {name: round(rng.gauss(0, 2), rng.choice([1, 5, 17])) for name in names}
        y = rng.choice(labels)
        event_id = f"e{i}" if rng.random() < 0.8 else i
        if kind == "newname":
            x[f"n{rng.randrange(6)}"] = rng.random()
        elif kind == "category":
            x["country"] = rng.choice(["BR", "FR", "JP"])
        elif kind == "boolean":
            x["vip"] = rng.random() < 0.5
        elif kind == "nested":
            x["m"] = {"risk": rng.random(), "age": rng.randrange(9)}
        elif kind == "array":
            x["tags"] = ["a", 1]
        elif kind == "numbers":
            x["a"] = Raw(rng.choice(NUMBER_TEXTS))
        elif kind == "duplicate":
            x = {"a": 1.0}
        if kind == "escape":
            text = '{"id": "e\\u0031", "x": {"a": 1.5, "b\\n": 2}, "y": true}'
        elif kind == "duplicate":
            text = '{"id": "d%d", "x": {"a": 1.0, "a": 2.0, "b": 3.0}, "y": false}' % i
        elif kind == "bad":
            text = rng.choice(["not json", "", "[1, 2]", '{"id": 1.5, "x": {"a": 1}}',
                               '{"x": {"a": 1}, "y": "maybe"}', '{"x": {"a": NaN}}', "null",
                               '{"x": {"a": 1}} trailing'])
        elif kind == "label" and waiting:
            text = dumps({"id": waiting.pop(rng.randrange(len(waiting))), "y": y}, rng)
        elif kind == "label_topic" and waiting and label_topic:
            topic = "labels"
            text = dumps({"id": waiting.pop(rng.randrange(len(waiting))), "y": y}, rng)
        else:
            fields = dict(x) if flat else {"x": x}
            if kind not in ("unjoinable",):
                fields["id"] = event_id
            if kind not in ("unlabelled", "unjoinable", "waiting"):
                fields["y" if not flat else "label"] = None if kind == "null_label" else y
            if kind == "waiting":
                waiting.append(fields["id"])
            if kind == "extra":
                fields["ts"] = rng.choice(["2024-01-01", 17, [1, "x"], {"k": None}])
            keys = list(fields)
            if mixed:
                rng.shuffle(keys)
            text = dumps({k: fields[k] for k in keys}, rng)
        value = None if kind == "bad" and rng.random() < 0.2 else text.encode()
        headers = [("trace", f"{i}".encode())] if rng.random() < 0.5 else []
        timestamp = 1_700_000_000_000 + i if rng.random() < 0.9 else -1
        key = f"k{i}".encode() if rng.random() < 0.8 else None
        records.append(Record(topic, 0, i, timestamp, key, value, headers))
    return records


def run(records: list, task_settings: TaskSettings, batch: bool, calls: list[int],
        codec=None):
    """Process `records` in calls of the given sizes, as the worker does (again from each
    output's end); the outputs and the task (of the codec `codec()` makes, if given)."""
    task = PartitionTask.new("t", 0, task_settings, codec=None if codec is None else codec())
    if not batch:
        task._batch = None
    outputs = []
    at = 0
    for size in calls:
        chunk = records[at:at + size]
        at += size
        start = 0
        while start < len(chunk):
            out = task.process(chunk, start)
            outputs.append((
                list(out.predictions), list(out.dead_letters), out.metrics, out.end,
                out.processed, out.predictions.partition))
            start = out.end
    return outputs, task


def saved(task) -> tuple:
    """The task's state: the bytes of each part's saved state, counters and offsets."""
    return (
        state.dumps(task.model.to_state()),
        None if task.scaler is None else state.dumps(task.scaler.to_state()),
        state.dumps(task.metrics.to_state()),
        state.dumps(task.pending.to_state()),
        task.counters(), task.next_offset, task.label_next_offset,
        None if task.scaler is None else dict(task.scaler.counters),
    )


def check_same(records, task_settings, calls, codec=None):
    expected, reference = run(records, task_settings, False, calls, codec)
    got, task = run(records, task_settings, True, calls, codec)
    assert got == expected
    assert saved(task) == saved(reference)
    return task


SETTINGS = {
    "alma": dict(model="alma"),
    "mpu": dict(model="mpu"),
    "cpm": dict(model="convexpolytope"),
    "cpm-one": dict(model="convexpolytope", params={"polytopes": "one"}),
}


MAPPINGS = {
    "envelope": FieldMapping(),
    "flat": FieldMapping(features=("*",), label_field="label"),
    "flat-hash": FieldMapping(features=("*",), label_field="label", categorical="hash"),
    "flat-drop": FieldMapping(features=("*",), label_field="label", categorical="drop"),
    "flat-exclude": FieldMapping(features=("*",), label_field="label",
                                 exclude_features=("b", "m.age")),
    "flat-positive": FieldMapping(features=("*",), label_field="label",
                                  positive_label="fraud"),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
@given(seed=st.integers(0, 2**32 - 1), scale=st.booleans(), mapping=st.sampled_from(sorted(MAPPINGS)),
       detector=st.sampled_from(["ddm", "none", "adwin"]),
       metrics_every=st.sampled_from([7, 50, 10_000]),
       label_topic=st.booleans(), copy=st.sampled_from(["all", "none", ("trace",)]),
       calls=st.lists(st.integers(1, 400), min_size=1, max_size=4))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_batch_path_gives_the_per_record_paths_outputs_and_state(
        name, seed, scale, mapping, detector, metrics_every, label_topic, copy, calls):
    multiclass = name == "cpm"
    flat = mapping != "envelope"
    labels = None
    if mapping == "flat-positive":
        if multiclass:
            mapping = "flat"
        else:
            labels = ["fraud", "legit", "fraud", 7]
    task_settings = TaskSettings(
        **SETTINGS[name], scale=scale, mapping=MAPPINGS[mapping], drift_detector=detector,
        drift_params={"warm_start": 20} if detector == "ddm" else {},
        metrics_every=metrics_every, label_topic="labels" if label_topic else None,
        copy_headers=copy, max_record_bytes=400)
    records = record_stream(seed, sum(calls), multiclass, flat, label_topic, labels)
    task = check_same(records, task_settings, calls)
    if detector != "adwin" and sum(calls) > 400:
        assert task._batch.records_taken > 0

def test_a_stream_of_known_records_takes_the_batch_path_and_detects_drift():
    # A long run of one skeleton: most records go the batch way, a drift is detected in it.
    rng = random.Random(3)
    records = []
    for i in range(4000):
        x = {str(j): rng.random() for j in range(5)}
        truth = (x["0"] > 0.5) if i < 2000 else (x["0"] < 0.5)
        records.append(Record("t", 0, i, 1_700_000_000_000 + i, f"k{i}".encode(),
                              json.dumps({"id": f"e{i}", "x": x, "y": truth}).encode(), []))
    task_settings = TaskSettings(model="alma", scale=True, metrics_every=1000)
    task = check_same(records, task_settings, [1000] * 4)
    assert task.metrics.n_detections >= 1
    assert task._batch.records_taken > 3000


def test_the_checkpoint_of_the_batch_path_is_the_per_record_paths(monkeypatch):
    monkeypatch.setattr(partition_module.time, "time", lambda: 1234.5)
    records = record_stream(11, 600, False, False, False)
    task_settings = TaskSettings(model="alma", scale=True, metrics_every=100)
    _, reference = run(records, task_settings, False, [300, 300])
    _, task = run(records, task_settings, True, [300, 300])
    assert task.to_checkpoint() == reference.to_checkpoint()
    restored = PartitionTask.restore(task.to_checkpoint(), "t", 0, task_settings)
    more = record_stream(12, 200, False, False, False)
    more = [r._replace(offset=r.offset + 600) for r in more]
    assert [list(restored.process(more).predictions)] == [list(reference.process(more).predictions)]


# Avro behind a Schema Registry --------------------------------------------------------------------


class MemoryRegistry(SchemaRegistry):
    """The registry client, its schemas from here (its cache and its bounds are the client's)."""

    def __init__(self, schemas: dict[int, dict], capacity: int):
        super().__init__({"url": "http://memory", "cache.capacity": str(capacity)})
        self.schemas = schemas

    def _fetch(self, schema_id):
        self.requests["schema"] += 1
        if schema_id not in self.schemas:
            raise UnknownSchema(f"unknown schema id {schema_id}")
        return RegisteredSchema(schema_id, "AVRO", json.dumps(self.schemas[schema_id]), {})


_COUNTRY = {"type": "enum", "name": "C", "symbols": ["BR", "FR", "JP"]}
AVRO_SCHEMAS = {
    # flat: every field a feature but the id, the label (and those excluded)
    1: {"type": "record", "name": "P", "fields": [
        {"name": "id", "type": ["null", "string"]}, {"name": "amount", "type": "double"},
        {"name": "ratio", "type": "float"}, {"name": "count", "type": "int"},
        {"name": "big", "type": "long"}, {"name": "vip", "type": "boolean"},
        {"name": "country", "type": _COUNTRY}, {"name": "city", "type": ["null", "string"]},
        {"name": "note", "type": ["null", "double"]}, {"name": "ts", "type": "string"},
        {"name": "y", "type": ["null", "boolean"]}]},
    # the same topic's other version: another order, an id of type long
    2: {"type": "record", "name": "P", "fields": [
        {"name": "y", "type": "boolean"}, {"name": "amount", "type": "double"},
        {"name": "id", "type": "long"}, {"name": "extra", "type": "double"}]},
    # no plan (an array): the per-record path
    3: {"type": "record", "name": "P", "fields": [
        {"name": "id", "type": "string"}, {"name": "amount", "type": "double"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "y", "type": ["null", "boolean"]}]},
    # a label for an event that waits for it
    4: {"type": "record", "name": "L", "fields": [
        {"name": "id", "type": "string"}, {"name": "y", "type": "boolean"}]},
    # the envelope: the features in record x
    5: {"type": "record", "name": "E", "fields": [
        {"name": "id", "type": ["null", "string"]},
        {"name": "x", "type": {"type": "record", "name": "X", "fields": [
            {"name": "amount", "type": "double"}, {"name": "count", "type": "int"},
            {"name": "note", "type": ["null", "double"]}, {"name": "country", "type": _COUNTRY},
            {"name": "city", "type": "string"}]}},
        {"name": "y", "type": ["null", "boolean"]}]},
}
AVRO_MAPPINGS = {
    "flat": FieldMapping(features=("*",)),
    "flat-exclude": FieldMapping(features=("*",), exclude_features=("ts", "note")),
    "flat-drop": FieldMapping(features=("*",), categorical="drop"),
    "envelope": FieldMapping(),
    "envelope-exclude": FieldMapping(exclude_features=("x.count",)),
}
AVRO_KINDS = ["labelled"] * 10 + ["unlabelled", "waiting", "label", "other_version", "no_plan",
                                  "unknown", "garbage", "cut", "trailing", "nan", "quote_id",
                                  "bad_utf8", "long_city", "label_topic", "null_id"]


def avro_payload(schema_id: int, record: dict) -> bytes:
    import io

    import fastavro

    from connectors.serializers import wire

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_SCHEMAS[schema_id]), record)
    return wire.frame(schema_id, out.getvalue())


def avro_stream(seed: int, n: int, envelope: bool, label_topic: bool):
    """`n` framed Avro records: stretches of one schema's labelled, unlabelled and waiting
    events between stretches of every kind."""
    rng = random.Random(seed)
    waiting: list = []
    records = []
    stretch, mixed = 0, False
    for i in range(n):
        if stretch == 0:
            stretch, mixed = rng.randint(5, 60), rng.random() < 0.4
        stretch -= 1
        kind = rng.choice(AVRO_KINDS if mixed else AVRO_KINDS[:12])
        topic = "t"
        y = rng.random() < 0.5
        event_id = f"e{i}"
        amount = round(rng.gauss(0, 2), rng.choice([1, 5, 17]))
        city = rng.choice([None, "Recife", "Lyon"]) if mixed else "Lyon"
        if kind in ("label", "label_topic") and waiting:
            topic = "labels" if kind == "label_topic" and label_topic else "t"
            value = avro_payload(4, {"id": waiting.pop(rng.randrange(len(waiting))), "y": y})
        elif kind == "other_version":
            value = avro_payload(2, {"y": y, "amount": amount, "id": i, "extra": rng.random()})
        elif kind == "no_plan":
            value = avro_payload(3, {"id": event_id, "amount": amount, "tags": ["a"], "y": y})
        elif kind == "unknown":
            value = b"\\x00\\x00\\x00\\x00\\x09" + bytes(rng.randrange(20))
        elif kind == "garbage":
            value = rng.choice([b"", b"\\x00", b"\\x01\\x00\\x00\\x00\\x01\\x02", None,
                                bytes(rng.randrange(256) for _ in range(rng.randrange(30)))])
        else:
            if kind in ("waiting", "unlabelled"):
                y = None
            if kind == "null_id":
                event_id = None
            elif kind == "quote_id":
                event_id = 'e"' + str(i)
            if envelope:
                record = {"id": event_id, "x": {
                    "amount": float("nan") if kind == "nan" else amount,
                    "count": rng.randrange(-5, 5), "note": rng.choice([None, rng.random()]),
                    "country": rng.choice(["BR", "FR", "JP"]) if mixed else "FR",
                    "city": "x" * 300 if kind == "long_city" else city or "Natal"}, "y": y}
            else:
                record = {"id": event_id, "amount": float("nan") if kind == "nan" else amount,
                          "ratio": rng.random(), "count": rng.randrange(-2**31, 2**31),
                          "big": rng.choice([rng.randrange(-9, 9), 2**53 + 1, -(2**63)]),
                          "vip": rng.random() < 0.5 if mixed else False,
                          "country": rng.choice(["BR", "FR", "JP"]) if mixed else "FR",
                          "city": "x" * 300 if kind == "long_city" else city,
                          "note": rng.choice([None, rng.random()]),
                          "ts": rng.choice(["2024", "2025"]) if mixed else "2024", "y": y}
            if kind == "bad_utf8":
                record["x" if envelope else "id"] = (
                    {**record["x"], "city": "zz"} if envelope else "zz")
            value = avro_payload(5 if envelope else 1, record)
            if kind == "bad_utf8":
                value = value.replace(b"zz", b"\\xff\\xfe")
            elif kind == "cut":
                value = value[:-1]
            elif kind == "trailing":
                value += b"\\x00"
            if kind == "waiting" and event_id is not None:
                waiting.append(event_id)
        headers = [("trace", f"{i}".encode())] if rng.random() < 0.5 else []
        timestamp = 1_700_000_000_000 + i if rng.random() < 0.9 else -1
        key = f"k{i}".encode() if rng.random() < 0.8 else None
        records.append(Record(topic, 0, i, timestamp, key, value, headers))
    return records


@pytest.mark.parametrize("name", ["alma", "mpu", "cpm-one"])
@given(seed=st.integers(0, 2**32 - 1), scale=st.booleans(),
       mapping=st.sampled_from(sorted(AVRO_MAPPINGS)), capacity=st.sampled_from([1000, 2]),
       label_topic=st.booleans(), calls=st.lists(st.integers(1, 400), min_size=1, max_size=4))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_batch_path_of_avro_gives_the_per_record_paths_outputs_and_state(
        name, seed, scale, mapping, capacity, label_topic, calls):
    # (capacity 2: the registry's cache lets schemas go, and the per-record path fetches them
    # again: the plans of the batch path are forgotten with them)
    task_settings = TaskSettings(
        **SETTINGS[name], scale=scale, mapping=AVRO_MAPPINGS[mapping], metrics_every=50,
        label_topic="labels" if label_topic else None, max_record_bytes=400,
        drift_params={"warm_start": 20})
    records = avro_stream(seed, sum(calls), mapping.startswith("envelope"), label_topic)

    def codec():
        return SchemaRegistryCodec("avro", MemoryRegistry(AVRO_SCHEMAS, capacity),
                                   AVRO_MAPPINGS[mapping], max_record_bytes=400)

    task = check_same(records, task_settings, calls, codec)
    if sum(calls) > 400 and mapping != "flat":  # (flat: its free-text category, a skeleton each)
        assert task._batch.records_taken > 0


# The reader on hostile bytes ----------------------------------------------------------------------


@given(data=st.binary(max_size=300), prefix=st.sampled_from(
    [b"", b'{"id": "a", "x": {"a": ', b'{"x": {"a": 1.5, "b": ', b'{"id": 1, "y": ']))
@settings(max_examples=300, deadline=None)
def test_the_reader_takes_any_bytes_and_reads_only_what_the_codec_reads(data, prefix):
    from connectors.serializers.batches import batches_of
    from connectors.serializers.json_format import JSONCodec

    codec = JSONCodec()
    reader = batches_of(codec)
    value = prefix + data
    skeleton, shape = reader.describe(value)
    if shape is not None:
        event_id, x, y = codec.decode(value)
        assert list(x) == [name for name, _, _ in shape.entries]
    records = [Record("t", 0, 0, 0, None, value, [])]
    status = np.empty(1, np.int8)
    rows = np.empty((1, 3), np.int64)
    holes = np.empty(len(value) + 8)
    ids = np.empty(len(value) + 24, np.uint8)
    id_ends = np.empty(1, np.int64)
    skeletons = {} if skeleton is None else {skeleton: 0 if shape is not None else -1}
    read, _, _ = reader.read(records, 0, 1, skeletons, ((b"true", 1), (b"false", 0)), status,
                             rows, holes, ids, id_ends)
    assert read == 1 and status[0] in range(6)
    if status[0] == 0:
        assert shape is not None and skeleton is not None


@given(number=st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,3})?",
                  fullmatch=True)))
@settings(max_examples=1000, deadline=None)
def test_the_reader_reads_a_number_as_pythons_json_does(number):
    import struct

    from connectors.serializers.batches import batches_of
    from connectors.serializers.json_format import JSONCodec

    reader = batches_of(JSONCodec())
    found = reader._module.describe_json(b'{"x": {"a": ' + number.encode() + b"}}", reader.config)
    expected = json.loads(number)
    expected = float(expected)
    if found is None:  # (beyond float64: the per-record path decides)
        assert expected in (float("inf"), float("-inf"))
        return
    [got] = found[1]
    assert struct.pack("<d", got) == struct.pack("<d", expected)


@pytest.mark.parametrize("name", ["alma", "cpm"])
def test_predict_many_gives_what_the_task_predicts_for_an_unlabelled_event(name):
    multiclass = name == "cpm"
    task_settings = TaskSettings(**SETTINGS[name], scale=True, mapping=MAPPINGS["flat"])
    records = record_stream(5, 600, multiclass, True, False)
    _, task = run(records, task_settings, True, [600])
    rng = random.Random(6)
    events = [{"amount": rng.gauss(0, 2), "a": rng.random(), "b": rng.random(),
               "country": rng.choice(["BR", "FR", "XX"]), "vip": rng.random() < 0.5}
              for _ in range(50)]
    xs = [task.codec.decode(json.dumps(event).encode())[1] for event in events]
    labels, probas = task.predict_many(xs)
    task._batch = None  # the per-record path: the prediction records of the same events
    out = task.process([Record("t", 0, 600 + i, 0, None, json.dumps(event).encode(), [])
                        for i, event in enumerate(events)])
    written = [json.loads(value) for value in out.predictions.values]
    if multiclass:
        assert [w["y_pred"] for w in written] == labels
        assert [w["proba"] for w in written] == [{k: v for k, v in p.items()} for p in probas]
    else:
        assert [w["y_pred"] for w in written] == labels
        assert [w["p_true"] for w in written] == [p[True] for p in probas]


@given(data=st.data(), envelope=st.booleans())
@settings(max_examples=300, deadline=None)
def test_an_avro_record_the_reader_reads_gives_the_event_the_codec_gives(data, envelope):
    # A record of a learnt skeleton, its bytes mutated: read as a row, its numbers in its
    # skeleton's shape are the codec's event, bit for bit; else it is not a row.
    import struct

    from connectors.serializers.batches import batches_of

    mapping = AVRO_MAPPINGS["envelope" if envelope else "flat"]
    codec = SchemaRegistryCodec("avro", MemoryRegistry(AVRO_SCHEMAS, 1000), mapping)
    reader = batches_of(codec)
    original = avro_stream(data.draw(st.integers(0, 2**32 - 1)), 1, envelope, False)[0].value
    if original is None or original[:5] not in (b"\0\0\0\0\1", b"\0\0\0\0\5"):
        return
    try:
        codec.decode(original)  # (the per-record path: the schema into the registry's cache)
    except DeadLetter:
        return
    skeleton, shape = reader.describe(original)
    if shape is None:
        return
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(5, len(mutated) - 1))
        mutated[at] = data.draw(st.integers(0, 255))
    mutated = bytes(mutated)
    status = np.empty(1, np.int8)
    rows = np.empty((1, 3), np.int64)
    holes = np.empty(len(mutated) + 8)
    ids = np.empty(len(mutated) + 24, np.uint8)
    id_ends = np.empty(1, np.int64)
    labels = ((b"true", 1), (b"false", 0), (b"null", -1))
    read, _, _ = reader.read([Record("t", 0, 0, 0, None, mutated, [])], 0, 1, {skeleton: 0},
                             labels, status, rows, holes, ids, id_ends)
    assert read == 1
    if status[0] != 0:
        return
    event_id, x, y = codec.decode(mutated)
    first = int(rows[0, 1])
    assert list(x) == [name for name, _, _ in shape.entries]
    for name, hole, constant in shape.entries:
        if hole is None:
            assert x[name] == constant and type(x[name]) is type(constant)
        else:
            assert struct.pack("<d", float(x[name])) == struct.pack("<d", holes[first + hole])
    assert json.loads(ids[:int(id_ends[0])].tobytes()) == event_id
    assert int(rows[0, 2]) == {True: 1, False: 0, None: -1}[y]
