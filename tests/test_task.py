"""The partition task without a broker: records in, predictions, dead letters and metrics out.

Records are plain named tuples with kafka-python's ConsumerRecord fields. Reference results come
from River itself (`evaluate.progressive_val_score`) or from the model run straight over the
same events.
"""

from __future__ import annotations

import collections
import json
import logging
import math

import numpy as np
import pytest
import reference_metrics
from hypothesis import given, settings
from hypothesis import strategies as st
from river import datasets, evaluate, metrics, preprocessing
from river.datasets import synth

import streammargin
from connectors import schemas
from connectors.serializers.mapping import FieldMapping
from connectors.state import checkpoint
from connectors.task import (
    ENTRY_BYTES,
    FEATURE_BYTES,
    MAX_REASON_CHARS,
    PROBA_CLASS_BYTES,
    PROBA_DICT_BYTES,
    OutputRecords,
    PartitionTask,
    PendingLabels,
    SettingsMismatch,
    TaskFailure,
    TaskSettings,
    pending_entry_bytes,
)
from streammargin import state
from streammargin.errors import InvalidInput, StateError

Record = collections.namedtuple("Record", "topic partition offset timestamp key value headers")


def as_records(values, topic="events", partition=0, start=0, timestamps=None, keys=None,
               headers=None):
    return [
        Record(topic, partition, start + i, 0 if timestamps is None else timestamps[i],
               None if keys is None else keys[i], value, [] if headers is None else headers[i])
        for i, value in enumerate(values)
    ]


def event(i, x, y=None) -> bytes:
    record = {"id": f"e{i}", "x": x}
    if y is not None:
        record["y"] = y
    return json.dumps(record).encode()


def labelled_stream(n: int, seed: int = 7):
    return [(x, bool(y)) for x, y in synth.Agrawal(classification_function=2, seed=seed).take(n)]


Collected = collections.namedtuple("Collected", "predictions dead_letters metrics outputs")


def run(task, records) -> Collected:
    """Every output of the records, as the adapter would see them (process until the end)."""
    outputs, start = [], 0
    while start < len(records):
        output = task.process(records, start)
        assert output.end > start
        outputs.append(output)
        start = output.end
    return Collected(
        [p for o in outputs for p in o.predictions.values],
        [d for o in outputs for d in o.dead_letters],
        [m for o in outputs for m in o.metrics],
        outputs,
    )


def predictions(collected: Collected) -> list[dict]:
    return [json.loads(value) for value in collected.predictions]


def straight_run(events, model):
    """The model run over (x, y) in order as the task does: predict, then learn."""
    served = []
    for x, y in events:
        served.append((model.predict_one(x), model.predict_proba_one(x)[True]))
        model.learn_one(x, y)
    return model, served


def progressive(events, make_model):
    accuracy = evaluate.progressive_val_score(events, make_model(), metrics.Accuracy())
    log_loss = evaluate.progressive_val_score(events, make_model(), metrics.LogLoss())
    return accuracy.get(), log_loss.get()


def model_bytes(model) -> bytes:
    return state.dumps(model.to_state())


def headers_of(dead) -> dict[str, str]:
    return {k: v.decode() for k, v in dead.headers}


CONNECT = "__connect.errors."


# Predictions and metrics --------------------------------------------------------------------------


def test_every_record_gets_one_prediction_and_the_metrics_equal_rivers_progressive_validation():
    data = labelled_stream(5_000)
    task = PartitionTask.new("events", 3, TaskSettings(metrics_every=2_000),
                             prediction_partition=1)
    out = run(task, as_records([event(i, x, y) for i, (x, y) in enumerate(data)], partition=3))

    accuracy, log_loss = progressive(data, streammargin.ALMAClassifier)
    final = task.metrics_event("final")
    assert final["accuracy"] == accuracy and final["log_loss"] == log_loss
    assert final["records"] == final["labelled"] == final["predictions"] == 5_000
    model, served = straight_run(data, streammargin.ALMAClassifier())
    mine = predictions(out)
    assert [p["offset"] for p in mine] == list(range(5_000))
    assert [(p["y_pred"], p["p_true"]) for p in mine] == served
    assert [p["id"] for p in mine] == [f"e{i}" for i in range(5_000)]
    assert [p["y"] for p in mine] == [y for _, y in data]
    assert all(p["topic"] == "events" and p["partition"] == 3 and p["model"] == "alma"
               for p in mine)
    assert all(o.predictions.partition == 1 for o in out.outputs)
    assert model_bytes(task.model) == model_bytes(model)
    assert task.next_offset == 5_000 and not out.dead_letters
    # Metrics events at deterministic points, each returned right after its record.
    assert [(m["event"], m["records"], m["next_offset"]) for m in out.metrics] == [
        ("periodic", 2_000, 2_000), ("periodic", 4_000, 4_000)
    ]
    assert all(m["model_counters"]["trials"] == m["labelled"] for m in out.metrics)


def test_a_scaler_in_front_matches_rivers_pipeline():
    # SEA's feature names are ints; they arrive as JSON object keys, i.e. strings.
    data = [({str(k): v for k, v in x.items()}, bool(y)) for x, y in synth.SEA(seed=3).take(3_000)]
    task = PartitionTask.new("events", 0, TaskSettings(scale=True, params={"alpha": 0.8}))
    run(task, as_records([event(i, x, y) for i, (x, y) in enumerate(data)]))

    def make_pipeline():
        return preprocessing.StandardScaler() | streammargin.ALMAClassifier(alpha=0.8)

    final = task.metrics_event("final")
    assert (final["accuracy"], final["log_loss"]) == progressive(data, make_pipeline)
    pipeline, _ = straight_run(data, make_pipeline())
    assert model_bytes(task.model) == model_bytes(pipeline["ALMAClassifier"])
    assert task.scaler.means == pipeline["StandardScaler"].means


def test_the_scaler_scales_each_record_as_rivers_pipeline_in_one_pass():
    # The task scales a labelled record once for both the prediction (statistics before it) and
    # learning (after it): every served prediction, the model, the scaler and the whole
    # checkpoint equal River's two scalings (transform, learn, transform), unlabelled events
    # and delayed labels included.
    data = labelled_stream(1_500, seed=11)
    values, held = [], {}
    for i, (x, y) in enumerate(data):
        if i % 5 == 3:
            values.append(event(i, x))  # waits for its label two records later
            held[i + 2] = (i, y)
        else:
            values.append(event(i, x, y))
        if i in held:
            values.append(json.dumps({"id": f"e{held[i][0]}", "y": held[i][1]}).encode())
    task = PartitionTask.new("events", 0, TaskSettings(scale=True))
    out = run(task, as_records(values))

    scaler, model = streammargin.StandardScaler(), streammargin.ALMAClassifier()
    waiting, served = {}, []
    for value in values:
        record = json.loads(value)
        if "x" not in record:
            x = waiting.pop(record["id"])
            scaler.learn_one(x)
            model.learn_one(scaler.transform_one(x), record["y"])
            continue
        x = record["x"]
        scaled = scaler.transform_one(x)
        served.append((model.predict_one(scaled), model.predict_proba_one(scaled)[True]))
        if "y" in record:
            scaler.learn_one(x)
            model.learn_one(scaler.transform_one(x), record["y"])
        else:
            waiting[record["id"]] = x
    assert [(p["y_pred"], p["p_true"]) for p in predictions(out)] == served
    assert model_bytes(task.model) == model_bytes(model)
    assert state.dumps(task.scaler.to_state()) == state.dumps(scaler.to_state())


