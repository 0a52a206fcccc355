"""End-to-end throughput of the Kafka worker against what a user would pick instead.

One broker started for the run (`--broker`: Apache Kafka as one KRaft node, the default, or the
embedded Tansu; the output names it and its version), one input topic (`--records` labelled JSON
events of River's Hyperplane generator, 10 features, keyed, spread over `--partitions`
partitions), and the contenders taking turns on it, each a fresh process with its own consumer
group and output topic, `--rounds` times (the order rotates each round):

- ``worker``: `streammargin kafka --model alma --scale` as the README installs it (kafka-python),
  at-least-once (the default `--processing-guarantee`);
- ``worker-fast``: the same in the project's fastest documented configuration (`FAST_OPTIONS`);
- ``worker-librdkafka``: `worker-fast` on librdkafka (`--transport librdkafka`, the
  ``streammargin[librdkafka]`` extra: confluent-kafka) instead of kafka-python;
- ``worker-eos`` and ``worker-librdkafka-eos``: `worker` on kafka-python and on librdkafka with
  `--processing-guarantee exactly-once` (`EOS_OPTIONS`: each commit interval's outputs,
  checkpoints and input offsets in one Kafka transaction);
- ``worker-topic`` (only when named in `--contenders`): `worker` with `--model-scope topic`
  (issue 25): its partitions share one model, learnt in timestamp order, and it writes that
  model to the model topic every `--mix-every` records. One process owns every partition, so
  there is no peer to mix: this is topic scope's cost on the main thread without peers;
- ``quix`` and ``quix-eos``: a Quix Streams 3.28 app (`Application`, `app.dataframe(topic)
  .apply(...)`, `to_topic`, `app.run()`) running River's `preprocessing.StandardScaler() |
  linear_model.ALMAClassifier()`, one pipeline per input partition, one prediction record per
  input (the worker's fields); `quix` at Quix's defaults (at-least-once), `quix-eos` with
  `processing_guarantee="exactly-once"`;
- ``loop``: a hand-written kafka-python loop (poll, `json.loads`, the same River pipeline,
  `json.dumps`, `send`), with kafka-python's defaults but the fast group settings and the worker's
  compiled CRC-32C (what a user gets with the `crc32c` package);
- ``floor`` and ``floor-1000``: the batch floor (`benchmarks/batch_floor.py`): librdkafka's
  `consume(10000)`, one numba pass over the batch's JSON into arrays, one call of ALMA's compiled
  test-then-train per partition, the predictions written into one buffer, one `produce` a
  prediction (``floor-1000``: a thousand predictions a message), and nothing else: what the
  worker is measured against (issue 47);
- ``worker-1000`` and ``worker-librdkafka-1000``: `worker` and `worker-librdkafka` with
  `--predictions-per-message 1000`, against ``floor-1000``;
- ``worker-cpm`` and ``worker-auto`` (only when named): `worker-librdkafka` with `--model
  convexpolytope` and `--model auto`; with `--baseline DIR`, ``baseline-librdkafka``,
  ``baseline-cpm`` and ``baseline-auto`` run the same on another checkout (before and after).

Exactly-once outputs appear when their transaction commits, so the commit cadence sets when the
harness sees them. Both exactly-once contenders commit at the same cadence: every 10,000 records
of a partition (the worker's `--checkpoint-every` default; Quix: `commit_every` = 10,000 x the
partitions, which Quix counts over all of them) or every `--eos-commit-interval` seconds
(the worker's `--checkpoint-interval`, Quix's `commit_interval`; 1 s by default), whichever
comes first. Their first->last rate counts the records of the commits after the first over the
time between, so it needs many commits per run: `--records 200000` gives ten or more (at 20,000
records, one or two commits make it noise). A contender whose exactly-once is not available (a
`streammargin kafka` without `--processing-guarantee`, options it refuses) is reported "not
available". A run that fails (its process exits, no prediction 45 s after its start, not all
of them in 180 s) is printed with the contender's stderr and counted as failed in that round; the
other contenders go on (kafka-python 3.0 on Apache Kafka sometimes stops heartbeating right
after a join and never rejoins: the worker on kafka-python and the loop then predict nothing).

Every consumer uses session timeout 6 s and heartbeat 1 s (Tansu makes a group join wait about
half the session timeout; librdkafka needs this to join in ~3 s there). Apache Kafka runs with
`connectors.kafka.broker.TEST_SETTINGS`, among them `group.initial.rebalance.delay.ms=0` (a new
group's first join is not held 3 s). The harness reads the output topic with a librdkafka consumer
(`OutputWatch`; read_committed for exactly-once contenders, so that only committed predictions
count) and stops the contender with SIGTERM once every prediction is there. Per run it records:
records/s from the first to the last prediction (the predictions that appear after the first ones
seen, over the time between: a contender that sends a batch of predictions at once must not count
that batch as done in no time), records/s from process start to the last prediction, the
process's CPU seconds per record (user + system, from `os.wait4`: start-up and shutdown
included; the harness and the broker are not counted) and the CPU seconds per record predicted
between the first and the last prediction ("proc. CPU", from /proc: the processing alone),
and its peak RSS at its last prediction ("peak MiB", VmHWM from /proc; the largest of a run's
processes).
Ratios are computed within each round (the machine's speed drifts, a round's contenders see the
same drift), then their median is printed; the section "targets" prints the ratios the
exactly-once issue asks for against their targets.

After the rounds, one more run of each of `--profile-contenders` (``worker`` by default) with
`--profile-stages` prints where its main thread spent its time (poll, decode, scale, model,
metrics, encode, produce, checkpoint), its start-up (process start to the first poll) and RSS;
then two workers in one group against one (CPU seconds per
record while processing and for the whole processes, throughput ratio, the median over
`--scale-out-repeats` pairs of runs; `--scale-out-contender` picks which of ours, ``worker`` by
default). The checkpoint section times checkpoint + commit of an ALMA model with 1000 features.

Run: .venv/bin/python benchmarks/kafka_throughput.py [--broker apache-kafka|tansu]
     [--records 50000] [--rounds 3]
     [--contenders worker,worker-fast,worker-librdkafka,worker-eos,worker-librdkafka-eos,quix,
                   quix-eos,loop,worker-topic]
Quix Streams comes with the `bench` extra (`pip install -e '.[bench]'`, which `make bench` does);
Apache Kafka needs Java 17+ and its jars (`make apache-kafka`); without them the default broker
falls back to Tansu, saying so (`--broker apache-kafka` given explicitly fails instead).
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import common  # (this folder: the script's own)

GROUP_SETTINGS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
# The worker's options in every run, and those of the fastest documented configuration.
WORKER_OPTIONS = ["--model", "alma", "--scale", "--log-level", "WARNING",
                  "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000"]
FAST_OPTIONS: list[str] = ["--checkpoint-every", "100000"]
LIBRDKAFKA_OPTIONS = ["--transport", "librdkafka"]
# Exactly-once contenders commit every EOS_COMMIT_RECORDS records of a partition or every
# `--eos-commit-interval` seconds (EOS_COMMIT_INTERVAL_S), whichever comes first; the worker and
# Quix alike (see the module's docstring).
EOS_COMMIT_RECORDS = 10_000
EOS_COMMIT_INTERVAL_S = 1.0
AT_LEAST_ONCE, EXACTLY_ONCE = "at-least-once", "exactly-once"
CONTENDERS = ("worker", "worker-fast", "worker-librdkafka", "worker-eos", "worker-librdkafka-eos",
              "quix", "quix-eos", "loop", "floor", "floor-1000", "worker-1000",
              "worker-librdkafka-1000", "baseline", "worker-topic", "worker-cpm", "worker-auto",
              "baseline-librdkafka", "baseline-cpm", "baseline-auto")
OURS = ("worker", "worker-fast", "worker-librdkafka", "worker-eos", "worker-librdkafka-eos",
        "worker-topic", "worker-1000", "worker-librdkafka-1000", "worker-cpm", "worker-auto")
# Run only when named in --contenders (not part of the comparison with Quix).
ON_REQUEST = ("baseline", "worker-topic", "worker-cpm", "worker-auto", "baseline-librdkafka",
              "baseline-cpm", "baseline-auto")
# The baselines (`--baseline DIR`): the contender of ours each runs on the other checkout.
BASELINES = {"baseline": "worker", "baseline-librdkafka": "worker-librdkafka",
             "baseline-cpm": "worker-cpm", "baseline-auto": "worker-auto"}
# Contenders that write many predictions a message: the harness counts predictions, not messages.
PER_MESSAGE = {"floor-1000": 1000, "worker-1000": 1000, "worker-librdkafka-1000": 1000}
EXACTLY_ONCE_CONTENDERS = ("worker-eos", "worker-librdkafka-eos", "quix-eos")
# `--baseline DIR`: the contender "baseline" runs the worker of another checkout (e.g. `git
# archive` of an earlier commit), to measure a change against what it replaces in the same run.
BASELINE: dict[str, str] = {}
# `--cold-cache`: every worker process starts with an empty numba cache (a fresh container).
COLD_CACHE = False
TIMEOUT_S = 180.0
# A contender without a single prediction this long after its start has hung (the exactly-once
# ones commit within a second or two of their first records).
FIRST_PREDICTION_TIMEOUT_S = 45.0


def guarantee(name: str) -> str:
    return EXACTLY_ONCE if name in EXACTLY_ONCE_CONTENDERS else AT_LEAST_ONCE


def eos_options() -> list[str]:
    return ["--processing-guarantee", EXACTLY_ONCE,
            "--checkpoint-every", str(EOS_COMMIT_RECORDS),
            "--checkpoint-interval", f"{EOS_COMMIT_INTERVAL_S:g}"]


def worker_options(name: str) -> list[str]:
    """The options of one of OURS beyond WORKER_OPTIONS (a later --model wins)."""
    per_message = ["--predictions-per-message", "1000"]
    return {
        "worker": [],
        "worker-fast": FAST_OPTIONS,
        "worker-librdkafka": [*FAST_OPTIONS, *LIBRDKAFKA_OPTIONS],
        "worker-eos": eos_options(),
        "worker-librdkafka-eos": [*LIBRDKAFKA_OPTIONS, *eos_options()],
        "worker-topic": ["--model-scope", "topic"],
        "worker-1000": per_message,
        "worker-librdkafka-1000": [*FAST_OPTIONS, *LIBRDKAFKA_OPTIONS, *per_message],
        "worker-cpm": [*FAST_OPTIONS, *LIBRDKAFKA_OPTIONS, "--model", "convexpolytope"],
        "worker-auto": [*FAST_OPTIONS, *LIBRDKAFKA_OPTIONS, "--model", "auto"],
    }[name]


def worker_has_processing_guarantee() -> bool:
    """Whether this checkout's `streammargin kafka` takes `--processing-guarantee`."""
    from connectors.cli import kafka_command

    return any(option[0] == "--processing-guarantee" for option in kafka_command.OPTIONS)


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


