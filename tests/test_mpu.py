"""The Margin Perceptron with Unlearning against the paper: hand-computed steps, a straight
transcription of the rule, the paper's bounds (Theorems 1 and 2, eq. 23 and 24) and liblinear."""

from __future__ import annotations

import base64
import json
import math
import pathlib
import pickle
import warnings

import legacy_streams
import numpy as np
import pytest
from reference_mpu import (
    algorithm_1,
    mpu_online_reference,
    primal_weights,
    svm_dual_coordinate_descent,
)

import streammargin
from streammargin import KernelMPUClassifier, LinearMPUClassifier, MPUClassifier, state
from streammargin.jit import kernels as kjit
from streammargin.jit import mpu as mpu_jit
from streammargin.memory import memory_bound
from streammargin.mpu import dual_objective, fit_batch, objective

# Online -------------------------------------------------------------------------------------------


def test_hand_computed_steps():
    # No intercept, no cap, gap 2 and epsilon 2: b / R^2 = 2 (2 + 2) / 2 = 4, db / R^2 = 2. Below,
    # everything is in units of R = 5 (the first norm), where the patterns z / R are:
    # z1 = (0.6, 0.8), z2 = -(1, 0), z3 = (0, 1), each of squared norm 1, so a multiple update
    # makes floor((4 - s) / 1) + 1 learning steps and the band of rest is (4, 6).
    model = MPUClassifier(C=None, epsilon=2.0, gap=2.0, replay=1, budget=10, fit_intercept=False)

    # t1: s = 0 -> 5 steps, a = (3, 4). The replay of z1 finds s = 5 in (4, 6): nothing.
    model.learn_one({"u": 3.0, "v": 4.0}, True)
    assert (model.n_learning_steps, model.R, model.b, model.db) == (5, 5.0, 100.0, 50.0)
    # w = a / b in the original units: (3, 4) * 5 / 100.
    assert model.weights == pytest.approx({"u": 0.15, "v": 0.2}, abs=1e-12)
    # t2: x = (5, 0), y = -1: s = -3 -> 8 steps, a = (-5, 4); the replay of z2 sees s = 5.
    model.learn_one({"u": 5.0, "v": 0.0}, False)
    # t3: x = (0, 5), y = +1: s = 4 <= 4 -> 1 step, a = (-5, 5); the replay of z3 sees s = 5.
    model.learn_one({"u": 0.0, "v": 5.0}, True)
    assert model.dual_counts.tolist() == [5, 8, 1]
    # t4: x = (0, -5), y = -1 is z = (0, 1) again with s = 5 > 4: not a violator, not cached. The
    # replay (cursor 3 % 3 = 0) presents z1: s = -3 + 4 = 1 -> 4 steps, a = (-2.6, 8.2).
    model.learn_one({"u": 0.0, "v": -5.0}, False)
    assert model.dual_counts.tolist() == [9, 8, 1]
    assert model.cache_size == 3
    # t5: x = (-5, 0), y = +1, z = (-1, 0): s = 2.6 -> floor(1.4) + 1 = 2 steps, a = (-4.6, 8.2);
    # the replay presents z2 at s = 4.6: nothing.
    model.learn_one({"u": -5.0, "v": 0.0}, True)
    assert model.n_unlearning_steps == 0
    # t6: x = (0, 5), y = +1 has s = 8.2: not cached. The replay presents z3 at s = 8.2 >= 4 + 2
    # with I_3 = 1: min(floor(2.2) + 1, 1) = 1 unlearning step, a = (-4.6, 7.2).
    model.learn_one({"u": 0.0, "v": 5.0}, True)
    assert model.dual_counts.tolist() == [9, 8, 0, 2]
    assert (model.n_learning_steps, model.n_unlearning_steps) == (20, 1)
    assert (model.support_size, model.cache_size) == (3, 4)
    # a = 9 z1 + 8 z2 + 2 z4 = (5.4 - 8 - 2, 7.2); w = a / (4 * 5) in the original units.
    assert model.weights == pytest.approx({"u": -0.23, "v": 0.36}, abs=1e-12)
    assert model.decision_one({"u": 3.0, "v": 4.0}) == pytest.approx(0.75, abs=1e-12)


def random_stream(rng, n, d, noise=0.1, scale=1.0, drift_at=None):
    """Dense dicts with labels from a hyperplane with a bias; labels flip after `drift_at`."""
    u = rng.normal(size=d)
    out = []
    for t in range(n):
        x = rng.normal(size=d) * scale
        label = x @ u + 0.5 * scale + noise * scale * rng.normal() > 0
        if drift_at is not None and t >= drift_at:
            label = not label
        out.append(({f"f{i}": float(v) for i, v in enumerate(x)}, bool(label)))
    return out


