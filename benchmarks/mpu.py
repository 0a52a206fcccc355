"""The Margin Perceptron with Unlearning: batch solver against liblinear, online learner against
River, measured in one run.

Prints three tables:
1. Batch (like the paper's Table 2, the 1% accuracy study): `streammargin.mpu.fit_batch(X, y, C,
   epsilon=0.01)` against sklearn's `LinearSVC(loss="hinge", dual=True, fit_intercept=False, C=C,
   tol=1e-6)` (liblinear's dual coordinate descent, the paper's DCD) on standardised data with a
   constant column appended on both sides. J* is liblinear's objective when run to convergence
   (max_iter=10^6); the MPU's dual objective L is a certified lower bound on the true optimum.
   Times are medians of interleaved repeats (numba compiled before timing).
2. Online, progressive validation (StandardScaler | model): MPUClassifier against River's
   PAClassifier (default C = 1, and the best C of a grid, chosen with hindsight) and against the
   same cache without unlearning (the classic margin perceptron), on SEA, Hyperplane and drifting
   streams; the kernel form on Bananas against River's KNN. samples/s include the scaler and the
   evaluation loop; the ratio is to River's PAClassifier in the same run.
3. numba's first-call cost in a fresh process, compiling and with the on-disk cache.

Run: .venv/bin/python benchmarks/mpu.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

C_GRID = (1.0, 0.1, 0.01, 0.001)


# Batch --------------------------------------------------------------------------------------------


def batch_data() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn import datasets, preprocessing

    raw = {}
    X, y = datasets.load_breast_cancer(return_X_y=True)
    raw["breast cancer"] = (X, y == 1)
    X, y = datasets.load_digits(return_X_y=True)
    raw["digits 0 vs rest"] = (X, y == 0)
    raw["digits 8 vs rest"] = (X, y == 8)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20000, 50))
    u = rng.normal(size=50)
    # Gaussian noise on the score, 0.5 ||u||: about 15% of the labels disagree with sign(X u).
    raw["synthetic 20000x50"] = (X, X @ u + 0.5 * np.linalg.norm(u) * rng.normal(size=20000) > 0)
    out = {}
    for name, (X, positive) in raw.items():
        X = preprocessing.StandardScaler().fit_transform(X)
        # The same bias on both sides: a constant column.
        X = np.ascontiguousarray(np.hstack([X, np.ones((len(X), 1))]))
        out[name] = (X, np.where(positive, 1.0, -1.0))
    return out


def liblinear(X, y, C, max_iter=1000):
    from sklearn.svm import LinearSVC

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        svc = LinearSVC(
            loss="hinge", dual=True, fit_intercept=False, C=C, tol=1e-6, max_iter=max_iter
        )
        svc.fit(X, y)
    converged = not any("converge" in str(w.message) for w in caught)
    return svc.coef_[0], converged


def batch_table(repeats: int, Cs: tuple[float, ...]) -> None:
    from streammargin.mpu import fit_batch, objective

    fit_batch(np.eye(3), np.array([1.0, -1.0, 1.0]))  # compile (or load) the numba pass first
    print("Batch L1-SVM, 1% accuracy (paper's Table 2): MPU fit_batch(epsilon=0.01) vs liblinear")
    print("(LinearSVC hinge, dual, no intercept, tol=1e-6, default max_iter=1000; J* = liblinear")
    print(" run to max_iter=10^6; L = the MPU's dual objective, a lower bound on the optimum)")
    header = (
        f"{'data set':<20}{'N x d':>11}{'C':>6}{'J liblinear':>13}{'conv':>5}{'ms':>8}"
        f"{'J*':>12}{'J MPU':>12}{'L MPU':>12}{'(J-J*)/J*':>10}{'eps_aft':>8}{'ms':>8}"
        f"{'t ratio':>8}{'SV lib':>7}{'SV MPU':>7}{'passes':>7}"
    )
    print(header)
    for name, (X, y) in batch_data().items():
        for C in Cs:
            w_star, _ = liblinear(X, y, C, max_iter=1_000_000)
            J_star = objective(w_star, X, y, C)
            times_lib, times_mpu = [], []
            for _ in range(repeats):  # interleaved, so machine load hits both alike
                start = time.perf_counter()
                w_lib, converged = liblinear(X, y, C)
                times_lib.append(time.perf_counter() - start)
                start = time.perf_counter()
                w, info = fit_batch(X, y, C=C, epsilon=0.01)
                times_mpu.append(time.perf_counter() - start)
            t_lib, t_mpu = statistics.median(times_lib), statistics.median(times_mpu)
            J_lib = objective(w_lib, X, y, C)
            J_star = min(J_star, J_lib)
            sv_lib = int(np.count_nonzero(y * (X @ w_lib) <= 1.0 + 1e-9))
            print(
                f"{name:<20}{f'{X.shape[0]}x{X.shape[1]}':>11}{C:>6g}{J_lib:>13.4f}"
                f"{'yes' if converged else 'no':>5}{t_lib * 1e3:>8.1f}{J_star:>12.4f}"
                f"{info['J']:>12.4f}"
                f"{info['dual_objective']:>12.4f}{(info['J'] - J_star) / J_star:>+10.4%}"
                f"{info['epsilon_after']:>8.4f}{t_mpu * 1e3:>8.1f}{t_mpu / t_lib:>7.2f}x"
                f"{sv_lib:>7}{info['support_size']:>7}{info['n_full_passes']:>7}"
            )
    print()


# Online -------------------------------------------------------------------------------------------


def streams(n: int) -> dict:
    from river.datasets import synth

    return {
        "SEA (10% noise)": lambda: synth.SEA(variant=0, noise=0.1, seed=1).take(n),
        "Hyperplane d=10": lambda: synth.Hyperplane(
            seed=1, n_features=10, noise_percentage=0.05
        ).take(n),
        "drift: rotating hyperplane": lambda: synth.Hyperplane(
            seed=1, n_features=10, n_drift_features=5, mag_change=0.01, sigma=0.1,
            noise_percentage=0.05,
        ).take(n),
        "drift: SEA 0 -> 3 abrupt": lambda: synth.ConceptDriftStream(
            synth.SEA(variant=0, seed=1), synth.SEA(variant=3, seed=2), seed=1,
            position=n // 4, width=100,
        ).take(n),
        "drift: SEA 1 -> 2, 10% noise": lambda: synth.ConceptDriftStream(
            synth.SEA(variant=1, noise=0.1, seed=3), synth.SEA(variant=2, noise=0.1, seed=4),
            seed=2, position=n // 2, width=1000,
        ).take(n),
    }


def progressive(stream, model):
    from river import evaluate, metrics, preprocessing

    pipeline = preprocessing.StandardScaler() | model
    start = time.perf_counter()
    accuracy = evaluate.progressive_val_score(stream, pipeline, metrics.Accuracy()).get()
    return accuracy, time.perf_counter() - start


def online_table(n: int) -> None:
    from river import linear_model

    import streammargin

    print(f"Online, progressive validation, StandardScaler | model, {n} samples per stream")
    print(f"{'stream':<30}{'model':<30}{'accuracy':>9}{'samples/s':>11}{'vs PA':>7}"
          f"{'learn':>10}{'unlearn':>9}{'support':>8}{'evicted':>8}")
    progressive(streams(200)["SEA (10% noise)"](), streammargin.MPUClassifier())  # warm numba
    for name, make in streams(n).items():
        rows = []
        pa = {C: progressive(make(), linear_model.PAClassifier(C=C)) for C in C_GRID}
        best_pa = max(C_GRID, key=lambda C: pa[C][0])
        rows.append(("PAClassifier (C=1, default)", *pa[1.0], None))
        rows.append((f"PAClassifier best C={best_pa:g}", *pa[best_pa], None))
        mpu_runs = {}
        for C in C_GRID + (None,):
            model = streammargin.MPUClassifier() if C is None else streammargin.MPUClassifier(C=C)
            mpu_runs[C] = (*progressive(make(), model), model)
        best_mpu = max(C_GRID, key=lambda C: mpu_runs[C][0])
        rows.append(("MPU (default, C=0.01)", *mpu_runs[None]))
        rows.append((f"MPU best C={best_mpu:g}", *mpu_runs[best_mpu]))
        model = streammargin.MPUClassifier(unlearn=False)
        rows.append(("same cache, no unlearning", *progressive(make(), model), model))
        base_rate = n / pa[1.0][1]
        for label, accuracy, seconds, model in rows:
            rate = n / seconds
            counters = ""
            if model is not None:
                c = model.counters
                counters = (f"{c['learning_steps']:>10}{c['unlearning_steps']:>9}"
                            f"{c['support_size']:>8}{c['evictions']:>8}")
            print(f"{name:<30}{label:<30}{accuracy:>9.4f}{rate:>11,.0f}"
                  f"{rate / base_rate:>6.2f}x{counters}")
    print()


def kernel_table() -> None:
    from river import datasets, neighbors

    import streammargin

    print("Kernel form on Bananas (5300 samples, no linear model passes 0.55)")
    print(f"{'model':<42}{'accuracy':>9}{'samples/s':>11}")
    data = list(datasets.Bananas())
    for warm in (streammargin.MPUClassifier(kernel="rbf"), streammargin.MPUClassifier()):
        progressive(data[:100], warm)  # compile / load numba's cache before timing
    for label, model in [
        ("river KNNClassifier (window 1000)", neighbors.KNNClassifier(
            engine=neighbors.SWINN(maxlen=1000))),
        ("MPU rbf C=1 gamma=1 budget=1000", streammargin.MPUClassifier(
            kernel="rbf", C=1.0, gamma=1.0)),
        ("MPU rbf C=1 gamma=1 budget=300", streammargin.MPUClassifier(
            kernel="rbf", C=1.0, gamma=1.0, budget=300)),
        ("MPU linear (default)", streammargin.MPUClassifier()),
    ]:
        accuracy, seconds = progressive(data, model)
        print(f"{label:<42}{accuracy:>9.4f}{len(data) / seconds:>11,.0f}")
    print()


# Warm-up ------------------------------------------------------------------------------------------

WARM_UP = """
import time
start = time.perf_counter()
import streammargin
model = streammargin.MPUClassifier()
model.learn_one({"a": 1.0, "b": 2.0}, True)
model.predict_proba_one({"a": 1.0})
kernel = streammargin.MPUClassifier(kernel="rbf")
kernel.learn_one({"a": 1.0, "b": 2.0}, True)
kernel.predict_proba_one({"a": 1.0})
from streammargin.mpu import fit_batch
import numpy as np
fit_batch(np.eye(3), np.array([1.0, -1.0, 1.0]))
print(time.perf_counter() - start)
"""


def warm_up_table() -> None:
    print("First use in a fresh process (import + first learn/predict of both forms + fit_batch)")
    with tempfile.TemporaryDirectory() as empty_cache:
        fresh = dict(os.environ, NUMBA_CACHE_DIR=empty_cache)
        compiling = subprocess.run([sys.executable, "-c", WARM_UP], env=fresh, capture_output=True,
                                   text=True, check=True).stdout.strip()
    # Fill numba's cache, then time a process that loads it.
    subprocess.run([sys.executable, "-c", WARM_UP], capture_output=True, check=True)
    cached = subprocess.run([sys.executable, "-c", WARM_UP], capture_output=True, text=True,
                            check=True).stdout.strip()
    print(f"compiling: {float(compiling):.1f} s    "
          f"from numba's on-disk cache: {float(cached):.2f} s")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and repeats")
    args = parser.parse_args()
    batch_table(repeats=3 if args.quick else 7, Cs=(1.0,) if args.quick else (1.0, 0.1))
    online_table(n=5000 if args.quick else 20000)
    kernel_table()
    warm_up_table()


if __name__ == "__main__":
    main()
