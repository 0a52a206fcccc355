"""The package's functions compiled ahead of time: one extension module per module of
`streammargin.jit`, built from `exports.json` by `build` (`streammargin warmup`), found and run
by `streammargin.jit.dispatch` before numba's JIT.

`exports.json` lists, per module and function, the argument types (numba's names,
`dispatch.type_name`) with which the models call the package's functions from Python: every call
of `streammargin.exercise`, recorded (`python -m streammargin.exercise --write`;
`tests/test_aot.py` fails when the exercise calls anything else). `numba.pycc` compiles each
(function, types) into a module named after the package's sources and that list (`stamp`): a
changed source means another name, so a stale module is never used, and the JIT takes over until
the next build. The code is compiled for the architecture's generic CPU unless `build(cpu="host")`,
so an image built on one machine runs on another.

Beside them the build compiles the package's C (`NATIVE_SOURCES`: `records.c`, the per-record
encoding of a feature dict, which numba cannot compile, and the Kafka worker's record-batch
reader) with the C compiler Python was built with, under the same stamp; `native` gives such a
module, or None.

Where the modules are looked for: `$STREAMMARGIN_AOT_DIR` if set, else `_aot/` beside this file
(where `build` writes by default). `STREAMMARGIN_AOT=0` turns them off (numba compiles all).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import typing

from streammargin.jit import sources_stamp

__all__ = ["BuildError", "NATIVE_SOURCES", "build", "built", "directory", "enabled", "export_symbol",
           "loaded_modules", "looking_in", "lookup", "module_name", "module_names", "native",
           "read_exports", "stamp", "write_exports"]

EXPORTS_FILE = pathlib.Path(__file__).with_name("exports.json")
DEFAULT_DIRECTORY = pathlib.Path(__file__).with_name("_aot")
#: The package's C modules (short name -> source), built beside the numba ones. The Kafka
#: worker's C is built here too, where the `connectors` package sits beside this one (one
#: distribution, one `streammargin warmup`); it is found by path, so that this package never
#: imports `connectors` (`_CONNECTORS_SOURCES`).
NATIVE_SOURCES = {"records": pathlib.Path(__file__).with_name("records.c")}
# The worker's C: fetched record batches (kafka_records), Avro events (events), a batch of
# JSON records read into arrays (event_batches), a run's prediction records (predictions).
_CONNECTORS_SOURCES = {
    "kafka_records": ("kafka", "record_batch.c"),
    "events": ("serializers", "events.c"),
    "event_batches": ("serializers", "event_batches.c"),
    "predictions": ("task", "predictions.c"),
}
for _short, _parts in _CONNECTORS_SOURCES.items():
    _source = pathlib.Path(__file__).parents[2].joinpath("connectors", *_parts)
    if _source.is_file():
        NATIVE_SOURCES[_short] = _source
DIRECTORY_VARIABLE = "STREAMMARGIN_AOT_DIR"
SWITCH_VARIABLE = "STREAMMARGIN_AOT"

_lock = threading.Lock()
# (directory, short module name) -> the extension module found there, or None
_extensions: dict[tuple[str, str], typing.Any] = {}
_directories: list[pathlib.Path] = []  # `looking_in`'s, innermost last


def enabled() -> bool:
    """False when STREAMMARGIN_AOT=0 (numba compiles every function just in time)."""
    return os.environ.get(SWITCH_VARIABLE, "1").strip() != "0"


def directory() -> pathlib.Path:
    """Where the modules are looked for and built: `looking_in`'s folder within it, else
    $STREAMMARGIN_AOT_DIR, else `_aot/` here."""
    if _directories:
        return _directories[-1]
    configured = os.environ.get(DIRECTORY_VARIABLE, "").strip()
    return pathlib.Path(configured) if configured else DEFAULT_DIRECTORY


@contextlib.contextmanager
def looking_in(folder: pathlib.Path) -> typing.Iterator[None]:
    """Within this block, this process looks for (and builds) the modules in `folder`
    (`streammargin warmup --output`: the models it then checks use what it built)."""
    _directories.append(pathlib.Path(folder))
    try:
        yield
    finally:
        _directories.pop()


def stamp() -> str:
    """The stamp of the modules built from the package's current sources and `exports.json`."""
    digest = hashlib.sha256(sources_stamp())
    digest.update(EXPORTS_FILE.read_bytes())
    for source in NATIVE_SOURCES.values():
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def module_name(short: str) -> str:
    """The extension module of `streammargin.jit.<short>` for the package's current sources."""
    return f"streammargin_aot_{stamp()}_{short}"


