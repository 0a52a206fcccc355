"""A model's predictions do not depend on the order of a record's keys, bit for bit.

Floating-point sums depend on the order of their terms: a model that took a record's entries in
the dict's order (or gave a record's new names their columns in that order) predicted differently
when the same stream came with its keys shuffled, far beyond River's tolerance once a budget
kernel model's removals diverged (River's `check_shuffle_features_no_impact` on ImageSegments).
`FeatureSpace` now gives every record's entries one order (`features.canonical_order`); these
tests feed every model the same stream twice, its keys shuffled per record, and ask for equal
outputs: new names mid-stream, several in one record, names hashed beyond a small bound, and
names unknown at prediction included.
"""

from __future__ import annotations

import itertools
import random

import pandas as pd
import pytest
from river import datasets

from streammargin.features import FeatureSpace
from tests.test_common import CASES, state_bytes

N_RECORDS = 160


def _multiclass(model) -> bool:
    return bool(getattr(model, "_multiclass", False))


def _stream(multiclass: bool) -> list[tuple[dict, object]]:
    """ImageSegments as it comes (unscaled: sums of terms of very different sizes, where the
    order of a sum shows), records thinned at random, with names from a pool of 80 appearing
    along the way (several new in one record, beyond a small model's exact columns)."""
    rng = random.Random(7)
    out = []
    for x, y in itertools.islice(datasets.ImageSegments(), N_RECORDS):
        record = {name: value for name, value in x.items() if rng.random() < 0.9}
        for k in rng.sample(range(80), rng.randint(0, 4)):
            record[f"extra_{k}"] = rng.uniform(-50.0, 50.0)
        out.append((record, y if multiclass else y in ("path", "cement", "window")))
    return out


def _shuffled(x: dict, rng: random.Random) -> dict:
    keys = list(x)
    rng.shuffle(keys)
    return {key: x[key] for key in keys}


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_shuffled_keys_give_the_same_predictions_bit_for_bit(cls, params):
    model, shuffled = cls(**params), cls(**params)
    stream = _stream(_multiclass(model))
    rng = random.Random(11)
    for n, (x, y) in enumerate(stream):
        # a prediction with names the model never learnt (unknown, or hashed past the bound)
        probe = {**x, "unseen_a": 3.5, "unseen_b": -120.0, ("unseen", n % 3): 0.25}
        for query, other in ((x, _shuffled(x, rng)), (probe, _shuffled(probe, rng))):
            assert model.predict_proba_one(query) == shuffled.predict_proba_one(other), n
            assert model.predict_one(query) == shuffled.predict_one(other), n
        model.learn_one(x, y)
        shuffled.learn_one(_shuffled(x, rng), y)
    assert state_bytes(model) == state_bytes(shuffled)


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_shuffled_frame_columns_give_the_same_model(cls, params):
    """Mini-batches: a frame's columns in another order give the same model and predictions."""
    model, shuffled = cls(**params), cls(**params)
    stream = _stream(_multiclass(model))
    X = pd.DataFrame([x for x, _ in stream])
    y = pd.Series([label for _, label in stream])
    columns = list(X.columns)
    random.Random(3).shuffle(columns)
    for start in range(0, len(X), 40):
        model.learn_many(X.iloc[start:start + 40], y.iloc[start:start + 40])
        shuffled.learn_many(X[columns].iloc[start:start + 40], y.iloc[start:start + 40])
    assert state_bytes(model) == state_bytes(shuffled)
    probe = X.assign(unseen_a=3.5, unseen_b=-120.0)
    probe_columns = list(probe.columns)
    random.Random(5).shuffle(probe_columns)
    expected = model.predict_proba_many(probe)
    got = shuffled.predict_proba_many(probe[probe_columns])
    pd.testing.assert_frame_equal(expected, got.reindex(columns=expected.columns), check_exact=True)


def test_canonical_order():
    """By column, unknown names (-1) last, the entries of one column by their names' JSON."""
    from streammargin.features import canonical_order

    assert canonical_order(["a", "b", "c"], [1, 2, 3]) is None
    assert canonical_order(["c", "a", "b"], [3, 1, 2]) == [1, 2, 0]
    # unknown names last, by JSON text: '"z"' before '7'
    assert canonical_order(["z", 7, "a"], [-1, -1, 4]) == [2, 0, 1]
    # names sharing a hashed column, by JSON text
    assert canonical_order(["q", "p", "a"], [9, 9, 2]) == [2, 1, 0]


def test_new_names_of_a_record_get_columns_in_json_order():
    space, other = FeatureSpace(max_features=16), FeatureSpace(max_features=16)
    space.encode({"b": 1.0, "a": 2.0, "c": 3.0}, grow=True)
    other.encode({"c": 3.0, "b": 1.0, "a": 2.0}, grow=True)
    assert space.names == other.names == ["a", "b", "c"]
    idx, val = other.encode({"c": 3.0, "a": 2.0, "b": 1.0}, grow=False)
    assert idx.tolist() == [0, 1, 2] and val.tolist() == [2.0, 1.0, 3.0]
