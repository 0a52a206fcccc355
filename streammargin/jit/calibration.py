"""Online Platt scaling: turns a classifier's raw score into a probability.

The probability of the positive class is sigmoid(a * z + b), where z is the score divided by a
running root-mean-square of past scores (forgetting factor BETA_SCALE), so that `a` and `b` live on
the same scale for every model, clipped to [-Z_CLIP, Z_CLIP]. (a, b) are fitted online by one
Newton step per labelled example on the log loss, with a 2x2 Hessian that forgets with factor BETA
(an effective window of 1/(1-BETA) = 100 examples: the calibration follows a drifting stream and
the threshold b/a settles fast) plus a ridge RIDGE that keeps every step bounded. The update uses
the score of the example *before* the model learns from it, the score the model served for it:
test-then-train, like progressive validation. It starts at a = 1, b = 0 (follow the score's sign).

The constants were chosen on progressive validation over Phishing, SEA, Hyperplane, Agrawal and
breast cancer (`benchmarks/alma_accuracy.py`): a window of 100 beat 1000 on log loss everywhere.

State: one float64 array of length SIZE (layout below), owned by the model.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

A, B, H00, H01, H11, MEAN_SQUARE, COUNT = range(7)
SIZE = 7
BETA = 0.99
BETA_SCALE = 0.999
RIDGE = 1.0
Z_CLIP = 20.0
LOGIT_CLIP = 35.0


def new_state() -> np.ndarray:
    state = np.zeros(SIZE)
    state[A] = 1.0
    state[H00] = RIDGE
    state[H11] = RIDGE
    return state


@njit(cache=True)
def _normalised(state, score):
    count = state[COUNT]
    if count == 0.0:
        return 0.0
    mean_square = state[MEAN_SQUARE] / (1.0 - BETA_SCALE**count)  # bias-corrected, like Adam's moments
    if mean_square <= 0.0:
        return 0.0
    z = score / math.sqrt(mean_square)
    return min(max(z, -Z_CLIP), Z_CLIP)


@njit(cache=True)
def _sigmoid(t):
    t = min(max(t, -LOGIT_CLIP), LOGIT_CLIP)
    if t >= 0.0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


@njit(cache=True)
def proba(state, score):
    """Calibrated probability of the positive class for a raw score."""
    return _sigmoid(state[A] * _normalised(state, score) + state[B])


@njit(cache=True)
def learn(state, score, target):
    """One Newton step on the log loss of (score, target), target in {-1.0, +1.0}."""
    z = _normalised(state, score)
    p = _sigmoid(state[A] * z + state[B])
    y01 = 1.0 if target > 0.0 else 0.0
    g = p - y01
    curvature = max(p * (1.0 - p), 1e-6)
    h00 = BETA * state[H00] + (1.0 - BETA) * RIDGE + curvature * z * z
    h01 = BETA * state[H01] + curvature * z
    h11 = BETA * state[H11] + (1.0 - BETA) * RIDGE + curvature
    det = h00 * h11 - h01 * h01
    # Newton direction H^-1 (g z, g): H stays positive definite (ridge), so det > 0.
    step_a = (h11 * g * z - h01 * g) / det
    step_b = (h00 * g - h01 * g * z) / det
    state[A] -= step_a
    state[B] -= step_b
    state[H00], state[H01], state[H11] = h00, h01, h11
    state[MEAN_SQUARE] = BETA_SCALE * state[MEAN_SQUARE] + (1.0 - BETA_SCALE) * score * score
    state[COUNT] += 1.0


@njit(cache=True)
def proba_many(state, scores, out):
    for i in range(scores.shape[0]):
        out[i] = proba(state, scores[i])
