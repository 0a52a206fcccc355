"""A straight, dense transcription of the kernelized Stochastic Batch Perceptron, for the tests.

Written from Cotter, Shalev-Shwartz & Srebro (2012), Appendix B, Algorithm 1, with the stream
adaptations documented in `streammargin.sbp`: a FIFO window of the last `window` examples, STEPS
steps per example, the step eta_0 / sqrt(min(t, H)) and the moving average of rate
1 / min(t, H), H = window x steps. Nothing is incremental here: the water level comes from a sort,
the responses and ||w|| are recomputed from alpha and the kernel matrix at every step. Nothing is
imported from the package, so an agreement to 1e-9 means something.

The only representation detail copied is the order of the window's points (an evicted point's
place is taken by the last one), because the uniform draw picks "the k-th point under water".
"""

from __future__ import annotations

import math

import numpy as np
from reference import uniform_index

def water_level(responses: np.ndarray, volume: float) -> float:
    """gamma with sum_i max(0, gamma - c_i) = volume, from the sorted responses."""
    c = np.sort(responses)
    if volume <= 0:
        return float(c[0])
    total = 0.0
    for k in range(1, len(c) + 1):
        total += c[k - 1]
        level = (volume + total) / k
        if k == len(c) or level <= c[k]:
            return level
    raise AssertionError("unreachable")


def kernel(kind, gamma, degree, coef0, a, b):
    if kind == "rbf":
        return math.exp(-gamma * float(np.sum((a - b) ** 2)))
    if kind == "poly":
        return (gamma * float(a @ b) + coef0) ** degree
    return float(a @ b)


class ReferenceSBP:
    def __init__(self, nu, window, steps, kind="rbf", gamma=1.0, degree=3, coef0=1.0, seed=0):
        self.nu, self.window, self.steps, self.seed = nu, window, steps, seed
        self.k = lambda a, b: kernel(kind, gamma, degree, coef0, a, b)
        self.points: list = []  # [x, y, born]
        self.alpha: list = []
        self.average: list = []
        self.t = 0
        self.trials = 0
        self.draws = 0

    def gram(self):
        return np.array([[self.k(p[0], q[0]) for q in self.points] for p in self.points])

    def responses(self, K):
        y = np.array([p[1] for p in self.points])
        return y * (K @ (np.array(self.alpha) * y))

    def score(self, x):
        """The served score: sum_j avg_j y_j K(x_j, x)."""
        return sum(a * p[1] * self.k(p[0], x) for a, p in zip(self.average, self.points))

    def step(self, K, eta0):
        self.t += 1
        horizon = self.window * self.steps
        eta = eta0 / math.sqrt(min(self.t, horizon))
        c = self.responses(K)
        level = water_level(c, len(c) * self.nu)
        under = [j for j in range(len(c)) if c[j] < level]
        if not under:
            under = [j for j in range(len(c)) if c[j] <= c.min()]
        i = under[uniform_index(self.seed, self.draws, len(under))]
        self.draws += 1
        self.alpha[i] += eta
        a, y = np.array(self.alpha), np.array([p[1] for p in self.points])
        norm = math.sqrt(float((a * y) @ K @ (a * y)))
        if norm > 1:
            self.alpha = [alpha / norm for alpha in self.alpha]
        rate = 1.0 / min(self.t, horizon)
        self.average = [m + rate * (alpha - m) for m, alpha in zip(self.average, self.alpha)]

    def learn(self, x, y):
        if len(self.points) == self.window:
            oldest = min(range(len(self.points)), key=lambda j: self.points[j][2])
            last = len(self.points) - 1
            for values in (self.points, self.alpha, self.average):
                values[oldest] = values[last]
                values.pop()
        self.points.append([x, y, self.trials])
        self.alpha.append(0.0)
        self.average.append(0.0)
        self.trials += 1
        K = self.gram()
        largest = max(K.diagonal())
        if largest <= 0:
            return
        for _ in range(self.steps):
            self.step(K, 1.0 / math.sqrt(largest))
