"""Topics as they are: the worker's records/s on each input format, against the JSON envelope
and against a Quix Streams app reading the same Avro topic, in one run (issue 36's targets).

One broker (Apache Kafka by default) and one Schema Registry (Apicurio Registry, Confluent's API)
for the run. The same `--records` events of River's Hyperplane generator (10 features, keyed,
`--partitions` partitions) are written to one topic per format, the registry formats by
confluent-kafka's serializers:

- ``envelope``: `{"id", "x": {...10 features}, "y"}`, the worker's defaults;
- ``envelope-categories``: the envelope with two string features more (`country`, `channel`),
  one-hot (the same events as `json-flat`, `avro-categories`);
- ``json-flat``: the same as a flat object with the two string fields, one-hot:
  `--features '*'`;
- ``avro``: the envelope's events as an Avro record (the 10 features, id and label as fields),
  `--value-format avro --features '*'`;
- ``avro-categories``: `avro` with the two categorical fields (Avro enums);
- ``quix-avro``: a Quix Streams 3.28 app (`AvroDeserializer` with its Schema Registry client,
  `app.dataframe(...).apply(...)`, `to_topic`) running River's `StandardScaler | ALMAClassifier`
  on the `avro` topic, one prediction per input, as benchmarks/kafka_throughput.py's `quix`.

Every worker runs `streammargin kafka --model alma --scale` (kafka-python, at-least-once), with
`--http-port`: at its last prediction the harness reads its Schema Registry requests from
/metrics (one per schema id, whatever the record count). The contenders take turns, `--rounds`
times in a rotating order; records/s is first to last prediction (as in kafka_throughput.py),
and the ratios are each round's, their median printed.

Run: .venv/bin/python benchmarks/record_formats.py [--records 100000] [--rounds 3]
     [--partitions 2] [--broker apache-kafka|tansu]
(`make bench` installs Quix Streams.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import common  # noqa: E402
import kafka_throughput as kt  # noqa: E402

FEATURES = [f"f{i}" for i in range(10)]
COUNTRIES = ["BR", "FR", "US", "IN"]
CHANNELS = ["online", "pos", "atm"]
CONTENDERS = ("envelope", "envelope-categories", "json-flat", "avro", "avro-categories",
              "quix-avro")
TOPIC_OF = {"envelope": "envelope", "envelope-categories": "envelope-categories",
            "json-flat": "json-flat", "avro": "avro", "avro-categories": "avro-categories",
            "quix-avro": "avro"}


def avro_schema(categories: bool) -> dict:
    fields = [{"name": "id", "type": "string"}]
    fields += [{"name": name, "type": "double"} for name in FEATURES]
    if categories:
        fields += [{"name": "country", "type": {"type": "enum", "name": "Country",
                                                "symbols": COUNTRIES}},
                   {"name": "channel", "type": {"type": "enum", "name": "Channel",
                                                "symbols": CHANNELS}}]
    fields.append({"name": "y", "type": "boolean"})
    return {"type": "record", "name": "Event" + ("C" if categories else ""),
            "namespace": "bench", "fields": fields}


def make_events(n: int, seed: int = 1) -> list[dict]:
    from river.datasets import synth

    rng = random.Random(seed)
    events = []
    for i, (x, y) in enumerate(synth.Hyperplane(seed=seed, n_features=10).take(n)):
        events.append({"id": f"e{i}", **{f"f{k}": v for k, v in x.items()},
                       "country": rng.choice(COUNTRIES), "channel": rng.choice(CHANNELS),
                       "y": bool(y)})
    return events


def encode_topics(events: list[dict], registry_url: str) -> dict[str, list[tuple[bytes, bytes]]]:
    """(key, value) per topic: each format of the same events."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    plain = AvroSerializer(client, json.dumps(avro_schema(False)))
    with_categories = AvroSerializer(client, json.dumps(avro_schema(True)))
    numbers = [{k: e[k] for k in ("id", *FEATURES, "y")} for e in events]
    topics = {
        "envelope": [json.dumps({"id": e["id"], "x": {f: e[f] for f in FEATURES},
                                 "y": e["y"]}).encode() for e in events],
        "envelope-categories": [json.dumps({"id": e["id"], "x": {
            **{f: e[f] for f in FEATURES}, "country": e["country"], "channel": e["channel"]},
            "y": e["y"]}).encode() for e in events],
        "json-flat": [json.dumps(e).encode() for e in events],
        "avro": [plain(e, SerializationContext("avro", MessageField.VALUE)) for e in numbers],
        "avro-categories": [with_categories(e, SerializationContext(
            "avro-categories", MessageField.VALUE)) for e in events],
    }
    return {name: [(e["id"].encode(), value) for e, value in zip(events, values)]
            for name, values in topics.items()}


