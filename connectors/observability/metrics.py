"""Progressive-validation metrics of a partition's model, and the drift detector on its errors.

Each labelled prediction (test-then-train, or a delayed label joined to its event) updates:

- accuracy so far, equal to River's `metrics.Accuracy` of the same predictions;
- accuracy over a rolling window of the last `rolling_window` labelled predictions, equal to
  `utils.Rolling(metrics.Accuracy, window_size=rolling_window)`;
- log loss with River's arithmetic, to the last bit: `metrics.LogLoss` of the probability of True
  for a binary model (`update`), `metrics.CrossEntropy` of the class probabilities for a
  multiclass one (`update_multiclass`); probabilities are clamped to [1e-15, 1 - 1e-15];
- per class: the labels (support), the predictions and the correct ones, hence each class's F1
  (River's arithmetic) and their mean, River's `metrics.MacroF1` with an exactly rounded sum
  (see `PartitionMetrics.macro_f1`);
- a River drift detector fed with the error stream (1.0 for a mistake, 0.0 otherwise): any
  detector of `connectors.state.river_state.DETECTORS` by name; the worker's default is DDM with
  `TUNED_PARAMS` (chosen by `benchmarks/drift_detectors.py`).

As in River's progressive validation, a label whose prediction was None (a multiclass model that
had no class yet) counts in none of these (`unscored`), and an empty probability dict in no log
loss.

Everything here is plain numbers plus the detector, saved in the partition's checkpoint
(`to_state` / `from_state`, every field validated on restore: a checkpoint is untrusted input), so
a restored task reports the same metrics an uninterrupted one would. The classes are bounded by
`max_classes` (the model's): a label beyond it is left out of the per-class counts and counted in
`classes_untracked` (a model with `max_classes` refuses such labels before they get here).
"""

from __future__ import annotations

import collections
import math
import time
import typing

import numpy as np

from connectors.codec import label_from_state, label_to_state
from connectors.state import river_state
from streammargin.errors import StateError

__all__ = [
    "PartitionMetrics",
    "Throughput",
    "TUNED_PARAMS",
    "make_detector",
    "detector_names",
    "detector_params",
    "label_key",
    "MAX_CLASSES",
    "MAX_REPORTED_CLASSES",
]

# Bounds of a partition's metrics (checked before a restore allocates anything).
MAX_ROLLING_WINDOW = 1 << 24
MAX_KEEP_DETECTIONS = 1 << 16
MAX_CLASSES = 100_000  # the largest max_classes a model takes
# A metrics record lists at most this many classes (those with the most labels): the record must
# stay far below a broker's message size limit.
MAX_REPORTED_CLASSES = 1000
_MAX_COUNT = 2**53  # counts are also kept as floats (the log loss mean's n)
_MAX_LOG_LOSS = -math.log(1e-15)  # probabilities are clamped to [1e-15, 1 - 1e-15]


#: The worker's settings of a detector where they differ from River's defaults; parameters given
#: explicitly win. DDM, the worker's default detector, waits for 1000 records (River: 30) and
#: fires at 4 standard deviations above its best error rate (River: 3): in
#: benchmarks/drift_detectors.py it raised no false alarm on 1.35M records of stationary error
#: streams and 0.5 per 100k around real concept changes (River's ADWIN: 2.1 per 100k on the
#: stationary ones, 4.0 around the changes), and missed no change, with a median delay of 829
#: records after a real concept change (ADWIN: 159).
TUNED_PARAMS: dict[str, dict[str, typing.Any]] = {
    "DDM": {"warm_start": 1000, "drift_threshold": 4.0},
}


def detector_names() -> dict[str, type]:
    """Lower-case name -> class of the drift detectors a worker offers ("adwin", "kswin", ...):
    those whose state a checkpoint may hold (`river_state.DETECTORS`), and "none" for NoDrift."""
    names = {name.lower(): cls for name, cls in river_state.DETECTORS.items()}
    names["none"] = names["nodrift"]
    return names


