"""Operating a worker on the session's broker (tests/conftest.py): /metrics, /healthz and
/readyz read with a real HTTP client while the worker runs (in a thread, or as
`streammargin kafka` in a subprocess), series that follow partitions across a restore and a
rebalance, and JSON log lines.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from connectors.kafka.broker import create_topics
from connectors.observability.observability import EndpointServer
from connectors.worker.worker import Worker, WorkerConfig

pytestmark = pytest.mark.kafka

ROOT = pathlib.Path(__file__).resolve().parents[1]
# A rebalance after a member leaves or dies takes up to the session timeout (on any broker), and
# Tansu holds a new member's join for half of it (tests/test_broker_behaviour.py).
FAST_GROUP = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, items) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
    for partition, value in items:
        # A tombstone (null value) needs a key.
        producer.send(topic, value, key=None if value is not None else b"k", partition=partition)
    producer.flush()
    producer.close()


def event(i: int, y: bool | None = None) -> bytes:
    doc = {"id": i, "x": {"a": (i * 7 % 11) / 11, "b": (i * 3 % 5) / 5}}
    if y is not None:
        doc["y"] = y
    return json.dumps(doc).encode()


def labelled(i: int) -> bytes:
    return event(i, (i * 7 % 11) / 11 > (i * 3 % 5) / 5)


def config(bootstrap: str, name: str, **options) -> WorkerConfig:
    settings = {
        "topics": [name],
        "bootstrap_servers": bootstrap,
        "group_id": f"{name}.group",
        "predictions_topic": f"{name}.predictions",
        "metrics_topic": f"{name}.metrics",
        "dead_letter_topic": f"{name}.dead",
        "checkpoint_topic": f"{name}.checkpoints",
        "checkpoint_interval": None,
        **FAST_GROUP,
        **options,
    }
    return WorkerConfig(**settings)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics, parsed by prometheus-client's own parser."""
    code, text = get(url + "/metrics")
    assert code == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def per_partition(samples: dict, name: str, **labels) -> dict[int, float]:
    wanted = {(k, str(v)) for k, v in labels.items()}
    return {int(dict(key)["partition"]): value for (sample, key), value in samples.items()
            if sample == name and wanted <= key}


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Running:
    """A worker in a thread with its endpoints on a free port."""

    def __init__(self, cfg: WorkerConfig):
        self.worker = Worker(cfg)
        self.server = EndpointServer(self.worker.status, "127.0.0.1", 0, liveness_timeout=30)
        self.url = self.server.url
        self.stop_event = threading.Event()
        self.result: list = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.result.append(self.worker.run(stop_event=self.stop_event))
        except BaseException as error:  # shown by stop()
            self.result.append(error)

    def start(self) -> Running:
        self.thread.start()
        return self

    def stop(self) -> dict:
        self.stop_event.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        [result] = self.result
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(60)
        self.server.close()


BAD = {0: [b"{not json", b"[1, 2]"], 1: [b'{"x": ["high"]}', b'{"x": {"a": 1}, "y": 7}', None]}


