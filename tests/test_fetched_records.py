"""`connectors.kafka.fetched_records`: fetched record batches read in C give exactly the records,
positions and errors of kafka-python's own reader."""

from __future__ import annotations

import collections
import itertools
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kafka")

from kafka.consumer.fetcher import Fetcher, IsolationLevel
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.structs import TopicPartition

from connectors import codec
from connectors.kafka import fetched_records

TP = TopicPartition("events", 3)
ATTRIBUTES_AT, CRC_AT, HEADER_BYTES = 21, 17, 61
LOG_APPEND_TIME, TRANSACTIONAL, CONTROL = 0x08, 0x10, 0x20
Aborted = collections.namedtuple("Aborted", "producer_id first_offset")

needs_reader = pytest.mark.skipif(fetched_records.reader() is None,
                                  reason="the record_batch.c module is not built")


def kafka_python_reader():
    """kafka-python's own `_unpack_records`, under any wrapper of ours."""
    current = Fetcher.PartitionRecords._unpack_records
    return getattr(current, "_original", current)


def batch(records, base_offset=0, compression=0, producer_id=-1, transactional=False,
          attributes=0, first_timestamp=None):
    """One v2 batch of `records` (key, value, headers, timestamp) at `base_offset`, its
    attributes or'ed with `attributes` (CRC recomputed)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=transactional,
        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 20)
    for i, (key, value, headers, timestamp) in enumerate(records):
        builder.append(i, timestamp=timestamp, key=key, value=value, headers=headers)
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base_offset)
    if attributes:
        (current,) = struct.unpack_from(">h", raw, ATTRIBUTES_AT)
        struct.pack_into(">h", raw, ATTRIBUTES_AT, current | attributes)
        struct.pack_into(">I", raw, CRC_AT, codec.crc32c(memoryview(raw)[ATTRIBUTES_AT:]))
    return bytes(raw)


def control_batch(base_offset, producer_id, abort):
    marker = struct.pack(">hh", 0, 0 if abort else 1)
    return batch([(marker, b"\x00\x00\x00\x00\x00\x00", [], 1)], base_offset,
                 producer_id=producer_id, transactional=True, attributes=CONTROL)


def read(buffer, fast, take=None, fetch_offset=0, **options):
    """(records taken, the fetcher's next offset, the error raised or due at the next take) of
    one PartitionRecords reading `buffer` with our reader (`fast`) or kafka-python's. Ours
    refuses a corrupt batch whole; kafka-python returns its records before the corrupt one."""
    reference = kafka_python_reader()
    records = MemoryRecords(buffer)
    part = Fetcher.PartitionRecords(fetch_offset, TP, records, **options)
    source = (fetched_records.unpack_records(part, TP, records, reference) if fast
              else reference(part, TP, records, None, None))
    part.record_iterator = itertools.dropwhile(part._maybe_skip_record, source)
    try:
        taken = part.take(take)
    except Exception as error:  # noqa: BLE001 (compared between the readers)
        return [], part.next_fetch_offset, error
    # kafka-python returns the records before a corrupt one and raises at the next take
    return taken, part.next_fetch_offset, part._next_inline_exception


header_values = st.one_of(st.none(), st.binary(max_size=8))
record_strategy = st.tuples(
    st.one_of(st.none(), st.binary(max_size=12)),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.lists(st.tuples(st.text(max_size=6), header_values), max_size=3),
    st.integers(0, 2**41),
)


@needs_reader
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(record_strategy, min_size=1, max_size=20), min_size=1,
                        max_size=4),
       compression=st.sampled_from([0, 1, 3, 4]), log_append=st.booleans(),
       take=st.one_of(st.none(), st.integers(1, 30)), fetch_offset=st.integers(0, 10))
def test_the_records_are_kafka_pythons(batches, compression, log_append, take, fetch_offset):
    buffer, offset = b"", 100
    for records in batches:
        buffer += batch(records, offset, compression,
                        attributes=LOG_APPEND_TIME if log_append else 0)
        offset += len(records) + 2  # (a gap, as compaction leaves)
    options = {"check_crcs": True, "fetch_offset": 100 + fetch_offset}
    ours, theirs = read(buffer, True, take, **options), read(buffer, False, take, **options)
    assert ours[2] is None and theirs[2] is None
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]  # the fetcher's position, also after a partial take


@needs_reader
def test_read_committed_skips_aborted_transactions_and_markers_as_kafka_python_does():
    plain = [(b"k", b"v", [("h", b"1")], 5)]
    buffer = (
        batch(plain * 3, 0, producer_id=7, transactional=True)  # aborted below
        + control_batch(3, 7, abort=True)
        + batch(plain * 2, 4, producer_id=8, transactional=True)  # committed
        + control_batch(6, 8, abort=False)
        + batch(plain, 7)  # not transactional
    )
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        options = {"isolation_level": level, "aborted_transactions": [Aborted(7, 0)]}
        ours, theirs = read(buffer, True, **options), read(buffer, False, **options)
        assert ours[2] is None and theirs[2] is None
        assert ours[0] == theirs[0] and ours[1] == theirs[1] == 8
        offsets = [record.offset for record in ours[0]]
        assert offsets == ([4, 5, 7] if level == IsolationLevel.READ_COMMITTED
                           else [0, 1, 2, 4, 5, 7])


@needs_reader
@settings(max_examples=300, deadline=None)
@given(records=st.lists(record_strategy, min_size=1, max_size=6),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                      max_size=4),
       cut=st.integers(0, 40))
def test_a_corrupt_batch_raises_corrupt_record_error_only(records, flips, cut):
    raw = bytearray(batch(records, 50))
    for at, value in flips:  # corrupt the records (the header decides the batch's length)
        raw[HEADER_BYTES + at % (len(raw) - HEADER_BYTES)] = value
    if cut:
        # a record count above what the batch holds
        (count,) = struct.unpack_from(">i", raw, 57)
        struct.pack_into(">i", raw, 57, count + cut)
    buffer = bytes(raw)
    ours = read(buffer, True, check_crcs=False)
    theirs = read(buffer, False, check_crcs=False)
    if ours[2] is not None:
        assert isinstance(ours[2], CorruptRecordError), repr(ours[2])
    if theirs[2] is None:
        # kafka-python read it: so do we, unless it read a number beyond 64 bits
        if ours[2] is not None:
            assert any(not -2**63 <= value < 2**63 for record in theirs[0]
                       for value in (record.offset, record.timestamp)), ours[2]
        else:
            assert ours[0] == theirs[0]
    else:
        assert ours[2] is not None


@needs_reader
def test_a_huge_record_count_fails_without_allocating_for_it():
    raw = bytearray(batch([(b"k", b"v", [], 1)], 0))
    struct.pack_into(">i", raw, 57, 2**31 - 1)
    taken, _, error = read(bytes(raw), True, check_crcs=False)
    assert isinstance(error, CorruptRecordError) and taken == []


def test_without_the_module_the_fetcher_reads_as_kafka_python(monkeypatch):
    monkeypatch.setattr(fetched_records, "_checked", True)
    monkeypatch.setattr(fetched_records, "_reader", None)
    buffer = batch([(b"k", b"v", [], 1)] * 3, 10)
    ours, theirs = read(buffer, True), read(buffer, False)
    assert ours[0] == theirs[0] and ours[1] == theirs[1] == 13


def test_the_batch_errors_wrapper_keeps_kafka_pythons_reader_at_hand():
    codec.install_batch_errors()
    current = Fetcher.PartitionRecords._unpack_records
    assert current._streammargin and current._original.__module__ == "kafka.consumer.fetcher"
