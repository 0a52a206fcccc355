"""The Open Inference Protocol's REST messages (KServe's `inference_rest.md`, v2), as validated
structures: an inference request's body in, an inference response's body out.

A request body is untrusted: it is parsed by msgspec into fixed structures (`InferenceRequest`,
`RequestTensor`, `RequestedOutput`; an unknown field, a value of the wrong type, a number
beyond its datatype, a shape that does not match its data are each a `RequestError` naming
the field and the fix), its sizes checked against `Limits` before anything grows with them.
The rows it holds come out as `Rows`: either the records as the application writes them to
the topic (one `BYTES` input named `record`, each element a record's JSON) or a table (one
input per field, named by the field's PATH as `--features` names it), and the record keys.

Triton's binary tensor data extension is read and written too, since `tritonclient` uses it by
default: a body whose first `Inference-Header-Content-Length` bytes are the JSON and the rest
the tensors (each input with a `binary_data_size` parameter takes the next bytes, in order;
`BYTES` elements as a 4-byte little-endian length and the bytes), and outputs asked for with
`binary_data` (or the request's `binary_data_output`) written the same way after the JSON.

Examples
--------

>>> limits = Limits(max_records=10, max_fields=10)
>>> rows = parse_infer(b'{"inputs": [{"name": "record", "datatype": "BYTES", "shape": [1], '
...                    b'"data": ["{\\\\"amount\\\\": 31.2}"]}]}', None, limits)
>>> rows.records, rows.keys
([b'{"amount": 31.2}'], None)
>>> rows = parse_infer(b'{"inputs": [{"name": "amount", "datatype": "FP64", "shape": [2], '
...                    b'"data": [1.5, 2]}, {"name": "merchant.country", "datatype": "BYTES", '
...                    b'"shape": [2, 1], "data": [["BR"], ["FR"]]}], '
...                    b'"parameters": {"key": "card-7"}}', None, limits)
>>> rows.trees, rows.keys
([{'amount': 1.5, 'merchant': {'country': 'BR'}}, {'amount': 2, 'merchant': {'country': 'FR'}}], [b'card-7', b'card-7'])
>>> try:
...     parse_infer(b'{"inputs": [{"name": "amount", "datatype": "FP64", "shape": [3], '
...                 b'"data": [1.5, 2]}]}', None, limits)
... except RequestError as error:
...     print(error.status, error)
400 input 'amount' has 2 elements where its shape [3] says 3: give data of the shape's size
"""

from __future__ import annotations

import dataclasses
import struct
import typing

import msgspec

from connectors.serializers.mapping import parse_path

__all__ = [
    "InferenceRequest",
    "RequestTensor",
    "RequestedOutput",
    "RequestError",
    "Limits",
    "Rows",
    "parse_infer",
    "encode_response",
    "error_body",
    "RECORD_INPUT",
    "KEY_INPUT",
    "OUTPUT_NAMES",
    "REQUEST_PARAMETERS",
    "HEADER_LENGTH",
]

#: The input holding records as written to the topic (their JSON form), and the records' keys.
RECORD_INPUT = "record"
KEY_INPUT = "key"
#: The outputs, named as MLServer's scikit-learn runtime names them.
OUTPUT_NAMES = ("predict", "predict_proba")
#: Request parameters this server reads: the key of every record, the input partition or topic
#: whose model answers, and Triton's binary output switch.
REQUEST_PARAMETERS = ("key", "partition", "topic", "binary_data_output")
#: Triton's binary tensor data extension: the JSON's length at the head of the body.
HEADER_LENGTH = "inference-header-content-length"

