"""Field mapping: a decoded record (a tree of dicts, lists and scalars) -> an event `(id, x, y)`.

Every input format decodes into the same tree as JSON (objects are dicts, Avro records and
Protobuf messages too), and one `FieldMapping` turns that tree into the event the worker needs:

- the **label** at `label_field` (a dotted PATH, default `y`), the **id** at `id_field` (default
  `id`), or the record's key as the id (`id_from_key`);
- the **features**, selected by `features` (PATH[,PATH...]) minus `exclude_features`:

  - `*`: every top-level field but the id and label fields; `P.*`: every field of the object at
    P, named relative to P; `P`: the field P, named P. The default is `x.*`, which reads the
    project's envelope `{"id", "x": {...}, "y"}` with the names it always had;
  - nested objects are flattened with dotted names (`merchant.risk`); a PATH segment with a dot
    of its own is written with a backslash (`a\\.b`);

- **values as they come**: numbers are features; booleans are 0/1; strings and enums are
  categories (`categorical`: `onehot`, a feature `field=value` of value 1, the default; `hash`,
  a feature `field#bucket`, the value's CRC-32 modulo `hash_buckets`; `drop`); null or missing
  is an absent feature.
- **values that cannot be features** (an array, empty or not; bytes, an Avro fixed; a string
  longer than `MAX_CATEGORY_CHARS` under one-hot; NaN, an infinity, a number beyond float64):
  one rule for every format. Where a wildcard (`*`, `P.*`, or the fields of an object `P`
  names) reaches such a field, it is *left out* and the record is predicted: a valid record is
  never a dead letter for a field the user did not ask for. The mapper counts what it left out
  by kind (`left_out`) and names the first `MAX_LEFT_OUT_NAMES` such fields
  (`left_out_fields`, and `new_left_out` for the worker's one WARNING a field). A field that
  `--features` names itself is a dead letter naming it instead: the user asked for it.

A category's indicator has the value `True` (the only place `True` is a value: booleans become
the numbers 0 and 1), so that `--scale` can pass it to the model unscaled (`split_indicators`):
River's `StandardScaler` sees only the features present, and an indicator, always 1 where it is
present, would scale to 0 and never reach the model.

A record is a labelled event (features and a label), an event waiting for its label (features,
no label), or a label record (a label and an id, no features). A record with neither features
nor a label is a dead letter whose reason lists the record's fields and the options that would
read it.
"""

from __future__ import annotations

import dataclasses
import typing
import zlib

from connectors.codec import (
    DeadLetter,
    InvalidFeature,
    InvalidRecord,
    _label,
    _multiclass_label,
    _short,
    positive_label_of,
)

__all__ = [
    "FieldMapping",
    "EventMapper",
    "CATEGORICAL",
    "DEFAULT_FEATURES",
    "MAX_CATEGORY_CHARS",
    "MAX_DEPTH",
    "MAX_LEFT_OUT_NAMES",
    "LEFT_OUT_KINDS",
    "parse_path",
    "parse_paths",
    "split_indicators",
]

#: How strings and enums become features.
CATEGORICAL = ("onehot", "hash", "drop")
DEFAULT_FEATURES = ("x.*",)
#: A string longer than this is not a category (one-hot): a dead letter naming the field, unless
#: the mapping hashes or drops strings. Names of features are kept per waiting event and per
#: model column, and a free-text field would make each record a category of its own.
MAX_CATEGORY_CHARS = 256
#: Objects nested deeper than this are a dead letter (the decoders bound their own depth too).
MAX_DEPTH = 32
#: The fields left out (values that cannot be features) named at most, each once: a topic's
#: fields are its schema's, but a JSON topic could name a new field in every record.
MAX_LEFT_OUT_NAMES = 64
#: What a field left out held (the counts of `EventMapper.left_out`, a closed set).
LEFT_OUT_KINDS = ("array", "bytes", "long_string", "non_finite")
# Category names made so far, shared by the events that carry them (a waiting event keeps its
# names): bounded, emptied when full.
_NAME_CACHE_SIZE = 1 << 16
_MAX_FLOAT = 1.7976931348623157e308
_NOTHING: frozenset = frozenset()


