"""A standard scaler with a ceiling on memory and a safe state.

River's `preprocessing.StandardScaler` keeps a count, a mean and a variance per feature name in
dicts that grow with every new name, for ever (a stream whose names are ids grows it without
bound; even `transform_one` adds an entry per unseen name). This one computes exactly what River's
computes (`with_std=True`), bit for bit, with three differences that only show where River's
would grow without bound, fail or go non-finite:

- at most `max_features` names have statistics; names beyond that, and names that cannot be
  saved in a state within 128 bytes of JSON (a feature space's rule: strings of more than 126
  ASCII characters or fewer beyond ASCII, types other than str, bool, int, finite float, None or
  tuples of up to 8 of these), pass through `transform_one` unscaled;
- a feature whose update would leave its mean or variance non-finite (values beyond ~1e154
  overflow Welford's products) keeps its statistics unchanged for that value: River's would turn
  into inf or NaN and make every later value of that feature NaN;
- a value that is not a finite real number raises `InvalidInput` before anything changes (River's
  raises TypeError for strings and learns NaN).

`counters` counts each case, so a metrics record can show how often the bounds act.

A record whose names all have columns and whose values are floats, ints or bools is scaled in one
compiled call (the same operations in the same order, and the C library's `pow` where River
computes `var ** 0.5`): `streammargin/jit/records.c` (`scale_known`) when its names are the last
such record's, in its order, and `streammargin.jit.scaler` (numba) otherwise; any other record
takes the Python path.
"""

from __future__ import annotations

import math
import struct
import sys
import typing

import numpy as np
from river import base

from streammargin.errors import StateError
from streammargin.features import MAX_NAME_BYTES, _packer, name_json, validate_value
from streammargin.jit import dispatch
from streammargin.jit import scaler as scaler_jit
from streammargin.jit.entry import EntryPoint
from streammargin.state import encode_name

__all__ = ["StandardScaler", "memory_bound", "state_bound"]

MAX_NAME_LENGTH = 128
# What one name with statistics holds in a process, at most, for a str name (what the worker's
# codecs make): its entry in `_columns` with its three statistics (81 B a name by tracemalloc,
# 65,536 names), rounded up, and its own str, whose JSON fits in MAX_NAME_BYTES (126 ASCII
# characters at most: 49 B + its length, 176 B as the allocator rounds it). After a restore the
# model's feature space holds a copy of its own, so the str is the scaler's to count.
NAME_BYTES_IN_PROCESS = 96 + 176
# What one name takes in a saved state at most: its JSON and a comma, and its count, mean and
# variance as 8-byte array entries.
NAME_BYTES_IN_STATE = MAX_NAME_BYTES + 1 + 3 * 8
# The state's own keys, counters and framing.
STATE_FRAME_BYTES = 4 << 10
MAX_TUPLE_NAME_PARTS = 8
#: The largest `max_features` a scaler (and a restored state) may have.
MAX_FEATURES_LIMIT = 1 << 24
_MAX_FLOAT = sys.float_info.max
_COUNTERS = ("beyond_max_features", "unsavable_names", "overflow_skipped")
_MIN_CAPACITY = 64
# Value types the compiled path takes (`float(value)` is what it computes with); anything else,
# numpy scalars included, takes the Python path, which checks it.
_PLAIN_VALUES = frozenset((float, int, bool))

_STATS = (np.zeros(1, np.int64), np.zeros(1), np.zeros(1))
_SCALE_RECORD = EntryPoint(scaler_jit.scale_record, *_STATS, np.zeros(1, np.int64), b"",
                           np.zeros((scaler_jit.ROWS, 1)), 0.5)
_APPLY_UPDATE = EntryPoint(scaler_jit.apply_update, *_STATS, np.zeros(1, np.int64),
                           np.zeros((scaler_jit.ROWS, 1)))
_compiled: tuple | None = None
_native: typing.Any = False  # records.c's module, None where it is not built (False: not looked up)


def memory_bound(max_features: int = 1 << 16) -> int:
    """The most bytes a scaler of `max_features` holds in a process, whatever it learns (str
    names). 17 MiB at the default: 65,536 names of 126 characters measured 15.9 MiB (5.1 of
    statistics and entries, 10.9 of the names' str objects).

    >>> memory_bound(1 << 16) >> 20
    17
    """
    return max_features * NAME_BYTES_IN_PROCESS + STATE_FRAME_BYTES


