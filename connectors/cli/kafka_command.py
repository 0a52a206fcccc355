"""`streammargin kafka`: run the Kafka worker as a process (a thin layer over
`connectors.worker.worker`).

Every option can also come from an environment variable `STREAMMARGIN_<OPTION>` (upper case,
dashes as underscores): `STREAMMARGIN_BOOTSTRAP_SERVERS=broker:9092`, `STREAMMARGIN_TOPIC=a,b`
(repeatable options take a comma-separated list), `STREAMMARGIN_PARAM=alpha=0.8,p=3`,
`STREAMMARGIN_SCALE=true`. The command line wins over the environment.

SIGTERM and SIGINT stop the worker gracefully: it finishes the record in hand, flushes its
outputs, checkpoints, commits and leaves the group; the exit code is then 0 (also after
`--idle-timeout`). On an error it exits 1 without committing, after one log line naming the
cause and the fix (the traceback only with `--log-level DEBUG`); 2 for bad options, also in one
line. kafka-python's own log lines are held back until the worker is connected (its bootstrap
retries would bury the one line that says what is wrong), unless `--log-level DEBUG`.

`--http-port N` serves `/metrics` (Prometheus), `/healthz` and `/readyz`
(`connectors.observability.observability.EndpointServer`); `--log-format json` writes one JSON
object per log line. `--profile-stages FILE` writes where the main thread spent its time, by stage,
at exit (`connectors.worker.profiling`). The worker options map onto `WorkerConfig`; `--http-*`,
`--liveness-timeout`, `--profile-stages` and `--log-*` are the process's own.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import re
import signal
import sys
import typing

ENV_PREFIX = "STREAMMARGIN_"

# (flag, kind, default, help); kind: str, int, float, bool, list (repeatable), params (key=value)
OPTIONS: list[tuple[str, str, typing.Any, str]] = [
    ("--bootstrap-servers", "str", "localhost:9092", "Kafka brokers, host:port[,host:port]"),
    ("--topic", "list", [], "input topic (repeatable)"),
    ("--group-id", "str", "streammargin", "consumer group; also part of the checkpoint keys"),
    ("--predictions-topic", "str", "streammargin.predictions", "one record per prediction"),
    ("--predictions-per-message", "int", 1,
     "1: one Kafka message per prediction, with the input's key, timestamp and headers. N > 1: "
     "one message {\"predictions\": [...]} per N predictions (faster; no keys or headers: a "
     "consumer must unnest the array, e.g. ksqlDB EXPLODE, Flink UNNEST)"),
    ("--metrics-topic", "str", "streammargin.metrics", "metrics records ('' to disable)"),
    ("--dead-letter-topic", "str", "streammargin.dead-letters",
     "rejected records with the reason in headers ('' to disable)"),
    ("--checkpoint-topic", "str", "streammargin.checkpoints", "compacted topic of checkpoints"),
    ("--model", "str", "alma", "model name (see --list-models)"),
    ("--param", "params", {}, "model parameter key=value (repeatable)"),
    ("--one-vs-rest", "bool", False,
     "serve a binary model on a multiclass topic: one model per class "
     "(streammargin.OneVsRestClassifier); natively multiclass models (convexpolytope) need not"),
    ("--max-classes", "int", 100,
     "with --one-vs-rest: at most N classes; a record with a further label is a dead letter"),
    ("--copy-headers", "str", "all",
     "input headers the predictions keep: all, none, or NAME[,NAME...]"),
    ("--scale", "bool", False,
     "put a StandardScaler in front of the model (River's arithmetic, bounded memory)"),
    ("--codec", "str", "json", "input codec: json or package.module:Class"),
    ("--max-record-bytes", "int", 1 << 20, "larger records are dead letters"),
    ("--value-format", "str", "json",
     "input records: json (JSON objects of any shape), or avro, protobuf or json-schema in "
     "Confluent's wire format, their schemas from --schema-registry-url"),
    ("--label-field", "str", "y", "PATH of the label (dotted for nesting: outcome.label)"),
    ("--positive-label", "str", None,
     "a binary model on a topic of two labels other than true/false, 1/0: the label VALUE is "
     "the positive class (true), every other label the negative one (scikit-learn's pos_label)"),
    ("--id-field", "str", "id", "PATH of the id that joins a delayed label to its event"),
    ("--id-from-key", "bool", False, "the record key (UTF-8 text) is the id, not --id-field"),
    ("--features", "str", "x.*",
     "PATH[,PATH...] of the features: '*' every field but the id and label, P.* the fields of "
     "the object P (named without P.: the default reads {\"id\", \"x\": {...}, \"y\"}), P "
     "the field P; nested objects are flattened with dotted names"),
    ("--exclude-features", "str", "", "PATH[,PATH...] left out of --features"),
    ("--categorical", "str", "onehot",
     "strings and enums: onehot (a feature field=value of 1), hash (field#bucket, "
     "--hash-buckets per field) or drop"),
    ("--hash-buckets", "int", 1024, "with --categorical hash: buckets per field"),
    ("--label-topic", "str", None,
     "a topic of label records (--id-field and --label-field), co-partitioned with --topic: "
     "the label of an event on partition p is on partition p; merged by record timestamp"),
    ("--schema-registry-url", "str", None,
     "Schema Registry of --value-format avro|protobuf|json-schema and --output-format avro "
     "(Confluent's REST API: Confluent, Apicurio's /apis/ccompat/v7, Karapace, Redpanda)"),
    ("--schema-registry-config", "params", {},
     "Schema Registry client setting KEY=VALUE, confluent-kafka's names (repeatable): "
     "basic.auth.user.info=USER:PASSWORD, bearer.auth.token, ssl.ca.location, "
     "ssl.certificate.location, ssl.key.location, timeout, cache.capacity"),
    ("--schema-cache-bytes", "int", 32 << 20,
     "schema text the Schema Registry cache keeps, at most (least recently used out first)"),
    ("--output-format", "str", "json",
     "predictions and metrics: json, or avro (Confluent's wire format, schemas registered "
     "under <topic>-value)"),
    ("--metrics-every", "int", 10_000, "metrics every N records of a partition"),
    ("--metrics-interval", "float", None, "also every SECONDS"),
    ("--checkpoint-every", "int", 10_000, "checkpoint every N records of a partition"),
    ("--checkpoint-interval", "float", 60.0, "also every SECONDS"),
    ("--checkpoint-chunk-bytes", "int", 512 << 10,
     "larger checkpoints are split into records of N bytes + a manifest (below the broker's"
     " message.max.bytes)"),
    ("--max-checkpoint-bytes", "int", 1 << 30, "larger checkpoints are neither written nor read"),
    ("--idle-timeout", "float", None,
     "checkpoint, commit and exit 0 after SECONDS caught up with the log end of every owned "
     "partition, as confirmed by the broker; an outage never counts (default: run forever)"),
    ("--max-outage", "float", None,
     "exit 1 once no broker has answered for SECONDS, with one line naming the outage "
     "(default: wait for the brokers however long it takes)"),
    ("--rolling-window", "int", 1000, "window of the rolling accuracy"),
    ("--drift-detector", "str", "ddm", "River drift detector on the error stream"),
    ("--drift-param", "params", {}, "drift detector parameter key=value (repeatable)"),
    ("--label-store-size", "int", 100_000, "max unlabelled events waiting for their label"),
    ("--max-memory", "size", "auto",
     "the ceiling of the whole process (512MiB, 2GiB; auto: 1GiB, or what one partition of the "
     "model needs if more; none: no ceiling): every bounded part takes its share, the pending "
     "stores what is left (docs/operations.md, \"Sizing a pod\")"),
    ("--label-store-bytes", "int", 256 << 20,
     "max bytes of unlabelled events waiting (record bytes + per-feature overhead); the oldest "
     "are evicted beyond it"),
    ("--label-max-age-records", "int", 1_000_000, "events older than N records expire"),
    ("--label-max-age-seconds", "float", None, "events older than SECONDS (record time) expire"),
    ("--on-bad-checkpoint", "str", "fail",
     "a checkpoint that cannot be restored: fail (exit 1, nothing committed) or reset (fresh "
     "model from the group's committed offset, or --auto-offset-reset)"),
    ("--on-undecodable", "str", "fail",
     "a record batch the client cannot decode (missing codec library, corrupt data): fail (exit "
     "1, nothing committed) or skip (one dead letter for its offsets, then go on after it)"),
    ("--processing-guarantee", "str", "at-least-once",
     "at-least-once (a crash replays the records since the last checkpoint: their outputs twice)"
     " or exactly-once (each commit interval's outputs, checkpoints and input offsets are one "
     "Kafka transaction: read_committed consumers see each output once; outputs appear at each "
     "commit, see --checkpoint-every/--checkpoint-interval)"),
    ("--model-scope", "str", "partition",
     "partition (each input partition trains its own model) or topic (a worker's partitions of "
     "a topic share one model, and the workers exchange theirs through --model-topic and mix "
     "them every --mix-every records: one model learns from the whole topic; at-least-once "
     "only)"),
    ("--model-topic", "str", "streammargin.models",
     "with --model-scope topic: the compacted topic of the partitions' models"),
    ("--model-exchange", "str", "auto",
     "with --model-scope topic: how the workers' models become one: mix (parameter mixing), "
     "delta (delta averaging: every worker's corrections kept in full; a binary alma only) or "
     "auto (delta for a binary alma that averages, its default; mix for the other models)"),
    ("--mix-every", "int", None,
     "with --model-scope topic: records a worker processes (of a topic) between two exchanges "
     "(default: 200 with delta, 2000 with mix)"),
    ("--max-model-bytes-share", "float", 0.05,
     "with --model-scope topic: at most this share of the input's bytes goes to the model "
     "topic; a model record waits until the input read allows it ('none': no budget)"),
    ("--max-exchange-cpu-share", "float", 0.1,
     "with --model-scope topic: the exchanges' CPU stays within this share of the processing's "
     "(waits for records count as processing); an exchange waits until it does, so a backlog "
     "of cheap records gets a longer period ('none': an exchange every --mix-every records "
     "whatever it costs)"),
    ("--transport", "str", "kafka-python",
     "Kafka client library: kafka-python (pure Python) or librdkafka (confluent-kafka, the "
     "streammargin[librdkafka] extra; faster, takes kafka-python setting names and librdkafka "
     "properties)"),
    ("--session-timeout-ms", "int", 10_000, "consumer group session timeout"),
    ("--heartbeat-interval-ms", "int", 3_000, "consumer group heartbeat interval"),
    ("--max-poll-records", "int", 5_000,
     "records per poll (with --model-scope topic, per partition)"),
    ("--auto-offset-reset", "str", "earliest", "where a partition without checkpoint starts"),
    ("--client-id", "str", None, "client id (default: streammargin-<host>-<pid>)"),
    ("--create-topics", "bool", True, "create missing output and checkpoint topics"),
    ("--warm-up", "bool", True,
     "load (or compile) the model's numba code while joining the group, not at the first "
     "record"),
    ("--security-protocol", "str", None, "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    ("--sasl-mechanism", "str", None, "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, GSSAPI"),
    ("--sasl-plain-username", "str", None, "SASL username"),
    ("--sasl-plain-password", "str", None, "SASL password (prefer the environment variable)"),
    ("--ssl-cafile", "str", None, "CA certificate file"),
    ("--ssl-certfile", "str", None, "client certificate file"),
    ("--ssl-keyfile", "str", None, "client key file"),
    ("--ssl-password", "str", None, "password of the client key"),
    ("--ssl-check-hostname", "bool", None, "check the broker's host name in its certificate"),
    ("--consumer-config", "params", {},
     "extra KafkaConsumer setting key=value (repeatable); its connection and security settings "
     "also reach the admin client and the checkpoint reader"),
    ("--producer-config", "params", {},
     "extra KafkaProducer setting key=value (repeatable); its connection and security settings "
     "also reach the admin client"),
    ("--http-port", "int", None,
     "serve /metrics (Prometheus), /healthz and /readyz on this port (0: a free one, logged)"),
    ("--http-host", "str", "0.0.0.0",
     "address of the HTTP endpoints: 0.0.0.0 (every interface: probes and scrapes from other "
     "hosts), :: (IPv6 too) or 127.0.0.1 (this host only)"),
    ("--liveness-timeout", "float", 60.0,
     "/healthz answers 503 once the main loop has not turned for SECONDS (keep it above the "
     "longest restore or checkpoint)"),
    ("--profile-stages", "str", None,
     "sample where the main thread spends its time (poll, decode, scale, model, encode, "
     "produce, checkpoint, ...) and write it as JSON to FILE at exit "
     "(connectors.worker.profiling)"),
    ("--log-level", "str", "INFO", "DEBUG, INFO, WARNING or ERROR"),
    ("--log-format", "str", "text", "text, or json: one JSON object per line (log shippers)"),
]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SECURITY = [
    "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
    "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname",
]


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def _bool(text: str) -> bool:
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def _optional_float(text: str) -> float | None:
    """A float, or None for "none", "off" or "" (e.g. `--checkpoint-interval none`)."""
    if text.strip().lower() in ("", "none", "off", "null"):
        return None
    return float(text)


def _optional_size(text: str) -> int | str | None:
    """Bytes of a size (`512MiB`, `2GiB`), "auto", or None for "none", "off" or ""."""
    from connectors.worker.memory_budget import AUTO, parse_size

    if text.strip().lower() in ("", "none", "off", "null"):
        return None
    if text.strip().lower() == AUTO:
        return AUTO
    return parse_size(text)


# argparse names the converter in its message: "invalid number (or none) value: 'abc'".
_optional_float.__name__ = "number (or none)"
_optional_size.__name__ = "size (or auto, none)"
_bool.__name__ = "boolean"


def _short_error(parser: argparse.ArgumentParser, message: str) -> typing.NoReturn:
    """argparse's error without the usage: with this many options the usage is 40 lines that
    bury the one that says what is wrong."""
    parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")


def _env_default(flag: str, kind: str, default: typing.Any) -> typing.Any:
    from connectors.models import parse_params

    raw = os.environ.get(env_name(flag))
    if raw is None:
        return default
    try:
        if kind == "list":
            return [item.strip() for item in raw.split(",") if item.strip()]
        if kind == "params":
            return parse_params(item for item in raw.split(",") if item.strip())
        if kind == "bool":
            return _bool(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return _optional_float(raw)
        if kind == "size":
            return _optional_size(raw)
    except (ValueError, argparse.ArgumentTypeError) as error:
        raise SystemExit(f"streammargin kafka: bad {env_name(flag)}={raw!r}: {error}") from None
    return raw


class _ParamAction(argparse.Action):
    """key=value options accumulated into a dict (on top of the environment's)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from connectors.models import parse_params

        try:
            params = parse_params([values])
        except ValueError as error:
            parser.error(str(error))
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), **params})


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "kafka",
        help="consume topics, predict, learn, report metrics and drift, checkpoint to Kafka",
        description=__doc__.split("\n\n")[0],
        epilog="Every option also reads the environment variable STREAMMARGIN_<OPTION>.",
    )
    add_options(parser, OPTIONS)
    parser.add_argument("--list-models", action="store_true",
                        help="print the model names and exit")
    parser.error = lambda message: _short_error(parser, message)  # type: ignore[method-assign]
    parser.set_defaults(func=run)


