"""`streammargin serve`: answer requests with the models the workers of a group learn, over the
Open Inference Protocol (connectors/serving).

It takes the worker's options, with the same names, defaults and `STREAMMARGIN_*` variables, so
that one command line or one set of variables serves both commands; those that do not concern
serving (outputs, delivery, the group's timeouts, ...) are accepted and named in one INFO line.
Options that contradict the checkpoints (another --model, --scale, ...) are refused in one line
(exit 2) when nothing could be served. Its own options follow (`SERVE_OPTIONS`).

SIGTERM and SIGINT stop it at once (a request in hand is answered first); it never writes to
Kafka, so there is nothing to flush.
"""

from __future__ import annotations

import argparse
import logging
import sys
import typing

from connectors.cli import kafka_command

SERVE_OPTIONS: list[tuple[str, str, typing.Any, str]] = [
    ("--model-name", "str", None, "the model's name in the protocol (default: --group-id)"),
    ("--serve-host", "str", "0.0.0.0",
     "address of the protocol's endpoints and /metrics: 0.0.0.0 (every interface), :: (IPv6 "
     "too) or 127.0.0.1 (this host only)"),
    ("--serve-port", "int", 8080, "port of the protocol's endpoints and /metrics"),
    ("--versions-kept", "int", 3,
     "versions of each model kept addressable at /v2/models/NAME/versions/V (the newest "
     "included)"),
    ("--max-model-age", "float", None,
     "/v2/health/ready answers 400 once the newest checkpoint served is older than SECONDS "
     "(workers or brokers down); the server still answers"),
    ("--key-partitioner", "str", "murmur2",
     "how the topic's producers partition keyed records: murmur2 (Java's default, "
     "kafka-python's, librdkafka's murmur2_random) or crc32 (librdkafka's default, "
     "consistent_random: confluent-kafka)"),
    ("--max-request-bytes", "int", 4 << 20, "request bodies above this are refused (413)"),
    ("--max-request-records", "int", 10_000, "records (rows) a request may hold (400 above)"),
    ("--max-request-fields", "int", 10_000,
     "inputs of a table, and features of a record once mapped, a request may hold (400 above)"),
    ("--max-concurrent-requests", "int", 16,
     "requests taken at once (the others wait in the listen queue)"),
    ("--request-timeout", "float", 10.0,
     "seconds a request's headers, and then its body, may take to arrive (408 for a body)"),
]

# The worker's options that serving does not use: given, they are named in one INFO line.
NOT_SERVING = {
    "--predictions-topic", "--predictions-per-message", "--metrics-topic", "--dead-letter-topic",
    "--copy-headers", "--output-format", "--metrics-every", "--metrics-interval",
    "--checkpoint-every", "--checkpoint-interval", "--checkpoint-chunk-bytes", "--idle-timeout",
    "--max-outage", "--rolling-window", "--drift-detector", "--drift-param",
    "--on-bad-checkpoint", "--on-undecodable", "--processing-guarantee", "--model-topic",
    "--model-exchange", "--mix-every", "--max-model-bytes-share", "--max-exchange-cpu-share",
    "--transport", "--session-timeout-ms", "--heartbeat-interval-ms", "--max-poll-records",
    "--auto-offset-reset", "--create-topics", "--warm-up", "--producer-config",
    "--schema-registry-url", "--schema-registry-config", "--schema-cache-bytes",
    "--http-port", "--http-host", "--liveness-timeout", "--profile-stages", "--client-id",
    "--label-store-size", "--label-store-bytes", "--label-max-age-records",
    "--label-max-age-seconds",
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="answer requests with the workers' latest models (Open Inference Protocol)",
        description=__doc__.split("\n\n")[0],
        epilog="Every option also reads the environment variable STREAMMARGIN_<OPTION>.",
    )
    kafka_command.add_options(parser, kafka_command.OPTIONS + SERVE_OPTIONS)
    parser.error = (  # type: ignore[method-assign]
        lambda message: kafka_command._short_error(parser, message))
    parser.set_defaults(func=run)


def _not_serving(args: argparse.Namespace) -> list[str]:
    """The options given (on the command line or in the environment) that serving does not
    use."""
    given = []
    for flag, _, default, _ in kafka_command.OPTIONS:
        if flag not in NOT_SERVING:
            continue
        value = getattr(args, flag[2:].replace("-", "_"))
        if value != default and not (value in (None, "", {}, []) and default in (None, "", {})):
            given.append(flag)
    return given


