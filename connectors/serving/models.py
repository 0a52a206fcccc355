"""The models a server answers with: each checkpoint decoded once (`ServedVersion`), the set
served at one moment (`ServingView`, immutable: a request reads one and sees no half of a
swap), which model answers a record (`ServingView.route`), and the scoring of a request's rows
(`Scorer`).

Scoring is the worker's own: the rows go through the codec of the worker's field mapping (the
record form as a topic's JSON record, a table row as its record's tree), then through the task
restored from the checkpoint (`PartitionTask.predict`: its scaler, its model, one call; the rows
a version answers in one compiled call, `PartitionTask.predict_many`, where its model has one),
so a request gets exactly the probabilities its record got, or would have got, on the topic from
that checkpoint.

Which model answers (partition scope, a model per input partition):

- a request pinned to a version (`/versions/{v}`): that checkpoint's model, for every row;
- a row with a key: the model of the partition the topic's producers give that key
  (`partitioner.partition_of`, over the input topic's partition count), as the worker's
  model of that partition scores the record; if that partition has no checkpoint yet, the
  unkeyed rule's model (said in the response's `parameters`);
- the request parameter `partition`: that partition's model;
- a row without a key: the model that has learnt from the most labelled records (ties: the
  lowest partition), a stable choice that changes only when another partition's model
  overtakes it, not with every checkpoint.

In topic scope every row of a topic gets the topic's one model: the newest checkpoint of any of
its partitions (each holds the worker's shared model, mixed with its peers', at that moment).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import typing

from connectors.codec import DeadLetter
from connectors.serving.partitioner import partition_of
from connectors.serving.protocol import Limits, RequestError, Rows
from connectors.serving.record_rows import record_rows_of
from connectors.task import PartitionTask
from connectors.task.records import served_probability
from streammargin.errors import InvalidInput
from streammargin.progressive import PredictionShapes

__all__ = ["ServedVersion", "ServingView", "Scorer", "Scored", "version_name", "TOPIC_MODEL"]

#: The partition number of a topic-scope model's slot: one model for every partition.
TOPIC_MODEL = -1
#: Rows of one version from which they are predicted in one compiled call (`predict_many`):
#: below it, the per-record call costs less than laying the rows out.
MANY_ROWS = 4


def version_name(checkpoint_partition: int, offset: int) -> str:
    """A checkpoint's version: its head record's offset on the checkpoint topic (which the
    worker creates with one partition), `<partition>-<offset>` on another partition of a
    checkpoint topic that has several."""
    return str(offset) if checkpoint_partition == 0 else f"{checkpoint_partition}-{offset}"


@dataclasses.dataclass(eq=False)
class ServedVersion:
    """One checkpoint decoded: the task it restores (its model and scaler answer; its pending
    labels and metrics are let go once read) and where it comes from."""

    version: str
    topic: str
    partition: int  # the input partition whose checkpoint it is
    task: PartitionTask
    checkpoint_offset: int
    checkpoint_bytes: int
    written_at: float  # the worker's clock when it wrote the checkpoint (Unix time)
    loaded_at: float
    next_offset: int | None  # the input offset the model had learnt up to
    labelled: int  # labelled records behind the model's metrics
    first_answer_at: float | None = None
    # The shapes of the rows predicted so far (`Scorer`'s, under its lock): the task learns
    # nothing once served, so they stay right.
    shapes: PredictionShapes | None = None

    @property
    def classes(self) -> list:
        """The classes of `predict_proba`'s columns: [False, True] for a binary model, the
        classes a multiclass model knows, in its order."""
        if not self.task.multiclass:
            return [False, True]
        model = self.task.model
        classes = getattr(model, "classes", None)
        if classes is None:
            classes = getattr(model, "classifiers", None) or ()
        return list(classes)

    def age(self, now: float | None = None) -> float:
        """Seconds since the worker wrote its checkpoint."""
        return max(0.0, (time.time() if now is None else now) - self.written_at)

    def describe(self) -> dict[str, typing.Any]:
        return {"version": self.version, "topic": self.topic, "partition": self.partition,
                "checkpoint_offset": self.checkpoint_offset, "written_at": self.written_at,
                "next_offset": self.next_offset, "labelled": self.labelled}


@dataclasses.dataclass(frozen=True)
class ServingView:
    """The models served at one moment: the follower builds a new view and swaps it in by one
    reference assignment; a request reads the view once, so it never sees half a swap."""

    scope: str
    topics: tuple[str, ...]
    partitioner: str
    # (topic, partition) -> its latest version; topic scope: (topic, TOPIC_MODEL)
    current: typing.Mapping[tuple[str, int], ServedVersion]
    # every version kept, by name
    versions: typing.Mapping[str, ServedVersion]
    # per topic, the model of requests without a key (see the module doc)
    unkeyed: typing.Mapping[str, ServedVersion]
    # per input topic, its partition count (for keys)
    partitions: typing.Mapping[str, int]

    @classmethod
    def empty(cls, scope: str, topics: typing.Sequence[str], partitioner: str) -> ServingView:
        return cls(scope, tuple(topics), partitioner, {}, {}, {}, {})

    def newest(self) -> ServedVersion | None:
        """The version written last, of every model served."""
        return max(self.current.values(), key=lambda v: v.written_at, default=None)

    def route(self, topic: str, key: bytes | None,
              partition: int | None) -> tuple[ServedVersion | None, str]:
        """The version that answers a row of `topic` with `key` (or the request's `partition`),
        and how it was chosen: "topic", "key", "partition", "unkeyed", or "unkeyed: ..." when a
        key's partition has no model yet."""
        if self.scope == "topic":
            return self.current.get((topic, TOPIC_MODEL)), "topic"
        if partition is not None:
            return self.current.get((topic, partition)), "partition"
        if key:
            count = self.partitions.get(topic)
            if count:
                number = partition_of(key, count, self.partitioner)
                found = self.current.get((topic, number))
                if found is not None:
                    return found, "key"
                return self.unkeyed.get(topic), f"unkeyed: partition {number} has no model yet"
        return self.unkeyed.get(topic), "unkeyed"


@dataclasses.dataclass
class Scored:
    """What a request's rows got: a label and a row of probabilities each (columns: `classes`),
    the versions that answered (in order of first use) and how each row's model was chosen."""

    labels: list
    probabilities: list[list[float]]
    classes: list
    versions: list[ServedVersion]
    routes: list[str]


class Scorer:
    """Scores rows with the worker's mapping and the served tasks' `predict`, one request at a
    time (`lock`: the codec's mapper and the models' caches are not thread-safe; the numeric
    core holds the GIL anyway).

    Parameters
    ----------
    codec
        The worker's codec of its field mapping, JSON (`TaskSettings.make_codec` for
        `--value-format json`): the record form's records, and a table's rows as trees.
    limits
        Records, fields and bytes a request may hold.

    """

    def __init__(self, codec: typing.Any, limits: Limits):
        self.codec = codec
        self.mapper = codec.mapper
        self.reads_key = bool(getattr(codec, "reads_key", False))
        self.limits = limits
        self.lock = threading.Lock()
        # The record form's records read and predicted in a few calls (None: the codec's
        # mapping is not one the worker's batch reader reads, or it is not built).
        self.record_rows = record_rows_of(codec, limits.max_fields)

    def score(self, view: ServingView, rows: Rows, pinned: ServedVersion | None = None,
              topic: str | None = None) -> Scored:
        """Each row's label and probabilities; `RequestError` naming the row and the fix for a
        row the worker would dead-letter, and 503 when no model can answer yet."""
        topic = rows.topic or topic or view.topics[0]
        if topic not in view.topics:
            raise RequestError(404, f"topic {topic[:100]!r} is not an input topic of this model: "
                                    f"give one of {', '.join(view.topics)} (--topic)")
        if rows.partition is not None and view.scope == "partition" and pinned is None and (
                (topic, rows.partition) not in view.current):
            have = sorted(p for t, p in view.current if t == topic)
            raise RequestError(404, f"partition {rows.partition} of {topic} has no model: "
                                    f"partitions with one: {have[:50]}")
        keys = rows.keys
        records, trees = rows.records, rows.trees
        n = len(records) if records is not None else len(trees or ())
        with self.lock:
            if n == 1:  # (a request's usual size: none of the loop's lists)
                key = None if keys is None else keys[0]
                x = self._features(0, records[0] if records is not None else trees[0], key,
                                   records is None)
                served, route = self._served(view, topic, key, rows.partition, pinned)
                found_labels, found_p = _predicted(served, [0], [x])
                return _scored(found_labels, found_p, [served], [route])
            if (records is not None and n >= MANY_ROWS and self.record_rows is not None
                    and not self.reads_key and (keys is None or pinned is not None
                                                or view.scope == "topic"
                                                or rows.partition is not None)):
                # Every row answered by one version: read and predicted a batch at a time.
                served, route = (pinned, "pinned") if pinned is not None else view.route(
                    topic, None, rows.partition)
                if served is not None:
                    return self._score_records(served, route, records)
            labels: list = [None] * n
            probabilities: list = [None] * n
            # The rows each version answers, in order: (row, features) by id(version).
            groups: dict[int, tuple[ServedVersion, list[int], list[dict]]] = {}
            routes: list[str] = [""] * n
            for i in range(n):
                key = None if keys is None else keys[i]
                x = self._features(i, records[i] if records is not None else trees[i], key,
                                   records is None)
                served, route = self._served(view, topic, key, rows.partition, pinned)
                routes[i] = route
                group = groups.get(id(served))
                if group is None:
                    group = groups[id(served)] = (served, [], [])
                group[1].append(i)
                group[2].append(x)
            for served, at, xs in groups.values():
                found_labels, found_p = _predicted(served, at, xs)
                for i, y_pred, p in zip(at, found_labels, found_p):
                    labels[i] = y_pred
                    probabilities[i] = p
        versions = {id(served): served for served, _, _ in groups.values()}
        return _scored(labels, probabilities, list(versions.values()), routes)

    def _features(self, i: int, row: typing.Any, key: bytes | None, tree: bool) -> dict:
        """The features of row `i` (a record's bytes, or a table row's tree) as the worker's
        codec decodes them; `RequestError` naming the row and the fix for one the worker would
        dead-letter or one without features."""
        try:
            if tree:
                found = self.mapper.event(row, key)
            else:
                found = self.codec.decode(row, key) if self.reads_key else self.codec.decode(row)
        except DeadLetter as error:
            raise RequestError(400, f"record {i}: {error}") from None
        x = found[1]
        if x is None:
            raise RequestError(400, f"record {i} has no features (only a label and an id: a "
                                    "label record): send the event's features")
        if len(x) > self.limits.max_fields:
            raise RequestError(400, f"record {i} has {len(x)} features, above the limit of "
                                    f"{self.limits.max_fields} (--max-request-fields)")
        return x

    @staticmethod
    def _served(view: ServingView, topic: str, key: bytes | None, partition: int | None,
                pinned: ServedVersion | None) -> tuple[ServedVersion, str]:
        """The version that answers a row and how it was chosen; 503 when none can yet."""
        if pinned is not None:
            return pinned, "pinned"
        served, route = view.route(topic, key, partition)
        if served is None:
            raise RequestError(503, "no model has been loaded yet: the workers have written no "
                                    "checkpoint this server could read (see /v2/health/ready)")
        return served, route

    def _score_records(self, served: ServedVersion, route: str,
                       records: list[bytes]) -> Scored:
        """`score` of the record form's rows, every one answered by `served`: those
        `RecordRows` takes in its compiled calls, the rest as `score` takes each."""
        n = len(records)
        labels: list = [None] * n
        probabilities: list = [None] * n
        left = self.record_rows.predict(served, records, labels, probabilities)
        if left:
            xs = [self._features(i, records[i], None, False) for i in left]
            found_labels, found_p = _predicted(served, left, xs)
            for i, y_pred, p in zip(left, found_labels, found_p):
                labels[i] = y_pred
                probabilities[i] = p
        return _scored(labels, probabilities, [served], [route] * n)


def _scored(labels: list, probabilities: list, used: list[ServedVersion],
            routes: list[str]) -> Scored:
    """The `Scored` of rows' labels and probabilities (P(True) each, or by class) from the
    versions `used`."""
    if not any(v.task.multiclass for v in used):
        classes = [False, True]
        rows_out = [[1.0 - p, p] for p in probabilities]
    else:
        classes = list(dict.fromkeys(c for v in used for c in v.classes))
        rows_out = [[float(p.get(c, 0.0)) for c in classes] for p in probabilities]
    return Scored(labels, rows_out, classes, used, routes)


def _predicted(served: ServedVersion, at: list[int], xs: list[dict]) -> tuple[list, list]:
    """The labels and probabilities (P(True) for a binary model, by class for a multiclass one)
    of the rows `at` (features `xs`), as `PartitionTask.predict` gives each: rows of one version
    in one compiled call (`PartitionTask.predict_many`, the same bits), a few rows one by one.
    `RequestError` naming the first row the model refuses."""
    task = served.task
    if len(xs) >= MANY_ROWS:
        if served.shapes is None:
            served.shapes = PredictionShapes(task.model, task.scaler)
        try:
            found_labels, probas = task.predict_many(xs, served.shapes)
        except InvalidInput:
            pass  # (the rows one by one name the row the model refuses)
        else:
            multiclass = task.multiclass
            return found_labels, [served_probability(proba, multiclass) for proba in probas]
    found_labels, ps = [], []
    for i, x in zip(at, xs):
        try:
            y_pred, p = task.predict(x)
        except InvalidInput as error:
            raise RequestError(400, f"record {i}: rejected by the model: {error}") from None
        found_labels.append(y_pred)
        ps.append(p)
    return found_labels, ps
