"""`streammargin warmup`: compile every model's numba code ahead, into numba's cache.

numba compiles a model's functions on their first call (5-35 s per model) and keeps the machine
code in its cache: `__pycache__` beside the sources, or the folder `NUMBA_CACHE_DIR` names. A
fresh container would compile at its first record, every time. Run this once where the image is
built, with the cache where the workers will find it:

    ENV NUMBA_CACHE_DIR=/opt/streammargin/numba-cache NUMBA_CPU_NAME=generic
    RUN streammargin warmup

`NUMBA_CPU_NAME=generic` (set when building and when running) makes the cached code portable to
other CPUs: numba keys its cache by CPU model, so an image built on one machine and run on
another would otherwise compile again.

Each model runs the worker's per-record path (`connectors.task.PartitionTask`: predict, class
probabilities, learn, labelled and unlabelled events, with and without the scaler) on a few
records, binary or multiclass as the model serves; parameters that select other compiled code
(a kernel, an eviction policy) are warmed with `--model NAME --param key=value`, as the worker
will run them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import typing

from connectors import models
from connectors.errors import EXIT_FAILURE, CommandError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "warmup",
        help="compile the models' numba code into numba's cache (NUMBA_CACHE_DIR), e.g. when "
        "building a container image",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="a model to warm (repeatable; default: every model: "
                        + ", ".join(models.model_names()) + ")")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a parameter of the models given (repeatable), as `streammargin "
                        "kafka --param`")
    parser.add_argument("--one-vs-rest", action="store_true",
                        help="also warm the binary models wrapped one-vs-rest")
    parser.set_defaults(func=run)


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
    `CommandError` if the model refused them."""
    from connectors.codec import JSONCodec
    from connectors.task import PartitionTask

    started = time.perf_counter()
    values = _records(settings.multiclass)
    records = [_Record("warmup", 0, i, 0, None, value, []) for i, value in enumerate(values)]
    codec = JSONCodec(max_record_bytes=1 << 20, multiclass=settings.multiclass)
    task = PartitionTask.new("warmup", 0, settings, codec=codec)
    output = task.process(records)
    if output.processed != len(records) or len(output.dead_letters):
        raise CommandError(
            f"warming --model {settings.model} did not process its records "
            f"({len(output.dead_letters)} dead letters)",
            "report it: the model refused the warm-up events", EXIT_FAILURE,
        )
    return time.perf_counter() - started


def warm(model: str, params: dict | None = None, one_vs_rest: bool = False) -> float:
    """Run the worker's per-record path of `model` (with and without the scaler); seconds."""
    from connectors.task import TaskSettings

    return sum(
        warm_task(TaskSettings(model=model, params=dict(params or {}), scale=scale,
                               one_vs_rest=one_vs_rest))
        for scale in (False, True)
    )


def run(args: argparse.Namespace) -> int:
    import os

    from connectors.codec import install_fast_crc32c

    names = args.model or list(models.model_names())
    try:
        params = models.parse_params(args.param)
        for name in names:
            models.model_class(name)  # an unknown name fails before anything is compiled
            models.check_model(name, params)  # so does a parameter it refuses
    except ValueError as error:
        raise CommandError(str(error), "give model names of `streammargin kafka --list-models` "
                           "and parameters they take (key=value)") from None
    where = os.environ.get("NUMBA_CACHE_DIR") or "__pycache__ beside the sources"
    print(f"numba cache: {where}", file=sys.stderr)
    crc = install_fast_crc32c()  # the worker's CRC-32C: numba's unless crc32c is installed
    print(f"CRC-32C for kafka-python: {crc}", file=sys.stderr)
    total = 0.0
    for name in names:
        variants = [False]
        if args.one_vs_rest and not getattr(models.check_model(name, params), "_multiclass",
                                            False):
            variants.append(True)
        for one_vs_rest in variants:
            seconds = warm(name, params, one_vs_rest)
            total += seconds
            label = f"{name} --one-vs-rest" if one_vs_rest else name
            print(f"{label:<28} {seconds:6.1f} s", file=sys.stderr, flush=True)
    print(f"warmed {len(names)} models in {total:.1f} s", file=sys.stderr)
    return 0
