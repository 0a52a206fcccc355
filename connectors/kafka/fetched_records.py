"""kafka-python's fetched record batches, read a batch at a time in C.

kafka-python's fetcher turns a fetched batch into records one at a time in Python
(`Fetcher.PartitionRecords._unpack_records`): about 10 us a record on this project's machine,
more than the worker spends predicting and learning it. `unpack_records` does what that
generator does, batch by batch (the CRC check, read_committed's aborted transactions, control
batches, decompression: kafka-python's own methods), and reads each v2 batch's records in one
call of `record_batch.c` (`parse_records`, about 1 us a record), which makes the same
`ConsumerRecord`s. The fetcher's position (`next_fetch_offset`) still moves record by record, so
`max_poll_records` and a poll that stops within a batch behave as kafka-python's; its fetch
metrics (`records_read`, `bytes_read`) count a batch when it is read rather than as its records
are taken.

It is used where it can be exactly what kafka-python does (`reader`): the C module is built
(`streammargin warmup`; `STREAMMARGIN_AOT=0` turns it off) and kafka-python's batch and record
classes are those it was written against (kafka-python 3.0: `DefaultRecordBatch._buffer`,
`_pos`, `_num_records`, `_maybe_uncompress`, the 13 fields of `ConsumerRecord`); the consumer has
no key or value deserializer (the worker's have none). Anything else, and batches in the legacy
formats (v0 and v1, which Kafka 4 no longer writes), are read by kafka-python's code.
`KafkaPythonTransport` installs it through `codec.install_batch_errors(unpack=...)`, inside the
wrapper that names an undecodable batch.
`tests/test_fetched_records.py` compares the two readers record for record, on valid batches and
on corrupt ones.
"""

from __future__ import annotations

import typing

__all__ = ["reader", "unpack_records"]

# kafka-python's ConsumerRecord, field by field, as record_batch.c fills it.
RECORD_FIELDS = (
    "topic", "partition", "leader_epoch", "offset", "timestamp", "timestamp_type", "key",
    "value", "headers", "checksum", "serialized_key_size", "serialized_value_size",
    "serialized_header_size",
)
_BATCH_SLOTS = ("_buffer", "_pos", "_num_records", "_maybe_uncompress")
_FETCHER_METHODS = ("_consume_aborted_transactions_up_to", "_contains_abort_marker",
                    "_is_batch_aborted")

_reader: typing.Any = None
_checked = False


def reader() -> typing.Callable | None:
    """`record_batch.c`'s `parse_records`, or None where the fetcher must read as kafka-python
    does (the module not built, or kafka-python's classes not those it was written for)."""
    global _reader, _checked
    if _checked:
        return _reader
    _checked = True
    from streammargin.jit import aot

    module = aot.native("kafka_records")
    if module is None:
        return None
    try:
        from kafka.consumer.fetcher import ConsumerRecord, Fetcher, IsolationLevel  # noqa: F401
        from kafka.record.default_records import DefaultRecordBatch
    except ImportError:
        return None
    if tuple(getattr(ConsumerRecord, "_fields", ())) != RECORD_FIELDS or not all(
        name in DefaultRecordBatch.__slots__ or hasattr(DefaultRecordBatch, name)
        for name in _BATCH_SLOTS
    ) or not all(hasattr(Fetcher.PartitionRecords, name) for name in _FETCHER_METHODS):
        return None
    _reader = module.parse_records
    return _reader


def unpack_records(partition_records: typing.Any, tp: typing.Any, records: typing.Any,
                   original: typing.Callable, key_deserializer: typing.Any = None,
                   value_deserializer: typing.Any = None) -> typing.Iterator[typing.Any]:
    """The records of a partition's fetched `records` (a `MemoryRecords`), as kafka-python's
    `PartitionRecords._unpack_records` (`original`) yields them."""
    parse = reader()
    if parse is None or key_deserializer is not None or value_deserializer is not None:
        yield from original(partition_records, tp, records, key_deserializer, value_deserializer)
        return
    from kafka.consumer.fetcher import ConsumerRecord, IsolationLevel
    from kafka.errors import CorruptRecordError

    part = partition_records
    read_committed = part.isolation_level == IsolationLevel.READ_COMMITTED
    topic, partition = tp.topic, tp.partition
    last_batch = None
    batch = records.next_batch()
    while batch is not None:
        last_batch = batch
        if part.check_crcs and not batch.validate_crc():
            raise CorruptRecordError(f"Record batch for partition {tp} at offset "
                                     f"{batch.base_offset} failed crc check")
        if batch.magic != 2:
            yield from _legacy_batch(part, tp, batch)
            batch = records.next_batch()
            continue
        part.leader_epoch = batch.leader_epoch
        if read_committed and batch.has_producer_id():
            # read_committed: a batch of an aborted transaction is skipped, and an abort marker
            # ends its producer's aborted transaction (kafka-python's own bookkeeping).
            part._consume_aborted_transactions_up_to(batch.last_offset)
            if part._contains_abort_marker(batch):
                part.aborted_producer_ids.discard(batch.producer_id)
            elif part._is_batch_aborted(batch):
                part.next_fetch_offset = batch.next_offset
                batch = records.next_batch()
                continue
        if batch.is_control_batch:  # a transaction marker: not a record of the stream
            part.next_fetch_offset = batch.next_offset
            batch = records.next_batch()
            continue
        batch._maybe_uncompress()
        try:
            found, size = parse(
                batch._buffer, batch._pos, batch._num_records, batch.base_offset,
                batch.first_timestamp, batch.max_timestamp,
                batch.timestamp_type == batch.LOG_APPEND_TIME, ConsumerRecord, topic, partition,
                part.leader_epoch, batch.timestamp_type,
            )
        except ValueError as error:
            raise CorruptRecordError(f"Found invalid record structure: {error}") from error
        part.records_read += len(found)
        part.bytes_read += size
        for record in found:
            part.next_fetch_offset = record[3] + 1  # (its offset)
            yield record
        batch = records.next_batch()
    # A v2 batch keeps its last offset when compaction removed its last records: the next fetch
    # starts after the batch, not at its last record left (kafka-python does the same).
    if last_batch is not None and last_batch.magic == 2:
        part.next_fetch_offset = last_batch.next_offset
    part.drain()


def _legacy_batch(part: typing.Any, tp: typing.Any, batch: typing.Any
                  ) -> typing.Iterator[typing.Any]:
    """A v0 or v1 message set's records, read by kafka-python's classes."""
    from kafka.consumer.fetcher import ConsumerRecord
    from kafka.errors import CorruptRecordError

    for record in batch:
        if part.check_crcs and not record.validate_crc():
            raise CorruptRecordError(f"Record for partition {tp} at offset {record.offset} "
                                     "failed crc check")
        key, value, headers = record.key, record.value, record.headers
        part.records_read += 1
        part.bytes_read += record.size_in_bytes
        part.next_fetch_offset = record.offset + 1
        yield ConsumerRecord(
            tp.topic, tp.partition, part.leader_epoch, record.offset, record.timestamp,
            record.timestamp_type, key, value, headers, record.checksum,
            -1 if key is None else len(key), -1 if value is None else len(value),
            sum(len(k.encode("utf-8")) + (0 if v is None else len(v)) for k, v in headers)
            if headers else -1,
        )
