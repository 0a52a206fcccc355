"""A straight, dense transcription of the Convex Polytope Machine's SGD, for the tests.

Written from the paper (Kantchelian et al. 2014, Algorithms 1 and 2, problem (6)) and the stream
adaptations documented in `streammargin.convex_polytope`, with none of the package's
representation tricks: W is an explicit (polytopes, K, d) array shrunk by (1 - eta lambda) at every
step, the entropy is recomputed from the counts, the replay window is a list of dense vectors.
Nothing is imported from the package, so an agreement to 1e-9 means something.
"""

from __future__ import annotations

import math

import numpy as np
from reference import uniform_index

def entropy(counts: np.ndarray) -> float:
    total = counts.sum()
    q = counts[counts > 0] / total
    return float(-(q * np.log(q)).sum())


class ReferenceCPM:
    """The CPM on dense vectors x (the intercept's constant feature must be included in x).

    mode: "one" (code 1 outside, 0 inside), "separate" or "joint" (one polytope per class code).
    """

    def __init__(self, d, K, lam, entropy_fraction, mode, steps=1, window=1, seed=0, decay=0.999):
        self.d, self.K, self.lam, self.mode = d, K, lam, mode
        self.h = entropy_fraction * math.log(K)
        self.steps, self.window, self.seed, self.decay = steps, window, seed, decay
        n_poly = 1 if mode == "one" else 0
        self.W = np.zeros((n_poly, K, d))
        self.counts = np.zeros((n_poly, K))
        self.t = 0  # SGD steps
        self.trials = 0
        self.draws = 0
        self.ring: list = [None] * window

    def _activate(self, code):
        while self.mode != "one" and code >= self.W.shape[0]:
            self.W = np.concatenate([self.W, np.zeros((1, self.K, self.d))])
            self.counts = np.concatenate([self.counts, np.zeros((1, self.K))])

    def assign(self, p, scores):
        """Algorithm 2: natural argmax, unless the entropy would stay below h."""
        natural = int(np.argmax(scores))
        self.counts[p] *= self.decay
        chosen = natural
        if self.h > 0 and self.counts[p].sum() >= 5 * self.K:
            def with_one_more(k):
                counts = self.counts[p].copy()
                counts[k] += 1
                return entropy(counts)

            if with_one_more(natural) < self.h:
                current = entropy(self.counts[p])
                raising = [k for k in range(self.K) if with_one_more(k) > current]
                if raising:
                    chosen = max(raising, key=lambda k: (scores[k], -k))
        self.counts[p][natural] += 1
        return chosen

    def sgd_step(self, x, code):
        scores = self.W @ x  # (polytopes, K), before the step
        self.t += 1
        eta = 1.0 / (self.lam * self.t)
        gradient = np.zeros_like(self.W)
        n_poly = self.W.shape[0]
        if self.mode == "joint":
            if n_poly >= 2:
                others = [p for p in range(n_poly) if p != code]
                other = max(others, key=lambda p: (scores[p].max(), -p))
                z = self.assign(code, scores[code])
                if scores[code, z] - scores[other].max() < 1:
                    gradient[code, z] += x
                    gradient[other, int(np.argmax(scores[other]))] -= x
        else:
            for p in range(n_poly):
                positive = code == 1 if self.mode == "one" else p == code
                if positive:
                    z = self.assign(p, scores[p])
                    if scores[p, z] < 1:
                        gradient[p, z] += x
                else:
                    for k in range(self.K):
                        if scores[p, k] > -1:
                            gradient[p, k] -= x
        self.W = (1 - eta * self.lam) * self.W + eta * gradient

    def learn(self, x, code):
        self._activate(code)
        self.sgd_step(x, code)
        if self.steps > 1:
            self.ring[self.trials % self.window] = (x.copy(), code)
        self.trials += 1
        for _ in range(self.steps - 1):
            filled = min(self.trials, self.window)
            x_old, code_old = self.ring[uniform_index(self.seed, self.draws, filled)]
            self.draws += 1
            self.sgd_step(x_old, code_old)

    def scores(self, x):
        return (self.W @ x).max(axis=1)
