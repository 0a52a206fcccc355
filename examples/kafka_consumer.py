"""A Kafka consumer process that scores and learns from live events: copy this to start.

It runs the streammargin worker inside your own Python process on an `events` topic, with labels
that arrive late (a fraud team confirms transactions minutes after they were scored), reads the
predictions back, and stops gracefully. Point `--bootstrap-servers` at your cluster; without it
the example starts the embedded broker (Tansu) on a free port and stops it at the end.

The event contract (JSON):
    {"id": "tx-42", "x": {"amount": 12.5, "hour": 3}}     an event to score, label unknown yet
    {"id": "tx-42", "y": true}                            its label, later: the model learns then
    {"id": "tx-43", "x": {...}, "y": false}               scored, then learnt at once

Outputs: one prediction per event on `predictions` ({"topic", "partition", "offset", "id",
"y_pred", "p_true", ...}), metrics on `metrics`, rejected records on `dead-letters`, checkpoints on
`checkpoints` (restart the process and it resumes from them).

Run: .venv/bin/python examples/kafka_consumer.py [--bootstrap-servers host:9092]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import threading

from kafka import KafkaConsumer, KafkaProducer

from connectors.kafka.broker import FAST_GROUP_SETTINGS, EmbeddedBroker, create_topics
from connectors.worker import Worker, WorkerConfig


def transactions(n: int, seed: int = 0):
    """Synthetic card transactions: fraud is likelier at night, far from home and for large
    amounts."""
    rng = random.Random(seed)
    for i in range(n):
        hour = rng.randrange(24)
        amount = rng.lognormvariate(3, 1)
        distance = rng.expovariate(1 / 20)
        night = hour < 6
        risk = -4.0 + 1.5 * night + 0.03 * distance + 0.01 * amount
        fraud = rng.random() < 1 / (1 + math.exp(-risk))
        x = {"amount": amount, "distance_km": distance, "hour": float(hour), "night": night}
        yield f"tx-{i}", x, fraud


def produce_events(bootstrap: str, n: int, label_delay: int) -> None:
    """Events without labels; each label follows `label_delay` events later."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
    waiting = []
    for event_id, x, fraud in transactions(n):
        producer.send("events", json.dumps({"id": event_id, "x": x}).encode(), key=event_id.encode())
        waiting.append((event_id, fraud))
        if len(waiting) > label_delay:
            labelled_id, label = waiting.pop(0)
            # Same key: the label lands on the partition (and the model) that scored the event.
            producer.send("events", json.dumps({"id": labelled_id, "y": label}).encode(),
                          key=labelled_id.encode())
    for labelled_id, label in waiting:
        producer.send("events", json.dumps({"id": labelled_id, "y": label}).encode(),
                      key=labelled_id.encode())
    producer.flush()
    producer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", default=None)
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers
        group_timings = {}                   # your cluster: the worker's defaults
        if bootstrap is None:
            bootstrap = stack.enter_context(EmbeddedBroker()).bootstrap_servers
            print(f"embedded broker at {bootstrap}")
            # Tansu holds a new member's join for half the session timeout: a short one.
            group_timings = FAST_GROUP_SETTINGS
        create_topics(bootstrap, ["events"], partitions=2)
        produce_events(bootstrap, args.events, label_delay=200)

        config = WorkerConfig(
            topics=["events"],
            bootstrap_servers=bootstrap,
            group_id="fraud-scorer",
            predictions_topic="predictions",
            metrics_topic="metrics",
            dead_letter_topic="dead-letters",
            checkpoint_topic="checkpoints",
            model="alma",                    # any short name: `streammargin kafka --list-models`
            params={"alpha": 0.9},
            scale=True,                      # a StandardScaler in front, checkpointed with it
            metrics_every=1000,
            idle_timeout=3.0,                # this example stops when the topic is drained
            **group_timings,
        )
        stop = threading.Event()             # set it from a signal handler to stop gracefully
        summary = Worker(config).run(stop_event=stop, on_metrics=lambda m: print(
            f"  partition {m['partition']}: {m['records']:>5} records, accuracy "
            f"{m['accuracy'] or 0:.3f}, labels joined {m['labels']['joined']}, "
            f"waiting {m['labels']['pending']}, lag {m['lag']}"
        ))
        print(f"worker stopped ({summary['reason']}), {summary['records']:,} records")

        consumer = KafkaConsumer("predictions", bootstrap_servers=bootstrap,
                                 auto_offset_reset="earliest", consumer_timeout_ms=2000)
        predictions = {}
        for message in consumer:
            prediction = json.loads(message.value)
            predictions[prediction["id"]] = prediction  # a replay may repeat one: keep the last
        consumer.close()
        truth = {event_id: fraud for event_id, _, fraud in transactions(args.events)}
        ranked = sorted(predictions.values(), key=lambda p: -p["p_true"])
        top = ranked[: len(ranked) // 20]
        base_rate = sum(truth.values()) / len(truth)
        hit_rate = sum(truth[p["id"]] for p in top) / len(top)
        print(f"{len(predictions):,} predictions; fraud rate {base_rate:.1%} overall, "
              f"{hit_rate:.1%} among the 5% scored riskiest. The three riskiest:")
        for prediction in ranked[:3]:
            print("  ", prediction)

if __name__ == "__main__":
    main()
