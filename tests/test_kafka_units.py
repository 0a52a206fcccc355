"""The Kafka connector's parts that need no broker: codec, undecodable batches, metrics, checkpoint
state, model registry, client settings, command line. (The partition task: tests/test_task.py.)"""

from __future__ import annotations

import argparse
import pathlib
import random
import re

import numpy as np
import pytest
import reference_metrics
from hypothesis import given, settings
from hypothesis import strategies as st
from river import drift, metrics, utils

import streammargin
from connectors import codec, models
from connectors.serializers import get_codec
from connectors.serializers.json_format import JSONCodec
from connectors.serializers.mapping import FieldMapping
from connectors.cli import kafka_command
from connectors.observability.metrics import PartitionMetrics, make_detector
from connectors.state import checkpoint
from connectors.worker.worker import WorkerConfig, client_settings, connection_settings
from streammargin import state

# Codec --------------------------------------------------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[1]
JSON = JSONCodec(max_record_bytes=300)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b'{"id": "a", "x": {"f": 1.5, "g": 2}, "y": true}', ("a", {"f": 1.5, "g": 2}, True)),
        (b'{"id": 3, "x": {"f": 1}, "y": 0}', (3, {"f": 1}, False)),
        (b'{"x": {"f": 1}, "y": -1}', (None, {"f": 1}, False)),
        (b'{"x": {"f": 1}, "y": 1.0}', (None, {"f": 1}, True)),
        # Booleans are the numbers 0 and 1 (True is a category's indicator), strings are
        # categories, nested objects are flattened, null is an absent feature.
        (b'{"x": {"f": true, "g": false}, "y": null}', (None, {"f": 1, "g": 0}, None)),
        (b'{"x": {"f": "high", "g": {"h": 2.5}, "n": null}}',
         (None, {"f=high": True, "g.h": 2.5}, None)),
        (b'{"x": {}}', (None, {}, None)),
        (b'{"id": "a", "y": false}', ("a", None, False)),
        (b'{"x": {"f": 1e308, "g": 1e308}, "ts": "2024-01-01T00:00:00Z", "extra": [1]}',
         (None, {"f": 1e308, "g": 1e308}, None)),
    ],
)
def test_codec_decodes_the_event_contract(value, expected):
    assert JSON.decode(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "empty record"),
        (b"x" * 301, "oversized record: 301 bytes"),
        (b"not json", "bad JSON"),
        (b"\xff\xfe{}", "bad JSON"),
        (b'{"x": {"f": 1}', "bad JSON"),
        (b"[1, 2]", "record is an array"),
        (b'{"x": {"f": NaN}}', "non-finite number NaN"),
        (b'{"x": {"f": -Infinity}}', "non-finite number -Infinity"),
        (b'{"x": {"f": 1' + b"0" * 320 + b"}}", "oversized"),
        (b'{"y": true}', "label record without an id"),
        (b'{"id": "a"}', "no features and no label"),
        (b'{"x": [1, 2]}', "x is an array, not an object"),
        (b'{"x": {"f": 1}, "y": 2}', "unknown label 2"),
        (b'{"x": {"f": 1}, "y": "yes"}', "unknown label 'yes'"),
        (b'{"x": {"f": 1}, "id": [1]}', "id [1] must be a string or an integer"),
        (b'{"x": {"f": 1}, "id": true}', "id True must be a string or an integer"),
    ],
)
def test_codec_turns_bad_records_into_dead_letters_with_a_reason(value, reason):
    with pytest.raises(codec.DeadLetter) as raised:
        JSON.decode(value)
    assert reason in str(raised.value)


def test_codec_reasons_quote_names_and_values_in_bounded_length():
    name = "n" * 100_000
    for value in [f'{{"x": {{"a": 1}}, "y": ["{name}"]}}', f'{{"x": {{"a": 1}}, "id": {{"k": "{name}"}}}}',
                  f'{{"x": {{"a": 1}}, "y": "{name}"}}', f'{{"x": {{"a": 1}}, "id": ["{name}"]}}',
]:
        with pytest.raises(codec.DeadLetter) as raised:
            JSONCodec().decode(value.encode())
        assert len(str(raised.value)) < 400 and "characters)" in str(raised.value)


def test_codec_leaves_out_integers_beyond_float64_or_refuses_them_when_named():
    big = b'{"x": {"g": 2.0, "f": 1' + b"0" * 400 + b"}}"
    assert JSONCodec().decode(big) == (None, {"g": 2.0}, None)
    named = JSONCodec(mapping=FieldMapping(features=("x.g", "x.f")))
    with pytest.raises(codec.DeadLetter, match="field 'x.f' has value 1000.* too large"):
        named.decode(big)


# The codec's two parsers: msgspec straight into the contract's fields, and json.loads for
# anything msgspec refuses. Documents are built from fragments where the two could disagree:
# duplicate keys, numbers at the edges of int64 and float64, escapes and surrogates, invalid
# UTF-8, NaN tokens, deep nesting in fields the contract ignores, trailing bytes.
_NUMBERS = ["0", "-0", "-0.0", "1", "-1", "2", "1.0", "2.0", "0.5", "1e5", "1E-5", "-2.5e-3",
            "1e308", "1.7976931348623157e308", "1e309", "-1e309", "4.9e-324", "1e-400",
            "9007199254740993", "9223372036854775807", "9223372036854775808",
            "-9223372036854775809", "18446744073709551616", "1" + "0" * 40, "1" + "0" * 400,
            "NaN", "Infinity", "-Infinity", "01", "1.", ".5", "+1"]
_STRINGS = ['"a"', '"b"', '""', '"\\u00e9"', '"\\ud800"', '"\\ud83d\\ude00"', '"\\u0000"', '"é"',
            '"\\"', '"\\n"', '"a<FF>"', '"' + "s" * 300 + '"', '"a\\q"', '"a\nb"', '"\x7f"']
_SCALARS = _NUMBERS + _STRINGS + ["true", "false", "null"]
_json_values = st.recursive(
    st.sampled_from(_SCALARS),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(st.sampled_from(_STRINGS[:4] + ['"id"', '"x"', '"y"']), inner),
                 max_size=3).map(
            lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"),
    ),
    max_leaves=8,
)
_features = st.lists(st.tuples(st.sampled_from(_STRINGS[:8]), st.one_of(
    st.sampled_from(_NUMBERS), _json_values)), max_size=4).map(
    lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}")
_fields = st.lists(st.tuples(st.sampled_from(['"id"', '"x"', '"y"', '"ts"', '"z"']),
                             st.one_of(_features, _json_values)), max_size=5)
