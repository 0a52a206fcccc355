"""Feature mapping: River dicts <-> columns of contiguous float64 vectors, within a bound.

A `FeatureSpace` gives a feature name a column the first time a model learns from it, and the name
keeps that column for ever. Features may be absent from any dict (a sparse dict is a vector with
zeros elsewhere). Values must be finite real numbers (`bool` counts as 0/1); anything else raises
`InvalidInput` (a `ValueError`) that names the feature, before any state is touched.

The space is bounded: `max_features` columns for names (columns reserved by the model, such as an
intercept's, come on top). The first `max_features - n_hashed` names get a column of their own
(*exact* columns); every later name, and every name whose JSON encoding in a saved state would be
longer than `MAX_NAME_BYTES`, is *hashed* into one of the last `n_hashed` columns by the CRC-32 of
that encoding (stable across processes and platforms, unlike Python's salted `hash`), and is never
stored. So a model's memory is bounded by its parameters whatever the stream (see
`streammargin.memory`), names seen early (usually the stable schema) keep exact columns, and names
beyond the bound still carry signal. Names that share a hashed column in one record add up their
values. `features_hashed` counts the feature occurrences learnt through a hashed column: how often
the bound acted.

The per-record path is the hot path of every model in this package, so it is written for speed:
the previous dict's names, columns and values are cached with an `operator.itemgetter` of its
names, which reads the values of a dict with the same names in the cached order in one C call
(streams repeat their names; learn_one usually follows predict_one on the same dict, which then
costs one getter call and a tuple comparison); new values are packed as float64 by one
`struct.pack` (which also refuses strings, None and containers; 2x faster than `np.fromiter` at
100 features), handed over as those bytes (`encode_packed`) or viewed by numpy without a copy
(`encode`, read-only), and finiteness costs one builtin `sum`. Hashing costs only when a record has
names without an exact column; such a record is not cached.
"""

from __future__ import annotations

import itertools
import json
import math
import numbers
import operator
import struct
import typing
import zlib
from json.encoder import encode_basestring_ascii as _json_str

import numpy as np

from streammargin import validation
from streammargin.errors import InvalidInput, StateError

__all__ = [
    "DEFAULT_MAX_FEATURES",
    "FeatureSpace",
    "MAX_NAME_BYTES",
    "describe_bad_values",
    "hashed_columns",
    "name_json",
    "validate_value",
]

# The longest name a space stores, in bytes of its JSON encoding (what a saved state holds: a plain
# ASCII name of up to 126 characters). Longer names are hashed.
MAX_NAME_BYTES = 128
# The default bound of a space, for linear models (24 bytes a column for ALMA).
DEFAULT_MAX_FEATURES = 2**16
# The largest bound a model accepts (a column index must stay far from int64's range, and a bound
# this large is not a bound); `streammargin.memory` refuses states whose bound implies too many
# bytes.
MAX_MAX_FEATURES = 2**30


