"""Memory after a stream whose feature names are all new, beside each model's documented bound.

The stream: N records (200,000 by default) of 10 stable features "f0".."f9" (Hyperplane-like,
a linear label) plus one name never seen before ("id-<i>"), the worst case for a model that
gives every name a column. Every model runs with its default parameters.

1. In process: per model, after N records, the checkpoint's size (`state.dumps(model.to_state())`),
   the bytes of its arrays, `streammargin.memory.memory_size` and the documented bound
   (`streammargin.memory.memory_bound`), with the names kept and how often the bound acted
   (`features_hashed`); the same sizes after N/10 records show that nothing grows once the bound
   is reached. River's LogisticRegression beside them: its weights dict keeps every name
   (its size is that of its pickle).
2. Worker RSS: the same N records produced once to a topic of the embedded broker, then per model
   a fresh process runs `connectors.worker.Worker(WorkerConfig(...)).run()` on it (default
   settings: checkpoints every 10,000 records, metrics, predictions) until idle, and reports its
   resident memory from /proc/self/status at its metrics points (every 10,000 records: the first,
   and the largest in each half of the stream), at the end (VmRSS) and the peak (VmHWM). A bounded
   model reaches its bound early (the kernel models and the CPM within 2,000 records, ALMA within
   57,344), so the second half should not exceed the first; the bound is beside it.
   (`--skip-worker` leaves this part out.)
3. A topic-scope exchange (`--model-scope topic`, issue 25) on a topic of P partitions (12 and
   32): P - 1 peers' records of full models on the embedded broker's model topic (each model
   learnt 1,500 records of the stream above, so that ALMA at `max_features=1024` and the
   budget SVM at its default budget are at their ceilings), then one exchange of the worker's
   own model under tracemalloc: its peak beside the documented bound, (2P + 2) x the model's
   ceiling for parameter mixing, (2P + 5) x for delta averaging (docs/kafka.md, "Memory").
   (`--skip-exchange` leaves this part out.)

Run: .venv/bin/python benchmarks/memory_ceiling.py [--records 200000] [--skip-worker]
     [--skip-exchange] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from streammargin import memory, state  # noqa: E402

# The model classes (not MPUClassifier, the name that builds LinearMPUClassifier or
# KernelMPUClassifier, nor the one-vs-rest wrapper, which needs a model to wrap).
MODELS = sorted(
    (
        cls
        for cls in state.registered_models().values()
        if not hasattr(cls, "_forms") and not hasattr(cls, "_wrapped_model")
    ),
    key=lambda cls: cls.__name__,
)
MiB = 2**20


def records(n: int, seed: int = 0):
    """(x, y) of the stream: 10 stable features and one new name per record."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=10)
    values = rng.normal(size=(n, 10))
    for i in range(n):
        x = {f"f{j}": float(v) for j, v in enumerate(values[i])}
        x[f"id-{i}"] = 1.0
        yield x, bool(values[i] @ w > 0)


def array_bytes(model) -> int:
    if hasattr(model, "_flush"):
        model._flush()
    return sum(v.nbytes for v in vars(model).values() if isinstance(v, np.ndarray))


