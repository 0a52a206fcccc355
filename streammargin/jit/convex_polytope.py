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

Arrays shared with `streammargin.convex_polytope.ConvexPolytopeClassifier` (few of them: numba's
dispatch costs about 0.3 us per array argument here, more than a whole SGD step):
- W: float64[columns, n_polytopes * K] holding G; row 0 is the intercept's constant feature
  (value RHO, 0 without intercept), row i the feature column i; column p * K + k is face k of
  polytope p.
- st: float64[CLASSES + n_classes * block_size(K)]: the scalars and hyper-parameters at the offsets
  below, then one block per class c: the decayed face counts of polytope c (K), their total,
  their sum of n log n (kept incrementally, recomputed exactly every EXACT_EVERY positives), the
  number of positives since, and the online Platt state of class c. With one polytope there is
  one block: its counts and the calibration of P(positive).
- window: float64[window, columns]; row r is a stored example: column 0 its class code, column i
  the value of feature column i (0 when absent). Empty (0 rows) when STEPS = 1.

Instances are (idx, val) with idx < 0 for features the model never learnt (no weight).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from streammargin.jit import calibration
from streammargin.jit import rng
from streammargin.jit.rows import largest_abs, row_entries

# learnt scalars
TRIALS, SGD_STEPS, N_ACTIVE, DRAWS = range(4)
# hyper-parameters, written from the model's params
N_FACES, L2, ENTROPY, RHO, MODE, STEPS, WINDOW, SEED = range(4, 12)
CLASSES = 12  # first class block
# Offsets in a class block, after its K face counts.
TOTAL, SUM_NLOGN, SINCE_EXACT, PLATT = range(4)

ONE, SEPARATE, JOINT = 0, 1, 2
MODES = {"one": ONE, "separate": SEPARATE, "joint": JOINT}

DECAY = 0.999  # face counts of ASSIGN forget with this factor per positive instance
LOG_DECAY = math.log(DECAY)
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
    return n_faces + PLATT + calibration.SIZE


def new_block(n_faces: int) -> np.ndarray:
    """The state block of a new class: no counts, a fresh calibration."""
    block = np.zeros(block_size(n_faces))
    block[n_faces + PLATT :] = calibration.new_state()
    return block


@njit(cache=True)
def block_of(st, c):
    return CLASSES + c * (int(st[N_FACES]) + PLATT + calibration.SIZE)


@njit(cache=True)
def calibration_of(st, c):
    """The calibration state of class c (a view into st)."""
    start = block_of(st, c) + int(st[N_FACES]) + PLATT
    return st[start : start + calibration.SIZE]


@njit(cache=True)
def shrink_factor(val, rho):
    """1, or the factor that brings ||(rho, x)|| down to MAX_NORM (computed without overflow)."""
    largest = largest_abs(val, rho)
    if largest * math.sqrt(val.shape[0] + 1.0) <= MAX_NORM:
        return 1.0
    total = (rho / largest) ** 2
    for j in range(val.shape[0]):
        total += (val[j] / largest) ** 2
    norm = largest * math.sqrt(total)
    if norm <= MAX_NORM:
        return 1.0
    return MAX_NORM / norm


@njit(cache=True)
def n_polytopes(st):
    if st[MODE] != ONE:
        return int(st[N_ACTIVE])
    return 1


@njit(cache=True)
def face_scores(W, st, idx, val, shrink, n_faces_total, out):
    """out[f] = W_f . x for the first n_faces_total faces (x shrunk, intercept included)."""
    t = st[SGD_STEPS]
    if t == 0.0:
        for f in range(n_faces_total):
            out[f] = 0.0
        return
    x0 = st[RHO] * shrink
    for f in range(n_faces_total):
        out[f] = W[0, f] * x0
    for j in range(idx.shape[0]):
        i = idx[j]
        if i >= 0:
            v = val[j] * shrink
            for f in range(n_faces_total):
                out[f] += W[i, f] * v
    inv = 1.0 / (st[L2] * t)  # W = G / (lambda t)
    for f in range(n_faces_total):
        out[f] *= inv


@njit(cache=True)
def best_face(faces, base, n_faces):
    """The first face of largest score among faces[base : base + n_faces]."""
    best = 0
    for k in range(1, n_faces):
        if faces[base + k] > faces[base + best]:
            best = k
    return best


