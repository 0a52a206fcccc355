"""The records of the checkpoint topic: their keys, framing and checks.

A checkpoint (`connectors/state/checkpoint.py`, `CheckpointStore`) is a head record under its
partition's key, holding the payload or a manifest of chunk records. Everything here reads
untrusted bytes: `read_head` and `ChunkAssembler` check each claim before anything is allocated
or trusted, and raise `StateError` with the reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import struct
import typing

from streammargin import state as state_module

# /2: explicit detector and scaler state (no object graph), pending labels with sizes.
# /3: per-class metrics (macro F1), multiclass pending labels.
CHECKPOINT_FORMAT = "streammargin.checkpoint/3"

# Checkpoint records -------------------------------------------------------------------------------
#
# What goes on the checkpoint topic. Every record value starts with `_MAGIC`, a format version and
# a kind byte; integers are big-endian.
#
#   head record, key group/topic/partition: the commit point of a checkpoint, one of
#     inline   "S": previous generation u64, previous chunk count u32, SHA-256 of the payload,
#                   then the payload (a checkpoint of at most chunk_bytes)
#     manifest "M": generation u64, previous generation u64, previous chunk count u32, payload
#                   size u64, chunk size u32, chunk count u32, SHA-256 of the payload, then the
#                   offset of each chunk record (i64 each, strictly increasing, all before the
#                   manifest's own offset)
#   chunk record "C", key group/topic/partition/<generation as 16 hex digits>:<index>:
#                   generation u64, index u32, chunk count u32, then the payload's bytes
#                   [index * chunk size, (index + 1) * chunk size)
#     segmented "G": segment count u32, then per segment: its id u64, generation u64, size u64,
#                   chunk size u32, chunk count u32, SHA-256, the offset of each chunk record
#                   (i64 each); dropped count u32, then per dropped generation: its number u64
#                   and chunk count u32; then a whole inline or manifest head record
#   chunk record "C", key group/topic/partition/<generation as 16 hex digits>:<index>:
#                   generation u64, index u32, chunk count u32, then the payload's (or a
#                   segment's) bytes [index * chunk size, (index + 1) * chunk size)
#   tombstone: a null value under a chunk key (a superseded generation's chunk), or under a head
#     key (the partition's checkpoint is deleted: it starts afresh)
#
# "previous" names the chunked generation the head replaced, so that the next checkpoint deletes
# its chunks again in case the process died between a manifest and its tombstones; "dropped"
# does the same for the segments it no longer lists.
#
# A segment is a part of a checkpoint that outlives it: written once, in chunk records of its own
# generation, and listed by every later head until one drops it. What changes little between two
# checkpoints (the predictions served to the events still waiting for their label) is written
# once instead of with every checkpoint: a checkpoint's bytes are what changed.

# Kafka's default message.max.bytes is about 1 MB: half a MiB per record leaves room for the key,
# the framing and the record batch.
DEFAULT_CHUNK_BYTES = 512 << 10
DEFAULT_MAX_CHECKPOINT_BYTES = 1 << 30
MIN_CHUNK_BYTES = 1 << 10
# At most this many chunks per checkpoint (a manifest of 512 KiB; 32 GiB of 512 KiB chunks).
MAX_CHUNKS = 1 << 16
# A read_committed scan with nothing delivered for this long has what can be read (`_scan`).
READ_COMMITTED_QUIET_S = 1.0
# Room a record needs beyond its chunk of payload: the key, the framing, record and batch headers.
RECORD_HEADROOM = 4 << 10

_MAGIC = b"SMCK"
_VERSION = 1
_INLINE, _CHUNK, _MANIFEST, _SEGMENTED = b"S", b"C", b"M", b"G"
_PREFIX = struct.Struct(">4sBc")
_INLINE_HEAD = struct.Struct(">4sBcQI32s")
_CHUNK_HEAD = struct.Struct(">4sBcQII")
_MANIFEST_HEAD = struct.Struct(">4sBcQQIQII32s")
_OFFSET = struct.Struct(">q")
_COUNT = struct.Struct(">I")
_SEGMENT = struct.Struct(">QQQII32s")
_DROPPED = struct.Struct(">QI")
# At most this many segments per checkpoint, and dropped generations per head (the pending
# store's segments are far fewer: `connectors.task.pending_labels.MAX_SEGMENTS`).
MAX_SEGMENTS = 1 << 12
_CHUNK_TAIL = re.compile(rb"[0-9a-f]{16}:(0|[1-9][0-9]{0,9})")
_U32 = (1 << 32) - 1


def checkpoint_key(group_id: str, topic: str, partition: int) -> bytes:
    """The key of a partition's checkpoints (its head records): `group/topic/partition`."""
    return f"{group_id}/{topic}/{partition}".encode()


