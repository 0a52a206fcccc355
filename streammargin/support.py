"""Base of the kernel classifiers: a bounded support cache (`SupportCacheClassifier`, also the
MPU's replay cache in its linear form), kernels by name and a data-driven kernel width
(`KernelClassifier`).

A kernel model keeps at most `budget` support vectors, each a dense row of the feature columns,
of which there are at most `max_features` (`streammargin.features`: later names are hashed into
shared columns): its memory is bounded by budget x max_features x 8 bytes plus budget-sized
matrices (`streammargin.memory`), never by the length of the stream or the number of names. The
cache's arrays and the numba functions that work on them are described in
`streammargin.jit.kernels`; this module holds the River-side plumbing every kernel model shares.
"""

from __future__ import annotations

import copy
import math
import typing

import numpy as np

from streammargin import memory, state, validation
from streammargin.base import (
    Capacity,
    MarginClassifier,
    binary_target,
    binary_targets,
    check_calibration,
    check_close,
    check_range,
    check_whole,
    check_zero,
    frame_values,
)
from streammargin.errors import InvalidInput
from streammargin.jit import calibration
from streammargin.jit import kernels as kjit
from streammargin.jit.layout import Layout

__all__ = [
    "AUTO_GAMMA_RECORDS",
    "KernelClassifier",
    "SupportCacheClassifier",
    "MAX_BUDGET",
    "MAX_DEGREE",
    "MAX_GRAM_BUDGET",
    "estimate_gamma",
    "grown_columns",
    "validate_kernel",
]

# Upper bounds of the size parameters, so that no valid parameter set allocates absurd memory.
MAX_BUDGET = 100_000  # cached vectors: budget x columns float64 (budget x 8 at first)
MAX_GRAM_BUDGET = 10_000  # models with a budget x budget float64 matrix: 800 MB at the bound
MAX_DEGREE = 100  # polynomial values are clamped anyway; a higher degree means nothing more
MAX_TRIALS = 2.0**53  # trials are whole numbers in float64


def validate_kernel(
    kernel: object, gamma: object, degree: object, coef0: object, allow_none: bool = False
) -> None:
    """The kernel parameters every kernel model shares (`ValueError` naming the bad one);
    `allow_none`: the kernel may be None (a model with a primal form)."""
    if allow_none:
        validation.optional(validation.one_of, "kernel", kernel, sorted(kjit.KERNELS))
    else:
        validation.one_of("kernel", kernel, sorted(kjit.KERNELS))
    validation.auto_or(validation.positive_real, "gamma", gamma)  # "auto": `estimate_gamma`
    validation.integer_in("degree", degree, 1, MAX_DEGREE)
    validation.finite_real("coef0", coef0)


# The data-driven kernel width (gamma="auto"). ------------------------------------------------------

# Records the width is estimated from: it is re-estimated at records 1, 2, 4, ..., 64 (the model
# relearns the records so far whenever it moves) and frozen at the 64th.
AUTO_GAMMA_RECORDS = 64
# gamma = AUTO_GAMMA_FACTOR / (sum of the features' variances): 2 / n_features on standardised
# features, twice scikit-learn's gamma="scale" (benchmarks/model_selection.py, --section gamma:
# among 0.25-4 / d, 2 / d was best or within 0.4 points of the best mean accuracy over 8 streams
# for each kernel model). The median pairwise distance, at O(n^2 d), gave the same choice up to
# the factor (0.51-0.65 of the variance estimate on those streams).
AUTO_GAMMA_FACTOR = 2.0
# The width before two records differ (no variance to measure): the former default.
AUTO_GAMMA_START = 1.0
# An estimate is kept within these bounds (values of 1e-300 and 1e300 put it beyond float64).
MIN_GAMMA, MAX_GAMMA = 1e-300, 1e300


