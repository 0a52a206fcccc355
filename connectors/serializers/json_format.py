"""JSON records: `JSONCodec`, any JSON object through a `FieldMapping` (the envelope by default).

A record's value is parsed into the tree (`json_tree`), and the mapping turns the tree into the
event. The mapping's defaults read the project's envelope::

    {"id": "a1", "x": {"amount": 12.5, "n_items": 3}, "y": true}    labelled event
    {"id": "a2", "x": {"amount": 3.0, "n_items": 1}}                 event waiting for its label
    {"id": "a2", "y": false}                                         the label, later

and `--features '*' --label-field is_fraud --id-field transaction_id` reads a flat topic::

    {"transaction_id": "t7", "amount": 31.2, "country": "BR", "is_fraud": true}

Parsing is msgspec's when it is installed (the kafka extra installs it), which is C: for the
envelope it decodes straight into the contract's three typed fields (`_EventFields`, ~0.7 us
against ~4 us for json.loads and the checks at 10 features), for any other mapping into the tree.
Only what both parsers read the same way gets through msgspec (the tests compare them): anything
it refuses (a lone surrogate, a number beyond float64, deep nesting, bad JSON, a float label, a
field beyond the envelope's) goes on to the standard library's parser, which accepts or refuses
it and names what was wrong.
"""

from __future__ import annotations

import json
import typing

from connectors.codec import (
    DeadLetter,
    MalformedJSON,
    NullRecord,
    OversizedRecord,
)
from connectors.serializers.mapping import FieldMapping

try:
    import msgspec
except ImportError:  # (the kafka extra installs it) every record takes the json path
    msgspec = None

__all__ = ["JSONCodec", "json_tree", "check_size"]

Event = tuple[typing.Any, typing.Optional[dict], typing.Any]


def _non_finite(constant: str) -> typing.NoReturn:
    raise MalformedJSON(f"non-finite number {constant} (NaN and infinities are not allowed)")


def check_size(value: bytes | None, max_record_bytes: int) -> None:
    """The checks of every format before any parsing: a value, of at most `max_record_bytes`."""
    if value is None:
        raise NullRecord("empty record (null value)")
    if len(value) > max_record_bytes:
        raise OversizedRecord(
            f"oversized record: {len(value)} bytes > max_record_bytes={max_record_bytes}"
        )


# One decoder for every record: json.loads(..., parse_constant=...) would build a new decoder per
# call.
_decode_text = json.JSONDecoder(parse_constant=_non_finite).decode


def _json_text(value: bytes | memoryview) -> typing.Any:
    try:
        return _decode_text(bytes(value).decode())
    except DeadLetter:
        raise
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise MalformedJSON(f"bad JSON: {error}") from None


if msgspec is not None:

    class _EventFields(msgspec.Struct, forbid_unknown_fields=True):
        """The fields of the envelope as msgspec decodes them; only values of these types
        get through. Every field is decoded, `ts` included: msgspec skips an unknown field
        without checking it as json.loads does (its UTF-8, its escapes), so a record with
        another field takes the json path."""

        id: str | int | None = None
        x: dict[str, int | float] | None = None
        y: bool | int | str | None = None
        ts: typing.Any = None

    # What msgspec raises for a record it will not read the way json.loads does (its
    # ValidationError is a DecodeError): the record then takes the json path, which decides.
    _FAST_PATH_MISSES: tuple = (msgspec.DecodeError, RecursionError, UnicodeDecodeError)
    _decode_any = msgspec.json.Decoder().decode


def json_tree(value: bytes | memoryview) -> typing.Any:
    """The tree of a JSON document (dicts, lists, str, int, float, bool, None), or
    `MalformedJSON`: msgspec's parse where it reads the document as json.loads does, else
    json.loads' (see the module doc)."""
    if msgspec is not None:
        try:
            return _decode_any(value)
        except _FAST_PATH_MISSES:
            pass
    return _json_text(value)


