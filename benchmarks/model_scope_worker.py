"""`--model-scope partition` against `--model-scope topic`, through the worker on a broker
(issue 25): three workers of one group share a keyed topic of P partitions.

For each stream and model (`StandardScaler() | model`: the worker's `--scale`): the records
are produced round robin over the partitions (a keyed producer's spread) while three in-process
workers run (one group, their threads taking turns on the GIL: the same for both scopes), until
they are idle; `--arrival` says whether they come as a live stream (~7,000 records/s, the
default) or as a backlog (the default with `--processes`). Printed per scope: the progressive
accuracy over all predictions, its gap to one model learning the stream in order (River's
progressive validation, no broker), the records per second of the workers' busy time
(processing and exchanging; waits for records left out) and its ratio to partition scope's, the
model-topic bytes written over the input's bytes, the share of the busy time the main thread
spent on exchanges (encoding and mixing; the rest of an exchange runs beside it), and the
exchanges. The scopes take turns on each
stream.

`--processes` runs the three workers as `streammargin kafka` processes instead of threads of
this one (which share its GIL, so that one worker's exchange waits on the others' records), and
adds the CPU the three processes spent per record from the moment the records are produced to
the moment the last prediction is on its topic (start-up, group join and the idle wait before
they exit left out), and its ratio to partition scope's: the throughput cost of topic scope that
three threads cannot show. Give it many records (60,000: a few seconds of CPU). Also the
exchanges' own CPU as a share of it (`exch CPU%`: what the workers count for
`--max-exchange-cpu-share`, both threads' halves). On a shared 2-core VM a process's CPU for the
same work moves by tens of percent between runs; `--control` runs partition scope twice a round,
and the second run's ratio to the first (an A/A test) shows how far the ratios can be trusted.

Run: .venv/bin/python benchmarks/model_scope_worker.py [--records 12000] [--partitions 12]
     [--mix-every N [N ...]] [--exchanges auto|mix|delta ...] [--scopes partition topic]
     [--streams ...] [--models ...] [--max-model-bytes-share S] [--max-exchange-cpu-share S]
     [--broker apache-kafka|tansu] [--processes] [--rounds R] [--arrival live|backlog]
     [--control]
Several --mix-every values (or --exchanges) run topic scope once per value (the period's
trade-off); delta runs with ALMA only. The period is the shortest: the CPU budget
(`--max-exchange-cpu-share`, the worker's default) lengthens it where exchanges would cost more.
`--rounds` runs each configuration R times, taking turns, and gives the median CPU ratio.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import statistics
import sys
import threading
import time

from river import evaluate, metrics, preprocessing

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import common  # (this folder: the script's own)
import partition_learning

from connectors.kafka.broker import create_topics, make_broker
from connectors.models import build_model
from connectors.worker.model_scope import (
    DEFAULT_MAX_EXCHANGE_CPU_SHARE,
    DEFAULT_MAX_MODEL_BYTES_SHARE,
    default_mix_every,
    resolved_exchange,
)
from connectors.worker.worker import Worker, WorkerConfig

WORKERS = 3
STREAMS = ("RBF drift", "Hyperplane 20", "SEA drift", "SEA")


def streams(n: int) -> dict[str, list]:
    """The drifting and stationary streams of benchmarks/partition_learning.py (the broker-free
    side of the same question), labels as booleans (the worker's binary records)."""
    made = partition_learning.streams(n)
    return {name: [(x, bool(y)) for x, y in made[name][0]] for name in STREAMS}


def one_model(records: list, model: str) -> float:
    pipeline = preprocessing.StandardScaler() | build_model(model)
    score = evaluate.progressive_val_score(records, pipeline, metrics.Accuracy())
    return score.get()


def produce(bootstrap: str, topic: str, records: list, partitions: int,
            arrival: str = "live") -> int:
    """Send `records` round robin over the partitions; returns their bytes. `arrival` "live":
    each record sent as it is encoded, some 7,000 records/s, so the workers keep up as with a
    live stream; "backlog": all encoded first and sent in large batches, so the workers catch up
    on a backlog, as fast as they go (the CPU of `--processes` is then their processing's, not
    their polls' for a few records at a time). An exchange's period in records is at least what
    a worker processes while the last one is written and read, so a backlog makes it longer."""
    from kafka import KafkaProducer

    if arrival == "backlog":
        values = [json.dumps({"id": f"e{i}", "x": x, "y": y}).encode()
                  for i, (x, y) in enumerate(records)]
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                 batch_size=256 << 10)
    else:
        values = (json.dumps({"id": f"e{i}", "x": x, "y": y}).encode()
                  for i, (x, y) in enumerate(records))
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
    size = 0
    for i, value in enumerate(values):
        size += len(value)
        producer.send(topic, value, partition=i % partitions)
    producer.flush()
    producer.close()
    return size


