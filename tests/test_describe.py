"""Named state layouts (`streammargin.jit.layout`) and `streammargin.describe_state`.

Every registered model, fresh, trained and restored: its layout names every entry of its state
array `st` exactly once, the hyper-parameter slots hold what its params say, and the arrays are
listed with their shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

import streammargin
from streammargin import state
from streammargin.describe import KIND_KEYS
from streammargin.jit import convex_polytope as cpm_jit
from streammargin.jit.layout import CALIBRATION, COUNTER, HYPER, LEARNT, Layout, Slot

MODEL_CLASSES = sorted(
    (
        cls
        for cls in state.registered_models().values()
        if not hasattr(cls, "_forms")
        and cls not in (streammargin.OneVsRestClassifier, streammargin.AutoClassifier)
    ),
    key=lambda cls: cls.__name__,
)
CASES = [
    pytest.param(cls, params, id=f"{cls.__name__}-{i}")
    for cls in MODEL_CLASSES
    for i, params in enumerate(cls._unit_test_params())
]


def trained(model, n=120, seed=3):
    """`model` after a stream that makes it learn (corrections, evictions, new classes)."""
    rng = np.random.default_rng(seed)
    multiclass = getattr(model, "_multiclass", False)
    for t in range(n):
        x = {f"f{j}": float(rng.normal()) for j in range(5) if rng.random() < 0.8}
        x[f"id{t % 7}"] = 1.0
        total = sum(x.values())
        if multiclass:
            y = "a" if total > 1.5 else "b" if total > 0 else "c"
        else:
            y = bool(total > 1.0)
        model.predict_proba_one(x)
        model.learn_one(x, y)
    return model


def restored(model):
    return streammargin.from_state(state.loads(state.dumps(model.to_state())))


def models_of(cls, params):
    fresh = cls(**params)
    learnt = trained(cls(**params))
    return {"fresh": fresh, "trained": learnt, "restored": restored(learnt)}


def param_value(slot: Slot, value):
    """The number numba sees for a param's value."""
    if slot.codes is not None:
        return float(slot.codes[value])
    return float(value)


@pytest.mark.parametrize("cls, params", CASES)
def test_describe_state_names_every_entry_of_st_once(cls, params):
    for when, model in models_of(cls, params).items():
        described = streammargin.describe_state(model)
        st = model._st
        covered = np.zeros(len(st), dtype=int)
        for name, slot in described["slots"].items():
            assert slot["size"] >= 1, (when, name)
            covered[slot["offset"] : slot["offset"] + slot["size"]] += 1
        assert covered.tolist() == [1] * len(st), (when, "entries named zero or several times")
        # every slot is read under exactly one kind, with the value st holds at its offset
        read = {}
        for key in KIND_KEYS.values():
            for name, value in described[key].items():
                assert name not in read, (when, name)
                read[name] = value
        assert read.keys() == described["slots"].keys()
        for name, slot in described["slots"].items():
            value = read[name]
            entries = st[slot["offset"] : slot["offset"] + slot["size"]].tolist()
            if isinstance(value, dict):
                value = list(value.values())
            assert (value if isinstance(value, list) else [value]) == entries, (when, name)
        assert described["model"] == cls.__name__
        assert described["arrays"] == {
            name: {"shape": getattr(model, name).shape, "dtype": "float64"}
            for name in model._state_arrays
        }


@pytest.mark.parametrize("cls, params", CASES)
def test_hyper_slots_hold_the_params(cls, params):
    models = models_of(cls, params)
    reference = streammargin.describe_state(cls(**models["fresh"]._get_params()))["hyper"]
    layout = models["fresh"]._state_layout()
    checked = 0
    for when, model in models.items():
        hyper = streammargin.describe_state(model)["hyper"]
        assert hyper.keys() == reference.keys()
        for name, value in hyper.items():
            slot = layout.slot(name)
            if slot.param and getattr(model, slot.param, None) == "auto":
                # a width estimated from the data: 0 until the estimate, then the one in use
                assert value in (0.0, model.gamma_), (when, name)
                continue
            if name != "rng_key" or model.seed is not None:  # None: a fresh key per model
                assert value == reference[name], (when, name, "not the params' value")
            given = getattr(model, slot.param, None) if slot.param else None
            if given is not None:
                assert value == param_value(slot, given), (when, name, slot.param)
                checked += 1
        for counter in streammargin.describe_state(model)["counters"].values():
            assert counter == int(counter) >= 0, (when, "counters are whole numbers")
    assert checked > 0, "no slot holds a param as it is"


def test_describe_state_of_auto_describes_each_member_and_a_dropped_one_as_none():
    model = streammargin.AutoClassifier(max_features=64, max_ovr_classes=2)
    for x, y in [({"a": 1.0}, "x"), ({"a": -1.0}, "y"), ({"b": 1.0}, "z"), ({"b": -1.0}, "x")]:
        model.learn_one(x, y)
    described = streammargin.describe_state(model)
    assert described["model"] == "AutoClassifier"
    members = described["members"]
    assert members["ConvexPolytopeClassifier"] == streammargin.describe_state(
        model.members["ConvexPolytopeClassifier"]
    )
    assert members["ALMAClassifier"] is None and members["BudgetSVMClassifier"] is None  # 3 > 2
    with pytest.raises(TypeError, match="no state layout"):
        streammargin.describe_state(object())


def test_describe_state_of_a_wrapper_describes_each_member():
    model = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier())
    for x, y in [({"a": 1.0}, "x"), ({"a": -1.0}, "y"), ({"b": 1.0}, "x")]:
        model.learn_one(x, y)
    described = streammargin.describe_state(model)
    assert described["classes"] == ["x", "y"]
    assert described["members"]["y"] == streammargin.describe_state(model.classifiers["y"])
    assert described["members"]["x"]["counters"]["trials"] == 3.0


def test_describe_state_applies_almas_deferred_trial():
    model = streammargin.ALMAClassifier()
    model.learn_one({"a": 1.0}, True)  # left pending until the next read
    assert streammargin.describe_state(model)["counters"]["trials"] == 1.0


def test_cpm_layout_grows_with_its_classes():
    model = streammargin.ConvexPolytopeClassifier(n_faces=2)
    assert model._state_layout().size == cpm_jit.CLASSES
    trained(model)
    described = streammargin.describe_state(model)
    assert sorted(name for name in described["learnt"] if name.startswith("counts")) == [
        "counts[0]",
        "counts[1]",
        "counts[2]",
    ]
    assert described["slots"]["platt[2]"]["offset"] == len(model._st) - 9


def test_layout_refuses_what_would_make_offsets_ambiguous():
    with pytest.raises(ValueError, match="named twice"):
        Layout("t", Slot("a", LEARNT), Slot("a", COUNTER))
    with pytest.raises(ValueError, match="unknown kind"):
        Layout("t", Slot("a", "weights"))
    with pytest.raises(ValueError, match="size 0"):
        Layout("t", Slot("a", LEARNT, size=0))
    parts = Layout("p", Slot("x", CALIBRATION), Slot("y", CALIBRATION))
    with pytest.raises(ValueError, match="parts"):
        Layout("t", Slot("c", CALIBRATION, size=3, parts=parts))
    layout = Layout("t", Slot("h", HYPER), Slot("c", CALIBRATION, size=2, parts=parts))
    assert layout.read([1.0, 2.0, 3.0]) == {"h": 1.0, "c": {"x": 2.0, "y": 3.0}}
    with pytest.raises(ValueError, match="2 entries, the layout has 3"):
        layout.read([1.0, 2.0])
