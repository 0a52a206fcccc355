"""`streammargin evaluate`: prequential evaluation of models on streams, as tables, a results file
and a plot.

    streammargin evaluate --model alma --model "alma(p=4.0)" \\
        --model "river.linear_model.LogisticRegression" --dataset Phishing
    streammargin evaluate --model alma --libsvm a9a.txt.gz --window 2000 --output a9a.csv
    streammargin evaluate --model alma --model convexpolytope --arff covtype.arff.gz \\
        --plot kappa.png --metric kappa_m
    streammargin evaluate --model alma --csv events.csv --target label --moment ts --delay 30m
    streammargin evaluate --model alma --model budgetsvm --dataset Phishing --dataset Bananas \\
        --arff elec.arff --metric kappa_t                          # several streams: mean ranks
    streammargin evaluate --model alma --csv shop.csv --target bought --one-hot country --drop id

Sources, repeatable and mixed: --dataset (a River dataset or generator), --csv and --jsonl (with
--target, the label column), --arff (its last attribute is the class, or --target's; nominal
attributes are one-hot encoded), --libsvm (svmlight too: `label [qid:N] index:value ...`), any
file gzip-compressed. All models run in one pass over each stream.

Measures, cumulative and per window of --window records (MOA's WindowClassificationPerformance-
Evaluator read every --window records): accuracy, Cohen's kappa, kappa-M (against the majority
class), kappa-T (against the no-change classifier), macro F1, log loss, and on binary streams
the prequential ROC AUC per window; --fading ALPHA adds MOA's faded measures to the results file.
Each model's time per record, memory (River's _raw_memory_usage) and RAM-hours.

Labels: at once, --delay N records late, --delay 30m with --moment COLUMN (a timestamp column:
seconds or ISO 8601; River's moment and delay), and --initial-training-window N (the first N
records train and are not tested: MOA's EvaluatePrequentialDelayed -p N -m).

Multiclass: a binary model on a stream whose labels are not True/False, 1/0 or 1/-1 is wrapped
one-vs-rest (streammargin.OneVsRestClassifier; River's own for a River model), marked
[one-vs-rest]; natively multiclass models (convexpolytope) take the labels as they are.

Bad records (not JSON, a missing label, a value that is not a finite number, a line too long,
...) are skipped and counted, and the summary names them by file:line; --on-bad-record stop
stops at the first one. A column of text needs --one-hot COLUMN (River's OneHotEncoder) or
--drop COLUMN.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import pathlib
import re
import sys
import typing

from connectors import models
from connectors.cli import terminal
from connectors.cli.errors import EXIT_FAILURE, CommandError
from connectors.evaluate import metrics, records, results, runner, sources

ONE_VS_REST = " [one-vs-rest]"
SOURCE_OPTIONS = {"--dataset": "dataset", "--csv": "csv", "--jsonl": "jsonl", "--arff": "arff",
                  "--libsvm": "libsvm"}
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


class _AddSource(argparse.Action):
    """Every source option appends (kind, value) to one list, in the order given."""

    def __call__(self, parser, namespace, values, option_string=None):
        found = list(getattr(namespace, "sources", None) or [])
        found.append((SOURCE_OPTIONS[option_string], values))
        namespace.sources = found


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="prequential evaluation of models on datasets, generators and files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", action="append", required=True, metavar="SPEC",
        help="a streammargin model by short name (" + ", ".join(models.model_names())
        + ") or a River classifier as river.<module>.<Class>, with optional keyword "
        "arguments: 'alma(p=4.0, alpha=0.8)'. Repeatable.",
    )
    parser.set_defaults(sources=[])
    parser.add_argument("--dataset", action=_AddSource, metavar="NAME",
                        help="a River dataset or generator, e.g. Phishing, Bananas, "
                        "ImageSegments, 'SEA(seed=42)' (repeatable, as every source)")
    parser.add_argument("--csv", action=_AddSource, metavar="PATH", help="a CSV file with a "
                        "header (gzip too)")
    parser.add_argument("--jsonl", action=_AddSource, metavar="PATH", help="a JSON-lines file")
    parser.add_argument("--arff", action=_AddSource, metavar="PATH", help="an ARFF file, dense "
                        "or sparse")
    parser.add_argument("--libsvm", action=_AddSource, metavar="PATH",
                        help="a libsvm/svmlight file: label [qid:N] index:value ...")
    parser.add_argument("--target", help="the label column of --csv/--jsonl (required) and "
                        "--arff (default: its last attribute)")
    parser.add_argument("-n", "--n", type=int, default=None, help="use only the first N records "
                        "of each stream, bad ones included (generators: 10000 by default)")
    parser.add_argument("--delay", default="0", help="labels arrive N records late, or, with "
                        "--moment, a time later: 30m, 2h, 45s, 1d, 500ms or a number in the "
                        "column's unit")
    parser.add_argument("--moment", metavar="COLUMN", help="the column of each record's time "
                        "(seconds, or ISO 8601 dates), for --delay as a time span; not a feature")
    parser.add_argument("--initial-training-window", type=int, default=0, metavar="N",
                        help="the first N records train every model and test none (MOA's -p N -m)")
    parser.add_argument("--max-pending", type=int, default=100_000, metavar="N",
                        help="at most N records wait for their labels (memory); default 100000")
    parser.add_argument("--window", "--rolling", dest="window", type=int, default=1000,
                        help="records per window of the windowed measures (default 1000)")
    parser.add_argument("--fading", type=float, metavar="ALPHA",
                        help="also MOA's faded measures with this fading factor, e.g. 0.999")
    parser.add_argument("--metric", default="accuracy", help="the measure plotted and ranked: "
                        + ", ".join(metrics.MEASURES) + " (default accuracy)")
    parser.add_argument("--no-scale", action="store_true",
                        help="do not put a StandardScaler in front of each model")
    parser.add_argument("--one-hot", action="append", default=[], metavar="COLUMN",
                        help="a text column to encode with River's OneHotEncoder (repeatable)")
    parser.add_argument("--drop", action="append", default=[], metavar="COLUMN",
                        help="a column to leave out, e.g. an id (repeatable)")
    parser.add_argument("--on-bad-record", choices=("skip", "stop"), default="skip",
                        help="skip and count bad records (default), or stop at the first one")
    parser.add_argument("--output", metavar="PATH", help="a row per model and window, every "
                        "measure: CSV, or JSON for a .json name")
    parser.add_argument("--plot", metavar="PNG", help="the --metric per window per model")
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
    one-vs-rest (a binary model on a stream that is not `binary`).

    A streammargin model without one-hot columns runs behind `runner.Scaled` (streammargin's
    StandardScaler: River's numbers, bit for bit, in one compiled call); others behind River's
    `StandardScaler` (and `OneHotEncoder`) in a River pipeline.
    """
    from river import compose, multiclass, preprocessing

    import streammargin

    name, kwargs = records.parse_call(spec)
    if name == "river" or name.startswith("river."):
        model = river_estimator(name, kwargs)
    else:
        model = models.build_model(name, kwargs)
    ours = type(model) in streammargin.state.registered_models().values()
    wrapped = not binary and not model._multiclass
    if wrapped:
        if ours:
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
    if not scale:
        return model, wrapped
    if ours:
        return runner.Scaled(model), wrapped
    return preprocessing.StandardScaler() | model, wrapped


