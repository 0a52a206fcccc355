"""Delayed labels: the events of one partition waiting for their label, bounded.

`PendingLabels` is a task's store (`connectors/worker/task.py`): an unlabelled event with an id
waits here, with the prediction it was served, until a record with its id and a label joins it
(the model then learns it, and the metrics count the prediction), or it expires or is evicted.
Its state (`to_state`, `from_state`) is part of the task's checkpoint: untrusted bytes, checked
field by field into `StateError`.
"""

from __future__ import annotations

import math
import typing

import numpy as np

from connectors.codec import label_from_state, label_to_state
from connectors.observability.metrics import MAX_CLASSES
from streammargin.errors import StateError

__all__ = [
    "PendingLabels",
    "pending_entry_bytes",
    "checked_count",
    "ENTRY_BYTES",
    "FEATURE_BYTES",
    "PROBA_DICT_BYTES",
    "PROBA_CLASS_BYTES",
    "INT64_MAX",
]

INT64_MAX = (1 << 63) - 1


def checked_count(value: typing.Any, what: str) -> int:
    """`value` if it is a whole number in [0, 2**63) (a count, an offset read from untrusted
    bytes), else `StateError` naming `what`."""
    if type(value) is not int or not 0 <= value <= INT64_MAX:
        raise StateError(f"{what} must be an integer in [0, 2**63), got {value!r:.60}")
    return value


# Memory held by one waiting event, estimated from its record: the record's bytes plus a fixed cost
# per feature and per entry (Python objects of the decoded dict and the store's own tuple). The
# constants come from tracemalloc on JSON events of 1-100 features with 2-1000 character names
# (the estimate was 1.1x-1.5x the measured size, never below it); it depends only on the record,
# so a replay evicts identically.
ENTRY_BYTES = 400
FEATURE_BYTES = 96
# A multiclass event also keeps its class probabilities (a dict of floats, keys shared with the
# model): tracemalloc measured 238 bytes for 2 classes, 444 for 7, 5732 for 100, and at most 0.96
# of this estimate for every count from 1 to 259.
PROBA_DICT_BYTES = 200
PROBA_CLASS_BYTES = 64


def pending_entry_bytes(value: bytes, x: dict, proba: dict | None = None) -> int:
    """The bytes a waiting event is charged in the label store (`proba`: the class
    probabilities a multiclass event keeps)."""
    size = len(value) + FEATURE_BYTES * len(x) + ENTRY_BYTES
    if proba is not None:
        size += PROBA_DICT_BYTES + PROBA_CLASS_BYTES * len(proba)
    return size


