"""`streammargin evaluate`'s measures: MOA's kappa, kappa-M and kappa-T, cumulative, windowed and
faded, on hand-computed cases; the same numbers as a line-by-line transcription of MOA's
evaluators on random streams; River's CohenKappa, MacroF1, CrossEntropy and RollingROCAUC where
they overlap; never NaN or inf."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from river import metrics as river_metrics
from river import utils

from connectors.evaluate import metrics as metrics_module
from connectors.evaluate.metrics import ClassIndex, Measures, auc

VECTORIZED = metrics_module.MAX_VECTORIZED_COUNTS


def run(pairs, window, classes=(), fading=None, positive=None, probas=None):
    measures = Measures(window, ClassIndex(classes), positive=positive, fading=fading)
    rows = []
    for i, (y, p) in enumerate(pairs):
        measures.add(y, p, probas[i] if probas else None)
        if len(measures) == window:
            rows.append(measures.close_window())
    if len(measures):
        rows.append(measures.close_window())
    return rows


# Hand-computed ---------------------------------------------------------------------------------


def test_one_binary_window_by_hand():
    (row,) = run([("a", "a"), ("a", "b"), ("b", "b"), ("b", "b")], window=4, classes="ab")
    # p0 = 3/4; pc = (1/4)(2/4) + (3/4)(2/4) = 1/2: kappa = (3/4 - 1/2) / (1/2).
    # No-change: starts at class 0 ("a"): right, right, wrong, right: 3/4 -> kappa-T 0.
    # Majority with the record's own label: a, a, a (2 a : 1 b), a (2 : 2, lowest index):
    # right on 2 of 4 -> kappa-M = (3/4 - 1/2) / (1/2).
    for measures in (row.cumulative, row.window_measures):
        assert measures["accuracy"] == 0.75
        assert measures["kappa"] == 0.5
        assert measures["kappa_t"] == 0.0
        assert measures["kappa_m"] == 0.5
    assert (row.window, row.records, row.window_records) == (1, 4, 4)


def test_three_windows_of_two_by_hand():
    trues = [0, 1, 1, 2, 2, 2]
    preds = [0, 1, 0, 2, 1, 2]
    rows = run(list(zip(trues, preds)), window=2, classes=[0, 1, 2])
    first, second, third = (row.window_measures for row in rows)
    # Window 1: all right; pc = 1/2; no-change right once (starts at 0); the majority of the
    # last two labels: 0, then 0 on the tie of [0, 1]: right once.
    assert (first["accuracy"], first["kappa"], first["kappa_t"], first["kappa_m"]) == (1, 1, 1, 1)
    # Window 2: p0 = 1/2; pc = 1/4 (only class 2 both predicted and true); no-change: 1 -> 1
    # right, 1 -> 2 wrong; majority over [1, 1] then [1, 2] (tie: 1): right, wrong.
    assert second["accuracy"] == 0.5 and second["kappa"] == pytest.approx(1 / 3, abs=1e-15)
    assert second["kappa_t"] == 0.0 and second["kappa_m"] == 0.0
    # Window 3: labels never change and the majority is always right: pe = pm = 1, where MOA
    # divides by zero (NaN, -Infinity); here undefined.
    assert third["accuracy"] == 0.5 and third["kappa"] == 0.0
    assert third["kappa_t"] is None and third["kappa_m"] is None
    total = rows[-1].cumulative
    # p0 = 4/6; pc = (2/6)(1/6) + (2/6)(2/6) + (2/6)(3/6) = 1/3 -> kappa 1/2.
    assert total["accuracy"] == 4 / 6 and total["kappa"] == pytest.approx(0.5, abs=1e-15)
    # No-change right 4 of 6 -> pe = p0 -> 0. Cumulative majority (own label counted first):
    # 0 right, 0 (tie) wrong, 1 right, 1 wrong, 1 (tie 2:2) wrong, 2 right: pm = 1/2.
    assert total["kappa_t"] == 0.0
    assert total["kappa_m"] == pytest.approx((4 / 6 - 0.5) / 0.5, abs=1e-15)
    # Macro F1: class 0 p 1/2 r 1, class 1 p 1/2 r 1/2, class 2 p 1 r 2/3.
    assert total["macro_f1"] == pytest.approx((2 / 3 + 0.5 + 0.8) / 3, abs=1e-15)
    assert [row.records for row in rows] == [2, 4, 6]


def test_faded_by_hand():
    (row,) = run([("a", "a"), ("b", "a"), ("b", "b")], window=10, classes="ab", fading=0.5)
    # b = 1.75; correct 1.25; row (.75, 1), col (.25, 1.5); no-change 1.25; majority 1.75.
    faded = row.faded
    assert faded["accuracy"] == 1.25 / 1.75
    assert faded["kappa"] == pytest.approx(4 / 11, abs=1e-15)
    assert faded["kappa_t"] == 0.0
    assert faded["kappa_m"] is None  # the faded majority classifier was always right


def test_log_loss_and_unscored_records():
    probas = [{"a": 0.8, "b": 0.2}, {}, {"a": 0.5, "b": 0.5}, {"b": 1.0}]
    measures = Measures(10, ClassIndex("ab"))
    for (y, p), proba in zip([("a", "a"), ("b", "a"), ("b", "a"), ("a", "b")], probas):
        measures.add(y, p, proba)
    measures.add("a", None, {"a": 0.9})  # no prediction: not scored at all
    row = measures.close_window()
    assert row.records == 4
    # -log .8, (no probabilities: left out), -log .5, -log 1e-15 (clipped)
    expected = (-math.log(0.8) - math.log(0.5) - math.log(1e-15)) / 3
    assert row.cumulative["log_loss"] == pytest.approx(expected, rel=1e-14)


def test_auc_counts_ties_as_half_and_is_undefined_on_one_class():
    assert auc(np.array([0.9, 0.1, 0.5, 0.5]), np.array([True, False, True, False])) == 0.875
    assert auc(np.array([0.2, 0.3]), np.array([True, True])) is None
    (row,) = run([(True, True)] * 3, window=3, positive=True,
                 probas=[{True: 0.9, False: 0.1}] * 3)
    assert row.window_measures["auc"] is None and row.cumulative["auc"] is None


def test_nothing_scored_gives_no_number():
    row = Measures(5, ClassIndex()).close_window()
    assert row.records == 0 and set(row.cumulative.values()) == {None}


# MOA, transcribed ------------------------------------------------------------------------------


class MoaEvaluator:
    """MOA's BasicClassificationPerformanceEvaluator (width None) or
    WindowClassificationPerformanceEvaluator (width W), record by record, unit weights, classes
    0..n-1: the arithmetic of its addResult, getMajorityClass and getKappa*Statistic."""

    def __init__(self, n_classes, width=None):
        self.n_classes = n_classes
        self.width = width
        new = self.estimator
        self.correct, self.no_change, self.majority = new(), new(), new()
        self.row = [new() for _ in range(n_classes)]
        self.col = [new() for _ in range(n_classes)]
        self.last_seen = 0

    def estimator(self):
        return {"sum": 0.0, "len": 0, "window": [None] * (self.width or 0), "pos": 0}

    def add_to(self, e, value):
        if self.width is None:
            e["sum"] += value
            e["len"] += 1
            return
        forget = e["window"][e["pos"]]
        if forget is not None:
            e["sum"] -= forget
        e["sum"] += value
        e["window"][e["pos"]] = value
        e["pos"] = (e["pos"] + 1) % self.width
        e["len"] = min(e["len"] + 1, self.width)

    @staticmethod
    def estimation(e):
        return e["sum"] / e["len"]

    def add(self, true, predicted):
        self.add_to(self.correct, 1.0 if predicted == true else 0.0)
        for i in range(self.n_classes):
            self.add_to(self.row[i], 1.0 if predicted == i else 0.0)
            self.add_to(self.col[i], 1.0 if true == i else 0.0)
        self.add_to(self.no_change, 1.0 if self.last_seen == true else 0.0)
        majority, best = 0, 0.0
        for i in range(self.n_classes):
            if self.estimation(self.col[i]) > best:
                majority, best = i, self.estimation(self.col[i])
        self.add_to(self.majority, 1.0 if majority == true else 0.0)
        self.last_seen = true

    def kappas(self):
        p0 = self.estimation(self.correct)
        pc = 0.0
        for i in range(self.n_classes):
            pc += self.estimation(self.row[i]) * self.estimation(self.col[i])

        def k(p):
            return None if p == 1.0 else (p0 - p) / (1.0 - p)

        return {"accuracy": p0, "kappa": k(pc), "kappa_m": k(self.estimation(self.majority)),
                "kappa_t": k(self.estimation(self.no_change))}


labelled_streams = st.integers(2, 5).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=1,
                 max_size=120),
        st.integers(1, 17),
    )
)


@settings(max_examples=150, deadline=None)
@given(labelled_streams, st.booleans())
def test_the_same_numbers_as_moas_evaluators(case, vectorized):
    if vectorized:
        compare_with_moa(*case)
        return
    metrics_module.MAX_VECTORIZED_COUNTS = 0  # the majorities record by record (many classes)
    try:
        compare_with_moa(*case)
    finally:
        metrics_module.MAX_VECTORIZED_COUNTS = VECTORIZED


def compare_with_moa(n_classes, pairs, width):
    basic = MoaEvaluator(n_classes)
    windowed = MoaEvaluator(n_classes, width)
    measures = Measures(width, ClassIndex(range(n_classes)))
    for i, (true, predicted) in enumerate(pairs, 1):
        basic.add(true, predicted)
        windowed.add(true, predicted)
        measures.add(true, predicted, None)
        if i % width == 0:  # MOA's window read every W records: a block of W
            row = measures.close_window()
            expected = windowed.kappas()
            assert {k: row.window_measures[k] for k in expected} == expected
            expected = basic.kappas()
            assert {k: row.cumulative[k] for k in expected} == expected
    row = measures.close_window()
    expected = basic.kappas()
    assert {k: row.cumulative[k] for k in expected} == expected


class MoaFaded(MoaEvaluator):
    """MOA's FadingFactorClassificationPerformanceEvaluator: the same, with its estimator."""

    def __init__(self, n_classes, alpha):
        self.alpha = alpha
        super().__init__(n_classes)

    def estimator(self):
        return {"estimation": 0.0, "b": 0.0}

    def add_to(self, e, value):
        e["estimation"] = self.alpha * e["estimation"] + value
        e["b"] = self.alpha * e["b"] + 1.0

    @staticmethod
    def estimation(e):
        return e["estimation"] / e["b"] if e["b"] > 0 else 0.0