def parse_delay(text: str, timed: bool) -> float:
    """--delay: a count of records, or with --moment a span (30m, 2h, 45s, 1d, 500ms, or a
    number in the moment column's unit), in seconds.

    >>> parse_delay("25", False), parse_delay("30m", True), parse_delay("1.5", True)
    (25, 1800.0, 1.5)
    """
    text = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)", text.lower())
    if match is None:
        raise ValueError(f"--delay {text}: expected a number, or a span such as 30m, 2h, 45s")
    number, unit = float(match.group(1)), match.group(2)
    if not timed:
        if unit or not number.is_integer():
            raise ValueError(f"--delay {text}: a time span needs --moment COLUMN, the records' "
                             "times; without it the delay counts records")
        return int(number)
    if unit and unit not in _UNITS:
        raise ValueError(f"--delay {text}: unknown unit {unit!r} (ms, s, m, h, d)")
    return number * _UNITS.get(unit, 1.0)


def _metric(text: str) -> str:
    name = text.strip().lower().replace("-", "_")
    name = {"kappam": "kappa_m", "kappat": "kappa_t", "f1": "macro_f1", "macrof1": "macro_f1",
            "logloss": "log_loss"}.get(name.replace("_", ""), name)
    if name not in metrics.MEASURES:
        raise CommandError(f"--metric {text}: no such measure",
                           f"choose one of {', '.join(metrics.MEASURES)}")
    return name


