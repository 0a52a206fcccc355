"""The contract of a decoded record, and the checks that turn bad records into dead letters.

A codec (`connectors.serializers`: JSON, Avro, Protobuf, JSON Schema, through a field mapping)
turns the raw value of a Kafka record into an *event* `(id, x, y)`:

- `x`: a dict of feature name -> finite real number (`True`: a category's indicator, see
  `connectors.serializers.mapping`), or `None` for a label record;
- `y`: the label, or `None` when the record carries no label: `True` / `False` for a binary
  model, the label as it came (a str, an int or a bool) for a multiclass one;
- `id`: the join key of delayed labels (a str or an int), or `None`.

Anything that cannot be decoded or validated raises `DeadLetter(reason)`, or one of its
subclasses that say what was wrong (`NullRecord`, `OversizedRecord`, `MalformedJSON`,
`InvalidRecord`, `InvalidFeature`, `InvalidLabel`, and the Schema Registry formats' own in
`connectors.serializers`): the worker sends the raw record to the dead-letter topic with the
reason and the class name in its headers, and goes on without touching the model.

Labels of a binary model (`multiclass=False`, the default) are true/false, 1/0 or 1/-1,
normalised to `True`/`False` so that metrics compare them with the predicted labels exactly as
River does (`_label`); with `--positive-label VALUE`, any two labels: VALUE is True, any other
False (`positive_label_of`). Labels of a multiclass model (`multiclass=True`: a natively multiclass
model, or a binary one wrapped one-vs-rest) are taken as they come: strings (at most
`MAX_LABEL_CHARS` characters), integers (64-bit) or booleans; a number with a zero fraction
(`2.0`) is the integer, as JSON does not tell them apart (`_multiclass_label`).

This module also gives kafka-python a compiled CRC-32C (`install_fast_crc32c`): the client checks
and computes a CRC-32C over every record batch, in pure Python unless the optional `crc32c`
package is installed, and that alone caps a consumer at ~10k records/s; and the errors of record
batches the client cannot decode (`install_batch_errors`).
"""

from __future__ import annotations

import json
import logging
import typing
from json.encoder import encode_basestring

import numpy as np

from streammargin.errors import StateError
from streammargin.jit.dispatch import njit

__all__ = [
    "DeadLetter",
    "NullRecord",
    "OversizedRecord",
    "MalformedJSON",
    "InvalidRecord",
    "InvalidFeature",
    "InvalidLabel",
    "MAX_LABEL_CHARS",
    "label_json",
    "positive_label_of",
    "label_to_state",
    "label_from_state",
    "install_fast_crc32c",
    "crc32c",
]

log = logging.getLogger(__name__)

Event = tuple[typing.Any, typing.Optional[dict], typing.Any]

# Labels of multiclass models: strings up to this length (a label is kept per class in the model,
# the metrics and every waiting event), integers of 64 bits (what Kafka's JSON consumers map to a
# long), booleans.
MAX_LABEL_CHARS = 256
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class DeadLetter(ValueError):
    """A record that cannot be processed; the message is the reason written to the dead letter.

    The subclasses say what was wrong; the dead letter's `__connect.errors.exception.class.name`
    header names the class, so a consumer of the dead-letter topic can route on it.
    """


class NullRecord(DeadLetter):
    """The record has no value (a tombstone)."""


class OversizedRecord(DeadLetter):
    """The record is larger than the codec's `max_record_bytes`."""


class MalformedJSON(DeadLetter):
    """The value is not JSON (or not UTF-8, or holds NaN/Infinity)."""


class InvalidRecord(DeadLetter):
    """Valid JSON, but not an event or a label record (not an object, bad id, missing x, ...)."""


class InvalidFeature(DeadLetter):
    """A feature value that is not a finite real number."""


class InvalidLabel(DeadLetter):
    """A label the model cannot take."""


