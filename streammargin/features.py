"""Feature mapping: River dicts <-> columns of contiguous float64 vectors.

A `FeatureSpace` gives every feature name a column the first time a model learns from it, so the
space grows as new names appear and a name keeps its column for ever. Features may be absent from
any dict (a sparse dict is a vector with zeros elsewhere). Values must be finite real numbers
(`bool` counts as 0/1); anything else raises a `ValueError` that names the feature, before any
state is touched.

The per-record path is the hot path of every model in this package, so it is written for speed:
the key order and values of the previous dict are cached (streams repeat key orders, and
learn_one usually follows predict_one on the same dict), new values are packed as float64 by one
`struct.pack` (which also refuses strings, None and containers; 2x faster than `np.fromiter` at
100 features) and viewed by numpy without a copy, and finiteness costs one builtin `sum`. The
value arrays handed to the models are read-only.
"""

from __future__ import annotations

import math
import numbers
import struct
import typing

import numpy as np

__all__ = ["FeatureSpace", "validate_value", "describe_bad_values"]


def validate_value(name: typing.Hashable, value: typing.Any) -> float:
    """Return `value` as a float, or raise a `ValueError` that names the feature."""
    if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"feature {name!r} has value {value!r} of type {type(value).__name__}: "
            "expected a finite real number"
        )
    try:
        as_float = float(value)
    except OverflowError:
        raise ValueError(f"feature {name!r} has value {value!r}: too large for a float64") from None
    if not math.isfinite(as_float):
        raise ValueError(f"feature {name!r} has value {value!r}: expected a finite real number")
    return as_float


def describe_bad_values(x: dict) -> np.ndarray:
    """Validate every value of `x` (slow path) and return them as read-only float64, in order."""
    values = np.array([validate_value(name, value) for name, value in x.items()], dtype=np.float64)
    values.setflags(write=False)
    return values


_PACKERS: dict[int, struct.Struct] = {}


def _packer(n: int) -> struct.Struct:
    """struct.Struct for n native float64 values (cached: streams repeat their lengths)."""
    packer = _PACKERS.get(n)
    if packer is None:
        packer = _PACKERS[n] = struct.Struct(f"{n}d")
    return packer


_frombuffer = np.frombuffer


