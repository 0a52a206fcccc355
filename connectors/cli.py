"""The `streammargin` command: a thin layer over the library and connector APIs.

Each subcommand lives in its own module, which exposes `add_parser(subparsers)`; the parser it
adds sets `func` to the function that runs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ["connectors.demo", "connectors.evaluate_command", "connectors.kafka_command"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streammargin",
        description="Online large-margin classifiers for event streams.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
