"""Hot loops of the kernel perceptron on a budget (`streammargin.budget_perceptron`).

The hypothesis and the cache are `streammargin.jit.budget`'s: f(x) = SCALE sum_i a_i K(s_i, x).
A trial on (x, y) is the kernel perceptron's with Crammer, Kandola & Singer's margin beta
(`st[UPDATE_MARGIN]`; 0 is the plain perceptron): when y f(x) <= beta, add y K(x, .) to f. When
the cache is full the policy keeps it within the budget; for OLDEST that is the self-tuned
Forgetron: remove the oldest vector after shrinking the whole hypothesis by the phi of
`budget.forgetron_phi`. For PROJECT a mistake (y f(x) <= 0) is the Projectron's update and a
margin error (0 < y f(x) <= beta) Projectron++'s projection (`budget.projectron_margin_step`).

Arrays: S, slots (budget.N_FIELDS fields), st (`LAYOUT`: `streammargin.jit.budget`'s and the
margin) and gram_inv (budget x budget, the Projectron's inverse Gram matrix; 0 x 0 otherwise).
"""

from __future__ import annotations

import numpy as np

from streammargin.jit import budget as bjit
from streammargin.jit import calibration
from streammargin.jit import kernels as kjit
from streammargin.jit.budget import (
    COEF,
    FORGETRON_Q,
    LABEL,
    MARGIN,
    OLDEST,
    POLICY,
    PROJECT,
    SCALE,
    UPDATES,
)
from streammargin.jit.dispatch import njit
from streammargin.jit.kernels import ST_MODEL, ST_PLATT, ST_SIZE
from streammargin.jit.layout import COUNTER, HYPER, Slot
from streammargin.jit.rows import row_entries

# The budget learners' entries, then the perceptron's own (appended, so that a state saved before
# them is the same array one slot short of each: `BudgetPerceptron._checked_arrays`).
LAYOUT = bjit.LAYOUT.extend(
    "budget perceptron",
    Slot("margin", HYPER, "update when y f(x) <= margin (0: on mistakes only)", param="margin"),
    Slot("margin_updates", COUNTER, "updates on margin errors, 0 < y f(x) <= margin"),
)
UPDATE_MARGIN, MARGIN_UPDATES = LAYOUT.offsets("margin", "margin_updates")
STATE_SIZE = LAYOUT.size


@njit(cache=True)
def score_keep_row(S, slots, st, idx, val, krow):
    """The served f(x) (last or averaged hypothesis), leaving x's kernel row in krow (flagged
    in its last entry) for a `learn` on the same instance."""
    kp = bjit.kernel_params(st)
    size = int(st[ST_SIZE])
    kjit.row(kp, S, slots, size, idx, val, kjit.sq_norm(val), krow)
    krow[krow.shape[0] - 1] = 1.0
    return bjit.served_sum(slots, st, size, krow)


@njit(cache=True)
def _forgetron_update(kp, S, slots, st, idx, val, x_sq, krow, y, self_k):
    """The Forgetron's steps on a full cache: perceptron step, shrink by phi, remove the oldest."""
    size = int(st[ST_SIZE])
    r = bjit.kjit.oldest(slots, size)
    scale = st[SCALE]
    sigma = scale * slots[r, COEF]  # the oldest vector's weight sigma_{r,t}
    mu = slots[r, LABEL] * (scale * slots[r, MARGIN] + y * krow[r])  # y_r f'_t(x_r)
    phi, damage = bjit.forgetron_phi(sigma, mu, st[FORGETRON_Q], st[UPDATES])
    # phi keeps Q + damage <= 15/32 M; when a large negative Q (mu >> sigma: Psi < 0) is nearly
    # taken back, the sum's rounding (eps |Q|: 7e66 at Q = -5e82) would pass that bound.
    st[FORGETRON_Q] = min(st[FORGETRON_Q] + damage, 15.0 / 32.0 * st[UPDATES])
    bjit.remove_vector(kp, S, slots, st, r, krow)
    st[bjit.EVICTIONS] += 1.0
    fx = bjit.row_sum(slots, int(st[ST_SIZE]), krow)
    bjit.add_vector(S, slots, st, idx, val, x_sq, krow, y / scale, y, self_k, fx)
    if phi > 0.0:
        st[SCALE] = scale * phi
    else:  # a total shrink: every coefficient is 0 (rounding only, see forgetron_phi)
        for i in range(int(st[ST_SIZE])):
            bjit.checkpoint(slots, st, i)
            slots[i, COEF] = 0.0
            slots[i, MARGIN] = 0.0
        st[SCALE] = 1.0


@njit(cache=True)
def learn(S, slots, st, gram_inv, idx, val, y, krow):
    """One trial on (x, y), y in {-1.0, +1.0}. Returns 1 on an update (a mistake, or a margin
    error that changed f), else 0.

    Every column of idx must be >= 0 (the caller grows the feature space first). krow is a
    scratch row of budget + 2 entries; if its last entry is 1.0 it already holds x's kernel row.
    """
    kp = bjit.kernel_params(st)
    size = int(st[ST_SIZE])
    x_sq = kjit.sq_norm(val)
    bjit.served_row(kp, S, slots, st, idx, val, x_sq, krow)
    fx = bjit.row_sum(slots, size, krow)
    served = bjit.served_sum(slots, st, size, krow)
    calibration.learn(st[ST_PLATT:ST_MODEL], served, y)
    self_k = kjit.self_kernel(kp, x_sq)
    # y f(x) = y SCALE fx <= margin, compared without the product's underflow (SCALE >= 1e-60, so
    # margin / SCALE <= 1e66): at margin 0 this is the plain perceptron's y fx <= 0.
    if y * fx > st[UPDATE_MARGIN] / st[SCALE] or self_k <= 0.0:  # phi(x) = 0: nothing to add
        bjit.end_trial(st)
        return 0
    if y * fx > 0.0:  # a margin error: the prediction was right
        if int(st[POLICY]) == PROJECT:
            loss = st[UPDATE_MARGIN] - y * fx * st[SCALE]
            if not bjit.projectron_margin_step(slots, st, gram_inv, krow, loss, y, self_k):
                bjit.end_trial(st)
                return 0
            st[UPDATES] += 1.0
            st[MARGIN_UPDATES] += 1.0
            bjit.housekeeping(kp, S, slots, st)
            bjit.end_trial(st)
            return 1
        st[MARGIN_UPDATES] += 1.0
    st[UPDATES] += 1.0
    if int(st[POLICY]) == OLDEST and size >= S.shape[0]:
        _forgetron_update(kp, S, slots, st, idx, val, x_sq, krow, y, self_k)
    else:
        bjit.add_with_budget(
            kp, S, slots, st, gram_inv, idx, val, x_sq, krow, y / st[SCALE], y, self_k, fx
        )
    bjit.housekeeping(kp, S, slots, st)
    bjit.end_trial(st)
    return 1


@njit(cache=True, any_layout=("X",))
def learn_rows(S, slots, st, gram_inv, X, cols, y):
    """`learn` over the rows of X (NaN = absent feature). Returns the number of updates."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    krow = np.zeros(S.shape[0] + 2)
    updates = 0
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        updates += learn(S, slots, st, gram_inv, idx_buf[:n], val_buf[:n], y[r], krow)
    return updates


@njit(cache=True, any_layout=("X",))
def score_rows(S, slots, st, X, cols, out):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    krow = np.zeros(S.shape[0] + 2)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        out[r] = score_keep_row(S, slots, st, idx_buf[:n], val_buf[:n], krow)
