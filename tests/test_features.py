"""The feature space's per-record contracts: what its fast paths return, and when."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streammargin import features
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


# The C encoder (`streammargin/jit/records.c`) ------------------------------------------------------


def c_encoder():
    from streammargin.jit import aot

    module = aot.native("records")
    assert module is not None, (
        "the C encoder is not built for these sources: run `make test` (or `streammargin warmup`)"
    )
    return module


def sorted_known():
    return c_encoder().sorted_known


def test_feature_spaces_encode_with_the_c_encoder_where_it_is_built():
    FeatureSpace().encode_packed({"a": 1.0}, grow=True)  # (the first call looks it up)
    assert features._sorted_known is c_encoder().sorted_known
    assert features._pack_as is c_encoder().pack_as


def test_the_c_encoder_packs_a_dict_with_the_last_dicts_names_in_its_order():
    module = c_encoder()
    index = {"a": 3, "b": 1, "c": 2}
    *_, dict_names, ranks = module.sorted_known({"a": 1.5, "b": True, "c": 7}, index)
    assert dict_names == ("a", "b", "c") and ranks == (2, 0, 1)  # columns b, c, a
    in_order = module.sorted_known({"b": 1.0, "c": 2.0, "a": 3.0}, index)
    assert in_order[4] is in_order[0] and in_order[5] is None  # each name stays where it is
    assert module.pack_as({"b": 4, "c": 5.0, "a": True}, in_order[4], None)[0] == (4, 5.0, True)
    values, packed = module.pack_as({"a": 2.5, "b": 3, "c": False}, dict_names, ranks)
    assert values == (3, False, 2.5) and np.frombuffer(packed).tolist() == [3.0, 0.0, 2.5]
    same_names = {"".join(["a"]): 1.0, "b": 2.0, "c": 3.0}  # an equal str, another object
    assert module.pack_as(same_names, dict_names, ranks)[0] == (2.0, 3.0, 1.0)
    for refused in (
        {"b": 3.0, "a": 2.5, "c": 1.0},  # another order
        {"a": 2.5, "b": 3.0},
        {"a": 2.5, "b": 3.0, "d": 1.0},
        {"a": 2.5, "b": 3.0, "c": float("nan")},
        {"a": 2.5, "b": 3.0, "c": "1"},
        {"a": 2.5, "b": 3.0, Name("c"): 1.0},
        collections.OrderedDict(a=2.5, b=3.0, c=1.0),
    ):
        assert module.pack_as(refused, dict_names, ranks) is None, refused
    x = {"a": 2.5, "b": 3.0, "c": 1.0}
    for bad_ranks in ((0, 0, 1), (0, 1, 3), (0, 1, -1), (0, 1), (0, 1, 2.0), [2, 0, 1], False):
        assert module.pack_as(x, dict_names, bad_ranks) is None, bad_ranks
    assert module.pack_as(x, list(dict_names), ranks) is None


class Name(str):
    """A str subclass: its hash and equality could be Python code, so C leaves it to Python."""


def test_the_c_encoder_takes_only_known_str_names_with_plain_finite_values():
    encode = sorted_known()
    index = {"a": 3, "b": 1, "c": 2, 7: 0}
    names, values, columns, packed, _, _ = encode({"a": 1.5, "b": True, "c": 7}, index)
    assert names == ("b", "c", "a") and values == (True, 7, 1.5)
    assert type(columns) is bytearray and np.frombuffer(columns, np.int64).tolist() == [1, 2, 3]
    assert np.frombuffer(packed).tolist() == [1.0, 7.0, 1.5]
    for refused in (
        {},
        {"a": 1.0, "z": 1.0},  # a name without a column
        {7: 1.0},  # not a str
        {Name("a"): 1.0},
        {"a": float("nan")},
        {"a": float("-inf")},
        {"a": 10**400},  # beyond float64
        {"a": np.float64(1.0)},  # not exactly float: Python's path checks it
        {"a": "1.0"},
        {"a": None},
        collections.OrderedDict(a=1.0),
    ):
        assert encode(refused, index) is None, refused
    assert encode({"a": 1.0, "b": 2.0}, {"a": 1, "b": 1}) is None  # one column, two names
    assert encode({"a": 1.0}, {"a": -1}) is None
    assert encode({"a": 1.0}, {"a": 1.0}) is None  # not a column number
    assert encode({"a": 1.0}, collections.OrderedDict(a=1)) is None
    with pytest.raises(TypeError):
        encode({"a": 1.0})


pool = ["a", "b", "c", "d", "f", "g", 7, ("t", 1), Name("e")]
# Records that the C encoder takes when their names are known (str names, plain finite values),
# with a few entries of anything else now and then.
plain_records = st.dictionaries(st.sampled_from(["a", "b", "c", "d", "f", "g"]), values, max_size=6)
other_entries = st.dictionaries(
    st.sampled_from(pool) | st.text(max_size=2),
    values
    | st.sampled_from([float("nan"), float("inf"), 10**400, -(2**70), "1.0", None, -0.0])
    | st.floats(-10, 10).map(np.float64),
    max_size=2,
)
records_strategy = st.lists(
    st.tuples(plain_records, st.just({}) | other_entries, st.booleans()), min_size=1, max_size=6
)


def encoding_of(space: FeatureSpace, x: dict, grow: bool, encoder) -> tuple:
    """What `encode_packed` returns (or raises) with `encoder` as the C encoder, and the space
    after it."""
    saved = features._sorted_known, features._pack_as
    if encoder is None:
        features._sorted_known = features._pack_as = features._python_only
    else:
        features._sorted_known, features._pack_as = encoder.sorted_known, encoder.pack_as
    try:
        idx, packed = space.encode_packed(x, grow)
        assert idx.dtype == np.int64 and idx.flags.c_contiguous and idx.flags.writeable
        result = ("encoded", idx.tolist(), packed)
    except Exception as error:  # the same refusal, word for word
        result = ("raised", type(error).__name__, str(error))
    finally:
        features._sorted_known, features._pack_as = saved
    n, _, keys, idx, all_known, values_, packed_, packer, dict_names, ranks = space._cache
    cache = (n, keys, None if idx is None else idx.tolist(), all_known, values_, packed_, packer,
             dict_names, ranks)
    return result, cache, snapshot(space)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # (np.float64 inf)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    known=st.lists(st.sampled_from(pool), unique=True, max_size=len(pool)),
    max_features=st.sampled_from([3, 64]),
    records=records_strategy,
)
def test_the_c_encoder_encodes_exactly_as_python_does(known, max_features, records):
    encoder = c_encoder()
    with_c = FeatureSpace(first_column=1, max_features=max_features)
    python = FeatureSpace(first_column=1, max_features=max_features)
    for space in (with_c, python):
        for name in known:
            space.encode_packed({name: 1.0}, grow=True)
    for plain, other, grow in records:
        x = {**plain, **other}
        keys_before = list(x)
        assert encoding_of(with_c, x, grow, encoder) == encoding_of(python, x, grow, None)
        assert list(x) == keys_before
        for space, encoder_used in ((with_c, encoder), (python, None)):  # learn_one's check
            saved = features._sorted_known, features._pack_as
            if encoder_used is None:
                features._sorted_known = features._pack_as = features._python_only
            try:
                repeats = [space.repeat_encoding(again) for again in (x, dict(x), {**x, 0: 1})]
            finally:
                features._sorted_known, features._pack_as = saved
            if encoder_used is None:
                assert [None if r is None else (r[0].tolist(), r[1]) for r in repeats] == [
                    None if r is None else (r[0].tolist(), r[1]) for r in repeats_with_c]
            else:
                repeats_with_c = repeats


@settings(max_examples=150, deadline=None)
@given(
    sets=st.lists(st.lists(st.sampled_from(["a", "b", "c=x", "c=y", "d=p", "d=q", "e"]),
                           unique=True, min_size=1, max_size=5), min_size=1, max_size=4),
    order=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    values=st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(True), st.integers(-5, 5)),
                    min_size=5, max_size=5),
    grow=st.booleans(),
)
def test_recent_sets_of_names_encode_as_a_space_that_keeps_none(sets, order, values, grow):
    """A record whose names are those of a recent record (not the last one's: a stream of
    one-hot categories) is encoded from the recent encodings as a fresh computation would."""
    keeping = FeatureSpace(first_column=1, max_features=64)
    fresh = FeatureSpace(first_column=1, max_features=64)
    saved = features.RECENT_NAME_SETS
    for i in order:
        names = sets[i % len(sets)]
        x = {name: values[k % len(values)] for k, name in enumerate(names)}
        features.RECENT_NAME_SETS = saved
        kept = keeping.encode_packed(x, grow)
        features.RECENT_NAME_SETS = 0  # (every encoding forgotten before the next)
        fresh._recent.clear()
        computed = fresh.encode_packed(x, grow)
        assert (kept[0].tolist(), kept[1]) == (computed[0].tolist(), computed[1])
        values = values[1:] + values[:1]
    features.RECENT_NAME_SETS = saved
    assert len(keeping._recent) <= features.RECENT_NAME_SETS


def test_the_recent_encodings_are_forgotten_when_the_space_changes_its_cache():
    space = FeatureSpace(first_column=1, max_features=64)
    space.encode_packed({"a": 1.0, "b=x": True}, grow=True)
    space.encode_packed({"a": 2.0, "b=y": True}, grow=True)
    assert len(space._recent) == 2
    space._forget_cache()
    assert not space._recent
