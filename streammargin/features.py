"""Feature mapping: River dicts <-> columns of contiguous float64 vectors.

A `FeatureSpace` gives every feature name a column the first time a model learns from it, so the
space grows as new names appear and a name keeps its column for ever. Features may be absent from
any dict (a sparse dict is a vector with zeros elsewhere). Values must be finite real numbers
(`bool` counts as 0/1); anything else raises `InvalidInput` (a `ValueError`) that names the feature, before any
state is touched.

The per-record path is the hot path of every model in this package, so it is written for speed:
the previous dict's names, columns and values are cached with an `operator.itemgetter` of its
names, which reads the values of a dict with the same names in the cached order in one C call
(streams repeat their names; learn_one usually follows predict_one on the same dict, which then
costs one getter call and a tuple comparison); new values are packed as float64 by one
`struct.pack` (which also refuses strings, None and containers; 2x faster than `np.fromiter` at
100 features), handed over as those bytes (`encode_packed`) or viewed by numpy without a copy
(`encode`, read-only), and finiteness costs one builtin `sum`.
"""

from __future__ import annotations

import math
import numbers
import operator
import struct
import typing

import numpy as np

from streammargin.errors import InvalidInput, StateError

__all__ = ["FeatureSpace", "validate_value", "describe_bad_values"]


def validate_value(name: typing.Hashable, value: typing.Any) -> float:
    """Return `value` as a float, or raise `InvalidInput` (a `ValueError`) naming the feature."""
    if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real):
        raise InvalidInput(
            f"feature {name!r} has value {value!r} of type {type(value).__name__}: "
            "expected a finite real number"
        )
    try:
        as_float = float(value)
    except OverflowError:
        raise InvalidInput(f"feature {name!r} has value {value!r}: too large for a float64") from None
    if not math.isfinite(as_float):
        raise InvalidInput(f"feature {name!r} has value {value!r}: expected a finite real number")
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


# The cache of the last dict a FeatureSpace encoded, one plain tuple (one store per encoding; a
# NamedTuple costs more to build than the rest of a cache hit): its number of features n (-1:
# fewer than 2, not cached), an `itemgetter` of its names, the names, their columns (-1: unknown),
# whether all are known, the values the getter read, those values as native float64 bytes, and
# the struct that packs n values.
_NO_ENCODING: tuple = (-1, None, None, None, False, None, None, None)


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
    streammargin.errors.InvalidInput: feature 'd' has value nan: expected a finite real number
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
        self._cache = _NO_ENCODING
        self._cached_val: np.ndarray | None = None  # the cached packed values as an array, on demand

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
        column -1: they carry no weight, but kernels and norms still see their values. The value
        array is read-only.
        """
        idx, packed = self.encode_packed(x, grow)
        val = self._cached_val
        if val is None:
            val = self._cached_val = _frombuffer(packed)
        return idx, val

    def encode_packed(
        self, x: dict, grow: bool, check_finite: bool = True
    ) -> tuple[np.ndarray, bytes]:
        """`encode` with the values as native float64 bytes, for numba entry points
        (`streammargin.jit.entry`) that take them without the cost of a numpy array.

        `check_finite=False` leaves NaN and infinities to the caller, which must then check the
        values (in numba, where it costs nothing) and call `forget_bad` if they are not finite:
        the cache must only hold finite values. Strings, None and containers still raise here.
        """
        n, getter, keys, idx, all_known, cached_values, cached_packed, packer = self._cache
        if len(x) == n and type(x) is dict:
            # As many features as the last dict: if the getter finds all of its names, x has the
            # same names, and the getter reads x's values in the cached order, that of the cached
            # columns (x's own key order does not matter). Usually x is the very same dict
            # (learn_one right after predict_one) and nothing needs converting: values that
            # compare equal (1 == 1.0 == True) pack to the same float64.
            try:
                values = getter(x)
                if values == cached_values and (all_known or not grow):
                    return idx, cached_packed
                packed = packer.pack(*values)  # raises for strings, None, containers, huge ints
                if check_finite:
                    total = sum(values)
                    if total - total != 0:  # NaN or inf (or an overflowing sum): the slow path
                        raise ValueError
            except Exception:  # a missing name (KeyError) or a bad value
                return self._encode_in_order(x, grow, check_finite)
            if grow and not all_known:
                idx, all_known = self._grow(keys)
            self._cache = (n, getter, keys, idx, all_known, values, packed, packer)
            self._cached_val = None
            return idx, packed
        return self._encode_in_order(x, grow, check_finite)

    def _encode_in_order(self, x: dict, grow: bool, check_finite: bool) -> tuple[np.ndarray, bytes]:
        """`encode_packed` of a dict with other names than the last one: x's own key order."""
        keys = tuple(x)
        idx, all_known = self.columns(keys)
        values = tuple(x.values())
        n = len(keys)
        packer = _packer(n)
        try:
            # float64 bytes in x's order: strings, None, containers and ints beyond float64 make
            # the packing raise; NaN/inf make `total - total` NaN (a sum of huge finite values
            # that overflows takes the slow path too, which accepts it).
            packed = packer.pack(*values)
            finite = True
            if check_finite:
                total = sum(values)
                finite = total - total == 0
        except Exception:
            finite = False
        if not finite:
            packed = describe_bad_values(x).tobytes()
            values = tuple(np.frombuffer(packed).tolist())
        if grow and not all_known:
            idx, all_known = self._grow(keys)
        getter = operator.itemgetter(*keys) if n >= 2 else None  # (returns a tuple for n >= 2)
        self._cache = (n if n >= 2 else -1, getter, keys, idx, all_known, values, packed, packer)
        self._cached_val = None
        return idx, packed

    def _grow(self, keys: tuple) -> tuple[np.ndarray, bool]:
        for name in keys:
            if name not in self.index:
                self._add(name)
        return self.columns(keys)

    def forget_bad(self, x: dict) -> typing.NoReturn:
        """Raise the `InvalidInput` naming `x`'s first non-finite feature, after dropping `x` from
        the cache (see `encode_packed`)."""
        self._forget_cache()
        describe_bad_values(x)
        raise InvalidInput(f"{x!r:.200} has a value that is not a finite real number")

    def encode_columns(self, names: typing.Iterable, grow: bool) -> np.ndarray:
        """Columns of a frame's column names (-1 for unknown names unless `grow`)."""
        names = list(names)
        if grow:
            for name in names:
                if name not in self.index:
                    self._add(name)
            self._forget_cache()
        return np.array([self.index.get(n, -1) for n in names], dtype=np.int64)

    def truncate(self, n_names: int) -> None:
        """Forget every name after the first `n_names` (a learn_many that failed)."""
        for name in self.names[n_names:]:
            del self.index[name]
        del self.names[n_names:]
        self.n_columns = self.first_column + n_names
        self._forget_cache()

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
                raise StateError(f"feature name {name!r:.80} appears twice in the saved state")
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
