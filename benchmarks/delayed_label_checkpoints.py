"""Checkpoint bytes and restore time under delayed labels: the three ways to keep what waits.

One partition on Apache Kafka 4.1.1 (Tansu where it is missing) holds `--events` JSON events of
~200 bytes (an id and 11 features), keyed by their id. One in fifty carries its label; the rest
wait for one that never comes, so the pending store fills to `--label-store-size` (100,000, the
default) and then evicts its oldest: the fraud pipeline of issue 37, driven to the store's bound.
Each contender reads the topic with the worker's defaults (a checkpoint every 10,000 records),
taking turns:

- ``segments``: this checkout's worker. A checkpoint writes the predictions of the events that
  came since the last one and a bit per waiting event; a restore reads the waiting events again
  from the input topic (route 2 of the issue).
- ``whole-store``: the worker of `--baseline DIR` (a checkout before incremental checkpoints,
  e.g. `git worktree add /tmp/base 4121588`), whose every checkpoint holds the whole store.
- ``changelog``: route 1, a compacted topic keyed by event id (what Kafka Streams does), written
  by this script with kafka-python for the same stream: a record per waiting event (its input
  record and the 9 bytes of its prediction) and a tombstone per event that leaves the store.
  Its restore reads the topic from the start and decodes each event into a store (a dict), as a
  worker would. The log cleaner does not touch the active segment, so this is what a restore
  reads before compaction; after it, the live records (the store) and the tombstones not yet
  deleted (delete.retention.ms, a day by default).

Printed: the bytes each wrote (keys and values, read back from the broker) over the input's,
the bytes of each checkpoint as the store fills, and the time to restore the partition with a
full store (the worker's "assigned ... in N ms" line of a restart that has nothing new to read:
checkpoint load plus, for segments, the input re-read; the median of `--restores` restarts).

Run: .venv/bin/python benchmarks/delayed_label_checkpoints.py --baseline /tmp/base
     [--events 300000] [--label-store-size 100000] [--restores 3] [--transport kafka-python]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import common  # noqa: E402
import kafka_throughput as kt  # noqa: E402

FEATURES = 11
LABELLED_EVERY = 50  # 2% labelled at once
ASSIGNED = re.compile(r"assigned \S+ \((\d+) restored.*?\) in (\d+) ms")
REBUILT = re.compile(r"(\d+) events waiting for their label read again .* in (\d+) ms")


def events(n: int, seed: int = 11) -> list[tuple[bytes, bytes]]:
    """(key, value) records: an id and FEATURES features, the label on one in LABELLED_EVERY."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        x = {f"f{j}": round(rng.gauss(0, 1), 6) for j in range(FEATURES)}
        event = {"id": f"e{i:06d}", "x": x}
        if i % LABELLED_EVERY == 0:
            event["y"] = x["f0"] + x["f1"] > 0
        out.append((event["id"].encode(), json.dumps(event).encode()))
    return out


