"""Avro: schemas parsed into validated nodes, a bounded decoder of the binary encoding, an encoder.

Both the schema (fetched from a Schema Registry by the id a record names) and the payload are
untrusted, so neither reaches a general-purpose library (fastavro would loop for ever on an array
of 2**62 nulls, and recurse in C on a deeply nested payload of a recursive schema):

- `parse_schema(text)` refuses a schema larger than its `max_bytes`, nested deeper than
  `MAX_SCHEMA_DEPTH`, with more than `MAX_SCHEMA_NODES` types, a name that is not Avro's, an
  unknown type, a union inside a union, a duplicate field or symbol; `AvroSchemaError` names it.
  Named types may refer to themselves (a linked list): the decoder's depth bound applies then.
- `AvroDecoder(schema).decode(payload)` reads the tree (records as dicts, enums as their symbol,
  unions as the branch's value, logical types as numbers: decimal as a float, timestamps, dates
  and times as the long or int Avro stores) and raises `AvroDataError` for anything that does not
  decode: a truncation, a varint longer than ten bytes, a length or block count below zero or
  beyond the payload, more array and map items in all than the payload has bytes (which bounds
  the items of zero bytes, nulls and empty records), a union or enum index out of range, invalid
  UTF-8, a decimal beyond float64, nesting deeper than `MAX_DEPTH`, bytes left after the value.
  Nothing is allocated beyond the payload's size before it is checked: a length is compared with
  what is left, a block count with the items the payload can hold. A reason for a value the
  producer wrote wrong (a string not UTF-8, a decimal beyond float64) names the field and ends
  with "Fix: ..."; the others are a payload of another schema, or damaged.
- `AvroEncoder(schema).encode(value)` writes the binary encoding (the worker's Avro outputs).

Decimals, as the specification and Java's reference implementation (`LogicalTypes.Decimal`,
`Conversions.DecimalConversion`) have them:

- A decimal annotates bytes or fixed; its precision is an integer of at least 1 (a fixed of n
  bytes holds at most floor(log10(2**(8n-1) - 1)) digits: 2 for 1 byte, 18 for 8, 38 for 16),
  its scale an integer from 0 (the default) to the precision. Any other is invalid, and the spec
  says to ignore an invalid logical type: the field is read as its bytes or fixed (not a number),
  and `parse_schema(..., ignored=[])` gives a line naming the field, why and the fix (the
  worker logs it once per schema). So is a decimal of more than `MAX_DECIMAL_PRECISION` digits.
- A value is the two's complement, big-endian, of its unscaled integer, in any number of bytes
  (a fixed's are sign-extended; none is 0, as fastavro reads it): the float is
  unscaled * 10**-scale rounded once to the nearest float64, ties to even (Python's int / int,
  correctly rounded: `float(decimal.Decimal(f"{unscaled}E-{scale}"))` is the same).
- A value of more digits than the precision is read as it is, as Java's reader does (fastavro,
  under confluent-kafka's AvroSerializer, writes some: `Decimal(1)` as a decimal(3,3) is 1000
  units). One beyond float64's range (±1.8e308) is an `AvroDataError`, found before more bytes
  are converted than the range and the precision take: a 1 MiB decimal costs a `bytes.lstrip`.

The specification followed: https://avro.apache.org/docs/1.12.0/specification/ (binary encoding,
logical types).
"""

from __future__ import annotations

import json
import math
import re
import struct
import typing

__all__ = [
    "AvroSchemaError",
    "AvroDataError",
    "parse_schema",
    "AvroDecoder",
    "AvroEncoder",
    "MAX_DEPTH",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_NODES",
]

#: Records, arrays, maps and unions nested deeper than this in a payload are refused.
MAX_DEPTH = 32
#: A schema nested deeper than this is refused (the decoder could not read it within MAX_DEPTH).
MAX_SCHEMA_DEPTH = 64
#: A schema with more types than this (fields, branches, items...) is refused.
MAX_SCHEMA_NODES = 20_000
#: The largest precision of a decimal read as a number (PostgreSQL's numeric declares up to
#: 1000 digits; Spark and Hive 38, BigQuery 76). Beyond it the field is its bytes: 10**scale and
#: each value's conversion stay bounded, and a float64 holds 308 digits before the point anyway.
MAX_DECIMAL_PRECISION = 1000

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")