class PendingLabels:
    """Unlabelled events waiting for their label: bounded in entries, bytes and age.

    Entries are kept in arrival order. When a new entry takes the store past `max_size` entries or
    `max_bytes` bytes (each entry is charged `pending_entry_bytes`), the oldest entries are evicted
    (`evicted`). Ages are measured in records of the partition (offsets) and in Kafka record
    timestamps, never in wall-clock time, so that a replay makes exactly the same decisions; an
    event older than a limit expires (`expired`). Timestamps are the running maximum seen on the
    partition, which only grows: an entry found too old once stays too old. A second event with a
    waiting id replaces the first (`superseded`); a label that finds nothing is an orphan.

    An entry keeps what the metrics need when the label comes: the predicted label and its
    probability of True (binary), or the predicted label (possibly None) and the class
    probabilities (`multiclass`, at most `max_classes` of them).
    """

    def __init__(
        self,
        max_size: int,
        max_bytes: int = 256 << 20,
        max_age_records: int | None = None,
        max_age_ms: int | None = None,
        multiclass: bool = False,
        max_classes: int = MAX_CLASSES,
    ):
        if max_size < 1 or max_bytes < 1:
            raise ValueError(f"max_size and max_bytes must be >= 1, got {max_size}, {max_bytes}")
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.max_age_records = max_age_records
        self.max_age_ms = max_age_ms
        self.multiclass = multiclass
        self.max_classes = max_classes
        # id -> (x, offset, timestamp ms, predicted label, p_true or class probabilities, bytes)
        self.entries: dict[typing.Any, tuple] = {}
        self.n_bytes = 0
        self.max_timestamp = -(1 << 62)
        self.joined = 0
        self.expired = 0
        self.evicted = 0
        self.superseded = 0
        self.orphans = 0

    def __len__(self) -> int:
        return len(self.entries)

    def _too_old(self, entry: tuple, offset: int) -> bool:
        if self.max_age_records is not None and offset - entry[1] > self.max_age_records:
            return True
        return self.max_age_ms is not None and self.max_timestamp - entry[2] > self.max_age_ms

    def add(self, event_id: typing.Any, x: dict, offset: int, timestamp: int, y_pred: typing.Any,
            p_true: float | dict, size: int) -> None:
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        entries = self.entries
        old = entries.pop(event_id, None)
        if old is not None:
            # The first event can no longer be labelled.
            self.n_bytes -= old[5]
            self.superseded += 1
        if size > self.max_bytes:
            self.evicted += 1  # larger than the whole store: never stored
        else:
            entries[event_id] = (x, offset, timestamp, y_pred, p_true, size)
            self.n_bytes += size
            if len(entries) > self.max_size or self.n_bytes > self.max_bytes:
                self._evict_to_limits()
        self.sweep(offset)

    def pop(self, event_id: typing.Any, offset: int, timestamp: int) -> tuple | None:
        """The waiting event of a label record, or None (orphan label, or expired event)."""
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        entry = self.entries.pop(event_id, None)
        if entry is None:
            self.orphans += 1
            return None
        self.n_bytes -= entry[5]
        if self._too_old(entry, offset):
            self.expired += 1
            return None
        self.joined += 1
        return entry

    def sweep(self, offset: int) -> None:
        """Drop the oldest entries while they are too old."""
        entries = self.entries
        while entries:
            oldest_id = next(iter(entries))
            if not self._too_old(entries[oldest_id], offset):
                return
            self.n_bytes -= entries.pop(oldest_id)[5]
            self.expired += 1

    def resize(self, max_bytes: int) -> None:
        """A new byte limit (the worker's --max-memory share of this partition, as partitions
        come and go): the oldest entries beyond it are evicted, counted."""
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = max_bytes
        self._evict_to_limits()

    def _evict_to_limits(self) -> None:
        """Evict the oldest entries, counted, while the store is beyond max_size or max_bytes."""
        entries = self.entries
        while len(entries) > self.max_size or self.n_bytes > self.max_bytes:
            self.n_bytes -= entries.pop(next(iter(entries)))[5]
            self.evicted += 1

    def counters(self) -> dict[str, int]:
        return {
            "pending": len(self.entries),
            "pending_bytes": self.n_bytes,
            "joined": self.joined,
            "expired": self.expired,
            "evicted": self.evicted,
            "superseded": self.superseded,
            "orphans": self.orphans,
        }

    _COUNTERS = ("joined", "expired", "evicted", "superseded", "orphans")

    def to_state(self) -> dict:
        from streammargin.state import encode_name

        entries = list(self.entries.items())
        if self.multiclass:
            # The predicted labels (None: no class yet), and the class probabilities as one flat
            # list of labels and one of values, with each entry's count.
            predictions = {
                "y_pred": [None if e[3] is None else label_to_state(e[3]) for _, e in entries],
                "proba_sizes": np.array([len(e[4]) for _, e in entries], dtype=np.int64),
                "proba_labels": [label_to_state(c) for _, e in entries for c in e[4]],
                "proba_values": np.array([p for _, e in entries for p in e[4].values()],
                                         dtype=np.float64),
            }
        else:
            predictions = {
                "y_pred": np.array([e[3] for _, e in entries], dtype=np.bool_),
                "p_true": np.array([e[4] for _, e in entries], dtype=np.float64),
            }
        return {
            "ids": [encode_name(event_id) for event_id, _ in entries],
            "names": [[encode_name(name) for name in e[0]] for _, e in entries],
            "values": [list(e[0].values()) for _, e in entries],
            "offsets": np.array([e[1] for _, e in entries], dtype=np.int64),
            "timestamps": np.array([e[2] for _, e in entries], dtype=np.int64),
            **predictions,
            "sizes": np.array([e[5] for _, e in entries], dtype=np.int64),
            "max_timestamp": self.max_timestamp,
            **{name: getattr(self, name) for name in self._COUNTERS},
        }

    @classmethod
    def from_state(
        cls,
        data: typing.Any,
        max_size: int,
        max_bytes: int = 256 << 20,
        max_age_records: int | None = None,
        max_age_ms: int | None = None,
        multiclass: bool = False,
        max_classes: int = MAX_CLASSES,
    ) -> PendingLabels:
        """The store saved by `to_state`, under the given limits; `StateError` if malformed.

        Every length, type and range is checked before any entry is built (a multiclass store's
        entries hold at most `max_classes` probabilities each, of the codec's label types).
        Entries beyond the current limits (a restart with smaller ones) are evicted, oldest
        first.
        """
        if not isinstance(data, dict):
            raise StateError(f"pending labels state is a {type(data).__name__}, not a dict")
        columns = {}
        lists = ("ids", "names", "values") + (("y_pred",) if multiclass else ())
        for name in lists:
            column = data.get(name)
            if not isinstance(column, list):
                raise StateError(f"pending labels field {name!r} is not a list")
            columns[name] = column
        arrays = [("offsets", np.int64), ("timestamps", np.int64), ("sizes", np.int64)]
        if multiclass:
            arrays.append(("proba_sizes", np.int64))
        else:
            arrays += [("y_pred", np.bool_), ("p_true", np.float64)]
        for name, dtype in arrays:
            column = data.get(name)
            if (not isinstance(column, np.ndarray) or column.dtype != np.dtype(dtype)
                    or column.ndim != 1):
                raise StateError(f"pending labels field {name!r} is not a 1-d {np.dtype(dtype)} "
                                 "array")
            columns[name] = column
        n = len(columns["ids"])
        if any(len(column) != n for column in columns.values()):
            raise StateError("pending labels columns have different lengths")
        offsets, sizes = columns["offsets"], columns["sizes"]
        if n and (offsets.min() < 0 or np.any(np.diff(offsets) < 0)):
            raise StateError("pending labels offsets are negative or out of arrival order")
        if n and sizes.min() < 0:
            raise StateError("pending labels sizes are negative")
        if multiclass:
            predictions = _multiclass_predictions(data, columns, max_classes)
        else:
            p_true = columns["p_true"]
            if n and not np.all((p_true >= 0.0) & (p_true <= 1.0)):
                raise StateError("pending labels probabilities outside [0, 1]")
            predictions = list(zip(columns["y_pred"].tolist(), p_true.tolist()))
        max_timestamp = data.get("max_timestamp")
        if type(max_timestamp) is not int or not -(1 << 63) <= max_timestamp <= INT64_MAX:
            raise StateError(f"pending labels max_timestamp {max_timestamp!r:.40} is not an int64")
        counts = {name: checked_count(data.get(name), f"pending labels {name}")
                  for name in cls._COUNTERS}
        names, values = columns["names"], columns["values"]
        for i in range(n):
            if (not isinstance(names[i], list) or not isinstance(values[i], list)
                    or len(names[i]) != len(values[i])):
                raise StateError(f"pending labels entry {i}: names and values do not match")
            for value in values[i]:
                if not _finite_number(value):
                    raise StateError(
                        f"pending labels entry {i}: feature value {value!r:.40} is not a finite "
                        "real number"
                    )

        pending = cls(max_size, max_bytes, max_age_records, max_age_ms, multiclass, max_classes)
        entries = pending.entries
        ids = [_decode_name(event_id, "event id") for event_id in columns["ids"]]
        if len(set(ids)) != n:
            raise StateError("pending labels hold an event id twice")
        timestamps = columns["timestamps"]
        for i in range(n):
            x = {_decode_name(name, "feature name"): value
                 for name, value in zip(names[i], values[i])}
            if len(x) != len(names[i]):
                raise StateError(f"pending labels entry {i} names a feature twice")
            y_pred, p = predictions[i]
            entries[ids[i]] = (x, int(offsets[i]), int(timestamps[i]), y_pred, p, int(sizes[i]))
        pending.n_bytes = sum(sizes.tolist())  # Python ints: no int64 overflow
        pending.max_timestamp = max_timestamp
        for name, count in counts.items():
            setattr(pending, name, count)
        pending._evict_to_limits()  # (a restart with smaller limits)
        return pending


