"""What the README and docs/kafka.md promise, shown on Apache Kafka itself (`ApacheKafkaBroker`).

Apache Kafka does what the embedded Tansu does not, and each test here leans on one of those:
a dead member keeps its partitions until its session expires (classic and KIP-848 groups), the
log cleaner really compacts the checkpoint topic (superseded chunks, tombstones), and the broker
keeps its log across a crash. Each test skips with one line on another broker.

- three worker processes share a topic: one SIGKILLed, one stopped, the third takes over; every
  input offset is predicted, duplicates are exactly the killed worker's records after its last
  checkpoint, and each partition's model is an uninterrupted run's (classic groups on
  kafka-python and librdkafka, KIP-848 on librdkafka);
- chunked checkpoints restore exactly after the cleaner compacted their topic, and while it
  compacts it;
- the broker SIGKILLed mid-stream and started again on its log: the worker waits, goes on and
  ends with every offset predicted and the uninterrupted model (both transports);
- a broker (either kind) ends with the process that started it, killed outright;
- dead letters of every kind the codec and the model refuse, and the metrics records, as the
  README's tables describe them (what tests/test_kafka_worker.py does not check already).

Defects these tests found are named by the exception that shows each, so that any other
failure still fails: a KIP-848 group on librdkafka (`KIP848AssignRefused`); on kafka-python, a
restore after the broker's restart that misses the checkpoints (`RestoreMissedCheckpoints`) and
a worker that exits during the outage (`OutageStoppedWorker`), both fixed.
"""

from __future__ import annotations

import json
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import conftest
import pytest
import test_kafka_worker as w

import streammargin
from connectors import schemas
from connectors.kafka.broker import ApacheKafkaBroker, create_topics
from connectors.state import checkpoint
from connectors.worker.worker import Worker

pytestmark = pytest.mark.kafka

# Group timings of every worker here: Apache Kafka's TEST_SETTINGS give KIP-848 groups the same.
GROUP = ("--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000")
SESSION = {"session_timeout_ms": 6_000, "heartbeat_interval_ms": 1_000}  # in-process workers
needs_librdkafka = pytest.mark.skipif(not w._librdkafka_installed(),
                                      reason="confluent-kafka is not installed")


def require_apache_kafka() -> None:
    kind = conftest.test_broker_kind()[0]
    if kind != "apache-kafka":
        pytest.skip(f"needs Apache Kafka (the Kafka tests run on {kind} here)")


def create_outputs(bootstrap: str, cfg, partitions: int) -> None:
    """The worker's output and checkpoint topics, created and led before a worker starts.

    A worker creates missing ones itself, but Apache Kafka answers CreateTopics before it
    serves the topic: a librdkafka worker assigned its partitions at once (KIP-848) restores
    within ~80 ms of creating its checkpoint topic, is told UNKNOWN_TOPIC_OR_PART and stops
    ("checkpoint topic ... has no partitions", `CheckpointStore.n_partitions`), ~1 start in 3.
    That race is not what these tests are about.
    """
    create_topics(bootstrap, [cfg.predictions_topic, cfg.metrics_topic, cfg.dead_letter_topic],
                  partitions=partitions)
    create_topics(bootstrap, [cfg.checkpoint_topic], compacted=True)


