"""One input partition's stream processing, without Kafka: records in, output records out.

A `PartitionTask` owns everything one input partition needs: the model (and an optional
`streammargin.StandardScaler` in front of it), the progressive metrics and drift detector, and the
delayed-label store. `process(records)` runs records through it in offset order and returns a
`TaskOutput`:

- ``predictions``: one prediction record per event, as JSON bytes (the formats, and their JSON
  Schemas in `connectors/schemas/`, are in docs/kafka.md):

      binary      {"topic", "partition", "model", "offset", "id", "y_pred": bool,
                   "p_true": float, "y": bool | null}
      multiclass  {"topic", "partition", "model", "offset", "id", "y_pred": label | null,
                   "proba": {label: float}, "y": label | null}

  each with the input record's key, timestamp and (`copy_headers`) headers, and the output
  partition to write them to;
- ``dead_letters``: every record that cannot be used (the codec's `DeadLetter`, or the model's
  documented rejection `streammargin.InvalidInput`): the input record's key, value (null stays
  null), timestamp and headers, plus Kafka Connect's `__connect.errors.*` headers (source topic,
  partition, offset, stage, exception class and message);
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
(`connectors.worker.worker`) adds what needs a broker: polling, sending, checkpoint scheduling,
rebalances and error policies.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import time
import typing
from json.encoder import encode_basestring

import numpy as np

from connectors.codec import (
    MAX_LABEL_CHARS,
    DeadLetter,
    label_from_state,
    label_json,
    label_to_state,
)
from connectors.models import build_model, check_model, model_class, short_name
from connectors.observability.metrics import MAX_CLASSES, PartitionMetrics, label_key, make_detector
from connectors.serializers import VALUE_FORMATS, get_codec, make_codec
from connectors.serializers.mapping import FieldMapping, indicator_splitter, split_indicators
from connectors.serializers.schema_registry import (
    DEFAULT_MAX_CACHE_BYTES,
    RegistryRefused,
    RegistryUnavailable,
    SchemaRegistry,
    check_settings,
)
from connectors.state import checkpoint as checkpoint_module
from connectors.worker.pending_labels import (  # noqa: F401 (ENTRY_BYTES...: re-exported)
    ENTRY_BYTES,
    FEATURE_BYTES,
    INT64_MAX,
    PROBA_CLASS_BYTES,
    PROBA_DICT_BYTES,
    PendingLabels,
    checked_count,
    pending_entry_bytes,
)
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
    "SettingsMismatch",
    "bounded_reason",
    "pending_entry_bytes",
    "qualified_name",
    "dead_letter_headers",
    "ERROR_HEADER",
    "CONNECT_ERRORS",
    "MAX_REASON_CHARS",
    "STAGE_CODEC",
    "STAGE_MODEL",
    "STAGE_CONSUME",
]

# The logger keeps the name it had before connectors/ became packages (issue 26): log lines
# and the filters operators wrote for them say "connectors.task".
log = logging.getLogger("connectors.task")

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


class SettingsMismatch(StateError):
    """A checkpoint (or model record) that is sound but written under other settings than these:
    another model, binary against multiclass, with or without --scale or --label-topic, another
    group, topic or partition. A `StateError` like any refusal; its own class so that a reader
    can tell "these options contradict what the checkpoints hold" (fix the options) from "this
    checkpoint is corrupt or hostile" (`streammargin serve` refuses to start on the first)."""


def bounded_reason(reason: str, limit: int = MAX_REASON_CHARS) -> str:
    """`reason`, cut to `limit` characters (saying how long it was)."""
    if len(reason) <= limit:
        return reason
    return f"{reason[:limit]}... ({len(reason)} characters)"


# Settings -----------------------------------------------------------------------------------------


