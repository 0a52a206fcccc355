"""Throughput of the Kafka worker on the embedded broker, with a breakdown by stage.

Everything is measured in one run, against the same broker, on the same records (River's
Hyperplane generator, 10 features, binary labels, one JSON record each):

1. Breakdown: one consumer loop that adds one stage at a time (consume, + decode, + predict and
   learn with ALMA, + metrics, + formatting the prediction JSON, + producing it), then the
   kafka-python producer alone. Each row gives records/s (wall clock) and the CPU microseconds
   per record of this process (all its threads: the clients' IO threads included), which is the
   steadier figure when other jobs share the machine. River's ALMAClassifier stands in for ours
   in one row, for the ratio.
2. End to end: `Worker.run()` with its defaults (one worker, one input partition, checkpoints and
   metrics on), rate from the first to the last record; and the same with kafka-python's
   pure-Python CRC-32C (what one gets without `install_fast_crc32c`).
3. Checkpoint + commit of an ALMA model with 1000 features: serialise, produce, flush, commit,
   timed by the worker itself (`Worker.checkpoint_log`).

Rows are repeated `--repeats` times, interleaved, and the median is printed.

Run: .venv/bin/python benchmarks/kafka_throughput.py [--records 40000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from json.encoder import encode_basestring

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from connectors.broker import EmbeddedBroker, create_topics  # noqa: E402
from connectors.codec import JSONCodec, install_fast_crc32c  # noqa: E402
from connectors.metrics import PartitionMetrics  # noqa: E402
from connectors.worker import Worker, WorkerConfig  # noqa: E402

FAST_GROUP = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def make_records(n: int, n_features: int = 10, seed: int = 1) -> list[bytes]:
    from river.datasets import synth

    stream = synth.Hyperplane(seed=seed, n_features=n_features).take(n)
    return [
        json.dumps({"id": f"e{i}", "x": x, "y": bool(y)}).encode()
        for i, (x, y) in enumerate(stream)
    ]


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024)
    for value in values:
        producer.send(topic, value, partition=0)
    producer.flush()
    producer.close()


STAGES = ["consume", "+ decode", "+ predict/learn", "+ metrics", "+ format JSON", "+ produce"]


def stage_loop(bootstrap: str, topic: str, n: int, depth: int, river_model: bool = False) -> tuple:
    """Consume `n` records and run the first `depth` stages on them; (records/s, CPU us/record)."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    import streammargin

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        metrics_enabled=False, fetch_max_wait_ms=100,
    )
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024, metrics_enabled=False
    )
    out_topic = f"{topic}.out"
    producer.send(out_topic, b"warm-up", partition=0).get(timeout=10)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    if river_model:
        from river import linear_model

        model = linear_model.ALMAClassifier()
    else:
        model = streammargin.ALMAClassifier()
    decode = JSONCodec().decode
    metrics = PartitionMetrics()
    send = producer.send
    done = 0
    started, cpu_started = time.perf_counter(), cpu_seconds()
    while done < n:
        for records in consumer.poll(timeout_ms=500, max_records=2000).values():
            done += len(records)
            if depth < 2:
                continue
            for record in records:
                event_id, x, y = decode(record.value)
                if depth < 3:
                    continue
                # As the worker does: the label of predict_one, the probability of
                # predict_proba_one (the second call reuses the cached feature encoding).
                y_pred = model.predict_one(x)
                p_true = model.predict_proba_one(x).get(True, 0.0)
                model.learn_one(x, y)
                if depth < 4:
                    continue
                metrics.update(y, y_pred, p_true, record.offset)
                if depth < 5:
                    continue
                value = (
                    f'{{"topic":"in","partition":0,"model":"alma","offset":{record.offset},'
                    f'"id":{encode_basestring(event_id)},"y_pred":{"true" if y_pred else "false"},'
                    f'"p_true":{float(p_true)!r},"y":{"true" if y else "false"}}}'
                ).encode()
                if depth < 6:
                    continue
                send(out_topic, value, partition=0)
    producer.flush()
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
    consumer.close()
    producer.close()
    return n / elapsed, 1e6 * cpu / n


def produce_only(bootstrap: str, topic: str, values: list[bytes]) -> tuple:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024, metrics_enabled=False
    )
    producer.send(topic, b"warm-up", partition=0).get(timeout=10)
    started, cpu_started = time.perf_counter(), cpu_seconds()
    for value in values:
        producer.send(topic, value, partition=0)
    producer.flush()
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
    producer.close()
    return len(values) / elapsed, 1e6 * cpu / len(values)


def worker_run(bootstrap: str, topic: str, n: int, run_id: str, **options) -> tuple:
    config = WorkerConfig(
        topics=[topic], bootstrap_servers=bootstrap, group_id=f"bench-{run_id}",
        predictions_topic=f"{topic}.predictions-{run_id}", metrics_topic=f"{topic}.metrics",
        dead_letter_topic=f"{topic}.dead", checkpoint_topic=f"{topic}.checkpoints-{run_id}",
        idle_timeout=0.5, **FAST_GROUP, **options,
    )
    worker = Worker(config)
    cpu_started = cpu_seconds()
    summary = worker.run()
    cpu = cpu_seconds() - cpu_started
    if summary["records"] != n:
        raise RuntimeError(f"worker processed {summary['records']} records, expected {n}")
    return summary["records_per_s"], 1e6 * cpu / n, worker


