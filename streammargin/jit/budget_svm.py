"""SMO for the budget L1-SVM of Dekel & Singer (2006), batch and incremental.

The problem over a set of examples (x_i, y_i), without a bias term:

    max_a  D(a) = sum_i a_i - 1/2 sum_ij a_i a_j y_i y_j K_ij
    s.t.   0 <= a_i <= C,   sum_i a_i <= B C,

the dual of min_f 1/2 ||f||^2 + C ||xi||_K(1,inf,B), where the 1-inf interpolation norm of the
hinge losses xi_i = max(0, 1 - y_i f(x_i)) is the sum of the B largest (the paper's Theorem 1):
only the B worst-classified examples count, and at the optimum every example whose margin
exceeds the B-th smallest has a_i = 0 (Theorem 2). (The corollary "at most B support vectors"
needs the B-th and (B+1)-th margins to differ; at the optimum the free support vectors all sit
on the B-th margin, so in practice more than B keep a_i > 0 and a budget needs pruning.)

SMO adapted to the sum constraint. Write the constraint as an equality with a slack variable,
sum_i a_i + s = B C, s >= 0, of gradient 0 and no curvature. Every SMO step then moves one
"up" variable by +lambda and one "down" variable by -lambda, as in the paper's pair update
(a_k + lambda, a_l - lambda): two examples (the sum is unchanged), an example and the slack
(a_k alone goes up while the cap is not reached) or the slack and an example (a_l alone goes
down). With the gradient G_i = dD/da_i = 1 - y_i f(x_i) (G = 0 for the slack) the step is the
clipped Newton step lambda = (G_u - G_d) / eta, eta = K_uu + K_dd - 2 y_u y_d K_ud (K_uu or K_dd
when the other is the slack), clipped to the box and to 0 <= s <= B C: the end points of the
paper's Eqs. (10)-(12). Optimality is max_up G - min_down G <= tol (up: a_i < C, or the slack
when s < B C; down: a_i > 0, or the slack when s > 0); the pair is chosen by the second-order
rule of LIBSVM (Fan, Chen & Lin 2005).

Incremental use (`learn`): the cache holds at most `budget` examples plus one working row. An
example that violates the optimality conditions of the cached problem (G > min_down G + tol)
enters with a = 0; SMO takes up to `steps` steps, the first one on the new example. Examples
whose a is 0 and that satisfy the conditions leave (they do not change f). If the cache still
holds budget + 1 examples, one with a = 0 leaves if there is one; otherwise st[PRUNE] decides:
PRUNE_SMALLEST removes the smallest a, the paper's pruning heuristic (keep the B largest
weights); PRUNE_OLDEST removes the oldest example. Over an unbounded stream the B worst-classified
examples are largely the mislabelled ones, which the paper's rule keeps; removing the oldest
makes the cached problem the budget SVM of the recent margin violators instead. A Gram matrix
of the cache (K_ij, kept up to date in O(budget) per example) makes each step O(budget) without
kernel evaluations.

The gradients are updated incrementally and recomputed from the Gram matrix every REFRESH_EVERY
steps. Their rounding is relative to the largest kernel values they went through, st[KERNEL_PEAK]
(the largest |K_ij| of the cache since the last recomputation): when an example with kernel
values near the clamp (kernels.BIG) leaves, its terms leave behind their rounding, 1e81 in
gradients whose exact values are 1 after terms of 1e97. So after removals the gradients are
recomputed too if 1 + n C KERNEL_PEAK is more than PEAK_RATIO times 1 + n C max_i K_ii, the scale
of what is left (the largest value of a Gram matrix is on its diagonal for the RBF, linear and
polynomial kernels with coef0 >= 0; otherwise this recomputes more often than needed).

Arrays: S (budget + 1 rows), slots (N_FIELDS fields: LABEL, COEF = a_i, SQ_NORM, BORN, GRAD,
SELF), st (`LAYOUT` below) and gram ((budget + 1) x (budget + 1)). Each Gram entry is computed from
the stored vectors with the later-born one as the query (`kernels.stored_query_row`), so
`restore_gram` rebuilds the matrix bit for bit and checkpoints leave it out.
"""

from __future__ import annotations

import numpy as np

