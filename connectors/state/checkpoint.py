"""Checkpoints of per-partition state on a compacted Kafka topic.

A checkpoint is the whole state of one input partition's task: the model's safe state
(`model.to_state()`), the scaler, the metrics, the drift detector, the delayed-label store, and the
*next offset* to process. Its payload is `streammargin.state.dumps` bytes (a JSON header plus raw
numeric arrays: reading one back never executes code), written to the checkpoint topic under the
key `group/topic/partition`, so the topic can be compacted down to the last checkpoint per key.

A payload of at most `chunk_bytes` (512 KiB by default, below a default Kafka broker's 1 MB
`message.max.bytes`) is one record. A larger one is written as chunk records, then, once they are
acknowledged, a manifest under the key that lists their offsets, the size and a SHA-256: the
manifest is the commit point, so a checkpoint is restored whole or not at all. The chunks of the
generation a new checkpoint replaces get tombstones. Everything read back is checked before it is
trusted (format, keys, order, sizes, hash, `max_checkpoint_bytes`); a checkpoint that fails a
check is a `RefusedCheckpoint` with its coordinates and the reason, never another exception.

Restoring reads the latest head record of the key. The checkpoint carries its own offset, so a
task restored from *any* checkpoint (even one older than the committed offset, after a crash
between the checkpoint and the commit) is consistent: replaying the records from that offset
rebuilds the exact state a crash lost, because the models are deterministic.

Brokers keep superseded records of a compacted topic (Apache Kafka's cleaner never touches the
active segment, 7 days or 1 GiB by default; Tansu never compacts), so `CheckpointStore.load`
reads backwards from the end in growing windows and stops at the latest head record of each key:
its cost depends on how recent the checkpoint is, not on how long the topic is.

A checkpoint is untrusted input (anyone who can write to the topic writes it), so it holds no
object graph: each part has an explicit schema of named, validated fields (the model's
`to_state`, `streammargin.StandardScaler.to_state`, `PartitionMetrics.to_state` with its drift
detector's state from `connectors.state.river_state`, `PendingLabels.to_state`), and every reader
raises `StateError` for anything malformed.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import secrets
import time
import typing

from streammargin import state as state_module

__all__ = [
    "CheckpointStore",
    "CheckpointWrite",
    "CheckpointError",
    "LoadedCheckpoint",
    "RefusedCheckpoint",
    "Generation",
    "Inline",
    "Manifest",
    "Segment",
    "Segmented",
    "MAX_SEGMENTS",
    "frame_segmented",
    "ChunkAssembler",
    "read_head",
    "frame_inline",
    "frame_chunk",
    "frame_manifest",
    "chunk_key",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_CHECKPOINT_BYTES",
    "MIN_CHUNK_BYTES",
    "MAX_CHUNKS",
    "SEND_WINDOW_BYTES",
    "checkpoint_key",
    "encode_checkpoint",
    "decode_checkpoint",
    "CHECKPOINT_FORMAT",
]

log = logging.getLogger(__name__)

from connectors.state.checkpoint_records import (  # noqa: F401 (re-exported)
    CHECKPOINT_FORMAT,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_CHECKPOINT_BYTES,
    MIN_CHUNK_BYTES,
    MAX_CHUNKS,
    MAX_SEGMENTS,
    READ_COMMITTED_QUIET_S,
    RECORD_HEADROOM,
    _MANIFEST_HEAD,
    _OFFSET,
    _U32,
    ChunkAssembler,
    Generation,
    Inline,
    Manifest,
    Segment,
    Segmented,
    _chunk_of,
    _partition_of,
    _refuse,
    checkpoint_key,
    chunk_key,
    decode_checkpoint,
    encode_checkpoint,
    frame_chunk,
    frame_inline,
    frame_manifest,
    frame_segmented,
    read_head,
)

# A write waits for the acknowledgements of what it sent each time it has sent this many bytes
# since the last wait: the producer holds a copy of every record not acknowledged yet
# (kafka-python 3 bounds nothing, librdkafka's queue takes up to 1 GiB), and a worker's round of
# 12 checkpoints of the CPM, 26 MiB each, had 131 MiB of kafka-python's batches beside them
# when everything was sent before the first wait. The worker's --max-memory charges the window
# (and the one record that may pass it).
SEND_WINDOW_BYTES = 32 << 20

# Loading results ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint read back whole: its payload, and the head record it came from."""

    key: str
    payload: bytes
    topic: str
    partition: int
    offset: int
    chunks: int  # 0: inline
    # Its segments' bytes by id (`CheckpointWrite`), each checked against its head's SHA-256.
    segments: typing.Mapping[int, bytes] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"LoadedCheckpoint({self.key!r}, {len(self.payload)} bytes, "
                f"{self.topic}/{self.partition}@{self.offset}, {self.chunks} chunks, "
                f"{len(self.segments)} segments)")


