"""--label-topic: labels on a topic of their own, co-partitioned with the events, on a real broker.

The labels join the events waiting in the pending store; the two topics are merged by record
timestamp, so a worker SIGKILLed and restarted ends with the model of an uninterrupted run, and
both topics' offsets are committed (in the transaction, with exactly-once).
"""

from __future__ import annotations

import importlib.util
import json
import random
import signal
import time

import pytest

from connectors.kafka.broker import create_topics
from connectors.worker.worker import Worker, WorkerError

import test_kafka_worker as w

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000_000


def flat_events(n: int, seed: int) -> tuple[list, list]:
    """(events, labels): flat JSON payments without their label, and the labels, each written
    1 to 60 events after its event (its timestamp that much later), on the same partition."""
    rng = random.Random(seed)
    events, labels = [], []
    for i in range(n):
        amount, risk = rng.uniform(0, 100), rng.random()
        country = rng.choice(["BR", "FR", "US"])
        fraud = amount / 100 + risk + (0.6 if country == "BR" else 0) > 1.2
        partition = i % 2
        events.append((partition, T0 + 10 * i, json.dumps(
            {"tx": f"t{i}", "amount": amount, "risk": risk, "country": country}).encode()))
        delay = rng.randint(1, 60)
        labels.append((partition, T0 + 10 * (i + delay) + 5,
                       json.dumps({"tx": f"t{i}", "fraud": fraud}).encode()))
    labels.sort(key=lambda item: item[1])
    return events, labels


def produce_timed(bootstrap: str, topic: str, items) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
    for partition, timestamp, value in items:
        producer.send(topic, value, partition=partition, timestamp_ms=timestamp)
    producer.flush()
    producer.close()


MAPPING = {"label_field": "fraud", "id_field": "tx", "features": ["*"]}


def label_config(bootstrap: str, name: str, **options):
    return w.config(bootstrap, name, label_topic=f"{name}.labels", **MAPPING, **options)


