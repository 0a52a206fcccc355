"""Checkpoint state of River drift detectors and partition metrics: explicit, validated, safe.

A checkpoint is untrusted input. These tests restore real states, hostile states and mutations
of real states, and check that a restore either gives a detector that continues exactly as the
original would, or raises `StateError`: never another exception, never a Rust panic, never a
side effect (the old object-graph codec could be made to delete a file).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import pathlib
import random
import tempfile
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from river import drift

from connectors.observability.metrics import PartitionMetrics, detector_names, make_detector
from connectors.state import checkpoint, river_state
from streammargin import state
from streammargin.errors import StateError

FAST = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def round_trip(tree):
    return state.loads(state.dumps({"tree": tree}))["tree"]


def error_stream(n, seed, jump_every=400):
    """0/1 errors whose rate jumps between 0.1 and 0.7, so that detectors fire."""
    rng = random.Random(seed)
    return [float(rng.random() < (0.1 if (i // jump_every) % 2 == 0 else 0.7)) for i in range(n)]


DETECTOR_PARAMS = {
    "ADWIN": [{}, {"clock": 1, "max_buckets": 2, "delta": 0.1, "min_window_length": 1}],
    # Seeded: without a seed River's KSWIN draws a fresh OS seed at every reset (after a drift).
    "KSWIN": [{"seed": 3}, {"window_size": 60, "stat_size": 30, "alpha": 0.05, "seed": 8}],
    "PageHinkley": [{}, {"mode": "up", "threshold": 5.0}, {"mode": "down", "alpha": 1.0}],
    "DDM": [{}, {"warm_start": 5}],
    "EDDM": [{}, {"warm_start": 5, "alpha": 0.9, "beta": 0.8}],
    "FHDDM": [{}, {"short_window_size": 20}],
    "HDDMA": [{}, {"two_sided_test": True}],
    "HDDMW": [{}, {"two_sided_test": True, "lambda_val": 0.2}],
    "NoDrift": [{}],
}
CASES = [
    pytest.param(name, params, id=f"{name}-{i}")
    for name, options in DETECTOR_PARAMS.items()
    for i, params in enumerate(options)
]


def trained(name, params, n, seed=0):
    # River's defaults under `params` (not the worker's TUNED_PARAMS): the mutations below are
    # inconsistent for a detector past River's warm start.
    defaults = river_state.check_detector_params(name, {}, complete=False)
    detector = make_detector(name, {**defaults, **params})
    for x in error_stream(n, seed):
        detector.update(x)
    return detector


# The closed list ------------------------------------------------------------------------------


def test_the_worker_offers_exactly_the_detectors_with_a_checkpoint_state():
    assert set(river_state.DETECTORS) == set(DETECTOR_PARAMS)
    names = detector_names()
    assert set(names) == {name.lower() for name in DETECTOR_PARAMS} | {"none"}
    assert "dummydriftdetector" not in names  # a River test fixture, not a detector
    with pytest.raises(ValueError, match="unknown drift detector"):
        make_detector("DummyDriftDetector")
    with pytest.raises(TypeError, match="has no checkpoint state"):
        river_state.detector_to_state(drift.DummyDriftDetector())


# Round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "params"), CASES)
@FAST
@given(split=st.integers(0, 1500), seed=st.integers(0, 10**6))
def test_a_restored_detector_continues_exactly_as_the_original(name, params, split, seed):
    # KSWIN runs a Kolmogorov-Smirnov test per value: a shorter stream keeps the suite fast.
    short = name == "KSWIN"
    stream = error_stream(700, seed, jump_every=150) if short else error_stream(2500, seed)
    split = min(split, len(stream))
    original = make_detector(name, params)
    for x in stream[:split]:
        original.update(x)
    saved = river_state.detector_to_state(original)
    restored = river_state.detector_from_state(round_trip(saved))
    assert type(restored) is type(original)
    assert state.dumps(river_state.detector_to_state(restored)) == state.dumps(saved)
    for x in stream[split:]:
        original.update(x)
        restored.update(x)
        assert restored.drift_detected == original.drift_detected
        if hasattr(original, "warning_detected"):
            assert restored.warning_detected == original.warning_detected
    assert state.dumps(river_state.detector_to_state(restored)) == state.dumps(
        river_state.detector_to_state(original)
    )


def test_restored_detectors_do_detect_after_the_restore():
    # The round trips above are only worth something if detectors fire after the split.
    for name, options in DETECTOR_PARAMS.items():
        if name == "NoDrift":
            continue
        detector = river_state.detector_from_state(
            round_trip(river_state.detector_to_state(trained(name, options[0], 300)))
        )
        fired = 0
        for x in error_stream(3000, 1)[300:]:
            detector.update(x)
            fired += detector.drift_detected
        assert fired, name


# ADWIN: the Rust object's bytes ---------------------------------------------------------------

adwin_params = st.fixed_dictionaries({
    "delta": st.sampled_from([0.002, 0.05, 0.3]),
    "clock": st.integers(1, 40),
    "max_buckets": st.integers(2, 7),
    "min_window_length": st.integers(0, 10),
    "grace_period": st.integers(0, 20),
})
adwin_values = st.one_of(
    st.floats(-1e3, 1e3, allow_nan=False), st.sampled_from([0.0, 1.0]), st.integers(-5, 5)
)


@FAST
@given(params=adwin_params, values=st.lists(adwin_values, max_size=600), seed=st.integers(0, 99))
def test_adwin_bytes_parse_and_encode_back_to_the_same_bytes(params, values, seed):
    detector = drift.ADWIN(**params)
    rng = random.Random(seed)
    for x in values + [float(rng.random() < 0.3) for _ in range(rng.randint(0, 3000))]:
        detector.update(x)
        if rng.random() < 0.02:
            raw = detector._helper.__getstate__()
            fields = river_state.parse_adwin_bytes(raw)
            assert fields.pop("params") == params
            checked = river_state._check_adwin(fields, "window", params)
            assert river_state.encode_adwin_bytes(checked) == raw
    raw = detector._helper.__getstate__()
    fields = river_state.parse_adwin_bytes(raw)
    assert int(fields["bucket_sizes"] @ (1 << np.arange(len(fields["bucket_sizes"])))) == (
        detector.width
    )
    fields.pop("params")
    assert river_state.encode_adwin_bytes(river_state._check_adwin(fields, "w", params)) == raw


def test_adwin_layout_is_the_installed_rivers():
    # The fresh window: header fields, one empty level 0 of max_buckets + 1 zero slots, and the
    # wrapper's constructor arguments.
    detector = drift.ADWIN(delta=0.01, clock=7, max_buckets=3, min_window_length=4, grace_period=9)
    fields = river_state.parse_adwin_bytes(detector._helper.__getstate__())
    assert fields["params"] == {
        "delta": 0.01, "clock": 7, "max_buckets": 3, "min_window_length": 4, "grace_period": 9
    }
    assert fields["bucket_sizes"].tolist() == [0] and fields["width"] == 0.0
    for x in [1.0, 2.0, 3.0, 4.0, 5.0]:
        detector.update(x)
    fields = river_state.parse_adwin_bytes(detector._helper.__getstate__())
    assert (fields["total"], fields["width"], fields["tick"]) == (15.0, 5.0, 5)
    assert fields["variance"] == detector.variance
    assert fields["bucket_sizes"].tolist() == [3, 1]  # 4 singles overflowed: two merged
    assert fields["bucket_totals"].tolist() == [3.0, 4.0, 5.0, 3.0]
    with pytest.raises(StateError, match="past the layout"):
        river_state.parse_adwin_bytes(detector._helper.__getstate__() + b"\0")
    with pytest.raises(StateError, match="truncated"):
        river_state.parse_adwin_bytes(detector._helper.__getstate__()[:-3])


def adwin_state(n=2000, **params):
    return river_state.detector_to_state(trained("ADWIN", params, n))


def window_of(saved):
    return saved["state"]["window"]


def hostile_adwin_states():
    """(description, mutate(window fields) or mutate(state)) pairs that must be refused."""

    def sizes(values):
        return lambda w: w.update(bucket_sizes=np.array(values, dtype=np.int64))

    return [
        ("63 levels", lambda w: w.update(
            bucket_sizes=np.ones(64, dtype=np.int64),
            bucket_totals=np.zeros(64), bucket_variances=np.zeros(64))),
        ("no level", sizes([])),
        ("more entries than max_buckets", lambda w: w["bucket_sizes"].__setitem__(0, 6)),
        ("negative entries", lambda w: w["bucket_sizes"].__setitem__(0, -1)),
        ("empty last level", lambda w: w.update(
            bucket_sizes=np.append(w["bucket_sizes"], 0))),
        ("empty middle level", lambda w: w["bucket_sizes"].__setitem__(1, 0)),
        ("width not the points", lambda w: w.update(width=w["width"] + 1)),
        ("huge width", lambda w: w.update(width=2.0**70)),
        ("nan total", lambda w: w["bucket_totals"].__setitem__(0, np.nan)),
        ("inf variance", lambda w: w["bucket_variances"].__setitem__(0, np.inf)),
        ("negative bucket variance", lambda w: w["bucket_variances"].__setitem__(0, -1.0)),
        ("too few totals", lambda w: w.update(bucket_totals=w["bucket_totals"][:-1])),
        ("int totals", lambda w: w.update(bucket_totals=w["bucket_totals"].astype(np.int64))),
        ("2-d sizes", lambda w: w.update(bucket_sizes=w["bucket_sizes"].reshape(1, -1))),
        ("tick beyond i32", lambda w: w.update(tick=2**31)),
        ("negative detections", lambda w: w.update(n_detections=-1)),
        ("bool tick", lambda w: w.update(tick=True)),
        ("string total", lambda w: w.update(total="1")),
        ("infinite total", lambda w: w.update(total=math.inf)),
        ("extra field", lambda w: w.update(extra=1)),
        ("missing field", lambda w: w.pop("tick")),
    ]


@pytest.mark.parametrize(
    "mutate", [m for _, m in hostile_adwin_states()], ids=[d for d, _ in hostile_adwin_states()]
)
def test_hostile_adwin_windows_are_refused(mutate):
    saved = adwin_state()
    mutate(window_of(saved))
    with pytest.raises(StateError):
        river_state.detector_from_state(saved)


@pytest.mark.parametrize(
    "params",
    [
        {"clock": 0},  # tick % clock: a division by zero in Rust
        {"clock": -1},
        {"max_buckets": 1},  # River's own ADWIN panics with one bucket per level
        {"max_buckets": 10**6},
        {"max_buckets": -1},
        {"delta": 0.0},
        {"delta": math.nan},
        {"delta": True},
        {"min_window_length": 1.5},
        {"grace_period": -1},
    ],
)
def test_adwin_parameters_that_could_panic_or_allocate_are_refused(params):
    saved = adwin_state()
    saved["params"].update(params)
    with pytest.raises(StateError):
        river_state.detector_from_state(saved)
    with pytest.raises(ValueError):
        make_detector("ADWIN", params)


def test_rivers_adwin_with_one_bucket_per_level_panics_which_is_why_it_is_refused():
    # Documents the reason for max_buckets >= 2: River's own code fails (a Rust panic, a
    # BaseException) once an emptied middle level becomes the last one.
    detector = drift.ADWIN(max_buckets=1, clock=1, delta=0.1, min_window_length=1, grace_period=1)
    with pytest.raises(BaseException, match="slice index") as caught:  # noqa: PT011
        for seed in range(30):
            for x in error_stream(3000, seed, jump_every=200):
                detector.update(x)
    assert not isinstance(caught.value, Exception)  # pyo3's PanicException


# Every detector: hostile and mutated states ---------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                               max_size=3),
    max_leaves=6,
)
def filled(dtype, n, fill):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.full(n, fill).astype(dtype)


ARRAYS = st.builds(
    filled,
    st.sampled_from([np.float64, np.int64, np.uint8, np.float32, np.bool_]),
    st.integers(0, 700),
    st.sampled_from([0, 1, -1, 3, 2**31, 1e300, -0.5]),
)
REPLACEMENTS = JSON_VALUES | ARRAYS | st.sampled_from(
    [-1, 0, 1, 2**31, 2**63, 10**12, -(10**12), 1e308, -1e308, 0.5, math.nan, math.inf, [], {}]
)


def paths(tree, prefix=()):
    """Every path to a node of a state tree (dict keys, list indexes, array elements)."""
    yield prefix
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from paths(value, (*prefix, i))
    elif isinstance(tree, np.ndarray) and tree.size:
        yield (*prefix, ("element", 0))
        yield (*prefix, ("element", tree.size - 1))


def mutate(tree, path, value):
    """A deep copy of `tree` with the node at `path` replaced by `value` (or deleted)."""
    tree = copy.deepcopy(tree)
    if not path:
        return value
    node = tree
    for key in path[:-1]:
        node = node[key]
    last = path[-1]
    if isinstance(last, tuple):  # an array element
        array = node.copy()
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                array.reshape(-1)[last[1]] = value
        except (TypeError, ValueError, OverflowError):
            return None  # not a value of that dtype: nothing to test
        parent = tree
        for key in path[:-2]:
            parent = parent[key]
        parent[path[-2]] = array
        return tree
    if value is _DELETE and isinstance(node, dict):
        del node[last]
    else:
        node[last] = value
    return tree


_DELETE = object()


def exercise(detector):
    """Run a restored detector on the kind of values the worker gives, and save it again."""
    for x in error_stream(150, 5, jump_every=50):
        detector.update(x)
        assert detector.drift_detected in (True, False)
    round_trip(river_state.detector_to_state(detector))


STATES = {
    f"{name}-{i}": river_state.detector_to_state(trained(name, params, 1200, seed=i))
    for name, options in DETECTOR_PARAMS.items()
    for i, params in enumerate(options)
}


@pytest.mark.parametrize("key", sorted(STATES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(data=st.data())
def test_mutated_detector_states_restore_or_raise_state_error(key, data):
    saved = STATES[key]
    path = data.draw(st.sampled_from(list(paths(saved))))
    value = data.draw(REPLACEMENTS | st.just(_DELETE))
    hostile = mutate(saved, path, value)
    if hostile is None:
        return
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        tracemalloc.start()
        try:
            detector = river_state.detector_from_state(hostile)
        except StateError:
            detector = None
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert peak < 8 << 20
        if detector is not None:
            exercise(detector)
        assert os.listdir(scratch) == []  # no side effect where relative paths would land


@pytest.mark.parametrize(
    "hostile",
    [
        None, [], "ADWIN", {"class": "ADWIN"},
        {"class": "river.drift:ADWIN", "params": {}, "state": {}},
        {"class": "DummyDriftDetector", "params": {}, "state": {}},
        {"class": "__class__", "params": {}, "state": {}},
        {"class": ["ADWIN"], "params": {}, "state": {}},
        {"class": "NoDrift", "params": {"x": 1}, "state": {}},
        {"class": "NoDrift", "params": {}, "state": {"update": "unlink"}},
        {"class": "KSWIN", "params": {"alpha": 0.005, "window_size": 100, "stat_size": 60,
                                      "seed": None}, "state": {}},
    ],
)
def test_malformed_detector_states_raise_state_error(hostile):
    with pytest.raises(StateError):
        river_state.detector_from_state(hostile)


def kswin_state():
    return river_state.detector_to_state(trained("KSWIN", {"seed": 1}, 500))


def test_a_degenerate_random_state_is_refused_so_kswin_cannot_loop_for_ever():
    # With a zero generator state random.sample would draw 0 for ever in its set-based loop.
    saved = river_state.detector_to_state(
        trained("KSWIN", {"window_size": 2000, "stat_size": 30, "seed": 1}, 100)
    )
    saved["state"]["rng"]["words"][:] = 0
    with pytest.raises(StateError, match="degenerate"):
        river_state.detector_from_state(saved)
    saved["state"]["rng"]["words"][0] = 0x80000000  # the one bit that counts: a proper state
    river_state.detector_from_state(saved)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("index", 625), ("index", -1), ("version", 2), ("version", True), ("gauss_next", "x"),
    ],
)
def test_bad_random_states_are_refused(field, value):
    saved = kswin_state()
    saved["state"]["rng"][field] = value
    with pytest.raises(StateError):
        river_state.detector_from_state(saved)
    saved = kswin_state()
    saved["state"]["rng"]["words"] = np.full(624, 2**32, dtype=np.int64)
    with pytest.raises(StateError):
        river_state.detector_from_state(saved)


def test_kswin_window_longer_than_its_size_or_its_count_is_refused():
    saved = kswin_state()
    saved["state"]["window"] = np.zeros(101)
    with pytest.raises(StateError, match="at most 100"):
        river_state.detector_from_state(saved)
    saved = kswin_state()
    saved["state"]["n"] = 3
    with pytest.raises(StateError, match="only 3 were seen"):
        river_state.detector_from_state(saved)


@pytest.mark.parametrize(
    ("name", "mutation"),
    [
        # DDM: an error rate outside [0, 1] would make sqrt(p (1 - p) / n) fail.
        ("DDM", lambda s: s["p"].update(mean=1.5)),
        ("DDM", lambda s: s.update(p_min=None)),
        # EDDM: p2s_prime_max is a divisor.
        ("EDDM", lambda s: s.update(p2s_prime_max=0.0)),
        ("EDDM", lambda s: s["error_distances"].update(S=-1.0)),  # ** 0.5 would be complex
        ("EDDM", lambda s: s.update(n_errors=s["n"] + 1)),
        # HDDM_A: cut points are earlier copies of z (sqrt((z.n - n) / n)).
        ("HDDMA", lambda s: s["x_min"].update(n=s["z"]["n"] + 1)),
        ("HDDMA", lambda s: s["x_max"].update(n=0.0, mean=0.0)),
        ("HDDMA", lambda s: s["z"].update(n=2.5)),
        ("HDDMW", lambda s: s["total"].update(ibc=-0.1)),
        ("HDDMW", lambda s: s["s1_incr"].update(is_init=not s["s1_incr"]["is_init"])),
        ("FHDDM", lambda s: s.update(sliding_window=np.full(99, 0.5))),
        ("FHDDM", lambda s: s.update(sliding_window=np.zeros(100))),
        ("PageHinkley", lambda s: s.update(min_increase=None)),
        ("PageHinkley", lambda s: s["x_mean"].update(mean=math.inf)),
    ],
)
def test_inconsistent_statistics_are_refused(name, mutation):
    saved = river_state.detector_to_state(trained(name, {}, 1500))
    mutation(saved["state"])
    with pytest.raises(StateError):
        river_state.detector_from_state(saved)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("KSWIN", {"window_size": 50, "stat_size": 30}),  # sample() would fail at run time
        ("KSWIN", {"window_size": 10**9}),
        ("KSWIN", {"seed": 2**80}),
        ("PageHinkley", {"mode": "sideways"}),
        ("PageHinkley", {"threshold": math.inf}),
        ("EDDM", {"alpha": 0.5, "beta": 0.9}),
        ("FHDDM", {"confidence_level": 0.0}),
        ("FHDDM", {"sliding_window_size": 10, "short_window_size": 20}),
        ("HDDMA", {"two_sided_test": 1}),
        ("HDDMW", {"lambda_val": 2.0}),
        ("DDM", {"warm_start": 3.0}),
        ("DDM", {"nope": 1}),
    ],
)
def test_bad_parameters_are_refused_from_the_command_line_too(name, params):
    with pytest.raises(ValueError):
        make_detector(name, params)


# Partition metrics ------------------------------------------------------------------------------


def trained_metrics(n=500, rolling_window=40, detector="adwin", keep=10):
    metrics = PartitionMetrics(rolling_window, make_detector(detector), keep_detections=keep)
    rng = random.Random(4)
    for offset, error in enumerate(error_stream(n, 2, jump_every=150)):
        p = rng.random()
        metrics.update(True, not error, p, offset)
    return metrics


def test_metrics_round_trip_and_validate():
    metrics = trained_metrics()
    assert metrics.n_detections > 0
    restored = PartitionMetrics.from_state(round_trip(metrics.to_state()))
    assert restored.summary() == metrics.summary()


@pytest.mark.parametrize(
    "mutation",
    [
        lambda s: s.update(rolling_window=10**12),  # refused before a byte is allocated
        lambda s: s.update(rolling_window=0),
        lambda s: s.update(keep_detections=10**9),
        lambda s: s.update(n_labelled=-1),
        lambda s: s.update(n_correct=s["n_labelled"] + 1),
        lambda s: s.update(n_labelled=s["n_labelled"] + 1),  # window_pos and loss_n disagree
        lambda s: s.update(loss_n=s["loss_n"] + 1),
        lambda s: s.update(loss_mean=math.nan),
        lambda s: s.update(loss_mean=math.inf),
        lambda s: s.update(loss_mean=-0.1),
        lambda s: s.update(window=np.full(40, 2, dtype=np.uint8)),
        lambda s: s.update(window=np.zeros(41, dtype=np.uint8)),
        lambda s: s.update(window=np.zeros(40, dtype=np.int64)),
        lambda s: s.update(window_correct=s["window_correct"] + 1),
        lambda s: s.update(window_pos=40),
        lambda s: s.update(detections=list(range(11))),
        lambda s: s.update(detections=[-1]),
        lambda s: s.update(detections=["1"]),
        lambda s: s.update(detections=[True]),
        lambda s: s.update(n_detections=len(s["detections"]) - 1),
        lambda s: s.update(detector=None),
        lambda s: s.pop("window"),
        lambda s: s.update(extra=1),
    ],
)
def test_hostile_metrics_states_raise_state_error(mutation):
    saved = round_trip(trained_metrics().to_state())
    mutation(saved)
    tracemalloc.start()
    try:
        with pytest.raises(StateError):
            PartitionMetrics.from_state(saved)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_fresh_metrics_window_must_be_zero_past_the_labelled_count():
    saved = round_trip(trained_metrics(n=10).to_state())
    saved["window"][20] = 1
    saved["window_correct"] += 1
    with pytest.raises(StateError):
        PartitionMetrics.from_state(saved)


METRICS_STATE = round_trip(trained_metrics().to_state())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(data=st.data())
def test_mutated_metrics_states_restore_or_raise_state_error(data):
    path = data.draw(st.sampled_from(list(paths(METRICS_STATE))))
    value = data.draw(REPLACEMENTS | st.just(_DELETE))
    hostile = mutate(METRICS_STATE, path, value)
    if hostile is None:
        return
    tracemalloc.start()
    try:
        metrics = PartitionMetrics.from_state(hostile)
    except StateError:
        metrics = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 8 << 20
    if metrics is not None:
        for offset, error in enumerate(error_stream(200, 3), 10_000):
            metrics.update(True, not error, 0.7, offset)
        summary = metrics.summary()
        assert all(
            v is None or math.isfinite(v)
            for v in (summary["accuracy"], summary["rolling_accuracy"], summary["log_loss"])
        )
        PartitionMetrics.from_state(round_trip(metrics.to_state()))


# The old object-graph codec ------------------------------------------------------------------


def old_format_exploit(victim: pathlib.Path) -> dict:
    """The issue's exploit in the old codec's node format: a NoDrift whose `update` attribute is
    `PosixPath(victim).unlink`, reached through `river.drift.datasets:base.pathlib`."""
    path = {
        "__t__": "object", "ref": 1, "class": "river.drift.datasets:base.pathlib.PosixPath",
        "args": [str(victim)], "state": None,
    }
    return {
        "__t__": "object", "ref": 0, "class": "river.drift.no_drift:NoDrift", "args": [],
        "state": {
            "__t__": "dict",
            "k": ["_victim", "update", "_drift_detected"],
            "v": [path, {"__t__": "method", "self": 1, "name": "unlink"}, False],
        },
    }


def test_a_checkpoint_cannot_delete_a_file(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    fields = {"metrics": trained_metrics(n=30).to_state()}
    fields["metrics"]["detector"] = old_format_exploit(victim)
    fields = checkpoint.decode_checkpoint(checkpoint.encode_checkpoint(fields))
    try:
        metrics = PartitionMetrics.from_state(fields["metrics"])
    except StateError:
        metrics = None
    if metrics is not None:  # the old codec restored it: the first labelled record deletes
        metrics.update(True, False, 0.3, 31)
    assert victim.read_text() == "precious"
    assert metrics is None


@pytest.mark.parametrize(
    "node",
    [
        {"__t__": "object", "ref": 0, "class": "river.drift.adwin:ADWIN", "args": [],
         "state": {"__t__": "dict", "k": [], "v": []}},
        {"__t__": "method", "self": 0, "name": "unlink"},
        {"__t__": "ref", "v": 0},
        {"__t__": "Random", "v": {"__t__": "tuple", "v": [3, [0] * 625, None]}},
        {"__t__": "deque", "v": [1.0], "maxlen": 10**12},
    ],
    ids=["object", "method", "ref", "Random", "deque"],
)
def test_old_object_graph_nodes_are_refused(node):
    with pytest.raises(StateError):
        river_state.detector_from_state(node)
    saved = trained_metrics(n=30).to_state()
    saved["detector"] = node
    with pytest.raises(StateError):
        PartitionMetrics.from_state(saved)
    saved = trained_metrics(n=30).to_state()
    saved["detector"]["state"] = node
    with pytest.raises(StateError):
        PartitionMetrics.from_state(saved)


def test_the_generic_codec_is_gone():
    for name in ("object_to_state", "object_from_state", "_Encoder", "_Decoder", "_resolve_class",
                 "_ALLOWED_MODULES"):
        assert not hasattr(checkpoint, name)
