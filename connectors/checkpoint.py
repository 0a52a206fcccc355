"""Checkpoints of per-partition state on a compacted Kafka topic, and safe state of River objects.

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

River objects (drift detectors, `StandardScaler`) are saved by `object_to_state` as a tree of
JSON values and numpy arrays. `object_from_state` recreates only containers, numbers, strings,
numpy arrays and the classes of River's drift detectors, statistics and `StandardScaler`
(`_ALLOWED_MODULES`), with `cls.__new__` plus their saved attributes: no constructor or arbitrary
callable is run (unlike pickle).
"""

from __future__ import annotations

import collections
import copyreg
import importlib
import logging
import math
import random
import time
import typing

import numpy as np

from streammargin import state as state_module

__all__ = [
    "CheckpointStore",
    "checkpoint_key",
    "encode_checkpoint",
    "decode_checkpoint",
    "object_to_state",
    "object_from_state",
    "CHECKPOINT_FORMAT",
]

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "streammargin.checkpoint/1"

# Safe state of River objects ---------------------------------------------------------------------

_TAG = "__t__"
_NP_SCALARS = {"float64", "float32", "int64", "int32", "bool"}
_FACTORIES = {"float": float, "int": int, "list": list}
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


# Only what a task's checkpoint holds: River's drift detectors, the statistics they keep, and the
# StandardScaler. A checkpoint naming any other class is refused.
_ALLOWED_MODULES = (
    "river.drift",
    "river.stats",
    "river._river_rust.drift",
    "river._river_rust.stats",
    "river.preprocessing.scale",
)


