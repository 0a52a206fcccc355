"""Run every benchmark in turn (`make bench`); each prints its own tables.

Run: .venv/bin/python benchmarks/run_all.py [--quick]
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).parent
# (script, arguments for a full run, arguments for --quick)
BENCHMARKS = [
    ("alma_throughput.py", [], ["--quick"]),
    ("alma_accuracy.py", [], []),
    ("calibration.py", [], []),
    ("kernel_models.py", [], ["--quick"]),
    ("cpm_sbp.py", [], ["--quick"]),
    ("model_selection.py", [], ["--quick"]),
    ("evaluate_throughput.py", [], ["--records", "20000", "--rounds", "1"]),
    ("evaluate_memory.py", ["--no-tracemalloc"], ["--records", "50000", "--no-tracemalloc"]),
    ("mpu.py", [], ["--quick"]),
    ("kafka_throughput.py", [], ["--records", "20000", "--rounds", "1"]),
    ("record_formats.py", [], ["--records", "20000", "--rounds", "1"]),
    ("cold_start.py", [], ["--models", "alma,budgetsvm"]),
    ("feature_bound_accuracy.py", [], ["--quick"]),
    ("memory_ceiling.py", [], ["--quick"]),
    ("memory_budget.py", [], ["--events", "20000", "--partitions", "1",
                              "--cases", "flood,largest"]),
    ("delayed_label_checkpoints.py", [], ["--events", "30000", "--label-store-size", "10000",
                                          "--restores", "1"]),
    ("drift_detectors.py", [], ["--quick"]),
    ("model_scope_worker.py", [], ["--records", "6000", "--streams", "RBF drift", "SEA",
                                   "--models", "alma", "budgetsvm"]),
    ("topic_scope_sim.py", [], ["--records", "4000", "--streams", "RBF drift"]),
]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    failed = []
    for script, full, fast in BENCHMARKS:
        print(f"\n{'=' * 100}\n{script}\n{'=' * 100}", flush=True)
        start = time.perf_counter()
        code = subprocess.call([sys.executable, str(HERE / script), *(fast if quick else full)])
        print(f"[{script}: exit {code}, {time.perf_counter() - start:.0f} s]", flush=True)
        if code:
            failed.append(script)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
