"""streammargin.StandardScaler: River's StandardScaler bit for bit, in bounded memory, with a
validated state."""

from __future__ import annotations

import contextlib
import copy
import math
import random
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from river import checks, preprocessing

from streammargin import StandardScaler, state
from streammargin import scaler as scaler_module
from streammargin.errors import InvalidInput, StateError
from streammargin.scaler import MAX_FEATURES_LIMIT

FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def round_trip(scaler):
    return StandardScaler.from_state(state.loads(state.dumps(scaler.to_state())))


# Names that come and go; values River keeps finite: floats of any moderate size, ints, bools.
names = st.sampled_from(["a", "b", "c", "long" * 10, 7, -3, 2.5, None, ("t", 1), True])
values = (
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
    | st.floats(min_value=-1e-300, max_value=1e-300, allow_nan=False)
    | st.integers(-(10**6), 10**6)
    | st.booleans()
)
records = st.dictionaries(names, values, max_size=6)
streams = st.lists(records, min_size=1, max_size=60)


def same(ours: dict, rivers: dict) -> bool:
    """Equal to the last bit (0.0 and -0.0 apart), in the same order."""
    return list(ours) == list(rivers) and all(
        type(ours[k]) is float and (ours[k], math.copysign(1, ours[k]))
        == (float(rivers[k]), math.copysign(1, float(rivers[k])))
        for k in ours
    )


@FAST
@given(stream=streams)
def test_transform_is_bit_identical_to_rivers_standard_scaler(stream):
    ours, rivers = StandardScaler(), preprocessing.StandardScaler()
    for x in stream:
        assert same(ours.transform_one(x), rivers.transform_one(x))
        ours.learn_one(x)
        rivers.learn_one(x)
        assert same(ours.transform_one(x), rivers.transform_one(x))
    assert ours.counts == {k: v for k, v in rivers.counts.items()}
    assert ours.means == {k: rivers.means[k] for k in rivers.counts}
    assert ours.vars == {k: rivers.vars[k] for k in rivers.counts}
    assert ours.counters == {"beyond_max_features": 0, "unsavable_names": 0,
                             "overflow_skipped": 0}


@FAST
@given(stream=streams, split=st.integers(0, 60))
def test_state_round_trip_continues_identically(stream, split):
    original = StandardScaler()
    for x in stream[:split]:
        original.learn_one(x)
    restored = round_trip(original)
    assert state.dumps(restored.to_state()) == state.dumps(original.to_state())
    for x in stream[split:]:
        assert same(restored.transform_one(x), original.transform_one(x))
        restored.learn_one(x)
        original.learn_one(x)
    assert state.dumps(restored.to_state()) == state.dumps(original.to_state())


def test_a_real_stream_matches_river_on_thousands_of_records():
    rng = random.Random(0)
    ours, rivers = StandardScaler(), preprocessing.StandardScaler()
    for i in range(5000):
        x = {f"f{j}": rng.gauss(j, 1 + j) for j in rng.sample(range(40), 8)}
        x["id"] = i % 3
        assert same(ours.transform_one(x), rivers.transform_one(x))
        ours.learn_one(x)
        rivers.learn_one(x)
    assert ours.means == dict(rivers.means)


# The compiled path (streammargin.jit.scaler) takes records whose names all have columns.
@pytest.mark.parametrize("path", ["c", "numba"])
def test_the_compiled_path_takes_pow_as_river_does_not_sqrt(path):
    with scaler_path(path):
        takes_pow_as_river()


def takes_pow_as_river():
    # var = 0.24999994039535875 after these two values: glibc's pow(var, 0.5) and sqrt(var)
    # differ in the last bit, and River divides by var ** 0.5. (LLVM turns a constant exponent
    # into sqrt: this gave -1.0 instead of -0.9999999999999999.)
    ours, rivers = StandardScaler(), preprocessing.StandardScaler()
    for x in ({"d": True}, {"d": 1.192092896e-07}):
        ours.learn_one(x)
        rivers.learn_one(x)
    assert ours._known_record({"d": 1.192092896e-07}) is not None  # the compiled path
    assert ours.vars["d"] ** 0.5 != math.sqrt(ours.vars["d"])
    assert same(ours.transform_one({"d": 1.192092896e-07}),
                rivers.transform_one({"d": 1.192092896e-07}))
    before, after, update = ours.transform_learn_one({"d": 3.0})
    rivers_before = rivers.transform_one({"d": 3.0})
    rivers.learn_one({"d": 3.0})
    ours.apply_learn(update)
    assert same(before, rivers_before) and same(after, rivers.transform_one({"d": 3.0}))


# River's conventions -------------------------------------------------------------------------


@pytest.mark.parametrize("params", list(StandardScaler._unit_test_params()))
def test_river_checker(params):
    checks.check_estimator(StandardScaler(**params))


