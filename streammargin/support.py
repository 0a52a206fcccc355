"""Base of the kernel classifiers: a bounded support cache (`SupportCacheClassifier`, also the
MPU's replay cache in its linear form) and kernels by name (`KernelClassifier`).

A kernel model keeps at most `budget` support vectors, each a dense row of the feature columns,
of which there are at most `max_features` (`streammargin.features`: later names are hashed into
shared columns): its memory is bounded by budget x max_features x 8 bytes plus budget-sized
matrices (`streammargin.memory`), never by the length of the stream or the number of names. The
cache's arrays and the numba functions that work on them are described in
`streammargin.jit.kernels`; this module holds the River-side plumbing every kernel model shares.
"""

from __future__ import annotations

import numpy as np

from streammargin import memory, state, validation
from streammargin.base import (
    MarginClassifier,
    check_calibration,
    check_close,
    check_whole,
    check_zero,
)
from streammargin.jit import calibration
from streammargin.jit import kernels as kjit
from streammargin.jit.layout import Layout

__all__ = [
    "KernelClassifier",
    "SupportCacheClassifier",
    "MAX_BUDGET",
    "MAX_DEGREE",
    "MAX_GRAM_BUDGET",
    "grown_columns",
    "validate_kernel",
]

# Upper bounds of the size parameters, so that no valid parameter set allocates absurd memory.
MAX_BUDGET = 100_000  # cached vectors: budget x columns float64 (budget x 8 at first)
MAX_GRAM_BUDGET = 10_000  # models with a budget x budget float64 matrix: 800 MB at the bound
MAX_DEGREE = 100  # polynomial values are clamped anyway; a higher degree means nothing more


def validate_kernel(
    kernel: object, gamma: object, degree: object, coef0: object, allow_none: bool = False
) -> None:
    """The kernel parameters every kernel model shares (`ValueError` naming the bad one);
    `allow_none`: the kernel may be None (a model with a primal form)."""
    if allow_none:
        validation.optional(validation.one_of, "kernel", kernel, sorted(kjit.KERNELS))
    else:
        validation.one_of("kernel", kernel, sorted(kjit.KERNELS))
    validation.positive_real("gamma", gamma)
    validation.integer_in("degree", degree, 1, MAX_DEGREE)
    validation.finite_real("coef0", coef0)


def grown_columns(array: np.ndarray, n_columns: int, limit: int) -> np.ndarray:
    """`array` (2-d) with room for at least `n_columns` columns (zero-filled), doubling, never
    beyond `limit` columns (the model's bound; n_columns <= limit)."""
    if array.shape[1] >= n_columns:
        return array
    capacity = min(max(n_columns, 2 * array.shape[1], 8), limit)
    bigger = np.zeros((array.shape[0], capacity), dtype=array.dtype)
    bigger[:, : array.shape[1]] = array
    return bigger


