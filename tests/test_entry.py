"""Entry points (`streammargin.jit.entry`): the argument types they trust are checked where the
arguments are made, so a wrong dtype raises instead of corrupting memory."""

from __future__ import annotations

import os
import pickle

import numba
import numpy as np
import pandas as pd
import pytest

import streammargin
from streammargin import alma, convex_polytope, state
from streammargin.features import FeatureSpace
from streammargin.jit.dispatch import njit
from streammargin.jit.entry import EntryPoint


@njit(cache=False)
def _add_to(out, values):
    for i in range(values.shape[0]):
        out[i] += values[i]


def test_an_entry_point_refuses_arguments_of_other_types_naming_them():
    entry = EntryPoint(_add_to, np.zeros(3), np.zeros(3))
    add = entry.compiled(np.zeros(4))
    out = np.zeros(2)
    add(out, np.ones(2))
    assert out.tolist() == [1.0, 1.0]
    for bad, what in (
        (np.zeros(4, dtype=np.float32), "float32"),
        (np.zeros((2, 2)), "2d"),
        (np.zeros(8)[::2], "1d, A"),  # not contiguous
        (np.frombuffer(bytes(16)), "readonly"),
        ([0.0, 1.0], "a list"),
        ("text", "a str"),
    ):
        with pytest.raises(TypeError, match=rf"argument 0 of _add_to's entry point is .*{what}"):
            entry.compiled(bad)
    with pytest.raises(TypeError, match="argument 1"):
        entry.check(np.zeros(1), np.zeros(1, dtype=np.int64))
    with pytest.raises(TypeError, match="takes 2 arguments"):
        entry.check(np.zeros(1), np.zeros(1), np.zeros(1))


def trained(model, n=40):
    rng = np.random.default_rng(0)
    for i in range(n):
        x = {f"f{j}": float(v) for j, v in enumerate(rng.normal(size=1 + i % 5))}
        model.predict_one(x)
        model.learn_one(x, bool(x["f0"] > 0) if not model._multiclass else "abc"[i % 3])
    return model


