"""`streammargin.progressive`: a scaler | model test-then-train over many rows in one compiled
call gives the models' own per-record predictions and state, bit for bit."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streammargin
from streammargin import state
from streammargin.progressive import Rows, Score, Shapes, model_steps


def per_record(model, scaler, data):
    out = []
    for x, y in data:
        if scaler is None:
            scaled = after = x
        elif y is None:
            scaled = scaler.transform_one(x)
        else:
            scaled, after, update = scaler.transform_learn_one(x)
        label, proba = model.predict_with_proba_one(scaled)
        out.append((label, proba))
        if y is not None:
            if scaler is not None:
                scaler.apply_learn(update)
            model.learn_one(after, y)
    return out


MODELS = {
    "alma": lambda: streammargin.ALMAClassifier(),
    "alma-p3": lambda: streammargin.ALMAClassifier(p=3.0, average=False),
    "mpu": lambda: streammargin.MPUClassifier(budget=20),
    "cpm-one": lambda: streammargin.ConvexPolytopeClassifier(polytopes="one", n_faces=3),
    "cpm": lambda: streammargin.ConvexPolytopeClassifier(n_faces=2, steps=2, window=20),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@given(seed=st.integers(0, 2**32 - 1), scale=st.booleans(), n=st.integers(1, 120))
@settings(max_examples=10, deadline=None)
def test_compiled_steps_give_the_models_own_predictions_and_state(name, seed, scale, n):
    rng = random.Random(seed)
    multiclass = name == "cpm"
    labels = ["a", "b", "c"] if multiclass else [True, False]
    names = ["a", "b", "c", "d"]
    first, second = MODELS[name](), MODELS[name]()
    scalers = [streammargin.StandardScaler(), streammargin.StandardScaler()] if scale \
        else [None, None]
    warm = [({k: rng.gauss(0, 1) for k in names}, label) for label in labels]
    per_record(first, scalers[0], warm)
    per_record(second, scalers[1], warm)
    data = []
    for _ in range(n):
        x = {k: rng.choice([rng.gauss(0, 3), float(rng.randrange(-2, 3)), 1e-300, 1e150])
             for k in rng.sample(names, rng.randint(1, 4))}
        data.append((x, rng.choice(labels) if rng.random() < 0.8 else None))
    expected = per_record(first, scalers[0], data)
    shapes = Shapes(second, scalers[1])
    steps = model_steps(second)
    codes = {label: code for code, label in enumerate([False, True] if steps.binary
                                                      else second._labels)}
    ids, holes = [], []
    for x, _ in data:
        ids.append(shapes.add([(k, j, None) for j, k in enumerate(x)]))
        holes.append(list(x.values()))
    rows = Rows(ids, holes, [-1 if y is None else codes[y] for _, y in data])
    done, why, predicted = steps.run(scalers[1], shapes, rows, Score.fresh(steps.n_classes))
    assert why in (0, 2)
    if steps.binary:
        got = [(s > 0.0, abs(s)) for s in predicted[:done]]
        assert got == [(label, proba[True]) for label, proba in expected[:done]]
    else:
        codes_out, proba = predicted
        for r in range(done):
            label, expected_proba = expected[r]
            assert (second._labels[codes_out[r]] if codes_out[r] >= 0 else None) == label
            assert proba[r, :len(expected_proba)].tolist() == list(expected_proba.values())
    if done == n:
        assert state.dumps(second.to_state()) == state.dumps(first.to_state())
        if scale:
            assert state.dumps(scalers[1].to_state()) == state.dumps(scalers[0].to_state())


def test_rows_only_predicted_take_unknown_names_as_predict_one_does():
    model, scaler = streammargin.ALMAClassifier(), streammargin.StandardScaler()
    per_record(model, scaler, [({"a": 1.0, "b": 2.0}, True), ({"a": -1.0, "b": 0.5}, False)])
    xs = [{"a": 0.5, "zz": 3.0}, {"c": 1.0}, {"b": 2.0, "a": 1.0, "y": -1.0}]
    expected = [model.predict_with_proba_one(scaler.transform_one(x)) for x in xs]
    shapes = Shapes(model, scaler)
    ids = [shapes.add_for_prediction([(k, j, None) for j, k in enumerate(x)]) for x in xs]
    rows = Rows(ids, [list(x.values()) for x in xs])
    done, _, predicted = model_steps(model).run(scaler, shapes, rows, Score.fresh(2))
    assert done == 3
    assert [(s > 0.0, abs(s)) for s in predicted] == [(y, p[True]) for y, p in expected]


@pytest.mark.parametrize("name", sorted(MODELS))
@given(seed=st.integers(0, 2**32 - 1), scale=st.booleans(), indicators=st.booleans(),
       n=st.integers(0, 40))
@settings(max_examples=15, deadline=None)
def test_predict_many_gives_each_dicts_per_record_prediction_and_learns_nothing(
        name, seed, scale, indicators, n):
    from streammargin.errors import InvalidInput
    from streammargin.progressive import _transformed, predict_many

    rng = random.Random(seed)
    labels = ["a", "b", "c"] if name == "cpm" else [True, False]
    model = MODELS[name]()
    scaler = streammargin.StandardScaler() if scale else None
    train = [({k: rng.gauss(0, 1) for k in ["a", "b", "c"]}, label) for label in labels * 3]
    per_record(model, scaler, train)
    xs = []
    for _ in range(n):
        x = {k: rng.choice([rng.gauss(0, 2), 3, True, False])
             for k in rng.sample(["a", "b", "c", "new", "z=1"], rng.randint(0, 4))}
        if rng.random() < 0.1:
            x["text"] = "a string"  # (refused by the per-record prediction)
        xs.append(x)
    saved = state.dumps(model.to_state())

    def one(x):
        scaled = x if scaler is None else _transformed(scaler, x, indicators)
        return model.predict_with_proba_one(scaled)

    expected = []
    for x in xs:
        try:
            expected.append(one(x))
        except InvalidInput:
            expected.append("refused")
    if "refused" in expected:
        with pytest.raises(InvalidInput):
            predict_many(model, scaler, xs, indicators)
        return
    labels_out, probas = predict_many(model, scaler, xs, indicators)
    assert list(zip(labels_out, probas)) == expected
    assert state.dumps(model.to_state()) == saved
    # The shapes kept from call to call (a server's): the same bits on every call, the rows in
    # another order, and never more names held after a call than their bound.
    from streammargin.progressive import PredictionShapes

    kept = PredictionShapes(model, scaler)
    kept.MAX_NAMES = 6
    for _ in range(3):
        assert predict_many(model, scaler, xs, indicators, kept) == (labels_out, probas)
        assert kept.names <= 6 and sum(map(len, (names for names, _ in kept.known))) <= 6
        shuffled = rng.sample(range(n), n)
        again = predict_many(model, scaler, [xs[i] for i in shuffled], indicators, kept)
        assert again == ([labels_out[i] for i in shuffled], [probas[i] for i in shuffled])
    assert state.dumps(model.to_state()) == saved
    if xs:
        with pytest.raises(ValueError, match="another model"):
            predict_many(MODELS[name](), scaler, xs, indicators, kept)


@given(sets=st.lists(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=30,
                              unique=True), min_size=1, max_size=60))
@settings(max_examples=40, deadline=None)
def test_the_prediction_shapes_kept_stay_within_their_bound_whatever_names_come(sets):
    """Hostile requests bring a new set of names each: what is kept after each call stays within
    PredictionShapes' bound of names and characters, and every prediction is the per-record
    call's."""
    from streammargin.progressive import PredictionShapes, predict_many

    model = streammargin.ALMAClassifier()
    model.learn_one({"a": 1.0}, True)
    model.learn_one({"a": -1.0}, False)
    kept = PredictionShapes(model)
    kept.MAX_NAMES, kept.MAX_CHARS = 50, 400
    for names in sets:
        xs = [{name: float(j) for j, name in enumerate(names)} for _ in range(5)]
        labels, probas = predict_many(model, None, xs, shapes=kept)
        assert (labels[0], probas[0]) == model.predict_with_proba_one(xs[0])
        held = [names for names, _ in kept.known]
        assert kept.names == sum(map(len, held)) <= 50
        assert kept.chars <= 400
