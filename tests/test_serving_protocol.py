"""`streammargin serve`'s HTTP side without a broker: the app on uvicorn in this process, its
follower fed checkpoints by hand. Hostile bodies (hypothesis) each get a 4xx naming the fault,
and a valid request still works afterwards; the limits; topic scope's one model; the in-process
`predict`."""

from __future__ import annotations

import collections
import http.client
import json
import logging
import re
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.serving import ModelFollower, RequestError
from connectors.serving.app import InferenceApp, serve
from connectors.serving.protocol import Limits
from connectors.state.checkpoint import LoadedCheckpoint
from connectors.worker.config import WorkerConfig
from connectors.task import PartitionTask

Record = collections.namedtuple("Record", "topic partition offset timestamp key value headers")
OPTIONS = dict(topics=["payments"], group_id="fraud", features=("*",), label_field="is_fraud",
               id_field="transaction_id", scale=True)


def payments(n: int, start: int = 0, partition: int = 0) -> list[Record]:
    out = []
    for i in range(start, start + n):
        value = {"transaction_id": f"t{i}", "amount": float(i % 97), "country": "BR FR US".split()[
            i % 3], "card_present": i % 2 == 0, "is_fraud": i % 97 > 60 and i % 2 == 1}
        out.append(Record("payments", partition, i, 0, None, json.dumps(value).encode(), []))
    return out


class HandFed:
    """A checkpoint store whose records the test hands over (`put`)."""

    def __init__(self, partitions: int = 1):
        self.partitions = partitions
        self.queue: list[dict] = []
        self.offset = 0

    def put(self, checkpoints: dict) -> None:
        found = {}
        for key, payload in checkpoints.items():
            self.offset += 1
            found[key] = LoadedCheckpoint("k", payload, "checkpoints", 0, self.offset, 0)
        self.queue.append(found)

    def partitions_of(self, topic: str) -> set[int]:
        return set(range(self.partitions))

    def follow(self, keys: list) -> dict:
        if self.queue:
            return self.queue.pop(0)
        time.sleep(0.01)
        return {}

    def close(self) -> None:
        pass


def trained(partition: int = 0, n: int = 500, **options) -> PartitionTask:
    task = PartitionTask.new("payments", partition,
                             WorkerConfig(**{**OPTIONS, **options}).task_settings())
    task.process(payments(n, partition=partition))
    return task


@pytest.fixture(scope="module")
def server():
    store = HandFed()
    follower = ModelFollower(WorkerConfig(**OPTIONS), store=store,
                             limits=Limits(max_records=100, max_fields=50))
    store.put({("payments", 0): trained().to_checkpoint()})
    follower.start()
    assert follower.wait_ready(10)
    app = InferenceApp(follower, max_request_bytes=64 << 10, body_timeout=1.0)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(app, "127.0.0.1", port),
                              kwargs={"request_timeout": 2.0, "watch": stop.is_set},
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if request(port, "GET", "/v2/health/live")[0] == 200:
                break
        except OSError:
            time.sleep(0.1)
    yield port, follower, store
    stop.set()
    thread.join(10)
    follower.close()


def request(port: int, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body, headers or {})
        response = connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data[:1] == b"{" else {}
    finally:
        connection.close()


VALID = {"inputs": [{"name": "record", "datatype": "BYTES", "shape": [1],
                     "data": ['{"amount": 31.0, "country": "BR", "card_present": false}']}]}


def infer(port: int, body: dict | bytes, path: str = "/v2/models/fraud/infer", **headers):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request(port, "POST", path, data, headers)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=5),
    max_leaves=30)


def mutated_requests() -> st.SearchStrategy:
    tensor = st.fixed_dictionaries(
        {"name": st.sampled_from(["record", "key", "amount", "x.y", "", "a..b"]) | st.text(
            max_size=10),
         "datatype": st.sampled_from(["BYTES", "FP64", "BOOL", "INT8", "UINT64", "FP16",
                                      "COMPLEX"]),
         "shape": st.lists(st.integers(-2, 200), max_size=3),
         "data": json_values},
        optional={"parameters": st.dictionaries(st.sampled_from(["binary_data_size", "x"]),
                                                json_values, max_size=2)})
    return st.fixed_dictionaries(
        {"inputs": st.lists(tensor, max_size=4)},
        optional={"parameters": st.dictionaries(
            st.sampled_from(["key", "partition", "topic", "binary_data_output", "sequence_id"]),
            json_values, max_size=3),
            "outputs": st.lists(st.fixed_dictionaries({"name": st.sampled_from(
                ["predict", "predict_proba", "other"])}), max_size=3),
            "id": json_values})


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    mutated_requests().map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200).map(lambda b: json.dumps(VALID).encode()[:40] + b),
    st.integers(1, 5000).map(lambda n: b'{"inputs": [{"data": ' + b"[" * n + b"]" * n + b"}]}"),
))
def test_every_hostile_body_gets_a_4xx_naming_the_fault(server, body):
    port, _, _ = server
    status, answer = infer(port, body)
    if status == 200:  # (a mutation can be a valid request)
        assert answer["model_name"] == "fraud" and answer["outputs"]
        return
    assert 400 <= status < 500, (status, answer, body[:200])
    assert isinstance(answer.get("error"), str) and answer["error"]


