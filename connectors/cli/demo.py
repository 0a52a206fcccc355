"""`streammargin demo`: the whole product on one machine, in a minute.

It starts a Kafka broker on free loopback ports, produces a stream with an abrupt concept
change (and a few malformed records) into a topic, runs the Kafka worker on it, shows live
progress (records/s, lag, rolling accuracy, drift detections), then prints a summary and writes a
PNG of the rolling accuracy with the change point and the detections marked. Nothing is left
running: the broker stops with the demo, whatever happens.

The broker is the embedded Tansu by default (in memory, nothing to install beyond the kafka
extra); `--broker apache-kafka` runs Apache Kafka instead (one KRaft node; needs Java 17+, and
Maven the first time, to fetch its jars into a cache).

    streammargin demo                                  # ALMA on SEA, 40,000 records
    streammargin demo --broker apache-kafka            # the same on Apache Kafka
    streammargin demo --model budgetperceptron --stream hyperplane --size 60000
    streammargin demo --model alma --param alpha=0.5 --partitions 2
    streammargin demo --drift-detector adwin --drift-param delta=0.0002

The drift detector is the worker's default (chosen by benchmarks/drift_detectors.py for few false
alarms on stationary streams and a prompt detection after a change).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import pathlib
import threading
import time
import typing

from connectors import models
from connectors.cli import terminal
from connectors.cli.errors import EXIT_FAILURE, CommandError
from connectors.kafka.broker import BROKERS

STREAMS = ("sea", "hyperplane", "agrawal")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="a Kafka broker + a drifting stream + the worker, with live metrics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--broker", choices=BROKERS, default="tansu",
                        help="the broker the demo starts: the embedded Tansu (default, in "
                        "memory) or Apache Kafka (needs Java 17+; Maven fetches it once)")
    parser.add_argument("--model", default="alma", help=f"one of: {', '.join(models.model_names())}")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a model parameter (repeatable)")
    parser.add_argument("--stream", choices=STREAMS, default="sea",
                        help="the generator before and after the change (default: sea)")
    parser.add_argument("--size", type=int, default=40_000, help="records to produce")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the input topic")
    parser.add_argument("--bad-every", type=int, default=500,
                        help="one malformed record every N (0: none), to show the dead letters")
    parser.add_argument("--no-scale", action="store_true",
                        help="no StandardScaler in front of the model")
    parser.add_argument("--drift-detector", default=None, metavar="NAME",
                        help="drift detector on the error stream (default: the worker's, "
                        f"{default_detector_label()})")
    parser.add_argument("--drift-param", action="append", default=[], metavar="KEY=VALUE",
                        help="a drift detector parameter (repeatable)")
    parser.add_argument("--out", default="demo-output", help="folder of the PNG and the summary")
    parser.add_argument("--log-level", default="WARNING",
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="DEBUG also prints the traceback of a failure")
    parser.set_defaults(func=run)


def default_detector() -> tuple[str, dict]:
    """The worker's default drift detector and its parameters (`WorkerConfig`)."""
    from connectors.worker.config import WorkerConfig

    fields = WorkerConfig.__dataclass_fields__
    return fields["drift_detector"].default, fields["drift_params"].default_factory()


def detector_label(name: str, params: dict) -> str:
    """'DDM(warm_start=1000, warning_threshold=2.0, drift_threshold=4.0)': the detector's class
    and every setting it runs with."""
    from connectors.observability.metrics import detector_params, make_detector

    detector = make_detector(name, params)
    settings = ", ".join(f"{k}={v}" for k, v in detector_params(detector).items())
    return f"{type(detector).__name__}({settings})"


def default_detector_label() -> str:
    return detector_label(*default_detector())


