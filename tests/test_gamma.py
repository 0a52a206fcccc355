"""The data-driven kernel width, gamma="auto" (streammargin/support.py).

The width is estimated from the first records (2 / the sum of the features' variances) at records
1, 2, 4, ..., 64, the model relearning the records so far whenever it moves, then frozen. These
tests work the estimate by hand, check that the relearnt model is exactly the model a numeric
width would have learnt, that numbers are still taken as they were, and that a saved warm-up is
checked like any other state.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import streammargin
from streammargin import state, support
from streammargin.errors import StateError
from streammargin.jit import kernels as kjit

AUTO_MODELS = [
    pytest.param(streammargin.BudgetPerceptron, {"eviction": "oldest"}, id="BudgetPerceptron"),
    pytest.param(streammargin.BudgetPerceptron, {"eviction": "project"}, id="Projectron"),
    pytest.param(streammargin.KernelALMAClassifier, {"eviction": "merge"}, id="KernelALMA"),
    pytest.param(streammargin.BudgetSVMClassifier, {}, id="BudgetSVM"),
    pytest.param(streammargin.MPUClassifier, {"kernel": "rbf", "C": 1.0}, id="MPU-rbf"),
    pytest.param(streammargin.MPUClassifier, {"kernel": "poly", "C": 1.0}, id="MPU-poly"),
    pytest.param(streammargin.SBPClassifier, {"window": 50}, id="SBP"),
]


def stream(n, seed=0, d=3):
    """Records with the same keys in the same order and no zero values (so that a record learnt
    from its dict and from its dense row add up the same terms in the same order)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        v = rng.normal(size=d) * [1.0, 3.0, 0.5][:d] + 0.01
        out.append(({f"f{j}": float(v[j]) for j in range(d)}, bool(v[0] * v[1] > 0)))
    return out


def test_the_estimate_worked_by_hand():
    # column 0 holds 0 and 2 (variance 1), column 1 is constant: gamma = 2 / 1
    assert support.estimate_gamma(np.array([[0.0, 5.0], [2.0, 5.0]])) == 2.0
    # variances 1 and 4 (population): gamma = 2 / 5
    rows = np.array([[1.0, 0.0], [3.0, 4.0]])
    assert support.estimate_gamma(rows) == pytest.approx(2.0 / 5.0, rel=1e-15)
    # three records: column variance ((1 - 2)^2 + 0 + (3 - 2)^2) / 3 = 2/3
    assert support.estimate_gamma(np.array([[1.0], [2.0], [3.0]])) == pytest.approx(3.0)


def test_the_estimate_before_any_variance_is_the_start_value():
    assert support.estimate_gamma(np.zeros((0, 3))) == support.AUTO_GAMMA_START
    assert support.estimate_gamma(np.array([[4.0, 1.0]])) == support.AUTO_GAMMA_START
    assert support.estimate_gamma(np.zeros((5, 2))) == support.AUTO_GAMMA_START
    assert support.estimate_gamma(np.ones((5, 2))) == support.AUTO_GAMMA_START


@pytest.mark.parametrize("scale", [1e-300, 1e-150, 1e150, 1e300])
def test_the_estimate_is_finite_and_bounded_for_any_finite_values(scale):
    rows = np.array([[0.0, 1.0], [2.0, -1.0], [1.0, 0.5]]) * scale
    gamma = support.estimate_gamma(rows)
    assert support.MIN_GAMMA <= gamma <= support.MAX_GAMMA
    log_expected = np.log(support.estimate_gamma(rows / scale)) - 2 * np.log(scale)
    if np.log(support.MIN_GAMMA) < log_expected < np.log(support.MAX_GAMMA):
        assert np.log(gamma) == pytest.approx(log_expected, rel=1e-12)
    else:
        assert gamma in (support.MIN_GAMMA, support.MAX_GAMMA)


@pytest.mark.parametrize(("cls", "params"), AUTO_MODELS)
def test_after_the_warm_up_the_model_is_the_one_its_width_would_have_learnt(cls, params):
    """The width moved at records 1, 2, ..., 64 and every time the model relearnt the records
    so far: its cached quantities (margins, Gram matrices, inverses, gradients, responses) are
    exactly those of a model that had the final width from the start."""
    data = stream(100)
    auto = cls(gamma="auto", **params)
    for x, y in data[: support.AUTO_GAMMA_RECORDS]:
        auto.predict_one(x)
        auto.learn_one(x, y)
    rows = np.array([[x[k] for k in x] for x, _ in data[: support.AUTO_GAMMA_RECORDS]])
    assert auto.gamma_ == support.estimate_gamma(rows)
    assert auto._warmup_x.shape == (0, 0)  # frozen: the rows are freed
    fixed = cls(gamma=auto.gamma_, **params)
    for x, y in data[: support.AUTO_GAMMA_RECORDS]:
        fixed.learn_one(x, y)
    for name in fixed._state_arrays:
        np.testing.assert_array_equal(getattr(auto, name), getattr(fixed, name), err_msg=name)
    for x, y in data[support.AUTO_GAMMA_RECORDS :]:
        assert auto.predict_proba_one(x) == fixed.predict_proba_one(x)
        auto.learn_one(x, y)
        fixed.learn_one(x, y)
    assert auto.gamma_ == fixed.gamma == fixed.gamma_


