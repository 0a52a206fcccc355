"""Protobuf: schemas from a Schema Registry, and a bounded decoder of the wire format.

A registry holds a Protobuf schema as `.proto` text (Confluent's registry answers with text) or
as the base64 of a serialized `FileDescriptorProto` (what confluent-kafka's serializer registers,
and what Apicurio gives back as it was stored). Both are parsed here into the same descriptor
tree, without protoc and without the protobuf runtime: the text by a parser of the `.proto`
language (proto2, proto3, editions read as proto2), the binary by this module's own decoder
over a description of `descriptor.proto`'s messages (`_DESCRIPTOR_PROTO`). Imports come from the
schema's references, or are the well-known types (`google/protobuf/timestamp.proto`, ...,
which serializers do not register).

Everything is untrusted and bounded: a schema of at most `max_bytes` (the registry's bound), at
most `MAX_TYPES` messages and enums and `MAX_FIELDS` fields, nested at most `MAX_DEPTH`; a payload
read with every length checked against what is left, varints of at most ten bytes, groups
(deprecated) and unknown wire types refused, messages nested at most `MAX_DEPTH`. Repeated items
each take a byte or more on the wire, so a payload cannot make more of them than it has bytes.

The tree a payload decodes into (`ProtobufReader.tree`), as for the other formats: a message is
a dict of its fields by name; repeated fields are lists; map fields dicts; enums their value's
name (the number as text for a value the schema does not know); `google.protobuf.Timestamp` and
`Duration` milliseconds; the wrappers (`DoubleValue`, ...) their value; `Struct`, `Value` and
`ListValue` the JSON they hold. Presence follows the schema: a proto3 field without `optional`
that is not on the wire has its default (0, false, the enum's first value: a proto3 serializer
leaves those out), except strings and bytes, which are then absent (an empty id is no id); a
field with presence (proto2, `optional`, a message, a oneof member) that is not on the wire is
absent.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
import typing

from connectors.serializers import wire
from connectors.serializers.mapping import EventMapper

__all__ = [
    "ProtobufSchemaError",
    "ProtobufDataError",
    "ProtobufReader",
    "parse_file",
    "ProtoFile",
    "message_at",
    "holds_no_feature",
    "MAX_DEPTH",
]

MAX_DEPTH = 32
MAX_TYPES = 5_000
MAX_FIELDS = 50_000
MAX_FILES = 64
_MAX_FIELD_NUMBER = (1 << 29) - 1


class ProtobufSchemaError(ValueError):
    """A schema that is not Protobuf, or that this parser refuses (too large, unresolved types)."""


class ProtobufDataError(ValueError):
    """A payload that does not decode with its message."""


# Types --------------------------------------------------------------------------------------------

# FieldDescriptorProto.Type
_DOUBLE, _FLOAT, _INT64, _UINT64, _INT32, _FIXED64, _FIXED32, _BOOL, _STRING, _GROUP, _MESSAGE, \
    _BYTES, _UINT32, _ENUM, _SFIXED32, _SFIXED64, _SINT32, _SINT64 = range(1, 19)
_SCALARS = {
    "double": _DOUBLE, "float": _FLOAT, "int64": _INT64, "uint64": _UINT64, "int32": _INT32,
    "fixed64": _FIXED64, "fixed32": _FIXED32, "bool": _BOOL, "string": _STRING, "bytes": _BYTES,
    "uint32": _UINT32, "sfixed32": _SFIXED32, "sfixed64": _SFIXED64, "sint32": _SINT32,
    "sint64": _SINT64,
}
# The wire type each field type is written with (packed repeated scalars: 2, length-delimited).
_WIRE_TYPES = {
    _DOUBLE: 1, _FLOAT: 5, _INT64: 0, _UINT64: 0, _INT32: 0, _FIXED64: 1, _FIXED32: 5, _BOOL: 0,
    _STRING: 2, _MESSAGE: 2, _BYTES: 2, _UINT32: 0, _ENUM: 0, _SFIXED32: 5, _SFIXED64: 1,
    _SINT32: 0, _SINT64: 0,
}
_OPTIONAL, _REQUIRED, _REPEATED = 1, 2, 3
_F32, _F64 = struct.Struct("<f"), struct.Struct("<d")
_I32, _I64 = struct.Struct("<i"), struct.Struct("<q")
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class Enum:
    __slots__ = ("full_name", "names", "default")

    def __init__(self, full_name: str):
        self.full_name = full_name
        self.names: dict[int, str] = {}
        self.default: str | None = None


class Field:
    __slots__ = ("name", "number", "type", "repeated", "presence", "message", "enum",
                 "type_name", "oneof")

    def __init__(self, name: str, number: int, kind: int, repeated: bool, presence: bool,
                 type_name: str, oneof: bool):
        self.name = name
        self.number = number
        self.type = kind
        self.repeated = repeated
        self.presence = presence  # explicit presence: absent when not on the wire
        self.message: Message | None = None
        self.enum: Enum | None = None
        self.type_name = type_name
        self.oneof = oneof


class Message:
    __slots__ = ("full_name", "fields", "by_name", "map_entry", "nested", "defaults")

    def __init__(self, full_name: str, map_entry: bool):
        self.full_name = full_name
        self.fields: dict[int, Field] = {}
        self.by_name: dict[str, Field] = {}
        self.map_entry = map_entry
        self.nested: list[Message] = []
        # (name, default) of the fields without presence: set when not on the wire.
        self.defaults: list[tuple[str, typing.Any]] = []


class ProtoFile(typing.NamedTuple):
    """A parsed schema: its top-level messages in order (the message indexes' first level)."""

    name: str
    messages: list[Message]


# The wire format ----------------------------------------------------------------------------------


def _truncated() -> typing.NoReturn:
    raise ProtobufDataError("the payload ends inside a field (truncated)")


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos >= end:
        _truncated()
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            _truncated()
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result >> 64:
                raise ProtobufDataError("a varint beyond 64 bits")
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufDataError("a varint longer than ten bytes")


def _signed(value: int, bits: int) -> int:
    """A varint as the two's complement of `bits` bits (int32 and int64 are sign-extended)."""
    value &= (1 << 64) - 1
    if bits == 32:
        value &= 0xFFFFFFFF
        return value - (1 << 32) if value >> 31 else value
    return value - (1 << 64) if value >> 63 else value


def _scalar(kind: int, data: bytes, pos: int, end: int, wire_type: int) -> tuple[typing.Any, int]:
    """One value of a scalar field at `pos` (its wire type checked by the caller)."""
    if wire_type == 0:
        value, pos = _varint(data, pos, end)
        if kind == _INT64:
            return _signed(value, 64), pos
        if kind == _INT32 or kind == _ENUM:
            return _signed(value, 32), pos
        if kind == _UINT32:
            return value & 0xFFFFFFFF, pos
        if kind == _UINT64:
            return value, pos
        if kind == _BOOL:
            return value != 0, pos
        if kind == _SINT32 or kind == _SINT64:
            return (value >> 1) ^ -(value & 1), pos
        raise AssertionError(kind)
    size = 8 if wire_type == 1 else 4
    if pos + size > end:
        _truncated()
    unpack = {_DOUBLE: _F64, _FIXED64: _U64, _SFIXED64: _I64, _FLOAT: _F32, _FIXED32: _U32,
              _SFIXED32: _I32}[kind]
    return unpack.unpack_from(data, pos)[0], pos + size


def _skip(data: bytes, pos: int, end: int, wire_type: int) -> int:
    if wire_type == 0:
        return _varint(data, pos, end)[1]
    if wire_type == 1:
        pos += 8
    elif wire_type == 5:
        pos += 4
    elif wire_type == 2:
        length, pos = _varint(data, pos, end)
        if length > end - pos:
            _truncated()
        pos += length
    elif wire_type in (3, 4):
        raise ProtobufDataError("a group (deprecated wire types 3 and 4): not supported")
    else:
        raise ProtobufDataError(f"an unknown wire type {wire_type}")
    if pos > end:
        _truncated()
    return pos


def _decode(message: Message, data: bytes, pos: int, end: int, depth: int) -> dict:
    """The dict of one message's fields in data[pos:end]."""
    if depth >= MAX_DEPTH:
        raise ProtobufDataError(f"messages nested deeper than {MAX_DEPTH} levels")
    fields = message.fields
    out: dict[str, typing.Any] = {}
    while pos < end:
        tag, pos = _varint(data, pos, end)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise ProtobufDataError("a field number 0")
        field = fields.get(number)
        if field is None:
            pos = _skip(data, pos, end, wire_type)
            continue
        kind = field.type
        expected = _WIRE_TYPES[kind]
        if field.repeated and wire_type == 2 and expected != 2:
            # A packed run of scalars.
            length, pos = _varint(data, pos, end)
            stop = pos + length
            if stop > end:
                _truncated()
            items = out.setdefault(field.name, [])
            while pos < stop:
                value, pos = _scalar(kind, data, pos, stop, expected)
                items.append(_enum_name(field, value) if kind == _ENUM else value)
            if pos != stop:
                _truncated()
            continue
        if wire_type != expected:
            raise ProtobufDataError(f"field {field.name!r} (number {number}) has wire type "
                                    f"{wire_type}, its type is written with {expected}")
        if expected == 2:
            length, pos = _varint(data, pos, end)
            stop = pos + length
            if stop > end:
                _truncated()
            if kind == _MESSAGE:
                value = _message_value(field.message, data, pos, stop, depth + 1)  # type: ignore
            elif kind == _STRING:
                try:
                    value = data[pos:stop].decode()
                except UnicodeDecodeError:
                    raise ProtobufDataError(f"field {field.name!r} is not UTF-8") from None
            else:
                value = data[pos:stop]
            pos = stop
        else:
            value, pos = _scalar(kind, data, pos, end, wire_type)
            if kind == _ENUM:
                value = _enum_name(field, value)
        if field.repeated:
            if field.message is not None and field.message.map_entry:
                entry = value if type(value) is dict else {}
                key = entry.get("key")
                mapped = out.setdefault(field.name, {})
                mapped[_map_key(key)] = entry.get("value")
            else:
                out.setdefault(field.name, []).append(value)
        elif kind == _MESSAGE and type(out.get(field.name)) is dict and type(value) is dict:
            out[field.name] = {**out[field.name], **value}  # a message given twice merges
        else:
            out[field.name] = value
    if pos != end:
        _truncated()
    for name, default in message.defaults:
        if name not in out:
            out[name] = default
    return out


def _enum_name(field: Field, number: int) -> str:
    names = field.enum.names  # type: ignore[union-attr]
    name = names.get(number)
    return str(number) if name is None else name


def _map_key(key: typing.Any) -> str:
    """A map key as the tree's dict key (a string, as in JSON)."""
    if key is None:
        return ""
    if type(key) is bool:
        return "true" if key else "false"
    return key if type(key) is str else str(key)


def _message_value(message: Message, data: bytes, pos: int, end: int, depth: int) -> typing.Any:
    value = _decode(message, data, pos, end, depth)
    special = _WELL_KNOWN.get(message.full_name)
    return value if special is None else special(value)


# Well-known types ---------------------------------------------------------------------------------

_WELL_KNOWN_FILES = {
    "google/protobuf/timestamp.proto":
        'syntax = "proto3"; package google.protobuf; '
        "message Timestamp { int64 seconds = 1; int32 nanos = 2; }",
    "google/protobuf/duration.proto":
        'syntax = "proto3"; package google.protobuf; '
        "message Duration { int64 seconds = 1; int32 nanos = 2; }",
    "google/protobuf/empty.proto":
        'syntax = "proto3"; package google.protobuf; message Empty {}',
    "google/protobuf/wrappers.proto":
        'syntax = "proto3"; package google.protobuf; '
        "message DoubleValue { double value = 1; } message FloatValue { float value = 1; } "
        "message Int64Value { int64 value = 1; } message UInt64Value { uint64 value = 1; } "
        "message Int32Value { int32 value = 1; } message UInt32Value { uint32 value = 1; } "
        "message BoolValue { bool value = 1; } message StringValue { string value = 1; } "
        "message BytesValue { bytes value = 1; }",
    "google/protobuf/struct.proto":
        'syntax = "proto3"; package google.protobuf; '
        "message Struct { map<string, Value> fields = 1; } "
        "message Value { oneof kind { NullValue null_value = 1; double number_value = 2; "
        "string string_value = 3; bool bool_value = 4; Struct struct_value = 5; "
        "ListValue list_value = 6; } } "
        "enum NullValue { NULL_VALUE = 0; } "
        "message ListValue { repeated Value values = 1; }",
}


def _milliseconds(value: dict) -> float | int:
    seconds, nanos = value.get("seconds", 0), value.get("nanos", 0)
    return seconds * 1000 + nanos // 1_000_000 if nanos % 1_000_000 == 0 else \
        seconds * 1000 + nanos / 1e6


def _struct_value(value: dict) -> typing.Any:
    for name in ("number_value", "string_value", "bool_value", "struct_value", "list_value"):
        if name in value:
            return value[name]
    return None  # null_value, or nothing set


# (by full name, as the builder keeps them: with a leading dot)
_WELL_KNOWN: dict[str, typing.Callable[[dict], typing.Any]] = {
    ".google.protobuf.Timestamp": _milliseconds,
    ".google.protobuf.Duration": _milliseconds,
    ".google.protobuf.Struct": lambda value: value.get("fields", {}),
    ".google.protobuf.Value": _struct_value,
    ".google.protobuf.ListValue": lambda value: value.get("values", []),
    **{f".google.protobuf.{name}Value": (lambda value: value.get("value"))
       for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String",
                    "Bytes")},
}