def read_accuracy(bootstrap: str, topic: str, partitions: int, expected: int) -> float:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    seen: dict[tuple[int, int], bool] = {}
    deadline = time.monotonic() + 60
    while len(seen) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            for record in batch:
                p = json.loads(record.value)
                seen.setdefault((p["partition"], p["offset"]), p["y_pred"] == p["y"])
    consumer.close()
    if len(seen) < expected:
        raise SystemExit(f"only {len(seen)} of {expected} predictions on {topic}")
    return sum(seen.values()) / len(seen)


def worker_processes(cfg: WorkerConfig, logs: pathlib.Path) -> list:
    """`--processes`: the three workers as `streammargin kafka` processes (no GIL shared)."""
    import subprocess

    argv = [
        sys.executable, "-m", "connectors.cli", "kafka",
        "--bootstrap-servers", cfg.bootstrap_servers, "--topic", cfg.topics[0],
        "--group-id", cfg.group_id, "--predictions-topic", cfg.predictions_topic,
        "--metrics-topic", cfg.metrics_topic, "--dead-letter-topic", cfg.dead_letter_topic,
        "--checkpoint-topic", cfg.checkpoint_topic, "--model", cfg.model,
        "--model-scope", cfg.model_scope, "--model-topic", cfg.model_topic,
        "--model-exchange", cfg.model_exchange,
        "--max-model-bytes-share", str(cfg.max_model_bytes_share or "none"),
        "--max-exchange-cpu-share", str(cfg.max_exchange_cpu_share or "none"),
        "--scale", "--max-poll-records", str(cfg.max_poll_records),
        "--idle-timeout", str(cfg.idle_timeout),
        "--session-timeout-ms", str(cfg.session_timeout_ms),
        "--heartbeat-interval-ms", str(cfg.heartbeat_interval_ms),
        "--log-level", "WARNING",
        *(["--mix-every", str(cfg.mix_every)] if cfg.mix_every else []),
    ]
    root = pathlib.Path(__file__).resolve().parents[1]
    started = []
    for k in range(WORKERS):
        with open(logs / f"worker{k}.log", "wb") as log:  # (the child keeps its own handle)
            started.append(subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL,
                                            stderr=log))
    return started


