"""`streammargin warmup`: the models' code compiled ahead of time (the compiled modules,
`tests/test_aot.py`; or numba's cache with --jit-cache)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from connectors import cli
from connectors.worker.warmup import warm


def test_warm_runs_the_workers_path_of_each_kind_of_model(capsys):
    assert warm("alma", {"alpha": 0.9}) >= 0.0
    assert warm("convexpolytope") >= 0.0  # natively multiclass: labels as they come
    assert cli.main(["warmup", "--model", "alma", "--one-vs-rest"]) == 0
    err = capsys.readouterr().err
    assert "alma --one-vs-rest" in err and "warmed 1 models" in err


def test_bad_models_and_parameters_are_two_lines(capsys):
    assert cli.main(["warmup", "--model", "nope"]) == 2
    assert cli.main(["warmup", "--model", "alma", "--param", "alpha=7"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4 and "unknown model 'nope'" in lines[0]
    assert lines[1].strip().startswith("fix:") and "alpha" in lines[2]


def test_a_warmed_cache_serves_a_fresh_process_without_compiling(tmp_path):
    # The image-building recipe without the compiled modules: warm into NUMBA_CACHE_DIR, then a
    # fresh process with the same cache runs the worker's path without writing compiled code.
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "STREAMMARGIN_AOT": "0"}
    command = [sys.executable, "-m", "connectors.cli", "warmup", "--jit-cache", "--model", "alma"]
    subprocess.run(command, env=env, check=True, capture_output=True)
    compiled = {p: p.stat().st_mtime_ns for p in pathlib.Path(tmp_path).rglob("*.nbc")}
    assert compiled  # the per-record functions are in the cache
    subprocess.run(command, env=env, check=True, capture_output=True)
    again = {p: p.stat().st_mtime_ns for p in pathlib.Path(tmp_path).rglob("*.nbc")}
    assert again == compiled


WARM_UP = """
import sys
from connectors.worker.worker import Worker, WorkerConfig
from streammargin.jit import aot, dispatch
import streammargin.jit.alma as jit_alma

def loaded():
    # The models' modules only: the C of the record codecs (NATIVE_SOURCES) loads on import.
    jitted = sum(len(f._dispatcher.signatures) for f in vars(jit_alma).values()
                 if isinstance(f, dispatch.JitFunction) and f._dispatcher is not None)
    models = [aot.module_name(short) for short in aot.read_exports()]
    return jitted + len(set(models) & set(aot.loaded_modules()))

worker = Worker(WorkerConfig(topics=["t"], scale=True))
before = loaded()
worker._warm_up()
print(before, loaded() > before, "numba" in sys.modules, worker.tasks, worker.throughput.count)
"""


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled modules", "jit"])
def test_the_worker_warms_its_model_up_on_a_task_of_its_own(compiled):
    # Worker.run starts this in a thread while it connects and joins: in a fresh process, the
    # model's compiled per-record code is loaded before any record (from the compiled modules,
    # or numba's), and the worker's own state (tasks, throughput) is untouched.
    env = {**os.environ, "STREAMMARGIN_AOT": "1" if compiled else "0"}
    out = subprocess.run([sys.executable, "-c", WARM_UP], capture_output=True, text=True,
                         check=True, env=env).stdout.split(maxsplit=2)
    assert out == ["0", "True", f"{not compiled} {{}} 0\n"]


def test_a_build_that_cannot_write_is_two_lines(capsys, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    environment = dict(os.environ)
    assert cli.main(["warmup", "--model", "alma", "--output", str(blocked / "modules")]) == 1
    assert dict(os.environ) == environment  # (--output changes nothing for later code)
    lines = capsys.readouterr().err.strip().splitlines()
    assert "cannot write the compiled modules" in lines[-2]
    assert lines[-1].strip().startswith("fix:") and "STREAMMARGIN_AOT_DIR" in lines[-1]


def test_a_model_refusing_the_warm_up_records_is_two_lines(capsys, monkeypatch):
    # The worker's warm-up (connectors/worker/warmup.py) raises WarmupFailed; the command tells
    # it as a cause and a fix, exit 1.
    from connectors.worker import warmup
    from connectors.cli import warmup_command

    def refused(settings):
        raise warmup.WarmupFailed(f"warming --model {settings.model} did not process its records "
                                  "(3 dead letters)")

    monkeypatch.setattr(warmup, "warm_task", refused)
    assert cli.main(["warmup", "--jit-cache", "--model", "alma"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-2] == ("streammargin warmup: warming --model alma did not process its records "
                         "(3 dead letters)")
    assert lines[-1] == "  fix: report it: the model refused the warm-up events"
    assert warmup_command.warm is warmup.warm
