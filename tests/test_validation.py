"""Every constructor parameter of every registered model is validated in `__init__`: a bad value
raises a `ValueError` that names the parameter, before anything is allocated."""

from __future__ import annotations

import functools
import inspect
import math
import re

import numpy as np
import pytest

import streammargin
from streammargin import state, validation
from streammargin.features import FeatureSpace

# Models with a numeric core; wrappers (OneVsRestClassifier) take a model and are checked below,
# and so is MPUClassifier, the public name of the two MPU classes (`_forms`).
MODEL_CLASSES = sorted(
    (
        cls
        for cls in state.registered_models().values()
        if not hasattr(cls, "_wrapped_model") and not hasattr(cls, "_forms")
    ),
    key=lambda cls: cls.__name__,
)

# Parameters that take a value a generic rule would call bad.
ALLOWS_NEGATIVE = {"coef0"}
ALLOWS_ZERO = {"coef0", "nu", "replay", "projection_threshold", "entropy", "seed", "margin"}

NOT_NUMBERS = [
    float("nan"), "1", b"1", [1.0], {"a": 1.0}, complex(1, 0), True, False, np.bool_(True)
]


def _kind(cls: type, name: str, parameter: inspect.Parameter) -> str:
    """'int', 'float', 'bool' or 'str' from the parameter's annotation (None aside)."""
    annotation = str(parameter.annotation)
    for kind in ("bool", "int", "float", "str"):
        if re.search(rf"\b{kind}\b", annotation):
            return kind
    raise AssertionError(f"{cls.__name__}.{name} has no recognisable annotation {annotation!r}")


def bad_values(name: str, kind: str) -> list:
    if kind == "bool":
        return [1, 0, "True", None, float("nan"), np.float64(1.0)]
    if kind == "str":
        return ["no-such-choice", "", True, 1, float("nan"), b"rbf"]
    values = list(NOT_NUMBERS) + [float("inf"), -float("inf"), 10**400]
    if name not in ALLOWS_NEGATIVE:
        values += [-1, -1.5, -1e-300]
    if name not in ALLOWS_ZERO | ALLOWS_NEGATIVE:
        values += [0, 0.0]
    if kind == "int":
        values += [3.0, 2**64, np.float64(2.0)] + ([] if name == "seed" else [10**12])
    else:
        values += [1e308]
    return values


# Every public name a model is built by: the model classes and MPUClassifier, which builds one of
# its two forms.
PUBLIC_CLASSES = [*MODEL_CLASSES, streammargin.MPUClassifier]
CASES = [
    pytest.param(cls, name, value, id=f"{cls.__name__}-{name}-{value!r:.20}")
    for cls in PUBLIC_CLASSES
    for name, parameter in inspect.signature(cls).parameters.items()
    for value in bad_values(name, _kind(cls, name, parameter))
]


@pytest.mark.parametrize(("cls", "name", "value"), CASES)
def test_a_bad_parameter_raises_a_value_error_naming_it(cls, name, value):
    with pytest.raises(ValueError, match=rf"\b{name}\b") as raised:
        cls(**{name: value})
    message = str(raised.value)
    assert "\n" not in message and len(message) < 300


@pytest.mark.parametrize("cls", PUBLIC_CLASSES, ids=lambda cls: cls.__name__)
def test_the_defaults_and_unit_test_params_are_valid_and_clone(cls):
    for params in [{}, *cls._unit_test_params()]:
        model = cls(**params)
        assert model.clone()._get_params() == model._get_params()


