"""Kernels and the bounded support cache, as numba functions on the cache's arrays.

Kernel parameters travel as a float64 array `kp` = [kind, gamma, degree, coef0]:
    linear  K(a, b) = a.b
    rbf     K(a, b) = exp(-gamma ||a - b||^2)
    poly    K(a, b) = (gamma a.b + coef0)^degree

The support cache of a kernel model is two arrays with `budget` rows:
    S      float64[budget, columns]   the support vectors, dense over the feature columns
    slots  float64[budget, n_fields]  per-vector numbers; every model has the fields below first
                                      (LABEL, COEF, SQ_NORM, BORN) and may add its own after them
and a size n <= budget kept by the model: rows n.. are free. A query instance is sparse,
(idx, val) as everywhere in streammargin (idx < 0: a feature no support vector has, which counts
in ||x||^2 but not in any dot product).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from streammargin.jit import calibration

LINEAR, RBF, POLY = 0, 1, 2
KERNELS = {"linear": LINEAR, "rbf": RBF, "poly": POLY}
KIND, GAMMA, DEGREE, COEF0 = range(4)
KP_SIZE = 4

# Common slot fields.
LABEL, COEF, SQ_NORM, BORN = range(4)
N_COMMON_FIELDS = 4


def kernel_params(kernel: str, gamma: float, degree: int, coef0: float) -> np.ndarray:
    return np.array([KERNELS[kernel], gamma, degree, coef0], dtype=np.float64)


@njit(cache=True)
def from_dot(kp, dot, sq_a, sq_b):
    """K(a, b) from a.b, ||a||^2 and ||b||^2."""
    kind = kp[KIND]
    if kind == RBF:
        d2 = sq_a + sq_b - 2.0 * dot
        return math.exp(-kp[GAMMA] * max(d2, 0.0))
    if kind == POLY:
        return (kp[GAMMA] * dot + kp[COEF0]) ** kp[DEGREE]
    return dot


@njit(cache=True)
def self_kernel(kp, sq):
    """K(a, a) from ||a||^2."""
    return from_dot(kp, sq, sq, sq)


@njit(cache=True)
def sq_norm(val):
    total = 0.0
    for j in range(val.shape[0]):
        total += val[j] * val[j]
    return total


@njit(cache=True)
def sparse_dot(S, i, idx, val):
    """S[i] . x for a sparse x (idx < 0 entries skipped)."""
    total = 0.0
    for j in range(idx.shape[0]):
        c = idx[j]
        if c >= 0:
            total += S[i, c] * val[j]
    return total


@njit(cache=True)
def row(kp, S, slots, size, idx, val, x_sq, out):
    """out[i] = K(x, S[i]) for the `size` stored vectors."""
    for i in range(size):
        out[i] = from_dot(kp, sparse_dot(S, i, idx, val), x_sq, slots[i, SQ_NORM])


@njit(cache=True)
def stored_pair(kp, S, slots, i, j):
    """K(S[i], S[j]) between two stored vectors."""
    dot = 0.0
    for c in range(S.shape[1]):
        dot += S[i, c] * S[j, c]
    return from_dot(kp, dot, slots[i, SQ_NORM], slots[j, SQ_NORM])


@njit(cache=True)
def stored_row(kp, S, slots, size, i, out):
    """out[j] = K(S[i], S[j]) for j < size."""
    for j in range(size):
        out[j] = stored_pair(kp, S, slots, i, j)


@njit(cache=True)
def store(S, slots, slot, idx, val, x_sq):
    """Write x into row `slot` (all of idx must be >= 0) and set its SQ_NORM; other fields are the
    caller's."""
    for c in range(S.shape[1]):
        S[slot, c] = 0.0
    for j in range(idx.shape[0]):
        S[slot, idx[j]] += val[j]
    slots[slot, SQ_NORM] = x_sq


@njit(cache=True)
def remove(S, slots, size, i):
    """Remove row i by moving the last stored row into it. Returns the new size."""
    last = size - 1
    if i != last:
        for c in range(S.shape[1]):
            S[i, c] = S[last, c]
        for f in range(slots.shape[1]):
            slots[i, f] = slots[last, f]
    for c in range(S.shape[1]):
        S[last, c] = 0.0
    for f in range(slots.shape[1]):
        slots[last, f] = 0.0
    return last


@njit(cache=True)
def decision(kp, S, slots, size, idx, val, x_sq):
    """f(x) = sum_i COEF_i LABEL_i K(x, S[i]): the usual dual form of a kernel classifier."""
    total = 0.0
    for i in range(size):
        k = from_dot(kp, sparse_dot(S, i, idx, val), x_sq, slots[i, SQ_NORM])
        total += slots[i, COEF] * slots[i, LABEL] * k
    return total


@njit(cache=True)
def oldest(slots, size):
    """Index of the stored vector with the smallest BORN."""
    best = 0
    for i in range(1, size):
        if slots[i, BORN] < slots[best, BORN]:
            best = i
    return best


# Leading layout of every kernel model's state array `st` (model-specific entries follow).
ST_SIZE = 0  # number of stored support vectors
ST_TRIALS = 1  # examples learnt from
ST_KP = 2  # kernel parameters, st[ST_KP : ST_KP + KP_SIZE]
ST_PLATT = ST_KP + KP_SIZE  # calibration state, st[ST_PLATT : ST_PLATT + calibration.SIZE]
ST_MODEL = ST_PLATT + calibration.SIZE  # first model-specific entry


@njit(cache=True)
def decision_st(S, slots, st, idx, val):
    """`decision` with the size and kernel parameters read from a kernel model's `st`."""
    kp = st[ST_KP : ST_KP + KP_SIZE]
    return decision(kp, S, slots, int(st[ST_SIZE]), idx, val, sq_norm(val))
