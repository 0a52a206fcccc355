"""Straight transcriptions of the papers' rules, dense and slow, for the tests to compare against.

Nothing here is shared with the package: each function is written from ALGORITHMS.md and the
paper, with no representation tricks, so that an agreement to 1e-9 means something.
"""

from __future__ import annotations

import math

import numpy as np


def link(w: np.ndarray, q: float) -> np.ndarray:
    """f_i(w) = sign(w_i) |w_i|^(q-1) / ||w||_q^(q-2)  (the identity for q = 2)."""
    norm = np.sum(np.abs(w) ** q) ** (1 / q)
    if norm == 0:
        return np.zeros_like(w)
    return np.sign(w) * np.abs(w) ** (q - 1) / norm ** (q - 2)


def alma_reference(stream, p, alpha, B, C, n_features):
    """ALMA_p(alpha; B, C) of Gentile (2001), Figure 1, on dense vectors.

    Returns the weight vector after the stream and the number of corrections.
    """
    q = p / (p - 1)
    w = np.zeros(n_features)
    k = 1
    for x, y in stream:
        if not np.any(x):
            continue  # footnote 4: no update on a zero instance
        xh = x / np.sum(np.abs(x) ** p) ** (1 / p)
        gamma = B * math.sqrt(p - 1) / math.sqrt(k)
        if y * (w @ xh) <= (1 - alpha) * gamma:
            eta = C / (math.sqrt(p - 1) * math.sqrt(k))
            w_prime = link(link(w, q) + eta * y * xh, p)  # f^-1 is f with q replaced by p
            w = w_prime / max(1.0, np.sum(np.abs(w_prime) ** q) ** (1 / q))
            k += 1
    return w, k - 1
