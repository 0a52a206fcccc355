"""Counter-based random numbers: SplitMix64 output number `counter` of the stream `key`.

A model keeps (key, counter) as two floats of its state array (key < 2^52, counter < 2^53), so its
random stream is part of its state: saving and restoring a model restores the stream exactly, and
learn_one and learn_many draw the same numbers.
"""

from __future__ import annotations

import numpy as np

from streammargin.jit.dispatch import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True)
def uniform(key, counter):
    """Draw number `counter` of stream `key`, uniform in [0, 1)."""
    z = np.uint64(key) + (np.uint64(counter) + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def index(key, counter, n):
    """Draw number `counter` of stream `key`, a uniform integer in [0, n)."""
    return min(int(uniform(key, counter) * n), n - 1)
