"""Every model at its defaults, AutoClassifier and River's usual choices, over ten streams.

    .venv/bin/python benchmarks/model_selection.py                  # the models table (~10 min)
    .venv/bin/python benchmarks/model_selection.py --quick          # 2,000 records a stream
    .venv/bin/python benchmarks/model_selection.py --section gamma  # gamma=1 against "auto"
    .venv/bin/python benchmarks/model_selection.py --section defaults  # the defaults' candidates
    .venv/bin/python benchmarks/model_selection.py --section margin  # BudgetPerceptron's margin
    .venv/bin/python benchmarks/model_selection.py --section cost  # AutoClassifier's time per record

Progressive validation (`StandardScaler() | model`, River's `progressive_val_score`) on ten
streams, five of them drifting: a SEA concept change, a 20-feature rotating hyperplane, a drifting
RandomRBF, Sine and Mixed with a concept change (River's generators, fixed seeds, 5,000 records),
Agrawal's function 2, Bananas, Phishing, the wine data set (178 records, 3 classes, shuffled:
scikit-learn's copy is sorted by class) and ImageSegments (2,310 records, 7 classes). Binary
models on the multiclass streams run one-vs-rest (ours: `streammargin.OneVsRestClassifier`,
River's: `river.multiclass.OneVsRestClassifier`); the CPM and AutoClassifier take the labels as
they are. The table gives each model's accuracy per stream and its mean rank (1 = best; ties
share the mean of their ranks), and AutoClassifier's distance to the best of its portfolio run
alone (ALMA, the CPM and the budget SVM; the binary members one-vs-rest on multiclass streams,
as AutoClassifier runs them up to `max_ovr_classes`, 10) and to the best member as it ran
inside AutoClassifier (its progressive accuracy there, `scores` with a window longer than the
stream). Accuracy only, but for `--section cost`: AutoClassifier's time per record against the
sum of its members' run alone (issue 15: at most that sum plus 10%), the contenders taking turns
on chunks of the same stream so that the machine's load hits them alike.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from river import (
    datasets,
    evaluate,
    forest,
    linear_model,
    metrics,
    multiclass,
    neighbors,
    preprocessing,
    stream,
    tree,
)
from river.datasets import synth

import streammargin as sm


def wine():
    from sklearn.datasets import load_wine

    X, y = load_wine(return_X_y=True, as_frame=True)
    rows = list(stream.iter_frame(X, y))
    random.Random(0).shuffle(rows)
    return rows


def streams(n: int) -> dict:
    """name -> (list of (x, y), multiclass)."""
    half = n // 2
    made = {
        "SEA drift": synth.ConceptDriftStream(
            synth.SEA(variant=0, seed=1), synth.SEA(variant=2, seed=2), position=half,
            width=n // 10, seed=1,
        ).take(n),
        "Hyperplane 20": synth.Hyperplane(
            seed=42, n_features=20, n_drift_features=10, mag_change=0.001
        ).take(n),
        "RBF drift": synth.RandomRBFDrift(
            seed_model=7, seed_sample=7, n_classes=2, n_features=10, n_centroids=50,
            change_speed=0.001,
        ).take(n),
        "Sine": synth.ConceptDriftStream(
            synth.Sine(0, seed=1), synth.Sine(1, seed=2), position=half, width=50, seed=1
        ).take(n),
        "Mixed": synth.ConceptDriftStream(
            synth.Mixed(0, seed=1), synth.Mixed(1, seed=2), position=half, width=50, seed=1
        ).take(n),
        "Agrawal 2": synth.Agrawal(classification_function=2, seed=42).take(n),
        "Bananas": datasets.Bananas().take(n),
        "Phishing": datasets.Phishing(),
        "wine": wine(),
        "ImageSegments": datasets.ImageSegments(),
    }
    out = {}
    for name, rows in made.items():
        rows = list(rows)
        labels = {y for _, y in rows}
        out[name] = (rows, len(labels) > 2 or not labels <= {True, False, 0, 1})
    return out


PORTFOLIO = ("ALMA", "CPM", "BudgetSVM")


def models(multiclass_stream: bool):
    """(name, model) pairs, built fresh for a stream."""

    def ours(model):
        return sm.OneVsRestClassifier(model) if multiclass_stream else model

    def rivers(model):
        return multiclass.OneVsRestClassifier(model) if multiclass_stream else model

    yield "AutoClassifier", sm.AutoClassifier()
    yield "ALMA", ours(sm.ALMAClassifier())
    yield "CPM", sm.ConvexPolytopeClassifier()
    yield "BudgetSVM", ours(sm.BudgetSVMClassifier())
    yield "BudgetPerceptron", ours(sm.BudgetPerceptron())
    yield "KernelALMA", ours(sm.KernelALMAClassifier())
    yield "MPU", ours(sm.MPUClassifier())
    yield "MPU(rbf)", ours(sm.MPUClassifier(kernel="rbf"))
    yield "SBP", ours(sm.SBPClassifier())
    yield "river LogisticRegression", rivers(linear_model.LogisticRegression())
    yield "river PAClassifier", rivers(linear_model.PAClassifier())
    yield "river HoeffdingAdaptiveTree", tree.HoeffdingAdaptiveTreeClassifier(seed=42)
    yield "river KNN(window 1000)", neighbors.KNNClassifier(
        engine=neighbors.LazySearch(window_size=1000)
    )
    yield "river ARF(10)", forest.ARFClassifier(n_models=10, seed=42)


def accuracy(rows, model) -> float:
    pipeline = preprocessing.StandardScaler() | model
    return evaluate.progressive_val_score(rows, pipeline, metrics.Accuracy()).get()


def mean_ranks(table: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean over streams of each model's rank (1 = most accurate; ties share their mean rank)."""
    ranks: dict[str, list[float]] = {}
    stream_names = next(iter(table.values())).keys()
    for name in stream_names:
        scores = sorted(((row[name], model) for model, row in table.items()), reverse=True)
        i = 0
        while i < len(scores):
            j = i
            while j + 1 < len(scores) and scores[j + 1][0] == scores[i][0]:
                j += 1
            for k in range(i, j + 1):
                ranks.setdefault(scores[k][1], []).append((i + j) / 2 + 1)
            i = j + 1
    return {model: sum(r) / len(r) for model, r in ranks.items()}


