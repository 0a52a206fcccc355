"""`streammargin evaluate`: progressive validation of models on a stream, as a table and a plot.

    streammargin evaluate --model alma --model "alma(p=4.0)" \\
        --model "river.linear_model.LogisticRegression" --dataset Phishing
    streammargin evaluate --model budgetperceptron --dataset "Hyperplane(seed=1, n_features=5)" -n 20000
    streammargin evaluate --model alma --csv events.csv --target label --delay 100 --plot curve.png
"""

from __future__ import annotations

import argparse
import importlib
import sys
import typing

from connectors import evaluation, models, terminal


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
        + ") or a River estimator as river.<module>.<Class>, with optional keyword "
        "arguments: 'alma(p=4.0, alpha=0.8)'. Repeatable.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", metavar="NAME", help="a River dataset or generator, "
                        "e.g. Phishing, Bananas, 'SEA(seed=42)', 'Agrawal(classification_function=0)'")
    source.add_argument("--csv", metavar="PATH", help="a CSV file with a header")
    source.add_argument("--jsonl", metavar="PATH", help="a JSON-lines file")
    parser.add_argument("--target", help="the label column of --csv/--jsonl")
    parser.add_argument("-n", "--n", type=int, default=None, help="use only the first N records "
                        "(generators are endless: default 10000 for them)")
    parser.add_argument("--delay", type=int, default=0, help="labels arrive N records late")
    parser.add_argument("--no-scale", action="store_true",
                        help="do not put a River StandardScaler in front of each model")
    parser.add_argument("--rolling", type=int, default=500, help="window of the rolling accuracy")
    parser.add_argument("--plot", metavar="PNG", help="write the rolling accuracy curves here")
    parser.set_defaults(func=run)


def river_estimator(name: str, kwargs: dict) -> typing.Any:
    """`river.<module>.<Class>` with keyword arguments; only River's own estimator classes."""
    from river import base

    module_name, _, class_name = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        raise ValueError(f"no River estimator {name!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, base.Estimator)):
        raise ValueError(f"{name!r} is not a River estimator class")
    return cls(**kwargs)


def build(spec: str, scale: bool) -> typing.Any:
    from river import preprocessing

    name, kwargs = evaluation.parse_call(spec)
    if name == "river" or name.startswith("river."):
        model = river_estimator(name, kwargs)
    else:
        model = models.build_model(name, kwargs)
    return preprocessing.StandardScaler() | model if scale else model


def run(args: argparse.Namespace) -> int:
    try:
        n = args.n
        if args.dataset and n is None:
            from river.datasets import synth

            name, _ = evaluation.parse_call(args.dataset)
            n = 10_000 if hasattr(synth, name) else None
        make_stream = evaluation.source_from_args(
            dataset=args.dataset, csv_path=args.csv, jsonl_path=args.jsonl, target=args.target, n=n
        )
        built = {spec: build(spec, scale=not args.no_scale) for spec in args.model}
    except (ValueError, TypeError) as error:
        print(f"streammargin evaluate: {error}", file=sys.stderr)
        return 2

    lines: dict[str, terminal.ProgressLine] = {}

    def on_progress(name: str, done: int) -> None:
        if name not in lines:  # models run one after the other: close the previous line
            for previous in lines.values():
                previous.close(previous.last_done)
            lines[name] = terminal.ProgressLine(n, label=f"{name:<24.24} ")
        lines[name].update(done)

    try:
        results = evaluation.evaluate(
            built, make_stream, delay=args.delay, rolling=args.rolling, on_progress=on_progress
        )
    except ValueError as error:  # bad values in a file: the model names the feature
        print(f"\nstreammargin evaluate: {error}", file=sys.stderr)
        return 1
    for line in lines.values():
        line.close(line.last_done)

    source = args.dataset or args.csv or args.jsonl
    print(f"\nprogressive validation on {source}" + (f", labels {args.delay} records late" if args.delay else ""))
    rows = [
        [r.name, r.n, r.accuracy, r.log_loss, f"{r.seconds:.2f}",
         round(r.n / r.seconds) if r.seconds else 0, f"{r.memory_bytes / 1024:.1f}"]
        for r in results
    ]
    print(terminal.format_table(
        ["model", "records", "accuracy", "log loss", "seconds", "records/s", "memory KiB"], rows
    ))
    if args.plot:
        evaluation.plot(results, args.plot, title=f"rolling accuracy ({args.rolling}) on {source}")
        print(f"plot: {args.plot}")
    return 0