@settings(max_examples=60, deadline=None)
@given(labelled_streams, st.floats(0.5, 0.999))
def test_faded_measures_are_moas(case, alpha):
    n_classes, pairs, width = case
    faded = MoaFaded(n_classes, alpha)
    measures = Measures(width, ClassIndex(range(n_classes)), fading=alpha)
    for i, (true, predicted) in enumerate(pairs, 1):
        faded.add(true, predicted)
        measures.add(true, predicted, None)
        if i % width == 0:
            assert measures.close_window().faded == faded.kappas()


# River, where it overlaps ----------------------------------------------------------------------


def test_river_agrees_where_it_measures_the_same():
    rng = random.Random(4)
    labels = ["x", "y", "z"]
    width = 50
    pairs, probas = [], []
    for _ in range(1000):
        y = rng.choice(labels)
        p = y if rng.random() < 0.6 else rng.choice(labels)
        raw = [rng.random() + (1.0 if c == p else 0.0) for c in labels]
        probas.append({c: v / sum(raw) for c, v in zip(labels, raw)})
        pairs.append((y, p))
    kappa, f1 = river_metrics.CohenKappa(), river_metrics.MacroF1()
    accuracy = river_metrics.Accuracy()
    loss = river_metrics.CrossEntropy()
    rolling = utils.Rolling(river_metrics.CohenKappa, window_size=width)
    measures = Measures(width, ClassIndex())
    for i, ((y, p), proba) in enumerate(zip(pairs, probas), 1):
        for metric in (kappa, f1, accuracy, rolling):
            metric.update(y, p)
        loss.update(y, proba)
        measures.add(y, p, proba)
        if i % width == 0:
            row = measures.close_window()
            assert row.cumulative["accuracy"] == accuracy.get()
            # River sums over a set of classes, in no fixed order: the last bits may differ.
            assert row.cumulative["kappa"] == pytest.approx(kappa.get(), rel=1e-12)
            assert row.window_measures["kappa"] == pytest.approx(rolling.get(), rel=1e-12)
            assert row.cumulative["macro_f1"] == pytest.approx(f1.get(), rel=1e-12)
            assert row.cumulative["log_loss"] == pytest.approx(loss.get(), rel=1e-12)


