"""Explicit, validated state of the River drift detectors a checkpoint may hold.

A checkpoint is untrusted input: anyone who can write to the checkpoint topic writes it. So the
River objects of a task are not saved as an object graph (classes by name, attributes, method
references: the codec this module replaces could be made to call `PosixPath(victim).unlink`).
Each detector the worker offers has an explicit schema instead:

    {"class": "ADWIN", "params": {...}, "state": {...}}

- `class` is one name of the closed list `DETECTORS` (nothing is imported or looked up by name);
- `params` are the constructor's parameters, each checked for type and range (bools are not
  numbers; NaN and infinities are refused) together with the constraints between them, and the
  detector is rebuilt by calling its constructor with them (so derived attributes, such as
  PageHinkley's `_test_drift` method chosen by `mode` or FHDDM's epsilons, come from River's own
  code, never from the state);
- `state` holds the learnt fields by name, each checked for type, range and length, and for
  consistency with the other fields (counts against lengths, window contents against window
  sizes, ...), then assigned to the attribute names River uses. Nested statistics (`stats.Mean`,
  `stats.Var`, `stats.EWMean`, HDDM_W's `SampleInfo`, KSWIN's `random.Random`) have sub-schemas.

Sizes are checked before anything is allocated, and every malformed state raises `StateError`
(a `ValueError`) and nothing else. `detector_to_state` runs the same checks on the state it
returns, so a saved state always restores.

ADWIN and EWMean keep their statistics in Rust objects whose `__getstate__` is bincode bytes of
the Rust struct. Bytes read from a checkpoint never reach Rust: `parse_adwin_bytes` turns the
object's own bytes into named fields for the checkpoint, and on restore `encode_adwin_bytes`
writes bytes from validated fields, so that nothing the Rust code indexes, shifts, divides by or
loops over can be out of its range (a Rust panic would surface as pyo3's `PanicException`, a
`BaseException`).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math
import random
import struct
import typing

import numpy as np

from connectors.lazy_imports import defer

# River's drift package imports its data sets (River's datasets and streams, SciPy's io,
# scikit-learn when installed) and KSWIN's module SciPy's stats: ~1 s and 60-90 MiB of every
# worker's start for nothing it uses until a KSWIN detector tests (connectors/lazy_imports.py).
defer("river.drift.datasets")
defer("scipy.stats")

from river import drift  # noqa: E402
from river.drift import binary  # noqa: E402

from streammargin.errors import StateError

__all__ = [
    "DETECTORS",
    "detector_to_state",
    "detector_from_state",
    "check_detector_params",
    "parse_adwin_bytes",
    "encode_adwin_bytes",
]

# Bounds. Window-like sizes bound the memory of a restored detector; counts kept as floats by
# River must stay whole numbers, which they are up to 2**53.
MAX_WINDOW = 1 << 20
MAX_FLOAT_COUNT = 2.0**53
# The values a restored general detector (ADWIN, KSWIN, PageHinkley) has seen are within
# +-VALUE_BOUND, and its float parameters too, so that its sums and squares stay finite for any
# number of further values of that size (the worker gives 0 or 1).
VALUE_BOUND = 1e100
_SUM_BOUND = 1e150
_MAX_INT = 2**63 - 1
_I32 = (-(2**31), 2**31 - 1)
_MAX_SEED = 2**64


# Validation helpers ---------------------------------------------------------------------------


def _show(value: typing.Any) -> str:
    """A short description of an untrusted value (no repr of nested or huge data)."""
    if type(value) is int and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    if value is None or type(value) in (bool, int, float):
        return repr(value)
    if type(value) is str:
        return repr(value[:40])
    return f"a {type(value).__name__}"


def _fail(where: str, message: str) -> typing.NoReturn:
    raise StateError(f"{where}: {message}")


def _mapping(value: typing.Any, where: str, keys: typing.Iterable[str]) -> dict:
    """`value` as a dict with exactly `keys`."""
    keys = set(keys)
    if type(value) is not dict:
        _fail(where, f"must be an object with fields {sorted(keys)}, not {type(value).__name__}")
    if set(value) != keys:
        missing, extra = sorted(keys - set(value)), sorted(map(str, set(value) - keys))
        _fail(where, f"fields differ: missing {missing}, unexpected {extra}")
    return value


def _int(value: typing.Any, where: str, lo: int, hi: int) -> int:
    if type(value) is not int:
        _fail(where, f"must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        _fail(where, f"must be in [{lo}, {hi}], got {_show(value)}")
    return value


def _float(value: typing.Any, where: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite real number in [lo, hi] (ints accepted, bools not), as a float."""
    if type(value) not in (float, int):
        _fail(where, f"must be a number, got {type(value).__name__}")
    if type(value) is float and not math.isfinite(value):
        _fail(where, f"must be finite, got {value}")
    if not lo <= value <= hi:  # exact for ints of any size, before converting them
        _fail(where, f"must be in [{lo}, {hi}], got {_show(value)}")
    value = float(value)
    if not math.isfinite(value):
        _fail(where, f"must be finite, got {value}")
    return value


def _count(value: typing.Any, where: str, hi: float = MAX_FLOAT_COUNT) -> float:
    """A whole number kept as a float by River (`stats.Mean.n`)."""
    value = _float(value, where, 0.0, hi)
    if value != math.floor(value):
        _fail(where, f"must be a whole number, got {value}")
    return value