def dense(stream, d):
    return [(np.array([x[f"f{i}"] for i in range(d)]), 1 if y else -1) for x, y in stream]


def rbf(gamma):
    return lambda u, v: math.exp(-gamma * float((u - v) @ (u - v)))


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"C": None, "epsilon": 1.0, "budget": 25, "replay": 3},
        {"C": 0.05, "epsilon": 0.5, "budget": 30, "replay": 2, "unlearn": False},
        {"kernel": "rbf", "gamma": 0.3, "C": 0.5, "epsilon": 0.5, "budget": 40, "replay": 5},
        {"kernel": "linear", "C": 0.02, "budget": 20, "fit_intercept": False},
    ],
    ids=["default", "hard-margin", "no-unlearning", "rbf", "linear-kernel"],
)
def test_equals_the_straight_transcription(params):
    """Units of R, closed-form multiple updates, swap removal and the Gram matrix change nothing:
    the cache, its counts and the step counters equal the dense step-by-step transcription's."""
    rng = np.random.default_rng(7)
    d = 4
    # Norms that grow now and then, so the counts get rescaled along the way.
    stream = random_stream(rng, 300, d)
    for t in (60, 140, 220):
        stream[t] = ({k: 3.0 * v for k, v in stream[t][0].items()}, stream[t][1])
    model = MPUClassifier(**params)
    for x, y in stream:
        model.learn_one(x, y)
    config = {"C": 0.01, "epsilon": 0.1, "gap": 3.0, "budget": 1000, "replay": 16, "unlearn": True}
    config.update({k: v for k, v in params.items() if k in config})
    rho = 0.0 if params.get("fit_intercept") is False else 1.0
    kernel = rbf(params["gamma"]) if params.get("kernel") == "rbf" else None
    ref = mpu_online_reference(dense(stream, d), rho=rho, kernel=kernel, **config)

    size = model.cache_size
    assert size == len(ref["cache"])
    assert model.dual_counts.tolist() == [p["count"] for p in ref["cache"]]
    slots = model._slots[:size]
    assert slots[:, kjit.LABEL].tolist() == [p["y"] for p in ref["cache"]]
    assert slots[:, kjit.BORN].tolist() == [p["born"] for p in ref["cache"]]
    np.testing.assert_array_equal(model._support[:size, :d], [p["x"] for p in ref["cache"]])
    assert model.n_learning_steps == ref["learning"]
    assert model.n_unlearning_steps == ref["unlearning"]
    assert model.n_evictions == ref["evictions"]
    assert model.R == pytest.approx(ref["R"], rel=1e-12)
    assert model.I == (None if params.get("C", 0.01) is None else ref["I"])
    if not params.get("unlearn", True):
        assert model.n_unlearning_steps == 0
    if params.get("kernel") is None:
        w = primal_weights(ref, rho)
        learnt = [model.weights[f"f{i}"] for i in range(d)]
        assert learnt == pytest.approx(w[:d], rel=1e-9, abs=1e-12)
        assert model.intercept == pytest.approx(w[d] * rho, rel=1e-9, abs=1e-12)


def test_the_gap_and_the_cap_follow_R_and_the_learnt_svm_is_kept():
    """R grows: db = 3 R^2 > R^2 stays true, b and I grow with R^2, and rescaling the counts keeps
    alpha_k = I_k / b, so the decision function does not move (up to the rounding of the counts)."""
    rng = np.random.default_rng(3)
    model = MPUClassifier(replay=0)
    for x, y in random_stream(rng, 300, 3):
        model.learn_one(x, y)
        assert model.db == pytest.approx(3 * model.R**2) and model.db > model.R**2
    probes = [x for x, _ in random_stream(rng, 20, 3)]
    before = [model.decision_one(x) for x in probes]
    R, b, I, counts = model.R, model.b, model.I, model.dual_counts
    # A far point on the side the model already predicts, with a large margin: not a violator.
    far = {"f0": 0.0, "f1": 0.0, "f2": 0.0}
    far_score = model.decision_one(far)
    direction = np.array([model.weights[f"f{i}"] for i in range(3)])
    far = {f"f{i}": float(v) for i, v in enumerate(50 * direction / np.linalg.norm(direction))}
    assert model.decision_one(far) > max(1.0, far_score)
    model.learn_one(far, True)
    growth = (model.R / R) ** 2
    assert growth > 10
    assert model.b == pytest.approx(b * growth) and model.db == pytest.approx(3 * model.R**2)
    assert model.I == pytest.approx(I * growth, abs=growth + 1)
    assert model.cache_size == len(counts)  # the far point was not cached
    expected = np.minimum(np.floor(counts * growth + 0.5), model.I)
    np.testing.assert_array_equal(model.dual_counts, expected)
    # Each alpha_k = I_k / b moved by at most the rounding of its count, 0.5 / b, or by the cap.
    size = model.cache_size
    capped = counts * growth > model.I
    Z = np.hstack([model._support[:size, :3], np.ones((size, 1))])
    Z *= model._slots[:size, [kjit.LABEL]]
    for x, old in zip(probes, before):
        zx = Z @ np.array([x[f"f{i}"] for i in range(3)] + [1.0])
        rounding = np.where(capped, np.abs(counts * growth - model.I), 0.5) / model.b
        assert abs(model.decision_one(x) - old) <= rounding @ np.abs(zx) + 1e-12