COPY_HEADERS = ("all", "none")


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """What a partition task needs to know; `WorkerConfig.task_settings()` derives it.

    The defaults are `streammargin kafka`'s. `one_vs_rest` wraps a binary model in
    `streammargin.OneVsRestClassifier(model, max_classes)`; with it, or with a natively
    multiclass model (`multiclass`), labels are taken as they come. `copy_headers` says which
    input headers the prediction records keep: "all", "none", or a tuple of header names.
    """

    group_id: str = "streammargin"
    model: str = "alma"
    params: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    one_vs_rest: bool = False
    max_classes: int = 100
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
    copy_headers: str | tuple[str, ...] = "all"
    # Records as they come (connectors/serializers): the format, where the label, id and features
    # are and what becomes of strings (`mapping`; its `multiclass` is the model's, see
    # `field_mapping`), the Schema Registry of the registry formats, and the topic whose records
    # are labels only (co-partitioned with the input).
    value_format: str = "json"
    mapping: FieldMapping = FieldMapping()
    schema_registry_url: str | None = None
    schema_registry_config: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    schema_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES
    label_topic: str | None = None

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
        if type(self.max_classes) is not int or not 2 <= self.max_classes <= MAX_CLASSES:
            raise ValueError(f"max_classes must be an integer in [2, {MAX_CLASSES}], "
                             f"got {self.max_classes!r}")
        copy = self.copy_headers
        if isinstance(copy, str):
            if copy not in COPY_HEADERS:
                raise ValueError(f"copy_headers must be 'all', 'none' or header names, "
                                 f"got {copy!r}")
        elif not isinstance(copy, tuple) or not all(isinstance(n, str) and n for n in copy):
            raise ValueError(f"copy_headers must be 'all', 'none' or a tuple of header names, "
                             f"got {copy!r}")
        model_class(self.model)  # an unknown model name fails here, not at the first record
        # Bad parameters fail here too; the model says whether it is natively multiclass.
        native = bool(getattr(check_model(self.model, self.params), "_multiclass", False))
        if self.one_vs_rest and native:
            raise ValueError(
                f"--model {self.model} is natively multiclass (it takes any labels): drop "
                "--one-vs-rest"
            )
        object.__setattr__(self, "_native_multiclass", native)
        make_detector(self.drift_detector, self.drift_params)
        if self.value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format must be one of {', '.join(VALUE_FORMATS)}, "
                             f"got {self.value_format!r}")
        if type(self.mapping) is not FieldMapping:
            raise ValueError(f"mapping must be a FieldMapping, got {self.mapping!r:.80}")
        mapping = self.field_mapping()
        if self.codec != "json" and (self.value_format != "json" or not mapping.is_default
                                     or mapping.positive_label is not None):
            raise ValueError(f"--codec {self.codec} decodes records itself: --value-format and "
                             "the field options (--label-field, --features, --positive-label, "
                             "...) are for the built-in codec (--codec json)")
        if self.value_format != "json":
            if not self.schema_registry_url:
                raise ValueError(f"--value-format {self.value_format} needs "
                                 "--schema-registry-url URL")
            check_settings(self.registry_settings())
        if type(self.schema_cache_bytes) is not int or self.schema_cache_bytes < 1 << 16:
            raise ValueError(f"schema_cache_bytes must be an integer >= 65536, "
                             f"got {self.schema_cache_bytes!r}")

    def field_mapping(self) -> FieldMapping:
        """`mapping` with the model's labels: multiclass or binary."""
        if self.mapping.multiclass == self.multiclass:
            return self.mapping
        return dataclasses.replace(self.mapping, multiclass=self.multiclass)

    def registry_settings(self) -> dict[str, typing.Any]:
        """The Schema Registry client's settings: confluent-kafka's names, `url` included."""
        return {**self.schema_registry_config, "url": self.schema_registry_url}

    def make_registry(self) -> SchemaRegistry | None:
        """A client of the Schema Registry (None for plain JSON): one per worker process, whose
        cache serves every task."""
        if self.value_format == "json":
            return None
        return SchemaRegistry(self.registry_settings(), max_cache_bytes=self.schema_cache_bytes)

    @property
    def multiclass(self) -> bool:
        """Whether labels are classes as they come (not binary True/False)."""
        return self.one_vs_rest or self._native_multiclass  # type: ignore[attr-defined]

    @property
    def model_name(self) -> str:
        return short_name(model_class(self.model))

    @property
    def label_max_age_ms(self) -> int | None:
        if self.label_max_age_seconds is None:
            return None
        return int(self.label_max_age_seconds * 1000)

    def make_codec(self, registry: SchemaRegistry | None = None) -> typing.Any:
        """The codec of these settings (the registry formats read schemas from `registry`,
        or from a client of their own when it is None)."""
        if self.codec == "json":
            if registry is None:
                registry = self.make_registry()
            return make_codec(self.value_format, self.field_mapping(), self.max_record_bytes,
                              registry)
        if not self.multiclass:
            return get_codec(self.codec, max_record_bytes=self.max_record_bytes)
        try:
            return get_codec(self.codec, max_record_bytes=self.max_record_bytes, multiclass=True)
        except TypeError as error:
            raise ValueError(
                f"codec {self.codec!r} does not take multiclass=True ({error}): a multiclass "
                "model needs a codec that passes labels as they come"
            ) from None

    def build_model(self) -> typing.Any:
        """A fresh model: `--model` with `--param`, wrapped one-vs-rest if asked."""
        model = build_model(self.model, self.params)
        if self.one_vs_rest:
            return _one_vs_rest_class()(model, max_classes=self.max_classes)
        return model


def _one_vs_rest_class() -> type:
    import streammargin

    return streammargin.OneVsRestClassifier


def _model_classes(model: typing.Any) -> list | None:
    """The classes a multiclass model knows (None: not a multiclass model)."""
    classes = getattr(model, "classes", None)
    if classes is None:
        classifiers = getattr(model, "classifiers", None)
        if classifiers is not None:
            return list(classifiers)
    return None if classes is None else list(classes)


