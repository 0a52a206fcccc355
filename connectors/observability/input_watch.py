"""What the worker says about the input it cannot use: nothing is lost in silence.

Every record the worker cannot use is counted, and logged once with the fix, whenever it starts:

- **First contact.** A user who points the worker at a topic of another shape (a flat JSON topic
  read with the envelope's defaults, an Avro topic read as JSON) would see every record
  dead-lettered. Over its first `FIRST_RECORDS` records, when at least half are dead letters of
  one kind (`DEAD_LETTER_KINDS`), one WARNING gives an example reason (a record's own words:
  which fields it has, what it holds) and the fix.
- **Dead letters that start or surge mid-stream.** A kind of dead letter that the last
  `interval` (a minute) had none of logs one WARNING at its first record, with the count, an
  example reason and the likely fix (a Schema Registry restarted without its storage makes every
  later record `unknown_schema`); one that surges (`SURGE_RECORDS` or more in a window, and
  `SURGE_FACTOR` times the window before) logs one too. At most one WARNING a minute a kind.
- **Labels that join nothing.** When most of a window's delayed labels find no waiting event
  (at least `ORPHAN_LABELS` labels, more than half of them orphans), one WARNING a minute gives an
  example of the labels' ids and of the waiting events' ids, the likely causes and the fix.
- **Fields left out of the features** (values that cannot be features, reached by a wildcard:
  `connectors.serializers.mapping`): one WARNING names the fields newly left out, what each
  held and the option that silences it.

The counts (dead letters by kind, orphan labels, fields left out by kind) go to the final
summary; /metrics has them too (`connectors/observability/observability.py`). The windows use
the wall clock: what is logged never changes what the worker computes.
"""

from __future__ import annotations

import collections
import logging
import time
import typing
import weakref

from connectors.observability.observability import dead_letter_kind_of, dead_letter_reason

__all__ = ["InputWatch", "FIRST_RECORDS", "FIXES", "SURGE_RECORDS", "SURGE_FACTOR",
           "ORPHAN_LABELS"]

log = logging.getLogger("streammargin.kafka")

#: The records watched: enough to tell a stray bad record from a topic of another shape.
FIRST_RECORDS = 100
#: A kind of dead letter surges when a window holds at least this many of it, and this many
#: times as many as the window before.
SURGE_RECORDS = 100
SURGE_FACTOR = 4
#: The least labels of a window that can say "most labels join nothing".
ORPHAN_LABELS = 20

#: What fixes each kind of dead letter (where its reason has no "Fix:" of its own).
FIXES = {
    "missing_features": "name the fields: --features '*' (every field) or --features PATH,..., "
                        "and --label-field and --id-field for the label and the id",
    "not_an_object": "a record must be an object of fields (a JSON object, an Avro record, a "
                     "Protobuf message)",
    "bad_features": "--features PATH.* must name an object of the record, or give '*'",
    "not_a_number": "take the field out of --features: it names a field that holds no feature "
                    "(an array, bytes, free text; a wildcard leaves such fields out)",
    "non_finite": "the producer writes NaN or infinite numbers: JSON has none (write null for "
                  "a missing value); in an Avro or Protobuf field that --features names, take "
                  "it out of --features (a wildcard leaves such values out)",
    "bad_id": "--id-field naming a string or integer field (or --id-from-key)",
    "unknown_label": "--label-field naming the label; two labels other than true/false, 1/0 "
                     "take --positive-label VALUE (the other is the negative class), more "
                     "classes a multiclass model (--model convexpolytope, or --one-vs-rest)",
    "unjoinable_label": "--id-field naming the id shared by an event and its label",
    "missing_label": "--label-field naming the label of the label topic's records",
    "bad_json": "if a Schema Registry serializer wrote the topic, --value-format avro, protobuf "
                "or json-schema with --schema-registry-url",
    "wire_format": "--value-format json if the topic holds plain JSON, else the format its "
                   "serializer writes",
    "unknown_schema": "--schema-registry-url of the registry the producers write to; a registry "
                      "restarted without its storage has forgotten the ids the records name: "
                      "restore its storage (or register the schemas again under their ids)",
    "bad_schema": "--value-format matching the producers' serializer (avro, protobuf, "
                  "json-schema)",
    "bad_payload": "--value-format matching the producers' serializer, if the records are not "
                   "of the schema they name; else the producer writes values its schema does "
                   "not allow (see the reason)",
    "oversized": "--max-record-bytes above the records' size",
    "null_value": "the topic holds tombstones (null values): they are never events",
    "rejected_by_model": "the model refuses the records (see the reason): check --model and "
                         "--param",
}

