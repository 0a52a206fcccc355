"""`streammargin serve` against Apache Kafka (the session broker) and a worker process, through
`tritonclient.http`, a client of the Open Inference Protocol this project did not write.

One worker run serves every assertion of the long test (lean: the CI's 15 minutes): health,
metadata, both input forms, Triton's binary tensors, keyed requests answered by the model of the
key's partition, the worker's own probabilities for the same records and checkpoint, a new
checkpoint changing the answer while a pinned version answers as before, a corrupt checkpoint
refused, a SIGKILLed worker and a frozen broker leaving the server serving. A second test: two
workers in topic scope, and the server answering with their shared model.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import numpy as np
import pytest

pytestmark = pytest.mark.kafka

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL_OPTIONS = ["--features", "*", "--label-field", "is_fraud", "--id-field", "transaction_id",
                 "--scale"]


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def payment(rng: random.Random, i: int, labelled: bool = True) -> dict:
    record = {"transaction_id": f"t{i}", "amount": round(rng.lognormvariate(3, 1), 2),
              "country": rng.choice(["BR", "FR", "US"]), "card_present": rng.random() < 0.6,
              "risk": round(rng.random(), 3)}
    if labelled:
        record["is_fraud"] = record["amount"] > 40 and record["risk"] > 0.5
    return record


def produce(bootstrap: str, topic: str, items: list[tuple[bytes, dict]]) -> None:
    """Keyed records, partitioned by kafka-python's default partitioner (murmur2, Java's)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for key, value in items:
        producer.send(topic, json.dumps(value).encode(), key=key)
    producer.flush()
    producer.close()


def read_all(bootstrap: str, topic: str) -> list:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=20)
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    ends = consumer.end_offsets(partitions)
    records = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(consumer.position(tp) < ends[tp]
                                              for tp in partitions):
        for batch in consumer.poll(timeout_ms=200).values():
            records.extend(batch)
    consumer.close()
    return records