def _check_numbers(args: argparse.Namespace) -> float:
    if not args.sources:
        raise CommandError("no stream to evaluate on",
                           "pass one or more of --dataset, --csv, --jsonl, --arff, --libsvm")
    if args.n is not None and args.n < 1:
        raise CommandError(f"-n {args.n}: expected a positive number of records",
                           "drop -n to use them all")
    try:
        delay = parse_delay(args.delay, args.moment is not None)
    except ValueError as error:
        fix = ("pass --moment COLUMN for a time span" if "--moment" in str(error)
               else "use --delay 0 for labels at once")
        raise CommandError(str(error), fix) from None
    if args.window < 1:
        raise CommandError(f"--window {args.window}: expected a positive number of records",
                           "e.g. --window 1000")
    if args.initial_training_window < 0:
        raise CommandError(f"--initial-training-window {args.initial_training_window}: "
                           "expected 0 or more records", "use 0 to test every record")
    if args.max_pending < 1:
        raise CommandError(f"--max-pending {args.max_pending}: expected a positive number",
                           "e.g. --max-pending 100000")
    if args.moment is None and delay > args.max_pending:
        raise CommandError(f"--delay {args.delay}: more than --max-pending {args.max_pending:,} "
                           "records would wait for their labels", "raise --max-pending")
    if args.fading is not None and not 0.0 < args.fading < 1.0:
        raise CommandError(f"--fading {args.fading}: expected a factor in (0, 1)",
                           "e.g. --fading 0.999")
    both = set(args.one_hot) & set(args.drop)
    if both:
        raise CommandError(f"{', '.join(sorted(both))}: both --one-hot and --drop",
                           "choose one of them per column")
    if args.moment is not None and args.moment in set(args.one_hot) | set(args.drop):
        raise CommandError(f"--moment {args.moment} is also in --one-hot or --drop",
                           "the --moment column is no feature: name it only there")
    args.metric = _metric(args.metric)
    return delay


def _source(args: argparse.Namespace, kind: str, spec: str) -> sources.Source:
    n = args.n
    if kind == "dataset" and n is None:
        from river.datasets import synth

        try:
            name, _ = records.parse_call(spec)
        except ValueError:
            name = None
        n = 10_000 if name and hasattr(synth, name) else None
    try:
        if kind == "dataset":
            source = sources.dataset_source(spec, n)
        else:
            source = sources.file_source(kind, spec, args.target, n)
    except records.SourceError as error:
        text = str(error)
        if "no such file" in text:
            fix = "check the path"
        elif "--target" in text or "no column" in text or "no attribute" in text:
            fix = "pass --target with the name of the label column"
        elif "River dataset" in text:
            fix = "see river.datasets and river.datasets.synth for the names"
        else:
            fix = "check the file (see `streammargin evaluate --help` for the formats)"
        raise CommandError(text, fix) from None
    if source.columns is not None and len(args.sources) == 1:
        for option, names in (("--one-hot", args.one_hot), ("--drop", args.drop),
                              ("--moment", [args.moment] if args.moment else [])):
            missing = [name for name in names if name not in source.columns]
            if missing:
                shown = source.columns[:30] + (["..."] if len(source.columns) > 30 else [])
                raise CommandError(
                    f"{option} {', '.join(missing)}: no such column in {source.name}",
                    f"the columns are: {', '.join(map(str, shown))}",
                )
    return source


