"""Hot loops of the Margin Perceptron with Unlearning (Panagiotakopoulos & Tsampouka 2010).

The rule (paper, eq. 2 and 8, Algorithm 1). Patterns are augmented with a constant rho and
multiplied by their label, z_k = y_k [x_k, rho]; the weight vector is a = sum_k I_k z_k with integer
dual counts I_k. On presenting pattern k at margin s = a . z_k:

    s <= b        and I_k < I:  learning     a += z_k,  I_k += 1
    s >= b + db   and I_k > 0:  unlearning   a -= z_k,  I_k -= 1

with the gap db > R^2 (R = max_k ||z_k||) so that learning and unlearning never undo each other in a
loop. Multiple updates (Section 4) apply n = min(floor((b - s)/||z_k||^2) + 1, I - I_k) learning
steps, or n = min(floor((s - b - db)/||z_k||^2) + 1, I_k) unlearning steps, at one inner product:
the same steps as presenting the pattern n times in a row.

Units. Everything is kept in units of R: the stored margins and the weights are those of
z / R, so ||z / R|| <= 1, and the thresholds become the dimensionless b / R^2 (st[MARGIN]) and
db / R^2 (st[GAP]). The model is then invariant to a rescaling of the features, and no value can
overflow: instances from 1e-300 to 1e300 give the same finite arithmetic. The SVM reading of the
paper stays exact: w = a / b, Cp = I / b, and the served score is w . [x, rho] = (a/R).([x,rho]/R)
/ (b/R^2), i.e. in SVM units (the margin boundary is at +-1).

Streaming (the paper's own remark: unlearning needs patterns to be seen again). The patterns that
were margin violators when they arrived are kept in a bounded replay cache, the support cache of
`streammargin.jit.kernels` (S holds the raw x_k, slots hold LABEL = y_k, COEF = I_k, SQ_NORM =
||x_k||^2, BORN, Z_SQ = ||z_k||^2 / R^2); the invariant a = sum over the cache of I_k z_k holds at
all times. After each new example `REPLAY` cached patterns are presented again, round robin, with
the paper's rule. When the cache is full, the oldest pattern with I_k = 0 is evicted, else the
oldest one, and its whole contribution I_k z_k leaves the weights.

R grows. R is the largest norm seen so far; db = GAP R^2 follows it, and so do b = MARGIN R^2 and
the cap I = floor(C b) + 1 (Remark 4: b = I / Cp). When R grows by a factor g, every count is
multiplied by g^2 (rounded): the dual variables alpha_k = I_k / b, hence the SVM solution w, are
kept, and so is every margin in units of R^2.

Ties. On discrete data (0/1 features) margins often sit exactly on b or b + db and step counts on
integers; the rounding of a sum, which depends on the order of the features, would break such a
tie one way or the other. Margins within TIE * (b + sum_k I_k) of a threshold (a bound on their
rounding error, in units of R^2) are therefore resolved as exact arithmetic would resolve them, so
the model does not depend on the order of the features (River's checker tests it).

Two forms share the cache and the rule:
- primal (`learn_primal`): the weights a / R over the feature columns, `weights`, and its bias
  entry st[BIAS]; a margin costs O(columns).
- dual (`learn_dual`): any kernel of `streammargin.jit.kernels`, augmented as K(x, x') + rho^2; the
  cache keeps its Gram matrix `gram` (z_j . z_k / R^2) and the margins of all cached patterns
  `margins` (a . z_k / R^2), so a replay costs O(1) to test and O(size) to apply. Gram entries are
  computed from the stored patterns only (`dual_gram`), so checkpoints leave the matrix out and
  `restore_gram` rebuilds it bit for bit.

Batch (`batch_pass`): one presentation pass of the paper's batch driver over an index list, on a
dense C-contiguous X, in the paper's own units (no R scaling: X is used as given). The rule itself
(`rule`) is written once, for the online model and the batch solver.
"""

from __future__ import annotations

import math

import numpy as np

from streammargin.jit import calibration
from streammargin.jit import kernels as kjit
from streammargin.jit.dispatch import njit
from streammargin.jit.layout import COUNTER, HYPER, LEARNT, Slot
from streammargin.jit.rows import largest_abs, row_entries

