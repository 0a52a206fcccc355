"""--label-topic: labels on a topic of their own, co-partitioned with the input topic.

The label of an event on partition p of the input is on partition p of the label topic (as
Kafka Streams requires of the topics it joins: the same partition counts, the same key
partitioning). One task holds both partitions of a number (`PartitionTask`, with
`label_next_offset`), and `LabelMerge` hands it their records merged by record timestamp:

- while both partitions have records fetched, the earlier timestamp goes first (an event
  before a label of the same timestamp, so that the label finds it);
- when one has none fetched, the other goes on only if that one is caught up (its position at
  the log end of the last fetch): else the merge waits for its next fetch, and pauses a
  partition that holds more than `max_buffered` records meanwhile.

So the order is a function of the two logs alone wherever records are waiting on the broker (a
backlog, a replay after a crash): a restarted worker merges them as the uninterrupted one did,
and ends with its model. Live, a label merged once its partition caught up can come before an
event it trails by less than a fetch (Kafka Streams' max.task.idle.ms has the same limit).
"""

from __future__ import annotations

import collections
import typing

__all__ = ["LabelMerge", "co_partitioning_error"]


def co_partitioning_error(topic: str, events: int, label_topic: str, labels: int) -> str | None:
    """The refusal of topics that are not co-partitioned (None: they are)."""
    if events == labels:
        return None
    return (f"--label-topic {label_topic} has {labels} partitions and --topic {topic} has "
            f"{events}: a label must be on the partition of its event's number, so the two "
            "topics need the same count (as Kafka Streams requires of co-partitioned topics). "
            f"Fix: give {label_topic} {events} partitions (kafka-topics --alter --partitions), "
            "produced with the same key partitioner as the events")


class _Buffers:
    __slots__ = ("events", "labels")

    def __init__(self) -> None:
        self.events: collections.deque = collections.deque()
        self.labels: collections.deque = collections.deque()


class LabelMerge:
    """The records of each task's two partitions, merged (see the module doc).

    `caught_up(tp)` says whether a partition's position is at its log end; `pause(tp)` and
    `resume(tp)` pause and resume its fetching (the transport's).
    """

    def __init__(self, label_topic: str, caught_up: typing.Callable[[typing.Any], bool],
                 pause: typing.Callable[[typing.Any], None],
                 resume: typing.Callable[[typing.Any], None], max_buffered: int):
        self.label_topic = label_topic
        self._caught_up = caught_up
        self._pause = pause
        self._resume = resume
        self.max_buffered = max_buffered
        self._buffers: dict[typing.Any, _Buffers] = {}
        self._paused: set = set()

    def add(self, events_tp: typing.Any, records: list, labels: bool) -> None:
        """A poll's records of one partition (the label topic's if `labels`)."""
        buffers = self._buffers.get(events_tp)
        if buffers is None:
            buffers = self._buffers[events_tp] = _Buffers()
        (buffers.labels if labels else buffers.events).extend(records)

    def ready(self, events_tp: typing.Any, labels_tp: typing.Any) -> list:
        """The records of a task that may be processed now, in order; the rest wait."""
        buffers = self._buffers.get(events_tp)
        if buffers is None:
            return []
        events, labels = buffers.events, buffers.labels
        out = []
        while True:
            if events and labels:
                # An event before a label of the same time: the label then finds it waiting.
                if labels[0].timestamp < events[0].timestamp:
                    out.append(labels.popleft())
                else:
                    out.append(events.popleft())
            elif events:
                if not self._caught_up(labels_tp):
                    break
                out.extend(events)
                events.clear()
            elif labels:
                if not self._caught_up(events_tp):
                    break
                out.extend(labels)
                labels.clear()
            else:
                break
        for tp, held in ((events_tp, events), (labels_tp, labels)):
            if len(held) > self.max_buffered and tp not in self._paused:
                self._pause(tp)
                self._paused.add(tp)
            elif len(held) <= self.max_buffered and tp in self._paused:
                self._resume(tp)
                self._paused.discard(tp)
        return out

    def held(self) -> list[tuple[typing.Any, list]]:
        """(None, records) of each partition's records held back, first first."""
        return [(None, list(records)) for b in self._buffers.values()
                for records in (b.events, b.labels) if records]

    def waiting(self) -> int:
        """Records fetched and not handed out yet."""
        return sum(len(b.events) + len(b.labels) for b in self._buffers.values())

    def drop(self, events_tp: typing.Any) -> None:
        """Forget a task's records (revoked, rewound, stalled: they are fetched again)."""
        self._buffers.pop(events_tp, None)
        self._paused = {tp for tp in self._paused if tp.partition != events_tp.partition}

    def paused(self, tp: typing.Any) -> bool:
        return tp in self._paused
