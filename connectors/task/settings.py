"""A partition task's settings (`TaskSettings`, which `WorkerConfig.task_settings()` derives) and
the checks of a restored model against them (`check_model_kind`, `restore_part`).
"""

from __future__ import annotations

import dataclasses
import typing

from connectors.codec import MAX_LABEL_CHARS
from connectors.models import build_model, check_model, model_class, short_name
from connectors.observability.metrics import MAX_CLASSES, make_detector
from connectors.serializers import VALUE_FORMATS, get_codec, make_codec
from connectors.serializers.mapping import FieldMapping
from connectors.serializers.schema_registry import (
    DEFAULT_MAX_CACHE_BYTES,
    SchemaRegistry,
    check_settings,
)
from connectors.task.output_records import bounded_reason
from connectors.task.pending_labels import INT64_MAX
from streammargin.errors import StateError

__all__ = ["TaskSettings", "COPY_HEADERS", "SettingsMismatch", "check_model_kind", "restore_part"]


COPY_HEADERS = ("all", "none")


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """What a partition task needs to know; `WorkerConfig.task_settings()` derives it.

    The defaults are `streammargin kafka`'s. `one_vs_rest` wraps a binary model in
    `streammargin.OneVsRestClassifier(model, max_classes)`; with it, or with a natively
    multiclass model (`multiclass`), labels are taken as they come. `copy_headers` says which
    input headers the prediction records keep: "all", "none", or a tuple of header names.
    """

    group_id: str = "streammargin"
    model: str = "alma"
    params: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    one_vs_rest: bool = False
    max_classes: int = 100
    scale: bool = False
    codec: str = "json"
    max_record_bytes: int = 1 << 20
    metrics_every: int = 10_000
    rolling_window: int = 1000
    drift_detector: str = "ddm"  # with metrics.TUNED_PARAMS: see benchmarks/drift_detectors.py
    drift_params: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    label_store_size: int = 100_000
    label_store_bytes: int = 256 << 20
    label_max_age_records: int | None = 1_000_000
    label_max_age_seconds: float | None = None
    copy_headers: str | tuple[str, ...] = "all"
    # Records as they come (connectors/serializers): the format, where the label, id and features
    # are and what becomes of strings (`mapping`; its `multiclass` is the model's, see
    # `field_mapping`), the Schema Registry of the registry formats, and the topic whose records
    # are labels only (co-partitioned with the input).
    value_format: str = "json"
    mapping: FieldMapping = FieldMapping()
    schema_registry_url: str | None = None
    schema_registry_config: dict[str, typing.Any] = dataclasses.field(default_factory=dict)
    schema_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES
    label_topic: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_record_bytes", "metrics_every", "rolling_window", "label_store_size",
                     "label_store_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.label_max_age_records is not None and self.label_max_age_records < 0:
            raise ValueError(
                f"label_max_age_records must be >= 0, got {self.label_max_age_records}"
            )
        if self.label_max_age_seconds is not None and not self.label_max_age_seconds >= 0:
            raise ValueError(
                f"label_max_age_seconds must be >= 0, got {self.label_max_age_seconds}"
            )
        if type(self.max_classes) is not int or not 2 <= self.max_classes <= MAX_CLASSES:
            raise ValueError(f"max_classes must be an integer in [2, {MAX_CLASSES}], "
                             f"got {self.max_classes!r}")
        copy = self.copy_headers
        if isinstance(copy, str):
            if copy not in COPY_HEADERS:
                raise ValueError(f"copy_headers must be 'all', 'none' or header names, "
                                 f"got {copy!r}")
        elif not isinstance(copy, tuple) or not all(isinstance(n, str) and n for n in copy):
            raise ValueError(f"copy_headers must be 'all', 'none' or a tuple of header names, "
                             f"got {copy!r}")
        model_class(self.model)  # an unknown model name fails here, not at the first record
        # Bad parameters fail here too; the model says whether it is natively multiclass.
        native = bool(getattr(check_model(self.model, self.params), "_multiclass", False))
        if self.one_vs_rest and native:
            raise ValueError(
                f"--model {self.model} is natively multiclass (it takes any labels): drop "
                "--one-vs-rest"
            )
        object.__setattr__(self, "_native_multiclass", native)
        make_detector(self.drift_detector, self.drift_params)
        if self.value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format must be one of {', '.join(VALUE_FORMATS)}, "
                             f"got {self.value_format!r}")
        if type(self.mapping) is not FieldMapping:
            raise ValueError(f"mapping must be a FieldMapping, got {self.mapping!r:.80}")
        mapping = self.field_mapping()
        if self.codec != "json" and (self.value_format != "json" or not mapping.is_default
                                     or mapping.positive_label is not None):
            raise ValueError(f"--codec {self.codec} decodes records itself: --value-format and "
                             "the field options (--label-field, --features, --positive-label, "
                             "...) are for the built-in codec (--codec json)")
        if self.value_format != "json":
            if not self.schema_registry_url:
                raise ValueError(f"--value-format {self.value_format} needs "
                                 "--schema-registry-url URL")
            check_settings(self.registry_settings())
        if type(self.schema_cache_bytes) is not int or self.schema_cache_bytes < 1 << 16:
            raise ValueError(f"schema_cache_bytes must be an integer >= 65536, "
                             f"got {self.schema_cache_bytes!r}")

    def field_mapping(self) -> FieldMapping:
        """`mapping` with the model's labels: multiclass or binary."""
        if self.mapping.multiclass == self.multiclass:
            return self.mapping
        return dataclasses.replace(self.mapping, multiclass=self.multiclass)

    def registry_settings(self) -> dict[str, typing.Any]:
        """The Schema Registry client's settings: confluent-kafka's names, `url` included."""
        return {**self.schema_registry_config, "url": self.schema_registry_url}

    def make_registry(self) -> SchemaRegistry | None:
        """A client of the Schema Registry (None for plain JSON): one per worker process, whose
        cache serves every task."""
        if self.value_format == "json":
            return None
        return SchemaRegistry(self.registry_settings(), max_cache_bytes=self.schema_cache_bytes)

    @property
    def multiclass(self) -> bool:
        """Whether labels are classes as they come (not binary True/False)."""
        return self.one_vs_rest or self._native_multiclass  # type: ignore[attr-defined]

    @property
    def model_name(self) -> str:
        return short_name(model_class(self.model))

    @property
    def label_max_age_ms(self) -> int | None:
        if self.label_max_age_seconds is None:
            return None
        return int(self.label_max_age_seconds * 1000)

    def make_codec(self, registry: SchemaRegistry | None = None) -> typing.Any:
        """The codec of these settings (the registry formats read schemas from `registry`,
        or from a client of their own when it is None)."""
        if self.codec == "json":
            if registry is None:
                registry = self.make_registry()
            return make_codec(self.value_format, self.field_mapping(), self.max_record_bytes,
                              registry)
        if not self.multiclass:
            return get_codec(self.codec, max_record_bytes=self.max_record_bytes)
        try:
            return get_codec(self.codec, max_record_bytes=self.max_record_bytes, multiclass=True)
        except TypeError as error:
            raise ValueError(
                f"codec {self.codec!r} does not take multiclass=True ({error}): a multiclass "
                "model needs a codec that passes labels as they come"
            ) from None

    def build_model(self) -> typing.Any:
        """A fresh model: `--model` with `--param`, wrapped one-vs-rest if asked."""
        model = build_model(self.model, self.params)
        if self.one_vs_rest:
            return _one_vs_rest_class()(model, max_classes=self.max_classes)
        return model