class SupportCacheClassifier(MarginClassifier):
    """Shared plumbing of the classifiers that keep a bounded cache of examples (support vectors,
    or the MPU's replay cache): dense rows of the feature columns, per-row slots and the state
    array `st` (`streammargin.jit.kernels` describes all three).

    A subclass validates its params (`check_max_features` and `streammargin.validation`), sets
    them (including `budget` and `max_features`) as attributes, then calls `self._reset()`. It
    sets `_n_fields` (per-row slot fields, at least `kjit.N_COMMON_FIELDS`) and `_layout` (the
    layout of its `st`: `kjit.HEAD` extended with its own slots, which sizes `st` when it is made
    and restored), and extends `_reset` and `_check_restored` for its own state.

    Hooks: `_extra_rows` (cache rows beyond `budget`, e.g. a working row), `_extra_array_bytes`
    (the memory bound of the model's own arrays).

    Learnt state: `_support` (S), `_slots`, `_st`; see `streammargin.jit.kernels`. The kernel
    parameters' entries of `st` stay zero here: `KernelClassifier` writes them.
    """

    _first_column = 0
    _n_fields = kjit.N_COMMON_FIELDS
    _layout: Layout = kjit.HEAD
    _extra_rows = 0
    _state_arrays = ("_support", "_slots", "_st")

    def _reset(self) -> None:
        super()._reset()
        rows = self.budget + self._extra_rows
        self._support = np.zeros((rows, min(8, self._max_columns)))
        self._slots = np.zeros((rows, self._n_fields))
        self._st = np.zeros(self._layout.size)
        self._st[kjit.ST_PLATT : kjit.ST_MODEL] = calibration.new_state()

    @property
    def _calibration(self) -> np.ndarray:
        return self._st[kjit.ST_PLATT : kjit.ST_MODEL]

    def _reserve(self, n_columns: int) -> None:
        if n_columns > self._support.shape[1]:
            self._support = grown_columns(self._support, n_columns, self._max_columns)

    # The memory bound (`streammargin.memory`): the param that sets the cache's rows, the
    # entries of `st`, and the model's own arrays.
    _budget_param = "budget"

    @classmethod
    def _st_entries(cls) -> int:
        return cls._layout.size

    @classmethod
    def _extra_array_bytes(cls, params: dict, budget: int, columns: int) -> int:
        """Bytes of the model's arrays beyond the cache and `st` (Gram matrices, scratch rows)."""
        return 0

    @classmethod
    def _max_array_bytes(cls, params: dict) -> int:
        budget = memory.int_param(params, cls._budget_param, 1)
        columns = cls._first_column + memory.int_param(params, "max_features", 1)
        rows = budget + cls._extra_rows
        cache = 8 * (rows * columns + rows * cls._n_fields + cls._st_entries())
        return cache + cls._extra_array_bytes(params, budget, columns)

    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        rows = self.budget + self._extra_rows
        return {
            "_support": (rows, self._capacity(n_columns)),
            "_slots": (rows, self._n_fields),
            "_st": (self._layout.size,),
        }

    def _check_restored(self) -> None:
        """The cache's invariants: a whole size within the budget (numba indexes with it), rows
        past the size and columns past the feature space zero, labels +-1, birth times among the
        trials, squared norms equal to the stored vectors', calibration in range. A subclass
        writes its hyper-parameter slots before calling this, and checks its own fields after."""
        st, S, slots = self._st, self._support, self._slots
        check_whole("support size", st[kjit.ST_SIZE], 0.0, self.budget)
        check_whole("trials", st[kjit.ST_TRIALS])
        size = int(st[kjit.ST_SIZE])
        check_zero("support vectors past the support size", S[size:])
        check_zero("support vectors past the feature columns", S[:, self._features.n_columns :])
        check_zero("support slots past the support size", slots[size:])
        if not np.all(np.abs(slots[:size, kjit.LABEL]) == 1.0):
            raise state.StateError("state field support labels must be -1 or +1")
        check_whole("support birth times", slots[:size, kjit.BORN], 0.0, st[kjit.ST_TRIALS])
        with np.errstate(over="ignore"):
            squares = np.minimum(np.sum(S[:size] * S[:size], axis=1), kjit.MAX_FINITE)
        check_close("support squared norms", slots[:size, kjit.SQ_NORM], squares, 1e-9, 0.0)
        check_calibration("calibration", st[kjit.ST_PLATT : kjit.ST_MODEL])

    @property
    def support_size(self) -> int:
        """Number of support vectors held (never more than `budget`)."""
        return int(self._st[kjit.ST_SIZE])

    @property
    def n_trials(self) -> int:
        return int(self._st[kjit.ST_TRIALS])

    @property
    def counters(self) -> dict[str, int]:
        """Counters a monitoring process reports (the Kafka worker's metrics)."""
        return {
            "support_size": self.support_size,
            "trials": self.n_trials,
            **self._feature_counters(),
        }


class KernelClassifier(SupportCacheClassifier):
    """Shared plumbing of the kernel classifiers on a bounded support cache: the kernel by name.

    A subclass validates its params (`validate_kernel`, `check_max_features` and
    `streammargin.validation`), sets them (including `kernel`, `gamma`, `degree`, `coef0`,
    `budget`, `max_features`) as attributes, then calls `self._reset()`; see
    `SupportCacheClassifier` for the rest of the contract. The kernel lives in `st` as
    `kp = [kind, gamma, degree, coef0]`, written from the params.
    """

    def _kernel_params(self) -> np.ndarray:
        return kjit.kernel_params(self.kernel, self.gamma, self.degree, self.coef0)

    def _reset(self) -> None:
        super()._reset()
        self._st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE] = self._kernel_params()

    def _check_restored(self) -> None:
        # The params are the source of truth for the kernel.
        self._st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE] = self._kernel_params()
        super()._check_restored()

    def _self_kernels(self) -> np.ndarray:
        """K(s_i, s_i) of the stored vectors, from their squared norms (as learning computes it)."""
        kp = self._st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE]
        size = int(self._st[kjit.ST_SIZE])
        return np.array([kjit.self_kernel(kp, sq) for sq in self._slots[:size, kjit.SQ_NORM]])