_numeric_features = st.lists(
    st.tuples(st.sampled_from(_STRINGS[:8]), st.sampled_from(_NUMBERS[:25])), max_size=4
).map(lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}")
_events = st.tuples(
    st.sampled_from(
        ['"id": "e1", ', '"id": 7, ', '"id": 9223372036854775808, ', "", '"id": 1.5, ']
    ),
    _numeric_features,
    st.sampled_from(["", ', "y": true', ', "y": 0', ', "y": -1', ', "y": 2', ', "y": 1.0',
                     ', "y": "sky"', ', "y": null', ', "y": 9223372036854775808']),
    st.sampled_from(["", ', "ts": 1700000000000', ', "x": {"a": 1}', ', "id": "e2"']),
).map(lambda parts: "{" + parts[0] + '"x": ' + parts[1] + parts[2] + parts[3] + "}")
_documents = st.one_of(
    _events,
    _fields.map(lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"),
    _json_values,
    st.just('{"z": ' + "[" * 3000 + "]" * 3000 + ', "x": {"a": 1}}'),
).flatmap(lambda doc: st.sampled_from([doc, doc, doc + " ", doc + "x", "\ufeff" + doc, doc[:-1]]))


def _outcome(json_codec, value):
    try:
        return "event", repr(json_codec.decode(value))  # repr: 0 and -0.0, 1 and 1.0 differ
    except codec.DeadLetter as error:
        return type(error).__name__, str(error)


@settings(max_examples=400, deadline=None)
@given(_documents, st.booleans())
def test_the_codecs_fast_parser_decodes_exactly_what_the_json_parser_does(document, multiclass):
    value = document.encode("utf-8", "surrogatepass").replace(b"<FF>", b"\xff")
    fast = JSONCodec(multiclass=multiclass)
    assert fast._decode_fields is not None, "msgspec (the kafka extra) is not installed"
    slow = JSONCodec(multiclass=multiclass)
    slow._decode_fields = None
    assert _outcome(fast, value) == _outcome(slow, value)


@settings(max_examples=400, deadline=None)
@given(_documents)
def test_the_tree_of_msgspec_is_the_tree_of_json_loads(document):
    """json_tree takes msgspec's parse only where it reads the document as json.loads does
    (refusing NaN and the infinities, as the codec does)."""
    from connectors.serializers.json_format import _json_text, json_tree

    value = document.encode("utf-8", "surrogatepass").replace(b"<FF>", b"\xff")

    def outcome(parse):
        try:
            return "tree", repr(parse(value))
        except codec.DeadLetter:
            return ("refused",)

    assert outcome(json_tree) == outcome(_json_text)


@pytest.mark.parametrize("value", [
    b'{"id": 1, "x": {"a": 1, "a": 2.5}, "y": 1}', b'{"x": {"a": -0}, "y": true}',
    b'{"x": {"a": 9007199254740993}}', b'{"id": -9223372036854775809, "y": 0}',
    b'{"x": {"a": 1e-400, "b": 4.9e-324}, "ts": {"deep": [[[]]]}}', b'{"id": "b", "id": 2, "y": 1}',
])
def test_the_fast_parser_takes_valid_records_as_json_does(value):
    slow = JSONCodec()
    slow._decode_fields = None
    assert _outcome(JSON, value) == _outcome(slow, value)
    assert _outcome(JSON, value)[0] == "event"


@pytest.mark.parametrize(
    ("value", "cls"),
    [
        (None, codec.NullRecord),
        (b"x" * 301, codec.OversizedRecord),
        (b"not json", codec.MalformedJSON),
        (b'{"x": {"f": NaN}}', codec.MalformedJSON),
        (b"[1, 2]", codec.InvalidRecord),
        (b'{"y": true}', codec.InvalidRecord),
        (b'{"x": {"f": 1}, "y": 2}', codec.InvalidLabel),
    ],
)
def test_codec_dead_letters_say_what_was_wrong_by_their_class(value, cls):
    with pytest.raises(cls):
        JSON.decode(value)


MULTICLASS = JSONCodec(multiclass=True)


@pytest.mark.parametrize(
    ("value", "label"),
    [
        (b'{"x": {"f": 1}, "y": "sky"}', "sky"),
        (b'{"x": {"f": 1}, "y": 7}', 7),
        (b'{"x": {"f": 1}, "y": 0}', 0),
        (b'{"x": {"f": 1}, "y": -1}', -1),
        (b'{"x": {"f": 1}, "y": 2.0}', 2),  # JSON has one number type: 2.0 is the integer 2
        (b'{"x": {"f": 1}, "y": true}', True),
        (b'{"x": {"f": 1}, "y": ""}', ""),
        (b'{"id": "a", "y": "cat"}', "cat"),
        (b'{"x": {"f": 1}, "y": 9223372036854775807}', 2**63 - 1),
    ],
)
def test_a_multiclass_codec_takes_labels_as_they_come(value, label):
    y = MULTICLASS.decode(value)[2]
    assert y == label and type(y) is type(label)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'{"x": {"f": 1}, "y": 2.5}', "label 2.5 of type float"),
        (b'{"x": {"f": 1}, "y": [1]}', r"label \[1\] of type list"),
        (b'{"x": {"f": 1}, "y": {"a": 1}}', "of type dict"),
        (b'{"x": {"f": 1}, "y": 9223372036854775808}', "beyond 64-bit integers"),
        (b'{"x": {"f": 1}, "y": "' + b"c" * 257 + b'"}', "longer than 256 characters"),
    ],
)
def test_a_multiclass_codec_refuses_labels_of_other_types(value, reason):
    with pytest.raises(codec.InvalidLabel, match=reason):
        MULTICLASS.decode(value)


def test_the_binary_codec_names_the_multiclass_options_for_other_labels():
    with pytest.raises(codec.InvalidLabel, match="--one-vs-rest"):
        JSON.decode(b'{"x": {"f": 1}, "y": "sky"}')


@pytest.mark.parametrize("label", ["", "sky", "s" * 256, 0, -5, 2**63 - 1, -(2**63), True, False])
def test_labels_round_trip_through_checkpoint_state(label):
    restored = codec.label_from_state(state.loads(state.dumps(
        {"l": codec.label_to_state(label)}))["l"])
    assert restored == label and type(restored) is type(label)


@pytest.mark.parametrize("data", ["s" * 257, {"int": 2**63}, {"int": True}, {"float": 1.0},
                                  {"tuple": []}, {"none": None}, None, 3, [1],
                                  {"bool": 1}, {"int": 1, "bool": True}])
def test_labels_from_checkpoint_state_are_only_the_codecs_types(data):
    with pytest.raises(streammargin.StateError):
        codec.label_from_state(data)


def test_get_codec_by_name_and_import_path():
    assert isinstance(get_codec("json"), JSONCodec)
    assert isinstance(get_codec("connectors.serializers.json_format:JSONCodec"), JSONCodec)
    with pytest.raises(ValueError, match="unknown codec"):
        get_codec("avro")


def test_crc32c_matches_kafka_python_reference():
    from kafka.record._crc32c import crc as reference

    rng = random.Random(0)
    for size in [0, 1, 7, 8, 9, 63, 64, 1000, 4097]:
        data = bytes(rng.randrange(256) for _ in range(size))
        assert codec.crc32c(data) == reference(data)
        assert codec.crc32c(memoryview(bytearray(data))) == reference(data)
    assert codec.crc32c(b"123456789") == 0xE3069283  # the standard check value


def test_install_fast_crc32c_replaces_the_pure_python_checksum():
    from kafka.record import default_records, util

    which = codec.install_fast_crc32c()
    if util.crc32c_c is None:
        assert which == "numba" and default_records.calc_crc32c is codec.crc32c
    assert codec.install_fast_crc32c() == which  # idempotent