def estimate_gamma(rows: np.ndarray) -> float:
    """gamma = AUTO_GAMMA_FACTOR / sum_j var_j, the variances of the columns of `rows` (records
    as dense rows, absent features 0; population variances), so that two records lie about
    sqrt(2 sum_j var_j) apart and K(x, x') of two typical records is about e^-4.
    AUTO_GAMMA_START below two rows or without variance. Finite for any finite rows: computed
    on rows / max |entry|, rescaled by logarithms and kept in [MIN_GAMMA, MAX_GAMMA]."""
    if rows.shape[0] < 2:
        return AUTO_GAMMA_START
    largest = float(np.max(np.abs(rows), initial=0.0))
    if largest == 0.0:
        return AUTO_GAMMA_START
    scaled = rows / largest
    spread = float(np.sum(np.var(scaled, axis=0)))
    if not spread > 0.0:
        return AUTO_GAMMA_START
    # factor / (spread largest^2) by logarithms: no overflow or underflow on the way
    log_gamma = math.log(AUTO_GAMMA_FACTOR) - math.log(spread) - 2.0 * math.log(largest)
    if log_gamma >= math.log(MAX_GAMMA):
        return MAX_GAMMA
    if log_gamma <= math.log(MIN_GAMMA):
        return MIN_GAMMA
    return min(max(math.exp(log_gamma), MIN_GAMMA), MAX_GAMMA)


def _estimated_at(n: int) -> int:
    """How many of the first `n` records the current estimate is from: the largest power of two
    <= n (0 for n = 0)."""
    return 0 if n == 0 else 1 << (n.bit_length() - 1)


class _OneOf(typing.NamedTuple):
    """A saved array's dimension that is one of a few values."""

    values: tuple

    def fits(self, dim: int, empty: bool) -> bool:
        return dim in self.values

    def __str__(self) -> str:
        return " or ".join(map(str, self.values))


class _FreedOr(typing.NamedTuple):
    """A saved array's column dimension: 0 once the array is freed, else its `Capacity`."""

    capacity: Capacity

    def fits(self, dim: int, empty: bool) -> bool:
        return (empty and dim == 0) or self.capacity.fits(dim, empty)

    def __str__(self) -> str:
        return f"0 or {self.capacity.needed}..{self.capacity.limit}"


def grown_columns(array: np.ndarray, n_columns: int, limit: int) -> np.ndarray:
    """`array` (2-d) with room for at least `n_columns` columns (zero-filled), doubling, never
    beyond `limit` columns (the model's bound; n_columns <= limit)."""
    if array.shape[1] >= n_columns:
        return array
    capacity = min(max(n_columns, 2 * array.shape[1], 8), limit)
    bigger = np.zeros((array.shape[0], capacity), dtype=array.dtype)
    bigger[:, : array.shape[1]] = array
    return bigger


