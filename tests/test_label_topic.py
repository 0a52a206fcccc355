"""--label-topic: labels on a topic of their own, co-partitioned with the events, on a real broker.

The labels join the events waiting in the pending store; the two topics are merged by record
timestamp, so a worker SIGKILLed and restarted ends with the model of an uninterrupted run, and
both topics' offsets are committed (in the transaction, with exactly-once).
"""

from __future__ import annotations

import json
import random
import signal

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


@w.both_transports
def test_labels_join_their_events_and_a_sigkill_ends_with_the_uninterrupted_model(
        transport, kafka_broker, tmp_path):
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

    cfg = w.config(bootstrap, name, group_id=w.fresh("labels-kill"),
                   predictions_topic=f"{name}.p2", metrics_topic=f"{name}.m2",
                   checkpoint_topic=f"{name}.c2", label_topic=f"{name}.labels", scale=True,
                   **MAPPING)
    options = ["--label-topic", cfg.label_topic, "--label-field", "fraud", "--id-field", "tx",
               "--features", "*", "--transport", transport, "--scale"]
    first = w.start_worker(cfg, tmp_path / "first.log", "--checkpoint-every", "700",
                           "--max-poll-records", "300", *options)
    try:
        w.wait_for(lambda: w.covered(bootstrap, cfg.predictions_topic,
                                     {(p, o) for p in (0, 1) for o in range(800)}),
                   90, "the first worker's predictions")
        first.send_signal(signal.SIGKILL)
    finally:
        w.reap(first, tmp_path / "first.log")
    # The last checkpoints before the kill: the restart replays from them (events, or only
    # labels where librdkafka had read every event by the kill).
    killed_at = w.saved_tasks(bootstrap, cfg, [0, 1])
    offsets = [(killed_at[p]["next_offset"], killed_at[p]["label_next_offset"]) for p in (0, 1)]
    assert any(min(pair) < 4_000 for pair in offsets), offsets
    second = w.start_worker(cfg, tmp_path / "second.log", "--idle-timeout", "2", *options)
    assert w.reap(second, tmp_path / "second.log", 120) == 0, (
        tmp_path / "second.log").read_text()[-3000:]
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
