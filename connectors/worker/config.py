"""The worker's configuration: `WorkerConfig` (the `streammargin kafka` options, one field each),
the checks that refuse a configuration before anything connects, and the settings of each Kafka
client that it gives (`client_settings`).

Every check here runs in `WorkerConfig.__post_init__`, so a bad option fails in one line before
the worker connects; `connectors.worker.worker` builds the clients from `client_settings`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing

from connectors.kafka.transport import TRANSPORTS
from connectors.serializers import OUTPUT_FORMATS
from connectors.serializers.mapping import FieldMapping, parse_paths
from connectors.serializers.schema_registry import DEFAULT_MAX_CACHE_BYTES
from connectors.state import checkpoint as checkpoint_module
from connectors.task.settings import TaskSettings
from connectors.worker.memory_budget import AUTO, ceiling, fetch_bytes
from connectors.worker.model_scope import (
    DEFAULT_MAX_EXCHANGE_CPU_SHARE,
    DEFAULT_MAX_MODEL_BYTES_SHARE,
    MODEL_SCOPES,
    resolved_exchange,
)

__all__ = ["WorkerConfig", "client_settings", "connection_settings", "group_timeouts",
           "BAD_CHECKPOINT_POLICIES", "UNDECODABLE_POLICIES", "PROCESSING_GUARANTEES",
           "TRANSACTION_TIMEOUT_MS", "TOPIC_SCOPE_FETCH_BYTES",
           "PARTITION_SCOPE_FETCH_TOTAL_BYTES"]

BAD_CHECKPOINT_POLICIES = ("fail", "reset")
UNDECODABLE_POLICIES = ("fail", "skip")
#: `--processing-guarantee`, Kafka Streams' and Quix Streams' name and values.
PROCESSING_GUARANTEES = ("at-least-once", "exactly-once")
# Exactly-once: a crashed worker's open transaction holds back read_committed readers of its
# output partitions (and the restore of its input partitions) until the broker aborts it, this
# long after it began. Kafka Streams' default for exactly-once too.
TRANSACTION_TIMEOUT_MS = 10_000


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
    # 1: one Kafka message per prediction, with the input record's key, timestamp and headers.
    # N > 1: one message {"predictions": [...]} per N predictions of a partition, without keys or
    # headers (several times the throughput: kafka-python's per-message cost dominates).
    predictions_per_message: int = 1
    model: str = "alma"
    params: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    # A binary model on a multiclass topic: streammargin.OneVsRestClassifier(model, max_classes).
    one_vs_rest: bool = False
    max_classes: int = 100
    # Input headers the predictions keep: "all", "none", or a list of header names.
    copy_headers: str | typing.Sequence[str] = "all"
    # A StandardScaler in front of the model (streammargin's: River's arithmetic, bounded memory;
    # its statistics are checkpointed too).
    scale: bool = False
    codec: str = "json"
    max_record_bytes: int = 1 << 20
    # Records as they come (connectors/serializers, docs/kafka.md "Topics as they are"): the input
    # format, where the label, id and features are, what strings become, the Schema Registry
    # (confluent-kafka's setting names), the outputs' format, and a topic of labels only.
    value_format: str = "json"
    label_field: str = "y"
    # A binary model's positive class on a topic of two labels other than true/false, 1/0.
    positive_label: str | None = None
    id_field: str = "id"
    id_from_key: bool = False
    features: typing.Sequence[str] = ("x.*",)
    exclude_features: typing.Sequence[str] = ()
    categorical: str = "onehot"
    hash_buckets: int = 1024
    schema_registry_url: str | None = None
    schema_registry_config: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    schema_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES
    output_format: str = "json"
    label_topic: str | None = None
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
    # Checkpoint, commit and return once caught up with every owned partition's log end for this
    # many seconds (None: run forever).
    idle_timeout: float | None = None
    # Stop (WorkerError) once no broker has answered for this many seconds (None: wait for them
    # however long it takes). connectors/worker/outage.py says what counts as an answer.
    max_outage: float | None = None
    rolling_window: int = 1000
    drift_detector: str = "ddm"
    drift_params: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    # Delayed labels: at most this many unlabelled events, of at most this many bytes in all,
    # wait; an event older than the limits (in records of its partition, or in seconds of Kafka
    # record timestamps) expires.
    label_store_size: int = 100_000
    label_store_bytes: int = 256 << 20
    # The ceiling of the whole process, bytes (None: no ceiling, each part at its own limits;
    # "auto": 1 GiB, or what one partition of the model needs if more): every bounded part
    # takes its share of it (connectors/worker/memory_budget.py).
    max_memory: int | str | None = AUTO
    label_max_age_records: int | None = 1_000_000
    label_max_age_seconds: float | None = None
    # A checkpoint that cannot be restored: "fail" (exit non-zero, nothing committed) or "reset"
    # (a fresh model from the group's committed offset, or auto_offset_reset).
    on_bad_checkpoint: str = "fail"
    # A record batch the client cannot decode: "fail" (exit non-zero, nothing committed) or
    # "skip" (one dead letter for the batch's offsets, then go on after it).
    on_undecodable: str = "fail"
    # "at-least-once": outputs flushed, then checkpoints written, then offsets committed; a crash
    # replays the records since the last checkpoint, whose outputs then appear twice.
    # "exactly-once": each commit interval (checkpoint_every / checkpoint_interval) is one Kafka
    # transaction of outputs, checkpoints and input offsets; read_committed consumers see each
    # output once. The producer's transactional_id is `<group_id>-<client id>` unless
    # --producer-config gives one: a stable --client-id fences a restarted worker's
    # predecessor at once.
    processing_guarantee: str = "at-least-once"
    # "partition": each input partition's task trains a model of its own. "topic": the tasks of
    # an input topic exchange their models through `model_topic` (compacted) and mix them once
    # a task has processed `mix_every` records since its last mix, so that the partitions learn
    # one model (connectors/worker/model_scope.py says how, and what a crash does).
    model_scope: str = "partition"
    model_topic: str = "streammargin.models"
    # How the workers' models become one: "mix" (asynchronous parameter mixing), "delta"
    # (asynchronous delta averaging, a binary ALMA only: every worker's corrections kept in
    # full), or "auto": delta for a binary ALMA that averages (its default), mix for the others
    # (`resolved_exchange`).
    model_exchange: str = "auto"
    # None: the exchange's default (`default_mix_every`).
    mix_every: int | None = None
    # At most this share of the input's bytes goes to the model topic (a record waits until the
    # input read allows it); None: no budget, an exchange every mix_every records. 5% keeps
    # ALMA's exchanges as they are (its records are under 1% of the input) and holds kernel
    # models' whole support sets back (10-54% without it) at no measured cost in accuracy: at
    # three workers their gain is the model a worker's partitions share, not the exchange
    # (benchmarks/model_scope_worker.py, docs/kafka.md).
    max_model_bytes_share: float | None = DEFAULT_MAX_MODEL_BYTES_SHARE
    # The exchanges' CPU stays within this share of the main thread's processing CPU, its waits
    # for records included (an exchange due by mix_every waits until it does); None: no
    # budget, an exchange every mix_every records whatever it costs
    # (connectors/worker/model_scope.py says why).
    max_exchange_cpu_share: float | None = DEFAULT_MAX_EXCHANGE_CPU_SHARE
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    # Big polls pay: measured 12.9k -> 14-17k records/s end to end going from 2000 to 5000.
    max_poll_records: int = 5_000
    auto_offset_reset: str = "earliest"
    client_id: str | None = None
    create_topics: bool = True
    # Load (or compile) the model's numba code in a thread while connecting and joining the
    # group, instead of at the first record.
    warm_up: bool = True
    # The Kafka client library (connectors.kafka.transport): "kafka-python" (pure Python, the
    # default) or "librdkafka" (confluent-kafka, the streammargin[librdkafka] extra).
    transport: str = "kafka-python"
    # Settings for every client (security: security_protocol, sasl_*, ssl_*), and per client;
    # `client_settings` says which client gets what (kafka-python's names; librdkafka's
    # transport translates them, and takes librdkafka properties, names with dots, as given).
    client_config: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    consumer_config: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    producer_config: dict[str, typing.Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.topics, str):
            self.topics = [self.topics]
        self.features = parse_paths(self.features)
        self.exclude_features = parse_paths(self.exclude_features)
        if not isinstance(self.copy_headers, str):
            self.copy_headers = tuple(self.copy_headers)
        self.topics = list(dict.fromkeys(self.topics))
        if not self.topics:
            raise ValueError("at least one input topic is needed")
        for name in ("checkpoint_every", "max_poll_records", "predictions_per_message",
                     "mix_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        minimum = checkpoint_module.MIN_CHUNK_BYTES
        if self.checkpoint_chunk_bytes < minimum:
            raise ValueError(f"checkpoint_chunk_bytes must be >= {minimum}, "
                             f"got {self.checkpoint_chunk_bytes!r}")
        for name in ("idle_timeout", "max_outage"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if isinstance(self.max_memory, str) and self.max_memory != AUTO:
            raise ValueError(f"max_memory must be bytes, auto or None, got {self.max_memory!r}")
        if isinstance(self.max_memory, int) and self.max_memory < 1:
            raise ValueError(f"max_memory must be >= 1 byte, got {self.max_memory!r}")
        if self.max_checkpoint_bytes < 1:
            raise ValueError(f"max_checkpoint_bytes must be >= 1, "
                             f"got {self.max_checkpoint_bytes!r}")
        outputs = [self.predictions_topic, self.metrics_topic, self.dead_letter_topic]
        if set(self.topics) & {self.checkpoint_topic, self.model_topic,
                               *[t for t in outputs if t]}:
            raise ValueError("an input topic cannot also be an output, checkpoint or model topic")
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(f"output_format must be one of {', '.join(OUTPUT_FORMATS)}, "
                             f"got {self.output_format!r}")
        if self.output_format == "avro" and not self.schema_registry_url:
            raise ValueError("--output-format avro registers the outputs' schemas: it needs "
                             "--schema-registry-url URL")
        if (self.schema_registry_url and self.value_format == "json"
                and self.output_format == "json"):
            raise ValueError("--schema-registry-url is for --value-format avro, protobuf or "
                             "json-schema, or --output-format avro (--value-format json reads "
                             "plain JSON)")
        if self.label_topic is not None:
            if len(self.topics) != 1:
                raise ValueError("--label-topic pairs with one --topic: the labels of its "
                                 "events, partition for partition")
            if self.label_topic in {*self.topics, self.checkpoint_topic, self.model_topic,
                                    *[t for t in outputs if t]}:
                raise ValueError("--label-topic must be a topic of its own (not the input, an "
                                 "output, the checkpoint or the model topic)")
            if self.codec != "json":
                raise ValueError(f"--label-topic needs the built-in codec: --codec "
                                 f"{self.codec} cannot read label records")
        for name in ("max_model_bytes_share", "max_exchange_cpu_share"):
            share = getattr(self, name)
            if share is not None and not share > 0:
                raise ValueError(f"{name} must be > 0, got {share!r}")
        if self.model_scope not in MODEL_SCOPES:
            raise ValueError(f"model_scope must be one of {MODEL_SCOPES}, "
                             f"got {self.model_scope!r}")
        if self.model_scope == "topic":
            if self.model_topic in (self.checkpoint_topic, *outputs):
                raise ValueError("the model topic cannot also be an output or checkpoint topic")
            if self.processing_guarantee == "exactly-once":
                # The model records would be part of each transaction, and a peer's
                # read_committed read of the model topic would wait on every open one.
                raise ValueError("model_scope topic works with processing_guarantee "
                                 "at-least-once only (not exactly-once yet)")
        if self.on_bad_checkpoint not in BAD_CHECKPOINT_POLICIES:
            raise ValueError(f"on_bad_checkpoint must be one of {BAD_CHECKPOINT_POLICIES}, "
                             f"got {self.on_bad_checkpoint!r}")
        if self.on_undecodable not in UNDECODABLE_POLICIES:
            raise ValueError(f"on_undecodable must be one of {UNDECODABLE_POLICIES}, "
                             f"got {self.on_undecodable!r}")
        if self.processing_guarantee not in PROCESSING_GUARANTEES:
            raise ValueError(f"processing_guarantee must be one of {PROCESSING_GUARANTEES}, "
                             f"got {self.processing_guarantee!r}")
        if self.auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(f"auto_offset_reset must be earliest or latest, "
                             f"got {self.auto_offset_reset!r}")
        _check_drift_detector(self.drift_detector, self.drift_params)
        _check_model_params(self.model, self.params)  # parameters the model refuses fail early
        # So do the label store, record limits, codec and one-vs-rest, and delta averaging for
        # a model it is not built for.
        resolved_exchange(self.model_exchange, self.task_settings())
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.label_topic is not None:
            _check_range_assignment(self.consumer_config, self.transport)
        settings = client_settings(self)  # and client settings that contradict each other
        if self.transport == "librdkafka":
            from connectors.kafka.librdkafka_transport import translate

            for role, kwargs in settings.items():  # or that librdkafka has no name for
                translate(kwargs, role)
        else:
            _check_kafka_python_settings(self.consumer_config, self.producer_config)

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly-once"

    def task_settings(self) -> TaskSettings:
        """What each partition task needs of this configuration."""
        return TaskSettings(
            group_id=self.group_id,
            model=self.model,
            params=dict(self.params),
            one_vs_rest=self.one_vs_rest,
            max_classes=self.max_classes,
            copy_headers=self.copy_headers,
            scale=self.scale,
            codec=self.codec,
            max_record_bytes=self.max_record_bytes,
            metrics_every=self.metrics_every,
            rolling_window=self.rolling_window,
            drift_detector=self.drift_detector,
            drift_params=dict(self.drift_params),
            label_store_size=self.label_store_size,
            label_store_bytes=self.label_store_bytes,
            label_max_age_records=self.label_max_age_records,
            label_max_age_seconds=self.label_max_age_seconds,
            value_format=self.value_format,
            mapping=FieldMapping(
                label_field=self.label_field, id_field=self.id_field,
                id_from_key=self.id_from_key, features=tuple(self.features),
                exclude_features=tuple(self.exclude_features), categorical=self.categorical,
                hash_buckets=self.hash_buckets, positive_label=self.positive_label),
            schema_registry_url=self.schema_registry_url,
            schema_registry_config=dict(self.schema_registry_config),
            schema_cache_bytes=self.schema_cache_bytes,
            label_topic=self.label_topic,
        )

    @property
    def uses_registry(self) -> bool:
        """Whether the worker reads or writes through a Schema Registry."""
        return self.value_format != "json" or self.output_format == "avro"

    def make_registry(self) -> typing.Any:
        """The worker's Schema Registry client (one per process), or None."""
        if not self.uses_registry:
            return None
        from connectors.serializers.schema_registry import SchemaRegistry

        return SchemaRegistry({**self.schema_registry_config, "url": self.schema_registry_url},
                              max_cache_bytes=self.schema_cache_bytes)


