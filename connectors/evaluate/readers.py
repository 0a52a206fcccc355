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

import collections
import csv
import gzip
import json
import operator
import pathlib
import typing
import zlib

from connectors.evaluate.records import (
    _LABELS as _LABEL_CACHE,
)
from connectors.evaluate.records import (
    Row,
    SourceError,
    Stream,
    good_records,
    parse_cell,
    parse_label,
)

__all__ = ["MAX_COLUMNS", "MAX_LINE_BYTES", "MAX_RECORD_FEATURES", "count_labels",
           "csv_header", "csv_label_counts", "csv_labels", "csv_rows", "iter_csv", "iter_jsonl",
           "jsonl_rows", "libsvm_label_counts", "libsvm_labels", "libsvm_rows", "lines",
           "open_binary"]

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
        limit = MAX_LINE_BYTES
        number = 0
        while True:
            number += 1
            try:
                line = readline(limit + 1)
            except _READ_ERRORS as error:
                problems.append((number, f"unreadable data, the file ends here: {error}"))
                return
            if not line:
                return
            if len(line) > limit and not line.endswith(b"\n"):
                if not _skip_rest(readline, line, number, problems):
                    return
                continue
            yield number, line


def _skip_rest(readline: typing.Callable[[int], bytes], line: bytes, number: int,
               problems: list) -> bool:
    """Read over the rest of an overlong line, a piece at a time, and note it in `problems`;
    False when the file cannot be read further."""
    try:
        while line and not line.endswith(b"\n"):
            line = readline(MAX_LINE_BYTES)
    except _READ_ERRORS as error:
        problems.append((number, f"unreadable data, the file ends here: {error}"))
        return False
    problems.append((number, f"line longer than {MAX_LINE_BYTES:,} bytes"))
    return True


# CSV ------------------------------------------------------------------------------------------