def module_names() -> list[str]:
    """The short names of every module a build makes: those of `exports.json`, then the C ones."""
    return [*read_exports(), *NATIVE_SOURCES]


def native(short: str) -> typing.Any:
    """The built C module `short` of `NATIVE_SOURCES`, or None (not built for these sources, or
    STREAMMARGIN_AOT=0)."""
    if not enabled():
        return None
    return _extension(short)


def export_symbol(function: str, signature: tuple[str, ...]) -> str:
    """The name under which the module exports `function` compiled for `signature`."""
    digest = hashlib.sha256("|".join(signature).encode()).hexdigest()[:12]
    return f"{function}__{digest}"


def _extension(short: str) -> typing.Any:
    """The built module of `streammargin.jit.<short>`, or None (not built for these sources)."""
    key = (str(directory()), short)
    try:
        return _extensions[key]
    except KeyError:
        pass
    with _lock:
        if key not in _extensions:
            _extensions[key] = _load(pathlib.Path(key[0]), module_name(short))
    return _extensions[key]


def _load(folder: pathlib.Path, name: str) -> typing.Any:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / f"{name}{suffix}"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


def lookup(module: str, function: str, signature: tuple[str, ...]) -> typing.Callable | None:
    """The compiled `module.function` (a module of this package, by its full name) for arguments
    of these types, or None."""
    if not enabled():
        return None
    extension = _extension(module.rpartition(".")[2])
    if extension is None:
        return None
    return getattr(extension, export_symbol(function, signature), None)


def built() -> list[pathlib.Path]:
    """The modules built for the package's current sources in `directory()`."""
    return sorted(directory().glob(module_name("") + "*"))


def loaded_modules() -> list[str]:
    """The names of the built modules this process loaded."""
    return sorted(module.__name__ for module in _extensions.values() if module is not None)


def read_exports(path: pathlib.Path = EXPORTS_FILE) -> dict[str, dict[str, list[list[str]]]]:
    """`exports.json`: {short module name: {function: [signature, ...]}}."""
    return json.loads(path.read_text())


def write_exports(calls: typing.Iterable[tuple[str, str, tuple[str, ...]]],
                  path: pathlib.Path = EXPORTS_FILE) -> dict:
    """Write recorded calls (`dispatch.recording`) as `exports.json`, sorted; returns the dict."""
    exports: dict[str, dict[str, list[list[str]]]] = {}
    for module, function, signature in sorted(calls):
        short = module.rpartition(".")[2]
        exports.setdefault(short, {}).setdefault(function, []).append(list(signature))
    lines = ["{"]
    for m, (short, functions) in enumerate(exports.items()):
        lines.append(f"  {json.dumps(short)}: {{")
        for f, (function, signatures) in enumerate(functions.items()):
            lines.append(f"    {json.dumps(function)}: [")
            lines += [f"      {json.dumps(s)}" + ("," if i + 1 < len(signatures) else "")
                      for i, s in enumerate(signatures)]
            lines.append("    ]" + ("," if f + 1 < len(functions) else ""))
        lines.append("  }" + ("," if m + 1 < len(exports) else ""))
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
    return exports


# Building ----------------------------------------------------------------------------------------


