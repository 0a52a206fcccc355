"""Straight transcriptions for the MPU tests: dense, slow, in the paper's own units.

Nothing here is shared with the package. Where the package keeps everything in units of R, with
closed-form multiple updates, swap-removal and a Gram matrix, these functions keep a = sum_k I_k z_k
in the original units and apply the paper's rule one step at a time, so that an agreement to
1e-9 means something.
"""

from __future__ import annotations

import math

import numpy as np

CAP_MAX = 2.0**53


def mpu_online_reference(
    stream, *, C, epsilon, gap, budget, replay, unlearn=True, rho=1.0, kernel=None
):
    """The online MPU of `streammargin.MPUClassifier`, step by step.

    stream: (x, y) with x a dense vector over fixed columns and y in {-1, +1}. `kernel(u, v)`
    (default: the dot product) is augmented as K(u, v) + rho^2; z_j . z_k = y_j y_k (K + rho^2).

    - R = max sqrt(K(x, x) + rho^2) so far; b = B R^2 with B = gap (2 + epsilon) / epsilon
      (eq. 23 solved for b), db = gap R^2, I = floor(C b) + 1 (Remark 4), no cap for C = None.
    - When R grows, every count is multiplied by (R_new / R_old)^2, rounded, capped by I.
    - A new pattern that violates the margin (a . z <= b) joins the cache; a full cache first
      evicts the oldest pattern with I_k = 0, else the oldest, moving the last slot into its place.
    - The rule is applied to a pattern again and again while it applies (a multiple update is
      the same steps); then `replay` cached patterns are presented, round robin over the slots.

    Returns a dict: the cache (list of dicts x, y, count, born in slot order), R, b, I, the step
    counters and the number of evictions.
    """
    dot = kernel or (lambda u, v: float(u @ v))
    ratio = gap * (2.0 + epsilon) / epsilon
    cache: list[dict] = []
    R = 0.0
    cursor = 0
    learning = unlearning = evictions = 0

    def thresholds():
        b = ratio * R * R
        cap = math.inf if C is None else min(math.floor(C * b) + 1.0, CAP_MAX)
        return b, gap * R * R, cap

    def zz(x1, y1, x2, y2):
        return y1 * y2 * (dot(x1, x2) + rho * rho)

    def margin(x, y):
        return sum(p["count"] * zz(p["x"], p["y"], x, y) for p in cache)

    def present(k):
        nonlocal learning, unlearning
        p = cache[k]
        b, db, cap = thresholds()
        s = margin(p["x"], p["y"])
        sq = zz(p["x"], p["y"], p["x"], p["y"])
        while True:
            if s <= b and p["count"] < cap:
                p["count"] += 1
                learning += 1
                s += sq  # a . z after a += z
            elif unlearn and p["count"] > 0 and s >= b + db:
                p["count"] -= 1
                unlearning += 1
                s -= sq
            else:
                break

    for t, (x, y) in enumerate(stream):
        norm = math.sqrt(dot(x, x) + rho * rho)
        if norm == 0.0:
            continue
        if norm > R:
            if R > 0:
                R_old, R = R, norm
                _, _, cap = thresholds()
                for p in cache:
                    if p["count"] > 0:
                        p["count"] = min(math.floor(p["count"] * (R / R_old) ** 2 + 0.5), cap)
            else:
                R = norm
        b, _, _ = thresholds()
        if margin(x, y) <= b:
            if len(cache) >= budget:
                free = [k for k, p in enumerate(cache) if p["count"] == 0]
                pool = free or range(len(cache))
                v = min(pool, key=lambda k: cache[k]["born"])
                cache[v] = cache[-1]
                cache.pop()
                evictions += 1
            cache.append({"x": x, "y": y, "count": 0, "born": t})
            present(len(cache) - 1)
        for _ in range(replay):
            if not cache:
                break
            k = cursor % len(cache)
            cursor = k + 1
            present(k)
    b, db, cap = thresholds()
    return {
        "cache": cache,
        "R": R,
        "b": b,
        "db": db,
        "I": cap,
        "learning": learning,
        "unlearning": unlearning,
        "evictions": evictions,
    }


def primal_weights(result, rho):
    """w = a / b, with a = sum_k I_k y_k [x_k, rho] over the reference's cache."""
    cache = result["cache"]
    a = sum(p["count"] * p["y"] * np.append(p["x"], rho) for p in cache)
    return a / result["b"]


def algorithm_1(Z, cap, b, db, max_epochs=100_000):
    """Algorithm 1 of the paper verbatim: single steps, patterns in order, until an epoch makes no
    update. Z holds the patterns z_k = y_k x_k as rows. Returns (a, counts, t+, t-, epochs)."""
    n, d = Z.shape
    a = np.zeros(d)
    counts = np.zeros(n, dtype=np.int64)
    learning = unlearning = 0
    for epoch in range(1, max_epochs + 1):
        updated = False
        for k in range(n):
            p = a @ Z[k]
            if p <= b and counts[k] < cap:
                a = a + Z[k]
                counts[k] += 1
                learning += 1
                updated = True
            elif counts[k] == 0:
                continue
            elif p >= b + db:
                a = a - Z[k]
                counts[k] -= 1
                unlearning += 1
                updated = True
        if not updated:
            return a, counts, learning, unlearning, epoch
    raise RuntimeError("Algorithm 1 did not converge")


def svm_dual_coordinate_descent(X, y, C, tol=1e-12, max_epochs=200_000):
    """The L1-SVM without bias by dual coordinate descent (Hsieh et al. 2008, Algorithm 1), run to
    a projected-gradient gap below `tol`. Returns (w, alpha): J(w) and L(alpha) bracket J_opt."""
    n, d = X.shape
    alpha = np.zeros(n)
    w = np.zeros(d)
    Q = np.einsum("ij,ij->i", X, X)
    for _ in range(max_epochs):
        largest, smallest = -np.inf, np.inf
        for i in range(n):
            if Q[i] == 0:
                continue
            G = y[i] * (w @ X[i]) - 1.0
            if alpha[i] == 0:
                PG = min(G, 0.0)
            elif alpha[i] == C:
                PG = max(G, 0.0)
            else:
                PG = G
            largest, smallest = max(largest, PG), min(smallest, PG)
            if PG != 0:
                old = alpha[i]
                alpha[i] = min(max(old - G / Q[i], 0.0), C)
                w += (alpha[i] - old) * y[i] * X[i]
        if largest - smallest < tol:
            return w, alpha
    raise RuntimeError("dual coordinate descent did not converge")