#: What a field left out held, in a sentence.
_LEFT_OUT_WORDS = {
    "array": "an array",
    "bytes": "bytes",
    "long_string": "a string too long for a category",
    "non_finite": "NaN, an infinity or a number beyond float64",
}


def _fix_of(kind: str, example: str) -> str:
    return "" if "Fix:" in example else " Fix: " + FIXES.get(
        kind, "see the reason, and docs/kafka.md (\"What each bad input gets\")")


class InputWatch:
    """Counts of what the worker could not use, and its warnings (see the module doc).

    `clock` is monotonic seconds (tests pass their own); `interval` the window and the least
    time between two warnings of one kind.
    """

    def __init__(self, first_records: int = FIRST_RECORDS, interval: float = 60.0,
                 clock: typing.Callable[[], float] = time.monotonic):
        self.first_records = first_records
        self.interval = interval
        self._clock = clock
        self.records = 0
        self.dead_letters: collections.Counter[str] = collections.Counter()
        self._early: collections.Counter[str] = collections.Counter()
        self._examples: dict[str, str] = {}
        #: The kind the first-contact warning named (None: none yet).
        self.warned: str | None = None
        # Windows of `interval` seconds: each kind's dead letters in this one and the one
        # before, when each kind was last warned of, and the surges already warned this window.
        self._window_start = clock()
        self._current: collections.Counter[str] = collections.Counter()
        self._previous: collections.Counter[str] = collections.Counter()
        self._last_warned: dict[str, float] = {}
        self._surged: set[str] = set()
        # Labels: each task's (orphans, labels) as last seen (a task restored anew starts
        # again), and this window's.
        self._labels_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._window_orphans = 0
        self._window_labels = 0
        self.orphans = 0
        self._orphans_warned_at: float | None = None
        #: Fields left out of the features, by kind (the mapper's counts).
        self.left_out: dict[str, int] = {}
        #: WARNING lines so far, by what they were about ("first_contact", "started", "surged",
        #: "orphans", "left_out"): tests and the summary read them.
        self.warnings: collections.Counter[str] = collections.Counter()

    # Dead letters -----------------------------------------------------------------------------

    def observe(self, processed: int, dead_letters: typing.Iterable[typing.Any]) -> None:
        """A task processed `processed` records, and these became dead letters."""
        early = self.records < self.first_records
        self.records += processed
        now = self._roll()
        seen: collections.Counter[str] = collections.Counter()
        for record in dead_letters:
            kind = dead_letter_kind_of(record.headers)
            seen[kind] += 1
            if kind not in self._examples or not early:
                self._examples[kind] = dead_letter_reason(record.headers)
        if not seen:
            if early and self.records >= self.first_records:
                self.check()
            return
        self.dead_letters.update(seen)
        if early:
            self._early.update(seen)
        for kind, count in seen.items():
            before = self._current[kind]
            self._current[kind] = before + count
            if early:
                continue  # first contact decides first (below, or at `check`)
            if before == 0 and self._previous[kind] == 0:
                self._warn(kind, now, "started", count)
            elif (self._current[kind] >= max(SURGE_RECORDS, SURGE_FACTOR * self._previous[kind])
                  and kind not in self._surged):
                self._surged.add(kind)
                self._warn(kind, now, "surged", self._current[kind])
        if early and self.records >= self.first_records:
            self.check()

    def check(self) -> None:
        """The end of the first records (also called at the end, for a run of fewer): the
        first-contact warning if most of them were one kind of dead letter, else one for each
        kind they had."""
        if self.warned is not None or not self._early:
            return
        # (the window ends with the task call that reached `first_records`: whole calls)
        seen = self.records or 1
        kind, count = self._early.most_common(1)[0]
        now = self._clock()
        if 2 * count >= seen:
            self.warned = kind
            example = self._examples[kind][:500]
            log.warning("%d of the first %d records went to the dead-letter topic for one reason "
                        "(%s): %s%s", count, seen, kind, example, _fix_of(kind, example),
                        extra={"dead_letter_kind": kind, "dead_letters": count, "records": seen})
            self.warnings["first_contact"] += 1
            self._last_warned[kind] = now
        for other, other_count in self._early.items():
            if other != self.warned:
                self._warn(other, now, "started", other_count)
        self._early.clear()

    def _warn(self, kind: str, now: float, why: str, count: int) -> None:
        last = self._last_warned.get(kind)
        if last is not None and now - last < self.interval:
            return  # (at most one a minute a kind: the counts say the rest)
        self._last_warned[kind] = now
        example = self._examples.get(kind, "")[:500]
        if why == "started":
            what = (f"{count} record{'s' if count != 1 else ''} went to the dead-letter topic "
                    f"as {kind}, which the last minute had none of")
        else:
            what = (f"{count} records went to the dead-letter topic as {kind} within a minute, "
                    f"{self._previous[kind]} in the minute before")
        log.warning("%s (%d in all): %s%s", what, self.dead_letters[kind], example,
                    _fix_of(kind, example),
                    extra={"dead_letter_kind": kind, "dead_letters": count})
        self.warnings[why] += 1

    def _roll(self) -> float:
        """The current window, rolled over as time passes; returns the time."""
        now = self._clock()
        elapsed = now - self._window_start
        if elapsed >= self.interval:
            # (a window with no observation in it counts as quiet)
            self._previous = self._current if elapsed < 2 * self.interval else (
                collections.Counter())
            self._current = collections.Counter()
            self._surged.clear()
            self._window_start = now
            self._window_orphans = self._window_labels = 0
        return now

    def counts(self) -> dict[str, int]:
        return dict(self.dead_letters)

    # Labels that join nothing ------------------------------------------------------------------

    def adopt(self, tasks: typing.Iterable[typing.Any]) -> None:
        """Tasks restored (or made anew) for this worker: the labels their stores counted
        before are not this worker's."""
        for task in tasks:
            pending = task.pending
            self._labels_seen[task] = (pending.orphans,
                                       pending.orphans + pending.joined + pending.expired)

    def labels(self, task: typing.Any) -> None:
        """After a task call: the labels its pending store (`PendingLabels`) met since the last
        call (or since `adopt`), and the warning when most of a window's labels joined
        nothing."""
        pending = task.pending
        orphans = pending.orphans
        labels = orphans + pending.joined + pending.expired
        last = self._labels_seen.get(task)
        self._labels_seen[task] = (orphans, labels)
        if last is None:
            return  # a task not adopted: its counts so far are a baseline
        new_orphans, new_labels = orphans - last[0], labels - last[1]
        if not new_labels:
            return
        now = self._roll()
        self.orphans += new_orphans
        self._window_orphans += new_orphans
        self._window_labels += new_labels
        if (self._window_labels < ORPHAN_LABELS or 2 * self._window_orphans <= self._window_labels
                or (self._orphans_warned_at is not None
                    and now - self._orphans_warned_at < self.interval)):
            return
        self._orphans_warned_at = now
        waiting = next(iter(pending.entries), None)
        orphan = pending.last_orphan
        if waiting is None:
            cause = ("no event was waiting: the events come labelled already, or without an id "
                     "at --id-field, or after their labels (a label joins an event seen before "
                     "it), or on another partition than their labels")
        else:
            cause = (f"waiting events have ids such as {_example(waiting)}: the label topic's "
                     "ids differ in form, or come from another field")
        log.warning(
            "%d of the last %d delayed labels joined no waiting event (%d such orphan labels in "
            "all; one had the id %s): %s. Fix: --id-field naming the same id in the events and "
            "in the labels (ids join by value: 7 and \"7\" are one id), and the label records "
            "keyed as their events (the same partition)", self._window_orphans,
            self._window_labels, self.orphans, _example(orphan), cause,
            extra={"orphan_labels": self._window_orphans, "labels": self._window_labels})
        self.warnings["orphans"] += 1

    # Fields left out of the features -----------------------------------------------------------

    def left_out_fields(self, mapper: typing.Any) -> None:
        """After a task call: the fields the codec's mapper left out for the first time, in one
        WARNING (what each held, the option that silences it), and its counts."""
        self.left_out = mapper.left_out
        new = mapper.new_left_out
        if not new:
            return
        named = [f"{path} ({_LEFT_OUT_WORDS[kind]})" for path, kind in new]
        paths = ",".join(path for path, _ in new)
        hashing = any(kind == "long_string" for _, kind in new)
        new.clear()
        log.warning("fields left out of the features (they hold no feature; the records are "
                    "predicted without them): %s. To silence this: %s--exclude-features %s",
                    ", ".join(named)[:1000], "--categorical hash, or " if hashing else "",
                    paths[:500], extra={"left_out_fields": len(named)})
        self.warnings["left_out"] += 1


def _example(event_id: typing.Any) -> str:
    """An id as the warning quotes it: its JSON-ish text and type, bounded."""
    text = repr(event_id)
    if len(text) > 60:
        text = text[:60] + "..."
    return f"{text} ({type(event_id).__name__})"