def test_weights_are_the_counts_times_the_cached_patterns_with_evictions():
    rng = np.random.default_rng(5)
    model = MPUClassifier(budget=40, replay=3)
    stream = random_stream(rng, 2000, 5, noise=0.5)
    for i, (x, y) in enumerate(stream):
        model.learn_one(x, y)
        assert model.cache_size <= 40
    assert model.n_evictions > 100
    size = model.cache_size
    cached = np.hstack([model._support[:size, :5], np.ones((size, 1))])
    a = (model.dual_counts * model._slots[:size, kjit.LABEL]) @ cached
    w = a / model.b
    assert [model.weights[f"f{i}"] for i in range(5)] == pytest.approx(w[:5], rel=1e-9, abs=1e-12)
    assert model.intercept == pytest.approx(w[5], rel=1e-9, abs=1e-12)


def test_invariant_to_a_rescaling_of_the_features():
    rng = np.random.default_rng(11)
    stream = random_stream(rng, 500, 4, noise=0.3)
    for kernel_params in ({}, {"kernel": "linear"}):
        models = {
            s: MPUClassifier(C=None, fit_intercept=False, **kernel_params) for s in (1.0, 1e6)
        }
        for x, y in stream:
            for s, model in models.items():
                model.learn_one({k: v * s for k, v in x.items()}, y)
        a, b = models.values()
        assert a.dual_counts.tolist() == b.dual_counts.tolist()
        for x, _ in stream[:50]:
            scaled = {k: v * 1e6 for k, v in x.items()}
            assert a.decision_one(x) == pytest.approx(b.decision_one(scaled), rel=1e-9)


def test_the_linear_kernel_dual_form_equals_the_primal_form():
    rng = np.random.default_rng(12)
    stream = random_stream(rng, 1500, 6, noise=0.4)
    # (C="auto" is 0.01 for the primal form, 1.0 with a kernel: the same C for both here)
    primal = MPUClassifier(budget=60, C=0.01)
    dual = MPUClassifier(budget=60, kernel="linear", C=0.01)
    for x, y in stream:
        primal.learn_one(x, y)
        dual.learn_one(x, y)
    assert primal.counters == dual.counters
    for x, _ in stream[:100]:
        assert dual.decision_one(x) == pytest.approx(primal.decision_one(x), rel=1e-9, abs=1e-12)


def converge_on_cache(model, data, max_sweeps=100_000):
    """Learn the data once, then replay the cache until a sweep makes no update."""
    for x, y in data:
        model.learn_one(x, y)
    for _ in range(max_sweeps):
        if model.replay_cache() == 0:
            return
    raise AssertionError("the MPU did not converge on its cache")


def converge_on_data(model, data, max_epochs=1000):
    """Present the data again and again (as the paper's cycles) until an epoch makes no step and
    a sweep over the cache makes no update."""
    for _ in range(max_epochs):
        steps = model.n_learning_steps + model.n_unlearning_steps
        for x, y in data:
            model.learn_one(x, y)
        if model.n_learning_steps + model.n_unlearning_steps == steps and not model.replay_cache():
            return
    raise AssertionError("the MPU did not converge on the data")


def test_theorem_1_hard_margin_fraction():
    """Separable data, I = infinity: at convergence the margin is a fraction f of the maximum margin
    with f > 1 / (1 + db / b) = 1 / (1 + epsilon / (2 + epsilon)), and the after-run bound (12)
    f >= d' (t+ - t-) / ||a|| holds for the cached patterns' counts."""
    rng = np.random.default_rng(2)
    u = np.array([1.0, -2.0, 0.5])
    X = rng.normal(size=(400, 3))
    keep = np.abs(X @ u) / np.linalg.norm(u) > 0.3
    X = X[keep][:60]
    y = np.sign(X @ u)
    data = [({f"f{i}": float(v) for i, v in enumerate(x)}, bool(t > 0)) for x, t in zip(X, y)]
    epsilon = 0.5
    model = MPUClassifier(C=None, epsilon=epsilon, fit_intercept=False, budget=5000, replay=7)
    converge_on_data(model, data)
    w = np.array([model.weights[f"f{i}"] for i in range(3)])
    achieved = np.min(y * (X @ w)) / np.linalg.norm(w)
    from sklearn.svm import SVC

    svm = SVC(kernel="linear", C=1e8, tol=1e-10).fit(np.vstack([X, -X]), np.hstack([y, -y]))
    best = 1.0 / np.linalg.norm(svm.coef_[0])  # symmetrised: the bias is 0, the margin homogeneous
    assert achieved <= best * (1 + 1e-6)
    assert achieved / best > 1.0 / (1.0 + epsilon / (2.0 + epsilon))
    # (12): d <= ||a|| / (t+ - t-) since u . a >= d sum_k I_k, so f >= d' sum_k I_k / ||a||.
    size = model.cache_size
    a = (model.dual_counts * model._slots[:size, kjit.LABEL]) @ model._support[:size, :3]
    assert achieved / best >= achieved * model.dual_counts.sum() / np.linalg.norm(a) - 1e-9