def checkpoint_benchmark(bootstrap: str, n_features: int = 1000, n: int = 3000) -> dict:
    """Checkpoint + commit times of an ALMA model with `n_features` features."""
    import numpy as np

    rng = np.random.default_rng(0)
    topic = f"wide{n_features}"
    create_topics(bootstrap, [topic])
    w = rng.normal(size=n_features)
    values = []
    for i in range(n):
        x = rng.normal(size=n_features)
        values.append(json.dumps({
            "id": i, "x": {f"f{j}": float(v) for j, v in enumerate(x)}, "y": bool(x @ w > 0)
        }).encode())
    produce(bootstrap, topic, values)
    _, _, worker = worker_run(bootstrap, topic, n, "wide", checkpoint_every=250,
                              max_poll_records=250)
    log = [entry for entry in worker.checkpoint_log if entry["partitions"] == 1]
    times = [entry["checkpoint_commit_ms"] for entry in log]
    flushes = [entry["flush_outputs_ms"] for entry in log]
    return {
        "checkpoints": len(times),
        "bytes": log[-1]["bytes"],
        "median_ms": statistics.median(times),
        "max_ms": max(times),
        "flush_outputs_median_ms": statistics.median(flushes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-pure-crc", action="store_true",
                        help="skip the run with kafka-python's pure-Python CRC-32C (slow)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    n = args.records

    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        topic = "bench.in"
        create_topics(bootstrap, [topic, f"{topic}.out", f"{topic}.produce-only"])
        crc = install_fast_crc32c()
        values = make_records(n)
        produce(bootstrap, topic, values)
        prediction = (
            b'{"topic":"in","partition":0,"model":"alma","offset":12345,"id":"e12345",'
            b'"y_pred":true,"p_true":0.8412345678901234,"y":true}'
        )

        rows: dict[str, list[tuple]] = {}
        worker_rows: list[tuple] = []
        lines_rows: list[tuple] = []
        for repeat in range(args.repeats):
            for depth, name in enumerate(STAGES, 1):
                rows.setdefault(name, []).append(stage_loop(bootstrap, topic, n, depth))
            rows.setdefault("  (River ALMA at + predict/learn)", []).append(
                stage_loop(bootstrap, topic, n, 3, river_model=True)
            )
            rows.setdefault("kafka-python produce only", []).append(
                produce_only(bootstrap, f"{topic}.produce-only", [prediction] * n)
            )
            rate, cpu, _ = worker_run(bootstrap, topic, n, f"e2e{repeat}")
            worker_rows.append((rate, cpu))
            rate, cpu, _ = worker_run(bootstrap, topic, n, f"lines{repeat}",
                                      predictions_per_message=100)
            lines_rows.append((rate, cpu))

        print(f"records: {n} JSON records, 10 features, 1 partition; CRC-32C: {crc}; "
              f"median of {args.repeats}")
        print()
        print(f"{'stage (cumulative)':<38}{'records/s':>11}{'CPU us/rec':>12}{'+CPU us':>9}")
        previous = None
        for name, results in rows.items():
            rate = statistics.median(r[0] for r in results)
            cpu = statistics.median(r[1] for r in results)
            cumulative = name in STAGES
            delta = f"{cpu - previous:>9.1f}" if cumulative and previous is not None else " " * 9
            print(f"{name:<38}{rate:>11.0f}{cpu:>12.1f}{delta}")
            if cumulative:
                previous = cpu
        consume_rate = statistics.median(r[0] for r in rows["consume"])
        produce_rate = statistics.median(r[0] for r in rows["kafka-python produce only"])
        print()
        print(f"{'end to end':<38}{'records/s':>11}{'CPU us/rec':>12}"
              f"{'/consume':>9}{'/produce':>9}   records/s of each run")
        for label, results in [("Worker.run(), ALMA, defaults", worker_rows),
                               ("  same, 100 predictions per message", lines_rows)]:
            rate = statistics.median(r[0] for r in results)
            cpu = statistics.median(r[1] for r in results)
            runs = " ".join(f"{r[0]:.0f}" for r in results)
            print(f"{label:<38}{rate:>11.0f}{cpu:>12.1f}"
                  f"{rate / consume_rate:>9.2f}{rate / produce_rate:>9.2f}   {runs}")
        if not args.skip_pure_crc:
            from kafka.record import _crc32c, default_records

            import connectors.worker

            fast = default_records.calc_crc32c
            default_records.calc_crc32c = lambda data: _crc32c.crc(data)
            # The worker installs the fast CRC when it connects: not this time.
            connectors.worker.install_fast_crc32c = lambda: "pure Python"
            try:
                slow_rate, slow_cpu, _ = worker_run(bootstrap, topic, n, "purecrc")
            finally:
                default_records.calc_crc32c = fast
                connectors.worker.install_fast_crc32c = install_fast_crc32c
            print(f"{'  same, pure-Python CRC-32C':<38}{slow_rate:>11.0f}{slow_cpu:>12.1f}"
                  f"{slow_rate / consume_rate:>9.2f}{slow_rate / produce_rate:>9.2f}")

        result = checkpoint_benchmark(bootstrap)
        print()
        print("checkpoint + commit, ALMA with 1000 features "
              f"({result['bytes']} bytes, {result['checkpoints']} checkpoints): "
              f"median {result['median_ms']:.1f} ms, max {result['max_ms']:.1f} ms "
              "(flushing the outputs before it: median "
              f"{result['flush_outputs_median_ms']:.1f} ms)")


if __name__ == "__main__":
    main()
