"""The files `streammargin evaluate` reads, as rows (`records.Row`), each named by its `file:line`:
CSV with a header, JSON lines and libsvm/svmlight (ARFF: `arff.py`), any of them gzip-compressed.

Every file is untrusted input read as a stream: a line is read up to `MAX_LINE_BYTES` (a longer
one is skipped whole, without being held, and is a bad row), a record has at most
`MAX_RECORD_FEATURES` features, a CSV header at most `MAX_COLUMNS` columns, so memory stays
bounded whatever the file holds. A line that cannot be read is a bad row with its place and
reason; gzip data that stops making sense ends the file with one.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "a9a.txt"
>>> _ = path.write_text("+1 3:1 11:0.5 # first\\n-1 qid:2 5:1\\n-1 5:x\\n")
>>> for row in libsvm_rows(path):
...     print(row)
('.../a9a.txt:1', {3: 1.0, 11: 0.5}, 1, None)
('.../a9a.txt:2', {5: 1.0}, -1, None)
('.../a9a.txt:3', None, None, "feature 5: value 'x' is not a number")
"""

from __future__ import annotations

import csv
import gzip
import json
import pathlib
import typing
import zlib

from connectors.evaluate.records import (
    Row,
    SourceError,
    Stream,
    good_records,
    parse_cell,
    parse_label,
)

__all__ = ["MAX_COLUMNS", "MAX_LINE_BYTES", "MAX_RECORD_FEATURES", "csv_header", "csv_rows",
           "iter_csv", "iter_jsonl", "jsonl_rows", "libsvm_rows", "lines", "open_binary"]

#: The longest line read (a longer one is a bad row, skipped without being held).
MAX_LINE_BYTES = 1 << 20
#: The most features a record may have (a libsvm line, a sparse ARFF line, a JSON object).
MAX_RECORD_FEATURES = 1 << 16
#: The most columns a CSV header may have.
MAX_COLUMNS = 1 << 16
# Errors of a file's bytes mid-stream: a gzip member cut short or corrupt.
_READ_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, OSError)


def open_binary(path: str | pathlib.Path) -> typing.BinaryIO:
    """The file's bytes, decompressed when it is gzip (by its magic bytes, not its name)."""
    file = open(path, "rb")
    if file.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=file, mode="rb")  # type: ignore[return-value]
    return file


def lines(path: str | pathlib.Path, problems: list) -> typing.Iterator[tuple[int, bytes]]:
    """(line number, line) of a file, plain or gzip; a line longer than `MAX_LINE_BYTES` is
    skipped in pieces and noted in `problems` as (line number, reason), as is gzip data that
    cannot be read (which ends the file)."""
    with open_binary(path) as file:
        readline = file.readline
        number = 0
        while True:
            number += 1
            try:
                line = readline(MAX_LINE_BYTES + 1)
            except _READ_ERRORS as error:
                problems.append((number, f"unreadable data, the file ends here: {error}"))
                return
            if not line:
                return
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                try:
                    while line and not line.endswith(b"\n"):
                        line = readline(MAX_LINE_BYTES)
                except _READ_ERRORS as error:
                    problems.append((number, f"unreadable data, the file ends here: {error}"))
                    return
                problems.append((number, f"line longer than {MAX_LINE_BYTES:,} bytes"))
                continue
            yield number, line


# CSV ------------------------------------------------------------------------------------------


class _Lines:
    """A file's lines as text for `csv.reader` (UTF-8, bad bytes replaced, a byte-order mark
    dropped), with the line numbers a reader cannot give once lines are skipped."""

    def __init__(self, path: str | pathlib.Path):
        self.problems: list = []
        self.number = 0  # the file's line number of the last line handed out
        self._lines = lines(path, self.problems)
        self._first = True

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        number, line = next(self._lines)
        self.number = number
        text = line.decode("utf-8", "replace")
        if self._first:
            text = text.removeprefix("\ufeff")
            self._first = False
        return text


def csv_header(path: str | pathlib.Path) -> list[str]:
    """The stripped names of a CSV file's header; `SourceError` if it has none."""
    source = _Lines(path)
    reader = csv.reader(source)
    try:
        header = next(reader)
    except StopIteration:
        if source.problems:
            raise SourceError(f"{path}:{source.problems[0][0]}: {source.problems[0][1]}") from None
        raise SourceError(f"{path} is empty: expected a header line") from None
    except csv.Error as error:
        raise SourceError(f"{path}:1: unreadable header: {error}") from None
    if source.problems:  # the header's line was skipped: what was read is a later line
        raise SourceError(f"{path}:{source.problems[0][0]}: {source.problems[0][1]}")
    if len(header) > MAX_COLUMNS:
        raise SourceError(f"{path}:1: {len(header):,} columns, more than {MAX_COLUMNS:,}")
    return [name.strip() for name in header]


