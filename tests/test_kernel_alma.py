"""Kernel ALMA_2 on a budget against a dense transcription, the linear ALMA_2, and the paper."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reference_kernel import kernel, kernel_alma_reference
from test_kernel_perceptron import (
    KERNELS,
    NAMES,
    assert_same_function,
    dense_stream,
    reference_kernel,
)

import streammargin
from streammargin import ALMAClassifier, KernelALMAClassifier
from streammargin.jit import budget as bjit


def scaled_function(model, f):
    """The model's decision is the margin w . xh = f(x) / sqrt(K(x, x))."""

    class Normalised:
        def __call__(self, v):
            return f(v) / math.sqrt(f.K(v, v))

    return Normalised()


@pytest.mark.parametrize("eviction", ["random", "oldest", "smallest", "project"])
@pytest.mark.parametrize("kernel_name", ["rbf", "poly", "linear"])
@pytest.mark.parametrize("alpha", [0.9, 0.5])
def test_equals_the_dense_transcription(eviction, kernel_name, alpha):
    params = KERNELS[kernel_name]
    dicts, dense = dense_stream(seed=len(eviction) * 7 + len(kernel_name), n=200)
    model = KernelALMAClassifier(
        budget=10, eviction=eviction, alpha=alpha, seed=77, projection_threshold=0.3, **params
    )
    for x, y in dicts:
        model.learn_one(x, y)
    f, corrections = kernel_alma_reference(
        dense, reference_kernel(params), alpha, 1 / alpha, math.sqrt(2), 10, eviction, 0.3, key=77
    )
    assert model.n_corrections == corrections
    assert model.support_size == len(f) <= 10
    probes, _ = dense_stream(seed=98, n=30)
    assert_same_function(model, scaled_function(model, f), [x for x, _ in probes])


@pytest.mark.parametrize("alpha", [1.0, 0.8])
def test_the_linear_kernel_is_linear_alma_2(alpha):
    """No budget pressure, linear kernel: the dual form is ALMA_2 without intercept, exactly."""
    rng = np.random.default_rng(1)
    u = rng.normal(size=5)
    stream = []
    for _ in range(600):
        x = rng.normal(size=5) * rng.choice([0.01, 1.0, 100.0])
        label = bool(u @ x + 0.3 * rng.normal() > 0)
        stream.append(({f"x{i}": float(v) for i, v in enumerate(x)}, label))
    dual = KernelALMAClassifier(kernel="linear", alpha=alpha, budget=1000, eviction="oldest")
    primal = ALMAClassifier(p=2.0, alpha=alpha, fit_intercept=False, average=False)
    for x, y in stream:
        assert dual.decision_one(x) == pytest.approx(primal.decision_one(x), rel=1e-9, abs=1e-12)
        dual.learn_one(x, y)
        primal.learn_one(x, y)
    assert dual.n_corrections == primal.n_corrections == dual.support_size


@pytest.mark.parametrize("eviction", ["random", "oldest", "smallest", "merge", "project"])
def test_the_hypothesis_stays_in_the_unit_ball(eviction):
    dicts, _ = dense_stream(seed=2, n=1500, flip=0.2)
    model = KernelALMAClassifier(budget=15, eviction=eviction, alpha=0.6, seed=0)
    for x, y in dicts:
        model.learn_one(x, y)
        assert bjit.squared_norm(model._slots, model._st) <= 1.0 + 1e-9
    assert model.n_corrections > 100


@pytest.mark.parametrize("eviction", ["oldest", "project"])
def test_the_average_is_the_mean_of_the_hypotheses(eviction):
    """average=True serves (1/T) sum_t f_t over the trials; the learnt hypothesis is the same.
    Exact while no vector leaves the cache (a projection only changes coefficients)."""
    dicts, _ = dense_stream(seed=9, n=300)
    budget = 40 if eviction == "project" else 300
    # (a fixed width: gamma="auto" relearns the warm-up, replacing the hypotheses of its past)
    last = KernelALMAClassifier(
        gamma=1.0, budget=budget, eviction=eviction, projection_threshold=0.5
    )
    averaged = KernelALMAClassifier(
        gamma=1.0, budget=budget, eviction=eviction, projection_threshold=0.5, average=True
    )
    probes = [x for x, _ in dicts[:10]]
    history = []
    for x, y in dicts:
        last.learn_one(x, y)
        averaged.learn_one(x, y)
        history.append([last.decision_one(p) for p in probes])
    assert last.counters["evictions"] == 0
    if eviction == "project":
        assert last.counters["projections"] > 10
    mean = np.mean(history, axis=0)
    got = [averaged.decision_one(p) for p in probes]
    np.testing.assert_allclose(got, mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(last._slots[:, :5], averaged._slots[:, :5])


def test_zero_instances_make_no_update():
    model = KernelALMAClassifier(kernel="linear", eviction="oldest")
    model.learn_one({"a": 1.0}, True)
    model.learn_one({}, False)
    model.learn_one({"a": 0.0, "b": 0.0}, False)
    assert model.n_corrections == 1 and model.n_trials == 3 and model.support_size == 1
    assert model.decision_one({}) == 0.0


def test_kernel_alma_learns_what_linear_alma_cannot():
    """XOR of two signs: no linear separator (even on ALMA's normalised instances) beats chance."""
    rng = np.random.default_rng(12)
    X = rng.normal(size=(3000, 2))
    dicts = [({"a": float(a), "b": float(b)}, bool(a * b > 0)) for a, b in X]
    scores = {}
    for name, model in [("kernel", KernelALMAClassifier(budget=100)), ("linear", ALMAClassifier())]:
        hits = 0
        for i, (x, y) in enumerate(dicts):
            if i >= 1500:
                hits += model.predict_one(x) == y
            model.learn_one(x, y)
        scores[name] = hits / 1500
    assert scores["kernel"] > 0.85 and scores["linear"] < 0.6, scores


def test_multiclass_through_one_vs_rest():
    from river import datasets, evaluate, metrics, multiclass, preprocessing

    model = preprocessing.StandardScaler() | multiclass.OneVsRestClassifier(
        KernelALMAClassifier(gamma=0.1, budget=100, alpha=0.5, eviction="project", average=True)
    )
    accuracy = evaluate.progressive_val_score(datasets.ImageSegments(), model, metrics.Accuracy())
    # River's best linear model (LogisticRegression one-vs-rest) scores 0.82 here.
    assert accuracy.get() > 0.86


def test_package_exports():
    assert streammargin.KernelALMAClassifier is KernelALMAClassifier
    assert kernel("linear")(np.ones(2), np.ones(2)) == 2.0
    assert NAMES == ["a", "b", "c"]
