"""Hot loops of the Convex Polytope Machine (Kantchelian et al. 2014, Algorithms 1 and 2).

A polytope is K faces W_k; its score is f(x) = max_k W_k . x. Every SGD step t (Pegasos step
eta_t = 1 / (lambda t)) first shrinks all weights, W <- (1 - eta_t lambda) W, then adds eta_t times
a subgradient of the hinge terms of one example, computed with W before the step:

- ONE polytope (the paper's problem (6)): an inside example (negative class) pushes down every face
  with W_k . x > -1 (W_k -= eta_t x); an outside example (positive class) pulls up the face
  z = ASSIGN(W, x, h) if W_z . x < 1 (W_z += eta_t x).
- SEPARATE polytopes, one per class (the paper's two-polytope CPM for two classes): polytope c is a
  one-polytope CPM with class c outside and every other class inside, trained on every example.
- JOINT polytopes, one per class: the hinge of the decision itself,
  [1 - W_{y,z} . x + f_o(x)]_+ with z = ASSIGN(W_y, x, h) and o the best other class: if it is
  positive, W_{y,z} += eta_t x and W_{o,z_o} -= eta_t x with z_o = argmax_k W_{o,k} . x.
  Nothing is learnt while a single class has been seen (there is no other class to separate).
Prediction: the sign of f(x) (one polytope) or the class of largest f_c(x) (per class; for two
classes the paper's sign(f_-(x) - f_+(x))).

Representation. With eta_t = 1/(lambda t) the shrink factors telescope: after t steps
W = G / (lambda t), where G is the plain sum of the signed instances of every update so far. We
store G and compute W . x = G . x / (lambda t): an update costs O(nnz(x)) per touched face, the
shrink costs nothing and never drifts.

Replay. The paper runs T >> n SGD steps over a data set D. On a stream, D is a window of the last
`window` examples (a ring buffer of dense rows) and every incoming example makes STEPS SGD steps:
one on itself, then STEPS - 1 on examples drawn uniformly from the window (a counter-based hash
RNG whose counter lives in `st`, so a restored model draws the same examples).

ASSIGN (Algorithm 2) on a stream: instead of the paper's dictionary of every positive instance's
unadjusted assignment, each polytope keeps per-face counts that decay by DECAY per positive
instance (a memory of about 1 / (1 - DECAY) positives). The natural assignment is the argmax face;
when adding the instance to it would leave the entropy of the counts below h, the instance goes to
the best-scoring face whose count would raise the entropy. The counts always record the natural
(unadjusted) face, as the paper's UNADJ does. The heuristic waits until the counts hold 5 K
instances (as the authors' code does), so that the entropy means something.

Arrays shared with `streammargin.convex_polytope.ConvexPolytopeClassifier` (few of them: every
array argument adds to the cost of every call, and a call costs about as much as an SGD step):
- W: float64[columns, n_polytopes * K] holding G; row 0 is the intercept's constant feature
  (value RHO, 0 without intercept), row i the feature column i; column p * K + k is face k of
  polytope p. A feature's weights over all faces are contiguous, so the scores of every face are
  one pass over the instance with a contiguous inner loop.
- st: float64[CLASSES + n_classes * block_size(K)] (`layout`): the scalars and hyper-parameters of
  HEAD, then one block per class c: the decayed face counts of polytope c (K), their total,
  their sum of n log n (kept incrementally, recomputed exactly every EXACT_EVERY positives), the
  number of positives since, and the online Platt state of class c. With one polytope there is
  one block: its counts and the calibration of P(positive).
- window: float64[window, columns]; row r is a stored example: column 0 its class code, column i
  the value of feature column i (0 when absent). Empty (0 rows) when STEPS = 1.

Instances are (idx, val) with idx < 0 for features the model never learnt (no weight).

Speed. At 10 features a record's arithmetic takes a few hundred nanoseconds, and numba's
bookkeeping can cost more: every array bound to a function's parameter (inlined or not) or made by
slicing is reference-counted with atomic operations, which cost about 10 ns each here, and every
np.empty is a malloc and a free. With the SGD step spread over helpers, a `learn` call made about
150 such operations and 3 allocations (about a fifth of its time). So the per-record functions,
`predict` and `learn`, are written out: they call only helpers that take scalars or run rarely,
slice and allocate their scratch once per call (never per step), and make about 15 and 25 of
these operations.
`face_scores`, `shrink_factor` and `_scores` compute the same scores for the other entry points.
"""

