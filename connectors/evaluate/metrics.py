"""MOA's classification measures of one model on one stream, cumulative and per window.

`Measures` takes each scored record (`add(y_true, y_pred, proba)`) and, at the end of each window
of records (`close_window()`), gives a `WindowRow`: every measure over the whole stream so far
(cumulative) and over the window just closed, and, with a fading factor, faded.

- **accuracy** p0, the fraction of right predictions.
- **kappa** (Cohen's): (p0 - pc) / (1 - pc), pc = sum over classes of (predicted fraction x true
  fraction), as MOA's `BasicClassificationPerformanceEvaluator` and River's `CohenKappa`.
- **kappa-M** (Bifet et al. 2015): (p0 - pm) / (1 - pm), pm the accuracy of the majority-class
  classifier. As MOA computes it, the majority class at a record is the class with the most
  true labels so far *including that record's* (over the last `window` records for the windowed
  measure, over all for the cumulative one), the first declared class on a tie.
- **kappa-T** (Zliobaite et al. 2015): (p0 - pe) / (1 - pe), pe the accuracy of the no-change
  classifier, which predicts the previous record's true label (the first class for the first).
- **macro F1**, River's `MacroF1`: the mean over the classes seen (as a label or a prediction) of
  each class's F1.
- **log loss**: the mean of -log p(true label), p clipped to [1e-15, 1 - 1e-15] (River's
  `CrossEntropy`, which is `LogLoss` for a binary stream), over the records with probabilities.
- **AUC** (binary streams, per window): the prequential ROC AUC of Brzezinski and Stefanowski
  (2017), the area under the ROC curve of the window's scores (probability of the positive
  class), ties counting one half (the Mann-Whitney statistic).

Windows. MOA's `WindowClassificationPerformanceEvaluator -w W` keeps each estimate over the last W
records; read every W records (MOA's `-f W`, CapyMOA's windows), that is consecutive blocks of W
records, which is what a window is here (the last one may be shorter). Only the majority
classifier looks past a block: at each record it takes the last W true labels, as MOA's does.

Faded (`fading=alpha`), MOA's `FadingFactorClassificationPerformanceEvaluator`: every estimate
is s/b with s <- alpha s + v and b <- alpha b + 1 at each record; the kappas take their
fractions from those estimates (the majority class too).

Where a kappa's denominator is 0 (pc, pm or pe is 1: every record of one class, every prediction
right) MOA divides anyway and prints NaN or -Infinity; here the measure is `None` (undefined),
an empty cell, so that no NaN or inf ever leaves. Likewise AUC on a window of one class (MOA
says 1) and any measure over no record.

Classes are indices in `ClassIndex` order: the declared classes first (an ARFF header's), then
labels as they first appear; MOA's no-change classifier starts at index 0 and its majority ties go
to the lowest index, so the order is part of the definition.

>>> m = Measures(window=4, classes=ClassIndex(["a", "b"]))
>>> for y, p in [("a", "a"), ("a", "b"), ("b", "b"), ("b", "b")]:
...     m.add(y, p, None)
>>> row = m.close_window()
>>> row.cumulative["accuracy"], row.cumulative["kappa"], row.cumulative["kappa_t"]
(0.75, 0.5, 0.0)
"""

from __future__ import annotations

import collections
import dataclasses
import math
import typing

import numpy as np

__all__ = ["ClassIndex", "MEASURES", "Measures", "WindowRow", "auc", "kappa"]

#: The measures of a row, in the order of the output's columns; `auc` only on binary streams.
MEASURES = ("accuracy", "kappa", "kappa_m", "kappa_t", "macro_f1", "log_loss", "auc")
#: The measures a fading factor gives (MOA's faded evaluator's, with its estimator).
FADED_MEASURES = ("accuracy", "kappa", "kappa_m", "kappa_t")
#: Measures where smaller is better (the ranks use it).
SMALLER_IS_BETTER = frozenset({"log_loss"})
LOG_LOSS_CLIP = 1e-15
# The most entries of the (records x classes) counts `_majorities` builds in numpy (16 MiB).
MAX_VECTORIZED_COUNTS = 1 << 21
#: The most classes a stream may have (a survey refuses more labels than this first).
MAX_CLASSES = 20_000


