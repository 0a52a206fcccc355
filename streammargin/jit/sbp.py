"""Hot loops of the kernelized Stochastic Batch Perceptron (Cotter, Shalev-Shwartz & Srebro 2012,
Appendix B, Algorithms 1 and 2), run over a window of the most recent examples.

The slack-constrained SVM over the n points of the window: maximise the margin gamma subject to
||w|| <= 1 and a total slack n nu. With w = sum_i alpha_i y_i phi(x_i) and the responses
c_i = y_i <w, phi(x_i)>, one SBP step is

    gamma  = find_gamma(c, n nu)                 the water level (Algorithm 2, linear time)
    i      ~ uniform{j : c_j < gamma}            a minimax-optimal p*
    alpha_i += eta_t;  r^2 += 2 eta_t c_i + eta_t^2 K(x_i, x_i)
    c_j    += eta_t y_i y_j K(x_i, x_j)  for all j
    if r > 1: alpha /= r, c /= r                 the projection on the unit ball

with eta_0 = 1 / sqrt(max_i K(x_i, x_i)), and the prediction uses the averaged coefficients.

On a stream (see `streammargin.sbp.SBPClassifier`) each incoming example joins the window (the
oldest one leaves, its alpha taken out of w and of every response), then STEPS SBP steps run over
the window. Two schedules change, both with the horizon H = window x STEPS (one window's life):
- the step is eta_t = eta_0 / sqrt(min(t, H)): the paper's eta_0 / sqrt(t) until t = H, then
  constant, so that later windows are learnt as fast as the first (with 1 / sqrt(t) the steps
  would shrink for ever while the points they are about keep changing);
- the average is an exponential moving average of alpha with rate 1 / min(t, H): the paper's
  plain average over all steps until t = H, then over about the last H steps, because a plain
  average would stay dominated by points that have long left the window.

Kernel rows come from a Gram matrix of the window, `gram` (window x window), filled when a point
enters: a step then costs O(n) additions and no kernel evaluation. The Gram matrix is not saved;
a restored model rebuilds it from the stored vectors bit for bit, because every entry is computed
as the column-ordered dot product of two stored vectors (the query is sorted by column before
its row is computed, and adding the skipped zero products would not change the sum).

Slots (`streammargin.jit.kernels` common fields, then RESP and AVG): LABEL y_i, COEF alpha_i,
SQ_NORM, BORN (the trial that brought the point), RESP c_i, AVG the averaged alpha_i.

Numerical guards (they only act on absurd inputs): values are clipped to +-MAX_VALUE so squared
norms stay finite, and kernel values are saturated at +-MAX_KERNEL, so the responses, ||w|| <= 1
and the served score stay finite whatever the data; the step eta_0 is at most 1e100 (see
MIN_STEP_KERNEL).
"""

from __future__ import annotations

import math

import numpy as np

from streammargin.jit import calibration, rng
from streammargin.jit import kernels as kjit
from streammargin.jit.dispatch import njit
from streammargin.jit.layout import COUNTER, HYPER, LEARNT, Slot
from streammargin.jit.rows import row_entries

RESP, AVG = kjit.N_COMMON_FIELDS, kjit.N_COMMON_FIELDS + 1
N_FIELDS = kjit.N_COMMON_FIELDS + 2

# `st`: the support cache's head (kjit.HEAD), then these.
LAYOUT = kjit.HEAD.extend(
    "SBP",
    Slot("steps_done", COUNTER, "SGD steps taken"),
    Slot("r2", LEARNT, "||w||^2 of the current hypothesis (projected onto the unit ball)"),
    Slot("nu", HYPER, param="nu"),
    Slot("steps", HYPER, "SGD steps per example", param="steps"),
    Slot("seed", HYPER, "key of the counter-based generator", param="seed"),
    Slot("draws", COUNTER, "draws of the generator so far"),
    Slot("horizon", HYPER, "window * steps"),
)
STEPS_DONE, R2, NU, STEPS, SEED, DRAWS, HORIZON = LAYOUT.offsets(
    "steps_done", "r2", "nu", "steps", "seed", "draws", "horizon"
)