# Cache fields after the common LABEL, COEF (the count I_k), SQ_NORM (||x_k||^2), BORN.
Z_SQ = kjit.N_COMMON_FIELDS  # ||z_k||^2 / R^2, in (0, 1]
N_FIELDS = Z_SQ + 1

# `st`: the support cache's head (`streammargin.jit.kernels.HEAD`), then these.
LAYOUT = kjit.HEAD.extend(
    "MPU",
    Slot("R", LEARNT, "the largest norm of an augmented pattern so far (0 before the first one)"),
    Slot("margin", HYPER, "b / R^2, from epsilon and gap"),
    Slot("gap", HYPER, "db / R^2 (> 1)", param="gap"),
    Slot("penalty", HYPER, "Cp: C, 0 for the hard margin (C is None, I = infinity)"),
    Slot("cap", LEARNT, "I, the cap on the counts, from C, b and R (CAP_MAX: no cap)"),
    Slot("rho", HYPER, "the augmentation constant: intercept_scale, 0 without intercept"),
    Slot("bias", LEARNT, "primal form: the weight of the constant feature, in units of R"),
    Slot("cursor", COUNTER, "next cached pattern to replay"),
    Slot("replay", HYPER, "cached patterns replayed after each example", param="replay"),
    Slot("unlearn", HYPER, "1: the MPU; 0: the classic margin perceptron", param="unlearn"),
    Slot("learn_steps", COUNTER, "t+, learning steps (a multiple update counts n)"),
    Slot("unlearn_steps", COUNTER, "t-, unlearning steps"),
    Slot("evictions", COUNTER, "patterns evicted from the full cache"),
    Slot("since_refresh", COUNTER, "updates since the sums were last recomputed exactly"),
    Slot("count_sum", LEARNT, "sum_k I_k over the cache: bounds |a . z_k| / R^2"),
)
(
    R_NORM,
    MARGIN,
    GAP,
    PENALTY,
    CAP,
    RHO,
    BIAS,
    CURSOR,
    REPLAY,
    UNLEARN,
    LEARN_STEPS,
    UNLEARN_STEPS,
    EVICTIONS,
    SINCE_REFRESH,
    COUNT_SUM,  # its size bounds the rounding error of a . z_k
) = LAYOUT.offsets(
    "R",
    "margin",
    "gap",
    "penalty",
    "cap",
    "rho",
    "bias",
    "cursor",
    "replay",
    "unlearn",
    "learn_steps",
    "unlearn_steps",
    "evictions",
    "since_refresh",
    "count_sum",
)

CAP_MAX = 2.0**53  # counts are exact integers in float64 up to here; it is also "no cap"
R_MIN = 1e-150  # R is at least this, so 1 / R and R^2 stay finite
SCORE_MAX = 1e100  # served scores are clipped here (the calibration squares them)
QUERY_KERNEL_MAX = 1e100  # |K / R^2| of a query outside the data seen so far is clipped here
REFRESH_EVERY = 1024  # recompute a (primal) or the margins (dual) exactly this often
# Ties. Margins within TIE * (b + sum_k I_k) (units of R^2, a bound on their rounding error) of a
# threshold, and step counts within it of an integer, are taken as the exact values they stand
# for. Discrete data (0/1 features) make exact ties common, and a tie broken one way or the other
# by the rounding of a sum would make the model depend on the order of the features.
TIE = 1e-11
# R grows only past R (1 + R_TIE): a pattern of the same norm, up to rounding, is not a new R.
R_TIE = 1e-12
DOUBLE_MAX = np.finfo(np.float64).max


def write_hyper(st, margin, gap, penalty, rho, replay, unlearn) -> None:
    st[MARGIN], st[GAP], st[PENALTY], st[RHO] = margin, gap, penalty, rho
    st[REPLAY], st[UNLEARN] = replay, unlearn


# Shared pieces ------------------------------------------------------------------------------------


