"""Budget maintenance for the dual kernel learners: finite kernel values, cached margins and the
five ways of keeping a support cache within its budget (the random policy draws from the
counter-based generator of `streammargin.jit.rng`, keyed and counted in `st`).

Representation (shared by the budget perceptrons and kernel ALMA_2). The hypothesis is

    f(x) = SCALE * sum_i a_i K(s_i, x),      a_i = COEF_i * LABEL_i,

over the `size` stored vectors s_i (rows of S, see `streammargin.jit.kernels`). SCALE lives in `st`
so that shrinking every coefficient at once (Forgetron, ALMA's projection on the unit ball) costs
O(1); it is folded into the coefficients before it could underflow. When `st[TRACK]` is set, each
slot also keeps its vector's unscaled margin

    MARGIN_i = sum_j a_j K(s_i, s_j),     so that f(s_i) = SCALE * MARGIN_i,

updated in O(size) from the query's kernel row when a vector is added, and from one stored row
when one is removed. The margins give ALMA its norm ||w||^2 = SCALE^2 sum_i a_i MARGIN_i, the
Forgetron its mu_t and the Crammer-Kandola-Singer rule its removal scores. They are recomputed
exactly every RECOMPUTE_EVERY changes, so rounding never accumulates.

Averaged hypothesis (`st[AVERAGE]`). The served hypothesis may be the average of the hypotheses
after each trial, f_avg = (1/T) sum_t f_t, restricted to the vectors still cached (an evicted
vector takes its history with it; a merged one passes it on to z). Each vector's summed
coefficient is kept lazily: with CUM_SCALE = sum_t SCALE_t, it is
AVG_BASE_i + COEF_i (CUM_SCALE - AVG_MARK_i), brought up to date (`checkpoint`) only when COEF_i
changes (a projection, a merge, a fold of SCALE). A trial costs O(1) more; serving, two more
multiply-adds per vector.

Finite arithmetic. Inputs may range from 1e-300 to 1e300, where ||x||^2 overflows: the kernel
values come from `streammargin.jit.kernels`, which keeps them finite, and the calibration clamps
the scores it sees.

Policies (`st[POLICY]`), applied when a vector must be added to a full cache:
    RANDOM    remove a vector drawn uniformly (Cesa-Bianchi & Gentile 2006, the Random Budget
              Perceptron)
    OLDEST    remove the oldest (Dekel, Shalev-Shwartz & Singer 2008, Forgetron; its shrinking is
              the perceptron's, see `forgetron_phi`)
    SMALLEST  remove the vector whose own margin stays largest without it,
              argmax_i y_i (f(s_i) - a_i K(s_i, s_i)) (Crammer, Kandola & Singer 2003); the new
              example is a candidate too, in which case it is not added
    MERGE     merge the vector of smallest |a_m| with the same-sign partner whose merge loses the
              least of ||f|| (Wang, Crammer & Vucetic 2012, BSGD; RBF kernel)
    PROJECT   project phi(x) on the span of the cache instead of adding it when the projection
              error is at most THRESHOLD ||phi(x)||, and always when the cache is full
              (Orabona, Keshet & Caputo 2009, Projectron); keeps the inverse Gram matrix.
              Projectron++'s update of a margin error, a projection only, is
              `projectron_margin_step`
"""

from __future__ import annotations

import math

import numpy as np

from streammargin.jit import kernels as kjit
from streammargin.jit import rng
from streammargin.jit.dispatch import njit
from streammargin.jit.kernels import (
    BORN,
    COEF,
    KP_SIZE,
    LABEL,
    SQ_NORM,
    ST_KP,
    ST_SIZE,
    ST_TRIALS,
)
from streammargin.jit.layout import COUNTER, HYPER, LEARNT, Slot

# Slot fields after the common ones.
MARGIN = kjit.N_COMMON_FIELDS  # unscaled f(s_i), kept when st[TRACK] is set
SELF = MARGIN + 1  # K(s_i, s_i)
AVG_BASE = SELF + 1  # sum over past trials of this vector's coefficient, up to AVG_MARK
AVG_MARK = SELF + 2  # CUM_SCALE when AVG_BASE was last brought up to date
N_FIELDS = SELF + 3