# Record batches the client cannot decode ----------------------------------------------------------


def batch_bytes(values, compression: int, offset: int) -> bytes:
    """One record batch as kafka-python writes it (compression: Kafka's code, 0-4)."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=compression, batch_size=1 << 20,
                                   offset=offset)
    for value in values:
        builder.append(timestamp=0, key=None, value=value)
    builder.close()
    return bytes(builder.buffer())


def fetched(data: bytes, fetch_offset: int = 0):
    """The records of a fetch response as kafka-python's fetcher unpacks them."""
    from kafka import TopicPartition
    from kafka.consumer.fetcher import Fetcher
    from kafka.record.memory_records import MemoryRecords

    return Fetcher.PartitionRecords(fetch_offset, TopicPartition("t", 3), MemoryRecords(data))


VALUES = [b'{"x": {"a": 1.0}, "y": true}' * 4] * 10


def test_a_corrupt_batch_raises_undecodable_batch_naming_partition_offsets_and_codec(monkeypatch):
    from kafka.record import default_records

    codec.install_batch_errors()
    codec.install_batch_errors()  # idempotent
    plain = batch_bytes(VALUES[:5], 0, offset=0)
    with monkeypatch.context() as patch:
        patch.setattr(default_records, "gzip_encode", lambda payload, **_: b"not gzip" * 8)
        corrupt = batch_bytes(VALUES, 1, offset=5)
    after = batch_bytes(VALUES[:5], 0, offset=15)
    records = fetched(plain + corrupt + after)
    assert [r.offset for r in records.take(100)] == [0, 1, 2, 3, 4]
    with pytest.raises(codec.UndecodableBatch) as raised:
        records.take(100)
    error = raised.value
    assert (error.topic, error.partition, error.first_offset, error.next_offset, error.codec) == (
        "t", 3, 5, 15, "gzip"
    )
    assert not error.missing_library and "--on-undecodable skip" in error.fix()
    assert str(error).startswith("cannot decode the gzip record batch of t/3 at offsets 5-14")
    # The dead records are drained: kafka-python moves on instead of spinning on them.
    assert not records
    # A fetch that starts inside the batch (a seek to a checkpoint's offset) reports from there.
    with pytest.raises(codec.UndecodableBatch) as raised:
        fetched(corrupt + after, fetch_offset=9).take(100)
    assert (raised.value.first_offset, raised.value.next_offset) == (9, 15)


@pytest.mark.parametrize(("code", "name", "module"), [(2, "snappy", "snappy"),
                                                      (3, "lz4", "lz4"),
                                                      (4, "zstd", "zstd")])
def test_a_missing_codec_library_is_named_with_the_package_to_install(monkeypatch, code, name,
                                                                      module):
    from kafka import codec as kafka_codec

    codec.install_batch_errors()
    data = batch_bytes(VALUES, code, offset=40)
    monkeypatch.setattr(kafka_codec, module, None)
    if name == "lz4":
        monkeypatch.setattr(kafka_codec, "lz4f", None)
        monkeypatch.setattr(kafka_codec, "lz4framed", None)
    with pytest.raises(codec.UndecodableBatch) as raised:
        fetched(data, fetch_offset=40).take(100)
    error = raised.value
    assert (error.first_offset, error.next_offset, error.codec) == (40, 50, name)
    assert error.missing_library
    assert codec.CODEC_PACKAGES[name] in error.fix() and "streammargin[kafka]" in error.fix()


def test_the_kafka_extra_installs_every_codec_kafka_python_reads():
    import tomllib

    from kafka import codec

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["kafka"]
    [client] = [line for line in extra if line.startswith("kafka-python")]
    assert {"snappy", "lz4", "zstd"} <= set(re.search(r"\[(.*)\]", client).group(1).split(","))
    constraints = (ROOT / "constraints.txt").read_text()
    for package in ("python-snappy", "lz4", "zstandard", "cramjam"):
        assert re.search(rf"^{package}==", constraints, re.M), package
    assert codec.has_gzip() and codec.has_snappy() and codec.has_lz4() and codec.has_zstd()


# Metrics ------------------------------------------------------------------------------------------