# The .proto language ------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?
                |inf|nan)(?![\w.]))
  | (?P<ident>\.?[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)
  | (?P<symbol>[{}\[\]()<>=;,:])
""", re.VERBOSE | re.DOTALL)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ProtobufSchemaError(f"unexpected {text[pos:pos + 20]!r} in the .proto text")
        kind = match.lastgroup
        if kind != "space":
            tokens.append((kind, match.group()))  # type: ignore[arg-type]
        pos = match.end()
    return tokens


class _TextParser:
    """.proto text -> the tree of a FileDescriptorProto (the shape `_build` reads)."""

    def __init__(self, text: str, name: str):
        self.tokens = _tokens(text)
        self.pos = 0
        self.name = name
        self.types = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        if self.pos >= len(self.tokens):
            raise ProtobufSchemaError(f"{self.name}: the .proto text ends early")
        token = self.tokens[self.pos][1]
        if expected is not None and token != expected:
            raise ProtobufSchemaError(f"{self.name}: expected {expected!r}, found {token[:40]!r}")
        self.pos += 1
        return token

    def kind(self) -> str:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else ""

    def string(self) -> str:
        if self.kind() != "string":
            raise ProtobufSchemaError(f"{self.name}: expected a string, found {self.peek()!r:.40}")
        text = self.take()[1:-1]
        return re.sub(r"\\(.)", r"\1", text)

    def skip_statement(self) -> None:
        """To the end of a statement (its `;`) or of a block, with balanced brackets."""
        depth = 0
        while True:
            token = self.take()
            if token in "{[(<" and len(token) == 1:
                depth += 1
            elif token in "}])>" and len(token) == 1:
                depth -= 1
                if depth == 0 and token == "}":
                    return
            elif token == ";" and depth == 0:
                return

    def file(self) -> dict:
        tree: dict[str, typing.Any] = {"name": self.name, "package": "", "dependency": [],
                                       "message_type": [], "enum_type": [], "syntax": "proto2"}
        while self.peek() is not None:
            token = self.take()
            if token == "syntax":
                self.take("=")
                tree["syntax"] = self.string()
                self.take(";")
            elif token == "edition":
                self.take("=")
                self.string()
                tree["syntax"] = "editions"
                self.take(";")
            elif token == "package":
                tree["package"] = self.take()
                self.take(";")
            elif token == "import":
                if self.peek() in ("public", "weak"):
                    self.take()
                tree["dependency"].append(self.string())
                self.take(";")
            elif token == "message":
                tree["message_type"].append(self.message(tree["syntax"]))
            elif token == "enum":
                tree["enum_type"].append(self.enum())
            elif token in ("option", "extend", "service"):
                self.skip_statement()
            elif token != ";":
                raise ProtobufSchemaError(f"{self.name}: unexpected {token[:40]!r} at the top "
                                          "level")
        return tree

    def count_type(self) -> None:
        self.types += 1
        if self.types > MAX_TYPES:
            raise ProtobufSchemaError(f"{self.name}: more than {MAX_TYPES} messages and enums")

    def message(self, syntax: str) -> dict:
        self.count_type()
        node: dict[str, typing.Any] = {"name": self.take(), "field": [], "nested_type": [],
                                       "enum_type": [], "oneof_decl": [], "options": {}}
        self.take("{")
        self.body(node, syntax, None)
        return node

    def body(self, node: dict, syntax: str, oneof: int | None) -> None:
        while True:
            token = self.peek()
            if token == "}":
                self.take()
                return
            if token is None:
                raise ProtobufSchemaError(f"{self.name}: a message without its closing brace")
            if oneof is None and token == "message":
                self.take()
                node["nested_type"].append(self.message(syntax))
            elif oneof is None and token == "enum":
                self.take()
                node["enum_type"].append(self.enum())
            elif oneof is None and token == "oneof":
                self.take()
                node["oneof_decl"].append({"name": self.take()})
                self.take("{")
                self.body(node, syntax, len(node["oneof_decl"]) - 1)
            elif token in ("option", "reserved", "extensions", "extend"):
                self.take()
                self.skip_statement()
            elif token == ";":
                self.take()
            elif token == "map":
                self.take()
                self.map_field(node)
            else:
                self.field(node, syntax, oneof)

    def field(self, node: dict, syntax: str, oneof: int | None) -> None:
        label = _OPTIONAL
        proto3_optional = False
        if self.peek() in ("repeated", "optional", "required"):
            word = self.take()
            label = {"repeated": _REPEATED, "optional": _OPTIONAL, "required": _REQUIRED}[word]
            proto3_optional = word == "optional" and syntax == "proto3"
        type_word = self.take()
        if type_word == "group":
            raise ProtobufSchemaError(f"{self.name}: groups (deprecated) are not supported")
        name = self.take()
        self.take("=")
        number = self.number()
        field = {"name": name, "number": number, "label": label}
        if type_word in _SCALARS:
            field["type"] = _SCALARS[type_word]
        else:
            field["type_name"] = type_word
        if oneof is not None:
            field["oneof_index"] = oneof
        if proto3_optional:
            field["proto3_optional"] = True
        if self.peek() == "[":
            self.skip_options()
        self.take(";")
        node["field"].append(field)

    def map_field(self, node: dict) -> None:
        self.take("<")
        key_type = self.take()
        self.take(",")
        value_type = self.take()
        self.take(">")
        name = self.take()
        self.take("=")
        number = self.number()
        if self.peek() == "[":
            self.skip_options()
        self.take(";")
        if key_type not in _SCALARS or key_type in ("double", "float", "bytes"):
            raise ProtobufSchemaError(f"{self.name}: map key type {key_type!r}")
        self.count_type()
        entry_name = "".join(part[:1].upper() + part[1:] for part in name.split("_")) + "Entry"
        value = ({"type": _SCALARS[value_type]} if value_type in _SCALARS
                 else {"type_name": value_type})
        node["nested_type"].append({
            "name": entry_name, "nested_type": [], "enum_type": [], "oneof_decl": [],
            "options": {"map_entry": True},
            "field": [{"name": "key", "number": 1, "label": _OPTIONAL,
                       "type": _SCALARS[key_type]},
                      {"name": "value", "number": 2, "label": _OPTIONAL, **value}],
        })
        node["field"].append({"name": name, "number": number, "label": _REPEATED,
                              "type_name": entry_name})

    def skip_options(self) -> None:
        depth = 0
        while True:
            token = self.take()
            if token == "[":
                depth += 1
            elif token == "]":
                depth -= 1
                if depth == 0:
                    return

    def number(self) -> int:
        token = self.take()
        try:
            return int(token, 0)
        except ValueError:
            raise ProtobufSchemaError(f"{self.name}: {token[:40]!r} is not a number") from None

    def enum(self) -> dict:
        self.count_type()
        node: dict[str, typing.Any] = {"name": self.take(), "value": []}
        self.take("{")
        while True:
            token = self.take()
            if token == "}":
                return node
            if token in ("option", "reserved"):
                self.skip_statement()
            elif token != ";":
                self.take("=")
                number = self.number()
                if self.peek() == "[":
                    self.skip_options()
                self.take(";")
                node["value"].append({"name": token, "number": number})


# descriptor.proto's messages, as this decoder reads them -----------------------------------------


def _meta() -> Message:
    """FileDescriptorProto and what it holds, as far as a schema needs (descriptor.proto)."""

    def message(name: str, fields: list[tuple]) -> Message:
        built = Message(f"google.protobuf.{name}", False)
        for field_name, number, kind, repeated in fields:
            field = Field(field_name, number, kind, repeated, True, "", False)
            built.fields[number] = field
        return built

    options = message("MessageOptions", [("map_entry", 7, _BOOL, False)])
    oneof = message("OneofDescriptorProto", [("name", 1, _STRING, False)])
    value = message("EnumValueDescriptorProto", [("name", 1, _STRING, False),
                                                 ("number", 2, _INT32, False)])
    enum = message("EnumDescriptorProto", [("name", 1, _STRING, False),
                                           ("value", 2, _MESSAGE, True)])
    enum.fields[2].message = value
    field = message("FieldDescriptorProto", [
        ("name", 1, _STRING, False), ("number", 3, _INT32, False), ("label", 4, _INT32, False),
        ("type", 5, _INT32, False), ("type_name", 6, _STRING, False),
        ("oneof_index", 9, _INT32, False), ("proto3_optional", 17, _BOOL, False)])
    descriptor = message("DescriptorProto", [
        ("name", 1, _STRING, False), ("field", 2, _MESSAGE, True),
        ("nested_type", 3, _MESSAGE, True), ("enum_type", 4, _MESSAGE, True),
        ("options", 7, _MESSAGE, False), ("oneof_decl", 8, _MESSAGE, True)])
    descriptor.fields[2].message = field
    descriptor.fields[3].message = descriptor
    descriptor.fields[4].message = enum
    descriptor.fields[7].message = options
    descriptor.fields[8].message = oneof
    file = message("FileDescriptorProto", [
        ("name", 1, _STRING, False), ("package", 2, _STRING, False),
        ("dependency", 3, _STRING, True), ("message_type", 4, _MESSAGE, True),
        ("enum_type", 5, _MESSAGE, True), ("syntax", 12, _STRING, False)])
    file.fields[4].message = descriptor
    file.fields[5].message = enum
    return file


_DESCRIPTOR_PROTO = _meta()


def _file_tree(text: str, name: str, max_bytes: int) -> dict:
    """The FileDescriptorProto tree of a schema's text: base64 of the serialized descriptor,
    or .proto text."""
    if len(text) > max_bytes:
        raise ProtobufSchemaError(f"{name}: the schema is {len(text)} bytes, more than "
                                  f"{max_bytes}")
    stripped = text.strip()
    if stripped and re.fullmatch(r"[A-Za-z0-9+/=\s]+", stripped) and "{" not in stripped:
        try:
            data = base64.b64decode(stripped, validate=False)
        except (binascii.Error, ValueError):
            data = None
        if data:
            try:
                tree = _decode(_DESCRIPTOR_PROTO, data, 0, len(data), 0)
            except ProtobufDataError as error:
                raise ProtobufSchemaError(f"{name}: not a serialized FileDescriptorProto: "
                                          f"{error}") from None
            tree.setdefault("name", name)
            tree.setdefault("syntax", "proto2")
            return tree
    try:
        return _TextParser(text, name).file()
    except RecursionError:
        raise ProtobufSchemaError(f"{name}: messages nested too deeply") from None


# Building the schema ------------------------------------------------------------------------------


class _Builder:
    def __init__(self) -> None:
        self.types: dict[str, Message | Enum] = {}
        self.pending: list[tuple[Field, str]] = []  # fields whose type name is to resolve
        self.fields = 0

    def file(self, tree: dict) -> list[Message]:
        package = tree.get("package") or ""
        syntax = tree.get("syntax") or "proto2"
        scope = f".{package}" if package else ""
        for enum in tree.get("enum_type", ()):
            self.enum(enum, scope)
        return [self.message(node, scope, syntax, 0) for node in tree.get("message_type", ())]

    def enum(self, node: dict, scope: str) -> Enum:
        name = node.get("name")
        if not isinstance(name, str) or not name:
            raise ProtobufSchemaError("an enum without a name")
        built = Enum(f"{scope}.{name}")
        for value in node.get("value", ()):
            number, value_name = value.get("number", 0), value.get("name", "")
            built.names.setdefault(number, value_name)
            if built.default is None:
                built.default = value_name
        self.types[built.full_name] = built
        return built

    def message(self, node: dict, scope: str, syntax: str, depth: int) -> Message:
        if depth > MAX_DEPTH:
            raise ProtobufSchemaError(f"messages nested deeper than {MAX_DEPTH}")
        name = node.get("name")
        if not isinstance(name, str) or not name:
            raise ProtobufSchemaError("a message without a name")
        options = node.get("options") or {}
        built = Message(f"{scope}.{name}", bool(options.get("map_entry")))
        self.types[built.full_name] = built
        for enum in node.get("enum_type", ()):
            self.enum(enum, built.full_name)
        built.nested = [self.message(child, built.full_name, syntax, depth + 1)
                        for child in node.get("nested_type", ())]
        for spec in node.get("field", ()):
            self.fields += 1
            if self.fields > MAX_FIELDS:
                raise ProtobufSchemaError(f"more than {MAX_FIELDS} fields")
            field_name, number = spec.get("name"), spec.get("number")
            if not isinstance(field_name, str) or type(number) is not int or \
                    not 1 <= number <= _MAX_FIELD_NUMBER:
                raise ProtobufSchemaError(f"message {built.full_name[1:]}: a field without a "
                                          "name or with a number out of range")
            if number in built.fields or field_name in built.by_name:
                raise ProtobufSchemaError(f"message {built.full_name[1:]}: field {field_name!r} "
                                          "or its number given twice")
            kind = spec.get("type", 0)
            repeated = spec.get("label") == _REPEATED
            oneof = "oneof_index" in spec
            presence = (syntax != "proto3" or oneof or bool(spec.get("proto3_optional"))
                        or kind == _MESSAGE)
            if kind == _GROUP:
                raise ProtobufSchemaError("groups (deprecated) are not supported")
            field = Field(field_name, number, kind, repeated, presence,
                          spec.get("type_name", ""), oneof)
            if kind not in _WIRE_TYPES and kind != 0:
                raise ProtobufSchemaError(f"field {field_name!r}: unknown type {kind}")
            if kind in (0, _MESSAGE, _ENUM):
                if not isinstance(field.type_name, str) or not field.type_name:
                    raise ProtobufSchemaError(f"field {field_name!r} has no type")
                self.pending.append((field, built.full_name))
            built.fields[number] = field
            built.by_name[field_name] = field
        return built

    def resolve(self) -> None:
        for field, scope in self.pending:
            found = self._lookup(field.type_name, scope)
            if found is None:
                raise ProtobufSchemaError(f"field {field.name!r}: unknown type "
                                          f"{field.type_name[:80]!r}")
            if isinstance(found, Message):
                field.type = _MESSAGE
                field.message = found
                field.presence = True
            else:
                field.type = _ENUM
                field.enum = found
        for message in self.types.values():
            if isinstance(message, Message):
                message.defaults = [(f.name, _default(f)) for f in message.fields.values()
                                    if not f.presence and not f.repeated
                                    and f.type not in (_STRING, _BYTES)]

    def _lookup(self, name: str, scope: str) -> Message | Enum | None:
        """Protobuf's scoping: an absolute name (leading dot) as it is, a relative one from
        the innermost scope outwards."""
        if name.startswith("."):
            return self.types.get(name)
        while True:
            found = self.types.get(f"{scope}.{name}")
            if found is not None:
                return found
            if not scope:
                return None
            scope = scope.rpartition(".")[0]


def _default(field: Field) -> typing.Any:
    if field.type == _BOOL:
        return False
    if field.type == _ENUM:
        return field.enum.default if field.enum is not None else None  # type: ignore[union-attr]
    if field.type in (_DOUBLE, _FLOAT):
        return 0.0
    return 0


def parse_file(text: str, name: str = "schema.proto", references: dict[str, str] | None = None,
               max_bytes: int = 1 << 20) -> ProtoFile:
    """A schema's text (base64 descriptor or .proto) and its references' (name -> text) as a
    `ProtoFile`; `ProtobufSchemaError` if it cannot be used."""
    references = dict(references or {})
    if sum(map(len, references.values())) + len(text) > max_bytes:
        raise ProtobufSchemaError(f"the schema and its references are more than {max_bytes} bytes")
    builder = _Builder()
    loaded: set[str] = set()

    def load(tree: dict, depth: int) -> list[Message]:
        for dependency in tree.get("dependency", ()):
            if dependency in loaded:
                continue
            loaded.add(dependency)
            if len(loaded) > MAX_FILES or depth > MAX_FILES:
                raise ProtobufSchemaError(f"more than {MAX_FILES} imported files")
            source = references.get(dependency) or _WELL_KNOWN_FILES.get(dependency)
            if source is None:
                raise ProtobufSchemaError(f"the schema imports {dependency[:100]!r}, which is "
                                          "neither among its references nor a well-known type")
            load(_file_tree(source, dependency, max_bytes), depth + 1)
        return builder.file(tree)

    tree = _file_tree(text, name, max_bytes)
    loaded.add(str(tree.get("name", name)))
    messages = load(tree, 0)
    builder.resolve()
    if not messages:
        raise ProtobufSchemaError(f"{name}: the schema defines no message")
    return ProtoFile(str(tree.get("name", name)), messages)


def message_at(file: ProtoFile, indexes: list[int]) -> Message:
    """The message the wire format's indexes name (`ProtobufDataError` if there is none)."""
    messages = file.messages
    message = None
    for index in indexes:
        if not 0 <= index < len(messages):
            raise ProtobufDataError(f"message indexes {indexes[:8]} name no message of the schema")
        message = messages[index]
        messages = message.nested
    return message  # type: ignore[return-value]


def holds_no_feature(field: Field) -> str | None:
    """What a field's values are when they are no feature (a repeated field's list, bytes),
    else None: the check of `--features` against a schema at start."""
    if field.repeated and not (field.message is not None and field.message.map_entry):
        return "a repeated field"
    if field.type == _BYTES:
        return "bytes"
    return None


class ProtobufReader:
    """The trees of one Protobuf schema's records (`SchemaRegistryCodec`'s reader)."""

    def __init__(self, registered: typing.Any, mapper: EventMapper, max_bytes: int = 1 << 20):
        from connectors.serializers.schema_registry import SchemaRefused

        self.schema_id = registered.schema_id
        self.mapper = mapper
        try:
            self.file = parse_file(registered.text, references=registered.references,
                                   max_bytes=max_bytes)
        except (ProtobufSchemaError, RecursionError) as error:
            raise SchemaRefused(f"schema {self.schema_id} cannot be used: "
                                f"{str(error)[:300]}") from None

    def event(self, value: bytes, key: bytes | None) -> tuple:
        return self.mapper.event(self.tree(value), key)

    def tree(self, value: bytes) -> typing.Any:
        from connectors.serializers.registry_codec import UndecodablePayload

        indexes, start = wire.message_indexes(value)
        try:
            message = message_at(self.file, indexes)
            data = bytes(value)
            return _message_value(message, data, start, len(data), 0)
        except ProtobufDataError as error:
            raise UndecodablePayload(f"the Protobuf payload does not decode with schema "
                                     f"{self.schema_id}: {error}") from None
