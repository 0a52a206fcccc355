"""The Kafka client under the worker: one small interface, one implementation per client library.

`connectors.worker.worker` talks to Kafka only through a `Transport`: a group consumer (poll, the
rebalance callbacks, pause/resume, seek, commit, committed offsets, log ends and positions for
"idle = caught up"), a producer (single records, many records to one partition, flush), topic
creation, and the `CheckpointStore` it hands out (its producer and its reader are the
transport's). Two implementations:

- `KafkaPythonTransport` (``--transport kafka-python``, the default): kafka-python, pure Python;
  predictions go out through `connectors.kafka.bulk_produce` (one future per record batch).
- `connectors.kafka.librdkafka_transport.LibrdkafkaTransport` (``--transport librdkafka``, the
  ``streammargin[librdkafka]`` extra): confluent-kafka, the C client; it takes the worker's
  kafka-python settings and translates them.

Common vocabulary, so that the worker is written once:

- partitions are `kafka.TopicPartition` (a named tuple: topic, partition);
- polled records have `topic, partition, offset, timestamp (epoch ms), key, value, headers`
  (a list of (str, bytes | None));
- a send returns a *delivery*: `is_done`, `failed()`, `exception`, `get(timeout=None)` (the
  record's metadata, `.offset` and `.partition`, or raises), `add_errback(f)`; kafka-python's
  futures are such deliveries;
- client errors are kafka-python's exception classes (`kafka.errors.KafkaError` and its
  subclasses: `MessageSizeTooLargeError`, `KafkaTimeoutError`, ...), which the worker turns into
  its one-line failures; an implementation on another library maps its errors onto them.

Exactly-once output (`--processing-guarantee exactly-once`): a producer whose settings carry a
`transactional_id` is transactional. `start_producer` then registers it with the transaction
coordinator (`init_transactions`: a previous producer of the same id is fenced, its open
transaction aborted); the worker opens a transaction (`begin_transaction`), sends, and ends it
with `commit_transaction(offsets)`, which adds the input offsets with the group consumer's
metadata (KIP-447: the broker refuses them from a member of an older generation, a zombie) and
commits. A transaction that cannot commit is aborted by the transport, which then raises
`TransactionAborted`: nothing of it is visible to read_committed consumers, and the worker
rewinds its tasks to their last committed checkpoints. A producer that cannot go on (fenced by a
newer producer of its id, not authorized) raises a `KafkaError`.

Rebalance callbacks (`RebalanceCallbacks`) run inside `poll`, on the calling thread's behalf, in
the order the worker's checkpoint protocol needs: `revoked` (or `lost`) before the partitions
go, `assigned` once the new ones are the consumer's, before any of their records is returned
(the worker pauses them there, restores their checkpoints, seeks and resumes).
"""

from __future__ import annotations

import abc
import typing

__all__ = ["TRANSPORTS", "Transport", "RebalanceCallbacks", "KafkaPythonTransport",
           "TransactionAborted", "make_transport", "sendable_headers", "install_pending_join_fix"]

#: The `--transport` choices.
TRANSPORTS = ("kafka-python", "librdkafka")


