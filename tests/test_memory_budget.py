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
from connectors.worker.memory_budget import (MemoryBudget, MemoryBudgetError, ModelCeiling,
                                             parse_size)

MiB = 1 << 20


def budget(max_memory: int, bound: int = 8 * MiB, names: int = 0, **parts) -> MemoryBudget:
    """A budget whose model has this bound and these names (no scaler)."""
    fields = {"process": 96 * MiB, "fetch": 26 * MiB, "outputs": 10 * MiB,
              "ceiling": ModelCeiling(bound, names), "exchange_kind": "mix", "schema_cache": 0,
              "label_store_bytes": 256 * MiB, "sending": memory_budget.send_window(512 << 10),
              **parts}
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
       bound=st.integers(0, 256 * MiB), names=st.integers(0, 1 << 20),
       cap=st.integers(MiB, 1 << 30))
def test_the_parts_never_exceed_the_ceiling_unless_it_is_overcommitted(max_memory, n, bound,
                                                                       names, cap):
    plan = budget(max_memory, bound, names, label_store_bytes=cap)
    parts = plan.parts(n)
    assert all(value >= 0 for value in parts.values())
    assert plan.pending_share(n) <= max(cap, memory_budget.MIN_SHARE_BYTES)
    if not plan.overcommitted(n):
        assert sum(parts.values()) <= max_memory
        assert plan.pending_share(n) >= memory_budget.MIN_SHARE_BYTES
    # More partitions never give one more room.
    assert plan.pending_share(n + 1) <= plan.pending_share(n)


