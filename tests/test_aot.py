"""The ahead-of-time compiled modules (`streammargin.jit.aot`, built by `streammargin warmup`):
built for these sources, exporting exactly what the models call, giving the JIT's results bit for
bit, serving the worker without numba; and the type names they are looked up by."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streammargin.jit import aot, dispatch

ROOT = pathlib.Path(__file__).resolve().parent.parent
REBUILD = "run `make test` (or `streammargin warmup`) to build them for these sources"


def python(code: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env={**os.environ, **env}, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


# Type names -------------------------------------------------------------------------------------

DTYPES = [np.float64, np.int64, np.uint8, np.bool_, np.int32, np.uint32]


@st.composite
def arrays(draw):
    array = draw(hnp.arrays(st.sampled_from(DTYPES), hnp.array_shapes(min_dims=1, max_dims=3,
                                                                      min_side=0, max_side=4)))
    view = draw(st.sampled_from(["as is", "transposed", "strided", "read-only", "fortran"]))
    if view == "transposed":
        array = array.T
    elif view == "strided" and array.shape[0] > 1:
        array = array[::2]
    elif view == "read-only":
        array.flags.writeable = False
    elif view == "fortran":
        array = np.asfortranarray(array)
    return array


scalars = st.one_of(st.floats(), st.integers(-(2**63), 2**63 - 1), st.booleans(),
                    st.binary(max_size=8), st.just(np.float64(1.5)), st.just(np.int64(3)),
                    st.just(np.bool_(True)))


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(arrays(), scalars))
def test_type_names_are_numbas_own(value):
    name = dispatch.type_name(value)
    assert name == str(numba.typeof(value))
    assert dispatch.numba_type(name) == numba.typeof(value)


def test_values_without_a_type_name_are_left_to_numba():
    for value in ([1.0], "text", np.zeros(2, np.float32), 2**64, None, (1.0, 2.0)):
        assert dispatch.type_name(value) is None
    assert dispatch.signature_of((np.zeros(1), [1.0])) is None


def test_any_layout_arguments_take_one_read_only_layout_a_version():
    from streammargin.jit import alma

    signature = ("array(float64, 2d, C)", "array(float64, 1d, C)", "array(float64, 2d, F)",
                 "array(int64, 1d, C)", "array(float64, 1d, C)")
    widened = alma.margin_rows.ahead_of_time_signature(signature)
    assert widened[2] == "readonly array(float64, 2d, A)" and widened[:2] == signature[:2]
    assert alma.margin.ahead_of_time_signature(signature) == signature


# The modules ------------------------------------------------------------------------------------


def test_the_modules_are_built_for_these_sources():
    built = {path.name.removeprefix(aot.module_name("")).split(".")[0] for path in aot.built()}
    assert built == set(aot.module_names()), f"compiled modules missing: {REBUILD}"


def test_exports_json_lists_exactly_what_the_exercise_calls():
    from streammargin import exercise

    recorded = exercise.record_exports()
    listed = {(f"streammargin.jit.{module}", function, tuple(signature))
              for module, functions in aot.read_exports().items()
              for function, signatures in functions.items() for signature in signatures}
    assert recorded == listed, (
        "streammargin/jit/exports.json is out of date: run `.venv/bin/python -m "
        f"streammargin.exercise --write`, then `{REBUILD}`\n"
        f"called, not listed: {sorted(recorded - listed)[:5]}\n"
        f"listed, not called: {sorted(listed - recorded)[:5]}"
    )


# What each model computes, on its per-record path, after a restore and (ALMA) on mini-batches:
# the same in a process on the compiled modules and in one on numba's JIT.
FINGERPRINT = """
import hashlib, json, sys
import numpy as np
from streammargin import exercise, state
from streammargin.jit import aot

digests = {}
for model, labels in exercise._models():
    name = repr(model).replace(chr(10), " ")
    records = exercise._records(labels)
    outputs = []
    for x, label in records:
        outputs.append(repr((model.predict_one(x), model.predict_proba_one(x))))
        model.learn_one(x, label)
    restored = exercise._round_trips(model, records)
    outputs.append(repr([restored.predict_proba_one(x) for x, _ in records[:20]]))
    if type(model).__name__ == "ALMAClassifier":
        exercise._batches(model, records[:40])
    outputs.append(state.dumps(model.to_state()).hex())
    digests[name] = hashlib.sha256(repr(outputs).encode()).hexdigest()
print(json.dumps({"numba": "numba" in sys.modules, "modules": len(aot.loaded_modules()),
                  "digests": digests}))
