"""Progressive validation of several models on one stream: the library behind `streammargin evaluate`.

Each model sees the stream test-then-train through River's own `stream.simulate_qa` (with an
optional label delay), so its accuracy (and macro F1) is exactly what
`river.evaluate.progressive_val_score` reports for the same model, stream and delay. Beside them
it measures log loss (from `predict_proba_one`), wall time, memory, and a rolling accuracy curve
for plots. A model that fails is reported with its error; the others go on.

Sources (`Source`): a River dataset by name, a River synthetic generator with keyword arguments,
a CSV file or a JSON-lines file with a label column. Every record is checked as the Kafka worker
checks an event before a model sees it (features are finite real numbers, or categories for the
columns to one-hot encode; the label is a str, number or bool): a bad record is set aside with
its place (`file:line`) and reason, and skipped, as the worker dead-letters it. `survey` reads a
source once first: its good and bad records, its classes, and its text columns (a column whose
values are mostly text is a category the user must one-hot encode or drop, not a pile of bad
records).
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import itertools
import json
import logging
import math
import pathlib
import time
import typing

from streammargin.errors import InvalidInput
from streammargin.features import validate_value

__all__ = [
    "BadRecord",
    "Result",
    "Source",
    "SourceError",
    "Survey",
    "evaluate",
    "is_binary_coded",
    "iter_csv",
    "iter_jsonl",
    "parse_call",
    "parse_label",
    "source_from_args",
    "survey",
]

log = logging.getLogger(__name__)

Stream = typing.Iterable[tuple[dict, typing.Any]]

#: Most distinct labels a survey tracks (more: the target is probably not a label column).
MAX_LABELS = 10_000
#: Most columns whose text values a survey counts, and bad records it keeps as examples.
MAX_TRACKED_COLUMNS = 10_000
MAX_BAD_EXAMPLES = 20


class SourceError(ValueError):
    """A source that cannot be read as a whole (no such file or dataset, no label column, ...)."""


def parse_call(text: str) -> tuple[str, dict[str, typing.Any]]:
    """'SEA(seed=42, variant=1)' -> ('SEA', {'seed': 42, 'variant': 1}); 'a.b.C' -> ('a.b.C', {}).

    Only keyword arguments with literal values: nothing is evaluated.
    """
    usage = f"cannot read {text!r}: expected Name or Name(key=value, ...) with literal values"
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(usage) from None
    if isinstance(node, (ast.Name, ast.Attribute)):
        return ast.unparse(node), {}
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Name, ast.Attribute))
        and not node.args
        and all(k.arg for k in node.keywords)
    ):
        raise ValueError(usage)
    kwargs = {}
    for keyword in node.keywords:
        try:
            kwargs[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            raise ValueError(usage) from None
    return ast.unparse(node.func), kwargs


def parse_label(value: typing.Any) -> typing.Any:
    """Labels read from text files: true/false and numbers become bool/int, others stay as is."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        try:
            number = float(value)
        except ValueError:
            return value.strip()
        if not math.isfinite(number):
            return value.strip()  # "nan", "inf": text, not numbers
        return int(number) if number.is_integer() else number
    return value


def _parse_cell(value: str) -> typing.Any:
    try:
        number = float(value)
    except ValueError:
        return value  # text: a category, or a bad value the record check names
    return number


# Records ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BadRecord:
    """A record set aside: where it is (`file:line`, or `Dataset record i`) and why.

    `text_feature` names the feature when the reason is a text value where a number belongs.
    """

    where: str
    reason: str
    text_feature: typing.Any = None

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


# One record as read: (where, x, y, problem); x and y are None when `problem` says why.
Row = tuple[str, typing.Any, typing.Any, typing.Optional[str]]


