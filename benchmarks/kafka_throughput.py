"""End-to-end throughput of the Kafka worker against what a user would pick instead.

One embedded broker, one input topic (`--records` labelled JSON events of River's Hyperplane
generator, 10 features, keyed, spread over `--partitions` partitions), and the contenders taking
turns on it, each a fresh process with its own consumer group and output topic, `--rounds` times
(the order rotates each round):

- ``worker``: `streammargin kafka --model alma --scale` as the README installs it (kafka-python);
- ``worker-fast``: the same in the project's fastest documented configuration (`FAST_OPTIONS`);
- ``worker-librdkafka``: `worker-fast` on librdkafka (`--transport librdkafka`, the
  ``streammargin[librdkafka]`` extra: confluent-kafka) instead of kafka-python;
- ``quix``: a Quix Streams 3.28 app (`Application`, `app.dataframe(topic).apply(...)`,
  `to_topic`, `app.run()`) running River's `preprocessing.StandardScaler() |
  linear_model.ALMAClassifier()`, one pipeline per input partition, one prediction record per
  input (the worker's fields);
- ``loop``: a hand-written kafka-python loop (poll, `json.loads`, the same River pipeline,
  `json.dumps`, `send`), with kafka-python's defaults but the fast group settings and the worker's
  compiled CRC-32C (what a user gets with the `crc32c` package).

Every consumer uses session timeout 6 s and heartbeat 1 s (the embedded broker makes a group join
wait about half the session timeout; librdkafka needs this to join in ~3 s). The harness watches
the output topic through a librdkafka consumer's cached high watermarks (fetched in C, never
decoded in Python; Tansu's ListOffsets answers short of the log end), and stops the contender with
SIGTERM once every prediction is there. Per run it records: records/s from the first to the last
prediction (the predictions that appear after the first ones seen, over the time between: a
contender that sends a batch of predictions at once must not count that batch as done in no
time), records/s from process start to the last prediction, the process's CPU seconds per
record (user + system, from `os.wait4`: start-up and shutdown included; the harness and the broker
are not counted) and the CPU seconds per record predicted between the first and the last
prediction ("proc. CPU", from /proc: the processing alone). Ratios are computed within each round
(the machine's speed drifts, a round's contenders see the same drift), then their median is
printed.

After the rounds, one more worker run with `--profile-stages` prints where its main thread spent
its time (poll, decode, scale, model, metrics, encode, produce, checkpoint), its start-up (process
start to the first poll) and RSS; then two workers in one group against one (CPU seconds per
record while processing and for the whole processes, throughput ratio, the median over
`--scale-out-repeats` pairs of runs; `--scale-out-contender` picks which of ours, ``worker`` by
default). The checkpoint section
times checkpoint + commit of an ALMA model with 1000 features.

Run: .venv/bin/python benchmarks/kafka_throughput.py [--records 50000] [--rounds 3]
     [--contenders worker,worker-fast,worker-librdkafka,quix,loop]
Quix Streams comes with the `bench` extra (`pip install -e '.[bench]'`, which `make bench` does).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

GROUP_SETTINGS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
# The worker's options in every run, and those of the fastest documented configuration.
WORKER_OPTIONS = ["--model", "alma", "--scale", "--log-level", "WARNING",
                  "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000"]
FAST_OPTIONS: list[str] = ["--checkpoint-every", "100000"]
LIBRDKAFKA_OPTIONS = ["--transport", "librdkafka"]
CONTENDERS = ("worker", "worker-fast", "worker-librdkafka", "quix", "loop", "baseline")
OURS = ("worker", "worker-fast", "worker-librdkafka")
# `--baseline DIR`: the contender "baseline" runs the worker of another checkout (e.g. `git
# archive` of an earlier commit), to measure a change against what it replaces in the same run.
BASELINE: dict[str, str] = {}
# `--cold-cache`: every worker process starts with an empty numba cache (a fresh container).
COLD_CACHE = False
TIMEOUT_S = 180.0


def make_records(n: int, n_features: int = 10, seed: int = 1) -> list[tuple[bytes, bytes]]:
    """(key, value) of `n` labelled JSON events of River's Hyperplane generator."""
    from river.datasets import synth

    stream = synth.Hyperplane(seed=seed, n_features=n_features).take(n)
    return [
        (f"e{i}".encode(), json.dumps({"id": f"e{i}", "x": x, "y": bool(y)}).encode())
        for i, (x, y) in enumerate(stream)
    ]


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]],
            partitions: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024)
    for i, (key, value) in enumerate(records):
        producer.send(topic, value, key=key, partition=i % partitions)
    producer.flush()
    producer.close()