MODELS = {
    "alma": (lambda: streammargin.ALMAClassifier(), ("_vectors", "_st")),
    "cpm": (
        lambda: streammargin.ConvexPolytopeClassifier(window=5), ("_weights", "_st", "_window")
    ),
    "cpm-one": (
        lambda: streammargin.ConvexPolytopeClassifier(polytopes="one", window=5),
        ("_weights", "_st", "_window"),
    ),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_a_wrong_dtype_raises_where_the_arrays_are_made(name):
    make, arrays = MODELS[name]
    model = trained(make())
    # Every way the model makes its arrays gives the entry points' types: fresh, grown, new
    # classes (CPM), restored, unpickled, rolled back after a bad frame.
    model._bind()
    twin = streammargin.from_state(state.loads(state.dumps(model.to_state())))
    twin._bind()
    pickle.loads(pickle.dumps(model))._bind()
    if name == "alma":
        with pytest.raises(ValueError):
            model.learn_many(pd.DataFrame({"f0": [1.0, np.inf]}), pd.Series([True, False]))
        model._bind()
    # An array of another dtype, shape or layout is refused with a TypeError, not used.
    for array_name in arrays:
        for change in (
            lambda a: a.astype(np.float32),
            lambda a: np.asfortranarray(a) if a.ndim == 2 and min(a.shape) > 1 else a[::-1],
            lambda a: a.reshape(-1) if a.ndim == 2 else a[:, None],
        ):
            broken = pickle.loads(pickle.dumps(model))
            data = broken.__getstate__()
            data[array_name] = change(data[array_name])
            with pytest.raises(TypeError, match="entry point"):
                broken.__setstate__(data)


def test_the_encodings_have_the_types_the_entry_points_take():
    """Per-record arguments are typed by FeatureSpace: int64 columns, packed bytes (ALMA) or
    read-only float64 values (CPM), on every path: new, cached, repeated, hashed and merged."""
    table, scalars = np.zeros((4, 3)), np.zeros(alma.alma_jit.STATE_SIZE)
    space = FeatureSpace(max_features=4)  # three exact columns, one hashed
    for x, grow in (
        ({"a": 1.0, "b": 2.0}, True),
        ({"a": 1.0, "b": 2.0}, True),  # the cache
        ({"a": 1.5, "b": 2.0}, False),
        ({"c": 1.0, "d": 2.0, "e": 3.0}, True),  # hashed names, merged into one entry
        ({"z": 1.0, "y": 2.0}, False),
        ({}, True),
    ):
        idx, packed = space.encode_packed(x, grow)
        alma._LEARN_THEN_PREDICT.check(table, scalars, idx, packed, 1.0, idx, packed)
        repeat = space.repeat_encoding(x)
        if repeat is not None:
            alma._LEARN_THEN_PREDICT.check(table, scalars, *repeat, 1.0, *repeat)
        idx, val = space.encode(x, grow)
        convex_polytope._PREDICT.check(np.zeros((4, 2)), np.zeros(3), idx, val)
        assert str(numba.typeof(val)) == convex_polytope._PREDICT.signature[3]


def test_types_only_checks_and_loads_nothing_in_its_own_thread():
    import threading

    from streammargin.jit.entry import types_only

    @njit(cache=False)
    def double(a):
        return 2.0 * a[0]

    entry = EntryPoint(double, np.zeros(1))
    with types_only():
        with pytest.raises(TypeError):  # still checked
            entry.compiled(np.zeros(1, dtype=np.int64))
        unloaded = entry.compiled(np.zeros(1))
        # Another thread (the worker's warm-up) loads as usual meanwhile.
        other = []
        thread = threading.Thread(target=lambda: other.append(entry.compiled(np.zeros(1))))
        thread.start()
        thread.join()
    with pytest.raises(RuntimeError, match="types_only"):
        unloaded(np.ones(1))
    assert other[0](np.ones(1)) == 2.0 and entry.compiled(np.zeros(1))(np.ones(1)) == 2.0


# The numba cache stamp of the jit package ------------------------------------------------------


def test_every_jit_function_is_cached_under_the_stamp_of_the_whole_package():
    import importlib
    import pkgutil

    import streammargin.jit as jit

    for module_info in pkgutil.iter_modules(jit.__path__):
        module = importlib.import_module(f"streammargin.jit.{module_info.name}")
        for value in vars(module).values():
            cache = getattr(getattr(value, "_cache", None), "_impl", None)
            if cache is not None and value.__module__ == module.__name__:
                assert cache._locator.get_source_stamp() == jit.sources_stamp(), value


# (The package's functions are made by streammargin.jit.dispatch, which installs the stamp
# before numba makes anything: these modules do it themselves.)
STAMPED = "from pkg.jit import install_package_stamp\ninstall_package_stamp()\n"
CALLEE = STAMPED + "from numba import njit\n\n\n@njit(cache=True)\ndef value():\n    return {}\n"
CALLER = (STAMPED + "from numba import njit\n\nfrom pkg.jit.callee import value\n\n\n"
          "@njit(cache=True)\ndef twice():\n    return 2 * value()\n")


def test_a_change_to_one_jit_module_recompiles_the_functions_of_the_others(tmp_path):
    # A cached function that calls another module's function kept the old callee when only
    # the callee's file changed (numba stamps a cache with its own file's hash): four tests
    # failed that way after a rebase. The package's stamp covers every module.
    import shutil
    import subprocess
    import sys

    import streammargin.jit as jit

    package = tmp_path / "pkg" / "jit"
    package.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    shutil.copy(jit.__file__, package / "__init__.py")
    (package / "caller.py").write_text(CALLER)
    run = [sys.executable, "-c", "from pkg.jit.caller import twice; print(twice())"]
    for callee, expected in ((1, "2"), (21, "42")):
        (package / "callee.py").write_text(CALLEE.format(callee))
        done = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, check=True,
                              env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")})
        assert done.stdout.strip() == expected
    assert list((tmp_path / "cache").rglob("*.nbi")), "nothing was cached"


@pytest.mark.parametrize("name", ["ALMAClassifier", "BudgetSVMClassifier",
                                  "ConvexPolytopeClassifier", "KernelALMAClassifier",
                                  "SBPClassifier", "AutoClassifier"])
def test_a_model_whose_entry_points_were_never_called_is_freed_once_dropped(name):
    # A bound entry point is an attribute of its model: it must not make a cycle, or a model
    # restored and dropped at once (topic scope's join) waits for a full collection.
    import gc
    import weakref

    model = getattr(streammargin, name)()
    for i in range(30):
        model.learn_one({"a": float(i % 3), "b": 1.0}, i % 2 == 0)
    saved = model.to_state()
    gc.disable()
    try:
        restored = type(model).from_state(saved)
        dropped = weakref.ref(restored)
        del restored
        assert dropped() is None
    finally:
        gc.enable()
