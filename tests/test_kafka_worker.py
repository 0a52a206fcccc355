"""The Kafka worker against a real broker (the embedded Tansu, started once by a fixture).

Every test uses fresh topic and group names. Reference results come from River itself
(`evaluate.progressive_val_score`) or from the model run straight over the same records.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from river import evaluate, metrics, preprocessing
from river.datasets import synth

import streammargin
from connectors import checkpoint
from connectors.broker import create_topics
from connectors.worker import Worker, WorkerConfig
from streammargin import state

pytestmark = pytest.mark.kafka

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAST_GROUP = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}


# Helpers ------------------------------------------------------------------------------------------


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, items) -> None:
    """Send `(partition, value)` or `(partition, value, key)` items, in order."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10, max_request_size=8 << 20)
    for item in items:
        partition, value, key = (*item, None) if len(item) == 2 else item
        producer.send(topic, value, key=key, partition=partition)
    producer.flush()
    producer.close()


def read_all(bootstrap: str, topic: str, timeout: float = 20.0) -> list:
    """Every record of a topic, from the beginning to the highwater mark."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=20)
    numbers = consumer.partitions_for_topic(topic)
    if not numbers:  # not created yet
        consumer.close()
        return []
    partitions = [TopicPartition(topic, p) for p in sorted(numbers)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    records = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = consumer.poll(timeout_ms=200)
        for part in batch.values():
            records.extend(part)
        if not batch and all(
            consumer.highwater(tp) is not None and consumer.position(tp) >= consumer.highwater(tp)
            for tp in partitions
        ):
            break
    consumer.close()
    return records


def config(bootstrap: str, name: str, **options) -> WorkerConfig:
    settings = {
        "topics": [name],
        "bootstrap_servers": bootstrap,
        "group_id": f"{name}.group",
        "predictions_topic": f"{name}.predictions",
        "metrics_topic": f"{name}.metrics",
        "dead_letter_topic": f"{name}.dead",
        "checkpoint_topic": f"{name}.checkpoints",
        "idle_timeout": 1.0,
        **FAST_GROUP,
    }
    settings.update(options)
    return WorkerConfig(**settings)


def saved_tasks(bootstrap: str, cfg: WorkerConfig, partitions) -> dict[int, dict]:
    """The latest checkpoint of each input partition, decoded."""
    store = checkpoint.CheckpointStore(bootstrap, cfg.checkpoint_topic, cfg.group_id)
    try:
        found = store.load([(cfg.topics[0], p) for p in partitions])
    finally:
        store.close()
    return {p: checkpoint.decode_checkpoint(found[(cfg.topics[0], p)].payload) for p in partitions}


def model_bytes(model) -> bytes:
    return state.dumps(model.to_state())


def saved_model_bytes(fields: dict) -> bytes:
    return model_bytes(streammargin.from_state(fields["model"]))


def straight_run(events, model):
    """The model run over (x, y) in order as the worker does: predict, then learn.

    Returns the model and the (label, probability of True) it served for each event.
    """
    served = []
    for x, y in events:
        served.append((model.predict_one(x), model.predict_proba_one(x)[True]))
        model.learn_one(x, y)
    return model, served


def progressive(events, make_model):
    """River's progressive validation: (accuracy, log loss) of a fresh model over events."""
    accuracy = evaluate.progressive_val_score(events, make_model(), metrics.Accuracy())
    log_loss = evaluate.progressive_val_score(events, make_model(), metrics.LogLoss())
    return accuracy.get(), log_loss.get()


def labelled_stream(n: int, seed: int = 7):
    return [(x, bool(y)) for x, y in synth.Agrawal(classification_function=2, seed=seed).take(n)]


def worded_stream(n: int, seed: int, vocabulary: int):
    """Agrawal records plus one of `vocabulary` word features each: the model's state, and so
    its checkpoint, grows with the words seen."""
    return [({**x, f"w{i * 7919 % vocabulary}": 1.0}, y)
            for i, (x, y) in enumerate(labelled_stream(n, seed=seed))]


def latest_checkpoint(bootstrap: str, cfg: WorkerConfig, partition: int):
    store = checkpoint.CheckpointStore(bootstrap, cfg.checkpoint_topic, cfg.group_id)
    try:
        return store.load([(cfg.topics[0], partition)])[(cfg.topics[0], partition)]
    finally:
        store.close()


def event(i, x, y=None) -> bytes:
    record = {"id": f"e{i}", "x": x}
    if y is not None:
        record["y"] = y
    return json.dumps(record).encode()


