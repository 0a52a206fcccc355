"""The kernelized Stochastic Batch Perceptron (Cotter, Shalev-Shwartz & Srebro 2012) on a stream."""

from __future__ import annotations

import typing

import numpy as np

from streammargin import state, validation
from streammargin.base import MarginClassifier, check_max_features, check_range, check_whole
from streammargin.jit import kernels as kjit
from streammargin.jit import sbp as sbp_jit
from streammargin.jit.entry import EntryPoint
from streammargin.support import (
    CACHE_ARRAYS,
    CACHE_EXAMPLES,
    IDX,
    MATRIX,
    MAX_GRAM_BUDGET,
    VAL,
    KernelClassifier,
    validate_kernel,
)

__all__ = ["SBPClassifier"]

MAX_NU = 1e6
MAX_STEPS = 10_000  # SBP steps per example, each O(window)
MAX_SEED = 2**53 - 1  # the seed is kept exactly in the float64 state array
VALUE_MAX = 1e150  # a restored coefficient or response (see _check_restored)


@state.register
class SBPClassifier(KernelClassifier):
    """Kernelized Stochastic Batch Perceptron over a window of recent examples (Cotter et al. 2012).

    The SBP solves the slack-constrained SVM: maximise the margin gamma by which every point is
    classified, over ||w|| <= 1 in the kernel's space, after allowing a total slack of n nu (nu is
    the average slack). It is a stochastic supergradient ascent that keeps the responses
    c_i = y_i <w, phi(x_i)> of all n points: each step finds the "water level" gamma at which a
    volume n nu of water poured over the responses settles (linear time, the paper's
    divide-and-conquer), picks a point uniformly among those under water, adds the step eta_t to
    its coefficient, updates every response with one kernel row and projects w back onto the unit
    ball. The prediction is the averaged hypothesis.

    On a stream the n points are the last `window` examples: each incoming example enters the
    window (the oldest leaves, its coefficient taken out of w and of every response), then `steps`
    SBP steps run over the window. The step eta_0 / sqrt(t) of the paper stops decreasing, and the
    average of the coefficients becomes a moving average, after `window` x `steps` steps (one
    window's life): later windows are then learnt, and served, as fast as the first (see
    `streammargin.jit.sbp`). Memory is fixed: `window` stored vectors and their
    `window` x `window` Gram matrix (12.5 MB for 1250), which makes a step cost O(window) additions
    and no kernel evaluation; a new example costs `window` kernel evaluations.

    Parameters
    ----------
    nu
        The average slack allowed per point, in [0, 1e6], in the units of the margin of a
        unit-norm w. Larger values let more points inside the margin (the soft-margin
        parameter); 0 is the hard margin (each step on the worst-classified point).
    window
        Number of recent examples the SVM is solved over (the support cache's size), an integer
        in [1, 10000] (its Gram matrix holds window x window floats: 800 MB at the bound). The
        default 1250 is where the 20-feature hyperplane of `benchmarks/model_selection.py` reaches
        0.86 (0.819 at 500, 0.847 at 1000) and Bananas 0.870 (0.854 at 500); mean accuracy over
        its 10 streams 0.870 (0.863 at 500), but a drifting RandomRBF 0.759 (0.826 at 500): the
        averaged hypothesis spans window x steps steps, so a longer window follows drift slower.
    steps
        SBP steps per incoming example, an integer in [1, 10000].
    kernel
        "rbf", "poly" or "linear" (see `streammargin.support`).
    gamma
        Kernel width, a positive finite number, or `"auto"` (the default): 2 / (the sum of the
        features' variances), estimated from the first 64 records and then frozen (2 / d on d
        standardised features; see `streammargin.support.estimate_gamma`). The width in use is
        `gamma_`. A number suits a stream whose scale is known: 1.0 to 4.0 for Bananas' two
        standardised features, about 2 / d for d of them.
    degree
        Degree of the polynomial kernel, an integer in [1, 100].
    coef0
        Constant term of the polynomial kernel, a finite number.
    seed
        Seed of the uniform sampling, an integer in [0, 2**53) (a counter-based hash: a restored
        model draws the same).

    max_features
        The bound on feature columns (see `streammargin.features`), an integer in [1, 2**30]: the
        first 7/8 of them go to the first names learnt, one each; later names (and names longer than
        128 bytes) share the last eighth by a stable hash of the name, and are not stored. Every
        window example is a dense row of these columns, so memory stays below
        `streammargin.memory.memory_bound`: window x max_features x 8 bytes plus the window x window
        Gram matrix (and with gamma="auto" the first 64 records until the width is frozen), 32.7
        MiB at the defaults.

    Attributes
    ----------
    support_size : int
        Number of examples in the window.
    n_steps : int
        Number of SBP steps made.
    margin : float
        The water level gamma of the current responses: the margin the current iterate achieves on
        the window after the slack (at ||w|| <= 1).

    Probabilities come from online Platt scaling of the served score, the averaged hypothesis
    (the paper divides it by its water level, a positive scale the calibration makes moot).
    The paper's formulation has no bias; its unregularised bias needs the two-basin water filling
    of its Algorithm 3, which is not implemented here.

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    Bananas (two features) wants a narrow kernel; River's linear models score 0.51-0.55 on it.

    >>> model = preprocessing.StandardScaler() | streammargin.SBPClassifier(gamma=2.0)
    >>> evaluate.progressive_val_score(datasets.Bananas(), model, metrics.Accuracy())
    Accuracy: 87.75%

    >>> model["SBPClassifier"].support_size
    1250

    References
    ----------
    [^1]: Cotter, A., Shalev-Shwartz, S., & Srebro, N. (2012). The kernelized stochastic batch
    perceptron. Proceedings of the 29th International Conference on Machine Learning, 943-950.

    """

    _n_fields = sbp_jit.N_FIELDS
    _layout = sbp_jit.LAYOUT
    # decision(S, slots, st, idx, val) and learn(S, slots, gram, st, idx, val, target).
    _entry_points = {
        **MarginClassifier._entry_points,
        "_decision_entry": (EntryPoint(sbp_jit.decision, *CACHE_EXAMPLES, IDX, VAL), CACHE_ARRAYS),
        "_learn_entry": (
            EntryPoint(sbp_jit.learn, MATRIX, MATRIX, MATRIX, CACHE_EXAMPLES[2], IDX, VAL, 1.0),
            ("_support", "_slots", "_gram", "_st"),
        ),
    }

    def __init__(
        self,
        nu: float = 0.1,
        window: int = 1250,
        steps: int = 5,
        kernel: str = "rbf",
        gamma: float | str = "auto",
        degree: int = 3,
        coef0: float = 1.0,
        seed: int = 0,
        max_features: int = 2048,
    ):
        validation.real_in("nu", nu, 0.0, MAX_NU)
        validation.integer_in("window", window, 1, MAX_GRAM_BUDGET)
        validation.integer_in("steps", steps, 1, MAX_STEPS)
        validate_kernel(kernel, gamma, degree, coef0)
        validation.integer_in("seed", seed, 0, MAX_SEED)
        check_max_features(max_features)
        self.nu = nu
        self.window = int(window)
        self.steps = int(steps)
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.seed = int(seed)
        self.max_features = int(max_features)
        self._reset()

    @property
    def budget(self) -> int:
        """The support cache's size: the window."""
        return self.window

    _budget_param = "window"

    @classmethod
    def _extra_array_bytes(cls, params: dict, budget: int, columns: int) -> int:
        return 8 * budget * budget  # the Gram matrix (derived, not saved)

    def _model_values(self) -> tuple[float, ...]:
        return (float(self.nu), float(self.steps), float(self.seed))

    def _reset(self) -> None:
        super()._reset()
        self._st[sbp_jit.NU], self._st[sbp_jit.STEPS], self._st[sbp_jit.SEED] = self._model_values()
        self._st[sbp_jit.HORIZON] = self.window * self.steps
        self._gram = self._zeroed("_gram", (self.window, self.window))
        self._bind()

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {"window": 60}
        yield {"kernel": "poly", "degree": 2, "gamma": 0.5, "window": 25, "steps": 3}
        yield {"kernel": "linear", "nu": 0.0, "window": 10, "steps": 1, "max_features": 3}
        yield {"nu": 2.0, "window": 40, "steps": 8, "gamma": 0.1}

    # Numeric core ---------------------------------------------------------------------------------

    def _score(self, idx: np.ndarray, val: np.ndarray) -> float:
        return self._decision_entry(self._support, self._slots, self._st, idx, val)

    def _learn(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        self._learn_entry(self._support, self._slots, self._gram, self._st, idx, val, target)

    def _score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.empty(X.shape[0])
        sbp_jit.decision_rows(self._support, self._slots, self._st, X, cols, out)
        return out

    def _learn_rows(self, X: np.ndarray, cols: np.ndarray, targets: np.ndarray) -> None:
        sbp_jit.learn_rows(self._support, self._slots, self._gram, self._st, X, cols, targets)

    def _check_restored(self) -> None:
        """The invariants of `streammargin.jit.sbp`'s state: coefficients and their averages
        non-negative (steps add eta > 0, the projection divides), one draw per step, steps
        within trials x `steps`; magnitudes of the coefficients and responses within VALUE_MAX,
        which keeps a step's products finite. The Gram matrix is rebuilt, not checked."""
        st, slots = self._st, self._slots
        st[sbp_jit.NU], st[sbp_jit.STEPS], st[sbp_jit.SEED] = self._model_values()
        st[sbp_jit.HORIZON] = self.window * self.steps
        super()._check_restored()
        size = int(st[kjit.ST_SIZE])
        # An eviction may leave ||w|| above 1 until the next step projects, and with kernel
        # values clamped at MAX_KERNEL (no longer positive definite) the running ||w||^2 can
        # even turn negative (measured: -1e50, poly kernel, values of 1e300).
        check_range("SBP ||w||^2", st[sbp_jit.R2], -1e300, 1e300)
        check_range("SBP coefficients", slots[:size, kjit.COEF], 0.0, VALUE_MAX)
        check_range("SBP averaged coefficients", slots[:size, sbp_jit.AVG], 0.0, VALUE_MAX)
        check_range("SBP responses", slots[:size, sbp_jit.RESP], -VALUE_MAX, VALUE_MAX)
        check_whole("SBP steps", st[sbp_jit.STEPS_DONE], 0.0, st[kjit.ST_TRIALS] * self.steps)
        if st[sbp_jit.DRAWS] != st[sbp_jit.STEPS_DONE]:
            raise state.StateError("state field SBP draws must equal the steps taken")
        # The Gram matrix is derived state (`_reset` allocated it): rebuilt exactly as learning
        # filled it.
        sbp_jit.rebuild_gram(self._support, self._slots, self._st, self._gram)

    # Inspection -----------------------------------------------------------------------------------

    @property
    def n_steps(self) -> int:
        return int(self._st[sbp_jit.STEPS_DONE])

    @property
    def margin(self) -> float:
        size = self.support_size
        buf = self._slots[:size, sbp_jit.RESP].copy()
        return float(sbp_jit.find_gamma(buf, size, size * self.nu))

    @property
    def counters(self) -> dict[str, int]:
        """Counters a monitoring process reports (the Kafka worker's metrics)."""
        return {
            "support_size": self.support_size,
            "trials": self.n_trials,
            "steps": self.n_steps,
            **self._feature_counters(),
        }