def process_summary(log: pathlib.Path) -> dict:
    """The totals a worker process prints on its way out (its last JSON line)."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if "records" in found:
                return found
    raise SystemExit(f"a worker process printed no summary: {log.read_text()[-2000:]}")


def fresh_group(bootstrap: str, name: str, model: str, partitions: int, idle_timeout: float,
                **options) -> WorkerConfig:
    """The workers' configuration for a new group on new topics named after `name` (created
    here: the input of `partitions` partitions, the compacted checkpoint and model topics)."""
    cfg = WorkerConfig(
        topics=[name], bootstrap_servers=bootstrap, group_id=f"{name}.group",
        predictions_topic=f"{name}.predictions", metrics_topic=f"{name}.metrics",
        dead_letter_topic=f"{name}.dead", checkpoint_topic=f"{name}.checkpoints",
        model_topic=f"{name}.models", model=model, scale=True, max_poll_records=500,
        idle_timeout=idle_timeout, session_timeout_ms=6000, heartbeat_interval_ms=1000,
        **options,
    )
    create_topics(bootstrap, [name, cfg.predictions_topic, cfg.metrics_topic,
                              cfg.dead_letter_topic], partitions=partitions)
    create_topics(bootstrap, [cfg.checkpoint_topic, cfg.model_topic], compacted=True)
    return cfg


def wait_for_predictions(bootstrap: str, topic: str, partitions: int, expected: int,
                         timeout: float = 600.0) -> None:
    """Return once `topic` holds `expected` records (its end offsets, asked every 50 ms)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    deadline = time.monotonic() + timeout
    try:
        while sum(consumer.end_offsets(tps).values()) < expected:
            if time.monotonic() > deadline:
                raise SystemExit(f"fewer than {expected} predictions on {topic} after "
                                 f"{timeout:.0f} s")
            time.sleep(0.05)
    finally:
        consumer.close()


def run(bootstrap: str, records: list, model: str, scope: str, partitions: int,
        mix_every: int | None, tag: str, bytes_share: float | None = None,
        exchange: str = "auto", processes: bool = False,
        cpu_share: float | None = DEFAULT_MAX_EXCHANGE_CPU_SHARE, arrival: str = "live") -> dict:
    name = f"scope-{tag}-{time.time_ns()}"
    cfg = fresh_group(bootstrap, name, model, partitions, 8.0 if processes else 3.0,
                      model_scope=scope, mix_every=mix_every, model_exchange=exchange,
                      max_model_bytes_share=bytes_share, max_exchange_cpu_share=cpu_share)
    summaries: list = []
    cpu = None
    if processes:
        import tempfile

        with tempfile.TemporaryDirectory() as logs:
            started = worker_processes(cfg, pathlib.Path(logs))
            pids = [process.pid for process in started]
            try:
                time.sleep(6.0)  # the three start and join the group before the records come
                # The records' CPU: from their first to their last prediction, without the
                # start-up, the join and the idle wait before the workers exit (seconds, against
                # 1-3 for 60,000 records: subtracted instead, their noise was the figure's).
                before = sum(map(common.process_cpu, pids))
                size = produce(bootstrap, name, records, partitions, arrival)
                wait_for_predictions(bootstrap, cfg.predictions_topic, partitions, len(records))
                cpu = sum(map(common.process_cpu, pids)) - before
                for process in started:
                    process.wait(600)
            finally:
                for process in started:
                    if process.poll() is None:
                        process.kill()
            summaries = [process_summary(pathlib.Path(logs) / f"worker{k}.log")
                         for k in range(WORKERS)]
    else:
        workers = [Worker(cfg) for _ in range(WORKERS)]
        # (Daemons: a SIGTERM's SystemExit in the main thread ends the process, not only the
        # broker.)
        threads = [threading.Thread(target=lambda wk=wk: summaries.append(wk.run()),
                                    daemon=True) for wk in workers]
        for thread in threads:
            thread.start()
        time.sleep(3.0)  # the three join the group before the records come
        size = produce(bootstrap, name, records, partitions, arrival)
        for thread in threads:
            thread.join(600)
    accuracy = read_accuracy(bootstrap, cfg.predictions_topic, partitions, len(records))
    scopes = [s.get("model_scope") or {} for s in summaries]
    # The workers' busy time: processing (records / their processing rate, which leaves waits
    # for records out) plus the main thread's share of the exchanges (encoding and mixing, outside
    # the processing clock; writing, reading and checking run on the scope's own thread, beside
    # the processing, which its CPU slows down).
    # A worker with too little processing for a rate (Throughput.rates: 0.0) is left out.
    processing = sum(s["records"] / s["records_per_s"] for s in summaries if s["records_per_s"])
    exchanging = sum(s.get("seconds", 0.0) for s in scopes)
    busy = processing + exchanging
    resolved = resolved_exchange(exchange, cfg.task_settings())
    return {
        "label": scope if scope == "partition" else
        f"{resolved} {mix_every or default_mix_every(resolved)}",
        "accuracy": accuracy,
        "cpu": cpu,  # --processes: the three processes' CPU seconds for the records
        "rate": len(records) / busy if busy > 0 else float("nan"),
        "bytes": sum(s.get("bytes_written", 0) for s in scopes) / size,
        "exchanging": exchanging / busy if busy > 0 else float("nan"),
        "exchanges": sum(s.get("exchanges", 0) for s in scopes),
        # --processes: the exchanges' own CPU (both halves on the main thread and the exchange
        # thread, as the workers count it for --max-exchange-cpu-share), seconds
        "exchange_cpu": sum(s.get("cpu_seconds", 0.0) + s.get("background_cpu_seconds", 0.0)
                            for s in scopes),
    }