class FeatureSpace:
    """Names of features and the vector columns they map to.

    Parameters
    ----------
    first_column
        Column of the first feature name. Models reserve the columns before it (e.g. column 0 for
        the intercept's constant feature).

    Examples
    --------

    >>> space = FeatureSpace(first_column=1)
    >>> idx, val = space.encode({"a": 1.0, "b": 2}, grow=True)
    >>> idx.tolist(), val.tolist()
    ([1, 2], [1.0, 2.0])

    Unknown names map to column -1 when the space may not grow (prediction):

    >>> idx, val = space.encode({"b": 3.0, "c": True}, grow=False)
    >>> idx.tolist(), val.tolist()
    ([2, -1], [3.0, 1.0])
    >>> space.n_columns
    3

    Bad values raise before anything changes:

    >>> space.encode({"d": float("nan")}, grow=True)
    Traceback (most recent call last):
    ...
    ValueError: feature 'd' has value nan: expected a finite real number
    >>> space.n_columns
    3

    """

    def __init__(self, first_column: int = 0):
        self.first_column = first_column
        self.n_columns = first_column  # columns in use, reserved ones included
        self.names: list[typing.Hashable] = []
        self.index: dict[typing.Hashable, int] = {}
        self._forget_cache()

    def _forget_cache(self) -> None:
        # The last dict encoded: its key tuple, its columns, whether every key was known, its
        # value tuple and their array. Streams repeat key orders, and learn_one usually follows
        # predict_one on the same dict, so both conversions are often skipped.
        self._cached_keys: tuple | None = None
        self._cached_idx: np.ndarray | None = None
        self._cached_all_known = False
        self._cached_values: tuple | None = None
        self._cached_val: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.names)

    def _add(self, name: typing.Hashable) -> int:
        column = self.n_columns
        self.names.append(name)
        self.index[name] = column
        self.n_columns += 1
        return column

    def columns(self, keys: tuple) -> tuple[np.ndarray, bool]:
        """Columns of `keys` (-1 for unknown names) and whether all of them are known."""
        get = self.index.get
        cols = [get(k, -1) for k in keys]
        return np.array(cols, dtype=np.int64), -1 not in cols

    def encode(self, x: dict, grow: bool) -> tuple[np.ndarray, np.ndarray]:
        """Columns and float64 values of the features in `x`, in `x`'s order.

        With `grow=True` (learning) unknown names get new columns; the values are validated first,
        so a bad dict leaves the space unchanged. With `grow=False` (prediction) unknown names get
        column -1: they carry no weight, but kernels and norms still see their values.
        """
        keys = tuple(x)
        values = tuple(x.values())
        if keys == self._cached_keys:
            all_known = self._cached_all_known
            try:
                # The cached values were validated; values that compare equal to them (usually
                # the very same float objects: learn_one right after predict_one) convert to the
                # same float64. A bad value may make the comparison itself raise.
                if values == self._cached_values and (all_known or not grow):
                    return self._cached_idx, self._cached_val  # type: ignore[return-value]
            except Exception:
                pass
            idx = self._cached_idx
        else:
            idx, all_known = self.columns(keys)
        try:
            # float64 bytes in x's order: strings, None, containers and ints beyond float64 make
            # the packing raise; NaN/inf make `total - total` NaN (a sum of huge finite values
            # that overflows takes the slow path too, which accepts it).
            packer = _PACKERS.get(len(values)) or _packer(len(values))
            packed = packer.pack(*values)
            total = sum(values)
            finite = bool(total - total == 0)
        except Exception:
            finite = False
        val = _frombuffer(packed) if finite else describe_bad_values(x)
        if grow and not all_known:
            for name in keys:
                if name not in self.index:
                    self._add(name)
            idx, all_known = self.columns(keys)
        self._cached_keys, self._cached_idx, self._cached_all_known = keys, idx, all_known
        self._cached_values, self._cached_val = values, val
        return idx, val  # type: ignore[return-value]

    def encode_columns(self, names: typing.Iterable, grow: bool) -> np.ndarray:
        """Columns of a frame's column names (-1 for unknown names unless `grow`)."""
        names = list(names)
        if grow:
            for name in names:
                if name not in self.index:
                    self._add(name)
            self._forget_cache()
        return np.array([self.index.get(n, -1) for n in names], dtype=np.int64)

    def decode(self, vector: np.ndarray) -> dict:
        """The entries of a column vector as a dict name -> value (reserved columns left out)."""
        first = self.first_column
        return {name: float(vector[first + j]) for j, name in enumerate(self.names)}

    # Safe state -------------------------------------------------------------------------------

    def to_state(self) -> dict:
        from streammargin import state

        return {
            "first_column": self.first_column,
            "names": [state.encode_name(n) for n in self.names],
        }

    @classmethod
    def from_state(cls, data: dict) -> FeatureSpace:
        from streammargin import state

        space = cls(first_column=int(data["first_column"]))
        for encoded in data["names"]:
            name = state.decode_name(encoded)
            if name in space.index:
                raise ValueError(f"feature name {name!r} appears twice in the saved state")
            space._add(name)
        return space

    # Pickling: the lookup cache is rebuilt on demand, it is not part of the model.

    def __getstate__(self) -> dict:
        return {"first_column": self.first_column, "names": self.names}

    def __setstate__(self, data: dict) -> None:
        self.first_column = data["first_column"]
        self.names = list(data["names"])
        self.n_columns = self.first_column + len(self.names)
        self.index = {name: self.first_column + j for j, name in enumerate(self.names)}
        self._forget_cache()