def check_record(
    where: str, x: typing.Any, y: typing.Any, one_hot: frozenset, drop: frozenset
) -> tuple[dict, typing.Any] | BadRecord:
    """The record's (x, y) as a model gets them, or the `BadRecord` it is.

    Features must be finite real numbers (bool counts as 0/1), the worker's rule; those of
    `one_hot` are categories (str, int, bool or finite float), those of `drop` go. The label
    must be a str, int, bool or finite float.
    """
    if hasattr(y, "dtype") and hasattr(y, "item") and getattr(y, "ndim", None) == 0:
        y = y.item()  # a numpy scalar (scikit-learn data): the plain value
    if y is None or (isinstance(y, str) and not y.strip()):
        return BadRecord(where, "no label")
    if not (isinstance(y, (str, int)) or (isinstance(y, float) and math.isfinite(y))):
        return BadRecord(where, f"label {y!r:.60} is not a class: expected a str, number or bool")
    if not isinstance(x, dict):
        return BadRecord(where, f"features must be an object, got {type(x).__name__}")
    features = {}
    for name, value in x.items():
        if name in drop:
            continue
        if name in one_hot:
            if isinstance(value, (str, int)) or (isinstance(value, float) and math.isfinite(value)):
                features[name] = value
                continue
            return BadRecord(
                where,
                f"feature {name!r} has value {value!r:.60}: expected a category (str or number)",
            )
        try:
            validate_value(name, value)
        except InvalidInput as error:
            return BadRecord(where, str(error), name if isinstance(value, str) else None)
        features[name] = value
    return features, y


def csv_rows(path: str | pathlib.Path, target: str) -> typing.Iterator[Row]:
    """Rows of a CSV file with a header (UTF-8, a byte-order mark allowed): numeric cells as
    floats, other cells as stripped text, empty cells absent; `where` is `path:line`."""
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as file:
        reader = csv.reader(file)
        try:
            header = next(reader)
        except StopIteration:
            raise SourceError(f"{path} is empty: expected a header line") from None
        except csv.Error as error:
            raise SourceError(f"{path}:1: unreadable header: {error}") from None
        header = [name.strip() for name in header]
        if target not in header:
            raise SourceError(f"{path}: no column {target!r} (columns: {', '.join(header)})")
        position = header.index(target)
        while True:
            line = reader.line_num + 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as error:  # e.g. a field beyond csv.field_size_limit()
                yield f"{path}:{line}", None, None, f"unreadable CSV line: {error}"
                if reader.line_num < line:  # no progress: stop rather than loop
                    return
                continue
            if not cells:
                continue  # a blank line
            if len(cells) != len(header):
                yield (f"{path}:{line}", None, None,
                       f"{len(cells)} fields where the header has {len(header)}")
                continue
            x = {
                name: _parse_cell(cell.strip())
                for i, (name, cell) in enumerate(zip(header, cells))
                if i != position and cell.strip() != ""
            }
            yield f"{path}:{line}", x, parse_label(cells[position]), None


def jsonl_rows(path: str | pathlib.Path, target: str) -> typing.Iterator[Row]:
    """Objects of a JSON-lines file: the features are `x` if it is an object (the Kafka event
    contract), else every key but the target, `id` and `ts`; `where` is `path:line`."""
    with open(path, "rb") as file:
        for number, raw in enumerate(file, 1):
            where = f"{path}:{number}"
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except UnicodeDecodeError:
                yield where, None, None, "not UTF-8 text"
                continue
            except json.JSONDecodeError as error:
                yield where, None, None, f"not JSON: {error.msg} at column {error.colno}"
                continue
            except RecursionError:
                yield where, None, None, "not JSON: nested too deeply"
                continue
            if not isinstance(record, dict):
                yield where, None, None, f"not a JSON object but {type(record).__name__}"
                continue
            if target not in record:
                yield where, None, None, f"no {target!r} field (the label)"
                continue
            x = record["x"] if isinstance(record.get("x"), dict) else {
                k: v for k, v in record.items() if k not in (target, "id", "ts")
            }
            yield where, x, parse_label(record[target]), None


def iter_csv(path: str | pathlib.Path, target: str) -> Stream:
    """(x, y) of the good records of a CSV file (`csv_rows`, bad records skipped)."""
    return _good(csv_rows(path, target), frozenset(), frozenset())


def iter_jsonl(path: str | pathlib.Path, target: str) -> Stream:
    """(x, y) of the good records of a JSON-lines file (`jsonl_rows`, bad records skipped)."""
    return _good(jsonl_rows(path, target), frozenset(), frozenset())