class BuildError(RuntimeError):
    """A module's compile failed: the message names it and the compiler's last line, `output`
    is all the compiling process wrote."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output



def build(output: pathlib.Path | None = None, cpu: str = "generic", jobs: int | None = None,
          modules: typing.Iterable[str] | None = None,
          progress: typing.Callable[[str], None] | None = None) -> list[pathlib.Path]:
    """Compile `exports.json` (the modules named, default all) into `output` (default
    `directory()`), each module in its own process, `jobs` at a time (default: the CPUs);
    remove the modules of other sources there. Returns the paths built. Raises `BuildError`
    naming the module whose build failed."""
    every = module_names()
    names = list(modules) if modules is not None else every
    unknown = [name for name in names if name not in every]
    if unknown:
        raise ValueError(f"no module {unknown}: the modules are {sorted(every)}")
    output = pathlib.Path(output) if output is not None else directory()
    output.mkdir(parents=True, exist_ok=True)
    # (On the 2-core development machine, two at a time: ~1 minute for the 10 modules, ~8 MB.)
    jobs = jobs or os.cpu_count() or 1
    built = []
    with tempfile.TemporaryDirectory(prefix="streammargin-numba-cache-") as cache, \
            concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = {pool.submit(_build_one, name, output, cpu, cache): name for name in names}
        for done in concurrent.futures.as_completed(runs):
            path, seconds = done.result()
            built.append(path)
            if progress is not None:
                progress(f"{runs[done]:<18} {seconds:6.1f} s  {path.name}")
    current = {path.name for path in built}
    stamp = module_name("")
    for stale in output.glob("streammargin_aot_*"):
        if stale.name not in current and not stale.name.startswith(stamp):
            stale.unlink()
    return sorted(built)


def _build_one(short: str, output: pathlib.Path, cpu: str, cache: str
               ) -> tuple[pathlib.Path, float]:
    # A process per module: numba compiles under a process-wide lock. An empty numba cache: a
    # callee loaded from numba's cache is machine code, which cannot be linked into the module.
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    env.pop(SWITCH_VARIABLE, None)
    done = subprocess.run(
        [sys.executable, "-m", "streammargin.jit.aot", short, str(output), cpu],
        capture_output=True, text=True, env=env, check=False,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["(no output)"]
        raise BuildError(f"compiling the module of streammargin.jit.{short} failed: {lines[-1]}",
                         done.stderr)
    path, seconds = done.stdout.strip().splitlines()[-1].split("\t")
    return pathlib.Path(path), float(seconds)


def _compile_native(short: str, output: pathlib.Path, cpu: str) -> pathlib.Path:
    """Compile `NATIVE_SOURCES[short]` with the compiler and flags Python was built with."""
    import shlex
    import sysconfig

    name = module_name(short)
    final = output / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    building = output / f".building-{os.getpid()}-{final.name}"
    command = [
        *shlex.split(sysconfig.get_config_var("LDSHARED") or "cc -shared"),
        *shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC"),
        # -ffp-contract=off: no fused multiply-add where the target has one (-march=native),
        # so that records.c's scaler arithmetic stays River's to the last bit.
        "-O2", "-ffp-contract=off", *(["-march=native"] if cpu == "host" else []),
        "-I", sysconfig.get_paths()["include"], f"-DMODULE={name}",
        str(NATIVE_SOURCES[short]), "-o", str(building),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        building.unlink(missing_ok=True)
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"{shlex.join(command)} failed with exit code {done.returncode}")
    os.replace(building, final)
    return final


def _compile_module(short: str, output: pathlib.Path, cpu: str) -> pathlib.Path:
    """Compile the exports of `streammargin.jit.<short>` with numba.pycc (in this process), or
    the C module `short` (`NATIVE_SOURCES`)."""
    if short in NATIVE_SOURCES:
        return _compile_native(short, output, cpu)
    import importlib
    import warnings

    from streammargin.jit.dispatch import JitFunction, numba_module, numba_type

    numba_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba.pycc's pending deprecation
        from numba.pycc import CC

    source = importlib.import_module(f"streammargin.jit.{short}")
    name = module_name(short)
    compiler = CC(name, source_module=source)
    compiler.output_dir = str(output)
    compiler.target_cpu = "" if cpu == "generic" else cpu
    compiler.verbose = False
    for function, signatures in read_exports()[short].items():
        jitted = getattr(source, function)
        if not isinstance(jitted, JitFunction):
            raise TypeError(f"streammargin.jit.{short}.{function} is not a compiled function")
        for signature in signatures:
            argtypes = tuple(numba_type(type_name) for type_name in signature)
            compiler.export(export_symbol(function, tuple(signature)), argtypes)(jitted.py_func)
    # Built under a temporary name, then renamed: a process looking for the module never finds
    # half of one.
    final = output / compiler.output_file
    compiler.output_file = f".building-{os.getpid()}-{compiler.output_file}"
    compiler.compile()
    os.replace(output / compiler.output_file, final)
    return final


if __name__ == "__main__":
    import time

    started = time.perf_counter()
    built_path = _compile_module(sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3])
    print(f"{built_path}\t{time.perf_counter() - started:.2f}")