def test_binary_predictions_keep_their_format():
    task = PartitionTask.new("events", 0, TaskSettings())
    out = run(task, as_records([event(0, {"a": 1.0}, 1), event(1, {"a": -1.0}, -1),
                                json.dumps({"id": 2, "x": {"a": 0.5}}).encode()]))
    mine = predictions(out)
    assert [list(p) for p in mine] == [
        ["topic", "partition", "model", "offset", "id", "y_pred", "p_true", "y"]] * 3
    assert [p["y"] for p in mine] == [True, False, None] and mine[2]["id"] == 2


# Kafka conventions ------------------------------------------------------------------------------


def test_predictions_keep_the_input_records_key_timestamp_and_headers():
    data = labelled_stream(6, seed=4)
    keys = [b"k0", None, b"k2", b"k3", b"", b"k5"]
    timestamps = [1_700_000_000_000, 1_700_000_000_007, -1, 5, 1_700_000_000_100, None]
    headers = [[("traceparent", b"00-abc-01"), ("tenant", b"t1")], [], [("tenant", b"t2")],
               [("x", b"")], [("traceparent", b"00-def-01"), ("other", b"\xff")], []]
    records = as_records([event(i, x, y) for i, (x, y) in enumerate(data)], keys=keys,
                         timestamps=timestamps, headers=headers)

    out = run(PartitionTask.new("events", 0, TaskSettings()), records)
    produced = [record for o in out.outputs for record in o.predictions]
    assert [r.key for r in produced] == keys
    # A record without a timestamp (-1, None) gets the producer's clock.
    assert [r.timestamp_ms for r in produced] == [1_700_000_000_000, 1_700_000_000_007, None, 5,
                                                  1_700_000_000_100, None]
    assert [r.headers for r in produced] == headers
    none = run(PartitionTask.new("events", 0, TaskSettings(copy_headers="none")), records)
    assert [r.headers for o in none.outputs for r in o.predictions] == [None] * 6
    some = run(PartitionTask.new("events", 0, TaskSettings(copy_headers=("traceparent", "x"))),
               records)
    assert [r.headers for o in some.outputs for r in o.predictions] == [
        [("traceparent", b"00-abc-01")], None, None, [("x", b"")], [("traceparent", b"00-def-01")],
        None,
    ]
    assert none.predictions == out.predictions == some.predictions


@pytest.mark.parametrize(("options", "reason"), [
    ({"copy_headers": "some"}, "copy_headers"),
    ({"copy_headers": ("a", "")}, "copy_headers"),
    ({"copy_headers": ["a"]}, "copy_headers"),
    ({"max_classes": 1}, "max_classes"),
    ({"max_classes": 10**6}, "max_classes"),
    ({"model": "convexpolytope", "one_vs_rest": True}, "natively multiclass.*drop --one-vs-rest"),
    ({"params": {"gamma": 1}}, "bad parameters"),
])
def test_task_settings_refuse_what_cannot_work(options, reason):
    with pytest.raises(ValueError, match=reason):
        TaskSettings(**options)


@pytest.mark.parametrize(("options", "reason"), [
    ({"codec": "nope"}, "unknown codec"),
    ({"codec": "collections:OrderedDict"}, "has no decode"),
    ({"codec": "test_task:BinaryOnlyCodec", "model": "convexpolytope"},
     "does not take multiclass=True"),
])
def test_a_codec_that_cannot_serve_the_labels_is_refused_with_the_cause(options, reason):
    with pytest.raises(ValueError, match=reason):
        TaskSettings(**options).make_codec()
    assert TaskSettings(codec="test_task:BinaryOnlyCodec").make_codec().max_record_bytes == 1 << 20


class BinaryOnlyCodec:
    """A custom codec written before multiclass models: it takes no `multiclass` option."""

    def __init__(self, max_record_bytes: int):
        self.max_record_bytes = max_record_bytes

    def decode(self, value):
        return None, {"a": 1.0}, True


def test_the_settings_know_which_models_are_multiclass():
    assert not TaskSettings().multiclass and TaskSettings(model="convexpolytope").multiclass
    assert not TaskSettings(model="convexpolytope", params={"polytopes": "one"}).multiclass
    assert TaskSettings(one_vs_rest=True).multiclass


# Multiclass ---------------------------------------------------------------------------------------


def image_segments():
    return list(datasets.ImageSegments())


def straight_multiclass(events, model):
    """(predicted label, class probabilities) served for each event, predicting then learning."""
    served = []
    for x, y in events:
        served.append((model.predict_one(x), model.predict_proba_one(x)))
        model.learn_one(x, y)
    return model, served


def test_a_natively_multiclass_model_matches_rivers_progressive_validation():
    data = image_segments()
    settings_ = TaskSettings(model="convexpolytope", scale=True, metrics_every=1_000)
    task = PartitionTask.new("segments", 0, settings_)
    out = run(task, as_records([event(i, x, y) for i, (x, y) in enumerate(data)]))

    def make_pipeline():
        return preprocessing.StandardScaler() | streammargin.ConvexPolytopeClassifier()

    final = task.metrics_event("final")
    river = reference_metrics.progressive(data, make_pipeline)
    assert {name: final[name] for name in river} == river
    assert river["accuracy"] > 0.8  # the polytopes learn the 7 classes
    assert final["multiclass"] and not final["one_vs_rest"] and final["classes"] == 7
    assert final["unscored"] == 1 and final["labelled"] == len(data) - 1
    assert sum(c["support"] for c in final["per_class"].values()) == len(data) - 1
    pipeline, served = straight_multiclass(data, make_pipeline())
    mine = predictions(out)
    assert [(p["y_pred"], p["proba"]) for p in mine] == served
    assert [p["y"] for p in mine] == [y for _, y in data]
    assert model_bytes(task.model) == model_bytes(pipeline["ConvexPolytopeClassifier"])
    assert mine[0]["y_pred"] is None and mine[0]["proba"] == {}


def test_a_binary_model_one_vs_rest_matches_rivers_progressive_validation():
    data = image_segments()
    task = PartitionTask.new("segments", 0, TaskSettings(one_vs_rest=True, scale=True))
    out = run(task, as_records([event(i, x, y) for i, (x, y) in enumerate(data)]))

    def make_pipeline():
        return preprocessing.StandardScaler() | streammargin.OneVsRestClassifier(
            streammargin.ALMAClassifier())

    final = task.metrics_event("final")
    river = reference_metrics.progressive(data, make_pipeline)
    assert {name: final[name] for name in river} == river
    assert river["accuracy"] > 0.85
    assert final["multiclass"] and final["one_vs_rest"] and final["model"] == "alma"
    assert final["model_counters"]["classes"] == final["classes"] == 7
    pipeline, served = straight_multiclass(data, make_pipeline())
    assert [(p["y_pred"], p["proba"]) for p in predictions(out)] == served
    assert model_bytes(task.model) == model_bytes(pipeline["OneVsRestClassifier"])


def test_one_vs_rest_refuses_a_label_beyond_max_classes_and_restores_exactly():
    settings_ = TaskSettings(group_id="g", one_vs_rest=True, max_classes=6, label_store_size=4,
                             metrics_every=300)
    records = as_records(multiclass_mixed_stream(900), partition=2)
    uninterrupted = PartitionTask.new("led", 2, settings_)
    expected = run(uninterrupted, records)
    final = uninterrupted.metrics_event("final")
    assert final["classes"] == 6 and final["model_counters"]["classes"] == 6
    refused = [d for d in expected.dead_letters
               if dict(d.headers)[CONNECT + "exception.class.name"]
               == b"streammargin.errors.InvalidInput"]
    assert refused and all(b"beyond max_classes=6" in dict(d.headers)[CONNECT + "exception.message"]
                           for d in refused)
    first = PartitionTask.new("led", 2, settings_)
    before = run(first, records[:400])
    restored = PartitionTask.restore(first.to_checkpoint(), "led", 2, settings_)
    after = run(restored, records[400:])
    assert before.predictions + after.predictions == expected.predictions
    assert before.dead_letters + after.dead_letters == expected.dead_letters
    assert restored.metrics_event("final") == final
    assert model_bytes(restored.model) == model_bytes(uninterrupted.model)