def _checked(rows: typing.Iterable[Row], one_hot: frozenset, drop: frozenset):
    for where, x, y, problem in rows:
        if problem is not None:
            yield BadRecord(where, problem)
        else:
            yield check_record(where, x, y, one_hot, drop)


def _good(rows: typing.Iterable[Row], one_hot: frozenset, drop: frozenset) -> Stream:
    for checked in _checked(rows, one_hot, drop):
        if not isinstance(checked, BadRecord):
            yield checked


def river_dataset(name: str, kwargs: dict) -> typing.Any:
    from river import datasets
    from river.datasets import synth

    for module in (datasets, synth):
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            try:
                return cls(**kwargs)
            except (TypeError, ValueError) as error:
                raise SourceError(f"cannot make {name}({kwargs}): {error}") from None
    raise SourceError(f"no River dataset or generator named {name!r}")


@dataclasses.dataclass
class Source:
    """A stream of records: `rows()` gives a fresh iterator of `Row`s, at most `n` of them."""

    name: str
    rows_of: typing.Callable[[], typing.Iterator[Row]]
    n: int | None = None
    columns: list | None = None  # a CSV file's header

    def rows(self) -> typing.Iterator[Row]:
        rows = self.rows_of()
        return itertools.islice(rows, self.n) if self.n else rows

    def records(self, one_hot: typing.Iterable = (), drop: typing.Iterable = ()) -> Stream:
        """(x, y) of the good records, in order (bad ones skipped)."""
        return _good(self.rows(), frozenset(one_hot), frozenset(drop))


def source_from_args(
    dataset: str | None = None,
    csv_path: str | None = None,
    jsonl_path: str | None = None,
    target: str | None = None,
    n: int | None = None,
) -> Source:
    """The chosen stream; `SourceError` for a bad name, file or label column."""
    chosen = [s for s in (dataset, csv_path, jsonl_path) if s]
    if len(chosen) != 1:
        raise SourceError(
            "choose exactly one of a dataset/generator, a CSV file, a JSON-lines file"
        )
    if dataset:
        try:
            name, kwargs = parse_call(dataset)
        except ValueError as error:
            raise SourceError(str(error)) from None
        river_dataset(name, kwargs)  # fail early on a bad name

        def dataset_rows() -> typing.Iterator[Row]:
            for i, (x, y) in enumerate(river_dataset(name, kwargs), 1):
                yield f"{name} record {i}", x, y, None

        return Source(dataset, dataset_rows, n)
    if not target:
        raise SourceError("a file source needs --target, the label column")
    path = pathlib.Path(csv_path or jsonl_path)  # type: ignore[arg-type]
    if not path.is_file():
        raise SourceError(f"no such file: {path}")
    if csv_path:
        try:
            with open(path, newline="", encoding="utf-8-sig", errors="replace") as file:
                header = [name.strip() for name in next(csv.reader(file), [])]
        except csv.Error as error:
            raise SourceError(f"{path}:1: unreadable header: {error}") from None
        if target not in header:
            raise SourceError(f"{path}: no column {target!r} (columns: {', '.join(header)})")
        return Source(str(path), lambda: csv_rows(path, target), n, header)
    return Source(str(path), lambda: jsonl_rows(path, target), n)


# Survey -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class TextColumn:
    """A column whose values are mostly text: a category to encode, or an id to drop."""

    name: typing.Any
    n_text: int
    n_values: int
    example: str
    where: str


@dataclasses.dataclass
class Survey:
    """One read of a source: what a run will see."""

    n_records: int = 0
    n_good: int = 0
    n_bad: int = 0
    bad: list[BadRecord] = dataclasses.field(default_factory=list)  # the first MAX_BAD_EXAMPLES
    labels: dict = dataclasses.field(default_factory=dict)  # label -> count (first MAX_LABELS)
    too_many_labels: bool = False
    features: set = dataclasses.field(default_factory=set)  # names seen (first MAX_TRACKED_COLUMNS)
    text_columns: list[TextColumn] = dataclasses.field(default_factory=list)

    @property
    def binary(self) -> bool:
        return is_binary_coded(self.labels)


