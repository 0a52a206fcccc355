"""What every streammargin classifier must do, whatever its algorithm.

Each registered model class is tested with every parameter set of its `_unit_test_params`:
River's own checker, invariants under random streams (hypothesis), safe-state and pickle
round-trips, mini-batches equal to the per-record path, and bad input that never corrupts a model.
"""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from river import checks

import streammargin
from streammargin import state
from streammargin.errors import InvalidInput

# Classes whose instances save themselves under their own name: not the public names that build
# other classes (`_forms`: MPUClassifier builds LinearMPUClassifier or KernelMPUClassifier).
MODEL_CLASSES = sorted(
    (cls for cls in state.registered_models().values() if not hasattr(cls, "_forms")),
    key=lambda cls: cls.__name__,
)
CASES = [
    pytest.param(cls, params, id=f"{cls.__name__}-{i}")
    for cls in MODEL_CLASSES
    for i, params in enumerate(cls._unit_test_params())
]
FAST = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def state_bytes(model) -> bytes:
    return state.dumps(model.to_state())


def state_arrays(node, path=()):
    """(path, array) of every numpy array of a state, nested ones included (a wrapper's members)."""
    if isinstance(node, np.ndarray):
        yield path, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from state_arrays(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from state_arrays(value, (*path, i))


def finite_score(score) -> bool:
    """decision_one is a float, or {label: float} for a natively multiclass model."""
    return all(math.isfinite(s) for s in (score.values() if isinstance(score, dict) else [score]))


names = st.sampled_from(["a", "b", "c", "d", "e", 7, ("t", 1)])
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
records = st.dictionaries(names, finite | st.integers(-5, 5) | st.booleans(), max_size=5)
streams = st.lists(st.tuples(records, st.booleans()), min_size=1, max_size=40)


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_river_checker(cls, params):
    checks.check_estimator(cls(**params))


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_params_are_rivers_with_the_signature_read_once(cls, params):
    # `FeatureSpaceClassifier._get_params` caches the constructor's signature per class.
    from river import base

    model = cls(**params)
    assert model._get_params() == base.Base._get_params(model)
    assert model.clone()._get_params() == model._get_params()


@pytest.mark.parametrize(("cls", "params"), CASES)
@FAST
@given(stream=streams)
def test_learning_never_mutates_input_and_stays_finite(cls, params, stream):
    model = cls(**params)
    for x, y in stream:
        before = copy.deepcopy(x)
        model.predict_proba_one(x)
        model.learn_one(x, y)
        assert x == before
        assert all(np.all(np.isfinite(array)) for _, array in state_arrays(model.to_state()))
        proba = model.predict_proba_one(x)
        assert math.isclose(sum(proba.values()), 1.0) and all(0 <= p <= 1 for p in proba.values())
        assert finite_score(model.decision_one(x))


@pytest.mark.parametrize(("cls", "params"), CASES)
@FAST
@given(stream=streams, probes=st.lists(records, min_size=1, max_size=5))
def test_state_and_pickle_round_trips_predict_and_learn_identically(cls, params, stream, probes):
    model = cls(**params)
    half = len(stream) // 2
    for x, y in stream[:half]:
        model.learn_one(x, y)
    restored = streammargin.from_state(state.loads(state.dumps(model.to_state())))
    unpickled = pickle.loads(pickle.dumps(model))
    for twin in (restored, unpickled):
        assert type(twin) is cls
        for x in [x for x, _ in stream] + probes:
            assert twin.predict_proba_one(x) == model.predict_proba_one(x)
            assert twin.decision_one(x) == model.decision_one(x)
    for x, y in stream[half:]:
        model.learn_one(x, y)
        restored.learn_one(x, y)
        unpickled.learn_one(x, y)
    assert state_bytes(restored) == state_bytes(model) == state_bytes(unpickled)


@pytest.mark.parametrize(
    ("cls", "params"), [case for case in CASES if hasattr(case.values[0], "predict_with_proba_one")]
)
@FAST
@given(stream=streams)
def test_predict_with_proba_one_is_predict_one_and_predict_proba_one(cls, params, stream):
    # The worker's per-record call: one encoding and, where it can, one score, for exactly what
    # the two River calls give, and the same state after learning.
    combined, separate = cls(**params), cls(**params)
    for x, y in stream:
        label, proba = combined.predict_with_proba_one(x)
        expected_label, expected_proba = separate.predict_one(x), separate.predict_proba_one(x)
        assert type(label) is type(expected_label) and label == expected_label
        assert proba == expected_proba
        combined.learn_one(x, y)
        separate.learn_one(x, y)
    assert state_bytes(combined) == state_bytes(separate)


@pytest.mark.parametrize(
    ("cls", "params"), [case for case in CASES if hasattr(case.values[0], "_predict_then_learn")]
)
@FAST
@given(stream=streams)
def test_prediction_then_learning_in_one_call_is_the_two_river_calls(cls, params, stream):
    # AutoClassifier's call on each member for a labelled record (`_predict_then_learn`), and a
    # one-vs-rest member's (`_proba_then_learn`): the prediction as it was before learning, and
    # the same state after learning as predict_one or predict_proba_one followed by learn_one.
    separate, fused = cls(**params), cls(**params)
    binary = not getattr(separate, "_multiclass", False)
    fused_proba = cls(**params) if hasattr(separate, "_proba_then_learn") and binary else None
    for x, y in stream:
        label, proba = separate.predict_one(x), separate.predict_proba_one(x)
        separate.learn_one(x, y)
        predicted = fused._predict_then_learn(x, y)
        assert type(predicted) is type(label) and predicted == label
        if fused_proba is not None:
            assert fused_proba._proba_then_learn(x, y) == proba[True]
    assert state_bytes(fused) == state_bytes(separate)
    if fused_proba is not None:
        assert state_bytes(fused_proba) == state_bytes(separate)


def one_call_trials(model):
    """The calls that predict and learn a labelled record in one (see the test above)."""
    binary = not getattr(model, "_multiclass", False)
    for name in ("_predict_then_learn", "_proba_then_learn"):
        if hasattr(model, name) and (binary or name == "_predict_then_learn"):
            yield getattr(model, name)


BAD_VALUES = [
    float("nan"),
    float("inf"),
    -float("inf"),
    "1.5",
    b"1",
    None,
    [1.0],
    np.array([1.0, 2.0]),
    10**400,
    complex(1, 0),
]


@pytest.mark.parametrize(("cls", "params"), CASES)
@pytest.mark.parametrize("bad", BAD_VALUES, ids=repr)
def test_bad_values_raise_naming_the_feature_and_leave_the_model_untouched(cls, params, bad):
    model = cls(**params)
    for i in range(20):
        model.learn_one({"a": float(i % 3), "b": 1.0 - i % 2}, i % 2 == 0)
    before = state_bytes(model)
    for x in ({"a": 1.0, "bad_one": bad}, {"bad_one": bad}, {"a": 1.0, "b": bad}):
        name = "bad_one" if "bad_one" in x else "b"
        with pytest.raises(InvalidInput, match=repr(name)):
            model.learn_one(x, True)
        with pytest.raises(InvalidInput, match=repr(name)):
            model.predict_proba_one(x)
        with pytest.raises(InvalidInput, match=repr(name)):
            model.predict_one(x)
        for trial in one_call_trials(model):
            with pytest.raises(InvalidInput, match=repr(name)):
                trial(x, True)
    assert state_bytes(model) == before


@pytest.mark.parametrize(("cls", "params"), CASES)
@pytest.mark.parametrize("label", ["yes", 2, 0.5, None, "True", float("nan")], ids=repr)
def test_unknown_labels_raise_and_leave_the_model_untouched(cls, params, label):
    model = cls(**params)
    if model._multiclass and label is not None and label == label:
        pytest.skip("a multiclass model takes any label as a class; None and NaN must raise")
    model.learn_one({"a": 1.0}, True)
    before = state_bytes(model)
    with pytest.raises(InvalidInput, match="label"):
        model.learn_one({"a": 2.0, "new": 1.0}, label)
    for trial in one_call_trials(model):
        with pytest.raises(InvalidInput, match="label"):
            trial({"a": 1.0}, label)  # (a known dict: the budget SVM's one numba call)
    assert state_bytes(model) == before


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_huge_and_tiny_values_keep_the_model_finite(cls, params):
    model = cls(**params)
    rng = np.random.default_rng(0)
    for i in range(300):
        scale = [1e-300, 1e-8, 1.0, 1e8, 1e300][i % 5]
        x = {f"f{j}": float(v) * scale for j, v in enumerate(rng.normal(size=4))}
        model.learn_one(x, bool(x["f0"] > 0))
        assert finite_score(model.decision_one(x))
    assert all(np.all(np.isfinite(a)) for _, a in state_arrays(model.to_state()))


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_alternative_label_codings(cls, params):
    """True/False, 1/0 and 1/-1 (also as numpy types) are the same two labels."""
    rng = np.random.default_rng(1)
    data = [({"a": float(v), "b": float(w)}, bool(v + w > 0)) for v, w in rng.normal(size=(50, 2))]
    reference = cls(**params)
    if reference._multiclass:
        pytest.skip("a multiclass model keeps its labels as given: 1, -1 and False are classes")
    for x, y in data:
        reference.learn_one(x, y)
    for code in (lambda y: int(y), lambda y: 1 if y else -1, np.bool_, lambda y: float(y)):
        model = cls(**params)
        for x, y in data:
            model.learn_one(x, code(y))
        assert state_bytes(model) == state_bytes(reference)


def frame_stream(seed, n=240):
    """Rows with features that come and go, as dicts and as DataFrames (NaN = absent)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        keys = ["a", "b", "c", "d"][: 1 + i % 4] if i < n // 2 else ["c", "d", "e"]
        rows.append(({k: float(rng.normal()) for k in keys}, bool(rng.random() < 0.5)))
    return rows


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_learn_many_equals_learn_one(cls, params):
    rows = frame_stream(0)
    one, many = cls(**params), cls(**params)
    for x, y in rows:
        one.learn_one(x, y)
    for start in range(0, len(rows), 37):
        batch = rows[start : start + 37]
        X = pd.DataFrame([x for x, _ in batch])
        many.learn_many(X, pd.Series([y for _, y in batch]))
    probes = [x for x, _ in frame_stream(1, n=40)]
    for x in probes:
        assert many.decision_one(x) == pytest.approx(one.decision_one(x), rel=1e-9, abs=1e-12)
        assert many.predict_proba_one(x)[True] == pytest.approx(
            one.predict_proba_one(x)[True], rel=1e-9, abs=1e-12
        )


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_predict_many_equals_predict_one(cls, params):
    model = cls(**params)
    for x, y in frame_stream(2):
        model.learn_one(x, y)
    probes = [x for x, _ in frame_stream(3, n=60)]
    X = pd.DataFrame(probes, index=range(100, 160))
    proba = model.predict_proba_many(X)
    labels = model.predict_many(X)
    assert list(labels.index) == list(X.index)
    for (i, row), x in zip(proba.iterrows(), probes):
        one = model.predict_proba_one(x)
        assert row[True] == pytest.approx(one[True], rel=1e-12, abs=1e-15)
        assert labels[i] == model.predict_one(x)


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_learn_many_rejects_bad_frames_before_learning(cls, params):
    model = cls(**params)
    model.learn_many(pd.DataFrame({"a": [1.0, 2.0]}), pd.Series([True, False]))
    before = state_bytes(model)
    with pytest.raises(InvalidInput, match="'new'"):
        model.learn_many(pd.DataFrame({"a": [1.0, 2.0], "new": [1.0, np.inf]}), pd.Series([True, False]))
    for text in ("x", "1.5"):  # pandas itself would turn "1.5" into 1.5: learn_one refuses it
        with pytest.raises(InvalidInput, match="'s'"):
            model.learn_many(pd.DataFrame({"a": [1.0], "s": [text]}), pd.Series([True]))
    bad_label = None if model._multiclass else "maybe"
    with pytest.raises(InvalidInput, match="label"):
        model.learn_many(pd.DataFrame({"a": [1.0]}), pd.Series([bad_label]))
    assert state_bytes(model) == before


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_restoring_a_corrupt_state_raises_instead_of_loading(cls, params):
    """Checkpoints come back from a topic: a state no learning could produce is refused."""
    model = cls(**params)
    for x, y in frame_stream(4, n=60):
        model.learn_one(x, y)
    good = model.to_state()
    for path, array in state_arrays(good):
        if array.dtype.kind != "f" or array.size == 0:
            continue
        bad = state.loads(state.dumps(good))
        dict(state_arrays(bad))[path].flat[0] = np.nan
        with pytest.raises(state.StateError):
            streammargin.from_state(bad)
    bad = state.loads(state.dumps(good))
    bad["model"] = "NoSuchModel"
    with pytest.raises(state.StateError):
        streammargin.from_state(bad)
    with pytest.raises(state.StateError):
        state.loads(state.dumps(good)[:-3] if len(state.dumps(good)) > 40 else b"junk")