def test_eq_23_online_on_the_cache():
    """Converged on a fixed data set, the online MPU's w = a / b is within the before-run accuracy
    epsilon of the SVM (penalty Cp = I / b) on the patterns of its cache."""
    rng = np.random.default_rng(4)
    stream = random_stream(rng, 80, 3, noise=0.8)
    epsilon = 0.2
    model = MPUClassifier(C=0.5, epsilon=epsilon, budget=5000, replay=11)
    converge_on_cache(model, stream)
    size = model.cache_size
    Z = np.hstack([model._support[:size, :3], np.ones((size, 1))])
    y = model._slots[:size, kjit.LABEL]
    Cp = model.I / model.b
    w = np.array([model.weights[f"f{i}"] for i in range(3)] + [model.intercept])
    w_opt, alpha_opt = svm_dual_coordinate_descent(Z, y, Cp)
    J, J_opt = objective(w, Z, y, Cp), objective(w_opt, Z, y, Cp)
    assert dual_objective(alpha_opt, Z, y) == pytest.approx(J_opt, rel=1e-8)
    assert J_opt <= J < (1 + epsilon) * J_opt


def test_unlearning_recovers_from_a_drift():
    """After the labels flip, the old support must be unlearnt: the MPU unlearns, and it is more
    accurate after the flip than the same cache without unlearning."""
    rng = np.random.default_rng(9)
    stream = random_stream(rng, 4000, 4, noise=0.2, drift_at=2000)
    accuracy = {}
    for unlearn in (True, False):
        # replay 4 (the default before 16): the margin over the classic margin perceptron is
        # thin here (0.913 / 0.912 at 4, 0.908 / 0.912 at 16; replays also undo old support).
        model = MPUClassifier(budget=300, unlearn=unlearn, replay=4)
        hits = 0
        for t, (x, y) in enumerate(stream):
            if t >= 2000:
                hits += model.predict_one(x) == y
            model.learn_one(x, y)
        accuracy[unlearn] = hits / 2000
        assert (model.n_unlearning_steps > 0) == unlearn
    assert accuracy[True] > 0.85
    assert accuracy[True] >= accuracy[False]


def test_kernel_form_learns_what_no_hyperplane_can():
    from river import datasets, evaluate, metrics, preprocessing

    stream = list(datasets.Bananas().take(2500))
    rbf = MPUClassifier(kernel="rbf", C=1.0, gamma=1.0, budget=300)
    rbf_model = preprocessing.StandardScaler() | rbf
    linear = preprocessing.StandardScaler() | MPUClassifier()
    rbf_accuracy = evaluate.progressive_val_score(stream, rbf_model, metrics.Accuracy()).get()
    linear_accuracy = evaluate.progressive_val_score(stream, linear, metrics.Accuracy()).get()
    assert linear_accuracy < 0.65 < 0.85 < rbf_accuracy
    assert rbf_model["KernelMPUClassifier"].cache_size <= 300


def test_zero_instances_and_huge_norms():
    model = MPUClassifier(fit_intercept=False)
    model.learn_one({}, True)
    model.learn_one({"a": 0.0}, False)
    assert model.counters["trials"] == 2 and model.n_learning_steps == 0 and model.R == 0.0
    for v in (1e-300, 1e300, -1e300, 1.0, 1e-300):
        model.learn_one({"a": v, "b": 1.0}, v > 0)
        assert math.isfinite(model.decision_one({"a": 1e308, "b": -1e308}))
    assert model.R == pytest.approx(1e300)
    assert model.I is not None and model.I <= 2**53


