"""connectors/lazy_imports.py: the worker starts without River's data sets, SciPy's stats or
scikit-learn, and they work as usual when used."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_the_worker_imports_no_data_sets_stats_or_scikit_learn():
    out = run("""
        import sys
        import connectors.cli.kafka_command, connectors.worker.worker
        from connectors.observability.metrics import make_detector
        make_detector("ddm")
        from connectors.lazy_imports import is_deferred
        loaded = [m for m in ("sklearn", "river.datasets", "river.stream", "scipy.io",
                              "scipy.optimize") if m in sys.modules]
        print(loaded, is_deferred("scipy.stats"), is_deferred("river.drift.datasets"))
    """)
    assert out == "[] True True"


def test_deferred_modules_are_the_real_ones_once_used():
    out = run("""
        import random
        import connectors.worker.worker
        from connectors.lazy_imports import defer, is_deferred
        from connectors.observability.metrics import make_detector
        detector = make_detector("kswin", {"seed": 3})
        rng = random.Random(0)
        found = []
        for i in range(600):
            detector.update(rng.random() + (i >= 300))
            found += [i] if detector.drift_detected else []
        from river.drift import datasets
        from river import drift
        import scipy.stats
        print(found[:1], is_deferred("scipy.stats"), drift.datasets is datasets,
              datasets.AirlinePassengers.__name__, scipy.stats.norm.cdf(0.0),
              defer("scipy.stats"))
    """)
    # The same detections as River's KSWIN imported the usual way.
    reference = run("""
        import random
        from river import drift
        detector = drift.KSWIN(seed=3)
        rng = random.Random(0)
        found = []
        for i in range(600):
            detector.update(rng.random() + (i >= 300))
            found += [i] if detector.drift_detected else []
        print(found[:1])
    """)
    detections, rest = out.split("] ", 1)
    assert detections + "]" == reference and reference != "[]"
    assert rest == "False True AirlinePassengers 0.5 False"


def test_the_packages_of_connectors_import_no_client_compiler_or_river():
    # A package's __init__ imports nothing heavy: `connectors.cli.errors` or
    # `connectors.task` cost only their own imports.
    out = run("""
        import pathlib, sys
        import connectors
        root = pathlib.Path(connectors.__file__).parent
        for init in sorted(root.glob("*/__init__.py")):
            __import__(f"connectors.{init.parent.name}")
        print(sorted(m for m in ("kafka", "confluent_kafka", "numba", "river", "numpy")
                     if m in sys.modules))
    """)
    assert out == "[]"