@njit(cache=True)
def cap_for(st, r):
    """I = floor(Cp b) + 1 with b = MARGIN r^2 (Remark 4); CAP_MAX for the hard margin."""
    penalty = st[PENALTY]
    if penalty <= 0.0:
        return CAP_MAX
    value = penalty * r * r * st[MARGIN]
    if not value < CAP_MAX - 1.0:  # also inf
        return CAP_MAX
    return np.floor(value) + 1.0


@njit(cache=True)
def tolerance(st):
    """How close to a threshold (units of R^2) a margin counts as a tie (see TIE)."""
    return TIE * (st[MARGIN] + st[COUNT_SUM])


@njit(cache=True)
def _count_sum(slots, st):
    total = 0.0
    for k in range(int(st[kjit.ST_SIZE])):
        total += slots[k, kjit.COEF]
    st[COUNT_SUM] = total


@njit(cache=True, inline="always")
def _moved_count_sum(slots, st, delta):
    """COUNT_SUM += delta, the counts in `slots` having moved by delta already. Whole numbers add
    exactly while the sums stay below 2**53 (CAP_MAX); beyond, the sum would keep its rounding
    through a later cancellation (a count of 2**53 beside one of 64, both moved and the large one
    taken back, left a sum of 66 for 65), so it is counted again (O(size), only with counts near
    the hard margin's cap)."""
    old = st[COUNT_SUM]
    total = old + delta
    if old < CAP_MAX and total < CAP_MAX:
        st[COUNT_SUM] = total
    else:
        _count_sum(slots, st)


@njit(cache=True, inline="always")
def rule(s, sq, count, b, db, cap, tie, unlearn):
    """The paper's rule with multiple updates, the one copy the online model and the batch
    solver share: the signed number of steps (+n learning, -n unlearning, 0 none) for a pattern
    of squared norm sq and count I_k = count presented at margin s, with the thresholds b and
    b + db, the cap I, the tie tolerance `tie` (see TIE; 0 for the batch solver, which uses X as
    given) and `unlearn` (False: the classic margin perceptron).

        s <= b       and I_k < I:  n = min(floor((b - s) / sq) + 1, I - I_k)   learning steps
        s >= b + db  and I_k > 0:  n = min(floor((s - b - db) / sq) + 1, I_k)  unlearning steps

    A zero pattern (sq = 0, which only the batch solver meets: the online cache keeps none) is
    misclassified for ever: its count goes straight to the cap (its alpha = Cp is what the dual
    asks of a point that no w can classify).
    """
    if s <= b + tie and count < cap:
        if sq == 0.0:
            return cap - count
        return min(np.floor((b - s + tie) / sq) + 1.0, cap - count)
    if unlearn and count > 0.0 and s >= b + db - tie:
        return -min(np.floor((s - b - db + tie) / sq) + 1.0, count)
    return 0.0


@njit(cache=True)
def steps(st, slots, k, s):
    """`rule` for cached pattern k at margin s (units of R^2), with the model's thresholds.

    Updates I_k, the step counters and the count sum, and returns the signed number of steps;
    the caller applies them to the weights.
    """
    sq = slots[k, Z_SQ]
    if sq <= 0.0:  # never cached (a restored state is refused); nothing to step
        return 0.0
    count = slots[k, kjit.COEF]
    n = rule(s, sq, count, st[MARGIN], st[GAP], st[CAP], tolerance(st), st[UNLEARN] != 0.0)
    if n > 0.0:
        slots[k, kjit.COEF] = count + n
        st[LEARN_STEPS] += n
        _moved_count_sum(slots, st, n)
    elif n < 0.0:
        slots[k, kjit.COEF] = count + n
        st[UNLEARN_STEPS] -= n
        _moved_count_sum(slots, st, n)
    return n


@njit(cache=True)
def victim(slots, size):
    """The pattern to evict: the oldest with I_k = 0 (it carries no weight), else the oldest."""
    best_free, best_any = -1, 0
    for i in range(size):
        if slots[i, kjit.COEF] == 0.0 and (
            best_free < 0 or slots[i, kjit.BORN] < slots[best_free, kjit.BORN]
        ):
            best_free = i
        if slots[i, kjit.BORN] < slots[best_any, kjit.BORN]:
            best_any = i
    return best_free if best_free >= 0 else best_any