# The arguments of a cache model's per-record numba calls (`_entry_points`), as the model makes
# them: S, the slots and st, float64 arrays made by the model (C-ordered, writable; grown by
# `grown_columns`, restored as such by `from_state`), like its other matrices and vectors; x's
# columns (int64) and read-only values from `FeatureSpace.encode`.
MATRIX = np.zeros((1, 1))
VECTOR = np.zeros(1)
IDX = np.zeros(1, dtype=np.int64)
VAL = np.frombuffer(bytes(8))
CACHE_ARRAYS = ("_support", "_slots", "_st")
CACHE_EXAMPLES = (MATRIX, MATRIX, VECTOR)


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
            self._bind()

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

    `gamma="auto"` (with an "rbf" or "poly" kernel): the width is learnt state, in `st`'s gamma
    slot. The first `AUTO_GAMMA_RECORDS` labelled records are also kept, as dense rows, in
    `_warmup_x` (their targets in `_warmup_y`); when the count reaches a power of two the width
    is estimated from them (`estimate_gamma`), and if it moved, the learnt state is reset (the
    feature space kept) and those records learnt again with it: every cached kernel quantity
    (margins, Gram matrices, the Projectron's inverse, SVM gradients, SBP responses, the MPU's
    norms) is then exact for the width in use, in every model, at the cost of 127 extra learning
    steps in all. At the last one the width is frozen and the rows freed. Prediction uses the
    width of the moment.
    """

    def _kernel_params(self) -> np.ndarray:
        return kjit.kernel_params(self.kernel, self._gamma_now(), self.degree, self.coef0)

    def _zeroed(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """`np.zeros(shape)` for the model's array `name` in `_reset`; during `_relearn`, the
        model's own `name` array of that shape, with the block learning can have written (its
        first `_relearning_rows` rows and columns) set back to zero.

        For the Gram matrices (up to budget x budget floats): the warm-up resets the learnt
        state up to eight times in its first 128 records, and a new 2 MB matrix each time
        (memory the allocator clears, or pages the first write faults in) was most of an SBP's
        time on a 178-record stream."""
        previous = getattr(self, name, None)
        written = self.__dict__.get("_relearning_rows")
        if written is None or not isinstance(previous, np.ndarray) or previous.shape != shape:
            return np.zeros(shape)
        previous[tuple(slice(0, min(written, side)) for side in shape)] = 0.0
        return previous

    def _reset(self) -> None:
        super()._reset()
        self._st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE] = self._kernel_params()
        warmup = AUTO_GAMMA_RECORDS if self._estimates_gamma else 0
        self._warmup_x = np.zeros((warmup, min(8, self._max_columns) if warmup else 0))
        self._warmup_y = np.zeros(warmup)

    # The data-driven width (gamma="auto") ---------------------------------------------------------

    @property
    def _estimates_gamma(self) -> bool:
        """Whether the kernel width is estimated from the data: gamma="auto" with a kernel that
        has a width (the linear kernel has none)."""
        return isinstance(self.gamma, str) and getattr(self, "kernel", None) in ("rbf", "poly")

    def _gamma_now(self) -> float:
        """The width in use: the param, or the estimate in `st` (AUTO_GAMMA_START before any)."""
        if not isinstance(self.gamma, str):
            return float(self.gamma)
        st = getattr(self, "_st", None)
        if st is None or not self._estimates_gamma or st[kjit.ST_KP + kjit.GAMMA] == 0.0:
            return AUTO_GAMMA_START
        return float(st[kjit.ST_KP + kjit.GAMMA])

    @property
    def gamma_(self) -> float:
        """The kernel width in use: `gamma` itself, or its estimate with gamma="auto"."""
        return self._gamma_now()

    @property
    def _warming_up(self) -> bool:
        return self._warmup_y.shape[0] != 0

    def _saved_arrays(self) -> tuple[str, ...]:
        if self._estimates_gamma:
            return (*self._state_arrays, "_warmup_x", "_warmup_y")
        return self._state_arrays

    def learn_one(self, x: dict, y: typing.Any) -> None:
        if not self._warming_up:
            return super().learn_one(x, y)
        target = 1.0 if y is True else -1.0 if y is False else binary_target(y)
        features = self._features
        idx, val = features.encode(x, True)
        self._reserve(features.n_columns)
        self._warm_up(idx, val, target)

    def _warm_up(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        """Learn one record of the warm-up: keep it, re-estimate the width at a power of two,
        and relearn the records kept if the width moved."""
        n = int(np.count_nonzero(self._warmup_y))
        self._warmup_x = grown_columns(self._warmup_x, self._features.n_columns, self._max_columns)
        self._warmup_x[n, idx] = val
        self._warmup_y[n] = target
        n += 1
        if n == _estimated_at(n):  # a power of two
            gamma = estimate_gamma(self._warmup_x[:n])
            if gamma != self._st[kjit.ST_KP + kjit.GAMMA]:
                self._relearn(gamma, n)
            else:
                self._learn(idx, val, target)
        else:
            self._learn(idx, val, target)
        if n == AUTO_GAMMA_RECORDS:  # frozen: the rows are no longer needed
            self._warmup_x = np.zeros((0, 0))
            self._warmup_y = np.zeros(0)

    def _relearn(self, gamma: float, n: int) -> None:
        """A fresh learnt state with width `gamma` (the feature space and the warm-up rows kept),
        then the first `n` warm-up records learnt again, in order."""
        features, rows, targets = self._features, self._warmup_x, self._warmup_y
        # The model has learnt n - 1 records: no row or column of its matrices beyond those,
        # and a working row, was ever written (`_zeroed`).
        self._relearning_rows = n + 1
        try:
            self._reset()
        finally:
            del self._relearning_rows
        self._features, self._warmup_x, self._warmup_y = features, rows, targets
        self._st[kjit.ST_KP + kjit.GAMMA] = gamma
        self._reserve(features.n_columns)
        for i in range(n):
            columns = np.flatnonzero(rows[i])
            self._learn(columns, np.ascontiguousarray(rows[i, columns]), float(targets[i]))

    def learn_many(self, X: typing.Any, y: typing.Any) -> None:
        """As `MarginClassifier.learn_many`; the rows of the warm-up (gamma="auto") are learnt one
        by one as `learn_one` would, and a refused frame leaves the model as it was."""
        if not self._warming_up:
            return super().learn_many(X, y)
        targets = binary_targets(y)  # labels and values are checked before anything changes
        if len(targets) != len(X):
            raise InvalidInput(f"X has {len(X)} rows but y has {len(targets)} labels")
        values = frame_values(X)
        head = min(AUTO_GAMMA_RECORDS - int(np.count_nonzero(self._warmup_y)), len(X))
        saved = copy.deepcopy(self.__dict__)
        try:
            columns = list(X.columns)
            for row in range(head):
                x = {
                    name: float(values[row, j])
                    for j, name in enumerate(columns)
                    if not math.isnan(values[row, j])
                }
                self.learn_one(x, bool(targets[row] > 0.0))
            if head < len(X):
                super().learn_many(X.iloc[head:], targets[head:] > 0.0)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    @classmethod
    def _max_array_bytes(cls, params: dict) -> int:
        warmup = 0
        if isinstance(params.get("gamma"), str) and params.get("kernel") in ("rbf", "poly"):
            columns = cls._first_column + memory.int_param(params, "max_features", 1)
            warmup = 8 * AUTO_GAMMA_RECORDS * (columns + 1)  # the warm-up rows and targets
        return super()._max_array_bytes(params) + warmup

    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        shapes = super()._state_shapes(n_columns, values)
        if self._estimates_gamma:
            warmup = _OneOf((AUTO_GAMMA_RECORDS, 0))
            shapes["_warmup_x"] = (warmup, _FreedOr(self._capacity(n_columns)))
            shapes["_warmup_y"] = (warmup,)
        return shapes

    def _check_restored(self) -> None:
        if self._estimates_gamma:
            self._check_estimated_gamma()
        # The params are the source of truth for the kernel (its width too, unless estimated).
        self._st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE] = self._kernel_params()
        super()._check_restored()

    def _check_estimated_gamma(self) -> None:
        """gamma="auto": during the warm-up, the kept rows are the records so far (targets +-1,
        then zeros; nothing past them or past the feature space) and the width is the estimate
        from the first 2^k of them (recomputed, to 1e-9: libm and numpy may differ in the last
        bits between machines); after it, no rows and a width within [MIN_GAMMA, MAX_GAMMA]."""
        rows, targets = self._warmup_x, self._warmup_y
        gamma = self._st[kjit.ST_KP + kjit.GAMMA]
        check_range("estimated gamma", gamma, MIN_GAMMA, MAX_GAMMA)
        if targets.shape[0] == 0:
            if rows.shape != (0, 0):
                raise state.StateError("state field warm-up rows must be empty after the warm-up")
            check_whole("trials after the warm-up", self._st[kjit.ST_TRIALS],
                        AUTO_GAMMA_RECORDS, MAX_TRIALS)
            return
        if rows.shape[0] != AUTO_GAMMA_RECORDS:
            raise state.StateError("state field warm-up rows does not match its targets")
        n = int(np.count_nonzero(targets))
        if not (np.all(np.abs(targets[:n]) == 1.0) and n < AUTO_GAMMA_RECORDS):
            raise state.StateError(
                "state field warm-up targets must be -1 or +1, then zeros, fewer than "
                f"{AUTO_GAMMA_RECORDS}"
            )
        check_zero("warm-up rows past the records", rows[n:])
        check_zero("warm-up rows past the feature columns", rows[:, self._features.n_columns :])
        check_close("estimated gamma", gamma, estimate_gamma(rows[: _estimated_at(n)]), 1e-9, 0.0)
        check_whole("trials during the warm-up", self._st[kjit.ST_TRIALS], n, n)

    def _self_kernels(self) -> np.ndarray:
        """K(s_i, s_i) of the stored vectors, from their squared norms (as learning computes it)."""
        kp = self._st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE]
        size = int(self._st[kjit.ST_SIZE])
        return np.array([kjit.self_kernel(kp, sq) for sq in self._slots[:size, kjit.SQ_NORM]])
