"""The batch path on Apache Kafka: a worker whose runs of records go the batch way writes the
topics and the checkpoints that the per-record path writes from the same records, to the byte.

tests/test_batch_steps.py proves the same of a task without a broker, over generated record
mixes; here the whole worker runs twice over one input topic (two groups, two sets of output
topics): once as it is, once with the batch path replaced by the per-record loop: on
kafka-python at-least-once and on librdkafka exactly-once. The input mixes labelled and unlabelled events, labels
for events waiting for them, bad records and a burst of records of another layout.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from test_kafka_worker import (
    _librdkafka_installed,
    config,
    fresh,
    produce,
    read_all,
    saved_tasks,
)

from connectors.kafka.broker import create_topics
from connectors.task.batch import BatchSteps
from connectors.task.records import RecordSteps
from connectors.worker.worker import Worker
from streammargin import progressive

pytestmark = pytest.mark.kafka

# What a metrics event says of the run rather than of the records: the worker, the clock, rates.
VOLATILE_METRICS = {"group", "worker_id", "time_ms", "records_per_s", "records_per_s_recent",
                    "lag"}


def mixed_stream(n: int, seed: int, first: int = 0) -> tuple[list, list]:
    """(partition, value, key) of events `e<first>`... of 10 features, a fifth unlabelled whose
    label comes later, a bad record every 97, a burst of another layout (a feature more) in the
    middle; and the labels that have not come yet (partition, id, label)."""
    rng = random.Random(seed)
    weights = [rng.gauss(0, 1) for _ in range(10)]
    items, waiting = [], []
    for i in range(first, first + n):
        partition = i % 2
        x = {f"f{j}": round(rng.gauss(0, 1), rng.choice([3, 6, 17])) for j in range(10)}
        if first + n // 2 <= i < first + n // 2 + 150:
            x["extra"] = rng.random()
        y = sum(w * v for w, v in zip(weights, x.values())) > 0
        if i % 97 == 13:
            items.append((partition, b'{"id": "bad", "x": {"f0": "text"', b"k"))
            continue
        record = {"id": f"e{i}", "x": x}
        if i % 5 == 0:
            waiting.append((partition, f"e{i}", y))
        else:
            record["y"] = y
        items.append((partition, json.dumps(record).encode(), f"k{i}".encode()))
        if waiting and rng.random() < 0.05:
            p, event_id, label = waiting.pop(0)
            items.append((p, json.dumps({"id": event_id, "y": label}).encode(), b"label"))
    return items, waiting


def outputs(bootstrap: str, topic: str, group: str) -> dict:
    """A topic's records by the input partition they come from (records of both input partitions
    meet on an output partition in the order the polls gave them, which no path decides):
    (key, value, headers, the group's name in them made `<group>`); a metrics event without the
    group and what tells of the run rather than the records."""
    found: dict = {}
    for record in read_all(bootstrap, topic):
        headers = dict(record.headers or [])
        if topic.endswith(".metrics"):
            event = json.loads(record.value)
            source = event["partition"]
            event = {k: v for k, v in event.items() if k not in VOLATILE_METRICS}
            found.setdefault(source, []).append(json.dumps(event, sort_keys=True))
            continue
        if topic.endswith(".dead"):
            source = int(headers["__connect.errors.partition"])
        else:
            source = json.loads(record.value)["partition"]
        headers = tuple(sorted((k, v.replace(group.encode(), b"<group>"))
                               for k, v in headers.items()))
        found.setdefault(source, []).append((record.key, record.value, headers))
    # A rebalance or an aborted transaction writes a run's records again, the same bytes (exact
    # replay): each once, in the order first written.
    return {where: list(dict.fromkeys(records)) for where, records in found.items()}


def same(a, b) -> bool:
    """Equal to the bit: dicts, lists and numpy arrays (dtype, shape and bytes) within."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and (a == b or a != a and b != b)


@pytest.mark.parametrize("transport, guarantee", [
    ("kafka-python", "at-least-once"),
    pytest.param("librdkafka", "exactly-once", marks=pytest.mark.skipif(
        not _librdkafka_installed(), reason="confluent-kafka is not installed")),
])
def test_the_batch_path_writes_the_per_record_paths_topics_and_checkpoints(
        transport, guarantee, kafka_broker, monkeypatch):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("batch-same")
    create_topics(bootstrap, [name], partitions=2)
    first, waiting = mixed_stream(6_000, seed=11)
    # Then the labels still awaited and more events: the second runs restore the pending stores
    # from the checkpoints and read the waiting events again from the input.
    later = [(p, json.dumps({"id": event_id, "y": label}).encode(), b"label")
             for p, event_id, label in waiting] + mixed_stream(2_000, seed=12, first=6_000)[0]
    rows_in_batches = []
    run = progressive.ModelSteps.run

    def counted(self, *args, **kwargs):
        done, why, out = run(self, *args, **kwargs)
        rows_in_batches.append(done)
        return done, why, out

    monkeypatch.setattr(progressive.ModelSteps, "run", counted)
    runs = {}
    for items in (first, later):
        produce(bootstrap, name, items)
        for path in ("per-record", "batch"):
            with monkeypatch.context() as patch:
                if path == "per-record":
                    patch.setattr(BatchSteps, "process", RecordSteps.process)
                tag = f"{name}.{path}"
                cfg = config(bootstrap, name, group_id=f"{tag}.group",
                             predictions_topic=f"{tag}.predictions",
                             metrics_topic=f"{tag}.metrics", dead_letter_topic=f"{tag}.dead",
                             checkpoint_topic=f"{tag}.checkpoints", transport=transport,
                             processing_guarantee=guarantee, scale=True, metrics_every=500,
                             checkpoint_every=1_000, metrics_interval=3600.0,
                             checkpoint_interval=3600.0, session_timeout_ms=20_000,
                             heartbeat_interval_ms=2_000)
                summary = Worker(cfg).run()
                assert summary["records"] >= len(items) - 10
                runs[path] = (cfg, sum(rows_in_batches), summary)
                rows_in_batches.clear()
        assert runs["per-record"][1] == 0
        assert runs["batch"][1] > len(items) / 2, "the batch path took less than half"
        for kind in ("predictions", "metrics", "dead"):
            per_record = outputs(bootstrap, f"{name}.per-record.{kind}", f"{name}.per-record.group")
            batch = outputs(bootstrap, f"{name}.batch.{kind}", f"{name}.batch.group")
            assert per_record and batch.keys() == per_record.keys(), kind
            for where in per_record:
                assert batch[where] == per_record[where], (kind, where)
    saved = {path: saved_tasks(bootstrap, cfg, (0, 1)) for path, (cfg, _, _) in runs.items()}
    for partition in (0, 1):
        a, b = saved["per-record"][partition], saved["batch"][partition]
        # (the pending stores' segments follow when each checkpoint was written, which the
        # polls decide: their events are compared by what the second runs did with them)
        for field in ("model", "scaler", "next_offset", "metrics"):
            assert same(a.get(field), b.get(field)), (partition, field)
