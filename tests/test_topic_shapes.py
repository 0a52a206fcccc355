"""Topic shapes a new user meets, on Apache Kafka and a real Schema Registry (Apicurio), records
written by confluent-kafka's own serializers: nothing lost in silence.

- fields that hold no feature (an array, bytes, a fixed) are left out, named in one WARNING and
  counted, and every record is predicted; a field `--features` names that the schema gives as an
  array is refused at start, in one line;
- any two string labels make a binary topic with `--positive-label`, and without it the
  first-contact WARNING names that option;
- a Protobuf repeated field, empty or not, leaves no record behind; a oneof's member is a
  feature under its own name, an Avro union of records gives the fields of the record it holds;
- events with integer ids join labels with string ids, and labels that join nothing are warned
  of with the likely cause;
- dead letters that start mid-stream (a registry that forgot its schemas) are warned of at once.
"""

from __future__ import annotations

import json
import logging
import random

import pytest

import protobuf_messages
import streammargin
from connectors.kafka.broker import create_topics
from connectors.state import checkpoint
from connectors.worker.failures import WorkerError
from connectors.worker.worker import Worker

import test_kafka_worker as w
from test_schema_registry import (
    avro_serializer,
    context,
    dead_letters,
    produce_serialized,
)

pytestmark = pytest.mark.kafka

SHAPES_SCHEMA = {"type": "record", "name": "Shapes", "namespace": "test.shapes", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": "double"},
    {"name": "risk", "type": "double"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "raw", "type": "bytes"},
    {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
    {"name": "payer", "type": ["null",
                               {"type": "record", "name": "Card", "fields": [
                                   {"name": "card_risk", "type": "double"}]},
                               {"type": "record", "name": "Bank", "fields": [
                                   {"name": "bank_country", "type": "string"}]}]},
    {"name": "outcome", "type": ["null", "string"], "default": None},
]}


def shapes(n: int, seed: int, labelled: bool = True) -> list[dict]:
    """Records whose outcome ("fraud" or "legit") is linear in the amount and the risk."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        amount, risk = rng.uniform(0, 1), rng.uniform(0, 1)
        payer = ({"card_risk": rng.random()} if i % 2 else
                 {"bank_country": rng.choice(["FR", "BR"])})
        records.append({
            "id": 100_000 + i, "amount": amount, "risk": risk,
            "tags": [] if i % 3 == 0 else ["a", "b"][: 1 + i % 2], "raw": bytes([i % 256]),
            "digest": bytes(4), "payer": payer,
            "outcome": ("fraud" if amount + risk > 1.0 else "legit") if labelled else None})
    return records


def model_names(bootstrap: str, cfg, partition: int = 0) -> set:
    """The feature names the partition's model learnt, from its latest checkpoint."""
    store = checkpoint.CheckpointStore(bootstrap, cfg.checkpoint_topic, cfg.group_id)
    try:
        found = store.load([(cfg.topics[0], partition)])[(cfg.topics[0], partition)]
    finally:
        store.close()
    model = streammargin.from_state(checkpoint.decode_checkpoint(found.payload)["model"])
    return set(model._features.names)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_fields_that_hold_no_feature_are_left_out_with_one_warning_and_every_record_predicted(
        kafka_broker, schema_registry, caplog):
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("shapes")
    create_topics(bootstrap, [name])
    serialize = avro_serializer(schema_registry.url, SHAPES_SCHEMA)
    records = shapes(600, seed=4)
    produce_serialized(bootstrap, name, [serialize(r, context(name)) for r in records])
    options = dict(value_format="avro", schema_registry_url=schema_registry.url,
                   id_field="id", label_field="outcome", positive_label="fraud", scale=True)
    cfg = w.config(bootstrap, name, features=["*"], **options)
    with caplog.at_level(logging.WARNING):
        summary = Worker(cfg).run()
    # One run: every record predicted (two labels, one of them positive), none dead-lettered.
    assert summary["records"] == 600 and summary["dead_letters"] == 0
    assert len(w.read_all(bootstrap, cfg.predictions_topic)) == 600
    assert summary["partitions"][f"{name}/0"]["accuracy"] > 0.9
    # The three fields named once, in one line, with the option that silences them.
    left_out = [line for line in warnings_of(caplog) if "left out of the features" in line]
    assert left_out == [
        "fields left out of the features (they hold no feature; the records are predicted "
        "without them): tags (an array), raw (bytes), digest (bytes). To silence this: "
        "--exclude-features tags,raw,digest"]
    assert summary["fields_left_out"] == {"array": 600, "bytes": 1200}
    # A union of records gives the fields of the record it holds, without the branch's name.
    names = model_names(bootstrap, cfg)
    assert {"amount", "risk", "payer.card_risk", "payer.bank_country=FR"} <= names
    assert not {"tags", "raw", "digest"} & names

    # Named in --features, the array is refused at start, in one line, from the schema.
    named = w.config(bootstrap, name, features=["amount", "tags"],
                     group_id=w.fresh("named"), **options)
    with pytest.raises(WorkerError) as refused:
        Worker(named).run()
    assert str(refused.value) == (
        f"--features names tags, but the latest schema of subject {name}-value (id "
        f"{int.from_bytes(serialize(records[0], context(name))[1:5], 'big')}) gives it as an "
        "array, which holds no feature. Fix: take tags out of --features (--features '*' "
        "leaves such fields out)")