@pytest.mark.parametrize(("cls", "params"), AUTO_MODELS)
def test_during_the_warm_up_the_width_is_the_estimate_from_the_last_power_of_two(cls, params):
    data = stream(40, seed=1)
    model = cls(gamma="auto", **params)
    assert model.gamma_ == support.AUTO_GAMMA_START
    rows = np.array([[x[k] for k in x] for x, _ in data])
    for n, (x, y) in enumerate(data, start=1):
        model.learn_one(x, y)
        p = 1 << (n.bit_length() - 1)
        assert model.gamma_ == support.estimate_gamma(rows[:p])
        assert model.n_trials == n


def test_numbers_are_still_taken_as_they_are_and_save_no_warm_up():
    for cls, params in [(streammargin.BudgetPerceptron, {}), (streammargin.SBPClassifier, {}),
                        (streammargin.MPUClassifier, {"kernel": "rbf"})]:
        model = cls(gamma=0.25, **params)
        for x, y in stream(80):
            model.learn_one(x, y)
        assert model.gamma_ == 0.25 == model._st[kjit.ST_KP + kjit.GAMMA]
        saved = model.to_state()
        assert "_warmup_x" not in saved["arrays"] and "_warmup_y" not in saved["arrays"]
        twin = streammargin.from_state(state.loads(state.dumps(saved)))
        assert twin.gamma_ == 0.25


def test_kernels_without_a_width_have_no_warm_up():
    model = streammargin.BudgetPerceptron(gamma="auto", kernel="linear", eviction="oldest")
    assert not model._estimates_gamma and model._warmup_y.shape == (0,)
    assert "_warmup_x" not in model.to_state()["arrays"]
    # The MPU's primal form has no kernel at all: gamma="auto" is validated, then ignored.
    linear = streammargin.MPUClassifier(gamma="auto", kernel=None)
    assert isinstance(linear, streammargin.LinearMPUClassifier)
    assert "_warmup_x" not in linear.to_state()["arrays"]


@pytest.mark.parametrize("bad", ["scale", "AUTO", "", True, 0, -1.0, float("nan"), None])
def test_gamma_is_a_positive_number_or_auto(bad):
    with pytest.raises(ValueError, match="gamma"):
        streammargin.BudgetSVMClassifier(gamma=bad)


def test_learn_many_across_the_end_of_the_warm_up_equals_learn_one():
    data = stream(150, seed=2)
    one, many = (streammargin.KernelALMAClassifier(gamma="auto") for _ in range(2))
    for x, y in data:
        one.learn_one(x, y)
    for start in range(0, len(data), 50):  # 50, then 14 of the warm-up and 36 after it
        part = data[start : start + 50]
        many.learn_many(pd.DataFrame([x for x, _ in part]), pd.Series([y for _, y in part]))
    assert many.gamma_ == one.gamma_
    for x, _ in stream(20, seed=3):
        assert many.decision_one(x) == pytest.approx(one.decision_one(x), rel=1e-12)


def test_a_refused_frame_during_the_warm_up_changes_nothing():
    model = streammargin.BudgetPerceptron(gamma="auto")
    for x, y in stream(10):
        model.learn_one(x, y)
    before = state.dumps(model.to_state())
    # the third row's feature overflows when summed with another name of its hashed column
    # would be refused by learn_one mid-frame; here a bad label in the last row
    frame = pd.DataFrame([x for x, _ in stream(5, seed=4)])
    with pytest.raises(ValueError, match="label"):
        model.learn_many(frame, pd.Series([True, False, True, False, "maybe"]))
    assert state.dumps(model.to_state()) == before