def random_predictions(n, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        y = rng.random() < 0.4
        p_true = rng.choice([0.0, 1.0, rng.random(), 0.5])
        out.append((y, p_true > 0.5, p_true))
    return out


def test_metrics_equal_rivers_accuracy_rolling_accuracy_and_log_loss_exactly():
    ours = PartitionMetrics(rolling_window=50)
    accuracy, rolling, log_loss = (
        metrics.Accuracy(), utils.Rolling(metrics.Accuracy, window_size=50), metrics.LogLoss()
    )
    for offset, (y, y_pred, p_true) in enumerate(random_predictions(500)):
        ours.update(y, y_pred, p_true, offset)
        accuracy.update(y, y_pred)
        rolling.update(y, y_pred)
        log_loss.update(y, {True: p_true, False: 1 - p_true})
        assert ours.accuracy == accuracy.get()
        assert ours.rolling_accuracy == rolling.get()
        assert ours.log_loss == log_loss.get()


def test_metrics_feed_the_detector_with_errors_and_record_detections():
    ours = PartitionMetrics(detector=make_detector("ADWIN"))
    reference = drift.ADWIN()
    detections = []
    rng = random.Random(1)
    for offset in range(3000):
        error_rate = 0.1 if offset < 1500 else 0.6
        y = True
        y_pred = rng.random() >= error_rate
        if ours.update(y, y_pred, 0.9 if y_pred else 0.1, offset):
            detections.append(offset)
        reference.update(0.0 if y_pred else 1.0)
        assert ours.detector.drift_detected == reference.drift_detected
    assert detections and any(1500 <= d < 1800 for d in detections)
    assert ours.n_detections == len(detections)
    assert list(ours.detections) == detections[-100:]


def round_trip(tree):
    return state.loads(state.dumps({"tree": tree}))["tree"]


@pytest.mark.parametrize("name", ["adwin", "kswin", "pagehinkley", "ddm", "eddm", "hddma", "hddmw",
                                  "fhddm", "none"])
def test_metrics_state_round_trip_continues_identically(name):
    params = {"seed": 3} if name == "kswin" else {}
    original = PartitionMetrics(rolling_window=30, detector=make_detector(name, params))
    stream = random_predictions(900, seed=2)
    # An error rate jump makes detectors fire after the restore point.
    stream = [(y, y_pred if i < 400 else not y_pred, p) for i, (y, y_pred, p) in enumerate(stream)]
    for offset, (y, y_pred, p_true) in enumerate(stream[:300]):
        original.update(y, y_pred, p_true, offset)
    restored = PartitionMetrics.from_state(round_trip(original.to_state()))
    assert type(restored.detector) is type(original.detector)
    for offset, (y, y_pred, p_true) in enumerate(stream[300:], 300):
        assert restored.update(y, y_pred, p_true, offset) == original.update(
            y, y_pred, p_true, offset
        )
    assert restored.summary() == original.summary()
    assert state.dumps(restored.to_state()) == state.dumps(original.to_state())


def test_binary_metrics_give_rivers_macro_f1_and_the_counts_of_each_class():
    ours = PartitionMetrics()
    macro_f1 = metrics.MacroF1()
    stream = random_predictions(700, seed=4)
    for offset, (y, y_pred, p_true) in enumerate(stream):
        ours.update(y, y_pred, p_true, offset)
        macro_f1.update(y, y_pred)
    assert ours.macro_f1 == reference_metrics.macro_f1(macro_f1) == macro_f1.get()
    per_class = ours.summary()["per_class"]
    assert per_class["true"]["support"] == sum(y for y, _, _ in stream)
    assert per_class["false"]["predicted"] == sum(not p for _, p, _ in stream)
    assert per_class["true"]["correct"] == sum(y and p for y, p, _ in stream)


LABELS = st.sampled_from(["sky", "grass", "path", "window", 7, -1, 0])
MULTICLASS_STREAM = st.lists(
    st.tuples(
        LABELS,
        st.none() | LABELS,
        st.dictionaries(LABELS, st.floats(0.0, 1.0), max_size=5),
    ),
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(stream=MULTICLASS_STREAM, window=st.integers(1, 20))
def test_multiclass_metrics_equal_rivers_progressive_validation_exactly(stream, window):
    ours = PartitionMetrics(rolling_window=window)
    accuracy, macro_f1, cross_entropy = metrics.Accuracy(), metrics.MacroF1(), metrics.CrossEntropy()
    rolling = utils.Rolling(metrics.Accuracy, window_size=window)
    for offset, (y, y_pred, proba) in enumerate(stream):
        ours.update_multiclass(y, y_pred, proba, offset)
        # River's progressive validation skips a None prediction and an empty probability dict.
        if y_pred is not None:
            accuracy.update(y, y_pred)
            macro_f1.update(y, y_pred)
            rolling.update(y, y_pred)
        if proba:
            cross_entropy.update(y, proba)
    scored = [entry for entry in stream if entry[1] is not None]
    assert ours.n_labelled == len(scored) and ours.unscored == len(stream) - len(scored)
    assert ours.accuracy == (accuracy.get() if scored else None)
    assert ours.rolling_accuracy == (rolling.get() if scored else None)
    assert ours.macro_f1 == (reference_metrics.macro_f1(macro_f1) if scored else None)
    if scored:
        assert ours.macro_f1 == pytest.approx(macro_f1.get(), rel=1e-14, abs=1e-300)
    assert ours.log_loss == (cross_entropy.get() if any(p for _, _, p in stream) else None)
    # Restored from its state, it reports and goes on identically.
    twin = PartitionMetrics.from_state(round_trip(ours.to_state()))
    assert twin.summary() == ours.summary()
    for offset, (y, y_pred, proba) in enumerate(stream[:20], len(stream)):
        twin.update_multiclass(y, y_pred, proba, offset)
        ours.update_multiclass(y, y_pred, proba, offset)
    assert twin.summary() == ours.summary() and twin.macro_f1 == ours.macro_f1
    assert state.dumps(twin.to_state()) == state.dumps(ours.to_state())


MACRO_F1_SCRIPT = """
import random
from connectors.observability.metrics import PartitionMetrics
rng = random.Random(5)
labels = [f"class-{i}" for i in range(40)]
metrics = PartitionMetrics()
for offset in range(3000):
    y = rng.choice(labels)
    metrics.update_multiclass(y, y if rng.random() < 0.6 else rng.choice(labels), {}, offset)
print(repr(metrics.macro_f1))
"""


def test_macro_f1_does_not_depend_on_the_processes_string_hashing():
    import os
    import subprocess
    import sys

    results = {
        subprocess.run([sys.executable, "-c", MACRO_F1_SCRIPT], capture_output=True, text=True,
                       check=True, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2", "3")
    }
    assert len(results) == 1, results


def test_per_class_counts_are_bounded_by_max_classes():
    ours = PartitionMetrics(max_classes=3)
    for offset, label in enumerate(["a", "b", "c", "d", "e", "a"]):
        ours.update_multiclass(label, "a", {"a": 0.5}, offset)
    summary = ours.summary()
    assert summary["classes"] == 3 and set(summary["per_class"]) == {"a", "b", "c"}
    assert summary["classes_untracked"] == 2 and summary["labelled"] == 6
    assert summary["per_class"]["a"] == {"support": 2, "predicted": 6, "correct": 2,
                                         "f1": 2 * (2 / 6) * 1.0 / (2 / 6 + 1.0)}
    assert PartitionMetrics.from_state(round_trip(ours.to_state())).summary() == summary


def multiclass_metrics_state() -> dict:
    ours = PartitionMetrics(rolling_window=10, max_classes=4)
    for offset, (y, y_pred) in enumerate([("a", "a"), ("b", "a"), ("b", "b"), (3, "b"), (3, 3)]):
        ours.update_multiclass(y, y_pred, {"a": 0.2, "b": 0.5, 3: 0.3}, offset)
    return round_trip(ours.to_state())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: s.update(max_classes=1), "max_classes"),
        (lambda s: s.update(max_classes=10**9), "max_classes"),
        (lambda s: s.update(max_classes=2), "at most max_classes=2"),
        (lambda s: s["support_labels"].append("z"), "support_counts must be 4 int64"),
        (lambda s: s.update(support_counts=s["support_counts"] + 1), "do not add up"),
        (lambda s: s.update(support_counts=s["support_counts"] * 10), r"in \[1, 5\]"),
        (lambda s: s.update(predicted_counts=-s["predicted_counts"]), r"in \[1, 5\]"),
        (lambda s: s.update(support_counts=s["support_counts"].astype(float)), "int64"),
        (lambda s: s["support_labels"].__setitem__(1, "a"), "a label twice"),
        (lambda s: s["support_labels"].__setitem__(1, {"float": 1.5}), "not a label"),
        (lambda s: s["support_labels"].__setitem__(1, "x" * 300), "300 characters"),
        (lambda s: s["correct_labels"].__setitem__(0, "zz"), "more correct predictions"),
        (lambda s: s.update(n_untracked=1), "do not add up"),
        (lambda s: s.update(n_unscored=-1), "n_unscored"),
        (lambda s: s.update(loss_n=99.0), "loss_n"),
        (lambda s: s.update(loss_n=2.5), "loss_n"),
        (lambda s: s.update(predicted_labels="abc"), "predicted_labels must be a list"),
        (lambda s: s.pop("correct_counts"), "expected the fields"),
    ],
)
def test_metrics_state_refuses_malformed_per_class_counts(change, reason):
    data = multiclass_metrics_state()
    PartitionMetrics.from_state(round_trip(data))  # the unchanged state restores
    change(data)
    with pytest.raises(state.StateError, match=reason):
        PartitionMetrics.from_state(data)


def test_a_hostile_metrics_state_cannot_claim_classes_beyond_the_bound():
    data = multiclass_metrics_state()
    data.update(max_classes=100_000, support_labels=[f"c{i}" for i in range(100_001)],
                support_counts=np.ones(100_001, dtype=np.int64))
    with pytest.raises(state.StateError, match="at most max_classes=100000"):
        PartitionMetrics.from_state(data)


