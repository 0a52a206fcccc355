"""AutoClassifier's replay buffer: the records kept until the binary members become one-vs-rest.

At the third label the member of the label the binary model learnt as False is a fresh clone; it
learns the records kept (`streammargin.replay.ReplayBuffer`) from the first of its label on, so
it does not start cold. What is checked: the members after the switch are one-vs-rest run from
the first record; the buffer is bounded, copies what it keeps and is freed at the switch; its
safe state round-trips, refuses hostile values with StateError only, and states saved before it
existed still load; and the wine data set, where Auto was 1.1 points below its best member.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from river import datasets, preprocessing

import streammargin
from streammargin import memory, replay, state
from streammargin.errors import InvalidInput, StateError
from streammargin.features import MAX_NAME_BYTES

BINARY = ("ALMAClassifier", "BudgetSVMClassifier")
FAST = settings(
    max_examples=20, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def labelled_stream(labels, seed=0, d=5):
    rng = np.random.default_rng(seed)
    return [({f"f{j}": float(v) for j, v in enumerate(rng.normal(size=d))}, y) for y in labels]


def one_vs_rest_alone(model):
    """Each binary member's class run one-vs-rest on its own, as the model configures it."""
    return {
        name: streammargin.OneVsRestClassifier(
            type(model.members[name])(**model._member_params()[name]),
            max_classes=model.max_ovr_classes,
        )
        for name in BINARY
    }


# The switch -------------------------------------------------------------------------------------

@pytest.mark.parametrize("first_label", ["a", 0])  # "a": True of the binary members; 0: False
def test_after_the_switch_the_new_member_has_learnt_the_records_before_it(first_label):
    """The second label first comes at record 4, the third at record 20. The label the binary
    members learnt as False ("b" after "a"; 0, a negative coding, before 1) gets a member equal
    to a model trained on the records from the first of that label to the switch ("this label
    or not"). With a first label learnt as True, both members are then one-vs-rest run from the
    first record, byte for byte."""
    second, third = ("b", "c") if first_label == "a" else (1, 2)
    fresh, start = (second, 4) if first_label == "a" else (first_label, 0)
    labels = [first_label] * 4 + [second, first_label] * 8 + [third]
    labels += [[first_label, second, third][i % 3] for i in range(30)]
    data = labelled_stream(labels)
    model = streammargin.AutoClassifier(max_features=64)
    alone = one_vs_rest_alone(model)
    for i, (x, y) in enumerate(data):
        model.predict_one(x)
        model.learn_one(x, y)
        for ovr in alone.values():
            ovr.learn_one(x, y)
        if i == 20:  # the switch
            for name in BINARY:
                cls = type(alone[name].classifier)
                member = cls(**model._member_params()[name])
                for x_, y_ in data[start:21]:
                    member.learn_one(x_, y_ == fresh)
                got = model.members[name].classifiers[fresh]
                assert state.dumps(got.to_state()) == state.dumps(member.to_state()), name
    for name in BINARY:
        same = state.dumps(model.members[name].to_state()) == state.dumps(alone[name].to_state())
        # 0 is a negative coding: the model so far (True for 1 from record 0 on) is 1's member
        assert same is (first_label == "a"), name


def test_the_buffer_is_freed_at_the_switch_and_not_saved_after_it():
    data = labelled_stream(["u", "v"] * 10 + ["w"] * 3)
    model = streammargin.AutoClassifier(max_features=32)
    for x, y in data[:20]:
        model.learn_one(x, y)
    assert len(model._replay) == 20
    members_before = sum(memory.memory_size(m) for m in model.members.values())
    before = memory.memory_size(model)
    kept = model._replay.memory_size()
    assert kept == 20 * 16 + 100 * 16 + sum(len(f'"f{j}"') + 1 for j in range(5))
    model.learn_one(*data[20])
    assert model._replay is None and model.to_state()["replay"] is None
    members = sum(memory.memory_size(m) for m in model.members.values())
    assert memory.memory_size(model) == members + 6 * 8 + len('"u""v""w"') + 3
    assert before == members_before + 6 * 8 + len('"u""v"') + 2 + kept
    twin = streammargin.from_state(state.loads(state.dumps(model.to_state())))
    assert twin._replay is None


