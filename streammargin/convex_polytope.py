"""The Convex Polytope Machine (Kantchelian et al. 2014), as a stream learner."""

from __future__ import annotations

import typing

import numpy as np

from streammargin import memory, state, validation
from streammargin.base import (
    MulticlassMarginClassifier,
    check_calibration,
    check_close,
    check_max_features,
    check_range,
    check_whole,
    check_zero,
    grown,
    plain_label,
)
from streammargin.jit import convex_polytope as cpm_jit
from streammargin.jit.entry import EntryPoint
from streammargin.jit.layout import Layout
from streammargin.support import grown_columns

__all__ = ["ConvexPolytopeClassifier"]

# Bounds of the params (documented in the class docstring).
MAX_FACES = 10_000
MIN_L2, MAX_L2 = 1e-12, 1e12
MAX_STEPS = 1000
MAX_WINDOW = 100_000  # window rows x feature columns float64
MAX_SEED = 2**53 - 1  # the seed is kept exactly in the float64 state array
MAX_INTERCEPT_SCALE = 1e6
MAX_CLASSES = 100_000  # labels (per-class polytopes) of the joint and separate modes


# The per-record numba calls (predict_one, learn_one) go through entry points
# (`streammargin.jit.entry`): numba's dispatch works out the types of the arguments on every call,
# about half the cost of a call here, and these types are fixed by construction: W, st and window
# are C-ordered, writable float64 arrays made by the model (grown by `grown`, `grown_columns` and
# `_grow_classes`, restored as such by `from_state`), checked by `_bind` where they are made;
# `FeatureSpace.encode` gives int64 columns and read-only float64 values, and the class code is an
# int.
_MATRIX = np.zeros((1, 1))
_VECTOR = np.zeros(1)
_IDX = np.zeros(1, dtype=np.int64)
_VAL = np.frombuffer(bytes(8))  # read-only, like FeatureSpace.encode's values
_PREDICT = EntryPoint(cpm_jit.predict, _MATRIX, _VECTOR, _IDX, _VAL)
_LEARN = EntryPoint(cpm_jit.learn, _MATRIX, _VECTOR, _MATRIX, _IDX, _VAL, 0)
_PROBABILITIES = EntryPoint(cpm_jit.probabilities, _MATRIX, _VECTOR, _IDX, _VAL, _VECTOR)
_DECISION = EntryPoint(cpm_jit.decision, _MATRIX, _VECTOR, _IDX, _VAL, _VECTOR)