def is_binary_coded(labels: typing.Iterable) -> bool:
    """True when every label is one of a binary model's codings: True/False, 1/0 or 1/-1.

    >>> is_binary_coded([True, False]), is_binary_coded([1, 0]), is_binary_coded([1, -1])
    (True, True, True)
    >>> is_binary_coded(["yes", "no"]), is_binary_coded([1, 0, -1]), is_binary_coded([0, 1, 2])
    (False, False, False)
    """
    found = set(labels)
    return found <= {True, False} or found <= {1, -1}


def survey(
    source: Source,
    one_hot: typing.Iterable = (),
    drop: typing.Iterable = (),
    stop_at_bad: bool = False,
) -> Survey:
    """Read `source` once: count its good and bad records, its classes, and find its text columns.

    A column is a text column when more than half of its values are text; records that are bad
    only for a text value in such a column are not counted as bad (the caller must one-hot
    encode or drop the column). Memory stays bounded: at most `MAX_LABELS` labels,
    `MAX_TRACKED_COLUMNS` columns and `MAX_BAD_EXAMPLES` bad records (per text column too) are
    kept. With `stop_at_bad`, the read stops at the first bad record.
    """
    one_hot, drop = frozenset(one_hot), frozenset(drop)
    found = Survey()
    values: dict = {}  # column -> [values, text values, first text value, where]
    bad: list[tuple[int, BadRecord]] = []  # (record number, bad record): the first ones
    # Records bad for a text value, per feature: whether they count depends on the whole column.
    text_bad: dict = {}  # feature -> [count, [(record number, bad record), ...]]
    for number, (where, x, y, problem) in enumerate(source.rows()):
        found.n_records += 1
        if problem is None and isinstance(x, dict):
            for name, value in x.items():
                if name in one_hot or name in drop:
                    continue
                counts = values.get(name)
                if counts is None:
                    if len(values) >= MAX_TRACKED_COLUMNS:
                        continue
                    counts = values[name] = [0, 0, None, None]
                counts[0] += 1
                if isinstance(value, str):
                    counts[1] += 1
                    if counts[2] is None:
                        counts[2], counts[3] = value, where
        checked = (
            BadRecord(where, problem) if problem is not None
            else check_record(where, x, y, one_hot, drop)
        )
        if isinstance(checked, BadRecord):
            if stop_at_bad:
                found.n_bad, found.bad = 1, [checked]
                return found
            if checked.text_feature is not None and checked.text_feature in values:
                entry = text_bad.setdefault(checked.text_feature, [0, []])
                entry[0] += 1
                if len(entry[1]) < MAX_BAD_EXAMPLES:
                    entry[1].append((number, checked))
            else:
                found.n_bad += 1
                if len(bad) < MAX_BAD_EXAMPLES:
                    bad.append((number, checked))
            continue
        x, y = checked
        found.n_good += 1
        if len(found.features) < MAX_TRACKED_COLUMNS:
            found.features.update(x)
        if y in found.labels:
            found.labels[y] += 1
        elif len(found.labels) < MAX_LABELS:
            found.labels[y] = 1
        else:
            found.too_many_labels = True
    for name, (n_values, n_text, example, where) in values.items():
        if n_text * 2 > n_values:
            found.text_columns.append(TextColumn(name, n_text, n_values, example, where))
    textual = {column.name for column in found.text_columns}
    for name, (count, examples) in text_bad.items():
        if name not in textual:
            found.n_bad += count
            bad.extend(examples)
    found.bad = [record for _, record in sorted(bad, key=lambda pair: pair[0])][:MAX_BAD_EXAMPLES]
    return found


# Evaluation -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    name: str
    n: int
    accuracy: float | None
    log_loss: float | None
    seconds: float
    memory_bytes: int | None
    curve: list[tuple[int, float]]  # (records answered, rolling accuracy)
    macro_f1: float | None = None  # multiclass streams
    error: str | None = None  # why the model stopped, if it failed

    @property
    def rate(self) -> float:
        """Records/s, NaN when the run was too short to measure one."""
        return self.n / self.seconds if self.seconds >= 0.01 and self.n else math.nan