MAX_VALUE = 1e100
MAX_KERNEL = 1e100
# The step eta_0 = 1 / sqrt(max(max_j K(x_j, x_j), MIN_STEP_KERNEL)) is at most 1e100. Kernel
# values below 1e-200 (a linear kernel on values under 1e-100) are too near float64's floor for
# the scale-free step: with them it passed 1e154, eta^2 overflowed (inf * 0 = NaN in ||w||^2),
# and a point whose K_ii underflowed to 0 gained 1e154 a step. At most 1e100 x window x steps
# (1e108) a coefficient, within the range a restore accepts.
MIN_STEP_KERNEL = 1e-200


@njit(cache=True)
def find_gamma(buf, n, volume):
    """The water level gamma with sum_i max(0, gamma - buf[i]) = volume over buf[:n].

    Algorithm 2 of the paper: divide and conquer around a pivot (median of three), O(n) expected.
    Reorders buf[:n]. With volume 0 it is min(buf[:n]).
    """
    if n == 0:
        return 0.0
    if volume <= 0.0:
        low = buf[0]
        for i in range(1, n):
            if buf[i] < low:
                low = buf[i]
        return low
    lo, hi = 0, n
    below_n = 0  # elements known to be under water
    below_sum = 0.0
    while lo < hi:
        a, b, c = buf[lo], buf[(lo + hi) // 2], buf[hi - 1]
        pivot = max(min(a, b), min(max(a, b), c))
        # Three-way partition of buf[lo:hi]: [lo, lt) < pivot, [lt, gt) == pivot, [gt, hi) > pivot.
        lt, i, gt = lo, lo, hi
        while i < gt:
            v = buf[i]
            if v < pivot:
                buf[i], buf[lt] = buf[lt], v
                lt += 1
                i += 1
            elif v > pivot:
                gt -= 1
                buf[i], buf[gt] = buf[gt], v
            else:
                i += 1
        less_sum = 0.0
        for j in range(lo, lt):
            less_sum += buf[j]
        # Water needed to bring the level up to the pivot over everything below it.
        needed = pivot * (below_n + lt - lo) - (below_sum + less_sum)
        if needed >= volume:
            hi = lt  # the level stays at or below the pivot
        else:
            below_n += gt - lo
            below_sum += less_sum + pivot * (gt - lt)
            lo = gt
    return (volume + below_sum) / below_n


@njit(cache=True)
def kernel_value(kp, dot, sq_a, sq_b):
    """K from a.b and the squared norms, saturated at +-MAX_KERNEL."""
    k = kjit.from_dot(kp, dot, sq_a, sq_b)
    return min(max(k, -MAX_KERNEL), MAX_KERNEL)


@njit(cache=True)
def _clipped_sorted(idx, val):
    """The instance sorted by column, values clipped to +-MAX_VALUE (copies).

    Its columns are distinct, so the order is unique. An instance from the feature space comes
    sorted already (one pass finds it); a frame's row may not, and is merge-sorted (bottom-up,
    written out: numba's argsort compiled its quicksort, 0.9 s of a fresh process's wait for its
    first prediction)."""
    n = idx.shape[0]
    order = np.arange(n)
    ascending = True
    for j in range(1, n):
        if idx[j] < idx[j - 1]:
            ascending = False
            break
    if not ascending:
        spare = np.empty(n, dtype=np.int64)
        width = 1
        while width < n:
            for start in range(0, n, 2 * width):
                middle = min(start + width, n)
                end = min(start + 2 * width, n)
                a, b = start, middle
                for k in range(start, end):
                    if a < middle and (b >= end or idx[order[a]] < idx[order[b]]):
                        spare[k] = order[a]
                        a += 1
                    else:
                        spare[k] = order[b]
                        b += 1
            order, spare = spare, order
            width *= 2
    sidx = np.empty(n, dtype=np.int64)
    sval = np.empty(n)
    for j in range(n):
        sidx[j] = idx[order[j]]
        sval[j] = min(max(val[order[j]], -MAX_VALUE), MAX_VALUE)
    return sidx, sval


@njit(cache=True)
def kernel_row(S, slots, st, idx, val, x_sq, out):
    """out[j] = K(x, S[j]) for the stored points (x already clipped)."""
    kp = st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE]
    for j in range(int(st[kjit.ST_SIZE])):
        out[j] = kernel_value(kp, kjit.sparse_dot(S, j, idx, val), x_sq, slots[j, kjit.SQ_NORM])


