"""examples/serving_in_process.py, run as its docstring says (on the session's Apache Kafka): a
Python service that scores with `ModelFollower` beside a worker, from three threads, while a new
batch makes new versions."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from connectors.serving.partitioner import partition_of

pytestmark = pytest.mark.kafka

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCORE = re.compile(r"^(thread \d): (card-\d+) +amount +[\d.]+ P\(fraud\) ([\d.]+) "
                   r"\(version (\d+), partition (\d)\)$")
MODEL = re.compile(r"^partition (\d): version (\d+), learnt the records before offset (\d+)$")


def test_the_in_process_serving_example_runs_and_swaps_versions_in(kafka_broker):
    # (this checkout's packages, whatever the environment has installed)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "examples/serving_in_process.py",
                           "--bootstrap-servers", kafka_broker.bootstrap_servers],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    scores = [SCORE.match(line) for line in lines if line.startswith("thread ")]
    assert scores and all(scores), lines
    models = [MODEL.match(line) for line in lines if line.startswith("partition ")]
    assert len(models) == 2 and all(models), lines
    # The models served at the end learnt both batches, on both partitions.
    final = {m[2] for m in models}
    assert sum(int(m[3]) for m in models) == 6_000
    by_thread: dict[str, list] = {}
    for score in scores:
        thread, key, p, version, partition = score.groups()
        assert 0.0 <= float(p) <= 1.0
        # A keyed payment is scored by the model of its key's partition (kafka-python's murmur2,
        # as the example's producer wrote them).
        assert int(partition) == partition_of(key.encode(), 2)
        by_thread.setdefault(thread, []).append(version)
    assert sorted(by_thread) == ["thread 0", "thread 1", "thread 2"]
    for versions in by_thread.values():
        # Each thread scored before the second batch and once after the follower swapped its
        # models in: it saw a version swapped in while it went on scoring.
        assert versions[0] not in final and versions[-1] in final, (versions, final)
    kept = re.search(r"^versions kept: (.*)$", done.stdout, re.M)
    assert kept and final <= set(re.findall(r"'(\d+)'", kept[1]))
