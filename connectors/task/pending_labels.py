"""Delayed labels: the events of one partition waiting for their label, bounded.

`PendingLabels` is a task's store (`connectors/task/partition.py`): an unlabelled event with an id
waits here, with the prediction it was served, until a record with its id and a label joins it
(the model then learns it, and the metrics count the prediction), or it expires or is evicted.
Its state (`to_state`, `from_state`) is part of the task's checkpoint: untrusted bytes, checked
field by field into `StateError`.

An event and its label join on the id's value, whatever JSON type each topic writes it in
(`join_key`): an integer id is kept as its decimal text, so that `7` and `"7"` are one id (a
topic of events may write ids as numbers, its label topic as strings); `"007"` is another.
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
    "join_key",
    "pending_entry_bytes",
    "checked_count",
    "ENTRY_BYTES",
    "FEATURE_BYTES",
    "PROBA_DICT_BYTES",
    "PROBA_CLASS_BYTES",
    "INT64_MAX",
]

INT64_MAX = (1 << 63) - 1

# Incremental checkpoints (`PendingLabels.checkpoint_state`). A segment whose waiting entries fall
# below 1/SPARSE of those it holds is written again (its waiting entries, in the next segment):
# what a store rewrites stays within 1/(SPARSE - 1) of what it wrote, and a restore reads at most
# SPARSE times the offsets of the waiting events. At most MAX_SEGMENTS segments (the sparsest
# are merged first): a restore's reads of the checkpoint topic, and its head's list, stay short.
SEGMENT_FORMAT = "streammargin.pending-segment/1"
SPARSE = 4
MAX_SEGMENTS = 64


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


def join_key(event_id: typing.Any) -> typing.Any:
    """The key an event waits under and its label looks up: an integer id as its decimal
    text, a string as it is.

    >>> join_key(100004) == join_key("100004"), join_key(7) == join_key("007")
    (True, False)
    """
    return str(event_id) if type(event_id) is int else event_id


class PendingSegment(typing.NamedTuple):
    """A segment of the store's incremental checkpoints: its id, and the input offsets of the
    entries it holds (sorted)."""

    id: int
    offsets: np.ndarray


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
        # The id of the last label that joined nothing (the orphan warning quotes it).
        self.last_orphan: typing.Any = None
        # Waiting events a restore could not find again on the input topic (`finish_rebuild`).
        self.lost = 0
        # Incremental checkpoints (`checkpoint_state`): the segments written so far, each with
        # the offsets of the entries it holds; entries from offset `covered_to` on are in none.
        self.segments: list[PendingSegment] = []
        self.covered_to = 0
        self.next_segment_id = 1
        self._proposed: tuple[list[PendingSegment], int, int] | None = None
        # A restore's waiting events, by offset, until the input topic gave them back.
        self._rebuild: dict[int, tuple] = {}

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
        event_id = join_key(event_id)
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
        entry = self.entries.pop(join_key(event_id), None)
        if entry is None:
            self.orphans += 1
            self.last_orphan = event_id
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
            "lost": self.lost,
        }

    _COUNTERS = ("joined", "expired", "evicted", "superseded", "orphans", "lost")

    def to_state(self) -> dict:
        from streammargin.state import encode_name

        entries = list(self.entries.items())
        predictions = _predictions_state([e for _, e in entries], self.multiclass)
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
        columns = _columns(data, ("ids", "names", "values"), [
            ("offsets", np.int64), ("timestamps", np.int64), ("sizes", np.int64)], multiclass)
        n = len(columns["ids"])
        offsets, sizes = columns["offsets"], columns["sizes"]
        if n and (offsets.min() < 0 or np.any(np.diff(offsets) < 0)):
            raise StateError("pending labels offsets are negative or out of arrival order")
        if n and sizes.min() < 0:
            raise StateError("pending labels sizes are negative")
        predictions = _predictions(data, columns, multiclass, max_classes)
        max_timestamp, counts = cls._read_counts(data)
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
        # Only the newest entries within the limits are built: those `_evict_to_limits` would
        # keep (a restart with smaller limits, or a store of the old format larger than the
        # share --max-memory gives it), so that a restore never holds more than the store may.
        first, kept_bytes = n, 0
        for size in reversed(sizes.tolist()):  # (Python ints: no int64 overflow)
            if n - first >= max_size or kept_bytes + size > max_bytes:
                break
            first -= 1
            kept_bytes += size
        timestamps = columns["timestamps"]
        superseded = 0
        for i in range(first, n):
            x = {_decode_name(name, "feature name"): value
                 for name, value in zip(names[i], values[i])}
            if len(x) != len(names[i]):
                raise StateError(f"pending labels entry {i} names a feature twice")
            y_pred, p = predictions[i]
            key = join_key(ids[i])
            old = entries.pop(key, None)
            if old is not None:  # (7 and "7" in a store written before ids joined by value)
                kept_bytes -= old[5]
                superseded += 1
            entries[key] = (x, int(offsets[i]), int(timestamps[i]), y_pred, p, int(sizes[i]))
        pending.n_bytes = kept_bytes
        pending.max_timestamp = max_timestamp
        for name, count in counts.items():
            setattr(pending, name, count)
        pending.superseded += superseded
        pending.evicted += first
        return pending

    # Incremental checkpoints -----------------------------------------------------------------

    def checkpoint_state(self, next_offset: int) -> tuple[dict, dict[int, bytes], list[int]]:
        """The store's part of an incremental checkpoint at `next_offset`: its head state, the
        new segment (id -> bytes; none if nothing changed) and the ids of the segments kept.

        A segment holds the input offsets of its entries and the predictions served to them;
        the head says, a bit per entry of each segment, which still wait. The events are not
        written: a restore reads them again from the input topic (`rebuild_range`). So a
        checkpoint writes the predictions of the events that came since the last one, and a
        bit per waiting event, whatever the store holds. Segments whose entries all left are
        dropped; a sparse one (see SPARSE, MAX_SEGMENTS) has its waiting entries written again
        in the new segment. It takes effect once the checkpoint is durable
        (`checkpoint_written`).
        """
        from streammargin.state import dumps

        entries = list(self.entries.values())
        offsets = np.fromiter((e[1] for e in entries), np.int64, len(entries))
        alive = [_present(offsets, segment.offsets) for segment in self.segments]
        counts = [int(a.sum()) for a in alive]
        keep = [i for i, segment in enumerate(self.segments)
                if counts[i] and counts[i] * SPARSE >= len(segment.offsets)]
        if len(keep) > MAX_SEGMENTS - 1:
            keep = sorted(sorted(keep, key=lambda i: -counts[i])[:MAX_SEGMENTS - 1])
        merged = [self.segments[i].offsets[alive[i]] for i in range(len(self.segments))
                  if counts[i] and i not in keep]
        rewrite = offsets >= self.covered_to
        if merged:
            rewrite |= _present(np.sort(np.concatenate(merged)), offsets)
        segments = [self.segments[i] for i in keep]
        bits = [alive[i] for i in keep]
        new: dict[int, bytes] = {}
        next_id = self.next_segment_id
        if rewrite.any():
            chosen = [e for e, again in zip(entries, rewrite.tolist()) if again]
            segment = PendingSegment(next_id, offsets[rewrite])
            next_id += 1
            new[segment.id] = dumps({"format": SEGMENT_FORMAT,
                                     **_offsets_state(segment.offsets),
                                     **_predictions_state(chosen, self.multiclass)})
            segments.append(segment)
            bits.append(np.ones(len(segment.offsets), dtype=np.bool_))
        self._proposed = (segments, next_offset, next_id)
        head = {
            "segments": [segment.id for segment in segments],
            "segment_sizes": np.array([len(s.offsets) for s in segments], dtype=np.int64),
            "waiting": np.packbits(np.concatenate(bits)) if bits else np.zeros(0, np.uint8),
            "next_segment": next_id,
            "max_timestamp": self.max_timestamp,
            **{name: getattr(self, name) for name in self._COUNTERS},
        }
        return head, new, [segment.id for segment in segments if segment.id not in new]

    def checkpoint_written(self) -> None:
        """The checkpoint of the last `checkpoint_state` is durable: its segments stand."""
        if self._proposed is not None:
            self.segments, self.covered_to, self.next_segment_id = self._proposed
            self._proposed = None

    @classmethod
    def from_checkpoint_state(
        cls,
        data: typing.Any,
        segments: typing.Mapping[int, bytes],
        next_offset: int,
        max_size: int,
        max_bytes: int = 256 << 20,
        max_age_records: int | None = None,
        max_age_ms: int | None = None,
        multiclass: bool = False,
        max_classes: int = MAX_CLASSES,
    ) -> PendingLabels:
        """The store of an incremental checkpoint at `next_offset` (`checkpoint_state`, with
        the checkpoint's segments), without its events yet: `rebuild_range` says which input
        offsets to read again, `rebuilt` takes each waiting event back and `finish_rebuild`
        ends. `StateError` if anything is malformed, before an entry is built."""
        from streammargin.state import loads

        if not isinstance(data, dict):
            raise StateError(f"pending labels state is a {type(data).__name__}, not a dict")
        ids, sizes, waiting = data.get("segments"), data.get("segment_sizes"), data.get("waiting")
        if (not isinstance(ids, list) or len(ids) > MAX_SEGMENTS
                or any(type(i) is not int or not 1 <= i <= INT64_MAX for i in ids)
                or len(set(ids)) != len(ids)):
            raise StateError(f"pending labels segments must be at most {MAX_SEGMENTS} distinct "
                             "ids in [1, 2**63)")
        if (not isinstance(sizes, np.ndarray) or sizes.dtype != np.int64
                or sizes.shape != (len(ids),) or (len(ids) and sizes.min() < 1)):
            raise StateError("pending labels segment_sizes must give each segment's entries")
        total = sum(sizes.tolist())
        if (not isinstance(waiting, np.ndarray) or waiting.dtype != np.uint8
                or waiting.shape != (-(-total // 8),)):
            raise StateError(f"pending labels waiting must hold {total} bits")
        next_segment = checked_count(data.get("next_segment"), "pending labels next_segment")
        if ids and next_segment <= max(ids):
            raise StateError("pending labels next_segment is not past its segments")
        if set(segments) != set(ids):
            raise StateError(f"pending labels list segments {sorted(ids)[:8]} but the checkpoint "
                             f"holds {sorted(segments)[:8]}")
        max_timestamp, counts = cls._read_counts(data)
        bits = np.unpackbits(waiting)[:total].astype(np.bool_)
        # Offsets first, predictions after: a restore keeps only the newest `max_size` waiting
        # events (the older ones would be evicted once read again), so that a checkpoint's bits
        # (crafted, or written under a larger --label-store-size) cannot make it build an entry
        # each, about 15 times their bytes, before the store's limits apply.
        read, restored = [], []
        start = 0
        for segment_id, size in zip(ids, sizes.tolist()):
            what = f"pending segment {segment_id}"
            try:
                fields = loads(segments[segment_id])
            except StateError as error:
                raise StateError(f"{what}: {error}") from None
            if not isinstance(fields, dict) or fields.get("format") != SEGMENT_FORMAT:
                raise StateError(f"{what} is not a {SEGMENT_FORMAT}")
            columns = _columns(fields, (), [], multiclass, what)
            offsets = _read_offsets(fields, size, next_offset, what)
            if len(columns["y_pred"]) != size:
                raise StateError(f"{what} holds {len(columns['y_pred'])} predictions for {size} "
                                 "entries")
            read.append((fields, columns, offsets, bits[start:start + size]))
            start += size
            restored.append(PendingSegment(segment_id, offsets))
        found = (np.concatenate([offsets[alive] for _, _, offsets, alive in read]) if read
                 else np.zeros(0, np.int64))
        if len(np.unique(found)) != len(found):
            raise StateError("pending labels: an offset waits in two segments")
        waiting_total = len(found)
        newest = (np.sort(found)[-max_size] if waiting_total > max_size
                  else np.iinfo(np.int64).min)
        waiting_offsets, predictions = [], []
        for fields, columns, offsets, alive in read:
            kept = alive & (offsets >= newest)
            served = _predictions(fields, columns, multiclass, max_classes, kept)
            waiting_offsets.append(offsets[kept])
            predictions.extend(served)
        found = np.concatenate(waiting_offsets) if waiting_offsets else np.zeros(0, np.int64)
        pending = cls(max_size, max_bytes, max_age_records, max_age_ms, multiclass, max_classes)
        pending.max_timestamp = max_timestamp
        for name, count in counts.items():
            setattr(pending, name, count)
        pending.evicted += waiting_total - len(found)
        pending.segments = restored
        pending.covered_to = next_offset
        pending.next_segment_id = next_segment
        order = np.argsort(found, kind="stable")
        pending._rebuild = {int(found[i]): predictions[i] for i in order.tolist()}
        return pending

    @property
    def rebuilding(self) -> int:
        """Waiting events a restore has yet to read again."""
        return len(self._rebuild)

    def rebuild_range(self) -> tuple[int, int] | None:
        """The input offsets [first, next offset) a restore reads again for its waiting events
        (None: none wait)."""
        if not self._rebuild:
            return None
        return next(iter(self._rebuild)), self.covered_to

    def served_at(self, offset: int) -> tuple | None:
        """The prediction (label, p_true or class probabilities) served to the event at
        `offset` if it waited when the checkpoint was written (a restore), else None."""
        return self._rebuild.get(offset)

    def rebuilt(self, offset: int, event_id: typing.Any, x: dict, timestamp: int,
                size: int) -> None:
        """The event at `offset` read again (in offset order), with the prediction it had."""
        y_pred, p = self._rebuild.pop(offset)
        event_id = join_key(event_id)
        old = self.entries.pop(event_id, None)
        if old is not None:  # (two waiting offsets give one id: the input topic changed)
            self.n_bytes -= old[5]
            self.lost += 1
        self.entries[event_id] = (x, offset, timestamp, y_pred, p, size)
        self.n_bytes += size

    def finish_rebuild(self) -> int:
        """The end of a restore's reading: waiting events it did not find again (deleted by
        the topic's retention, or no longer readable) are lost; returns their count."""
        lost = len(self._rebuild)
        self.lost += lost
        self._rebuild = {}
        self._evict_to_limits()  # (a restart with smaller limits)
        return lost

    @classmethod
    def _read_counts(cls, data: dict) -> tuple[int, dict[str, int]]:
        """The running maximum timestamp and the counters of a saved store."""
        max_timestamp = data.get("max_timestamp")
        if type(max_timestamp) is not int or not -(1 << 63) <= max_timestamp <= INT64_MAX:
            raise StateError(f"pending labels max_timestamp {max_timestamp!r:.40} is not an int64")
        # ("lost" came with incremental checkpoints: 0 in an older one)
        counts = {name: checked_count(data.get(name, 0 if name == "lost" else None),
                                      f"pending labels {name}")
                  for name in cls._COUNTERS}
        return max_timestamp, counts


def _predictions_state(entries: list[tuple], multiclass: bool) -> dict:
    """The predictions served to `entries` (store tuples), as state columns."""
    if multiclass:
        # The predicted labels (None: no class yet), and the class probabilities as one flat
        # list of labels and one of values, with each entry's count.
        return {
            "y_pred": [None if e[3] is None else label_to_state(e[3]) for e in entries],
            "proba_sizes": np.array([len(e[4]) for e in entries], dtype=np.int64),
            "proba_labels": [label_to_state(c) for e in entries for c in e[4]],
            "proba_values": np.array([p for e in entries for p in e[4].values()],
                                     dtype=np.float64),
        }
    return {
        "y_pred": np.array([e[3] for e in entries], dtype=np.bool_),
        "p_true": np.array([e[4] for e in entries], dtype=np.float64),
    }


def _present(sorted_offsets: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Which of `wanted` are in `sorted_offsets` (non-decreasing): a binary search each.

    Why not np.isin: it sorts both arrays on every call, and a checkpoint asks once per segment
    (up to MAX_SEGMENTS) against the whole store's offsets (up to --label-store-size); the
    store's offsets are in arrival order, which is offset order, already sorted."""
    if not len(sorted_offsets):
        return np.zeros(len(wanted), dtype=np.bool_)
    at = np.searchsorted(sorted_offsets, wanted).clip(max=len(sorted_offsets) - 1)
    return sorted_offsets[at] == wanted


def _offsets_state(offsets: np.ndarray) -> dict:
    """A segment's offsets (increasing): the first, and the gaps to each next one, 4 bytes each
    where they fit (they do unless two waiting events are 2**31 records apart)."""
    gaps = np.diff(offsets, prepend=offsets[0])
    if len(gaps) and gaps.max() <= np.iinfo(np.int32).max:
        gaps = gaps.astype(np.int32)
    return {"first_offset": int(offsets[0]), "gaps": gaps}


def _read_offsets(fields: dict, size: int, next_offset: int, what: str) -> np.ndarray:
    """The `size` offsets of a segment's `_offsets_state`, each in [0, next_offset)."""
    first, gaps = fields.get("first_offset"), fields.get("gaps")
    if (type(first) is not int or not isinstance(gaps, np.ndarray) or gaps.ndim != 1
            or gaps.dtype not in (np.dtype(np.int32), np.dtype(np.int64))):
        raise StateError(f"{what}: first_offset and gaps must be an int and 1-d integers")
    if len(gaps) != size:
        raise StateError(f"{what} holds {len(gaps)} entries, the head says {size}")
    if not 0 <= first < next_offset or gaps[0] != 0 or (size > 1 and gaps[1:].min() < 1):
        raise StateError(f"{what}'s offsets are not increasing within [0, {next_offset})")
    offsets = first + np.cumsum(gaps, dtype=np.int64)  # (gaps >= 1: no overflow below 2**63)
    if offsets[-1] >= next_offset or (size > 1 and np.diff(offsets).min() < 1):  # (a wrap)
        raise StateError(f"{what}'s offsets are not increasing within [0, {next_offset})")
    return offsets


def _columns(data: typing.Any, lists: tuple[str, ...], arrays: list[tuple[str, type]],
             multiclass: bool, what: str = "pending labels") -> dict:
    """The named columns of a state dict (with its prediction columns), each checked for its
    kind and all of one length."""
    if not isinstance(data, dict):
        raise StateError(f"{what} state is a {type(data).__name__}, not a dict")
    lists = lists + (("y_pred",) if multiclass else ())
    arrays = arrays + ([("proba_sizes", np.int64)] if multiclass
                       else [("y_pred", np.bool_), ("p_true", np.float64)])
    columns = {}
    for name in lists:
        column = data.get(name)
        if not isinstance(column, list):
            raise StateError(f"{what} field {name!r} is not a list")
        columns[name] = column
    for name, dtype in arrays:
        column = data.get(name)
        if (not isinstance(column, np.ndarray) or column.dtype != np.dtype(dtype)
                or column.ndim != 1):
            raise StateError(f"{what} field {name!r} is not a 1-d {np.dtype(dtype)} array")
        columns[name] = column
    if len({len(column) for column in columns.values()}) > 1:
        raise StateError(f"{what} columns have different lengths")
    return columns


def _predictions(data: dict, columns: dict, multiclass: bool, max_classes: int,
                 only: np.ndarray | None = None) -> list[tuple]:
    """(predicted label, p_true or class probabilities) of each entry of `_columns`, or of the
    entries `only` marks (every entry is checked either way)."""
    if multiclass:
        return _multiclass_predictions(data, columns, max_classes, only)
    y_pred, p_true = columns["y_pred"], columns["p_true"]
    if len(p_true) and not np.all((p_true >= 0.0) & (p_true <= 1.0)):
        raise StateError("pending labels probabilities outside [0, 1]")
    if only is not None:
        y_pred, p_true = y_pred[only], p_true[only]
    return list(zip(y_pred.tolist(), p_true.tolist()))


def _multiclass_predictions(data: dict, columns: dict, max_classes: int,
                            only: np.ndarray | None) -> list[tuple]:
    """(predicted label, class probabilities) of each entry of a multiclass store's state (or
    of those `only` marks)."""
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
    wanted = [True] * len(sizes) if only is None else only.tolist()
    predictions = []
    start = 0
    for i, size in enumerate(sizes.tolist()):
        proba = dict(zip(decoded[start:start + size], values[start:start + size].tolist()))
        if len(proba) != size:
            raise StateError(f"pending labels entry {i} gives a class two probabilities")
        if wanted[i]:
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
