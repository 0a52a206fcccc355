"""The Margin Perceptron with Unlearning (Panagiotakopoulos & Tsampouka 2010), online.

A perceptron that approximates the L1-SVM online. Patterns are augmented with a constant rho (for
the bias) and multiplied by their label, z = y [x, rho]; the weight vector is a = sum_k I_k z_k
with integer dual counts I_k. On presenting pattern k at margin s = a . z_k the paper's rule is

    s <= b       and I_k < I:  learning     a += z_k,  I_k += 1
    s >= b + db  and I_k > 0:  unlearning   a -= z_k,  I_k -= 1

applied as multiple updates (Section 4): all the steps that presenting z_k again and again would
make, at the cost of one inner product (`streammargin.jit.mpu.rule`, the one copy of the rule,
which the batch solver `streammargin.mpu_batch.fit_batch` applies too). With the cap I the
algorithm converges to an approximation of the L1-SVM min_w 1/2 ||w||^2 + Cp sum_k max(0, 1 -
w . z_k) with w = a / b and Cp = I / b; without cap (`C=None`) to the hard-margin SVM. The gap db
must exceed R^2 (R: the largest ||z_k||), else learning and unlearning undo each other for ever.

On a stream unlearning needs patterns to be seen again (the paper says so), so the model keeps the
patterns that were margin violators when they arrived in a bounded *replay cache* and presents
`replay` of them again, round robin, after each new example. The weights are always sum_k I_k z_k
over the cache: when the cache is full, the oldest pattern with I_k = 0 is evicted (else the
oldest one) and its whole contribution leaves the weights. Memory is bounded by `budget` patterns.

How the paper's constants are set. R is the largest norm seen so far, and the paper's db = 3 R^2
generalises to db = `gap` R^2. Remark 4 turns a penalty Cp and an accuracy epsilon into
b = db (2 + epsilon) / epsilon and I = floor(Cp b) + 1: the before-run bound (eq. 23) then
guarantees, at convergence, (J - J_opt) / J_opt < epsilon. As R grows, db, b and I grow with R^2,
and every I_k is multiplied by the same factor (rounded), so that the dual variables
alpha_k = I_k / b, hence the learnt SVM, are kept. Everything is computed in units of R, which
makes the model invariant to a rescaling of the features and keeps any finite input finite.

Two forms, one class each, over the same rule and the same replay cache:

- `LinearMPUClassifier` keeps the primal weights: a prediction costs O(features), a replay
  O(features).
- `KernelMPUClassifier` keeps the cache's Gram matrix and the margins of all cached patterns,
  augmented as K(x, x') + rho^2: a prediction costs `budget` kernel evaluations and a replay
  O(budget) (memory budget^2 floats).

`MPUClassifier(kernel=None | "rbf" | "poly" | "linear", ...)` is the public name of both: it
builds the linear form for `kernel=None`, the kernel form otherwise, and restores the checkpoints
saved when it was one class. The batch solver is `streammargin.mpu_batch.fit_batch` (also
importable from here).
"""

from __future__ import annotations

import abc
import functools
import typing

import numpy as np

from streammargin import memory, state, validation
from streammargin.base import (
    MarginClassifier,
    check_close,
    check_max_features,
    check_range,
    check_whole,
    check_zero,
)
from streammargin.jit import kernels as kjit
from streammargin.jit import mpu as mpu_jit
from streammargin.jit.entry import EntryPoint
from streammargin.mpu_batch import dual_objective, fit_batch, objective
from streammargin.support import (
    CACHE_ARRAYS,
    CACHE_EXAMPLES,
    IDX,
    MATRIX,
    MAX_BUDGET,
    MAX_GRAM_BUDGET,
    VAL,
    VECTOR,
    KernelClassifier,
    SupportCacheClassifier,
    grown_columns,
    validate_kernel,
)

__all__ = [
    "KernelMPUClassifier",
    "LinearMPUClassifier",
    "MPUClassifier",
    "fit_batch",
    "objective",
    "dual_objective",
]

# Bounds of the params: b / R^2 = gap (2 + epsilon) / epsilon stays below 1e36.
MIN_EPSILON, MAX_EPSILON = 1e-12, 1e12
MAX_GAP = 1e12
MAX_REPLAY = 10_000  # replays per example, each O(features) or O(budget)
# C="auto": the penalty of each form (benchmarks/model_selection.py, --section defaults)
AUTO_C_LINEAR, AUTO_C_KERNEL = 0.01, 1.0

# The params of the kernel form that the linear form does not take.
KERNEL_PARAMS = ("kernel", "gamma", "degree", "coef0")


def _margin_ratio(epsilon: float, gap: float) -> float:
    """b / R^2 for the before-run accuracy epsilon (eq. 23): epsilon = 2 r / (1 - r), r = db / b."""
    return gap * (2.0 + epsilon) / epsilon


