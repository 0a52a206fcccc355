"""The record form's records read and predicted a request at a time, as the worker's batch path
reads a topic's (`connectors.task.batch`): `event_batches.c` reads each JSON record into a row
(its skeleton's shape, its numbers), and one compiled call of the served model
(`streammargin.progressive`) predicts the rows, with no Python dict per record.

A skeleton is what a record is without its numbers (its field names, strings and nesting). The
first record of a skeleton teaches it: the reader's `describe` checks that the codec's own
decoding of that record gives the features the skeleton's shape says (else the skeleton is
refused, and its records take the per-record path); the shape is then resolved against each
served version's model and scaler (`Shapes.add_for_prediction`, kept in the version's
`PredictionShapes`). A record this cannot take, for whatever reason (a dead letter, a field the
mapping leaves out, a label record, a value the model refuses, a skeleton not learnt yet, more
features than `--max-request-fields`), is left to the per-record path, which answers or names
the fault as it does without this module. Predictions are the per-record path's, bit for bit
(`tests/test_serving_record_rows.py`).

Bounded whatever the requests bring: at most `MAX_SKELETONS` skeletons of `MAX_SKELETON_BYTES`
bytes and `MAX_ENTRIES` shape entries in all are kept (past any, forgotten and learnt again), a
request teaches at most `LEARN_LIMIT` of them, and records are read `CHUNK_BYTES` (or
`CHUNK_RECORDS`) at a time into scratch arrays: `BYTES` in all, which
`connectors/serving/sizing.py` charges the process.
"""

from __future__ import annotations

import typing

import numpy as np

from connectors.codec import DeadLetter
from connectors.task.records import served_probability
from streammargin.progressive import Rows, Score, model_steps
from streammargin.jit import progressive as jit

__all__ = ["RecordRows", "record_rows_of"]

# `read_json`'s statuses (event_batches.c)
ROW, UNDECIDED, NEW_SHAPE, REFUSED, NEW_LABEL, FULL = range(6)


