"""The Margin Perceptron with Unlearning (Panagiotakopoulos & Tsampouka 2010), online.

`MPUClassifier` is the online learner, linear (primal weights) or kernel (dual over its replay
cache). The paper's batch L1-SVM solver is `streammargin.mpu_batch.fit_batch` (also importable
from here, as before).
"""

from __future__ import annotations

import typing

import numpy as np

from streammargin import state, validation
from streammargin.base import (
    check_close,
    check_max_features,
    check_range,
    check_whole,
    check_zero,
)
from streammargin.jit import kernels as kjit
from streammargin.jit import mpu as mpu_jit
from streammargin.mpu_batch import dual_objective, fit_batch, objective
from streammargin.support import (
    MAX_BUDGET,
    MAX_GRAM_BUDGET,
    KernelClassifier,
    grown_columns,
    validate_kernel,
)

__all__ = ["MPUClassifier", "fit_batch", "objective", "dual_objective"]

# Bounds of the params: b / R^2 = gap (2 + epsilon) / epsilon stays below 1e36.
MIN_EPSILON, MAX_EPSILON = 1e-12, 1e12
MAX_GAP = 1e12
MAX_REPLAY = 10_000  # replays per example, each O(features) or O(budget)


def _margin_ratio(epsilon: float, gap: float) -> float:
    """b / R^2 for the before-run accuracy epsilon (eq. 23): epsilon = 2 r / (1 - r), r = db / b."""
    return gap * (2.0 + epsilon) / epsilon