# Contenders ---------------------------------------------------------------------------------------


def river_pipeline():
    from river import linear_model, preprocessing

    return preprocessing.StandardScaler() | linear_model.ALMAClassifier()


def run_quix(bootstrap: str, topic: str, out: str, group: str) -> None:
    """The Quix Streams app: River's pipeline per input partition, one prediction per input."""
    from quixstreams import Application, message_context

    app = Application(
        broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
        loglevel="WARNING", use_changelog_topics=False,
    )
    models: dict[int, object] = {}

    def predict_learn(event: dict) -> dict:
        context = message_context()
        partition = context.partition
        model = models.get(partition)
        if model is None:
            model = models[partition] = river_pipeline()
        x, y = event["x"], event.get("y")
        y_pred = model.predict_one(x)
        p_true = model.predict_proba_one(x).get(True, 0.0)
        if y is not None:
            model.learn_one(x, y)
        return {"topic": context.topic, "partition": partition, "model": "alma",
                "offset": context.offset, "id": event.get("id"), "y_pred": y_pred,
                "p_true": p_true, "y": y}

    sdf = app.dataframe(app.topic(topic, value_deserializer="json"))
    sdf = sdf.apply(predict_learn)
    sdf.to_topic(app.topic(out, value_serializer="json"))
    app.run()


def run_loop(bootstrap: str, topic: str, out: str, group: str) -> None:
    """The hand-written kafka-python loop."""
    from kafka import KafkaConsumer, KafkaProducer

    from connectors.codec import install_fast_crc32c

    install_fast_crc32c()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", **GROUP_SETTINGS)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    models: dict[int, object] = {}
    while not stopping:
        for tp, records in consumer.poll(timeout_ms=200).items():
            model = models.get(tp.partition)
            if model is None:
                model = models[tp.partition] = river_pipeline()
            for record in records:
                event = json.loads(record.value)
                x, y = event["x"], event.get("y")
                y_pred = model.predict_one(x)
                p_true = model.predict_proba_one(x).get(True, 0.0)
                if y is not None:
                    model.learn_one(x, y)
                prediction = {"topic": record.topic, "partition": record.partition,
                              "model": "alma", "offset": record.offset, "id": event.get("id"),
                              "y_pred": y_pred, "p_true": p_true, "y": y}
                producer.send(out, json.dumps(prediction).encode(), key=record.key,
                              partition=record.partition)
    producer.flush()
    consumer.close()
    producer.close()


def worker_command(bootstrap: str, topic: str, out: str, group: str, extra: list[str]) -> list:
    script = os.path.join(os.path.dirname(sys.executable), "streammargin")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "connectors.cli"]
    return [*command, "kafka", "--bootstrap-servers", bootstrap, "--topic", topic,
            "--group-id", group, "--predictions-topic", out,
            "--metrics-topic", f"{out}.metrics", "--dead-letter-topic", f"{out}.dead",
            "--checkpoint-topic", f"{out}.checkpoints", *WORKER_OPTIONS, *extra]