def section_models(n: int) -> int:
    data = streams(n)
    table: dict[str, dict[str, float]] = {}
    inside: dict[str, dict[str, float]] = {}  # stream -> member -> accuracy inside Auto
    for stream_name, (rows, is_multiclass) in data.items():
        for model_name, model in models(is_multiclass):
            table.setdefault(model_name, {})[stream_name] = accuracy(rows, model)
        auto = sm.AutoClassifier(window=10**9)  # scores = plain progressive accuracy
        accuracy(rows, auto)
        inside[stream_name] = {
            name: score for name, score in zip(PORTFOLIO, auto.scores.values())
            if score is not None
        }
        print(f"[{stream_name}: {len(rows)} records done]", file=sys.stderr, flush=True)
    ranks = mean_ranks(table)
    short = {name: name[:9] for name in data}
    print(f"## Progressive accuracy, StandardScaler() | model, defaults ({n:,} records a "
          "synthetic stream)\n")
    print("| model | " + " | ".join(short.values()) + " | mean rank |")
    print("| --- | " + " | ".join("---:" for _ in data) + " | ---: |")
    for model_name in sorted(table, key=ranks.get):
        cells = " | ".join(f"{table[model_name][s]:.3f}" for s in data)
        print(f"| {model_name} | {cells} | {ranks[model_name]:.2f} |")
    print("\n## AutoClassifier against its portfolio (accuracy points)\n")
    print("| stream | AutoClassifier | best member run alone (one-vs-rest on multiclass) | "
          "difference | best member as run inside it | difference |")
    print("| --- | ---: | --- | ---: | --- | ---: |")
    failures = 0
    for stream_name in data:
        auto = table["AutoClassifier"][stream_name]
        best_alone = max(PORTFOLIO, key=lambda m: table[m][stream_name])
        best_inside = max(inside[stream_name], key=inside[stream_name].get)
        diff_alone = 100 * (auto - table[best_alone][stream_name])
        diff_inside = 100 * (auto - inside[stream_name][best_inside])
        failures += diff_alone < -1.0
        print(f"| {stream_name} | {auto:.3f} | {best_alone} {table[best_alone][stream_name]:.3f}"
              f" | {diff_alone:+.1f} | {best_inside} {inside[stream_name][best_inside]:.3f} | "
              f"{diff_inside:+.1f} |")
    river_best = min(ranks[m] for m in ranks if m.startswith("river "))
    print(f"\nAutoClassifier mean rank {ranks['AutoClassifier']:.2f}; best River model's "
          f"{river_best:.2f}; streams where it is more than 1 point below its portfolio's best: "
          f"{failures}")
    return 0


