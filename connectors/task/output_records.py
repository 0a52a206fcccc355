"""What a partition task gives back: the output records, and how a record is refused.

- `OutputRecords`: the records for one output topic as columns (values, keys, headers,
  timestamps), and `TaskOutput`, what one `PartitionTask.process` call produced;
- `dead_letter_headers`: Kafka Connect's `__connect.errors.*` headers of a dead letter (the stage
  names `STAGE_CODEC`, `STAGE_MODEL`, `STAGE_CONSUME`);
- `TaskFailure`: a record broke the model or codec in an undocumented way (a bug, never filed as
  a dead letter).
"""

from __future__ import annotations

import dataclasses
import typing

__all__ = [
    "OutputRecord",
    "OutputRecords",
    "TaskOutput",
    "TaskFailure",
    "bounded_reason",
    "qualified_name",
    "dead_letter_headers",
    "ERROR_HEADER",
    "CONNECT_ERRORS",
    "MAX_REASON_CHARS",
    "STAGE_CODEC",
    "STAGE_MODEL",
    "STAGE_CONSUME",
]

# Dead-letter headers. Kafka Connect's names where one applies (what its dead-letter queue
# reporter writes, values as UTF-8 strings), so tools built for Connect's dead-letter topics read
# ours: the source coordinates, the stage, the class doing the work, the exception.
CONNECT_ERRORS = "__connect.errors."
DLQ_TOPIC = CONNECT_ERRORS + "topic"
DLQ_PARTITION = CONNECT_ERRORS + "partition"
DLQ_OFFSET = CONNECT_ERRORS + "offset"
DLQ_CONNECTOR = CONNECT_ERRORS + "connector.name"  # the consumer group: it names a deployment
DLQ_STAGE = CONNECT_ERRORS + "stage"
DLQ_CLASS = CONNECT_ERRORS + "class.name"
DLQ_EXCEPTION = CONNECT_ERRORS + "exception.class.name"
DLQ_MESSAGE = CONNECT_ERRORS + "exception.message"
# Connect's stage names: the codec turns the value into an event (Connect's value converter), the
# model takes it (a sink task's put), or the client cannot read the batch at all.
STAGE_CODEC = "VALUE_CONVERTER"
STAGE_MODEL = "TASK_PUT"
STAGE_CONSUME = "KAFKA_CONSUME"
# Prefix of the dead-letter headers Connect has no name for (last_offset and codec of a skipped
# batch, value_dropped).
ERROR_HEADER = "streammargin.error."
# A dead letter's reason is cut to this many characters: reasons quote feature names and values,
# and those can be as long as a record.
MAX_REASON_CHARS = 1000


def qualified_name(cls: type) -> str:
    """`module.QualifiedName` of a class, as Connect names exception and executing classes."""
    return f"{cls.__module__}.{cls.__qualname__}"


class TaskFailure(RuntimeError):
    """Processing a record failed in an undocumented way: a bug in the model or codec.

    Only the codec's `DeadLetter` and the model's `streammargin.InvalidInput` reject a record;
    anything else stops the stream, naming the record, so that it is fixed instead of filed.
    """

    def __init__(self, topic: str, partition: int, offset: int, error: BaseException):
        self.topic, self.partition, self.offset, self.error = topic, partition, offset, error
        super().__init__(
            f"record {topic}/{partition}@{offset} made the model or codec fail with "
            f"{type(error).__name__}: {bounded_reason(str(error), 300)}. Only the codec's "
            "DeadLetter and the model's streammargin.InvalidInput reject a record; anything else "
            "is a bug to fix (the record was not dead-lettered)"
        )


def bounded_reason(reason: str, limit: int = MAX_REASON_CHARS) -> str:
    """`reason`, cut to `limit` characters (saying how long it was)."""
    if len(reason) <= limit:
        return reason
    return f"{reason[:limit]}... ({len(reason)} characters)"



def dead_letter_headers(
    topic: str,
    partition: int,
    offset: int,
    group_id: str,
    stage: str,
    executing_class: str,
    exception_class: str,
    message: str,
) -> list[tuple[str, bytes]]:
    """The `__connect.errors.*` headers of a dead letter, values as UTF-8 strings (as Kafka
    Connect writes them); the message is cut to `MAX_REASON_CHARS`."""
    return [
        (DLQ_TOPIC, topic.encode()),
        (DLQ_PARTITION, str(partition).encode()),
        (DLQ_OFFSET, str(offset).encode()),
        (DLQ_CONNECTOR, group_id.encode()),
        (DLQ_STAGE, stage.encode()),
        (DLQ_CLASS, executing_class.encode()),
        (DLQ_EXCEPTION, exception_class.encode()),
        (DLQ_MESSAGE, bounded_reason(message).encode(errors="replace")),
    ]


def _kept_headers(headers: typing.Any, names: frozenset) -> list | None:
    if not headers:
        return None
    kept = [header for header in headers if header[0] in names]
    return kept or None


def _timestamp(record: typing.Any) -> int | None:
    """The record's timestamp in ms, or None (the producer's clock) when it has none."""
    timestamp = record.timestamp
    return timestamp if timestamp is not None and timestamp >= 0 else None


# Output records -----------------------------------------------------------------------------------


class OutputRecord(typing.NamedTuple):
    """One record to produce."""

    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None
    timestamp_ms: int | None = None
    partition: int | None = None


class OutputRecords:
    """Records for one output topic, as columns: values, keys, headers and timestamps.

    The hot loop appends to the four lists; `append` is the same for one record. `partition` is
    the output partition of every record (`None`: the producer's partitioner decides, by key).
    A timestamp `None` means "now" to the producer; headers `None` means none.
    """

    __slots__ = ("partition", "values", "keys", "headers", "timestamps")

    def __init__(self, partition: int | None = None):
        self.partition = partition
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.headers: list[list[tuple[str, bytes]] | None] = []
        self.timestamps: list[int | None] = []

    def append(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self.values.append(value)
        self.keys.append(key)
        self.headers.append(headers)
        self.timestamps.append(timestamp_ms)

    def extend(self, other: OutputRecords) -> None:
        """Append `other`'s records, in order."""
        self.values += other.values
        self.keys += other.keys
        self.headers += other.headers
        self.timestamps += other.timestamps

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> OutputRecord:
        return OutputRecord(self.values[i], self.keys[i], self.headers[i], self.timestamps[i],
                            self.partition)

    def __iter__(self) -> typing.Iterator[OutputRecord]:
        return (self[i] for i in range(len(self.values)))

    def __repr__(self) -> str:
        return f"OutputRecords({len(self.values)} records, partition={self.partition})"


@dataclasses.dataclass
class TaskOutput:
    """What one `PartitionTask.process` call produced, ready to send.

    `end` is the index in the records where processing stopped: the length of the records, or
    earlier after a metrics event or a stop request (call `process(records, start=end)` again).
    `processed` counts the records processed (stale ones, before the task's offset, are not).
    """

    predictions: OutputRecords
    dead_letters: OutputRecords
    metrics: list[dict] = dataclasses.field(default_factory=list)
    end: int = 0
    processed: int = 0
    # Why processing stopped before `end`'s record without consuming it (the Schema Registry
    # does not answer): the worker waits, and the record is processed again once it can be.
    stalled: str | None = None
