"""The files `streammargin evaluate` reads, as rows (`records.Row`): CSV with a header and JSON
lines, each row named by its `file:line`."""

from __future__ import annotations

import csv
import json
import pathlib
import typing

from connectors.evaluate.records import Row, Stream, good_records, parse_cell, parse_label

__all__ = ["csv_rows", "iter_csv", "iter_jsonl", "jsonl_rows"]


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
                name: parse_cell(cell.strip())
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
    return good_records(csv_rows(path, target), frozenset(), frozenset())


def iter_jsonl(path: str | pathlib.Path, target: str) -> Stream:
    """(x, y) of the good records of a JSON-lines file (`jsonl_rows`, bad records skipped)."""
    return good_records(jsonl_rows(path, target), frozenset(), frozenset())

