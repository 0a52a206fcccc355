"""The HTTP side of `streammargin serve`: the Open Inference Protocol's REST endpoints
(KServe's `inference_rest.md`, v2) and Prometheus' /metrics, as an ASGI application served by
uvicorn (httptools' HTTP parser, llhttp, on uvloop's event loop: no HTTP parsing here).

Why uvicorn: `benchmarks/serving_http.py` runs this application's handler under each contender
on one core, driven by wrk (single-record infer requests at 4 connections), and uvicorn with
httptools and uvloop gave the most requests/s, at a p99 as low as Granian's (docs/serving.md,
"Why uvicorn"): it runs the whole request on one thread, where Granian (Rust) hands each request
between its threads and Python's. It runs in the process that runs the follower's thread: one
process holds the models, however many requests come.

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
path (404) or method (405). A request's head that does not come within the request timeout, or
passes `MAX_HEAD_BYTES`, closes its connection (`bounded_protocol`: uvicorn bounds neither).
At most `backpressure` requests are read and scored at once (the others wait, their bodies
unread); the handler runs on the event loop, and scoring holds the GIL anyway.
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
#: Seconds between two looks for request bodies past their deadline (`expire_reads`): a slow
#: body is answered 408 within `body_timeout` and this.
EXPIRY_INTERVAL = 0.25
#: Connections held at once (uvicorn's `limit_concurrency`: past it, a 503), and the bytes of a
#: request's head (its line and headers): with uvicorn's 64 KiB of body read ahead a
#: connection, what the connections hold is bounded (`sizing.SERVER_BYTES`).
MAX_CONNECTIONS = 256
MAX_HEAD_BYTES = 64 << 10
_JSON = [(b"content-type", b"application/json")]
_HEADER_LENGTH = HEADER_LENGTH.encode()
_encode = msgspec.json.Encoder().encode


class Response(typing.NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]
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
        # The body reads in flight (their deadlines), and those cancelled for being late.
        self._reads: dict[asyncio.Task, float] = {}
        self._expired: set[asyncio.Task] = set()
        self.backpressure(16)

    def backpressure(self, requests: int) -> None:
        """Read and score at most `requests` requests at once (the others wait)."""
        self._slots = asyncio.Semaphore(requests)

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
        one = len(versions) == 1
        if self.follower.view.scope == "partition":
            parameters["partitions"] = [first.partition] if one else list(
                dict.fromkeys(v.partition for v in versions))
        routes = scored.routes
        if len(routes) > 1:
            routes = list(dict.fromkeys(routes))
        parameters["routed_by"] = routes[0] if len(routes) == 1 else routes
        version = first.version if one else ",".join(v.version for v in versions)
        body, head = encode_response(self.model_name, version, rows.request_id, parameters,
                                     outputs)
        headers = _JSON if head is None else [
            (b"content-type", b"application/octet-stream"),
            (_HEADER_LENGTH, str(head).encode())]
        return Response(200, headers, body, "infer", n)

    def _metrics(self, accept: str) -> Response:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return Response(200, [(b"content-type", content_type.encode())],
                        encoder(self.registry), "metrics")

    # ASGI (uvicorn) ---------------------------------------------------------------------------

    async def __call__(self, scope: dict, receive: typing.Callable,
                       send: typing.Callable) -> None:
        if scope["type"] != "http":
            return  # (lifespan is off, websockets are not served)
        started = time.perf_counter()
        method = scope["method"]
        # (the path as sent, percent-escapes kept: a model name may hold a '/', escaped)
        path = scope["raw_path"].decode("latin-1")
        if method == "POST":
            declared = header_length = None
            for name, value in scope["headers"]:
                if name == b"content-length":
                    declared = value.decode("latin-1")
                elif name == _HEADER_LENGTH:
                    header_length = value.decode("latin-1")
            async with self._slots:
                body = await self._read(declared, receive)
                if body is None:
                    return  # (the client left: nobody to answer)
                response = body if type(body) is Response else self.infer(
                    path, body, header_length)
        elif method in ("GET", "HEAD"):
            accept = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"accept"),
                          "")
            response = self.get(path, accept)
        else:
            response = _error(405, f"{method} is not served: GET, or POST to .../infer", "other")
        body = response.body
        # (the length given: uvicorn would send the body chunked without it; a HEAD's is its
        # GET's)
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [*response.headers, (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})
        self.metrics.request(response.endpoint, response.status,
                             time.perf_counter() - started, response.records)

    async def _read(self, declared: str | None,
                    receive: typing.Callable) -> bytes | Response | None:
        """A request's body, read within the limits, or the error response (408 once
        `expire_reads` finds it past `body_timeout`), or None if the client left."""
        limit = self.max_request_bytes
        if declared is not None:
            if not declared.isdigit():
                return _error(400, f"Content-Length {declared[:40]!r} is not a number", "infer")
            if int(declared) > limit:
                return _error(413, f"the request body of {declared} bytes is above the limit of "
                                   f"{limit} (--max-request-bytes): send fewer records a "
                                   "request", "infer")
        task = asyncio.current_task()
        self._reads[task] = time.monotonic() + self.body_timeout
        try:
            chunks = []
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:  # (chunked: counted as it comes)
                    return _error(413, f"the request body is above the limit of {limit} bytes "
                                       "(--max-request-bytes): send fewer records a request",
                                  "infer")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except asyncio.CancelledError:
            if task not in self._expired:
                raise
            self._expired.discard(task)
            task.uncancel()
            return _error(408, f"the request body did not arrive within {self.body_timeout:g} s "
                               "(--request-timeout): send it whole, at once", "infer")
        finally:
            del self._reads[task]

    def expire_reads(self, now: float | None = None) -> int:
        """Cancel the body reads past their deadline (each then answers 408); how many.
        `serve` calls it every `EXPIRY_INTERVAL` seconds on the event loop: one timer for all
        the requests, where a timer a request would cost each a few microseconds."""
        now = time.monotonic() if now is None else now
        late = [task for task, deadline in self._reads.items()
                if deadline <= now and task not in self._expired]
        for task in late:
            self._expired.add(task)
            task.cancel()
        return len(late)


def _label_type(classes: list) -> str:
    if len(classes) == 2 and classes[0] is False and classes[1] is True:
        return "BOOL"  # (a binary model's: every response of one)
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
    """Serve `app` with uvicorn (httptools' parser, uvloop's event loop) in this process, on the
    calling thread, until SIGTERM or SIGINT, or until `watch()` (called every half second) says
    to stop. `request_timeout` bounds how long a request's head and its body may take to
    arrive (a slow head: the connection is closed; a slow body: 408) and how long an idle
    connection is kept; `backpressure` how many requests are read and scored at once (the
    others wait, their bodies unread); at most `MAX_CONNECTIONS` connections are held (past
    them, uvicorn answers 503)."""
    import uvicorn

    app.backpressure(backpressure)
    try:
        import uvloop  # noqa: F401  (the serve extra installs it)
    except ImportError:
        loop_name = "asyncio"
    else:
        # uvloop's event loop (libuv): cheaper per request than asyncio's own
        # (benchmarks/serving_http.py measures both).
        loop_name = "uvloop"
    config = uvicorn.Config(
        app, host=host, port=port, loop=loop_name,
        http=bounded_protocol(request_timeout, refused=app.metrics.refused),
        # (uvicorn's WARNINGs are a client's doing, one line a bad request: a flood at will;
        # its ERRORs, an exception in this application, are a bug and stay loud)
        lifespan="off", ws="none", interface="asgi3", log_config=None, log_level="error",
        access_log=False, server_header=False, date_header=False, backlog=backlog,
        limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=max(1, int(request_timeout)),
        timeout_graceful_shutdown=request_timeout)
    server = uvicorn.Server(config)

    async def main() -> None:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            # uvicorn takes SIGTERM and SIGINT while it serves, then puts back the handlers it
            # found and raises the signal again: with these, that ends nothing more than the
            # serving (exit 0), where the default handlers would kill the process.
            def stop(signum: int, frame: typing.Any) -> None:
                server.should_exit = True

            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, stop)
        task = asyncio.ensure_future(server.serve())
        loop = asyncio.get_running_loop()
        if started is not None:
            loop.call_later(0.2, started)
        watched = time.monotonic()
        while not task.done():
            await asyncio.wait([task], timeout=EXPIRY_INTERVAL)
            app.expire_reads()
            if watch is not None and time.monotonic() - watched >= 0.5:
                watched = time.monotonic()
                if not task.done() and watch():
                    server.should_exit = True
        task.result()

    # Python's GIL switch interval, shorter: the follower's thread decodes each new checkpoint
    # (milliseconds of Python), and a request waiting for the GIL meanwhile waits up to this
    # interval (5 ms by default, a p99 of its own).
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        if loop_name == "uvloop":
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())
    except SystemExit:  # (uvicorn's way out of a bind that failed, having logged why)
        raise OSError(f"could not listen on {host}:{port}") from None


def bounded_protocol(head_timeout: float, max_head_bytes: int = MAX_HEAD_BYTES,
                     refused: typing.Callable[[str], None] | None = None) -> type:
    """uvicorn's httptools protocol, with a bound on the time and the bytes of a request's head,
    which uvicorn bounds neither of: a connection whose request head does not come whole within
    `head_timeout` seconds of its start (or of the connection's) is closed, one whose head passes
    `max_head_bytes` gets a 400 and is closed. Each connection ended so, or by uvicorn itself
    (a request it cannot parse: 400; past its connection limit: 503), is told to `refused`
    with its reason (`metrics.REFUSALS`)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    tell = refused if refused is not None else (lambda reason: None)

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: typing.Any) -> None:
            super().connection_made(transport)
            self._head_bytes = 0
            self._told = False  # (this connection's 400 is told already: its head's size)
            self._head_timer = self.loop.call_later(head_timeout, self._head_late)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None and not self.transport.is_closing():
                # (still in a head: everything read meanwhile counts, a body's first bytes
                # too, so the bound is on what the parser holds at most)
                self._head_bytes += len(data)
                if self._head_bytes > max_head_bytes:
                    self._disarm()
                    tell("head_too_large")
                    self._told = True
                    self.send_400_response(f"the request head is above {max_head_bytes} bytes")

        def send_400_response(self, msg: str) -> None:
            if not self._told:
                tell("unparsable")  # (uvicorn's own 400: the parser refused the request)
            self._told = False
            super().send_400_response(msg)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._head_timer is None:
                self._head_bytes = 0
                self._head_timer = self.loop.call_later(head_timeout, self._head_late)

        def on_headers_complete(self) -> None:
            self._disarm()
            limit = self.limit_concurrency
            if limit is not None and (len(self.connections) >= limit
                                      or len(self.tasks) >= limit):
                tell("too_many_connections")  # (uvicorn answers it 503, as below)
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                tell("head_timeout")
                self.transport.close()

    return BoundedHttpToolsProtocol
