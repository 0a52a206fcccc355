"""Hot loops of ALMA_p (Gentile 2001, Figure 1) on a sparse instance.

Representation. ALMA_p keeps w in the unit q-ball and updates it in the dual space:
w' = f^-1(f(w) + eta y xh), w = w' / max(1, ||w'||_q). The link f is positively homogeneous of
degree 1 and norm-preserving (||f^-1(theta)||_q = ||theta||_p), so the projection of w' is the
same scaling of theta' = f(w'): theta <- theta' / max(1, ||theta'||_p). We therefore store
theta = scale * u, keep S = sum_i |u_i|^p up to date incrementally, and read the weights as

    w_i = factor * g(u_i),  g(u) = sign(u) |u|^(p-1),  factor = scale / S^((p-2)/p)

(w = scale * u for p = 2). An update then costs O(nnz(x)) instead of O(d): the projection only
changes `scale`. S is recomputed exactly every RECOMPUTE_EVERY corrections (rounding never
accumulates) and whenever it falls below half its peak since the last recomputation, S_PEAK: the
rounding of the running sum is relative to the largest sums it went through, so cancellation
(an update that takes back most of S) multiplies its relative error by peak / S, which this
keeps at most 2. Whenever S leaves [S_LOW, S_HIGH] the scale moves into u so that max |u_i| = 1
(|u|^p must neither overflow nor underflow; for a large p this happens often, at O(d) each).

Averaged hypothesis, also in O(nnz(x)). The served average is sum_t beta^(T-t) w_t / sum_t
beta^(T-t) over the trials t <= T, with beta = 1 - 1/average_window (beta = 1: the plain mean of
the paper's voted-style averaging). w_t,i = factor_t g(u_t,i), and g(u_i) only changes when
coordinate i is updated, so with GROWTH = beta^-(t - t0) and F = sum_t factor_t GROWTH_t (running
scalars) the weighted sum for coordinate i is (acc_i + g(u_i) (F - mark_i)) / GROWTH_T, where acc_i
holds the part up to the last update of i and mark_i the value of F then. Each trial adds its final
factor to F; an update of coordinate i first settles acc_i. The factor can move by orders of
magnitude (S grows from tiny values for p > 2, `scale` shrinks with every projection), and F must
only sum terms of comparable size or the later ones vanish in its rounding: whenever the factor
leaves [base/2, 2 base], or GROWTH nears float64's range, we re-base, settling every coordinate and
restarting GROWTH at 1 and F and the marks at 0. That costs O(d) a logarithmic number of times (or
once every ~230 windows). Moving the scale into u changes the unit of g(u), so it re-bases too.

Instances: (idx, val) hold the columns and values of the nonzero features; idx < 0 marks a feature
the model has never learnt from (weight 0, but its value counts in ||x||_p). Column 0 holds the
intercept's constant feature, whose value `rho` is 0 when the model has no intercept.

Arrays shared with `streammargin.alma.ALMAClassifier` (few arguments: numba's dispatch costs
about 0.1 us per argument, as much as the arithmetic of a small instance):
- vectors: float64[capacity, 3]; columns U (the scaled dual vector), ACC and MARK (the averaged
  hypothesis' accumulators).
- st: float64[STATE_SIZE], the scalars, the hyper-parameters and the calibration state, at the
  offsets of `LAYOUT` below.
"""

from __future__ import annotations

import math

import numpy as np

from streammargin.jit import calibration
from streammargin.jit.dispatch import njit
from streammargin.jit.layout import CALIBRATION, COUNTER, HYPER, LEARNT, Layout, Slot
from streammargin.jit.rows import largest_abs, row_entries

