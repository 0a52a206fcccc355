"""Confluent's wire format: the frame a Schema Registry serializer puts around a payload.

    byte 0      magic byte 0
    bytes 1-4   the schema id, a big-endian signed 32-bit integer
    Protobuf    the message indexes: a zigzag varint count, then that many zigzag varints (the
                path of the message in the schema's file: [0] is the first top-level message,
                [1, 0] the first message nested in the second); the count 0 alone means [0]
    the rest    the payload (Avro binary, Protobuf, JSON text)

https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/index.html#wire-format
"""

from __future__ import annotations

import struct

from connectors.codec import DeadLetter

__all__ = ["WireFormatError", "MAGIC_BYTE", "frame", "schema_id_of", "message_indexes",
           "encode_message_indexes", "MAX_MESSAGE_INDEXES"]

MAGIC_BYTE = 0
#: More message indexes than this (a message nested this deep) are refused.
MAX_MESSAGE_INDEXES = 32
_HEADER = struct.Struct(">BI")


class WireFormatError(DeadLetter):
    """The value is not in Confluent's wire format (wrong magic byte, too short, bad message
    indexes)."""


def schema_id_of(value: bytes) -> int:
    """The schema id of a framed value, or `WireFormatError`."""
    if len(value) < 5:
        raise WireFormatError(f"a record of {len(value)} bytes: Confluent's wire format needs 5 "
                              "(magic byte 0 and a 4-byte schema id)")
    if value[0] != MAGIC_BYTE:
        raise WireFormatError(
            f"magic byte {value[0]} (expected 0): the record was not written by a Schema Registry "
            "serializer; check --value-format (json for plain JSON)")
    return _HEADER.unpack_from(value)[1]


def frame(schema_id: int, payload: bytes) -> bytes:
    """`payload` framed with `schema_id` (Avro and JSON Schema: no message indexes)."""
    return _HEADER.pack(MAGIC_BYTE, schema_id) + payload


def _varint(value: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(value):
            raise WireFormatError("the Protobuf message indexes are truncated")
        byte = value[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise WireFormatError("a Protobuf message index longer than ten bytes")


def message_indexes(value: bytes, start: int = 5) -> tuple[list[int], int]:
    """The Protobuf message indexes after the header and where the payload starts."""
    count, pos = _varint(value, start)
    if count == 0:
        return [0], pos
    if not 0 < count <= MAX_MESSAGE_INDEXES:
        raise WireFormatError(f"{count} Protobuf message indexes (at most "
                              f"{MAX_MESSAGE_INDEXES})")
    indexes = []
    for _ in range(count):
        index, pos = _varint(value, pos)
        if index < 0:
            raise WireFormatError(f"a negative Protobuf message index {index}")
        indexes.append(index)
    return indexes, pos


def encode_message_indexes(indexes: list[int]) -> bytes:
    """The message indexes as a serializer writes them ([0] as the single byte 0)."""
    if indexes == [0]:
        return b"\x00"
    out = bytearray()
    for number in (len(indexes), *indexes):
        number = (number << 1) ^ (number >> 63)
        while number > 0x7F:
            out.append((number & 0x7F) | 0x80)
            number >>= 7
        out.append(number)
    return bytes(out)