def _bool(value: typing.Any, where: str) -> bool:
    if type(value) is not bool:
        _fail(where, f"must be true or false, got {type(value).__name__}")
    return value


def _float_array(
    value: typing.Any, where: str, max_len: int, lo: float = -math.inf, hi: float = math.inf
) -> np.ndarray:
    """A 1-d float64 array of at most `max_len` finite values in [lo, hi]."""
    if not isinstance(value, np.ndarray) or value.dtype != np.float64 or value.ndim != 1:
        _fail(where, "must be a 1-d float64 array")
    if value.shape[0] > max_len:
        _fail(where, f"has {value.shape[0]} values, at most {max_len} allowed")
    if value.size and not (np.isfinite(value).all() and value.min() >= lo and value.max() <= hi):
        _fail(where, f"values must be finite and in [{lo}, {hi}]")
    return value


def _as_float_array(values: typing.Iterable) -> np.ndarray:
    return np.array([float(v) for v in values], dtype=np.float64)


# Parameters -----------------------------------------------------------------------------------
# One checker per constructor parameter: (value, where) -> validated value.


def _p_int(lo: int, hi: int) -> typing.Callable:
    return lambda value, where: _int(value, where, lo, hi)


def _p_float(lo: float, hi: float, open_lo: bool = False) -> typing.Callable:
    def check(value: typing.Any, where: str) -> float:
        value = _float(value, where, lo, hi)
        if open_lo and value == lo:
            _fail(where, f"must be > {lo}")
        return value

    return check


def _p_bool(value: typing.Any, where: str) -> bool:
    return _bool(value, where)


def _p_optional(check: typing.Callable) -> typing.Callable:
    return lambda value, where: None if value is None else check(value, where)


_FINITE = _p_float(-VALUE_BOUND, VALUE_BOUND)
_CONFIDENCE = _p_float(0.0, 1.0, open_lo=True)


# Nested statistics ----------------------------------------------------------------------------


def _mean_to_state(mean: typing.Any) -> dict:
    return {"n": mean.n, "mean": mean._mean}


def _mean_from_state(data: typing.Any, where: str, lo: float, hi: float) -> typing.Any:
    """A `stats.Mean` of unit weights: n a whole number, the mean in [lo, hi] (0 when n is 0)."""
    from river import stats

    data = _mapping(data, where, ("n", "mean"))
    n = _count(data["n"], f"{where}.n")
    value = _float(data["mean"], f"{where}.mean", lo, hi)
    if n == 0 and value != 0.0:
        _fail(where, "an empty mean must be 0")
    mean = stats.Mean()
    mean.n, mean._mean = n, value
    return mean


def _var_to_state(var: typing.Any) -> dict:
    return {"mean": _mean_to_state(var.mean), "S": var._S}


def _var_from_state(data: typing.Any, where: str, lo: float, hi: float) -> typing.Any:
    """A `stats.Var(ddof=1)`: its mean, and the sum of squared deviations S >= 0."""
    from river import stats

    data = _mapping(data, where, ("mean", "S"))
    mean = _mean_from_state(data["mean"], f"{where}.mean", lo, hi)
    s = _float(data["S"], f"{where}.S", 0.0, 1e300)
    if mean.n < 2 and s != 0.0:
        _fail(where, "S must be 0 below two observations")
    var = stats.Var(ddof=1)
    var.mean, var._S = mean, s
    return var


# Rust statistics: bincode layouts (little endian, fixed-size integers, u64 lengths) of River
# 0.26.1's pyo3 classes, checked against the bytes of the installed version by the tests.

_EWMEAN = struct.Struct("<ddd?d")  # mean, alpha, one_minus_alpha, initialized | wrapper's alpha


def _ewmean_to_state(ewmean: typing.Any) -> dict:
    raw = ewmean._ewmean.__getstate__()
    if len(raw) != _EWMEAN.size:
        raise StateError(f"unexpected EWMean bytes of length {len(raw)} (River version?)")
    mean, _, _, initialized, _ = _EWMEAN.unpack(raw)
    return {"mean": mean, "initialized": initialized}


def _ewmean_from_state(data: typing.Any, where: str, fading_factor: float) -> typing.Any:
    """A `stats.EWMean` of binary values: its mean in [0, 1], 0 until initialised."""
    from river import stats

    data = _mapping(data, where, ("mean", "initialized"))
    value = _float(data["mean"], f"{where}.mean", 0.0, 1.0)
    initialized = _bool(data["initialized"], f"{where}.initialized")
    if not initialized and value != 0.0:
        _fail(where, "an uninitialised mean must be 0")
    ewmean = stats.EWMean(fading_factor)
    # The constructor's own bytes give alpha and 1 - alpha exactly as Rust computes them; only the
    # two learnt fields are replaced.
    _, alpha, one_minus_alpha, _, wrapper_alpha = _EWMEAN.unpack(ewmean._ewmean.__getstate__())
    ewmean._ewmean.__setstate__(
        _EWMEAN.pack(value, alpha, one_minus_alpha, initialized, wrapper_alpha)
    )
    return ewmean


