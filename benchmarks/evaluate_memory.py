"""Memory of `streammargin evaluate` along a long libsvm or ARFF stream: flat, whatever its length.

Writes a stream of `--records` records (default 1,000,000; 20 of 1,000 features a record, a
+1/-1 label from a noisy linear rule) as a libsvm file or a sparse ARFF file, optionally
gzip-compressed, then runs the whole command on it in this process:

    streammargin evaluate --model alma --model river.linear_model.Perceptron --<format> FILE
        --window 10000 --output results.csv

and samples, every tenth of the stream: the records read, the process's resident memory
(RSS, /proc/self/statm) and the Python heap that tracemalloc traces (current; its peak at the
end). The survey's read (its first records whole, the labels of the rest) is sampled as it ends.
Memory must not grow with the records read: the table ends with the growth from the first
sample to the last.

Run: .venv/bin/python benchmarks/evaluate_memory.py [--records 1000000] [--format libsvm|arff]
     [--gzip] [--no-tracemalloc]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import os
import pathlib
import random
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

N_FEATURES = 1000
PER_RECORD = 20


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def write_stream(path: pathlib.Path, n: int, kind: str, packed: bool, seed: int = 3) -> None:
    rng = random.Random(seed)
    weights = [rng.gauss(0, 1) for _ in range(N_FEATURES)]
    opener = gzip.open if packed else open
    with opener(path, "wt") as file:
        if kind == "arff":
            file.write("@relation memory\n")
            for i in range(N_FEATURES):
                file.write(f"@attribute f{i} numeric\n")
            file.write("@attribute class {-1, +1}\n@data\n")
        for _ in range(n):
            columns = sorted(rng.sample(range(N_FEATURES), PER_RECORD))
            values = [rng.gauss(0, 1) for _ in columns]
            score = sum(weights[c] * v for c, v in zip(columns, values)) + rng.gauss(0, 1)
            label = "+1" if score > 0 else "-1"
            if kind == "arff":
                pairs = ", ".join(f"{c} {v:.5f}" for c, v in zip(columns, values))
                file.write(f"{{{pairs}, {N_FEATURES} {label}}}\n")
            else:
                pairs = " ".join(f"{c + 1}:{v:.5f}" for c, v in zip(columns, values))
                file.write(f"{label} {pairs}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("libsvm", "arff"), default="libsvm")
    parser.add_argument("--gzip", action="store_true")
    parser.add_argument("--no-tracemalloc", action="store_true")
    args = parser.parse_args()

    from connectors.cli import evaluate_command, main as cli
    from connectors.evaluate import runner, sources

    samples: list[tuple[str, int, float, float]] = []
    tracing = not args.no_tracemalloc

    def sample(label: str, done: int) -> None:
        heap = tracemalloc.get_traced_memory()[0] / 2**20 if tracing else float("nan")
        samples.append((label, done, rss_mib(), heap))

    every = max(1, args.records // 10)
    original_evaluate, original_survey = runner.evaluate, sources.survey

    def sampled_evaluate(*a, on_progress=None, **k):
        def progress(done: int) -> None:
            if done % every == 0:
                sample("run", done)
            if on_progress is not None:
                on_progress(done)

        return original_evaluate(*a, on_progress=progress, **k)

    def sampled_survey(*a, **k):
        found = original_survey(*a, **k)
        sample("survey", found.n_records)
        return found

    evaluate_command.runner.evaluate = sampled_evaluate
    evaluate_command.sources.survey = sampled_survey
    with tempfile.TemporaryDirectory() as folder:
        suffix = {"libsvm": ".svm", "arff": ".arff"}[args.format] + (".gz" if args.gzip else "")
        path = pathlib.Path(folder) / f"stream{suffix}"
        start = time.perf_counter()
        write_stream(path, args.records, args.format, args.gzip)
        print(f"{args.records:,} records ({PER_RECORD} of {N_FEATURES} features each), "
              f"{args.format}{' gzip' if args.gzip else ''}, {path.stat().st_size / 2**20:.0f} "
              f"MiB, written in {time.perf_counter() - start:.0f} s")
        if tracing:
            tracemalloc.start()
        sample("start", 0)
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = cli(["evaluate", "--model", "alma", "--model", "river.linear_model.Perceptron",
                        f"--{args.format}", str(path), "--window", "10000",
                        "--output", str(pathlib.Path(folder) / "results.csv")])
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] / 2**20 if tracing else float("nan")
        sample("end", args.records)
        if code != 0:
            print(out.getvalue())
            return code
    print(f"evaluate: {seconds:.0f} s ({args.records / seconds:,.0f} records/s"
          f"{', under tracemalloc' if tracing else ''}); its table:")
    print("\n".join("    " + line for line in out.getvalue().strip().splitlines()[2:6]))
    print()
    print(f"{'point':<8} {'records':>10} {'RSS MiB':>9} {'traced MiB':>11}")
    for label, done, rss, heap in samples:
        print(f"{label:<8} {done:>10,} {rss:>9.1f} {heap:>11.2f}")
    runs = [s for s in samples if s[0] == "run"]
    if len(runs) >= 2:
        first, last = runs[0], runs[-1]
        print(f"growth from {first[1]:,} to {last[1]:,} records: RSS {last[2] - first[2]:+.1f} MiB"
              + (f", traced {last[3] - first[3]:+.2f} MiB; tracemalloc's peak {peak:.1f} MiB"
                 if tracing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
