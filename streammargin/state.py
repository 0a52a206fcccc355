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
import struct
import typing

import numpy as np

from streammargin.errors import StateError

__all__ = [
    "dumps",
    "loads",
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


def encode_name(name: typing.Any) -> typing.Any:
    """A JSON value that `decode_name` turns back into `name`."""
    if isinstance(name, str):
        return name
    if isinstance(name, (bool, np.bool_)):
        return {"bool": bool(name)}
    if isinstance(name, (int, np.integer)):
        return {"int": int(name)}
    if isinstance(name, (float, np.floating)):
        return {"float": float(name)}
    if isinstance(name, tuple):
        return {"tuple": [encode_name(part) for part in name]}
    if name is None:
        return {"none": None}
    raise TypeError(
        f"cannot save the name or label {name!r} of type {type(name).__name__}: "
        "only str, bool, int, float, None and tuples of these have a safe state"
    )


def decode_name(encoded: typing.Any) -> typing.Any:
    if isinstance(encoded, str):
        return encoded
    if isinstance(encoded, dict) and len(encoded) == 1:
        (tag, value), *_ = encoded.items()
        if tag == "bool" and isinstance(value, bool):
            return value
        if tag == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if tag == "float" and isinstance(value, (int, float)):
            return float(value)
        if tag == "tuple" and isinstance(value, list):
            return tuple(decode_name(part) for part in value)
        if tag == "none" and value is None:
            return None
    raise StateError(f"not an encoded name: {encoded!r}")


# Bytes ------------------------------------------------------------------------------------------


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


def _put_arrays(node: typing.Any, arrays: list[np.ndarray]) -> typing.Any:
    if isinstance(node, dict):
        if set(node) == {"__array__"}:
            i = node["__array__"]
            if not isinstance(i, int) or not 0 <= i < len(arrays):
                raise StateError(f"bad array reference {node!r}")
            return arrays[i]
        return {key: _put_arrays(value, arrays) for key, value in node.items()}
    if isinstance(node, list):
        return [_put_arrays(value, arrays) for value in node]
    return node


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


def loads(data: bytes) -> dict:
    """Read bytes written by `dumps` back into a state dict. Never executes code."""
    data = memoryview(bytes(data))
    if len(data) < 16 or bytes(data[:8]) != MAGIC:
        raise StateError("not a streammargin state (bad magic)")
    (header_len,) = struct.unpack("<Q", data[8:16])
    if 16 + header_len > len(data):
        raise StateError("truncated state header")
    try:
        header = json.loads(bytes(data[16 : 16 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StateError(f"unreadable state header: {error}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        raise StateError(f"unsupported state format {header.get('format')!r}")
    body = data[16 + header_len :]
    arrays = []
    for spec in header["arrays"]:
        dtype = spec["dtype"]
        if dtype not in _ALLOWED_DTYPES:
            raise StateError(f"dtype {dtype!r} is not allowed in a state")
        shape = tuple(int(n) for n in spec["shape"])
        start, nbytes = int(spec["offset"]), int(spec["nbytes"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if (
            start < 0
            or nbytes != count * np.dtype(dtype).itemsize
            or start + nbytes > len(body)
            or any(n < 0 for n in shape)
        ):
            raise StateError(f"array spec {spec!r} does not fit the state")
        array = np.frombuffer(body[start : start + nbytes], dtype=dtype).reshape(shape)
        arrays.append(array.astype(np.dtype(dtype).newbyteorder("="), copy=True))
    tree = _put_arrays(header["tree"], arrays)
    if not isinstance(tree, dict):
        raise StateError("a state must be a dict")
    return tree


# Model classes ----------------------------------------------------------------------------------


def register(cls: type) -> type:
    """Class decorator: let `from_state` restore instances of `cls` by name."""
    _REGISTRY[cls.__name__] = cls
    return cls


def registered_models() -> dict[str, type]:
    import streammargin  # noqa: F401  (importing the package registers every model)

    return dict(_REGISTRY)


def from_state(state: dict, max_bytes: int | None = None) -> typing.Any:
    """Restore a model from `model.to_state()` (or `loads(...)` of its bytes).

    A state whose params imply a memory bound above `max_bytes` (default
    `streammargin.memory.DEFAULT_MAX_STATE_BYTES`, 1 GiB) raises `StateError` before anything is
    allocated (`streammargin.memory`).
    """
    name = state.get("model") if isinstance(state, dict) else None
    cls = registered_models().get(name)  # type: ignore[arg-type]
    if cls is None:
        raise StateError(f"unknown model {name!r} in state; known: {sorted(_REGISTRY)}")
    if max_bytes is None:
        return cls.from_state(state)
    return cls.from_state(state, max_bytes=max_bytes)


def check_array(state_arrays: dict, name: str, dtype: typing.Any, ndim: int) -> np.ndarray:
    """Fetch one array of a saved state, checking dtype and dimensions."""
    try:
        array = state_arrays[name]
    except KeyError:
        raise StateError(f"state lacks the array {name!r}") from None
    if not isinstance(array, np.ndarray) or array.dtype != np.dtype(dtype) or array.ndim != ndim:
        raise StateError(f"state array {name!r} is not a {ndim}-d {np.dtype(dtype)} array")
    return np.ascontiguousarray(array).copy()
