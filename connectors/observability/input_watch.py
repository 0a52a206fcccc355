"""First contact: the worker's one WARNING when most of its first records go to dead letters
for one reason, naming the reason and the options that fix it, and its count of dead letters
by reason for the final summary.

A user who points the worker at a topic of another shape (a flat JSON topic read with the
envelope's defaults, an Avro topic read as JSON) would otherwise see every record dead-lettered
in silence. `InputWatch` watches the first `FIRST_RECORDS` records a worker processes: when
at least half of them are dead letters of one kind (`DEAD_LETTER_KINDS`), it logs once, with an
example reason (a record's own words: which fields it has, what it holds) and the fix.
"""

from __future__ import annotations

import collections
import logging
import typing

from connectors.observability.observability import dead_letter_kind_of, dead_letter_reason

__all__ = ["InputWatch", "FIRST_RECORDS", "FIXES"]

log = logging.getLogger("streammargin.kafka")

#: The records watched: enough to tell a stray bad record from a topic of another shape.
FIRST_RECORDS = 100

#: What fixes each kind of dead letter, when it is most of the first records.
FIXES = {
    "missing_features": "name the fields: --features '*' (every field) or --features PATH,..., "
                        "and --label-field and --id-field for the label and the id",
    "not_an_object": "a record must be an object of fields (a JSON object, an Avro record, a "
                     "Protobuf message)",
    "bad_features": "--features PATH.* must name an object of the record, or give '*'",
    "not_a_number": "--exclude-features PATH for fields that are no features (arrays, bytes, "
                    "free text), or --categorical hash for long strings",
    "non_finite": "the producer writes NaN or infinite numbers: exclude those fields "
                  "(--exclude-features PATH)",
    "bad_id": "--id-field naming a string or integer field (or --id-from-key)",
    "unknown_label": "--label-field naming the label; labels other than true/false, 1/0 need a "
                     "multiclass model (--model convexpolytope, or --one-vs-rest)",
    "unjoinable_label": "--id-field naming the id shared by an event and its label",
    "missing_label": "--label-field naming the label of the label topic's records",
    "bad_json": "if a Schema Registry serializer wrote the topic, --value-format avro, protobuf "
                "or json-schema with --schema-registry-url",
    "wire_format": "--value-format json if the topic holds plain JSON, else the format its "
                   "serializer writes",
    "unknown_schema": "--schema-registry-url of the registry the producers write to",
    "bad_schema": "--value-format matching the producers' serializer (avro, protobuf, "
                  "json-schema)",
    "bad_payload": "--value-format matching the producers' serializer",
    "oversized": "--max-record-bytes above the records' size",
    "null_value": "the topic holds tombstones (null values): they are never events",
    "rejected_by_model": "the model refuses the records (see the reason): check --model and "
                         "--param",
}


class InputWatch:
    """Counts of dead letters by kind, and the first-contact warning (see the module doc)."""

    def __init__(self, first_records: int = FIRST_RECORDS):
        self.first_records = first_records
        self.records = 0
        self.dead_letters: collections.Counter[str] = collections.Counter()
        self._early: collections.Counter[str] = collections.Counter()
        self._examples: dict[str, str] = {}
        self.warned: str | None = None

    def observe(self, processed: int, dead_letters: typing.Iterable[typing.Any]) -> None:
        """A task processed `processed` records, and these became dead letters."""
        early = self.records < self.first_records
        self.records += processed
        for record in dead_letters:
            kind = dead_letter_kind_of(record.headers)
            self.dead_letters[kind] += 1
            if early:
                self._early[kind] += 1
                self._examples.setdefault(kind, dead_letter_reason(record.headers))
        if early and self.records >= self.first_records:
            self.check()

    def check(self) -> None:
        """Warn (once) if most records seen so far among the first are one kind of dead
        letter; also called at the end, for a run of fewer records."""
        if self.warned is not None or not self._early:
            return
        # (the window ends with the task call that reached `first_records`: whole calls)
        seen = self.records or 1
        kind, count = self._early.most_common(1)[0]
        if 2 * count < seen:
            return
        self.warned = kind
        example = self._examples[kind][:500]
        fix = "" if "Fix:" in example else " Fix: " + FIXES.get(
            kind, "see the reason, and docs/kafka.md (\"What each bad input gets\")")
        log.warning("%d of the first %d records went to the dead-letter topic for one reason "
                    "(%s): %s%s", count, seen, kind, example, fix,
                    extra={"dead_letter_kind": kind, "dead_letters": count, "records": seen})

    def counts(self) -> dict[str, int]:
        return dict(self.dead_letters)