def test_exact_ties_do_not_depend_on_the_order_of_the_features():
    """Phishing's features are 0, 0.5 and 1: margins land exactly on b and b + db, and step counts
    on integers. Broken by the rounding of sums, such ties made the hard-margin model depend on
    the dict order (River's checker caught it); they must resolve as exact arithmetic would."""
    from river import datasets

    data = list(datasets.Phishing().take(300))
    rng = np.random.default_rng(0)
    for params in ({"C": None, "budget": 8, "replay": 3, "fit_intercept": False}, {"C": None}):
        reference = MPUClassifier(**params)
        for x, y in data:
            reference.learn_one(x, y)
        for _ in range(3):
            model = MPUClassifier(**params)
            for x, y in data:
                model.learn_one({k: x[k] for k in rng.permutation(list(x))}, y)
            assert model.counters == reference.counters
            assert model.dual_counts.tolist() == reference.dual_counts.tolist()
            for x, _ in data[:50]:
                assert model.decision_one(x) == pytest.approx(reference.decision_one(x), rel=1e-9)


def test_tampered_states_are_refused():
    from streammargin import state

    model = MPUClassifier(budget=5)
    for x, y in random_stream(np.random.default_rng(0), 50, 2):
        model.learn_one(x, y)
    for array, index, value in (
        ("_st", 0, 6.0),  # cache size above the budget
        ("_st", -1, np.nan),
        ("_slots", (0, kjit.COEF), -1.0),
        ("_slots", (0, kjit.COEF), 0.5),
        ("_slots", (0, kjit.LABEL), 0.0),
    ):
        saved = model.to_state()
        saved["arrays"][array] = saved["arrays"][array].copy()
        saved["arrays"][array][index] = value
        with pytest.raises(state.StateError):
            streammargin.from_state(saved)
    assert streammargin.from_state(model.to_state()).counters == model.counters


def test_bad_params_raise():
    for params in (
        {"C": 0.0},
        {"C": -1.0},
        {"C": math.inf},
        {"epsilon": 0.0},
        {"gap": 1.0},
        {"gap": 0.5},
        {"budget": 0},
        {"replay": -1},
        {"kernel": "sigmoid"},
        {"intercept_scale": 0.0},
    ):
        with pytest.raises(ValueError):
            MPUClassifier(**params)


def test_counters_and_exports():
    model = MPUClassifier()
    model.learn_one({"a": 1.0}, True)
    assert set(model.counters) == {
        "learning_steps",
        "unlearning_steps",
        "support_size",
        "cache_size",
        "evictions",
        "trials",
        "features",
        "features_hashed",
    }
    assert streammargin.MPUClassifier is MPUClassifier
    with pytest.raises(AttributeError):
        MPUClassifier(kernel="rbf").weights


# One class per form, and their public name ------------------------------------------------------


def test_mpu_classifier_builds_the_form_its_kernel_names():
    linear = MPUClassifier(C=0.05, budget=7, fit_intercept=False)
    assert type(linear) is LinearMPUClassifier and isinstance(linear, MPUClassifier)
    assert linear._get_params() == {
        "C": 0.05, "epsilon": 0.1, "gap": 3.0, "budget": 7, "replay": 16, "unlearn": True,
        "fit_intercept": False, "intercept_scale": 1.0, "max_features": 2048,
    }
    for kernel in ("rbf", "poly", "linear"):
        model = MPUClassifier(kernel=kernel, gamma=0.3, budget=7)
        assert type(model) is KernelMPUClassifier and isinstance(model, MPUClassifier)
        assert model._get_params() == KernelMPUClassifier(
            kernel=kernel, gamma=0.3, budget=7
        )._get_params()
    assert MPUClassifier(0.5).C == 0.5  # positional, in the order of before
    # The kernel params are validated although the linear form ignores them, as before.
    for params in ({"gamma": -1.0}, {"degree": 0}, {"coef0": math.inf}):
        with pytest.raises(ValueError, match=next(iter(params))):
            MPUClassifier(**params)
    with pytest.raises(ValueError, match="kernel"):
        KernelMPUClassifier(kernel=None)
    assert not hasattr(MPUClassifier(kernel="rbf"), "weights")
    assert not isinstance(streammargin.ALMAClassifier(), MPUClassifier)


def test_each_form_clones_pickles_and_saves_as_itself():
    for model in (MPUClassifier(budget=6), MPUClassifier(kernel="rbf", budget=6)):
        for x, y in random_stream(np.random.default_rng(3), 30, 3):
            model.learn_one(x, y)
        form = type(model)
        assert type(model.clone()) is form
        assert model.to_state()["model"] == form.__name__
        for twin in (pickle.loads(pickle.dumps(model)), streammargin.from_state(model.to_state())):
            assert type(twin) is form
            assert twin.counters == model.counters
    assert memory_bound(MPUClassifier) == memory_bound(LinearMPUClassifier)
    assert memory_bound(MPUClassifier, {"kernel": "rbf", "budget": 50}) == memory_bound(
        KernelMPUClassifier, {"budget": 50}
    )
    assert memory_bound(MPUClassifier, {"gamma": 2.0, "budget": 50}) == memory_bound(
        LinearMPUClassifier, {"budget": 50}
    )


