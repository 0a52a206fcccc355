"""--max-memory: one ceiling for the worker, each bounded part's share of it
(connectors/worker/memory_budget.py), and what the worker does with it on a real broker."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors import cli
from connectors.task import PendingLabels
from connectors.worker import memory_budget
from connectors.worker.config import WorkerConfig, client_settings
from connectors.worker.memory_budget import MemoryBudget, MemoryBudgetError, parse_size

MiB = 1 << 20


def budget(max_memory: int, model: int = 17 * MiB, **parts) -> MemoryBudget:
    fields = {"process": 96 * MiB, "fetch": 26 * MiB, "outputs": 10 * MiB, "model": model,
              "state": model // 2,
              "exchange_model": 0, "exchange_kind": "mix", "schema_cache": 0,
              "label_store_bytes": 256 * MiB, **parts}
    return MemoryBudget(max_memory=max_memory, **fields)


@pytest.mark.parametrize(("text", "size"), [
    ("512MiB", 512 * MiB), ("2GiB", 2 << 30), ("2Gi", 2 << 30), ("1.5GB", 1_500_000_000),
    ("100M", 100_000_000), ("4096", 4096), (" 64 mib ", 64 * MiB)])
def test_sizes_read_as_kubernetes_and_iec_write_them(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "12 parsecs", "-1GiB", "1e9", "0x10"])
def test_what_is_not_a_size_is_refused(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@settings(max_examples=300, deadline=None)
@given(max_memory=st.integers(64 * MiB, 64 << 30), n=st.integers(1, 256),
       model=st.integers(0, 512 * MiB), cap=st.integers(MiB, 1 << 30))
def test_the_parts_never_exceed_the_ceiling_unless_it_is_overcommitted(max_memory, n, model,
                                                                       cap):
    plan = budget(max_memory, model, label_store_bytes=cap)
    parts = plan.parts(n)
    assert all(value >= 0 for value in parts.values())
    assert plan.pending_share(n) <= max(cap, memory_budget.MIN_SHARE_BYTES)
    if not plan.overcommitted(n):
        assert sum(parts.values()) <= max_memory
        assert plan.pending_share(n) >= memory_budget.MIN_SHARE_BYTES
    # More partitions never give one more room.
    assert plan.pending_share(n + 1) <= plan.pending_share(n)


def test_the_shares_shrink_as_partitions_come_and_a_store_evicts_its_oldest_counted():
    plan = budget(1 << 30)
    assert plan.pending_share(1) == 256 * MiB  # (--label-store-bytes caps one partition's)
    assert plan.pending_share(12) < plan.pending_share(3) < 256 * MiB
    store = PendingLabels(max_size=1000, max_bytes=10_000)
    for i in range(10):
        store.add(f"e{i}", {"a": 1.0}, i, i, True, 0.5, 900)
    store.resize(4_000)
    assert list(store.entries) == ["e6", "e7", "e8", "e9"]
    assert store.evicted == 6 and store.n_bytes == 3_600 and store.max_bytes == 4_000
    store.resize(20_000)  # (a share that grows evicts nothing)
    assert len(store) == 4 and store.evicted == 6


def test_a_ceiling_below_the_fixed_parts_is_the_cause_then_the_fix():
    with pytest.raises(MemoryBudgetError) as raised:
        budget(150 * MiB).check_start()
    cause, fix = str(raised.value).splitlines()
    assert "--max-memory 150 MiB is below what the worker needs on one partition" in cause
    assert "process 96 MiB" in cause
    assert fix.startswith("Fix: give --max-memory ") and fix.split()[3].endswith("MiB")
    need = parse_size(fix.split()[3])
    budget(need).check_start()  # what the fix says is enough


def test_the_command_exits_2_with_two_lines_when_the_ceiling_cannot_hold_it(capsys):
    code = cli.main(["kafka", "--topic", "t", "--bootstrap-servers", "127.0.0.1:9",
                     "--max-memory", "64MiB"])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert "--max-memory 64 MiB is below" in lines[0] and "Fix: give --max-memory" in lines[1]


def test_the_fetch_buffers_take_their_share_and_none_keeps_todays_settings():
    small = client_settings(WorkerConfig(topics=["t"], transport="librdkafka",
                                         max_memory=128 * MiB))["consumer"]
    assert small["queued.max.messages.kbytes"] == 3 * 1024 and small["fetch_max_bytes"] == 3 * MiB
    unbounded = client_settings(WorkerConfig(topics=["t"], transport="librdkafka",
                                             max_memory=None))["consumer"]
    assert "queued.max.messages.kbytes" not in unbounded
    assert unbounded["fetch_max_bytes"] == 64 * MiB


def test_the_budget_counts_the_schema_cache_and_the_jit():
    from connectors.worker.worker import Worker

    plain = Worker(WorkerConfig(topics=["t"])).memory
    avro = Worker(WorkerConfig(topics=["t"], value_format="avro",
                               schema_registry_url="http://127.0.0.1:9")).memory
    assert plain.schema_cache == 0 and avro.schema_cache == 4 * (32 * MiB)
    assert Worker(WorkerConfig(topics=["t"], max_memory=None)).memory is None


# On a real broker --------------------------------------------------------------------------------


@pytest.mark.kafka
def test_a_flood_of_waiting_events_stays_within_the_shares_and_is_counted(kafka_broker,
                                                                           caplog):
    import test_kafka_worker as w

    from connectors.kafka.broker import create_topics
    from connectors.worker.worker import Worker

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("memory-flood")
    create_topics(bootstrap, [name], partitions=2)
    features = {f"f{j}": 0.5 for j in range(40)}
    w.produce(bootstrap, name, [(i % 2, w.event(i, features)) for i in range(6_000)])
    cfg = w.config(bootstrap, name, max_memory=300 * MiB, label_store_bytes=256 * MiB)
    worker = Worker(cfg)
    share = worker.memory.pending_share(2)
    assert share < 256 * MiB
    # A share that 3,000 events of ~4.4 KB charged each (40 features) overflow: the stores
    # evict their oldest, counted, and hold no more than their share.
    worker.memory = dataclasses.replace(worker.memory, label_store_bytes=4 * MiB)
    with caplog.at_level(logging.INFO, logger="connectors.worker"):
        summary = worker.run()
    assert summary["records"] == 6_000
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("memory:")]
    assert line and "--max-memory 300 MiB at 2 partitions" in line[0], line
    for partition in (0, 1):
        labels = summary["partitions"][f"{name}/{partition}"]["labels"]
        assert labels["pending_bytes"] <= 4 * MiB
        assert labels["evicted"] > 0 and labels["pending"] + labels["evicted"] == 3_000
    assert worker.status.memory_parts["pending"] == 2 * 4 * MiB
    assert not worker.status.memory_overcommitted


@pytest.mark.kafka
def test_an_assignment_past_the_ceiling_is_one_error_line_and_a_gauge(kafka_broker, caplog):
    import test_kafka_worker as w

    from connectors.kafka.broker import create_topics
    from connectors.worker.worker import Worker

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("memory-over")
    create_topics(bootstrap, [name], partitions=6)
    w.produce(bootstrap, name, [(i % 6, w.event(i, {"a": 1.0}, i % 2 == 0)) for i in range(60)])
    # Enough for one partition, not for six model ceilings.
    one = budget(1 << 30, model=64 * MiB)
    ceiling = one.needed(1) + 8 * MiB
    cfg = w.config(bootstrap, name, max_memory=ceiling)
    worker = Worker(cfg)
    worker.memory = dataclasses.replace(worker.memory, model=64 * MiB, state=32 * MiB,
                                        max_memory=ceiling)
    with caplog.at_level(logging.INFO, logger="connectors.worker"):
        summary = worker.run()
    assert summary["records"] == 60  # it goes on
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith("memory: 6 partitions need") and "Fix: raise --max-memory" in (
        errors[0])
    assert worker.status.memory_overcommitted
    text = _metrics(worker.status)
    assert "streammargin_memory_overcommitted 1.0" in text
    models = [line for line in text.splitlines()
              if line.startswith('streammargin_memory_budget_bytes{part="models"}')]
    assert len(models) == 1 and float(models[0].split()[-1]) == 6 * 64 * MiB


def test_a_task_at_its_ceiling_fits_the_models_and_checkpoints_terms():
    # The models' term charges MODEL_COPIES x the model's ceiling, the checkpoints' one the
    # ceiling again for each state and one being encoded: driven to them with the longest names
    # a feature space stores (126 ASCII characters), which make the ceiling.
    import gc
    import json
    import random
    import tracemalloc

    from connectors.task import PartitionTask
    from connectors.worker.worker import Worker

    worker = Worker(WorkerConfig(topics=["t"], params={"max_features": 1024}))
    plan = worker.memory
    rng = random.Random(3)
    records = []
    for i in range(400):
        x = {f"{rng.randrange(10**6):0126d}": rng.gauss(0, 1) for _ in range(20)}
        value = json.dumps({"id": f"e{i}", "x": x, "y": i % 2 == 0}).encode()
        records.append(_Record("t", 0, i, None, value))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        task = PartitionTask.new("t", 0, worker.settings)
        task.process(records)
        del records
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.reset_peak()
        write = task.checkpoint_write()
        encoding = tracemalloc.get_traced_memory()[1] - before - held
    finally:
        tracemalloc.stop()
    assert len(task.model._features) >= 1024 - 128  # (its exact columns full)
    assert 0.6 * plan.model < held <= plan.model, (held, plan.model)
    assert 0.8 * plan.state < write.written_bytes <= plan.state, (write.written_bytes, plan.state)
    assert encoding <= memory_budget.ENCODING_STATES * plan.state, (encoding, plan.state)


class _Record:
    headers: list = []
    timestamp = 0

    def __init__(self, topic, partition, offset, key, value):
        self.topic, self.partition, self.offset, self.key, self.value = (
            topic, partition, offset, key, value)


def test_the_scaler_is_charged_under_scale_and_an_exchange_for_the_peers_only():
    from connectors.worker.worker import Worker
    from streammargin import scaler as scaler_module

    plain = Worker(WorkerConfig(topics=["t"])).memory
    scaled = Worker(WorkerConfig(topics=["t"], scale=True)).memory
    assert scaled.model - plain.model == scaler_module.memory_bound()
    assert scaled.state - plain.state == scaler_module.state_bound()
    topic = Worker(WorkerConfig(topics=["t"], model_scope="topic", model_topic="m")).memory
    one = topic.exchange_model
    # delta (a binary ALMA's default): the peers' models, the worker's, a record's, the ledger
    assert topic.exchange(12, 1) == (11 + 12 + 5) * one
    assert topic.exchange(12, 12) == (12 + 3) * one  # (no peer: the ledger alone)
    unledgered = dataclasses.replace(topic, exchange_ledger=False)  # (no peer ever: no ledger)
    assert unledgered.exchange(12, 12) == 0 and unledgered.exchange(12, 1) == topic.exchange(12, 1)
    assert topic.parts(12, 12)["exchange"] == topic.exchange(12, 12)
    mixing = Worker(WorkerConfig(topics=["t"], model_scope="topic", model_topic="m",
                                 model_exchange="mix")).memory
    assert mixing.exchange(12, 12) == 0 and mixing.exchange(12, 4) == (2 * 8 + 2) * one
    # A topic's tasks share one model: a restore holds three (the shared one, the restored
    # one, their mix), whatever the partitions; partition scope one per partition.
    assert [topic.parts(n, 12)["models"] for n in (1, 2, 3, 12)] == [
        topic.model, 2 * topic.model, 3 * topic.model, 3 * topic.model]
    assert plain.parts(12, 12)["models"] == 12 * plain.model
    two = Worker(WorkerConfig(topics=["t", "u"], model_scope="topic", model_topic="m")).memory
    assert two.parts(12, 24)["models"] == 6 * two.model
    # A fetch takes 256 KiB of each partition, or a first batch up to --max-record-bytes (1 MiB):
    # kafka-python's 4 buffers of 1 MiB a partition, until its 8 MiB responses cap them.
    objects = WorkerConfig(topics=["t"]).max_poll_records * 2 * 1024
    assert topic.parts(1, 12)["fetch"] == 4 * MiB + objects < plain.parts(1, 1)["fetch"]
    assert topic.parts(12, 12)["fetch"] == plain.parts(12, 12)["fetch"] == 4 * 8 * MiB + objects


def _metrics(status) -> str:
    from prometheus_client import generate_latest

    from connectors.observability.observability import metrics_registry

    return generate_latest(metrics_registry(status)).decode()


def test_the_default_gives_way_to_a_model_of_a_larger_ceiling_and_a_given_size_does_not():
    from connectors.worker.worker import Worker

    # A one-vs-rest ALMA of 100 classes has 100 model ceilings: more than 1 GiB on one partition.
    auto = Worker(WorkerConfig(topics=["t"], one_vs_rest=True)).memory
    assert auto.auto and auto.max_memory > 1 << 30
    assert not auto.overcommitted(1) and auto.max_memory % MiB == 0
    assert "--max-memory auto, " in auto.describe(1)
    with pytest.raises(MemoryBudgetError, match="below what the worker needs"):
        Worker(WorkerConfig(topics=["t"], one_vs_rest=True, max_memory=1 << 30))
    plain = Worker(WorkerConfig(topics=["t"])).memory
    assert plain.max_memory == memory_budget.DEFAULT_MAX_MEMORY
    with pytest.raises(ValueError, match="bytes, auto or None"):
        WorkerConfig(topics=["t"], max_memory="lots")


@pytest.mark.kafka
def test_a_topic_scope_worker_owning_every_partition_is_charged_one_topics_models(
        kafka_broker):
    # Four partitions, one worker: its tasks share one model (a restore holds three at most),
    # and with no peer a delta exchange keeps no ledger: the exchange's part is 0.
    import test_kafka_worker as w

    from connectors.kafka.broker import create_topics
    from connectors.worker.worker import Worker

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("memory-topic")
    create_topics(bootstrap, [name], partitions=4)
    w.produce(bootstrap, name, [(i % 4, w.event(i, {"a": 1.0}, i % 2 == 0)) for i in range(80)])
    worker = Worker(w.config(bootstrap, name, max_memory=1 << 30, model_scope="topic",
                             model_topic=f"{name}.models"))
    summary = worker.run()
    assert summary["records"] == 80
    assert worker.model_scope.scheme == "delta" and not worker.model_scope.has_ledger
    parts = worker.status.memory_parts
    assert parts["models"] == 3 * worker.memory.model and parts["exchange"] == 0
