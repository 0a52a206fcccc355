"""connectors/kafka/bulk_produce.py: many records to one partition without a future per record."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import MessageSizeTooLargeError
from kafka.producer.record_accumulator import RecordAccumulator
from kafka.record.memory_records import MemoryRecordsBuilder

from connectors.kafka.broker import create_topics
from connectors.kafka.bulk_produce import _batch_class, send_many, supported

_names = itertools.count()


def read(bootstrap: str, topic: str, n: int) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False)
    consumer.assign([TopicPartition(topic, 0)])
    records, deadline = [], time.monotonic() + 20
    while len(records) < n and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            records.extend(batch)
    consumer.close()
    return [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in records]


@given(records=st.lists(st.tuples(
    st.one_of(st.none(), st.binary(max_size=40)), st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=8), st.one_of(
        st.none(), st.binary(max_size=10))), max_size=3)),
    st.one_of(st.none(), st.integers(-(2**40), 2**41))), max_size=40),
    batch_size=st.integers(60, 2000))
@settings(max_examples=200, deadline=None)
def test_the_c_writer_writes_the_batches_kafka_pythons_append_writes(records, batch_size):
    from connectors.kafka.bulk_produce import _append, _writer

    writer = _writer()
    if writer is None:
        pytest.skip("record_batch.c is not built (streammargin warmup)")
    keys, values, headers, timestamps = (list(column) for column in zip(*records)) \
        if records else ([], [], [], [])
    values = [b"" if v is None else v for v in values]  # (the worker's values are bytes)

    def batches(c_writer: bool) -> list[bytes]:
        out, index = [], 0
        while index < len(values):
            builder = MemoryRecordsBuilder(2, 0, batch_size)
            while index < len(values):
                if c_writer:
                    index, _, slow = writer(builder._builder, values, keys, headers,
                                            timestamps, index, 1 << 30)
                    builder._next_offset = builder._builder._num_records
                    if not slow:
                        break
                if _append(builder, keys[index], values[index], headers[index],
                           timestamps[index]) is None:
                    break
                index += 1
            builder.close()
            out.append(bytes(builder.buffer()))
        return out

    mine, theirs = batches(True), batches(False)
    if all(t is not None for t in timestamps):  # (None: the producer's clock, read twice)
        assert mine == theirs
    assert len(mine) == len(theirs)


@pytest.mark.kafka
def test_send_many_writes_what_send_writes_in_order(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    bulk, single = f"bulk-{next(_names)}", f"single-{next(_names)}"
    create_topics(bootstrap, [bulk, single])
    # A small batch size: the records span several batches, sends before and after them too.
    producer = KafkaProducer(bootstrap_servers=bootstrap, batch_size=600, linger_ms=5)
    assert supported(producer)
    n = 40
    values = [b'{"i": %d}' % i + b"x" * (i % 13) for i in range(n)]
    keys = [None if i % 4 == 0 else b"k%d" % i for i in range(n)]
    headers = [None if i % 3 else [("trace", b"t%d" % i), ("empty", None)] for i in range(n)]
    timestamps = [None if i % 5 == 0 else 1_700_000_000_000 + i for i in range(n)]
    before, after = (b"before", b"k", [("h", b"v")], 1_600_000_000_000), (b"after", None, None, 7)
    for topic in (bulk, single):
        producer.send(topic, before[0], key=before[1], headers=before[2],
                      timestamp_ms=before[3], partition=0)
    futures = send_many(producer, bulk, 0, values, keys, headers, timestamps)
    for value, key, hdrs, ts in zip(values, keys, headers, timestamps):
        # What the worker sends one by one: a header without value goes out empty.
        hdrs = None if hdrs is None else [(k, b"" if v is None else v) for k, v in hdrs]
        producer.send(single, value, key=key, headers=hdrs, timestamp_ms=ts, partition=0)
    for topic in (bulk, single):
        producer.send(topic, after[0], key=after[1], headers=after[2], timestamp_ms=after[3],
                      partition=0)
    producer.flush()
    assert 1 < len(futures) < n  # one future per batch, not per record
    assert all(f.is_done and f.succeeded() for f in futures)
    mine, theirs = read(bootstrap, bulk, n + 2), read(bootstrap, single, n + 2)
    assert len(mine) == n + 2
    # Records without a timestamp get the producer's clock: compare the others exactly.
    strip = [(o, k, v, h, t if i % 5 != 1 else None) for i, (o, k, v, h, t) in enumerate(mine)]
    same = [(o, k, v, h, t if i % 5 != 1 else None) for i, (o, k, v, h, t) in enumerate(theirs)]
    assert strip == same
    assert [r[2] for r in mine] == [b"before", *values, b"after"]
    producer.close()


@pytest.mark.kafka
def test_send_many_refuses_a_record_beyond_max_request_size_before_appending(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"bulk-{next(_names)}"
    create_topics(bootstrap, [topic])
    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=10_000)
    with pytest.raises(MessageSizeTooLargeError):
        send_many(producer, topic, 0, [b"small", b"x" * 20_000])
    assert not producer._accumulator._batches[TopicPartition(topic, 0)]
    producer.close()


@pytest.mark.kafka
def test_librdkafka_send_many_writes_what_send_writes_through_a_full_queue(kafka_broker):
    # A local queue of 2 records: most records of the 60 meet a full queue and wait for room;
    # some have headers (one without a value), some no key, some no timestamp.
    pytest.importorskip("confluent_kafka")
    from connectors.kafka.librdkafka_transport import LibrdkafkaTransport

    bootstrap = kafka_broker.bootstrap_servers
    bulk, single = f"bulk-{next(_names)}", f"single-{next(_names)}"
    create_topics(bootstrap, [bulk, single])
    settings = {role: {"bootstrap_servers": bootstrap}
                for role in ("producer", "consumer", "admin", "checkpoint_reader")}
    settings["producer"].update({"queue.buffering.max.messages": 2, "linger_ms": 5})
    transport = LibrdkafkaTransport(settings)
    transport.start_producer()
    n = 60
    values = [b'{"i": %d}' % i + b"x" * (i % 13) for i in range(n)]
    keys = [None if i % 4 == 0 else b"k%d" % i for i in range(n)]
    headers = [None if i % 3 else [("trace", b"t%d" % i), ("empty", None)] for i in range(n)]
    timestamps = [None if i % 5 == 0 else 1_700_000_000_000 + i for i in range(n)]
    [delivery] = transport.send_many(bulk, 0, values, keys, headers, timestamps)
    singles = [transport.send(single, value, key, hdrs, ts, 0)
               for value, key, hdrs, ts in zip(values, keys, headers, timestamps)]
    transport.flush()
    assert delivery.is_done and delivery.succeeded()
    assert all(d.is_done and d.succeeded() for d in singles)
    mine, theirs = read(bootstrap, bulk, n), read(bootstrap, single, n)
    assert [r[2] for r in mine] == values
    # Records without a timestamp get the producer's clock: compare the others exactly.
    strip = [(o, k, v, h, t if i % 5 else None) for i, (o, k, v, h, t) in enumerate(mine)]
    same = [(o, k, v, h, t if i % 5 else None) for i, (o, k, v, h, t) in enumerate(theirs)]
    assert strip == same
    assert mine[3][3] == [("trace", b"t3"), ("empty", b"")]
    transport.close_producer(10)


def bulk_batch(n: int):
    records = MemoryRecordsBuilder(2, 0, 1 << 20)
    for i in range(n):
        records.append(1_700_000_000_000 + i, None, b"v%d" % i, [])
    return _batch_class()(TopicPartition("t", 0), records)


def test_a_bulk_batch_settles_its_outcome_when_acknowledged_or_failed():
    ok, failed, partly = bulk_batch(3), bulk_batch(3), bulk_batch(3)
    ok.complete(10, -1)
    assert ok.outcome.succeeded()
    error = RuntimeError("broker said no")
    failed.complete_exceptionally(error, lambda i: error)
    assert failed.outcome.failed() and "broker said no" in str(failed.outcome.exception)
    partly.done(base_offset=0, timestamp_ms=-1, record_exceptions_fn=lambda i: ValueError(i))
    assert partly.outcome.failed()
    # Other sends never append to a bulk batch.
    assert ok.try_append(0, None, b"v", []) is None


@pytest.mark.parametrize("second_half_fails", [False, True])
def test_a_split_bulk_batch_follows_its_halves(second_half_fails):
    # The broker found the batch too large: kafka-python splits it and moves the records'
    # futures to the halves; the bulk batch's outcome waits for both halves.
    accumulator = RecordAccumulator(batch_size=1 << 20)
    batch = bulk_batch(5)
    batch.records.close()
    assert accumulator.split_and_reenqueue(batch) == 2
    halves = list(accumulator._batches[TopicPartition("t", 0)])
    assert [h.record_count for h in halves] == [3, 2]
    halves[0].complete(0, -1)
    assert not batch.outcome.is_done
    if second_half_fails:
        error = RuntimeError("too large still")
        halves[1].complete_exceptionally(error, lambda i: error)
        assert batch.outcome.failed()
    else:
        halves[1].complete(3, -1)
        assert batch.outcome.succeeded()