# In-process worker --------------------------------------------------------------------------------


def test_every_record_gets_one_prediction_and_the_metrics_equal_rivers_progressive_validation(
    kafka_broker,
):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("pv")
    create_topics(bootstrap, [name], partitions=2)
    data = labelled_stream(10_000)
    produce(bootstrap, name, [(i % 2, event(i, x, y)) for i, (x, y) in enumerate(data)])
    cfg = config(bootstrap, name, metrics_every=2_000, checkpoint_every=3_000)
    summary = Worker(cfg).run()
    assert summary["reason"] == "idle" and summary["records"] == 10_000

    predictions = [json.loads(r.value) for r in read_all(bootstrap, cfg.predictions_topic)]
    assert len(predictions) == 10_000
    assert len({(p["partition"], p["offset"]) for p in predictions}) == 10_000
    tasks = saved_tasks(bootstrap, cfg, [0, 1])
    for partition in (0, 1):
        events = data[partition::2]
        # River's own progressive validation of the same model on the same records.
        accuracy, log_loss = progressive(events, streammargin.ALMAClassifier)
        final = summary["partitions"][f"{name}/{partition}"]
        assert final["event"] == "final" and final["records"] == 5_000
        assert final["accuracy"] == accuracy and final["log_loss"] == log_loss
        assert final["labelled"] == final["predictions"] == 5_000
        # Each prediction record carries exactly the probability the model served.
        model, served = straight_run(events, streammargin.ALMAClassifier())
        mine = sorted((p for p in predictions if p["partition"] == partition),
                      key=lambda p: p["offset"])
        assert [p["p_true"] for p in mine] == [p_true for _, p_true in served]
        assert [p["y_pred"] for p in mine] == [y_pred for y_pred, _ in served]
        assert [p["id"] for p in mine] == [f"e{i}" for i in range(partition, 10_000, 2)]
        assert all(p["topic"] == name and p["model"] == "alma" for p in mine)
        assert tasks[partition]["next_offset"] == 5_000
        assert saved_model_bytes(tasks[partition]) == model_bytes(model)
    records = [json.loads(r.value) for r in read_all(bootstrap, cfg.metrics_topic)]
    periodic = [r for r in records if r["event"] == "periodic"]
    assert sorted((r["partition"], r["records"]) for r in periodic) == [
        (p, n) for p in (0, 1) for n in (2_000, 4_000)
    ]
    assert all(r["model_counters"]["trials"] == r["labelled"] for r in records)