class ClassIndex:
    """Label -> index: `declared` first, in order, then labels as they first appear (true labels
    and predictions alike), at most `MAX_CLASSES`."""

    def __init__(self, declared: typing.Iterable = ()):
        self.index: dict = {}
        self.labels: list = []
        for label in declared:
            self.of(label)

    def of(self, label: typing.Any) -> int:
        found = self.index.get(label)
        if found is not None:
            return found
        if len(self.labels) >= MAX_CLASSES:
            raise ValueError(f"more than {MAX_CLASSES:,} classes")
        self.index[label] = found = len(self.labels)
        self.labels.append(label)
        return found

    def __len__(self) -> int:
        return len(self.labels)


def kappa(p0: float, pc: float) -> float | None:
    """(p0 - pc) / (1 - pc), None where MOA's would be NaN or infinite (pc = 1)."""
    if pc >= 1.0:
        return None
    return (p0 - pc) / (1.0 - pc)


def auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """The area under the ROC curve of `scores` against the boolean `positive`, ties counting a
    half; None without both classes.

    >>> auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([False, False, True, True]))
    0.75
    >>> auc(np.array([0.5, 0.5]), np.array([False, True])), auc(np.array([0.3]), np.array([True]))
    (0.5, None)
    """
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if not n_pos or not n_neg:
        return None
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    midranks = (ends - counts + 1 + ends) / 2.0  # 1-based mean rank of each distinct score
    rank_sum = float(midranks[inverse][positive].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


@dataclasses.dataclass
class WindowRow:
    """One window's measures: `cumulative` (the stream so far), `window` (the window's records)
    and `faded` (empty without a fading factor); a measure is None where undefined."""

    window: int  # 1, 2, ...
    records: int  # records scored so far
    window_records: int
    cumulative: dict
    window_measures: dict
    faded: dict


class _Counts:
    """The sums of a span of records: the confusion matrix's margins and diagonal, and the
    right answers of the model and of the two baselines."""

    __slots__ = ("n", "correct", "row", "col", "tp", "no_change", "majority", "loss", "n_loss")

    def __init__(self, n_classes: int = 0):
        self.n = 0
        self.correct = 0
        self.row = np.zeros(n_classes, np.int64)  # predictions per class
        self.col = np.zeros(n_classes, np.int64)  # true labels per class
        self.tp = np.zeros(n_classes, np.int64)
        self.no_change = 0
        self.majority = 0
        self.loss = 0.0
        self.n_loss = 0

    def grow(self, n_classes: int) -> None:
        extra = n_classes - len(self.row)
        if extra > 0:
            pad = np.zeros(extra, np.int64)
            self.row = np.concatenate([self.row, pad])
            self.col = np.concatenate([self.col, pad])
            self.tp = np.concatenate([self.tp, pad])

    def add(self, other: _Counts) -> None:
        self.grow(len(other.row))
        self.n += other.n
        self.correct += other.correct
        self.row[: len(other.row)] += other.row
        self.col[: len(other.col)] += other.col
        self.tp[: len(other.tp)] += other.tp
        self.no_change += other.no_change
        self.majority += other.majority
        self.loss += other.loss
        self.n_loss += other.n_loss

    def measures(self) -> dict:
        """accuracy, kappa, kappa_m, kappa_t, macro_f1 and log_loss of these counts, with MOA's
        arithmetic: each fraction an estimate sum / n, pc summed over the classes in order."""
        n = self.n
        if not n:
            return {"accuracy": None, "kappa": None, "kappa_m": None, "kappa_t": None,
                    "macro_f1": None,
                    "log_loss": self.loss / self.n_loss if self.n_loss else None}
        p0 = self.correct / n
        pc = 0.0
        for predicted, true in zip(self.row.tolist(), self.col.tolist()):
            pc += (predicted / n) * (true / n)
        return {
            "accuracy": p0,
            "kappa": kappa(p0, pc),
            "kappa_m": kappa(p0, self.majority / n),
            "kappa_t": kappa(p0, self.no_change / n),
            "macro_f1": macro_f1(self.row, self.col, self.tp),
            "log_loss": self.loss / self.n_loss if self.n_loss else None,
        }


def macro_f1(row: np.ndarray, col: np.ndarray, tp: np.ndarray) -> float:
    """River's `MacroF1` from the margins: the mean over classes predicted or true at least once
    of 2pr / (p + r) (0 where p + r is 0)."""
    total = 0.0
    seen = 0
    for predicted, true, right in zip(row.tolist(), col.tolist(), tp.tolist()):
        if not predicted and not true:
            continue
        seen += 1
        p = right / predicted if predicted else 0.0
        r = right / true if true else 0.0
        if p + r:
            total += 2 * p * r / (p + r)
    return total / seen if seen else 0.0


class _Faded:
    """MOA's fading-factor estimators: s <- alpha s + v, b <- alpha b + 1; estimate s / b."""

    def __init__(self, alpha: float):
        self.alpha = alpha
        self.b = 0.0
        self.correct = 0.0
        self.no_change = 0.0
        self.majority = 0.0
        self.row: list[float] = []
        self.col: list[float] = []

    def update(self, trues: list, preds: list, no_change: list, n_classes: int) -> None:
        alpha = self.alpha
        row, col = self.row, self.col
        row.extend([0.0] * (n_classes - len(row)))
        col.extend([0.0] * (n_classes - len(col)))
        classes = range(n_classes)
        b, correct, unchanged, majority = self.b, self.correct, self.no_change, self.majority
        for t, p, same in zip(trues, preds, no_change):
            b = alpha * b + 1.0
            correct = alpha * correct + (1.0 if t == p else 0.0)
            unchanged = alpha * unchanged + (1.0 if same else 0.0)
            best, best_value = 0, 0.0
            for i in classes:  # every class's estimator takes a value, as MOA's do
                row[i] = alpha * row[i] + (1.0 if i == p else 0.0)
                value = col[i] = alpha * col[i] + (1.0 if i == t else 0.0)
                if value / b > best_value:
                    best, best_value = i, value / b
            majority = alpha * majority + (1.0 if best == t else 0.0)
        self.b, self.correct, self.no_change, self.majority = b, correct, unchanged, majority

    def measures(self) -> dict:
        b = self.b
        if not b:
            return dict.fromkeys(FADED_MEASURES)
        p0 = self.correct / b
        pc = 0.0
        for predicted, true in zip(self.row, self.col):
            pc += (predicted / b) * (true / b)
        return {"accuracy": p0, "kappa": kappa(p0, pc), "kappa_m": kappa(p0, self.majority / b),
                "kappa_t": kappa(p0, self.no_change / b)}


class Measures:
    """The measures of one model on one stream (see the module's docstring).

    `add` keeps a record's answer for the window (a few appends: it runs once per record and
    model); `close_window` computes the window's sums and both baselines and returns its row.
    Memory: the window's records (`window` entries of a few lists) and, for the windowed
    majority class, the last `window` true labels, plus a few numbers per class.
    """

    def __init__(
        self,
        window: int,
        classes: ClassIndex,
        positive: typing.Any = None,
        fading: float | None = None,
    ):
        if window < 1:
            raise ValueError(f"window {window}: expected a positive number of records")
        if fading is not None and not 0.0 < fading < 1.0:
            raise ValueError(f"fading factor {fading}: expected a number in (0, 1)")
        self.window = window
        self.classes = classes
        self.positive = positive  # the positive class of a binary stream (AUC), or None
        self.total = _Counts()
        self.n_windows = 0
        # The open window's (y_true, y_pred, proba): one append a record, the loop's own.
        self.answers: list[tuple] = []
        # Before them, in order: earlier answers (lists) and `add_block`s (tuples of arrays).
        self._blocks: list = []
        self._block_records = 0
        self._last_seen = 0  # the no-change classifier's prediction (MOA starts at class 0)
        # The majority classifiers: cumulative true-label counts and their argmax, and the
        # last `window` true labels with their counts.
        self._seen: list[int] = []
        self._recent: collections.deque = collections.deque(maxlen=window)
        self._recent_counts: list[int] = []
        self._faded = _Faded(fading) if fading is not None else None

    def __len__(self) -> int:
        """Records in the open window (predictions of None included)."""
        return len(self.answers) + self._block_records

    def add(self, y_true: typing.Any, y_pred: typing.Any, proba: dict | None) -> None:
        """Score one prediction: `y_pred` from `predict_one` (None: not scored, as River's
        progressive validation), `proba` from `predict_proba_one` (empty or None: no log loss
        or AUC for this record)."""
        self.answers.append((y_true, y_pred, proba))

    def add_block(self, labels: typing.Sequence, trues: np.ndarray, preds: np.ndarray,
                  p_true: np.ndarray, score: np.ndarray | None) -> None:
        """Score many predictions at once, after those added before, as `add` would score each:
        `labels[code]` is a code's label; `trues`, `preds` the codes of the true labels and
        predictions (-1: no prediction, not scored); `p_true` each record's probability of its
        true label (NaN: no probabilities); `score` its probability of the positive class
        (NaN: none; None without a positive class)."""
        if self.answers:  # (kept in order; the list itself stays: the loop holds its append)
            self._blocks.append(list(self.answers))
            self._block_records += len(self.answers)
            self.answers.clear()
        self._blocks.append((labels, trues, preds, p_true, score))
        self._block_records += len(trues)

    def close_window(self) -> WindowRow:
        """The row of the window open so far (possibly of no record), and a new window."""
        t, p, p_true, scores = self._window_arrays()
        n_classes = len(self.classes)
        counts = _Counts(n_classes)
        counts.n = n = len(t)
        trues: list = []
        preds: list = []
        no_change: list = []
        if n:
            trues, preds = t.tolist(), p.tolist()
            right = t == p
            counts.correct = int(right.sum())
            counts.row = np.bincount(p, minlength=n_classes)
            counts.col = np.bincount(t, minlength=n_classes)
            counts.tp = np.bincount(t[right], minlength=n_classes)
            previous = np.empty_like(t)
            previous[0] = self._last_seen
            previous[1:] = t[:-1]
            unchanged = previous == t
            counts.no_change = int(unchanged.sum())
            self._last_seen = trues[-1]
            no_change = unchanged.tolist()
            right_cumulative, counts.majority = self._majorities(trues, n_classes)
            given = ~np.isnan(p_true)
            counts.n_loss = int(given.sum())
            if counts.n_loss:
                clipped = np.clip(p_true[given], LOG_LOSS_CLIP, 1.0 - LOG_LOSS_CLIP)
                counts.loss = float(-np.log(clipped).sum())
        else:
            right_cumulative = 0
        # The window's kappa-M takes the windowed majority classifier, the cumulative one the
        # cumulative classifier.
        window_measures = counts.measures()
        counts.majority = right_cumulative
        self.total.add(counts)
        cumulative = self.total.measures()
        if self.positive is not None:
            given = ~np.isnan(scores)
            is_positive = np.array([label == self.positive for label in self.classes.labels],
                                   bool)
            positive = is_positive[t] if n else np.zeros(0, bool)
            window_measures["auc"] = auc(scores[given], positive[given]) if n else None
            cumulative["auc"] = None  # a window's measure only
        faded = {}
        if self._faded is not None:
            self._faded.update(trues, preds, no_change, n_classes)
            faded = self._faded.measures()
        self.n_windows += 1
        row = WindowRow(self.n_windows, self.total.n, counts.n, cumulative, window_measures,
                        faded)
        return row

    def _window_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The open window's scored records (those with a prediction), in order, and a new
        window: the class indices of their true labels and predictions, their probabilities of
        the true label and of the positive class (NaN where not given)."""
        parts = [self._block_arrays(block) if type(block) is tuple else self._answer_arrays(block)
                 for block in self._blocks]
        parts.append(self._answer_arrays(self.answers))
        self._blocks.clear()
        self.answers.clear()
        self._block_records = 0
        if len(parts) == 1:
            return parts[0]
        return tuple(np.concatenate(column) for column in zip(*parts))  # type: ignore

    def _answer_arrays(self, answers: list[tuple]) -> tuple:
        """`_window_arrays` of answers added one by one."""
        answers = [answer for answer in answers if answer[1] is not None]
        trues, preds = self._indices(answers)
        p_true = np.array([proba.get(y, 0.0) if proba else math.nan for y, _, proba in answers],
                          np.float64)
        if self.positive is not None:
            positive_class = self.positive
            scores = np.array([proba.get(positive_class, 0.0) if proba else math.nan
                               for _, _, proba in answers], np.float64)
        else:
            scores = np.zeros(len(answers))
        return np.array(trues, np.int64), np.array(preds, np.int64), p_true, scores

    def _block_arrays(self, block: tuple) -> tuple:
        """`_window_arrays` of an `add_block`: its codes as class indices, assigned to labels
        not seen before in the order `add`'s answers would assign them (each record's true
        label, then its prediction)."""
        labels, trues, preds, p_true, scores = block
        scored = preds >= 0
        if not scored.all():
            trues, preds, p_true = trues[scored], preds[scored], p_true[scored]
            scores = scores[scored] if scores is not None else None
        if scores is None:
            scores = np.zeros(len(trues))
        get = self.classes.index.get
        mapping = [get(label) for label in labels]
        if None in mapping and len(trues):
            both = np.empty(2 * len(trues), np.int64)
            both[0::2], both[1::2] = trues, preds
            _, first = np.unique(both, return_index=True)
            for code in both[np.sort(first)].tolist():
                mapping[code] = self.classes.of(labels[code])
        index = np.array([-1 if i is None else i for i in mapping], np.int64)
        return index[trues], index[preds], p_true, scores

    def _indices(self, answers: list[tuple]) -> tuple[list[int], list[int]]:
        """The class indices of the answers' true labels and predictions."""
        get = self.classes.index.get
        trues = [get(y) for y, _, _ in answers]
        preds = [get(y) for _, y, _ in answers]
        if None in trues or None in preds:  # labels not seen before: indexed in order
            of = self.classes.of
            trues, preds = [], []
            for y, predicted, _ in answers:
                trues.append(of(y))
                preds.append(of(predicted))
        return trues, preds

    def _majorities(self, trues: list[int], n_classes: int) -> tuple[int, int]:
        """How often the cumulative and the windowed majority classifiers were right on
        `trues`, as MOA's evaluators count it: each record's own label counted first, the lowest
        index winning a tie. With few classes, counts of every class at every record in numpy
        (np.argmax takes the first maximum: the lowest index); else record by record."""
        seen = self._seen
        seen.extend([0] * (n_classes - len(seen)))
        recent = self._recent
        if n_classes * (len(recent) + len(trues)) > MAX_VECTORIZED_COUNTS:
            return self._majorities_one_by_one(trues, n_classes)
        t = np.array(trues, np.int64)
        m = len(t)
        onehot = np.zeros((m, n_classes), np.int64)
        onehot[np.arange(m), t] = 1
        counts = np.cumsum(onehot, axis=0)
        counts += np.array(seen, np.int64)
        right_cumulative = int((np.argmax(counts, axis=1) == t).sum())
        self._seen = counts[-1].tolist()
        # The window: the last `window` labels up to each record, over the labels kept from
        # before this block and the block's.
        labels = np.concatenate([np.array(recent, np.int64), t])
        every = np.zeros((len(labels) + 1, n_classes), np.int64)
        every[np.arange(1, len(labels) + 1), labels] = 1
        np.cumsum(every, axis=0, out=every)  # every[k]: the counts of labels[:k]
        ends = np.arange(len(recent), len(labels)) + 1
        window_counts = every[ends] - every[np.maximum(ends - self.window, 0)]
        right_window = int((np.argmax(window_counts, axis=1) == t).sum())
        recent.extend(trues)
        return right_cumulative, right_window

    def _majorities_one_by_one(self, trues: list[int], n_classes: int) -> tuple[int, int]:
        """`_majorities` record by record (many classes): the cumulative argmax kept as counts
        only grow; the window's rescanned when the class it names loses a label."""
        seen = self._seen
        majority = int(np.argmax(seen)) if any(seen) else 0
        recent, width = self._recent, self.window
        recent_counts = [0] * n_classes
        for label in recent:
            recent_counts[label] += 1
        right_cumulative = right_window = 0
        window_best = None  # the windowed argmax, rescanned when its count may have dropped
        for t in trues:
            seen[t] += 1
            count = seen[t]
            best = seen[majority]
            if count > best or (count == best and t < majority):
                majority = t
            right_cumulative += majority == t
            if len(recent) == width:
                forgotten = recent[0]
                recent_counts[forgotten] -= 1
                if forgotten == window_best:
                    window_best = None
            recent.append(t)  # (a deque of `width`: the oldest label goes)
            recent_counts[t] += 1
            if window_best is None:
                window_best = max(range(n_classes), key=lambda i: (recent_counts[i], -i))
            else:
                count, best = recent_counts[t], recent_counts[window_best]
                if count > best or (count == best and t < window_best):
                    window_best = t
            right_window += window_best == t
        return right_cumulative, right_window
