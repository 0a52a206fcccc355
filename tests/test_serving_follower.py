"""`ModelFollower`'s choice of the one model of a topic (topic scope), without a broker: the
checkpoints handed to it as a read of the checkpoint topic would bring them."""

from __future__ import annotations

import json
import time

from connectors.serving import ModelFollower
from connectors.state.checkpoint import LoadedCheckpoint
from connectors.task import PartitionTask
from connectors.worker.config import WorkerConfig

OPTIONS = dict(topics=["payments"], group_id="fraud", features=("*",), label_field="is_fraud",
               id_field="transaction_id", model_scope="topic")


class _Record:
    headers: list = []
    timestamp = 0

    def __init__(self, partition: int, offset: int, value: bytes):
        self.topic, self.partition, self.offset, self.key, self.value = (
            "payments", partition, offset, None, value)


class OneRead:
    """A checkpoint store whose first read brings the checkpoints given, then nothing."""

    def __init__(self, found: dict):
        self.found = found

    def partitions_of(self, topic: str) -> set[int]:
        return {0, 1}

    def follow(self, keys: list) -> dict:
        found, self.found = self.found, {}
        if not found:
            time.sleep(0.01)
        return found

    def close(self) -> None:
        pass


def checkpoint(partition: int, n: int) -> bytes:
    task = PartitionTask.new("payments", partition, WorkerConfig(**OPTIONS).task_settings())
    task.process([_Record(partition, i, json.dumps(
        {"transaction_id": f"t{i}", "amount": float(i % 97), "is_fraud": i % 97 > 60}).encode())
        for i in range(n)])
    return task.to_checkpoint()


def serves(found: dict) -> int:
    """The input partition whose checkpoint the follower serves after reading `found`."""
    follower = ModelFollower(WorkerConfig(**OPTIONS), store=OneRead(found))
    with follower:
        assert follower.wait_ready(timeout=30)  # (the read's one model decoded and swapped in)
    assert follower.counters.loaded == 1 and follower.counters.superseded == len(found) - 1
    assert list(follower.view.current) == [("payments", -1)]
    return follower.view.current[("payments", -1)].partition


def test_topic_scope_serves_the_checkpoint_written_last_on_a_checkpoint_topic_of_several():
    older = checkpoint(0, 300)
    time.sleep(0.01)  # (its written_at before the other's)
    newer = checkpoint(1, 900)
    # One partition of the checkpoint topic (the worker's): the later offset is the newer.
    assert serves({("payments", 0): LoadedCheckpoint("k0", older, "c", 0, 5, 0),
                   ("payments", 1): LoadedCheckpoint("k1", newer, "c", 0, 9, 0)}) == 1
    # Several: offsets of different partitions say nothing of which came last. The newer
    # checkpoint is on the lower partition, at the lower offset; it is still the one served.
    assert serves({("payments", 0): LoadedCheckpoint("k0", older, "c", 1, 9, 0),
                   ("payments", 1): LoadedCheckpoint("k1", newer, "c", 0, 5, 0)}) == 1
    assert serves({("payments", 0): LoadedCheckpoint("k0", older, "c", 0, 9, 0),
                   ("payments", 1): LoadedCheckpoint("k1", newer, "c", 1, 5, 0)}) == 1
