"""Operating the Kafka worker: its status, Prometheus metrics, probes and JSON log lines.

- `WorkerStatus`: what the worker's main loop tells the outside world. The worker calls its hooks
  at cheap points (after each `PartitionTask.process` call, each loop turn, each checkpoint round,
  restore and rebalance), never per record; `loop_turned` publishes an immutable `Snapshot` at
  most every `publish_interval` seconds (and at once after a restore, a revocation or the exit),
  so a scrape reads one consistent set of numbers without ever locking the main loop.
- `EndpointServer`: a daemon thread serving ``/metrics`` (Prometheus text exposition, or
  OpenMetrics when asked for, by `prometheus-client`), ``/healthz`` (liveness: the main loop
  turned within `liveness_timeout` seconds) and ``/readyz`` (readiness: a member of the group with
  every assigned partition restored).
- `JsonLogFormatter`: one JSON object per log line (time, level, logger, message and the
  record's structured fields, such as topic, partition and offset).
- `dead_letter_kind`: the bounded set of reasons (`DEAD_LETTER_KINDS`) that label dead-letter
  counts; the reason text itself is free text and never a label.
- `ClientLogTail`: the last connection error kafka-python logged, for the message of a worker that
  cannot reach its brokers.

Counters and partitions that move
---------------------------------
A restored task continues its own counts (they are in its checkpoint), while a Prometheus counter
must start at zero in a process and never go down. Exposing the task's lifetime totals as counters
would make each restart of a worker, or each return of a partition to it, look like a reset
followed by a jump of millions of records (`rate()` would spike). So the counters here
(``streammargin_records_total``, ...) count what *this worker process* did since it took the
partition (they start at 0 at each restore; `_created` says when), and the lifetime totals of the
partition's model are gauges (``streammargin_model_records``, ``streammargin_model_labelled``).
A partition's series disappear when it is revoked and start again at zero on the worker that gets
it: sum the rates over workers for a topic's throughput.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import math
import re
import socket
import threading
import time
import typing

from connectors.serializers.mapping import LEFT_OUT_KINDS

__all__ = [
    "DEAD_LETTER_KINDS",
    "dead_letter_kind",
    "dead_letter_kind_of",
    "dead_letter_reason",
    "WorkerStatus",
    "Snapshot",
    "PartitionView",
    "EndpointServer",
    "EndpointError",
    "JsonLogFormatter",
    "ClientLogFilter",
    "ClientLogTail",
    "CHECKPOINT_SECONDS_BUCKETS",
]

log = logging.getLogger(__name__)

# Dead letters ------------------------------------------------------------------------------------

# The reason kinds of the dead-letter counts: a closed set, so a topic full of bad records cannot
# make the metrics grow. "other" is any reason not recognised (a custom codec's, say).
DEAD_LETTER_KINDS = (
    "null_value",          # a tombstone (null value)
    "oversized",           # larger than --max-record-bytes
    "bad_json",            # not JSON, or not UTF-8
    "not_an_object",       # JSON, but not an object
    "bad_id",              # an id that is neither a string nor an integer
    "unknown_label",       # a label the model cannot take
    "missing_features",    # neither features nor a label (the field options find nothing)
    "missing_label",       # a record of the label topic without a label
    "unjoinable_label",    # a label record without an id
    "bad_features",        # the object --features names is not one
    "not_a_number",        # a field --features names that is no feature (an array, bytes,
                           # a free text); a wildcard leaves such fields out
    "non_finite",          # NaN, an infinity, or a number beyond float64, in a field
                           # --features names
    "wire_format",         # not in Confluent's wire format (magic byte, schema id)
    "unknown_schema",      # a schema id the registry does not have
    "bad_schema",          # a schema that cannot be used (another format, too large, ...)
    "bad_payload",         # a payload that does not decode with its schema
    "rejected_by_model",   # the model's documented rejection (streammargin.InvalidInput)
    "undecodable",         # a record batch the client could not decode (skipped; named by the
                           # worker, not found in the reason)
    "other",
)

# The dead-letter classes of the Schema Registry formats, by the exception class header: their
# reasons quote what the registry and the payload say.
_CLASS_KINDS = {
    b"connectors.serializers.wire.WireFormatError": "wire_format",
    b"connectors.serializers.schema_registry.UnknownSchema": "unknown_schema",
    b"connectors.serializers.schema_registry.SchemaRefused": "bad_schema",
    b"connectors.serializers.registry_codec.UndecodablePayload": "bad_payload",
}

# (pattern at the start of the reason, kind), tried in order: the reasons of
# `connectors.serializers` and `connectors.task`. The model's rejection comes first: it
# quotes the model's own message.
_REASON_KINDS = [
    (re.compile(p, re.DOTALL), kind)
    for p, kind in [
        (r"rejected by the model", "rejected_by_model"),
        (r"empty record \(null value\)", "null_value"),
        (r"oversized record", "oversized"),
        (r"non-finite number", "non_finite"),
        (r"bad JSON", "bad_json"),
        (r"(label )?record is an? \w+, expected an object", "not_an_object"),
        (r"id .* must be a string or an integer", "bad_id"),
        (r"the record key is not UTF-8", "bad_id"),
        (r"unknown label", "unknown_label"),
        (r"label .* (of type \w+: a label is|is longer than|is beyond)", "unknown_label"),
        (r"no features and no label", "missing_features"),
        (r"label record without a label", "missing_label"),
        (r"label record without an id", "unjoinable_label"),
        (r"\S+ is an? \w+, not an object of fields", "bad_features"),
        (r"field .* nests objects deeper", "bad_features"),
        (r"field .* (holds an array|holds bytes|has a string of)", "not_a_number"),
        (r"field .*: (expected a finite real number|too large for a float64)(, and|$)",
         "non_finite"),
    ]
]

# Kafka Connect's dead-letter headers (written after the record's own headers: the last wins).
_REASON_HEADER = "__connect.errors.exception.message"
_STAGE_HEADER = "__connect.errors.stage"
_EXCEPTION_HEADER = "__connect.errors.exception.class.name"


def dead_letter_kind(reason: str) -> str:
    """The kind (one of `DEAD_LETTER_KINDS`) of a dead letter's reason.

    >>> dead_letter_kind("bad JSON: Expecting value: line 1 column 1 (char 0)")
    'bad_json'
    >>> dead_letter_kind("field 'x.f' holds an array: arrays are not features. Fix: ...")
    'not_a_number'
    >>> dead_letter_kind("field 'x.f' has value nan: expected a finite real number")
    'non_finite'
    >>> dead_letter_kind("the schema registry is down")
    'other'
    """
    for pattern, kind in _REASON_KINDS:
        if pattern.match(reason):
            return kind
    return "other"


def dead_letter_reason(headers: typing.Any) -> str:
    """A dead letter's reason, from its headers ("" if it has none)."""
    reason = b""
    for name, value in headers or ():
        if name == _REASON_HEADER:
            reason = value
    return reason.decode("utf-8", "replace")