def test_a_valid_request_works_after_the_hostile_ones_and_the_limits_hold(server):
    port, follower, _ = server
    status, answer = infer(port, VALID)
    assert status == 200 and answer["outputs"][1]["shape"] == [1, 2]
    # Body bytes: refused from the declared length, before reading.
    status, answer = infer(port, b"{" + b" " * (70 << 10) + b"}")
    assert status == 413 and "--max-request-bytes" in answer["error"]
    # Records, fields: their own messages.
    many = {"inputs": [{"name": "record", "datatype": "BYTES", "shape": [101],
                        "data": ['{"amount": 1.0}'] * 101}]}
    status, answer = infer(port, many)
    assert status == 400 and "--max-request-records" in answer["error"]
    wide = {"inputs": [{"name": "record", "datatype": "BYTES", "shape": [1], "data": [
        json.dumps({f"f{i}": 1.0 for i in range(60)})]}]}
    status, answer = infer(port, wide)
    assert status == 400 and "record 0 has 60 features" in answer["error"]
    # A record the worker would dead-letter: its reason, and the row.
    status, answer = infer(port, {"inputs": [{"name": "record", "datatype": "BYTES",
                                              "shape": [2], "data": ['{"amount": 1.0}',
                                                                     '[1, 2]']}]})
    assert status == 400 and answer["error"].startswith(
        "record 1: record is an array, expected an object of fields")
    # Unknown model, version, path, method.
    assert infer(port, VALID, "/v2/models/other/infer")[0] == 404
    assert infer(port, VALID, "/v2/models/fraud/versions/999/infer")[0] == 404
    assert request(port, "GET", "/v2/nothing")[0] == 404
    assert request(port, "DELETE", "/v2/models/fraud")[0] == 405
    assert request(port, "GET", "/v2/models/fraud/infer")[0] == 405
    # A slow body: 408 once the body timeout passes.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/fraud/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 100\r\n\r\n{")
        reply = sock.recv(1000)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
    assert infer(port, VALID)[0] == 200