def test_restore_refuses_a_checkpoint_wrapped_otherwise_than_the_settings_say():
    one_vs_rest = TaskSettings(group_id="g", one_vs_rest=True)
    task = PartitionTask.new("events", 5, one_vs_rest)
    task.process(as_records([event(0, {"a": 1.0}, "sky")], partition=5))
    with pytest.raises(StateError, match="holds a OneVsRestClassifier of ALMAClassifier, not "
                                         "the ALMAClassifier of --model alma"):
        PartitionTask.restore(task.to_checkpoint(), "events", 5, TaskSettings(group_id="g"))
    with pytest.raises(StateError, match="holds a OneVsRestClassifier of ALMAClassifier, not "
                                         "the one-vs-rest MPUClassifier"):
        PartitionTask.restore(task.to_checkpoint(), "events", 5,
                              TaskSettings(group_id="g", model="mpu", one_vs_rest=True))
    binary = PartitionTask.new("events", 5, TaskSettings(group_id="g"))
    binary.process(as_records([event(0, {"a": 1.0}, True)], partition=5))
    with pytest.raises(StateError, match="holds a ALMAClassifier, not the one-vs-rest"):
        PartitionTask.restore(binary.to_checkpoint(), "events", 5, one_vs_rest)


@pytest.mark.parametrize("options", [
    {"scale": True},
    {"scale": True, "mapping": FieldMapping(features=("*",), label_field="y", id_field="id",
                                            categorical="hash", hash_buckets=8)},
    {"model": "convexpolytope", "scale": True},
    {},
], ids=["scaled-onehot", "scaled-hash", "multiclass", "plain"])
def test_predict_gives_exactly_what_process_gives_an_unlabelled_event(options):
    # What `streammargin serve` answers: a task restored from a checkpoint predicts an event
    # as the task that wrote it predicts the same record unlabelled, bit for bit (categories
    # passed unscaled to the model included).
    multiclass = options.get("model") == "convexpolytope"
    flat = "mapping" in options

    def record(i, y=None):
        x = {"a": (i % 7) / 3.0, "b": float(i % 5), "city": ["paris", "rome", "oslo"][i % 3]}
        label = (["sky", "sea", "sand"][i % 3] if multiclass else i % 3 == 0) if y else None
        if flat:
            return json.dumps({"id": f"e{i}", **x, **({"y": label} if y else {})}).encode()
        return event(i, x, label)

    settings = TaskSettings(group_id="g", **options)
    task = PartitionTask.new("events", 0, settings)
    task.process(as_records([record(i, y=True) for i in range(300)]))
    restored = PartitionTask.restore(task.to_checkpoint(), "events", 0, settings)
    unlabelled = [record(i) for i in range(300, 340)]
    out = task.process(as_records(unlabelled, start=300))
    for value, prediction in zip(unlabelled, out.predictions.values):
        _, x, _ = restored.codec.decode(value)
        y_pred, p = restored.predict(x)
        written = json.loads(prediction)
        assert y_pred == written["y_pred"]
        if multiclass:
            assert {str(k): v for k, v in p.items()} == written["proba"]
        else:
            assert p == written["p_true"]


def test_a_checkpoint_of_other_settings_is_a_settings_mismatch():
    task = PartitionTask.new("events", 0, TaskSettings(group_id="g", scale=True))
    task.process(as_records([event(0, {"a": 1.0}, True)]))
    for other in (TaskSettings(group_id="g", model="mpu", scale=True), TaskSettings(group_id="g"),
                  TaskSettings(group_id="h", scale=True)):
        with pytest.raises(SettingsMismatch):
            PartitionTask.restore(task.to_checkpoint(), "events", 0, other)
    payload = bytearray(task.to_checkpoint())
    payload[-3] ^= 0xFF
    with pytest.raises(StateError) as refused:  # corrupt: a refusal, not a mismatch
        PartitionTask.restore(bytes(payload[:40]), "events", 0, task.settings)
    assert not isinstance(refused.value, SettingsMismatch)


def led_stream(n: int, seed: int = 3):
    """LED digits: integer labels 0-9, features named by integers (strings in JSON)."""
    return [({str(k): v for k, v in x.items()}, y) for x, y in synth.LED(seed=seed,
                                                                       noise_percentage=0.1).take(n)]