def test_with_max_ovr_classes_2_nothing_is_kept_nor_bounded():
    """The third label retires the binary members: no switch to one-vs-rest, no buffer."""
    model = streammargin.AutoClassifier(max_classes=4, max_ovr_classes=2, max_features=16)
    for x, y in labelled_stream([True, False] * 5):
        model.learn_one(x, y)
    assert model._replay is None and model.to_state()["replay"] is None
    members = memory.memory_bound(model.members["ConvexPolytopeClassifier"]) + sum(
        memory.memory_bound(streammargin.OneVsRestClassifier(cls(max_features=16), 2))
        for cls in (streammargin.ALMAClassifier, streammargin.BudgetSVMClassifier)
    )
    labels = 4 * (memory.MAX_LABEL_BYTES + 1)
    assert memory.memory_bound(model) == members - 2 * memory.STATE_OVERHEAD + labels + 48
    assert memory.memory_bound(model, {"max_ovr_classes": 3}) > memory.memory_bound(
        model
    ) + replay.MAX_BYTES


def test_the_buffer_keeps_a_copy_and_learn_one_leaves_its_input_alone():
    data = labelled_stream(["a", "b"] * 6 + ["c", "a", "b", "c"])
    mutated = streammargin.AutoClassifier(max_features=32)
    pristine = streammargin.AutoClassifier(max_features=32)
    for x, y in data:
        before = copy.deepcopy(x)
        pristine.learn_one(copy.deepcopy(x), y)
        mutated.learn_one(x, y)
        assert x == before
        x["f0"] = 1e6  # the caller reuses its dict: what was kept must not change
        x["late"] = 1.0
    assert state.dumps(mutated.to_state()) == state.dumps(pristine.to_state())


# Bounds -----------------------------------------------------------------------------------------

def test_the_buffer_keeps_the_first_records_that_fit_and_its_bound_is_tight():
    buffer = replay.ReplayBuffer()
    assert not buffer.add({f"x{j}": 1.0 for j in range(replay.MAX_ENTRIES + 1)}, 0)
    assert not buffer.add({"L" * (MAX_NAME_BYTES - 1): 1.0}, 0)  # 129 bytes of JSON
    assert buffer.add({"L" * (MAX_NAME_BYTES - 2): 1.0}, 0)  # 128
    assert len(buffer) == 1
    buffer = replay.ReplayBuffer()
    # the worst case: every record full, every name of its own, each 128 bytes of JSON
    for i in range(replay.MAX_RECORDS):
        x = {f"{i:03d}-{j:03d}".ljust(MAX_NAME_BYTES - 2, "n"): float(j)
             for j in range(replay.MAX_ENTRIES)}
        assert buffer.add(x, i % 2)
    assert not buffer.add({"a": 1.0}, 0)  # full
    assert buffer.memory_size() == replay.MAX_BYTES
    assert replay.MAX_BYTES == 100 * (16 + 256 * (16 + 128 + 1)) == 3_713_600
    saved = state.dumps({"replay": buffer.to_state()})
    assert len(saved) <= replay.MAX_BYTES + 1024  # the arrays' specs: within STATE_OVERHEAD
    restored = replay.ReplayBuffer.from_state(state.loads(saved)["replay"], 2)
    assert list(restored.records()) == list(buffer.records())


def test_the_model_with_a_full_buffer_stays_within_its_bound():
    model = streammargin.AutoClassifier(max_classes=3, max_features=8)
    for i in range(replay.MAX_RECORDS + 5):
        x = {f"{i:03d}-{j:03d}".ljust(MAX_NAME_BYTES - 2, "n"): 1.0 + j % 3
             for j in range(replay.MAX_ENTRIES)}
        model.learn_one(x, i % 2)
    assert len(model._replay) == replay.MAX_RECORDS
    bound = memory.memory_bound(model)
    assert memory.memory_size(model) <= bound - memory.STATE_OVERHEAD
    assert len(state.dumps(model.to_state())) <= bound
    model.learn_one({"a": 1.0}, 2)  # the switch: 200 records replayed (100 a member), freed
    assert model._replay is None
    assert [m.counters["trials"] for m in model.members["ALMAClassifier"].classifiers.values()] \
        == [replay.MAX_RECORDS + 1, replay.MAX_RECORDS + 6, 1]


# Safe state -------------------------------------------------------------------------------------

names = st.sampled_from(["a", "b", "c", 7, 2.5, True, ("t", 1), None, "L" * 130])
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
records = st.dictionaries(names, finite | st.integers(-5, 5) | st.booleans(), max_size=5)