from __future__ import annotations

import math

import numpy as np

from streammargin.jit import calibration, rng
from streammargin.jit.dispatch import njit
from streammargin.jit.layout import CALIBRATION, COUNTER, HYPER, LEARNT, Layout, Slot
from streammargin.jit.rows import row_entries

ONE, SEPARATE, JOINT = 0, 1, 2
MODES = {"one": ONE, "separate": SEPARATE, "joint": JOINT}

# `st`: these scalars and hyper-parameters, then one block per class (`layout`).
HEAD = Layout(
    "CPM",
    Slot("trials", COUNTER, "examples learnt"),
    Slot("sgd_steps", COUNTER, "SGD steps taken: t of eta_t = 1 / (lambda t)"),
    Slot("n_active", COUNTER, "classes seen, whose polytopes learn (0 with one polytope)"),
    Slot("draws", COUNTER, "draws of the generator so far"),
    Slot("n_faces", HYPER, "K, faces per polytope", param="n_faces"),
    Slot("l2", HYPER, "lambda", param="l2"),
    Slot("entropy", HYPER, "h: entropy * log K, in nats"),
    Slot("rho", HYPER, "the intercept's constant feature: intercept_scale, 0 without intercept"),
    Slot("mode", HYPER, "the variant's code (MODES)", param="polytopes", codes=MODES),
    Slot("steps", HYPER, "SGD steps per example", param="steps"),
    Slot("window", HYPER, "rows of the replay window", param="window"),
    Slot("seed", HYPER, "key of the counter-based generator", param="seed"),
)
TRIALS, SGD_STEPS, N_ACTIVE, DRAWS = HEAD.offsets("trials", "sgd_steps", "n_active", "draws")
N_FACES, L2, ENTROPY, RHO, MODE, STEPS, WINDOW, SEED = HEAD.offsets(
    "n_faces", "l2", "entropy", "rho", "mode", "steps", "window", "seed"
)
CLASSES = HEAD.size  # first class block
# A class block is its K decayed face counts, then BLOCK_TAIL (offsets from the end of the counts).
BLOCK_TAIL = Layout(
    "class block after its face counts",
    Slot("total", LEARNT, "the face counts' sum"),
    Slot("sum_nlogn", LEARNT, "the face counts' sum of n log n"),
    Slot("since_exact", COUNTER, "positives since total and sum_nlogn were recomputed exactly"),
    Slot("platt", CALIBRATION, size=calibration.SIZE, parts=calibration.LAYOUT),
)
TOTAL, SUM_NLOGN, SINCE_EXACT, PLATT = BLOCK_TAIL.offsets(
    "total", "sum_nlogn", "since_exact", "platt"
)

DECAY = 0.999  # face counts of ASSIGN forget with this factor per positive instance
LOG_DECAY = math.log(DECAY)
# A decayed count below this becomes 0. It changes no decision (1 + n == 1 and n log n vanishes
# next to the other counts' sum long before), but a count left to decay reaches the subnormal
# floats after about 700k positives of its polytope, where every multiplication by DECAY costs a
# hundred times more (measured: 12% of the time of a long-running model).
TINY_COUNT = 1e-300
EXACT_EVERY = 1024  # positives between exact recomputations of a block's total and sum n log n
WARMUP_PER_FACE = 5.0  # ASSIGN uses argmax until the counts hold 5 K positives
# An instance longer than this (intercept included) is shrunk to this length before it is used.
# Far beyond any scaled data, it only keeps |W . x| <= MAX_NORM^2 / lambda finite and squarable.
MAX_NORM = 1e50


