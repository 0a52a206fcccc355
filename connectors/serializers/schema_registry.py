"""A Schema Registry client: schemas by id, cached within bounds; output schemas registered.

It speaks the REST API of Confluent's Schema Registry (and of the registries that implement it:
Apicurio's `/apis/ccompat/v7`, Karapace, Redpanda), and takes confluent-kafka's configuration
names (`--schema-registry-config KEY=VALUE`):

    url                             the registry, or several, comma-separated (the first that
                                    answers serves; userinfo in the URL is basic auth)
    basic.auth.credentials.source   USER_INFO (the default) or URL
    basic.auth.user.info            USER:PASSWORD
    bearer.auth.credentials.source  STATIC_TOKEN, with bearer.auth.token (and, for Confluent
                                    Cloud, bearer.auth.logical.cluster and
                                    bearer.auth.identity.pool.id)
    ssl.ca.location                 a CA file or folder (the system's by default)
    ssl.certificate.location        the client certificate, with ssl.key.location and
                                    ssl.key.password
    timeout                         seconds for one request (default 10)
    cache.capacity                  the schemas kept (default 1000)

Anything the registry sends is untrusted: a response is read up to `max_schema_bytes` (larger
ones are refused unread), parsed as JSON of a fixed shape, and the schema it holds is parsed by
its format's own bounded parser (`connectors.serializers.avro`, `.protobuf`, `.json_schema`).

What each outcome is:

- a schema that parses: cached by id (`cache.capacity` entries and `max_cache_bytes` of schema
  text, the least recently used going first), so a worker asks once per id;
- an unknown id (404), or a schema that its parser refuses: `SchemaRefused`, a dead letter, and
  cached as such (for `REFUSED_TTL_S`, then asked again);
- no answer (a refused connection, a timeout, a 5xx or 429): `RegistryUnavailable`, an outage:
  the worker waits and asks again, as for a broker, and dead-letters nothing meanwhile;
- 401 or 403: `RegistryRefused`, which stops the worker with the fix (the credentials).
"""

from __future__ import annotations

import base64
import collections
import http.client
import json
import logging
import os
import ssl
import time
import typing
import urllib.parse

from connectors.codec import DeadLetter

__all__ = [
    "SchemaRegistry",
    "RegisteredSchema",
    "RegistryUnavailable",
    "RegistryRefused",
    "SchemaRefused",
    "UnknownSchema",
    "REGISTRY_SETTINGS",
    "SCHEMA_TYPES",
    "DEFAULT_MAX_SCHEMA_BYTES",
    "DEFAULT_MAX_CACHE_BYTES",
]

log = logging.getLogger("streammargin.kafka")

#: The `schemaType` values of the registry's API (absent means AVRO).
SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")
#: The confluent-kafka settings this client takes.
REGISTRY_SETTINGS = (
    "url", "basic.auth.credentials.source", "basic.auth.user.info",
    "bearer.auth.credentials.source", "bearer.auth.token", "bearer.auth.logical.cluster",
    "bearer.auth.identity.pool.id", "ssl.ca.location", "ssl.certificate.location",
    "ssl.key.location", "ssl.key.password", "timeout", "cache.capacity",
)
# confluent-kafka settings of features this client does not have, with what to do instead.
_NOT_SUPPORTED = {
    "proxy": "reach the registry directly, or through a proxy that forwards its port",
    "bearer.auth.client.id": "fetch the token yourself and give bearer.auth.token "
                             "(bearer.auth.credentials.source=STATIC_TOKEN)",
    "bearer.auth.client.secret": "as bearer.auth.client.id",
    "bearer.auth.scope": "as bearer.auth.client.id",
    "bearer.auth.issuer.endpoint.url": "as bearer.auth.client.id",
}
#: A response, and so a schema, larger than this is refused unread.
DEFAULT_MAX_SCHEMA_BYTES = 1 << 20
#: The schema text the cache keeps in all.
DEFAULT_MAX_CACHE_BYTES = 32 << 20
#: A refused id (unknown, unparsable) is asked again after this long: a registry restored from
#: a backup may know it then. Within it, its records are dead letters without a request each.
REFUSED_TTL_S = 60.0
#: References followed from one schema (Protobuf imports, Avro and JSON Schema references), in
#: all and in depth.
MAX_REFERENCES = 64
MAX_REFERENCE_DEPTH = 8