def test_a_round_holds_every_state_and_one_being_encoded_or_the_producers_copies():
    # Hand-computed, states of 10 MiB: one partition, its state and 1.5 more while it is
    # encoded; from two on, every state and the producer's copies of them, until the
    # checkpoint store's window (CheckpointStore.write waits each 32 MiB; + a chunk of 512 KiB).
    from connectors.state.checkpoint import SEND_WINDOW_BYTES

    from connectors.worker.worker import Worker

    assert SEND_WINDOW_BYTES == 32 * MiB
    plan = budget(4 << 30, bound=10 * MiB)
    assert plan.sending == Worker(WorkerConfig(topics=["t"])).memory.sending == 32.5 * MiB
    assert plan.state == 10 * MiB
    assert [plan.states(n) for n in (1, 2, 3, 12)] == [
        25 * MiB, 40 * MiB, 60 * MiB, int(152.5 * MiB)]


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
    one = budget(1 << 30, bound=64 * MiB)
    ceiling = one.needed(1) + 8 * MiB
    cfg = w.config(bootstrap, name, max_memory=ceiling)
    worker = Worker(cfg)
    worker.memory = dataclasses.replace(worker.memory, ceiling=ModelCeiling(64 * MiB, 0),
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
    assert len(models) == 1 and float(models[0].split()[-1]) == 6 * (
        64 * MiB + memory_budget.TASK_BYTES)


# (model, --param, labels, records, features a record, the least share of its charges it holds
# and writes): each driven to its ceiling, ALMA's made of names, the budget SVM's of support
# vectors (its bound counts the warm-up rows of gamma="auto", freed after the first 64 records,
# and its Gram matrix, which a checkpoint does not hold).
AT_CEILING = {
    "alma": ("alma", {"max_features": 1024}, [True, False], 400, 20, (0.5, 0.8)),
    "budgetsvm": ("budgetsvm", {"max_features": 256, "budget": 64}, [True, False], 300, 20,
                  (0.4, 0.4)),
}


@pytest.mark.parametrize("case", sorted(AT_CEILING))
def test_a_task_at_its_ceiling_fits_the_models_and_checkpoints_terms(case):
    # The models' term charges the model's ceiling, its names' objects and the task's own, the
    # checkpoints' one the ceiling again for each state and one being encoded: driven to them
    # with the longest names a feature space stores (126 ASCII characters), which make the
    # ceiling.
    import gc
    import json
    import random
    import tracemalloc

    from connectors.task import PartitionTask
    from connectors.worker.worker import Worker

    model, params, labels, n, width, least = AT_CEILING[case]
    worker = Worker(WorkerConfig(topics=["t"], model=model, params=params))
    rng = random.Random(3)
    records = []
    for i in range(n):
        x = {f"{rng.randrange(10**6):0126d}": rng.gauss(0, 1) for _ in range(width)}
        value = json.dumps({"id": f"e{i}", "x": x, "y": labels[i % len(labels)]}).encode()
        records.append(_Record("t", 0, i, None, value))
    PartitionTask.new("t", 1, worker.settings).process(records[:20])  # (code loaded first)
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
    plan = worker.memory
    assert len(task.model._features) >= params["max_features"] * 7 // 8  # (exact columns full)
    charged = plan.model + memory_budget.TASK_BYTES
    assert least[0] * charged < held <= charged, (held, charged)
    assert least[1] * plan.state < write.written_bytes <= plan.state, (
        write.written_bytes, plan.state)
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
    task = memory_budget.TASK_BYTES
    assert [topic.parts(n, 12)["models"] for n in (1, 2, 3, 12)] == [
        topic.model + task, 2 * (topic.model + task), 3 * (topic.model + task),
        3 * topic.model + 12 * task]
    assert plain.parts(12, 12)["models"] == 12 * (plain.model + task)
    two = Worker(WorkerConfig(topics=["t", "u"], model_scope="topic", model_topic="m")).memory
    assert two.parts(12, 24)["models"] == 6 * two.model + 12 * task
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

    # An ALMA of 2**22 features: a bound of 550 MiB, names' objects 560 MiB, more than 1 GiB.
    params = {"max_features": 1 << 22}
    auto = Worker(WorkerConfig(topics=["t"], params=params)).memory
    assert auto.auto and auto.max_memory > 1 << 30
    assert not auto.overcommitted(1) and auto.max_memory % MiB == 0
    assert "--max-memory auto, " in auto.describe(1)
    with pytest.raises(MemoryBudgetError, match="below what the worker needs"):
        Worker(WorkerConfig(topics=["t"], params=params, max_memory=1 << 30))
    plain = Worker(WorkerConfig(topics=["t"])).memory
    assert plain.max_memory == memory_budget.DEFAULT_MAX_MEMORY
    with pytest.raises(ValueError, match="bytes, auto or None"):
        WorkerConfig(topics=["t"], max_memory="lots")


# The classes a model holds ------------------------------------------------------------------------


def test_a_multiclass_model_is_charged_two_classes_at_start_not_max_classes():
    import streammargin
    from connectors.worker.worker import Worker
    from streammargin.memory import STATE_OVERHEAD, memory_bound

    # --one-vs-rest ALMA, --max-classes 100: two members, not 100 (856 MiB), the default 1 GiB
    # holds it, and the start's check passes at 1 GiB where it needed 4.6 GiB.
    plan = Worker(WorkerConfig(topics=["t"], one_vs_rest=True)).memory
    member = memory_bound(streammargin.ALMAClassifier()) - STATE_OVERHEAD
    assert plan.ceiling == (2 * (member + 257) + STATE_OVERHEAD, 2 * 57_344, 2)
    assert plan.max_memory == memory_budget.DEFAULT_MAX_MEMORY
    Worker(WorkerConfig(topics=["t"], one_vs_rest=True, max_memory=1 << 30)).memory.check_start()
    auto = Worker(WorkerConfig(topics=["t"], model="auto")).memory
    assert auto.ceiling.classes == 2 and not auto.overcommitted(2)


def test_the_budget_grows_with_the_classes_each_model_holds():
    # Hand-computed: fresh models of bound 10 MiB and 1,000 names at 2 classes; one model holds
    # 5 classes (bound 25 MiB, 2,500 names), the other 2. Models: each its bound + 160 B a name
    # + 96 KiB; states: each bound, + 1.5 x the largest or the sum again, the more.
    fresh = ModelCeiling(10 * MiB, 1_000, 2)
    grown = ModelCeiling(25 * MiB, 2_500, 5)
    plan = budget(2 << 30, label_store_bytes=1 << 30)  # (the stores' cap out of the way)
    plan = dataclasses.replace(plan, ceiling=fresh)
    task = memory_budget.TASK_BYTES
    assert plan.models(2) == 2 * (10 * MiB + 160 * 1_000 + task)
    # (2 states, and the producer's copies of both, within its window of 32.5 MiB: more than
    # 1.5 x one being encoded)
    assert plan.states(2) == 2 * (2 * 10 * MiB)
    held = plan.holding([grown])
    assert held.models(2) == (25 * MiB + 160 * 2_500) + (10 * MiB + 160 * 1_000) + 2 * task
    # (25 + 10, and 1.5 x 25 being encoded: more than the copies of 35, 32.5 by the window)
    assert held.states(2) == int(25 * MiB + 10 * MiB + 1.5 * 25 * MiB)
    assert held.fixed(2) - plan.fixed(2) == 15 * MiB + 160 * 1_500 + int(32.5 * MiB)
    # What the models take comes out of the stores, evenly: (fixed grows by 47.7 MiB) / 1.1 / 2
    grow = held.fixed(2) - plan.fixed(2)
    assert plan.pending_share(2) - held.pending_share(2) in (
        int(grow / 1.1 / 2), int(grow / 1.1 / 2) + 1)
    assert held.classes == 5 and plan.classes == 2
    assert "the models charged up to 5 classes" in held.describe(2)
    # Topic scope: one shared model, its three copies at most, and the exchange at its bound
    topic = dataclasses.replace(plan, shared_topics=1, exchange_kind="mix")
    assert topic.holding([grown]).models(12) == 3 * (25 * MiB + 160 * 2_500) + 12 * task
    assert topic.holding([grown]).exchange(12, 4) == (2 * 8 + 2) * 25 * MiB
    assert topic.exchange(12, 4) == (2 * 8 + 2) * 10 * MiB


def test_under_the_default_the_ceiling_gives_way_to_one_partition_of_the_classes_held():
    import streammargin
    from connectors.worker.worker import Worker

    plan = Worker(WorkerConfig(topics=["t"], one_vs_rest=True)).memory
    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier(), max_classes=100)
    for label in range(60):
        model.learn_one({"a": 1.0}, label)
    sixty = plan.holding([memory_budget.model_ceiling(model)])
    assert sixty.ceiling.classes == 2 and sixty.held[0].classes == 60
    assert sixty.max_memory > 1 << 30 and not sixty.overcommitted(1)
    assert sixty.max_memory == -(-dataclasses.replace(sixty, max_memory=1 << 30).needed(1)
                                 >> 20) << 20
    given = dataclasses.replace(plan, auto=False).holding([memory_budget.model_ceiling(model)])
    assert given.max_memory == 1 << 30 and given.overcommitted(1)


