"""Hot loops of ALMA_p (Gentile 2001, Figure 1) on a sparse instance.

Representation. ALMA_p keeps w in the unit q-ball and updates it in the dual space:
w' = f^-1(f(w) + eta y xh), w = w' / max(1, ||w'||_q). The link f is positively homogeneous of
degree 1 and norm-preserving (||f^-1(theta)||_q = ||theta||_p), so the projection of w' is the
same scaling of theta' = f(w'): theta <- theta' / max(1, ||theta'||_p). We therefore store
theta = scale * u, keep S = sum_i |u_i|^p up to date incrementally, and read the weights as

    w_i = f^-1_i(theta) = scale * sign(u_i) |u_i|^(p-1) / S^((p-2)/p)   (w = theta for p = 2).

An update then costs O(nnz(x)) instead of O(d): the projection only changes `scale`. S is
recomputed exactly every RECOMPUTE_EVERY corrections (rounding never accumulates), and `scale` is
folded into u before |u|^p could overflow.

Instances: (idx, val) hold the columns and values of the nonzero features; idx < 0 marks a feature
the model has never learnt from (weight 0, but its value counts in ||x||_p). Column 0 holds the
intercept's constant feature, whose value `rho` is 0 when the model has no intercept.

Arrays shared with `streammargin.alma.ALMAClassifier` (few arguments: numba's dispatch costs
about 0.1 us per argument, as much as the arithmetic of a small instance):
- vectors: float64[capacity, 2]; column 0 is u, the scaled dual vector; column 1 is wsum, the sum
  over trials of the primal weights (averaged hypothesis only).
- st: float64[STATE_SIZE], the scalars, the hyper-parameters and the calibration state, at the
  offsets below.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from streammargin.jit import calibration

# learnt scalars
K, SCALE, SUM_P, SINCE_RECOMPUTE, TRIALS, SURVIVED = range(6)
# hyper-parameters, written from the model's params
P, ALPHA, B, C, RHO, AVERAGE = range(6, 12)
# calibration state (streammargin.jit.calibration) at st[PLATT:]
PLATT = 12
STATE_SIZE = PLATT + calibration.SIZE

RECOMPUTE_EVERY = 4096
OVERFLOW_EXPONENT = 100.0  # fold `scale` into u once scale^p < 10^-OVERFLOW_EXPONENT


def new_state(*hyper: float) -> np.ndarray:
    """A fresh state array; `hyper` = (p, alpha, B, C, rho, average) in slot order."""
    st = np.zeros(STATE_SIZE)
    st[K] = 1.0
    st[SCALE] = 1.0
    st[P : AVERAGE + 1] = hyper
    st[PLATT:] = calibration.new_state()
    return st


@njit(cache=True)
def _abs_pow(v, p):
    a = abs(v)
    if p == 2.0:
        return a * a
    return a**p


@njit(cache=True)
def normaliser(val, rho, p):
    """(largest, inv_scaled) with xh_j = val[j] / largest * inv_scaled = x_j / ||(rho, x)||_p.

    Dividing by the largest entry first keeps every step finite, from subnormal instances to
    values near the float64 maximum. largest = 0 means a zero instance.
    """
    largest = abs(rho)
    for j in range(val.shape[0]):
        a = abs(val[j])
        if a > largest:
            largest = a
    if largest == 0.0:
        return 0.0, 0.0
    total = _abs_pow(rho / largest, p)
    for j in range(val.shape[0]):
        total += _abs_pow(val[j] / largest, p)
    if p == 2.0:
        return largest, 1.0 / math.sqrt(total)
    return largest, 1.0 / total ** (1.0 / p)


@njit(cache=True)
def primal_factor(st):
    """The factor c with w_i = c * sign(u_i) |u_i|^(p-1)."""
    p = st[P]
    if p == 2.0:
        return st[SCALE]
    if st[SUM_P] <= 0.0:
        return 0.0
    return st[SCALE] / st[SUM_P] ** ((p - 2.0) / p)


@njit(cache=True)
def primal(u_i, factor, p):
    if p == 2.0:
        return factor * u_i
    if u_i == 0.0:
        return 0.0
    return factor * math.copysign(abs(u_i) ** (p - 1.0), u_i)


@njit(cache=True)
def _margin_last(vectors, st, idx, val, largest, inv_scaled):
    """w . xh for the last hypothesis."""
    p = st[P]
    factor = primal_factor(st)
    total = primal(vectors[0, 0], factor, p) * (st[RHO] / largest * inv_scaled)
    for j in range(idx.shape[0]):
        i = idx[j]
        if i >= 0:
            total += primal(vectors[i, 0], factor, p) * (val[j] / largest * inv_scaled)
    return total


@njit(cache=True)
def _margin_average(vectors, st, idx, val, largest, inv_scaled):
    """(wsum + survived * w) . xh / trials: the averaged hypothesis."""
    trials = st[TRIALS]
    if trials == 0.0:
        return 0.0
    total = vectors[0, 1] * (st[RHO] / largest * inv_scaled)
    for j in range(idx.shape[0]):
        i = idx[j]
        if i >= 0:
            total += vectors[i, 1] * (val[j] / largest * inv_scaled)
    last = _margin_last(vectors, st, idx, val, largest, inv_scaled)
    return (total + st[SURVIVED] * last) / trials


@njit(cache=True)
def _served_margin(vectors, st, idx, val, largest, inv_scaled):
    if st[AVERAGE] != 0.0:
        return _margin_average(vectors, st, idx, val, largest, inv_scaled)
    return _margin_last(vectors, st, idx, val, largest, inv_scaled)


@njit(cache=True)
def margin(vectors, st, idx, val):
    """The served hypothesis' margin on the normalised instance (0 for a zero instance)."""
    largest, inv_scaled = normaliser(val, st[RHO], st[P])
    if largest == 0.0:
        return 0.0
    return _served_margin(vectors, st, idx, val, largest, inv_scaled)


