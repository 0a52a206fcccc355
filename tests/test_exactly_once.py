"""`--processing-guarantee exactly-once` on Apache Kafka: transactions, fencing, replay.

The worker's promise: whatever crashes, a read_committed consumer sees exactly one prediction per
input offset, and the model ends as an uninterrupted run's. These tests SIGKILL workers over and
over while the group rebalances, freeze one past its session (a zombie), and check both halves
of the promise record by record. Tansu cannot show it (it hides aborted transactions from both
isolation levels), so they need Apache Kafka.
"""

from __future__ import annotations

import json
import sys
import time

import pytest
import test_kafka_worker as w
import conftest

sys.path.insert(0, str(w.ROOT / "benchmarks"))
import exactly_once_faults  # noqa: E402 (the fault harness, shared with the benchmark)

import streammargin
from connectors.kafka.broker import create_topics
from connectors.state import checkpoint
from connectors.worker.worker import Worker, WorkerConfig, client_settings

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(conftest.test_broker_kind()[0] != "apache-kafka",
                       reason="exactly-once needs Apache Kafka (Tansu hides aborted transactions)"),
]


def labelled_topic(bootstrap: str, prefix: str, n: int, partitions: int, seed: int):
    """A fresh topic of `n` labelled events spread round robin over `partitions`: its name and
    the events."""
    name = w.fresh(prefix)
    create_topics(bootstrap, [name], partitions=partitions)
    data = w.labelled_stream(n, seed=seed)
    w.produce(bootstrap, name, [(i % partitions, w.event(i, x, y))
                                for i, (x, y) in enumerate(data)])
    return name, data


def test_exactly_once_settings_read_committed_and_name_a_transactional_id():
    cfg = WorkerConfig(topics=["t"], group_id="g", processing_guarantee="exactly-once")
    settings = client_settings(cfg, client_id="pod-0")
    assert settings["producer"]["transactional_id"] == "g-pod-0"
    assert settings["consumer"]["isolation_level"] == "read_committed"
    assert settings["checkpoint_reader"]["isolation_level"] == "read_committed"
    assert "transactional_id" not in client_settings(WorkerConfig(topics=["t"]))["producer"]
    with pytest.raises(ValueError, match="isolation_level=read_uncommitted contradicts"):
        WorkerConfig(topics=["t"], processing_guarantee="exactly-once",
                     consumer_config={"isolation_level": "read_uncommitted"})
    with pytest.raises(ValueError, match="needs --processing-guarantee exactly-once"):
        WorkerConfig(topics=["t"], producer_config={"transactional_id": "x"})
    with pytest.raises(ValueError, match="processing_guarantee must be one of"):
        WorkerConfig(topics=["t"], processing_guarantee="exactly_once")


@w.both_transports
def test_an_exactly_once_run_commits_its_outputs_and_checkpoints_in_transactions(
    transport, kafka_broker
):
    bootstrap = kafka_broker.bootstrap_servers
    name, data = labelled_topic(bootstrap, "eos-run", 3_000, partitions=2, seed=21)
    w.produce(bootstrap, name, [(0, b"not json")])  # a dead letter inside a transaction
    cfg = w.config(bootstrap, name, processing_guarantee="exactly-once", transport=transport,
                   checkpoint_every=400, max_poll_records=300)
    summary = Worker(cfg).run()
    assert summary["reason"] == "idle"
    assert summary["transactions"]["committed"] >= 3 and summary["transactions"]["aborted"] == 0

    predictions = exactly_once_faults.read_topic(bootstrap, cfg.predictions_topic)
    seen = [(json.loads(r.value)["partition"], json.loads(r.value)["offset"]) for r in predictions]
    assert len(seen) == len(set(seen)) == 3_000
    dead = exactly_once_faults.read_topic(bootstrap, cfg.dead_letter_topic)
    assert [r.value for r in dead] == [b"not json"]
    # Every record went out inside a transaction: a read_uncommitted reader sees the same
    # records, and the control records (commit markers) between them move the offsets on.
    everything = exactly_once_faults.read_topic(bootstrap, cfg.predictions_topic, committed=False)
    assert len(everything) == 3_000
    tasks = exactly_once_faults.committed_checkpoints(
        bootstrap, cfg.checkpoint_topic, cfg.group_id, name, range(2))
    for partition in (0, 1):
        events = [(x, y) for i, (x, y) in enumerate(data) if i % 2 == partition]
        model, _ = w.straight_run(events, streammargin.ALMAClassifier())
        assert w.saved_model_bytes(tasks[partition]) == w.model_bytes(model)


