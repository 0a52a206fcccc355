"""Records read a batch at a time: `JsonBatches` and `AvroBatches`, the Python side of
`event_batches.c`.

The Kafka worker's batch path (`connectors/task/batch.py`) reads a poll's records into arrays
in one call (`read`): each record whose *skeleton* (the record without its numbers, see
`event_batches.c`) is known becomes a row of numbers, with its id's JSON and its label's code.
A skeleton is learnt from a record of it (`describe`) through the codec's own decoding (the
reference): the numbers of the record's tree are replaced by probes (distinct values), the
codec's mapping makes the event of that tree, and each feature of the event is then a probe's
number (a hole of the row), or a constant of the skeleton (a boolean's 0/1, a category's
indicator). The real record's event must be what the probes say, to the last bit of every
number, or the skeleton is refused and its records take the per-record path: a skeleton's
records give events that differ only in their numbers, since everything else of them is in the
skeleton.

Which mappings: the built-in JSON codec (`JSONCodec`) with the id and the label in top-level
fields, and Avro behind a Schema Registry (`SchemaRegistryCodec`) for the schemas whose events
`avro_events` reads in C (its plan: the id and a boolean label in top-level fields, scalar
features); not `--id-from-key`. Everything else (and a record `event_batches.c` cannot read)
takes the per-record path.
"""

from __future__ import annotations

import json
import struct
import typing

from connectors.codec import DeadLetter
from connectors.serializers.json_format import JSONCodec, json_tree

__all__ = ["AvroBatches", "JsonBatches", "Shape", "batches_of"]

_DOUBLE = struct.Struct("<d")


class Shape(typing.NamedTuple):
    """What a skeleton's records hold: their features in the order of the event's dict, each
    (name, hole or None, constant): a hole's number, or a constant (0/1 for a boolean, True for
    a category indicator)."""

    entries: tuple[tuple[typing.Any, int | None, typing.Any], ...]


def _native() -> typing.Any:
    from streammargin.jit import aot

    return aot.native("event_batches")


def _value_field(records: list, start: int, end: int) -> tuple[typing.Any, int]:
    """The records' type and the index of their field `value` where they are named tuples
    (read by index in C), else (None, -1)."""
    kind = type(records[start]) if end > start else None
    fields = getattr(kind, "_fields", None)
    value_at = fields.index("value") if fields is not None and "value" in fields else -1
    return (kind if value_at >= 0 else None), value_at


class _Skeletons:
    """What the JSON and the Avro readers share: a record's skeleton and shape from what the
    C reader found in it."""

    def _described(self, value: bytes, found: tuple | None
                   ) -> tuple[bytes | None, Shape | None]:
        """(skeleton, shape) of a record from the reader's (skeleton, numbers, id text, label
        text), or None for either (see `JsonBatches.describe`)."""
        if found is None:
            return None, None
        skeleton, numbers, id_text, label_text = found
        try:
            return skeleton, self._shape(value, numbers, id_text, label_text)
        except DeadLetter:
            return None, None  # (its id or label, maybe: not the skeleton's fault)
        except (ValueError, RecursionError):
            return skeleton, None


class JsonBatches(_Skeletons):
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
        kind, value_at = _value_field(records, start, end)
        return self._module.read_json(records, start, end, self.config, skeletons, labels, -1,
                                      status, rows, holes, ids, id_ends, kind, value_at)

    def changed(self) -> bool:
        """Whether rows read before may be stale now (never: a JSON skeleton's shape holds)."""
        return False

    def describe(self, value: bytes) -> tuple[bytes | None, Shape | None]:
        """The skeleton of a record and the shape of its records, or None (the skeleton's
        records take the per-record path; a skeleton None: this record cannot be read)."""
        return self._described(value, self._module.describe_json(value, self.config))

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
        if sum(mapper.left_out.values()) != left_out:
            return None  # fields left out: the per-record path counts them
        return _shape(x, probe_x, numbers, event_id, id_text, y, label_text, self.label)

    def _read(self, key: str) -> bool:
        """Whether `event_batches.c` reads a top-level field's numbers as holes."""
        if key == self._id_key or key == self._label_key:
            return False
        if self._keep is not None:
            return key in self._keep
        return key not in self._skip