def hyper_values(n_faces, l2, entropy, rho, mode, steps, window, seed) -> tuple[float, ...]:
    """The hyper-parameter slots: entropy is given as a fraction of log K, stored in nats."""
    return (
        float(n_faces),
        float(l2),
        float(entropy) * math.log(n_faces),
        float(rho),
        float(MODES[mode]),
        float(steps),
        float(window),
        float(seed),
    )


def block_size(n_faces: int) -> int:
    return n_faces + BLOCK_TAIL.size


def state_size(n_faces: int, n_blocks: int) -> int:
    """The entries of `st` with `n_blocks` class blocks of `n_faces` face counts each."""
    return CLASSES + n_blocks * block_size(n_faces)


def layout(n_faces: int, n_blocks: int) -> Layout:
    """The whole layout of `st`: HEAD, then block c's slots, named `counts[c]` (K entries),
    `total[c]`, `sum_nlogn[c]`, `since_exact[c]` and `platt[c]` (c: the class' code; 0 alone
    with one polytope)."""
    slots = []
    for c in range(n_blocks):
        slots.append(Slot(f"counts[{c}]", LEARNT, "decayed face counts of ASSIGN", size=n_faces))
        slots.extend(slot._replace(name=f"{slot.name}[{c}]") for slot in BLOCK_TAIL.slots)
    return HEAD.extend("class blocks", *slots)


def new_block(n_faces: int) -> np.ndarray:
    """The state block of a new class: no counts, a fresh calibration."""
    block = np.zeros(block_size(n_faces))
    block[n_faces + PLATT :] = calibration.new_state()
    return block


@njit(cache=True)
def block_start(n_faces, c):
    """Where class c's block starts in st."""
    return CLASSES + c * (n_faces + PLATT + calibration.SIZE)


@njit(cache=True, inline="always")
def calibration_of(st, c):
    """The calibration state of class c (a view into st)."""
    start = block_start(int(st[N_FACES]), c) + int(st[N_FACES]) + PLATT
    return st[start : start + calibration.SIZE]


@njit(cache=True, inline="always")
def n_polytopes(st):
    if st[MODE] != ONE:
        return int(st[N_ACTIVE])
    return 1


# Instances ----------------------------------------------------------------------------------------


@njit(cache=True)
def _exact_shrink(val, n, rho, largest):
    """`shrink_factor` for an instance that may be too long: its norm, computed without overflow."""
    total = (rho / largest) ** 2
    for j in range(n):
        total += (val[j] / largest) ** 2
    norm = largest * math.sqrt(total)
    if norm <= MAX_NORM:
        return 1.0
    return MAX_NORM / norm


@njit(cache=True, inline="always")
def shrink_factor(val, n, rho, largest):
    """1, or the factor that brings ||(rho, x)|| down to MAX_NORM, for x = val[:n] whose largest
    entry (rho included) is `largest` (the loop that reads the instance finds it)."""
    if largest * math.sqrt(n + 1.0) <= MAX_NORM:
        return 1.0
    return _exact_shrink(val, n, rho, largest)


# Scores -------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def face_scores(W, st, idx, val, n, shrink, n_faces_total, out):
    """out[f] = W_f . x for the first n_faces_total faces, x = (idx, val)[:n] shrunk (intercept
    included). `learn` and `predict` have this loop written out."""
    t = st[SGD_STEPS]
    if t == 0.0:
        for f in range(n_faces_total):
            out[f] = 0.0
        return
    x0 = st[RHO] * shrink
    for f in range(n_faces_total):
        out[f] = W[0, f] * x0
    for j in range(n):
        i = idx[j]
        if i >= 0:
            v = val[j] * shrink
            for f in range(n_faces_total):
                out[f] += W[i, f] * v
    inv = 1.0 / (st[L2] * t)  # W = G / (lambda t)
    for f in range(n_faces_total):
        out[f] *= inv


