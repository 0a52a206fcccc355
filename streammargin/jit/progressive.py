"""Progressive validation over a batch of rows, in one compiled call: a StandardScaler, a model,
test-then-train in order, the score-keeping and a drift detector.

The Kafka worker's per-record path (`connectors.task.records`) takes each record through the
scaler (`streammargin.scaler.StandardScaler.transform_learn_one`), the model's prediction and,
for a labelled record, the scaler's and then the model's learning, then counts the prediction
(accuracy, rolling accuracy, log loss, per-class tallies, River's drift detector on the
errors). Each `*_steps` function here does the same to a batch of rows, row after row, with the
same arithmetic in the same order (the scaler's is `streammargin.jit.scaler`'s, the models' their
own compiled steps, the score-keeping River's): the results are the per-record path's to the last
bit (`tests/test_batch_steps.py`). One function per model family: numba cannot take the model's
step as an argument and still cache the loop.

A row is a record's features in the order of its dict (an *entry* per feature) and its label:

- ``rows[r]``: (shape, first hole, label code): the row's entries are those of its shape, their
  values in ``holes[first hole + hole]`` (or a constant of the shape: a boolean's 0/1, a
  category indicator's 1.0); the label code is -1 without a label, else the class code (binary:
  0 False, 1 True);
- ``shapes[s]``: (first entry, number of entries); entry e: ``entries[e]`` = (its hole or -1,
  its scaler column (-1: passed unscaled, a category indicator or no scaler; -2: a name the
  scaler has not learnt, which it scales to 0.0), its model column (-1: a name the model has not
  learnt: no weight, its value still counts)) and ``values[e]``, the constant;
- ``order[first entry:first entry + n]``: the shape's entries in the model's canonical order
  (`streammargin.features.canonical_order`: by column, unknown names last).

The score-keeping state (`connectors.observability.metrics.PartitionMetrics`'s numbers):
``tallies`` (`TALLIES`), ``losses`` (the log loss' running mean: `LOSS_N`, `LOSS_MEAN`),
``window`` (the rolling window's 0/1 bytes), ``classes[3, C]`` (support, predicted and correct
counts added, per class code) and ``first[3, C]`` (-2: the class was in that count before; -1:
not yet; else the row that added it: the order it takes there), ``detector`` (`DETECTOR`: DDM or
none). The last argument, `half`, is 0.5: the scaler's `var ** 0.5` is the C library's `pow`,
which LLVM would turn into `sqrt` if it saw the constant (`streammargin.jit.scaler`). A function
returns (rows done, why it stopped): `DONE` (every row), `DRIFT` (the detector
fired at the last row done) or `PER_RECORD` (the next row needs the per-record path: a value or
a probability that is not finite, a count at its limit; nothing of it was done).
"""

from __future__ import annotations

import math

import numpy as np

from streammargin.jit import alma as alma_jit
from streammargin.jit import calibration
from streammargin.jit import convex_polytope as cpm_jit
from streammargin.jit import kernels as kjit
from streammargin.jit import mpu as mpu_jit
from streammargin.jit.dispatch import njit
from streammargin.jit.scaler import _MAX_COUNT, _MAX_FLOAT, _c_pow

__all__ = ["alma_steps", "linear_mpu_steps", "cpm_steps", "DONE", "DRIFT", "PER_RECORD"]

# Why a steps function stopped.
DONE, DRIFT, PER_RECORD = 0, 1, 2

# rows[r], entries[e]
ROW_SHAPE, ROW_HOLES, ROW_LABEL = 0, 1, 2
ENTRY_HOLE, ENTRY_SCALER, ENTRY_MODEL = 0, 1, 2
UNSCALED, UNSEEN = -1, -2  # entries[e, ENTRY_SCALER] of a value passed as is, or scaled to 0.0
# tallies[...]
N_LABELLED, N_CORRECT, WINDOW_POS, WINDOW_CORRECT, ROLLING, N_UNSCORED, OVERFLOWS = range(7)
TALLIES = 7
# losses[...]
LOSS_N, LOSS_MEAN = 0, 1
# classes[...], first[...]
SUPPORT, PREDICTED, CORRECT = 0, 1, 2
WAS_THERE, NOT_YET = -2, -1
# detector[...]: River's DDM (binary.DDM: its stats.Mean, p_min, s_min, ps_min, flags, params)
(KIND, DDM_N, DDM_MEAN, DDM_P_MIN, DDM_S_MIN, DDM_PS_MIN, DDM_HAS_MIN, DDM_WARNING, DDM_DRIFT,
 DDM_WARM_START, DDM_WARNING_THRESHOLD, DDM_DRIFT_THRESHOLD) = range(12)