def _built_by(cls: type, model: typing.Any) -> bool:
    """Whether `model` is of the class the model name builds: `cls` itself, or one of the classes
    of a public name that builds several (`streammargin.MPUClassifier._forms`: the linear and
    the kernel MPU)."""
    return type(model) is cls or type(model) in getattr(cls, "_forms", ())


def _is_multiclass(model: typing.Any) -> bool:
    return bool(getattr(model, "_multiclass", False))


def _max_classes(model: typing.Any) -> int:
    """The metrics' class bound of a multiclass model: its own `max_classes` if it has one."""
    bound = getattr(model, "max_classes", None)
    if type(bound) is int and 2 <= bound <= MAX_CLASSES:
        return bound
    return MAX_CLASSES


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


def restore_part(part: str, restore: typing.Callable, data: typing.Any) -> typing.Any:
    """`restore(data)`, with any refusal turned into one `StateError` naming the part.

    The parsers of the parts promise `StateError`; the other exceptions listed are what a parser
    that does not yet keep that promise raises on malformed input. A checkpoint (or a
    model-exchange record) is untrusted, so any of them means "cannot be restored", never a crash
    of the worker.
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


# One partition ------------------------------------------------------------------------------------


def _json_id(event_id: typing.Any) -> str:
    if type(event_id) is str:
        return encode_basestring(event_id)
    if event_id is None:
        return "null"
    return json.dumps(event_id)


def _proba_json(proba: dict) -> str:
    """The class probabilities as a JSON object keyed by label (`label_key`); ArithmeticError
    for a probability that is not a number in [0, 1] (a bug in the model)."""
    parts = []
    for label, p in proba.items():
        if not 0.0 <= p <= 1.0:  # also False for NaN
            raise ArithmeticError(f"the model gave the probability {p!r} to class {label!r:.60}")
        parts.append(f"{encode_basestring(label_key(label))}:{float(p)!r}")
    return "{" + ",".join(parts) + "}"


def _kept_headers(headers: typing.Any, names: frozenset) -> list | None:
    if not headers:
        return None
    kept = [header for header in headers if header[0] in names]
    return kept or None


def _timestamp(record: typing.Any) -> int | None:
    """The record's timestamp in ms, or None (the producer's clock) when it has none."""
    timestamp = record.timestamp
    return timestamp if timestamp is not None and timestamp >= 0 else None


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


def _check_classes(model: typing.Any) -> None:
    """Refuse a restored multiclass model with a class the codec would never give: its
    predictions would break the prediction record's schema."""
    for label in _model_classes(model) or ():
        kind = type(label)
        if not (
            (kind is str and len(label) <= MAX_LABEL_CHARS)
            or kind is bool
            or (kind is int and -(1 << 63) <= label <= INT64_MAX)
        ):
            raise StateError(f"the model has the class {label!r:.60}: labels are strings of at "
                             f"most {MAX_LABEL_CHARS} characters, 64-bit integers or booleans")


def _describe(model: typing.Any) -> str:
    inner = getattr(model, "classifier", None)
    if inner is not None:
        return f"{type(model).__name__} of {type(inner).__name__}"
    return type(model).__name__


_COUNTER_NAMES = ("records", "predictions", "dead_letters", "unjoinable", "undecodable")


