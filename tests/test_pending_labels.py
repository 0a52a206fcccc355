"""Incremental checkpoints of the pending store, without a broker.

A checkpoint writes the predictions of the events that came since the last one (a segment) and a
bit per waiting event; a restore reads the events again from the input records. These tests hold
the checkpoint topic's part in a dict (what `CheckpointStore` keeps of a key's segments) and the
input topic in a list of records.
"""

from __future__ import annotations

import collections
import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.serializers.mapping import FieldMapping
from connectors.state import checkpoint
from connectors.task import PartitionTask, TaskSettings, pending_labels
from connectors.task.pending_labels import (
    MAX_SEGMENTS,
    SPARSE,
    PendingLabels,
    pending_entry_bytes,
)
from streammargin import StateError, state

Record = collections.namedtuple("Record", "topic partition offset timestamp key value headers")


class SegmentTopic:
    """What the checkpoint topic holds of one key: the latest payload and its segments."""

    def __init__(self) -> None:
        self.payload: bytes | None = None
        self.segments: dict[int, bytes] = {}
        self.written: list[int] = []

    def write(self, write: checkpoint.CheckpointWrite) -> None:
        assert set(write.kept_segments) <= set(self.segments)
        assert not set(write.new_segments) & set(self.segments)
        self.segments = {i: self.segments[i] for i in write.kept_segments}
        self.segments.update(write.new_segments)
        self.payload = write.payload
        self.written.append(write.written_bytes)


def fraud_stream(n: int, seed: int, labelled: float = 0.02, delay: int = 400) -> list[Record]:
    """Events with an id, 2% labelled at once; the label of each of the others comes `delay`
    records later or never (the store's limits then evict or expire it)."""
    rng = random.Random(seed)
    values: list[bytes] = []
    later: dict[int, list[bytes]] = collections.defaultdict(list)
    for i in range(n):
        values.extend(later.pop(i, []))
        x = {"amount": rng.uniform(0, 100), "risk": rng.random(),
             "country": rng.choice(["BR", "FR", "US"])}
        fraud = x["amount"] / 100 + x["risk"] + (0.6 if x["country"] == "BR" else 0) > 1.2
        if rng.random() < labelled:
            values.append(json.dumps({"tx": f"t{i}", **x, "fraud": fraud}).encode())
            continue
        values.append(json.dumps({"tx": f"t{i}", **x}).encode())
        if rng.random() < 0.7:
            later[i + rng.randint(1, delay)].append(json.dumps({"tx": f"t{i}",
                                                                "fraud": fraud}).encode())
    return [Record("events", 0, offset, 1_700_000_000_000 + offset, None, value, [])
            for offset, value in enumerate(values)]


FLAT = FieldMapping(label_field="fraud", id_field="tx", features=("*",))
SETTINGS = TaskSettings(mapping=FLAT, scale=True, label_store_size=3_000,
                        label_max_age_records=5_000)


def run_to(task: PartitionTask, records: list[Record], end: int) -> None:
    """Process records (offset = index) up to offset `end`."""
    while task.next_offset is None or task.next_offset < end:
        task.process(records, task.next_offset or 0, end=end)


def restored(topic: SegmentTopic, records: list[Record]) -> PartitionTask:
    """The task of the topic's latest checkpoint, its waiting events read again from records."""
    task = PartitionTask.restore(topic.payload, "events", 0, SETTINGS, segments=topic.segments)
    span = task.rebuild_range()
    if span is not None:
        task.rebuild_pending(records[span[0]:span[1]])
    task.finish_rebuild()
    return task


def same_store(a: PendingLabels, b: PendingLabels) -> None:
    assert list(a.entries.items()) == list(b.entries.items())
    assert (a.n_bytes, a.max_timestamp, a.counters()) == (b.n_bytes, b.max_timestamp,
                                                          b.counters())