DETECTOR = 12
NO_DRIFT, DDM = 0.0, 1.0  # detector[KIND]

_LOW, _HIGH = 1e-15, 1.0 - 1e-15  # River's clamp of a probability in its log loss


# The scaler ---------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _sd(variances, column, var, roots, half):
    """var ** 0.5 (the C library's pow, see `streammargin.jit.scaler`) of a column's variance,
    from `roots` (column -> (var, its root)) when it was computed for that variance: a learnt
    row's root after its update is the next row's before it."""
    if roots[column, 0] != var:
        roots[column, 0] = var
        roots[column, 1] = _c_pow(var, half)
    return roots[column, 1]


@njit(cache=True, inline="always")
def _row_values(rows, r, shapes, entries, values, holes, counts, means, variances, learn,
                before, after, learns, new_means, new_vars, roots, half):
    """The row's entries (in dict order) scaled with the statistics before it (`before`) and,
    when it is learnt, after it (`after`, with each feature's update in `learns`, `new_means`,
    `new_vars`: `streammargin.jit.scaler.scale_record`'s arithmetic, `half` its 0.5 that LLVM
    must not see); returns its number of entries, or -1 when a count is at its limit (the
    per-record path takes the row)."""
    shape = rows[r, ROW_SHAPE]
    first = shapes[shape, 0]
    n = shapes[shape, 1]
    base = rows[r, ROW_HOLES]
    for j in range(n):
        e = first + j
        hole = entries[e, ENTRY_HOLE]
        x = holes[base + hole] if hole >= 0 else values[e]
        column = entries[e, ENTRY_SCALER]
        if column < 0:
            scaled = 0.0 if column == UNSEEN else x
            before[j] = scaled
            after[j] = scaled
            learns[j] = 0.0
            continue
        count = counts[column]
        old_mean = means[column]
        old_var = variances[column]
        before[j] = (x - old_mean) / _sd(variances, column, old_var, roots, half) \
            if old_var != 0.0 else 0.0
        if not learn:
            continue
        if count == _MAX_COUNT:
            return -1
        count += 1
        mean = old_mean + (x - old_mean) / count
        var = old_var + ((x - old_mean) * (x - mean) - old_var) / count
        if -_MAX_FLOAT <= mean <= _MAX_FLOAT and 0.0 <= var <= _MAX_FLOAT:
            learns[j] = 1.0
            new_means[j] = mean
            new_vars[j] = var
            after[j] = (x - mean) / _sd(variances, column, var, roots, half) if var != 0.0 \
                else 0.0
        else:  # an overflow (or NaN) would poison this feature for ever
            learns[j] = 0.0
            after[j] = before[j]
    return n


@njit(cache=True, inline="always")
def _learn_scaler(rows, r, shapes, entries, counts, means, variances, learns, new_means,
                  new_vars, tallies):
    """Write a learnt row's updates into the scaler's statistics (`apply_update`)."""
    shape = rows[r, ROW_SHAPE]
    first = shapes[shape, 0]
    for j in range(shapes[shape, 1]):
        column = entries[first + j, ENTRY_SCALER]
        if column < 0:
            continue
        if learns[j] != 0.0:
            counts[column] += 1
            means[column] = new_means[j]
            variances[column] = new_vars[j]
        else:
            tallies[OVERFLOWS] += 1


@njit(cache=True, inline="always")
def _canonical(rows, r, shapes, entries, order, scaled, idx, val):
    """The model's instance: the entries' model columns and `scaled` values in canonical order;
    False when a value is not finite (the model refuses it: the per-record path words it)."""
    shape = rows[r, ROW_SHAPE]
    first = shapes[shape, 0]
    finite = 0.0
    for k in range(shapes[shape, 1]):
        j = order[first + k]
        idx[k] = entries[first + j, ENTRY_MODEL]
        val[k] = scaled[j]
        finite += scaled[j] * 0.0  # NaN for a NaN or an infinity, else 0
    return finite == 0.0


# The score-keeping ------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _count(classes, first, which, code, r):
    classes[which, code] += 1
    if first[which, code] == NOT_YET:
        first[which, code] = r