def test_window_auc_is_rivers_rolling_roc_auc_read_every_window():
    rng = random.Random(7)
    width = 40
    rolling = river_metrics.RollingROCAUC(window_size=width)
    measures = Measures(width, ClassIndex([False, True]), positive=True)
    for i in range(1, 401):
        y = rng.random() < 0.3
        score = min(1.0, max(0.0, rng.gauss(0.65 if y else 0.4, 0.2)))
        rolling.update(y, score)
        measures.add(y, score > 0.5, {True: score, False: 1.0 - score})
        if i % width == 0:
            row = measures.close_window()
            assert row.window_measures["auc"] == pytest.approx(rolling.get(), rel=1e-12)


# Invariants ------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 1, "c", True]),
            st.one_of(st.none(), st.sampled_from([0, 1, "c", "d"])),
            st.one_of(st.none(), st.dictionaries(
                st.sampled_from([0, 1, "c"]),
                st.floats(0.0, 1.0, allow_nan=False), max_size=3)),
        ),
        max_size=80,
    ),
    st.integers(1, 9),
    st.one_of(st.none(), st.floats(0.01, 0.99)),
)
def test_never_nan_or_inf(records, width, fading):
    measures = Measures(width, ClassIndex(), positive=1, fading=fading)
    rows = []
    for y, p, proba in records:
        measures.add(y, p, proba)
        if len(measures) == width:
            rows.append(measures.close_window())
    rows.append(measures.close_window())
    for row in rows:
        for values in (row.cumulative, row.window_measures, row.faded):
            for name, value in values.items():
                assert value is None or math.isfinite(value), (name, value)
                if value is not None and name in ("accuracy", "macro_f1", "auc"):
                    assert 0.0 <= value <= 1.0
                if value is not None and name.startswith("kappa"):
                    assert value <= 1.0 + 1e-12
