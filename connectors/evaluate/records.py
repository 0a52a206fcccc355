"""Records as `streammargin evaluate` reads them: a row's (where, x, y, problem), the checks a
record passes before a model sees it, and the `BadRecord` it is otherwise.

Every record is checked as the Kafka worker checks an event before a model sees it (features are
finite real numbers, or categories for the columns to one-hot encode; the label is a str, number
or bool): a bad record is set aside with its place (`file:line`) and reason, and skipped, as the
worker dead-letters it.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import math
import typing

from streammargin.errors import InvalidInput
from streammargin.features import validate_value

__all__ = ["BadRecord", "Row", "SourceError", "Stream", "check_record", "check_timed",
           "checked_records", "good_records", "parse_call", "parse_cell", "parse_label",
           "parse_moment"]

Stream = typing.Iterable[tuple[dict, typing.Any]]


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
    """Labels read from text files: true/false and numbers become bool/int, others stay as is.

    >>> [parse_label(text) for text in ("1", " +1", "-1.0", "TRUE", "b", "nan")]
    [1, 1, -1, True, 'b', 'nan']
    """
    if isinstance(value, str):
        found = _LABELS.get(value)
        if found is not None:
            return found[0]
        label = _parse_label(value)
        if len(_LABELS) < _MAX_CACHED_LABELS:
            _LABELS[value] = (label,)
        return label
    return value


# A stream's labels are few and repeat: each text is parsed once (a bounded cache).
_LABELS: dict[str, tuple] = {}
_MAX_CACHED_LABELS = 4096


def _parse_label(value: str) -> typing.Any:
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


def parse_cell(value: str) -> typing.Any:
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


_PLAIN_LABELS = frozenset((str, int, bool))


def check_record(
    where: str, x: typing.Any, y: typing.Any, one_hot: frozenset, drop: frozenset
) -> tuple[dict, typing.Any] | BadRecord:
    """The record's (x, y) as a model gets them, or the `BadRecord` it is.

    Features must be finite real numbers (bool counts as 0/1), the worker's rule; those of
    `one_hot` are categories (str, int, bool or finite float), those of `drop` go. The label
    must be a str, int, bool or finite float.
    """
    if type(y) not in _PLAIN_LABELS:
        if hasattr(y, "dtype") and hasattr(y, "item") and getattr(y, "ndim", None) == 0:
            y = y.item()  # a numpy scalar (scikit-learn data): the plain value
        if y is None:
            return BadRecord(where, "no label")
        if not (isinstance(y, (str, int)) or (isinstance(y, float) and math.isfinite(y))):
            return BadRecord(
                where, f"label {y!r:.60} is not a class: expected a str, number or bool"
            )
    if isinstance(y, str) and not y.strip():
        return BadRecord(where, "no label")
    if not isinstance(x, dict):
        return BadRecord(where, f"features must be an object, got {type(x).__name__}")
    if (not one_hot or one_hot.isdisjoint(x)) and (not drop or drop.isdisjoint(x)):
        # The common case: every value a number, their sum finite (a NaN or an infinity makes
        # it NaN or infinite; a str, None or a list raise TypeError): one pass in C.
        try:
            total = sum(x.values())
        except (TypeError, OverflowError):
            pass
        else:
            if type(total) in (float, int) and total - total == 0:
                return x, y
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


def parse_moment(value: typing.Any) -> float:
    """A record's time as seconds: a number as it is (seconds since the epoch, or any unit the
    delay shares), a text number likewise, an ISO 8601 date and time as seconds since the epoch
    (UTC where it has no zone). `ValueError` for anything else.

    >>> parse_moment(1700000000), parse_moment("2024-01-01T00:30:00Z"), parse_moment("12.5")
    (1700000000.0, 1704069000.0, 12.5)
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            try:
                moment = dt.datetime.fromisoformat(value.strip())
            except ValueError:
                raise ValueError(
                    f"{value!r:.40} is neither a number nor an ISO 8601 date"
                ) from None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=dt.timezone.utc)
            seconds = moment.timestamp()
    else:
        raise ValueError(f"{value!r:.40} is neither a number nor an ISO 8601 date")
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r:.40} is not a finite time")
    return seconds


def check_timed(
    where: str, x: typing.Any, y: typing.Any, one_hot: frozenset, drop: frozenset,
    moment: typing.Any,
) -> tuple[dict, typing.Any, float | None] | BadRecord:
    """`check_record`, and with a `moment` column its time (`parse_moment`), the column taken
    out of the features: (x, y, seconds or None) or the `BadRecord`."""
    seconds = None
    if moment is not None and isinstance(x, dict):
        if moment not in x:
            return BadRecord(where, f"no {moment!r} (the --moment column)")
        x = dict(x)
        try:
            seconds = parse_moment(x.pop(moment))
        except ValueError as error:
            return BadRecord(where, f"--moment {moment}: {error}")
    checked = check_record(where, x, y, one_hot, drop)
    if isinstance(checked, BadRecord):
        return checked
    return checked[0], checked[1], seconds


def checked_records(rows: typing.Iterable[Row], one_hot: frozenset, drop: frozenset,
                    moment: typing.Any = None):
    """`check_timed` of each row: a `BadRecord` or (x, y, seconds or None)."""
    if moment is None:
        for where, x, y, problem in rows:
            if problem is not None:
                yield BadRecord(where, problem)
                continue
            checked = check_record(where, x, y, one_hot, drop)
            yield checked if type(checked) is BadRecord else (*checked, None)
        return
    for where, x, y, problem in rows:
        if problem is not None:
            yield BadRecord(where, problem)
        else:
            yield check_timed(where, x, y, one_hot, drop, moment)


def good_records(rows: typing.Iterable[Row], one_hot: frozenset, drop: frozenset) -> Stream:
    """(x, y) of the rows' good records, in order."""
    for checked in checked_records(rows, one_hot, drop):
        if not isinstance(checked, BadRecord):
            yield checked[0], checked[1]