def main() -> None:
    common.exit_on_sigterm()  # (a kill stops the broker too)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=12_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--mix-every", type=int, nargs="+", default=[None],
                        help="records between exchanges (default: the exchange's)")
    parser.add_argument("--exchanges", nargs="+", default=["auto"],
                        help="--model-exchange settings of topic scope (auto, mix, delta)")
    parser.add_argument("--scopes", nargs="+", default=["partition", "topic"])
    parser.add_argument("--streams", nargs="*", default=None)
    parser.add_argument("--models", nargs="*", default=["alma", "budgetsvm", "auto"])
    parser.add_argument("--broker", default="apache-kafka")
    parser.add_argument("--processes", action="store_true",
                        help="the three workers as processes of their own (default: threads of "
                        "this one, which share its GIL)")
    parser.add_argument("--max-model-bytes-share", default=str(DEFAULT_MAX_MODEL_BYTES_SHARE),
                        type=lambda text: None if text == "none" else float(text),
                        help="topic scope's budget of model-topic bytes, a share of the input's"
                        f" ('none': no budget; default {DEFAULT_MAX_MODEL_BYTES_SHARE}, the "
                        "worker's)")
    parser.add_argument("--max-exchange-cpu-share", default=str(DEFAULT_MAX_EXCHANGE_CPU_SHARE),
                        type=lambda text: None if text == "none" else float(text),
                        help="topic scope's budget of exchange CPU, a share of the processing's"
                        f" ('none': no budget; default {DEFAULT_MAX_EXCHANGE_CPU_SHARE}, the "
                        "worker's)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each configuration, taking turns (with --processes the "
                        "summary gives the median CPU ratio)")
    parser.add_argument("--control", action="store_true",
                        help="run partition scope twice a round: the second run's CPU ratio to "
                        "the first is the noise of the same configuration (an A/A test)")
    parser.add_argument("--arrival", choices=("live", "backlog"), default=None,
                        help="records sent as they are made (live, ~7,000/s) or all at once "
                        "(backlog); default: backlog with --processes, else live")
    args = parser.parse_args()
    arrival = args.arrival or ("backlog" if args.processes else "live")
    logging.basicConfig(level=logging.ERROR)
    data = streams(args.records)
    names = args.streams or list(data)
    runs = [("partition", "auto", None)] if "partition" in args.scopes else []
    if args.control and runs:
        runs.append(("partition", "control", None))
    if "topic" in args.scopes:
        runs += [("topic", e, m) for e in args.exchanges for m in args.mix_every]
    print(f"{args.records:,} records a stream over {args.partitions} partitions, "
          f"{WORKERS} workers ({'processes' if args.processes else 'threads of one process'}), "
          f"arriving {'as a backlog' if arrival == 'backlog' else 'live'}, "
          f"StandardScaler | model, {args.broker}; gap: points of progressive "
          "accuracy to one model; rate: records/s of busy time; ratio: to partition scope")
    print(f"{'stream':14} {'model':10} {'one':>6} {'scope':>11} {'accuracy':>8} {'gap':>6} "
          f"{'rate':>6} {'ratio':>6} {'bytes%':>7} {'exch%':>6} {'exch':>5}"
          + (f" {'CPU us/rec':>10} {'CPU ratio':>9} {'exch CPU%':>9}" if args.processes
             else ""))
    gaps: dict[str, list[float]] = {}
    cpu_ratios: dict[str, list[float]] = {}
    exchange_shares: dict[str, list[float]] = {}
    with make_broker(args.broker) as broker:
        for stream in names:
            for model in args.models:
                one = one_model(data[stream], model)
                wanted = [r for r in runs if r[1] != "delta" or model == "alma"]
                for round_index in range(args.rounds):
                    # The configurations take turns: each round starts one further on.
                    shift = round_index % len(wanted)
                    found = {}
                    for scope, exchange, mix_every in wanted[shift:] + wanted[:shift]:
                        control = exchange == "control"
                        found[(scope, exchange, mix_every)] = run(
                            broker.bootstrap_servers, data[stream], model, scope,
                            args.partitions, mix_every, f"{model}-{scope}",
                            args.max_model_bytes_share, "auto" if control else exchange,
                            args.processes, args.max_exchange_cpu_share, arrival)
                        if control:
                            found[(scope, exchange, mix_every)]["label"] = "control"
                    base = found.get(("partition", "auto", None))
                    for configuration in wanted:
                        print_row(stream, model, one, found[configuration], base,
                                  len(data[stream]), args.processes, gaps, cpu_ratios,
                                  exchange_shares)
    for label, values in gaps.items():
        summary = f"{label}: mean gap {statistics.mean(values):+.1f} points, worst {min(values):+.1f}"
        ratios = cpu_ratios.get(label)
        if ratios:
            summary += (f"; CPU per record / partition scope's: median "
                        f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}x-{max(ratios):.2f}x)"
                        f" over {len(ratios)} runs")
        if exchange_shares.get(label):
            summary += (f"; the exchanges' own CPU: median "
                        f"{statistics.median(exchange_shares[label]):.1f}% of the workers'")
        print(summary)