@njit(cache=True, inline="always")
def _scores(W, st, idx, val, faces, poly):
    """Face scores of x into faces, polytope scores f_p(x) = max_k W_{p,k} . x into poly; returns
    the number of polytopes."""
    n_faces = int(st[N_FACES])
    n_poly = n_polytopes(st)
    rho = st[RHO]
    largest = abs(rho)
    for j in range(val.shape[0]):
        largest = max(largest, abs(val[j]))
    shrink = shrink_factor(val, val.shape[0], rho, largest)
    face_scores(W, st, idx, val, idx.shape[0], shrink, n_poly * n_faces, faces)
    for p in range(n_poly):
        base = p * n_faces
        best = base
        for f in range(base + 1, base + n_faces):
            if faces[f] > faces[best]:
                best = f
        poly[p] = faces[best]
    return n_poly


@njit(cache=True, inline="always")
def _top_two(poly, n_poly):
    """(the first polytope of largest score, the largest score of the others)."""
    first = 0
    for p in range(1, n_poly):
        if poly[p] > poly[first]:
            first = p
    second = -np.inf
    for p in range(n_poly):
        if p != first and poly[p] > second:
            second = poly[p]
    return first, second


# ASSIGN -------------------------------------------------------------------------------------------


@njit(cache=True)
def _nlogn(n):
    return n * math.log(n) if n > 0.0 else 0.0


@njit(cache=True)
def _comes_before(score_b, b, score_a, a):
    """Whether face b comes before face a in the order (score descending, index ascending)."""
    return score_b > score_a or (score_b == score_a and b < a)


@njit(cache=True)
def _exact_sums(st, start, n_faces):
    """Recompute a block's total and sum of n log n from its counts."""
    total = 0.0
    sum_nlogn = 0.0
    for k in range(n_faces):
        total += st[start + k]
        sum_nlogn += _nlogn(st[start + k])
    st[start + n_faces + TOTAL] = total
    st[start + n_faces + SUM_NLOGN] = sum_nlogn
    st[start + n_faces + SINCE_EXACT] = 0.0


@njit(cache=True)
def entropy_raising_face(st, start, faces, base, n_faces, log_next, total, sum_nlogn):
    """ASSIGN's adjusted face, when adding x to the natural face would leave the entropy of the
    (decayed) counts st[start : start + K] below h: the best-scoring face (faces[base + k]) whose
    count would raise the entropy, or -1 if none would. total = N and sum_nlogn = S are the
    decayed sums, log_next = log(N + 1) (see `learn`)."""
    # Try the faces in decreasing score (first index on ties) and stop at the first that raises
    # the entropy, so the logarithms are only taken for the few faces tried.
    current = math.log(total) - sum_nlogn / total
    previous = -1
    for _ in range(n_faces):
        k = -1
        for j in range(n_faces):
            score_j = faces[base + j]
            if previous >= 0 and not _comes_before(faces[base + previous], previous, score_j, j):
                continue
            if k < 0 or _comes_before(score_j, j, faces[base + k], k):
                k = j
        n_k = st[start + k]
        raised = log_next - (sum_nlogn - _nlogn(n_k) + _nlogn(n_k + 1.0)) / (total + 1.0)
        if raised > current:
            return k
        previous = k
    return -1


# Learning -----------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _calibrate(st, poly, n_poly, code):
    """Feed every class' calibrator with the margin served for this example (test-then-train):
    f(x) with one polytope, else f_c(x) - max_{c' != c} f_c'(x) (f_c(x) while a single class has
    been seen)."""
    first, second = _top_two(poly, n_poly)
    for c in range(n_poly):
        margin = poly[c] - (second if c == first else poly[first]) if n_poly > 1 else poly[0]
        positive = code == 1 if st[MODE] == ONE else c == code
        calibration.learn(calibration_of(st, c), margin, 1.0 if positive else -1.0)


