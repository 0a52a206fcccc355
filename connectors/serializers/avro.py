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
  UTF-8, nesting deeper than `MAX_DEPTH`, bytes left after the value. Nothing is allocated beyond
  the payload's size before it is checked: a length is compared with what is left, a block count
  with the items the payload can hold.
- `AvroEncoder(schema).encode(value)` writes the binary encoding (the worker's Avro outputs).

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
#: The largest precision of a decimal (38 is Java's BigDecimal in most systems, 76 some).
MAX_DECIMAL_PRECISION = 100

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
            if logical == "decimal" and kind == "bytes":
                self._decimal(node, spec)
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
            node.fields.append((name, self.parse(field["type"], inner, depth + 1)))
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
        precision, scale = spec.get("precision"), spec.get("scale", 0)
        if (type(precision) is not int or type(scale) is not int
                or not 1 <= precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision):
            raise AvroSchemaError(f"decimal: precision must be in [1, {MAX_DECIMAL_PRECISION}] "
                                  "and scale in [0, precision]")
        node.precision, node.scale = precision, scale


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
                 references: typing.Sequence[str] = ()) -> Node:
    """The root `Node` of an Avro schema's JSON text, or `AvroSchemaError` (see the module doc).
    `references` are the texts of the schemas it refers to (the registry's references, each
    defining named types it uses), parsed first; `max_bytes` bounds them all."""
    if sum(map(len, references)) + len(text) > max_bytes:
        raise AvroSchemaError(f"the schema and its references are more than {max_bytes} bytes")
    parser = _Parser()
    try:
        for reference in references:
            parser.parse(_spec(reference, max_bytes), None, 0)
        return parser.parse(_spec(text, max_bytes), None, 0)
    except RecursionError:
        raise AvroSchemaError("the schema nests types too deeply") from None


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


def _string(c: _Cursor, depth: int) -> str:
    length = _read_length(c)
    pos = c.pos
    c.pos = pos + length
    try:
        return c.data[pos:pos + length].decode()
    except UnicodeDecodeError:
        raise AvroDataError("a string that is not UTF-8") from None


_PRIMITIVE_READERS: dict[str, Reader] = {
    "null": _null, "boolean": _boolean, "int": _int, "long": _long, "float": _float,
    "double": _double, "bytes": _bytes, "string": _string,
}


def _decimal_reader(raw: Reader, node: Node) -> Reader:
    # A decimal of `precision` digits needs at most this many bytes of two's complement.
    max_bytes = node.precision * 10 // 24 + 2
    divisor = 10 ** node.scale

    def read(c: _Cursor, depth: int) -> float:
        data = raw(c, depth)
        if len(data) > max_bytes:
            raise AvroDataError(f"a decimal of {len(data)} bytes: precision {node.precision} "
                                f"takes at most {max_bytes}")
        if not data:
            raise AvroDataError("a decimal of no bytes")
        value = int.from_bytes(data, "big", signed=True) / divisor
        if not math.isfinite(value):  # (cannot be, within the precision: kept as a guard)
            raise AvroDataError("a decimal beyond float64")
        return value

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
        if kind in _PRIMITIVE_READERS:
            read = _PRIMITIVE_READERS[kind]
            if node.logical == "decimal" and kind == "bytes":
                read = _decimal_reader(read, node)
        elif kind == "fixed":
            read = _fixed_reader(node.size)
            if node.logical == "decimal":
                read = _decimal_reader(read, node)
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

    def _record(self, node: Node) -> Reader:
        fields = [(name, self.reader(field)) for name, field in node.fields]

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

    def _union(self, node: Node) -> Reader:
        branches = [self.reader(branch) for branch in node.branches]
        count = len(branches)

        def read(c: _Cursor, depth: int) -> typing.Any:
            index = _read_long(c)
            if not 0 <= index < count:
                raise AvroDataError(f"union branch {index} out of range (0 to {count - 1})")
            return branches[index](c, depth)

        return read


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