@njit(cache=True)
def _recompute_sum(vectors, st):
    p = st[P]
    if st[SCALE] ** p < 10.0 ** (-OVERFLOW_EXPONENT):
        scale = st[SCALE]
        for i in range(vectors.shape[0]):
            vectors[i, 0] *= scale
        st[SCALE] = 1.0
    total = 0.0
    for i in range(vectors.shape[0]):
        total += _abs_pow(vectors[i, 0], p)
    st[SUM_P] = total
    st[SINCE_RECOMPUTE] = 0.0


@njit(cache=True)
def _accumulate_average(vectors, st):
    """Before w changes: add w times the number of trials it survived to wsum."""
    survived = st[SURVIVED]
    if survived == 0.0:
        return
    p = st[P]
    factor = primal_factor(st)
    for i in range(vectors.shape[0]):
        if vectors[i, 0] != 0.0:
            vectors[i, 1] += survived * primal(vectors[i, 0], factor, p)
    st[SURVIVED] = 0.0


@njit(cache=True)
def learn(vectors, st, idx, val, y):
    """One trial of ALMA_p on (x, y), y in {-1.0, +1.0}. Returns 1 on a correction, else 0.

    Every column in idx must be >= 0 and < vectors.shape[0] (the caller grows the space first).
    """
    p, rho = st[P], st[RHO]
    largest, inv_scaled = normaliser(val, rho, p)
    corrected = 0
    if largest > 0.0:  # "in the degenerate case x_t = 0 no update takes place" (footnote 4)
        served = _served_margin(vectors, st, idx, val, largest, inv_scaled)
        calibration.learn(st[PLATT:], served, y)
        k = st[K]
        gamma = st[B] * math.sqrt(p - 1.0) / math.sqrt(k)
        if y * _margin_last(vectors, st, idx, val, largest, inv_scaled) <= (1.0 - st[ALPHA]) * gamma:
            if st[AVERAGE] != 0.0:
                _accumulate_average(vectors, st)
            eta = st[C] / (math.sqrt(p - 1.0) * math.sqrt(k))
            step = eta * y / st[SCALE]  # theta += eta y xh  <=>  u += (eta y / scale) xh
            total = st[SUM_P]
            if rho != 0.0:
                old = vectors[0, 0]
                vectors[0, 0] = old + step * (rho / largest * inv_scaled)
                total += _abs_pow(vectors[0, 0], p) - _abs_pow(old, p)
            for j in range(idx.shape[0]):
                i = idx[j]
                old = vectors[i, 0]
                vectors[i, 0] = old + step * (val[j] / largest * inv_scaled)
                total += _abs_pow(vectors[i, 0], p) - _abs_pow(old, p)
            st[SUM_P] = total
            st[SINCE_RECOMPUTE] += 1.0
            if total < 0.0 or st[SINCE_RECOMPUTE] >= RECOMPUTE_EVERY:
                _recompute_sum(vectors, st)
            # ||w'||_q = ||theta'||_p; project onto the unit q-ball by scaling theta.
            dual_norm = st[SCALE] * st[SUM_P] ** (1.0 / p)
            if dual_norm > 1.0:
                st[SCALE] /= dual_norm
                if st[SCALE] ** p < 10.0 ** (-OVERFLOW_EXPONENT):
                    _recompute_sum(vectors, st)
            st[K] = k + 1.0
            corrected = 1
    st[TRIALS] += 1.0
    st[SURVIVED] += 1.0
    return corrected


@njit(cache=True)
def _row_entries(X, cols, r, idx_buf, val_buf):
    """The non-missing (non-NaN) entries of row r of X, into the buffers; returns their count."""
    n = 0
    for c in range(X.shape[1]):
        v = X[r, c]
        if v == v:
            idx_buf[n] = cols[c]
            val_buf[n] = v
            n += 1
    return n


@njit(cache=True)
def learn_rows(vectors, st, X, cols, y):
    """`learn` over the rows of X (NaN = absent feature). Returns the number of corrections."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    corrections = 0
    for r in range(X.shape[0]):
        n = _row_entries(X, cols, r, idx_buf, val_buf)
        corrections += learn(vectors, st, idx_buf[:n], val_buf[:n], y[r])
    return corrections


@njit(cache=True)
def margin_rows(vectors, st, X, cols, out):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = _row_entries(X, cols, r, idx_buf, val_buf)
        out[r] = margin(vectors, st, idx_buf[:n], val_buf[:n])


@njit(cache=True)
def primal_weights(vectors, st, out):
    factor = primal_factor(st)
    for i in range(vectors.shape[0]):
        out[i] = primal(vectors[i, 0], factor, st[P])
