"""ARFF files (Weka's format, MOA's benchmark streams) as rows (`records.Row`), dense or sparse,
plain or gzip-compressed.

The header (`@relation`, `@attribute NAME TYPE`, `@data`) declares each attribute: `numeric`
(`real`, `integer`) values become floats, `{a, b, ...}` nominal values stay the declared text (a
category the run one-hot encodes, `Header.nominal_features`), `string` values stay text, `date
["format"]` values become seconds since the epoch (UTC where the value has no zone; Java's
`yyyy MM dd HH mm ss SSS Z X` letters and quoted literals; another format leaves the text as
it is). `relational` attributes are refused. The class is the last attribute, as MOA's
`ArffFileStream` takes it, or the one `--target` names; its declared values are the stream's
classes, in their order (MOA's class indices).

Data lines are comma-separated values, quoted with ' or " (backslash escapes inside), `?` for a
missing value (the feature is absent); sparse lines are `{index value, ...}` with 0-based
indices, an omitted numeric value being 0 (absent from the record, as a sparse record's zeros
are) and an omitted nominal value the attribute's first (Weka's rule, the class's too). An
instance weight (`, {w}` at the end) is read over and not used (a warning, once).

The header is bounded (`MAX_ATTRIBUTES`, `MAX_NOMINAL_VALUES`, lines of `MAX_LINE_BYTES`), and
each data line is a row or a bad row with its `file:line`, as `readers.py` reads every format.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "weather.arff"
>>> _ = path.write_text('''% the weather
... @relation weather
... @attribute outlook {sunny, overcast, 'light rain'}
... @attribute temperature numeric
... @attribute play {yes, no}
... @data
... sunny, 85, no
... 'light rain', ?, yes
... {1 64}
... ''')
>>> header = read_header(path)
>>> header.classes, header.nominal_features
(['yes', 'no'], ['outlook'])
>>> for row in arff_rows(path):
...     print(row)
('.../weather.arff:7', {'outlook': 'sunny', 'temperature': 85.0}, 'no', None)
('.../weather.arff:8', {'outlook': 'light rain'}, 'yes', None)
('.../weather.arff:9', {'outlook': 'sunny', 'temperature': 64.0}, 'yes', None)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import pathlib
import re
import typing

from connectors.evaluate.readers import lines
from connectors.evaluate.records import Row, SourceError, parse_label

__all__ = ["Attribute", "Header", "MAX_ATTRIBUTES", "MAX_NOMINAL_VALUES", "arff_rows",
           "read_header"]

log = logging.getLogger(__name__)

#: The most attributes a header may declare, and nominal values over all its attributes.
MAX_ATTRIBUTES = 1 << 20
MAX_NOMINAL_VALUES = 1 << 20
NUMERIC, NOMINAL, STRING, DATE = "numeric", "nominal", "string", "date"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}
_JAVA_DATE = {"yyyy": "%Y", "yy": "%y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M",
              "ss": "%S", "SSS": "%f", "Z": "%z", "X": "%z", "XXX": "%z"}
DEFAULT_DATE_FORMAT = "yyyy-MM-dd'T'HH:mm:ss"


@dataclasses.dataclass(frozen=True)
class Attribute:
    name: str
    kind: str  # NUMERIC, NOMINAL, STRING or DATE
    values: tuple = ()  # a nominal attribute's, in order
    date_format: str | None = None  # strptime's, None: the value stays text


@dataclasses.dataclass
class Header:
    relation: str
    attributes: list[Attribute]
    data_line: int  # the line of `@data`
    target: int  # the class attribute's position

    @property
    def class_attribute(self) -> Attribute:
        return self.attributes[self.target]

    @property
    def classes(self) -> list:
        """The declared classes, as labels (`parse_label`), in order; [] for a numeric class."""
        return [parse_label(value) for value in self.class_attribute.values]

    @property
    def nominal_features(self) -> list[str]:
        return [a.name for i, a in enumerate(self.attributes)
                if a.kind == NOMINAL and i != self.target]

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.attributes]


def split_values(text: str) -> list[tuple[str, bool]]:
    """Comma-separated values as (value, quoted): quotes ' or " with backslash escapes, spaces
    around a value dropped. `ValueError` for an unterminated quote.

    >>> split_values("a, 'b, c' ,\\"d\\\\\\"e\\", ?")
    [('a', False), ('b, c', True), ('d"e', True), ('?', False)]
    """
    values: list[tuple[str, bool]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] in "'\"":
            quote = text[i]
            i += 1
            parts = []
            while True:
                if i >= n:
                    raise ValueError("a quote is not closed")
                char = text[i]
                if char == "\\" and i + 1 < n:
                    parts.append(_ESCAPES.get(text[i + 1], text[i + 1]))
                    i += 2
                elif char == quote:
                    i += 1
                    break
                else:
                    parts.append(char)
                    i += 1
            values.append(("".join(parts), True))
            while i < n and text[i] in " \t":
                i += 1
            if i < n and text[i] != ",":
                raise ValueError(f"text after a quoted value: {text[i:i + 20]!r}")
        else:
            end = text.find(",", i)
            end = n if end < 0 else end
            values.append((text[i:end].strip(), False))
            i = end
        if i >= n:
            return values
        i += 1  # the comma


def _name_and_rest(text: str) -> tuple[str, str]:
    """An attribute's name (quoted or a word) and what follows it."""
    text = text.strip()
    if text[:1] in ("'", '"'):
        quote = text[0]
        i, parts = 1, []
        while i < len(text) and text[i] != quote:
            if text[i] == "\\" and i + 1 < len(text):
                i += 1
            parts.append(text[i])
            i += 1
        if i >= len(text):
            raise ValueError("a quote is not closed")
        return "".join(parts), text[i + 1:].strip()
    parts = text.split(None, 1)
    if len(parts) < 2:
        raise ValueError("expected @attribute NAME TYPE")
    return parts[0], parts[1].strip()


def _date_format(java: str) -> str | None:
    """strptime's format for a Java SimpleDateFormat pattern, None where a letter is beyond
    the common ones."""
    out = []
    for match in re.finditer(r"'([^']*)'|([A-Za-z])\2*|[^A-Za-z']+", java):
        literal, letter = match.group(1), match.group(2)
        if literal is not None:
            out.append(literal.replace("%", "%%"))
        elif letter is not None:
            converted = _JAVA_DATE.get(match.group(0))
            if converted is None:
                return None
            out.append(converted)
        else:
            out.append(match.group(0).replace("%", "%%"))
    return "".join(out)


def _attribute(text: str) -> Attribute:
    name, kind = _name_and_rest(text)
    lowered = kind.lower()
    if kind.startswith("{"):
        if not kind.endswith("}"):
            raise ValueError("a nominal attribute's values end with }")
        values = tuple(value for value, _ in split_values(kind[1:-1])) if kind[1:-1].strip() \
            else ()
        if len(values) > MAX_NOMINAL_VALUES:
            raise ValueError(f"more than {MAX_NOMINAL_VALUES:,} values")
        return Attribute(name, NOMINAL, values)
    if lowered in ("numeric", "real", "integer"):
        return Attribute(name, NUMERIC)
    if lowered == "string":
        return Attribute(name, STRING)
    if lowered.startswith("date"):
        pattern = kind[4:].strip()
        if pattern[:1] in ("'", '"'):
            pattern = split_values(pattern)[0][0]
        return Attribute(name, DATE, date_format=_date_format(pattern or DEFAULT_DATE_FORMAT))
    if lowered.startswith("relational"):
        raise ValueError("relational attributes are not supported")
    raise ValueError(f"unknown type {kind!r:.40}")


def read_header(path: str | pathlib.Path, target: str | None = None) -> Header:
    """The header of an ARFF file; `SourceError` naming the line for anything wrong in it."""
    relation = None
    attributes: list[Attribute] = []
    n_values = 0
    problems: list = []
    for number, raw in lines(path, problems):
        if problems:
            break
        text = raw.decode("utf-8", "replace").strip()
        if number == 1:
            text = text.removeprefix("\ufeff")
        if not text or text.startswith("%"):
            continue
        keyword = text.split(None, 1)[0].lower()
        if keyword == "@relation":
            relation = text[len("@relation"):].strip()
        elif keyword == "@attribute":
            if len(attributes) >= MAX_ATTRIBUTES:
                raise SourceError(f"{path}:{number}: more than {MAX_ATTRIBUTES:,} attributes")
            try:
                attribute = _attribute(text[len("@attribute"):])
            except ValueError as error:
                raise SourceError(f"{path}:{number}: {error}") from None
            n_values += len(attribute.values)
            if n_values > MAX_NOMINAL_VALUES:
                raise SourceError(f"{path}:{number}: more than {MAX_NOMINAL_VALUES:,} nominal "
                                  "values in all")
            attributes.append(attribute)
        elif keyword == "@data":
            if not attributes:
                raise SourceError(f"{path}:{number}: @data before any @attribute")
            names = [a.name for a in attributes]
            if len(set(names)) != len(names):
                raise SourceError(f"{path}: an attribute name appears twice")
            if target is None:
                position = len(attributes) - 1
            elif target in names:
                position = names.index(target)
            else:
                shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
                raise SourceError(f"{path}: no attribute {target!r} (attributes: {shown})")
            return Header(relation or "", attributes, number, position)
        else:
            raise SourceError(f"{path}:{number}: expected @relation, @attribute or @data, "
                              f"got {text[:40]!r}")
    if problems:
        raise SourceError(f"{path}:{problems[0][0]}: {problems[0][1]}")
    raise SourceError(f"{path}: no @data line: not an ARFF file?")


def arff_rows(path: str | pathlib.Path, target: str | None = None) -> typing.Iterator[Row]:
    """The rows of an ARFF file (see the module's docstring); `where` is `path:line`."""
    header = read_header(path, target)
    attributes = header.attributes
    n = len(attributes)
    position = header.target
    names = header.names
    kinds = [a.kind for a in attributes]
    nominal_sets = [frozenset(a.values) if a.kind == NOMINAL else None for a in attributes]
    # Sparse lines: what an omitted attribute is (Weka: index 0, the first nominal value).
    omitted = {i: a.values[0] for i, a in enumerate(attributes)
               if a.kind == NOMINAL and a.values}
    warned = False
    problems: list = []
    for number, raw in lines(path, problems):
        while problems:
            skipped, reason = problems.pop(0)
            yield f"{path}:{skipped}", None, None, reason
        if number <= header.data_line:
            continue
        where = f"{path}:{number}"
        text = raw.decode("utf-8", "replace").strip()
        if not text or text.startswith("%"):
            continue
        if text.startswith("{"):
            end = text.find("}")
            if end < 0:
                yield where, None, None, "a sparse line without its closing }"
                continue
            if text[end + 1:].strip().lstrip(",").strip():
                warned = _warn_weights(warned, where)
            found = _sparse(text[1:end], n, attributes, omitted)
        else:
            if text.endswith("}") and "{" in text:
                cut = text.rfind("{")
                text = text[:cut].rstrip().rstrip(",")
                warned = _warn_weights(warned, where)
            if "'" not in text and '"' not in text:
                cells = [(cell.strip(), False) for cell in text.split(",")]
            else:
                try:
                    cells = split_values(text)
                except ValueError as error:
                    yield where, None, None, str(error)
                    continue
            if len(cells) != n:
                yield where, None, None, f"{len(cells)} values where the header has {n}"
                continue
            found = cells
        if isinstance(found, str):
            yield where, None, None, found
            continue
        x: dict = {}
        label = None
        problem = None
        for i, (value, quoted) in (found.items() if isinstance(found, dict)
                                   else enumerate(found)):
            if not quoted and value == "?":
                continue  # missing: absent
            kind = kinds[i]
            if i == position:
                label = value
                continue
            if kind == NUMERIC:
                try:
                    x[names[i]] = float(value)
                except ValueError:
                    problem = f"attribute {names[i]!r}: {value!r:.40} is not a number"
                    break
            elif kind == NOMINAL:
                if value not in nominal_sets[i]:  # type: ignore[operator]
                    problem = f"attribute {names[i]!r}: {value!r:.40} is not one of its values"
                    break
                x[names[i]] = value
            elif kind == DATE and attributes[i].date_format is not None:
                try:
                    x[names[i]] = _seconds(value, attributes[i].date_format)  # type: ignore
                except ValueError:
                    problem = f"attribute {names[i]!r}: {value!r:.40} is not a date of its format"
                    break
            else:
                x[names[i]] = value
        if problem is not None:
            yield where, None, None, problem
            continue
        if label is None:
            yield where, None, None, "no label (the class value is missing)"
            continue
        if kinds[position] == NOMINAL and label not in nominal_sets[position]:  # type: ignore
            yield where, None, None, f"class {label!r:.40} is not one of the declared classes"
            continue
        yield where, x, parse_label(label), None
    for skipped, reason in problems:
        yield f"{path}:{skipped}", None, None, reason


def _sparse(text: str, n: int, attributes: list[Attribute], omitted: dict) -> dict | str:
    """{position: (value, quoted)} of a sparse line's entries, omitted nominal attributes at
    their first value; a str: what is wrong."""
    found: dict = {}
    if text.strip():
        if "'" in text or '"' in text:
            try:
                entries = split_values(text)
            except ValueError as error:
                return str(error)
        else:  # the common line: no quote to read character by character
            entries = [(entry.strip(), False) for entry in text.split(",")]
        for entry, quoted in entries:
            if quoted:
                return f"{entry!r:.40} is not 'index value'"
            parts = entry.split(None, 1)
            if len(parts) != 2:
                return f"{entry!r:.40} is not 'index value'"
            try:
                index = int(parts[0])
            except ValueError:
                return f"{parts[0]!r:.20} is not an attribute index"
            if not 0 <= index < n:
                return f"attribute index {index} is not in 0..{n - 1}"
            if index in found:
                return f"attribute index {index} appears twice"
            value = parts[1].strip()
            if value[:1] in ("'", '"'):
                try:
                    ((value, _),) = split_values(value)
                except ValueError as error:
                    return str(error)
                found[index] = (value, True)
            else:
                found[index] = (value, False)
    for index, first in omitted.items():
        if index not in found:
            found[index] = (first, True)
    return dict(sorted(found.items()))


def _seconds(value: str, date_format: str) -> float:
    moment = dt.datetime.strptime(value.strip(), date_format)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp()


def _warn_weights(warned: bool, where: str) -> bool:
    if not warned:
        log.warning("%s: instance weights ({w} at the end of a line) are read over: every record "
                    "counts once", where)
    return True

