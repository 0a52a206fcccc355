"""`--output-format avro`: the worker's predictions and metrics in Avro, in Confluent's wire format.

Each output topic's schema is registered under `<topic>-value` (Confluent's TopicNameStrategy,
what Kafka Connect's AvroConverter, ksqlDB and confluent-kafka's AvroDeserializer look up), and
each record is framed with its id. The records hold the fields they have in JSON (the JSON
Schemas in `connectors/schemas/` describe them):

- a binary prediction: topic, partition, model, offset, id (null, string or long), y_pred,
  p_true, y (null or boolean);
- a multiclass prediction: the same with y_pred and y as null, string, long or boolean, and
  proba (a map of class probabilities) in place of p_true;
- `--predictions-per-message N`: a record {"predictions": [...]} of these;
- a metrics record: every field of the JSON one, `per_class`, `labels` and `model_counters` as
  maps.

The worker builds each output as JSON (one format to test) and `AvroOutputs` re-encodes it.
"""

from __future__ import annotations

import json
import typing

from connectors.serializers import avro, wire

__all__ = ["AvroOutputs", "prediction_schema", "metrics_schema", "SUBJECT_SUFFIX"]

SUBJECT_SUFFIX = "-value"
NAMESPACE = "io.streammargin"
_LABEL = ["null", "string", "long", "boolean"]
_INT64 = (-(1 << 63), (1 << 63) - 1)


def prediction_schema(multiclass: bool, per_message: int = 1) -> dict:
    """The Avro schema of the predictions topic's records."""
    fields = [
        {"name": "topic", "type": "string"},
        {"name": "partition", "type": "int"},
        {"name": "model", "type": "string"},
        {"name": "offset", "type": "long"},
        {"name": "id", "type": ["null", "string", "long"]},
    ]
    if multiclass:
        fields += [
            {"name": "y_pred", "type": _LABEL},
            {"name": "proba", "type": {"type": "map", "values": "double"}},
            {"name": "y", "type": _LABEL},
        ]
        name = "MulticlassPrediction"
    else:
        fields += [
            {"name": "y_pred", "type": "boolean"},
            {"name": "p_true", "type": "double"},
            {"name": "y", "type": ["null", "boolean"]},
        ]
        name = "BinaryPrediction"
    record = {"type": "record", "name": name, "namespace": NAMESPACE,
              "doc": "A streammargin prediction of one input event (docs/kafka.md).",
              "fields": fields}
    if per_message == 1:
        return record
    return {"type": "record", "name": "Predictions", "namespace": NAMESPACE,
            "doc": "--predictions-per-message N: N predictions of one input partition.",
            "fields": [{"name": "predictions", "type": {"type": "array", "items": record}}]}


def metrics_schema() -> dict:
    """The Avro schema of the metrics topic's records (`connectors/schemas/metrics.schema.json`
    in Avro: counts are longs, fractions nullable doubles, objects of counts maps)."""
    count = "long"
    fraction = ["null", "double"]
    per_class = {"type": "record", "name": "ClassMetrics", "fields": [
        {"name": "support", "type": count}, {"name": "predicted", "type": count},
        {"name": "correct", "type": count}, {"name": "f1", "type": "double"}]}
    drift = {"type": "record", "name": "Drift", "fields": [
        {"name": "detector", "type": "string"}, {"name": "detections", "type": count},
        {"name": "recent_detection_offsets", "type": {"type": "array", "items": count}}]}
    fields = [
        ("type", "string"), ("event", "string"), ("group", "string"), ("topic", "string"),
        ("partition", "int"), ("next_offset", ["null", "long"]), ("model", "string"),
        ("multiclass", "boolean"), ("one_vs_rest", "boolean"), ("records", count),
        ("predictions", count), ("dead_letters", count), ("unjoinable", count),
        ("undecodable", count), ("labelled", count), ("unscored", count),
        ("accuracy", fraction), ("rolling_accuracy", fraction), ("rolling_window", "int"),
        ("log_loss", fraction), ("macro_f1", fraction), ("classes", count),
        ("per_class", {"type": "map", "values": per_class}), ("per_class_omitted", count),
        ("classes_untracked", count), ("drift", drift),
        ("labels", {"type": "map", "values": count}),
        ("model_counters", {"type": "map", "values": "double"}),
        ("worker", "string"), ("records_per_s", "double"), ("records_per_s_recent", "double"),
        ("lag", ["null", "long"]), ("time_ms", "long"),
    ]
    return {"type": "record", "name": "Metrics", "namespace": NAMESPACE,
            "doc": "The progressive metrics of one input partition's model (docs/kafka.md).",
            "fields": [{"name": name, "type": kind} for name, kind in fields]}


class _Output:
    """One topic's schema, its registered id and encoder."""

    def __init__(self, topic: str, schema: dict):
        self.topic = topic
        self.subject = topic + SUBJECT_SUFFIX
        self.text = json.dumps(schema, separators=(",", ":"))
        self.encoder = avro.AvroEncoder(avro.parse_schema(self.text))
        self.schema_id: int | None = None
        self.fields = [name for name, _ in self.encoder.schema.fields]

    def encode(self, value: dict) -> bytes:
        return wire.frame(self.schema_id, self.encoder.encode(value))  # type: ignore[arg-type]


class AvroOutputs:
    """The Avro encoders of a worker's predictions and metrics topics (None: not written).

    `register(registry)` registers both schemas (`RegistryUnavailable` while the registry
    cannot be reached: the worker waits and calls it again); then `prediction(value)` and
    `metrics(record)` give the framed Avro bytes of a JSON prediction and of a metrics dict.

    >>> outputs = AvroOutputs("p", "m", multiclass=False)
    >>> outputs.predictions.schema_id = 7
    >>> value = outputs.prediction(b'{"topic":"t","partition":0,"model":"alma","offset":3,'
    ...                            b'"id":"a","y_pred":true,"p_true":0.75,"y":null}')
    >>> value[:5], len(value)
    (b'\\x00\\x00\\x00\\x00\\x07', 27)
    """

    def __init__(self, predictions_topic: str | None, metrics_topic: str | None,
                 multiclass: bool, per_message: int = 1):
        self.predictions = (None if not predictions_topic else
                            _Output(predictions_topic, prediction_schema(multiclass, per_message)))
        self.metrics_output = (None if not metrics_topic else
                               _Output(metrics_topic, metrics_schema()))

    def register(self, registry: typing.Any) -> None:
        for output in (self.predictions, self.metrics_output):
            if output is not None and output.schema_id is None:
                output.schema_id = registry.register(output.subject, output.text)

    @property
    def registered(self) -> bool:
        return all(o is None or o.schema_id is not None
                   for o in (self.predictions, self.metrics_output))

    def prediction(self, value: bytes) -> bytes:
        """A prediction record's JSON bytes (or `{"predictions": [...]}`) as framed Avro."""
        record = json.loads(value)
        for prediction in record.get("predictions", (record,)):
            _long_or_text(prediction, "id")
        return self.predictions.encode(record)  # type: ignore[union-attr]

    def metrics(self, record: dict) -> bytes:
        """A metrics record (the dict the JSON record is made of) as framed Avro."""
        return self.metrics_output.encode(record)  # type: ignore[union-attr]


def _long_or_text(record: dict, name: str) -> None:
    """An integer beyond Avro's long (JSON ids may be any integer) goes out as its text."""
    value = record.get(name)
    if type(value) is int and not _INT64[0] <= value <= _INT64[1]:
        record[name] = str(value)
