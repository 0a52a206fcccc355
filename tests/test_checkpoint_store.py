"""Checkpoints of any size on the checkpoint topic: record framing, manifests, chunks, tombstones.

The framing and the checks of manifests and chunks run without a broker; writing, restoring,
atomicity and tombstones run against the embedded broker (fresh topic names per test).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import time
import tracemalloc
import uuid

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import streammargin
from connectors.kafka.broker import create_topics
from connectors.state import checkpoint
from connectors.state.checkpoint import (
    ChunkAssembler,
    Generation,
    Inline,
    LoadedCheckpoint,
    Manifest,
    RefusedCheckpoint,
    Segment,
    Segmented,
    chunk_key,
    frame_chunk,
    frame_inline,
    frame_manifest,
    frame_segmented,
    read_head,
)
from streammargin import StateError, state

KEY = checkpoint.checkpoint_key("group", "events", 3)
LIMIT = checkpoint.DEFAULT_MAX_CHECKPOINT_BYTES
CHUNK_HEAD = len(frame_chunk(1, 0, 1, b""))


def chunked(payload: bytes, chunk_bytes: int, generation: int = 0x5EED, first_offset: int = 100,
            previous: Generation | None = None):
    """A manifest (its chunks at consecutive offsets from `first_offset`) and its chunk records
    as (offset, key, value)."""
    count = -(-len(payload) // chunk_bytes)
    records = [
        (first_offset + i, chunk_key(KEY, generation, i),
         frame_chunk(generation, i, count, payload[i * chunk_bytes:(i + 1) * chunk_bytes]))
        for i in range(count)
    ]
    manifest = Manifest(generation, len(payload), chunk_bytes, tuple(r[0] for r in records),
                        hashlib.sha256(payload).digest(), previous)
    return manifest, records


def assemble(manifest_value: bytes, manifest_offset: int, records, limit: int = LIMIT) -> bytes:
    """What a reader makes of a manifest and the records at its chunk offsets."""
    head = read_head(manifest_value, manifest_offset, limit)
    assert isinstance(head, Manifest)
    assembler = ChunkAssembler(KEY, head)
    by_offset = {offset: (key, value) for offset, key, value in records}
    for offset in head.offsets:
        if offset not in by_offset:
            raise StateError(f"chunk at offset {offset} is missing")
        assembler.add(offset, *by_offset[offset])
    return assembler.payload()


# Framing, without a broker ------------------------------------------------------------------------


def test_inline_and_chunked_checkpoints_read_back_exactly():
    payload = os.urandom(10_000)
    previous = Generation(0xABC, 4)
    head = read_head(frame_inline(payload, previous), 7, LIMIT)
    assert head == Inline(payload, previous)

    manifest, records = chunked(payload, 1024, previous=previous)
    assert manifest.count == 10 and manifest.chunk_size(9) == 10_000 - 9 * 1024
    value = frame_manifest(manifest)
    assert read_head(value, 200, LIMIT) == manifest
    assert assemble(value, 200, records) == payload
    # Chunk keys never parse as a head key of another partition: their last part is no integer.
    assert chunk_key(KEY, 0x5EED, 12) == b"group/events/3/0000000000005eed:12"


def refused(reason: str, call, *args):
    with pytest.raises(StateError, match=reason):
        call(*args)


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda m, v: b"XXXX" + v[4:], "bad magic"),
        (lambda m, v: v[:4] + b"\x09" + v[5:], "format 9"),
        (lambda m, v: v[:40], "truncated manifest"),
        (lambda m, v: v[:-3], "bytes long"),
        (lambda m, v: v + b"\0" * 8, "bytes long"),
        (lambda m, v: b"", "not a checkpoint record"),
        (lambda m, v: None, "null value"),
        (lambda m, v: frame_chunk(1, 0, 1, b"data"), "not a manifest"),
        (lambda m, v: state.dumps({"format": 1}), "unframed checkpoint"),
        (lambda m, v: frame_manifest(dataclasses.replace(m, **{"total_bytes": 10**12})),
         "above max_checkpoint_bytes"),
        (lambda m, v: frame_manifest(dataclasses.replace(m, **{"offsets": m.offsets[:-1]})),
         "lists 9 chunks"),
        (lambda m, v: frame_manifest(dataclasses.replace(m, **{"chunk_bytes": 0})),
         "chunks of 0"),
        (lambda m, v: frame_manifest(dataclasses.replace(m, **{"total_bytes": 0})),
         "manifest of 0 bytes"),
        (lambda m, v: frame_manifest(dataclasses.replace(m, **{"generation": 0})),
         "generation 0"),
        (lambda m, v: frame_manifest(dataclasses.replace(m, **{"offsets": (5,) * 10})),
         "strictly increasing"),
        (lambda m, v: frame_manifest(dataclasses.replace(m, **{"offsets": tuple(range(-1, 9))})),
         "strictly increasing"),
        (lambda m, v: frame_manifest(
            dataclasses.replace(m, **{"offsets": tuple(range(195, 205))})),
         "not before the head record"),
        (lambda m, v: frame_manifest(
            dataclasses.replace(m, **{"previous": Generation(7, checkpoint.MAX_CHUNKS + 1)})),
         "bad previous generation"),
        (lambda m, v: frame_manifest(
            dataclasses.replace(m, **{"previous": Generation(0, 3)})),
         "bad previous generation"),
    ],
    ids=["magic", "version", "truncated", "short", "long", "empty", "null", "chunk-as-head",
         "unframed",
         "terabyte", "count", "chunk-0", "total-0", "generation-0", "duplicate-offsets",
         "negative-offset", "offsets-after-manifest", "previous-huge", "previous-mixed"],
)
def test_a_hostile_manifest_is_refused_with_its_reason(mutate, reason):
    manifest, _ = chunked(os.urandom(10_000), 1024)
    refused(reason, read_head, mutate(manifest, frame_manifest(manifest)), 200, LIMIT)


def test_an_inline_checkpoint_with_a_wrong_hash_or_above_the_limit_is_refused():
    value = bytearray(frame_inline(b"payload" * 100))
    value[-1] ^= 1
    refused("SHA-256", read_head, bytes(value), 1, LIMIT)
    refused("above max_checkpoint_bytes", read_head, frame_inline(b"x" * 2000), 1, 1000)


def swap(records, i, **changes):
    offset, key, value = records[i]
    records = list(records)
    records[i] = (changes.get("offset", offset), changes.get("key", key),
                  changes.get("value", value))
    return records


@pytest.mark.parametrize(
    "mutate, reason",
    [
        # A chunk offset that holds another key's record (another partition's chunk, say).
        (lambda r: swap(r, 2, key=chunk_key(b"group/events/4", 0x5EED, 2)), "has the key"),
        (lambda r: swap(r, 2, key=KEY), "has the key"),
        (lambda r: swap(r, 2, key=None), "has the key"),
        # The right key over a chunk of another generation, or another index (a duplicate).
        (lambda r: swap(r, 2, value=frame_chunk(0xBAD, 2, 10, r[2][2][CHUNK_HEAD:])), "generation"),
        (lambda r: swap(r, 2, value=r[1][2]), "says chunk 1"),
        (lambda r: swap(r, 2, value=frame_chunk(0x5EED, 2, 11, r[2][2][CHUNK_HEAD:])), "of 11"),
        # Truncated, padded, tombstoned, or not a chunk at all.
        (lambda r: swap(r, 2, value=r[2][2][:-1]), "has 1023 bytes"),
        (lambda r: swap(r, 2, value=r[2][2] + b"\0"), "has 1025 bytes"),
        (lambda r: swap(r, 9, value=r[9][2] + b"\0"), "has 785 bytes"),
        (lambda r: swap(r, 2, value=None), "null value"),
        (lambda r: swap(r, 2, value=frame_inline(b"x")), "not a chunk record"),
        (lambda r: swap(r, 2, value=r[2][2][:10]), "not a chunk record"),
        # Right framing, wrong bytes: only the hash sees it.
        (lambda r: swap(r, 2, value=r[2][2][:-1] + bytes([r[2][2][-1] ^ 1])), "SHA-256"),
        (lambda r: r[:-1], "missing"),
    ],
    ids=["other-partition", "head-key", "no-key", "other-generation", "duplicate", "count",
         "truncated", "padded", "last-padded", "tombstone", "inline", "short", "hash",
         "missing"],
)
def test_a_hostile_chunk_is_refused_with_its_reason(mutate, reason):
    payload = os.urandom(10_000)
    manifest, records = chunked(payload, 1024)
    refused(reason, assemble, frame_manifest(manifest), 200, mutate(records))


def test_chunks_are_taken_only_in_order_at_their_offsets():
    manifest, records = chunked(os.urandom(3_000), 1024)
    assembler = ChunkAssembler(KEY, manifest)
    refused("the manifest puts it at 100", assembler.add, *records[1])
    assembler.add(*records[0])
    refused("1 of 3 chunks", assembler.payload)
    assembler.add(*records[1])
    assembler.add(*records[2])
    refused("lists 3 chunks", assembler.add, 103, chunk_key(KEY, 0x5EED, 3), records[2][2])


def test_a_manifest_claiming_a_terabyte_allocates_nothing():
    count = -(-10**12 // (2**32 - 1))
    claim = Manifest(5, 10**12, 2**32 - 1, tuple(range(count)), b"\0" * 32, None)
    value = frame_manifest(claim)
    tracemalloc.start()
    try:
        refused("above max_checkpoint_bytes", read_head, value, 1_000, LIMIT)
        # Even under a limit raised past the claim, memory follows the chunks that pass their
        # checks, not the claim.
        manifest = read_head(value, 1_000, 10**13)
        assembler = ChunkAssembler(KEY, manifest)
        refused("has 10 bytes", assembler.add, 0, chunk_key(KEY, 5, 0),
                frame_chunk(5, 0, count, b"x" * 10))
        refused(f"0 of {count} chunks", assembler.payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


any_manifest_fields = st.fixed_dictionaries({
    "generation": st.integers(0, 2**64 - 1),
    "total_bytes": st.one_of(st.integers(0, 20_000), st.integers(0, 2**64 - 1)),
    "chunk_bytes": st.one_of(st.integers(0, 5_000), st.integers(0, 2**32 - 1)),
    "offsets": st.lists(st.integers(-2**63, 2**63 - 1), max_size=40).map(tuple),
    "sha256": st.binary(min_size=32, max_size=32),
    "previous": st.one_of(st.none(), st.builds(
        Generation, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))),
})


@st.composite
def manifest_fields(draw):
    """Fields of a consistent manifest (chunks before offset 2**40), then maybe some replaced
    by arbitrary values."""
    chunk_bytes = draw(st.integers(1, 5_000))
    count = draw(st.integers(1, 40))
    total = draw(st.integers((count - 1) * chunk_bytes + 1, count * chunk_bytes))
    offsets = sorted(draw(st.sets(st.integers(0, 2**40 - 1), min_size=count, max_size=count)))
    fields = {
        "generation": draw(st.integers(1, 2**64 - 1)),
        "total_bytes": total,
        "chunk_bytes": chunk_bytes,
        "offsets": tuple(offsets),
        "sha256": draw(st.binary(min_size=32, max_size=32)),
        "previous": draw(st.one_of(st.none(), st.builds(
            Generation, st.integers(1, 2**64 - 1), st.integers(1, checkpoint.MAX_CHUNKS)))),
    }
    arbitrary = draw(any_manifest_fields)
    for name in draw(st.sets(st.sampled_from(sorted(fields)), max_size=2)):
        fields[name] = arbitrary[name]
    return fields


@settings(max_examples=300, deadline=None)
@given(fields=manifest_fields(),
       manifest_offset=st.one_of(st.integers(0, 2**41), st.just(2**40)),
       tail=st.one_of(st.just(b""), st.binary(max_size=9)))
def test_any_manifest_is_refused_or_consistent(fields, manifest_offset, tail):
    value = frame_manifest(Manifest(**fields)) + tail
    try:
        head = read_head(value, manifest_offset, 1 << 20)
    except StateError:
        event("refused")
        return
    event("accepted")
    assert isinstance(head, Manifest) and not tail
    assert head == Manifest(**fields)
    assert 0 < head.total_bytes <= 1 << 20 and head.generation != 0
    assert head.count == -(-head.total_bytes // head.chunk_bytes) <= checkpoint.MAX_CHUNKS
    assert 0 <= head.offsets[0] and head.offsets[-1] < manifest_offset
    assert list(head.offsets) == sorted(set(head.offsets))
    assert sum(head.chunk_size(i) for i in range(head.count)) == head.total_bytes
    assert all(0 < head.chunk_size(i) <= head.chunk_bytes for i in range(head.count))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    payload=st.binary(min_size=1, max_size=3_000),
    chunk_bytes=st.integers(1, 700),
    target=st.integers(0, 1_000),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1,
                   max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_mutated_records_give_the_payload_or_a_refusal(payload, chunk_bytes, target, edits, cut):
    manifest, records = chunked(payload, chunk_bytes)
    values = [frame_manifest(manifest)] + [value for _, _, value in records]
    i = target % len(values)
    mutated = bytearray(values[i])
    for position, byte in edits:
        mutated[position % len(mutated)] = byte
    if cut is not None:
        del mutated[cut % (len(mutated) + 1):]
    values[i] = bytes(mutated)
    records = [(offset, key, value) for (offset, key, _), value in zip(records, values[1:])]
    try:
        result = assemble(values[0], 10_000, records)
    except StateError:
        event("refused")
        return
    event("accepted")
    # Whatever got through is the checkpoint itself (or the edits changed nothing).
    assert result == payload


def segmented_head(limit: int = LIMIT):
    """A segmented head of two segments (chunk offsets 100-106) around a manifest."""
    one, _ = chunked(os.urandom(3_000), 1024, generation=0xA1, first_offset=100)
    two, _ = chunked(os.urandom(500), 1024, generation=0xB2, first_offset=105)
    main, _ = chunked(os.urandom(2_000), 1024, generation=0xC3, first_offset=106,
                      previous=Generation(0xD4, 2))
    segments = (Segment(7, dataclasses.replace(one, previous=None)),
                Segment(9, dataclasses.replace(two, previous=None)))
    dropped = (Generation(0xE5, 1),)
    return Segmented(main, segments, dropped), frame_segmented(frame_manifest(main), segments,
                                                               dropped)


def test_a_segmented_head_reads_back_exactly():
    head, value = segmented_head()
    assert read_head(value, 200, LIMIT) == head
    assert head.previous == Generation(0xD4, 2)
    inline = frame_segmented(frame_inline(b"payload"), head.segments)
    assert read_head(inline, 200, LIMIT) == Segmented(Inline(b"payload", None), head.segments, ())


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda v: v[:12], "truncated"),
        (lambda v: v[:6] + (5000).to_bytes(4, "big") + v[10:], "above 4096"),
        (lambda v: v[:6] + (3).to_bytes(4, "big") + v[10:], "segment 2"),
        (lambda v: frame_segmented(v, ()), "inside another"),
        (lambda v: frame_segmented(frame_inline(b"x" * 100), [segmented_head()[0].segments[0]] * 2),
         "listed twice"),
    ],
    ids=["truncated", "too-many", "count", "nested", "twice"],
)
def test_a_hostile_segmented_head_is_refused_with_its_reason(mutate, reason):
    refused(reason, read_head, mutate(segmented_head()[1]), 200, LIMIT)


def test_a_segmented_head_counts_its_segments_against_the_limit():
    _, value = segmented_head()
    assert read_head(value, 200, 5_500)  # 3,000 + 500 + 2,000 bytes
    refused("above max_checkpoint_bytes", read_head, value, 200, 5_499)
    refused("not before the head record", read_head, value, 104, LIMIT)


@settings(max_examples=200, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1,
                      max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 10**6)))
def test_a_mutated_segmented_head_is_refused_or_consistent(edits, cut):
    head, value = segmented_head()
    mutated = bytearray(value)
    for position, byte in edits:
        mutated[position % len(mutated)] = byte
    if cut is not None:
        del mutated[cut % (len(mutated) + 1):]
    try:
        got = read_head(bytes(mutated), 200, 1 << 20)
    except StateError:
        event("refused")
        return
    event("accepted")
    if isinstance(got, Segmented):
        claimed = sum(s.chunks.total_bytes for s in got.segments)
        assert claimed + got.head.total_bytes <= 1 << 20
        for segment in got.segments:
            assert segment.chunks.offsets[-1] < 200 and segment.chunks.previous is None
        assert len({s.id for s in got.segments}) == len(got.segments)


# The store against the embedded broker ------------------------------------------------------------


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def topic(kafka_broker):
    name = fresh("checkpoints")
    create_topics(kafka_broker.bootstrap_servers, [name], partitions=1)
    return name


def store_for(kafka_broker, topic, **options):
    return checkpoint.CheckpointStore(kafka_broker.bootstrap_servers, topic, "group", **options)


def load(kafka_broker, topic, partitions, **options):
    store = store_for(kafka_broker, topic, **options)
    try:
        return store.load(partitions)
    finally:
        store.close()


def topic_records(kafka_broker, topic, partition: int = 0) -> list:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap_servers, group_id=None,
                             enable_auto_commit=False, fetch_max_wait_ms=20,
                             auto_offset_reset="earliest")
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    records = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        batch = consumer.poll(timeout_ms=200).get(tp, [])
        records.extend(batch)
        highwater = consumer.highwater(tp)
        if not batch and highwater is not None and consumer.position(tp) >= highwater:
            break
    consumer.close()
    return records


def produce_raw(kafka_broker, topic, items) -> list[int]:
    """Send (key, value) records to partition 0; returns their offsets."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
    futures = [producer.send(topic, value=value, key=key, partition=0) for key, value in items]
    producer.flush()
    offsets = [future.get(10).offset for future in futures]
    producer.close()
    return offsets


