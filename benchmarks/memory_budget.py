"""--max-memory against the worker's measured peak: every term driven to its bound.

Each case is a topic on Apache Kafka 4.1.1 (Tansu where it is missing) read by one worker
process (`streammargin kafka ... --max-memory SIZE --idle-timeout 3`), whose peak RSS (VmHWM,
read from /proc while it runs, the last reading before it exits) is printed beside the knob and
the formula (the sum of the parts' bounds the worker applies for the partitions it owns,
`connectors.worker.memory_budget`):

- flood: wide events (60 features of a million names of 126 characters, the longest a model's
  feature space stores, ~8.4 KB of JSON each), one in five labelled at once and the rest never:
  the models and their scalers reach their ceilings (57,344 and 65,536 names of that length,
  5,500 events a partition), the pending stores fill to their shares and evict, the checkpoints
  encode them, the fetch buffers run full;
- label-flood: the same events, then a label record for each one still waiting, at the end: the
  stores fill, then the labels join in a burst;
- largest: events of ~830 KiB, 6,000 features each (within --max-record-bytes' 1 MiB), one in
  five labelled: the fetch buffers, the stores and the models count in the largest records;
- paused-broker: the flood, with the broker frozen (SIGSTOP) for 15 s once the worker is under
  way: acknowledgements stop, outputs wait;
- topic-scope: the flood under --model-scope topic: the model exchange holds the peers' models;
- one-vs-rest, cpm, auto: the flood's events with 4 string classes ("c0".."c3"), for
  --one-vs-rest ALMA, the Convex Polytope Machine (--model convexpolytope: 4 polytopes, its
  replay window) and --model auto (the CPM and one-vs-rest ALMA and budget SVM over 4 classes,
  2,048 features): each model is charged the classes it holds, not its max_classes (100), and
  the knob is fitted to them. One-vs-rest's members each store their names, and those of
  members that learnt the same records are the same str objects, which the bound cannot assume
  (a member of a class that comes later stores others): its classes come one after another,
  every STAGGER_EVENTS events of a partition, each member filling its feature space from records
  the others did not store (--param max_features=8192, 7,168 names a member: all four at their
  ceilings from a partition's 2,600th event on, the stores filling over the rest);
- two-class (issue 45): "fraud"/"legit" under --one-vs-rest, 40% labelled inline and the rest by
  a label record 400 records after their event: nothing should be evicted, as the stores hold
  every waiting event (its stores do not fill, so its formula bounds the peak without being
  met; run it under --max-memory auto, the default, on 2 partitions).

At 1 and 12 partitions by default (--partitions 1,12,32 for more), on both transports. The
knob is --max-memory, or by default (fit) the least multiple of 256 MiB from 512 MiB up at which
the worker is not overcommitted and each partition's store holds 8 MiB or more: a model ceiling
of the flood's names takes 34 MiB a partition with its scaler, twice that with its states.

Run: .venv/bin/python benchmarks/memory_budget.py [--max-memory fit|auto|SIZE]
     [--partitions 1,12] [--events 24000] [--checkpoint-interval 10]
     [--cases flood,label-flood,largest,paused-broker,topic-scope,one-vs-rest,cpm,auto]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
import typing
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import common  # noqa: E402
import kafka_throughput as kt  # noqa: E402

CASES = ("flood", "label-flood", "largest", "paused-broker", "topic-scope", "one-vs-rest", "cpm",
         "auto")
# The multiclass cases: the model's options and their WorkerConfig fields, the classes.
MODELS = {
    "one-vs-rest": (["--one-vs-rest", "--param", "max_features=8192"],
                    {"one_vs_rest": True, "params": {"max_features": 8_192}}),
    "cpm": (["--model", "convexpolytope"], {"model": "convexpolytope"}),
    "auto": (["--model", "auto"], {"model": "auto"}),
    "two-class": (["--one-vs-rest"], {"one_vs_rest": True}),
}
CLASSES = {"one-vs-rest": 4, "cpm": 4, "auto": 4, "two-class": 2}
# one-vs-rest: a further class every this many events of a partition (130 labelled records: a
# member of 8,192 features stores its 7,168 names from 120 of 60 new names each).
STAGGER_EVENTS = 650
TWO_CLASS_LABELS = ("fraud", "legit")
LABEL_DELAY = 400  # two-class: records between an event and its label
FEATURES = 60
LARGEST_FEATURES = 6_000
NAMES = 1_000_000
NAME_LENGTH = 126  # (the longest a feature space stores: its JSON, quotes included, 128 bytes)
# Events a partition needs for its model and scaler to reach their ceilings: 65,536 names, 60 an
# event, one event in five learnt (and 2% more for names drawn twice).
EVENTS_TO_CEILING = 5_500
LARGEST_EVENTS_TO_CEILING = 60
MIN_SHARE = 8 << 20  # (the least store a fitted knob leaves each partition)
STALL_S = 120


def label(case: str, x: dict, classes: int | None = None) -> typing.Any:
    """A record's label (the learned concept is beside the point): a bool, or one of the
    case's classes (the first `classes` of them)."""
    value = x.get(min(x))
    if case not in CLASSES:
        return value > 0
    if case == "two-class":
        return TWO_CLASS_LABELS[value > 0]
    return f"c{int(abs(value) * 997) % (classes or CLASSES[case])}"