def run_quix_avro(bootstrap: str, topic: str, out: str, group: str, registry_url: str) -> None:
    """The Quix Streams app on the Avro topic (Quix's Avro deserializer and registry client)."""
    import atexit
    import shutil
    import tempfile

    from quixstreams import Application, message_context
    from quixstreams.models.serializers.avro import AvroDeserializer
    from quixstreams.models.serializers.schema_registry import SchemaRegistryClientConfig

    state_dir = tempfile.mkdtemp(prefix="quix-state-")
    atexit.register(shutil.rmtree, state_dir, True)
    app = Application(
        broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
        loglevel="WARNING", use_changelog_topics=False, state_dir=state_dir)
    deserializer = AvroDeserializer(
        schema_registry_client_config=SchemaRegistryClientConfig(url=registry_url))
    models: dict[int, object] = {}

    def predict_learn(event: dict) -> dict:
        context = message_context()
        model = models.get(context.partition)
        if model is None:
            model = models[context.partition] = kt.river_pipeline()
        x = {name: event[name] for name in FEATURES}
        y = event.get("y")
        y_pred = model.predict_one(x)
        p_true = model.predict_proba_one(x).get(True, 0.0)
        if y is not None:
            model.learn_one(x, y)
        return {"topic": context.topic, "partition": context.partition, "model": "alma",
                "offset": context.offset, "id": event.get("id"), "y_pred": y_pred,
                "p_true": p_true, "y": y}

    sdf = app.dataframe(app.topic(topic, value_deserializer=deserializer))
    sdf = sdf.apply(predict_learn)
    sdf.to_topic(app.topic(out, value_serializer="json"))
    app.run()


def command(name: str, bootstrap: str, topic: str, out: str, group: str, registry_url: str,
            port: int) -> list[str]:
    if name == "quix-avro":
        return [sys.executable, os.path.abspath(__file__), "--contender", name,
                "--bootstrap", bootstrap, "--topic", topic, "--out", out, "--group", group,
                "--registry", registry_url]
    options = {
        "envelope": [],
        "envelope-categories": [],
        "json-flat": ["--features", "*"],
        "avro": ["--value-format", "avro", "--features", "*",
                 "--schema-registry-url", registry_url],
        "avro-categories": ["--value-format", "avro", "--features", "*",
                            "--schema-registry-url", registry_url],
    }[name]
    return kt.worker_command(bootstrap, topic, out, group,
                             [*options, "--http-port", str(port), "--http-host", "127.0.0.1"])


def schema_requests(port: int) -> int | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        return None
    for line in text.decode().splitlines():
        if line.startswith('streammargin_schema_registry_requests_total{kind="schema"}'):
            return int(float(line.split()[-1]))
    return None