class Reader:
    """Reads whole topics again and again with one consumer (no bootstrap per read: the reads
    happen while a worker is frozen, which must stay well within its session timeout)."""

    def __init__(self, bootstrap: str):
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                      enable_auto_commit=False, fetch_max_wait_ms=20)

    def records(self, topic: str, timeout: float = 20.0) -> list:
        from kafka import TopicPartition

        consumer = self.consumer
        partitions = [TopicPartition(topic, p)
                      for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        return records

    def end(self, topic: str, partition: int = 0) -> int:
        from kafka import TopicPartition

        tp = TopicPartition(topic, partition)
        return self.consumer.end_offsets([tp])[tp]

    def predicted(self, topic: str) -> dict[int, list[int]]:
        """The input offsets of the predictions of each input partition, in the order written."""
        found: dict[int, list[int]] = {}
        for record in self.records(topic):
            prediction = json.loads(record.value)
            assert record.partition == prediction["partition"]  # co-partitioned
            found.setdefault(prediction["partition"], []).append(prediction["offset"])
        return found

    def checkpointed(self, cfg, partitions) -> dict[int, list[int]]:
        """The next offset of every checkpoint written for each input partition, in write
        order (one-record checkpoints: the default chunk size holds these models)."""
        keys = {checkpoint.checkpoint_key(cfg.group_id, cfg.topics[0], p): p for p in partitions}
        found: dict[int, list[int]] = {p: [] for p in partitions}
        for record in self.records(cfg.checkpoint_topic):
            partition = keys.get(record.key)
            if partition is None or record.value is None:
                continue
            head = checkpoint.read_head(record.value, record.offset, 1 << 30)
            assert isinstance(head, checkpoint.Inline), head
            found[partition].append(checkpoint.decode_checkpoint(head.payload)["next_offset"])
        return found

    def close(self) -> None:
        self.consumer.close()


def owned(log_text: str, name: str) -> set[int]:
    """The partitions a worker owns by its log: restored ("assigned"), less revoked or lost."""
    partitions: set[int] = set()
    pattern = re.compile(r"connectors\.worker: (assigned|revoked|lost) (.*)$")
    for line in log_text.splitlines():
        found = pattern.search(line)
        if found is None:
            continue
        named = {int(p) for p in re.findall(rf"{re.escape(name)}/(\d+)", found.group(2))}
        if found.group(1) == "assigned":
            partitions |= named
        else:
            partitions -= named
    return partitions


def run_to_idle(cfg, timeout: float = 90.0) -> dict:
    """`Worker(cfg).run()` in this process, stopped (and failed) if not idle within `timeout`
    seconds: a worker that never goes idle fails the test instead of hanging it."""
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    timer.start()
    try:
        summary = Worker(cfg).run(stop_event=stop)
    finally:
        timer.cancel()
    assert summary["reason"] == "idle", f"the worker was not idle after {timeout} s: {summary}"
    return summary


def assert_final_models(bootstrap: str, cfg, data, partitions: int, n: int) -> None:
    """Each partition's latest checkpoint is at its end with an uninterrupted run's model."""
    tasks = w.saved_tasks(bootstrap, cfg, range(partitions))
    for partition in range(partitions):
        model, _ = w.straight_run(data[partition::partitions], streammargin.ALMAClassifier())
        assert tasks[partition]["next_offset"] == n
        assert w.saved_model_bytes(tasks[partition]) == w.model_bytes(model), partition


class Producer(threading.Thread):
    """Sends `(partition, value)` items in slices of `per_slice`, `pause` seconds apart (one
    producer, each slice flushed): a live stream. `halt()` returns as soon as a slice is
    flushed, and stops it there; `sent` counts the items flushed."""

    def __init__(self, bootstrap: str, topic: str, items, per_slice: int, pause: float):
        super().__init__(daemon=True)
        self.args = (bootstrap, topic, items, per_slice, pause)
        self.error: BaseException | None = None
        self.sent = 0
        self._halt = threading.Event()

    def run(self) -> None:
        from kafka import KafkaProducer

        bootstrap, topic, items, per_slice, pause = self.args
        try:
            producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
            try:
                for start in range(0, len(items), per_slice):
                    for partition, value in items[start:start + per_slice]:
                        producer.send(topic, value, partition=partition)
                    producer.flush()
                    self.sent = min(len(items), start + per_slice)
                    if self._halt.is_set():
                        break
                    time.sleep(pause)
            finally:
                producer.close()
        except BaseException as error:  # reported by finish()
            self.error = error

    def halt(self) -> None:
        self._halt.set()
        self.finish()

    def finish(self, timeout: float = 60) -> None:
        self.join(timeout)
        assert not self.is_alive(), "the producer did not finish"
        assert self.error is None, self.error


# 1. Three workers: a SIGKILL, a stop, a takeover ------------------------------------------------

PARTITIONS = 6
PER_PARTITION = 800
CHECKPOINT_EVERY = 150
MAX_POLL = 50


class KIP848AssignRefused(AssertionError):
    """A worker on librdkafka in a KIP-848 group died at its first assignment:
    `LibrdkafkaTransport._on_assign` calls `Consumer.assign()`, the eager protocol's call, and
    librdkafka refuses it in a KIP-848 group ("Failed to set assignment: Local: Erroneous
    state"), whose assignments are incremental (`incremental_assign()`). Raised inside
    `consume`, the error reaches the worker as "SystemError: <built-in function isinstance>
    returned a result with an exception set" (the client's log callback runs with it set)."""

    signs = ("Failed to set assignment: Local: Erroneous state",
             "SystemError: <built-in function isinstance> returned a result with an exception set")


@pytest.mark.parametrize("client", [
    pytest.param(("kafka-python",), id="classic-kafka-python"),
    pytest.param(("librdkafka",), id="classic-librdkafka", marks=needs_librdkafka),
    pytest.param(("librdkafka", "--consumer-config", "group.protocol=consumer"),
                 id="kip848-librdkafka", marks=needs_librdkafka),
])
def test_three_workers_a_sigkill_and_a_stop_the_survivor_ends_with_every_model(
    client, kafka_broker, tmp_path
):
    require_apache_kafka()
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("trio")
    create_topics(bootstrap, [name], partitions=PARTITIONS)
    cfg = w.config(bootstrap, name)
    create_outputs(bootstrap, cfg, PARTITIONS)
    data = w.labelled_stream(PARTITIONS * PER_PARTITION, seed=53)
    items = [(i % PARTITIONS, w.event(i, x, y)) for i, (x, y) in enumerate(data)]
    first = PARTITIONS * 200
    w.produce(bootstrap, name, items[:first])
    transport, *consumer_config = client
    options = (*GROUP, "--transport", transport, *consumer_config, "--checkpoint-every",
               str(CHECKPOINT_EVERY), "--max-poll-records", str(MAX_POLL))
    logs = {role: tmp_path / f"{role}.log" for role in ("killed", "stopped", "survivor")}
    workers = {
        "killed": w.start_worker(cfg, logs["killed"], *options),
        "stopped": w.start_worker(cfg, logs["stopped"], *options),
        # Idle once caught up for 5 s: after the killed worker's session (6 s) expired.
        "survivor": w.start_worker(cfg, logs["survivor"], *options, "--idle-timeout", "5"),
    }
    # The rest of the stream, in ~6 s.
    producer = Producer(bootstrap, name, items[first:], per_slice=60, pause=0.1)
    reader = Reader(bootstrap)

    def ownership() -> dict[str, set[int]]:
        return {role: owned(log.read_text() if log.exists() else "", name)
                for role, log in logs.items()}

    def settled():
        for role, worker in workers.items():
            if worker.poll() is not None:
                text = logs[role].read_text()
                error = (KIP848AssignRefused if consumer_config and any(
                    sign in text for sign in KIP848AssignRefused.signs) else AssertionError)
                raise error(f"the {role} worker exited early:\n{text[-3000:]}")
        # The three are members and own the partitions between them.
        found = ownership()
        sizes = [len(p) for p in found.values()]
        return all(sizes) and sum(sizes) == PARTITIONS and set().union(*found.values()) == set(
            range(PARTITIONS))

    def left_behind(partitions) -> tuple[dict[int, int], dict[int, int]] | None:
        # The last offset predicted and the offset of the last checkpoint of each partition;
        # None while one has no checkpoint yet (a KIP-848 group can hand a partition to the
        # worker moments before the freeze, before its first CHECKPOINT_EVERY records).
        predicted = reader.predicted(cfg.predictions_topic)
        saved = reader.checkpointed(cfg, partitions)
        if not all(saved.values()):
            return None
        return ({p: max(predicted.get(p, [-1])) for p in partitions},
                {p: saved[p][-1] for p in partitions})

    try:
        w.wait_for(settled, 90, "three workers sharing the partitions")
        producer.start()
        time.sleep(1.5)  # mid-stream
        killed = workers["killed"]
        # Frozen, the worker's last checkpoints and predictions can be read: it is SIGKILLed
        # once it has predictions after the last checkpoint of a partition, so that one replays.
        for _ in range(50):
            killed.send_signal(signal.SIGSTOP)
            time.sleep(0.2)  # what it sent before the signal lands
            mine = owned(logs["killed"].read_text(), name)
            found = left_behind(mine)
            if found is not None and any(found[0][p] >= found[1][p] for p in mine):
                break
            killed.send_signal(signal.SIGCONT)
            time.sleep(0.1)
        else:
            raise AssertionError("the worker to kill never had predictions after a checkpoint")
        killed.send_signal(signal.SIGKILL)
        w.reap(killed, logs["killed"])
        # Its partitions stay its own until its session expires (6 s): what it left is read now.
        time.sleep(0.3)
        mine = owned(logs["killed"].read_text(), name)
        assert mine, logs["killed"].read_text()[-3000:]
        found = left_behind(mine)
        assert found is not None, mine  # (the frozen worker's checkpoints were read above)
        top, restart = found
        assert any(top[p] >= restart[p] for p in mine)

        time.sleep(1.0)  # the stop comes while the killed worker is still a member
        workers["stopped"].send_signal(signal.SIGTERM)  # graceful: checkpoint, commit, leave
        assert w.reap(workers["stopped"], logs["stopped"]) == 0, logs["stopped"].read_text()
        producer.finish()
        assert w.reap(workers["survivor"], logs["survivor"], timeout=120) == 0, (
            logs["survivor"].read_text()[-3000:])
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        if producer.ident is not None:
            producer.join(30)
        reader.close()

    survivor = logs["survivor"].read_text()
    assert '"reason": "idle"' in survivor, survivor[-2000:]
    # It took the killed worker's partitions over from their checkpoints.
    restored = [int(n) for n in re.findall(r"\((\d+) restored from checkpoints,", survivor)]
    assert sum(restored) >= len(mine), survivor
    # Every input offset predicted, in order; the only repeats are the killed worker's records
    # after its last checkpoint of each partition (at-least-once), fewer than a checkpoint
    # interval and a poll; the stopped worker's partitions and the rebalances repeat nothing.
    reader = Reader(bootstrap)
    try:
        offsets = reader.predicted(cfg.predictions_topic)
    finally:
        reader.close()
    for partition in range(PARTITIONS):
        expected = list(range(PER_PARTITION))
        if partition in mine and top[partition] >= restart[partition]:
            assert top[partition] + 1 - restart[partition] < CHECKPOINT_EVERY + MAX_POLL
            expected = [*range(top[partition] + 1), *range(restart[partition], PER_PARTITION)]
        assert offsets[partition] == expected, (partition, mine, top, restart)
    assert_final_models(bootstrap, cfg, data, PARTITIONS, PER_PARTITION)


# 2. Chunked checkpoints on a topic the log cleaner compacts -------------------------------------


def create_compacting_topic(bootstrap: str, topic: str) -> None:
    """A compacted topic the cleaner works on within a second: segments roll every 100 ms
    (Kafka 4 refuses segment.bytes below 1 MiB), any dirt is worth a pass, tombstones go soon."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1,
                                      topic_configs={
                                          "cleanup.policy": "compact",
                                          "segment.bytes": str(1 << 20),
                                          "segment.ms": "100",
                                          "min.cleanable.dirty.ratio": "0.01",
                                          "min.compaction.lag.ms": "0",
                                          "delete.retention.ms": "100",
                                      })])
    finally:
        admin.close()
    create_topics(bootstrap, [topic])  # returns once it is led


def cleanings(broker, topic: str) -> int:
    """How many passes the log cleaner made over the topic's partition 0, by the broker's log."""
    text = broker.log_path.read_text(errors="replace")
    return len(re.findall(rf"cleaned log {re.escape(topic)}-0 ", text))


class Churn(threading.Thread):
    """Another tenant of the checkpoint topic: 50 keys written over and over, ~300 records/s,
    so that segments keep rolling and the cleaner keeps compacting the partition."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from kafka import KafkaProducer

        try:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
            i = 0
            while not self.stop.is_set():
                for _ in range(15):
                    producer.send(self.topic, b"c" * 1000, key=b"churn/%d" % (i % 50))
                    i += 1
                producer.flush()
                time.sleep(0.05)
            producer.close()
        except BaseException as error:  # reported by finish()
            self.error = error

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert self.error is None, self.error


@w.both_transports
def test_chunked_checkpoints_restore_exactly_after_and_while_the_cleaner_compacts_them(
    transport, kafka_broker
):
    require_apache_kafka()
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("compacted")
    create_topics(bootstrap, [name])
    cfg = w.config(bootstrap, name, transport=transport, checkpoint_every=25,
                   checkpoint_chunk_bytes=1024, max_poll_records=100, **SESSION)
    create_topics(bootstrap, [cfg.predictions_topic, cfg.metrics_topic, cfg.dead_letter_topic])
    create_compacting_topic(bootstrap, cfg.checkpoint_topic)
    # The model grows with the words seen: checkpoints of several 1 KiB chunks, each replacing
    # the last one's chunks (tombstones).
    data = w.worded_stream(2_100, seed=59, vocabulary=300)
    cuts = [0, 1_200, 1_500, 1_800, 2_100]

    def run(part: int) -> None:
        start, end = cuts[part], cuts[part + 1]
        w.produce(bootstrap, name, [(0, w.event(i, x, y))
                                    for i, (x, y) in enumerate(data[start:end], start)])
        summary = run_to_idle(cfg)
        # Restored (a fresh model would not give the final model below), never started over.
        assert summary["records"] == end - start

    run(0)  # 48 chunked checkpoints, each of several chunks
    chunks = w.latest_checkpoint(bootstrap, cfg, 0).chunks
    assert chunks >= 3
    head = checkpoint.checkpoint_key(cfg.group_id, name, 0)
    reader = Reader(bootstrap)
    written = reader.end(cfg.checkpoint_topic)  # all ours
    # Another tenant writes on: segments roll, so that the cleaner reaches the last of ours, and
    # passes again after delete.retention.ms to drop the tombstones of superseded chunks.
    churn = Churn(bootstrap, cfg.checkpoint_topic)
    churn.start()
    try:
        def compacted():
            ours = [r for r in reader.records(cfg.checkpoint_topic)
                    if r.key == head or r.key.startswith(head + b"/")]
            return len(ours) == chunks + 1 and all(r.value is not None for r in ours)

        # Of the hundreds of records written, only the last checkpoint's are left: its chunks
        # and manifest (superseded chunks, their tombstones, older manifests are gone).
        w.wait_for(compacted, 60, "the cleaner to compact the checkpoint topic")
        assert written > 10 * (chunks + 1) and cleanings(kafka_broker, cfg.checkpoint_topic)
        for part in (1, 2, 3):
            # The first restores from the compacted topic; each one while the cleaner rewrites
            # the partition's segments (several times a second).
            before = cleanings(kafka_broker, cfg.checkpoint_topic)
            run(part)
            assert cleanings(kafka_broker, cfg.checkpoint_topic) > before
    finally:
        churn.finish()
        reader.close()
    model, _ = w.straight_run(data, streammargin.ALMAClassifier())
    fields = w.saved_tasks(bootstrap, cfg, [0])[0]
    assert fields["next_offset"] == len(data)
    assert w.saved_model_bytes(fields) == w.model_bytes(model)


# The launcher ---------------------------------------------------------------------------------


@pytest.mark.kafka
def test_a_port_taken_before_the_node_binds_it_is_given_up_for_fresh_ones(tmp_path, monkeypatch):
    # free_port's port can be taken before the JVM binds it (an xdist worker's broker or a
    # client starting at the same moment): here a socket holds the first port it gives.
    import socket

    from connectors.kafka import broker as broker_module

    require_apache_kafka()
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    taken = held.getsockname()[1]
    real = broker_module.free_port
    ports = iter([taken])
    monkeypatch.setattr(broker_module, "free_port", lambda host="127.0.0.1": next(ports, None)
                        or real(host))
    try:
        with ApacheKafkaBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log",
                               ) as node:
            assert node.port != taken
            create_topics(node.bootstrap_servers, ["after-a-taken-port"], partitions=1)
    finally:
        held.close()
    logs = (tmp_path / "broker.log").read_text() + (tmp_path / "data" / "console.log").read_text()
    assert "Address already in use" in logs


