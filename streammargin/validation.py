"""Validation of constructor parameters, shared by every model.

Each validator checks one parameter and returns it unchanged, or raises a `ValueError` whose one
line names the parameter, its bad value and what is allowed::

    >>> positive_real("C", float("inf"), upper=1e6)
    Traceback (most recent call last):
    ...
    ValueError: C must be a number in (0.0, 1000000.0], got inf

The rules are the same everywhere: `bool` is not a number (True is not 1 here), NaN and the
infinities are refused, integers must be integral types (numpy's included; 3.0 is not an integer),
and every size has an upper bound, so that no valid set of parameters allocates absurd memory. A
model validates every parameter in `__init__`, before `_reset()` allocates anything; restoring a
saved state goes through the same constructor (`streammargin.base.MarginClassifier.from_state`).
"""

from __future__ import annotations

import math
import numbers
import typing

import numpy as np

__all__ = [
    "AUTO",
    "auto_or",
    "boolean",
    "finite_real",
    "fraction",
    "integer_in",
    "one_of",
    "optional",
    "positive_real",
    "real_in",
]

_T = typing.TypeVar("_T")

#: The value of a parameter the model sets from the data or from its other params (a kernel's
#: width, the MPU's penalty by form): the one string such parameters take.
AUTO = "auto"


def _show(value: typing.Any) -> str:
    """The bad value as the message shows it (cut: values may come from a checkpoint)."""
    return f"{value!r:.80}"


def _is_real(value: typing.Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_integer(value: typing.Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    return f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def real_in(
    name: str,
    value: typing.Any,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> typing.Any:
    """A finite real number in the interval from `low` to `high` (bounds closed unless open)."""
    ok = _is_real(value)
    if ok:
        try:
            as_float = float(value)
        except (OverflowError, ValueError, TypeError):  # an int beyond float64
            ok = False
        else:
            ok = (
                math.isfinite(as_float)
                and (as_float > low if low_open else as_float >= low)
                and (as_float < high if high_open else as_float <= high)
            )
    if not ok:
        interval = _interval(low, high, low_open, high_open)
        raise ValueError(f"{name} must be a number in {interval}, got {_show(value)}")
    return value


def positive_real(name: str, value: typing.Any, upper: float = 1e300) -> typing.Any:
    """A real number in (0, upper]."""
    return real_in(name, value, 0.0, upper, low_open=True)


def finite_real(name: str, value: typing.Any, bound: float = 1e300) -> typing.Any:
    """A real number in [-bound, bound]."""
    return real_in(name, value, -bound, bound)


def fraction(
    name: str, value: typing.Any, *, low_open: bool = False, high_open: bool = False
) -> typing.Any:
    """A real number in [0, 1] (ends open on request)."""
    return real_in(name, value, 0.0, 1.0, low_open=low_open, high_open=high_open)


def integer_in(name: str, value: typing.Any, low: int, high: int) -> typing.Any:
    """An integer (not a bool, not a float) in [low, high]."""
    if not (_is_integer(value) and low <= value <= high):
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {_show(value)}")
    return value


def one_of(name: str, value: typing.Any, choices: typing.Iterable[typing.Any]) -> typing.Any:
    """One of `choices` (compared by type and value: True is not 1, 1 is not "1")."""
    choices = list(choices)
    if not any(type(value) is type(choice) and value == choice for choice in choices):
        raise ValueError(f"{name} must be one of {choices}, got {_show(value)}")
    return value


def boolean(name: str, value: typing.Any) -> bool:
    """True or False (numpy's bools too), nothing else."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {_show(value)}")
    return value


def optional(
    validator: typing.Callable[..., _T],
    name: str,
    value: typing.Any,
    *args: typing.Any,
    **kwargs: typing.Any,
) -> _T | None:
    """None, or a value that passes `validator(name, value, *args, **kwargs)`; the message of a
    bad value says that None is allowed too."""
    if value is None:
        return None
    try:
        return validator(name, value, *args, **kwargs)
    except ValueError as error:
        raise ValueError(str(error).replace(" must be ", " must be None or ", 1)) from None


def auto_or(
    validator: typing.Callable[..., _T],
    name: str,
    value: typing.Any,
    *args: typing.Any,
    **kwargs: typing.Any,
) -> _T | str:
    """The string "auto" (`AUTO`: the model chooses the value), or a value that passes
    `validator(name, value, *args, **kwargs)`; the message of a bad value says that "auto" is
    allowed too. Other strings ("scale", "Auto", "") are bad values::

        >>> auto_or(positive_real, "gamma", "auto")
        'auto'
        >>> auto_or(positive_real, "gamma", "scale")
        Traceback (most recent call last):
        ...
        ValueError: gamma must be 'auto' or a number in (0.0, 1e+300], got 'scale'

    With `optional`, through a partial: `auto_or(functools.partial(optional, positive_real),
    "C", C)` takes "auto", None or a positive number.
    """
    if isinstance(value, str) and value == AUTO:
        return value
    try:
        return validator(name, value, *args, **kwargs)
    except ValueError as error:
        raise ValueError(str(error).replace(" must be ", f" must be {AUTO!r} or ", 1)) from None
