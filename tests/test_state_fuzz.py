"""Untrusted state: `state.loads` and every model's `from_state` raise `StateError` for malformed
input and nothing else, within bounded memory, and a restored model never emits NaN or inf.

Checkpoints come back from a Kafka topic that anyone with write access can fill. The regression
tests reproduce what issue 12 found; the hypothesis tests mutate real states (bytes, header JSON,
shapes, sizes, parameters, array contents) and check the contract.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import streammargin
from streammargin import state
from streammargin.errors import StateError


def raw_state(header: object, body: bytes = b"") -> bytes:
    """Bytes of the state format with any header (JSON text if a str)."""
    text = header if isinstance(header, (str, bytes)) else json.dumps(header)
    text = text.encode() if isinstance(text, str) else text
    return state.MAGIC + struct.pack("<Q", len(text)) + text + body


def header_of(tree: dict | None = None, specs: list | None = None) -> dict:
    return {"format": state.FORMAT_VERSION, "tree": tree or {}, "arrays": specs or []}


def spec(shape, dtype="<f8", offset=0, nbytes=None) -> dict:
    if nbytes is None:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return {"dtype": dtype, "shape": shape, "offset": offset, "nbytes": nbytes}


# state.loads ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(raw_state([1, 2]), id="header-a-list"),
        pytest.param(raw_state("3"), id="header-a-number"),
        pytest.param(raw_state("null"), id="header-null"),
        pytest.param(raw_state('"text"'), id="header-a-string"),
        pytest.param(raw_state("[" * 100_000 + "]" * 100_000), id="deep-nesting-recursion"),
        pytest.param(
            raw_state(header_of(specs=[spec([2**64], nbytes=0)])), id="shape-2**64"
        ),
    ],
)
def test_findings_of_issue_12_in_loads(data):
    """A header that is JSON but not an object (AttributeError), deep nesting (RecursionError),
    a shape of 2**64 (OverflowError): each a StateError now."""
    with pytest.raises(StateError):
        state.loads(data)


def test_nesting_is_bounded_at_64_levels():
    for depth, ok in ((62, True), (63, False), (10_000, False)):
        # {header {tree {"a": [...]}}}: the header and the tree are two levels
        text = json.dumps(header_of({"a": "NEST"})).replace('"NEST"', "[" * depth + "]" * depth)
        if ok:
            assert state.loads(raw_state(text))["a"] is not None
        else:
            with pytest.raises(StateError, match="nested deeper"):
                state.loads(raw_state(text))


ONE_ARRAY = np.arange(6, dtype=np.float64).reshape(2, 3)
GOOD = state.dumps({"x": ONE_ARRAY, "n": [1, {"s": "t"}]})
GOOD_HEADER = json.loads(GOOD[16 : 16 + struct.unpack("<Q", GOOD[8:16])[0]])
GOOD_BODY = GOOD[16 + struct.unpack("<Q", GOOD[8:16])[0] :]


def with_header(**changes) -> bytes:
    header = json.loads(json.dumps(GOOD_HEADER))
    for key, value in changes.items():
        if key.startswith("spec_"):
            header["arrays"][0][key[5:]] = value
        elif value is KeyError:
            del header[key]
        else:
            header[key] = value
    return raw_state(header, GOOD_BODY)


def test_a_good_state_loads():
    loaded = state.loads(GOOD)
    assert loaded["n"] == [1, {"s": "t"}]
    np.testing.assert_array_equal(loaded["x"], ONE_ARRAY)
    assert loaded["x"].flags.writeable and loaded["x"].flags.c_contiguous


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(GOOD[:15], id="shorter-than-the-prefix"),
        pytest.param(b"XXSTATE1" + GOOD[8:], id="bad-magic"),
        pytest.param(GOOD[:8] + struct.pack("<Q", 2**64 - 1) + GOOD[16:], id="header-length-huge"),
        pytest.param(GOOD[:8] + struct.pack("<Q", len(GOOD)) + GOOD[16:], id="header-past-data"),
        pytest.param(GOOD[:-1], id="truncated-body"),
        pytest.param(GOOD + b"\0" * 8, id="extended-body"),
        pytest.param(raw_state(b"\xff\xfe{}"), id="invalid-utf8"),
        pytest.param(raw_state('{"format": 1, "tree": {"a": NaN}, "arrays": []}'), id="NaN"),
        pytest.param(raw_state('{"format": 1, "tree": {"a": 1e999}, "arrays": []}'), id="1e999"),
        pytest.param(raw_state('{"format": 1, "tree": {"a": -Infinity}, "arrays": []}'), id="inf"),
        pytest.param(raw_state('{"format": 1, "tree": {"a": ' + "9" * 5000 + "}, "
                               '"arrays": []}'), id="int-of-5000-digits"),
        pytest.param(raw_state("{"), id="broken-json"),
        pytest.param(with_header(format=True), id="format-true"),
        pytest.param(with_header(format=2), id="format-2"),
        pytest.param(with_header(format="1"), id="format-string"),
        pytest.param(with_header(format=KeyError), id="format-missing"),
        pytest.param(with_header(extra=1), id="extra-key"),
        pytest.param(with_header(tree=[1]), id="tree-a-list"),
        pytest.param(with_header(arrays={"0": 1}), id="arrays-a-dict"),
        pytest.param(with_header(arrays=[1]), id="spec-a-number"),
        pytest.param(with_header(arrays=[{"dtype": "<f8"}]), id="spec-missing-keys"),
        pytest.param(with_header(spec_dtype="object"), id="dtype-object"),
        pytest.param(with_header(spec_dtype="<c16"), id="dtype-complex"),
        pytest.param(with_header(spec_dtype=["<f8"]), id="dtype-a-list"),
        pytest.param(with_header(spec_shape=[2, -3]), id="shape-negative"),
        pytest.param(with_header(spec_shape=[2, 3.0]), id="shape-float"),
        pytest.param(with_header(spec_shape=[True, 6]), id="shape-bool"),
        pytest.param(with_header(spec_shape="23"), id="shape-a-string"),
        pytest.param(with_header(spec_shape=[1] * 40), id="shape-too-many-dims"),
        pytest.param(with_header(spec_shape=[2**62, 0]), id="shape-huge-and-zero"),
        pytest.param(with_header(spec_shape=[2**32, 2**32]), id="shape-product-overflow"),
        pytest.param(with_header(spec_shape=[3, 3]), id="shape-not-matching-nbytes"),
        pytest.param(with_header(spec_offset=-8), id="offset-negative"),
        pytest.param(with_header(spec_offset=8), id="offset-gap"),
        pytest.param(with_header(spec_offset=1.0), id="offset-float"),
        pytest.param(with_header(spec_nbytes=2**70), id="nbytes-huge"),
        pytest.param(with_header(spec_nbytes="48"), id="nbytes-string"),
        pytest.param(with_header(tree={"x": {"__array__": 1}}), id="reference-out-of-range"),
        pytest.param(with_header(tree={"x": {"__array__": -1}}), id="reference-negative"),
        pytest.param(with_header(tree={"x": {"__array__": True}}), id="reference-bool"),
        pytest.param(with_header(tree={"x": {"__array__": 0}, "y": {"__array__": 0}}),
                     id="reference-twice"),
        pytest.param(with_header(tree={"x": 1}), id="array-unreferenced"),
        pytest.param(raw_state(header_of({}, [spec([2], "|b1")]), b"\x00\x02"), id="bool-byte-2"),
        pytest.param(bytearray(b"junk" * 10), id="junk-bytearray"),
        pytest.param("SMSTATE1", id="a-str"),
        pytest.param(None, id="None"),
    ],
)
def test_malformed_bytes_raise_state_error(data):
    with pytest.raises(StateError):
        state.loads(data)


def test_two_arrays_must_follow_each_other_without_overlap():
    data = state.dumps({"a": np.ones(3), "b": np.ones(2, dtype=np.int32), "c": np.zeros(1)})
    header_len = struct.unpack("<Q", data[8:16])[0]
    header = json.loads(data[16 : 16 + header_len])
    body = data[16 + header_len :]
    assert state.loads(raw_state(header, body))["b"].tolist() == [1, 1]
    header["arrays"][1]["offset"] = 0  # overlapping the first array: 1 TB from 1 MB otherwise
    with pytest.raises(StateError, match="layout"):
        state.loads(raw_state(header, body))


def test_loads_takes_memoryview_and_bytearray():
    assert state.loads(memoryview(GOOD))["n"] == [1, {"s": "t"}]
    assert state.loads(bytearray(GOOD))["n"] == [1, {"s": "t"}]


def test_encoded_names_round_trip_and_nothing_else_decodes():
    for name in ["a", 1, -2**70, 1.5, True, None, ("a", (1, (2.0, None))), ()]:
        encoded = json.loads(json.dumps(state.encode_name(name)))
        assert state.decode_name(encoded) == name
        assert type(state.decode_name(encoded)) is type(name)
    deep: object = "x"
    for _ in range(state.MAX_NAME_DEPTH):
        deep = (deep,)
    assert state.decode_name(state.encode_name(deep)) == deep
    with pytest.raises(TypeError):
        state.encode_name((deep,))
    with pytest.raises(TypeError):
        state.encode_name(float("nan"))
    too_deep = {"tuple": ["x"]}
    for _ in range(100):
        too_deep = {"tuple": [too_deep]}
    for bad in (
        too_deep,
        {"int": 1.0},
        {"int": True},
        {"float": 1},
        {"float": "1.5"},
        {"bool": 1},
        {"none": 0},
        {"tuple": "ab"},
        {"str": "a"},
        {"int": 1, "float": 1.0},
        [1],
        1,
        None,
    ):
        with pytest.raises(StateError):
            state.decode_name(bad)


def test_from_state_of_something_that_is_not_a_model_state():
    for bad in (None, [], {"model": ["list"]}, {"model": None}, {"model": "NoSuchModel"}, "x"):
        with pytest.raises(StateError):
            streammargin.from_state(bad)


# Model states: structure ------------------------------------------------------------------------

MODEL_CLASSES = sorted(state.registered_models().values(), key=lambda cls: cls.__name__)
CASES = [
    pytest.param(cls, params, id=f"{cls.__name__}-{i}")
    for cls in MODEL_CLASSES
    for i, params in enumerate(cls._unit_test_params())
]
_TRAINED: dict[tuple, bytes] = {}


def random_record(rng: np.random.Generator, names: list) -> dict:
    keys = rng.choice(len(names), size=int(rng.integers(1, len(names) + 1)), replace=False)
    return {names[k]: float(rng.normal()) for k in keys}


def trained_bytes(cls, params, n=60, seed=0) -> bytes:
    """The state bytes of a model trained on a short random stream (cached)."""
    key = (cls.__name__, json.dumps(params, sort_keys=True), n, seed)
    if key not in _TRAINED:
        model = cls(**params)
        rng = np.random.default_rng(seed)
        names = ["a", "b", "c", 7, ("t", 1)]
        for _ in range(n):
            x = random_record(rng, names)
            label = ["u", "v", "w"][int(rng.integers(3))] if model._multiclass else bool(
                rng.random() < 0.5
            )
            model.learn_one(x, label)
        _TRAINED[key] = state.dumps(model.to_state())
    return _TRAINED[key]


def loaded(cls, params) -> dict:
    return state.loads(trained_bytes(cls, params))


def structural_mutations(good: dict, cls) -> list[tuple[str, dict]]:
    """(what, state) pairs, each a malformed variant of a real state."""
    out = []

    def variant(what, change):
        bad = state.loads(state.dumps(good))
        change(bad)
        out.append((what, bad))

    variant("model key missing", lambda s: s.pop("model"))
    variant("extra key", lambda s: s.update(extra=1))
    variant("params a list", lambda s: s.update(params=[1]))
    variant("features None", lambda s: s.update(features=None))
    variant("arrays a list", lambda s: s.update(arrays=[1]))
    variant("values a list", lambda s: s.update(values=[]))
    variant("unknown param", lambda s: s["params"].update(no_such_param=1))
    variant("param a list", lambda s: s["params"].update({next(iter(s["params"])): [1]}))
    variant("param a dict", lambda s: s["params"].update({next(iter(s["params"])): {"a": 1}}))
    for name, value in good["params"].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            variant(f"param {name} = -1e300", lambda s, n=name: s["params"].update({n: -1e300}))
            variant(f"param {name} = True", lambda s, n=name: s["params"].update({n: True}))
        elif isinstance(value, str):
            variant(f"param {name} = 'nope'", lambda s, n=name: s["params"].update({n: "nope"}))
    variant("features key missing", lambda s: s["features"].pop("names"))
    variant("first column 5", lambda s: s["features"].update(first_column=5))
    variant("first column True", lambda s: s["features"].update(first_column=True))
    variant("names a dict", lambda s: s["features"].update(names={"a": 1}))
    variant("name twice", lambda s: s["features"].update(names=["a", "a"]))
    variant("a bad name", lambda s: s["features"].update(names=[{"int": 1.5}]))
    variant("many names", lambda s: s["features"]["names"].extend(str(i) for i in range(1000)))
    variant("values extra", lambda s: s["values"].update(extra=1))
    for name, array in good["arrays"].items():
        variant(f"{name} missing", lambda s, n=name: s["arrays"].pop(n))
        variant(f"{name} a list", lambda s, n=name: s["arrays"].update(
            {n: s["arrays"][n].tolist()}))
        variant(f"{name} float32", lambda s, n=name: s["arrays"].update(
            {n: s["arrays"][n].astype(np.float32)}))
        variant(f"{name} int64", lambda s, n=name: s["arrays"].update(
            {n: s["arrays"][n].astype(np.int64)}))
        variant(f"{name} one more dim", lambda s, n=name: s["arrays"].update(
            {n: s["arrays"][n][..., None]}))
        variant(f"{name} one more row", lambda s, n=name: s["arrays"].update(
            {n: np.concatenate([s["arrays"][n], s["arrays"][n][:1]]) if s["arrays"][n].size
             else np.zeros((1,) + s["arrays"][n].shape[1:])}))
        if array.ndim == 2 and array.shape[1] > 0:
            variant(f"{name} one column less", lambda s, n=name: s["arrays"].update(
                {n: np.ascontiguousarray(s["arrays"][n][:, 1:])}))
        if array.ndim == 2 and array.shape[0] > 0:
            variant(f"{name} one row less", lambda s, n=name: s["arrays"].update(
                {n: np.ascontiguousarray(s["arrays"][n][1:])}))
        if array.size == 0 and array.ndim == 2:  # an empty array: its capacity holds no bytes
            variant(f"{name} empty with a huge capacity", lambda s, n=name: s["arrays"].update(
                {n: np.zeros((0, 2**40) if s["arrays"][n].shape[0] == 0 else (2**40, 0))}))
    return out


def restore_or_refuse(data_or_state) -> object | None:
    """`from_state(loads(data))`: the model, or None for a StateError; anything else escapes."""
    try:
        if isinstance(data_or_state, (bytes, bytearray)):
            data_or_state = state.loads(data_or_state)
        return streammargin.from_state(data_or_state)
    except StateError:
        return None


def exercise(model, rng: np.random.Generator, n: int = 50) -> None:
    """A restored model serves and learns: predictions and probabilities are finite (in
    [0, 1]), nothing but InvalidInput is raised, and its state dumps again."""
    names = ["a", "b", "c", 7, ("t", 1), "new", ("new", 2)]
    for i in range(n):
        scale = 10.0 ** rng.uniform(-300, 300)
        chosen = rng.permutation(len(names))[: 1 + i % len(names)]
        x = {names[k]: float(rng.normal()) * scale for k in chosen}
        score = model.decision_one(x)
        scores = score.values() if isinstance(score, dict) else [score]
        assert all(np.isfinite(v) for v in scores), score
        proba = model.predict_proba_one(x)
        assert all(np.isfinite(p) and 0.0 <= p <= 1.0 for p in proba.values()), proba
        model.predict_one(x)
        label = ["u", "v", "w"][i % 3] if model._multiclass else bool(rng.random() < 0.5)
        model.learn_one(x, label)
    data = state.dumps(model.to_state())
    arrays = state.loads(data)["arrays"]
    assert all(np.isfinite(a).all() for a in arrays.values())


@pytest.mark.parametrize(("cls", "params"), CASES)
def test_malformed_model_states_raise_state_error(cls, params):
    good = loaded(cls, params)
    exercise(streammargin.from_state(good), np.random.default_rng(0), n=5)
    for what, bad in structural_mutations(good, cls):
        try:
            model = restore_or_refuse(bad)
            if model is not None:  # a variant that stays valid (a param moved within its range)
                exercise(model, np.random.default_rng(1), n=5)
        except Exception as error:  # the contract: StateError or a working model, nothing else
            raise AssertionError(f"{what}: {type(error).__name__}: {error}") from error


@pytest.mark.parametrize(
    ("cls", "changes"),
    [
        (streammargin.BudgetPerceptron, {"budget": 10**12}),
        (streammargin.BudgetSVMClassifier, {"budget": 10**12}),
        (streammargin.MPUClassifier, {"budget": 10**12}),
        (streammargin.KernelALMAClassifier, {"budget": 10**12}),
        (streammargin.SBPClassifier, {"window": 10**12}),
        (streammargin.ConvexPolytopeClassifier, {"window": 10**12}),
        (streammargin.ConvexPolytopeClassifier, {"n_faces": 10**9}),
        (streammargin.MPUClassifier, {"budget": 10_000, "kernel": "rbf"}),
        (streammargin.SBPClassifier, {"window": 10_000}),
        (streammargin.BudgetPerceptron, {"budget": 10_000, "eviction": "project"}),
    ],
)
def test_huge_sizes_in_a_state_are_refused_before_allocation(cls, changes):
    """`from_state` with budget=10**12 allocated before it validated (MemoryError). Sizes beyond
    the bounds are refused by the constructor's validation; sizes within them whose arrays are
    not in the state are refused by the shape checks, before `_reset` allocates."""
    import tracemalloc

    good = state.loads(state.dumps(cls().to_state()))
    good["params"].update(changes)
    data = state.dumps(good)
    tracemalloc.start()
    try:
        with pytest.raises(StateError):
            streammargin.from_state(state.loads(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(data) + 2**20
