"""ALMA_p, the Approximate Large Margin Algorithm (Gentile 2001)."""

from __future__ import annotations

import math
import typing

import numpy as np

from streammargin import memory, state, validation
from streammargin.base import (
    InfiniteEntry,
    MarginClassifier,
    binary_target,
    check_calibration,
    check_close,
    check_max_features,
    check_range,
    check_whole,
    check_zero,
    grown,
)
from streammargin.jit import alma as alma_jit
from streammargin.jit.entry import EntryPoint

__all__ = ["ALMAClassifier"]

# Bounds of the params (documented in the class docstring).
MAX_P = 1000.0  # p = 2 ln d reaches 1000 only for d = e^500 features
MIN_ALPHA = 1e-6  # the margin scale 1 / alpha stays within MAX_SCALE
MAX_SCALE = 1e6  # upper bound of B and C
# Lower bound of C: a theta of the scale of C must keep SCALE above MIN_SCALE (see there).
MIN_C = 1e-100
MAX_INTERCEPT_SCALE = 1e100
MAX_WINDOW = 10**9
# A restored theta's scale: learning keeps it above min(S_HIGH^(-1/p), NEGLIGIBLE C) (the projection
# and `jit.alma._renormalise`): 1e-75 at the defaults, 1e-130 at C = MIN_C.
MIN_SCALE = 1e-200
# How far a restored running S may be from its exact recomputation, relative to S. Since its last
# recomputation S went through at most RECOMPUTE_EVERY corrections of nnz(x) + 1 coordinate
# updates each. An update adds |u_i'|^p - |u_i|^p to a partial sum, the norm^p of a mix of the
# old and new u, so every quantity it rounds is at most twice the peak of S: four roundings and
# the ulp of a power for p != 2 stay within 8 eps peak (eps = 2.2e-16). Learning recomputes S
# once it falls below half its peak (`jit.alma`), so peak <= 2 S, and the relative error is at
# most 4096 (nnz + 1) 16 eps = 1.5e-11 (nnz + 1), plus the recomputations' own (positive terms:
# d eps, 2.4e-7 at 2**30 columns): 1.5e-5 for records of a million features; 1e-3 only beyond
# 6.8e7 features a record with every rounding the same way (random roundings add up as the square
# root). Without the peak rule the factor peak / S is unbounded: 1.5e-6 after two records.
S_RTOL = 1e-3


# The per-record numba calls go through entry points (`streammargin.jit.entry`): half the cost of a
# dispatch is numba working out the argument types, which here are fixed by construction: the
# weight table float64[capacity, 3] and the scalars float64[STATE_SIZE], both C-ordered and
# writable (made by `_reset`, grown by `grown`, restored as such by `from_state`), checked by
# `_bind` where they are made; columns int64 from `FeatureSpace.encode_packed` and the values as
# its bytes; a float target.
_TABLE = np.zeros((1, alma_jit.N_COLUMNS))
_SCALARS = alma_jit.new_state(2.0, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0)
_IDX = np.zeros(1, dtype=np.int64)
_PACKED = bytes(8)
_NO_IDX = np.zeros(0, dtype=np.int64)  # the empty instance: no trial, or a trial run alone
_NO_TRIAL = 0.0  # the target of a prediction alone
_LEARN_THEN_PREDICT = EntryPoint(
    alma_jit.learn_then_predict, _TABLE, _SCALARS, _IDX, _PACKED, 1.0, _IDX, _PACKED
)