def _survey(args: argparse.Namespace, source: sources.Source, one_hot: list) -> sources.Survey:
    found = sources.survey(
        source, one_hot, args.drop, stop_at_bad=args.on_bad_record == "stop", moment=args.moment
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
    if source.columns is None and args.one_hot and found.n_good and len(args.sources) == 1:
        unseen = [n for n in args.one_hot if n not in found.features]
        if unseen:
            raise CommandError(
                f"--one-hot {', '.join(unseen)}: no record of {source.name} has this feature",
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
            "check --target and the file's format (see `streammargin evaluate --help`)",
            EXIT_FAILURE,
        )
    return found


def _check_models(args: argparse.Namespace) -> None:
    for spec in args.model:  # a bad spec fails before any data is read
        try:
            build(spec, scale=not args.no_scale)
        except (ValueError, TypeError) as error:
            raise CommandError(
                f"--model {spec}: {error}",
                "see `streammargin evaluate --help` for the SPEC syntax; `streammargin kafka "
                "--list-models` lists the models",
            ) from None


# A binary coding's labels as bools (True/False, 1/0, 1/-1: True hashes as 1, False as 0).
_BINARY = {True: True, False: False, -1: False}


def _as_bool(y: typing.Any) -> bool:
    return _BINARY[y]


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level), format="%(levelname)s %(name)s: %(message)s"
    )
    delay = _check_numbers(args)
    streams = [_source(args, kind, spec) for kind, spec in args.sources]
    _check_models(args)
    if args.plot and not pathlib.Path(args.plot).resolve().parent.is_dir():
        # (the plot is drawn at the end: a run of an hour must not end on a typo)
        raise CommandError(f"--plot {args.plot}: No such file or directory (its folder)",
                           "check the path, or create the folder first", EXIT_FAILURE)
    output = None
    if args.output:
        try:
            output = results.ResultsFile(args.output, faded=args.fading is not None)
        except OSError as error:
            raise CommandError(f"--output {args.output}: {error.strerror or error}",
                               "check the path and its folder") from None
    panels: list[tuple[str, list[runner.Result]]] = []
    failed = False
    try:
        for source in streams:
            found_results = _run_stream(args, source, delay, output)
            panels.append((source.name, found_results))
            failed = failed or any(r.error for r in found_results)
    finally:
        if output is not None:
            output.close()
    if len(panels) > 1:
        _print_ranks(args, panels)
    if output is not None:
        print(f"results: {args.output} ({output.n_rows:,} rows)")
    if args.plot:
        label = args.metric.replace("_", "-") if args.metric.startswith("kappa") else args.metric
        results.plot(panels, args.plot, args.metric,
                     title=f"{label.replace('_', ' ')} per window of {args.window:,} records")
        print(f"plot: {args.plot}")
    return EXIT_FAILURE if failed else 0


def _run_stream(args: argparse.Namespace, source: sources.Source, delay: float,
                output: results.ResultsFile | None) -> list[runner.Result]:
    one_hot = list(dict.fromkeys([*args.one_hot, *source.categorical]))
    one_hot = [name for name in one_hot if name not in args.drop]
    found = _survey(args, source, one_hot)
    binary = found.binary and sources.is_binary_coded(source.classes)
    n_classes = len(set(found.labels) | set(source.classes))
    built: dict[str, typing.Any] = {}
    for spec in args.model:
        model, wrapped = build(spec, not args.no_scale, binary, n_classes, one_hot)
        built[spec + (ONE_VS_REST if wrapped else "")] = model
    timed = args.moment is not None
    classes = [_as_bool(c) for c in source.classes] if binary else source.classes
    bad = sources.Survey()  # the bad records of the run itself (the survey may not read all)
    stop = args.on_bad_record == "stop"

    def make_stream() -> typing.Iterator[tuple]:
        # One generator between the reader and the loop: the checks inline (records'
        # checked_records, without its layer), a binary label as a bool.
        check = records.check_record
        checked_one_hot, checked_drop = frozenset(one_hot), frozenset(args.drop)
        as_bool = _BINARY.__getitem__ if binary else None
        for where, x, y, problem in source.rows():
            if problem is not None:
                checked: typing.Any = records.BadRecord(where, problem)
            elif timed:
                checked = records.check_timed(where, x, y, checked_one_hot, checked_drop,
                                              args.moment)
            else:
                checked = check(where, x, y, checked_one_hot, checked_drop)
            if type(checked) is records.BadRecord:
                if stop:
                    raise CommandError(f"bad record {checked}", "fix the record, or pass "
                                       "--on-bad-record skip to skip bad records and count them",
                                       EXIT_FAILURE)
                bad.n_bad += 1
                if len(bad.bad) < sources.MAX_BAD_EXAMPLES:
                    bad.bad.append(checked)
                continue
            bad.n_good += 1
            if as_bool is not None:
                yield checked[0], as_bool(checked[1]), *checked[2:]
            else:
                yield checked

    total = found.n_good if found.complete else found.n_records
    kinds = f"{len(found.labels)} classes" if not binary else "binary labels"
    late = ""
    if delay and timed:
        late = f", labels {args.delay} late by {args.moment}"
    elif delay:
        late = f", labels {int(delay)} records late"
    if args.initial_training_window:
        late += f", the first {args.initial_training_window:,} records train only"
    print(f"prequential evaluation on {source.name}: {total:,} records, {kinds}{late}, windows "
          f"of {args.window:,}", flush=True)
    line = terminal.ProgressLine(total, label="records ") if sys.stderr.isatty() else None

    def on_progress(done: int) -> None:
        if line is not None:
            line.update(done)

    def on_window(result: runner.Result, row: typing.Any) -> None:
        if output is not None:
            output.write(results.row_of(source.name, result, row))

    try:
        found_results = runner.evaluate(
            built, make_stream, delay=delay, window=args.window, classes=classes,
            positive=True if binary else None, fading=args.fading, timed=timed,
            initial_window=args.initial_training_window, max_pending=args.max_pending,
            plotted=args.metric, on_window=on_window, on_progress=on_progress,
        )
    except runner.PendingLimit as error:
        raise CommandError(f"{source.name}: {error} (--delay {args.delay})",
                           "raise --max-pending (memory), or shorten --delay", EXIT_FAILURE) \
            from None
    finally:
        if line is not None:
            line.close(line.last_done)
    _print_table(found_results, binary, bad)
    return found_results