RANDOM, OLDEST, SMALLEST, MERGE, PROJECT = range(5)
POLICIES = {
    "random": RANDOM,
    "oldest": OLDEST,
    "smallest": SMALLEST,
    "merge": MERGE,
    "project": PROJECT,
}

# `st`: the support cache's head (kjit.HEAD), then these; a model's own entries follow from
# ST_BUDGET_END (kernel ALMA's).
LAYOUT = kjit.HEAD.extend(
    "budget",
    Slot(
        "rng_key",
        HYPER,
        "key of the counter-based generator: from seed (fresh entropy when seed is None) under "
        "the 'random' policy, 0 otherwise",
    ),
    Slot("rng_counter", COUNTER, "draws so far"),
    Slot("scale", LEARNT, "global factor of every coefficient"),
    Slot("policy", HYPER, "the policy's code (POLICIES)", param="eviction", codes=POLICIES),
    Slot("threshold", HYPER, "Projectron's relative error", param="projection_threshold"),
    Slot("track", HYPER, "1: keep the MARGIN field up to date (the policy or the model needs it)"),
    Slot("updates", COUNTER, "update steps (mistakes, corrections)"),
    Slot("evictions", COUNTER, "vectors removed, or new vectors not added, to keep the budget"),
    Slot("merges", COUNTER, "merges of two vectors (policy 'merge')"),
    Slot("projections", COUNTER, "examples projected instead of added (policy 'project')"),
    Slot("changes", COUNTER, "changes of the cache since the margins were last recomputed"),
    Slot("forgetron_q", LEARNT, "the Forgetron's accumulated shrinking damage Q_t"),
    Slot("average", HYPER, "1: serve the averaged hypothesis", param="average"),
    Slot("cum_scale", LEARNT, "sum over trials of SCALE (the averaged hypothesis' clock)"),
)
(
    RNG_KEY,
    RNG_COUNTER,
    SCALE,
    POLICY,
    THRESHOLD,
    TRACK,
    UPDATES,
    EVICTIONS,
    MERGES,
    PROJECTIONS,
    CHANGES,
    FORGETRON_Q,
    AVERAGE,
    CUM_SCALE,
) = LAYOUT.offsets(
    "rng_key",
    "rng_counter",
    "scale",
    "policy",
    "threshold",
    "track",
    "updates",
    "evictions",
    "merges",
    "projections",
    "changes",
    "forgetron_q",
    "average",
    "cum_scale",
)
ST_BUDGET_END = LAYOUT.size  # first entry of a model's own state

BIG = kjit.BIG
COEF_LIMIT = 1e50  # a Projectron step never moves a coefficient further
FOLD_BELOW = 1e-60  # fold SCALE into the coefficients below this
RECOMPUTE_EVERY = 4096
GOLDEN_STEPS = 16  # golden-section steps of a merge: |h - h*| < 0.618^16 ~ 5e-4

# Random numbers ---------------------------------------------------------------------------------


@njit(cache=True)
def uniform(st):
    """A uniform draw in [0, 1) from the model's stream (RNG_KEY, RNG_COUNTER): see
    `streammargin.jit.rng`."""
    counter = st[RNG_COUNTER]
    st[RNG_COUNTER] = counter + 1.0
    return rng.uniform(st[RNG_KEY], counter)


@njit(cache=True)
def random_index(st, n):
    """Uniform integer in [0, n)."""
    i = int(uniform(st) * n)
    return min(i, n - 1)


@njit(cache=True)
def served_row(kp, S, slots, st, idx, val, x_sq, krow):
    """Fill krow[:size] with K(x, S[i]) unless krow[-1] says the prediction just did (the scratch
    row of the model's last predict, see `streammargin.budget.ServedRow`); clears the flag."""
    if krow[krow.shape[0] - 1] != 1.0:
        kjit.row(kp, S, slots, int(st[ST_SIZE]), idx, val, x_sq, krow)
    krow[krow.shape[0] - 1] = 0.0


@njit(cache=True)
def row_sum(slots, size, krow):
    """sum_i a_i krow[i]: the unscaled decision from a kernel row."""
    total = 0.0
    for i in range(size):
        total += slots[i, COEF] * slots[i, LABEL] * krow[i]
    return total