def _co_partitioning(config: WorkerConfig) -> dict[str, typing.Any]:
    """--label-topic: the range assignor alone, which gives a member the same partition numbers
    of the input and the label topic (both clients list it first by default; named, so that a
    group of mixed versions cannot settle on another)."""
    if config.label_topic is None:
        return {}
    if config.transport == "librdkafka":
        return {"partition.assignment.strategy": "range"}
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    return {"partition_assignment_strategy": (RangePartitionAssignor,)}


def _check_range_assignment(consumer: dict[str, typing.Any], transport: str) -> None:
    """--label-topic: a member must own the same partition numbers of both topics, which the
    range assignor gives topics of equal partition counts (Kafka Streams' co-partitioning rule).
    Another assignor asked for in --consumer-config is refused."""
    for name in ("partition_assignment_strategy", "partition.assignment.strategy"):
        if name not in consumer:
            continue
        given = consumer[name]
        names = [str(getattr(item, "name", item)).lower() for item in (
            given.split(",") if isinstance(given, str) else given)]
        if names != ["range"]:
            raise ValueError(f"--label-topic needs the range assignor (a member owns the same "
                             f"partition numbers of both topics): leave {name} out of "
                             "--consumer-config")


def _check_drift_detector(name: str, params: dict[str, typing.Any]) -> None:
    """Build the drift detector once: a refusal names the options that asked for it."""
    from connectors.observability.metrics import make_detector

    try:
        make_detector(name, params)
    except (ValueError, TypeError) as error:
        given = "".join(f" --drift-param {k}={v}" for k, v in params.items())
        raise ValueError(f"--drift-detector {name}{given}: {error}") from None