@njit(cache=True)
def learn(W, st, window, idx, val, code):
    """Learn from one example (x, class code): calibrate the served score, one SGD step on the
    example, then STEPS - 1 steps on examples of the window. Returns the faces updated.

    One polytope: code 1 is the positive (outside) class, code 0 the negative. Per class: code is
    the class index; a code equal to the number of active classes activates a new class (its
    weight columns and state block must exist, zero counts). Every column in idx must be >= 0 and
    < W.shape[0] (and < window.shape[1] when STEPS > 1).

    The steps are written out rather than spread over helpers that take arrays: numba counts the
    references of every array bound to a parameter, with atomic operations that cost more than a
    step's arithmetic (see "Speed" in the module's docstring). Every step runs the same code on
    the step buffers, x included.
    """
    if st[MODE] != ONE and code >= st[N_ACTIVE]:
        st[N_ACTIVE] = code + 1.0
    mode = st[MODE]
    n_faces = int(st[N_FACES])
    n_poly = n_polytopes(st)
    n_total = n_poly * n_faces
    steps = int(st[STEPS])
    rho = st[RHO]
    # Scratch for the face scores, each polytope's score and best face, and the instance of the
    # current step (x itself, then the replayed examples) as values and columns: one allocation
    # per call, the integers its tail viewed as int64 (an allocation costs about 5% of this call).
    capacity = max(idx.shape[0], window.shape[1])
    work = np.empty(n_total + 2 * n_poly + 2 * capacity)
    faces = work[:n_total]
    poly = work[n_total : n_total + n_poly]
    vals = work[n_total + n_poly : n_total + n_poly + capacity]
    ints = work[n_total + n_poly + capacity :].view(np.int64)
    best = ints[:n_poly]
    cols = ints[n_poly:]
    updated = 0
    for step in range(steps):
        # The instance: x, then examples drawn uniformly from the window (ring buffer rows).
        largest = abs(rho)
        if step == 0:
            n = idx.shape[0]
            for j in range(n):
                cols[j] = idx[j]
                vals[j] = val[j]
                largest = max(largest, abs(val[j]))
            step_code = code
        else:
            filled = int(min(st[TRIALS], st[WINDOW]))
            slot = rng.index(st[SEED], st[DRAWS], filled)
            st[DRAWS] += 1.0
            n = 0
            for c in range(1, window.shape[1]):
                v = window[slot, c]
                if v != 0.0:
                    cols[n] = c
                    vals[n] = v
                    n += 1
                    largest = max(largest, abs(v))
            step_code = int(window[slot, 0])
        shrink = 1.0
        if largest * math.sqrt(n + 1.0) > MAX_NORM:
            shrink = _exact_shrink(vals, n, rho, largest)

        # Its face scores under the current W (as `face_scores`), each polytope's best face.
        t = st[SGD_STEPS]
        if t == 0.0:
            for f in range(n_total):
                faces[f] = 0.0
        else:
            x0 = rho * shrink
            for f in range(n_total):
                faces[f] = W[0, f] * x0
            for j in range(n):
                i = cols[j]
                v = vals[j] * shrink
                for f in range(n_total):
                    faces[f] += W[i, f] * v
            inv = 1.0 / (st[L2] * t)  # W = G / (lambda t)
            for f in range(n_total):
                faces[f] *= inv
        for p in range(n_poly):
            base = p * n_faces
            b = 0
            for k in range(1, n_faces):
                if faces[base + k] > faces[base + b]:
                    b = k
            best[p] = b
            poly[p] = faces[base + b]
        if step == 0:
            _calibrate(st, poly, n_poly, code)

        # The step. Pegasos: W_{t+1} = (1 - 1/t) W_t + (1/(lambda t)) g_t is G_{t+1} = G_t + g_t
        # with W = G / (lambda t), so the step on G has size 1 whatever t and lambda: G += x on the
        # face pulled up, G -= x on the faces pushed down.
        st[SGD_STEPS] += 1.0
        if mode == JOINT:  # x is outside the polytope of its class (if there is another class)
            outside = step_code if n_poly >= 2 else -1
        elif mode == ONE:  # the positive class is outside
            outside = 0 if step_code == 1 else -1
        else:
            outside = step_code
        up = -1
        down = -1  # joint: the best face of the best other class
        if outside >= 0:
            # ASSIGN(W, x, h) (Algorithm 2 with decayed counts) gives the face to pull up. The
            # entropy of the counts n is H = log N - S / N with N = sum n_k and
            # S = sum n_k log n_k. Decaying every count by beta maps S to beta S + beta log(beta) N,
            # so N and S are kept without a logarithm per face; adding one instance to face k gives
            # H_k = log(N + 1) - (S - n_k log n_k + (n_k + 1) log(n_k + 1)) / (N + 1).
            base = outside * n_faces
            start = block_start(n_faces, outside)
            sums = start + n_faces
            natural = best[outside]
            for k in range(n_faces):
                count = st[start + k] * DECAY
                st[start + k] = count if count >= TINY_COUNT else 0.0
            old_total = st[sums + TOTAL]
            total = DECAY * old_total
            sum_nlogn = DECAY * st[sums + SUM_NLOGN] + DECAY * LOG_DECAY * old_total
            n_natural = st[start + natural]
            gain = _nlogn(n_natural + 1.0) - _nlogn(n_natural)
            z = natural
            h = st[ENTROPY]
            if h > 0.0 and total >= WARMUP_PER_FACE * n_faces:
                log_next = math.log(total + 1.0)
                if log_next - (sum_nlogn + gain) / (total + 1.0) < h:
                    raising = entropy_raising_face(
                        st, start, faces, base, n_faces, log_next, total, sum_nlogn
                    )
                    if raising >= 0:
                        z = raising
            st[start + natural] = n_natural + 1.0  # UNADJ records the unadjusted assignment
            st[sums + TOTAL] = total + 1.0
            st[sums + SUM_NLOGN] = sum_nlogn + gain
            st[sums + SINCE_EXACT] += 1.0
            if st[sums + SINCE_EXACT] >= EXACT_EVERY:
                _exact_sums(st, start, n_faces)
            if mode != JOINT:
                if faces[base + z] < 1.0:
                    up = base + z
            else:  # the hinge of the decision: f_y(x) - f_o(x) < 1, o the best other class
                other = -1
                other_score = -np.inf
                for p in range(n_poly):
                    if p != step_code and poly[p] > other_score:
                        other, other_score = p, poly[p]
                if faces[base + z] - other_score < 1.0:
                    up = base + z
                    down = other * n_faces + best[other]
        # The faces pushed down: joint, `down`; one polytope or separate ones, each face that
        # scores x above -1 of every polytope that has x inside (all but faces
        # [outside_faces, outside_faces + K), none when outside < 0).
        push_inside = mode != JOINT
        outside_faces = outside * n_faces
        for f in range(n_total):
            if f == up:
                amount = 1.0
            elif f == down or (
                push_inside and not outside_faces <= f < outside_faces + n_faces and faces[f] > -1.0
            ):
                amount = -1.0
            else:
                continue
            W[0, f] += amount * (rho * shrink)
            for j in range(n):
                W[cols[j], f] += amount * (vals[j] * shrink)
            updated += 1

        if step == 0:
            if steps > 1:  # store x in the ring buffer slot of this trial
                slot = int(st[TRIALS]) % int(st[WINDOW])
                for c in range(window.shape[1]):
                    window[slot, c] = 0.0
                window[slot, 0] = code
                for j in range(idx.shape[0]):
                    window[slot, idx[j]] = val[j]
            st[TRIALS] += 1.0
    return updated


