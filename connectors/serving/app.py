"""The HTTP side of `streammargin serve`: the Open Inference Protocol's REST endpoints
(KServe's `inference_rest.md`, v2) and Prometheus' /metrics, as an RSGI application served by
Granian (a Rust HTTP server, hyper and tokio: no HTTP parsing here).

Why Granian, and RSGI: `benchmarks/serving_http.py` ran this application's handler under each
contender on one core, driven by wrk (single-record infer requests at 4 connections), and
Granian's RSGI interface gave the most requests/s at the lowest p99 (docs/serving.md, "Why
Granian"). It runs embedded (`granian.server.embed`) in the process that runs the follower's
thread: one process holds the models, however many requests come.

Endpoints (the `/versions/{v}` forms pin a version kept):

    GET  /v2/health/live                              200 {"live": true}
    GET  /v2/health/ready                             200 {"ready": true}, 400 not ready
    GET  /v2                                          server metadata
    GET  /v2/models/{name}[/versions/{v}]             model metadata
    GET  /v2/models/{name}[/versions/{v}]/ready       200, or 400 not ready
    POST /v2/models/{name}[/versions/{v}]/infer       inference
    GET  /metrics                                     Prometheus (or OpenMetrics)

Readiness answers 400 when false, as the protocol says (a 4xx), which every probe reads as a
failure. Every error is a 4xx with `{"error": "..."}` naming the field and the fix: a body above
`max_request_bytes` (413, refused from its Content-Length before it is read, or as soon as it
passes the limit), a body that does not come within `body_timeout` seconds (408), an unknown
path (404) or method (405). A request is answered before the next is taken: the handler runs on
the event loop, and scoring holds the GIL anyway.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import typing
import urllib.parse

import msgspec

from connectors.serving.metrics import ServingMetrics, metrics_registry
from connectors.serving.protocol import (
    HEADER_LENGTH,
    KEY_INPUT,
    OUTPUT_NAMES,
    RECORD_INPUT,
    RequestError,
    encode_response,
    error_body,
    parse_infer,
)

__all__ = ["InferenceApp", "Response", "serve", "SERVER_NAME"]

log = logging.getLogger("connectors.serving")

SERVER_NAME = "streammargin"
#: The GIL's switch interval while serving (see `serve`).
SWITCH_INTERVAL = 0.0005
_JSON = [("content-type", "application/json")]
_encode = msgspec.json.Encoder().encode


class Response(typing.NamedTuple):
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    endpoint: str
    records: int = 0


def _json(status: int, value: typing.Any, endpoint: str) -> Response:
    return Response(status, _JSON, _encode(value), endpoint)


def _error(status: int, message: str, endpoint: str) -> Response:
    return Response(status, _JSON, error_body(message), endpoint)


class InferenceApp:
    """The endpoints of one model, served from a `ModelFollower`'s view.

    Parameters
    ----------
    follower
        The `ModelFollower` whose models answer (started by the caller).
    metrics
        Where requests are counted (`ServingMetrics`).
    max_request_bytes
        A request body above this is refused (413) before or while it is read.
    body_timeout
        Seconds a request's body may take to arrive (then 408): a slow client holds no more.

    """

    def __init__(self, follower: typing.Any, metrics: ServingMetrics | None = None,
                 max_request_bytes: int = 16 << 20, body_timeout: float = 10.0):
        self.follower = follower
        self.metrics = metrics if metrics is not None else ServingMetrics()
        follower.on_first_answer = self.metrics.answered_first
        follower.on_load = self.metrics.loaded
        self.max_request_bytes = max_request_bytes
        self.body_timeout = body_timeout
        self.registry = metrics_registry(follower, self.metrics)
        self.model_name = follower.model_name
        # The infer path of the served model, unpinned: the requests that matter, taken
        # without splitting the path.
        self._infer_path = f"/v2/models/{urllib.parse.quote(self.model_name, safe='')}/infer"

    # Plain functions of a request (the benchmarks run them under each contender) --------------

    def get(self, path: str, accept: str = "") -> Response:
        """The answer to a GET of `path`."""
        if path == "/v2/health/live":
            return _json(200, {"live": True}, "live")
        if path == "/v2/health/ready":
            ready, why = self.follower.readiness()
            return _json(200 if ready else 400, {"ready": ready, "reason": why}, "ready")
        if path in ("/v2", "/v2/"):
            return _json(200, {"name": SERVER_NAME, "version": _version(), "extensions": [
                "binary_tensor_data"]}, "server_metadata")
        if path == "/metrics":
            return self._metrics(accept)
        found = self._model_path(path, "GET")
        if isinstance(found, Response):
            return found
        version, action = found
        if action == "ready":
            ready, why = self.follower.readiness()
            if version is not None:
                ready, why = True, f"version {version.version} is kept"
            return _json(200 if ready else 400,
                         {"name": self.model_name, "ready": ready, "reason": why}, "model_ready")
        return _json(200, self._metadata(version), "model_metadata")

    def infer(self, path: str, body: bytes, header_length: str | None = None) -> Response:
        """The answer to a POST of `body` to `path`."""
        if path == self._infer_path:
            pinned, action = None, "infer"
        else:
            found = self._model_path(path, "POST")
            if isinstance(found, Response):
                return found
            pinned, action = found
        try:
            if action != "infer":
                raise RequestError(405, f"POST {path[:200]}: only .../infer takes a POST")
            rows = parse_infer(body, header_length, self.follower.limits)
            scored = self.follower.score(rows, pinned)
        except RequestError as error:
            return _error(error.status, str(error), "infer")
        return self._response(rows, scored)

    def _model_path(self, path: str,
                    method: str) -> tuple[typing.Any, str | None] | Response:
        """(the version pinned or None, "ready" / "infer" / None) of a model path, or the
        error response."""
        parts = path.strip("/").split("/")
        endpoint = "infer" if method == "POST" else "model_metadata"
        if len(parts) < 3 or parts[:2] != ["v2", "models"]:
            return _error(404, f"no endpoint at {path[:200]!r}: see /v2/models/"
                               f"{self.model_name} and /v2/health/ready", "other")
        name = urllib.parse.unquote(parts[2])
        if name != self.model_name:
            return _error(404, f"unknown model {name[:100]!r}: this server serves "
                               f"{self.model_name!r} (--model-name)", endpoint)
        rest = parts[3:]
        pinned = None
        if len(rest) >= 2 and rest[0] == "versions":
            try:
                pinned = self.follower.pinned(urllib.parse.unquote(rest[1]))
            except RequestError as error:
                return _error(error.status, str(error), endpoint)
            rest = rest[2:]
        if not rest:
            if method != "GET":
                return _error(405, f"POST {path[:200]}: POST to .../infer", endpoint)
            return pinned, None
        if len(rest) == 1 and rest[0] in ("ready", "infer"):
            if (rest[0] == "infer") != (method == "POST"):
                allowed = "POST" if rest[0] == "infer" else "GET"
                return _error(405, f"{method} {path[:200]}: use {allowed}", endpoint)
            return pinned, rest[0]
        return _error(404, f"no endpoint at {path[:200]!r}: .../ready, .../infer or the model's "
                           "metadata", endpoint)

    def _metadata(self, pinned: typing.Any) -> dict:
        follower = self.follower
        view = follower.view
        served = pinned or view.newest()
        classes = served.classes if served is not None else (
            [False, True] if not follower.settings.multiclass else [])
        versions = sorted(view.versions.values(), key=lambda v: v.loaded_at)
        config = follower.config
        mapping = follower.settings.field_mapping()
        return {
            "name": self.model_name,
            "versions": [v.version for v in versions],
            "platform": f"{SERVER_NAME}-{follower.settings.model_name}",
            "inputs": [
                {"name": RECORD_INPUT, "datatype": "BYTES", "shape": [-1]},
                {"name": KEY_INPUT, "datatype": "BYTES", "shape": [-1]},
            ],
            "outputs": [
                {"name": OUTPUT_NAMES[0], "datatype": _label_type(classes), "shape": [-1]},
                {"name": OUTPUT_NAMES[1], "datatype": "FP64", "shape": [-1, len(classes)]},
            ],
            "parameters": {
                "group": config.group_id,
                "topics": list(view.topics),
                "model_scope": view.scope,
                "model": follower.settings.model_name,
                "classes": classes,
                "features": list(mapping.features),
                "exclude_features": list(mapping.exclude_features),
                "label_field": mapping.label_field,
                "categorical": mapping.categorical,
                "scale": follower.settings.scale,
                "key_partitioner": view.partitioner,
                "input_forms": ("one BYTES input 'record' (each element a record's JSON as "
                                "written to the topic), or one input per field named by its "
                                "PATH; an optional BYTES input 'key' (or parameter 'key')"),
                "models": [v.describe() for v in sorted(view.current.values(),
                                                         key=lambda v: (v.topic, v.partition))],
                **({"version": pinned.describe()} if pinned is not None else {}),
            },
        }

    def _response(self, rows: typing.Any, scored: typing.Any) -> Response:
        n = len(scored.labels)
        classes = scored.classes
        datatype = _label_type(classes)
        labels = scored.labels
        if datatype == "BYTES":
            labels = ["" if y is None else _label_text(y) for y in labels]
        outputs = []
        for name, binary in rows.outputs:
            if name == "predict":
                outputs.append((name, binary, datatype, [n], labels))
            else:
                flat = [p for row in scored.probabilities for p in row]
                outputs.append((name, binary, "FP64", [n, len(classes)], flat))
        versions = scored.versions
        first = versions[0]
        parameters: dict[str, typing.Any] = {
            "topic": first.topic,
            "classes": classes,
            "written_at": first.written_at,
        }
        if self.follower.view.scope == "partition":
            parameters["partitions"] = list(dict.fromkeys(v.partition for v in versions))
        routes = list(dict.fromkeys(scored.routes))
        parameters["routed_by"] = routes[0] if len(routes) == 1 else routes
        body, head = encode_response(self.model_name, ",".join(v.version for v in versions),
                                     rows.request_id, parameters, outputs)
        headers = _JSON if head is None else [("content-type", "application/octet-stream"),
                                              ("inference-header-content-length", str(head))]
        return Response(200, headers, body, "infer", n)

    def _metrics(self, accept: str) -> Response:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return Response(200, [("content-type", content_type)], encoder(self.registry), "metrics")

    # RSGI (Granian) ---------------------------------------------------------------------------

    async def __rsgi__(self, scope: typing.Any, protocol: typing.Any) -> None:
        started = time.perf_counter()
        if scope.proto != "http":
            return
        method = scope.method
        path = scope.path
        if method == "POST":
            headers = scope.headers
            body = await self._read(headers, protocol)
            response = body if type(body) is Response else self.infer(
                path, body, headers.get(HEADER_LENGTH))
        elif method in ("GET", "HEAD"):
            response = self.get(path, scope.headers.get("accept", ""))
        else:
            response = _error(405, f"{method} is not served: GET, or POST to .../infer", "other")
        protocol.response_bytes(response.status, response.headers,
                                b"" if method == "HEAD" else response.body)
        self.metrics.request(response.endpoint, response.status,
                             time.perf_counter() - started, response.records)

    async def _read(self, headers: typing.Any, protocol: typing.Any) -> bytes | Response:
        """A request's body, read within the limits, or the error response."""
        limit = self.max_request_bytes
        declared = headers.get("content-length")
        try:
            async with asyncio.timeout(self.body_timeout):
                if declared is not None:
                    if not declared.isdigit():
                        return _error(400, f"Content-Length {declared[:40]!r} is not a number",
                                      "infer")
                    if int(declared) > limit:
                        return _error(413, f"the request body of {declared} bytes is above the "
                                           f"limit of {limit} (--max-request-bytes): send fewer "
                                           "records a request", "infer")
                    # A body of a declared length within the limit: read whole, in one await
                    # (the stream's chunks cost an await each; HTTP/1.1 holds the client to its
                    # length).
                    return await protocol()
                chunks = []
                size = 0
                async for chunk in protocol:  # (chunked: counted as it comes)
                    size += len(chunk)
                    if size > limit:
                        return _error(413, f"the request body is above the limit of {limit} "
                                           "bytes (--max-request-bytes): send fewer records a "
                                           "request", "infer")
                    chunks.append(chunk)
        except TimeoutError:
            return _error(408, f"the request body did not arrive within {self.body_timeout:g} s "
                               "(--request-timeout): send it whole, at once", "infer")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _label_type(classes: list) -> str:
    kinds = {type(c) for c in classes}
    if not classes or kinds == {bool}:
        return "BOOL"
    if kinds == {int}:
        return "INT64"
    return "BYTES"