def events(case: str, n: int, seed: int = 5, partitions: int = 1) -> list[tuple[bytes, bytes]]:
    """(key, value) records of a case (one-vs-rest: a further class every STAGGER_EVENTS events
    of each of `partitions`, where record i goes to partition i % partitions)."""
    if case == "two-class":
        return delayed_events(n, seed)
    rng = random.Random(seed)
    out = []
    width = LARGEST_FEATURES if case == "largest" else FEATURES
    for i in range(n):
        x = {f"{rng.randrange(NAMES):0{NAME_LENGTH}d}": round(rng.gauss(0, 1), 6)
             for _ in range(width)}
        event = {"id": f"e{i}", "x": x}
        if i % 5 == 0:
            classes = None
            if case == "one-vs-rest":
                classes = min(CLASSES[case], 1 + i // (STAGGER_EVENTS * partitions))
            event["y"] = label(case, x, classes)
        out.append((f"e{i}".encode(), json.dumps(event).encode()))
    if case == "label-flood":
        out += [(f"e{i}".encode(), json.dumps({"id": f"e{i}", "y": i % 2 == 0}).encode())
                for i in range(n) if i % 5]
    return out


def delayed_events(n: int, seed: int) -> list[tuple[bytes, bytes]]:
    """two-class: n events of two string labels, 40% labelled inline, the others' labels in
    records of their own LABEL_DELAY records later, keyed by the event's id (`run_case` sends
    both to the partition of the event's number)."""
    rng = random.Random(seed)
    out: list[tuple[bytes, bytes]] = []
    waiting: list[tuple[int, int, str]] = []  # (due at, event index, label)
    for i in range(n):
        x = {f"{rng.randrange(NAMES):0{NAME_LENGTH}d}": round(rng.gauss(0, 1), 6)
             for _ in range(FEATURES)}
        event = {"id": f"e{i}", "x": x}
        y = label("two-class", x)
        if rng.random() < 0.4:
            event["y"] = y
        else:
            waiting.append((len(out) + LABEL_DELAY, i, y))
        out.append((f"e{i}".encode(), json.dumps(event).encode()))
        while waiting and waiting[0][0] <= len(out):
            _, j, y = waiting.pop(0)
            out.append((f"e{j}".encode(), json.dumps({"id": f"e{j}", "y": y}).encode()))
    out += [(f"e{j}".encode(), json.dumps({"id": f"e{j}", "y": y}).encode())
            for _, j, y in waiting]
    return out


def produce_to(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    """(partition, key, value) records, in order."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024)
    for partition, key, value in records:
        producer.send(topic, value, key=key, partition=partition)
    producer.flush()
    producer.close()


def scrape(port: int) -> dict[str, float]:
    """The worker's label outcomes and pending bytes, summed over its partitions (/metrics)."""
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return {}
    found: dict[str, typing.Any] = {}
    for line in text.decode().splitlines():
        if line.startswith("streammargin_delayed_labels_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] = found.get(outcome, 0) + float(line.split()[-1])
        elif line.startswith("streammargin_pending_label_bytes{"):
            found["pending_bytes"] = found.get("pending_bytes", 0) + float(line.split()[-1])
        elif line.startswith("streammargin_memory_budget_bytes{"):
            part = line.split('part="', 1)[1].split('"', 1)[0]
            found.setdefault("budget", {})[part] = int(float(line.split()[-1]))
        elif line.startswith("streammargin_records_total{"):
            found["records"] = found.get("records", 0) + float(line.split()[-1])
        elif line.startswith("streammargin_memory_overcommitted "):
            found["overcommitted"] = float(line.split()[-1]) > 0
    return found


def planned(case: str, options: dict, partitions: int) -> typing.Any:
    """The budget the worker applies at this many partitions once its models hold the case's
    classes (`MemoryBudget.holding`)."""
    from connectors.worker import memory_budget
    from connectors.worker.config import WorkerConfig
    from connectors.worker.worker import Worker

    worker = Worker(WorkerConfig(topics=["t"], scale=True, **options,  # (kt.WORKER_OPTIONS')
                                 **MODELS.get(case, ((), {}))[1]))
    if case not in CLASSES:
        return worker.memory
    model = worker.settings.build_model()
    held = memory_budget.model_ceiling(model, CLASSES[case])
    return worker.memory.holding([held] * partitions)


def formula(case: str, options: dict, partitions: int) -> tuple[int, dict]:
    """The sum of the parts' bounds the worker applies at this many partitions."""
    parts = planned(case, options, partitions).parts(partitions, partitions)
    return sum(parts.values()), parts


def fitted_knob(case: str, transport: str, partitions: int) -> int:
    """The least multiple of 256 MiB from 512 MiB at which the worker is not overcommitted on
    this many partitions and each store holds MIN_SHARE or more."""
    knob = 512 << 20
    while True:
        options = {"transport": transport, "max_memory": knob}
        if case == "topic-scope":
            options.update(model_scope="topic", model_topic="m")
        budget = planned(case, options, partitions)
        if (not budget.overcommitted(partitions, partitions)
                and budget.pending_share(partitions, partitions) >= MIN_SHARE):
            return knob
        knob += 256 << 20


def event_count(case: str, partitions: int, events: int) -> int:
    """Enough events for every partition's model to reach its ceiling, and at least `events`
    (`largest`: 1/100 of them; two-class: `events`, its models' ceilings beside the point)."""
    if case == "two-class":
        return events
    if case == "largest":
        return max(events // 100, LARGEST_EVENTS_TO_CEILING * partitions)
    return max(events, EVENTS_TO_CEILING * partitions)


def run_case(broker, case: str, transport: str, partitions: int, max_memory: str,
             n: int, checkpoint_interval: float = 10.0) -> dict:
    from connectors.kafka.broker import create_topics

    bootstrap = broker.bootstrap_servers
    from connectors.worker.memory_budget import parse_size

    run_id = uuid.uuid4().hex[:8]
    topic, out, group = f"mem.{case}.{run_id}", f"mem.out.{run_id}", f"mem.g.{run_id}"
    create_topics(bootstrap, [topic, out], partitions=partitions)
    records = events(case, n, partitions=partitions)
    if case == "two-class":  # (a label to its event's partition: by the event's number)
        keyed = [(int(key[1:]) % partitions, key, value) for key, value in records]
        produce_to(bootstrap, topic, keyed)
    else:
        kt.produce(bootstrap, topic, records, partitions)
    input_bytes = sum(len(v) for _, v in records)
    del records
    from connectors.kafka.broker import free_port

    port = free_port()
    command = kt.worker_command(bootstrap, topic, out, group, [
        *MODELS.get(case, ((), {}))[0],
        "--transport", transport, "--max-memory", max_memory, "--idle-timeout", "3",
        "--checkpoint-interval", f"{checkpoint_interval:g}", "--http-port", str(port),
        "--http-host", "127.0.0.1",
        # (--max-memory auto: the ceiling the worker took, from its "memory:" lines)
        *(["--log-level", "INFO"] if max_memory == "auto" else []),
        *(["--model-scope", "topic", "--model-topic", f"mem.models.{run_id}"]
          if case == "topic-scope" else [])])
    process = subprocess.Popen(command, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    peak = 0
    seen: dict[str, float] = {}
    most_pending = 0.0
    started = time.monotonic()
    next_scrape = started
    pause_at = None if case != "paused-broker" else started
    progress = (0.0, started)  # (records processed, when that count was first seen)
    stalled = None
    while process.poll() is None:
        if pause_at is not None and seen.get("pending_bytes", 0) > 0:
            broker.pause()
            time.sleep(15)
            broker.resume()
            pause_at = None
        try:
            peak = max(peak, kt.peak_rss_kib(process.pid))
        except (OSError, ValueError):
            break
        if time.monotonic() >= next_scrape:
            seen = scrape(port) or seen
            most_pending = max(most_pending, seen.get("pending_bytes", 0))
            next_scrape = time.monotonic() + 0.5
            if seen.get("records", 0) > progress[0]:
                progress = (seen["records"], time.monotonic())
            elif time.monotonic() - progress[1] > STALL_S:
                # (no record processed for that long: the worker is stuck, not slow; its peak
                # bounds nothing, and the row says so)
                stalled = int(progress[0])
                process.terminate()
                break
        time.sleep(0.05)
        if time.monotonic() - started > 900:
            process.kill()
            break
    stdout, stderr = process.communicate()
    if stalled is not None:
        sys.stderr.write(f"{case}/{transport}/{partitions}: no record processed for {STALL_S} s "
                         f"after {stalled}; its log's end:\n{stderr.decode()[-3000:]}\n")
    elif process.returncode != 0:
        raise RuntimeError(f"{case}/{transport}/{partitions}: exit {process.returncode}\n"
                           f"{stderr.decode()[-2000:]}")
    summary = ({"records": f"stalled at {stalled}"} if stalled is not None
               else json.loads(stderr.decode().strip().splitlines()[-1]))
    ceilings = re.findall(r"memory: .*?--max-memory (?:auto, )?(\d+) MiB", stderr.decode())
    if seen.get("budget"):
        # (what the worker applied, as its /metrics gave it last: the parts its assignment and
        # its exchange's state call for, e.g. no delta ledger while it has had no peer)
        parts = seen["budget"]
        total = sum(parts.values())
    else:
        options = {"transport": transport,
                   "max_memory": max_memory if max_memory == "auto" else parse_size(max_memory)}
        if case == "topic-scope":
            options.update(model_scope="topic", model_topic="m")
        total, parts = formula(case, options, partitions)
    return {"peak": peak << 10, "formula": total, "parts": parts, "input": input_bytes,
            "records": summary["records"], "evicted": _evicted(summary, seen),
            "most_pending": most_pending, "overcommitted": seen.get("overcommitted", False),
            "ceiling": int(ceilings[-1]) << 20 if ceilings else None}


def _evicted(summary: dict, seen: dict) -> int:
    """The events evicted, from the worker's exit summary (its /metrics publish the counters at
    checkpoints and metrics records: with one checkpoint at the end, kafka-python's last
    scrape at 32 partitions read 0)."""
    partitions = summary.get("partitions")
    if isinstance(partitions, dict):
        return sum(int(p.get("labels", {}).get("evicted", 0)) for p in partitions.values())
    return int(seen.get("evicted", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-memory", default="fit")
    parser.add_argument("--partitions", default="1,12")
    parser.add_argument("--events", type=int, default=24_000)
    # Every 10 s, a round checkpoints the partitions that had records since the last. On
    # librdkafka at 32 partitions a round held 15-23 of them (its fetches take a few partitions
    # at a time), so the checkpoints' term, every state encoded at once, was never reached
    # there; 3600 leaves the one checkpoint at the end, of every partition at its ceiling.
    parser.add_argument("--checkpoint-interval", type=float, default=10.0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--transports", default="kafka-python,librdkafka")
    parser.add_argument("--broker", choices=("apache-kafka", "tansu"), default=None)
    args = parser.parse_args()
    common.exit_on_sigterm()
    from connectors.kafka.broker import make_broker
    from connectors.worker.memory_budget import format_size, parse_size

    kind, fallback = kt.broker_kind(args.broker)
    with make_broker(kind) as broker:
        print(f"broker: {kt.broker_description(broker)}" + (
            f" (Apache Kafka unavailable: {fallback})" if fallback else ""))
        print(f"--max-memory {args.max_memory}, --checkpoint-interval "
              f"{args.checkpoint_interval:g}; peak = VmHWM of the worker process\n")
        header = (f"{'case':<12} {'transport':<12} {'parts':>5} {'knob':>9} {'input':>9} "
                  f"{'records':>8} "
                  f"{'evicted':>8} {'pending':>9} {'formula':>9} {'peak':>9} {'peak/knob':>9} "
                  f"{'formula/peak':>12}  largest parts")
        print(header)
        print("-" * len(header))
        for case in args.cases.split(","):
            for partitions in [int(p) for p in args.partitions.split(",")]:
                n = event_count(case, partitions, args.events)
                for transport in args.transports.split(","):
                    knob = (fitted_knob(case, transport, partitions) if args.max_memory == "fit"
                            else args.max_memory if args.max_memory == "auto"
                            else parse_size(args.max_memory))
                    row = run_case(broker, case, transport, partitions, f"{knob}", n,
                                   args.checkpoint_interval)
                    if knob == "auto":  # (the default's ceiling, as the worker took it)
                        knob = row["ceiling"] or row["formula"]
                    largest = sorted(row["parts"].items(), key=lambda kv: -kv[1])[:3]
                    over = " (overcommitted)" if row["overcommitted"] else ""
                    print(f"{case:<12} {transport:<12} {partitions:>5} {format_size(knob):>9} "
                          f"{format_size(row['input']):>9} {row['records']:>8} "
                          f"{row['evicted']:>8} {format_size(row['most_pending']):>9} "
                          f"{format_size(row['formula']):>9} "
                          f"{format_size(row['peak']):>9} {row['peak'] / knob:>9.2f} "
                          f"{row['formula'] / row['peak']:>12.2f}  "
                          + ", ".join(f"{k} {format_size(v)}" for k, v in largest) + over,
                          flush=True)


if __name__ == "__main__":
    main()
