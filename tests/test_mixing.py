"""streammargin.mixing: one model from copies that learnt parts of a stream (issue 25)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from river import compose, preprocessing
from river.datasets import synth

import streammargin
from streammargin import memory, state
from streammargin.jit import alma as alma_jit
from streammargin.jit import convex_polytope as cpm_jit
from streammargin.mixing import assignment, mix

FAST = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)

# One parameter set per family and budget rule, small enough to fill their caches.
MODELS = {
    "ALMA": lambda: streammargin.ALMAClassifier(),
    "ALMA p=3": lambda: streammargin.ALMAClassifier(p=3.0, average_window=None),
    "ALMA last": lambda: streammargin.ALMAClassifier(average=False),
    "BudgetSVM": lambda: streammargin.BudgetSVMClassifier(budget=20),
    "BudgetSVM smallest": lambda: streammargin.BudgetSVMClassifier(
        budget=10, prune="smallest", kernel="poly", gamma=0.5
    ),
    "BudgetPerceptron merge": lambda: streammargin.BudgetPerceptron(budget=10),
    "BudgetPerceptron oldest": lambda: streammargin.BudgetPerceptron(budget=10, eviction="oldest"),
    "BudgetPerceptron random": lambda: streammargin.BudgetPerceptron(
        budget=10, eviction="random", seed=3
    ),
    "BudgetPerceptron smallest": lambda: streammargin.BudgetPerceptron(
        budget=10, eviction="smallest"
    ),
    "BudgetPerceptron project": lambda: streammargin.BudgetPerceptron(
        budget=10, eviction="project", kernel="linear"
    ),
    "KernelALMA": lambda: streammargin.KernelALMAClassifier(budget=10),
    "KernelALMA averaged": lambda: streammargin.KernelALMAClassifier(
        budget=10, eviction="oldest", average=True
    ),
    "SBP": lambda: streammargin.SBPClassifier(window=20, steps=2),
    "MPU": lambda: streammargin.MPUClassifier(budget=20),
    "KernelMPU": lambda: streammargin.MPUClassifier(kernel="rbf", budget=20),
    "CPM": lambda: streammargin.ConvexPolytopeClassifier(n_faces=3, window=30),
    "CPM one": lambda: streammargin.ConvexPolytopeClassifier(polytopes="one", n_faces=3, steps=1),
    "Auto": lambda: streammargin.AutoClassifier(window=50, max_features=64),
}


def stream(n: int, seed: int = 1) -> list:
    return list(synth.Hyperplane(seed=seed, n_features=4, noise_percentage=0.05).take(n))


def trained(make, records, copies: int = 1) -> list:
    """`copies` models, record i learnt by copy i % copies."""
    models = [make() for _ in range(copies)]
    for i, (x, y) in enumerate(records):
        models[i % copies].learn_one(x, y)
    return models


def probabilities(model, records) -> np.ndarray:
    out = []
    for x, _ in records:
        proba = model.predict_proba_one(x)
        out.append([proba.get(label, 0.0) for label in sorted(proba, key=repr)])
    return np.array(out)


def arrays(tree) -> list:
    """The arrays of a state tree, in order."""
    if isinstance(tree, np.ndarray):
        return [tree]
    if isinstance(tree, dict):
        return [a for key in sorted(tree) for a in arrays(tree[key])]
    if isinstance(tree, list):
        return [a for item in tree for a in arrays(item)]
    return []


def round_trip(model):
    return type(model).from_state(state.loads(state.dumps(model.to_state())))


# Identities ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_one_model_with_weight_one_is_the_model(name):
    records = stream(150)
    (model,) = trained(MODELS[name], records[:100])
    mixed = mix([model], [1.0])
    assert mixed is not model
    assert state.dumps(mixed.to_state()) == state.dumps(model.to_state())
    np.testing.assert_array_equal(probabilities(mixed, records[100:]),
                                  probabilities(model, records[100:]))


@pytest.mark.parametrize("name", list(MODELS))
def test_identical_copies_mix_into_the_model(name):
    """k copies of one model, any weights, with or without a base equal to them: the model. Its
    state may be written another way (ALMA's scale and average re-based, the SBP's and the
    budget models' coefficient scale folded in), so it is compared by what it does: the same
    predictions, and the same predictions again after both learnt the same records."""
    records = stream(200)
    (model,) = trained(MODELS[name], records[:100])
    for mixed in (
        mix([model] * 3),
        mix([model] * 3, [0.2, 0.5, 0.3]),
        mix([model] * 3, [1.0, 1.0, 1.0], base=model),
    ):
        original = round_trip(model)
        np.testing.assert_allclose(probabilities(mixed, records[100:]),
                                   probabilities(original, records[100:]), atol=1e-9)
        for x, y in records[100:150]:
            assert mixed.predict_one(x) == original.predict_one(x)
            mixed.learn_one(x, y)
            original.learn_one(x, y)
        np.testing.assert_allclose(probabilities(mixed, records[150:]),
                                   probabilities(original, records[150:]), atol=1e-7)


@pytest.mark.parametrize("name", list(MODELS))
def test_mixing_copies_gives_a_valid_bounded_state(name):
    records = stream(400, seed=2)
    copies = trained(MODELS[name], records[:300], copies=4)
    base = copies[0]
    for mixed in (mix(copies), mix(copies, [1, 2, 3, 4]), mix(copies[1:], [1, 1, 1], base=base)):
        restored = round_trip(mixed)
        assert state.dumps(restored.to_state()) == state.dumps(mixed.to_state())
        got = probabilities(mixed, records[300:])
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(probabilities(restored, records[300:]), got)
        assert memory.memory_size(mixed) <= memory.memory_bound(mixed)
        # and it goes on learning
        for x, y in records[300:]:
            mixed.learn_one(x, y)
        assert np.isfinite(probabilities(mixed, records[:20])).all()


def test_inputs_are_left_as_they_were():
    records = stream(200)
    copies = trained(MODELS["BudgetSVM"], records, copies=3)
    before = [state.dumps(m.to_state()) for m in copies]
    mix(copies)
    mix(copies[1:], [1.0, 1.0], base=copies[0])
    assert [state.dumps(m.to_state()) for m in copies] == before


# Linear models ------------------------------------------------------------------------------------


def test_alma_mix_is_the_weighted_mean_of_the_weights_by_name():
    """p = 2: theta = w; two copies that learnt names in different orders (so in different
    columns) mix into the weighted mean of their weights, name by name; counters too."""
    a = streammargin.ALMAClassifier(average=False)
    b = streammargin.ALMAClassifier(average=False)
    a.learn_one({"u": 1.0, "v": -0.5}, True)
    a.learn_one({"w": 2.0}, False)
    b.learn_one({"w": -1.0, "z": 0.3}, True)
    b.learn_one({"v": 0.7, "u": -0.2}, False)
    b.learn_one({"u": 0.1}, True)
    assert a._features.names != b._features.names
    mixed = mix([a, b], [0.25, 0.75])
    wa, wb = a.weights, b.weights
    for name in {"u", "v", "w", "z"}:
        assert mixed.weights[name] == pytest.approx(0.25 * wa.get(name, 0.0)
                                                    + 0.75 * wb.get(name, 0.0), abs=1e-12)
    assert mixed.intercept == pytest.approx(0.25 * a.intercept + 0.75 * b.intercept, abs=1e-12)
    assert mixed.n_trials == round(0.25 * 2 + 0.75 * 3)
    assert mixed.n_corrections == round(0.25 * a.n_corrections + 0.75 * b.n_corrections)
    assert mixed._features.names == ["u", "v", "w", "z"]  # a's order, then b's new names
    # delta averaging from a common base: base + the sum of the changes
    base = streammargin.ALMAClassifier(average=False)
    base.learn_one({"u": 1.0}, True)
    c1, c2 = (type(base).from_state(base.to_state()) for _ in range(2))
    c1.learn_one({"v": 1.0}, False)
    c2.learn_one({"u": -1.0, "v": 0.5}, False)
    delta = mix([c1, c2], [1.0, 1.0], base=base)

    def vector(m):
        return np.array([m.weights.get("u", 0.0), m.weights.get("v", 0.0), m.intercept])

    expected = vector(base) + (vector(c1) - vector(base)) + (vector(c2) - vector(base))
    expected /= max(1.0, float(np.linalg.norm(expected)))  # (into the unit ball, as ALMA's)
    np.testing.assert_allclose(vector(delta), expected, atol=1e-12)
    assert delta.n_trials == 3


def test_alma_mix_stays_in_the_unit_ball_and_pools_the_average():
    records = stream(300)
    copies = trained(lambda: streammargin.ALMAClassifier(p=3.0), records, copies=3)
    delta = mix(copies, [1.0, 1.0, 1.0], base=streammargin.ALMAClassifier(p=3.0))
    st_ = delta._st
    norm = st_[alma_jit.SCALE] * st_[alma_jit.SUM_P] ** (1.0 / 3.0)
    assert norm <= 1.0 + 1e-9
    # the average's weight is pooled: the three copies' together
    assert st_[alma_jit.DECAYED] == pytest.approx(sum(m._st[alma_jit.DECAYED] for m in copies))


def test_linear_mpu_mix_keeps_whole_counts_within_the_budget():
    records = stream(300)
    copies = trained(lambda: streammargin.MPUClassifier(budget=30), records, copies=3)
    mixed = mix(copies)
    counts = mixed.dual_counts
    assert mixed.cache_size <= 30
    assert np.array_equal(counts, np.round(counts))


# Feature spaces -----------------------------------------------------------------------------------


# The axis of each state array that runs over the feature columns.
COLUMN_AXIS = {"_vectors": 0, "_support": 1, "_weights": 0, "_window": 1, "_warmup_x": 1}


def with_columns_reversed(model):
    """The same model, its names given their columns in the reverse order (as a copy that met
    them in another order would hold them)."""
    data = model.to_state()
    names = data["features"]["names"]
    first = data["features"]["first_column"]
    n = len(names)
    order = np.arange(max(a.shape[COLUMN_AXIS[k]] for k, a in data["arrays"].items()
                          if k in COLUMN_AXIS and a.ndim > COLUMN_AXIS[k]))
    order[first : first + n] = order[first : first + n][::-1]
    arrays = {}
    for key, array in data["arrays"].items():
        axis = COLUMN_AXIS.get(key)
        if axis is not None and array.ndim > axis and array.shape[axis] >= first + n:
            array = np.take(array, order[: array.shape[axis]], axis=axis)
        arrays[key] = np.ascontiguousarray(array)
    data = {**data, "arrays": arrays, "features": {**data["features"], "names": names[::-1]}}
    return type(model).from_state(data)


@pytest.mark.parametrize("name", ["ALMA", "BudgetSVM", "CPM", "MPU", "SBP"])
def test_features_align_by_name_within_the_bound(name):
    """A copy that holds the same features in other columns mixes with the model into the
    model; copies with more names together than the bound has exact columns keep the first
    names exact and hash the rest."""
    records = stream(160)
    (a,) = trained(MODELS[name], records[:100])
    b = with_columns_reversed(a)
    assert b._features.names == a._features.names[::-1]
    np.testing.assert_allclose(probabilities(b, records[100:]), probabilities(a, records[100:]),
                               atol=1e-12)
    mixed = mix([a, b], [0.3, 0.7])
    assert mixed._features.names == a._features.names
    np.testing.assert_allclose(probabilities(mixed, records[100:]),
                               probabilities(a, records[100:]), atol=1e-9)
    # a bounded space: 3 exact columns (max_features=4), 6 names in all
    params = {**a._get_params(), "max_features": 4}
    c, d = type(a)(**params), type(a)(**params)
    for x, y in records[:100]:
        c.learn_one({"a": x[0], "b": x[1], "c": x[2]}, y)
        d.learn_one({"z": x[0], "y": x[3], "x": x[2]}, y)
    bounded = mix([c, d])
    assert bounded._features.names == ["a", "b", "c"]
    assert bounded._features.hashing
    restored = round_trip(bounded)
    assert memory.memory_size(restored) <= memory.memory_bound(restored)
    probe = [({"a": 1.0, "z": 0.3, "y": 0.5}, True)]
    assert np.isfinite(probabilities(bounded, probe)).all()


# Kernel models ------------------------------------------------------------------------------------

KERNEL = [
    "BudgetSVM", "BudgetSVM smallest", "BudgetPerceptron merge", "BudgetPerceptron oldest",
    "BudgetPerceptron random", "BudgetPerceptron smallest", "BudgetPerceptron project",
    "KernelALMA", "KernelALMA averaged", "SBP", "KernelMPU",
]
values = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
records_strategy = st.lists(
    st.tuples(st.dictionaries(st.sampled_from("abcde"), values, min_size=1, max_size=4),
              st.booleans()),
    min_size=1, max_size=80,
)


@FAST
@given(records=records_strategy, copies=st.integers(2, 5), delta=st.booleans(),
       name=st.sampled_from(KERNEL))
def test_kernel_mix_stays_within_the_budget_and_finite(records, copies, delta, name):
    models = trained(MODELS[name], records, copies=copies)
    if delta:
        mixed = mix(models, [1.0] * copies, base=models[0])
    else:
        mixed = mix(models)
    budget = getattr(mixed, "budget", None)
    assert mixed.support_size <= budget
    assert np.isfinite(mixed._slots).all() and np.isfinite(mixed._support).all()
    assert np.isfinite(probabilities(mixed, records)).all()
    assert memory.memory_size(mixed) <= memory.memory_bound(mixed)
    round_trip(mixed)


def test_budget_svm_union_is_pruned_and_resolved():
    """Four copies' caches do not fit one budget: the oldest leave (prune="oldest"), the
    coefficients stay in the box, and SMO re-solves the cached problem."""
    records = stream(800)
    copies = trained(lambda: streammargin.BudgetSVMClassifier(budget=30), records[:600], copies=4)
    mixed = mix(copies)
    assert mixed.support_size == 30
    coefs = mixed.dual_coefs
    assert (coefs >= 0).all() and (coefs <= mixed.C).all()
    accuracy = [np.mean([m.predict_one(x) == y for x, y in records[600:]])
                for m in (mixed, *copies)]
    assert accuracy[0] >= min(accuracy[1:])


def test_kernel_copies_in_their_warm_up_pool_their_records():
    """gamma="auto": copies that have not frozen their width mix into one model that learnt
    their records in turn, as one model fed them so would."""
    records = stream(40)
    copies = trained(lambda: streammargin.BudgetSVMClassifier(budget=50), records, copies=2)
    assert all(m._warming_up for m in copies)
    mixed = mix(copies)
    (together,) = trained(lambda: streammargin.BudgetSVMClassifier(budget=50), records)
    assert mixed.n_trials == 40
    np.testing.assert_allclose(probabilities(mixed, records), probabilities(together, records),
                               atol=1e-12)


# The Convex Polytope Machine ----------------------------------------------------------------------


@settings(max_examples=40, deadline=None, derandomize=True)
@given(cost=st.integers(1, 6).flatmap(
    lambda n: st.lists(st.lists(st.floats(-100, 100), min_size=n, max_size=n),
                       min_size=n, max_size=n)))
def test_assignment_is_the_cheapest_permutation(cost):
    cost = np.array(cost)
    n = cost.shape[0]
    perm = assignment(cost)
    assert sorted(perm.tolist()) == list(range(n))
    best = min(sum(cost[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
    assert cost[np.arange(n), perm].sum() == pytest.approx(best, abs=1e-9)


def permuted_faces(model: streammargin.ConvexPolytopeClassifier, seed: int):
    """The same model with the faces of each polytope (and their ASSIGN counts) in another
    order: the same hypothesis."""
    data = model.to_state()
    K = model.n_faces
    rng = np.random.default_rng(seed)
    W = data["arrays"]["_weights"].copy()
    st_ = data["arrays"]["_st"].copy()
    size = cpm_jit.block_size(K)
    for c in range(W.shape[1] // K):
        perm = rng.permutation(K)
        W[:, c * K : (c + 1) * K] = W[:, c * K : (c + 1) * K][:, perm]
        start = cpm_jit.CLASSES + c * size
        st_[start : start + K] = st_[start : start + K][perm]
    data["arrays"] = {**data["arrays"], "_weights": W, "_st": st_}
    return type(model).from_state(data)


def test_cpm_faces_are_matched_before_they_are_combined():
    records = list(synth.Agrawal(classification_function=2, seed=3).take(300))
    make = lambda: compose.Pipeline(  # noqa: E731
        streammargin.StandardScaler(), streammargin.ConvexPolytopeClassifier(n_faces=4)
    )
    (pipe,) = trained(make, records[:250])
    model = pipe["ConvexPolytopeClassifier"]
    other = permuted_faces(model, seed=1)
    scaled = [(pipe["StandardScaler"].transform_one(x), y) for x, y in records[250:]]
    np.testing.assert_allclose(probabilities(other, scaled), probabilities(model, scaled),
                               atol=1e-12)
    mixed = mix([model, other])
    np.testing.assert_allclose(probabilities(mixed, scaled), probabilities(model, scaled),
                               atol=1e-9)
    # unmatched, the faces of the two would have been averaged into another polytope
    assert not np.allclose(other._weights, model._weights)


def test_cpm_classes_are_aligned_by_label():
    a = streammargin.ConvexPolytopeClassifier(n_faces=2, window=10)
    b = streammargin.ConvexPolytopeClassifier(n_faces=2, window=10)
    for i in range(30):
        a.learn_one({"x": i % 3 - 1.0, "y": 1.0}, ["r", "g", "b"][i % 3])
        b.learn_one({"y": 1.0, "x": i % 2 - 0.5}, ["b", "k"][i % 2])
    mixed = mix([a, b])
    assert mixed.classes == ["r", "g", "b", "k"]
    assert set(mixed.predict_proba_one({"x": 0.2, "y": 1.0})) == {"r", "g", "b", "k"}
    round_trip(mixed)


# Wrappers -----------------------------------------------------------------------------------------


def test_one_vs_rest_mixes_class_by_class():
    a = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    b = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    for i in range(40):
        a.learn_one({"x": float(i % 3)}, i % 3)
        b.learn_one({"x": float(i % 4)}, 3 - i % 4)
    mixed = mix([a, b])
    assert list(mixed.classifiers) == [0, 1, 2, 3]
    # class 3 only b has: its member as it is (the weights of the copies that have the class)
    assert state.dumps(mixed.classifiers[3].to_state()) == state.dumps(
        b.classifiers[3].to_state()
    )
    round_trip(mixed)


def test_auto_mixes_member_by_member_with_labels_aligned():
    records = stream(200)
    a, b = streammargin.AutoClassifier(window=50), streammargin.AutoClassifier(window=50)
    for x, y in records[:100]:
        a.learn_one(x, y)
    for x, y in reversed(records[100:]):  # (may see the labels in the other order)
        b.learn_one(x, y)
    mixed = mix([a, b])
    assert set(mixed._labels) == {0, 1}
    assert sorted(mixed.members) == sorted(a.members)
    scores = np.array(mixed._scores)
    np.testing.assert_allclose(scores, (np.array(a._scores) + np.array(b._scores)) / 2)
    round_trip(mixed)
    # past two labels the binary members are one-vs-rest: a third label in one copy only
    c = streammargin.AutoClassifier(window=50)
    for x, y in records[:60]:
        c.learn_one(x, 2 if x[0] > 0.9 else y)
    three = mix([a, c])
    assert sorted(three._labels) == [0, 1, 2]
    assert sorted(three.members["ALMAClassifier"].classifiers) == [0, 1, 2]
    assert three.predict_one(records[0][0]) in (0, 1, 2)
    round_trip(three)


# Scalers and pipelines ----------------------------------------------------------------------------


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    parts=st.lists(
        st.lists(st.dictionaries(st.sampled_from(["a", "b", "c", 4]),
                                 st.floats(-1e6, 1e6), max_size=3), max_size=15),
        min_size=1, max_size=4,
    ),
    river=st.booleans(),
)
def test_scalers_pool_their_statistics_exactly(parts, river):
    make = preprocessing.StandardScaler if river else streammargin.StandardScaler
    copies = [make() for _ in parts]
    together = make()
    for scaler, part in zip(copies, parts):
        for x in part:
            scaler.learn_one(x)
            together.learn_one(x)
    mixed = mix(copies, [1.0] + [0.0] * (len(copies) - 1))  # (weights do not apply)
    assert dict(mixed.counts) == dict(together.counts)
    for name in together.counts:
        assert mixed.means[name] == pytest.approx(together.means[name], rel=1e-9, abs=1e-6)
        assert mixed.vars[name] == pytest.approx(together.vars[name], rel=1e-6, abs=1e-3)
    # from a base: the base's records once, and every copy's since
    base = copies[0]
    later = [make() for _ in range(2)]
    for scaler in later:
        for x in parts[0]:
            scaler.learn_one(x)
    extra = [{"a": 1.0, "b": 2.0}, {"a": -3.0}]
    later[0].learn_one(extra[0])
    later[1].learn_one(extra[1])
    pooled = mix(later, base=base)
    expected = make()
    for x in parts[0] + extra:
        expected.learn_one(x)
    assert dict(pooled.counts) == dict(expected.counts)
    for name in expected.counts:
        assert pooled.means[name] == pytest.approx(expected.means[name], rel=1e-9, abs=1e-6)
        assert pooled.vars[name] == pytest.approx(expected.vars[name], rel=1e-6, abs=1e-3)


def test_pipelines_mix_step_by_step():
    records = stream(300)
    make = lambda: streammargin.StandardScaler() | streammargin.ALMAClassifier()  # noqa: E731
    copies = trained(make, records[:200], copies=3)
    mixed = mix(copies)
    scaler = mix([c["StandardScaler"] for c in copies])
    model = mix([c["ALMAClassifier"] for c in copies])
    for x, _ in records[200:220]:
        assert mixed.predict_proba_one(x) == model.predict_proba_one(scaler.transform_one(x))


# Refusals -----------------------------------------------------------------------------------------


def test_copies_must_be_of_one_class_and_params_and_weights_valid():
    a, b = streammargin.ALMAClassifier(), streammargin.ALMAClassifier(alpha=0.5)
    with pytest.raises(ValueError, match="different params"):
        mix([a, b])
    with pytest.raises(ValueError, match="one class"):
        mix([a, streammargin.BudgetSVMClassifier()])
    with pytest.raises(ValueError, match="weights"):
        mix([a, a], [1.0, math.nan])
    with pytest.raises(ValueError, match="weights"):
        mix([a, a], [1.0])
    with pytest.raises(ValueError, match="zero"):
        mix([a, a], [0.0, 0.0])
    with pytest.raises(ValueError, match="at least one"):
        mix([])


def test_mix_member_mixes_one_member_in_place_and_leaves_the_rest_as_they_were():
    from streammargin.auto import PORTFOLIO
    from streammargin.mixing import mix_member

    rows = list(synth.Hyperplane(seed=5, n_features=4).take(400))
    a, b = streammargin.AutoClassifier(), streammargin.AutoClassifier()
    for i, (x, y) in enumerate(rows):
        (a if i % 2 else b).learn_one(x, bool(y))
    name = "ALMAClassifier"
    before, b_state = dict(a.members), state.dumps(b.to_state())
    expected = mix([a.members[name], b.members[name]], [3, 1])
    mix_member(a, name, [b.members[name]], [3, 1])
    assert state.dumps(a.members[name].to_state()) == state.dumps(expected.to_state())
    assert all(a.members[n] is before[n] for n in PORTFOLIO if n != name)
    assert state.dumps(b.to_state()) == b_state  # the copy is left as it was
    with pytest.raises(ValueError, match="member of an AutoClassifier"):
        mix_member(streammargin.ALMAClassifier(), name, [], [1.0])
    with pytest.raises(ValueError, match="member of an AutoClassifier"):
        mix_member(a, "os.system", [], [1.0])
