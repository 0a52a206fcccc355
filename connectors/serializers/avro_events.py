"""The events of an Avro schema's records read straight from the payload, without the tree.

`AvroDecoder` builds a record's tree and `EventMapper` walks it: two passes, a dict per record
and a type test per value. With the schema known, the walk can be decided once per schema: which
field is the id, which the label, which a feature of which name, and how each is read.
`event_reader(schema, mapper)` compiles that into one reader per field (runs of doubles in one
`struct` call; an enum's one-hot names made once per symbol), for the mappings whose features
are the record's fields (`*`) or those of one record field (`P.*`), id and label top-level
fields (or the key). Consecutive fields of a fixed size (doubles, floats, booleans: the label
too) are read by one `struct` call. Other mappings, and other field types inside those (nested
records, maps, arrays: their subtree, through the mapper), keep the general path.

Its result is the general path's, by contract: for a payload it reads, the same event; for any
other (a feature the mapping refuses, a payload that does not decode), the caller decodes the
tree and lets the mapper word the dead letter (`SchemaRegistryCodec`); tests/test_serializers.py
compares the two on generated records. Measured at 10 doubles, an id and a label: 1.6 us a
record against 4.6 us for the tree and the mapper (benchmarks/record_formats.py measures the
worker).
"""

from __future__ import annotations

import operator
import struct
import typing

from connectors.codec import DeadLetter
from connectors.serializers import avro
from connectors.serializers.mapping import MAX_CATEGORY_CHARS, EventMapper

__all__ = ["event_reader"]

_Op = typing.Callable[[avro._Cursor, dict, list], None]
_MAX_FLOAT = 1.7976931348623157e308


class _Fallback(Exception):
    """The fused read cannot decide: the general path must (its words for the dead letter)."""


def event_reader(schema: avro.Node, mapper: EventMapper,
                 native: bool = True) -> typing.Callable | None:
    """`read(value, key) -> (id, x, y)` for `schema`'s framed records under `mapper`, raising
    `_Fallback` where the general path must decide; None for a mapping it does not compile.
    The plan runs in C (events.c) where the module is built and has an instruction for
    every field (`native`), else in Python. The C reader carries its plan (`read.plan`: its
    code and enum tables), which the worker's batch path runs over many records
    (`connectors.serializers.batches`)."""
    if schema.kind != "record" or len(mapper._selections) != 1:
        return None
    path, children, _ = mapper._selections[0]
    if not children or len(path) > 1:
        return None
    id_path, label_path = mapper._id_path, mapper._label_path
    if (not mapper.id_from_key and len(id_path) != 1) or len(label_path) != 1:
        return None
    fields = dict(schema.fields)
    readers = avro._Readers()
    root_skip = mapper._excluded_at.get("", frozenset())
    ops: list[_Op] = []
    if path:  # `P.*`: the fields of one record field P
        inner = fields.get(path[0])
        if inner is None or inner.kind != "record":
            return None
        at = path[0] + "."
        feature_fields, skip = inner.fields, mapper._excluded_at.get(at, frozenset())
    else:
        at, feature_fields, skip = "", [], root_skip
    for name, node in schema.fields:
        if not mapper.id_from_key and name == id_path[0]:
            ops.append(_state_op(readers.reader(node), 0, mapper.id_of, node))
        elif name == label_path[0]:
            if node.kind == "boolean":
                ops.append(_Fixed("B", None, "label"))
            else:
                ops.append(_state_op(readers.reader(node), 1, mapper.label_of))
        elif path and name == path[0]:
            for inner_name, inner_node in feature_fields:
                if inner_name in skip:
                    ops.append(_skip_op(readers.reader(inner_node)))
                else:
                    ops.append(_feature_op(inner_name, at + inner_name, inner_node, readers,
                                           mapper))
        elif path or name in root_skip:
            ops.append(_skip_op(readers.reader(node)))
        else:
            ops.append(_feature_op(name, name, node, readers, mapper))
    ops = _runs_of_fixed(ops)
    names = [name for name, _ in schema.fields]
    if native:
        in_c = _native_reader(schema, mapper, path, feature_fields, skip, root_skip, names)
        if in_c is not None:
            return in_c
    from_key = mapper.id_from_key
    id_of = mapper.id_of
    finish = mapper.finish
    object_found = bool(path)

    cursor = avro._Cursor(b"")  # (one per reader, set for each record: the loop is one thread)

    def read(value: bytes, key: bytes | None = None) -> tuple:
        """The event of a framed record (the payload after Confluent's 5-byte header)."""
        mapper.indicators = 0
        c = cursor
        c.data, c.pos, c.items_left = value, 5, len(value)
        payload = value
        x: dict = {}
        state = [None, None]
        try:
            for op in ops:
                op(c, x, state)
        except (avro.AvroDataError, DeadLetter, IndexError, struct.error):
            raise _Fallback from None
        if c.pos != len(payload):
            raise _Fallback
        if from_key:
            if key is not None:
                try:
                    state[0] = id_of(key.decode())
                except UnicodeDecodeError:
                    raise _Fallback from None
        if x or object_found:
            return state[0], x, state[1]
        return finish(state[0], x, False, state[1], names)

    return read


