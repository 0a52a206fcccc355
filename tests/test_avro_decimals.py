"""Avro decimals as the specification (1.12, "Decimal") and Java's reference implementation have
them, on bytes and on fixed of every size: the value written by fastavro (what confluent-kafka's
AvroSerializer writes with; tests/test_schema_registry.py has the serializer itself, on Apicurio)
and by Java-style writers, read by the tree's decoder and by the fused event reader to the same
float, rounded once; invalid schemas read as their underlying type; hostile bytes refused with an
`AvroDataError` in bounded work, and nothing else.
"""

from __future__ import annotations

import decimal
import io
import json
import logging
import sys

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.codec import DeadLetter
from connectors.serializers import avro, avro_events, wire
from test_serializers import _event_or_dead_letter, avro_codec

# floor(log10(2**(8n-1) - 1)) for n = 1..16 bytes, as Hive's and Java's tables have it.
FIXED_PRECISION = [2, 4, 6, 9, 11, 14, 16, 18, 21, 23, 26, 28, 31, 33, 35, 38]


def decimal_type(size: int | None, precision, scale=0, name: str = "D") -> dict:
    """A decimal on bytes (`size` None) or on a fixed of `size` bytes."""
    spec = {"logicalType": "decimal", "precision": precision, "scale": scale}
    if size is None:
        return {"type": "bytes", **spec}
    return {"type": "fixed", "name": name, "size": size, **spec}


def record_schema(*fields: tuple[str, dict | list | str]) -> dict:
    return {"type": "record", "name": "Priced", "fields": [
        {"name": "id", "type": "string"}, *({"name": n, "type": t} for n, t in fields),
        {"name": "y", "type": ["null", "boolean"]}]}