def _cell(value: float | None) -> typing.Any:
    return "-" if value is None else value


def _print_table(found_results: list[runner.Result], binary: bool,
                 found: sources.Survey) -> None:
    print()
    headers = ["model", "records", "accuracy", "kappa", "kappa-M", "kappa-T"]
    headers += ["AUC (windows)"] if binary else ["macro F1"]
    headers += ["log loss", "µs/record", "records/s", "memory KiB"]
    rows = []
    for r in found_results:
        rate = r.rate
        per_record = r.microseconds_per_record
        rows.append(
            [r.name + (" (failed)" if r.error else ""), r.n, _cell(r.accuracy),
             _cell(r.measure("kappa")), _cell(r.measure("kappa_m")), _cell(r.measure("kappa_t")),
             _cell(r.measure("auc") if binary else r.macro_f1), _cell(r.log_loss),
             f"{per_record:,.1f}" if math.isfinite(per_record) else "-",
             f"{rate:,.0f}" if math.isfinite(rate) else "-",
             f"{r.memory_bytes / 1024:,.1f}" if r.memory_bytes is not None else "-"]
        )
    print(terminal.format_table(headers, rows))
    for r in found_results:
        if r.error:
            print(f"{r.name}: failed after {r.n:,} records: {r.error}")
    print(f"{found.n_good:,} records", end="")
    if not found.n_bad:
        print()
    else:
        shown = found.bad[:5]
        print(f"; {found.n_bad:,} bad record{'s' if found.n_bad > 1 else ''} skipped "
              "(--on-bad-record stop to stop at the first):")
        for bad in shown:
            print(f"  {bad}")
        if found.n_bad > len(shown):
            print(f"  ... and {found.n_bad - len(shown):,} more")
    print()


def _print_ranks(args: argparse.Namespace,
                 panels: list[tuple[str, list[runner.Result]]]) -> None:
    table: dict[str, dict[str, float | None]] = {}
    for stream, found_results in panels:
        for r in found_results:
            name = r.name.removesuffix(ONE_VS_REST)
            table.setdefault(name, {})[stream] = r.measure(args.metric)
    ranks = results.mean_ranks(table, args.metric in metrics.SMALLER_IS_BETTER)
    streams = [stream for stream, _ in panels]
    headers = ["model", "mean rank", *_short_names(streams)]
    rows = [[name, f"{rank:.2f}", *(_cell(table[name].get(s)) for s in streams)]
            for name, rank in sorted(ranks.items(), key=lambda item: item[1])]
    print(f"mean rank by {args.metric} over {len(streams)} streams (1 = best; ties share):")
    print(terminal.format_table(headers, rows))
    print()


def _short_names(streams: list[str]) -> list[str]:
    """Column names for streams: a file's name without its folder, a data set's name without
    its arguments, numbered where two would read the same.

    >>> _short_names(["data/a.csv", "SEA(seed=1)", "SEA(seed=2)", "Phishing"])
    ['a.csv', 'SEA #2', 'SEA #3', 'Phishing']
    """
    short = [name.rsplit("/", 1)[-1].split("(", 1)[0][:24] for name in streams]
    return [f"{name} #{i + 1}" if short.count(name) > 1 else name
            for i, name in enumerate(short)]