@njit(cache=True)
def checkpoint(slots, st, i):
    """Bring vector i's summed coefficient up to date before its COEF changes."""
    cum = st[CUM_SCALE]
    slots[i, AVG_BASE] += slots[i, COEF] * (cum - slots[i, AVG_MARK])
    slots[i, AVG_MARK] = cum


@njit(cache=True)
def served_sum(slots, st, size, krow):
    """The served hypothesis at x from its kernel row, without SCALE for the last hypothesis:
    sum_i a_i krow[i] (times SCALE: f_t(x)), or the averaged (1/T) sum_t f_t(x) in full."""
    if st[AVERAGE] == 0.0:
        return st[SCALE] * row_sum(slots, size, krow)
    trials = st[ST_TRIALS]
    if trials == 0.0:
        return 0.0
    cum = st[CUM_SCALE]
    total = 0.0
    for i in range(size):
        summed = slots[i, AVG_BASE] + slots[i, COEF] * (cum - slots[i, AVG_MARK])
        total += slots[i, LABEL] * summed * krow[i]
    return total / trials


@njit(cache=True)
def end_trial(st):
    """Count the hypothesis after this trial in the average."""
    st[ST_TRIALS] += 1.0
    st[CUM_SCALE] += st[SCALE]


@njit(cache=True)
def stored_vector_sq(S, slot):
    total = 0.0
    for c in range(S.shape[1]):
        total += S[slot, c] * S[slot, c]
    if total > kjit.MAX_FINITE:
        return kjit.MAX_FINITE
    return total


# The cache and its margins ----------------------------------------------------------------------


@njit(cache=True)
def add_vector(S, slots, st, idx, val, x_sq, krow, a, label, self_k, fx):
    """Append x with the unscaled coefficient a (= COEF * LABEL, LABEL = `label`).

    krow holds K(x, S[i]) for the current vectors and fx = sum_i a_i krow[i]. Margins are updated
    when tracked; krow gains the new vector's entry K(x, x), so it stays the query's row.
    """
    n = int(st[ST_SIZE])
    kjit.store(S, slots, n, idx, val, x_sq)
    slots[n, LABEL] = label
    slots[n, COEF] = a * label
    slots[n, BORN] = st[ST_TRIALS]
    slots[n, SELF] = self_k
    slots[n, AVG_BASE] = 0.0
    slots[n, AVG_MARK] = st[CUM_SCALE]
    if st[TRACK] != 0.0:
        for i in range(n):
            slots[i, MARGIN] += a * krow[i]
        slots[n, MARGIN] = fx + a * self_k
    krow[n] = self_k
    st[ST_SIZE] = n + 1
    st[CHANGES] += 1.0


@njit(cache=True)
def remove_vector(kp, S, slots, st, r, krow):
    """Remove vector r (the last one moves into its slot, and in krow too)."""
    n = int(st[ST_SIZE])
    if st[TRACK] != 0.0:
        a_r = slots[r, COEF] * slots[r, LABEL]
        if a_r != 0.0:
            for i in range(n):
                if i != r:
                    slots[i, MARGIN] -= a_r * kjit.stored_pair(kp, S, slots, i, r)
    krow[r] = krow[n - 1]
    krow[n - 1] = 0.0
    st[ST_SIZE] = kjit.remove(S, slots, n, r)
    st[CHANGES] += 1.0


@njit(cache=True)
def recompute_margins(kp, S, slots, st):
    """MARGIN_i = sum_j a_j K(s_i, s_j) exactly (O(size^2) kernel values)."""
    n = int(st[ST_SIZE])
    for i in range(n):
        slots[i, MARGIN] = slots[i, COEF] * slots[i, LABEL] * slots[i, SELF]
    for i in range(n):
        a_i = slots[i, COEF] * slots[i, LABEL]
        for j in range(i + 1, n):
            k = kjit.stored_pair(kp, S, slots, i, j)
            slots[i, MARGIN] += slots[j, COEF] * slots[j, LABEL] * k
            slots[j, MARGIN] += a_i * k
    st[CHANGES] = 0.0