class AvroBatches(_Skeletons):
    """A Schema Registry codec's Avro records read a batch at a time (see the module doc).

    A schema's records are read with its plan (`avro_events`: the instructions `events.c` runs
    for one record), learnt from the registry's cache once the per-record path has decoded a
    record of it (`SchemaRegistry.cached`: nothing is fetched here); a schema without a plan
    takes the per-record path. While a schema stays in that cache its plan holds: a schema id's text
    never changes. The per-record path fetches a schema again once the cache has let it go, and
    may then refuse its records (the registry lost it) or wait (an outage), so a plan is
    forgotten with its schema: its records are learnt again through the per-record path. What
    the batch path does not do is the per-record path's lookups, which order the cache: which
    schema the cache lets go first may differ, never what a record gives."""

    def __init__(self, codec: typing.Any, module: typing.Any):
        from connectors.serializers.registry_codec import _AvroReader

        self._module = module
        self._codec = codec
        self._registry = codec.registry
        self._make_reader = _AvroReader
        #: frame (its first 5 bytes) -> (plan, enum tables), or None: no plan.
        self.plans: dict[bytes, tuple | None] = {}
        # frame -> (the registry's cached reader, the reference: a reader of its schema with a
        # mapper of its own, so that learning counts nothing twice)
        self._readers: dict[bytes, tuple] = {}
        self._mapper = codec.mapping.mapper()
        self.config = (self.plans, codec.max_record_bytes)
        self._requests = -1  # the registry's requests when the plans were last checked

    def read(self, records: list, start: int, end: int, skeletons: dict, labels: tuple,
             status: typing.Any, rows: typing.Any, holes: typing.Any, ids: typing.Any,
             id_ends: typing.Any) -> tuple[int, int, int]:
        """`event_batches.c`'s `read_avro` of records[start:end] (see there)."""
        if self.changed():
            self._check(skeletons)
        kind, value_at = _value_field(records, start, end)
        return self._module.read_avro(records, start, end, self.config, skeletons, labels, -1,
                                      status, rows, holes, ids, id_ends, kind, value_at)

    def changed(self) -> bool:
        """Whether the registry fetched a schema since the plans were checked (its cache may
        have let one go: rows read before may be stale)."""
        return self._registry.requests.total() != self._requests

    def _check(self, skeletons: dict) -> None:
        """Forget the plans (and their skeletons) of the schemas the registry's cache let go."""
        self._requests = self._registry.requests.total()
        cached = self._cached
        gone = [frame for frame, (reader, _) in self._readers.items()
                if cached(frame) is not reader]
        gone += [frame for frame, plan in self.plans.items()
                 if plan is None and cached(frame) is None]
        for frame in gone:
            self.plans.pop(frame, None)
            self._readers.pop(frame, None)
            for skeleton in [s for s in skeletons if s[:5] == frame]:
                del skeletons[skeleton]

    def _cached(self, frame: bytes) -> typing.Any:
        """The registry's cached reader of a frame's schema, or None."""
        return self._registry.cached(int.from_bytes(frame[1:5], "big"), self._codec.value_format)

    def _plan(self, frame: bytes) -> bool:
        """Learn the plan of a frame's schema from the registry's cache; whether it is known
        now (with a plan or as one without)."""
        if frame in self.plans:
            return True
        if len(frame) != 5 or frame[0] != 0:
            return False
        reader = self._cached(frame)
        if reader is None:
            return False  # (not decoded yet, or refused: each record decides)
        plan = getattr(getattr(reader, "events", None), "plan", None)
        if plan is None:
            self.plans[frame] = None
            return True
        reference = self._make_reader(reader.schema_id, reader.decoder.schema, self._mapper)
        if getattr(reference.events, "plan", None) != plan:
            self.plans[frame] = None  # (a mapping of another codec's: not this one's plan)
            return True
        self.plans[frame] = plan
        self._readers[frame] = (reader, reference)
        return True

    def describe(self, value: bytes) -> tuple[bytes | None, Shape | None]:
        """The skeleton of a record and the shape of its records, or None (see
        `JsonBatches.describe`)."""
        if self._requests < 0:
            self._requests = self._registry.requests.total()
        if type(value) is not bytes or not self._plan(value[:5]):
            return None, None
        return self._described(value, self._module.describe_avro(value, self.config))

    def label_text(self, value: typing.Any) -> bytes | None:
        """The JSON text of a record's label (None: none, or a record this cannot read)."""
        if type(value) is not bytes:
            return None
        found = self._module.describe_avro(value, self.config)
        return None if found is None else found[3]

    def label(self, text: bytes) -> typing.Any:
        """The label of a label's text as the plan reads it (a boolean, or null)."""
        labels = {b"true": True, b"false": False, b"null": None}
        if text not in labels:
            raise DeadLetter("not a label")
        return labels[text]

    def _shape(self, value: bytes, numbers: list[float], id_text: bytes | None,
               label_text: bytes | None) -> Shape | None:
        _, reference = self._readers[value[:5]]
        mapper = self._mapper
        left_out = sum(mapper.left_out.values())
        tree = reference.tree(value)
        if type(tree) is not dict:
            return None
        probes = [0]
        path, _, _ = mapper._selections[0]
        if path:  # `P.*`: the fields of record P, but those excluded
            skip = mapper._excluded_at.get(path[0] + ".", frozenset())
            inner = tree.get(path[0])
            if type(inner) is not dict:
                return None
            probed = dict(tree)
            probed[path[0]] = {key: item if key in skip else _probed(item, probes)
                               for key, item in inner.items()}
        else:  # `*`: every top-level field but the id, the label and those excluded
            skip = mapper._excluded_at.get("", frozenset()) | {mapper._id_path[0],
                                                               mapper._label_path[0]}
            probed = {key: item if key in skip else _probed(item, probes)
                      for key, item in tree.items()}
        if probes[0] != len(numbers):
            return None
        _, probe_x, _ = mapper.event(probed)
        event_id, x, y = reference.event(value, None)
        if sum(mapper.left_out.values()) != left_out:
            return None
        return _shape(x, probe_x, numbers, event_id, id_text, y, label_text, self.label)


