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

The per-record steps are `connectors.task.records.RecordSteps`, a part of this class.
"""

from __future__ import annotations

import functools
import logging
import time
import typing
from json.encoder import encode_basestring

from connectors.codec import DeadLetter
from connectors.models import check_model
from connectors.observability.metrics import PartitionMetrics, make_detector
from connectors.state import checkpoint as checkpoint_module
from connectors.task.output_records import (
    ERROR_HEADER,
    STAGE_CONSUME,
    OutputRecords,
    dead_letter_headers,
    qualified_name,
)
from connectors.task.pending_labels import PendingLabels, checked_count, pending_entry_bytes
from connectors.task.batch import BatchSteps
from connectors.task.records import RecordSteps
from connectors.task.settings import (
    SettingsMismatch,
    TaskSettings,
    _max_classes,
    check_model_kind,
    restore_part,
)
from streammargin.errors import InvalidInput, StateError
from streammargin.scaler import StandardScaler

__all__ = ["PartitionTask"]

# The logger keeps the name it had before connectors/ became packages (issue 26): log lines
# and the filters operators wrote for them say "connectors.task".
log = logging.getLogger("connectors.task")


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


def _field(fields: dict, name: str, kinds: type | tuple[type, ...]) -> typing.Any:
    try:
        value = fields[name]
    except KeyError:
        raise StateError(f"the checkpoint lacks the field {name!r}") from None
    if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is int):
        raise StateError(f"checkpoint field {name!r} has type {type(value).__name__}")
    return value


_COUNTER_NAMES = ("records", "predictions", "dead_letters", "unjoinable", "undecodable")


class PartitionTask(BatchSteps, RecordSteps):
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