# Brokers ------------------------------------------------------------------------------------------


def broker_kind(requested: str | None) -> tuple[str, str | None]:
    """The broker to run and, when the default had to fall back to Tansu, why."""
    from connectors.kafka.broker import apache_kafka_unavailable

    if requested == "tansu":
        return "tansu", None
    missing = apache_kafka_unavailable()
    if missing is None:
        return "apache-kafka", None
    if requested == "apache-kafka":
        raise SystemExit(f"--broker apache-kafka: Apache Kafka is not available here: {missing} "
                         "(`make apache-kafka` fetches its jars; or use --broker tansu)")
    return "tansu", missing


def broker_description(broker) -> str:
    """Which broker and version is running, e.g. "Apache Kafka 4.1.1 (one KRaft node, ...)"."""
    from connectors.kafka import broker as brokers

    if broker.kind == "tansu":
        try:
            binary = broker.binary or brokers.tansu_binary()
            version = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                                     timeout=10, check=False).stdout.split()[-1]
        except (OSError, IndexError, subprocess.SubprocessError):
            version = "(version unknown)"
        return f"Tansu {version} (embedded, in-memory storage, {broker.bootstrap_servers})"
    version = brokers.KAFKA_VERSION
    with_jars = brokers.apache_kafka_cache() / "jars.txt"
    try:  # the version of the jar the broker runs, e.g. kafka_2.13-4.1.1.jar
        found = re.search(r"^kafka_[0-9.]+-(\S+)\.jar$", with_jars.read_text(), re.MULTILINE)
        version = found.group(1) if found else version
    except OSError:
        pass
    java = ""
    try:
        shown = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20,
                               check=False).stderr
        found = re.search(r'version "([^"]+)"', shown)
        java = f", Java {found.group(1)}" if found else ""
    except (OSError, subprocess.SubprocessError):
        pass
    return (f"Apache Kafka {version} (one KRaft node, broker + controller in one JVM, log on "
            f"disk{java}, {broker.bootstrap_servers}; connectors.kafka.broker.TEST_SETTINGS: "
            f"group.initial.rebalance.delay.ms="
            f"{broker.settings.get('group.initial.rebalance.delay.ms', '3000 (default)')})")


