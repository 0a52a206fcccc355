"""Straight dense transcriptions of the budget kernel learners, for the tests to compare against.

Nothing here is shared with the package: kernels are evaluated from their formulas on dense
vectors, the hypothesis is an explicit list of (vector, label, weight), norms come from explicit
Gram matrices and linear solves, and each rule is written from its paper. The one convention
copied on purpose is the cache's order (a removed vector's place is taken by the last one), since
the random policy draws an index into it.
"""

from __future__ import annotations

import math

import numpy as np

MASK = (1 << 64) - 1


def splitmix_uniform(key: int, counter: int) -> float:
    """Output number `counter` of SplitMix64 seeded with `key`, as a float in [0, 1)."""
    z = (key + (counter + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    z ^= z >> 31
    return (z >> 11) / 2**53


def kernel(name: str, gamma: float = 1.0, degree: int = 3, coef0: float = 1.0):
    if name == "rbf":
        return lambda a, b: math.exp(-gamma * float(np.sum((a - b) ** 2)))
    if name == "poly":
        return lambda a, b: (gamma * float(a @ b) + coef0) ** degree
    return lambda a, b: float(a @ b)


class Expansion:
    """f(x) = sum_i w_i y_i K(v_i, x), a list kept in the cache's order."""

    def __init__(self, K):
        self.K = K
        self.vectors: list[np.ndarray] = []
        self.labels: list[float] = []
        self.weights: list[float] = []
        self.born: list[int] = []

    def __len__(self) -> int:
        return len(self.vectors)

    def __call__(self, x: np.ndarray) -> float:
        return sum(w * y * self.K(v, x) for v, y, w in zip(self.vectors, self.labels, self.weights))

    def add(self, x, y, w, t):
        self.vectors.append(x)
        self.labels.append(y)
        self.weights.append(w)
        self.born.append(t)

    def remove(self, i):
        for field in (self.vectors, self.labels, self.weights, self.born):
            field[i] = field[-1]
            field.pop()

    def gram(self) -> np.ndarray:
        return np.array([[self.K(a, b) for b in self.vectors] for a in self.vectors])

    def signed(self) -> np.ndarray:
        return np.array(self.weights) * np.array(self.labels)

    def sq_norm(self) -> float:
        a = self.signed()
        return float(a @ self.gram() @ a) if len(self) else 0.0


def forgetron_phi(sigma, mu, q, mistakes):
    """max phi in (0, 1] with Psi(sigma phi, phi mu) + Q <= 15/32 M (Dekel et al. 2008)."""
    a, b, c = sigma**2 - 2 * sigma * mu, 2 * sigma, q - 15 / 32 * mistakes
    if a + b + c <= 0:
        return 1.0
    roots = np.roots([a, b, c]) if a != 0 else np.array([-c / b])
    inside = [r.real for r in np.atleast_1d(roots) if abs(r.imag) < 1e-12 and 0 < r.real <= 1]
    return min(inside)


def cks_victim(f: Expansion):
    """argmax_j y_j (f(v_j) - w_j y_j K(v_j, v_j)) over the expansion (Crammer et al. 2003)."""
    scores = [
        y * (f(v) - w * y * f.K(v, v)) for v, y, w in zip(f.vectors, f.labels, f.weights)
    ]
    return int(np.argmax(scores))


def projectron_step(f: Expansion, x, y, step, threshold, budget, t):
    """Add step * y * phi(x) to f the Projectron's way (Orabona et al. 2009)."""
    kxx = f.K(x, x)
    if not len(f):
        f.add(x, y, step, t)
        return
    k = np.array([f.K(v, x) for v in f.vectors])
    d = np.linalg.solve(f.gram(), k)
    delta2 = kxx - k @ d
    if len(f) >= budget or delta2 <= threshold**2 * kxx or delta2 <= 1e-12 * kxx:
        a = f.signed() + step * y * d
        f.labels = [1.0 if v > 0 else -1.0 if v < 0 else lab for v, lab in zip(a, f.labels)]
        f.weights = [float(v * lab) for v, lab in zip(a, f.labels)]
    else:
        f.add(x, y, step, t)


def projectron_margin_step(f: Expansion, x, y, loss, threshold) -> bool:
    """Projectron++ on a margin error (Orabona et al. 2009, Section 4): f += tau y P phi(x),
    tau = min(loss / ||P phi(x)||^2, 1, 2 (loss - delta / eta) / ||P phi(x)||^2), delta the
    distance of phi(x) to the span relative to ||phi(x)||, no update unless loss > delta / eta.
    Returns whether it updated."""
    kxx = f.K(x, x)
    k = np.array([f.K(v, x) for v in f.vectors])
    d = np.linalg.solve(f.gram(), k)
    projection = min(float(k @ d), kxx)  # ||P phi(x)||^2
    if projection <= 0:
        return False
    delta = math.sqrt((kxx - projection) / kxx)
    if threshold > 0:
        slack = loss - delta / threshold
    else:
        slack = loss if delta == 0 else -1.0
    if slack <= 0:
        return False
    tau = min(loss / projection, 1.0, 2 * slack / projection)
    a = f.signed() + tau * y * d
    f.labels = [1.0 if v > 0 else -1.0 if v < 0 else lab for v, lab in zip(a, f.labels)]
    f.weights = [float(v * lab) for v, lab in zip(a, f.labels)]
    return True


def budget_perceptron_reference(stream, K, budget, eviction, threshold=0.1, key=0, margin=0.0):
    """The kernel perceptron on a budget, by policy, updating when y f(x) <= margin (Crammer et
    al. 2003's beta; 0: on mistakes only), with Projectron++'s step for a margin error under
    "project". Returns the final expansion, the number of mistakes and of margin updates."""
    f = Expansion(K)
    q, updates, margin_updates, draws = 0.0, 0, 0, 0
    for t, (x, y) in enumerate(stream):
        fx = f(x)
        if y * fx > margin or K(x, x) <= 0:
            continue
        if y * fx > 0 and eviction == "project":
            if projectron_margin_step(f, x, y, margin - y * fx, threshold):
                updates += 1
                margin_updates += 1
            continue
        updates += 1
        margin_updates += y * fx > 0
        if eviction == "project":
            projectron_step(f, x, y, 1.0, threshold, budget, t)
            continue
        if len(f) < budget:
            f.add(x, y, 1.0, t)
            continue
        if eviction == "random":
            r = min(int(splitmix_uniform(key, draws) * len(f)), len(f) - 1)
            draws += 1
            f.remove(r)
            f.add(x, y, 1.0, t)
        elif eviction == "oldest":
            # Forgetron: perceptron step, shrink by phi, remove the oldest (M counts updates).
            r = int(np.argmin(f.born))
            f.add(x, y, 1.0, t)
            mu = f.labels[r] * f(f.vectors[r])
            phi = forgetron_phi(f.weights[r], mu, q, updates)
            f.weights = [w * phi for w in f.weights]
            sigma = f.weights[r]
            q += sigma**2 + 2 * sigma - 2 * sigma * f.labels[r] * f(f.vectors[r])
            f.remove(r)
        elif eviction == "smallest":
            # Insert, then remove argmax_j y_j (f(x_j) - a_j y_j K(x_j, x_j)), x included.
            f.add(x, y, 1.0, t)
            f.remove(cks_victim(f))
    return f, updates - margin_updates, margin_updates


def kernel_alma_reference(stream, K, alpha, B, C, budget, eviction, threshold=0.1, key=0):
    """Kernel ALMA_2(alpha; B, C) (Gentile 2001) on normalised instances phi(x)/sqrt(K(x, x)),
    with a budget. w = sum_i w_i y_i phi(v_i) (the normalisation folded into w_i). Returns the
    final expansion, its scale-free margin function and the number of corrections."""
    f = Expansion(K)
    k, draws = 1, 0
    for t, (x, y) in enumerate(stream):
        kxx = K(x, x)
        if kxx <= 0:
            continue
        margin = f(x) / math.sqrt(kxx)
        if y * margin > (1 - alpha) * B / math.sqrt(k):
            continue
        eta = C / math.sqrt(k)
        step = eta / math.sqrt(kxx)
        if eviction == "project":
            projectron_step(f, x, y, step, threshold, budget, t)
        elif len(f) < budget:
            f.add(x, y, step, t)
        elif eviction == "smallest":
            f.add(x, y, step, t)
            f.remove(cks_victim(f))
        else:
            if eviction == "random":
                r = min(int(splitmix_uniform(key, draws) * len(f)), len(f) - 1)
                draws += 1
            else:  # oldest, without the Forgetron's shrinking
                r = int(np.argmin(f.born))
            f.remove(r)
            f.add(x, y, step, t)
        norm = math.sqrt(max(f.sq_norm(), 0.0))
        if norm > 1:
            f.weights = [w / norm for w in f.weights]
        k += 1
    return f, k - 1


def budget_svm_primal(gram, labels, a, C, B):
    """1/2 ||f||^2 + C * (sum of the B largest hinge losses) at f = sum a_i y_i K(x_i, .): the
    primal objective with the 1-inf interpolation norm (Dekel & Singer 2006, Theorem 1)."""
    ay = a * labels
    f = gram @ ay
    hinge = np.sort(np.maximum(0.0, 1.0 - labels * f))[::-1]
    whole = int(math.floor(B))
    top = hinge[:whole].sum() + (B - whole) * (hinge[whole] if whole < len(hinge) else 0.0)
    return 0.5 * float(ay @ gram @ ay) + C * float(top)


def budget_svm_dual_objective(gram, labels, a):
    ay = a * labels
    return float(a.sum() - 0.5 * ay @ gram @ ay)
