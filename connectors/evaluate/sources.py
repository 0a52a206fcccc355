"""The streams `streammargin evaluate` runs on (`Source`: a River dataset or generator; a CSV,
JSON-lines, ARFF or libsvm file, plain or gzip) and `survey`, one read of a source first: its
good and bad records, its classes, and its text columns (a column whose values are mostly text
is a category the user must one-hot encode or drop, not a pile of bad records).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import pathlib
import typing

from connectors.evaluate import arff
from connectors.evaluate.readers import (
    csv_header,
    csv_label_counts,
    csv_rows,
    jsonl_rows,
    libsvm_label_counts,
    libsvm_rows,
)
from connectors.evaluate.records import (
    BadRecord,
    Row,
    SourceError,
    check_timed,
    checked_records,
    parse_call,
)

__all__ = ["FILE_KINDS", "MAX_BAD_EXAMPLES", "MAX_LABELS", "MAX_TRACKED_COLUMNS",
           "SURVEY_RECORDS", "Source",
           "Survey", "TextColumn", "dataset_source", "file_source", "is_binary_coded",
           "river_dataset", "source_from_args", "survey"]

#: Most distinct labels a survey tracks (more: the target is probably not a label column).
MAX_LABELS = 10_000
#: Most columns whose text values a survey counts, and bad records it keeps as examples.
MAX_TRACKED_COLUMNS = 10_000
MAX_BAD_EXAMPLES = 20
#: Records a survey checks whole (text columns, bad records); past them, where the format has a
#: cheaper read of the labels (CSV, libsvm), only the labels are read.
SURVEY_RECORDS = 10_000
#: The file formats, as the command's options name them.
FILE_KINDS = ("csv", "jsonl", "arff", "libsvm")


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
    """A stream of records: `rows()` gives a fresh iterator of `Row`s, at most `n` of them.

    `columns`: a CSV file's header or an ARFF file's attributes (None: not known before the
    records); `classes`: the declared classes, in order (an ARFF header's); `categorical`: the
    features declared as categories (an ARFF file's nominal attributes), one-hot encoded;
    `text_candidates`: the only features that may hold text (None: any may); `label_scan(after
    line, most labels)`: a cheaper census of the rows past a line, (rows, label -> count, more
    labels than that), for the survey past its first records.
    """

    name: str
    rows_of: typing.Callable[[], typing.Iterator[Row]]
    n: int | None = None
    columns: list | None = None
    kind: str = "dataset"
    classes: list = dataclasses.field(default_factory=list)
    categorical: list = dataclasses.field(default_factory=list)
    text_candidates: list | None = None
    label_scan: typing.Callable[[int, int], tuple[int, dict, bool]] | None = None

    def rows(self) -> typing.Iterator[Row]:
        rows = self.rows_of()
        return itertools.islice(rows, self.n) if self.n else rows

    def records(self, one_hot: typing.Iterable = (), drop: typing.Iterable = ()) -> (
            typing.Iterator[tuple[dict, typing.Any]]):
        """(x, y) of the good records, in order (bad ones skipped)."""
        for checked in self.checked(one_hot, drop):
            if not isinstance(checked, BadRecord):
                yield checked[0], checked[1]

    def checked(self, one_hot: typing.Iterable = (), drop: typing.Iterable = (),
                moment: typing.Any = None) -> typing.Iterator[BadRecord | tuple]:
        """Every record in order: a `BadRecord`, or (x, y, seconds) (`records.check_timed`)."""
        return checked_records(self.rows(), frozenset(one_hot), frozenset(drop), moment)


def dataset_source(spec: str, n: int | None = None) -> Source:
    """A River dataset or generator, 'Name' or 'Name(key=value, ...)'."""
    try:
        name, kwargs = parse_call(spec)
    except ValueError as error:
        raise SourceError(str(error)) from None
    river_dataset(name, kwargs)  # fail early on a bad name

    def dataset_rows() -> typing.Iterator[Row]:
        for i, (x, y) in enumerate(river_dataset(name, kwargs), 1):
            yield f"{name} record {i}", x, y, None

    return Source(spec, dataset_rows, n)


def file_source(kind: str, path: str | pathlib.Path, target: str | None = None,
                n: int | None = None) -> Source:
    """A file of `kind` (`FILE_KINDS`); `target` names the label column of a CSV or JSON-lines
    file (required) and of an ARFF file (its last attribute by default); a libsvm line's label
    is its first token."""
    if kind not in FILE_KINDS:
        raise ValueError(f"unknown file kind {kind!r}")
    if kind in ("csv", "jsonl") and not target:
        raise SourceError("a file source needs --target, the label column")
    path = pathlib.Path(path)
    if not path.is_file():
        raise SourceError(f"no such file: {path}")
    if kind == "libsvm":
        return Source(str(path), lambda: libsvm_rows(path), n, kind=kind, text_candidates=[],
                      label_scan=lambda after, most: libsvm_label_counts(path, after, most))
    if kind == "arff":
        header = arff.read_header(path, target)
        strings = [a.name for i, a in enumerate(header.attributes)
                   if i != header.target and (a.kind == arff.STRING
                                              or (a.kind == arff.DATE and a.date_format is None))]
        name = header.class_attribute.name
        return Source(str(path), lambda: arff.arff_rows(path, name), n, header.names, kind,
                      header.classes, header.nominal_features, strings)
    if kind == "csv":
        header = csv_header(path)
        if target not in header:
            raise SourceError(f"{path}: no column {target!r} (columns: {', '.join(header)})")
        return Source(str(path), lambda: csv_rows(path, target), n, header, kind,
                      label_scan=lambda after, most: csv_label_counts(path, target, after,
                                                                      most))
    return Source(str(path), lambda: jsonl_rows(path, target), n, kind=kind)


def source_from_args(
    dataset: str | None = None,
    csv_path: str | None = None,
    jsonl_path: str | None = None,
    target: str | None = None,
    n: int | None = None,
    arff_path: str | None = None,
    libsvm_path: str | None = None,
) -> Source:
    """The one chosen stream; `SourceError` for a bad name, file or label column."""
    chosen = [(kind, s) for kind, s in (("dataset", dataset), ("csv", csv_path),
                                        ("jsonl", jsonl_path), ("arff", arff_path),
                                        ("libsvm", libsvm_path)) if s]
    if len(chosen) != 1:
        raise SourceError("choose exactly one of a dataset/generator, a CSV, JSON-lines, ARFF "
                          "or libsvm file")
    kind, spec = chosen[0]
    if kind == "dataset":
        return dataset_source(spec, n)
    return file_source(kind, spec, target, n)


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
    # False when only the first `SURVEY_RECORDS` were checked whole (the labels of the rest
    # read): n_good and n_bad are those of the first records, n_records counts every row.
    complete: bool = True

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
    moment: typing.Any = None,
    records: int = SURVEY_RECORDS,
) -> Survey:
    """Read `source` once: count its good and bad records, its classes, and find its text columns.

    A column is a text column when more than half of its values are text; records that are bad
    only for a text value in such a column are not counted as bad (the caller must one-hot
    encode or drop the column). Memory stays bounded: at most `MAX_LABELS` labels,
    `MAX_TRACKED_COLUMNS` columns and `MAX_BAD_EXAMPLES` bad records (per text column too) are
    kept. With `stop_at_bad`, the read stops at the first bad record. The `moment` column
    (`--moment`) is no feature: it is checked as a time. Past the first `records` records of a
    source with a `label_scan` (and no `n`), only the labels are read (`Survey.complete`).
    """
    one_hot, drop = frozenset(one_hot), frozenset(drop)
    skipped = one_hot | drop | ({moment} if moment is not None else set())
    found = Survey()
    # Values per column (for the columns that may hold text), and text values: [count, first,
    # where]. Presence is counted in C (Counter.update) while the columns are few.
    present: collections.Counter = collections.Counter()
    texts: dict = {}
    candidates = None if source.text_candidates is None else frozenset(source.text_candidates)
    bad: list[tuple[int, BadRecord]] = []  # (record number, bad record): the first ones
    # Records bad for a text value, per feature: whether they count depends on the whole column.
    text_bad: dict = {}  # feature -> [count, [(record number, bad record), ...]]
    rows = source.rows()
    scan = source.label_scan is not None and not source.n
    if scan:
        rows = itertools.islice(rows, records)
    where = ""
    for number, (where, x, y, problem) in enumerate(rows):
        found.n_records += 1
        if problem is None and isinstance(x, dict) and candidates != frozenset():
            if candidates is not None:
                names = [name for name in candidates if name in x]
            elif len(present) < MAX_TRACKED_COLUMNS:
                names = x.keys()  # type: ignore[assignment]  (a dict: its values counted)
            else:
                names = [name for name in x if name in present]
            present.update(names)
            if str in map(type, x.values()):
                for name in names:
                    value = x[name]
                    if isinstance(value, str) and name not in skipped:
                        entry = texts.get(name)
                        if entry is None:
                            texts[name] = [1, value, where]
                        else:
                            entry[0] += 1
        checked = (
            BadRecord(where, problem) if problem is not None
            else check_timed(where, x, y, one_hot, drop, moment)
        )
        if isinstance(checked, BadRecord):
            if stop_at_bad:
                found.n_bad, found.bad = 1, [checked]
                return found
            if checked.text_feature is not None and checked.text_feature in texts:
                entry = text_bad.setdefault(checked.text_feature, [0, []])
                entry[0] += 1
                if len(entry[1]) < MAX_BAD_EXAMPLES:
                    entry[1].append((number, checked))
            else:
                found.n_bad += 1
                if len(bad) < MAX_BAD_EXAMPLES:
                    bad.append((number, checked))
            continue
        x, y = checked[0], checked[1]
        found.n_good += 1
        if len(found.features) < MAX_TRACKED_COLUMNS:
            found.features.update(x)
        if y in found.labels:
            found.labels[y] += 1
        elif len(found.labels) < MAX_LABELS:
            found.labels[y] = 1
        else:
            found.too_many_labels = True
    if scan and found.n_records == records:  # more may follow: their labels
        found.complete = False
        last = int(where.rsplit(":", 1)[1])
        rows, counts, too_many = source.label_scan(last, MAX_LABELS)  # type: ignore[misc]
        found.n_records += rows
        labels = found.labels
        for y, count in counts.items():
            if y in labels:
                labels[y] += count
            elif len(labels) < MAX_LABELS:
                labels[y] = count
            else:
                too_many = True
        found.too_many_labels = found.too_many_labels or too_many
    for name, (n_text, example, where) in texts.items():
        n_values = present[name]
        if n_text * 2 > n_values:
            found.text_columns.append(TextColumn(name, n_text, n_values, example, where))
    textual = {column.name for column in found.text_columns}
    for name, (count, examples) in text_bad.items():
        if name not in textual:
            found.n_bad += count
            bad.extend(examples)
    found.bad = [record for _, record in sorted(bad, key=lambda pair: pair[0])][:MAX_BAD_EXAMPLES]
    return found