@FAST
@given(
    stream=st.lists(st.tuples(records, st.sampled_from(["u", "v", "w"])), min_size=1,
                    max_size=24),
    cut=st.integers(0, 24),
    probes=st.lists(records, min_size=1, max_size=3),
)
def test_a_restored_model_learns_and_switches_as_the_original(stream, cut, probes):
    """Saved at any point (before the switch: with the records kept), restored, then both learn
    the rest: the same bytes and predictions; learn_one never changes its input."""
    model = streammargin.AutoClassifier(max_features=16)
    for x, y in stream[:cut]:
        model.learn_one(x, y)
    twin = streammargin.from_state(state.loads(state.dumps(model.to_state())))
    assert state.dumps(twin.to_state()) == state.dumps(model.to_state())
    for x, y in stream[cut:]:
        before = copy.deepcopy(x)
        model.learn_one(x, y)
        twin.learn_one(x, y)
        assert x == before
    assert state.dumps(twin.to_state()) == state.dumps(model.to_state())
    for x in probes:
        assert twin.predict_proba_one(x) == model.predict_proba_one(x)


_SAVED: dict = {}


def saved_with_records() -> dict:
    """A binary-mode state holding 30 records with names of every kind."""
    if "state" not in _SAVED:
        model = streammargin.AutoClassifier(window=50, max_classes=5, max_features=8)
        rng = np.random.default_rng(3)
        kinds = ["a", "b", 7, 2.5, ("t", 1), None, True]
        for i in range(30):
            x = {kinds[k]: float(rng.normal()) for k in rng.permutation(7)[: 1 + i % 5]}
            model.learn_one(x, "yes" if i % 3 else "no")
        _SAVED["state"] = state.dumps(model.to_state())
    return state.loads(_SAVED["state"])


def test_a_state_saved_before_the_buffer_still_loads_and_keeps_records_from_then_on():
    old = saved_with_records()
    del old["replay"]
    model = streammargin.from_state(old)
    assert len(model._replay) == 0
    data = labelled_stream(["yes", "no"] * 3 + ["maybe"])
    for x, y in data[:6]:
        model.learn_one(x, y)
    assert len(model._replay) == 6
    model.learn_one(*data[6])
    # "yes" (the binary members' False: "no" came first) gets a member that learnt the 6
    # records kept (from its first one on), then the switch record
    members = model.members["ALMAClassifier"].classifiers
    assert members["yes"].counters["trials"] == 6 + 1
    assert members["no"].counters["trials"] == 30 + 6 + 1  # the model so far
    one_vs_rest = trained_one_vs_rest()
    del one_vs_rest["replay"]
    assert streammargin.from_state(one_vs_rest)._replay is None


def trained_one_vs_rest() -> dict:
    model = streammargin.AutoClassifier(max_features=8)
    for x, y in labelled_stream(["u", "v", "w", "u"]):
        model.learn_one(x, y)
    return state.loads(state.dumps(model.to_state()))


def replay_of(s):
    return s["replay"]


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update(replay=None),  # binary mode with max_ovr_classes > 2: a buffer
        lambda s: s.update(replay=[]),
        lambda s: replay_of(s).pop("values"),
        lambda s: replay_of(s).update(extra=1),
        lambda s: replay_of(s).update(names="a"),
        lambda s: replay_of(s)["names"].append("unused"),
        lambda s: replay_of(s)["names"].__setitem__(0, replay_of(s)["names"][1]),  # twice
        lambda s: replay_of(s)["names"].__setitem__(0, "L" * 200),  # longer than 128 bytes
        lambda s: replay_of(s)["names"].__setitem__(0, {"float": float("nan")}),
        lambda s: replay_of(s)["names"].__setitem__(0, {"bytes": "x"}),
        lambda s: replay_of(s)["names"].extend(["n"] * (replay.MAX_RECORDS
                                                        * replay.MAX_ENTRIES)),
        lambda s: replay_of(s)["values"].__setitem__(0, np.inf),
        lambda s: replay_of(s)["values"].__setitem__(0, np.nan),
        lambda s: replay_of(s).update(values=replay_of(s)["values"].astype(np.float32)),
        lambda s: replay_of(s).update(values=replay_of(s)["values"][:-1]),
        lambda s: replay_of(s).update(values=replay_of(s)["values"].reshape(1, -1)),
        lambda s: replay_of(s).update(values=list(replay_of(s)["values"])),
        lambda s: replay_of(s)["labels"].__setitem__(0, 2),  # two labels only
        lambda s: replay_of(s)["labels"].__setitem__(0, -1),
        lambda s: replay_of(s).update(labels=replay_of(s)["labels"].astype(np.int32)),
        lambda s: replay_of(s).update(labels=replay_of(s)["labels"][:-1]),
        lambda s: replay_of(s)["sizes"].__setitem__(0, -1),
        lambda s: replay_of(s)["sizes"].__setitem__(0, replay.MAX_ENTRIES + 1),
        lambda s: replay_of(s)["sizes"].__setitem__(0, 2**62),
        lambda s: replay_of(s)["sizes"].__setitem__(slice(None), 0),
        lambda s: replay_of(s)["columns"].__setitem__(0, -1),
        lambda s: replay_of(s)["columns"].__setitem__(0, 10**6),
        # the second record has two names: make them one
        lambda s: replay_of(s)["columns"].__setitem__(2, replay_of(s)["columns"][1]),
        lambda s: replay_of(s).update(
            labels=np.zeros(replay.MAX_RECORDS + 1, dtype=np.int64),
            sizes=np.zeros(replay.MAX_RECORDS + 1, dtype=np.int64),
            columns=np.zeros(0, dtype=np.int64), values=np.zeros(0), names=[],
        ),
    ],
)
def test_a_malformed_buffer_raises_state_error_only(change):
    saved = saved_with_records()
    change(saved)
    with pytest.raises(StateError):
        streammargin.from_state(saved)