@njit(cache=True)
def averaged_score(slots, size, row):
    """sum_j avg_alpha_j y_j K(x_j, x): the averaged hypothesis (up to its positive scale)."""
    total = 0.0
    for j in range(size):
        total += slots[j, AVG] * slots[j, kjit.LABEL] * row[j]
    return total


@njit(cache=True)
def decision(S, slots, st, idx, val):
    """The served score of x."""
    size = int(st[kjit.ST_SIZE])
    if size == 0:
        return 0.0
    clipped = np.empty(val.shape[0])
    for j in range(val.shape[0]):
        clipped[j] = min(max(val[j], -MAX_VALUE), MAX_VALUE)
    row = np.empty(size)
    kernel_row(S, slots, st, idx, clipped, kjit.sq_norm(clipped), row)
    return averaged_score(slots, size, row)


@njit(cache=True)
def _evict(S, slots, gram, st, v, row):
    """Take point v out of the window: its alpha out of w and of every response, then move the
    last point into its slot (the Gram matrix and the new point's kernel row follow)."""
    size = int(st[kjit.ST_SIZE])
    a = slots[v, kjit.COEF]
    if a != 0.0:
        yv = slots[v, kjit.LABEL]
        # ||w - a y_v phi_v||^2 = r^2 - 2 a c_v + a^2 K_vv
        st[R2] = max(st[R2] - 2.0 * a * slots[v, RESP] + a * a * gram[v, v], 0.0)
        for j in range(size):
            slots[j, RESP] -= a * yv * slots[j, kjit.LABEL] * gram[v, j]
    row[v] = row[size - 1]
    kjit.remove_from_gram(gram, size, v)
    st[kjit.ST_SIZE] = kjit.remove(S, slots, size, v)


@njit(cache=True)
def _insert(S, slots, gram, st, idx, val, x_sq, y, row):
    """Add x (sorted, clipped) as the last point, alpha 0, its response y <w, phi(x)>."""
    size = int(st[kjit.ST_SIZE])
    kjit.store(S, slots, size, idx, val, x_sq)
    slots[size, kjit.LABEL] = y
    slots[size, kjit.COEF] = 0.0
    slots[size, kjit.BORN] = st[kjit.ST_TRIALS]
    slots[size, AVG] = 0.0
    response = 0.0
    for j in range(size):
        response += slots[j, kjit.COEF] * slots[j, kjit.LABEL] * row[j]
        gram[size, j] = row[j]
        gram[j, size] = row[j]
    kp = st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE]
    gram[size, size] = kernel_value(kp, x_sq, x_sq, x_sq)
    slots[size, RESP] = y * response
    st[kjit.ST_SIZE] = size + 1