# columns of `vectors`
U, ACC, MARK = range(3)
N_COLUMNS = 3
LAYOUT = Layout(
    "ALMA",
    # learnt scalars
    Slot("k", COUNTER, "the correction counter k: corrections + 1"),
    Slot("scale", LEARNT, "theta = scale * u"),
    Slot("sum_p", LEARNT, "S = sum_i |u_i|^p"),
    Slot("since_recompute", COUNTER, "corrections since S was recomputed exactly"),
    Slot("trials", COUNTER, "examples learnt"),
    Slot("factor_sum", LEARNT, "F = sum_t factor_t GROWTH_t since the last re-base"),
    Slot("factor_base", LEARNT, "the factor at the last re-base"),
    Slot("growth", LEARNT, "GROWTH = beta^-(t - t0)"),
    Slot("decayed", LEARNT, "sum_t beta^(T-t), the averaged weights' divisor"),
    Slot("s_peak", LEARNT, "the largest S since S was last recomputed exactly"),
    # hyper-parameters, written from the model's params
    Slot("p", HYPER, param="p"),
    Slot("alpha", HYPER, param="alpha"),
    Slot("B", HYPER, "B, or 1 / alpha when B is None"),
    Slot("C", HYPER, param="C"),
    Slot("rho", HYPER, "the intercept's constant feature: intercept_scale, 0 without intercept"),
    Slot("average", HYPER, "1: serve the averaged hypothesis", param="average"),
    Slot("average_decay", HYPER, "beta = 1 - 1 / average_window (1 when it is None)"),
    Slot("platt", CALIBRATION, size=calibration.SIZE, parts=calibration.LAYOUT),
)
(K, SCALE, SUM_P, SINCE_RECOMPUTE, TRIALS, FACTOR_SUM, FACTOR_BASE, GROWTH, DECAYED) = (
    LAYOUT.offsets(
        "k",
        "scale",
        "sum_p",
        "since_recompute",
        "trials",
        "factor_sum",
        "factor_base",
        "growth",
        "decayed",
    )
)
P, ALPHA, B, C, RHO, AVERAGE, AVERAGE_DECAY = LAYOUT.offsets(
    "p", "alpha", "B", "C", "rho", "average", "average_decay"
)
S_PEAK = LAYOUT.offset("s_peak")
PLATT = LAYOUT.offset("platt")  # the calibration state is st[PLATT:]
STATE_SIZE = LAYOUT.size

RECOMPUTE_EVERY = 4096
S_LOW, S_HIGH = 1e-150, 1e150  # the range S is kept in (see `_renormalise`)
NEGLIGIBLE = 1e-30  # a theta whose entries are all below NEGLIGIBLE C is 0 (see `_renormalise`)
GROWTH_LIMIT = 1e100  # re-base the average before 1/decay^t gets near float64's range


def new_state(*hyper: float) -> np.ndarray:
    """A fresh state array; `hyper` = (p, alpha, B, C, rho, average, average_decay)."""
    st = np.zeros(STATE_SIZE)
    st[K] = 1.0
    st[SCALE] = 1.0
    st[GROWTH] = 1.0
    st[P : AVERAGE_DECAY + 1] = hyper
    st[PLATT:] = calibration.new_state()
    return st


@njit(cache=True)
def _abs_pow(v, p):
    a = abs(v)
    if p == 2.0:
        return a * a
    return a**p


@njit(cache=True, inline="always")
def _sum_abs_pow(val, rho, p):
    """|rho|^p + sum_j |val_j|^p. Four running sums, not one: one sum waits for the previous
    addition every step, four keep the adder busy (the norm is half the cost of a trial at 100
    features)."""
    n = val.shape[0]
    s0, s1, s2, s3 = _abs_pow(rho, p), 0.0, 0.0, 0.0
    if p == 2.0:  # (outside the loop: LLVM would otherwise compute both branches per entry)
        for j in range(0, n - n % 4, 4):
            s0 += val[j] * val[j]
            s1 += val[j + 1] * val[j + 1]
            s2 += val[j + 2] * val[j + 2]
            s3 += val[j + 3] * val[j + 3]
    else:
        for j in range(0, n - n % 4, 4):
            s0 += abs(val[j]) ** p
            s1 += abs(val[j + 1]) ** p
            s2 += abs(val[j + 2]) ** p
            s3 += abs(val[j + 3]) ** p
    for j in range(n - n % 4, n):
        s0 += _abs_pow(val[j], p)
    return (s0 + s1) + (s2 + s3)


