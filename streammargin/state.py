"""Safe model state: numpy arrays plus JSON, never pickle.

A model's state is a nested dict whose leaves are numpy arrays or JSON values (`model.to_state()`).
`dumps` turns it into bytes and `loads` turns bytes back into such a dict without executing
anything: the bytes are a JSON header plus raw little-endian array buffers of a few numeric dtypes.
This is what the Kafka connector writes to its checkpoint topic, so a checkpoint read back from a
topic can at worst fail to load, never run code.

Layout of the bytes::

    b"SMSTATE1" | header length (uint64, little endian) | header (UTF-8 JSON) | array buffers

The header holds the state with every array replaced by {"__array__": i}, and for each array its
dtype, shape, offset and length in the buffer section.

Model classes restore themselves with `Model.from_state(state)`; `from_state(state)` here picks
the class by the name saved in the state, among the classes registered with `register`.
"""

from __future__ import annotations

import json
import math
import struct
import typing

import numpy as np

from streammargin.errors import StateError

__all__ = [
    "dumps",
    "loads",
    "peek",
    "from_state",
    "register",
    "registered_models",
    "encode_name",
    "decode_name",
    "StateError",
]

MAGIC = b"SMSTATE1"
FORMAT_VERSION = 1
_ALLOWED_DTYPES = {"<f8", "<f4", "<i8", "<i4", "|u1", "|b1"}
_REGISTRY: dict[str, type] = {}




# Names and labels -------------------------------------------------------------------------------
# Feature names and class labels are usually strings, but River allows any hashable; JSON has no
# tuples or non-string keys, so other types are tagged.

MAX_NAME_DEPTH = 16  # tuples nested deeper than this have no safe state


def encode_name(name: typing.Any, _depth: int = 0) -> typing.Any:
    """A JSON value that `decode_name` turns back into `name`."""
    if isinstance(name, str):
        return name
    if isinstance(name, (bool, np.bool_)):
        return {"bool": bool(name)}
    if isinstance(name, (int, np.integer)):
        return {"int": int(name)}
    if isinstance(name, (float, np.floating)) and math.isfinite(name):
        return {"float": float(name)}
    if isinstance(name, tuple) and _depth < MAX_NAME_DEPTH:
        return {"tuple": [encode_name(part, _depth + 1) for part in name]}
    if name is None:
        return {"none": None}
    raise TypeError(
        f"cannot save the name or label {name!r:.80} of type {type(name).__name__}: "
        "only str, bool, int, finite float, None and tuples of these (nested at most "
        f"{MAX_NAME_DEPTH} deep) have a safe state"
    )


def decode_name(encoded: typing.Any, _depth: int = 0) -> typing.Any:
    """The name or label `encode_name` encoded; anything it cannot have produced raises
    `StateError`."""
    if isinstance(encoded, str):
        return encoded
    if type(encoded) is dict and len(encoded) == 1:
        ((tag, value),) = encoded.items()
        if tag == "bool" and isinstance(value, bool):
            return value
        if tag == "int" and isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        if tag == "float" and isinstance(value, float) and math.isfinite(value):
            return float(value)
        if tag == "tuple" and isinstance(value, list) and _depth < MAX_NAME_DEPTH:
            return tuple(decode_name(part, _depth + 1) for part in value)
        if tag == "none" and value is None:
            return None
    raise StateError(f"not an encoded name or label: {encoded!r:.80}")


# Bytes ------------------------------------------------------------------------------------------

MAX_DEPTH = 64  # nesting of the header's JSON; a model's state is 4 deep, a checkpoint's ~10
MAX_NDIM = 16
MAX_DIM = 2**40  # a dimension of a saved array (a zero-size array holds no bytes to bound it)
_HEADER_KEYS = {"format", "tree", "arrays"}
_SPEC_KEYS = {"dtype", "shape", "offset", "nbytes"}


def _strip_arrays(node: typing.Any, arrays: list[np.ndarray]) -> typing.Any:
    if isinstance(node, np.ndarray):
        arrays.append(node)
        return {"__array__": len(arrays) - 1}
    if isinstance(node, dict):
        for key in node:
            if not isinstance(key, str):
                raise TypeError(f"state keys must be strings, got {key!r}")
        return {key: _strip_arrays(value, arrays) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_strip_arrays(value, arrays) for value in node]
    if isinstance(node, (np.floating, np.integer, np.bool_)):
        return node.item()
    return node