def kernel_models(gamma):
    yield "BudgetPerceptron", sm.BudgetPerceptron(gamma=gamma)
    yield "KernelALMA", sm.KernelALMAClassifier(gamma=gamma)
    yield "BudgetSVM", sm.BudgetSVMClassifier(gamma=gamma)
    yield "MPU(rbf)", sm.MPUClassifier(kernel="rbf", gamma=gamma)
    yield "SBP", sm.SBPClassifier(gamma=gamma)


def binary_streams(n: int) -> dict:
    return {name: rows for name, (rows, multi) in streams(n).items() if not multi}


def section_gamma(n: int) -> int:
    """Each kernel model at its defaults with the former fixed width (gamma=1) and "auto"."""
    data = binary_streams(n)
    print("## Kernel width: gamma=1 (the former default) against gamma=\"auto\"\n")
    print("| model | gamma | " + " | ".join(s[:9] for s in data) + " | mean |")
    print("| --- | --- | " + " | ".join("---:" for _ in data) + " | ---: |")
    for gamma in (1.0, "auto"):
        for name, model in kernel_models(gamma):
            row = [accuracy(rows, model.clone()) for rows in data.values()]
            cells = " | ".join(f"{a:.3f}" for a in row)
            print(f"| {name} | {gamma} | {cells} | {sum(row) / len(row):.4f} |", flush=True)
    return 0


