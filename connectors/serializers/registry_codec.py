"""Records behind a Schema Registry: Avro, Protobuf and JSON Schema in Confluent's wire format.

`SchemaRegistryCodec.decode(value, key)` reads the frame (`connectors.serializers.wire`), gets
the schema the record names from the registry (`SchemaRegistry.schema`: once per id and
process, cached within bounds), decodes the payload with it into the tree, and maps the tree
into the event (`connectors.serializers.mapping`), as for JSON. Several schema versions can
share a topic: each record names its own.

What each bad input gets: a wrong magic byte or a short record, `WireFormatError`; an unknown
schema id, `UnknownSchema`; a schema of another format than `--value-format`, or one its parser
refuses, `SchemaRefused`; a payload that does not decode with its schema, `UndecodablePayload`;
then the mapping's own (a field that is not a feature, a bad label, ...). All are dead letters.
An Avro schema's invalid decimal is read as its bytes or fixed, as the spec says: one WARNING
per schema names the field, why and the fix (`avro.parse_schema`'s `ignored`).
A registry that cannot be reached raises `RegistryUnavailable` out of `decode`: not a dead
letter, the worker waits for it (`connectors.worker.worker`).
"""

from __future__ import annotations

import json
import logging
import typing

from connectors.codec import DeadLetter
from connectors.serializers import avro, avro_events, wire
from connectors.serializers.json_format import check_size, json_tree
from connectors.serializers.mapping import EventMapper, FieldMapping
from connectors.serializers.schema_registry import (
    RegisteredSchema,
    SchemaRefused,
    SchemaRegistry,
)

__all__ = ["SchemaRegistryCodec", "UndecodablePayload", "REGISTRY_FORMATS"]

#: --value-format -> the registry's schemaType.
REGISTRY_FORMATS = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}

log = logging.getLogger("streammargin.kafka")


class UndecodablePayload(DeadLetter):
    """The payload does not decode with the schema the record names."""


class _AvroReader:
    """The events of one Avro schema's records."""

    def __init__(self, schema_id: int, schema: avro.Node, mapper: EventMapper):
        self.schema_id = schema_id
        self.decoder = avro.AvroDecoder(schema)
        self.mapper = mapper
        # The schema's events read without the tree, where the mapping allows
        # (connectors/serializers/avro_events.py); None: the tree and the mapper.
        self.events = avro_events.event_reader(schema, mapper)

    def event(self, value: bytes, key: bytes | None) -> tuple:
        if self.events is not None:
            try:
                return self.events(value, key)
            except avro_events._Fallback:
                pass  # the general path decides, and words the dead letter
        return self.mapper.event(self.tree(value), key)

    def tree(self, value: bytes) -> typing.Any:
        try:
            return self.decoder.decode(memoryview(value)[5:])
        except avro.AvroDataError as error:
            raise UndecodablePayload(f"the Avro payload does not decode with schema "
                                     f"{self.schema_id}: {error}") from None


class _JSONSchemaReader:
    """The events of JSON Schema records: the payload is JSON text (the schema is fetched, so
    that a record naming an unknown id is refused, and not used further: see docs/kafka.md)."""

    def __init__(self, schema_id: int, mapper: EventMapper):
        self.schema_id = schema_id
        self.mapper = mapper

    def tree(self, value: bytes) -> typing.Any:
        return json_tree(memoryview(value)[5:])

    def event(self, value: bytes, key: bytes | None) -> tuple:
        return self.mapper.event(self.tree(value), key)