def refusals(port: int) -> dict[str, float]:
    """`streammargin_serve_connections_refused_total` by reason, as /metrics gives it."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    found = re.findall(r'^streammargin_serve_connections_refused_total\{reason="(\w+)"\} (\S+)$',
                       text, re.M)
    return {reason: float(value) for reason, value in found}


def test_a_slow_or_endless_request_head_closes_its_connection(server):
    """uvicorn bounds neither the time nor the bytes of a request's head: `bounded_protocol`
    does (the fixture's request timeout is 2 s), and counts each connection it ends."""
    port, _, _ = server
    before = refusals(port)
    for slow in (False, True):  # a connection that sends nothing; a head that never ends
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            began = time.monotonic()
            if slow:
                sock.sendall(b"POST /v2/models/fraud/infer HTTP/1.1\r\nHost: x\r\n")
                for _ in range(3):  # (a header now and then)
                    time.sleep(0.5)
                    try:
                        sock.sendall(b"X-Slow: 1\r\n")
                    except OSError:
                        break
            assert sock.recv(1000) == b""  # closed, without an answer
            assert 1.5 < time.monotonic() - began < 4.5
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(100):
                sock.sendall(b"X-Pad: " + b"a" * 1000 + b"\r\n")
        except OSError:
            pass
        reply = sock.recv(1000)
    assert reply.startswith(b"HTTP/1.1 400") and b"head is above 65536 bytes" in reply, reply
    assert infer(port, VALID)[0] == 200
    after = refusals(port)
    assert after["head_timeout"] - before["head_timeout"] == 2
    assert after["head_too_large"] - before["head_too_large"] == 1
    assert after["unparsable"] == before["unparsable"]
    # A head just under the bound is answered.
    status, _ = request(port, "GET", "/v2/health/live", headers={"X-Pad": "a" * 60_000})
    assert status == 200


def test_a_clients_bad_requests_write_no_log_line(server, caplog):
    """uvicorn logs a WARNING a request it cannot parse: a line per request, at the client's
    will. The server keeps them below its level."""
    port, _, _ = server
    before = refusals(port)["unparsable"]
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                assert sock.recv(1000).startswith(b"HTTP/1.1 400")
    assert not [r for r in caplog.records if r.name.startswith("uvicorn")], caplog.text
    # Counted instead, and said in at most one line a minute (with the fix).
    assert refusals(port)["unparsable"] - before == 3
    said = [r for r in caplog.records if "(unparsable)" in r.getMessage()]
    assert len(said) <= 1 and all("check what connects to this port" in r.getMessage()
                                  for r in said)


def test_connections_past_the_limit_are_answered_503_and_counted(server):
    from connectors.serving.app import MAX_CONNECTIONS

    port, _, _ = server
    before = refusals(port)["too_many_connections"]
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(0.2)  # (each accepted: the connections are the server's)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(1000).startswith(b"HTTP/1.1 503")
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert refusals(port)["too_many_connections"] - before == 1
    assert request(port, "GET", "/v2/health/live")[0] == 200


def test_a_port_in_use_is_an_os_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        follower = ModelFollower(WorkerConfig(**OPTIONS), store=HandFed())
        with pytest.raises(OSError, match="already in use|could not listen"):
            serve(InferenceApp(follower), "127.0.0.1", port)


def test_binary_tensors_and_the_table_form_give_the_record_forms_answers(server):
    port, _, _ = server
    records = [{"amount": 31.0, "country": "BR", "card_present": False},
               {"amount": 80.0, "country": "US", "card_present": True}]
    body = {"inputs": [{"name": "record", "datatype": "BYTES", "shape": [2],
                        "data": [json.dumps(r) for r in records]}]}
    expected = infer(port, body)[1]["outputs"][1]["data"]
    table = {"inputs": [
        {"name": "amount", "datatype": "FP64", "shape": [2, 1], "data": [[31.0], [80.0]]},
        {"name": "country", "datatype": "BYTES", "shape": [2], "data": ["BR", "US"]},
        {"name": "card_present", "datatype": "BOOL", "shape": [2], "data": [False, True]}]}
    assert infer(port, table)[1]["outputs"][1]["data"] == expected
    # Triton's binary tensors: the JSON head, then each element's length and bytes.
    import struct

    raw = b"".join(struct.pack("<I", len(e)) + e for e in (json.dumps(r).encode()
                                                             for r in records))
    head = json.dumps({"inputs": [{"name": "record", "datatype": "BYTES", "shape": [2],
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "outputs": [{"name": "predict_proba",
                                    "parameters": {"binary_data": True}}]}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/v2/models/fraud/infer", head + raw,
                       {"Inference-Header-Content-Length": str(len(head))})
    response = connection.getresponse()
    data = response.read()
    length = int(response.getheader("Inference-Header-Content-Length"))
    connection.close()
    answer = json.loads(data[:length])
    assert answer["outputs"][0]["parameters"]["binary_data_size"] == 32
    assert list(struct.unpack("<4d", data[length:])) == expected


def test_a_new_checkpoint_swaps_in_and_a_pinned_version_answers_as_before(server):
    port, follower, store = server
    first = infer(port, VALID)[1]
    task = trained(n=500)
    task.process(payments(800, start=500))
    store.put({("payments", 0): task.to_checkpoint()})
    second = _wait(lambda: (lambda a: a if a["model_version"] != first["model_version"]
                            else None)(infer(port, VALID)[1]))
    assert second["outputs"][1]["data"] != first["outputs"][1]["data"]
    pinned = infer(port, VALID, f"/v2/models/fraud/versions/{first['model_version']}/infer")[1]
    assert pinned["outputs"] == first["outputs"]
    # The in-process API gives the same numbers.
    scored = follower.predict([json.loads(VALID["inputs"][0]["data"][0])])
    assert scored.probabilities[0] == second["outputs"][1]["data"]
    assert scored.versions[0].version == second["model_version"]
    # A corrupt checkpoint: refused, the model before it serves on.
    store.put({("payments", 0): b"\x00garbage"})
    _wait(lambda: follower.counters.refused >= 1)
    assert infer(port, VALID)[1]["model_version"] == second["model_version"]


def test_topic_scope_serves_the_newest_checkpoint_of_any_partition_and_keys_route():
    store = HandFed(partitions=2)
    follower = ModelFollower(WorkerConfig(**OPTIONS, model_scope="topic"), store=store)
    older, newer = trained(partition=0, n=300), trained(partition=1, n=900)
    store.put({("payments", 0): older.to_checkpoint()})
    store.put({("payments", 1): newer.to_checkpoint()})
    with follower:
        _wait(lambda: follower.counters.loaded == 2)
        view = follower.view
        assert list(view.current) == [("payments", -1)]
        assert view.current[("payments", -1)].partition == 1  # the newest
        scored = follower.predict([{"amount": 3.0}], keys=[b"a"])
        assert scored.routes == ["topic"]
    # Partition scope: a key goes to its partition's model, no key to the most labelled one.
    store = HandFed(partitions=2)
    follower = ModelFollower(WorkerConfig(**OPTIONS), store=store)
    store.put({("payments", 0): older.to_checkpoint(), ("payments", 1): newer.to_checkpoint()})
    with follower:
        _wait(lambda: follower.counters.loaded == 2)
        from connectors.serving.partitioner import partition_of

        key = next(k for k in (b"k%d" % i for i in range(50)) if partition_of(k, 2) == 0)
        scored = follower.predict([{"amount": 3.0}, {"amount": 4.0}], keys=[key, None])
        assert [v.partition for v in scored.versions] == [0, 1] and scored.routes == [
            "key", "unkeyed"]
        with pytest.raises(RequestError, match="not kept"):
            follower.predict([{"amount": 3.0}], version="12345")


def _wait(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError("timed out")


def _outcome(follower, rows, keys=None):
    try:
        scored = follower.predict(rows, keys=keys)
    except RequestError as error:
        return ("refused", error.status, str(error))
    return (scored.labels, scored.probabilities, scored.classes,
            [v.version for v in scored.versions], scored.routes)


BATCH_FOLLOWERS = {}


def _batch_follower(model: str, scale: bool):
    """A follower of two partitions' checkpoints of `model` (multiclass for the CPM: three
    countries as labels), kept across examples."""
    found = BATCH_FOLLOWERS.get((model, scale))
    if found is None:
        options = dict(model=model, scale=scale)
        if model == "convexpolytope":
            options.update(label_field="country")
        store = HandFed(partitions=2)
        follower = ModelFollower(WorkerConfig(**{**OPTIONS, **options}), store=store)
        store.put({("payments", p): trained(partition=p, n=300 + 200 * p, **options)
                   .to_checkpoint() for p in (0, 1)})
        follower.start()
        _wait(lambda: follower.counters.loaded == 2)
        found = BATCH_FOLLOWERS[(model, scale)] = follower
    return found


_amounts = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.integers(-10**6, 10**6),
                     st.sampled_from([0.0, -0.0, 1e-300, 5e-324]))
_rows = st.fixed_dictionaries(
    {"amount": _amounts},
    optional={"country": st.sampled_from(["BR", "FR", "US", "JP"]), "card_present": st.booleans(),
              "tip": _amounts, "note": st.just(None), "bad": st.sampled_from(["x", 1e308 * 10])})


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["alma", "linearmpu", "convexpolytope"]), scale=st.booleans(),
       rows=st.lists(_rows, min_size=1, max_size=40),
       keyed=st.lists(st.sampled_from([None, b"a", b"b", b"card-7"]), min_size=40, max_size=40))
def test_a_requests_rows_scored_together_get_the_bits_each_gets_alone(model, scale, rows, keyed):
    """Rows of one version are predicted in one compiled call (`PartitionTask.predict_many`):
    every label, probability, version and route is what each row gets in a request of its own,
    and a row the model refuses is named as the per-row path names it."""
    follower = _batch_follower(model, scale)
    keys = keyed[:len(rows)]
    together = _outcome(follower, rows, keys)
    alone = [_outcome(follower, [row], [key]) for row, key in zip(rows, keys)]
    refused = [(i, found) for i, found in enumerate(alone) if found[0] == "refused"]
    if refused:
        i, (_, status, reason) = refused[0]
        assert together[:2] == ("refused", status)
        assert together[2] == reason.replace("record 0", f"record {i}", 1)
        return
    assert together[0] == [found[0][0] for found in alone]
    assert together[1] == [found[1][0] for found in alone]
    assert together[4] == [found[4][0] for found in alone]
    if model != "convexpolytope":
        assert together[2] == [False, True]