@njit(cache=True)
def housekeeping(kp, S, slots, st):
    """Fold a small SCALE into the coefficients, refresh the margins now and then."""
    scale = st[SCALE]
    if scale < FOLD_BELOW:
        n = int(st[ST_SIZE])
        for i in range(n):
            checkpoint(slots, st, i)
            slots[i, COEF] *= scale
            slots[i, MARGIN] *= scale
        st[SCALE] = 1.0
    if st[TRACK] != 0.0 and st[CHANGES] >= RECOMPUTE_EVERY:
        recompute_margins(kp, S, slots, st)


@njit(cache=True)
def squared_norm(slots, st):
    """||f||^2 in the RKHS = SCALE^2 sum_i a_i MARGIN_i (needs tracked margins)."""
    total = 0.0
    for i in range(int(st[ST_SIZE])):
        total += slots[i, COEF] * slots[i, LABEL] * slots[i, MARGIN]
    return max(total, 0.0) * st[SCALE] * st[SCALE]


# Removal rules ----------------------------------------------------------------------------------


@njit(cache=True)
def cks_victim(slots, size, krow, a_new, label_new, fx):
    """Crammer-Kandola-Singer: after adding x with coefficient a_new, the vector (or x itself,
    returned as -1) whose margin without its own term, y_i (f(s_i) - a_i K(s_i, s_i)), is the
    largest: it is the one the hypothesis needs least."""
    best = -1
    best_score = label_new * fx  # x's margin without its own term is y f(x)
    for i in range(size):
        a_i = slots[i, COEF] * slots[i, LABEL]
        score = slots[i, LABEL] * (slots[i, MARGIN] + a_new * krow[i] - a_i * slots[i, SELF])
        if score > best_score:
            best_score = score
            best = i
    return best


@njit(cache=True)
def forgetron_phi(sigma, mu, q, mistakes):
    """The self-tuned Forgetron's shrinking coefficient (Dekel, Shalev-Shwartz & Singer 2008):
    phi = max{phi in (0, 1] : Psi(sigma phi, phi mu) + Q <= 15/32 M}, Psi(l, m) = l^2 + 2l - 2lm,
    where sigma is the oldest vector's weight, mu its margin under the updated hypothesis, Q the
    damage so far and M the number of mistakes. Returns (phi, Psi(sigma phi, phi mu))."""
    a = sigma * sigma - 2.0 * sigma * mu  # phi^2 coefficient of Psi(sigma phi, phi mu)
    b = 2.0 * sigma
    c = q - 15.0 / 32.0 * mistakes  # < 0: Q_{t-1} <= 15/32 M_{t-1} < 15/32 M_t
    if a + b + c <= 0.0:
        phi = 1.0
    elif c >= 0.0:
        phi = 0.0  # only reachable through rounding: forget everything that is shrunk
    else:
        # Psi + c crosses zero once in (0, 1) from below; its root nearest 0, in the stable form.
        disc = max(b * b - 4.0 * a * c, 0.0)
        phi = 2.0 * c / (-b - math.sqrt(disc))
        phi = min(max(phi, 0.0), 1.0)
    damage = a * phi * phi + b * phi
    return phi, damage


@njit(cache=True)
def _merge_weight(a_m, a_n, log_k, h):
    """a_z of z = h s_m + (1-h) s_n for the RBF kernel: a_m K(s_m, z) + a_n K(s_n, z) with
    K(s_m, z) = k^((1-h)^2), K(s_n, z) = k^(h^2)."""
    return a_m * math.exp(log_k * (1.0 - h) * (1.0 - h)) + a_n * math.exp(log_k * h * h)