class SchemaRegistryCodec:
    """A Schema Registry format (`avro`, `protobuf`, `json-schema`) through a field mapping.

    Parameters
    ----------
    value_format
        One of `REGISTRY_FORMATS`.
    registry
        The worker's `SchemaRegistry` (one per process: its cache serves every task).
    mapping, max_record_bytes, multiclass
        As `JSONCodec`'s.
    """

    def __init__(self, value_format: str, registry: SchemaRegistry,
                 mapping: FieldMapping | None = None, max_record_bytes: int = 1 << 20,
                 multiclass: bool = False):
        if value_format not in REGISTRY_FORMATS:
            raise ValueError(f"value_format must be one of {', '.join(REGISTRY_FORMATS)}, "
                             f"got {value_format!r}")
        self.name = value_format
        self.value_format = value_format
        self.schema_type = REGISTRY_FORMATS[value_format]
        self.registry = registry
        self.max_record_bytes = max_record_bytes
        self.multiclass = bool(multiclass)
        if mapping is None:
            mapping = FieldMapping(multiclass=self.multiclass)
        self.mapping = mapping
        self.mapper = mapping.mapper()
        self.reads_key = mapping.id_from_key
        self.emits_indicators = mapping.categorical != "drop"
        self._last_header: bytes | None = None
        self._last_reader: typing.Any = None

    def _reader(self, value: bytes) -> typing.Any:
        check_size(value, self.max_record_bytes)
        schema_id = wire.schema_id_of(value)
        reader = self.registry.schema(schema_id, self._parse, self.value_format)
        self._last_header, self._last_reader = value[:5], reader
        return reader

    def decode(self, value: bytes | None, key: bytes | None = None) -> tuple:
        """`(id, x, y)` of a framed record, or a `DeadLetter` (see the module doc)."""
        # The frame of the record before (a topic's records mostly share one schema): neither
        # the checks nor the registry's cache (its lookup and LRU bookkeeping) again, ~0.5 us.
        header = self._last_header
        if (header is not None and value is not None and value[:5] == header
                and len(value) <= self.max_record_bytes):
            reader = self._last_reader
        else:
            reader = self._reader(value)  # type: ignore[arg-type]
        return reader.event(value, key)

    def decode_label(self, value: bytes | None, key: bytes | None = None) -> tuple:
        """`(id, y)` of a framed record of the label topic."""
        reader = self._reader(value)  # type: ignore[arg-type]
        return self.mapper.label(reader.tree(value), key)

    def named_features_refused(self, topic: str) -> str | None:
        """Why `--features` cannot be read from `topic`'s records, where the latest schema of
        its subject `<topic>-value` (the serializers' default TopicNameStrategy) says so: the
        first field that `--features` names itself and that holds no feature (an array, bytes,
        a fixed), as a cause and a fix. None where the fields can be read, or where no schema
        says (no such subject, a schema that cannot be read): each record then decides, and a
        record whose named field holds no feature is a dead letter naming it.
        `RegistryUnavailable` while the registry does not answer."""
        named = [path for path, children, _ in self.mapper._selections if not children]
        if not named:
            return None
        subject = f"{topic}-value"
        try:
            registered = self.registry.latest(subject)
            if registered is None or registered.schema_type != self.schema_type:
                return None
            holds = _schema_field_kinds(self.value_format, registered,
                                        self.registry.max_schema_bytes)
        except (ValueError, RecursionError):  # (a schema the records will refuse, each)
            return None
        for path in named:
            what = holds(path)
            if what is not None:
                dotted = ".".join(path)
                return (f"--features names {dotted}, but the latest schema of subject "
                        f"{subject} (id {registered.schema_id}) gives it as {what}, which holds "
                        f"no feature. Fix: take {dotted} out of --features (--features '*' "
                        "leaves such fields out)")
        return None

    def _parse(self, registered: RegisteredSchema) -> typing.Any:
        """The reader of a schema the registry gave (`ValueError`: refused, see
        `SchemaRegistry.schema`)."""
        if registered.schema_type != self.schema_type:
            raise SchemaRefused(
                f"schema {registered.schema_id} is {registered.schema_type}, not "
                f"{self.schema_type}: check --value-format (the record was written by a "
                f"{registered.schema_type.lower()} serializer)")
        if self.value_format == "avro":
            ignored: list[str] = []
            schema = avro.parse_schema(registered.text, self.registry.max_schema_bytes,
                                       list(registered.references.values()), ignored)
            for note in ignored:  # (once per schema: the registry caches the reader)
                log.warning("Avro schema %d: %s", registered.schema_id, note,
                            extra={"schema_id": registered.schema_id})
            return _AvroReader(registered.schema_id, schema, self.mapper)
        if self.value_format == "protobuf":
            from connectors.serializers import protobuf

            return protobuf.ProtobufReader(registered, self.mapper)
        return _JSONSchemaReader(registered.schema_id, self.mapper)

    def __repr__(self) -> str:
        return (f"SchemaRegistryCodec({self.value_format}, {self.registry.url}, "
                f"mapping={self.mapping!r})")


def _schema_field_kinds(value_format: str, registered: RegisteredSchema,
                        max_bytes: int) -> typing.Callable[[tuple[str, ...]], str | None]:
    """`holds(path)`: what the field at `path` of the schema's records is, when that holds no
    feature ("an array", "bytes", ...), else None (a number, a string, an object, a field the
    schema does not have). `ValueError` for a schema its parser refuses."""
    if value_format == "avro":
        root = avro.parse_schema(registered.text, max_bytes, list(registered.references.values()))

        def avro_holds(path: tuple[str, ...]) -> str | None:
            node = root
            for part in path:
                node = _non_null(node)
                if node.kind != "record":
                    return None
                node = dict(node.fields).get(part)
                if node is None:
                    return None
            node = _non_null(node)
            if node.kind == "array":
                return "an array"
            if node.kind == "bytes" and node.logical != "decimal":
                return "bytes"
            if node.kind == "fixed" and node.logical != "decimal":
                return f"a fixed of {node.size} bytes"
            return None

        return avro_holds
    if value_format == "protobuf":
        from connectors.serializers import protobuf

        file = protobuf.parse_file(registered.text, references=registered.references,
                                   max_bytes=max_bytes)

        def field_at(message: typing.Any, path: tuple[str, ...]) -> typing.Any:
            field = None
            for part in path:
                if message is None:
                    return None
                field = message.by_name.get(part)
                if field is None:
                    return None
                message = None if field.repeated else field.message
            return field

        def protobuf_holds(path: tuple[str, ...]) -> str | None:
            # (the schema does not say which of its messages the records are, their message
            # indexes do: refused only where every top-level message with the path agrees)
            found = [field_at(message, path) for message in file.messages]
            kinds = [protobuf.holds_no_feature(field) for field in found if field is not None]
            if kinds and all(kinds):
                return kinds[0]
            return None

        return protobuf_holds
    schema = json.loads(registered.text)

    def json_schema_holds(path: tuple[str, ...]) -> str | None:
        node = schema
        for part in path:
            properties = node.get("properties") if type(node) is dict else None
            node = properties.get(part) if type(properties) is dict else None
            if node is None:
                return None
        kinds = node.get("type") if type(node) is dict else None
        kinds = kinds if type(kinds) is list else [kinds]
        if "array" in kinds and not {"number", "integer", "boolean", "string", "object"} & set(
                k for k in kinds if type(k) is str):
            return "an array"
        return None

    return json_schema_holds


def _non_null(node: avro.Node) -> avro.Node:
    """T of an Avro union [null, T] (or [T, null]), else the node."""
    if node.kind == "union":
        others = [branch for branch in node.branches if branch.kind != "null"]
        if len(others) == 1:
            return others[0]
    return node