def multiclass_mixed_stream(n: int) -> list[bytes]:
    """Labelled LED events, events whose labels come later, bad records, a label of the wrong
    type."""
    values, waiting = [], []
    for i, (x, y) in enumerate(led_stream(n)):
        if i % 5 == 2:
            values.append(json.dumps({"id": f"w{i}", "x": x}).encode())
            waiting.append((f"w{i}", y))
        elif i % 101 == 7:
            values.append(json.dumps({"x": x, "y": [y]}).encode())
        else:
            values.append(event(i, x, y))
        # Labels come 3 events later, or 6 in every other block of 100 records: more than the
        # label store of the test holds (4), so some are evicted.
        while len(waiting) > (3 if (i // 100) % 2 == 0 else 6):
            event_id, label = waiting.pop(0)
            values.append(json.dumps({"id": event_id, "y": label}).encode())
    return values


def test_multiclass_delayed_labels_and_checkpoints_give_the_outputs_of_an_uninterrupted_task():
    settings_ = TaskSettings(group_id="g", model="convexpolytope", metrics_every=250,
                             label_store_size=4, params={"n_faces": 3})
    records = as_records(multiclass_mixed_stream(1_500), partition=1)
    uninterrupted = PartitionTask.new("led", 1, settings_)
    expected = run(uninterrupted, records)
    final = uninterrupted.metrics_event("final")
    assert final["labels"]["joined"] > 100 and final["labels"]["evicted"] > 10
    assert final["dead_letters"] > 5 and final["classes"] == 10
    assert all(type(p["y"]) in (int, type(None)) for p in predictions(expected))

    cut = 777
    first = PartitionTask.new("led", 1, settings_)
    before = run(first, records[:cut])
    assert first.pending.entries  # events wait for their labels at the checkpoint
    restored = PartitionTask.restore(first.to_checkpoint(), "led", 1, settings_)
    after = run(restored, records[cut - 50:])
    assert before.predictions + after.predictions == expected.predictions
    assert before.dead_letters + after.dead_letters == expected.dead_letters
    assert before.metrics + after.metrics == expected.metrics
    assert restored.metrics_event("final") == final
    assert model_bytes(restored.model) == model_bytes(uninterrupted.model)


def test_a_label_beyond_the_models_max_classes_is_a_dead_letter_and_metrics_stay_bounded():
    task = PartitionTask.new("events", 0, TaskSettings(model="convexpolytope",
                                                       params={"max_classes": 3}))
    assert task.metrics.max_classes == task.pending.max_classes == 3
    labels = ["a", "b", "c", "d", "a", "e", 7]
    out = run(task, as_records([event(i, {"f": float(i)}, y) for i, y in enumerate(labels)]))
    assert [p["offset"] for p in predictions(out)] == [0, 1, 2, 4]
    for dead in out.dead_letters:
        headers = headers_of(dead)
        assert (headers[CONNECT + "exception.class.name"], headers[CONNECT + "stage"]) == (
            "streammargin.errors.InvalidInput", "TASK_PUT")
    assert task.metrics_event("final")["classes"] == 3


def test_a_waiting_multiclass_event_is_charged_its_class_probabilities():
    task = PartitionTask.new("led", 0, TaskSettings(model="convexpolytope"))
    values = [event(i, x, y) for i, (x, y) in enumerate(led_stream(30))]
    value = json.dumps({"id": "w", "x": led_stream(31)[30][0]}).encode()
    run(task, as_records([*values, value]))
    x, _, _, y_pred, proba, size = task.pending.entries["w"]
    assert len(proba) == 10 and y_pred in proba
    assert size == pending_entry_bytes(value, x, proba) == (
        pending_entry_bytes(value, x) + PROBA_DICT_BYTES + 10 * PROBA_CLASS_BYTES)


def test_restore_refuses_a_model_that_does_not_fit_the_labels_of_the_settings():
    multiclass = TaskSettings(group_id="g", model="convexpolytope")
    binary = TaskSettings(group_id="g", model="convexpolytope", params={"polytopes": "one"})
    task = PartitionTask.new("events", 5, binary)
    task.process(as_records([event(0, {"a": 1.0}, True)], partition=5))
    with pytest.raises(StateError, match="holds a binary ConvexPolytopeClassifier where the "
                                         "settings ask for a multiclass model"):
        PartitionTask.restore(task.to_checkpoint(), "events", 5, multiclass)
    # A class the codec never gives (a float) would break the prediction records.
    task = PartitionTask.new("events", 5, multiclass)
    task.process(as_records([event(0, {"a": 1.0}, "sky")], partition=5))
    task.model.learn_one({"a": 1.0}, 2.5)
    with pytest.raises(StateError, match="has the class 2.5"):
        PartitionTask.restore(task.to_checkpoint(), "events", 5, multiclass)


def multiclass_pending_state():
    pending = PendingLabels(max_size=10, multiclass=True, max_classes=3)
    pending.add("e0", {"a": 1.0}, 0, 0, None, {}, 50)
    pending.add("e1", {"a": 2.0}, 1, 0, "sky", {"sky": 0.7, 3: 0.2, True: 0.1}, 50)
    return round_trip(pending.to_state())


def test_multiclass_pending_labels_round_trip():
    twin = PendingLabels.from_state(multiclass_pending_state(), 10, multiclass=True,
                                    max_classes=3)
    assert twin.entries == {"e0": ({"a": 1.0}, 0, 0, None, {}, 50),
                            "e1": ({"a": 2.0}, 1, 0, "sky", {"sky": 0.7, 3: 0.2, True: 0.1}, 50)}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: s.update(proba_sizes=np.array([0, 4])), "more than max_classes=3"),
        (lambda s: s.update(proba_sizes=np.array([-1, 4])), "more than max_classes"),
        (lambda s: s.update(proba_sizes=np.array([1, 3])), "must hold the proba_sizes"),
        (lambda s: s.update(proba_values=np.array([0.7, 0.2, 1.5])), r"outside \[0, 1\]"),
        (lambda s: s.update(proba_values=np.array([0.7, 0.2, np.nan])), r"outside \[0, 1\]"),
        (lambda s: s["proba_labels"].__setitem__(1, "sky"), "two probabilities"),
        (lambda s: s["proba_labels"].__setitem__(1, {"float": 3.0}), "not a label"),
        (lambda s: s["y_pred"].__setitem__(1, ["sky"]), "not a label"),
        (lambda s: s.update(y_pred=np.array([True, False])), "'y_pred' is not a list"),
        (lambda s: s.pop("proba_values"), "proba_values"),
    ],
)
def test_multiclass_pending_labels_refuse_malformed_state(change, reason):
    data = multiclass_pending_state()
    change(data)
    with pytest.raises(StateError, match=reason):
        PendingLabels.from_state(data, 10, multiclass=True, max_classes=3)


def test_a_binary_pending_state_is_not_read_as_multiclass_or_the_reverse():
    with pytest.raises(StateError):
        PendingLabels.from_state(pending_state(), 10, multiclass=True)
    with pytest.raises(StateError):
        PendingLabels.from_state(multiclass_pending_state(), 10)


# Dead letters and failures ------------------------------------------------------------------------


def test_bad_records_become_dead_letters_with_reasons_and_leave_the_model_untouched():
    good = labelled_stream(300, seed=2)
    bad = [
        (b"not json", b"k1", "bad JSON", "MalformedJSON"),
        (b'{"x": {"age": NaN}, "y": true}', None, "non-finite number NaN", "MalformedJSON"),
        (b'{"id": 1.5, "x": {"age": 1}, "y": true}', None, "id 1.5 must be a string",
         "InvalidRecord"),
        (b'{"x": {"age": 2}, "y": 2.5}', None, "unknown label 2.5", "InvalidLabel"),
        (b'{"y": true}', None, "label record without an id", "InvalidRecord"),
        (b'{"id": "z"}', None, "no features and no label", "InvalidRecord"),
        (b'{"x": {"age": 3}, "y": "spam"}', None, "unknown label 'spam'", "InvalidLabel"),
        (b'{"x": [1, 2], "y": true}', None, "x is an array, not an object", "InvalidRecord"),
        (b'{"x": {"age": 1}, "y": 1}' + b" " * 3_000, None, "oversized record",
         "OversizedRecord"),
        (b"\xff\xfe\x00", None, "bad JSON", "MalformedJSON"),
        (None, b"tombstone", "empty record", "NullRecord"),
    ]
    values, keys, headers, bad_offsets, good_events = [], [], [], {}, []
    for i, (x, y) in enumerate(good):
        values.append(event(i, x, y))
        keys.append(None)
        headers.append([])
        good_events.append((x, y))
        if i % 25 == 10 and bad:
            value, key, reason, cls = bad.pop(0)
            bad_offsets[len(values)] = (value, key, reason, cls)
            values.append(value)
            keys.append(key)
            headers.append([("trace-id", f"t{i}".encode()), ("binary", b"\xff\x00")])
    assert not bad
    timestamps = [1_700_000_000_000 + 10 * i for i in range(len(values))]
    task = PartitionTask.new("events", 2, TaskSettings(group_id="g", max_record_bytes=2_000))
    out = run(task, as_records(values, partition=2, keys=keys, timestamps=timestamps,
                               headers=headers))

    assert len(out.dead_letters) == len(bad_offsets)
    for dead in out.dead_letters:
        found = dict(dead.headers)
        offset = int(found[CONNECT + "offset"])
        value, key, reason, cls = bad_offsets[offset]
        # Kafka Connect's error headers, after the record's own headers, UTF-8 strings.
        assert dead.headers[:2] == headers[offset]
        assert reason in found[CONNECT + "exception.message"].decode()
        assert found[CONNECT + "exception.class.name"] == f"connectors.codec.{cls}".encode()
        assert (found[CONNECT + "topic"], found[CONNECT + "partition"],
                found[CONNECT + "connector.name"], found[CONNECT + "stage"],
                found[CONNECT + "class.name"]) == (
            b"events", b"2", b"g", b"VALUE_CONVERTER", b"connectors.serializers.json_format.JSONCodec")
        # The record as it came: a null value stays null, the key and timestamp are kept.
        assert dead.value == value and dead.key == key
        assert dead.timestamp_ms == timestamps[offset] and dead.partition is None
    assert [p["offset"] for p in predictions(out)] == sorted(
        set(range(len(values))) - set(bad_offsets)
    )
    counters = task.counters()
    assert counters["dead_letters"] == len(bad_offsets) and counters["records"] == len(values)
    model, _ = straight_run(good_events, streammargin.ALMAClassifier())
    assert model_bytes(task.model) == model_bytes(model)