@njit(cache=True)
def sbp_step(slots, gram, st, buf, eta0):
    """One step of Algorithm 1 over the window. Returns the index of the point stepped on."""
    n = int(st[kjit.ST_SIZE])
    t = st[STEPS_DONE] + 1.0
    st[STEPS_DONE] = t
    eta = eta0 / math.sqrt(min(t, st[HORIZON]))
    for j in range(n):
        buf[j] = slots[j, RESP]
    gamma = find_gamma(buf, n, n * st[NU])
    # Sample i uniformly among the points under water, c_i < gamma. When none is strictly under
    # (no slack, nu = 0, or a level that rounding put at the lowest responses), the lowest
    # responses are the minimax-optimal support: sample among c_i <= min c.
    under = 0
    for j in range(n):
        if slots[j, RESP] < gamma:
            under += 1
    strict = under > 0
    if not strict:
        gamma = slots[0, RESP]
        for j in range(1, n):
            gamma = min(gamma, slots[j, RESP])
        for j in range(n):
            if slots[j, RESP] <= gamma:
                under += 1
    target = rng.index(st[SEED], st[DRAWS], under)
    st[DRAWS] += 1.0
    i = -1
    for j in range(n):
        if slots[j, RESP] < gamma or (not strict and slots[j, RESP] <= gamma):
            if target == 0:
                i = j
                break
            target -= 1
    yi = slots[i, kjit.LABEL]
    slots[i, kjit.COEF] += eta
    st[R2] += 2.0 * eta * slots[i, RESP] + eta * eta * gram[i, i]
    for j in range(n):
        slots[j, RESP] += eta * yi * slots[j, kjit.LABEL] * gram[i, j]
    if st[R2] > 1.0:
        r = math.sqrt(st[R2])
        for j in range(n):
            slots[j, kjit.COEF] /= r
            slots[j, RESP] /= r
        st[R2] = 1.0
    rate = 1.0 / min(t, st[HORIZON])
    for j in range(n):
        slots[j, AVG] += rate * (slots[j, kjit.COEF] - slots[j, AVG])
    return i


@njit(cache=True)
def learn(S, slots, gram, st, idx, val, y):
    """One example (x, y), y in {-1, +1}: calibrate the served score, window it, run the steps.

    Every column in idx must be >= 0 and < S.shape[1]."""
    sidx, sval = _clipped_sorted(idx, val)
    x_sq = kjit.sq_norm(sval)
    size = int(st[kjit.ST_SIZE])
    row = np.empty(S.shape[0])
    kernel_row(S, slots, st, sidx, sval, x_sq, row)
    calibration.learn(st[kjit.ST_PLATT : kjit.ST_MODEL], averaged_score(slots, size, row), y)
    if size == S.shape[0]:
        _evict(S, slots, gram, st, kjit.oldest(slots, size), row)
    _insert(S, slots, gram, st, sidx, sval, x_sq, y, row)
    st[kjit.ST_TRIALS] += 1.0
    n = int(st[kjit.ST_SIZE])
    largest = 0.0
    for j in range(n):
        largest = max(largest, gram[j, j])
    if largest <= 0.0:
        return  # only zero vectors (or a kernel that is 0 on them): nothing to learn
    eta0 = 1.0 / math.sqrt(max(largest, MIN_STEP_KERNEL))
    buf = np.empty(n)
    for _ in range(int(st[STEPS])):
        sbp_step(slots, gram, st, buf, eta0)


@njit(cache=True)
def rebuild_gram(S, slots, st, gram):
    """The Gram matrix of the stored points, exactly as `learn` filled it."""
    kp = st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE]
    n = int(st[kjit.ST_SIZE])
    gram[:, :] = 0.0
    for i in range(n):
        for j in range(i + 1):
            dot = 0.0
            for c in range(S.shape[1]):
                dot += S[i, c] * S[j, c]
            k = kernel_value(kp, dot, slots[i, kjit.SQ_NORM], slots[j, kjit.SQ_NORM])
            gram[i, j] = k
            gram[j, i] = k


# Mini-batches: the same per-example functions over the rows of a frame (NaN = absent feature).


@njit(cache=True, any_layout=("X",))
def learn_rows(S, slots, gram, st, X, cols, y):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        learn(S, slots, gram, st, idx_buf[:n], val_buf[:n], y[r])


@njit(cache=True, any_layout=("X",))
def decision_rows(S, slots, st, X, cols, out):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        out[r] = decision(S, slots, st, idx_buf[:n], val_buf[:n])
