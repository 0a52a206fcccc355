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

The predicted label (`decide`). Two rules compete: the sign of the raw score (the paper's
decision) and the calibrated argmax P(True) > 0.5 (the threshold the calibration learnt). Neither
wins everywhere: the calibrated threshold lets a biased or imbalanced problem fall back on the
majority class (ALMA on Agrawal f0: 0.677 against 0.671 for the sign, the majority being 0.674),
while a misspecified sigmoid can shift a good zero threshold (SBP on Hyperplane: 0.65 against
0.73). So both rules are scored on every labelled example, before it is learnt (prequentially),
with errors forgotten at BETA_CHOICE (a window of 1000 examples), and `decide` serves the rule
with fewer recent errors, the sign on ties. Measured over four models and seven streams it stays
within half a point of the better rule (`benchmarks/calibration.py`).

State: one float64 array of length SIZE (`LAYOUT` below), owned by the model.
"""

from __future__ import annotations

import math

import numpy as np

from streammargin.jit.dispatch import njit
from streammargin.jit.layout import CALIBRATION, Layout, Slot

LAYOUT = Layout(
    "calibration",
    Slot("a", CALIBRATION, "slope of the sigmoid, on the normalised score z"),
    Slot("b", CALIBRATION, "intercept of the sigmoid"),
    Slot("h00", CALIBRATION, "forgetting Hessian of the log loss (+ ridge), entry (a, a)"),
    Slot("h01", CALIBRATION, "forgetting Hessian, entry (a, b)"),
    Slot("h11", CALIBRATION, "forgetting Hessian (+ ridge), entry (b, b)"),
    Slot("mean_square", CALIBRATION, "running mean square of the scores (z = score / its root)"),
    # UNSEEN = BETA_SCALE ** (examples learnt), the weight the running mean square still owes its
    # zero start (1 before the first example): kept as a running product, which spares a pow.
    Slot("unseen", CALIBRATION, "BETA_SCALE ** examples: the weight of the zero start"),
    Slot("err_sign", CALIBRATION, "decayed errors of the sign rule"),
    Slot("err_calibrated", CALIBRATION, "decayed errors of the calibrated argmax"),
)
A, B, H00, H01, H11, MEAN_SQUARE, UNSEEN, ERR_SIGN, ERR_CALIBRATED = LAYOUT.offsets(
    "a", "b", "h00", "h01", "h11", "mean_square", "unseen", "err_sign", "err_calibrated"
)
SIZE = LAYOUT.size
BETA = 0.99
BETA_SCALE = 0.999
BETA_CHOICE = 0.999
RIDGE = 1.0
Z_CLIP = 20.0
LOGIT_CLIP = 35.0
SCORE_LIMIT = 1e150  # scores are clamped here: the running mean square must stay finite


def new_state() -> np.ndarray:
    state = np.zeros(SIZE)
    state[A] = 1.0
    state[H00] = RIDGE
    state[H11] = RIDGE
    state[UNSEEN] = 1.0
    return state


@njit(cache=True, inline="always")
def _no_subnormal(value):
    """0 for a decayed quantity below 1e-300: after ~700k decays without a refill it would reach
    the subnormal range, where every multiplication is many times slower."""
    return value if value > 1e-300 else 0.0


@njit(cache=True, inline="always")
def _clamped(score):
    return min(max(score, -SCORE_LIMIT), SCORE_LIMIT)


@njit(cache=True, inline="always")
def _normalised(state, score):
    """The clamped score over the running RMS of past scores (0 before any)."""
    unseen = state[UNSEEN]
    if unseen == 1.0:
        return 0.0
    mean_square = state[MEAN_SQUARE] / (1.0 - unseen)  # bias-corrected, like Adam's moments
    if mean_square <= 0.0:
        return 0.0
    z = score / math.sqrt(mean_square)
    return min(max(z, -Z_CLIP), Z_CLIP)


@njit(cache=True, inline="always")
def _sigmoid(t):
    t = min(max(t, -LOGIT_CLIP), LOGIT_CLIP)
    if t >= 0.0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


@njit(cache=True, inline="always")
def proba(state, score):
    """Calibrated probability of the positive class for a raw score."""
    return _sigmoid(state[A] * _normalised(state, _clamped(score)) + state[B])


@njit(cache=True, inline="always")
def decide(state, score):
    """The predicted label (True/False) of a raw score: the rule with fewer recent errors."""
    if state[ERR_CALIBRATED] < state[ERR_SIGN]:
        return proba(state, score) > 0.5
    return score > 0.0


@njit(cache=True, inline="always")
def signed_proba(state, score):
    """`proba` and `decide` in one number: +P(True) if the label is True, else -P(True) (P(True)
    is never 0: the logit is clipped). One compiled function serves predict_one and
    predict_proba_one."""
    p_true = proba(state, score)
    if state[ERR_CALIBRATED] < state[ERR_SIGN]:  # `decide`'s rule, reusing p_true (LLVM would not)
        return p_true if p_true > 0.5 else -p_true
    return p_true if score > 0.0 else -p_true


@njit(cache=True, inline="always")
def learn(state, score, target):
    """Score both decision rules on (score, target), then one Newton step on the log loss of the
    calibration; target in {-1.0, +1.0}."""
    score = _clamped(score)
    z = _normalised(state, score)
    p = _sigmoid(state[A] * z + state[B])
    positive = target > 0.0
    state[ERR_SIGN] = _no_subnormal(
        BETA_CHOICE * state[ERR_SIGN] + (1.0 - BETA_CHOICE) * ((score > 0.0) != positive)
    )
    state[ERR_CALIBRATED] = _no_subnormal(
        BETA_CHOICE * state[ERR_CALIBRATED] + (1.0 - BETA_CHOICE) * ((p > 0.5) != positive)
    )
    y01 = 1.0 if positive else 0.0
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
    state[MEAN_SQUARE] = _no_subnormal(
        BETA_SCALE * state[MEAN_SQUARE] + (1.0 - BETA_SCALE) * score * score
    )
    state[UNSEEN] = _no_subnormal(BETA_SCALE * state[UNSEEN])


@njit(cache=True)
def proba_many(state, scores, out):
    for i in range(scores.shape[0]):
        out[i] = proba(state, scores[i])


@njit(cache=True)
def decide_many(state, scores, out):
    for i in range(scores.shape[0]):
        out[i] = decide(state, scores[i])