def _short(value: typing.Any, limit: int = 100) -> str:
    """`repr(value)`, cut to `limit` characters: reasons quote names and values, which can be as
    long as the record."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def _label(y: typing.Any) -> bool | None:
    if y is True or y is False or y is None:
        return y
    if type(y) in (int, float):
        if y == 1:
            return True
        if y == 0 or y == -1:
            return False
    if type(y) is str and len(y) <= MAX_LABEL_CHARS:
        raise InvalidLabel(
            f"unknown label {_short(y)}: a binary model takes true/false, 1/0 or 1/-1. Fix: "
            f"--positive-label {_option_value(y)} if the topic has two labels (the other one is "
            "then the negative class), or a multiclass model for more classes (--model "
            "convexpolytope, or --one-vs-rest)")
    raise InvalidLabel(
        f"unknown label {_short(y)}: a binary model takes true/false, 1/0 or 1/-1; for more "
        "classes run a multiclass model (--model convexpolytope) or --one-vs-rest"
    )


def positive_label_of(positive: str) -> typing.Callable[[typing.Any], bool | None]:
    """The binary label of `--positive-label VALUE` (scikit-learn's `pos_label`): a label
    equal to VALUE is True, any other label False. Labels compare as their text: a string as
    it is, an integer (or a number with a zero fraction) as its decimal digits, a boolean as
    true/false; other values (a fraction, an array, ...) are `InvalidLabel`.

    A boolean label stays what it is (a topic of true/false labels needs no positive label).

    >>> label = positive_label_of("fraud")
    >>> label("fraud"), label("legit"), label(None), label(True)
    (True, False, None, True)
    >>> positive_label_of("2")(2), positive_label_of("2")(1.0)
    (True, False)
    """
    def label(y: typing.Any) -> bool | None:
        kind = type(y)
        if kind is str:
            return y == positive
        if y is None or kind is bool:
            return y
        if kind is float and y.is_integer() and abs(y) < 2.0 ** 63:
            y, kind = int(y), int
        if kind is int:
            return str(y) == positive
        raise InvalidLabel(f"label {_short(y)} of type {kind.__name__}: a label is a string, an "
                           f"integer or a boolean (--positive-label {_option_value(positive)} "
                           "compares their text)")

    return label


def _option_value(value: str) -> str:
    """A value as an option's argument in a reason: quoted for a shell where it must be, cut
    where long."""
    value = value if len(value) <= 60 else value[:60] + "..."
    if value and all(c.isalnum() or c in "-_.:/@+" for c in value):
        return value
    return "'" + value.replace("'", "'\\''") + "'"


def _multiclass_label(y: typing.Any) -> typing.Any:
    """A label of a multiclass model: a str, an int or a bool, as it came (see the module doc)."""
    kind = type(y)
    if kind is str:
        if len(y) > MAX_LABEL_CHARS:
            raise InvalidLabel(
                f"label {_short(y)} is longer than {MAX_LABEL_CHARS} characters"
            )
        return y
    if kind is float and y.is_integer():
        y = int(y)
        kind = int
    if kind is int:
        if not _INT64_MIN <= y <= _INT64_MAX:
            raise InvalidLabel(f"label {_short(y)} is beyond 64-bit integers")
        return y
    if kind is bool:
        return y
    raise InvalidLabel(
        f"label {_short(y)} of type {kind.__name__}: a label is a string, an integer or a boolean"
    )


def label_json(label: typing.Any) -> str:
    """A label as JSON text (`y_pred`, `y`); `null` for None."""
    if type(label) is str:
        return encode_basestring(label)
    if label is True:
        return "true"
    if label is False:
        return "false"
    if label is None:
        return "null"
    return json.dumps(label, allow_nan=False)


def label_to_state(label: typing.Any) -> typing.Any:
    """A label of the codec's types as a JSON value of a checkpoint (strings as they are)."""
    if type(label) is str:
        return label
    if type(label) is bool:
        return {"bool": label}
    return {"int": int(label)}


def label_from_state(data: typing.Any) -> typing.Any:
    """A label saved by `label_to_state`: only the types and bounds the codec produces, anything
    else raises `StateError` (a checkpoint is untrusted)."""
    if type(data) is str:
        if len(data) > MAX_LABEL_CHARS:
            raise StateError(f"a label of {len(data)} characters (at most {MAX_LABEL_CHARS})")
        return data
    if type(data) is dict and len(data) == 1:
        if type(data.get("bool")) is bool:
            return data["bool"]
        value = data.get("int")
        if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
            return value
    raise StateError(f"not a label: {_short(data, 60)}")


# CRC-32C of Kafka record batches ----------------------------------------------------------------


def _crc32c_table() -> np.ndarray:
    """Slicing-by-8 tables of the Castagnoli polynomial (reflected 0x82F63B78)."""
    table = np.zeros((8, 256), dtype=np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table[0, byte] = crc
    for k in range(1, 8):
        previous = table[k - 1]
        table[k] = (previous >> 8) ^ table[0, previous & 0xFF]
    return table


_CRC32C_TABLE = _crc32c_table()


@njit(cache=True, nogil=True)  # (numba imported only where crc32c is missing)
def _crc32c_bytes(data: np.ndarray, table: np.ndarray) -> int:
    crc = np.uint32(0xFFFFFFFF)
    n = data.shape[0]
    i = 0
    # Eight bytes per step through eight tables (Intel's slicing-by-8).
    while i + 8 <= n:
        low = crc ^ (
            np.uint32(data[i])
            | (np.uint32(data[i + 1]) << 8)
            | (np.uint32(data[i + 2]) << 16)
            | (np.uint32(data[i + 3]) << 24)
        )
        crc = (
            table[7, low & 0xFF]
            ^ table[6, (low >> 8) & 0xFF]
            ^ table[5, (low >> 16) & 0xFF]
            ^ table[4, low >> 24]
            ^ table[3, data[i + 4]]
            ^ table[2, data[i + 5]]
            ^ table[1, data[i + 6]]
            ^ table[0, data[i + 7]]
        )
        i += 8
    while i < n:
        crc = table[0, (crc ^ data[i]) & 0xFF] ^ (crc >> 8)
        i += 1
    return crc ^ np.uint32(0xFFFFFFFF)


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) of a buffer, as Kafka's record batch format uses it.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    """
    return int(_crc32c_bytes(np.frombuffer(data, dtype=np.uint8), _CRC32C_TABLE))


def install_fast_crc32c() -> str:
    """Make kafka-python checksum record batches with a compiled CRC-32C; returns which one.

    kafka-python uses the `crc32c` C extension when it is installed, and otherwise a pure-Python
    loop that costs ~85 ms per MB: on the embedded broker that caps consuming at ~10k records/s
    and producing at ~8k/s. This replaces the pure-Python function with the numba one above
    (~1.5 GB/s; 2.5x end to end) in kafka-python's record batch module. Idempotent.
    """
    from kafka.record import default_records, util

    if getattr(util, "crc32c_c", None) is not None:
        return "crc32c"
    if default_records.calc_crc32c is not crc32c:
        crc32c(b"warm up the compiled function")
        default_records.calc_crc32c = crc32c
    return "numba"


# Record batches the client cannot decode ----------------------------------------------------------

# Kafka's compression codes and what kafka-python needs installed to read each.
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
CODEC_PACKAGES = {"snappy": "python-snappy", "lz4": "lz4", "zstd": "zstandard"}


class UndecodableBatch(Exception):
    """A record batch of a partition that the Kafka client cannot decode.

    Raised out of `KafkaConsumer.poll` once `install_batch_errors()` has run. kafka-python's own
    errors here (`UnsupportedCodecError` for a missing codec library, `CorruptRecordError`, or
    whatever a decompressor raises on corrupt data) name neither the partition nor the offsets;
    this one does. `first_offset` is the first offset the consumer has not returned (its position
    for the partition), `next_offset` the offset after the batch (`None` when the batch header
    itself is unreadable), `codec` the batch's compression, `cause` the client's error.
    """

    def __init__(self, topic: str, partition: int, first_offset: int, next_offset: int | None,
                 codec: str, cause: BaseException):
        self.topic = topic
        self.partition = partition
        self.first_offset = first_offset
        self.next_offset = next_offset
        self.codec = codec
        self.cause = cause
        last = "?" if next_offset is None else next_offset - 1
        super().__init__(
            f"cannot decode the {codec} record batch of {topic}/{partition} at offsets "
            f"{first_offset}-{last}: {type(cause).__name__}: {str(cause)[:300]}"
        )

    @property
    def missing_library(self) -> bool:
        """True when the client lacks the codec's library (not corrupt data)."""
        from kafka.errors import UnsupportedCodecError

        return isinstance(self.cause, (UnsupportedCodecError, NotImplementedError))

    def fix(self) -> str:
        """What a person can do about it."""
        if self.missing_library:
            package = CODEC_PACKAGES.get(self.codec, self.codec)
            return (f"install the {self.codec} library ({package}; `pip install "
                    "'streammargin[kafka]'` installs every codec) and restart")
        return ("the batch is corrupt or uses a codec this client cannot read: restart with "
                "--on-undecodable skip to dead-letter it and go on")


class _TrackedRecords:
    """A fetched `MemoryRecords` that remembers the last batch handed out."""

    __slots__ = ("records", "batch")

    def __init__(self, records: typing.Any):
        self.records = records
        self.batch: typing.Any = None

    def next_batch(self) -> typing.Any:
        self.batch = self.records.next_batch()
        return self.batch

    def __getattr__(self, name: str) -> typing.Any:
        return getattr(self.records, name)


# Errors of code, not of data: a batch's bytes (compressed by any codec) make the decoders raise
# ValueError, TypeError, OSError, the codecs' own errors..., never these. They pass through the
# wrapper as they are (a worker's ImportError had read as "cannot decode the batch").
_BUGS = (ImportError, NameError, AttributeError)

# How the wrapper of `install_batch_errors` reads a partition's fetched batches: kafka-python's
# own reader, or the one the transport gives (`connectors.kafka.fetched_records.unpack_records`,
# called with kafka-python's as its fallback).
_unpack: typing.Callable | None = None


def install_batch_errors(unpack: typing.Callable | None = None) -> None:
    """Make kafka-python raise `UndecodableBatch` for a fetched batch it cannot decode.

    Without it, the client raises an error that names no partition or offset and, on the next
    `poll`, spins forever on the dead batch (kafka-python 3.0: a `PartitionRecords` whose
    iterator died is never drained). The wrapper around the fetcher's batch parser drains the
    partition's records, then raises with the partition, the offsets and the codec; the
    consumer's position stays at the first offset not returned, so the caller can fail, or seek
    past the batch. Inside it, `connectors.kafka.fetched_records` reads the batches (in C where
    it is built; a corrupt batch is then refused whole, where kafka-python returned its records
    before the corrupt one), when the transport gives it as `unpack`. An ImportError, NameError
    or AttributeError is a bug, not a batch: it passes through as it is. Idempotent.
    """
    from kafka.consumer.fetcher import Fetcher

    global _unpack
    if unpack is not None:
        _unpack = unpack
    partition_records = Fetcher.PartitionRecords
    original = partition_records._unpack_records
    if getattr(original, "_streammargin", False):
        return

    def _unpack_records(self, tp, records, *args, **kwargs):
        tracked = _TrackedRecords(records)
        try:
            if _unpack is None:
                yield from original(self, tp, tracked, *args, **kwargs)
            else:
                yield from _unpack(self, tp, tracked, original, *args, **kwargs)
        except _BUGS:
            raise  # ours or the client's: a bug fails loudly, it is not a batch to skip
        except Exception as error:
            first = max(self.next_fetch_offset, self.fetch_offset)
            batch = tracked.batch
            next_offset = getattr(batch, "next_offset", None) if batch is not None else None
            if next_offset is not None and next_offset <= first:
                next_offset = None  # the failure came before any batch header covering `first`
            codec = CODEC_NAMES.get(getattr(batch, "compression_type", -1), "unknown")
            # Done with these records: without this the fetcher keeps taking nothing from them.
            self.drain()
            raise UndecodableBatch(tp.topic, tp.partition, first, next_offset, codec,
                                   error) from error

    _unpack_records._streammargin = True  # type: ignore[attr-defined]
    _unpack_records._original = original  # type: ignore[attr-defined]  (kafka-python's reader)
    partition_records._unpack_records = _unpack_records