def test_checkpoint_bytes_round_trip_and_reject_other_data():
    model = streammargin.ALMAClassifier()
    model.learn_one({"a": 1.0}, True)
    data = checkpoint.encode_checkpoint({"model": model.to_state(), "next_offset": 7})
    fields = checkpoint.decode_checkpoint(data)
    assert fields["next_offset"] == 7
    twin = streammargin.from_state(fields["model"])
    assert twin.predict_proba_one({"a": 0.3}) == model.predict_proba_one({"a": 0.3})
    with pytest.raises(state.StateError):
        checkpoint.decode_checkpoint(state.dumps({"format": "other"}))
    with pytest.raises(state.StateError):
        checkpoint.decode_checkpoint(b"\x80\x04pickle")
    assert checkpoint.checkpoint_key("g", "t", 3) == b"g/t/3"


# Models and command line --------------------------------------------------------------------------


def test_every_registered_model_has_a_short_name_and_builds():
    names = models.model_names()
    assert names["alma"] is streammargin.ALMAClassifier
    wrappers = {streammargin.OneVsRestClassifier}  # they need a model to wrap: no short name
    assert set(names.values()) == set(state.registered_models().values()) - wrappers
    for name, cls in names.items():
        assert name == cls.__name__.lower().removesuffix("classifier")
        assert isinstance(models.build_model(name), cls)
    assert models.model_class("ALMAClassifier") is streammargin.ALMAClassifier
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        models.model_class("nope")
    with pytest.raises(ValueError, match="bad parameters"):
        models.build_model("alma", {"gamma": 1})


def test_parse_params_types():
    assert models.parse_params(["a=1", "b=2.5", "c=True", "d=none", "e=rbf", "f=1e-3", "a=2"]) == {
        "a": 2, "b": 2.5, "c": True, "d": None, "e": "rbf", "f": 0.001
    }
    with pytest.raises(ValueError, match="key=value"):
        models.parse_params(["alpha"])


def parse_command(argv, monkeypatch, env=None):
    from connectors.cli import build_parser

    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    return kafka_command.config_from_args(build_parser().parse_args(["kafka", *argv]))


def test_command_options_come_from_the_command_line_and_the_environment(monkeypatch):
    config = parse_command(
        ["--param", "alpha=0.7", "--checkpoint-interval", "none", "--scale", "--topic", "t3"],
        monkeypatch,
        env={
            "STREAMMARGIN_TOPIC": "t1,t2",
            "STREAMMARGIN_BOOTSTRAP_SERVERS": "b:9093",
            "STREAMMARGIN_PARAM": "p=3,alpha=0.5",
            "STREAMMARGIN_IDLE_TIMEOUT": "2.5",
            "STREAMMARGIN_METRICS_TOPIC": "",
            "STREAMMARGIN_SECURITY_PROTOCOL": "SASL_SSL",
            "STREAMMARGIN_SASL_PLAIN_PASSWORD": "secret",
            "STREAMMARGIN_DRIFT_DETECTOR": "adwin",  # delta is ADWIN's (the default is DDM)
            "STREAMMARGIN_DRIFT_PARAM": "delta=0.01",
            "STREAMMARGIN_CREATE_TOPICS": "false",
            "STREAMMARGIN_ON_UNDECODABLE": "skip",
            "STREAMMARGIN_LABEL_STORE_BYTES": "5000",
        },
    )
    assert config.on_undecodable == "skip" and config.on_bad_checkpoint == "fail"
    assert config.label_store_bytes == 5000
    assert config.topics == ["t3"]  # the command line replaces the environment's list
    assert config.bootstrap_servers == "b:9093"
    assert config.params == {"p": 3, "alpha": 0.7}
    assert config.checkpoint_interval is None and config.idle_timeout == 2.5
    assert config.metrics_topic is None and config.scale is True and config.create_topics is False
    assert config.client_config == {
        "security_protocol": "SASL_SSL", "sasl_plain_password": "secret"
    }
    assert config.drift_params == {"delta": 0.01}
    config = parse_command([], monkeypatch, env={"STREAMMARGIN_TOPIC": "t1,t2"})
    assert config.topics == ["t1", "t2"]
    config = parse_command(["--topic", "t", "--on-bad-checkpoint", "reset", "--on-undecodable",
                            "fail", "--label-store-bytes", "7000"], monkeypatch)
    assert (config.on_bad_checkpoint, config.on_undecodable) == ("reset", "fail")
    assert config.task_settings().label_store_bytes == 7000


def test_command_options_for_multiclass_topics_and_headers(monkeypatch):
    config = parse_command(["--topic", "t", "--one-vs-rest", "--max-classes", "12",
                            "--copy-headers", "traceparent, tenant"], monkeypatch)
    settings = config.task_settings()
    assert (settings.one_vs_rest, settings.max_classes, settings.multiclass) == (True, 12, True)
    assert settings.copy_headers == ("traceparent", "tenant")
    config = parse_command(["--topic", "t", "--model", "convexpolytope", "--copy-headers", "NONE"],
                           monkeypatch, env={"STREAMMARGIN_ONE_VS_REST": "false"})
    settings = config.task_settings()
    assert settings.multiclass and not settings.one_vs_rest and settings.copy_headers == "none"
    assert parse_command(["--topic", "t"], monkeypatch).task_settings().copy_headers == "all"
    with pytest.raises(ValueError, match="natively multiclass"):
        parse_command(["--topic", "t", "--model", "convexpolytope", "--one-vs-rest"], monkeypatch)
    with pytest.raises(ValueError, match="--copy-headers"):
        parse_command(["--topic", "t", "--copy-headers", " , "], monkeypatch)


def test_client_settings_say_which_client_gets_which_setting():
    config = WorkerConfig(
        topics=["t"],
        bootstrap_servers="b:1",
        group_id="g",
        client_config={"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"},
        consumer_config={"sasl_plain_username": "u", "sasl_plain_password": "p",
                         "fetch_min_bytes": 7, "ssl_cafile": "/ca", "reconnect_backoff_ms": 77},
        producer_config={"ssl_cafile": "/ca", "linger_ms": 3, "sasl_kerberos_service_name": "k",
                         "max_request_size": 1000},
    )
    settings = client_settings(config, "cid")
    security = {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                "sasl_plain_username": "u", "sasl_plain_password": "p", "ssl_cafile": "/ca",
                "reconnect_backoff_ms": 77}
    # The admin client: common settings plus the connection settings of both clients.
    assert settings["admin"] == {"bootstrap_servers": "b:1", "client_id": "cid", **security,
                                 "sasl_kerberos_service_name": "k"}
    # The checkpoint reader: a consumer, with the consumer's connection settings only.
    assert settings["checkpoint_reader"] == {"bootstrap_servers": "b:1",
                                             "client_id": "cid-checkpoints", **security}
    consumer, producer = settings["consumer"], settings["producer"]
    assert consumer["group_id"] == "g" and consumer["fetch_min_bytes"] == 7
    assert {("security_protocol", "SASL_SSL"), ("sasl_mechanism", "PLAIN"),
            ("ssl_cafile", "/ca")} <= producer.items()
    assert not {"sasl_plain_username", "fetch_min_bytes", "reconnect_backoff_ms"} & producer.keys()
    assert producer["linger_ms"] == 3 and producer["max_request_size"] == 1000
    # Every client takes every setting it is given.
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    for name, cls in [("admin", KafkaAdminClient), ("checkpoint_reader", KafkaConsumer),
                      ("consumer", KafkaConsumer), ("producer", KafkaProducer)]:
        assert settings[name].keys() <= cls.DEFAULT_CONFIG.keys(), name
    names = connection_settings()
    assert {"security_protocol", "ssl_cafile", "sasl_plain_password", "socket_options"} <= names
    assert not {"group_id", "linger_ms", "fetch_min_bytes", "bootstrap_servers"} & names
    with pytest.raises(ValueError, match="different values of ssl_cafile"):
        WorkerConfig(topics=["t"], consumer_config={"ssl_cafile": "/a"},
                     producer_config={"ssl_cafile": "/b"})