from streammargin.jit import budget as bjit
from streammargin.jit import calibration
from streammargin.jit import kernels as kjit
from streammargin.jit.dispatch import njit
from streammargin.jit.kernels import BORN, COEF, LABEL, ST_MODEL, ST_PLATT, ST_SIZE, ST_TRIALS
from streammargin.jit.layout import COUNTER, HYPER, LEARNT, Slot
from streammargin.jit.rows import row_entries

GRAD = kjit.N_COMMON_FIELDS  # G_i = 1 - y_i f(x_i)
SELF = GRAD + 1  # K_ii
N_FIELDS = SELF + 1

PRUNE_SMALLEST, PRUNE_OLDEST = 0.0, 1.0
PRUNES = {"smallest": PRUNE_SMALLEST, "oldest": PRUNE_OLDEST}

# `st`: the support cache's head (kjit.HEAD), then these.
LAYOUT = kjit.HEAD.extend(
    "budget SVM",
    Slot("C", HYPER, "the box: 0 <= a_i <= C", param="C"),
    Slot("cap", HYPER, "B C, the cap on sum_i a_i (budget * C)"),
    Slot("alpha_sum", LEARNT, "sum_i a_i"),
    Slot("tol", HYPER, param="tol"),
    Slot("steps", HYPER, "SMO steps per example", param="smo_steps"),
    Slot("added", COUNTER, "examples that entered the cache"),
    Slot("pruned", COUNTER, "support vectors (a > 0) removed to keep the budget"),
    Slot("released", COUNTER, "examples with a = 0 that left the cache"),
    Slot("smo_steps", COUNTER, "SMO steps taken"),
    Slot("since_refresh", COUNTER, "steps since the gradients were recomputed"),
    Slot(
        "prune",
        HYPER,
        "who leaves an over-full cache with no a = 0 (PRUNES)",
        param="prune",
        codes=PRUNES,
    ),
    Slot(
        "kernel_peak",
        LEARNT,
        "the largest |K_ij| of the cache since the gradients were recomputed",
    ),
)
(
    C_BOX,
    CAP,
    ALPHA_SUM,
    TOL,
    STEPS,
    ADDED,
    PRUNED,
    RELEASED,
    SMO_STEPS,
    SINCE_REFRESH,
    PRUNE,
) = LAYOUT.offsets(
    "C",
    "cap",
    "alpha_sum",
    "tol",
    "steps",
    "added",
    "pruned",
    "released",
    "smo_steps",
    "since_refresh",
    "prune",
)
KERNEL_PEAK = LAYOUT.offset("kernel_peak")
STATE_SIZE = LAYOUT.size

SLACK = -1  # the slack variable s of the sum constraint, as a working-set member
NONE = -2
REFRESH_EVERY = 2048  # recompute the gradients exactly every so many steps
# Recompute them after removals when the kernel scale they went through is this many times that of
# the cache left: their rounding then stays below REFRESH_EVERY eps PEAK_RATIO = 5e-10 of the scale
# of the exact gradients, 1 + n C max |K_ij|.
PEAK_RATIO = 1e3
MIN_CURVATURE = 1e-12


@njit(cache=True)
def _down_minimum(slots, st, n):
    """min G over the variables that may go down (a_i > 0, or s > 0 with G_s = 0); +inf if none."""
    lowest = np.inf
    if st[ALPHA_SUM] < st[CAP]:
        lowest = 0.0
    for i in range(n):
        if slots[i, COEF] > 0.0 and slots[i, GRAD] < lowest:
            lowest = slots[i, GRAD]
    return lowest


@njit(cache=True)
def _curvature(slots, gram, u, d):
    if u == SLACK:
        return slots[d, SELF]
    if d == SLACK:
        return slots[u, SELF]
    return slots[u, SELF] + slots[d, SELF] - 2.0 * slots[u, LABEL] * slots[d, LABEL] * gram[u, d]


@njit(cache=True)
def _select_down(slots, st, gram, n, u, g_u):
    """The down variable for u by the second-order rule: max (G_u - G_d)^2 / eta_ud, G_d < G_u."""
    best = NONE
    best_gain = 0.0
    if u != SLACK and st[ALPHA_SUM] < st[CAP] and g_u > 0.0:
        eta = max(slots[u, SELF], MIN_CURVATURE)
        best, best_gain = SLACK, g_u * g_u / eta
    for i in range(n):
        if i == u or slots[i, COEF] <= 0.0:
            continue
        diff = g_u - slots[i, GRAD]
        if diff <= 0.0:
            continue
        eta = max(_curvature(slots, gram, u, i), MIN_CURVATURE)
        gain = diff * diff / eta
        if gain > best_gain:
            best, best_gain = i, gain
    return best


