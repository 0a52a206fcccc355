"""Records/s of `streammargin evaluate` against River's `progressive_val_score`, on one CSV file.

The file: 10 numeric features (Gaussian) and a 0/1 label from a noisy linear rule, written
once into a temporary folder. The contenders, the same file read from disk each time:

- `streammargin evaluate --model alma --csv FILE --target label`: the whole command in this
  process (its output discarded): the survey (labels, text columns), reading and checking every
  record, ALMA behind its StandardScaler, every measure (accuracy, kappa, kappa-M, kappa-T, log
  loss, AUC per window, macro F1), time and memory per window;
- River: `progressive_val_score(stream.iter_csv(FILE, converters=float...), StandardScaler() |
  linear_model.ALMAClassifier(), metrics.Accuracy())`, River's own ALMA and its simplest use;
- the same two without a scaler (`--no-scale`; River's ALMA alone).

They take turns, round after round (the machine's speed drifts by tens of percent over
seconds; each round runs every contender once, in a rotated order), and the table gives each
one's median records/s and the median of the per-round ratios, by wall time and by the
process's CPU time (steadier where other processes share the cores). Issue 48's target:
evaluate at least 2x River's rate.

Run: .venv/bin/python benchmarks/evaluate_throughput.py [--records 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pathlib
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))


def write_csv(path: pathlib.Path, n: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    weights = [rng.gauss(0, 1) for _ in range(10)]
    with open(path, "w") as file:
        file.write(",".join(f"x{i}" for i in range(10)) + ",label\n")
        for _ in range(n):
            x = [rng.gauss(0, 1) for _ in range(10)]
            y = sum(w * v for w, v in zip(weights, x)) + rng.gauss(0, 0.5) > 0
            file.write(",".join(f"{v:.6f}" for v in x) + f",{int(y)}\n")


def ours(path: pathlib.Path, scale: bool) -> tuple[float, float]:
    from connectors.cli import main

    args = ["evaluate", "--model", "alma", "--csv", str(path), "--target", "label"]
    if not scale:
        args.append("--no-scale")
    start, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(args)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if code != 0:
        raise SystemExit(f"evaluate failed: {out.getvalue()}")
    return seconds, cpu


def rivers(path: pathlib.Path, scale: bool) -> tuple[float, float]:
    from river import evaluate, linear_model, metrics, preprocessing, stream

    converters = {f"x{i}": float for i in range(10)}
    converters["label"] = int
    model = linear_model.ALMAClassifier()
    if scale:
        model = preprocessing.StandardScaler() | model
    start, cpu = time.perf_counter(), time.process_time()
    data = stream.iter_csv(str(path), target="label", converters=converters)
    evaluate.progressive_val_score(data, model, metrics.Accuracy())
    return time.perf_counter() - start, time.process_time() - cpu


CONTENDERS = {
    "streammargin evaluate (scaled ALMA)": lambda path: ours(path, True),
    "River progressive_val_score (scaled ALMA)": lambda path: rivers(path, True),
    "streammargin evaluate --no-scale": lambda path: ours(path, False),
    "River progressive_val_score (ALMA)": lambda path: rivers(path, False),
}
PAIRS = [("streammargin evaluate (scaled ALMA)", "River progressive_val_score (scaled ALMA)"),
         ("streammargin evaluate --no-scale", "River progressive_val_score (ALMA)")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "ten_features.csv"
        write_csv(path, args.records)
        print(f"{args.records:,} records, 10 features, {path.stat().st_size / 1e6:.1f} MB; "
              f"{args.rounds} rounds, the contenders taking turns")
        warm = pathlib.Path(folder) / "warm.csv"
        write_csv(warm, 2_000)
        for contender in CONTENDERS.values():  # imports and compiled code loaded first, once
            contender(warm)
        seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in CONTENDERS}
        names = list(CONTENDERS)
        for round_ in range(args.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                seconds[name].append(CONTENDERS[name](path))
        for clock, column in (("wall", 0), ("CPU", 1)):
            print()
            print(f"{'records/s (' + clock + ' time)':<44} {'median':>10} {'min':>10} {'max':>10}")
            for name, times in seconds.items():
                rates = [args.records / t[column] for t in times]
                print(f"{name:<44} {statistics.median(rates):>10,.0f} {min(rates):>10,.0f} "
                      f"{max(rates):>10,.0f}")
            print(f"{'ratio to River (' + clock + ' time), per round':<60} {'median':>7} "
                  f"{'min':>6} {'max':>6}")
            for ours_name, theirs in PAIRS:
                ratios = [b[column] / a[column]
                          for a, b in zip(seconds[ours_name], seconds[theirs])]
                print(f"{ours_name:<60} {statistics.median(ratios):>6.2f}x "
                      f"{min(ratios):>5.2f}x {max(ratios):>5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
