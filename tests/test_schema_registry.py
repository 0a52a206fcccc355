"""Topics as they are, on a real broker and a real Schema Registry (Apicurio, Confluent's API):
records written by clients this project did not write (confluent-kafka's AvroSerializer,
ProtobufSerializer and JSONSerializer), read back by its AvroDeserializer.

Each format's records carry the same events as a flat JSON topic; the worker must predict them
exactly as it predicts the JSON twins (one tree, one mapping), dead-letter what cannot be read
with the reason, ask the registry once per schema id, and wait out the registry's outages.
"""

from __future__ import annotations

import decimal
import json
import random
import threading
import time
import urllib.request

import pytest

from connectors.kafka.broker import create_topics
from connectors.worker.worker import Worker

import test_kafka_worker as w

pytestmark = pytest.mark.kafka

PAYMENT_FIELDS = [
    {"name": "transaction_id", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "country", "type": {"type": "enum", "name": "Country",
                                 "symbols": ["BR", "FR", "US", "IN"]}},
    {"name": "card_present", "type": "boolean"},
    {"name": "merchant", "type": {"type": "record", "name": "Merchant", "fields": [
        {"name": "category", "type": "string"}, {"name": "risk", "type": "double"}]}},
    {"name": "fee", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                             "scale": 2}},
    {"name": "is_fraud", "type": ["null", "boolean"], "default": None},
]
PAYMENT_SCHEMA = {"type": "record", "name": "Payment", "namespace": "test.payments",
                  "fields": PAYMENT_FIELDS}
MAPPING = {"label_field": "is_fraud", "id_field": "transaction_id", "features": ["*"]}
CATEGORIES = ["travel", "food", "fuel", "games"]


