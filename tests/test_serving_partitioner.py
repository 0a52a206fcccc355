"""`connectors.serving.partitioner.partition_of` against the partitioners it names, on Apache
Kafka: records produced by confluent-kafka (librdkafka's default `consistent_random`, and
`partitioner=murmur2_random`), by kafka-python (its default) and by Java's producer
(kafka-clients' default, tests/java/KeyedProducer.java) to a topic of 7 partitions are read back,
and every record's partition is the one `partition_of` gives its key.
A server that routes a keyed request by another partition than its record's would answer it
with the wrong partition's model, silently."""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import subprocess
import time
import uuid

import pytest

from connectors.serving.partitioner import partition_of

pytestmark = pytest.mark.kafka

PARTITIONS = 7
JAVA_PRODUCER = pathlib.Path(__file__).parent / "java" / "KeyedProducer.java"


def keys() -> list[bytes]:
    """Hundreds of keys: every length 1-40 (murmur2's 4-byte blocks and its 1-3-byte tails, each
    byte value), ids as applications write them, unicode in UTF-8, long keys, arbitrary bytes."""
    rng = random.Random(46)
    found = [bytes(rng.randrange(256) for _ in range(n)) for n in range(1, 41)]
    found += [bytes([b]) for b in range(256)]
    found += [f"card-{i}".encode() for i in range(150)]
    found += [str(uuid.UUID(int=rng.getrandbits(128))).encode() for _ in range(40)]
    found += [text.encode() for text in ("ключ", "カード-7", "💳🧾", "naïve café", "Ω" * 33,
                                         "\u0000nul", "e\u0301", "中文键值", "🔑" * 100)]
    found += [bytes(rng.randrange(256) for _ in range(n)) for n in (255, 256, 1_000, 4_097,
                                                                     65_536)]
    found += [("x" * n).encode() for n in (1023, 1024, 1025, 10_000)]
    found = list(dict.fromkeys(found))  # (a random short key may repeat another)
    assert len(found) > 500 and all(found)  # (empty keys have no partition)
    return found


def read_back(bootstrap: str, topic: str, expected: int) -> list:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=50,
                             max_partition_fetch_bytes=4 << 20)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    records = []
    deadline = time.monotonic() + 120
    while len(records) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            records.extend(batch)
    consumer.close()
    assert len(records) == expected, f"read {len(records)} of {expected} records back"
    return records


def test_partition_of_is_the_partition_the_clients_default_partitioners_give(kafka_broker):
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    from connectors.kafka.broker import create_topics

    bootstrap = kafka_broker.bootstrap_servers
    topic = f"partitioner-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], partitions=PARTITIONS)
    every = keys()
    # Which client wrote a record (its value) and the hash partition_of must agree with.
    producers = {"confluent-kafka default": "crc32", "confluent-kafka murmur2_random": "murmur2",
                 "kafka-python default": "murmur2"}
    failed: list = []

    def delivered(error, message):
        if error is not None:
            failed.append(error)

    for name, settings in (("confluent-kafka default", {}),
                           ("confluent-kafka murmur2_random", {"partitioner": "murmur2_random"})):
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                             "message.max.bytes": 2 << 20, **settings})
        for i, key in enumerate(every):
            producer.produce(topic, json.dumps([name, i]).encode(), key=key,
                             on_delivery=delivered)
            producer.poll(0)
        assert producer.flush(60) == 0, f"{name}: records left undelivered"
    assert not failed, failed[:3]
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    futures = [producer.send(topic, json.dumps(["kafka-python default", i]).encode(), key=key)
               for i, key in enumerate(every)]
    producer.flush()
    producer.close()
    assert all(f.succeeded() for f in futures)

    if java_producer(bootstrap, topic, every):
        producers["java default"] = "murmur2"
    records = read_back(bootstrap, topic, len(producers) * len(every))
    seen = {name: set() for name in producers}
    wrong = []
    for record in records:
        name, i = json.loads(record.value)
        assert record.key == every[i]
        seen[name].add(i)
        expected = partition_of(record.key, PARTITIONS, producers[name])
        if record.partition != expected:
            wrong.append((name, record.key[:20], record.partition, expected))
    assert not wrong, f"{len(wrong)} records not on partition_of's partition: {wrong[:5]}"
    assert all(len(ids) == len(every) for ids in seen.values())
    # The keys spread over every partition under each hash (an agreement over a few partitions
    # only would prove less).
    for partitioner in ("murmur2", "crc32"):
        assert {partition_of(k, PARTITIONS, partitioner) for k in every} == set(range(PARTITIONS))


def java_producer(bootstrap: str, topic: str, keys: list[bytes]) -> bool:
    """Produce `keys` with Java's producer (kafka-clients of the test broker's jars), as a
    single-file source program; False where the broker is not Apache Kafka (no jars)."""
    from connectors.kafka.broker import apache_kafka_cache

    from conftest import test_broker_kind

    jars = apache_kafka_cache()
    clients = sorted(jars.glob("kafka-clients-*.jar")) + sorted(jars.glob("slf4j-api-*.jar"))
    java = shutil.which("java")
    if test_broker_kind()[0] != "apache-kafka" or len(clients) != 2 or java is None:
        return False
    done = subprocess.run([java, "-cp", ":".join(map(str, clients)), str(JAVA_PRODUCER),
                           bootstrap, topic], input="\n".join(k.hex() for k in keys),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == len(keys), done.stdout[-1000:]
    return True
