"""The record form read and predicted a request at a time (`connectors.serving.record_rows`):
whatever the records, every label, probability, version and route, and every refusal with its
message, is what the per-record path gives. Without a broker: checkpoints handed to the
follower."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.serving import ModelFollower, RequestError
from connectors.serving.protocol import Limits
from connectors.serving.record_rows import RecordRows
from connectors.worker.config import WorkerConfig
from tests.test_common import state_bytes
from tests.test_serving_protocol import OPTIONS, HandFed, _wait, trained

FOLLOWERS = {}


def _follower(model: str, scale: bool) -> ModelFollower:
    """A follower of one partition's checkpoint of `model` (the CPM multiclass: the countries
    as labels), kept across examples, so that skeletons learnt by one example serve the next."""
    found = FOLLOWERS.get((model, scale))
    if found is None:
        options = dict(model=model, scale=scale)
        if model == "convexpolytope":
            options.update(label_field="country")
        store = HandFed()
        found = ModelFollower(WorkerConfig(**{**OPTIONS, **options}), store=store,
                              limits=Limits(max_records=200, max_fields=12))
        store.put({("payments", 0): trained(n=400, **options).to_checkpoint()})
        found.start()
        _wait(lambda: found.counters.loaded == 1)
        assert found.scorer.record_rows is not None, "event_batches.c is not built"
        FOLLOWERS[(model, scale)] = found
    return found


def _outcome(follower: ModelFollower, records: list[bytes], fast: bool):
    scorer = follower.scorer
    kept = scorer.record_rows
    if not fast:
        scorer.record_rows = None
    try:
        scored = follower.predict(records)
    except RequestError as error:
        return ("refused", error.status, str(error))
    finally:
        scorer.record_rows = kept
    return (scored.labels, scored.probabilities, scored.classes,
            [v.version for v in scored.versions], scored.routes)


_numbers = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False), st.integers(-10**6, 10**6),
    st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 1e308, 2**63, -2**63 - 1]))
# Spellings of one number that JSON allows and json.dumps does not write.
_spelled = st.sampled_from(["1e2", "1E+2", "-0", "0.000", "12.50", "3e-2", "1e400", "-1e400"])
_fields = st.fixed_dictionaries(
    {"amount": _numbers},
    optional={"transaction_id": st.sampled_from(["t1", "t2", 7, None]),
              "country": st.sampled_from(["BR", "FR", "US", "JP", "é\u2028", ""]),
              "card_present": st.booleans(),
              "is_fraud": st.sampled_from([True, False, None]),
              "tip": _numbers, "note": st.just(None),
              "tags": st.lists(st.integers(0, 3), max_size=2),
              "merchant": st.fixed_dictionaries({"mcc": _numbers})})


@st.composite
def _record(draw) -> bytes:
    """A record the per-record path predicts, mostly; one in ten holds a fault of its own."""
    kind = draw(st.sampled_from(["fields"] * 8 + ["spelled", "fault"]))
    if kind == "fields":
        return json.dumps(draw(_fields)).encode()
    if kind == "spelled":
        return b'{"amount": %s, "country": "BR"}' % draw(_spelled).encode()
    return draw(st.sampled_from([
        b"[1, 2]", b"{", b'{"amount": 1.0, "amount": 2.0}', b"null", b'{"amount": "1"}',
        b"\xff\xfe", b'{"is_fraud": true}', b'{"amount": 1.0, "is_fraud": "x"}',
        b'{"amount": 1.0, "transaction_id": 1.5}', b'{"amount": 1.0, "bad": Infinity}',
        json.dumps({f"f{i}": 1.0 for i in range(13)}).encode()]))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["alma", "linearmpu", "convexpolytope"]), scale=st.booleans(),
       records=st.lists(_record(), min_size=4, max_size=40))
def test_a_batch_read_at_once_gets_what_each_record_gets_per_record(model, scale, records):
    follower = _follower(model, scale)
    fast = _outcome(follower, records, fast=True)
    assert fast == _outcome(follower, records, fast=False)
    OUTCOMES["refused" if fast[0] == "refused" else "scored"] += 1


OUTCOMES = {"refused": 0, "scored": 0}


def test_the_batches_compared_were_mostly_scored():
    """(after the test above, in this module's order) the comparison was of answers, mostly,
    not of the first fault's message."""
    if sum(OUTCOMES.values()) == 0:
        pytest.skip("the comparison above did not run in this process")
    assert OUTCOMES["scored"] >= OUTCOMES["refused"] / 2, OUTCOMES


def test_the_common_records_are_read_at_once_and_the_skeletons_stay_bounded(monkeypatch):
    follower = _follower("alma", True)
    rows = follower.scorer.record_rows
    records = [json.dumps({"amount": float(i), "country": "BR FR US".split()[i % 3],
                           "card_present": i % 2 == 0}).encode() for i in range(50)]
    before = _outcome(follower, records, fast=False)
    assert _outcome(follower, records, fast=True) == before
    # Once learnt, every record is a row: none is left to the per-record path.
    served = follower.view.route("payments", None, None)[0]
    labels, probabilities = [None] * 50, [None] * 50
    assert rows.predict(served, records, labels, probabilities) == []
    assert labels == before[0] and [[1.0 - p, p] for p in probabilities] == before[1]
    # A request whose every record has a skeleton of its own (a free-text category) learns at
    # most LEARN_LIMIT of them, and the skeletons kept stay within their bounds.
    monkeypatch.setattr(RecordRows, "MAX_SKELETONS", 40)
    for start in range(0, 400, 100):
        distinct = [json.dumps({"amount": 1.0, "country": f"c{start + i}"}).encode()
                    for i in range(100)]
        assert _outcome(follower, distinct, fast=True) == _outcome(follower, distinct,
                                                                   fast=False)
        assert len(rows.skeletons) <= 40 and rows.skeleton_bytes <= rows.MAX_SKELETON_BYTES
        assert len(rows.entries) <= len(rows.skeletons)


@pytest.mark.parametrize("chunk", [64, 1 << 20])
def test_records_read_in_chunks_get_the_same_answers(monkeypatch, chunk):
    follower = _follower("linearmpu", False)
    monkeypatch.setattr(RecordRows, "CHUNK_BYTES", chunk)
    records = [json.dumps({"amount": i * 0.5, "tip": -i, "country": "FR"}).encode()
               for i in range(30)]
    assert _outcome(follower, records, fast=True) == _outcome(follower, records, fast=False)


@pytest.mark.parametrize("model", ["alma", "linearmpu", "convexpolytope"])
def test_scoring_at_once_leaves_the_served_task_as_it_was(model):
    """The compiled calls only predict: the served model's and scaler's states are the same
    bytes after a batch went through them."""
    follower = _follower(model, True)
    served = follower.view.route("payments", None, None)[0]
    state = (state_bytes(served.task.model), state_bytes(served.task.scaler))
    # (labelled: a compiled call that learnt would learn from them)
    records = [json.dumps({"amount": i * 1.5 - 20, "tip": float(i % 7), "is_fraud": i % 2 == 0,
                           "country": "BR FR US".split()[i % 3]}).encode() for i in range(60)]
    assert _outcome(follower, records, fast=True) == _outcome(follower, records, fast=False)
    labels, probabilities = [None] * 60, [None] * 60
    left = follower.scorer.record_rows.predict(served, records, labels, probabilities)
    assert len(left) < 60  # (rows went through the compiled calls)
    assert (state_bytes(served.task.model), state_bytes(served.task.scaler)) == state