@njit(cache=True)
def polytope_scores(faces, n_poly, n_faces, out):
    """out[p] = max_k W_{p,k} . x from the face scores."""
    for p in range(n_poly):
        out[p] = faces[p * n_faces + best_face(faces, p * n_faces, n_faces)]


@njit(cache=True)
def class_margins(poly, n_poly, out):
    """out[c] = f_c(x) - max_{c' != c} f_c'(x): the margin calibrated for class c.

    With a single polytope it is f(x) itself."""
    if n_poly == 1:
        out[0] = poly[0]
        return
    first = 0
    for p in range(1, n_poly):
        if poly[p] > poly[first]:
            first = p
    second = -np.inf
    for p in range(n_poly):
        if p != first and poly[p] > second:
            second = poly[p]
    for p in range(n_poly):
        out[p] = poly[p] - (second if p == first else poly[first])


@njit(cache=True)
def _nlogn(n):
    return n * math.log(n) if n > 0.0 else 0.0


@njit(cache=True)
def _ranks_after(faces, base, a, b):
    """Whether face b comes before face a in the order (score descending, index ascending)."""
    return faces[base + b] > faces[base + a] or (faces[base + b] == faces[base + a] and b < a)


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
def assign(st, p, faces, base):
    """ASSIGN(W, x, h) for polytope p (Algorithm 2 with decayed counts). Returns the face.

    The entropy of the counts n is H = log N - S / N with N = sum n_k and S = sum n_k log n_k.
    Decaying every count by beta maps S to beta S + beta log(beta) N, so N and S are kept without
    a logarithm per face; adding one instance to face k gives
    H_k = log(N + 1) - (S - n_k log n_k + (n_k + 1) log(n_k + 1)) / (N + 1).
    """
    n_faces = int(st[N_FACES])
    start = block_of(st, p)
    sums = start + n_faces
    natural = best_face(faces, base, n_faces)
    for k in range(n_faces):
        st[start + k] *= DECAY
    old_total = st[sums + TOTAL]
    total = DECAY * old_total
    sum_nlogn = DECAY * st[sums + SUM_NLOGN] + DECAY * LOG_DECAY * old_total
    chosen = natural
    h = st[ENTROPY]
    n_natural = st[start + natural]
    gain = _nlogn(n_natural + 1.0) - _nlogn(n_natural)
    if h > 0.0 and total >= WARMUP_PER_FACE * n_faces:
        log_next = math.log(total + 1.0)
        if log_next - (sum_nlogn + gain) / (total + 1.0) < h:
            # The best-scoring face whose count would raise the entropy: try the faces in
            # decreasing score (first index on ties) and stop at the first that raises it, so the
            # logarithms are only taken for the few faces tried.
            current = math.log(total) - sum_nlogn / total
            previous = -1
            for _ in range(n_faces):
                k = -1
                for j in range(n_faces):
                    if previous >= 0 and not _ranks_after(faces, base, j, previous):
                        continue
                    if k < 0 or _ranks_after(faces, base, k, j):
                        k = j
                n_k = st[start + k]
                raised = log_next - (sum_nlogn - _nlogn(n_k) + _nlogn(n_k + 1.0)) / (total + 1.0)
                if raised > current:
                    chosen = k
                    break
                previous = k
    st[start + natural] = n_natural + 1.0  # UNADJ records the unadjusted assignment
    st[sums + TOTAL] = total + 1.0
    st[sums + SUM_NLOGN] = sum_nlogn + gain
    st[sums + SINCE_EXACT] += 1.0
    if st[sums + SINCE_EXACT] >= EXACT_EVERY:
        _exact_sums(st, start, n_faces)
    return chosen


@njit(cache=True)
def _add_instance(W, f, idx, val, shrink, rho, amount):
    """G_f += amount * x (the intercept's constant feature included)."""
    W[0, f] += amount * (rho * shrink)
    for j in range(idx.shape[0]):
        W[idx[j], f] += amount * (val[j] * shrink)


@njit(cache=True)
def _calibrate(st, faces, n_poly, code, poly, margins):
    """Feed every class' calibrator with the margin served for this example (test-then-train)."""
    polytope_scores(faces, n_poly, int(st[N_FACES]), poly)
    class_margins(poly, n_poly, margins)
    if st[MODE] == ONE:
        calibration.learn(calibration_of(st, 0), margins[0], 1.0 if code == 1 else -1.0)
        return
    for c in range(n_poly):
        calibration.learn(calibration_of(st, c), margins[c], 1.0 if c == code else -1.0)