class _MPURule:
    """What both forms of the MPU share: their common params, the hyper-parameter slots of `st`
    (`mpu_jit.write_hyper`), the invariants of the counts and of R, and inspection. A form mixes
    this in before its cache class (`SupportCacheClassifier` or `KernelClassifier`), and
    implements `_replay(count)` and `_check_weights(size, bound)`."""

    _first_column = 0
    _n_fields = mpu_jit.N_FIELDS
    _layout = mpu_jit.LAYOUT

    C: float | str | None
    epsilon: float
    gap: float
    budget: int
    replay: int
    unlearn: bool
    fit_intercept: bool
    intercept_scale: float
    _st: np.ndarray
    _slots: np.ndarray

    @staticmethod
    def _validate_rule(C: typing.Any, epsilon: typing.Any, gap: typing.Any) -> None:
        # "auto": the form's `_auto_C`
        validation.auto_or(functools.partial(validation.optional, validation.positive_real), "C", C)
        validation.real_in("epsilon", epsilon, MIN_EPSILON, MAX_EPSILON)
        validation.real_in("gap", gap, 1.0, MAX_GAP, low_open=True)

    @staticmethod
    def _validate_cache(
        budget: typing.Any,
        max_budget: int,
        replay: typing.Any,
        unlearn: typing.Any,
        fit_intercept: typing.Any,
        intercept_scale: typing.Any,
        max_features: typing.Any,
    ) -> None:
        validation.integer_in("budget", budget, 1, max_budget)
        validation.integer_in("replay", replay, 0, MAX_REPLAY)
        validation.boolean("unlearn", unlearn)
        validation.boolean("fit_intercept", fit_intercept)
        validation.positive_real("intercept_scale", intercept_scale)
        check_max_features(max_features)

    def _hyper_values(self) -> tuple[float, ...]:
        """The hyper-parameter slots of the state array (`mpu_jit.write_hyper`), from the params."""
        return (
            _margin_ratio(self.epsilon, self.gap),
            float(self.gap),
            0.0 if self.C is None else self._penalty(),
            float(self.intercept_scale) if self.fit_intercept else 0.0,
            float(self.replay),
            float(self.unlearn),
        )

    # Cp with C="auto": the form's own default.
    _auto_C: float

    def _penalty(self) -> float:
        """Cp: the param, or the form's `_auto_C` with C="auto"."""
        if self.C == validation.AUTO:
            return self._auto_C
        return float(self.C)

    def _reset(self) -> None:
        super()._reset()  # type: ignore[misc]  (the cache, and `st` with the calibration)
        mpu_jit.write_hyper(self._st, *self._hyper_values())
        self._st[mpu_jit.CAP] = 1.0

    @abc.abstractmethod
    def _replay(self, count: int) -> int:
        """Present `count` cached patterns, round robin; the number of updates."""

    @abc.abstractmethod
    def _check_weights(self, size: int, bound: float) -> None:
        """The form's invariants of a = sum_k I_k z_k: its weights (a / R) or margins
        (a . z_k / R^2) within `bound`, and its own arrays."""

    def _check_restored(self) -> None:
        """The invariants of `streammargin.jit.mpu`'s state: the counts I_k whole numbers in
        [0, I] and COUNT_SUM their sum, I = floor(Cp b) + 1 for the current R (1 before any
        pattern), R = 0 or at least R_MIN, z_k / R of norm in (0, 1], whole counters, and the
        form's weights or margins within sum_k I_k, as a = sum_k I_k z_k makes them
        (`_check_weights`)."""
        st, slots = self._st, self._slots
        # The params are the source of truth for the hyper-parameter slots.
        mpu_jit.write_hyper(st, *self._hyper_values())
        super()._check_restored()  # type: ignore[misc]  (the cache: size, rows, norms, ...)
        size = int(st[kjit.ST_SIZE])
        r = st[mpu_jit.R_NORM]
        if not (r == 0.0 or mpu_jit.R_MIN <= r <= mpu_jit.DOUBLE_MAX) or (size and r == 0.0):
            raise state.StateError("state field MPU largest norm R is out of range")
        cap = st[mpu_jit.CAP]
        expected_cap = 1.0 if r == 0.0 else mpu_jit.cap_for(st, r)
        if cap != expected_cap:
            raise state.StateError("state field MPU cap I does not match C, epsilon and R")
        counts = slots[:size, kjit.COEF]
        check_whole("MPU dual counts", counts, 0.0, cap)
        total = float(np.sum(counts))
        # Whole numbers add exactly while the sums stay below 2**53; beyond (the hard margin's
        # cap is 2**53 itself) learning counts them again, and two orders of summation differ
        # by at most size eps relative.
        check_close("MPU count sum", st[mpu_jit.COUNT_SUM], total, 1e-9, 0.0)
        z_sq = slots[:size, mpu_jit.Z_SQ]
        if not np.all((z_sq > 0.0) & (z_sq <= 1.0)):
            raise state.StateError("state field MPU ||z_k||^2 / R^2 must be in (0, 1]")
        # (a multiple update adds up to I steps, so the step counters pass 2**53)
        check_whole("learning steps", st[mpu_jit.LEARN_STEPS], 0.0, 1e300)
        check_whole("unlearning steps", st[mpu_jit.UNLEARN_STEPS], 0.0, 1e300)
        check_whole("evictions", st[mpu_jit.EVICTIONS])
        check_whole("MPU updates since the refresh", st[mpu_jit.SINCE_REFRESH], 0.0,
                    mpu_jit.REFRESH_EVERY - 1)
        check_whole("MPU replay cursor", st[mpu_jit.CURSOR], 0.0, self.budget)
        # |a . e_c| / R and |a . z_k| / R^2 are at most sum_k I_k (||z_k / R|| <= 1), plus the
        # rounding of the incremental updates between refreshes.
        self._check_weights(size, total * (1.0 + 1e-6) + 1e-6 * (1.0 + cap))

    def replay_cache(self, sweeps: int = 1) -> int:
        """Present every cached pattern `sweeps` more times (round robin) with the paper's rule.

        What `learn_one` does `replay` times after each example, without a new one: a consumer
        can call it when idle to bring the model closer to the SVM on its cache. Returns the number
        of updates (0: the cache is a fixed point of the rule).
        """
        return self._replay(sweeps * self.cache_size)

    # Inspection -----------------------------------------------------------------------------------

    @property
    def R(self) -> float:
        return float(self._st[mpu_jit.R_NORM])

    @property
    def b(self) -> float:
        return float(self._st[mpu_jit.MARGIN]) * self.R**2

    @property
    def db(self) -> float:
        return float(self._st[mpu_jit.GAP]) * self.R**2

    @property
    def I(self) -> int | None:  # noqa: E743 (the paper's name)
        if self.C is None:
            return None
        return int(self._st[mpu_jit.CAP])

    @property
    def dual_counts(self) -> np.ndarray:
        """I_k of the cached patterns, in cache order."""
        return self._slots[: self.cache_size, kjit.COEF].copy()

    @property
    def cache_size(self) -> int:
        return int(self._st[kjit.ST_SIZE])

    @property
    def support_size(self) -> int:
        """Cached patterns with I_k > 0 (the support vectors)."""
        return int(np.count_nonzero(self._slots[: self.cache_size, kjit.COEF]))

    @property
    def n_learning_steps(self) -> int:
        return int(self._st[mpu_jit.LEARN_STEPS])

    @property
    def n_unlearning_steps(self) -> int:
        return int(self._st[mpu_jit.UNLEARN_STEPS])

    @property
    def n_evictions(self) -> int:
        return int(self._st[mpu_jit.EVICTIONS])

    @property
    def counters(self) -> dict[str, int]:
        """Counters a monitoring process reports (the Kafka worker's metrics)."""
        return {
            "learning_steps": self.n_learning_steps,
            "unlearning_steps": self.n_unlearning_steps,
            "support_size": self.support_size,
            "cache_size": self.cache_size,
            "evictions": self.n_evictions,
            "trials": self.n_trials,  # type: ignore[attr-defined]
            **self._feature_counters(),  # type: ignore[attr-defined]
        }


