"""Records read a batch at a time: `JsonBatches`, the Python side of `event_batches.c`.

The Kafka worker's batch path (`connectors/task/batch.py`) reads a poll's JSON records into
arrays in one call (`read`): each record whose *skeleton* (its JSON without its numbers, see
`event_batches.c`) is known becomes a row of numbers, with its id's JSON and its label's code.
A skeleton is learnt from a record of it (`describe`) through the codec's own decoding (the
reference): the numbers of the record are replaced by probes (distinct values), the codec's
mapping makes the event of that tree, and each feature of the event is then a probe's number (a
hole of the row), or a constant of the skeleton (a boolean's 0/1, a category's indicator). The
real record's event must be what the probes say, to the last bit of every number, or the
skeleton is refused and its records take the per-record path: a skeleton's records give events
that differ only in their numbers, since everything else of them is in the skeleton.

Which mappings: the built-in JSON codec (`JSONCodec`) with the id and the label in top-level
fields (not `--id-from-key`). Everything else (and a record `event_batches.c` cannot read)
takes the per-record path.
"""

from __future__ import annotations

import json
import struct
import typing

from connectors.codec import DeadLetter
from connectors.serializers.json_format import JSONCodec, json_tree

__all__ = ["JsonBatches", "Shape", "batches_of"]

_DOUBLE = struct.Struct("<d")


class Shape(typing.NamedTuple):
    """What a skeleton's records hold: their features in the order of the event's dict, each
    (name, hole or None, constant): a hole's number, or a constant (0/1 for a boolean, True for
    a category indicator)."""

    entries: tuple[tuple[typing.Any, int | None, typing.Any], ...]


def _native() -> typing.Any:
    from streammargin.jit import aot

    return aot.native("event_batches")


