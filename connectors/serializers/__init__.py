"""Record formats: what turns a topic's records into events, and the worker's outputs into bytes.

- `mapping.py`: `FieldMapping` (`--label-field`, `--id-field`, `--features`, ...) and
  `EventMapper`, the tree of a decoded record -> the event `(id, x, y)`, for every format;
- `json_format.py`: `JSONCodec`, JSON records (the envelope `{"id", "x", "y"}` by default);
- `wire.py`: Confluent's wire format (magic byte, schema id, Protobuf's message indexes);
- `schema_registry.py`: `SchemaRegistry`, schemas by id within bounds, outages, registration;
- `registry_codec.py`: `SchemaRegistryCodec`, Avro, Protobuf and JSON Schema records;
- `avro.py`, `protobuf.py`: each format's bounded schema parser and payload decoder;
- `outputs.py`: the worker's predictions and metrics in Avro (`--output-format avro`).

`make_codec` builds the codec of a worker's settings; `get_codec` one by name or import path
("package.module:Class", a class with `decode(value)` returning an event or raising
`connectors.codec.DeadLetter`).
"""

from __future__ import annotations

import importlib
import typing

__all__ = ["Codec", "VALUE_FORMATS", "OUTPUT_FORMATS", "get_codec", "make_codec"]

#: --value-format: JSON as it is, or a Schema Registry format.
VALUE_FORMATS = ("json", "avro", "protobuf", "json-schema")
#: --output-format of predictions and metrics.
OUTPUT_FORMATS = ("json", "avro")

Event = tuple[typing.Any, typing.Optional[dict], typing.Any]


class Codec(typing.Protocol):
    """What the worker needs from a codec (`reads_key`, `decode_label` and `emits_indicators`
    are optional: a codec without them is given values only, serves no label topic, and its
    features are all numbers)."""

    def decode(self, value: bytes | None) -> Event:
        """`(id, x, y)` of a record value, or raise `DeadLetter(reason)`."""


def get_codec(spec: str = "json", **options: typing.Any) -> Codec:
    """A codec by name ("json") or by import path ("package.module:ClassName")."""
    if spec == "json":
        from connectors.serializers.json_format import JSONCodec

        cls: typing.Any = JSONCodec
    else:
        module_name, _, class_name = spec.partition(":")
        if not class_name:
            raise ValueError(
                f"unknown codec {spec!r}: use json or 'package.module:Class' (Avro, Protobuf and "
                "JSON Schema are --value-format avro|protobuf|json-schema)"
            )
        cls = getattr(importlib.import_module(module_name), class_name)
    codec = cls(**options)
    if not callable(getattr(codec, "decode", None)):
        raise ValueError(f"codec {spec!r} has no decode(value) method")
    return codec


def make_codec(value_format: str, mapping: typing.Any, max_record_bytes: int,
               registry: typing.Any = None) -> Codec:
    """The built-in codec of `value_format` with `mapping` (`FieldMapping`); `registry` (a
    `SchemaRegistry`) for the Schema Registry formats."""
    if value_format == "json":
        return get_codec("json", max_record_bytes=max_record_bytes,
                         multiclass=mapping.multiclass, mapping=mapping)
    from connectors.serializers.registry_codec import SchemaRegistryCodec

    if registry is None:
        raise ValueError(f"--value-format {value_format} needs --schema-registry-url URL")
    return SchemaRegistryCodec(value_format, registry, mapping, max_record_bytes,
                               mapping.multiclass)
