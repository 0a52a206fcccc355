"""Producing many records to one partition with kafka-python, without a future per record.

`KafkaProducer.send` costs ~11 us per record on this machine, of which ~1.6 us is encoding the
record into its batch: the rest is per-call work (argument checks, a `TopicPartition`, the
accumulator's lock, a `FutureRecordMetadata` chained to its batch, completed one by one by the
IO thread). `send_many` appends a partition's records straight into new record batches of the
producer's accumulator, as `send` would (same encoding, batch size, compression, idempotence and
transaction bookkeeping, same order after anything sent before), and returns one future per batch
(`BulkBatch.outcome`): done when the batch is acknowledged, failed with the error otherwise. The
records are written into a batch's buffer in one call of `record_batch.c` (`append_records`:
kafka-python's encoding, byte for byte) where `streammargin warmup` built it, a record at a time
by kafka-python's `append` otherwise.

kafka-python splits a batch the broker finds too large and re-sends the halves, moving each
record's future to its half. A `BulkBatch` makes its records' futures only then (`_record_futures`
is read by the split alone), and its outcome follows them: done when all are, failed with the
first error.

This uses kafka-python's producer internals (`_accumulator`, `ProducerBatch`,
`MemoryRecordsBuilder`), checked by `supported(producer)`; where they are not as expected the
caller sends one record at a time (`connectors.worker.worker`). kafka-python is pinned below 4,
and the broker tests run this path.
"""

from __future__ import annotations

import threading
import time
import typing

__all__ = ["BulkBatch", "send_many", "supported"]

_Future: typing.Any = None
_BulkBatchClass: typing.Any = None


def supported(producer: typing.Any) -> bool:
    """Whether `producer` has the kafka-python internals `send_many` uses."""
    accumulator = getattr(producer, "_accumulator", None)
    config = getattr(accumulator, "config", None)
    return (
        accumulator is not None
        and isinstance(config, dict)
        and {"message_version", "compression_attrs", "batch_size"} <= set(config)
        and all(hasattr(accumulator, name) for name in
                ("_batches", "_tp_lock", "_incomplete", "_appends_in_progress", "_closed"))
        and hasattr(producer, "_sender") and hasattr(producer, "_metadata")
        and _batch_class() is not None
    )


def _batch_class() -> typing.Any:
    """`BulkBatch`, defined on first use (kafka-python is imported lazily)."""
    global _BulkBatchClass, _Future
    if _BulkBatchClass is not None:
        return _BulkBatchClass
    try:
        from kafka.future import Future
        from kafka.producer.future import FutureRecordMetadata
        from kafka.producer.producer_batch import ProducerBatch
    except ImportError:
        return None
    _Future = Future

    class BulkBatch(ProducerBatch):
        """A record batch filled by `send_many`: one `outcome` future for all its records."""

        def __init__(self, tp: typing.Any, records: typing.Any, now: float | None = None):
            self._split_futures: list | None = None
            super().__init__(tp, records, now=now)
            self.outcome = Future()
            self._pending = 0
            self._lock = threading.Lock()
            self.produce_future.add_callback(self._acknowledged)
            self.produce_future.add_errback(self._settle_failure)

        def try_append(self, *args: typing.Any, **kwargs: typing.Any) -> None:
            # Full for `send`: its records go to a batch of their own, after this one.
            return None

        # kafka-python's split is the only reader of `_record_futures` (the batch completes
        # through `produce_future`); the record futures are made when it asks.
        @property  # type: ignore[override]
        def _record_futures(self) -> list:
            if self._split_futures is None:
                futures = []
                count = self.records.next_offset()
                self._pending = count
                for index in range(count):
                    future = FutureRecordMetadata(self.produce_future, index, None, None, -1,
                                                  -1, -1)
                    future.add_callback(self._record_done)
                    future.add_errback(self._settle_failure)
                    futures.append(future)
                self._split_futures = futures
            return self._split_futures

        @_record_futures.setter
        def _record_futures(self, value: list) -> None:
            if value:  # ProducerBatch.__init__ sets an empty list
                raise ValueError("a BulkBatch makes its record futures itself")

        def _acknowledged(self, result: tuple) -> None:
            if self._split_futures is not None:
                return  # the record futures settle the outcome
            record_errors = result[2]
            if record_errors is not None:
                self._settle_failure(record_errors(0))
            elif not self.outcome.is_done:
                self.outcome.success(result)

        def _record_done(self, _metadata: typing.Any) -> None:
            with self._lock:
                self._pending -= 1
                done = self._pending == 0
            if done and not self.outcome.is_done:
                self.outcome.success(None)

        def _settle_failure(self, error: BaseException) -> None:
            with self._lock:
                if self.outcome.is_done:
                    return
                self.outcome.failure(error)

    globals()["BulkBatch"] = BulkBatch
    _BulkBatchClass = BulkBatch
    return BulkBatch