class RegistryUnavailable(RuntimeError):
    """The registry did not answer (connection refused, timeout, 5xx, 429): an outage."""


class RegistryRefused(RuntimeError):
    """The registry refused this client (401, 403): the credentials need fixing."""


class SchemaRefused(DeadLetter):
    """The record names a schema that cannot be used: unknown to the registry, or refused by its
    format's parser (too large, too deep, not a schema of the format)."""


class UnknownSchema(SchemaRefused):
    """The record names a schema id the registry does not have."""


class RegisteredSchema(typing.NamedTuple):
    """A schema as the registry gives it: its text, type, and the schemas its references name
    (name -> text, followed recursively)."""

    schema_id: int
    schema_type: str
    text: str
    references: dict[str, str]


class _Refusal(typing.NamedTuple):
    error: SchemaRefused
    until: float


class SchemaRegistry:
    """A client of one registry; `schema(schema_id, parse)` gives a parsed schema or raises.

    `parse(RegisteredSchema)` is the format's parser: what it returns is cached, what it raises
    (`ValueError`) refuses the schema. `requests` counts the HTTP requests sent, by path kind.
    """

    def __init__(self, settings: dict[str, typing.Any],
                 max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES,
                 max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES,
                 clock: typing.Callable[[], float] = time.monotonic):
        check_settings(settings)
        self.settings = dict(settings)
        self.urls = [url.strip().rstrip("/") for url in str(settings["url"]).split(",")
                     if url.strip()]
        self.max_schema_bytes = max_schema_bytes
        self.max_cache_bytes = max_cache_bytes
        self.capacity = int(settings.get("cache.capacity", 1000))
        self.timeout = float(settings.get("timeout", 10))
        self._clock = clock
        self._headers = _auth_headers(settings, self.urls[0])
        self._context = _ssl_context(settings) if any(
            url.startswith("https:") for url in self.urls) else None
        self._connections: dict[str, http.client.HTTPConnection] = {}
        self._cache: collections.OrderedDict[tuple, tuple[typing.Any, int]] = (
            collections.OrderedDict())
        self._cache_bytes = 0
        self._refused: dict[tuple, _Refusal] = {}
        self.requests: collections.Counter[str] = collections.Counter()
        #: The last failure to reach the registry, while it lasts (None once it answers).
        self.unavailable: str | None = None

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    # Schemas by id ----------------------------------------------------------------------------

    def schema(self, schema_id: int, parse: typing.Callable[[RegisteredSchema], typing.Any],
               kind: str) -> typing.Any:
        """The parsed schema `schema_id` (for the format `kind`: a parser's name), cached.

        Raises `UnknownSchema` / `SchemaRefused` (dead letters), `RegistryUnavailable` (an
        outage) or `RegistryRefused` (credentials)."""
        key = (kind, schema_id)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached[0]
        refused = self._refused.get(key)
        if refused is not None:
            if self._clock() < refused.until:
                raise refused.error
            del self._refused[key]
        try:
            registered = self._fetch(schema_id)
            try:
                parsed = parse(registered)
            except SchemaRefused:
                raise
            except (ValueError, RecursionError) as error:
                raise SchemaRefused(f"schema {schema_id} cannot be used: "
                                    f"{str(error)[:300]}") from None
        except SchemaRefused as error:
            self._refuse(key, error)
            raise
        size = len(registered.text) + sum(map(len, registered.references.values()))
        self._keep(key, parsed, size)
        return parsed

    def cached(self, schema_id: int, kind: str) -> typing.Any:
        """The parsed schema `schema_id` where the cache holds it, else None: nothing fetched,
        the cache's order untouched (the worker's batch path reads the plans of the schemas
        the per-record path has decoded: connectors/serializers/batches.py)."""
        cached = self._cache.get((kind, schema_id))
        return None if cached is None else cached[0]

    def _refuse(self, key: tuple, error: SchemaRefused) -> None:
        if len(self._refused) >= self.capacity:
            self._refused.pop(next(iter(self._refused)))
        self._refused[key] = _Refusal(error, self._clock() + REFUSED_TTL_S)

    def _keep(self, key: tuple, parsed: typing.Any, size: int) -> None:
        cache = self._cache
        cache[key] = (parsed, size)
        self._cache_bytes += size
        while len(cache) > self.capacity or (self._cache_bytes > self.max_cache_bytes
                                             and len(cache) > 1):
            _, (_, evicted) = cache.popitem(last=False)
            self._cache_bytes -= evicted

    def cache_counts(self) -> dict[str, int]:
        return {"schemas": len(self._cache), "schema_bytes": self._cache_bytes,
                "refused": len(self._refused)}

    def _fetch(self, schema_id: int) -> RegisteredSchema:
        status, body = self._request("GET", f"/schemas/ids/{schema_id}", "schema")
        if status == 404:
            raise UnknownSchema(f"unknown schema id {schema_id}: the registry at {self.url} does "
                                "not have it (was the record written against another registry?)")
        if status != 200:
            raise SchemaRefused(f"schema {schema_id}: the registry answered {status}: "
                                f"{_error_message(body)}")
        schema_type, text, references = _schema_fields(body, f"schema {schema_id}")
        return RegisteredSchema(schema_id, schema_type, text,
                                self._references(references, schema_id, 0, {}))

    def _references(self, references: list, schema_id: int, depth: int,
                    found: dict[str, str]) -> dict[str, str]:
        """Every schema the references name, recursively (name -> text), each after the
        schemas it refers to itself (the order an Avro parser needs)."""
        if not references:
            return found
        if depth >= MAX_REFERENCE_DEPTH:
            raise SchemaRefused(f"schema {schema_id}: references nested deeper than "
                                f"{MAX_REFERENCE_DEPTH}")
        for name, subject, version in references:
            if name in found:
                continue
            if len(found) >= MAX_REFERENCES:
                raise SchemaRefused(f"schema {schema_id}: more than {MAX_REFERENCES} references")
            path = (f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/"
                    f"{urllib.parse.quote(str(version), safe='')}")
            status, body = self._request("GET", path, "reference")
            if status != 200:
                raise SchemaRefused(f"schema {schema_id}: its reference {name[:100]!r} (subject "
                                    f"{subject[:100]!r} version {version}) answered {status}")
            _, text, nested = _schema_fields(body, f"reference {name[:100]!r}")
            found[name] = ""  # (a cycle of references stops here)
            self._references(nested, schema_id, depth + 1, found)
            del found[name]
            found[name] = text
        return found

    def latest(self, subject: str) -> RegisteredSchema | None:
        """The latest schema of `subject` (None: the registry has no such subject), for a check
        at start; `SchemaRefused` for an answer it cannot read, `RegistryUnavailable` and
        `RegistryRefused` as `schema`."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
        status, body = self._request("GET", path, "subject")
        if status == 404:
            return None
        if status != 200:
            raise SchemaRefused(f"subject {subject[:100]!r}: the registry answered {status}: "
                                f"{_error_message(body)}")
        schema_type, text, references = _schema_fields(body, f"subject {subject[:100]!r}")
        schema_id = body.get("id")
        if type(schema_id) is not int:
            raise SchemaRefused(f"subject {subject[:100]!r}: the registry's answer has no id")
        return RegisteredSchema(schema_id, schema_type, text,
                                self._references(references, schema_id, 0, {}))

    # Output schemas ---------------------------------------------------------------------------

    def register(self, subject: str, text: str, schema_type: str = "AVRO") -> int:
        """Register `text` under `subject` (or find it there: the registry gives the same id
        for the same schema); returns its id. `RegistryUnavailable` while it cannot be reached;
        a refusal (an incompatible schema, 409) is a `RegistryRefused` naming the subject."""
        body = {"schema": text}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        status, answer = self._request("POST", path, "register", json.dumps(body).encode())
        if status != 200:
            raise RegistryRefused(
                f"the registry at {self.url} refused the schema of subject {subject!r} "
                f"({status}: {_error_message(answer)}). Fix: if an older schema of the subject "
                "is incompatible, write to another topic, or change the subject's compatibility")
        identifier = answer.get("id") if type(answer) is dict else None
        if type(identifier) is not int:
            raise RegistryRefused(f"the registry at {self.url} answered the registration of "
                                  f"{subject!r} without an id")
        return identifier

    def probe(self) -> bool:
        """Whether the registry answers now (`/subjects`, a cheap request), setting
        `unavailable`; raises `RegistryRefused` for bad credentials."""
        try:
            self._request("GET", "/subjects", "probe")
        except RegistryUnavailable:
            return False
        return True

    # HTTP -------------------------------------------------------------------------------------

    def _connection(self, url: str) -> http.client.HTTPConnection:
        connection = self._connections.get(url)
        if connection is None:
            parts = urllib.parse.urlsplit(url)
            host = parts.hostname or "localhost"
            if parts.scheme == "https":
                connection = http.client.HTTPSConnection(host, parts.port, timeout=self.timeout,
                                                         context=self._context)
            else:
                connection = http.client.HTTPConnection(host, parts.port, timeout=self.timeout)
            self._connections[url] = connection
        return connection

    def _request(self, method: str, path: str, what: str,
                 body: bytes | None = None) -> tuple[int, typing.Any]:
        """(status, parsed JSON body) from the first registry URL that answers."""
        failures = []
        for url in self.urls:
            prefix = urllib.parse.urlsplit(url).path
            connection = self._connection(url)
            headers = {**self._headers, "Accept": "application/vnd.schemaregistry.v1+json, "
                       "application/json"}
            if body is not None:
                headers["Content-Type"] = "application/vnd.schemaregistry.v1+json"
            self.requests[what] += 1
            try:
                connection.request(method, prefix + path, body=body, headers=headers)
                response = connection.getresponse()
                status = response.status
                data = _bounded_read(response, self.max_schema_bytes)
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                failures.append(f"{url}: {type(error).__name__}: {str(error)[:200]}")
                continue
            except _TooLarge as error:
                connection.close()
                raise SchemaRefused(f"{path}: {error}") from None
            if status in (401, 403):
                raise RegistryRefused(
                    f"the Schema Registry at {url} refused this client ({status}: "
                    f"{_error_message(_json_or_none(data))}). Fix: give its credentials "
                    "(--schema-registry-config basic.auth.user.info=USER:PASSWORD, or "
                    "bearer.auth.token=TOKEN with bearer.auth.credentials.source=STATIC_TOKEN)")
            if status >= 500 or status == 429:
                failures.append(f"{url}: HTTP {status}")
                continue
            self.unavailable = None
            return status, _json_or_none(data)
        self.unavailable = "; ".join(failures)
        raise RegistryUnavailable(self.unavailable)

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()


class _TooLarge(Exception):
    pass


def _bounded_read(response: http.client.HTTPResponse, limit: int) -> bytes:
    """The response's body, refused once beyond `limit` bytes (the declared length first)."""
    length = response.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _TooLarge(f"the registry's answer is {int(length)} bytes, more than {limit}")
    data = response.read(limit + 1)
    if len(data) > limit:
        raise _TooLarge(f"the registry's answer is more than {limit} bytes")
    if not response.isclosed():
        response.read()  # (an empty rest: the connection is kept for the next request)
    return data


