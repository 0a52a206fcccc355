"""A Python service scoring with the model the Kafka workers learn, in its own process: no HTTP
hop (docs/serving.md, "In your process").

    python examples/serving_in_process.py            # starts a broker and a worker of its own
    python examples/serving_in_process.py --bootstrap-servers host:9092   # or uses yours

It writes a payments topic, runs a worker on it (`streammargin kafka`, a checkpoint a second),
then follows the worker's checkpoints with `connectors.serving.ModelFollower` and scores new
payments by key, from several threads at once, printing each score with the checkpoint version
that gave it. A second batch of labelled payments makes new versions, which the follower swaps
in while the threads keep scoring. (tests/test_serving_example.py runs it on Apache Kafka.)
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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
            "--predictions-topic", f"{topic}.predictions", "--metrics-topic",
            f"{topic}.metrics", "--dead-letter-topic", f"{topic}.dead-letters",
            "--log-level", "WARNING"], stdout=subprocess.DEVNULL)
        stack.callback(stop, worker)
        follower = stack.enter_context(ModelFollower(WorkerConfig(**options)))
        if not follower.wait_ready(timeout=120):
            sys.exit("no checkpoint in 120 s: is the worker running?")
        learnt = wait_learnt(follower, 3_000, timeout=120)

        # Three threads score at once; each scores once before the second batch is written, then
        # until the follower serves the models that learnt it, then once more.
        started = threading.Barrier(4)
        swapped = threading.Event()
        printing = threading.Lock()

        def score(name: str) -> None:
            local = random.Random(name)
            for n in itertools.count():
                record = payment(local, 0, labelled=False)
                key = f"card-{local.randrange(20)}".encode()
                scored = follower.predict([record], keys=[key])  # thread-safe
                with printing:  # (one line at a time)
                    print(f"{name}: {key.decode():8} amount {record['amount']:7.2f} "
                          f"P(fraud) {scored.probabilities[0][1]:.3f} (version "
                          f"{scored.versions[0].version}, partition "
                          f"{scored.versions[0].partition})", flush=True)
                if n == 0:
                    started.wait()
                elif swapped.is_set():
                    return
                else:
                    swapped.wait(0.5)

        threads = [threading.Thread(target=score, args=(f"thread {i}",)) for i in range(3)]
        for thread in threads:
            thread.start()
        started.wait()
        produce(bootstrap, topic, [payment(rng, i) for i in range(3_000, 6_000)])
        learnt = wait_learnt(follower, 6_000, timeout=120)
        swapped.set()
        for thread in threads:
            thread.join()
        for served in sorted(follower.view.current.values(), key=lambda v: v.partition):
            print(f"partition {served.partition}: version {served.version}, learnt the records "
                  f"before offset {served.next_offset}")
        print(f"versions kept: {sorted(follower.view.versions, key=int)}")
        if learnt < 6_000:
            sys.exit(f"the models served learnt {learnt} of the 6000 records in 120 s: is the "
                     "worker running?")


def wait_learnt(follower: ModelFollower, records: int, timeout: float) -> int:
    """Wait until the models served learnt `records` of the topic's (their checkpoints' input
    offsets), or `timeout` seconds; the records they learnt."""
    deadline = time.monotonic() + timeout
    while True:
        learnt = sum(v.next_offset or 0 for v in follower.view.current.values())
        if learnt >= records or time.monotonic() > deadline:
            return learnt
        time.sleep(0.1)


def stop(worker: subprocess.Popen) -> None:
    """SIGTERM: the worker writes its last checkpoint and exits (before the broker stops)."""
    worker.terminate()
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()

if __name__ == "__main__":
    main()