@pytest.mark.kafka
def test_the_launcher_waits_for_its_own_node_not_a_broker_that_answers_on_its_port(kafka_broker):
    # Another process's broker on the port answers metadata requests; the launcher must not
    # take it for the node it started (which dies of the taken port and is started again).
    from connectors.kafka.broker import BrokerError, _wait_ready

    require_apache_kafka()
    ours = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(BrokerError, match="answers as cluster"):
            _wait_ready("127.0.0.1", kafka_broker.port, ours, 3.0, "Apache Kafka",
                        cluster_id="not-the-session-cluster")
        _wait_ready("127.0.0.1", kafka_broker.port, ours, 10.0, "Apache Kafka",
                    cluster_id=kafka_broker.cluster_id)
    finally:
        ours.kill()
        ours.wait()


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not reaped yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.kafka
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("kind", ["tansu", "apache-kafka"])
def test_a_broker_ends_with_the_process_that_started_it(kind, tmp_path):
    # A broker runs in a session of its own; a test run or benchmark killed outright (SIGKILL,
    # an abort) must not leave it running (connectors.kafka.broker._ending_with_this_thread).
    if kind == "apache-kafka":
        require_apache_kafka()
    # (Apache Kafka's log in the test's folder: the killed starter cannot remove it.)
    options = ", data_dir=sys.argv[2]" if kind == "apache-kafka" else ""
    script = ("import sys, time; from connectors.kafka.broker import make_broker; "
              f"broker = make_broker(sys.argv[1]{options}).start(); "
              "print(broker._process.pid, flush=True); time.sleep(600)")
    starter = subprocess.Popen([sys.executable, "-c", script, kind, str(tmp_path / "data")],
                               cwd=pathlib.Path(__file__).resolve().parents[1],
                               stdout=subprocess.PIPE, text=True)
    try:
        pid = int(starter.stdout.readline())
        assert _running(pid)
    finally:
        starter.kill()
        starter.wait()
    deadline = time.monotonic() + 10
    while _running(pid):
        assert time.monotonic() < deadline, f"the {kind} broker outlived its starter"
        time.sleep(0.05)