@pytest.mark.parametrize(
    ("cls", "params"),
    [
        (streammargin.BudgetPerceptron, {"budget": 10**12}),
        (streammargin.BudgetPerceptron, {"budget": 10_001, "eviction": "project"}),
        (streammargin.KernelALMAClassifier, {"budget": 100_001}),
        (streammargin.BudgetSVMClassifier, {"budget": 10_001}),
        (streammargin.MPUClassifier, {"budget": 10_001, "kernel": "rbf"}),
        (streammargin.MPUClassifier, {"budget": 100_001}),
        (streammargin.SBPClassifier, {"window": 10_001}),
        (streammargin.SBPClassifier, {"window": 10**12}),
        (streammargin.ConvexPolytopeClassifier, {"window": 100_001}),
        (streammargin.ConvexPolytopeClassifier, {"n_faces": 10**9}),
        (streammargin.ALMAClassifier, {"average_window": 10**12}),
        *[(cls, {"max_features": 2**30 + 1}) for cls in MODEL_CLASSES],
        (streammargin.ConvexPolytopeClassifier, {"max_classes": 100_001}),
        (streammargin.ConvexPolytopeClassifier, {"max_classes": 1}),
    ],
)
def test_sizes_have_upper_bounds(cls, params):
    """No valid parameter set allocates absurd memory: budgets with a budget x budget matrix stop
    at 10,000 (800 MB), the others at 100,000; max_features at 2**30 (the feature space's
    MAX_MAX_FEATURES), max_classes in [2, 100,000]. (What a restored state may allocate is bounded
    further by `streammargin.memory`.)"""
    (name,) = [n for n in params if n not in ("eviction", "kernel")]
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        cls(**params)


def test_the_findings_of_issue_12():
    """ALMA accepted infinite B and C and a bool alpha; the kernel models refused an infinite B."""
    for params in ({"B": math.inf}, {"C": math.inf}, {"alpha": True}):
        for cls in (streammargin.ALMAClassifier, streammargin.KernelALMAClassifier):
            with pytest.raises(ValueError, match=next(iter(params))):
                cls(**params)


def test_alma_c_below_1e_100_is_refused():
    """With C = 1e-300 the weights are of that scale, and the renormalisation that keeps S in
    range moved it into SCALE: 1e-300, below what a restore accepts (1e-200), so every checkpoint
    of such a model was refused. C in [1e-100, 1e6] keeps SCALE above 1e-130."""
    for C in (1e-300, 1e-101):
        with pytest.raises(ValueError, match=r"\bC\b"):
            streammargin.ALMAClassifier(C=C)
    model = streammargin.ALMAClassifier(C=1e-100)
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = {"a": float(rng.normal()), "b": float(rng.normal())}
        model.learn_one(x, x["a"] > 0)
    streammargin.from_state(state.loads(state.dumps(model.to_state())))


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda cls: cls.__name__)
def test_validation_happens_before_anything_is_allocated(cls, monkeypatch):
    """`_reset` allocates the learnt state; a bad parameter never reaches it."""
    calls = []
    monkeypatch.setattr(cls, "_reset", lambda self: calls.append(self))
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name != "self":
            with pytest.raises(ValueError, match=rf"\b{name}\b"):
                cls(**{name: float("nan")})
    assert calls == []
    cls()
    assert len(calls) == 1


def test_validators():
    assert validation.integer_in("n", np.int64(3), 1, 5) == 3
    assert validation.real_in("x", np.float32(0.5), 0.0, 1.0) == np.float32(0.5)
    assert validation.optional(validation.positive_real, "B", None) is None
    message = r"^B must be None or a number in \(0\.0, 1e\+300\], got -1"
    with pytest.raises(ValueError, match=message):
        validation.optional(validation.positive_real, "B", -1)
    with pytest.raises(ValueError, match=r"^kernel must be one of \['a', 'b'\], got 'c'$"):
        validation.one_of("kernel", "c", ("a", "b"))
    with pytest.raises(ValueError, match="must be one of"):
        validation.one_of("flag", 1, (True, False))
    with pytest.raises(ValueError, match=r"^average must be True or False, got 1$"):
        validation.boolean("average", 1)
    with pytest.raises(ValueError, match="got 'xxxxx") as raised:
        validation.integer_in("n", "x" * 10_000, 1, 5)
    assert len(str(raised.value)) < 200  # values may come from a checkpoint: cut