def test_worker_config_fails_early_on_bad_settings():
    with pytest.raises(ValueError, match="at least one input topic"):
        WorkerConfig(topics=[])
    with pytest.raises(ValueError, match="unknown model"):
        WorkerConfig(topics=["t"], model="nope")
    with pytest.raises(ValueError, match="unknown drift detector"):
        WorkerConfig(topics=["t"], drift_detector="nope")
    with pytest.raises(ValueError, match="input topic cannot also be an output"):
        WorkerConfig(topics=["t"], predictions_topic="t")
    with pytest.raises(ValueError, match="on_bad_checkpoint must be one of"):
        WorkerConfig(topics=["t"], on_bad_checkpoint="ignore")
    with pytest.raises(ValueError, match="on_undecodable must be one of"):
        WorkerConfig(topics=["t"], on_undecodable="ignore")
    with pytest.raises(ValueError, match="label_store_bytes must be an integer >= 1"):
        WorkerConfig(topics=["t"], label_store_bytes=0)
    assert WorkerConfig(topics="t").topics == ["t"]


def test_command_exit_codes(monkeypatch, capsys):
    from connectors.cli import main

    assert main(["kafka", "--list-models"]) == 0
    assert "alma" in capsys.readouterr().out
    monkeypatch.delenv("STREAMMARGIN_TOPIC", raising=False)
    monkeypatch.delenv("STREAMMARGIN_ON_UNDECODABLE", raising=False)
    assert main(["kafka"]) == 2  # no input topic
    assert main(["kafka", "--topic", "t", "--on-undecodable", "ignore"]) == 2
    # The message names the option, not the WorkerConfig field.
    assert "--on-undecodable must be one of ('fail', 'skip')" in capsys.readouterr().err


def test_the_command_runs_its_worker_with_the_start_up_heap_frozen_and_sets_it_back():
    import gc

    before = gc.get_threshold(), gc.get_freeze_count()
    with kafka_command._collector_for_a_worker():
        assert gc.get_threshold() == (kafka_command.GC_YOUNG_THRESHOLD, *before[0][1:])
        assert gc.get_freeze_count() > 0
        garbage = []
        garbage.append(garbage)  # a cycle made while running is still collected
        del garbage
        assert gc.collect() > 0
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def test_checkpoint_size_options_reach_the_worker_config(monkeypatch):
    config = parse_command(["--topic", "t", "--max-checkpoint-bytes", "1000000"], monkeypatch,
                           env={"STREAMMARGIN_CHECKPOINT_CHUNK_BYTES": "65536"})
    assert (config.checkpoint_chunk_bytes, config.max_checkpoint_bytes) == (65536, 1_000_000)
    monkeypatch.delenv("STREAMMARGIN_CHECKPOINT_CHUNK_BYTES")
    defaults = parse_command(["--topic", "t"], monkeypatch)
    assert defaults.checkpoint_chunk_bytes == checkpoint.DEFAULT_CHUNK_BYTES == 512 << 10
    assert defaults.max_checkpoint_bytes == checkpoint.DEFAULT_MAX_CHECKPOINT_BYTES == 1 << 30
    with pytest.raises(ValueError, match="checkpoint_chunk_bytes must be >= 1024"):
        WorkerConfig(topics=["t"], checkpoint_chunk_bytes=100)
    with pytest.raises(ValueError, match="max_checkpoint_bytes must be >= 1"):
        WorkerConfig(topics=["t"], max_checkpoint_bytes=0)



def test_command_failures_are_one_line_naming_the_cause_and_the_fix():
    from kafka import errors

    from connectors.task import TaskFailure
    from connectors.worker.worker import WorkerError

    message = kafka_command._failure_message(errors.KafkaTimeoutError("slow"))
    assert message == ("Kafka error: KafkaTimeoutError: slow. Fix: check the broker address, the "
                       "topics and this client's permissions on them (nothing was committed)")
    assert kafka_command._failure_message(WorkerError("cause. Fix: this")) == (
        "cause. Fix: this")
    failure = TaskFailure("t", 0, 7, ValueError("bug"))
    assert kafka_command._failure_message(failure).startswith(
        "record t/0@7 made the model or codec fail with ValueError: bug")
    assert "\n" not in kafka_command._failure_message(RuntimeError("x\n" * 1000))[:400]


# Transports ---------------------------------------------------------------------------------------


def test_the_transport_is_chosen_by_option_and_checked_with_its_settings(monkeypatch):
    from connectors.worker.worker import WorkerConfig

    assert parse_command(["--topic", "t"], monkeypatch).transport == "kafka-python"
    assert parse_command(["--topic", "t", "--transport", "librdkafka"],
                         monkeypatch).transport == "librdkafka"
    with pytest.raises(ValueError, match="transport must be one of"):
        WorkerConfig(topics=["t"], transport="java")
    # A kafka-python setting librdkafka has no name for is refused before connecting; its own
    # properties (dotted names) pass.
    WorkerConfig(topics=["t"], transport="librdkafka",
                 consumer_config={"queued.max.messages.kbytes": 1024})
    with pytest.raises(ValueError, match="consumer setting selector has no librdkafka"):
        WorkerConfig(topics=["t"], transport="librdkafka", consumer_config={"selector": None})
    # And a setting kafka-python does not know is refused before connecting too, named (it
    # raised a bare ValueError in the producer's constructor: "unexpected error").
    WorkerConfig(topics=["t"], consumer_config={"fetch_min_bytes": 1},
                 producer_config={"linger_ms": 5})
    with pytest.raises(ValueError, match="--producer-config buffer_memory: kafka-python .* no "
                                         "such KafkaProducer setting"):
        WorkerConfig(topics=["t"], producer_config={"buffer_memory": 1 << 20})
    with pytest.raises(ValueError, match="--consumer-config queued.max.messages.kbytes: "
                                         "kafka-python .* KafkaConsumer.*--transport librdkafka"):
        WorkerConfig(topics=["t"], consumer_config={"queued.max.messages.kbytes": 1024})