def test_the_models_documented_rejection_is_a_dead_letter(monkeypatch):
    task = PartitionTask.new("events", 0, TaskSettings())
    learn = task.model.learn_one

    def learn_one(x, y):
        if "refuse" in x:
            raise InvalidInput("feature 'refuse' is not welcome " + "!" * 5_000)
        learn(x, y)

    monkeypatch.setattr(task.model, "learn_one", learn_one)
    values = [event(0, {"a": 1.0}, True), event(1, {"refuse": 1.0}, True), event(2, {"a": 2.0}, 0)]
    out = run(task, as_records(values))
    assert [p["offset"] for p in predictions(out)] == [0, 2]
    [dead] = out.dead_letters
    headers = headers_of(dead)
    reason = headers[CONNECT + "exception.message"]
    assert reason.startswith("feature 'refuse' is not welcome")
    assert (headers[CONNECT + "exception.class.name"], headers[CONNECT + "stage"],
            headers[CONNECT + "class.name"]) == (
        "streammargin.errors.InvalidInput", "TASK_PUT", "streammargin.alma.ALMAClassifier")
    # Bounded, however long the model's message (it may quote names and values).
    assert len(reason) <= MAX_REASON_CHARS + 40 and "characters)" in reason


@pytest.mark.parametrize("error", [ValueError("a bug in the update rule"), ZeroDivisionError(),
                                   KeyError("weights"), StateError("not a rejection")])
def test_anything_else_a_model_raises_is_a_failure_not_a_dead_letter(monkeypatch, error):
    task = PartitionTask.new("events", 4, TaskSettings())
    learn = task.model.learn_one

    def learn_one(x, y):
        if x["a"] == 2.0:
            raise error
        learn(x, y)

    monkeypatch.setattr(task.model, "learn_one", learn_one)
    values = [event(i, {"a": float(i)}, True) for i in range(4)]
    with pytest.raises(TaskFailure, match=r"events/4@2 made the model or codec fail with "
                                          + type(error).__name__) as raised:
        task.process(as_records(values, partition=4))
    assert raised.value.offset == 2 and raised.value.error is error


@pytest.mark.parametrize("p_true", [math.nan, math.inf, -0.5, 1.5])
def test_a_non_finite_or_impossible_probability_fails_instead_of_writing_bad_json(
    monkeypatch, p_true
):
    task = PartitionTask.new("events", 0, TaskSettings())
    monkeypatch.setattr(task.model, "predict_with_proba_one", lambda x: (True, {True: p_true}))
    with pytest.raises(TaskFailure, match="the model gave the probability"):
        task.process(as_records([event(0, {"a": 1.0}, True)]))


def test_a_model_without_predict_with_proba_one_is_asked_both_river_calls():
    class RiverCallsOnly:  # a model that only has River's API
        def __init__(self, model):
            self.model = model

        def __getattr__(self, name):
            if name == "predict_with_proba_one":
                raise AttributeError(name)
            return getattr(self.model, name)

    stream = [event(i, {"a": float(i % 3), "b": 1.0 - i % 2}, i % 2 == 0) for i in range(30)]
    ours = PartitionTask.new("events", 0, TaskSettings())
    plain = PartitionTask.new("events", 0, TaskSettings())
    plain.model = RiverCallsOnly(plain.model)
    predictions = run(ours, as_records(stream)).predictions
    assert len(predictions) == 30 and predictions == run(plain, as_records(stream)).predictions


def test_dead_letter_reasons_stay_bounded_whatever_the_feature_names():
    name = "n" * (1 << 20)  # a 1 MB feature name
    deep: dict = {}
    inner = deep
    for _ in range(40):
        inner["a"] = inner = {}
    values = [
        json.dumps({"x": {name: deep}}).encode(),
        json.dumps({"x": {name: 1.0}, "y": "x" * 100_000}).encode(),
        json.dumps({"id": [name], "x": {"a": 1}}).encode(),
    ]
    task = PartitionTask.new("events", 0, TaskSettings(max_record_bytes=4 << 20))
    out = run(task, as_records(values))
    reasons = [headers_of(d)[CONNECT + "exception.message"] for d in out.dead_letters]
    assert len(reasons) == 3
    assert all(len(r) < 500 for r in reasons), [len(r) for r in reasons]
    assert reasons[0].startswith("field 'x.nnnn") and "characters)" in reasons[0]


# Schemas ------------------------------------------------------------------------------------------


def error_headers(dead) -> dict[str, str]:
    """A dead letter's error headers as the dead-letter-headers schema describes them."""
    return {k: v.decode() for k, v in dead.headers
            if k.startswith(("__connect.errors.", "streammargin.error."))}


def test_every_output_record_follows_its_json_schema():
    binary, multiclass = schemas.validator("prediction-binary"), schemas.validator(
        "prediction-multiclass")
    dead_letter = schemas.validator("dead-letter-headers")
    task = PartitionTask.new("events", 0, TaskSettings(label_store_size=5))
    out = run(task, as_records(mixed_stream(300) + [None, b"[1]", b'{"x": {"a": 1}, "y": 3}',
                                                    b'{"id": [1], "x": {"a": 1}}']))
    assert len(out.predictions) > 200 and len(out.dead_letters) > 3
    for value in out.predictions:
        binary.validate(json.loads(value))
        assert not multiclass.is_valid(json.loads(value))
    skipped = task.skip(task.next_offset, task.next_offset + 3, "cannot decode", [("codec", b"lz4")])
    for dead in [*out.dead_letters, *skipped]:
        dead_letter.validate(error_headers(dead))

    task = PartitionTask.new("led", 0, TaskSettings(model="convexpolytope", label_store_size=4))
    out = run(task, as_records(multiclass_mixed_stream(400)))
    mine = [json.loads(value) for value in out.predictions]
    assert {type(p["y"]) for p in mine} == {int, type(None)} and mine[0]["y_pred"] is None
    for prediction in mine:
        multiclass.validate(prediction)
        assert not binary.is_valid(prediction)
    assert out.dead_letters
    for dead in out.dead_letters:
        dead_letter.validate(error_headers(dead))
    batch = schemas.validator("prediction-batch")
    batch.validate({"predictions": mine[:3]})
    assert not batch.is_valid({"predictions": [{**mine[0], "proba": {"1": 1.5}}]})


# Delayed labels -----------------------------------------------------------------------------------


def test_delayed_labels_join_their_events_expire_and_orphans_are_counted():
    pool = iter(labelled_stream(2_000, seed=5))
    items: list[bytes] = []
    # The reference replays the policy: a prediction when the event comes, learning and the
    # metric when its label comes.
    reference = streammargin.ALMAClassifier()
    accuracy = metrics.Accuracy()
    n_labelled = 0
    waiting: dict[str, tuple] = {}

    def unlabelled(event_id):
        x, y = next(pool)
        items.append(json.dumps({"id": event_id, "x": x}).encode())
        waiting[event_id] = (x, y, reference.predict_one(x))

    def label(event_id, joins=True):
        x, y, y_pred = waiting.pop(event_id, (None, True, None))
        items.append(json.dumps({"id": event_id, "y": y}).encode())
        if joins:
            nonlocal n_labelled
            n_labelled += 1
            accuracy.update(y, y_pred)
            reference.learn_one(x, y)

    def labelled():
        nonlocal n_labelled
        n_labelled += 1
        x, y = next(pool)
        items.append(json.dumps({"x": x, "y": y}).encode())
        accuracy.update(y, reference.predict_one(x))
        reference.learn_one(x, y)

    for block in range(5):  # 20 events, 10 labelled records, then their labels, out of order
        ids = [f"b{block}-{i}" for i in range(20)]
        for event_id in ids:
            unlabelled(event_id)
        for _ in range(10):
            labelled()
        for event_id in reversed(ids):
            label(event_id)
    for i in range(3):  # orphans
        label(f"nobody-{i}", joins=False)
    ids = [f"big-{i}" for i in range(60)]  # 60 waiting > label_store_size=50: 10 evicted
    for event_id in ids:
        unlabelled(event_id)
    for event_id in ids:
        label(event_id, joins=event_id not in ids[:10])
    unlabelled("late")  # its label comes 120 records later > label_max_age_records=100
    for _ in range(119):
        labelled()
    label("late", joins=False)
    task = PartitionTask.new("events", 0, TaskSettings(label_store_size=50,
                                                       label_max_age_records=100))
    out = run(task, as_records(items))

    final = task.metrics_event("final")
    # Evicted: 10 by the size limit; expired: 1 by age. Orphans: 3 unknown ids, and the labels of
    # the 10 evicted events (nothing waits for them any more).
    assert final["labels"] == {"pending": 0, "pending_bytes": 0, "joined": 150, "expired": 1,
                               "evicted": 10, "superseded": 0, "orphans": 13, "lost": 0, "unjoinable": 0}
    assert final["labelled"] == n_labelled == 319
    assert final["accuracy"] == accuracy.get()
    assert model_bytes(task.model) == model_bytes(reference)
    n_events = sum(1 for value in items if b'"x"' in value)
    assert len(out.predictions) == final["predictions"] == n_events