# Not inlined by numba (its two callers each copied its IR, and that of `_sum_abs_pow`, into
# theirs): 1.9 s less compile before a fresh process's first prediction, no measurable cost a
# record (LLVM still sees it).
@njit(cache=True)
def normalise(val, rho, p, xh):
    """Write xh = x / ||(rho, x)||_p into `xh` and return (rho / ||(rho, x)||_p, nonzero).

    nonzero is False for a zero instance (xh is then unused). The norm is computed directly when
    the sum of powers is safely inside float64's range, else after dividing by the largest entry,
    which keeps every step finite from subnormal instances to values near the float64 maximum.
    """
    total = _sum_abs_pow(val, rho, p)
    if 1e-280 < total < 1e300:
        inv = 1.0 / math.sqrt(total) if p == 2.0 else total ** (-1.0 / p)
        for j in range(val.shape[0]):
            xh[j] = val[j] * inv
        return rho * inv, True
    largest = largest_abs(val, rho)
    if largest == 0.0:
        return 0.0, False
    rho_hat = rho / largest
    total = _abs_pow(rho_hat, p)
    for j in range(val.shape[0]):
        xh[j] = val[j] / largest
        total += _abs_pow(xh[j], p)
    inv = 1.0 / math.sqrt(total) if p == 2.0 else total ** (-1.0 / p)
    for j in range(val.shape[0]):
        xh[j] *= inv
    return rho_hat * inv, True


@njit(cache=True, inline="always")
def primal_factor(st):
    """The factor c with w_i = c * g(u_i)."""
    p = st[P]
    if p == 2.0:
        return st[SCALE]
    if st[SUM_P] <= 0.0:
        return 0.0
    return st[SCALE] / st[SUM_P] ** ((p - 2.0) / p)


@njit(cache=True)
def g(u_i, p):
    """sign(u) |u|^(p-1)."""
    if p == 2.0:
        return u_i
    if u_i == 0.0:
        return 0.0
    return math.copysign(abs(u_i) ** (p - 1.0), u_i)


@njit(cache=True, inline="always")
def _averaged_weight(vectors, i, p, factor_sum):
    """sum over trials so far of w_t,i (divide by the number of trials for the mean).

    A coordinate settled at this very trial (MARK = F) is its accumulator: u_i may have just grown
    beyond |u|^(p-1)'s range (a large p; `_renormalise` is about to rescale it), and inf * 0
    would be NaN."""
    since = factor_sum - vectors[i, MARK]
    if since == 0.0:
        return vectors[i, ACC]
    return vectors[i, ACC] + g(vectors[i, U], p) * since


@njit(cache=True, inline="always")
def _margins(vectors, st, idx, xh, rho_hat):
    """(last, served): w . xh for the last hypothesis, and the margin of the served one (the same,
    or the averaged hypothesis' margin), in one pass over the instance."""
    p = st[P]
    if p != 2.0 or st[AVERAGE] == 0.0 or st[DECAYED] == 0.0:
        return _margins_any(vectors, st, idx, xh, rho_hat)
    # p = 2 and averaged (the default), written out with two running sums per margin
    factor = st[SCALE]
    factor_sum = st[FACTOR_SUM]
    u0 = vectors[0, U]
    last0, last1 = u0 * rho_hat, 0.0
    sum0, sum1 = (vectors[0, ACC] + u0 * (factor_sum - vectors[0, MARK])) * rho_hat, 0.0
    n = idx.shape[0]
    for j in range(0, n - 1, 2):
        i = idx[j]
        if i >= 0:
            u = vectors[i, U]
            last0 += u * xh[j]
            sum0 += (vectors[i, ACC] + u * (factor_sum - vectors[i, MARK])) * xh[j]
        i = idx[j + 1]
        if i >= 0:
            u = vectors[i, U]
            last1 += u * xh[j + 1]
            sum1 += (vectors[i, ACC] + u * (factor_sum - vectors[i, MARK])) * xh[j + 1]
    if n % 2:
        i = idx[n - 1]
        if i >= 0:
            u = vectors[i, U]
            last0 += u * xh[n - 1]
            sum0 += (vectors[i, ACC] + u * (factor_sum - vectors[i, MARK])) * xh[n - 1]
    return factor * (last0 + last1), (sum0 + sum1) / (st[GROWTH] * st[DECAYED])