@njit(cache=True)
def _select_up(slots, st, n):
    """(argmax G, max G) over the variables that may go up (a_i < C, or the slack when
    sum a > 0), and min G over those that may go down (`_down_minimum`), in one pass."""
    best = NONE
    highest = -np.inf
    lowest = np.inf
    if st[ALPHA_SUM] > 0.0:
        best, highest = SLACK, 0.0
    if st[ALPHA_SUM] < st[CAP]:
        lowest = 0.0
    c = st[C_BOX]
    for i in range(n):
        a = slots[i, COEF]
        g = slots[i, GRAD]
        if a < c and g > highest:
            best, highest = i, g
        if a > 0.0 and g < lowest:
            lowest = g
    return best, highest, lowest


@njit(cache=True)
def step(slots, st, gram, n, u, d):
    """One SMO step: a_u += lambda, a_d -= lambda (either may be the slack). Returns lambda."""
    c = st[C_BOX]
    g_u = 0.0 if u == SLACK else slots[u, GRAD]
    g_d = 0.0 if d == SLACK else slots[d, GRAD]
    bound_u = st[ALPHA_SUM] if u == SLACK else c - slots[u, COEF]  # s + lambda <= B C
    bound_d = st[CAP] - st[ALPHA_SUM] if d == SLACK else slots[d, COEF]  # s - lambda >= 0
    lam = min(bound_u, bound_d)
    eta = _curvature(slots, gram, u, d)
    if eta > MIN_CURVATURE:
        lam = min(lam, (g_u - g_d) / eta)
    if not lam > 0.0:
        return 0.0
    # dG_i = -y_i (lam y_u K_iu - lam y_d K_id); the Gram matrix is symmetric, so its rows u and
    # d (contiguous) serve as columns.
    if u == SLACK:
        st[ALPHA_SUM] = 0.0 if lam == bound_u else st[ALPHA_SUM] - lam
    else:
        slots[u, COEF] = c if lam == bound_u else slots[u, COEF] + lam
    if d == SLACK:
        st[ALPHA_SUM] = st[CAP] if lam == bound_d else st[ALPHA_SUM] + lam
    else:
        slots[d, COEF] = 0.0 if lam == bound_d else slots[d, COEF] - lam
    if u != SLACK and d != SLACK:
        step_u = lam * slots[u, LABEL]
        step_d = lam * slots[d, LABEL]
        for i in range(n):
            slots[i, GRAD] -= slots[i, LABEL] * (step_u * gram[u, i] - step_d * gram[d, i])
    elif u != SLACK:
        step_u = lam * slots[u, LABEL]
        for i in range(n):
            slots[i, GRAD] -= slots[i, LABEL] * step_u * gram[u, i]
    else:
        step_d = lam * slots[d, LABEL]
        for i in range(n):
            slots[i, GRAD] += slots[i, LABEL] * step_d * gram[d, i]
    st[SMO_STEPS] += 1.0
    st[SINCE_REFRESH] += 1.0
    return lam


@njit(cache=True)
def violation(slots, st, n):
    """max_up G - min_down G: the optimality gap SMO drives below TOL."""
    _, highest, lowest = _select_up(slots, st, n)
    return highest - lowest


@njit(cache=True)
def best_step(slots, st, gram, n):
    """The step on the most violating pair (second order); returns False at optimality."""
    u, g_u, lowest = _select_up(slots, st, n)
    if u == NONE or g_u - lowest <= st[TOL]:
        return False
    d = _select_down(slots, st, gram, n, u, g_u)
    if d == NONE:
        return False
    return step(slots, st, gram, n, u, d) > 0.0


@njit(cache=True)
def refresh(slots, st, gram, n):
    """Recompute G_i and sum a exactly from the Gram matrix (rounding never accumulates)."""
    total = 0.0
    peak = 0.0
    for i in range(n):
        f = 0.0
        for j in range(n):
            f += slots[j, COEF] * slots[j, LABEL] * gram[i, j]
            peak = max(peak, abs(gram[i, j]))
        slots[i, GRAD] = 1.0 - slots[i, LABEL] * f
        total += slots[i, COEF]
    st[ALPHA_SUM] = min(total, st[CAP])
    st[KERNEL_PEAK] = peak
    st[SINCE_REFRESH] = 0.0


