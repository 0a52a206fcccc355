"""The `streammargin` command: a thin layer over the library and connector APIs.

Each subcommand lives in its own module, which exposes `add_parser(subparsers)`; the parser it
adds sets `func` to the function that runs it. Every failure, a bad command line included, ends
in one or two lines (cause, fix) and a non-zero exit code (`connectors.errors`); `--log-level
DEBUG` adds the traceback.
"""

from __future__ import annotations

import importlib
import sys

from connectors import errors

SUBCOMMANDS = ["connectors.demo", "connectors.evaluate_command", "connectors.kafka_command",
               "connectors.warmup_command"]


def build_parser() -> errors.ArgumentParser:
    parser = errors.ArgumentParser(
        prog="streammargin",
        description="Online large-margin classifiers for event streams.",
    )
    # Subparsers are made by the parent's class: they report a bad option in two lines too.
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit:  # --help, or a bad command line (already reported in two lines)
        return exit.code if isinstance(exit.code, int) else errors.EXIT_USAGE
    return errors.run_command(f"streammargin {args.command}", args.func, args)


if __name__ == "__main__":
    sys.exit(main())