def make_detector(name: str = "adwin", params: dict | None = None) -> typing.Any:
    """A River drift detector by (case-insensitive) class name, e.g. `make_detector("ADWIN")`.

    The parameters given complete `TUNED_PARAMS` for the class, then River's defaults. They are
    checked as a checkpoint's are (`river_state.check_detector_params`), so a detector the worker
    builds can always be saved and restored.

    >>> detector_params(make_detector("ddm"))
    {'warm_start': 1000, 'warning_threshold': 2.0, 'drift_threshold': 4.0}
    >>> detector_params(make_detector("ddm", {"drift_threshold": 3.0}))
    {'warm_start': 1000, 'warning_threshold': 2.0, 'drift_threshold': 3.0}
    """
    key = name.lower().replace("_", "").replace("-", "")
    cls = detector_names().get(key)
    if cls is None:
        raise ValueError(
            f"unknown drift detector {name!r}; known: {', '.join(sorted(detector_names()))}"
        )
    class_name = next(n for n, c in river_state.DETECTORS.items() if c is cls)
    params = {**TUNED_PARAMS.get(class_name, {}), **(params or {})}
    return cls(**river_state.check_detector_params(class_name, params, complete=False))


def detector_params(detector: typing.Any) -> dict[str, typing.Any]:
    """The constructor parameters of a detector of `detector_names()`, as JSON values: what a
    metrics record reports beside the detector's name, so a detection says which settings fired.

    >>> detector_params(make_detector("adwin", {"delta": 0.001}))
    {'delta': 0.001, 'clock': 32, 'max_buckets': 5, 'min_window_length': 5, 'grace_period': 10}

    """
    name = next((n for n, cls in river_state.DETECTORS.items() if type(detector) is cls), None)
    if name is None:  # not one the worker offers: its class name is all a record can say
        return {}
    keys = river_state.check_detector_params(name, {}, complete=False)
    return {key: getattr(detector, key) for key in keys}


def label_key(label: typing.Any) -> str:
    """A label as the key of a JSON object (`proba`, `per_class`): strings as they are, booleans
    as "true"/"false", integers in decimal."""
    if type(label) is str:
        return label
    if label is True:
        return "true"
    if label is False:
        return "false"
    return str(label)


def _clamp(p: float) -> float:
    # River's utils.math.clamp(p, 1e-15, 1 - 1e-15)
    return max(min(p, 1.0 - 1e-15), 1e-15)