def _json_or_none(data: bytes) -> typing.Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _error_message(body: typing.Any) -> str:
    if type(body) is dict:
        message = body.get("message")
        code = body.get("error_code")
        if isinstance(message, str):
            return f"{message[:300]}" + (f" (error_code {code})" if type(code) is int else "")
    return "no error message"


def _schema_fields(body: typing.Any, what: str) -> tuple[str, str, list]:
    """(schemaType, schema text, references as (name, subject, version)) of an answer."""
    if type(body) is not dict or type(body.get("schema")) is not str:
        raise SchemaRefused(f"{what}: the registry's answer holds no schema text")
    schema_type = body.get("schemaType") or "AVRO"
    if schema_type not in SCHEMA_TYPES:
        raise SchemaRefused(f"{what}: schemaType {str(schema_type)[:40]!r} is none of "
                            f"{', '.join(SCHEMA_TYPES)}")
    references = []
    for reference in body.get("references") or ():
        if (type(reference) is not dict or type(reference.get("name")) is not str
                or type(reference.get("subject")) is not str
                or type(reference.get("version")) is not int):
            raise SchemaRefused(f"{what}: a reference without a name, subject and version")
        references.append((reference["name"], reference["subject"], reference["version"]))
    return schema_type, body["schema"], references


# Settings -----------------------------------------------------------------------------------------