def _ovr_worker(max_memory, partitions: int, labels, **options):
    """A worker of --one-vs-rest ALMA owning `partitions` tasks (no broker), each having learnt
    records of these labels."""
    import json

    from connectors.task import PartitionTask
    from connectors.worker.worker import Worker

    worker = Worker(WorkerConfig(topics=["t"], one_vs_rest=True, max_memory=max_memory,
                                 **options))
    for p in range(partitions):
        task = PartitionTask.new("t", p, worker.settings)
        task.process([_Record("t", p, i, None, json.dumps(
            {"id": f"e{i}", "x": {"a": float(i % 3)}, "y": label}).encode())
            for i, label in enumerate(labels)])
        worker.tasks[(("t", p))] = task
    return worker


def test_a_two_class_stream_under_one_vs_rest_is_charged_two_classes(caplog):
    # Issue 45: "fraud"/"legit" with --one-vs-rest on 2 partitions started with an ERROR (7211
    # MiB needed) and 1 MiB stores. Charged two classes: no ERROR, each store its full share.
    worker = _ovr_worker("auto", 2, ["fraud", "legit"] * 5, scale=True)
    with caplog.at_level(logging.INFO, logger="connectors.worker"):
        assert worker._apply_memory_shares()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    plan = worker.memory.holding([memory_budget.model_ceiling(t.model)
                                  for t in worker.tasks.values()])
    share = min(plan.pending_share(2), 256 * MiB)
    assert share > 200 * MiB
    assert all(t.pending.max_bytes == share for t in worker.tasks.values())
    assert not worker.status.memory_overcommitted
    assert plan.classes == 2 and plan.max_memory == 1 << 30
    assert worker.status.memory_parts["models"] == plan.models(2) < 128 * MiB
    assert not worker._charge_classes()  # (nothing met since)


