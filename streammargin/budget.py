"""River-side plumbing shared by the dual kernel learners on a budget: the eviction policies by
name, their parameters, the seeded random stream, and the counters.

The numeric side (cached margins, the five policies, finite kernel values) is
`streammargin.jit.budget`; `BudgetPerceptron` and `KernelALMAClassifier` subclass
`BudgetKernelClassifier`.
"""

from __future__ import annotations

import secrets
import types
import typing

import numpy as np

from streammargin import state, validation
from streammargin.base import MAX_COUNT, MarginClassifier, check_range, check_whole, check_zero
from streammargin.jit import budget as bjit
from streammargin.jit import kernels as kjit
from streammargin.jit.entry import EntryPoint
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
    validate_kernel,
)

__all__ = ["BudgetKernelClassifier", "EVICTIONS", "MAX_SEED", "ServedRow", "validate_budget",
           "served_row_entry_points"]

EVICTIONS = tuple(bjit.POLICIES)  # ("random", "oldest", "smallest", "merge", "project")
# Magnitude limits of a restored state's coefficients and margins (see _check_restored).
COEF_MAX = 1e200
MARGIN_MAX = 1e250
MAX_SEED = 2**53 - 1  # seeds are exact in a float64 (the models keep them in their state array)


def validate_budget(
    kernel: object,
    gamma: object,
    degree: object,
    coef0: object,
    budget: object,
    eviction: object,
    projection_threshold: object,
    average: object,
    seed: object,
) -> None:
    """The params of a `BudgetKernelClassifier` (`ValueError` naming the bad one). The budget is
    at most `MAX_BUDGET`, or `MAX_GRAM_BUDGET` with `eviction="project"` (the Projectron keeps a
    budget x budget inverse Gram matrix)."""
    validate_kernel(kernel, gamma, degree, coef0)
    validation.one_of("eviction", eviction, EVICTIONS)
    if eviction == "merge" and kernel != "rbf":
        raise ValueError(
            "eviction='merge' (the default) merges two support vectors into one point between "
            f"them, which only the 'rbf' kernel supports; got kernel={kernel!r}: pass "
            "eviction='oldest' (or 'random', 'smallest', 'project') with it"
        )
    max_budget = MAX_GRAM_BUDGET if eviction == "project" else MAX_BUDGET
    validation.integer_in("budget", budget, 1, max_budget)
    validation.fraction("projection_threshold", projection_threshold, high_open=True)
    validation.boolean("average", average)
    validation.optional(validation.integer_in, "seed", seed, 0, MAX_SEED)


def served_row_entry_points(jit_module: types.ModuleType, learn_matrix: str) -> dict:
    """The `_entry_points` of a `ServedRow` model: the calibration's, and its numba module's
    score_keep_row(S, slots, st, idx, val, row) and learn(S, slots, st, matrix, idx, val, target,
    row), `matrix` the model's array `learn_matrix` (see `support.CACHE_ARRAYS`)."""
    return {
        **MarginClassifier._entry_points,
        "_score_keep_row_entry": (
            EntryPoint(jit_module.score_keep_row, *CACHE_EXAMPLES, IDX, VAL, VECTOR), CACHE_ARRAYS
        ),
        "_learn_entry": (
            EntryPoint(jit_module.learn, *CACHE_EXAMPLES, MATRIX, IDX, VAL, 1.0, VECTOR),
            (*CACHE_ARRAYS, learn_matrix),
        ),
    }