class _Lines:
    """A file's lines as text for `csv.reader` (UTF-8, bad bytes replaced, a byte-order mark
    dropped; bounded as `lines` bounds them), with the line numbers a reader cannot give once
    lines are skipped. Iterating it is iterating one generator (no call of ours a line)."""

    def __init__(self, path: str | pathlib.Path, offset: int = 0, number: int = 0):
        self.problems: list = []
        self.number = number  # the file's line number of the last line handed out
        self._texts = self._read(path, offset, number)

    def __iter__(self) -> typing.Iterator[str]:
        return self._texts

    def _read(self, path: str | pathlib.Path, offset: int, number: int
              ) -> typing.Iterator[str]:
        """The lines from byte `offset` on, the first numbered `number` + 1."""
        problems = self.problems
        with open_binary(path) as file:
            if offset:
                try:
                    file.seek(offset)
                except _READ_ERRORS as error:
                    problems.append((number + 1,
                                     f"unreadable data, the file ends here: {error}"))
                    return
            readline = file.readline
            limit = MAX_LINE_BYTES
            while True:
                number += 1
                try:
                    line = readline(limit + 1)
                except _READ_ERRORS as error:
                    problems.append((number, f"unreadable data, the file ends here: {error}"))
                    return
                if not line:
                    return
                if len(line) > limit and not line.endswith(b"\n"):
                    if not _skip_rest(readline, line, number, problems):
                        return
                    continue
                self.number = number
                if number == 1:
                    yield line.decode("utf-8", "replace").removeprefix("\ufeff")
                else:
                    yield line.decode("utf-8", "replace")


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
    floats, other cells as stripped text, empty cells absent; `where` is `path:line`.

    Blocks of plain lines (no quote, carriage return or NUL, every line shorter than a field
    may be) are cut at their commas in a few calls a block (`_plain_csv_rows`), where
    `csv.reader` would give the same cells; from the first block that is not plain on, the
    lines go through `csv.reader`."""
    header = csv_header(path)
    if target not in header:
        raise SourceError(f"{path}: no column {target!r} (columns: {', '.join(header)})")
    position = header.index(target)
    names = [name for i, name in enumerate(header) if i != position]
    width = len(header)
    resume = yield from _plain_csv_rows(path, names, position, width)
    if resume is None:
        return
    yield from _quoted_csv_rows(path, names, position, width, *resume)


# Bytes a block of plain CSV lines is read in; a field csv.reader takes at most.
_BLOCK_BYTES = 1 << 20
_FIELD_LIMIT = csv.field_size_limit()


def _plain_csv_rows(path: str | pathlib.Path, names: list, position: int, width: int
                    ) -> typing.Generator[Row, None, tuple[int, int] | None]:
    """`csv_rows`' rows of the file's plain blocks, after its header line; returns None at
    the end of the file, or (byte offset, line number) of the first line of the first block
    that is not plain (or a header of several lines: (0, 0)), where `csv.reader` goes on."""
    prefix = f"{path}:"
    labels = _LABEL_CACHE
    # Lines of this many characters or more are read the careful way: a field may be too long
    # for csv.reader, or the line's bytes (4 at most a character) longer than MAX_LINE_BYTES.
    longest = min(_FIELD_LIMIT, MAX_LINE_BYTES // 4)
    with open_binary(path) as file:
        first = file.readline(MAX_LINE_BYTES + 1)
        if b'"' in first or b"\r" in first or not first.endswith(b"\n"):
            return 0, 0
        offset = len(first)  # of the block's first line
        number = 1  # the line number before the block's
        carry = b""
        while True:
            try:
                chunk = file.read(_BLOCK_BYTES)
            except _READ_ERRORS:
                return offset, number  # (csv.reader's read says where and why)
            data = carry + chunk if carry else chunk
            if not data:
                return None
            cut = data.rfind(b"\n") + 1 if chunk else len(data)
            if not cut:  # (a line longer than a block: the careful read)
                return offset, number
            block, carry = data[:cut], data[cut:]
            if b'"' in block or b"\r" in block or b"\x00" in block:
                return offset, number
            lines = block.decode("utf-8", "replace").split("\n")
            if chunk:
                lines.pop()  # (after the last newline)
            if max(map(len, lines), default=0) >= longest:
                return offset, number
            for text in lines:
                number += 1
                if not text:
                    continue  # a blank line
                cells = text.split(",")
                if len(cells) != width:
                    yield prefix + str(number), None, None, \
                        f"{len(cells)} fields where the header has {width}"
                    continue
                label = cells.pop(position)
                found = labels.get(label)
                y = found[0] if found is not None else parse_label(label)
                yield prefix + str(number), _features(names, cells), y, None
            offset += len(block)
            if not chunk:
                return None


def _features(names: list, cells: list[str]) -> dict:
    """The features of a CSV row's cells (its label's taken out): every cell a number in one
    pass in C, the common case; else each cell parsed, blank ones left out."""
    try:
        return dict(zip(names, map(float, cells)))
    except ValueError:
        return {name: parse_cell(cell.strip()) for name, cell in zip(names, cells)
                if cell.strip() != ""}


def _quoted_csv_rows(path: str | pathlib.Path, names: list, position: int, width: int,
                     offset: int, number: int) -> typing.Iterator[Row]:
    """`csv_rows`' rows through `csv.reader`, from the line at `offset` (its number `number`
    + 1) on; (0, 0): from the header on."""
    source = _Lines(path, offset, number)
    problems = source.problems
    reader = csv.reader(source)
    if not offset:
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
        yield f"{path}:{line}", _features(names, cells), parse_label(label), None
    for number, reason in problems:
        yield f"{path}:{number}", None, None, reason


def csv_labels(path: str | pathlib.Path, target: str) -> typing.Iterator[tuple[int, typing.Any]]:
    """(line, label) of each CSV row of the header's width (`csv_rows`' labels, without
    reading the features)."""
    header = csv_header(path)
    position = header.index(target)
    width = len(header)
    source = _Lines(path)
    reader = csv.reader(source)
    next(reader)
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error:
            continue
        if len(cells) == width:
            yield source.number, parse_label(cells[position])


# A line's last field, after its last comma (a CRLF's CR kept: parse_label strips it): mapped
# over a chunk's lines in C (no Python call a line).
_LAST_FIELD = operator.methodcaller("rpartition", b",")
_THIRD = operator.itemgetter(2)
_CHUNK_BYTES = 1 << 20


def count_labels(pairs: typing.Iterable[tuple[int, typing.Any]], after_line: int,
                 max_labels: int) -> tuple[int, dict, bool]:
    """(rows, label -> count, more labels than `max_labels`) of the (line, label) `pairs` past
    `after_line`: a survey's census of the records it does not check whole."""
    rows = 0
    counts: dict = {}
    too_many = False
    for line, label in pairs:
        if line <= after_line:
            continue
        rows += 1
        if label in counts:
            counts[label] += 1
        elif len(counts) < max_labels:
            counts[label] = 1
        else:
            too_many = True
    return rows, counts, too_many


