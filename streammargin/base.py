"""What every streammargin classifier shares: River plumbing around a numeric core.

`MarginClassifier` turns River dicts into (columns, values) arrays through a `FeatureSpace`,
codes the binary labels, serves calibrated probabilities, runs mini-batches, and saves its state
safely. A model module only says how to score and learn from one encoded instance (and a batch of
rows), keeping the paper's update rule in view.
"""

from __future__ import annotations

import abc
import copy
import inspect
import json
import typing

import numpy as np
from river import base

from streammargin import memory, validation
from streammargin.errors import InvalidInput, StateError
from streammargin.features import MAX_MAX_FEATURES, FeatureSpace, validate_value
from streammargin.jit import calibration

__all__ = [
    "Capacity",
    "InfiniteEntry",
    "check_calibration",
    "check_close",
    "check_range",
    "check_whole",
    "check_zero",
    "MarginClassifier",
    "binary_target",
    "binary_targets",
    "check_max_features",
    "frame_values",
    "grown",
    "merge_shared_columns",
]


def binary_target(y: typing.Any) -> float:
    """+1.0 for the positive label (True, 1), -1.0 for the negative one (False, 0, -1).

    Anything else raises `InvalidInput` (a `ValueError`): these are binary classifiers, wrap them in
    `river.multiclass.OneVsRestClassifier` for more labels.
    """
    if y is True:
        return 1.0
    if y is False:
        return -1.0
    if not isinstance(y, (str, bytes)):
        try:
            as_float = float(y)
        except (TypeError, ValueError):
            as_float = None
        if as_float == 1.0:
            return 1.0
        if as_float == 0.0 or as_float == -1.0:
            return -1.0
    raise InvalidInput(
        f"unknown label {y!r:.80}: a binary classifier takes True/False, 1/0 or 1/-1 "
        "(use river.multiclass.OneVsRestClassifier for more classes)"
    )


def binary_targets(y: typing.Any) -> np.ndarray:
    """`binary_target` of every label of a sequence, vectorised for bool and numeric labels."""
    labels = np.asarray(y)
    if labels.dtype == np.bool_:
        return np.where(labels, 1.0, -1.0)
    if labels.dtype.kind in "iuf":
        as_float = labels.astype(np.float64)
        if np.isin(as_float, (1.0, 0.0, -1.0)).all():
            return np.where(as_float == 1.0, 1.0, -1.0)
    return np.array([binary_target(label) for label in labels], dtype=np.float64)


_STATE_KEYS = frozenset({"model", "params", "features", "arrays", "values"})


class Capacity(typing.NamedTuple):
    """A saved array's dimension that grows with the feature space (by doubling, `grown`, up to
    the model's bound): at least `needed` (the feature space's columns), at most `limit` (the
    model's `_max_columns`, what `streammargin.memory` counts). An array with data is bounded by
    the bytes it came in as well; an empty one is not, so its capacity may be at most what
    learning makes it (`empty_limit`)."""

    needed: int
    limit: int

    @property
    def empty_limit(self) -> int:
        return min(max(8, 2 * self.needed), self.limit)

    def fits(self, dim: int, empty: bool) -> bool:
        """Whether a saved array's dimension `dim` is one learning could have made."""
        return self.needed <= dim <= (self.empty_limit if empty else self.limit)


def _describe(shape: tuple) -> str:
    dims = [f"{d.needed}..{d.limit}" if isinstance(d, Capacity) else str(d) for d in shape]
    return f"({', '.join(dims)})"


def _allocate_nothing() -> None:
    """`_reset` while `from_state` validates the params (see `MarginClassifier._validated`)."""


# Checks of a restored state (`_check_restored`): each raises `StateError` naming the field.

MAX_COUNT = 2.0**53  # counters are whole numbers in float64, exact up to here


def check_range(field: str, values: typing.Any, low: float, high: float) -> None:
    """Every entry of `values` in [low, high] (NaN fails)."""
    values = np.asarray(values)
    if not (np.all(values >= low) and np.all(values <= high)):
        raise StateError(f"state field {field} must be in [{low:g}, {high:g}]")


def check_whole(field: str, values: typing.Any, low: float = 0.0, high: float = MAX_COUNT) -> None:
    """Every entry of `values` a whole number in [low, high] (counters, sizes, labels)."""
    values = np.asarray(values)
    check_range(field, values, low, high)
    if not np.all(values == np.floor(values)):
        raise StateError(f"state field {field} must be whole numbers")