def in_process(n: int) -> None:
    print(f"1. In process: default parameters, {n:,} records with a new name each\n")
    header = (
        f"{'model':28}{'checkpoint at N/10':>20}{'checkpoint at N':>17}{'arrays':>11}"
        f"{'memory_size':>13}{'bound':>11}{'names kept':>12}{'hashed':>10}{'s':>6}"
    )
    print(header + "\n" + "-" * len(header))
    for cls in MODELS:
        model = cls()
        start = time.perf_counter()
        at_tenth = 0
        for i, (x, y) in enumerate(records(n)):
            model.predict_one(x)
            model.learn_one(x, y)
            if i + 1 == n // 10:
                at_tenth = len(state.dumps(model.to_state()))
        seconds = time.perf_counter() - start
        size = len(state.dumps(model.to_state()))
        print(
            f"{cls.__name__:28}{at_tenth / MiB:>16.2f} MiB{size / MiB:>13.2f} MiB"
            f"{array_bytes(model) / MiB:>7.2f} MiB{memory.memory_size(model) / MiB:>9.2f} MiB"
            f"{memory.memory_bound(model) / MiB:>7.2f} MiB{model.n_features:>12,}"
            f"{model.counters['features_hashed']:>10,}{seconds:>6.0f}",
            flush=True,
        )
    from river import linear_model

    model = linear_model.LogisticRegression()
    start = time.perf_counter()
    at_tenth = 0
    for i, (x, y) in enumerate(records(n)):
        model.predict_one(x)
        model.learn_one(x, y)
        if i + 1 == n // 10:
            at_tenth = len(pickle.dumps(model))
    seconds = time.perf_counter() - start
    size = len(pickle.dumps(model))
    print(
        f"{'River LogisticRegression':28}{at_tenth / MiB:>16.2f} MiB{size / MiB:>13.2f} MiB"
        f"{'-':>11}{'-':>13}{'none':>11}{len(model.weights):>12,}{'-':>10}{seconds:>6.0f}"
    )
    print("(River's model: its pickle; it keeps a weight for every name it has seen.)\n")


WORKER_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from connectors.worker import Worker, WorkerConfig

def rss():
    fields = {{}}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return fields

points = {{}}
def on_metrics(record):
    points[record.get("records", 0)] = rss()["VmRSS"]
