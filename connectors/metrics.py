"""Progressive-validation metrics of a partition's model, and the drift detector on its errors.

Each labelled prediction (test-then-train, or a delayed label joined to its event) updates:

- accuracy so far, equal to River's `metrics.Accuracy` of the same predictions;
- accuracy over a rolling window of the last `rolling_window` labelled predictions, equal to
  `utils.Rolling(metrics.Accuracy, window_size=rolling_window)`;
- log loss, with River's `metrics.LogLoss` arithmetic (probabilities clamped to [1e-15, 1 - 1e-15],
  River's incremental mean), so the figures match River's to the last bit;
- a River drift detector fed with the error stream (1.0 for a mistake, 0.0 otherwise): any
  detector of `connectors.river_state.DETECTORS` by name; the worker's default is DDM with
  `TUNED_PARAMS` (chosen by `benchmarks/drift_detectors.py`).

Everything here is plain numbers plus the detector, saved in the partition's checkpoint
(`to_state` / `from_state`, every field validated on restore: a checkpoint is untrusted input), so
a restored task reports the same metrics an uninterrupted one would.
"""

from __future__ import annotations

import collections
import math
import time
import typing

import numpy as np

from connectors import river_state
from streammargin.errors import StateError

__all__ = [
    "PartitionMetrics",
    "Throughput",
    "TUNED_PARAMS",
    "make_detector",
    "detector_names",
    "detector_params",
]