# The C reader (events.c) ---------------------------------------------------------------------

# Its opcodes (events.c says what each does).
(_ID_STRING, _ID_LONG, _LABEL_BOOL, _DOUBLE, _FLOAT, _INT, _LONG, _BOOL, _ENUM, _CATEGORY,
 _OPTIONAL) = range(1, 12)
(_SKIP_BOOL, _SKIP_VARINT, _SKIP_FLOAT, _SKIP_DOUBLE, _SKIP_BYTES, _SKIP_NULL, _INT_ID,
 _SKIP_STRING, _SKIP_INT, _SKIP_ENUM) = range(20, 30)
# What each type is skipped with: checked as the tree's decoder checks it (an int's 32 bits, a
# string's UTF-8, an enum's index), so that a skipped field decides as a read one.
_SKIPS = {"boolean": _SKIP_BOOL, "int": _SKIP_INT, "long": _SKIP_VARINT, "float": _SKIP_FLOAT,
          "double": _SKIP_DOUBLE, "bytes": _SKIP_BYTES, "string": _SKIP_STRING,
          "null": _SKIP_NULL}
_native: typing.Any = False  # avro_reader's module, None where it is not built (False: not looked)


def _native_module() -> typing.Any:
    global _native
    if _native is False:
        from streammargin.jit import aot

        _native = aot.native("events")
    return _native


class _Plan:
    """A plan for events.c being made: its instructions and the tuples they index."""

    def __init__(self) -> None:
        self.code = bytearray()
        self.names: list[str] = []
        self.tables: list[tuple] = []

    def op(self, code: int, index: int | None = None) -> None:
        self.code.append(code)
        if index is not None:
            if index >= 1 << 16:
                raise _NotPlanned
            self.code += index.to_bytes(2, "little")

    def name(self, name: str) -> int:
        self.names.append(name)
        return len(self.names) - 1


class _NotPlanned(Exception):
    """A field the C reader has no instruction for: the Python reader serves the schema."""


def _optional_branch(node: avro.Node) -> avro.Node | None:
    """T of a union [null, T] (T not itself null), else None."""
    if (node.kind == "union" and len(node.branches) == 2 and node.branches[0].kind == "null"
            and node.branches[1].kind not in ("null", "union")):
        return node.branches[1]
    return None


def _plan_skip(plan: _Plan, node: avro.Node) -> None:
    inner = _optional_branch(node)
    if inner is not None:
        plan.op(_OPTIONAL)
        node = inner
    if node.kind == "enum":
        plan.op(_SKIP_ENUM, len(node.symbols))
    elif node.kind in _SKIPS and node.logical != "decimal":  # (a decimal checks its bytes)
        plan.op(_SKIPS[node.kind])
    else:
        raise _NotPlanned


def _plan_id(plan: _Plan, node: avro.Node) -> None:
    inner = _optional_branch(node)
    if inner is not None:
        plan.op(_OPTIONAL)
        node = inner
    codes = {"string": _ID_STRING, "long": _ID_LONG, "int": _INT_ID}
    if node.kind not in codes or (node.kind == "string" and node.logical not in (None, "uuid")):
        raise _NotPlanned
    plan.op(codes[node.kind])


def _plan_label(plan: _Plan, node: avro.Node) -> None:
    inner = _optional_branch(node)
    if inner is not None:
        plan.op(_OPTIONAL)
        node = inner
    if node.kind != "boolean":
        raise _NotPlanned
    plan.op(_LABEL_BOOL)


