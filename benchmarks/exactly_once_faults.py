"""Exactly-once under faults: SIGKILLed workers and a zombie, counted record by record.

Three `streammargin kafka --processing-guarantee exactly-once` workers share a topic of four
partitions on Apache Kafka (`connectors.kafka.broker.ApacheKafkaBroker`) while `--records` labelled
records are produced in chunks. Every 1-2.5 s one worker, picked at random, is SIGKILLed and
restarted at once with the same `--client-id` (its transactional id, so the new producer fences
the killed one and aborts its open transaction); halfway, one worker is frozen (SIGSTOP) past its
session and thawed, a zombie that still holds an open transaction. Then every worker runs to
`--idle-timeout` and must exit 0.

Per run it prints: the kills, the committed predictions a read_committed consumer sees, how many
input offsets have none (lost) or more than one (duplicated), the records a read_uncommitted
consumer sees (aborted transactions included: the faults really cut transactions), and whether
each partition's committed checkpoint holds the model of an uninterrupted run. The issue's
target: across at least 10 SIGKILLs, 0 lost and 0 duplicated. tests/test_exactly_once.py runs the
same harness (`run_faults`) with fewer kills.

Run: .venv/bin/python benchmarks/exactly_once_faults.py [--kills 10] [--records 50000]
     [--transports kafka-python,librdkafka] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import common  # (this folder: the script's own)

PARTITIONS = 4
WORKERS = 3


def labelled_events(n: int, seed: int) -> list[tuple[dict, bool]]:
    from river.datasets import synth

    return [(x, bool(y)) for x, y in synth.Agrawal(classification_function=2, seed=seed).take(n)]


def encode(i: int, x: dict, y: bool) -> bytes:
    return json.dumps({"id": f"e{i}", "x": x, "y": y}).encode()


def produce(bootstrap: str, topic: str, items: list[tuple[int, bytes]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
    for partition, value in items:
        producer.send(topic, value, partition=partition)
    producer.flush()
    producer.close()


def read_topic(bootstrap: str, topic: str, committed: bool = True) -> list:
    """Every record of `topic` that a read_committed (or read_uncommitted) consumer sees."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, fetch_max_wait_ms=20,
                             isolation_level="read_committed" if committed
                             else "read_uncommitted")
    try:
        numbers = consumer.partitions_for_topic(topic) or set()
        partitions = [TopicPartition(topic, p) for p in sorted(numbers)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)  # read_committed: the last stable offsets
        records: list = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                consumer.position(tp) < ends[tp] for tp in partitions):
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def committed_checkpoints(bootstrap: str, checkpoint_topic: str, group_id: str, topic: str,
                          partitions: range) -> dict[int, dict]:
    """The latest committed checkpoint of each input partition, decoded."""
    from connectors.state import checkpoint

    store = checkpoint.CheckpointStore(bootstrap, checkpoint_topic, group_id,
                                       reader_config={"isolation_level": "read_committed"},
                                       transactional=True)
    try:
        found = store.load([(topic, p) for p in partitions])
    finally:
        store.close()
    return {p: checkpoint.decode_checkpoint(found[(topic, p)].payload)
            for p in partitions if (topic, p) in found}