def value_of(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(f"{unscaled}E-{scale}")  # (exact: no context rounding)


def as_float(unscaled: int, scale: int) -> float:
    """What the worker gives: the exact value rounded once to the nearest float64."""
    return float(value_of(unscaled, scale))


def written_by_fastavro(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def every_path(schema: dict, framed: bytes, **mapping) -> list:
    """The event of a framed record by the tree and the mapper, by the fused reader the codec
    chose (events.c, or the Python ops where the C plan has no instruction) and by the Python
    ops: all three, or the dead letter each path's fallback gives."""
    codec = avro_codec(schema, id_field="id", label_field="y", features=("*",), **mapping)
    reader = codec.registry.schema(1, codec._parse, "avro")
    assert reader.events is not None
    in_python = avro_events.event_reader(reader.decoder.schema, reader.mapper, native=False)

    def outcome(read):
        try:
            try:
                return read()
            except avro_events._Fallback:
                return reader.mapper.event(reader.tree(framed))
        except DeadLetter as error:
            return type(error).__name__, str(error)

    return [outcome(lambda: reader.mapper.event(reader.tree(framed))),
            outcome(lambda: reader.events(framed, None)),
            outcome(lambda: in_python(framed, None))]


# The schema: which decimals are valid -------------------------------------------------------------


def test_a_fixed_holds_the_digits_the_specification_says():
    for size, most in enumerate(FIXED_PRECISION, 1):
        assert avro._fixed_precision(size) == most
        valid = avro.parse_schema(json.dumps(decimal_type(size, most, most)))
        assert (valid.logical, valid.precision, valid.scale) == ("decimal", most, most)
        notes: list[str] = []
        invalid = avro.parse_schema(json.dumps(decimal_type(size, most + 1)), ignored=notes)
        assert invalid.logical is None and invalid.kind == "fixed" and invalid.size == size
        assert f"{size} bytes hold at most {most} digits" in notes[0], notes
    assert avro._fixed_precision(0) == 0


def test_the_issues_fixed_8_decimal_12_3_reads_every_value_it_holds():
    # The report: "a decimal of 8 bytes: precision 12 takes at most 7", for every record.
    schema = record_schema(("price", decimal_type(8, 12, 3)))
    for unscaled in (0, 1, -1, 123_456_789_123, 10 ** 12 - 1, -(10 ** 12 - 1)):
        payload = written_by_fastavro(schema, {"id": "a", "price": value_of(unscaled, 3),
                                               "y": True})
        assert len(payload) == 2 + 8 + 2
        expected = ("a", {"price": unscaled / 1000}, True)
        assert every_path(schema, wire.frame(1, payload)) == [expected] * 3


@pytest.mark.parametrize(("spec", "kind", "why", "fix"), [
    (decimal_type(8, 20, 3), "fixed", "8 bytes hold at most 18 digits",
     "a precision of at most 18, or a fixed of size 9"),
    (decimal_type(0, 1), "fixed", "0 bytes hold at most 0 digits", "a fixed of size 1"),
    (decimal_type(None, 4, 5), "bytes", "scale must be an integer from 0", "a scale from 0 to 4"),
    (decimal_type(None, 4, -1), "bytes", "scale must be an integer from 0", "a scale from 0 to 4"),
    (decimal_type(None, 0), "bytes", "precision must be a positive integer", "a precision of 1"),
    (decimal_type(None, 12.0, 2), "bytes", "precision must be a positive", "a precision of 1"),
    (decimal_type(None, True), "bytes", "precision must be a positive", "a precision of 1"),
    (decimal_type(None, 12, "3"), "bytes", "scale must be an integer", "a scale from 0 to 12"),
    (decimal_type(None, 12, None), "bytes", "scale must be an integer", "a scale from 0 to 12"),
    ({"type": "bytes", "logicalType": "decimal"}, "bytes", "precision must be", "a precision"),
    ({"type": "int", "logicalType": "decimal", "precision": 4}, "int", "annotates bytes or fixed",
     "a decimal on bytes or fixed, or no logicalType"),
    # Valid, but more digits than this reader converts (the spec lets a reader keep bytes).
    (decimal_type(None, 10 ** 6), "bytes", "more digits than the 1000",
     "a precision of at most 1000"),
    (decimal_type(1 << 20, 10 ** 6, 2), "fixed", "more digits than the 1000",
     "a precision of at most 1000"),
])
def test_an_invalid_decimal_is_read_as_its_underlying_type_and_says_why(spec, kind, why, fix):
    # The spec: "If a logical type is invalid, for example a decimal with scale greater than its
    # precision, then implementations should ignore the logical type and use the underlying Avro
    # type" (Java: LogicalTypes.fromSchemaIgnoreInvalid, which Schema.parse uses).
    notes: list[str] = []
    schema = avro.parse_schema(json.dumps(record_schema(("fee", spec))), ignored=notes)
    node = schema.fields[1][1]
    assert (node.kind, node.logical) == (kind, None)
    [note] = notes
    assert note.startswith("field 'fee' of record Priced: ") and why in note, note
    assert f"Fix: {fix}" in note, note
    raw = {"fixed": b"\x00" * node.size, "bytes": b"\x01\x02", "int": 7}[kind]
    payload = avro.AvroEncoder(schema).encode({"id": "a", "fee": raw, "y": None})
    assert avro.AvroDecoder(schema).decode(payload)["fee"] == raw


def test_the_codec_warns_once_per_schema_of_an_invalid_decimal(caplog):
    schema = record_schema(("fee", decimal_type(8, 20, 3)), ("amount", "double"))
    codec = avro_codec(schema, id_field="id", label_field="y", features=("*",),
                       exclude_features=("fee",))
    plain = json.loads(json.dumps(schema))
    del plain["fields"][1]["type"]["logicalType"]  # (fastavro refuses the invalid decimal)
    framed = wire.frame(1, written_by_fastavro(
        plain, {"id": "a", "fee": b"\x00" * 8, "amount": 2.5, "y": False}))
    caplog.set_level(logging.WARNING, logger="streammargin.kafka")
    for _ in range(3):
        assert codec.decode(framed) == ("a", {"amount": 2.5}, False)
    [warning] = [r for r in caplog.records if "decimal" in r.getMessage()]
    assert warning.getMessage().startswith("Avro schema 1: field 'fee' of record Priced: a "
                                           "decimal(20,3) on fixed(8) is invalid"), warning


_decimal_specs = st.fixed_dictionaries({
    "precision": st.one_of(st.integers(-3, 45), st.sampled_from([10 ** 9, 2 ** 63]), st.none(),
                           st.booleans(), st.floats(), st.text(max_size=3)),
    "scale": st.one_of(st.integers(-3, 45), st.none(), st.floats(), st.text(max_size=3)),
    "size": st.one_of(st.none(), st.integers(0, 20), st.just(1 << 20))})


@settings(max_examples=300, deadline=None)
@given(spec=_decimal_specs, data=st.binary(max_size=40))
def test_any_decimal_schema_is_a_decimal_or_its_underlying_type_and_reads_bytes_or_a_float(
        spec, data):
    size = spec["size"]
    spec = {k: v for k, v in spec.items() if v is not None and k != "size"}
    typed = {"logicalType": "decimal", **spec, **(
        {"type": "bytes"} if size is None else {"type": "fixed", "name": "F", "size": size})}
    node = avro.parse_schema(json.dumps(typed))  # never anything but a node or AvroSchemaError
    if node.logical == "decimal":
        assert type(node.precision) is int and 1 <= node.precision <= avro.MAX_DECIMAL_PRECISION
        assert 0 <= node.scale <= node.precision
        # (the spec's bound, computed without floats: digits of 2**(8n-1) - 1, less one)
        assert size is None or size > 400 or node.precision <= len(str(2 ** (8 * size - 1) - 1)) - 1
    value = data if size is None else (data * (size // max(1, len(data)) + 1))[:size]
    if size is not None and len(value) < size:
        value = value.ljust(size, b"\x00")
    try:
        read = avro.AvroDecoder(node).decode(avro.AvroEncoder(node).encode(value))
    except avro.AvroDataError as error:
        assert node.logical == "decimal" and "beyond float64" in str(error)
        return
    if node.logical == "decimal":
        assert read == as_float(int.from_bytes(value, "big", signed=True), node.scale)
    else:
        assert read == value


# Values: what the writers write, read to the same float on every path -----------------------------


@st.composite
def _decimals(draw):
    """(size or None for bytes, precision, scale, unscaled value within the precision)."""
    size = draw(st.sampled_from([None, *range(1, 17)]))
    precision = draw(st.integers(1, 60 if size is None else FIXED_PRECISION[size - 1]))
    scale = draw(st.integers(0, precision))
    largest = 10 ** precision - 1
    unscaled = draw(st.one_of(st.integers(-largest, largest),
                              st.sampled_from([0, 1, -1, largest, -largest])))
    return size, precision, scale, unscaled


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_decimals())
def test_a_decimal_fastavro_writes_is_its_value_rounded_once_on_every_path(drawn):
    size, precision, scale, unscaled = drawn
    schema = record_schema(("d", decimal_type(size, precision, scale)),
                           ("maybe", ["null", decimal_type(size, precision, scale, "E")]))
    value = value_of(unscaled, scale)
    payload = written_by_fastavro(schema, {"id": "a", "d": value, "maybe": value, "y": True})
    expected = as_float(unscaled, scale)
    tree = avro.AvroDecoder(avro.parse_schema(json.dumps(schema))).decode(payload)
    assert tree == {"id": "a", "d": expected, "maybe": expected, "y": True}
    assert every_path(schema, wire.frame(1, payload)) == [
        ("a", {"d": expected, "maybe": expected}, True)] * 3
    # fastavro reads the same value back (its Decimal, at the schema's precision)
    assert fastavro.schemaless_reader(io.BytesIO(payload), fastavro.parse_schema(schema))[
        "d"] == value


def _twos_complement(unscaled: int, length: int) -> bytes:
    return unscaled.to_bytes(length, "big", signed=True)


def _shortest(unscaled: int) -> int:
    """Java's BigInteger.toByteArray length: the shortest two's complement."""
    return (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1


@settings(max_examples=300, deadline=None)
@given(drawn=_decimals(), padding=st.integers(0, 40))
def test_any_two_s_complement_length_a_writer_may_use_is_read(drawn, padding):
    # Java writes the shortest bytes and sign-extends a fixed; others pad bytes too.
    size, precision, scale, unscaled = drawn
    length = size if size is not None else _shortest(unscaled) + padding
    schema = avro.parse_schema(json.dumps(decimal_type(size, precision, scale)))
    payload = avro.AvroEncoder(schema).encode(_twos_complement(unscaled, length))
    assert avro.AvroDecoder(schema).decode(payload) == as_float(unscaled, scale)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 16), data=st.data())
def test_a_fixed_s_whole_range_is_read_beyond_the_precision_as_java_reads_it(size, data):
    # A value of more digits than the precision: the spec calls the precision a maximum, but
    # Java's reader and fastavro's read it (and fastavro writes some, below), so it is no loss.
    precision = data.draw(st.integers(1, FIXED_PRECISION[size - 1]))
    scale = data.draw(st.integers(0, precision))
    half = 1 << (8 * size - 1)
    unscaled = data.draw(st.one_of(st.integers(-half, half - 1),
                                   st.sampled_from([-half, half - 1])))
    schema = avro.parse_schema(json.dumps(decimal_type(size, precision, scale)))
    payload = _twos_complement(unscaled, size)
    assert avro.AvroDecoder(schema).decode(payload) == as_float(unscaled, scale)


def test_values_fastavro_writes_beyond_the_precision_are_their_value():
    # fastavro checks a Decimal's own digits, then adds the scale's zeros: 1 as a decimal(3,3)
    # is 1000 units, 4 digits; 1E+5 as a decimal(2,0) is 100000.
    for size in (None, 4):
        for precision, scale, value, expected in [(3, 3, "1", 1.0), (3, 3, "-7", -7.0),
                                                  (2, 0, "1E+5", 100000.0)]:
            schema = record_schema(("d", decimal_type(size, precision, scale)))
            payload = written_by_fastavro(schema, {"id": "a", "d": decimal.Decimal(value),
                                                   "y": None})
            assert every_path(schema, wire.frame(1, payload)) == [("a", {"d": expected}, None)] * 3


@pytest.mark.parametrize(("precision", "scale", "unscaled", "expected"), [
    (1, 1, 1, 0.1),
    (3, 1, -5, -0.5),
    (17, 17, 1, 1e-17),
    # 2**53 + 1 and 2**53 + 3 lie halfway between two float64s: ties to even.
    (20, 0, 2 ** 53 + 1, 9007199254740992.0),
    (20, 0, 2 ** 53 + 3, 9007199254740996.0),
    # 43682988485963829.13: the nearest float64 is ...832; float(unscaled) / 100 rounds twice
    # and gives ...824.
    (19, 2, 4368298848596382913, 43682988485963832.0),
    (38, 0, 10 ** 38 - 1, 1e38),
    (38, 38, -(10 ** 38 - 1), -1.0),
    (1, 0, 0, 0.0),
])
def test_the_float_is_the_exact_value_rounded_once(precision, scale, unscaled, expected):
    assert as_float(unscaled, scale) == expected  # (the reference agrees with the hand value)
    for size in (None, 16):
        schema = avro.parse_schema(json.dumps(decimal_type(size, precision, scale)))
        data = _twos_complement(unscaled, size or _shortest(unscaled))
        assert avro.AvroDecoder(schema).decode(avro.AvroEncoder(schema).encode(data)) == expected
    assert float(4368298848596382913) / 100 != 43682988485963832.0  # (double rounding would fail)


def test_a_decimal_of_no_bytes_is_zero_as_fastavro_reads_it():
    schema = avro.parse_schema(json.dumps(decimal_type(None, 5, 2)))
    assert avro.AvroDecoder(schema).decode(b"\x00") == 0.0


# Hostile decimals: refused in bounded work, with an AvroDataError and nothing else ---------------


def _calls_during(decode, calls: list[str]) -> None:
    """`decode()`, noting in `calls` the C functions it calls (as sys.setprofile sees them)."""

    def profile(frame, event, arg):
        if event == "c_call":
            calls.append(getattr(arg, "__qualname__", ""))

    sys.setprofile(profile)
    try:
        decode()
    finally:
        sys.setprofile(None)


def test_a_megabyte_decimal_is_refused_before_any_conversion_naming_the_fix():
    schema = record_schema(("fee", ["null", decimal_type(None, 12, 3)]))
    parsed = avro.parse_schema(json.dumps(schema))
    # (the largest that --max-record-bytes, 1 MiB by default, lets through)
    huge = b"\x7f" * ((1 << 20) - 64)
    payload = avro.AvroEncoder(parsed).encode({"id": "a", "fee": huge, "y": None})
    decoder = avro.AvroDecoder(parsed)
    calls: list[str] = []
    with pytest.raises(avro.AvroDataError) as refused:
        _calls_during(lambda: decoder.decode(payload), calls)
    assert "bytes.lstrip" in calls and "int.from_bytes" not in calls, calls
    assert str(refused.value) == (
        "a decimal(12,3) in field 'fee' of record Priced is 1048512 bytes long: beyond "
        "float64's range (±1.8e308), and beyond the 12 digits its schema declares. Fix: the "
        "producer must write values of at most 12 digits, as decimal(12,3) says")
    # The dead letter's reason carries the fix, which the first-contact WARNING then quotes
    # (connectors/observability/input_watch.py: a reason's own "Fix:" wins).
    codec = avro_codec(schema, id_field="id", label_field="y", features=("*",))
    with pytest.raises(DeadLetter, match="Fix: the producer must write values of at most 12"):
        codec.decode(wire.frame(1, payload))
    _event_or_dead_letter(codec, wire.frame(1, payload))


def test_the_first_contact_warning_gives_the_producers_fix_not_the_format(caplog):
    # Issue 45: a payload that decodes under the right format but holds a bad value was told
    # "Fix: --value-format matching the producers' serializer". The reason's own fix wins.
    from connectors.observability.input_watch import InputWatch
    from connectors.task import dead_letter_headers

    schema = record_schema(("price", decimal_type(None, 12, 3)))
    parsed = avro.parse_schema(json.dumps(schema))
    framed = wire.frame(1, avro.AvroEncoder(parsed).encode(
        {"id": "a", "price": b"\x7f" * 200, "y": True}))
    codec = avro_codec(schema, id_field="id", label_field="y", features=("*",))
    with pytest.raises(DeadLetter) as refused:
        codec.decode(framed)
    headers = dead_letter_headers("t", 0, 1, "g", "VALUE_CONVERTER", "c",
                                  f"connectors.serializers.registry_codec."
                                  f"{type(refused.value).__name__}", str(refused.value))
    contact = InputWatch(first_records=10)
    with caplog.at_level("WARNING"):
        contact.observe(10, [type("R", (), {"headers": headers})()] * 10)
    [warning] = [r.getMessage() for r in caplog.records if "dead-letter topic" in r.getMessage()]
    assert "(bad_payload)" in warning and "--value-format" not in warning, warning
    assert warning.endswith("Fix: the producer must write values of at most 12 digits, as "
                            "decimal(12,3) says"), warning


def test_a_megabyte_fixed_decimal_reads_its_sign_extended_value():
    schema = avro.parse_schema(json.dumps(decimal_type(1 << 20, 10, 2)))
    decoder = avro.AvroDecoder(schema)
    assert decoder.decode(b"\xff" * (1 << 20)) == -0.01
    assert decoder.decode(b"\x00" * ((1 << 20) - 2) + b"\x30\x39") == 123.45
    with pytest.raises(avro.AvroDataError, match="beyond the 10 digits"):
        decoder.decode(b"\x00" + b"\x01" * ((1 << 20) - 1))


def test_a_decimal_beyond_float64_within_its_precision_says_so():
    schema = avro.parse_schema(json.dumps(decimal_type(None, 400, 0)))
    decoder = avro.AvroDecoder(schema)
    data = _twos_complement(10 ** 399, _shortest(10 ** 399))
    for padding in (0, 500):  # (500 sign bytes: stripped first, then converted: the same words)
        with pytest.raises(avro.AvroDataError, match=r"a decimal\(400,0\) is beyond float64's "
                                                     r"range .*Fix: values within ±1.8e308"):
            decoder.decode(avro.AvroEncoder(schema).encode(b"\x00" * padding + data))
    scaled = avro.parse_schema(json.dumps(decimal_type(None, 400, 100)))
    assert avro.AvroDecoder(scaled).decode(avro.AvroEncoder(scaled).encode(data)) == 1e299


@settings(max_examples=300, deadline=None)
@given(precision=st.one_of(st.integers(1, 40), st.integers(300, 1000)), data=st.data(),
       raw=st.one_of(st.binary(max_size=600), st.integers(0, 5000).map(lambda n: b"\x7f" * n)))
def test_any_bytes_are_a_float_or_an_avro_data_error(precision, data, raw):
    scale = data.draw(st.integers(0, precision))
    schema = avro.parse_schema(json.dumps(decimal_type(None, precision, scale)))
    try:
        value = avro.AvroDecoder(schema).decode(avro.AvroEncoder(schema).encode(raw))
    except avro.AvroDataError as error:
        assert "beyond float64's range" in str(error) and "Fix: " in str(error)
        return
    assert value == as_float(int.from_bytes(raw, "big", signed=True), scale)
    assert abs(value) < float("inf")


DECIMALS = record_schema(
    ("price", decimal_type(8, 12, 3, "Price")), ("fee", decimal_type(None, 10, 2)),
    ("small", decimal_type(1, 2, 1, "Small")), ("wide", decimal_type(16, 38, 10, "Wide")),
    ("again", "Price"), ("maybe", ["null", decimal_type(None, 6, 6)]),
    ("invalid", decimal_type(4, 12, 0, "Invalid")), ("amount", "double"))
_records = st.fixed_dictionaries({
    "id": st.text(max_size=4),
    "price": st.integers(-(10 ** 12 - 1), 10 ** 12 - 1).map(lambda u: value_of(u, 3)),
    "fee": st.integers(-(10 ** 10 - 1), 10 ** 10 - 1).map(lambda u: value_of(u, 2)),
    "small": st.integers(-99, 99).map(lambda u: value_of(u, 1)),
    "wide": st.integers(-(10 ** 38 - 1), 10 ** 38 - 1).map(lambda u: value_of(u, 10)),
    "again": st.integers(-(10 ** 12 - 1), 10 ** 12 - 1).map(lambda u: value_of(u, 3)),
    "maybe": st.one_of(st.none(), st.integers(-999_999, 999_999).map(lambda u: value_of(u, 6))),
    "invalid": st.binary(min_size=4, max_size=4),
    "amount": st.floats(allow_nan=False),
    "y": st.one_of(st.none(), st.booleans())})


def _written(record: dict) -> bytes:
    # (fastavro refuses the invalid decimal's schema: that field written as the fixed it is)
    plain = json.loads(json.dumps(DECIMALS))
    plain["fields"][7]["type"].pop("logicalType")
    return written_by_fastavro(plain, record)


@pytest.mark.parametrize("mapping", [
    {"exclude_features": ("invalid",)},
    {"exclude_features": ("invalid", "wide", "maybe")},
    {},  # invalid: a fixed, a dead letter naming it (the mapping's rule for bytes)
])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=_records, flips=st.lists(st.tuples(st.integers(5, 120), st.integers(1, 255)),
                                       max_size=2))
def test_decimal_records_give_the_trees_event_or_dead_letter_on_every_path(mapping, record,
                                                                          flips):
    framed = bytearray(wire.frame(1, _written(record)))
    for at, bits in flips:
        if at < len(framed):
            framed[at] ^= bits
    tree, *fused = every_path(DECIMALS, bytes(framed), **mapping)
    assert fused == [tree, tree]
    if not flips and "invalid" in mapping.get("exclude_features", ()) and len(tree) == 3:
        _, x, _ = tree  # (an event: the amount may be infinite, a dead letter)
        assert x["price"] == float(record["price"]) and x["again"] == float(record["again"])
        assert "wide" in mapping["exclude_features"] or x["wide"] == float(record["wide"])


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(record=_records, data=st.data())
def test_a_mutated_decimal_payload_is_an_event_or_a_dead_letter(record, data):
    codec = avro_codec(DECIMALS, id_field="id", label_field="y", features=("*",),
                       exclude_features=("invalid",))
    payload = bytearray(wire.frame(1, _written(record)))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(5, max(5, len(payload) - 1)))
        how = data.draw(st.sampled_from(["flip", "cut", "insert", "length"]))
        if how == "flip" and at < len(payload):
            payload[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del payload[at:]
        elif how == "insert":
            payload[at:at] = data.draw(st.binary(min_size=1, max_size=64))
        else:  # a bytes decimal's length and that many bytes: up to a megabyte of them
            count = data.draw(st.sampled_from([0, 1, 17, 300, 5000, 1 << 20]))
            fill = data.draw(st.sampled_from([b"\x00", b"\xff", b"\x7f", b"\x80"]))
            payload[at:at] = avro._zigzag(count) + fill * count
    _event_or_dead_letter(codec, bytes(payload))