def chunk_key(head_key: bytes, generation: int, index: int) -> bytes:
    """The key of chunk `index` of a generation: `group/topic/partition/<generation>:<index>`.

    Its last part is not an integer, so a chunk key is never the head key of another partition.
    """
    return b"%s/%016x:%d" % (head_key, generation, index)


def encode_checkpoint(fields: dict) -> bytes:
    """Checkpoint bytes (`streammargin.state.dumps` format) of a dict of JSON values and arrays."""
    return state_module.dumps({"format": CHECKPOINT_FORMAT, **fields})


def decode_checkpoint(data: bytes) -> dict:
    """Read checkpoint bytes back; never executes code. Raises `StateError` when unreadable."""
    fields = state_module.loads(data)
    found = fields.get("format")
    if found != CHECKPOINT_FORMAT:
        raise state_module.StateError(
            f"checkpoint format {str(found)[:40]!r}, this worker reads {CHECKPOINT_FORMAT!r}"
        )
    return fields


@dataclasses.dataclass(frozen=True)
class Generation:
    """The chunk records of one chunked checkpoint: `chunks` keys under a random `number`."""

    number: int
    chunks: int

    def keys(self, head_key: bytes) -> list[bytes]:
        return [chunk_key(head_key, self.number, i) for i in range(self.chunks)]