def parse_path(text: str) -> tuple[str, ...]:
    """`a.b\\.c` -> ("a", "b.c"): a dotted path, a backslash escaping a dot (or a backslash)."""
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ".":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if escaped:
        raise ValueError(f"field path {text!r} ends with a lone backslash")
    parts.append("".join(current))
    if any(part == "" for part in parts):
        raise ValueError(f"field path {text!r} has an empty segment: write PATH as "
                         "field.subfield (a backslash escapes a dot inside a field name)")
    return tuple(parts)


def parse_paths(text: str | typing.Sequence[str]) -> tuple[str, ...]:
    """A comma-separated list of paths (or a sequence of them) as a tuple of strings."""
    items = text.split(",") if isinstance(text, str) else list(text)
    return tuple(item.strip() for item in items if item.strip())


def _dotted(parts: typing.Sequence[str]) -> str:
    return ".".join(parts)


def split_indicators(x: dict) -> tuple[dict, dict]:
    """`x` as (numbers, category indicators): the indicators are the features of value True
    (in C where events.c is built: `indicator_splitter`)."""
    numbers = {}
    indicators = {}
    for name, value in x.items():
        if value is True:
            indicators[name] = value
        else:
            numbers[name] = value
    return numbers, indicators


def indicator_splitter() -> typing.Callable[[dict], tuple[dict, dict]]:
    """`split_indicators`, the C one where events.c is built (~0.2 us against ~1 us a record
    of 12 features)."""
    native = _native_module()
    return split_indicators if native is None else native.split_indicators


class _Selection(typing.NamedTuple):
    """One entry of `--features`: the field at `path`, or (`children`, `P.*` and `*`) each field
    of the object at `path`, named relative to it; `name` is the path dotted."""

    path: tuple[str, ...]
    children: bool
    name: str


@dataclasses.dataclass(frozen=True)
class FieldMapping:
    """Where a record's id, label and features are, and how values become features: the
    settings (`--label-field`, `--id-field`, `--id-from-key`, `--features`,
    `--exclude-features`, `--categorical`, `--hash-buckets`), checked when made. `mapper()`
    gives the `EventMapper` that applies them."""

    label_field: str = "y"
    id_field: str = "id"
    id_from_key: bool = False
    features: tuple[str, ...] = DEFAULT_FEATURES
    exclude_features: tuple[str, ...] = ()
    categorical: str = "onehot"
    hash_buckets: int = 1024
    multiclass: bool = False
    #: --positive-label: a binary model's labels, any two: this one is True, the other False.
    positive_label: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", parse_paths(self.features))
        object.__setattr__(self, "exclude_features", parse_paths(self.exclude_features))
        if not self.features:
            raise ValueError("--features needs at least one PATH ('*' for every field)")
        if self.categorical not in CATEGORICAL:
            raise ValueError(f"categorical must be one of {', '.join(CATEGORICAL)}, "
                             f"got {self.categorical!r}")
        if type(self.hash_buckets) is not int or not 1 <= self.hash_buckets <= 1 << 24:
            raise ValueError(f"hash_buckets must be an integer in [1, 2**24], "
                             f"got {self.hash_buckets!r}")
        for text in (*self.features, *self.exclude_features):
            if text != "*":
                parse_path(text[:-2] if text.endswith(".*") else text)
        if parse_path(self.label_field) == parse_path(self.id_field) and not self.id_from_key:
            raise ValueError(f"the label field and the id field are the same field "
                             f"{self.label_field!r}")
        if self.positive_label is not None:
            if type(self.positive_label) is not str or not self.positive_label:
                raise ValueError(f"--positive-label must be a label's text, got "
                                 f"{self.positive_label!r:.60}")
            if self.multiclass:
                raise ValueError("--positive-label names the positive class of a binary model: "
                                 "a multiclass model (--one-vs-rest, or natively multiclass) "
                                 "takes the labels as they come. Fix: drop --positive-label")

    def label_function(self) -> typing.Callable[[typing.Any], typing.Any]:
        """A label's value as the model takes it (`connectors.codec`): True/False for a binary
        model (`positive_label` decides, if given), as it came for a multiclass one."""
        if self.positive_label is not None:
            return positive_label_of(self.positive_label)
        return _multiclass_label if self.multiclass else _label

    @property
    def is_default(self) -> bool:
        """Whether this is the mapping of the envelope `{"id", "x", "y"}` (the defaults; the
        labels may be read with a positive label)."""
        return self == FieldMapping(multiclass=self.multiclass,
                                    positive_label=self.positive_label)

    def mapper(self) -> EventMapper:
        return EventMapper(self)


