"""`ModelFollower`: the models a group of workers learns, followed on the checkpoint topic and
kept decoded, fresh, in this process; what `streammargin serve` answers with, and a library of
its own (`predict`, thread-safe) for a Python service that needs no HTTP hop.

It reads the checkpoint topic with a consumer that is assigned its partitions and belongs to no
group (`CheckpointStore(read_only=True)`, read_committed: the checkpoints of exactly-once
workers appear when their transaction commits) and never writes: any number of followers can
follow one group, each on its own, and the workers never know. It follows the topic
(`CheckpointStore.follow`: each key's latest checkpoint once, then only the records written
since, a fetch at a time), so a checkpoint is served a fetch after it is written.

Each new checkpoint is decoded on the follower's thread, off the request path, into a
`ServedVersion` (`PartitionTask.restore`: the worker's own checks, so a corrupt or hostile
record is refused, logged once, and the previous version serves on), then a new
`ServingView` is swapped in by one reference assignment: a request never waits for a decode
and never sees half a model. The last `versions_kept` versions of each model stay addressable
by name.

Memory (docs/serving.md, "Sizing"): M models (partition scope: the input topics' partitions;
topic scope: the topics), each with at most `versions_kept` versions, plus one being decoded and
one just evicted that a request in flight may still hold: (M x versions_kept + 2) models and
scalers, each within its ceiling (`streammargin.memory.memory_bound`), and one checkpoint's
bytes being read (within --max-checkpoint-bytes).

Examples
--------

A follower of the workers of group `fraud` on topic `payments` (their options, the same names)::

    from connectors.serving import ModelFollower
    from connectors.worker.config import WorkerConfig

    follower = ModelFollower(WorkerConfig(topics=["payments"], group_id="fraud",
                                          bootstrap_servers="kafka:9092", features=("*",),
                                          label_field="is_fraud", scale=True))
    follower.start()
    follower.wait_ready(timeout=30)
    scored = follower.predict([{"amount": 31.2, "country": "BR"}], keys=[b"card-7"])
    scored.probabilities[0][1], scored.versions[0].version   # P(fraud), the checkpoint

(examples/serving_in_process.py runs one against a worker.)
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
import typing

from connectors.serializers import make_codec
from connectors.serving.models import (
    TOPIC_MODEL,
    Scored,
    Scorer,
    ServedVersion,
    ServingView,
    version_name,
)
from connectors.serving.partitioner import PARTITIONERS
from connectors.serving.protocol import Limits, RequestError, Rows
from connectors.state import checkpoint as checkpoint_module
from connectors.task import PartitionTask, SettingsMismatch
from streammargin.errors import StateError

__all__ = ["ModelFollower", "FollowerError", "DEFAULT_VERSIONS_KEPT"]

log = logging.getLogger("connectors.serving")

DEFAULT_VERSIONS_KEPT = 3
# The input topics' partition counts are read again this often (a topic that grows gets its new
# partitions' models).
METADATA_REFRESH_S = 30.0
# After a failure to read (no checkpoint topic yet, a broker outage), the follower tries again
# this long after.
RETRY_S = 1.0


class FollowerError(RuntimeError):
    """The follower cannot serve with these options (one line: the cause and the fix)."""


@dataclasses.dataclass
class FollowerCounters:
    loaded: int = 0  # checkpoints decoded and served
    refused: int = 0  # checkpoints refused (corrupt, hostile, of other settings)
    superseded: int = 0  # topic scope: checkpoints of one read left for a newer one
    read_failures: int = 0  # reads of the checkpoint topic that failed (outages)


class ModelFollower:
    """Follows the checkpoints of a group's workers and answers with their latest models.

    Parameters
    ----------
    config
        The workers' `WorkerConfig` (`streammargin kafka`'s options): connection and security,
        group, topics, checkpoint topic, field mapping, model, scope. What does not concern
        serving is not used.
    model_name
        The model's name in the protocol (default: the group id).
    versions_kept
        Versions of each model kept addressable (`/versions/{v}`), the newest included.
    max_model_age
        `readiness` says not ready once the newest checkpoint served is older than this many
        seconds (None: never for its age).
    partitioner
        How the topic's producers partition keyed records (`partitioner.PARTITIONERS`).
    limits
        What one request may hold.
    store
        A `CheckpointStore` to read with (tests); default: a read-only one of `config`'s.
    budget
        The server's `sizing.ServingBudget` (`--max-memory`): checkpoints above its
        `checkpoint` bytes are refused, and more models than its ceiling holds are said in one
        ERROR line (`overcommitted`). None: checkpoints up to `--max-checkpoint-bytes`.

    """

    def __init__(self, config: typing.Any, *, model_name: str | None = None,
                 versions_kept: int = DEFAULT_VERSIONS_KEPT, max_model_age: float | None = None,
                 partitioner: str = "murmur2", limits: Limits = Limits(),
                 store: typing.Any = None, budget: typing.Any = None):
        if config.codec != "json":
            raise FollowerError(
                f"--codec {config.codec} decodes the topic's records itself: streammargin serve "
                "scores records through the built-in codec's field mapping. Fix: serve a group "
                "whose workers run --codec json (the default) with --value-format and the "
                "field options")
        if type(versions_kept) is not int or versions_kept < 1:
            raise FollowerError(f"--versions-kept must be an integer >= 1, got {versions_kept!r}")
        if max_model_age is not None and not max_model_age > 0:
            raise FollowerError(f"--max-model-age must be > 0 seconds, got {max_model_age!r}")
        if partitioner not in PARTITIONERS:
            raise FollowerError(f"--key-partitioner must be one of {', '.join(PARTITIONERS)}, "
                                f"got {partitioner!r}")
        self.config = config
        self.settings = config.task_settings()
        self.model_name = model_name or config.group_id
        self.versions_kept = versions_kept
        self.max_model_age = max_model_age
        self.limits = limits
        # The records' JSON form through the workers' mapping, whatever the topic's format (an
        # Avro or Protobuf record's JSON maps to the same features).
        codec = make_codec("json", self.settings.field_mapping(), self.settings.max_record_bytes)
        self.scorer = Scorer(codec, limits)
        # Told of each version loaded, and of each version's first answer (the metrics).
        self.on_load: typing.Callable[[ServedVersion], None] | None = None
        self.on_first_answer: typing.Callable[[ServedVersion], None] | None = None
        self.view = ServingView.empty(config.model_scope, config.topics, partitioner)
        self.counters = FollowerCounters()
        self.error: str | None = None  # why it cannot serve (a SettingsMismatch, nothing served)
        self.started_at = time.time()
        self.last_read_at: float | None = None  # the last read of the checkpoint topic that worked
        self._store = store
        self.budget = budget
        self.overcommitted = False
        self._slots: dict[tuple[str, int], collections.deque] = {}
        self._partitions: dict[str, int] = {}
        self._partitions_read_at = -METADATA_REFRESH_S
        self._refused_at: dict[tuple[str, int], int] = {}
        self._outage: str | None = None
        self._stop = threading.Event()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None

    # Life cycle -------------------------------------------------------------------------------

    def start(self) -> ModelFollower:
        """Start following on a daemon thread of its own."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="streammargin-follower",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop following (the models stay served by whoever holds the follower)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._store is not None:
            try:
                self._store.close()
            except Exception as error:  # (a reader already gone)
                log.debug("closing the checkpoint reader: %s", error)

    def __enter__(self) -> ModelFollower:
        return self.start()

    def __exit__(self, *exc: typing.Any) -> None:
        self.close()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until a model is served (True), or `timeout` seconds (False); `FollowerError`
        if the checkpoints contradict the options."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ready:
            while not self.view.current and self.error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._ready.wait(left if left is not None else 1.0)
        if self.error is not None and not self.view.current:
            raise FollowerError(self.error)
        return True

    def readiness(self, now: float | None = None) -> tuple[bool, str]:
        """(ready, why): ready once a model is served, and while the newest checkpoint served is
        younger than `max_model_age`."""
        view = self.view
        newest = view.newest()
        if newest is None:
            if self.error is not None:
                return False, self.error
            return False, (f"no model loaded yet: no checkpoint of group {self.config.group_id!r} "
                           f"on {self.config.checkpoint_topic!r} for "
                           f"{', '.join(view.topics)} could be read")
        age = newest.age(now)
        if self.max_model_age is not None and age > self.max_model_age:
            return False, (f"the newest model is {age:.1f} s old, above --max-model-age "
                           f"{self.max_model_age:g}: are the workers and brokers up?")
        return True, f"serving {len(view.current)} models, the newest {age:.1f} s old"

    # Answers ----------------------------------------------------------------------------------

    def predict(self, records: typing.Sequence[typing.Any],
                keys: typing.Sequence[bytes | None] | None = None, topic: str | None = None,
                partition: int | None = None, version: str | None = None) -> Scored:
        """The label and probabilities of each record (a dict: the record's tree as its JSON
        decodes; or bytes/str: its JSON), scored as `streammargin serve` scores a request:
        `keys` route each to its partition's model, `version` pins a version kept. Thread-safe.
        `RequestError` for a record the worker would dead-letter (its reason) or when no model
        can answer yet."""
        trees = records_ = None
        if all(isinstance(r, dict) for r in records):
            trees = list(records)
        else:
            records_ = [r.encode() if isinstance(r, str) else bytes(r) for r in records]
        if len(records) > self.limits.max_records:
            raise RequestError(400, f"{len(records)} records, above the limit of "
                                    f"{self.limits.max_records}")
        rows = Rows(records_, trees, None if keys is None else list(keys), None, partition,
                    topic, [])
        return self.score(rows, self.pinned(version))

    def pinned(self, version: str | None) -> ServedVersion | None:
        """The version kept under that name (None for None); `RequestError` 404 if none is."""
        if version is None:
            return None
        found = self.view.versions.get(version)
        if found is None:
            kept = sorted(self.view.versions, key=lambda v: self.view.versions[v].loaded_at)
            raise RequestError(404, f"version {version[:60]!r} of {self.model_name} is not kept: "
                                    f"versions kept: {', '.join(kept[-20:]) or 'none yet'}")
        return found

    def score(self, rows: Rows, pinned: ServedVersion | None = None) -> Scored:
        """`Scorer.score` on the view served now."""
        scored = self.scorer.score(self.view, rows, pinned)
        for served in scored.versions:
            if served.first_answer_at is None:
                served.first_answer_at = time.time()
                if self.on_first_answer is not None:
                    self.on_first_answer(served)
        return scored

    # Following --------------------------------------------------------------------------------

    def _make_store(self) -> typing.Any:
        from connectors.worker.config import client_settings

        reader = dict(client_settings(self.config, "streammargin-serve")["checkpoint_reader"])
        servers = reader.pop("bootstrap_servers")
        # A fetch returns as soon as a record comes (fetch_min_bytes 1); the wait bounds how
        # often an idle follower asks. read_committed: exactly-once workers' checkpoints appear
        # once their transaction commits, never an aborted one.
        reader.update(isolation_level="read_committed", fetch_max_wait_ms=100)
        return checkpoint_module.CheckpointStore(
            servers, self.config.checkpoint_topic, self.config.group_id, read_only=True,
            reader_config=reader, max_checkpoint_bytes=(
                self.config.max_checkpoint_bytes if self.budget is None
                else self.budget.checkpoint))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._store is None:
                    self._store = self._make_store()
                keys = self._keys()
                if not keys:
                    self._outage_begins("waiting for the input topics "
                                        f"{', '.join(self.config.topics)} to exist")
                    self._stop.wait(RETRY_S)
                    continue
                found = self._store.follow(keys)
            except Exception as error:  # CheckpointError, KafkaError: an outage, or no topic yet
                self.counters.read_failures += 1
                self._outage_begins(f"cannot read {self.config.checkpoint_topic!r} ({error})")
                self._stop.wait(RETRY_S)
                continue
            self.last_read_at = time.time()
            if self._outage is not None:
                log.info("reading %s again: serving goes on with its checkpoints",
                         self.config.checkpoint_topic)
                self._outage = None
            if found:
                self._take(found)

    def _outage_begins(self, why: str) -> None:
        if self._outage is None:
            log.warning("%s; %s, and the follower tries again every %g s", why,
                        "the models loaded keep serving" if self.view.current
                        else "no model is served until a checkpoint is read", RETRY_S)
        self._outage = why

    def _keys(self) -> list[tuple[str, int]]:
        now = time.monotonic()
        if now - self._partitions_read_at >= METADATA_REFRESH_S or not self._partitions:
            counts = {}
            for topic in self.config.topics:
                numbers = self._store.partitions_of(topic)
                if numbers:
                    counts[topic] = max(numbers) + 1
            self._partitions = counts
            self._partitions_read_at = now
            self._check_budget()
        return [(topic, p) for topic, count in self._partitions.items() for p in range(count)]

    def models(self) -> int:
        """How many models this server serves once every partition has a checkpoint."""
        if self.config.model_scope == "topic":
            return len(self.config.topics)
        return max(1, sum(self._partitions.values()))

    def _check_budget(self) -> None:
        if self.budget is None:
            return
        n = self.models()
        over = self.budget.overcommitted(n)
        if over and not self.overcommitted:
            from connectors.worker.memory_budget import format_size

            log.error("%d models of %d versions each take more than --max-memory %s: %s. Fix: "
                      "raise --max-memory to %s, or lower --versions-kept", n,
                      self.versions_kept, format_size(self.budget.max_memory),
                      self.budget.describe(n), format_size(self.budget.total(n)))
        self.overcommitted = over

    def _take(self, found: dict) -> None:
        """Decode the checkpoints read and swap a new view in."""
        items = sorted(found.items(), key=lambda item: (item[1].partition, item[1].offset))
        if self.config.model_scope == "topic":
            # One model per topic: the newest checkpoint read of each (a worker's round writes
            # every partition's, all holding its one model).
            newest: dict[str, tuple] = {}
            for key, loaded in items:
                if isinstance(loaded, checkpoint_module.LoadedCheckpoint):
                    if key[0] in newest:
                        self.counters.superseded += 1
                        if not _written_after(loaded, newest[key[0]][1]):
                            continue
                    newest[key[0]] = (key, loaded)
            items = [item for item in items
                     if not isinstance(item[1], checkpoint_module.LoadedCheckpoint)]
            items += list(newest.values())
        changed = False
        for (topic, partition), loaded in items:
            if isinstance(loaded, checkpoint_module.RefusedCheckpoint):
                self._refuse((topic, partition), loaded.offset, loaded.reason, False)
                continue
            served = self._decode(topic, partition, loaded)
            if served is None:
                continue
            slot = (topic, TOPIC_MODEL if self.config.model_scope == "topic" else partition)
            versions = self._slots.setdefault(slot, collections.deque(maxlen=self.versions_kept))
            if versions and versions[-1].version == served.version:
                continue
            versions.append(served)
            self.counters.loaded += 1
            if self.on_load is not None:
                self.on_load(served)
            changed = True
            log.debug("serving %s/%d version %s (written %.3f s ago)", topic, partition,
                      served.version, served.loaded_at - served.written_at)
        if changed:
            self._swap()

    def _decode(self, topic: str, partition: int,
                loaded: checkpoint_module.LoadedCheckpoint) -> ServedVersion | None:
        try:
            task = PartitionTask.restore(loaded.payload, topic, partition, self.settings,
                                         codec=self.scorer.codec, segments=loaded.segments)
            written_at = _written_at(loaded.payload)
        except StateError as error:
            self._refuse((topic, partition), loaded.offset, str(error),
                         isinstance(error, SettingsMismatch))
            return None
        labelled = task.metrics.n_labelled
        # What answers is the model and the scaler: the pending labels and the metrics go.
        task.pending = None
        task.metrics = None
        now = time.time()
        return ServedVersion(
            version=version_name(loaded.partition, loaded.offset), topic=topic,
            partition=partition, task=task, checkpoint_offset=loaded.offset,
            checkpoint_bytes=len(loaded.payload), written_at=written_at or now, loaded_at=now,
            next_offset=task.next_offset, labelled=labelled)

    def _refuse(self, key: tuple[str, int], offset: int, reason: str, mismatch: bool) -> None:
        if self._refused_at.get(key) == offset:
            return
        self._refused_at[key] = offset
        self.counters.refused += 1
        where = f"{self.config.checkpoint_topic}@{offset} ({key[0]}/{key[1]})"
        if mismatch:
            text = (f"the checkpoint at {where} contradicts the options: {reason}. Fix: give "
                    "streammargin serve the workers' own options (the same command line or "
                    "STREAMMARGIN_* variables)")
            if not self.view.current:
                self.error = text
                with self._ready:
                    self._ready.notify_all()
            log.error("%s; it is refused%s", text,
                      "" if not self.view.current else ", and the previous version serves on")
            return
        log.warning("the checkpoint at %s is refused: %s; %s", where, reason,
                    "the previous version serves on" if self._slots.get(key) or (
                        self.view.current) else "no model of it is served yet")

    def _swap(self) -> None:
        current = {slot: versions[-1] for slot, versions in self._slots.items()}
        kept = {v.version: v for versions in self._slots.values() for v in versions}
        unkeyed = {}
        for topic in self.config.topics:
            mine = [v for (t, _), v in current.items() if t == topic]
            if mine:
                unkeyed[topic] = max(mine, key=lambda v: (v.labelled, -v.partition))
        self.view = ServingView(self.config.model_scope, tuple(self.config.topics),
                                self.view.partitioner, current, kept, unkeyed,
                                dict(self._partitions))
        with self._ready:
            self._ready.notify_all()


def _written_after(checkpoint: checkpoint_module.LoadedCheckpoint,
                   other: checkpoint_module.LoadedCheckpoint) -> bool:
    """Whether `checkpoint` was written after `other`: its offset is later on the same partition
    of the checkpoint topic; across partitions (a checkpoint topic of several) offsets say
    nothing, and the workers' `written_at` does (where both say it; else the later partition,
    as before)."""
    if checkpoint.partition == other.partition:
        return checkpoint.offset > other.offset
    mine, theirs = _written_at(checkpoint.payload), _written_at(other.payload)
    if mine is None or theirs is None:
        return checkpoint.partition > other.partition
    return mine > theirs


def _written_at(payload: bytes) -> float | None:
    """When the worker wrote a checkpoint (its `written_at`, Unix time), if it says so sanely."""
    from streammargin import state as state_module

    try:
        value = state_module.peek(payload).get("written_at")
    except StateError:
        return None
    if type(value) in (int, float) and 0 < value < 1e11:
        return float(value)
    return None