@njit(cache=True)
def _best_merge(a_m, a_n, k_mn):
    """(h, a_z, degradation) of the best merge of a_m phi(s_m) + a_n phi(s_n) (same sign, RBF):
    h maximises |a_z(h)| by golden-section search (end points included), and the degradation is
    ||a_m phi_m + a_n phi_n - a_z phi_z||^2 = a_m^2 + a_n^2 + 2 a_m a_n k - a_z^2."""
    before = a_m * a_m + a_n * a_n + 2.0 * a_m * a_n * k_mn
    if k_mn <= 0.0:  # too far apart to gain anything: keep the larger one
        if abs(a_m) >= abs(a_n):
            return 1.0, a_m, max(before - a_m * a_m, 0.0)
        return 0.0, a_n, max(before - a_n * a_n, 0.0)
    log_k = math.log(k_mn)
    ratio = 0.6180339887498949
    lo, hi = 0.0, 1.0
    x1 = hi - ratio * (hi - lo)
    x2 = lo + ratio * (hi - lo)
    f1 = abs(_merge_weight(a_m, a_n, log_k, x1))
    f2 = abs(_merge_weight(a_m, a_n, log_k, x2))
    for _ in range(GOLDEN_STEPS):
        if f1 < f2:
            lo = x1
            x1, f1 = x2, f2
            x2 = lo + ratio * (hi - lo)
            f2 = abs(_merge_weight(a_m, a_n, log_k, x2))
        else:
            hi = x2
            x2, f2 = x1, f1
            x1 = hi - ratio * (hi - lo)
            f1 = abs(_merge_weight(a_m, a_n, log_k, x1))
    h = 0.5 * (lo + hi)
    best_h, best_w = h, abs(_merge_weight(a_m, a_n, log_k, h))
    for end in (0.0, 1.0):  # the two bumps of a far pair: the search may miss the higher one
        w = abs(_merge_weight(a_m, a_n, log_k, end))
        if w > best_w:
            best_h, best_w = end, w
    a_z = _merge_weight(a_m, a_n, log_k, best_h)
    return best_h, a_z, max(before - a_z * a_z, 0.0)


@njit(cache=True)
def merge_two(kp, S, slots, st, krow, idx, val, x_sq):
    """BSGD's merge: m = the vector of smallest |a_m|; n = the same-sign vector whose merge with m
    degrades f the least; both are replaced by a_z phi(z), z = h s_m + (1-h) s_n. Without a
    same-sign partner m is removed. Keeps margins and the query row krow up to date."""
    size = int(st[ST_SIZE])
    m = 0
    for i in range(1, size):
        if abs(slots[i, COEF]) < abs(slots[m, COEF]):
            m = i
    a_m = slots[m, COEF] * slots[m, LABEL]
    row_m = np.empty(size)
    kjit.stored_row(kp, S, slots, size, m, row_m)
    # Screen every same-sign partner with one evaluation, at h0 = a_m / (a_m + a_n) (the optimum
    # as the two points coincide) or at the better end point; then search h for the best one.
    partner = -1
    best_screen = np.inf
    for n in range(size):
        a_n = slots[n, COEF] * slots[n, LABEL]
        if n == m or a_n * a_m <= 0.0:
            continue
        k_mn = row_m[n]
        before = a_m * a_m + a_n * a_n + 2.0 * a_m * a_n * k_mn
        larger = max(abs(a_m), abs(a_n))
        screen = before - larger * larger
        if k_mn > 0.0:
            a_mid = _merge_weight(a_m, a_n, math.log(k_mn), a_m / (a_m + a_n))
            screen = min(screen, before - a_mid * a_mid)
        if screen < best_screen:
            partner, best_screen = n, screen
    if partner < 0:
        remove_vector(kp, S, slots, st, m, krow)
        return
    best_h, best_a, _ = _best_merge(
        a_m, slots[partner, COEF] * slots[partner, LABEL], row_m[partner]
    )
    n = partner
    a_n = slots[n, COEF] * slots[n, LABEL]
    track = st[TRACK] != 0.0
    row_n = np.empty(size)
    if track:
        kjit.stored_row(kp, S, slots, size, n, row_n)
    h = best_h
    # z's share of the two summed coefficients, projected on phi(z) like a_z itself.
    k_mn = row_m[n]
    if k_mn > 0.0:
        share_m = math.exp(math.log(k_mn) * (1.0 - h) * (1.0 - h))
        share_n = math.exp(math.log(k_mn) * h * h)
    else:  # too far apart: z is one of the two (h = 1: s_m, h = 0: s_n)
        share_m = 1.0 if h == 1.0 else 0.0
        share_n = 1.0 if h == 0.0 else 0.0
    checkpoint(slots, st, m)
    checkpoint(slots, st, n)
    summed_z = (
        slots[m, LABEL] * slots[m, AVG_BASE] * share_m
        + slots[n, LABEL] * slots[n, AVG_BASE] * share_n
    )
    for c in range(S.shape[1]):
        S[m, c] = h * S[m, c] + (1.0 - h) * S[n, c]
    slots[m, SQ_NORM] = stored_vector_sq(S, m)
    slots[m, SELF] = 1.0  # RBF
    label = 1.0 if best_a > 0.0 else -1.0
    slots[m, LABEL] = label
    slots[m, COEF] = best_a * label
    slots[m, AVG_BASE] = summed_z * label
    slots[m, BORN] = max(slots[m, BORN], slots[n, BORN])
    krow[m] = _query_one(kp, S, slots, m, idx, val, x_sq)
    if track:
        row_z = np.empty(size)
        kjit.stored_row(kp, S, slots, size, m, row_z)
        for i in range(size):
            if i != m and i != n:
                slots[i, MARGIN] += best_a * row_z[i] - a_m * row_m[i] - a_n * row_n[i]
        margin_z = 0.0
        for j in range(size):
            if j != n:
                margin_z += slots[j, COEF] * slots[j, LABEL] * row_z[j]
        slots[m, MARGIN] = margin_z
    # n's coefficient is now carried by z: remove it without touching the margins again.
    slots[n, COEF] = 0.0
    remove_vector(kp, S, slots, st, n, krow)
    st[MERGES] += 1.0


