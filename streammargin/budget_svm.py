"""The budget L1-SVM of Dekel & Singer (2006), re-optimised by SMO as examples arrive."""

from __future__ import annotations

import typing

import numpy as np

from streammargin import state, validation
from streammargin.base import (
    binary_target,
    check_close,
    check_max_features,
    check_range,
    check_whole,
    check_zero,
)
from streammargin.budget import ServedRow, served_row_entry_points
from streammargin.jit import budget_svm as svm_jit
from streammargin.jit import kernels as kjit
from streammargin.jit.entry import EntryPoint
from streammargin.support import (
    CACHE_ARRAYS,
    CACHE_EXAMPLES,
    IDX,
    MATRIX,
    MAX_GRAM_BUDGET,
    VAL,
    VECTOR,
    KernelClassifier,
    validate_kernel,
)

__all__ = ["BudgetSVMClassifier", "budget_svm_dual"]

MAX_C = 1e6  # upper bound of the box C (and of every a_i)
MAX_SMO_STEPS = 10_000  # SMO steps per example, each O(budget)
MAX_TOL = 1e6


@state.register
class BudgetSVMClassifier(ServedRow, KernelClassifier):
    """Budget L1-SVM (Dekel & Singer 2006) on a stream, with at most `budget` support vectors.

    Dekel and Singer replace the sum of the hinge losses in the SVM objective by the sum of the B
    largest (the 1-inf interpolation norm), so that only the B worst-classified examples count:

        min_f 1/2 ||f||^2 + C (sum of the B largest max(0, 1 - y_i f(x_i))),

    whose dual is the SVM dual with one more constraint,

        max_a sum_i a_i - 1/2 sum_ij a_i a_j y_i y_j K(x_i, x_j),  0 <= a_i <= C,  sum a_i <= B C,

    and at the optimum every example better classified than the B-th worst has a_i = 0
    (Theorem 2). Here B = `budget`, and the dual is solved by an SMO adapted to the sum constraint
    (`streammargin.jit.budget_svm`) over a cache of at most `budget` examples plus the arriving
    one. An example that violates the optimality conditions of the cached problem enters with
    a = 0 and SMO takes up to `smo_steps` pair steps, the first one on it. Examples with a = 0 that
    satisfy the conditions leave the cache (they do not change f). When it still holds budget + 1
    examples, one with a = 0 leaves if there is one, else `prune` decides. The cache's Gram matrix
    is kept so that a step costs O(budget) arithmetic and no kernel evaluation.

    The paper's corollary, at most B support vectors, needs the B-th and (B+1)-th margins to
    differ. At the optimum they usually do not: minimising the sum of the B largest losses
    equalises them, every free support vector sits on the B-th margin, and more than B examples
    keep a > 0 (breast cancer, RBF, B = 3: 44 of 120; `benchmarks/kernel_models.py`). This is why
    the paper's own experiments prune to the B largest weights, and why this model prunes.

    On a stream, "the B worst-classified examples" are sooner or later the mislabelled ones:
    with `prune="smallest"`, the paper's pruning heuristic (keep the B largest weights), they sit at
    a = C and crowd the cache (0.61 accuracy on Bananas; with 10% flipped labels, 37% of the cache
    is mislabelled). `prune="oldest"` (the default) removes the oldest example instead, so the
    model is the budget SVM of the recent margin violators; it also follows drift.

    There is no bias term (hence no equality constraint sum y_i a_i = 0): the calibrated
    probabilities can carry the threshold. `predict_one` serves the sign of the score or the
    calibrated argmax, whichever made fewer errors on the last thousand or so labelled examples
    (`streammargin.jit.calibration.decide`).

    Parameters
    ----------
    kernel
        `"rbf"` exp(-gamma ||a - b||^2), `"poly"` (gamma a.b + coef0)^degree or `"linear"` a.b.
    gamma
        Kernel width, a positive finite number, or `"auto"` (the default): 2 / (the sum of the
        features' variances), estimated from the first 64 records and then frozen (2 / d on d
        standardised features; see `streammargin.support.estimate_gamma`). The width in use is
        `gamma_`. A number suits a stream whose scale is known: 1.0 to 4.0 for Bananas' two
        standardised features, about 2 / d for d of them.
    degree
        Degree of the polynomial kernel, an integer in [1, 100].
    coef0
        Constant of the polynomial kernel, a finite number.
    C
        Box constraint, in (0, 1e6]: the weight of the hinge losses of the `budget` worst
        examples.
    budget
        B: maximum number of support vectors, and of cached examples, an integer in [1, 10000]
        (the cache's Gram matrix holds (budget + 1)^2 floats: 800 MB at the bound). The default
        500 is the best of 200-500 in mean accuracy over the 10 streams of
        `benchmarks/model_selection.py` (0.913 against 0.900 at 200; the 20-feature hyperplane
        0.858 against 0.822: a near-linear concept in 20 dimensions needs more RBF centres).
    prune
        Which example leaves an over-full cache when none has a = 0: `"oldest"` or `"smallest"`
        (smallest a, the paper's pruning heuristic).
    smo_steps
        SMO pair steps per example that enters the cache (the re-optimisation effort), an
        integer in [1, 10000].
    tol
        Optimality tolerance on the gradient gap, in (0, 1e6].

    max_features
        The bound on feature columns (see `streammargin.features`), an integer in [1, 2**30]: the
        first 7/8 of them go to the first names learnt, one each; later names (and names longer than
        128 bytes) share the last eighth by a stable hash of the name, and are not stored. Every
        cached example is a dense row of these columns, so memory stays below
        `streammargin.memory.memory_bound`: (budget + 1) x max_features x 8 bytes plus the (budget +
        1)^2 Gram matrix (and with gamma="auto" the first 64 records until the width is frozen),
        11.0 MiB at the defaults.

    Attributes
    ----------
    support_size : int
        Number of cached examples (at most `budget`); `n_support` counts those with a > 0.
    counters : dict
        Support size, trials, examples added, support vectors pruned, examples released, SMO
        steps.

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    >>> model = preprocessing.StandardScaler() | streammargin.BudgetSVMClassifier()
    >>> evaluate.progressive_val_score(datasets.Bananas(), model, metrics.Accuracy())
    Accuracy: 88.79%

    >>> svm = model["BudgetSVMClassifier"]
    >>> svm.support_size, svm.counters["added"], svm.counters["pruned"]
    (500, 2871, 706)

    References
    ----------
    [^1]: Dekel, O. and Singer, Y. (2006). Support vector machines on a budget. NIPS 19.
    [^2]: Platt, J. (1998). Fast training of support vector machines using sequential minimal
    optimization. Advances in Kernel Methods.
    [^3]: Fan, R.-E., Chen, P.-H. and Lin, C.-J. (2005). Working set selection using second order
    information for training support vector machines. JMLR, 6, 1889-1918.

    """

    _n_fields = svm_jit.N_FIELDS
    _layout = svm_jit.LAYOUT
    # The Gram matrix is not saved: `_check_restored` recomputes it, bit for bit (each entry from
    # the stored vectors, `jit/kernels.stored_gram`). A checkpoint is then ~1.03x the support
    # cache's bytes instead of ~10x at budget 200 (`benchmarks/checkpoint_sizes.py`).
    _state_arrays = ("_support", "_slots", "_st")
    _recomputed_arrays = ("_gram",)
    _extra_rows = 1  # the arriving example's working row
    _jit = svm_jit
    _learn_matrix = "_gram"
    _entry_points = {
        **served_row_entry_points(svm_jit, "_gram"),
        "_signed_proba_keep_row_entry": (
            EntryPoint(svm_jit.signed_proba_keep_row, *CACHE_EXAMPLES, IDX, VAL, VECTOR),
            CACHE_ARRAYS,
        ),
        "_signed_proba_then_learn_entry": (
            EntryPoint(svm_jit.signed_proba_then_learn, *CACHE_EXAMPLES, MATRIX, IDX, VAL, 1.0,
                       VECTOR),
            (*CACHE_ARRAYS, "_gram"),
        ),
    }

    def __init__(
        self,
        kernel: str = "rbf",
        gamma: float | str = "auto",
        degree: int = 3,
        coef0: float = 1.0,
        C: float = 1.0,
        budget: int = 500,
        prune: str = "oldest",
        smo_steps: int = 4,
        tol: float = 1e-3,
        max_features: int = 2048,
    ):
        validate_kernel(kernel, gamma, degree, coef0)
        validation.positive_real("C", C, MAX_C)
        validation.integer_in("budget", budget, 1, MAX_GRAM_BUDGET)
        validation.one_of("prune", prune, svm_jit.PRUNES)
        validation.integer_in("smo_steps", smo_steps, 1, MAX_SMO_STEPS)
        validation.positive_real("tol", tol, MAX_TOL)
        check_max_features(max_features)
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.C = C
        self.budget = budget
        self.prune = prune
        self.smo_steps = smo_steps
        self.tol = tol
        self.max_features = int(max_features)
        self._reset()

    def _hyper_values(self) -> dict[int, float]:
        return {
            svm_jit.C_BOX: float(self.C),
            svm_jit.CAP: float(self.budget) * float(self.C),
            svm_jit.TOL: float(self.tol),
            svm_jit.STEPS: float(self.smo_steps),
            svm_jit.PRUNE: svm_jit.PRUNES[self.prune],
        }

    def _reset(self) -> None:
        super()._reset()
        rows = self.budget + self._extra_rows
        self._gram = self._zeroed("_gram", (rows, rows))
        self._new_scratch_row(rows + 1)
        for slot, value in self._hyper_values().items():
            self._st[slot] = value
        self._bind()

    def _checked_arrays(self, arrays: typing.Any, n_columns: int, values: dict) -> dict:
        # A state saved before the slot KERNEL_PEAK existed (the last, one scalar less): its
        # peak becomes its Gram matrix's largest value, as right after a refresh of the gradients,
        # once `_check_restored` has recomputed the matrix.
        saved = self._state_short_by(arrays, svm_jit.STATE_SIZE, 1)
        legacy = saved is not None
        if legacy:
            arrays = {**arrays, "_st": np.append(saved, 0.0)}
        self._restoring_legacy_peak = legacy
        return super()._checked_arrays(arrays, n_columns, values)

    def _check_restored(self) -> None:
        """The invariants of the cached dual problem (`streammargin.jit.budget_svm`): the box
        0 <= a_i <= C, sum a_i <= B C and its running total, K_ii = K(x_i, x_i) in SELF; then
        the Gram matrix, recomputed from the cache as learning made it
        (`svm_jit.restore_gram`), with kernel values in their range ([0, 1] for RBF, clamped at
        kernels.BIG otherwise); gradients within what |1 - y_i f(x_i)| can reach with those, the
        kernel peak since the gradients were recomputed at least the Gram matrix's largest
        value; whole counters."""
        st, slots, gram = self._st, self._slots, self._gram
        for slot, value in self._hyper_values().items():
            st[slot] = value
        super()._check_restored()
        size = int(st[kjit.ST_SIZE])
        C, cap = st[svm_jit.C_BOX], st[svm_jit.CAP]
        coefs = slots[:size, kjit.COEF]
        check_range("dual coefficients", coefs, 0.0, C)
        check_range("sum of the dual coefficients", st[svm_jit.ALPHA_SUM], 0.0, cap)
        check_close("sum of the dual coefficients", st[svm_jit.ALPHA_SUM],
                    min(float(coefs.sum()), cap), 0.0, 1e-6 * cap)
        for name, slot in (
            ("examples added", svm_jit.ADDED),
            ("support vectors pruned", svm_jit.PRUNED),
            ("examples released", svm_jit.RELEASED),
            ("SMO steps", svm_jit.SMO_STEPS),
        ):
            check_whole(name, st[slot])
        check_whole("SMO steps since the refresh", st[svm_jit.SINCE_REFRESH], 0.0,
                    svm_jit.REFRESH_EVERY - 1)
        self_k = self._self_kernels()
        if not np.array_equal(slots[:size, svm_jit.SELF], self_k):
            raise state.StateError("state field SELF does not match K(x_i, x_i)")
        svm_jit.restore_gram(self._support, slots, st, gram)
        low = 0.0 if self.kernel == "rbf" else -kjit.BIG
        high = 1.0 if self.kernel == "rbf" else kjit.BIG
        check_range("Gram matrix", gram, low, high)
        largest_kernel = float(np.abs(gram).max(initial=0.0))
        if self.__dict__.pop("_restoring_legacy_peak", False):
            st[svm_jit.KERNEL_PEAK] = largest_kernel
        check_range("kernel peak since the gradients were recomputed", st[svm_jit.KERNEL_PEAK],
                    largest_kernel, high)
        largest = 1.0 + (size + 1) * C * largest_kernel
        check_range("gradients", slots[:size, svm_jit.GRAD], -largest * 1.01, largest * 1.01)

    # A labelled record's prediction and trial in one numba call when x's names are all known
    # (AutoClassifier's calls; else the base class' two calls). During the warm-up (gamma="auto")
    # one call predicts and keeps the kernel row, which the warm-up's trial then reuses.

    def _predict_then_learn(self, x: dict, y: typing.Any) -> bool:
        signed = self._signed_proba_then_learn(x, y)
        if signed is None:
            return super()._predict_then_learn(x, y)
        return signed > 0.0

    def _proba_then_learn(self, x: dict, y: typing.Any) -> float:
        signed = self._signed_proba_then_learn(x, y)
        if signed is None:
            return super()._proba_then_learn(x, y)
        return abs(signed)

    def _signed_proba_then_learn(self, x: dict, y: typing.Any) -> float | None:
        """`calibration.signed_proba` of x before the trial, then the trial; None, having changed
        nothing, if x has a name without a column (learning places it after the prediction)."""
        target = 1.0 if y is True else -1.0 if y is False else binary_target(y)
        features = self._features
        idx, val = features.encode(x, False)  # validates x's values
        if features.repeat_encoding(x) is None:
            return None
        self._reserve(features.n_columns)
        support, slots, st, row = self._support, self._slots, self._st, self._row
        if self._warming_up:
            signed = self._signed_proba_keep_row_entry(support, slots, st, idx, val, row)
            self._row_for = (idx, val, st[kjit.ST_TRIALS])  # (`ServedRow`: for the trial)
            self._warm_up(idx, val, target)
            return signed
        self._row_for = None  # (the scratch row becomes x's, then learning clears its flag)
        return self._signed_proba_then_learn_entry(support, slots, st, self._gram, idx, val, target,
                                                   row)

    @classmethod
    def _extra_array_bytes(cls, params: dict, budget: int, columns: int) -> int:
        rows = budget + cls._extra_rows
        return 8 * (rows * rows + rows + 1)  # the Gram matrix and the scratch row

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {}
        yield {"budget": 4, "kernel": "poly", "gamma": 0.5, "C": 10.0}
        yield {
            "budget": 3, "kernel": "linear", "smo_steps": 1, "prune": "smallest", "max_features": 3
        }

    # Inspection -----------------------------------------------------------------------------------

    @property
    def n_support(self) -> int:
        """Cached examples with a > 0: the support vectors proper."""
        return int(np.count_nonzero(self._slots[: self.support_size, kjit.COEF] > 0.0))

    @property
    def dual_coefs(self) -> np.ndarray:
        """a_i of the cached examples."""
        return self._slots[: self.support_size, kjit.COEF].copy()

    @property
    def dual_objective(self) -> float:
        """D(a) = sum a - 1/2 a'Qa over the cached problem."""
        n = self.support_size
        ay = self._slots[:n, kjit.COEF] * self._slots[:n, kjit.LABEL]
        return float(self._slots[:n, kjit.COEF].sum() - 0.5 * ay @ self._gram[:n, :n] @ ay)

    @property
    def counters(self) -> dict[str, int]:
        """Counters a monitoring process reports (the Kafka worker's metrics)."""
        st = self._st
        return {
            "support_size": self.support_size,
            "trials": self.n_trials,
            "added": int(st[svm_jit.ADDED]),
            "pruned": int(st[svm_jit.PRUNED]),
            "released": int(st[svm_jit.RELEASED]),
            **self._feature_counters(),
            "smo_steps": int(st[svm_jit.SMO_STEPS]),
        }


def budget_svm_dual(
    gram: np.ndarray,
    labels: np.ndarray,
    C: float,
    budget: float,
    tol: float = 1e-6,
    max_steps: int = 10_000_000,
) -> tuple[np.ndarray, int]:
    """Solve the budget L1-SVM dual on a whole data set (batch), by the same SMO steps.

    `gram` is the m x m kernel matrix, `labels` in {-1, +1}, `budget` the paper's B (a float:
    B >= m leaves the sum constraint inactive, the plain bias-free L1-SVM). Returns the dual
    coefficients a and the number of SMO steps.
    """
    gram = np.ascontiguousarray(gram, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    m = gram.shape[0]
    slots = np.zeros((m, svm_jit.N_FIELDS))
    slots[:, kjit.LABEL] = labels
    slots[:, svm_jit.GRAD] = 1.0
    slots[:, svm_jit.SELF] = np.diag(gram)
    st = np.zeros(svm_jit.STATE_SIZE)
    st[svm_jit.C_BOX] = C
    st[svm_jit.CAP] = budget * C
    st[svm_jit.TOL] = tol
    steps = svm_jit.solve(slots, st, gram, m, max_steps)
    return slots[:, kjit.COEF].copy(), int(steps)