def dead_letter_kind_of(headers: typing.Any) -> str:
    """The kind (one of `DEAD_LETTER_KINDS`) of a dead letter, from its headers."""
    return _kind_of(headers)


def _kind_of(headers: typing.Any) -> str:
    """The kind of a dead letter from its headers: the model's refusals by their stage
    (TASK_PUT), the others by their reason."""
    reason, stage, exception = b"", b"", b""
    for name, value in headers or ():
        if name == _REASON_HEADER:
            reason = value
        elif name == _STAGE_HEADER:
            stage = value
        elif name == _EXCEPTION_HEADER:
            exception = value
    if stage == b"TASK_PUT":
        return "rejected_by_model"
    if exception in _CLASS_KINDS:
        return _CLASS_KINDS[exception]
    return dead_letter_kind(reason.decode("utf-8", "replace"))


# Status ------------------------------------------------------------------------------------------

# Upper bounds (seconds) of the checkpoint duration histogram: one round of flushing the outputs,
# writing the checkpoints durably and committing.
CHECKPOINT_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Delayed-label outcomes, from `PendingLabels.counters()` (and the task's unjoinable events).
_LABEL_OUTCOMES = (("joined", "joined"), ("expired", "expired"), ("evicted", "evicted"),
                   ("superseded", "superseded"), ("orphans", "orphan"))


class PartitionView(typing.NamedTuple):
    """One partition's numbers at a publish point (see `WorkerStatus` for what each means)."""

    topic: str
    partition: int
    since: float  # wall-clock time this worker took the partition (the counters' start)
    records: int
    predictions: int
    labelled: int
    drift_detections: int
    dead_letters: tuple[tuple[str, int], ...]
    label_outcomes: tuple[tuple[str, int], ...]
    model_records: int
    model_labelled: int
    accuracy: float | None
    rolling_accuracy: float | None
    log_loss: float | None
    next_offset: int | None
    lag: int | None
    checkpoint_time: float
    checkpoint_bytes: int | None
    uncheckpointed_records: int
    pending_labels: int
    pending_label_bytes: int


class Snapshot(typing.NamedTuple):
    """Everything /metrics shows of a worker, as of one publish point of its main loop."""

    partitions: tuple[PartitionView, ...]
    checkpoints_written: int
    checkpoint_failures: int
    checkpoint_rounds: tuple[int, ...]  # per bucket of CHECKPOINT_SECONDS_BUCKETS, then +Inf
    checkpoint_seconds: float
    rebalances: int
    last_poll: float | None  # wall-clock time of the main loop's last turn
    published: float
    transactions_committed: int = 0  # exactly-once
    transactions_aborted: int = 0


@dataclasses.dataclass
class _Partition:
    """Main-loop bookkeeping of one owned partition: the task, and the counts at its restore."""

    task: typing.Any
    since: float
    base: dict[str, int]
    checkpoint_time: float
    checkpoint_bytes: int | None
    dead_letters: dict[str, int] = dataclasses.field(default_factory=dict)


def _task_counts(task: typing.Any) -> dict[str, int]:
    """The task's cumulative counts (and its label store's gauges `pending`, `pending_bytes`)."""
    counters = task.counters()
    return {
        **task.pending.counters(),
        "records": counters["records"],
        "predictions": counters["predictions"],
        "unjoinable": counters["unjoinable"],
        "labelled": task.metrics.n_labelled,
        "drift_detections": task.metrics.n_detections,
    }


class WorkerStatus:
    """The state of one worker as its probes and /metrics see it.

    The worker (`connectors.worker.worker.Worker`) creates one (`worker.status`) and calls the hooks
    below from its main loop and its rebalance callbacks (which kafka-python runs while the main
    loop waits in `poll`). Scrapes and probes, on the HTTP server's threads, read `snapshot()`,
    `readiness()` and `liveness()`: an immutable snapshot and flags set under a lock.

    Phases: "starting" (connecting), "running" (the main loop), "stopping" (final checkpoints),
    "stopped", "failed". Ready = running, a member of the group, every assigned partition
    restored. Live = starting, stopping, or running with a loop turn within the timeout.

    Parameters
    ----------
    group_id, model, worker
        Shown as labels (`group`) and in the `streammargin_worker_info` metric.
    publish_interval
        The main loop publishes a new snapshot at most this often (seconds).
    clock
        Monotonic time (tests may pass their own).

    """

    def __init__(
        self,
        group_id: str,
        model: str,
        worker: str,
        publish_interval: float = 0.25,
        clock: typing.Callable[[], float] = time.monotonic,
    ):
        self.group_id = group_id
        self.model = model
        self.worker = worker
        self.publish_interval = publish_interval
        self._clock = clock
        self._lock = threading.Lock()
        self.phase = "starting"
        self.error: str | None = None
        self.member = False
        self._unrestored: set[tuple[str, int]] = set()
        self._last_turn = clock()
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._checkpoints_written = 0
        self._checkpoint_failures = 0
        self._checkpoint_rounds = [0] * (len(CHECKPOINT_SECONDS_BUCKETS) + 1)
        self._checkpoint_seconds = 0.0
        self._rebalances = 0
        self._transactions = {"committed": 0, "aborted": 0}
        self._highwater: typing.Callable[[typing.Any], int | None] | None = None
        # Broker contact (connectors/worker/outage.BrokerContact, set by the worker once connected):
        # silence beyond the session timeout means the group has expired this member.
        self.contact: typing.Any = None
        # The model exchange of --model-scope topic (connectors/worker/model_scope.ModelScope,
        # set by the worker once connected): its counters go to /metrics.
        self.model_scope: typing.Any = None
        # The Schema Registry client (connectors/serializers/schema_registry.SchemaRegistry), and
        # why it is waited for while it does not answer (None: it answers, or is not used).
        self.registry: typing.Any = None
        self.registry_outage: str | None = None
        # What the worker could not use (connectors/observability/input_watch.InputWatch, set
        # by the worker): fields left out and orphan labels go to /metrics.
        self.input_watch: typing.Any = None
        # --max-memory: each part's bound for the partitions owned now, and whether the parts
        # that cannot shrink exceed the ceiling (connectors/worker/memory_budget.py).
        self.memory_parts: dict[str, int] = {}
        self.memory_overcommitted = False
        self._session_expired = False
        self._expired_in = 0  # the outage (BrokerContact.outages) that expired the session
        self._member_before_expiry = False
        self._heard_again_at: float | None = None
        self._next_publish = 0.0
        self._snapshot = self._build(time.time())

    # Hooks of the worker ----------------------------------------------------------------------

    def memory_budget(self, parts: dict[str, int], overcommitted: bool) -> None:
        """--max-memory's shares, as the owned partitions set them."""
        self.memory_parts = dict(parts)
        self.memory_overcommitted = overcommitted

    def connected(self, highwater: typing.Callable[[typing.Any], int | None]) -> None:
        """The clients are up and the main loop starts; `highwater(tp)` gives a partition's log
        end as of the last fetch (for the lag)."""
        with self._lock:
            self._highwater = highwater
            self.phase = "running"
            self._last_turn = self._clock()

    @property
    def was_connected(self) -> bool:
        """Whether the clients came up (`connected` was called): what the client log filter
        waits for."""
        return self._highwater is not None

    def assigned(self, partitions: typing.Iterable[typing.Any]) -> None:
        """The group gave the worker these partitions (not ready until they are restored)."""
        with self._lock:
            self.member = True
            self._session_expired = False
            self._rebalances += 1
            self._unrestored.update((tp.topic, tp.partition) for tp in partitions)

    def revoked(self, partitions: typing.Iterable[typing.Any]) -> None:
        """Partitions revoked or lost: their series disappear now; not ready until the next
        assignment is restored."""
        keys = {(tp.topic, tp.partition) for tp in partitions}
        with self._lock:
            self.member = False
            self._unrestored -= keys
            for key in keys:
                self._partitions.pop(key, None)
            snapshot = self._snapshot
            self._snapshot = snapshot._replace(partitions=tuple(
                p for p in snapshot.partitions if (p.topic, p.partition) not in keys))

    def restored(self, tasks: typing.Iterable[tuple[typing.Any, int | None]]) -> None:
        """The worker restored every partition awaiting it (its restore takes them all at once):
        these tasks, each with the size of the checkpoint it came from (None: none). Published
        at once."""
        now = time.time()
        with self._lock:
            self._unrestored.clear()
            for task, checkpoint_bytes in tasks:
                key = (task.topic, task.partition)
                self._partitions[key] = _Partition(
                    task=task, since=now, base=_task_counts(task), checkpoint_time=now,
                    checkpoint_bytes=checkpoint_bytes,
                )
            self._last_turn = self._clock()
            self._publish_locked(now)

    def processed(self, task: typing.Any, output: typing.Any) -> None:
        """After each `task.process` call: counts its dead letters by kind."""
        self._last_turn = self._clock()
        if output.dead_letters.values:
            self.dead_letters(task, output.dead_letters)

    def dead_letters(self, task: typing.Any, records: typing.Any, kind: str | None = None) -> None:
        """Count dead letters of a task, by `kind`, or by the kind of each one's reason."""
        entry = self._partitions.get((task.topic, task.partition))
        if entry is None:
            return
        counts = entry.dead_letters
        for record in records:
            found = kind or _kind_of(record.headers)
            counts[found] = counts.get(found, 0) + 1

    def checkpointed(self, sizes: dict[tuple[str, int], int], seconds: float) -> None:
        """One checkpoint round wrote these partitions' checkpoints durably (bytes each) in
        `seconds` (flushing outputs, writing, committing)."""
        now = time.time()
        with self._lock:
            for key, size in sizes.items():
                entry = self._partitions.get(key)
                if entry is not None:
                    entry.checkpoint_time, entry.checkpoint_bytes = now, size
            self._checkpoints_written += len(sizes)
            self._checkpoint_rounds[bisect.bisect_left(CHECKPOINT_SECONDS_BUCKETS, seconds)] += 1
            self._checkpoint_seconds += seconds
            self._next_publish = 0.0

    @property
    def transactions(self) -> dict[str, int]:
        """Exactly-once transactions so far: {"committed": n, "aborted": n}."""
        with self._lock:
            return dict(self._transactions)

    def transaction_ended(self, committed: bool) -> None:
        """Exactly-once: a transaction committed, or was aborted (its tasks rewound)."""
        with self._lock:
            self._transactions["committed" if committed else "aborted"] += 1
            self._next_publish = 0.0

    def checkpoint_failed(self, partitions: int) -> None:
        with self._lock:
            self._checkpoint_failures += partitions
            self._publish_locked(time.time())

    def watch_session(self, contact_age: float) -> None:
        """Main loop, each turn: `contact_age` seconds since a broker answered. Beyond the
        session timeout the member is presumed expired by the group: not ready until the next
        assignment is restored, or, should no rebalance come, until the brokers have answered
        for one more session timeout (the group kept the member after all)."""
        contact = self.contact
        if contact is None:
            return
        if contact_age > contact.session_timeout:
            self._heard_again_at = None
            # Once per outage: an assignment during it (the rejoin) stands.
            if not self._session_expired and self._expired_in != contact.outages:
                with self._lock:
                    self._session_expired, self._member_before_expiry = True, self.member
                    self._expired_in = contact.outages
                    self.member = False
            return
        if not self._session_expired:
            return
        now = self._clock()
        if self._heard_again_at is None:
            self._heard_again_at = now
        elif now - self._heard_again_at > contact.session_timeout:
            with self._lock:
                if self._session_expired:
                    self._session_expired = False
                    self.member = self._member_before_expiry

    def loop_turned(self) -> None:
        """The main loop turned (liveness); publishes a snapshot when one is due."""
        now = self._clock()
        self._last_turn = now
        if now >= self._next_publish:
            with self._lock:
                self._publish_locked(time.time())

    def stopping(self) -> None:
        """The main loop ended; the final checkpoints are being written (not ready)."""
        with self._lock:
            self.phase = "stopping"
            self._publish_locked(time.time())

    def stopped(self, error: BaseException | None = None) -> None:
        """The worker is done: stopped, or failed with `error` (not ready, not live)."""
        with self._lock:
            self.phase = "stopped" if error is None else "failed"
            if error is not None:
                self.error = f"{type(error).__name__}: {str(error)[:300]}"
            self._publish_locked(time.time())

    # Readers (any thread) ---------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def readiness(self) -> tuple[bool, str]:
        """(ready, why): a member of the group with every assigned partition restored."""
        with self._lock:
            if self.phase != "running":
                return False, self._phase_text()
            contact = self.contact
            age = contact.age() if contact is not None else 0.0
            if contact is not None and (self._session_expired or self.member) and (
                    age > contact.session_timeout):
                return False, (f"no broker answered for {age:.0f} s; past the "
                               f"{contact.session_timeout:g} s session timeout the group "
                               "expires this member: ready again once it has rejoined and "
                               "restored its partitions")
            if self._session_expired:
                return False, ("rejoining the consumer group: an outage outlasted the session "
                               "timeout")
            if self.registry_outage is not None:
                return False, f"waiting for the Schema Registry: {self.registry_outage[:300]}"
            if not self.member:
                return False, "joining the consumer group (or rebalancing)"
            if self._unrestored:
                return False, f"restoring {len(self._unrestored)} assigned partitions"
            return True, f"ready: {len(self._partitions)} partitions"

    def liveness(self, timeout: float) -> tuple[bool, str]:
        """(live, why): the main loop turned within `timeout` seconds (or is starting or
        stopping); a stopped or failed worker is not live."""
        with self._lock:
            if self.phase in ("stopped", "failed"):
                return False, self._phase_text()
            if self.phase != "running":
                return True, self._phase_text()
            quiet = self._clock() - self._last_turn
            if quiet > timeout:
                return False, f"the main loop has not turned for {quiet:.0f} s (limit {timeout:g} s)"
            return True, f"alive: the main loop turned {quiet:.1f} s ago"

    def _phase_text(self) -> str:
        if self.phase == "failed":
            return f"failed: {self.error}"
        return {"starting": "starting: connecting to the brokers", "stopping": "stopping",
                "stopped": "stopped"}.get(self.phase, self.phase)

    # Snapshots --------------------------------------------------------------------------------

    def _publish_locked(self, now: float) -> None:
        self._snapshot = self._build(now)
        self._next_publish = self._clock() + self.publish_interval

    def _build(self, now: float) -> Snapshot:
        views = []
        highwater = self._highwater
        for (topic, partition), entry in sorted(self._partitions.items()):
            task = entry.task
            counts = _task_counts(task)
            base = entry.base
            metrics = task.metrics
            next_offset = task.next_offset
            lag = None
            if highwater is not None and next_offset is not None:
                end = _log_end(highwater, topic, partition)
                if end is not None:
                    lag = max(0, end - next_offset)
            outcomes = [(name, counts[key] - base[key]) for key, name in _LABEL_OUTCOMES]
            outcomes.append(("unjoinable", counts["unjoinable"] - base["unjoinable"]))
            views.append(PartitionView(
                topic=topic,
                partition=partition,
                since=entry.since,
                records=counts["records"] - base["records"],
                predictions=counts["predictions"] - base["predictions"],
                labelled=counts["labelled"] - base["labelled"],
                drift_detections=counts["drift_detections"] - base["drift_detections"],
                dead_letters=tuple(sorted(entry.dead_letters.items())),
                label_outcomes=tuple(outcomes),
                model_records=counts["records"],
                model_labelled=counts["labelled"],
                accuracy=metrics.accuracy,
                rolling_accuracy=metrics.rolling_accuracy,
                log_loss=metrics.log_loss,
                next_offset=next_offset,
                lag=lag,
                checkpoint_time=entry.checkpoint_time,
                checkpoint_bytes=entry.checkpoint_bytes,
                uncheckpointed_records=task.since_checkpoint,
                pending_labels=counts["pending"],
                pending_label_bytes=counts["pending_bytes"],
            ))
        quiet = self._clock() - self._last_turn
        return Snapshot(
            partitions=tuple(views),
            checkpoints_written=self._checkpoints_written,
            checkpoint_failures=self._checkpoint_failures,
            checkpoint_rounds=tuple(self._checkpoint_rounds),
            checkpoint_seconds=self._checkpoint_seconds,
            rebalances=self._rebalances,
            last_poll=now - quiet if self.phase != "starting" else None,
            published=now,
            transactions_committed=self._transactions["committed"],
            transactions_aborted=self._transactions["aborted"],
        )


def _log_end(highwater: typing.Callable, topic: str, partition: int) -> int | None:
    """A partition's highwater mark as of the consumer's last fetch (a local lookup), or None
    (not fetched yet, or the consumer is closed)."""
    from kafka import TopicPartition

    try:
        return highwater(TopicPartition(topic, partition))
    except Exception:  # a closed consumer, say: no lag rather than no metrics
        return None


# Prometheus --------------------------------------------------------------------------------------


class _Collector:
    """A prometheus-client collector reading one `WorkerStatus` snapshot per scrape."""

    def __init__(self, status: WorkerStatus):
        self.status = status

    def describe(self) -> list:
        return []  # no registration-time collect: the series come and go with partitions

    def collect(self) -> typing.Iterator[typing.Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        status = self.status
        snap = status.snapshot()
        ready, _ = status.readiness()
        now = time.time()
        group = status.group_id
        keys = ["group", "topic", "partition"]

        info = InfoMetricFamily("streammargin_worker", "The worker: group, model and client id.",
                                labels=["group", "model", "worker"])
        info.add_metric([group, status.model, status.worker], {})
        yield info
        yield GaugeMetricFamily("streammargin_ready", "1 when /readyz answers 200.",
                                value=1.0 if ready else 0.0)
        contact = status.contact
        if contact is not None:
            yield GaugeMetricFamily(
                "streammargin_broker_contact_age_seconds",
                "Seconds since a broker last answered the worker's consumer (heartbeats, "
                "fetches); above the session timeout the group has expired the member.",
                value=contact.age())
            yield CounterMetricFamily(
                "streammargin_broker_outages",
                "Outages: no broker answer for two heartbeat intervals and a second (longer "
                "while joining the group).", value=contact.outages)
            yield CounterMetricFamily(
                "streammargin_client_log_lines_held_back",
                "The Kafka client's own log lines not shown (--log-level DEBUG shows them).",
                value=contact.held_back_lines)
        scope = status.model_scope
        if scope is not None:
            yield CounterMetricFamily(
                "streammargin_model_exchanges",
                "--model-scope topic: exchanges of this worker's models with its peers'.",
                value=scope.exchanges)
            yield CounterMetricFamily(
                "streammargin_model_peer_models",
                "--model-scope topic: other partitions' models mixed in.",
                value=scope.peer_models)
            yield CounterMetricFamily(
                "streammargin_model_records_refused",
                "--model-scope topic: model-topic records refused (malformed, another model or "
                "parameters, beyond the memory ceiling) and left out of the mix.",
                value=scope.refused)
            exchanged = CounterMetricFamily(
                "streammargin_model_exchange_bytes",
                "--model-scope topic: model-record bytes written and read.",
                labels=["direction"])
            exchanged.add_metric(["written"], scope.bytes_written)
            exchanged.add_metric(["read"], scope.bytes_read)
            yield exchanged
        registry = status.registry
        if registry is not None:
            yield GaugeMetricFamily(
                "streammargin_schema_registry_up",
                "1 while the Schema Registry answers (0: the worker waits for it, paused).",
                value=0.0 if status.registry_outage is not None else 1.0)
            requests = CounterMetricFamily(
                "streammargin_schema_registry_requests",
                "HTTP requests to the Schema Registry, by kind (schema: a schema by id, once per "
                "id while it stays cached; reference; register; probe: while waiting; subject: "
                "a topic's latest schema, at start, against --features).",
                labels=["kind"])
            for kind in ("schema", "reference", "register", "probe", "subject"):
                requests.add_metric([kind], registry.requests.get(kind, 0))
            yield requests
            counts = registry.cache_counts()
            yield GaugeMetricFamily("streammargin_schema_cache_schemas",
                                    "Schemas in the Schema Registry cache (cache.capacity "
                                    "bounds it).", value=counts["schemas"])
            yield GaugeMetricFamily("streammargin_schema_cache_bytes",
                                    "Schema text in the cache (--schema-cache-bytes bounds it).",
                                    value=counts["schema_bytes"])
        watch = status.input_watch
        if watch is not None:
            left_out = CounterMetricFamily(
                "streammargin_fields_left_out",
                "Fields a wildcard of --features reached that held no feature (an array, bytes, "
                "a string too long for a category, a non-finite number), left out of the "
                "records' features, by kind; each field is named in one WARNING.",
                labels=["kind"])
            counts = watch.left_out
            for kind in LEFT_OUT_KINDS:
                left_out.add_metric([kind], counts.get(kind, 0))
            yield left_out
            yield CounterMetricFamily(
                "streammargin_orphan_labels",
                "Delayed labels that joined no waiting event, on every partition this worker "
                "owned since it started (by partition: streammargin_delayed_labels_total"
                "{outcome=\"orphan\"}).", value=watch.orphans)
        if status.memory_parts:
            parts = GaugeMetricFamily(
                "streammargin_memory_budget_bytes",
                "--max-memory's share of each part of the worker, for the partitions it owns "
                "(docs/operations.md, \"Sizing a pod\"); the fill: process_resident_memory_bytes,"
                " streammargin_pending_label_bytes.", labels=["part"])
            for name, value in sorted(status.memory_parts.items()):
                parts.add_metric([name.replace(" ", "_")], value)
            yield parts
            yield GaugeMetricFamily(
                "streammargin_memory_overcommitted",
                "1 while the parts that cannot shrink (models, buffers) exceed --max-memory for "
                "the partitions owned: raise it, or run more workers.",
                value=1.0 if status.memory_overcommitted else 0.0)
        yield GaugeMetricFamily("streammargin_assigned_partitions",
                                "Partitions this worker owns and has restored.",
                                value=len(snap.partitions))
        if snap.last_poll is not None:
            yield GaugeMetricFamily("streammargin_last_poll_timestamp_seconds",
                                    "Unix time of the main loop's last turn (poll).",
                                    value=snap.last_poll)
        yield CounterMetricFamily("streammargin_rebalances",
                                  "Partition assignments received from the group.",
                                  value=snap.rebalances)
        yield CounterMetricFamily("streammargin_checkpoints_written",
                                  "Partition checkpoints written durably by this worker.",
                                  value=snap.checkpoints_written)
        yield CounterMetricFamily("streammargin_checkpoint_failures",
                                  "Partition checkpoints that could not be written.",
                                  value=snap.checkpoint_failures)
        transactions = CounterMetricFamily(
            "streammargin_transactions",
            "Exactly-once transactions by outcome: committed, or aborted (every task rewound to "
            "its last committed checkpoint).", labels=["outcome"])
        transactions.add_metric(["committed"], snap.transactions_committed)
        transactions.add_metric(["aborted"], snap.transactions_aborted)
        yield transactions
        histogram = HistogramMetricFamily(
            "streammargin_checkpoint_duration_seconds",
            "Checkpoint rounds: flushing outputs, writing checkpoints durably, committing.",
        )
        cumulative, buckets = 0, []
        for bound, count in zip((*CHECKPOINT_SECONDS_BUCKETS, math.inf), snap.checkpoint_rounds):
            cumulative += count
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), cumulative))
        histogram.add_metric([], buckets, snap.checkpoint_seconds)
        yield histogram

        def family(kind: type, name: str, doc: str, extra: tuple[str, ...] = ()) -> typing.Any:
            return kind(name, doc, labels=[*keys, *extra])

        records = family(CounterMetricFamily, "streammargin_records",
                         "Records this worker processed since it took the partition (events, "
                         "label records and dead letters).")
        predictions = family(CounterMetricFamily, "streammargin_predictions",
                             "Predictions this worker made since it took the partition.")
        labelled = family(CounterMetricFamily, "streammargin_labelled",
                          "Labelled predictions scored (accuracy, log loss, drift) since this "
                          "worker took the partition.")
        drifts = family(CounterMetricFamily, "streammargin_drift_detections",
                        "Drifts detected on the error stream since this worker took the "
                        "partition.")
        dead = family(CounterMetricFamily, "streammargin_dead_letters",
                      "Dead letters since this worker took the partition, by reason kind.",
                      ("reason",))
        outcomes = family(CounterMetricFamily, "streammargin_delayed_labels",
                          "Delayed labels and unlabelled events by outcome (joined, expired, "
                          "evicted, superseded, orphan label, unjoinable event without id).",
                          ("outcome",))
        model_records = family(GaugeMetricFamily, "streammargin_model_records",
                               "Records the partition's model has processed over its life "
                               "(continued from checkpoints, across workers).")
        model_labelled = family(GaugeMetricFamily, "streammargin_model_labelled",
                                "Labelled predictions behind the accuracy and log loss (over the "
                                "model's life).")
        accuracy = family(GaugeMetricFamily, "streammargin_accuracy",
                          "Progressive-validation accuracy over the model's life.")
        rolling = family(GaugeMetricFamily, "streammargin_rolling_accuracy",
                         "Accuracy over the last --rolling-window labelled predictions.")
        log_loss = family(GaugeMetricFamily, "streammargin_log_loss",
                          "Progressive-validation log loss over the model's life.")
        lag = family(GaugeMetricFamily, "streammargin_consumer_lag_records",
                     "Records between the partition's next offset and its log end (highwater of "
                     "the last fetch).")
        next_offset = family(GaugeMetricFamily, "streammargin_next_offset",
                             "The partition's next offset to process.")
        age = family(GaugeMetricFamily, "streammargin_checkpoint_age_seconds",
                     "Seconds since the partition's last durable checkpoint (or since this worker "
                     "restored it); see streammargin_uncheckpointed_records.")
        size = family(GaugeMetricFamily, "streammargin_checkpoint_bytes",
                      "Size of the partition's last checkpoint (written or restored).")
        unsaved = family(GaugeMetricFamily, "streammargin_uncheckpointed_records",
                         "Records processed since the partition's last checkpoint (replayed after "
                         "a crash).")
        pending = family(GaugeMetricFamily, "streammargin_pending_labels",
                         "Unlabelled events waiting for their label.")
        pending_bytes = family(GaugeMetricFamily, "streammargin_pending_label_bytes",
                               "Bytes charged to the waiting events (--label-store-bytes bounds "
                               "it).")
        created = _created_series()
        for view in snap.partitions:
            labels = [group, view.topic, str(view.partition)]
            since = view.since if created else None
            records.add_metric(labels, view.records, created=since)
            predictions.add_metric(labels, view.predictions, created=since)
            labelled.add_metric(labels, view.labelled, created=since)
            drifts.add_metric(labels, view.drift_detections, created=since)
            # Every kind from the start, at 0: increase() then sees the first dead letter of a
            # kind, which a series born at 1 would hide.
            counts = dict(view.dead_letters)
            for kind in DEAD_LETTER_KINDS:
                dead.add_metric([*labels, kind], counts.get(kind, 0), created=since)
            for outcome, count in view.label_outcomes:
                outcomes.add_metric([*labels, outcome], count, created=since)
            model_records.add_metric(labels, view.model_records)
            model_labelled.add_metric(labels, view.model_labelled)
            for metric, value in ((accuracy, view.accuracy), (rolling, view.rolling_accuracy),
                                  (log_loss, view.log_loss), (lag, view.lag),
                                  (next_offset, view.next_offset),
                                  (size, view.checkpoint_bytes)):
                if value is not None:
                    metric.add_metric(labels, value)
            age.add_metric(labels, max(0.0, now - view.checkpoint_time))
            unsaved.add_metric(labels, view.uncheckpointed_records)
            pending.add_metric(labels, view.pending_labels)
            pending_bytes.add_metric(labels, view.pending_label_bytes)
        yield from (records, predictions, labelled, drifts, dead, outcomes, model_records,
                    model_labelled, accuracy, rolling, log_loss, lag, next_offset, age, size,
                    unsaved, pending, pending_bytes)


