"""How fresh `streammargin serve`'s answers are, and what following costs the workers, on Apache
Kafka.

    python benchmarks/serving_freshness.py --seconds 30 --rounds 3

1. Freshness: a worker learns a live stream (`--checkpoint-interval 1`, payments arriving at
   `--rate` records/s on 2 partitions) while a server follows it; a client asks the server every
   2 ms (one keyed request per partition, the two taking turns) and notes when each checkpoint
   version first answers. The delay of a version is that moment minus the checkpoint's
   `written_at` (the worker's clock, the same host): the median and the 99th percentile.
2. Cost: a worker processes a backlog of `--backlog` records (`--checkpoint-interval 1`) with 0,
   then 4 servers following its group, taking turns `--rounds` times; the worker's records/s
   (its summary's processing rate) with 4 against 0.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import exit_on_sigterm  # noqa: E402
from serving_http import payment  # noqa: E402

OPTIONS = ["--features", "*", "--label-field", "is_fraud", "--id-field", "transaction_id",
           "--scale"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def argv(kind: str, bootstrap: str, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "connectors.cli", kind, "--bootstrap-servers", bootstrap,
            "--topic", name, "--group-id", f"{name}.group", "--checkpoint-topic",
            f"{name}.checkpoints", "--predictions-topic", f"{name}.predictions",
            "--metrics-topic", f"{name}.metrics", "--dead-letter-topic", f"{name}.dead",
            "--checkpoint-interval", "1", *OPTIONS, *extra]


def start(command: list[str], log: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_live(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


def freshness(bootstrap: str, seconds: float, rate: int, folder: pathlib.Path) -> list[float]:
    from kafka import KafkaProducer

    from connectors.kafka.broker import create_topics

    name = f"fresh-{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, [name], partitions=2)
    worker = start(argv("kafka", bootstrap, name, "--max-poll-records", "500"),
                   folder / "worker.log")
    port = free_port()
    server = start(argv("serve", bootstrap, name, "--serve-port", str(port), "--serve-host",
                        "127.0.0.1"), folder / "serve.log")
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    rng = random.Random(3)
    keys = [b"card-0", b"card-2"]  # (partitions 0 and 1 of 2 under murmur2)
    seen: dict[str, float] = {}
    written: dict[str, float] = {}
    done = threading.Event()

    def ask() -> None:
        body = {"inputs": [{"name": "record", "datatype": "BYTES", "shape": [1],
                            "data": [json.dumps(payment(rng, 0, labelled=False))]}]}
        turn = 0
        while not done.is_set():
            body["parameters"] = {"key": keys[turn % 2].decode()}
            turn += 1
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v2/models/{name}.group/infer",
                json.dumps(body).encode(), method="POST")
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    answer = json.loads(response.read())
                now = time.time()
                version = answer["model_version"]
                if version not in seen:
                    seen[version] = now
                    written[version] = answer["parameters"]["written_at"]
            except OSError:
                pass
            time.sleep(0.002)

    try:
        wait_live(port)
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        started = time.monotonic()
        i = 0
        while time.monotonic() - started < seconds:
            for _ in range(rate // 10):
                producer.send(name, json.dumps(payment(rng, i)).encode(), key=keys[i % 2])
                i += 1
            producer.flush()
            time.sleep(0.1)
        time.sleep(2)
        done.set()
        asker.join(5)
    finally:
        producer.close()
        stop(server)
        stop(worker)
    # The first version of each model was loaded at the server's start (a backlog): left out.
    delays = sorted(seen[v] - written[v] for v in seen)
    return delays[2:]


def worker_rate(bootstrap: str, backlog: int, replicas: int, folder: pathlib.Path) -> float:
    from kafka import KafkaProducer

    from connectors.kafka.broker import create_topics

    name = f"cost-{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, [name], partitions=2)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20)
    rng = random.Random(9)
    for i in range(backlog):
        producer.send(name, json.dumps(payment(rng, i)).encode(), key=b"k%d" % (i % 64))
    producer.flush()
    producer.close()
    servers = []
    for r in range(replicas):
        port = free_port()
        servers.append(start(argv("serve", bootstrap, name, "--serve-port", str(port),
                                  "--serve-host", "127.0.0.1"), folder / f"serve{r}.log"))
        wait_live(port)
    try:
        log = folder / f"worker-{replicas}.log"
        done = subprocess.run(argv("kafka", bootstrap, name, "--idle-timeout", "2"),
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        log.write_text(done.stderr)
        summary = json.loads(done.stderr.strip().splitlines()[-1])
    finally:
        for server in servers:
            stop(server)
    return summary["records_per_s"]


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=2_000)
    parser.add_argument("--backlog", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--skip", choices=["freshness", "cost"], default=None)
    args = parser.parse_args()
    from connectors.kafka.broker import make_broker

    folder = pathlib.Path(tempfile.mkdtemp(prefix="serving-freshness-"))
    with make_broker("apache-kafka", log_path=folder / "broker.log") as broker:
        bootstrap = broker.bootstrap_servers
        if args.skip != "freshness":
            delays = freshness(bootstrap, args.seconds, args.rate, folder)
            q = statistics.quantiles(delays, n=100)
            print(f"freshness: {len(delays)} checkpoints written every 1 s a partition "
                  f"(--checkpoint-interval 1), {args.rate} records/s: write -> first answer "
                  f"median {statistics.median(delays) * 1000:.0f} ms, p99 {q[98] * 1000:.0f} "
                  f"ms, max {max(delays) * 1000:.0f} ms", flush=True)
        if args.skip != "cost":
            rates: dict[int, list[float]] = {0: [], args.replicas: []}
            for round_ in range(args.rounds):
                for replicas in rates:
                    rate = worker_rate(bootstrap, args.backlog, replicas, folder)
                    rates[replicas].append(rate)
                    print(f"round {round_ + 1}: {replicas} servers following: worker "
                          f"{rate:,.0f} records/s", flush=True)
            alone = statistics.median(rates[0])
            followed = statistics.median(rates[args.replicas])
            ratios = [f / a for a, f in zip(rates[0], rates[args.replicas])]
            print(f"\n| servers following | worker records/s (median of {args.rounds}) | "
                  "ratio |\n| ---: | ---: | ---: |")
            print(f"| 0 | {alone:,.0f} | 1.00x |")
            print(f"| {args.replicas} | {followed:,.0f} | {followed / alone:.2f}x "
                  f"(rounds {min(ratios):.2f}x-{max(ratios):.2f}x) |")


if __name__ == "__main__":
    main()