def test_librdkafka_errors_become_the_workers_kafka_python_errors():
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from kafka import errors

    from connectors.kafka.librdkafka_transport import client_error
    from connectors.worker.failures import _send_failure

    code = confluent_kafka.KafkaError
    assert isinstance(client_error(code(code.MSG_SIZE_TOO_LARGE)),
                      errors.MessageSizeTooLargeError)
    assert isinstance(client_error(confluent_kafka.KafkaException(code(code._MSG_TIMED_OUT))),
                      errors.KafkaTimeoutError)
    assert type(client_error(code(code._FAIL))) is errors.KafkaError
    message = str(_send_failure("outputs", client_error(code(code.TOPIC_AUTHORIZATION_FAILED))))
    assert "TopicAuthorizationFailedError" in message and "grant this client's principal" in message


def test_librdkafka_consumers_fetch_again_after_10_ms_unless_told_otherwise(monkeypatch):
    pytest.importorskip("confluent_kafka")
    from connectors.kafka import librdkafka_transport

    made = []
    monkeypatch.setattr("confluent_kafka.Consumer", lambda properties: made.append(properties))
    librdkafka_transport._new_consumer({"group.id": "g"}, "consumer")
    librdkafka_transport._new_consumer({"group.id": "g", "fetch.queue.backoff.ms": 500},
                                       "consumer")
    assert [properties["fetch.queue.backoff.ms"] for properties in made] == [10, 500]


LIBRDKAFKA_START_SCRIPT = """
import sys
from connectors.state.checkpoint import CheckpointStore
from connectors.kafka.librdkafka_transport import CheckpointReader, LibrdkafkaTransport
from connectors.worker.worker import WorkerConfig, client_settings, _import_in_background
settings = client_settings(WorkerConfig(topics=["t"], transport="librdkafka"))
transport = LibrdkafkaTransport(settings)
CheckpointStore("127.0.0.1:1", "checkpoints", "g", producer=transport, reader_config={},
                reader_factory=CheckpointReader)
before = "kafka" in sys.modules
_import_in_background("kafka")  # what the worker does once it has subscribed
import threading
for thread in threading.enumerate():
    if thread.name == "import kafka":
        thread.join(60)
print(before, "kafka" in sys.modules)
"""


def test_a_worker_on_librdkafka_loads_kafka_python_only_once_it_waits_for_its_group():
    # kafka-python is the worker's vocabulary of partitions and errors, ~0.15 s of imports: on
    # librdkafka the worker imports it on a thread while the group join holds the main thread.
    pytest.importorskip("confluent_kafka")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LIBRDKAFKA_START_SCRIPT], capture_output=True,
                          text=True, timeout=120, cwd=pathlib.Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("late", ["joined", "failed"])
def test_a_group_join_that_ends_after_the_poll_that_sent_it_is_not_lost(late):
    # kafka-python 3.0.12 dropped a JoinGroup -> SyncGroup round that ended after its poll timed
    # out: the member stayed rebalancing for good, without heartbeats or its assignment (Apache
    # Kafka expired it; connectors/kafka/transport.py, install_pending_join_fix). No broker here:
    # the rounds are scripted, the second ends (or fails) between two polls.
    import time

    from kafka import KafkaConsumer, TopicPartition
    from kafka.coordinator.base import Generation
    from kafka.errors import RebalanceInProgressError
    from kafka.future import Future
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment
    from kafka.structs import MemberState

    from connectors.kafka.broker import free_port
    from connectors.kafka.transport import install_pending_join_fix

    install_pending_join_fix()
    install_pending_join_fix()  # idempotent
    second = Future()
    rounds = [Future().success((1, [("t", [0, 1])])), second,
              Future().success((3, [("t", [0, 1]), ("u", [0])]))]
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{free_port()}", api_version=(4, 1),
                             group_id="g", enable_auto_commit=False)
    coordinator = consumer._coordinator

    async def join_and_sync():  # BaseCoordinator._do_join_and_sync_async's effects on the member
        with coordinator._lock:
            coordinator.state = MemberState.REBALANCING
        coordinator.group_protocols()  # the subscription the JoinGroup sends
        generation, partitions = await rounds.pop(0)
        coordinator._generation = Generation(generation, "m", "range")
        return ConsumerProtocolAssignment(0, partitions, b"").encode()

    async def heartbeat():
        pass

    coordinator.coordinator_unknown = lambda: False
    coordinator._do_join_and_sync_async = join_and_sync
    coordinator._send_heartbeat_request = heartbeat
    try:
        consumer.subscribe(["t"])
        assert coordinator.poll(timeout_ms=5000) and coordinator.state == MemberState.STABLE
        consumer.subscribe(["t", "u"])  # a rejoin whose round clears need_rejoin()'s reason
        assert not coordinator.poll(timeout_ms=0)  # sends the JoinGroup, gives up at once
        coordinator._net.call_soon_threadsafe(
            (lambda: second.success((2, [("t", [0, 1]), ("u", [0])]))) if late == "joined"
            else (lambda: second.failure(RebalanceInProgressError())))
        deadline = time.monotonic() + 10
        while not coordinator._join_task.is_done:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert coordinator.poll(timeout_ms=5000)
        assert coordinator.state == MemberState.STABLE and coordinator._heartbeat_enabled
        assert coordinator._generation.generation_id == (2 if late == "joined" else 3)
        assert consumer.assignment() == {TopicPartition("t", 0), TopicPartition("t", 1),
                                         TopicPartition("u", 0)}
    finally:
        consumer.close(timeout_ms=100)


@pytest.mark.parametrize(("options", "total"), [
    ({}, 8 << 20),  # partition scope on kafka-python: what a fetch holds in all is bounded
    ({"max_record_bytes": 16 << 20}, 16 << 20),  # (a record of that size still fits)
    # Without --max-memory: 256 KiB a partition bounds topic scope; librdkafka's memory is its
    # prefetch queue.
    ({"model_scope": "topic", "model_topic": "m", "max_memory": None}, 64 << 20),
    ({"transport": "librdkafka", "max_memory": None}, 64 << 20),
    # Under --max-memory (1 GiB by default) the fetch buffers' share bounds both: kafka-python's
    # 8 MiB, librdkafka's queue and its response a fifth of 1/8 of the ceiling each.
    ({"model_scope": "topic", "model_topic": "m"}, 8 << 20),
    ({"transport": "librdkafka"}, 25 << 20),
    ({"transport": "librdkafka", "max_memory": 256 << 20}, 6 << 20),
])
def test_a_fetch_holds_at_most_what_the_scope_and_client_allow(options, total):
    from connectors.worker.worker import WorkerConfig, client_settings

    settings = client_settings(WorkerConfig(topics=["events"], **options))["consumer"]
    assert settings["fetch_max_bytes"] == total
    assert settings["max_partition_fetch_bytes"] == min(total, (
        256 << 10 if options.get("model_scope") == "topic"
        else max(4 << 20, options.get("max_record_bytes", 0))))
    queue = settings.get("queued.max.messages.kbytes")
    if options.get("transport") == "librdkafka" and options.get("max_memory", 1) is not None:
        assert queue == total >> 10
    else:
        assert queue is None


@pytest.mark.parametrize("bug", [ImportError("no module"), AttributeError("no attribute"),
                                 NameError("undefined")])