def test_two_string_labels_without_a_positive_label_are_named_in_the_first_warning(
        kafka_broker, schema_registry, caplog):
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("labels")
    create_topics(bootstrap, [name])
    serialize = avro_serializer(schema_registry.url, SHAPES_SCHEMA)
    produce_serialized(bootstrap, name,
                       [serialize(r, context(name)) for r in shapes(150, seed=5)])
    cfg = w.config(bootstrap, name, value_format="avro", schema_registry_url=schema_registry.url,
                   features=["*"], id_field="id", label_field="outcome",
                   exclude_features=["tags", "raw", "digest"])
    with caplog.at_level(logging.WARNING):
        summary = Worker(cfg).run()
    assert summary["dead_letter_reasons"] == {"unknown_label": 150}
    [first] = [line for line in warnings_of(caplog) if "of the first" in line]
    assert "(unknown_label): unknown label '" in first
    assert "Fix: --positive-label " in first and "if the topic has two labels" in first
    assert not [line for line in warnings_of(caplog) if "left out" in line]  # (excluded)


def test_a_protobuf_topic_of_empty_and_full_repeated_fields_learns_every_record(
        kafka_broker, schema_registry, caplog):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("repeated")
    create_topics(bootstrap, [name])
    classes = protobuf_messages.message_classes()
    serialize = ProtobufSerializer(classes["Payment"],
                                   SchemaRegistryClient({"url": schema_registry.url}))
    rng = random.Random(6)
    values = []
    for i in range(400):
        amount = rng.uniform(1, 500)
        payment = classes["Payment"](
            transaction_id=f"t{i}", amount=amount, country="BR" if i % 2 else "FR",
            merchant=classes["Merchant"](category="games", risk=rng.random()),
            is_fraud=amount > 250, history=[] if i % 10 < 3 else [amount, 1.0],
            **({"card_bin": "4111"} if i % 2 else {"iban": "FR76"}))
        values.append(serialize(payment, context(name)))
    produce_serialized(bootstrap, name, values)
    cfg = w.config(bootstrap, name, value_format="protobuf",
                   schema_registry_url=schema_registry.url, features=["*"],
                   id_field="transaction_id", label_field="is_fraud")
    with caplog.at_level(logging.WARNING):
        summary = Worker(cfg).run()
    # Every record learnt: the empty list (not on the wire: absent) and the full one (left out)
    # alike, where the full ones used to be dead letters and the model learnt from 30%.
    assert summary["records"] == 400 and summary["dead_letters"] == 0
    assert summary["partitions"][f"{name}/0"]["labelled"] == 400
    assert summary["fields_left_out"] == {"array": 280}
    [line] = [line for line in warnings_of(caplog) if "left out" in line]
    assert "history (an array)" in line and "--exclude-features history" in line
    # A oneof's member is a feature under its own name.
    assert {"card_bin=4111", "iban=FR76", "amount", "merchant.risk"} <= model_names(bootstrap,
                                                                                     cfg)


