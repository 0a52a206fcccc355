"""What the worker says about the input it cannot use (connectors/observability/input_watch.py):
dead letters at first contact, starting or surging mid-stream; labels that join nothing; fields
left out of the features. Each is counted, and logged once with the fix, rate-limited."""

from __future__ import annotations

import pytest

from connectors.observability.input_watch import (
    ORPHAN_LABELS,
    SURGE_FACTOR,
    SURGE_RECORDS,
    InputWatch,
)
from connectors.serializers.mapping import FieldMapping
from connectors.task import dead_letter_headers
from connectors.task.pending_labels import PendingLabels


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def dead(reason: str, exception: str = "connectors.codec.InvalidRecord"):
    headers = dead_letter_headers("t", 0, 1, "g", "VALUE_CONVERTER", "c", exception, reason)
    return type("R", (), {"headers": headers})()


UNKNOWN_SCHEMA = "connectors.serializers.schema_registry.UnknownSchema"


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
    assert quiet.warned is None  # (4 of 10: no first-contact warning; a "started" one instead)
    assert quiet.warnings == {"started": 1}


def test_a_kind_that_starts_mid_stream_warns_at_once_with_the_count_and_the_fix(caplog):
    clock = Clock()
    watch = InputWatch(first_records=10, clock=clock)
    watch.observe(500, [])
    clock.now += 600  # ten quiet minutes, then the registry forgets every schema id
    with caplog.at_level("WARNING"):
        watch.observe(50, [dead("unknown schema id 3", UNKNOWN_SCHEMA)] * 50)
        clock.now += 10
        watch.observe(50, [dead("unknown schema id 3", UNKNOWN_SCHEMA)] * 50)
    [line] = warnings_of(caplog)
    assert line.startswith("50 records went to the dead-letter topic as unknown_schema, which "
                           "the last minute had none of (50 in all): unknown schema id 3")
    assert "restarted without its storage" in line
    assert watch.counts() == {"unknown_schema": 100}


def test_warnings_are_rate_limited_to_one_a_minute_a_kind_and_a_surge_warns_again(caplog):
    clock = Clock()
    watch = InputWatch(first_records=1, clock=clock)
    watch.observe(1, [])
    with caplog.at_level("WARNING"):
        watch.observe(10, [dead("bad JSON: a")])  # started
        for _ in range(5):  # a trickle: quiet in the log
            clock.now += 30
            watch.observe(10, [dead("bad JSON: a")] * 2)
        assert len(warnings_of(caplog)) == 1
        clock.now += 60  # a window of 4, then a surge: SURGE_FACTOR x and SURGE_RECORDS
        watch.observe(10, [dead("bad JSON: a")] * 4)
        clock.now += 60
        watch.observe(400, [dead("bad JSON: b")] * (SURGE_RECORDS - 1))
        assert len(warnings_of(caplog)) == 1
        watch.observe(10, [dead("bad JSON: b")])
        watch.observe(10, [dead("bad JSON: b")] * 50)  # (once a window)
    lines = warnings_of(caplog)
    assert len(lines) == 2 and lines[1].startswith(
        f"{SURGE_RECORDS} records went to the dead-letter topic as bad_json within a minute, 4 "
        "in the minute before")
    assert watch.warnings == {"started": 1, "surged": 1}
    assert SURGE_RECORDS >= SURGE_FACTOR * 4


def test_a_kind_seen_once_among_the_first_records_is_still_named(caplog):
    watch = InputWatch(first_records=100)
    with caplog.at_level("WARNING"):
        watch.observe(60, [dead("bad JSON: x")])
        assert not warnings_of(caplog)  # (first contact decides first)
        watch.observe(60, [])
    [line] = warnings_of(caplog)
    assert line.startswith("1 record went to the dead-letter topic as bad_json")


class Task:
    def __init__(self, pending: PendingLabels) -> None:
        self.pending = pending


@pytest.mark.parametrize("waiting", [True, False])
def test_most_labels_of_a_window_joining_nothing_warn_with_the_likely_cause(caplog, waiting):
    clock = Clock()
    watch = InputWatch(clock=clock)
    pending = PendingLabels(1000)
    task = Task(pending)
    watch.adopt([task])
    if waiting:
        for i in range(5):
            pending.add(f"tx-{i}", {"a": 1.0}, i, 0, True, 0.9, 100)
    with caplog.at_level("WARNING"):
        for i in range(ORPHAN_LABELS - 1):
            pending.pop(100_000 + i, 10 + i, 0)
        watch.labels(task)
        assert not warnings_of(caplog)  # too few labels to tell
        pending.pop(7, 50, 0)
        watch.labels(task)
        for i in range(100):
            pending.pop(200_000 + i, 60, 0)
        watch.labels(task)  # (one a minute)
    [line] = warnings_of(caplog)
    assert line.startswith(f"{ORPHAN_LABELS} of the last {ORPHAN_LABELS} delayed labels joined no "
                           "waiting event")
    assert "one had the id 7 (int)" in line
    if waiting:
        assert "waiting events have ids such as 'tx-0' (str)" in line
    else:
        assert "no event was waiting" in line
    assert "Fix: --id-field naming the same id" in line
    assert watch.orphans == ORPHAN_LABELS + 100


def test_labels_that_mostly_join_are_not_warned_of(caplog):
    watch = InputWatch()
    pending = PendingLabels(1000)
    task = Task(pending)
    watch.adopt([task])
    with caplog.at_level("WARNING"):
        for i in range(100):
            pending.add(i, {"a": 1.0}, i, 0, True, 0.9, 100)
            pending.pop(str(i) if i % 3 else i, i, 0)  # (7 and "7" join)
            if i % 4 == 0:
                pending.pop(f"none-{i}", i, 0)
            watch.labels(task)
    assert not warnings_of(caplog)
    assert (pending.joined, pending.orphans, watch.orphans) == (100, 25, 25)


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


def test_the_call_that_ends_the_first_records_warns_once_as_first_contact(caplog):
    watch = InputWatch(first_records=10)
    with caplog.at_level("WARNING"):
        watch.observe(10, [dead("bad JSON: x")] * 10)
    assert len(warnings_of(caplog)) == 1 and watch.warnings == {"first_contact": 1}