def topic_records(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    """Every (key, value) of partition 0 of `topic`, from its start to its end."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    out: list[tuple[bytes, bytes | None]] = []
    while consumer.position(tp) < end:
        for batch in consumer.poll(timeout_ms=1000).values():
            out.extend((r.key, r.value) for r in batch)
    consumer.close()
    return out


def record_bytes(records) -> int:
    return sum(len(k or b"") + len(v or b"") for k, v in records)


def per_checkpoint(records) -> list[int]:
    """The bytes of each checkpoint on a checkpoint topic, in order: its chunk (and segment)
    records, whose keys end in <generation>:<index>, and tombstones up to its head record."""
    sizes, pending = [], 0
    for key, value in records:
        pending += len(key or b"") + len(value or b"")
        if value is not None and b":" not in key:
            sizes.append(pending)
            pending = 0
    return sizes


def size(n: float) -> str:
    return f"{n / (1 << 20):.2f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def run_worker(command: list[str], timeout: float = 900) -> str:
    """The worker's stderr once it exits (it stops after --idle-timeout without records)."""
    done = subprocess.run(command, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.decode()[-2000:]}")
    return done.stderr.decode()


def worker_contender(name: str, bootstrap: str, topic: str, args) -> dict:
    run_id = uuid.uuid4().hex[:8]
    out, group = f"dl.out.{run_id}", f"dl.g.{run_id}"
    extra = ["--label-store-size", str(args.label_store_size), "--max-memory", args.max_memory,
             "--transport", args.transport, "--idle-timeout", "3", "--log-level", "INFO"]
    command = kt.contender_command("worker" if name == "segments" else "baseline", bootstrap,
                                   topic, out, group, 1, extra)
    run_worker(command)
    written = topic_records(bootstrap, f"{out}.checkpoints")
    restores, waiting = [], None
    for _ in range(args.restores):
        log = run_worker(command)
        assigned = ASSIGNED.findall(log)
        rebuilt = REBUILT.findall(log)
        if not assigned:
            raise RuntimeError(f"{name}: no 'assigned' line in the restart's log:\n{log[-1500:]}")
        restores.append(int(assigned[0][1]) / 1000)
        waiting = int(rebuilt[0][0]) if rebuilt else None
    return {"bytes": record_bytes(written), "checkpoints": per_checkpoint(written),
            "restore_s": restores, "rebuilt": waiting}


def changelog_contender(bootstrap: str, records, store_size: int, restores: int) -> dict:
    """Route 1: the store's changelog on a compacted topic, written and read back here."""
    from kafka import KafkaProducer

    from connectors.kafka.broker import create_topics

    topic = f"dl.changelog.{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], partitions=1, compacted=True)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 << 10)
    prediction = struct.Struct(">?d")
    waiting: dict[bytes, None] = {}
    for i, (key, value) in enumerate(records):
        if i % LABELLED_EVERY == 0:
            continue  # labelled at once: never waits
        producer.send(topic, value + prediction.pack(True, 0.5), key=key, partition=0)
        waiting[key] = None
        if len(waiting) > store_size:  # the oldest evicted: a tombstone
            oldest = next(iter(waiting))
            del waiting[oldest]
            producer.send(topic, None, key=oldest, partition=0)
    producer.flush()
    producer.close()
    times, held, written = [], 0, []
    for _ in range(restores):
        started = time.perf_counter()
        store: dict[str, tuple] = {}
        written = topic_records(bootstrap, topic)
        for key, value in written:
            if value is None:
                store.pop(key.decode(), None)
            else:
                event = json.loads(value[:-prediction.size])
                store[event["id"]] = (event["x"], *prediction.unpack(value[-prediction.size:]))
        times.append(time.perf_counter() - started)
        held = len(store)
    # (what the last restore read is what the topic holds: nothing was compacted meanwhile)
    return {"bytes": record_bytes(written), "checkpoints": None, "restore_s": times,
            "rebuilt": held}


def ratios(a: dict, b: dict) -> str:
    """Contender a's bytes and median restore time over b's."""
    restore = statistics.median(a["restore_s"]) / statistics.median(b["restore_s"])
    return f"bytes {a['bytes'] / b['bytes']:.3f}x, restore {restore:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--label-store-size", type=int, default=100_000)
    parser.add_argument("--restores", type=int, default=3)
    parser.add_argument("--baseline", metavar="DIR",
                        help="a checkout whose worker checkpoints the whole store")
    parser.add_argument("--transport", default="kafka-python")
    parser.add_argument("--max-memory", default="2GiB",
                        help="(large enough that the store fills to --label-store-size)")
    parser.add_argument("--broker", choices=("apache-kafka", "tansu"), default=None)
    args = parser.parse_args()
    common.exit_on_sigterm()
    from connectors.kafka.broker import create_topics, make_broker

    if args.baseline:
        kt.BASELINE["dir"] = os.path.abspath(args.baseline)
    contenders = ["segments", "changelog"] + (["whole-store"] if args.baseline else [])
    records = events(args.events)
    input_bytes = record_bytes(records)
    kind, fallback = kt.broker_kind(args.broker)
    with make_broker(kind) as broker:
        bootstrap = broker.bootstrap_servers
        topic = f"dl.events.{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, [topic], partitions=1)
        kt.produce(bootstrap, topic, records, 1)
        print(f"broker: {kt.broker_description(broker)}" + (
            f" (Apache Kafka unavailable: {fallback})" if fallback else ""))
        print(f"{args.events:,} events on one partition, {size(input_bytes)} "
              f"({input_bytes / args.events:.0f} B each with its key), 1 in {LABELLED_EVERY} "
              f"labelled at once; --label-store-size {args.label_store_size:,}, "
              f"--checkpoint-every 10000 (the default), --transport {args.transport}\n")
        results = {}
        for name in contenders:  # (the changelog's turn between the workers')
            if name == "changelog":
                results[name] = changelog_contender(bootstrap, records, args.label_store_size,
                                                    args.restores)
            else:
                results[name] = worker_contender(name, bootstrap, topic, args)
        header = (f"{'route':<12} {'written':>10} {'/ input':>8} {'checkpoints':>11} "
                  f"{'restore s':>10} {'store':>8}")
        print(header)
        print("-" * len(header))
        for name in contenders:
            row = results[name]
            count = str(len(row["checkpoints"])) if row["checkpoints"] else "-"
            print(f"{name:<12} {size(row['bytes']):>10} {row['bytes'] / input_bytes:>7.3f}x "
                  f"{count:>11} {statistics.median(row['restore_s']):>10.2f} "
                  f"{row['rebuilt'] if row['rebuilt'] is not None else '-':>8}")
        print(f"\nrestore s: median of {args.restores} restarts; store: the waiting events the "
              "restore gave back (segments: read again from the input; whole-store: '-', its "
              "log does not count them)")
        workers = [name for name in contenders if results[name]["checkpoints"]]
        print("\nbytes of each checkpoint, in order (one falls due at the first poll past "
              "10,000 records of the partition; the store holds\n"
              f"{args.label_store_size:,} events once "
              f"{args.label_store_size * LABELLED_EVERY // (LABELLED_EVERY - 1):,} are read)")
        print(f"{'#':>4} " + " ".join(f"{n:>12}" for n in workers))
        cells = [results[n]["checkpoints"] for n in workers]
        for k in range(max(len(c) for c in cells)):
            print(f"{k + 1:>4} " + " ".join(
                f"{size(c[k]) if k < len(c) else '':>12}" for c in cells))
        if "whole-store" in results:
            whole = ratios(results["segments"], results["whole-store"])
            print(f"\nsegments / whole-store: {whole}")
        print(f"segments / changelog: {ratios(results['segments'], results['changelog'])}")


if __name__ == "__main__":
    main()