@pytest.mark.parametrize("transport, guarantee", [
    ("kafka-python", "at-least-once"),
    pytest.param("librdkafka", "at-least-once", marks=pytest.mark.skipif(
        importlib.util.find_spec("confluent_kafka") is None,
        reason="confluent-kafka is not installed")),
    ("kafka-python", "exactly-once"),
])
def test_labels_join_their_events_and_a_sigkill_ends_with_the_uninterrupted_model(
        transport, guarantee, kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("labels")
    create_topics(bootstrap, [name, f"{name}.labels"], partitions=2)
    events, labels = flat_events(8_000, seed=21)
    produce_timed(bootstrap, name, events)
    produce_timed(bootstrap, f"{name}.labels", labels)

    reference = label_config(bootstrap, name, transport=transport, scale=True)
    summary = Worker(reference).run()
    assert summary["records"] == 16_000
    expected = w.saved_tasks(bootstrap, reference, [0, 1])
    for partition in (0, 1):
        final = summary["partitions"][f"{name}/{partition}"]
        assert final["labels"]["joined"] == 4_000 and final["labels"]["orphans"] == 0
        assert final["labelled"] == 4_000 and final["accuracy"] > 0.85, final["accuracy"]
        assert expected[partition]["label_next_offset"] == 4_000

    # The kill comes after the first worker has processed a prefix of both topics (every record
    # up to a time: a prefix of their merge) and before its next checkpoint, so that the restart
    # replays; the rest of the records are written after the kill. (Written all at once, the
    # whole stream could be processed and checkpointed before the kill lands.)
    cut = T0 + 10 * 5_000
    name2 = w.fresh("labels-kill")
    create_topics(bootstrap, [name2, f"{name2}.labels"], partitions=2)
    produce_timed(bootstrap, name2, [item for item in events if item[1] <= cut])
    produce_timed(bootstrap, f"{name2}.labels", [item for item in labels if item[1] <= cut])
    cfg = w.config(bootstrap, name2, label_topic=f"{name2}.labels", scale=True, **MAPPING)
    options = ["--label-topic", cfg.label_topic, "--label-field", "fraud", "--id-field", "tx",
               "--features", "*", "--transport", transport, "--scale",
               "--processing-guarantee", guarantee]
    first = w.start_worker(cfg, tmp_path / "first.log", "--checkpoint-every", "700",
                           "--max-poll-records", "300", *options)
    try:
        w.wait_for(lambda: w.covered(bootstrap, cfg.predictions_topic,
                                     {(p, o) for p in (0, 1) for o in range(2_500)}),
                   90, "the first worker's predictions")
        first.send_signal(signal.SIGKILL)
    finally:
        w.reap(first, tmp_path / "first.log")
    killed_at = w.saved_tasks(bootstrap, cfg, [0, 1])
    ends = [(2_500, sum(1 for p, t, _ in labels if p == partition and t <= cut))
            for partition in (0, 1)]
    offsets = [(killed_at[p]["next_offset"], killed_at[p]["label_next_offset"]) for p in (0, 1)]
    assert any(o < e for pair, end in zip(offsets, ends) for o, e in zip(pair, end)), offsets
    # Events waited at the kill: the restart reads them again from the input topic.
    assert all(killed_at[p]["pending"]["segments"] for p in (0, 1))
    produce_timed(bootstrap, name2, [item for item in events if item[1] > cut])
    produce_timed(bootstrap, f"{name2}.labels", [item for item in labels if item[1] > cut])
    second = w.start_worker(cfg, tmp_path / "second.log", "--idle-timeout", "2", *options)
    assert w.reap(second, tmp_path / "second.log", 120) == 0, (
        tmp_path / "second.log").read_text()[-3000:]
    assert "events waiting for their label read again from offsets" in (
        tmp_path / "second.log").read_text()
    tasks = w.saved_tasks(bootstrap, cfg, [0, 1])
    for partition in (0, 1):
        assert tasks[partition]["next_offset"] == 4_000
        assert tasks[partition]["label_next_offset"] == 4_000
        assert w.saved_model_bytes(tasks[partition]) == w.saved_model_bytes(expected[partition])


def test_topics_of_different_partition_counts_are_refused_in_one_line(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("labels-mismatch")
    create_topics(bootstrap, [name], partitions=2)
    create_topics(bootstrap, [f"{name}.labels"], partitions=3)
    with pytest.raises(WorkerError, match=r"has 3 partitions and --topic .* has 2.*the same "
                                          "count"):
        Worker(label_config(bootstrap, name)).run()


def test_exactly_once_commits_both_topics_offsets(kafka_broker):
    from kafka import KafkaConsumer, TopicPartition

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("labels-eos")
    create_topics(bootstrap, [name, f"{name}.labels"], partitions=2)
    events, labels = flat_events(1_000, seed=22)
    produce_timed(bootstrap, name, events)
    produce_timed(bootstrap, f"{name}.labels", labels)
    cfg = label_config(bootstrap, name, processing_guarantee="exactly-once")
    assert Worker(cfg).run()["records"] == 2_000
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=cfg.group_id,
                             enable_auto_commit=False)
    try:
        committed = {(topic, p): consumer.committed(TopicPartition(topic, p))
                     for topic in (name, cfg.label_topic) for p in (0, 1)}
    finally:
        consumer.close()
    assert committed == {(topic, p): 500 for topic in (name, cfg.label_topic) for p in (0, 1)}



def test_partitions_paused_with_records_fetched_give_them_all_once_resumed(kafka_broker):
    # The merge pauses a partition that holds too much and resumes it later. kafka-python
    # 3.0.12 parks the records it fetched for a paused partition and, after the resume, gave
    # them back only if its in-line slot was None, never once a drained one sat there (the
    # slot of a partition left fetching: KafkaPythonTransport.poll).
    from kafka import TopicPartition

    from connectors.kafka.transport import make_transport
    from connectors.worker.worker import client_settings

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("paused")
    create_topics(bootstrap, [name], partitions=2)
    produce_timed(bootstrap, name, [(0, T0, b"{}")] * 100 + [(1, T0, b"{}")] * 500)
    transport = make_transport("kafka-python", client_settings(w.config(bootstrap, name), "p"))
    transport.start_consumer()
    try:
        a, b = TopicPartition(name, 0), TopicPartition(name, 1)
        transport.consumer.assign([a, b])
        seen = {0: 0, 1: 0}

        def poll(until) -> None:
            deadline = time.monotonic() + 10
            while not until() and time.monotonic() < deadline:
                for tp, records in transport.poll(100, 10).items():
                    seen[tp.partition] += len(records)

        transport.pause(a)
        poll(until=lambda: seen[1] > 0)  # b's fetch in the slot, most of it not returned yet
        transport.pause(b)
        transport.resume(a)
        poll(until=lambda: seen[0] == 100)  # b's records parked; a's drained in the slot
        transport.resume(b)
        poll(until=lambda: seen[1] == 500)
        assert seen == {0: 100, 1: 500}
    finally:
        transport.close_consumer()