@njit(cache=True)
def _rescaled_counts(slots, size, growth, cap):
    """Counts times growth^2 (rounded, capped), so that I_k / b keeps its value as b grows."""
    for k in range(size):
        count = slots[k, kjit.COEF]
        if count > 0.0:
            slots[k, kjit.COEF] = min(np.floor(count * growth * growth + 0.5), cap)


@njit(cache=True)
def _clip(value, bound):
    if value != value:
        return 0.0
    return min(max(value, -bound), bound)


@njit(cache=True)
def _store(S, slots, st, idx, val, y, z_sq):
    """Append x to the cache (there must be room) with I = 0. Returns its slot."""
    slot = int(st[kjit.ST_SIZE])
    kjit.store(S, slots, slot, idx, val, kjit.sq_norm(val))
    slots[slot, kjit.LABEL] = y
    slots[slot, kjit.COEF] = 0.0
    slots[slot, kjit.BORN] = st[kjit.ST_TRIALS]
    slots[slot, Z_SQ] = z_sq
    st[kjit.ST_SIZE] = slot + 1
    return slot


# Primal form --------------------------------------------------------------------------------------


@njit(cache=True)
def augmented_norm(val, rho):
    """||[x, rho]||, computed without overflow or underflow (clipped at the float64 maximum)."""
    largest = largest_abs(val, rho)
    if largest == 0.0:
        return 0.0
    t = rho / largest
    total = t * t
    for j in range(val.shape[0]):
        t = val[j] / largest
        total += t * t
    return min(largest * math.sqrt(total), DOUBLE_MAX)


@njit(cache=True)
def primal_dot(weights, st, idx, val):
    """(a / R) . ([x, rho] / R) for an instance (idx < 0: unknown feature), finite for any x."""
    r = st[R_NORM]
    if r == 0.0:
        return 0.0
    rho = st[RHO]
    largest = largest_abs(val, rho)
    if largest <= r:  # every entry of x / R is at most 1 (nearly always so when learning)
        inv = 1.0 / r
        total = st[BIAS] * (rho * inv)
        for j in range(idx.shape[0]):
            i = idx[j]
            if i >= 0:
                total += weights[i] * (val[j] * inv)
        return total
    # An instance beyond R (prediction only): scale by its largest entry first.
    total = st[BIAS] * (rho / largest)
    for j in range(idx.shape[0]):
        i = idx[j]
        if i >= 0:
            total += weights[i] * (val[j] / largest)
    return total * (largest / r)


@njit(cache=True)
def primal_score(weights, st, idx, val):
    """The served score w . [x, rho] with w = a / b: the SVM decision value."""
    return _clip(primal_dot(weights, st, idx, val) / st[MARGIN], SCORE_MAX)


@njit(cache=True)
def primal_proba(weights, st, idx, val):
    """Calibrated probability of the positive label: a prediction in one call."""
    return calibration.proba(st[kjit.ST_PLATT : kjit.ST_MODEL], primal_score(weights, st, idx, val))


@njit(cache=True)
def _cached_dot(S, slots, st, weights, k, inv):
    """a . z_k / R^2 for cached pattern k."""
    total = st[BIAS] * (st[RHO] * inv)
    for c in range(S.shape[1]):
        total += weights[c] * (S[k, c] * inv)
    return slots[k, kjit.LABEL] * total


@njit(cache=True)
def _add_primal(S, slots, st, weights, k, n, inv):
    """a += n z_k (in units of R)."""
    coef = n * slots[k, kjit.LABEL]
    for c in range(S.shape[1]):
        weights[c] += coef * (S[k, c] * inv)
    st[BIAS] += coef * (st[RHO] * inv)


@njit(cache=True)
def refresh_primal(S, slots, st, weights):
    """a = sum_k I_k z_k over the cache, exactly (rounding of the incremental updates gone)."""
    weights[:] = 0.0
    st[BIAS] = 0.0
    inv = 1.0 / st[R_NORM] if st[R_NORM] > 0.0 else 0.0
    for k in range(int(st[kjit.ST_SIZE])):
        if slots[k, kjit.COEF] != 0.0:
            _add_primal(S, slots, st, weights, k, slots[k, kjit.COEF], inv)
    _count_sum(slots, st)
    st[SINCE_REFRESH] = 0.0


