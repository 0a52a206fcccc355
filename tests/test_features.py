"""The feature space's per-record contracts: what its fast paths return, and when."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streammargin.features import FeatureSpace


def snapshot(space: FeatureSpace) -> tuple:
    return (list(space.names), space.n_columns, space.hashing, space.features_hashed)


def test_repeat_encoding_is_the_last_encoding_of_an_equal_dict():
    space = FeatureSpace(first_column=1, max_features=64)
    x = {"a": 1.0, "b": 2, "c": True}
    assert space.repeat_encoding(x) is None  # nothing encoded yet
    idx, packed = space.encode_packed(x, grow=False)  # a prediction: the names are unknown
    assert space.repeat_encoding(x) is None  # learning must place them first
    idx, packed = space.encode_packed(x, grow=True)
    for again in (x, dict(x), {"c": 1, "b": 2.0, "a": True}):  # equal values pack alike
        before = snapshot(space)
        repeat = space.repeat_encoding(again)
        assert repeat is not None and repeat[0] is idx and repeat[1] is packed
        assert repeat == space.encode_packed(again, grow=True)
        assert snapshot(space) == before
    for other in (
        {"a": 1.0, "b": 2.5, "c": True},  # another value
        {"a": 1.0, "b": 2},  # fewer names
        {"a": 1.0, "b": 2, "d": 1.0},  # another name
        collections.OrderedDict(x),  # not a plain dict
        {"a": 1.0, "b": 2, "c": float("nan")},
        {"a": 1.0, "b": np.array([2.0, 3.0]), "c": True},  # a value that does not compare
        {"a": 1.0, "b": "2", "c": True},
        [("a", 1.0)],
        None,
    ):
        before = snapshot(space)
        assert space.repeat_encoding(other) is None
        assert snapshot(space) == before


def test_repeat_encoding_never_holds_a_record_with_a_hashed_name():
    space = FeatureSpace(max_features=2)  # one exact column, one hashed
    x = {"a": 1.0, "b": 2.0}
    space.encode_packed(x, grow=True)
    assert space.hashing and space.repeat_encoding(x) is None
    assert space.repeat_encoding({"a": 1.0}) is None


names = st.sampled_from(["a", "b", "c", 7, ("t", 1)])
values = st.floats(-1e6, 1e6, allow_nan=False) | st.integers(-5, 5) | st.booleans()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(records=st.lists(st.dictionaries(names, values, max_size=4), min_size=1, max_size=8))
def test_repeat_encoding_equals_encode_packed_whenever_it_answers(records):
    space = FeatureSpace(max_features=8)
    for i, x in enumerate(records):
        if i % 2:
            space.encode_packed(x, grow=False)
        repeat = space.repeat_encoding(x)
        encoded = space.encode_packed(x, grow=True)
        if repeat is not None:
            assert repeat[0].tolist() == encoded[0].tolist() and repeat[1] == encoded[1]
        idx, packed = encoded
        assert idx.dtype == np.int64 and idx.flags.c_contiguous and type(packed) is bytes


def test_repeat_encoding_answers_after_a_prediction_of_known_names():
    space = FeatureSpace(max_features=8)
    space.encode_packed({"a": 1.0, "b": 2.0}, grow=True)
    x = {"a": 3.0, "b": 4.0}
    predicted = space.encode_packed(x, grow=False)  # what predict_one encodes
    repeat = space.repeat_encoding(x)  # what learn_one then reuses
    assert repeat is not None and repeat[1] is predicted[1]


@pytest.mark.parametrize("max_features", [1, 3])
def test_a_full_space_hashes_and_then_repeats_nothing_new(max_features):
    space = FeatureSpace(max_features=max_features)
    for i in range(5):
        x = {f"n{i}": 1.0}
        space.encode_packed(x, grow=True)
        assert space.repeat_encoding(x) is None or f"n{i}" in space.index