@njit(cache=True)
def sgd_step(W, st, idx, val, code, faces):
    """One SGD step of the CPM on (x, class code), `faces` holding its face scores under the
    current W. Returns the number of faces updated. Columns in idx must be >= 0."""
    n_faces = int(st[N_FACES])
    mode = st[MODE]
    n_poly = n_polytopes(st)
    rho = st[RHO]
    shrink = shrink_factor(val, rho)
    # Pegasos: W_{t+1} = (1 - 1/t) W_t + (1/(lambda t)) g_t is G_{t+1} = G_t + g_t with
    # W = G / (lambda t), so the step on G has size 1 whatever t and lambda.
    st[SGD_STEPS] += 1.0
    updated = 0
    if mode == JOINT:
        if n_poly < 2:
            return 0
        other = -1
        other_score = -np.inf
        for p in range(n_poly):
            if p != code:
                s = faces[p * n_faces + best_face(faces, p * n_faces, n_faces)]
                if s > other_score:
                    other, other_score = p, s
        z = assign(st, code, faces, code * n_faces)
        if faces[code * n_faces + z] - other_score < 1.0:
            _add_instance(W, code * n_faces + z, idx, val, shrink, rho, 1.0)
            z_other = best_face(faces, other * n_faces, n_faces)
            _add_instance(W, other * n_faces + z_other, idx, val, shrink, rho, -1.0)
            updated = 2
        return updated
    for p in range(n_poly):
        positive = (code == 1) if mode == ONE else (p == code)
        base = p * n_faces
        if positive:
            z = assign(st, p, faces, base)
            if faces[base + z] < 1.0:
                _add_instance(W, base + z, idx, val, shrink, rho, 1.0)
                updated += 1
        else:
            for k in range(n_faces):
                if faces[base + k] > -1.0:
                    _add_instance(W, base + k, idx, val, shrink, rho, -1.0)
                    updated += 1
    return updated


@njit(cache=True)
def _store(window, st, idx, val, code):
    """Write the example into the ring buffer slot of this trial."""
    slot = int(st[TRIALS] % st[WINDOW])
    row = window[slot]
    for c in range(row.shape[0]):
        row[c] = 0.0
    row[0] = code
    for j in range(idx.shape[0]):
        row[idx[j]] = val[j]


@njit(cache=True)
def _replay(W, st, window, idx_buf, val_buf, faces):
    """One SGD step on an example drawn uniformly from the window."""
    filled = min(st[TRIALS], st[WINDOW])
    slot = rng.index(st[SEED], st[DRAWS], int(filled))
    st[DRAWS] += 1.0
    row = window[slot]
    n = 0
    for c in range(1, row.shape[0]):
        if row[c] != 0.0:
            idx_buf[n] = c
            val_buf[n] = row[c]
            n += 1
    idx, val = idx_buf[:n], val_buf[:n]
    code = int(row[0])
    n_total = n_polytopes(st) * int(st[N_FACES])
    face_scores(W, st, idx, val, shrink_factor(val, st[RHO]), n_total, faces)
    return sgd_step(W, st, idx, val, code, faces)


@njit(cache=True)
def learn(W, st, window, idx, val, code):
    """Learn from one example (x, class code): calibrate the served score, one SGD step on the
    example, then STEPS - 1 steps on examples of the window. Returns the faces updated.

    One polytope: code 1 is the positive (outside) class, code 0 the negative. Per class: code is
    the class index; a code equal to the number of active classes activates a new class (its
    weight columns and state block must exist, zero counts). Every column in idx must be >= 0 and
    < W.shape[0] (and < window.shape[1] when STEPS > 1).
    """
    n_faces = int(st[N_FACES])
    if st[MODE] != ONE and code >= st[N_ACTIVE]:
        st[N_ACTIVE] = code + 1.0
    n_poly = n_polytopes(st)
    n_total = n_poly * n_faces
    work = np.empty(n_total + 2 * n_poly)
    faces = work[:n_total]
    face_scores(W, st, idx, val, shrink_factor(val, st[RHO]), n_total, faces)
    _calibrate(st, faces, n_poly, code, work[n_total : n_total + n_poly], work[n_total + n_poly :])
    updated = sgd_step(W, st, idx, val, code, faces)
    steps = int(st[STEPS])
    if steps > 1:
        _store(window, st, idx, val, code)
        st[TRIALS] += 1.0
        idx_buf = np.empty(window.shape[1], dtype=np.int64)
        val_buf = np.empty(window.shape[1])
        for _ in range(steps - 1):
            updated += _replay(W, st, window, idx_buf, val_buf, faces)
    else:
        st[TRIALS] += 1.0
    return updated


