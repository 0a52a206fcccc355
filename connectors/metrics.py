"""Progressive-validation metrics of a partition's model, and the drift detector on its errors.

Each labelled prediction (test-then-train, or a delayed label joined to its event) updates:

- accuracy so far, equal to River's `metrics.Accuracy` of the same predictions;
- accuracy over a rolling window of the last `rolling_window` labelled predictions, equal to
  `utils.Rolling(metrics.Accuracy, window_size=rolling_window)`;
- log loss, with River's `metrics.LogLoss` arithmetic (probabilities clamped to [1e-15, 1 - 1e-15],
  River's incremental mean), so the figures match River's to the last bit;
- a River drift detector fed with the error stream (1.0 for a mistake, 0.0 otherwise): ADWIN by
  default, any detector of `river.drift` / `river.drift.binary` by name.

Everything here is plain numbers plus the detector, saved in the partition's checkpoint
(`to_state` / `from_state`), so a restored task reports the same metrics an uninterrupted one would.
"""

from __future__ import annotations

import collections
import math
import time
import typing

import numpy as np

from connectors.checkpoint import object_from_state, object_to_state

__all__ = ["PartitionMetrics", "Throughput", "make_detector", "detector_names"]


def detector_names() -> dict[str, type]:
    """Lower-case name -> class of River's drift detectors ("adwin", "kswin", "ddm", ...)."""
    from river import base, drift

    names: dict[str, type] = {}
    for module in (drift, drift.binary):
        for attr in module.__all__:
            cls = getattr(module, attr, None)
            if isinstance(cls, type) and issubclass(
                cls, (base.DriftDetector, base.BinaryDriftDetector)
            ):
                names[attr.lower()] = cls
    names["none"] = drift.NoDrift
    return names


def make_detector(name: str = "adwin", params: dict | None = None) -> typing.Any:
    """A River drift detector by (case-insensitive) class name, e.g. `make_detector("ADWIN")`."""
    key = name.lower().replace("_", "").replace("-", "")
    names = detector_names()
    cls = names.get(key)
    if cls is None:
        raise ValueError(f"unknown drift detector {name!r}; known: {', '.join(sorted(names))}")
    return cls(**(params or {}))


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
        if rolling_window < 1:
            raise ValueError(f"rolling_window must be >= 1, got {rolling_window!r}")
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
            "detector": object_to_state(self.detector),
        }

    @classmethod
    def from_state(cls, data: dict) -> PartitionMetrics:
        metrics = cls(
            rolling_window=int(data["rolling_window"]),
            detector=object_from_state(data["detector"]),
            keep_detections=int(data["keep_detections"]),
        )
        window = data["window"]
        if not isinstance(window, np.ndarray) or window.shape != (metrics.rolling_window,):
            raise ValueError("metrics window does not match rolling_window")
        metrics._window = bytearray(window.astype(np.uint8).tobytes())
        metrics.n_labelled = int(data["n_labelled"])
        metrics.n_correct = int(data["n_correct"])
        metrics._loss_n = float(data["loss_n"])
        metrics._loss_mean = float(data["loss_mean"])
        metrics._window_pos = int(data["window_pos"])
        metrics._window_correct = int(data["window_correct"])
        metrics.n_detections = int(data["n_detections"])
        metrics.detections.extend(int(o) for o in data["detections"])
        return metrics


class Throughput:
    """Records per second from the first to the last record, and since the previous report."""

    def __init__(self) -> None:
        # The clock starts with the first record, not while the consumer joins its group, and
        # the overall rate stops at the last record (idle time is not processing time).
        self.start = self._last_time = self.last_record = None
        self.count = self._last_count = 0

    def add(self, n: int) -> None:
        now = time.monotonic()
        if self.start is None:
            self.start = self._last_time = now
        self.count += n
        self.last_record = now

    def rates(self) -> tuple[float, float]:
        """(overall, recent) records/s; `recent` covers the time since the previous call."""
        now = time.monotonic()
        if self.start is None:
            return 0.0, 0.0
        overall = self.count / max(self.last_record - self.start, 1e-9)
        recent = (self.count - self._last_count) / max(now - self._last_time, 1e-9)
        self._last_time, self._last_count = now, self.count
        return overall, recent