def _check_kafka_python_settings(consumer: dict[str, typing.Any],
                                 producer: dict[str, typing.Any]) -> None:
    """A --consumer-config or --producer-config name kafka-python does not know fails here,
    naming it. kafka-python raises it only in the client's constructor: the producer's as a bare
    ValueError (the worker's "unexpected error"), the consumer's after the producer has waited
    out its bootstrap (a misleading "cannot connect")."""
    import kafka
    from kafka import KafkaConsumer, KafkaProducer

    for option, given, client in (("--consumer-config", consumer, KafkaConsumer),
                                  ("--producer-config", producer, KafkaProducer)):
        unknown = sorted(set(given) - set(client.DEFAULT_CONFIG))
        if unknown:
            raise ValueError(
                f"{option} {unknown[0]}: kafka-python {kafka.__version__} has no such "
                f"{client.__name__} setting. Fix: give one of its settings (kafka-python's "
                f"{client.__name__} documentation), or a librdkafka property (a dotted name) "
                "with --transport librdkafka")


def _check_model_params(model: str, params: dict[str, typing.Any]) -> None:
    """Build the model once, so that a parameter it refuses (unknown, or a value its own
    validation rejects) fails before connecting, naming the model and its parameters."""
    import inspect

    from connectors.models import check_model, model_class

    try:
        check_model(model, params)
    except (ValueError, TypeError) as error:
        cls = model_class(model)
        text = str(error)
        if "it takes" not in text:
            accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
            text += f" ({cls.__name__} takes {', '.join(accepted)})"
        given = " ".join(f"--param {k}={v}" for k, v in params.items())
        raise ValueError(f"--model {model} {given}: {text}") from None


