"""The worker's warm-up: its per-record path run on a few made-up records, so that the model's
compiled code is loaded (or compiled) before the first real record.

`Worker` runs `warm_task` on a thread of its own while it connects; `streammargin warmup`
(`connectors.cli.warmup_command`) runs `warm` on every model to check the compiled modules, and
turns a `WarmupFailed` into its cause and fix.
"""

from __future__ import annotations

import json
import time
import typing


class WarmupFailed(RuntimeError):
    """The model did not process the made-up records (it refused them: dead letters)."""


def _records(multiclass: bool) -> list:
    """A handful of events: labelled ones of every class, an unlabelled one and its label."""
    labels = ["a", "b", "c"] if multiclass else [True, False]
    events = []
    for i in range(12):
        x = {"f0": float(i % 5) - 2.0, "f1": 0.5 * i, "f2": 1.0 if i % 3 else -1.0}
        events.append({"id": f"e{i}", "x": x, "y": labels[i % len(labels)]})
    events.append({"id": "late", "x": {"f0": 1.0, "f1": -1.0}})
    events.append({"id": "late", "y": labels[0]})
    return [json.dumps(event).encode() for event in events]


class _Record(typing.NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    headers: list


def warm_task(settings: typing.Any) -> float:
    """Run the per-record path of a worker with these `TaskSettings` on a few made-up records
    (through the JSON codec, whatever codec the worker reads with); seconds. Raises
    `WarmupFailed` if the model refused them."""
    from connectors.serializers.json_format import JSONCodec
    from connectors.task.partition import PartitionTask

    started = time.perf_counter()
    values = _records(settings.multiclass)
    records = [_Record("warmup", 0, i, 0, None, value, []) for i, value in enumerate(values)]
    codec = JSONCodec(max_record_bytes=1 << 20, multiclass=settings.multiclass)
    task = PartitionTask.new("warmup", 0, settings, codec=codec)
    output = task.process(records)
    if output.processed != len(records) or len(output.dead_letters):
        raise WarmupFailed(
            f"warming --model {settings.model} did not process its records "
            f"({len(output.dead_letters)} dead letters)"
        )
    return time.perf_counter() - started


def warm(model: str, params: dict | None = None, one_vs_rest: bool = False) -> float:
    """Run the worker's per-record path of `model` (with and without the scaler); seconds."""
    from connectors.task.settings import TaskSettings

    return sum(
        warm_task(TaskSettings(model=model, params=dict(params or {}), scale=scale,
                               one_vs_rest=one_vs_rest))
        for scale in (False, True)
    )