class PartitionMetrics:
    """Progressive-validation metrics and drift detection of one partition's model.

    Parameters
    ----------
    rolling_window
        Number of most recent labelled predictions of the rolling accuracy.
    detector
        A River drift detector fed with the error stream; `None` means ADWIN().
    keep_detections
        How many of the most recent detection offsets to report.
    max_classes
        At most this many classes are counted per class (the model's `max_classes`).

    Examples
    --------

    >>> metrics = PartitionMetrics(rolling_window=2)
    >>> for offset, (y, p_true) in enumerate([(True, 0.9), (False, 0.8), (False, 0.3)]):
    ...     _ = metrics.update(y, p_true > 0.5, p_true, offset)
    >>> metrics.accuracy, metrics.rolling_accuracy, round(metrics.log_loss, 6)
    (0.6666666666666666, 0.5, 0.690491)
    >>> metrics.macro_f1
    0.6666666666666666

    A multiclass model's predictions come with their class probabilities:

    >>> metrics = PartitionMetrics()
    >>> _ = metrics.update_multiclass("sky", None, {}, 0)  # no class yet: not scored
    >>> _ = metrics.update_multiclass("path", "sky", {"sky": 1.0}, 1)
    >>> _ = metrics.update_multiclass("sky", "sky", {"sky": 0.6, "path": 0.4}, 2)
    >>> metrics.accuracy, metrics.unscored, round(metrics.log_loss, 6), metrics.macro_f1
    (0.5, 1, 0.255413, 0.3333333333333333)

    """

    def __init__(
        self,
        rolling_window: int = 1000,
        detector: typing.Any = None,
        keep_detections: int = 100,
        max_classes: int = MAX_CLASSES,
    ):
        if type(rolling_window) is not int or not 1 <= rolling_window <= MAX_ROLLING_WINDOW:
            raise ValueError(
                f"rolling_window must be an int in [1, {MAX_ROLLING_WINDOW}], "
                f"got {rolling_window!r}"
            )
        if type(keep_detections) is not int or not 0 <= keep_detections <= MAX_KEEP_DETECTIONS:
            raise ValueError(
                f"keep_detections must be an int in [0, {MAX_KEEP_DETECTIONS}], "
                f"got {keep_detections!r}"
            )
        if type(max_classes) is not int or not 2 <= max_classes <= MAX_CLASSES:
            raise ValueError(f"max_classes must be an int in [2, {MAX_CLASSES}], "
                             f"got {max_classes!r}")
        self.rolling_window = rolling_window
        self.max_classes = max_classes
        self.detector = detector if detector is not None else make_detector("adwin")
        self.n_labelled = 0  # scored labels: the accuracy's denominator
        self.n_correct = 0
        self.n_unscored = 0
        # River's stats.Mean, written out: n as a float, mean += (1 / n) (x - mean).
        self._loss_n = 0.0
        self._loss_mean = 0.0
        self._window = bytearray(rolling_window)  # 1 = correct, ring buffer
        self._window_pos = 0
        self._window_correct = 0
        # Per class, in order of first appearance.
        self._support: dict[typing.Any, int] = {}
        self._predicted: dict[typing.Any, int] = {}
        self._correct: dict[typing.Any, int] = {}
        self._classes: set = set()
        self.n_untracked = 0
        self.n_detections = 0
        self.detections: collections.deque[int] = collections.deque(maxlen=keep_detections)

    def _tracked(self, label: typing.Any) -> bool:
        """Whether `label` is counted per class (it is, while there is room for a new class)."""
        classes = self._classes
        if label in classes:
            return True
        if len(classes) < self.max_classes:
            classes.add(label)
            return True
        return False

    def _count(self, y_true: typing.Any, y_pred: typing.Any, correct: int) -> None:
        support, predicted = self._support, self._predicted
        n = support.get(y_true)
        if n is not None:
            support[y_true] = n + 1
        elif self._tracked(y_true):
            support[y_true] = 1
        else:
            self.n_untracked += 1
        n = predicted.get(y_pred)
        if n is not None:
            predicted[y_pred] = n + 1
        elif self._tracked(y_pred):
            predicted[y_pred] = 1
        else:
            self.n_untracked += 1
        if correct and y_true in support:
            self._correct[y_true] = self._correct.get(y_true, 0) + 1

    def _scored(self, correct: int, offset: int) -> bool:
        self.n_labelled += 1
        self.n_correct += correct
        window = self._window
        pos = self._window_pos
        self._window_correct += correct - window[pos]
        window[pos] = correct
        self._window_pos = pos + 1 if pos + 1 < self.rolling_window else 0
        detector = self.detector
        detector.update(0.0 if correct else 1.0)
        if detector.drift_detected:
            self.n_detections += 1
            self.detections.append(offset)
            return True
        return False

    def _loss(self, loss: float) -> None:
        self._loss_n += 1.0
        self._loss_mean += (1.0 / self._loss_n) * (loss - self._loss_mean)

    def update(self, y_true: bool, y_pred: bool, p_true: float, offset: int) -> bool:
        """Count one labelled prediction of a binary model (`p_true`: its probability of True);
        True when the detector reports a drift on it."""
        correct = 1 if y_true == y_pred else 0
        self._count(y_true, y_pred, correct)
        p_true = _clamp(p_true)
        self._loss(-math.log(p_true) if y_true else -math.log(1.0 - p_true))
        return self._scored(correct, offset)

    def update_multiclass(self, y_true: typing.Any, y_pred: typing.Any, proba: dict,
                          offset: int) -> bool:
        """Count one labelled prediction of a multiclass model (`proba`: its class
        probabilities); True when the detector reports a drift on it."""
        if proba:  # River's CrossEntropy; a class the model does not know yet costs nothing
            p = proba.get(y_true)
            self._loss(0.0 if p is None else -math.log(_clamp(p)))
        if y_pred is None:
            self.n_unscored += 1
            return False
        correct = 1 if y_true == y_pred else 0
        self._count(y_true, y_pred, correct)
        return self._scored(correct, offset)

    @property
    def accuracy(self) -> float | None:
        return self.n_correct / self.n_labelled if self.n_labelled else None

    @property
    def rolling_accuracy(self) -> float | None:
        n = min(self.n_labelled, self.rolling_window)
        return self._window_correct / n if n else None

    @property
    def log_loss(self) -> float | None:
        return self._loss_mean if self._loss_n else None

    @property
    def unscored(self) -> int:
        return self.n_unscored

    def _f1(self, label: typing.Any) -> float | None:
        """River's per-class F1 of MacroF1 (None where River skips the class: no precision and
        no recall)."""
        tp = float(self._correct.get(label, 0))
        try:
            p = tp / float(self._predicted.get(label, 0))
        except ZeroDivisionError:
            p = 0
        try:
            r = tp / float(self._support.get(label, 0))
        except ZeroDivisionError:
            r = 0
        b2 = 1.0
        try:
            return (1 + b2) * p * r / (b2 * p + r)
        except ZeroDivisionError:
            return None

    @property
    def macro_f1(self) -> float | None:
        """River's `metrics.MacroF1` of the scored predictions (None before the first).

        Each class's F1 is River's, to the last bit; their sum is exactly rounded (`math.fsum`)
        where River adds them up over a set, in an order that depends on string hashing
        (PYTHONHASHSEED): River's last bit differs from one process to the next, this one does
        not, so a task restored in another process reports what an uninterrupted one would.
        The two agree within a few units in the last place.
        """
        if not self.n_labelled:
            return None
        classes = self._support.keys() | self._predicted.keys()
        total = math.fsum(f1 for f1 in map(self._f1, classes) if f1 is not None)
        return total / len(classes)

    def per_class(self) -> dict[str, dict[str, typing.Any]]:
        """Label (as a JSON key) -> support, predicted, correct and F1, for at most
        `MAX_REPORTED_CLASSES` classes (those with the most labels)."""
        support, predicted, correct = self._support, self._predicted, self._correct
        classes = list(support) + [c for c in predicted if c not in support]
        if len(classes) > MAX_REPORTED_CLASSES:
            classes = sorted(classes, key=lambda c: -support.get(c, 0))[:MAX_REPORTED_CLASSES]
        report = {}
        for c in classes:
            f1 = self._f1(c)
            report[label_key(c)] = {
                "support": support.get(c, 0),
                "predicted": predicted.get(c, 0),
                "correct": correct.get(c, 0),
                "f1": 0.0 if f1 is None else f1,
            }
        return report

    def summary(self) -> dict[str, typing.Any]:
        """The metrics as JSON values."""
        per_class = self.per_class()
        return {
            "labelled": self.n_labelled,
            "unscored": self.n_unscored,
            "accuracy": self.accuracy,
            "rolling_accuracy": self.rolling_accuracy,
            "rolling_window": self.rolling_window,
            "log_loss": self.log_loss,
            "macro_f1": self.macro_f1,
            "classes": len(self._classes),
            "per_class": per_class,
            "per_class_omitted": len(self._classes) - len(per_class),
            "classes_untracked": self.n_untracked,
            "drift": {
                "detector": type(self.detector).__name__,
                "params": detector_params(self.detector),
                "detections": self.n_detections,
                "recent_detection_offsets": list(self.detections),
            },
        }

    # The batch path: these numbers as arrays, for one compiled call over many predictions ---------

    def score(self, labels: typing.Sequence) -> typing.Any:
        """These metrics as a `streammargin.progressive.Score` whose class codes index `labels`
        (a model's classes; binary: [False, True]), for the batch path's compiled call; None
        where it cannot keep them: a detector other than DDM or none (no compiled update), or
        classes beyond `max_classes` (untracked ones). `take_score` puts its counts back."""
        from streammargin.jit import progressive as jit
        from streammargin.progressive import Score

        detector = self.detector
        kind = type(detector)
        state = np.zeros(jit.DETECTOR)
        if kind is river_state.DETECTORS["DDM"]:
            state[jit.KIND] = jit.DDM
            state[jit.DDM_N] = detector._p.n
            state[jit.DDM_MEAN] = detector._p._mean
            if detector._p_min is not None:
                state[jit.DDM_HAS_MIN] = 1.0
                state[jit.DDM_P_MIN] = detector._p_min
                state[jit.DDM_S_MIN] = detector._s_min
            state[jit.DDM_PS_MIN] = detector._ps_min
            state[jit.DDM_WARNING] = float(detector._warning_detected)
            state[jit.DDM_DRIFT] = float(detector._drift_detected)
            state[jit.DDM_WARM_START] = detector.warm_start
            state[jit.DDM_WARNING_THRESHOLD] = detector.warning_threshold
            state[jit.DDM_DRIFT_THRESHOLD] = detector.drift_threshold
        elif kind is not river_state.DETECTORS["NoDrift"]:
            return None
        if len(self._classes | set(labels)) > self.max_classes:
            return None  # (a label beyond the bound would be untracked: the per-record path)
        tallies = np.zeros(jit.TALLIES, np.int64)
        tallies[jit.N_LABELLED] = self.n_labelled
        tallies[jit.N_CORRECT] = self.n_correct
        tallies[jit.WINDOW_POS] = self._window_pos
        tallies[jit.WINDOW_CORRECT] = self._window_correct
        tallies[jit.ROLLING] = self.rolling_window
        tallies[jit.N_UNSCORED] = self.n_unscored
        first = np.full((3, len(labels)), jit.NOT_YET, np.int64)
        for row, counts in enumerate((self._support, self._predicted, self._correct)):
            for code, label in enumerate(labels):
                if label in counts:
                    first[row, code] = jit.WAS_THERE
        return Score(tallies, np.array([self._loss_n, self._loss_mean]),
                     np.frombuffer(self._window, np.uint8),  # (a view: written in place)
                     np.zeros((3, len(labels)), np.int64), first, state)

    def take_score(self, score: typing.Any, labels: typing.Sequence,
                   detection_offset: int | None) -> None:
        """Put the counts of a `score` (from `score`, after the compiled call) back into these
        metrics, classes first counted in the order the call met them; `detection_offset`: the
        offset of the record the detector fired on, if it did."""
        from streammargin.jit import progressive as jit

        tallies = score.tallies
        self.n_labelled = int(tallies[jit.N_LABELLED])
        self.n_correct = int(tallies[jit.N_CORRECT])
        self._window_pos = int(tallies[jit.WINDOW_POS])
        self._window_correct = int(tallies[jit.WINDOW_CORRECT])
        self.n_unscored = int(tallies[jit.N_UNSCORED])
        self._loss_n, self._loss_mean = (float(v) for v in score.losses)
        added, first = score.classes, score.first
        for row, counts in enumerate((self._support, self._predicted, self._correct)):
            new = []
            for code, label in enumerate(labels):
                n = int(added[row, code])
                if not n:
                    continue
                if first[row, code] == jit.WAS_THERE:
                    counts[label] += n
                else:
                    new.append((int(first[row, code]), label, n))
            for _, label, n in sorted(new, key=lambda item: item[0]):
                counts[label] = n
                self._classes.add(label)
        state = score.detector
        if state[jit.KIND] == jit.DDM:
            detector = self.detector
            detector._p.n = float(state[jit.DDM_N])
            detector._p._mean = float(state[jit.DDM_MEAN])
            if state[jit.DDM_HAS_MIN]:
                detector._p_min = float(state[jit.DDM_P_MIN])
                detector._s_min = float(state[jit.DDM_S_MIN])
            else:
                detector._p_min = detector._s_min = None
            detector._ps_min = float(state[jit.DDM_PS_MIN])
            detector._warning_detected = bool(state[jit.DDM_WARNING])
            detector._drift_detected = bool(state[jit.DDM_DRIFT])
        if detection_offset is not None:
            self.n_detections += 1
            self.detections.append(detection_offset)

    # Safe state --------------------------------------------------------------------------------

    def to_state(self) -> dict:
        def column(counts: dict) -> tuple[list, np.ndarray]:
            return ([label_to_state(c) for c in counts],
                    np.array(list(counts.values()), dtype=np.int64))

        support_labels, support_counts = column(self._support)
        predicted_labels, predicted_counts = column(self._predicted)
        correct_labels, correct_counts = column(self._correct)
        return {
            "rolling_window": self.rolling_window,
            "max_classes": self.max_classes,
            "n_labelled": self.n_labelled,
            "n_correct": self.n_correct,
            "n_unscored": self.n_unscored,
            "n_untracked": self.n_untracked,
            "loss_n": self._loss_n,
            "loss_mean": self._loss_mean,
            "window": np.frombuffer(bytes(self._window), dtype=np.uint8).copy(),
            "window_pos": self._window_pos,
            "window_correct": self._window_correct,
            "support_labels": support_labels,
            "support_counts": support_counts,
            "predicted_labels": predicted_labels,
            "predicted_counts": predicted_counts,
            "correct_labels": correct_labels,
            "correct_counts": correct_counts,
            "n_detections": self.n_detections,
            "detections": list(self.detections),
            "keep_detections": self.detections.maxlen,
            "detector": river_state.detector_to_state(self.detector),
        }

    @classmethod
    def from_state(cls, data: typing.Any) -> PartitionMetrics:
        """Metrics saved by `to_state`; `StateError` (a `ValueError`) for anything malformed.

        Sizes are checked before the window is allocated; the counts must agree with each other
        and with the window (its bytes are 0 or 1, `window_correct` their sum, `window_pos` the
        count modulo the window), the log loss mean is in its finite range, the per-class counts
        hold at most `max_classes` classes of the codec's label types and add up to the scored
        and correct counts, and the detector is restored by `river_state.detector_from_state`.
        """
        keys = (
            "rolling_window", "max_classes", "n_labelled", "n_correct", "n_unscored",
            "n_untracked", "loss_n", "loss_mean", "window", "window_pos", "window_correct",
            "support_labels", "support_counts", "predicted_labels", "predicted_counts",
            "correct_labels", "correct_counts", "n_detections", "detections", "keep_detections",
            "detector",
        )
        if type(data) is not dict or set(data) != set(keys):
            raise StateError(f"metrics state: expected the fields {sorted(keys)}")

        def whole(key: str, lo: int, hi: int) -> int:
            value = data[key]
            if type(value) is not int or not lo <= value <= hi:
                raise StateError(f"metrics state: {key} must be an int in [{lo}, {hi}]")
            return value

        rolling_window = whole("rolling_window", 1, MAX_ROLLING_WINDOW)
        max_classes = whole("max_classes", 2, MAX_CLASSES)
        keep_detections = whole("keep_detections", 0, MAX_KEEP_DETECTIONS)
        n_labelled = whole("n_labelled", 0, _MAX_COUNT)
        n_correct = whole("n_correct", 0, n_labelled)
        n_unscored = whole("n_unscored", 0, _MAX_COUNT - n_labelled)
        n_untracked = whole("n_untracked", 0, 2 * n_labelled)
        window_pos = whole("window_pos", 0, rolling_window - 1)
        filled = min(n_labelled, rolling_window)
        window_correct = whole("window_correct", 0, filled)
        n_detections = whole("n_detections", 0, n_labelled)
        if window_pos != n_labelled % rolling_window:
            raise StateError("metrics state: window_pos is not n_labelled modulo rolling_window")
        # The window's correct predictions are among all of them, and the others among the rest.
        if window_correct > n_correct or n_correct - window_correct > n_labelled - filled:
            raise StateError("metrics state: window_correct does not fit n_correct")
        window = data["window"]
        if (
            not isinstance(window, np.ndarray)
            or window.dtype != np.uint8
            or window.shape != (rolling_window,)
        ):
            raise StateError(f"metrics state: window must be {rolling_window} uint8 values")
        if window.max() > 1 or int(window.sum()) != window_correct or window[filled:].any():
            raise StateError("metrics state: window bytes must be 0/1 summing to window_correct")
        loss_n, loss_mean = data["loss_n"], data["loss_mean"]
        if (type(loss_n) not in (int, float) or not 0 <= loss_n <= n_labelled + n_unscored
                or loss_n != int(loss_n)):
            raise StateError("metrics state: loss_n must be a whole number of labels")
        if type(loss_mean) not in (int, float) or not 0.0 <= loss_mean <= _MAX_LOG_LOSS or (
            loss_n == 0 and loss_mean != 0.0
        ):
            raise StateError(f"metrics state: loss_mean must be in [0, {_MAX_LOG_LOSS}]")
        support = _class_counts(data, "support", max_classes, n_labelled)
        predicted = _class_counts(data, "predicted", max_classes, n_labelled)
        correct = _class_counts(data, "correct", max_classes, n_correct)
        classes = set(support) | set(predicted)
        if len(classes) > max_classes:
            raise StateError(f"metrics state: more than max_classes={max_classes} classes")
        for label, n in correct.items():
            if n > min(support.get(label, 0), predicted.get(label, 0)):
                raise StateError(
                    f"metrics state: class {label!r:.60} has more correct predictions than "
                    "labels or predictions"
                )
        n_tracked = [sum(support.values()), sum(predicted.values())]
        if (max(n_tracked) > n_labelled or 2 * n_labelled - sum(n_tracked) != n_untracked
                or sum(correct.values()) > n_correct):
            raise StateError("metrics state: the per-class counts do not add up to the counts")
        detections = data["detections"]
        if type(detections) is not list or len(detections) > min(keep_detections, n_detections):
            raise StateError(
                "metrics state: detections must be a list of at most keep_detections and "
                "n_detections offsets"
            )
        if any(type(o) is not int or not 0 <= o < 2**63 for o in detections):
            raise StateError("metrics state: detection offsets must be ints in [0, 2**63)")
        detector = river_state.detector_from_state(data["detector"])
        metrics = cls(rolling_window, detector, keep_detections, max_classes)
        metrics._window = bytearray(window.tobytes())
        metrics.n_labelled, metrics.n_correct = n_labelled, n_correct
        metrics.n_unscored, metrics.n_untracked = n_unscored, n_untracked
        metrics._loss_n, metrics._loss_mean = float(loss_n), float(loss_mean)
        metrics._window_pos, metrics._window_correct = window_pos, window_correct
        metrics._support, metrics._predicted, metrics._correct = support, predicted, correct
        metrics._classes = classes
        metrics.n_detections = n_detections
        metrics.detections.extend(detections)
        return metrics


