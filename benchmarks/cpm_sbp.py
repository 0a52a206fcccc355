"""The Convex Polytope Machine and the Stochastic Batch Perceptron against River, in one run.

Every stream is bundled with River or scikit-learn (or generated), so this runs offline. Accuracy
is progressive validation (test-then-train) of StandardScaler | model. Tables:

1. CPM variants (one polytope / separate polytopes / joint polytopes, with and without replay)
   against River's linear and non-linear models on binary streams: it backs the CPM's default.
2. Native multiclass: ImageSegments and sklearn digits against River's linear models.
3. Accuracy against the number of faces K = 1, 2, 5, 10, 20, 50 (the paper's "a large K does
   not overfit") on Bananas and ImageSegments.
4. SBP against River's KNN on the same window, on Bananas and other streams.
5. Throughput: predict_one + learn_one samples/s on dense dicts with 10 features, with the
   ratio to River's LogisticRegression; repetitions are interleaved across models and the median
   is reported, so that load on the (shared) machine hits every model alike.
6. numba's first-call cost of each model: a fresh process compiling, then one loading the cache.

Run: .venv/bin/python benchmarks/cpm_sbp.py [--quick]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np
from common import first_call_costs, time_loop
from river import (
    datasets,
    evaluate,
    linear_model,
    metrics,
    multiclass,
    neighbors,
    preprocessing,
    stream,
    tree,
    utils,
)
from river.datasets import synth
from sklearn import datasets as sk_datasets

import streammargin
from streammargin import ConvexPolytopeClassifier as CPM
from streammargin import SBPClassifier as SBP


def digits():
    return stream.iter_sklearn_dataset(sk_datasets.load_digits(), shuffle=True, seed=42)


def cancer():
    return stream.iter_sklearn_dataset(sk_datasets.load_breast_cancer(), shuffle=True, seed=42)


BINARY = {
    "Bananas": lambda: datasets.Bananas(),
    "Phishing": lambda: datasets.Phishing(),
    "Sine (drift)": lambda: synth.ConceptDriftStream(
        synth.Sine(classification_function=2, seed=7),
        synth.Sine(classification_function=3, seed=8),
        position=4000,
        width=50,
        seed=1,
    ).take(8000),
    "breast cancer": cancer,
}
MULTICLASS = {"ImageSegments": lambda: datasets.ImageSegments(), "digits": digits}


def knn(window: int):
    distance = functools.partial(utils.math.minkowski_distance, p=2)
    return neighbors.KNNClassifier(
        engine=neighbors.LazySearch(window_size=window, dist_func=distance)
    )


def accuracy(data, model) -> float:
    pipeline = preprocessing.StandardScaler() | model
    return evaluate.progressive_val_score(data(), pipeline, metrics.Accuracy()).get()


def table(title: str, streams: dict, models: dict) -> dict:
    print(title)
    names = list(streams)
    print(f"{'model':<34}" + "".join(f"{n:>15}" for n in names) + f"{'seconds':>10}")
    results = {}
    for label, factory in models.items():
        start = time.perf_counter()
        row = [accuracy(streams[n], factory()) for n in names]
        seconds = time.perf_counter() - start
        results[label] = row
        print(f"{label:<34}" + "".join(f"{a:>15.4f}" for a in row) + f"{seconds:>10.1f}")
    print()
    return results


def cpm_variants(quick: bool) -> None:
    streams = {"Bananas": BINARY["Bananas"]} if quick else BINARY
    models = {
        "river LogisticRegression": linear_model.LogisticRegression,
        "river PAClassifier": linear_model.PAClassifier,
        "river Perceptron": linear_model.Perceptron,
        "streammargin ALMA": streammargin.ALMAClassifier,
        "river HoeffdingTree": tree.HoeffdingTreeClassifier,
        "CPM one, steps=1 (paper)": lambda: CPM(polytopes="one", steps=1),
        "CPM separate, steps=1 (paper)": lambda: CPM(polytopes="separate", steps=1),
        "CPM joint, steps=1": lambda: CPM(steps=1),
        "CPM one, steps=4": lambda: CPM(polytopes="one"),
        "CPM separate, steps=4": lambda: CPM(polytopes="separate"),
        "CPM joint, steps=4 (default)": CPM,
        "CPM joint, steps=8": lambda: CPM(steps=8),
        "CPM joint, entropy=0": lambda: CPM(entropy=0.0),
    }
    table("1. CPM variants, binary streams (progressive accuracy, K = 10)", streams, models)


def cpm_multiclass(quick: bool) -> None:
    models = {
        "river SoftmaxRegression": linear_model.SoftmaxRegression,
        "river LogisticRegression OvR": lambda: multiclass.OneVsRestClassifier(
            linear_model.LogisticRegression()
        ),
        "river PAClassifier OvR": lambda: multiclass.OneVsRestClassifier(
            linear_model.PAClassifier()
        ),
        "streammargin ALMA OvR": lambda: multiclass.OneVsRestClassifier(
            streammargin.ALMAClassifier()
        ),
        "CPM joint (default)": CPM,
        "CPM joint, steps=1": lambda: CPM(steps=1),
        "CPM separate": lambda: CPM(polytopes="separate"),
        "CPM one OvR": lambda: multiclass.OneVsRestClassifier(CPM(polytopes="one")),
    }
    if quick:
        models = {k: v for k, v in models.items() if "OvR" not in k or "Logistic" in k}
    table("2. Native multiclass (progressive accuracy, K = 10)", MULTICLASS, models)


def cpm_faces(quick: bool) -> None:
    streams = {"Bananas": BINARY["Bananas"], "ImageSegments": MULTICLASS["ImageSegments"]}
    ks = (1, 2, 5, 10, 20, 50)
    print("3. Accuracy against the number of faces K (progressive accuracy)")
    variants = {"joint": {}, "separate": {"polytopes": "separate"}}
    if quick:
        variants = {"joint": {}}
    columns = [(s, v) for s in streams for v in variants]
    print(f"{'K':<6}" + "".join(f"{s + ' ' + v:>26}" for s, v in columns))
    for k in ks:
        row = [accuracy(streams[s], CPM(n_faces=k, **variants[v])) for s, v in columns]
        print(f"{k:<6}" + "".join(f"{a:>26.4f}" for a in row))
    print()


def sbp_accuracy(quick: bool) -> None:
    streams = {"Bananas": BINARY["Bananas"]}
    if not quick:
        streams["Sine (drift)"] = BINARY["Sine (drift)"]
    models = {
        "river KNN (window 500)": lambda: knn(500),
        "river KNN (window 100)": lambda: knn(100),
        "CPM joint (default)": CPM,
        "SBP default (gamma=1)": SBP,
        "SBP gamma=2, window=500": lambda: SBP(gamma=2.0, window=500),
        "SBP gamma=2, window=300": lambda: SBP(gamma=2.0, window=300),
        "SBP gamma=2, window=100": lambda: SBP(gamma=2.0, window=100),
        "SBP gamma=2, steps=1": lambda: SBP(gamma=2.0, window=500, steps=1),
        "SBP gamma=2, nu=0.02": lambda: SBP(gamma=2.0, window=500, nu=0.02),
        "SBP gamma=2, nu=0.5": lambda: SBP(gamma=2.0, window=500, nu=0.5),
    }
    if quick:
        models = {k: v for k, v in models.items() if "steps" not in k and "nu=" not in k}
    table("4. SBP (progressive accuracy)", streams, models)
    other = {"Phishing": BINARY["Phishing"], "breast cancer": BINARY["breast cancer"]}
    if not quick:
        table(
            "4b. SBP on more features (rbf gamma ~ 1/d)",
            other,
            {
                "river LogisticRegression": linear_model.LogisticRegression,
                "river KNN (window 500)": lambda: knn(500),
                "SBP gamma=0.1": lambda: SBP(gamma=0.1),
                "SBP gamma=0.03": lambda: SBP(gamma=0.03),
            },
        )


def dense_stream(d: int, n: int, seed: int = 0) -> list[tuple[dict, bool]]:
    """XOR-like labels on d Gaussian features: non-linear, so the models keep updating."""
    rng = np.random.default_rng(seed)
    names = [f"x{i}" for i in range(d)]
    X = rng.normal(size=(n, d))
    y = X[:, 0] * X[:, 1] + 0.3 * rng.normal(size=n) > 0
    return [(dict(zip(names, row.tolist())), bool(label)) for row, label in zip(X, y)]


def throughput(quick: bool) -> None:
    repeats = 3 if quick else 5
    fast_n, slow_n = (10_000, 2_000) if quick else (30_000, 5_000)
    factories = {
        "river LogisticRegression": (linear_model.LogisticRegression, fast_n),
        "river Perceptron": (linear_model.Perceptron, fast_n),
        "streammargin ALMA": (streammargin.ALMAClassifier, fast_n),
        "CPM joint K=10 steps=4 (default)": (CPM, fast_n),
        "CPM joint K=10 steps=1": (lambda: CPM(steps=1), fast_n),
        "CPM one K=10 steps=1": (lambda: CPM(polytopes="one", steps=1), fast_n),
        "CPM joint K=50 steps=4": (lambda: CPM(n_faces=50), fast_n),
        "SBP window=500 steps=5": (lambda: SBP(window=500), slow_n),
        "SBP window=100 steps=5": (lambda: SBP(window=100), slow_n),
        "river KNN (window 500)": (lambda: knn(500), slow_n),
    }
    d = 10
    data = dense_stream(d, fast_n + 1000)
    warm, timed = data[:1000], data[1000:]
    rates: dict[str, list[float]] = {name: [] for name in factories}
    for _ in range(repeats):
        for name, (factory, n) in factories.items():
            model = factory()
            time_loop(model, warm)  # warm-up: compile or load the numba caches, fill windows
            rates[name].append(time_loop(model, timed[:n]))
    base = statistics.median(rates["river LogisticRegression"])
    print(f"5. predict_one + learn_one, dense dicts, d = {d}, no scaler "
          f"(samples/s, median of {repeats} interleaved repeats)")
    print(f"{'model':<36}{'samples/s':>12}{'vs river LogReg':>17}")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"{name:<36}{rate:>12,.0f}{rate / base:>16.2f}x")
    print()


def first_call(quick: bool) -> None:
    print("6. first-call cost (seconds; fresh processes, a private numba cache directory)")
    print(f"{'':<62}{'import':>8}{'learn_one+predict':>19}{'learn_many+predict':>20}")
    models = ["ConvexPolytopeClassifier()", 'ConvexPolytopeClassifier(polytopes="one")',
              "SBPClassifier()"]
    for model in models[:1] + models[2:] if quick else models:
        for label, (imported, one, many) in first_call_costs(model).items():
            print(f"{model + ' ' + label:<62}{imported:>8.2f}{one:>19.2f}{many:>20.2f}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer streams, models and repeats")
    parser.add_argument(
        "--only",
        choices=["variants", "multiclass", "faces", "sbp", "throughput", "first-call"],
        default=None,
    )
    args = parser.parse_args()
    sections = {
        "variants": cpm_variants,
        "multiclass": cpm_multiclass,
        "faces": cpm_faces,
        "sbp": sbp_accuracy,
        "throughput": throughput,
        "first-call": first_call,
    }
    for name, section in sections.items():
        if args.only in (None, name):
            section(args.quick)


if __name__ == "__main__":
    main()
