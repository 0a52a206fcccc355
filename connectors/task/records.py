"""A partition task's per-record steps: the reference path.

`RecordSteps.process` (a part of `PartitionTask`) takes one record at a time through every
stage, in offset order: codec -> event (or a dead letter); the scaler (category indicators around
it); the model's prediction and probabilities; learning if labelled (or a delayed label joined by
id); the metrics and drift detector; a prediction record built by f-strings. Every other way of
processing a partition's records must give what this gives, byte for byte.
"""

from __future__ import annotations

import json
import typing
from json.encoder import encode_basestring

from connectors.codec import DeadLetter, label_json
from connectors.observability.metrics import label_key
from connectors.serializers.mapping import indicator_splitter, split_indicators
from connectors.serializers.schema_registry import RegistryRefused, RegistryUnavailable
from connectors.task.output_records import (
    STAGE_CODEC,
    STAGE_MODEL,
    OutputRecords,
    TaskFailure,
    TaskOutput,
    _kept_headers,
    _timestamp,
    dead_letter_headers,
    qualified_name,
)
from streammargin.errors import InvalidInput

__all__ = ["RecordSteps", "served_probability"]


def _json_id(event_id: typing.Any) -> str:
    if type(event_id) is str:
        return encode_basestring(event_id)
    if event_id is None:
        return "null"
    return json.dumps(event_id)


def _proba_json(proba: dict) -> str:
    """The class probabilities as a JSON object keyed by label (`label_key`); ArithmeticError
    for a probability that is not a number in [0, 1] (a bug in the model)."""
    parts = []
    for label, p in proba.items():
        if not 0.0 <= p <= 1.0:  # also False for NaN
            raise ArithmeticError(f"the model gave the probability {p!r} to class {label!r:.60}")
        parts.append(f"{encode_basestring(label_key(label))}:{float(p)!r}")
    return "{" + ",".join(parts) + "}"


def served_probability(proba: dict, multiclass: bool) -> typing.Any:
    """What a prediction serves of the class probabilities `proba`: P(True) for a binary model,
    the probabilities by class for a multiclass one; `ArithmeticError` for a probability that
    is not a number in [0, 1] (a bug in the model)."""
    if multiclass:
        for label, value in proba.items():
            if not 0.0 <= value <= 1.0:  # also False for NaN
                raise ArithmeticError(f"the model gave the probability {value!r} to class "
                                      f"{label!r:.60}")
        return proba
    p = proba.get(True, 0.0)
    if not 0.0 <= p <= 1.0:
        raise ArithmeticError(f"the model gave the probability {p!r}")
    return p