def drifting_stream(name: str, size: int, seed: int = 7) -> typing.Iterator[tuple[dict, bool]]:
    """`size` records whose concept changes abruptly at size // 2."""
    from river.datasets import synth

    if name == "sea":
        before, after = synth.SEA(variant=0, seed=seed), synth.SEA(variant=3, seed=seed + 1)
    elif name == "hyperplane":
        before = synth.Hyperplane(n_features=10, seed=seed)
        after = synth.Hyperplane(n_features=10, seed=seed + 1)
    else:
        before = synth.Agrawal(classification_function=4, seed=seed)
        after = synth.Agrawal(classification_function=1, seed=seed + 1)
    # An abrupt change: River's ConceptDriftStream overflows math.exp at width=1.
    for x, y in itertools.chain(before.take(size // 2), after.take(size - size // 2)):
        yield x, bool(y)


def malformed(i: int) -> bytes:
    """A record the worker must turn into a dead letter (each kind in turn)."""
    kinds = [
        b'{"id": "bad-%d", "x": {"x0": NaN}, "y": true}',
        b'{"id": true, "x": {"x0": 12.5}, "y": true, "seq": %d}',
        b'{"id": "bad-%d", "x": [1.0, 2.0], "y": false}',
        b'{"id": "bad-%d", "x": {"x0": 1.0}, "y": "maybe"}',
        b'{"id": "bad-%d", "x": {"x0": 1.0',
    ]
    return kinds[i % len(kinds)] % i


def produce(bootstrap: str, topic: str, stream_name: str, size: int, bad_every: int,
            done: threading.Event, errors: list, change_offsets: dict) -> None:
    """Write the stream as JSON events {"id", "x", "y"} (plus malformed ones), then flush.

    `change_offsets` receives, per partition, the offset of the first record after the change.
    """
    from kafka import KafkaProducer

    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20)
        n_bad = 0
        half = size // 2
        after_change = []  # futures of the first records after the change: their offsets
        for i, (x, y) in enumerate(drifting_stream(stream_name, size)):
            value = json.dumps({"id": str(i), "x": x, "y": y}, separators=(",", ":")).encode()
            future = producer.send(topic, value, key=str(i).encode())
            if half <= i < half + 200:
                after_change.append(future)
            if bad_every and i % bad_every == bad_every - 1:
                producer.send(topic, malformed(n_bad), key=b"bad")
                n_bad += 1
        producer.flush()
        for future in after_change:
            metadata = future.get(timeout=10)
            known = change_offsets.get(metadata.partition)
            if known is None or metadata.offset < known:
                change_offsets[metadata.partition] = metadata.offset
        producer.close()
    except Exception as error:  # reported by the main thread
        errors.append(error)
    finally:
        done.set()


def dead_letter_reasons(bootstrap: str, topic: str) -> dict[str, int]:
    """Dead letters by reason (the worker puts it in Kafka Connect's
    `__connect.errors.exception.message` header)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=1500, enable_auto_commit=False)
    reasons: dict[str, int] = {}
    for message in consumer:
        headers = dict(message.headers or [])
        reason = headers.get("__connect.errors.exception.message", b"?").decode(errors="replace")
        reason = reason.split(":")[0]
        reasons[reason] = reasons.get(reason, 0) + 1
    consumer.close()
    return reasons


def plot(curves: dict, changes: dict, detections: dict, path: pathlib.Path, title: str,
         detector: str = "drift detector") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for partition, points in sorted(curves.items()):
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, linewidth=1.4, label=f"rolling accuracy, partition {partition}")
    for i, offset in enumerate(sorted(set(changes.values()))):
        ax.axvline(offset, color="black", linestyle="--", linewidth=1,
                   label="concept change" if i == 0 else None)
    first = True
    for partition, offsets in detections.items():
        for offset in offsets:
            ax.axvline(offset, color="tab:red", alpha=0.6, linewidth=1,
                       label=f"drift detected ({detector})" if first else None)
            first = False
    ax.set_xlabel("input offset (records of the partition)")
    ax.set_ylabel("rolling accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def broker_label(kind: str) -> str:
    """What the demo says it runs on."""
    from connectors.kafka.broker import KAFKA_VERSION

    if kind == "apache-kafka":
        return f"Apache Kafka {KAFKA_VERSION} (one KRaft node, its log in a temporary folder)"
    return "the embedded Tansu (in memory)"


def start_broker(kind: str) -> typing.Any:
    """The demo's broker of `kind` (one of `connectors.kafka.broker.BROKERS`), started; else a
    `CommandError` naming the cause and the fix. Stopped again if the start is interrupted."""
    from connectors.kafka.broker import (
        KAFKA_VERSION,
        BrokerError,
        apache_kafka_cache,
        apache_kafka_unavailable,
        make_broker,
    )

    if kind == "apache-kafka":
        missing = apache_kafka_unavailable()
        if missing is not None:
            raise CommandError(
                f"Apache Kafka {KAFKA_VERSION} cannot run here: {missing}",
                "install a JDK 17+ and Maven 3.8+ (apt-get install openjdk-17-jre-headless "
                "maven), or run the demo on the embedded Tansu (--broker tansu, the default)",
                EXIT_FAILURE,
            )
        if not apache_kafka_cache().is_dir():
            print(f"  fetching Apache Kafka {KAFKA_VERSION} with Maven, once, into "
                  f"{apache_kafka_cache()} (up to a minute)", flush=True)
        what = f"Apache Kafka {KAFKA_VERSION}"
        fix = ("check `java -version` (17 or later) and free memory, or run the demo on the "
               "embedded Tansu (--broker tansu)")
    else:
        what = "the embedded Kafka broker"
        fix = ("install the kafka extra (pip install 'streammargin[kafka]') or set "
               "STREAMMARGIN_TANSU to a tansu executable")
    broker = make_broker(kind)
    try:
        return broker.start()
    except (BrokerError, OSError) as error:  # OSError: STREAMMARGIN_TANSU is no executable
        broker.stop()
        cause, _, own_fix = str(error).partition(". Fix: ")
        raise CommandError(f"{what} did not start: {cause}", own_fix or fix,
                           EXIT_FAILURE) from None
    except BaseException:  # Ctrl-C while it starts: a JVM in a session of its own stays up
        broker.stop()
        raise


def run(args: argparse.Namespace) -> int:
    import logging

    from connectors.kafka.broker import FAST_GROUP_SETTINGS, create_topics
    from connectors.observability.metrics import make_detector
    from connectors.worker.worker import Worker, WorkerConfig

    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(levelname)s %(name)s: %(message)s")
    # kafka-python's own warnings (a slow event loop, reconnects) are noise in a demo.
    kafka_level = logging.DEBUG if args.log_level == "DEBUG" else logging.ERROR
    logging.getLogger("kafka").setLevel(kafka_level)
    for option, value, least in (("--size", args.size, 100), ("--partitions", args.partitions, 1),
                                 ("--bad-every", args.bad_every, 0)):
        if value < least:
            raise CommandError(f"{option} {value}: expected at least {least}",
                               "see `streammargin demo --help`")
    if args.partitions > 64:
        raise CommandError(f"--partitions {args.partitions}: at most 64 in the demo",
                           "use the kafka command for larger topics")
    # A bad name or parameter fails before the broker starts.
    try:
        params = models.parse_params(args.param)
        models.build_model(args.model, params)
    except ValueError as error:
        raise CommandError(str(error), "`streammargin kafka --list-models` lists the models "
                           "and `--param key=value` sets their parameters") from None
    if args.drift_detector is None:
        if args.drift_param:
            raise CommandError(
                "--drift-param without --drift-detector",
                f"name the detector too, e.g. --drift-detector {default_detector()[0]}",
            )
        detector_name, detector_params = default_detector()
    else:
        detector_name = args.drift_detector
        try:
            detector_params = models.parse_params(args.drift_param)
            make_detector(detector_name, detector_params)
        except ValueError as error:
            raise CommandError(str(error), "see River's drift module for the parameters") from None
    detector = detector_label(detector_name, detector_params)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    topic = "demo.events"
    n_bad = args.size // args.bad_every if args.bad_every else 0
    total = args.size + n_bad
    started = time.perf_counter()

    print(f"streammargin demo: {args.model} on a {args.stream.upper()} stream of {args.size:,} "
          f"records, concept change at {args.size // 2:,}, {n_bad} malformed records; "
          f"drift detector {detector}")
    broker = start_broker(args.broker)  # `with` below stops it, whatever happens
    with broker:
        bootstrap = broker.bootstrap_servers
        print(f"  Kafka broker: {broker_label(args.broker)} at {bootstrap}")
        create_topics(bootstrap, [topic], partitions=args.partitions)
        produced, producer_errors, change_offsets = threading.Event(), [], {}
        producer = threading.Thread(
            target=produce,
            args=(bootstrap, topic, args.stream, args.size, args.bad_every, produced,
                  producer_errors, change_offsets),
            daemon=True,
        )
        producer.start()

        config = WorkerConfig(
            topics=[topic], bootstrap_servers=bootstrap, group_id="streammargin-demo",
            predictions_topic="demo.predictions", metrics_topic="demo.metrics",
            dead_letter_topic="demo.dead-letters", checkpoint_topic="demo.checkpoints",
            model=args.model, params=params, scale=not args.no_scale,
            drift_detector=detector_name, drift_params=detector_params,
            metrics_every=500, checkpoint_every=10_000, idle_timeout=3.0,
            # Tansu holds a new member's join for half the session timeout: ~3 s, not ~5 s at
            # the worker's 10 s default (Apache Kafka does not wait for it).
            **FAST_GROUP_SETTINGS,
        )
        progress = terminal.ProgressLine(total, label="  ")
        curves: dict[int, list[tuple[int, float]]] = {}
        detections: dict[int, list[int]] = {}
        latest: dict[int, dict] = {}

        def on_metrics(record: dict) -> None:
            partition = record["partition"]
            latest[partition] = record
            if record.get("rolling_accuracy") is not None:
                curves.setdefault(partition, []).append(
                    (record["next_offset"], record["rolling_accuracy"])
                )
            offsets = record["drift"]["recent_detection_offsets"]
            known = detections.setdefault(partition, [])
            for offset in offsets:
                if offset not in known:
                    known.append(offset)
                    progress.message(f"  drift detected on partition {partition} at offset "
                                     f"{offset:,} (rolling accuracy {record['rolling_accuracy']:.3f})")
            done = sum(r["records"] for r in latest.values())
            lag = sum(r["lag"] or 0 for r in latest.values())
            rolling = [r["rolling_accuracy"] for r in latest.values() if r["rolling_accuracy"] is not None]
            fields = (f"lag {lag:>7,}  rolling acc {sum(rolling) / len(rolling):.3f}" if rolling
                      else f"lag {lag:>7,}")
            # The worker's own rate: the bar's clock also counts the broker start and group join.
            # 0.0 is a rate the worker has not measured yet: none is shown.
            rate = sum(r["records_per_s_recent"] or r["records_per_s"] for r in latest.values())
            progress.update(done, fields, rate=rate or math.nan)

        summary = Worker(config).run(on_metrics=on_metrics)
        progress.close(sum(r["records"] for r in latest.values()),
                       rate=summary["records_per_s"] or math.nan)
        producer.join(timeout=30)
        if producer_errors:
            error = producer_errors[0]
            raise CommandError(
                f"producing the demo stream failed: {type(error).__name__}: {error}",
                "run again with --log-level DEBUG for details", EXIT_FAILURE,
            )
        reasons = dead_letter_reasons(bootstrap, "demo.dead-letters")

    # The broker is stopped here. Summary and plot.
    records = sum(r["records"] for r in latest.values())
    print()
    rows = []
    for partition, record in sorted(latest.items()):
        found = detections.get(partition, [])
        rows.append([
            f"partition {partition}", record["records"], record["predictions"],
            record["dead_letters"], record["accuracy"], record["rolling_accuracy"],
            record["log_loss"], len(found),
        ])
    print(terminal.format_table(
        ["", "records", "predictions", "dead letters", "accuracy", "rolling", "log loss",
         "drifts"], rows))
    lines = []
    delays = []
    for partition in sorted(set(change_offsets) | set(detections)):
        change = change_offsets.get(partition)
        found = detections.get(partition, [])
        first = next((o for o in found if change is not None and o >= change), None)
        if first is not None:
            delays.append(first - change)
        lines.append(
            f"partition {partition}: change at offset {change:,}, " if change is not None else
            f"partition {partition}: "
        )
        lines[-1] += (f"detections at {', '.join(f'{o:,}' for o in found)}" if found
                      else "no detection") + (
            f" (first after the change: +{first - change:,} records)" if first is not None else ""
        )
    print(f"concept change at record {args.size // 2:,} of the stream")
    for line in lines:
        print("  " + line)
    if reasons:
        print("dead letters by reason: " + "; ".join(f"{r} ({n})" for r, n in sorted(reasons.items())))
    counters: dict[str, int] = {}
    for record in latest.values():  # summed over the partitions' models
        for name, value in record.get("model_counters", {}).items():
            counters[name] = counters.get(name, 0) + value
    if counters:
        print("model counters: " + ", ".join(f"{k} {v:,}" for k, v in counters.items()))
    elapsed = time.perf_counter() - started
    throughput = (f"{summary['records_per_s']:,.0f} records/s" if summary["records_per_s"]
                  else "not measured")
    print(f"worker throughput {throughput}; demo wall time "
          f"{elapsed:.1f} s (broker start, group join, idle timeout included)")
    png = out / "demo.png"
    plot(curves, change_offsets, detections, png,
         f"{args.model} on {args.stream.upper()} through Kafka: {records:,} records", detector)
    (out / "summary.json").write_text(json.dumps(
        {"args": vars(args) | {"func": None}, "worker": summary, "detections": detections,
         "change_offsets": change_offsets, "detection_delays": delays,
         "drift_detector": {"name": detector_name, "params": detector_params},
         "dead_letter_reasons": reasons}, indent=2, default=str))
    print(f"plot: {png}   summary: {out / 'summary.json'}")
    ok = records >= total and all(
        math.isfinite(r["accuracy"] or math.nan) for r in latest.values()
    )
    return 0 if ok else 1