# 3. The broker SIGKILLed mid-stream and started again on its log --------------------------------


@pytest.fixture(scope="module")
def crashing_broker(tmp_path_factory):
    """An Apache Kafka node of the module's own, for tests that kill it (its log on disk)."""
    require_apache_kafka()
    folder = tmp_path_factory.mktemp("crashing-kafka")
    with ApacheKafkaBroker(data_dir=folder / "data", log_path=folder / "broker.log") as broker:
        yield broker


def assert_every_offset_once_but_replays(offsets: list[int], n: int, saved: list[int],
                                         bound: int) -> None:
    """`offsets` (one partition's predictions, in order) cover range(n), and a step back only
    repeats records that followed a checkpoint (`saved`: their offsets; 0, the start), fewer
    than `bound` of them: what a worker replays after losing its partition, or a producer
    retry resends, never more."""
    assert offsets[0] == 0 and offsets[-1] == n - 1, (offsets[:3], offsets[-3:])
    for last, restart in zip(offsets, offsets[1:]):
        if restart == last + 1:
            continue
        assert restart <= last, f"offsets {last + 1}-{restart - 1} were never predicted"
        assert any(c <= restart and last + 1 - c < bound for c in (0, *saved)), (
            f"predictions from {restart} to {last} repeated, beyond the bound after the "
            f"checkpoints {saved}")


