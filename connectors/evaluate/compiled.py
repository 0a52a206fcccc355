"""A model's test-then-train over a chunk of records in one compiled call, for `runner.evaluate`.

`runner.evaluate` without a delay asks each record of every model, then it learns it. For a
model that has compiled steps (`streammargin.progressive.model_steps`: ALMA, the linear MPU, the
Convex Polytope Machine), alone or behind the runner's `Scaled` StandardScaler, `CompiledRun`
takes a chunk of records through them at once: the records' feature dicts become rows (one
shape per set of names, their values packed by `records.c`'s `rows_of_dicts`), `ModelSteps.run`
predicts then learns them in order, and the predictions go to the model's `Measures` as one
block (`Measures.add_block`). The predictions, the model and the scaler are those of the
per-record calls to the bit (`streammargin.progressive`), so every measure is the same.

A record the compiled call cannot take goes the per-record way, in its place: one of names the
model or the scaler has not learnt (learning it teaches them: the next records of those names
are rows), a value other than a finite number, a label that is not one of the model's classes
(a binary model's: a bool), a row the call stops before (`jit.PER_RECORD`).
"""

from __future__ import annotations

import typing

import numpy as np

from streammargin.jit import progressive as jit
from streammargin.progressive import Rows, Score, Shapes, _native_records, model_steps

__all__ = ["CompiledRun"]

#: The most sets of feature names a model keeps shapes for (past it they are learnt again:
#: a stream whose every record has names of its own cannot grow them without bound).
MAX_SHAPES = 1024