class ServedRow:
    """Reuse of the kernel row of a prediction by the learning step that follows it.

    Progressive validation calls `predict_one(x)` then `learn_one(x, y)`: both need the kernel
    row of x against the whole cache, the bulk of a trial's arithmetic. The prediction leaves the
    row in a scratch array (not part of the model's state) and flags it in its last entry;
    `learn` uses it only if it receives the very arrays the prediction encoded (the feature
    space returns its cached arrays for an unchanged dict) and no trial happened in between.
    """

    _row: np.ndarray
    _row_for: tuple | None
    # The model's numba module, with score_keep_row, learn, score_rows and learn_rows over
    # (S, slots, st, ...), and the attribute name of the matrix its learning step takes after the
    # cache (the Projectron's inverse Gram matrix, the budget SVM's Gram matrix).
    _jit: typing.ClassVar[types.ModuleType]
    _learn_matrix: typing.ClassVar[str]

    def _new_scratch_row(self, length: int) -> None:
        self._row = np.zeros(length)
        self._row_for = None

    def _score_keep_row(self, idx: np.ndarray, val: np.ndarray, row: np.ndarray) -> float:
        return self._score_keep_row_entry(self._support, self._slots, self._st, idx, val, row)

    def _learn(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        row = self._scratch_row(idx, val)
        matrix = getattr(self, self._learn_matrix)
        self._learn_entry(self._support, self._slots, self._st, matrix, idx, val, target, row)

    def _score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.empty(X.shape[0])
        self._jit.score_rows(self._support, self._slots, self._st, X, cols, out)
        return out

    def _learn_rows(self, X: np.ndarray, cols: np.ndarray, targets: np.ndarray) -> None:
        matrix = getattr(self, self._learn_matrix)
        self._jit.learn_rows(self._support, self._slots, self._st, matrix, X, cols, targets)

    def _score(self, idx: np.ndarray, val: np.ndarray) -> float:
        score = self._score_keep_row(idx, val, self._row)
        self._row_for = (idx, val, self._st[kjit.ST_TRIALS])
        return score

    def _scratch_row(self, idx: np.ndarray, val: np.ndarray) -> np.ndarray:
        """The scratch row for learning from (idx, val): flagged as x's row only if it is."""
        served = self._row_for
        fresh = (
            served is None
            or served[0] is not idx
            or served[1] is not val
            or served[2] != self._st[kjit.ST_TRIALS]
        )
        if fresh:
            self._row[-1] = 0.0
        self._row_for = None
        return self._row


class BudgetKernelClassifier(ServedRow, KernelClassifier):
    """A kernel classifier whose cache is kept within `budget` by an eviction policy.

    A subclass validates the params `kernel`, `gamma`, `degree`, `coef0`, `budget`, `eviction`,
    `projection_threshold`, `average` and `seed` (`validate_budget`), sets them, then calls
    `self._reset()`. Its `st` is `bjit.LAYOUT`, or that extended with its own slots (`_layout`);
    it names its numba module in `_jit` (see `ServedRow`).
    """

    _n_fields = bjit.N_FIELDS
    _layout = bjit.LAYOUT
    _state_arrays = ("_support", "_slots", "_st", "_gram_inv")
    _learn_matrix = "_gram_inv"

    @classmethod
    def _extra_array_bytes(cls, params: dict, budget: int, columns: int) -> int:
        projectron = params.get("eviction") == "project"
        return 8 * ((budget * budget if projectron else 0) + budget + 2)  # + the scratch row

    def _tracks_margins(self) -> bool:
        """Whether the policy (or the model) needs the cached margins f(s_i)."""
        return self.eviction in ("oldest", "smallest")

    def _rng_key(self) -> float:
        """The generator's key: from `seed`, or fresh entropy when `seed` is None. Only the
        'random' policy draws numbers; the others keep key 0 so that equal params give equal
        states."""
        if self.eviction != "random":
            return 0.0
        if self.seed is None:
            return float(secrets.randbits(52))
        return float(int(self.seed) % 2**52)

    def _hyper_values(self) -> dict[int, float]:
        """The `st` entries written from the params (the params are their source of truth)."""
        return {
            bjit.POLICY: float(bjit.POLICIES[self.eviction]),
            bjit.THRESHOLD: float(self.projection_threshold),
            bjit.TRACK: float(self._tracks_margins()),
            bjit.AVERAGE: float(self.average),
        }

    def _reset(self) -> None:
        super()._reset()  # the cache, `st` with the kernel and calibration entries
        self._st[bjit.RNG_KEY] = self._rng_key()
        self._st[bjit.SCALE] = 1.0
        for slot, value in self._hyper_values().items():
            self._st[slot] = value
        side = self.budget if self.eviction == "project" else 0
        self._gram_inv = np.zeros((side, side))
        self._new_scratch_row(self.budget + 2)
        self._bind()

    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        side = self.budget if self.eviction == "project" else 0
        return {**super()._state_shapes(n_columns, values), "_gram_inv": (side, side)}

    def _check_restored(self) -> None:
        """The invariants of `streammargin.jit.budget`'s state, which keep every later step
        finite. Exact ones: SCALE in [FOLD_BELOW, 1] (it only shrinks, and is folded into the
        coefficients below FOLD_BELOW), SELF = K(s_i, s_i), the cached margins equal to
        sum_j a_j K(s_i, s_j) recomputed (zero when not tracked), the averaged clock CUM_SCALE
        (a sum of SCALEs, so at most the trials) ahead of every mark, the Forgetron's damage
        Q <= 15/32 M, the Projectron's inverse Gram matrix symmetric and zero past the cache, the
        generator's key that of the params. Magnitudes: coefficients within COEF_MAX and margins
        within MARGIN_MAX, so that a product with a kernel value (at most kernels.BIG) and its
        sum over the cache stay finite; learning stays far below (a perceptron's effective
        coefficients are about 1 per mistake, kernel ALMA's eta / ||phi(x)||)."""
        st, slots = self._st, self._slots
        for slot, value in self._hyper_values().items():
            st[slot] = value
        super()._check_restored()
        size = int(st[kjit.ST_SIZE])
        trials = st[kjit.ST_TRIALS]
        key = st[bjit.RNG_KEY]
        if self.eviction != "random" or self.seed is not None:
            if key != self._rng_key():
                raise state.StateError("state field random key does not match the seed")
        check_whole("random key", key, 0.0, 2.0**52 - 1.0)
        check_whole("random draws", st[bjit.RNG_COUNTER])
        check_range("coefficient scale", st[bjit.SCALE], bjit.FOLD_BELOW, 1.0)
        for name, slot in (
            ("updates", bjit.UPDATES),
            ("evictions", bjit.EVICTIONS),
            ("merges", bjit.MERGES),
            ("projections", bjit.PROJECTIONS),
            ("changes", bjit.CHANGES),
        ):
            check_whole(name, st[slot], 0.0, trials if slot == bjit.UPDATES else MAX_COUNT)
        check_range("averaged clock", st[bjit.CUM_SCALE], 0.0, trials * (1.0 + 1e-9))
        check_range("coefficients", slots[:size, kjit.COEF], -COEF_MAX, COEF_MAX)
        if self.eviction != "project":  # only the Projectron's coefficients may change sign
            check_range("coefficients", slots[:size, kjit.COEF], 0.0, COEF_MAX)
        check_range("averaged marks", slots[:size, bjit.AVG_MARK], 0.0, st[bjit.CUM_SCALE])
        check_range("averaged coefficients", slots[:size, bjit.AVG_BASE], -COEF_MAX, COEF_MAX)
        summed = slots[:size, bjit.AVG_BASE] + slots[:size, kjit.COEF] * (
            st[bjit.CUM_SCALE] - slots[:size, bjit.AVG_MARK]
        )
        check_range("averaged coefficients", summed, -COEF_MAX, COEF_MAX)
        if not np.array_equal(slots[:size, bjit.SELF], self._self_kernels()):
            raise state.StateError("state field SELF does not match K(s_i, s_i)")
        self._check_margins()
        mistakes = st[bjit.UPDATES]
        # Q <= 15/32 M by the choice of phi; a damage is at least -2 sigma mu.
        check_range("Forgetron damage", st[bjit.FORGETRON_Q], -COEF_MAX,
                    15.0 / 32.0 * mistakes * (1.0 + 1e-9) + 1e-9)
        gram_inv = self._gram_inv
        if gram_inv.size:
            check_zero("inverse Gram matrix past the cache", gram_inv[size:])
            check_zero("inverse Gram matrix past the cache", gram_inv[:, size:])
            if not np.array_equal(gram_inv, gram_inv.T):
                raise state.StateError("state field inverse Gram matrix must be symmetric")
            check_range("inverse Gram matrix", gram_inv, -COEF_MAX, COEF_MAX)

    def _check_margins(self) -> None:
        """Cached margins MARGIN_i = sum_j a_j K(s_i, s_j): 0 when not tracked, else within
        MARGIN_MAX. They are not compared with their recomputed values: between two refreshes
        they are updated incrementally, and with kernel values near the clamp (kernels.BIG) the
        terms of a removed vector can dwarf the margin left, so that learning itself keeps a
        margin far from its exact value (measured: 0.7 for -1.4e76 after an eviction, poly
        kernel, values of 1e300)."""
        size = int(self._st[kjit.ST_SIZE])
        margins = self._slots[:size, bjit.MARGIN]
        if not self._tracks_margins():
            check_zero("cached margins (not tracked)", margins)
        check_range("cached margins", margins, -MARGIN_MAX, MARGIN_MAX)

    # Inspection -----------------------------------------------------------------------------------

    @property
    def n_updates(self) -> int:
        """Update steps taken (mistakes for a perceptron, corrections for ALMA)."""
        return int(self._st[bjit.UPDATES])

    @property
    def counters(self) -> dict[str, int]:
        """Counters a monitoring process reports (the Kafka worker's metrics)."""
        return {
            "support_size": self.support_size,
            "trials": self.n_trials,
            "updates": self.n_updates,
            "evictions": int(self._st[bjit.EVICTIONS]),
            "merges": int(self._st[bjit.MERGES]),
            "projections": int(self._st[bjit.PROJECTIONS]),
            **self._feature_counters(),
        }

    @property
    def support_vectors(self) -> list[tuple[dict, bool, float]]:
        """The cache as (vector, label, weight) triples: f(x) = sum weight * K(vector, x) with
        the label's sign (a Projectron weight may change sign)."""
        out = []
        scale = self._st[bjit.SCALE]
        for i in range(self.support_size):
            vector = {
                name: float(self._support[i, self._features.index[name]])
                for name in self._features.names
                if self._support[i, self._features.index[name]] != 0.0
            }
            label = bool(self._slots[i, kjit.LABEL] > 0)
            out.append((vector, label, float(scale * self._slots[i, kjit.COEF])))
        return out