def payments(n: int, seed: int) -> list[dict]:
    """Payments whose fraud is linear in the amount, the merchant's risk and two categories."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        country = rng.choice(["BR", "FR", "US", "IN"])
        category = rng.choice(CATEGORIES)
        amount = round(rng.uniform(1, 500), 2)
        risk = round(rng.random(), 3)
        score = amount / 500 + risk + (0.8 if country == "BR" else 0) + (
            0.7 if category == "games" else 0)
        records.append({
            "transaction_id": f"t{i}", "amount": amount, "country": country,
            "card_present": rng.random() < 0.5,
            "merchant": {"category": category, "risk": risk},
            "fee": decimal.Decimal(rng.randrange(0, 1000)) / 100,
            "is_fraud": score > 1.6,
        })
    return records


def as_json(record: dict) -> bytes:
    """The JSON twin of a payment (the decimal as the number it is)."""
    if "fee" in record:
        record = {**record, "fee": float(record["fee"])}
    return json.dumps(record).encode()


def produce_serialized(bootstrap: str, topic: str, values: list[bytes], partition: int = 0):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for value in values:
        producer.produce(topic, value, partition=partition)
    producer.flush(30)


def avro_serializer(registry_url: str, schema: dict):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(schema))


def context(topic: str):
    from confluent_kafka.serialization import MessageField, SerializationContext

    return SerializationContext(topic, MessageField.VALUE)


def predictions_by_offset(bootstrap: str, topic: str) -> dict[int, tuple]:
    return {json.loads(r.value)["offset"]: (json.loads(r.value)["y_pred"],
                                            json.loads(r.value)["p_true"],
                                            json.loads(r.value)["id"])
            for r in w.read_all(bootstrap, topic)}


def run_twin(bootstrap: str, records: list[dict], **options) -> dict[int, tuple]:
    """The predictions of the same payments as a flat JSON topic (the reference)."""
    name = w.fresh("twin")
    create_topics(bootstrap, [name])
    w.produce(bootstrap, name, [(0, as_json(r)) for r in records])
    cfg = w.config(bootstrap, name, **MAPPING, **options)
    Worker(cfg).run()
    return predictions_by_offset(bootstrap, cfg.predictions_topic)


def dead_letters(bootstrap: str, topic: str) -> dict[int, tuple[str, str]]:
    found = {}
    for record in w.read_all(bootstrap, topic):
        headers = {k: v.decode() for k, v in record.headers}
        found[int(headers["__connect.errors.offset"])] = (
            headers["__connect.errors.exception.class.name"].rsplit(".", 1)[1],
            headers["__connect.errors.exception.message"])
    return found


@w.both_transports
def test_avro_of_confluents_serializer_is_predicted_as_its_json_twin(
        transport, kafka_broker, schema_registry):
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("avro")
    create_topics(bootstrap, [name])
    records = payments(600, seed=1)
    serialize = avro_serializer(schema_registry.url, PAYMENT_SCHEMA)
    values = [serialize(r, context(name)) for r in records]
    schema_id = int.from_bytes(values[0][1:5], "big")
    # Bad records at known offsets: another writer's plain JSON, an id the registry does not
    # have, a truncated payload, and bytes after the value.
    bad = {100: (as_json(records[0]), "WireFormatError", "magic byte 123"),
           200: (b"\x00" + (987_654).to_bytes(4, "big") + values[0][5:], "UnknownSchema",
                 "unknown schema id 987654"),
           300: (values[0][:-4], "UndecodablePayload", "truncated"),
           400: (values[0] + b"\x00", "UndecodablePayload", "1 bytes after the value")}
    stream = list(values)
    for offset in sorted(bad):
        stream.insert(offset, bad[offset][0])
    produce_serialized(bootstrap, name, stream)
    cfg = w.config(bootstrap, name, value_format="avro", transport=transport,
                   schema_registry_url=schema_registry.url, scale=True, **MAPPING)
    worker = Worker(cfg)
    summary = worker.run()
    assert summary["records"] == len(stream)

    # One request per schema id (and one for the id the registry does not have).
    assert worker.registry.requests["schema"] == 2, worker.registry.requests
    refused = dead_letters(bootstrap, cfg.dead_letter_topic)
    assert {offset: kind for offset, (kind, _) in refused.items()} == {
        offset: kind for offset, (_, kind, _) in bad.items()}
    for offset, (_, _, reason) in bad.items():
        assert reason in refused[offset][1], refused[offset]
    assert str(schema_id) in refused[300][1]

    ours = predictions_by_offset(bootstrap, cfg.predictions_topic)
    twin = run_twin(bootstrap, records, scale=True)
    shifted = {}  # the Avro topic's offsets with the bad records taken out
    for offset in sorted(ours):
        shifted[offset - sum(1 for b in bad if b < offset)] = ours[offset]
    assert shifted == twin
    accuracy = summary["partitions"][f"{name}/0"]["accuracy"]
    assert accuracy > 0.85, accuracy  # the categories reach the model through the scaler


def test_several_schema_versions_share_a_topic_and_each_is_asked_for_once(
        kafka_broker, schema_registry):
    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("versions")
    create_topics(bootstrap, [name])
    records = payments(400, seed=2)
    first = avro_serializer(schema_registry.url, PAYMENT_SCHEMA)
    # A compatible second version (BACKWARD, as the registry is set): a field with a default.
    second_schema = {**PAYMENT_SCHEMA, "fields": [*PAYMENT_FIELDS, {
        "name": "channel", "type": "string", "default": "online"}]}
    second = avro_serializer(schema_registry.url, second_schema)
    values = [first(r, context(name)) if i % 2 else second({**r, "channel": "pos"}, context(name))
              for i, r in enumerate(records)]
    assert len({v[1:5] for v in values}) == 2
    produce_serialized(bootstrap, name, values)
    cfg = w.config(bootstrap, name, value_format="avro", schema_registry_url=schema_registry.url,
                   **MAPPING, exclude_features=["channel"])
    worker = Worker(cfg)
    assert worker.run()["records"] == 400
    assert worker.registry.requests["schema"] == 2
    assert not w.read_all(bootstrap, cfg.dead_letter_topic)
    assert predictions_by_offset(bootstrap, cfg.predictions_topic) == run_twin(bootstrap, records)


PRICED_SCHEMA = {"type": "record", "name": "Priced", "namespace": "test.decimals", "fields": [
    {"name": "transaction_id", "type": "string"},
    # 8 bytes hold 18 digits: every record of this schema was once a dead letter (issue 45)
    {"name": "price", "type": {"type": "fixed", "name": "Price", "size": 8,
                               "logicalType": "decimal", "precision": 12, "scale": 3}},
    {"name": "fee", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                             "scale": 2}},
    {"name": "is_fraud", "type": ["null", "boolean"], "default": None},
]}


def test_decimals_on_fixed_and_bytes_are_features_with_their_value(kafka_broker, schema_registry):
    import statistics

    import streammargin

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("decimals")
    create_topics(bootstrap, [name])
    rng = random.Random(7)
    records = []
    for i in range(300):
        price = decimal.Decimal(rng.randrange(-10 ** 12 + 1, 10 ** 12)).scaleb(-3)
        fee = decimal.Decimal(rng.randrange(-10 ** 10 + 1, 10 ** 10)).scaleb(-2)
        records.append({"transaction_id": f"t{i}", "price": price, "fee": fee,
                        "is_fraud": price > 10 * fee})
    for i, extreme in enumerate(["999999999.999", "-999999999.999", "0", "-0.001"]):
        records[i]["price"] = decimal.Decimal(extreme)
    serialize = avro_serializer(schema_registry.url, PRICED_SCHEMA)
    values = [serialize(r, context(name)) for r in records]
    assert values[3][5:16] == b"\x04t3" + b"\xff" * 8  # "t3", then a sign-extended fixed: -1
    produce_serialized(bootstrap, name, values)
    cfg = w.config(bootstrap, name, value_format="avro", schema_registry_url=schema_registry.url,
                   scale=True, **MAPPING)
    assert Worker(cfg).run()["records"] == 300
    assert not w.read_all(bootstrap, cfg.dead_letter_topic)
    ours = predictions_by_offset(bootstrap, cfg.predictions_topic)
    assert len(ours) == 300
    # The JSON twin carries each decimal as the float it rounds to: the same predictions.
    assert ours == run_twin(bootstrap, [{**r, "price": float(r["price"])} for r in records],
                            scale=True)
    scaler = streammargin.StandardScaler.from_state(
        w.saved_tasks(bootstrap, cfg, [0])[0]["scaler"])
    assert (scaler.counts["price"], scaler.counts["fee"]) == (300, 300)
    assert scaler.means["price"] == pytest.approx(
        statistics.fmean(float(r["price"]) for r in records), rel=1e-9)
    assert scaler.means["fee"] == pytest.approx(
        statistics.fmean(float(r["fee"]) for r in records), rel=1e-9)


def protobuf_payment(classes: dict, record: dict):
    payment = classes["Payment"](
        transaction_id=record["transaction_id"], amount=record["amount"],
        country=record["country"], card_present=record["card_present"],
        merchant=classes["Merchant"](**record["merchant"]), is_fraud=record["is_fraud"])
    return payment


def test_protobuf_and_json_schema_of_confluents_serializers_are_predicted_as_json(
        kafka_broker, schema_registry):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    import protobuf_messages

    bootstrap = kafka_broker.bootstrap_servers
    records = [{k: v for k, v in r.items() if k != "fee"} for r in payments(400, seed=3)]
    twin = run_twin(bootstrap, records)
    client = SchemaRegistryClient({"url": schema_registry.url})
    classes = protobuf_messages.message_classes()
    json_schema = json.dumps({
        "$schema": "http://json-schema.org/draft-07/schema#", "title": "Payment",
        "type": "object", "properties": {
            "transaction_id": {"type": "string"}, "amount": {"type": "number"},
            "country": {"type": "string"}, "card_present": {"type": "boolean"},
            "merchant": {"type": "object", "properties": {
                "category": {"type": "string"}, "risk": {"type": "number"}}},
            "is_fraud": {"type": ["boolean", "null"]}},
        "required": ["transaction_id", "amount"]})
    formats = {
        "protobuf": lambda topic: [
            ProtobufSerializer(classes["Payment"], client)(protobuf_payment(classes, r),
                                                           context(topic)) for r in records],
        "json-schema": lambda topic: [
            JSONSerializer(json_schema, client)(r, context(topic)) for r in records],
    }
    for value_format, serialize in formats.items():
        name = w.fresh(value_format)
        create_topics(bootstrap, [name])
        values = serialize(name)
        if value_format == "protobuf":
            assert values[0][5:7] == b"\x02\x02"  # message indexes [1]: the second message
        produce_serialized(bootstrap, name, values)
        cfg = w.config(bootstrap, name, value_format=value_format,
                       schema_registry_url=schema_registry.url, **MAPPING)
        worker = Worker(cfg)
        assert worker.run()["records"] == 400
        assert worker.registry.requests["schema"] == 1
        assert not w.read_all(bootstrap, cfg.dead_letter_topic), value_format
        assert predictions_by_offset(bootstrap, cfg.predictions_topic) == twin, value_format


def readiness(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_registry_outage_holds_the_records_back_without_a_dead_letter(
        kafka_broker, schema_registry):
    from connectors.observability.observability import EndpointServer

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("registry-outage")
    create_topics(bootstrap, [name], partitions=2)
    records = payments(600, seed=4)
    serialize = avro_serializer(schema_registry.url, PAYMENT_SCHEMA)
    values = [serialize(r, context(name)) for r in records]
    w.produce(bootstrap, name, [(i % 2, v) for i, v in enumerate(values)])
    cfg = w.config(bootstrap, name, value_format="avro", schema_registry_url=schema_registry.url,
                   schema_registry_config={"timeout": "1"}, idle_timeout=2.0, **MAPPING)
    worker = Worker(cfg)
    server = EndpointServer(worker.status, "127.0.0.1", 0)
    done = {}
    schema_registry.pause()
    try:
        thread = threading.Thread(target=lambda: done.update(worker.run()), daemon=True)
        thread.start()
        status, why = w.wait_for(
            lambda: (lambda answer: answer if "Schema Registry" in answer[1] else None)(
                readiness(server.url + "/readyz")), 60, "readiness to name the registry")
        assert status == 503
        time.sleep(3)  # the outage lasts: the worker waits, polling its paused partitions
        assert not w.read_all(bootstrap, cfg.predictions_topic)
        assert not w.read_all(bootstrap, cfg.dead_letter_topic)
        metrics = urllib.request.urlopen(server.url + "/metrics", timeout=5).read().decode()
        assert "streammargin_schema_registry_up 0.0" in metrics
    finally:
        schema_registry.resume()
    thread.join(120)
    server.close()
    assert done["records"] == 600
    assert len(w.read_all(bootstrap, cfg.predictions_topic)) == 600
    assert not w.read_all(bootstrap, cfg.dead_letter_topic)
    # The request that timed out, and the one answered once the registry was back.
    assert worker.registry.requests["schema"] == 2


def test_a_registry_outage_during_a_restore_is_waited_out_and_the_store_comes_back(
        kafka_broker, schema_registry, caplog):
    # A restore reads the waiting events again from the input topic, which needs their schema:
    # a registry that does not answer then is waited for (one WARNING), not a lost store.
    import logging

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("registry-restore")
    create_topics(bootstrap, [name])
    records = [{**r, "is_fraud": None} if i % 3 else r
               for i, r in enumerate(payments(300, seed=6))]
    serialize = avro_serializer(schema_registry.url, PAYMENT_SCHEMA)
    w.produce(bootstrap, name, [(0, serialize(r, context(name))) for r in records])
    cfg = w.config(bootstrap, name, value_format="avro", schema_registry_url=schema_registry.url,
                   schema_registry_config={"timeout": "1"}, idle_timeout=2.0, **MAPPING)
    assert Worker(cfg).run()["records"] == 300
    caplog.set_level(logging.INFO, logger="connectors")
    restarted = Worker(cfg)
    done = {}
    schema_registry.pause()
    try:
        thread = threading.Thread(target=lambda: done.update(restarted.run()), daemon=True)
        thread.start()
        w.wait_for(lambda: "needs the Schema Registry" in caplog.text, 60,
                   "the WARNING naming the registry")
        time.sleep(2)  # the outage lasts: the restore waits
        assert "read again from offsets" not in caplog.text
    finally:
        schema_registry.resume()
    thread.join(120)
    assert not thread.is_alive() and done["records"] == 0
    assert "200 events waiting for their label read again from offsets [1, 300)" in caplog.text
    assert "no longer on the input topic" not in caplog.text
    assert not w.read_all(bootstrap, cfg.dead_letter_topic)


def test_avro_outputs_are_read_by_confluents_deserializer(kafka_broker, schema_registry):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    from connectors import schemas

    bootstrap = kafka_broker.bootstrap_servers
    name = w.fresh("avro-out")
    create_topics(bootstrap, [name])
    records = payments(300, seed=5)
    w.produce(bootstrap, name, [(0, as_json(r)) for r in records])
    cfg = w.config(bootstrap, name, output_format="avro", metrics_every=100,
                   schema_registry_url=schema_registry.url, **MAPPING)
    Worker(cfg).run()
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": schema_registry.url}))
    predictions = [deserialize(r.value, context(cfg.predictions_topic))
                   for r in w.read_all(bootstrap, cfg.predictions_topic)]
    binary = schemas.validator("prediction-binary")
    for prediction in predictions:
        binary.validate(prediction)
    assert {p["offset"]: (p["y_pred"], p["p_true"], p["id"]) for p in predictions} == run_twin(
        bootstrap, records)
    metrics_validator = schemas.validator("metrics")
    found = [deserialize(r.value, context(cfg.metrics_topic))
             for r in w.read_all(bootstrap, cfg.metrics_topic)]
    assert [m["records"] for m in found] == [100, 200, 300, 300]
    for record in found:
        metrics_validator.validate(record)
