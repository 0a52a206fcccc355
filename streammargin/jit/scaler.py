"""The StandardScaler's per-record arithmetic (`streammargin.scaler`), for records whose names
all have columns.

River's StandardScaler scales a labelled record twice per step of a pipeline (before learning it,
for the prediction, and after, for learning), in Python, per feature; at 10 features that costs
twice the model's own step. `scale_record` does both and the Welford update in one call, with
River's arithmetic operation for operation, so the results are the same to the last bit:

- the update: count += 1; mean += (x - old_mean) / count;
  var += ((x - old_mean) * (x - mean) - var) / count (numba without fastmath: no reassociation,
  no fused multiply-add);
- the scaling: (x - mean) / var ** 0.5, or 0.0 for a variance of 0. `var ** 0.5` must be the C
  library's `pow`, as CPython's `float.__pow__` calls it: `sqrt` is correctly rounded where
  glibc's `pow` is not, and they differ in the last bit for ~0.1% of doubles. LLVM rewrites
  pow(v, 0.5) into sqrt(v) wherever it sees the constant exponent (numba's `v ** 0.5`, and a call
  of `pow` itself once it knows v >= 0), so the exponent comes in as an argument, `half`, that
  LLVM cannot see through.

Nothing is written to the statistics here: `apply_update` does it once the caller decides to
learn (the worker learns a record only once its prediction succeeded).
"""

from __future__ import annotations

import sys

import numpy as np

from streammargin.jit.dispatch import ExternalFunction, njit

__all__ = ["apply_update", "scale_record", "BEFORE", "AFTER", "LEARNS", "MEAN", "VAR", "ROWS"]

# Rows of the work array `scale_record` fills (float64, ROWS x n):
BEFORE = 0  # the value scaled with the statistics before the record
AFTER = 1  # the value scaled with the statistics after it
LEARNS = 2  # 1.0 when the feature's statistics take the update, 0.0 when it would overflow
MEAN = 3  # the feature's mean after the update
VAR = 4  # its variance after the update
ROWS = 5

_MAX_FLOAT = sys.float_info.max
_MAX_COUNT = np.iinfo(np.int64).max

# The C library's pow, the function CPython's float ** float calls.
_c_pow = ExternalFunction("pow", 2)


@njit(cache=True)
def scale_record(counts, means, variances, columns, packed, work, half):
    """Fill `work` (ROWS x n) for the record whose values are the n float64 of `packed`, the
    feature of value j having the statistics of column `columns[j]`; returns how many features
    would overflow (their statistics stay as they are), or -1, writing nothing meaningful, when
    a value is not finite or a count is at its int64 maximum (the caller takes its Python path,
    which refuses or handles them). `half` is 0.5 (see the module's doc)."""
    values = np.frombuffer(packed, dtype=np.float64)
    overflow = 0
    for j in range(columns.shape[0]):
        x = values[j]
        if not x - x == 0.0:
            return -1
        column = columns[j]
        count = counts[column]
        if count == _MAX_COUNT:
            return -1
        old_mean = means[column]
        old_var = variances[column]
        before = (x - old_mean) / _c_pow(old_var, half) if old_var != 0.0 else 0.0
        work[BEFORE, j] = before
        count += 1
        mean = old_mean + (x - old_mean) / count
        var = old_var + ((x - old_mean) * (x - mean) - old_var) / count
        if -_MAX_FLOAT <= mean <= _MAX_FLOAT and 0.0 <= var <= _MAX_FLOAT:
            work[LEARNS, j] = 1.0
            work[MEAN, j] = mean
            work[VAR, j] = var
            work[AFTER, j] = (x - mean) / _c_pow(var, half) if var != 0.0 else 0.0
        else:  # an overflow (or NaN) would poison this feature for ever
            overflow += 1
            work[LEARNS, j] = 0.0
            work[AFTER, j] = before
    return overflow


@njit(cache=True)
def apply_update(counts, means, variances, columns, work):
    """Write the update `scale_record` put in `work` into the statistics."""
    for j in range(columns.shape[0]):
        if work[LEARNS, j] != 0.0:
            column = columns[j]
            counts[column] += 1
            means[column] = work[MEAN, j]
            variances[column] = work[VAR, j]
