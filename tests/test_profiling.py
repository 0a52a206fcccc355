"""The stage profiler of `streammargin kafka --profile-stages` (connectors/worker/profiling.py)."""

from __future__ import annotations

import collections
import inspect
import json
import os
import pathlib
import re
import sys
import time

import pytest

from connectors.task import PartitionTask, TaskSettings
from connectors.worker import profiling
from connectors.worker.profiling import STAGES, StageProfiler, encode_lines, rss_bytes

Record = collections.namedtuple("Record", "topic partition offset timestamp key value headers")
ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_rules_name_this_projects_files_and_functions_where_they_are():
    # The rules match code by path: a module moved (connectors/ became packages in issue 26)
    # must take its rules along, or its time silently falls into another stage.
    for fragment, function, _ in profiling._RULES:
        if not fragment.startswith(("connectors" + os.sep, "streammargin" + os.sep)):
            continue
        path = ROOT / fragment
        assert path.exists(), fragment
        if function is not None:
            assert re.search(rf"^\s*def {function}\(", path.read_text(), re.M), (fragment, function)


def test_encode_lines_are_the_statements_building_the_prediction_records():
    lines = encode_lines(PartitionTask._records)
    source, first = inspect.getsourcelines(PartitionTask._records)
    text = {first + i: line for i, line in enumerate(source)}
    encode = [text[n].strip() for n in sorted(lines)]
    assert any(line.startswith("emit((") for line in encode)
    assert any(line.startswith("emit_key(") for line in encode)
    assert any(line.startswith("id_json = (") for line in encode)
    assert not any("decode(" in line or "predict(" in line for line in encode)


@pytest.mark.parametrize("batch", [False, True])
def test_a_sampled_task_spends_its_time_in_record_stages(batch):
    task = PartitionTask.new("t", 0, TaskSettings(scale=True, metrics_every=1 << 30))
    if not batch:
        task._batch = None  # (the per-record path)
    records = [
        Record("t", 0, i, 0, None,
               json.dumps({"id": str(i), "x": {"a": i % 7, "b": 1.0 / (1 + i)},
                           "y": i % 3 == 0}).encode(), [])
        for i in range(4000)
    ]
    task.process(records[:10])  # compile / load the model before sampling
    # The batches are built before sampling starts: building them allocates enough tuples to
    # trigger full garbage collections, which on a long-lived process (the whole suite, numba's
    # objects) took half a second, all of it in this test's own frames ("other").
    batches = [[r._replace(offset=10 + 4000 * b + i) for i, r in enumerate(records)]
               for b in range(60 if batch else 12)]
    profiler = StageProfiler(interval=0.0005).start()
    deadline = time.perf_counter() + 0.5
    for batch in batches:
        task.process(batch)
        if time.perf_counter() > deadline:
            break
    profiler.stop()
    report = profiler.report()
    assert set(report["stages"]) == set(STAGES)
    seconds = {stage: entry["seconds"] for stage, entry in report["stages"].items()}
    assert report["samples"] > 0 and report["first_record_at"] is not None
    record_time = sum(seconds[s] for s in ("decode", "scale", "model", "metrics", "encode",
                                           "task"))
    # This thread's outer frames (pytest) are "other"; nothing here polls, produces or
    # checkpoints.
    assert seconds["poll"] == seconds["produce"] == seconds["checkpoint"] == 0.0
    assert record_time > 0.5 * sum(seconds.values()) - seconds["startup"]
    # (The batch path scales, predicts, learns and counts a run in one compiled call: model.)
    for stage in ("model",) if batch else ("decode", "scale", "model"):
        assert seconds[stage] > 0.0, stage


def test_either_clients_poll_is_the_poll_stage():
    from kafka import KafkaConsumer

    from connectors.kafka.librdkafka_transport import LibrdkafkaTransport

    profiler = StageProfiler()
    assert profiler._stage_of(KafkaConsumer.poll.__code__) == "poll"
    assert profiler._stage_of(LibrdkafkaTransport.poll.__code__) == "poll"
    assert profiler._stage_of(LibrdkafkaTransport.send_many.__code__) is None


def test_rss_bytes():
    rss = rss_bytes()
    if sys.platform.startswith("linux"):
        assert rss is not None and rss > 10 << 20