@dataclasses.dataclass(frozen=True)
class CheckpointWrite:
    """A checkpoint with segments: parts that outlive it (`checkpoint_records`' "segmented").

    `new_segments` are written with this checkpoint, under ids of the writer's choosing;
    `kept_segments` are ids of segments the key's current checkpoint lists, kept as they are.
    Every other segment of the key is dropped once this checkpoint is durable. A restore gets
    the segments of the latest checkpoint back in `LoadedCheckpoint.segments`.
    """

    payload: bytes
    new_segments: typing.Mapping[int, bytes] = dataclasses.field(default_factory=dict)
    kept_segments: typing.Collection[int] = ()

    @property
    def written_bytes(self) -> int:
        """What this checkpoint writes: its payload and its new segments."""
        return len(self.payload) + sum(len(data) for data in self.new_segments.values())


@dataclasses.dataclass(frozen=True)
class RefusedCheckpoint:
    """A checkpoint that cannot be used, and why (`str()` of it is a one-line log message)."""

    key: str
    topic: str
    partition: int
    offset: int
    reason: str

    def __str__(self) -> str:
        return (f"checkpoint {self.key} at {self.topic}/{self.partition}@{self.offset} refused: "
                f"{self.reason}")


def _read_to(reader: typing.Any, tp: typing.Any) -> bool:
    """Whether the reader's position on `tp` is at its last known high watermark."""
    highwater, position = reader.highwater(tp), reader.position(tp)
    return highwater is not None and position is not None and position >= highwater


class CheckpointError(RuntimeError):
    """The checkpoint topic could not be written or read (broker errors, timeouts, limits)."""


@dataclasses.dataclass
class _Live:
    """What the store knows of a key's current checkpoint: the chunks it will supersede."""

    own: Generation | None
    previous: Generation | None
    orphans: list[bytes] = dataclasses.field(default_factory=list)
    segments: dict[int, Segment] = dataclasses.field(default_factory=dict)
    dropped: tuple[Generation, ...] = ()


@dataclasses.dataclass
class _Plan:
    """One checkpoint of a `write`."""

    key: bytes
    number: int
    payload: bytes
    generation: Generation | None
    previous: Generation | None
    offsets: list[int] = dataclasses.field(default_factory=list)
    # Segments: those kept from the current checkpoint, the new ones (id, bytes, generation,
    # chunk offsets once written), the generations dropped (now and by the current head).
    kept: list[Segment] = dataclasses.field(default_factory=list)
    new: list[tuple[int, bytes, Generation, list[int]]] = dataclasses.field(default_factory=list)
    dropped: list[Generation] = dataclasses.field(default_factory=list)

    def chunked(self) -> list[tuple[Generation, bytes, list[int]]]:
        """Every generation of chunk records this checkpoint writes: its own, its segments'."""
        own = [] if self.generation is None else [(self.generation, self.payload, self.offsets)]
        return own + [(generation, data, offsets) for _, data, generation, offsets in self.new]


