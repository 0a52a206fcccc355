"""The Convex Polytope Machine (Kantchelian et al. 2014), as a stream learner."""

from __future__ import annotations

import json
import math
import typing

import numpy as np

from streammargin import memory, state, validation
from streammargin.base import (
    MarginClassifier,
    check_calibration,
    check_close,
    check_max_features,
    check_range,
    check_whole,
    check_zero,
    grown,
)
from streammargin.errors import InvalidInput
from streammargin.jit import convex_polytope as cpm_jit
from streammargin.jit.entry import lazy_entry_point
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
# are C-ordered float64 arrays made by the model (grown by `grown` and `grown_columns`, restored by
# `state.check_array`), `FeatureSpace.encode` gives int64 columns and read-only float64 values,
# and the class code is an int. Each name resolves its entry point on first use.
_MATRIX = np.zeros((1, 1))
_VECTOR = np.zeros(1)
_IDX = np.zeros(1, dtype=np.int64)
_VAL = np.frombuffer(bytes(8))  # read-only, like FeatureSpace.encode's values
_predict_entry = lazy_entry_point(globals(), "_predict_entry", cpm_jit.predict, _MATRIX, _VECTOR, _IDX, _VAL)
_learn_entry = lazy_entry_point(
    globals(), "_learn_entry", cpm_jit.learn, _MATRIX, _VECTOR, _MATRIX, _IDX, _VAL, 0
)


def _plain_label(y: typing.Any) -> typing.Any:
    """A label as a plain Python value (numpy scalars compare and hash like them), validated."""
    if isinstance(y, np.generic):
        y = y.item()
    if y is None or (isinstance(y, float) and math.isnan(y)):
        raise InvalidInput(f"label {y!r} is not a class: a label must be a value other than None/NaN")
    try:
        encoded = json.dumps(state.encode_name(y), allow_nan=False, separators=(",", ":"))
        hash(y)
    except (TypeError, ValueError):
        raise InvalidInput(
            f"label {y!r:.80} of type {type(y).__name__} is not supported: labels must be str, bool, "
            "int, finite float or tuples of them"
        ) from None
    if len(encoded) > memory.MAX_LABEL_BYTES:
        raise InvalidInput(
            f"label {y!r:.80} is too long to be stored: at most {memory.MAX_LABEL_BYTES} bytes "
            "of JSON"
        )
    return y