def _put_arrays(tree: dict, arrays: list[np.ndarray]) -> dict:
    """Replace every {"__array__": i} of a freshly parsed header tree by arrays[i], in place and
    without recursion; each array is referenced exactly once, as `dumps` writes them."""
    used = [False] * len(arrays)
    stack: list[typing.Any] = [tree]
    while stack:
        node = stack.pop()
        for key, child in list(node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(child, dict) and "__array__" in child and len(child) == 1:
                i = child["__array__"]
                if type(i) is not int or not 0 <= i < len(arrays) or used[i]:
                    raise StateError(f"bad array reference {child!r:.80}")
                used[i] = True
                node[key] = arrays[i]
            elif isinstance(child, (dict, list)):
                stack.append(child)
    if not all(used):
        raise StateError(f"array {used.index(False)} of the state is not referenced")
    return tree


def dumps(state: dict) -> bytes:
    """Serialize a state dict (numpy arrays + JSON values) to bytes, without pickle."""
    arrays: list[np.ndarray] = []
    tree = _strip_arrays(state, arrays)
    specs = []
    buffers = []
    offset = 0
    for array in arrays:
        array = np.ascontiguousarray(array)
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        array = array.astype(dtype, copy=False)
        if dtype.str not in _ALLOWED_DTYPES:
            raise TypeError(f"arrays of dtype {array.dtype} have no safe state")
        raw = array.tobytes()
        pad = (-offset) % 8
        buffers.append(b"\0" * pad)
        offset += pad
        specs.append(
            {"dtype": dtype.str, "shape": list(array.shape), "offset": offset, "nbytes": len(raw)}
        )
        buffers.append(raw)
        offset += len(raw)
    header = json.dumps(
        {"format": FORMAT_VERSION, "tree": tree, "arrays": specs},
        allow_nan=False,
        separators=(",", ":"),
    ).encode()
    return b"".join([MAGIC, struct.pack("<Q", len(header)), header, *buffers])


def _no_constant(name: str) -> typing.NoReturn:
    raise StateError(f"the state header holds {name}, which JSON does not allow")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise StateError(f"the state header holds the number {text:.40}, beyond float64")
    return value


def _parse_header(raw: bytes) -> dict:
    """The header's JSON, refusing invalid UTF-8, NaN/Infinity, numbers beyond float64 and
    nesting deeper than MAX_DEPTH."""
    try:
        text = raw.decode("utf-8")
        header = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except UnicodeDecodeError as error:
        raise StateError(f"the state header is not UTF-8: {error}") from None
    except RecursionError:
        raise StateError(f"the state header is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:  # JSONDecodeError, and ints of more digits than Python converts
        if isinstance(error, StateError):
            raise
        raise StateError(f"unreadable state header: {error}") from None
    stack = [(header, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise StateError(f"the state header is nested deeper than {MAX_DEPTH} levels")
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
        raise StateError(
            "the state header must be a JSON object with the keys 'arrays', 'format' and 'tree'"
        )
    if type(header["format"]) is not int or header["format"] != FORMAT_VERSION:
        raise StateError(f"unsupported state format {header['format']!r:.40}")
    if not isinstance(header["tree"], dict):
        raise StateError("the state tree must be a JSON object")
    if not isinstance(header["arrays"], list):
        raise StateError("the state's array specs must be a list")
    return header


def _array_layout(specs: list, body_size: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    """(dtype, shape, offset, nbytes) of every array spec, checked with Python ints against the
    body before anything is allocated: arrays follow each other as `dumps` lays them out (8-byte
    aligned, no gaps, no overlap) and fill the body exactly."""
    layout = []
    end = 0
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or set(spec) != _SPEC_KEYS:
            raise StateError(f"array spec {i} must be an object with keys {sorted(_SPEC_KEYS)}")
        dtype, shape, offset, nbytes = spec["dtype"], spec["shape"], spec["offset"], spec["nbytes"]
        if not isinstance(dtype, str) or dtype not in _ALLOWED_DTYPES:
            raise StateError(f"array {i}: dtype {dtype!r:.40} is not allowed in a state")
        if not (
            isinstance(shape, list)
            and len(shape) <= MAX_NDIM
            and all(type(n) is int and 0 <= n <= MAX_DIM for n in shape)
        ):
            raise StateError(
                f"array {i}: shape {shape!r:.80} is not a list of at most {MAX_NDIM} "
                f"integers in [0, 2**40]"
            )
        if type(offset) is not int or type(nbytes) is not int:
            raise StateError(f"array {i}: offset and nbytes must be integers")
        start = end + (-end) % 8
        if offset != start or nbytes != math.prod(shape) * np.dtype(dtype).itemsize:
            raise StateError(f"array {i}: offset or size does not fit the state's layout")
        end = start + nbytes
        if end > body_size:
            raise StateError(f"array {i} runs past the end of the state ({end} > {body_size})")
        layout.append((dtype, tuple(shape), offset, nbytes))
    if end != body_size:
        raise StateError(f"the state has {body_size - end} bytes after its last array")
    return layout


def peek(data: bytes) -> dict:
    """The JSON values of a state written by `dumps`, its arrays left out (each is the spec of
    where it lies); the arrays are neither read nor allocated. Raises `StateError` as `loads`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StateError(f"a state is bytes, got {type(data).__name__}")
    if len(data) < 16 or bytes(data[:8]) != MAGIC:
        raise StateError("not a streammargin state (bad magic)")
    (header_len,) = struct.unpack_from("<Q", data, 8)
    if header_len > len(data) - 16:
        raise StateError(f"the state header ({header_len} bytes) runs past the data")
    return _parse_header(bytes(data[16 : 16 + header_len]))["tree"]


def loads(data: bytes) -> dict:
    """Read bytes written by `dumps` back into a state dict. Never executes code.

    Anything else raises `StateError`: every field of the header is checked, and every size is
    computed with Python integers and checked against the data before an array is allocated, so
    the memory used is at most about twice the size of `data`.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StateError(f"a state is bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < 16 or data[:8] != MAGIC:
        raise StateError("not a streammargin state (bad magic)")
    (header_len,) = struct.unpack_from("<Q", data, 8)
    if header_len > len(data) - 16:
        raise StateError(f"the state header ({header_len} bytes) runs past the data")
    header = _parse_header(data[16 : 16 + header_len])
    body = memoryview(data)[16 + header_len :]
    arrays = []
    for dtype, shape, offset, nbytes in _array_layout(header["arrays"], len(body)):
        raw = body[offset : offset + nbytes]
        if dtype == "|b1" and np.frombuffer(raw, dtype=np.uint8).max(initial=0) > 1:
            raise StateError("a boolean array holds bytes other than 0 and 1")
        array = np.frombuffer(raw, dtype=dtype).reshape(shape)
        arrays.append(array.astype(np.dtype(dtype).newbyteorder("="), copy=True))
    return _put_arrays(header["tree"], arrays)


# Model classes ----------------------------------------------------------------------------------


def register(cls: type) -> type:
    """Class decorator: let `from_state` restore instances of `cls` by name.

    A model module registers its class when it is imported. This module imports nothing above
    it: the registry holds every model once the package is imported, and importing any module
    of the package (`streammargin.state` included) imports the package first, whose
    `__init__` imports every model module."""
    _REGISTRY[cls.__name__] = cls
    return cls


def registered_models() -> dict[str, type]:
    """Class name -> class of every registered model (see `register`)."""
    return dict(_REGISTRY)


def from_state(state: dict, max_bytes: int | None = None) -> typing.Any:
    """Restore a model from `model.to_state()` (or `loads(...)` of its bytes).

    A malformed state raises `StateError` and nothing else (see `MarginClassifier.from_state`).
    A state whose params imply a memory bound above `max_bytes` (default
    `streammargin.memory.DEFAULT_MAX_STATE_BYTES`, 1 GiB) raises `StateError` before anything is
    allocated (`streammargin.memory`).
    """
    name = state.get("model") if isinstance(state, dict) else None
    cls = registered_models().get(name) if isinstance(name, str) else None
    if cls is None:
        raise StateError(f"unknown model {name!r:.80} in state; known: {sorted(_REGISTRY)}")
    if max_bytes is None:
        return cls.from_state(state)
    return cls.from_state(state, max_bytes=max_bytes)


def restore_member(cls: type, data: typing.Any, max_bytes: int | None, where: str) -> typing.Any:
    """`cls.from_state(data, max_bytes=max_bytes)` for a member of a wrapper's state, `where`
    naming it ("OneVsRestClassifier state: member 'a'"). A member's restore should raise
    StateError only; whatever else it raises from a malformed state (KeyError, TypeError,
    ValueError, AttributeError, IndexError) becomes a StateError saying where: a malformed
    checkpoint must not surface as anything else."""
    try:
        return cls.from_state(data, max_bytes=max_bytes)
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise StateError(f"{where}: {type(error).__name__}: {error}") from None


def check_array(state_arrays: dict, name: str, dtype: typing.Any, ndim: int) -> np.ndarray:
    """Fetch one array of a saved state, checking dtype and dimensions."""
    try:
        array = state_arrays[name]
    except KeyError:
        raise StateError(f"state lacks the array {name!r}") from None
    if not isinstance(array, np.ndarray) or array.dtype != np.dtype(dtype) or array.ndim != ndim:
        raise StateError(f"state array {name!r} is not a {ndim}-d {np.dtype(dtype)} array")
    return np.ascontiguousarray(array).copy()
