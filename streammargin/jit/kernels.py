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

Kernel values are finite for any finite input, from 1e-300 to 1e300: squared norms saturate at the
largest float, an RBF distance whose squared norms exceed LIMIT is computed from the vectors
themselves (no cancellation; it may overflow to inf, giving K = 0, the right limit), and linear and
polynomial values are clamped to [-BIG, BIG]. NaN never appears.
"""

from __future__ import annotations

import math

import numpy as np

from streammargin.jit import calibration
from streammargin.jit.dispatch import njit
from streammargin.jit.layout import CALIBRATION, COUNTER, HYPER, Layout, Slot

LINEAR, RBF, POLY = 0, 1, 2
KERNELS = {"linear": LINEAR, "rbf": RBF, "poly": POLY}

# Leading layout of every kernel model's state array `st` (model-specific entries follow, from
# ST_MODEL on). A support cache without a kernel (the linear MPU) keeps the kernel slots at zero.
HEAD = Layout(
    "support cache",
    Slot("size", COUNTER, "number of stored support vectors"),
    Slot("trials", COUNTER, "examples learnt from"),
    Slot("kernel", HYPER, "the kernel's code (KERNELS)", param="kernel", codes=KERNELS),
    Slot("gamma", HYPER, "the kernel width; with gamma=\"auto\" its estimate (0 until made)",
         param="gamma"),
    Slot("degree", HYPER, param="degree"),
    Slot("coef0", HYPER, param="coef0"),
    Slot("platt", CALIBRATION, size=calibration.SIZE, parts=calibration.LAYOUT),
)
ST_SIZE, ST_TRIALS, ST_KP, ST_PLATT = HEAD.offsets("size", "trials", "kernel", "platt")
ST_MODEL = HEAD.size  # first model-specific entry
# The kernel parameters kp = st[ST_KP : ST_KP + KP_SIZE], as numba's kernels index them.
KIND, GAMMA, DEGREE, COEF0 = (o - ST_KP for o in HEAD.offsets("kernel", "gamma", "degree", "coef0"))
KP_SIZE = ST_PLATT - ST_KP

# Common slot fields.
LABEL, COEF, SQ_NORM, BORN = range(4)
N_COMMON_FIELDS = 4


def kernel_params(kernel: str, gamma: float, degree: int, coef0: float) -> np.ndarray:
    return np.array([KERNELS[kernel], gamma, degree, coef0], dtype=np.float64)


LIMIT = 1e300  # squared norms beyond this take the direct (overflow-safe) path
BIG = 1e100  # linear and polynomial kernel values are clamped to [-BIG, BIG]
MAX_FINITE = 1.7976931348623157e308


@njit(cache=True)
def _clamp(v):
    if v > BIG:
        return BIG
    if v < -BIG:
        return -BIG
    return v


@njit(cache=True)
def _from_dot_not_rbf(kp, dot):
    """Linear or polynomial kernel value from a dot product, clamped to [-BIG, BIG]."""
    if kp[KIND] == POLY:
        return _clamp(_clamp(kp[GAMMA] * dot + kp[COEF0]) ** kp[DEGREE])
    return _clamp(dot)


@njit(cache=True)
def from_dot(kp, dot, sq_a, sq_b):
    """K(a, b) from a.b, ||a||^2 and ||b||^2 (finite; with norms beyond LIMIT an RBF value from
    dot products is meaningless, and `row`/`stored_pair` compute it from the vectors instead)."""
    if kp[KIND] == RBF:
        d2 = sq_a + sq_b - 2.0 * dot
        if not d2 > 0.0:  # also NaN, from inf - inf: far beyond any meaningful distance
            return 1.0 if d2 == d2 else 0.0
        return math.exp(-kp[GAMMA] * d2)
    return _from_dot_not_rbf(kp, dot)


@njit(cache=True)
def self_kernel(kp, sq):
    """K(a, a) from ||a||^2 (as `sq_norm` gives it, saturated)."""
    if kp[KIND] == RBF:
        return 1.0
    return _from_dot_not_rbf(kp, sq)


@njit(cache=True)
def sq_norm(val):
    """||val||^2, saturated at the largest float instead of overflowing to inf."""
    total = 0.0
    for j in range(val.shape[0]):
        total += val[j] * val[j]
    if total > MAX_FINITE:
        return MAX_FINITE
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
def _query_slow(kp, S, i, idx, val):
    """K(x, S[i]) when a squared norm is beyond LIMIT: no cancellation, no NaN."""
    columns = S.shape[1]
    if kp[KIND] == RBF:
        present = np.zeros(columns, dtype=np.bool_)
        d2 = 0.0
        for j in range(idx.shape[0]):
            c = idx[j]
            if c >= 0:
                diff = val[j] - S[i, c]
                d2 += diff * diff
                present[c] = True
            else:
                d2 += val[j] * val[j]
        for c in range(columns):
            if not present[c]:
                d2 += S[i, c] * S[i, c]
        return math.exp(-kp[GAMMA] * d2)  # d2 may be inf: K = 0, the right limit
    largest_x = 0.0
    for j in range(idx.shape[0]):
        if idx[j] >= 0:
            largest_x = max(largest_x, abs(val[j]))
    largest_s = 0.0
    for c in range(columns):
        largest_s = max(largest_s, abs(S[i, c]))
    dot = 0.0
    if largest_x > 0.0 and largest_s > 0.0:
        for j in range(idx.shape[0]):
            c = idx[j]
            if c >= 0:
                dot += (val[j] / largest_x) * (S[i, c] / largest_s)
        dot = (dot * largest_x) * largest_s
    return _from_dot_not_rbf(kp, dot)


@njit(cache=True)
def _query(kp, S, slots, i, idx, val, x_sq):
    """K(x, S[i]); x_sq = sq_norm(val)."""
    s_sq = slots[i, SQ_NORM]
    if x_sq < LIMIT and s_sq < LIMIT:
        dot = sparse_dot(S, i, idx, val)
        if kp[KIND] == RBF:
            d2 = x_sq + s_sq - 2.0 * dot
            return math.exp(-kp[GAMMA] * d2) if d2 > 0.0 else 1.0
        return _from_dot_not_rbf(kp, dot)
    return _query_slow(kp, S, i, idx, val)


@njit(cache=True)
def row(kp, S, slots, size, idx, val, x_sq, out):
    """out[i] = K(x, S[i]) for the `size` stored vectors; x_sq = sq_norm(val). Finite for any
    finite input: squared norms beyond LIMIT are computed from the vectors, without cancellation."""
    for i in range(size):
        out[i] = _query(kp, S, slots, i, idx, val, x_sq)


@njit(cache=True)
def stored_pair(kp, S, slots, i, j):
    """K(S[i], S[j]) between two stored vectors, finite."""
    columns = S.shape[1]
    if kp[KIND] == RBF:
        d2 = 0.0
        for c in range(columns):
            diff = S[i, c] - S[j, c]
            d2 += diff * diff
        return math.exp(-kp[GAMMA] * d2)
    if slots[i, SQ_NORM] < LIMIT and slots[j, SQ_NORM] < LIMIT:
        dot = 0.0
        for c in range(columns):
            dot += S[i, c] * S[j, c]
        return _from_dot_not_rbf(kp, dot)
    largest_i = 0.0
    largest_j = 0.0
    for c in range(columns):
        largest_i = max(largest_i, abs(S[i, c]))
        largest_j = max(largest_j, abs(S[j, c]))
    dot = 0.0
    if largest_i > 0.0 and largest_j > 0.0:
        for c in range(columns):
            dot += (S[i, c] / largest_i) * (S[j, c] / largest_j)
        dot = (dot * largest_i) * largest_j
    return _from_dot_not_rbf(kp, dot)


@njit(cache=True)
def stored_row(kp, S, slots, size, i, out):
    """out[j] = K(S[i], S[j]) for j < size."""
    for j in range(size):
        out[j] = stored_pair(kp, S, slots, i, j)


@njit(cache=True)
def stored_entries(S, i, idx, val):
    """The nonzero columns of stored row i and their values, in column order, into idx and val
    (room for S.shape[1]); returns their count. A stored vector as a query that is the same
    whatever order its features came in (or collided in), so kernel values computed from it at
    insertion can be computed again, bit for bit, from a checkpoint's cache."""
    n = 0
    for c in range(S.shape[1]):
        value = S[i, c]
        if value != 0.0:
            idx[n] = c
            val[n] = value
            n += 1
    return n