@state.register
class MPUClassifier(KernelClassifier):
    """Margin Perceptron with Unlearning: a perceptron that approximates the L1-SVM online.

    Patterns are augmented with a constant rho (for the bias) and multiplied by their label,
    z = y [x, rho]; the weight vector is a = sum_k I_k z_k with integer dual counts I_k. On
    presenting pattern k at margin s = a . z_k the paper's rule is

        s <= b       and I_k < I:  learning     a += z_k,  I_k += 1
        s >= b + db  and I_k > 0:  unlearning   a -= z_k,  I_k -= 1

    applied as multiple updates (Section 4): all the steps that presenting z_k again and again would
    make, at the cost of one inner product. With the cap I the algorithm converges to an
    approximation of the L1-SVM min_w 1/2 ||w||^2 + Cp sum_k max(0, 1 - w . z_k) with w = a / b and
    Cp = I / b; without cap (`C=None`) to the hard-margin SVM. The gap db must exceed R^2 (R: the
    largest ||z_k||), else learning and unlearning undo each other for ever.

    On a stream unlearning needs patterns to be seen again (the paper says so), so the model keeps
    the patterns that were margin violators when they arrived in a bounded *replay cache* and
    presents `replay` of them again, round robin, after each new example. The weights are always
    sum_k I_k z_k over the cache: when the cache is full, the oldest pattern with I_k = 0 is evicted
    (else the oldest one) and its whole contribution leaves the weights. Memory is bounded by
    `budget` patterns.

    How the paper's constants are set. R is the largest norm seen so far, and the paper's db =
    3 R^2 generalises to db = `gap` R^2. Remark 4 turns a penalty Cp and an accuracy epsilon into
    b = db (2 + epsilon) / epsilon and I = floor(Cp b) + 1: the before-run bound (eq. 23) then
    guarantees, at convergence, (J - J_opt) / J_opt < epsilon. As R grows, db, b and I grow with
    R^2, and every I_k is multiplied by the same factor (rounded), so that the dual variables
    alpha_k = I_k / b, hence the learnt SVM, are kept. Everything is computed in units of R, which
    makes the model invariant to a rescaling of the features and keeps any finite input finite.

    `replay_cache(sweeps)` presents the whole cache again without a new example (for idle time):
    repeated until it returns 0, it leaves the cache at a fixed point of the rule, where the
    before-run bound (eq. 23) holds for the SVM on the cached patterns.

    The linear form (`kernel=None`) keeps the primal weights: a prediction costs O(features), a
    replay O(features). The kernel form keeps the cache's Gram matrix and the margins of all cached
    patterns, augmented as K(x, x') + rho^2: a prediction costs `budget` kernel evaluations and a
    replay O(budget) (memory budget^2 floats).

    Parameters
    ----------
    C
        The SVM penalty Cp (a positive finite number) in the units of the features as given
        (I = floor(C b) + 1, so the penalty actually solved for is I / b, within 1 / b of C);
        `None` for the hard margin (I = infinity). The default suits the linear form on
        standardised features over a cache of about 1000 patterns (benchmarks/mpu.py); an RBF
        kernel usually wants C near 1.
    epsilon
        Before-run accuracy (eq. 23), in [1e-12, 1e12], that sets b = db (2 + epsilon) /
        epsilon: smaller values approximate the SVM on the cache more closely with finer steps.
    gap
        db / R^2, in (1, 1e12] (the paper uses 3).
    budget
        Capacity of the replay cache (patterns), an integer in [1, 100000]; in [1, 10000] with a
        kernel, whose Gram matrix holds budget x budget floats (800 MB at the bound).
    replay
        Cached patterns presented again after each new example, an integer in [0, 10000].
    unlearn
        `False` turns unlearning off: the classic margin perceptron (with the cap I) on the same
        cache, replays and evictions. For comparisons.
    kernel
        `None` for the linear (primal) form, or "rbf", "poly", "linear" for the dual form.
    gamma, degree, coef0
        Kernel parameters: rbf exp(-gamma ||a - b||^2), poly (gamma a.b + coef0)^degree; gamma a
        positive finite number, degree an integer in [1, 100], coef0 a finite number. Validated
        even when the linear form ignores them.
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
        weights (max_features x 8) or the budget x budget Gram matrix, 15.9 MiB at the defaults.

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

    The raw score `decision_one(x)` is the SVM decision value w . [x, rho] (margin boundaries at
    +-1). Probabilities come from the package's online Platt scaling of that score, fitted on each
    example before the model learns from it; `predict_one` serves the sign of the score or the
    calibrated argmax, whichever made fewer errors on the last thousand or so labelled examples
    (`streammargin.jit.calibration.decide`).

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    >>> model = preprocessing.StandardScaler() | streammargin.MPUClassifier()
    >>> evaluate.progressive_val_score(datasets.Phishing(), model, metrics.Accuracy())
    Accuracy: 88.80%

    >>> mpu = model["MPUClassifier"]
    >>> mpu.n_learning_steps, mpu.n_unlearning_steps, mpu.support_size, mpu.cache_size
    (8010, 2009, 462, 581)

    The kernel form, on a problem no hyperplane can learn (River's linear models score 0.51-0.55):

    >>> model = preprocessing.StandardScaler() | streammargin.MPUClassifier(
    ...     kernel="rbf", C=1.0, gamma=1.0
    ... )
    >>> evaluate.progressive_val_score(datasets.Bananas(), model, metrics.Accuracy())
    Accuracy: 88.62%

    >>> model["MPUClassifier"].support_size
    1000

    References
    ----------
    [^1]: Panagiotakopoulos, C. and Tsampouka, P. (2010). The Margin Perceptron with Unlearning.
    In Proceedings of the 27th International Conference on Machine Learning (ICML), 855-862.

    """

    _first_column = 0
    _n_fields = mpu_jit.N_FIELDS
    _n_model_state = mpu_jit.N_MODEL_STATE
    _state_arrays = ("_support", "_slots", "_st", "_weights", "_gram", "_margins")

    def __init__(
        self,
        C: float | None = 0.01,
        epsilon: float = 0.1,
        gap: float = 3.0,
        budget: int = 1000,
        replay: int = 4,
        unlearn: bool = True,
        kernel: str | None = None,
        gamma: float = 1.0,
        degree: int = 3,
        coef0: float = 1.0,
        fit_intercept: bool = True,
        intercept_scale: float = 1.0,
        max_features: int = 2048,
    ):
        validation.optional(validation.positive_real, "C", C)
        validation.real_in("epsilon", epsilon, MIN_EPSILON, MAX_EPSILON)
        validation.real_in("gap", gap, 1.0, MAX_GAP, low_open=True)
        validate_kernel(kernel, gamma, degree, coef0, allow_none=True)
        max_budget = MAX_BUDGET if kernel is None else MAX_GRAM_BUDGET
        validation.integer_in("budget", budget, 1, max_budget)
        validation.integer_in("replay", replay, 0, MAX_REPLAY)
        validation.boolean("unlearn", unlearn)
        validation.boolean("fit_intercept", fit_intercept)
        validation.positive_real("intercept_scale", intercept_scale)
        check_max_features(max_features)
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

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {}
        yield {"kernel": "rbf", "gamma": 0.5, "budget": 30}
        yield {"C": None, "budget": 8, "replay": 3, "fit_intercept": False, "max_features": 5}
        yield {"kernel": "poly", "degree": 2, "budget": 12, "unlearn": False, "epsilon": 1.0}

    # Set-up ---------------------------------------------------------------------------------------

    @property
    def _primal(self) -> bool:
        return self.kernel is None

    def _hyper_values(self) -> tuple[float, ...]:
        """The hyper-parameter slots of the state array (`mpu_jit.write_hyper`), from the params."""
        return (
            _margin_ratio(self.epsilon, self.gap),
            float(self.gap),
            0.0 if self.C is None else float(self.C),
            float(self.intercept_scale) if self.fit_intercept else 0.0,
            float(self.replay),
            float(self.unlearn),
        )

    def _kernel_params(self) -> np.ndarray:
        if self._primal:  # unused by the primal form: fixed, so the ignored params do not matter
            return kjit.kernel_params("linear", 1.0, 1, 0.0)
        return super()._kernel_params()

    def _reset(self) -> None:
        super()._reset()  # the cache, and `st` with the kernel and the calibration
        mpu_jit.write_hyper(self._st, *self._hyper_values())
        self._st[mpu_jit.CAP] = 1.0
        primal, budget = self._primal, self.budget
        self._weights = np.zeros(self._support.shape[1] if primal else 0)
        self._gram = np.zeros((0, 0) if primal else (budget, budget))
        self._margins = np.zeros(0 if primal else budget)

    def _reserve(self, n_columns: int) -> None:
        if n_columns > self._support.shape[1]:
            self._support = grown_columns(self._support, n_columns, self._max_columns)
            if self._primal:  # the primal loops run over the columns of S and of the weights alike
                weights = np.zeros(self._support.shape[1])
                weights[: self._weights.shape[0]] = self._weights
                self._weights = weights

    @classmethod
    def _extra_array_bytes(cls, params: dict, budget: int, columns: int) -> int:
        if params.get("kernel") is None:
            return 8 * columns  # the primal weights
        return 8 * (budget * budget + budget)  # the Gram matrix and the margins

    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        budget = self.budget
        primal = self._primal
        return {
            **super()._state_shapes(n_columns, values),
            "_weights": (self._capacity(n_columns),) if primal else (0,),
            "_gram": (0, 0) if primal else (budget, budget),
            "_margins": (0,) if primal else (budget,),
        }

    def _check_restored(self) -> None:
        """The invariants of `streammargin.jit.mpu`'s state: the counts I_k whole numbers in
        [0, I] and COUNT_SUM their sum, I = floor(Cp b) + 1 for
        the current R (1 before any pattern), R = 0 or at least R_MIN, z_k / R of norm in (0, 1]
        and the weights (a / R) or margins (a . z_k / R^2) within sum_k I_k, as
        a = sum_k I_k z_k makes them; the Gram matrix symmetric, its diagonal ||z_k||^2 / R^2,
        its entries within [-1, 1] (Cauchy-Schwarz), zero past the cache; whole counters."""
        st, slots = self._st, self._slots
        # The params are the source of truth for the hyper-parameter slots.
        mpu_jit.write_hyper(st, *self._hyper_values())
        super()._check_restored()  # a whole cache size within the budget, the kernel, ...
        if self._primal and self._weights.shape != (self._support.shape[1],):
            raise state.StateError("MPU weights do not match the cache's columns")
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
        # Whole numbers add exactly while the sums stay below 2**53 (the hard margin's cap is
        # 2**53 itself, beyond which they round).
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
        bound = total * (1.0 + 1e-6) + 1e-6 * (1.0 + cap)
        if self._primal:
            check_zero("MPU weights past the feature columns",
                       self._weights[self._features.n_columns :])
            check_range("MPU weights", self._weights, -bound, bound)
            check_range("MPU bias", st[mpu_jit.BIAS], -bound, bound)
        else:
            check_zero("MPU bias (kernel form)", st[mpu_jit.BIAS])
            gram, margins = self._gram, self._margins
            check_zero("MPU Gram matrix past the cache", gram[size:])
            check_zero("MPU Gram matrix past the cache", gram[:, size:])
            check_zero("MPU margins past the cache", margins[size:])
            if not np.array_equal(gram, gram.T):
                raise state.StateError("state field MPU Gram matrix must be symmetric")
            if not np.array_equal(np.diag(gram)[:size], z_sq):
                raise state.StateError("state field MPU Gram diagonal must be ||z_k||^2 / R^2")
            check_range("MPU Gram matrix", gram, -1.0, 1.0)
            check_range("MPU margins", margins, -bound, bound)

    # Numeric core ---------------------------------------------------------------------------------

    def _score(self, idx: np.ndarray, val: np.ndarray) -> float:
        if self._primal:
            return mpu_jit.primal_score(self._weights, self._st, idx, val)
        return mpu_jit.dual_score(self._support, self._slots, self._st, idx, val)

    def _proba(self, idx: np.ndarray, val: np.ndarray) -> float:
        if self._primal:
            return mpu_jit.primal_proba(self._weights, self._st, idx, val)
        return mpu_jit.dual_proba(self._support, self._slots, self._st, idx, val)

    def _learn(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        if self._primal:
            mpu_jit.learn_primal(
                self._support, self._slots, self._st, self._weights, idx, val, target
            )
        else:
            mpu_jit.learn_dual(
                self._support, self._slots, self._st, self._gram, self._margins, idx, val, target
            )

    def _score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.empty(X.shape[0])
        if self._primal:
            mpu_jit.score_rows_primal(self._weights, self._st, X, cols, out)
        else:
            mpu_jit.score_rows_dual(self._support, self._slots, self._st, X, cols, out)
        return out

    def _learn_rows(self, X: np.ndarray, cols: np.ndarray, targets: np.ndarray) -> None:
        if self._primal:
            mpu_jit.learn_rows_primal(
                self._support, self._slots, self._st, self._weights, X, cols, targets
            )
        else:
            mpu_jit.learn_rows_dual(
                self._support, self._slots, self._st, self._gram, self._margins, X, cols, targets
            )

    def replay_cache(self, sweeps: int = 1) -> int:
        """Present every cached pattern `sweeps` more times (round robin) with the paper's rule.

        What `learn_one` does `replay` times after each example, without a new one: a consumer
        can call it when idle to bring the model closer to the SVM on its cache. Returns the number
        of updates (0: the cache is a fixed point of the rule).
        """
        count = sweeps * self.cache_size
        if self._primal:
            return mpu_jit.replay_primal(self._support, self._slots, self._st, self._weights, count)
        return mpu_jit.replay_dual(self._slots, self._st, self._gram, self._margins, count)

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
    def weights(self) -> dict:
        """Feature name -> weight of w = a / b (linear form only)."""
        if not self._primal:
            raise AttributeError("a kernel MPUClassifier has no primal weights")
        scale = self._svm_scale()
        return self._features.decode(self._weights * scale)

    @property
    def intercept(self) -> float:
        """The bias of w = a / b: the weight of the constant feature times rho (linear form)."""
        if not self._primal:
            raise AttributeError("a kernel MPUClassifier has no primal weights")
        return float(self._st[mpu_jit.BIAS] * self._svm_scale() * self._st[mpu_jit.RHO])

    def _svm_scale(self) -> float:
        # w = a / b = (a / R) / (b / R^2) / R
        r = self._st[mpu_jit.R_NORM]
        return 0.0 if r == 0 else 1.0 / (self._st[mpu_jit.MARGIN] * r)

    @property
    def dual_counts(self) -> np.ndarray:
        """I_k of the cached patterns, in cache order."""
        return self._slots[: self.cache_size, kjit.COEF].copy()

    @property
    def cache_size(self) -> int:
        return int(self._st[kjit.ST_SIZE])

    @property
    def support_size(self) -> int:
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
            "trials": self.n_trials,
            **self._feature_counters(),
        }
