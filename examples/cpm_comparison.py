"""Kantchelian et al. (2014), Table 1 in spirit: the Convex Polytope Machine against linear models
and kernel models, test error and training time.

The paper trains each model on a training set and reports the test error and the running time:
the CPM reaches accuracy comparable to an RBF-SVM (LibSVM) at a small, constant cost per example,
while linear models cannot fit non-linear data. Here, on bundled data: Bananas (2-d, non-linear),
breast cancer, and the 10-class digits; the streaming models make `EPOCHS` passes over the
training split (the paper's T iterations), standardised features; the batch RBF-SVM is
scikit-learn's SVC (LibSVM, the paper's reference).

Run: .venv/bin/python examples/cpm_comparison.py   (about a minute)
"""

from __future__ import annotations

import time

import numpy as np
from river import linear_model, multiclass, neighbors, preprocessing
from sklearn import datasets
from sklearn.model_selection import train_test_split
from sklearn.svm import SVC

import streammargin

EPOCHS = 3


def data():
    from river import datasets as river_datasets

    rows = list(river_datasets.Bananas())
    X = np.array([[x[k] for k in sorted(x)] for x, _ in rows])
    y = np.array([y for _, y in rows])
    yield "Bananas", X, y, False
    X, y = datasets.load_breast_cancer(return_X_y=True)
    yield "breast cancer", X, y == 1, False
    X, y = datasets.load_digits(return_X_y=True)
    yield "digits (10 classes)", X, y, True


def streaming_models(is_multiclass: bool, n_features: int) -> dict:
    # The RBF width of sklearn's gamma="scale" on standardised data: 1 / n_features. (The kernel
    # models' default gamma = 1 suits a handful of features, like Bananas' two, not 64 pixels.)
    gamma = min(1.0, 1.0 / n_features)

    def ovr(model):
        return multiclass.OneVsRestClassifier(model) if is_multiclass else model

    return {
        "River LogisticRegression": lambda: (
            linear_model.SoftmaxRegression() if is_multiclass else linear_model.LogisticRegression()
        ),
        "ALMA (linear)": lambda: ovr(streammargin.ALMAClassifier()),
        "CPM K=10": lambda: streammargin.ConvexPolytopeClassifier(n_faces=10),
        "CPM K=50": lambda: streammargin.ConvexPolytopeClassifier(n_faces=50),
        "BudgetSVM rbf (200)": lambda: ovr(streammargin.BudgetSVMClassifier(budget=200, gamma=gamma)),
        "River KNN (1000)": lambda: neighbors.KNNClassifier(),
    }


def run_streaming(factory, X_train, y_train, X_test, y_test):
    scaler = preprocessing.StandardScaler()
    model = factory()
    train = [dict(enumerate(x.tolist())) for x in X_train]
    test = [dict(enumerate(x.tolist())) for x in X_test]
    labels = [label.item() if hasattr(label, "item") else label for label in y_train]
    for x in train:
        scaler.learn_one(x)
    train = [scaler.transform_one(x) for x in train]
    test = [scaler.transform_one(x) for x in test]
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(EPOCHS):
        for i in rng.permutation(len(train)):
            model.learn_one(train[i], labels[i])
    seconds = time.perf_counter() - start
    predictions = [model.predict_one(x) for x in test]
    error = float(np.mean([p != t for p, t in zip(predictions, y_test.tolist())]))
    return error, seconds


def run_svc(X_train, y_train, X_test, y_test):
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(X_train)
    start = time.perf_counter()
    svc = SVC(kernel="rbf", C=1.0, gamma="scale").fit(scaler.transform(X_train), y_train)
    seconds = time.perf_counter() - start
    error = float(np.mean(svc.predict(scaler.transform(X_test)) != y_test))
    return error, seconds, int(svc.n_support_.sum())


def main() -> None:
    for name, X, y, is_multiclass in data():
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
        print(f"\n{name}: {len(X_train)} train / {len(X_test)} test, {EPOCHS} epochs")
        print(f"  {'model':<26}{'test error':>11}{'train s':>9}")
        for label, factory in streaming_models(is_multiclass, X.shape[1]).items():
            error, seconds = run_streaming(factory, X_train, y_train, X_test, y_test)
            print(f"  {label:<26}{error:>10.2%}{seconds:>9.2f}")
        error, seconds, n_sv = run_svc(X_train, y_train, X_test, y_test)
        print(f"  {'sklearn SVC rbf (batch)':<26}{error:>10.2%}{seconds:>9.2f}   ({n_sv} SVs)")
    print(
        "\nThe paper (Table 1 and Section 5.3): the CPM's error is comparable to the RBF-SVM's at"
        "\na small constant cost (MNIST one-vs-one: CPM 1.61% in 7m20s, RBF-SVM 1.47% in 6m43s;"
        "\nMNIST8m: CPM 1.03% in 2h3m, RBF-SVM 0.67% in 8 days), linear models are far behind on"
        "\nnon-linear tasks."
    )


if __name__ == "__main__":
    main()