def test_a_new_class_grows_the_budget_and_every_partition_is_checkpointed_with_it(caplog):
    import json

    worker = _ovr_worker(1 << 30, 4, ["a", "b"])
    worker._apply_memory_shares()
    before = next(iter(worker.tasks.values())).pending.max_bytes
    assert not worker._charge_classes()
    task = worker.tasks[("t", 3)]
    task.process([_Record("t", 3, 100, None, json.dumps(
        {"id": "c", "x": {"a": 1.0}, "y": "c"}).encode())])
    with caplog.at_level(logging.INFO, logger="connectors.worker"):
        assert worker._charge_classes()  # (the loop checkpoints every partition in this turn)
    after = {t.pending.max_bytes for t in worker.tasks.values()}
    ceiling = memory_budget.model_ceiling(task.model)
    assert ceiling.classes == 3 and len(after) == 1 and after.pop() < before
    # The share is a function of the owned partitions and their models' classes: what a restore
    # of these tasks computes (another worker, the same models)
    again = _ovr_worker(1 << 30, 4, ["a", "b"])
    again.tasks[("t", 3)] = task
    again._apply_memory_shares()
    assert {t.pending.max_bytes for t in again.tasks.values()} == {
        worker.tasks[("t", 0)].pending.max_bytes}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "the models charged up to 3 classes" in lines[0], lines
    assert not worker._charge_classes()  # (once per change)


def test_classes_that_exhaust_the_ceiling_are_one_error_naming_every_fix(caplog):
    worker = _ovr_worker(1 << 30, 2, [f"c{i}" for i in range(15)])
    with caplog.at_level(logging.INFO, logger="connectors.worker"):
        worker._apply_memory_shares()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    error = errors[0]
    assert error.startswith("memory: 2 partitions need ") and "models of up to 15 classes" in error
    fix = error.split("Fix: ", 1)[1]
    assert "raise --max-memory above " in fix and "--param max_features=" in fix
    assert "at most 1 partition a worker (more workers in the group)" in fix
    k = int(fix.split("--max-classes ", 1)[1].split()[0])
    assert 2 < k < 15
    # What each fix says is enough is: k classes fit, k + 1 do not.
    plan = worker.memory
    models = [t.model for t in worker.tasks.values()]

    def capped(classes):
        return plan.holding(memory_budget.model_ceiling(m, classes) for m in models)

    assert not capped(k).overcommitted(2) and capped(k + 1).overcommitted(2)
    need = parse_size(fix.split("raise --max-memory above ", 1)[1].split(",")[0].replace(" ", ""))
    assert not dataclasses.replace(capped(15), max_memory=need + MiB).overcommitted(2)
    assert worker.status.memory_overcommitted
    assert {t.pending.max_bytes for t in worker.tasks.values()} == {memory_budget.MIN_SHARE_BYTES}


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
    assert parts["models"] == 3 * worker.memory.model + 4 * memory_budget.TASK_BYTES
    assert parts["exchange"] == 0


@pytest.mark.kafka
def test_a_class_met_mid_stream_moves_the_shares_at_a_checkpoint_a_restore_repeats(
        kafka_broker, caplog):
    # Two classes, then a third from record 300: the stores' share shrinks in the turn that
    # met it, with a checkpoint of every partition, and a worker restoring those checkpoints
    # sets the same share.
    import test_kafka_worker as w

    from connectors.kafka.broker import create_topics
    from connectors.worker.worker import Worker

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("memory-classes")
    create_topics(bootstrap, [name], partitions=2)
    items = []
    for i in range(3000):
        labels = ["a", "b"] if i < 300 else ["a", "b", "c"]
        y = None if i % 3 else labels[i // 3 % len(labels)]  # (two in three wait, unlabelled)
        items.append((i % 2, w.event(i, {"f": float(i % 7), "g": 1.0}, y)))
    w.produce(bootstrap, name, items)
    options = dict(one_vs_rest=True, max_memory=1 << 30, checkpoint_every=100_000,
                   checkpoint_interval=None, max_poll_records=100)
    worker = Worker(w.config(bootstrap, name, **options))
    with caplog.at_level(logging.INFO, logger="connectors.worker"):
        summary = worker.run()
    assert summary["records"] == 3000
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("memory:")]
    assert "charged up to 2 classes" in lines[0] and "charged up to 3 classes" in lines[-1], lines
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # (no round is due before the exit's but those of the class: one per partition's model,
    # as kafka-python fetched them, each of the partitions that had records)
    assert 2 <= len(worker.checkpoint_log) <= 3, worker.checkpoint_log
    shares = worker.status.memory_parts
    two = Worker(w.config(bootstrap, name, **options)).memory
    assert shares["pending"] < 2 * min(two.pending_share(2), 256 * MiB)
    for partition in (0, 1):
        labels = summary["partitions"][f"{name}/{partition}"]["labels"]
        assert labels["evicted"] == 0 and labels["pending"] == 1000
    again = Worker(w.config(bootstrap, name, **options))
    assert again.run()["records"] == 0
    assert again.status.memory_parts == shares
