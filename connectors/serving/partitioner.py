"""The input partition a record key goes to: which partition-scope model would score it.

A producer picks a keyed record's partition by hashing its key; the worker's model of that
partition then scores it. `streammargin serve` answers a keyed request with the same model,
so it hashes the key as the topic's producers do. Two hashes cover the Kafka clients' defaults:

- `murmur2` (the default): `(murmur2(key) & 0x7fffffff) % partitions`, the default
  partitioner of Java's producer (and so Kafka Streams, Kafka Connect, ksqlDB), of
  kafka-python, and librdkafka's `partitioner=murmur2_random`;
- `crc32`: `crc32(key) % partitions`, librdkafka's default (`consistent_random`: confluent-kafka,
  and the clients on librdkafka) for a non-empty key.

A null or empty key has no partition of its own (every client spreads those records
round-robin, sticky or at random): such a request is answered as a request without a key.

>>> partition_of(b"card-7", 12), partition_of(b"card-7", 12, "crc32")
(2, 5)
"""

from __future__ import annotations

import zlib

__all__ = ["PARTITIONERS", "partition_of"]

PARTITIONERS = ("murmur2", "crc32")


def partition_of(key: bytes, partitions: int, partitioner: str = "murmur2") -> int:
    """The partition of `key` among `partitions` by `partitioner` (see the module doc)."""
    if partitioner == "crc32":
        return zlib.crc32(key) % partitions
    from kafka.partitioner.default import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % partitions