@dataclasses.dataclass(frozen=True)
class Inline:
    """A head record that holds its whole checkpoint."""

    payload: bytes
    previous: Generation | None


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A head record that lists the chunk records of its checkpoint."""

    generation: int
    total_bytes: int
    chunk_bytes: int
    offsets: tuple[int, ...]
    sha256: bytes
    previous: Generation | None

    @property
    def count(self) -> int:
        return len(self.offsets)

    def chunk_size(self, index: int) -> int:
        return min(self.chunk_bytes, self.total_bytes - index * self.chunk_bytes)


@dataclasses.dataclass(frozen=True)
class Segment:
    """A part of a checkpoint that outlives it (see "Checkpoint records"): `id` is its writer's
    name for it, `chunks` its chunk records (`previous` None)."""

    id: int
    chunks: Manifest

    @property
    def generation(self) -> Generation:
        return Generation(self.chunks.generation, self.chunks.count)


@dataclasses.dataclass(frozen=True)
class Segmented:
    """A head record with segments: the checkpoint's own head, the segments it lists, and the
    generations of those it dropped (their chunks get tombstones again)."""

    head: Inline | Manifest
    segments: tuple[Segment, ...]
    dropped: tuple[Generation, ...]

    @property
    def previous(self) -> Generation | None:
        return self.head.previous


def frame_segmented(head: bytes, segments: typing.Sequence[Segment],
                    dropped: typing.Sequence[Generation] = ()) -> bytes:
    """The head record of a checkpoint with segments, around `head` (an inline or a manifest
    head record)."""
    parts = [_PREFIX.pack(_MAGIC, _VERSION, _SEGMENTED), _COUNT.pack(len(segments))]
    for segment in segments:
        chunks = segment.chunks
        parts.append(_SEGMENT.pack(segment.id, chunks.generation, chunks.total_bytes,
                                   chunks.chunk_bytes, chunks.count, chunks.sha256))
        parts.extend(_OFFSET.pack(offset) for offset in chunks.offsets)
    parts.append(_COUNT.pack(len(dropped)))
    parts.extend(_DROPPED.pack(g.number, g.chunks) for g in dropped)
    parts.append(head)
    return b"".join(parts)


def _previous_fields(previous: Generation | None) -> tuple[int, int]:
    return (0, 0) if previous is None else (previous.number, previous.chunks)


def frame_inline(payload: bytes, previous: Generation | None = None) -> bytes:
    """The head record of a checkpoint small enough for one record."""
    head = _INLINE_HEAD.pack(
        _MAGIC, _VERSION, _INLINE, *_previous_fields(previous), hashlib.sha256(payload).digest()
    )
    return head + payload


def frame_chunk(generation: int, index: int, count: int, data: typing.Any) -> bytes:
    """Chunk record `index` of `count` of a generation; `data` is its slice of the payload."""
    return b"".join((_CHUNK_HEAD.pack(_MAGIC, _VERSION, _CHUNK, generation, index, count), data))


def frame_manifest(manifest: Manifest) -> bytes:
    """The head record of a chunked checkpoint."""
    head = _MANIFEST_HEAD.pack(
        _MAGIC, _VERSION, _MANIFEST, manifest.generation, *_previous_fields(manifest.previous),
        manifest.total_bytes, manifest.chunk_bytes, manifest.count, manifest.sha256,
    )
    return head + b"".join(_OFFSET.pack(offset) for offset in manifest.offsets)


def _refuse(reason: str) -> typing.NoReturn:
    raise state_module.StateError(reason)


def _kind(value: typing.Any) -> bytes:
    if not isinstance(value, bytes):
        _refuse("null value" if value is None else f"value of type {type(value).__name__}")
    if len(value) < _PREFIX.size:
        _refuse(f"not a checkpoint record ({len(value)} bytes)")
    magic, version, kind = _PREFIX.unpack_from(value)
    if magic != _MAGIC:
        if value.startswith(state_module.MAGIC):
            _refuse("an unframed checkpoint of a version before chunked checkpoints: use another"
                    " group id, or write a null record under its key to start afresh")
        _refuse("not a checkpoint record (bad magic)")
    if version != _VERSION:
        _refuse(f"checkpoint record format {version}, this version reads {_VERSION}")
    return kind


def _previous(number: int, chunks: int) -> Generation | None:
    if (number == 0) != (chunks == 0) or chunks > MAX_CHUNKS:
        _refuse(f"bad previous generation {number:#x} of {chunks} chunks")
    return None if number == 0 else Generation(number, chunks)


def read_head(value: typing.Any, offset: int,
              max_checkpoint_bytes: int) -> Inline | Manifest | Segmented:
    """The head record at `offset` of a checkpoint key, checked for everything it can claim.

    Raises `StateError` with the reason when it is not a well-formed head record, when it claims
    more than `max_checkpoint_bytes` (its segments included), or when its chunk offsets cannot
    be those of its chunks (not strictly increasing, negative, or not before the manifest
    itself). Nothing is allocated on a claim: a manifest's size is only checked here.
    """
    kind = _kind(value)
    if kind == _SEGMENTED:
        return _read_segmented(memoryview(value), offset, max_checkpoint_bytes)
    if kind == _INLINE:
        if len(value) < _INLINE_HEAD.size:
            _refuse("truncated inline checkpoint")
        *_, prev_number, prev_chunks, digest = _INLINE_HEAD.unpack_from(value)
        previous = _previous(prev_number, prev_chunks)
        size = len(value) - _INLINE_HEAD.size
        if size > max_checkpoint_bytes:
            _refuse(f"{size} bytes, above max_checkpoint_bytes={max_checkpoint_bytes}")
        payload = value[_INLINE_HEAD.size:]
        if hashlib.sha256(payload).digest() != digest:
            _refuse("SHA-256 of the inline checkpoint does not match")
        return Inline(payload, previous)
    if kind != _MANIFEST:
        _refuse(f"a record of kind {kind!r} under the checkpoint key, not a manifest")
    if len(value) < _MANIFEST_HEAD.size:
        _refuse("truncated manifest")
    (_, _, _, generation, prev_number, prev_chunks, total, chunk_bytes, count,
     digest) = _MANIFEST_HEAD.unpack_from(value)
    previous = _previous(prev_number, prev_chunks)
    if len(value) != _MANIFEST_HEAD.size + _OFFSET.size * count:
        _refuse(f"manifest of {count} chunks is {len(value)} bytes long")
    return _chunks(generation, total, chunk_bytes, count, digest, previous,
                   memoryview(value)[_MANIFEST_HEAD.size:], offset, max_checkpoint_bytes,
                   "manifest")


def _chunks(generation: int, total: int, chunk_bytes: int, count: int, digest: bytes,
            previous: Generation | None, offsets_bytes: memoryview, offset: int,
            max_checkpoint_bytes: int, what: str) -> Manifest:
    """The chunk records a manifest or a segment claims (`offsets_bytes`: exactly theirs)."""
    if generation == 0:
        _refuse(f"{what} of generation 0")
    if total > max_checkpoint_bytes:
        _refuse(f"{what} claims {total} bytes, above max_checkpoint_bytes={max_checkpoint_bytes}")
    if total == 0 or chunk_bytes == 0:
        _refuse(f"{what} of {total} bytes in chunks of {chunk_bytes}")
    if count > MAX_CHUNKS or count != -(-total // chunk_bytes):
        _refuse(f"{what} of {total} bytes in chunks of {chunk_bytes} lists {count} chunks")
    offsets = tuple(o for (o,) in _OFFSET.iter_unpack(offsets_bytes))
    if offsets[0] < 0 or any(a >= b for a, b in zip(offsets, offsets[1:])):
        _refuse("chunk offsets are not strictly increasing from 0 or more")
    if offsets[-1] >= offset:
        _refuse(f"chunk offset {offsets[-1]} is not before the head record at {offset}")
    return Manifest(generation, total, chunk_bytes, offsets, digest, previous)


def _read_segmented(value: memoryview, offset: int, max_checkpoint_bytes: int) -> Segmented:
    at = _PREFIX.size

    def take(size: int, what: str) -> memoryview:
        nonlocal at
        if len(value) - at < size:
            _refuse(f"segmented head record truncated in {what}")
        at += size
        return value[at - size:at]

    (count,) = _COUNT.unpack(take(_COUNT.size, "the segment count"))
    if count > MAX_SEGMENTS:
        _refuse(f"{count} segments, above {MAX_SEGMENTS}")
    segments, ids, claimed = [], set(), 0
    for i in range(count):
        (segment_id, generation, total, chunk_bytes, chunks,
         digest) = _SEGMENT.unpack(take(_SEGMENT.size, f"segment {i}"))
        if chunks > MAX_CHUNKS:
            _refuse(f"segment {i} lists {chunks} chunks, above {MAX_CHUNKS}")
        offsets = take(_OFFSET.size * chunks, f"segment {i}'s chunk offsets")
        claimed += total
        segments.append(Segment(segment_id, _chunks(
            generation, total, chunk_bytes, chunks, digest, None, offsets, offset,
            max_checkpoint_bytes - claimed + total, f"segment {i}")))
        ids.add(segment_id)
    if len(ids) != count or len({s.chunks.generation for s in segments}) != count:
        _refuse("a segment id or generation is listed twice")
    (count,) = _COUNT.unpack(take(_COUNT.size, "the dropped count"))
    if count > MAX_SEGMENTS:
        _refuse(f"{count} dropped segments, above {MAX_SEGMENTS}")
    dropped = []
    for i in range(count):
        number, chunks = _DROPPED.unpack(take(_DROPPED.size, f"dropped segment {i}"))
        if number == 0 or chunks == 0 or chunks > MAX_CHUNKS:
            _refuse(f"bad dropped generation {number:#x} of {chunks} chunks")
        dropped.append(Generation(number, chunks))
    rest = bytes(value[at:])
    if len(rest) >= _PREFIX.size and rest[_PREFIX.size - 1:_PREFIX.size] == _SEGMENTED:
        _refuse("a segmented head record inside another")
    head = read_head(rest, offset, max_checkpoint_bytes - claimed)
    assert not isinstance(head, Segmented)
    return Segmented(head, tuple(segments), tuple(dropped))


class ChunkAssembler:
    """Checks the chunk records of a manifest, in order, and joins them into the payload.

    Memory grows with the chunks that passed their checks, never with what the manifest claims.

    >>> payload = bytes(range(256)) * 10
    >>> head_key = checkpoint_key("g", "events", 0)
    >>> chunks = [frame_chunk(7, i, 3, payload[i * 1024:(i + 1) * 1024]) for i in range(3)]
    >>> manifest = Manifest(7, len(payload), 1024, (10, 11, 12),
    ...                     hashlib.sha256(payload).digest(), None)
    >>> assembler = ChunkAssembler(head_key, manifest)
    >>> for i, value in enumerate(chunks):
    ...     assembler.add(10 + i, chunk_key(head_key, 7, i), value)
    >>> assembler.payload() == payload
    True
    """

    def __init__(self, head_key: bytes, manifest: Manifest):
        self.head_key = head_key
        self.manifest = manifest
        self.parts: list[memoryview] = []
        self.hash = hashlib.sha256()

    @property
    def next_index(self) -> int:
        return len(self.parts)

    def add(self, offset: int, key: typing.Any, value: typing.Any) -> None:
        """The record at the next chunk's offset; raises `StateError` unless it is that chunk."""
        manifest = self.manifest
        index = len(self.parts)
        where = f"chunk {index} at offset {offset}"
        if index >= manifest.count:
            _refuse(f"{where}: the manifest lists {manifest.count} chunks")
        if offset != manifest.offsets[index]:
            _refuse(f"{where}: the manifest puts it at {manifest.offsets[index]}")
        if key != chunk_key(self.head_key, manifest.generation, index):
            _refuse(f"{where} has the key {key!r:.80}")
        try:
            kind = _kind(value)
        except state_module.StateError as error:
            _refuse(f"{where}: {error}")
        if kind != _CHUNK or len(value) < _CHUNK_HEAD.size:
            _refuse(f"{where} is not a chunk record")
        *_, generation, got_index, count = _CHUNK_HEAD.unpack_from(value)
        if (generation, got_index, count) != (manifest.generation, index, manifest.count):
            _refuse(f"{where} says chunk {got_index} of {count} of generation {generation:#x}")
        size = len(value) - _CHUNK_HEAD.size
        if size != manifest.chunk_size(index):
            _refuse(f"{where} has {size} bytes, the manifest says {manifest.chunk_size(index)}")
        data = memoryview(value)[_CHUNK_HEAD.size:]
        self.hash.update(data)
        self.parts.append(data)

    def payload(self) -> bytes:
        """The checkpoint, once every chunk was added and the hash matches."""
        if len(self.parts) != self.manifest.count:
            _refuse(f"{len(self.parts)} of {self.manifest.count} chunks")
        if self.hash.digest() != self.manifest.sha256:
            _refuse("SHA-256 of the joined chunks does not match the manifest")
        payload = b"".join(self.parts)
        self.parts.clear()
        return payload


def _partition_of(key: bytes, n_partitions: int) -> int:
    """The partition Kafka's default partitioner (Java's and kafka-python's) gives a key."""
    from kafka.partitioner.default import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % n_partitions


def _chunk_of(key: typing.Any, head_keys: typing.Container[bytes]) -> bytes | None:
    """The head key whose chunk key `key` is, if it is one of `head_keys`."""
    if not isinstance(key, bytes):
        return None
    head, _, tail = key.rpartition(b"/")
    if head in head_keys and _CHUNK_TAIL.fullmatch(tail):
        return head
    return None