def print_row(stream: str, model: str, one: float, found: dict, base: dict | None, n: int,
              processes: bool, gaps: dict, cpu_ratios: dict, exchange_shares: dict) -> None:
    """One run's row; its gap (and CPU ratio to partition scope's run of the same round, and
    the exchanges' share of its CPU) kept for the summary."""
    label = found["label"]
    gap = 100 * (found["accuracy"] - one)
    gaps.setdefault(label, []).append(gap)
    ratio = f"{found['rate'] / base['rate']:6.2f}" if base else f"{'':6}"
    cpu = ""
    if processes:
        per_record = 1e6 * found["cpu"] / n
        cpu_ratio = f"{'':9}"
        if base:
            cpu_ratios.setdefault(label, []).append(found["cpu"] / base["cpu"])
            cpu_ratio = f"{found['cpu'] / base['cpu']:9.2f}"
        exchange_cpu = 100 * found["exchange_cpu"] / found["cpu"] if found["cpu"] else 0.0
        if found["exchanges"]:
            exchange_shares.setdefault(label, []).append(exchange_cpu)
        cpu = f" {per_record:10.1f} {cpu_ratio} {exchange_cpu:9.1f}"
    print(f"{stream:14} {model:10} {one:6.3f} {label:>11} "
          f"{found['accuracy']:8.3f} {gap:+6.1f} {found['rate']:6.0f} {ratio} "
          f"{100 * found['bytes']:7.1f} {100 * found['exchanging']:6.1f} "
          f"{found['exchanges']:5d}{cpu}", flush=True)


if __name__ == "__main__":
    main()