def add_options(parser: argparse.ArgumentParser,
                options: typing.Sequence[tuple[str, str, typing.Any, str]]) -> None:
    """Add `options` (OPTIONS' form) to `parser`, each also read from its `STREAMMARGIN_*`
    variable (`streammargin serve` takes the worker's options so)."""
    for flag, kind, default, help_text in options:
        default = _env_default(flag, kind, default)
        shown = f" [env {env_name(flag)}]"
        if kind == "list":
            # The environment's list is replaced, not extended, by command-line items.
            parser.add_argument(flag, action="append", default=None, help=help_text + shown)
            parser.set_defaults(**{flag[2:].replace("-", "_") + "_env": default})
        elif kind == "params":
            parser.add_argument(flag, action=_ParamAction, default=dict(default),
                                metavar="KEY=VALUE", help=help_text + shown)
        elif kind == "bool":
            parser.add_argument(flag, type=_bool, nargs="?", const=True, default=default,
                                help=help_text + shown)
        else:
            convert = {"str": str, "int": int, "float": _optional_float,
                       "size": _optional_size}[kind]
            parser.add_argument(flag, type=convert, default=default, help=help_text + shown)


def _copy_headers(text: str) -> str | tuple[str, ...]:
    """`--copy-headers`: "all", "none", or comma-separated header names."""
    word = text.strip()
    if word.lower() in ("all", "none"):
        return word.lower()
    names = tuple(name.strip() for name in word.split(",") if name.strip())
    if not names:
        raise ValueError("--copy-headers takes all, none or header names (NAME[,NAME...])")
    return names