def csv_label_counts(path: str | pathlib.Path, target: str, after_line: int,
                     max_labels: int) -> tuple[int, dict, bool]:
    """`count_labels` of a CSV file's rows past `after_line`. Where the label is the last
    column and no quote appears, chunks of the file are cut into their lines' last fields in C
    (each line split at its last comma) and counted (`collections.Counter`): a tenth of the cost
    of reading the rows; otherwise, or at the first quote, `csv_labels`."""
    header = csv_header(path)
    if len(header) < 2 or header.index(target) != len(header) - 1:
        return count_labels(csv_labels(path, target), after_line, max_labels)
    texts: collections.Counter = collections.Counter()
    skip = max(after_line, 1)  # lines of the file to pass first (the header at least)
    with open_binary(path) as file:
        carry = b""
        while True:
            try:
                chunk = file.read(_CHUNK_BYTES)
            except _READ_ERRORS:
                break  # the rows' read reports it, with its line
            data = carry + chunk if carry else chunk
            if not chunk:
                if data.strip():
                    data += b"\n"  # a last line without its newline
                else:
                    break
            if b'"' in data:
                return count_labels(csv_labels(path, target), after_line, max_labels)
            start = 0
            while skip and start < len(data):
                newline = data.find(b"\n", start)
                if newline < 0:
                    break
                start = newline + 1
                skip -= 1
            cut = data.rfind(b"\n") + 1
            body = data[start:cut] if cut > start else b""
            carry = data[max(cut, start):]
            if len(carry) > MAX_LINE_BYTES:  # an overlong line: not a row (the read says so)
                carry = b""
                skip += 1
            if body:
                texts.update(map(_THIRD, map(_LAST_FIELD, body[:-1].split(b"\n"))))
            if len(texts) > 4 * max_labels:
                break  # (bounded memory: far more labels than a class column has)
            if not chunk:
                break
    texts.pop(b"", None)  # blank lines
    pairs = ((text.decode("utf-8", "replace"), count) for text, count in texts.items())
    rows = 0
    counts: dict = {}
    too_many = len(texts) > 4 * max_labels
    for text, count in pairs:
        label = parse_label(text)
        if label == "":
            continue  # (a row without its label: a bad row, no class)
        rows += count
        if label in counts:
            counts[label] += count
        elif len(counts) < max_labels:
            counts[label] = count
        else:
            too_many = True
    return rows, counts, too_many


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


def libsvm_labels(path: str | pathlib.Path) -> typing.Iterator[tuple[int, typing.Any]]:
    """(line, label) of each libsvm line (`libsvm_rows`' labels, without the features)."""
    for number, raw in lines(path, []):
        first = raw.split(None, 1)[:1]
        if first and not first[0].startswith(b"#") and b"," not in first[0] \
                and b":" not in first[0]:
            yield number, parse_label(first[0].split(b"#", 1)[0].decode("utf-8", "replace"))


def libsvm_label_counts(path: str | pathlib.Path, after_line: int,
                        max_labels: int) -> tuple[int, dict, bool]:
    """`count_labels` of a libsvm file's lines past `after_line`."""
    return count_labels(libsvm_labels(path), after_line, max_labels)


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
