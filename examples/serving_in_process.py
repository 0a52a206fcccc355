"""A Python service scoring with the model the Kafka workers learn, in its own process: no HTTP
hop (docs/serving.md, "In your process").

    python examples/serving_in_process.py            # starts a broker and a worker of its own
    python examples/serving_in_process.py --bootstrap-servers host:9092   # or uses yours

It writes a payments topic, runs a worker on it (`streammargin kafka`, a checkpoint a second),
then follows the worker's checkpoints with `connectors.serving.ModelFollower` and scores new
payments by key, from several threads at once, printing each score with the checkpoint version
that gave it. A second batch of labelled payments makes a new version, which the follower swaps
in while the threads keep scoring.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
import uuid

from connectors.kafka.broker import create_topics, make_broker
from connectors.serving import ModelFollower
from connectors.worker.config import WorkerConfig


def payment(rng: random.Random, i: int, labelled: bool = True) -> dict:
    record = {"transaction_id": f"t{i}", "amount": round(rng.lognormvariate(3, 1), 2),
              "country": rng.choice(["BR", "FR", "US"]), "card_present": rng.random() < 0.6}
    if labelled:
        record["is_fraud"] = record["amount"] > 40 and not record["card_present"]
    return record


def produce(bootstrap: str, topic: str, records: list[dict]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for i, record in enumerate(records):
        producer.send(topic, json.dumps(record).encode(), key=f"card-{i % 20}".encode())
    producer.flush()
    producer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", default=None)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers
        if bootstrap is None:
            bootstrap = stack.enter_context(make_broker("tansu")).bootstrap_servers
        topic = f"payments-{uuid.uuid4().hex[:6]}"
        create_topics(bootstrap, [topic], partitions=2)
        rng = random.Random(1)
        produce(bootstrap, topic, [payment(rng, i) for i in range(3_000)])
        # The workers' options, the same for the worker and the follower.
        options = dict(topics=[topic], bootstrap_servers=bootstrap, group_id=f"{topic}.fraud",
                       checkpoint_topic=f"{topic}.checkpoints", features=("*",),
                       label_field="is_fraud", id_field="transaction_id", scale=True)
        worker = subprocess.Popen([
            sys.executable, "-m", "connectors.cli", "kafka", "--bootstrap-servers", bootstrap,
            "--topic", topic, "--group-id", options["group_id"], "--checkpoint-topic",
            options["checkpoint_topic"], "--features", "*", "--label-field", "is_fraud",
            "--id-field", "transaction_id", "--scale", "--checkpoint-interval", "1",
            "--log-level", "WARNING"])
        stack.callback(worker.terminate)
        follower = stack.enter_context(ModelFollower(WorkerConfig(**options)))
        if not follower.wait_ready(timeout=60):
            sys.exit("no checkpoint in 60 s: is the worker running?")

        def score(name: str) -> None:
            local = random.Random(name)
            for _ in range(5):
                record = payment(local, 0, labelled=False)
                key = f"card-{local.randrange(20)}".encode()
                scored = follower.predict([record], keys=[key])  # thread-safe
                print(f"{name}: {key.decode():8} amount {record['amount']:7.2f} "
                      f"P(fraud) {scored.probabilities[0][1]:.3f} (version "
                      f"{scored.versions[0].version}, partition {scored.versions[0].partition})")
                time.sleep(0.5)

        threads = [threading.Thread(target=score, args=(f"thread {i}",)) for i in range(3)]
        for thread in threads:
            thread.start()
        produce(bootstrap, topic, [payment(rng, i) for i in range(3_000, 6_000)])
        for thread in threads:
            thread.join()
        print(f"versions kept: {sorted(follower.view.versions)}")


if __name__ == "__main__":
    main()