def test_a_restore_from_any_incremental_checkpoint_ends_with_the_uninterrupted_model():
    records = fraud_stream(12_000, seed=3)
    straight = PartitionTask.new("events", 0, SETTINGS)
    run_to(straight, records, len(records))
    topic = SegmentTopic()
    task = PartitionTask.new("events", 0, SETTINGS)
    cuts = list(range(700, len(records), 700))
    for cut in cuts:
        run_to(task, records, cut)
        topic.write(task.checkpoint_write())
        task.mark_checkpointed()
        twin = restored(topic, records)
        same_store(twin.pending, task.pending)
        assert twin.pending.lost == 0
        assert state.dumps(twin.model.to_state()) == state.dumps(task.model.to_state())
        # Segments stay few and dense: what a restore reads is bounded by what waits.
        assert len(topic.segments) <= MAX_SEGMENTS
        held = sum(len(s.offsets) for s in task.pending.segments)
        assert held <= SPARSE * len(task.pending) + 700
    # The last restored twin goes on to the end with the uninterrupted run's model and metrics.
    run_to(twin, records, len(records))
    assert state.dumps(twin.model.to_state()) == state.dumps(straight.model.to_state())
    assert twin.metrics.summary() == straight.metrics.summary()
    same_store(twin.pending, straight.pending)


def test_a_checkpoint_writes_what_came_since_the_last_one_whatever_waits():
    # No label ever comes: the store fills to 20,000 events, and each checkpoint of 1,000
    # records writes the same bytes (the whole store's rewrite grew 20x).
    records = fraud_stream(20_000, seed=4, labelled=0.0)
    records = [r._replace(offset=i, timestamp=r.timestamp - r.offset + i) for i, r in
               enumerate(r for r in records if b"fraud" not in r.value)]
    settings = TaskSettings(mapping=FLAT, label_store_size=100_000)
    task = PartitionTask.new("events", 0, settings)
    topic = SegmentTopic()
    whole = []
    for cut in range(1_000, 20_001, 1_000):
        run_to(task, records, cut)
        topic.write(task.checkpoint_write())
        task.mark_checkpointed()
        whole.append(len(task.to_checkpoint()))
    inputs = sum(len(r.value) for r in records[:1_000])
    written = topic.written[1:]
    assert max(written) < 1.2 * min(written), written
    assert max(written) < 0.25 * inputs, (written, inputs)
    assert whole[-1] > 15 * whole[0]


def test_waiting_events_the_input_no_longer_has_are_lost_and_counted():
    records = fraud_stream(3_000, seed=5, labelled=0.0)
    task = PartitionTask.new("events", 0, SETTINGS)
    run_to(task, records, len(records))
    topic = SegmentTopic()
    topic.write(task.checkpoint_write())
    waiting = len(task.pending)
    twin = PartitionTask.restore(topic.payload, "events", 0, SETTINGS, segments=topic.segments)
    start, stop = twin.rebuild_range()
    # Retention deleted the first 1,000 records, and one record no longer decodes.
    kept = records[1_000:stop]
    broken = next(i for i, r in enumerate(kept) if twin.pending.served_at(r.offset))
    kept[broken] = kept[broken]._replace(value=b"{not json")
    twin.rebuild_pending(kept)
    lost = twin.finish_rebuild()
    expected = sum(1 for offset, _ in enumerate(records[:1_000])
                   if any(e[1] == offset for e in task.pending.entries.values())) + 1
    assert lost == expected and twin.pending.lost == lost
    assert len(twin.pending) == waiting - lost
    assert twin.metrics_event("periodic")["labels"]["lost"] == lost


def binary_store(n: int) -> PendingLabels:
    store = PendingLabels(max_size=10_000)
    for i in range(n):
        store.add(f"e{i}", {"f": float(i)}, offset=2 * i, timestamp=i, y_pred=bool(i % 2),
                  p_true=(i % 7) / 7, size=100)
    return store


def checkpointed(store: PendingLabels, next_offset: int) -> tuple[dict, dict[int, bytes]]:
    head, new, kept = store.checkpoint_state(next_offset)
    store.checkpoint_written()
    return state.loads(state.dumps({"head": head}))["head"], dict(new)


def read_back(head: dict, segments: dict, next_offset: int) -> PendingLabels:
    return PendingLabels.from_checkpoint_state(head, segments, next_offset, max_size=10_000)