class TransactionAborted(Exception):  # noqa: N818 (an outcome, not a failure of ours)
    """The transaction could not commit and was aborted: none of its records, offsets or
    checkpoints are visible to read_committed readers. `cause` is the client's error."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class RebalanceCallbacks(typing.Protocol):
    """What a transport calls when the group moves partitions (never raising into it)."""

    def assigned(self, partitions: list) -> None: ...

    def revoked(self, partitions: list) -> None: ...

    def lost(self, partitions: list) -> None: ...


def sendable_headers(headers: typing.Any) -> list[tuple[str, bytes]] | None:
    """Headers kafka-python's producer takes: a list of (str, bytes); Kafka allows a header
    without a value, which the consumer gives as None and the producer refuses: empty bytes."""
    if not headers:
        return None
    return [(str(name), b"" if value is None else bytes(value)) for name, value in headers]


class Transport(abc.ABC):
    """A group consumer, a producer and topic administration over one Kafka client library.

    `settings` are the worker's client settings (`connectors.worker.config.client_settings`):
    keyword arguments of kafka-python's clients by role (``producer``, ``consumer``, ``admin``,
    ``checkpoint_reader``). Start the producer first (`start_producer`), create topics if
    wanted (`list_topics`, `create_topic`), then the consumer (`start_consumer`). Failures to
    reach the brokers raise `kafka.errors.KafkaError` (a `KafkaTimeoutError` when none answered).
    """

    name: typing.ClassVar[str]

    def __init__(self, settings: dict[str, dict]):
        self.settings = settings

    # Life cycle -------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def producing(self) -> bool:
        """Whether the producer was started (and not closed)."""

    @property
    @abc.abstractmethod
    def consuming(self) -> bool:
        """Whether the consumer was started (and not closed)."""

    @abc.abstractmethod
    def start_producer(self) -> None:
        """Create the producer (and connect, so that an unreachable cluster fails here)."""

    @abc.abstractmethod
    def start_consumer(self) -> None:
        """Create the group consumer (not subscribed yet)."""

    @abc.abstractmethod
    def close_consumer(self, timeout: float | None = None) -> None:
        """Leave the group (the `revoked` callback runs for what is still assigned), waiting at
        most `timeout` seconds for the brokers where the client lets us bound it."""

    @abc.abstractmethod
    def close_producer(self, timeout: float) -> None:
        """Send what is buffered for at most `timeout` seconds, then close."""

    # Topics -----------------------------------------------------------------------------------

    @abc.abstractmethod
    def list_topics(self) -> set[str]:
        """The cluster's topic names (an admin request)."""

    @abc.abstractmethod
    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        """Create a topic; raises `kafka.errors.TopicAlreadyExistsError` if it exists."""

    def close_admin(self) -> None:
        """Release the admin client, once topics are created."""

    @abc.abstractmethod
    def partitions_for(self, topic: str) -> set[int] | None:
        """The partition numbers of a topic (from the producer's metadata)."""

    # Consuming --------------------------------------------------------------------------------

    @abc.abstractmethod
    def subscribe(self, topics: typing.Sequence[str], callbacks: RebalanceCallbacks) -> None:
        """Join the group for `topics`; `callbacks` run inside `poll`."""

    #: Whether the client sends the group join from a thread of its own once subscribed, without
    #: a `poll` (librdkafka), so that a worker can subscribe before its other clients start: the
    #: broker's hold of a new member's join then overlaps them. kafka-python joins inside poll.
    joins_in_background: typing.ClassVar[bool] = False

    @abc.abstractmethod
    def poll(self, timeout_ms: int, max_records: int) -> dict[typing.Any, list]:
        """Records by partition, each partition's in offset order (may be empty)."""

    @abc.abstractmethod
    def assignment(self) -> set:
        """The partitions the consumer owns now."""

    @abc.abstractmethod
    def pause(self, *partitions: typing.Any) -> None: ...

    @abc.abstractmethod
    def resume(self, *partitions: typing.Any) -> None: ...

    @abc.abstractmethod
    def seek(self, partition: typing.Any, offset: int) -> None:
        """The next record `poll` returns of `partition` is at `offset`."""

    @abc.abstractmethod
    def seek_to_beginning(self, partition: typing.Any) -> None: ...

    @abc.abstractmethod
    def seek_to_end(self, partition: typing.Any) -> None: ...

    @abc.abstractmethod
    def committed(self, partition: typing.Any) -> int | None:
        """The group's committed offset of `partition` (None: nothing committed)."""

    @abc.abstractmethod
    def commit(self, offsets: dict[typing.Any, int], wait: bool) -> None:
        """Commit next offsets; `wait`: synchronously (raises on failure), else in the
        background (inside a rebalance callback)."""

    @abc.abstractmethod
    def highwater(self, partition: typing.Any) -> int | None:
        """The log end of `partition` as of the last fetch (None: not fetched yet)."""

    def last_broker_contact(self) -> float | None:
        """When the group consumer last got an answer from a broker (`time.monotonic()`
        seconds; None: the client does not say). Read by connectors/worker/outage.py."""
        return None

    @abc.abstractmethod
    def end_offsets(self, partitions: list, timeout_ms: int) -> dict[typing.Any, int]:
        """The log ends by a broker round trip (short on Tansu, which answers the last record
        batch's base offset + 1: take the larger of this and `highwater`)."""

    @abc.abstractmethod
    def position(self, partition: typing.Any, timeout_ms: int) -> int | None:
        """The offset of the next record `poll` would return of `partition`."""

    @abc.abstractmethod
    def ping(self, timeout_ms: int) -> None:
        """A broker round trip (raises `KafkaError` if none answers)."""

    # Producing --------------------------------------------------------------------------------

    @abc.abstractmethod
    def send(self, topic: str, value: bytes | None, key: bytes | None = None,
             headers: list | None = None, timestamp_ms: int | None = None,
             partition: int | None = None) -> typing.Any:
        """Produce one record (a header without value goes out empty); its delivery."""

    @abc.abstractmethod
    def send_many(self, topic: str, partition: int, values: typing.Sequence[bytes],
                  keys: typing.Sequence[bytes | None], headers: typing.Sequence[list | None],
                  timestamps: typing.Sequence[int | None]) -> list:
        """Produce records to one partition, in order: their deliveries (one per record batch
        or per record, whichever the library gives)."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Return once every record sent so far is delivered or failed (see the deliveries)."""

    # Transactions (exactly-once) ----------------------------------------------------------------

    @property
    def transactional(self) -> bool:
        """Whether the producer is transactional (its settings give a `transactional_id`)."""
        return bool(self.settings["producer"].get("transactional_id"))

    @abc.abstractmethod
    def begin_transaction(self) -> None:
        """Open a transaction: what is sent from now on is in it (a local step, no request)."""

    @abc.abstractmethod
    def commit_transaction(self, offsets: dict[typing.Any, int],
                           before_commit: typing.Callable[[], None] | None = None) -> None:
        """Add the group's next `offsets` to the transaction, call `before_commit`, and commit
        (blocks until the broker has it). Raises `TransactionAborted` when it could not commit
        and was aborted, a `KafkaError` when the producer cannot go on; what `before_commit`
        raises passes through, the transaction left open."""

    @abc.abstractmethod
    def abort_transaction(self) -> None:
        """Abort the open transaction (raises a `KafkaError` when the producer cannot)."""

    # Checkpoints ------------------------------------------------------------------------------

    @abc.abstractmethod
    def checkpoint_store(self, topic: str, group_id: str, chunk_bytes: int,
                         max_checkpoint_bytes: int, flush_producer: bool = True) -> typing.Any:
        """A `connectors.state.checkpoint.CheckpointStore` writing with this transport's producer
        and reading with a consumer of the same library (settings: ``checkpoint_reader``);
        `flush_producer` as the store's."""