# Bounds of a partition's metrics (checked before a restore allocates anything).
MAX_ROLLING_WINDOW = 1 << 24
MAX_KEEP_DETECTIONS = 1 << 16
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

    Examples
    --------

    >>> metrics = PartitionMetrics(rolling_window=2)
    >>> for offset, (y, p_true) in enumerate([(True, 0.9), (False, 0.8), (False, 0.3)]):
    ...     _ = metrics.update(y, p_true > 0.5, p_true, offset)
    >>> metrics.accuracy, metrics.rolling_accuracy, round(metrics.log_loss, 6)
    (0.6666666666666666, 0.5, 0.690491)

    """

    def __init__(
        self, rolling_window: int = 1000, detector: typing.Any = None, keep_detections: int = 100
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
        self.rolling_window = rolling_window
        self.detector = detector if detector is not None else make_detector("adwin")
        self.n_labelled = 0
        self.n_correct = 0
        # River's stats.Mean, written out: n as a float, mean += (1 / n) (x - mean).
        self._loss_n = 0.0
        self._loss_mean = 0.0
        self._window = bytearray(rolling_window)  # 1 = correct, ring buffer
        self._window_pos = 0
        self._window_correct = 0
        self.n_detections = 0
        self.detections: collections.deque[int] = collections.deque(maxlen=keep_detections)

    def update(self, y_true: bool, y_pred: bool, p_true: float, offset: int) -> bool:
        """Count one labelled prediction; True when the detector reports a drift on it."""
        correct = 1 if y_true == y_pred else 0
        self.n_labelled += 1
        self.n_correct += correct
        window = self._window
        pos = self._window_pos
        self._window_correct += correct - window[pos]
        window[pos] = correct
        self._window_pos = pos + 1 if pos + 1 < self.rolling_window else 0
        p_true = max(min(p_true, 1.0 - 1e-15), 1e-15)
        loss = -math.log(p_true) if y_true else -math.log(1.0 - p_true)
        self._loss_n += 1.0
        self._loss_mean += (1.0 / self._loss_n) * (loss - self._loss_mean)
        detector = self.detector
        detector.update(0.0 if correct else 1.0)
        if detector.drift_detected:
            self.n_detections += 1
            self.detections.append(offset)
            return True
        return False

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

    def summary(self) -> dict[str, typing.Any]:
        """The metrics as JSON values."""
        return {
            "labelled": self.n_labelled,
            "accuracy": self.accuracy,
            "rolling_accuracy": self.rolling_accuracy,
            "rolling_window": self.rolling_window,
            "log_loss": self.log_loss,
            "drift": {
                "detector": type(self.detector).__name__,
                "params": detector_params(self.detector),
                "detections": self.n_detections,
                "recent_detection_offsets": list(self.detections),
            },
        }

    # Safe state --------------------------------------------------------------------------------

    def to_state(self) -> dict:
        return {
            "rolling_window": self.rolling_window,
            "n_labelled": self.n_labelled,
            "n_correct": self.n_correct,
            "loss_n": self._loss_n,
            "loss_mean": self._loss_mean,
            "window": np.frombuffer(bytes(self._window), dtype=np.uint8).copy(),
            "window_pos": self._window_pos,
            "window_correct": self._window_correct,
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
        count modulo the window), the log loss mean is in its finite range, and the detector
        is restored by `river_state.detector_from_state`.
        """
        keys = (
            "rolling_window", "n_labelled", "n_correct", "loss_n", "loss_mean", "window",
            "window_pos", "window_correct", "n_detections", "detections", "keep_detections",
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
        keep_detections = whole("keep_detections", 0, MAX_KEEP_DETECTIONS)
        n_labelled = whole("n_labelled", 0, _MAX_COUNT)
        n_correct = whole("n_correct", 0, n_labelled)
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
        if type(loss_n) not in (int, float) or loss_n != n_labelled:
            raise StateError("metrics state: loss_n must equal n_labelled")
        if type(loss_mean) not in (int, float) or not 0.0 <= loss_mean <= _MAX_LOG_LOSS or (
            n_labelled == 0 and loss_mean != 0.0
        ):
            raise StateError(f"metrics state: loss_mean must be in [0, {_MAX_LOG_LOSS}]")
        detections = data["detections"]
        if type(detections) is not list or len(detections) > min(keep_detections, n_detections):
            raise StateError(
                "metrics state: detections must be a list of at most keep_detections and "
                "n_detections offsets"
            )
        if any(type(o) is not int or not 0 <= o < 2**63 for o in detections):
            raise StateError("metrics state: detection offsets must be ints in [0, 2**63)")
        detector = river_state.detector_from_state(data["detector"])
        metrics = cls(rolling_window, detector, keep_detections)
        metrics._window = bytearray(window.tobytes())
        metrics.n_labelled, metrics.n_correct = n_labelled, n_correct
        metrics._loss_n, metrics._loss_mean = float(loss_n), float(loss_mean)
        metrics._window_pos, metrics._window_correct = window_pos, window_correct
        metrics.n_detections = n_detections
        metrics.detections.extend(detections)
        return metrics


class Throughput:
    """Records per second of processing, overall and since the previous report.

    `add(n, started)` counts `n` records whose processing began at `started` (a
    `time.monotonic()` reading taken before the batch) and ended now. The overall clock runs from
    the first batch's `started` to the end of the last batch, so the first batch's processing
    time counts while the wait for the consumer group does not, and idle time after the last
    record does not either. A caller that does not pass `started` leaves the first batch's
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

    """

    def __init__(
        self, min_seconds: float = 0.01, clock: typing.Callable[[], float] = time.monotonic
    ) -> None:
        self.min_seconds = min_seconds
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
        self.last_record = now

    def rates(self) -> tuple[float, float]:
        """(overall, recent) records/s; `recent` covers the time since the previous report.

        0.0 for a rate not measured yet (no batch, or less than `min_seconds` of processing).
        """
        if self.start is None:
            return 0.0, 0.0
        now = self._clock()
        span = self.last_record - self.start
        overall = self._timed_count / span if span >= self.min_seconds else 0.0
        interval = now - self._last_time
        if interval >= self.min_seconds:
            self._recent = (self.count - self._last_count) / interval
            self._last_time, self._last_count = now, self.count
        return overall, self._recent