@njit(cache=True)
def _query_one(kp, S, slots, i, idx, val, x_sq):
    out = np.empty(1)
    # query_row on the single row i, through a one-row view of the cache
    kjit.row(kp, S[i : i + 1], slots[i : i + 1], 1, idx, val, x_sq, out)
    return out[0]


@njit(cache=True)
def make_room(kp, S, slots, st, krow, idx, val, x_sq, a_new, label_new, fx):
    """Free one slot of a full cache by the policy (RANDOM, OLDEST without shrinking, SMALLEST or
    MERGE). Returns False when the new vector itself is the one to drop (SMALLEST only)."""
    policy = int(st[POLICY])
    size = int(st[ST_SIZE])
    if policy == MERGE:
        merge_two(kp, S, slots, st, krow, idx, val, x_sq)
        return True
    st[EVICTIONS] += 1.0
    if policy == RANDOM:
        r = random_index(st, size)
    elif policy == OLDEST:
        r = kjit.oldest(slots, size)
    else:
        r = cks_victim(slots, size, krow, a_new, label_new, fx)
        if r < 0:
            return False
    remove_vector(kp, S, slots, st, r, krow)
    return True


@njit(cache=True, inline="always")
def span_coefficients(gram_inv, krow, n):
    """d = K^-1 k (k = krow, K the Gram matrix of the n cached vectors): the projection of phi(x)
    on the span of the cache is sum_j d_j phi(s_j), its squared norm k.d."""
    d = np.zeros(n)
    for i in range(n):
        total = 0.0
        for j in range(n):
            total += gram_inv[i, j] * krow[j]
        d[i] = total
    return d


@njit(cache=True, inline="always")
def add_projection(slots, st, krow, d, a, n):
    """f += a P phi(x) = a sum_j d_j phi(s_j): a_j += a d_j; the cached margins move by a k_i,
    since (K d)_i = k_i."""
    for j in range(n):
        checkpoint(slots, st, j)
        slots[j, COEF] += a * d[j] * slots[j, LABEL]
    if st[TRACK] != 0.0:
        for i in range(n):
            slots[i, MARGIN] += a * krow[i]
    st[PROJECTIONS] += 1.0
    st[CHANGES] += 1.0