def _shape(x: dict | None, probe_x: dict | None, numbers: list[float], event_id: typing.Any,
           id_text: bytes | None, y: typing.Any, label_text: bytes | None,
           label_of: typing.Callable[[bytes], typing.Any]) -> Shape | None:
    """The shape of a record's skeleton: its event (`x`, `event_id`, `y`, the reference's) as
    the probes say (`probe_x`), with the record's `numbers`, id and label as the reader read
    them; None where anything differs."""
    if x is None or probe_x is None:
        return None  # a label record: the per-record path
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
    label = None if label_text is None else label_of(label_text)
    if type(label) is not type(y) or label != y:
        return None
    return Shape(tuple(entries))


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


def batches_of(codec: typing.Any) -> JsonBatches | AvroBatches | None:
    """The batch reader of `codec`, or None: not the built-in JSON codec nor Avro behind a
    registry, a mapping whose id or label is not a top-level field or comes from the key, or
    `event_batches.c` not built."""
    mapper = getattr(codec, "mapper", None)
    if mapper is None or mapper.id_from_key or len(mapper._id_path) != 1 or len(
            mapper._label_path) != 1:
        return None
    if type(codec) is JSONCodec:
        module = _native()
        return None if module is None else JsonBatches(codec, module)
    from connectors.serializers.registry_codec import SchemaRegistryCodec

    if (type(codec) is SchemaRegistryCodec and codec.value_format == "avro"
            and len(mapper._selections) == 1 and hasattr(codec.registry, "cached")):
        module = _native()
        return None if module is None else AvroBatches(codec, module)
    return None
