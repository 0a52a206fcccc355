"""`streammargin demo` end to end: embedded broker, drifting stream, worker, summary and plot."""

from __future__ import annotations

import json

import pytest
from river import preprocessing

import streammargin
from connectors import cli
from connectors.cli import demo
from connectors.observability.metrics import PartitionMetrics, make_detector
from connectors.worker.worker import WorkerConfig


def brokers_started_by_this_process() -> set[int]:
    """PIDs of the brokers (tansu, or Apache Kafka's JVM) among this test process's children
    (other processes on the machine may run brokers of their own)."""
    import os
    import pathlib

    me = str(os.getpid())
    found = set()
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # the process ended while we looked
            continue
        if ppid == me and (b"tansu" in cmdline or b"kafka.Kafka" in cmdline):
            found.add(int(proc.name))
    return found


@pytest.mark.kafka
def test_demo_runs_end_to_end_and_leaves_nothing_running(tmp_path, capsys):
    before = brokers_started_by_this_process()  # e.g. the session's kafka_broker fixture
    code = cli.main([
        "demo", "--size", "6000", "--bad-every", "200", "--stream", "hyperplane",
        "--out", str(tmp_path),
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Kafka broker: the embedded Tansu (in memory)" in out  # the default
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["worker"]["records"] == 6000 + 30
    # All five kinds of malformed record were dead-lettered, each with its reason.
    assert sum(summary["dead_letter_reasons"].values()) == 30
    assert len(summary["dead_letter_reasons"]) == 5
    # The abrupt change at record 3000 (offset 3015, after 15 malformed records) is detected
    # shortly after it.
    assert summary["change_offsets"] == {"0": 3015}
    assert summary["detection_delays"] and 0 <= summary["detection_delays"][0] <= 400
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    assert "partition 0" in out and "dead letters by reason" in out
    # It runs the worker's default detector and says which, with every setting.
    assert summary["drift_detector"] == {"name": "ddm", "params": {}}
    assert "drift detector DDM(warm_start=1000, warning_threshold=2.0, drift_threshold=4.0)" in out
    # The demo's embedded broker stopped with the demo.
    assert brokers_started_by_this_process() <= before


def ci() -> bool:
    import os

    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.mark.kafka
def test_demo_runs_on_apache_kafka_and_leaves_nothing_running(tmp_path, capsys):
    from connectors.kafka.broker import KAFKA_VERSION, apache_kafka_unavailable

    missing = apache_kafka_unavailable()
    if missing is not None and not ci():
        pytest.skip(f"Apache Kafka cannot run here: {missing}")
    before = brokers_started_by_this_process()
    code = cli.main([
        "demo", "--broker", "apache-kafka", "--size", "4000", "--bad-every", "200",
        "--partitions", "2", "--out", str(tmp_path),
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"Kafka broker: Apache Kafka {KAFKA_VERSION} (one KRaft node" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["args"]["broker"] == "apache-kafka"
    assert summary["worker"]["records"] == 4000 + 20
    assert sum(summary["dead_letter_reasons"].values()) == 20
    assert set(summary["change_offsets"]) == {"0", "1"}
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    # The JVM stopped with the demo.
    assert brokers_started_by_this_process() <= before


def test_demo_rejects_a_bad_model_before_starting_anything(capsys):
    assert cli.main(["demo", "--model", "nosuch"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_the_demo_runs_the_workers_default_detector():
    fields = WorkerConfig.__dataclass_fields__
    assert demo.default_detector() == (
        fields["drift_detector"].default, fields["drift_params"].default_factory()
    )


@pytest.mark.parametrize("stream", demo.STREAMS)
def test_the_demos_detector_fires_only_after_the_change(stream):
    """The demo's default run (40,000 records, change at 20,000) replayed without Kafka: the
    worker's per-record path for the demo's model (StandardScaler | ALMA) and the worker's
    default drift detector. With ADWIN, 2 of the 3 detections on SEA came before or long after
    the change."""
    fields = WorkerConfig.__dataclass_fields__
    name, params = fields["drift_detector"].default, fields["drift_params"].default_factory()
    size = 40_000
    model = preprocessing.StandardScaler() | streammargin.ALMAClassifier()
    metrics = PartitionMetrics(detector=make_detector(name, params))
    detections = []
    for offset, (x, y) in enumerate(demo.drifting_stream(stream, size)):
        p_true = model.predict_proba_one(x).get(True, 0.0)
        if metrics.update(y, model.predict_one(x), p_true, offset):
            detections.append(offset)
        model.learn_one(x, y)
    change = size // 2
    assert len(detections) == 1 and change <= detections[0] < change + 2000, detections