def warm_broker(bootstrap: str, topic: str) -> None:
    """Create the broker's internal topics before any contender runs, as on a cluster that has
    been serving: `__consumer_offsets` (a group join and an offset commit) and
    `__transaction_state` (one transaction): no contender pays for their creation (the first
    group join or transaction on a fresh Apache Kafka waits for it)."""
    from confluent_kafka import Consumer, KafkaException, Producer

    from connectors.kafka.broker import create_topics

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "bench-warm-broker",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "log_level": 0,
    })
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                consumer.commit(message=message, asynchronous=False)
                break
        else:
            raise RuntimeError(f"warming the broker: no record of {topic} in 60 s")
    finally:
        consumer.close()
    transactions = f"{topic}.transactions"
    create_topics(bootstrap, [transactions])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-warm-broker",
                         "log_level": 0})
    try:
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.produce(transactions, b"warm")
        producer.commit_transaction(60)
    except KafkaException as error:  # then the exactly-once contenders will say so
        print(f"note: the broker did not take a transaction: {error}", flush=True)


# Contenders ---------------------------------------------------------------------------------------


def river_pipeline():
    from river import linear_model, preprocessing

    return preprocessing.StandardScaler() | linear_model.ALMAClassifier()


def run_quix(bootstrap: str, topic: str, out: str, group: str, processing_guarantee: str,
             partitions: int) -> None:
    """The Quix Streams app: River's pipeline per input partition, one prediction per input."""
    from quixstreams import Application, message_context

    if processing_guarantee == EXACTLY_ONCE:
        # The exactly-once worker's commit cadence (the module's docstring); Quix counts
        # commit_every over all partitions, the worker per partition.
        commits = {"commit_every": EOS_COMMIT_RECORDS * partitions,
                   "commit_interval": EOS_COMMIT_INTERVAL_S}
    else:
        commits = {}  # Quix's defaults: every 5 s
    # Quix keeps its state stores under state_dir, "state" in the working directory by default:
    # a folder of its own, removed when the app ends, leaves the checkout clean.
    state_dir = tempfile.mkdtemp(prefix="quix-state-")
    atexit.register(shutil.rmtree, state_dir, True)
    app = Application(
        broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
        loglevel="WARNING", use_changelog_topics=False, state_dir=state_dir,
        processing_guarantee=processing_guarantee, **commits,
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
                      partitions: int, extra: list[str] = ()) -> list:
    if name in OURS:
        return worker_command(bootstrap, topic, out, group, [*worker_options(name), *extra])
    if name in BASELINES:
        command = worker_command(bootstrap, topic, out, group,
                                 [*worker_options(BASELINES[name]), *extra])
        return [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                "sys.modules.update(dict.fromkeys(sys.argv.pop(1).split(','))); "
                "sys.modules.pop('', None); "
                "from connectors.cli import main; sys.exit(main())", BASELINE["dir"],
                BASELINE.get("block", ""), *command[command.index("kafka"):]]
    return [sys.executable, os.path.abspath(__file__), "--contender", name,
            "--bootstrap", bootstrap, "--topic", topic, "--out", out, "--group", group,
            "--partitions", str(partitions), "--eos-commit-interval", f"{EOS_COMMIT_INTERVAL_S!r}"]