class JsonBatches:
    """A JSON codec's records read a batch at a time (see the module doc); `batches_of(codec)`
    gives one where the codec and its mapping allow, else None."""

    def __init__(self, codec: JSONCodec, module: typing.Any):
        mapper = codec.mapper
        self._module = module
        self._id_key = mapper._id_path[0]
        self._label_key = mapper._label_path[0]
        selections = mapper._selections
        if any(not selection.path for selection in selections):  # `*`: every field...
            self._keep = None
            skip = mapper._excluded_at.get("", frozenset()) - {self._id_key, self._label_key}
            self._skip = tuple(sorted(skip))  # ...but those excluded
        else:  # the top-level fields the selections start at
            self._keep = tuple(sorted({selection.path[0] for selection in selections}))
            self._skip = ()
        self.config = (
            self._id_key.encode(), self._label_key.encode(),
            None if self._keep is None else tuple(name.encode() for name in self._keep),
            tuple(name.encode() for name in self._skip),
            mapper.categorical != "drop", codec.max_record_bytes,
        )
        # The reference: the codec's decoding with a mapper of its own, so that learning a
        # skeleton counts nothing twice (the per-record path decoded the record already).
        self._reference = JSONCodec(codec.max_record_bytes, codec.multiclass, codec.mapping)

    def read(self, records: list, start: int, end: int, skeletons: dict, labels: tuple,
             status: typing.Any, rows: typing.Any, holes: typing.Any, ids: typing.Any,
             id_ends: typing.Any) -> tuple[int, int, int]:
        """`event_batches.c`'s `read_json` of records[start:end] (see there)."""
        kind = type(records[start]) if end > start else None
        fields = getattr(kind, "_fields", None)  # (a named tuple: its value read by index)
        value_at = fields.index("value") if fields is not None and "value" in fields else -1
        return self._module.read_json(records, start, end, self.config, skeletons, labels, -1,
                                      status, rows, holes, ids, id_ends,
                                      kind if value_at >= 0 else None, value_at)

    def describe(self, value: bytes) -> tuple[bytes | None, Shape | None]:
        """The skeleton of a record and the shape of its records, or None (the skeleton's
        records take the per-record path; a skeleton None: this record cannot be read)."""
        found = self._module.describe_json(value, self.config)
        if found is None:
            return None, None
        skeleton, numbers, id_text, label_text = found
        try:
            return skeleton, self._shape(value, numbers, id_text, label_text)
        except DeadLetter:
            return None, None  # (its id or label, maybe: not the skeleton's fault)
        except (ValueError, RecursionError):
            return skeleton, None

    def label_text(self, value: typing.Any) -> bytes | None:
        """The JSON text of a record's label (None: none, or a record this cannot read)."""
        if type(value) is not bytes:
            return None
        found = self._module.describe_json(value, self.config)
        return None if found is None else found[3]

    def label(self, text: bytes) -> typing.Any:
        """The label of a label's JSON text, as the codec reads it (a `DeadLetter` if it
        refuses it)."""
        try:
            value = json.loads(text)
        except ValueError:
            raise DeadLetter("not a label") from None
        return self._reference.mapper.label_of(value)

    def _shape(self, value: bytes, numbers: list[float], id_text: bytes | None,
               label_text: bytes | None) -> Shape | None:
        reference = self._reference
        mapper = reference.mapper
        left_out = sum(mapper.left_out.values())
        tree = json_tree(value)
        if type(tree) is not dict:
            return None
        probes = [0]
        probed = {key: item if not self._read(key) else _probed(item, probes)
                  for key, item in tree.items()}
        if probes[0] != len(numbers):
            return None  # (a field twice: the tree kept one)
        _, probe_x, _ = mapper.event(probed)
        event_id, x, y = reference.decode(value)
        if x is None or probe_x is None or sum(mapper.left_out.values()) != left_out:
            return None  # a label record, or fields left out: the per-record path
        if list(x) != list(probe_x):
            return None
        entries = []
        used = set()
        for (name, real), probe in zip(x.items(), probe_x.values()):
            if type(probe) is float:
                hole = int(probe)
                if probe != hole + 0.5 or not 0 <= hole < len(numbers) or hole in used:
                    return None
                used.add(hole)
                if type(real) not in (int, float) or type(real) is bool or (
                        _DOUBLE.pack(float(real)) != _DOUBLE.pack(numbers[hole])):
                    return None
                entries.append((name, hole, None))
            elif (probe is True and real is True) or (
                    type(probe) is int and type(real) is int and probe == real in (0, 1)):
                entries.append((name, None, probe))
            else:
                return None
        if (id_text is None) != (event_id is None):
            return None
        if id_text is not None:
            parsed = json.loads(id_text)
            if type(parsed) is not type(event_id) or parsed != event_id:
                return None
        label = None if label_text is None else self.label(label_text)
        if type(label) is not type(y) or label != y:
            return None
        return Shape(tuple(entries))

    def _read(self, key: str) -> bool:
        """Whether `event_batches.c` reads a top-level field's numbers as holes."""
        if key == self._id_key or key == self._label_key:
            return False
        if self._keep is not None:
            return key in self._keep
        return key not in self._skip


def _probed(value: typing.Any, probes: list[int]) -> typing.Any:
    """`value` with each number replaced by the next probe (k + 0.5), in document order."""
    kind = type(value)
    if kind is dict:
        return {key: _probed(item, probes) for key, item in value.items()}
    if kind is list:
        return [_probed(item, probes) for item in value]
    if kind is int or kind is float:
        probe = probes[0] + 0.5
        probes[0] += 1
        return probe
    return value


def batches_of(codec: typing.Any) -> JsonBatches | None:
    """The batch reader of `codec`, or None: not the built-in JSON codec, a mapping whose id or
    label is not a top-level field or comes from the key, or `event_batches.c` not built."""
    if type(codec) is not JSONCodec:
        return None
    mapper = codec.mapper
    if mapper.id_from_key or len(mapper._id_path) != 1 or len(mapper._label_path) != 1:
        return None
    module = _native()
    if module is None:
        return None
    return JsonBatches(codec, module)