config = WorkerConfig(
    topics=[{topic!r}], bootstrap_servers={bootstrap!r}, group_id={group!r},
    predictions_topic={topic!r} + ".predictions." + {group!r},
    metrics_topic={topic!r} + ".metrics." + {group!r},
    dead_letter_topic={topic!r} + ".dead." + {group!r},
    checkpoint_topic={topic!r} + ".checkpoints." + {group!r},
    model={model!r}, params={{}}, idle_timeout=3.0,
    session_timeout_ms=6000, heartbeat_interval_ms=1000,
)
summary = Worker(config).run(on_metrics=on_metrics)
final = next(iter(summary["partitions"].values()), {{}})
print(json.dumps({{
    "records": summary["records"], "reason": summary["reason"], "points": points, "end": rss(),
    "model_counters": final.get("model_counters", {{}}),
}}))
"""


def worker_rss(n: int) -> None:
    from kafka import KafkaProducer

    from connectors.kafka.broker import EmbeddedBroker, create_topics
    from connectors.models import short_name

    print(f"2. Worker RSS: the same {n:,} records through the Kafka worker, one process a model\n")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        topic = "new-names"
        create_topics(bootstrap, [topic])
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024)
        for i, (x, y) in enumerate(records(n)):
            producer.send(topic, json.dumps({"id": i, "x": x, "y": y}).encode(), partition=0)
        producer.flush()
        producer.close()
        header = (
            f"{'model':28}{'RSS at 10k':>12}{'max 1st half':>14}{'max 2nd half':>14}"
            f"{'at end':>10}{'peak (HWM)':>12}{'bound':>11}{'records':>10}{'hashed':>10}{'s':>6}"
        )
        print(header + "\n" + "-" * len(header))
        for cls in MODELS:
            name = short_name(cls)
            script = WORKER_SCRIPT.format(
                root=root, topic=topic, bootstrap=bootstrap, group=f"rss-{name}", model=name
            )
            start = time.perf_counter()
            with tempfile.TemporaryFile("w+") as log:
                done = subprocess.run(
                    [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=log, text=True
                )
                if done.returncode:
                    log.seek(0)
                    tail = log.read()[-2000:]
                    print(f"{cls.__name__:28} worker exited {done.returncode}:\n{tail}")
                    continue
            out = json.loads(done.stdout.strip().splitlines()[-1])
            points = {int(k): v for k, v in out["points"].items()}
            end = out["end"]

            first = max((v for k, v in points.items() if k <= n // 2), default=0)
            second = max((v for k, v in points.items() if k > n // 2), default=0)
            print(
                f"{cls.__name__:28}{points.get(10_000, 0) / MiB:>8.0f} MiB{first / MiB:>10.0f} MiB"
                f"{second / MiB:>10.0f} MiB{end['VmRSS'] / MiB:>6.0f} MiB"
                f"{end['VmHWM'] / MiB:>8.0f} MiB"
                f"{memory.memory_bound(cls) / MiB:>7.1f} MiB{out['records']:>10,}"
                f"{out['model_counters'].get('features_hashed', 0):>10,}"
                f"{time.perf_counter() - start:>6.0f}",
                flush=True,
            )
    print(
        "(RSS at the worker's metrics points, every 10,000 records: the largest in each half of the\n"
        "stream. A point can fall on a checkpoint, whose serialisation holds several copies of the\n"
        "state for a moment; so does the peak.)"
    )


def exchange_memory(partitions: tuple[int, ...] = (12, 32)) -> None:
    import tracemalloc

    from connectors.kafka.broker import EmbeddedBroker, create_topics
    from connectors.state.checkpoint import CheckpointStore
    from connectors.task import PartitionTask, TaskSettings
    from connectors.worker.model_scope import (
        ModelScope,
        encode_contribution_record,
        encode_model_record,
        exchange_memory_bound,
    )

    print("\n3. A topic-scope exchange: peak memory (tracemalloc) of one exchange with P - 1 "
          "peers' full models\n")
    header = (f"{'model':12}{'exchange':>9}{'P':>4}{'ceiling':>12}{'peak':>12}"
              f"{'peak / ceiling':>16}{'bound':>8}")
    print(header + "\n" + "-" * len(header))
    cases = [("alma", {"max_features": 1024}, "mix"), ("alma", {"max_features": 1024}, "delta"),
             ("budgetsvm", {}, "mix")]
    with EmbeddedBroker() as broker:
        for model, params, exchange in cases:
            settings = TaskSettings(group_id="memory", model=model, params=params)
            for count in partitions:
                trained = []
                for peer in range(count):
                    learner = settings.build_model()
                    for x, y in records(1_500, seed=peer):
                        learner.learn_one(x, y)
                    trained.append(learner)
                ceiling = memory.memory_bound(trained[0])
                topic = f"models-{model}-{exchange}-{count}-{time.time_ns()}"
                create_topics(broker.bootstrap_servers, [topic], compacted=True)
                store = CheckpointStore(broker.bootstrap_servers, topic, "memory",
                                        max_checkpoint_bytes=2 * ceiling + MiB)
                try:
                    for peer in range(1, count):  # every other partition's latest record
                        payload = (encode_model_record(settings, "events", peer, peer, 100,
                                                       trained[peer]) if exchange == "mix" else
                                   encode_contribution_record(settings, "events", peer, peer, 1,
                                                              100, trained[peer]))
                        store.write({("events", peer): payload})
                    own = PartitionTask.new("events", 0, settings)
                    own.model, own.since_mix = trained[0], 100
                    scope = ModelScope(store, settings, 1, lambda topic, n=count: set(range(n)),
                                       exchange=exchange)
                    tracemalloc.start()
                    try:
                        scope.exchange([own])
                        _, peak = tracemalloc.get_traced_memory()
                    finally:
                        tracemalloc.stop()
                    assert scope.peer_models == count - 1, scope.counters()
                finally:
                    scope.close()
                bound = exchange_memory_bound(count, exchange)
                print(f"{model:12}{exchange:>9}{count:>4}{ceiling / MiB:>8.2f} MiB"
                      f"{peak / MiB:>8.2f} MiB{peak / ceiling:>15.1f}x{bound:>7}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="20,000 records")
    parser.add_argument("--skip-worker", action="store_true", help="leave out the worker's RSS")
    parser.add_argument("--skip-in-process", action="store_true")
    parser.add_argument("--skip-exchange", action="store_true",
                        help="leave out the topic-scope exchange")
    args = parser.parse_args()
    n = 20_000 if args.quick else args.records
    print("Documented bounds at default parameters (streammargin.memory.memory_bound):")
    for cls in MODELS:
        print(f"  {cls.__name__:28}{memory.memory_bound(cls) / MiB:>8.2f} MiB")
    print()
    if not args.skip_in_process:
        in_process(n)
    if not args.skip_worker:
        worker_rss(n)
    if not args.skip_exchange:
        exchange_memory()


if __name__ == "__main__":
    main()
