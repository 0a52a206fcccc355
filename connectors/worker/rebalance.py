"""The worker's side of a rebalance (`Rebalancing`, a part of `Worker`): partitions assigned are
paused in the callback and restored in the main loop, from their latest checkpoints (their
models, their pending events read again), then sought to their offsets and resumed; partitions
revoked are checkpointed first, partitions lost are dropped (their checkpoints hold them).
With --model-scope topic a restored task joins the topic's shared model as it is restored.

The methods run on `Worker`'s own attributes (its transport, tasks, store and status): this
module holds them so that worker.py holds the life cycle and the main loop.
"""

from __future__ import annotations

import logging
import time
import typing

from connectors.codec import UndecodableBatch
from connectors.serializers.schema_registry import RegistryUnavailable
from connectors.state import checkpoint as checkpoint_module
from connectors.task.partition import PartitionTask
from connectors.worker.config import TRANSACTION_TIMEOUT_MS
from connectors.worker.failures import WorkerError, _transaction_failure
from streammargin.errors import StateError

if typing.TYPE_CHECKING:
    from connectors.worker.worker import Worker

log = logging.getLogger("connectors.worker")  # (the name operators' filters know)


def _checkpoint_offset(loaded: typing.Any) -> int:
    """The next offset a loaded checkpoint's task starts at, read from its header alone (its
    arrays are neither read nor allocated); -1 when unreadable (the restore says why)."""
    from streammargin import state

    try:
        offset = state.peek(loaded.payload).get("next_offset")
    except StateError:
        return -1
    return offset if isinstance(offset, int) and not isinstance(offset, bool) else -1


class _Callbacks:
    """The worker's rebalance callbacks: the transport runs them inside `poll` (kafka-python on
    its IO thread, turning an exception into "User rebalance callback throws an error"); these
    never raise."""

    def __init__(self, worker: Worker):
        self.worker = worker

    def revoked(self, revoked: typing.Any) -> None:
        self.worker._on_revoked(revoked, lost=False)

    def assigned(self, assigned: typing.Any) -> None:
        self.worker._on_assigned(assigned)

    def lost(self, lost: typing.Any) -> None:
        self.worker._on_revoked(lost, lost=True)