_ADWIN_HEAD = struct.Struct("<diQddddddiiiiQ")
_ADWIN_BUCKET_HEAD = struct.Struct("<QQQ")
_ADWIN_TAIL = struct.Struct("<diQii")  # the pyo3 wrapper's constructor arguments
_U64 = struct.Struct("<Q")
MAX_ADWIN_BUCKETS = 1024
MAX_ADWIN_LEVELS = 63  # levels 0..62: the Rust code computes 1u64 << level


def parse_adwin_bytes(raw: bytes) -> dict:
    """Named fields of the bytes of River's Rust `AdaptiveWindowing` (its `__getstate__`).

    Only the live object's own bytes are parsed (when saving); restoring encodes new bytes from
    validated fields with `encode_adwin_bytes`. Raises `StateError` if the bytes do not have the
    layout of River 0.26.1.
    """
    try:
        (delta, clock, max_buckets, min_window_length, grace_period, total, variance, width,
         total_width, n_buckets, max_n_buckets, tick, n_detections, n_levels) = (
            _ADWIN_HEAD.unpack_from(raw, 0)
        )
        pos = _ADWIN_HEAD.size
        if n_levels > MAX_ADWIN_LEVELS or max_buckets > MAX_ADWIN_BUCKETS:
            raise StateError(f"ADWIN bytes hold {n_levels} levels of {max_buckets} buckets")
        sizes, totals, variances = [], [], []
        for _ in range(n_levels):
            max_size, current_idx, n_totals = _ADWIN_BUCKET_HEAD.unpack_from(raw, pos)
            pos += _ADWIN_BUCKET_HEAD.size
            if max_size != max_buckets or n_totals != max_buckets + 1 or current_idx > max_size:
                raise StateError("ADWIN bucket sizes do not match max_buckets")
            level_totals = struct.unpack_from(f"<{n_totals}d", raw, pos)
            pos += 8 * n_totals
            (n_variances,) = _U64.unpack_from(raw, pos)
            pos += 8
            if n_variances != n_totals:
                raise StateError("ADWIN bucket vectors differ in length")
            level_variances = struct.unpack_from(f"<{n_variances}d", raw, pos)
            pos += 8 * n_variances
            if any(level_totals[current_idx:]) or any(level_variances[current_idx:]):
                raise StateError("ADWIN bucket has values past its current index")
            sizes.append(current_idx)
            totals.extend(level_totals[:current_idx])
            variances.extend(level_variances[:current_idx])
        tail = _ADWIN_TAIL.unpack_from(raw, pos)
        pos += _ADWIN_TAIL.size
    except struct.error as error:
        raise StateError(f"ADWIN bytes are truncated: {error}") from None
    if pos != len(raw):
        raise StateError(f"ADWIN bytes have {len(raw) - pos} bytes past the layout")
    params = {
        "delta": delta, "clock": clock, "max_buckets": max_buckets,
        "min_window_length": int(min_window_length), "grace_period": int(grace_period),
    }
    if tail != tuple(params.values()) or params["min_window_length"] != min_window_length or (
        params["grace_period"] != grace_period
    ):
        raise StateError("ADWIN bytes: the wrapper's parameters differ from the window's")
    return {
        "params": params,
        "total": total,
        "variance": variance,
        "width": width,
        "total_width": total_width,
        "n_buckets": n_buckets,
        "max_n_buckets": max_n_buckets,
        "tick": tick,
        "n_detections": n_detections,
        "bucket_sizes": np.array(sizes, dtype=np.int64),
        "bucket_totals": np.array(totals, dtype=np.float64),
        "bucket_variances": np.array(variances, dtype=np.float64),
    }


def encode_adwin_bytes(fields: dict) -> bytes:
    """Bytes for `AdaptiveWindowing.__setstate__` from fields checked by `_check_adwin`."""
    params = fields["params"]
    max_buckets = params["max_buckets"]
    sizes = [int(n) for n in fields["bucket_sizes"]]
    parts = [
        _ADWIN_HEAD.pack(
            params["delta"], params["clock"], max_buckets, float(params["min_window_length"]),
            float(params["grace_period"]), fields["total"], fields["variance"], fields["width"],
            fields["total_width"], fields["n_buckets"], fields["max_n_buckets"], fields["tick"],
            fields["n_detections"], len(sizes),
        )
    ]
    totals, variances = fields["bucket_totals"], fields["bucket_variances"]
    start = 0
    padding = [0.0] * (max_buckets + 1)
    for n in sizes:
        stop = start + n
        slot_totals = [float(v) for v in totals[start:stop]] + padding[n:]
        slot_variances = [float(v) for v in variances[start:stop]] + padding[n:]
        parts.append(_ADWIN_BUCKET_HEAD.pack(max_buckets, n, max_buckets + 1))
        parts.append(struct.pack(f"<{max_buckets + 1}d", *slot_totals))
        parts.append(_U64.pack(max_buckets + 1))
        parts.append(struct.pack(f"<{max_buckets + 1}d", *slot_variances))
        start = stop
    parts.append(
        _ADWIN_TAIL.pack(
            params["delta"], params["clock"], max_buckets, params["min_window_length"],
            params["grace_period"],
        )
    )
    return b"".join(parts)


_ADWIN_FIELDS = (
    "total", "variance", "width", "total_width", "n_buckets", "max_n_buckets", "tick",
    "n_detections", "bucket_sizes", "bucket_totals", "bucket_variances",
)