def contender_command(name: str, bootstrap: str, topic: str, out: str, group: str,
                      extra: list[str] = ()) -> list:
    if name in OURS:
        options = {"worker": [], "worker-fast": FAST_OPTIONS,
                   "worker-librdkafka": [*FAST_OPTIONS, *LIBRDKAFKA_OPTIONS]}[name]
        return worker_command(bootstrap, topic, out, group, [*options, *extra])
    if name == "baseline":
        command = worker_command(bootstrap, topic, out, group, list(extra))
        return [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                "sys.modules.update(dict.fromkeys(sys.argv.pop(1).split(','))); "
                "sys.modules.pop('', None); "
                "from connectors.cli import main; sys.exit(main())", BASELINE["dir"],
                BASELINE.get("block", ""), *command[command.index("kafka"):]]
    return [sys.executable, os.path.abspath(__file__), "--contender", name,
            "--bootstrap", bootstrap, "--topic", topic, "--out", out, "--group", group]


# The harness --------------------------------------------------------------------------------------


class OutputWatch:
    """The number of records in a topic, from a librdkafka consumer's cached high watermarks:
    librdkafka fetches in its own threads and nothing is decoded in Python."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        from confluent_kafka import Consumer, TopicPartition

        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"watch-{topic}",
            "enable.auto.commit": False, "fetch.wait.max.ms": 5, "log_level": 0,
        })
        self.partitions = [TopicPartition(topic, p, 0) for p in range(partitions)]
        self.consumer.assign(self.partitions)
        for tp in self.partitions:  # connected and fetching before the contender starts
            self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)

    def count(self) -> int:
        total = 0
        for tp in self.partitions:
            high = self.consumer.get_watermark_offsets(tp, cached=True)[1]
            total += max(0, high)
        return total

    def close(self) -> None:
        self.consumer.close()


def run_contender(name: str, bootstrap: str, topic: str, n: int, partitions: int, run_id: str,
                  extra: list[str] = (), members: int = 1) -> dict:
    """Run a contender (`members` processes in one group) until all `n` predictions are out."""
    from connectors.broker import create_topics

    out = f"out.{run_id}"
    group = f"group.{run_id}"
    create_topics(bootstrap, [out], partitions=partitions)
    watch = OutputWatch(bootstrap, out, partitions)
    command = contender_command(name, bootstrap, topic, out, group, extra)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if COLD_CACHE and name not in ("quix", "loop"):
        env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cache-")  # empty: compiles
    started = time.monotonic()
    processes = [subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for _ in range(members)]
    started_wall = time.time()
    first = last = None
    cpu_first = cpu_last = 0.0
    try:
        while True:
            count = watch.count()
            now = time.monotonic()
            if first is None and count > 0:
                first, count_first = now, count
                cpu_first = sum(process_cpu(p.pid) for p in processes)
            if count >= n:
                last = now
                cpu_last = sum(process_cpu(p.pid) for p in processes)
                break
            if now - started > TIMEOUT_S or any(p.poll() is not None for p in processes):
                raise RuntimeError(f"{name}: {count} of {n} predictions after "
                                   f"{now - started:.0f} s")
            time.sleep(0.002)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        cpu = 0.0
        errors = []
        for process in processes:
            try:
                _, status, usage = os.wait4(process.pid, 0)
            except ChildProcessError:
                usage, status = None, 0
            process.returncode = os.waitstatus_to_exitcode(status)
            if usage is not None:
                cpu += usage.ru_utime + usage.ru_stime
            stderr = process.stderr.read().decode(errors="replace")
            if process.returncode not in (0, -signal.SIGTERM):
                errors.append(stderr[-2000:])
        watch.close()
    if errors:
        raise RuntimeError(f"{name} failed:\n" + "\n".join(errors))
    # The predictions seen after the first ones, over the time between: predictions sent in
    # batches appear many at once, and counting the first batch as done in no time would reward
    # sending late. When every prediction appeared at once (a few records) there is no rate: NaN.
    after_first = n - count_first
    measurable = after_first > 0 and last > first
    return {
        "rate_first_last": after_first / (last - first) if measurable else float("nan"),
        "predicted_after_first": after_first,
        "rate_start_last": n / (last - started),
        "first_prediction_s": first - started,
        "cpu_s": cpu,
        "cpu_us_per_record": 1e6 * cpu / n,
        # CPU from the first to the last prediction: the processing, without start-up and exit.
        "processing_cpu_s": cpu_last - cpu_first,
        "processing_cpu_us_per_record": (1e6 * (cpu_last - cpu_first) / after_first
                                         if measurable else float("nan")),
        "started_wall": started_wall,
    }


def scale_out(name: str, bootstrap: str, topic: str, n: int, partitions: int,
              repeats: int) -> None:
    """Two workers in one group against one, `repeats` pairs (one worker, then two): the CPU
    per record while processing, for the whole processes, and the throughput, each pair's ratio
    and their median. Two workers started together sometimes join twice on the embedded broker
    (one holds both partitions for a join's hold, then they are split): a single pair can show
    that race rather than the worker's cost, which the median over pairs does not."""
    ratios: dict[str, list[float]] = {"processing": [], "whole": [], "first_last": [],
                                      "start_last": []}
    per_record: dict[str, list[float]] = {"one": [], "two": []}
    for repeat in range(repeats):
        one = run_contender(name, bootstrap, topic, n, partitions, f"scale-1-{repeat}")
        two = run_contender(name, bootstrap, topic, n, partitions, f"scale-2-{repeat}",
                            members=2)
        per_record["one"].append(one["processing_cpu_us_per_record"])
        per_record["two"].append(two["processing_cpu_us_per_record"])
        ratios["processing"].append(two["processing_cpu_us_per_record"]
                                    / max(one["processing_cpu_us_per_record"], 1e-9))
        ratios["whole"].append(two["cpu_s"] / one["cpu_s"])
        ratios["first_last"].append(two["rate_first_last"] / one["rate_first_last"])
        ratios["start_last"].append(two["rate_start_last"] / one["rate_start_last"])

    def shown(values: list[float]) -> str:
        each = ", ".join(f"{v:.2f}x" for v in values)
        return f"{statistics.median(values):.2f}x ({each})" if len(values) > 1 else f"{each}"

    print()
    print(f"scale-out ({name}), {partitions} partitions, {repeats} pairs of runs (median, then "
          f"each pair): two workers in one group use {shown(ratios['processing'])} the CPU per "
          f"record of one worker from the first to the last prediction (medians "
          f"{statistics.median(per_record['two']):.1f} against "
          f"{statistics.median(per_record['one']):.1f} us); whole processes, start-up "
          f"included: {shown(ratios['whole'])}; throughput first->last "
          f"{shown(ratios['first_last'])}, start->last {shown(ratios['start_last'])} (2 cores, "
          "shared with the broker)")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc; 0.0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def checkpoint_benchmark(bootstrap: str, n_features: int = 1000, n: int = 3000) -> dict:
    """Checkpoint + commit times of an ALMA model with `n_features` features, in process."""
    import numpy as np

    from connectors.broker import create_topics
    from connectors.worker import Worker, WorkerConfig

    rng = np.random.default_rng(0)
    topic = f"wide{n_features}"
    create_topics(bootstrap, [topic])
    w = rng.normal(size=n_features)
    records = []
    for i in range(n):
        x = rng.normal(size=n_features)
        records.append((None, json.dumps({
            "id": i, "x": {f"f{j}": float(v) for j, v in enumerate(x)}, "y": bool(x @ w > 0)
        }).encode()))
    produce(bootstrap, topic, records, 1)
    worker = Worker(WorkerConfig(
        topics=[topic], bootstrap_servers=bootstrap, group_id="bench-wide",
        predictions_topic=f"{topic}.predictions", metrics_topic=f"{topic}.metrics",
        dead_letter_topic=f"{topic}.dead", checkpoint_topic=f"{topic}.checkpoints",
        idle_timeout=0.5, checkpoint_every=250, max_poll_records=250, **GROUP_SETTINGS,
    ))
    worker.run()
    log = [entry for entry in worker.checkpoint_log if entry["partitions"] == 1]
    times = [entry["checkpoint_commit_ms"] for entry in log]
    return {
        "checkpoints": len(times),
        "bytes": log[-1]["bytes"],
        "median_ms": statistics.median(times),
        "max_ms": max(times),
        "flush_outputs_median_ms": statistics.median(e["flush_outputs_ms"] for e in log),
    }


def print_profile(profile: dict, run: dict) -> None:
    stages = dict(profile["stages"])
    startup = stages.pop("startup")
    records = max(1, profile["records"])
    busy = sum(entry["seconds"] for entry in stages.values()) or 1.0
    print(f"per-stage profile of the worker's main thread ({profile['samples']} samples; "
          f"{startup['seconds']:.2f} s before the first record (connect, group join), then "
          f"{busy:.2f} s for {profile['records']} records; wall time, so poll includes waiting "
          "for the broker):")
    print(f"  {'stage':<12}{'share':>8}{'us/record':>11}")
    for stage, entry in sorted(stages.items(), key=lambda item: -item[1]["seconds"]):
        if entry["samples"]:
            print(f"  {stage:<12}{entry['seconds'] / busy:>8.1%}"
                  f"{1e6 * entry['seconds'] / records:>11.1f}")
    first_poll = profile.get("first_poll_at")
    if first_poll is not None:
        print(f"process start -> first poll: {first_poll - run['started_wall']:.2f} s; "
              f"RSS at the first poll: {(profile.get('rss_at_first_poll') or 0) / 2**20:.0f} MiB, "
              f"before the first record: "
              f"{(profile.get('rss_before_first_record') or 0) / 2**20:.0f} MiB; "
              f"first prediction {run['first_prediction_s']:.2f} s after start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default=None,
                        help="comma-separated (default: all, 'baseline' only with --baseline)")
    parser.add_argument("--baseline", metavar="DIR",
                        help="a checkout whose worker runs as the contender 'baseline'")
    parser.add_argument("--baseline-without", metavar="MODULE[,MODULE]", default="",
                        help="modules the baseline cannot import (what installing them changes)")
    parser.add_argument("--cold-cache", action="store_true",
                        help="every worker process starts with an empty numba cache, as in a "
                        "fresh container without `streammargin warmup` (see 'first pred. s')")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--skip-scale-out", action="store_true")
    parser.add_argument("--scale-out-contender", choices=OURS, default="worker",
                        help="which of ours runs the scale-out section (default: worker)")
    parser.add_argument("--scale-out-repeats", type=int, default=3,
                        help="pairs of runs (one worker, two workers) in the scale-out section")
    parser.add_argument("--skip-checkpoint", action="store_true")
    # Internal: run one contender in this process.
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        run = {"quix": run_quix, "loop": run_loop}[args.contender]
        run(args.bootstrap, args.topic, args.out, args.group)
        return
    logging.basicConfig(level=logging.ERROR)
    if args.contenders is None:  # every contender; the baseline when there is one to run
        args.contenders = ",".join(c for c in CONTENDERS if c != "baseline" or args.baseline)
    contenders = [name.strip() for name in args.contenders.split(",") if name.strip()]
    unknown = set(contenders) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; known: {', '.join(CONTENDERS)}")
    n, partitions = args.records, args.partitions
    global COLD_CACHE
    COLD_CACHE = args.cold_cache
    if "baseline" in contenders:
        if not args.baseline:
            parser.error("the contender 'baseline' needs --baseline DIR")
        BASELINE["dir"] = os.path.abspath(args.baseline)
        BASELINE["block"] = args.baseline_without

    from connectors.broker import EmbeddedBroker, create_topics

    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        topic = "bench.in"
        create_topics(bootstrap, [topic, "warm.in"], partitions=partitions)
        produce(bootstrap, topic, make_records(n), partitions)
        produce(bootstrap, "warm.in", make_records(200 * partitions), partitions)
        # Warm the numba cache (the rounds measure warm processes) and the page cache.
        for name in contenders:
            run_contender(name, bootstrap, "warm.in", 200 * partitions, partitions, f"warm-{name}")

        results: dict[str, list[dict]] = {name: [] for name in contenders}
        for round_index in range(args.rounds):
            shift = round_index % len(contenders)
            for name in contenders[shift:] + contenders[:shift]:
                results[name].append(run_contender(name, bootstrap, topic, n, partitions,
                                                   f"{name}-{round_index}"))
                print(f"  round {round_index + 1} {name:<12} "
                      f"{results[name][-1]['rate_first_last']:>8.0f} records/s", flush=True)

        load = os.getloadavg()
        print()
        print(f"{n} labelled JSON events, 10 features, {partitions} partitions, one process per "
              f"contender, {args.rounds} rounds (medians); load average during the run "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
        print(f"worker options: {' '.join(WORKER_OPTIONS)}; worker-fast adds: "
              f"{' '.join(FAST_OPTIONS) or '(nothing yet)'}; worker-librdkafka adds to "
              f"worker-fast: {' '.join(LIBRDKAFKA_OPTIONS)}")
        print()
        print(f"{'contender':<18}{'rec/s first->last':>18}{'rec/s start->last':>18}"
              f"{'first pred. s':>14}{'CPU us/rec':>11}{'proc. CPU':>10}"
              "   first->last of each round")
        for name in contenders:
            rows = results[name]
            print(f"{name:<18}{statistics.median(r['rate_first_last'] for r in rows):>18.0f}"
                  f"{statistics.median(r['rate_start_last'] for r in rows):>18.0f}"
                  f"{statistics.median(r['first_prediction_s'] for r in rows):>14.2f}"
                  f"{statistics.median(r['cpu_us_per_record'] for r in rows):>11.1f}"
                  f"{statistics.median(r['processing_cpu_us_per_record'] for r in rows):>10.1f}"
                  "   "
                  + " ".join(f"{r['rate_first_last']:.0f}" for r in rows))
        print()
        print("ratios (median over rounds of the ratio within each round; CPU/rec: the worker's CPU "
              "per record / the contender's, below 1 = the worker uses less)")
        print(f"{'':<18}{'vs':<18}{'first->last':>12}{'start->last':>12}{'CPU/rec':>9}")
        for ours in OURS:
            if ours not in results:
                continue
            for other in contenders:
                # Each of ours against the later ones of OURS and every other contender.
                if other == ours or (other in OURS and OURS.index(other) < OURS.index(ours)):
                    continue
                pairs = list(zip(results[ours], results[other]))
                first_last = statistics.median(a["rate_first_last"] / b["rate_first_last"]
                                               for a, b in pairs)
                start_last = statistics.median(a["rate_start_last"] / b["rate_start_last"]
                                               for a, b in pairs)
                cpu = statistics.median(a["cpu_s"] / b["cpu_s"] for a, b in pairs)
                print(f"{ours:<18}{other:<18}{first_last:>11.2f}x{start_last:>11.2f}x"
                      f"{cpu:>9.2f}")

        if not args.skip_profile:
            print()
            with tempfile.TemporaryDirectory() as scratch:
                path = os.path.join(scratch, "profile.json")
                run = run_contender("worker", bootstrap, topic, n, partitions, "profile",
                                    ["--profile-stages", path])
                with open(path) as handle:
                    print_profile(json.load(handle), run)

        if not args.skip_scale_out:
            scale_out(args.scale_out_contender, bootstrap, topic, n, partitions,
                      args.scale_out_repeats)

        if not args.skip_checkpoint:
            result = checkpoint_benchmark(bootstrap)
            print()
            print("checkpoint + commit, ALMA with 1000 features "
                  f"({result['bytes']} bytes, {result['checkpoints']} checkpoints): "
                  f"median {result['median_ms']:.1f} ms, max {result['max_ms']:.1f} ms "
                  "(flushing the outputs before it: median "
                  f"{result['flush_outputs_median_ms']:.1f} ms)")


if __name__ == "__main__":
    main()
