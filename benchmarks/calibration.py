"""The decision rules of the binary models, compared prequentially (StandardScaler | model).

For every example, before learning it, three predictions of the same model are scored:
    sign        decision_one(x) > 0, the paper's decision
    calibrated  predict_proba_one(x)[True] > 0.5, the online Platt scaling's argmax
    served      predict_one(x): whichever of the two made fewer recent errors
plus the log loss of predict_proba_one. See `streammargin/jit/calibration.py`.

Run: .venv/bin/python benchmarks/calibration.py
"""

from __future__ import annotations

import math

from river import datasets, preprocessing
from river.datasets import synth

import streammargin

N = 10_000


def streams():
    yield "SEA", lambda: synth.SEA(seed=42).take(N)
    yield "SEA 10% noise", lambda: synth.SEA(seed=42, noise=0.1).take(N)
    yield "Hyperplane", lambda: synth.Hyperplane(seed=42, n_features=10).take(N)
    yield "Phishing", lambda: datasets.Phishing()
    yield "Agrawal f0", lambda: synth.Agrawal(seed=42, classification_function=0).take(N)
    yield "Agrawal f2", lambda: synth.Agrawal(seed=42, classification_function=2).take(N)
    yield "Bananas", lambda: datasets.Bananas()


MODELS = {
    "ALMA": lambda: streammargin.ALMAClassifier(),
    "MPU": lambda: streammargin.MPUClassifier(),
    "CPM (one)": lambda: streammargin.ConvexPolytopeClassifier(polytopes="one"),
    "SBP": lambda: streammargin.SBPClassifier(window=200),
    "BudgetPerceptron": lambda: streammargin.BudgetPerceptron(),
}


def main() -> None:
    print(f"{'model':<18}{'stream':<15}{'majority':>9}{'sign':>8}{'calibr.':>9}{'served':>8}{'log loss':>10}")
    for model_name, factory in MODELS.items():
        for stream_name, data in streams():
            scaler, model = preprocessing.StandardScaler(), factory()
            hits = {"sign": 0, "calibrated": 0, "served": 0}
            counts: dict = {}
            log_loss, n = 0.0, 0
            for x, y in data():
                scaler.learn_one(x)
                x = scaler.transform_one(x)
                y = bool(y)
                p_true = model.predict_proba_one(x)[True]
                score = model.decision_one(x)  # the CPM's: {True: f(x)}
                hits["sign"] += ((score[True] if isinstance(score, dict) else score) > 0) == y
                hits["calibrated"] += (p_true > 0.5) == y
                hits["served"] += model.predict_one(x) == y
                log_loss -= math.log(max(1e-15, p_true if y else 1.0 - p_true))
                counts[y] = counts.get(y, 0) + 1
                model.learn_one(x, y)
                n += 1
            print(
                f"{model_name:<18}{stream_name:<15}{max(counts.values()) / n:>9.4f}"
                f"{hits['sign'] / n:>8.4f}{hits['calibrated'] / n:>9.4f}{hits['served'] / n:>8.4f}"
                f"{log_loss / n:>10.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
