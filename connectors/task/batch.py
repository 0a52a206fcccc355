"""A partition task's batch steps: a run of records in a few calls over arrays.

The per-record path (`connectors.task.records`) takes a record through each stage in a Python
call per stage; on small records those calls are most of a record's time. `BatchSteps.process`
takes the same steps over a run of records at once:

1. read: the run's records (JSON, or Avro behind a registry) in one call
   (`connectors.serializers.batches`, `event_batches.c`): each record of a known skeleton
   becomes a row (its numbers, its id's JSON, its label's code);
2. scale, predict, learn, count: one compiled call (`streammargin.progressive`): the scaler,
   the model's prediction, the scaler's and the model's learning of a labelled row, the metrics
   and the drift detector, row after row in offset order;
3. write: the prediction records of the run (`write_predictions`), the events that wait for
   their label into the pending store, the counters.

A record the batch path cannot take goes the per-record way in its place in the offset order:
a record the reader cannot read or of a skeleton not learnt yet (its record then teaches the
skeleton: `_learn`), a label for a waiting event (no features), a record of the label topic, a
row the compiled call stops before (a value the model refuses); a task whose codec, model or
drift detector has no batch step takes every record that way. Runs shorter than `MIN_RUN` do
too (a stream of events and delayed labels, one after the other): the batch path's fixed cost
would exceed what it saves, and after a chunk without a run the reader rests (`_rest`), so such a
stream costs what it did. The outputs, the model, the scaler, the metrics and the pending store
are the per-record path's, bit for bit (`tests/test_batch_steps.py`).
"""

from __future__ import annotations

import json
import typing
from json.encoder import encode_basestring

import numpy as np

from connectors.codec import DeadLetter, label_json
from connectors.observability.metrics import label_key
from connectors.serializers.batches import batches_of
from connectors.task.output_records import TaskOutput
from connectors.task.records import RecordSteps
from streammargin.jit import progressive as jit
from streammargin.progressive import Rows, Shapes, model_steps, predict_many

__all__ = ["BatchSteps", "BatchPath", "CHUNK", "MIN_RUN"]

#: Records read a call.
CHUNK = 4096
#: A run of rows shorter than this takes the per-record path (see the module doc).
MIN_RUN = 8
#: The most skeletons a task keeps (their shapes and refusals): past it they are forgotten and
#: learnt again, so that a stream whose every record has a skeleton of its own (a free-text
#: category) cannot grow them without bound.
MAX_SKELETONS = 1024
#: After `REST_AFTER` records taken per record since the last run, the next this many records
#: (doubling up to `MAX_REST`, back to `FIRST_REST` after a run) take the per-record path
#: without being read.
REST_AFTER = 512
FIRST_REST, MAX_REST = 256, 16384
#: Records read after a record that taught a skeleton (doubling after each read with a run, up
#: to `CHUNK`).
FIRST_WINDOW = 64
#: Learning a skeleton costs about as much as a record's per-record path: the batch path learns
#: from at most `LEARN_LIMIT` records in a row, then one in `LEARN_EVERY` records.
LEARN_LIMIT, LEARN_EVERY = 16, 16

# `read_json`'s statuses (event_batches.c)
ROW, UNDECIDED, NEW_SHAPE, REFUSED, NEW_LABEL, FULL = range(6)