class AvroSchemaError(ValueError):
    """A schema that is not Avro, or that this decoder refuses (too large, too deep, ...)."""


class AvroDataError(ValueError):
    """A payload that does not decode with its schema."""


# Schemas ------------------------------------------------------------------------------------------


class Node:
    """One type of a parsed schema. `kind` is the Avro type name ("record", "int", ...);
    `logical` the logical type that applies (or None); the rest depends on the kind."""

    __slots__ = ("kind", "logical", "name", "fields", "symbols", "items", "values",
                 "branches", "size", "scale", "precision")

    def __init__(self, kind: str, logical: str | None = None):
        self.kind = kind
        self.logical = logical
        self.name: str | None = None
        self.fields: list[tuple[str, Node]] = []
        self.symbols: list[str] = []
        self.items: Node | None = None
        self.values: Node | None = None
        self.branches: list[Node] = []
        self.size = 0
        self.scale = 0
        self.precision = 0

    def __repr__(self) -> str:
        return f"Node({self.kind}{'' if self.name is None else ' ' + self.name})"


class _Parser:
    def __init__(self) -> None:
        self.named: dict[str, Node] = {}
        self.nodes = 0
        self.where = "the schema"  # the field being parsed, for the notes
        self.ignored: list[str] = []  # a line for each logical type read as its underlying type

    def parse(self, spec: typing.Any, namespace: str | None, depth: int) -> Node:
        if depth > MAX_SCHEMA_DEPTH:
            raise AvroSchemaError(f"the schema nests types deeper than {MAX_SCHEMA_DEPTH} levels")
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES:
            raise AvroSchemaError(f"the schema has more than {MAX_SCHEMA_NODES} types")
        if type(spec) is str:
            if spec in _PRIMITIVES:
                return _primitive(spec)
            node = self.named.get(_fullname(spec, namespace)) or self.named.get(spec)
            if node is None:
                raise AvroSchemaError(f"unknown type {spec[:80]!r}")
            return node
        if type(spec) is list:
            return self._union(spec, namespace, depth)
        if type(spec) is not dict:
            raise AvroSchemaError(f"a type must be a name, an object or a union, got "
                                  f"{type(spec).__name__}")
        kind = spec.get("type")
        if type(kind) is not str:
            if type(kind) in (dict, list):  # {"type": {"type": "int"}}: the inner one
                return self.parse(kind, namespace, depth + 1)
            raise AvroSchemaError("a type object without a type name")
        logical = spec.get("logicalType")
        logical = logical if type(logical) is str else None
        if kind in ("record", "error"):
            return self._record(spec, namespace, depth)
        if kind == "enum":
            node = self._named(Node("enum"), spec, namespace)
            symbols = spec.get("symbols")
            if (type(symbols) is not list or not symbols
                    or not all(type(s) is str and _NAME.match(s) for s in symbols)
                    or len(set(symbols)) != len(symbols)):
                raise AvroSchemaError(f"enum {node.name}: symbols must be distinct Avro names")
            node.symbols = symbols
            return node
        if kind == "fixed":
            node = self._named(Node("fixed", logical), spec, namespace)
            size = spec.get("size")
            if type(size) is not int or not 0 <= size <= 1 << 20:
                raise AvroSchemaError(f"fixed {node.name}: size must be an integer in [0, 2**20]")
            node.size = size
            if logical == "decimal":
                self._decimal(node, spec)
            return node
        if kind == "array":
            node = Node("array")
            node.items = self.parse(spec.get("items"), namespace, depth + 1)
            return node
        if kind == "map":
            node = Node("map")
            node.values = self.parse(spec.get("values"), namespace, depth + 1)
            return node
        if kind in _PRIMITIVES:
            node = _primitive(kind, logical)
            if logical == "decimal":
                if kind == "bytes":
                    self._decimal(node, spec)
                else:  # (the spec's decimal annotates bytes and fixed only)
                    self._ignore(node, f"a decimal on {kind} is invalid (it annotates bytes or "
                                 "fixed only)", "a decimal on bytes or fixed, or no logicalType")
            return node
        node = self.named.get(_fullname(kind, namespace)) or self.named.get(kind)
        if node is not None:
            return node
        raise AvroSchemaError(f"unknown type {kind[:80]!r}")

    def _union(self, spec: list, namespace: str | None, depth: int) -> Node:
        if not spec:
            raise AvroSchemaError("an empty union")
        node = Node("union")
        seen = set()
        for branch_spec in spec:
            if type(branch_spec) is list:
                raise AvroSchemaError("a union directly inside a union")
            branch = self.parse(branch_spec, namespace, depth + 1)
            key = branch.name if branch.name is not None else branch.kind
            if key in seen:
                raise AvroSchemaError(f"a union with two branches of type {key!r}")
            seen.add(key)
            node.branches.append(branch)
        return node

    def _record(self, spec: dict, namespace: str | None, depth: int) -> Node:
        node = self._named(Node("record"), spec, namespace)
        inner = node.name.rpartition(".")[0] or None  # type: ignore[union-attr]
        fields = spec.get("fields")
        if type(fields) is not list:
            raise AvroSchemaError(f"record {node.name}: fields must be a list")
        names = set()
        where = self.where
        short = node.name.rpartition(".")[2]  # type: ignore[union-attr]
        for field in fields:
            if type(field) is not dict or type(field.get("name")) is not str:
                raise AvroSchemaError(f"record {node.name}: a field without a name")
            name = field["name"]
            if not _NAME.match(name) or name in names:
                raise AvroSchemaError(f"record {node.name}: field name {name[:80]!r} is not an "
                                      "Avro name, or given twice")
            names.add(name)
            if "type" not in field:
                raise AvroSchemaError(f"record {node.name}: field {name!r} has no type")
            self.where = f"field {name!r} of record {short}"
            node.fields.append((name, self.parse(field["type"], inner, depth + 1)))
        self.where = where
        return node

    def _named(self, node: Node, spec: dict, namespace: str | None) -> Node:
        name = spec.get("name")
        if type(name) is not str:
            raise AvroSchemaError(f"a {node.kind} without a name")
        space = spec.get("namespace")
        if space is not None and type(space) is not str:
            raise AvroSchemaError(f"{node.kind} {name[:80]!r}: namespace must be a string")
        if "." not in name and space:
            fullname = f"{space}.{name}"
        else:
            fullname = _fullname(name, namespace)
        if not all(_NAME.match(part) for part in fullname.split(".")):
            raise AvroSchemaError(f"{node.kind} name {fullname[:80]!r} is not an Avro name")
        if fullname in self.named:
            raise AvroSchemaError(f"the type {fullname[:80]!r} is defined twice")
        node.name = fullname
        self.named[fullname] = node
        return node

    def _decimal(self, node: Node, spec: dict) -> None:
        """The decimal of a bytes or fixed `node`, checked as the spec and Java's
        `LogicalTypes.Decimal.validate` check it; an invalid one is ignored, as the spec says:
        the node is then its underlying type (and a note says why, and the fix)."""
        precision, scale = spec.get("precision"), spec.get("scale", 0)
        what = f"a decimal({precision!r:.20},{scale!r:.20}) on {_kind(node)}"
        if type(precision) is not int or precision < 1:
            why, fix = "its precision must be a positive integer", "a precision of 1 or more"
        elif type(scale) is not int or not 0 <= scale <= precision:
            why, fix = "its scale must be an integer from 0 to the precision", (
                f"a scale from 0 to {precision}")
        elif node.kind == "fixed" and precision > _fixed_precision(node.size):
            most = _fixed_precision(node.size)
            why = f"{node.size} bytes hold at most {most} digits"
            fixes = [f"a precision of at most {most}"] if most else []
            if precision <= MAX_DECIMAL_PRECISION:  # (10**precision: cheap)
                # n bytes hold `precision` digits when 10**precision < 2**(8n - 1)
                fixes.append(f"a fixed of size {((10 ** precision).bit_length() + 8) // 8}")
            fix = ", or ".join(fixes) or "a larger fixed"
        elif precision > MAX_DECIMAL_PRECISION:
            node.logical = None
            self.ignored.append(
                f"{self.where}: {what} has more digits than the {MAX_DECIMAL_PRECISION} this "
                "reader converts to a float64 (which holds 308), so it is read as its bytes (the "
                "Avro specification lets a reader keep any logical type's underlying type). Fix: "
                f"a precision of at most {MAX_DECIMAL_PRECISION}, in the producers' schema")
            return
        else:
            node.precision, node.scale = precision, scale
            return
        self._ignore(node, f"{what} is invalid: {why}", fix)

    def _ignore(self, node: Node, why: str, fix: str) -> None:
        node.logical = None
        self.ignored.append(f"{self.where}: {why}, so it is read as its {_kind(node)}, as the "
                            "Avro specification says of an invalid logical type. Fix: "
                            f"{fix}, in the producers' schema")