class EventMapper:
    """A `FieldMapping` at work: the event of each decoded record (see the module doc).

    Examples
    --------

    >>> mapper = FieldMapping(label_field="is_fraud", id_field="transaction_id",
    ...                       features=("*",)).mapper()
    >>> mapper.event({"transaction_id": "t7", "amount": 31.2, "country": "BR",
    ...               "card_present": False, "merchant": {"category": "travel", "risk": 0.91},
    ...               "is_fraud": True})
    ('t7', {'amount': 31.2, 'country=BR': True, 'card_present': 0, 'merchant.category=travel': True, 'merchant.risk': 0.91}, True)
    >>> FieldMapping().mapper().event({"id": "a1", "x": {"amount": 12.5}, "y": 1})
    ('a1', {'amount': 12.5}, True)

    A field that cannot be a feature is left out where a wildcard reaches it, and counted; it
    is a dead letter where `--features` names it:

    >>> mapper = FieldMapping(features=("*",)).mapper()
    >>> mapper.event({"id": 3, "amount": 2.5, "tags": ["a", "b"], "y": 0})
    (3, {'amount': 2.5}, False)
    >>> mapper.left_out["array"], mapper.left_out_fields
    (1, {'tags': 'array'})
    >>> try:
    ...     FieldMapping(features=("amount", "tags")).mapper().event({"tags": ["a"], "y": 0})
    ... except InvalidFeature as error:
    ...     print(error)
    field 'tags' holds an array: arrays are not features, and --features names it. Fix: take tags out of --features

    """

    def __init__(self, mapping: FieldMapping):
        self.mapping = mapping
        self.label_field = mapping.label_field
        self.id_field = mapping.id_field
        self.id_from_key = mapping.id_from_key
        self.categorical = mapping.categorical
        self.hash_buckets = mapping.hash_buckets
        label = parse_path(mapping.label_field)
        ident = parse_path(mapping.id_field)
        selections = []
        for text in mapping.features:
            if text == "*":
                path, children = (), True
            elif text.endswith(".*"):
                path, children = parse_path(text[:-2]), True
            else:
                path, children = parse_path(text), False
            selections.append(_Selection(path, children, _dotted(path)))
        excluded = {parse_path(text) for text in mapping.exclude_features}
        excluded.add(label)
        if not mapping.id_from_key:
            excluded.add(ident)
        # Exclusions by the place of the object that holds them: "" for the record's own
        # fields, "merchant." for those of the object at merchant.
        excluded_at: dict[str, set] = {}
        for path in excluded:
            at = "".join(part + "." for part in path[:-1])
            excluded_at.setdefault(at, set()).add(path[-1])
        self._label_path = label
        self._id_path = ident
        self._selections = tuple(selections)
        self._excluded_at = {at: frozenset(names) for at, names in excluded_at.items()}
        self._label_of = mapping.label_function()
        # feature -> category -> the indicator's name, made once (at most _NAME_CACHE_SIZE).
        self._names: dict[str, dict[str, str]] = {}
        self._cached = 0
        #: The category indicators of the last event made (0: its features are all numbers, so
        #: `--scale` need not split them out: `PartitionTask`).
        self.indicators = 0
        #: Fields left out of the features, by what they held (`LEFT_OUT_KINDS`): one count a
        #: field of a record.
        self.left_out: dict[str, int] = dict.fromkeys(LEFT_OUT_KINDS, 0)
        #: The first `MAX_LEFT_OUT_NAMES` fields left out (path -> kind), and those not yet
        #: reported (the worker takes them: one WARNING a field).
        self.left_out_fields: dict[str, str] = {}
        self.new_left_out: list[tuple[str, str]] = []
        self._flat = self._flat_reader()

    # Reading a record ---------------------------------------------------------------------

    def event(self, record: typing.Any, key: bytes | None = None) -> tuple:
        """`(id, x, y)` of a decoded record (the tree), or a `DeadLetter` subclass naming the
        field at fault. `key` is the record's key (`id_from_key`)."""
        flat = self._flat
        if flat is not None and type(record) is dict:
            found = flat(record)
            if found is not None:
                return found
        if type(record) is not dict:
            raise InvalidRecord(f"record is {_kind(record, article=True)}, expected an object of "
                                "fields")
        self.indicators = 0
        event_id = self._event_id(record, key)
        y = self._label_value(record)
        x, found = self._features(record)
        return self.finish(event_id, x, found, y, record)

    def _flat_reader(self) -> typing.Callable[[dict], tuple | None] | None:
        """The event of a flat topic's record (`--features '*'`, the id and the label top-level
        fields, strings one-hot or dropped) in one call and events.c's `map_object`: the general
        path's steps without their calls. None (the general path, which words any dead letter)
        for a record it leaves undecided, and where the mapping or the module differ."""
        native = _native_module()
        if (native is None or self.categorical == "hash" or self.id_from_key
                or len(self._id_path) != 1 or len(self._label_path) != 1
                or self._selections != (_Selection((), True, ""),)):
            return None
        map_object, excluded_at, names = native.map_object, self._excluded_at, self._names
        onehot = self.categorical == "onehot"
        id_key, label_key, label_of = self._id_path[0], self._label_path[0], self._label_of

        def event(record: dict) -> tuple | None:
            event_id = record.get(id_key)
            if event_id is not None and type(event_id) is not str and type(event_id) is not int:
                return None
            y = record.get(label_key)
            if y is not None and y is not True and y is not False:
                try:
                    y = label_of(y)
                except DeadLetter:
                    return None
            x: dict = {}
            added = map_object(x, record, "", "", excluded_at, names, onehot, 1)
            if added is None or not x:
                return None
            self.indicators = added
            return event_id, x, y

        return event

    def finish(self, event_id: typing.Any, x: dict, found: bool, y: typing.Any,
               fields: typing.Iterable) -> tuple:
        """The event of a record's id, features (`found`: it has some) and label; `fields`, the
        record's field names, for the reason of a record that has none of them."""
        if not found:
            if y is None:
                raise InvalidRecord(self._nothing_found(fields))
            if event_id is None:
                raise InvalidRecord(
                    f"label record without an id: no id at --id-field {self.id_field}"
                    + ("" if not self.id_from_key else " (the record key, --id-from-key, is "
                       "null)") + ", so it cannot be joined to its event")
            return event_id, None, y
        return event_id, x, y

    def label(self, record: typing.Any, key: bytes | None = None) -> tuple:
        """`(id, y)` of a record of the label topic (its features, if any, are not read)."""
        if type(record) is not dict:
            raise InvalidRecord(f"label record is {_kind(record, article=True)}, expected an "
                                "object of fields")
        event_id = self._event_id(record, key)
        y = self._label_value(record)
        if y is None:
            raise InvalidRecord(f"label record without a label at --label-field "
                                f"{self.label_field}")
        if event_id is None:
            raise InvalidRecord(f"label record without an id at --id-field {self.id_field}: "
                                "it cannot be joined to its event")
        return event_id, y

    def _event_id(self, record: dict, key: bytes | None) -> typing.Any:
        if self.id_from_key:
            if key is None:
                return None
            try:
                return key.decode()
            except UnicodeDecodeError:
                raise InvalidRecord("the record key is not UTF-8 text: --id-from-key reads "
                                    "the key as a string id") from None
        return self.id_of(_at(record, self._id_path))

    def id_of(self, value: typing.Any) -> typing.Any:
        """The id of the value at --id-field (None: none)."""
        if value is None or type(value) is str or type(value) is int:
            return value
        raise InvalidRecord(f"id {_short(value)} must be a string or an integer (--id-field "
                            f"{self.id_field})")

    def _label_value(self, record: dict) -> typing.Any:
        return self.label_of(_at(record, self._label_path))

    def label_of(self, y: typing.Any) -> typing.Any:
        """The label of the value at --label-field (None: none)."""
        if y is None or y is True or y is False:
            return y
        return self._label_of(y)

    def features_of(self, record: dict) -> dict:
        """The feature dict of a record (the tree), named and valued as the class doc says."""
        return self._features(record)[0]

    def _features(self, record: dict) -> tuple[dict, bool]:
        """The features of a record, and whether it has any: a feature, or the object that a
        `P.*` selection names (the envelope's `"x": {}` is an event without features, as it
        always was, not a label record)."""
        native = _native_module() if self.categorical != "hash" else None
        if native is not None:
            try:
                return self._features_with(native.map_object, record)
            except _Undecided:
                self.indicators = 0  # the Python below decides, and words the dead letter
        x: dict = {}
        found = False
        for path, children, name in self._selections:
            value = _at(record, path)
            if value is None:
                continue
            if children:
                if type(value) is not dict:
                    raise InvalidRecord(
                        f"{name} is {_kind(value, article=True)}, not an object of fields "
                        f"(--features {name}.*)")
                found = found or bool(path)
                self._object(x, value, "", name + "." if path else "", 1)
            elif type(value) is dict:
                self._object(x, value, name + ".", name + ".", 1)
            else:
                self._object(x, {name: value}, "", "", 1, named=True)
        return x, found or bool(x)

    def _features_with(self, map_object: typing.Callable, record: dict) -> tuple[dict, bool]:
        """`_features` with each object's fields mapped in C (events.c's `map_object`, the same
        rules as `_object`); `_Undecided` where the C leaves the decision to `_object`."""
        x: dict = {}
        found = False
        excluded_at, names, onehot = self._excluded_at, self._names, self.categorical == "onehot"
        for path, children, name in self._selections:
            value = _at(record, path)
            if value is None:
                continue
            if children:
                if type(value) is not dict:
                    raise _Undecided
                found = found or bool(path)
                added = map_object(x, value, "", name + "." if path else "", excluded_at, names,
                                   onehot, 1)
            elif type(value) is dict:
                added = map_object(x, value, name + ".", name + ".", excluded_at, names, onehot,
                                   1)
            else:
                added = map_object(x, {name: value}, "", "", excluded_at, names, onehot, 1)
            if added is None:
                raise _Undecided
            self.indicators += added
        return x, found or bool(x)

    def _object(self, x: dict, fields: dict, prefix: str, at: str, depth: int,
                named: bool = False) -> None:
        """Add the features of an object's `fields` to `x`: their names start with `prefix`,
        and `at` is the object's place in the record (a dotted path and a dot, "" for the
        record), where exclusions are looked up; `named`: `--features` names these fields
        themselves (a value that cannot be a feature is then a dead letter, not left out). Its
        hot loop: the common cases first, every name made by one concatenation (`"" + name` is
        `name`), no test for an object without exclusions (an empty set)."""
        skip = self._excluded_at.get(at, _NOTHING)
        category = self._category if self.categorical != "drop" else None
        for key, value in fields.items():
            if key in skip:
                continue
            kind = type(value)
            if kind is float:
                if value - value != 0.0:  # NaN or infinite
                    self._leave_out(at + key, "non_finite", named,
                                    f"has value {value!r}: expected a finite real number")
                    continue
                x[prefix + key] = value
            elif kind is str:
                if category is not None:
                    if len(value) > MAX_CATEGORY_CHARS and self.categorical == "onehot":
                        self._leave_out(
                            at + key, "long_string", named,
                            f"has a string of {len(value)} characters: a category has at most "
                            f"{MAX_CATEGORY_CHARS}", "--categorical hash, or ")
                        continue
                    category(x, prefix + key, at + key, value)
            elif kind is int:
                if not -_MAX_FLOAT <= value <= _MAX_FLOAT:
                    self._leave_out(at + key, "non_finite", named,
                                    f"has value {_short(value)}: too large for a float64")
                    continue
                x[prefix + key] = value
            elif kind is bool:
                x[prefix + key] = 1 if value else 0
            elif value is None:
                continue
            elif kind is dict:
                if depth >= MAX_DEPTH:
                    raise InvalidFeature(f"field {_short(at + key)} nests objects deeper than "
                                         f"{MAX_DEPTH} levels")
                self._object(x, value, prefix + key + ".", at + key + ".", depth + 1)
            elif kind is list:
                self._leave_out(at + key, "array", named,
                                "holds an array: arrays are not features")
            elif kind is bytes:
                self._leave_out(at + key, "bytes", named, "holds bytes: bytes are not features")
            else:  # a decoder's bug: only the tree's types reach here
                raise TypeError(f"field {at + key}: a value of type {kind.__name__} in the tree")

    def _leave_out(self, path: str, kind: str, named: bool, what: str,
                   other_fix: str = "") -> None:
        """A field whose value cannot be a feature: left out and counted (see the module doc),
        or, where `--features` names it (`named`), a dead letter naming it."""
        if named:
            raise InvalidFeature(f"field {_short(path)} {what}, and --features names it. Fix: "
                                 f"{other_fix}take {_option_path(path)} out of --features")
        self.left_out[kind] += 1
        if path not in self.left_out_fields and len(self.left_out_fields) < MAX_LEFT_OUT_NAMES:
            self.left_out_fields[path] = kind
            self.new_left_out.append((path, kind))

    def _category(self, x: dict, name: str, at: str, value: str) -> None:
        """The indicator of the category `value` of the feature `name` (at `at`), in `x`."""
        names = self._names.get(name)
        if names is None:
            names = self._names[name] = {}
        feature = names.get(value)
        if feature is None:
            if self.categorical == "onehot":
                if len(value) > MAX_CATEGORY_CHARS:  # (`_object` leaves these out first)
                    raise InvalidFeature(
                        f"field {_short(at)} has a string of {len(value)} characters: a category "
                        f"has at most {MAX_CATEGORY_CHARS}. Fix: --exclude-features "
                        f"{_option_path(at)}, or "
                        "--categorical hash")
                feature = f"{name}={value}"
            else:
                bucket = zlib.crc32(value.encode("utf-8", "surrogatepass")) % self.hash_buckets
                feature = f"{name}#{bucket}"
            self._cached += 1
            if self._cached > _NAME_CACHE_SIZE:
                self._names.clear()
                self._cached = 1
                names = self._names[name] = {}
            names[value] = feature
        x[feature] = True
        self.indicators += 1

    # First contact ----------------------------------------------------------------------------

    def _nothing_found(self, record: typing.Iterable) -> str:
        """Why a record gave neither features nor a label, and the options that would read it."""
        names = list(record)
        fields = ", ".join(_short(name, 40) for name in names[:12])
        if len(names) > 12:
            fields += f", ... ({len(names)} fields)"
        given = ",".join(self.mapping.features)
        return (f"no features and no label: --features {given} and --label-field "
                f"{self.label_field} found nothing in a record of the fields {fields or '(none)'}. "
                "Fix: --features '*' (every field), --label-field and --id-field naming its "
                "label and id")