@state.register
class LinearMPUClassifier(_MPURule, SupportCacheClassifier):
    """The Margin Perceptron with Unlearning, linear form: primal weights over a replay cache.

    The rule, the replay cache and the constants are described in `streammargin.mpu`. This form
    keeps a / R over the feature columns (and its bias entry): a prediction costs O(features), a
    replay O(features). `streammargin.MPUClassifier()` (kernel=None) builds it.

    Parameters
    ----------
    C
        The SVM penalty Cp (a positive finite number) in the units of the features as given
        (I = floor(C b) + 1, so the penalty actually solved for is I / b, within 1 / b of C);
        `None` for the hard margin (I = infinity); `"auto"` (the default) for 0.01, the best of
        0.01-1 in mean accuracy over 8 streams of standardised features with a cache of 1000
        patterns (`benchmarks/model_selection.py`: 0.800 at 0.01, 0.754 at 1).
    epsilon
        Before-run accuracy (eq. 23), in [1e-12, 1e12], that sets b = db (2 + epsilon) /
        epsilon: smaller values approximate the SVM on the cache more closely with finer steps.
    gap
        db / R^2, in (1, 1e12] (the paper uses 3).
    budget
        Capacity of the replay cache (patterns), an integer in [1, 100000].
    replay
        Cached patterns presented again after each new example, an integer in [0, 10000]. The
        default 16 is the best of 4-16 in mean accuracy over the 10 streams of
        `benchmarks/model_selection.py` for both forms (kernel 0.904 against 0.893 at 4, the
        20-feature hyperplane 0.859 against 0.826; linear 0.819 against 0.817).
    unlearn
        `False` turns unlearning off: the classic margin perceptron (with the cap I) on the same
        cache, replays and evictions. For comparisons.
    fit_intercept
        Augment the patterns with the constant `intercept_scale` (the paper's rho). `False` gives
        the homogeneous hyperplane of the paper's experiments.
    intercept_scale
        rho, a positive finite number. The default of 1 suits standardised features.
    max_features
        The bound on feature columns (see `streammargin.features`), an integer in [1, 2**30]: the
        first 7/8 of them go to the first names learnt, one each; later names (and names longer
        than 128 bytes) share the last eighth by a stable hash of the name, and are not stored.
        Every cached pattern is a dense row of these columns, so memory stays below
        `streammargin.memory.memory_bound`: budget x max_features x 8 bytes plus the primal
        weights (max_features x 8), 15.9 MiB at the defaults.

    Attributes
    ----------
    weights : dict
        Feature name -> weight of the SVM w = a / b.
    intercept : float
        The bias of w: the weight of the constant feature times rho.
    n_learning_steps, n_unlearning_steps : int
        The paper's t+ and t- (a multiple update of n steps counts n).
    support_size : int
        Cached patterns with I_k > 0 (the support vectors).
    cache_size : int
        Cached patterns (support vectors and recent violators with I_k = 0).
    n_evictions : int
        Patterns evicted from the full cache.
    R, b, db, I
        The current largest norm and the paper's constants derived from it (`I` is None without
        cap).

    The raw score `decision_one(x)` is the SVM decision value w . [x, rho] (margin boundaries at
    +-1). Probabilities come from the package's online Platt scaling of that score, fitted on each
    example before the model learns from it; `predict_one` serves the sign of the score or the
    calibrated argmax, whichever made fewer errors on the last thousand or so labelled examples
    (`streammargin.jit.calibration.decide`).

    """

    _state_arrays = ("_support", "_slots", "_st", "_weights")
    _auto_C = AUTO_C_LINEAR

    def __init__(
        self,
        C: float | str | None = "auto",
        epsilon: float = 0.1,
        gap: float = 3.0,
        budget: int = 1000,
        replay: int = 16,
        unlearn: bool = True,
        fit_intercept: bool = True,
        intercept_scale: float = 1.0,
        max_features: int = 2048,
    ):
        self._validate_rule(C, epsilon, gap)
        self._validate_cache(
            budget, MAX_BUDGET, replay, unlearn, fit_intercept, intercept_scale, max_features
        )
        self.C = C
        self.epsilon = epsilon
        self.gap = gap
        self.budget = budget
        self.replay = replay
        self.unlearn = unlearn
        self.fit_intercept = fit_intercept
        self.intercept_scale = intercept_scale
        self.max_features = int(max_features)
        self._reset()

    # primal_score / primal_proba(weights, st, idx, val), learn_primal(S, slots, st, weights, idx,
    # val, target).
    _entry_points = {
        **MarginClassifier._entry_points,
        "_primal_score_entry": (EntryPoint(mpu_jit.primal_score, VECTOR, VECTOR, IDX, VAL),
                                ("_weights", "_st")),
        "_primal_proba_entry": (EntryPoint(mpu_jit.primal_proba, VECTOR, VECTOR, IDX, VAL),
                                ("_weights", "_st")),
        "_learn_primal_entry": (
            EntryPoint(mpu_jit.learn_primal, *CACHE_EXAMPLES, VECTOR, IDX, VAL, 1.0),
            (*CACHE_ARRAYS, "_weights"),
        ),
    }

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {}
        yield {"C": None, "budget": 8, "replay": 3, "fit_intercept": False, "max_features": 5}

    def _reset(self) -> None:
        super()._reset()
        self._weights = np.zeros(self._support.shape[1])
        self._bind()

    def _reserve(self, n_columns: int) -> None:
        if n_columns > self._support.shape[1]:
            self._support = grown_columns(self._support, n_columns, self._max_columns)
            # the loops run over the columns of S and of the weights alike
            weights = np.zeros(self._support.shape[1])
            weights[: self._weights.shape[0]] = self._weights
            self._weights = weights
            self._bind()

    @classmethod
    def _extra_array_bytes(cls, params: dict, budget: int, columns: int) -> int:
        return 8 * columns  # the primal weights

    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        return {
            **super()._state_shapes(n_columns, values),
            "_weights": (self._capacity(n_columns),),
        }

    def _check_restored(self) -> None:
        # No kernel: its entries of `st` stay zero (a checkpoint of the one-class MPUClassifier
        # holds the linear kernel's parameters there, unused).
        self._st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE] = 0.0
        super()._check_restored()

    def _check_weights(self, size: int, bound: float) -> None:
        if self._weights.shape != (self._support.shape[1],):
            raise state.StateError("MPU weights do not match the cache's columns")
        check_zero("MPU weights past the feature columns",
                   self._weights[self._features.n_columns :])
        check_range("MPU weights", self._weights, -bound, bound)
        check_range("MPU bias", self._st[mpu_jit.BIAS], -bound, bound)

    # Numeric core ---------------------------------------------------------------------------------

    def _score(self, idx: np.ndarray, val: np.ndarray) -> float:
        return self._primal_score_entry(self._weights, self._st, idx, val)

    def _proba(self, idx: np.ndarray, val: np.ndarray) -> float:
        return self._primal_proba_entry(self._weights, self._st, idx, val)

    def _learn(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        self._learn_primal_entry(self._support, self._slots, self._st, self._weights, idx, val,
                                 target)

    def _score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.empty(X.shape[0])
        mpu_jit.score_rows_primal(self._weights, self._st, X, cols, out)
        return out

    def _learn_rows(self, X: np.ndarray, cols: np.ndarray, targets: np.ndarray) -> None:
        mpu_jit.learn_rows_primal(
            self._support, self._slots, self._st, self._weights, X, cols, targets
        )

    def _replay(self, count: int) -> int:
        return mpu_jit.replay_primal(self._support, self._slots, self._st, self._weights, count)

    # Inspection -----------------------------------------------------------------------------------

    @property
    def weights(self) -> dict:
        """Feature name -> weight of w = a / b."""
        return self._features.decode(self._weights * self._svm_scale())

    @property
    def intercept(self) -> float:
        """The bias of w = a / b: the weight of the constant feature times rho."""
        return float(self._st[mpu_jit.BIAS] * self._svm_scale() * self._st[mpu_jit.RHO])

    def _svm_scale(self) -> float:
        # w = a / b = (a / R) / (b / R^2) / R
        r = self._st[mpu_jit.R_NORM]
        return 0.0 if r == 0 else 1.0 / (self._st[mpu_jit.MARGIN] * r)


@state.register
class KernelMPUClassifier(_MPURule, KernelClassifier):
    """The Margin Perceptron with Unlearning, kernel form: the dual over a replay cache.

    The rule, the replay cache and the constants are described in `streammargin.mpu`. This form
    keeps the cache's Gram matrix and the margins a . z_k of all cached patterns, augmented as
    K(x, x') + rho^2: a prediction costs `budget` kernel evaluations, a replay O(budget).
    `streammargin.MPUClassifier(kernel=...)` builds it.

    Parameters
    ----------
    C
        The SVM penalty Cp (a positive finite number) in the units of the features as given
        (I = floor(C b) + 1, so the penalty actually solved for is I / b, within 1 / b of C);
        `None` for the hard margin (I = infinity); `"auto"` (the default) for 1.0, the best of
        0.01-10 in mean accuracy over 8 streams (`benchmarks/model_selection.py`: 0.890 at 1,
        0.803 at 0.01).
    epsilon
        Before-run accuracy (eq. 23), in [1e-12, 1e12], that sets b = db (2 + epsilon) /
        epsilon: smaller values approximate the SVM on the cache more closely with finer steps.
    gap
        db / R^2, in (1, 1e12] (the paper uses 3).
    budget
        Capacity of the replay cache (patterns), an integer in [1, 10000]: its Gram matrix holds
        budget x budget floats (800 MB at the bound).
    replay
        Cached patterns presented again after each new example, an integer in [0, 10000]. The
        default 16 is the best of 4-16 in mean accuracy over the 10 streams of
        `benchmarks/model_selection.py` for both forms (kernel 0.904 against 0.893 at 4, the
        20-feature hyperplane 0.859 against 0.826; linear 0.819 against 0.817).
    unlearn
        `False` turns unlearning off: the classic margin perceptron (with the cap I) on the same
        cache, replays and evictions. For comparisons.
    kernel
        "rbf", "poly" or "linear".
    gamma, degree, coef0
        Kernel parameters: rbf exp(-gamma ||a - b||^2), poly (gamma a.b + coef0)^degree; gamma a
        positive finite number or `"auto"` (the default: 2 / the sum of the features' variances,
        from the first 64 records, see `streammargin.support.estimate_gamma`), degree an integer
        in [1, 100], coef0 a finite number.
    fit_intercept
        Augment the patterns with the constant `intercept_scale` (the paper's rho). `False` gives
        the homogeneous hyperplane of the paper's experiments.
    intercept_scale
        rho, a positive finite number. The default of 1 suits standardised features.
    max_features
        The bound on feature columns (see `streammargin.features`), an integer in [1, 2**30]: the
        first 7/8 of them go to the first names learnt, one each; later names (and names longer
        than 128 bytes) share the last eighth by a stable hash of the name, and are not stored.
        Every cached pattern is a dense row of these columns, so memory stays below
        `streammargin.memory.memory_bound`: budget x max_features x 8 bytes plus the budget x
        budget Gram matrix, 24.5 MiB at the defaults (1 MiB of it the first 64 records, kept
        while gamma="auto" is estimated).

    Attributes
    ----------
    n_learning_steps, n_unlearning_steps : int
        The paper's t+ and t- (a multiple update of n steps counts n).
    support_size : int
        Cached patterns with I_k > 0 (the support vectors).
    cache_size : int
        Cached patterns (support vectors and recent violators with I_k = 0).
    n_evictions : int
        Patterns evicted from the full cache.
    R, b, db, I
        The current largest norm and the paper's constants derived from it (`I` is None without
        cap).

    The raw score `decision_one(x)` is the SVM decision value sum_k (I_k / b) y_k (K(x_k, x) +
    rho^2) (margin boundaries at +-1); probabilities and `predict_one` as in
    `LinearMPUClassifier`.

    """

    # The Gram matrix is not saved: `_check_weights` recomputes it, bit for bit. A checkpoint is
    # then ~1.08x the support cache's bytes instead of ~10x at budget 200
    # (`benchmarks/checkpoint_sizes.py`).
    _state_arrays = ("_support", "_slots", "_st", "_margins")
    _recomputed_arrays = ("_gram",)
    _auto_C = AUTO_C_KERNEL

    def __init__(
        self,
        C: float | str | None = "auto",
        epsilon: float = 0.1,
        gap: float = 3.0,
        budget: int = 1000,
        replay: int = 16,
        unlearn: bool = True,
        kernel: str = "rbf",
        gamma: float | str = "auto",
        degree: int = 3,
        coef0: float = 1.0,
        fit_intercept: bool = True,
        intercept_scale: float = 1.0,
        max_features: int = 2048,
    ):
        self._validate_rule(C, epsilon, gap)
        validate_kernel(kernel, gamma, degree, coef0)
        self._validate_cache(
            budget, MAX_GRAM_BUDGET, replay, unlearn, fit_intercept, intercept_scale, max_features
        )
        self.C = C
        self.epsilon = epsilon
        self.gap = gap
        self.budget = budget
        self.replay = replay
        self.unlearn = unlearn
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.intercept_scale = intercept_scale
        self.max_features = int(max_features)
        self._reset()

    # dual_score / dual_proba(S, slots, st, idx, val), learn_dual(S, slots, st, gram, margins,
    # idx, val, target).
    _entry_points = {
        **MarginClassifier._entry_points,
        "_dual_score_entry": (EntryPoint(mpu_jit.dual_score, *CACHE_EXAMPLES, IDX, VAL),
                              CACHE_ARRAYS),
        "_dual_proba_entry": (EntryPoint(mpu_jit.dual_proba, *CACHE_EXAMPLES, IDX, VAL),
                              CACHE_ARRAYS),
        "_learn_dual_entry": (
            EntryPoint(mpu_jit.learn_dual, *CACHE_EXAMPLES, MATRIX, VECTOR, IDX, VAL, 1.0),
            (*CACHE_ARRAYS, "_gram", "_margins"),
        ),
    }

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {"kernel": "rbf", "gamma": 0.5, "budget": 30}
        yield {"kernel": "poly", "degree": 2, "budget": 12, "unlearn": False, "epsilon": 1.0}

    def _reset(self) -> None:
        super()._reset()
        self._gram = self._zeroed("_gram", (self.budget, self.budget))
        self._margins = self._zeroed("_margins", (self.budget,))
        self._bind()

    @classmethod
    def _extra_array_bytes(cls, params: dict, budget: int, columns: int) -> int:
        return 8 * (budget * budget + budget)  # the Gram matrix and the margins

    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        budget = self.budget
        return {
            **super()._state_shapes(n_columns, values),
            "_margins": (budget,),
        }

    def _check_weights(self, size: int, bound: float) -> None:
        """Also: the margins zero past the cache; no primal bias; the Gram matrix, recomputed
        from the cache as learning made it (`mpu_jit.restore_gram`), within [-1, 1]
        (Cauchy-Schwarz)."""
        check_zero("MPU bias (kernel form)", self._st[mpu_jit.BIAS])
        gram, margins = self._gram, self._margins
        check_zero("MPU margins past the cache", margins[size:])
        mpu_jit.restore_gram(self._support, self._slots, self._st, gram)
        check_range("MPU Gram matrix", gram, -1.0, 1.0)
        check_range("MPU margins", margins, -bound, bound)

    # Numeric core ---------------------------------------------------------------------------------

    def _score(self, idx: np.ndarray, val: np.ndarray) -> float:
        return self._dual_score_entry(self._support, self._slots, self._st, idx, val)

    def _proba(self, idx: np.ndarray, val: np.ndarray) -> float:
        return self._dual_proba_entry(self._support, self._slots, self._st, idx, val)

    def _learn(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        self._learn_dual_entry(
            self._support, self._slots, self._st, self._gram, self._margins, idx, val, target
        )

    def _score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.empty(X.shape[0])
        mpu_jit.score_rows_dual(self._support, self._slots, self._st, X, cols, out)
        return out

    def _learn_rows(self, X: np.ndarray, cols: np.ndarray, targets: np.ndarray) -> None:
        mpu_jit.learn_rows_dual(
            self._support, self._slots, self._st, self._gram, self._margins, X, cols, targets
        )

    def _replay(self, count: int) -> int:
        return mpu_jit.replay_dual(self._slots, self._st, self._gram, self._margins, count)


def _form(params: dict) -> tuple[type, dict]:
    """The form class that `MPUClassifier` params name (kernel None: the linear form) and the
    params it takes (the linear form takes no kernel params)."""
    if params.get("kernel") is None:
        return LinearMPUClassifier, {k: v for k, v in params.items() if k not in KERNEL_PARAMS}
    return KernelMPUClassifier, dict(params)


@state.register
class MPUClassifier(abc.ABC):
    """Margin Perceptron with Unlearning: a perceptron that approximates the L1-SVM online.

    The public name of both forms (the rule and its constants are described in
    `streammargin.mpu`): `MPUClassifier(...)` returns a `LinearMPUClassifier` for `kernel=None`
    (the default), a `KernelMPUClassifier` otherwise, and both are instances of it
    (`isinstance(model, MPUClassifier)`). `streammargin.from_state` restores the checkpoints
    saved when the MPU was one class (the state's model "MPUClassifier") as the form their
    `kernel` param names.

    Parameters
    ----------
    C
        The SVM penalty Cp (a positive finite number) in the units of the features as given
        (I = floor(C b) + 1, so the penalty actually solved for is I / b, within 1 / b of C);
        `None` for the hard margin (I = infinity); `"auto"` (the default) for 0.01 in the linear
        form and 1.0 with a kernel, the best of 0.01-10 for each form in mean accuracy over 8
        streams (`benchmarks/model_selection.py`: the kernel form 0.890 at C = 1, 0.803 at
        0.01; the linear form 0.800 at 0.01, 0.754 at 1).
    epsilon
        Before-run accuracy (eq. 23), in [1e-12, 1e12], that sets b = db (2 + epsilon) /
        epsilon: smaller values approximate the SVM on the cache more closely with finer steps.
    gap
        db / R^2, in (1, 1e12] (the paper uses 3).
    budget
        Capacity of the replay cache (patterns), an integer in [1, 100000]; in [1, 10000] with a
        kernel, whose Gram matrix holds budget x budget floats (800 MB at the bound).
    replay
        Cached patterns presented again after each new example, an integer in [0, 10000]. The
        default 16 is the best of 4-16 in mean accuracy over the 10 streams of
        `benchmarks/model_selection.py` for both forms (kernel 0.904 against 0.893 at 4, the
        20-feature hyperplane 0.859 against 0.826; linear 0.819 against 0.817).
    unlearn
        `False` turns unlearning off: the classic margin perceptron (with the cap I) on the same
        cache, replays and evictions. For comparisons.
    kernel
        `None` for the linear (primal) form, or "rbf", "poly", "linear" for the dual form.
    gamma, degree, coef0
        Kernel parameters: rbf exp(-gamma ||a - b||^2), poly (gamma a.b + coef0)^degree; gamma a
        positive finite number or `"auto"` (the default: 2 / the sum of the features' variances,
        from the first 64 records, see `streammargin.support.estimate_gamma`), degree an integer
        in [1, 100], coef0 a finite number. Validated even when the linear form ignores them.
    fit_intercept
        Augment the patterns with the constant `intercept_scale` (the paper's rho). `False` gives
        the homogeneous hyperplane of the paper's experiments.
    intercept_scale
        rho, a positive finite number. The default of 1 suits standardised features.
    max_features
        The bound on feature columns (see `streammargin.features`), an integer in [1, 2**30].
        Memory stays below `streammargin.memory.memory_bound`: budget x max_features x 8 bytes
        plus the primal weights (max_features x 8) or the budget x budget Gram matrix: 15.9 MiB
        at the defaults (linear), 24.5 MiB with a kernel.

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    >>> model = preprocessing.StandardScaler() | streammargin.MPUClassifier()
    >>> evaluate.progressive_val_score(datasets.Phishing(), model, metrics.Accuracy())
    Accuracy: 89.12%

    The default is the linear form; a pipeline names the step by its class:

    >>> mpu = model["LinearMPUClassifier"]
    >>> mpu.n_learning_steps, mpu.n_unlearning_steps, mpu.support_size, mpu.cache_size
    (8694, 2749, 457, 589)

    The kernel form, on a problem no hyperplane can learn (River's linear models score 0.51-0.55):

    >>> model = preprocessing.StandardScaler() | streammargin.MPUClassifier(
    ...     kernel="rbf", C=1.0, gamma=1.0
    ... )
    >>> evaluate.progressive_val_score(datasets.Bananas(), model, metrics.Accuracy())
    Accuracy: 89.00%

    >>> model["KernelMPUClassifier"].support_size
    999

    References
    ----------
    [^1]: Panagiotakopoulos, C. and Tsampouka, P. (2010). The Margin Perceptron with Unlearning.
    In Proceedings of the 27th International Conference on Machine Learning (ICML), 855-862.

    """

    # The classes `MPUClassifier(...)` builds (tests and tools tell a public name that builds
    # other registered classes by this attribute).
    _forms: typing.ClassVar[tuple[type, ...]] = (LinearMPUClassifier, KernelMPUClassifier)

    def __new__(  # type: ignore[misc]
        cls,
        C: float | str | None = "auto",
        epsilon: float = 0.1,
        gap: float = 3.0,
        budget: int = 1000,
        replay: int = 16,
        unlearn: bool = True,
        kernel: str | None = None,
        gamma: float | str = "auto",
        degree: int = 3,
        coef0: float = 1.0,
        fit_intercept: bool = True,
        intercept_scale: float = 1.0,
        max_features: int = 2048,
    ) -> LinearMPUClassifier | KernelMPUClassifier:
        params = dict(
            C=C, epsilon=epsilon, gap=gap, budget=budget, replay=replay, unlearn=unlearn,
            kernel=kernel, gamma=gamma, degree=degree, coef0=coef0, fit_intercept=fit_intercept,
            intercept_scale=intercept_scale, max_features=max_features,
        )
        form, form_params = _form(params)
        if form is LinearMPUClassifier:  # validated although the linear form ignores them
            validate_kernel(kernel, gamma, degree, coef0, allow_none=True)
        return form(**form_params)

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        """The parameter sets of the forms (what this builds)."""
        yield from LinearMPUClassifier._unit_test_params()
        yield from KernelMPUClassifier._unit_test_params()

    @classmethod
    def _memory_bound(cls, params: dict | None) -> int:
        """`streammargin.memory.memory_bound(MPUClassifier, params)`: the bound of the form the
        params name."""
        form, form_params = _form(dict(params or {}))
        return memory.memory_bound(form, form_params)

    @classmethod
    def from_state(
        cls, saved: typing.Any, max_bytes: int = memory.DEFAULT_MAX_STATE_BYTES
    ) -> LinearMPUClassifier | KernelMPUClassifier:
        """Restore a checkpoint saved when the MPU was one class (model "MPUClassifier", the
        kernel params and the arrays of both forms, the other form's empty) as the form its
        `kernel` param names: the same predictions and learning. The form's own `from_state`
        checks everything else; anything malformed raises `StateError`."""
        if not isinstance(saved, dict) or saved.get("model") != cls.__name__:
            raise state.StateError(f"this is not the state of a {cls.__name__}")
        params, arrays = saved.get("params"), saved.get("arrays")
        if not isinstance(params, dict) or not isinstance(arrays, dict):
            raise state.StateError(f"a {cls.__name__} state holds dicts of params and arrays")
        form, form_params = _form(params)
        if form is LinearMPUClassifier:
            kernel_params = {k: params[k] for k in KERNEL_PARAMS if k in params}
            try:
                validate_kernel(
                    None,
                    kernel_params.get("gamma", 1.0),
                    kernel_params.get("degree", 3),
                    kernel_params.get("coef0", 1.0),
                    allow_none=True,
                )
            except ValueError as error:
                raise state.StateError(f"bad parameter in the state of a {cls.__name__}: "
                                       f"{error}") from None
        unused = {"_gram", "_margins"} if form is LinearMPUClassifier else {"_weights"}
        # (a kernel form's `_gram`, saved then, is recomputed: `_recomputed_arrays`)
        for name in unused:
            array = arrays.get(name)
            if not isinstance(array, np.ndarray) or array.size != 0:
                raise state.StateError(
                    f"a {cls.__name__} state of the {form.__name__} form must hold {name} empty"
                )
        return form.from_state(
            {
                **saved,
                "model": form.__name__,
                "params": form_params,
                "arrays": {name: a for name, a in arrays.items() if name not in unused},
            },
            max_bytes=max_bytes,
        )


for _form_class in MPUClassifier._forms:
    MPUClassifier.register(_form_class)
