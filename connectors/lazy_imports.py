"""Modules loaded on first use instead of at import: a shorter, smaller start of the worker.

`import river.drift` (the drift detectors of every worker) runs River's `drift/__init__.py`,
which imports `river.drift.datasets`, hence River's data sets, `river.stream` and through them
SciPy's io and optimize packages and scikit-learn when it is installed; KSWIN's module imports
`scipy.stats`. None of it is used until a KSWIN detector tests or someone reads a data set, yet
it is ~1 s and ~60-90 MiB of every worker's start (`python -X importtime`).

`defer(name)` puts in `sys.modules` a module object for `name` that runs the module's own code
the first time an attribute it lacks is read (`from x import y`, `x.y`): from then on it is the
real module (same object, same dict), for every importer. Nothing is deferred that is imported
already, and a module whose parent package cannot be found is left alone.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
import types
import typing

__all__ = ["defer", "is_deferred"]

_lock = threading.RLock()
_deferred: set[str] = set()


def is_deferred(name: str) -> bool:
    """Whether `name` is in `sys.modules` and has not run its code yet."""
    return name in _deferred


def defer(name: str) -> bool:
    """Defer the import of the submodule `name` (e.g. "river.drift.datasets") to its first
    attribute read; its parent's parent is imported now (the parent itself is not). Returns
    whether a deferred module was put in place."""
    with _lock:
        if name in sys.modules or "." not in name:
            return False
        parent_name, _, _ = name.rpartition(".")
        if parent_name in sys.modules:
            search = getattr(sys.modules[parent_name], "__path__", None)
        else:
            try:
                parent = importlib.util.find_spec(parent_name)  # imports the grandparent only
            except (ImportError, ValueError):
                return False
            search = None if parent is None else parent.submodule_search_locations
        if search is None:
            return False
        spec = importlib.machinery.PathFinder.find_spec(name, list(search))
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return False
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _loader(module, spec)  # type: ignore[attr-defined]
        sys.modules[name] = module
        _deferred.add(name)
        return True


def _loader(module: types.ModuleType, spec: importlib.machinery.ModuleSpec) -> typing.Callable:
    def load(attribute: str) -> typing.Any:
        with _lock:
            if module.__name__ in _deferred:
                # The module's own code may define a module __getattr__: ours goes first.
                del module.__getattr__  # type: ignore[attr-defined]
                _deferred.discard(module.__name__)
                try:
                    spec.loader.exec_module(module)  # type: ignore[union-attr]
                except BaseException:
                    sys.modules.pop(module.__name__, None)
                    raise
        try:
            return module.__dict__[attribute]
        except KeyError:
            module_getattr = module.__dict__.get("__getattr__")
            if module_getattr is not None:
                return module_getattr(attribute)
            raise AttributeError(
                f"module {module.__name__!r} has no attribute {attribute!r}") from None

    return load