def _multiclass_predictions(data: dict, columns: dict, max_classes: int) -> list[tuple]:
    """(predicted label, class probabilities) of each entry of a multiclass store's state."""
    sizes = columns["proba_sizes"]
    labels, values = data.get("proba_labels"), data.get("proba_values")
    if len(sizes) and (sizes.min() < 0 or sizes.max() > max_classes):
        raise StateError(f"pending labels hold more than max_classes={max_classes} probabilities "
                         "for an event")
    total = sum(sizes.tolist())
    if (not isinstance(labels, list) or len(labels) != total or not isinstance(values, np.ndarray)
            or values.dtype != np.float64 or values.shape != (total,)):
        raise StateError("pending labels proba_labels and proba_values must hold the "
                         "proba_sizes probabilities")
    if total and not np.all((values >= 0.0) & (values <= 1.0)):
        raise StateError("pending labels probabilities outside [0, 1]")
    try:
        decoded = [label_from_state(label) for label in labels]
        y_pred = [None if y is None else label_from_state(y) for y in columns["y_pred"]]
    except StateError as error:
        raise StateError(f"pending labels: {error}") from None
    predictions = []
    start = 0
    for i, size in enumerate(sizes.tolist()):
        proba = dict(zip(decoded[start:start + size], values[start:start + size].tolist()))
        if len(proba) != size:
            raise StateError(f"pending labels entry {i} gives a class two probabilities")
        predictions.append((y_pred[i], proba))
        start += size
    return predictions


def _finite_number(value: typing.Any) -> bool:
    kind = type(value)
    if kind is bool:
        return True
    if kind is int:
        return abs(value) <= 1.7976931348623157e308
    return kind is float and math.isfinite(value)


def _decode_name(encoded: typing.Any, what: str) -> typing.Any:
    from streammargin.state import decode_name

    try:
        return decode_name(encoded)
    except StateError:
        raise StateError(f"pending labels: bad {what} {encoded!r:.60}") from None
    except RecursionError:
        raise StateError(f"pending labels: {what} nested too deeply") from None
