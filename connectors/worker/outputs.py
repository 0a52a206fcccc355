"""The worker's outputs (`Outputs`, a part of `Worker`): predictions, dead letters and metrics
records sent, held or settled; checkpoints in the order that makes a restart exact (outputs
flushed, states written, offsets committed); and, with exactly-once, the transaction that holds
a commit interval's outputs, checkpoints and input offsets.

The methods run on `Worker`'s own attributes: this module holds them so that worker.py holds
the life cycle and the main loop.
"""

from __future__ import annotations

import logging
import time
import typing

from connectors.kafka.transport import TransactionAborted
from connectors.kafka.transport import sendable_headers as _sendable
from connectors.state import checkpoint as checkpoint_module
from connectors.task.output_records import ERROR_HEADER, OutputRecords, TaskOutput
from connectors.task.partition import PartitionTask
from connectors.worker.failures import WorkerError, _send_failure, _transaction_failure

log = logging.getLogger("connectors.worker")  # (the name operators' filters know)

# Exactly-once: a dead letter's value above this many bytes is sent without it (a header says how
# many bytes were dropped). A record the broker refuses as too large fails the whole transaction,
# and its replay would fail again; 900 KiB stays below a default topic's max.message.bytes
# (1 MiB) with room for the key and headers.
EXACTLY_ONCE_DEAD_LETTER_BYTES = 900 << 10
# Exactly-once: this many aborted transactions in a row, without one commit, stop the worker
# (something refuses every transaction: replaying again would only repeat it).
MAX_ABORTS_IN_A_ROW = 5


def _too_large(error: BaseException) -> bool:
    from kafka import errors

    return isinstance(error, (errors.MessageSizeTooLargeError, errors.RecordListTooLargeError))