@njit(cache=True)
def _evict_primal(S, slots, st, weights, v):
    count = slots[v, kjit.COEF]
    if count != 0.0:
        _add_primal(S, slots, st, weights, v, -count, 1.0 / st[R_NORM])
    st[kjit.ST_SIZE] = kjit.remove(S, slots, int(st[kjit.ST_SIZE]), v)
    if count != 0.0:
        _moved_count_sum(slots, st, -count)


@njit(cache=True)
def _grow_primal(S, slots, st, weights, r_new):
    r_old = st[R_NORM]
    st[R_NORM] = r_new
    st[CAP] = cap_for(st, r_new)
    size = int(st[kjit.ST_SIZE])
    if size == 0:
        return
    shrink = r_old / r_new
    _rescaled_counts(slots, size, r_new / r_old, st[CAP])
    for k in range(size - 1, -1, -1):
        slots[k, Z_SQ] *= shrink * shrink
        if slots[k, Z_SQ] == 0.0:  # underflow: the pattern is nothing at the new scale
            size = kjit.remove(S, slots, size, k)
    st[kjit.ST_SIZE] = size
    refresh_primal(S, slots, st, weights)


@njit(cache=True)
def _replay_primal(S, slots, st, weights, inv, count):
    """Present `count` cached patterns, round robin; returns the number of updates."""
    updates = 0
    for _ in range(count):
        size = int(st[kjit.ST_SIZE])
        if size == 0:
            break
        k = int(st[CURSOR]) % size
        st[CURSOR] = k + 1
        n = steps(st, slots, k, _cached_dot(S, slots, st, weights, k, inv))
        if n != 0.0:
            _add_primal(S, slots, st, weights, k, n, inv)
            st[SINCE_REFRESH] += 1.0
            updates += 1
    return updates


@njit(cache=True)
def replay_primal(S, slots, st, weights, count):
    """`count` replays without a new example; returns the number of updates."""
    if st[R_NORM] == 0.0:
        return 0
    updates = _replay_primal(S, slots, st, weights, 1.0 / st[R_NORM], count)
    if st[SINCE_REFRESH] >= REFRESH_EVERY:
        refresh_primal(S, slots, st, weights)
    return updates


@njit(cache=True)
def learn_primal(S, slots, st, weights, idx, val, y):
    """One example (every idx >= 0 and < the columns of S and weights), y in {-1.0, +1.0}."""
    norm = augmented_norm(val, st[RHO])
    if norm > 0.0:  # a zero pattern (no intercept, x = 0) can neither be learnt nor scored
        calibration.learn(st[kjit.ST_PLATT : kjit.ST_MODEL], primal_score(weights, st, idx, val), y)
        if norm > st[R_NORM] * (1.0 + R_TIE):
            _grow_primal(S, slots, st, weights, max(norm, R_MIN))
        r = st[R_NORM]
        inv = 1.0 / r
        # <= 1 as ||z|| <= R: a norm within R_TIE above R counts as R (as in the dual form)
        z_sq = min((norm / r) * (norm / r), 1.0)
        s = y * primal_dot(weights, st, idx, val)
        if s <= st[MARGIN] + tolerance(st) and z_sq > 0.0:  # a margin violator: it is cached
            if st[kjit.ST_SIZE] >= S.shape[0]:
                _evict_primal(S, slots, st, weights, victim(slots, int(st[kjit.ST_SIZE])))
                st[EVICTIONS] += 1.0
                s = y * primal_dot(weights, st, idx, val)
            slot = _store(S, slots, st, idx, val, y, z_sq)
            n = steps(st, slots, slot, s)
            if n != 0.0:
                _add_primal(S, slots, st, weights, slot, n, inv)
                st[SINCE_REFRESH] += 1.0
        _replay_primal(S, slots, st, weights, inv, int(st[REPLAY]))
        if st[SINCE_REFRESH] >= REFRESH_EVERY:
            refresh_primal(S, slots, st, weights)
    st[kjit.ST_TRIALS] += 1.0


# Dual (kernel) form -------------------------------------------------------------------------------