def check_settings(settings: dict[str, typing.Any]) -> None:
    """`ValueError` naming a setting this client does not take, or a value it cannot use."""
    for name in settings:
        if name in _NOT_SUPPORTED:
            raise ValueError(f"--schema-registry-config {name}: this client does not support it. "
                             f"Fix: {_NOT_SUPPORTED[name]}")
        if name not in REGISTRY_SETTINGS:
            raise ValueError(f"--schema-registry-config {name}: not a setting of the Schema "
                             f"Registry client (it takes confluent-kafka's names: "
                             f"{', '.join(REGISTRY_SETTINGS[1:])})")
    urls = str(settings.get("url") or "")
    if not urls.strip():
        raise ValueError("a Schema Registry format needs --schema-registry-url URL")
    for url in urls.split(","):
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--schema-registry-url {url.strip()!r}: an http:// or https:// URL "
                             "is needed")
    source = str(settings.get("basic.auth.credentials.source", "USER_INFO")).upper()
    if source not in ("USER_INFO", "URL"):
        raise ValueError("basic.auth.credentials.source must be USER_INFO or URL (SASL_INHERIT "
                         "is not supported: give basic.auth.user.info)")
    info = settings.get("basic.auth.user.info")
    if info is not None and ":" not in str(info):
        raise ValueError("basic.auth.user.info must be USER:PASSWORD")
    bearer = settings.get("bearer.auth.credentials.source")
    if bearer is not None:
        if str(bearer).upper() != "STATIC_TOKEN":
            raise ValueError("bearer.auth.credentials.source: only STATIC_TOKEN is supported "
                             "(with bearer.auth.token)")
        if not settings.get("bearer.auth.token"):
            raise ValueError("bearer.auth.credentials.source STATIC_TOKEN needs bearer.auth.token")
    if (settings.get("ssl.key.location") or settings.get("ssl.key.password")) and not \
            settings.get("ssl.certificate.location"):
        raise ValueError("ssl.key.location and ssl.key.password need ssl.certificate.location")
    for name, low, high in (("timeout", 0.001, 3600), ("cache.capacity", 1, 1_000_000)):
        if name in settings:
            try:
                value = float(settings[name])
            except (TypeError, ValueError):
                raise ValueError(f"--schema-registry-config {name} must be a number") from None
            if not low <= value <= high:
                raise ValueError(f"--schema-registry-config {name} must be in [{low}, {high}]")