def _class_counts(data: dict, name: str, max_classes: int, total: int) -> dict:
    """The per-class counts `name` of a metrics state, as a dict in their saved order."""
    labels, counts = data[f"{name}_labels"], data[f"{name}_counts"]
    if type(labels) is not list or len(labels) > max_classes:
        raise StateError(f"metrics state: {name}_labels must be a list of at most "
                         f"max_classes={max_classes} labels")
    if (not isinstance(counts, np.ndarray) or counts.dtype != np.int64
            or counts.shape != (len(labels),)):
        raise StateError(f"metrics state: {name}_counts must be {len(labels)} int64 values")
    if len(labels) and (counts.min() < 1 or counts.max() > total):
        raise StateError(f"metrics state: {name}_counts must be in [1, {total}]")
    try:
        result = dict(zip((label_from_state(label) for label in labels), counts.tolist()))
    except StateError as error:
        raise StateError(f"metrics state: {name}_labels: {error}") from None
    if len(result) != len(labels):
        raise StateError(f"metrics state: {name}_labels holds a label twice")
    return result


class Throughput:
    """Records per second of processing, overall and since the previous report.

    `add(n, started)` counts `n` records whose processing began at `started` (a
    `time.monotonic()` reading taken before the batch) and ended now. The overall clock runs from
    the first batch's `started` to the end of the last batch, so the first batch's processing
    time counts while the wait for the consumer group does not, and idle time after the last
    record does not either. Nor does a wait between batches longer than `max_gap` seconds (no
    records came: the topic was quiet, or the brokers did not answer): a rate that spanned a
    45 s outage said 717-1,150 records/s for a worker that processed 24-34k a second. A caller that does not pass `started` leaves the first batch's
    duration unknown: that batch only starts the clock, and its records are counted in `count`
    but not in the rates, which then measure the batches after it.

    A rate measured over less than `min_seconds` is noise (one tiny batch over a microsecond gave
    668,000,000,000 records/s): `rates()` reports 0.0 for an overall rate not measured yet, and
    keeps the previous recent rate, extending the interval of the next one, when called again
    within `min_seconds` (e.g. one metrics record per partition at once).

    >>> now = [0.0]
    >>> throughput = Throughput(clock=lambda: now[0])
    >>> started = now[0]; now[0] += 0.5
    >>> throughput.add(1000, started)            # one batch of 1000 records in 0.5 s
    >>> throughput.rates()
    (2000.0, 2000.0)
    >>> now[0] += 10.0                            # idle: the overall rate stops at the last record
    >>> throughput.rates()
    (2000.0, 0.0)
    >>> started = now[0]; now[0] += 0.5           # 10 s later, another batch: the wait is left out
    >>> throughput.add(1000, started)
    >>> throughput.rates()[0]
    2000.0

    """

    def __init__(
        self, min_seconds: float = 0.01, clock: typing.Callable[[], float] = time.monotonic,
        max_gap: float = 1.0,
    ) -> None:
        self.min_seconds = min_seconds
        self.max_gap = max_gap
        self._waited = 0.0  # gaps between batches longer than max_gap, left out of the clock
        self._clock = clock
        # The clock starts with the first batch, not while the consumer joins its group.
        self.start: float | None = None
        self.last_record: float | None = None
        self.count = 0
        self._timed_count = 0  # records processed inside [start, last_record]
        self._last_time: float | None = None  # end of the previous recent-rate interval
        self._last_count = 0
        self._recent = 0.0

    def add(self, n: int, started: float | None = None) -> None:
        """Count `n` records processed from `started` (monotonic seconds; None: unknown) to now."""
        now = self._clock()
        self.count += n
        if self.start is None:
            if started is None:  # the batch's own duration is unknown: it starts the clock
                self.start = self._last_time = now
                self._last_count = self.count
            else:
                self.start = self._last_time = min(started, now)
                self._timed_count += n
        else:
            self._timed_count += n
            gap = (now if started is None else started) - self.last_record  # type: ignore[operator]
            if gap > self.max_gap:
                self._waited += gap
        self.last_record = now

    def rates(self) -> tuple[float, float]:
        """(overall, recent) records/s; `recent` covers the time since the previous report.

        0.0 for a rate not measured yet (no batch, or less than `min_seconds` of processing).
        """
        if self.start is None:
            return 0.0, 0.0
        now = self._clock()
        span = self.last_record - self.start - self._waited
        overall = self._timed_count / span if span >= self.min_seconds else 0.0
        interval = now - self._last_time
        if interval >= self.min_seconds:
            self._recent = (self.count - self._last_count) / interval
            self._last_time, self._last_count = now, self.count
        return overall, self._recent
