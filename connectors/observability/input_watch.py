"""What the worker says about the input it cannot use: nothing is lost in silence.

- **First contact.** A user who points the worker at a topic of another shape (a flat JSON topic
  read with the envelope's defaults, an Avro topic read as JSON) would see every record
  dead-lettered. Over its first `FIRST_RECORDS` records, when at least half are dead letters of
  one kind (`DEAD_LETTER_KINDS`), one WARNING gives an example reason (a record's own words:
  which fields it has, what it holds) and the fix.
- **Fields left out of the features** (values that cannot be features, reached by a wildcard:
  `connectors.serializers.mapping`): one WARNING names the fields newly left out, what each
  held and the option that silences it.

The counts (dead letters by kind, fields left out by kind) go to the final summary; /metrics has
them too (`connectors/observability/observability.py`).
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
    "not_a_number": "take the field out of --features: it names a field that holds no feature "
                    "(an array, bytes, free text; a wildcard leaves such fields out)",
    "non_finite": "the producer writes NaN or infinite numbers in a field --features names: "
                  "take it out of --features (a wildcard leaves such values out)",
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

#: What a field left out held, in a sentence.
_LEFT_OUT_WORDS = {
    "array": "an array",
    "bytes": "bytes",
    "long_string": "a string too long for a category",
    "non_finite": "NaN, an infinity or a number beyond float64",
}


class InputWatch:
    """Counts of what the worker could not use, and its warnings (see the module doc)."""

    def __init__(self, first_records: int = FIRST_RECORDS):
        self.first_records = first_records
        self.records = 0
        self.dead_letters: collections.Counter[str] = collections.Counter()
        self._early: collections.Counter[str] = collections.Counter()
        self._examples: dict[str, str] = {}
        #: The kind the first-contact warning named (None: none yet).
        self.warned: str | None = None
        #: Fields left out of the features, by kind (the mapper's counts).
        self.left_out: dict[str, int] = {}
        #: WARNING lines so far, by what they were about ("first_contact", "left_out").
        self.warnings: collections.Counter[str] = collections.Counter()

    # Dead letters -----------------------------------------------------------------------------

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
        self.warnings["first_contact"] += 1

    def counts(self) -> dict[str, int]:
        return dict(self.dead_letters)

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
