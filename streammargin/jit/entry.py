"""Calling a compiled numba function without numba's dispatch, where argument types are fixed."""

from __future__ import annotations

import contextlib
import threading
import typing

import numba

__all__ = ["EntryPoint", "types_only"]

# Set by `types_only()` in this thread: `EntryPoint.compiled` checks and loads nothing.
_types_only = threading.local()


@contextlib.contextmanager
def types_only() -> typing.Iterator[None]:
    """Within this block (in this thread), `EntryPoint.compiled` checks its arguments but loads
    no compiled code: it returns a function that raises `RuntimeError` if called.

    For models built only to validate their parameters (the Kafka worker's configuration
    checks): loading a model's compiled code initialises numba's code generator and LLVM (about
    60 MB of the process and a fraction of a second), which checking a command line does not
    need. Such a model must not be used.

    >>> import numpy as np
    >>> from numba import njit
    >>> @njit
    ... def twice(a):
    ...     return 2.0 * a[0]
    >>> with types_only():
    ...     unloaded = EntryPoint(twice, np.zeros(1)).compiled(np.zeros(1))
    >>> unloaded(np.ones(1))
    Traceback (most recent call last):
    ...
    RuntimeError: twice's entry point is not loaded: bound within types_only(), for validation only
    >>> twice.signatures
    []

    """
    previous = getattr(_types_only, "active", False)
    _types_only.active = True
    try:
        yield
    finally:
        _types_only.active = previous


class EntryPoint:
    """A numba function compiled for fixed argument types, to be called without numba's dispatch.

    On every call numba's dispatcher works out the types of the arguments to pick a compiled
    version: with seven arguments that is about 40% of the call (1.28 us -> 0.72 us on the
    development VM), as much as ALMA's whole trial on a 10-feature instance. The compiled
    version's own entry point skips that and trusts its arguments: an array of another dtype,
    number of dimensions, layout or writability would be read and written as if it were of the
    signature's type, corrupting memory. So the contract is explicit, and checked where the
    arguments are made rather than on every call:

    - `EntryPoint(dispatcher, *example_args)` fixes the signature: the numba types of the
      examples (`signature`);
    - `compiled(*args)` checks the leading arguments it is given (a model passes its own
      arrays, where it makes them) against the signature, raising `TypeError` naming the first
      that differs, and returns the compiled function (compiled, or loaded from numba's cache,
      on the first use in the process);
    - every later call must pass those arrays, or arrays of the same types by construction (a
      model grows its arrays with `streammargin.base.grown`, which keeps dtype and layout), and
      per-record arguments of the signature's types (`FeatureSpace.encode_packed` makes int64
      columns and bytes, `FeatureSpace.encode` int64 columns and read-only float64 values:
      `tests/test_features.py`).

    >>> import numpy as np
    >>> from numba import njit
    >>> @njit
    ... def total(a, b):
    ...     return a.sum() + b
    >>> entry = EntryPoint(total, np.zeros(1), 0.0)
    >>> fast_total = entry.compiled(np.arange(4.0))
    >>> fast_total(np.arange(4.0), 1.0)
    7.0
    >>> entry.compiled(np.arange(4, dtype=np.float32))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: argument 0 of total's entry point is array(float32, 1d, C), it takes array(float64...

    """

    def __init__(self, dispatcher: typing.Any, *example_args: typing.Any):
        self.dispatcher = dispatcher
        self.signature = tuple(numba.typeof(arg) for arg in example_args)
        self._compiled: typing.Callable | None = None

    @property
    def name(self) -> str:
        return getattr(self.dispatcher, "__name__", repr(self.dispatcher))

    def check(self, *args: typing.Any) -> None:
        """Raise `TypeError` unless the leading arguments `args` have the signature's types."""
        if len(args) > len(self.signature):
            raise TypeError(f"{self.name}'s entry point takes {len(self.signature)} arguments")
        for position, (arg, expected) in enumerate(zip(args, self.signature)):
            try:
                got = numba.typeof(arg)
            except ValueError:  # a value numba has no type for
                got = type(arg).__name__
            if got != expected:
                raise TypeError(
                    f"argument {position} of {self.name}'s entry point is {got}, it takes "
                    f"{expected}"
                )

    def compiled(self, *args: typing.Any) -> typing.Callable:
        """The compiled function, after `check(*args)` (within `types_only()`: after the check,
        a function that raises)."""
        self.check(*args)
        if self._compiled is None and getattr(_types_only, "active", False):
            return self._unloaded
        if self._compiled is None:
            self.dispatcher.compile(self.signature)  # loads numba's on-disk cache when there is one
            self._compiled = self.dispatcher.overloads[self.signature].entry_point
        return self._compiled

    def bind(self, owner: typing.Any, attribute: str, *args: typing.Any) -> None:
        """Set `owner.<attribute>` to `compiled(*args)`, deferring the compile (or the load from
        numba's cache) to the first call: `args` are checked now, and the first call compiles,
        replaces the attribute with the compiled function and calls it.

        For a model's entry points that a process may never call: the Kafka worker predicts
        through another function than `predict_one`'s, and a model restored only to serve never
        learns. Compiling them when the model is built would make a fresh process wait for code
        it does not run (about a second a function).

        >>> import numpy as np
        >>> from numba import njit
        >>> @njit
        ... def first(a):
        ...     return a[0]
        >>> class Model:
        ...     pass
        >>> model = Model()
        >>> EntryPoint(first, np.zeros(1)).bind(model, "first", np.zeros(1))
        >>> first.signatures  # nothing compiled yet
        []
        >>> model.first(np.arange(1.0, 3.0))
        1.0
        >>> model.first is EntryPoint(first, np.zeros(1)).compiled()
        True

        """
        self.check(*args)
        if self._compiled is not None or getattr(_types_only, "active", False):
            setattr(owner, attribute, self.compiled())
            return

        def compile_then_call(*call_args: typing.Any) -> typing.Any:
            function = self.compiled()
            setattr(owner, attribute, function)
            return function(*call_args)

        setattr(owner, attribute, compile_then_call)

    def _unloaded(self, *args: typing.Any) -> typing.NoReturn:
        raise RuntimeError(f"{self.name}'s entry point is not loaded: bound within types_only(), "
                           "for validation only")