def _auth_headers(settings: dict[str, typing.Any], url: str) -> dict[str, str]:
    headers = {}
    bearer = settings.get("bearer.auth.credentials.source")
    if bearer is not None:
        headers["Authorization"] = f"Bearer {settings['bearer.auth.token']}"
        for name, header in (("bearer.auth.logical.cluster", "target-sr-cluster"),
                             ("bearer.auth.identity.pool.id", "Confluent-Identity-Pool-Id")):
            if settings.get(name):
                headers[header] = str(settings[name])
        return headers
    source = str(settings.get("basic.auth.credentials.source", "USER_INFO")).upper()
    parts = urllib.parse.urlsplit(url)
    if source == "USER_INFO" and settings.get("basic.auth.user.info"):
        user_info = str(settings["basic.auth.user.info"])
    elif parts.username is not None:
        user_info = (f"{urllib.parse.unquote(parts.username)}:"
                     f"{urllib.parse.unquote(parts.password or '')}")
    else:
        return headers
    headers["Authorization"] = "Basic " + base64.b64encode(user_info.encode()).decode()
    return headers


def _ssl_context(settings: dict[str, typing.Any]) -> ssl.SSLContext:
    ca = settings.get("ssl.ca.location")
    if ca is not None and os.path.isdir(str(ca)):
        context = ssl.create_default_context(capath=str(ca))
    else:
        context = ssl.create_default_context(cafile=None if ca is None else str(ca))
    certificate = settings.get("ssl.certificate.location")
    if certificate:
        context.load_cert_chain(str(certificate), settings.get("ssl.key.location"),
                                settings.get("ssl.key.password"))
    return context