class KafkaPythonTransport(Transport):
    """kafka-python's `KafkaProducer`, `KafkaConsumer` and `KafkaAdminClient`."""

    name = "kafka-python"

    def __init__(self, settings: dict[str, dict]):
        super().__init__(settings)
        from connectors.codec import install_batch_errors, install_fast_crc32c
        from connectors.kafka.fetched_records import unpack_records

        install_fast_crc32c()
        install_batch_errors(unpack=unpack_records)  # fetched batches read in C where built
        install_pending_join_fix()
        self.producer: typing.Any = None
        self.consumer: typing.Any = None
        self._admin: typing.Any = None
        # Whether predictions go out in bulk (kafka-python internals as expected).
        self.bulk = False

    @property
    def producing(self) -> bool:
        return self.producer is not None

    @property
    def consuming(self) -> bool:
        return self.consumer is not None

    def start_producer(self) -> None:
        from kafka import KafkaProducer

        from connectors.kafka import bulk_produce

        self.producer = KafkaProducer(**self.settings["producer"])
        self.bulk = bulk_produce.supported(self.producer)
        if self.transactional:
            # Fences a previous producer of this id and aborts its open transaction; waits at
            # most max_block_ms (KafkaTimeoutError: no broker answered).
            self.producer.init_transactions()

    def start_consumer(self) -> None:
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(**self.settings["consumer"])

    def close_consumer(self, timeout: float | None = None) -> None:
        consumer, self.consumer = self.consumer, None
        consumer.close(timeout_ms=None if timeout is None else int(1000 * timeout))

    def close_producer(self, timeout: float) -> None:
        producer, self.producer = self.producer, None
        producer.close(timeout=timeout)

    def _admin_client(self) -> typing.Any:
        if self._admin is None:
            from kafka import KafkaAdminClient

            self._admin = KafkaAdminClient(**self.settings["admin"])
        return self._admin

    def list_topics(self) -> set[str]:
        return set(self._admin_client().list_topics())

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        from kafka.admin import NewTopic

        self._admin_client().create_topics([NewTopic(
            name, num_partitions=partitions, replication_factor=1, topic_configs=configs or {},
        )])

    def close_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            admin.close()

    def partitions_for(self, topic: str) -> set[int] | None:
        return self.producer.partitions_for(topic)

    def subscribe(self, topics: typing.Sequence[str], callbacks: RebalanceCallbacks) -> None:
        self.consumer.subscribe(list(topics), listener=_listener(callbacks))
        # The topics' metadata before the first poll sends the JoinGroup. Without it kafka-python
        # 3.0.12, answered at once by Apache Kafka, often leads a first generation without them
        # ("No partition metadata for topic": nothing assigned, /readyz ready with no partition)
        # and rebalances again at once: 56 of 60 fresh starts, none of 60 with this (the rejoin
        # it lost at times: install_pending_join_fix). Tansu's hold of a join hid it
        # (tests/test_broker_behaviour.py).
        self.consumer.topics()

    def poll(self, timeout_ms: int, max_records: int) -> dict[typing.Any, list]:
        fetcher = getattr(self.consumer, "_fetcher", None)
        parked = getattr(fetcher, "_paused_partition_records", None)
        if parked:
            # kafka-python 3.0.12 keeps the records fetched for a partition paused before they
            # were returned (KAFKA-7548), and gives them back after its resume only while its
            # in-line slot is None; but a drained slot stays set (an empty PartitionRecords), so
            # a resumed partition's parked records never came back, and, never fetched again
            # while parked, the partition stalled for good (--label-topic's merge pauses and
            # resumes: a worker stopped at 2,100 of 2,500 events, tests/test_label_topic.py).
            # A drained slot holds nothing: clearing it lets the parked records back in.
            slot = fetcher._next_partition_records
            if slot is not None and not slot:
                fetcher._next_partition_records = None
        return self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)

    def assignment(self) -> set:
        return self.consumer.assignment()

    def pause(self, *partitions: typing.Any) -> None:
        self.consumer.pause(*partitions)

    def resume(self, *partitions: typing.Any) -> None:
        self.consumer.resume(*partitions)

    def seek(self, partition: typing.Any, offset: int) -> None:
        self.consumer.seek(partition, offset)

    def seek_to_beginning(self, partition: typing.Any) -> None:
        self.consumer.seek_to_beginning(partition)

    def seek_to_end(self, partition: typing.Any) -> None:
        self.consumer.seek_to_end(partition)

    def committed(self, partition: typing.Any) -> int | None:
        return self.consumer.committed(partition)

    def commit(self, offsets: dict[typing.Any, int], wait: bool) -> None:
        from kafka.structs import OffsetAndMetadata

        metadata = {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in offsets.items()}
        if wait:
            self.consumer.commit(metadata)
        else:
            self.consumer.commit_async(metadata)

    def highwater(self, partition: typing.Any) -> int | None:
        return self.consumer.highwater(partition)

    def last_broker_contact(self) -> float | None:
        # The coordinator's heartbeat clock (kafka/coordinator/heartbeat.py, monotonic): the
        # last heartbeat answered (RebalanceInProgress included); a member sends one every
        # heartbeat interval. Not `last_reset`: kafka-python also resets it when it re-enables
        # its heartbeat, without an answer (a 30 s outage then read as 4 s). Fetch answers are
        # not stamped by kafka-python: the worker stamps the records it polls.
        heartbeat = getattr(getattr(self.consumer, "_coordinator", None), "heartbeat", None)
        last = getattr(heartbeat, "last_receive", None)
        return last if last is not None and last > float("-inf") else None

    def end_offsets(self, partitions: list, timeout_ms: int) -> dict[typing.Any, int]:
        return self.consumer.end_offsets(partitions, timeout_ms=timeout_ms)

    def position(self, partition: typing.Any, timeout_ms: int) -> int | None:
        return self.consumer.position(partition, timeout_ms=timeout_ms)

    def ping(self, timeout_ms: int) -> None:
        self.consumer.topics()

    def send(self, topic: str, value: bytes | None, key: bytes | None = None,
             headers: list | None = None, timestamp_ms: int | None = None,
             partition: int | None = None) -> typing.Any:
        send = self.producer.send
        try:
            return send(topic, value, key=key, headers=headers, timestamp_ms=timestamp_ms,
                        partition=partition)
        except TypeError:
            # A header kafka-python cannot write (a null value): sent as empty.
            return send(topic, value, key=key, headers=sendable_headers(headers),
                        timestamp_ms=timestamp_ms, partition=partition)

    def send_many(self, topic: str, partition: int, values: typing.Sequence[bytes],
                  keys: typing.Sequence[bytes | None], headers: typing.Sequence[list | None],
                  timestamps: typing.Sequence[int | None]) -> list:
        if self.bulk:
            # Appended in bulk, one future per record batch (connectors/kafka/bulk_produce.py).
            from connectors.kafka.bulk_produce import send_many

            return send_many(self.producer, topic, partition, values, keys, headers, timestamps)
        send = self.send
        return [send(topic, value, key=key, headers=record_headers, timestamp_ms=timestamp,
                     partition=partition)
                for value, key, record_headers, timestamp in zip(values, keys, headers,
                                                                 timestamps)]

    def flush(self) -> None:
        self.producer.flush()

    def begin_transaction(self) -> None:
        self.producer.begin_transaction()

    def commit_transaction(self, offsets: dict[typing.Any, int],
                           before_commit: typing.Callable[[], None] | None = None) -> None:
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        metadata = {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in offsets.items()}
        try:
            if metadata:
                self.producer.send_offsets_to_transaction(metadata,
                                                          self.consumer.group_metadata())
            if before_commit is not None:
                before_commit()
            self.producer.commit_transaction()
        except KafkaError as error:
            # An abortable error (a generation the group coordinator no longer knows, a failed
            # send, a timeout) leaves the transaction to abort; a fatal one (fenced) makes the
            # abort raise too, and that error stops the worker.
            self.producer.abort_transaction()
            raise TransactionAborted(error) from error

    def abort_transaction(self) -> None:
        self.producer.abort_transaction()

    def checkpoint_store(self, topic: str, group_id: str, chunk_bytes: int,
                         max_checkpoint_bytes: int, flush_producer: bool = True) -> typing.Any:
        from connectors.state.checkpoint import CheckpointStore

        reader = dict(self.settings["checkpoint_reader"])
        servers = reader.pop("bootstrap_servers")
        return CheckpointStore(servers, topic, group_id, producer=self.producer,
                               reader_config=reader, chunk_bytes=chunk_bytes,
                               max_checkpoint_bytes=max_checkpoint_bytes,
                               transactional=self.transactional,
                               flush_producer=flush_producer)