def test_clone_repr_and_pipeline():
    scaler = StandardScaler(max_features=10)
    scaler.learn_one({"a": 1.0})
    twin = scaler.clone()
    assert twin.max_features == 10 and twin.means == {}
    assert repr(scaler) == "StandardScaler (\n  max_features=10\n)"
    pipeline = StandardScaler() | preprocessing.StandardScaler()
    pipeline.learn_one({"a": 2.0})
    assert pipeline.transform_one({"a": 2.0}) == {"a": 0.0}


@pytest.mark.parametrize("bad", [-1, 0, MAX_FEATURES_LIMIT + 1, 2.0, True, "10"])
def test_max_features_is_checked(bad):
    with pytest.raises(ValueError, match="max_features"):
        StandardScaler(max_features=bad)


# Bounds ---------------------------------------------------------------------------------------


def test_names_beyond_the_bound_pass_through_unscaled_and_memory_stops_growing():
    scaler = StandardScaler(max_features=1000)
    for i in range(1000):
        scaler.learn_one({f"name-{i}": float(i), "shared": float(i % 7)})
    assert len(scaler.means) == 1000  # "shared" took a column: the 1000th name went over
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    for i in range(1000, 21000):
        scaler.learn_one({f"name-{i}": float(i), "shared": float(i % 7)})
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert after - before < 64 << 10  # nothing kept per new name
    assert len(scaler.means) == 1000 and scaler._means.shape == (1000,)
    assert scaler.counters["beyond_max_features"] == 20001
    out = scaler.transform_one({"name-5000": 5000.0, "shared": 3.0, "name-3": 3.0})
    assert out["name-5000"] == 5000.0  # unscaled
    assert out["shared"] != 3.0 and out["name-3"] == 0.0  # scaled (name-3 has no variance)


def test_memory_per_name_is_bounded_as_documented():
    tracemalloc.start()
    scaler = StandardScaler(max_features=1 << 12)
    for i in range(1 << 13):
        scaler.learn_one({f"{i:0126d}": 1.0})  # (the longest ASCII names it keeps)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(scaler.means) == 1 << 12
    assert current <= scaler_module.memory_bound(1 << 12)  # (what --max-memory charges)
    assert current > 0.8 * scaler_module.memory_bound(1 << 12)  # (and not far above it)


@settings(max_examples=60, deadline=None)
@given(names=st.lists(st.text(max_size=140), min_size=1, max_size=48, unique=True))
def test_a_state_stays_within_its_bound_whatever_the_names(names):
    scaler = StandardScaler(max_features=32)
    for name in names:
        scaler.learn_one({name: 1.5e300})
        scaler.learn_one({name: -2.2250738585072014e-308})
    assert len(state.dumps(scaler.to_state())) <= scaler_module.state_bound(32)


def test_long_and_unsavable_names_pass_through_unscaled():
    scaler = StandardScaler()
    long_name = "x" * 127  # (its JSON, quotes included, is 129 bytes)
    escaped = "\U0001f600" * 11  # 11 characters, 133 bytes of JSON ("\\ud83d\\ude00" each)
    for name in (long_name, escaped, ("é" * 20,), math.nan, 2**70, ("a",) * 9, frozenset()):
        scaler.learn_one({name: 5.0})
        scaler.learn_one({name: 7.0})
        assert scaler.transform_one({name: 7.0}) == {name: 7.0}
    assert scaler.counters["unsavable_names"] == 14 and scaler.means == {}
    state.dumps(scaler.to_state())


def test_overflowing_values_leave_the_statistics_finite_where_river_poisons_them():
    stream = [{"f": 1.0}, {"f": 2.0}, {"f": 1e200}, {"f": 3.0}, {"f": 4.0}]
    ours, rivers = StandardScaler(), preprocessing.StandardScaler()
    for x in stream:
        ours.learn_one(x)
        rivers.learn_one(x)
    # River's variance overflowed (inf, then NaN): every later value of "f" scales to NaN.
    assert math.isnan(rivers.vars["f"]) and math.isnan(rivers.transform_one({"f": 4.0})["f"])
    assert ours.counters["overflow_skipped"] == 1  # 1e200: its square overflows
    reference = StandardScaler()
    for x in [{"f": 1.0}, {"f": 2.0}, {"f": 3.0}, {"f": 4.0}]:
        reference.learn_one(x)
    assert ours.means == reference.means and ours.vars == reference.vars
    assert ours.transform_one({"f": 4.0}) == reference.transform_one({"f": 4.0})
    state.dumps(ours.to_state())  # still a valid state (no inf or NaN)


@FAST
@given(stream=st.lists(st.dictionaries(
    st.sampled_from(["a", "b"]),
    st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**300), 10**300),
    max_size=2), max_size=40))