class _Undecided(Exception):
    """The C mapping leaves a record to the Python one (which words its dead letter)."""


_native: typing.Any = False  # events.c's module, None where it is not built (False: not looked)


def _native_module() -> typing.Any:
    """events.c's module where `streammargin warmup` built it, else None."""
    global _native
    if _native is False:
        from streammargin.jit import aot

        _native = aot.native("events")
    return _native


def _option_path(path: str) -> str:
    """A field's path as an option's value in a reason: the path, or "PATH" if it is long (a
    reason quotes names in bounded length)."""
    return path if len(path) <= 100 else "PATH"


def _at(record: dict, path: tuple[str, ...]) -> typing.Any:
    """The value at `path` in the tree, or None where a part is missing (or not an object)."""
    value: typing.Any = record
    for part in path:
        if type(value) is not dict:
            return None
        value = value.get(part)
        if value is None:
            return None
    return value


def _kind(value: typing.Any, article: bool = False) -> str:
    """The JSON name of a value's kind ("an array" with `article`)."""
    if type(value) is dict:
        kind = "object"
    elif type(value) is list:
        kind = "array"
    elif value is None:
        kind = "null"
    elif type(value) is str:
        kind = "string"
    elif type(value) is bool:
        kind = "boolean"
    elif type(value) in (int, float):
        kind = "number"
    else:
        kind = type(value).__name__
    if not article:
        return kind
    return ("an " if kind[0] in "aeiou" else "a ") + kind