@state.register
class ConvexPolytopeClassifier(MarginClassifier):
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
    def _multiclass(self) -> bool:  # type: ignore[override]
        return self.polytopes != "one"

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
        super()._reset()
        self._one = self.polytopes == "one"
        n_poly = 1 if self._one else 0
        first = min(8, self._max_columns)
        self._weights = np.zeros((first, n_poly * self.n_faces))
        self._window = np.zeros((self.window if self.steps > 1 else 0, first))
        self._st = np.zeros(cpm_jit.CLASSES + n_poly * cpm_jit.block_size(self.n_faces))
        self._st[cpm_jit.N_FACES : cpm_jit.SEED + 1] = self._hyper_values()
        for p in range(n_poly):
            self._st[self._block(p)] = cpm_jit.new_block(self.n_faces)
        self._encoded_labels: list = []
        self._labels: list = []
        self._label_index: dict = {}

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {}
        yield {"polytopes": "one", "n_faces": 3, "entropy": 0.0}
        yield {"polytopes": "separate", "n_faces": 2, "steps": 2, "window": 7, "l2": 0.1}
        yield {"n_faces": 1, "steps": 1, "fit_intercept": False}
        yield {"polytopes": "one", "n_faces": 5, "entropy": 0.9, "l2": 1e-5, "window": 5}
        yield {"n_faces": 2, "window": 6, "max_features": 4, "max_classes": 8}

    # Labels ---------------------------------------------------------------------------------------

    def _add_label(self, label: typing.Any) -> None:
        label = _plain_label(label)
        self._labels.append(label)
        self._label_index[label] = len(self._labels) - 1
        self._encoded_labels.append(state.encode_name(label))
        block = np.zeros((self._weights.shape[0], self.n_faces))
        self._weights = np.ascontiguousarray(np.hstack([self._weights, block]))
        self._st = np.concatenate([self._st, cpm_jit.new_block(self.n_faces)])

    def _block(self, c: int) -> slice:
        """The slice of st holding class c's face counts, entropy sums and calibration."""
        size = cpm_jit.block_size(self.n_faces)
        return slice(cpm_jit.CLASSES + c * size, cpm_jit.CLASSES + (c + 1) * size)

    @property
    def classes(self) -> list:
        return [False, True] if self._one else list(self._labels)

    # Binary path of the base class (polytopes="one") ----------------------------------------------

    @property
    def _calibration(self) -> np.ndarray:
        block = self._block(0)
        return self._st[block.start + self.n_faces + cpm_jit.PLATT : block.stop]

    def _reserve(self, n_columns: int) -> None:
        limit = self._max_columns
        if n_columns > self._weights.shape[0]:
            self._weights = grown(self._weights, n_columns, limit)
        if n_columns > self._window.shape[1]:
            self._window = grown_columns(self._window, self._weights.shape[0], limit)

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
        st = cpm_jit.CLASSES + n_poly * cpm_jit.block_size(n_faces)
        return 8 * (columns * n_poly * n_faces + window * columns + st)

    def _refuse_new_labels(self, new: int) -> None:
        """Raise `InvalidInput` if `new` more labels would pass `max_classes`."""
        if len(self._labels) + new > self.max_classes:
            raise InvalidInput(
                f"a new label would make {len(self._labels) + new} classes, more than "
                f"max_classes={self.max_classes}: raise max_classes to learn more classes"
            )

    def _score(self, idx: np.ndarray, val: np.ndarray) -> float:
        out = np.empty(1)
        cpm_jit.decision(self._weights, self._st, idx, val, out)
        return float(out[0])

    def _learn(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        code = 1 if target > 0 else 0
        _learn_entry(self._weights, self._st, self._window, idx, val, code)

    def _score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.empty((X.shape[0], 1))
        cpm_jit.decision_rows(self._weights, self._st, X, cols, out)
        return out[:, 0]

    def _learn_rows(self, X: np.ndarray, cols: np.ndarray, targets: np.ndarray) -> None:
        codes = (targets > 0).astype(np.int64)
        cpm_jit.learn_rows(self._weights, self._st, self._window, X, cols, codes)

    # River API (per class here; one polytope defers to the base class) -------------------------

    def _class_probabilities(self, x: dict) -> np.ndarray:
        idx, val = self._features.encode(x, False)
        out = np.empty(max(len(self._labels), 2))
        n = cpm_jit.probabilities(self._weights, self._st, idx, val, out)
        return out[:n]

    def learn_one(self, x: dict, y: typing.Any) -> None:
        if self._one:
            return super().learn_one(x, y)
        try:
            code = self._label_index.get(y)  # fast path: a known label
        except TypeError:  # unhashable
            code = None
        if code is None:
            _plain_label(y)  # validates the label before anything changes
            self._refuse_new_labels(1)
            code = len(self._labels)
        features = self._features
        idx, val = features.encode(x, True)  # validates x before anything changes
        if code == len(self._labels):
            self._add_label(y)
        if features.n_columns > self._weights.shape[0]:
            self._reserve(features.n_columns)
        _learn_entry(self._weights, self._st, self._window, idx, val, code)

    def predict_proba_one(self, x: dict, **kwargs: typing.Any) -> dict:
        proba = self._class_probabilities(x)
        if self._one:  # [P(False), P(True)], as the base class computes them
            return {False: float(proba[0]), True: float(proba[1])}
        return {label: float(p) for label, p in zip(self._labels, proba)}

    def predict_one(self, x: dict, **kwargs: typing.Any) -> typing.Any:
        idx, val = self._features.encode(x, False)
        best = _predict_entry(self._weights, self._st, idx, val)
        if self._one:
            return best == 1  # decided like the base class (sign or calibrated argmax)
        return self._labels[best] if best >= 0 else None

    def decision_one(self, x: dict) -> dict:  # type: ignore[override]
        """The raw polytope scores {label: f_c(x)}, the score of the polytope each class lies
        outside of: with one polytope {True: f(x)} (the positive class is outside; the sign of
        f(x) is the paper's decision)."""
        idx, val = self._features.encode(x, False)
        labels = self._scored_labels
        out = np.empty(max(len(labels), 1))
        n = cpm_jit.decision(self._weights, self._st, idx, val, out)
        return {label: float(score) for label, score in zip(labels, out[:n])}

    @property
    def _scored_labels(self) -> list:
        """The labels of the polytopes, in the order of their scores: [True] with one polytope."""
        return [True] if self._one else self._labels

    def learn_many(self, X: typing.Any, y: typing.Any) -> None:
        if self._one:
            return super().learn_many(X, y)
        labels = [_plain_label(label) for label in y]  # validated before anything changes
        if len(labels) != len(X):
            raise InvalidInput(f"X has {len(X)} rows but y has {len(labels)} labels")
        self._refuse_new_labels(len({label for label in labels if label not in self._label_index}))
        frame = self._learning_frame(X)
        for label in labels:
            if label not in self._label_index:
                self._add_label(label)
        codes = np.array([self._label_index[label] for label in labels], dtype=np.int64)
        self._reserve(self._features.n_columns)
        cpm_jit.learn_rows(self._weights, self._st, self._window, frame.values, frame.cols, codes)
        self._features.count_hashed(frame.raw, frame.raw_cols)

    def predict_proba_many(self, X: typing.Any) -> typing.Any:
        import pandas as pd

        if self._one:
            return super().predict_proba_many(X)
        values, cols = self._frame(X, grow=False)
        n_classes = len(self._labels)
        out = np.empty((len(X), max(n_classes, 1)))
        cpm_jit.probability_rows(self._weights, self._st, values, cols, out)
        return pd.DataFrame(out[:, :n_classes], index=X.index, columns=list(self._labels))

    def predict_many(self, X: typing.Any) -> typing.Any:
        import pandas as pd

        if self._one:
            return super().predict_many(X)
        proba = self.predict_proba_many(X).to_numpy()
        if not self._labels:
            return pd.Series([None] * len(X), index=X.index, dtype=object)
        best = np.argmax(proba, axis=1)
        return pd.Series([self._labels[i] for i in best], index=X.index)

    def decision_many(self, X: typing.Any) -> typing.Any:
        """Raw scores of the rows, a DataFrame with a column per label of `decision_one`."""
        import pandas as pd

        values, cols = self._frame(X, grow=False)
        labels = self._scored_labels
        out = np.empty((len(X), max(len(labels), 1)))
        cpm_jit.decision_rows(self._weights, self._st, values, cols, out)
        return pd.DataFrame(out[:, : len(labels)], index=X.index, columns=list(labels))

    # Safe state -----------------------------------------------------------------------------------

    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        labels = values["_encoded_labels"]
        if not isinstance(labels, list):
            raise state.StateError("a CPM's saved labels must be a list")
        if self.polytopes == "one" and labels:
            raise state.StateError("a one-polytope CPM has no label list")
        if len(labels) > self.max_classes:
            raise state.StateError(
                f"the state holds {len(labels)} labels, more than max_classes={self.max_classes}"
            )
        n_poly = 1 if self.polytopes == "one" else len(labels)
        K = self.n_faces
        return {
            "_weights": (self._capacity(n_columns), n_poly * K),
            "_window": (self.window if self.steps > 1 else 0, self._capacity(n_columns)),
            "_st": (cpm_jit.CLASSES + n_poly * cpm_jit.block_size(K),),
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
        labels = [state.decode_name(encoded) for encoded in self._encoded_labels]
        for label in labels:
            try:
                _plain_label(label)
            except InvalidInput as error:
                raise state.StateError(f"a saved label is not valid: {error}") from None
        self._labels = labels
        self._label_index = {label: i for i, label in enumerate(labels)}
        if len(self._label_index) != len(labels):
            raise state.StateError("a label appears twice in the saved state")
        n_poly = 1 if self._one else len(labels)
        if st[cpm_jit.N_ACTIVE] != (0 if self._one else len(labels)):
            raise state.StateError("CPM state does not match its label list")
        # The replayed steps read the window's columns as rows of the weights.
        if window.shape[1] > W.shape[0]:
            raise state.StateError("the CPM's window has more columns than its weights have rows")
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
        check_whole("CPM window class codes", window[:filled, 0], 0.0, 1.0 if self._one else
                    max(n_poly - 1, 0))
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
        labels = [True] if self._one else self._labels
        return {
            label: self._st[self._block(c)][:K].tolist() for c, label in enumerate(labels)
        }

    def face_weights(self, label: typing.Any = True) -> list[dict]:
        """The K faces W_k of the polytope of `label` (True with one polytope), as dicts."""
        K = self.n_faces
        p = 0 if self._one else self._label_index[_plain_label(label)]
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
        n_poly = 1 if self._one else len(self._labels)
        counts = [self._st[self._block(c)][: self.n_faces] for c in range(n_poly)]
        active_faces = sum(int(np.count_nonzero(c > 1.0)) for c in counts)
        return {
            "trials": self.n_trials,
            "classes": len(self.classes),
            "active_faces": active_faces,
            **self._feature_counters(),
        }