def section_defaults(n: int) -> int:
    """The candidates the defaults were chosen among (gamma "auto" everywhere)."""
    candidates = {
        "KernelALMA oldest, alpha 0.9 (former)": sm.KernelALMAClassifier(
            eviction="oldest", alpha=0.9),
        "KernelALMA oldest, alpha 0.5": sm.KernelALMAClassifier(eviction="oldest"),
        "KernelALMA merge, alpha 0.5 (default)": sm.KernelALMAClassifier(),
        "BudgetPerceptron oldest (former)": sm.BudgetPerceptron(eviction="oldest", margin=0.0),
        "BudgetPerceptron merge, margin 0 (former)": sm.BudgetPerceptron(margin=0.0),
        "BudgetPerceptron merge, margin 1 (default)": sm.BudgetPerceptron(),
        "BudgetSVM budget 200 (former)": sm.BudgetSVMClassifier(budget=200),
        "BudgetSVM budget 400": sm.BudgetSVMClassifier(budget=400),
        "BudgetSVM budget 500 (default)": sm.BudgetSVMClassifier(),
        "BudgetSVM C 10": sm.BudgetSVMClassifier(C=10.0),
        "MPU linear C 0.01 (auto)": sm.MPUClassifier(C=0.01),
        "MPU linear C 0.1": sm.MPUClassifier(C=0.1),
        "MPU linear C 1": sm.MPUClassifier(C=1.0),
        "MPU rbf C 0.01 (former)": sm.MPUClassifier(kernel="rbf", C=0.01),
        "MPU rbf C 0.1": sm.MPUClassifier(kernel="rbf", C=0.1),
        "MPU rbf C 1 (auto)": sm.MPUClassifier(kernel="rbf", C=1.0),
        "MPU rbf C 10": sm.MPUClassifier(kernel="rbf", C=10.0),
        "MPU linear replay 4 (former)": sm.MPUClassifier(replay=4),
        "MPU linear replay 16 (default)": sm.MPUClassifier(),
        "MPU rbf replay 4 (former)": sm.MPUClassifier(kernel="rbf", replay=4),
        "MPU rbf replay 8": sm.MPUClassifier(kernel="rbf", replay=8),
        "MPU rbf replay 16 (default)": sm.MPUClassifier(kernel="rbf"),
        "SBP nu 0.1, window 500 (former)": sm.SBPClassifier(window=500),
        "SBP nu 1, window 500": sm.SBPClassifier(nu=1.0, window=500),
        "SBP nu 0.01, window 500": sm.SBPClassifier(nu=0.01, window=500),
        "SBP window 200": sm.SBPClassifier(window=200),
        "SBP window 1000": sm.SBPClassifier(window=1000),
        "SBP window 1250 (default)": sm.SBPClassifier(),
    }
    data = binary_streams(n)
    print("## Candidate defaults (gamma=\"auto\")\n")
    print("| model | " + " | ".join(s[:9] for s in data) + " | mean |")
    print("| --- | " + " | ".join("---:" for _ in data) + " | ---: |")
    for name, model in candidates.items():
        row = [accuracy(rows, model.clone()) for rows in data.values()]
        cells = " | ".join(f"{a:.3f}" for a in row)
        print(f"| {name} | {cells} | {sum(row) / len(row):.4f} |", flush=True)
    return 0


def section_margin(n: int) -> int:
    """BudgetPerceptron's update condition y f(x) <= margin (0: mistakes only) at its other
    defaults, on all ten streams (one-vs-rest on the multiclass ones, as in the models table)."""
    candidates = {
        "margin 0": {"margin": 0.0},
        "margin 0.25": {"margin": 0.25},
        "margin 0.5": {"margin": 0.5},
        "margin 1": {"margin": 1.0},
        "margin 2": {"margin": 2.0},
        "margin 0, average": {"margin": 0.0, "average": True},
        "margin 1, average": {"margin": 1.0, "average": True},
        "margin 1, budget 500": {"margin": 1.0, "budget": 500},
        "random, margin 0": {"eviction": "random", "seed": 1, "margin": 0.0},
        "random, margin 1": {"eviction": "random", "seed": 1, "margin": 1.0},
        "oldest, margin 0": {"eviction": "oldest", "margin": 0.0},
        "oldest, margin 1": {"eviction": "oldest", "margin": 1.0},
        "smallest, margin 0": {"eviction": "smallest", "margin": 0.0},
        "smallest, margin 1": {"eviction": "smallest", "margin": 1.0},
        "project, margin 0": {"eviction": "project", "margin": 0.0},
        "project, margin 1 (Projectron++)": {"eviction": "project", "margin": 1.0},
        "project + average, margin 0": {"eviction": "project", "average": True, "margin": 0.0},
        "project + average, margin 1": {"eviction": "project", "average": True, "margin": 1.0},
    }
    data = streams(n)
    print("## BudgetPerceptron: the margin of its update condition (gamma=\"auto\", budget 200, "
          "eviction \"merge\" unless named)\n")
    print("| candidate | " + " | ".join(s[:9] for s in data) + " | mean |")
    print("| --- | " + " | ".join("---:" for _ in data) + " | ---: |")
    for name, params in candidates.items():
        row = []
        for rows, is_multiclass in data.values():
            model = sm.BudgetPerceptron(**params)
            row.append(accuracy(rows, sm.OneVsRestClassifier(model) if is_multiclass else model))
        cells = " | ".join(f"{a:.3f}" for a in row)
        print(f"| {name} | {cells} | {sum(row) / len(row):.4f} |", flush=True)
    return 0