@njit(cache=True)
def stored_query_row(kp, S, slots, q, rows, out):
    """out[k] = K(S[q], S[rows[k]]) with S[q] as the query (`stored_entries`, its squared norm
    slots[q, SQ_NORM]): how a Gram matrix's entries are made, at insertion and on restore."""
    idx = np.empty(S.shape[1], dtype=np.int64)
    val = np.empty(S.shape[1])
    n = stored_entries(S, q, idx, val)
    x_sq = slots[q, SQ_NORM]
    for k in range(rows.shape[0]):
        out[k] = _query(kp, S, slots, rows[k], idx[:n], val[:n], x_sq)


@njit(cache=True)
def stored_gram(kp, S, slots, size, gram):
    """gram[i, j] = gram[j, i] = K(S[i], S[j]) for i != j < size, each with the later-born of the
    two (larger BORN; ties: the larger index) as the query, as `stored_query_row` computed it when
    that one entered the cache. The diagonal is the caller's."""
    order = np.argsort(slots[:size, BORN], kind="mergesort")
    out = np.empty(max(size, 1))
    for a in range(1, size):
        q = order[a]
        stored_query_row(kp, S, slots, q, order[:a], out)
        for b in range(a):
            gram[q, order[b]] = out[b]
            gram[order[b], q] = out[b]


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
def remove_from_gram(gram, size, i):
    """The Gram matrix side of `remove`: row and column size - 1 move into i, then are zeroed."""
    last = size - 1
    if i != last:
        for j in range(size):
            gram[i, j] = gram[last, j]
        for j in range(size):
            gram[j, i] = gram[j, last]
        gram[i, i] = gram[last, last]
    for j in range(size):
        gram[last, j] = 0.0
        gram[j, last] = 0.0


@njit(cache=True)
def decision(kp, S, slots, size, idx, val, x_sq):
    """f(x) = sum_i COEF_i LABEL_i K(x, S[i]), the usual dual form of a kernel classifier, without
    a row buffer; vectors with a zero coefficient are skipped."""
    total = 0.0
    for i in range(size):
        a = slots[i, COEF] * slots[i, LABEL]
        if a != 0.0:
            total += a * _query(kp, S, slots, i, idx, val, x_sq)
    return total


@njit(cache=True)
def oldest(slots, size):
    """Index of the stored vector with the smallest BORN."""
    best = 0
    for i in range(1, size):
        if slots[i, BORN] < slots[best, BORN]:
            best = i
    return best