@njit(cache=True)
def solve(slots, st, gram, n, max_steps):
    """Batch SMO over the n examples of slots/gram until the gap is <= TOL. Returns the steps."""
    steps = 0
    while steps < max_steps and best_step(slots, st, gram, n):
        steps += 1
        if st[SINCE_REFRESH] >= REFRESH_EVERY:
            refresh(slots, st, gram, n)
    return steps


@njit(cache=True)
def _remove(S, slots, st, gram, r):
    """Remove example r: its a_r y_r K(x_r, .) leaves f (gradients updated), and the last example
    moves into its row of S, slots and the Gram matrix."""
    n = int(st[ST_SIZE])
    a_r = slots[r, COEF]
    if a_r != 0.0:
        y_r = slots[r, LABEL]
        for i in range(n):
            slots[i, GRAD] += slots[i, LABEL] * y_r * a_r * gram[r, i]
        st[ALPHA_SUM] = max(st[ALPHA_SUM] - a_r, 0.0)
    kjit.remove_from_gram(gram, n, r)
    st[ST_SIZE] = kjit.remove(S, slots, n, r)


@njit(cache=True)
def restore_gram(S, slots, st, gram):
    """The Gram matrix of the cache as learning made it (checkpoints leave it out): K_ij from
    the stored vectors (`kernels.stored_gram`), K_ii = SELF, zero past the cache."""
    size = int(st[ST_SIZE])
    gram[:, :] = 0.0
    kjit.stored_gram(bjit.kernel_params(st), S, slots, size, gram)
    for i in range(size):
        gram[i, i] = slots[i, SELF]


@njit(cache=True)
def decision(S, slots, st, idx, val):
    """f(x) = sum_i a_i y_i K(x_i, x)."""
    kp = bjit.kernel_params(st)
    return kjit.decision(kp, S, slots, int(st[ST_SIZE]), idx, val, kjit.sq_norm(val))


@njit(cache=True)
def score_keep_row(S, slots, st, idx, val, krow):
    """`decision`, leaving the kernel row in krow for a `learn` on the same instance."""
    kp = bjit.kernel_params(st)
    size = int(st[ST_SIZE])
    kjit.row(kp, S, slots, size, idx, val, kjit.sq_norm(val), krow)
    krow[krow.shape[0] - 1] = 1.0
    return bjit.row_sum(slots, size, krow)


@njit(cache=True)
def learn(S, slots, st, gram, idx, val, y, krow):
    """One example (x, y), y in {-1.0, +1.0}: add it if it violates the optimality conditions,
    re-optimise, keep the budget. Returns 1 if the example entered the cache, else 0.

    krow is a scratch row of len(S) + 1 entries; if its last entry is 1.0 it already holds x's
    kernel row (computed by `score_keep_row`)."""
    kp = bjit.kernel_params(st)
    n = int(st[ST_SIZE])
    x_sq = kjit.sq_norm(val)
    bjit.served_row(kp, S, slots, st, idx, val, x_sq, krow)
    fx = 0.0
    for i in range(n):
        fx += slots[i, COEF] * slots[i, LABEL] * krow[i]
    calibration.learn(st[ST_PLATT:ST_MODEL], fx, y)
    st[ST_TRIALS] += 1.0
    self_k = kjit.self_kernel(kp, x_sq)
    g_new = 1.0 - y * fx
    if self_k <= 0.0 or g_new <= _down_minimum(slots, st, n) + st[TOL]:
        return 0
    # Enter with a = 0: f, and every gradient, are unchanged.
    kjit.store(S, slots, n, idx, val, x_sq)
    slots[n, LABEL] = y
    slots[n, COEF] = 0.0
    slots[n, BORN] = st[ST_TRIALS]
    slots[n, GRAD] = g_new
    slots[n, SELF] = self_k
    # Its Gram row from the stored vector (not krow, whose sums follow x's feature order), so
    # that a restore recomputes the matrix bit for bit (`kernels.stored_gram`).
    kjit.stored_query_row(kp, S, slots, n, np.arange(n), krow)
    peak = max(st[KERNEL_PEAK], abs(self_k))
    for i in range(n):
        gram[n, i] = krow[i]
        gram[i, n] = krow[i]
        peak = max(peak, abs(krow[i]))
    gram[n, n] = self_k
    st[KERNEL_PEAK] = peak
    n += 1
    st[ST_SIZE] = n
    st[ADDED] += 1.0
    # First step on the new example, then the most violating pairs.
    d = _select_down(slots, st, gram, n, n - 1, g_new)
    if d != NONE:
        step(slots, st, gram, n, n - 1, d)
    for _ in range(int(st[STEPS]) - 1):
        if not best_step(slots, st, gram, n):
            break
    if st[SINCE_REFRESH] >= REFRESH_EVERY:
        refresh(slots, st, gram, n)
    _keep_budget(S, slots, st, gram)
    if int(st[ST_SIZE]) < n:
        _refresh_below_the_peak(slots, st, gram)
    return 1


