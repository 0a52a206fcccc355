"""The Kafka worker: a consumer-group member that runs one `PartitionTask` per input partition.

Everything a record does to a model happens in `connectors.task` (broker-free,
deterministic). This module is the Kafka adapter around it:

1. group membership and rebalances: partitions assigned to the worker are paused in the
   rebalance callback and restored in the main loop (latest checkpoint, seek to its offset);
   revoked ones are checkpointed first;
2. poll, feed each partition's records to its task, send the task's output records
   (predictions, dead letters, metrics);
3. checkpoints every `checkpoint_every` records of a partition (or `checkpoint_interval`
   seconds), on revocation and on exit, in this order: flush outputs, write the tasks' states
   durably (`CheckpointStore.write`: one record, or chunks + a manifest), commit the offsets;
4. error policies: a refused checkpoint (`on_bad_checkpoint`), a record batch the client cannot
   decode (`on_undecodable`), a dead letter too large to produce (sent without its value);
   anything else (a send that fails, a bug in a model) stops the worker with one message naming
   the cause and the fix, without committing;
5. idleness (`idle_timeout`): the worker exits only after being caught up with the log end of
   every partition it owns, confirmed by the broker at the start and the end of the period, so a
   broker outage is never mistaken for the end of the stream.

A worker killed at any point and restarted ends with exactly the state of an uninterrupted run;
records after the last checkpoint are replayed, so their predictions may appear twice
(at-least-once; dedupe on `(topic, partition, offset)`).

With `processing_guarantee="exactly-once"` the outputs, checkpoints and input offsets of each
commit interval are one Kafka transaction (`_commit_transaction`): a read_committed consumer sees
exactly one prediction per input offset, whatever crashes. A transaction that cannot commit (a
rebalance fenced this member's generation, a lost partition) is aborted, and every task goes back
to its last committed checkpoint (`_rewind`), which the records since then rebuild exactly.

Usage in a process of your own::

    worker = Worker(WorkerConfig(topics=["events"], bootstrap_servers="localhost:9092"))
    summary = worker.run(stop_event=threading.Event(), on_metrics=print)

`streammargin kafka` (`connectors.cli.kafka_command`) is the same thing as a command.

This module holds the life cycle and the main loop; `Worker`'s rebalance handling (1.) is in
`connectors.worker.rebalance`, its sends, checkpoints and transactions (2.-3.) in
`connectors.worker.outputs`, and the errors it stops with in `connectors.worker.failures`.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import json
import logging
import os
import socket
import sys
import threading
import time
import types
import typing

from connectors.codec import UndecodableBatch
from connectors.kafka.transport import Transport, make_transport
from connectors.observability.input_watch import InputWatch
from connectors.observability.metrics import Throughput
from connectors.observability.observability import ClientLogTail, WorkerStatus
from connectors.serializers.schema_registry import RegistryRefused, RegistryUnavailable
from connectors.state import checkpoint as checkpoint_module
from connectors.task.output_records import OutputRecords
from connectors.task.partition import PartitionTask
from connectors.worker import memory_budget
from connectors.worker.config import (
    BAD_CHECKPOINT_POLICIES,
    PROCESSING_GUARANTEES,
    UNDECODABLE_POLICIES,
    WorkerConfig,
    client_settings,
    connection_settings,
    group_timeouts,
)
from connectors.worker.failures import WorkerError, _connect_failure
from connectors.worker.label_topic import LabelMerge, co_partitioning_error
from connectors.worker.memory_budget import MemoryBudget
from connectors.worker.model_scope import (
    ModelScope,
    default_mix_every,
    in_time_order,
    resolved_exchange,
)
from connectors.worker.outage import BrokerContact, BrokerOutage, RegistryWait
from connectors.worker.outputs import Outputs
from connectors.worker.profiling import rss_bytes
from connectors.worker.rebalance import Rebalancing, _Callbacks
from streammargin.memory import held_classes

__all__ = ["WorkerConfig", "Worker", "WorkerError", "client_settings", "connection_settings",
           "BAD_CHECKPOINT_POLICIES", "UNDECODABLE_POLICIES", "PROCESSING_GUARANTEES",
           "check_tls_files"]

# The logger keeps the name it had before connectors/ became packages (issue 26): log lines
# and the filters operators wrote for them say "connectors.worker".
log = logging.getLogger("connectors.worker")

# A worker that fails waits at most this long for the group consumer to leave its group.
FAILING_CLOSE_TIMEOUT_S = 2.0
# A broker round trip of the idle check may take this long before it counts as "not caught up".
IDLE_CHECK_TIMEOUT_MS = 5_000


# --model-scope topic: how long a poll may wait, in all, for the partitions of its topics that
# have records on the broker but none in the poll (Worker._complete_poll), and each extra poll's
# timeout. Kafka Streams waits so for a task's partitions (max.task.idle.ms, KIP-695), so that
# its records go in timestamp order across them. Without it a poll that came while the client
# had fetched some partitions only (librdkafka's first polls of a backlog) learnt their
# stretches ahead of the others': 0.881 against 0.903 in one CI run of the backlog test.
TOPIC_SCOPE_POLL_WAIT_S = 0.5
TOPIC_SCOPE_EXTRA_POLL_MS = 50


def _kafka_errors() -> types.ModuleType:
    """kafka-python's errors, the worker's vocabulary of client failures on both transports
    (`librdkafka_transport.client_error`), imported when an `except` clause first matches an
    exception against them: a worker on librdkafka starts without importing kafka-python."""
    from kafka import errors

    return errors


def _import_in_background(name: str) -> None:
    """Import the module `name` on a daemon thread, unless it is imported already. An import
    that fails there is left to the code that needs the module, which then raises it."""
    if name not in sys.modules:
        threading.Thread(target=_import_quietly, args=(name,), name=f"import {name}",
                         daemon=True).start()


def _import_quietly(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 (see _import_in_background)
        log.debug("importing %s in the background failed", name, exc_info=True)


# TLS settings that name files, with the command-line option giving each (ssl_crlfile only
# through --consumer-config/--producer-config).
_TLS_FILES = {"ssl_cafile": "--ssl-cafile", "ssl_certfile": "--ssl-certfile",
              "ssl_keyfile": "--ssl-keyfile", "ssl_crlfile": "ssl_crlfile"}


def check_tls_files(settings: dict[str, dict]) -> None:
    """Load each client's TLS files as kafka-python will, before connecting.

    kafka-python loads them only when it opens a connection, and a failure there is retried until
    the bootstrap timeout (30 s), then reported as "Unable to bootstrap". Here a missing or
    unreadable file, a file without PEM certificates, or a certificate and key that do not load
    is a `WorkerError` naming the option, the file and the fix. Clients not on SSL/SASL_SSL, or
    given their own `ssl_context`, are not checked.
    """
    import ssl

    checked = set()
    for kwargs in settings.values():
        protocol = str(kwargs.get("security_protocol") or "PLAINTEXT").upper()
        if protocol not in ("SSL", "SASL_SSL") or kwargs.get("ssl_context") is not None:
            continue
        files = {name: kwargs.get(name) for name in _TLS_FILES}
        key = tuple(files.values())
        if key in checked:
            continue
        checked.add(key)
        for name, path in files.items():
            if not path:
                continue
            try:
                with open(path, "rb") as handle:
                    handle.read(1)
            except (OSError, TypeError, ValueError) as error:
                reason = getattr(error, "strerror", None) or str(error)
                raise WorkerError(
                    f"cannot read {name} ({_TLS_FILES[name]}) {path!r}: {reason}. Fix: give the "
                    "path of a readable PEM file"
                ) from None
        if files["ssl_crlfile"]:
            raise WorkerError(
                "ssl_crlfile cannot be used with kafka-python 3.0 (its TLS setup passes crl= to "
                "ssl.SSLContext.load_verify_locations, which takes no such argument, and every "
                "connection fails). Fix: leave ssl_crlfile out of --consumer-config and "
                "--producer-config"
            )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if files["ssl_cafile"]:
            try:
                context.load_verify_locations(files["ssl_cafile"])
            except (OSError, ValueError) as error:
                raise WorkerError(
                    f"ssl_cafile (--ssl-cafile) {files['ssl_cafile']!r} holds no usable PEM "
                    f"certificate ({error}). Fix: give the PEM file of the CA certificates that "
                    "signed the brokers' certificates"
                ) from None
        if files["ssl_certfile"]:
            try:
                context.load_cert_chain(files["ssl_certfile"], files["ssl_keyfile"],
                                        kwargs.get("ssl_password"))
            except (OSError, ValueError) as error:
                raise WorkerError(
                    f"the client certificate --ssl-certfile {files['ssl_certfile']!r} with "
                    f"--ssl-keyfile {files['ssl_keyfile']!r} does not load ({error}). Fix: give "
                    "the certificate and its private key as PEM files (the key may be in the "
                    "certificate file), and --ssl-password if the key is encrypted"
                ) from None


# The worker ---------------------------------------------------------------------------------------


class Worker(Rebalancing, Outputs):
    """A consumer-group member that predicts, learns and checkpoints, one task per partition.

    Parameters
    ----------
    config
        What to consume, where to write, which model, the policies and the client settings.

    """

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.settings = config.task_settings()
        # --max-memory: the shares of the ceiling (MemoryBudgetError, a ValueError, if the
        # parts that cannot shrink take it all on one partition).
        self.memory = self._memory_budget()
        # (partitions, pending share, overcommitted) last set, and the classes of the owned
        # models then (`_charge_classes`)
        self._memory_at: tuple[int, int, bool] | None = None
        self._charged_classes: tuple = ()
        # One Schema Registry client and one codec for every task: the client's cache serves
        # them all (a schema is asked for once per id and process).
        self.registry = config.make_registry()
        self.codec = self.settings.make_codec(self.registry)
        # --output-format avro: the outputs' encoders, their schemas registered at the start.
        self.outputs = None
        if config.output_format == "avro":
            from connectors.serializers.outputs import AvroOutputs

            self.outputs = AvroOutputs(config.predictions_topic, config.metrics_topic,
                                       self.settings.multiclass, config.predictions_per_message)
        # The Schema Registry does not answer (a task stalled on it, or the outputs' schemas
        # could not be registered): every partition waits, paused, until it does.
        self._registry_wait: RegistryWait | None = None
        # --label-topic: each task's records of both partitions, merged by timestamp
        # (connectors/worker/label_topic.py), from `_connect` on.
        self._label_topic = config.label_topic
        self._merge: LabelMerge | None = None
        self.model_name = self.settings.model_name
        self.client_id = config.client_id or f"streammargin-{socket.gethostname()}-{os.getpid()}"
        self.tasks: dict[typing.Any, PartitionTask] = {}
        self.throughput = Throughput()
        # What the worker could not use (dead letters by kind, orphan labels, fields left out
        # of the features), and its warnings: nothing lost in silence.
        self.input_watch = InputWatch()
        # The codec's field mapping, whose counts of fields left out the watch reads (None: a
        # codec of one's own).
        self._mapper = getattr(self.codec, "mapper", None)
        # What probes and /metrics see (connectors.observability.observability): hooks at cheap
        # points below.
        self.status = WorkerStatus(config.group_id, self.model_name, self.client_id)
        self.status.input_watch = self.input_watch
        self.exit_reason: str | None = None
        self._stop = threading.Event()
        self._on_metrics: typing.Callable[[dict], typing.Any] | None = None
        # The Kafka clients (connectors.kafka.transport), from `_connect` until `_close`.
        self._transport: Transport | None = None
        self._store: checkpoint_module.CheckpointStore | None = None
        # --model-scope topic: the model exchange (connectors/worker/model_scope.py).
        self.model_scope: ModelScope | None = None
        self._scope_noted: set[str] = set()  # topics _note_partition_scope has told of
        self._waited_out: set = set()  # partitions _complete_poll waited for in vain
        self._sends: list = []  # futures of the output sends since the last flush
        # --model-scope topic: the predictions of a poll, per output partition (_hold_predictions)
        self._held: dict[int | None, OutputRecords] = {}
        # Dead letters in flight, kept until they succeed: one too large for the broker is sent
        # again without its value.
        self._dead_letter_sends: list[tuple[typing.Any, typing.Any]] = []
        self._prediction_partitions: int = 1
        self._failed = False
        # Exactly-once: aborts since the last commit (the counts are the status's).
        self._exactly_once = config.exactly_once
        self._aborts_in_a_row = 0
        # Partitions assigned but not restored yet (paused until they are).
        self._unrestored: set = set()
        # An error inside a rebalance callback, raised by the main loop.
        self._callback_error: BaseException | None = None
        # Idleness: when the worker was last confirmed caught up (None: not confirmed), and
        # whether it owns its partitions (assigned, and no rebalance under way).
        self._idle_since: float | None = None
        self._member = False
        # The next offset of partitions revoked or lost (bounded: the topics' partitions), so
        # that their restore can say how many records it replays.
        self._left_at: dict[typing.Any, int] = {}
        # Broker contact and outages (connectors/worker/outage.py), from `_connect` on.
        self.contact: BrokerContact | None = None
        self._next_idle_check = 0.0
        self._final_metrics: dict[str, dict] = {}
        # Recent checkpoints: partitions, bytes, and the milliseconds spent flushing outputs and
        # writing + flushing the checkpoints + committing.
        self.checkpoint_log: collections.deque[dict] = collections.deque(maxlen=1000)
        # Start-up stamps: the wall-clock time (time.time()) and the process's RSS in bytes when
        # the main loop starts polling (connected, subscribed, before any record).
        self.first_poll_at: float | None = None
        self.first_poll_rss: int | None = None

    # Life cycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run` to finish the record in hand, checkpoint, commit and return."""
        self._stop.set()

    def run(
        self,
        stop_event: threading.Event | None = None,
        on_metrics: typing.Callable[[dict], typing.Any] | None = None,
    ) -> dict:
        """Consume until stopped (`stop()`, `stop_event`, or the idle timeout); returns a summary.

        `on_metrics` is called with every metrics record (a dict) as it is emitted. Raises
        `WorkerError` (or `TaskFailure` for a bug in a model or codec) without committing.
        """
        if stop_event is not None:
            self._stop = stop_event
        self._on_metrics = on_metrics
        if self.config.warm_up:
            threading.Thread(target=self._warm_up, name="streammargin-warm-up",
                             daemon=True).start()
        try:
            self._connect()
            self.status.connected(self._transport.highwater)
            self._loop()
            self.status.stopping()
        except BaseException as error:
            self._failed = True
            self.status.stopped(error)
            self._close(graceful=False)
            raise
        try:
            self._close(graceful=True)
        except BaseException as error:
            self.status.stopped(error)
            raise
        self.status.stopped()
        return self.summary()

    def _warm_up(self) -> None:
        """Run the model's per-record path on made-up records, on a task of its own: numba
        loads (or compiles) the code while the main thread waits for the broker, instead of at
        the first record. A failure here is left for the real records to meet."""
        from connectors.worker.warmup import warm_task

        try:
            seconds = warm_task(self.settings)
            log.debug("warmed up --model %s in %.2f s", self.settings.model, seconds)
        except Exception as error:  # the first real record reports it, with its coordinates
            log.debug("warming up --model %s failed: %r", self.settings.model, error)

    def summary(self) -> dict:
        summary = {
            "reason": self.exit_reason,
            "records": self.throughput.count,
            "records_per_s": self.throughput.rates()[0],
            "dead_letters": sum(self.input_watch.dead_letters.values()),
            "dead_letter_reasons": self.input_watch.counts(),
            # (delayed labels that joined no waiting event, since this worker's start)
            "orphan_labels": self.input_watch.orphans,
            "fields_left_out": {kind: n for kind, n in self.input_watch.left_out.items() if n},
            "partitions": dict(self._final_metrics),
        }
        if self._exactly_once:
            summary["transactions"] = self.status.transactions
        if self.model_scope is not None:
            summary["model_scope"] = self.model_scope.counters()
        return summary

    def _connect(self) -> None:
        config = self.config
        self._check_named_features()
        settings = client_settings(config, self.client_id)
        check_tls_files(settings)
        transport = self._transport = make_transport(config.transport, settings)
        session_s, heartbeat_s = group_timeouts(settings["consumer"])
        contact = self.contact = BrokerContact(
            session_s, heartbeat_s, max_outage=config.max_outage,
            bootstrap_servers=config.bootstrap_servers)
        contact.source = transport.last_broker_contact
        self.status.contact = contact
        # A client that joins in a thread of its own is subscribed first: the broker holds a new
        # member's join (Tansu for half the session timeout, Kafka for group.initial.rebalance.
        # delay.ms in a new group) while the producer, the topics and the checkpoint store are
        # set up. Its rebalance callbacks run only inside `poll`, once all of that exists.
        # kafka-python joins inside poll, and keeps the order below: subscribed last, two
        # workers started together joined again and again on Tansu when it polled early
        # (a9eca5b: Tansu re-runs a held join every second). The hold itself:
        # tests/test_broker_behaviour.py.
        subscribe_first = transport.joins_in_background
        subscribed = [*config.topics, *([config.label_topic] if config.label_topic else [])]
        if subscribe_first:
            transport.start_consumer()
            transport.subscribe(subscribed, _Callbacks(self))
        client = "producer"
        # kafka-python's bootstrap failure says only "Unable to bootstrap": the tail keeps the
        # last connection error it logged (refused, DNS, TLS handshake, ...) for the message.
        with ClientLogTail() as tail:
            try:
                transport.start_producer()
                if config.create_topics:
                    client = "admin"
                    self._create_topics(transport)
                if not subscribe_first:
                    client = "consumer"
                    transport.start_consumer()
            except _kafka_errors().KafkaError as error:
                raise _connect_failure(config.bootstrap_servers, client, settings[client], error,
                                       tail.last_error) from error
        self._store = transport.checkpoint_store(
            config.checkpoint_topic,
            config.group_id,
            chunk_bytes=config.checkpoint_chunk_bytes,
            max_checkpoint_bytes=config.max_checkpoint_bytes,
        )
        if config.model_scope == "topic":
            self.model_scope = self._model_exchange(transport)
            self.status.model_scope = self.model_scope
        if self.registry is not None:
            self.status.registry = self.registry
            log.info("Schema Registry: %s (--value-format %s, --output-format %s)",
                     self.registry.url, config.value_format, config.output_format,
                     extra={"schema_registry": self.registry.url})
        if self.outputs is not None:
            self._register_outputs()
        if config.predictions_topic:
            partitions = transport.partitions_for(config.predictions_topic)
            self._prediction_partitions = max(1, len(partitions or ()))
        if self._exactly_once:
            transport.begin_transaction()
        if config.label_topic is not None:
            self._check_co_partitioning(transport)
        if not subscribe_first:
            transport.subscribe(subscribed, _Callbacks(self))
        # The group join takes seconds, spent in the client's C code (librdkafka) or its socket
        # waits, without the GIL: kafka-python's modules, which the first records need (the
        # partitions' type, the errors), load meanwhile if the transport has not loaded them.
        _import_in_background("kafka")

    def _check_named_features(self) -> None:
        """A field that --features names and that the topic's latest schema gives as no feature
        (an array, bytes) stops the worker before it connects, in one line: every record would
        be a dead letter. Where no schema says (plain JSON, no subject <topic>-value, a registry
        that does not answer yet), each record decides."""
        check = getattr(self.codec, "named_features_refused", None)
        if check is None:
            return
        for topic in self.config.topics:
            try:
                reason = check(topic)
            except RegistryUnavailable as error:
                log.debug("--features not checked against the schema of %s: %s", topic, error)
                return
            if reason is not None:
                raise WorkerError(reason)

    def _memory_budget(self) -> MemoryBudget | None:
        config = self.config
        if config.max_memory is None:
            return None
        from streammargin.jit import aot

        # The models run on numba's JIT where the compiled modules are off or not built.
        numba = not (aot.enabled() and aot.built())
        exchange = "mix"
        if config.model_scope == "topic":
            exchange = resolved_exchange(config.model_exchange, self.settings)
        budget = memory_budget.budget_of(
            config, memory_budget.model_ceiling(self.settings.build_model()), numba, exchange)
        budget.check_start()
        return budget

    def _apply_memory_shares(self) -> bool:
        """--max-memory: each partition's pending store takes its share of what the fixed parts
        leave, for the partitions owned now and the classes their models hold (the oldest
        events beyond it are evicted, counted); a new share is logged in one line, an
        overcommitted ceiling in one ERROR line naming every fix. Returns whether the share
        changed."""
        budget = self.memory
        n = len(self.tasks)
        if budget is None or n == 0:
            return False
        topic_partitions = None
        if self.config.model_scope == "topic":
            try:
                topic_partitions = len(self._transport.partitions_for(self.config.topics[0])
                                       or ()) or None
            except Exception:  # noqa: BLE001 (metadata unavailable: the owned count)
                topic_partitions = None
            if self.model_scope is not None and not self.model_scope.has_ledger:
                budget = dataclasses.replace(budget, exchange_ledger=False)
        models = self._owned_models()
        self._charged_classes = self._classes_of(models)
        budget = budget.holding(memory_budget.model_ceiling(model) for model in models
                                if held_classes(model) is not None)
        share = min(budget.pending_share(n, topic_partitions), self.settings.label_store_bytes)
        for task in self.tasks.values():
            task.pending.resize(share)
        over = budget.overcommitted(n, topic_partitions)
        self.status.memory_budget(budget.parts(n, topic_partitions), over)
        moved = self._memory_at is None or self._memory_at[1] != share
        if self._memory_at == (n, share, over):
            return moved
        self._memory_at = (n, share, over)
        if over:
            fixes = memory_budget.overcommit_fixes(
                budget, n, topic_partitions,
                lambda k: tuple(memory_budget.model_ceiling(model, min(k, held_classes(model)))
                                for model in models if held_classes(model) is not None),
                "--max-classes {}" if self.settings.one_vs_rest else "--param max_classes={}")
            classes = budget.classes
            held = (f"{n} model ceilings of {memory_budget.format_size(budget.model)}"
                    if classes is None else
                    f"models of up to {classes} classes: "
                    f"{memory_budget.format_size(budget.models(n))}")
            log.error("memory: %d partitions need %s of --max-memory %s before any event waits "
                      "for its label (%s): the pending stores go on with %s each, and the "
                      "process may exceed the ceiling. Fix: %s", n,
                      memory_budget.format_size(budget.fixed(n, topic_partitions)),
                      memory_budget.format_size(budget.max_memory), held,
                      memory_budget.format_size(share), ", ".join(fixes[:-1]) + ", or "
                      + fixes[-1])
        else:
            log.info("%s", budget.describe(n, topic_partitions))
        return moved

    def _owned_models(self) -> list:
        """The models of the owned partitions, each once (under topic scope a topic's tasks
        share one)."""
        models = {id(task.model): task.model for task in self.tasks.values()}
        return list(models.values())

    @staticmethod
    def _classes_of(models: list) -> tuple:
        """The classes each model holds (`streammargin.memory.held_classes`: a len of its own
        label list), what the budget last charged."""
        return tuple(held_classes(model) for model in models)

    def _charge_classes(self) -> bool:
        """Once a poll: whether a model met a class since the budget was last set (a
        multiclass model's label list grew, or a topic's mix brought classes in); if so the
        budget is set again (`_apply_memory_shares`). Returns True when the stores' share
        changed in partition scope: every partition is then checkpointed in the same turn, so
        that a share only changes where a replay would start (the restore charges the classes
        its models bring, the same share)."""
        if self.memory is None or not self.settings.multiclass or not self.tasks:
            return False
        if self._classes_of(self._owned_models()) == self._charged_classes:
            return False
        return self._apply_memory_shares() and self.model_scope is None

    def _model_exchange(self, transport: Transport) -> ModelScope:
        """The model exchange of --model-scope topic, on a checkpoint store of the model topic
        whose records may hold at most a model of this worker's parameters: twice its memory
        ceiling (`streammargin.memory`) and a MiB of framing, or --max-checkpoint-bytes if
        lower, is read before anything of a record is decoded."""
        from streammargin.memory import memory_bound

        config = self.config
        ceiling = 2 * memory_bound(self.settings.build_model()) + (1 << 20)
        store = transport.checkpoint_store(
            config.model_topic,
            config.group_id,
            chunk_bytes=config.checkpoint_chunk_bytes,
            max_checkpoint_bytes=min(config.max_checkpoint_bytes, ceiling),
            flush_producer=False,
        )
        exchange = resolved_exchange(config.model_exchange, self.settings)
        mix_every = config.mix_every or default_mix_every(exchange)
        return ModelScope(store, self.settings, mix_every, transport.partitions_for,
                          config.max_model_bytes_share, exchange, config.max_exchange_cpu_share)

    def _create_topics(self, transport: Transport) -> None:
        """Create the missing output topics (as many partitions as the inputs have)."""
        config = self.config
        try:
            existing = transport.list_topics()
            partitions_for = transport.partitions_for
            n_input = max(
                [len(partitions_for(t) or ()) for t in config.topics if t in existing] or [1]
            )
            wanted = []
            for name in (config.predictions_topic, config.metrics_topic, config.dead_letter_topic,
                         config.label_topic):
                if name and name not in existing:
                    wanted.append((name, n_input, {}))
            if config.checkpoint_topic not in existing:
                wanted.append((config.checkpoint_topic, 1, {"cleanup.policy": "compact"}))
            if config.model_scope == "topic" and config.model_topic not in existing:
                wanted.append((config.model_topic, 1, {"cleanup.policy": "compact"}))
            for name, partitions, configs in wanted:
                try:
                    transport.create_topic(name, partitions, configs)
                except _kafka_errors().TopicAlreadyExistsError:
                    pass
                except _kafka_errors().KafkaError as error:
                    log.warning("could not create topic %s: %s", name, error)
        finally:
            transport.close_admin()

    def _loop(self) -> None:
        config = self.config
        consumer = self._transport
        stop = self._stop
        now = time.monotonic()
        next_metrics = now + config.metrics_interval if config.metrics_interval else None
        next_checkpoint = now + config.checkpoint_interval if config.checkpoint_interval else None
        self.first_poll_at = time.time()
        self.first_poll_rss = rss_bytes()
        while not stop.is_set():
            self._raise_callback_error()
            if self._unrestored:
                self._restore_assigned()
            if self._registry_wait is not None:
                self._wait_for_registry()
            scope = self.model_scope
            if scope is not None:
                polled_at, polled_cpu = time.monotonic(), time.thread_time()
            try:
                batches = consumer.poll(timeout_ms=200, max_records=self._poll_records())
            except UndecodableBatch as error:
                self._raise_callback_error()
                self._undecodable(error)
                continue
            except _kafka_errors().KafkaConnectionError as error:
                # kafka-python's poll raises this while the broker is down and a group rejoin
                # is pending; an outage is waited out, as when poll returns nothing.
                self._raise_callback_error()
                log.debug("poll: %s (waiting for the broker)", error)
                time.sleep(0.2)
                continue
            if scope is not None and sum(map(len, batches.values())) < self._poll_records():
                # A poll that could have taken more: its wait for records is time the CPU budget
                # of the exchanges may use. Not a full one's: in a backlog its wait is for a
                # fetch or for a core the broker and other workers hold. (A stricter rule, no
                # credit while records wait on the broker beyond the poll, changed nothing
                # measurable on a backlog of SEA: the exchanges took 10.1% of the workers' CPU
                # against 9.4%, five rounds each, benchmarks/model_scope_worker.py --processes
                # --control; whole-process CPU ratios there move by -30% to +40% between runs
                # of one configuration.)
                scope.waited(time.monotonic() - polled_at - (time.thread_time() - polled_cpu))
            undecodable = None
            if batches and scope is not None:
                batches, undecodable = self._complete_poll(batches)
            self._raise_callback_error()
            now = time.monotonic()
            if batches:
                self.contact.heard(now)  # type: ignore[union-attr]
            self._watch_contact(now)
            if self._merge is not None and (batches or self._merge.waiting()):
                batches = self._merged(batches)
            if batches:
                self._idle_since = None
                ready = []
                for tp, records in batches.items():
                    task = self.tasks.get(tp)
                    if task is None:
                        # Not restored yet (should have been paused): fetch these again later.
                        consumer.seek(tp, records[0].offset)
                        self._unrestored.add(tp)
                        self.status.assigned([tp])
                        continue
                    ready.append((task, records))
                for task, records, start, end in self._runs(ready):
                    stalled = self._run_task(task, records, start, end)
                    if stalled is not None:
                        self._stall(stalled, ready)
                        break
                    if stop.is_set():
                        break
                self._send_held()
                self._check_sends()
                if undecodable is not None:  # (met while completing the poll)
                    self._undecodable(undecodable)
            elif config.idle_timeout is not None and self._idle(now):
                self.exit_reason = "idle"
                return
            if scope is not None and not stop.is_set():
                self._exchange_models(scope)
            due = [t for t in self.tasks.values() if t.since_checkpoint >= config.checkpoint_every]
            if next_checkpoint is not None and now >= next_checkpoint:
                due = list(self.tasks.values())
                next_checkpoint = now + config.checkpoint_interval  # type: ignore[operator]
            if self._charge_classes():  # (new shares start at a checkpoint of every partition)
                due = list(self.tasks.values())
            if due and not stop.is_set():
                self._checkpoint(due, sync_commit=True)
            if next_metrics is not None and now >= next_metrics:
                for task in self.tasks.values():
                    self._publish_metrics(task, task.metrics_event("interval"))
                next_metrics = now + config.metrics_interval  # type: ignore[operator]
            self.status.loop_turned()
        self.exit_reason = "stopped"

    def _exchange_models(self, scope: ModelScope) -> None:
        """--model-scope topic: end the exchange under way if its reading is done (mix the
        peers' models in), start the next if it is due (connectors/worker/model_scope.py)."""
        try:
            scope.step(list(self.tasks.values()))
        except checkpoint_module.CheckpointError as error:
            raise WorkerError(f"{error} (while exchanging models on {self.config.model_topic}). "
                              "Fix: check that the workers can write and read that topic"
                              ) from error

    def _watch_contact(self, now: float) -> None:
        """Outages: logged, counted, never idleness; past the session timeout the member is
        presumed expired (not ready until it has rejoined); past --max-outage the worker
        stops."""
        contact = self.contact
        try:
            age = contact.turn(self._member, now)  # type: ignore[union-attr]
        except BrokerOutage as error:
            self.exit_reason = "outage"
            raise WorkerError(str(error)) from None
        if contact.silent:  # type: ignore[union-attr]
            self._idle_since = None  # idleness needs the brokers' word all along
        self.status.watch_session(age)

    def _poll_records(self) -> int:
        """The most records a poll may return: --max-poll-records; in topic scope that many a
        partition, so that a poll takes every partition's fetched stretch at once and
        `in_time_order` can interleave them all (a poll of a few partitions' records, then of
        the others', learns the same span of the stream twice over)."""
        records = self.config.max_poll_records
        if self.model_scope is None:
            return records
        return records * max(1, len(self.tasks))

    def _complete_poll(self, batches: dict) -> tuple[dict, UndecodableBatch | None]:
        """Topic scope: `batches` with the records of the partitions it lacks, polled again
        while a partition of one of its topics has none in it and records on the broker beyond
        its position (`_lagging_absent`), for at most TOPIC_SCOPE_POLL_WAIT_S in all. So a poll
        holds every partition's next stretch and `in_time_order` interleaves them all, as Kafka
        Streams waits for a task's partitions (max.task.idle.ms). A partition that gave nothing
        for a whole wait is not waited for again until it gives records. Also returns an
        `UndecodableBatch` an extra poll met, to be handled once `batches` are processed."""
        consumer = self._transport
        limit = self._poll_records()
        waited_out = self._waited_out
        waited_out.difference_update(batches)
        deadline = time.monotonic() + TOPIC_SCOPE_POLL_WAIT_S
        taken = sum(map(len, batches.values()))
        while taken < limit:
            lagging = self._lagging_absent(batches)
            if not lagging:
                break
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.is_set():
                waited_out.update(lagging)
                break
            try:
                more = consumer.poll(
                    timeout_ms=max(1, min(TOPIC_SCOPE_EXTRA_POLL_MS, int(1000 * left))),
                    max_records=limit - taken)
            except UndecodableBatch as error:
                return batches, error
            except _kafka_errors().KafkaConnectionError:
                break  # (the next poll of the loop meets the outage)
            for tp, records in more.items():
                batches[tp] = batches[tp] + records if tp in batches else records
                taken += len(records)
        return batches, None

    def _lagging_absent(self, batches: dict) -> list:
        """The restored partitions of the topics in `batches` that have no records there while
        the client's last fetch saw more than one record beyond their position, or has not
        fetched them yet (one record: a transaction's commit marker, which is never a record).
        Not those waited for in vain since they last gave records."""
        consumer = self._transport
        topics = {tp.topic for tp in batches}
        lagging = []
        for tp, task in self.tasks.items():
            if (tp.topic not in topics or tp in batches or tp in self._unrestored
                    or tp in self._waited_out):
                continue
            high = consumer.highwater(tp)
            if high is None:
                lagging.append(tp)
                continue
            position = task.next_offset
            if position is None:  # a fresh task: where the client will start it
                try:
                    position = consumer.position(tp, 0)
                except Exception:  # noqa: BLE001 (not known yet: not waited for)
                    position = None
            if position is not None and high - position > 1:
                lagging.append(tp)
        return lagging

    def _runs(self, ready: list[tuple[PartitionTask, list]]) -> typing.Iterable[tuple]:
        """The order a poll's batches are processed in: `(task, records, start, end)`. In
        partition scope, batch after batch. In topic scope the tasks of a topic share a model,
        so their batches are interleaved by timestamp (`model_scope.in_time_order`)."""
        if self.model_scope is None:
            return [(task, records, 0, len(records)) for task, records in ready]
        by_topic: dict[str, list] = {}
        for task, records in ready:
            by_topic.setdefault(task.topic, []).append((task, records))
        return [run for batches in by_topic.values() for run in in_time_order(batches)]

    def _run_task(self, task: PartitionTask, records: list, start: int = 0,
                  end: int | None = None) -> str | None:
        """Feed a partition's `records[start:end]` to its task and send what comes out; returns
        why the task stalled (the Schema Registry does not answer), or None."""
        stop_set = self._stop.is_set
        scope = self.model_scope
        if end is None:
            end = len(records)
        while start < end:
            started = time.monotonic()  # the rate's clock includes the first batch
            try:
                if scope is None:
                    output = task.process(records, start, stop_set, end)
                else:
                    # --model-scope topic: the exchange comes every --mix-every records, also
                    # in the middle of a partition's batch (a poll holds up to
                    # --max-poll-records).
                    limit = start + scope.records_to_exchange(self.tasks.values(), task.topic)
                    output = task.process(records, start, stop_set, min(limit, end))
            except RegistryRefused as error:
                raise WorkerError(f"{error}. Nothing was committed") from None
            self.status.processed(task, output)
            watch = self.input_watch
            watch.observe(output.processed, output.dead_letters)
            watch.labels(task)
            if self._mapper is not None:
                watch.left_out_fields(self._mapper)
            self._send_output(task, output)
            self.throughput.add(output.processed, started)
            if scope is not None:
                scope.read(sum(len(records[i].value or b"") for i in range(start, output.end))
                           if scope.max_bytes_share is not None else 0, output.processed)
            start = output.end
            if output.stalled is not None:
                return output.stalled
            if stop_set():
                return None
            if scope is not None:
                self._exchange_models(scope)
        return None

    # The Schema Registry's outages ------------------------------------------------------------

    def _stall(self, reason: str, ready: list[tuple[PartitionTask, list]]) -> None:
        """A task stalled on the Schema Registry: every partition waits, paused, from its next
        record (the records of this poll not processed are fetched again), until the registry
        answers (`_wait_for_registry`)."""
        consumer = self._transport
        first_offsets = {}
        held = [] if self._merge is None else self._merge.held()
        for task, records in [*ready, *held]:
            for record in records:
                key = (record.topic, record.partition)
                if key not in first_offsets:
                    first_offsets[key] = record.offset
        partitions = []
        for tp, task in self.tasks.items():
            for topic, offset in ((tp.topic, task.next_offset),
                                  (task.label_topic, task.label_next_offset)):
                if topic is None:
                    continue
                where = self._tp_of(topic, tp.partition)
                if offset is None:
                    offset = first_offsets.get((topic, tp.partition))
                if offset is not None:
                    consumer.seek(where, offset)
                partitions.append(where)
        if partitions:
            consumer.pause(*partitions)
        if self._merge is not None:
            for tp in self.tasks:
                self._merge.drop(tp)
        self._registry_wait = RegistryWait(self.registry.url, reason, self.config.max_outage)
        self.status.registry_outage = reason
        self._idle_since = None

    def _wait_for_registry(self) -> None:
        """While the registry does not answer: ask it again when due; once it answers, resume
        every restored partition."""
        wait = self._registry_wait
        if not wait.due():
            return
        try:
            answers = self.registry.probe()
        except RegistryRefused as error:
            raise WorkerError(f"{error}. Nothing was committed") from None
        if not answers:
            try:
                wait.failed(self.registry.unavailable or "no answer")
            except BrokerOutage as error:
                self.exit_reason = "outage"
                raise WorkerError(str(error)) from None
            self.status.registry_outage = wait.reason
            return
        wait.answered()
        self._registry_wait = None
        self.status.registry_outage = None
        partitions = [self._tp_of(topic, tp.partition) for tp, task in self.tasks.items()
                      for topic in (tp.topic, task.label_topic) if topic is not None]
        if partitions:
            self._transport.resume(*partitions)

    def _register_outputs(self) -> None:
        """--output-format avro: register the outputs' schemas, waiting (as for an outage)
        while the registry does not answer."""
        wait = None
        while not self._stop.is_set():
            try:
                self.outputs.register(self.registry)  # type: ignore[union-attr]
            except RegistryUnavailable as error:
                if wait is None:
                    wait = RegistryWait(self.registry.url, str(error), self.config.max_outage)
                else:
                    try:
                        wait.failed(str(error))
                    except BrokerOutage as outage:
                        self.exit_reason = "outage"
                        raise WorkerError(str(outage)) from None
                self.status.registry_outage = wait.reason
                self._stop.wait(max(0.0, wait.next_probe - time.monotonic()))
                continue
            except RegistryRefused as error:
                raise WorkerError(f"{error}. Nothing was committed") from None
            if wait is not None:
                wait.answered()
                self.status.registry_outage = None
            return

    # The label topic -------------------------------------------------------------------------

    def _check_co_partitioning(self, transport: Transport) -> None:
        """--label-topic: both topics exist with one partition count, or the worker refuses."""
        config = self.config
        topic, label_topic = config.topics[0], config.label_topic
        counts = [len(transport.partitions_for(name) or ()) for name in (topic, label_topic)]
        if 0 in counts:
            missing = topic if counts[0] == 0 else label_topic
            raise WorkerError(f"the topic {missing!r} does not exist. Fix: create it (or let the "
                              "worker create the label topic: --create-topics)")
        refusal = co_partitioning_error(topic, counts[0], label_topic, counts[1])  # type: ignore
        if refusal is not None:
            raise WorkerError(refusal)
        self._merge = LabelMerge(label_topic, self._partition_caught_up, self._transport.pause,
                                 self._resume_if_free, config.max_poll_records)

    def _check_assignment(self, assigned: typing.Iterable) -> None:
        """Each partition number of one topic assigned with the same of the other (the range
        assignor's promise on co-partitioned topics)."""
        numbers = {topic: {tp.partition for tp in assigned if tp.topic == topic}
                   for topic in (self.config.topics[0], self._label_topic)}
        if len(set(map(frozenset, numbers.values()))) > 1:
            raise WorkerError(
                f"the group assigned this worker partitions {sorted(numbers[self.config.topics[0]])}"
                f" of {self.config.topics[0]} but {sorted(numbers[self._label_topic])} of "
                f"{self._label_topic}: a member of a co-partitioned group must own both topics' "
                "partitions of a number. Fix: give every member of the group the range assignor "
                "(the default; leave partition_assignment_strategy out of --consumer-config)")

    def _partition_caught_up(self, tp: typing.Any) -> bool:
        """Whether a partition's position is at the log end of its last fetch."""
        transport = self._transport
        high = transport.highwater(tp)
        if high is None:
            return False
        try:
            position = transport.position(tp, 0)
        except Exception:  # noqa: BLE001 (not known yet: not caught up)
            return False
        return position is not None and position >= high

    def _resume_if_free(self, tp: typing.Any) -> None:
        """Resume a partition the merge paused, unless the worker holds every partition
        (waiting for the registry) or has not restored it."""
        if self._registry_wait is None and tp not in self._unrestored:
            self._transport.resume(tp)

    def _merged(self, batches: dict) -> dict:
        """A poll's records by task, each task's two partitions merged by timestamp (those
        that must wait for the other partition stay in the merge)."""
        merge = self._merge
        label_topic = self._label_topic
        for tp, records in batches.items():
            labels = tp.topic == label_topic
            events_tp = self._tp_of(self.config.topics[0], tp.partition) if labels else tp
            if events_tp in self.tasks:
                merge.add(events_tp, records, labels)  # type: ignore[union-attr]
            elif labels:
                self._transport.seek(tp, records[0].offset)  # (fetched again once restored)
        out = {}
        for tp in self.tasks:
            records = merge.ready(tp, self._tp_of(label_topic, tp.partition))  # type: ignore
            if records:
                out[tp] = records
        return out

    def _offsets(self, tasks: list[PartitionTask]) -> dict:
        """The offsets to commit for `tasks`: each one's next offset, and its label partition's."""
        offsets = {self._tp(t): t.next_offset for t in tasks}
        for task in tasks:
            if task.label_topic is not None and task.label_next_offset is not None:
                offsets[self._tp_of(task.label_topic, task.partition)] = task.label_next_offset
        return offsets

    @staticmethod
    def _tp_of(topic: str, partition: int) -> typing.Any:
        from kafka import TopicPartition

        return TopicPartition(topic, partition)

    def _close(self, graceful: bool) -> None:
        transport = self._transport
        try:
            if graceful:
                self.input_watch.check()  # (a run of fewer records than it waits for)
            if graceful and transport is not None and transport.consuming:
                tasks = list(self.tasks.values())
                for task in tasks:
                    self._publish_metrics(task, task.metrics_event("final"))
                self._checkpoint(tasks, sync_commit=True, force_flush=True)
                # Checkpointed: the revocation callback of close() has nothing left to do.
                self.tasks.clear()
        finally:
            closers = []
            if transport is not None and transport.consuming:
                # Leaves the group; the revocation callback finds nothing left to checkpoint.
                # Failing (an outage past --max-outage, say): leaving politely must not hold
                # the exit for the client's request timeout (27 s measured on kafka-python).
                closers.append(lambda: transport.close_consumer(
                    None if graceful else FAILING_CLOSE_TIMEOUT_S))
            if self._store is not None:
                closers.append(self._store.close)
            if self.model_scope is not None:
                scope = self.model_scope
                closers.append(lambda: scope.close(None if graceful else 0))
            if transport is not None and transport.producing:
                if self._exactly_once and not graceful:
                    # Failing: nothing of the open transaction may stand. Aborted now, readers
                    # need not wait for the transaction timeout (a fenced producer cannot).
                    closers.append(transport.abort_transaction)
                closers.append(lambda: transport.close_producer(timeout=10 if graceful else 0))
            for close in closers:
                try:
                    close()
                except Exception as error:
                    if graceful:
                        raise
                    # Failing already: keep the original error, not the close's.
                    log.debug("ignored while closing after a failure: %r", error)
            self._transport = self._store = None

    def _raise_callback_error(self) -> None:
        error, self._callback_error = self._callback_error, None
        if error is not None:
            raise error

    # Idleness ---------------------------------------------------------------------------------

    def _idle(self, now: float) -> bool:
        """After an empty poll: True once the worker has been caught up for `idle_timeout`.

        Caught up is checked against the broker (`_caught_up`) when the idle period starts and
        again when it ends: records polled, a rebalance or a failed check in between restart it.
        The log end only grows, so equal positions and ends at both checks mean nothing arrived
        in between, while a broker that does not answer (an outage) is never idleness.
        """
        if self.contact.silent or self._registry_wait is not None:  # type: ignore[union-attr]
            # The brokers are silent (`_watch_contact` ran this turn and restarted the period):
            # asking them would block the loop for nothing. Waiting for the Schema Registry,
            # the partitions are paused, not caught up.
            self._idle_since = None
            return False
        if self._idle_since is None:
            if now < self._next_idle_check:
                return False
            if self._caught_up():
                self._idle_since = now
            else:
                self._next_idle_check = time.monotonic() + 1.0
            return False
        if now - self._idle_since < self.config.idle_timeout:  # type: ignore[operator]
            return False
        if self._caught_up():
            return True
        self._idle_since = None
        return False

    def _caught_up(self) -> bool:
        """Whether every owned partition's position is at its log end, by a broker round trip.

        The log end is the larger of `end_offsets` and the highwater mark of the last fetch:
        Tansu answers `end_offsets` with the last record batch's base offset + 1, short of the
        end (tests/test_broker_behaviour.py shows it, and this check right on both brokers).
        """
        from kafka.errors import KafkaError

        consumer = self._transport
        if not self._member or self._unrestored:
            return False
        assigned = sorted(consumer.assignment())
        try:
            if not assigned:
                consumer.ping(IDLE_CHECK_TIMEOUT_MS)  # nothing owned: only the broker must answer
                return True
            ends = consumer.end_offsets(assigned, timeout_ms=IDLE_CHECK_TIMEOUT_MS)
            for tp in assigned:
                end = max(ends.get(tp) or 0, consumer.highwater(tp) or 0)
                position = consumer.position(tp, timeout_ms=IDLE_CHECK_TIMEOUT_MS)
                if tp not in ends or position is None or position < end:
                    log.debug("not idle: %s at %s of %s", tp, position, end)
                    return False
        except KafkaError as error:
            # Debug only: during an outage this repeats every second (connectors/worker/outage.py
            # logs the outage itself).
            log.debug("not idle: the broker did not confirm the log ends (%s)", error)
            return False
        self.contact.heard()  # type: ignore[union-attr]
        return True

    # Undecodable batches ----------------------------------------------------------------------

    def _undecodable(self, error: UndecodableBatch) -> None:
        """Apply `on_undecodable` to a record batch the client cannot decode."""
        from kafka import TopicPartition

        tp = TopicPartition(error.topic, error.partition)
        task = self.tasks.get(tp)
        if self.config.on_undecodable == "fail" or task is None:
            fix = error.fix()
            if error.missing_library:
                fix += " (or --on-undecodable skip to dead-letter such batches)"
            raise WorkerError(f"{error}. Fix: {fix}. Nothing was committed") from error
        first = error.first_offset
        next_offset = error.next_offset if error.next_offset is not None else first + 1
        highwater = self._transport.highwater(tp)
        if highwater is not None and next_offset > highwater:
            # A batch header that claims more than the log holds is corrupt too.
            next_offset = max(first + 1, highwater)
        dead = task.skip(first, next_offset, str(error), [("codec", error.codec.encode())])
        self.status.dead_letters(task, dead, kind="undecodable")
        self._send_dead_letters(dead)
        self._transport.seek(tp, next_offset)
        log.warning("skipped offsets %d-%d of %s/%d (--on-undecodable skip, dead letter sent): %s",
                    first, next_offset - 1, tp.topic, tp.partition, error,
                    extra={"topic": tp.topic, "partition": tp.partition, "offset": first,
                           "last_offset": next_offset - 1})

    # Metrics ----------------------------------------------------------------------------------

    def _publish_metrics(self, task: PartitionTask, record: dict) -> dict:
        """Complete a task's metrics event with what only the process knows (worker, rates,
        lag, time), send it and hand it to `on_metrics`."""
        overall, recent = self.throughput.rates()
        lag = None
        if self._transport is not None and task.next_offset is not None:
            highwater = self._transport.highwater(self._tp(task))
            if highwater is not None:
                lag = max(0, highwater - task.next_offset)
        record.update(
            worker=self.client_id,
            records_per_s=round(overall, 1),
            records_per_s_recent=round(recent, 1),
            lag=lag,
            time_ms=int(time.time() * 1000),  # epoch milliseconds, as Kafka's timestamps
        )
        self._final_metrics[f"{task.topic}/{task.partition}"] = record
        topic = self.config.metrics_topic
        if topic and self._transport is not None and self._transport.producing:
            from kafka.errors import KafkaError

            key = checkpoint_module.checkpoint_key(self.config.group_id, task.topic, task.partition)
            value = (json.dumps(record).encode() if self.outputs is None
                     else self.outputs.metrics(record))
            try:
                self._sends.append(self._transport.send(topic, value, key=key))
            except KafkaError as error:
                raise self._send_failure(f"metrics to {topic!r}", error) from error
        if self._on_metrics is not None:
            self._on_metrics(record)
        return record