class JSONCodec:
    """JSON records through a field mapping: the envelope `{"id", "x", "y"}` by default.

    Parameters
    ----------
    max_record_bytes
        Records larger than this are dead letters ("oversized record"), before any parsing.
    multiclass
        False: binary labels, normalised to True/False. True: labels as they come (strings,
        integers, booleans).
    mapping
        Where the id, label and features are (`connectors.serializers.mapping.FieldMapping`);
        default: the envelope's.

    Examples
    --------

    >>> codec = JSONCodec()
    >>> codec.decode(b'{"id": "a1", "x": {"amount": 12.5, "n": 3}, "y": 1}')
    ('a1', {'amount': 12.5, 'n': 3}, True)
    >>> codec.decode(b'{"id": 7, "y": -1}')
    (7, None, False)
    >>> codec.decode(b'{"x": {"amount": 3.5, "country": "BR", "vip": true}}')
    (None, {'amount': 3.5, 'country=BR': True, 'vip': 1}, None)
    >>> codec.decode(b'{"x": {"amount": 1.5, "tags": ["a"]}}')  # (not a feature: left out)
    (None, {'amount': 1.5}, None)
    >>> try:
    ...     codec.decode(b'{"x": {"amount": 3.5}, "y": "fraud"}')
    ... except DeadLetter as error:
    ...     print(type(error).__name__)
    InvalidLabel
    >>> JSONCodec(multiclass=True).decode(b'{"x": {"a": 1.0}, "y": "sky"}')
    (None, {'a': 1.0}, 'sky')
    >>> flat = JSONCodec(mapping=FieldMapping(label_field="is_fraud", id_field="tx",
    ...                                       features=("*",)))
    >>> flat.decode(b'{"tx": "t7", "amount": 31.2, "country": "BR", "is_fraud": false}')
    ('t7', {'amount': 31.2, 'country=BR': True}, False)

    """

    name = "json"

    def __init__(self, max_record_bytes: int = 1 << 20, multiclass: bool = False,
                 mapping: FieldMapping | None = None):
        if max_record_bytes <= 0:
            raise ValueError(f"max_record_bytes must be positive, got {max_record_bytes!r}")
        self.max_record_bytes = max_record_bytes
        self.multiclass = bool(multiclass)
        if mapping is None:
            mapping = FieldMapping(multiclass=self.multiclass)
        elif mapping.multiclass != self.multiclass:
            raise ValueError("the mapping's multiclass must be the codec's")
        self.mapping = mapping
        self.mapper = mapping.mapper()
        #: Whether `decode` needs the record's key (`--id-from-key`).
        self.reads_key = mapping.id_from_key
        #: Whether events may hold category indicators (features of value True).
        self.emits_indicators = mapping.categorical != "drop"
        self._label = mapping.label_function()
        # The envelope's typed fields, straight from msgspec: for the default mapping only.
        self._decode_fields = (
            msgspec.json.Decoder(_EventFields).decode
            if msgspec is not None and mapping.is_default else None
        )

    def decode(self, value: bytes | None, key: bytes | None = None) -> Event:
        """`(id, x, y)` of a record value (and key, with `--id-from-key`), or a `DeadLetter`."""
        check_size(value, self.max_record_bytes)
        decode_fields = self._decode_fields
        if decode_fields is not None:
            try:
                fields = decode_fields(value)
            except _FAST_PATH_MISSES:
                pass  # the json path below accepts or refuses it, and says why
            else:
                event = self._envelope_event(fields.id, fields.x, fields.y)
                if event is not None:
                    self.mapper.indicators = 0  # (numbers only)
                    return event
            # Not the envelope's typed fields (a string feature, say): the tree, as for any
            # mapping (msgspec's, or the standard library's for what msgspec refuses).
        return self.mapper.event(json_tree(value), key)

    def decode_label(self, value: bytes | None, key: bytes | None = None) -> tuple:
        """`(id, y)` of a record of the label topic (`--label-topic`), or a `DeadLetter`."""
        check_size(value, self.max_record_bytes)
        return self.mapper.label(json_tree(value), key)

    def _envelope_event(self, event_id: typing.Any, x: dict | None, y: typing.Any) -> Event | None:
        """The event of the envelope's typed fields, or None where the mapping must decide
        (a dead letter, whose reason it words)."""
        if y is not None and y is not True and y is not False:
            try:
                y = self._label(y)
            except DeadLetter:
                return None
        if x is None:
            if y is None or event_id is None:
                return None
            return event_id, None, y
        # msgspec refuses NaN, infinities and floats beyond float64, but takes integers of any
        # size: `float` of the sum overflows on one beyond float64. Finite values whose sum
        # overflows take the mapping too, which names any culprit (and finds none).
        try:
            total = float(sum(x.values()))
            if total - total != 0.0:
                return None
        except OverflowError:
            return None
        return event_id, x, y

    def __repr__(self) -> str:
        return (f"JSONCodec(max_record_bytes={self.max_record_bytes}, "
                f"multiclass={self.multiclass}, mapping={self.mapping!r})")