_KNOWN_PARAMETERS = frozenset(REQUEST_PARAMETERS)
_NUMBER_TYPES = {
    "FP64": ("<d", float), "FP32": ("<f", float), "FP16": ("<e", float),
    "INT64": ("<q", int), "INT32": ("<i", int), "INT16": ("<h", int), "INT8": ("<b", int),
    "UINT64": ("<Q", int), "UINT32": ("<I", int), "UINT16": ("<H", int), "UINT8": ("<B", int),
}
DATATYPES = ("BOOL", "BYTES", *_NUMBER_TYPES)
_INT_RANGES = {"INT64": 63, "INT32": 31, "INT16": 15, "INT8": 7}
_UINT_RANGES = {"UINT64": 64, "UINT32": 32, "UINT16": 16, "UINT8": 8}
_MAX_FLOAT = 1.7976931348623157e308
_EXAMPLE = ('{"inputs": [{"name": "record", "datatype": "BYTES", "shape": [1], "data": '
            '["{\\"amount\\": 31.2}"]}]}')


class RequestError(ValueError):
    """A request this server refuses: `status` (a 4xx) and the message of OIP's
    `{"error": "..."}`, naming the field at fault and the fix."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class RequestTensor(msgspec.Struct, forbid_unknown_fields=True):
    """One input tensor of an inference request (OIP's `$request_input`)."""

    name: str
    datatype: str
    shape: list[int]
    data: typing.Any = msgspec.UNSET  # (absent for Triton's binary tensors)
    parameters: dict[str, typing.Any] = {}


class RequestedOutput(msgspec.Struct, forbid_unknown_fields=True):
    """One output asked for (OIP's `$request_output`)."""

    name: str
    parameters: dict[str, typing.Any] = {}


class InferenceRequest(msgspec.Struct, forbid_unknown_fields=True):
    """An inference request (OIP's `$inference_request`)."""

    inputs: list[RequestTensor]
    id: str | None = None
    parameters: dict[str, typing.Any] = {}
    outputs: list[RequestedOutput] | None = None


_decode_request = msgspec.json.Decoder(InferenceRequest).decode
_encode = msgspec.json.Encoder().encode


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold: records (rows), fields (inputs of a table, or features of a
    record once mapped), and bytes of a record (`--max-record-bytes`, as on the topic)."""

    max_records: int = 10_000
    max_fields: int = 10_000
    max_record_bytes: int = 1 << 20


@dataclasses.dataclass
class Rows:
    """The records of a request: `records` (each record's bytes, the `record` form) or `trees`
    (each row of a table as the tree of its record), the records' keys (None: none given), the
    parameters asked for and the outputs wanted (names, and whether each goes out binary)."""

    records: list[bytes] | None
    trees: list[dict] | None
    keys: list[bytes | None] | None
    request_id: str | None
    partition: int | None
    topic: str | None
    outputs: list[tuple[str, bool]]

    def __len__(self) -> int:
        return len(self.records if self.records is not None else self.trees or ())


def _refuse(message: str, status: int = 400) -> typing.NoReturn:
    raise RequestError(status, message)


def parse_infer(body: bytes, header_length: str | None, limits: Limits) -> Rows:
    """The rows of an inference request's body (`header_length`: the value of the
    `Inference-Header-Content-Length` header, None without one), or `RequestError`."""
    binary = b""
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            _refuse(f"header Inference-Header-Content-Length is {header_length[:40]!r}, not a "
                    "number: give the length of the JSON at the head of the body")
        if not 0 < length <= len(body):
            _refuse(f"header Inference-Header-Content-Length is {length}, outside the body's "
                    f"{len(body)} bytes: give the length of the JSON at the head of the body")
        body, binary = body[:length], body[length:]
    if not body:
        _refuse(f"the request has no body: POST an inference request, e.g. {_EXAMPLE}")
    try:
        request = _decode_request(body)
    except msgspec.ValidationError as error:
        _refuse(f"{error}: the body must be an inference request of the Open Inference "
                f"Protocol, e.g. {_EXAMPLE}")
    except msgspec.DecodeError as error:
        _refuse(f"the body is not JSON ({error}): send an inference request as JSON, e.g. "
                f"{_EXAMPLE}")
    except RecursionError:
        _refuse("the body nests arrays or objects too deeply: an input's data is a flat array, "
                "or nested as its shape says")
    return _rows(request, binary, limits)


def _rows(request: InferenceRequest, binary: bytes, limits: Limits) -> Rows:
    parameters = request.parameters
    unknown = sorted(set(parameters) - _KNOWN_PARAMETERS) if parameters else ()
    if unknown:
        _refuse(f"request parameter {unknown[0][:60]!r} is not one this server reads: give "
                f"{', '.join(REQUEST_PARAMETERS)}")
    key = parameters.get("key")
    if key is not None and type(key) is not str:
        _refuse("request parameter 'key' must be a string (the record key as UTF-8 text)")
    partition = parameters.get("partition")
    if partition is not None and (type(partition) is not int or partition < 0):
        _refuse(f"request parameter 'partition' must be an integer >= 0, got {partition!r:.40}")
    topic = parameters.get("topic")
    if topic is not None and type(topic) is not str:
        _refuse("request parameter 'topic' must be a string naming an input topic")
    binary_out = parameters.get("binary_data_output", False)
    if type(binary_out) is not bool:
        _refuse("request parameter 'binary_data_output' must be true or false")
    outputs = _outputs(request.outputs, binary_out)
    inputs = request.inputs
    if not inputs:
        _refuse("the request has no inputs: give one BYTES input named 'record' (each element "
                "a record's JSON), or one input per field")
    if len(inputs) > limits.max_fields + 1:
        _refuse(f"the request has {len(inputs)} inputs, above the limit of {limits.max_fields} "
                "fields (--max-request-fields): send fewer fields, or raise the limit")
    names = [tensor.name for tensor in inputs]
    if len(names) > 1 and len(set(names)) != len(names):
        duplicate = next(name for name in names if names.count(name) > 1)
        _refuse(f"input {duplicate[:100]!r} is given twice: give each input once")
    columns = _columns(inputs, binary, limits)
    n = len(next(iter(columns.values())))
    for name, column in columns.items():
        if len(column) != n:
            _refuse(f"input {name[:100]!r} has {len(column)} rows where {names[0][:100]!r} has "
                    f"{n}: every input holds one element per record")
    if n == 0:
        _refuse("the request holds no records: give at least one row")
    keys = columns.pop(KEY_INPUT, None)
    if keys is not None:
        if key is not None:
            _refuse("the keys are given twice, as input 'key' and as parameter 'key': give one")
        keys = [None if k is None else k.encode("utf-8", "surrogatepass") for k in keys]
    elif key is not None:
        keys = [key.encode("utf-8", "surrogatepass")] * n
    records = trees = None
    if RECORD_INPUT in columns:
        if len(columns) > 1:
            other = next(name for name in columns if name != RECORD_INPUT)
            _refuse(f"input {other[:100]!r} beside input 'record': give the records whole "
                    "(input 'record') or as fields (an input per field), not both")
        column = columns[RECORD_INPUT]
        for i, value in enumerate(column):
            if type(value) is not str:
                _refuse(f"input 'record' element {i} is {_kind(value)}: each element is a "
                        "record's JSON, as a string")
        records = [value.encode("utf-8", "surrogatepass") for value in column]
    else:
        trees = _trees(columns, n)
    return Rows(records, trees, keys, request.id, partition, topic, outputs)


def _outputs(requested: list[RequestedOutput] | None,
             binary_out: bool) -> list[tuple[str, bool]]:
    if requested is None:
        return _EVERY_OUTPUT[binary_out]
    if not requested:
        _refuse(f"'outputs' is empty: leave it out for every output, or name some of "
                f"{', '.join(OUTPUT_NAMES)}")
    wanted = []
    for output in requested:
        if output.name not in OUTPUT_NAMES:
            _refuse(f"output {output.name[:100]!r} is not one of this model's: "
                    f"{', '.join(OUTPUT_NAMES)}")
        binary = output.parameters.get("binary_data", binary_out)
        if type(binary) is not bool:
            _refuse(f"output {output.name!r} parameter 'binary_data' must be true or false")
        wanted.append((output.name, binary))
    return wanted


# Every output, as JSON or as binary tensors (shared: a request's outputs are only read).
_EVERY_OUTPUT = {flag: [(name, flag) for name in OUTPUT_NAMES] for flag in (False, True)}


def _columns(inputs: list[RequestTensor], binary: bytes,
             limits: Limits) -> dict[str, list]:
    """Each input's elements, one per row: checked against its datatype and shape."""
    columns = {}
    at = 0
    for tensor in inputs:
        name = tensor.name
        shown = repr(name[:100])
        datatype = tensor.datatype
        if datatype not in DATATYPES:
            _refuse(f"input {shown} has datatype {datatype[:20]!r}: give one of "
                    f"{', '.join(DATATYPES)}")
        shape = tensor.shape
        if not (len(shape) == 1 and shape[0] >= 0) and (
                not 1 <= len(shape) <= 2 or any(d < 0 for d in shape) or (
                    len(shape) == 2 and shape[1] != 1)):
            _refuse(f"input {shown} has shape {shape!r:.60}: each input is one column, shape [n] "
                    "or [n, 1] for n records")
        n = shape[0]
        if n > limits.max_records:
            _refuse(f"input {shown} holds {n} records, above the limit of {limits.max_records} a "
                    "request (--max-request-records): send them in smaller batches")
        if name in (RECORD_INPUT, KEY_INPUT) and datatype != "BYTES":
            _refuse(f"input {shown} must be of datatype BYTES (the {name}s as strings)")
        size = tensor.parameters.get("binary_data_size")
        if size is not None:
            if tensor.data is not msgspec.UNSET:
                _refuse(f"input {shown} has both data and binary_data_size: give one")
            if type(size) is not int or not 0 <= size <= len(binary) - at:
                _refuse(f"input {shown} has binary_data_size {size!r:.40}, beyond the "
                        f"{len(binary) - at} bytes of binary data left in the body")
            columns[name] = _binary_column(name, datatype, n, binary[at:at + size], limits)
            at += size
        else:
            if tensor.data is msgspec.UNSET:
                _refuse(f"input {shown} has no data: give 'data' (or Triton's binary_data_size)")
            columns[name] = _json_column(name, datatype, n, tensor.data, limits)
    if at != len(binary):
        _refuse(f"the body has {len(binary) - at} bytes of binary data no input claims: give "
                "each binary input its binary_data_size")
    return columns


def _json_column(name: str, datatype: str, n: int, data: typing.Any, limits: Limits) -> list:
    shown = repr(name[:100])
    if type(data) is not list:
        _refuse(f"input {shown} has data of {_kind(data)}: give an array of {n} elements")
    if len(data) != n:
        # A column of [n, 1] may come nested: [[v], [v], ...].
        _refuse(f"input {shown} has {len(data)} elements where its shape [{n}] says {n}: give "
                "data of the shape's size")
    if _flat_and_valid(datatype, data, limits):
        return list(data)  # (every element checked at once: no element needs a message)
    column = []
    check = _CHECKS[datatype]
    for i, value in enumerate(data):
        if type(value) is list:
            if len(value) != 1:
                _refuse(f"input {shown} element {i} is an array of {len(value)}: each record "
                        "has one element (shape [n] or [n, 1])")
            value = value[0]
        column.append(None if value is None else check(shown, i, value, limits))
    return column


def _flat_and_valid(datatype: str, data: list, limits: Limits) -> bool:
    """Whether every element of `data` is one the element checks below pass as it is (a flat
    column of the datatype's own type, within its range): a whole column at C speed, where a
    request's thousand rows would take a check call each."""
    types = set(map(type, data))
    if len(types) != 1 or not data:
        return False
    kind = types.pop()
    if datatype == "BYTES":
        return kind is str and max(map(len, data)) <= limits.max_record_bytes
    if datatype == "BOOL":
        return kind is bool
    if datatype in ("FP64", "FP32", "FP16"):
        return kind is float
    if kind is not int:
        return False
    bits = _INT_RANGES.get(datatype)
    low, high = ((-(1 << bits), (1 << bits) - 1) if bits is not None
                 else (0, (1 << _UINT_RANGES[datatype]) - 1))
    return low <= min(data) and max(data) <= high


def _check_bytes(shown: str, i: int, value: typing.Any, limits: Limits) -> str:
    if type(value) is not str:
        _refuse(f"input {shown} element {i} is {_kind(value)}: BYTES elements are strings")
    if len(value) > limits.max_record_bytes:
        _refuse(f"input {shown} element {i} is {len(value)} characters long, above "
                f"--max-record-bytes={limits.max_record_bytes}: records larger than that are "
                "dead letters on the topic too", 413)
    return value


def _check_bool(shown: str, i: int, value: typing.Any, limits: Limits) -> bool:
    if type(value) is not bool:
        _refuse(f"input {shown} element {i} is {_kind(value)}: BOOL elements are true or false")
    return value


def _check_float(shown: str, i: int, value: typing.Any, limits: Limits) -> float | int:
    if type(value) is float:
        return value  # (JSON has no NaN or infinity, and msgspec refuses numbers beyond float64)
    if type(value) is int and -_MAX_FLOAT <= value <= _MAX_FLOAT:
        return value
    _refuse(f"input {shown} element {i} is {_kind(value)}: a floating-point input holds finite "
            "numbers")


def _int_check(datatype: str) -> typing.Callable:
    if datatype in _INT_RANGES:
        low, high = -(1 << _INT_RANGES[datatype]), (1 << _INT_RANGES[datatype]) - 1
    else:
        low, high = 0, (1 << _UINT_RANGES[datatype]) - 1

    def check(shown: str, i: int, value: typing.Any, limits: Limits) -> int:
        if type(value) is not int or not low <= value <= high:
            _refuse(f"input {shown} element {i} is {_kind(value)}: {datatype} elements are "
                    f"integers in [{low}, {high}]")
        return value

    return check


_CHECKS: dict[str, typing.Callable] = {"BYTES": _check_bytes, "BOOL": _check_bool}
_CHECKS.update({t: _check_float for t in ("FP64", "FP32", "FP16")})
_CHECKS.update({t: _int_check(t) for t in (*_INT_RANGES, *_UINT_RANGES)})


def _binary_column(name: str, datatype: str, n: int, data: bytes, limits: Limits) -> list:
    """A column of Triton's binary tensor data: `n` elements, exactly `data`'s bytes."""
    shown = repr(name[:100])
    if datatype == "BYTES":
        column, at = [], 0
        for i in range(n):
            if at + 4 > len(data):
                _refuse(f"input {shown} binary data ends before element {i}: each BYTES element "
                        "is a 4-byte little-endian length, then its bytes")
            (size,) = struct.unpack_from("<I", data, at)
            at += 4
            if size > len(data) - at:
                _refuse(f"input {shown} binary element {i} claims {size} bytes, beyond the data")
            if size > limits.max_record_bytes:
                _refuse(f"input {shown} element {i} is {size} bytes, above --max-record-bytes="
                        f"{limits.max_record_bytes}", 413)
            try:
                column.append(data[at:at + size].decode("utf-8"))
            except UnicodeDecodeError:
                _refuse(f"input {shown} binary element {i} is not UTF-8 text: records and keys "
                        "are sent as their UTF-8 text")
            at += size
        if at != len(data):
            _refuse(f"input {shown} has {len(data) - at} bytes of binary data after its {n} "
                    "elements: binary_data_size must be their exact size")
        return column
    if datatype == "BOOL":
        if len(data) != n:
            _refuse(f"input {shown} has {len(data)} bytes of binary BOOL data for {n} elements")
        return [byte != 0 for byte in data]
    fmt, kind = _NUMBER_TYPES[datatype]
    width = struct.calcsize(fmt)
    if len(data) != n * width:
        _refuse(f"input {shown} has {len(data)} bytes of binary {datatype} data where {n} "
                f"elements take {n * width}")
    values = [value for (value,) in struct.iter_unpack(fmt, data)]
    if kind is float:
        for i, value in enumerate(values):
            if value - value != 0.0:
                _refuse(f"input {shown} element {i} is {value!r}: features are finite numbers")
    return values


def _trees(columns: dict[str, list], n: int) -> list[dict]:
    """The rows of a table as records' trees: an input named by a dotted PATH (`x.amount`,
    `merchant.country`) goes where the record would hold it, so that the field mapping reads it
    as it reads the topic's records."""
    paths = []
    for name in columns:
        try:
            path = parse_path(name)
        except ValueError as error:
            _refuse(f"input {name[:100]!r} is not a field PATH ({error})")
        paths.append((path, columns[name]))
    for (a, _), (b, _) in zip(sorted(paths), sorted(paths)[1:]):
        if b[:len(a)] == a:
            _refuse(f"input {'.'.join(a)[:100]!r} is an object holding input "
                    f"{'.'.join(b)[:100]!r}: give the fields inside it only")
    trees = []
    flat = all(len(path) == 1 for path, _ in paths)
    if flat:
        names = [path[0] for path, _ in paths]
        values = [column for _, column in paths]
        for row in zip(*values):
            trees.append(dict(zip(names, row)))
        return trees
    for i in range(n):
        tree: dict = {}
        for path, column in paths:
            node = tree
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = column[i]
        trees.append(tree)
    return trees


def _kind(value: typing.Any) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) in (int, float):
        return f"the number {value!r:.40}"
    if type(value) is str:
        return "a string"
    if type(value) is list:
        return "an array"
    if type(value) is dict:
        return "an object"
    return type(value).__name__