class SettingsMismatch(StateError):
    """A checkpoint (or model record) that is sound but written under other settings than these:
    another model, binary against multiclass, with or without --scale or --label-topic, another
    group, topic or partition. A `StateError` like any refusal; its own class so that a reader
    can tell "these options contradict what the checkpoints hold" (fix the options) from "this
    checkpoint is corrupt or hostile" (`streammargin serve` refuses to start on the first)."""


def _one_vs_rest_class() -> type:
    import streammargin

    return streammargin.OneVsRestClassifier


def _model_classes(model: typing.Any) -> list | None:
    """The classes a multiclass model knows (None: not a multiclass model)."""
    classes = getattr(model, "classes", None)
    if classes is None:
        classifiers = getattr(model, "classifiers", None)
        if classifiers is not None:
            return list(classifiers)
    return None if classes is None else list(classes)


def _built_by(cls: type, model: typing.Any) -> bool:
    """Whether `model` is of the class the model name builds: `cls` itself, or one of the classes
    of a public name that builds several (`streammargin.MPUClassifier._forms`: the linear and
    the kernel MPU)."""
    return type(model) is cls or type(model) in getattr(cls, "_forms", ())


def _is_multiclass(model: typing.Any) -> bool:
    return bool(getattr(model, "_multiclass", False))