# Client settings ----------------------------------------------------------------------------------

# Settings all three kafka-python clients take but that are not about connecting (or are given per
# client by the worker itself).
_NOT_CONNECTION = frozenset({
    "bootstrap_servers", "client_id", "kafka_client", "selector", "metric_reporters",
    "metrics_num_samples", "metrics_sample_window_ms", "max_in_flight_requests_per_connection",
    "request_timeout_ms",
})


@functools.cache
def connection_settings() -> frozenset[str]:
    """Names of the connection and security settings: those every kafka-python client takes
    (consumer, producer, admin), such as `security_protocol`, `ssl_*`, `sasl_*`, `api_version`,
    `socket_options`, proxies and reconnect back-offs."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    shared = (set(KafkaAdminClient.DEFAULT_CONFIG) & set(KafkaConsumer.DEFAULT_CONFIG)
              & set(KafkaProducer.DEFAULT_CONFIG))
    return frozenset(shared - _NOT_CONNECTION)


def group_timeouts(consumer: dict[str, typing.Any]) -> tuple[float, float]:
    """(session timeout, heartbeat interval) in seconds, as the group consumer's settings
    (`client_settings(...)["consumer"]`, where the worker's options and --consumer-config are
    merged already) give them to the client: a librdkafka property wins over the kafka-python
    name, as `translate` applies it after.

    >>> config = WorkerConfig(topics=["t"], transport="librdkafka",
    ...                       consumer_config={"session.timeout.ms": 45000})
    >>> group_timeouts(client_settings(config)["consumer"])
    (45.0, 3.0)
    """
    session = consumer.get("session.timeout.ms", consumer["session_timeout_ms"])
    heartbeat = consumer.get("heartbeat.interval.ms", consumer["heartbeat_interval_ms"])
    return int(session) / 1000, int(heartbeat) / 1000


# --model-scope topic: the partitions' model is one, so it must learn their records in about the
# order they were written. A fetch of this much a partition, every partition's stretch taken by
# one poll (Worker._poll_records) and interleaved by timestamp (model_scope.in_time_order):
# 8 partitions of RBF drift as a backlog (8,000 records, one worker, the budget SVM) gave 0.902
# on kafka-python and 0.903 on librdkafka, one model 0.904, against 0.882 with 64 KiB fetches and
# polls of 500 records, and 0.749 in partition scope (tests/test_model_scope.py). The size trades
# speed for memory, as a poll holds every partition's stretch: one worker on 12 partitions (ALMA,
# 120,000 records, 2 rounds) ran at 35,000 records/s with a peak RSS of 84 MiB at 128 KiB, 41,000
# and 100 MiB at 256 KiB, 45,000 and 183 MiB at 1 MiB; partition scope (4 MiB fetches) 42,000
# and 191 MiB. At 64 KiB each fetch's round trip was waited out per 3,000 records (0.74x). (A
# larger record still comes: a fetch returns at least one batch, KIP-74.)
TOPIC_SCOPE_FETCH_BYTES = 256 << 10

# Partition scope on kafka-python: the most one fetch response may hold in all partitions
# (fetch_max_bytes; a record larger than this still comes, KIP-74). Each partition may take 4 MiB,
# and kafka-python holds a fetch's records until they are polled, so a worker's memory grew with
# its partitions: at 12 partitions (120,000 records, ALMA, 3 rounds taking turns) 64 MiB peaked
# at 187-203 MiB of RSS, 8 MiB at 112-132 MiB, at 0.96x the records/s (0.95x-0.98x); at 2
# partitions 8 MiB is what 4 MiB each asks. librdkafka is left at 64 MiB: its memory is its
# prefetch queue (queued.min.messages), and 8 MiB cost it 0.79x-0.94x for 5 MiB less.
PARTITION_SCOPE_FETCH_TOTAL_BYTES = 8 << 20

def _fetch_max_bytes(config: WorkerConfig) -> int:
    """What one fetch response may hold: PARTITION_SCOPE_FETCH_TOTAL_BYTES on kafka-python in
    partition scope; 64 MiB otherwise (topic scope's 256 KiB a partition bounds it, and
    librdkafka's prefetch queue); under --max-memory, within the fetch buffers' share."""
    if config.model_scope == "partition" and config.transport == "kafka-python":
        default = PARTITION_SCOPE_FETCH_TOTAL_BYTES
    else:
        default = 64 << 20
    if config.max_memory is not None:
        default = min(default, fetch_bytes(config.max_memory, config.transport))
    return max(default, config.max_record_bytes)


def _prefetch_queue(config: WorkerConfig) -> dict[str, int]:
    """librdkafka's prefetch queue (queued.max.messages.kbytes, one queue for all the partitions
    of a high-level consumer) within --max-memory's fetch share."""
    if config.transport != "librdkafka" or ceiling(config.max_memory) is None:
        return {}
    return {"queued.max.messages.kbytes": fetch_bytes(config.max_memory, "librdkafka") >> 10}