def check_zero(field: str, values: typing.Any) -> None:
    """Every entry of `values` zero: rows or columns past what is in use stay zero (learning
    only writes what it uses, and removing a row zeroes it)."""
    if np.any(np.asarray(values) != 0.0):
        raise StateError(f"state field {field} must be zero")


def check_close(
    field: str, stored: typing.Any, exact: typing.Any, rtol: float, atol: typing.Any
) -> None:
    """A cached quantity equal to what it caches (recomputed) within rtol * |larger| + atol."""
    stored, exact = np.asarray(stored, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        fits = np.abs(stored - exact) <= rtol * np.maximum(np.abs(stored), np.abs(exact)) + atol
    if not np.all(fits):
        raise StateError(f"state field {field} does not match its recomputed value")


def check_calibration(field: str, st: np.ndarray) -> None:
    """The online Platt state (`streammargin.jit.calibration`) in the ranges learning keeps:
    the Hessian is the identity (the ridge, exactly so as it forgets) plus a positive
    semi-definite sum of curvatures <= 1/4 of z in [-Z_CLIP, Z_CLIP], forgotten at BETA, so
    its diagonal is in [1, 1 + 0.25 Z_CLIP^2 / (1 - BETA)] and [1, 1 + 0.25 / (1 - BETA)] and
    its determinant at least 1 (which keeps every Newton step finite); the running mean square
    of clamped scores is at most SCORE_LIMIT^2; the decayed weights and error rates in [0, 1]."""
    tiny = 1e-9  # rounding
    forget = 1.0 / (1.0 - calibration.BETA)
    h00_max = 1.0 + 0.25 * calibration.Z_CLIP**2 * forget
    h11_max = 1.0 + 0.25 * forget
    h01_max = 0.25 * calibration.Z_CLIP * forget
    check_range(f"{field}.a", st[calibration.A], -1e100, 1e100)
    check_range(f"{field}.b", st[calibration.B], -1e100, 1e100)
    check_range(f"{field}.h00", st[calibration.H00], 1.0 - tiny, h00_max * (1.0 + tiny))
    check_range(f"{field}.h11", st[calibration.H11], 1.0 - tiny, h11_max * (1.0 + tiny))
    check_range(f"{field}.h01", st[calibration.H01], -h01_max * (1 + tiny), h01_max * (1 + tiny))
    det = st[calibration.H00] * st[calibration.H11] - st[calibration.H01] ** 2
    check_range(f"{field} Hessian determinant", det, 0.5, np.inf)
    check_range(
        f"{field}.mean_square", st[calibration.MEAN_SQUARE], 0.0, calibration.SCORE_LIMIT**2
    )
    for name, slot in (
        ("unseen", calibration.UNSEEN),
        ("err_sign", calibration.ERR_SIGN),
        ("err_calibrated", calibration.ERR_CALIBRATED),
    ):
        check_range(f"{field}.{name}", st[slot], 0.0, 1.0)


def grown(array: np.ndarray, n_rows: int, limit: int) -> np.ndarray:
    """`array` with room for at least `n_rows` rows (zero-filled), doubling its capacity, never
    beyond `limit` rows (the model's bound; n_rows <= limit)."""
    if array.shape[0] >= n_rows:
        return array
    capacity = min(max(n_rows, 2 * array.shape[0], 8), limit)
    bigger = np.zeros((capacity, *array.shape[1:]), dtype=array.dtype)
    bigger[: array.shape[0]] = array
    return bigger


def check_max_features(max_features: typing.Any) -> int:
    """`max_features` as an int: an integer in [1, `MAX_MAX_FEATURES`], validated like every
    parameter (`streammargin.validation`: a `ValueError` naming it otherwise)."""
    return int(validation.integer_in("max_features", max_features, 1, MAX_MAX_FEATURES))


class InfiniteEntry(ValueError):
    """Raised by a model's `_learn_rows`/`_score_rows` that found an infinite entry of its frame
    (`_rows_check_infinite`); `_learn_rows` restores its state first."""

    def __init__(self, row: int, column: int):
        super().__init__(row, column)
        self.row, self.column = row, column


def infinite_entry_error(X: typing.Any, values: np.ndarray, row: int, column: int) -> InvalidInput:
    """The error for the infinite entry (row, column) of frame X."""
    return InvalidInput(
        f"feature {X.columns[column]!r} has value {float(values[row, column])!r} "
        f"in row {X.index[row]!r}: expected a finite real number"
    )


def frame_values(X: typing.Any, check_infinite: bool = True) -> np.ndarray:
    """A pandas DataFrame as a float64 array; NaN = absent.

    Usually a view, not a copy: pandas stores a numeric frame column by column, so this is a
    column-major array (strided for a slice of rows), and the numba loops take any layout. Walking
    it row by row touches one cache line per column every 8 rows. A copy or a separate pass for
    infinities would each cost about as much as ALMA's learning (~100 ns a row at 100 columns, a
    memory-bound pass over the frame). Raises a `ValueError` naming the column for non-numeric
    values, and for infinite ones unless `check_infinite=False` (the model's numba loop checks).
    """
    for column, dtype in X.dtypes.items():
        if dtype.kind not in "biuf":  # object/string columns: pandas would parse "1.5" as 1.5
            for value in X[column]:
                if value is not None and value == value:  # None/NaN: absent
                    validate_value(column, value)
    values = X.to_numpy(dtype=np.float64, na_value=np.nan)
    if check_infinite and not np.isfinite(values).all() and np.isinf(values).any():
        rows, cols = np.nonzero(np.isinf(values))
        raise infinite_entry_error(X, values, rows[0], cols[0])
    return values


def merge_shared_columns(
    X: typing.Any, values: np.ndarray, cols: np.ndarray, check_infinite: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`(values, cols)` of a frame with the frame columns that map to one model column (hashed
    names, see `streammargin.features`) summed into one, NaN where all of them are absent: the
    numba loops expect distinct columns. The sums run left to right, as `learn_one` adds up the
    names of a dict. Usually nothing repeats and the arrays come back as they are.

    `check_infinite`: the frame has not been checked for infinities yet (the model's loop finds
    them, but in merged columns it could no longer name the frame's column): when columns merge,
    check the frame here. A sum beyond float64's range raises `InvalidInput`.
    """
    known = cols[cols >= 0]
    if np.unique(known).shape[0] == known.shape[0]:
        return values, cols
    if check_infinite and np.isinf(values).any():  # the first in row order, as the loop finds it
        rows, columns = np.nonzero(np.isinf(values))
        raise infinite_entry_error(X, values, rows[0], columns[0])
    groups: dict[int, list[int]] = {}
    for position, column in enumerate(cols.tolist()):
        groups.setdefault(column if column >= 0 else -1 - position, []).append(position)
    merged = np.empty((values.shape[0], len(groups)), order="F")
    out_cols = np.empty(len(groups), dtype=np.int64)
    for j, (column, positions) in enumerate(groups.items()):
        out_cols[j] = max(column, -1)
        block = values[:, positions]
        total = block[:, 0].copy()
        with np.errstate(over="ignore"):  # an overflow raises below, naming the columns
            for k in range(1, len(positions)):
                entry = block[:, k]
                total = np.where(
                    np.isnan(total), entry, np.where(np.isnan(entry), total, total + entry)
                )
        if len(positions) > 1 and np.isinf(total).any() and not np.isinf(block).any():
            names = ", ".join(repr(X.columns[p]) for p in positions)
            raise InvalidInput(
                f"features {names:.200} share hashed column {column} and their values add up "
                "beyond float64's range"
            )
        merged[:, j] = total
    return merged, out_cols


class LearningFrame(typing.NamedTuple):
    """A frame ready to learn: merged (values, cols), the frame as read (raw, raw_cols) and the
    feature space's mark before it grew."""

    values: np.ndarray
    cols: np.ndarray
    raw: np.ndarray
    raw_cols: np.ndarray
    mark: tuple


class MarginClassifier(base.MiniBatchClassifier, abc.ABC):
    """Base class of the binary margin classifiers.

    Subclasses set `_state_arrays` (names of the numpy attributes that hold the learnt state) and
    `_state_values` (names of JSON-able attributes, e.g. counters), create them in `_reset()`, and
    implement the encoded-instance methods below.
    """

    _state_arrays: tuple[str, ...] = ()
    _state_values: tuple[str, ...] = ()
    # Columns before this one are reserved by the model (linear models keep the intercept at 0).
    _first_column: int = 0
    # True: `_learn_rows`/`_score_rows` find infinite entries themselves while they walk the frame
    # (raising `InfiniteEntry`, `_learn_rows` after restoring its state), which spares a pass over
    # the frame.
    _rows_check_infinite: bool = False

    # The model's bound on feature columns (a constructor param of every model).
    max_features: int

    def _reset(self) -> None:
        """Create the learnt state of a fresh model (called by the subclass' __init__)."""
        self._features = FeatureSpace(self._first_column, self.max_features)

    @property
    def _max_columns(self) -> int:
        """The most columns the model's arrays ever need: reserved ones plus `max_features`."""
        return self._first_column + self.max_features

    # What a model implements ----------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def _calibration(self) -> np.ndarray:
        """The calibration state (`streammargin.jit.calibration`), a view into the model's state."""

    @abc.abstractmethod
    def _reserve(self, n_columns: int) -> None:
        """Make the state hold at least `n_columns` feature columns (never more than
        `_max_columns`: grow with `grown(..., limit=self._max_columns)`)."""

    @classmethod
    @abc.abstractmethod
    def _max_array_bytes(cls, params: dict) -> int:
        """The most bytes the model's arrays can take with these (full) params, saved or not:
        the formula of `streammargin.memory.memory_bound`. Read integer params with
        `memory.int_param`; raise `ValueError` for params the formula cannot read."""

    @classmethod
    def _max_labels(cls, params: dict) -> int:
        """The most class labels the model stores (natively multiclass models)."""
        return 0

    @abc.abstractmethod
    def _score(self, idx: np.ndarray, val: np.ndarray) -> float:
        """Raw decision value of an encoded instance (idx < 0: unknown feature)."""

    def _proba(self, idx: np.ndarray, val: np.ndarray) -> float:
        """Calibrated probability of the positive label (models fuse this into one numba call)."""
        return calibration.proba(self._calibration, self._score(idx, val))

    @abc.abstractmethod
    def _learn(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        """One trial on an encoded instance, target in {-1.0, +1.0}; also feeds the calibrator."""

    @abc.abstractmethod
    def _score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Raw decision values of the rows of X (NaN = absent feature)."""

    @abc.abstractmethod
    def _learn_rows(self, X: np.ndarray, cols: np.ndarray, targets: np.ndarray) -> None:
        """`_learn` over the rows of X in order."""

    # River API ------------------------------------------------------------------------------------

    def decision_one(self, x: dict) -> float:
        """The raw score of `x`: its sign is the predicted label."""
        return self._score(*self._features.encode(x, grow=False))

    def _decide(self, idx: np.ndarray, val: np.ndarray) -> bool:
        """The predicted label (models may fuse this into one numba call)."""
        return calibration.decide(self._calibration, self._score(idx, val))

    def predict_one(self, x: dict, **kwargs: typing.Any) -> bool:
        # Either the sign of the score (the paper's decision) or the calibrated argmax,
        # whichever made fewer errors lately: see `streammargin.jit.calibration`.
        idx, val = self._features.encode(x, False)
        return self._decide(idx, val)

    def predict_proba_one(self, x: dict, **kwargs: typing.Any) -> dict[bool, float]:
        idx, val = self._features.encode(x, False)
        p_true = self._proba(idx, val)
        return {False: 1.0 - p_true, True: p_true}

    def learn_one(self, x: dict, y: typing.Any) -> None:
        target = 1.0 if y is True else -1.0 if y is False else binary_target(y)
        features = self._features
        idx, val = features.encode(x, True)
        self._reserve(features.n_columns)
        self._learn(idx, val, target)

    def _frame(self, X: typing.Any, grow: bool) -> tuple[np.ndarray, np.ndarray]:
        """The frame's values and model columns, with the columns that map to one model column
        merged. `grow`: the caller rolls the feature space back if this raises."""
        # validated before the feature space may grow
        values = frame_values(X, check_infinite=not self._rows_check_infinite)
        cols = self._features.encode_columns(X.columns, grow=grow)
        return merge_shared_columns(X, values, cols, self._rows_check_infinite)

    def learn_many(self, X: typing.Any, y: typing.Any) -> None:
        """Learn from the rows of a DataFrame in order: the same as `learn_one` row by row.

        NaN marks a feature absent from a row (pandas' missing value); infinities, strings and
        unknown labels raise a `ValueError` and leave the model as it was.
        """
        targets = binary_targets(y)
        if len(targets) != len(X):
            raise InvalidInput(f"X has {len(X)} rows but y has {len(targets)} labels")
        frame = self._learning_frame(X)
        values, cols = frame.values, frame.cols
        self._reserve(self._features.n_columns)
        try:
            self._learn_rows(values, cols, targets)
        except InfiniteEntry as bad:  # the model restored its state; forget the new names too
            self._features.rollback(frame.mark)
            # (the frame's own columns: a merged frame was checked by merge_shared_columns)
            raise infinite_entry_error(X, frame.raw, bad.row, bad.column) from None
        self._features.count_hashed(frame.raw, frame.raw_cols)

    def _learning_frame(self, X: typing.Any) -> LearningFrame:
        """`_frame(X, grow=True)` that leaves the feature space as it was if it raises, with what
        `learn_many` needs to undo it later (`mark`) or count the hashed entries (`raw`)."""
        features = self._features
        mark = features.mark()
        raw = frame_values(X, check_infinite=not self._rows_check_infinite)
        raw_cols = features.encode_columns(X.columns, grow=True, values=raw)
        try:
            values, cols = merge_shared_columns(X, raw, raw_cols, self._rows_check_infinite)
        except InvalidInput:
            features.rollback(mark)
            raise
        return LearningFrame(values, cols, raw, raw_cols, mark)

    def decision_many(self, X: typing.Any) -> np.ndarray:
        """The raw scores of the rows of X (`decision_one` row by row)."""
        return self._decision_rows(X)

    def _decision_rows(self, X: typing.Any) -> np.ndarray:
        values, cols = self._frame(X, grow=False)
        try:
            return self._score_rows(values, cols)
        except InfiniteEntry as bad:
            raise infinite_entry_error(X, values, bad.row, bad.column) from None

    def predict_many(self, X: typing.Any) -> typing.Any:
        import pandas as pd

        scores = self._decision_rows(X)
        labels = np.empty(len(scores), dtype=np.bool_)
        calibration.decide_many(self._calibration, scores, labels)
        return pd.Series(labels, index=X.index)

    def predict_proba_many(self, X: typing.Any) -> typing.Any:
        import pandas as pd

        scores = self._decision_rows(X)
        p_true = np.empty_like(scores)
        calibration.proba_many(self._calibration, scores, p_true)
        return pd.DataFrame({False: 1.0 - p_true, True: p_true}, index=X.index)

    # Safe state -----------------------------------------------------------------------------------

    def to_state(self) -> dict:
        """The learnt model as numpy arrays and JSON values (see `streammargin.state`)."""
        params = self._get_params()
        json.dumps(params, allow_nan=False)  # fails loudly on a parameter without a safe state
        return {
            "model": type(self).__name__,
            "params": params,
            "features": self._features.to_state(),
            "arrays": {name: getattr(self, name) for name in self._state_arrays},
            "values": {name: getattr(self, name) for name in self._state_values},
        }

    @classmethod
    def from_state(
        cls, state: dict, max_bytes: int = memory.DEFAULT_MAX_STATE_BYTES
    ) -> MarginClassifier:
        """Rebuild a model from `to_state()`: it predicts and learns exactly like the original.

        The state may come from an untrusted checkpoint: anything malformed raises `StateError`
        and nothing else. In order: the dict's keys; the params (the constructor's own names
        only, JSON scalars), validated by the constructor with nothing allocated yet; the memory
        bound those params imply (`streammargin.memory.memory_bound`), refused above `max_bytes`;
        the feature space (its bound must be the params'); every array's dtype and shape against
        what the params and the feature space imply (`_state_shapes`, never beyond the bound's
        capacity), and its finiteness; then the fresh state is allocated (bounded by the
        validated params), the saved arrays and values put in, and the model's invariants
        checked (`_check_restored`).
        """
        if not isinstance(state, dict) or set(state) != _STATE_KEYS:
            raise StateError(f"a model state is a dict with exactly the keys {sorted(_STATE_KEYS)}")
        if state["model"] != cls.__name__:
            raise StateError(f"state of {state['model']!r:.80} cannot restore a {cls.__name__}")
        model = cls._validated(state["params"])
        # Only validated params reach the formula: no bound is computed from an inf, a bool or
        # a string.
        memory.check_state_bound(cls, model._get_params(), max_bytes)
        features = FeatureSpace.from_state(state["features"], cls._first_column, model.max_features)
        values = state["values"]
        if not isinstance(values, dict) or set(values) != set(cls._state_values):
            raise StateError(f"the state's values must be a dict of {list(cls._state_values)}")
        arrays = model._checked_arrays(state["arrays"], features.n_columns, values)
        model._reset()
        model._features = features
        for name, array in arrays.items():
            setattr(model, name, array)
        for name in cls._state_values:
            setattr(model, name, copy.deepcopy(values[name]))
        model._check_restored()
        # A last guard on the whole: `_state_shapes` keeps each array within the bound's capacity,
        # this checks every array, name and label against the formula.
        bound = memory.memory_bound(model) - memory.STATE_OVERHEAD
        if memory.memory_size(model) > bound:
            raise StateError(
                f"the saved {cls.__name__}'s arrays are larger than its params allow "
                f"({bound:,} bytes)"
            )
        return model

    @classmethod
    def _validated(cls, params: typing.Any) -> MarginClassifier:
        """A model of the saved params, validated by the constructor (a bad value is a
        `StateError` naming the parameter), before anything is allocated: `__init__` runs with
        `_reset` shadowed, so it validates and sets the params only."""
        names = set(inspect.signature(cls.__init__).parameters) - {"self"}
        if not isinstance(params, dict):
            raise StateError(f"the state's params must be a dict, got {type(params).__name__}")
        for name, value in params.items():
            if name not in names:
                raise StateError(f"{cls.__name__} has no parameter {name!r:.80} (in the state)")
            if not isinstance(value, (str, int, float, bool, type(None))):
                raise StateError(f"state parameter {name} is not a JSON scalar: {value!r:.60}")
        model = cls.__new__(cls)
        model._reset = _allocate_nothing  # type: ignore[method-assign]
        try:
            model.__init__(**params)  # type: ignore[misc]
        except (TypeError, ValueError) as error:
            raise StateError(f"bad parameter in the state of a {cls.__name__}: {error}") from None
        finally:
            del model._reset
        return model

    def _checked_arrays(self, arrays: typing.Any, n_columns: int, values: dict) -> dict:
        """Copies of the saved arrays, after checking each one's dtype (float64), shape
        (`_state_shapes`) and finiteness: the numba loops index without bounds checks and
        expect no NaN."""
        if not isinstance(arrays, dict) or set(arrays) != set(self._state_arrays):
            raise StateError(f"the state's arrays must be a dict of {list(self._state_arrays)}")
        checked = {}
        for name, expected in self._state_shapes(n_columns, values).items():
            array = arrays[name]
            if not (
                isinstance(array, np.ndarray)
                and array.dtype == np.float64
                and array.ndim == len(expected)
            ):
                raise StateError(f"state array {name!r} is not a {len(expected)}-d float64 array")
            for dim, want in zip(array.shape, expected):
                if isinstance(want, Capacity):
                    fits = want.fits(dim, empty=array.size == 0)
                else:
                    fits = dim == want
                if not fits:
                    raise StateError(
                        f"state array {name!r} has the shape {array.shape}, where the params and "
                        f"the feature space imply {_describe(expected)}"
                    )
            # A checkpoint read from a topic is untrusted, and the numba loops do not expect NaN:
            # refuse what no learning could have produced.
            if not np.isfinite(array).all():
                raise StateError(f"state array {name!r} holds NaN or infinite values")
            checked[name] = np.array(array, dtype=np.float64, order="C", copy=True)
        return checked

    @abc.abstractmethod
    def _state_shapes(self, n_columns: int, values: dict) -> dict[str, tuple]:
        """The shape of each array of `_state_arrays` that the params, the feature space
        (`n_columns`, reserved columns included) and the saved `values` (already checked to
        be a dict of `_state_values`) imply: a tuple of ints and `Capacity` dimensions
        (`self._capacity(n_columns)`: never beyond the bound's `_max_columns`)."""

    def _capacity(self, n_columns: int) -> Capacity:
        """The dimension of a saved array that grows with the feature space: `n_columns` to
        `_max_columns`."""
        return Capacity(n_columns, self._max_columns)

    @abc.abstractmethod
    def _check_restored(self) -> None:
        """Raise `StateError` if the restored arrays and values break an invariant of the model
        (a range no learning leaves, a cached quantity that does not match what it caches)."""

    @property
    def n_features(self) -> int:
        """Number of feature names the model keeps (names with an exact column)."""
        return len(self._features)

    def _feature_counters(self) -> dict[str, int]:
        """The feature space's counters, for every model's `counters`: names kept, and feature
        occurrences learnt through a hashed column (how often the `max_features` bound acted)."""
        return {"features": len(self._features), "features_hashed": self._features.features_hashed}
