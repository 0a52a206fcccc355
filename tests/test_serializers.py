"""Record formats without a broker: the field mapping's rules on hand-computed cases, each format's
decoder against a client this project did not write (fastavro, protobuf's runtime), and hostile
bytes: payloads, schemas and registry answers that must give a dead letter (or `ValueError` for a
schema), in bounded time and memory, and nothing else.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import threading
import time
import tracemalloc

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protobuf_messages
from connectors.codec import DeadLetter, InvalidFeature, InvalidLabel, InvalidRecord
from connectors.serializers import avro, protobuf, wire
from connectors.serializers.json_format import JSONCodec
from connectors.observability.observability import dead_letter_kind
from connectors.serializers.mapping import (
    LEFT_OUT_KINDS,
    MAX_LEFT_OUT_NAMES,
    FieldMapping,
    parse_path,
    split_indicators,
)
from connectors.serializers.outputs import AvroOutputs, metrics_schema, prediction_schema
from connectors.serializers.registry_codec import SchemaRegistryCodec
from connectors.serializers.schema_registry import (
    RegisteredSchema,
    RegistryRefused,
    RegistryUnavailable,
    SchemaRefused,
    SchemaRegistry,
    UnknownSchema,
    check_settings,
)

# The field mapping --------------------------------------------------------------------------------

PAYMENT = {"transaction_id": "t7", "amount": 31.2, "country": "BR", "card_present": False,
           "merchant": {"category": "travel", "risk": 0.91}, "is_fraud": True, "note": None}
FLAT = {"label_field": "is_fraud", "id_field": "transaction_id", "features": ("*",)}


def event(record, key=None, **options):
    return FieldMapping(**options).mapper().event(record, key)


def test_every_field_but_the_id_and_label_is_a_feature_flattened_by_dotted_names():
    assert event(PAYMENT, **FLAT) == ("t7", {
        "amount": 31.2, "country=BR": True, "card_present": 0,
        "merchant.category=travel": True, "merchant.risk": 0.91}, True)


@pytest.mark.parametrize(("options", "features"), [
    ({"features": ("merchant",)}, {"merchant.category=travel": True, "merchant.risk": 0.91}),
    ({"features": ("merchant.*",)}, {"category=travel": True, "risk": 0.91}),
    ({"features": ("amount", "merchant.risk")}, {"amount": 31.2, "merchant.risk": 0.91}),
    ({"exclude_features": ("merchant.category", "country")},
     {"amount": 31.2, "card_present": 0, "merchant.risk": 0.91}),
    ({"categorical": "drop"}, {"amount": 31.2, "card_present": 0, "merchant.risk": 0.91}),
])
def test_features_are_selected_named_and_excluded_by_path(options, features):
    assert event(PAYMENT, **{**FLAT, **options})[1] == features


def test_hashed_categories_go_to_a_bucket_of_their_field_by_crc32():
    import zlib

    x = event(PAYMENT, **FLAT, categorical="hash", hash_buckets=16)[1]
    assert x[f"country#{zlib.crc32(b'BR') % 16}"] is True
    assert sum(1 for name in x if "#" in name) == 2


def test_a_path_escapes_dots_with_a_backslash():
    assert parse_path(r"a\.b.c") == ("a.b", "c")
    assert event({"a.b": {"c": 2.0}, "y": 1}, features=(r"a\.b.c",))[1] == {"a.b.c": 2.0}
    with pytest.raises(ValueError, match="empty segment"):
        parse_path("a..b")


def test_the_defaults_read_the_envelope_with_the_names_it_always_had():
    assert event({"id": "a1", "x": {"amount": 12.5, "n": 3}, "y": 1}) == (
        "a1", {"amount": 12.5, "n": 3}, True)
    assert event({"id": "a2", "y": 0}) == ("a2", None, False)  # a label record
    assert event({"x": {}, "y": True}) == (None, {}, True)  # an event without features


def test_a_record_without_features_or_label_names_its_fields_and_the_fix():
    with pytest.raises(InvalidRecord) as refused:
        event(PAYMENT)
    assert "'transaction_id', 'amount'" in str(refused.value)
    assert "--features '*'" in str(refused.value)


# Values that cannot be features, what each is counted as when a wildcard reaches it, and the
# reason of the dead letter when --features names the field.
NO_FEATURES = [
    ("tags", ["a"], "array", "field 'tags' holds an array"),
    ("tags", [], "array", "field 'tags' holds an array"),
    ("blob", b"\x00", "bytes", "field 'blob' holds bytes"),
    ("a", float("nan"), "non_finite", "field 'a' has value nan"),
    ("a", float("-inf"), "non_finite", "field 'a' has value -inf"),
    ("a", 10 ** 400, "non_finite", "too large for a float64"),
    ("a", "x" * 300, "long_string", "a string of 300 characters"),
]


@pytest.mark.parametrize(("field", "value", "kind", "reason"), NO_FEATURES)
def test_a_wildcard_leaves_out_what_cannot_be_a_feature_and_counts_it(field, value, kind, reason):
    mapper = FieldMapping(features=("*",)).mapper()
    assert mapper.event({"id": 1, "b": 2.0, field: value, "y": 0}) == (1, {"b": 2.0}, False)
    assert mapper.event({"id": 2, "b": 3.0, field: value}) == (2, {"b": 3.0}, None)
    assert mapper.left_out == {**dict.fromkeys(LEFT_OUT_KINDS, 0), kind: 2}
    assert mapper.left_out_fields == {field: kind}
    assert mapper.new_left_out == [(field, kind)]  # named once, however often left out
    # The same inside an object a wildcard or --features reaches, named by its path.
    for features in (("*",), ("m",), ("m.*",)):
        mapper = FieldMapping(features=features).mapper()
        assert mapper.event({"m": {"b": 2.0, field: value}, "y": 1}) == (
            None, {"m.b" if features != ("m.*",) else "b": 2.0}, True)
        assert mapper.left_out_fields == {f"m.{field}": kind}


@pytest.mark.parametrize(("field", "value", "kind", "reason"), NO_FEATURES)
def test_a_field_that_features_names_and_cannot_be_one_is_a_dead_letter(field, value, kind,
                                                                        reason):
    mapper = FieldMapping(features=("b", field)).mapper()
    with pytest.raises(InvalidFeature, match=reason) as refused:
        mapper.event({"b": 2.0, field: value, "y": 0})
    assert f"--features names it. Fix: " in str(refused.value)
    assert f"take {field} out of --features" in str(refused.value)
    assert mapper.left_out == dict.fromkeys(LEFT_OUT_KINDS, 0)
    assert dead_letter_kind(str(refused.value)) == (
        "non_finite" if kind == "non_finite" else "not_a_number")


def test_left_out_fields_are_named_within_their_bound():
    mapper = FieldMapping(features=("*",)).mapper()
    for i in range(MAX_LEFT_OUT_NAMES + 10):
        mapper.event({f"f{i}": [i], "a": 1.0, "y": 1})
    assert len(mapper.left_out_fields) == MAX_LEFT_OUT_NAMES
    assert mapper.left_out["array"] == MAX_LEFT_OUT_NAMES + 10


@pytest.mark.parametrize(("record", "error", "reason"), [
    ({"a": 1.0, "y": "spam"}, InvalidLabel, "unknown label 'spam'"),
    ({"a": 1.0, "id": 1.5}, InvalidRecord, "id 1.5 must be a string or an integer"),
    ({"tags": ["a"], "blob": b"1"}, InvalidRecord, "no features and no label"),
])
def test_bad_labels_ids_and_records_of_nothing_are_dead_letters(record, error, reason):
    with pytest.raises(error, match=reason):
        event(record, features=("*",))


def test_deep_objects_are_a_dead_letter_not_a_recursion():
    record: dict = {"y": 1}
    inner = record
    for _ in range(100):
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(InvalidFeature, match="deeper than"):
        event(record, features=("*",))


def test_the_key_as_the_id_and_label_records():
    mapper = FieldMapping(id_from_key=True, features=("*",)).mapper()
    assert mapper.event({"a": 1.0}, b"k1") == ("k1", {"a": 1.0}, None)
    assert mapper.label({"y": True, "ignored": "x"}, b"k1") == ("k1", True)
    with pytest.raises(InvalidRecord, match="not UTF-8"):
        mapper.event({"a": 1.0}, b"\xff")
    with pytest.raises(InvalidRecord, match="without a label"):
        mapper.label({"a": 1.0}, b"k1")


def test_indicators_are_the_features_of_value_true_and_booleans_are_numbers():
    x = event(PAYMENT, **FLAT)[1]
    numbers, indicators = split_indicators(x)
    assert indicators == {"country=BR": True, "merchant.category=travel": True}
    assert numbers == {"amount": 31.2, "card_present": 0, "merchant.risk": 0.91}


@given(st.dictionaries(st.text(max_size=3), st.one_of(st.just(True), st.floats(), st.integers(),
                                                     st.booleans()), max_size=8))
def test_the_c_split_is_the_python_one(x):
    from connectors.serializers import mapping as mapping_module

    if mapping_module._native_module() is None:
        pytest.skip("events.c is not built (streammargin warmup builds it)")
    split = mapping_module.indicator_splitter()
    numbers, indicators = split(x)
    assert (numbers, indicators) == split_indicators(x)
    assert list(numbers) == list(split_indicators(x)[0])


def test_bad_mapping_options_fail_when_made():
    with pytest.raises(ValueError, match="same field"):
        FieldMapping(label_field="a", id_field="a")
    with pytest.raises(ValueError, match="categorical"):
        FieldMapping(categorical="ordinal")
    with pytest.raises(ValueError, match="hash_buckets"):
        FieldMapping(hash_buckets=0)


def test_one_hot_categories_reach_alma_through_the_scaler():
    """The issue's measurement: a concept linear in two categories. Without the indicators'
    pass-through the scaler makes each indicator 0, and ALMA sees nothing of them."""
    import random

    from connectors.task import PartitionTask, TaskSettings

    rng = random.Random(3)
    values = []
    for i in range(4_000):
        a, b = rng.choice("pqrs"), rng.choice("uvwx")
        label = (a in "pq") or (b == "u")
        values.append(json.dumps({"id": i, "a": a, "b": b, "noise": rng.random(),
                                  "y": label}).encode())
    records = [_Record("t", 0, i, 0, None, v, []) for i, v in enumerate(values)]

    def accuracy(categorical: str) -> float:
        mapping = FieldMapping(features=("*",), categorical=categorical)
        task = PartitionTask.new("t", 0, TaskSettings(scale=True, mapping=mapping))
        out = task.process(records)
        while out.end < len(records):
            out = task.process(records, out.end)
        return task.metrics.accuracy

    one_hot, dropped = accuracy("onehot"), accuracy("drop")
    assert one_hot > 0.95 and dropped < 0.8, (one_hot, dropped)


class _Record(tuple):
    def __new__(cls, *fields):
        return super().__new__(cls, fields)

    topic = property(lambda s: s[0])
    partition = property(lambda s: s[1])
    offset = property(lambda s: s[2])
    timestamp = property(lambda s: s[3])
    key = property(lambda s: s[4])
    value = property(lambda s: s[5])
    headers = property(lambda s: s[6])


# A registry without HTTP for the codecs' unit tests -----------------------------------------------


class _Schemas:
    """A `SchemaRegistry`'s `schema` over schemas given here (the HTTP client has its own tests
    below, and the registry tests run on Apicurio)."""

    max_schema_bytes = 1 << 20
    url = "memory"

    def __init__(self, schemas: dict[int, tuple[str, str]]):
        self.schemas = schemas

    def schema(self, schema_id, parse, kind):
        if schema_id not in self.schemas:
            raise UnknownSchema(f"unknown schema id {schema_id}")
        schema_type, text = self.schemas[schema_id]
        try:
            return parse(RegisteredSchema(schema_id, schema_type, text, {}))
        except SchemaRefused:
            raise
        except ValueError as error:
            raise SchemaRefused(str(error)) from None


AVRO_SCHEMA = {"type": "record", "name": "P", "fields": [
    {"name": "id", "type": ["null", "string", "long"]},
    {"name": "amount", "type": "double"}, {"name": "ratio", "type": "float"},
    {"name": "count", "type": "int"}, {"name": "big", "type": "long"},
    {"name": "flag", "type": "boolean"},
    {"name": "country", "type": {"type": "enum", "name": "C", "symbols": ["BR", "FR", "US"]}},
    {"name": "merchant", "type": {"type": "record", "name": "M", "fields": [
        {"name": "category", "type": "string"}, {"name": "risk", "type": ["null", "double"]}]}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "fee", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                             "scale": 3}},
    # 8 bytes hold 18 digits: the decimal of issue 45, which every record once dead-lettered
    {"name": "price", "type": {"type": "fixed", "name": "Price", "size": 8,
                               "logicalType": "decimal", "precision": 12, "scale": 3}},
    {"name": "code", "type": {"type": "fixed", "name": "F", "size": 3}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "counters", "type": {"type": "map", "values": "long"}},
    {"name": "y", "type": ["null", "boolean"]},
]}
_avro_records = st.fixed_dictionaries({
    "id": st.one_of(st.none(), st.text(max_size=8), st.integers(-2**63, 2**63 - 1)),
    "amount": st.floats(allow_nan=False, allow_infinity=False),
    "ratio": st.floats(width=32, allow_nan=False, allow_infinity=False),
    "count": st.integers(-2**31, 2**31 - 1), "big": st.integers(-2**63, 2**63 - 1),
    "flag": st.booleans(), "country": st.sampled_from(["BR", "FR", "US"]),
    "merchant": st.fixed_dictionaries({"category": st.text(max_size=10),
                                       "risk": st.one_of(st.none(), st.floats(0, 1))}),
    "ts": st.integers(0, 2**42), "day": st.integers(0, 10**5),
    "fee": st.integers(-10**11, 10**11),
    "price": st.one_of(st.integers(-10**12 + 1, 10**12 - 1),
                       st.sampled_from([0, -1, 10**12 - 1, -10**12 + 1])),
    "code": st.binary(min_size=3, max_size=3),
    "tags": st.lists(st.text(max_size=4), max_size=4),
    "counters": st.dictionaries(st.text(max_size=4), st.integers(-10**9, 10**9), max_size=4),
    "y": st.one_of(st.none(), st.booleans()),
})


def fastavro_payload(record: dict, schema: dict = AVRO_SCHEMA) -> bytes:
    import decimal

    out = io.BytesIO()
    written = dict(record)
    for name in ("fee", "price"):  # (the unscaled integers, as decimals of scale 3)
        if name in written:
            written[name] = decimal.Decimal(written[name]).scaleb(-3)
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), written)
    return out.getvalue()


def avro_codec(schema: dict = AVRO_SCHEMA, **mapping) -> SchemaRegistryCodec:
    registry = _Schemas({1: ("AVRO", json.dumps(schema))})
    return SchemaRegistryCodec("avro", registry, FieldMapping(**mapping))


@settings(max_examples=150, deadline=None)
@given(_avro_records)
def test_avro_of_fastavro_decodes_into_the_tree_fastavro_reads(record):
    decoded = avro.AvroDecoder(avro.parse_schema(json.dumps(AVRO_SCHEMA))).decode(
        fastavro_payload(record))
    expected = {**record, "fee": record["fee"] / 1000, "price": record["price"] / 1000,
                "ratio": decoded["ratio"]}
    assert decoded == expected
    # float32: fastavro's own reading of the 4 bytes
    assert decoded["ratio"] == fastavro.schemaless_reader(
        io.BytesIO(fastavro_payload(record)), fastavro.parse_schema(AVRO_SCHEMA))["ratio"]


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_avro_records, st.data())
def test_a_mutated_avro_payload_is_an_event_or_a_dead_letter(record, data):
    codec = avro_codec(features=("*",), exclude_features=("tags", "code"))
    payload = bytearray(wire.frame(1, fastavro_payload(record)))
    for _ in range(data.draw(st.integers(1, 4))):
        how = data.draw(st.sampled_from(["flip", "cut", "insert", "varint"]))
        at = data.draw(st.integers(0, max(0, len(payload) - 1)))
        if how == "flip" and payload:
            payload[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del payload[at:]
        elif how == "insert":
            payload[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        else:  # a huge or negative varint where a length or a block count is read
            payload[at:at] = data.draw(st.sampled_from(
                [b"\xff" * 9 + b"\x7f", b"\x01", b"\xfe\xff\xff\xff\x0f", b"\xff" * 11]))
    _event_or_dead_letter(codec, bytes(payload))


def _event_or_dead_letter(codec, payload: bytes) -> None:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        codec.decode(payload)
    except DeadLetter:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - started < 2.0
    # Nothing allocated beyond the record's size, give or take the objects of its tree.
    assert peak < 200 * len(payload) + (1 << 20), (peak, len(payload))


ZERO_SIZE = {"type": "record", "name": "Z", "fields": [
    {"name": "nothing", "type": {"type": "array", "items": "null"}},
    {"name": "empties", "type": {"type": "array", "items": {
        "type": "record", "name": "E", "fields": []}}}]}


@pytest.mark.parametrize(("payload", "reason"), [
    # 2**62 nulls: fastavro would loop for ever.
    (b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f", "more than the payload's"),
    # a negative block count with its size in bytes: -2**62 nulls
    (b"\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x00", "more than the payload's"),
    (b"\x06\x00\x06\x00", "more than the payload's"),  # 3 nulls, then 3 empty records: 6 > 4
    (b"\xff" * 11, "longer than ten bytes"),
    (b"", "truncated"),
])
def test_hostile_block_counts_and_varints_are_refused_before_any_allocation(payload, reason):
    decoder = avro.AvroDecoder(avro.parse_schema(json.dumps(ZERO_SIZE)))
    tracemalloc.start()
    with pytest.raises(avro.AvroDataError, match=reason):
        decoder.decode(payload)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 64 << 10


def test_zero_size_items_are_bounded_by_the_payloads_bytes():
    decoder = avro.AvroDecoder(avro.parse_schema(json.dumps(ZERO_SIZE)))
    assert decoder.decode(b"\x04\x00\x00") == {"nothing": [None, None], "empties": []}


def test_a_recursive_schema_reads_values_up_to_the_depth_bound_only():
    linked = {"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}
    decoder = avro.AvroDecoder(avro.parse_schema(json.dumps(linked)))
    assert decoder.decode(b"\x02\x02\x04\x00") == {"value": 1, "next": {"value": 2, "next": None}}
    deep = b"\x02\x02" * 10_000 + b"\x02\x00"
    with pytest.raises(avro.AvroDataError, match="deeper than"):
        decoder.decode(deep)


@pytest.mark.parametrize(("schema", "reason"), [
    ("x" * (2 << 20), "more than"),
    ("[" * 5000 + "]" * 5000, "too deeply"),
    (json.dumps({"type": "record", "name": "1bad", "fields": []}), "not an Avro name"),
    (json.dumps(["null", ["int"]]), "a union directly inside a union"),
    (json.dumps(["int", "int"]), "two branches"),
    (json.dumps({"type": "enum", "name": "E", "symbols": ["A", "A"]}), "distinct"),
    (json.dumps({"type": "fixed", "name": "F", "size": 10 ** 9}), "size"),
    (json.dumps({"type": "nope"}), "unknown type"),
])
def test_hostile_avro_schemas_are_refused(schema, reason):
    with pytest.raises(avro.AvroSchemaError, match=reason):
        avro.parse_schema(schema)


def test_an_avro_schema_of_too_many_types_is_refused():
    schema = json.dumps({"type": "record", "name": "A", "fields": [
        {"name": f"a{i}", "type": "int"} for i in range(30_000)]})
    with pytest.raises(avro.AvroSchemaError, match="more than 20000 types"):
        avro.parse_schema(schema, max_bytes=10 << 20)


def test_a_deeply_nested_avro_schema_is_refused():
    spec: dict = {"type": "record", "name": "R0", "fields": []}
    inner = spec
    for i in range(1, 200):
        child = {"type": "record", "name": f"R{i}", "fields": []}
        inner["fields"].append({"name": "c", "type": child})
        inner = child
    with pytest.raises(avro.AvroSchemaError, match="deeper than"):
        avro.parse_schema(json.dumps(spec))


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8),
                              st.sampled_from(["int", "record", "array", "map", "enum"])),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(st.sampled_from(
                                                ["type", "name", "fields", "items", "values",
                                                 "symbols", "size", "logicalType"]), inner,
                                                max_size=5)), max_leaves=20))
def test_any_json_is_a_schema_or_an_avro_schema_error(spec):
    try:
        avro.parse_schema(json.dumps(spec))
    except avro.AvroSchemaError:
        pass


def test_the_codec_names_each_bad_input():
    codec = avro_codec(features=("*",), exclude_features=("tags", "code", "counters"))
    good = wire.frame(1, fastavro_payload({
        "id": "a", "amount": 1.0, "ratio": 0.5, "count": 1, "big": 2, "flag": True,
        "country": "FR", "merchant": {"category": "c", "risk": None}, "ts": 5, "day": 6,
        "fee": 1234, "price": -999_999_999_999, "code": b"abc", "tags": [], "counters": {},
        "y": True}))
    assert codec.decode(good) == ("a", {
        "amount": 1.0, "ratio": 0.5, "count": 1, "big": 2, "flag": 1, "country=FR": True,
        "merchant.category=c": True, "ts": 5, "day": 6, "fee": 1.234,
        "price": -999_999_999.999}, True)
    for value, error, reason in [
        (b'{"a": 1}', wire.WireFormatError, "magic byte 123"),
        (b"\x00\x00", wire.WireFormatError, "needs 5"),
        (wire.frame(9, b""), UnknownSchema, "unknown schema id 9"),
        (good[:-1], DeadLetter, "truncated"),
        (good + b"\x00", DeadLetter, "1 bytes after the value"),
        # a value the producer wrote wrong: named, with the fix (not a format's)
        (good.replace(b"\x02c", b"\x02\xe9"), DeadLetter,
         r"a string in field 'category' of record M is not UTF-8 \(b'\\xe9'\)\. Fix: the "
         "producer must encode its strings as UTF-8"),
    ]:
        with pytest.raises(error, match=reason):
            codec.decode(value)
    codec = SchemaRegistryCodec("avro", _Schemas({1: ("PROTOBUF", "x")}), FieldMapping())
    with pytest.raises(SchemaRefused, match="PROTOBUF, not AVRO: check --value-format"):
        codec.decode(good)


# Protobuf -----------------------------------------------------------------------------------------

CLASSES = protobuf_messages.message_classes()
PAYMENTS_BASE64 = base64.b64encode(protobuf_messages.payments_file().SerializeToString()).decode()
_payments = st.fixed_dictionaries({
    "transaction_id": st.text(max_size=8), "amount": st.floats(allow_nan=False),
    "country": st.sampled_from(["UNKNOWN", "BR", "FR", "US", "IN"]),
    "card_present": st.booleans(),
    "merchant": st.one_of(st.none(), st.fixed_dictionaries({
        "category": st.text(max_size=6), "risk": st.floats(allow_nan=False)})),
    "is_fraud": st.one_of(st.none(), st.booleans()),
    "history": st.lists(st.floats(allow_nan=False), max_size=4),
    "counters": st.dictionaries(st.text(max_size=4), st.integers(-2**63, 2**63 - 1),
                                max_size=3),
    "card_bin": st.one_of(st.none(), st.text(max_size=6)),
    "seconds": st.one_of(st.none(), st.integers(0, 2**40)),
})


def protobuf_payment(fields: dict):
    message = CLASSES["Payment"](
        transaction_id=fields["transaction_id"], amount=fields["amount"],
        country=fields["country"], card_present=fields["card_present"],
        history=fields["history"])
    for key, count in fields["counters"].items():
        message.counters[key] = count
    if fields["merchant"] is not None:
        message.merchant.category = fields["merchant"]["category"]
        message.merchant.risk = fields["merchant"]["risk"]
    if fields["is_fraud"] is not None:
        message.is_fraud = fields["is_fraud"]
    if fields["card_bin"] is not None:
        message.card_bin = fields["card_bin"]
    if fields["seconds"] is not None:
        message.event_time.seconds = fields["seconds"]
    return message


def expected_tree(fields: dict) -> dict:
    """What the module doc promises of a proto3 message: defaults for the implicit-presence
    scalars (not strings), presence for the rest."""
    tree = {"amount": fields["amount"], "country": fields["country"],
            "card_present": fields["card_present"]}
    if fields["transaction_id"]:
        tree["transaction_id"] = fields["transaction_id"]
    if fields["merchant"] is not None:
        merchant = {"risk": fields["merchant"]["risk"]}
        if fields["merchant"]["category"]:
            merchant["category"] = fields["merchant"]["category"]
        tree["merchant"] = merchant
    if fields["is_fraud"] is not None:
        tree["is_fraud"] = fields["is_fraud"]
    if fields["history"]:
        tree["history"] = fields["history"]
    if fields["counters"]:
        tree["counters"] = fields["counters"]
    if fields["card_bin"] is not None:
        tree["card_bin"] = fields["card_bin"]
    if fields["seconds"] is not None:
        tree["event_time"] = fields["seconds"] * 1000
    return tree


def protobuf_value(message, indexes=(1,)) -> bytes:
    return (b"\x00\x00\x00\x00\x01" + wire.encode_message_indexes(list(indexes))
            + message.SerializeToString())


@pytest.mark.parametrize("text", [PAYMENTS_BASE64, protobuf_messages.PAYMENTS_PROTO_TEXT])
@settings(max_examples=100, deadline=None)
@given(fields=_payments)
def test_protobuf_of_the_runtime_decodes_into_the_tree_the_doc_describes(text, fields):
    registered = RegisteredSchema(1, "PROTOBUF", text, {})
    reader = protobuf.ProtobufReader(registered, FieldMapping().mapper())
    assert reader.tree(protobuf_value(protobuf_payment(fields))) == expected_tree(fields)


def test_a_nested_message_is_named_by_its_indexes():
    reader = protobuf.ProtobufReader(RegisteredSchema(1, "PROTOBUF", PAYMENTS_BASE64, {}),
                                     FieldMapping().mapper())
    merchant = CLASSES["Merchant"](category="fuel", risk=0.5)
    assert reader.tree(protobuf_value(merchant, (1, 0))) == {"category": "fuel", "risk": 0.5}
    assert reader.tree(protobuf_value(CLASSES["Envelope"](source="s"), (0,))) == {"source": "s"}
    with pytest.raises(DeadLetter, match="name no message"):
        reader.tree(protobuf_value(merchant, (5,)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payments, st.data())
def test_a_mutated_protobuf_payload_is_an_event_or_a_dead_letter(fields, data):
    registry = _Schemas({1: ("PROTOBUF", PAYMENTS_BASE64)})
    codec = SchemaRegistryCodec("protobuf", registry, FieldMapping(
        label_field="is_fraud", id_field="transaction_id", features=("*",),
        exclude_features=("history",)))
    payload = bytearray(protobuf_value(protobuf_payment(fields)))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, max(0, len(payload) - 1)))
        how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if how == "flip" and payload:
            payload[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del payload[at:]
        else:
            payload[at:at] = data.draw(st.sampled_from(
                [b"\x0a\xff\xff\xff\xff\x0f", b"\x0b", b"\x2a" * 40, b"\xff" * 11, b"\x00"]))
    _event_or_dead_letter(codec, bytes(payload))


def test_a_deeply_nested_protobuf_payload_is_a_dead_letter():
    text = 'syntax = "proto3"; message Node { Node next = 1; int32 v = 2; }'
    reader = protobuf.ProtobufReader(RegisteredSchema(1, "PROTOBUF", text, {}),
                                     FieldMapping().mapper())
    payload = b""
    for _ in range(2_000):
        payload = b"\x0a" + _varint(len(payload)) + payload
    with pytest.raises(DeadLetter, match="deeper than"):
        reader.tree(b"\x00\x00\x00\x00\x01\x00" + payload)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@pytest.mark.parametrize(("text", "reason"), [
    ("syntax = \"proto3\"; message A { B b = 1; }", "unknown type"),
    ("syntax = \"proto3\"; import \"other.proto\"; message A {}", "imports 'other.proto'"),
    ("message A { int32 a = 1; int32 b = 1; }", "given twice"),
    ("message A { int32 a = 0; }", "out of range"),
    ("message A { optional group G = 1 { } }", "groups"),
    ("message A {", "ends early|closing brace"),
    ("syntax = \"proto3\";", "defines no message"),
    ("@@@", "unexpected"),
    ("AAAA" * 10, "not a serialized FileDescriptorProto|defines no message|unexpected"),
])
def test_hostile_protobuf_schemas_are_refused(text, reason):
    with pytest.raises(protobuf.ProtobufSchemaError, match=reason):
        protobuf.parse_file(text)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(alphabet='message enum {}=;[]()<>,"0123456789 abcXYZ_.oneof map repeated int32',
            max_size=200),
    st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode())))
def test_any_text_is_a_protobuf_schema_or_a_schema_error(text):
    try:
        protobuf.parse_file(text)
    except protobuf.ProtobufSchemaError:
        pass


# JSON Schema and plain JSON ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_a_json_schema_payload_of_any_bytes_is_an_event_or_a_dead_letter(data):
    codec = SchemaRegistryCodec("json-schema", _Schemas({1: ("JSON", "{}")}),
                                FieldMapping(features=("*",)))
    _event_or_dead_letter(codec, b"\x00\x00\x00\x00\x01" + data)


def test_plain_json_of_any_shape_through_the_mapping():
    codec = JSONCodec(mapping=FieldMapping(**FLAT))
    value = json.dumps(PAYMENT).encode()
    assert codec.decode(value) == event(PAYMENT, **FLAT)
    with pytest.raises(DeadLetter, match="bad JSON|malformed"):
        codec.decode(b'{"a": ')


# Wire format --------------------------------------------------------------------------------------


@given(st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=8))
def test_message_indexes_round_trip(indexes):
    encoded = b"\x00\x00\x00\x00\x01" + wire.encode_message_indexes(indexes) + b"rest"
    found, start = wire.message_indexes(encoded)
    assert found == indexes and encoded[start:] == b"rest"


@pytest.mark.parametrize("indexes", [b"\x80", b"\x7f", b"\x02\x01"])
def test_bad_message_indexes_are_dead_letters(indexes):
    with pytest.raises(wire.WireFormatError):
        wire.message_indexes(b"\x00\x00\x00\x00\x01" + indexes)


# The Schema Registry client, against a small HTTP server of the test's own ------------------------


class _Registry(http.server.ThreadingHTTPServer):
    """Answers GET /schemas/ids/N from `schemas`, counts requests; `status` overrides."""

    def __init__(self):
        self.schemas: dict[int, dict] = {}
        self.status: int | None = None
        self.requests: list[tuple[str, str, dict]] = []
        self.body: bytes | None = None

        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                server.requests.append(("GET", self.path, dict(self.headers)))
                if server.status is not None:
                    return self._answer(server.status, {"message": "no", "error_code": 1})
                if server.body is not None:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(server.body)
                    return None
                if self.path == "/subjects":
                    return self._answer(200, [])
                number = int(self.path.rsplit("/", 1)[1])
                if number not in server.schemas:
                    return self._answer(404, {"message": "not found", "error_code": 40403})
                return self._answer(200, server.schemas[number])

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def http_registry():
    server = _Registry()
    yield server
    server.shutdown()


def _parse(registered):
    return registered.text


def test_the_client_asks_once_per_id_and_bounds_its_cache(http_registry):
    for number in range(1, 6):
        http_registry.schemas[number] = {"schema": "s" * 1000 * number}
    client = SchemaRegistry({"url": http_registry.url, "cache.capacity": "3"})
    for _ in range(3):
        assert client.schema(1, _parse, "avro") == "s" * 1000
    assert len(http_registry.requests) == 1
    for number in range(1, 6):
        client.schema(number, _parse, "avro")
    assert client.cache_counts()["schemas"] == 3  # the least recently used went first
    small = SchemaRegistry({"url": http_registry.url}, max_cache_bytes=6000)
    for number in (1, 2, 3, 4):
        small.schema(number, _parse, "avro")
    assert small.cache_counts()["schema_bytes"] <= 6000


def test_unknown_ids_are_dead_letters_asked_once_a_while(http_registry):
    client = SchemaRegistry({"url": http_registry.url})
    for _ in range(5):
        with pytest.raises(UnknownSchema, match="unknown schema id 7"):
            client.schema(7, _parse, "avro")
    assert len(http_registry.requests) == 1


def test_an_answer_beyond_the_bound_is_refused_unread(http_registry):
    http_registry.body = b'{"schema": "' + b"a" * (3 << 20) + b'"}'
    client = SchemaRegistry({"url": http_registry.url}, max_schema_bytes=1 << 20)
    with pytest.raises(SchemaRefused, match="more than 1048576 bytes"):
        client.schema(1, _parse, "avro")


@pytest.mark.parametrize(("status", "error"), [
    (503, RegistryUnavailable), (429, RegistryUnavailable), (401, RegistryRefused),
    (403, RegistryRefused)])
def test_an_outage_is_not_a_refusal_and_credentials_are_named(http_registry, status, error):
    http_registry.status = status
    client = SchemaRegistry({"url": http_registry.url})
    with pytest.raises(error):
        client.schema(1, _parse, "avro")
    if error is RegistryRefused:
        with pytest.raises(RegistryRefused, match="basic.auth.user.info"):
            client.probe()
    else:
        assert not client.probe() and client.unavailable


def test_a_refused_connection_is_an_outage_and_the_next_url_serves(http_registry):
    http_registry.schemas[1] = {"schema": "s"}
    closed = SchemaRegistry({"url": "http://127.0.0.1:9,http://127.0.0.1:9", "timeout": "1"})
    with pytest.raises(RegistryUnavailable, match="127.0.0.1:9"):
        closed.schema(1, _parse, "avro")
    failover = SchemaRegistry({"url": f"http://127.0.0.1:9,{http_registry.url}"})
    assert failover.schema(1, _parse, "avro") == "s"


def test_basic_and_bearer_credentials_go_in_the_authorization_header(http_registry):
    http_registry.schemas[1] = {"schema": "s"}
    SchemaRegistry({"url": http_registry.url,
                    "basic.auth.user.info": "alice:secret"}).schema(1, _parse, "avro")
    SchemaRegistry({"url": http_registry.url, "bearer.auth.credentials.source": "STATIC_TOKEN",
                    "bearer.auth.token": "tok"}).schema(1, _parse, "avro")
    headers = [r[2] for r in http_registry.requests]
    assert headers[0]["Authorization"] == "Basic " + base64.b64encode(b"alice:secret").decode()
    assert headers[1]["Authorization"] == "Bearer tok"


@pytest.mark.parametrize(("settings_", "reason"), [
    ({"url": "http://r", "basic.auth.user.info": "nocolon"}, "USER:PASSWORD"),
    ({"url": "http://r", "proxy": "http://p"}, "does not support"),
    ({"url": "http://r", "schema.registry.wat": "1"}, "not a setting"),
    ({"url": "ftp://r"}, "http:// or https://"),
    ({"url": "http://r", "bearer.auth.credentials.source": "OAUTHBEARER"}, "STATIC_TOKEN"),
    ({"url": "http://r", "ssl.key.location": "k"}, "ssl.certificate.location"),
    ({"url": "http://r", "timeout": "-1"}, "must be in"),
])
def test_registry_settings_are_checked_with_confluent_kafkas_names(settings_, reason):
    with pytest.raises(ValueError, match=reason):
        check_settings(settings_)


# Avro outputs -------------------------------------------------------------------------------------


def test_avro_outputs_are_read_by_fastavro_as_the_json_they_came_from():
    outputs = AvroOutputs("p", "m", multiclass=False)
    outputs.predictions.schema_id = outputs.metrics_output.schema_id = 3  # type: ignore
    prediction = {"topic": "t", "partition": 1, "model": "alma", "offset": 7, "id": 2 ** 70,
                  "y_pred": False, "p_true": 0.25, "y": True}
    value = outputs.prediction(json.dumps(prediction).encode())
    assert value[:5] == b"\x00\x00\x00\x00\x03"
    read = fastavro.schemaless_reader(io.BytesIO(value[5:]),
                                      fastavro.parse_schema(prediction_schema(False)))
    assert read == {**prediction, "id": str(2 ** 70)}  # beyond a long: as text
    multiclass = prediction_schema(True, per_message=2)
    fastavro.parse_schema(multiclass)
    fastavro.parse_schema(metrics_schema())


# The fused Avro reader gives the general path's events ------------------------------------------


@pytest.mark.parametrize("mapping", [
    {"features": ("*",), "exclude_features": ("tags", "code")},
    {"features": ("*",), "exclude_features": ("tags", "code"), "categorical": "hash"},
    {"features": ("*",), "exclude_features": ("tags", "code", "merchant"), "categorical": "drop"},
    {"features": ("merchant.*",), "label_field": "flag"},
    {"features": ("*",), "id_from_key": True, "exclude_features": ("tags", "code", "id")},
    {"features": ("*",)},  # tags: an array, a dead letter when not empty
])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=_avro_records, key=st.one_of(st.none(), st.binary(max_size=4)),
       flips=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 255)), max_size=2))
def test_the_fused_avro_reader_gives_the_events_and_dead_letters_of_the_tree(
        mapping, record, key, flips):
    codec = avro_codec(**mapping)
    reader = codec.registry.schema(1, codec._parse, "avro")
    assert reader.events is not None
    payload = bytearray(wire.frame(1, fastavro_payload(record)))
    for at, bits in flips:
        if at < len(payload) and at >= 5:
            payload[at] ^= bits
    payload = bytes(payload)

    def outcome(decode):
        try:
            return "event", decode()
        except DeadLetter as error:
            return type(error).__name__, str(error)

    from connectors.serializers import avro_events

    in_python = avro_events.event_reader(reader.decoder.schema, reader.mapper, native=False)

    def fused_with(read):
        try:
            return read(payload, key)
        except avro_events._Fallback:
            return reader.mapper.event(reader.tree(payload), key)

    general = outcome(lambda: reader.mapper.event(reader.tree(payload), key))
    for read in (reader.events, in_python):
        fused = outcome(lambda: fused_with(read))
        assert fused == general
        if fused[0] == "event":
            assert list(fused[1][1] or {}) == list(general[1][1] or {})  # the same order too


FLAT_SCHEMA = {"type": "record", "name": "Flat", "fields": [
    {"name": "id", "type": "string"}, {"name": "amount", "type": "double"},
    {"name": "ratio", "type": "float"}, {"name": "count", "type": "int"},
    {"name": "big", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "flag", "type": "boolean"},
    {"name": "country", "type": {"type": "enum", "name": "C", "symbols": ["BR", "FR", "US"]}},
    {"name": "category", "type": "string"}, {"name": "risk", "type": ["null", "double"]},
    {"name": "blob", "type": "bytes"}, {"name": "y", "type": ["null", "boolean"]},
]}
_flat_records = st.fixed_dictionaries({
    "id": st.text(max_size=70), "amount": st.floats(), "ratio": st.floats(width=32),
    "count": st.integers(-2**31, 2**31 - 1), "big": st.integers(-2**63, 2**63 - 1),
    "flag": st.booleans(), "country": st.sampled_from(["BR", "FR", "US"]),
    "category": st.text(max_size=300), "risk": st.one_of(st.none(), st.floats()),
    "blob": st.binary(max_size=5), "y": st.one_of(st.none(), st.booleans())})


@pytest.mark.parametrize("mapping", [
    {"features": ("*",), "exclude_features": ("blob",)},
    {"features": ("*",), "exclude_features": ("blob",), "categorical": "drop"},
    {"features": ("*",), "exclude_features": ("blob", "id"), "id_from_key": True},
])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=_flat_records, key=st.one_of(st.none(), st.binary(max_size=4)),
       flips=st.lists(st.tuples(st.integers(0, 120), st.integers(1, 255)), max_size=2),
       cut=st.one_of(st.none(), st.integers(5, 120)))
def test_the_c_reader_gives_the_events_and_dead_letters_of_the_tree(mapping, record, key,
                                                                      flips, cut):
    from connectors.serializers import avro_events

    if avro_events._native_module() is None:
        pytest.skip("events.c is not built (streammargin warmup builds it)")
    codec = avro_codec(FLAT_SCHEMA, **mapping)
    reader = codec.registry.schema(1, codec._parse, "avro")
    assert reader.events.__qualname__.startswith("_native_reader")
    payload = bytearray(wire.frame(1, fastavro_payload(record, FLAT_SCHEMA)))
    for at, bits in flips:
        if 5 <= at < len(payload):
            payload[at] ^= bits
    if cut is not None:
        del payload[cut:]
    payload = bytes(payload)

    def outcome(read):
        try:
            try:
                return "event", read()
            except avro_events._Fallback:
                return "event", reader.mapper.event(reader.tree(payload), key)
        except DeadLetter as error:
            return type(error).__name__, str(error)

    general = outcome(lambda: reader.mapper.event(reader.tree(payload), key))
    in_c = outcome(lambda: reader.events(payload, key))
    assert in_c == general
    if in_c[0] == "event":
        assert list(in_c[1][1] or {}) == list(general[1][1] or {})


# The C mapping of objects gives the Python one's events -------------------------------------------

_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.sampled_from([10 ** 308, 2 ** 1024, -(2 ** 1024), 17976931348623157 * 10 ** 292]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
    st.text(min_size=255, max_size=258), st.binary(max_size=2))
_trees = st.recursive(_json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=2),
    st.dictionaries(st.sampled_from(["a", "b", "id", "y", "x", "m.n", ""]), inner, max_size=4)),
    max_leaves=12)


@pytest.mark.parametrize("mapping", [
    {"features": ("*",)}, {"features": ("x.*",)}, {"features": ("a", "b.a")},
    {"features": ("*",), "exclude_features": ("a.b", "x")}, {"features": ("*",),
                                                             "categorical": "drop"},
])
@settings(max_examples=300, deadline=None)
@given(tree=st.dictionaries(st.sampled_from(["a", "b", "id", "y", "x", "c"]), _trees, max_size=5))
def test_the_c_mapping_gives_the_events_and_dead_letters_of_the_python_one(mapping, tree):
    from connectors.serializers import mapping as mapping_module

    if mapping_module._native_module() is None:
        pytest.skip("events.c is not built (streammargin warmup builds it)")
    in_c = FieldMapping(**mapping).mapper()
    saved = mapping_module._native
    mapping_module._native = None  # (a mapper binds its C paths when made)
    try:
        in_python = FieldMapping(**mapping).mapper()
    finally:
        mapping_module._native = saved
    assert in_python._flat is None

    def outcome(mapper, native):
        saved = mapping_module._native
        mapping_module._native = native
        try:
            event = mapper.event(tree)
            return "event", event, list(event[1] or {}), mapper.indicators
        except DeadLetter as error:
            return type(error).__name__, str(error)
        finally:
            mapping_module._native = saved

    assert outcome(in_c, mapping_module._native_module()) == outcome(in_python, None)


# --positive-label: a binary model on a topic of any two labels --------------------------------

LABELLED_SCHEMA = {"type": "record", "name": "L", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
    {"name": "outcome", "type": ["null", "string"]}]}


@pytest.mark.parametrize("value_format", ["json", "envelope", "avro"])
def test_a_positive_label_makes_any_two_labels_binary_on_every_path(value_format):
    def codec_and_values(positive):
        if value_format == "avro":
            codec = avro_codec(LABELLED_SCHEMA, features=("*",), label_field="outcome",
                               positive_label=positive)
            return codec, [wire.frame(1, fastavro_payload(
                {"id": 7, "amount": 2.5, "outcome": y}, LABELLED_SCHEMA))
                for y in ("fraud", "legit", None)]
        if value_format == "envelope":
            return JSONCodec(mapping=FieldMapping(positive_label=positive)), [
                json.dumps({"id": 7, "x": {"amount": 2.5}, "y": y}).encode()
                for y in ("fraud", "legit", None)]
        return JSONCodec(mapping=FieldMapping(features=("*",), label_field="outcome",
                                              positive_label=positive)), [
            json.dumps({"id": 7, "amount": 2.5, "outcome": y}).encode()
            for y in ("fraud", "legit", None)]

    codec, values = codec_and_values("fraud")
    assert [codec.decode(value) for value in values] == [
        (7, {"amount": 2.5}, True), (7, {"amount": 2.5}, False), (7, {"amount": 2.5}, None)]
    assert codec.decode_label(values[0]) == (7, True)
    codec, values = codec_and_values(None)
    with pytest.raises(InvalidLabel) as refused:
        codec.decode(values[0])
    # The hint names the option, with the label it met.
    assert "Fix: --positive-label fraud if the topic has two labels" in str(refused.value)
    assert dead_letter_kind(str(refused.value)) == "unknown_label"


def test_a_positive_label_compares_the_labels_text_and_keeps_booleans():
    label = FieldMapping(positive_label="2").label_function()
    assert [label(y) for y in (2, 2.0, "2", 1, "1", None, True, False)] == [
        True, True, True, False, False, None, True, False]
    with pytest.raises(InvalidLabel, match="a label is a string, an integer or a boolean"):
        label(2.5)
    with pytest.raises(ValueError, match="takes the labels as they come"):
        FieldMapping(positive_label="a", multiclass=True)


# --features against a topic's latest schema, at start -------------------------------------------


@pytest.mark.parametrize(("value_format", "text", "path", "holds"), [
    ("avro", json.dumps(AVRO_SCHEMA), ("tags",), "an array"),
    ("avro", json.dumps(AVRO_SCHEMA), ("code",), "a fixed of 3 bytes"),
    ("avro", json.dumps(AVRO_SCHEMA), ("fee",), None),  # a decimal: a number
    ("avro", json.dumps(AVRO_SCHEMA), ("merchant", "risk"), None),  # [null, double]
    ("avro", json.dumps(AVRO_SCHEMA), ("counters",), None),  # a map: an object
    ("avro", json.dumps(AVRO_SCHEMA), ("nothing",), None),
    ("avro", json.dumps(FLAT_SCHEMA), ("blob",), "bytes"),
    ("protobuf", protobuf_messages.PAYMENTS_PROTO_TEXT, ("history",), "a repeated field"),
    ("protobuf", protobuf_messages.PAYMENTS_PROTO_TEXT, ("counters",), None),  # a map
    ("protobuf", protobuf_messages.PAYMENTS_PROTO_TEXT, ("merchant", "risk"), None),
    ("protobuf", protobuf_messages.PAYMENTS_PROTO_TEXT, ("source",), None),  # (Envelope's)
    ("json-schema", json.dumps({"type": "object", "properties": {
        "tags": {"type": "array"}, "n": {"type": ["array", "number"]}}}), ("tags",), "an array"),
    ("json-schema", json.dumps({"type": "object", "properties": {
        "n": {"type": ["array", "number"]}}}), ("n",), None),
])
def test_a_schema_says_which_fields_hold_no_feature(value_format, text, path, holds):
    from connectors.serializers.registry_codec import _schema_field_kinds

    schema_type = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}[value_format]
    registered = RegisteredSchema(1, schema_type, text, {})
    assert _schema_field_kinds(value_format, registered, 1 << 20)(path) == holds