def client_settings(config: WorkerConfig, client_id: str = "streammargin") -> dict[str, dict]:
    """The keyword arguments of each Kafka client of a worker.

    - ``producer`` (outputs and checkpoints): the worker's defaults, then `client_config`, then
      `producer_config`;
    - ``consumer`` (the group member): the worker's defaults, then `client_config`, then
      `consumer_config`;
    - ``admin`` (creates missing topics): `client_config`, then the connection and security
      settings (`connection_settings()`) of `consumer_config` and `producer_config`; a setting
      given in both must have the same value (`ValueError` otherwise);
    - ``checkpoint_reader`` (a consumer without a group, reading checkpoints back):
      `client_config`, then the connection and security settings of `consumer_config`, not its
      group or fetch settings.

    >>> config = WorkerConfig(topics=["t"], consumer_config={"security_protocol": "SSL",
    ...                       "fetch_min_bytes": 10}, producer_config={"linger_ms": 5})
    >>> settings = client_settings(config)
    >>> settings["admin"]["security_protocol"], "fetch_min_bytes" in settings["checkpoint_reader"]
    ('SSL', False)
    """
    # (kafka-python's classes name the connection settings: imported only when some are given,
    # so that a worker on librdkafka starts without importing kafka-python, ~0.15 s)
    given = bool(config.consumer_config or config.producer_config)
    connection = connection_settings() if given else frozenset()
    base = {"bootstrap_servers": config.bootstrap_servers, "client_id": client_id,
            **config.client_config}
    from_consumer = {k: v for k, v in config.consumer_config.items() if k in connection}
    from_producer = {k: v for k, v in config.producer_config.items() if k in connection}
    for key in from_consumer.keys() & from_producer.keys():
        if from_consumer[key] != from_producer[key]:
            raise ValueError(
                f"--consumer-config and --producer-config give different values of {key}: the "
                "admin client takes the connection settings of both, so give it once (for every "
                "client) or the same in both"
            )
    transactions: dict[str, typing.Any] = {}
    reading: dict[str, typing.Any] = {}
    if config.exactly_once:
        transactions = {"transactional_id": f"{config.group_id}-{client_id}",
                        "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS}
        # Upstream transactions' aborted records are not inputs, and the group's committed
        # offsets are read only once no transaction holds them (KIP-447's require_stable).
        reading = {"isolation_level": "read_committed"}
        for given in (config.client_config, config.consumer_config):
            level = given.get("isolation_level", "read_committed")
            if level != "read_committed":
                raise ValueError(f"isolation_level={level} contradicts --processing-guarantee "
                                 "exactly-once, which reads read_committed: leave it out")
    else:
        if "transactional_id" in {**config.client_config, **config.producer_config}:
            raise ValueError("a transactional_id needs --processing-guarantee exactly-once (the "
                             "worker opens and commits the transactions itself)")
        # At-least-once needs no idempotent producer (a retry's duplicate is one more replayed
        # output), and kafka-python 3.0.12's, its default, takes the broker's MESSAGE_TOO_LARGE
        # as fatal (TransactionManager.classify_batch_error) and fails every later send: a dead
        # letter above the topic's max.message.bytes then stopped the worker instead of going
        # out without its value. librdkafka's producer is not idempotent by default either.
        # Without idempotence, one request in flight per broker keeps a partition's outputs in
        # their input order across retries: with five, a broker killed under two in-flight
        # batches of predictions took their retries in the other order (input offsets 360-459
        # written before 260-359; tests/test_apache_kafka.py's broker-kill test, 1 run in 35,
        # read it as lost predictions). kafka-python then also mutes a partition while its
        # batch is in flight (guarantee_message_order).
        transactions = {"enable_idempotence": False, "max_in_flight_requests_per_connection": 1}
    producer = {
        **base,
        "linger_ms": 20,
        "batch_size": 1 << 20,
        # Checkpoints of big models and dead letters of oversized records are large.
        "max_request_size": max(64 << 20, 2 * config.max_record_bytes),
        "metrics_enabled": False,
        **transactions,
        **config.client_config,
        **config.producer_config,
    }
    consumer = {
        **base,
        "group_id": config.group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": config.auto_offset_reset,
        "session_timeout_ms": config.session_timeout_ms,
        "heartbeat_interval_ms": config.heartbeat_interval_ms,
        "max_poll_records": config.max_poll_records,
        "fetch_max_wait_ms": 100,
        # Room for a whole poll of one partition in one fetch (the default is 1 MiB). With
        # --model-scope topic, see TOPIC_SCOPE_FETCH_BYTES.
        "max_partition_fetch_bytes": min(
            TOPIC_SCOPE_FETCH_BYTES if config.model_scope == "topic"
            else max(4 << 20, config.max_record_bytes), _fetch_max_bytes(config)),
        # What one fetch response may hold in all (PARTITION_SCOPE_FETCH_TOTAL_BYTES, on
        # kafka-python). In topic scope a poll takes every partition's stretch, and 256 KiB a
        # partition bounds it.
        "fetch_max_bytes": _fetch_max_bytes(config),
        **_prefetch_queue(config),
        "metrics_enabled": False,
        **reading,
        **_co_partitioning(config),
        **config.client_config,
        **config.consumer_config,
    }
    return {
        "producer": producer,
        "consumer": consumer,
        "admin": {**base, **from_consumer, **from_producer},
        "checkpoint_reader": {**base, "client_id": f"{client_id}-checkpoints", **reading,
                              **from_consumer},
    }