# Its faults of old, on this 2-core machine under load (the closing notes of the exactly-once
# issue): on kafka-python two partitions' final models unlike an uninterrupted run's (a restore
# that missed its checkpoint), on librdkafka a restarted worker's checkpoint read that found no
# end for 60 s. Both were fixed; the test was a non-strict xfail until it had passed often
# enough: every CI run since, and 12 runs in a row on each transport, two at a time.
@w.both_transports
def test_sigkills_and_a_zombie_leave_exactly_one_prediction_per_offset_and_the_model(
    transport, kafka_broker, tmp_path
):
    """The harness of benchmarks/exactly_once_faults.py (which runs >= 10 kills): 4 SIGKILLs
    and a zombie among three workers over 50,000 records."""
    result = exactly_once_faults.run_faults(kafka_broker.bootstrap_servers, transport,
                                            n_records=50_000, n_kills=4, seed=5,
                                            workdir=tmp_path)
    logs = "\n".join(log.read_text()[-1500:] for log in result["logs"][-3:])
    assert result["kills"] == 4 and result["zombies"] == 1
    assert set(result["exits"].values()) == {0}, logs
    assert result["lost"] == 0 and result["unexpected"] == 0, logs
    assert result["duplicated"] == 0, "a prediction was committed twice"
    assert result["committed"] == 50_000
    assert result["identical_models"] == 4, result["diverged"]


def _transport_class(transport: str):
    if transport == "kafka-python":
        from connectors.kafka.transport import KafkaPythonTransport

        return KafkaPythonTransport
    from connectors.kafka.librdkafka_transport import LibrdkafkaTransport

    return LibrdkafkaTransport


@w.both_transports
def test_an_aborted_transaction_rewinds_every_task_and_the_replay_is_exact(
    transport, kafka_broker, monkeypatch
):
    from connectors.kafka.transport import TransactionAborted

    bootstrap = kafka_broker.bootstrap_servers
    name, data = labelled_topic(bootstrap, "eos-abort", 3_000, partitions=2, seed=8)
    cls = _transport_class(transport)
    real_commit = cls.commit_transaction
    calls = []

    def second_commit_aborts(self, offsets, before_commit=None):
        calls.append(dict(offsets))
        if len(calls) == 2:  # as a broker refusing it would: aborted, then said so
            before_commit()  # the checkpoints were written, and go with the transaction
            self.abort_transaction()
            raise TransactionAborted(RuntimeError("injected"))
        return real_commit(self, offsets, before_commit)

    monkeypatch.setattr(cls, "commit_transaction", second_commit_aborts)
    cfg = w.config(bootstrap, name, processing_guarantee="exactly-once", transport=transport,
                   checkpoint_every=300, max_poll_records=200)
    summary = Worker(cfg).run()
    assert summary["transactions"]["aborted"] == 1
    # The aborted interval's offsets came again in a later commit.
    later = {tp: max(o.get(tp, -1) for o in calls[2:]) for tp in calls[1]}
    assert all(later[tp] >= offset for tp, offset in calls[1].items())

    predictions = exactly_once_faults.read_topic(bootstrap, cfg.predictions_topic)
    seen = [(json.loads(r.value)["partition"], json.loads(r.value)["offset"]) for r in predictions]
    assert len(seen) == len(set(seen)) == 3_000
    aborted_too = exactly_once_faults.read_topic(bootstrap, cfg.predictions_topic,
                                                 committed=False)
    assert len(aborted_too) > 3_000
    tasks = exactly_once_faults.committed_checkpoints(bootstrap, cfg.checkpoint_topic,
                                                      cfg.group_id, name, range(2))
    finals = [json.loads(r.value) for r in
              exactly_once_faults.read_topic(bootstrap, cfg.metrics_topic)]
    for partition in (0, 1):
        events = [(x, y) for i, (x, y) in enumerate(data) if i % 2 == partition]
        model, _ = w.straight_run(events, streammargin.ALMAClassifier())
        assert w.saved_model_bytes(tasks[partition]) == w.model_bytes(model)
        # The metrics were rewound with the model: River's progressive accuracy, once.
        accuracy, _ = w.progressive(events, streammargin.ALMAClassifier)
        last = [r for r in finals if r["partition"] == partition and r["event"] == "final"]
        assert len(last) == 1 and last[0]["accuracy"] == accuracy


@w.both_transports
def test_a_fenced_producer_stops_the_worker_with_one_line_and_commits_nothing(
    transport, kafka_broker
):
    import threading

    from connectors.worker.worker import WorkerError

    bootstrap = kafka_broker.bootstrap_servers
    name, _ = labelled_topic(bootstrap, "eos-fenced", 400, partitions=1, seed=2)
    cfg = w.config(bootstrap, name, processing_guarantee="exactly-once", transport=transport,
                   client_id="pod-0", checkpoint_every=100_000, checkpoint_interval=None,
                   idle_timeout=None)
    worker = Worker(cfg)
    failure: list[BaseException] = []

    def run():
        try:
            worker.run()
        except BaseException as error:  # noqa: BLE001 (the test reads it)
            failure.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    w.wait_for(lambda: worker.throughput.count >= 400, 60, "the first records")
    # Another producer with the worker's transactional id: the worker is now a zombie.
    from kafka import KafkaProducer

    usurper = KafkaProducer(bootstrap_servers=bootstrap,
                            transactional_id=f"{cfg.group_id}-pod-0")
    usurper.init_transactions()
    usurper.close()
    worker.stop()
    thread.join(60)
    assert not thread.is_alive()
    [error] = failure
    assert isinstance(error, WorkerError)
    text = str(error)
    assert "\n" not in text
    assert f"another producer with transactional_id '{cfg.group_id}-pod-0'" in text
    assert "Nothing of the open transaction was committed" in text
    assert exactly_once_faults.read_topic(bootstrap, cfg.predictions_topic) == []