def _max_classes(model: typing.Any) -> int:
    """The metrics' class bound of a multiclass model: its own `max_classes` if it has one."""
    bound = getattr(model, "max_classes", None)
    if type(bound) is int and 2 <= bound <= MAX_CLASSES:
        return bound
    return MAX_CLASSES


def restore_part(part: str, restore: typing.Callable, data: typing.Any) -> typing.Any:
    """`restore(data)`, with any refusal turned into one `StateError` naming the part.

    The parsers of the parts promise `StateError`; the other exceptions listed are what a parser
    that does not yet keep that promise raises on malformed input. A checkpoint (or a
    model-exchange record) is untrusted, so any of them means "cannot be restored", never a crash
    of the worker.
    """
    try:
        return restore(data)
    except StateError as error:
        raise StateError(f"{part}: {bounded_reason(str(error), 300)}") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError,
            RecursionError) as error:
        raise StateError(
            f"{part}: unreadable state ({type(error).__name__}: {bounded_reason(str(error), 300)})"
        ) from None


def _check_classes(model: typing.Any) -> None:
    """Refuse a restored multiclass model with a class the codec would never give: its
    predictions would break the prediction record's schema."""
    for label in _model_classes(model) or ():
        kind = type(label)
        if not (
            (kind is str and len(label) <= MAX_LABEL_CHARS)
            or kind is bool
            or (kind is int and -(1 << 63) <= label <= INT64_MAX)
        ):
            raise StateError(f"the model has the class {label!r:.60}: labels are strings of at "
                             f"most {MAX_LABEL_CHARS} characters, 64-bit integers or booleans")


def _describe(model: typing.Any) -> str:
    inner = getattr(model, "classifier", None)
    if inner is not None:
        return f"{type(model).__name__} of {type(inner).__name__}"
    return type(model).__name__


def check_model_kind(model: typing.Any, settings: TaskSettings) -> None:
    """`StateError` unless `model` (restored from untrusted bytes: a checkpoint, a model-exchange
    record) is the kind of model `settings` build: its class (wrapped one-vs-rest or not, as
    `settings.one_vs_rest` says), binary or multiclass, and for a multiclass model classes the
    codec could give."""
    wanted = model_class(settings.model)
    if settings.one_vs_rest:
        inner = getattr(model, "classifier", None)
        if type(model) is not _one_vs_rest_class() or not _built_by(wanted, inner):
            raise SettingsMismatch(
                f"it holds a {_describe(model)}, not the one-vs-rest {wanted.__name__} of "
                f"--model {settings.model} --one-vs-rest"
            )
    elif not _built_by(wanted, model):
        raise SettingsMismatch(
            f"it holds a {_describe(model)}, not the {wanted.__name__} of --model "
            f"{settings.model}"
        )
    if _is_multiclass(model) != settings.multiclass:
        kind = "multiclass" if settings.multiclass else "binary"
        raise SettingsMismatch(f"it holds a {'binary' if settings.multiclass else 'multiclass'} "
                         f"{_describe(model)} where the settings ask for a {kind} model")
    if settings.multiclass:
        restore_part("model", _check_classes, model)