def _plan_feature(plan: _Plan, name: str, node: avro.Node, mapper: EventMapper) -> None:
    inner = _optional_branch(node)
    if inner is not None:
        plan.op(_OPTIONAL)
        node = inner
    kind, logical = node.kind, node.logical
    if kind in ("enum", "string"):
        if kind == "string" and logical not in (None, "uuid"):
            raise _NotPlanned
        if mapper.categorical == "drop":
            _plan_skip(plan, node)
            return
        if mapper.categorical != "onehot":
            raise _NotPlanned
        if kind == "enum":
            if any(len(symbol) > MAX_CATEGORY_CHARS for symbol in node.symbols):
                raise _NotPlanned
            plan.tables.append(tuple(f"{name}={symbol}" for symbol in node.symbols))
            plan.op(_ENUM, len(plan.tables) - 1)
        else:
            plan.op(_CATEGORY, plan.name(name))
        return
    codes = {"double": _DOUBLE, "float": _FLOAT, "int": _INT, "long": _LONG, "boolean": _BOOL}
    if kind not in codes or (kind in ("double", "float") and logical is not None):
        raise _NotPlanned
    plan.op(codes[kind], plan.name(name))


def _native_reader(schema: avro.Node, mapper: EventMapper, path: tuple, feature_fields: list,
                   skip: frozenset, root_skip: frozenset, names: list) -> typing.Callable | None:
    """The reader that runs the schema's plan in C, or None (the C module is not built, or a
    field has no instruction): `event_reader`'s Python ops then. Same contract."""
    module = _native_module()
    if module is None:
        return None
    plan = _Plan()
    id_path, label_path = mapper._id_path, mapper._label_path
    try:
        for name, node in schema.fields:
            if not mapper.id_from_key and name == id_path[0]:
                _plan_id(plan, node)
            elif name == label_path[0]:
                _plan_label(plan, node)
            elif path and name == path[0]:
                for inner_name, inner_node in feature_fields:
                    if inner_name in skip:
                        _plan_skip(plan, inner_node)
                    else:
                        _plan_feature(plan, inner_name, inner_node, mapper)
            elif path or name in root_skip:
                _plan_skip(plan, node)
            else:
                _plan_feature(plan, name, node, mapper)
    except _NotPlanned:
        return None
    read_event = module.read_event
    code, feature_names, tables = bytes(plan.code), tuple(plan.names), tuple(plan.tables)
    # One cache per category field (value -> its indicator's name), bounded in the C code.
    caches = tuple({} for _ in feature_names)
    from_key, id_of, finish = mapper.id_from_key, mapper.id_of, mapper.finish
    object_found = bool(path)

    def read(value: bytes, key: bytes | None = None) -> tuple:
        found = read_event(value, 5, code, feature_names, tables, caches)
        if found is None:
            raise _Fallback
        event_id, x, y, mapper.indicators = found
        if from_key:
            event_id = None
            if key is not None:
                try:
                    event_id = id_of(key.decode())
                except UnicodeDecodeError:
                    raise _Fallback from None
        if x or object_found:
            return event_id, x, y
        return finish(event_id, x, False, y, names)

    # (the plan itself: the batch reader runs it over many records, event_batches.c)
    read.plan = (code, tables)  # type: ignore[attr-defined]
    return read


def _state_op(reader: avro.Reader, slot: int, check: typing.Callable,
              node: avro.Node | None = None) -> _Op:
    if node is not None and node.kind == "string" and node.logical is None and slot == 0:
        # An id of type string (the common case): its length read inline when it takes one
        # byte (ids of up to 63 bytes); a string is always a valid id.
        def op(c: avro._Cursor, x: dict, state: list) -> None:
            data, pos = c.data, c.pos
            byte = data[pos] if pos < len(data) else 0x80
            if byte < 0x80 and not byte & 1:
                end = pos + 1 + (byte >> 1)
                if end > len(data):
                    raise _Fallback
                try:
                    state[0] = data[pos + 1:end].decode()
                except UnicodeDecodeError:
                    raise _Fallback from None
                c.pos = end
            else:
                state[0] = reader(c, 1)
        return op

    def op(c: avro._Cursor, x: dict, state: list) -> None:
        state[slot] = check(reader(c, 1))

    return op


def _skip_op(reader: avro.Reader) -> _Op:
    def op(c: avro._Cursor, x: dict, state: list) -> None:
        reader(c, 1)

    return op


class _Fixed(typing.NamedTuple):
    """A field of a fixed size: a double or float feature ("d", "f"), a boolean feature or the
    boolean label ("B"). `_runs_of_fixed` reads consecutive ones with one `struct` call."""

    code: str
    name: str | None
    role: str  # "feature" or "label"