def big_model_state() -> bytes:
    """The safe state of a real model that learnt 20,000 feature names (about 1 MB)."""
    model = streammargin.ALMAClassifier()
    rng = random.Random(4)
    for i in range(4_000):
        x = {f"w{rng.randrange(20_000)}": rng.random() for _ in range(30)}
        model.learn_one(x, i % 3 == 0)
    return state.dumps(model.to_state())


@pytest.mark.kafka
def test_checkpoints_many_chunks_long_round_trip_exactly_and_interleave(kafka_broker, topic):
    model_state = big_model_state()
    assert len(model_state) > 500_000
    checkpoints = {
        ("events", 0): os.urandom(100_000),  # 25 chunks
        ("events", 1): b"small",  # inline
        ("events", 2): os.urandom(4_096 * 7),  # exactly 7 chunks
        ("events", 3): model_state,
    }
    store = store_for(kafka_broker, topic, chunk_bytes=4_096)
    store.write(checkpoints)
    store.close()

    found = load(kafka_broker, topic, [*checkpoints, ("events", 9)])
    assert set(found) == set(checkpoints)  # a partition without checkpoint is absent
    for key, payload in checkpoints.items():
        assert isinstance(found[key], LoadedCheckpoint)
        assert found[key].payload == payload
        assert found[key].chunks == (0 if len(payload) <= 4_096 else -(-len(payload) // 4_096))
        assert (found[key].topic, found[key].partition) == (topic, 0)
    restored = streammargin.from_state(state.loads(found[("events", 3)].payload))
    assert state.dumps(restored.to_state()) == model_state
    # The chunks of the checkpoints went out interleaved, and every head came after them all.
    keys = [r.key for r in topic_records(kafka_broker, topic)]

    def chunk_of(partition, index):
        head = checkpoint.checkpoint_key("group", "events", partition)
        first = next(k for k in keys if k.startswith(head + b"/"))
        return chunk_key(head, int(first.rsplit(b"/", 1)[1].split(b":")[0], 16), index)

    assert keys[:4] == [chunk_of(0, 0), chunk_of(2, 0), chunk_of(3, 0), chunk_of(0, 1)]
    assert keys[-4:] == [checkpoint.checkpoint_key("group", "events", p) for p in range(4)]


@pytest.mark.kafka
def test_a_write_holds_at_most_its_window_of_records_unacknowledged(kafka_broker, topic,
                                                                    monkeypatch):
    # The producer keeps a copy of each record until it is acknowledged: a write waits each
    # SEND_WINDOW_BYTES (here 64 KiB), so at most that and one record are unacknowledged,
    # whatever it writes (here 12 checkpoints of 40 KiB in chunks of 4 KiB), and every
    # checkpoint still round-trips exactly, its chunks interleaved with the others'.
    monkeypatch.setattr(checkpoint, "SEND_WINDOW_BYTES", 64 << 10)
    checkpoints = {("events", p): os.urandom(40_000) for p in range(12)}
    store = store_for(kafka_broker, topic, chunk_bytes=4_096)
    unacknowledged, most = [0], [0]
    send, wait = store._send, store._await

    def counted_send(key, value, number):
        unacknowledged[0] += len(value or b"")
        most[0] = max(most[0], unacknowledged[0])
        return send(key, value, number)

    def counted_wait(futures):
        unacknowledged[0] = 0
        return wait(futures)

    monkeypatch.setattr(store, "_send", counted_send)
    monkeypatch.setattr(store, "_await", counted_wait)
    store.write(checkpoints)
    store.close()
    assert 64 << 10 <= most[0] <= (64 << 10) + 4_096 + 64
    found = load(kafka_broker, topic, list(checkpoints))
    assert {key: loaded.payload for key, loaded in found.items()} == checkpoints
    keys = [r.key for r in topic_records(kafka_broker, topic)]
    heads = [checkpoint.checkpoint_key("group", "events", p) for p in range(12)]
    assert keys[-12:] == heads and not set(heads) & set(keys[:-12])
    assert {key.rsplit(b"/", 1)[0] for key in keys[:12]} == set(heads)  # (round robin)


def follow_until(store, keys, expected, timeout: float = 20.0) -> dict:
    """What `follow` gives over calls until it has `expected` keys: a call stops at its first
    poll that brings nothing, and what comes later is the next call's."""
    found: dict = {}
    deadline = time.monotonic() + timeout
    while set(found) != set(expected) and time.monotonic() < deadline:
        found.update({k: v.payload for k, v in store.follow(keys).items()})
    return found


@pytest.mark.kafka
@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("reader", ["kafka-python", "librdkafka", "read-only"])
def test_follow_gives_each_keys_latest_then_only_what_came_since(kafka_broker, partitions,
                                                                 reader):
    # The model exchange's read (connectors/worker/model_scope.py): the latest of each key at
    # first, then only what was written since; a key not followed before gets its latest; a
    # chunked record is read whole, and reading its chunks loses no record after it. Read-only:
    # streammargin serve's store, without a producer, reading read_committed.
    options: dict = {}
    if reader == "read-only":
        options = {"read_only": True, "reader_config": {"isolation_level": "read_committed"}}
    if reader == "librdkafka":
        pytest.importorskip("confluent_kafka")
        from connectors.kafka.librdkafka_transport import CheckpointReader

        options = {"reader_factory": CheckpointReader}
    topic = fresh("models")
    create_topics(kafka_broker.bootstrap_servers, [topic], partitions=partitions)
    writer = store_for(kafka_broker, topic, chunk_bytes=1_024)
    follower = store_for(kafka_broker, topic, **options)
    keys = [("events", p) for p in range(4)]
    try:
        writer.write({key: b"first %d" % key[1] for key in keys})
        writer.write({keys[0]: b"second 0"})
        assert follow_until(follower, keys[:2], keys[:2]) == {
            keys[0]: b"second 0", keys[1]: b"first 1"}
        assert follower.follow(keys[:2]) == {}  # nothing since
        writer.write({keys[1]: b"second 1", keys[2]: b"second 2"})
        assert follow_until(follower, keys[:3], keys[1:3]) == {
            keys[1]: b"second 1", keys[2]: b"second 2"}
        big = os.urandom(5_000)
        writer.write({keys[3]: big})
        assert follow_until(follower, keys, keys[3:]) == {keys[3]: big}  # new: its latest
        bigger = os.urandom(7_000)
        writer.write({keys[3]: bigger, keys[0]: b"third 0"})
        writer.write({keys[2]: b"third 2"})
        assert follow_until(follower, keys, [keys[0], keys[2], keys[3]]) == {
            keys[0]: b"third 0", keys[2]: b"third 2", keys[3]: bigger}
        writer.write({keys[1]: b"third 1"})  # after a chunk read moved the reader
        assert follow_until(follower, keys, [keys[1]]) == {keys[1]: b"third 1"}
        assert follower.follow(keys) == {}
        if reader == "read-only":
            assert follower.producer is None and follower.partitions_of(topic) == set(
                range(partitions))
            with pytest.raises(checkpoint.CheckpointError, match="read-only"):
                follower.write({keys[0]: b"never"})
    finally:
        writer.close()
        follower.close()


@pytest.mark.kafka
def test_the_records_of_a_key_share_one_partition_of_a_many_partition_topic(kafka_broker):
    topic = fresh("checkpoints")
    create_topics(kafka_broker.bootstrap_servers, [topic], partitions=3)
    checkpoints = {("events", p): os.urandom(10_000 + p) for p in range(6)}
    store = store_for(kafka_broker, topic, chunk_bytes=1_024)
    store.write(checkpoints)
    store.close()
    found = load(kafka_broker, topic, checkpoints)
    assert {k: v.payload for k, v in found.items()} == checkpoints
    assert len({v.partition for v in found.values()}) > 1
    for (name, p), loaded in found.items():
        head = checkpoint.checkpoint_key("group", name, p)
        records = topic_records(kafka_broker, topic, loaded.partition)
        assert sum(1 for r in records if r.key.startswith(head + b"/")) == 10


@pytest.mark.kafka
def test_a_checkpoint_above_the_producers_max_request_size_is_written_and_restored(
    kafka_broker, topic
):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers,
                             max_request_size=64 << 10)
    payload = os.urandom(1 << 20)
    store = store_for(kafka_broker, topic, producer=producer)  # default chunk_bytes: 512 KiB
    assert store.chunk_bytes == (64 << 10) - checkpoint.RECORD_HEADROOM
    store.write({("events", 0): payload})
    store.close()
    producer.close()
    found = load(kafka_broker, topic, [("events", 0)])
    assert found[("events", 0)].payload == payload
    assert found[("events", 0)].chunks == -(-len(payload) // store.chunk_bytes) == 18
    assert max(len(r.value) for r in topic_records(kafka_broker, topic)) < 64 << 10


class SimulatedCrash(Exception):
    pass


@pytest.mark.kafka
def test_a_crash_between_the_chunks_and_the_manifest_keeps_the_previous_checkpoint(
    kafka_broker, topic, monkeypatch
):
    first, second = os.urandom(50_000), os.urandom(60_000)
    store = store_for(kafka_broker, topic, chunk_bytes=4_096)
    store.write({("events", 0): first})

    def crash(plans):
        raise SimulatedCrash

    monkeypatch.setattr(store, "_write_heads", crash)
    with pytest.raises(SimulatedCrash):
        store.write({("events", 0): second})
    store.close()
    records = topic_records(kafka_broker, topic)
    head = checkpoint.checkpoint_key("group", "events", 0)
    assert sum(1 for r in records if r.key.startswith(head + b"/")) == 13 + 15  # both durable
    assert [r.key for r in records].count(head) == 1

    # A restart restores the first checkpoint, and its next write deletes the orphaned chunks.
    store = store_for(kafka_broker, topic, chunk_bytes=4_096)
    found = store.load([("events", 0)])
    assert found[("events", 0)].payload == first
    orphans = {r.key for r in records[14:] if r.key != head}
    assert len(orphans) == 15
    store.write({("events", 0): b"third"})
    store.close()
    after = topic_records(kafka_broker, topic)[len(records):]
    assert after[0].key == head and after[0].value is not None
    assert {r.key for r in after[1:]} == orphans | {r.key for r in records[:13]}
    assert all(r.value is None for r in after[1:])
    assert load(kafka_broker, topic, [("events", 0)])[("events", 0)].payload == b"third"


@pytest.mark.kafka
def test_superseded_chunks_get_tombstones_even_after_a_crash_before_them(
    kafka_broker, topic, monkeypatch
):
    head = checkpoint.checkpoint_key("group", "events", 0)
    store = store_for(kafka_broker, topic, chunk_bytes=1_024)
    store.write({("events", 0): os.urandom(5_000)})  # generation A: 5 chunks
    store.producer.flush()
    a_chunks = {r.key for r in topic_records(kafka_broker, topic) if r.key != head}
    store.write({("events", 0): os.urandom(3_000)})  # generation B: 3 chunks
    store.producer.flush()
    records = topic_records(kafka_broker, topic)
    manifest_b = max(r.offset for r in records if r.key == head)
    tombstones = {r.key for r in records if r.offset > manifest_b and r.value is None}
    assert tombstones == a_chunks
    b_chunks = {r.key for r in records
                if r.key.startswith(head + b"/") and r.value is not None} - a_chunks
    assert len(b_chunks) == 3

    # Generation C is written, and the process dies before C's tombstones of B go out.
    monkeypatch.setattr(store, "_write_tombstones", lambda plans: None)
    store.write({("events", 0): os.urandom(2_000)})
    store.close()
    seen = len(topic_records(kafka_broker, topic))
    # A restarted store learns of C from its manifest, and of B from C's "previous": its next
    # (inline) checkpoint deletes both.
    store = store_for(kafka_broker, topic, chunk_bytes=1_024)
    assert store.load([("events", 0)])[("events", 0)].chunks == 2
    store.write({("events", 0): b"inline"})
    store.close()
    late = topic_records(kafka_broker, topic)[seen:]
    assert late[0].key == head
    c_chunks = {r.key for r in topic_records(kafka_broker, topic)[:seen]
                if r.key.startswith(head + b"/")} - a_chunks - b_chunks
    assert {r.key for r in late[1:]} == b_chunks | c_chunks
    assert all(r.value is None for r in late[1:])


@pytest.mark.kafka
@pytest.mark.parametrize("flush_producer", [True, False])
def test_a_write_flushes_the_whole_producer_only_when_told_to(kafka_broker, topic,
                                                              flush_producer):
    """A checkpoint write flushes the producer it shares (the outputs sent before a checkpoint
    are durable with it); the model topic's store waits for its own records only, leaving the
    worker's predictions to fill their batches. Either way the write returns durable."""
    from kafka import KafkaProducer

    class CountingProducer(KafkaProducer):
        flushes = 0

        def flush(self, timeout=None):
            CountingProducer.flushes += 1
            return super().flush(timeout)

    producer = CountingProducer(bootstrap_servers=kafka_broker.bootstrap_servers, linger_ms=20)
    store = store_for(kafka_broker, topic, producer=producer, flush_producer=flush_producer)
    try:
        store.write({("events", 0): b"model"})
        assert CountingProducer.flushes == (1 if flush_producer else 0)
    finally:
        store.close()
        producer.close()
    assert load(kafka_broker, topic, [("events", 0)])[("events", 0)].payload == b"model"


@pytest.mark.kafka
def test_a_tombstone_under_the_key_deletes_the_checkpoint(kafka_broker, topic):
    store = store_for(kafka_broker, topic)
    store.write({("events", 0): b"state", ("events", 1): b"other"})
    store.close()
    produce_raw(kafka_broker, topic, [(checkpoint.checkpoint_key("group", "events", 0), None)])
    found = load(kafka_broker, topic, [("events", 0), ("events", 1)])
    assert set(found) == {("events", 1)}


@pytest.mark.kafka
def test_hostile_records_on_the_topic_give_refused_checkpoints_with_coordinates(
    kafka_broker, topic
):
    good = os.urandom(6_000)
    store = store_for(kafka_broker, topic, chunk_bytes=1_024)
    store.write({("events", 0): good})
    store.close()
    records = topic_records(kafka_broker, topic)
    chunk_offsets = tuple(r.offset for r in records[:6])
    sha = hashlib.sha256(good).digest()

    def head(p):
        return checkpoint.checkpoint_key("group", "events", p)

    def manifest(**fields):
        base = {"generation": 9, "total_bytes": 6_000, "chunk_bytes": 1_024,
                "offsets": chunk_offsets, "sha256": sha, "previous": None}
        return frame_manifest(Manifest(**{**base, **fields}))

    generation = int(records[0].key.rsplit(b"/", 1)[1].split(b":")[0], 16)
    own_chunks = [(chunk_key(head(6), generation, i), r.value) for i, r in enumerate(records[:6])]
    hostile = {
        # Chunks of partition 0 under partition 1's manifest.
        1: (manifest(), "has the key"),
        2: (manifest(total_bytes=10**12, chunk_bytes=2**32 - 1,
                     offsets=tuple(range(233))), "above max_checkpoint_bytes"),
        3: (b"garbage", "not a checkpoint record"),
        4: (manifest(offsets=tuple(range(10**6, 10**6 + 6))), "is not before the head record"),
        5: (manifest(offsets=(0, 0, 1, 2, 3, 4)), "strictly increasing"),
    }
    items = [(head(p), value) for p, (value, _) in hostile.items()]
    # Partition 6: its own key's chunks copied (right keys at new offsets), a hash that lies.
    offsets = produce_raw(kafka_broker, topic, own_chunks)
    items.append((head(6), manifest(generation=generation, offsets=tuple(offsets),
                                    sha256=b"\1" * 32)))
    hostile[6] = (None, "SHA-256")
    offsets = produce_raw(kafka_broker, topic, items)
    tracemalloc.start()
    try:
        found = load(kafka_broker, topic, [("events", p) for p in range(7)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak
    assert found[("events", 0)].payload == good
    for (p, (_, reason)), offset in zip(hostile.items(), offsets):
        result = found[("events", p)]
        assert isinstance(result, RefusedCheckpoint), result
        assert (result.key, result.topic, result.partition, result.offset) == (
            f"group/events/{p}", topic, 0, offset)
        assert reason in result.reason
        assert str(result) == f"checkpoint group/events/{p} at {topic}/0@{offset} refused: " \
                              f"{result.reason}"


@pytest.mark.kafka
def test_a_checkpoint_above_the_limit_is_not_written_and_not_read(kafka_broker, topic):
    store = store_for(kafka_broker, topic, max_checkpoint_bytes=10_000)
    with pytest.raises(checkpoint.CheckpointError, match="above max_checkpoint_bytes=10000"):
        store.write({("events", 0): os.urandom(10_001)})
    store.close()
    store_for_big = store_for(kafka_broker, topic, chunk_bytes=4_096)
    store_for_big.write({("events", 0): os.urandom(20_000)})
    store_for_big.close()
    found = load(kafka_broker, topic, [("events", 0)], max_checkpoint_bytes=10_000)
    assert "above max_checkpoint_bytes=10000" in found[("events", 0)].reason


def checkpoint_keys(kafka_broker, topic, head):
    """The chunk keys of `head` with a value, and those with a tombstone after it, on the topic."""
    records = [r for r in topic_records(kafka_broker, topic) if r.key.startswith(head + b"/")]
    latest = {r.key: r.value for r in records}
    return ({k for k, v in latest.items() if v is not None},
            {k for k, v in latest.items() if v is None})


@pytest.mark.kafka
def test_segments_outlive_their_checkpoint_until_one_drops_them(kafka_broker, topic):
    head = checkpoint.checkpoint_key("group", "events", 0)
    store = store_for(kafka_broker, topic, chunk_bytes=1_024)
    one, two, three = os.urandom(3_000), os.urandom(10), os.urandom(700)
    store.write({("events", 0): checkpoint.CheckpointWrite(b"head 1", {1: one, 2: two})})
    store.write({("events", 0): checkpoint.CheckpointWrite(b"head 2", {3: three}, {1})})
    store.producer.flush()
    # Segment 1 (3 chunks) and 3 (1 chunk) stand; segment 2's one chunk got a tombstone.
    alive, deleted = checkpoint_keys(kafka_broker, topic, head)
    assert (len(alive), len(deleted)) == (4, 1)
    found = load(kafka_broker, topic, [("events", 0)])[("events", 0)]
    assert (found.payload, dict(found.segments)) == (b"head 2", {1: one, 3: three})
    # A restarted store keeps from what it loads, and refuses to keep what it never had.
    store.close()
    store = store_for(kafka_broker, topic, chunk_bytes=1_024)
    store.load([("events", 0)])
    with pytest.raises(checkpoint.CheckpointError, match="keeps segments"):
        store.write({("events", 0): checkpoint.CheckpointWrite(b"head 3", {}, {2})})
    store.write({("events", 0): checkpoint.CheckpointWrite(b"head 3", {}, {3})})
    store.write({("events", 0): b"head 4"})  # (no segments: every one is dropped)
    store.close()
    alive, deleted = checkpoint_keys(kafka_broker, topic, head)
    assert (alive, len(deleted)) == (set(), 5)
    found = load(kafka_broker, topic, [("events", 0)])[("events", 0)]
    assert (found.payload, dict(found.segments)) == (b"head 4", {})


@pytest.mark.kafka
def test_a_dropped_segment_gets_its_tombstones_even_after_a_crash_before_them(
    kafka_broker, topic, monkeypatch
):
    head = checkpoint.checkpoint_key("group", "events", 0)
    store = store_for(kafka_broker, topic, chunk_bytes=1_024)
    store.write({("events", 0): checkpoint.CheckpointWrite(b"1", {1: os.urandom(2_000)})})
    monkeypatch.setattr(store, "_write_tombstones", lambda plans: None)
    store.write({("events", 0): checkpoint.CheckpointWrite(b"2", {2: b"two"})})
    store.close()
    assert len(checkpoint_keys(kafka_broker, topic, head)[0]) == 3  # segment 1 leaked
    # A restarted store learns of segment 1 from the head's "dropped" list.
    store = store_for(kafka_broker, topic, chunk_bytes=1_024)
    assert dict(store.load([("events", 0)])[("events", 0)].segments) == {2: b"two"}
    store.write({("events", 0): checkpoint.CheckpointWrite(b"3", {}, {2})})
    store.close()
    alive, deleted = checkpoint_keys(kafka_broker, topic, head)
    assert len(alive) == 1 and len(deleted) == 2


@pytest.mark.kafka
def test_a_missing_segment_refuses_the_checkpoint(kafka_broker, topic):
    store = store_for(kafka_broker, topic, chunk_bytes=1_024)
    store.write({("events", 0): checkpoint.CheckpointWrite(b"1", {1: os.urandom(1_500)})})
    store.close()
    head = checkpoint.checkpoint_key("group", "events", 0)
    segment_chunk = next(r.key for r in topic_records(kafka_broker, topic)
                         if r.key.startswith(head + b"/"))
    produce_raw(kafka_broker, topic, [(segment_chunk, b"SMCK\x01Cgarbage")])
    found = load(kafka_broker, topic, [("events", 0)])[("events", 0)]
    # (the head lists the chunk at its offset: the one there is checked, the later one ignored)
    assert isinstance(found, LoadedCheckpoint)
    produce_raw(kafka_broker, topic, [(head, frame_segmented(frame_inline(b"1"), (
        Segment(1, Manifest(0x99, 10, 1024, (0,), bytes(32), None)),)))])
    found = load(kafka_broker, topic, [("events", 0)])[("events", 0)]
    assert isinstance(found, RefusedCheckpoint) and "chunk 0 at offset 0" in found.reason