def _check_adwin(data: typing.Any, where: str, params: dict) -> dict:
    """Validated ADWIN window fields: everything the Rust code indexes, shifts or loops over.

    The window is a list of bucket levels 0..L-1 (L <= 63; level i holds entries of 2**i points),
    each with at most `max_buckets` entries (one more would overflow its vector on the next
    insert). The last level is non-empty (the Rust code removes from it, and pops it once empty),
    and so is every level with `max_buckets >= 2`; only the fresh window is one empty level 0.
    `width` is exactly the number of points the entries hold.
    """
    data = _mapping(data, where, _ADWIN_FIELDS)
    max_buckets = params["max_buckets"]
    sizes = data["bucket_sizes"]
    if not isinstance(sizes, np.ndarray) or sizes.dtype != np.int64 or sizes.ndim != 1:
        _fail(f"{where}.bucket_sizes", "must be a 1-d int64 array")
    if not 1 <= sizes.shape[0] <= MAX_ADWIN_LEVELS:
        _fail(f"{where}.bucket_sizes", f"must have 1 to {MAX_ADWIN_LEVELS} levels")
    if sizes.min() < 0 or sizes.max() > max_buckets:
        _fail(f"{where}.bucket_sizes", f"entries per level must be in [0, {max_buckets}]")
    n_entries = int(sizes.sum())
    totals = _float_array(data["bucket_totals"], f"{where}.bucket_totals", n_entries)
    variances = _float_array(data["bucket_variances"], f"{where}.bucket_variances", n_entries, 0.0)
    if totals.shape[0] != n_entries or variances.shape[0] != n_entries:
        _fail(where, "bucket totals and variances must have one value per entry")
    levels = [int(n) for n in sizes]
    if n_entries == 0:
        if len(levels) != 1:
            _fail(where, "an empty window has a single empty level")
    elif levels[-1] == 0 or (max_buckets >= 2 and 0 in levels):
        _fail(where, "a bucket level is empty")
    points = sum(n << level for level, n in enumerate(levels))
    width = _float(data["width"], f"{where}.width", 0.0, MAX_FLOAT_COUNT)
    if width != points:
        _fail(where, f"width {width} differs from the {points} points in the buckets")
    # Entries of level i sum 2**i values within +-VALUE_BOUND; their variances (sums of squared
    # deviations) are at most 2**i (2 VALUE_BOUND)**2.
    scale = np.repeat(np.ldexp(1.0, np.arange(len(levels))), sizes)
    if (np.abs(totals) > scale * VALUE_BOUND).any() or (
        variances > scale * (2 * VALUE_BOUND) ** 2
    ).any():
        _fail(where, f"bucket statistics beyond those of values within +-{VALUE_BOUND}")
    span = max(width, 1.0)
    fields = {
        "params": params,
        "total": _float(data["total"], f"{where}.total", -span * VALUE_BOUND, span * VALUE_BOUND),
        "variance": _float(
            data["variance"], f"{where}.variance",
            -span * (2 * VALUE_BOUND) ** 2, span * (2 * VALUE_BOUND) ** 2,
        ),
        "width": width,
        "total_width": _float(data["total_width"], f"{where}.total_width", 0.0),
        # Counters the Rust code only increments (wrapping, never panicking) or compares.
        "n_buckets": _int(data["n_buckets"], f"{where}.n_buckets", *_I32),
        "max_n_buckets": _int(data["max_n_buckets"], f"{where}.max_n_buckets", *_I32),
        "tick": _int(data["tick"], f"{where}.tick", *_I32),
        "n_detections": _int(data["n_detections"], f"{where}.n_detections", 0, _I32[1]),
        "bucket_sizes": sizes,
        "bucket_totals": totals,
        "bucket_variances": variances,
    }
    return fields


# Detector schemas -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Schema:
    cls: type
    params: dict[str, typing.Callable]
    save: typing.Callable[[typing.Any], dict]
    load: typing.Callable[[typing.Any, dict, str], None]
    check_params: typing.Callable[[dict, str], None] = lambda params, where: None
    warning: bool = False  # has a `_warning_detected` flag


# ADWIN


def _adwin_params(params: dict, where: str) -> None:
    if params["max_buckets"] < 2:
        # River's own ADWIN panics with one bucket per level (an emptied middle level becomes
        # the last one and is removed from).
        _fail(f"{where}.max_buckets", "must be >= 2 (River's ADWIN fails with 1)")


def _adwin_save(detector: typing.Any) -> dict:
    window = parse_adwin_bytes(detector._helper.__getstate__())
    if window.pop("params") != {name: getattr(detector, name) for name in _SCHEMAS["ADWIN"].params}:
        raise StateError("ADWIN's window was built with other parameters than the detector's")
    return {"drift_detected": detector._drift_detected, "window": window}


def _adwin_load(detector: typing.Any, data: dict, where: str) -> None:
    data = _mapping(data, where, ("drift_detected", "window"))
    params = {name: getattr(detector, name) for name in _SCHEMAS["ADWIN"].params}
    fields = _check_adwin(data["window"], f"{where}.window", params)
    detector._drift_detected = _bool(data["drift_detected"], f"{where}.drift_detected")
    detector._helper.__setstate__(encode_adwin_bytes(fields))


# KSWIN


