"""`streammargin warmup`: compile the models' code ahead of time, where the image is built.

By default it builds the package's ahead-of-time compiled modules (`streammargin.jit.aot`: every
function the models call, compiled by `numba.pycc` into extension modules, ~1 minute on two
cores). A process that finds them runs the models without importing numba: the first prediction
of a fresh process comes ~0.3 s after its start instead of 5-14 s of compiling, and the worker
is ~115 MiB smaller. They are written beside the package (`streammargin/jit/_aot/`) or where
`--output` / `STREAMMARGIN_AOT_DIR` says (the process that runs the models must see the same
`STREAMMARGIN_AOT_DIR`), named after the package's sources: another version of streammargin
never loads them. In a container image:

    RUN streammargin warmup

The code is compiled for the architecture's generic CPU, so the image runs on any machine of
that architecture; `--cpu host` compiles for the building machine's own CPU instead (for an
image that runs where it is built). Modules already built for these sources are kept
(`--force` rebuilds them). Then each model runs the worker's per-record path on a few records,
to check that the compiled code serves it.

`--jit-cache` fills numba's cache instead (the just-in-time path, for an install that cannot
build extension modules: no C compiler): each model runs the worker's per-record path (with and
without the scaler, binary or multiclass as the model serves) and numba keeps its machine code in
`__pycache__` beside the sources, or in the folder `NUMBA_CACHE_DIR` names:

    ENV NUMBA_CACHE_DIR=/opt/streammargin/numba-cache NUMBA_CPU_NAME=generic
    RUN streammargin warmup --jit-cache

(`NUMBA_CPU_NAME=generic`, set when building and when running, makes that cache portable to
other CPUs.) Parameters that select other compiled code are warmed with `--model NAME --param
key=value`, as the worker will run them.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

from connectors import models
from connectors.cli.errors import EXIT_FAILURE, CommandError
from connectors.worker.warmup import WarmupFailed, warm


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "warmup",
        help="compile the models ahead of time (extension modules; or numba's cache with "
        "--jit-cache), e.g. when building a container image",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--output", type=pathlib.Path, default=None, metavar="DIR",
                        help="where to write the compiled modules (default: $STREAMMARGIN_AOT_DIR "
                        "or streammargin/jit/_aot beside the package)")
    parser.add_argument("--cpu", default="generic", metavar="NAME",
                        help="the CPU to compile for: generic (default, any machine of this "
                        "architecture), host, or an LLVM CPU name")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="modules compiled at once (default: the CPUs)")
    parser.add_argument("--force", action="store_true",
                        help="rebuild the modules already built for these sources")
    parser.add_argument("--jit-cache", action="store_true",
                        help="fill numba's cache (NUMBA_CACHE_DIR) instead of building modules")
    parser.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="a model to check (repeatable; default: every model: "
                        + ", ".join(models.model_names()) + ")")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a parameter of the models given (repeatable), as `streammargin "
                        "kafka --param`")
    parser.add_argument("--one-vs-rest", action="store_true",
                        help="also warm the binary models wrapped one-vs-rest")
    parser.add_argument("--log-level", default="INFO", metavar="LEVEL",
                        help="DEBUG adds tracebacks and the compiler's output to failures")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = args.model or list(models.model_names())
    try:
        params = models.parse_params(args.param)
        for name in names:
            models.model_class(name)  # an unknown name fails before anything is compiled
            models.check_model(name, params)  # so does a parameter it refuses
    except ValueError as error:
        raise CommandError(str(error), "give model names of `streammargin kafka --list-models` "
                           "and parameters they take (key=value)") from None
    from streammargin.jit import aot

    if args.jit_cache:
        where = os.environ.get("NUMBA_CACHE_DIR") or "__pycache__ beside the sources"
        print(f"numba cache: {where}", file=sys.stderr)
        return _check(args, names, params)
    output = args.output if args.output is not None else aot.directory()
    with aot.looking_in(output):  # (the models checked then use what was built there)
        _build(args, output)
        return _check(args, names, params)


def _check(args: argparse.Namespace, names: list[str], params: dict) -> int:
    """Run each model's per-record path; with the compiled modules, fail if one lacks a
    function the models called."""
    from connectors.codec import install_fast_crc32c
    from streammargin.jit import aot, dispatch

    crc = install_fast_crc32c()  # the worker's CRC-32C: numba's unless crc32c is installed
    print(f"CRC-32C for kafka-python: {crc}", file=sys.stderr)
    total = 0.0
    with dispatch.recording() as calls:
        for name in names:
            variants = [False]
            if args.one_vs_rest and not getattr(models.check_model(name, params), "_multiclass",
                                                False):
                variants.append(True)
            for one_vs_rest in variants:
                try:
                    seconds = warm(name, params, one_vs_rest)
                except WarmupFailed as error:
                    raise CommandError(str(error), "report it: the model refused the warm-up "
                                       "events", EXIT_FAILURE) from None
                total += seconds
                label = f"{name} --one-vs-rest" if one_vs_rest else name
                print(f"{label:<28} {seconds:6.1f} s", file=sys.stderr, flush=True)
    print(f"warmed {len(names)} models in {total:.1f} s", file=sys.stderr)
    if not args.jit_cache:
        missing = sorted({f"{module}.{function}" for module, function, signature in calls
                          if aot.lookup(module, function, signature) is None})
        if missing:
            raise CommandError(
                f"the compiled modules lack {', '.join(missing[:3])}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                + ": numba compiles those at their first call",
                "the models work; report it, with the model and parameters warmed",
                EXIT_FAILURE,
            )
        print(f"the compiled modules served all {len(calls)} compiled functions the models "
              "called", file=sys.stderr)
    return 0


def _build(args: argparse.Namespace, output: pathlib.Path) -> None:
    """Build the compiled modules into `output` (see the module's doc)."""
    from streammargin.jit import aot

    expected = len(aot.module_names())
    present = aot.built()
    if len(present) == expected and not args.force:
        print(f"compiled modules: {expected} already built for these sources in {output}",
              file=sys.stderr)
        return
    print(f"compiling {expected} modules into {output} (about a minute)", file=sys.stderr,
          flush=True)
    started = time.perf_counter()
    try:
        aot.build(output, cpu=args.cpu, jobs=args.jobs,
                  progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    except OSError as error:
        raise CommandError(
            f"cannot write the compiled modules into {output}: {error.strerror or error}",
            "pass --output DIR (a writable folder) and set STREAMMARGIN_AOT_DIR=DIR where the "
            "models run", EXIT_FAILURE,
        ) from None
    except aot.BuildError as error:
        if str(args.log_level).upper() == "DEBUG":
            print(error.output, file=sys.stderr)
        raise CommandError(
            str(error), "it needs a C compiler and Python's headers (e.g. Debian's gcc and "
            "python3-dev; --log-level DEBUG shows the compiler's output); without them, "
            "`streammargin warmup --jit-cache`", EXIT_FAILURE,
        ) from None
    print(f"compiled in {time.perf_counter() - started:.0f} s", file=sys.stderr)
