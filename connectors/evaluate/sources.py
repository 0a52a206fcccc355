"""The streams `streammargin evaluate` runs on (`Source`: a River dataset or generator, a CSV or a
JSON-lines file) and `survey`, one read of a source first: its good and bad records, its classes,
and its text columns (a column whose values are mostly text is a category the user must one-hot
encode or drop, not a pile of bad records).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import pathlib
import typing

from connectors.evaluate.readers import csv_rows, jsonl_rows
from connectors.evaluate.records import (
    BadRecord,
    Row,
    SourceError,
    Stream,
    check_record,
    good_records,
    parse_call,
)

__all__ = ["MAX_BAD_EXAMPLES", "MAX_LABELS", "MAX_TRACKED_COLUMNS", "Source", "Survey",
           "TextColumn", "is_binary_coded", "river_dataset", "source_from_args", "survey"]

#: Most distinct labels a survey tracks (more: the target is probably not a label column).
MAX_LABELS = 10_000
#: Most columns whose text values a survey counts, and bad records it keeps as examples.
MAX_TRACKED_COLUMNS = 10_000
MAX_BAD_EXAMPLES = 20


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
        return good_records(self.rows(), frozenset(one_hot), frozenset(drop))


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

