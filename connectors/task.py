"""One input partition's stream processing, without Kafka: records in, output records out.

A `PartitionTask` owns everything one input partition needs: the model (and an optional
`streammargin.StandardScaler` in front of it), the progressive metrics and drift detector, and the delayed-label
store. `process(records)` runs records through it in offset order and returns a `TaskOutput`:

- ``predictions``: one prediction record per event, `{"topic", "partition", "offset", "id",
  "y_pred", "p_true", "y", "model"}` as JSON bytes, with the output partition to write them to;
- ``dead_letters``: every record that cannot be used (the codec's `DeadLetter`, or the model's
  documented rejection `streammargin.InvalidInput`), raw key and value, with the reason and the
  source coordinates in `streammargin.error.*` headers;
- ``metrics``: metrics events (dicts) at deterministic points: every `metrics_every` records of
  the partition, and on each drift detection.

A record is anything with `topic, partition, offset, timestamp, key, value, headers` (kafka-python's
`ConsumerRecord`, or a plain named tuple in tests). Anything else that goes wrong while a record is
processed (a model raising a plain `ValueError`, a non-finite probability, a codec breaking its
contract) is a bug, not bad input: `process` raises `TaskFailure` naming the record, and the task
must be thrown away.

Every decision depends only on the records and the task's state, never on wall-clock time, so a
task restored from a checkpoint (`to_checkpoint` / `restore`) and fed the same records produces
exactly the outputs and the state of a task that never stopped. The Kafka adapter
(`connectors.worker`) adds what needs a broker: polling, sending, checkpoint scheduling,
rebalances and error policies.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
import typing
from json.encoder import encode_basestring

import numpy as np

from connectors import checkpoint as checkpoint_module
from connectors.codec import DeadLetter, get_codec
from connectors.metrics import PartitionMetrics, make_detector
from connectors.models import build_model, model_class, short_name
from streammargin.errors import InvalidInput, StateError
from streammargin.scaler import StandardScaler

__all__ = [
    "TaskSettings",
    "PartitionTask",
    "TaskOutput",
    "OutputRecords",
    "OutputRecord",
    "PendingLabels",
    "TaskFailure",
    "bounded_reason",
    "pending_entry_bytes",
    "ERROR_HEADER",
    "MAX_REASON_CHARS",
]

log = logging.getLogger(__name__)

# Prefix of the dead-letter headers (reason, source topic/partition/offset, group, ...).
ERROR_HEADER = "streammargin.error."
# A dead letter's reason is cut to this many characters: reasons quote feature names and values,
# and those can be as long as a record.
MAX_REASON_CHARS = 1000
_INT64_MAX = (1 << 63) - 1


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


# Settings -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """What a partition task needs to know; `WorkerConfig.task_settings()` derives it.

    The defaults are `streammargin kafka`'s.
    """

    group_id: str = "streammargin"
    model: str = "alma"
    params: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    scale: bool = False
    codec: str = "json"
    max_record_bytes: int = 1 << 20
    metrics_every: int = 10_000
    rolling_window: int = 1000
    drift_detector: str = "ddm"  # with metrics.TUNED_PARAMS: see benchmarks/drift_detectors.py
    drift_params: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    label_store_size: int = 100_000
    label_store_bytes: int = 256 << 20
    label_max_age_records: int | None = 1_000_000
    label_max_age_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_record_bytes", "metrics_every", "rolling_window", "label_store_size",
                     "label_store_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.label_max_age_records is not None and self.label_max_age_records < 0:
            raise ValueError(
                f"label_max_age_records must be >= 0, got {self.label_max_age_records}"
            )
        if self.label_max_age_seconds is not None and not self.label_max_age_seconds >= 0:
            raise ValueError(
                f"label_max_age_seconds must be >= 0, got {self.label_max_age_seconds}"
            )
        model_class(self.model)  # an unknown model name fails here, not at the first record
        make_detector(self.drift_detector, self.drift_params)

    @property
    def model_name(self) -> str:
        return short_name(model_class(self.model))

    @property
    def label_max_age_ms(self) -> int | None:
        if self.label_max_age_seconds is None:
            return None
        return int(self.label_max_age_seconds * 1000)

    def make_codec(self) -> typing.Any:
        return get_codec(self.codec, max_record_bytes=self.max_record_bytes)


# River objects in a checkpoint --------------------------------------------------------------------
# The one place where the scaler's and the metrics' state functions are called, so that the codec
# of River objects can be swapped without touching the task.


def _new_scaler() -> StandardScaler:
    return StandardScaler()


def _scaler_to_state(scaler: StandardScaler) -> dict:
    return scaler.to_state()


def _scaler_from_state(data: typing.Any) -> StandardScaler:
    return StandardScaler.from_state(data)


def _metrics_to_state(metrics: PartitionMetrics) -> dict:
    return metrics.to_state()


def _metrics_from_state(data: typing.Any) -> PartitionMetrics:
    return PartitionMetrics.from_state(data)


def _restore_part(part: str, restore: typing.Callable, data: typing.Any) -> typing.Any:
    """`restore(data)`, with any refusal turned into one `StateError` naming the part.

    The parsers of the parts promise `StateError`; the other exceptions listed are what a parser
    that does not yet keep that promise raises on malformed input. A checkpoint is untrusted, so
    any of them means "cannot be restored", never a crash of the worker.
    """
    try:
        return restore(data)
    except StateError as error:
        raise StateError(f"{part}: {bounded_reason(str(error), 300)}") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError,
            RecursionError) as error:
        raise StateError(
            f"{part}: unreadable state ({type(error).__name__}: {bounded_reason(str(error), 300)})"
        ) from None


def _field(fields: dict, name: str, kinds: type | tuple[type, ...]) -> typing.Any:
    try:
        value = fields[name]
    except KeyError:
        raise StateError(f"the checkpoint lacks the field {name!r}") from None
    if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is int):
        raise StateError(f"checkpoint field {name!r} has type {type(value).__name__}")
    return value


def _count(value: typing.Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _INT64_MAX:
        raise StateError(f"{what} must be an integer in [0, 2**63), got {value!r:.60}")
    return value


# Output records -----------------------------------------------------------------------------------


class OutputRecord(typing.NamedTuple):
    """One record to produce."""

    value: bytes
    key: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None
    timestamp_ms: int | None = None
    partition: int | None = None


class OutputRecords:
    """Records for one output topic, as columns: values, and keys / headers / timestamps.

    A column that is `None` is `None` for every record (the common case: predictions have no key
    or headers), so the hot loop appends bytes to `values` and nothing else; `append` fills the
    other columns when a record needs them. `partition` is the output partition of every record
    (`None`: the producer's partitioner decides, by key).
    """

    __slots__ = ("partition", "values", "keys", "headers", "timestamps")

    def __init__(self, partition: int | None = None):
        self.partition = partition
        self.values: list[bytes] = []
        self.keys: list[bytes | None] | None = None
        self.headers: list[list[tuple[str, bytes]] | None] | None = None
        self.timestamps: list[int | None] | None = None

    def append(
        self,
        value: bytes,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        n = len(self.values)
        if key is not None and self.keys is None:
            self.keys = [None] * n
        if headers is not None and self.headers is None:
            self.headers = [None] * n
        if timestamp_ms is not None and self.timestamps is None:
            self.timestamps = [None] * n
        self.values.append(value)
        if self.keys is not None:
            self.keys.append(key)
        if self.headers is not None:
            self.headers.append(headers)
        if self.timestamps is not None:
            self.timestamps.append(timestamp_ms)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> OutputRecord:
        return OutputRecord(
            self.values[i],
            None if self.keys is None else self.keys[i],
            None if self.headers is None else self.headers[i],
            None if self.timestamps is None else self.timestamps[i],
            self.partition,
        )

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


# Delayed labels -----------------------------------------------------------------------------------

# Memory held by one waiting event, estimated from its record: the record's bytes plus a fixed cost
# per feature and per entry (Python objects of the decoded dict and the store's own tuple). The
# constants come from tracemalloc on JSON events of 1-100 features with 2-1000 character names
# (the estimate was 1.1x-1.5x the measured size, never below it); it depends only on the record,
# so a replay evicts identically.
ENTRY_BYTES = 400
FEATURE_BYTES = 96


def pending_entry_bytes(value: bytes, x: dict) -> int:
    """The bytes a waiting event is charged in the label store."""
    return len(value) + FEATURE_BYTES * len(x) + ENTRY_BYTES


class PendingLabels:
    """Unlabelled events waiting for their label: bounded in entries, bytes and age.

    Entries are kept in arrival order. When a new entry takes the store past `max_size` entries or
    `max_bytes` bytes (each entry is charged `pending_entry_bytes`), the oldest entries are evicted
    (`evicted`). Ages are measured in records of the partition (offsets) and in Kafka record
    timestamps, never in wall-clock time, so that a replay makes exactly the same decisions; an
    event older than a limit expires (`expired`). Timestamps are the running maximum seen on the
    partition, which only grows: an entry found too old once stays too old. A second event with a
    waiting id replaces the first (`superseded`); a label that finds nothing is an orphan.
    """

    def __init__(
        self,
        max_size: int,
        max_bytes: int = 256 << 20,
        max_age_records: int | None = None,
        max_age_ms: int | None = None,
    ):
        if max_size < 1 or max_bytes < 1:
            raise ValueError(f"max_size and max_bytes must be >= 1, got {max_size}, {max_bytes}")
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.max_age_records = max_age_records
        self.max_age_ms = max_age_ms
        # id -> (x, offset, timestamp ms, predicted label, p_true, bytes)
        self.entries: dict[typing.Any, tuple] = {}
        self.n_bytes = 0
        self.max_timestamp = -(1 << 62)
        self.joined = 0
        self.expired = 0
        self.evicted = 0
        self.superseded = 0
        self.orphans = 0

    def __len__(self) -> int:
        return len(self.entries)

    def _too_old(self, entry: tuple, offset: int) -> bool:
        if self.max_age_records is not None and offset - entry[1] > self.max_age_records:
            return True
        return self.max_age_ms is not None and self.max_timestamp - entry[2] > self.max_age_ms

    def add(self, event_id: typing.Any, x: dict, offset: int, timestamp: int, y_pred: bool,
            p_true: float, size: int) -> None:
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        entries = self.entries
        old = entries.pop(event_id, None)
        if old is not None:
            # The first event can no longer be labelled.
            self.n_bytes -= old[5]
            self.superseded += 1
        if size > self.max_bytes:
            self.evicted += 1  # larger than the whole store: never stored
        else:
            entries[event_id] = (x, offset, timestamp, y_pred, p_true, size)
            self.n_bytes += size
            while len(entries) > self.max_size or self.n_bytes > self.max_bytes:
                self.n_bytes -= entries.pop(next(iter(entries)))[5]
                self.evicted += 1
        self.sweep(offset)

    def pop(self, event_id: typing.Any, offset: int, timestamp: int) -> tuple | None:
        """The waiting event of a label record, or None (orphan label, or expired event)."""
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        entry = self.entries.pop(event_id, None)
        if entry is None:
            self.orphans += 1
            return None
        self.n_bytes -= entry[5]
        if self._too_old(entry, offset):
            self.expired += 1
            return None
        self.joined += 1
        return entry

    def sweep(self, offset: int) -> None:
        """Drop the oldest entries while they are too old."""
        entries = self.entries
        while entries:
            oldest_id = next(iter(entries))
            if not self._too_old(entries[oldest_id], offset):
                return
            self.n_bytes -= entries.pop(oldest_id)[5]
            self.expired += 1

    def counters(self) -> dict[str, int]:
        return {
            "pending": len(self.entries),
            "pending_bytes": self.n_bytes,
            "joined": self.joined,
            "expired": self.expired,
            "evicted": self.evicted,
            "superseded": self.superseded,
            "orphans": self.orphans,
        }

    _COUNTERS = ("joined", "expired", "evicted", "superseded", "orphans")

    def to_state(self) -> dict:
        from streammargin.state import encode_name

        entries = list(self.entries.items())
        return {
            "ids": [encode_name(event_id) for event_id, _ in entries],
            "names": [[encode_name(name) for name in e[0]] for _, e in entries],
            "values": [list(e[0].values()) for _, e in entries],
            "offsets": np.array([e[1] for _, e in entries], dtype=np.int64),
            "timestamps": np.array([e[2] for _, e in entries], dtype=np.int64),
            "y_pred": np.array([e[3] for _, e in entries], dtype=np.bool_),
            "p_true": np.array([e[4] for _, e in entries], dtype=np.float64),
            "sizes": np.array([e[5] for _, e in entries], dtype=np.int64),
            "max_timestamp": self.max_timestamp,
            **{name: getattr(self, name) for name in self._COUNTERS},
        }

    @classmethod
    def from_state(
        cls,
        data: typing.Any,
        max_size: int,
        max_bytes: int = 256 << 20,
        max_age_records: int | None = None,
        max_age_ms: int | None = None,
    ) -> PendingLabels:
        """The store saved by `to_state`, under the given limits; `StateError` if malformed.

        Every length, type and range is checked before any entry is built. Entries beyond the
        current limits (a restart with smaller ones) are evicted, oldest first.
        """
        if not isinstance(data, dict):
            raise StateError(f"pending labels state is a {type(data).__name__}, not a dict")
        columns = {}
        for name in ("ids", "names", "values"):
            column = data.get(name)
            if not isinstance(column, list):
                raise StateError(f"pending labels field {name!r} is not a list")
            columns[name] = column
        for name, dtype in (("offsets", np.int64), ("timestamps", np.int64), ("y_pred", np.bool_),
                            ("p_true", np.float64), ("sizes", np.int64)):
            column = data.get(name)
            if (not isinstance(column, np.ndarray) or column.dtype != np.dtype(dtype)
                    or column.ndim != 1):
                raise StateError(f"pending labels field {name!r} is not a 1-d {np.dtype(dtype)} "
                                 "array")
            columns[name] = column
        n = len(columns["ids"])
        if any(len(column) != n for column in columns.values()):
            raise StateError("pending labels columns have different lengths")
        offsets, sizes, p_true = columns["offsets"], columns["sizes"], columns["p_true"]
        if n and (offsets.min() < 0 or np.any(np.diff(offsets) < 0)):
            raise StateError("pending labels offsets are negative or out of arrival order")
        if n and (sizes.min() < 0 or not np.all((p_true >= 0.0) & (p_true <= 1.0))):
            raise StateError("pending labels sizes are negative or probabilities outside [0, 1]")
        max_timestamp = data.get("max_timestamp")
        if type(max_timestamp) is not int or not -(1 << 63) <= max_timestamp <= _INT64_MAX:
            raise StateError(f"pending labels max_timestamp {max_timestamp!r:.40} is not an int64")
        counts = {name: _count(data.get(name), f"pending labels {name}") for name in cls._COUNTERS}
        names, values = columns["names"], columns["values"]
        for i in range(n):
            if (not isinstance(names[i], list) or not isinstance(values[i], list)
                    or len(names[i]) != len(values[i])):
                raise StateError(f"pending labels entry {i}: names and values do not match")
            for value in values[i]:
                if not _finite_number(value):
                    raise StateError(
                        f"pending labels entry {i}: feature value {value!r:.40} is not a finite "
                        "real number"
                    )

        pending = cls(max_size, max_bytes, max_age_records, max_age_ms)
        entries = pending.entries
        ids = [_decode_name(event_id, "event id") for event_id in columns["ids"]]
        if len(set(ids)) != n:
            raise StateError("pending labels hold an event id twice")
        y_pred = columns["y_pred"]
        timestamps = columns["timestamps"]
        for i in range(n):
            x = {_decode_name(name, "feature name"): value
                 for name, value in zip(names[i], values[i])}
            if len(x) != len(names[i]):
                raise StateError(f"pending labels entry {i} names a feature twice")
            entries[ids[i]] = (x, int(offsets[i]), int(timestamps[i]), bool(y_pred[i]),
                               float(p_true[i]), int(sizes[i]))
        pending.n_bytes = int(sizes.sum(dtype=np.int64)) if n else 0
        pending.max_timestamp = max_timestamp
        for name, count in counts.items():
            setattr(pending, name, count)
        while len(entries) > max_size or pending.n_bytes > max_bytes:
            pending.n_bytes -= entries.pop(next(iter(entries)))[5]
            pending.evicted += 1
        return pending


def _finite_number(value: typing.Any) -> bool:
    kind = type(value)
    if kind is bool:
        return True
    if kind is int:
        return abs(value) <= 1.7976931348623157e308
    return kind is float and math.isfinite(value)


def _decode_name(encoded: typing.Any, what: str) -> typing.Any:
    from streammargin.state import decode_name

    try:
        return decode_name(encoded)
    except StateError:
        raise StateError(f"pending labels: bad {what} {encoded!r:.60}") from None
    except RecursionError:
        raise StateError(f"pending labels: {what} nested too deeply") from None


# One partition ------------------------------------------------------------------------------------


def _json_id(event_id: typing.Any) -> str:
    if type(event_id) is str:
        return encode_basestring(event_id)
    if event_id is None:
        return "null"
    return json.dumps(event_id)


_COUNTER_NAMES = ("records", "predictions", "dead_letters", "unjoinable", "undecodable")


class PartitionTask:
    """The model of one input partition and everything that goes with it.

    Build one with `PartitionTask.new` (a fresh model) or `PartitionTask.restore` (from a
    checkpoint). `prediction_partition` is the output partition of its predictions (`None`: the
    producer's partitioner).

    Examples
    --------

    >>> import collections, json
    >>> Record = collections.namedtuple(
    ...     "Record", "topic partition offset timestamp key value headers")
    >>> task = PartitionTask.new("events", 0, TaskSettings(metrics_every=2))
    >>> records = [
    ...     Record("events", 0, 0, 0, None, b'{"id": "a", "x": {"f": 1.0}, "y": true}', []),
    ...     Record("events", 0, 1, 0, None, b'{"x": {"f": "high"}}', []),
    ... ]
    >>> out = task.process(records)
    >>> json.loads(out.predictions.values[0])["y_pred"], len(out.dead_letters)
    (False, 1)
    >>> dict(out.dead_letters[0].headers)["streammargin.error.reason"]
    b"feature 'f' has value 'high' of type str: expected a finite real number"
    >>> [(event["event"], event["records"]) for event in out.metrics], task.next_offset
    ([('periodic', 2)], 2)

    """

    def __init__(
        self,
        topic: str,
        partition: int,
        settings: TaskSettings,
        model: typing.Any,
        scaler: typing.Any,
        metrics: PartitionMetrics,
        pending: PendingLabels,
        codec: typing.Any = None,
        next_offset: int | None = None,
        counters: dict[str, int] | None = None,
        prediction_partition: int | None = None,
    ):
        self.topic = topic
        self.partition = partition
        self.settings = settings
        self.model = model
        self.scaler = scaler
        self.metrics = metrics
        self.pending = pending
        self.codec = codec if codec is not None else settings.make_codec()
        self.model_name = settings.model_name
        self.next_offset = next_offset
        self.checkpointed_offset = next_offset
        self.prediction_partition = prediction_partition
        counters = counters or {}
        self.n_records = counters.get("records", 0)
        self.n_predictions = counters.get("predictions", 0)
        self.n_dead_letters = counters.get("dead_letters", 0)
        self.n_unjoinable = counters.get("unjoinable", 0)
        self.n_undecodable = counters.get("undecodable", 0)
        self.since_checkpoint = 0
        self._prefix = (
            f'{{"topic":{encode_basestring(topic)},"partition":{partition},'
            f'"model":{encode_basestring(self.model_name)},"offset":'
        )
        self._error_source = [
            (ERROR_HEADER + "topic", topic.encode()),
            (ERROR_HEADER + "partition", str(partition).encode()),
        ]
        self._error_group = (ERROR_HEADER + "group", settings.group_id.encode())

    # Construction ---------------------------------------------------------------------------

    @classmethod
    def new(
        cls,
        topic: str,
        partition: int,
        settings: TaskSettings,
        codec: typing.Any = None,
        prediction_partition: int | None = None,
    ) -> PartitionTask:
        """A fresh task: untrained model, empty metrics and label store, no offset yet."""
        return cls(
            topic,
            partition,
            settings,
            model=build_model(settings.model, settings.params),
            scaler=_new_scaler() if settings.scale else None,
            metrics=PartitionMetrics(
                settings.rolling_window,
                make_detector(settings.drift_detector, settings.drift_params),
            ),
            pending=PendingLabels(settings.label_store_size, settings.label_store_bytes,
                                  settings.label_max_age_records, settings.label_max_age_ms),
            codec=codec,
            prediction_partition=prediction_partition,
        )

    @classmethod
    def restore(
        cls,
        payload: bytes,
        topic: str,
        partition: int,
        settings: TaskSettings,
        codec: typing.Any = None,
        prediction_partition: int | None = None,
    ) -> PartitionTask:
        """The task saved by `to_checkpoint`; `StateError` (and nothing else) if it cannot be.

        Refused: unreadable bytes or parts, another group/topic/partition, another model class
        than `settings.model`, a scaler present or absent against `settings.scale`, out-of-range
        offsets and counters. Model parameters that differ from `settings.params` are kept as
        saved (with a warning): the model goes on as it was.
        """
        import streammargin

        fields = _restore_part("checkpoint", checkpoint_module.decode_checkpoint, payload)
        if not isinstance(fields, dict):
            raise StateError("the checkpoint is not a dict of fields")
        saved_at = (_field(fields, "group", str), _field(fields, "topic", str),
                    _field(fields, "partition", int))
        if saved_at != (settings.group_id, topic, partition):
            raise StateError(
                f"it belongs to group/topic/partition {'/'.join(map(str, saved_at))!r:.200}, "
                f"not {settings.group_id}/{topic}/{partition}"
            )
        next_offset = _count(fields.get("next_offset"), "next_offset")
        saved_model = _field(fields, "model", dict)
        model = _restore_part("model", streammargin.from_state, saved_model)
        wanted = model_class(settings.model)
        if type(model) is not wanted:
            raise StateError(
                f"it holds a {type(model).__name__}, not the {wanted.__name__} of --model "
                f"{settings.model}"
            )
        saved_scaler = fields.get("scaler")
        if (saved_scaler is not None) != settings.scale:
            raise StateError(
                f"it was written {'with' if saved_scaler is not None else 'without'} --scale"
            )
        scaler = None
        if saved_scaler is not None:
            scaler = _restore_part("scaler", _scaler_from_state, saved_scaler)
            if type(scaler) is not type(_new_scaler()):
                raise StateError(f"scaler: a {type(scaler).__name__}, not a StandardScaler")
        metrics = _restore_part("metrics", _metrics_from_state, _field(fields, "metrics", dict))
        pending = PendingLabels.from_state(
            _field(fields, "pending", dict), settings.label_store_size, settings.label_store_bytes,
            settings.label_max_age_records, settings.label_max_age_ms,
        )
        saved_counters = _field(fields, "counters", dict)
        counters = {
            name: _count(saved_counters.get(name, 0), f"counter {name!r}")
            for name in _COUNTER_NAMES
        }
        saved_params = saved_model.get("params")
        if isinstance(saved_params, dict):
            differing = {k: v for k, v in settings.params.items()
                         if saved_params.get(k, v) != v}
            if differing:
                log.warning(
                    "the checkpoint of %s/%d keeps its saved parameters %s (asked for %s)",
                    topic, partition, {k: saved_params.get(k) for k in differing}, differing,
                )
        return cls(
            topic, partition, settings, model, scaler, metrics, pending, codec=codec,
            next_offset=next_offset, counters=counters,
            prediction_partition=prediction_partition,
        )

    def to_checkpoint(self) -> bytes:
        """The task's whole state and its next offset, as checkpoint bytes."""
        return checkpoint_module.encode_checkpoint(
            {
                "group": self.settings.group_id,
                "topic": self.topic,
                "partition": self.partition,
                "next_offset": self.next_offset,
                "model_name": self.model_name,
                "model": self.model.to_state(),
                "scaler": None if self.scaler is None else _scaler_to_state(self.scaler),
                "metrics": _metrics_to_state(self.metrics),
                "pending": self.pending.to_state(),
                "counters": self.counters(),
                "written_at": time.time(),
            }
        )

    # Bookkeeping ----------------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        """Whether the task moved on since its last checkpoint."""
        return self.next_offset != self.checkpointed_offset

    def mark_checkpointed(self) -> None:
        self.checkpointed_offset = self.next_offset
        self.since_checkpoint = 0

    def counters(self) -> dict[str, int]:
        return {
            "records": self.n_records,
            "predictions": self.n_predictions,
            "dead_letters": self.n_dead_letters,
            "unjoinable": self.n_unjoinable,
            "undecodable": self.n_undecodable,
        }

    def metrics_event(self, event: str) -> dict:
        """A metrics record (JSON values) of the task as it is now; `event` says why."""
        return {
            "type": "metrics",
            "event": event,
            "group": self.settings.group_id,
            "topic": self.topic,
            "partition": self.partition,
            "next_offset": self.next_offset,
            "model": self.model_name,
            **self.counters(),
            **self.metrics.summary(),
            "labels": {**self.pending.counters(), "unjoinable": self.n_unjoinable},
            "model_counters": dict(getattr(self.model, "counters", {}) or {}),
        }

    # Records --------------------------------------------------------------------------------

    def _learn_scaled(self, x: dict, y: typing.Any) -> None:
        # River's Pipeline order: the unsupervised scaler learns x, then the model learns the
        # freshly scaled x.
        self.scaler.learn_one(x)
        self.model.learn_one(self.scaler.transform_one(x), y)

    def _dead_letter(self, out: OutputRecords, record: typing.Any, reason: str) -> None:
        self.n_dead_letters += 1
        headers = [
            (ERROR_HEADER + "reason", bounded_reason(reason).encode()),
            *self._error_source,
            (ERROR_HEADER + "offset", str(record.offset).encode()),
            self._error_group,
        ]
        value = record.value
        if value is None:
            headers.append((ERROR_HEADER + "null_value", b"true"))
            value = b""
        out.append(value, record.key, headers)

    def process(
        self,
        records: typing.Sequence[typing.Any],
        start: int = 0,
        stop: typing.Callable[[], bool] | None = None,
    ) -> TaskOutput:
        """Predict, learn and count `records[start:]` (in offset order); returns the outputs.

        Returns early, right after a record that produced a metrics event (so the caller sees
        each event before later records are processed), or before a record when `stop()` says
        so: carry on with `process(records, output.end)`. Records before the task's next offset
        are skipped (stale data after a seek). Raises `TaskFailure` if a record breaks the model
        or codec in an undocumented way.
        """
        out = TaskOutput(OutputRecords(self.prediction_partition), OutputRecords())
        emit = out.predictions.values.append
        dead_letters = out.dead_letters
        decode = self.codec.decode
        prefix = self._prefix
        model = self.model
        scaler = self.scaler
        # The label is predict_one's and the probability predict_proba_one's, as in River's
        # progressive validation: a model's decision rule need not be the argmax of its
        # probabilities (ours may pick the raw score's sign). The second call reuses the
        # feature encoding cached by the first.
        predict = model.predict_one
        predict_proba = model.predict_proba_one
        learn = model.learn_one if scaler is None else self._learn_scaled
        update_metrics = self.metrics.update
        pending = self.pending
        metrics_every = self.settings.metrics_every
        next_offset = self.next_offset
        n_records = self.n_records
        n_predictions = self.n_predictions
        n_unjoinable = self.n_unjoinable
        n_done = 0
        drift = False
        index = start
        end = len(records)
        while index < end:
            record = records[index]
            offset = record.offset
            if next_offset is not None and offset < next_offset:
                index += 1
                continue  # already processed (stale fetch data after a seek)
            if stop is not None and stop():
                break
            index += 1
            try:
                event_id, x, y = decode(record.value)
                if x is None:
                    entry = pending.pop(event_id, offset, record.timestamp)
                    if entry is not None:
                        learn(entry[0], y)
                        drift = update_metrics(y, entry[3], entry[4], offset)
                else:
                    scaled = x if scaler is None else scaler.transform_one(x)
                    y_pred = predict(scaled)
                    p_true = predict_proba(scaled).get(True, 0.0)
                    if not 0.0 <= p_true <= 1.0:  # also False for NaN
                        raise ArithmeticError(f"the model gave the probability {p_true!r}")
                    if y is not None:
                        learn(x, y)
                        drift = update_metrics(y, y_pred, p_true, offset)
                    elif event_id is not None:
                        pending.add(event_id, x, offset, record.timestamp, y_pred, p_true,
                                    len(record.value) + FEATURE_BYTES * len(x) + ENTRY_BYTES)
                    else:
                        n_unjoinable += 1
                    n_predictions += 1
                    id_json = (
                        encode_basestring(event_id) if type(event_id) is str
                        else _json_id(event_id)
                    )
                    emit((
                        f'{prefix}{offset},"id":{id_json},'
                        f'"y_pred":{"true" if y_pred else "false"},"p_true":{float(p_true)!r},'
                        f'"y":{"null" if y is None else "true" if y else "false"}}}'
                    ).encode())
            except DeadLetter as error:
                self._dead_letter(dead_letters, record, str(error))
            except InvalidInput as error:
                # The model's documented rejection (it is left untouched): a dead letter.
                self._dead_letter(dead_letters, record, f"rejected by the model: {error}")
            except Exception as error:
                raise TaskFailure(self.topic, self.partition, offset, error) from error
            next_offset = offset + 1
            n_done += 1
            n_records += 1
            if drift or n_records % metrics_every == 0:
                break
        self.next_offset = next_offset
        self.n_records, self.n_predictions = n_records, n_predictions
        self.n_unjoinable = n_unjoinable
        self.since_checkpoint += n_done
        if drift:
            out.metrics.append(self.metrics_event("drift"))
        if n_done and n_records % metrics_every == 0:
            out.metrics.append(self.metrics_event("periodic"))
        out.end = index
        out.processed = n_done
        return out

    def skip(self, first_offset: int, next_offset: int, reason: str,
             details: typing.Sequence[tuple[str, bytes]] = ()) -> OutputRecords:
        """Give up on offsets [first_offset, next_offset) that cannot be read (an undecodable
        batch): one dead letter without a value, counted in `undecodable`; the task goes on at
        `next_offset`. `details` are extra headers (without the `streammargin.error.` prefix).
        """
        if not 0 <= first_offset < next_offset:
            raise ValueError(f"bad offsets to skip: [{first_offset}, {next_offset})")
        if self.next_offset is not None and first_offset < self.next_offset:
            first_offset = self.next_offset
        out = OutputRecords()
        if first_offset >= next_offset:
            return out
        self.n_dead_letters += 1
        self.n_undecodable += next_offset - first_offset
        self.next_offset = next_offset
        self.since_checkpoint += 1
        out.append(b"", None, [
            (ERROR_HEADER + "reason", bounded_reason(reason).encode()),
            *self._error_source,
            (ERROR_HEADER + "offset", str(first_offset).encode()),
            (ERROR_HEADER + "last_offset", str(next_offset - 1).encode()),
            self._error_group,
            *((ERROR_HEADER + name, value) for name, value in details),
        ])
        return out

    def __repr__(self) -> str:
        return (f"PartitionTask({self.topic}/{self.partition}, {self.model_name}, "
                f"next_offset={self.next_offset})")