# The harness --------------------------------------------------------------------------------------


class OutputWatch:
    """How many records a topic holds, counted by a librdkafka consumer that reads it from the
    start: librdkafka fetches in its own threads, `count` takes what it queued (Message objects
    made in C, nothing decoded in Python).

    `read_committed` (exactly-once contenders): records of open or aborted transactions are not
    counted, nor are the transactions' commit markers, which take an offset each (the high
    watermark counts them). Counting what was consumed also keeps librdkafka fetching: it stops
    once `queued.min.messages` (100,000) records wait in its queue, which only the application's
    poll drains, and with it stop the fetch responses that carry the high watermark (an earlier
    version read the cached watermarks without polling, and any run above 100,000 predictions
    timed out)."""

    BATCH = 10_000

    def __init__(self, bootstrap: str, topic: str, partitions: int, read_committed: bool,
                 batched: bool = False):
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"watch-{topic}",
            "enable.auto.commit": False, "enable.partition.eof": False,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
            "fetch.wait.max.ms": 5, "log_level": 0,
        })
        self.partitions = [TopicPartition(topic, p, 0) for p in range(partitions)]
        self.consumer.assign(self.partitions)
        # Connected and fetching before the contender starts. A topic just created may have no
        # leader yet (Apache Kafka: NOT_LEADER_FOR_PARTITION for a moment): ask again.
        deadline = time.monotonic() + 20
        for tp in self.partitions:
            while True:
                try:
                    self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        self.seen = 0
        # A contender that writes many predictions a message: each prediction counts.
        self.batched = batched

    def count(self, timeout: float = 0.0) -> int:
        """The records seen so far, after taking all that librdkafka queued (waiting up to
        `timeout` seconds for the first)."""
        while True:
            messages = self.consumer.consume(num_messages=self.BATCH, timeout=timeout)
            # A consumer error arrives as a message with error() set: not a record.
            if self.batched:
                self.seen += sum(message.value().count(b'"offset":') for message in messages
                                 if message.error() is None)
            else:
                self.seen += sum(1 for message in messages if message.error() is None)
            if len(messages) < self.BATCH:
                return self.seen
            timeout = 0.0

    def close(self) -> None:
        self.consumer.close()


class ContenderFailed(RuntimeError):
    """A contender's processes exited with an error or missed a timeout."""

    def __init__(self, message: str, exit_codes: list[int]):
        super().__init__(message)
        self.exit_codes = exit_codes  # of the processes that exited by themselves