def _kswin_params(params: dict, where: str) -> None:
    if 2 * params["stat_size"] > params["window_size"]:
        # `random.sample(range(window_size - stat_size), stat_size)` needs this.
        _fail(where, "window_size must be at least twice stat_size")


_MT_WORDS = 624


def _random_to_state(rng: random.Random) -> dict:
    version, internal, gauss_next = rng.getstate()
    return {
        "version": version,
        "words": np.array(internal[:_MT_WORDS], dtype=np.int64),
        "index": internal[_MT_WORDS],
        "gauss_next": gauss_next,
    }


def _random_from_state(data: typing.Any, where: str) -> random.Random:
    """A Mersenne Twister state: version 3, 624 32-bit words, an index in [0, 624]."""
    data = _mapping(data, where, ("version", "words", "index", "gauss_next"))
    if type(data["version"]) is not int or data["version"] != 3:
        _fail(f"{where}.version", "must be 3")
    words = data["words"]
    if not isinstance(words, np.ndarray) or words.dtype != np.int64 or words.shape != (_MT_WORDS,):
        _fail(f"{where}.words", f"must be {_MT_WORDS} int64 values")
    if words.min() < 0 or words.max() > 0xFFFFFFFF:
        _fail(f"{where}.words", "must be 32-bit unsigned values")
    # The all-zero state (as the generator sees it: the top bit of the first word and the other
    # words) would return 0 for ever, and random.sample would then loop for ever.
    if not (int(words[0]) & 0x80000000 or words[1:].any()):
        _fail(f"{where}.words", "the all-zero generator state is degenerate")
    index = _int(data["index"], f"{where}.index", 0, _MT_WORDS)
    gauss_next = data["gauss_next"]
    if gauss_next is not None:
        gauss_next = _float(gauss_next, f"{where}.gauss_next")
    rng = random.Random()
    rng.setstate((3, tuple(int(w) for w in words) + (index,), gauss_next))
    return rng


def _kswin_save(detector: typing.Any) -> dict:
    return {
        "drift_detected": detector._drift_detected,
        "p_value": float(detector.p_value),
        "n": detector.n,
        "window": _as_float_array(detector.window),
        "rng": _random_to_state(detector._rng),
    }


def _kswin_load(detector: typing.Any, data: dict, where: str) -> None:
    data = _mapping(data, where, ("drift_detected", "p_value", "n", "window", "rng"))
    window = _float_array(
        data["window"], f"{where}.window", detector.window_size, -VALUE_BOUND, VALUE_BOUND
    )
    n = _int(data["n"], f"{where}.n", 0, _MAX_INT)
    if window.shape[0] > n:
        _fail(where, f"the window holds {window.shape[0]} values but only {n} were seen")
    detector._drift_detected = _bool(data["drift_detected"], f"{where}.drift_detected")
    detector.p_value = _float(data["p_value"], f"{where}.p_value", 0.0, 1.0)
    detector.n = n
    detector.window = collections.deque(window.tolist(), maxlen=detector.window_size)
    detector._rng = _random_from_state(data["rng"], f"{where}.rng")


# PageHinkley


def _page_hinkley_save(detector: typing.Any) -> dict:
    empty = detector._x_mean.n == 0
    return {
        "drift_detected": detector._drift_detected,
        "x_mean": _mean_to_state(detector._x_mean),
        "sum_increase": detector._sum_increase,
        "sum_decrease": detector._sum_decrease,
        # inf and -1 until the first value (JSON has no infinity).
        "min_increase": None if empty else detector._min_increase,
        "max_decrease": None if empty else detector._max_decrease,
    }


def _page_hinkley_load(detector: typing.Any, data: dict, where: str) -> None:
    data = _mapping(data, where, (
        "drift_detected", "x_mean", "sum_increase", "sum_decrease", "min_increase", "max_decrease"
    ))
    x_mean = _mean_from_state(data["x_mean"], f"{where}.x_mean", -VALUE_BOUND, VALUE_BOUND)
    # Each value moves a sum by at most 2 VALUE_BOUND + |delta|: from _SUM_BOUND, 2**53 more
    # values cannot overflow.
    sums = {
        name: _float(data[name], f"{where}.{name}", -_SUM_BOUND, _SUM_BOUND)
        for name in ("sum_increase", "sum_decrease")
    }
    extremes = {name: data[name] for name in ("min_increase", "max_decrease")}
    if x_mean.n == 0:
        if any(e is not None for e in extremes.values()) or any(sums.values()):
            _fail(where, "before the first value the sums are 0 and the extremes null")
        min_increase, max_decrease = math.inf, -1
    else:
        min_increase = _float(
            extremes["min_increase"], f"{where}.min_increase", -_SUM_BOUND, _SUM_BOUND
        )
        max_decrease = _float(
            extremes["max_decrease"], f"{where}.max_decrease", -_SUM_BOUND, _SUM_BOUND
        )
    detector._drift_detected = _bool(data["drift_detected"], f"{where}.drift_detected")
    detector._x_mean = x_mean
    detector._sum_increase, detector._sum_decrease = sums["sum_increase"], sums["sum_decrease"]
    detector._min_increase, detector._max_decrease = min_increase, max_decrease


# DDM


def _ddm_save(detector: typing.Any) -> dict:
    return {
        "drift_detected": detector._drift_detected,
        "warning_detected": detector._warning_detected,
        "p": _mean_to_state(detector._p),
        "p_min": detector._p_min,
        "s_min": detector._s_min,
    }