def _created_series() -> bool:
    """Whether counters carry `_created` samples (the time this worker took the partition):
    prometheus-client's own setting, PROMETHEUS_DISABLE_CREATED_SERIES, turns them off."""
    import os

    return os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "false").lower() not in (
        "true", "1", "t")


def metrics_registry(status: WorkerStatus) -> typing.Any:
    """A prometheus-client registry with the worker's metrics and the process collectors
    (`process_*`: start time, CPU, resident memory, open files; `python_*`: GC, version)."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(status))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


# HTTP endpoints ----------------------------------------------------------------------------------


class EndpointError(RuntimeError):
    """The HTTP endpoints cannot be served (port in use, bad address); the message says why and
    what to do."""


def _handler_class(status: WorkerStatus, registry: typing.Any, liveness_timeout: float) -> type:
    from prometheus_client.exposition import MetricsHandler

    class Handler(MetricsHandler):
        """/metrics by prometheus-client (content negotiation, gzip); /healthz and /readyz."""

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            try:
                if path == "/metrics":
                    super().do_GET()
                elif path == "/healthz":
                    self._probe(*status.liveness(liveness_timeout))
                elif path == "/readyz":
                    self._probe(*status.readiness())
                elif path == "/":
                    self._text(200, "streammargin worker: /metrics /healthz /readyz\n")
                else:
                    self._text(404, "not found: try /metrics, /healthz or /readyz\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away
            except Exception:  # a bug in a collector: a 500, not a dropped connection
                log.exception("serving %s failed", path)
                with contextlib.suppress(Exception):
                    self._text(500, "internal error (see the worker's log)\n")

        def _probe(self, ok: bool, why: str) -> None:
            self._text(200 if ok else 503, why + "\n")

        def _text(self, code: int, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    Handler.registry = registry
    return Handler


class EndpointServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` of a worker, served by a daemon thread.

    Parameters
    ----------
    status
        The worker's `WorkerStatus` (`worker.status`).
    host
        Address to listen on: "0.0.0.0" (every IPv4 interface, the default: probes and
        Prometheus reach a pod on its own address), "::" (every interface), or "127.0.0.1"
        (this host only).
    port
        TCP port; 0 lets the system pick a free one (`port` then says which).
    liveness_timeout
        /healthz answers 503 once the main loop has not turned for this many seconds.

    Raises `EndpointError` (port in use, address not of this host, ...) when it cannot listen.

    """

    def __init__(self, status: WorkerStatus, host: str = "0.0.0.0", port: int = 0,
                 liveness_timeout: float = 60.0):
        from http.server import ThreadingHTTPServer

        if not liveness_timeout > 0:
            raise ValueError(f"liveness_timeout must be > 0, got {liveness_timeout!r}")
        self.status = status
        handler = _handler_class(status, metrics_registry(status), liveness_timeout)

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True
            allow_reuse_address = True  # a restart must not wait for TIME_WAIT sockets

        try:
            self._server = Server((host, port), handler)
        except (OSError, OverflowError) as error:
            raise EndpointError(_listen_failure(host, port, error)) from error
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="streammargin-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = self.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> EndpointServer:
        return self

    def __exit__(self, *exc: typing.Any) -> None:
        self.close()