def _allowed_module(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in _ALLOWED_MODULES)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve_class(path: typing.Any) -> type:
    if not isinstance(path, str) or ":" not in path:
        raise state_module.StateError(f"bad class reference {path!r}")
    module_name, _, qualname = path.partition(":")
    if not _allowed_module(module_name):
        raise state_module.StateError(
            f"refusing to restore {path!r}: only River classes are allowed (drift detectors, their"
            " statistics, StandardScaler)"
        )
    obj: typing.Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        if part.startswith("__"):
            raise state_module.StateError(f"bad class reference {path!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise state_module.StateError(f"{path!r} is not a class")
    return obj


class _Encoder:
    def __init__(self) -> None:
        self.memo: dict[int, int] = {}  # id(object) -> reference number
        self.keep: list[typing.Any] = []  # keeps memoised objects alive while encoding

    def encode(self, node: typing.Any) -> typing.Any:
        kind = type(node)
        if node is None or kind is bool or kind is int or kind is str:
            return node
        if kind is float:
            if math.isfinite(node):
                return node
            return {_TAG: "float", "v": repr(node)}
        if kind is list:
            return [self.encode(item) for item in node]
        if kind is tuple:
            return {_TAG: "tuple", "v": [self.encode(item) for item in node]}
        if kind is dict:
            return {_TAG: "dict", **self._items(node)}
        if kind is collections.Counter:
            return {_TAG: "Counter", **self._items(node)}
        if kind is collections.OrderedDict:
            return {_TAG: "OrderedDict", **self._items(node)}
        if kind is collections.defaultdict:
            factory = next((n for n, f in _FACTORIES.items() if node.default_factory is f), None)
            if factory is None:
                raise TypeError(f"defaultdict of {node.default_factory!r} has no safe state")
            return {_TAG: "defaultdict", "factory": factory, **self._items(node)}
        if kind is collections.deque:
            return {_TAG: "deque", "v": [self.encode(item) for item in node], "maxlen": node.maxlen}
        if kind is bytes:
            return {_TAG: "bytes", "v": np.frombuffer(node, dtype=np.uint8).copy()}
        if kind is np.ndarray:
            return node
        if isinstance(node, np.generic) and node.dtype.name in _NP_SCALARS:
            value = node.item()
            if isinstance(value, float) and not math.isfinite(value):
                value = repr(value)
            return {_TAG: "np", "dtype": node.dtype.name, "v": value}
        if kind is random.Random:
            return {_TAG: "Random", "v": self.encode(node.getstate())}
        if kind.__name__ == "method" and hasattr(node, "__self__"):
            owner = id(node.__self__)
            if owner not in self.memo:
                raise TypeError(f"bound method {node!r} of an object outside the state")
            return {_TAG: "method", "self": self.memo[owner], "name": node.__func__.__name__}
        if _allowed_module(kind.__module__):
            return self._object(node)
        raise TypeError(f"{kind.__module__}.{kind.__qualname__} {node!r:.60} has no safe state")

    def _items(self, mapping: typing.Mapping) -> dict:
        return {
            "k": [self.encode(key) for key in mapping],
            "v": [self.encode(value) for value in mapping.values()],
        }

    def _object(self, obj: typing.Any) -> dict:
        if id(obj) in self.memo:
            return {_TAG: "ref", "v": self.memo[id(obj)]}
        reduced = obj.__reduce_ex__(4)
        if reduced[0] is not copyreg.__newobj__ or any(part is not None for part in reduced[3:]):
            raise TypeError(f"{type(obj).__qualname__} does not reduce to __new__ + state")
        cls, *args = reduced[1]
        ref = self.memo[id(obj)] = len(self.memo)
        self.keep.append(obj)
        return {
            _TAG: "object",
            "ref": ref,
            "class": _class_path(cls),
            "args": [self.encode(arg) for arg in args],
            "state": self.encode(reduced[2]),
        }


class _Decoder:
    def __init__(self) -> None:
        self.memo: dict[int, typing.Any] = {}

    def decode(self, node: typing.Any) -> typing.Any:
        if node is None or isinstance(node, (bool, int, float, str, np.ndarray)):
            return node
        if isinstance(node, list):
            return [self.decode(item) for item in node]
        if not isinstance(node, dict):
            raise state_module.StateError(f"unexpected node {node!r:.60}")
        tag = node.get(_TAG)
        if tag == "float":
            return _NON_FINITE[node["v"]] if node["v"] in _NON_FINITE else float(node["v"])
        if tag == "tuple":
            return tuple(self.decode(item) for item in node["v"])
        if tag == "dict":
            return dict(self._items(node))
        if tag == "Counter":
            return collections.Counter(dict(self._items(node)))
        if tag == "OrderedDict":
            return collections.OrderedDict(self._items(node))
        if tag == "defaultdict":
            factory = _FACTORIES.get(node.get("factory"))
            if factory is None:
                raise state_module.StateError(f"defaultdict factory {node.get('factory')!r}")
            return collections.defaultdict(factory, self._items(node))
        if tag == "deque":
            maxlen = node.get("maxlen")
            if maxlen is not None and (not isinstance(maxlen, int) or maxlen < 0):
                raise state_module.StateError(f"bad deque maxlen {maxlen!r}")
            return collections.deque((self.decode(i) for i in node["v"]), maxlen=maxlen)
        if tag == "bytes":
            array = node["v"]
            if not isinstance(array, np.ndarray) or array.dtype != np.uint8:
                raise state_module.StateError("bytes must be a uint8 array")
            return array.tobytes()
        if tag == "np":
            if node.get("dtype") not in _NP_SCALARS:
                raise state_module.StateError(f"numpy scalar dtype {node.get('dtype')!r}")
            value = node["v"]
            value = _NON_FINITE.get(value, value) if isinstance(value, str) else value
            return np.dtype(node["dtype"]).type(value)
        if tag == "Random":
            rng = random.Random()
            rng.setstate(self.decode(node["v"]))
            return rng
        if tag == "object":
            cls = _resolve_class(node["class"])
            args = [self.decode(arg) for arg in node["args"]]
            obj = cls.__new__(cls, *args)
            self.memo[node["ref"]] = obj  # before the state: it may refer to obj (methods)
            saved = self.decode(node["state"])
            if isinstance(saved, dict):
                obj.__dict__.update(saved)
            elif saved is not None:
                setstate = getattr(obj, "__setstate__", None)
                if setstate is None:
                    raise state_module.StateError(
                        f"{node['class']} cannot take state {saved!r:.40}"
                    )
                setstate(saved)
            return obj
        if tag == "ref":
            return self._ref(node["v"])
        if tag == "method":
            name = node["name"]
            if not isinstance(name, str) or name.startswith("__"):
                raise state_module.StateError(f"bad method name {name!r}")
            return getattr(self._ref(node["self"]), name)
        raise state_module.StateError(f"unknown node tag {tag!r}")

    def _ref(self, ref: typing.Any) -> typing.Any:
        try:
            return self.memo[ref]
        except (KeyError, TypeError):
            raise state_module.StateError(f"reference {ref!r} to an unknown object") from None

    def _items(self, node: dict) -> typing.Iterator[tuple]:
        keys, values = node["k"], node["v"]
        if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
            raise state_module.StateError("mapping keys and values do not match")
        return zip([self.decode(k) for k in keys], [self.decode(v) for v in values])


def object_to_state(obj: typing.Any) -> typing.Any:
    """A River object (drift detector, scaler, ...) as JSON values and numpy arrays.

    Raises `TypeError` for anything outside what `object_from_state` may rebuild.

    >>> from river import drift
    >>> detector = drift.ADWIN()
    >>> for i in range(300):
    ...     _ = detector.update(float(i % 3 == 0))
    >>> saved = state_module.dumps({"detector": object_to_state(detector)})
    >>> twin = object_from_state(state_module.loads(saved)["detector"])
    >>> (twin.width, twin.estimation) == (detector.width, detector.estimation)
    True
    """
    return _Encoder().encode(obj)


def object_from_state(tree: typing.Any) -> typing.Any:
    """Rebuild an object saved by `object_to_state`; only the River classes of `_ALLOWED_MODULES`
    are instantiated."""
    try:
        return _Decoder().decode(tree)
    except state_module.StateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, ImportError) as error:
        raise state_module.StateError(f"unreadable object state: {error!r}") from None


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