def config_from_args(args: argparse.Namespace) -> typing.Any:
    """The `WorkerConfig` of parsed arguments."""
    from connectors.worker.config import WorkerConfig

    topics = args.topic if args.topic is not None else args.topic_env
    client_config = {
        name: getattr(args, name) for name in SECURITY if getattr(args, name) is not None
    }
    return WorkerConfig(
        topics=topics,
        bootstrap_servers=args.bootstrap_servers,
        group_id=args.group_id,
        predictions_topic=args.predictions_topic or None,
        predictions_per_message=args.predictions_per_message,
        metrics_topic=args.metrics_topic or None,
        dead_letter_topic=args.dead_letter_topic or None,
        checkpoint_topic=args.checkpoint_topic,
        model=args.model,
        params=args.param,
        one_vs_rest=args.one_vs_rest,
        max_classes=args.max_classes,
        copy_headers=_copy_headers(args.copy_headers),
        scale=args.scale,
        codec=args.codec,
        max_record_bytes=args.max_record_bytes,
        value_format=args.value_format,
        label_field=args.label_field,
        positive_label=args.positive_label or None,
        id_field=args.id_field,
        id_from_key=args.id_from_key,
        features=args.features,
        exclude_features=args.exclude_features,
        categorical=args.categorical,
        hash_buckets=args.hash_buckets,
        label_topic=args.label_topic or None,
        schema_registry_url=args.schema_registry_url or None,
        schema_registry_config={k: str(v) for k, v in args.schema_registry_config.items()},
        schema_cache_bytes=args.schema_cache_bytes,
        output_format=args.output_format,
        metrics_every=args.metrics_every,
        metrics_interval=args.metrics_interval,
        checkpoint_every=args.checkpoint_every,
        checkpoint_interval=args.checkpoint_interval,
        checkpoint_chunk_bytes=args.checkpoint_chunk_bytes,
        max_checkpoint_bytes=args.max_checkpoint_bytes,
        idle_timeout=args.idle_timeout,
        max_outage=args.max_outage,
        rolling_window=args.rolling_window,
        drift_detector=args.drift_detector,
        drift_params=args.drift_param,
        label_store_size=args.label_store_size,
        label_store_bytes=args.label_store_bytes,
        max_memory=args.max_memory,
        label_max_age_records=args.label_max_age_records,
        label_max_age_seconds=args.label_max_age_seconds,
        on_bad_checkpoint=args.on_bad_checkpoint,
        on_undecodable=args.on_undecodable,
        processing_guarantee=args.processing_guarantee,
        model_scope=args.model_scope,
        model_topic=args.model_topic,
        model_exchange=args.model_exchange,
        mix_every=args.mix_every,
        max_model_bytes_share=args.max_model_bytes_share,
        max_exchange_cpu_share=args.max_exchange_cpu_share,
        transport=args.transport,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_poll_records=args.max_poll_records,
        auto_offset_reset=args.auto_offset_reset,
        client_id=args.client_id,
        create_topics=args.create_topics,
        warm_up=args.warm_up,
        client_config=client_config,
        consumer_config=args.consumer_config,
        producer_config=args.producer_config,
    )