# States saved by the one-class MPUClassifier (before the split into two classes), made by the
# code of that version with the stream below: the state after 40 records, the probabilities of
# the last 20 records before and after learning them (tests/data/, generated once).
LEGACY = json.loads(
    (pathlib.Path(__file__).parent / "data" / "mpu_states_before_the_split.json").read_text()
)


def legacy_stream(labels):
    return legacy_streams.legacy_stream(
        labels, seed=1, n_features=4, binary_target=lambda x: x["f0"] + 0.5 * x["f1"]
    )


@pytest.mark.parametrize(
    ("name", "form", "labels"),
    [
        ("linear", LinearMPUClassifier, (True, False)),
        ("rbf", KernelMPUClassifier, (True, False)),
        ("ovr", streammargin.OneVsRestClassifier, ("a", "b", "c")),
    ],
)
def test_a_state_of_the_one_class_mpu_restores_as_its_form(name, form, labels):
    """A checkpoint written before the split predicts and learns as the model that wrote it."""
    fixture = LEGACY[name]
    saved = state.loads(base64.b64decode(fixture["state"]))
    assert saved["model"] == form.__name__ if form is streammargin.OneVsRestClassifier else (
        saved["model"] == "MPUClassifier" and "kernel" in saved["params"]
    )  # the one class: its name and its kernel param
    model = streammargin.from_state(saved)
    assert type(model) is form
    if form is streammargin.OneVsRestClassifier:
        assert all(type(m) is LinearMPUClassifier for m in model.classifiers.values())
    legacy_streams.check_continues_as_saved(model, legacy_stream(labels), fixture)
    # and it saves as what it is now
    assert type(streammargin.from_state(state.loads(state.dumps(model.to_state())))) is form


def legacy(name):
    return state.loads(base64.b64decode(LEGACY[name]["state"]))


@pytest.mark.parametrize(
    "tamper",
    [
        lambda s: s["arrays"].pop("_gram"),
        lambda s: s["arrays"].update(_gram=np.ones((1, 1))),
        lambda s: s["arrays"].update(_margins=[]),
        lambda s: s["params"].update(gamma=-1.0),
        lambda s: s["params"].update(degree=True),
        lambda s: s.update(params=[1]),
        lambda s: s.update(arrays=None),
        lambda s: s["params"].update(kernel="rbf"),  # the arrays of the linear form
        lambda s: s["params"].update(kernel=["rbf"]),
        lambda s: s["params"].update(budget=10**9),
        lambda s: s.pop("values"),
    ],
)
def test_a_tampered_state_of_the_one_class_mpu_is_refused(tamper):
    saved = legacy("linear")
    tamper(saved)
    with pytest.raises(state.StateError):
        streammargin.from_state(saved)


def test_a_kernel_state_of_the_one_class_mpu_needs_empty_primal_weights():
    saved = legacy("rbf")
    saved["arrays"]["_weights"] = np.zeros(3)
    with pytest.raises(state.StateError, match="_weights"):
        streammargin.from_state(saved)


def test_flipped_bytes_of_a_one_class_mpu_state_restore_or_raise_state_error():
    rng = np.random.default_rng(5)
    for name in ("linear", "rbf", "ovr"):
        data = bytearray(base64.b64decode(LEGACY[name]["state"]))
        for _ in range(150):
            flipped = bytearray(data)
            position = int(rng.integers(len(flipped)))
            flipped[position] ^= 1 << int(rng.integers(8))
            try:
                model = streammargin.from_state(state.loads(bytes(flipped)))
            except state.StateError:
                continue
            proba = model.predict_proba_one({"f0": 1.0, "f1": -2.0})
            assert all(math.isfinite(p) for p in proba.values())


# Batch --------------------------------------------------------------------------------------------


def standardised(X):
    X = (X - X.mean(axis=0)) / np.where(X.std(axis=0) > 0, X.std(axis=0), 1.0)
    return np.hstack([X, np.ones((len(X), 1))])


@pytest.fixture(scope="module")
def breast_cancer():
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    return standardised(X), 2.0 * y - 1.0


def liblinear(X, y, C):
    from sklearn.svm import LinearSVC

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        svc = LinearSVC(
            loss="hinge", dual=True, fit_intercept=False, C=C, tol=1e-8, max_iter=200_000
        )
        return svc.fit(X, y).coef_[0]