def start_worker(bootstrap: str, name: str, client_id: str, transport: str,
                 log_path: pathlib.Path) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", "connectors.cli", "kafka",
        "--bootstrap-servers", bootstrap, "--topic", name, "--group-id", f"{name}.group",
        "--predictions-topic", f"{name}.predictions", "--metrics-topic", f"{name}.metrics",
        "--dead-letter-topic", f"{name}.dead", "--checkpoint-topic", f"{name}.checkpoints",
        "--session-timeout-ms", "2000", "--heartbeat-interval-ms", "500",
        "--checkpoint-interval", "none", "--checkpoint-every", "1000",
        "--max-poll-records", "500", "--idle-timeout", "8",
        "--processing-guarantee", "exactly-once", "--client-id", client_id,
        "--transport", transport,
    ]
    log = open(log_path, "wb")  # noqa: SIM115 (closed by the process' end)
    return subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def run_faults(bootstrap: str, transport: str, n_records: int, n_kills: int, seed: int,
               workdir: pathlib.Path) -> dict:
    """One run (see the module's docstring); returns its counts and the worker logs."""
    from connectors.kafka.broker import create_topics

    name = f"eos-faults-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [name], partitions=PARTITIONS)
    data = labelled_events(n_records, seed)
    items = [(i % PARTITIONS, encode(i, x, y)) for i, (x, y) in enumerate(data)]
    rng = random.Random(seed)
    slots: dict[str, subprocess.Popen] = {}
    logs: list[pathlib.Path] = []

    def start(slot: str) -> None:
        log = workdir / f"{slot}-{len(logs)}.log"
        logs.append(log)
        slots[slot] = start_worker(bootstrap, name, slot, transport, log)

    chunk = n_records // (n_kills + 2)
    produce(bootstrap, name, items[:chunk])
    produced = chunk
    for k in range(WORKERS):
        start(f"w{k}")
    started = time.monotonic()
    kills = zombies = 0
    exits: dict[str, int] = {}
    try:
        while kills < n_kills:
            time.sleep(rng.uniform(1.0, 2.5))
            slot = rng.choice(sorted(slots))
            slots[slot].send_signal(signal.SIGKILL)
            slots[slot].wait()
            kills += 1
            start(slot)
            if produced < n_records:
                produce(bootstrap, name, items[produced:produced + chunk])
                produced += chunk
            if not zombies and kills == n_kills // 2:
                # Frozen past its session (2 s): its partitions go to the others. Thawed, it
                # still holds its open transaction and tries to commit it.
                zombies += 1
                zombie = slots[sorted(slots)[kills % WORKERS]]
                zombie.send_signal(signal.SIGSTOP)
                time.sleep(4.0)
                zombie.send_signal(signal.SIGCONT)
        produce(bootstrap, name, items[produced:])
        for slot, process in slots.items():
            try:
                exits[slot] = process.wait(180)
            except subprocess.TimeoutExpired:
                exits[slot] = -1
    finally:
        for process in slots.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    seconds = time.monotonic() - started

    predictions = read_topic(bootstrap, f"{name}.predictions")
    seen: dict[tuple[int, int], int] = {}
    for record in predictions:
        prediction = json.loads(record.value)
        key = (prediction["partition"], prediction["offset"])
        seen[key] = seen.get(key, 0) + 1
    expected = {(p, o) for p in range(PARTITIONS) for o in range(n_records // PARTITIONS)}
    uncommitted = len(read_topic(bootstrap, f"{name}.predictions", committed=False))

    import streammargin
    from streammargin import state

    tasks = committed_checkpoints(bootstrap, f"{name}.checkpoints", f"{name}.group", name,
                                  range(PARTITIONS))
    identical = 0
    diverged: dict[int, str] = {}
    for partition in range(PARTITIONS):
        fields = tasks.get(partition)
        if fields is None or fields["next_offset"] != n_records // PARTITIONS:
            diverged[partition] = ("no checkpoint" if fields is None
                                   else f"next_offset {fields['next_offset']}")
            continue
        model = streammargin.ALMAClassifier()
        for i, (x, y) in enumerate(data):
            if i % PARTITIONS == partition:
                model.learn_one(x, y)
        saved = streammargin.from_state(fields["model"])
        same = state.dumps(saved.to_state()) == state.dumps(model.to_state())
        identical += same
        if not same:
            diverged[partition] = "model differs"
    return {
        "transport": transport,
        "records": n_records,
        "kills": kills,
        "zombies": zombies,
        "exits": exits,
        "seconds": seconds,
        "committed": len(predictions),
        "lost": len(expected - seen.keys()),
        "duplicated": sum(count - 1 for count in seen.values() if count > 1),
        "unexpected": len(seen.keys() - expected),
        "read_uncommitted": uncommitted,
        "identical_models": identical,
        "diverged": diverged,
        "partitions": PARTITIONS,
        "logs": logs,
    }


def main() -> int:
    common.exit_on_sigterm()  # (a kill stops the broker too)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--transports", default="kafka-python,librdkafka")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    from connectors.kafka.broker import KAFKA_VERSION, ApacheKafkaBroker

    rows = []
    with tempfile.TemporaryDirectory() as tmp, ApacheKafkaBroker() as broker:
        print(f"broker: Apache Kafka {KAFKA_VERSION} at {broker.bootstrap_servers}; "
              f"{WORKERS} workers, {PARTITIONS} partitions, {args.records:,} records, "
              f"{args.kills} SIGKILLs and 1 zombie per run", flush=True)
        for run in range(args.runs):
            for transport in args.transports.split(","):
                workdir = pathlib.Path(tmp, f"{transport}-{run}")
                workdir.mkdir()
                result = run_faults(broker.bootstrap_servers, transport, args.records,
                                    args.kills, args.seed + run, workdir)
                rows.append(result)
                print(f"  run {run + 1} {transport}: {result['kills']} kills, "
                      f"{result['committed']:,} committed, lost {result['lost']}, duplicated "
                      f"{result['duplicated']}, exits {sorted(result['exits'].values())}",
                      flush=True)
    print()
    print("| transport | runs | SIGKILLs | zombies | committed predictions | lost | duplicated "
          "| read_uncommitted (aborted included) | models identical | exit codes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for transport in args.transports.split(","):
        mine = [r for r in rows if r["transport"] == transport]
        exits = sorted(code for r in mine for code in r["exits"].values())
        print(f"| {transport} | {len(mine)} | {sum(r['kills'] for r in mine)} "
              f"| {sum(r['zombies'] for r in mine)} | {sum(r['committed'] for r in mine):,} "
              f"| {sum(r['lost'] for r in mine)} | {sum(r['duplicated'] for r in mine)} "
              f"| {sum(r['read_uncommitted'] for r in mine):,} "
              f"| {sum(r['identical_models'] for r in mine)}/{sum(r['partitions'] for r in mine)} "
              f"| {exits} |")
    ok = all(r["lost"] == 0 and r["duplicated"] == 0 and r["unexpected"] == 0
             and r["identical_models"] == r["partitions"]
             and all(code == 0 for code in r["exits"].values()) for r in rows)
    print(f"\ntarget (0 lost, 0 duplicated, identical models, every worker exits 0): "
          f"{'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