def run_contender(name: str, bootstrap: str, topic: str, n: int, partitions: int, run_id: str,
                  extra: list[str] = (), members: int = 1) -> dict:
    """Run a contender (`members` processes in one group) until all `n` predictions are out."""
    from connectors.kafka.broker import create_topics

    out = f"out.{run_id}"
    group = f"group.{run_id}"
    create_topics(bootstrap, [out], partitions=partitions)
    watch = OutputWatch(bootstrap, out, partitions, guarantee(name) == EXACTLY_ONCE,
                        batched=name in PER_MESSAGE)
    command = contender_command(name, bootstrap, topic, out, group, partitions, extra)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if COLD_CACHE and name in (*OURS, *BASELINES):
        env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cache-")  # empty: compiles
    started = time.monotonic()
    processes = [subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for _ in range(members)]
    started_wall = time.time()
    first = last = None
    cpu_first = cpu_last = 0.0
    peak_rss = 0
    failure = None
    try:
        while True:
            count = watch.count(timeout=0.002)
            now = time.monotonic()
            if first is None and count > 0:
                first, count_first = now, count
                cpu_first = sum(common.process_cpu(p.pid) for p in processes)
            if count >= n:
                last = now
                cpu_last = sum(common.process_cpu(p.pid) for p in processes)
                peak_rss = max(peak_rss_kib(p.pid) for p in processes)
                break
            if (now - started > TIMEOUT_S
                    or (first is None and now - started > FIRST_PREDICTION_TIMEOUT_S)
                    or any(p.poll() is not None for p in processes)):
                failure = f"{name}: {count} of {n} predictions after {now - started:.0f} s"
                break
    finally:
        exited = [p.returncode for p in processes if p.poll() is not None]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        cpu = 0.0
        errors = []
        for process in processes:
            try:
                _, status, usage = os.wait4(process.pid, 0)
                process.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:  # reaped by poll(): its returncode stands, its CPU is lost
                usage = None
            if usage is not None:
                cpu += usage.ru_utime + usage.ru_stime
            stderr = process.stderr.read().decode(errors="replace")
            if process.returncode not in (0, -signal.SIGTERM) or failure:
                errors.append(f"exit {process.returncode}: {stderr.strip()[-2000:]}")
        watch.close()
    if failure or errors:
        raise ContenderFailed((failure or f"{name} failed") + "\n" + "\n".join(errors), exited)
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
        "peak_rss_mib": peak_rss / 1024 if peak_rss else float("nan"),
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
        try:
            one = run_contender(name, bootstrap, topic, n, partitions, f"scale-1-{repeat}")
            two = run_contender(name, bootstrap, topic, n, partitions, f"scale-2-{repeat}",
                                members=2)
        except ContenderFailed as error:
            print(f"  scale-out pair {repeat + 1} FAILED: {error}", flush=True)
            continue
        per_record["one"].append(one["processing_cpu_us_per_record"])
        per_record["two"].append(two["processing_cpu_us_per_record"])
        ratios["processing"].append(two["processing_cpu_us_per_record"]
                                    / max(one["processing_cpu_us_per_record"], 1e-9))
        ratios["whole"].append(two["cpu_s"] / one["cpu_s"])
        ratios["first_last"].append(two["rate_first_last"] / one["rate_first_last"])
        ratios["start_last"].append(two["rate_start_last"] / one["rate_start_last"])

    if not ratios["processing"]:
        print(f"\nscale-out ({name}): every pair failed")
        return

    def shown(values: list[float]) -> str:
        each = ", ".join(f"{v:.2f}x" for v in values)
        return f"{statistics.median(values):.2f}x ({each})" if len(values) > 1 else f"{each}"

    pairs = len(ratios["processing"])
    print()
    print(f"scale-out ({name}), {partitions} partitions, {pairs} pairs of runs (median, then "
          f"each pair): two workers in one group use {shown(ratios['processing'])} the CPU per "
          f"record of one worker from the first to the last prediction (medians "
          f"{statistics.median(per_record['two']):.1f} against "
          f"{statistics.median(per_record['one']):.1f} us); whole processes, start-up "
          f"included: {shown(ratios['whole'])}; throughput first->last "
          f"{shown(ratios['first_last'])}, start->last {shown(ratios['start_last'])} (2 cores, "
          "shared with the broker)")


