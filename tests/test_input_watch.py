"""What the worker says about the input it cannot use (connectors/observability/input_watch.py):
dead letters at first contact; fields left out of the features. Each is counted, and logged
once with the fix."""

from __future__ import annotations

from connectors.observability.input_watch import InputWatch
from connectors.serializers.mapping import FieldMapping
from connectors.worker.task import dead_letter_headers


def dead(reason: str, exception: str = "connectors.codec.InvalidRecord"):
    headers = dead_letter_headers("t", 0, 1, "g", "VALUE_CONVERTER", "c", exception, reason)
    return type("R", (), {"headers": headers})()


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_first_contact_warns_once_with_the_reason_and_the_fix(caplog):
    contact = InputWatch(first_records=10)
    with caplog.at_level("WARNING"):
        contact.observe(4, [dead("no features and no label: ... Fix: --features '*'")] * 3)
        contact.observe(6, [dead("no features and no label: ...")] * 4)
        contact.observe(100, [dead("no features and no label: ...")] * 90)
    assert warnings_of(caplog) == [
        "7 of the first 10 records went to the dead-letter topic for one reason "
        "(missing_features): no features and no label: ... Fix: --features '*'"]
    assert contact.counts() == {"missing_features": 97}
    quiet = InputWatch(first_records=10)
    quiet.observe(10, [dead("bad JSON: x")] * 4)
    quiet.check()
    assert quiet.warned is None


def test_fields_left_out_are_named_once_each_with_the_option_that_silences_them(caplog):
    mapper = FieldMapping(features=("*",)).mapper()
    watch = InputWatch()
    with caplog.at_level("WARNING"):
        mapper.event({"a": 1.0, "tags": [1], "raw": b"\x00", "note": "n" * 300, "y": 1})
        watch.left_out_fields(mapper)
        for _ in range(10):
            mapper.event({"a": 1.0, "tags": [], "raw": b"\x01", "y": 1})
            watch.left_out_fields(mapper)
        mapper.event({"a": 1.0, "m": {"v": float("nan")}, "y": 1})
        watch.left_out_fields(mapper)
    lines = warnings_of(caplog)
    assert lines == [
        "fields left out of the features (they hold no feature; the records are predicted "
        "without them): tags (an array), raw (bytes), note (a string too long for a category). "
        "To silence this: --categorical hash, or --exclude-features tags,raw,note",
        "fields left out of the features (they hold no feature; the records are predicted "
        "without them): m.v (NaN, an infinity or a number beyond float64). To silence this: "
        "--exclude-features m.v"]
    assert watch.left_out == {"array": 11, "bytes": 11, "long_string": 1, "non_finite": 1}