"""


def start_jit_fingerprint(folder: pathlib.Path) -> subprocess.Popen:
    """The fingerprint on numba's JIT, in a process of its own (conftest starts it when the
    test is collected, once per run: it compiles every model, ~70 s). It writes its output to
    `folder`, then its exit status to jit.rc, and removes its `.early` mark (tests/conftest.py)."""
    script = ('"$0" -c "$1" >"$2/jit.out" 2>"$2/jit.err"; echo $? >"$2/jit.part"; '
              'mv "$2/jit.part" "$2/jit.rc"; rm -f "$2/$$.early"')
    return subprocess.Popen(["sh", "-c", script, sys.executable, FINGERPRINT, str(folder)],
                            cwd=ROOT, env={**os.environ, "STREAMMARGIN_AOT": "0"},
                            start_new_session=True)


@pytest.mark.started_early(start=start_jit_fingerprint)
def test_the_compiled_modules_compute_what_the_jit_computes_bit_for_bit():
    compiled = json.loads(python(FINGERPRINT))
    folder = pathlib.Path(os.environ["STREAMMARGIN_TEST_RUN_FOLDER"])
    deadline = time.monotonic() + 900
    while not (folder / "jit.rc").exists():
        assert time.monotonic() < deadline, "the JIT's fingerprint took over 900 s"
        time.sleep(0.2)
    err = (folder / "jit.err").read_text()
    assert (folder / "jit.rc").read_text().strip() == "0", err[-3000:]
    jit = json.loads((folder / "jit.out").read_text().strip().splitlines()[-1])
    assert not compiled["numba"] and compiled["modules"] >= 8, REBUILD
    assert jit["numba"] and jit["modules"] == 0
    assert len(compiled["digests"]) > 40
    different = [name for name, digest in compiled["digests"].items()
                 if jit["digests"][name] != digest]
    assert not different, different


def test_the_worker_runs_every_model_without_numba():
    out = json.loads(python("""
        import json, sys
        from connectors import models
        from connectors.worker.warmup import warm
        for name in models.model_names():
            warm(name)
            warm(name, one_vs_rest=True) if name in ("alma", "budgetsvm") else None
        from streammargin.jit import aot
        print(json.dumps(["numba" in sys.modules, len(aot.loaded_modules())]))
    """))
    assert out[0] is False and out[1] >= 8, REBUILD


def test_streammargin_aot_0_turns_the_modules_off():
    out = python("""
        import sys
        import streammargin
        from streammargin.jit import aot
        model = streammargin.ALMAClassifier()
        model.learn_one({"a": 1.0}, True)
        print(model.predict_one({"a": 1.0}), "numba" in sys.modules, aot.loaded_modules())
    """, STREAMMARGIN_AOT="0")
    assert out == "True True []"


def test_a_build_removes_stale_modules_and_a_process_finds_the_new_ones(tmp_path):
    stale = tmp_path / "streammargin_aot_0123456789abcdef_scaler.cpython-311-x86_64-linux-gnu.so"
    stale.write_bytes(b"not a module")
    other = tmp_path / "unrelated.txt"
    other.write_text("kept")
    built = aot.build(tmp_path, modules=["scaler"], jobs=1)
    assert len(built) == 1 and built[0].name.startswith(aot.module_name("scaler") + ".")
    assert not stale.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([built[0].name, "unrelated.txt"])
    # A process that looks there runs the scaler from it (and compiles nothing for it).
    out = python("""
        import sys
        from streammargin.scaler import StandardScaler
        from streammargin.jit import aot
        scaler = StandardScaler()
        for i in range(5):
            scaler.apply_learn(scaler.transform_learn_one({"a": float(i)})[2])
        print(aot.loaded_modules(), "numba" in sys.modules)
    """, STREAMMARGIN_AOT_DIR=str(tmp_path))
    assert out == f"['{aot.module_name('scaler')}'] False"


def test_a_module_for_other_sources_is_never_loaded(tmp_path):
    (tmp_path / f"streammargin_aot_{'0' * 16}_calibration.so").write_bytes(b"\x7fELF garbage")
    out = python("""
        import streammargin
        from streammargin.jit import aot
        model = streammargin.SBPClassifier(gamma=1.0)
        model.learn_one({"a": 1.0}, True)
        print(model.predict_proba_one({"a": 1.0})[True] > 0, aot.loaded_modules())
    """, STREAMMARGIN_AOT_DIR=str(tmp_path))
    assert out == "True []"


def test_exports_json_is_sorted_and_one_signature_a_line():
    text = aot.EXPORTS_FILE.read_text()
    exports = json.loads(text)
    assert list(exports) == sorted(exports)
    for functions in exports.values():
        assert list(functions) == sorted(functions)
    assert hashlib.sha256(text.encode()).hexdigest()  # (parsed above: valid JSON)
