"""Helpers shared by the benchmark scripts (run from this folder: `python benchmarks/<x>.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

FIRST_CALL = """
import time
t0 = time.perf_counter()
import streammargin
t1 = time.perf_counter()
m = streammargin.{model}
m.predict_proba_one({{"a": 1.0}})
m.learn_one({{"a": 1.0, "b": 2.0}}, True)
m.learn_one({{"a": 2.0, "b": 1.0}}, False)
m.predict_one({{"a": 1.0}})
t2 = time.perf_counter()
import pandas as pd
m.learn_many(pd.DataFrame({{"a": [1.0]}}), pd.Series([True]))
m.predict_proba_many(pd.DataFrame({{"a": [1.0]}}))
t3 = time.perf_counter()
print(f"{{t1 - t0:.3f}} {{t2 - t1:.3f}} {{t3 - t2:.3f}}")
"""


def exit_on_sigterm() -> None:
    """Make SIGTERM (a `timeout`, a `kill`) raise SystemExit in the main thread, so that the
    script's `with` and `finally` blocks run and stop what it started. Apache Kafka's JVM runs
    in a session of its own (`connectors.kafka.broker`): under SIGTERM's default action the
    script died at once and left the JVM (-Xmx768m) running."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process, all its threads (Linux /proc; 0.0
    elsewhere or once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def time_loop(model, data) -> float:
    """predict_one + learn_one samples/s over `data`."""
    start = time.perf_counter()
    for x, y in data:
        model.predict_one(x)
        model.learn_one(x, y)
    return len(data) / (time.perf_counter() - start)


def interleaved_rates(models: dict, data, chunk: int = 1000) -> dict[str, float]:
    """predict_one + learn_one samples/s of each model over `data`, the models taking turns on
    chunks of `chunk` records, so that a change of load on the machine (this VM's speed drifts
    by +-40% over seconds) hits every model alike and their ratios stay put."""
    seconds = dict.fromkeys(models, 0.0)
    for start in range(0, len(data), chunk):
        part = data[start : start + chunk]
        for name, model in models.items():
            seconds[name] += len(part) / time_loop(model, part)
    return {name: len(data) / total for name, total in seconds.items()}


def first_call_costs(model: str) -> dict[str, tuple[float, float, float]]:
    """Seconds of (import, first learn_one + predict, first learn_many + predict) for the model
    expression `model` (e.g. "ALMAClassifier()") in fresh processes with a private numba cache:
    on the compiled modules (`streammargin warmup`), then on numba's JIT (STREAMMARGIN_AOT=0)
    compiling ("cold"), then loading that cache ("warm")."""
    costs = {}
    with tempfile.TemporaryDirectory() as cache:
        for label, switch in (("compiled modules", "1"), ("JIT, cold (compiles)", "0"),
                              ("JIT, warm (loads the cache)", "0")):
            env = {**os.environ, "NUMBA_CACHE_DIR": cache, "STREAMMARGIN_AOT": switch}
            out = subprocess.run(
                [sys.executable, "-c", FIRST_CALL.format(model=model)],
                env=env, capture_output=True, text=True, check=True,
            ).stdout.split()
            costs[label] = (float(out[0]), float(out[1]), float(out[2]))
    return costs