class CheckpointStore:
    """Writes checkpoints to, and reads the latest ones from, a (compacted) topic.

    A checkpoint of at most `chunk_bytes` is one record under its partition's key. A larger one
    is written as chunk records first, then, once they are acknowledged, a manifest under the key
    that lists their offsets, the size and a SHA-256 of the whole: the manifest is the commit
    point, so a crash in between leaves the previous checkpoint in force. Once a new head record
    is acknowledged, the chunks of the generation it replaced get tombstones, which a compacted
    topic then drops. Every record of a key goes to one partition of the checkpoint topic, the
    one Kafka's default partitioner gives the key.

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
    reader_config
        Settings of the consumer that reads checkpoints back (security, connection), on top of
        the store's own.
    producer_config
        Settings of the store's own producer, when `producer` is None.
    chunk_bytes
        Payload bytes per record. Capped so that a record fits the producer's
        `max_request_size`; keep it below the broker's `message.max.bytes` (about 1 MB by
        default). Only writing uses it: checkpoints written with another chunk size still load.
    max_checkpoint_bytes
        Larger checkpoints are neither written (`CheckpointError`) nor read (refused).
    window
        Records in the first window of the backwards scan for the latest head records.
    timeout
        Seconds reading may wait for a record it needs (then `CheckpointError`). A write waits
        for the producer's acknowledgements, which its `delivery_timeout_ms` bounds.
    reader_factory
        Makes the reader from its kafka-python settings (keyword arguments); it must offer the
        `KafkaConsumer` calls the store reads with (assign, seek, poll, position, highwater,
        beginning_offsets, end_offsets, close). Default: `KafkaConsumer`
        (`connectors.kafka.librdkafka_transport.CheckpointReader` reads with librdkafka).
    transactional
        The producer is transactional (exactly-once): writes belong to the worker's open
        transaction, which it ends with `transaction_ended` (give the reader
        isolation_level=read_committed too).
    flush_producer
        A write flushes the whole producer before it waits for its records (True: what was
        sent before a checkpoint is durable with it, as at-least-once needs of the outputs
        before a checkpoint), or waits for its own records only (False: the model topic, whose
        records need nothing else durable; a flush of the worker's producer every exchange sent
        its predictions in batches cut short, and made a record wait for them). librdkafka
        reports deliveries only to a poll or flush of its producer, so there a write flushes
        either way (`Delivery.get`).
    read_only
        A reader only (`streammargin serve`, which never writes to Kafka): no producer is
        made, the checkpoint topic's partitions come from the reader's metadata (its
        `partitions_for_topic`: kafka-python's `KafkaConsumer`), and `write` raises
        `CheckpointError`.

    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        group_id: str,
        producer: typing.Any = None,
        reader_config: dict | None = None,
        producer_config: dict | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        window: int = 64,
        timeout: float = 60.0,
        reader_factory: typing.Callable[..., typing.Any] | None = None,
        transactional: bool = False,
        flush_producer: bool = True,
        read_only: bool = False,
    ):
        if not MIN_CHUNK_BYTES <= chunk_bytes <= _U32:
            raise ValueError(f"chunk_bytes must be within [{MIN_CHUNK_BYTES}, {_U32}], got "
                             f"{chunk_bytes!r}")
        if max_checkpoint_bytes < 1:
            raise ValueError(f"max_checkpoint_bytes must be >= 1, got {max_checkpoint_bytes!r}")
        if reader_factory is None:  # kafka-python's clients (librdkafka's checksum in C)
            from connectors.codec import install_fast_crc32c

            # kafka-python checksums every record batch, in pure Python (~85 ms per MB) unless
            # told otherwise: a 1 GiB checkpoint would take minutes each way.
            install_fast_crc32c()
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.group_id = group_id
        self.reader_config = dict(reader_config or {})
        self.reader_factory = reader_factory
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.window = window
        self.timeout = timeout
        self.read_only = read_only
        self._own_producer = producer is None and not read_only
        if producer is None and not read_only:
            from kafka import KafkaProducer

            producer = KafkaProducer(
                **{
                    "bootstrap_servers": bootstrap_servers,
                    "max_request_size": chunk_bytes + RECORD_HEADROOM,
                    "batch_size": chunk_bytes + RECORD_HEADROOM,
                    **(producer_config or {}),
                }
            )
        self.producer = producer
        # A record of chunk_bytes must pass the producer's own size check.
        limit = getattr(producer, "config", {}).get("max_request_size")
        if isinstance(limit, int) and limit - RECORD_HEADROOM < chunk_bytes:
            chunk_bytes = limit - RECORD_HEADROOM
            if chunk_bytes < MIN_CHUNK_BYTES:
                raise ValueError(
                    f"the producer's max_request_size={limit} leaves less than {MIN_CHUNK_BYTES}"
                    " bytes of checkpoint per record: raise it"
                )
        self.chunk_bytes = chunk_bytes
        self._reader: typing.Any = None
        self._n_partitions: int | None = None
        self._live: dict[bytes, _Live] = {}
        # `follow`: the next offset to read of each checkpoint-topic partition, and the keys
        # followed so far (a key not followed before is `load`ed first).
        self._follow_from: dict[int, int] = {}
        self._followed_keys: set[bytes] = set()
        self._following: list | None = None  # the partitions the reader follows now
        # With a transactional producer (exactly-once), a write is part of the worker's open
        # transaction: the live state of each key it changed, as it was before, so that an
        # aborted transaction puts it back (`transaction_ended`).
        self.transactional = transactional
        self._undo: dict[bytes, _Live | None] = {}
        self.flush_producer = flush_producer

    def n_partitions(self) -> int:
        if self._n_partitions is None:
            if self.read_only:
                partitions = self._reader_consumer().partitions_for_topic(self.topic)
            else:
                partitions = self.producer.partitions_for(self.topic)
            if not partitions:
                raise CheckpointError(f"checkpoint topic {self.topic!r} has no partitions")
            self._n_partitions = len(partitions)
        return self._n_partitions

    def partitions_of(self, topic: str) -> set[int]:
        """The partition numbers of any `topic`, from the reader's metadata (refreshed every
        `metadata_max_age_ms`); empty while the topic does not exist."""
        return set(self._reader_consumer().partitions_for_topic(topic) or ())

    # Writing ----------------------------------------------------------------------------------

    def write(self, checkpoints: typing.Mapping[tuple[str, int], bytes | CheckpointWrite]) -> None:
        """Write the checkpoint of each `(topic, partition)` (its payload, or a `CheckpointWrite`
        with segments); returns once all are durable.

        Raises `CheckpointError` if a record was not acknowledged (within the producer's
        `delivery_timeout_ms`), or a checkpoint is above `max_checkpoint_bytes` or needs more
        than `MAX_CHUNKS` chunks; the checkpoints in force are then the previous ones (or some
        of the new ones: each is atomic).
        """
        if not checkpoints:
            return
        if self.read_only:
            raise CheckpointError("a read-only checkpoint store writes nothing")
        plans = [self._plan(topic, partition, checkpoint if isinstance(checkpoint, CheckpointWrite)
                            else CheckpointWrite(bytes(checkpoint)))
                 for (topic, partition), checkpoint in checkpoints.items()]
        try:
            self._write_chunks(plans)
            self._write_heads(plans)
        except BaseException:
            # Chunks of this attempt may be durable without a manifest: the next write that
            # succeeds deletes them.
            for plan in plans:
                for generation, _, _ in plan.chunked():
                    self._remember(plan.key)
                    live = self._live.setdefault(plan.key, _Live(None, None))
                    live.orphans.extend(generation.keys(plan.key))
            raise
        self._write_tombstones(plans)

    def _plan(self, topic: str, partition: int, checkpoint: CheckpointWrite) -> _Plan:
        key = checkpoint_key(self.group_id, topic, partition)
        payload = bytes(checkpoint.payload)
        live = self._live.get(key) or _Live(None, None)
        missing = set(checkpoint.kept_segments) - live.segments.keys()
        if missing or set(checkpoint.new_segments) & live.segments.keys():
            # (a bug of the writer: it keeps what its checkpoint never had, or reuses an id)
            raise CheckpointError(
                f"the checkpoint of {topic}/{partition} keeps segments {sorted(missing)} it does "
                "not have, or reuses the id of a segment it has")
        kept = [live.segments[i] for i in sorted(set(checkpoint.kept_segments))]
        size = len(payload) + sum(s.chunks.total_bytes for s in kept) + sum(
            len(data) for data in checkpoint.new_segments.values())
        if size > self.max_checkpoint_bytes:
            raise CheckpointError(
                f"the checkpoint of {topic}/{partition} is {size} bytes, above "
                f"max_checkpoint_bytes={self.max_checkpoint_bytes}: raise the limit, or bound the"
                " model's size"
            )
        if len(kept) + len(checkpoint.new_segments) > MAX_SEGMENTS:
            raise CheckpointError(f"the checkpoint of {topic}/{partition} has more than "
                                  f"{MAX_SEGMENTS} segments")
        generation = None
        if len(payload) > self.chunk_bytes:
            generation = self._generation(topic, partition, len(payload))
        new = [(segment_id, bytes(data), self._generation(topic, partition, len(data)), [])
               for segment_id, data in sorted(checkpoint.new_segments.items())]
        dropped = [s.generation for i, s in live.segments.items()
                   if i not in checkpoint.kept_segments]
        return _Plan(key, _partition_of(key, self.n_partitions()), payload, generation,
                     live.own, kept=kept, new=new, dropped=dropped)

    def _generation(self, topic: str, partition: int, size: int) -> Generation:
        """A new generation of chunk records for `size` bytes (at least one record)."""
        count = max(1, -(-size // self.chunk_bytes))
        manifest_bytes = _MANIFEST_HEAD.size + _OFFSET.size * count
        if count > MAX_CHUNKS or manifest_bytes > self.chunk_bytes:
            raise CheckpointError(
                f"the checkpoint of {topic}/{partition} ({size} bytes) needs {count} chunks"
                f" of {self.chunk_bytes} bytes, too many for one manifest: raise chunk_bytes"
            )
        # Random, so that two writers of one key (a zombie after a rebalance) never share
        # chunk keys.
        return Generation(secrets.randbits(64) or 1, count)

    def _send(self, key: bytes, value: bytes | None, number: int) -> typing.Any:
        try:
            return self.producer.send(self.topic, value=value, key=key, partition=number)
        except Exception as error:  # e.g. MessageSizeTooLargeError, KafkaTimeoutError
            raise CheckpointError(f"cannot send checkpoint record {key!r}: {error}") from error

    def _await(self, futures: list) -> list:
        """The RecordMetadata of each send, once all are acknowledged."""
        from kafka.errors import KafkaError, MessageSizeTooLargeError

        try:
            # Every send completes, acknowledged or failed, within delivery_timeout_ms.
            if self.flush_producer:
                self.producer.flush()
            return [future.get() for future in futures]
        except MessageSizeTooLargeError as error:
            raise CheckpointError(
                f"the broker refused a checkpoint record of up to {self.chunk_bytes} bytes on "
                f"{self.topic!r} ({error}): lower the chunk size below the topic's "
                "max.message.bytes"
            ) from error
        except KafkaError as error:
            raise CheckpointError(
                f"checkpoint records were not acknowledged by {self.topic!r}: {error}"
            ) from error

    def _write_chunks(self, plans: list[_Plan]) -> None:
        chunked = [(plan, *part) for plan in plans for part in plan.chunked()]
        if not chunked:
            return
        size = self.chunk_bytes
        sends: list[tuple[list[int], typing.Any]] = []
        sent = 0
        # Round robin over the generations: each one's chunks keep their order, and a reader
        # copes with other records between them. Acknowledged each SEND_WINDOW_BYTES.
        for index in range(max(generation.chunks for _, generation, _, _ in chunked)):
            for plan, generation, payload, offsets in chunked:
                if index < generation.chunks:
                    data = memoryview(payload)[index * size:(index + 1) * size]
                    value = frame_chunk(generation.number, index, generation.chunks, data)
                    sends.append((offsets, self._send(
                        chunk_key(plan.key, generation.number, index), value, plan.number
                    )))
                    sent += len(value)
                    if sent >= SEND_WINDOW_BYTES:
                        self._acknowledged(sends)
                        sends, sent = [], 0
        self._acknowledged(sends)

    def _acknowledged(self, sends: list[tuple[list[int], typing.Any]]) -> None:
        """Wait for these chunks' acknowledgements; each one's offset goes to its list."""
        for (offsets, _), metadata in zip(sends, self._await([f for _, f in sends])):
            offsets.append(metadata.offset)

    def _write_heads(self, plans: list[_Plan]) -> None:
        futures = []
        sent = 0
        for plan in plans:
            if plan.generation is None:
                value = frame_inline(plan.payload, plan.previous)
            else:
                value = frame_manifest(Manifest(
                    plan.generation.number, len(plan.payload), self.chunk_bytes,
                    tuple(plan.offsets), hashlib.sha256(plan.payload).digest(), plan.previous,
                ))
            if plan.kept or plan.new or plan.dropped:
                value = frame_segmented(value, self._segments(plan), self._dropped(plan))
            futures.append(self._send(plan.key, value, plan.number))
            sent += len(value)  # (an inline head holds its checkpoint: a chunk's bytes at most)
            if sent >= SEND_WINDOW_BYTES:
                self._await(futures)
                futures, sent = [], 0
        self._await(futures)

    def _segments(self, plan: _Plan) -> list[Segment]:
        """The segments a plan's head lists: those it keeps, then its new ones."""
        return plan.kept + [
            Segment(segment_id, Manifest(generation.number, len(data), self.chunk_bytes,
                                         tuple(offsets), hashlib.sha256(data).digest(), None))
            for segment_id, data, generation, offsets in plan.new
        ]

    def _dropped(self, plan: _Plan) -> list[Generation]:
        """The generations a plan's head names as dropped: now, and by the head it replaces
        (deleted again, in case the process died before their tombstones)."""
        live = self._live.get(plan.key)
        before = () if live is None else live.dropped
        return list(dict.fromkeys([*plan.dropped, *before]))[:MAX_SEGMENTS]

    def _write_tombstones(self, plans: list[_Plan]) -> None:
        """Delete the chunks the new heads superseded (flushed with the producer's next flush)."""
        for plan in plans:
            self._remember(plan.key)
            live = self._live.get(plan.key)
            self._live[plan.key] = _Live(
                plan.generation, plan.previous,
                segments={segment.id: segment for segment in self._segments(plan)},
                dropped=tuple(plan.dropped))
            if live is None:
                continue
            stale = {g for g in (live.own, live.previous, *plan.dropped, *live.dropped)
                     if g is not None}
            keys = dict.fromkeys(k for g in sorted(stale, key=lambda g: g.number)
                                 for k in g.keys(plan.key))
            keys.update(dict.fromkeys(live.orphans))
            # The new head is durable: a failed tombstone costs only space.
            for key in keys:
                try:
                    future = self._send(key, None, plan.number)
                except CheckpointError as error:
                    log.warning("%s", error)
                    continue
                future.add_errback(
                    lambda error, key=key: log.warning("tombstone of %r failed: %s", key, error)
                )

    def _remember(self, key: bytes) -> None:
        if self.transactional and key not in self._undo:
            live = self._live.get(key)
            self._undo[key] = None if live is None else dataclasses.replace(
                live, orphans=list(live.orphans), segments=dict(live.segments))

    def transaction_ended(self, committed: bool) -> None:
        """The worker's transaction ended: the writes since the last end stand (`committed`) or
        are gone (aborted: read_committed readers and the log cleaner skip them), and the store
        again knows which chunks the next checkpoint of each key supersedes."""
        if not committed:
            for key, live in self._undo.items():
                if live is None:
                    self._live.pop(key, None)
                else:
                    self._live[key] = live
        self._undo.clear()

    # Reading ----------------------------------------------------------------------------------

    def _reader_consumer(self) -> typing.Any:
        if self._reader is None:
            from kafka import KafkaConsumer

            fetch_bytes = max(8 << 20, 2 * self.chunk_bytes)
            self._reader = (self.reader_factory or KafkaConsumer)(
                **{
                    "bootstrap_servers": self.bootstrap_servers,
                    "group_id": None,
                    "enable_auto_commit": False,
                    "auto_offset_reset": "earliest",
                    "fetch_max_wait_ms": 20,
                    "max_partition_fetch_bytes": fetch_bytes,
                    "fetch_max_bytes": fetch_bytes,
                    **self.reader_config,
                }
            )
        return self._reader

    def load(
        self, partitions: typing.Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], LoadedCheckpoint | RefusedCheckpoint]:
        """The latest checkpoint of each `(topic, partition)` that has one, or why it is refused.

        A partition without a checkpoint (none written, or its key's latest record is a
        tombstone) is absent. Raises `CheckpointError` when the topic cannot be read in time.
        """
        from kafka import TopicPartition

        self._following = None  # (`follow`'s reader is moved)
        wanted: dict[bytes, tuple[str, int]] = {
            checkpoint_key(self.group_id, topic, partition): (topic, partition)
            for topic, partition in partitions
        }
        by_checkpoint_partition: dict[int, set[bytes]] = collections.defaultdict(set)
        for key in wanted:
            by_checkpoint_partition[_partition_of(key, self.n_partitions())].add(key)
            self._live.pop(key, None)
            self._undo.pop(key, None)  # what is read back is what stands
        found: dict[tuple[str, int], LoadedCheckpoint | RefusedCheckpoint] = {}
        for number, keys in sorted(by_checkpoint_partition.items()):
            tp = TopicPartition(self.topic, number)
            heads, orphans = self._latest(tp, keys)
            for key in sorted(keys):
                offset, value = heads.get(key, (None, None))
                if offset is not None and value is not None:
                    found[wanted[key]] = result = self._read_checkpoint(tp, key, offset, value)
                    if isinstance(result, RefusedCheckpoint):
                        continue  # what the worker does next is its policy: touch nothing
                # Chunks written after the head (or with no head at all: the key is new or
                # deleted) belong to writes that never committed: the next write deletes them.
                live = self._live.setdefault(key, _Live(None, None))
                live.orphans = orphans.get(key, [])
        return found

    def follow(
        self, partitions: typing.Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], LoadedCheckpoint | RefusedCheckpoint]:
        """`load` for a reader that comes back every few hundred milliseconds (the model
        exchange): the latest checkpoint of each `(topic, partition)` among the records that
        came since the last `follow` (a key not followed before: `load`ed first, the latest of
        all).

        Why: `load` asks for the log's start and end offsets and scans back from the end each
        time, two requests and two fetches or more: its median was 174 ms on a model topic of
        one partition (three workers in one process), a third of an exchange's period. `follow`
        keeps the reader on the checkpoint topic's partitions and reads on from where it
        stopped: records already fetched, or one fetch. It stops at the high watermark or at
        the first poll that brings nothing (a fetch wait, 20 ms): records that come later are
        the next call's, never skipped (its next offsets are its own, and the reader goes back
        to them whenever `load` or a chunk read moved it). Not for a transactional store, whose
        readable end is not the high watermark.
        """
        from kafka import TopicPartition

        if self.transactional:
            raise CheckpointError("follow reads to the high watermark: not for a transactional "
                                  "store (use load)")
        wanted = {checkpoint_key(self.group_id, topic, partition): (topic, partition)
                  for topic, partition in partitions}
        numbers = {_partition_of(key, self.n_partitions()) for key in wanted}
        reader = self._reader_consumer()
        for number in sorted(numbers - self._follow_from.keys()):
            # (a hint, as in `_latest`: reading on from it finds no head `load` has not found)
            tp = TopicPartition(self.topic, number)
            self._follow_from[number] = reader.end_offsets([tp])[tp]
        new = [wanted[key] for key in wanted if key not in self._followed_keys]
        found = self.load(new) if new else {}  # (load moves the reader: `_following` reset)
        for number in sorted(numbers):
            # One partition at a time (a model topic has one, usually: the reader then stays
            # on it from call to call, its fetches under way kept).
            tp = TopicPartition(self.topic, number)
            if self._following != [tp]:
                reader.assign([tp])
                reader.seek(tp, self._follow_from[number])
                self._following = [tp]
            heads: dict[bytes, tuple[int, bytes | None]] = {}
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                batch = reader.poll(timeout_ms=20, max_records=10_000).get(tp, [])
                if not batch:
                    break
                for record in batch:
                    if record.key in wanted:
                        heads[record.key] = (record.offset, record.value)
                self._follow_from[number] = batch[-1].offset + 1
                if _read_to(reader, tp):
                    break
            for key, (offset, value) in sorted(heads.items()):
                self._live.pop(key, None)
                if value is None:
                    found.pop(wanted[key], None)  # deleted since
                    continue
                found[wanted[key]] = result = self._read_checkpoint(tp, key, offset, value)
                if isinstance(result, LoadedCheckpoint) and (result.chunks or result.segments):
                    self._following = None  # the chunk reads moved the reader
        self._followed_keys.update(wanted)
        return found

    def read_records(self, tp: typing.Any, start: int,
                     stop: int) -> typing.Iterator[list[typing.Any]]:
        """The records of another topic's partition `tp` in offsets [start, stop), a poll's batch
        at a time, with the store's reader (its settings, its isolation level): a restore reads
        the input topic again with it (`PendingLabels.rebuild_range`). Offsets the topic no
        longer has (retention) are skipped: the reader starts at the log start. Raises
        `CheckpointError` when nothing comes for `timeout` seconds before the end."""
        reader = self._reader_consumer()
        self._following = None  # (`follow`'s reader is moved)
        reader.assign([tp])
        reader.seek(tp, start)
        deadline = time.monotonic() + self.timeout
        while True:
            batch = reader.poll(timeout_ms=200, max_records=10_000).get(tp, [])
            if batch:
                deadline = time.monotonic() + self.timeout
                if batch[-1].offset >= stop:
                    batch = [record for record in batch if record.offset < stop]
                yield batch
            position = reader.position(tp)
            if position is not None and position >= stop:
                return
            highwater = reader.highwater(tp)
            if not batch and highwater is not None and position is not None:
                if position >= highwater:
                    return  # (the topic ends before `stop`: it was deleted and made again)
            if time.monotonic() > deadline:
                raise CheckpointError(f"reading {tp.topic}/{tp.partition} from offset {start}: no "
                                      f"record came in {self.timeout} s before offset {stop}")

    def _read_checkpoint(
        self, tp: typing.Any, key: bytes, offset: int, value: bytes
    ) -> LoadedCheckpoint | RefusedCheckpoint:
        name = key.decode(errors="replace")
        try:
            head = read_head(value, offset, self.max_checkpoint_bytes)
            listed: tuple[Segment, ...] = ()
            dropped: tuple[Generation, ...] = ()
            if isinstance(head, Segmented):
                head, listed, dropped = head.head, head.segments, head.dropped
            if isinstance(head, Inline):
                payload, own, chunks = head.payload, None, 0
            else:
                payload = self._read_chunks(tp, key, head)
                own, chunks = Generation(head.generation, head.count), head.count
            segments = {s.id: self._read_chunks(tp, key, s.chunks) for s in listed}
        except state_module.StateError as error:
            return RefusedCheckpoint(name, tp.topic, tp.partition, offset, str(error))
        self._live[key] = _Live(own, head.previous, segments={s.id: s for s in listed},
                                dropped=dropped)
        return LoadedCheckpoint(name, payload, tp.topic, tp.partition, offset, chunks, segments)

    def _read_chunks(self, tp: typing.Any, key: bytes, manifest: Manifest) -> bytes:
        """The payload of a manifest: its chunk records read by offset and checked in order."""
        reader = self._reader_consumer()
        begin = reader.beginning_offsets([tp])[tp]
        if manifest.offsets[0] < begin:
            _refuse(f"chunk 0 at offset {manifest.offsets[0]} is before the log start {begin}")
        assembler = ChunkAssembler(key, manifest)
        while assembler.next_index < manifest.count:
            reader.seek(tp, manifest.offsets[assembler.next_index])
            self._read_run(reader, tp, assembler)
        return assembler.payload()

    def _read_run(self, reader: typing.Any, tp: typing.Any, assembler: ChunkAssembler) -> None:
        """Feed `assembler` the chunk records from the reader's position on, until every chunk
        is in or the next one is far enough ahead to seek to."""
        offsets = assembler.manifest.offsets
        count = len(offsets)
        seek_gap = 4 * self.window
        deadline = time.monotonic() + self.timeout
        while True:
            batch = reader.poll(timeout_ms=200, max_records=1_000).get(tp, [])
            want = offsets[assembler.next_index]
            if not batch:
                highwater = reader.highwater(tp)
                if highwater is not None and reader.position(tp) >= highwater:
                    _refuse(f"chunk {assembler.next_index} at offset {want} is missing")
                if time.monotonic() > deadline:
                    raise CheckpointError(
                        f"no record of {tp.topic}/{tp.partition} came in {self.timeout} s while "
                        f"reading the chunks of {assembler.head_key!r}"
                    )
                continue
            deadline = time.monotonic() + self.timeout
            for record in batch:
                if record.offset < want:
                    continue
                if record.offset > want:
                    _refuse(f"chunk {assembler.next_index} at offset {want} is missing "
                            "(compacted or deleted)")
                assembler.add(record.offset, record.key, record.value)
                if assembler.next_index == count:
                    return
                want = offsets[assembler.next_index]
                if want - record.offset > seek_gap:
                    return

    def _latest(
        self, tp: typing.Any, keys: set[bytes]
    ) -> tuple[dict[bytes, tuple[int, bytes | None]], dict[bytes, list[bytes]]]:
        """The latest record (offset, value) of each key in one partition, scanned in windows
        backwards from the end; and, per key, the chunk keys with a value after that record
        (chunks of a write that never got its manifest)."""
        reader = self._reader_consumer()
        reader.assign([tp])
        begin = reader.beginning_offsets([tp])[tp]
        # A hint only: the end offset comes back short on Tansu (the last batch's base offset
        # + 1); the first window reads on to the true end (the highwater mark of the fetches).
        end_hint = reader.end_offsets([tp])[tp]
        found: dict[bytes, tuple[int, bytes | None]] = {}
        chunks: dict[bytes, tuple[int, bool]] = {}
        window = self.window
        start, stop = max(begin, end_hint - window), None
        while True:
            latest = self._scan(reader, tp, start, stop, keys - found.keys(), keys, chunks,
                                end_hint)
            found.update(latest)
            if found.keys() >= keys or start <= begin:
                break
            start, stop = max(begin, start - window), start
            window *= 4
        orphans: dict[bytes, list[bytes]] = collections.defaultdict(list)
        for chunk, (offset, alive) in chunks.items():
            head = chunk.rpartition(b"/")[0]
            if alive and offset > found.get(head, (-1, None))[0]:
                if len(orphans[head]) < MAX_CHUNKS:
                    orphans[head].append(chunk)
        return found, orphans

    def _scan(self, reader: typing.Any, tp: typing.Any, start: int, stop: int | None,
              keys: set[bytes], all_keys: set[bytes], chunks: dict, floor: int = 0) -> dict:
        """Last record (offset, value) of each of `keys` in offsets [start, stop) (stop None: to
        the end); notes in `chunks` the latest record of each chunk key of `all_keys`."""
        reader.seek(tp, start)
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        deadline = time.monotonic() + self.timeout
        progress = time.monotonic()
        while time.monotonic() < deadline:
            # Short polls: the scan ends at the first fetch that shows the end (an empty or
            # fully read partition), not when a longer poll gives up waiting for records
            # (restoring two fresh partitions: ~45 ms).
            batch = reader.poll(timeout_ms=20, max_records=10_000).get(tp, [])
            if batch:
                progress = time.monotonic()
                deadline = progress + self.timeout
            for record in batch:
                if stop is not None and record.offset >= stop:
                    return latest
                key = record.key
                if key in keys:
                    latest[key] = (record.offset, record.value)
                elif _chunk_of(key, all_keys) is not None:
                    seen = chunks.get(key)
                    if seen is None or seen[0] < record.offset:
                        chunks[key] = (record.offset, record.value is not None)
            position = reader.position(tp)
            if stop is not None and position >= stop:
                return latest
            highwater = reader.highwater(tp)
            # The highwater mark may be the previous load's (no fetch of this one answered yet):
            # the end is reached only at or past this load's end offset too (`floor`, a lower
            # bound on every broker), or a restore could find no checkpoint and start afresh.
            if (not batch and highwater is not None and position >= highwater
                    and position >= floor):
                return latest
            if not batch and self.transactional and highwater is not None:
                # read_committed: the readable end is the last stable offset, short of the
                # highwater mark while a transaction is open on the partition (a commit in
                # progress, a crashed producer's until its timeout); end_offsets gives it.
                # Offsets below it that are transaction markers or aborted records are never
                # delivered, and librdkafka does not always move the position past them (a
                # restore waited 60 s at the end of a log of committed transactions): quiet
                # for READ_COMMITTED_QUIET_S, the scan has what can be read. Ending early can
                # only miss a checkpoint newer than the committed offset's, which the worker
                # reads again (`Worker._load_committed_checkpoints`).
                if (position >= reader.end_offsets([tp])[tp]
                        or time.monotonic() - progress > READ_COMMITTED_QUIET_S):
                    return latest
        raise CheckpointError(f"reading checkpoints from {tp.topic}/{tp.partition}: no record "
                              f"came in {self.timeout} s before its end")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._own_producer:
            self.producer.close()