class RecordSteps:
    """`PartitionTask`'s per-record path (its state is the task's own attributes)."""

    def predict(self, x: dict) -> tuple[typing.Any, typing.Any]:
        """`(y_pred, p)` of an event of features `x` (as this task's codec decodes them), as
        `process` predicts an event without its label, learning nothing: the scaler's
        transform (category indicators, the features of value True, passed unscaled), then
        the model's label and probabilities from one call. `p` is P(True) for a binary
        model, the probabilities by class for a multiclass one. `streammargin serve` scores
        requests with it (connectors/serving), so that a request gets the probabilities its
        record would have got on the topic from the same checkpoint, bit for bit.
        `ArithmeticError` for a probability that is not a number in [0, 1] (a bug).

        Not thread-safe (the model's caches of the last encoding): one caller at a time.
        """
        scaler = self.scaler
        if scaler is None:
            scaled = x
        elif self._split and True in x.values():
            numbers, indicators = indicator_splitter()(x)
            scaled = scaler.transform_one(numbers)
            scaled.update(indicators)
        else:
            scaled = scaler.transform_one(x)
        model = self.model
        predict_with_proba = getattr(model, "predict_with_proba_one", None)
        if predict_with_proba is None:
            y_pred, p = model.predict_one(scaled), model.predict_proba_one(scaled)
        else:
            y_pred, p = predict_with_proba(scaled)
        return y_pred, served_probability(p, self.multiclass)

    def _learn_scaled(self, x: dict, y: typing.Any) -> None:
        # River's Pipeline order: the unsupervised scaler learns x, then the model learns the
        # freshly scaled x; `transform_learn_one` gives that scaling in the same pass (a delayed
        # label's record takes the compiled path like a labelled event's).
        indicators = None
        if self._split and True in x.values():  # (a waiting event's: no mapper count kept)
            x, indicators = split_indicators(x)
        _, scaled_after, update = self.scaler.transform_learn_one(x)
        self.scaler.apply_learn(update)
        if indicators:
            scaled_after.update(indicators)
        self.model.learn_one(scaled_after, y)

    def _dead_letter(self, out: OutputRecords, record: typing.Any, error: BaseException,
                     stage: str, executing_class: str) -> None:
        """The input record as it came (key, value, timestamp, headers), plus Connect's error
        headers after its own, as Connect's dead-letter queue writes them."""
        self.n_dead_letters += 1
        headers = list(record.headers or ())
        headers += dead_letter_headers(
            self.topic, self.partition, record.offset, self.settings.group_id, stage,
            executing_class, qualified_name(type(error)), str(error),
        )
        out.append(record.value, record.key, headers, _timestamp(record))

    def process(
        self,
        records: typing.Sequence[typing.Any],
        start: int = 0,
        stop: typing.Callable[[], bool] | None = None,
        end: int | None = None,
    ) -> TaskOutput:
        """Predict, learn and count `records[start:end]` (in offset order; `end` None: to the
        last record); returns the outputs.

        Returns early, right after a record that produced a metrics event (so the caller sees
        each event before later records are processed), or before a record when `stop()` says
        so: carry on with `process(records, output.end)`. Records before the task's next offset
        are skipped (stale data after a seek). Raises `TaskFailure` if a record breaks the model
        or codec in an undocumented way.
        """
        out = self._output()
        index, drift, stalled = self._records(
            records, start, stop, len(records) if end is None else end, out)
        return self._finish(out, index, drift, stalled)

    def _output(self) -> TaskOutput:
        return TaskOutput(OutputRecords(self.prediction_partition), OutputRecords())

    def _finish(self, out: TaskOutput, index: int, drift: bool, stalled: str | None
                ) -> TaskOutput:
        """`out` with the metrics events due after its last record: a drift, every
        `metrics_every` records."""
        if drift:
            out.metrics.append(self.metrics_event("drift"))
        if out.processed and self.n_records % self.settings.metrics_every == 0:
            out.metrics.append(self.metrics_event("periodic"))
        out.end = index
        out.stalled = stalled
        return out

    def _records(self, records: typing.Sequence[typing.Any], start: int,
                 stop: typing.Callable[[], bool] | None, end: int, out: TaskOutput
                 ) -> tuple[int, bool, str | None]:
        """The per-record steps of `records[start:end]` into `out` (see `process`), until a
        metrics event is due: returns the index where they stopped, whether the detector fired
        on the last record, and why they stalled (the Schema Registry does not answer)."""
        predictions = out.predictions
        emit = predictions.values.append
        emit_key = predictions.keys.append
        emit_headers = predictions.headers.append
        emit_timestamp = predictions.timestamps.append
        copy_all = self._copy_all
        header_names = self._header_names
        dead_letters = out.dead_letters
        decode = self.codec.decode
        reads_key = self._reads_key
        label_topic = self.label_topic
        decode_label = getattr(self.codec, "decode_label", None) if label_topic else None
        label_next_offset = self.label_next_offset
        split = indicator_splitter() if self._split else None
        mapper = self._indicator_mapper
        prefix = self._prefix
        model = self.model
        scaler = self.scaler
        multiclass = self.multiclass
        # The label is predict_one's and the probability predict_proba_one's, as in River's
        # progressive validation: a model's decision rule need not be the argmax of its
        # probabilities (ours may pick the raw score's sign). Our models give both from one
        # encoding and one score (`predict_with_proba_one`); other models take both calls.
        predict_with_proba = getattr(model, "predict_with_proba_one", None)
        if predict_with_proba is None:
            predict_one, predict_proba_one = model.predict_one, model.predict_proba_one

            def predict_with_proba(x: dict) -> tuple:
                return predict_one(x), predict_proba_one(x)
        learn = model.learn_one if scaler is None else self._learn_scaled
        learn_model = model.learn_one
        if scaler is not None:
            transform_learn = scaler.transform_learn_one
            apply_learn = scaler.apply_learn
        update_metrics = (self.metrics.update_multiclass if multiclass
                          else self.metrics.update)
        pending = self.pending
        waiting_bytes = self._waiting_bytes
        metrics_every = self.settings.metrics_every
        next_offset = self.next_offset
        n_records = self.n_records
        n_predictions = self.n_predictions
        n_unjoinable = self.n_unjoinable
        n_done = 0
        drift = False
        stalled = None
        index = start
        while index < end:
            record = records[index]
            offset = record.offset
            is_label = label_topic is not None and record.topic == label_topic
            if is_label:
                if label_next_offset is not None and offset < label_next_offset:
                    index += 1
                    continue
            elif next_offset is not None and offset < next_offset:
                index += 1
                continue  # already processed (stale fetch data after a seek)
            if stop is not None and stop():
                break
            index += 1
            try:
                if is_label:
                    if decode_label is None:
                        raise TypeError(f"the codec {type(self.codec).__name__} has no "
                                        "decode_label: it cannot read --label-topic records")
                    event_id, y = decode_label(record.value, record.key)
                    # A label's age counts the events of this partition (its own offsets are
                    # another partition's).
                    entry = pending.pop(event_id, next_offset or 0, record.timestamp)
                    if entry is not None:
                        learn(entry[0], y)
                        drift = update_metrics(y, entry[3], entry[4], next_offset or 0)
                else:
                    if reads_key:
                        event_id, x, y = decode(record.value, record.key)
                    else:
                        event_id, x, y = decode(record.value)
                    if x is None:
                        entry = pending.pop(event_id, offset, record.timestamp)
                        if entry is not None:
                            learn(entry[0], y)
                            drift = update_metrics(y, entry[3], entry[4], offset)
                    else:
                        if scaler is None:
                            scaled = x
                        elif split is not None and mapper.indicators:
                            numbers, indicators = split(x)
                            if y is None:
                                scaled = scaler.transform_one(numbers)
                            else:
                                scaled, scaled_after, update = transform_learn(numbers)
                                # (the scaler's dicts are its own, made for this record)
                                scaled_after.update(indicators)
                            scaled.update(indicators)
                        elif y is None:
                            scaled = scaler.transform_one(x)
                        else:
                            # River's pipeline: predict on x scaled before learning it, learn on x
                            # scaled after; both in one pass, the scaler learns once predicted.
                            scaled, scaled_after, update = transform_learn(x)
                        y_pred, p = predict_with_proba(scaled)
                        if multiclass:
                            proba_json = _proba_json(p)
                        else:
                            p = p.get(True, 0.0)
                            if not 0.0 <= p <= 1.0:  # also False for NaN
                                raise ArithmeticError(f"the model gave the probability {p!r}")
                        if y is not None:
                            if scaler is None:
                                learn(x, y)
                            else:
                                apply_learn(update)
                                learn_model(scaled_after, y)
                            drift = update_metrics(y, y_pred, p, offset)
                        elif event_id is not None:
                            pending.add(event_id, x, offset, record.timestamp, y_pred, p,
                                        waiting_bytes(record.value, x, p))
                        else:
                            n_unjoinable += 1
                        n_predictions += 1
                        id_json = (
                            encode_basestring(event_id) if type(event_id) is str
                            else _json_id(event_id)
                        )
                        if multiclass:
                            emit((
                                f'{prefix}{offset},"id":{id_json},"y_pred":{label_json(y_pred)},'
                                f'"proba":{proba_json},"y":{label_json(y)}}}'
                            ).encode())
                        else:
                            emit((
                                f'{prefix}{offset},"id":{id_json},'
                                f'"y_pred":{"true" if y_pred else "false"},"p_true":{float(p)!r},'
                                f'"y":{"null" if y is None else "true" if y else "false"}}}'
                            ).encode())
                        # Kafka's conventions: the input's key, timestamp and headers.
                        emit_key(record.key)
                        timestamp = record.timestamp
                        emit_timestamp(timestamp if timestamp is not None and timestamp >= 0
                                       else None)
                        emit_headers(record.headers if copy_all else None if header_names is None
                                     else _kept_headers(record.headers, header_names))
            except RegistryUnavailable as error:
                # Not the record's fault: it waits, unconsumed, for the registry.
                index -= 1
                stalled = str(error)
                break
            except RegistryRefused:
                raise  # the credentials: the worker stops with the fix
            except DeadLetter as error:
                self._dead_letter(dead_letters, record, error, STAGE_CODEC, self._codec_class)
            except InvalidInput as error:
                # The model's documented rejection (it is left untouched): a dead letter.
                self._dead_letter(dead_letters, record, error, STAGE_MODEL, self._model_class)
            except Exception as error:
                raise TaskFailure(record.topic, record.partition, offset, error) from error
            if is_label:
                label_next_offset = offset + 1  # (a dead letter of the label topic)
            else:
                next_offset = offset + 1
            n_done += 1
            n_records += 1
            if drift or n_records % metrics_every == 0:
                break
        self.next_offset = next_offset
        self.label_next_offset = label_next_offset
        self.n_records, self.n_predictions = n_records, n_predictions
        self.n_unjoinable = n_unjoinable
        self.since_checkpoint += n_done
        self.since_mix += n_done
        out.processed += n_done
        return index, drift, stalled