class BatchPath:
    """One task's batch path: its reader, its model's compiled steps, the shapes of its
    skeletons and the codes of its labels' texts."""

    def __init__(self, task: typing.Any, reader: typing.Any, writer: typing.Any):
        self.task = task
        self.reader = reader
        self._model = None
        self._scaler = None
        self._rest = 0  # records left to take per record without reading them
        self._next_rest = FIRST_REST
        self._since_run = 0  # records taken per record since the last run
        self._window = FIRST_WINDOW  # records a read takes
        self._learning = float(LEARN_LIMIT)  # records it may learn from now
        self._writer = writer  # predictions.c's module
        #: Records the batch path took (the rest took the per-record path).
        self.records_taken = 0
        self._prefix = task._prefix.encode()
        self._reset()

    def _reset(self) -> None:
        """Forget the shapes, the skeletons and the labels (a new model, or too many of them)."""
        task = self.task
        self._model, self._scaler = task.model, task.scaler
        self.steps = model_steps(task.model)
        if task.metrics.score([]) is None:
            self.steps = None  # a drift detector without a compiled update
        self.shapes = Shapes(task.model, task.scaler)
        self.skeletons: dict[bytes, int] = {}
        # skeleton -> the names learnt when it was refused for a name neither had learnt
        self._waiting: dict[bytes, tuple[int, int]] = {}
        self._codes: dict[bytes, int] = {}
        for text in (b"true", b"false", b"null"):
            self._learn_label(text)

    @property
    def classes(self) -> list:
        """The labels of the class codes (binary: False, True)."""
        return [False, True] if self.steps.binary else list(self._model._labels)

    def _known_names(self) -> tuple[int, int]:
        scaler = self._scaler
        return len(self._model._features.index), 0 if scaler is None else len(scaler._columns)

    # Learning skeletons and labels ------------------------------------------------------------

    def _learn(self, record: typing.Any) -> bool:
        """Learn the skeleton of a record the per-record path just took; whether its records
        are rows now."""
        if len(self.skeletons) >= MAX_SKELETONS:
            self.skeletons.clear()
            self._waiting.clear()
            self.shapes = Shapes(self._model, self._scaler)
        value = record.value
        if type(value) is not bytes:
            return False
        skeleton, shape = self.reader.describe(value)
        if skeleton is None or skeleton in self.skeletons:
            return False  # (not read, or a dead letter: the next record of it may teach it)
        found = None if shape is None else self.shapes.add(shape.entries)
        if found is None and shape is not None:  # a name not learnt yet: later, maybe
            self._waiting[skeleton] = self._known_names()
        self.skeletons[skeleton] = -1 if found is None else found
        return found is not None

    def _learn_label(self, text: bytes) -> bool:
        """Learn the class code of a label's text; whether it did."""
        try:
            y = self.reader.label(text)
        except DeadLetter:
            return False
        if y is None:
            code = -1
        elif self.steps is None:
            return False
        elif self.steps.binary:
            if y is not True and y is not False:
                return False
            code = int(y)
        else:
            code = self._model._label_index.get(y)
            if code is None or type(self._model._labels[code]) is not type(y):
                # Not a class yet (the per-record path learns it), or a class equal to it of
                # another type (1 and true): the prediction record gives the record's own.
                return False
        if len(self._codes) >= MAX_SKELETONS:
            self._codes.clear()
        self._codes[text] = code
        return True

    def _retry_waiting(self) -> None:
        """Skeletons refused for names the model or scaler had not learnt, learnt again once
        they have learnt names."""
        if self._waiting:
            known = self._known_names()
            retry = [s for s, names in self._waiting.items() if names != known]
            for skeleton in retry:
                del self._waiting[skeleton]
                self.skeletons.pop(skeleton, None)  # (gone already: its schema, say)

    # Processing -------------------------------------------------------------------------------

    def process(self, records: typing.Sequence[typing.Any], start: int,
                stop: typing.Callable[[], bool] | None, end: int, out: TaskOutput
                ) -> tuple[int, bool, str | None]:
        """`RecordSteps._records`' contract (see there), runs of rows in compiled calls."""
        task = self.task
        if task.model is not self._model or task.scaler is not self._scaler:
            self._reset()  # (a model replaced: --model-scope topic's mix)
        if self.steps is None:
            return task._records(records, start, stop, end, out)
        self._retry_waiting()
        label_topic = task.label_topic
        index = start
        while index < end:
            if stop is not None and stop():
                return index, False, None
            # Records the per-record path takes: stale ones (before the next offset), those of
            # the label topic, and those of a rest.
            chunk_end = min(end, index + CHUNK)
            per_record = index
            next_offset = task.next_offset
            while per_record < chunk_end and (
                    (next_offset is not None and records[per_record].offset < next_offset)
                    or (label_topic is not None and records[per_record].topic == label_topic)):
                per_record += 1
            if self._since_run >= REST_AFTER:
                self._rest = self._next_rest
                self._next_rest = min(2 * self._next_rest, MAX_REST)
                self._since_run = 0
            if self._rest > 0:
                per_record = max(per_record, min(chunk_end, index + self._rest))
            if per_record > index:
                before = index
                index, due, stalled = self._per_record(records, index, stop, per_record, out)
                self._rest = max(0, self._rest - (index - before))
                if due or stalled is not None:
                    return index, due == "drift", stalled
                continue
            if label_topic is not None:
                for k in range(index, chunk_end):
                    if records[k].topic == label_topic:
                        chunk_end = k
                        break
            index, due, stalled = self._chunk(records, index, stop, chunk_end, out)
            if due or stalled is not None:
                return index, due == "drift", stalled
        return index, False, None

    def _per_record(self, records: typing.Sequence[typing.Any], start: int,
                    stop: typing.Callable[[], bool] | None, end: int, out: TaskOutput
                    ) -> tuple[int, str | None, str | None]:
        """The per-record path over records[start:end]; returns where it stopped, the event due
        ("drift", "periodic" or None) and why it stalled."""
        task = self.task
        before = out.processed
        index, drift, stalled = task._records(records, start, stop, end, out)
        taken = out.processed - before
        self._since_run += taken
        self._learning = min(LEARN_LIMIT, self._learning + taken / LEARN_EVERY)
        if drift:
            return index, "drift", stalled
        if out.processed > before and task.n_records % task.settings.metrics_every == 0:
            return index, "periodic", stalled
        return index, None, stalled

    def _chunk(self, records: typing.Sequence[typing.Any], start: int,
               stop: typing.Callable[[], bool] | None, end: int, out: TaskOutput
               ) -> tuple[int, str | None, str | None]:
        """Read records[start:end] (at most `_window` of them) and take each run of rows in
        compiled calls, every other record per record, in order; after a record that taught a
        skeleton or a label, stop: the records after it are read again."""
        end = min(end, start + self._window)
        n = end - start
        if not isinstance(records, list):
            records = list(records)
        status = np.empty(n, np.int8)
        rows = np.empty((n, 3), np.int64)
        size = sum(len(records[i].value or b"") for i in range(start, end))
        holes = np.empty(size + n + 1)
        ids = np.empty(size + 24 * n + 16, np.uint8)
        id_ends = np.empty(n, np.int64)
        labels = tuple(self._codes.items())
        reader = self.reader
        read, _, _ = reader.read(records, start, end, self.skeletons, labels, status, rows, holes,
                                 ids, id_ends)
        status_list = status[:read].tolist()
        k = 0
        while k < read:
            run = k
            while run < read and status_list[run] == ROW:
                run += 1
            if run - k >= MIN_RUN:
                self._since_run = 0
                self._next_rest = FIRST_REST
                self._window = min(2 * self._window, CHUNK)
                index, due = self._run(records, start + k, rows[k:run], holes, ids, id_ends,
                                       k, out)
                k = index - start
                if due is not None:
                    return index, due, None
                if k < run:  # the compiled call stopped before this row: per record
                    index, due, stalled = self._per_record(records, start + k, stop,
                                                           start + k + 1, out)
                    if due or stalled is not None or reader.changed():
                        return index, due, stalled
                    k += 1
                continue
            if status_list[k] in (NEW_SHAPE, NEW_LABEL) and self._learning >= 1.0:
                # Per record, then learn from it; the records after it, read again, may be rows.
                index, due, stalled = self._per_record(records, start + k, stop, start + k + 1,
                                                       out)
                if index == start + k:
                    return index, due, stalled
                record = records[start + k]
                self._learning -= 1.0
                if status_list[k] == NEW_SHAPE:
                    learnt = self._learn(record)
                else:
                    learnt = self._learn_record_label(record)
                if due or stalled is not None or reader.changed():
                    return index, due, stalled
                k += 1
                if learnt:
                    self._window = FIRST_WINDOW
                    return start + k, None, None
                continue
            # Per record: up to the next run long enough, or record to learn from.
            last = k + 1
            while last < read:
                if status_list[last] == ROW:
                    tail = last
                    while tail < read and status_list[tail] == ROW:
                        tail += 1
                    if tail - last >= MIN_RUN:
                        break
                    last = tail
                elif status_list[last] in (NEW_SHAPE, NEW_LABEL) and self._learning >= 1.0:
                    break
                else:
                    last += 1
            index, due, stalled = self._per_record(records, start + k, stop, start + last, out)
            if due or stalled is not None or index < start + last or reader.changed():
                # (rows read before a record the per-record path took are read again where
                # that may have changed what they give: a schema the registry let go)
                return index, due, stalled
            k = last
        return start + read, None, None

    def _learn_record_label(self, record: typing.Any) -> bool:
        """Learn the label's text of a record the per-record path just took; whether it did."""
        text = self.reader.label_text(record.value)
        return text is not None and self._learn_label(text)

    def _run(self, records: typing.Sequence[typing.Any], first: int, rows: np.ndarray,
             holes: np.ndarray, ids: np.ndarray, id_ends: np.ndarray, row_start: int,
             out: TaskOutput) -> tuple[int, str | None]:
        """One compiled call over `rows` (those of records[first:]), up to the next metrics
        event; returns the index after the rows it took and the event due."""
        task = self.task
        metrics_every = task.settings.metrics_every
        count = min(len(rows), metrics_every - task.n_records % metrics_every)
        classes = self.classes
        score = task.metrics.score(classes)
        if score is None:
            return first, None  # (the per-record path: a detector without a compiled update)
        done, why, predicted = self.steps.run(task.scaler, self.shapes,
                                              Rows(None, table=rows[:count], values=holes),
                                              score)
        drift_offset = records[first + done - 1].offset if why == jit.DRIFT else None
        task.metrics.take_score(score, classes, drift_offset)
        if done == 0:
            return first, None
        self._write(records, first, done, rows[:done], ids, id_ends, row_start, predicted,
                    out)
        if why == jit.DRIFT:
            return first + done, "drift"
        if task.n_records % metrics_every == 0:
            return first + done, "periodic"
        return first + done, None

    def _write(self, records: typing.Sequence[typing.Any], first: int, n: int,
               rows: np.ndarray, ids: np.ndarray, id_ends: np.ndarray, row_start: int,
               predicted: typing.Any, out: TaskOutput) -> None:
        """The prediction records of rows [0, n) (records[first:first + n]: `predictions.c`),
        the events that wait for their label, the counters."""
        task = self.task
        predictions = out.predictions
        labels = np.ascontiguousarray(rows[:, jit.ROW_LABEL])
        if self.steps.binary:
            values, proba, classes = predicted, predicted, None
        else:
            values, proba = predicted
            classes = tuple((label_json(c).encode(), encode_basestring(label_key(c)).encode())
                            for c in self.classes)
        header_names = task._header_names
        before = len(predictions.values)
        unlabelled = self._writer.write_predictions(
            records, first, labels, values, proba, classes, self._prefix, ids, id_ends,
            row_start, task._copy_all, predictions.values, predictions.keys,
            predictions.headers, predictions.timestamps)
        if header_names is not None:  # (headers by name: kept as the per-record path keeps them)
            kept = predictions.headers
            for r in range(n):
                kept[before + r] = _kept(records[first + r].headers, header_names)
        unjoinable = 0
        for r, no_id in unlabelled:
            if no_id:
                unjoinable += 1
                continue
            at = row_start + r
            begin = int(id_ends[at - 1]) if at else 0
            event_id = json.loads(ids[begin:int(id_ends[at])].tobytes())
            if self.steps.binary:
                p = abs(float(predicted[r]))
                y_pred = predicted[r] > 0.0
            else:
                code = int(predicted[0][r])
                y_pred = self.classes[code] if code >= 0 else None
                p = dict(zip(self.classes, predicted[1][r, :len(self.classes)].tolist()))
            self._wait(records[first + r], event_id, bool(y_pred) if self.steps.binary
                       else y_pred, p)
        task.n_records += n
        task.n_predictions += n
        task.n_unjoinable += unjoinable
        task.since_checkpoint += n
        task.since_mix += n
        task.next_offset = records[first + n - 1].offset + 1
        out.processed += n
        self.records_taken += n

    def _wait(self, record: typing.Any, event_id: typing.Any, y_pred: typing.Any,
              p: typing.Any) -> None:
        """An event without its label into the pending store, as the per-record path puts it
        (its features decoded again: the store keeps them as the codec gives them)."""
        task = self.task
        if task._reads_key:
            _, x, _ = task.codec.decode(record.value, record.key)
        else:
            _, x, _ = task.codec.decode(record.value)
        task.pending.add(event_id, x, record.offset, record.timestamp, y_pred, p,
                         task._waiting_bytes(record.value, x, p))


