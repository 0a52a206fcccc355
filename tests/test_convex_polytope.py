"""The Convex Polytope Machine against the paper: a hand-computed case, a straight dense
transcription (tests/reference_cpm.py), the polytope's geometry, ASSIGN's entropy, and the
multiclass contract (labels kept as given) that tests/test_common.py checks only for binary
models."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pandas as pd
import pytest
from reference_cpm import ReferenceCPM, entropy

import streammargin
from streammargin import ConvexPolytopeClassifier, state


def state_bytes(model) -> bytes:
    return state.dumps(model.to_state())


def test_hand_computed_single_polytope():
    """lambda = 1, K = 2, no intercept, no entropy heuristic, no replay: Algorithm 1 by hand."""
    model = ConvexPolytopeClassifier(
        n_faces=2, l2=1.0, entropy=0.0, polytopes="one", steps=1, fit_intercept=False
    )
    # t = 1, eta = 1: W = 0 scores 0 < 1 on the positive x = (1, 0); ASSIGN = argmax = face 0.
    # W <- (1 - 1) W + 1 x: W_0 = (1, 0), W_1 = 0.
    model.learn_one({"a": 1.0, "b": 0.0}, True)
    assert model.face_weights() == [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 0.0}]
    # t = 2, eta = 1/2, negative x = (0, 1): both faces score 0 > -1, both are pushed down.
    # W_0 = (1/2)(1, 0) - (1/2)(0, 1) = (0.5, -0.5); W_1 = (0, -0.5).
    model.learn_one({"a": 0.0, "b": 1.0}, False)
    faces = model.face_weights()
    assert faces[0] == pytest.approx({"a": 0.5, "b": -0.5}, abs=1e-15)
    assert faces[1] == pytest.approx({"a": 0.0, "b": -0.5}, abs=1e-15)
    # t = 3, eta = 1/3, positive x = (1, 1): scores (0, -0.5), face 0 < 1 is pulled up.
    # W_0 = (2/3)(0.5, -0.5) + (1/3)(1, 1) = (2/3, 0); W_1 = (2/3)(0, -0.5) = (0, -1/3).
    model.learn_one({"a": 1.0, "b": 1.0}, True)
    faces = model.face_weights()
    assert faces[0] == pytest.approx({"a": 2 / 3, "b": 0.0}, abs=1e-15)
    assert faces[1] == pytest.approx({"a": 0.0, "b": -1 / 3}, abs=1e-15)
    # f(x) = max_k W_k . x
    assert model.decision_one({"a": 1.0, "b": 0.0}) == pytest.approx({True: 2 / 3}, abs=1e-15)
    assert model.decision_one({"a": 0.0, "b": 3.0}) == pytest.approx({True: 0.0}, abs=1e-15)
    assert model.face_counts == {True: pytest.approx([0.999 + 1.0, 0.0])}


def test_hand_computed_joint_polytopes():
    """Two classes, K = 1, lambda = 1: the joint hinge moves the true class' face up and the
    other's down only while their difference is below 1."""
    model = ConvexPolytopeClassifier(n_faces=1, l2=1.0, entropy=0.0, steps=1, fit_intercept=False)
    # A single class seen: nothing to separate, only the shrink (t = 1).
    model.learn_one({"a": 1.0}, "x")
    assert model.face_weights("x") == [{"a": 0.0}]
    # t = 2, eta = 1/2, class "y" on (0, 1): f_y - f_x = 0 < 1: W_y += x/2, W_x -= x/2.
    model.learn_one({"b": 1.0}, "y")
    assert model.face_weights("y") == [{"a": 0.0, "b": 0.5}]
    assert model.face_weights("x") == [{"a": 0.0, "b": -0.5}]
    # t = 3, eta = 1/3, class "y" on (0, 4): f_y - f_x = 2 - (-2) = 4 >= 1: shrink only.
    model.learn_one({"b": 4.0}, "y")
    assert model.face_weights("y") == [pytest.approx({"a": 0.0, "b": 1 / 3})]
    assert model.decision_one({"b": 3.0}) == pytest.approx({"x": -1.0, "y": 1.0})
    assert model.predict_one({"b": 3.0}) == "y"


