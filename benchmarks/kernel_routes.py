"""Two routes to a topic-scope kernel model (issue 25), compared on what bounds them: a single
model's progressive accuracy on the stream.

- *Union* (what `--model-scope topic` does): the budget SVM itself; partitions' support sets
  are united with scaled coefficients and cut back by its budget rule (`streammargin.mixing`).
  A single budget SVM is the best a mix of its copies can reach.
- *Random features*: an RBF kernel approximated by D random Fourier features (Rahimi & Recht
  2007: z(x) = sqrt(2 / D) cos(W x + b), W ~ N(0, 2 gamma), b ~ U[0, 2 pi]), and a linear model
  (ALMA, the linear MPU) on z(x). Linear models mix exactly (the mean of their weights), so this
  route's topic scope could only lose what parameter mixing loses, from this single model's
  accuracy down.

The width gamma of the random features is swept around the budget SVM's own estimate
(`gamma="auto"`, printed). Records: the stream's first `--records`, in order.

Run: .venv/bin/python benchmarks/kernel_routes.py [--records 12000] [--dims 256 1024]
     [--gammas 0.5 1 2 4]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
from river import evaluate, metrics

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import partition_learning  # (this folder: the script's own)

import streammargin


def streams(n: int) -> dict[str, list]:
    """RBF drift and the hyperplane of benchmarks/partition_learning.py, labels as booleans."""
    made = partition_learning.streams(n)
    return {name: [(x, bool(y)) for x, y in made[name][0]] for name in ("RBF drift",
                                                                        "Hyperplane 20")}


def accuracy(rows: list, model) -> float:
    return evaluate.progressive_val_score(rows, model, metrics.Accuracy()).get()


def random_features(rows: list, gamma: float, dims: int, seed: int = 0) -> list:
    """The rows mapped through D random Fourier features of the RBF kernel of width gamma."""
    keys = sorted(rows[0][0])
    X = np.array([[x.get(k, 0.0) for k in keys] for x, _ in rows])
    rng = np.random.default_rng(seed)
    W = rng.normal(0.0, np.sqrt(2.0 * gamma), (X.shape[1], dims))
    b = rng.uniform(0.0, 2.0 * np.pi, dims)
    Z = np.sqrt(2.0 / dims) * np.cos(X @ W + b)
    return [({f"z{j}": float(v) for j, v in enumerate(z)}, y) for z, (_, y) in zip(Z, rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=12_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--gammas", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    args = parser.parse_args()
    print(f"progressive accuracy of a single model, {args.records:,} records")
    print(f"{'stream':14} {'route':34} {'accuracy':>8}")
    for name, rows in streams(args.records).items():
        svm = streammargin.BudgetSVMClassifier()
        union = accuracy(rows, svm)
        print(f"{name:14} {'union: budget SVM (gamma_ = ' + f'{svm.gamma_:.2f})':34} {union:8.3f}",
              flush=True)
        best = (0.0, "")
        for gamma in args.gammas:
            for dims in args.dims:
                mapped = random_features(rows, gamma, dims)
                for label, model in (("ALMA", streammargin.ALMAClassifier()),
                                     ("linear MPU", streammargin.LinearMPUClassifier())):
                    score = accuracy(mapped, model)
                    route = f"features g={gamma:g} D={dims}: {label}"
                    best = max(best, (score, route))
                    print(f"{name:14} {route:34} {score:8.3f}", flush=True)
        print(f"{name:14} best random-feature route: {best[1]} {best[0]:.3f}, "
              f"{100 * (best[0] - union):+.1f} points against the union route's bound")


if __name__ == "__main__":
    main()