def test_any_finite_values_keep_the_statistics_finite_and_saveable(stream):
    scaler = StandardScaler()
    for x in stream:
        scaler.learn_one(x)
        assert all(math.isfinite(v) and v >= 0 for v in scaler.vars.values())
        assert all(math.isfinite(v) for v in scaler.means.values())
    round_trip(scaler)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "1.0", None, [1.0], 10**400])
def test_bad_values_raise_invalid_input_and_change_nothing(bad):
    scaler = StandardScaler()
    scaler.learn_one({"a": 1.0, "b": 2.0})
    before = state.dumps(scaler.to_state())
    with pytest.raises(InvalidInput, match="'b'"):
        scaler.learn_one({"a": 5.0, "b": bad})
    with pytest.raises(InvalidInput, match="'b'"):
        scaler.transform_one({"a": 5.0, "b": bad})
    assert state.dumps(scaler.to_state()) == before


# Hostile states --------------------------------------------------------------------------------


def trained(n=200, max_features=50):
    scaler = StandardScaler(max_features=max_features)
    rng = random.Random(1)
    for _ in range(n):
        scaler.learn_one({rng.choice(["a", "b", 3, ("t", 1), None, 2.5, True]): rng.gauss(0, 5)})
    return scaler


@pytest.mark.parametrize(
    "mutation",
    [
        lambda s: s.update(max_features=0),
        lambda s: s.update(max_features=10**12),
        lambda s: s.update(names=s["names"] * 100),  # more names than max_features
        lambda s: s.update(names=s["names"][:-1]),  # arrays do not match
        lambda s: s.update(names=[s["names"][0]] * len(s["names"])),  # duplicates
        lambda s: s["names"].__setitem__(0, "x" * 129),
        lambda s: s["names"].__setitem__(0, {"tuple": [{"tuple": ["a"]}]}),
        lambda s: s["names"].__setitem__(0, {"int": 2**70}),
        lambda s: s["names"].__setitem__(0, {"float": "nan"}),
        lambda s: s["names"].__setitem__(0, {"bytes": "a"}),
        lambda s: s["counts"].__setitem__(0, -1),
        lambda s: s["means"].__setitem__(0, np.nan),
        lambda s: s["vars"].__setitem__(0, -1.0),
        lambda s: s["vars"].__setitem__(0, np.inf),
        lambda s: s.update(counts=s["counts"].astype(np.float64)),
        lambda s: s.update(means=s["means"].reshape(1, -1)),
        lambda s: s.update(counts=np.zeros_like(s["counts"])),  # statistics without a count
        lambda s: s["counters"].update(overflow_skipped=-1),
        lambda s: s["counters"].update(extra=1),
        lambda s: s.update(scaler="MinMaxScaler"),
        lambda s: s.update(scaler=np.zeros(2)),
        lambda s: s.pop("vars"),
    ],
)
def test_hostile_scaler_states_raise_state_error(mutation):
    saved = state.loads(state.dumps(trained().to_state()))
    mutation(saved)
    with pytest.raises(StateError):
        StandardScaler.from_state(saved)


def test_a_deeply_nested_name_is_refused_without_recursion():
    saved = state.loads(state.dumps(trained().to_state()))
    name = "a"
    for _ in range(100_000):
        name = {"tuple": [name]}
    saved["names"][0] = name
    with pytest.raises(StateError):
        StandardScaler.from_state(saved)


