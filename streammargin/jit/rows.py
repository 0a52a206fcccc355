"""Instance access shared by the models: rows of a frame, the largest entry of an instance."""

from __future__ import annotations

import math

from streammargin.jit.dispatch import njit


@njit(cache=True)
def row_entries(X, cols, r, idx_buf, val_buf):
    """The present (non-NaN) entries of row r of X as (columns, values) in the buffers; returns
    their count, or -1 - c if the entry of frame column c is infinite (a frame checked beforehand
    never has one). `cols[c]` is the model column of frame column c (-1: unknown to the model)."""
    n = 0
    infinite = 0.0  # stays 0 unless a value is infinite (inf - inf is NaN); no branch per entry
    for c in range(X.shape[1]):
        v = X[r, c]
        if v == v:
            infinite += v - v
            idx_buf[n] = cols[c]
            val_buf[n] = v
            n += 1
    if infinite != 0.0:
        for c in range(X.shape[1]):
            if math.isinf(X[r, c]):
                return -1 - c
    return n


@njit(cache=True)
def largest_abs(val, rho):
    """max(|rho|, |val_j|): the scale that keeps a norm of (rho, x) from overflowing."""
    largest = abs(rho)
    for j in range(val.shape[0]):
        a = abs(val[j])
        if a > largest:
            largest = a
    return largest