def _write_profile(path: str, profiler: typing.Any, worker: typing.Any) -> None:
    """`--profile-stages FILE`: the profiler's report, the worker's start-up stamps and the
    records it processed, as JSON."""
    report = profiler.report()
    report.update(first_poll_at=worker.first_poll_at, rss_at_first_poll=worker.first_poll_rss,
                  records=worker.throughput.count)
    try:
        with open(path, "w") as handle:
            json.dump(report, handle, indent=1)
    except OSError as error:
        logging.getLogger("streammargin.kafka").error(
            "cannot write --profile-stages %s: %s. Fix: give a writable path", path, error)


def _log_metrics(record: dict) -> None:
    accuracy = record["accuracy"]
    logging.getLogger("streammargin.kafka").info(
        "%s %s/%d: %d records, accuracy %s, rolling %s, drift detections %d, lag %s, %.0f rec/s",
        record["event"], record["topic"], record["partition"], record["records"],
        "-" if accuracy is None else f"{accuracy:.4f}",
        "-" if record["rolling_accuracy"] is None else f"{record['rolling_accuracy']:.4f}",
        record["drift"]["detections"], record["lag"], record["records_per_s"],
        extra={"event": record["event"], "topic": record["topic"],
               "partition": record["partition"], "offset": record.get("next_offset"),
               "records": record["records"], "accuracy": accuracy,
               "rolling_accuracy": record["rolling_accuracy"],
               "drift_detections": record["drift"]["detections"], "lag": record["lag"]},
    )


