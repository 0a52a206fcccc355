"""Progressive validation of a StandardScaler | model over many rows, in one compiled call.

A model's per-record path (`predict_one`, `learn_one`) costs a Python call per record and stage;
on a stream of small records that is most of the time a record takes. `ModelSteps.run` takes a
batch of rows through the scaler and the model, test-then-train in order, with the score-keeping
of progressive validation (accuracy, rolling accuracy, log loss, per-class tallies and River's
DDM), in one call of `streammargin.jit.progressive`: the same arithmetic in the same order as the
per-record path, so the same predictions, the same model and scaler to the last bit.

- `Shapes`: the shapes of the rows: a shape is a record's feature names in the order of its dict,
  each with where its value comes from (a *hole* of the row, or a constant: a boolean's 0/1, a
  category indicator's 1.0) and its columns in the scaler and the model (`add`: every name
  learnt by both, as the rows of a stream whose names are known; `add_for_prediction`: names
  either has not learnt are predicted as `predict_one` does);
- `Rows`: a batch: each row's shape, its holes and its label's class code;
- `Score`: the score-keeping's state as arrays (a caller's metrics, copied in and out);
- `ModelSteps`: a model's compiled step (`model_steps(model)`, None for a model without one:
  ALMA, the linear MPU and the Convex Polytope Machine have one);
- `predict_many(model, scaler, xs)`: the predictions of many feature dicts in one call, those
  of `predict_with_proba_one` to the bit, nothing learnt (a server's batch of rows).

>>> import streammargin
>>> from streammargin.progressive import Rows, Score, Shapes, model_steps
>>> model, scaler = streammargin.ALMAClassifier(), streammargin.StandardScaler()
>>> for x, y in [({"a": 1.0, "b": 2.0}, True), ({"a": -1.0, "b": 0.5}, False)]:
...     scaler.learn_one(x)
...     model.learn_one(scaler.transform_one(x), y)
>>> shapes = Shapes(model, scaler)
>>> shape = shapes.add([("a", 0, None), ("b", 1, None)])  # (name, hole, constant)
>>> rows = Rows([shape, shape], [[2.0, 1.0], [-2.0, 0.0]], labels=[1, -1])
>>> steps = model_steps(model)
>>> done, why, signed = steps.run(scaler, shapes, rows, Score.fresh(2))
>>> done, why, [s > 0 for s in signed.tolist()]
(2, 0, [True, False])
"""

from __future__ import annotations

import itertools
import operator
import typing

import numpy as np

from streammargin.errors import StateError
from streammargin.features import name_json
from streammargin.jit import progressive as jit

__all__ = ["ModelSteps", "PredictionShapes", "Rows", "Score", "Shapes", "model_steps",
           "predict_many"]

_NO_SCALER = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
# (`map(operator.is_, values, _ALWAYS_TRUE)`: which values are the object True, in C)
_ALWAYS_TRUE = itertools.repeat(True)


