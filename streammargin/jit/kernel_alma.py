"""Hot loops of kernel ALMA_2 on a budget (`streammargin.kernel_alma`).

ALMA_2 (Gentile 2001) in dual form, on instances normalised in feature space,
xh = phi(x) / sqrt(K(x, x)). The hypothesis w = SCALE sum_i a_i phi(s_i) is
`streammargin.jit.budget`'s, with the normalisation folded into the coefficients: a correction
w' = w + eta_k y xh stores x with a = eta_k y / (SCALE sqrt(K(x, x))). The margin is

    w . xh = SCALE sum_i a_i K(s_i, x) / sqrt(K(x, x)),

and the projection w <- w' / max(1, ||w'||) only divides SCALE (lazy norm scaling). The norm
comes from the cached margins: ||w'||^2 = SCALE^2 sum_i a_i MARGIN_i, exact after any eviction,
merge or projection of the budget policy, in O(budget).

Own entries of `st` after `budget.ST_BUDGET_END` (`LAYOUT`): the correction counter k (starts at
1) and the hyper-parameters alpha, B, C.
"""

from __future__ import annotations

import math

import numpy as np

from streammargin.jit import budget as bjit
from streammargin.jit import calibration
from streammargin.jit import kernels as kjit
from streammargin.jit.budget import SCALE, UPDATES
from streammargin.jit.dispatch import njit
from streammargin.jit.kernels import ST_MODEL, ST_PLATT, ST_SIZE
from streammargin.jit.layout import COUNTER, HYPER, Slot
from streammargin.jit.rows import row_entries

LAYOUT = bjit.LAYOUT.extend(
    "kernel ALMA",
    Slot("k", COUNTER, "the correction counter k: corrections + 1"),
    Slot("alpha", HYPER, param="alpha"),
    Slot("B", HYPER, "B, or 1 / alpha when B is None"),
    Slot("C", HYPER, param="C"),
)
K, ALPHA, B, C = LAYOUT.offsets("k", "alpha", "B", "C")
STATE_SIZE = LAYOUT.size


@njit(cache=True)
def score_keep_row(S, slots, st, idx, val, krow):
    """The served margin w . xh (last or averaged hypothesis; 0 when K(x, x) = 0), leaving x's
    kernel row in krow (flagged in its last entry) for a `learn` on the same instance."""
    kp = bjit.kernel_params(st)
    x_sq = kjit.sq_norm(val)
    self_k = kjit.self_kernel(kp, x_sq)
    if self_k <= 0.0:
        return 0.0
    size = int(st[ST_SIZE])
    kjit.row(kp, S, slots, size, idx, val, x_sq, krow)
    krow[krow.shape[0] - 1] = 1.0
    return bjit.served_sum(slots, st, size, krow) / math.sqrt(self_k)


@njit(cache=True)
def learn(S, slots, st, gram_inv, idx, val, y, krow):
    """One trial of ALMA_2 on (x, y), y in {-1.0, +1.0}. Returns 1 on a correction, else 0.

    Every column of idx must be >= 0 (the caller grows the feature space first). krow is a
    scratch row of budget + 2 entries; if its last entry is 1.0 it already holds x's kernel row.
    """
    kp = bjit.kernel_params(st)
    x_sq = kjit.sq_norm(val)
    self_k = kjit.self_kernel(kp, x_sq)
    if self_k <= 0.0:  # xh undefined: "no update takes place" (the paper's footnote 4)
        krow[krow.shape[0] - 1] = 0.0
        bjit.end_trial(st)
        return 0
    size = int(st[ST_SIZE])
    bjit.served_row(kp, S, slots, st, idx, val, x_sq, krow)
    fx = bjit.row_sum(slots, size, krow)
    norm_x = math.sqrt(self_k)
    served = bjit.served_sum(slots, st, size, krow) / norm_x
    calibration.learn(st[ST_PLATT:ST_MODEL], served, y)
    k = st[K]
    if y * st[SCALE] * fx / norm_x > (1.0 - st[ALPHA]) * st[B] / math.sqrt(k):
        bjit.end_trial(st)
        return 0
    eta = st[C] / math.sqrt(k)
    a = eta * y / (st[SCALE] * norm_x)
    bjit.add_with_budget(kp, S, slots, st, gram_inv, idx, val, x_sq, krow, a, y, self_k, fx)
    norm2 = bjit.squared_norm(slots, st)
    if norm2 > 1.0:
        st[SCALE] /= math.sqrt(norm2)
    st[K] = k + 1.0
    st[UPDATES] += 1.0
    bjit.housekeeping(kp, S, slots, st)
    bjit.end_trial(st)
    return 1


@njit(cache=True, any_layout=("X",))
def learn_rows(S, slots, st, gram_inv, X, cols, y):
    """`learn` over the rows of X (NaN = absent feature). Returns the number of corrections."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    krow = np.zeros(S.shape[0] + 2)
    corrections = 0
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        corrections += learn(S, slots, st, gram_inv, idx_buf[:n], val_buf[:n], y[r], krow)
    return corrections


@njit(cache=True, any_layout=("X",))
def score_rows(S, slots, st, X, cols, out):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    krow = np.zeros(S.shape[0] + 2)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        out[r] = score_keep_row(S, slots, st, idx_buf[:n], val_buf[:n], krow)