@njit(cache=True)
def _margins_any(vectors, st, idx, xh, rho_hat):
    """`_margins` for any p and either hypothesis."""
    p = st[P]
    factor = primal_factor(st)
    if st[AVERAGE] == 0.0 or st[DECAYED] == 0.0:
        last = factor * g(vectors[0, U], p) * rho_hat
        for j in range(idx.shape[0]):
            i = idx[j]
            if i >= 0:
                last += factor * g(vectors[i, U], p) * xh[j]
        return last, last
    factor_sum = st[FACTOR_SUM]
    last = factor * g(vectors[0, U], p) * rho_hat
    summed = _averaged_weight(vectors, 0, p, factor_sum) * rho_hat
    for j in range(idx.shape[0]):
        i = idx[j]
        if i >= 0:
            last += factor * g(vectors[i, U], p) * xh[j]
            summed += _averaged_weight(vectors, i, p, factor_sum) * xh[j]
    return last, summed / (st[GROWTH] * st[DECAYED])


@njit(cache=True, inline="always")
def _served_margin(vectors, st, idx, val, xh):
    rho_hat, nonzero = normalise(val, st[RHO], st[P], xh)
    if not nonzero:
        return 0.0
    return _margins(vectors, st, idx, xh, rho_hat)[1]


@njit(cache=True)
def margin(vectors, st, idx, val):
    """The served hypothesis' margin on the normalised instance (0 for a zero instance)."""
    return _served_margin(vectors, st, idx, val, np.empty(val.shape[0]))


@njit(cache=True, inline="always")
def _unpacked(packed):
    """The float64 values of an instance packed as bytes by `FeatureSpace.encode_packed` (a
    read-only view). The per-record functions below take bytes: a numpy array made from them in
    Python costs more than the whole dispatch of an entry point (`streammargin.jit.entry`)."""
    return np.frombuffer(packed, dtype=np.float64)


@njit(cache=True, inline="always")
def _checked(packed):
    """`_unpacked`, raising ValueError if a value is NaN or infinite (the model encodes what it
    predicts for without checking, `FeatureSpace.encode_packed(check_finite=False)`)."""
    val = np.frombuffer(packed, dtype=np.float64)
    total = 0.0
    for j in range(val.shape[0]):
        total += val[j] * 0.0  # NaN for a NaN or an infinity, else 0
    if total != 0.0:
        raise ValueError("a feature value is not finite")
    return val


@njit(cache=True, inline="always")
def _settle(vectors, i, p, factor_sum):
    """Bring coordinate i's average accumulator up to date (before g(u_i) changes)."""
    vectors[i, ACC] = _averaged_weight(vectors, i, p, factor_sum)
    vectors[i, MARK] = factor_sum


@njit(cache=True)
def _rebase(vectors, st):
    """Settle every average accumulator, move it to the present time unit (GROWTH = 1) and
    restart F and the marks at 0."""
    p, factor_sum, growth = st[P], st[FACTOR_SUM], st[GROWTH]
    for i in range(vectors.shape[0]):
        vectors[i, ACC] = _averaged_weight(vectors, i, p, factor_sum) / growth
        vectors[i, MARK] = 0.0
    st[FACTOR_SUM] = 0.0
    st[GROWTH] = 1.0
    st[FACTOR_BASE] = primal_factor(st)