def install_pending_join_fix() -> None:
    """Make kafka-python finish a group join that ended after the `poll` that started it.

    kafka-python 3.0.12 runs a JoinGroup -> SyncGroup round as a task on its IO thread
    (`BaseCoordinator.join_group_async`, kafka/coordinator/base.py). When the poll's timeout
    ends first, the task is kept in `_join_task` for a later poll to await, but that poll
    - enters `join_group_async` only while `need_rejoin()` says so, and the round itself clears
      what made `ConsumerCoordinator.need_rejoin` true (the leader's assignment snapshot, the
      joined subscription); `rejoin_needed` is cleared only by the awaiting poll, too;
    - replaces a finished task by a new JoinGroup (`if self._join_task is None or
      self._join_task.is_done`), dropping its result.
    Either way the member stays REBALANCING for good: heartbeats off (disabled for the round,
    enabled by the awaiting poll), the new assignment never applied; the broker expires it after
    the session timeout, which the consumer never learns, and `poll` spins (a heartbeat is due).
    On Apache Kafka: a first generation assigned nothing ("No partition metadata for topic"), the
    rejoin ~100 ms later fell at the end of the worker's 200 ms poll (~1 fresh start in 4).

    The fix is the Java client's (`rejoinNeededOrPending`): a join in flight or finished but not
    handled keeps `need_rejoin()` true, and a finished one is handled as `join_group_async`
    would have: a success completes the join (STABLE, heartbeats on, the assignment, the
    rebalance listener), a failure joins again. Idempotent; nothing on other kafka-pythons.
    """
    from kafka.coordinator.base import BaseCoordinator
    from kafka.structs import MemberState

    join_group_async = BaseCoordinator.join_group_async
    if (getattr(join_group_async, "_streammargin", False)
            or "_join_task" not in BaseCoordinator.__init__.__code__.co_names):
        return
    need_rejoin = BaseCoordinator.need_rejoin

    def need_rejoin_or_pending(self: typing.Any) -> bool:
        return need_rejoin(self) or self._join_task is not None

    async def join_pending_first(self: typing.Any, timeout_ms: typing.Any = None) -> typing.Any:
        task = self._join_task
        if task is not None and task.is_done:
            self._join_task = None
            if not (task.succeeded() and self.state == MemberState.REBALANCING):
                self.request_rejoin()  # as the awaiting poll would: join again
            else:  # the end of join_group_async, with the result it would have awaited
                generation = self._generation
                with self._lock:
                    self.rejoining = False
                    self.rejoin_needed = False
                    self.state = MemberState.STABLE
                    self._enable_heartbeat()
                await self._on_join_complete_async(generation.generation_id,
                                                   generation.member_id, generation.protocol,
                                                   task.value)
                return True
        return await join_group_async(self, timeout_ms)

    join_pending_first._streammargin = True  # type: ignore[attr-defined]
    BaseCoordinator.need_rejoin = need_rejoin_or_pending
    BaseCoordinator.join_group_async = join_pending_first


def _listener(callbacks: RebalanceCallbacks) -> typing.Any:
    """kafka-python's rebalance listener around `callbacks` (kafka-python runs it inside `poll`
    and turns an exception into "User rebalance callback throws an error")."""
    from kafka import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: typing.Any) -> None:
            callbacks.revoked(revoked)

        def on_partitions_assigned(self, assigned: typing.Any) -> None:
            callbacks.assigned(assigned)

        def on_partitions_lost(self, lost: typing.Any) -> None:
            callbacks.lost(lost)

    return Listener()


def make_transport(name: str, settings: dict[str, dict]) -> Transport:
    """The transport called `name` (one of `TRANSPORTS`) over the worker's client settings."""
    if name == "kafka-python":
        return KafkaPythonTransport(settings)
    if name == "librdkafka":
        from connectors.kafka.librdkafka_transport import LibrdkafkaTransport

        return LibrdkafkaTransport(settings)
    raise ValueError(f"transport must be one of {TRANSPORTS}, got {name!r}")
