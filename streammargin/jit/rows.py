"""Row access shared by every model's mini-batch loops."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def row_entries(X, cols, r, idx_buf, val_buf):
    """The present (non-NaN) entries of row r of X as (columns, values) in the buffers; returns
    their count. `cols[c]` is the model column of frame column c (-1: unknown to the model)."""
    n = 0
    for c in range(X.shape[1]):
        v = X[r, c]
        if v == v:
            idx_buf[n] = cols[c]
            val_buf[n] = v
            n += 1
    return n
