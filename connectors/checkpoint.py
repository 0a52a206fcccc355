"""Checkpoints of per-partition state on a compacted Kafka topic.

A checkpoint is the whole state of one input partition's task: the model's safe state
(`model.to_state()`), the scaler, the metrics, the drift detector, the delayed-label store, and the
*next offset* to process. It is written as `streammargin.state.dumps` bytes (a JSON header plus raw
numeric arrays: reading one back never executes code) to the checkpoint topic, keyed by
`group/topic/partition`, so the topic can be compacted down to the last checkpoint per key.

Restoring reads the latest record of the key. The checkpoint carries its own offset, so a task
restored from *any* checkpoint (even one older than the committed offset, after a crash between
the checkpoint and the commit) is consistent: replaying the records from that offset rebuilds the
exact state a crash lost, because the models are deterministic.

Brokers may keep the whole history of the topic (Tansu never compacts), so `CheckpointStore.load`
reads backwards from the end in growing windows and stops at the latest checkpoint of each key:
its cost depends on how recent the checkpoint is, not on how long the topic is.

A checkpoint is untrusted input (anyone who can write to the topic writes it), so it holds no
object graph: each part has an explicit schema of named, validated fields (the model's
`to_state`, `streammargin.StandardScaler.to_state`, `PartitionMetrics.to_state` with its drift
detector's state from `connectors.river_state`, `PendingLabels.to_state`), and every reader
raises `StateError` for anything malformed.
"""

from __future__ import annotations

import collections
import logging
import time
import typing

from streammargin import state as state_module

__all__ = [
    "CheckpointStore",
    "checkpoint_key",
    "encode_checkpoint",
    "decode_checkpoint",
    "CHECKPOINT_FORMAT",
]

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "streammargin.checkpoint/1"

# Checkpoint records -------------------------------------------------------------------------------


def checkpoint_key(group_id: str, topic: str, partition: int) -> bytes:
    """The key of a partition's checkpoints: `group/topic/partition`."""
    return f"{group_id}/{topic}/{partition}".encode()


def encode_checkpoint(fields: dict) -> bytes:
    """Checkpoint bytes (`streammargin.state.dumps` format) of a dict of JSON values and arrays."""
    return state_module.dumps({"format": CHECKPOINT_FORMAT, **fields})


def decode_checkpoint(data: bytes) -> dict:
    """Read checkpoint bytes back; never executes code. Raises `StateError` when unreadable."""
    fields = state_module.loads(data)
    if fields.get("format") != CHECKPOINT_FORMAT:
        raise state_module.StateError(f"not a streammargin checkpoint: {fields.get('format')!r}")
    return fields


def _partition_of(key: bytes, n_partitions: int) -> int:
    """The partition Kafka's default partitioner (Java's and kafka-python's) gives a key."""
    from kafka.partitioner.default import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % n_partitions


class CheckpointStore:
    """Writes checkpoints to, and reads the latest ones from, a (compacted) topic.

    Parameters
    ----------
    bootstrap_servers
        The cluster.
    topic
        The checkpoint topic.
    group_id
        Consumer group of the worker: part of every key.
    producer
        A `KafkaProducer` to write with (the worker shares its own); `None` creates one.
    client_config
        Extra client settings (security) for the reader consumer and an own producer.

    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        group_id: str,
        producer: typing.Any = None,
        client_config: dict | None = None,
        window: int = 64,
    ):
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.group_id = group_id
        self.client_config = dict(client_config or {})
        self.window = window
        self._own_producer = producer is None
        if producer is None:
            from kafka import KafkaProducer

            producer = KafkaProducer(
                bootstrap_servers=bootstrap_servers,
                max_request_size=64 << 20,
                **self.client_config,
            )
        self.producer = producer
        self._reader: typing.Any = None
        self._n_partitions: int | None = None

    # Writing ----------------------------------------------------------------------------------

    def n_partitions(self) -> int:
        if self._n_partitions is None:
            partitions = self.producer.partitions_for(self.topic)
            if not partitions:
                raise RuntimeError(f"checkpoint topic {self.topic!r} has no partitions")
            self._n_partitions = len(partitions)
        return self._n_partitions

    def save(self, topic: str, partition: int, payload: bytes) -> typing.Any:
        """Send one checkpoint; returns the send future (flush the producer to make it durable)."""
        key = checkpoint_key(self.group_id, topic, partition)
        return self.producer.send(
            self.topic, value=payload, key=key, partition=_partition_of(key, self.n_partitions())
        )

    # Reading ----------------------------------------------------------------------------------

    def _reader_consumer(self) -> typing.Any:
        if self._reader is None:
            from kafka import KafkaConsumer

            self._reader = KafkaConsumer(
                bootstrap_servers=self.bootstrap_servers,
                group_id=None,
                enable_auto_commit=False,
                fetch_max_wait_ms=20,
                max_partition_fetch_bytes=64 << 20,
                fetch_max_bytes=64 << 20,
                **self.client_config,
            )
        return self._reader

    def load(self, partitions: typing.Iterable[tuple[str, int]]) -> dict[tuple[str, int], bytes]:
        """The latest checkpoint bytes of each `(topic, partition)` that has one."""
        from kafka import TopicPartition

        wanted: dict[bytes, tuple[str, int]] = {
            checkpoint_key(self.group_id, topic, partition): (topic, partition)
            for topic, partition in partitions
        }
        by_checkpoint_partition: dict[int, set[bytes]] = collections.defaultdict(set)
        for key in wanted:
            by_checkpoint_partition[_partition_of(key, self.n_partitions())].add(key)
        found: dict[tuple[str, int], bytes] = {}
        for number, keys in sorted(by_checkpoint_partition.items()):
            latest = self._latest(TopicPartition(self.topic, number), keys)
            for key, payload in latest.items():
                found[wanted[key]] = payload
        return found

    def _latest(self, tp: typing.Any, keys: set[bytes]) -> dict[bytes, bytes]:
        """Latest value of each key in one partition: windows scanned backwards from the end."""
        reader = self._reader_consumer()
        reader.assign([tp])
        begin = reader.beginning_offsets([tp])[tp]
        # A hint only: the end offset can come back short on some brokers; the first window
        # reads on to the true end (the highwater mark of the fetches).
        end_hint = reader.end_offsets([tp])[tp]
        found: dict[bytes, bytes] = {}
        missing = set(keys)
        window = self.window
        start, stop = max(begin, end_hint - window), None
        while True:
            for key, value in self._scan(reader, tp, start, stop, missing).items():
                found[key] = value
            missing -= found.keys()
            if not missing or start <= begin:
                return found
            start, stop = max(begin, start - window), start
            window *= 4

    @staticmethod
    def _scan(reader: typing.Any, tp: typing.Any, start: int, stop: int | None, keys: set) -> dict:
        """Last value of each of `keys` in offsets [start, stop) (stop None: to the end)."""
        reader.seek(tp, start)
        latest: dict[bytes, bytes] = {}
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            batch = reader.poll(timeout_ms=200, max_records=10_000).get(tp, [])
            for record in batch:
                if stop is not None and record.offset >= stop:
                    return latest
                if record.key in keys and record.value is not None:
                    latest[record.key] = record.value
            position = reader.position(tp)
            if stop is not None and position >= stop:
                return latest
            highwater = reader.highwater(tp)
            if not batch and highwater is not None and position >= highwater:
                return latest
        raise TimeoutError(f"reading checkpoints from {tp} did not reach its end in 30 s")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._own_producer:
            self.producer.close()