def _writer() -> typing.Callable | None:
    """record_batch.c's `append_records`, where `streammargin warmup` built it."""
    from streammargin.jit import aot

    module = aot.native("kafka_records")
    return None if module is None else module.append_records


def _check_size(producer: typing.Any, limit: int, key: typing.Any, value: typing.Any,
                record_headers: typing.Any) -> None:
    """Raise what `send` raises for a record beyond the producer's request size."""
    size = len(value) + (len(key) if key is not None else 0)
    if record_headers:
        size += sum(len(name) + len(header or b"") for name, header in record_headers)
    if size > limit:
        producer._ensure_valid_record_size(
            producer._estimate_size_in_bytes(key, value, record_headers or []))


def _append(records: typing.Any, key: typing.Any, value: typing.Any, record_headers: typing.Any,
            timestamp: typing.Any) -> typing.Any:
    """kafka-python's append of one record (None: the batch is full)."""
    if record_headers and any(header is None for _, header in record_headers):
        # kafka-python's send refuses a header without value: it goes out empty.
        record_headers = [(name, b"" if header is None else header)
                          for name, header in record_headers]
    return records.append(timestamp, key, value, record_headers or [])


def send_many(
    producer: typing.Any,
    topic: str,
    partition: int,
    values: typing.Sequence[bytes],
    keys: typing.Sequence[bytes | None] | None = None,
    headers: typing.Sequence[list | None] | None = None,
    timestamps: typing.Sequence[int | None] | None = None,
) -> list:
    """Append records to `topic`/`partition` in new batches of `producer`; the batches' futures.

    `values[i]` (bytes) goes out with `keys[i]`, `headers[i]` (a list of (str, bytes) or None)
    and `timestamps[i]` (epoch ms, or None for now), as `send` would send them. Raises what
    `send` raises for a closed producer, a topic without metadata in `max_block_ms`, or a record
    larger than `max_request_size` (before anything is appended).
    """
    from kafka import errors
    from kafka.record.memory_records import MemoryRecordsBuilder
    from kafka.structs import TopicPartition

    batch_class = _batch_class()
    if producer._closed:
        raise errors.IllegalStateError("KafkaProducer already closed!")
    n = len(values)
    if not n:
        return []
    keys = keys if keys is not None else [None] * n
    headers = headers if headers is not None else [None] * n
    timestamps = timestamps if timestamps is not None else [None] * n
    if producer._metadata.partitions_for_topic(topic) is None:
        producer._wait_on_metadata(topic, producer.config["max_block_ms"])
    # Records near the request limit are checked exactly as `send` checks them (by the C writer
    # handing them to `_append`, or here).
    limit = producer.config["max_request_size"] // 2
    writer = _writer()
    if writer is None:
        for value, key, record_headers in zip(values, keys, headers):
            _check_size(producer, limit, key, value, record_headers)
    tp = TopicPartition(topic, partition)
    transactions = producer._transaction_manager
    if transactions and transactions.is_transactional():
        transactions.maybe_add_partition_to_transaction(tp)
    accumulator = producer._accumulator
    config = accumulator.config
    now = time.monotonic()
    batches = []
    index = 0
    if writer is not None:  # (its lists: values, keys, headers and timestamps as lists)
        values, keys, headers, timestamps = (
            column if type(column) is list else list(column)
            for column in (values, keys, headers, timestamps))
    while index < n:
        records = MemoryRecordsBuilder(config["message_version"], config["compression_attrs"],
                                       config["batch_size"])
        largest = 0
        while index < n:
            if writer is not None:
                # As many records as the batch takes, written in C (record_batch.c); it stops
                # before a record it leaves to kafka-python's append below.
                builder = records._builder
                index, size, slow = writer(builder, values, keys, headers, timestamps, index,
                                           limit)
                records._next_offset = builder._num_records
                largest = max(largest, size)
                if not slow:
                    break  # the batch is full, or the records end
                _check_size(producer, limit, keys[index], values[index], headers[index])
            metadata = _append(records, keys[index], values[index], headers[index],
                               timestamps[index])
            if metadata is None:
                break  # the batch is full
            if metadata.size > largest:
                largest = metadata.size
            index += 1
        batch = batch_class(tp, records, now=now)
        batch.max_record_size = largest
        batches.append(batch)
    accumulator._appends_in_progress.increment()
    try:
        with accumulator._tp_lock(tp):
            if accumulator._closed:
                raise errors.IllegalStateError("RecordAccumulator is closed")
            queue = accumulator._batches[tp]
            for batch in batches:
                queue.append(batch)
                accumulator._incomplete.add(batch)
    finally:
        accumulator._appends_in_progress.decrement()
    producer._sender.wakeup()
    return [batch.outcome for batch in batches]