def _failure_message(error: BaseException) -> str:
    """One line: what went wrong and what to do."""
    return " ".join(_failure_text(error).split())


def _failure_text(error: BaseException) -> str:
    from connectors.cli import errors
    from connectors.task.output_records import TaskFailure
    from connectors.worker.worker import WorkerError

    if isinstance(error, (WorkerError, TaskFailure)):
        return str(error)  # these name the cause and the fix themselves
    # What every command can meet (Kafka errors, missing packages, files): the same words as
    # `streammargin evaluate` and `demo` use, as one log line.
    described = errors.describe(error)
    fix = f". Fix: {described.fix}" if described.fix else ""
    return f"{described.cause}{fix} (nothing was committed)"


def _failure_fields(error: BaseException) -> dict[str, typing.Any]:
    """The record coordinates an error carries (a `TaskFailure`, an `UndecodableBatch`, or a
    `WorkerError` caused by one), as structured log fields."""
    fields: dict[str, typing.Any] = {"error_class": type(error).__name__}
    for source in (error, error.__cause__):
        if source is None:
            continue
        for name, field in (("topic", "topic"), ("partition", "partition"), ("offset", "offset"),
                            ("first_offset", "offset")):
            value = getattr(source, name, None)
            if field not in fields and isinstance(value, (str, int)) and value is not True:
                fields[field] = value
    return fields