class CompiledRun:
    """One model's compiled steps over chunks of records (`of(model)`: None without them)."""

    def __init__(self, model: typing.Any, scaler: typing.Any, steps: typing.Any):
        self.model = model
        self.scaler = scaler
        self.steps = steps
        self.native = _native_records()
        self._shapes = Shapes(model, scaler)
        self._known: dict[tuple, int] = {}  # names -> shape
        self._refused: dict[tuple, tuple] = {}  # names -> names learnt when refused
        self._labels: list = []  # a multiclass model's labels, code -> label
        self._codes: dict = {}  # label -> code

    @classmethod
    def of(cls, model: typing.Any) -> CompiledRun | None:
        from connectors.evaluate.runner import Scaled
        from streammargin.scaler import StandardScaler

        scaler = None
        if isinstance(model, Scaled):
            if type(model.scaler) is not StandardScaler:
                return None
            model, scaler = model.model, model.scaler
        steps = model_steps(model)
        return None if steps is None else cls(model, scaler, steps)

    def take(self, xs: list, ys: list, measures: typing.Any,
             per_record: typing.Callable[[int], bool]) -> bool:
        """Test then train on every record of `xs`, `ys`, in order, scoring the predictions in
        `measures`; `per_record(i)` takes record i the per-record way (False: the model failed,
        the rest of the chunk is not for it). Returns whether the model is still running."""
        n = len(xs)
        i = 0
        while i < n:
            end, table, values = self._rows(xs, ys, i)
            if end == i:
                if not per_record(i):
                    return False
                i += 1
                continue
            score = Score.fresh(self.steps.n_classes, 1)
            done, why, predicted = self.steps.run(self.scaler, self._shapes,
                                                  Rows(None, table=table, values=values),
                                                  score)
            if done:
                self._score(table[:done, jit.ROW_LABEL], predicted, done, measures)
            i += done
            if why == jit.PER_RECORD:  # (the row it stopped before, the per-record way)
                if not per_record(i):
                    return False
                i += 1
        return True

    # Rows ---------------------------------------------------------------------------------

    def _rows(self, xs: list, ys: list, start: int) -> tuple[int, np.ndarray, np.ndarray]:
        """The rows of records [start, end), as many as can be rows from `start` on: (end,
        the rows' table, their values)."""
        n = len(xs)
        shapes_of, tables_of, values_of = [], [], []
        i = start
        while i < n:
            x = xs[i]
            if type(x) is not dict or not x:
                break
            names = tuple(x)
            shape = self._shape(names)
            if shape is None:
                break
            if self.native is not None:
                end, packed = self.native.rows_of_dicts(xs, i, names, bytes(len(names)), False)
                values = np.frombuffer(packed)
            else:
                end, values = _one_row(x, i)
            if end == i:
                break
            codes = self._label_codes(ys, i, end)
            if len(codes) < end - i:  # a label the compiled call cannot take
                values = values[: len(codes) * len(names)]
                end = i + len(codes)
                if end == i:
                    break
            shapes_of.append(np.full(end - i, shape, np.int64))
            tables_of.append(np.array(codes, np.int64))
            values_of.append(values)
            i = end
        if i == start:
            return start, _NO_TABLE, _NO_VALUES
        table = np.empty((i - start, 3), np.int64)
        table[:, jit.ROW_SHAPE] = np.concatenate(shapes_of)
        widths = np.array(self._shapes.holes, np.int64)[table[:, jit.ROW_SHAPE]]
        table[:, jit.ROW_HOLES] = np.cumsum(widths) - widths
        table[:, jit.ROW_LABEL] = np.concatenate(tables_of)
        return i, table, np.concatenate(values_of)

    def _shape(self, names: tuple) -> int | None:
        """The shape of records of these names, None while the model or the scaler has not
        learnt one of them (asked again once they have learnt more names)."""
        shape = self._known.get(names)
        if shape is not None:
            return shape
        learnt = (len(self.model._features.index),
                  0 if self.scaler is None else len(self.scaler._columns))
        if self._refused.get(names) == learnt:
            return None
        if len(self._known) + len(self._refused) >= MAX_SHAPES:
            self._known.clear()
            self._refused.clear()
            self._shapes = Shapes(self.model, self.scaler)
        try:
            shape = self._shapes.add([(name, j, None) for j, name in enumerate(names)])
        except (TypeError, ValueError):  # (a name without a safe state: per record)
            shape = None
        if shape is None:
            self._refused[names] = learnt
        else:
            self._known[names] = shape
        return shape

    def _label_codes(self, ys: list, start: int, end: int) -> list[int]:
        """The class codes of ys[start:end], up to the first label without one: a binary
        model's are the bools (0 False, 1 True), a multiclass model's its classes (of the same
        type: 1 is not True)."""
        codes: list[int] = []
        if self.steps.binary:
            for y in ys[start:end]:
                if y is True:
                    codes.append(1)
                elif y is False:
                    codes.append(0)
                else:
                    break
            return codes
        labels = self.model._labels
        if len(labels) != len(self._labels):
            self._labels = list(labels)
            self._codes = {label: code for code, label in enumerate(self._labels)}
        get, known = self._codes.get, self._labels
        for y in ys[start:end]:
            code = get(y)
            if code is None or type(known[code]) is not type(y):
                break
            codes.append(code)
        return codes

    # Scores -------------------------------------------------------------------------------

    def _score(self, label_codes: np.ndarray, predicted: typing.Any, n: int,
               measures: typing.Any) -> None:
        """The predictions of n rows as `Measures.add_block` takes them: what `add` gets from
        `predict_with_proba_one` (a binary model's {False: 1 - p, True: p}; a multiclass
        model's probabilities of its classes) reduced to the true label's and the positive
        class's probabilities."""
        trues = np.ascontiguousarray(label_codes)
        positive = measures.positive
        if self.steps.binary:
            signed = predicted[:n]
            p = np.abs(signed)
            preds = (signed > 0.0).astype(np.int64)
            complement = 1.0 - p
            p_true = np.where(trues == 1, p, complement)
            labels: list = [False, True]
            score = None
            if positive is not None:
                which = _code_of(labels, positive)
                score = p if which == 1 else complement if which == 0 else np.zeros(n)
        else:
            codes, proba = predicted
            labels = list(self.model._labels)
            preds = codes[:n]
            p_true = proba[np.arange(n), trues]
            score = None
            if positive is not None:
                which = _code_of(labels, positive)
                score = proba[:n, which].copy() if which is not None else np.zeros(n)
        measures.add_block(labels, trues, preds, p_true, score)


_NO_TABLE = np.zeros((0, 3), np.int64)
_NO_VALUES = np.zeros(0)


def _code_of(labels: list, label: typing.Any) -> int | None:
    """The code `{labels[code]: ...}.get(label)` would find (a dict's equality: 1 is True)."""
    return {value: code for code, value in enumerate(labels)}.get(label)


def _one_row(x: dict, i: int) -> tuple[int, np.ndarray]:
    """(i + 1, x's values) where every value is a finite number, else (i, nothing): the rows
    one by one where `records.c` is not built."""
    values = []
    for value in x.values():
        kind = type(value)
        if kind is not float and kind is not int and kind is not bool:
            return i, _NO_VALUES
        try:
            number = float(value)
        except OverflowError:
            return i, _NO_VALUES
        if number - number != 0.0:
            return i, _NO_VALUES
        values.append(number)
    return i + 1, np.array(values, np.float64)