LABEL_SCHEMA = {"type": "record", "name": "Label", "namespace": "test.shapes", "fields": [
    {"name": "id", "type": "string"}, {"name": "outcome", "type": "string"}]}


def test_integer_ids_join_string_ids_and_labels_that_join_nothing_are_warned_of(
        kafka_broker, schema_registry, caplog):
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("join")
    labels = f"{name}.labels"
    create_topics(bootstrap, [name, labels])
    events = shapes(400, seed=7, labelled=False)
    serialize = avro_serializer(schema_registry.url, SHAPES_SCHEMA)
    produce_serialized(bootstrap, name, [serialize(r, context(name)) for r in events])
    # The labels, later: those of the first 300 events with ids of another form ("tx-100004"),
    # then those of the last 100 with their ids as strings ("100399") where the events' were
    # integers.
    label_of = avro_serializer(schema_registry.url, LABEL_SCHEMA)
    truth = {r["id"]: "fraud" if r["amount"] + r["risk"] > 1.0 else "legit" for r in events}
    produce_serialized(bootstrap, labels, [
        label_of({"id": f"tx-{i}" if i < 100_300 else str(i), "outcome": y}, context(labels))
        for i, y in truth.items()])
    cfg = w.config(bootstrap, name, value_format="avro", schema_registry_url=schema_registry.url,
                   features=["*"], id_field="id", label_field="outcome", positive_label="fraud",
                   label_topic=labels, exclude_features=["tags", "raw", "digest"])
    with caplog.at_level(logging.WARNING):
        summary = Worker(cfg).run()
    partition = summary["partitions"][f"{name}/0"]
    assert partition["labels"]["joined"] == 100  # 100399 and "100399" are one id
    assert summary["orphan_labels"] == 300 == partition["labels"]["orphans"]
    [line] = [line for line in warnings_of(caplog) if "joined no waiting event" in line]
    assert "one had the id 'tx-" in line and "waiting events have ids such as '1000" in line
    assert "Fix: --id-field naming the same id" in line
    assert summary["dead_letters"] == 0


def test_dead_letters_that_start_mid_stream_are_warned_of_at_once(
        kafka_broker, schema_registry, caplog):
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("forgotten")
    create_topics(bootstrap, [name])
    serialize = avro_serializer(schema_registry.url, SHAPES_SCHEMA)
    values = [serialize(r, context(name)) for r in shapes(300, seed=8)]
    # A registry restarted without its storage: the ids the later records name are unknown.
    forgotten = [b"\x00" + (987_000 + i % 3).to_bytes(4, "big") + v[5:] for i, v in
                 enumerate(values[200:])]
    produce_serialized(bootstrap, name, values[:200] + forgotten)
    cfg = w.config(bootstrap, name, value_format="avro", schema_registry_url=schema_registry.url,
                   features=["*"], id_field="id", label_field="outcome", positive_label="fraud",
                   exclude_features=["tags", "raw", "digest"], max_poll_records=50)
    with caplog.at_level(logging.WARNING):
        summary = Worker(cfg).run()
    assert summary["dead_letter_reasons"] == {"unknown_schema": 100}
    [line] = [line for line in warnings_of(caplog) if "unknown_schema" in line]
    assert "went to the dead-letter topic as unknown_schema, which the last minute had none of" in (
        line)
    assert "restarted without its storage" in line
    assert len(dead_letters(bootstrap, cfg.dead_letter_topic)) == 100
    assert json.loads(w.read_all(bootstrap, cfg.predictions_topic)[-1].value)["offset"] == 199