def hashed_columns(max_features: int) -> int:
    """How many of `max_features` columns take the hashed names: an eighth (at least one).

    An eighth keeps 7/8 of the columns exact (names that come early, usually the schema, never
    collide) and leaves enough hashed columns that names beyond the bound rarely share one
    (`benchmarks/feature_bound_accuracy.py` compares 1/16, 1/8, 1/4 and 1/2; the table is in
    docs/performance.md, "Bounded feature space").
    """
    return max(1, max_features // 8)


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


def name_json(name: typing.Any) -> str:
    """The JSON text a saved state holds for a feature name (`streammargin.state.encode_name`,
    ASCII): its size is what storing the name costs, its CRC-32 places a hashed name.

    Raises `InvalidInput` for a name that has no safe state (a type other than str, int, float,
    bool, None or tuples of them, or a NaN/infinite float).
    """
    if isinstance(name, str):
        return _json_str(name)
    from streammargin import state

    try:
        return json.dumps(state.encode_name(name), allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        raise InvalidInput(
            f"feature name {name!r:.80} of type {type(name).__name__} cannot be saved: names must "
            "be str, int, finite float, bool, None or tuples of them"
        ) from None


def _tie_text(name: typing.Any) -> str:
    """What orders the entries of one column (unknown names, names hashed together): the name's
    JSON text; a name without one (prediction maps it to -1) after every name that has one."""
    try:
        return name_json(name)
    except InvalidInput:
        return f"\x7f{type(name).__name__}:{name!r}"  # JSON text is ASCII below 0x7f


def canonical_order(keys: typing.Sequence, cols: typing.Sequence[int]) -> list[int] | None:
    """The positions of a record's entries (`keys[j]` in column `cols[j]`) in the order a model
    takes them, or None when they are in that order already.

    The order: by column, unknown names (-1) last, the entries of one column (unknown names,
    names hashed together) by the JSON text of their names. Floating-point sums depend on the
    order of their terms, so every sum over a record's entries (dot products, squared norms and
    distances, the values of names hashed together) runs in this order, which does not depend
    on the order of the dict's keys: a model's predictions do not either (River's
    `check_shuffle_features_no_impact`; `tests/test_feature_order.py`), bit for bit.
    (Summed in the dict's order, the budget SVM's rounding differences between key orders grew
    past River's tolerance on unscaled ImageSegments within 100 records.)
    """
    shared: set = set()
    seen: set = set()
    for column in cols:
        if column < 0 or column in seen:
            shared.add(column)
        seen.add(column)
    if not shared:
        if sorted(cols) == list(cols):
            return None
        return sorted(range(len(cols)), key=cols.__getitem__)
    last = 1 << 62  # beyond every column
    order = sorted(
        range(len(cols)),
        key=lambda j: (
            cols[j] if cols[j] >= 0 else last,
            _tie_text(keys[j]) if cols[j] in shared else "",
        ),
    )
    return None if order == list(range(len(cols))) else order


_PACKERS: dict[int, struct.Struct] = {}
_MAX_CACHED_PACKER = 4096  # longer records build their struct each time: the cache stays bounded


def _packer(n: int) -> struct.Struct:
    """struct.Struct for n native float64 values (cached: streams repeat their lengths)."""
    packer = _PACKERS.get(n)
    if packer is None:
        packer = struct.Struct(f"{n}d")
        if n <= _MAX_CACHED_PACKER:
            _PACKERS[n] = packer
    return packer


_frombuffer = np.frombuffer


def _python_only(*args: typing.Any) -> None:
    """The stand-in for the C encoder where it is not built: every record takes Python's path."""
    return None


def _bind_native() -> None:
    """Bind `_sorted_known` and `_pack_as` to the C module's functions where `streammargin
    warmup` built it (`streammargin/jit/records.c`), else to `_python_only`."""
    global _sorted_known, _pack_as
    from streammargin.jit import aot

    module = aot.native("records")
    _sorted_known = module.sorted_known if module is not None else _python_only
    _pack_as = module.pack_as if module is not None else _python_only


#: How many sets of names `FeatureSpace` keeps the encodings of (see `_forget_cache`).
RECENT_NAME_SETS = 64


def _sorted_known(x: dict, index: dict) -> tuple | None:
    """`(names, values, columns as int64 bytes, values as float64 bytes, dict_names, ranks)` of
    a record whose names are all str with a column of their own and whose values are finite
    floats, ints or bools: the first four in column order, then the names in the dict's order
    and each one's position in column order (None: the dict was in column order); None for any
    other record (the Python path).
    (The first call binds the name: `_bind_native`.)"""
    _bind_native()
    return _sorted_known(x, index)


def _pack_as(x: dict, dict_names: tuple, ranks: tuple) -> tuple | None:
    """`(values, values as float64 bytes)` in column order of a dict whose keys are
    `dict_names`, in that order, with finite float, int or bool values (name i's value goes to
    position `ranks[i]`, or i when `ranks` is None); None for any other (the Python path).
    (See `_sorted_known`.)"""
    _bind_native()
    return _pack_as(x, dict_names, ranks)


def _ranks(positions: typing.Sequence[int]) -> tuple:
    """Where each entry of a dict goes in column order, given the dict positions in that order."""
    ranks = [0] * len(positions)
    for rank, position in enumerate(positions):
        ranks[position] = rank
    return tuple(ranks)


# The cache of the last dict a FeatureSpace encoded, one plain tuple (one store per encoding; a
# NamedTuple costs more to build than the rest of a cache hit): its number of features n (-1:
# fewer than 2, not cached), an `itemgetter` of its names, the names, their columns (-1: unknown),
# whether all are known, the values the getter read, those values as native float64 bytes, and
# the struct that packs n values, then the names in the dict's own order and each one's position in
# the column order (None: the same order), for `_pack_as`. A record with a hashed name is never cached (its columns are
# not one per name, and learning it must count it).
_NO_ENCODING: tuple = (-1, None, None, None, False, None, None, None, None, None)


# The keys of a saved space (`FeatureSpace.to_state`), and those of a space saved before spaces had
# a bound.
_STATE_KEYS = frozenset(
    {"first_column", "max_features", "n_hashed", "hashing", "features_hashed", "names"}
)
_UNBOUNDED_STATE_KEYS = frozenset({"first_column", "names"})


class FeatureSpace:
    """Names of features and the vector columns they map to, at most `max_features` columns.

    Parameters
    ----------
    first_column
        Column of the first feature name. Models reserve the columns before it (e.g. column 0 for
        the intercept's constant feature).
    max_features
        Columns for names (reserved columns not counted). The first `max_features - n_hashed`
        names get their own column; later names, and names longer than `MAX_NAME_BYTES` in
        JSON, share the last `n_hashed` columns (`hashed_columns(max_features)`) by a stable hash.

    Examples
    --------

    >>> space = FeatureSpace(first_column=1, max_features=4)
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

    Three exact columns and one hashed column: "c" takes the last exact column, "d" and "e" share
    the hashed one, their values added up, and neither is stored.

    >>> idx, val = space.encode({"c": 1.0, "d": 2.0, "e": 0.5}, grow=True)
    >>> idx.tolist(), val.tolist()
    ([3, 4], [1.0, 2.5])
    >>> space.names, space.n_columns, space.features_hashed
    (['a', 'b', 'c'], 5, 2)

    Once the exact columns are full, prediction maps an unknown name to its hashed column:

    >>> space.encode({"z": 1.0}, grow=False)[0].tolist()
    [4]

    """

    def __init__(self, first_column: int = 0, max_features: int = DEFAULT_MAX_FEATURES):
        validation.integer_in("max_features", max_features, 1, MAX_MAX_FEATURES)
        self.first_column = first_column
        self.max_features = int(max_features)
        self.n_hashed = hashed_columns(self.max_features)
        self.n_exact = self.max_features - self.n_hashed
        self.hashed_start = first_column + self.n_exact  # the first hashed column
        self.names: list[typing.Hashable] = []
        self.index: dict[typing.Hashable, int] = {}
        # Whether the hashed columns are in use (n_columns covers them): from the first hashed
        # name or once the exact columns are full, whichever comes first.
        self.hashing = self.n_exact == 0
        # columns in use, reserved ones included
        self.n_columns = first_column + (self.max_features if self.hashing else 0)
        self.features_hashed = 0
        self._forget_cache()

    def _forget_cache(self) -> None:
        self._cache = _NO_ENCODING
        self._cached_val: np.ndarray | None = None  # the cached packed values as an array, on demand
        # The encodings of the last RECENT_NAME_SETS sets of names (every name known), by the
        # names in the dict's order: a record of categories (one-hot: `country=BR`) has the
        # names of one of a few such sets, rarely those of the record before it.
        self._recent: dict[tuple, tuple] = {}

    def __len__(self) -> int:
        return len(self.names)

    @property
    def full(self) -> bool:
        """Whether every exact column has its name (new names are hashed)."""
        return len(self.names) >= self.n_exact

    def _hashed_column(self, text: str) -> int:
        """The hashed column of a name whose JSON encoding is `text`."""
        return self.hashed_start + zlib.crc32(text.encode("ascii")) % self.n_hashed

    # Placing names --------------------------------------------------------------------------------

    def _place(self, keys: typing.Sequence, cols: list[int]) -> tuple[list, int]:
        """Columns for the unknown names of `keys` (entries -1 of `cols`, filled in place), as
        learning would give them, without changing the space: returns the names that get exact
        columns, in order, and the number of entries hashed. Raises `InvalidInput` for a name that
        cannot be saved.

        A record's new names get their columns in the order of their JSON text, not in the
        dict's order (and when there are more than exact columns left, those that come first in
        that order get them): a model must not depend on the order of a dict's keys (River's
        checker shuffles them), and its columns are the order its arithmetic runs in
        (`canonical_order`)."""
        texts: dict = {}  # unknown name -> its JSON text (a frame may repeat a column name)
        for j, name in enumerate(keys):
            if cols[j] < 0 and name not in texts:
                texts[name] = name_json(name)
        room = self.n_exact - len(self.names)
        fits = sorted(
            (name for name, text in texts.items() if len(text) <= MAX_NAME_BYTES),
            key=texts.__getitem__,
        )[:room]
        column = self.first_column + len(self.names)
        placed: dict = {}
        for name in fits:
            placed[name] = column
            column += 1
        hashed = 0
        for j, name in enumerate(keys):
            if cols[j] >= 0:
                continue
            column = placed.get(name, -1)
            if column < 0:
                column = placed[name] = self._hashed_column(texts[name])
            if column >= self.hashed_start:
                hashed += 1
            cols[j] = column
        return fits, hashed

    def _commit(self, new_names: list, hashed: int) -> None:
        """Add the names `_place` gave exact columns; open the hashed columns if needed."""
        index, names = self.index, self.names
        column = self.first_column + len(names)
        for name in new_names:
            names.append(name)
            index[name] = column
            column += 1
        if hashed or len(names) >= self.n_exact:
            self.hashing = True
        self.n_columns = self.first_column + (self.max_features if self.hashing else len(names))

    def _lookup(self, keys: typing.Sequence, cols: list[int]) -> bool:
        """Prediction's columns for the unknown names of `keys` (entries -1 of `cols`): their hashed
        column where learning would hash them and the hashed columns are in use, else -1 (the name
        has no weight yet, but its value still counts in norms and kernels). Returns whether any
        name was hashed."""
        if not self.hashing:
            return False
        full = self.full
        hashed = False
        for j, name in enumerate(keys):
            if cols[j] >= 0:
                continue
            try:
                text = name_json(name)
            except InvalidInput:  # learning refuses it: no column
                continue
            if full or len(text) > MAX_NAME_BYTES:
                cols[j] = self._hashed_column(text)
                hashed = True
        return hashed

    def _merged(
        self, keys: typing.Sequence, cols: list[int], floats: typing.Sequence[float]
    ) -> tuple[np.ndarray, bytes]:
        """(idx, packed) with the entries that share a hashed column summed into one (the model's
        numba code expects distinct columns), in `canonical_order` (so the values of names hashed
        together are summed in the order of their JSON text)."""
        order = canonical_order(keys, cols)
        if order is not None:
            keys = [keys[j] for j in order]
            cols = [cols[j] for j in order]
            floats = [floats[j] for j in order]
        start = self.hashed_start
        out_cols: list[int] = []
        out_vals: list[float] = []
        position: dict[int, int] = {}
        shared: list[int] = []
        for column, value in zip(cols, floats):
            if column >= start:
                at = position.get(column, -1)
                if at >= 0:
                    out_vals[at] += value
                    shared.append(at)
                    continue
                position[column] = len(out_cols)
            out_cols.append(column)
            out_vals.append(value)
        for at in shared:
            if not math.isfinite(out_vals[at]):
                sources = [
                    (name, value) for name, column, value in zip(keys, cols, floats)
                    if column == out_cols[at]
                ]
                if all(math.isfinite(value) for _, value in sources):  # else the caller's check
                    names = ", ".join(repr(name) for name, _ in sources)
                    raise InvalidInput(
                        f"features {names:.200} share hashed column {out_cols[at]} and their "
                        "values add up beyond float64's range"
                    )
        return np.array(out_cols, dtype=np.int64), _packer(len(out_vals)).pack(*out_vals)

    # Encoding -------------------------------------------------------------------------------------

    def encode(self, x: dict, grow: bool) -> tuple[np.ndarray, np.ndarray]:
        """Columns and float64 values of the features in `x`, in the order of their columns
        (`canonical_order`: unknown names last), whatever the order of `x`'s keys.

        With `grow=True` (learning) unknown names get new columns, or their hashed column beyond
        the bound; the values and names are validated first, so a bad dict leaves the space
        unchanged. With `grow=False` (prediction) unknown names get column -1 (they carry no
        weight, but kernels and norms still see their values) until the exact columns are full,
        then the hashed column they would learn into. Names that share a hashed column come as
        one entry, their values summed. The value array is read-only.
        """
        idx, packed = self.encode_packed(x, grow)
        val = self._cached_val
        if val is None:
            val = self._cached_val = _frombuffer(packed)
        return idx, val

    def repeat_encoding(self, x: dict) -> tuple[np.ndarray, bytes] | None:
        """`(idx, packed)` of `x` when `x` is the dict this space encoded last, again, with every
        name known: exactly what `encode_packed(x, grow=True)` would return (and it changes
        nothing); else None, and the caller calls `encode_packed`.

        The per-record path's cache hit, for learn_one right after predict_one on the same dict:
        `x` is a plain dict with the last dict's names and values that compare equal (they pack
        to the same float64 bytes: 1 == 1.0 == True), and none of its names is unknown or
        hashed (a record with a hashed name is never cached). Never raises: anything odd (a
        missing name, a value that does not compare) is a miss. `idx` is int64, C-contiguous;
        `packed` is bytes (see `encode_packed`).
        """
        n, getter, _, idx, all_known, values, packed, _, dict_names, ranks = self._cache
        if type(x) is dict and len(x) == n and all_known:
            found = _pack_as(x, dict_names, ranks)  # (C: x's values, without a lookup)
            if found is not None:
                return (idx, packed) if found[0] == values else None
            try:
                if getter(x) == values:
                    return idx, packed
            except Exception:  # a missing name or an odd value: not the last dict
                pass
        return None

    def encode_packed(
        self, x: dict, grow: bool, check_finite: bool = True
    ) -> tuple[np.ndarray, bytes]:
        """`encode` with the values as native float64 bytes, for numba entry points
        (`streammargin.jit.entry`) that take them without the cost of a numpy array.

        `check_finite=False` leaves NaN and infinities to the caller, which must then check the
        values (in numba, where it costs nothing) and call `forget_bad` if they are not finite:
        the cache must only hold finite values. Strings, None and containers still raise here.
        """
        (n, getter, keys, idx, all_known, cached_values, cached_packed, packer, dict_names,
         ranks) = self._cache
        if len(x) != n or type(x) is not dict:
            return self._encode_in_order(x, grow, check_finite)
        # As many features as the last dict: it may have the same names. Its values in the
        # cached column order come from C when it has them in the same order too and they are
        # plain and finite (a dense stream's next record; no lookup per name), else from the
        # getter when it has the last dict's first name (a sparse stream's next record usually
        # lacks it: no KeyError to raise and catch, ~1 us), which reads x's values in the
        # cached order whatever the order of x's keys. Usually x is the very same dict
        # (learn_one right after predict_one) and nothing needs converting: values that compare
        # equal (1 == 1.0 == True) pack to the same float64. (Reading a dense record's values in C
        # took ALMA's predict + learn at 100 features from 5.95 to 5.16 us.)
        try:
            found = _pack_as(x, dict_names, ranks)
            if found is not None:
                values, packed = found
                same = values == cached_values
            elif self._recent and tuple(x) in self._recent:
                # The names of a recent record other than the last (one-hot categories): its
                # encoding, without the getter's KeyError below (~1 us a record).
                return self._encode_in_order(x, grow, check_finite)
            elif keys[0] in x:
                values = getter(x)
                same = values == cached_values
                if not same:
                    # (raises for strings, None, containers and ints beyond float64)
                    packed = packer.pack(*values)
                    if check_finite:
                        total = sum(values)
                        if total - total != 0:  # NaN or inf (or an overflowing sum): slow path
                            raise ValueError
            else:
                return self._encode_in_order(x, grow, check_finite)
        except Exception:  # a missing name (KeyError) or a bad value
            return self._encode_in_order(x, grow, check_finite)
        if same and (all_known or not grow):
            return idx, cached_packed
        if grow and not all_known:
            # A prediction left names unknown: learning places them (this may hash), and their
            # columns give the entries another order.
            return self._encode_in_order(x, grow, check_finite)
        self._cache = (n, getter, keys, idx, all_known, values, packed, packer, dict_names, ranks)
        self._cached_val = None
        return idx, packed

    def _encode_in_order(self, x: dict, grow: bool, check_finite: bool) -> tuple[np.ndarray, bytes]:
        """`encode_packed` of a dict with other names than the last one, in `canonical_order`."""
        recent = self._recent.get(tuple(x)) if type(x) is dict else None
        if recent is not None:
            # The names of a recent record, in its order: its columns and order stand (the
            # columns of known names never change), the values are x's (C, plain and finite, or
            # None: the path below). Measured on ten numbers and two one-hot categories of 4 and
            # 3 values: ALMA's predict + learn from ~6.5 to ~4.5 us a record.
            found = _pack_as(x, recent[8], recent[9])
            if found is not None:
                self._cache = (*recent[:5], found[0], found[1], *recent[7:])
                self._cached_val = None
                return recent[3], found[1]
        # Names all known, each in its own column, values plain and finite (a sparse stream's
        # record, usually): the C encoder gives what the code below would, to the byte, in about
        # a fifth of the time (~2 us instead of ~7 for 20 names; `tests/test_features.py`
        # compares them). Anything else: None, and the code below.
        found = _sorted_known(x, self.index)
        if found is not None:
            keys, values, columns, packed, dict_names, ranks = found
            n = len(keys)
            idx = _frombuffer(columns, np.int64)  # (writable: the buffer is a bytearray)
            getter = operator.itemgetter(*keys) if n >= 2 else None
            self._cache = (n if n >= 2 else -1, getter, keys, idx, True, values, packed, _packer(n),
                           dict_names, ranks)
            self._cached_val = None
            self._remember(dict_names)
            return idx, packed
        keys = dict_names = tuple(x)
        ranks = None  # (None: in the dict's order)
        cols = list(map(self.index.get, keys))
        all_known = None not in cols
        if not all_known:
            cols = [-1 if column is None else column for column in cols]
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
        if not all_known:
            if grow:
                new_names, hashed = self._place(keys, cols)  # raises before changing anything
                if hashed:
                    return self._learn_hashed(keys, cols, packer.unpack(packed), new_names, hashed)
                self._commit(new_names, 0)
                all_known = True
            elif self._lookup(keys, cols):
                self._forget_cache()
                return self._merged(keys, cols, packer.unpack(packed))
        # The entries in the order of their columns, whatever the dict's order: the cache keeps
        # that order, so a cache hit costs nothing more (its getter reads any dict in it).
        if all_known:
            # Every name has its own column: order by column, in one sort when they are not in
            # order (the common case of a sparse stream whose names came in another order).
            if n >= 2 and any(map(operator.gt, cols, itertools.islice(cols, 1, None))):
                # (one itemgetter of the sorted positions takes all three in C)
                positions = sorted(range(n), key=cols.__getitem__)
                take = operator.itemgetter(*positions)
                keys, values, cols = take(keys), take(values), list(take(cols))
                packed = packer.pack(*values)
                ranks = _ranks(positions)
            order = None
        else:
            order = canonical_order(keys, cols)
        if order is not None:
            keys = tuple([keys[j] for j in order])
            cols = [cols[j] for j in order]
            values = tuple([values[j] for j in order])
            packed = packer.pack(*values)
            ranks = _ranks(order)
        idx = np.fromiter(cols, np.int64, n)
        getter = operator.itemgetter(*keys) if n >= 2 else None  # (returns a tuple for n >= 2)
        self._cache = (n if n >= 2 else -1, getter, keys, idx, all_known, values, packed, packer,
                       dict_names, ranks)
        self._cached_val = None
        if all_known:
            self._remember(dict_names)
        return idx, packed

    def _remember(self, dict_names: tuple) -> None:
        """Keep the encoding just cached among the recent ones (at most RECENT_NAME_SETS)."""
        recent = self._recent
        if len(recent) >= RECENT_NAME_SETS:
            recent.clear()
        recent[dict_names] = self._cache

    def _learn_hashed(
        self, keys: tuple, cols: list[int], floats: tuple, new_names: list, hashed: int
    ) -> tuple[np.ndarray, bytes]:
        """Learning's encoding of a record with hashed names: merged (which may still refuse it),
        then the space changes and counts them. Not cached."""
        idx, packed = self._merged(keys, cols, floats)
        self._commit(new_names, hashed)
        self.features_hashed += hashed
        self._forget_cache()
        return idx, packed

    def forget_bad(self, x: dict) -> typing.NoReturn:
        """Raise the `InvalidInput` naming `x`'s first non-finite feature, after dropping `x` from
        the cache (see `encode_packed`)."""
        self._forget_cache()
        describe_bad_values(x)
        raise InvalidInput(f"{x!r:.200} has a value that is not a finite real number")

    def encode_columns(
        self, names: typing.Iterable, grow: bool, values: np.ndarray | None = None
    ) -> np.ndarray:
        """Columns of a frame's column names: learning places unknown names (`grow`), prediction
        maps them as `encode` does. The columns may repeat (hashed names, or a repeated name):
        `streammargin.base.merge_shared_columns` sums those.

        With the frame's `values` (NaN = absent), learning places the names as `learn_one` would
        row by row: only names present in some row, by the first row they appear in, the names
        new in one row in the order of their JSON text (and when a row brings more new names than
        there are exact columns left, the first in that order get them). A name absent from every row stays unknown (-1). Learning does not count hashed
        names here (`count_hashed` does, once the frame is learnt)."""
        names = list(names)
        get = self.index.get
        cols = [get(name, -1) for name in names]
        if -1 in cols:
            if not grow:
                self._lookup(names, cols)
            else:
                if values is None:
                    new_names, hashed = self._place(names, cols)  # raises before any change
                else:
                    new_names, hashed = self._place_rows(names, cols, values)
                self._commit(new_names, hashed)
                self._forget_cache()
        return np.array(cols, dtype=np.int64)

    def _place_rows(
        self, names: list, cols: list[int], values: np.ndarray
    ) -> tuple[list, int]:
        """`_place` for a frame's columns, following its rows (see `encode_columns`)."""
        unknown = [j for j, column in enumerate(cols) if column < 0]
        present = ~np.isnan(values[:, unknown])
        first_row: dict = {}  # unknown name -> (first row it is present in, its first position)
        for k, j in enumerate(unknown):
            rows = np.flatnonzero(present[:, k])
            if rows.shape[0]:
                name = names[j]
                key = (int(rows[0]), j)
                if name not in first_row or key < first_row[name]:
                    first_row[name] = key
        texts = {name: name_json(name) for name in first_row}  # raises before any change
        # as learn_one places a row's new names: in the order of their JSON text
        order = sorted(first_row, key=lambda name: (first_row[name][0], texts[name]))
        fits = [name for name in order if len(texts[name]) <= MAX_NAME_BYTES]
        room = self.n_exact - len(self.names)
        if len(fits) > room:
            # The row that runs out of exact columns chooses among its names by JSON text.
            exact: list = []
            row = 0
            while len(exact) < room:
                row = first_row[fits[len(exact)]][0]
                group = [name for name in fits if first_row[name][0] == row]
                if len(exact) + len(group) > room:
                    chosen = set(sorted(group, key=texts.__getitem__)[: room - len(exact)])
                    group = [name for name in group if name in chosen]
                exact.extend(group)
            fits = exact
        column = self.first_column + len(self.names)
        placed: dict = {}
        for name in fits:
            placed[name] = column
            column += 1
        hashed = 0
        for j in unknown:
            name = names[j]
            if name not in first_row:
                continue  # absent from every row: stays unknown
            column = placed.get(name, -1)
            if column < 0:
                column = placed[name] = self._hashed_column(texts[name])
            if column >= self.hashed_start:
                hashed += 1
            cols[j] = column
        return fits, hashed

    def count_hashed(self, values: np.ndarray, cols: np.ndarray) -> None:
        """Count the present entries (not NaN) of a learnt frame's hashed columns, as `learn_one`
        would have counted them row by row."""
        hashed = cols >= self.hashed_start
        if hashed.any():
            self.features_hashed += int(np.count_nonzero(~np.isnan(values[:, hashed])))

    def mark(self) -> tuple[int, bool, int]:
        """What `rollback` restores (before a `learn_many` that may fail)."""
        return len(self.names), self.hashing, self.features_hashed

    def rollback(self, mark: tuple[int, bool, int]) -> None:
        """Forget every name added since `mark` (a learn_many that failed)."""
        n_names, self.hashing, self.features_hashed = mark
        for name in self.names[n_names:]:
            del self.index[name]
        del self.names[n_names:]
        self.n_columns = self.first_column + (self.max_features if self.hashing else n_names)
        self._forget_cache()

    def decode(self, vector: np.ndarray) -> dict:
        """The entries of a column vector as a dict name -> value, for the names with an exact
        column (reserved and hashed columns left out: a hashed column has no single name)."""
        first = self.first_column
        return {name: float(vector[first + j]) for j, name in enumerate(self.names)}

    # Safe state -------------------------------------------------------------------------------

    def to_state(self) -> dict:
        from streammargin import state

        return {
            "first_column": self.first_column,
            "max_features": self.max_features,
            "n_hashed": self.n_hashed,
            "hashing": self.hashing,
            "features_hashed": self.features_hashed,
            "names": [state.encode_name(n) for n in self.names],
        }

    @classmethod
    def from_state(cls, data: typing.Any, first_column: int, max_features: int) -> FeatureSpace:
        """The space saved by `to_state`, for a model whose params say `first_column` and
        `max_features`; anything else (a checkpoint is untrusted), or a space that does not fit
        them, raises `StateError`.

        The dict holds exactly the keys `to_state` writes: the bound (equal to the params'), the
        `hashing` flag and `features_hashed` counter (as learning leaves them: the hashed columns
        are in use once a name was hashed or the exact columns are full), and the names (at most
        the exact columns, each one `MAX_NAME_BYTES` of JSON at most, none twice). A state saved
        before spaces had a bound holds exactly `first_column` and `names`: it is restored if its
        names fit the bound."""
        from streammargin import state

        if not isinstance(data, dict) or set(data) not in (_STATE_KEYS, _UNBOUNDED_STATE_KEYS):
            raise StateError(
                f"a feature space state is a dict with exactly the keys {sorted(_STATE_KEYS)} "
                "(or, saved before the bound, first_column and names)"
            )
        if not isinstance(data["names"], list):
            raise StateError("the saved feature space is not a dict with a list of names")
        space = cls(first_column=first_column, max_features=max_features)
        expected = {
            "first_column": first_column,
            "max_features": space.max_features,
            "n_hashed": space.n_hashed,
        }
        for key, value in expected.items():
            saved = data.get(key, value)
            if type(saved) is not int or saved != value:
                raise StateError(
                    f"the saved feature space has {key}={saved!r:.40}, "
                    f"the model's params say {value}"
                )
        names = data["names"]
        if len(names) > space.n_exact:
            raise StateError(
                f"the saved feature space holds {len(names)} names, more than the "
                f"{space.n_exact} exact columns of max_features={space.max_features}"
            )
        bounded = set(data) == _STATE_KEYS
        hashing = data["hashing"] if bounded else len(names) >= space.n_exact
        features_hashed = data["features_hashed"] if bounded else 0
        if type(hashing) is not bool or type(features_hashed) is not int or not (
            0 <= features_hashed < 2**63
        ):
            raise StateError("the saved feature space has a bad 'hashing' flag or counter")
        if not hashing and (features_hashed > 0 or len(names) >= space.n_exact):
            raise StateError(
                "the saved feature space's 'hashing' flag is off, but its counter or its full "
                "exact columns say the hashed columns are in use"
            )
        new_names: dict = {}
        for encoded in names:
            name = state.decode_name(encoded)
            try:
                text = name_json(name)
            except InvalidInput:
                raise StateError(f"feature name {name!r:.80} has no safe state") from None
            if len(text) > MAX_NAME_BYTES:
                raise StateError(f"feature name {name!r:.80} is too long to be stored")
            if name in new_names:
                raise StateError(f"feature name {name!r:.80} appears twice in the saved state")
            new_names[name] = None
        space._commit(list(new_names), 1 if hashing else 0)
        space.features_hashed = features_hashed
        return space

    # Pickling: the lookup cache is rebuilt on demand, it is not part of the model.

    def __getstate__(self) -> dict:
        return {
            "first_column": self.first_column,
            "max_features": self.max_features,
            "hashing": self.hashing,
            "features_hashed": self.features_hashed,
            "names": self.names,
        }

    def __setstate__(self, data: dict) -> None:
        self.__init__(data["first_column"], data["max_features"])  # type: ignore[misc]
        self._commit(list(data["names"]), 1 if data["hashing"] else 0)
        self.features_hashed = data["features_hashed"]