def evaluate(
    models: dict[str, typing.Any],
    make_stream: typing.Callable[[], Stream],
    delay: int = 0,
    rolling: int = 500,
    on_progress: typing.Callable[[str, int, float], None] | None = None,
    progress_every: int = 1000,
    multiclass: bool = False,
    on_result: typing.Callable[[Result], None] | None = None,
) -> list[Result]:
    """Progressive validation of each model on a fresh copy of the stream.

    `delay` is the number of records after which a label is revealed (0: at once), as River's
    `simulate_qa`. Accuracy (and with `multiclass`, River's `MacroF1`) counts `predict_one`
    (a None prediction, before a multiclass model has seen a label, is not scored, as in
    `progressive_val_score`); log
    loss counts `predict_proba_one` (River's `LogLoss`, clipped at 1e-15; `CrossEntropy` for
    `multiclass`). `on_progress(name, answered, seconds)` is called when a model starts, every
    `progress_every` answers and when it ends, `on_result(result)` when its result is
    complete. A model that raises is reported with its error
    (`Result.error`) and the figures it had; the next model runs.
    """
    from river import metrics, stream, utils

    results = []
    for name, model in models.items():
        accuracy = metrics.Accuracy()
        macro_f1 = metrics.MacroF1() if multiclass else None
        log_loss = metrics.CrossEntropy() if multiclass else metrics.LogLoss()
        window = utils.Rolling(metrics.Accuracy, window_size=rolling)
        pending: dict[int, tuple[typing.Any, typing.Any]] = {}
        curve: list[tuple[int, float]] = []
        answered = 0
        error = None
        if on_progress:
            on_progress(name, 0, 0.0)
        start = time.perf_counter()
        try:
            # Warm a clone up first, so the timing does not include numba's cache loading.
            warm = model.clone()
            for x, y in itertools.islice(make_stream(), 5):
                warm.predict_proba_one(x)
                warm.learn_one(x, y)
            start = time.perf_counter()
            for i, x, y in stream.simulate_qa(make_stream(), moment=None, delay=delay):
                if y is None:  # a question: predict now, score when the label comes
                    pending[i] = (model.predict_one(x), model.predict_proba_one(x))
                    continue
                y_pred, proba = pending.pop(i)
                # As progressive_val_score: no prediction (a multiclass model before its first
                # label) is not scored.
                if y_pred is not None:
                    accuracy.update(y, y_pred)
                    if macro_f1 is not None:
                        macro_f1.update(y, y_pred)
                    window.update(y, y_pred)
                if proba:
                    log_loss.update(y, proba)
                answered += 1
                model.learn_one(x, y)
                if answered % max(1, rolling // 5) == 0:
                    curve.append((answered, window.get()))
                if on_progress and answered % progress_every == 0:
                    on_progress(name, answered, time.perf_counter() - start)
        except Exception as failure:  # one model's failure must not discard the others' results
            error = f"{type(failure).__name__}: {' '.join(str(failure).split())[:300]}"
            log.debug("model %s failed after %d records", name, answered, exc_info=True)
        seconds = time.perf_counter() - start
        if on_progress:
            on_progress(name, answered, seconds)
        loss = log_loss.get() if answered else None
        try:
            memory = model._raw_memory_usage
        except Exception:  # a failed model may not even measure
            memory = None
        result = Result(
            name=name,
            n=answered,
            accuracy=accuracy.get() if answered else None,
            log_loss=(loss if loss is None or math.isfinite(loss) else math.inf),
            seconds=seconds,
            memory_bytes=memory,
            curve=curve,
            macro_f1=macro_f1.get() if macro_f1 is not None and answered else None,
            error=error,
        )
        results.append(result)
        if on_result:
            on_result(result)
    return results


def plot(results: list[Result], path: str | pathlib.Path, title: str = "") -> None:
    """Rolling accuracy of each model against the records seen, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for result in results:
        if result.curve:
            xs, ys = zip(*result.curve)
            label = result.name
            if result.accuracy is not None:
                label += f" ({result.accuracy:.4f})"
            ax.plot(xs, ys, label=label, linewidth=1.2)
    ax.set_xlabel("records")
    ax.set_ylabel("rolling accuracy")
    ax.set_title(title or "progressive validation")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # no curve before `rolling // 5` records
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