@pytest.mark.parametrize("mutate, reason", [
    (lambda h, s: h.update(segments=h["segments"] * 2), "distinct ids"),
    (lambda h, s: h.update(segments=[0]), "distinct ids"),
    (lambda h, s: h.update(segment_sizes=h["segment_sizes"][:0]), "segment_sizes"),
    (lambda h, s: h.update(waiting=h["waiting"][1:]), "must hold"),
    (lambda h, s: h.update(next_segment=1), "next_segment"),
    (lambda h, s: s.clear(), "the checkpoint holds"),
    (lambda h, s: s.update({1: b"junk"}), "pending segment 1"),
    (lambda h, s: s.update({1: state.dumps({"format": "other"})}), "is not a"),
    (lambda h, s: s.update({1: state.dumps({
        "format": pending_labels.SEGMENT_FORMAT, "first_offset": 0,
        "gaps": np.array([0] + [1] * 9, np.int32), "y_pred": np.zeros(10, np.bool_),
        "p_true": np.full(10, 2.0)})}), "outside"),
    (lambda h, s: s.update({1: state.dumps({
        "format": pending_labels.SEGMENT_FORMAT, "first_offset": 0,
        "gaps": np.array([0, 1, 1, 0, 1, 1, 1, 1, 1, 1], np.int32),
        "y_pred": np.zeros(10, np.bool_), "p_true": np.zeros(10)})}), "increasing"),
    (lambda h, s: s.update({1: state.dumps({
        "format": pending_labels.SEGMENT_FORMAT, "first_offset": 0,
        "gaps": np.array([0] + [1] * 8, np.int32), "y_pred": np.zeros(9, np.bool_),
        "p_true": np.zeros(9)})}), "the head says"),
    (lambda h, s: s.update({1: state.dumps({
        "format": pending_labels.SEGMENT_FORMAT, "first_offset": 0,
        "gaps": np.array([0] + [2**62] * 9, np.int64), "y_pred": np.zeros(10, np.bool_),
        "p_true": np.zeros(10)})}), "increasing"),
    (lambda h, s: h.update(max_timestamp=1.5), "max_timestamp"),
], ids=["twice", "zero", "sizes", "bits", "next", "missing", "junk", "format", "p", "order",
        "count", "wrap", "timestamp"])
def test_a_hostile_incremental_state_is_refused_with_its_reason(mutate, reason):
    store = binary_store(10)
    head, segments = checkpointed(store, 40)
    mutate(head, segments)
    with pytest.raises(StateError, match=reason):
        read_back(head, segments, 40)


def test_an_offset_beyond_the_checkpoint_or_in_two_segments_is_refused():
    store = binary_store(10)
    head, segments = checkpointed(store, 40)
    with pytest.raises(StateError, match="increasing within"):
        read_back(head, segments, 10)
    store.add("late", {"f": 1.0}, offset=50, timestamp=50, y_pred=True, p_true=0.5, size=10)
    head2, new = checkpointed(store, 60)
    both = {**segments, **new}
    assert read_back(head2, both, 60).rebuilding == 11
    twin = state.loads(new[2])
    twin["first_offset"] = 0  # segment 1's first offset, waiting there
    with pytest.raises(StateError, match="two segments"):
        read_back(head2, {**both, 2: state.dumps(twin)}, 60)


def test_a_restore_keeps_the_newest_waiting_events_its_store_can_hold():
    # A checkpoint of 5,000 waiting events (a larger --label-store-size, or crafted bits): the
    # restore prepares only the newest 1,000 for reading again, and counts the rest evicted,
    # as the store would have once it read them.
    store = binary_store(5_000)
    head, segments = checkpointed(store, 10_000)
    twin = PendingLabels.from_checkpoint_state(head, segments, 10_000, max_size=1_000)
    assert twin.rebuilding == 1_000 and twin.evicted == 4_000
    assert twin.rebuild_range() == (2 * 4_000, 10_000)
    assert twin.served_at(2 * 3_999) is None
    assert twin.served_at(2 * 4_000) == (store.entries["e4000"][3], store.entries["e4000"][4])
    assert read_back(head, segments, 10_000).rebuilding == 5_000


def test_a_multiclass_restore_gives_back_each_kept_events_class_probabilities():
    store = PendingLabels(max_size=100, multiclass=True)
    for i in range(40):
        proba = {c: round(0.1 * ((i + k) % 10), 1) for k, c in enumerate("abc"[: 1 + i % 3])}
        store.add(f"e{i}", {"f": 1.0}, offset=i, timestamp=i, y_pred=None if i % 5 == 0 else "a",
                  p_true=proba, size=50)
    head, segments = checkpointed(store, 40)
    twin = PendingLabels.from_checkpoint_state(head, segments, 40, max_size=25, multiclass=True)
    assert twin.rebuilding == 25 and twin.evicted == 15
    for i in range(40):
        entry = store.entries[f"e{i}"]
        assert twin.served_at(i) == (None if i < 15 else (entry[3], entry[4]))