def _label_text(label: typing.Any) -> str:
    from connectors.observability.metrics import label_key

    return label_key(label)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("streammargin")
    except PackageNotFoundError:
        return "unknown"


def serve(app: InferenceApp, host: str, port: int, request_timeout: float = 10.0,
          backlog: int = 1024, backpressure: int = 16,
          started: typing.Callable[[], None] | None = None,
          watch: typing.Callable[[], bool] | None = None) -> None:
    """Serve `app` with Granian, embedded in this process (its event loop on the calling thread,
    tokio's on threads of its own), until SIGTERM or SIGINT, or until `watch()` (called every
    half second) says to stop. `request_timeout` bounds how long a request's headers may take
    to arrive (a slow client is dropped); `backpressure` how many requests are taken at once
    (the others wait in the listen queue of `backlog`)."""
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.server.embed import Server

    # Granian says that its embedded server is experimental on every start: what is tested
    # here is what this module uses (tests/test_serving.py, benchmarks/serving_http.py).
    logging.getLogger("_granian").setLevel(logging.ERROR)
    logging.getLogger("granian").setLevel(logging.ERROR)
    server = Server(app, address=host, port=port, interface=Interfaces.RSGI,
                    http=HTTPModes.http1, websockets=False, backlog=backlog,
                    backpressure=backpressure, log_enabled=False,
                    http1_settings=HTTP1Settings(header_read_timeout=int(request_timeout * 1000)))

    async def main() -> None:
        import signal

        import threading

        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, server.stop)
        task = asyncio.ensure_future(server.serve())
        if started is not None:
            loop.call_later(0.2, started)
        while not task.done():
            await asyncio.wait([task], timeout=0.5)
            if watch is not None and not task.done() and watch():
                server.stop()
        task.result()

    # Python's GIL switch interval, shorter: the follower's thread decodes each new checkpoint
    # (milliseconds of Python), and a request waiting for the GIL meanwhile waits up to this
    # interval (5 ms by default, a p99 of its own).
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        import uvloop
    except ImportError:  # (the serve extra installs it)
        asyncio.run(main())
    else:
        # uvloop's event loop (libuv): Granian hands each request to it, and asyncio's own
        # loop costs more per request (benchmarks/serving_http.py).
        uvloop.run(main())
