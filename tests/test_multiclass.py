"""streammargin.OneVsRestClassifier: River's one-vs-rest, bounded, with a safe state.

The contract tests every model runs (River's checker, round trips, bad input, corrupt arrays)
are in test_common.py; these are the multiclass specifics.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from river import datasets, evaluate, linear_model, metrics, multiclass, preprocessing

import streammargin
from streammargin import state
from streammargin.errors import InvalidInput, StateError

FAST = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def segments(n=400):
    scaler = preprocessing.StandardScaler()
    rows = []
    for x, y in datasets.ImageSegments().take(n):
        scaler.learn_one(x)
        rows.append((scaler.transform_one(x), y))
    return rows


def state_bytes(model) -> bytes:
    return state.dumps(model.to_state())


@pytest.mark.parametrize(
    "prototype",
    [streammargin.ALMAClassifier(), streammargin.BudgetPerceptron(budget=20, eviction="oldest")],
    ids=["alma", "budgetperceptron"],
)
def test_predictions_equal_rivers_one_vs_rest_of_the_same_model(prototype):
    ours = streammargin.OneVsRestClassifier(prototype.clone())
    rivers = multiclass.OneVsRestClassifier(prototype.clone())
    for x, y in segments(600):
        assert ours.predict_proba_one(x) == rivers.predict_proba_one(x)
        assert ours.predict_one(x) == rivers.predict_one(x)
        ours.learn_one(x, y)
        rivers.learn_one(x, y)


@pytest.mark.parametrize(
    "prototype",
    [streammargin.ALMAClassifier(), streammargin.BudgetSVMClassifier(budget=30),
     streammargin.ConvexPolytopeClassifier(polytopes="one")],
    ids=["alma", "budgetsvm", "cpm-one"],
)
def test_a_prediction_then_learning_in_one_call_is_predict_one_then_learn_one(prototype):
    # AutoClassifier's call: each member predicts and learns in one call (the budget SVM's one
    # numba call, during its warm-up and after it), the label picked as predict_one picks it.
    separate = streammargin.OneVsRestClassifier(prototype.clone())
    fused = streammargin.OneVsRestClassifier(prototype.clone())
    for x, y in segments(300):
        expected = separate.predict_one(x)
        separate.learn_one(x, y)
        assert fused._predict_then_learn(x, y) == expected
    assert state_bytes(fused) == state_bytes(separate)


@FAST
@given(votes=st.lists(st.sampled_from([0.0, 1e-300, 0.25, 0.5, 0.5000000000000001, 1.0]),
                      min_size=1, max_size=6))
def test_the_one_call_label_is_predict_ones_on_ties_and_zeros(votes):
    from streammargin.multiclass import _most_probable, _normalised

    labelled = [(f"class {i}", p) for i, p in enumerate(votes)]
    proba = _normalised(dict(labelled))
    assert _most_probable(labelled) == max(proba, key=proba.get)


@FAST
@given(labels=st.lists(st.sampled_from(["a", "b", "c", 4, 5.5]), min_size=1, max_size=60))
def test_one_call_with_classes_that_come_mid_stream_picks_what_predict_one_picks(labels):
    rng = np.random.default_rng(len(labels))
    separate = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    fused = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    for y in labels:
        x = {"f": float(rng.integers(-1, 2)), "g": 0.0}
        expected = separate.predict_one(x)
        separate.learn_one(x, y)
        assert fused._predict_then_learn(x, y) == expected
    assert state_bytes(fused) == state_bytes(separate)


def test_progressive_accuracy_on_image_segments_equals_rivers():
    def score(wrapper):
        model = preprocessing.StandardScaler() | wrapper(streammargin.ALMAClassifier())
        return evaluate.progressive_val_score(datasets.ImageSegments(), model, metrics.Accuracy()).get()

    ours = score(streammargin.OneVsRestClassifier)
    assert ours == score(multiclass.OneVsRestClassifier)
    # Far above River's one-vs-rest LogisticRegression (77% macro F1, ~81% accuracy).
    assert ours > 0.85


@pytest.mark.parametrize(
    "labels",
    [
        ["a", "b", "c"],
        [3, 7, 11],
        [0.5, 1.5, 2.5],
        [True, False],
        [np.int64(4), np.int64(5), np.int64(6)],
        [("t", 1), ("t", 2), ("u", 1)],
    ],
    ids=["str", "int", "float", "bool", "numpy", "tuple"],
)
def test_labels_of_every_supported_type_are_classes_and_survive_the_state(labels):
    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    rng = np.random.default_rng(0)
    for i in range(90):
        k = i % len(labels)
        model.learn_one({"a": float(k) + 0.1 * rng.normal(), "b": 1.0}, labels[k])
    plain = [label.item() if isinstance(label, np.generic) else label for label in labels]
    assert list(model.classifiers) == plain
    assert all(type(a) is type(b) for a, b in zip(model.classifiers, plain))
    restored = streammargin.from_state(state.loads(state_bytes(model)))
    assert list(restored.classifiers) == plain
    assert all(type(a) is type(b) for a, b in zip(restored.classifiers, plain))
    x = {"a": 1.0, "b": 1.0}
    assert restored.predict_proba_one(x) == model.predict_proba_one(x)
    assert model.predict_one(x) in plain


@pytest.mark.parametrize("label", [None, float("nan"), [1], {"a": 1}, b"bytes"], ids=repr)
def test_labels_that_are_not_classes_are_refused_and_change_nothing(label):
    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    model.learn_one({"a": 1.0}, "a")
    before = state_bytes(model)
    with pytest.raises(InvalidInput, match="label"):
        model.learn_one({"a": 2.0}, label)
    with pytest.raises(InvalidInput, match="label"):
        model.learn_many(pd.DataFrame({"a": [1.0, 2.0]}), pd.Series(["a", label], dtype=object))
    assert state_bytes(model) == before


def test_a_label_beyond_max_classes_is_refused_and_changes_nothing():
    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier(), max_classes=3)
    for i, label in enumerate("abc" * 5):
        model.learn_one({"a": float(i), "b": 1.0}, label)
    before = state_bytes(model)
    with pytest.raises(InvalidInput, match="max_classes=3"):
        model.learn_one({"a": 1.0, "new_feature": 2.0}, "d")
    with pytest.raises(InvalidInput, match="max_classes=3"):
        model.learn_many(pd.DataFrame({"a": [1.0, 2.0]}), pd.Series(["a", "d"]))
    assert state_bytes(model) == before
    assert list(model.classifiers) == ["a", "b", "c"]
    model.learn_one({"a": 1.0}, "b")  # known classes still learn


def test_bad_features_change_nothing_even_for_a_new_class():
    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    with pytest.raises(InvalidInput, match="'bad'"):
        model.predict_proba_one({"bad": float("nan")})
    with pytest.raises(InvalidInput, match="'bad'"):
        model.learn_one({"a": 1.0, "bad": "x"}, "first")
    assert model.classifiers == {}
    model.learn_one({"a": 1.0}, "first")
    before = state_bytes(model)
    with pytest.raises(InvalidInput, match="'bad'"):
        model.learn_one({"a": 1.0, "bad": float("inf")}, "second")
    assert list(model.classifiers) == ["first"] and state_bytes(model) == before


def test_before_learning_it_predicts_nothing():
    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    assert model.predict_proba_one({"a": 1.0}) == {}
    assert model.predict_one({"a": 1.0}) is None
    X = pd.DataFrame({"a": [1.0, 2.0]})
    assert list(model.predict_many(X)) == [None, None]
    assert model.predict_proba_many(X).shape == (2, 0)


@FAST
@given(
    labels=st.lists(st.sampled_from(["a", "b", "c", 4, 5.5]), min_size=1, max_size=60),
    chunk=st.integers(1, 25),
)
def test_learn_many_equals_learn_one_for_many_classes(labels, chunk):
    rng = np.random.default_rng(len(labels))
    rows = [({"f": float(rng.normal()), "g": float(rng.normal())}, y) for y in labels]
    one = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    many = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    for x, y in rows:
        one.learn_one(x, y)
    for start in range(0, len(rows), chunk):
        batch = rows[start : start + chunk]
        many.learn_many(pd.DataFrame([x for x, _ in batch]), pd.Series([y for _, y in batch], dtype=object))
    assert state_bytes(many) == state_bytes(one)
    X = pd.DataFrame([x for x, _ in rows[:10]], index=range(50, 50 + min(10, len(rows))))
    proba = many.predict_proba_many(X)
    predicted = many.predict_many(X)
    for (i, row), x in zip(proba.iterrows(), [x for x, _ in rows[:10]]):
        assert dict(row) == one.predict_proba_one(x)
        assert predicted[i] == one.predict_one(x)


def test_counters_sum_the_members():
    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    names = ("corrections", "trials", "features", "features_hashed")
    assert model.counters == {"classes": 0, **dict.fromkeys(names, 0)}
    for x, y in segments(200):
        model.learn_one(x, y)
    members = list(model.classifiers.values())
    assert model.counters == {
        "classes": len(members),
        **{name: sum(m.counters[name] for m in members) for name in names},
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"classifier": linear_model.LogisticRegression()}, "river.multiclass.OneVsRestClassifier"),
        ({"classifier": streammargin.ConvexPolytopeClassifier()}, "multiclass already"),
        (
            {"classifier": streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())},
            "binary streammargin model",
        ),
        ({"classifier": streammargin.ALMAClassifier(), "max_classes": 1}, "max_classes"),
        ({"classifier": streammargin.ALMAClassifier(), "max_classes": 10**6}, "max_classes"),
        ({"classifier": streammargin.ALMAClassifier(), "max_classes": True}, "max_classes"),
        ({"classifier": streammargin.ALMAClassifier(), "max_classes": 5.0}, "max_classes"),
    ],
)
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        streammargin.OneVsRestClassifier(**kwargs)


def trained_state() -> dict:
    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier(p=3.0), max_classes=5)
    for x, y in segments(120):
        if y in ("path", "sky", "grass"):
            model.learn_one(x, y)
    return state.loads(state_bytes(model))


def corrupt(mutate):
    data = trained_state()
    mutate(data)
    return data


CORRUPTIONS = {
    "not a dict": lambda d: d.clear(),
    "extra field": lambda d: d.update(extra=1),
    "max_classes below the classes": lambda d: d["params"].update(max_classes=2),
    "max_classes huge": lambda d: d["params"].update(max_classes=10**9),
    "max_classes a float": lambda d: d["params"].update(max_classes=5.0),
    "wrapped model unknown": lambda d: d["classifier"].update(model="os.system"),
    "wrapped model is the wrapper": lambda d: d["classifier"].update(model="OneVsRestClassifier"),
    "wrapped model multiclass": lambda d: d["classifier"].update(
        model="ConvexPolytopeClassifier", params={}
    ),
    "wrapped params bad value": lambda d: d["classifier"]["params"].update(p=-1.0),
    "wrapped params unknown key": lambda d: d["classifier"]["params"].update(nonsense=1),
    "wrapped params not a dict": lambda d: d["classifier"].update(params=[1]),
    "labels shorter than members": lambda d: d["labels"].pop(),
    "labels not a list": lambda d: d.update(labels="abc"),
    "duplicate label": lambda d: d["labels"].__setitem__(1, d["labels"][0]),
    "1 and True are one class": lambda d: d.update(labels=[{"int": 1}, {"bool": True}, "x"]),
    "label null": lambda d: d["labels"].__setitem__(0, {"none": None}),
    "label NaN": lambda d: d["labels"].__setitem__(0, {"float": float("nan")}),
    "label not encoded": lambda d: d["labels"].__setitem__(0, [1, 2]),
    "member of another class": lambda d: d["members"][0].update(model="MPUClassifier"),
    "member with other params": lambda d: d["members"][1]["params"].update(p=2.0),
    "member not a dict": lambda d: d["members"].__setitem__(0, 7),
    "member without features": lambda d: d["members"][0].pop("features"),
    "member features garbage": lambda d: d["members"][0].update(features=5),
    "member arrays missing": lambda d: d["members"][0].update(arrays={}),
    "member NaN weights": lambda d: next(
        a for a in d["members"][2]["arrays"].values() if a.dtype.kind == "f" and a.size
    ).__setitem__(0, np.nan),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_a_malformed_state_raises_state_error_only(name):
    bad = corrupt(CORRUPTIONS[name])
    with pytest.raises(StateError):
        streammargin.OneVsRestClassifier.from_state(bad)
    with pytest.raises(StateError):
        streammargin.from_state(bad)


def test_the_untouched_state_restores():
    good = trained_state()
    model = streammargin.from_state(copy.deepcopy(good))
    assert list(model.classifiers) == ["path", "sky", "grass"]
    assert model.max_classes == 5 and model.classifier.p == 3.0


leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=5),
    st.lists(st.integers(), max_size=3),
)


@FAST
@given(data=st.data())
def test_random_edits_of_the_state_raise_state_error_or_restore(data):
    """Whatever the bytes of a checkpoint say, a restore is a model or a StateError."""
    good = trained_state()
    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                paths.append((*path, key))
                walk(value, (*path, key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                paths.append((*path, i))
                walk(value, (*path, i))

    walk(good, ())
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = good
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = data.draw(leaves)
        except (KeyError, IndexError, TypeError):
            continue
    try:
        model = streammargin.from_state(good)
    except StateError:
        return
    # A restored model works: finite probabilities summing to 1, learning, a state that saves.
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    for i in range(30):
        x = {name: float(rng.normal()) * 10.0 ** float(rng.integers(-300, 300))
             for name in ("a", "b", f"new{i % 4}")}
        proba = model.predict_proba_one(x)
        assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in proba.values())
        assert not proba or math.isclose(sum(proba.values()), 1.0)
        try:
            model.learn_one(x, ["u", "v", "w"][i % 3])
        except InvalidInput:  # a label beyond max_classes, say
            pass
    state.dumps(model.to_state())


@FAST
@given(data=st.data())
def test_random_bytes_of_a_checkpoint_raise_state_error_or_restore(data):
    """Flipped, cut or extended bytes: a model or a StateError, nothing else."""
    raw = bytearray(state.dumps(trained_state()))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.sampled_from([None, len(raw) // 2, len(raw) - 1]))
    if cut is not None:
        raw = raw[:cut]
    try:
        streammargin.from_state(state.loads(bytes(raw)))
    except StateError:
        pass


# Memory ---------------------------------------------------------------------------------------------


def test_memory_stays_within_max_classes_times_the_members_bound_whatever_the_stream():
    from streammargin import memory

    model = streammargin.OneVsRestClassifier(
        streammargin.BudgetPerceptron(budget=5, max_features=16), max_classes=4
    )
    bound = memory.memory_bound(model)
    member_bound = memory.memory_bound(model.classifier) - memory.STATE_OVERHEAD
    assert bound == 4 * (member_bound + memory.MAX_LABEL_BYTES + 1) + memory.STATE_OVERHEAD
    rng = np.random.default_rng(3)
    for i in range(600):  # a new name in every record, labels beyond max_classes refused
        x = {"a": float(rng.normal()), f"id{i}": 1.0}
        try:
            model.learn_one(x, f"class{i % 6}")
        except streammargin.InvalidInput:
            assert i % 6 >= 4
    assert len(model.classifiers) == 4
    assert memory.memory_size(model) <= bound - memory.STATE_OVERHEAD
    assert len(state_bytes(model)) <= bound


def test_from_state_refuses_a_state_whose_params_imply_too_much_before_building_anything():
    import tracemalloc

    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier(), max_classes=3)
    for x, y in segments(30):
        try:
            model.learn_one(x, y)
        except streammargin.InvalidInput:
            pass
    saved = state.loads(state_bytes(model))
    saved["params"]["max_classes"] = 10_000
    saved["classifier"]["params"]["max_features"] = 2**24
    tracemalloc.start()
    with pytest.raises(StateError, match="may hold up to .* above the limit"):
        streammargin.from_state(saved)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20
    # The same state under a limit that fits it: refused by max_bytes only.
    small = state.loads(state_bytes(model))
    with pytest.raises(StateError, match="above the limit"):
        streammargin.from_state(small, max_bytes=1000)
    assert streammargin.from_state(small).classifiers.keys() == model.classifiers.keys()


# plain_label: the class labels every multiclass model and AutoClassifier validate --------------

_label_values = st.one_of(
    st.booleans(),
    st.integers(),
    st.sampled_from([-(2**63), 2**63 - 1, 2**63, -(2**63) - 1, 10**40]),
    st.text(max_size=30),
    st.text(alphabet=st.sampled_from(["a", "é", "\U0001f600", '"', "\\", "\n"]), max_size=130),
    # around the shortcut's bound: 21 characters of 12 JSON bytes each fit in 256, 22 do not
    st.text(alphabet=st.sampled_from(["\U0001f600", "\x01"]), min_size=19, max_size=24),
    st.text(alphabet=st.just("a"), min_size=250, max_size=260),
    st.floats(allow_nan=True),
    st.tuples(st.integers(-3, 3), st.text(max_size=3)),
)


@settings(max_examples=300, deadline=None)
@given(_label_values)
def test_plain_labels_fast_path_accepts_and_refuses_exactly_as_the_full_checks(label):
    # bools, int64 ints and strs of at most 21 characters skip the JSON encoding: whatever
    # they are, the full checks accept them too, as the same value.
    from streammargin import base

    def outcome(check):
        try:
            return "label", repr(check(label))
        except InvalidInput as error:
            return "refused", str(error)

    assert outcome(base.plain_label) == outcome(base.checked_label)
