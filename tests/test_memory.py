"""The memory ceiling: a bounded feature space (hashing beyond the bound), bounded classes, and a
bound in bytes that every model keeps and that `from_state` enforces before allocating."""

from __future__ import annotations

import json
import math
import tracemalloc
import zlib

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streammargin
from streammargin import memory, state
from streammargin.errors import InvalidInput, StateError
from streammargin.features import MAX_NAME_BYTES, FeatureSpace, hashed_columns

# Wrappers (OneVsRestClassifier) have no feature space of their own: their bound is made of their
# members' (tests/test_multiclass.py).
MODEL_CLASSES = sorted(
    (cls for cls in state.registered_models().values() if not hasattr(cls, "_memory_bound")),
    key=lambda cls: cls.__name__,
)
SMALL = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def small_params(cls) -> list[dict]:
    """Each unit-test parameter set of `cls`, with a small bound unless it sets its own."""
    return [
        {**params, "max_features": params.get("max_features", 20)}
        for params in cls._unit_test_params()
    ]


SMALL_CASES = [
    pytest.param(cls, params, id=f"{cls.__name__}-{i}")
    for cls in MODEL_CLASSES
    for i, params in enumerate(small_params(cls))
]


def dumps(model) -> bytes:
    return state.dumps(model.to_state())


def restored(model):
    return streammargin.from_state(state.loads(dumps(model)))


def label_of(model, i: int):
    return ["u", "v", "w"][i % 3] if model._multiclass else i % 2 == 0


