"""Numba hot loops of every model, kept in one place (`njit(cache=True)`, float64 arrays).

Model modules in `streammargin` hold the River plumbing; the arithmetic of each update rule lives
here, one module per algorithm family, working on contiguous arrays owned by the model. Their
`njit` is `streammargin.jit.dispatch.njit`: compiled ahead of time where `streammargin warmup`
built the package's module (`streammargin.jit.aot`), by numba just in time where not; numba is
imported only for the latter (`install_package_stamp` then runs first).
"""

from __future__ import annotations

import functools
import hashlib
import pathlib

_JIT_DIR = pathlib.Path(__file__).resolve().parent


@functools.lru_cache(maxsize=8)
def _hash_sources(stats: tuple) -> bytes:
    digest = hashlib.sha256()
    for name, _, _ in stats:
        digest.update(name.encode() + b"\0" + (_JIT_DIR / name).read_bytes() + b"\0")
    return digest.digest()


# The modules that compile nothing and whose code no compiled function reads: the machinery.
_MACHINERY = frozenset(("__init__.py", "aot.py", "dispatch.py", "entry.py"))


def sources_stamp() -> bytes:
    """SHA-256 of every module of this package but the machinery (names and contents): the stamp
    of each of their functions' numba caches, and of the ahead-of-time modules
    (`streammargin.jit.aot`).

    numba stamps a cached function with its own file's hash only, yet the modules here call (and
    inline) each other's functions: a cache built before a change to `budget.py` would keep
    serving `kernel_alma.py`'s functions with the old budget code. With the whole package in the
    stamp, changing any module recompiles them all; an install never changes them.
    (Re-hashed when a file's mtime or size changes, as numba does for its own stamp.)
    """
    stats = tuple(sorted(
        (path.name, stat.st_mtime_ns, stat.st_size)
        for path in _JIT_DIR.glob("*.py") if path.name not in _MACHINERY
        for stat in [path.stat()]
    ))
    return _hash_sources(stats)


class _PackageStamp:
    """Mixin of numba's file-backed cache locators: the package's stamp for this package's
    functions; other functions go to numba's own locators."""

    def get_source_stamp(self) -> bytes:
        return sources_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if pathlib.Path(py_file).resolve().parent != _JIT_DIR:
            return None
        return super().from_function(py_func, py_file)


def install_package_stamp() -> None:
    """Put the package's stamp into numba's cache (`sources_stamp`), once, before numba compiles
    or loads anything of the package (`streammargin.jit.dispatch.numba_module` calls it)."""
    from numba.core import caching

    # numba's locators, in its order (NUMBA_CACHE_DIR first, then __pycache__, then the user-wide
    # directory), each with the package's stamp, ahead of numba's own.
    locators = [
        type(f"Package{base.__name__}", (_PackageStamp, base), {})
        for base in (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator,
                     caching.UserWideCacheLocator)
    ]
    # (CacheImpl in numba 0.68, _CacheImpl before; tests/test_entry.py checks it is in place
    # with the version constraints.txt pins. Without it only a developer's edited checkout is
    # at risk: see `sources_stamp`.)
    cache_impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    existing = getattr(cache_impl, "_locator_classes", None)
    if type(existing) is list and not any(
        isinstance(locator, type) and issubclass(locator, _PackageStamp) for locator in existing
    ):
        existing[:0] = locators