def _writer() -> typing.Any:
    """predictions.c's module, where `streammargin warmup` built it."""
    from streammargin.jit import aot

    return aot.native("predictions")


def _kept(headers: typing.Any, names: frozenset) -> list | None:
    if not headers:
        return None
    kept = [header for header in headers if header[0] in names]
    return kept or None


class BatchSteps:
    """`PartitionTask`'s batch path (its `process`, where the task's codec, model and detector
    have batch steps), and its predictions of many feature dicts (`predict_many`)."""

    def predict_many(self, xs: typing.Sequence[dict], shapes: typing.Any = None
                     ) -> tuple[list, list[dict]]:
        """The label and the class probabilities the task would predict for each feature dict
        of `xs` (an event without a label: its scaler, category indicators passed unscaled,
        then its model), identical to its per-record prediction, in one compiled call where
        its model has one; nothing is learnt, counted or written. Raises what the per-record
        prediction raises for a bad value (`streammargin.InvalidInput`). `shapes`: a
        `streammargin.progressive.PredictionShapes` of this task's model and scaler, kept by a
        caller whose task learns nothing between calls (a server's checkpoint).

        >>> from connectors.task import PartitionTask, TaskSettings
        >>> task = PartitionTask.new("events", 0, TaskSettings(scale=True))
        >>> labels, probas = task.predict_many([{"a": 1.0}, {"a": 2.0, "country=BR": True}])
        >>> labels, sorted(probas[0])
        ([False, False], [False, True])
        """
        return predict_many(self.model, self.scaler, xs, indicators=self._split, shapes=shapes)

    _batch: BatchPath | None | bool = False  # (False: not looked for yet)

    def process(self, records: typing.Sequence[typing.Any], start: int = 0,
                stop: typing.Callable[[], bool] | None = None, end: int | None = None
                ) -> TaskOutput:
        """`RecordSteps.process`, the runs of rows in compiled calls (see the module doc)."""
        batch = self._batch
        if batch is False:
            reader = batches_of(self.codec)
            writer = _writer()
            batch = self._batch = (None if reader is None or writer is None
                                   else BatchPath(self, reader, writer))
        if batch is None:
            return RecordSteps.process(self, records, start, stop, end)
        out = self._output()
        index, drift, stalled = batch.process(
            records, start, stop, len(records) if end is None else end, out)
        return self._finish(out, index, drift, stalled)