def _runs_of_fixed(ops: list) -> list:
    """Consecutive fixed-size fields as one op: one `struct` call for the run, one finite check
    (a sum of finite values is finite or inf, never NaN; an inf sends the record through the
    general path, which finds the culprit or none), a check that the booleans are 0 or 1."""
    out: list = []
    run: list[_Fixed] = []

    def close() -> None:
        if run:
            out.append(_fixed_run(list(run)))
        run.clear()

    for op in ops:
        if isinstance(op, _Fixed):
            run.append(op)
        else:
            close()
            out.append(op)
    close()
    return out


def _fixed_run(run: list[_Fixed]) -> _Op:
    layout = struct.Struct("<" + "".join(item.code for item in run))
    unpack, size = layout.unpack_from, layout.size
    features = [i for i, item in enumerate(run) if item.role == "feature"]
    names = [run[i].name for i in features]
    take = operator.itemgetter(*features) if len(features) > 1 else None
    single = features[0] if len(features) == 1 else None
    booleans = [i for i, item in enumerate(run) if item.code == "B"]
    label = next((i for i, item in enumerate(run) if item.role == "label"), None)
    all_bytes = operator.itemgetter(*booleans) if len(booleans) > 1 else None
    one_byte = booleans[0] if len(booleans) == 1 else None

    def op(c: avro._Cursor, x: dict, state: list) -> None:
        pos = c.pos
        if pos + size > len(c.data):
            raise _Fallback
        values = unpack(c.data, pos)
        c.pos = pos + size
        total = sum(values)
        if total - total != 0.0:
            raise _Fallback
        if one_byte is not None:
            if values[one_byte] > 1:
                raise _Fallback
        elif all_bytes is not None and max(all_bytes(values)) > 1:
            raise _Fallback
        if take is not None:
            x.update(zip(names, take(values)))
        elif single is not None:
            x[names[0]] = values[single]
        if label is not None:
            state[1] = values[label] == 1

    return op


def _feature_op(name: str, at: str, node: avro.Node, readers: avro._Readers,
                mapper: EventMapper) -> _Op:
    """The op of a feature field `name` (at `at` in the record): a compiled one for the scalar
    types, the subtree through the mapper for the others."""
    kind, logical = node.kind, node.logical
    if kind in ("double", "float") and logical is None:
        return _Fixed("d" if kind == "double" else "f", name, "feature")
    if kind == "boolean":
        return _Fixed("B", name, "feature")
    if kind == "union" and len(node.branches) == 2 and node.branches[0].kind == "null":
        inner = _feature_op(name, at, node.branches[1], readers, mapper)
        return _optional(_fixed_run([inner]) if isinstance(inner, _Fixed) else inner)
    reader = readers.reader(node)
    if kind in ("int", "long"):  # (their logical types, timestamps and dates, are the number)
        def op(c: avro._Cursor, x: dict, state: list) -> None:
            x[name] = reader(c, 1)
        return op
    if kind == "enum" and mapper.categorical == "onehot" and all(
            len(s) <= MAX_CATEGORY_CHARS for s in node.symbols):
        # One-hot names made once per symbol (the mapper's own, so shared with its cache).
        features = [f"{name}={symbol}" for symbol in node.symbols]
        count = len(features)

        def op(c: avro._Cursor, x: dict, state: list) -> None:
            index = avro._read_long(c)
            if not 0 <= index < count:
                raise _Fallback
            x[features[index]] = True
            mapper.indicators += 1
        return op
    if kind in ("enum", "string") and logical is None:
        category = mapper._category
        drop = mapper.categorical == "drop"

        def op(c: avro._Cursor, x: dict, state: list) -> None:
            value = reader(c, 1)
            if not drop:
                category(x, name, at, value)
        return op
    add = mapper._object
    prefix = at[:len(at) - len(name)]

    def op(c: avro._Cursor, x: dict, state: list) -> None:
        value = reader(c, 1)
        if value is not None:
            add(x, {name: value}, "", prefix, 1)
    return op


def _optional(inner: _Op) -> _Op:
    """A union [null, T]: nothing when null, T's op otherwise."""
    def op(c: avro._Cursor, x: dict, state: list) -> None:
        index = avro._read_long(c)
        if index == 1:
            inner(c, x, state)
        elif index != 0:
            raise _Fallback
    return op