def warm_state(n=20):
    model = streammargin.BudgetSVMClassifier(gamma="auto")
    for x, y in stream(n):
        model.learn_one(x, y)
    return state.loads(state.dumps(model.to_state()))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s["arrays"]["_st"].__setitem__(kjit.ST_KP + kjit.GAMMA, 0.5), "gamma"),
        (lambda s: s["arrays"]["_st"].__setitem__(kjit.ST_KP + kjit.GAMMA, 0.0), "gamma"),
        (lambda s: s["arrays"]["_st"].__setitem__(kjit.ST_KP + kjit.GAMMA, 1e305), "gamma"),
        (lambda s: s["arrays"]["_warmup_y"].__setitem__(3, 0.5), "warm-up targets"),
        (lambda s: s["arrays"]["_warmup_y"].__setitem__(30, 1.0), "warm-up targets"),
        (lambda s: s["arrays"]["_warmup_x"].__setitem__((30, 0), 1.0), "warm-up rows"),
        (lambda s: s["arrays"]["_warmup_x"].__setitem__((0, 0), 7.0), "gamma"),
        (lambda s: s["arrays"].update(_warmup_y=np.zeros(0)), "warm-up rows"),
        (lambda s: s["arrays"].update(_warmup_x=np.zeros((3, 8))), "shape"),
        (lambda s: s["arrays"].pop("_warmup_x"), "arrays"),
    ],
)
def test_a_hostile_warm_up_is_refused(change, match):
    saved = warm_state()
    change(saved)
    with pytest.raises(StateError, match=match):
        streammargin.from_state(saved)


def test_after_the_warm_up_a_width_out_of_range_is_refused_and_one_in_range_works():
    saved = warm_state(70)
    assert saved["arrays"]["_warmup_x"].shape == (0, 0)
    for bad in (0.0, -1.0, 1e301):
        broken = state.loads(state.dumps(saved))
        broken["arrays"]["_st"][kjit.ST_KP + kjit.GAMMA] = bad
        with pytest.raises(StateError, match="gamma"):
            streammargin.from_state(broken)
    moved = state.loads(state.dumps(saved))
    moved["arrays"]["_st"][kjit.ST_KP + kjit.GAMMA] = 0.125
    assert streammargin.from_state(moved).gamma_ == 0.125


def test_a_restored_warm_up_continues_bit_identically():
    data = stream(120, seed=5)
    model = streammargin.BudgetSVMClassifier(gamma="auto")
    for x, y in data[:30]:
        model.learn_one(x, y)
    twin = streammargin.from_state(state.loads(state.dumps(model.to_state())))
    for x, y in data[30:]:
        assert twin.predict_proba_one(x) == model.predict_proba_one(x)
        model.learn_one(x, y)
        twin.learn_one(x, y)
    assert state.dumps(twin.to_state()) == state.dumps(model.to_state())


def test_the_memory_bound_counts_the_warm_up_rows():
    from streammargin.memory import memory_bound

    auto = memory_bound(streammargin.BudgetPerceptron, {"gamma": "auto", "max_features": 16})
    fixed = memory_bound(streammargin.BudgetPerceptron, {"gamma": 1.0, "max_features": 16})
    assert auto - fixed == 8 * support.AUTO_GAMMA_RECORDS * (16 + 1)


@pytest.mark.parametrize(
    ("cls", "params"),
    [
        pytest.param(streammargin.BudgetSVMClassifier, {"budget": 40}, id="BudgetSVM"),
        pytest.param(streammargin.MPUClassifier, {"kernel": "rbf", "C": 1.0, "budget": 40},
                     id="MPU-rbf"),
        pytest.param(streammargin.SBPClassifier, {"window": 40}, id="SBP"),
    ],
)
def test_the_warm_ups_resets_reuse_the_matrices_and_leave_them_as_fresh_ones(
    cls, params, monkeypatch
):
    """`_relearn` keeps a model's Gram matrices and zeroes the block learning can have written:
    after every record every array is exactly what new matrices at each reset give. (An easy
    stream: after a reset with a new width the SVM and the MPU keep fewer vectors than before,
    so entries the reset must clear would otherwise stay.)"""
    rng = np.random.default_rng(2)
    records = []
    for _ in range(140):
        v = rng.normal(size=3) * [5.0, 1.0, 0.1]
        records.append(({f"f{j}": float(v[j]) for j in range(3)}, bool(v[0] > 0)))
    reused = cls(**params)
    gram = reused._gram
    with monkeypatch.context() as patched:
        patched.setattr(support.KernelClassifier, "_zeroed",
                        lambda self, name, shape: np.zeros(shape))
        fresh = cls(**params)
    names = [name for name in ("_gram", "_margins", "_support", "_slots", "_st")
             if hasattr(reused, name)]
    for x, y in records:
        reused.learn_one(x, y)
        with monkeypatch.context() as patched:
            patched.setattr(support.KernelClassifier, "_zeroed",
                            lambda self, name, shape: np.zeros(shape))
            fresh.learn_one(x, y)
        for name in names:
            assert np.array_equal(getattr(reused, name), getattr(fresh, name)), name
    assert reused._gram is gram and fresh._gram is not gram  # the warm-up's resets kept it
    assert state.dumps(reused.to_state()) == state.dumps(fresh.to_state())