def test_a_checkpoint_and_a_restore_hold_within_the_budgets_share_of_the_store():
    # --max-memory charges a store's checkpoints CHECKPOINT_FACTOR of its bytes
    # (connectors/worker/memory_budget.py): what checkpoint_state allocates at its peak must stay
    # within it. A restore holds the waiting events' predictions while its store is still empty,
    # each event read again replacing its own: within the store's own share.
    import tracemalloc

    from connectors.worker.memory_budget import CHECKPOINT_FACTOR

    store = PendingLabels(max_size=20_000, max_bytes=1 << 34)
    for i in range(20_000):
        x = {f"f{j}": i / (j + 1) for j in range(11)}
        value = json.dumps({"id": f"e{i:06d}", "x": x}).encode()
        store.add(f"e{i:06d}", x, i, i, bool(i % 2), 0.5, pending_entry_bytes(value, x))
    share = CHECKPOINT_FACTOR * store.n_bytes
    tracemalloc.start()
    try:
        head, new, _ = store.checkpoint_state(20_000)
        checkpointing = tracemalloc.get_traced_memory()[1]
        store.checkpoint_written()
        head = state.loads(state.dumps({"h": head}))["h"]
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        twin = PendingLabels.from_checkpoint_state(head, new, 20_000, max_size=20_000)
        restoring = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert twin.rebuilding == 20_000
    assert checkpointing < share, (checkpointing, share)
    assert restoring < 0.25 * store.n_bytes, (restoring, store.n_bytes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1,
                      max_size=4), target=st.integers(0, 1))
def test_mutated_segments_give_the_store_or_a_state_error(edits, target):
    store = binary_store(30)
    head, segments = checkpointed(store, 60)
    store.pop("e3", 61, 61)
    head, new = checkpointed(store, 62)
    segments = {**segments, **new}
    key = sorted(segments)[target % len(segments)]
    mutated = bytearray(segments[key])
    for position, byte in edits:
        mutated[position % len(mutated)] = byte
    segments[key] = bytes(mutated)
    try:
        twin = read_back(head, segments, 62)
    except StateError:
        return
    assert twin.rebuilding <= 29
    for offset in range(62):
        served = twin.served_at(offset)
        if served is not None:
            assert isinstance(served[0], bool) and 0.0 <= served[1] <= 1.0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.sampled_from(["event", "label", "checkpoint"]),
                              st.integers(0, 40)), min_size=1, max_size=300),
       max_size=st.integers(1, 30))
def test_any_sequence_restores_the_store_it_checkpointed(ops, max_size):
    store = PendingLabels(max_size=max_size, max_age_records=60)
    log: list[tuple[str, dict, int]] = []  # the input topic: (id, x, timestamp) per offset
    segments: dict[int, bytes] = {}
    for kind, n in ops:
        offset = len(log)
        if kind == "event":
            log.append((f"e{n}", {"f": float(offset)}, offset))
            store.add(f"e{n}", {"f": float(offset)}, offset, offset, bool(n % 2), n / 40, 10 + n)
        elif kind == "label":
            log.append((f"e{n}", None, offset))
            store.pop(f"e{n}", offset, offset)
        else:
            head, new, kept = store.checkpoint_state(offset)
            store.checkpoint_written()
            segments = {**{i: segments[i] for i in kept}, **new}
            assert len(segments) <= MAX_SEGMENTS
            assert sum(len(s.offsets) for s in store.segments) <= SPARSE * len(store) + len(
                store)
            twin = PendingLabels.from_checkpoint_state(
                state.loads(state.dumps({"h": head}))["h"], segments, offset, max_size,
                max_age_records=60)
            span = twin.rebuild_range()
            for at in range(*(span or (0, 0))):
                event_id, x, timestamp = log[at]
                if twin.served_at(at) is not None:
                    twin.rebuilt(at, event_id, x, timestamp, 10 + int(event_id[1:]))
            assert twin.finish_rebuild() == 0
            same_store(twin, store)
