"""Prequential evaluation of several models in one pass over a stream: the loop behind
`streammargin evaluate`.

Every record is a question to every model (`predict_one`, `predict_proba_one`), then, when its
label arrives, an answer: each model's prediction is scored (`metrics.Measures`) and the model
learns the record. The label arrives at once, or later, as River's `stream.simulate_qa` reveals
it (the same order, so the same numbers as `river.evaluate.progressive_val_score` with the same
`delay` and `moment`):

- `delay=k` records: the label of record i arrives before the question of record i + k (k = 0
  and k = 1 alike), as MOA's `EvaluatePrequentialDelayed -k` trains on record i - k before
  testing record i;
- with record times (`timed`, `--moment COLUMN`) and `delay` in seconds: the label of a record
  at time t arrives before the first question at t + delay or later, in arrival order (River
  appends a constant delay's records to its queue in order);
- `initial_window=N` records first train every model and test none, as MOA's
  `EvaluatePrequentialDelayed -p N -m` (`trainOnInitialWindow`). Without `-m` MOA leaves the
  first N - k records out altogether; records are never dropped here.

At most `max_pending` records wait for their labels (`PendingLimit` beyond): memory stays
bounded whatever the delay. Every `window` answers, each model's `Measures` closes a window
(`on_window`); a model that raises is reported with its error and the figures it had, and the
others go on. A model's time is the wall time of its own calls (prediction, learning), its
memory River's `_raw_memory_usage` at each window's end, its RAM-hours MOA's: the sum over
windows of its memory in GB times its time in hours.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import time
import typing

from connectors.evaluate.compiled import CompiledRun
from connectors.evaluate.metrics import ClassIndex, Measures, WindowRow

__all__ = ["MAX_CURVE_POINTS", "PendingLimit", "Result", "Scaled", "evaluate"]

log = logging.getLogger(__name__)

#: The most points a result's curve keeps (every other one is dropped beyond: bounded memory).
MAX_CURVE_POINTS = 4096
GIB = float(1 << 30)
#: Records a chunk of the compiled path holds at most (a window's end ends one sooner).
CHUNK = 2048


class PendingLimit(ValueError):
    """More records wait for their labels than the run may hold."""


class Scaled:
    """`StandardScaler() | model` without River's `Pipeline`: `streammargin.StandardScaler`
    (River's arithmetic bit for bit, in one compiled call a record) in front of `model`, in
    River's order: the prediction scales with the statistics before the record; learning updates
    them, then the model learns the record scaled with them (`transform_learn_one` gives both
    scalings in one pass, as the Kafka worker uses it)."""

    def __init__(self, model: typing.Any, scaler: typing.Any = None):
        from streammargin.scaler import StandardScaler

        self.model = model
        self.scaler = scaler if scaler is not None else StandardScaler()
        self._predict_with_proba = getattr(model, "predict_with_proba_one", None)
        self.predicted: tuple | None = None  # predict_then_learn's prediction, before learning

    def clone(self) -> Scaled:
        return Scaled(self.model.clone(), self.scaler.clone())

    def predict_with_proba_one(self, x: dict) -> tuple[typing.Any, dict]:
        scaled = self.scaler.transform_one(x)
        if self._predict_with_proba is not None:
            return self._predict_with_proba(scaled)
        return self.model.predict_one(scaled), self.model.predict_proba_one(scaled)

    def predict_one(self, x: dict) -> typing.Any:
        return self.model.predict_one(self.scaler.transform_one(x))

    def predict_proba_one(self, x: dict) -> dict:
        return self.model.predict_proba_one(self.scaler.transform_one(x))

    def learn_one(self, x: dict, y: typing.Any) -> None:
        _, after, update = self.scaler.transform_learn_one(x)
        self.scaler.apply_learn(update)
        self.model.learn_one(after, y)

    def predict_then_learn(self, x: dict, y: typing.Any) -> tuple[typing.Any, dict]:
        """`predict_with_proba_one(x)` then `learn_one(x, y)`, scaling `x` once for both."""
        self.predicted = None
        before, after, update = self.scaler.transform_learn_one(x)
        if self._predict_with_proba is not None:
            found = self._predict_with_proba(before)
        else:
            found = self.model.predict_one(before), self.model.predict_proba_one(before)
        self.predicted = found  # scored even if learning fails
        self.scaler.apply_learn(update)
        self.model.learn_one(after, y)
        return found

    @property
    def _raw_memory_usage(self) -> int:
        return self.scaler._raw_memory_usage + self.model._raw_memory_usage

    def __repr__(self) -> str:
        return f"StandardScaler | {self.model!r}"


@dataclasses.dataclass
class Result:
    """One model's run on one stream: its last window's row (the cumulative measures), its
    curve of the plotted window measure, its time and memory, and its error if it failed."""

    name: str
    n: int = 0  # records answered (predicted and, unless it failed then, learnt)
    seconds: float = 0.0  # in its own calls
    memory_bytes: int | None = None
    ram_hours: float = 0.0
    error: str | None = None
    last: WindowRow | None = None
    curve: list = dataclasses.field(default_factory=list)  # (records, window measure or None)
    window_auc_sum: float = 0.0
    window_auc_count: int = 0

    def measure(self, name: str) -> float | None:
        """A cumulative measure (AUC: the mean of the windows' where defined)."""
        if name == "auc":
            return (self.window_auc_sum / self.window_auc_count) if self.window_auc_count \
                else None
        return None if self.last is None else self.last.cumulative.get(name)

    @property
    def accuracy(self) -> float | None:
        return self.measure("accuracy")

    @property
    def log_loss(self) -> float | None:
        return self.measure("log_loss")

    @property
    def macro_f1(self) -> float | None:
        return self.measure("macro_f1")

    @property
    def rate(self) -> float:
        """Records/s of the model's own calls, NaN when too short to measure one."""
        return self.n / self.seconds if self.seconds >= 0.01 and self.n else math.nan

    @property
    def microseconds_per_record(self) -> float:
        return self.seconds / self.n * 1e6 if self.n else math.nan


class _Run:
    """One model in the loop: how it is called, its measures and its result."""

    def __init__(self, name: str, model: typing.Any, measures: Measures, plotted: str):
        self.model = model
        self.measures = measures
        self.result = Result(name)
        self.plotted = plotted
        self.window_seconds = 0.0
        predict_with_proba = getattr(model, "predict_with_proba_one", None)
        if predict_with_proba is None:
            predict_one, predict_proba_one = model.predict_one, model.predict_proba_one

            def predict_with_proba(x: dict) -> tuple:
                return predict_one(x), predict_proba_one(x)

        self.predict = predict_with_proba
        self.learn = model.learn_one
        then_learn = model.predict_then_learn if isinstance(model, Scaled) else None
        if then_learn is None:
            learn = self.learn

            def then_learn(x: dict, y: typing.Any) -> tuple:
                self.pending_answer = None
                found = predict_with_proba(x)
                self.pending_answer = found  # scored even if learning fails
                learn(x, y)
                return found

        self.predict_then_learn = then_learn
        self.pending_answer: tuple | None = None

    def fail(self, failure: BaseException) -> None:
        self.result.error = f"{type(failure).__name__}: {' '.join(str(failure).split())[:300]}"
        log.debug("model %s failed after %d records", self.result.name, self.result.n,
                  exc_info=True)

    def close_window(self) -> WindowRow:
        result = self.result
        result.n += len(self.measures)
        row = self.measures.close_window()
        result.last = row
        result.seconds += self.window_seconds
        try:
            memory = int(self.model._raw_memory_usage)
        except Exception:  # a failed model may not even measure
            memory = None
        if memory is not None:
            result.memory_bytes = memory
            result.ram_hours += memory / GIB * self.window_seconds / 3600.0
        self.window_seconds = 0.0
        auc = row.window_measures.get("auc")
        if auc is not None:
            result.window_auc_sum += auc
            result.window_auc_count += 1
        result.curve.append((row.records, row.window_measures.get(self.plotted)))
        if len(result.curve) > MAX_CURVE_POINTS:
            del result.curve[1::2]
        return row


def evaluate(
    models: dict[str, typing.Any],
    make_stream: typing.Callable[[], typing.Iterable],
    delay: float = 0,
    window: int = 1000,
    classes: typing.Iterable = (),
    positive: typing.Any = None,
    fading: float | None = None,
    timed: bool = False,
    initial_window: int = 0,
    max_pending: int = 100_000,
    plotted: str = "accuracy",
    on_window: typing.Callable[[Result, WindowRow], None] | None = None,
    on_progress: typing.Callable[[int], None] | None = None,
    progress_every: int = 1000,
    multiclass: bool = False,
    on_result: typing.Callable[[Result], None] | None = None,
    rolling: int | None = None,
) -> list[Result]:
    """Prequential evaluation of `models` in one pass over `make_stream()` (see the module's
    docstring); the results in the models' order.

    Records are (x, y), or (x, y, seconds) with `timed`. `classes`: the declared classes, in
    order (`metrics.ClassIndex`); `positive`: a binary stream's positive class (for AUC);
    `fading`: MOA's fading factor for faded measures; `plotted`: the window measure a result's
    curve keeps. `on_window(result, row)` after each model's window, `on_progress(records
    read)` every `progress_every` records and at the end, `on_result(result)` once a model's
    result is complete. `rolling` is `window`'s former name; `multiclass` is implied by the
    labels (kept for callers).
    """
    del multiclass  # every measure is computed; the caller shows what it needs
    if rolling is not None:
        window = rolling
    if delay < 0 or (not timed and delay != int(delay)):
        raise ValueError(f"delay {delay}: expected a count of records (or seconds with moments)")
    index = ClassIndex(classes)
    runs = [_Run(name, model, Measures(window, index, positive, fading), plotted)
            for name, model in models.items()]
    clock = time.perf_counter
    stream = iter(make_stream())
    first = list(itertools.islice(stream, 5))
    _warm_up(runs, first)
    stream = itertools.chain(first, stream)
    read = 0
    answered = 0
    if initial_window:
        for record in itertools.islice(stream, initial_window):
            read += 1
            x, y = record[0], record[1]
            for run in runs:
                if run.result.error is None:
                    start = clock()
                    try:
                        run.learn(x, y)
                    except Exception as failure:
                        run.fail(failure)
                    run.window_seconds += clock() - start
            if on_progress and read % progress_every == 0:
                on_progress(read)

    def end_of_window() -> None:
        for run in runs:
            if run.result.error is None or len(run.measures):
                row = run.close_window()
                if on_window:
                    on_window(run.result, row)

    compiled = [CompiledRun.of(run.model) for run in runs] if not delay and not timed \
        else []
    if any(compiled):
        # Test then train, a chunk of records at a time: each model with compiled steps takes
        # the chunk in one call (`compiled.CompiledRun`), the others record by record; a chunk
        # ends where a window does, so windows close where they would record by record.
        while True:
            size = min(CHUNK, window - answered % window)
            chunk = list(itertools.islice(stream, size))
            if not chunk:
                break
            xs = [record[0] for record in chunk]
            ys = [record[1] for record in chunk]
            for run, steps in zip(runs, compiled):
                if run.result.error is not None:
                    continue
                if steps is None:
                    for x, y in zip(xs, ys):
                        if not _test_then_train(run, x, y, clock):
                            break
                    continue
                start = clock()
                steps.take(xs, ys, run.measures,
                           lambda i, run=run: _test_then_train(run, xs[i], ys[i], clock))
                run.window_seconds += clock() - start
            before = read
            read += len(chunk)
            answered += len(chunk)
            if answered % window == 0:
                end_of_window()
            if on_progress and read // progress_every > before // progress_every:
                on_progress(read)
    elif not delay and not timed:
        # Test then train, record by record: River's fast path. `active`: the models that have
        # not failed, with what the loop calls of each (the per-record cost is the point).
        active = [(run, run.predict_then_learn, run.measures.answers.append) for run in runs
                  if run.result.error is None]
        for record in stream:
            read += 1
            x, y = record[0], record[1]
            for run, predict_then_learn, keep in active:
                start = clock()
                try:
                    y_pred, proba = predict_then_learn(x, y)
                except Exception as failure:
                    run.window_seconds += clock() - start
                    _keep_failed(run, y)
                    run.fail(failure)
                    active = [entry for entry in active if entry[0] is not run]
                    continue
                run.window_seconds += clock() - start
                keep((y, y_pred, proba))
            answered += 1
            if answered % window == 0:
                end_of_window()
            if on_progress and read % progress_every == 0:
                on_progress(read)
    else:
        # Questions now, answers when their labels arrive (River's simulate_qa's order).
        pending: collections.deque = collections.deque()
        for i, record in enumerate(stream):
            read += 1
            x, y = record[0], record[1]
            now = record[2] if timed else i
            while pending and pending[0][2] <= now:
                answered += _answer(runs, pending.popleft(), clock)
                if answered % window == 0:
                    end_of_window()
            predictions = []
            for run in runs:
                if run.result.error is not None:
                    predictions.append(None)
                    continue
                start = clock()
                try:
                    predictions.append(run.predict(x))
                except Exception as failure:
                    predictions.append(None)
                    run.fail(failure)
                run.window_seconds += clock() - start
            pending.append((x, y, now + delay, predictions))
            if len(pending) > max_pending:
                raise PendingLimit(
                    f"more than {max_pending:,} records wait for their labels at record {read:,}"
                )
            if on_progress and read % progress_every == 0:
                on_progress(read)
        while pending:
            answered += _answer(runs, pending.popleft(), clock)
            if answered % window == 0:
                end_of_window()
    if answered % window or not answered:
        end_of_window()
    if on_progress:
        on_progress(read)
    for run in runs:  # the time since the last window (a failed model's)
        run.result.seconds += run.window_seconds
        run.window_seconds = 0.0
    results = [run.result for run in runs]
    if on_result:
        for result in results:
            on_result(result)
    return results


def _test_then_train(run: _Run, x: dict, y: typing.Any,
                     clock: typing.Callable[[], float]) -> bool:
    """One record's test then train for one model, its answer scored; False if it failed."""
    start = clock()
    try:
        y_pred, proba = run.predict_then_learn(x, y)
    except Exception as failure:
        run.window_seconds += clock() - start
        _keep_failed(run, y)
        run.fail(failure)
        return False
    run.window_seconds += clock() - start
    run.measures.answers.append((y, y_pred, proba))
    return True


def _keep_failed(run: _Run, y: typing.Any) -> None:
    """A model predicted a record, then failed to learn it: its prediction is scored."""
    answer = run.model.predicted if isinstance(run.model, Scaled) else run.pending_answer
    if answer is not None:
        run.measures.answers.append((y, *answer))


def _answer(runs: list[_Run], entry: tuple, clock: typing.Callable[[], float]) -> int:
    """A label arrives: each model's prediction of its record is scored, then it learns."""
    x, y, _, predictions = entry
    for run, predicted in zip(runs, predictions):
        if predicted is None or run.result.error is not None:
            continue
        run.measures.add(y, *predicted)
        start = clock()
        try:
            run.learn(x, y)
        except Exception as failure:
            run.fail(failure)
        run.window_seconds += clock() - start
    return 1


def _warm_up(runs: list[_Run], first: list) -> None:
    """A clone of each model learns the stream's first records, so that the timing leaves out
    numba's loading of compiled code; a model that cannot be cloned or fails here is left to
    fail in the run, where its error is reported."""
    for run in runs:
        try:
            warm = run.model.clone()
            for record in first:
                warm.predict_proba_one(record[0])
                warm.learn_one(record[0], record[1])
        except Exception:
            continue
