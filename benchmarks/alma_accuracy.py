"""Progressive accuracy of ALMAClassifier against River's linear models (StandardScaler | model).

Every stream is bundled with River or scikit-learn or generated, so this runs offline.
Run: .venv/bin/python benchmarks/alma_accuracy.py
"""

from __future__ import annotations

from river import datasets, evaluate, linear_model, metrics, preprocessing, stream
from river.datasets import synth
from sklearn import datasets as sk_datasets

import streammargin

N = 10_000  # records taken from each generator


def streams():
    yield "Phishing", lambda: datasets.Phishing()
    yield "SEA", lambda: synth.SEA(seed=42).take(N)
    yield "Hyperplane", lambda: synth.Hyperplane(seed=42, n_features=10).take(N)
    for f in (0, 1, 2, 4):
        yield f"Agrawal f{f}", lambda f=f: synth.Agrawal(classification_function=f, seed=42).take(N)
    yield "breast cancer", lambda: stream.iter_sklearn_dataset(
        sk_datasets.load_breast_cancer(), shuffle=True, seed=42
    )


MODELS = {
    "river ALMA": lambda: linear_model.ALMAClassifier(),
    "river PA": lambda: linear_model.PAClassifier(),
    "river LogReg": lambda: linear_model.LogisticRegression(),
    "ALMA": lambda: streammargin.ALMAClassifier(),
    "ALMA last": lambda: streammargin.ALMAClassifier(average=False),
    "ALMA a=0.5": lambda: streammargin.ALMAClassifier(alpha=0.5),
    "ALMA p=4": lambda: streammargin.ALMAClassifier(p=4.0),
}


def majority(data) -> float:
    counts: dict = {}
    for _, y in data():
        counts[y] = counts.get(y, 0) + 1
    return max(counts.values()) / sum(counts.values())


def main() -> None:
    names = list(MODELS)
    print("progressive accuracy (log loss below), StandardScaler | model")
    print(f"{'stream':<15}{'majority':>9}" + "".join(f"{n:>13}" for n in names))
    for stream_name, data in streams():
        accuracy, log_loss = [], []
        for factory in MODELS.values():
            acc = evaluate.progressive_val_score(
                data(), preprocessing.StandardScaler() | factory(), metrics.Accuracy()
            ).get()
            loss = evaluate.progressive_val_score(
                data(), preprocessing.StandardScaler() | factory(), metrics.LogLoss()
            ).get()
            accuracy.append(acc)
            log_loss.append(loss)
        print(f"{stream_name:<15}{majority(data):>9.4f}" + "".join(f"{a:>13.4f}" for a in accuracy))
        print(f"{'':<24}" + "".join(f"{loss:>13.3f}" for loss in log_loss))


if __name__ == "__main__":
    main()
