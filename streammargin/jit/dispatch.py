"""The functions of `streammargin.jit`: compiled ahead of time where a built module has them,
by numba just in time where not, and numba imported only when it has something to compile.

`import numba` alone is ~115 MiB of a process and ~0.4 s (it loads LLVM), and a model's first
just-in-time compile takes 4-10 s. A process that finds the package's ahead-of-time module
(`streammargin.jit.aot`, built by `streammargin warmup`) runs every function it calls from
there, without importing numba; a process that does not, or that calls a function with argument
types the module was not built for, compiles just in time as before. Either way the results are
the same to the last bit (`tests/test_aot.py`).

`njit(...)` replaces numba's decorator in the modules of this package: it returns a
`JitFunction`, which holds the Python function and numba's options and makes numba's dispatcher
only when one is needed (a compile, or a compiled caller that calls it: numba types the global
through `_numba_type_`, and reads the dispatcher's attributes, such as `targetoptions` for
`inline="always"`, through `__getattr__`).

Types are named as numba names them (`str(numba.typeof(value))`, without importing numba):
`type_name` for the types the package's functions take (float64, int64 and bool scalars and
arrays, read-only bytes), None for others (numba types those itself).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import typing

import numpy as np

__all__ = [
    "ExternalFunction",
    "JitFunction",
    "njit",
    "numba_module",
    "numba_type",
    "recording",
    "signature_of",
    "type_name",
]

_lock = threading.RLock()
_numba: typing.Any = None


def numba_module() -> typing.Any:
    """numba, imported on the first call, with the package's cache stamp in place
    (`streammargin.jit.install_package_stamp`)."""
    global _numba
    if _numba is None:
        with _lock:
            if _numba is None:
                import numba

                from streammargin.jit import install_package_stamp

                install_package_stamp()
                _numba = numba
    return _numba


# Type names --------------------------------------------------------------------------------------

# numba's names of the dtypes the package's arrays have (its `str` of the dtype's type).
_DTYPE_NAMES = {
    np.dtype(np.float64): "float64",
    np.dtype(np.int64): "int64",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.bool_): "bool",
    np.dtype(np.uint32): "uint32",
    np.dtype(np.int32): "int32",
}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BYTES = "readonly bytes(uint8, 1d, C)"


def type_name(value: typing.Any) -> str | None:
    """numba's name of `value`'s type (`str(numba.typeof(value))`), for the types listed in the
    module's doc; None for any other (a list, a str, an array of another dtype, an ndarray
    subclass, an int beyond int64).

    >>> type_name(np.zeros((2, 3)))
    'array(float64, 2d, C)'
    >>> type_name(np.zeros((2, 3))[:, 1])
    'array(float64, 1d, A)'
    >>> type_name(np.frombuffer(bytes(8)))
    'readonly array(float64, 1d, C)'
    >>> type_name(1.5), type_name(3), type_name(True), type_name(b"")
    ('float64', 'int64', 'bool', 'readonly bytes(uint8, 1d, C)')
    >>> type_name([1.0]) is None
    True

    """
    kind = type(value)
    if kind is np.ndarray:
        dtype = _DTYPE_NAMES.get(value.dtype)
        if dtype is None:
            return None
        flags = value.flags
        layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
        name = f"array({dtype}, {value.ndim}d, {layout})"
        if not flags.writeable:
            name = "readonly " + name
        if not flags.aligned:
            name = "unaligned " + name
        return name
    if kind is float or kind is np.float64:
        return "float64"
    if kind is bool or kind is np.bool_:
        return "bool"
    if kind is int:
        return "int64" if _INT64_MIN <= value <= _INT64_MAX else None
    if kind is np.int64:
        return "int64"
    if kind is bytes:
        return _BYTES
    return None


def signature_of(args: typing.Sequence) -> tuple[str, ...] | None:
    """The type names of `args`, or None if one has none (`type_name`)."""
    names = tuple(type_name(arg) for arg in args)
    return None if None in names else names


def numba_type(name: str) -> typing.Any:
    """The numba type `type_name` names (imports numba)."""
    types = numba_module().types
    if name == _BYTES:
        return types.Bytes(types.uint8, 1, "C", readonly=True)
    aligned = not name.startswith("unaligned ")
    rest = name.removeprefix("unaligned ")
    readonly = rest.startswith("readonly ")
    rest = rest.removeprefix("readonly ")
    if rest.startswith("array(") and rest.endswith(")"):
        dtype, ndim, layout = rest[len("array("):-1].split(", ")
        return types.Array(_scalar_type(types, dtype), int(ndim.removesuffix("d")), layout,
                           readonly=readonly, aligned=aligned)
    if rest != name:
        raise ValueError(f"not a type name of streammargin.jit.dispatch: {name!r}")
    return _scalar_type(types, name)


def _scalar_type(types: typing.Any, name: str) -> typing.Any:
    if name == "bool":
        return types.boolean
    if name in ("float64", "int64", "uint8", "uint32", "int32"):
        return getattr(types, name)
    raise ValueError(f"not a type name of streammargin.jit.dispatch: {name!r}")


# What Python calls -------------------------------------------------------------------------------

# Set by `recording()`: (module, function, signature) of every call from Python that is typed
# here (JitFunction calls and EntryPoint bindings), for `streammargin.jit.aot`'s list of exports.
_recorded: set[tuple[str, str, tuple[str, ...]]] | None = None


@contextlib.contextmanager
def recording() -> typing.Iterator[set]:
    """Within this block, collect (module, function, signature) of every call from Python into
    a function of the package (the set yielded): what the ahead-of-time module must export."""
    global _recorded
    with _lock:
        previous, _recorded = _recorded, set()
        calls = _recorded
    _forget_resolutions()  # (a memoised resolution is not recorded again)
    try:
        yield calls
    finally:
        with _lock:
            _recorded = previous
        _forget_resolutions()


def _forget_resolutions() -> None:
    for function in JitFunction.instances:
        function._by_key.clear()


def is_recording() -> bool:
    """Whether a `recording()` block is open (code that keeps a compiled function beyond its
    entry point's `compiled()` asks it again then, so that the call is recorded)."""
    return _recorded is not None


def record(module: str, function: str, signature: tuple[str, ...]) -> None:
    calls = _recorded
    if calls is not None:
        calls.add((module, function, signature))


# ndarray.flags.num bits that change numba's type of an array: C and F contiguity, alignment,
# writability (not OWNDATA and the others).
_TYPE_FLAGS = 0x0001 | 0x0002 | 0x0100 | 0x0400


def _any_layout(name: str) -> str:
    """The type name of a read-only array of layout A of the array type `name`."""
    rest = name.removeprefix("unaligned ").removeprefix("readonly ")
    if not rest.startswith("array("):
        raise TypeError(f"an any_layout argument must be an array, not {name}")
    return "readonly " + rest[:-2] + "A)" if rest.endswith(", C)") or rest.endswith(", F)") \
        else "readonly " + rest


def _key(args: tuple) -> tuple:
    # The cheapest key that determines `signature_of(args)`. (An int's type also depends on its
    # value; the package passes none beyond int64, and the compiled function would refuse one
    # with an OverflowError.)
    return tuple([
        (arg.dtype.num, arg.ndim, arg.flags.num & _TYPE_FLAGS) if type(arg) is np.ndarray
        else type(arg)
        for arg in args
    ])


class JitFunction:
    """A function of the package, compiled ahead of time or by numba (see the module's doc).

    Called from Python, it runs the ahead-of-time module's version for the arguments' types if
    there is one, else numba's dispatcher (which compiles, or loads from numba's cache, on the
    first call with those types). The choice is memoised per argument types (~1.3 us a call
    more than numba's own dispatch at seven arguments: a model's per-record calls go through
    `streammargin.jit.entry.EntryPoint` instead).
    """

    instances: typing.ClassVar[list[JitFunction]] = []

    def __init__(self, py_func: typing.Callable, options: dict):
        functools.update_wrapper(self, py_func)
        self.py_func = py_func
        options = dict(options)
        any_layout = options.pop("any_layout", ())
        self.options = options
        parameters = list(inspect.signature(py_func).parameters)
        # Positions of the arrays taken as read-only arrays of any layout (see `njit`).
        self.any_layout = tuple(parameters.index(name) for name in any_layout)
        self._dispatcher: typing.Any = None
        self._by_key: dict[tuple, typing.Callable] = {}
        JitFunction.instances.append(self)

    def ahead_of_time_signature(self, signature: tuple[str, ...]) -> tuple[str, ...]:
        """The signature the ahead-of-time module has for arguments of these types: the
        `any_layout` arrays as read-only arrays of layout A."""
        if not self.any_layout:
            return signature
        widened = list(signature)
        for position in self.any_layout:
            widened[position] = _any_layout(widened[position])
        return tuple(widened)

    @property
    def dispatcher(self) -> typing.Any:
        """numba's dispatcher of the function (made on first use: imports numba)."""
        if self._dispatcher is None:
            numba = numba_module()
            with _lock:
                if self._dispatcher is None:
                    self._dispatcher = numba.njit(**self.options)(self.py_func)
        return self._dispatcher

    @property
    def _numba_type_(self) -> typing.Any:
        # numba's type of this object where a compiled function refers to it: its dispatcher's.
        return self.dispatcher._numba_type_

    def __getattr__(self, name: str) -> typing.Any:
        # numba's compiler reads a callee's dispatcher attributes (`targetoptions`, `py_func`,
        # `get_call_template`...): only names this object lacks get here.
        if name.startswith("__") or name in ("_dispatcher", "_by_key", "py_func", "options"):
            raise AttributeError(name)
        return getattr(self.dispatcher, name)

    def __call__(self, *args: typing.Any) -> typing.Any:
        key = _key(args)
        function = self._by_key.get(key)
        if function is None:
            function = self._resolve(args, key)
        return function(*args)

    def _resolve(self, args: tuple, key: tuple) -> typing.Callable:
        from streammargin.jit import aot

        signature = signature_of(args)
        function = None
        if signature is not None:
            signature = self.ahead_of_time_signature(signature)
            record(self.__module__, self.__name__, signature)
            function = aot.lookup(self.__module__, self.__name__, signature)
        if function is None:
            function = self.dispatcher
        self._by_key[key] = function
        return function

    def __repr__(self) -> str:
        return f"<streammargin.jit function {self.__module__}.{self.__name__}>"


def njit(*args: typing.Any, **options: typing.Any) -> typing.Any:
    """`numba.njit` for the package's modules: `@njit(cache=True, ...)` makes a `JitFunction`
    with those options (numba's dispatcher is made when first needed).

    One option is not numba's: `any_layout=("X",)` names array parameters the function only
    reads and that come in any layout (a frame's values: column-major, row-major, strided,
    read-only or not). numba compiles a version per layout it meets; the ahead-of-time module
    has one, for a read-only array of layout A, which takes them all.

    Small helpers that take arrays are `inline="always"`: a call numba does not inline costs
    reference counting on every array argument (ALMA's trial ran 40% faster inlined; at 10
    features its inlined intermediate functions gain 8-16% a record). Inlining copies the
    callee's IR into each caller, which costs compile time, so it is dropped where it does not
    pay a record (`alma.normalise`: 1.9 s of a fresh process's first prediction). No function
    uses fast-math: LLVM reorders no floating-point operation, so the JIT and the ahead-of-time
    modules give the same bits."""
    if args and callable(args[0]) and not options:
        return JitFunction(args[0], {})
    if args:
        raise TypeError("njit takes keyword options only, e.g. @njit(cache=True)")
    return lambda py_func: JitFunction(py_func, options)



class ExternalFunction:
    """A C function of the process that compiled code calls, float64 arguments and result
    (numba's `types.ExternalFunction`, made when a compile needs it)."""

    def __init__(self, symbol: str, n_args: int):
        self.symbol = symbol
        self.n_args = n_args

    @property
    def _numba_type_(self) -> typing.Any:
        types = numba_module().types
        return types.ExternalFunction(self.symbol,
                                      types.float64(*[types.float64] * self.n_args))

    def __repr__(self) -> str:
        return f"<external function {self.symbol}>"
