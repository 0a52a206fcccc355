"""Which HTTP layer serves the models: requests/s and latency of Open Inference Protocol infer
requests, each contender's server pinned to one core, driven by wrk (Debian's `wrk`, a load
generator this project did not write) on the other.

    python benchmarks/serving_http.py --rounds 3 --seconds 10

Contenders (each in a process of its own, `taskset -c 0`; wrk on core 1, 1 thread):

- `serve`: `streammargin serve`'s app (connectors/serving/app.py, ASGI) as it serves it:
  uvicorn with httptools and uvloop, the follower's thread beside it;
- `granian-rsgi`: the same handler behind an RSGI adapter on Granian (a Rust server, hyper and
  tokio), embedded;
- `aiohttp`: the same handler in an aiohttp.web application;
- `fastapi`: the baseline a team would write: FastAPI + uvicorn, pydantic models of the request,
  the same model and scaler (the same checkpoint) called by hand on each record.

Every contender answers the same single-record request (a payments record of 12 fields, two of
them categories, through the workers' mapping and `--scale`), and the served contenders a batch
of 1,000 records, in the record form and as a table. The contenders take turns, `--rounds` times;
the table gives each one's median requests/s, p50 and p99 latency (wrk's), and its ratio to the
baseline's requests/s.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import typing

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTENDERS = ("serve", "granian-rsgi", "aiohttp", "fastapi")
MODEL_NAME = "fraud"


def payment(rng: random.Random, i: int, labelled: bool = True) -> dict:
    record = {"transaction_id": f"t{i}", "amount": round(rng.lognormvariate(3, 1), 2),
              "country": rng.choice(["BR", "FR", "US", "DE", "IN"]),
              "merchant_category": rng.choice(["travel", "food", "games", "fuel"]),
              "card_present": rng.random() < 0.6, "hour": rng.randrange(24),
              **{f"v{k}": round(rng.gauss(0, 1), 4) for k in range(6)}}
    if labelled:
        record["is_fraud"] = record["amount"] > 60 and not record["card_present"]
    return record


def worker_config() -> typing.Any:
    from connectors.worker.config import WorkerConfig

    return WorkerConfig(topics=["payments"], group_id=MODEL_NAME, features=("*",),
                        label_field="is_fraud", id_field="transaction_id", scale=True)


def make_checkpoint(path: pathlib.Path) -> None:
    """A checkpoint of a worker's task that learnt 20,000 payments."""
    import collections

    from connectors.task import PartitionTask

    record = collections.namedtuple("Record", "topic partition offset timestamp key value headers")
    rng = random.Random(7)
    task = PartitionTask.new("payments", 0, worker_config().task_settings())
    records = [record("payments", 0, i, 0, None, json.dumps(payment(rng, i)).encode(), [])
               for i in range(20_000)]
    task.process(records)
    path.write_bytes(task.to_checkpoint())