def peak_rss_kib(pid: int) -> int:
    """A running process's peak RSS since its exec, KiB (VmHWM in /proc; 0 elsewhere). Not
    `ru_maxrss` from wait4: Linux carries that across exec, so a child started by this harness
    reported the harness's own peak (227 MiB for every contender)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def checkpoint_benchmark(bootstrap: str, n_features: int = 1000, n: int = 3000) -> dict:
    """Checkpoint + commit times of an ALMA model with `n_features` features, in process."""
    import numpy as np

    from connectors.kafka.broker import create_topics
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


def print_profile(name: str, profile: dict, run: dict) -> None:
    stages = dict(profile["stages"])
    startup = stages.pop("startup")
    records = max(1, profile["records"])
    busy = sum(entry["seconds"] for entry in stages.values()) or 1.0
    print(f"per-stage profile of {name}'s main thread ({profile['samples']} samples; "
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


# Reports ------------------------------------------------------------------------------------------

# The ratios the exactly-once issue asks for: (what, ours, against, target on first->last).
TARGETS = [
    ("exactly-once vs at-least-once, same broker, kafka-python", "worker-eos", "worker", 0.8),
    ("exactly-once vs at-least-once, same broker, librdkafka (against the fastest documented "
     "at-least-once)", "worker-librdkafka-eos", "worker-librdkafka", 0.8),
    ("exactly-once vs Quix exactly-once, kafka-python", "worker-eos", "quix-eos", 2.0),
    ("exactly-once vs Quix exactly-once, librdkafka", "worker-librdkafka-eos", "quix-eos", 2.0),
    ("at-least-once vs Quix, fastest documented configuration", "worker-librdkafka", "quix", 2.0),
    ("at-least-once vs Quix, default install", "worker", "quix", 1.3),
    ("topic scope vs partition scope, one worker (issue 25)", "worker-topic", "worker", 0.9),
    ("the batch floor, librdkafka (issue 47)", "worker-librdkafka", "floor", 0.6),
    ("the batch floor, default install (issue 47)", "worker", "floor", 0.4),
    ("the batch floor, 1,000 predictions a message, librdkafka (issue 47)",
     "worker-librdkafka-1000", "floor-1000", 0.6),
    ("the batch floor, 1,000 predictions a message, default install (issue 47)", "worker-1000",
     "floor-1000", 0.6),
]
# CPU per record while processing (first to last prediction) against the floor's: at most.
CPU_TARGETS = [
    ("the batch floor's CPU per record, librdkafka (issue 47)", "worker-librdkafka", "floor", 2.5),
    ("the batch floor's CPU per record, default install (issue 47)", "worker", "floor", 2.5),
]


def completed(rows: list) -> list[dict]:
    return [row for row in rows if row is not None]


def median_of(rows: list, key: str) -> float:
    """The median of `key` over the rounds that completed and measured it (NaN: none did)."""
    values = [row[key] for row in completed(rows) if row[key] == row[key]]
    return statistics.median(values) if values else float("nan")


def round_ratios(results: dict, ours: str, other: str, key: str) -> list[float]:
    """Per round where both completed and measured `key`: ours / other."""
    ratios = []
    for a, b in zip(results[ours], results[other]):
        if a is not None and b is not None and a[key] == a[key] and b[key] == b[key]:
            ratios.append(a[key] / b[key])
    return ratios


def shown_ratio(values: list[float], unit: str = "x") -> str:
    return f"{statistics.median(values):.2f}{unit}" if values else "n/a"


def print_results(results: dict, contenders: list[str], unavailable: dict[str, str], n: int,
                  partitions: int, rounds: int, broker: str) -> None:
    load = os.getloadavg()
    print()
    print(f"broker: {broker}")
    print(f"{n} labelled JSON events, 10 features, {partitions} partitions, one process per "
          f"contender, {rounds} rounds (medians); load average at the end of the rounds "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    print(f"worker options: {' '.join(WORKER_OPTIONS)}; worker-fast adds: "
          f"{' '.join(FAST_OPTIONS) or '(nothing yet)'}; worker-librdkafka adds to "
          f"worker-fast: {' '.join(LIBRDKAFKA_OPTIONS)}; worker-eos adds to worker: "
          f"{' '.join(eos_options())}; worker-librdkafka-eos: worker-eos with "
          f"{' '.join(LIBRDKAFKA_OPTIONS)}")
    print(f"quix: Quix's defaults (commit every 5 s); quix-eos: processing_guarantee="
          f"\"exactly-once\", commit_every={EOS_COMMIT_RECORDS * partitions}, "
          f"commit_interval={EOS_COMMIT_INTERVAL_S:g}; exactly-once outputs read with "
          "isolation.level=read_committed")
    print()
    print(f"{'contender':<23}{'guarantee':<15}{'rec/s first->last':>18}{'rec/s start->last':>18}"
          f"{'first pred. s':>14}{'CPU us/rec':>11}{'proc. CPU':>10}{'peak MiB':>9}"
          "   first->last of each round")
    for name in contenders:
        if name in unavailable:
            print(f"{name:<23}{guarantee(name):<15}not available: {unavailable[name]}")
            continue
        rows = results[name]
        if not completed(rows):
            print(f"{name:<23}{guarantee(name):<15}failed in every round")
            continue
        print(f"{name:<23}{guarantee(name):<15}{median_of(rows, 'rate_first_last'):>18.0f}"
              f"{median_of(rows, 'rate_start_last'):>18.0f}"
              f"{median_of(rows, 'first_prediction_s'):>14.2f}"
              f"{median_of(rows, 'cpu_us_per_record'):>11.1f}"
              f"{median_of(rows, 'processing_cpu_us_per_record'):>10.1f}"
              f"{median_of(rows, 'peak_rss_mib'):>9.0f}"
              "   " + " ".join("failed" if r is None else f"{r['rate_first_last']:.0f}"
                               for r in rows))
    print()
    print("ratios, same guarantee (median over rounds of the ratio within each round; CPU/rec: "
          "the worker's CPU per record / the contender's, below 1 = the worker uses less)")
    print(f"{'':<23}{'vs':<23}{'first->last':>12}{'start->last':>12}{'CPU/rec':>9}")
    for ours in OURS:
        if ours not in results:
            continue
        for other in contenders:
            # Each of ours against the later ones of OURS and every other contender, when both
            # give the same guarantee (the targets below compare the guarantees).
            if (other == ours or other not in results or guarantee(other) != guarantee(ours)
                    or (other in OURS and OURS.index(other) < OURS.index(ours))):
                continue
            print(f"{ours:<23}{other:<23}"
                  f"{shown_ratio(round_ratios(results, ours, other, 'rate_first_last')):>12}"
                  f"{shown_ratio(round_ratios(results, ours, other, 'rate_start_last')):>12}"
                  f"{shown_ratio(round_ratios(results, ours, other, 'cpu_s'), ''):>9}")


def print_targets(results: dict, unavailable: dict[str, str], broker: str, n: int,
                  partitions: int) -> None:
    print()
    print(f"targets (on {broker}; throughput = records/s from the first to the last prediction, "
          "median over rounds of the ratio within each round, each round's in brackets; "
          "start->last beside it)")
    commits = n // (EOS_COMMIT_RECORDS * partitions)
    if commits < 10 and any(name in results for name in EXACTLY_ONCE_CONTENDERS):
        print(f"  (about {commits} exactly-once commit(s) per run: too few for their first->last "
              "rate, which counts the commits after the first; --records 200000 gives ten)")
    for what, ours, other, target in TARGETS:
        missing = [name for name in (ours, other) if name not in results or name in unavailable]
        label = f"  {what}: {ours} / {other}"
        if missing:
            reasons = "; ".join(f"{name}: {unavailable.get(name, 'not in --contenders')}"
                                for name in missing)
            print(f"{label}: not available ({reasons})")
            continue
        first_last = round_ratios(results, ours, other, "rate_first_last")
        start_last = round_ratios(results, ours, other, "rate_start_last")
        if not first_last:
            print(f"{label}: no round measured both (start->last {shown_ratio(start_last)}); "
                  f"target >= {target}x")
            continue
        median = statistics.median(first_last)
        each = ", ".join(f"{v:.2f}" for v in first_last)
        print(f"{label}: {median:.2f}x [{each}], start->last {shown_ratio(start_last)}; "
              f"target >= {target}x: {'met' if median >= target else 'NOT met'}")
    for what, ours, other, target in CPU_TARGETS:
        if any(name not in results or name in unavailable for name in (ours, other)):
            continue
        cpu = round_ratios(results, ours, other, "processing_cpu_us_per_record")
        if cpu:
            median = statistics.median(cpu)
            each = ", ".join(f"{v:.2f}" for v in cpu)
            print(f"  {what}: {ours} / {other}: {median:.2f}x [{each}]; target <= {target}x: "
                  f"{'met' if median <= target else 'NOT met'}")
    # Start-up, side by side: process start -> first prediction.
    sides = []
    for names in (("worker", "worker-librdkafka", "quix"),
                  ("worker-eos", "worker-librdkafka-eos", "quix-eos")):
        shown = [f"{name} {median_of(results[name], 'first_prediction_s'):.2f} s"
                 for name in names if name in results and name not in unavailable
                 and completed(results[name])]
        if shown:
            sides.append(", ".join(shown))
    if sides:
        print(f"  process start -> first prediction (median): {'; '.join(sides)}")


def main() -> None:
    common.exit_on_sigterm()  # (a kill stops the broker too)
    global COLD_CACHE, EOS_COMMIT_INTERVAL_S
    from connectors.kafka.broker import BROKERS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--broker", choices=BROKERS, default=None,
                        help="the broker the run starts (default: apache-kafka, or tansu with a "
                        "note where Java or Apache Kafka's jars are missing)")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default=None,
                        help="comma-separated (default: all, 'baseline' only with --baseline)")
    parser.add_argument("--eos-commit-interval", type=float, default=EOS_COMMIT_INTERVAL_S,
                        metavar="SECONDS", help="exactly-once contenders commit at least this "
                        f"often, and every {EOS_COMMIT_RECORDS} records of a partition "
                        f"(default {EOS_COMMIT_INTERVAL_S:g})")
    parser.add_argument("--baseline", metavar="DIR",
                        help="a checkout whose worker runs as the contender 'baseline'")
    parser.add_argument("--baseline-without", metavar="MODULE[,MODULE]", default="",
                        help="modules the baseline cannot import (what installing them changes)")
    parser.add_argument("--cold-cache", action="store_true",
                        help="every worker process starts with an empty numba cache, as in a "
                        "fresh container without `streammargin warmup` (see 'first pred. s')")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--profile-contenders", default="worker", metavar="NAME[,NAME]",
                        help="the contenders of ours run once more with --profile-stages")
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
    EOS_COMMIT_INTERVAL_S = args.eos_commit_interval
    if args.contender:
        if args.contender in ("quix", "quix-eos"):
            run_quix(args.bootstrap, args.topic, args.out, args.group, guarantee(args.contender),
                     args.partitions)
        elif args.contender in ("floor", "floor-1000"):
            import batch_floor  # (this folder: the floor's numba code)

            batch_floor.run(args.bootstrap, args.topic, args.out, args.group,
                            PER_MESSAGE.get(args.contender, 1))
        else:
            run_loop(args.bootstrap, args.topic, args.out, args.group)
        return
    logging.basicConfig(level=logging.ERROR)
    if args.contenders is None:  # every contender; the baseline when there is one to run
        args.contenders = ",".join(c for c in CONTENDERS if c not in ON_REQUEST
                                   or (c == "baseline" and args.baseline))
    contenders = [name.strip() for name in args.contenders.split(",") if name.strip()]
    unknown = set(contenders) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; known: {', '.join(CONTENDERS)}")
    n, partitions = args.records, args.partitions
    COLD_CACHE = args.cold_cache
    if set(contenders) & set(BASELINES):
        if not args.baseline:
            parser.error("the baseline contenders need --baseline DIR")
        BASELINE["dir"] = os.path.abspath(args.baseline)
        BASELINE["block"] = args.baseline_without
    # Contenders that cannot run here, and why: reported as "not available", not run.
    unavailable: dict[str, str] = {}
    if not worker_has_processing_guarantee():
        for name in ("worker-eos", "worker-librdkafka-eos"):
            if name in contenders:
                unavailable[name] = ("this checkout's `streammargin kafka` has no "
                                     "--processing-guarantee")

    from connectors.kafka.broker import create_topics, make_broker

    kind, fell_back = broker_kind(args.broker)
    if fell_back:
        print(f"note: Apache Kafka is not available here ({fell_back}): running on Tansu; "
              "the issue's targets are for Apache Kafka", flush=True)
    with make_broker(kind) as broker:
        described = broker_description(broker)
        print(f"broker: {described}", flush=True)
        bootstrap = broker.bootstrap_servers
        topic = "bench.in"
        create_topics(bootstrap, [topic, "warm.in"], partitions=partitions)
        produce(bootstrap, topic, make_records(n), partitions)
        produce(bootstrap, "warm.in", make_records(200 * partitions), partitions)
        warm_broker(bootstrap, "warm.in")
        # Warm the numba cache (the rounds measure warm processes) and the page cache. A
        # contender that refuses its options (exit 2: e.g. a transport without exactly-once) is
        # reported "not available"; one that fails otherwise still takes its turns in the rounds.
        for name in contenders:
            if name in unavailable:
                continue
            try:
                run_contender(name, bootstrap, "warm.in", 200 * partitions, partitions,
                              f"warm-{name}")
            except ContenderFailed as error:
                lines = [line for line in str(error).splitlines() if line.strip()]
                if error.exit_codes and all(code == 2 for code in error.exit_codes):
                    unavailable[name] = f"its options were refused: {lines[-1][:300]}"
                    print(f"  {name}: not available ({unavailable[name]})", flush=True)
                else:
                    print(f"  warm-up {name} FAILED: {error}", flush=True)
        running = [name for name in contenders if name not in unavailable]

        results: dict[str, list] = {name: [] for name in running}
        for round_index in range(args.rounds):
            shift = round_index % max(1, len(running))
            for name in running[shift:] + running[:shift]:
                try:
                    run = run_contender(name, bootstrap, topic, n, partitions,
                                        f"{name}-{round_index}")
                except ContenderFailed as error:
                    # Recorded as failed for this round; the other contenders go on.
                    results[name].append(None)
                    print(f"  round {round_index + 1} {name:<23} FAILED: {error}", flush=True)
                    continue
                results[name].append(run)
                print(f"  round {round_index + 1} {name:<23}"
                      f"{run['rate_first_last']:>8.0f} records/s first->last, first prediction "
                      f"{run['first_prediction_s']:.2f} s", flush=True)

        print_results(results, contenders, unavailable, n, partitions, args.rounds, described)
        print_targets(results, unavailable, described, n, partitions)

        profiled = [] if args.skip_profile else args.profile_contenders.split(",")
        for index, name in enumerate(profiled):
            print()
            with tempfile.TemporaryDirectory() as scratch:
                path = os.path.join(scratch, "profile.json")
                try:
                    # (each run its own output topic: one already full would end it at once)
                    run = run_contender(name, bootstrap, topic, n, partitions,
                                        f"profile{index}", ["--profile-stages", path])
                except ContenderFailed as error:
                    print(f"per-stage profile: the {name} run FAILED: {error}")
                else:
                    with open(path) as handle:
                        print_profile(name, json.load(handle), run)

        if not args.skip_scale_out:
            if args.scale_out_contender in unavailable:
                print(f"\nscale-out ({args.scale_out_contender}): not available "
                      f"({unavailable[args.scale_out_contender]})")
            else:
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