def test_the_label_store_is_bounded_in_bytes():
    limit = 20_000
    task = PartitionTask.new("events", 0, TaskSettings(label_store_bytes=limit))
    rng = np.random.default_rng(0)
    values = []
    for i in range(200):
        n = int(rng.integers(1, 40))
        values.append(json.dumps({"id": i, "x": {f"feature-{j}": 1.0 for j in range(n)}}).encode())
    huge = json.dumps({"id": "huge", "x": {f"f{j}": 1.0 for j in range(500)}}).encode()
    values.append(huge)
    sizes = []
    for record in as_records(values):
        task.process([record])
        sizes.append(task.pending.n_bytes)
    pending = task.pending
    assert max(sizes) <= limit
    assert pending.n_bytes == sum(entry[5] for entry in pending.entries.values())
    expected = [pending_entry_bytes(v, json.loads(v)["x"]) for v in values]
    assert expected[-1] > limit and "huge" not in pending.entries  # never stored
    # The newest entries that fit are kept, the older ones were evicted and counted.
    kept, total = 0, 0
    for size in reversed(expected[:-1]):
        if total + size > limit:
            break
        total += size
        kept += 1
    assert len(pending) == kept and pending.evicted == len(values) - kept
    assert list(pending.entries) == [str(i) for i in range(200 - kept, 200)]  # (join keys)


def test_pending_labels_join_expire_by_size_and_age_and_count_orphans():
    pending = PendingLabels(max_size=3, max_age_records=10, max_age_ms=5_000)
    for i in range(4):  # the fourth evicts the first (size)
        pending.add(f"e{i}", {"a": i}, offset=i, timestamp=1000 * i, y_pred=True, p_true=0.7,
                    size=100)
    assert list(pending.entries) == ["e1", "e2", "e3"] and pending.evicted == 1
    assert pending.pop("e0", 4, 4000) is None and pending.orphans == 1
    entry = pending.pop("e2", 5, 5000)
    assert entry == ({"a": 2}, 2, 2000, True, 0.7, 100) and pending.joined == 1
    # Age in records: e1 (offset 1) is too old at offset 12.
    assert pending.pop("e1", 12, 5000) is None and pending.expired == 1
    # Age in record time: e3 (t=3000 ms) is too old once 9000 ms has been seen.
    pending.add("e9", {"a": 9}, offset=13, timestamp=9000, y_pred=False, p_true=0.2, size=100)
    assert "e3" not in pending.entries and pending.expired == 2
    # A second event with a pending id supersedes the first.
    pending.add("e9", {"a": 10}, offset=14, timestamp=9000, y_pred=False, p_true=0.1, size=150)
    assert pending.entries["e9"][0] == {"a": 10} and pending.superseded == 1
    twin = PendingLabels.from_state(round_trip(pending.to_state()), 3, 1000, 10, 5_000)
    assert twin.entries == pending.entries
    assert twin.counters() == pending.counters() == {
        "pending": 1, "pending_bytes": 150, "joined": 1, "expired": 2, "evicted": 1,
        "superseded": 1, "orphans": 1, "lost": 0,
    }
    # Restored under smaller limits: the oldest entries are evicted.
    smaller = PendingLabels.from_state(round_trip(pending.to_state()), 3, 100, 10, 5_000)
    assert len(smaller) == 0 and smaller.evicted == 2


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(0, 2000), max_size=30), max_size=st.integers(1, 40),
       max_bytes=st.integers(1, 30_000))
def test_a_store_restored_under_smaller_limits_keeps_what_eviction_would(sizes, max_size,
                                                                         max_bytes):
    # Only the newest entries within the limits are built, and they are the ones a store
    # restored whole, then evicted to its limits (oldest first), keeps.
    pending = PendingLabels(max_size=len(sizes) + 1, max_bytes=1 << 40)
    for i, size in enumerate(sizes):
        pending.add(f"e{i}", {"a": i}, offset=i, timestamp=i, y_pred=True, p_true=0.5,
                    size=size)
    saved = round_trip(pending.to_state())
    whole = PendingLabels.from_state(saved, len(sizes) + 1, 1 << 40)
    whole.max_size, whole.max_bytes = max_size, max_bytes
    whole._evict_to_limits()
    restored = PendingLabels.from_state(saved, max_size, max_bytes)
    assert restored.entries == whole.entries
    assert restored.counters() == whole.counters()
    assert restored.n_bytes <= max_bytes and len(restored) <= max_size


def test_pending_labels_keep_names_and_ids_of_any_safe_type():
    pending = PendingLabels(max_size=10)
    pending.add(5, {"a": 1, 3: 2.5, ("t", 1): True}, offset=0, timestamp=0, y_pred=True,
                p_true=0.6, size=10)
    twin = PendingLabels.from_state(round_trip(pending.to_state()), 10)
    # (an integer id waits under its decimal text: its label joins, as 5 or as "5")
    assert twin.entries == {"5": ({"a": 1, 3: 2.5, ("t", 1): True}, 0, 0, True, 0.6, 10)}
    assert twin.pop("5", 1, 0) is not None and twin.orphans == 0


def test_ids_join_by_value_whatever_type_each_topic_writes_them_in():
    pending = PendingLabels(max_size=10)
    for i, event_id in enumerate([100004, "100005", 7, "tx-1"]):
        pending.add(event_id, {"a": 1.0}, offset=i, timestamp=0, y_pred=True, p_true=0.6,
                    size=10)
    assert pending.pop("100004", 4, 0) is not None  # (events had numbers, labels strings)
    assert pending.pop(100005, 5, 0) is not None  # (and the other way round)
    assert pending.pop("007", 6, 0) is None  # (another value)
    assert pending.pop("7", 7, 0) is not None and pending.pop("tx-1", 8, 0) is not None
    assert (pending.joined, pending.orphans, pending.last_orphan) == (4, 1, "007")
    # A store saved before ids joined by value, holding 7 and "7": the later one waits.
    old = PendingLabels(max_size=10)
    old.entries = {7: ({"a": 1.0}, 0, 0, True, 0.6, 10), "7": ({"b": 1.0}, 1, 0, False, 0.4, 10)}
    old.n_bytes = 20
    twin = PendingLabels.from_state(round_trip(old.to_state()), 10)
    assert twin.entries == {"7": ({"b": 1.0}, 1, 0, False, 0.4, 10)}
    assert (twin.n_bytes, twin.superseded) == (10, 1)


def round_trip(tree):
    return state.loads(state.dumps({"tree": tree}))["tree"]