def scaled_stream(rows) -> list[tuple[dict, dict, object]]:
    """(x scaled for the prediction, x scaled for learning, y): River's StandardScaler as a
    pipeline applies it (before and after learning x), computed once so that no contender's
    time includes a scaler."""
    scaler = preprocessing.StandardScaler()
    out = []
    for x, y in rows:
        before = scaler.transform_one(x)
        scaler.learn_one(x)
        out.append((before, scaler.transform_one(x), y))
    return out


def section_cost(n: int, chunk: int = 250, min_records: int = 2000) -> int:
    """AutoClassifier's predict_one + learn_one time per record against the sum of its members'
    run alone (the binary ones one-vs-rest on multiclass streams, as inside it)."""
    data = streams(n)
    print(f"## AutoClassifier's cost: predict_one + learn_one, us per record ({n:,} records a "
          f"synthetic stream; the contenders take turns on chunks of {chunk}, a shorter stream "
          f"than {min_records:,} records runs again with fresh models up to that many)\n")
    print("| stream | AutoClassifier | ALMA | CPM | BudgetSVM | members' sum | Auto / sum |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst = 0.0
    for stream_name, (rows, is_multiclass) in data.items():
        scaled = scaled_stream(rows)

        def contenders():
            def ours(model):
                return sm.OneVsRestClassifier(model) if is_multiclass else model

            return {"AutoClassifier": sm.AutoClassifier(), "ALMA": ours(sm.ALMAClassifier()),
                    "CPM": sm.ConvexPolytopeClassifier(),
                    "BudgetSVM": ours(sm.BudgetSVMClassifier())}

        for model in contenders().values():  # compile or load every path first
            for before, after, y in scaled[:200]:
                model.predict_one(before)
                model.learn_one(after, y)
        # A stream shorter than `min_records` runs again with fresh models until the runs add up
        # to that many records (wine: 178 records, one chunk, and a model's one-off costs at its
        # first records and labels are most of its time); the contender that goes first changes
        # from chunk to chunk (the first after the warm-up pays for the heap's growth).
        passes = max(1, -(-min_records // len(scaled)))
        seconds = dict.fromkeys(contenders(), 0.0)
        turn = 0
        for _ in range(passes):
            models = contenders()
            for start in range(0, len(scaled), chunk):
                part = scaled[start : start + chunk]
                names = list(models)
                turn += 1
                for name in names[turn % len(names):] + names[: turn % len(names)]:
                    model = models[name]
                    started = time.perf_counter()
                    for before, after, y in part:
                        model.predict_one(before)
                        model.learn_one(after, y)
                    seconds[name] += time.perf_counter() - started
        us = {name: 1e6 * s / (passes * len(scaled)) for name, s in seconds.items()}
        total = us["ALMA"] + us["CPM"] + us["BudgetSVM"]
        ratio = us["AutoClassifier"] / total
        worst = max(worst, ratio)
        print(f"| {stream_name} | {us['AutoClassifier']:.1f} | {us['ALMA']:.1f} | {us['CPM']:.1f}"
              f" | {us['BudgetSVM']:.1f} | {total:.1f} | {ratio:.2f}x |", flush=True)
    print(f"\nlargest Auto / sum: {worst:.2f}x (target: at most 1.10x)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 records a synthetic stream")
    parser.add_argument(
        "--section", choices=["models", "gamma", "defaults", "margin", "cost"], default="models"
    )
    args = parser.parse_args()
    n = 2000 if args.quick else 5000
    sections = {
        "models": section_models,
        "gamma": section_gamma,
        "defaults": section_defaults,
        "margin": section_margin,
        "cost": section_cost,
    }
    return sections[args.section](n)


if __name__ == "__main__":
    sys.exit(main())