def test_a_one_and_a_true_in_one_record_are_one_name_twice():
    saved = saved_with_records()
    kept = saved["replay"]
    kept["names"] += [{"int": 1}, {"bool": True}]
    n = len(kept["names"])
    kept["labels"] = np.append(kept["labels"], 0)
    kept["sizes"] = np.append(kept["sizes"], 2)
    kept["columns"] = np.append(kept["columns"], [n - 2, n - 1])
    kept["values"] = np.append(kept["values"], [1.0, 2.0])
    with pytest.raises(StateError, match="twice"):
        streammargin.from_state(saved)


def test_a_buffer_beyond_two_labels_is_refused():
    saved = trained_one_vs_rest()
    saved["replay"] = saved_with_records()["replay"]
    with pytest.raises(StateError, match="null"):
        streammargin.from_state(saved)


def mutate_array(array: np.ndarray, data) -> np.ndarray:
    how = data.draw(st.sampled_from(["set", "dtype", "shape", "drop", "extend"]))
    if how == "dtype":
        return array.astype(data.draw(st.sampled_from([np.float64, np.int64, np.int32, bool])))
    if how == "shape":
        return array.reshape(-1, 1)
    if how == "drop":
        return array[: data.draw(st.integers(0, max(0, len(array) - 1)))]
    if how == "extend":
        return np.concatenate([array, array[: data.draw(st.integers(1, 3))]])
    if len(array) and array.dtype in (np.int64, np.float64):
        array = array.copy()
        value = data.draw(st.sampled_from([-1, 0, 1, 2, 3, 255, 256, 257, 2**40, -(2**63)]))
        array[data.draw(st.integers(0, len(array) - 1))] = value
    return array


@FAST
@given(data=st.data())
def test_random_edits_of_the_buffer_raise_state_error_or_restore(data):
    saved = saved_with_records()
    kept = saved["replay"]
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(["labels", "sizes", "columns", "values", "names"]))
        if key == "names":
            names_ = kept["names"]
            i = data.draw(st.integers(0, len(names_) - 1))
            names_[i] = data.draw(st.sampled_from(
                [None, 0, "a", "b", {"int": 7}, {"int": 8}, {"tuple": []}, {"none": None}, [],
                 {"float": 2.5}, {"bool": False}, "x" * 127]
            ))
        else:
            kept[key] = mutate_array(kept[key], data)
    try:
        model = streammargin.from_state(saved)
    except StateError:
        return
    # whatever restored learns on, through the switch, and saves again
    for x, y in labelled_stream(["yes", "no", "maybe", "yes"]):
        model.predict_proba_one(x)
        model.learn_one(x, y)
    with pytest.raises(InvalidInput):
        model.learn_one({"a": float("nan")}, "yes")
    streammargin.from_state(state.loads(state.dumps(model.to_state())))


def test_image_segments_the_served_member_is_one_vs_rest_from_the_first_record():
    """ImageSegments' labels are strings (the first one a binary member's True): after the
    switch the budget SVM inside Auto is the budget SVM one-vs-rest run alone."""
    data = list(datasets.ImageSegments().take(300))
    auto = preprocessing.StandardScaler() | streammargin.AutoClassifier()
    alone = preprocessing.StandardScaler() | streammargin.OneVsRestClassifier(
        streammargin.BudgetSVMClassifier(), max_classes=10  # Auto's max_ovr_classes
    )
    for x, y in data:
        auto.learn_one(x, y)
        alone.learn_one(x, y)
    inside = auto["AutoClassifier"].members["BudgetSVMClassifier"]
    assert state.dumps(inside.to_state()) == state.dumps(alone["OneVsRestClassifier"].to_state())