def state_bound(max_features: int = 1 << 16) -> int:
    """The most bytes `state.dumps(scaler.to_state())` takes for a scaler of `max_features`
    (str names): 9.6 MiB at the default; 65,536 names of 126 characters measured 9.6 MiB.

    >>> round(state_bound(1 << 16) / 2**20, 1)
    9.6
    """
    return max_features * NAME_BYTES_IN_STATE + STATE_FRAME_BYTES


def _welford(count: int, old_mean: float, old_var: float, x: float) -> tuple | None:
    """River's update of one feature's statistics by a value x, in Python floats:
    count += 1; mean += (x - old_mean) / count; var += ((x - old_mean) * (x - mean) - var) / count.
    `(count, mean, var)`, or None when the mean or variance would not be finite (values beyond
    ~1e154 overflow Welford's products; River's would poison the feature for ever).
    (`streammargin.jit.scaler.scale_record` is the same arithmetic in numba.)"""
    count += 1
    mean = old_mean + (x - old_mean) / count
    var = old_var + ((x - old_mean) * (x - mean) - old_var) / count
    if -_MAX_FLOAT <= mean <= _MAX_FLOAT and 0.0 <= var <= _MAX_FLOAT:
        return count, mean, var
    return None


def _native_scaler() -> typing.Any:
    """The C module (`streammargin/jit/records.c`: `scale_known`, `apply_scaled`) where `streammargin
    warmup` built it, else None. It does what `_compiled_functions` do with the same arithmetic,
    without the Python around them (names checked, values read, dicts made: ~1.3 us a record at
    10 features against ~4.9 through numba). None while `dispatch.recording()` is open, so that
    the exercise records the numba functions, which the records the C path refuses still use."""
    global _native
    if _native is False:
        from streammargin.jit import aot

        _native = aot.native("records")
    return None if dispatch.is_recording() else _native


def _compiled_functions() -> tuple:
    """`scale_record` and `apply_update`, loaded (or compiled) on first use. Their arguments are
    this module's arrays by construction: int64 counts, float64 means and variances (grown by
    concatenation, restored with `astype(copy=True)`), int64 columns, bytes from `_packer`."""
    global _compiled
    if _compiled is None or dispatch.is_recording():  # (each call is recorded, see there)
        _compiled = (_SCALE_RECORD.compiled(), _APPLY_UPDATE.compiled())
    return _compiled


def _scalar_name_ok(name: typing.Any) -> bool:
    kind = type(name)
    if kind is str:
        # (its JSON within MAX_NAME_BYTES too, as a feature space's names: a state escapes a
        # character beyond ASCII to 6 or 12 bytes, and 128 of them took 1.5 KB a name)
        return len(name) <= MAX_NAME_LENGTH and len(name_json(name)) <= MAX_NAME_BYTES
    if kind is int:
        return -(2**63) <= name < 2**63
    if kind is float:
        return math.isfinite(name)
    return kind is bool or name is None


def _name_ok(name: typing.Any) -> bool:
    """Whether `name` may have a column: small, and savable with `state.encode_name`."""
    if type(name) is tuple:
        return (
            len(name) <= MAX_TUPLE_NAME_PARTS
            and all(_scalar_name_ok(part) for part in name)
            and sum(len(part) for part in name if type(part) is str) <= MAX_NAME_LENGTH
            and len(name_json(name)) <= MAX_NAME_BYTES
        )
    return _scalar_name_ok(name)


def _decode_scalar_name(encoded: typing.Any) -> typing.Any:
    if type(encoded) is str:
        return encoded
    if type(encoded) is dict and len(encoded) == 1:
        ((tag, value),) = encoded.items()
        if tag == "bool" and type(value) is bool:
            return value
        if tag == "int" and type(value) is int:
            return value
        if tag == "float" and type(value) in (int, float):
            return float(value)
        if tag == "none" and value is None:
            return None
    raise StateError(f"scaler state: not an encoded feature name: {type(encoded).__name__}")