# WorkerConfig fields named in error messages -> the options that set them.
_FIELD_FLAGS = {flag[2:].replace("-", "_"): flag for flag, *_ in OPTIONS}
_FIELD_FLAGS.update({"topics": "--topic", "params": "--param", "drift_params": "--drift-param"})
# Only snake_case names: "model" or "scale" are words of plain sentences too.
_FIELD = re.compile(r"(?<![-\w])(" + "|".join(
    sorted((name for name in _FIELD_FLAGS if "_" in name), key=len, reverse=True)) + r")\b(?!=)")


def _as_flags(message: str) -> str:
    """A `WorkerConfig` message in the command's words: "checkpoint_every must be >= 1" ->
    "--checkpoint-every must be >= 1" (a setting written key=value is left as it is)."""
    return _FIELD.sub(lambda found: _FIELD_FLAGS[found.group(1)], message)


class _LogSetup(contextlib.AbstractContextManager):
    """The command's log handler on stderr (text or JSON lines), removed again on exit (the
    command also runs in-process, in tests and other programs)."""

    def __init__(self, level: int, log_format: str, connected: typing.Callable[[], bool],
                 held_back: typing.Callable[[], None] | None = None):
        from connectors.observability.observability import ClientLogFilter, JsonLogFormatter

        self.level = level
        self.handler = logging.StreamHandler(sys.stderr)
        self.handler.setFormatter(
            JsonLogFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
        self.handler.addFilter(ClientLogFilter(connected, debug=level <= logging.DEBUG,
                                               held_back=held_back))

    def __enter__(self) -> _LogSetup:
        root, client = logging.getLogger(), logging.getLogger("kafka")
        self._saved = root.level, client.level
        root.addHandler(self.handler)
        root.setLevel(self.level)
        # kafka-python: warnings and errors; its INFO lines too when debugging.
        client.setLevel(logging.INFO if self.level <= logging.DEBUG else logging.WARNING)
        return self

    def __exit__(self, *exc: typing.Any) -> None:
        root, client = logging.getLogger(), logging.getLogger("kafka")
        root.removeHandler(self.handler)
        root.setLevel(self._saved[0])
        client.setLevel(self._saved[1])


# Young objects allowed before CPython's first-generation collection (default 700): above the
# ~2 objects a record a poll holds for one batch (10,000 at the default --max-poll-records).
GC_YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def _collector_for_a_worker() -> typing.Iterator[None]:
    """CPython's collector set for running a worker, and set back afterwards (the command's
    choice for its process; `Worker.run` leaves the host process's collector alone).

    A poll hands the main thread up to --max-poll-records records, each with two objects the
    collector tracks, that live until their batch is processed. At the default thresholds they
    survive young collections in every poll and soon trigger full ones, each a walk of every
    object the start-up made (tens of thousands: modules, the model's classes). So the start-up
    heap is collected once and frozen (`gc.freeze`: later collections skip it), and young
    collections wait for `GC_YOUNG_THRESHOLD` objects, more than a batch holds. Cyclic garbage
    is still collected, at most that many objects late.
    """
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def run(args: argparse.Namespace) -> int:
    level_name = str(args.log_level).upper()
    if level_name not in LOG_LEVELS or args.log_format not in LOG_FORMATS:
        print(f"streammargin kafka: --log-level must be one of {', '.join(LOG_LEVELS)} and "
              f"--log-format one of {', '.join(LOG_FORMATS)}, got {args.log_level!r} and "
              f"{args.log_format!r}", file=sys.stderr)
        return 2
    level = getattr(logging, level_name)
    worker: typing.Any = None

    def connected() -> bool:
        # (Not the phase: a worker that fails to connect goes from "starting" to "failed", and
        # closing a librdkafka consumer then delivers the connection errors it logged.)
        return worker is not None and worker.status.was_connected

    def held_back() -> None:
        contact = worker.contact if worker is not None else None
        if contact is not None:
            contact.held_back()

    with _LogSetup(level, args.log_format, connected, held_back):
        if args.list_models:
            from connectors.models import model_names

            for name, cls in model_names().items():
                print(f"{name:<20} {cls.__module__}.{cls.__name__}")
            return 0
        logger = logging.getLogger("streammargin.kafka")
        debug = level <= logging.DEBUG

        def fail(message: str, code: int, error: BaseException | None = None,
                 **fields: typing.Any) -> int:
            # One line; the traceback only when debugging.
            hint = "" if debug or error is None else " (--log-level DEBUG shows the traceback)"
            logger.error("%s%s", " ".join(message.split()), hint,
                         exc_info=error if debug else None, extra=fields)
            return code

        from connectors.worker.memory_budget import MemoryBudgetError
        from connectors.worker.worker import Worker

        topics = args.topic if args.topic is not None else args.topic_env
        if not topics:
            return fail("no input topic. Fix: give --topic NAME (repeatable), or "
                        "STREAMMARGIN_TOPIC=a,b", 2)
        try:
            config = config_from_args(args)
        except ValueError as error:
            return fail(_as_flags(str(error)), 2)
        try:
            worker = Worker(config)
        except MemoryBudgetError as error:  # the cause, then the fix: two lines
            for line in str(error).splitlines():
                logger.error("%s", line)
            return 2
        except (ImportError, AttributeError, TypeError, ValueError) as error:
            return fail(f"cannot use --codec {config.codec}: {type(error).__name__}: {error}. "
                        "Fix: give json, or package.module:Class naming a codec class that can "
                        "be imported here (is its package installed?)", 2, error)
        server = None
        if args.http_port is not None:
            from connectors.observability.observability import EndpointError, EndpointServer

            if not 0 <= args.http_port <= 65535:
                return fail(f"--http-port must be in 0-65535 (0: a free one), got "
                            f"{args.http_port}", 2)

            try:
                server = EndpointServer(worker.status, args.http_host, args.http_port,
                                        liveness_timeout=args.liveness_timeout)
            except (EndpointError, ValueError) as error:
                return fail(str(error), 1 if isinstance(error, EndpointError) else 2)
            logger.info("serving /metrics, /healthz and /readyz at %s (--http-host %s)",
                        server.url, args.http_host,
                        extra={"http_host": args.http_host, "http_port": server.port})

        def stop(signum, frame):  # noqa: ARG001
            logger.info("%s: finishing the record in hand, then checkpoint and exit",
                        signal.Signals(signum).name)
            worker.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        profiler = None
        if args.profile_stages:
            from connectors.worker.profiling import StageProfiler

            profiler = StageProfiler().start()
        try:
            with _collector_for_a_worker():
                summary = worker.run(on_metrics=_log_metrics)
        except Exception as error:
            # The worker's errors name the cause and the fix; a traceback helps only to debug.
            return fail(f"worker failed: {_failure_message(error)}", 1, error,
                        **_failure_fields(error))
        finally:
            if server is not None:
                server.close()
            if profiler is not None:
                profiler.stop()
                _write_profile(args.profile_stages, profiler, worker)
        totals = {k: v for k, v in summary.items() if k != "partitions"}
        if args.log_format == "json":
            logger.info("finished (%s)", summary["reason"], extra=totals)
        else:
            print(json.dumps(totals), file=sys.stderr)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streammargin")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["kafka", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
