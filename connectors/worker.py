"""The Kafka worker: a model per input partition, predictions, delayed labels, metrics, checkpoints.

`Worker(config).run()` joins a consumer group on the input topics and, for every record of a
partition it owns, in offset order:

1. decodes and validates it (`connectors.codec`); a bad record goes to the dead-letter topic with
   its reason and the model is untouched;
2. predicts with the partition's model and emits one prediction record (with the input
   topic/partition/offset and the event id, so consumers can dedupe replays);
3. learns from it if it is labelled (test-then-train), or keeps its features in a bounded store
   until a label record with the same id arrives (delayed labels);
4. updates the partition's progressive metrics and drift detector, and emits a metrics record
   every `metrics_every` records of the partition (and on drift, revocation and exit).

State lives in Kafka. Every `checkpoint_every` records (or `checkpoint_interval` seconds), on
revocation and on exit, a partition's task is checkpointed: outputs flushed, then its whole state
(model, scaler, metrics, detector, pending labels, next offset) produced to the checkpoint topic
and flushed, then the offset committed. On assignment the task is restored from its latest
checkpoint and the consumer seeks to the checkpoint's offset. Since every step is deterministic,
a worker killed at any point and restarted ends with exactly the state of an uninterrupted run;
records after the last checkpoint are replayed, so their predictions may appear twice
(at-least-once; dedupe on `(topic, partition, offset)`).

Usage in a process of your own::

    worker = Worker(WorkerConfig(topics=["events"], bootstrap_servers="localhost:9092"))
    summary = worker.run(stop_event=threading.Event(), on_metrics=print)

`streammargin kafka` (`connectors.kafka_command`) is the same thing as a command.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import typing
from json.encoder import encode_basestring

import numpy as np
from kafka import ConsumerRebalanceListener

from connectors import checkpoint as checkpoint_module
from connectors.codec import DeadLetter, get_codec, install_fast_crc32c
from connectors.metrics import PartitionMetrics, Throughput, make_detector
from connectors.models import build_model, model_class, short_name
from streammargin.scaler import StandardScaler

__all__ = ["WorkerConfig", "Worker", "PartitionTask", "PendingLabels", "WorkerError"]

log = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    """The worker cannot go on (bad configuration, unusable checkpoint, failed sends)."""


@dataclasses.dataclass
class WorkerConfig:
    """Everything a worker needs; the `streammargin kafka` options map one to one onto it."""

    topics: typing.Sequence[str]
    bootstrap_servers: str = "localhost:9092"
    group_id: str = "streammargin"
    predictions_topic: str | None = "streammargin.predictions"
    metrics_topic: str | None = "streammargin.metrics"
    dead_letter_topic: str | None = "streammargin.dead-letters"
    checkpoint_topic: str = "streammargin.checkpoints"
    # 1: one Kafka message per prediction. N > 1: JSON Lines of up to N predictions per message
    # (several times the throughput: kafka-python's per-message cost dominates the worker's).
    predictions_per_message: int = 1
    model: str = "alma"
    params: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    # A StandardScaler in front of the model (streammargin's: River's arithmetic, bounded memory;
    # its statistics are checkpointed too).
    scale: bool = False
    codec: str = "json"
    max_record_bytes: int = 1 << 20
    # Metrics of a partition every N of its records (deterministic points: a replay repeats
    # them), and optionally every T seconds.
    metrics_every: int = 10_000
    metrics_interval: float | None = None
    checkpoint_every: int = 10_000
    checkpoint_interval: float | None = 60.0
    # A checkpoint above this many bytes is split into records of this size plus a manifest
    # (keep it below the broker's message.max.bytes); larger ones are neither written nor read.
    checkpoint_chunk_bytes: int = checkpoint_module.DEFAULT_CHUNK_BYTES
    max_checkpoint_bytes: int = checkpoint_module.DEFAULT_MAX_CHECKPOINT_BYTES
    # Checkpoint, commit and return after this many seconds without records (None: run forever).
    idle_timeout: float | None = None
    rolling_window: int = 1000
    drift_detector: str = "adwin"
    drift_params: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    # Delayed labels: at most this many unlabelled events wait; an event older than the limits
    # (in records of its partition, or in seconds of Kafka record timestamps) expires.
    label_store_size: int = 100_000
    label_max_age_records: int | None = 1_000_000
    label_max_age_seconds: float | None = None
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    # Big polls pay: measured 12.9k -> 14-17k records/s end to end going from 2000 to 5000.
    max_poll_records: int = 5_000
    auto_offset_reset: str = "earliest"
    client_id: str | None = None
    create_topics: bool = True
    # Settings for every client (security: security_protocol, sasl_*, ssl_*), and per client.
    client_config: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    consumer_config: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    producer_config: dict[str, typing.Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.topics, str):
            self.topics = [self.topics]
        self.topics = list(dict.fromkeys(self.topics))
        if not self.topics:
            raise ValueError("at least one input topic is needed")
        for name in ("metrics_every", "checkpoint_every", "max_poll_records", "label_store_size",
                     "predictions_per_message"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        minimum = checkpoint_module.MIN_CHUNK_BYTES
        if self.checkpoint_chunk_bytes < minimum:
            raise ValueError(f"checkpoint_chunk_bytes must be >= {minimum}, "
                             f"got {self.checkpoint_chunk_bytes!r}")
        if self.max_checkpoint_bytes < 1:
            raise ValueError(f"max_checkpoint_bytes must be >= 1, "
                             f"got {self.max_checkpoint_bytes!r}")
        outputs = [self.predictions_topic, self.metrics_topic, self.dead_letter_topic]
        if set(self.topics) & {self.checkpoint_topic, *[t for t in outputs if t]}:
            raise ValueError("an input topic cannot also be an output or checkpoint topic")
        model_class(self.model)  # fails early on an unknown model name
        make_detector(self.drift_detector, self.drift_params)


# Delayed labels -----------------------------------------------------------------------------------


class PendingLabels:
    """Unlabelled events waiting for their label: bounded in size and in age.

    Entries are kept in arrival order. Ages are measured in records of the partition (offsets)
    and in Kafka record timestamps, never in wall-clock time, so that a replay makes exactly the
    same decisions. Timestamps are taken as the running maximum seen on the partition, which only
    grows: an entry found too old once stays too old, whenever the check happens.
    """

    def __init__(
        self, max_size: int, max_age_records: int | None = None, max_age_ms: int | None = None
    ):
        self.max_size = max_size
        self.max_age_records = max_age_records
        self.max_age_ms = max_age_ms
        # id -> (x, offset, timestamp ms, predicted label, p_true)
        self.entries: dict[typing.Any, tuple] = {}
        self.max_timestamp = -(1 << 62)
        self.joined = 0
        self.expired = 0
        self.orphans = 0

    def __len__(self) -> int:
        return len(self.entries)

    def _too_old(self, entry: tuple, offset: int) -> bool:
        if self.max_age_records is not None and offset - entry[1] > self.max_age_records:
            return True
        return self.max_age_ms is not None and self.max_timestamp - entry[2] > self.max_age_ms

    def add(self, event_id: typing.Any, x: dict, offset: int, timestamp: int, y_pred: bool,
            p_true: float) -> None:
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        entries = self.entries
        if event_id in entries:
            # A second event with the same id supersedes the first, which can no longer be
            # labelled: count it as expired.
            del entries[event_id]
            self.expired += 1
        entries[event_id] = (x, offset, timestamp, y_pred, p_true)
        if len(entries) > self.max_size:
            del entries[next(iter(entries))]
            self.expired += 1
        self.sweep(offset)

    def pop(self, event_id: typing.Any, offset: int, timestamp: int) -> tuple | None:
        """The waiting event of a label record, or None (orphan label, or expired event)."""
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        entry = self.entries.pop(event_id, None)
        if entry is None:
            self.orphans += 1
            return None
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
            del entries[oldest_id]
            self.expired += 1

    def counters(self) -> dict[str, int]:
        return {
            "pending": len(self.entries),
            "joined": self.joined,
            "expired": self.expired,
            "orphans": self.orphans,
        }

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
            "max_timestamp": self.max_timestamp,
            "joined": self.joined,
            "expired": self.expired,
            "orphans": self.orphans,
        }

    @classmethod
    def from_state(cls, data: dict, max_size: int, max_age_records: int | None,
                   max_age_ms: int | None) -> PendingLabels:
        from streammargin.state import decode_name

        pending = cls(max_size, max_age_records, max_age_ms)
        columns = [data[k] for k in ("ids", "names", "values", "offsets", "timestamps", "y_pred",
                                     "p_true")]
        if len({len(c) for c in columns}) != 1:
            raise ValueError("pending label columns have different lengths")
        for event_id, names, values, offset, timestamp, y_pred, p_true in zip(*columns):
            x = {decode_name(name): value for name, value in zip(names, values)}
            pending.entries[decode_name(event_id)] = (
                x, int(offset), int(timestamp), bool(y_pred), float(p_true)
            )
        pending.max_timestamp = int(data["max_timestamp"])
        pending.joined = int(data["joined"])
        pending.expired = int(data["expired"])
        pending.orphans = int(data["orphans"])
        return pending


# One partition ------------------------------------------------------------------------------------


def _json_id(event_id: typing.Any) -> str:
    if type(event_id) is str:
        return encode_basestring(event_id)
    if event_id is None:
        return "null"
    return json.dumps(event_id)


class PartitionTask:
    """The model of one input partition and everything that goes with it."""

    def __init__(
        self,
        topic: str,
        partition: int,
        model: typing.Any,
        scaler: typing.Any,
        metrics: PartitionMetrics,
        pending: PendingLabels,
        model_name: str,
        next_offset: int | None = None,
        counters: dict[str, int] | None = None,
    ):
        self.topic = topic
        self.partition = partition
        self.model = model
        self.scaler = scaler
        self.metrics = metrics
        self.pending = pending
        self.model_name = model_name
        self.next_offset = next_offset
        self.checkpointed_offset = next_offset
        counters = counters or {}
        self.n_records = int(counters.get("records", 0))
        self.n_predictions = int(counters.get("predictions", 0))
        self.n_dead_letters = int(counters.get("dead_letters", 0))
        self.n_unjoinable = int(counters.get("unjoinable", 0))
        self.since_checkpoint = 0
        self.last_metrics: dict | None = None
        self._prefix = (
            f'{{"topic":{encode_basestring(topic)},"partition":{partition},'
            f'"model":{encode_basestring(model_name)},"offset":'
        )

    # Model access (with or without the scaler) ---------------------------------------------

    def learn(self, x: dict, y: bool) -> None:
        # River's Pipeline order: the unsupervised scaler learns x, then the model learns the
        # freshly scaled x.
        if self.scaler is not None:
            self.scaler.learn_one(x)
            x = self.scaler.transform_one(x)
        self.model.learn_one(x, y)

    @property
    def dirty(self) -> bool:
        return self.next_offset != self.checkpointed_offset

    def counters(self) -> dict[str, int]:
        return {
            "records": self.n_records,
            "predictions": self.n_predictions,
            "dead_letters": self.n_dead_letters,
            "unjoinable": self.n_unjoinable,
        }

    # Checkpoints ----------------------------------------------------------------------------

    def to_checkpoint(self, group_id: str) -> bytes:
        return checkpoint_module.encode_checkpoint(
            {
                "group": group_id,
                "topic": self.topic,
                "partition": self.partition,
                "next_offset": self.next_offset,
                "model_name": self.model_name,
                "model": self.model.to_state(),
                "scaler": None if self.scaler is None else self.scaler.to_state(),
                "metrics": self.metrics.to_state(),
                "pending": self.pending.to_state(),
                "counters": self.counters(),
                "written_at": time.time(),
            }
        )


class _Listener(ConsumerRebalanceListener):
    """Rebalance callbacks (kafka-python calls them on its IO thread while `poll` blocks)."""

    def __init__(self, worker: Worker):
        self.worker = worker

    def on_partitions_revoked(self, revoked: typing.Any) -> None:
        self.worker._on_revoked(revoked, lost=False)

    def on_partitions_assigned(self, assigned: typing.Any) -> None:
        self.worker._on_assigned(assigned)

    def on_partitions_lost(self, lost: typing.Any) -> None:
        self.worker._on_revoked(lost, lost=True)


# The worker ---------------------------------------------------------------------------------------


class Worker:
    """A consumer-group member that predicts, learns and checkpoints, one model per partition.

    Parameters
    ----------
    config
        What to consume, where to write, which model, and the client settings.

    """

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.codec = get_codec(config.codec, max_record_bytes=config.max_record_bytes)
        self.model_name = short_name(model_class(config.model))
        self.client_id = config.client_id or f"streammargin-{socket.gethostname()}-{os.getpid()}"
        self.tasks: dict[typing.Any, PartitionTask] = {}
        self.throughput = Throughput()
        self.exit_reason: str | None = None
        self._stop = threading.Event()
        self._on_metrics: typing.Callable[[dict], typing.Any] | None = None
        self._consumer: typing.Any = None
        self._producer: typing.Any = None
        self._store: checkpoint_module.CheckpointStore | None = None
        self._sends: list = []  # futures of the sends since the last flush
        self._prediction_partitions: int = 1
        self._failed = False
        self._last_activity: float | None = None
        self._final_metrics: dict[str, dict] = {}
        # Recent checkpoints: partitions, bytes, and the milliseconds spent flushing outputs and
        # writing + flushing the checkpoints + committing.
        self.checkpoint_log: collections.deque[dict] = collections.deque(maxlen=1000)

    # Life cycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run` to finish the record in hand, checkpoint, commit and return."""
        self._stop.set()

    def run(
        self,
        stop_event: threading.Event | None = None,
        on_metrics: typing.Callable[[dict], typing.Any] | None = None,
    ) -> dict:
        """Consume until stopped (`stop()`, `stop_event`, or the idle timeout); returns a summary.

        `on_metrics` is called with every metrics record (a dict) as it is emitted.
        """
        if stop_event is not None:
            self._stop = stop_event
        self._on_metrics = on_metrics
        try:
            self._connect()
            self._loop()
        except BaseException:
            self._failed = True
            self._close(graceful=False)
            raise
        self._close(graceful=True)
        return self.summary()

    def summary(self) -> dict:
        return {
            "reason": self.exit_reason,
            "records": self.throughput.count,
            "records_per_s": self.throughput.rates()[0],
            "partitions": dict(self._final_metrics),
        }

    def _client_settings(self) -> dict:
        return {"bootstrap_servers": self.config.bootstrap_servers, **self.config.client_config}

    def _connect(self) -> None:
        from kafka import KafkaConsumer, KafkaProducer

        config = self.config
        install_fast_crc32c()
        settings = self._client_settings()
        producer_settings = {
            "client_id": self.client_id,
            "linger_ms": 20,
            "batch_size": 1 << 20,
            # Checkpoints of big models and dead letters of oversized records are large.
            "max_request_size": max(64 << 20, 2 * config.max_record_bytes),
            "metrics_enabled": False,
            **settings,
            **config.producer_config,
        }
        self._producer = KafkaProducer(**producer_settings)
        if config.create_topics:
            self._create_topics()
        consumer_settings = {
            "client_id": self.client_id,
            "group_id": config.group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": config.auto_offset_reset,
            "session_timeout_ms": config.session_timeout_ms,
            "heartbeat_interval_ms": config.heartbeat_interval_ms,
            "max_poll_records": config.max_poll_records,
            "fetch_max_wait_ms": 100,
            # Room for a whole poll of one partition in one fetch (the default is 1 MiB).
            "max_partition_fetch_bytes": max(4 << 20, config.max_record_bytes),
            "fetch_max_bytes": 64 << 20,
            "metrics_enabled": False,
            **settings,
            **config.consumer_config,
        }
        self._consumer = KafkaConsumer(**consumer_settings)
        self._store = checkpoint_module.CheckpointStore(
            config.bootstrap_servers,
            config.checkpoint_topic,
            config.group_id,
            producer=self._producer,
            reader_config=config.client_config,
            chunk_bytes=config.checkpoint_chunk_bytes,
            max_checkpoint_bytes=config.max_checkpoint_bytes,
        )
        if config.predictions_topic:
            partitions = self._producer.partitions_for(config.predictions_topic)
            self._prediction_partitions = max(1, len(partitions or ()))
        self._consumer.subscribe(config.topics, listener=_Listener(self))
        # The idle clock starts at the first assignment: joining the group takes a while.
        self._last_activity = None

    def _create_topics(self) -> None:
        """Create the missing output topics (as many partitions as the inputs have)."""
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic
        from kafka.errors import KafkaError, TopicAlreadyExistsError

        config = self.config
        admin = KafkaAdminClient(client_id=self.client_id, **self._client_settings())
        try:
            existing = set(admin.list_topics())
            partitions_for = self._producer.partitions_for
            n_input = max(
                [len(partitions_for(t) or ()) for t in config.topics if t in existing] or [1]
            )
            wanted = []
            for name in (config.predictions_topic, config.metrics_topic, config.dead_letter_topic):
                if name and name not in existing:
                    wanted.append(NewTopic(name, num_partitions=n_input, replication_factor=1))
            if config.checkpoint_topic not in existing:
                wanted.append(
                    NewTopic(
                        config.checkpoint_topic,
                        num_partitions=1,
                        replication_factor=1,
                        topic_configs={"cleanup.policy": "compact"},
                    )
                )
            for topic in wanted:
                try:
                    admin.create_topics([topic])
                except TopicAlreadyExistsError:
                    pass
                except KafkaError as error:
                    log.warning("could not create topic %s: %s", topic.name, error)
        finally:
            admin.close()

    def _loop(self) -> None:
        config = self.config
        consumer = self._consumer
        stop = self._stop
        throughput = self.throughput
        now = time.monotonic()
        next_metrics = now + config.metrics_interval if config.metrics_interval else None
        next_checkpoint = now + config.checkpoint_interval if config.checkpoint_interval else None
        while not stop.is_set():
            batches = consumer.poll(timeout_ms=200, max_records=config.max_poll_records)
            now = time.monotonic()
            if batches:
                self._last_activity = now
                for tp, records in batches.items():
                    task = self.tasks.get(tp)
                    if task is None:
                        log.warning("records of %s, which has no task: skipped", tp)
                        continue
                    throughput.add(self._process(task, records))
                    if stop.is_set():
                        break
                self._check_sends()
            elif (
                config.idle_timeout is not None
                and self._last_activity is not None
                and now - self._last_activity > config.idle_timeout
            ):
                self.exit_reason = "idle"
                return
            due = [t for t in self.tasks.values() if t.since_checkpoint >= config.checkpoint_every]
            if next_checkpoint is not None and now >= next_checkpoint:
                due = list(self.tasks.values())
                next_checkpoint = now + config.checkpoint_interval  # type: ignore[operator]
            if due and not stop.is_set():
                self._checkpoint(due, sync_commit=True)
            if next_metrics is not None and now >= next_metrics:
                for task in self.tasks.values():
                    self._emit_metrics(task, "interval")
                next_metrics = now + config.metrics_interval  # type: ignore[operator]
        self.exit_reason = "stopped"

    def _close(self, graceful: bool) -> None:
        consumer, producer = self._consumer, self._producer
        try:
            if graceful and consumer is not None:
                tasks = list(self.tasks.values())
                for task in tasks:
                    self._emit_metrics(task, "final")
                self._checkpoint(tasks, sync_commit=True, force_flush=True)
                # Checkpointed: the revocation callback of close() has nothing left to do.
                self.tasks.clear()
        finally:
            closers = []
            if consumer is not None:
                # Leaves the group; the revocation callback finds nothing left to checkpoint.
                closers.append(consumer.close)
            if self._store is not None:
                closers.append(self._store.close)
            if producer is not None:
                closers.append(lambda: producer.close(timeout=10 if graceful else 0))
            for close in closers:
                try:
                    close()
                except Exception as error:
                    if graceful:
                        raise
                    # Failing already: keep the original error, not the close's.
                    log.debug("ignored while closing after a failure: %r", error)
            self._consumer = self._producer = self._store = None

    # Rebalance --------------------------------------------------------------------------------

    def _on_assigned(self, assigned: typing.Iterable) -> None:
        self._last_activity = time.monotonic()
        new = [tp for tp in assigned if tp not in self.tasks]
        if not new:
            return
        started = time.monotonic()
        store = self._store
        assert store is not None
        saved = store.load([(tp.topic, tp.partition) for tp in new])
        for tp in sorted(new):
            loaded = saved.get((tp.topic, tp.partition))
            if isinstance(loaded, checkpoint_module.RefusedCheckpoint):
                raise WorkerError(str(loaded))
            task = self._new_task(tp) if loaded is None else self._restore(tp, loaded.payload)
            self.tasks[tp] = task
            if task.next_offset is not None:
                self._consumer.seek(tp, task.next_offset)
        log.info(
            "assigned %s (%d restored from checkpoints) in %.0f ms",
            ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(new)),
            len(saved),
            1000 * (time.monotonic() - started),
        )

    def _on_revoked(self, revoked: typing.Iterable, lost: bool) -> None:
        tasks = [self.tasks[tp] for tp in revoked if tp in self.tasks]
        if not tasks:
            return
        if not lost and not self._failed:
            for task in tasks:
                self._emit_metrics(task, "revoked")
            # On kafka-python's IO thread: blocking commits are not allowed here, the commit is
            # sent asynchronously (the checkpoint, already flushed, is what restores the task).
            self._checkpoint(tasks, sync_commit=False)
        for task in tasks:
            self.tasks.pop((task_tp := self._tp(task)), None)
            log.info("%s %s", "lost" if lost else "revoked", task_tp)

    @staticmethod
    def _tp(task: PartitionTask) -> typing.Any:
        from kafka import TopicPartition

        return TopicPartition(task.topic, task.partition)

    def _new_task(self, tp: typing.Any) -> PartitionTask:
        config = self.config
        model = build_model(config.model, config.params)
        scaler = None
        if config.scale:
            scaler = StandardScaler()
        metrics = PartitionMetrics(
            config.rolling_window, make_detector(config.drift_detector, config.drift_params)
        )
        task = PartitionTask(
            tp.topic, tp.partition, model, scaler, metrics, self._new_pending(), self.model_name
        )
        # No checkpoint: a fresh model starts where the group's committed offset (if any) or
        # auto_offset_reset says. (Blocking consumer calls such as committed() are not allowed
        # on the IO thread that runs this callback.)
        return task

    def _new_pending(self, data: dict | None = None) -> PendingLabels:
        config = self.config
        max_age_ms = (
            None if config.label_max_age_seconds is None
            else int(config.label_max_age_seconds * 1000)
        )
        if data is None:
            return PendingLabels(config.label_store_size, config.label_max_age_records, max_age_ms)
        return PendingLabels.from_state(
            data, config.label_store_size, config.label_max_age_records, max_age_ms
        )

    def _restore(self, tp: typing.Any, payload: bytes) -> PartitionTask:
        import streammargin

        config = self.config
        where = f"checkpoint of {tp.topic}/{tp.partition} in {config.checkpoint_topic!r}"
        try:
            fields = checkpoint_module.decode_checkpoint(payload)
            if (fields["group"], fields["topic"], fields["partition"]) != (
                config.group_id, tp.topic, tp.partition
            ):
                raise ValueError("its key fields name another group, topic or partition")
            model = streammargin.from_state(fields["model"])
            scaler = (
                None if fields["scaler"] is None else StandardScaler.from_state(fields["scaler"])
            )
            metrics = PartitionMetrics.from_state(fields["metrics"])
            pending = self._new_pending(fields["pending"])
            next_offset = int(fields["next_offset"])
        except (KeyError, TypeError, ValueError) as error:
            raise WorkerError(f"unusable {where}: {error}") from error
        if type(model) is not model_class(config.model):
            raise WorkerError(
                f"the {where} holds a {type(model).__name__}, not a "
                f"{model_class(config.model).__name__}: use another --group-id to start afresh"
            )
        if (scaler is not None) != config.scale:
            raise WorkerError(
                f"the {where} was written {'with' if scaler is not None else 'without'} --scale:"
                " use the same setting, or another --group-id to start afresh"
            )
        saved_params = fields["model"]["params"]
        differing = {k: v for k, v in config.params.items() if saved_params.get(k, v) != v}
        if differing:
            log.warning(
                "%s keeps its saved parameters %s (asked for %s)",
                where, {k: saved_params.get(k) for k in differing}, differing,
            )
        return PartitionTask(
            tp.topic, tp.partition, model, scaler, metrics, pending, self.model_name,
            next_offset=next_offset, counters=fields.get("counters"),
        )

    # Checkpoints ------------------------------------------------------------------------------

    def _check_sends(self) -> None:
        """Raise if a send failed; forget the ones that completed."""
        sends = self._sends
        if len(sends) < 50_000:
            return
        self._sends = [f for f in sends if not f.is_done]
        for future in sends:
            if future.is_done and future.failed():
                raise WorkerError(f"a send failed: {future.exception!r}")

    def _flush(self) -> None:
        self._producer.flush()
        sends, self._sends = self._sends, []
        for future in sends:
            if future.failed():
                raise WorkerError(f"a send failed: {future.exception!r}")

    def _checkpoint(
        self, tasks: list[PartitionTask], sync_commit: bool, force_flush: bool = False
    ) -> None:
        """Flush outputs, write the tasks' checkpoints, flush them, commit their offsets."""
        from kafka.structs import OffsetAndMetadata

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
        payloads = {(t.topic, t.partition): t.to_checkpoint(self.config.group_id) for t in dirty}
        size = sum(len(payload) for payload in payloads.values())
        try:
            self._store.write(payloads)  # type: ignore[union-attr]
        except checkpoint_module.CheckpointError as error:
            raise WorkerError(str(error)) from error
        offsets = {self._tp(t): OffsetAndMetadata(t.next_offset, "", -1) for t in dirty}
        for task in dirty:
            task.checkpointed_offset = task.next_offset
            task.since_checkpoint = 0
        if sync_commit:
            try:
                self._consumer.commit(offsets)
            except Exception as error:  # e.g. a rebalance in progress: the checkpoint stands
                log.warning("offset commit failed (checkpoints are written): %s", error)
        else:
            self._consumer.commit_async(offsets)
        done = time.perf_counter()
        self.checkpoint_log.append(
            {
                "partitions": len(dirty),
                "bytes": size,
                "flush_outputs_ms": 1000 * (flushed - started),
                "checkpoint_commit_ms": 1000 * (done - flushed),
            }
        )
        log.debug("checkpointed %d partitions, %d bytes, in %.1f ms (+%.1f ms flushing outputs)",
                  len(dirty), size, 1000 * (done - flushed), 1000 * (flushed - started))

    # Metrics ----------------------------------------------------------------------------------

    def _emit_metrics(self, task: PartitionTask, event: str) -> dict:
        overall, recent = self.throughput.rates()
        lag = None
        if self._consumer is not None and task.next_offset is not None:
            highwater = self._consumer.highwater(self._tp(task))
            if highwater is not None:
                lag = max(0, highwater - task.next_offset)
        model = task.model
        record = {
            "type": "metrics",
            "event": event,
            "group": self.config.group_id,
            "worker": self.client_id,
            "topic": task.topic,
            "partition": task.partition,
            "next_offset": task.next_offset,
            "model": task.model_name,
            **task.counters(),
            **task.metrics.summary(),
            "labels": {**task.pending.counters(), "unjoinable": task.n_unjoinable},
            "model_counters": dict(getattr(model, "counters", {}) or {}),
            "records_per_s": round(overall, 1),
            "records_per_s_recent": round(recent, 1),
            "lag": lag,
            "time": time.time(),
        }
        task.last_metrics = record
        self._final_metrics[f"{task.topic}/{task.partition}"] = record
        topic = self.config.metrics_topic
        if topic and self._producer is not None:
            key = checkpoint_module.checkpoint_key(self.config.group_id, task.topic, task.partition)
            self._sends.append(
                self._producer.send(topic, json.dumps(record).encode(), key=key)
            )
        if self._on_metrics is not None:
            self._on_metrics(record)
        return record

    # The hot loop -----------------------------------------------------------------------------

    def _dead_letter(self, task: PartitionTask, record: typing.Any, reason: str) -> None:
        task.n_dead_letters += 1
        log.debug("dead letter %s/%d@%d: %s", record.topic, record.partition, record.offset, reason)
        topic = self.config.dead_letter_topic
        if not topic:
            return
        value = record.value if record.value is not None else b""
        headers = [
            ("streammargin.error.reason", reason.encode()),
            ("streammargin.error.topic", record.topic.encode()),
            ("streammargin.error.partition", str(record.partition).encode()),
            ("streammargin.error.offset", str(record.offset).encode()),
            ("streammargin.error.group", self.config.group_id.encode()),
        ]
        if record.value is None:
            headers.append(("streammargin.error.null_value", b"true"))
        self._sends.append(
            self._producer.send(topic, value=value, key=record.key, headers=headers)
        )

    def _process(self, task: PartitionTask, records: list) -> int:
        """Run the records of one partition through its task; returns how many were processed.

        The hot loop: per record one decode, one predict, one learn, a few counters and an
        f-string; the predictions go to the producer after the loop.
        """
        config = self.config
        decode = self.codec.decode
        stop_set = self._stop.is_set
        out: list[bytes] = []
        emit = out.append
        prefix = task._prefix
        model = task.model
        scaler = task.scaler
        # The label is predict_one's and the probability predict_proba_one's, as in River's
        # progressive validation: a model's decision rule need not be the argmax of its
        # probabilities (ours may pick the raw score's sign). The second call reuses the
        # feature encoding cached by the first.
        predict = model.predict_one
        predict_proba = model.predict_proba_one
        learn = model.learn_one if scaler is None else task.learn
        update_metrics = task.metrics.update
        pending = task.pending
        metrics_every = config.metrics_every
        next_offset = task.next_offset
        n_records = task.n_records
        n_predictions = task.n_predictions
        n_done = 0
        for record in records:
            offset = record.offset
            if next_offset is not None and offset < next_offset:
                continue  # already processed (stale fetch data after a seek)
            if stop_set():
                break
            try:
                event_id, x, y = decode(record.value)
                drift = False
                if x is None:
                    entry = pending.pop(event_id, offset, record.timestamp)
                    if entry is not None:
                        learn(entry[0], y)
                        drift = update_metrics(y, entry[3], entry[4], offset)
                else:
                    scaled = x if scaler is None else scaler.transform_one(x)
                    y_pred = predict(scaled)
                    p_true = predict_proba(scaled).get(True, 0.0)
                    if y is not None:
                        learn(x, y)
                        drift = update_metrics(y, y_pred, p_true, offset)
                    elif event_id is not None:
                        pending.add(event_id, x, offset, record.timestamp, y_pred, p_true)
                    else:
                        task.n_unjoinable += 1
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
                if drift:
                    task.next_offset = offset + 1
                    task.n_records, task.n_predictions = n_records + 1, n_predictions
                    self._emit_metrics(task, "drift")
            except DeadLetter as error:
                self._dead_letter(task, record, str(error))
            except ValueError as error:
                # The model refused the record (it is left untouched): a dead letter too.
                self._dead_letter(task, record, f"rejected by the model: {error}")
            next_offset = offset + 1
            n_done += 1
            n_records += 1
            if n_records % metrics_every == 0:
                task.next_offset = next_offset
                task.n_records, task.n_predictions = n_records, n_predictions
                self._emit_metrics(task, "periodic")
        task.next_offset = next_offset
        task.n_records, task.n_predictions = n_records, n_predictions
        task.since_checkpoint += n_done
        if out and config.predictions_topic:
            self._send_predictions(task, out)
        return n_done

    def _send_predictions(self, task: PartitionTask, values: list[bytes]) -> None:
        topic = self.config.predictions_topic
        send = self._producer.send
        remember = self._sends.append
        # Predictions of an input partition stay in order in one output partition.
        partition = task.partition % self._prediction_partitions
        per_message = self.config.predictions_per_message
        if per_message == 1:
            for value in values:
                remember(send(topic, value, partition=partition))
        else:
            # JSON Lines: N predictions per Kafka message, for consumers that can split them.
            for start in range(0, len(values), per_message):
                remember(send(topic, b"\n".join(values[start:start + per_message]),
                              partition=partition))
