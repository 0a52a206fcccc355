"""What every streammargin classifier shares: River plumbing around a numeric core.

`FeatureSpaceClassifier` turns River dicts and frames into (columns, values) arrays through a
`FeatureSpace` and saves the model's state safely. On it, `MarginClassifier` codes the binary
labels, serves calibrated probabilities and runs mini-batches; `MulticlassMarginClassifier` keeps
labels as given (or the two binary ones) and does the same per class. A model module only says how
to score and learn from one encoded instance (and a batch of rows), keeping the paper's update
rule in view.
"""

from __future__ import annotations

import abc
import copy
import json
import math
import typing

import numpy as np
from river import base

from streammargin import memory, state, validation
from streammargin.errors import InvalidInput, StateError
from streammargin.features import MAX_MAX_FEATURES, FeatureSpace, canonical_order, validate_value
from streammargin.jit import calibration
from streammargin.jit.entry import EntryPoint
from streammargin.jit.layout import Layout

__all__ = [
    "Capacity",
    "InfiniteEntry",
    "check_calibration",
    "check_close",
    "check_range",
    "check_whole",
    "check_zero",
    "FeatureSpaceClassifier",
    "MarginClassifier",
    "MulticlassMarginClassifier",
    "binary_target",
    "binary_targets",
    "check_max_features",
    "frame_values",
    "grown",
    "merge_shared_columns",
    "plain_label",
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


# Labels whose JSON is surely within memory.MAX_LABEL_BYTES: a str of at most this many characters
# (JSON escapes a character in at most 12 bytes: a surrogate pair), an int of 64 bits, a bool.
_SURELY_SHORT_LABEL = (memory.MAX_LABEL_BYTES - 2) // 12
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def plain_label(y: typing.Any) -> typing.Any:
    """A class label as a plain Python value (numpy scalars compare and hash like them), validated:
    str, bool, int, finite float or tuples of them, at most `memory.MAX_LABEL_BYTES` of JSON
    (what a saved state stores). Anything else raises `InvalidInput`."""
    kind = type(y)
    if kind is bool or (kind is str and len(y) <= _SURELY_SHORT_LABEL) or (
        kind is int and _INT64_MIN <= y <= _INT64_MAX
    ):
        return y  # (what `checked_label` accepts as it is, without encoding it: ~2 us a record)
    return checked_label(y)


def checked_label(y: typing.Any) -> typing.Any:
    """`plain_label` without its shortcut for the labels it surely accepts: every check made."""
    if isinstance(y, np.generic):
        y = y.item()
    if y is None or (isinstance(y, float) and math.isnan(y)):
        raise InvalidInput(
            f"label {y!r} is not a class: a label must be a value other than None/NaN"
        )
    try:
        encoded = json.dumps(state.encode_name(y), allow_nan=False, separators=(",", ":"))
        hash(y)
    except (TypeError, ValueError):
        raise InvalidInput(
            f"label {y!r:.80} of type {type(y).__name__} is not supported: labels must be str, "
            "bool, int, finite float or tuples of them"
        ) from None
    if len(encoded) > memory.MAX_LABEL_BYTES:
        raise InvalidInput(
            f"label {y!r:.80} is too long to be stored: at most {memory.MAX_LABEL_BYTES} bytes "
            "of JSON"
        )
    return y


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
    if values.dtype.kind in "fiub":
        # Numbers: a scalar compared in Python, an array by its extremes (NaN is the extreme
        # of an array that holds one, and fails both comparisons). Why: a state check calls
        # this some 20 times, mostly on scalars, and four numpy calls each were a fifth of
        # decoding a peer's ALMA record (0.47 ms).
        if values.ndim == 0:
            within = low <= values.item() <= high
        else:
            within = values.size == 0 or bool(low <= values.min() and values.max() <= high)
    else:
        within = np.all(values >= low) and np.all(values <= high)
    if not within:
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
    numba loops expect distinct columns. The columns come in `features.canonical_order`, the
    order `learn_one` gives a dict's entries (by model column, unknown names last, names
    sharing a column by their JSON text), and the sums of shared columns run in it, so that
    both paths do the same arithmetic. Usually the columns are in that order and nothing
    repeats: the arrays come back as they are; otherwise the result is a column-major copy.

    `check_infinite`: the frame has not been checked for infinities yet (the model's loop finds
    them, but in merged or reordered columns it could no longer name the frame's column): when
    columns merge or move, check the frame here. A sum beyond float64's range raises
    `InvalidInput`.
    """
    order = canonical_order(list(X.columns), cols.tolist())
    known = cols[cols >= 0]
    distinct = np.unique(known).shape[0] == known.shape[0]
    if distinct and order is None:
        return values, cols
    if check_infinite and np.isinf(values).any():  # the first in row order, as the loop finds it
        rows, columns = np.nonzero(np.isinf(values))
        raise infinite_entry_error(X, values, rows[0], columns[0])
    if distinct:
        return np.asfortranarray(values[:, order]), cols[order]
    groups: dict[int, list[int]] = {}
    for position in range(cols.shape[0]) if order is None else order:
        column = int(cols[position])
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


class FeatureSpaceClassifier(base.MiniBatchClassifier, abc.ABC):
    """What every streammargin classifier shares: River dicts and frames in, through a bounded
    `FeatureSpace`, and the safe state (`to_state`, `from_state`).

    Subclasses set `_state_arrays` (names of the numpy attributes that hold the learnt state) and
    `_state_values` (names of JSON-able attributes, e.g. counters), create them in `_reset()`, and
    implement the methods below. `MarginClassifier` is the base of the binary models,
    `MulticlassMarginClassifier` that of the natively multiclass ones.
    """

    _state_arrays: tuple[str, ...] = ()
    # Arrays that checkpoints of earlier versions hold and this class now recomputes on restore
    # (the Gram matrices): accepted in a state and ignored.
    _recomputed_arrays: tuple[str, ...] = ()
    _state_values: tuple[str, ...] = ()
    # Columns before this one are reserved by the model (linear models keep the intercept at 0).
    _first_column: int = 0
    # True: `_learn_rows`/`_score_rows` find infinite entries themselves while they walk the frame
    # (raising `InfiniteEntry`, `_learn_rows` after restoring its state), which spares a pass over
    # the frame.
    _rows_check_infinite: bool = False

    # The model's bound on feature columns (a constructor param of every model).
    max_features: int

    # The layout of the model's state array `_st` (`streammargin.jit.layout`): its size and the
    # meaning of every entry (`streammargin.describe_state`). Scalars, hyper-parameters and the
    # calibration travel in that one array, and a model fuses score + calibration into one call
    # where it can, because a dispatch on the argument types costs 0.1-0.3 us per argument, as
    # much as the arithmetic of a small instance.
    _layout: Layout

    def _get_params(self) -> dict[str, typing.Any]:
        """River's `Base._get_params`, with the constructor's signature read once per class.

        Why: River reads it (`inspect.signature`) on every call, ~0.1 ms, and a model's params
        are asked for wherever it is checked, copied or bounded (`memory_bound`, `to_state`,
        `from_state`, a mix): five times per model record a peer decodes, a third of the
        1.1 ms that took for an ALMA of 20 features. The result is the same dict."""
        params: dict[str, typing.Any] = {}
        for param in memory.init_parameters(type(self)):
            name = param.name
            if param.kind == param.VAR_POSITIONAL:
                if positional_args := getattr(self, name, []):
                    params["_POSITIONAL_ARGS"] = positional_args
                continue
            if param.kind == param.VAR_KEYWORD:
                for key, value in getattr(self, name, {}).items():
                    params[key] = ((value.__class__, value._get_params())
                                   if isinstance(value, base.Base) else value)
                continue
            attr = getattr(self, name)
            params[name] = ((attr.__class__, attr._get_params())
                            if isinstance(attr, base.Base) else attr)
        return params

    def _state_layout(self) -> Layout:
        """The layout of `_st` (a model whose `st` grows with its classes builds its own)."""
        return self._layout

    def _reset(self) -> None:
        """Create the learnt state of a fresh model (called by the subclass' __init__)."""
        self._features = FeatureSpace(self._first_column, self.max_features)

    @property
    def _max_columns(self) -> int:
        """The most columns the model's arrays ever need: reserved ones plus `max_features`."""
        return self._first_column + self.max_features

    def _flush(self) -> None:
        """Apply the learning the model deferred, if any (ALMA leaves each learn_one's trial
        pending until its next prediction, which runs both in one numba call).

        Whatever reads the learnt state outside the model's own per-record methods calls this
        first: here `to_state`, pickling and the mini-batch methods, and
        `streammargin.memory.memory_size`; a model's per-record methods and inspection
        attributes call it themselves where they read the state."""

    # The per-record calls into `streammargin.jit`, through entry points
    # (`streammargin.jit.entry.EntryPoint`: no dispatch on the argument types per call):
    # attribute -> (entry point, the names of the model's arrays that are its first arguments).
    # `_bind` sets each attribute to the compiled function, after checking those arrays' types;
    # they are derived from the arrays' types, so not pickled.
    _entry_points: typing.ClassVar[dict[str, tuple[EntryPoint, tuple[str, ...]]]] = {}

    def _bind(self) -> None:
        """Set the `_entry_points` attributes, checking the types of the model's arrays they
        take (`EntryPoint.bind`: compiled, or loaded, at the first call). The model calls it
        where it makes or replaces those arrays (after its `_reset`, a growth); the base class
        after a restore and after unpickling."""
        for attribute, (entry, arrays) in self._entry_points.items():
            entry.bind(self, attribute, *[getattr(self, name) for name in arrays])

    def __getstate__(self) -> dict:
        self._flush()
        data = self.__dict__.copy()
        for name in self._entry_points:
            data.pop(name, None)
        return data

    def __setstate__(self, data: dict) -> None:
        self.__dict__.update(data)
        self._bind()

    # What a model implements ----------------------------------------------------------------------

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

    # Frames ---------------------------------------------------------------------------------------

    def _frame(self, X: typing.Any, grow: bool) -> tuple[np.ndarray, np.ndarray]:
        """The frame's values and model columns, with the columns that map to one model column
        merged. `grow`: the caller rolls the feature space back if this raises."""
        # validated before the feature space may grow
        values = frame_values(X, check_infinite=not self._rows_check_infinite)
        cols = self._features.encode_columns(X.columns, grow=grow)
        return merge_shared_columns(X, values, cols, self._rows_check_infinite)

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

    # Safe state -----------------------------------------------------------------------------------

    def to_state(self) -> dict:
        """The learnt model as numpy arrays and JSON values (see `streammargin.state`)."""
        self._flush()
        params = self._get_params()
        json.dumps(params, allow_nan=False)  # fails loudly on a parameter without a safe state
        return {
            "model": type(self).__name__,
            "params": params,
            "features": self._features.to_state(),
            "arrays": {name: getattr(self, name) for name in self._saved_arrays()},
            "values": {name: getattr(self, name) for name in self._state_values},
        }

    @classmethod
    def from_state(
        cls, state: dict, max_bytes: int = memory.DEFAULT_MAX_STATE_BYTES
    ) -> FeatureSpaceClassifier:
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
        arrays = state["arrays"]
        if isinstance(arrays, dict) and cls._recomputed_arrays:
            arrays = {k: a for k, a in arrays.items() if k not in cls._recomputed_arrays}
        # Only validated params reach the formula: no bound is computed from an inf, a bool or
        # a string.
        memory.check_state_bound(cls, model._get_params(), max_bytes)
        features = FeatureSpace.from_state(state["features"], cls._first_column, model.max_features)
        values = state["values"]
        if not isinstance(values, dict) or set(values) != set(cls._state_values):
            raise StateError(f"the state's values must be a dict of {list(cls._state_values)}")
        arrays = model._checked_arrays(arrays, features.n_columns, values)
        model._reset()
        model._features = features
        for name, array in arrays.items():
            setattr(model, name, array)
        for name in cls._state_values:
            setattr(model, name, copy.deepcopy(values[name]))
        model._check_restored()
        model._bind()  # the restored arrays' types, where the entry points are
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
    def _params_of_state(cls, params: dict) -> dict:
        """The constructor params a saved state's `params` (a dict of known names) stand for. A
        parameter added since a state was saved is missing from it and takes its default, unless
        the default is not what that state learnt with: a model then fills in the value that
        continues as the old code did (`BudgetPerceptron`'s margin 0). `OneVsRestClassifier`
        builds its members' prototype from them too."""
        return params

    @classmethod
    def _validated(cls, params: typing.Any) -> FeatureSpaceClassifier:
        """A model of the saved params, validated by the constructor (a bad value is a
        `StateError` naming the parameter), before anything is allocated: `__init__` runs with
        `_reset` shadowed, so it validates and sets the params only."""
        names = {param.name for param in memory.init_parameters(cls)}
        if not isinstance(params, dict):
            raise StateError(f"the state's params must be a dict, got {type(params).__name__}")
        for name, value in params.items():
            if name not in names:
                raise StateError(f"{cls.__name__} has no parameter {name!r:.80} (in the state)")
            if not isinstance(value, (str, int, float, bool, type(None))):
                raise StateError(f"state parameter {name} is not a JSON scalar: {value!r:.60}")
        params = cls._params_of_state(params)
        model = cls.__new__(cls)
        model._reset = _allocate_nothing  # type: ignore[method-assign]
        try:
            model.__init__(**params)  # type: ignore[misc]
        except (TypeError, ValueError) as error:
            raise StateError(f"bad parameter in the state of a {cls.__name__}: {error}") from None
        finally:
            del model._reset
        return model

    @staticmethod
    def _state_short_by(arrays: typing.Any, size: int, missing: int) -> np.ndarray | None:
        """The saved `st` of a state written before the last `missing` of a model's `size` state
        slots existed (float64, `size - missing` entries), for the model to complete before
        `_checked_arrays` checks it as any state; None for any other `arrays`."""
        saved = arrays.get("_st") if isinstance(arrays, dict) else None
        if (
            isinstance(saved, np.ndarray)
            and saved.dtype == np.float64
            and saved.shape == (size - missing,)
        ):
            return saved
        return None

    def _checked_arrays(self, arrays: typing.Any, n_columns: int, values: dict) -> dict:
        """Copies of the saved arrays, after checking each one's dtype (float64), shape
        (`_state_shapes`) and finiteness: the numba loops index without bounds checks and
        expect no NaN."""
        names = self._saved_arrays()
        if not isinstance(arrays, dict) or set(arrays) != set(names):
            raise StateError(f"the state's arrays must be a dict of {list(names)}")
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
                if hasattr(want, "fits"):  # Capacity, or another dimension with a rule
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

    def _saved_arrays(self) -> tuple[str, ...]:
        """The names of the arrays `to_state` saves: `_state_arrays`, and arrays that only some
        parameter sets have (a kernel model's warm-up rows with gamma="auto")."""
        return self._state_arrays

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

    def _predict_then_learn(self, x: dict, y: typing.Any) -> typing.Any:
        """`predict_one(x)` as it is before learning, then `learn_one(x, y)`: AutoClassifier's
        call on each member for a labelled record (`OneVsRestClassifier` saves its members'
        probability dicts in its own)."""
        label = self.predict_one(x)
        self.learn_one(x, y)
        return label


# The calibration's per-record functions: the state is a slice of a model's float64 state array
# (C-ordered, writable, `_calibration`), the score a float.
_CALIBRATED_PROBA = EntryPoint(calibration.proba, calibration.new_state(), 0.0)
_CALIBRATED_LABEL = EntryPoint(calibration.decide, calibration.new_state(), 0.0)


class MarginClassifier(FeatureSpaceClassifier):
    """Base class of the binary margin classifiers: labels True/1 and False/0/-1, a raw score whose
    sign is the paper's decision, calibrated probabilities and the decision rule
    (`streammargin.jit.calibration`). A model implements the encoded-instance methods below.
    """

    _entry_points = {
        "_calibrated_proba": (_CALIBRATED_PROBA, ()),
        "_calibrated_label": (_CALIBRATED_LABEL, ()),
    }

    # What a binary model implements ---------------------------------------------------------------

    @property
    @abc.abstractmethod
    def _calibration(self) -> np.ndarray:
        """The calibration state (`streammargin.jit.calibration`), a view into the model's state."""

    @abc.abstractmethod
    def _score(self, idx: np.ndarray, val: np.ndarray) -> float:
        """Raw decision value of an encoded instance (idx < 0: unknown feature)."""

    def _proba(self, idx: np.ndarray, val: np.ndarray) -> float:
        """Calibrated probability of the positive label: `calibration.proba` of the raw score.
        A model may fuse the two into one numba call (the MPUs), never compute it otherwise:
        `predict_with_proba_one` takes the probability from the score it computed for the
        label."""
        return self._calibrated_proba(self._calibration, self._score(idx, val))

    @abc.abstractmethod
    def _learn(self, idx: np.ndarray, val: np.ndarray, target: float) -> None:
        """One trial on an encoded instance, target in {-1.0, +1.0}; also feeds the calibrator."""

    @abc.abstractmethod
    def _score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Raw decision values of the rows of X (NaN = absent feature)."""

    # (Each jit module writes its own few-line rows loops, `jit/rows.row_entries` then the same
    # per-example function as `_learn`/`_score`: numba cannot take that function as an argument
    # and still cache the loop.)
    @abc.abstractmethod
    def _learn_rows(self, X: np.ndarray, cols: np.ndarray, targets: np.ndarray) -> None:
        """`_learn` over the rows of X in order."""

    # River API ------------------------------------------------------------------------------------

    def decision_one(self, x: dict) -> float:
        """The raw score of `x`: its sign is the predicted label."""
        return self._score(*self._features.encode(x, grow=False))

    def _decide(self, idx: np.ndarray, val: np.ndarray) -> bool:
        """The predicted label (models may fuse this into one numba call)."""
        return self._calibrated_label(self._calibration, self._score(idx, val))

    def predict_one(self, x: dict, **kwargs: typing.Any) -> bool:
        # Either the sign of the score (the paper's decision) or the calibrated argmax,
        # whichever made fewer errors lately: see `streammargin.jit.calibration`.
        idx, val = self._features.encode(x, False)
        return self._decide(idx, val)

    def _p_true(self, x: dict) -> float:
        """`predict_proba_one(x)[True]`, without the dict."""
        idx, val = self._features.encode(x, False)
        return self._proba(idx, val)

    def predict_proba_one(self, x: dict, **kwargs: typing.Any) -> dict[bool, float]:
        p_true = self._p_true(x)
        return {False: 1.0 - p_true, True: p_true}

    def predict_with_proba_one(self, x: dict) -> tuple[bool, dict[bool, float]]:
        """`(predict_one(x), predict_proba_one(x))`, exactly, from one encoding of `x` and, where
        the label comes from the raw score (the model does not override `_decide`; `_proba`
        always does), one score: a kernel model evaluates its kernel row once instead of twice.
        The Kafka worker's per-record call."""
        idx, val = self._features.encode(x, False)
        if type(self)._decide is MarginClassifier._decide:
            score = self._score(idx, val)
            cal = self._calibration
            label = self._calibrated_label(cal, score)
            p_true = self._calibrated_proba(cal, score)
        else:
            label = self._decide(idx, val)
            p_true = self._proba(idx, val)
        return label, {False: 1.0 - p_true, True: p_true}

    def learn_one(self, x: dict, y: typing.Any) -> None:
        target = 1.0 if y is True else -1.0 if y is False else binary_target(y)
        features = self._features
        idx, val = features.encode(x, True)
        self._reserve(features.n_columns)
        self._learn(idx, val, target)

    def _proba_then_learn(self, x: dict, y: typing.Any) -> float:
        """`predict_proba_one(x)[True]` as it is before learning, then `learn_one(x, y)`: a
        one-vs-rest member's call on a labelled record, without the probability dict. The first
        call validates x's values and the second its names before anything changes, as in the
        two River calls; a kernel model's learning reuses the row of the prediction."""
        p_true = self._p_true(x)
        self.learn_one(x, y)
        return p_true

    def learn_many(self, X: typing.Any, y: typing.Any) -> None:
        """Learn from the rows of a DataFrame in order: the same as `learn_one` row by row.

        NaN marks a feature absent from a row (pandas' missing value); infinities, strings and
        unknown labels raise a `ValueError` and leave the model as it was.
        """
        self._flush()
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

    def decision_many(self, X: typing.Any) -> np.ndarray:
        """The raw scores of the rows of X (`decision_one` row by row)."""
        return self._decision_rows(X)

    def _decision_rows(self, X: typing.Any) -> np.ndarray:
        self._flush()
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


class MulticlassMarginClassifier(FeatureSpaceClassifier):
    """Base class of the natively multiclass classifiers.

    Labels are kept as given (`plain_label`), in order of first appearance, at most `max_classes`
    of them (a constructor param): a record with a new label beyond it raises `InvalidInput` and
    changes nothing. In *binary mode* (`_binary` true) the classes are the two binary labels
    [False, True], coded as every binary model codes them (`binary_target`): the model is then a
    binary one (`_multiclass` false) with the same API and return types.

    A label travels to numba as its code, its index in `classes`; a model implements the
    encoded-instance methods below, and `_grow_classes` to make room for a new class. Every method
    has one return type: `predict_one` a label (None before any class), `predict_proba_one`
    {label: probability}, `decision_one` {label: raw score} over `_scored_labels` (every class,
    or in binary mode the positive one, the sign of whose score is the decision), and the
    mini-batch methods a Series or DataFrames of the same.

    Safe state: the labels learnt are `_encoded_labels` (`state.encode_name`, none in binary mode);
    `_state_shapes` reads their count with `_saved_label_count`, and `_check_restored` calls
    `_restore_labels` first.
    """

    _state_values = ("_encoded_labels",)

    max_classes: int

    @property
    def _binary(self) -> bool:
        """Binary mode: the classes are False and True (see the class docstring)."""
        return False

    @property
    def _multiclass(self) -> bool:
        return not self._binary

    def _reset(self) -> None:
        super()._reset()
        self._encoded_labels: list = []
        self._labels: list = [False, True] if self._binary else []
        self._label_index: dict = {False: 0, True: 1} if self._binary else {}

    @property
    def classes(self) -> list:
        """The labels, in the order of their codes (of first appearance)."""
        return list(self._labels)

    @property
    def _classes_held(self) -> int:
        """How many classes the model holds (`streammargin.memory.held_classes`)."""
        return len(self._labels)

    @property
    def _scored_labels(self) -> list:
        """The labels of the raw scores (`decision_one`): every class, or in binary mode the
        positive one."""
        return [True] if self._binary else self._labels

    # Labels -------------------------------------------------------------------------------------

    def _new_code(self, y: typing.Any) -> int:
        """The code of a label `_label_index` does not hold, validated before anything changes:
        in binary mode that of `binary_target(y)`, else the next code (a new class), refused
        beyond `max_classes`."""
        if self._binary:
            return 1 if binary_target(y) > 0.0 else 0
        plain_label(y)
        self._refuse_new_labels(1)
        return len(self._labels)

    def _refuse_new_labels(self, new: int) -> None:
        """Raise `InvalidInput` if `new` more labels would pass `max_classes`."""
        if len(self._labels) + new > self.max_classes:
            raise InvalidInput(
                f"a new label would make {len(self._labels) + new} classes, more than "
                f"max_classes={self.max_classes}: raise max_classes to learn more classes"
            )

    def _add_label(self, label: typing.Any) -> None:
        """Add a class (not in binary mode): its code is the next one."""
        label = plain_label(label)
        self._labels.append(label)
        self._label_index[label] = len(self._labels) - 1
        self._encoded_labels.append(state.encode_name(label))
        self._grow_classes()

    def _frame_codes(self, y: typing.Any) -> tuple[np.ndarray, list]:
        """The codes of a frame's labels and the new labels among them (in order of first
        appearance, to be added in that order), all validated and within `max_classes` before
        anything changes."""
        if self._binary:
            return (binary_targets(y) > 0.0).astype(np.int64), []
        labels = [plain_label(label) for label in y]
        new = list(dict.fromkeys(label for label in labels if label not in self._label_index))
        self._refuse_new_labels(len(new))
        first = len(self._labels)
        index = {**self._label_index, **{label: first + i for i, label in enumerate(new)}}
        return np.array([index[label] for label in labels], dtype=np.int64), new

    # What a model implements ------------------------------------------------------------------

    @abc.abstractmethod
    def _grow_classes(self) -> None:
        """Make room in the model's arrays for one more class (a new last code)."""

    @abc.abstractmethod
    def _learn_code(self, idx: np.ndarray, val: np.ndarray, code: int) -> None:
        """One trial on an encoded instance of class `code` (the next code: a new class, already
        added); also feeds the calibration."""

    @abc.abstractmethod
    def _predict_code(self, idx: np.ndarray, val: np.ndarray) -> int:
        """The code of the predicted class, -1 before any class."""

    @abc.abstractmethod
    def _class_probabilities(self, idx: np.ndarray, val: np.ndarray) -> np.ndarray:
        """The probability of each class, in code order."""

    @abc.abstractmethod
    def _class_scores(self, idx: np.ndarray, val: np.ndarray) -> np.ndarray:
        """The raw scores of `_scored_labels`."""

    @abc.abstractmethod
    def _learn_code_rows(self, X: np.ndarray, cols: np.ndarray, codes: np.ndarray) -> None:
        """`_learn_code` over the rows of X in order (NaN = absent feature)."""

    @abc.abstractmethod
    def _predict_code_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """`_predict_code` of every row of X (int64)."""

    @abc.abstractmethod
    def _probability_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """`_class_probabilities` of every row of X, one row each (columns past the classes are
        ignored)."""

    @abc.abstractmethod
    def _class_score_rows(self, X: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """`_class_scores` of every row of X, one row each (columns past them are ignored)."""

    @classmethod
    def _max_labels(cls, params: dict) -> int:
        return memory.int_param(params, "max_classes", 2)

    # River API ----------------------------------------------------------------------------------

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
        self._reserve(features.n_columns)
        self._learn_code(idx, val, code)

    def predict_one(self, x: dict, **kwargs: typing.Any) -> typing.Any:
        idx, val = self._features.encode(x, False)
        code = self._predict_code(idx, val)
        return self._labels[code] if code >= 0 else None

    def predict_proba_one(self, x: dict, **kwargs: typing.Any) -> dict:
        idx, val = self._features.encode(x, False)
        proba = self._class_probabilities(idx, val)
        return {label: float(p) for label, p in zip(self._labels, proba)}

    def _p_true(self, x: dict) -> float:
        """`predict_proba_one(x)[True]` in binary mode (a one-vs-rest member's call)."""
        if self._multiclass:
            raise TypeError(f"a multiclass {type(self).__name__} has no probability of True")
        return self.predict_proba_one(x)[True]

    def _proba_then_learn(self, x: dict, y: typing.Any) -> float:
        """`_p_true(x)` as it is before learning, then `learn_one(x, y)` (binary mode: a
        one-vs-rest member's call on a labelled record, `MarginClassifier._proba_then_learn`)."""
        p_true = self._p_true(x)
        self.learn_one(x, y)
        return p_true

    def predict_with_proba_one(self, x: dict) -> tuple[typing.Any, dict]:
        """`(predict_one(x), predict_proba_one(x))`, exactly, from one encoding of `x`: the Kafka
        worker's per-record call."""
        idx, val = self._features.encode(x, False)
        code, proba = self._code_and_probabilities(idx, val)
        return (self._labels[code] if code >= 0 else None,
                {label: float(p) for label, p in zip(self._labels, proba)})

    def _code_and_probabilities(self, idx: np.ndarray, val: np.ndarray) -> tuple[int, np.ndarray]:
        """`(_predict_code, _class_probabilities)` of an encoded instance (a model may compute
        both in one call)."""
        return self._predict_code(idx, val), self._class_probabilities(idx, val)

    def decision_one(self, x: dict) -> dict:
        """The raw scores {label: score} of `_scored_labels`."""
        idx, val = self._features.encode(x, False)
        scores = self._class_scores(idx, val)
        return {label: float(score) for label, score in zip(self._scored_labels, scores)}

    def learn_many(self, X: typing.Any, y: typing.Any) -> None:
        """Learn from the rows of a DataFrame in order: the same as `learn_one` row by row (a
        class first seen in a row gets its code there). NaN marks a feature absent from a row;
        infinities, strings and labels that are not classes raise a `ValueError` and leave the
        model as it was."""
        codes, new = self._frame_codes(y)
        if len(codes) != len(X):
            raise InvalidInput(f"X has {len(X)} rows but y has {len(codes)} labels")
        frame = self._learning_frame(X)
        for label in new:
            self._add_label(label)
        self._reserve(self._features.n_columns)
        self._learn_code_rows(frame.values, frame.cols, codes)
        self._features.count_hashed(frame.raw, frame.raw_cols)

    def predict_many(self, X: typing.Any) -> typing.Any:
        import pandas as pd

        values, cols = self._frame(X, grow=False)
        labels = self._labels
        codes = self._predict_code_rows(values, cols)
        predicted = [labels[code] if code >= 0 else None for code in codes]
        return pd.Series(predicted, index=X.index, dtype=bool if self._binary else None)

    def predict_proba_many(self, X: typing.Any) -> typing.Any:
        import pandas as pd

        values, cols = self._frame(X, grow=False)
        out = self._probability_rows(values, cols)
        labels = self._labels
        return pd.DataFrame(out[:, : len(labels)], index=X.index, columns=list(labels))

    def decision_many(self, X: typing.Any) -> typing.Any:
        """Raw scores of the rows, a DataFrame with a column per label of `decision_one`."""
        import pandas as pd

        values, cols = self._frame(X, grow=False)
        out = self._class_score_rows(values, cols)
        labels = self._scored_labels
        return pd.DataFrame(out[:, : len(labels)], index=X.index, columns=list(labels))

    # Safe state ---------------------------------------------------------------------------------

    def _saved_label_count(self, values: dict) -> int:
        """The number of labels a saved state holds (`values["_encoded_labels"]`), checked: a
        list (empty in binary mode) of at most `max_classes`."""
        labels = values["_encoded_labels"]
        name = type(self).__name__
        if not isinstance(labels, list):
            raise StateError(f"a {name}'s saved labels must be a list")
        if self._binary and labels:
            raise StateError(f"a binary {name} has no label list")
        if len(labels) > self.max_classes:
            raise StateError(
                f"the state holds {len(labels)} labels, more than max_classes={self.max_classes}"
            )
        return len(labels)

    def _restore_labels(self) -> None:
        """Decode and check the restored labels (valid classes, none twice) and rebuild the
        label lookup; a subclass' `_check_restored` calls it first."""
        labels = [state.decode_name(encoded) for encoded in self._encoded_labels]
        for label in labels:
            try:
                plain_label(label)
            except InvalidInput as error:
                raise StateError(f"a saved label is not valid: {error}") from None
        index = {label: i for i, label in enumerate(labels)}
        if len(index) != len(labels):
            raise StateError("a label appears twice in the saved state")
        if not self._binary:
            self._labels, self._label_index = labels, index