@njit(cache=True)
def _renormalise(vectors, st):
    """Recompute S = sum |u_i|^p exactly; if it strays from [S_LOW, S_HIGH] (|u|^p about to
    overflow, or underflowing), move the scale so that max |u_i| = 1, which puts S in [1, d].

    Unless theta = SCALE u is negligible, every entry below NEGLIGIBLE C: then theta becomes 0
    (u = 0, SCALE = 1). Corrections can cancel theta to almost nothing (x, then 1e-3 x with the
    other label: 5e-268 is left), and moving that into the scale took SCALE to 5e-268, or
    subnormal and on to 0 (then inf and NaN in u). Every later correction moves an entry of
    theta by at least eta_k max |xh_j| >= C / (sqrt(p - 1) sqrt(k)) d^(-1/p) >= 1e-14 C (p <= 1000,
    k <= 2**53, d <= 2**30 + 1), so such a theta is below the rounding of the next one; and
    SCALE stays above min(S_HIGH^(-1/p), NEGLIGIBLE C)."""
    p = st[P]
    total = 0.0
    for i in range(vectors.shape[0]):
        total += _abs_pow(vectors[i, U], p)
    if not S_LOW < total < S_HIGH:
        largest = 0.0
        for i in range(vectors.shape[0]):
            largest = max(largest, abs(vectors[i, U]))
        if largest > 0.0:
            if st[AVERAGE] != 0.0:
                _rebase(vectors, st)  # the unit of g(u) changes
            negligible = st[SCALE] * largest < NEGLIGIBLE * st[C]
            for i in range(vectors.shape[0]):
                vectors[i, U] = 0.0 if negligible else vectors[i, U] / largest
            st[SCALE] = 1.0 if negligible else st[SCALE] * largest
            total = 0.0
            for i in range(vectors.shape[0]):
                total += _abs_pow(vectors[i, U], p)
    st[SUM_P] = total
    st[S_PEAK] = total
    st[SINCE_RECOMPUTE] = 0.0


@njit(cache=True, inline="always")
def _update(vectors, st, i, step, x_i, total, p, averaged):
    """u_i += step * x_i, keeping S (returned) and the average accumulator of i up to date."""
    if averaged:
        _settle(vectors, i, p, st[FACTOR_SUM])
    old = vectors[i, U]
    vectors[i, U] = old + step * x_i
    return total + _abs_pow(vectors[i, U], p) - _abs_pow(old, p)