@njit(cache=True)
def projectron_step(S, slots, st, gram_inv, idx, val, x_sq, krow, a, label, self_k, fx):
    """Add a phi(x) to f the Projectron's way: with d = K^-1 k (k = krow, K the cache's Gram
    matrix) and delta^2 = K(x, x) - k.d the squared distance of phi(x) to the span of the cache,
    project (a_j += a d_j) if delta <= THRESHOLD ||phi(x)|| or the cache is full, else add x and
    grow K^-1 by its Schur complement delta^2. Returns True when it projected.

    An empty cache is no special case: d is empty and delta^2 = K(x, x), so K^-1 = 1 / K(x, x)
    obeys the finite-range rule of any growth. A first x with K(x, x) <= 1 / BIG (a linear kernel
    and ||x|| <= 1e-50), whose 1 / K(x, x) would pass the range or overflow to inf, is projected
    on the empty span instead, an update of zero: learning never writes a non-finite K^-1.
    """
    n = int(st[ST_SIZE])
    budget = S.shape[0]
    d = span_coefficients(gram_inv, krow, n)
    delta2 = self_k
    largest_d = 0.0
    for i in range(n):
        delta2 -= krow[i] * d[i]
        largest_d = max(largest_d, abs(d[i]))
    threshold = st[THRESHOLD]
    project = n >= budget or delta2 <= threshold * threshold * self_k or delta2 <= 1e-12 * self_k
    if not project and not (largest_d * largest_d < BIG * delta2 and 1.0 < BIG * delta2):
        project = True  # K^-1 would leave the finite range: project instead of adding
    if project and not abs(a) * largest_d < COEF_LIMIT:
        # Only with inputs spanning hundreds of orders of magnitude (linear or polynomial
        # kernels): the Gram matrix is too ill-conditioned for a finite update; skip it.
        return False
    if project:
        add_projection(slots, st, krow, d, a, n)
        return True
    inv_delta2 = 1.0 / delta2
    for i in range(n):
        for j in range(n):
            gram_inv[i, j] += d[i] * d[j] * inv_delta2
        gram_inv[i, n] = -d[i] * inv_delta2
        gram_inv[n, i] = -d[i] * inv_delta2
    gram_inv[n, n] = inv_delta2
    add_vector(S, slots, st, idx, val, x_sq, krow, a, label, self_k, fx)
    return False


@njit(cache=True)
def projectron_margin_step(slots, st, gram_inv, krow, loss, y, self_k):
    """Projectron++'s update on a margin error (Orabona, Keshet & Caputo 2009, Section 4): a
    correct prediction with a loss = margin - y f(x) > 0 is corrected by projection only (the
    cache never grows), f += tau y P phi(x), with

        tau = min(loss / ||P phi(x)||^2, 1, 2 (loss - delta / eta) / ||P phi(x)||^2),

    delta the distance of phi(x) to the span of the cache relative to ||phi(x)|| (the paper's
    delta for the RBF kernel, K(x, x) = 1) and eta = THRESHOLD; no update unless
    loss > delta / eta (eta = 0: only for phi(x) in the span). Returns True when it updated.
    """
    n = int(st[ST_SIZE])
    d = span_coefficients(gram_inv, krow, n)
    proj_sq = 0.0
    largest_d = 0.0
    for i in range(n):
        proj_sq += krow[i] * d[i]
        largest_d = max(largest_d, abs(d[i]))
    delta2 = max(self_k - proj_sq, 0.0)  # rounding may leave k.d a little above K(x, x)
    proj_sq = self_k - delta2
    if not proj_sq > 0.0:
        return False
    relative = math.sqrt(delta2 / self_k)
    threshold = st[THRESHOLD]
    if threshold > 0.0:
        slack = loss - relative / threshold
    else:
        slack = loss if relative == 0.0 else -1.0
    if not slack > 0.0:
        return False
    tau = min(loss / proj_sq, 1.0, 2.0 * slack / proj_sq)
    a = tau * y / st[SCALE]
    if not abs(a) * largest_d < COEF_LIMIT:  # as in projectron_step: an ill-conditioned K
        return False
    add_projection(slots, st, krow, d, a, n)
    return True


@njit(cache=True)
def add_with_budget(kp, S, slots, st, gram_inv, idx, val, x_sq, krow, a, label, self_k, fx):
    """Add a phi(x) (unscaled coefficient a, label = sign) to f within the budget, by the
    policy; the Forgetron's shrinking is the perceptron's business, not done here."""
    policy = int(st[POLICY])
    if policy == PROJECT:
        projectron_step(S, slots, st, gram_inv, idx, val, x_sq, krow, a, label, self_k, fx)
        return
    if int(st[ST_SIZE]) >= S.shape[0]:
        if not make_room(kp, S, slots, st, krow, idx, val, x_sq, a, label, fx):
            return
        if st[TRACK] != 0.0:
            fx = row_sum(slots, int(st[ST_SIZE]), krow)
    add_vector(S, slots, st, idx, val, x_sq, krow, a, label, self_k, fx)


@njit(cache=True)
def kernel_params(st):
    return st[ST_KP : ST_KP + KP_SIZE]