# Prediction ---------------------------------------------------------------------------------------


@njit(cache=True)
def decision(W, st, idx, val, out):
    """out[p] = f_p(x) for every polytope; returns their number."""
    faces = np.empty(n_polytopes(st) * int(st[N_FACES]))
    return _scores(W, st, idx, val, faces, out)


@njit(cache=True, inline="always")
def _class_probabilities(st, poly, n_poly, out):
    """Calibrated class probabilities from the polytope scores (per class); returns their number."""
    if n_poly == 0:
        return 0
    if n_poly == 1:
        out[0] = 1.0
        return 1
    first, second = _top_two(poly, n_poly)  # the margins of `_calibrate`
    total = 0.0
    for c in range(n_poly):
        margin = poly[c] - (second if c == first else poly[first])
        out[c] = calibration.proba(calibration_of(st, c), margin)
        total += out[c]
    for c in range(n_poly):
        out[c] /= total
    return n_poly


@njit(cache=True)
def probabilities(W, st, idx, val, out):
    """Calibrated class probabilities of x into out; returns (their number, the class `predict`
    gives, from the same scores).

    One polytope: out = [P(negative), P(positive)]. Per class: out[c] = the calibrated
    P(class c | margin_c), normalised over the active classes. The class comes with them so that
    a caller that wants both (the Kafka worker's `predict_with_proba_one`) makes one call, and a
    fresh process compiles one function before its first prediction, not two.
    """
    n_poly = n_polytopes(st)
    n_total = n_poly * int(st[N_FACES])
    work = np.empty(n_total + max(n_poly, 1))
    poly = work[n_total:]
    _scores(W, st, idx, val, work[:n_total], poly)
    if st[MODE] == ONE:
        p_true = calibration.proba(calibration_of(st, 0), poly[0])
        out[0] = 1.0 - p_true
        out[1] = p_true
        return 2, 1 if calibration.decide(calibration_of(st, 0), poly[0]) else 0
    n = _class_probabilities(st, poly, n_poly, out)
    if n == 0:
        return 0, -1
    most = 0
    for c in range(1, n):
        if out[c] > out[most]:
            most = c
    return n, most