class Outputs:
    """`Worker`'s sends, checkpoints and transactions."""

    # Sending ----------------------------------------------------------------------------------

    def _send_output(self, task: PartitionTask, output: TaskOutput) -> None:
        if output.predictions.values:
            if self.model_scope is None:
                self._send_predictions(output.predictions)
            else:
                self._hold_predictions(output.predictions)
        if output.dead_letters.values:
            self._send_dead_letters(output.dead_letters)
        for record in output.metrics:
            self._publish_metrics(task, record)

    def _hold_predictions(self, predictions: OutputRecords) -> None:
        """Topic scope: a poll's batches are processed in short runs (`in_time_order`), and a
        send per run made a record batch of some 32 predictions each (measured: 20 us a record
        in sends against 12 with a send per batch). The predictions wait for the end of the
        poll, or until --max-poll-records of them wait (a topic-scope poll holds that many a
        partition: the first predictions of a backlog must not wait for all of it), then go
        out with one send per output partition (`_send_held`). Dead letters and metrics are
        not held."""
        held = self._held.get(predictions.partition)
        if held is None:
            held = self._held[predictions.partition] = OutputRecords(predictions.partition)
        held.extend(predictions)
        if sum(map(len, self._held.values())) >= self.config.max_poll_records:
            self._send_held()

    def _send_held(self) -> None:
        """Send the predictions `_hold_predictions` kept back during a poll."""
        held, self._held = self._held, {}
        for records in held.values():
            self._send_predictions(records)

    def _send_predictions(self, records: OutputRecords) -> None:
        from kafka.errors import KafkaError

        topic = self.config.predictions_topic
        if not topic:
            return
        transport = self._transport
        send = transport.send
        remember = self._sends.append
        partition = records.partition
        values = records.values
        per_message = self.config.predictions_per_message
        outputs = self.outputs
        try:
            if per_message == 1:
                if outputs is not None:
                    values = [outputs.prediction(value) for value in values]
                # Kafka's conventions: the input record's key, timestamp and headers; in bulk
                # where the transport can (kafka-python: one future per record batch,
                # connectors/kafka/bulk_produce.py).
                self._sends.extend(transport.send_many(topic, partition, values, records.keys,
                                                       records.headers, records.timestamps))
            else:
                # One JSON object per N predictions, readable by JSON consumers (ksqlDB, Kafka
                # Connect's JsonConverter, Flink's json format), whose "predictions" array
                # holds the single records; its timestamp is its last input record's.
                timestamps = records.timestamps
                for start in range(0, len(values), per_message):
                    chunk = values[start:start + per_message]
                    value = b'{"predictions":[' + b",".join(chunk) + b"]}"
                    if outputs is not None:
                        value = outputs.prediction(value)
                    remember(send(topic, value, timestamp_ms=timestamps[start + len(chunk) - 1],
                                  partition=partition))
        except KafkaError as error:
            raise self._send_failure(f"predictions to {topic!r}", error) from error

    def _send_dead_letters(self, records: OutputRecords) -> None:
        topic = self.config.dead_letter_topic
        if not topic:
            return
        for record in records:
            self._send_dead_letter(topic, record)
        if len(self._dead_letter_sends) > 1000:
            self._settle_dead_letters(wait=False)

    def _send_dead_letter(self, topic: str, record: typing.Any) -> None:
        from kafka.errors import KafkaError

        if record.value is None and record.key is None:
            # kafka-python cannot produce a record with neither key nor value (a tombstone
            # without key, a skipped batch): an empty value, marked.
            record = record._replace(value=b"", headers=[
                *(record.headers or []), (ERROR_HEADER + "null_value", b"true")])
        if record.headers and any(value is None for _, value in record.headers):
            # An input header with a null value: sent as empty.
            record = record._replace(headers=_sendable(record.headers))
        if (self._exactly_once and record.value
                and len(record.value) > EXACTLY_ONCE_DEAD_LETTER_BYTES):
            record = self._without_value(record, f"above {EXACTLY_ONCE_DEAD_LETTER_BYTES} bytes "
                                                 "with exactly-once")
        try:
            future = self._transport.send(topic, record.value, key=record.key,
                                          headers=record.headers,
                                          timestamp_ms=record.timestamp_ms)
        except KafkaError as error:
            if not _too_large(error) or not record.value:
                raise self._send_failure(f"a dead letter to {topic!r}", error) from error
            self._send_dead_letter(topic, self._without_value(record, type(error).__name__))
            return
        self._dead_letter_sends.append((future, record))

    @staticmethod
    def _without_value(record: typing.Any, why: str) -> typing.Any:
        """A dead letter too large to produce, without its value: the reason, the coordinates
        and the key stay, a header says how many bytes were dropped."""
        log.warning("dead letter of %d bytes too large to produce (%s): sent without its value",
                    len(record.value), why)
        headers = [*(record.headers or []),
                   (ERROR_HEADER + "value_dropped", str(len(record.value)).encode())]
        return record._replace(value=b"", headers=headers)

    def _settle_dead_letters(self, wait: bool) -> None:
        """Forget the dead letters delivered; send again without their value those the broker
        found too large; raise for other failures. `wait`: all are done (after a flush)."""
        topic = self.config.dead_letter_topic
        pending = []
        retry = []
        for future, record in self._dead_letter_sends:
            if not future.is_done:
                pending.append((future, record))
            elif future.failed():
                if not _too_large(future.exception) or not record.value:
                    raise self._send_failure(f"a dead letter to {topic!r}", future.exception)
                retry.append(self._without_value(record, type(future.exception).__name__))
        self._dead_letter_sends = pending
        for record in retry:
            self._send_dead_letter(topic, record)  # type: ignore[arg-type]
        if wait and retry:
            self._transport.flush()
            self._settle_dead_letters(wait=True)

    def _check_sends(self) -> None:
        """Raise if a send failed; forget the ones that completed."""
        sends = self._sends
        if len(sends) < 50_000:
            return
        self._sends = [f for f in sends if not f.is_done]
        for future in sends:
            if future.is_done and future.failed():
                raise self._send_failure("outputs", future.exception)

    def _flush(self) -> None:
        """Make every output sent so far durable (or raise)."""
        from kafka.errors import KafkaError

        try:
            self._transport.flush()
        except KafkaError as error:  # librdkafka's transactional producer, fenced
            raise self._send_failure("outputs", error) from error
        self._settle_dead_letters(wait=True)
        sends, self._sends = self._sends, []
        for future in sends:
            if future.failed():
                raise self._send_failure("outputs", future.exception)

    # Checkpoints ------------------------------------------------------------------------------

    def _save_checkpoints(
            self, payloads: dict[tuple[str, int], checkpoint_module.CheckpointWrite]) -> None:
        """Write the tasks' checkpoints, durably (the one place writing to the checkpoint store)."""
        try:
            self._store.write(payloads)  # type: ignore[union-attr]
        except checkpoint_module.CheckpointError as error:
            self.status.checkpoint_failed(len(payloads))
            raise WorkerError(f"{error} (while writing checkpoints)") from error

    def _checkpoint(
        self, tasks: list[PartitionTask], sync_commit: bool, force_flush: bool = False
    ) -> None:
        """Flush outputs, write the tasks' checkpoints durably, commit their offsets."""
        if self._exactly_once:
            self._commit_transaction()
            return
        dirty = [t for t in tasks if t.dirty and t.next_offset is not None]
        if not dirty:
            if force_flush:
                self._flush()
            return
        started = time.perf_counter()
        # Outputs first: once the checkpoint says "next offset o", every record before o must
        # have its prediction durable.
        self._flush()
        flushed = time.perf_counter()
        payloads = {(t.topic, t.partition): t.checkpoint_write() for t in dirty}
        size = sum(payload.written_bytes for payload in payloads.values())
        self._save_checkpoints(payloads)
        offsets = self._offsets(dirty)
        for task in dirty:
            task.mark_checkpointed()
        if sync_commit:
            try:
                self._transport.commit(offsets, wait=True)
            except Exception as error:  # e.g. a rebalance in progress: the checkpoint stands
                log.warning("offset commit failed (checkpoints are written): %s", error)
        else:
            self._transport.commit(offsets, wait=False)
        done = self._record_checkpoints(payloads, started, flushed)
        log.debug("checkpointed %d partitions, %d bytes, in %.1f ms (+%.1f ms flushing outputs)",
                  len(dirty), size, 1000 * (done - flushed), 1000 * (flushed - started))

    def _record_checkpoints(
            self, payloads: dict[tuple[str, int], checkpoint_module.CheckpointWrite],
            started: float, flushed: float) -> float:
        """Tell the status and `checkpoint_log` of a round of checkpoints (`started` and
        `flushed`: perf_counter times); returns the time it ended."""
        done = time.perf_counter()
        if payloads:
            self.status.checkpointed(
                {key: payload.written_bytes for key, payload in payloads.items()}, done - started)
        self.checkpoint_log.append(
            {
                "partitions": len(payloads),
                "bytes": sum(payload.written_bytes for payload in payloads.values()),
                "flush_outputs_ms": 1000 * (flushed - started),
                "checkpoint_commit_ms": 1000 * (done - flushed),
            }
        )
        return done

    def _send_failure(self, what: str, error: BaseException) -> WorkerError:
        """The error to stop with when producing failed (`_send_failure`); with exactly-once,
        a producer fenced or refused its transactional id says so."""
        from kafka import errors

        if self._exactly_once and isinstance(error, (
                errors.ProducerFencedError, errors.InvalidProducerEpochError,
                errors.TransactionalIdAuthorizationFailedError)):
            return _transaction_failure(error, self._transport.settings["producer"])
        return _send_failure(what, error)

    # Transactions (exactly-once) ----------------------------------------------------------------

    def _commit_transaction(self) -> bool:
        """End the open transaction with every task's checkpoint and next offset, and open the
        next one. All tasks, not only those due: the transaction holds all their outputs, and an
        output committed without its input offset would be produced again after a crash.

        Returns False when the transaction was aborted instead (the tasks are rewound).
        """
        from kafka.errors import KafkaError

        transport = self._transport
        dirty = [t for t in self.tasks.values() if t.dirty and t.next_offset is not None]
        started = time.perf_counter()
        self._flush()
        flushed = time.perf_counter()
        payloads = {(t.topic, t.partition): t.checkpoint_write() for t in dirty}
        offsets = self._offsets(dirty)
        try:
            # The checkpoints go in once the offsets are in: sending the offsets waits for the
            # group coordinator (a rebalance), and a transaction with records on the checkpoint
            # topic holds its last stable offset, which every restore of the group reads up to
            # (a member restoring then blocked the others' rebalance for the reader's timeout).
            transport.commit_transaction(offsets, lambda: self._save_checkpoints(payloads))
        except TransactionAborted as aborted:
            self._rewind(f"transaction aborted: {aborted}")
            return False
        except KafkaError as error:
            raise _transaction_failure(error, transport.settings["producer"]) from error
        self._store.transaction_ended(committed=True)  # type: ignore[union-attr]
        self.status.transaction_ended(committed=True)
        self._aborts_in_a_row = 0
        for task in dirty:
            task.mark_checkpointed()
        transport.begin_transaction()
        done = self._record_checkpoints(payloads, started, flushed)
        log.debug("committed a transaction of %d partitions' checkpoints in %.1f ms (+%.1f ms "
                  "flushing outputs)", len(dirty), 1000 * (done - flushed),
                  1000 * (flushed - started))
        return True

    def _rewind(self, reason: str) -> None:
        """After an aborted transaction: every task goes back to its last committed checkpoint.

        The tasks are dropped; the partitions still assigned are paused and restored again by
        the main loop (checkpoint, seek), and the records since replay into the same state, as
        after a restart. Then the next transaction opens.
        """
        self._store.transaction_ended(committed=False)  # type: ignore[union-attr]
        self.status.transaction_ended(committed=False)
        self._aborts_in_a_row += 1
        self._sends = []
        self._dead_letter_sends = []
        self._idle_since = None
        dropped = list(self.tasks)
        self.tasks.clear()
        if self._merge is not None:
            for tp in dropped:
                self._merge.drop(tp)
        transport = self._transport
        if transport.consuming:
            assigned = transport.assignment()
            kept = [tp for tp in dropped if tp in assigned]
            if kept:
                transport.pause(*kept)
                self._unrestored.update(kept)
                self.status.assigned(kept)
        log.warning("%s; %d partitions go back to their last committed checkpoints",
                    reason, len(dropped))
        if self._aborts_in_a_row >= MAX_ABORTS_IN_A_ROW:
            raise WorkerError(
                f"{self._aborts_in_a_row} transactions in a row were aborted, the last one: "
                f"{reason}. Nothing of them was committed. Fix: check the broker's log and this "
                "worker's producer settings (--producer-config), then restart"
            )
        transport.begin_transaction()