class Rebalancing:
    """`Worker`'s rebalance handling: the callbacks' halves and the restores."""

    # Rebalance --------------------------------------------------------------------------------

    def _on_assigned(self, assigned: typing.Iterable) -> None:
        # Restoring reads checkpoints, which blocks and can fail: done by the main loop. Until
        # then the new partitions are paused, so no record of theirs is fetched.
        try:
            new = [tp for tp in assigned if tp not in self.tasks]
            self._idle_since = None
            self._member = True
            # An assignment is the coordinator's answer, just now (SyncGroup). kafka-python's
            # heartbeat clock does not count it: after Tansu's join hold (3 s on the demo's
            # session) the first turn as a member read the hold as an outage of a member.
            if self.contact is not None:
                self.contact.heard()
            if new:
                self._transport.pause(*new)
                self._unrestored.update(new)
            # (a label partition is restored with its task, and counted with it)
            self.status.assigned([tp for tp in new if tp.topic != self._label_topic])
        except Exception as error:  # never into kafka-python
            self._callback_error = error

    def _on_revoked(self, revoked: typing.Iterable, lost: bool) -> None:
        self._idle_since = None
        self._member = False  # until the assignment that follows
        try:
            revoked = list(revoked)
            self.status.revoked(revoked)
            self._unrestored.difference_update(revoked)
            tasks = [self.tasks[tp] for tp in revoked if tp in self.tasks]
            if not tasks:
                return
            contact = self.contact
            if not lost and not self._exactly_once and contact is not None and contact.in_outage:
                # kafka-python revokes when its own heartbeat clock says the session expired,
                # while no broker answers: the outputs, checkpoints and commit of a revocation
                # could not reach them, and waited out the producer's delivery timeout inside
                # poll (28 s measured; --max-outage and the outage lines waited with it). Lost,
                # as librdkafka says: the next owner resumes from the last checkpoint.
                lost = True
            if self._exactly_once and not self._failed:
                if lost:
                    # Another member may own them already: nothing of the open transaction may
                    # stand, and every task goes back to its last committed checkpoint.
                    from kafka.errors import KafkaError

                    try:
                        self._transport.abort_transaction()
                    except KafkaError as error:
                        raise _transaction_failure(error, self._transport.settings["producer"])
                    self._rewind("partitions lost (the group moved on without this member)")
                    self._unrestored.difference_update(revoked)
                    return
                for task in tasks:
                    self._publish_metrics(task, task.metrics_event("revoked"))
                # Committed before the partitions go, with the offsets of this generation (the
                # next owner's committed-offset fetch waits for it); every task's outputs are
                # in the transaction, so all are committed.
                if not self._commit_transaction():
                    self._unrestored.difference_update(revoked)
            elif not lost and not self._failed:
                for task in tasks:
                    self._publish_metrics(task, task.metrics_event("revoked"))
                # On kafka-python's IO thread: blocking commits are not allowed here, the commit
                # is sent asynchronously (the checkpoint, already flushed, restores the task).
                self._checkpoint(tasks, sync_commit=False)
            for task in tasks:
                tp = self._tp(task)
                self.tasks.pop(tp, None)
                if self._merge is not None:
                    self._merge.drop(tp)
                if task.next_offset is not None:
                    # Where it got to: a restore before it replays the records in between.
                    self._left_at[tp] = task.next_offset
                log.info("%s %s/%d", "lost" if lost else "revoked", tp.topic, tp.partition,
                         extra={"topic": tp.topic, "partition": tp.partition})
            self._apply_memory_shares()
        except Exception as error:  # never into kafka-python
            self._callback_error = error
            for tp in revoked:
                self.tasks.pop(tp, None)

    @staticmethod
    def _tp(task: PartitionTask) -> typing.Any:
        from kafka import TopicPartition

        return TopicPartition(task.topic, task.partition)

    def _prediction_partition(self, tp: typing.Any) -> int | None:
        # Predictions of an input partition stay in order in one output partition.
        if not self.config.predictions_topic:
            return None
        return tp.partition % self._prediction_partitions

    def _new_task(self, tp: typing.Any) -> PartitionTask:
        return PartitionTask.new(tp.topic, tp.partition, self.settings, codec=self.codec,
                                 prediction_partition=self._prediction_partition(tp))

    def _load_checkpoints(self, partitions: list) -> dict[typing.Any, typing.Any]:
        """The latest checkpoint of each partition that has one, a `LoadedCheckpoint` or a
        `RefusedCheckpoint` (the one place reading the checkpoint store)."""
        from kafka import TopicPartition

        store = self._store
        assert store is not None
        try:
            found = store.load([(tp.topic, tp.partition) for tp in partitions])
        except UndecodableBatch as error:
            raise WorkerError(
                f"cannot read the checkpoint topic {self.config.checkpoint_topic!r}: {error}. "
                f"Fix: {error.fix()}"
            ) from error
        except checkpoint_module.CheckpointError as error:
            raise WorkerError(f"{error}: check the broker and the checkpoint topic") from error
        return {TopicPartition(topic, partition): loaded
                for (topic, partition), loaded in found.items()}

    def _load_committed_checkpoints(self, partitions: list) -> dict[typing.Any, typing.Any]:
        """Exactly-once: the checkpoints that go with the group's committed offsets.

        The committed offsets are fetched first: read_committed, the broker answers only once no
        transaction (a previous owner's, a zombie's) holds them, so the checkpoints written in
        the same transaction are decided too. A checkpoint short of its committed offset is one
        whose commit marker has not reached the checkpoint topic yet: read again, for at most
        the transaction timeout.
        """
        consumer = self._transport
        committed = {tp: consumer.committed(tp) for tp in partitions}
        deadline = time.monotonic() + TRANSACTION_TIMEOUT_MS / 1000
        while True:
            saved = self._load_checkpoints(partitions)
            short = [tp for tp in partitions if committed[tp] is not None
                     and isinstance(saved.get(tp), checkpoint_module.LoadedCheckpoint)
                     and _checkpoint_offset(saved[tp]) < committed[tp]]
            if not short or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for tp in short:
            log.warning("%s/%d: the latest checkpoint is short of the committed offset %d: "
                        "outputs from its offset on are produced again", tp.topic, tp.partition,
                        committed[tp], extra={"topic": tp.topic, "partition": tp.partition})
        return saved

    def _restore_assigned(self) -> None:
        """Restore the tasks of newly assigned partitions, seek to their offsets, resume them."""
        consumer = self._transport
        assigned = consumer.assignment()
        partitions = sorted(tp for tp in self._unrestored if tp in assigned)
        self._unrestored.clear()
        label_partitions = []
        if self._label_topic is not None:
            label_partitions = [tp for tp in partitions if tp.topic == self._label_topic]
            partitions = [tp for tp in partitions if tp.topic != self._label_topic]
            self._check_assignment(assigned)
        if not partitions:
            if label_partitions:
                consumer.resume(*label_partitions)
            self.status.restored(())
            return
        started = time.monotonic()
        if self._exactly_once:
            saved = self._load_committed_checkpoints(partitions)
        else:
            saved = self._load_checkpoints(partitions)
        restored = 0
        sizes: dict[typing.Any, int] = {}
        for tp in partitions:
            loaded = saved.get(tp)
            if loaded is None:
                # No checkpoint: a fresh model starts where the group's committed offset (if
                # any) or auto_offset_reset says.
                task = self._new_task(tp)
            elif isinstance(loaded, checkpoint_module.RefusedCheckpoint):
                task = self._bad_checkpoint(tp, str(loaded))
            else:
                try:
                    task = PartitionTask.restore(
                        loaded.payload, tp.topic, tp.partition, self.settings, codec=self.codec,
                        prediction_partition=self._prediction_partition(tp),
                        segments=loaded.segments,
                    )
                    restored += 1
                    sizes[tp] = len(loaded.payload) + sum(map(len, loaded.segments.values()))
                except StateError as error:
                    where = (f"checkpoint {loaded.key} at {loaded.topic}/{loaded.partition}"
                             f"@{loaded.offset}")
                    task = self._bad_checkpoint(tp, f"{where} refused: {error}")
            if self.model_scope is not None:
                self.model_scope.join(task, self.tasks.values())
            self.tasks[tp] = task
            if task.rebuild_range() is not None:
                self._rebuild_pending(tp, task)
            if task.next_offset is not None:
                consumer.seek(tp, task.next_offset)
            if self._label_topic is not None:
                self._merge.drop(tp)  # type: ignore[union-attr]
                labels = self._tp_of(self._label_topic, tp.partition)
                if task.label_next_offset is not None:
                    consumer.seek(labels, task.label_next_offset)
                if labels not in label_partitions:
                    label_partitions.append(labels)
        consumer.resume(*partitions, *label_partitions)
        if self._registry_wait is not None:
            # (resumed with the others once the registry answers)
            consumer.pause(*partitions, *label_partitions)
        self._idle_since = None
        self._apply_memory_shares()
        self.status.restored((self.tasks[tp], sizes.get(tp)) for tp in partitions)
        self.input_watch.adopt(self.tasks[tp] for tp in partitions)
        names = [f"{tp.topic}/{tp.partition}" for tp in partitions]
        replayed = 0
        for tp in partitions:
            left_at, resumed = self._left_at.pop(tp, None), self.tasks[tp].next_offset
            if left_at is not None and resumed is not None and left_at > resumed:
                replayed += left_at - resumed
        log.info("assigned %s (%d restored from checkpoints, %d records to replay) in %.0f ms",
                 ", ".join(names), restored, replayed, 1000 * (time.monotonic() - started),
                 extra={"partitions": names, "restored": restored, "replayed": replayed})
        self._note_partition_scope(partitions)

    def _rebuild_pending(self, tp: typing.Any, task: PartitionTask) -> None:
        """Read the waiting events of a restored task's incremental checkpoint again, from the
        input topic (its offsets [first waiting, next offset), with the checkpoint reader),
        into its pending store. A Schema Registry that does not answer is waited for."""
        started = time.monotonic()
        waiting = task.pending.rebuilding
        store = self._store
        assert store is not None
        warned = False
        remaining = task.rebuild_range()
        start, stop = remaining  # type: ignore[misc]
        while remaining is not None:
            try:
                for batch in store.read_records(tp, remaining[0], stop):
                    task.rebuild_pending(batch)
                break
            except RegistryUnavailable as error:
                if not warned:
                    log.warning("%s/%d: restoring the events waiting for their label needs the "
                                "Schema Registry, which does not answer (%s): waiting for it",
                                tp.topic, tp.partition, error)
                    warned = True
                if self._stop.wait(1.0):
                    raise WorkerError("stopped while restoring the events waiting for their "
                                      f"label of {tp.topic}/{tp.partition}") from error
                remaining = task.rebuild_range()  # (from the first event not read again yet)
            except checkpoint_module.CheckpointError as error:
                raise WorkerError(f"{error}: check the broker and the input topic") from error
        lost = task.finish_rebuild()
        log.info("%s/%d: %d events waiting for their label read again from offsets [%d, %d) in "
                 "%.0f ms", tp.topic, tp.partition, waiting - lost, start, stop,
                 1000 * (time.monotonic() - started),
                 extra={"topic": tp.topic, "partition": tp.partition, "rebuilt": waiting - lost})
        if lost:
            log.warning("%s/%d: %d events waiting for their label are no longer on the input "
                        "topic (its retention) or no longer decode: their labels will find "
                        "nothing (counted as lost). Fix: keep the input topic's retention.ms "
                        "above the labels' delay", tp.topic, tp.partition, lost,
                        extra={"topic": tp.topic, "partition": tp.partition, "lost": lost})

    def _note_partition_scope(self, partitions: list) -> None:
        """Once per input topic of more than one partition, in partition scope: one line saying
        that each partition learns a P-th of the stream, and what learns one model instead.
        Spreading a drifting stream over 12 partitions costs 2-20 points of accuracy
        (benchmarks/model_scope_worker.py), and a user who scales a topic out would not know."""
        if self.config.model_scope != "partition":
            return
        for topic in sorted({tp.topic for tp in partitions} - self._scope_noted):
            self._scope_noted.add(topic)
            try:
                count = len(self._transport.partitions_for(topic) or ())
            except Exception:  # noqa: BLE001 (metadata unavailable: nothing to say)
                count = 0
            if count > 1:
                log.info("%s: each of its %d partitions trains a model of its own, on 1/%d of "
                         "the stream (--model-scope partition), which costs accuracy on a "
                         "drifting stream; --model-scope topic makes them learn one model "
                         "(docs/kafka.md, \"Model scope\")", topic, count, count,
                         extra={"topic": topic, "partitions": count})

    def _bad_checkpoint(self, tp: typing.Any, refusal: str) -> PartitionTask:
        """Apply `on_bad_checkpoint` to a checkpoint that cannot be restored; `refusal` says
        which record (key, checkpoint-topic partition and offset) and why."""
        config = self.config
        if config.on_bad_checkpoint == "fail":
            raise WorkerError(
                f"{refusal}. Nothing was committed. Fix: restart with "
                f"--on-bad-checkpoint reset to start {tp.topic}/{tp.partition} with a fresh model "
                "from the group's committed offset (or use another --group-id)"
            )
        consumer = self._transport
        task = self._new_task(tp)
        committed = consumer.committed(tp)
        if committed is not None:
            consumer.seek(tp, committed)
            start = f"the group's committed offset {committed}"
        else:
            if config.auto_offset_reset == "latest":
                consumer.seek_to_end(tp)
            else:
                consumer.seek_to_beginning(tp)
            start = f"auto_offset_reset={config.auto_offset_reset} (no committed offset)"
        log.error("%s. --on-bad-checkpoint reset: %s/%d starts a fresh model at %s",
                  refusal, tp.topic, tp.partition, start,
                  extra={"topic": tp.topic, "partition": tp.partition})
        return task