def bodies(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    rng = random.Random(11)
    one = [json.dumps(payment(rng, 0, labelled=False))]
    batch = [payment(rng, i, labelled=False) for i in range(1_000)]
    single = {"inputs": [{"name": "record", "datatype": "BYTES", "shape": [1], "data": one}]}
    records = {"inputs": [{"name": "record", "datatype": "BYTES", "shape": [1000],
                           "data": [json.dumps(r) for r in batch]}]}
    fields = [k for k in batch[0] if k != "transaction_id"]
    types = {bool: "BOOL", str: "BYTES", int: "INT64", float: "FP64"}
    table = {"inputs": [{"name": f, "datatype": types[type(batch[0][f])], "shape": [1000],
                         "data": [r[f] for r in batch]} for f in fields]}
    out = {}
    for name, body in (("single", single), ("batch-records", records), ("batch-table", table)):
        out[name] = folder / f"{name}.json"
        out[name].write_text(json.dumps(body))
    return out


# The contenders' servers ---------------------------------------------------------------------


class _StaticStore:
    """A checkpoint store that hands the follower one checkpoint, then nothing new."""

    def __init__(self, payload: bytes):
        self.payload, self.given = payload, False

    def partitions_of(self, topic: str) -> set[int]:
        return {0}

    def follow(self, keys: list) -> dict:
        from connectors.state.checkpoint import LoadedCheckpoint

        if self.given:
            time.sleep(0.1)
            return {}
        self.given = True
        return {("payments", 0): LoadedCheckpoint("k", self.payload, "checkpoints", 0, 1, 0)}

    def close(self) -> None:
        pass


def served_app(checkpoint: pathlib.Path) -> typing.Any:
    from connectors.serving import ModelFollower
    from connectors.serving.app import InferenceApp

    follower = ModelFollower(worker_config(), store=_StaticStore(checkpoint.read_bytes()))
    follower.start()
    assert follower.wait_ready(30)
    return InferenceApp(follower)


def run_serve(checkpoint: pathlib.Path, port: int) -> None:
    from connectors.serving.app import serve

    serve(served_app(checkpoint), "127.0.0.1", port)


def run_granian(checkpoint: pathlib.Path, port: int) -> None:
    import uvloop
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    app = served_app(checkpoint)

    class RSGI:
        async def __rsgi__(self, scope, protocol):
            if scope.proto != "http":
                return
            if scope.method == "POST":
                response = app.infer(scope.path, await protocol(),
                                     scope.headers.get("inference-header-content-length"))
            else:
                response = app.get(scope.path)
            protocol.response_bytes(response.status, [(k.decode(), v.decode()) for k, v in
                                                      response.headers], response.body)

    server = Server(RSGI(), address="127.0.0.1", port=port, interface=Interfaces.RSGI,
                    http=HTTPModes.http1, websockets=False, backpressure=16, log_enabled=False)
    uvloop.run(server.serve())


def run_aiohttp(checkpoint: pathlib.Path, port: int) -> None:
    from aiohttp import web

    app = served_app(checkpoint)

    async def handle(request: web.Request) -> web.Response:
        if request.method == "POST":
            response = app.infer(request.path, await request.read())
        else:
            response = app.get(request.path)
        return web.Response(status=response.status, body=response.body,
                            content_type="application/json")

    web_app = web.Application(client_max_size=32 << 20)
    web_app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(web_app, host="127.0.0.1", port=port, access_log=None, print=None)


def run_fastapi(checkpoint: pathlib.Path, port: int) -> None:
    """The baseline: what a team would write by hand around the same River pipeline."""
    import typing as t

    import uvicorn
    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel

    from connectors.task import PartitionTask

    task = PartitionTask.restore(checkpoint.read_bytes(), "payments", 0,
                                 worker_config().task_settings())
    scaler, model = task.scaler, task.model

    class Tensor(BaseModel):
        name: str
        datatype: str
        shape: list[int]
        data: list[t.Any]

    class InferRequest(BaseModel):
        inputs: list[Tensor]
        id: str | None = None

    app = FastAPI()

    def infer(name: str, request: InferRequest) -> dict:
        if name != MODEL_NAME:
            raise HTTPException(404, "unknown model")
        labels, probas = [], []
        for value in request.inputs[0].data:
            record = json.loads(value)
            numbers, indicators = {}, {}
            for field, v in record.items():
                if field in ("transaction_id", "is_fraud"):
                    continue
                if isinstance(v, str):
                    indicators[f"{field}={v}"] = True
                else:
                    numbers[field] = int(v) if isinstance(v, bool) else v
            x = scaler.transform_one(numbers)
            x.update(indicators)
            p = model.predict_proba_one(x).get(True, 0.0)
            labels.append(model.predict_one(x))
            probas += [1.0 - p, p]
        n = len(labels)
        return {"model_name": name, "outputs": [
            {"name": "predict", "datatype": "BOOL", "shape": [n], "data": labels},
            {"name": "predict_proba", "datatype": "FP64", "shape": [n, 2], "data": probas}]}

    # (the annotations are strings under `from __future__ import annotations`: FastAPI is given
    # the classes, as a module that defines its models at the top would give them)
    infer.__annotations__.update({"name": str, "request": InferRequest, "return": dict})
    app.post("/v2/models/{name}/infer")(infer)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


SERVERS = {"serve": run_serve, "granian-rsgi": run_granian, "aiohttp": run_aiohttp,
           "fastapi": run_fastapi}


# Driving them --------------------------------------------------------------------------------


LUA = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("SERVING_BODY"), "rb")
wrk.body = f:read("*a")
f:close()
local shown = false
response = function(status, headers, body)
  if status ~= 200 and not shown then
    io.stderr:write("answered " .. status .. ": " .. body .. "\n")
    shown = true
  end
