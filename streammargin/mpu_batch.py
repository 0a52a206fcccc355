"""The Margin Perceptron with Unlearning (Panagiotakopoulos & Tsampouka 2010): the paper's batch
L1-SVM solver, `fit_batch`, on numpy arrays.

The online learner is `streammargin.mpu`; both apply the rule of `streammargin.jit.mpu.rule`.
"""

from __future__ import annotations

import math
import typing

import numpy as np

from streammargin.base import binary_targets
from streammargin.jit import mpu as mpu_jit

__all__ = ["fit_batch", "objective", "dual_objective"]


def objective(w: np.ndarray, X: np.ndarray, y: np.ndarray, C: float) -> float:
    """J(w, C) = 1/2 ||w||^2 + C sum_k max(0, 1 - y_k w . x_k), the L1-SVM primal objective."""
    margins = np.asarray(y, dtype=np.float64) * (np.asarray(X, dtype=np.float64) @ w)
    return float(0.5 * w @ w + C * np.maximum(0.0, 1.0 - margins).sum())


def dual_objective(alpha: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """L(alpha) = sum_k alpha_k - 1/2 ||sum_k alpha_k y_k x_k||^2, for 0 <= alpha_k <= C a lower
    bound on min_w J(w, C) (weak duality)."""
    v = np.asarray(X, dtype=np.float64).T @ (alpha * np.asarray(y, dtype=np.float64))
    return float(alpha.sum() - 0.5 * v @ v)


def _exact_bounds(X, y, counts, a, b, C) -> tuple[float, float, float]:
    """Set a = sum_k I_k z_k exactly (the bound must use the weights the counts stand for) and
    return J(a / b, C), L(I / b) and the after-run accuracy J / L - 1 (eq. 24)."""
    a[:] = X.T @ (counts * y)
    J = objective(a / b, X, y, C)
    L = dual_objective(counts / b, X, y)
    return J, L, (J / L - 1.0 if L > 0 else math.inf)


def fit_batch(
    X: typing.Any,
    y: typing.Any,
    C: float = 1.0,
    epsilon: float = 0.01,
    *,
    epsilon_before: float | None = None,
    gap: float = 3.0,
    c: float = 1.01,
    n_epochs_1: int = 3,
    n_epochs_2: int = 10,
    max_full_passes: int = 10_000,
    seed: int = 0,
) -> tuple[np.ndarray, dict]:
    """Solve the L1-SVM with the paper's batch MPU: returns (w, info).

    Minimises J(w, C) = 1/2 ||w||^2 + C sum_k max(0, 1 - y_k w . x_k) over w, with X used as given
    (no bias: append a constant column to X for one) and y in {-1, +1} (True/False and 1/0 also
    work), and stops as soon as the after-run bound guarantees (J(w) - J_opt) / J_opt <= epsilon.

    The driver is the paper's Section 4. Patterns z_k = y_k x_k, R = max_k ||z_k||, db = gap R^2
    (the paper: 3 R^2). Remark 4: I = floor(C db (2 + e) / e) + 1 and b = I / C for the before-run
    accuracy e = `epsilon_before` (default epsilon / 10, the paper's ratio 1e-5 / 1e-4), so that
    the MPU converges to an e-accurate solution. Each round:
    1. a full pass over a fresh permutation of the data, with multiple updates, collecting the
       first-level active set: the points with a . z_k <= c b or I_k > 0;
    2. up to `n_epochs_1` times: a pass over the first-level set, collecting the second-level set
       (the points whose I_k changed and stays > 0), then up to `n_epochs_2` mini-epochs over it;
       a set is left early after a pass without update.
    At the end of each full pass the weights are recomputed exactly, a = sum_k I_k z_k, and the run
    stops when the pass made no update (convergence) or when the after-run accuracy

        epsilon_aft = J(a / b, C) / L(alpha) - 1,   alpha_k = I_k / b,
                    = (1/2 ||a||^2 + I sum_k max(b - a . z_k, 0)) / (b (t+ - t-) - 1/2 ||a||^2) - 1

    (eq. 24; with sum_k I_k = t+ - t-) is at most `epsilon`. Derivation: 0 <= I_k <= I makes
    0 <= alpha_k <= I / b = C feasible for the dual, so weak duality gives J_opt >= L(alpha) =
    sum_k alpha_k - 1/2 ||sum_k alpha_k z_k||^2 = (b (t+ - t-) - 1/2 ||a||^2) / b^2, and
    (J - J_opt) / J_opt <= J / L - 1 whenever L > 0. The bound holds at any time, not only at
    convergence (the paper's remark), so it is a valid stopping rule.

    `info` holds: "J" (the objective of w), "dual_objective" (L(alpha), a lower bound on J_opt),
    "epsilon_after", "epsilon_before", "I", "b", "db", "R", "alpha" (the dual variables),
    "support_size" (alpha > 0), "n_at_bound" (alpha = C), "n_learning_steps", "n_unlearning_steps",
    "n_updates" (multiple updates count 1), "n_full_passes", "n_presentations", "converged" (a full
    pass without update) and "stopped_by" ("bound", "converged" or "max_full_passes").

    Examples
    --------

    >>> import numpy as np
    >>> from sklearn import datasets, preprocessing
    >>> from streammargin.mpu_batch import fit_batch

    >>> X, y = datasets.load_breast_cancer(return_X_y=True)
    >>> X = preprocessing.StandardScaler().fit_transform(X)
    >>> X = np.hstack([X, np.ones((len(X), 1))])  # a bias, as a constant feature
    >>> w, info = fit_batch(X, 2 * y - 1, C=1.0, epsilon=0.01)
    >>> info["stopped_by"], info["epsilon_after"] <= 0.01
    ('bound', True)
    >>> round(info["dual_objective"], 2) <= round(info["J"], 2)
    True

    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-d array, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("X has NaN or infinite values")
    targets = np.ascontiguousarray(binary_targets(y), dtype=np.float64)
    if targets.shape != (X.shape[0],):
        raise ValueError(f"X has {X.shape[0]} rows but y has {targets.shape} labels")
    if not (math.isfinite(C) and C > 0):
        raise ValueError(f"C must be a positive number, got {C!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive number, got {epsilon!r}")
    if epsilon_before is None:
        epsilon_before = epsilon / 10.0
    if not (math.isfinite(epsilon_before) and epsilon_before > 0):
        raise ValueError(f"epsilon_before must be a positive number, got {epsilon_before!r}")
    if not (math.isfinite(gap) and gap > 1):
        raise ValueError(f"gap must be > 1 (db > R^2), got {gap!r}")
    if not c >= 1:
        raise ValueError(f"c must be >= 1, got {c!r}")

    n, d = X.shape
    if n == 0:
        raise ValueError("X has no rows")
    sq = np.einsum("ij,ij->i", X, X)
    r2 = float(sq.max())
    if not math.isfinite(r2):
        raise ValueError("the squared norm of a row of X overflows; rescale X")
    db = gap * r2
    cap = math.floor(C * db * (2.0 + epsilon_before) / epsilon_before) + 1.0
    if cap > mpu_jit.CAP_MAX:
        raise ValueError("C R^2 / epsilon_before is too large for exact integer counts")
    b = cap / C
    run = np.zeros(mpu_jit.RUN_SIZE)
    run[mpu_jit.RUN_B], run[mpu_jit.RUN_DB], run[mpu_jit.RUN_CAP] = b, db, cap
    run[mpu_jit.RUN_ACTIVE] = c * b
    a = np.zeros(d)
    counts = np.zeros(n)
    first = np.empty(n, dtype=np.int64)
    second = np.empty(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    n_updates = n_presentations = n_full = 0
    stopped_by = "max_full_passes"

    def present(order: np.ndarray, collect: int, out: np.ndarray) -> tuple[int, int]:
        nonlocal n_updates, n_presentations
        updates, n_out = mpu_jit.batch_pass(X, targets, sq, a, counts, run, order, collect, out)
        n_updates += updates
        n_presentations += order.shape[0]
        return updates, n_out

    while n_full < max_full_passes:
        n_full += 1
        updates, n_first = present(rng.permutation(n), mpu_jit.COLLECT_FIRST_LEVEL, first)
        J, L, eps_after = _exact_bounds(X, targets, counts, a, b, C)
        if updates == 0:
            stopped_by = "converged"
            break
        if eps_after <= epsilon:
            stopped_by = "bound"
            break
        level_1 = first[:n_first].copy()
        for _ in range(n_epochs_1):
            updates, n_second = present(level_1, mpu_jit.COLLECT_SECOND_LEVEL, second)
            if updates == 0:
                break
            level_2 = second[:n_second].copy()
            for _ in range(n_epochs_2):
                if present(level_2, mpu_jit.COLLECT_NONE, second)[0] == 0:
                    break
    else:
        J, L, eps_after = _exact_bounds(X, targets, counts, a, b, C)
    w = a / b
    info = {
        "J": J,
        "dual_objective": L,
        "epsilon_after": eps_after,
        "epsilon_before": epsilon_before,
        "I": int(cap),
        "b": b,
        "db": db,
        "R": math.sqrt(r2),
        "alpha": counts / b,
        "support_size": int(np.count_nonzero(counts)),
        "n_at_bound": int(np.count_nonzero(counts == cap)),
        "n_learning_steps": int(run[mpu_jit.RUN_LEARN_STEPS]),
        "n_unlearning_steps": int(run[mpu_jit.RUN_UNLEARN_STEPS]),
        "n_updates": n_updates,
        "n_full_passes": n_full,
        "n_presentations": n_presentations,
        "converged": stopped_by == "converged",
        "stopped_by": stopped_by,
    }
    return w, info