def new_names_stream(n: int, seed: int = 0, stable: int = 3):
    """n records: `stable` features always present plus one name never seen before."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        x = {f"s{j}": float(v) for j, v in enumerate(rng.normal(size=stable))}
        x[f"id{i}"] = 1.0
        yield x, bool(x["s0"] > 0)


def colliding_names(space: FeatureSpace, count: int = 2, prefix: str = "c") -> list[str]:
    """`count` names (never stored) that share one hashed column of `space`."""
    by_column: dict[int, list[str]] = {}
    for i in range(10_000):
        name = f"{prefix}{i}"
        column = space._hashed_column(json.dumps(name))
        by_column.setdefault(column, []).append(name)
        if len(by_column[column]) == count:
            return by_column[column]
    raise AssertionError("no collision found")


# The feature space: which column a name gets ------------------------------------------------------


def test_first_names_get_exact_columns_and_later_ones_their_crc32_column():
    space = FeatureSpace(first_column=1, max_features=16)
    assert (space.n_hashed, space.n_exact, space.hashed_start) == (2, 14, 15)
    idx, _ = space.encode({f"f{j}": 1.0 for j in range(14)}, grow=True)
    assert idx.tolist() == list(range(1, 15)) and space.full and not space.features_hashed
    assert space.n_columns == 17  # the hashed columns are in use from now on
    idx, val = space.encode({"late": 3.0, "f3": 2.0}, grow=True)
    expected = 15 + zlib.crc32(b'"late"') % 2
    # the record's new names took their columns in JSON order ("f10" before "f2"), and the
    # entries come in the order of their columns
    assert space.names[:7] == ["f0", "f1", "f10", "f11", "f12", "f13", "f2"]
    assert idx.tolist() == [space.index["f3"], expected] and val.tolist() == [2.0, 3.0]
    assert "late" not in space.index and len(space.names) == 14
    assert space.features_hashed == 1
    # the column does not depend on the process: CRC-32 of the name's JSON, not Python's hash
    assert space._hashed_column('"late"') == expected


def test_long_and_non_str_names_are_hashed_by_their_json_even_with_room():
    space = FeatureSpace(first_column=0, max_features=64)
    long_str = "x" * (MAX_NAME_BYTES - 1)  # 127 characters: 129 bytes of JSON
    fits = "y" * (MAX_NAME_BYTES - 2)  # 128 bytes of JSON: stored
    long_tuple = tuple(range(40))
    x = {"a": 1.0, long_str: 2.0, fits: 3.0, long_tuple: 4.0, (1, "b"): 5.0}
    idx, val = space.encode(x, grow=True)
    tuple_json = json.dumps({"tuple": [{"int": i} for i in range(40)]}, separators=(",", ":"))
    hashed = [  # (distinct here), in the order of their columns after the exact ones
        56 + zlib.crc32(json.dumps(long_str).encode()) % 8,
        56 + zlib.crc32(tuple_json.encode()) % 8,
    ]
    assert len(set(hashed)) == 2 and idx.tolist() == [0, 1, 2, *sorted(hashed)]
    assert space.names == ["a", fits, (1, "b")] and space.features_hashed == 2
    assert space.n_columns == 64  # the hashed columns came into use with the first hashed name


def test_names_that_cannot_be_saved_are_refused_before_anything_changes():
    space = FeatureSpace(first_column=0, max_features=8)
    space.encode({"a": 1.0}, grow=True)
    for bad in (float("nan"), frozenset({1}), ("ok", object())):
        with pytest.raises(InvalidInput, match="cannot be saved"):
            space.encode({"b": 1.0, bad: 2.0}, grow=True)
        assert space.names == ["a"] and space.n_columns == 1
        # prediction gives such a name no column
        assert space.encode({"a": 1.0, bad: 2.0}, grow=False)[0].tolist() == [0, -1]


def test_names_sharing_a_hashed_column_are_summed_into_one_entry_and_not_cached():
    space = FeatureSpace(first_column=1, max_features=8)  # 7 exact, 1 hashed (column 8)
    space.encode({f"f{j}": 1.0 for j in range(7)}, grow=True)
    x = {"f0": 1.0, "p": 2.0, "q": -0.5, "f1": 4.0, "r": 0.25}
    for grow in (False, True):
        idx, val = space.encode(x, grow=grow)
        # in the order of their columns; p, q and r summed in the order of their JSON text
        assert idx.tolist() == [1, 2, 8] and val.tolist() == [1.0, 4.0, 1.75]
        assert space._cache[0] == -1  # not cached: the learning must place and count it again
    assert space.features_hashed == 3


def test_a_sum_of_shared_values_beyond_float64_is_refused_and_changes_nothing():
    space = FeatureSpace(first_column=0, max_features=8)  # 7 exact columns, 1 hashed
    space.encode({f"f{j}": 1.0 for j in range(6)}, grow=True)
    before = space.to_state()
    x = {"f6": 1.0, "p": 1e308, "q": 1e308, "r": 0.0}  # p takes the last exact column
    assert space.encode(x, grow=False)[0].tolist() == [-1, -1, -1, -1]
    with pytest.raises(InvalidInput, match="share hashed column 7"):
        space.encode(x, grow=True)
    assert space.to_state() == before
    model = streammargin.ALMAClassifier(max_features=1)  # no exact column: every name hashed
    with pytest.raises(InvalidInput, match="beyond float64"):
        model.learn_one({"p": 1e308, "q": 1e308}, True)
    with pytest.raises(InvalidInput, match="beyond float64"):
        model.predict_one({"p": 1e308, "q": 1e308})
    assert model.n_trials == 0 and model.counters["features_hashed"] == 0


def test_prediction_maps_unknown_names_to_minus_one_until_the_exact_columns_are_full():
    space = FeatureSpace(first_column=0, max_features=4)  # 3 exact, 1 hashed
    space.encode({"a": 1.0, "b": 1.0}, grow=True)
    assert space.encode({"a": 1.0, "new": 1.0}, grow=False)[0].tolist() == [0, -1]
    space.encode({"c": 1.0}, grow=True)  # the last exact column: now full
    assert space.encode({"a": 1.0, "new": 1.0}, grow=False)[0].tolist() == [0, 3]
    assert space.encode({"new": 1.0, "a": 1.0}, grow=True)[0].tolist() == [0, 3]


def test_when_a_record_overflows_the_exact_columns_its_names_are_chosen_by_their_json_order():
    """The model must not depend on the dict's key order (River's checker shuffles keys)."""
    one, two = FeatureSpace(0, 4), FeatureSpace(0, 4)
    one.encode({"d": 1.0, "a": 2.0, "c": 3.0, "b": 4.0}, grow=True)
    two.encode({"b": 4.0, "c": 3.0, "a": 2.0, "d": 1.0}, grow=True)
    assert sorted(one.names) == sorted(two.names) == ["a", "b", "c"]
    assert one.encode({"d": 1.0}, grow=False)[0].tolist() == [3]


def test_a_restored_space_hashes_exactly_as_the_original():
    space = FeatureSpace(first_column=1, max_features=8)
    for i in range(30):
        space.encode({f"n{i}": 1.0, "x" * 200: 2.0, (i, "t"): 0.5}, grow=True)
    saved = json.loads(json.dumps(space.to_state()))
    twin = FeatureSpace.from_state(saved, first_column=1, max_features=8)
    assert twin.to_state() == space.to_state()
    for x in ({"n0": 1.0, "n29": 2.0, "zz": 3.0}, {"x" * 200: 1.0, (99, "t"): 1.0}):
        for grow in (False, True):
            a, b = space.encode(dict(x), grow), twin.encode(dict(x), grow)
            assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    assert twin.features_hashed == space.features_hashed


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s.update(max_features=9), "max_features"),
        (lambda s: s.update(n_hashed=3), "n_hashed"),
        (lambda s: s.update(first_column=0), "first_column"),
        (lambda s: s["names"].extend(["p", "q", "r", "s", "t"]), "more than"),
        (lambda s: s["names"].append("y" * 200), "too long"),
        (lambda s: s["names"].append("n0"), "twice"),
        (lambda s: s.update(hashing="yes"), "flag"),
        (lambda s: s.update(features_hashed=-1), "counter"),
        (lambda s: s.update(names="n0"), "list of names"),
        # the structure is strict: exactly the keys to_state writes, ints that are not bools,
        # and the flag as learning leaves it
        (lambda s: s.update(extra=1), "exactly the keys"),
        (lambda s: s.pop("hashing"), "exactly the keys"),
        (lambda s: s.update(first_column=True), "first_column"),
        (lambda s: s.update(max_features=8.0), "max_features"),
        (lambda s: s.update(features_hashed=3), "flag is off"),
        (lambda s: s["names"].extend(["p", "q", "r", "s"]), "flag is off"),
    ],
)
def test_a_saved_space_that_does_not_fit_the_bound_is_refused(change, match):
    space = FeatureSpace(first_column=1, max_features=8)
    space.encode({f"n{i}": 1.0 for i in range(3)}, grow=True)
    saved = space.to_state()
    change(saved)
    with pytest.raises(StateError, match=match):
        FeatureSpace.from_state(saved, first_column=1, max_features=8)


def test_a_state_saved_before_the_bound_restores_if_its_names_fit():
    model = streammargin.ALMAClassifier()
    for x, y in new_names_stream(20):
        model.learn_one(x, y)
    old = model.to_state()
    old["features"] = {"first_column": 1, "names": old["features"]["names"]}
    del old["params"]["max_features"]
    twin = streammargin.from_state(old)
    assert twin.max_features == 2**16 and twin._features.names == model._features.names
    assert dumps(twin) == dumps(model)


# Models: the bound holds, round trips stay exact --------------------------------------------------


def model_arrays_bytes(model) -> int:
    model._flush() if hasattr(model, "_flush") else None
    return sum(v.nbytes for v in vars(model).values() if isinstance(v, np.ndarray))


def support_rows(model) -> int | None:
    return getattr(model, "support_size", None)


names_st = st.one_of(
    st.text(alphabet="abcxyz", min_size=1, max_size=4),
    st.text(min_size=120, max_size=140),  # around MAX_NAME_BYTES
    st.integers(-3, 3),
    st.tuples(st.integers(0, 2), st.sampled_from(["p", "q"])),
)
values_st = st.floats(-1e3, 1e3, allow_nan=False) | st.booleans()
records_st = st.lists(
    st.tuples(
        st.dictionaries(names_st, values_st, max_size=6), st.integers(0, 5), st.integers(0, 2)
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.parametrize(("cls", "params"), SMALL_CASES)
@SMALL
@given(records=records_st)
def test_new_names_never_take_a_model_beyond_its_bound_and_round_trips_stay_exact(
    cls, params, records
):
    model = cls(**params)
    bound = memory.memory_bound(model)
    hashed_space = FeatureSpace(0, params["max_features"])
    for i, (x, n_new, label) in enumerate(records):
        x = dict(x)
        for k in range(n_new):  # names never seen, some of them sharing a hashed column
            x[f"new{i}_{k}"] = float(k + 1)
        x.update({name: 0.5 for name in colliding_names(hashed_space, 2, prefix=f"h{i}_")})
        y = label_of(model, label)
        model.predict_proba_one(x)
        model.learn_one(x, y)
        proba = model.predict_proba_one(x)
        assert math.isclose(sum(proba.values()), 1.0) and all(0 <= p <= 1 for p in proba.values())
        score = model.decision_one(x)
        scores = score.values() if isinstance(score, dict) else [score]
        assert all(math.isfinite(s) for s in scores)
        assert memory.memory_size(model) <= bound - memory.STATE_OVERHEAD
        assert len(model._features.names) <= model._features.n_exact
        if support_rows(model) is not None:
            assert model.support_size <= model.budget
    assert len(dumps(model)) <= bound
    assert model.counters["features_hashed"] == model._features.features_hashed
    twin = restored(model)
    assert dumps(twin) == dumps(model)
    for i, (x, _, label) in enumerate(records[:5]):
        x = {**x, f"after{i}": 1.0, "y" * 300: 2.0}
        assert twin.predict_proba_one(x) == model.predict_proba_one(x)
        twin.learn_one(x, label_of(model, label))
        model.learn_one(x, label_of(model, label))
    assert dumps(twin) == dumps(model)


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda cls: cls.__name__)
def test_the_arrays_reach_exactly_the_formula_when_every_bound_is_used(cls):
    """The formula is the arrays' size at saturation, not a loose guess (capacity growth stops
    at the bound, it does not double past it)."""
    params = {"max_features": 50}
    if "max_classes" in cls().__dict__:
        params["max_classes"] = 3
    model = cls(**params)
    for i, (x, _) in enumerate(new_names_stream(120, stable=2)):
        model.learn_one(x, label_of(model, i))
    assert model._features.full
    expected = cls._max_array_bytes({**model._get_params()})
    if getattr(model, "_estimates_gamma", False):  # gamma="auto" freed its warm-up rows by now
        from streammargin.support import AUTO_GAMMA_RECORDS

        expected -= 8 * AUTO_GAMMA_RECORDS * (model._max_columns + 1)
    assert model_arrays_bytes(model) == expected
    names = sum(len(json.dumps(n)) + 1 for n in model._features.names)
    labels = sum(len(json.dumps(n)) + 1 for n in getattr(model, "_labels", []))
    assert memory.memory_size(model) == expected + names + labels


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda cls: cls.__name__)
def test_learn_many_with_hashed_columns_equals_learn_one(cls):
    model_one, model_many = cls(max_features=4), cls(max_features=4)
    rows = list(new_names_stream(60, stable=2))
    for i, (x, _) in enumerate(rows):
        model_one.learn_one(x, label_of(model_one, i))
    for start in range(0, 60, 20):
        batch = rows[start : start + 20]
        X = pd.DataFrame([x for x, _ in batch])
        y = pd.Series([label_of(model_one, start + i) for i in range(len(batch))])
        model_many.learn_many(X, y)
    assert model_many.counters == model_one.counters
    assert model_many._features.names == model_one._features.names
    probes = [x for x, _ in new_names_stream(10, seed=1, stable=2)] + [rows[5][0]]
    X = pd.DataFrame(probes)
    many_proba = model_many.predict_proba_many(X)
    for (_, row), x in zip(many_proba.iterrows(), probes):
        for label, p in model_one.predict_proba_one(x).items():
            assert row[label] == pytest.approx(p, rel=1e-9, abs=1e-12)


def test_learn_many_that_fails_leaves_the_bounded_space_as_it_was():
    model = streammargin.ALMAClassifier(max_features=4)
    model.learn_many(pd.DataFrame({"a": [1.0, 2.0], "b": [0.5, 0.1]}), pd.Series([True, False]))
    before = dumps(model)
    p, q = colliding_names(model._features)
    bad = pd.DataFrame({"c": [1.0, 2.0], p: [1.0, 2.0], q: [1.0, np.inf]})
    with pytest.raises(InvalidInput, match=repr(q)):
        model.learn_many(bad, pd.Series([True, False]))
    overflow = pd.DataFrame({"c": [1.0, 2.0], p: [1e308, 1.0], q: [1e308, 1.0]})
    with pytest.raises(InvalidInput, match="beyond float64"):
        model.learn_many(overflow, pd.Series([True, False]))
    assert dumps(model) == before


# The findings of issue 12 (each fails on the code before the bound) -------------------------------


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda cls: cls.__name__)
def test_state_stops_growing_once_the_bound_is_reached(cls):
    """Finding 3: one new name per record grew every model for ever (ALMA 11 MB after 200k
    records, a budget perceptron 2.8 KB a name). Now the state stops growing at the bound."""
    model = cls(max_features=64)
    sizes = []
    for i, (x, y) in enumerate(new_names_stream(3000)):
        model.learn_one(x, label_of(model, i))
        if i in (999, 2999):
            sizes.append(memory.memory_size(model))
            assert len(dumps(model)) <= memory.memory_bound(model)
    assert sizes[1] == sizes[0]
    assert model.counters["features_hashed"] >= 3000 - 64


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda cls: cls.__name__)
def test_defaults_keep_5000_new_names_under_the_documented_bound(cls):
    """Finding 3 at default parameters: a kernel model's support vectors were as wide as every
    name ever seen (5,000 names: 6.6 MB for a budget perceptron, 33 MB for the CPM)."""
    model = cls()
    for i, (x, y) in enumerate(new_names_stream(5000)):
        model.predict_one(x)
        model.learn_one(x, label_of(model, i))
    assert len(dumps(model)) <= memory.memory_bound(cls) < 40 * 2**20
    if hasattr(model, "_support"):
        assert model._support.shape[1] <= model.max_features


def test_cpm_checkpoint_of_10k_new_names_stays_under_the_producer_limit():
    """Finding 4: a CPM checkpoint passed the producer's 64 MiB request limit after ~10k names
    (its replay window is window x columns), and the worker crash-looped."""
    model = streammargin.ConvexPolytopeClassifier()
    rng = np.random.default_rng(0)
    for r in range(3):
        x = {f"r{r}_{j}": float(v) for j, v in enumerate(rng.normal(size=4000))}
        model.learn_one(x, r % 2 == 0)
    assert len(dumps(model)) < 20 * 2**20
    assert memory.memory_bound(model) < 64 * 2**20


def test_every_default_bound_fits_a_kafka_message_with_room_to_spare():
    for cls in MODEL_CLASSES:
        assert memory.memory_bound(cls) < 40 * 2**20, cls.__name__


@pytest.mark.parametrize(
    ("cls", "params", "match"),
    [
        # sizes beyond their validation bounds (`streammargin.validation`): bad parameters
        (streammargin.BudgetPerceptron, {"budget": 10**12}, "budget must be"),
        (streammargin.SBPClassifier, {"window": 10**9}, "window must be"),
        # valid sizes whose memory bound passes the limit
        (streammargin.BudgetPerceptron, {"budget": 100_000}, "limit"),
        (streammargin.SBPClassifier, {"window": 10_000, "max_features": 2**16}, "limit"),
        (streammargin.ALMAClassifier, {"max_features": 2**30}, "limit"),
        (
            streammargin.ConvexPolytopeClassifier,
            {"max_classes": 100_000, "n_faces": 10_000},
            "limit",
        ),
    ],
)
def test_from_state_refuses_a_bound_above_the_limit_before_allocating(cls, params, match):
    """Finding 2: `from_state` with budget=10**12 allocated before it validated (MemoryError).
    The params are validated first (a size beyond its bound is a bad parameter), then the bound
    they imply is checked against the limit, both before anything is allocated."""
    saved = cls().to_state()
    saved["params"].update(params)
    tracemalloc.start()
    try:
        with pytest.raises(StateError, match=match):
            streammargin.from_state(saved)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_from_state_takes_a_smaller_or_larger_limit():
    model = streammargin.MPUClassifier()
    model.learn_one({"a": 1.0}, True)
    saved = model.to_state()
    bound = memory.memory_bound(model)
    with pytest.raises(StateError, match="max_bytes"):
        streammargin.from_state(saved, max_bytes=bound - 1)
    assert dumps(streammargin.from_state(saved, max_bytes=bound)) == dumps(model)


@pytest.mark.parametrize(
    "params",
    [{"budget": "many"}, {"max_features": 0}, {"max_features": 2.5}, {"no_such_param": 1}, ["x"]],
    ids=repr,
)
def test_from_state_refuses_params_the_bound_cannot_read(params):
    saved = streammargin.BudgetPerceptron().to_state()
    if isinstance(params, dict):
        saved["params"].update(params)
    else:
        saved["params"] = params
    with pytest.raises(StateError):
        streammargin.from_state(saved)


def test_from_state_refuses_arrays_wider_than_the_bound():
    model = streammargin.ALMAClassifier(max_features=10)
    for x, y in new_names_stream(20):
        model.learn_one(x, y)
    saved = model.to_state()
    saved["arrays"]["_vectors"] = np.zeros((1000, 3))
    with pytest.raises(StateError, match="feature space"):
        streammargin.from_state(saved)
    kernel = streammargin.BudgetPerceptron(max_features=10, budget=5)
    kernel.learn_one({"a": 1.0}, True)
    saved = kernel.to_state()
    saved["arrays"]["_support"] = np.zeros((5, 500))
    with pytest.raises(StateError, match="feature space"):
        streammargin.from_state(saved)


# Classes of the natively multiclass CPM -----------------------------------------------------------


def test_cpm_refuses_a_label_beyond_max_classes_and_stays_untouched():
    model = streammargin.ConvexPolytopeClassifier(max_classes=3, n_faces=2, window=5)
    for i in range(9):
        model.learn_one({"a": float(i), f"n{i}": 1.0}, "abc"[i % 3])
    before = dumps(model)
    with pytest.raises(InvalidInput, match="max_classes=3"):
        model.learn_one({"a": 1.0, "fresh": 2.0}, "d")
    with pytest.raises(InvalidInput, match="max_classes=3"):
        frame = pd.DataFrame({"a": [1.0, 2.0], "fresh": [1.0, 1.0]})
        model.learn_many(frame, pd.Series(["a", "d"]))
    assert dumps(model) == before and model.classes == ["a", "b", "c"]
    model.learn_many(pd.DataFrame({"a": [1.0]}), pd.Series(["c"]))  # known labels still learn


def test_cpm_refuses_a_label_too_long_to_store_and_a_saved_state_with_too_many_classes():
    model = streammargin.ConvexPolytopeClassifier(max_classes=3, n_faces=2, window=5)
    with pytest.raises(InvalidInput, match="too long"):
        model.learn_one({"a": 1.0}, "L" * 300)  # 302 bytes of JSON, beyond 256
    for i in range(3):
        model.learn_one({"a": float(i)}, i)
    saved = model.to_state()
    saved["params"]["max_classes"] = 2
    with pytest.raises(StateError, match="max_classes"):
        streammargin.from_state(saved)


def test_the_bound_of_a_cpm_counts_its_classes():
    small = memory.memory_bound(streammargin.ConvexPolytopeClassifier, {"max_classes": 2})
    large = memory.memory_bound(streammargin.ConvexPolytopeClassifier, {"max_classes": 100})
    per_class = (1 + 2048) * 10 * 8 + 8 * 10 + (memory.MAX_LABEL_BYTES + 1)
    assert large - small > 98 * per_class * 0.99
    one = memory.memory_bound(streammargin.ConvexPolytopeClassifier, {"polytopes": "one"})
    assert one < small


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda cls: cls.__name__)
def test_max_features_must_be_a_positive_integer(cls):
    for bad in (0, -1, 2.0, True, "8", 2**40):
        with pytest.raises(ValueError, match="max_features"):
            cls(max_features=bad)


def test_hashed_columns_are_an_eighth():
    assert [hashed_columns(m) for m in (1, 7, 8, 64, 2**16)] == [1, 1, 1, 8, 8192]


# Given the classes a model holds ------------------------------------------------------------------


def _multiclass_models():
    return [
        streammargin.OneVsRestClassifier(streammargin.ALMAClassifier(max_features=16),
                                         max_classes=9),
        streammargin.ConvexPolytopeClassifier(max_features=16, max_classes=9, window=8),
        streammargin.AutoClassifier(max_classes=9, max_ovr_classes=4, max_features=16),
    ]


@SMALL
@given(labels=st.lists(st.integers(0, 8), min_size=1, max_size=60), seed=st.integers(0, 99))
def test_a_multiclass_model_stays_within_its_bound_at_the_classes_it_holds(labels, seed):
    # Held to the bound of the classes it holds after every record (arrays and names at most
    # what it counts; names in every feature space at most `stored_names`), and that bound
    # never above the ceiling nor below the bound of fewer classes.
    rng = np.random.default_rng(seed)
    for model in _multiclass_models():
        held = []
        for i, label in enumerate(labels):
            x = {f"f{j}": float(v) for j, v in enumerate(rng.normal(size=3))}
            x[f"id{seed}-{i}"] = 1.0  # a new name every record: the names reach their bound
            model.learn_one(x, f"class-{label}")
            k = memory.held_classes(model)
            assert k == len(set(labels[: i + 1]))
            bound = memory.memory_bound(model, classes=k)
            assert memory.memory_size(model) <= bound - memory.STATE_OVERHEAD
            assert len(state.dumps(model.to_state())) <= bound
            assert _names(model) <= memory.stored_names(model, classes=k)
            held.append(bound)
        ceiling = memory.memory_bound(model)
        assert all(b <= ceiling for b in held)
        assert memory.stored_names(model, classes=k) <= memory.stored_names(model)
        if not isinstance(model, streammargin.AutoClassifier):  # (its binary members retire)
            assert held == sorted(held)


def _names(model) -> int:
    """The names a model stores by name, over its feature spaces."""
    if isinstance(model, streammargin.OneVsRestClassifier):
        return sum(map(_names, model.classifiers.values()))
    if isinstance(model, streammargin.AutoClassifier):
        return sum(_names(m) for m in model.members.values() if m is not None)
    return len(model._features.names)


def test_the_bound_at_some_classes_counts_at_least_two_and_at_most_max_classes():
    ovr = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier(), max_classes=100)
    member = memory.memory_bound(streammargin.ALMAClassifier) - memory.STATE_OVERHEAD
    one = member + memory.MAX_LABEL_BYTES + 1
    # 0 or 1 class held: charged 2 (a binary stream has two); 3 held: 3; beyond: the ceiling
    assert [memory.memory_bound(ovr, classes=k) - memory.STATE_OVERHEAD
            for k in (0, 1, 2, 3)] == [2 * one, 2 * one, 2 * one, 3 * one]
    assert memory.memory_bound(ovr, classes=500) == memory.memory_bound(ovr) == (
        100 * one + memory.STATE_OVERHEAD)
    assert memory.stored_names(ovr, classes=3) == 3 * 57_344
    cpm = streammargin.ConvexPolytopeClassifier()
    assert memory.memory_bound(cpm, classes=3) == memory.memory_bound(cpm, {"max_classes": 3})
    assert memory.memory_bound(cpm, classes=0) == memory.memory_bound(cpm, {"max_classes": 2})
    # A binary model's bound does not depend on the classes; it holds none
    alma = streammargin.ALMAClassifier()
    assert memory.memory_bound(alma, classes=7) == memory.memory_bound(alma)
    assert memory.held_classes(alma) is None
    assert memory.held_classes(streammargin.ConvexPolytopeClassifier(polytopes="one")) is None
    with pytest.raises(ValueError, match="classes"):
        memory.memory_bound(ovr, classes=-1)


def test_an_auto_classifier_at_two_classes_is_charged_its_binary_members_and_records_kept():
    from streammargin import replay

    auto = streammargin.AutoClassifier()  # defaults: 2048 features, 100 classes, 10 one-vs-rest
    overhead = memory.STATE_OVERHEAD
    cpm = memory.memory_bound(streammargin.ConvexPolytopeClassifier, {"max_classes": 2})
    alma = memory.memory_bound(streammargin.ALMAClassifier, {"max_features": 2048})
    svm = memory.memory_bound(streammargin.BudgetSVMClassifier, {"max_features": 2048})
    labels_and_scores = 2 * (memory.MAX_LABEL_BYTES + 1) + 48
    assert memory.memory_bound(auto, classes=2) == (
        cpm + alma + svm - 2 * overhead + labels_and_scores + replay.MAX_BYTES)
    # 3 classes: one-vs-rest members of 3 classes, the records kept freed at the switch
    ovr = sum(memory.memory_bound(streammargin.OneVsRestClassifier(cls(max_features=2048)),
                                  classes=3) - overhead
              for cls in (streammargin.ALMAClassifier, streammargin.BudgetSVMClassifier))
    cpm3 = memory.memory_bound(streammargin.ConvexPolytopeClassifier, {"max_classes": 3})
    assert memory.memory_bound(auto, classes=3) == cpm3 + ovr + 3 * 257 + 48
    # Beyond max_ovr_classes the CPM serves alone
    cpm11 = memory.memory_bound(streammargin.ConvexPolytopeClassifier, {"max_classes": 11})
    assert memory.memory_bound(auto, classes=11) == cpm11 + 11 * 257 + 48
    assert memory.stored_names(auto, classes=11) == 1792
    assert memory.stored_names(auto, classes=2) == 3 * 1792
    assert memory.stored_names(auto, classes=4) == (1 + 2 * 4) * 1792