def run(args: argparse.Namespace) -> int:
    level_name = str(args.log_level).upper()
    if level_name not in kafka_command.LOG_LEVELS or (
            args.log_format not in kafka_command.LOG_FORMATS):
        print(f"streammargin serve: --log-level must be one of "
              f"{', '.join(kafka_command.LOG_LEVELS)} and --log-format one of "
              f"{', '.join(kafka_command.LOG_FORMATS)}", file=sys.stderr)
        return 2
    level = getattr(logging, level_name)
    with kafka_command._LogSetup(level, args.log_format, lambda: True):
        return _serve(args, level <= logging.DEBUG)


def _serve(args: argparse.Namespace, debug: bool) -> int:
    logger = logging.getLogger("streammargin.serve")

    def fail(message: str, code: int, error: BaseException | None = None) -> int:
        hint = "" if debug or error is None else " (--log-level DEBUG shows the traceback)"
        for line in message.splitlines():
            logger.error("%s%s", " ".join(line.split()), hint if line is message else "",
                         exc_info=error if debug else None)
        return code

    topics = args.topic if args.topic is not None else args.topic_env
    if not topics:
        return fail("no input topic. Fix: give the workers' --topic NAME (repeatable), or "
                    "STREAMMARGIN_TOPIC=a,b", 2)
    from connectors.serving import FollowerError, ModelFollower
    from connectors.serving.app import InferenceApp, serve
    from connectors.serving.protocol import Limits
    from connectors.serving.sizing import budget_of

    try:
        config = kafka_command.config_from_args(args)
    except ValueError as error:
        return fail(kafka_command._as_flags(str(error)), 2)
    for name in ("serve_port",):
        if not 1 <= getattr(args, name) <= 65535:
            return fail(f"--serve-port must be in 1-65535, got {args.serve_port}", 2)
    for name in ("max_request_bytes", "max_request_records", "max_request_fields",
                 "max_concurrent_requests"):
        if getattr(args, name) < 1:
            return fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}", 2)
    if args.request_timeout is None or not args.request_timeout > 0:
        return fail(f"--request-timeout must be > 0 seconds, got {args.request_timeout}", 2)
    unused = _not_serving(args)
    if unused:
        logger.info("options of the worker that serving does not use, accepted: %s",
                    ", ".join(unused))
    try:
        from streammargin.jit import aot

        budget = budget_of(config, args.versions_kept, args.max_request_bytes,
                           args.max_concurrent_requests, numba=not (aot.enabled() and aot.built()))
    except ValueError as error:
        return fail(str(error), 2)
    limits = Limits(max_records=args.max_request_records, max_fields=args.max_request_fields,
                    max_record_bytes=config.max_record_bytes)
    try:
        follower = ModelFollower(config, model_name=args.model_name,
                                 versions_kept=args.versions_kept,
                                 max_model_age=args.max_model_age,
                                 partitioner=args.key_partitioner, limits=limits, budget=budget)
    except FollowerError as error:
        return fail(str(error), 2)
    app = InferenceApp(follower, max_request_bytes=args.max_request_bytes,
                       body_timeout=args.request_timeout)
    follower.start()
    stopped_for: list[str] = []

    def watch() -> bool:
        # Options that contradict the checkpoints, with nothing served: stop (exit 2).
        if follower.error is not None and not follower.view.current:
            stopped_for.append(follower.error)
            return True
        return False

    def started() -> None:
        host = "127.0.0.1" if args.serve_host in ("0.0.0.0", "") else args.serve_host
        logger.info("serving model %r (group %s, %s scope) at http://%s:%d/v2/models/%s, "
                    "following %s", follower.model_name, config.group_id, config.model_scope,
                    f"[{host}]" if ":" in host else host, args.serve_port,
                    follower.model_name, config.checkpoint_topic)

    try:
        # The collector as the worker sets it: the start-up heap frozen, young collections
        # rarer (a full collection's walk of it was a stall of milliseconds in a request).
        with kafka_command._collector_for_a_worker():
            serve(app, args.serve_host, args.serve_port, request_timeout=args.request_timeout,
                  backpressure=args.max_concurrent_requests, started=started, watch=watch)
    except OSError as error:
        return fail(f"cannot serve on --serve-host {args.serve_host} --serve-port "
                    f"{args.serve_port}: {error}. Fix: choose a free port, and an address of "
                    "this host", 1, error)
    finally:
        follower.close()
    if stopped_for:
        return 2  # (the follower logged the line: the cause and the fix)
    return 0