@njit(cache=True)
def _raw_row(S, slots, st, idx, val, x_sq, out):
    """out[k] = K(x_k, x) for the cached patterns (finite: see `streammargin.jit.kernels`)."""
    kjit.row(st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE], S, slots, int(st[kjit.ST_SIZE]), idx, val, x_sq, out)


@njit(cache=True)
def _dual_score_from_row(slots, st, row):
    r = st[R_NORM]
    if r == 0.0:
        return 0.0
    r2 = r * r
    rho2 = st[RHO] * st[RHO]
    total = 0.0
    for k in range(int(st[kjit.ST_SIZE])):
        count = slots[k, kjit.COEF]
        if count != 0.0:
            kernel = _clip((row[k] + rho2) / r2, QUERY_KERNEL_MAX)
            total += count * slots[k, kjit.LABEL] * kernel
    return _clip(total / st[MARGIN], SCORE_MAX)


@njit(cache=True)
def dual_score(S, slots, st, idx, val):
    """The served score sum_k (I_k / b) y_k (K(x_k, x) + rho^2): the SVM decision value."""
    row = np.empty(int(st[kjit.ST_SIZE]))
    _raw_row(S, slots, st, idx, val, kjit.sq_norm(val), row)
    return _dual_score_from_row(slots, st, row)


@njit(cache=True)
def dual_proba(S, slots, st, idx, val):
    """Calibrated probability of the positive label: a prediction in one call."""
    return calibration.proba(st[kjit.ST_PLATT : kjit.ST_MODEL], dual_score(S, slots, st, idx, val))


@njit(cache=True)
def _dual_gram_entry(y_q, y_s, kernel, rho2, r2):
    """z_q . z_s / R^2 from K(x_q, x_s); |.| <= 1 by Cauchy-Schwarz once R covers both (the
    clip only catches overflowed or indefinite kernels)."""
    return _clip(y_q * y_s * ((kernel + rho2) / r2), 1.0)


@njit(cache=True)
def dual_gram(S, slots, st, gram):
    """The Gram matrix's entries off the diagonal, from the cached patterns at the current R:
    each kernel value with the later-born pattern as the query (`kernels.stored_gram`), as
    `learn_dual` computes a new pattern's row. Learning recomputes them when R grows (rather than
    rescaling them) and a restore recomputes them, so both give the same bits."""
    size = int(st[kjit.ST_SIZE])
    kjit.stored_gram(st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE], S, slots, size, gram)
    r2 = st[R_NORM] * st[R_NORM]
    rho2 = st[RHO] * st[RHO]
    for j in range(size):
        for k in range(size):
            if j != k:
                gram[j, k] = _dual_gram_entry(
                    slots[j, kjit.LABEL], slots[k, kjit.LABEL], gram[j, k], rho2, r2
                )


@njit(cache=True)
def restore_gram(S, slots, st, gram):
    """The Gram matrix as learning made it (checkpoints leave it out): `dual_gram`, the
    diagonal ||z_k||^2 / R^2 = Z_SQ, zero past the cache."""
    gram[:, :] = 0.0
    dual_gram(S, slots, st, gram)
    for k in range(int(st[kjit.ST_SIZE])):
        gram[k, k] = slots[k, Z_SQ]


@njit(cache=True)
def _add_dual(gram, margins, size, k, n):
    """a += n z_k: every cached margin moves by n z_k . z_j."""
    for j in range(size):
        margins[j] += n * gram[k, j]


@njit(cache=True)
def refresh_dual(slots, st, gram, margins):
    """margins = Gram . counts, exactly."""
    size = int(st[kjit.ST_SIZE])
    for j in range(size):
        total = 0.0
        for k in range(size):
            if slots[k, kjit.COEF] != 0.0:
                total += slots[k, kjit.COEF] * gram[k, j]
        margins[j] = total
    _count_sum(slots, st)
    st[SINCE_REFRESH] = 0.0