@state.register
class ALMAClassifier(MarginClassifier):
    """ALMA_p: Approximate Large Margin Algorithm with p-norm, exactly as in Gentile (2001).

    Each trial normalises the instance, xh = x / ||x||_p, and makes a *correction* when the margin
    is small: if y w.xh <= (1 - alpha) gamma_k with gamma_k = B sqrt(p-1) / sqrt(k), then

        w <- f^-1(f(w) + eta_k y xh),   eta_k = C / (sqrt(p-1) sqrt(k)),
        w <- w / max(1, ||w||_q),       k <- k + 1,

    where f is the p-norm link map (the identity for p = 2) and q = p / (p - 1). The weights stay
    in the unit q-ball; zero instances make no update. For p = 2 this is the algorithm of the
    paper's experiments; a large p (p = 2 ln d) suits targets that depend on few of many features.

    Each update costs O(number of nonzero features): the weights are kept in the dual space with a
    lazy scale factor (see `streammargin.jit.alma`), which is algebraically the same rule.

    Parameters
    ----------
    p
        The norm, in [2, 1000].
    alpha
        Degree of approximation to the maximal margin, in [1e-6, 1]; alpha = 1 is a
        mistake-driven p-norm perceptron with a decreasing learning rate.
    B
        Margin scale of gamma_k, in (0, 1e6]. `None` means 1 / alpha, the setting of the paper's
        experiments (ALMA_2(alpha) is shorthand for ALMA_2(alpha; 1/alpha, sqrt(2))). The paper's
        Theorem 1 part 1 states its separable-case bound for B = sqrt(8) / alpha, C = sqrt(2).
    C
        Learning-rate scale of eta_k, in [1e-100, 1e6].
    fit_intercept
        The paper's hypothesis has no bias. With `fit_intercept=True` every instance is augmented
        with a constant feature of value `intercept_scale` *before* normalisation, so the bias is
        one more weight of the same q-ball: (x, rho) / ||(x, rho)||_p. With `False` the model is
        the paper's rule verbatim.
    intercept_scale
        Value rho of the constant feature, in (0, 1e100]. Its weight's reach grows with rho
        relative to ||x||_p: the default of 1 suits standardised features; raise it towards the
        typical ||x||_p when the classes are strongly imbalanced.
    average
        Serve the averaged hypothesis: the mean of the weight vectors over the trials, each
        counted for every trial it survived. It approximates the paper's "voted" hypothesis (its
        most accurate one, Table 1) in bounded memory; learning still uses the last hypothesis.
        On by default because it is the more accurate on every stream of
        `benchmarks/alma_accuracy.py`. It costs O(nnz(x)) per trial, like the rule itself.
    average_window
        The average forgets with weights (1 - 1/average_window)^age, an effective window of that
        many trials, so that after a change of concept it follows the new weights instead of
        remembering the old ones for ever. `None` gives the plain mean over all trials; else an
        integer in [2, 10**9]. The default
        of 10,000 matches the plain mean on stationary streams (Phishing, SEA, Hyperplane, Agrawal,
        breast cancer) and raises the accuracy after an abrupt change (`streammargin demo
        --stream hyperplane`: 0.67 -> 0.79 on the second half); 1,000-3,000 adapts faster still
        (0.92) at a small cost on stationary streams.
    max_features
        The bound on feature columns (see `streammargin.features`), an integer in [1, 2**30]: the
        first 7/8 of them go to the first names learnt, one each; later names (and names longer
        than 128 bytes) share the last eighth by a stable hash of the name, and are not stored.
        Memory stays below
        `streammargin.memory.memory_bound` (24 bytes a column, plus at most 129 bytes a stored
        name: 8.6 MiB at the default 65,536 whatever the stream).

    Attributes
    ----------
    weights : dict
        Feature name -> weight of the last hypothesis.
    intercept : float
        The constant term of the last hypothesis: its weight times `intercept_scale`.
    n_corrections : int
        Number of corrections (k - 1).
    n_trials : int
        Number of examples learnt from.

    Probabilities come from an online Platt scaling of the served margin (see
    `streammargin.jit.calibration`): a sigmoid fitted by online Newton steps on each example
    before the model learns from it. They are calibrated, not a fixed squash of the margin.
    `predict_one` serves either the sign of the margin (the paper's decision, `decision_one(x) > 0`)
    or the calibrated argmax, whichever made fewer errors on the last thousand or so examples: the
    calibrated threshold lets an imbalanced problem without a linear signal fall back on the
    majority class (Agrawal f0), the sign is the better rule elsewhere.

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    >>> model = preprocessing.StandardScaler() | streammargin.ALMAClassifier(alpha=0.9)
    >>> evaluate.progressive_val_score(datasets.Phishing(), model, metrics.Accuracy())
    Accuracy: 89.28%

    >>> model["ALMAClassifier"].n_corrections
    188

    References
    ----------
    [^1]: Gentile, C. (2001). A new approximate maximal margin classification algorithm.
    Journal of Machine Learning Research, 2, 213-242.

    """

    _state_arrays = ("_vectors", "_st")
    _layout = alma_jit.LAYOUT
    _first_column = 1  # column 0: the intercept's constant feature

    def __init__(
        self,
        p: float = 2.0,
        alpha: float = 0.9,
        B: float | None = None,
        C: float = 2**0.5,
        fit_intercept: bool = True,
        intercept_scale: float = 1.0,
        average: bool = True,
        average_window: int | None = 10_000,
        max_features: int = 2**16,
    ):
        validation.real_in("p", p, 2.0, MAX_P)
        validation.real_in("alpha", alpha, MIN_ALPHA, 1.0)
        validation.optional(validation.positive_real, "B", B, MAX_SCALE)
        validation.real_in("C", C, MIN_C, MAX_SCALE)
        validation.boolean("fit_intercept", fit_intercept)
        validation.positive_real("intercept_scale", intercept_scale, MAX_INTERCEPT_SCALE)
        validation.boolean("average", average)
        validation.optional(validation.integer_in, "average_window", average_window, 2, MAX_WINDOW)
        check_max_features(max_features)
        self.p = p
        self.alpha = alpha
        self.B = B
        self.C = C
        self.fit_intercept = fit_intercept
        self.intercept_scale = intercept_scale
        self.average = average
        self.average_window = average_window
        self.max_features = int(max_features)
        self._reset()

    def _hyper_values(self) -> tuple[float, ...]:
        """The hyper-parameter slots of the state array, from the params."""
        return (
            self.p,
            self.alpha,
            1.0 / self.alpha if self.B is None else self.B,
            self.C,
            self.intercept_scale if self.fit_intercept else 0.0,
            float(self.average),
            1.0 if self.average_window is None else 1.0 - 1.0 / self.average_window,
        )

    def _reset(self) -> None:
        super()._reset()
        self._vectors = np.zeros((min(8, self._max_columns), alma_jit.N_COLUMNS))
        self._st = alma_jit.new_state(*self._hyper_values())
        # learn_one's trial, deferred to the next prediction (see learn_one): until `_flush` runs
        # it, `_vectors` and `_st` are the state before it.
        self._pending: tuple[np.ndarray, bytes, float] | None = None
        self._bind()

    _entry_points = {
        **MarginClassifier._entry_points,
        "_learn_then_predict": (_LEARN_THEN_PREDICT, ("_vectors", "_st")),
    }

    @property
    def _calibration(self) -> np.ndarray:
        self._flush()
        return self._st[alma_jit.PLATT :]

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {}
        yield {"p": 3.0, "alpha": 0.8, "average_window": None}
        yield {"alpha": 1.0, "fit_intercept": False, "average": False}
        yield {"max_features": 4}  # three names of their own, then one hashed column

    # Numeric core ---------------------------------------------------------------------------------

    def _reserve(self, n_columns: int) -> None:
        if n_columns > self._vectors.shape[0]:
            # A deferred trial indexes columns the old table already had: it runs on the copy.
            self._vectors = grown(self._vectors, n_columns, self._max_columns)
            self._bind()

    # The per-record path, written out: ALMA is the model people run at the highest rates, and at
    # 10 features a numba dispatch costs as much as the rest of a predict + learn. learn_one only
    # validates and encodes its example and leaves the trial pending (`_pending`); the next
    # prediction runs it and then scores, in one numba call, so a predict_one + learn_one pair
    # costs one dispatch. Every other reader of the state runs the pending trial first: the base
    # class' (`_flush`: to_state, pickling, mini-batches) and this class' own (`_score`,
    # `_learn`, `_calibration`, inspection), so the results are those of learning at once.

    def _signed_proba(self, x: dict) -> float:
        """+P(True) of `x` if the predicted label is True, else -P(True), after the pending trial,
        in one numba call (`jit.alma.learn_then_predict`)."""
        features = self._features
        idx, packed = features.encode_packed(x, False, False)  # checked in numba
        pending = self._pending
        try:
            if pending is None:
                return self._learn_then_predict(
                    self._vectors, self._st, _NO_IDX, b"", _NO_TRIAL, idx, packed
                )
            self._pending = None
            # (positional arguments: a call with *pending builds its argument tuple, ~60 ns)
            learn_idx, learn_packed, target = pending
            return self._learn_then_predict(
                self._vectors, self._st, learn_idx, learn_packed, target, idx, packed
            )
        except ValueError:
            features.forget_bad(x)

    def predict_one(self, x: dict, **kwargs: typing.Any) -> bool:
        return self._signed_proba(x) > 0.0

    def _p_true(self, x: dict) -> float:
        return abs(self._signed_proba(x))

    def predict_with_proba_one(self, x: dict) -> tuple[bool, dict[bool, float]]:
        signed = self._signed_proba(x)
        p_true = abs(signed)
        return signed > 0.0, {False: 1.0 - p_true, True: p_true}

    def learn_one(self, x: dict, y: typing.Any) -> None:
        target = 1.0 if y is True else -1.0 if y is False else binary_target(y)
        features = self._features
        encoded = features.repeat_encoding(x)  # the dict predict_one just encoded, usually
        if encoded is None:
            encoded = features.encode_packed(x, True)  # raises on bad input, changing nothing
            if features.n_columns > self._vectors.shape[0]:
                self._reserve(features.n_columns)
        if self._pending is not None:
            self._flush()
        idx, packed = encoded
        self._pending = (idx, packed, target)

    def _flush(self) -> None:
        """Run the deferred trial, if any."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            learn_idx, learn_packed, target = pending
            self._learn_then_predict(
                self._vectors, self._st, learn_idx, learn_packed, target, _NO_IDX, b""
            )

    def _score(self, idx: np.ndarray, val: np.ndarray) -> float:
        self._flush()
        return alma_jit.margin(self._vectors, self._st, idx, val)

    def _learn(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        self._flush()
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        self._learn_then_predict(self._vectors, self._st, idx, val.tobytes(), target, _NO_IDX, b"")

    # learn_many/predict_many find infinities as they walk the frame (no separate pass over it).
    _rows_check_infinite = True

    def _score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        # (the base class ran the pending trial)
        out = np.empty(X.shape[0])
        bad = alma_jit.margin_rows(self._vectors, self._st, X, cols, out)
        if bad >= 0:
            raise InfiniteEntry(*divmod(bad, X.shape[1]))
        return out

    def _learn_rows(self, X: np.ndarray, cols: np.ndarray, targets: np.ndarray) -> None:
        # (the base class ran the pending trial)
        saved = self._vectors.copy(), self._st.copy()
        bad = alma_jit.learn_rows(self._vectors, self._st, X, cols, targets)
        if bad >= 0:
            self._vectors, self._st = saved
            self._bind()
            raise InfiniteEntry(*divmod(bad, X.shape[1]))

    @classmethod
    def _max_array_bytes(cls, params: dict) -> int:
        columns = cls._first_column + memory.int_param(params, "max_features", 1)
        return 8 * (columns * alma_jit.N_COLUMNS + alma_jit.STATE_SIZE)

    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        return {
            "_vectors": (self._capacity(n_columns), alma_jit.N_COLUMNS),
            "_st": (alma_jit.STATE_SIZE,),
        }

    def _checked_arrays(self, arrays: typing.Any, n_columns: int, values: dict) -> dict:
        # A state saved before the slot S_PEAK existed (one scalar less): its S is its own peak,
        # as right after a recomputation; the checks below then apply as to any state.
        saved = self._state_short_by(arrays, alma_jit.STATE_SIZE, 1)
        if saved is not None:
            upgraded = np.insert(saved, alma_jit.S_PEAK, saved[alma_jit.SUM_P])
            arrays = {**arrays, "_st": upgraded}
        return super()._checked_arrays(arrays, n_columns, values)

    def _check_restored(self) -> None:
        """The invariants of ALMA's learnt state (`streammargin.jit.alma`), which keep every
        later step finite: theta = SCALE u in the unit p-ball (the projection), S the sum of
        |u_i|^p (recomputed here, within the rounding of its running sum, `S_RTOL`) and at least
        half its peak since its last recomputation, and, for the average, marks behind the clock
        F and averaged weights that are weighted means of weights of the unit ball."""
        st, vectors = self._st, self._vectors
        # The params are the source of truth for the hyper-parameter slots.
        st[alma_jit.P : alma_jit.AVERAGE_DECAY + 1] = self._hyper_values()
        p = float(self.p)
        check_zero("ALMA weights past the feature columns", vectors[self._features.n_columns :])
        check_calibration("ALMA calibration", st[alma_jit.PLATT :])
        check_whole("ALMA trials", st[alma_jit.TRIALS])
        check_whole("ALMA k (corrections + 1)", st[alma_jit.K], 1.0, st[alma_jit.TRIALS] + 1.0)
        check_whole("ALMA corrections since S was recomputed", st[alma_jit.SINCE_RECOMPUTE],
                    0.0, alma_jit.RECOMPUTE_EVERY - 1)
        # SCALE only shrinks (projection) or moves into u (renormalisation, which leaves
        # SCALE S^(1/p) alone), so it stays <= 1; MIN_SCALE keeps a step eta / SCALE finite.
        scale, total = st[alma_jit.SCALE], st[alma_jit.SUM_P]
        check_range("ALMA scale", scale, MIN_SCALE, 1.0)
        if not (total == 0.0 or alma_jit.S_LOW < total < alma_jit.S_HIGH):
            raise state.StateError("state field ALMA S (sum of |u|^p) is out of its range")
        u = vectors[:, alma_jit.U]
        with np.errstate(over="ignore", under="ignore"):
            exact = float(np.sum(u * u)) if p == 2.0 else float(np.sum(np.abs(u) ** p))
        check_close("ALMA S (sum of |u|^p)", total, exact, S_RTOL, 0.0)
        # Learning recomputes S when it falls below half its peak: S <= peak <= 2 S (both 0
        # before the first correction). 2 S is exact: S < S_HIGH.
        check_range("ALMA peak of S since its recomputation", st[alma_jit.S_PEAK], total,
                    2.0 * total)
        if total > 0.0 and math.log(scale) + math.log(total) / p > 1e-9:
            raise state.StateError("state field ALMA scale puts theta outside the unit ball")
        self._check_restored_average(st, vectors, p)

    def _check_restored_average(self, st: np.ndarray, vectors: np.ndarray, p: float) -> None:
        acc, mark = vectors[:, alma_jit.ACC], vectors[:, alma_jit.MARK]
        clock, growth, decayed = st[alma_jit.FACTOR_SUM], st[alma_jit.GROWTH], st[alma_jit.DECAYED]
        if not self.average:  # nothing of the average is ever touched
            check_zero("ALMA average accumulators", vectors[:, alma_jit.ACC :])
            check_zero("ALMA average clock", st[[alma_jit.FACTOR_SUM, alma_jit.FACTOR_BASE,
                                                 alma_jit.DECAYED]])
            check_range("ALMA average growth", growth, 1.0, 1.0)
            return
        decay = st[alma_jit.AVERAGE_DECAY]
        trials = st[alma_jit.TRIALS]
        check_range("ALMA average clock F", clock, 0.0, 1e300)
        check_range("ALMA average base factor", st[alma_jit.FACTOR_BASE], 0.0, 1e300)
        check_range("ALMA average marks", mark, 0.0, clock)
        # GROWTH = 1 / decay^t since the last re-basing, which happens past GROWTH_LIMIT.
        check_range("ALMA average growth", growth, 1.0, alma_jit.GROWTH_LIMIT / decay * 1.000001)
        # DECAYED = sum of decay^age over the trials: at most the trials and the window.
        window = trials if self.average_window is None else min(trials, self.average_window)
        check_range("ALMA average weight", decayed, min(trials, 1.0), window * 1.000001)
        # Each averaged weight is a weighted mean of weights of the unit ball.
        since = clock - mark
        with np.errstate(over="ignore", invalid="ignore"):
            g = np.abs(vectors[:, alma_jit.U]) ** (p - 1.0)
            summed = acc + np.where(since == 0.0, 0.0, np.sign(vectors[:, alma_jit.U]) * g * since)
        bound = growth * decayed * (1.0 + 1e-6) + 1e-300
        if not np.all(np.abs(summed) <= bound):
            raise state.StateError("state field ALMA averaged weights are outside the unit ball")

    # Inspection -----------------------------------------------------------------------------------

    def _primal(self) -> np.ndarray:
        self._flush()
        w = np.empty(self._vectors.shape[0])
        alma_jit.primal_weights(self._vectors, self._st, w)
        return w

    @property
    def weights(self) -> dict:
        return self._features.decode(self._primal())

    @property
    def intercept(self) -> float:
        return float(self._primal()[0] * self._st[alma_jit.RHO])

    @property
    def n_corrections(self) -> int:
        self._flush()
        return int(self._st[alma_jit.K]) - 1

    @property
    def n_trials(self) -> int:
        self._flush()
        return int(self._st[alma_jit.TRIALS])

    @property
    def counters(self) -> dict[str, int]:
        """Counters a monitoring process reports (the Kafka worker's metrics)."""
        return {
            "corrections": self.n_corrections,
            "trials": self.n_trials,
            **self._feature_counters(),
        }