def run(name: str, bootstrap: str, registry_url: str, n: int, partitions: int,
        run_id: str) -> dict:
    from connectors.kafka.broker import create_topics, free_port

    out, group = f"out.{run_id}", f"group.{run_id}"
    create_topics(bootstrap, [out], partitions=partitions)
    watch = kt.OutputWatch(bootstrap, out, partitions, read_committed=False)
    port = free_port()
    process = subprocess.Popen(
        command(name, bootstrap, TOPIC_OF[name], out, group, registry_url, port),
        env={**os.environ, "PYTHONWARNINGS": "ignore"}, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = time.monotonic()
    first = last = None
    requests = None
    try:
        while True:
            count = watch.count(timeout=0.002)
            now = time.monotonic()
            if first is None and count > 0:
                first, count_first = now, count
                cpu_first = common.process_cpu(process.pid)
            if count >= n:
                last = now
                cpu_last = common.process_cpu(process.pid)
                peak = kt.peak_rss_kib(process.pid)
                if name != "quix-avro":
                    requests = schema_requests(port)
                break
            if now - started > kt.TIMEOUT_S or process.poll() is not None:
                raise RuntimeError(f"{name}: {count} of {n} predictions; "
                                   f"{process.stderr.read().decode()[-2000:]}")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(60)
        watch.close()
    after = n - count_first
    return {"rate": after / (last - first), "cpu_us": 1e6 * (cpu_last - cpu_first) / after,
            "peak_mib": peak / 1024, "schema_requests": requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--broker", choices=("apache-kafka", "tansu"), default=None)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--registry", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        common.exit_on_sigterm()
        run_quix_avro(args.bootstrap, args.topic, args.out, args.group, args.registry)
        return

    from connectors.kafka.broker import create_topics, make_broker
    from connectors.kafka.schema_registry_server import APICURIO_VERSION, ApicurioRegistry

    contenders = [c for c in args.contenders.split(",") if c]
    kind, fallback = kt.broker_kind(args.broker)
    with make_broker(kind) as broker, ApicurioRegistry() as registry:
        bootstrap = broker.bootstrap_servers
        print(f"broker: {kt.broker_description(broker)}" + (
            f" (Apache Kafka unavailable: {fallback})" if fallback else ""))
        print(f"schema registry: Apicurio Registry {APICURIO_VERSION} at {registry.url}")
        events = make_events(args.records)
        topics = encode_topics(events, registry.url)
        for topic, records in topics.items():
            create_topics(bootstrap, [topic], partitions=args.partitions)
            kt.produce(bootstrap, topic, records, args.partitions)
            print(f"topic {topic}: {args.records:,} records, "
                  f"{sum(len(v) for _, v in records) / args.records:.0f} bytes each")
        kt.warm_broker(bootstrap, "envelope")
        results: dict[str, list] = {c: [] for c in contenders}
        for round_index in range(args.rounds):
            order = contenders[round_index % len(contenders):] + \
                contenders[:round_index % len(contenders)]
            for name in order:
                row = run(name, bootstrap, registry.url, args.records, args.partitions,
                          f"{name}.{round_index}.{time.time_ns()}")
                results[name].append(row)
                print(f"round {round_index + 1} {name:16s} {row['rate']:9,.0f} records/s  "
                      f"{row['cpu_us']:6.1f} us CPU/record  {row['peak_mib']:5.0f} MiB  "
                      f"schema requests {row['schema_requests']}")

    print(f"\n{args.records:,} records, {args.partitions} partitions, {args.rounds} rounds "
          "(medians; ratios within each round)")
    print(f"{'contender':18s} {'records/s':>10s} {'CPU us/rec':>11s} {'peak MiB':>9s} "
          f"{'schema requests':>16s}")
    for name in contenders:
        rows = results[name]
        print(f"{name:18s} {statistics.median(r['rate'] for r in rows):10,.0f} "
              f"{statistics.median(r['cpu_us'] for r in rows):11.1f} "
              f"{statistics.median(r['peak_mib'] for r in rows):9.0f} "
              f"{str(sorted({r['schema_requests'] for r in rows})):>16s}")

    def ratio(a: str, b: str) -> str:
        if a not in results or b not in results:
            return "-"
        values = [x["rate"] / y["rate"] for x, y in zip(results[a], results[b])]
        return (f"{statistics.median(values):.2f}x "
                f"({min(values):.2f}x-{max(values):.2f}x)")

    print("\ntargets")
    print(f"  avro / envelope (same events)             {ratio('avro', 'envelope'):>24s}"
          "   target >= 1.0x")
    print(f"  json-flat, one-hot / envelope             {ratio('json-flat', 'envelope'):>24s}"
          "   target >= 0.9x")
    print(f"  json-flat / envelope-categories (same)    "
          f"{ratio('json-flat', 'envelope-categories'):>24s}")
    print(f"  avro-categories / envelope                "
          f"{ratio('avro-categories', 'envelope'):>24s}")
    print(f"  avro / quix-avro                          {ratio('avro', 'quix-avro'):>24s}"
          "   target >= 2x")
    print("  schema requests per worker: one per schema id (the column above)")


if __name__ == "__main__":
    main()