@njit(cache=True)
def _remove_dual(S, slots, st, gram, margins, v):
    """Drop cached pattern v, its contribution included; the last one moves into its place."""
    size = int(st[kjit.ST_SIZE])
    count = slots[v, kjit.COEF]
    if count != 0.0:
        _add_dual(gram, margins, size, v, -count)
    last = size - 1
    margins[v] = margins[last]
    margins[last] = 0.0
    kjit.remove_from_gram(gram, size, v)
    st[kjit.ST_SIZE] = kjit.remove(S, slots, size, v)
    if count != 0.0:
        _moved_count_sum(slots, st, -count)


@njit(cache=True)
def _grow_dual(S, slots, st, gram, margins, r_new):
    r_old = st[R_NORM]
    st[R_NORM] = r_new
    st[CAP] = cap_for(st, r_new)
    size = int(st[kjit.ST_SIZE])
    if size == 0:
        return
    _rescaled_counts(slots, size, r_new / r_old, st[CAP])
    # Recomputed at the new R, not rescaled: a restore recomputes them the same way.
    dual_gram(S, slots, st, gram)
    kp = st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE]
    r2 = r_new * r_new
    for k in range(size):
        augmented = kjit.self_kernel(kp, slots[k, kjit.SQ_NORM]) + st[RHO] * st[RHO]
        gram[k, k] = min(augmented / r2, 1.0)
    for k in range(size - 1, -1, -1):
        slots[k, Z_SQ] = gram[k, k]
        if gram[k, k] <= 0.0:  # underflow: the pattern is nothing at the new scale
            slots[k, kjit.COEF] = 0.0
            _remove_dual(S, slots, st, gram, margins, k)
    refresh_dual(slots, st, gram, margins)


@njit(cache=True)
def replay_dual(slots, st, gram, margins, count):
    """Present `count` cached patterns, round robin; returns the number of updates."""
    updates = 0
    for _ in range(count):
        size = int(st[kjit.ST_SIZE])
        if size == 0:
            break
        k = int(st[CURSOR]) % size
        st[CURSOR] = k + 1
        n = steps(st, slots, k, margins[k])
        if n != 0.0:
            _add_dual(gram, margins, size, k, n)
            st[SINCE_REFRESH] += 1.0
            updates += 1
    if st[SINCE_REFRESH] >= REFRESH_EVERY:
        refresh_dual(slots, st, gram, margins)
    return updates


@njit(cache=True)
def learn_dual(S, slots, st, gram, margins, idx, val, y):
    """One example (every idx >= 0 and < the columns of S), y in {-1.0, +1.0}."""
    kp = st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE]
    x_sq = kjit.sq_norm(val)
    augmented = kjit.self_kernel(kp, x_sq) + st[RHO] * st[RHO]
    if augmented > 0.0:  # else a zero (or, for an indefinite kernel, meaningless) pattern
        size = int(st[kjit.ST_SIZE])
        row = np.empty(max(size, 1))
        _raw_row(S, slots, st, idx, val, x_sq, row)
        served = _dual_score_from_row(slots, st, row)
        calibration.learn(st[kjit.ST_PLATT : kjit.ST_MODEL], served, y)
        norm = math.sqrt(min(augmented, DOUBLE_MAX))
        if norm > st[R_NORM] * (1.0 + R_TIE):
            # Growing may evict underflowing patterns (moving others): recompute the row then.
            _grow_dual(S, slots, st, gram, margins, max(norm, R_MIN))
            if int(st[kjit.ST_SIZE]) != size:
                size = int(st[kjit.ST_SIZE])
                _raw_row(S, slots, st, idx, val, x_sq, row)
        r2 = st[R_NORM] * st[R_NORM]
        rho2 = st[RHO] * st[RHO]
        # z . z_k / R^2; |.| <= 1 by Cauchy-Schwarz now that R covers x (the clip only catches
        # overflowed or indefinite kernels).
        for k in range(size):
            row[k] = _clip(y * slots[k, kjit.LABEL] * ((row[k] + rho2) / r2), 1.0)
        z_sq = min(augmented / r2, 1.0)
        s = 0.0
        for k in range(size):
            if slots[k, kjit.COEF] != 0.0:
                s += slots[k, kjit.COEF] * row[k]
        if s <= st[MARGIN] + tolerance(st) and z_sq > 0.0:  # a margin violator: it is cached
            if size >= S.shape[0]:
                v = victim(slots, size)
                s -= slots[v, kjit.COEF] * row[v]
                _remove_dual(S, slots, st, gram, margins, v)
                row[v] = row[size - 1]
                size -= 1
                st[EVICTIONS] += 1.0
            slot = _store(S, slots, st, idx, val, y, z_sq)
            # Its Gram row from the stored pattern (not `row`, whose sums follow x's feature
            # order), as `dual_gram` recomputes it.
            kernels = np.empty(max(slot, 1))
            kjit.stored_query_row(kp, S, slots, slot, np.arange(slot), kernels)
            for k in range(slot):
                entry = _dual_gram_entry(y, slots[k, kjit.LABEL], kernels[k], rho2, r2)
                gram[slot, k] = entry
                gram[k, slot] = entry
            gram[slot, slot] = z_sq
            margins[slot] = s
            size = slot + 1
            n = steps(st, slots, slot, s)
            if n != 0.0:
                _add_dual(gram, margins, size, slot, n)
                st[SINCE_REFRESH] += 1.0
        replay_dual(slots, st, gram, margins, int(st[REPLAY]))
    st[kjit.ST_TRIALS] += 1.0