def _ddm_load(detector: typing.Any, data: dict, where: str) -> None:
    data = _mapping(data, where, ("drift_detected", "warning_detected", "p", "p_min", "s_min"))
    # Binary values: the error rate is in [0, 1], so that sqrt(p (1 - p) / n) is real.
    p = _mean_from_state(data["p"], f"{where}.p", 0.0, 1.0)
    if (data["p_min"] is None) != (data["s_min"] is None):
        _fail(where, "p_min and s_min are both set or both null")
    _load_flags(detector, data, where)
    detector._p = p
    if data["p_min"] is None:
        detector._p_min = detector._s_min = None
        detector._ps_min = math.inf
    else:
        detector._p_min = _float(data["p_min"], f"{where}.p_min", 0.0, 1.0)
        detector._s_min = _float(data["s_min"], f"{where}.s_min", 0.0, 1.0)
        detector._ps_min = detector._p_min + detector._s_min


# EDDM


def _eddm_params(params: dict, where: str) -> None:
    if params["alpha"] < params["beta"]:
        _fail(where, "alpha must be >= beta")


def _eddm_save(detector: typing.Any) -> dict:
    return {
        "drift_detected": detector._drift_detected,
        "warning_detected": detector._warning_detected,
        "error_distances": _var_to_state(detector._error_distances),
        "n": detector._n,
        "last_error": detector._last_error,
        "n_errors": detector._n_errors,
        "p2s_prime_max": detector._p2s_prime_max,
    }


def _eddm_load(detector: typing.Any, data: dict, where: str) -> None:
    data = _mapping(data, where, (
        "drift_detected", "warning_detected", "error_distances", "n", "last_error", "n_errors",
        "p2s_prime_max",
    ))
    n = _int(data["n"], f"{where}.n", 0, 2**53)
    last_error = _int(data["last_error"], f"{where}.last_error", 0, n)
    n_errors = _int(data["n_errors"], f"{where}.n_errors", 0, n)
    # Distances between errors are 1..n: their mean is in [1, n] once there is one.
    distances = _var_from_state(
        data["error_distances"], f"{where}.error_distances", 0.0, float(max(n, 1))
    )
    if distances.n != n_errors or (n_errors and (distances.mean.get() < 1 or last_error < 1)):
        _fail(where, "the error distances do not match the error count")
    p2s_prime_max = _float(data["p2s_prime_max"], f"{where}.p2s_prime_max", -1.0, 1e300)
    if p2s_prime_max != -1 and p2s_prime_max < 1:
        # It is -1 until set, then a mean distance plus two deviations (>= 1): never a divisor 0.
        _fail(f"{where}.p2s_prime_max", "must be -1 or >= 1")
    _load_flags(detector, data, where)
    detector._error_distances = distances
    detector._n, detector._last_error, detector._n_errors = n, last_error, n_errors
    detector._p2s_prime_max = -1 if p2s_prime_max == -1 else p2s_prime_max


# FHDDM


def _fhddm_params(params: dict, where: str) -> None:
    short = params["short_window_size"]
    if short is not None and short > params["sliding_window_size"]:
        _fail(where, "short_window_size must be <= sliding_window_size")


def _fhddm_save(detector: typing.Any) -> dict:
    state = {
        "drift_detected": detector._drift_detected,
        "warning_detected": detector._warning_detected,
        "sliding_window": _as_float_array(detector._sliding_window),
        "u_max": float(detector._u_max),
        "u_short_max": None,
    }
    if detector.short_window_size is not None:
        state["u_short_max"] = float(detector._u_short_max)
    return state


def _fhddm_load(detector: typing.Any, data: dict, where: str) -> None:
    data = _mapping(data, where, (
        "drift_detected", "warning_detected", "sliding_window", "u_max", "u_short_max"
    ))
    size = detector.sliding_window_size
    # After each update a full window drops its oldest value: at rest it holds < size values.
    window = _float_array(data["sliding_window"], f"{where}.sliding_window", size - 1, 0.0, 1.0)
    if not np.isin(window, (0.0, 1.0)).all():
        _fail(f"{where}.sliding_window", "values must be 0 or 1")
    u_max = _float(data["u_max"], f"{where}.u_max", 0.0, 1.0)
    if (detector.short_window_size is None) != (data["u_short_max"] is None):
        _fail(f"{where}.u_short_max", "is set exactly when short_window_size is")
    _load_flags(detector, data, where)
    detector._sliding_window = collections.deque(window.tolist(), maxlen=size)
    # The running count of ones, as River sums the 0.0/1.0 values it is given.
    detector.n_one = sum(detector._sliding_window, 0.0)
    detector._u_max = u_max
    if detector.short_window_size is not None:
        detector._u_short_max = _float(data["u_short_max"], f"{where}.u_short_max", 0.0, 1.0)


# HDDM_A


def _hddm_a_save(detector: typing.Any) -> dict:
    return {
        "drift_detected": detector._drift_detected,
        "warning_detected": detector._warning_detected,
        "x_min": _mean_to_state(detector._x_min),
        "x_max": _mean_to_state(detector._x_max),
        "z": _mean_to_state(detector._z),
    }


