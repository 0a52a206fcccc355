"""Calling a compiled function of the package without a dispatch per call, where argument types
are fixed: ahead of time compiled (`streammargin.jit.aot`) or numba's compiled version."""

from __future__ import annotations

import contextlib
import threading
import typing
import weakref

from streammargin.jit import aot
from streammargin.jit.dispatch import numba_type, record, type_name

__all__ = ["EntryPoint", "types_only"]

# Set by `types_only()` in this thread: `EntryPoint.compiled` checks and loads nothing.
_types_only = threading.local()


@contextlib.contextmanager
def types_only() -> typing.Iterator[None]:
    """Within this block (in this thread), `EntryPoint.compiled` checks its arguments but loads
    no compiled code: it returns a function that raises `RuntimeError` if called.

    For models built only to validate their parameters (the Kafka worker's configuration
    checks): loading a model's compiled code may import numba and initialise LLVM (about 115 MB
    of the process and a fraction of a second), which checking a command line does not need.
    Such a model must not be used.

    >>> import numpy as np
    >>> from streammargin.jit.dispatch import njit
    >>> @njit
    ... def twice(a):
    ...     return 2.0 * a[0]
    >>> with types_only():
    ...     unloaded = EntryPoint(twice, np.zeros(1)).compiled(np.zeros(1))
    >>> unloaded(np.ones(1))
    Traceback (most recent call last):
    ...
    RuntimeError: twice's entry point is not loaded: bound within types_only(), for validation only

    """
    previous = getattr(_types_only, "active", False)
    _types_only.active = True
    try:
        yield
    finally:
        _types_only.active = previous