def test_max_features_is_validated_like_every_parameter():
    """The bounded feature space's param goes through `streammargin.validation` in every model
    (and in FeatureSpace itself): one message, numpy integers accepted and stored as int."""
    message = r"^max_features must be an integer in \[1, 1073741824\], got np\.float64\(8\.0\)$"
    for cls in MODEL_CLASSES:
        with pytest.raises(ValueError, match=message):
            cls(max_features=np.float64(8.0))
        model = cls(max_features=np.int64(16))
        assert type(model.max_features) is int and model.max_features == 16
    with pytest.raises(ValueError, match=r"^max_features must be an integer"):
        FeatureSpace(0, max_features=True)


@pytest.mark.parametrize(
    "classifier",
    [None, "alma", streammargin.ALMAClassifier, streammargin.ConvexPolytopeClassifier(),
     streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())],
    ids=repr,
)
def test_one_vs_rest_takes_an_instance_of_a_binary_streammargin_model_only(classifier):
    from river import linear_model

    for bad in (classifier, linear_model.LogisticRegression()):
        with pytest.raises(ValueError, match=r"\bclassifier\b|multiclass already"):
            streammargin.OneVsRestClassifier(bad)


def test_one_vs_rest_max_classes_is_validated_like_every_parameter():
    model = streammargin.ALMAClassifier()
    for bad in (1, 10_001, True, 3.0, float("nan"), "7", None):
        with pytest.raises(ValueError, match=r"^max_classes must be an integer in \[2, 10000\]"):
            streammargin.OneVsRestClassifier(model, max_classes=bad)
    assert streammargin.OneVsRestClassifier(model, max_classes=np.int64(7)).max_classes == 7


def test_auto_or():
    assert validation.auto_or(validation.positive_real, "gamma", "auto") == "auto"
    assert validation.auto_or(validation.positive_real, "gamma", 0.5) == 0.5
    for bad in ("scale", "AUTO", "", b"auto", True, 0, float("nan")):
        with pytest.raises(ValueError, match=r"^gamma must be 'auto' or a number in \(0\.0, "):
            validation.auto_or(validation.positive_real, "gamma", bad)
    optional_positive = functools.partial(validation.optional, validation.positive_real)
    assert validation.auto_or(optional_positive, "C", None) is None
    with pytest.raises(ValueError, match=r"^C must be 'auto' or None or a number in \(0\.0, "):
        validation.auto_or(optional_positive, "C", -1.0)


# Every parameter whose default is "auto", by public name.
AUTO_PARAMS = [
    pytest.param(cls, name, id=f"{cls.__name__}-{name}")
    for cls in PUBLIC_CLASSES
    for name, parameter in inspect.signature(cls).parameters.items()
    if parameter.default == "auto"
]


def test_the_auto_params_are_the_kernel_widths_and_the_mpus_penalty():
    names = {(param.values[0].__name__, param.values[1]) for param in AUTO_PARAMS}
    kernel_models = {"BudgetPerceptron", "KernelALMAClassifier", "BudgetSVMClassifier",
                     "SBPClassifier", "KernelMPUClassifier", "MPUClassifier"}
    assert {(name, "gamma") for name in kernel_models} <= names
    assert {("LinearMPUClassifier", "C"), ("KernelMPUClassifier", "C"),
            ("MPUClassifier", "C")} <= names
    assert {name for _, name in names} == {"gamma", "C"}


@pytest.mark.parametrize(("cls", "name"), AUTO_PARAMS)
def test_auto_goes_through_validation_and_no_other_string_does(cls, name):
    """"auto" is taken by `validation.auto_or`: the same rule and message in every model."""
    model = cls(**{name: "auto"})  # (MPUClassifier's linear form takes no gamma: ignored)
    assert getattr(model, name, "auto") == "auto"
    for bad in ("scale", "Auto", "", "1.0"):
        with pytest.raises(ValueError, match=rf"^{name} must be 'auto' or "):
            cls(**{name: bad})