class Shapes:
    """The shapes of a model's rows (and its scaler's), resolved once each: their entries' columns
    and their order (`tables`: those `streammargin.jit.progressive` reads, see its doc)."""

    def __init__(self, model: typing.Any, scaler: typing.Any = None):
        self.model = model
        self.scaler = scaler
        self._spans: list = []
        self._entries: list = []
        self._values: list = []
        self._order: list = []
        self._tables: tuple | None = None  # the arrays of the lists, made when read
        self.holes: list[int] = []  # each shape's number of holes

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(spans, entries, values, order) as arrays."""
        if self._tables is None:
            self._tables = (np.array(self._spans, np.int64).reshape(-1, 2),
                            np.array(self._entries, np.int64).reshape(-1, 3),
                            np.array(self._values, np.float64),
                            np.array(self._order, np.int64))
        return self._tables

    def __len__(self) -> int:
        return len(self._spans)

    def add(self, names: typing.Sequence[tuple]) -> int | None:
        """The shape of rows whose features are `names`, in the order of their dict: (name, hole
        or None, constant) each, the constant a feature's value when it has no hole (an int 0/1
        for a boolean, True for a category indicator, which the scaler passes unscaled). None
        when a name has no column of its own in the model, or (a number) in the scaler: the rows
        then take the per-record path, which learns the name."""
        index = self.model._features.index
        columns = self.scaler._columns if self.scaler is not None else None
        resolved = []
        for name, hole, constant in names:
            model_column = index.get(name)
            if model_column is None:
                return None
            if columns is None or constant is True:
                scaler_column = jit.UNSCALED
            else:
                scaler_column = columns.get(name)
                if scaler_column is None:
                    return None
            resolved.append((hole, scaler_column, model_column, constant))
        model_columns = [entry[2] for entry in resolved]
        if len(set(model_columns)) != len(model_columns):
            return None  # (names share a column: a feature space's hashing, the per-record path)
        order = sorted(range(len(resolved)), key=model_columns.__getitem__)
        return self._append(resolved, order)

    def add_for_prediction(self, names: typing.Sequence[tuple]) -> int | None:
        """`add` for rows that are only predicted: a name the model has not learnt has no
        weight (its value still counts, `streammargin.features`), one the scaler has not learnt
        scales to 0.0 or, beyond its bound, passes unscaled, as `predict_one` and
        `transform_one` take them. None where the feature space would hash a name (its exact
        columns are full, or the name is too long): the per-record path."""
        from streammargin.features import MAX_NAME_BYTES
        from streammargin.scaler import _name_ok

        features = self.model._features
        index = features.index
        scaler = self.scaler
        resolved = []
        tie = []
        for name, hole, constant in names:
            model_column = index.get(name)
            if model_column is None:
                if features.hashing or len(name_json(name)) > MAX_NAME_BYTES:
                    return None
                model_column = -1
            if scaler is None or constant is True:
                scaler_column = jit.UNSCALED
            else:
                scaler_column = scaler._columns.get(name)
                if scaler_column is None:
                    full = len(scaler._columns) >= scaler.max_features
                    scaler_column = jit.UNSCALED if full or not _name_ok(name) else jit.UNSEEN
            resolved.append((hole, scaler_column, model_column, constant))
            tie.append(name_json(name) if model_column < 0 else "")
        model_columns = [entry[2] for entry in resolved]
        known = [column for column in model_columns if column >= 0]
        if len(set(known)) != len(known):
            return None
        last = 1 << 62  # unknown names after every column, among them by their JSON text
        order = sorted(range(len(resolved)),
                       key=lambda j: (model_columns[j] if model_columns[j] >= 0 else last, tie[j]))
        return self._append(resolved, order)

    def _append(self, resolved: list, order: list[int]) -> int:
        first = len(self._entries)
        for hole, scaler_column, model_column, constant in resolved:
            self._entries.append((-1 if hole is None else hole, scaler_column, model_column))
            self._values.append(0.0 if hole is not None else float(constant))
        self._order.extend(order)
        self._spans.append((first, len(resolved)))
        self.holes.append(sum(1 for entry in resolved if entry[0] is not None))
        self._tables = None
        return len(self._spans) - 1


class PredictionShapes:
    """The shapes `predict_many` resolved for a model and scaler that learn nothing meanwhile (a
    served checkpoint's), kept from one call to the next: a server's requests bring the same
    few shapes again and again.

    Bounded, whatever the requests bring (a hostile one may bring a new set of names each row):
    once the name sets kept hold more than `MAX_NAMES` names or `MAX_CHARS` characters of
    them, it starts again, empty, before and after each call. What it holds then stays within
    `BYTES` (the shapes' entries, ~200 bytes a name, and the names' strings), which
    `connectors/serving/sizing.py` charges each version served."""

    MAX_NAMES = 4_096
    MAX_CHARS = 1 << 18
    BYTES = 2 << 20

    def __init__(self, model: typing.Any, scaler: typing.Any = None):
        self.model, self.scaler = model, scaler
        self._empty()

    def _empty(self) -> None:
        self.shapes = Shapes(self.model, self.scaler)
        self.known: dict[tuple, int | None] = {}
        self.names = self.chars = 0

    def current(self, model: typing.Any, scaler: typing.Any
                ) -> tuple[Shapes, dict[tuple, int | None]]:
        """(shapes, the shape of each (names, flags) seen), emptied first when past its bound;
        `ValueError` for another model or scaler than its own."""
        if model is not self.model or scaler is not self.scaler:
            raise ValueError("these prediction shapes are another model's")
        self.settle()
        return self.shapes, self.known

    def holds(self, names: tuple) -> None:
        """Counts a name set the caller has just added to `known`."""
        self.names += len(names)
        self.chars += sum(len(name) if type(name) is str else 16 for name in names)

    def settle(self) -> None:
        """Empties it if past its bound (a call may take it past; the next one starts within)."""
        if self.names > self.MAX_NAMES or self.chars > self.MAX_CHARS:
            self._empty()


class Rows:
    """A batch of rows: `rows[r]` = (shape, first hole, label code: -1 none, else the class
    code; binary 0 False, 1 True) and `holes`, every row's values in one array."""

    __slots__ = ("rows", "holes")

    def __init__(self, shapes: typing.Sequence[int] | np.ndarray,
                 holes: typing.Sequence[typing.Sequence[float]] | None = None,
                 labels: typing.Sequence[int] | None = None, *,
                 table: np.ndarray | None = None, values: np.ndarray | None = None):
        if table is not None:  # (already laid out: `rows` and the holes' values)
            self.rows = table
            self.holes = values
            return
        n = len(shapes)
        rows = np.empty((n, 3), np.int64)
        rows[:, jit.ROW_SHAPE] = shapes
        lengths = [len(h) for h in holes] if holes is not None else [0] * n
        rows[:, jit.ROW_HOLES] = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if n else []
        rows[:, jit.ROW_LABEL] = -1 if labels is None else labels
        self.rows = rows
        self.holes = np.array([v for h in holes for v in h] if holes else [], np.float64)

    def __len__(self) -> int:
        return self.rows.shape[0]


class Score:
    """Progressive validation's state as `streammargin.jit.progressive` keeps it: `tallies`,
    `losses`, the rolling `window`, per-class counts added (`classes`) and the row that first
    added each class to a count (`first`), the `detector` (see the jit module's doc)."""

    __slots__ = ("tallies", "losses", "window", "classes", "first", "detector")

    def __init__(self, tallies: np.ndarray, losses: np.ndarray, window: np.ndarray,
                 classes: np.ndarray, first: np.ndarray, detector: np.ndarray):
        self.tallies, self.losses, self.window = tallies, losses, window
        self.classes, self.first, self.detector = classes, first, detector

    @classmethod
    def fresh(cls, n_classes: int, rolling_window: int = 1000) -> Score:
        """A score with nothing counted and no detector."""
        tallies = np.zeros(jit.TALLIES, np.int64)
        tallies[jit.ROLLING] = rolling_window
        first = np.full((3, n_classes), jit.NOT_YET, np.int64)
        return cls(tallies, np.zeros(2), np.zeros(rolling_window, np.uint8),
                   np.zeros((3, n_classes), np.int64), first, np.zeros(jit.DETECTOR))


class ModelSteps:
    """A model's compiled test-then-train over rows (`model_steps`)."""

    def __init__(self, model: typing.Any, kind: str):
        self.model = model
        self.kind = kind
        #: Whether the outputs are a binary model's (signed probabilities) or classes'.
        self.binary = kind != "cpm" or model._binary

    @property
    def n_classes(self) -> int:
        """The classes the rows' label codes and the score's counts index: the model's."""
        return 2 if self.binary else len(self.model._labels)

    def run(self, scaler: typing.Any, shapes: Shapes, rows: Rows, score: Score
            ) -> tuple[int, int, typing.Any]:
        """Predict, then learn the labelled rows, in order, counting each labelled prediction
        in `score`; stop after a drift or before a row the per-record path must take (see
        `streammargin.jit.progressive`). Returns (rows done, why it stopped, the predictions):
        a binary model's +P(True) if the label is True, else -P(True), one per row; a
        multiclass model's (class codes, -1 before any class, and probabilities)."""
        model = self.model
        counts, means, variances = _NO_SCALER if scaler is None else (
            scaler._counts, scaler._means, scaler._vars)
        n = len(rows)
        tables = (rows.rows, *shapes.tables(), rows.holes, score.tallies, score.losses,
                  score.window, score.classes, score.first, score.detector)
        if self.kind == "alma":
            model._flush()  # (learn_one's deferred trial: every reader of the state runs it)
            out = np.zeros(n)
            done, why = jit.alma_steps(model._vectors, model._st, counts, means, variances,
                                       *tables, out, 0.5)
        elif self.kind == "mpu":
            out = np.zeros(n)
            done, why = jit.linear_mpu_steps(model._support, model._slots, model._st,
                                             model._weights, counts, means, variances, *tables,
                                             out, 0.5)
        else:
            codes = np.full(n, -1, np.int64)
            proba = np.zeros((n, max(len(model._labels), 2)))
            done, why = jit.cpm_steps(model._weights, model._st, model._window, counts, means,
                                      variances, *tables, codes, proba, 0.5)
            if self.binary:
                out = np.where(codes == 1, proba[:, 1], -proba[:, 1])
            else:
                out = (codes, proba)
        if scaler is not None and score.tallies[jit.OVERFLOWS]:
            scaler.counters["overflow_skipped"] += int(score.tallies[jit.OVERFLOWS])
            score.tallies[jit.OVERFLOWS] = 0
        return done, why, out


def predict_many(model: typing.Any, scaler: typing.Any, xs: typing.Sequence[dict],
                 indicators: bool = False, shapes: PredictionShapes | None = None
                 ) -> tuple[list, list[dict]]:
    """The predicted label and the class probabilities of each feature dict of `xs`, exactly
    what `model.predict_with_proba_one(scaler.transform_one(x))` gives (x itself without a
    scaler), in one compiled call where the model has one; nothing is learnt.

    `indicators`: features of value True are category indicators, passed unscaled (the
    Kafka worker's `--scale` with categories). `shapes`: the shapes of earlier calls, where
    neither the model nor the scaler has learnt since (`PredictionShapes`). A dict the
    compiled call cannot take (a value other than a finite number, a name the feature space
    would hash) is predicted by the per-record calls in its place, which also raise for a bad
    value as they do.

    >>> import streammargin
    >>> from streammargin.progressive import predict_many
    >>> model = streammargin.ALMAClassifier()
    >>> model.learn_one({"a": 1.0}, True)
    >>> labels, probas = predict_many(model, None, [{"a": 2.0}, {"a": -1.0, "b": 5.0}])
    >>> labels == [model.predict_one({"a": 2.0}), model.predict_one({"a": -1.0, "b": 5.0})]
    True
    """
    steps = model_steps(model)
    results: list = [None] * len(xs)
    if steps is not None and xs:
        if type(xs) is not list:
            xs = list(xs)
        kept = shapes
        if kept is None:
            shapes, known = Shapes(model, scaler), {}
        else:
            shapes, known = kept.current(model, scaler)
        native = _native_records()
        # The rows of each shape, wherever they are in xs: nothing is learnt, so the compiled
        # call may take them grouped by shape (a server's rows alternate between shapes: one
        # category or another), each row's prediction put back in its place.
        by_shape: dict[int, tuple[tuple, bytes, list[int]]] = {}
        no_flags = [bytes(n) for n in range(9)]
        for i, x in enumerate(xs):
            if type(x) is not dict or not x:
                continue
            # (`True in` also finds a 1 or 1.0, which the exact flags then tell apart)
            if indicators and True in x.values():
                flags = bytes(map(operator.is_, x.values(), _ALWAYS_TRUE))
            else:
                flags = no_flags[len(x)] if len(x) < 9 else bytes(len(x))
            names = tuple(x)
            shape = known.get((names, flags), -1)
            if shape == -1:
                shape = known[(names, flags)] = _prediction_shape(shapes, x, flags)
                if kept is not None:
                    kept.holds(names)
            if shape is None:
                continue
            found = by_shape.get(shape)
            if found is None:
                by_shape[shape] = (names, flags, [i])
            else:
                found[2].append(i)
        shape_of, holes, at = [], [], []  # per run of one shape: its rows
        for shape, (names, flags, rows_at) in by_shape.items():
            run = [xs[i] for i in rows_at]
            i = 0
            while i < len(run):
                if native is not None:  # the rows of this shape, in one call
                    end, packed = native.rows_of_dicts(run, i, names, flags, indicators)
                    values = np.frombuffer(packed)
                else:
                    end = i + 1
                    found = _numbers(run[i], indicators)
                    values = None if found is None else np.array(found)
                if end == i or values is None:  # (a value the per-record calls refuse)
                    i += 1
                    continue
                shape_of.append(np.full(end - i, shape, np.int64))
                holes.append(values)
                at.append(np.array(rows_at[i:end], np.int64))
                i = end
        if at:
            positions = np.concatenate(at)
            table = np.empty((positions.shape[0], 3), np.int64)
            table[:, jit.ROW_SHAPE] = np.concatenate(shape_of)
            widths = np.array(shapes.holes, np.int64)[table[:, jit.ROW_SHAPE]]
            table[:, jit.ROW_HOLES] = np.cumsum(widths) - widths
            table[:, jit.ROW_LABEL] = -1
            rows = Rows(None, table=table, values=np.concatenate(holes))
            done, _, predicted = steps.run(scaler, shapes, rows, Score.fresh(steps.n_classes))
            positions = positions[:done].tolist()
            if steps.binary:
                for i, signed in zip(positions, predicted[:done].tolist()):
                    p = abs(signed)
                    results[i] = (signed > 0.0, {False: 1.0 - p, True: p})
            else:
                codes, proba = predicted
                labels = list(model._labels)
                for r, i in enumerate(positions):
                    code = int(codes[r])
                    results[i] = (labels[code] if code >= 0 else None,
                                  dict(zip(labels, proba[r, :len(labels)].tolist())))
        if kept is not None:
            kept.settle()
    out_labels, out_probas = [], []
    for x, found in zip(xs, results):
        if found is None:  # the per-record calls
            scaled = x if scaler is None else _transformed(scaler, x, indicators)
            found = model.predict_with_proba_one(scaled)
        out_labels.append(found[0])
        out_probas.append(found[1])
    return out_labels, out_probas


def _prediction_shape(shapes: Shapes, x: dict, flags: bytes) -> int | None:
    """The shape of the dicts of x's names and indicators (None: the per-record calls)."""
    entries, hole = [], 0
    for (name, value), indicator in zip(x.items(), flags):
        if indicator:
            entries.append((name, None, True))
        else:
            entries.append((name, hole, None))
            hole += 1
    try:
        return shapes.add_for_prediction(entries)
    except (TypeError, ValueError):  # (a name without a safe state)
        return None


def _native_records() -> typing.Any:
    """records.c's module (`rows_of_dicts`), where `streammargin warmup` built it."""
    from streammargin.jit import aot, dispatch

    return None if dispatch.is_recording() else aot.native("records")


def _numbers(x: dict, indicators: bool) -> list[float] | None:
    """The values of `x` but its indicators, as floats; None for one that is not a finite real
    number (a string, None, NaN, an int beyond float64)."""
    values = []
    for value in x.values():
        if indicators and value is True:
            continue
        kind = type(value)
        if kind is not float and kind is not int and kind is not bool:
            return None
        try:
            number = float(value)
        except OverflowError:
            return None
        if number - number != 0.0:
            return None
        values.append(number)
    return values


def _transformed(scaler: typing.Any, x: dict, indicators: bool) -> dict:
    if not indicators or True not in x.values():
        return scaler.transform_one(x)
    numbers = {k: v for k, v in x.items() if v is not True}
    scaled = scaler.transform_one(numbers)
    scaled.update({k: v for k, v in x.items() if v is True})
    return scaled


def model_steps(model: typing.Any) -> ModelSteps | None:
    """The compiled steps of `model`, or None where it has none (the per-record path)."""
    from streammargin.alma import ALMAClassifier
    from streammargin.convex_polytope import ConvexPolytopeClassifier
    from streammargin.mpu import LinearMPUClassifier

    kind = {ALMAClassifier: "alma", LinearMPUClassifier: "mpu",
            ConvexPolytopeClassifier: "cpm"}.get(type(model))
    return None if kind is None else ModelSteps(model, kind)


def check_rows(shapes: Shapes, rows: Rows) -> None:
    """`StateError` unless every row names a shape of `shapes` and holes within `rows.holes`
    (the compiled step reads them without bounds checks)."""
    table = rows.rows
    if table.ndim != 2 or table.shape[1] != 3 or table.dtype != np.int64:
        raise StateError("rows must be an int64 table of (shape, first hole, label)")
    if not len(table):
        return
    shape = table[:, jit.ROW_SHAPE]
    if shape.min() < 0 or shape.max() >= len(shapes):
        raise StateError("a row names no shape")
    needed = np.array(shapes.holes, np.int64)[shape]
    if table[:, jit.ROW_HOLES].min() < 0 or (table[:, jit.ROW_HOLES] + needed).max() > len(
            rows.holes):
        raise StateError("a row's holes are beyond the batch's values")