SAVED = state.loads(state.dumps(trained().to_state()))
REPLACEMENTS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=4),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                         max_size=2),
    st.builds(lambda dtype, n: np.ones(n, dtype=dtype),
              st.sampled_from([np.float64, np.int64, np.uint8, np.bool_]), st.integers(0, 60)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(key=st.sampled_from(sorted(SAVED)), index=st.integers(0, 10), value=REPLACEMENTS)
def test_mutated_scaler_states_restore_or_raise_state_error(key, index, value):
    hostile = copy.deepcopy(SAVED)
    target = hostile[key]
    if isinstance(target, (list, np.ndarray)) and len(target) and index < 5:
        try:
            target[index % len(target)] = value
        except (TypeError, ValueError, OverflowError):
            return  # not a value of that array's dtype
    elif isinstance(target, dict) and target and index < 5:
        target[sorted(target)[index % len(target)]] = value
    else:
        hostile[key] = value
    tracemalloc.start()
    try:
        scaler = StandardScaler.from_state(hostile)
    except StateError:
        scaler = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 4 << 20
    if scaler is not None:
        rng = random.Random(2)
        for _ in range(50):
            x = {rng.choice(["a", "b", 3, ("t", 1), "new"]): rng.gauss(0, 5)}
            scaler.learn_one(x)
            assert all(math.isfinite(v) for v in scaler.transform_one(x).values())
        round_trip(scaler)


# transform_learn_one: River's two scalings of a labelled record in one pass --------------------

def identical(ours: dict, theirs: dict) -> bool:
    """Same keys in the same order, values of the same type and bits (unscaled values pass
    through as they came: ints stay ints)."""
    return list(ours) == list(theirs) and all(
        type(ours[k]) is type(theirs[k]) and ours[k] == theirs[k]
        and math.copysign(1, ours[k]) == math.copysign(1, theirs[k])
        for k in ours
    )


bounded_names = st.sampled_from(["a", "b", "c", "d", "e", "x" * 200, 7, ("t", 1), ("u",) * 9])
wide_values = values | st.sampled_from([1e200, -1e200, 1.5e300, -0.0, 0.0])
bounded_streams = st.lists(st.dictionaries(bounded_names, wide_values, max_size=6), min_size=1,
                           max_size=40)


@FAST
@given(stream=bounded_streams, max_features=st.integers(1, 6),
       learn=st.lists(st.booleans(), min_size=40, max_size=40))
def test_transform_learn_one_equals_transform_learn_transform(stream, max_features, learn):
    # The scaler of a labelled record in the worker: one pass instead of transform_one,
    # learn_one, transform_one; the same figures, state and counters, bounds acting included
    # (few columns, names that cannot be saved, values whose updates overflow).
    fused, reference = StandardScaler(max_features), StandardScaler(max_features)
    for x, labelled in zip(stream, learn):
        before, after, update = fused.transform_learn_one(x)
        assert identical(before, reference.transform_one(x))
        if not labelled:  # a prediction only: nothing changes
            continue
        reference.learn_one(x)
        fused.apply_learn(update)
        assert identical(after, reference.transform_one(x))
        assert fused.counters == reference.counters
    assert state.dumps(fused.to_state()) == state.dumps(reference.to_state())


def test_transform_learn_one_changes_nothing_and_refuses_bad_values_first():
    scaler = StandardScaler()
    scaler.learn_one({"a": 1.0, "b": 2.0})
    saved = state.dumps(scaler.to_state())
    scaler.transform_learn_one({"a": 3.0, "c": 4.0})
    assert state.dumps(scaler.to_state()) == saved
    with pytest.raises(InvalidInput, match="'b'"):
        scaler.transform_learn_one({"a": 3.0, "b": math.inf})
    assert state.dumps(scaler.to_state()) == saved


# The compiled path (streammargin.jit.scaler): records whose names all have columns and whose
# values are floats, ints or bools; the Python path for the rest (new names, other types).
repeated_streams = st.lists(
    st.fixed_dictionaries({"a": wide_values, "b": values, 7: wide_values})
    | st.fixed_dictionaries({"b": values, "a": wide_values, 7: wide_values}),
    min_size=2, max_size=40,
)


@contextlib.contextmanager
def scaler_path(path: str):
    """Records of known names through records.c (`c`, where it is built) or numba only."""
    saved = scaler_module._native
    if path == "numba":
        scaler_module._native = None
    elif scaler_module._native_scaler() is None:
        pytest.skip("records.c is not built")
    try:
        yield
    finally:
        scaler_module._native = saved


@pytest.mark.parametrize("path", ["c", "numba"])
@FAST
@given(stream=repeated_streams, learn=st.lists(st.booleans(), min_size=40, max_size=40))
def test_the_compiled_path_is_rivers_pipeline_to_the_last_bit(path, stream, learn):
    with scaler_path(path):
        compiled_path_is_rivers(stream, learn)


def compiled_path_is_rivers(stream, learn):
    fused, ours, rivers = StandardScaler(), StandardScaler(), preprocessing.StandardScaler()
    compiled = known = 0
    for x, labelled in zip(stream, learn):
        compiled += fused._known_record(x) is not None
        known += bool(fused.counts)  # names have columns once a record was learnt
        # River's is the reference until an overflow poisons it (ours keeps those statistics:
        # see above), the Python path always.
        rivers_finite = all(map(math.isfinite, [*rivers.vars.values(), *rivers.means.values()]))
        before, after, update = fused.transform_learn_one(x)
        assert identical(before, ours.transform_one(x))
        if rivers_finite:
            assert identical(before, rivers.transform_one(x))
        if labelled:
            fused.apply_learn(update)
            ours.learn_one(x)
            rivers.learn_one(x)
            assert identical(after, ours.transform_one(x))
            if rivers_finite and fused.counters["overflow_skipped"] == 0:
                assert identical(after, rivers.transform_one(x))
    assert compiled == known
    assert fused.counters == ours.counters
    assert state.dumps(fused.to_state()) == state.dumps(ours.to_state())