@pytest.mark.parametrize("C", [0.1, 1.0])
def test_fit_batch_reaches_liblinear_within_the_after_run_bound(breast_cancer, C):
    X, y = breast_cancer
    w, info = fit_batch(X, y, C=C, epsilon=0.01)
    J_lib = objective(liblinear(X, y, C), X, y, C)
    assert info["stopped_by"] == "bound" and info["epsilon_after"] <= 0.01
    assert info["J"] == pytest.approx(objective(w, X, y, C), rel=1e-12)
    # Weak duality: L(alpha) <= J_opt <= J(w_lib), and (J - J_opt) / J_opt <= epsilon_after.
    assert info["dual_objective"] <= J_lib * (1 + 1e-9)
    assert (info["J"] - J_lib) / J_lib <= info["epsilon_after"] + 1e-9
    alpha = info["alpha"]
    assert np.all(alpha >= 0) and np.all(alpha <= C * (1 + 1e-12))
    assert info["support_size"] == np.count_nonzero(alpha)
    assert w.shape == (X.shape[1],)  # X used as given: no augmentation of its own


def test_bounds_against_the_exact_optimum_and_eq_23_at_convergence():
    """On a small noisy set, with J_opt from dual coordinate descent run to 1e-12: the after-run
    bound (eq. 24) holds at every stopping point, and a run to convergence is within the
    before-run accuracy (eq. 23)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = np.sign(X @ np.array([1.0, -1.0, 0.5]) + 0.7 * rng.normal(size=60))
    X = np.hstack([X, np.ones((60, 1))])
    C = 0.7
    w_opt, alpha_opt = svm_dual_coordinate_descent(X, y, C)
    J_opt = objective(w_opt, X, y, C)
    assert dual_objective(alpha_opt, X, y) == pytest.approx(J_opt, rel=1e-9)
    for epsilon in (0.3, 0.1, 0.01):
        _, info = fit_batch(X, y, C=C, epsilon=epsilon, seed=1)
        assert info["dual_objective"] <= J_opt + 1e-9 <= info["J"] + 2e-9
        assert (info["J"] - J_opt) / J_opt <= info["epsilon_after"] <= epsilon
    for epsilon_before in (0.05, 0.01):
        _, info = fit_batch(X, y, C=C, epsilon=1e-15, epsilon_before=epsilon_before)
        assert info["converged"]
        assert (info["J"] - J_opt) / J_opt < epsilon_before
        assert info["epsilon_after"] < epsilon_before  # (28) and (31): J / L - 1 < 2r / (1 - r)


def test_converged_batch_state_is_a_fixed_point_of_algorithm_1():
    """A converged run leaves every pattern where Algorithm 1 would not touch it, obeys Theorem 2's
    bound on the number of steps, and Algorithm 1 itself (single steps, in order) converges to a
    state with the same properties."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 2))
    y = np.sign(X[:, 0] - 0.3 * X[:, 1] + 0.5 * rng.normal(size=40))
    X = np.hstack([X, np.ones((40, 1))])
    C, epsilon_before = 1.0, 0.5
    _, info = fit_batch(X, y, C=C, epsilon=1e-15, epsilon_before=epsilon_before)
    assert info["converged"]
    cap, b, db = info["I"], info["b"], info["db"]
    Z = y[:, None] * X
    R2 = np.max(np.einsum("ij,ij->i", Z, Z))
    assert db == pytest.approx(3 * R2) and cap == math.floor(C * db * (2 + 0.5) / 0.5) + 1
    assert b == pytest.approx(cap / C)

    def check_fixed_point(counts, a, steps, unsteps, cap, b):
        s = Z @ a
        learnable = (s <= b) & (counts < cap)
        unlearnable = (s >= b + db) & (counts > 0)
        assert not learnable.any() and not unlearnable.any()
        free = (counts > 0) & (counts < cap)  # 0 < I_k < I: inside the band (b, b + db)
        assert np.all(s[free] > b) and np.all(s[free] < b + db)
        # Theorem 2 (eq. 22): t <= N I (2b + db) / (db - R^2), via t- <= (t+ - t-)(2b + R^2) /
        # (2 (db - R^2)) with t+ - t- = sum_k I_k.
        assert steps - unsteps == counts.sum()
        assert unsteps <= counts.sum() * (2 * b + R2) / (2 * (db - R2))
        assert steps + unsteps <= len(Z) * cap * (2 * b + db) / (db - R2)

    counts = info["alpha"] * b
    np.testing.assert_allclose(counts, np.round(counts), atol=1e-6)
    counts = np.round(counts)
    steps, unsteps = info["n_learning_steps"], info["n_unlearning_steps"]
    check_fixed_point(counts, Z.T @ counts, steps, unsteps, cap, b)
    assert info["n_unlearning_steps"] > 0

    # Algorithm 1 verbatim on a smaller cap (single steps are slow): the same fixed-point laws.
    cap, b = 40, 40 / C
    a, counts, steps, unsteps, _ = algorithm_1(Z, cap, b, db)
    check_fixed_point(counts.astype(float), a, steps, unsteps, cap, b)