# Mini-batches: the same per-example functions over the rows of a frame ----------------------------


@njit(cache=True, any_layout=("X",))
def learn_rows_primal(S, slots, st, weights, X, cols, y):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        learn_primal(S, slots, st, weights, idx_buf[:n], val_buf[:n], y[r])


@njit(cache=True, any_layout=("X",))
def learn_rows_dual(S, slots, st, gram, margins, X, cols, y):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        learn_dual(S, slots, st, gram, margins, idx_buf[:n], val_buf[:n], y[r])


@njit(cache=True, any_layout=("X",))
def score_rows_primal(weights, st, X, cols, out):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        out[r] = primal_score(weights, st, idx_buf[:n], val_buf[:n])


@njit(cache=True, any_layout=("X",))
def score_rows_dual(S, slots, st, X, cols, out):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        out[r] = dual_score(S, slots, st, idx_buf[:n], val_buf[:n])


# Batch driver's pass ------------------------------------------------------------------------------

# run[]: the batch run's scalars.
RUN_B, RUN_DB, RUN_CAP, RUN_ACTIVE, RUN_LEARN_STEPS, RUN_UNLEARN_STEPS = range(6)
RUN_SIZE = 6
# What a pass collects into `out`.
COLLECT_NONE, COLLECT_FIRST_LEVEL, COLLECT_SECOND_LEVEL = 0, 1, 2


@njit(cache=True, any_layout=("X",))
def batch_pass(X, y, sq, a, counts, run, order, collect, out):
    """Present the patterns z_k = y_k X[k] for k in `order`, in order, with multiple updates.

    collect = COLLECT_FIRST_LEVEL gathers the first-level active set (a . z_k <= c b at
    presentation, or I_k > 0 after it), COLLECT_SECOND_LEVEL the second-level one (I_k changed and
    is > 0). Returns (number of updates, number of indices written to `out`).
    """
    b, db, cap, active = run[RUN_B], run[RUN_DB], run[RUN_CAP], run[RUN_ACTIVE]
    d = X.shape[1]
    n_updates = 0
    n_out = 0
    for i in range(order.shape[0]):
        k = order[i]
        yk = y[k]
        dot = 0.0
        for c in range(d):
            dot += a[c] * X[k, c]
        s = yk * dot
        count = counts[k]
        n = rule(s, sq[k], count, b, db, cap, 0.0, True)
        if n > 0.0:
            run[RUN_LEARN_STEPS] += n
        elif n < 0.0:
            run[RUN_UNLEARN_STEPS] -= n
        if n != 0.0:
            counts[k] = count + n
            step = n * yk
            for c in range(d):
                a[c] += step * X[k, c]
            n_updates += 1
        if collect == COLLECT_FIRST_LEVEL:
            if s <= active or counts[k] > 0.0:
                out[n_out] = k
                n_out += 1
        elif collect == COLLECT_SECOND_LEVEL:
            if n != 0.0 and counts[k] > 0.0:
                out[n_out] = k
                n_out += 1
    return n_updates, n_out