class EntryPoint:
    """A function of the package compiled for fixed argument types, to be called without a
    dispatch on them.

    On every call numba's dispatcher works out the types of the arguments to pick a compiled
    version (`streammargin.jit.dispatch.JitFunction` likewise, in Python): with seven arguments
    that is about 40% of the call (1.28 us -> 0.72 us on the development VM), as much as ALMA's
    whole trial on a 10-feature instance. The compiled version's own entry point skips that and
    trusts its arguments: an array of another dtype, number of dimensions, layout or
    writability would be read and written as if it were of the signature's type, corrupting
    memory. So the contract is explicit, and checked where the arguments are made rather than
    on every call:

    - `EntryPoint(function, *example_args)` fixes the signature: numba's names of the
      examples' types (`signature`, `streammargin.jit.dispatch.type_name`);
    - `compiled(*args)` checks the leading arguments it is given (a model passes its own
      arrays, where it makes them) against the signature, raising `TypeError` naming the first
      that differs, and returns the compiled function: the ahead-of-time module's
      (`streammargin.jit.aot`) if it has one for the signature, else numba's (compiled, or
      loaded from numba's cache, on the first use in the process);
    - every later call must pass those arrays, or arrays of the same types by construction (a
      model grows its arrays with `streammargin.base.grown`, which keeps dtype and layout), and
      per-record arguments of the signature's types (`FeatureSpace.encode_packed` makes int64
      columns and bytes, `FeatureSpace.encode` int64 columns and read-only float64 values:
      `tests/test_features.py`).

    >>> import numpy as np
    >>> from streammargin.jit.dispatch import njit
    >>> @njit
    ... def total(a, b):
    ...     return a.sum() + b
    >>> entry = EntryPoint(total, np.zeros(1), 0.0)
    >>> entry.signature
    ('array(float64, 1d, C)', 'float64')
    >>> fast_total = entry.compiled(np.arange(4.0))
    >>> fast_total(np.arange(4.0), 1.0)
    7.0
    >>> entry.compiled(np.arange(4, dtype=np.float32))
    Traceback (most recent call last):
    ...
    TypeError: argument 0 of total's entry point is a float32 array, it takes array(float64, 1d, C)

    """

    def __init__(self, function: typing.Any, *example_args: typing.Any):
        self.function = function
        signature = tuple(type_name(arg) for arg in example_args)
        if None in signature:
            raise TypeError(f"{self.name}'s entry point: argument "
                            f"{signature.index(None)} has no type an entry point takes")
        self.signature: tuple[str, ...] = signature
        self._compiled: typing.Callable | None = None

    @property
    def name(self) -> str:
        return getattr(self.function, "__name__", repr(self.function))

    def check(self, *args: typing.Any) -> None:
        """Raise `TypeError` unless the leading arguments `args` have the signature's types."""
        if len(args) > len(self.signature):
            raise TypeError(f"{self.name}'s entry point takes {len(self.signature)} arguments")
        for position, (arg, expected) in enumerate(zip(args, self.signature)):
            got = type_name(arg)
            if got != expected:
                raise TypeError(
                    f"argument {position} of {self.name}'s entry point is {_described(arg, got)}"
                    f", it takes {expected}"
                )

    def compiled(self, *args: typing.Any) -> typing.Callable:
        """The compiled function, after `check(*args)` (within `types_only()`: after the check,
        a function that raises)."""
        self.check(*args)
        if self._compiled is None and getattr(_types_only, "active", False):
            return self._unloaded
        record(self.function.__module__, self.name, self.signature)
        if self._compiled is None:
            self._compiled = self._load()
        return self._compiled

    def _load(self) -> typing.Callable:
        function = aot.lookup(self.function.__module__, self.name, self.signature)
        if function is not None:
            return function
        dispatcher = getattr(self.function, "dispatcher", self.function)
        types = tuple(numba_type(name) for name in self.signature)
        dispatcher.compile(types)  # loads numba's on-disk cache when there is one
        return dispatcher.overloads[types].entry_point

    def bind(self, owner: typing.Any, attribute: str, *args: typing.Any) -> None:
        """Set `owner.<attribute>` to `compiled(*args)`, deferring the compile (or the load from
        numba's cache) to the first call: `args` are checked now, and the first call compiles,
        replaces the attribute with the compiled function and calls it.

        For a model's entry points that a process may never call: the Kafka worker predicts
        through another function than `predict_one`'s, and a model restored only to serve never
        learns. Compiling them when the model is built would make a fresh process wait for code
        it does not run (about a second a function).

        >>> import numpy as np
        >>> from streammargin.jit.dispatch import njit
        >>> @njit
        ... def first(a):
        ...     return a[0]
        >>> class Model:
        ...     pass
        >>> model = Model()
        >>> entry = EntryPoint(first, np.zeros(1))
        >>> entry.bind(model, "first", np.zeros(1))
        >>> first._dispatcher is None  # nothing compiled yet (numba's dispatcher not even made)
        True
        >>> model.first(np.arange(1.0, 3.0))
        1.0
        >>> model.first is entry.compiled()
        True

        """
        self.check(*args)
        if self._compiled is not None or getattr(_types_only, "active", False):
            setattr(owner, attribute, self.compiled())
            return

        # A weak reference, not `owner`: the closure is an attribute of the owner, and a strong
        # one made a cycle that kept a model whose entry point was never called (one restored
        # and mixed at once, one that only predicts) until a full collection. Twelve restored
        # ALMA models merged one by one all stayed held: 7.5 MiB where one model is 0.5.
        owner_ref = weakref.ref(owner)

        def compile_then_call(*call_args: typing.Any) -> typing.Any:
            function = self.compiled()
            bound = owner_ref()
            if bound is not None:
                setattr(bound, attribute, function)
            return function(*call_args)

        setattr(owner, attribute, compile_then_call)

    def _unloaded(self, *args: typing.Any) -> typing.NoReturn:
        raise RuntimeError(f"{self.name}'s entry point is not loaded: bound within types_only(), "
                           "for validation only")


def _described(value: typing.Any, name: str | None) -> str:
    """How `check` names a value of the wrong type."""
    if name is not None:
        return name
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return f"a {dtype} array"
    return f"a {type(value).__name__}"