def wait_for(condition, timeout: float, what: str, log: pathlib.Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    tail = "" if log is None or not log.exists() else (
        f"; the end of {log.name}:\n" + log.read_text(errors="replace")[-3000:])
    raise AssertionError(f"timed out waiting for {what}{tail}")


def command(kind: str, bootstrap: str, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "connectors.cli", kind, "--bootstrap-servers", bootstrap,
            "--topic", name, "--group-id", f"{name}.group", "--checkpoint-topic",
            f"{name}.checkpoints", "--predictions-topic", f"{name}.predictions",
            "--metrics-topic", f"{name}.metrics", "--dead-letter-topic", f"{name}.dead",
            *MODEL_OPTIONS, *extra]


def start(argv: list[str], log: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def infer_records(client, model: str, records: list[dict], keys: list[bytes] | None,
                  version: str = "", binary: bool = False):
    from tritonclient.http import InferInput, InferRequestedOutput

    inputs = [InferInput("record", [len(records)], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([json.dumps(r).encode() for r in records],
                                           dtype=np.object_), binary_data=binary)
    if keys is not None:
        inputs.append(InferInput("key", [len(keys)], "BYTES"))
        inputs[1].set_data_from_numpy(np.array(keys, dtype=np.object_), binary_data=binary)
    outputs = [InferRequestedOutput("predict", binary_data=binary),
               InferRequestedOutput("predict_proba", binary_data=binary)]
    return client.infer(model, inputs, model_version=version, outputs=outputs)


def test_a_server_answers_with_the_workers_models_fresh_and_serves_on(kafka_broker, tmp_path):
    import tritonclient.http as triton

    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("serve")
    from connectors.kafka.broker import create_topics

    create_topics(bootstrap, [name], partitions=2)
    rng = random.Random(5)
    keys = [f"card-{i}".encode() for i in range(16)]
    produce(bootstrap, name, [(keys[i % 16], payment(rng, i)) for i in range(2_000)])
    group = f"{name}.group"
    worker = start(command("kafka", bootstrap, name, "--checkpoint-interval", "1",
                           "--checkpoint-every", "50000", "--session-timeout-ms", "6000",
                           "--heartbeat-interval-ms", "1000"), tmp_path / "worker.log")
    port = free_port()
    server = start(command("serve", bootstrap, name, "--serve-port", str(port),
                           "--serve-host", "127.0.0.1", "--max-model-age", "4",
                           "--checkpoint-interval", "1"), tmp_path / "serve.log")
    url = f"127.0.0.1:{port}"
    client = triton.InferenceServerClient(url)
    try:
        # Liveness, then readiness once both partitions' models learnt the whole backlog.
        # (a start on a loaded CI machine of two cores: the imports, then uvicorn)
        wait_for(lambda: _alive(client), 120, "the server to answer", tmp_path / "serve.log")

        def caught_up():
            status, metadata = get(f"http://{url}/v2/models/{group}")
            models = metadata.get("parameters", {}).get("models", []) if status == 200 else []
            return len(models) == 2 and sum(m["next_offset"] for m in models) == 2_000 and models

        wait_for(caught_up, 90, "both partitions' checkpoints of the backlog")
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(group)
        metadata = client.get_model_metadata(group)
        assert metadata["name"] == group and len(metadata["versions"]) >= 2
        assert [o["name"] for o in metadata["outputs"]] == ["predict", "predict_proba"]
        assert metadata["parameters"]["classes"] == [False, True]
        assert client.get_server_metadata()["name"] == "streammargin"

        # The worker's own probabilities: unlabelled records (nothing learnt from them).
        unlabelled = [(keys[i % 16], payment(rng, 10_000 + i, labelled=False))
                      for i in range(40)]
        produce(bootstrap, name, unlabelled)
        predictions = wait_for(
            lambda: [p for p in (json.loads(r.value) for r in read_all(
                bootstrap, f"{name}.predictions")) if p["id"].startswith("t1")]
            if len(read_all(bootstrap, f"{name}.predictions")) >= 2_040 else None,
            60, "the worker's predictions of the unlabelled records")
        by_id = {p["id"]: p for p in predictions}
        # The checkpoints after them served (they move the input offsets, not the models): a
        # new version below comes of the records learnt then, not of these.
        wait_for(lambda: (lambda status, metadata: status == 200 and sum(
            m["next_offset"] for m in metadata["parameters"]["models"]) == 2_040)(
                *get(f"http://{url}/v2/models/{group}")), 60,
            "the checkpoints after the unlabelled records")
        records = [r for _, r in unlabelled]
        record_keys = [k for k, _ in unlabelled]
        for binary in (False, True):
            answer = infer_records(client, group, records, record_keys, binary=binary)
            proba = answer.as_numpy("predict_proba")
            assert proba.shape == (40, 2)
            for i, record in enumerate(records):
                written = by_id[record["transaction_id"]]
                assert proba[i, 1] == written["p_true"]  # exactly the worker's
                assert bool(answer.as_numpy("predict")[i]) == written["y_pred"]
        response = answer.get_response()
        # Keyed: each record answered by the model of the partition its key went to.
        assert sorted(response["parameters"]["partitions"]) == [0, 1]
        assert response["parameters"]["routed_by"] == "key"
        for key, record in unlabelled[:4]:
            one = infer_records(client, group, [record], [key]).get_response()
            assert one["parameters"]["partitions"] == [by_id[record["transaction_id"]][
                "partition"]]
        # A table of the same fields gets the same answers.
        table = _table(records[:5])
        status, body = _post(url, group, {"inputs": table, "parameters": {"key": "card-3"}})
        assert status == 200 and body["parameters"]["routed_by"] == "key"

        # A new checkpoint changes the version and the answer; a pinned version does not.
        probe = records[0]
        key = record_keys[0]
        partition = by_id[probe["transaction_id"]]["partition"]
        before = infer_records(client, group, [probe], [key])
        old = before.get_response()["model_version"]
        produce(bootstrap, name, [(key, payment(rng, 20_000 + i)) for i in range(300)])
        after = wait_for(lambda: _changed(client, group, probe, key, old), 60, "a new version")
        assert after.as_numpy("predict_proba")[0, 1] != before.as_numpy("predict_proba")[0, 1]
        pinned = infer_records(client, group, [probe], [key], version=old)
        assert pinned.get_response()["model_version"] == old
        assert pinned.as_numpy("predict_proba")[0, 1] == before.as_numpy("predict_proba")[0, 1]

        # A corrupt checkpoint is refused, and the model before it serves on.
        from kafka import KafkaProducer

        from connectors.state.checkpoint import checkpoint_key, frame_inline

        serving = after.get_response()["model_version"]
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        producer.send(f"{name}.checkpoints", frame_inline(b"\x00not a checkpoint" * 8),
                      key=checkpoint_key(group, name, partition))
        producer.flush()
        producer.close()
        wait_for(lambda: 'outcome="refused"} 1.0' in _metrics(url), 30, "the refusal")
        assert infer_records(client, group, [probe], [key]).get_response()[
            "model_version"] == serving

        # A SIGKILLed worker: the server answers on; readiness goes once the model ages.
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        assert infer_records(client, group, [probe], [key]).get_response()[
            "model_version"] == serving
        wait_for(lambda: not client.is_server_ready(), 20, "readiness to go with the model's age")
        assert get(f"http://{url}/v2/health/ready")[0] == 400

        # A frozen broker: the server answers on.
        kafka_broker.pause()
        try:
            frozen = time.monotonic()
            answered = 0
            while time.monotonic() - frozen < 1.5:
                answered += infer_records(client, group, [probe], [key]).as_numpy(
                    "predict").shape[0]
        finally:
            kafka_broker.resume()
        assert answered > 10
        assert "streammargin_serve_request_duration_seconds_bucket" in _metrics(url)
    finally:
        client.close()
        for process in (worker, server):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, log in ((worker, "worker.log"), (server, "serve.log")):
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                pytest.fail(f"{log} did not exit:\n{(tmp_path / log).read_text()[-3000:]}")
    assert server.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]

    # Options that contradict the checkpoints: one line, exit 2.
    wrong = subprocess.run(command("serve", bootstrap, name, "--model", "mpu", "--serve-port",
                                   str(free_port()), "--serve-host", "127.0.0.1"),
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    lines = [line for line in wrong.stderr.splitlines() if "ERROR" in line]
    assert len(lines) == 1 and "contradicts the options" in lines[0], wrong.stderr[-2000:]
    assert "not the MPUClassifier of --model mpu" in lines[0]


def _alive(client) -> bool:
    try:
        return client.is_server_live()
    except Exception:
        return False


def _changed(client, group: str, record: dict, key: bytes, old: str):
    answer = infer_records(client, group, [record], [key])
    return answer if answer.get_response()["model_version"] != old else None


def _table(records: list[dict]) -> list[dict]:
    types = {bool: "BOOL", str: "BYTES", float: "FP64", int: "INT64"}
    fields = [f for f in records[0] if f != "transaction_id"]
    return [{"name": f, "datatype": types[type(records[0][f])], "shape": [len(records)],
             "data": [r[f] for r in records]} for f in fields]


def _post(url: str, model: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/infer",
                                     json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=5) as response:
        return response.read().decode()


def test_topic_scope_serves_the_workers_shared_model(kafka_broker, tmp_path):
    """Two workers in topic scope share one model through the model topic; `streammargin serve`
    with the same options answers with it: its `model_version` is the newest checkpoint of the
    topic's partitions, and its probabilities are the worker's own for the same records."""
    import tritonclient.http as triton

    from connectors.kafka.broker import create_topics
    from connectors.serving.partitioner import partition_of
    from connectors.state.checkpoint import CheckpointStore, LoadedCheckpoint

    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("servetopic")
    group = f"{name}.group"
    create_topics(bootstrap, [name], partitions=3)
    # (exchanges every 100 records whatever they cost: the stream is short)
    scope = ["--model-scope", "topic", "--model-topic", f"{name}.models", "--mix-every", "100",
             "--max-model-bytes-share", "none", "--max-exchange-cpu-share", "none"]
    workers = [start(command("kafka", bootstrap, name, *scope, "--checkpoint-interval", "1",
                             "--checkpoint-every", "50000", "--session-timeout-ms", "6000",
                             "--heartbeat-interval-ms", "1000"), tmp_path / f"worker{i}.log")
               for i in range(2)]
    port = free_port()
    server = None
    url = f"127.0.0.1:{port}"
    client = triton.InferenceServerClient(url)
    store = CheckpointStore(bootstrap, f"{name}.checkpoints", group, read_only=True)

    def newest() -> int | None:
        """The offset of the newest checkpoint of the topic's partitions, read here."""
        found = store.load([(name, p) for p in range(3)])
        offsets = [c.offset for c in found.values() if isinstance(c, LoadedCheckpoint)]
        return max(offsets, default=None)

    def served() -> dict | None:
        status, metadata = get(f"http://{url}/v2/models/{group}")
        models = metadata.get("parameters", {}).get("models", []) if status == 200 else []
        assert len(models) <= 1, models  # one model of the topic
        return models[0] if models else None

    def settled(after: int = -1):
        """The served model, once it is the newest checkpoint (written after `after`) and has
        stayed so for three seconds: the workers are idle."""
        latest = newest()
        model = served()
        if latest is None or latest <= after or model is None or model["version"] != str(latest):
            return None
        time.sleep(3)
        return model if newest() == latest and served() == model else None

    try:
        # Both workers own partitions before the stream comes, so that both learn and exchange.
        wait_for(lambda: all(f"assigned {name}/" in (tmp_path / f"worker{i}.log").read_text()
                             for i in range(2)), 120, "both workers' assignments",
                 tmp_path / "worker1.log")
        rng = random.Random(7)
        produce(bootstrap, name, [(f"card-{i % 30}".encode(), payment(rng, i))
                                  for i in range(3_000)])
        wait_for(lambda: len(read_all(bootstrap, f"{name}.predictions")) >= 3_000, 120,
                 "the workers' predictions of the stream", tmp_path / "worker0.log")
        # The workers exchanged their models: each wrote its own to the model topic.
        assert len({r.key for r in read_all(bootstrap, f"{name}.models")}) >= 2
        # The server starts now: its first read finds every partition's checkpoint at once, and
        # must pick the newest (it does not depend on the order it saw them written in).
        server = start(command("serve", bootstrap, name, *scope, "--serve-port", str(port),
                               "--serve-host", "127.0.0.1"), tmp_path / "serve.log")
        wait_for(lambda: _alive(client), 120, "the server to answer", tmp_path / "serve.log")
        first = wait_for(settled, 90, "the server to serve the newest checkpoint",
                         tmp_path / "serve.log")
        metadata = client.get_model_metadata(group)
        assert metadata["parameters"]["model_scope"] == "topic"

        # Unlabelled records (nothing learnt) of partition 0 only, scored by its worker with its
        # shared model. First --mix-every of them: they make that worker exchange, and so take
        # in whatever its peer published after its last exchange (its peer, idle now, publishes
        # nothing more). Then twenty more: no exchange brings anything new while they are
        # scored, so the checkpoint written after them holds the model that scored them.
        keys = [k for k in (f"card-{i}".encode() for i in range(200))
                if partition_of(k, 3) == 0][:20]
        flush = [(keys[i % 20], payment(rng, 10_000 + i, labelled=False)) for i in range(100)]
        unlabelled = [(key, payment(rng, 20_000 + i, labelled=False))
                      for i, key in enumerate(keys)]

        def predictions(first_id: int, n: int):
            found = {p["id"]: p for p in (json.loads(r.value) for r in read_all(
                bootstrap, f"{name}.predictions")) if first_id <= int(p["id"][1:]) < first_id + n}
            return found if len(found) == n else None

        produce(bootstrap, name, flush)
        wait_for(lambda: predictions(10_000, 100), 60, "the worker's predictions of the first "
                 "unlabelled records")
        first = wait_for(lambda: settled(int(first["version"])), 60,
                         "the checkpoint written after the first unlabelled records")
        produce(bootstrap, name, unlabelled)
        by_id = wait_for(lambda: predictions(20_000, 20), 60,
                         "the worker's predictions of the unlabelled records")
        assert {p["partition"] for p in by_id.values()} == {0}
        model = wait_for(lambda: settled(int(first["version"])), 60,
                         "the checkpoint written after the unlabelled records")
        records = [r for _, r in unlabelled]
        answer = infer_records(client, group, records, [k for k, _ in unlabelled])
        response = answer.get_response()
        assert response["model_version"] == model["version"] == str(newest())
        assert response["parameters"]["routed_by"] == "topic"
        proba = answer.as_numpy("predict_proba")
        for i, record in enumerate(records):
            written = by_id[record["transaction_id"]]
            assert proba[i, 1] == written["p_true"]  # exactly the worker's shared model's
            assert bool(answer.as_numpy("predict")[i]) == written["y_pred"]
        # Without a key, or with any key, a row gets the same one model.
        unkeyed = infer_records(client, group, records, None)
        assert unkeyed.get_response()["model_version"] == model["version"]
        assert (unkeyed.as_numpy("predict_proba") == proba).all()
    finally:
        client.close()
        store.close()
        processes = [p for p in (*workers, server) if p is not None]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
    assert server is not None and server.returncode == 0, (
        tmp_path / "serve.log").read_text()[-3000:]
    # Each worker mixed its peer's model into its own: the model served was the shared one.
    for i in range(2):
        summary = json.loads((tmp_path / f"worker{i}.log").read_text().splitlines()[-1])
        assert summary["model_scope"]["peer_models"] >= 1, summary