@state.register
class ConvexPolytopeClassifier(MulticlassMarginClassifier):
    """Convex Polytope Machine: large-margin polytopes learnt by SGD (Kantchelian et al. 2014).

    A polytope with K faces scores an instance with f(x) = max_k W_k . x: the class it encloses
    lies inside, where f(x) < 0, and the other class outside. The paper learns it by stochastic
    gradient descent on

        sum_{inside} sum_k [1 + W_k x]_+  +  sum_{outside} [1 - W_z(x) x]_+  +  lambda ||W||^2

    with the Pegasos step 1 / (lambda t): every step shrinks the weights by (1 - 1/t), an inside
    example pushes down every face that scores it above -1, and an outside example pulls up the one
    face z that ASSIGN gives it if that face scores it below 1. ASSIGN is the argmax face, unless
    the entropy of the faces' shares of outside examples would stay below `entropy` x log K; then
    it is the best face that raises that entropy (the paper's heuristic against a few faces taking
    every example). On a stream the paper's per-instance dictionary becomes per-face counts that
    forget, with a memory of about 1000 outside examples.

    Three variants (`polytopes`):

    * "joint" (default): one polytope per class, class c outside its polytope; the prediction is
      the class of largest f_c(x), for two classes the paper's sign(f_-(x) - f_+(x)), which
      removes the label asymmetry. The polytopes are trained together on the hinge of that
      decision: if f_y(x) - f_o(x) < 1 (o the best other class, face z of class y from ASSIGN),
      W_{y,z} gains the step and the best face of o loses it. Natively multiclass.
    * "separate": the same polytopes and prediction, each trained on its own as in the paper (a
      one-polytope CPM of class c against the rest). Natively multiclass.
    * "one": the paper's single polytope, a binary classifier with the positive class (True, 1)
      outside and the negative one (False, 0, -1) inside.

    "joint" is the default because it is by far the most accurate where the polytopes matter, in
    `benchmarks/cpm_sbp.py` (progressive accuracy, K = 10, steps = 4): Bananas 0.834 against
    0.714 ("separate") and 0.615 ("one"), ImageSegments 0.878 against 0.831 ("separate") and 0.818
    ("one" one-vs-rest). On nearly linear streams the variants are within a few points of each
    other, and slightly below a good linear model (Phishing: 0.868 joint, 0.891 separate, 0.893
    River's LogisticRegression; breast cancer: 0.921 joint, 0.930 one, 0.947 LogisticRegression).
    Each costs O(polytopes x K x nnz(x)) per SGD step.

    Replay: the paper runs many SGD steps per example (T passes over its data set). A single pass
    over a stream converges slowly, so each incoming example makes `steps` SGD steps, one on itself
    and `steps - 1` on examples drawn uniformly from a window of the last `window` examples (the
    stream's stand-in for the paper's data set). `steps=1` is the plain one-pass SGD and keeps no
    window; the window holds `window` dense rows of the feature columns.

    An update costs O(nnz(x)) per touched face: after t steps W = G / (lambda t), where G sums the
    signed instances of the updates, so the shrink of every step is free (see
    `streammargin.jit.convex_polytope`).

    Parameters
    ----------
    n_faces
        K, the number of faces (linear sub-classifiers) of each polytope, an integer in
        [1, 10000]. The paper finds that a large K does not overfit; K = 1 is a linear SVM
        trained by Pegasos.
    l2
        lambda, the L2 regularisation, in [1e-12, 1e12]; the step is 1 / (lambda t).
    entropy
        The minimum entropy h of ASSIGN, as a fraction in [0, 1] of its maximum log K (0
        switches the heuristic off; the paper tunes h among 0, log K / 10, ..., 9 log K / 10).
    polytopes
        "joint", "separate" (one polytope per class, natively multiclass) or "one" (binary).
    steps
        SGD steps per incoming example, an integer in [1, 1000]: one on it, the others on
        examples of the window.
    window
        Number of recent examples the replayed steps draw from (unused when `steps=1`), an
        integer in [1, 100000]; it holds window x feature columns floats.
    seed
        Seed of the replay draws, an integer in [0, 2**53) (a counter-based hash: a restored
        model draws the same).
    fit_intercept
        Add a constant feature of value `intercept_scale` (the paper's bias "as a constant
        unitary component"). Like every weight it is regularised.
    intercept_scale
        Value of the constant feature, in (0, 1e6].
    max_features
        The bound on feature columns (see `streammargin.features`), an integer in [1, 2**30]: the
        first 7/8 of them go to the first names learnt, one each; later names (and names longer
        than 128 bytes) share the last eighth by a stable hash of the name, and are not stored.
    max_classes
        The most labels a per-class model ("joint", "separate") learns, an integer in
        [2, 100000]: a record with a new label beyond it raises `streammargin.InvalidInput` and
        leaves the model as it was (the Kafka worker files it as a dead letter).

    Memory stays below `streammargin.memory.memory_bound`: the faces take max_features x
    max_classes x n_faces x 8 bytes, the replay window window x max_features x 8 (steps > 1).

    Attributes
    ----------
    classes : list
        The labels seen, in order of first appearance ([False, True] with one polytope).
    face_counts : dict
        Label -> the decayed number of outside examples each face took (ASSIGN's counts).
    n_trials : int
        Number of examples learnt from.

    Probabilities come from online Platt scaling (`streammargin.jit.calibration`). With one
    polytope it calibrates f(x) into P(True); per class it calibrates each class' margin
    f_c(x) - max_{c' != c} f_c'(x) on "is it class c?", and normalises over the classes.
    Per class, `predict_one` returns the label of highest probability; with one polytope it
    decides like every binary model here (the sign of f or the calibrated argmax, whichever erred
    less lately, see `streammargin.jit.calibration`). `decision_one` returns the raw scores
    {label: f_c(x)} in every variant; with one polytope {True: f(x)}, whose sign is the paper's
    decision.

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    Bananas is not linearly separable: every linear model of River scores 0.51-0.55 on it.

    >>> model = preprocessing.StandardScaler() | streammargin.ConvexPolytopeClassifier()
    >>> evaluate.progressive_val_score(datasets.Bananas(), model, metrics.Accuracy())
    Accuracy: 82.43%

    Natively multiclass (River's best linear model, SoftmaxRegression, scores 82.55% here):

    >>> model = preprocessing.StandardScaler() | streammargin.ConvexPolytopeClassifier()
    >>> evaluate.progressive_val_score(datasets.ImageSegments(), model, metrics.Accuracy())
    Accuracy: 88.39%

    >>> model["ConvexPolytopeClassifier"].classes
    ['path', 'foliage', 'sky', 'grass', 'brickface', 'cement', 'window']

    References
    ----------
    [^1]: Kantchelian, A., Tschantz, M. C., Huang, L., Bartlett, P. L., Joseph, A. D., & Tygar,
    J. D. (2014). Large-margin convex polytope machine. Advances in Neural Information Processing
    Systems 27, 3248-3256.

    """

    _state_arrays = ("_weights", "_window", "_st")
    _state_values = ("_encoded_labels",)
    _first_column = 1  # column 0: the intercept's constant feature

    def __init__(
        self,
        n_faces: int = 10,
        l2: float = 3e-3,
        entropy: float = 0.5,
        polytopes: str = "joint",
        steps: int = 4,
        window: int = 1000,
        seed: int = 0,
        fit_intercept: bool = True,
        intercept_scale: float = 1.0,
        max_features: int = 2048,
        max_classes: int = 100,
    ):
        validation.integer_in("n_faces", n_faces, 1, MAX_FACES)
        # The bounds of l2 and intercept_scale keep |W . x| finite and squarable for every input.
        validation.real_in("l2", l2, MIN_L2, MAX_L2)
        validation.fraction("entropy", entropy)
        validation.one_of("polytopes", polytopes, sorted(cpm_jit.MODES))
        validation.integer_in("steps", steps, 1, MAX_STEPS)
        validation.integer_in("window", window, 1, MAX_WINDOW)
        validation.integer_in("seed", seed, 0, MAX_SEED)
        validation.boolean("fit_intercept", fit_intercept)
        validation.positive_real("intercept_scale", intercept_scale, MAX_INTERCEPT_SCALE)
        check_max_features(max_features)
        validation.integer_in("max_classes", max_classes, 2, MAX_CLASSES)
        self.n_faces = int(n_faces)
        self.l2 = l2
        self.entropy = entropy
        self.polytopes = polytopes
        self.steps = int(steps)
        self.window = int(window)
        self.seed = int(seed)
        self.fit_intercept = fit_intercept
        self.intercept_scale = intercept_scale
        self.max_features = int(max_features)
        self.max_classes = int(max_classes)
        self._reset()

    @property
    def _binary(self) -> bool:
        """polytopes="one" is the paper's binary polytope (see `MulticlassMarginClassifier`)."""
        return self.polytopes == "one"

    def _hyper_values(self) -> tuple[float, ...]:
        return cpm_jit.hyper_values(
            self.n_faces,
            self.l2,
            self.entropy,
            self.intercept_scale if self.fit_intercept else 0.0,
            self.polytopes,
            self.steps,
            self.window,
            self.seed,
        )

    def _reset(self) -> None:
        super()._reset()  # the feature space and the labels
        n_poly = 1 if self._binary else 0  # one polytope, or one per class as classes come
        first = min(8, self._max_columns)
        self._weights = np.zeros((first, n_poly * self.n_faces))
        self._window = np.zeros((self.window if self.steps > 1 else 0, first))
        self._st = np.zeros(cpm_jit.state_size(self.n_faces, n_poly))
        self._st[cpm_jit.N_FACES : cpm_jit.SEED + 1] = self._hyper_values()
        for p in range(n_poly):
            self._st[self._block(p)] = cpm_jit.new_block(self.n_faces)
        self._bind()

    # (Compiled at their first call: the Kafka worker predicts through `probabilities`, a model
    # restored to serve may never learn.)
    _entry_points = {
        "_predict_entry": (_PREDICT, ("_weights", "_st")),
        "_learn_entry": (_LEARN, ("_weights", "_st", "_window")),
        "_probabilities_entry": (_PROBABILITIES, ("_weights", "_st")),
        "_decision_entry": (_DECISION, ("_weights", "_st")),
    }

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {}
        yield {"polytopes": "one", "n_faces": 3, "entropy": 0.0}
        yield {"polytopes": "separate", "n_faces": 2, "steps": 2, "window": 7, "l2": 0.1}
        yield {"n_faces": 1, "steps": 1, "fit_intercept": False}
        yield {"polytopes": "one", "n_faces": 5, "entropy": 0.9, "l2": 1e-5, "window": 5}
        yield {"n_faces": 2, "window": 6, "max_features": 4, "max_classes": 8}

    def _grow_classes(self) -> None:
        """A new class' polytope: K more weight columns and a state block."""
        block = np.zeros((self._weights.shape[0], self.n_faces))
        self._weights = np.ascontiguousarray(np.hstack([self._weights, block]))
        self._st = np.concatenate([self._st, cpm_jit.new_block(self.n_faces)])
        self._bind()

    def _block(self, c: int) -> slice:
        """The slice of st holding class c's face counts, entropy sums and calibration."""
        size = cpm_jit.block_size(self.n_faces)
        return slice(cpm_jit.CLASSES + c * size, cpm_jit.CLASSES + (c + 1) * size)

    @property
    def _n_polytopes(self) -> int:
        return len(self._scored_labels)

    def _state_layout(self) -> Layout:
        """The head, then one block per polytope (by class code: the order of `classes`)."""
        return cpm_jit.layout(self.n_faces, self._n_polytopes)

    def _reserve(self, n_columns: int) -> None:
        limit = self._max_columns
        if n_columns > self._weights.shape[0] or n_columns > self._window.shape[1]:
            if n_columns > self._weights.shape[0]:
                self._weights = grown(self._weights, n_columns, limit)
            if n_columns > self._window.shape[1]:
                self._window = grown_columns(self._window, self._weights.shape[0], limit)
            self._bind()

    @classmethod
    def _max_labels(cls, params: dict) -> int:
        return 0 if params.get("polytopes") == "one" else memory.int_param(params, "max_classes", 2)

    @classmethod
    def _max_array_bytes(cls, params: dict) -> int:
        columns = cls._first_column + memory.int_param(params, "max_features", 1)
        n_faces = memory.int_param(params, "n_faces", 1)
        n_poly = max(1, cls._max_labels(params))
        replays = memory.int_param(params, "steps", 1) > 1
        window = memory.int_param(params, "window", 1) if replays else 0
        st = cpm_jit.state_size(n_faces, n_poly)
        return 8 * (columns * n_poly * n_faces + window * columns + st)

    # The per-record path: `MulticlassMarginClassifier.learn_one` and `predict_one` with their hooks
    # written out. At 10 features a record costs a few microseconds here, and each method call or
    # array attribute the generic path adds costs 2-4% of it (measured: the generic path ran the
    # default CPM 8% slower). tests/test_convex_polytope.py checks that both give the same model.

    def learn_one(self, x: dict, y: typing.Any) -> None:
        try:
            code = self._label_index.get(y)  # a known label
        except TypeError:  # unhashable
            code = None
        if code is None:
            code = self._new_code(y)  # validates the label before anything changes
        features = self._features
        idx, val = features.encode(x, True)  # validates x before anything changes
        if code == len(self._labels):
            self._add_label(y)
        if features.n_columns > self._weights.shape[0]:  # (the window has as many columns)
            self._reserve(features.n_columns)
        self._learn_entry(self._weights, self._st, self._window, idx, val, code)

    def predict_one(self, x: dict, **kwargs: typing.Any) -> typing.Any:
        idx, val = self._features.encode(x, False)
        code = self._predict_entry(self._weights, self._st, idx, val)
        return self._labels[code] if code >= 0 else None

    # Numeric core (see `MulticlassMarginClassifier`) ----------------------------------------------

    def _learn_code(self, idx: np.ndarray, val: np.ndarray, code: int) -> None:
        self._learn_entry(self._weights, self._st, self._window, idx, val, code)

    def _predict_code(self, idx: np.ndarray, val: np.ndarray) -> int:
        return self._predict_entry(self._weights, self._st, idx, val)

    def _class_probabilities(self, idx: np.ndarray, val: np.ndarray) -> np.ndarray:
        return self._code_and_probabilities(idx, val)[1]

    def _code_and_probabilities(self, idx: np.ndarray, val: np.ndarray) -> tuple[int, np.ndarray]:
        out = np.empty(max(len(self._labels), 2))
        n, code = self._probabilities_entry(self._weights, self._st, idx, val, out)
        return code, out[:n]

    def _class_scores(self, idx: np.ndarray, val: np.ndarray) -> np.ndarray:
        out = np.empty(max(self._n_polytopes, 1))
        n = self._decision_entry(self._weights, self._st, idx, val, out)
        return out[:n]

    def _learn_code_rows(self, X: np.ndarray, cols: np.ndarray, codes: np.ndarray) -> None:
        cpm_jit.learn_rows(self._weights, self._st, self._window, X, cols, codes)

    def _predict_code_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.empty(X.shape[0], dtype=np.int64)
        cpm_jit.predict_rows(self._weights, self._st, X, cols, out)
        return out

    def _probability_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.empty((X.shape[0], max(len(self._labels), 1)))
        cpm_jit.probability_rows(self._weights, self._st, X, cols, out)
        return out

    def _class_score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.empty((X.shape[0], max(self._n_polytopes, 1)))
        cpm_jit.decision_rows(self._weights, self._st, X, cols, out)
        return out

    # Safe state -----------------------------------------------------------------------------------

    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        n_labels = self._saved_label_count(values)
        n_poly = 1 if self._binary else n_labels
        K = self.n_faces
        return {
            "_weights": (self._capacity(n_columns), n_poly * K),
            "_window": (self.window if self.steps > 1 else 0, self._capacity(n_columns)),
            "_st": (cpm_jit.state_size(K, n_poly),),
        }

    def _check_restored(self) -> None:
        """The invariants of `streammargin.jit.convex_polytope`'s state: exactly `steps` SGD
        steps and `steps - 1` draws per trial; G a sum of SGD_STEPS signed instances shrunk to
        norm MAX_NORM, so within SGD_STEPS * MAX_NORM, zero past the feature rows; the window's
        used rows with a valid class code and zero past the feature columns, the rest zero;
        per class, decayed face counts in [0, 1 / (1 - DECAY)] with their total and sum of
        n log n (checked against their recomputed values), calibration in range."""
        st, W, window = self._st, self._weights, self._window
        st[cpm_jit.N_FACES : cpm_jit.SEED + 1] = self._hyper_values()
        self._restore_labels()
        n_poly = self._n_polytopes
        # The classes the jit code knows of (the one polytope knows none).
        if st[cpm_jit.N_ACTIVE] != (0 if self._binary else len(self._labels)):
            raise state.StateError("CPM state does not match its label list")
        # The replayed steps read the window's columns as rows of the weights, and learn_one
        # grows both when a column passes the weights' rows: learning keeps them equal
        # (`_reserve`), and a narrower window would take writes past its end.
        if window.shape[1] != W.shape[0]:
            raise state.StateError(
                "the CPM's window must have as many columns as its weights have rows"
            )
        trials = st[cpm_jit.TRIALS]
        check_whole("CPM trials", trials)
        if st[cpm_jit.SGD_STEPS] != trials * self.steps:
            raise state.StateError("state field CPM SGD steps must be trials x steps")
        if st[cpm_jit.DRAWS] != trials * (self.steps - 1):
            raise state.StateError("state field CPM draws must be trials x (steps - 1)")
        n_columns = self._features.n_columns
        check_zero("CPM weights past the feature columns", W[n_columns:])
        bound = st[cpm_jit.SGD_STEPS] * cpm_jit.MAX_NORM
        check_range("CPM weights", W, -bound, bound)
        filled = int(min(trials, window.shape[0]))
        check_zero("CPM window rows not yet used", window[filled:])
        check_zero("CPM window past the feature columns", window[:, n_columns:])
        check_whole("CPM window class codes", window[:filled, 0], 0.0,
                    max(len(self._labels) - 1, 0))
        K = self.n_faces
        most = 1.0 / (1.0 - cpm_jit.DECAY)
        for c in range(n_poly):
            block = st[self._block(c)]
            counts = block[:K]
            sums = block[K : K + cpm_jit.PLATT]
            check_range("CPM face counts", counts, 0.0, most * (1.0 + 1e-9))
            check_close("CPM face count total", sums[cpm_jit.TOTAL], counts.sum(), 1e-6, 1e-9)
            with np.errstate(divide="ignore", invalid="ignore"):
                nlogn = np.where(counts > 0.0, counts * np.log(counts), 0.0).sum()
            check_close("CPM face count entropy sum", sums[cpm_jit.SUM_NLOGN], nlogn, 1e-6,
                        1e-6 * (1.0 + sums[cpm_jit.TOTAL]))
            check_whole("CPM positives since the exact sums", sums[cpm_jit.SINCE_EXACT], 0.0,
                        cpm_jit.EXACT_EVERY - 1)
            check_calibration("CPM calibration", block[K + cpm_jit.PLATT :])

    # Inspection -----------------------------------------------------------------------------------

    @property
    def n_trials(self) -> int:
        return int(self._st[cpm_jit.TRIALS])

    @property
    def face_counts(self) -> dict:
        K = self.n_faces
        return {
            label: self._st[self._block(c)][:K].tolist()
            for c, label in enumerate(self._scored_labels)
        }

    def face_weights(self, label: typing.Any = True) -> list[dict]:
        """The K faces W_k of the polytope of `label` (True with one polytope), as dicts."""
        K = self.n_faces
        p = 0 if self._binary else self._label_index[plain_label(label)]  # the one polytope
        t = self._st[cpm_jit.SGD_STEPS]
        scale = 0.0 if t == 0 else 1.0 / (self.l2 * t)  # W = G / (lambda t)
        faces = []
        for k in range(K):
            column = self._weights[:, p * K + k] * scale
            face = self._features.decode(column)
            if self.fit_intercept:
                face["__intercept__"] = float(column[0] * self.intercept_scale)
            faces.append(face)
        return faces

    @property
    def counters(self) -> dict[str, int]:
        """Counters a monitoring process reports (the Kafka worker's metrics)."""
        counts = [self._st[self._block(c)][: self.n_faces] for c in range(self._n_polytopes)]
        active_faces = sum(int(np.count_nonzero(c > 1.0)) for c in counts)
        return {
            "trials": self.n_trials,
            "classes": len(self.classes),
            "active_faces": active_faces,
            **self._feature_counters(),
        }

