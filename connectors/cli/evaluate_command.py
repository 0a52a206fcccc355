"""`streammargin evaluate`: progressive validation of models on a stream, as a table and a plot.

    streammargin evaluate --model alma --model "alma(p=4.0)" \\
        --model "river.linear_model.LogisticRegression" --dataset Phishing
    streammargin evaluate --model budgetperceptron --dataset "Hyperplane(seed=1, n_features=5)" \\
        -n 20000
    streammargin evaluate --model alma --csv events.csv --target label --delay 100 --plot curve.png
    streammargin evaluate --model alma --model convexpolytope --dataset ImageSegments
    streammargin evaluate --model alma --csv shop.csv --target bought --one-hot country --drop id

Multiclass: a binary model on a stream whose labels are not True/False, 1/0 or 1/-1 (e.g. the
seven classes of ImageSegments, or "yes"/"no") is wrapped one-vs-rest automatically
(streammargin.OneVsRestClassifier; River's own for a River model) and marked [one-vs-rest] in the
table; natively multiclass models (convexpolytope) take the labels as they are. Macro F1 is
shown beside accuracy, and the log loss is River's CrossEntropy.

Bad records (not JSON, a missing label, a value that is not a finite number, ...) are skipped and
counted, and the summary names them by file:line, as the Kafka worker dead-letters them;
--on-bad-record stop stops at the first one instead. A column of text (a category, an id) needs
--one-hot COLUMN (River's OneHotEncoder: one 0/1 feature per value) or --drop COLUMN.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import typing

from connectors import models
from connectors.evaluate import records, runner, sources
from connectors.cli import terminal
from connectors.cli.errors import EXIT_FAILURE, CommandError

ONE_VS_REST = " [one-vs-rest]"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="progressive validation of models on a dataset, generator or file",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", action="append", required=True, metavar="SPEC",
        help="a streammargin model by short name (" + ", ".join(models.model_names())
        + ") or a River classifier as river.<module>.<Class>, with optional keyword "
        "arguments: 'alma(p=4.0, alpha=0.8)'. Repeatable.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", metavar="NAME", help="a River dataset or generator, "
                        "e.g. Phishing, Bananas, ImageSegments, 'SEA(seed=42)', "
                        "'Agrawal(classification_function=0)'")
    source.add_argument("--csv", metavar="PATH", help="a CSV file with a header")
    source.add_argument("--jsonl", metavar="PATH", help="a JSON-lines file")
    parser.add_argument("--target", help="the label column of --csv/--jsonl")
    parser.add_argument("-n", "--n", type=int, default=None, help="use only the first N records, "
                        "bad ones included (generators are endless: default 10000 for them)")
    parser.add_argument("--delay", type=int, default=0, help="labels arrive N records late")
    parser.add_argument("--no-scale", action="store_true",
                        help="do not put a River StandardScaler in front of each model")
    parser.add_argument("--one-hot", action="append", default=[], metavar="COLUMN",
                        help="a text column to encode with River's OneHotEncoder (repeatable)")
    parser.add_argument("--drop", action="append", default=[], metavar="COLUMN",
                        help="a column to leave out, e.g. an id (repeatable)")
    parser.add_argument("--on-bad-record", choices=("skip", "stop"), default="skip",
                        help="skip and count bad records (default), or stop at the first one")
    parser.add_argument("--rolling", type=int, default=500, help="window of the rolling accuracy")
    parser.add_argument("--plot", metavar="PNG", help="write the rolling accuracy curves here")
    parser.add_argument("--log-level", default="WARNING",
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="DEBUG also prints the traceback of a failure")
    parser.set_defaults(func=run)


def river_estimator(name: str, kwargs: dict) -> typing.Any:
    """`river.<module>.<Class>` with keyword arguments; only River's own classifier classes."""
    from river import base

    module_name, _, class_name = name.rpartition(".")
    if not module_name.startswith("river"):
        raise ValueError(f"no River estimator {name!r}")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        raise ValueError(f"no River estimator {name!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, base.Estimator)):
        raise ValueError(f"{name!r} is not a River estimator class")
    if not issubclass(cls, base.Classifier):
        raise ValueError(f"{name!r} is a River estimator but not a classifier")
    try:
        return cls(**kwargs)
    except TypeError as error:
        raise ValueError(f"bad parameters {kwargs!r} for {name}: {error}") from None


def build(
    spec: str,
    scale: bool,
    binary: bool = True,
    n_classes: int = 2,
    one_hot: typing.Sequence = (),
) -> tuple[typing.Any, bool]:
    """The model of a `--model` SPEC behind its preprocessing, and whether it was wrapped
    one-vs-rest (a binary model on a stream that is not `binary`)."""
    from river import compose, multiclass, preprocessing

    import streammargin

    name, kwargs = records.parse_call(spec)
    if name == "river" or name.startswith("river."):
        model = river_estimator(name, kwargs)
    else:
        model = models.build_model(name, kwargs)
    wrapped = not binary and not model._multiclass
    if wrapped:
        if type(model) in streammargin.state.registered_models().values():
            model = streammargin.OneVsRestClassifier(
                model, max_classes=max(100, min(n_classes, streammargin.multiclass.MAX_CLASSES))
            )
        else:
            model = multiclass.OneVsRestClassifier(model)
    if one_hot:
        numeric = compose.Discard(*one_hot)
        if scale:
            numeric = numeric | preprocessing.StandardScaler()
        front = numeric + (compose.Select(*one_hot) | preprocessing.OneHotEncoder())
        return front | model, wrapped
    return (preprocessing.StandardScaler() | model if scale else model), wrapped


def _check_numbers(args: argparse.Namespace) -> None:
    if args.n is not None and args.n < 1:
        raise CommandError(f"-n {args.n}: expected a positive number of records",
                           "drop -n to use them all")
    if args.delay < 0:
        raise CommandError(f"--delay {args.delay}: expected 0 or more records",
                           "use --delay 0 for labels at once")
    if args.rolling < 1:
        raise CommandError(f"--rolling {args.rolling}: expected a positive window",
                           "e.g. --rolling 500")
    both = set(args.one_hot) & set(args.drop)
    if both:
        raise CommandError(f"{', '.join(sorted(both))}: both --one-hot and --drop",
                           "choose one of them per column")


def _source(args: argparse.Namespace) -> sources.Source:
    n = args.n
    if args.dataset and n is None:
        from river.datasets import synth

        try:
            name, _ = records.parse_call(args.dataset)
        except ValueError:
            name = None
        n = 10_000 if name and hasattr(synth, name) else None
    try:
        source = sources.source_from_args(
            dataset=args.dataset, csv_path=args.csv, jsonl_path=args.jsonl, target=args.target, n=n
        )
    except records.SourceError as error:
        text = str(error)
        if "no such file" in text:
            fix = "check the path"
        elif "--target" in text or "no column" in text:
            fix = "pass --target with the name of the label column"
        elif "River dataset" in text:
            fix = "see river.datasets and river.datasets.synth for the names"
        else:
            fix = "see `streammargin evaluate --help`"
        raise CommandError(text, fix) from None
    if source.columns is not None:
        for option, names in (("--one-hot", args.one_hot), ("--drop", args.drop)):
            missing = [name for name in names if name not in source.columns]
            if missing:
                raise CommandError(
                    f"{option} {', '.join(missing)}: no such column in {source.name}",
                    f"the columns are: {', '.join(source.columns)}",
                )
    return source


def _survey(args: argparse.Namespace, source: sources.Source) -> sources.Survey:
    found = sources.survey(
        source, args.one_hot, args.drop, stop_at_bad=args.on_bad_record == "stop"
    )
    if args.on_bad_record == "stop" and found.bad:
        bad = found.bad[0]
        fix = "fix the record, or pass --on-bad-record skip to skip bad records and count them"
        if bad.text_feature is not None:
            fix = (f"if {bad.text_feature!r} is a text column, pass --one-hot {bad.text_feature} "
                   f"(or --drop {bad.text_feature}); else {fix}")
        raise CommandError(f"bad record {bad}", fix, EXIT_FAILURE)
    if found.text_columns:
        first = found.text_columns[0]
        names = [str(c.name) for c in found.text_columns]
        raise CommandError(
            f"{source.name}: column{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))} "
            f"hold{'' if len(names) > 1 else 's'} text, not numbers (e.g. {first.example!r:.40} at "
            f"{first.where})",
            " ".join(f"--one-hot {n}" for n in names) + " to encode them as 0/1 features, or "
            + " ".join(f"--drop {n}" for n in names) + " to leave them out",
        )
    for option, names in (("--one-hot", args.one_hot), ("--drop", args.drop)):
        if source.columns is None and names and found.n_good:
            if option == "--one-hot":
                unseen = [n for n in names if n not in found.features]
            else:
                unseen = []  # dropped names are gone from the features: nothing to check
            if unseen:
                raise CommandError(
                    f"{option} {', '.join(unseen)}: no record of {source.name} has this feature",
                    "check the feature names (they are case-sensitive)",
                )
    if found.too_many_labels:
        raise CommandError(
            f"{source.name}: more than {sources.MAX_LABELS:,} distinct labels",
            "is --target the label column? (a class label, not an id or a measurement)",
        )
    if not found.n_good:
        raise CommandError(
            f"{source.name}: none of its {found.n_records:,} records is usable"
            + (f" (first bad one: {found.bad[0]})" if found.bad else ""),
            "check --target and the file's format (CSV with a header, or one JSON object a line)",
            EXIT_FAILURE,
        )
    return found


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level), format="%(levelname)s %(name)s: %(message)s"
    )
    _check_numbers(args)
    source = _source(args)
    for spec in args.model:  # a bad spec fails before the data is read
        try:
            build(spec, scale=not args.no_scale)
        except (ValueError, TypeError) as error:
            raise CommandError(
                f"--model {spec}: {error}",
                "see `streammargin evaluate --help` for the SPEC syntax; `streammargin kafka "
                "--list-models` lists the models",
            ) from None
    found = _survey(args, source)
    binary = found.binary
    built: dict[str, typing.Any] = {}
    for spec in args.model:
        model, wrapped = build(spec, not args.no_scale, binary, len(found.labels), args.one_hot)
        built[spec + (ONE_VS_REST if wrapped else "")] = model

    total = found.n_good
    classes = (f"{len(found.labels)} classes" if not binary else "binary labels")
    print(f"progressive validation on {source.name}: {total:,} records, {classes}"
          + (f", labels {args.delay} records late" if args.delay else "")
          + (f"; {found.n_bad:,} bad record{'s' if found.n_bad > 1 else ''} skipped"
             if found.n_bad else ""))
    lines: dict[str, terminal.ProgressLine] = {}

    def on_progress(name: str, done: int, seconds: float) -> None:
        if name not in lines:  # a model starts: its line counts from here
            lines[name] = terminal.ProgressLine(total, label=f"{name:<24.24} ")
        if done:
            rate = done / seconds if seconds >= terminal.MIN_SECONDS else math.nan
            lines[name].update(done, rate=rate)

    def on_result(result: runner.Result) -> None:
        fields = "failed" if result.error else ""
        lines[result.name].close(result.n, fields=fields, rate=result.rate)

    results = runner.evaluate(
        built,
        lambda: source.records(args.one_hot, args.drop),
        delay=args.delay,
        rolling=args.rolling,
        on_progress=on_progress,
        multiclass=not binary,
        on_result=on_result,
    )

    print()
    headers = ["model", "records", "accuracy"] + ([] if binary else ["macro F1"]) + [
        "log loss", "seconds", "records/s", "memory KiB"
    ]
    rows = []
    for r in results:
        rate = r.rate
        rows.append(
            [r.name + (" (failed)" if r.error else ""), r.n, _cell(r.accuracy)]
            + ([] if binary else [_cell(r.macro_f1)])
            + [
                _cell(r.log_loss), f"{r.seconds:.2f}",
                f"{rate:,.0f}" if math.isfinite(rate) else "-",
                f"{r.memory_bytes / 1024:.1f}" if r.memory_bytes is not None else "-",
            ]
        )
    print(terminal.format_table(headers, rows))
    failed = [r for r in results if r.error]
    for r in failed:
        print(f"{r.name}: failed after {r.n:,} records: {r.error}")
    if found.n_bad:
        shown = found.bad[:5]
        print(f"{found.n_bad:,} bad record{'s' if found.n_bad > 1 else ''} skipped "
              "(--on-bad-record stop to stop at the first):")
        for bad in shown:
            print(f"  {bad}")
        if found.n_bad > len(shown):
            print(f"  ... and {found.n_bad - len(shown):,} more")
    if args.plot:
        title = f"rolling accuracy ({args.rolling}) on {source.name}"
        runner.plot(results, args.plot, title=title)
        print(f"plot: {args.plot}")
    return EXIT_FAILURE if failed else 0


def _cell(value: float | None) -> typing.Any:
    return "-" if value is None else value