def _decode_name(encoded: typing.Any) -> typing.Any:
    """`state.decode_name` for the names a scaler keeps (tuples one level deep), without
    recursion, so any nesting a state holds is refused in constant stack."""
    if type(encoded) is dict and set(encoded) == {"tuple"}:
        parts = encoded["tuple"]
        if type(parts) is not list or len(parts) > MAX_TUPLE_NAME_PARTS:
            raise StateError("scaler state: a tuple name must be a list of at most 8 parts")
        name: typing.Any = tuple(_decode_scalar_name(part) for part in parts)
    else:
        name = _decode_scalar_name(encoded)
    if not _name_ok(name):
        raise StateError(f"scaler state: feature name {name!r:.80} is not allowed")
    return name


class StandardScaler(base.Transformer):
    """Scales features to zero mean and unit variance, in bounded memory.

    `learn_one` and `transform_one` compute exactly what River's
    `preprocessing.StandardScaler()` computes (the same Welford updates in the same order, the
    same division that gives 0.0 for a feature without variance), as long as the bounds below
    do not act. The statistics live in numpy arrays, one column per feature name, given in the
    order names are first learnt.

    Parameters
    ----------
    max_features
        Most feature names with statistics. Once that many are known, new names pass through
        `transform_one` unscaled and `counters["beyond_max_features"]` counts them in
        `learn_one`. Memory is at most about 300 bytes per name (three float64/int64 columns,
        the name of up to 128 characters and its dict entry): ~20 MB at the default 2**16,
        plus 16 bytes per name of the last record the compiled path took (its names' tuple
        and their int64 columns, kept to skip the lookups while records repeat their names).

    Attributes
    ----------
    counters
        How often each bound acted in `learn_one`: `beyond_max_features` (a value of a name
        beyond `max_features`), `unsavable_names` (a name longer than 128 characters or of
        another type than str, bool, int, finite float, None or a tuple of up to 8 of these:
        passed through unscaled), `overflow_skipped` (a value whose update would have made
        its feature's statistics non-finite: its statistics were left as they were).

    Examples
    --------

    >>> import random
    >>> from streammargin import StandardScaler

    >>> random.seed(42)
    >>> X = [{'x': random.uniform(8, 12), 'y': random.uniform(8, 12)} for _ in range(6)]
    >>> scaler = StandardScaler()
    >>> for x in X:
    ...     scaler.learn_one(x)
    ...     print({name: round(value, 3) for name, value in scaler.transform_one(x).items()})
    {'x': 0.0, 'y': 0.0}
    {'x': -1.0, 'y': 1.0}
    {'x': 0.937, 'y': 1.351}
    {'x': 1.13, 'y': -0.651}
    {'x': -0.777, 'y': -0.729}
    {'x': -1.275, 'y': 0.992}

    The same figures as River's, to the last bit:

    >>> from river import preprocessing
    >>> rivers, ours = preprocessing.StandardScaler(), StandardScaler()
    >>> for x in X:
    ...     rivers.learn_one(x)
    ...     ours.learn_one(x)
    ...     assert ours.transform_one(x) == rivers.transform_one(x)

    Beyond `max_features` names, values pass through unscaled:

    >>> scaler = StandardScaler(max_features=1)
    >>> scaler.learn_one({'a': 1.0, 'b': 5.0})
    >>> scaler.learn_one({'a': 3.0, 'b': 7.0})
    >>> scaler.transform_one({'a': 3.0, 'b': 7.0})
    {'a': 1.0, 'b': 7.0}
    >>> scaler.counters
    {'beyond_max_features': 2, 'unsavable_names': 0, 'overflow_skipped': 0}

    """

    def __init__(self, max_features: int = 1 << 16):
        if type(max_features) is not int or not 1 <= max_features <= MAX_FEATURES_LIMIT:
            raise ValueError(
                f"max_features must be an int in [1, {MAX_FEATURES_LIMIT}], got {max_features!r}"
            )
        self.max_features = max_features
        self._columns: dict[typing.Hashable, int] = {}
        self._counts = np.zeros(0, dtype=np.int64)
        self._means = np.zeros(0, dtype=np.float64)
        self._vars = np.zeros(0, dtype=np.float64)
        self.counters = dict.fromkeys(_COUNTERS, 0)
        # (names, their columns) of the last record whose names all have columns
        self._record: tuple | None = None

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        # (River's checker shuffles feature order, which decides which names are beyond a small
        # bound: the bound has its own tests.)
        yield {}

    # Learning and scaling --------------------------------------------------------------------

    def _new_column(self, name: typing.Hashable) -> int | None:
        """A column for a new name, or None (counted) when the name may not have one."""
        if len(self._columns) >= self.max_features:
            self.counters["beyond_max_features"] += 1
            return None
        if not _name_ok(name):
            self.counters["unsavable_names"] += 1
            return None
        column = len(self._columns)
        if column == self._counts.shape[0]:
            capacity = min(max(2 * column, _MIN_CAPACITY), self.max_features)
            self._counts = np.concatenate([self._counts, np.zeros(capacity - column, np.int64)])
            self._means = np.concatenate([self._means, np.zeros(capacity - column)])
            self._vars = np.concatenate([self._vars, np.zeros(capacity - column)])
        self._columns[name] = column
        return column

    def learn_one(self, x: dict) -> None:
        # Every value is checked before any statistic changes.
        values = [
            xi if type(xi) is float and xi - xi == 0.0 else validate_value(name, xi)
            for name, xi in x.items()
        ]
        columns = self._columns
        counts, means, vars_ = self._counts, self._means, self._vars
        for name, xi in zip(x, values):
            column = columns.get(name)
            if column is None:
                column = self._new_column(name)
                if column is None:
                    continue
                counts, means, vars_ = self._counts, self._means, self._vars
            updated = _welford(counts.item(column), means.item(column), vars_.item(column), xi)
            if updated is None:  # an overflow (or NaN) would poison this feature for ever
                self.counters["overflow_skipped"] += 1
            else:
                counts[column], means[column], vars_[column] = updated

    def _known_record(self, x: dict) -> tuple | None:
        """`(names, columns, packed values)` of `x` when every name has a column and every value
        is a float, an int or a bool that packs into a float64; else None (the Python path)."""
        names = tuple(x)
        record = self._record
        if record is None or record[0] != names:
            get = self._columns.get
            columns = [get(name) for name in names]
            if not columns or None in columns:
                return None
            record = self._record = (names, np.array(columns, dtype=np.int64))
        values = x.values()
        if not _PLAIN_VALUES.issuperset(map(type, values)):
            return None
        try:
            packed = _packer(len(names)).pack(*values)
        except (struct.error, OverflowError):  # an int beyond float64
            return None
        return names, record[1], packed

    def _scaled(self, x: dict) -> tuple | None:
        """`(names, columns, work, overflow)` of `scaler_jit.scale_record` on `x`, or None when
        `x` takes the Python path (a new name, a value of another type or not finite)."""
        known = self._known_record(x)
        if known is None:
            return None
        names, columns, packed = known
        work = np.empty((scaler_jit.ROWS, len(names)))
        overflow = _compiled_functions()[0](
            self._counts, self._means, self._vars, columns, packed, work, 0.5
        )
        if overflow < 0:
            return None
        return names, columns, work, overflow

    def _scaled_in_c(self, x: dict) -> tuple | None:
        """records.c's `(before, after, (columns, update, overflow))` of `x` when its names are
        the last known record's, in its order (`_native_scaler`); else None."""
        native, record = _native_scaler(), self._record
        if native is None or record is None:
            return None
        found = native.scale_known(x, *record, self._counts, self._means, self._vars, 0.5)
        if found is None:
            return None
        before, after, update, overflow = found
        return before, after, (record[1], update, overflow)

    def transform_one(self, x: dict) -> dict:
        found = self._scaled_in_c(x)
        if found is not None:
            return found[0]
        scaled = self._scaled(x)
        if scaled is not None:
            return dict(zip(scaled[0], scaled[2][scaler_jit.BEFORE].tolist()))
        columns = self._columns
        means, vars_ = self._means, self._vars
        full = len(columns) >= self.max_features
        result = {}
        for name, xi in x.items():
            value = xi if type(xi) is float and xi - xi == 0.0 else validate_value(name, xi)
            column = columns.get(name)
            if column is None:
                # River gives 0.0 for a name it has not learnt (no variance); a name that will
                # never have a column passes through unscaled.
                result[name] = xi if full or not _name_ok(name) else 0.0
                continue
            var = vars_.item(column)
            result[name] = (value - means.item(column)) / var**0.5 if var else 0.0
        return result

    def transform_learn_one(self, x: dict) -> tuple[dict, dict, tuple]:
        """`transform_one(x)`, and `transform_one(x)` as it will be after `learn_one(x)`, in
        one pass over `x`, changing nothing; `apply_learn(update)` with the returned `update`
        then does exactly what `learn_one(x)` does.

        A record whose names all have columns and whose values are floats, ints or bools takes
        a compiled path (records.c's or `streammargin.jit.scaler`'s: the same operations, one
        call per record); any other takes the Python one.

        River's pipeline scales a labelled record twice: for the prediction with the statistics
        before the record, for learning with those after it. This gives both to the last bit
        (`tests/test_scaler.py`) at about half the cost of `transform_one`, `learn_one`,
        `transform_one`, and leaves learning to the caller, once the prediction succeeded.
        `InvalidInput` (a value that is not a finite real number) before anything changes.
        """
        found = self._scaled_in_c(x)
        if found is not None:
            return found
        scaled = self._scaled(x)
        if scaled is not None:
            names, columns, work, overflow = scaled
            before, after = work[:2].tolist()  # (rows BEFORE and AFTER)
            return dict(zip(names, before)), dict(zip(names, after)), (columns, work, overflow)
        columns = self._columns
        means, vars_ = self._means, self._vars
        counts = self._counts
        max_features = self.max_features
        n_columns = len(columns)
        full = n_columns >= max_features
        before: dict = {}
        after: dict = {}
        updates = []  # (column, count, mean, var) of known names whose statistics change
        new_names = []  # names that get a column, in order
        overflow = beyond = unsavable = 0
        for name, xi in x.items():
            value = xi if type(xi) is float and xi - xi == 0.0 else validate_value(name, xi)
            column = columns.get(name)
            if column is None:
                # As `_new_column` decides in `learn_one`: the bound first, then the name.
                if n_columns + len(new_names) >= max_features:
                    beyond += 1
                    name_ok = _name_ok(name)
                elif not _name_ok(name):
                    unsavable += 1
                    name_ok = False
                else:
                    new_names.append((name, value))
                    before[name] = xi if full else 0.0
                    after[name] = 0.0  # one observation: no variance yet
                    continue
                before[name] = xi if full or not name_ok else 0.0
                after[name] = xi  # never gets a column: passes through unscaled
                continue
            old_mean = means.item(column)
            old_var = vars_.item(column)
            before[name] = (value - old_mean) / old_var**0.5 if old_var else 0.0
            updated = _welford(counts.item(column), old_mean, old_var, value)
            if updated is None:
                overflow += 1
                after[name] = before[name]
            else:
                _, mean, var = updated
                updates.append((column, *updated))
                after[name] = (value - mean) / var**0.5 if var else 0.0
        return before, after, (updates, new_names, overflow, beyond, unsavable)

    def apply_learn(self, update: tuple) -> None:
        """Learn the record whose `update` `transform_learn_one` returned (see there); call it
        once, before anything else changes the scaler."""
        if len(update) == 3:  # from the compiled path
            columns, work, overflow = update
            if type(work) is bytes:  # from the C one
                _native.apply_scaled(columns, self._counts, self._means, self._vars, work)
            else:
                _compiled_functions()[1](self._counts, self._means, self._vars, columns, work)
            if overflow:
                self.counters["overflow_skipped"] += overflow
            return
        updates, new_names, overflow, beyond, unsavable = update
        counts, means, vars_ = self._counts, self._means, self._vars
        for column, count, mean, var in updates:
            counts[column] = count
            means[column] = mean
            vars_[column] = var
        for name, xi in new_names:
            column = self._new_column(name)
            if column is None:  # cannot happen after transform_learn_one on this state
                raise RuntimeError(f"apply_learn: no column for {name!r:.60}: the scaler "
                                   "changed since transform_learn_one")
            counts, means, vars_ = self._counts, self._means, self._vars
            updated = _welford(counts.item(column), means.item(column), vars_.item(column), xi)
            if updated is None:  # as in learn_one (a first finite value never gets here)
                overflow += 1
            else:
                counts[column], means[column], vars_[column] = updated
        counters = self.counters
        if overflow:
            counters["overflow_skipped"] += overflow
        if beyond:
            counters["beyond_max_features"] += beyond
        if unsavable:
            counters["unsavable_names"] += unsavable

    # Statistics by name (River's StandardScaler attributes) ------------------------------------

    @property
    def counts(self) -> dict:
        return {name: self._counts.item(j) for name, j in self._columns.items()}

    @property
    def means(self) -> dict:
        return {name: self._means.item(j) for name, j in self._columns.items()}

    @property
    def vars(self) -> dict:
        return {name: self._vars.item(j) for name, j in self._columns.items()}

    # Safe state ------------------------------------------------------------------------------

    def to_state(self) -> dict:
        """JSON values and numpy arrays (`streammargin.state.dumps` takes them)."""
        n = len(self._columns)
        return {
            "scaler": "StandardScaler",
            "max_features": self.max_features,
            "names": [encode_name(name) for name in self._columns],
            "counts": self._counts[:n].copy(),
            "means": self._means[:n].copy(),
            "vars": self._vars[:n].copy(),
            "counters": dict(self.counters),
        }

    @classmethod
    def from_state(cls, data: typing.Any) -> StandardScaler:
        """The scaler saved by `to_state`; `StateError` (a `ValueError`) for anything malformed.

        Sizes are checked before anything is built; counts must be whole numbers >= 0, means
        finite, variances finite and >= 0, a feature without observations all zeros, names
        distinct and within the bounds of `learn_one`.
        """
        keys = {"scaler", "max_features", "names", "counts", "means", "vars", "counters"}
        if type(data) is not dict or set(data) != keys or type(data["scaler"]) is not str or (
            data["scaler"] != "StandardScaler"
        ):
            raise StateError(f"not a StandardScaler state: expected the fields {sorted(keys)}")
        max_features = data["max_features"]
        if type(max_features) is not int or not 1 <= max_features <= MAX_FEATURES_LIMIT:
            raise StateError(
                f"scaler state: max_features must be an int in [1, {MAX_FEATURES_LIMIT}]"
            )
        names = data["names"]
        if type(names) is not list or len(names) > max_features:
            raise StateError(f"scaler state: names must be a list of at most {max_features}")
        n = len(names)
        arrays = {}
        for key, dtype in (("counts", np.int64), ("means", np.float64), ("vars", np.float64)):
            array = data[key]
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.shape != (n,):
                raise StateError(f"scaler state: {key} must be {n} {np.dtype(dtype).name} values")
            arrays[key] = array
        counts, means, vars_ = arrays["counts"], arrays["means"], arrays["vars"]
        if n and (
            counts.min() < 0
            or not (np.isfinite(means).all() and np.isfinite(vars_).all())
            or vars_.min() < 0.0
        ):
            raise StateError("scaler state: counts must be >= 0, means finite, variances >= 0")
        if ((counts == 0) & ((means != 0.0) | (vars_ != 0.0))).any():
            raise StateError("scaler state: a feature without observations has statistics")
        counters = data["counters"]
        if (
            type(counters) is not dict
            or set(counters) != set(_COUNTERS)
            or any(type(v) is not int or not 0 <= v < 2**63 for v in counters.values())
        ):
            raise StateError(f"scaler state: counters must be {list(_COUNTERS)}, ints >= 0")
        decoded = [_decode_name(name) for name in names]
        columns = dict(zip(decoded, range(n)))
        if len(columns) != n:
            raise StateError("scaler state: a feature name appears twice")
        scaler = cls(max_features=max_features)
        scaler._columns = columns
        scaler._counts = counts.astype(np.int64, copy=True)
        scaler._means = means.astype(np.float64, copy=True)
        scaler._vars = vars_.astype(np.float64, copy=True)
        scaler.counters = {key: counters[key] for key in _COUNTERS}
        return scaler
