"""First prediction of a fresh worker process, per model: on the ahead-of-time compiled modules
(`streammargin warmup`, which `make` runs) with an empty numba cache, and on numba's JIT
(`STREAMMARGIN_AOT=0`: a fresh container without `streammargin warmup`) with an empty numba cache
and with a warm one.

For each model registered in `connectors.models`, a fresh Python process runs the worker's
per-record path (`connectors.task.PartitionTask`: JSON codec, StandardScaler, model,
metrics) on the events `streammargin warmup` uses: a labelled event first. It reports, from the
moment the parent starts the process (the interpreter's own start is included, its exit is not):

- `first pred. s`: process start -> the first event's prediction (the interpreter's start,
  imports, the model built, its code compiled or loaded, one record);
- `warm-up s`: process start -> every warm-up event done (learning, unlabelled events, a late
  label: the rest of the code a stream needs);
- whether the process imported numba at all (the ahead-of-time run must not);
- on the JIT, numba's compile seconds by function, the three largest (`numba.core.event`
  listeners: nested compiles are inside their callers' times).

Each model runs three times, each in a fresh process: on the compiled modules with an empty numba
cache, then on the JIT twice in one cache directory: first empty (compiles, fills the cache),
then warm (loads). The Kafka worker loads or compiles on a warm-up thread while it joins its
consumer group (about 3 s on the embedded broker), so its first prediction comes at about
max(join, first pred. s) from process start.

Run: .venv/bin/python benchmarks/cold_start.py [--models alma,budgetsvm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")

CHILD = r"""
import collections, json, sys, time
started_at = time.time()  # (the wall clock: the parent reads it before starting this process)
started = time.perf_counter()
sys.path.insert(0, sys.argv[2])
compile_seconds = collections.Counter()
if sys.argv[3] == "jit":  # (on the compiled modules nothing is compiled: numba stays out)
    from numba.core import event

    opened = []  # start times of the compiles under way (they nest: a callee inside its caller)

    class CompileTimes(event.Listener):
        def on_start(self, ev):
            opened.append(time.perf_counter())

        def on_end(self, ev):
            function = ev.data["dispatcher"].py_func
            name = f"{function.__module__.rsplit('.', 1)[-1]}.{function.__name__}"
            compile_seconds[name] += time.perf_counter() - opened.pop()

    event.register("numba:compile", CompileTimes())
from connectors.serializers.json_format import JSONCodec
from connectors.task import PartitionTask, TaskSettings
from connectors.worker.warmup import _records, _Record

model = sys.argv[1]
settings = TaskSettings(model=model, params={}, scale=True)
values = _records(settings.multiclass)
records = [_Record("cold", 0, i, 0, None, value, []) for i, value in enumerate(values)]
task = PartitionTask.new("cold", 0, settings, codec=JSONCodec(multiclass=settings.multiclass))
first = task.process(records[:1])
first_prediction = time.perf_counter() - started
rest = task.process(records, 1)
warm_up = time.perf_counter() - started
assert first.processed == 1 and rest.processed == len(records) - 1, "records were refused"
assert not len(first.dead_letters) and not len(rest.dead_letters), "dead letters"
from streammargin.jit import aot
print(json.dumps({"first": first_prediction, "warm_up": warm_up, "started_at": started_at,
                  "compiles": compile_seconds.most_common(3), "numba": "numba" in sys.modules,
                  "modules": len(aot.loaded_modules())}))
"""


def run(model: str, cache_dir: str, mode: str) -> dict:
    """One fresh process: `mode` "aot" (the compiled modules) or "jit" (STREAMMARGIN_AOT=0)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, STREAMMARGIN_AOT="0" if mode == "jit" else "1")
    spawned_at = time.time()
    done = subprocess.run([sys.executable, "-c", CHILD, model, ROOT, mode], env=env, check=True,
                          capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The interpreter's own start, before the child's first line: from the parent's start of
    # the process to the wall clock the child read first (its exit, after the last
    # measurement, is not part of the wait for a prediction).
    startup = max(0.0, result["started_at"] - spawned_at)
    result["first"] += startup
    result["warm_up"] += startup
    return result


def main() -> int:
    sys.path.insert(0, ROOT)
    from connectors import models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models.model_names()),
                        help="comma-separated model names (default: every registered model)")
    args = parser.parse_args()
    from streammargin.jit import aot

    built = aot.built()
    print(f"compiled modules: {len(built)} of {len(aot.module_names())} built for these sources "
          f"in {aot.directory()}" + ("" if built else " (run `streammargin warmup`)"))
    print(f"{'model':<18}{'compiled: first pred. s':>24}{'warm-up s':>10}{'numba?':>8}"
          f"{'JIT empty cache: first pred. s':>32}{'warm-up s':>10}"
          f"{'JIT warm cache: first pred. s':>31}{'warm-up s':>10}   largest compiles (s)")
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache_dir:
            compiled = run(model, cache_dir, "aot")
            cold = run(model, cache_dir, "jit")
            warm = run(model, cache_dir, "jit")
        compiles = ", ".join(f"{name} {seconds:.1f}" for name, seconds in cold["compiles"])
        print(f"{model:<18}{compiled['first']:>24.2f}{compiled['warm_up']:>10.2f}"
              f"{'yes' if compiled['numba'] else 'no':>8}{cold['first']:>32.2f}"
              f"{cold['warm_up']:>10.2f}{warm['first']:>31.2f}{warm['warm_up']:>10.2f}   "
              f"{compiles}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
