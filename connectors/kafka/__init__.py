"""The Kafka clients under the worker, and the brokers the tests, demo and benchmarks start.

- `transport.py`: the `Transport` interface the worker talks to Kafka through, and
  `KafkaPythonTransport` (kafka-python); `librdkafka_transport.py`: the same on confluent-kafka;
- `bulk_produce.py`: record batches appended without a future per record (kafka-python);
- `broker.py`: `EmbeddedBroker` (Tansu) and `ApacheKafkaBroker` (the jars of
  `apache_kafka/pom.xml`), `create_topics`.

Importing the package imports no Kafka client: each module imports its client where it uses it.
"""