def check_model_kind(model: typing.Any, settings: TaskSettings) -> None:
    """`StateError` unless `model` (restored from untrusted bytes: a checkpoint, a model-exchange
    record) is the kind of model `settings` build: its class (wrapped one-vs-rest or not, as
    `settings.one_vs_rest` says), binary or multiclass, and for a multiclass model classes the
    codec could give."""
    wanted = model_class(settings.model)
    if settings.one_vs_rest:
        inner = getattr(model, "classifier", None)
        if type(model) is not _one_vs_rest_class() or not _built_by(wanted, inner):
            raise SettingsMismatch(
                f"it holds a {_describe(model)}, not the one-vs-rest {wanted.__name__} of "
                f"--model {settings.model} --one-vs-rest"
            )
    elif not _built_by(wanted, model):
        raise SettingsMismatch(
            f"it holds a {_describe(model)}, not the {wanted.__name__} of --model "
            f"{settings.model}"
        )
    if _is_multiclass(model) != settings.multiclass:
        kind = "multiclass" if settings.multiclass else "binary"
        raise SettingsMismatch(f"it holds a {'binary' if settings.multiclass else 'multiclass'} "
                         f"{_describe(model)} where the settings ask for a {kind} model")
    if settings.multiclass:
        restore_part("model", _check_classes, model)


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
    ...     Record("events", 0, 0, 1700000000000, b"k1",
    ...            b'{"id": "a", "x": {"f": 1.0}, "y": true}', [("trace", b"t1")]),
    ...     Record("events", 0, 1, 1700000000001, None, b'{"id": 1.5, "x": {"f": 2.0}}', []),
    ... ]
    >>> out = task.process(records)
    >>> prediction = out.predictions[0]
    >>> json.loads(prediction.value)["y_pred"], prediction.key, prediction.headers
    (False, b'k1', [('trace', b't1')])
    >>> prediction.timestamp_ms, len(out.dead_letters)
    (1700000000000, 1)
    >>> headers = dict(out.dead_letters[0].headers)
    >>> headers["__connect.errors.exception.class.name"], headers["__connect.errors.stage"]
    (b'connectors.codec.InvalidRecord', b'VALUE_CONVERTER')
    >>> headers["__connect.errors.exception.message"]
    b'id 1.5 must be a string or an integer (--id-field id)'
    >>> [(event["event"], event["records"]) for event in out.metrics], task.next_offset
    ([('periodic', 2)], 2)

    A natively multiclass model takes the labels as they come:

    >>> task = PartitionTask.new("events", 0, TaskSettings(model="convexpolytope"))
    >>> out = task.process([
    ...     Record("events", 0, 0, 0, None, b'{"x": {"f": 1.0}, "y": "sky"}', []),
    ...     Record("events", 0, 1, 0, None, b'{"x": {"f": -1.0}, "y": "grass"}', []),
    ... ])
    >>> [json.loads(value)["proba"] for value in out.predictions.values]
    [{}, {'sky': 1.0}]

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
        label_next_offset: int | None = None,
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
        self.multiclass = settings.multiclass
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
        # Records processed since the model was last mixed with the other partitions' models
        # (--model-scope topic, connectors/worker/model_scope.py): its weight in the next exchange.
        self.since_mix = 0
        # Whether the model came from a checkpoint (`restore`): in topic scope it holds what the
        # peers had contributed up to it (`streammargin.delta.DeltaLedger`'s `adopt`).
        self.restored = False
        self._prefix = (
            f'{{"topic":{encode_basestring(topic)},"partition":{partition},'
            f'"model":{encode_basestring(self.model_name)},"offset":'
        )
        copy = settings.copy_headers
        self._copy_all = copy == "all"
        self._header_names = frozenset(copy) if isinstance(copy, tuple) else None
        self._codec_class = qualified_name(type(self.codec))
        self._model_class = qualified_name(type(model))
        # --label-topic: its partition of this number holds the labels of this partition's
        # events; `label_next_offset` is the next of its offsets to process.
        self.label_topic = settings.label_topic
        self.label_next_offset = label_next_offset
        self.checkpointed_label_offset = label_next_offset
        self._reads_key = bool(getattr(self.codec, "reads_key", False))
        # Category indicators (features of value True) go to the model unscaled: a scaler would
        # make an indicator, always 1 where present, into 0 (connectors/serializers/mapping.py).
        self._split = (scaler is not None and bool(getattr(self.codec, "emits_indicators", False))
                       and getattr(self.codec, "mapper", None) is not None)
        # (the codec's mapper says how many indicators the event it made holds)
        self._indicator_mapper = self.codec.mapper if self._split else None

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
        model = settings.build_model()
        max_classes = _max_classes(model) if settings.multiclass else 2
        return cls(
            topic,
            partition,
            settings,
            model=model,
            scaler=_new_scaler() if settings.scale else None,
            metrics=PartitionMetrics(
                settings.rolling_window,
                make_detector(settings.drift_detector, settings.drift_params),
                max_classes=max_classes,
            ),
            pending=PendingLabels(settings.label_store_size, settings.label_store_bytes,
                                  settings.label_max_age_records, settings.label_max_age_ms,
                                  settings.multiclass, max_classes),
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
        segments: typing.Mapping[int, bytes] | None = None,
    ) -> PartitionTask:
        """The task saved by `to_checkpoint`, or by `checkpoint_write` with its `segments`;
        `StateError` (and nothing else) if it cannot be. An incremental checkpoint's waiting
        events are not in it: read the input offsets `rebuild_range()` gives into
        `rebuild_pending`, then call `finish_rebuild` (the worker does).

        Refused: unreadable bytes or parts, another group/topic/partition, another model class
        than `settings.model` (wrapped one-vs-rest or not, as `settings.one_vs_rest` says), a
        binary model where the settings are multiclass or the reverse, a class the codec would
        never give, a scaler present or absent against `settings.scale`, out-of-range offsets
        and counters. Model parameters that differ from those of the model the settings build
        now (`settings.params` and this version's defaults), and a one-vs-rest `max_classes`
        that differs, are kept as saved, with a warning: the model goes on as it was.
        """
        import streammargin

        fields = restore_part("checkpoint", checkpoint_module.decode_checkpoint, payload)
        if not isinstance(fields, dict):
            raise StateError("the checkpoint is not a dict of fields")
        saved_at = (_field(fields, "group", str), _field(fields, "topic", str),
                    _field(fields, "partition", int))
        if saved_at != (settings.group_id, topic, partition):
            raise SettingsMismatch(
                f"it belongs to group/topic/partition {'/'.join(map(str, saved_at))!r:.200}, "
                f"not {settings.group_id}/{topic}/{partition}"
            )
        next_offset = checked_count(fields.get("next_offset"), "next_offset")
        label_next_offset = fields.get("label_next_offset")
        if label_next_offset is not None:
            label_next_offset = checked_count(label_next_offset, "label_next_offset")
        saved_label_topic = fields.get("label_topic")
        if saved_label_topic != settings.label_topic:
            raise SettingsMismatch(
                f"it was written with --label-topic {saved_label_topic!r:.200}, not "
                f"{settings.label_topic!r:.200}: the offsets of one label topic mean nothing in "
                "another"
            )
        saved_model = _field(fields, "model", dict)
        model = restore_part("model", streammargin.from_state, saved_model)
        check_model_kind(model, settings)
        saved_scaler = fields.get("scaler")
        if (saved_scaler is not None) != settings.scale:
            raise SettingsMismatch(
                f"it was written {'with' if saved_scaler is not None else 'without'} --scale"
            )
        scaler = None
        if saved_scaler is not None:
            scaler = restore_part("scaler", _scaler_from_state, saved_scaler)
            if type(scaler) is not type(_new_scaler()):
                raise StateError(f"scaler: a {type(scaler).__name__}, not a StandardScaler")
        metrics = restore_part("metrics", _metrics_from_state, _field(fields, "metrics", dict))
        max_classes = _max_classes(model) if settings.multiclass else 2
        saved_pending = _field(fields, "pending", dict)
        limits = dict(max_size=settings.label_store_size, max_bytes=settings.label_store_bytes,
                      max_age_records=settings.label_max_age_records,
                      max_age_ms=settings.label_max_age_ms, multiclass=settings.multiclass,
                      max_classes=max_classes)
        if "segments" in saved_pending:  # an incremental checkpoint (`checkpoint_write`)
            read_pending = functools.partial(PendingLabels.from_checkpoint_state,
                                             segments=segments or {}, next_offset=next_offset,
                                             **limits)
        else:
            if segments:
                raise StateError("the checkpoint holds segments its pending labels do not list")
            read_pending = functools.partial(PendingLabels.from_state, **limits)
        pending = restore_part("pending labels", read_pending, saved_pending)
        saved_counters = _field(fields, "counters", dict)
        counters = {
            name: checked_count(saved_counters.get(name, 0), f"counter {name!r}")
            for name in _COUNTER_NAMES
        }
        restored = model
        if settings.one_vs_rest:
            restored = model.classifier  # the wrapper's parameters are the inner model's
            if getattr(model, "max_classes", settings.max_classes) != settings.max_classes:
                log.warning("the checkpoint of %s/%d keeps its saved max_classes=%s (asked for "
                            "%s)", topic, partition, model.max_classes, settings.max_classes)
        # Against the model these settings build now: parameters asked for on the command line,
        # and defaults this version changed (a state saved before a parameter existed restores
        # with the value that keeps it learning as it did).
        saved_params = restored._get_params()
        wanted = check_model(settings.model, settings.params)._get_params()
        differing = {k: v for k, v in wanted.items() if k in saved_params and saved_params[k] != v}
        if differing:
            log.warning(
                "the checkpoint of %s/%d keeps its saved parameters %s (the command line and "
                "this version's defaults give %s): start with a new --group-id to use those",
                topic, partition, {k: saved_params[k] for k in differing}, differing,
            )
        task = cls(
            topic, partition, settings, model, scaler, metrics, pending, codec=codec,
            next_offset=next_offset, counters=counters,
            prediction_partition=prediction_partition, label_next_offset=label_next_offset,
        )
        task.restored = True
        return task

    def to_checkpoint(self) -> bytes:
        """The task's whole state and its next offset, as checkpoint bytes (its waiting events
        included: `checkpoint_write` is what the worker writes)."""
        return self._encode_checkpoint(self.pending.to_state())

    def checkpoint_write(self) -> checkpoint_module.CheckpointWrite:
        """The task's incremental checkpoint: its state and next offset, with the pending
        store's new segment, written once, instead of its waiting events (read again from the
        input topic on restore: `PendingLabels.checkpoint_state`). Call `mark_checkpointed`
        once it is durable."""
        assert self.next_offset is not None
        state, new, kept = self.pending.checkpoint_state(self.next_offset)
        return checkpoint_module.CheckpointWrite(self._encode_checkpoint(state), new, kept)

    def _encode_checkpoint(self, pending: dict) -> bytes:
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
                "pending": pending,
                "counters": self.counters(),
                "written_at": time.time(),
                # (only with --label-topic: a checkpoint without them reads as it always did)
                **({} if self.label_topic is None else {
                    "label_topic": self.label_topic,
                    "label_next_offset": self.label_next_offset}),
            }
        )

    # Bookkeeping ----------------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        """Whether the task moved on since its last checkpoint."""
        return (self.next_offset != self.checkpointed_offset
                or self.label_next_offset != self.checkpointed_label_offset)

    def mark_checkpointed(self) -> None:
        self.checkpointed_offset = self.next_offset
        self.checkpointed_label_offset = self.label_next_offset
        self.since_checkpoint = 0
        self.pending.checkpoint_written()

    # Restoring an incremental checkpoint's waiting events ----------------------------------------

    def rebuild_range(self) -> tuple[int, int] | None:
        """The input offsets [first, next offset) to read again into `rebuild_pending` (None:
        nothing waits)."""
        return self.pending.rebuild_range()

    def rebuild_pending(self, records: typing.Iterable[typing.Any]) -> None:
        """Take back the waiting events among `records` (of the input partition, in offset
        order, before the next offset): decoded as they were, with the predictions the
        checkpoint kept; nothing is predicted, learnt or sent. A record that no longer gives
        an event with an id is lost (`finish_rebuild` counts it). A Schema Registry that does
        not answer raises `RegistryUnavailable`: call again with the records from there."""
        pending = self.pending
        decode = self.codec.decode
        for record in records:
            offset = record.offset
            served = pending.served_at(offset)
            if served is None:
                continue
            try:
                if self._reads_key:
                    event_id, x, _ = decode(record.value, record.key)
                else:
                    event_id, x, _ = decode(record.value)
            except (DeadLetter, InvalidInput):
                continue
            if event_id is None or x is None:
                continue
            pending.rebuilt(offset, event_id, x, record.timestamp,
                            self._waiting_bytes(record.value, x, served[1]))

    def finish_rebuild(self) -> int:
        """The end of `rebuild_pending`: returns the waiting events not found again."""
        return self.pending.finish_rebuild()

    def _waiting_bytes(self, value: bytes, x: dict, p: typing.Any) -> int:
        """What a waiting event is charged in the pending store: `pending_entry_bytes`, and the
        names of its category indicators, which are not in the record's bytes (an Avro record
        holds the category only)."""
        size = pending_entry_bytes(value, x, p if self.multiclass else None)
        mapper = self._indicator_mapper
        if mapper is not None and mapper.indicators:
            size += sum(len(k) for k, v in x.items() if v is True)
        return size

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
            "multiclass": self.multiclass,
            "one_vs_rest": self.settings.one_vs_rest,
            **self.counters(),
            **self.metrics.summary(),
            "labels": {**self.pending.counters(), "unjoinable": self.n_unjoinable},
            "model_counters": dict(getattr(self.model, "counters", {}) or {}),
        }

    # Records --------------------------------------------------------------------------------

    def predict(self, x: dict) -> tuple[typing.Any, typing.Any]:
        """`(y_pred, p)` of an event of features `x` (as this task's codec decodes them), as
        `process` predicts an event without its label, learning nothing: the scaler's
        transform (category indicators, the features of value True, passed unscaled), then
        the model's label and probabilities from one call. `p` is P(True) for a binary
        model, the probabilities by class for a multiclass one. `streammargin serve` scores
        requests with it (connectors/serving), so that a request gets the probabilities its
        record would have got on the topic from the same checkpoint, bit for bit.
        `ArithmeticError` for a probability that is not a number in [0, 1] (a bug).

        Not thread-safe (the model's caches of the last encoding): one caller at a time.
        """
        scaler = self.scaler
        if scaler is None:
            scaled = x
        elif self._split and True in x.values():
            numbers, indicators = indicator_splitter()(x)
            scaled = scaler.transform_one(numbers)
            scaled.update(indicators)
        else:
            scaled = scaler.transform_one(x)
        model = self.model
        predict_with_proba = getattr(model, "predict_with_proba_one", None)
        if predict_with_proba is None:
            y_pred, p = model.predict_one(scaled), model.predict_proba_one(scaled)
        else:
            y_pred, p = predict_with_proba(scaled)
        if self.multiclass:
            for label, value in p.items():
                if not 0.0 <= value <= 1.0:  # also False for NaN
                    raise ArithmeticError(f"the model gave the probability {value!r} to class "
                                          f"{label!r:.60}")
            return y_pred, p
        p = p.get(True, 0.0)
        if not 0.0 <= p <= 1.0:
            raise ArithmeticError(f"the model gave the probability {p!r}")
        return y_pred, p

    def _learn_scaled(self, x: dict, y: typing.Any) -> None:
        # River's Pipeline order: the unsupervised scaler learns x, then the model learns the
        # freshly scaled x; `transform_learn_one` gives that scaling in the same pass (a delayed
        # label's record takes the compiled path like a labelled event's).
        indicators = None
        if self._split and True in x.values():  # (a waiting event's: no mapper count kept)
            x, indicators = split_indicators(x)
        _, scaled_after, update = self.scaler.transform_learn_one(x)
        self.scaler.apply_learn(update)
        if indicators:
            scaled_after.update(indicators)
        self.model.learn_one(scaled_after, y)

    def _dead_letter(self, out: OutputRecords, record: typing.Any, error: BaseException,
                     stage: str, executing_class: str) -> None:
        """The input record as it came (key, value, timestamp, headers), plus Connect's error
        headers after its own, as Connect's dead-letter queue writes them."""
        self.n_dead_letters += 1
        headers = list(record.headers or ())
        headers += dead_letter_headers(
            self.topic, self.partition, record.offset, self.settings.group_id, stage,
            executing_class, qualified_name(type(error)), str(error),
        )
        out.append(record.value, record.key, headers, _timestamp(record))

    def process(
        self,
        records: typing.Sequence[typing.Any],
        start: int = 0,
        stop: typing.Callable[[], bool] | None = None,
        end: int | None = None,
    ) -> TaskOutput:
        """Predict, learn and count `records[start:end]` (in offset order; `end` None: to the
        last record); returns the outputs.

        Returns early, right after a record that produced a metrics event (so the caller sees
        each event before later records are processed), or before a record when `stop()` says
        so: carry on with `process(records, output.end)`. Records before the task's next offset
        are skipped (stale data after a seek). Raises `TaskFailure` if a record breaks the model
        or codec in an undocumented way.
        """
        out = TaskOutput(OutputRecords(self.prediction_partition), OutputRecords())
        predictions = out.predictions
        emit = predictions.values.append
        emit_key = predictions.keys.append
        emit_headers = predictions.headers.append
        emit_timestamp = predictions.timestamps.append
        copy_all = self._copy_all
        header_names = self._header_names
        dead_letters = out.dead_letters
        decode = self.codec.decode
        reads_key = self._reads_key
        label_topic = self.label_topic
        decode_label = getattr(self.codec, "decode_label", None) if label_topic else None
        label_next_offset = self.label_next_offset
        split = indicator_splitter() if self._split else None
        mapper = self._indicator_mapper
        prefix = self._prefix
        model = self.model
        scaler = self.scaler
        multiclass = self.multiclass
        # The label is predict_one's and the probability predict_proba_one's, as in River's
        # progressive validation: a model's decision rule need not be the argmax of its
        # probabilities (ours may pick the raw score's sign). Our models give both from one
        # encoding and one score (`predict_with_proba_one`); other models take both calls.
        predict_with_proba = getattr(model, "predict_with_proba_one", None)
        if predict_with_proba is None:
            predict_one, predict_proba_one = model.predict_one, model.predict_proba_one

            def predict_with_proba(x: dict) -> tuple:
                return predict_one(x), predict_proba_one(x)
        learn = model.learn_one if scaler is None else self._learn_scaled
        learn_model = model.learn_one
        if scaler is not None:
            transform_learn = scaler.transform_learn_one
            apply_learn = scaler.apply_learn
        update_metrics = (self.metrics.update_multiclass if multiclass
                          else self.metrics.update)
        pending = self.pending
        waiting_bytes = self._waiting_bytes
        metrics_every = self.settings.metrics_every
        next_offset = self.next_offset
        n_records = self.n_records
        n_predictions = self.n_predictions
        n_unjoinable = self.n_unjoinable
        n_done = 0
        drift = False
        stalled = None
        index = start
        if end is None:
            end = len(records)
        while index < end:
            record = records[index]
            offset = record.offset
            is_label = label_topic is not None and record.topic == label_topic
            if is_label:
                if label_next_offset is not None and offset < label_next_offset:
                    index += 1
                    continue
            elif next_offset is not None and offset < next_offset:
                index += 1
                continue  # already processed (stale fetch data after a seek)
            if stop is not None and stop():
                break
            index += 1
            try:
                if is_label:
                    if decode_label is None:
                        raise TypeError(f"the codec {type(self.codec).__name__} has no "
                                        "decode_label: it cannot read --label-topic records")
                    event_id, y = decode_label(record.value, record.key)
                    # A label's age counts the events of this partition (its own offsets are
                    # another partition's).
                    entry = pending.pop(event_id, next_offset or 0, record.timestamp)
                    if entry is not None:
                        learn(entry[0], y)
                        drift = update_metrics(y, entry[3], entry[4], next_offset or 0)
                else:
                    if reads_key:
                        event_id, x, y = decode(record.value, record.key)
                    else:
                        event_id, x, y = decode(record.value)
                    if x is None:
                        entry = pending.pop(event_id, offset, record.timestamp)
                        if entry is not None:
                            learn(entry[0], y)
                            drift = update_metrics(y, entry[3], entry[4], offset)
                    else:
                        if scaler is None:
                            scaled = x
                        elif split is not None and mapper.indicators:
                            numbers, indicators = split(x)
                            if y is None:
                                scaled = scaler.transform_one(numbers)
                            else:
                                scaled, scaled_after, update = transform_learn(numbers)
                                # (the scaler's dicts are its own, made for this record)
                                scaled_after.update(indicators)
                            scaled.update(indicators)
                        elif y is None:
                            scaled = scaler.transform_one(x)
                        else:
                            # River's pipeline: predict on x scaled before learning it, learn on x
                            # scaled after; both in one pass, the scaler learns once predicted.
                            scaled, scaled_after, update = transform_learn(x)
                        y_pred, p = predict_with_proba(scaled)
                        if multiclass:
                            proba_json = _proba_json(p)
                        else:
                            p = p.get(True, 0.0)
                            if not 0.0 <= p <= 1.0:  # also False for NaN
                                raise ArithmeticError(f"the model gave the probability {p!r}")
                        if y is not None:
                            if scaler is None:
                                learn(x, y)
                            else:
                                apply_learn(update)
                                learn_model(scaled_after, y)
                            drift = update_metrics(y, y_pred, p, offset)
                        elif event_id is not None:
                            pending.add(event_id, x, offset, record.timestamp, y_pred, p,
                                        waiting_bytes(record.value, x, p))
                        else:
                            n_unjoinable += 1
                        n_predictions += 1
                        id_json = (
                            encode_basestring(event_id) if type(event_id) is str
                            else _json_id(event_id)
                        )
                        if multiclass:
                            emit((
                                f'{prefix}{offset},"id":{id_json},"y_pred":{label_json(y_pred)},'
                                f'"proba":{proba_json},"y":{label_json(y)}}}'
                            ).encode())
                        else:
                            emit((
                                f'{prefix}{offset},"id":{id_json},'
                                f'"y_pred":{"true" if y_pred else "false"},"p_true":{float(p)!r},'
                                f'"y":{"null" if y is None else "true" if y else "false"}}}'
                            ).encode())
                        # Kafka's conventions: the input's key, timestamp and headers.
                        emit_key(record.key)
                        timestamp = record.timestamp
                        emit_timestamp(timestamp if timestamp is not None and timestamp >= 0
                                       else None)
                        emit_headers(record.headers if copy_all else None if header_names is None
                                     else _kept_headers(record.headers, header_names))
            except RegistryUnavailable as error:
                # Not the record's fault: it waits, unconsumed, for the registry.
                index -= 1
                stalled = str(error)
                break
            except RegistryRefused:
                raise  # the credentials: the worker stops with the fix
            except DeadLetter as error:
                self._dead_letter(dead_letters, record, error, STAGE_CODEC, self._codec_class)
            except InvalidInput as error:
                # The model's documented rejection (it is left untouched): a dead letter.
                self._dead_letter(dead_letters, record, error, STAGE_MODEL, self._model_class)
            except Exception as error:
                raise TaskFailure(record.topic, record.partition, offset, error) from error
            if is_label:
                label_next_offset = offset + 1  # (a dead letter of the label topic)
            else:
                next_offset = offset + 1
            n_done += 1
            n_records += 1
            if drift or n_records % metrics_every == 0:
                break
        self.next_offset = next_offset
        self.label_next_offset = label_next_offset
        self.n_records, self.n_predictions = n_records, n_predictions
        self.n_unjoinable = n_unjoinable
        self.since_checkpoint += n_done
        self.since_mix += n_done
        if drift:
            out.metrics.append(self.metrics_event("drift"))
        if n_done and n_records % metrics_every == 0:
            out.metrics.append(self.metrics_event("periodic"))
        out.end = index
        out.processed = n_done
        out.stalled = stalled
        return out

    def skip(self, first_offset: int, next_offset: int, reason: str,
             details: typing.Sequence[tuple[str, bytes]] = (),
             exception_class: str = "connectors.codec.UndecodableBatch") -> OutputRecords:
        """Give up on offsets [first_offset, next_offset) that cannot be read (an undecodable
        batch): one dead letter without a value (stage KAFKA_CONSUME, the first offset in
        `__connect.errors.offset`, the last in `streammargin.error.last_offset`), counted in
        `undecodable`; the task goes on at `next_offset`. `details` are extra headers (without
        the `streammargin.error.` prefix).
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
        headers = dead_letter_headers(
            self.topic, self.partition, first_offset, self.settings.group_id, STAGE_CONSUME,
            "kafka.KafkaConsumer", exception_class, reason,
        )
        headers.append((ERROR_HEADER + "last_offset", str(next_offset - 1).encode()))
        headers += [(ERROR_HEADER + name, value) for name, value in details]
        out.append(None, None, headers)
        return out

    def __repr__(self) -> str:
        return (f"PartitionTask({self.topic}/{self.partition}, {self.model_name}, "
                f"next_offset={self.next_offset})")