@njit(cache=True)
def _decision(W, st, idx, val, faces, out):
    n_faces = int(st[N_FACES])
    n_poly = n_polytopes(st)
    face_scores(W, st, idx, val, shrink_factor(val, st[RHO]), n_poly * n_faces, faces)
    polytope_scores(faces, n_poly, n_faces, out)
    return n_poly


@njit(cache=True)
def decision(W, st, idx, val, out):
    """out[p] = f_p(x) for every polytope; returns their number."""
    faces = np.empty(n_polytopes(st) * int(st[N_FACES]))
    return _decision(W, st, idx, val, faces, out)


@njit(cache=True)
def _probabilities(W, st, idx, val, work, out):
    """`probabilities` with scratch space work (n_polytopes * (K + 2) + 1 floats)."""
    n_poly = n_polytopes(st)
    n_total = n_poly * int(st[N_FACES])
    poly = work[n_total : n_total + max(n_poly, 1)]
    _decision(W, st, idx, val, work[:n_total], poly)
    if st[MODE] == ONE:
        p_true = calibration.proba(calibration_of(st, 0), poly[0])
        out[0] = 1.0 - p_true
        out[1] = p_true
        return 2
    if n_poly == 0:
        return 0
    if n_poly == 1:
        out[0] = 1.0
        return 1
    margins = work[n_total + n_poly : n_total + 2 * n_poly]
    class_margins(poly, n_poly, margins)
    total = 0.0
    for c in range(n_poly):
        out[c] = calibration.proba(calibration_of(st, c), margins[c])
        total += out[c]
    for c in range(n_poly):
        out[c] /= total
    return n_poly


@njit(cache=True)
def probabilities(W, st, idx, val, out):
    """Calibrated class probabilities of x into out; returns their number.

    One polytope: out = [P(negative), P(positive)]. Per class: out[c] = the calibrated
    P(class c | margin_c), normalised over the active classes.
    """
    work = np.empty(n_polytopes(st) * (int(st[N_FACES]) + 2) + 1)
    return _probabilities(W, st, idx, val, work, out)


@njit(cache=True)
def predict(W, st, idx, val):
    """The index of the most probable class (the first on ties), -1 before any class.

    One polytope: 1 or 0 by `calibration.decide`, the binary models' rule."""
    if st[MODE] == ONE:
        poly = np.empty(1)
        _decision(W, st, idx, val, np.empty(int(st[N_FACES])), poly)
        return 1 if calibration.decide(calibration_of(st, 0), poly[0]) else 0
    n_poly = n_polytopes(st)
    n_work = n_poly * (int(st[N_FACES]) + 2) + 1
    work = np.empty(n_work + max(n_poly, 2))
    out = work[n_work:]
    n = _probabilities(W, st, idx, val, work[:n_work], out)
    if n == 0:
        return -1
    best = 0
    for c in range(1, n):
        if out[c] > out[best]:
            best = c
    return best


# Mini-batches: the same per-example functions over the rows of a frame (NaN = absent feature).


@njit(cache=True)
def learn_rows(W, st, window, X, cols, codes):
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    updated = 0
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        updated += learn(W, st, window, idx_buf[:n], val_buf[:n], codes[r])
    return updated


@njit(cache=True)
def decision_rows(W, st, X, cols, out):
    """out[r, p] = f_p(row r)."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        decision(W, st, idx_buf[:n], val_buf[:n], out[r])


@njit(cache=True)
def probability_rows(W, st, X, cols, out):
    """out[r] = `probabilities` of row r."""
    idx_buf = np.empty(X.shape[1], dtype=np.int64)
    val_buf = np.empty(X.shape[1], dtype=np.float64)
    for r in range(X.shape[0]):
        n = row_entries(X, cols, r, idx_buf, val_buf)
        probabilities(W, st, idx_buf[:n], val_buf[:n], out[r])