@njit(cache=True, inline="always")
def _ddm(detector, error):
    """River's binary.DDM.update(error); True on a drift."""
    if detector[DDM_DRIFT] != 0.0:  # `_reset`, at the update after a detection
        detector[DDM_N] = 0.0
        detector[DDM_MEAN] = 0.0
        detector[DDM_HAS_MIN] = 0.0
        detector[DDM_P_MIN] = 0.0
        detector[DDM_S_MIN] = 0.0
        detector[DDM_PS_MIN] = np.inf
        detector[DDM_WARNING] = 0.0
        detector[DDM_DRIFT] = 0.0
    n = detector[DDM_N] + 1.0  # stats.Mean.update, w = 1.0
    detector[DDM_N] = n
    detector[DDM_MEAN] += (1.0 / n) * (error - detector[DDM_MEAN])
    p = detector[DDM_MEAN]
    s = math.sqrt(p * (1 - p) / n)
    if n > detector[DDM_WARM_START]:
        if p + s <= detector[DDM_PS_MIN]:
            detector[DDM_P_MIN] = p
            detector[DDM_S_MIN] = s
            detector[DDM_PS_MIN] = p + s
            detector[DDM_HAS_MIN] = 1.0
        p_min, s_min = detector[DDM_P_MIN], detector[DDM_S_MIN]
        detector[DDM_WARNING] = 1.0 if p + s > p_min + detector[DDM_WARNING_THRESHOLD] * s_min \
            else 0.0
        if p + s > p_min + detector[DDM_DRIFT_THRESHOLD] * s_min:
            detector[DDM_DRIFT] = 1.0
            detector[DDM_WARNING] = 0.0
    return detector[DDM_DRIFT] != 0.0


@njit(cache=True, inline="always")
def _scored(tallies, losses, window, classes, first, detector, label, predicted, loss, r):
    """`PartitionMetrics._count`, `_loss` and `_scored` for a labelled prediction of a known
    class (every class is tracked: the caller checks there is room); True on a drift."""
    correct = 1 if label == predicted else 0
    _count(classes, first, SUPPORT, label, r)
    _count(classes, first, PREDICTED, predicted, r)
    if correct:
        _count(classes, first, CORRECT, label, r)
    losses[LOSS_N] += 1.0
    losses[LOSS_MEAN] += (1.0 / losses[LOSS_N]) * (loss - losses[LOSS_MEAN])
    tallies[N_LABELLED] += 1
    tallies[N_CORRECT] += correct
    pos = tallies[WINDOW_POS]
    tallies[WINDOW_CORRECT] += correct - window[pos]
    window[pos] = correct
    tallies[WINDOW_POS] = pos + 1 if pos + 1 < tallies[ROLLING] else 0
    if detector[KIND] == DDM:
        return _ddm(detector, 0.0 if correct else 1.0)
    return False


@njit(cache=True, inline="always")
def _binary_loss(label, p_true):
    """River's LogLoss of a binary prediction (PartitionMetrics.update)."""
    p = max(min(p_true, _HIGH), _LOW)
    return -math.log(p) if label == 1 else -math.log(1.0 - p)


# The models ---------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _buffers(shapes):
    """Scratch of the widest row: its values before and after the scaler's update, the update,
    the model's instance (values as predicted, values as learnt, ALMA's normalised copy) and its
    columns."""
    width = max(shapes[:, 1].max(), 1) if shapes.shape[0] else 1
    work = np.empty((8, width))
    return (work[0], work[1], work[2], work[3], work[4], work[5], work[6], work[7],
            np.empty(width, np.int64))


@njit(cache=True, inline="always")
def _roots(variances):
    """`_sd`'s table: no root computed yet (NaN is no variance)."""
    return np.full((variances.shape[0], 2), np.nan)


@njit(cache=True)
def alma_steps(vectors, st, counts, means, variances, rows, shapes, entries, values, order,
               holes, tallies, losses, window, classes, first, detector, out, half):
    """Test-then-train of ALMA (`streammargin.alma.ALMAClassifier`: its `learn_then_predict`
    step) over the rows; out[r] = +P(True) if the predicted label is True, else -P(True)."""
    before, after, learns, new_means, new_vars, val, after_val, xh, idx = _buffers(shapes)
    roots = _roots(variances)
    for r in range(rows.shape[0]):
        label = rows[r, ROW_LABEL]
        n = _row_values(rows, r, shapes, entries, values, holes, counts, means, variances,
                        label >= 0, before, after, learns, new_means, new_vars, roots, half)
        if n < 0 or not _canonical(rows, r, shapes, entries, order, before, idx, val):
            return r, PER_RECORD
        if label >= 0 and not _canonical(rows, r, shapes, entries, order, after, idx,
                                         after_val):
            return r, PER_RECORD
        margin = alma_jit._served_margin(vectors, st, idx[:n], val[:n], xh[:n])
        signed = calibration.signed_proba(st[alma_jit.PLATT :], margin)
        if not 0.0 <= abs(signed) <= 1.0:
            return r, PER_RECORD
        out[r] = signed
        if label < 0:
            continue
        _learn_scaler(rows, r, shapes, entries, counts, means, variances, learns, new_means,
                      new_vars, tallies)
        alma_jit._learn(vectors, st, idx[:n], after_val[:n], 1.0 if label == 1 else -1.0,
                        xh[:n])
        if _scored(tallies, losses, window, classes, first, detector, label,
                   1 if signed > 0.0 else 0, _binary_loss(label, abs(signed)), r):
            return r + 1, DRIFT
    return rows.shape[0], DONE