@njit(cache=True)
def predict(W, st, idx, val):
    """The index of the most probable class (the first on ties), -1 before any class.

    One polytope: 1 or 0 by `calibration.decide`, the binary models' rule. The scores of `_scores`
    are written out here, for the reason given in `learn`.
    """
    n_faces = int(st[N_FACES])
    n_poly = n_polytopes(st)
    n_total = n_poly * n_faces
    work = np.empty(n_total + 2 * max(n_poly, 1))  # face scores, polytope scores, probabilities
    faces = work[:n_total]
    poly = work[n_total : n_total + max(n_poly, 1)]
    rho = st[RHO]
    largest = abs(rho)
    for j in range(val.shape[0]):
        largest = max(largest, abs(val[j]))
    shrink = 1.0
    if largest * math.sqrt(val.shape[0] + 1.0) > MAX_NORM:
        shrink = _exact_shrink(val, val.shape[0], rho, largest)
    t = st[SGD_STEPS]
    if t == 0.0:
        for f in range(n_total):
            faces[f] = 0.0
    else:
        x0 = rho * shrink
        for f in range(n_total):
            faces[f] = W[0, f] * x0
        for j in range(idx.shape[0]):
            i = idx[j]
            if i >= 0:
                v = val[j] * shrink
                for f in range(n_total):
                    faces[f] += W[i, f] * v
        inv = 1.0 / (st[L2] * t)  # W = G / (lambda t)
        for f in range(n_total):
            faces[f] *= inv
    for p in range(n_poly):
        base = p * n_faces
        b = base
        for f in range(base + 1, base + n_faces):
            if faces[f] > faces[b]:
                b = f
        poly[p] = faces[b]
    if st[MODE] == ONE:
        return 1 if calibration.decide(calibration_of(st, 0), poly[0]) else 0
    proba = work[n_total + max(n_poly, 1) :]
    n = _class_probabilities(st, poly, n_poly, proba)
    if n == 0:
        return -1
    most = 0
    for c in range(1, n):
        if proba[c] > proba[most]:
            most = c
    return most


# Mini-batches: the same per-example functions over the rows of a frame (NaN = absent feature).


@njit(cache=True, any_layout=("X",))
def learn_rows(W, st, window, X, cols, codes):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    updated = 0
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        updated += learn(W, st, window, idx_buf[:n], val_buf[:n], codes[r])
    return updated


@njit(cache=True, any_layout=("X",))
def predict_rows(W, st, X, cols, out):
    """out[r] = `predict` of row r."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        out[r] = predict(W, st, idx_buf[:n], val_buf[:n])


@njit(cache=True, any_layout=("X",))
def decision_rows(W, st, X, cols, out):
    """out[r, p] = f_p(row r)."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        decision(W, st, idx_buf[:n], val_buf[:n], out[r])


@njit(cache=True, any_layout=("X",))
def probability_rows(W, st, X, cols, out):
    """out[r] = `probabilities` of row r."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        probabilities(W, st, idx_buf[:n], val_buf[:n], out[r])