@njit(cache=True)
def signed_proba_keep_row(S, slots, st, idx, val, krow):
    """`calibration.signed_proba` of x's score, leaving the kernel row in krow (as
    `score_keep_row`) for the learning step that follows."""
    return calibration.signed_proba(
        st[ST_PLATT:ST_MODEL], score_keep_row(S, slots, st, idx, val, krow)
    )


@njit(cache=True)
def signed_proba_then_learn(S, slots, st, gram, idx, val, y, krow):
    """`signed_proba_keep_row` as it is before the trial, then `learn` of (x, y) on the same
    kernel row: a labelled record's prediction and trial in one call (AutoClassifier's
    members)."""
    signed = signed_proba_keep_row(S, slots, st, idx, val, krow)
    learn(S, slots, st, gram, idx, val, y, krow)
    return signed


@njit(cache=True)
def _refresh_below_the_peak(slots, st, gram):
    """After removals: recompute the gradients if the kernel scale they went through
    (KERNEL_PEAK) is more than PEAK_RATIO times that of the cache left (see the module's
    docstring). O(n), and the O(n^2) refresh only then."""
    n = int(st[ST_SIZE])
    largest_self = 0.0
    for i in range(n):
        largest_self = max(largest_self, abs(slots[i, SELF]))
    spread = n * st[C_BOX]
    if 1.0 + spread * st[KERNEL_PEAK] > PEAK_RATIO * (1.0 + spread * largest_self):
        refresh(slots, st, gram, n)


@njit(cache=True)
def _keep_budget(S, slots, st, gram):
    """Release the examples with a = 0 that satisfy the optimality conditions; then, if budget + 1
    examples remain, remove one: an example with a = 0 if there is one (the smallest G, i.e. the
    best classified), else by st[PRUNE]: the smallest a (ties: the best classified), the paper's
    pruning heuristic, or the oldest example."""
    budget = S.shape[0] - 1
    n = int(st[ST_SIZE])
    threshold = _down_minimum(slots, st, n) + st[TOL]
    i = 0
    while i < n:
        if slots[i, COEF] == 0.0 and slots[i, GRAD] <= threshold:
            _remove(S, slots, st, gram, i)
            st[RELEASED] += 1.0
            n -= 1
        else:
            i += 1
    if n <= budget:
        return
    r = 0
    if st[PRUNE] == PRUNE_OLDEST:
        for i in range(1, n):
            if slots[i, BORN] < slots[r, BORN]:
                r = i
    for i in range(1, n):
        if slots[i, COEF] < slots[r, COEF] or (
            slots[i, COEF] == slots[r, COEF] and slots[i, GRAD] < slots[r, GRAD]
        ):
            if st[PRUNE] != PRUNE_OLDEST or slots[i, COEF] == 0.0:
                r = i
    if slots[r, COEF] > 0.0:
        st[PRUNED] += 1.0
    else:
        st[RELEASED] += 1.0
    _remove(S, slots, st, gram, r)


@njit(cache=True, any_layout=("X",))
def learn_rows(S, slots, st, gram, X, cols, y):
    """`learn` over the rows of X (NaN = absent feature). Returns the number of examples added."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    krow = np.zeros(S.shape[0] + 1)
    added = 0
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        added += learn(S, slots, st, gram, idx_buf[:n], val_buf[:n], y[r], krow)
    return added


@njit(cache=True, any_layout=("X",))
def score_rows(S, slots, st, X, cols, out):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        out[r] = decision(S, slots, st, idx_buf[:n], val_buf[:n])