end
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(contender: str, checkpoint: pathlib.Path, port: int,
                 core: str) -> subprocess.Popen:
    argv = ["taskset", "-c", core, sys.executable, __file__, "--server", contender,
            "--checkpoint", str(checkpoint), "--port", str(port)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{contender} exited: {process.stderr.read().decode()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                if sock.recv(100).startswith(b"HTTP/1.1 "):
                    return process
        except OSError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"{contender} did not answer in 120 s")


def wrk(port: int, body: pathlib.Path, seconds: float, connections: int,
        core: str) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(LUA)
    url = f"http://127.0.0.1:{port}/v2/models/{MODEL_NAME}/infer"
    argv = ["taskset", "-c", core, "wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s",
            "--latency", "-s", script.name, url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60,
                          env={**os.environ, "SERVING_BODY": str(body)})
    out = done.stdout
    os.unlink(script.name)
    if "Non-2xx" in out:
        raise RuntimeError(f"non-2xx answers:\n{out}{done.stderr[:2000]}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    found = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    return {"rps": rate, "p50_ms": _ms(found["50"]), "p99_ms": _ms(found["99"])}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS))
    parser.add_argument("--server-core", default="0")
    parser.add_argument("--wrk-core", default="1")
    parser.add_argument("--server", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.server:
        from connectors.cli.kafka_command import _collector_for_a_worker

        # Every contender with the collector `streammargin serve` sets (its heap frozen).
        with _collector_for_a_worker():
            SERVERS[args.server](pathlib.Path(args.checkpoint), args.port)
        return
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install -y wrk")
    folder = pathlib.Path(tempfile.mkdtemp(prefix="serving-http-"))
    checkpoint = folder / "checkpoint.bin"
    make_checkpoint(checkpoint)
    files = bodies(folder)
    results: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(args.rounds):
        for contender in args.contenders:
            port = free_port()
            process = start_server(contender, checkpoint, port, args.server_core)
            try:
                wrk(port, files["single"], 2, args.connections, args.wrk_core)  # warm-up
                kinds = [("single", args.connections)]
                if contender != "fastapi":
                    kinds += [("batch-records", 1), ("batch-table", 1)]
                for kind, connections in kinds:
                    found = wrk(port, files[kind], args.seconds, connections, args.wrk_core)
                    results.setdefault((contender, kind), []).append(found)
                    print(f"round {round_ + 1} {contender:13} {kind:14} {found['rps']:9.0f} "
                          f"req/s  p50 {found['p50_ms']:.2f} ms  p99 {found['p99_ms']:.2f} ms",
                          flush=True)
            finally:
                process.terminate()
                process.wait(10)
    baseline = statistics.median(r["rps"] for r in results.get(("fastapi", "single"), [{
        "rps": float("nan")}]))
    print(f"\n{args.connections} connections on one core (taskset -c {args.server_core}), "
          f"{args.rounds} rounds of {args.seconds:g} s, medians:\n")
    print("| contender | request | requests/s | records/s | p50 ms | p99 ms | vs fastapi |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for (contender, kind), found in results.items():
        rps = statistics.median(r["rps"] for r in found)
        records = rps * (1 if kind == "single" else 1000)
        ratio = f"{rps / baseline:.2f}x" if kind == "single" else ""
        print(f"| {contender} | {kind} | {rps:,.0f} | {records:,.0f} | "
              f"{statistics.median(r['p50_ms'] for r in found):.2f} | "
              f"{statistics.median(r['p99_ms'] for r in found):.2f} | {ratio} |")
    # Each round's ratio to the baseline measured beside it (the contenders took turns).
    baseline_rounds = [r["rps"] for r in results.get(("fastapi", "single"), [])]
    for (contender, kind), found in results.items():
        if kind == "single" and contender != "fastapi" and len(found) == len(baseline_rounds):
            ratios = [r["rps"] / b for r, b in zip(found, baseline_rounds)]
            print(f"\n{contender} against fastapi, round by round: "
                  f"{', '.join(f'{x:.2f}x' for x in ratios)} (median "
                  f"{statistics.median(ratios):.2f}x)", end="")
    print()


if __name__ == "__main__":
    main()
