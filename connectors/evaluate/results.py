"""What `streammargin evaluate` keeps of a run: one row per model and window in a CSV or JSON file
(written as the windows close, so memory does not grow with the stream), the plot of a window
measure per model, and each model's mean rank over several streams.

A row: the stream, the model, the window (1, 2, ...), `records` answered so far and
`window_records` in the window; each measure cumulative (`accuracy`, ...) and over the window
(`window_accuracy`, ...), faded with a fading factor (`faded_accuracy`, ...); the model's time so
far (`seconds`), its memory at the window's end (`memory_bytes`, River's `_raw_memory_usage`)
and its RAM-hours so far (MOA's model cost). An undefined measure is an empty CSV cell, a JSON
null.

>>> mean_ranks({"a": {"s1": 0.9, "s2": 0.7}, "b": {"s1": 0.8, "s2": 0.7}, "c": {"s1": None,
...            "s2": 0.9}}, smaller_is_better=False)
{'a': 1.75, 'b': 2.25, 'c': 2.0}
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
import typing

from connectors.evaluate.metrics import FADED_MEASURES, MEASURES, WindowRow
from connectors.evaluate.runner import Result

__all__ = ["ResultsFile", "columns", "mean_ranks", "plot", "row_of"]


def columns(faded: bool) -> list[str]:
    """The columns of a results file, in order."""
    names = ["stream", "model", "window", "records", "window_records"]
    names += list(MEASURES)
    names += [f"window_{name}" for name in MEASURES]
    if faded:
        names += [f"faded_{name}" for name in FADED_MEASURES]
    return names + ["seconds", "memory_bytes", "ram_hours"]


def row_of(stream: str, result: Result, row: WindowRow) -> dict:
    """A results file's row of one model's window."""
    out: dict[str, typing.Any] = {"stream": stream, "model": result.name, "window": row.window,
                                  "records": row.records, "window_records": row.window_records}
    for name in MEASURES:
        out[name] = row.cumulative.get(name)
    for name in MEASURES:
        out[f"window_{name}"] = row.window_measures.get(name)
    for name in FADED_MEASURES:
        if row.faded:
            out[f"faded_{name}"] = row.faded.get(name)
    out["seconds"] = result.seconds
    out["memory_bytes"] = result.memory_bytes
    out["ram_hours"] = result.ram_hours
    return out


class ResultsFile:
    """Rows written as they come to `path`: CSV, or a JSON array of objects for `.json`."""

    def __init__(self, path: str | pathlib.Path, faded: bool):
        self.path = pathlib.Path(path)
        self.json = self.path.suffix.lower() == ".json"
        self.columns = columns(faded)
        self.file = open(self.path, "w", newline="", encoding="utf-8")
        self.n_rows = 0
        if self.json:
            self.file.write("[")
        else:
            self.writer = csv.DictWriter(self.file, self.columns, extrasaction="ignore")
            self.writer.writeheader()

    def write(self, row: dict) -> None:
        if self.json:
            self.file.write(("\n" if not self.n_rows else ",\n")
                            + json.dumps({name: row.get(name) for name in self.columns}))
        else:
            self.writer.writerow({name: "" if row.get(name) is None else row[name]
                                  for name in self.columns})
        self.n_rows += 1

    def close(self) -> None:
        if self.json:
            self.file.write("\n]\n")
        self.file.close()

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc: typing.Any) -> None:
        self.close()


def mean_ranks(table: dict[str, dict[str, float | None]], smaller_is_better: bool) -> (
        dict[str, float]):
    """model -> its mean rank over the streams of `table` (model -> stream -> value): 1 is the
    best; ties share the mean of their ranks; an undefined value (None, or a model without the
    stream) ranks after every defined one, as River's benchmarks and
    `benchmarks/model_selection.py` rank."""
    models = list(table)
    streams: list = []
    for row in table.values():
        streams += [name for name in row if name not in streams]
    ranks: dict[str, list[float]] = {model: [] for model in models}
    for stream in streams:
        def key(model: str) -> tuple:
            value = table[model].get(stream)
            if value is None or not math.isfinite(value):
                return (1, 0.0)
            return (0, value if smaller_is_better else -value)

        ordered = sorted(models, key=key)
        i = 0
        while i < len(ordered):
            j = i
            while j + 1 < len(ordered) and key(ordered[j + 1]) == key(ordered[i]):
                j += 1
            for k in range(i, j + 1):
                ranks[ordered[k]].append((i + j) / 2 + 1)
            i = j + 1
    return {model: sum(r) / len(r) for model, r in ranks.items() if r}


def plot(panels: list[tuple[str, list[Result]]], path: str | pathlib.Path, measure: str,
         title: str = "") -> None:
    """One panel per stream: `measure` per window (each result's curve) for every model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = measure.replace("_", "-") if measure.startswith("kappa_") else measure
    label = label.replace("_", " ")
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.6 * len(panels) + 0.6),
                             squeeze=False)
    for ax, (stream, results) in zip(axes[:, 0], panels):
        for result in results:
            points = [(x, y) for x, y in result.curve if y is not None]
            if points:
                xs, ys = zip(*points)
                final = result.measure(measure)
                name = result.name + (f" ({final:.4f})" if final is not None else "")
                ax.plot(xs, ys, label=name, linewidth=1.2, marker="." if len(xs) < 30 else None)
        ax.set_xlabel("records")
        ax.set_ylabel(f"{label} per window")
        ax.set_title(stream, fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