def test_multiple_updates_equal_repeated_presentations():
    """batch_pass on one pattern = Algorithm 1 presenting that pattern again and again."""
    from streammargin.jit import mpu as mpu_jit

    rng = np.random.default_rng(8)
    X = rng.normal(size=(5, 3))
    y = np.array([1.0, -1.0, 1.0, 1.0, -1.0])
    sq = np.einsum("ij,ij->i", X, X)
    b, db, cap = 50.0, 3 * sq.max(), 30.0
    run = np.array([b, db, cap, b, 0.0, 0.0])
    a, counts = np.zeros(3), np.zeros(5)
    a_ref, counts_ref = np.zeros(3), np.zeros(5)
    order = np.array([0, 1, 2, 3, 4, 0, 2, 1, 4, 3, 3], dtype=np.int64)
    for k in order:
        mpu_jit.batch_pass(X, y, sq, a, counts, run, np.array([k]), 0, np.empty(1, np.int64))
        z = y[k] * X[k]
        while True:
            s = a_ref @ z
            if s <= b and counts_ref[k] < cap:
                a_ref, counts_ref[k] = a_ref + z, counts_ref[k] + 1
            elif counts_ref[k] > 0 and s >= b + db:
                a_ref, counts_ref[k] = a_ref - z, counts_ref[k] - 1
            else:
                break
        assert counts.tolist() == counts_ref.tolist()
        np.testing.assert_allclose(a, a_ref, rtol=1e-12, atol=1e-9)


def test_fit_batch_rejects_bad_input():
    X = np.ones((3, 2))
    y = np.array([1, -1, 1])
    for kwargs in ({"C": 0.0}, {"epsilon": 0.0}, {"gap": 1.0}, {"epsilon_before": -1.0}):
        with pytest.raises(ValueError):
            fit_batch(X, y, **kwargs)
    with pytest.raises(ValueError):
        fit_batch(np.array([[1.0, np.nan]]), [1])
    with pytest.raises(ValueError):
        fit_batch(X, [1, -1])
    with pytest.raises(ValueError, match="label"):
        fit_batch(X, [1, 2, 1])
    w, info = fit_batch(np.zeros((4, 2)), [1, -1, 1, 1], C=2.0)
    # Zero patterns cannot be classified: alpha = C for each, J = L = 4 C.
    assert w.tolist() == [0.0, 0.0] and info["J"] == info["dual_objective"] == 8.0


def test_a_pattern_within_the_tie_of_r_is_cached_at_norm_r():
    """With rho = 1, x = {a: 9e-62} sets R = 1, and x = {b: 7.3e-7} has the norm 1 + 2.7e-13: not
    a new R (R_TIE = 1e-12), but its ||z||^2 / R^2 was stored as 1 + 5.3e-13, beyond the
    (0, 1] the restore check (and the rule's Cauchy-Schwarz bounds) take for granted, and the
    checkpoint was refused. It is cached at the norm R, as the dual form already did."""
    model = LinearMPUClassifier()
    model.learn_one({"a": -8.99082190404122e-62}, True)
    model.learn_one({"b": -7.280314328651533e-07}, True)
    n = model.cache_size
    assert n == 2 and np.all(model._slots[:n, mpu_jit.Z_SQ] <= 1.0)
    twin = streammargin.from_state(state.loads(state.dumps(model.to_state())))
    assert twin.predict_proba_one({"b": 1.0}) == model.predict_proba_one({"b": 1.0})


def test_the_count_sum_stays_exact_when_counts_near_2_to_the_53_are_taken_back():
    """A pattern 1e62 times shorter than R takes a multiple update of 2**53 steps (the cap): the
    running sum of counts, 2**53 + 64, rounded, and when that count was unlearnt the sum kept the
    rounding (66 for counts adding to 65): the checkpoint was refused. Beyond 2**53 the sum is
    now counted again."""
    model = LinearMPUClassifier()
    for x in ({"b": -45113861004.86478, "a": -4.36261953488018e-150}, {"b": 2.1767304953512693e72},
              {"b": -45113861004.86478, "a": -4.36261953488018e-150}):
        model.learn_one(x, True)
        n = model.cache_size
        assert model._st[mpu_jit.COUNT_SUM] == np.sum(model._slots[:n, kjit.COEF])
    assert model.n_learning_steps > 2**53  # the multiple update did reach the cap
    twin = streammargin.from_state(state.loads(state.dumps(model.to_state())))
    assert twin.predict_proba_one({"b": 1.0}) == model.predict_proba_one({"b": 1.0})
