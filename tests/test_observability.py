"""Operating the worker without a broker: dead-letter kinds, the status and its Prometheus
exposition, the HTTP endpoints (with a real HTTP client), JSON log lines, and the one-line errors
of `streammargin kafka` for bad options, files, ports and an unreachable broker.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import logging
import math
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from connectors.cli.kafka_command import _as_flags
from connectors.codec import DeadLetter
from connectors.kafka.broker import free_port
from connectors.observability import observability
from connectors.observability.observability import (
    DEAD_LETTER_KINDS,
    ClientLogFilter,
    ClientLogTail,
    EndpointError,
    EndpointServer,
    JsonLogFormatter,
    WorkerStatus,
    dead_letter_kind,
    metrics_registry,
)
from connectors.serializers.json_format import JSONCodec
from connectors.serializers.mapping import FieldMapping
from connectors.task import PartitionTask, TaskSettings
from streammargin.errors import InvalidInput

Record = collections.namedtuple("Record", "topic partition offset timestamp key value headers")
TopicPartition = collections.namedtuple("TopicPartition", "topic partition")


def as_records(values, topic="events", partition=0, start=0):
    return [Record(topic, partition, start + i, 0, None, value, []) for i, value in enumerate(values)]


def event(i, x, y=None) -> bytes:
    doc = {"id": f"e{i}", "x": x}
    if y is not None:
        doc["y"] = y
    return json.dumps(doc).encode()


# Dead-letter kinds --------------------------------------------------------------------------------

# Every rejection of the JSON codec, with the kind its count is labelled with.
CODEC_REJECTIONS = [
    (None, "null_value"),
    (b"x" * 2000, "oversized"),
    (b"{not json", "bad_json"),
    (b"\xff\xfe", "bad_json"),
    (b'{"x": {"a": NaN}}', "non_finite"),
    (b"[1, 2]", "not_an_object"),
    (b'{"id": [1], "x": {"a": 1}}', "bad_id"),
    (b'{"x": {"a": 1}, "y": 7}', "unknown_label"),
    (b'{"id": "a"}', "missing_features"),
    (b'{"y": true}', "unjoinable_label"),
    (b'{"x": [1, 2]}', "bad_features"),
    # (fields that cannot be features: dead letters where --features names them, the a
    # and the b below; a wildcard leaves them out)
    (b'{"a": ["high"]}', "not_a_number"),
    (b'{"b": {"a": "' + b"s" * 300 + b'"}}', "not_a_number"),
    (b'{"a": 1e999}', "non_finite"),
    (b'{"a": 1' + b"0" * 400 + b"}", "non_finite"),
]


@pytest.mark.parametrize(("value", "kind"), CODEC_REJECTIONS)
def test_every_codec_rejection_has_its_own_dead_letter_kind(value, kind):
    named = value is not None and value.startswith((b'{"a"', b'{"b"'))
    mapping = FieldMapping(features=("a", "b.a")) if named else None
    codec = JSONCodec(max_record_bytes=1000, mapping=mapping)
    with pytest.raises(DeadLetter) as caught:
        codec.decode(value)
    assert dead_letter_kind(str(caught.value)) == kind


@pytest.mark.parametrize("value", [b'{"x": {"a": 1}, "y": 2.5}', b'{"x": {"a": 1}, "y": [1]}',
                                   b'{"x": {"a": 1}, "y": 9223372036854775808}',
                                   b'{"x": {"a": 1}, "y": "' + b"c" * 300 + b'"}'])
def test_a_multiclass_codecs_label_refusals_are_unknown_labels(value):
    with pytest.raises(DeadLetter) as caught:
        JSONCodec(multiclass=True).decode(value)
    assert dead_letter_kind(str(caught.value)) == "unknown_label"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_reason_text_maps_to_the_bounded_label_set(reason):
    assert dead_letter_kind(reason) in DEAD_LETTER_KINDS


# Status and exposition ----------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def scrape(status: WorkerStatus) -> dict:
    """{(name, frozen labels): value} of everything /metrics shows, parsed by prometheus-client."""
    from prometheus_client import generate_latest

    text = generate_latest(metrics_registry(status)).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def series(samples: dict, name: str, **labels) -> dict:
    """Values of one metric whose labels include `labels`, by their other labels."""
    wanted = {(k, str(v)) for k, v in labels.items()}
    return {
        frozenset(dict(key).items() - wanted): value
        for (sample, key), value in samples.items()
        if sample == name and wanted <= key
    }


def value(samples: dict, name: str, **labels) -> float:
    [found] = series(samples, name, **labels).values()
    return found


def processed(status, task, values, start=0):
    out = task.process(as_records(values, task.topic, task.partition, start))
    status.processed(task, out)
    status.loop_turned()
    return out


def test_counters_start_at_the_restore_while_the_models_totals_continue():
    clock = Clock()
    status = WorkerStatus("g", "alma", "w1", publish_interval=0.0, clock=clock)
    status.connected(lambda tp: {("events", 0): 12, ("events", 1): 3}.get(tp))
    task = PartitionTask.new("events", 0, TaskSettings())
    good = [event(i, {"a": float(i % 3), "b": 1.0}, i % 2 == 0) for i in range(8)]
    processed(status, task, good)  # before this worker owns it: not counted
    status.assigned([TopicPartition("events", 0)])
    status.restored([(task, 5000)])
    assert status.readiness()[0]
    processed(status, task, [b"{bad", b'{"x": ["high"]}', b'{"x": {"a": 1}, "y": 7}',
                             b"{worse", event(9, {"a": 1.0})], start=8)
    samples = scrape(status)
    at = {"group": "g", "topic": "events", "partition": 0}
    assert value(samples, "streammargin_records_total", **at) == 5
    assert value(samples, "streammargin_predictions_total", **at) == 1
    assert value(samples, "streammargin_model_records", **at) == 13
    assert value(samples, "streammargin_model_labelled", **at) == 8
    assert value(samples, "streammargin_labelled_total", **at) == 0
    dead = series(samples, "streammargin_dead_letters_total", **at)
    assert {dict(labels)["reason"] for labels in dead} == set(DEAD_LETTER_KINDS)
    assert {labels: n for labels, n in dead.items() if n} == {
        frozenset({("reason", "bad_json")}): 2, frozenset({("reason", "bad_features")}): 1,
        frozenset({("reason", "unknown_label")}): 1}
    assert value(samples, "streammargin_delayed_labels_total", outcome="unjoinable", **at) == 0
    assert value(samples, "streammargin_pending_labels", **at) == 1  # e9 waits for its label
    assert value(samples, "streammargin_next_offset", **at) == 13
    assert value(samples, "streammargin_consumer_lag_records", **at) == 0  # highwater 12 < 13
    assert value(samples, "streammargin_checkpoint_bytes", **at) == 5000
    assert value(samples, "streammargin_uncheckpointed_records", **at) == 13
    assert value(samples, "streammargin_accuracy", **at) == task.metrics.accuracy
    assert value(samples, "streammargin_log_loss", **at) == task.metrics.log_loss
    assert value(samples, "streammargin_worker_info", group="g", model="alma", worker="w1") == 1
    assert value(samples, "streammargin_ready") == 1
    assert value(samples, "streammargin_assigned_partitions") == 1
    assert value(samples, "streammargin_rebalances_total") == 1
    # prometheus-client's process collector is there (start time, memory, CPU).
    assert value(samples, "process_start_time_seconds") > 0
    assert value(samples, "process_resident_memory_bytes") > 0

    status.checkpointed({("events", 0): 7000}, seconds=0.03)
    task.mark_checkpointed()
    status.loop_turned()
    samples = scrape(status)
    assert value(samples, "streammargin_checkpoint_bytes", **at) == 7000
    assert value(samples, "streammargin_uncheckpointed_records", **at) == 0
    assert value(samples, "streammargin_checkpoints_written_total") == 1
    assert value(samples, "streammargin_checkpoint_duration_seconds_bucket", le="0.025") == 0
    assert value(samples, "streammargin_checkpoint_duration_seconds_bucket", le="0.05") == 1
    assert value(samples, "streammargin_checkpoint_duration_seconds_count") == 1
    assert value(samples, "streammargin_transactions_total", outcome="committed") == 0
    status.transaction_ended(committed=True)
    status.transaction_ended(committed=True)
    status.transaction_ended(committed=False)
    status.loop_turned()
    samples = scrape(status)
    assert value(samples, "streammargin_transactions_total", outcome="committed") == 2
    assert value(samples, "streammargin_transactions_total", outcome="aborted") == 1


def test_a_revoked_partition_loses_its_series_and_readiness_follows_the_group():
    status = WorkerStatus("g", "alma", "w1", publish_interval=0.0, clock=Clock())
    assert status.readiness() == (False, "starting: connecting to the brokers")
    status.connected(lambda tp: None)
    assert status.readiness()[0] is False  # not a member yet
    tasks = [PartitionTask.new("events", p, TaskSettings()) for p in (0, 1)]
    status.assigned([TopicPartition("events", 0), TopicPartition("events", 1)])
    assert status.readiness() == (False, "restoring 2 assigned partitions")
    status.restored([(task, None) for task in tasks])
    assert status.readiness() == (True, "ready: 2 partitions")
    for task in tasks:
        processed(status, task, [event(0, {"a": 1.0}, True), b"{bad"])
    samples = scrape(status)
    assert set(series(samples, "streammargin_records_total", group="g")) == {
        frozenset({("topic", "events"), ("partition", "0")}),
        frozenset({("topic", "events"), ("partition", "1")})}
    assert not series(samples, "streammargin_checkpoint_bytes")  # no checkpoint yet

    status.revoked([TopicPartition("events", 1)])  # series gone at once, before any loop turn
    assert status.readiness() == (False, "joining the consumer group (or rebalancing)")
    samples = scrape(status)
    assert {dict(labels)["partition"] for labels in series(
        samples, "streammargin_records_total")} == {"0"}
    assert all(dict(key).get("partition") != "1" for _, key in samples)
    status.assigned([])
    assert status.readiness() == (True, "ready: 1 partitions")
    status.stopping()
    assert status.readiness() == (False, "stopping")
    status.stopped(RuntimeError("boom"))
    assert status.readiness() == (False, "failed: RuntimeError: boom")
    assert value(scrape(status), "streammargin_ready") == 0


def test_liveness_follows_the_main_loop_and_ends_with_the_worker():
    clock = Clock()
    status = WorkerStatus("g", "alma", "w1", clock=clock)
    assert status.liveness(10)[0]  # starting: connecting takes its bootstrap timeout
    status.connected(lambda tp: None)
    clock.now += 9
    assert status.liveness(10)[0]
    clock.now += 2
    live, why = status.liveness(10)
    assert not live and why == "the main loop has not turned for 11 s (limit 10 s)"
    status.loop_turned()
    assert status.liveness(10)[0]
    status.stopped()
    assert status.liveness(10) == (False, "stopped")


def test_the_models_rejection_and_an_undecodable_batch_are_counted_by_kind(monkeypatch):
    status = WorkerStatus("g", "alma", "w1", publish_interval=0.0, clock=Clock())
    status.connected(lambda tp: None)
    task = PartitionTask.new("events", 0, TaskSettings())
    learn = task.model.learn_one

    def learn_one(x, y):
        if "refuse" in x:
            raise InvalidInput("feature 'refuse' is not welcome: of type str, expected a number")
        learn(x, y)

    monkeypatch.setattr(task.model, "learn_one", learn_one)
    status.assigned([TopicPartition("events", 0)])
    status.restored([(task, None)])
    processed(status, task, [event(0, {"a": 1.0}, True), event(1, {"refuse": 1.0}, True)])
    # The worker names the kind of what it skips (an undecodable batch's reason is the
    # client's).
    status.dead_letters(task, task.skip(2, 6, "Libraries for snappy compression codec not found"),
                        kind="undecodable")
    status.loop_turned()
    dead = series(scrape(status), "streammargin_dead_letters_total", partition=0)
    assert {labels: n for labels, n in dead.items() if n} == {
        frozenset({("group", "g"), ("topic", "events"), ("reason", "rejected_by_model")}): 1,
        frozenset({("group", "g"), ("topic", "events"), ("reason", "undecodable")}): 1}


def test_a_snapshot_is_published_at_most_every_interval():
    clock = Clock()
    status = WorkerStatus("g", "alma", "w1", publish_interval=1.0, clock=clock)
    status.connected(lambda tp: None)
    task = PartitionTask.new("events", 0, TaskSettings())
    status.assigned([TopicPartition("events", 0)])
    status.restored([(task, None)])  # published at once
    first = status.snapshot()
    task.process(as_records([event(0, {"a": 1.0}, True)]))
    status.loop_turned()  # the restore's publish counts: not due yet
    clock.now += 0.5
    status.loop_turned()
    assert status.snapshot() is first
    clock.now += 0.6
    status.loop_turned()
    assert status.snapshot().partitions[0].records == 1


# HTTP endpoints -----------------------------------------------------------------------------------


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def test_the_endpoints_answer_a_real_http_client():
    clock = Clock()
    status = WorkerStatus("g", "alma", "w1", publish_interval=0.0, clock=clock)
    with EndpointServer(status, "127.0.0.1", 0, liveness_timeout=30) as server:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
        assert get(server.url + "/readyz")[:1] == (503,)
        code, kind, body = get(server.url + "/healthz")
        assert (code, body) == (200, "starting: connecting to the brokers\n")
        status.connected(lambda tp: None)
        task = PartitionTask.new("events", 3, TaskSettings())
        status.assigned([TopicPartition("events", 3)])
        assert get(server.url + "/readyz")[::2] == (503, "restoring 1 assigned partitions\n")
        status.restored([(task, None)])
        assert get(server.url + "/readyz")[::2] == (200, "ready: 1 partitions\n")
        processed(status, task, [event(i, {"a": float(i)}, i % 2) for i in range(5)])
        code, kind, body = get(server.url + "/metrics")
        assert code == 200 and kind.startswith("text/plain; version=")
        families = {f.name: f for f in text_string_to_metric_families(body)}
        [sample] = [s for s in families["streammargin_records"].samples
                    if s.name == "streammargin_records_total"]
        assert sample.labels == {"group": "g", "topic": "events", "partition": "3"}
        assert sample.value == 5
        assert families["streammargin_records"].type == "counter"
        assert families["streammargin_accuracy"].type == "gauge"
        # OpenMetrics when Prometheus asks for it (prometheus-client negotiates).
        request = urllib.request.Request(server.url + "/metrics",
                                         headers={"Accept": "application/openmetrics-text"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            assert response.read().decode().rstrip().endswith("# EOF")
        clock.now += 31
        assert get(server.url + "/healthz")[::2] == (
            503, "the main loop has not turned for 31 s (limit 30 s)\n")
        assert get(server.url + "/nothing")[0] == 404
    with pytest.raises(OSError):  # closed: the port is free again
        urllib.request.urlopen(server.url + "/healthz", timeout=2)


def test_a_port_in_use_is_one_message_with_the_fix():
    status = WorkerStatus("g", "alma", "w1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EndpointError) as caught:
            EndpointServer(status, "127.0.0.1", port)
    assert str(caught.value) == (
        f"cannot serve the HTTP endpoints on --http-host 127.0.0.1 --http-port {port}: the port "
        "is in use (another worker or exporter on this host?). Fix: choose another --http-port, "
        "or --http-port 0 to take a free one (the log says which)")


# Logs ---------------------------------------------------------------------------------------------


def test_json_log_lines_carry_the_structured_fields():
    formatter = JsonLogFormatter()
    record = logging.LogRecord("connectors.worker", logging.ERROR, __file__, 1,
                               "bad %s\nsecond line", ("thing",), None)
    record.topic, record.partition, record.offset = "events", 1, 42
    record.accuracy, record.partitions = math.nan, ["events/0", "events/1"]
    record.opaque = object()
    line = formatter.format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["time"].endswith("Z") and len(doc["time"]) == len("2026-01-01T00:00:00.000Z")
    assert {k: doc[k] for k in ("level", "logger", "message", "topic", "partition", "offset",
                                "accuracy", "partitions")} == {
        "level": "ERROR", "logger": "connectors.worker", "message": "bad thing\nsecond line",
        "topic": "events", "partition": 1, "offset": 42, "accuracy": "nan",
        "partitions": ["events/0", "events/1"]}
    assert doc["opaque"].startswith("<object object")
    assert "exception" not in doc
    try:
        raise KeyError("why")
    except KeyError:
        record.exc_info = sys.exc_info()
    assert "KeyError: 'why'" in json.loads(formatter.format(record))["exception"]


def test_the_clients_lines_show_only_when_debugging_are_counted_once_connected_and_feed_the_tail():
    connected, held = [], []
    keep = ClientLogFilter(lambda: bool(connected), held_back=lambda: held.append(1))
    make = lambda name, message: logging.LogRecord(name, logging.ERROR, "", 0, message, (), None)  # noqa: E731
    assert not keep.filter(make("kafka.net.manager", "Connection failed: refused"))
    assert keep.filter(make("connectors.worker", "anything"))
    assert keep.filter(make("kafkaesque", "not the client"))
    assert held == []  # before the connection: the tail tells the failure, nothing to count
    connected.append(True)
    assert not keep.filter(make("kafka.net.manager", "Connection lost"))
    assert not keep.filter(make("kafka.librdkafka", "REQTMOUT ..."))
    assert len(held) == 2
    assert ClientLogFilter(lambda: False, debug=True).filter(make("kafka", "x"))
    client = logging.getLogger("kafka.net.manager")
    with ClientLogTail() as tail:
        client.error("Connection failed: %s", "KafkaConnectionError: 111 ECONNREFUSED")
        client.warning("Bootstrap bootstrap-0 not ready; waiting 0.12 secs")
    client.error("Connection failed: after the tail")
    assert tail.last_error == "KafkaConnectionError: 111 ECONNREFUSED"


def test_config_messages_name_the_options():
    assert _as_flags("checkpoint_every must be >= 1, got 0") == (
        "--checkpoint-every must be >= 1, got 0")
    assert _as_flags("--model alma --param C=-1: the model refused") == (
        "--model alma --param C=-1: the model refused")
    assert _as_flags("starts at auto_offset_reset=latest") == "starts at auto_offset_reset=latest"


# Errors of `streammargin kafka` -------------------------------------------------------------------


@pytest.fixture
def command(monkeypatch, capsys):
    """`streammargin kafka ARGS` in-process: (exit code, stderr lines)."""
    from connectors.cli import main

    for name in ("TOPIC", "BOOTSTRAP_SERVERS", "LOG_LEVEL", "HTTP_PORT"):
        monkeypatch.delenv(f"STREAMMARGIN_{name}", raising=False)

    def run_exit(*args: str) -> tuple[int, list[str]]:
        try:
            code = main(["kafka", *args])
        except SystemExit as stop:
            code = stop.code
        return code, capsys.readouterr().err.splitlines()

    return run_exit


def one_line(lines: list[str]) -> str:
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


BASE = ("--topic", "t", "--bootstrap-servers", "127.0.0.1:1")


@pytest.mark.parametrize(("args", "code", "expected"), [
    (("--param", "nosuch=1"), 2,
     "--model alma --param nosuch=1: bad parameters {'nosuch': 1} for ALMAClassifier: "
     "ALMAClassifier.__init__() got an unexpected keyword argument 'nosuch'; it takes ['p', "
     "'alpha', 'B', 'C', "),
    (("--param", "C=-1"), 2,
     "--model alma --param C=-1: C must be "),
    (("--model", "kernelalma", "--param", "kernel=cosine"), 2,
     "--model kernelalma --param kernel=cosine: kernel must be one of ['linear', 'poly', "
     "'rbf'], got 'cosine'"),
    (("--model", "nope"), 2, "unknown model 'nope'; known models: alma, auto, budgetperceptron"),
    (("--drift-detector", "nope"), 2,
     "--drift-detector nope: unknown drift detector 'nope'; known: adwin,"),
    (("--drift-detector", "adwin", "--drift-param", "delta=-1"), 2,
     "--drift-detector adwin --drift-param delta=-1: ADWIN parameters.delta: must be in "
     "[0.0, 1.0], got -1"),
    (("--checkpoint-every", "0"), 2, "--checkpoint-every must be >= 1, got 0"),
    (("--codec", "nowhere.module:Codec"), 2,
     "cannot use --codec nowhere.module:Codec: ModuleNotFoundError: No module named 'nowhere'. "
     "Fix: give json, or package.module:Class"),
    (("--security-protocol", "SSL", "--ssl-cafile", "/no/such/ca.pem"), 1,
     "worker failed: cannot read ssl_cafile (--ssl-cafile) '/no/such/ca.pem': No such file or "
     "directory. Fix: give the path of a readable PEM file"),
    (("--security-protocol", "SASL_SSL", "--ssl-cafile", __file__), 1,
     f"worker failed: ssl_cafile (--ssl-cafile) {__file__!r} holds no usable PEM certificate"),
    (("--security-protocol", "SSL", "--ssl-certfile", __file__), 1,
     f"worker failed: the client certificate --ssl-certfile {__file__!r} with --ssl-keyfile "
     "None does not load"),
    (("--security-protocol", "SSL", "--consumer-config", "ssl_crlfile=/etc/hostname"), 1,
     "worker failed: ssl_crlfile cannot be used with kafka-python 3.0"),
    (("--http-port", "70000"), 2, "--http-port must be in 0-65535 (0: a free one), got 70000"),
])
def test_a_bad_option_or_file_is_one_line_with_the_cause(command, args, code, expected):
    found, lines = command(*BASE, *args)
    assert found == code
    line = one_line(lines)
    assert f"ERROR streammargin.kafka: {expected}" in line


def test_options_argparse_refuses_are_one_line_too(command):
    for args, expected in [
        (("--idle-timeout", "soon"),
         "streammargin kafka: error: argument --idle-timeout: invalid number (or none) value: "
         "'soon' (see streammargin kafka --help)"),
        (("--param", "oops"),
         "streammargin kafka: error: parameter 'oops' is not of the form key=value (see "
         "streammargin kafka --help)"),
        (("--http-port", "eighty"),
         "streammargin kafka: error: argument --http-port: invalid int value: 'eighty' (see "
         "streammargin kafka --help)"),
    ]:
        assert command(*BASE, *args) == (2, [expected])
    code, lines = command(*BASE, "--log-level", "LOUD")
    assert code == 2 and one_line(lines).startswith("streammargin kafka: --log-level must be one")
    code, lines = command("--bootstrap-servers", "127.0.0.1:1")
    assert code == 2 and one_line(lines).endswith(
        "no input topic. Fix: give --topic NAME (repeatable), or STREAMMARGIN_TOPIC=a,b")


def test_a_port_in_use_fails_the_command_before_it_connects(command):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = command(*BASE, "--http-port", str(port))
    assert code == 1
    assert one_line(lines).endswith(
        f"cannot serve the HTTP endpoints on --http-host 0.0.0.0 --http-port {port}: the port is "
        "in use (another worker or exporter on this host?). Fix: choose another --http-port, or "
        "--http-port 0 to take a free one (the log says which)")


def test_the_traceback_comes_with_log_level_debug_only(command):
    code, lines = command(*BASE, "--codec", "nowhere.module:Codec")
    assert code == 2 and one_line(lines).endswith("(--log-level DEBUG shows the traceback)")
    code, lines = command(*BASE, "--codec", "nowhere.module:Codec", "--log-level", "DEBUG")
    assert code == 2 and "Traceback (most recent call last):" in lines
    assert lines[-1] == "ModuleNotFoundError: No module named 'nowhere'"


@pytest.mark.parametrize(("options", "last_error"), [
    (("--idle-timeout", "5"), "; last error: KafkaConnectionError: 111 ECONNREFUSED"),
    # The producer waits its own bootstrap_timeout_ms, which the line quotes (not the consumer's
    # 30 s default); the consumer, subscribed before the producer starts on librdkafka, logs
    # connection errors that are delivered when it is closed: they stay off stderr. (No last
    # error: the tail reads kafka-python's log lines.)
    pytest.param(("--transport", "librdkafka"), "", marks=pytest.mark.skipif(
        importlib.util.find_spec("confluent_kafka") is None,
        reason="confluent-kafka is not installed")),
], ids=["kafka-python", "librdkafka"])
def test_an_unreachable_broker_is_one_line_naming_servers_timeout_cause_and_fix(options,
                                                                               last_error):
    servers = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "connectors.cli", "kafka", "--topic", "t",
            "--bootstrap-servers", servers, *options,
            "--producer-config", "bootstrap_timeout_ms=1500"]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          cwd=observability.__file__.rsplit("/connectors/", 1)[0])
    assert time.monotonic() - started < 20  # 1.5 s and start-up, far from 30 s
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.endswith(
        f"ERROR streammargin.kafka: worker failed: cannot connect to the Kafka brokers at "
        f"{servers}: no broker answered within 1.5 s (the producer's bootstrap_timeout_ms=1500)"
        f"{last_error}. Fix: check --bootstrap-servers (host:port of a broker listener), that "
        "the brokers are up and reachable from this host, and the security settings that "
        "listener expects (--security-protocol, --ssl-*, --sasl-*) (--log-level DEBUG shows the "
        "traceback)")
    assert done.stdout == ""


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate and its key encrypted with the password "secret" (openssl)."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "2", "-subj",
                    "/CN=localhost", "-keyout", str(key), "-out", str(cert), "-passout",
                    "pass:secret"], check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def test_tls_files_that_load_pass_and_a_wrong_key_password_is_named(certificate):
    from connectors.worker.worker import WorkerError, check_tls_files

    cert, key = certificate
    tls = {"security_protocol": "SSL", "ssl_cafile": cert, "ssl_certfile": cert,
           "ssl_keyfile": key}
    check_tls_files({"producer": {**tls, "ssl_password": "secret"}, "consumer": {}})
    check_tls_files({"producer": {**tls, "security_protocol": "PLAINTEXT",
                                  "ssl_cafile": "/no/such/file"}})  # not on TLS: unchecked
    with pytest.raises(WorkerError, match=(
            f"the client certificate --ssl-certfile '{cert}' with --ssl-keyfile '{key}' does not "
            r"load \(.*\). Fix: give the certificate and its private key as PEM files .* and "
            "--ssl-password if the key is encrypted")):
        check_tls_files({"consumer": {**tls, "ssl_password": "wrong"}})