def pending_state():
    pending = PendingLabels(max_size=10)
    for i in range(3):
        pending.add(f"e{i}", {"a": float(i), "b": i}, offset=i, timestamp=i, y_pred=bool(i % 2),
                    p_true=0.25 * i, size=50)
    return round_trip(pending.to_state())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: s.update(ids=s["ids"][:2]), "different lengths"),
        (lambda s: s.update(offsets=s["offsets"][::-1].copy()), "arrival order"),
        (lambda s: s.update(offsets=s["offsets"] - 5), "negative"),
        (lambda s: s.update(p_true=np.array([0.1, math.nan, 0.2])), r"outside \[0, 1\]"),
        (lambda s: s.update(p_true=np.array([0.1, 1.5, 0.2])), r"outside \[0, 1\]"),
        (lambda s: s.update(sizes=np.array([1, -1, 1])), "negative"),
        (lambda s: s.update(sizes=s["sizes"].astype(np.float64)), "int64"),
        (lambda s: s.update(y_pred=np.array([1, 0, 1])), "bool"),
        (lambda s: s["values"].__setitem__(1, [1.0, "x"]), "not a finite real number"),
        (lambda s: s["values"].__setitem__(1, [1.0, 10 ** 400]), "not a finite real number"),
        (lambda s: s["values"].__setitem__(1, [1.0]), "names and values do not match"),
        (lambda s: s["names"].__setitem__(1, ["a", "a"]), "names a feature twice"),
        (lambda s: s["ids"].__setitem__(1, "e0"), "id twice"),
        (lambda s: s["ids"].__setitem__(1, {"bytes": "x"}), "bad event id"),
        (lambda s: s.update(joined=-1), "joined"),
        (lambda s: s.update(orphans=True), "orphans"),
        (lambda s: s.update(max_timestamp=2 ** 70), "max_timestamp"),
        (lambda s: s.pop("evicted"), "evicted"),
        (lambda s: s.update(names="abc"), "not a list"),
    ],
)
def test_pending_labels_refuse_malformed_state_with_state_error(change, reason):
    data = pending_state()
    change(data)
    with pytest.raises(StateError, match=reason):
        PendingLabels.from_state(data, 10)


# Drift --------------------------------------------------------------------------------------------


def test_an_abrupt_concept_change_is_detected_shortly_after_the_change_point():
    change = 3_000
    # SEA, then the same concept with every label flipped: the error rate jumps at `change`.
    data = [(x, bool(y) != (i >= change))
            for i, (x, y) in enumerate(synth.SEA(seed=1).take(2 * change))]
    task = PartitionTask.new("events", 0, TaskSettings(scale=True))
    out = run(task, as_records([event(i, x, y) for i, (x, y) in enumerate(data)]))

    final = task.metrics_event("final")
    offsets = final["drift"]["recent_detection_offsets"]
    after = [o for o in offsets if o >= change]
    assert after and after[0] < change + 300, offsets
    # The metrics record says which detector fired, with its settings (the default).
    assert final["drift"]["detector"] == "DDM"
    assert final["drift"]["params"] == {
        "warm_start": 1000, "warning_threshold": 2.0, "drift_threshold": 4.0
    }
    drift_events = [m for m in out.metrics if m["event"] == "drift"]
    # Each detection was reported as it happened: process returned right after its record.
    assert [m["next_offset"] - 1 for m in drift_events] == offsets
    for output in out.outputs:
        if any(m["event"] == "drift" for m in output.metrics):
            assert json.loads(output.predictions.values[-1])["offset"] == output.end - 1


# Stopping, skipping, outputs ----------------------------------------------------------------------


@pytest.mark.parametrize("batch", [False, True])
def test_a_stop_request_finishes_the_record_in_hand_and_processing_continues_exactly(batch):
    # The per-record path asks before each record, the batch path before each run of records.
    data = labelled_stream(500, seed=3)
    records = as_records([event(i, x, y) for i, (x, y) in enumerate(data)])
    whole = PartitionTask.new("events", 0, TaskSettings())
    expected = run(whole, records)
    task = PartitionTask.new("events", 0, TaskSettings())
    if not batch:
        task._batch = None

    calls = 0

    def stop():  # (the per-record path counts its calls, the batch path its records)
        nonlocal calls
        calls += 1
        return calls > 120 or (task.next_offset or 0) >= 120

    first = task.process(records, 0, stop)
    assert first.end == first.processed == task.next_offset
    assert (first.end == 120) if not batch else (120 <= first.end < 500)
    rest = run(task, records[first.end:])
    assert first.predictions.values + rest.predictions == expected.predictions
    assert model_bytes(task.model) == model_bytes(whole.model)
    # Records before the task's offset are stale data: skipped.
    assert task.process(records).processed == 0


def test_an_undecodable_batch_is_skipped_with_one_dead_letter():
    task = PartitionTask.new("events", 1, TaskSettings(group_id="g"))
    task.process(as_records([event(0, {"a": 1.0}, True)], partition=1))
    dead = task.skip(1, 11, "cannot decode the snappy batch", [("codec", b"snappy")])
    [record] = dead
    headers = headers_of(record)
    assert record.value is None
    assert headers[CONNECT + "exception.message"].startswith("cannot decode")
    assert (headers[CONNECT + "stage"], headers[CONNECT + "exception.class.name"]) == (
        "KAFKA_CONSUME", "connectors.codec.UndecodableBatch")
    assert (headers[CONNECT + "offset"], headers["streammargin.error.last_offset"],
            headers["streammargin.error.codec"], headers[CONNECT + "connector.name"]) == (
        "1", "10", "snappy", "g")
    assert task.next_offset == 11 and task.dirty
    assert task.counters()["undecodable"] == 10 and task.counters()["dead_letters"] == 1
    # Offsets already processed are not skipped twice.
    assert len(task.skip(5, 11, "again")) == 0 and task.counters()["undecodable"] == 10
    out = task.process(as_records([event(11, {"a": 2.0}, False)], partition=1, start=11))
    assert out.processed == 1 and task.next_offset == 12


def test_output_records_keep_their_columns_aligned():
    records = OutputRecords(partition=2)
    records.append(b"plain")
    records.append(b"keyed", key=b"k")
    records.append(None, headers=[("h", b"1")], timestamp_ms=5)
    assert list(records) == [
        (b"plain", None, None, None, 2),
        (b"keyed", b"k", None, None, 2),
        (None, None, [("h", b"1")], 5, 2),
    ]


# Checkpoints --------------------------------------------------------------------------------------


def mixed_stream(n: int, seed: int = 9) -> list[bytes]:
    """Labelled events, events whose labels come later, bad records."""
    values = []
    waiting = []
    for i, (x, y) in enumerate(labelled_stream(n, seed=seed)):
        if i % 7 == 3:
            values.append(json.dumps({"id": f"w{i}", "x": x}).encode())
            waiting.append((f"w{i}", y))
        elif i % 97 == 5:
            values.append(b'{"x": {"bad": "value"}}')
        else:
            values.append(event(i, x, y))
        if len(waiting) > 5:
            event_id, label = waiting.pop(0)
            values.append(json.dumps({"id": event_id, "y": label}).encode())
    return values


def settings_for_checkpoints(**options) -> TaskSettings:
    return TaskSettings(group_id="g", scale=True, metrics_every=300, label_store_size=4,
                        **options)


def test_checkpoint_and_restore_give_exactly_the_outputs_of_an_uninterrupted_task():
    records = as_records(mixed_stream(2_000), partition=5)
    cut = 1_234
    uninterrupted = PartitionTask.new("events", 5, settings_for_checkpoints())
    expected = run(uninterrupted, records)

    first = PartitionTask.new("events", 5, settings_for_checkpoints())
    before = run(first, records[:cut])
    payload = first.to_checkpoint()
    restored = PartitionTask.restore(payload, "events", 5, settings_for_checkpoints())
    assert restored.next_offset == cut and not restored.dirty
    # The replay starts before the checkpoint's offset: those records are skipped.
    after = run(restored, records[cut - 100:])

    assert before.predictions + after.predictions == expected.predictions
    assert before.dead_letters + after.dead_letters == expected.dead_letters
    assert before.metrics + after.metrics == expected.metrics
    assert restored.metrics_event("final") == uninterrupted.metrics_event("final")
    assert model_bytes(restored.model) == model_bytes(uninterrupted.model)
    assert restored.pending.entries == uninterrupted.pending.entries