def test_metrics_and_probes_of_a_running_worker(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("ops")
    create_topics(bootstrap, [name], partitions=2)
    good = {0: 400, 1: 250}
    items = [(p, labelled(i)) for p in (0, 1) for i in range(good[p])]
    items += [(p, value) for p, values in BAD.items() for value in values]
    items += [(1, event(10_000))]  # waits for a label that never comes
    produce(bootstrap, name, items)
    expected = {p: good[p] + len(BAD[p]) + (p == 1) for p in (0, 1)}

    running = Running(config(bootstrap, name, metrics_every=100))
    try:
        url = running.url
        assert get(url + "/readyz") == (503, "starting: connecting to the brokers\n")
        assert get(url + "/healthz")[0] == 200
        running.start()
        readiness = []

        def ready():
            readiness.append(get(url + "/readyz")[0])
            return readiness[-1] == 200

        wait_for(ready, 30, "/readyz 200")
        assert readiness[0] == 503  # joining and restoring came first
        # Ready means restored: both partitions have their series.
        assert set(per_partition(scrape(url), "streammargin_records_total")) == {0, 1}

        def processed():
            samples = scrape(url)
            return per_partition(samples, "streammargin_records_total") == expected and samples

        samples = wait_for(processed, 30, f"records {expected} in /metrics")
        at = {"group": f"{name}.group", "topic": name}
        assert per_partition(samples, "streammargin_predictions_total", **at) == {
            0: good[0], 1: good[1] + 1}
        assert per_partition(samples, "streammargin_labelled_total", **at) == good
        assert per_partition(samples, "streammargin_model_records", **at) == expected
        dead = {(p, dict(key)["reason"]): value for (sample, key), value in samples.items()
                if sample == "streammargin_dead_letters_total" and value
                for p in [int(dict(key)["partition"])]}
        assert dead == {(0, "bad_json"): 1, (0, "not_an_object"): 1, (1, "bad_features"): 1,
                        (1, "unknown_label"): 1, (1, "null_value"): 1}
        assert per_partition(samples, "streammargin_pending_labels", **at) == {0: 0, 1: 1}
        assert per_partition(samples, "streammargin_next_offset", **at) == expected
        assert per_partition(samples, "streammargin_consumer_lag_records", **at) == {0: 0, 1: 0}
        assert per_partition(samples, "streammargin_uncheckpointed_records", **at) == expected
        assert samples[("streammargin_ready", frozenset())] == 1
        assert samples[("streammargin_assigned_partitions", frozenset())] == 2
        assert get(url + "/healthz")[0] == 200
        accuracy = per_partition(samples, "streammargin_accuracy", **at)

        summary = running.stop()
        # The final metrics records of the worker say the same.
        for p in (0, 1):
            final = summary["partitions"][f"{name}/{p}"]
            assert final["records"] == expected[p] and final["accuracy"] == accuracy[p]
        assert get(url + "/readyz") == (503, "stopped\n")
        assert get(url + "/healthz") == (503, "stopped\n")
        samples = scrape(url)
        assert samples[("streammargin_checkpoints_written_total", frozenset())] == 2
        assert samples[("streammargin_checkpoint_duration_seconds_count", frozenset())] == 1
        # It left the group: it owns no partition, and shows none.
        assert per_partition(samples, "streammargin_records_total") == {}
        assert samples[("streammargin_assigned_partitions", frozenset())] == 0
        assert samples[("streammargin_ready", frozenset())] == 0
    finally:
        running.close()


def test_series_follow_the_partitions_through_a_restore_and_a_rebalance(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("opsmove")
    create_topics(bootstrap, [name], partitions=2)
    produce(bootstrap, name, [(i % 2, labelled(i)) for i in range(600)])
    cfg = config(bootstrap, name)
    first = Running(cfg).start()
    try:
        wait_for(lambda: per_partition(scrape(first.url), "streammargin_records_total") == {
            0: 300, 1: 300}, 30, "the first worker's 600 records")
        first.stop()
    finally:
        first.close()

    # A new worker restores both partitions: its counters start at zero, the model's totals go on.
    restored = Running(cfg).start()
    mover = None
    try:
        wait_for(lambda: get(restored.url + "/readyz")[0] == 200, 30, "the restore")
        samples = scrape(restored.url)
        assert per_partition(samples, "streammargin_records_total") == {0: 0, 1: 0}
        assert per_partition(samples, "streammargin_model_records") == {0: 300, 1: 300}
        sizes = per_partition(samples, "streammargin_checkpoint_bytes")
        assert set(sizes) == {0, 1} and min(sizes.values()) > 1000
        produce(bootstrap, name, [(i % 2, labelled(i)) for i in range(600, 640)])
        wait_for(lambda: per_partition(scrape(restored.url), "streammargin_records_total") == {
            0: 20, 1: 20}, 30, "20 new records per partition")

        # A second member takes one partition: its series leave the first worker's /metrics.
        mover = Running(cfg).start()

        def split():
            mine = per_partition(scrape(restored.url), "streammargin_model_records")
            theirs = per_partition(scrape(mover.url), "streammargin_model_records")
            ready = (get(restored.url + "/readyz")[0], get(mover.url + "/readyz")[0])
            return (len(mine) == len(theirs) == 1 and ready == (200, 200)
                    and (mine, theirs))

        mine, theirs = wait_for(split, 60, "the rebalance")
        assert set(mine) | set(theirs) == {0, 1}
        assert mine.popitem()[1] == theirs.popitem()[1] == 320
        samples = scrape(restored.url)
        moved = next(iter(per_partition(scrape(mover.url), "streammargin_records_total")))
        assert all(dict(key).get("partition") != str(moved) for _, key in samples)
        assert samples[("streammargin_rebalances_total", frozenset())] >= 2
        mover.stop()
        restored.stop()
    finally:
        restored.close()
        if mover is not None:
            mover.close()


def test_the_command_serves_its_endpoints_and_writes_json_log_lines(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    name = fresh("opscmd")
    create_topics(bootstrap, [name], partitions=1)
    produce(bootstrap, name, [(0, labelled(i)) for i in range(250)] + [(0, b"{bad")])
    log_path = tmp_path / "worker.log"
    argv = [
        sys.executable, "-m", "connectors.cli", "kafka", "--bootstrap-servers", bootstrap,
        "--topic", name, "--group-id", f"{name}.group",
        "--predictions-topic", f"{name}.predictions", "--metrics-topic", f"{name}.metrics",
        "--dead-letter-topic", f"{name}.dead", "--checkpoint-topic", f"{name}.checkpoints",
        "--session-timeout-ms", "2000", "--heartbeat-interval-ms", "500",
        "--metrics-every", "100", "--http-port", "0", "--http-host", "127.0.0.1",
        "--log-format", "json",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        def port():
            for line in log_path.read_text().splitlines():
                doc = json.loads(line)
                if "http_port" in doc:
                    return doc["http_port"]
            return None

        url = f"http://127.0.0.1:{wait_for(port, 30, 'the serving line')}"
        wait_for(lambda: get(url + "/readyz")[0] == 200, 30, "/readyz 200")
        wait_for(lambda: per_partition(scrape(url), "streammargin_records_total") == {0: 251},
                 30, "251 records in /metrics")
        assert get(url + "/healthz")[0] == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = log_path.read_text().splitlines()
    docs = [json.loads(line) for line in lines]  # every line is one JSON object
    for doc in docs:
        assert {"time", "level", "logger", "message"} <= doc.keys()
        assert doc["time"].endswith("Z")
    [serving] = [d for d in docs if "http_port" in d]
    assert serving["http_host"] == "127.0.0.1" and url.endswith(str(serving["http_port"]))
    [assigned] = [d for d in docs if d["message"].startswith("assigned")]
    assert assigned["partitions"] == [f"{name}/0"] and assigned["restored"] == 0
    periodic = [d for d in docs if d.get("event") == "periodic"]
    assert [(d["topic"], d["partition"], d["offset"], d["records"]) for d in periodic] == [
        (name, 0, 100, 100), (name, 0, 200, 200)]
    assert all(0.0 <= d["accuracy"] <= 1.0 for d in periodic)
    [final] = [d for d in docs if d.get("event") == "final"]
    assert final["records"] == 251 and final["offset"] == 251
    assert docs[-1]["message"] == "finished (stopped)" and docs[-1]["records"] == 251
    assert not [d for d in docs if d["level"] == "ERROR"]