@njit(cache=True)
def linear_mpu_steps(S, slots, st, weights, counts, means, variances, rows, shapes, entries,
                     values, order, holes, tallies, losses, window, classes, first, detector,
                     out, half):
    """Test-then-train of the linear MPU (`streammargin.mpu.LinearMPUClassifier`: the score,
    the calibrated label and probability from it, then `learn_primal`) over the rows; out[r]
    as `alma_steps`'."""
    before, after, learns, new_means, new_vars, val, after_val, _, idx = _buffers(shapes)
    roots = _roots(variances)
    cal = st[kjit.ST_PLATT : kjit.ST_MODEL]
    for r in range(rows.shape[0]):
        label = rows[r, ROW_LABEL]
        n = _row_values(rows, r, shapes, entries, values, holes, counts, means, variances,
                        label >= 0, before, after, learns, new_means, new_vars, roots, half)
        if n < 0 or not _canonical(rows, r, shapes, entries, order, before, idx, val):
            return r, PER_RECORD
        if label >= 0 and not _canonical(rows, r, shapes, entries, order, after, idx,
                                         after_val):
            return r, PER_RECORD
        score = mpu_jit.primal_score(weights, st, idx[:n], val[:n])
        positive = calibration.decide(cal, score)
        p_true = calibration.proba(cal, score)
        if not 0.0 <= p_true <= 1.0:
            return r, PER_RECORD
        out[r] = p_true if positive else -p_true
        if label < 0:
            continue
        _learn_scaler(rows, r, shapes, entries, counts, means, variances, learns, new_means,
                      new_vars, tallies)
        mpu_jit.learn_primal(S, slots, st, weights, idx[:n], after_val[:n],
                             1.0 if label == 1 else -1.0)
        if _scored(tallies, losses, window, classes, first, detector, label,
                   1 if positive else 0, _binary_loss(label, p_true), r):
            return r + 1, DRIFT
    return rows.shape[0], DONE


@njit(cache=True)
def cpm_steps(W, st, cpm_window, counts, means, variances, rows, shapes, entries, values, order,
              holes, tallies, losses, window, classes, first, detector, codes, proba, half):
    """Test-then-train of the Convex Polytope Machine (`streammargin.convex_polytope`: its
    `probabilities`, then `learn`) over the rows, whose labels are classes it knows: codes[r] is
    the predicted class (-1 before any), proba[r, :n] the class probabilities (one polytope: P
    of False, of True)."""
    before, after, learns, new_means, new_vars, val, after_val, _, idx = _buffers(shapes)
    roots = _roots(variances)
    one = st[cpm_jit.MODE] == cpm_jit.ONE
    for r in range(rows.shape[0]):
        label = rows[r, ROW_LABEL]
        n = _row_values(rows, r, shapes, entries, values, holes, counts, means, variances,
                        label >= 0, before, after, learns, new_means, new_vars, roots, half)
        if n < 0 or not _canonical(rows, r, shapes, entries, order, before, idx, val):
            return r, PER_RECORD
        if label >= 0 and not _canonical(rows, r, shapes, entries, order, after, idx,
                                         after_val):
            return r, PER_RECORD
        classes_n, code = cpm_jit.probabilities(W, st, idx[:n], val[:n], proba[r])
        for c in range(classes_n):
            if not 0.0 <= proba[r, c] <= 1.0:
                return r, PER_RECORD
        codes[r] = code
        if label < 0:
            continue
        _learn_scaler(rows, r, shapes, entries, counts, means, variances, learns, new_means,
                      new_vars, tallies)
        cpm_jit.learn(W, st, cpm_window, idx[:n], after_val[:n], label)
        if one:
            loss = _binary_loss(label, proba[r, 1])
        else:  # River's CrossEntropy of the label's probability
            loss = -math.log(max(min(proba[r, label], _HIGH), _LOW))
        if _scored(tallies, losses, window, classes, first, detector, label, code, loss, r):
            return r + 1, DRIFT
    return rows.shape[0], DONE
