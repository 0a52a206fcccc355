"""Straight transcriptions of the papers' rules, dense and slow, for the tests to compare against.

Nothing here is shared with the package: each function is written from its source (ALMA_p from
Gentile 2001, Figure 1; the random draws from the SplitMix64 definition), with no representation
tricks, so that an agreement to 1e-9 means something.
"""

from __future__ import annotations

import numpy as np


def link(w: np.ndarray, q) -> np.ndarray:
    """f_i(w) = sign(w_i) |w_i|^(q-1) / ||w||_q^(q-2)  (the identity for q = 2)."""
    norm = np.sum(np.abs(w) ** q) ** (1 / q)
    if norm == 0:
        return np.zeros_like(w)
    return np.sign(w) * np.abs(w) ** (q - 1) / norm ** (q - 2)


def alma_reference(stream, p, alpha, B, C, n_features):
    """ALMA_p(alpha; B, C) of Gentile (2001), Figure 1, on dense vectors.

    Computed in extended precision (np.longdouble): going through f and f^-1 at every step loses
    digits for a large p (a float64 run of this very code drifts by 6e-9 at p = 40 over 3000
    examples), and the reference must be the more accurate side of a comparison.
    Returns the weight vector (as float64) after the stream and the number of corrections.
    """
    ld = np.longdouble
    p, alpha, B, C = ld(p), ld(alpha), ld(B), ld(C)
    q = p / (p - 1)
    w = np.zeros(n_features, dtype=ld)
    k = 1
    for x, y in stream:
        x = np.asarray(x, dtype=ld)
        if not np.any(x):
            continue  # footnote 4: no update on a zero instance
        xh = x / np.sum(np.abs(x) ** p) ** (1 / p)
        gamma = B * np.sqrt(p - 1) / np.sqrt(ld(k))
        if y * (w @ xh) <= (1 - alpha) * gamma:
            eta = C / (np.sqrt(p - 1) * np.sqrt(ld(k)))
            w_prime = link(link(w, q) + eta * y * xh, p)  # f^-1 is f with q replaced by p
            w = w_prime / max(ld(1), np.sum(np.abs(w_prime) ** q) ** (1 / q))
            k += 1
    return w.astype(np.float64), k - 1


MASK = 2**64 - 1


def uniform_index(key: int, counter: int, n: int) -> int:
    """Draw number `counter` of the SplitMix64 stream `key` as an integer in [0, n), in Python
    integers (the models' generator is streammargin/jit/rng.py)."""
    z = (key + (counter + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    z ^= z >> 31
    return min(int((z >> 11) * (1.0 / 9007199254740992.0) * n), n - 1)