def dense_rows(model, stream):
    """The stream as dense vectors over the model's columns, intercept's constant first."""
    names = model._features.names
    rho = model.intercept_scale if model.fit_intercept else 0.0
    rows = []
    for x, _ in stream:
        v = np.zeros(1 + len(names))
        v[0] = rho
        for k, value in x.items():
            v[1 + names.index(k)] = value
        rows.append(v)
    return rows


def mixture_stream(rng, n, n_classes, n_features=4, density=0.8):
    """Classes made of several Gaussian blobs each; features missing at random."""
    centres = rng.normal(scale=2.0, size=(n_classes, 3, n_features))
    names = [f"f{i}" for i in range(n_features)]
    stream = []
    for _ in range(n):
        c = int(rng.integers(n_classes))
        v = centres[c, rng.integers(3)] + rng.normal(size=n_features)
        present = rng.random(n_features) < density
        x = {names[i]: float(v[i]) for i in rng.permutation(np.flatnonzero(present))}
        stream.append((x, c))
    return stream


@pytest.mark.parametrize(
    ("polytopes", "n_classes", "steps", "entropy_fraction"),
    [
        ("one", 2, 1, 0.0),
        ("one", 2, 3, 0.6),
        ("separate", 3, 1, 0.6),
        ("separate", 2, 4, 0.0),
        ("joint", 2, 1, 0.6),
        ("joint", 4, 3, 0.6),
    ],
)
def test_weights_equal_the_dense_transcription(polytopes, n_classes, steps, entropy_fraction):
    """W = G / (lambda t), decayed ASSIGN counts and replay agree with the straight rule."""
    rng = np.random.default_rng(n_classes * 10 + steps)
    stream = mixture_stream(rng, 600, n_classes)
    params = dict(n_faces=4, l2=0.05, entropy=entropy_fraction, steps=steps, window=50, seed=3)
    model = ConvexPolytopeClassifier(polytopes=polytopes, **params)
    labels = (lambda c: c == 1) if polytopes == "one" else (lambda c: f"class{c}")
    for x, c in stream:
        model.learn_one(x, labels(c))

    reference = ReferenceCPM(
        d=1 + len(model._features.names), K=4, lam=0.05, entropy_fraction=entropy_fraction,
        mode=polytopes, steps=steps, window=50, seed=3,
    )
    codes = {label: i for i, label in enumerate(model.classes)}
    for v, (_, c) in zip(dense_rows(model, stream), stream):
        reference.learn(v, int(c == 1) if polytopes == "one" else codes[labels(c)])

    names = model._features.names
    for p, label in enumerate([True] if polytopes == "one" else model.classes):
        faces = model.face_weights(label)
        for k in range(4):
            got = np.array([faces[k]["__intercept__"]] + [faces[k][n] for n in names])
            np.testing.assert_allclose(got, reference.W[p, k], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(model.face_counts[label], reference.counts[p], rtol=1e-12)
    assert model.n_trials == reference.trials == len(stream)
    probes = [x for x, _ in stream[:50]]
    for x, v in zip(probes, dense_rows(model, [(x, 0) for x in probes])):
        scores = reference.scores(v)
        got = model.decision_one(x)
        assert list(got) == ([True] if polytopes == "one" else model.classes)
        assert list(got.values()) == pytest.approx(list(scores), rel=1e-9, abs=1e-12)


def disk_stream(rng, n):
    """Negatives inside the unit disk, positives in the ring 1.3 < r < 2.5: a convex inside."""
    stream = []
    for _ in range(n):
        if rng.random() < 0.5:
            r, label = math.sqrt(rng.random()), False
        else:
            r, label = rng.uniform(1.3, 2.5), True
        angle = rng.uniform(0, 2 * math.pi)
        stream.append(({"u": r * math.cos(angle), "v": r * math.sin(angle)}, label))
    return stream


def accuracy_after(model, stream, skip):
    hits = 0
    for i, (x, y) in enumerate(stream):
        if i >= skip:
            hits += model.predict_one(x) == y
        model.learn_one(x, y)
    return hits / (len(stream) - skip)


def test_a_polytope_encloses_a_convex_class_that_no_line_separates():
    """The paper's point: K faces enclose the inside class; K = 1 (a linear SVM) cannot."""
    rng = np.random.default_rng(0)
    stream = disk_stream(rng, 6000)
    polytope = ConvexPolytopeClassifier(n_faces=8, polytopes="one")
    line = ConvexPolytopeClassifier(n_faces=1, polytopes="one")
    assert accuracy_after(polytope, stream, 3000) > 0.95
    assert accuracy_after(line, stream, 3000) < 0.7
    # Every positive lies outside: f(x) = max_k W_k . x > 0 on most of the ring, < 0 in the disk.
    assert polytope.decision_one({"u": 0.0, "v": 0.0})[True] < 0
    for angle in np.linspace(0, 2 * math.pi, 12, endpoint=False):
        x = {"u": 2 * math.cos(angle), "v": 2 * math.sin(angle)}
        assert polytope.decision_one(x)[True] > 0


def test_assign_keeps_the_entropy_of_the_faces_up():
    """With h = 0.9 log K the faces share the outside class far more evenly than with h = 0."""

    def count_entropy(entropy_fraction):
        model = ConvexPolytopeClassifier(n_faces=8, polytopes="one", entropy=entropy_fraction)
        for x, y in disk_stream(np.random.default_rng(1), 4000):
            model.learn_one(x, y)
        return entropy(np.array(model.face_counts[True])) / math.log(8)

    free, pushed = count_entropy(0.0), count_entropy(0.9)
    assert pushed > free + 0.1
    assert pushed > 0.8


def test_weights_stay_within_the_pegasos_bound():
    """W = G / (lambda t) is an average of at most t instances per face over lambda:
    ||W_k|| <= max ||(rho, x)|| / lambda."""
    rng = np.random.default_rng(2)
    stream = mixture_stream(rng, 2000, 3)
    model = ConvexPolytopeClassifier(n_faces=5, l2=0.01, polytopes="separate")
    for x, c in stream:
        model.learn_one(x, c)
    radius = max(math.sqrt(1 + sum(v * v for v in x.values())) for x, _ in stream)
    for label in model.classes:
        for face in model.face_weights(label):
            assert math.sqrt(sum(w * w for w in face.values())) <= radius / 0.01 + 1e-9


def test_bananas_beats_every_linear_model():
    """The issue's target: >= 0.80 progressive accuracy on Bananas (River's linear models:
    0.51-0.55)."""
    from river import datasets, evaluate, metrics, preprocessing

    model = preprocessing.StandardScaler() | ConvexPolytopeClassifier()
    accuracy = evaluate.progressive_val_score(datasets.Bananas(), model, metrics.Accuracy())
    assert accuracy.get() >= 0.80


def test_native_multiclass_beats_river_linear_models_on_image_segments():
    from river import datasets, evaluate, linear_model, metrics, preprocessing

    def score(model):
        pipeline = preprocessing.StandardScaler() | model
        return evaluate.progressive_val_score(
            datasets.ImageSegments(), pipeline, metrics.Accuracy()
        ).get()

    cpm = score(ConvexPolytopeClassifier())
    softmax = score(linear_model.SoftmaxRegression())  # River's best linear model here
    assert cpm > softmax + 0.02, (cpm, softmax)


def test_one_polytope_works_through_one_vs_rest():
    from river import datasets, evaluate, metrics, multiclass, preprocessing

    model = preprocessing.StandardScaler() | multiclass.OneVsRestClassifier(
        ConvexPolytopeClassifier(polytopes="one")
    )
    accuracy = evaluate.progressive_val_score(datasets.ImageSegments(), model, metrics.Accuracy())
    assert accuracy.get() > 0.8


@pytest.mark.parametrize("polytopes", ["one", "joint", "separate"])
def test_each_method_returns_one_type_in_every_variant(polytopes):
    """decision_one is {label: f_c(x)} in every variant ({True: f(x)} with one polytope; it was a
    float there and a dict otherwise), decision_many a DataFrame with those columns."""
    model = ConvexPolytopeClassifier(polytopes=polytopes, n_faces=3, steps=2, window=5)
    labels = [True, False] if polytopes == "one" else ["p", "q", "r"]
    rng = np.random.default_rng(4)
    for i in range(30):
        model.learn_one({"a": float(rng.normal()), "b": float(rng.normal())}, labels[i % len(labels)])
    scored = [True] if polytopes == "one" else model.classes
    x = {"a": 0.3, "b": -1.0}
    decision = model.decision_one(x)
    assert type(decision) is dict and list(decision) == scored
    frame = model.decision_many(pd.DataFrame([x, {"a": 1.0}], index=[7, 8]))
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == scored
    assert list(frame.index) == [7, 8] and frame.loc[7].to_dict() == decision
    assert type(model.predict_proba_one(x)) is dict and model.predict_one(x) in model.classes
    assert list(model.predict_proba_many(pd.DataFrame([x])).columns) == model.classes


@pytest.mark.parametrize("polytopes", ["one", "joint", "separate"])
def test_the_written_out_per_record_path_equals_the_base_class_path(polytopes):
    """learn_one and predict_one are MulticlassMarginClassifier's with the hooks written out:
    both paths give the same predictions and the same model, new labels and columns included."""
    from streammargin.base import MulticlassMarginClassifier as Base

    fast = ConvexPolytopeClassifier(polytopes=polytopes, n_faces=3, steps=3, window=6)
    generic = fast.clone()
    labels = [True, False, 1, 0, -1] if polytopes == "one" else ["p", "q", 3, "r", ("t", 1)]
    rng = np.random.default_rng(8)
    for i in range(120):
        x = {f"f{j}": float(v) for j, v in enumerate(rng.normal(size=1 + i // 20))}
        y = labels[int(rng.integers(len(labels)))]
        assert fast.predict_one(x) == Base.predict_one(generic, x)
        fast.learn_one(x, y)
        Base.learn_one(generic, x, y)
    assert fast.classes == generic.classes
    assert state.dumps(fast.to_state()) == state.dumps(generic.to_state())


@pytest.mark.parametrize("steps", [1, 2])
def test_a_state_whose_window_is_narrower_than_its_weights_is_refused(steps):
    """Learning keeps the window's columns equal to the weights' rows; a checkpoint with more
    weight rows than window columns was restored, and its next new feature was written past the
    window's end (a heap corruption that aborted the process)."""
    model = ConvexPolytopeClassifier(steps=steps, window=5, max_features=64)
    for i in range(4):
        model.learn_one({"a": 1.0 + i, "b": 2.0}, "x" if i % 2 else "y")
    saved = model.to_state()
    weights = saved["arrays"]["_weights"]
    assert weights.shape[0] == saved["arrays"]["_window"].shape[1]
    saved["arrays"]["_weights"] = np.vstack([weights, np.zeros((8, weights.shape[1]))])
    with pytest.raises(state.StateError, match="window must have as many columns"):
        streammargin.from_state(saved)
    for i in range(100):  # learning keeps them equal as the space grows
        model.learn_one({f"n{i}": 1.0, "a": float(i)}, "x" if i % 3 else "z")
        assert model._weights.shape[0] == model._window.shape[1]


def test_replay_is_deterministic_and_off_with_one_step():
    stream = mixture_stream(np.random.default_rng(4), 300, 2)
    a, b = ConvexPolytopeClassifier(seed=5), ConvexPolytopeClassifier(seed=5)
    other_seed = ConvexPolytopeClassifier(seed=6)
    for x, c in stream:
        for model in (a, b, other_seed):
            model.learn_one(x, c)
    assert state_bytes(a) == state_bytes(b)
    assert state_bytes(a) != state_bytes(other_seed)
    one_pass = ConvexPolytopeClassifier(steps=1)
    one_pass.learn_one({"a": 1.0}, 0)
    assert one_pass._window.shape[0] == 0


# The multiclass contract: tests/test_common.py assumes binary labels, so the per-class variants
# are checked here for what it checks with True/False.

MULTICLASS = [
    {},
    {"polytopes": "separate", "n_faces": 2, "steps": 2, "window": 7},
    {"n_faces": 1, "steps": 1, "fit_intercept": False},
]
LABELS = ["cat", 2, 0.5, ("t", 1), True, None]


def label_stream(seed, n=120):
    rng = np.random.default_rng(seed)
    names = ["a", "b", "c", 7]
    stream = []
    for i in range(n):
        keys = [names[j] for j in rng.permutation(4)[: 1 + i % 4]]
        x = {k: float(rng.normal()) * [1e-3, 1.0, 1e3][i % 3] for k in keys}
        stream.append((x, LABELS[int(rng.integers(5))]))
    return stream


def finite_scores(model, x):
    scores = model.decision_one(x)
    return all(math.isfinite(s) for s in scores.values())


@pytest.mark.parametrize("params", MULTICLASS)
def test_multiclass_keeps_labels_as_given_and_stays_finite(params):
    model = ConvexPolytopeClassifier(**params)
    assert model.predict_one({"a": 1.0}) is None and model.predict_proba_one({"a": 1.0}) == {}
    seen = []
    for x, y in label_stream(0):
        before = copy.deepcopy(x)
        model.learn_one(x, y)
        assert x == before
        if y not in seen:
            seen.append(y)
        proba = model.predict_proba_one(x)
        assert list(proba) == seen
        assert math.isclose(sum(proba.values()), 1.0) and all(0 <= p <= 1 for p in proba.values())
        assert model.predict_one(x) in seen
        assert finite_scores(model, x)
    assert model.classes == seen
    assert all(np.all(np.isfinite(a)) for a in model.to_state()["arrays"].values())


@pytest.mark.parametrize("params", MULTICLASS)
def test_multiclass_state_and_pickle_round_trips(params):
    model = ConvexPolytopeClassifier(**params)
    stream = label_stream(1)
    for x, y in stream[:60]:
        model.learn_one(x, y)
    restored = streammargin.from_state(state.loads(state_bytes(model)))
    unpickled = pickle.loads(pickle.dumps(model))
    for twin in (restored, unpickled):
        assert twin.classes == model.classes
        assert [type(c) for c in twin.classes] == [type(c) for c in model.classes]
        for x, _ in stream:
            assert twin.predict_proba_one(x) == model.predict_proba_one(x)
            assert twin.decision_one(x) == model.decision_one(x)
    for x, y in stream[60:]:
        for m in (model, restored, unpickled):
            m.learn_one(x, y)
    assert state_bytes(restored) == state_bytes(model) == state_bytes(unpickled)


@pytest.mark.parametrize("params", MULTICLASS)
@pytest.mark.parametrize("label", [None, float("nan"), np.nan, [1], {"a": 1}, object()],
                         ids=lambda label: "object()" if type(label) is object else repr(label))
def test_multiclass_rejects_labels_that_are_not_classes(params, label):
    model = ConvexPolytopeClassifier(**params)
    model.learn_one({"a": 1.0}, "x")
    before = state_bytes(model)
    with pytest.raises(ValueError, match="label"):
        model.learn_one({"a": 2.0, "new": 1.0}, label)
    with pytest.raises(ValueError, match="label"):
        X = pd.DataFrame({"a": [2.0, 1.0], "new": [1.0, 2.0]})
        model.learn_many(X, pd.Series(["x", label]))
    assert state_bytes(model) == before
    assert model.n_features == 1


@pytest.mark.parametrize("params", MULTICLASS)
def test_multiclass_bad_values_leave_the_model_untouched(params):
    model = ConvexPolytopeClassifier(**params)
    for i in range(20):
        model.learn_one({"a": float(i % 3), "b": 1.0 - i % 2}, i % 3)
    before = state_bytes(model)
    for bad in (float("nan"), float("inf"), "1.5", None, [1.0], 10**400):
        with pytest.raises(ValueError, match="'bad_one'"):
            model.learn_one({"a": 1.0, "bad_one": bad}, "brand new label")
        with pytest.raises(ValueError, match="'bad_one'"):
            model.predict_proba_one({"a": 1.0, "bad_one": bad})
    for bad in (float("inf"), "x"):  # in a frame, NaN and None mark an absent feature
        with pytest.raises(ValueError, match="'new'"):
            model.learn_many(pd.DataFrame({"a": [1.0], "new": [bad]}), pd.Series(["other"]))
    assert state_bytes(model) == before
    assert model.classes == [0, 1, 2]


@pytest.mark.parametrize("params", MULTICLASS)
def test_multiclass_huge_and_tiny_values_keep_the_model_finite(params):
    model = ConvexPolytopeClassifier(**params)
    rng = np.random.default_rng(0)
    for i in range(300):
        scale = [1e-300, 1e-8, 1.0, 1e8, 1e300][i % 5]
        x = {f"f{j}": float(v) * scale for j, v in enumerate(rng.normal(size=4))}
        model.learn_one(x, int(x["f0"] > 0) + int(x["f1"] > 0))
        assert finite_scores(model, x)
        assert all(math.isfinite(p) for p in model.predict_proba_one(x).values())
    assert all(np.all(np.isfinite(a)) for a in model.to_state()["arrays"].values())


@pytest.mark.parametrize("params", MULTICLASS)
def test_multiclass_learn_many_equals_learn_one(params):
    stream = label_stream(2, n=200)
    one, many = ConvexPolytopeClassifier(**params), ConvexPolytopeClassifier(**params)
    for x, y in stream:
        one.learn_one(x, y)
    for start in range(0, len(stream), 37):
        batch = stream[start : start + 37]
        many.learn_many(pd.DataFrame([x for x, _ in batch]), pd.Series([y for _, y in batch]))
    assert many.classes == one.classes
    probes = [x for x, _ in label_stream(3, n=40)]
    X = pd.DataFrame(probes, index=range(500, 540))
    proba, labels, scores = many.predict_proba_many(X), many.predict_many(X), many.decision_many(X)
    assert list(proba.columns) == one.classes
    for (i, row), x in zip(proba.iterrows(), probes):
        expected = one.predict_proba_one(x)
        assert row.to_dict() == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert labels[i] == many.predict_one(x)
        assert scores.loc[i].to_dict() == pytest.approx(one.decision_one(x), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    "params",
    [
        {"n_faces": 0},
        {"n_faces": 2.5},
        {"l2": 0.0},
        {"l2": float("nan")},
        {"entropy": 1.5},
        {"polytopes": "two"},
        {"steps": 0},
        {"window": 0},
        {"seed": -1},
        {"intercept_scale": 0.0},
    ],
)
def test_bad_params_raise(params):
    with pytest.raises(ValueError):
        ConvexPolytopeClassifier(**params)


def test_package_exports_and_counters():
    assert streammargin.ConvexPolytopeClassifier is ConvexPolytopeClassifier
    model = ConvexPolytopeClassifier()
    for x, c in mixture_stream(np.random.default_rng(5), 200, 3):
        model.learn_one(x, c)
    counters = model.counters
    assert counters["trials"] == 200 and counters["classes"] == 3
    assert all(isinstance(v, int) for v in counters.values())