# Responses ----------------------------------------------------------------------------------------


def error_body(message: str) -> bytes:
    """OIP's error response body, `{"error": "..."}`."""
    return _encode({"error": message})


def encode_response(model_name: str, model_version: str, request_id: str | None,
                    parameters: dict, outputs: list[tuple[str, bool, str, list[int], list]]
                    ) -> tuple[bytes, int | None]:
    """The body of an inference response (OIP's `$inference_response`), and the length of its
    JSON head when outputs go out as Triton's binary tensors (None: all JSON). `outputs`:
    (name, binary, datatype, shape, flat data) each."""
    described = []
    tail = []
    for name, binary, datatype, shape, data in outputs:
        output: dict[str, typing.Any] = {"name": name, "datatype": datatype, "shape": shape}
        if binary:
            raw = _binary(datatype, data)
            output["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        else:
            output["data"] = data
        described.append(output)
    response: dict[str, typing.Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        response["id"] = request_id
    response["parameters"] = parameters
    response["outputs"] = described
    head = _encode(response)
    if not tail:
        return head, None
    return head + b"".join(tail), len(head)


def _binary(datatype: str, data: list) -> bytes:
    if datatype == "BYTES":
        parts = []
        for value in data:
            raw = value.encode("utf-8", "surrogatepass")
            parts.append(struct.pack("<I", len(raw)))
            parts.append(raw)
        return b"".join(parts)
    if datatype == "BOOL":
        return bytes(1 if value else 0 for value in data)
    fmt = _NUMBER_TYPES[datatype][0]
    return struct.pack(f"<{len(data)}{fmt[1]}", *data)