def _hddm_a_load(detector: typing.Any, data: dict, where: str) -> None:
    data = _mapping(data, where, ("drift_detected", "warning_detected", "x_min", "x_max", "z"))
    z = _mean_from_state(data["z"], f"{where}.z", 0.0, 1.0)
    cuts = {}
    for name in ("x_min", "x_max"):
        cut = cuts[name] = _mean_from_state(data[name], f"{where}.{name}", 0.0, 1.0)
        # Cut points are earlier copies of z: 1 <= n <= z.n once z has a value (the bounds
        # divide by n and take sqrt((z.n - n) / n)).
        if cut.n > z.n or (z.n > 0 and cut.n < 1):
            _fail(f"{where}.{name}", "count must be in [1, z.n]")
    _load_flags(detector, data, where)
    detector._z, detector._x_min, detector._x_max = z, cuts["x_min"], cuts["x_max"]


# HDDM_W

_SAMPLES = ("total", "s1_decr", "s1_incr", "s2_decr", "s2_incr")


def _sample_to_state(sample: typing.Any) -> dict:
    return {"ewma": _ewmean_to_state(sample._ewma), "is_init": sample._is_init, "ibc": sample._ibc}


def _sample_from_state(data: typing.Any, where: str, lambda_val: float) -> typing.Any:
    """HDDM_W's SampleInfo: an EWMean, whether it has a value, the bound term ibc in [0, 1]."""
    from river.drift.binary.hddm_w import SampleInfo

    data = _mapping(data, where, ("ewma", "is_init", "ibc"))
    sample = SampleInfo(lambda_val)  # derives the lambda terms
    ewma = _ewmean_from_state(data["ewma"], f"{where}.ewma", lambda_val)
    is_init = _bool(data["is_init"], f"{where}.is_init")
    ibc = _float(data["ibc"], f"{where}.ibc", 0.0, 1.0)
    if is_init != _ewmean_to_state(ewma)["initialized"] or (not is_init and ibc != 1.0):
        _fail(where, "is_init, the mean and ibc disagree")
    sample._ewma, sample._is_init, sample._ibc = ewma, is_init, ibc
    return sample


def _hddm_w_save(detector: typing.Any) -> dict:
    state = {
        "drift_detected": detector._drift_detected,
        "warning_detected": detector._warning_detected,
        # +inf and -inf until set (JSON has no infinity).
        "incr_cutpoint": None if math.isinf(detector._incr_cutpoint) else detector._incr_cutpoint,
        "decr_cutpoint": None if math.isinf(detector._decr_cutpoint) else detector._decr_cutpoint,
    }
    for name in _SAMPLES:
        state[name] = _sample_to_state(getattr(detector, f"_{name}"))
    return state


def _hddm_w_load(detector: typing.Any, data: dict, where: str) -> None:
    data = _mapping(data, where, (
        "drift_detected", "warning_detected", "incr_cutpoint", "decr_cutpoint", *_SAMPLES
    ))
    samples = {
        name: _sample_from_state(data[name], f"{where}.{name}", detector.lambda_val)
        for name in _SAMPLES
    }
    cutpoints = {
        name: None if data[name] is None else _float(data[name], f"{where}.{name}", -1e300, 1e300)
        for name in ("incr_cutpoint", "decr_cutpoint")
    }
    _load_flags(detector, data, where)
    for name, sample in samples.items():
        setattr(detector, f"_{name}", sample)
    incr, decr = cutpoints["incr_cutpoint"], cutpoints["decr_cutpoint"]
    detector._incr_cutpoint = math.inf if incr is None else incr
    detector._decr_cutpoint = -math.inf if decr is None else decr


# NoDrift


def _no_drift_save(detector: typing.Any) -> dict:
    return {}


def _no_drift_load(detector: typing.Any, data: dict, where: str) -> None:
    _mapping(data, where, ())


def _load_flags(detector: typing.Any, data: dict, where: str) -> None:
    detector._drift_detected = _bool(data["drift_detected"], f"{where}.drift_detected")
    detector._warning_detected = _bool(data["warning_detected"], f"{where}.warning_detected")


_WINDOW = _p_int(1, MAX_WINDOW)
_COUNT_PARAM = _p_int(0, 2**31 - 1)