@pytest.mark.parametrize("params", [{}, {"kernel": "rbf", "budget": 20}], ids=["linear", "rbf"])
def test_the_mpu_restores_as_the_form_its_params_build_and_from_a_one_class_checkpoint(params):
    """--model mpu builds MPUClassifier's linear or kernel class: its checkpoints restore under
    the same settings, and so does a checkpoint holding the one-class MPUClassifier of before the
    split (tests/test_mpu.py has such states)."""
    from test_mpu import legacy

    task_settings = settings_for_checkpoints(model="mpu", params=params)
    records = as_records(mixed_stream(300), partition=5)
    task = PartitionTask.new("events", 5, task_settings)
    run(task, records[:200])
    restored = PartitionTask.restore(task.to_checkpoint(), "events", 5, task_settings)
    assert type(restored.model) is type(task.model)
    assert run(restored, records[200:]).predictions == run(task, records[200:]).predictions
    fields = checkpoint.decode_checkpoint(task.to_checkpoint())
    fields["model"] = legacy("rbf" if params else "linear")
    payload = checkpoint.encode_checkpoint({k: v for k, v in fields.items() if k != "format"})
    old = PartitionTask.restore(payload, "events", 5, task_settings)
    assert type(old.model) is type(task.model)
    with pytest.raises(StateError, match="holds a KernelMPUClassifier, not the ALMAClassifier"
                       if params else "holds a LinearMPUClassifier, not the ALMAClassifier"):
        PartitionTask.restore(payload, "events", 5, settings_for_checkpoints())


def saved_fields(**settings) -> tuple[dict, TaskSettings]:
    task_settings = settings_for_checkpoints(**settings)
    task = PartitionTask.new("events", 5, task_settings)
    run(task, as_records(mixed_stream(200), partition=5))
    return checkpoint.decode_checkpoint(task.to_checkpoint()), task_settings


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda f: f.update(group="other"), "belongs to group/topic/partition 'other/events/5'"),
        (lambda f: f.update(partition=6), "not g/events/5"),
        (lambda f: f.update(partition=True), "'partition' has type bool"),
        (lambda f: f.update(next_offset=-1), "next_offset"),
        (lambda f: f.update(next_offset=1.5), "next_offset"),
        (lambda f: f.update(next_offset=2 ** 64), "next_offset"),
        (lambda f: f.pop("model"), "lacks the field 'model'"),
        (lambda f: f.update(model=streammargin.MPUClassifier().to_state()),
         "holds a LinearMPUClassifier, not the ALMAClassifier"),
        (lambda f: f["model"].update(model="Nope"), "model: unknown model"),
        (lambda f: f.update(scaler=None), "written without --scale"),
        (lambda f: f["metrics"].pop("window"), "metrics:"),
        (lambda f: f["metrics"].update(rolling_window="big"), "metrics:"),
        (lambda f: f["pending"].update(ids=[]), "pending labels"),
        (lambda f: f["counters"].update(records=-3), "counter 'records'"),
        (lambda f: f.update(counters=[1, 2]), "'counters' has type list"),
    ],
)
def test_restore_refuses_bad_checkpoints_with_one_state_error(change, reason):
    fields, task_settings = saved_fields()
    change(fields)
    payload = checkpoint.encode_checkpoint({k: v for k, v in fields.items() if k != "format"})
    with pytest.raises(StateError, match=reason):
        PartitionTask.restore(payload, "events", 5, task_settings)


def test_restore_refuses_a_checkpoint_written_without_the_scaler_when_one_is_asked_for():
    task = PartitionTask.new("events", 5, TaskSettings(group_id="g"))
    task.process(as_records([event(0, {"a": 1.0}, True)], partition=5))
    with pytest.raises(StateError, match="written without --scale"):
        PartitionTask.restore(task.to_checkpoint(), "events", 5,
                              TaskSettings(group_id="g", scale=True))


@pytest.mark.parametrize("payload", [b"", b"\x80\x04pickle", b"SMSTATE1" + b"\xff" * 40,
                                     state.dumps({"format": "other"})])
def test_restore_refuses_unreadable_bytes_with_state_error(payload):
    with pytest.raises(StateError):
        PartitionTask.restore(payload, "events", 5, TaskSettings(group_id="g"))


def test_restore_refuses_a_checkpoint_of_the_previous_format_naming_both_formats():
    fields, task_settings = saved_fields()
    fields["format"] = "streammargin.checkpoint/2"
    with pytest.raises(StateError, match="'streammargin.checkpoint/2', this worker reads "
                                         "'streammargin.checkpoint/3'"):
        PartitionTask.restore(state.dumps(fields), "events", 5, task_settings)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=10,
)


def saved_multiclass_fields() -> tuple[dict, TaskSettings]:
    task_settings = TaskSettings(group_id="g", model="convexpolytope", label_store_size=4,
                                 params={"n_faces": 2}, metrics_every=300)
    task = PartitionTask.new("events", 5, task_settings)
    run(task, as_records(multiclass_mixed_stream(200), partition=5))
    return checkpoint.decode_checkpoint(task.to_checkpoint()), task_settings


@settings(max_examples=80, deadline=None)
@given(part=st.sampled_from(["pending", "counters", "metrics", "top"]),
       multiclass=st.booleans(), data=st.data())
def test_restore_of_mutated_checkpoints_raises_state_error_and_nothing_else(part, multiclass,
                                                                            data):
    fields, task_settings = saved_multiclass_fields() if multiclass else saved_fields()
    target = fields if part == "top" else fields[part]
    key = data.draw(st.sampled_from(sorted(target)))
    target[key] = data.draw(JSON_VALUES)
    payload = checkpoint.encode_checkpoint({k: v for k, v in fields.items() if k != "format"})
    try:
        task = PartitionTask.restore(payload, "events", 5, task_settings)
    except StateError:
        return
    # Accepted: then it works.
    stream = multiclass_mixed_stream(50) if multiclass else mixed_stream(50)
    run(task, as_records(stream, partition=5, start=task.next_offset))
    task.to_checkpoint()


def test_pending_entry_bytes_follow_the_documented_formula():
    value = b'{"id": "a", "x": {"f": 1.0, "g": 2.0}}'
    assert pending_entry_bytes(value, {"f": 1.0, "g": 2.0}) == (
        len(value) + 2 * FEATURE_BYTES + ENTRY_BYTES
    )


def test_a_restored_model_keeping_other_params_than_these_settings_give_says_so(caplog):
    # Against what the settings build now, defaults included: a checkpoint saved with margin 0.5
    # restored by a worker asking for none keeps 0.5 where a new model gets this version's 1.0
    # (before, only parameters given on the command line were compared: no warning).
    saved = TaskSettings(model="budgetperceptron", params={"margin": 0.5})
    task = PartitionTask.new("events", 0, saved)
    run(task, as_records([event(i, {"a": float(i)}, i % 2 == 0) for i in range(5)]))
    payload = task.to_checkpoint()
    with caplog.at_level(logging.WARNING, logger="connectors.task"):
        restored = PartitionTask.restore(payload, "events", 0,
                                         TaskSettings(model="budgetperceptron"))
        assert restored.model.margin == 0.5
        [message] = [r.getMessage() for r in caplog.records if "keeps its saved" in r.getMessage()]
        assert "{'margin': 0.5}" in message and "{'margin': 1.0}" in message
        caplog.clear()
        PartitionTask.restore(payload, "events", 0, saved)  # what it was saved with: silent
        assert not [r for r in caplog.records if "keeps its saved" in r.getMessage()]
