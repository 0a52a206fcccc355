"""Checkpoint sizes of the kernel models against their support vectors' bytes.

Each kernel model (defaults, `budget` 200 by default) learns `--records` labelled examples of a
noisy 10-feature Hyperplane stream (seeded; enough to fill every cache), then its checkpoint,
`state.dumps(model.to_state())`, is measured beside its support cache: the support vectors and
their per-vector fields (`_support` and `_slots`, what every kernel model must keep). Models that
recompute a matrix of the cache on restore (the budget SVM's and the kernel MPU's Gram matrix,
the SBP's) leave it out of the checkpoint.

Run: .venv/bin/python benchmarks/checkpoint_sizes.py [--budget 200] [--records 5000]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import streammargin  # noqa: E402
from streammargin import state  # noqa: E402

MODELS = {
    "BudgetPerceptron": lambda budget: streammargin.BudgetPerceptron(budget=budget),
    "KernelALMAClassifier": lambda budget: streammargin.KernelALMAClassifier(budget=budget),
    "BudgetSVMClassifier": lambda budget: streammargin.BudgetSVMClassifier(budget=budget),
    "KernelMPUClassifier": lambda budget: streammargin.KernelMPUClassifier(budget=budget),
}


def stream(n: int, seed: int = 7):
    from river.datasets import synth

    return synth.Hyperplane(seed=seed, n_features=10, noise_percentage=0.1).take(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--records", type=int, default=5000)
    args = parser.parse_args()
    print(f"budget {args.budget}, {args.records} records of 10 features")
    print(f"{'model':24}{'cached':>8}{'checkpoint B':>14}{'support B':>11}{'ratio':>7}")
    for name, make in MODELS.items():
        model = make(args.budget)
        for x, y in stream(args.records):
            model.learn_one(x, y)
        size = len(state.dumps(model.to_state()))
        support = model._support.nbytes + model._slots.nbytes
        print(f"{name:24}{model.support_size:>8}{size:>14,}{support:>11,}{size / support:>7.2f}")


if __name__ == "__main__":
    main()