_SCHEMAS: dict[str, _Schema] = {
    "ADWIN": _Schema(
        drift.ADWIN,
        {
            "delta": _p_float(0.0, 1.0, open_lo=True),
            "clock": _p_int(1, 2**31 - 1),
            "max_buckets": _p_int(1, MAX_ADWIN_BUCKETS),
            "min_window_length": _COUNT_PARAM,
            "grace_period": _COUNT_PARAM,
        },
        _adwin_save, _adwin_load, _adwin_params,
    ),
    "KSWIN": _Schema(
        drift.KSWIN,
        {
            "alpha": _p_float(0.0, 1.0),
            "window_size": _p_int(2, MAX_WINDOW),
            "stat_size": _p_int(1, MAX_WINDOW),
            "seed": _p_optional(_p_int(-_MAX_SEED, _MAX_SEED)),
        },
        _kswin_save, _kswin_load, _kswin_params,
    ),
    "PageHinkley": _Schema(
        drift.PageHinkley,
        {
            "min_instances": _COUNT_PARAM,
            "delta": _FINITE,
            "threshold": _FINITE,
            "alpha": _p_float(0.0, 1.0),
            "mode": lambda value, where: (
                value if type(value) is str and value in ("up", "down", "both")
                else _fail(where, f"must be 'up', 'down' or 'both', got {_show(value)}")
            ),
        },
        _page_hinkley_save, _page_hinkley_load,
    ),
    "DDM": _Schema(
        binary.DDM,
        {"warm_start": _COUNT_PARAM, "warning_threshold": _FINITE, "drift_threshold": _FINITE},
        _ddm_save, _ddm_load, warning=True,
    ),
    "EDDM": _Schema(
        binary.EDDM,
        {"warm_start": _COUNT_PARAM, "alpha": _FINITE, "beta": _FINITE},
        _eddm_save, _eddm_load, _eddm_params, warning=True,
    ),
    "FHDDM": _Schema(
        binary.FHDDM,
        {
            "sliding_window_size": _WINDOW,
            "confidence_level": _CONFIDENCE,
            "short_window_size": _p_optional(_WINDOW),
        },
        _fhddm_save, _fhddm_load, _fhddm_params, warning=True,
    ),
    "HDDMA": _Schema(
        binary.HDDMA,
        {
            "drift_confidence": _CONFIDENCE,
            "warning_confidence": _CONFIDENCE,
            "two_sided_test": _p_bool,
        },
        _hddm_a_save, _hddm_a_load, warning=True,
    ),
    "HDDMW": _Schema(
        binary.HDDMW,
        {
            "drift_confidence": _CONFIDENCE,
            "warning_confidence": _CONFIDENCE,
            "lambda_val": _p_float(0.0, 1.0),
            "two_sided_test": _p_bool,
        },
        _hddm_w_save, _hddm_w_load, warning=True,
    ),
    "NoDrift": _Schema(drift.NoDrift, {}, _no_drift_save, _no_drift_load),
}

#: The drift detectors a checkpoint may hold: class name -> River class.
DETECTORS: dict[str, type] = {name: schema.cls for name, schema in _SCHEMAS.items()}


def _schema_of(detector: typing.Any) -> tuple[str, _Schema]:
    for name, schema in _SCHEMAS.items():
        if type(detector) is schema.cls:
            return name, schema
    raise TypeError(
        f"{type(detector).__qualname__} has no checkpoint state; the detectors that have: "
        f"{', '.join(DETECTORS)}"
    )


def check_detector_params(name: str, params: typing.Any, complete: bool = True) -> dict:
    """Validated constructor parameters of the detector `name` (a key of `DETECTORS`).

    With `complete=False` (parameters a user gives), missing ones take River's defaults.
    Raises `StateError` (a `ValueError`) naming the parameter and its allowed range.
    """
    schema = _SCHEMAS.get(name) if type(name) is str else None
    if schema is None:
        raise StateError(f"unknown drift detector {_show(name)}; known: {', '.join(DETECTORS)}")
    where = f"{name} parameters"
    if type(params) is not dict:
        _fail(where, f"must be an object, got {type(params).__name__}")
    if not complete:
        unknown = sorted(map(str, set(params) - set(schema.params)))
        if unknown:
            _fail(where, f"unknown {unknown}; known: {sorted(schema.params)}")
        defaults = {
            p.name: p.default
            for p in inspect.signature(schema.cls).parameters.values()
            if p.name in schema.params
        }
        params = {**defaults, **params}
    params = _mapping(params, where, schema.params)
    checked = {key: check(params[key], f"{where}.{key}") for key, check in schema.params.items()}
    schema.check_params(checked, where)
    return checked


def detector_to_state(detector: typing.Any) -> dict:
    """`{"class", "params", "state"}` of a detector of `DETECTORS` (JSON values and arrays).

    Raises `TypeError` for any other object, and `StateError` if the detector's state is outside
    what `detector_from_state` accepts (e.g. non-finite statistics).

    >>> from river import drift
    >>> from streammargin import state
    >>> detector = drift.ADWIN()
    >>> for i in range(300):
    ...     detector.update(float(i % 3 == 0))
    >>> saved = detector_to_state(detector)
    >>> saved["class"], saved["params"]["clock"], saved["state"]["window"]["width"]
    ('ADWIN', 32, 300.0)
    >>> twin = detector_from_state(state.loads(state.dumps(saved)))
    >>> (twin.width, twin.estimation) == (detector.width, detector.estimation)
    True
    """
    name, schema = _schema_of(detector)
    params = {key: getattr(detector, key) for key in schema.params}
    saved = {"class": name, "params": params, "state": schema.save(detector)}
    detector_from_state(saved)  # the same checks as a restore: what is saved can be restored
    return saved


def detector_from_state(data: typing.Any) -> typing.Any:
    """The detector saved by `detector_to_state`; `StateError` for anything malformed."""
    data = _mapping(data, "detector", ("class", "params", "state"))
    name = data["class"]
    schema = _SCHEMAS.get(name) if type(name) is str else None
    if schema is None:
        _fail("detector.class", f"must be one of {', '.join(DETECTORS)}, got {_show(name)}")
    params = check_detector_params(name, data["params"])
    try:
        detector = schema.cls(**params)
    except ValueError as error:  # a constraint of River's own constructor
        raise StateError(f"{name} refuses its parameters: {error}") from None
    schema.load(detector, data["state"], f"{name} state")
    return detector