class RecordRows:
    """The skeletons and label texts learnt from requests, and the reading and prediction of a
    request's records with them (`predict`). Not thread-safe: `Scorer` calls it under its
    lock."""

    #: Skeletons kept, their bytes and their shapes' entries in all (past any, forgotten and
    #: learnt again); label texts kept, each of at most `MAX_LABEL_BYTES`.
    MAX_SKELETONS = 1024
    MAX_SKELETON_BYTES = 1 << 20
    MAX_ENTRIES = 16_384
    MAX_LABEL_BYTES = 256
    #: Records a request may teach (learning one costs about a record's per-record path).
    LEARN_LIMIT = 32
    #: Records and bytes of them read a call: the scratch arrays take at most about nine times
    #: the bytes (a float a byte for the numbers, the ids) and 56 bytes a record (the rows).
    CHUNK_RECORDS = 4096
    CHUNK_BYTES = 1 << 19
    #: What it holds at most: the skeletons, their shapes' entries (~200 bytes each), the
    #: label texts, a chunk's scratch arrays.
    BYTES = 10 << 20

    def __init__(self, reader: typing.Any, max_fields: int):
        self.reader = reader
        self.max_fields = max_fields
        self._forget()
        self.labels: dict[bytes, int] = {}
        for text in (b"true", b"false", b"null"):
            self._learn_label(text)

    def _forget(self) -> None:
        self.skeletons: dict[bytes, int] = {}  # skeleton -> index in `entries`, or -1 refused
        self.entries: list[tuple] = []  # each skeleton's shape: (name, hole, constant) each
        self.skeleton_bytes = self.entry_count = 0

    def predict(self, served: typing.Any, records: list[bytes], labels: list,
                probabilities: list) -> list[int]:
        """Predict with `served` (a `ServedVersion`) each of `records` it can take, putting its
        label and probability (P(True), or by class for a multiclass task, as
        `PartitionTask.predict` gives it) in `labels` and `probabilities` at the record's
        index; returns the indexes of the records left to the per-record path, in order."""
        task = served.task
        steps = model_steps(task.model)
        if steps is None:
            return list(range(len(records)))
        if served.shapes is None:
            from streammargin.progressive import PredictionShapes

            served.shapes = PredictionShapes(task.model, task.scaler)
        kept = served.shapes
        shapes, known = kept.current(task.model, task.scaler)
        left: list[int] = []
        learnt = [0]
        for start, end, size in self._chunks(records):
            status, table, holes = self._read(records, start, end, size, learnt)
            # This version's shape of each skeleton read (-1: the per-record path).
            indexes = np.unique(table[status == ROW, jit.ROW_SHAPE]) if len(table) else ()
            shape_of = np.full(len(self.entries) + 1, -1, np.int64)
            for index in indexes.tolist() if len(indexes) else ():
                entries = self.entries[index]
                shape = known.get((entries, None), -1)
                if shape == -1:
                    try:
                        shape = shapes.add_for_prediction(entries)
                    except (TypeError, ValueError):  # (a name without a safe state)
                        shape = None
                    known[(entries, None)] = shape
                    kept.holds(tuple(entry[0] for entry in entries))
                shape_of[index] = -1 if shape is None else shape
            rows_shape = np.where(status == ROW, table[:, jit.ROW_SHAPE], len(self.entries))
            resolved = shape_of[rows_shape]
            taken = np.flatnonzero(resolved >= 0)
            done = 0
            if len(taken):
                rows = table[taken]
                rows[:, jit.ROW_SHAPE] = resolved[taken]
                rows[:, jit.ROW_LABEL] = -1  # (predicted only: nothing is learnt)
                done, _, predicted = steps.run(task.scaler, shapes,
                                               Rows(None, table=rows, values=holes),
                                               Score.fresh(steps.n_classes))
                self._put(task, steps, (taken[:done] + start).tolist(), predicted, done,
                          labels, probabilities)
            untaken = np.ones(end - start, bool)
            untaken[taken[:done]] = False
            left.extend((np.flatnonzero(untaken) + start).tolist())
        kept.settle()
        return left

    def _put(self, task: typing.Any, steps: typing.Any, at: list[int], predicted: typing.Any,
             done: int, labels: list, probabilities: list) -> None:
        """The labels and probabilities of the rows predicted, at their records' indexes."""
        if steps.binary:
            signed = predicted[:done]
            ps = np.abs(signed)
            # `served_probability`'s check of P(True), over the rows at once
            if not ((ps >= 0.0) & (ps <= 1.0)).all():  # (also False for NaN: a bug, loudly)
                bad = ps[~((ps >= 0.0) & (ps <= 1.0))][0]
                raise ArithmeticError(f"the model gave the probability {float(bad)!r}")
            found_labels = (signed > 0.0).tolist()
            if task.multiclass:
                found_ps = [{False: 1.0 - p, True: p} for p in ps.tolist()]
            else:
                found_ps = ps.tolist()
        else:
            codes, proba = predicted
            classes = list(task.model._labels)
            width = len(classes)
            found_labels = [classes[code] if code >= 0 else None
                            for code in codes[:done].tolist()]
            found_ps = [served_probability(dict(zip(classes, row)), True)
                        for row in proba[:done, :width].tolist()]
        for i, y_pred, p in zip(at, found_labels, found_ps):
            labels[i] = y_pred
            probabilities[i] = p

    def _chunks(self, records: list[bytes]) -> typing.Iterator[tuple[int, int, int]]:
        """(start, end, bytes) of each run of records of at most `CHUNK_BYTES` bytes (or one
        record)."""
        sizes = list(map(len, records))
        total = sum(sizes)
        if total <= self.CHUNK_BYTES and len(records) <= self.CHUNK_RECORDS:
            yield 0, len(records), total
            return
        start = size = 0
        for i, length in enumerate(sizes):
            if i > start and (size + length > self.CHUNK_BYTES
                              or i - start >= self.CHUNK_RECORDS):
                yield start, i, size
                start, size = i, 0
            size += length
        if start < len(records):
            yield start, len(records), size

    def _read(self, records: list[bytes], start: int, end: int, size: int, learnt: list[int]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(status, rows, holes) of records[start:end] (`size` bytes), after learning the
        skeletons and label texts of the records not read for want of them (at most
        `LEARN_LIMIT` a request)."""
        n = end - start
        while True:
            status = np.empty(n, np.int8)
            table = np.empty((n, 3), np.int64)
            # (room for every record's most numbers and id: `read_json` never stops FULL)
            holes = np.empty(size + n + 1)
            ids = np.empty(size + 24 * n + 16, np.uint8)
            id_ends = np.empty(n, np.int64)
            read, _, _ = self.reader.read(records, start, end, self.skeletons,
                                          tuple(self.labels.items()), status, table, holes,
                                          ids, id_ends)
            status = status[:read]
            if read < n:  # (never: the arrays have room; the rest, per record)
                status = np.concatenate([status, np.full(n - read, UNDECIDED, np.int8)])
            taught = False
            for k in np.flatnonzero((status == NEW_SHAPE) | (status == NEW_LABEL)).tolist():
                if learnt[0] >= self.LEARN_LIMIT:
                    break
                learnt[0] += 1
                value = records[start + k]
                if status[k] == NEW_SHAPE:
                    taught |= self._learn(value)
                else:
                    text = self.reader.label_text(value)
                    taught |= text is not None and self._learn_label(text)
            if not taught:
                return status, table, holes

    def _learn(self, value: bytes) -> bool:
        """Learn the skeleton of a record; whether it learnt one."""
        skeleton, shape = self.reader.describe(value)
        if skeleton is None or skeleton in self.skeletons:
            return False  # (a record this cannot read, or a dead letter: per record)
        entries = () if shape is None else shape.entries
        if (len(self.skeletons) >= self.MAX_SKELETONS
                or self.skeleton_bytes + len(skeleton) > self.MAX_SKELETON_BYTES
                or self.entry_count + len(entries) > self.MAX_ENTRIES):
            self._forget()
        self.skeleton_bytes += len(skeleton)
        if shape is None or len(entries) > min(self.max_fields, self.MAX_ENTRIES):
            self.skeletons[skeleton] = -1
        else:
            self.skeletons[skeleton] = len(self.entries)
            self.entries.append(entries)
            self.entry_count += len(entries)
        return True

    def _learn_label(self, text: bytes) -> bool:
        """Learn a label's text the codec accepts (its code does not matter: rows are only
        predicted); whether it did."""
        if len(text) > self.MAX_LABEL_BYTES:
            return False
        try:
            self.reader.label(text)
        except DeadLetter:
            return False
        if len(self.labels) >= self.MAX_SKELETONS:
            self.labels.clear()
        self.labels[text] = 0
        return True


def record_rows_of(codec: typing.Any, max_fields: int) -> RecordRows | None:
    """The batch reading of `codec`'s records (None where the worker's batch reader does not
    read them: see `connectors.serializers.batches.batches_of`)."""
    from connectors.serializers.batches import JsonBatches, batches_of

    reader = batches_of(codec)
    if type(reader) is not JsonBatches:
        return None
    return RecordRows(reader, max_fields)
