"""Progressive validation of several models on one stream: the library behind `streammargin evaluate`.

Each model sees the stream test-then-train through River's own `stream.simulate_qa` (with an
optional label delay), so its accuracy is exactly what `river.evaluate.progressive_val_score`
reports for the same model, stream and delay. Beside accuracy it measures log loss (from
`predict_proba_one`), wall time, memory, and a rolling accuracy curve for plots.

Sources: a River dataset by name, a River synthetic generator with keyword arguments, a CSV file
or a JSON-lines file with a label column.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import itertools
import json
import math
import pathlib
import time
import typing

__all__ = [
    "Result",
    "evaluate",
    "parse_call",
    "parse_label",
    "source_from_args",
    "iter_csv",
    "iter_jsonl",
]

Stream = typing.Iterable[tuple[dict, typing.Any]]


def parse_call(text: str) -> tuple[str, dict[str, typing.Any]]:
    """'SEA(seed=42, variant=1)' -> ('SEA', {'seed': 42, 'variant': 1}); 'a.b.C' -> ('a.b.C', {}).

    Only keyword arguments with literal values: nothing is evaluated.
    """
    usage = f"cannot read {text!r}: expected Name or Name(key=value, ...) with literal values"
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(usage) from None
    if isinstance(node, (ast.Name, ast.Attribute)):
        return ast.unparse(node), {}
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Name, ast.Attribute))
        and not node.args
        and all(k.arg for k in node.keywords)
    ):
        raise ValueError(usage)
    kwargs = {}
    for keyword in node.keywords:
        try:
            kwargs[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            raise ValueError(usage) from None
    return ast.unparse(node.func), kwargs


def parse_label(value: typing.Any) -> typing.Any:
    """Labels read from text files: true/false and numbers become bool/int, others stay as is."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        try:
            number = float(value)
        except ValueError:
            return value.strip()
        return int(number) if number.is_integer() else number
    return value


def _parse_feature(value: str) -> typing.Any:
    try:
        return float(value)
    except ValueError:
        return value  # the model rejects it with a ValueError naming the feature


def iter_csv(path: str | pathlib.Path, target: str) -> Stream:
    """Rows of a CSV file with a header: numeric cells as floats, empty cells absent."""
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        if target not in (reader.fieldnames or []):
            raise ValueError(f"{path}: no column {target!r} (columns: {reader.fieldnames})")
        for row in reader:
            y = parse_label(row.pop(target))
            yield {k: _parse_feature(v) for k, v in row.items() if v != ""}, y


def iter_jsonl(path: str | pathlib.Path, target: str) -> Stream:
    """Objects of a JSON-lines file: the features are `x` if present (the Kafka event contract),
    else every key but the target."""
    with open(path) as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record, dict) or target not in record:
                raise ValueError(f"{path}:{number}: not an object with a {target!r} field")
            y = parse_label(record[target])
            x = record["x"] if isinstance(record.get("x"), dict) else {
                k: v for k, v in record.items() if k not in (target, "id", "ts")
            }
            yield x, y


def river_dataset(name: str, kwargs: dict) -> typing.Any:
    from river import datasets
    from river.datasets import synth

    for module in (datasets, synth):
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            return cls(**kwargs)
    raise ValueError(f"no River dataset or generator named {name!r}")


def source_from_args(
    dataset: str | None = None,
    csv_path: str | None = None,
    jsonl_path: str | None = None,
    target: str | None = None,
    n: int | None = None,
) -> typing.Callable[[], Stream]:
    """A function returning a fresh iterator over the chosen stream (one per model)."""
    chosen = [s for s in (dataset, csv_path, jsonl_path) if s]
    if len(chosen) != 1:
        raise ValueError("choose exactly one of a dataset/generator, a CSV file, a JSON-lines file")
    if dataset:
        name, kwargs = parse_call(dataset)
        river_dataset(name, kwargs)  # fail early on a bad name

        def make() -> Stream:
            data = river_dataset(name, kwargs)
            return itertools.islice(data, n) if n else data

        return make
    if not target:
        raise ValueError("a file source needs --target, the label column")
    path, reader = (csv_path, iter_csv) if csv_path else (jsonl_path, iter_jsonl)
    if not pathlib.Path(path).is_file():  # type: ignore[arg-type]
        raise ValueError(f"no such file: {path}")
    return lambda: itertools.islice(reader(path, target), n) if n else reader(path, target)  # type: ignore[arg-type]


@dataclasses.dataclass
class Result:
    name: str
    n: int
    accuracy: float
    log_loss: float
    seconds: float
    memory_bytes: int
    curve: list[tuple[int, float]]  # (records answered, rolling accuracy)


def evaluate(
    models: dict[str, typing.Any],
    make_stream: typing.Callable[[], Stream],
    delay: int = 0,
    rolling: int = 500,
    on_progress: typing.Callable[[str, int], None] | None = None,
    progress_every: int = 1000,
) -> list[Result]:
    """Progressive validation of each model on a fresh copy of the stream.

    `delay` is the number of records after which a label is revealed (0: at once), as River's
    `simulate_qa`. Accuracy counts `predict_one`; log loss counts `predict_proba_one` (clipped
    at 1e-15, as River's LogLoss).
    """
    from river import metrics, stream, utils

    results = []
    for name, model in models.items():
        # Warm a clone up first, so the timing does not include numba's cache loading.
        warm = model.clone()
        for x, y in itertools.islice(make_stream(), 5):
            warm.predict_proba_one(x)
            warm.learn_one(x, y)
        accuracy, log_loss = metrics.Accuracy(), metrics.LogLoss()
        window = utils.Rolling(metrics.Accuracy, window_size=rolling)
        pending: dict[int, tuple[typing.Any, typing.Any]] = {}
        curve: list[tuple[int, float]] = []
        answered = 0
        start = time.perf_counter()
        for i, x, y in stream.simulate_qa(make_stream(), moment=None, delay=delay):
            if y is None:  # a question: predict now, score when the label comes
                pending[i] = (model.predict_one(x), model.predict_proba_one(x))
                continue
            y_pred, proba = pending.pop(i)
            accuracy.update(y, y_pred)
            window.update(y, y_pred)
            log_loss.update(y, proba)
            model.learn_one(x, y)
            answered += 1
            if answered % max(1, rolling // 5) == 0:
                curve.append((answered, window.get()))
            if on_progress and answered % progress_every == 0:
                on_progress(name, answered)
        seconds = time.perf_counter() - start
        loss = log_loss.get()
        results.append(
            Result(
                name=name,
                n=answered,
                accuracy=accuracy.get(),
                log_loss=loss if math.isfinite(loss) else math.inf,
                seconds=seconds,
                memory_bytes=model._raw_memory_usage,
                curve=curve,
            )
        )
    return results


def plot(results: list[Result], path: str | pathlib.Path, title: str = "") -> None:
    """Rolling accuracy of each model against the records seen, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for result in results:
        if result.curve:
            xs, ys = zip(*result.curve)
            ax.plot(xs, ys, label=f"{result.name} ({result.accuracy:.4f})", linewidth=1.2)
    ax.set_xlabel("records")
    ax.set_ylabel("rolling accuracy")
    ax.set_title(title or "progressive validation")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