def test_a_bug_in_the_batch_reader_is_raised_as_it_is_not_as_an_undecodable_batch(bug):
    def buggy_reader(part, tp, records, original, *args, **kwargs):
        raise bug
        yield  # (a generator, as the fetcher's reader is)

    try:
        codec.install_batch_errors(unpack=buggy_reader)
        with pytest.raises(type(bug)):
            fetched(batch_bytes(VALUES[:5], 0, offset=0)).take(100)
    finally:
        codec._unpack = None  # (the next test installs the reader it wants)


def test_the_record_format_options_reach_the_worker_config():
    parser = argparse.ArgumentParser()
    kafka_command.add_parser(parser.add_subparsers())
    args = parser.parse_args([
        "kafka", "--topic", "payments", "--features", "*", "--exclude-features", "a,b.c",
        "--label-field", "is_fraud", "--id-field", "tx", "--categorical", "hash",
        "--hash-buckets", "64", "--value-format", "avro", "--schema-registry-url",
        "http://registry:8081", "--schema-registry-config", "basic.auth.user.info=u:p",
        "--schema-registry-config", "timeout=5", "--output-format", "avro",
        "--label-topic", "labels"])
    config = kafka_command.config_from_args(args)
    assert (config.features, config.exclude_features) == (("*",), ("a", "b.c"))
    assert (config.label_field, config.id_field, config.categorical, config.hash_buckets) == (
        "is_fraud", "tx", "hash", 64)
    assert config.schema_registry_config == {"basic.auth.user.info": "u:p", "timeout": "5"}
    assert (config.value_format, config.output_format, config.label_topic) == (
        "avro", "avro", "labels")
    settings = config.task_settings()
    assert settings.field_mapping() == FieldMapping(
        label_field="is_fraud", id_field="tx", features=("*",), exclude_features=("a", "b.c"),
        categorical="hash", hash_buckets=64)


@pytest.mark.parametrize(("options", "reason"), [
    ({"value_format": "avro"}, "needs --schema-registry-url"),
    ({"output_format": "avro"}, "needs --schema-registry-url"),
    ({"schema_registry_url": "http://r"}, "is for --value-format avro"),
    ({"value_format": "xml"}, "value_format must be one of"),
    ({"label_topic": "t"}, "topic of its own"),
    ({"label_topic": "l", "topics": ["a", "b"]}, "pairs with one --topic"),
    ({"label_topic": "l", "consumer_config": {"partition_assignment_strategy": "roundrobin"}},
     "range assignor"),
    ({"features": ["a..b"]}, "empty segment"),
    ({"value_format": "avro", "schema_registry_url": "http://r",
      "schema_registry_config": {"proxy": "p"}}, "does not support"),
])
def test_record_format_options_that_contradict_fail_in_one_line(options, reason):
    settings = {"topics": ["t"], **options}
    with pytest.raises(ValueError, match=reason):
        WorkerConfig(**settings)


class FakeMessage:
    """What confluent-kafka's Message gives (record_batch.c calls the methods by name)."""

    def __init__(self, topic, partition, offset, value, key=None, headers=None, error=None):
        self._fields = (topic, partition, offset, value, key, headers, error)

    def topic(self):
        return self._fields[0]

    def partition(self):
        return self._fields[1]

    def offset(self):
        return self._fields[2]

    def value(self):
        return self._fields[3]

    def key(self):
        return self._fields[4]

    def headers(self):
        return self._fields[5]

    def error(self):
        return self._fields[6]

    def timestamp(self):
        return (1, 1_700_000_000_000 + self._fields[2])


def test_librdkafka_records_are_made_in_c_as_in_python():
    from connectors.kafka import librdkafka_transport
    from connectors.kafka.librdkafka_transport import Record

    native = librdkafka_transport._native()
    if native is None:
        pytest.skip("record_batch.c is not built (streammargin warmup)")
    messages = [FakeMessage("t", i % 2 if i < 6 else 1, i, None if i == 3 else b"v%d" % i,
                            key=b"k" if i % 3 else None, headers=[("h", b"1")] if i == 2 else None)
                for i in range(10)]
    messages[7] = FakeMessage("t", 1, 7, b"x", error="an error")
    runs, index, value_bytes, values = native.message_records(messages, 0, Record)
    assert index == 7 and values == 6 and value_bytes == sum(
        len(m.value()) for m in messages[:7] if m.value() is not None)
    made = [record for _, _, records in runs for record in records]
    assert made == [Record(m.topic(), m.partition(), m.offset(), m.timestamp()[1], m.key(),
                           m.value(), m.headers() or []) for m in messages[:7]]
    assert [(topic, partition, len(records)) for topic, partition, records in runs] == [
        ("t", 0, 1), ("t", 1, 1), ("t", 0, 1), ("t", 1, 1), ("t", 0, 1), ("t", 1, 2)]
    runs, index, _, _ = native.message_records(messages, 8, Record)
    assert index == 10 and [len(records) for _, _, records in runs] == [2]


def test_librdkafka_sends_from_c_stop_before_what_python_must_send():
    from connectors.kafka import librdkafka_transport

    native = librdkafka_transport._native()
    if native is None:
        pytest.skip("record_batch.c is not built (streammargin warmup)")
    sent = []

    def produce(topic, value, key, partition=None, on_delivery=None, timestamp=None,
                headers=None):
        if value == b"full":
            raise BufferError("Local: Queue full")
        sent.append((topic, value, key, partition, timestamp, headers))

    values = [b"a", b"b", b"c", b"full", b"e"]
    keys = [b"k", None, b"k", b"k", None]
    headers = [None, [("h", b"1")], [("h", None)], [], None]
    timestamps = [1, 2, 3, 4, None]
    index = native.produce_many(produce, "out", 3, values, keys, headers, timestamps, print, 0)
    assert index == 2  # a header without value: Python makes it sendable
    assert sent == [("out", b"a", b"k", 3, 1, None), ("out", b"b", None, 3, 2, [("h", b"1")])]
    assert native.produce_many(produce, "out", 3, values, keys, headers, timestamps, print,
                               3) == 3  # a full queue: Python waits for room
    assert native.produce_many(produce, "out", 3, values, keys, headers, timestamps, print,
                               4) == 4  # no timestamp: the producer's clock, in Python


def test_librdkafka_deliveries_counted_in_c_end_done_or_failed():
    from kafka import errors

    from connectors.kafka.librdkafka_transport import Delivery

    confluent_kafka = pytest.importorskip("confluent_kafka")
    delivery = Delivery(None, 3)
    assert not delivery.is_done and delivery.value is None
    message = FakeMessage("t", 0, 41, b"v")
    for _ in range(3):
        delivery.report(None, message)
    assert delivery.is_done and delivery.succeeded() and delivery.value == ("t", 0, 41)
    failing = Delivery(None, 2)
    seen = []
    failing.add_errback(seen.append)
    failing.report(confluent_kafka.KafkaError(confluent_kafka.KafkaError._MSG_TIMED_OUT),
                   message)
    assert failing.is_done and failing.failed()
    assert isinstance(failing.exception, errors.KafkaTimeoutError) and seen == [failing.exception]
    with pytest.raises(errors.KafkaTimeoutError):
        failing.get()