def _listen_failure(host: str, port: int, error: BaseException) -> str:
    where = f"--http-host {host} --http-port {port}"
    code = getattr(error, "errno", None)
    if code == errno.EADDRINUSE:
        return (f"cannot serve the HTTP endpoints on {where}: the port is in use (another worker "
                "or exporter on this host?). Fix: choose another --http-port, or --http-port 0 "
                "to take a free one (the log says which)")
    if code == errno.EACCES:
        return (f"cannot serve the HTTP endpoints on {where}: permission denied (ports below "
                "1024 need privileges). Fix: use a port above 1024")
    if code == errno.EADDRNOTAVAIL or isinstance(error, socket.gaierror):
        return (f"cannot serve the HTTP endpoints on {where}: {host!r} is not an address of this "
                "host. Fix: --http-host 0.0.0.0 (every interface) or one of this host's addresses")
    text = str(error).rstrip(".")
    return (f"cannot serve the HTTP endpoints on {where}: {type(error).__name__}: {text}. "
            "Fix: check --http-host and --http-port (0-65535)")


# Logs --------------------------------------------------------------------------------------------

# Attributes every LogRecord has: anything else on a record came from `extra=` (a field).
_STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None))
) | {"message", "asctime", "taskName"}


def _json_value(value: typing.Any) -> typing.Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``,
    ``message``, then the record's structured fields (`extra=`: topic, partition, offset, ...)
    and ``exception`` (the traceback) when the record carries one.

    >>> record = logging.LogRecord("streammargin.kafka", logging.WARNING, "", 0,
    ...                            "skipped %d offsets", (3,), None)
    >>> record.topic, record.partition = "events", 2
    >>> line = JsonLogFormatter().format(record)
    >>> doc = json.loads(line)
    >>> doc["level"], doc["message"], doc["topic"], doc["partition"]
    ('WARNING', 'skipped 3 offsets', 'events', 2)
    """

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        doc: dict[str, typing.Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_") and key not in doc:
                doc[key] = _json_value(value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


class ClientLogFilter(logging.Filter):
    """Keeps the Kafka client's own log lines (kafka-python's, and librdkafka's under
    "kafka.librdkafka") off a handler unless `debug`.

    While it bootstraps, kafka-python logs every failed connection attempt (20 lines for an
    unreachable broker); the worker then fails with one line naming the servers, the timeout, the
    last error (from `ClientLogTail`) and the fix. Once connected, an outage made the clients
    repeat their warnings (55-85 lines for a 45 s one on kafka-python): the worker says it in a
    few lines of its own instead (connectors/worker/outage.py), and `held_back` counts what this
    filter kept back after the worker connected (`connected()`), for those lines and the
    metrics.
    """

    def __init__(self, connected: typing.Callable[[], bool], debug: bool = False,
                 held_back: typing.Callable[[], typing.Any] | None = None):
        super().__init__()
        self.connected = connected
        self.debug = debug
        self.held_back = held_back

    def filter(self, record: logging.LogRecord) -> bool:
        if self.debug or not (record.name == "kafka" or record.name.startswith("kafka.")):
            return True
        if self.held_back is not None and self.connected():
            self.held_back()
        return False


class ClientLogTail(logging.Handler):
    """Remembers the last connection error kafka-python logged (its bootstrap says only "Unable
    to bootstrap"): ``with ClientLogTail() as tail: ...; tail.last_error``. kafka-python logs
    them at ERROR: a "kafka" logger silenced beyond that leaves `last_error` None."""

    _CONNECTION_FAILED = re.compile(r"Connection failed: (.*)", re.DOTALL)

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last_error: str | None = None
        self._logger = logging.getLogger("kafka")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            found = self._CONNECTION_FAILED.match(record.getMessage())
        except Exception:  # a client's bad log call must not break the worker
            return
        if found:
            self.last_error = found.group(1)[:300]

    def __enter__(self) -> ClientLogTail:
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: typing.Any) -> None:
        self._logger.removeHandler(self)