class RestoreMissedCheckpoints(AssertionError):
    """After the broker's restart the worker was assigned its partitions again and restored
    fewer than it had checkpoints of. `CheckpointStore._scan` (kafka-python's reader) ends a
    scan when its first short poll after the seek comes back empty and the position is at or
    past `reader.highwater()`, a value left from the reader's previous load (the topic's end
    back then): with a fresh connection to the restarted broker that first poll is empty, the
    scan finds nothing, and the partition starts a fresh model at the committed offset."""


class OutageStoppedWorker(AssertionError):
    """The worker exited while the broker was down ("worker failed: cannot reach a Kafka
    broker"). kafka-python 3's `KafkaConsumer.poll` raises `KafkaConnectionError` when a group
    rejoin is pending while no broker answers (its coordinator lookup requests a metadata
    update, whose failure it does not catch), and the worker's main loop lets it out: exit 1
    instead of waiting, as docs/operations.md promises for a broker outage."""

    sign = "worker failed: cannot reach a Kafka broker"


@w.both_transports
def test_a_broker_killed_mid_stream_and_started_on_its_log_again_loses_nothing(
    transport, crashing_broker, tmp_path
):
    # The defects it found are fixed: c03b830 (CheckpointStore._scan trusted a highwater mark
    # left from the reader's previous load; KafkaConsumer.poll raised while the broker was down
    # and a rejoin was pending), and the "offsets 260-359 were never predicted" of 1 run in 35:
    # nothing was lost, the producer's retries of two in-flight batches had swapped them (five
    # requests in flight without idempotence); one in flight keeps the order (client_settings).
    broker = crashing_broker
    broker.start()  # running already, unless a test before failed while it was down
    bootstrap = broker.bootstrap_servers
    name = w.fresh("crash")
    create_topics(bootstrap, [name], partitions=2)
    cfg = w.config(bootstrap, name)
    create_outputs(bootstrap, cfg, 2)
    n = 2_000
    data = w.labelled_stream(2 * n, seed=61)
    items = [(i % 2, w.event(i, x, y)) for i, (x, y) in enumerate(data)]
    log = tmp_path / "worker.log"
    every, poll = 200, 100
    # Reconnecting within a second once the broker is back (both clients back off up to 10-30 s
    # by default): the test's time, not what it shows.
    backoff = "reconnect_backoff_max_ms=1000"
    worker = w.start_worker(cfg, log, *GROUP, "--transport", transport, "--checkpoint-every",
                            str(every), "--max-poll-records", str(poll), "--idle-timeout", "2",
                            "--consumer-config", backoff, "--producer-config", backoff)
    # ~800 records/s: the worker keeps up, so it is at work on the last ones when the broker dies.
    producer = Producer(bootstrap, name, items, per_slice=40, pause=0.05)
    producer.start()
    reader = Reader(bootstrap)
    try:
        w.wait_for(lambda: producer.sent >= 1_000 and all(
            reader.checkpointed(cfg, (0, 1)).values()), 60, "checkpoints of both partitions")
        producer.halt()
        reader.close()
        broker.kill()  # SIGKILL: what it acknowledged is in its log, nothing else
        killed_at = len(log.read_bytes())
        time.sleep(2.5)  # longer than the idle timeout: an outage is not idleness

        def still_running():
            if worker.poll() is not None:
                text = log.read_text()
                error = OutageStoppedWorker if OutageStoppedWorker.sign in text else AssertionError
                raise error(f"the worker exited with {worker.returncode}:\n{text[-3000:]}")

        still_running()
        broker.start()  # the same ports, the same log
        still_running()
        w.produce(bootstrap, name, items[producer.sent:])
        if w.reap(worker, log, timeout=120) != 0:
            still_running()
        reader = Reader(bootstrap)
        offsets = reader.predicted(cfg.predictions_topic)
        saved = reader.checkpointed(cfg, range(2))
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if producer.ident is not None:
            producer.halt()
        reader.close()
        broker.start()
    text = log.read_text()
    assert '"reason": "idle"' in text, text[-3000:]
    # Both partitions had checkpoints before the crash: any assignment after it restores both.
    after = log.read_bytes()[killed_at:].decode(errors="replace")
    for line in re.findall(r"connectors\.worker: assigned .*", after):
        if "(2 restored from checkpoints," not in line:
            raise RestoreMissedCheckpoints(line)
    for partition in (0, 1):
        assert_every_offset_once_but_replays(offsets[partition], n, saved[partition],
                                             every + poll)
    assert_final_models(bootstrap, cfg, data, 2, n)