def test_scaler_in_front_matches_rivers_pipeline_and_survives_a_restart(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("scaled")
    create_topics(bootstrap, [name])
    # SEA's feature names are ints; they arrive as JSON object keys, i.e. strings.
    data = [({str(k): v for k, v in x.items()}, bool(y)) for x, y in synth.SEA(seed=3).take(4_000)]
    produce(bootstrap, name, [(0, event(i, x, y)) for i, (x, y) in enumerate(data[:2_500])])
    cfg = config(bootstrap, name, scale=True, params={"alpha": 0.8})
    Worker(cfg).run()
    produce(bootstrap, name, [(0, event(i, x, y)) for i, (x, y) in enumerate(data[2_500:], 2_500)])
    summary = Worker(cfg).run()  # restores the scaler and the model from the checkpoint

    def make_pipeline():
        return preprocessing.StandardScaler() | streammargin.ALMAClassifier(alpha=0.8)

    final = summary["partitions"][f"{name}/0"]
    assert (final["accuracy"], final["log_loss"]) == progressive(data, make_pipeline)
    pipeline, _ = straight_run(data, make_pipeline())
    fields = saved_tasks(bootstrap, cfg, [0])[0]
    assert saved_model_bytes(fields) == model_bytes(pipeline["ALMAClassifier"])
    scaler = streammargin.StandardScaler.from_state(fields["scaler"])
    river_scaler = pipeline["StandardScaler"]
    assert (scaler.counts, scaler.means, scaler.vars) == (
        dict(river_scaler.counts), dict(river_scaler.means), dict(river_scaler.vars)
    )


def test_bad_records_become_dead_letters_and_leave_the_model_untouched(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("dead")
    create_topics(bootstrap, [name])
    good = labelled_stream(300, seed=2)
    bad = [
        (b"not json", b"k1", "bad JSON"),
        (b'{"x": {"age": NaN}, "y": true}', None, "non-finite number NaN"),
        (b'{"x": {"age": 1e999}, "y": true}', None, "feature 'age' has value inf"),
        (b'{"x": {"age": "old"}, "y": true}', None, "feature 'age' has value 'old' of type str"),
        (b'{"y": true}', None, "label record without an id"),
        (b'{"id": "z"}', None, "missing x"),
        (b'{"x": {"age": 3}, "y": "spam"}', None, "unknown label 'spam'"),
        (b'{"x": [1, 2], "y": true}', None, "x must be a JSON object"),
        (b'{"x": {"age": 1}, "y": 1}' + b" " * 3_000, None, "oversized record"),
        (b"\xff\xfe\x00", None, "bad JSON"),
        (None, b"tombstone", "empty record"),
    ]
    items, bad_offsets, good_events = [], {}, []
    for i, (x, y) in enumerate(good):
        items.append((0, event(i, x, y)))
        good_events.append((x, y))
        if i % 25 == 10 and bad:
            value, key, reason = bad.pop(0)
            bad_offsets[len(items)] = (value, key, reason)
            items.append((0, value, key))
    assert not bad
    produce(bootstrap, name, items)
    cfg = config(bootstrap, name, max_record_bytes=2_000)
    summary = Worker(cfg).run()

    dead = read_all(bootstrap, cfg.dead_letter_topic)
    assert len(dead) == len(bad_offsets)
    for record in dead:
        headers = {k: v.decode() for k, v in record.headers}
        offset = int(headers["streammargin.error.offset"])
        value, key, reason = bad_offsets[offset]
        assert reason in headers["streammargin.error.reason"]
        assert headers["streammargin.error.topic"] == name
        assert headers["streammargin.error.partition"] == "0"
        assert record.value == (value if value is not None else b"")
        assert record.key == key
    predictions = [json.loads(r.value) for r in read_all(bootstrap, cfg.predictions_topic)]
    assert sorted(p["offset"] for p in predictions) == sorted(
        set(range(len(items))) - set(bad_offsets)
    )
    final = summary["partitions"][f"{name}/0"]
    assert final["dead_letters"] == len(bad_offsets) and final["records"] == len(items)
    model, _ = straight_run(good_events, streammargin.ALMAClassifier())
    assert saved_model_bytes(saved_tasks(bootstrap, cfg, [0])[0]) == model_bytes(model)


def test_delayed_labels_join_their_events_expire_and_orphans_are_counted(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("delayed")
    create_topics(bootstrap, [name])
    pool = iter(labelled_stream(2_000, seed=5))
    items: list[bytes] = []
    # The reference replays the policy: a prediction when the event comes, learning and the
    # metric when its label comes.
    reference = streammargin.ALMAClassifier()
    accuracy = metrics.Accuracy()
    n_labelled = 0
    waiting: dict[str, tuple] = {}

    def unlabelled(event_id):
        x, y = next(pool)
        items.append(json.dumps({"id": event_id, "x": x}).encode())
        waiting[event_id] = (x, y, reference.predict_one(x))

    def label(event_id, joins=True):
        x, y, y_pred = waiting.pop(event_id, (None, True, None))
        items.append(json.dumps({"id": event_id, "y": y}).encode())
        if joins:
            nonlocal n_labelled
            n_labelled += 1
            accuracy.update(y, y_pred)
            reference.learn_one(x, y)

    def labelled():
        nonlocal n_labelled
        n_labelled += 1
        x, y = next(pool)
        items.append(json.dumps({"x": x, "y": y}).encode())
        accuracy.update(y, reference.predict_one(x))
        reference.learn_one(x, y)

    for block in range(5):  # 20 events, 10 labelled records, then their labels, out of order
        ids = [f"b{block}-{i}" for i in range(20)]
        for event_id in ids:
            unlabelled(event_id)
        for _ in range(10):
            labelled()
        for event_id in reversed(ids):
            label(event_id)
    for i in range(3):  # orphans
        label(f"nobody-{i}", joins=False)
    ids = [f"big-{i}" for i in range(60)]  # 60 waiting > label_store_size=50: 10 evicted
    for event_id in ids:
        unlabelled(event_id)
    for event_id in ids:
        label(event_id, joins=event_id not in ids[:10])
    unlabelled("late")  # its label comes 120 records later > label_max_age_records=100
    for _ in range(119):
        labelled()
    label("late", joins=False)
    produce(bootstrap, name, [(0, value) for value in items])
    cfg = config(bootstrap, name, label_store_size=50, label_max_age_records=100)
    summary = Worker(cfg).run()

    final = summary["partitions"][f"{name}/0"]
    # Expired: 10 evicted by the size limit, 1 by age. Orphans: 3 unknown ids, and the labels of
    # the 10 evicted events (nothing waits for them any more).
    assert final["labels"] == {"pending": 0, "joined": 150, "expired": 11, "orphans": 13,
                               "unjoinable": 0}
    assert final["labelled"] == n_labelled == 319
    assert final["accuracy"] == accuracy.get()
    assert saved_model_bytes(saved_tasks(bootstrap, cfg, [0])[0]) == model_bytes(reference)
    predictions = [json.loads(r.value) for r in read_all(bootstrap, cfg.predictions_topic)]
    n_events = sum(1 for value in items if b'"x"' in value)
    assert len(predictions) == final["predictions"] == n_events


def test_a_stop_finishes_the_record_in_hand_and_a_restart_continues_exactly(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("stop")
    create_topics(bootstrap, [name])
    data = labelled_stream(3_000, seed=11)
    produce(bootstrap, name, [(0, event(i, x, y)) for i, (x, y) in enumerate(data)])
    cfg = config(bootstrap, name, metrics_every=1_000, idle_timeout=None, max_poll_records=400)
    stop = threading.Event()

    def on_metrics(record):
        if record["event"] == "periodic" and record["records"] == 1_000:
            stop.set()  # while record 999 is in hand

    summary = Worker(cfg).run(stop_event=stop, on_metrics=on_metrics)
    assert summary["reason"] == "stopped" and summary["records"] == 1_000
    first = saved_tasks(bootstrap, cfg, [0])[0]
    assert first["next_offset"] == 1_000
    model, _ = straight_run(data[:1_000], streammargin.ALMAClassifier())
    assert saved_model_bytes(first) == model_bytes(model)

    cfg.idle_timeout = 1.0
    summary = Worker(cfg).run()
    assert summary["records"] == 2_000
    model, _ = straight_run(data[1_000:], model)
    assert saved_model_bytes(saved_tasks(bootstrap, cfg, [0])[0]) == model_bytes(model)
    evaluation = evaluate.progressive_val_score(data, streammargin.ALMAClassifier(),
                                                metrics.Accuracy())
    assert summary["partitions"][f"{name}/0"]["accuracy"] == evaluation.get()


def test_a_checkpoint_larger_than_a_producer_request_is_chunked_and_restores_exactly(
    kafka_broker,
):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("bigstate")
    create_topics(bootstrap, [name])
    data = worded_stream(3_000, seed=23, vocabulary=1_500)
    produce(bootstrap, name, [(0, event(i, x, y)) for i, (x, y) in enumerate(data[:2_000])])
    # A producer that refuses requests above 32 KiB (as a broker's message.max.bytes would).
    cfg = config(bootstrap, name, producer_config={"max_request_size": 32 << 10})
    Worker(cfg).run()
    saved = latest_checkpoint(bootstrap, cfg, 0)
    assert len(saved.payload) > 32 << 10 and saved.chunks >= 2, saved

    produce(bootstrap, name,
            [(0, event(i, x, y)) for i, (x, y) in enumerate(data[2_000:], 2_000)])
    summary = Worker(cfg).run()  # restores the chunked checkpoint
    assert summary["records"] == 1_000
    model, _ = straight_run(data, streammargin.ALMAClassifier())
    assert saved_model_bytes(saved_tasks(bootstrap, cfg, [0])[0]) == model_bytes(model)


def test_an_abrupt_concept_change_is_detected_shortly_after_the_change_point(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("drift")
    create_topics(bootstrap, [name])
    change = 3_000
    # SEA, then the same concept with every label flipped: the error rate jumps at `change`.
    data = [(x, bool(y) != (i >= change))
            for i, (x, y) in enumerate(synth.SEA(seed=1).take(2 * change))]
    produce(bootstrap, name, [(0, event(i, x, y)) for i, (x, y) in enumerate(data)])
    cfg = config(bootstrap, name, scale=True)
    seen = []
    summary = Worker(cfg).run(on_metrics=seen.append)

    final = summary["partitions"][f"{name}/0"]
    offsets = final["drift"]["recent_detection_offsets"]
    after = [o for o in offsets if o >= change]
    assert after and after[0] < change + 300, offsets
    assert final["drift"]["detector"] == "ADWIN"
    drift_events = [r["next_offset"] - 1 for r in seen if r["event"] == "drift"]
    assert drift_events == offsets  # each detection was also reported as it happened


# Worker processes ---------------------------------------------------------------------------------


def start_worker(cfg: WorkerConfig, log_path: pathlib.Path, *extra: str) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", "connectors.cli", "kafka",
        "--bootstrap-servers", cfg.bootstrap_servers,
        "--topic", cfg.topics[0],
        "--group-id", cfg.group_id,
        "--predictions-topic", cfg.predictions_topic,
        "--metrics-topic", cfg.metrics_topic,
        "--dead-letter-topic", cfg.dead_letter_topic,
        "--checkpoint-topic", cfg.checkpoint_topic,
        "--session-timeout-ms", "2000",
        "--heartbeat-interval-ms", "500",
        "--checkpoint-interval", "none",
        *extra,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "wb")  # noqa: SIM115 (closed by the process' end)
    return subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def covered(bootstrap: str, topic: str, expected: set) -> bool:
    seen = {(r.partition, json.loads(r.value)["offset"]) for r in read_all(bootstrap, topic)}
    return expected <= seen


def reap(process: subprocess.Popen, log_path: pathlib.Path, timeout: float = 30.0) -> int:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"worker did not exit:\n{log_path.read_text()[-3000:]}") from None


def test_sigkill_and_restart_end_with_exactly_the_uninterrupted_model(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("kill")
    create_topics(bootstrap, [name], partitions=2)
    data = labelled_stream(12_000, seed=13)
    items = [(i % 2, event(i, x, y)) for i, (x, y) in enumerate(data)]
    cfg = config(bootstrap, name)
    produce(bootstrap, name, items[:8_000])
    first = start_worker(cfg, tmp_path / "first.log", "--checkpoint-every", "1500",
                         "--max-poll-records", "500")
    try:
        # Past the checkpoint at 3000 of each partition, which is the last one the first worker
        # writes (4000 records each, a checkpoint every 1500): the kill loses >= 500 records.
        wait_for(lambda: covered(bootstrap, cfg.predictions_topic,
                                 {(p, o) for p in (0, 1) for o in range(3_500)}),
                 60, "the first worker's predictions")
        first.send_signal(signal.SIGKILL)
    finally:
        reap(first, tmp_path / "first.log")
    produce(bootstrap, name, items[8_000:])
    second = start_worker(cfg, tmp_path / "second.log", "--checkpoint-every", "1500")
    try:
        expected = {(p, o) for p in (0, 1) for o in range(6_000)}
        wait_for(lambda: covered(bootstrap, cfg.predictions_topic, expected), 60,
                 "predictions of every record")
        second.send_signal(signal.SIGTERM)  # graceful: checkpoint, commit, exit 0
        assert reap(second, tmp_path / "second.log") == 0, (tmp_path / "second.log").read_text()
    finally:
        if second.poll() is None:
            second.kill()

    predictions = read_all(bootstrap, cfg.predictions_topic)
    assert len(predictions) > 12_000  # records after the last checkpoint were replayed
    tasks = saved_tasks(bootstrap, cfg, [0, 1])
    for partition in (0, 1):
        events = data[partition::2]
        model, _ = straight_run(events, streammargin.ALMAClassifier())
        assert tasks[partition]["next_offset"] == 6_000
        assert saved_model_bytes(tasks[partition]) == model_bytes(model)
        evaluation = evaluate.progressive_val_score(events, streammargin.ALMAClassifier(),
                                                    metrics.Accuracy())
        final = read_all(bootstrap, cfg.metrics_topic)
        finals = [json.loads(r.value) for r in final]
        last = [r for r in finals if r["partition"] == partition and r["event"] == "final"][-1]
        assert last["accuracy"] == evaluation.get() and last["records"] == 6_000


def test_sigkill_and_restart_with_checkpoints_of_many_chunks_end_with_the_same_model(
    kafka_broker, tmp_path
):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("killchunks")
    create_topics(bootstrap, [name], partitions=2)
    data = worded_stream(6_000, seed=29, vocabulary=400)
    items = [(i % 2, event(i, x, y)) for i, (x, y) in enumerate(data)]
    cfg = config(bootstrap, name)
    options = ("--checkpoint-every", "400", "--checkpoint-chunk-bytes", "1024")
    produce(bootstrap, name, items[:4_000])
    first = start_worker(cfg, tmp_path / "first.log", *options, "--max-poll-records", "100")
    try:
        # Past the checkpoints at 1200 of each partition, the last ones written before the kill
        # are at >= 1200: the kill loses records and catches a checkpoint's write in progress
        # or not, whichever comes.
        wait_for(lambda: covered(bootstrap, cfg.predictions_topic,
                                 {(p, o) for p in (0, 1) for o in range(1_500)}),
                 60, "the first worker's predictions")
        first.send_signal(signal.SIGKILL)
    finally:
        reap(first, tmp_path / "first.log")
    produce(bootstrap, name, items[4_000:])
    second = start_worker(cfg, tmp_path / "second.log", *options)
    try:
        expected = {(p, o) for p in (0, 1) for o in range(3_000)}
        wait_for(lambda: covered(bootstrap, cfg.predictions_topic, expected), 60,
                 "predictions of every record")
        second.send_signal(signal.SIGTERM)
        assert reap(second, tmp_path / "second.log") == 0, (tmp_path / "second.log").read_text()
    finally:
        if second.poll() is None:
            second.kill()
    log_text = (tmp_path / "second.log").read_text()
    assert "(2 restored from checkpoints)" in log_text, log_text

    tasks = saved_tasks(bootstrap, cfg, [0, 1])
    for partition in (0, 1):
        assert latest_checkpoint(bootstrap, cfg, partition).chunks >= 10
        model, _ = straight_run(data[partition::2], streammargin.ALMAClassifier())
        assert tasks[partition]["next_offset"] == 3_000
        assert saved_model_bytes(tasks[partition]) == model_bytes(model)


def test_two_workers_share_the_partitions_and_the_survivor_takes_over(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("group")
    create_topics(bootstrap, [name], partitions=4)
    data = labelled_stream(8_000, seed=17)
    items = [(i % 4, event(i, x, y)) for i, (x, y) in enumerate(data)]
    cfg = config(bootstrap, name)
    produce(bootstrap, name, items[:4_000])
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    workers = [
        start_worker(cfg, logs[0], "--checkpoint-every", "300", "--max-poll-records", "200"),
        start_worker(cfg, logs[1], "--checkpoint-every", "300", "--max-poll-records", "200",
                     "--idle-timeout", "6"),
    ]
    try:
        # Both members own partitions (the second join moves two of them).
        def both_assigned():
            texts = [log.read_text() if log.exists() else "" for log in logs]
            return all(f"assigned {name}/" in text for text in texts)

        wait_for(both_assigned, 60, "both workers to own partitions")
        wait_for(lambda: covered(bootstrap, cfg.predictions_topic,
                                 {(p, o) for p in range(4) for o in range(1_000)}),
                 60, "predictions of the first records")
        workers[0].send_signal(signal.SIGKILL)
        reap(workers[0], logs[0])
        produce(bootstrap, name, items[4_000:])
        assert reap(workers[1], logs[1], timeout=60) == 0, logs[1].read_text()
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()

    everything = {(p, o) for p in range(4) for o in range(2_000)}
    assert covered(bootstrap, cfg.predictions_topic, everything)
    tasks = saved_tasks(bootstrap, cfg, range(4))
    for partition in range(4):
        model, _ = straight_run(data[partition::4], streammargin.ALMAClassifier())
        assert tasks[partition]["next_offset"] == 2_000
        assert saved_model_bytes(tasks[partition]) == model_bytes(model)
    # The survivor restored partitions from checkpoints (the dead worker's, or its own after
    # the first rebalance).
    restored = re.findall(r"\((\d+) restored from checkpoints\)", logs[1].read_text())
    assert any(int(n) > 0 for n in restored), logs[1].read_text()


def test_predictions_can_be_batched_as_json_lines(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("lines")
    create_topics(bootstrap, [name])
    data = labelled_stream(1_000, seed=19)
    produce(bootstrap, name, [(0, event(i, x, y)) for i, (x, y) in enumerate(data)])
    cfg = config(bootstrap, name, predictions_per_message=64, max_poll_records=300)
    Worker(cfg).run()
    messages = read_all(bootstrap, cfg.predictions_topic)
    lines = [json.loads(line) for m in messages for line in m.value.split(b"\n")]
    assert all(len(m.value.split(b"\n")) <= 64 for m in messages) and len(messages) < 100
    _, served = straight_run(data, streammargin.ALMAClassifier())
    assert [p["offset"] for p in lines] == list(range(1_000))
    assert [(p["y_pred"], p["p_true"]) for p in lines] == served