def csv_rows(path: str | pathlib.Path, target: str) -> typing.Iterator[Row]:
    """Rows of a CSV file with a header (UTF-8, a byte-order mark allowed): numeric cells as
    floats, other cells as stripped text, empty cells absent; `where` is `path:line`."""
    header = csv_header(path)
    if target not in header:
        raise SourceError(f"{path}: no column {target!r} (columns: {', '.join(header)})")
    position = header.index(target)
    names = [name for i, name in enumerate(header) if i != position]
    width = len(header)
    source = _Lines(path)
    problems = source.problems
    reader = csv.reader(source)
    next(reader)
    read = reader.line_num
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as error:  # e.g. a field beyond csv.field_size_limit()
            yield f"{path}:{source.number}", None, None, f"unreadable CSV line: {error}"
            read = reader.line_num
            continue
        line = source.number
        if problems:  # lines skipped (too long) while this row was read: each is a bad row
            for number, reason in problems:
                yield f"{path}:{number}", None, None, reason
            problems.clear()
            if reader.line_num - read > 1 and cells:  # a quoted field went over one
                read = reader.line_num
                yield f"{path}:{line}", None, None, "a record around a skipped line"
                continue
        read = reader.line_num
        if not cells:
            continue  # a blank line
        if len(cells) != width:
            yield f"{path}:{line}", None, None, f"{len(cells)} fields where the header has {width}"
            continue
        label = cells.pop(position)
        try:
            # The common case, every cell a number: one pass in C.
            x = dict(zip(names, map(float, cells)))
        except ValueError:
            x = {
                name: parse_cell(cell.strip())
                for name, cell in zip(names, cells)
                if cell.strip() != ""
            }
        yield f"{path}:{line}", x, parse_label(label), None
    for number, reason in problems:
        yield f"{path}:{number}", None, None, reason


# JSON lines -----------------------------------------------------------------------------------


def jsonl_rows(path: str | pathlib.Path, target: str) -> typing.Iterator[Row]:
    """Objects of a JSON-lines file: the features are `x` if it is an object (the Kafka event
    contract), else every key but the target, `id` and `ts`; `where` is `path:line`."""
    problems: list = []
    for number, raw in lines(path, problems):
        while problems:
            skipped, reason = problems.pop(0)
            yield f"{path}:{skipped}", None, None, reason
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
        if len(x) > MAX_RECORD_FEATURES:
            yield where, None, None, f"{len(x):,} features, more than {MAX_RECORD_FEATURES:,}"
            continue
        yield where, x, parse_label(record[target]), None
    for skipped, reason in problems:
        yield f"{path}:{skipped}", None, None, reason


# libsvm / svmlight ----------------------------------------------------------------------------


def libsvm_rows(path: str | pathlib.Path) -> typing.Iterator[Row]:
    """Lines `label [qid:N] index:value ... [# comment]` of a libsvm/svmlight file: the features
    by their index (an int, as written), absent ones zero; `qid` (svmlight's query id) is not a
    feature and is left out; `where` is `path:line`."""
    problems: list = []
    for number, raw in lines(path, problems):
        while problems:
            skipped, reason = problems.pop(0)
            yield f"{path}:{skipped}", None, None, reason
        where = f"{path}:{number}"
        text = raw.split(b"#", 1)[0]
        tokens = text.split()
        if not tokens:
            continue  # a blank or comment line
        if len(tokens) > MAX_RECORD_FEATURES + 2:
            yield where, None, None, f"{len(tokens) - 1:,} features, more than " \
                f"{MAX_RECORD_FEATURES:,}"
            continue
        label = tokens[0].decode("utf-8", "replace")
        if "," in label:
            yield where, None, None, f"label {label!r:.40}: several labels (multi-label data) " \
                "are not a class"
            continue
        if b":" in tokens[0]:
            yield where, None, None, f"no label: the line starts with {label!r:.40}"
            continue
        pairs = tokens[1:]
        if pairs and pairs[0].startswith(b"qid:"):
            pairs = pairs[1:]
        try:
            # The common case: one pass in C (int() and float() take bytes).
            indices, values = zip(*(pair.split(b":") for pair in pairs)) if pairs else ((), ())
            x = dict(zip(map(int, indices), map(float, values)))
        except ValueError:
            yield where, None, None, _libsvm_problem(pairs)
            continue
        if len(x) != len(pairs):
            yield where, None, None, "an index appears twice"
            continue
        if x and min(x) < 0:
            yield where, None, None, f"index {min(x)}: expected a non-negative integer"
            continue
        yield where, x, parse_label(label), None
    for skipped, reason in problems:
        yield f"{path}:{skipped}", None, None, reason


def _libsvm_problem(pairs: list[bytes]) -> str:
    """What is wrong with a line's `index:value` pairs (the fast path found something)."""
    for pair in pairs:
        parts = pair.split(b":")
        shown = pair.decode("utf-8", "replace")
        if len(parts) != 2:
            return f"{shown!r:.40} is not index:value"
        index, value = parts
        try:
            if int(index) < 0:
                raise ValueError
        except ValueError:
            return f"{shown!r:.40}: the index is not a non-negative integer"
        try:
            float(value)
        except ValueError:
            return f"feature {int(index)}: value {value.decode('utf-8', 'replace')!r:.40} " \
                "is not a number"
    return "unreadable line"  # pragma: no cover (the fast path failed on one of the above)


def iter_csv(path: str | pathlib.Path, target: str) -> Stream:
    """(x, y) of the good records of a CSV file (`csv_rows`, bad records skipped)."""
    return good_records(csv_rows(path, target), frozenset(), frozenset())


def iter_jsonl(path: str | pathlib.Path, target: str) -> Stream:
    """(x, y) of the good records of a JSON-lines file (`jsonl_rows`, bad records skipped)."""
    return good_records(jsonl_rows(path, target), frozenset(), frozenset())