def _kind(node: Node) -> str:
    return f"fixed({node.size})" if node.kind == "fixed" else node.kind


def _fixed_precision(size: int) -> int:
    """The digits a fixed of `size` bytes holds: floor(log10(2**(8 size - 1) - 1)), 0 for none
    (exact up to 418 bytes, beyond which it exceeds MAX_DECIMAL_PRECISION anyway)."""
    if size < 1:
        return 0
    if size > 418:
        return math.floor((8 * size - 1) * math.log10(2))
    return len(str((1 << (8 * size - 1)) - 1)) - 1


def _fullname(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _primitive(kind: str, logical: str | None = None) -> Node:
    return Node(kind, logical)


def _spec(text: str | bytes, max_bytes: int) -> typing.Any:
    if len(text) > max_bytes:
        raise AvroSchemaError(f"the schema is {len(text)} bytes, more than {max_bytes}")
    try:
        return json.loads(text)
    except RecursionError:
        raise AvroSchemaError("the schema nests JSON too deeply") from None
    except ValueError as error:
        raise AvroSchemaError(f"the schema is not JSON: {str(error)[:200]}") from None


def parse_schema(text: str | bytes, max_bytes: int = 1 << 20,
                 references: typing.Sequence[str] = (),
                 ignored: list[str] | None = None) -> Node:
    """The root `Node` of an Avro schema's JSON text, or `AvroSchemaError` (see the module doc).
    `references` are the texts of the schemas it refers to (the registry's references, each
    defining named types it uses), parsed first; `max_bytes` bounds them all. `ignored`, if
    given, receives a line for each logical type read as its underlying type (an invalid
    decimal), naming the field, why, and the fix.

    >>> notes = []
    >>> node = parse_schema('{"type": "record", "name": "P", "fields": [{"name": "fee", "type":'
    ...     ' {"type": "fixed", "name": "F", "size": 4, "logicalType": "decimal",'
    ...     ' "precision": 12, "scale": 2}}]}', ignored=notes)
    >>> node.fields[0][1].logical is None
    True
    >>> notes[0].split(", so")[0]
    "field 'fee' of record P: a decimal(12,2) on fixed(4) is invalid: 4 bytes hold at most 9 digits"
    """
    if sum(map(len, references)) + len(text) > max_bytes:
        raise AvroSchemaError(f"the schema and its references are more than {max_bytes} bytes")
    parser = _Parser()
    try:
        for reference in references:
            parser.parse(_spec(reference, max_bytes), None, 0)
        root = parser.parse(_spec(text, max_bytes), None, 0)
    except RecursionError:
        raise AvroSchemaError("the schema nests types too deeply") from None
    if ignored is not None:
        ignored.extend(parser.ignored)
    return root


# Decoding -----------------------------------------------------------------------------------------


class _Cursor:
    """A payload being read: the bytes, the position, and the array and map items it may still
    hold (one per byte of the payload: an item of zero bytes is still bounded)."""

    __slots__ = ("data", "pos", "items_left")

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0
        self.items_left = len(data)


def _truncated() -> typing.NoReturn:
    raise AvroDataError("the payload ends inside a value (truncated)")


def _read_long(c: _Cursor) -> int:
    data = c.data
    pos = c.pos
    try:
        byte = data[pos]
    except IndexError:
        _truncated()
    if byte < 0x80:
        c.pos = pos + 1
        return (byte >> 1) ^ -(byte & 1)
    result = byte & 0x7F
    shift = 7
    end = len(data)
    while True:
        pos += 1
        if pos >= end:
            _truncated()
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift > 63:
            raise AvroDataError("a varint longer than ten bytes")
    c.pos = pos + 1
    if result >> 64:
        raise AvroDataError("a varint beyond 64 bits")
    return (result >> 1) ^ -(result & 1)


def _read_length(c: _Cursor) -> int:
    length = _read_long(c)
    if length < 0:
        raise AvroDataError(f"a negative length {length}")
    if length > len(c.data) - c.pos:
        raise AvroDataError(f"truncated: a length of {length} bytes with {len(c.data) - c.pos} "
                            "left")
    return length


def _depth_error() -> typing.NoReturn:
    raise AvroDataError(f"the value nests records, arrays, maps and unions deeper than "
                        f"{MAX_DEPTH} levels")


Reader = typing.Callable[[_Cursor, int], typing.Any]


def _null(c: _Cursor, depth: int) -> None:
    return None


def _boolean(c: _Cursor, depth: int) -> bool:
    pos = c.pos
    try:
        byte = c.data[pos]
    except IndexError:
        _truncated()
    if byte > 1:
        raise AvroDataError(f"a boolean byte {byte} (0 or 1)")
    c.pos = pos + 1
    return byte == 1


def _int(c: _Cursor, depth: int) -> int:
    value = _read_long(c)
    if not _INT32[0] <= value <= _INT32[1]:
        raise AvroDataError(f"an int beyond 32 bits: {value}")
    return value


def _long(c: _Cursor, depth: int) -> int:
    return _read_long(c)


def _float(c: _Cursor, depth: int) -> float:
    pos = c.pos
    if pos + 4 > len(c.data):
        _truncated()
    c.pos = pos + 4
    return _FLOAT.unpack_from(c.data, pos)[0]


def _double(c: _Cursor, depth: int) -> float:
    pos = c.pos
    if pos + 8 > len(c.data):
        _truncated()
    c.pos = pos + 8
    return _DOUBLE.unpack_from(c.data, pos)[0]


def _bytes(c: _Cursor, depth: int) -> bytes:
    length = _read_length(c)
    pos = c.pos
    c.pos = pos + length
    return c.data[pos:pos + length]


def _not_utf8(what: str, data: bytes) -> AvroDataError:
    return AvroDataError(
        f"{what} is not UTF-8 ({data[:24]!r}{'...' if len(data) > 24 else ''}). Fix: the "
        "producer must encode its strings as UTF-8, as Avro requires (or declare the field bytes)")


def _string_reader(what: str) -> Reader:
    """The reader of a string; `what` names it when it is not UTF-8."""

    def read(c: _Cursor, depth: int) -> str:
        length = _read_length(c)
        pos = c.pos
        c.pos = pos + length
        try:
            return c.data[pos:pos + length].decode()
        except UnicodeDecodeError:
            raise _not_utf8(what, c.data[pos:pos + length]) from None

    return read


_string = _string_reader("a map key")  # (a string field's reader names its field)

_PRIMITIVE_READERS: dict[str, Reader] = {
    "null": _null, "boolean": _boolean, "int": _int, "long": _long, "float": _float,
    "double": _double, "bytes": _bytes, "string": _string_reader("a string"),
}


#: A float64 is below 2**1024: the bits of a decimal's largest magnitude, before its scale.
_FLOAT64_BITS = 1024


def _shortest(data: bytes) -> bytes:
    """The two's complement `data` without its sign extension (leading 0x00 of a value of zero
    or more, 0xff of a negative one, but the one its top bit needs): the same value in its
    shortest form, Java's `BigInteger.toByteArray`. C speed (`lstrip`), however long `data` is."""
    negative = data[0] >= 0x80
    rest = data.lstrip(b"\xff" if negative else b"\x00")
    keep = len(rest) + (not rest or (rest[0] >= 0x80) != negative)
    return data[len(data) - keep:]


def _decimal_reader(raw: Reader, node: Node, where: str = "") -> Reader:
    """The reader of a decimal (`raw` reads its bytes or fixed): its value, unscaled * 10**-scale,
    rounded once to the nearest float64 (ties to even: Python's int / int is correctly rounded).

    The bytes are two's complement, big-endian, of any length: sign-extended (a fixed's), or
    empty (read as 0, as fastavro reads it). A value of more digits than the precision is read as
    it is, as Java's reader and fastavro do (fastavro writes some: Decimal(1) in decimal(3,3) is
    1000 units); one beyond float64's range is refused, before converting more bytes than that
    range and the precision take (`where` names the field in the reason)."""
    precision, scale = node.precision, node.scale
    decimal = f"decimal({precision},{scale})"
    divisor = 10 ** scale
    limit = 10 ** precision
    # The shortest bytes of the largest value of `precision` digits, and of the largest unscaled
    # value that a float64 holds over 10**scale (< 2**1024 * 10**scale, with a byte to spare):
    # a value whose shortest form is longer is beyond both.
    precision_bytes = ((limit - 1).bit_length() + 8) // 8
    max_bytes = max(precision_bytes, (_FLOAT64_BITS + divisor.bit_length()) // 8 + 2)

    def beyond_float64(size: int, beyond_precision: bool) -> typing.NoReturn:
        if beyond_precision:  # (the producer's fault: its schema says so)
            raise AvroDataError(
                f"a {decimal}{where} is {size} bytes long: beyond float64's range (±1.8e308), "
                f"and beyond the {precision} digits its schema declares. Fix: the producer must "
                f"write values of at most {precision} digits, as {decimal} says")
        raise AvroDataError(
            f"a {decimal}{where} is beyond float64's range (±1.8e308), the type of features. "
            "Fix: values within ±1.8e308 from the producers (at most 308 digits before the "
            "point)")

    def read(c: _Cursor, depth: int) -> float:
        data = raw(c, depth)
        if len(data) > max_bytes:
            data = _shortest(data)
            if len(data) > max_bytes:  # (>= precision_bytes: beyond the precision too)
                beyond_float64(len(data), True)
        unscaled = int.from_bytes(data, "big", signed=True)
        try:
            return unscaled / divisor
        except OverflowError:
            beyond_float64(len(data), abs(unscaled) >= limit)

    return read


def _fixed_reader(size: int) -> Reader:
    def read(c: _Cursor, depth: int) -> bytes:
        pos = c.pos
        if pos + size > len(c.data):
            _truncated()
        c.pos = pos + size
        return c.data[pos:pos + size]

    return read


def _enum_reader(symbols: list[str]) -> Reader:
    count = len(symbols)

    def read(c: _Cursor, depth: int) -> str:
        index = _read_long(c)
        if not 0 <= index < count:
            raise AvroDataError(f"enum index {index} out of range (0 to {count - 1})")
        return symbols[index]

    return read


def _block_count(c: _Cursor) -> int:
    """The item count of the next block of an array or map (0: the end), checked against the
    items the payload can still hold."""
    count = _read_long(c)
    if count < 0:
        count = -count
        _read_length(c)  # the block's size in bytes: checked, not needed to read it
    if count > c.items_left:
        raise AvroDataError(f"a block of {count} items, more than the payload's "
                            f"{len(c.data)} bytes can hold")
    c.items_left -= count
    return count


class _Readers:
    """The reader of each node, built once per schema (records through a holder, so that a
    recursive record's reader can call itself)."""

    def __init__(self) -> None:
        self.built: dict[int, Reader] = {}

    def reader(self, node: Node) -> Reader:
        built = self.built.get(id(node))
        if built is not None:
            return built
        kind = node.kind
        if kind == "record":
            holder: list[Reader] = []

            def call(c: _Cursor, depth: int) -> typing.Any:
                return holder[0](c, depth)

            self.built[id(node)] = call
            holder.append(self._record(node))
            self.built[id(node)] = holder[0]
            return holder[0]
        if node.logical == "decimal":
            read = self._decimal(node, "")
        elif kind in _PRIMITIVE_READERS:
            read = _PRIMITIVE_READERS[kind]
        elif kind == "fixed":
            read = _fixed_reader(node.size)
        elif kind == "enum":
            read = _enum_reader(node.symbols)
        elif kind == "array":
            read = self._array(node)
        elif kind == "map":
            read = self._map(node)
        elif kind == "union":
            read = self._union(node)
        else:  # the parser makes no other kind
            raise AssertionError(kind)
        self.built[id(node)] = read
        return read

    @staticmethod
    def _decimal(node: Node, where: str) -> Reader:
        raw = _bytes if node.kind == "bytes" else _fixed_reader(node.size)
        return _decimal_reader(raw, node, where)

    def _field(self, node: Node, where: str) -> Reader:
        """A record field's reader: for a value that the producer can get wrong (a decimal
        beyond float64, a string not UTF-8), alone or in a union, its own reader, whose reason
        names the field (`where`)."""
        if node.kind == "union":
            if any(_names_its_field(branch) for branch in node.branches):
                return self._union(node, where)
        elif node.logical == "decimal":
            return self._decimal(node, where)
        elif node.kind == "string":
            return _string_reader(f"a string{where}")
        return self.reader(node)

    def _record(self, node: Node) -> Reader:
        record = node.name.rpartition(".")[2]  # type: ignore[union-attr]
        fields = [(name, self._field(field, f" in field {name!r} of record {record}"))
                  for name, field in node.fields]

        def read(c: _Cursor, depth: int) -> dict:
            if depth >= MAX_DEPTH:
                _depth_error()
            depth += 1
            return {name: field(c, depth) for name, field in fields}

        return read

    def _array(self, node: Node) -> Reader:
        item = self.reader(node.items)  # type: ignore[arg-type]

        def read(c: _Cursor, depth: int) -> list:
            if depth >= MAX_DEPTH:
                _depth_error()
            depth += 1
            items = []
            while True:
                count = _block_count(c)
                if count == 0:
                    return items
                for _ in range(count):
                    items.append(item(c, depth))

        return read

    def _map(self, node: Node) -> Reader:
        value = self.reader(node.values)  # type: ignore[arg-type]

        def read(c: _Cursor, depth: int) -> dict:
            if depth >= MAX_DEPTH:
                _depth_error()
            depth += 1
            entries = {}
            while True:
                count = _block_count(c)
                if count == 0:
                    return entries
                for _ in range(count):
                    key = _string(c, depth)
                    entries[key] = value(c, depth)

        return read

    def _union(self, node: Node, where: str = "") -> Reader:
        branches = [self._field(branch, where) if where else self.reader(branch)
                    for branch in node.branches]
        count = len(branches)

        def read(c: _Cursor, depth: int) -> typing.Any:
            index = _read_long(c)
            if not 0 <= index < count:
                raise AvroDataError(f"union branch {index} out of range (0 to {count - 1})")
            return branches[index](c, depth)

        return read


def _names_its_field(node: Node) -> bool:
    return node.kind == "string" or node.logical == "decimal"


class AvroDecoder:
    """The binary decoder of one schema; `decode(payload)` gives the tree or `AvroDataError`.

    >>> decoder = AvroDecoder(parse_schema(
    ...     '{"type": "record", "name": "P", "fields": [{"name": "amount", "type": "double"},'
    ...     ' {"name": "country", "type": {"type": "enum", "name": "C", "symbols": ["BR", "FR"]}},'
    ...     ' {"name": "is_fraud", "type": ["null", "boolean"]}]}'))
    >>> decoder.decode(bytes([0, 0, 0, 0, 0, 0, 0x24, 0x40, 2, 2, 1]))
    {'amount': 10.0, 'country': 'FR', 'is_fraud': True}
    """

    def __init__(self, schema: Node):
        self.schema = schema
        self._read = _Readers().reader(schema)

    def decode(self, payload: bytes | memoryview) -> typing.Any:
        c = _Cursor(bytes(payload))
        try:
            value = self._read(c, 0)
        except RecursionError:  # (MAX_DEPTH keeps far below the interpreter's limit)
            raise AvroDataError("the value nests too deeply") from None
        left = len(c.data) - c.pos
        if left:
            raise AvroDataError(f"{left} bytes after the value: the payload is not of this schema")
        return value


# Encoding -----------------------------------------------------------------------------------------


def _zigzag(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class AvroEncoder:
    """The binary encoder of one schema (the worker's outputs, whose schemas are its own).

    A union takes the first branch the value fits: null for None, boolean for a bool, long or int
    for an int, double or float for a float, string for a str, map or record for a dict, array for
    a list. `ValueError` for a value the schema cannot hold.

    >>> schema = parse_schema('{"type": "record", "name": "R", "fields": ['
    ...     '{"name": "id", "type": ["null", "string", "long"]}, {"name": "p", "type": "double"}]}')
    >>> payload = AvroEncoder(schema).encode({"id": 7, "p": 0.5})
    >>> AvroDecoder(schema).decode(payload)
    {'id': 7, 'p': 0.5}
    """

    def __init__(self, schema: Node):
        self.schema = schema

    def encode(self, value: typing.Any) -> bytes:
        out = bytearray()
        self._write(self.schema, value, out)
        return bytes(out)

    def _write(self, node: Node, value: typing.Any, out: bytearray) -> None:
        kind = node.kind
        if kind == "null":
            if value is not None:
                raise ValueError(f"null expected, got {value!r:.60}")
        elif kind == "boolean":
            out.append(1 if value else 0)
        elif kind in ("int", "long"):
            if type(value) is bool or not isinstance(value, int):
                raise ValueError(f"{kind} expected, got {value!r:.60}")
            low, high = _INT32 if kind == "int" else _INT64
            if not low <= value <= high:
                raise ValueError(f"{value} does not fit an Avro {kind}")
            out += _zigzag(value)
        elif kind == "float":
            out += _FLOAT.pack(value)
        elif kind == "double":
            out += _DOUBLE.pack(value)
        elif kind in ("string", "bytes"):
            data = value.encode() if kind == "string" else bytes(value)
            out += _zigzag(len(data))
            out += data
        elif kind == "record":
            for name, field in node.fields:
                self._write(field, value.get(name), out)
        elif kind == "enum":
            out += _zigzag(node.symbols.index(value))
        elif kind == "array":
            if value:
                out += _zigzag(len(value))
                for item in value:
                    self._write(node.items, item, out)  # type: ignore[arg-type]
            out.append(0)
        elif kind == "map":
            if value:
                out += _zigzag(len(value))
                for key, item in value.items():
                    self._write(_STRING_NODE, key, out)
                    self._write(node.values, item, out)  # type: ignore[arg-type]
            out.append(0)
        elif kind == "union":
            for index, branch in enumerate(node.branches):
                if _fits(branch, value):
                    out += _zigzag(index)
                    self._write(branch, value, out)
                    return
            raise ValueError(f"no branch of the union takes {value!r:.60}")
        elif kind == "fixed":
            data = bytes(value)
            if len(data) != node.size:
                raise ValueError(f"fixed of {node.size} bytes, got {len(data)}")
            out += data
        else:
            raise AssertionError(kind)


_STRING_NODE = _primitive("string")


def _fits(node: Node, value: typing.Any) -> bool:
    kind = node.kind
    if value is None:
        return kind == "null"
    if type(value) is bool:
        return kind == "boolean"
    if type(value) is int:
        if kind == "long":
            return _INT64[0] <= value <= _INT64[1]
        if kind == "int":
            return _INT32[0] <= value <= _INT32[1]
        return kind in ("double", "float")
    if type(value) is float:
        return kind in ("double", "float")
    if type(value) is str:
        return kind in ("string", "enum")
    if type(value) is dict:
        return kind in ("map", "record")
    if type(value) is list:
        return kind == "array"
    return kind in ("bytes", "fixed")