@njit(cache=True, inline="always")
def _learn(vectors, st, idx, val, y, xh):
    """One trial of ALMA_p on (x, y), y in {-1.0, +1.0}, `xh` a scratch buffer of len(val).
    Returns 1 on a correction, else 0.

    Every column in idx must be >= 0 and < vectors.shape[0] (the caller grows the space first).
    """
    p, rho = st[P], st[RHO]
    averaged = st[AVERAGE] != 0.0
    rho_hat, nonzero = normalise(val, rho, p, xh)
    corrected = 0
    if nonzero:  # "in the degenerate case x_t = 0 no update takes place" (footnote 4)
        last, served = _margins(vectors, st, idx, xh, rho_hat)
        calibration.learn(st[PLATT:], served, y)
        k = st[K]
        gamma = st[B] * math.sqrt(p - 1.0) / math.sqrt(k)
        if y * last <= (1.0 - st[ALPHA]) * gamma:
            eta = st[C] / (math.sqrt(p - 1.0) * math.sqrt(k))
            step = eta * y / st[SCALE]  # theta += eta y xh  <=>  u += (eta y / scale) xh
            total = st[SUM_P]
            if rho != 0.0:
                total = _update(vectors, st, 0, step, rho_hat, total, p, averaged)
            for j in range(idx.shape[0]):
                total = _update(vectors, st, idx[j], step, xh[j], total, p, averaged)
            st[SUM_P] = total
            st[SINCE_RECOMPUTE] += 1.0
            peak = max(st[S_PEAK], total)
            st[S_PEAK] = peak
            # (`not a < S < b` is also true for a NaN from an overflowed |u|^p.)
            if (not S_LOW < total < S_HIGH or st[SINCE_RECOMPUTE] >= RECOMPUTE_EVERY
                    or total < 0.5 * peak):
                _renormalise(vectors, st)
            # ||w'||_q = ||theta'||_p; project onto the unit q-ball by scaling theta.
            dual_norm = st[SCALE] * st[SUM_P] ** (1.0 / p)
            if dual_norm > 1.0:
                st[SCALE] /= dual_norm
            st[K] = k + 1.0
            corrected = 1
    st[TRIALS] += 1.0
    if averaged:  # the hypothesis after this trial served it
        factor = primal_factor(st)
        base = st[FACTOR_BASE]
        if factor > 2.0 * base or factor < 0.5 * base or st[GROWTH] > GROWTH_LIMIT:
            _rebase(vectors, st)
            st[FACTOR_BASE] = factor
        decay = st[AVERAGE_DECAY]
        st[GROWTH] /= decay
        st[DECAYED] = decay * st[DECAYED] + 1.0
        st[FACTOR_SUM] += factor * st[GROWTH]
    return corrected


@njit(cache=True, inline="always")
def _learn_then_margin(vectors, st, idx, packed, y, new_idx, new_packed):
    val = _unpacked(packed)
    xh = np.empty(max(val.shape[0], len(new_packed) // 8))
    if y != 0.0:
        _learn(vectors, st, idx, val, y, xh[: val.shape[0]])
    new_val = _checked(new_packed)  # after the trial: raising leaves no trial half-done
    return _served_margin(vectors, st, new_idx, new_val, xh[: new_val.shape[0]])


@njit(cache=True)
def learn_then_predict(vectors, st, idx, packed, y, new_idx, new_packed):
    """One trial of ALMA_p on the packed (idx, packed, y), y in {-1.0, +1.0} (see `_learn`), then
    `calibration.signed_proba` of the packed (new_idx, new_packed), values checked: +P(True) if
    the predicted label is True, else -P(True). In one dispatch: the model defers a learn_one to
    the next prediction (a dispatch costs as much as a small trial). y = 0.0 runs no trial (a
    prediction alone); a trial alone passes an empty new instance. One compiled copy of the
    trial serves all three: each entry point that inlines it compiles for ~5 s, and a separate
    prediction entry point cost 1.5 s more before a fresh process's first prediction."""
    margin = _learn_then_margin(vectors, st, idx, packed, y, new_idx, new_packed)
    return calibration.signed_proba(st[PLATT:], margin)


@njit(cache=True, any_layout=("X",))
def learn_rows(vectors, st, X, cols, y):
    """`learn` over the rows of X (NaN = absent feature). Returns -1, or r * X.shape[1] + c for
    the first infinite entry (r, c): rows before r were learnt, the caller restores its state."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    xh = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        if n < 0:
            return r * X.shape[1] + (-1 - n)
        _learn(vectors, st, idx_buf[:n], val_buf[:n], y[r], xh[:n])
    return -1


@njit(cache=True, any_layout=("X",))
def margin_rows(vectors, st, X, cols, out):
    """`margin` of every row of X into `out`; returns -1, or r * X.shape[1] + c for the first
    infinite entry (r, c)."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    xh = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        if n < 0:
            return r * X.shape[1] + (-1 - n)
        out[r] = _served_margin(vectors, st, idx_buf[:n], val_buf[:n], xh[:n])
    return -1


@njit(cache=True)
def primal_weights(vectors, st, out):
    factor = primal_factor(st)
    for i in range(vectors.shape[0]):
        out[i] = factor * g(vectors[i, U], st[P])
