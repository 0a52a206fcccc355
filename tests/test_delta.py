"""Asynchronous delta averaging of ALMA (streammargin/delta.py): the ledger's arithmetic on
hand-checked cases, and its invariants under any order of learning, publishing and taking in."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from river.datasets import synth

import streammargin
from streammargin.delta import DeltaLedger, alma_parts
from streammargin.jit import alma as alma_jit
from streammargin.mixing import mix

ROWS = [(x, bool(y)) for x, y in synth.Agrawal(classification_function=2, seed=4).take(600)]


def scaled(x: dict) -> dict:
    return {k: v / 1e5 for k, v in x.items()}


def trained(rows, model=None, **params) -> streammargin.ALMAClassifier:
    model = model if model is not None else streammargin.ALMAClassifier(**params)
    for x, y in rows:
        model.learn_one(scaled(x), y)
    return model


def theta(model) -> dict:
    """theta by feature name (and the intercept, column 0)."""
    parts = alma_parts(model)
    named = {name: parts.theta[column] for name, column in parts.space.index.items()}
    return {"(intercept)": parts.theta[0], **named}


def assert_theta(model, expected: dict, **tolerance) -> None:
    got = theta(model)
    assert got.keys() == expected.keys()
    for name in got:
        assert got[name] == pytest.approx(expected[name], abs=1e-12, **tolerance), name


def test_a_peers_contribution_taken_into_a_fresh_model_is_that_contribution():
    # fresh + (C - origin) = C: nothing to project, the model holds C's hypothesis exactly.
    mine, peer = streammargin.ALMAClassifier(), trained(ROWS[:200])
    ledger, theirs = DeltaLedger(mine, 4, stream=1), DeltaLedger(streammargin.ALMAClassifier(), 4,
                                                                  stream=2)
    stream, serial, contribution = theirs.publish(peer)
    assert (stream, serial) == (2, 1)
    assert_theta(contribution, theta(peer))
    assert ledger.take_in(mine, [(stream, serial, contribution)]) == 1
    assert_theta(mine, theta(peer))
    assert mine.n_trials == peer.n_trials == 200
    assert mine._st[alma_jit.K] == peer._st[alma_jit.K]


def test_a_later_contribution_of_a_stream_adds_only_what_it_holds_beyond_the_last():
    mine = streammargin.ALMAClassifier()
    ledger, theirs = DeltaLedger(mine, 4, stream=1), DeltaLedger(streammargin.ALMAClassifier(), 4,
                                                                  stream=2)
    peer = trained(ROWS[:100])
    first = theirs.publish(peer)
    ledger.take_in(mine, [first])
    trained(ROWS[100:200], peer)
    second = theirs.publish(peer)
    assert second[1] == 2
    ledger.take_in(mine, [second])
    # C2 - C1 added to C1: the model holds C2, whose hypothesis is the peer's.
    assert_theta(mine, theta(peer))
    assert mine.n_trials == 200
    # The same record again, or an older one (its old key's, after a rebalance): nothing added.
    assert ledger.take_in(mine, [second, first]) == 0
    assert_theta(mine, theta(peer))


def test_a_workers_own_stream_and_what_it_took_in_are_never_sent_back():
    mine = trained(ROWS[:50])
    ledger = DeltaLedger(mine, 4, stream=1, adopt=True)  # restored: the 50 records are taken
    own = ledger.publish(mine)
    assert ledger.take_in(mine, [own]) == 0  # its own stream
    assert not np.any(alma_parts(own[2]).theta)
    peer = trained(ROWS[50:150])
    ledger.take_in(mine, [(2, 1, DeltaLedger(streammargin.ALMAClassifier(), 4, 2).publish(
        peer)[2])])
    _, _, contribution = ledger.publish(mine)
    assert not np.any(alma_parts(contribution).theta)  # the peer's part is not the worker's
    assert contribution.n_trials == 0


def test_the_own_learning_between_two_records_is_the_next_contribution():
    # ALMA's correction is additive in theta: what a fresh model learns from records is what it
    # learns on top of another model's state, up to the projection into the unit ball. With
    # the ledger begun on a restored model of 100 records, the contribution is the model minus
    # those.
    model = trained(ROWS[:100])
    start = theta(model)
    ledger = DeltaLedger(model, 4, stream=1, adopt=True)
    trained(ROWS[100:160], model)
    _, _, contribution = ledger.publish(model)
    now = theta(model)
    expected = {name: now[name] - start.get(name, 0.0) for name in now}
    assert_theta(contribution, expected, rel=1e-9)
    assert contribution.n_trials == 60


def test_all_a_fresh_model_learnt_is_its_first_contribution():
    model = trained(ROWS[:100])
    _, _, contribution = DeltaLedger(model, 4, stream=1).publish(model)
    assert_theta(contribution, theta(model))
    assert contribution.n_trials == 100


def test_a_restored_model_adopts_the_contributions_it_first_reads():
    peer_model = trained(ROWS[:100])
    theirs = DeltaLedger(streammargin.ALMAClassifier(), 4, stream=2)
    first = theirs.publish(peer_model)
    restored = trained(ROWS[:100])  # a checkpoint that already holds the peer's 100 records
    ledger = DeltaLedger(restored, 4, stream=1, adopt=True)
    before = theta(restored)
    assert ledger.take_in(restored, [first]) == 0
    assert_theta(restored, before)
    trained(ROWS[100:150], peer_model)
    second = theirs.publish(peer_model)
    assert ledger.take_in(restored, [second]) == 1  # only what came since: C2 - C1
    delta = {k: theta(peer_model)[k] - theta(first[2]).get(k, 0.0) for k in theta(peer_model)}
    expected = {k: before.get(k, 0.0) + delta[k] for k in delta}
    # (the sum may leave the unit ball: compare before the projection, which only scales)
    got = theta(restored)
    ratio = got["(intercept)"] / expected["(intercept)"]
    assert 0.0 < ratio <= 1.0
    for name in got:
        assert got[name] == pytest.approx(ratio * expected[name], abs=1e-12)


def test_a_merge_that_is_not_the_workers_learning_is_not_its_contribution():
    model = trained(ROWS[:80])
    ledger = DeltaLedger(model, 4, stream=1, adopt=True)
    taken_over = trained(ROWS[200:300])
    merged = mix([model, taken_over], [1, 1])
    ledger.merged(model, merged)
    _, _, contribution = ledger.publish(merged)
    assert np.allclose(alma_parts(contribution).theta, 0.0, atol=1e-12)


def test_the_ledger_keeps_at_most_max_streams_forgetting_the_one_seen_longest_ago():
    mine = streammargin.ALMAClassifier()
    ledger = DeltaLedger(mine, 2, stream=1)
    peers = {s: DeltaLedger(streammargin.ALMAClassifier(), 2, stream=s) for s in (2, 3, 4)}
    model = trained(ROWS[:20])
    ledger.take_in(mine, [peers[2].publish(model), peers[3].publish(model)])
    ledger.seen([2])  # 2 is on the topic now; 3 not seen since
    ledger.take_in(mine, [peers[4].publish(model)])
    assert list(ledger.applied) == [2, 4]


def test_a_ledger_is_for_alma_only():
    with pytest.raises(TypeError, match="ALMAClassifier"):
        DeltaLedger(streammargin.BudgetPerceptron(), 3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["learn", "publish", "take"]),
                          st.integers(1, 40)), min_size=1, max_size=30),
       st.sampled_from([{}, {"p": 3.0}, {"max_features": 3}, {"average_window": 20}]))
def test_any_interleaving_keeps_every_model_finite_in_the_unit_ball_and_restorable(steps, params):
    models = [streammargin.ALMAClassifier(**params) for _ in range(3)]
    ledgers = [DeltaLedger(m, 3, stream=k + 1) for k, m in enumerate(models)]
    published: dict[int, tuple] = {}
    at = 0
    for k, action, n in steps:
        if action == "learn":
            trained(ROWS[at:at + n], models[k])
            at = (at + n) % 500
        elif action == "publish":
            published[k] = ledgers[k].publish(models[k])
        else:
            ledgers[k].take_in(models[k], [r for q, r in published.items() if q != k])
    for model in [*models, *[r[2] for r in published.values()]]:
        parts = alma_parts(model)
        assert np.isfinite(parts.theta).all() and np.isfinite(parts.summed).all()
        p = float(model.p)
        assert np.sum(np.abs(parts.theta) ** p) ** (1.0 / p) <= 1.0 + 1e-9
        # the state passes every check a checkpoint's does, and predicts the same
        restored = type(model).from_state(model.to_state())
        x = scaled(ROWS[-1][0])
        assert restored.predict_proba_one(x) == model.predict_proba_one(x)
