"""--max-memory against the worker's measured peak: every term driven to its bound.

Each case is a topic on Apache Kafka 4.1.1 (Tansu where it is missing) read by one worker
process (`streammargin kafka ... --max-memory SIZE --idle-timeout 3`), whose peak RSS (VmHWM,
read from /proc while it runs, the last reading before it exits) is printed beside the knob and
the formula (the sum of the parts' bounds the worker applies for the partitions it owns,
`connectors.worker.memory_budget`):

- flood: wide events (60 features of 100,000 names, ~1.6 KB of JSON each), one in five
  labelled at once and the rest never: the models grow to their ceilings (65,536 names), the
  pending stores fill to their shares and evict, the checkpoints encode them, the fetch buffers
  run full;
- label-flood: the same events, then a label record for each one still waiting, at the end: the
  stores fill, then the labels join in a burst;
- largest: events of ~512 KiB, 24,000 features each, one in five labelled: the fetch buffers,
  the stores and the models count in the largest records;
- paused-broker: the flood, with the broker frozen (SIGSTOP) for 15 s once the worker is under
  way: acknowledgements stop, outputs wait;
- topic-scope: the flood under --model-scope topic: the model exchange holds the peers' models.

At 1 and 12 partitions by default (--partitions 1,12,32 for more), on both transports.

Run: .venv/bin/python benchmarks/memory_budget.py [--max-memory 512MiB] [--partitions 1,12]
     [--events 144000] [--cases flood,label-flood,largest,paused-broker,topic-scope]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import common  # noqa: E402
import kafka_throughput as kt  # noqa: E402

CASES = ("flood", "label-flood", "largest", "paused-broker", "topic-scope")
FEATURES = 60
NAMES = 100_000


def events(case: str, n: int, seed: int = 5) -> list[tuple[bytes, bytes]]:
    """(key, value) records of a case."""
    rng = random.Random(seed)
    out = []
    width = 24_000 if case == "largest" else FEATURES
    for i in range(n):
        x = {f"f{rng.randrange(NAMES):05d}": round(rng.gauss(0, 1), 6) for _ in range(width)}
        event = {"id": f"e{i}", "x": x}
        if i % 5 == 0:
            event["y"] = x.get(min(x)) > 0  # (the learned concept is beside the point)
        out.append((f"e{i}".encode(), json.dumps(event).encode()))
    if case == "label-flood":
        out += [(f"e{i}".encode(), json.dumps({"id": f"e{i}", "y": i % 2 == 0}).encode())
                for i in range(n) if i % 5]
    return out


def scrape(port: int) -> dict[str, float]:
    """The worker's label outcomes and pending bytes, summed over its partitions (/metrics)."""
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return {}
    found: dict[str, float] = {}
    for line in text.decode().splitlines():
        if line.startswith("streammargin_delayed_labels_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] = found.get(outcome, 0) + float(line.split()[-1])
        elif line.startswith("streammargin_pending_label_bytes{"):
            found["pending_bytes"] = found.get("pending_bytes", 0) + float(line.split()[-1])
    return found


def formula(options: dict, partitions: int) -> tuple[int, dict]:
    """The sum of the parts' bounds the worker applies at this many partitions."""
    from connectors.worker.config import WorkerConfig
    from connectors.worker.worker import Worker

    worker = Worker(WorkerConfig(topics=["t"], **options))
    parts = worker.memory.parts(partitions, partitions)
    return sum(parts.values()), parts


def run_case(broker, case: str, transport: str, partitions: int, max_memory: str,
             n: int) -> dict:
    from connectors.kafka.broker import create_topics

    bootstrap = broker.bootstrap_servers
    from connectors.worker.memory_budget import parse_size

    run_id = uuid.uuid4().hex[:8]
    topic, out, group = f"mem.{case}.{run_id}", f"mem.out.{run_id}", f"mem.g.{run_id}"
    create_topics(bootstrap, [topic, out], partitions=partitions)
    records = events(case, n)
    kt.produce(bootstrap, topic, records, partitions)
    input_bytes = sum(len(v) for _, v in records)
    del records
    from connectors.kafka.broker import free_port

    port = free_port()
    command = kt.worker_command(bootstrap, topic, out, group, [
        "--transport", transport, "--max-memory", max_memory, "--idle-timeout", "3",
        "--checkpoint-interval", "10", "--http-port", str(port), "--http-host", "127.0.0.1",
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
        time.sleep(0.05)
        if time.monotonic() - started > 900:
            process.kill()
            break
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{case}/{transport}/{partitions}: exit {process.returncode}\n"
                           f"{stderr.decode()[-2000:]}")
    summary = json.loads(stderr.decode().strip().splitlines()[-1])
    options = {"transport": transport, "max_memory": parse_size(max_memory)}
    if case == "topic-scope":
        options.update(model_scope="topic", model_topic="m")
    total, parts = formula(options, partitions)
    return {"peak": peak << 10, "formula": total, "parts": parts, "input": input_bytes,
            "records": summary["records"], "evicted": int(seen.get("evicted", 0)),
            "most_pending": most_pending}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-memory", default="512MiB")
    parser.add_argument("--partitions", default="1,12")
    parser.add_argument("--events", type=int, default=144_000)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--transports", default="kafka-python,librdkafka")
    parser.add_argument("--broker", choices=("apache-kafka", "tansu"), default=None)
    args = parser.parse_args()
    common.exit_on_sigterm()
    from connectors.kafka.broker import make_broker
    from connectors.worker.memory_budget import format_size, parse_size

    knob = parse_size(args.max_memory)
    kind, fallback = kt.broker_kind(args.broker)
    with make_broker(kind) as broker:
        print(f"broker: {kt.broker_description(broker)}" + (
            f" (Apache Kafka unavailable: {fallback})" if fallback else ""))
        print(f"--max-memory {args.max_memory}; peak = VmHWM of the worker process\n")
        header = (f"{'case':<12} {'transport':<12} {'parts':>5} {'input':>9} {'records':>8} "
                  f"{'evicted':>8} {'pending':>9} {'formula':>9} {'peak':>9} {'peak/knob':>9} "
                  f"{'formula/peak':>12}  largest parts")
        print(header)
        print("-" * len(header))
        for case in args.cases.split(","):
            n = args.events if case != "largest" else max(1, args.events // 240)
            for partitions in [int(p) for p in args.partitions.split(",")]:
                for transport in args.transports.split(","):
                    row = run_case(broker, case, transport, partitions,
                                   args.max_memory, n)
                    largest = sorted(row["parts"].items(), key=lambda kv: -kv[1])[:3]
                    print(f"{case:<12} {transport:<12} {partitions:>5} "
                          f"{format_size(row['input']):>9} {row['records']:>8} "
                          f"{row['evicted']:>8} {format_size(row['most_pending']):>9} "
                          f"{format_size(row['formula']):>9} "
                          f"{format_size(row['peak']):>9} {row['peak'] / knob:>9.2f} "
                          f"{row['formula'] / row['peak']:>12.2f}  "
                          + ", ".join(f"{k} {format_size(v)}" for k, v in largest), flush=True)


if __name__ == "__main__":
    main()
