"""The `streammargin` command: a thin layer over the library and connector APIs (also
`python -m connectors.cli`).

Each subcommand lives in its own module of this package, which exposes `add_parser(subparsers)`;
the parser it adds sets `func` to the function that runs it. Every failure, a bad command line
included, ends in one or two lines (cause, fix) and a non-zero exit code
(`connectors.cli.errors`); `--log-level DEBUG` adds the traceback.
"""

from __future__ import annotations

import importlib

from connectors.cli import errors

SUBCOMMANDS = ["connectors.cli.demo", "connectors.cli.evaluate_command",
               "connectors.cli.kafka_command", "connectors.cli.serve_command",
               "connectors.cli.warmup_command"]


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