# 4. Dead letters and metrics records, as docs/kafka.md's tables say -------------------------------
#
# tests/test_kafka_worker.py checks on the session broker: bad JSON and tombstones (their
# VALUE_CONVERTER headers by the schema, the record as it came), skipped batches (KAFKA_CONSUME,
# last_offset, codec, null_value), value_dropped, and the metrics records by their schema. Not
# checked through a broker until here: the other codec refusals, a model's refusal (TASK_PUT,
# the model's class), each Connect header's value, input headers that are not UTF-8, and the
# metrics records' key and counts.


@w.both_transports
def test_every_kind_of_dead_letter_and_the_metrics_records_as_the_readme_describes_them(
    transport, kafka_broker
):
    from kafka import KafkaProducer

    require_apache_kafka()
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("refusals")
    create_topics(bootstrap, [name], partitions=2)
    data = w.labelled_stream(300, seed=67)
    values = {p: [json.dumps({"id": f"e{i}", "x": x, "y": "cat" if y else "dog"}).encode()
                  for i, (x, y) in enumerate(data) if i % 2 == p] for p in (0, 1)}
    codec = "connectors.serializers.json_format.JSONCodec"
    model = "streammargin.convex_polytope.ConvexPolytopeClassifier"
    # (partition, position, value, stage, class, exception class)
    refused = [
        (0, 10, json.dumps({"id": "big", "x": {"a": 1.0}, "pad": "p" * 3_000}).encode(),
         "VALUE_CONVERTER", codec, "connectors.codec.OversizedRecord"),
        (1, 20, b"[1, 2]", "VALUE_CONVERTER", codec, "connectors.codec.InvalidRecord"),
        # (objects nested beyond the mapping's depth: a field that cannot be a feature, like an
        # array, is left out, not refused)
        (0, 30, b'{"id": "f", "x": {"a": ' + b'{"b": ' * 40 + b'1' + b'}' * 41 + b'}',
         "VALUE_CONVERTER", codec, "connectors.codec.InvalidFeature"),
        (1, 40, b'{"id": "l", "x": {"a": 1.0}, "y": [1]}', "VALUE_CONVERTER", codec,
         "connectors.codec.InvalidLabel"),
        # A third class for a model of at most two: the model refuses it.
        (0, 50, json.dumps({"id": "bird", "x": data[0][0], "y": "bird"}).encode(),
         "TASK_PUT", model, "streammargin.errors.InvalidInput"),
    ]
    for partition, position, value, *_ in sorted(refused, key=lambda r: -r[1]):
        values[partition].insert(position, value)
    # A label that comes after its event, and one for no event.
    values[1].insert(60, json.dumps({"id": "late", "x": data[1][0]}).encode())
    values[1].insert(90, b'{"id": "late", "y": "dog"}')
    values[1].insert(91, b'{"id": "nobody", "y": "cat"}')
    sent = {}  # (partition, offset) -> (key, value, timestamp, headers)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    futures = []
    for partition in (0, 1):
        for i, value in enumerate(values[partition]):
            record = (f"key-{partition}-{i}".encode(), value, 1_600_000_000_000 + 1_000 * i,
                      [("trace", f"t{i}".encode()), ("bytes", b"\xff\x00\xfe")])
            key, _, timestamp, headers = record
            futures.append((producer.send(name, value, key=key, partition=partition,
                                          timestamp_ms=timestamp, headers=headers), record))
    producer.flush()
    for future, record in futures:
        metadata = future.get(timeout=10)
        sent[(metadata.partition, metadata.offset)] = record
    producer.close()
    cfg = w.config(bootstrap, name, **SESSION, model="convexpolytope", params={"max_classes": 2},
                   max_record_bytes=2_048, transport=transport, metrics_every=100)
    run_to_idle(cfg)

    dead_letter = schemas.validator("dead-letter-headers")
    expected = {(p, values[p].index(value)): (stage, cls, exception)
                for p, _, value, stage, cls, exception in refused}
    found = {}
    for record in w.read_all(bootstrap, cfg.dead_letter_topic):
        own = record.headers[:2]
        connect = {k: v.decode() for k, v in record.headers[2:]}
        dead_letter.validate(connect)
        partition, offset = (int(connect["__connect.errors.partition"]),
                             int(connect["__connect.errors.offset"]))
        key, value, timestamp, headers = sent[(partition, offset)]
        # The input record as it came: key, whole value, timestamp, its headers first, bytes kept.
        assert (record.key, record.value, record.timestamp, own) == (key, value, timestamp,
                                                                     headers)
        assert [k for k, _ in record.headers[2:]] == [
            "__connect.errors.topic", "__connect.errors.partition", "__connect.errors.offset",
            "__connect.errors.connector.name", "__connect.errors.stage",
            "__connect.errors.class.name", "__connect.errors.exception.class.name",
            "__connect.errors.exception.message"]
        assert (connect["__connect.errors.topic"], connect["__connect.errors.connector.name"]) == (
            name, cfg.group_id)
        found[(partition, offset)] = (connect["__connect.errors.stage"],
                                      connect["__connect.errors.class.name"],
                                      connect["__connect.errors.exception.class.name"])
    assert found == expected
    assert len(values[0][10]) > cfg.max_record_bytes  # the oversized one went out whole

    # Metrics records: keyed group/topic/partition; the final ones count what happened.
    metrics_schema = schemas.validator("metrics")
    final = {}
    for record in w.read_all(bootstrap, cfg.metrics_topic):
        metrics = json.loads(record.value)
        metrics_schema.validate(metrics)
        assert record.key == f"{cfg.group_id}/{name}/{metrics['partition']}".encode()
        if metrics["event"] == "final":
            final[metrics["partition"]] = metrics
    for partition in (0, 1):
        metrics = final[partition]
        assert metrics["records"] == metrics["next_offset"] == len(values[partition])
        assert metrics["dead_letters"] == sum(p == partition for p, *_ in refused)
        assert metrics["lag"] == 0 and metrics["classes"] == 2
    assert (final[1]["labels"]["joined"], final[1]["labels"]["orphans"],
            final[1]["labels"]["pending"]) == (1, 1, 0)
    assert final[0]["labels"]["joined"] == 0
