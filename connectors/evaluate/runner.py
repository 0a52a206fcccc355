"""Progressive validation of several models on one stream: the loop behind `streammargin evaluate`.

Each model sees the stream test-then-train through River's own `stream.simulate_qa` (with an
optional label delay), so its accuracy (and macro F1) is exactly what
`river.evaluate.progressive_val_score` reports for the same model, stream and delay. Beside them
it measures log loss (from `predict_proba_one`), wall time, memory, and a rolling accuracy curve
for plots. A model that fails is reported with its error; the others go on.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import pathlib
import time
import typing

from connectors.evaluate.records import Stream

__all__ = ["Result", "evaluate", "plot"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Result:
    name: str
    n: int
    accuracy: float | None
    log_loss: float | None
    seconds: float
    memory_bytes: int | None
    curve: list[tuple[int, float]]  # (records answered, rolling accuracy)
    macro_f1: float | None = None  # multiclass streams
    error: str | None = None  # why the model stopped, if it failed

    @property
    def rate(self) -> float:
        """Records/s, NaN when the run was too short to measure one."""
        return self.n / self.seconds if self.seconds >= 0.01 and self.n else math.nan


def evaluate(
    models: dict[str, typing.Any],
    make_stream: typing.Callable[[], Stream],
    delay: int = 0,
    rolling: int = 500,
    on_progress: typing.Callable[[str, int, float], None] | None = None,
    progress_every: int = 1000,
    multiclass: bool = False,
    on_result: typing.Callable[[Result], None] | None = None,
) -> list[Result]:
    """Progressive validation of each model on a fresh copy of the stream.

    `delay` is the number of records after which a label is revealed (0: at once), as River's
    `simulate_qa`. Accuracy (and with `multiclass`, River's `MacroF1`) counts `predict_one`
    (a None prediction, before a multiclass model has seen a label, is not scored, as in
    `progressive_val_score`); log
    loss counts `predict_proba_one` (River's `LogLoss`, clipped at 1e-15; `CrossEntropy` for
    `multiclass`). `on_progress(name, answered, seconds)` is called when a model starts, every
    `progress_every` answers and when it ends, `on_result(result)` when its result is
    complete. A model that raises is reported with its error
    (`Result.error`) and the figures it had; the next model runs.
    """
    from river import metrics, stream, utils

    results = []
    for name, model in models.items():
        accuracy = metrics.Accuracy()
        macro_f1 = metrics.MacroF1() if multiclass else None
        log_loss = metrics.CrossEntropy() if multiclass else metrics.LogLoss()
        window = utils.Rolling(metrics.Accuracy, window_size=rolling)
        pending: dict[int, tuple[typing.Any, typing.Any]] = {}
        curve: list[tuple[int, float]] = []
        answered = 0
        error = None
        if on_progress:
            on_progress(name, 0, 0.0)
        start = time.perf_counter()
        try:
            # Warm a clone up first, so the timing does not include numba's cache loading.
            warm = model.clone()
            for x, y in itertools.islice(make_stream(), 5):
                warm.predict_proba_one(x)
                warm.learn_one(x, y)
            start = time.perf_counter()
            for i, x, y in stream.simulate_qa(make_stream(), moment=None, delay=delay):
                if y is None:  # a question: predict now, score when the label comes
                    pending[i] = (model.predict_one(x), model.predict_proba_one(x))
                    continue
                y_pred, proba = pending.pop(i)
                # As progressive_val_score: no prediction (a multiclass model before its first
                # label) is not scored.
                if y_pred is not None:
                    accuracy.update(y, y_pred)
                    if macro_f1 is not None:
                        macro_f1.update(y, y_pred)
                    window.update(y, y_pred)
                if proba:
                    log_loss.update(y, proba)
                answered += 1
                model.learn_one(x, y)
                if answered % max(1, rolling // 5) == 0:
                    curve.append((answered, window.get()))
                if on_progress and answered % progress_every == 0:
                    on_progress(name, answered, time.perf_counter() - start)
        except Exception as failure:  # one model's failure must not discard the others' results
            error = f"{type(failure).__name__}: {' '.join(str(failure).split())[:300]}"
            log.debug("model %s failed after %d records", name, answered, exc_info=True)
        seconds = time.perf_counter() - start
        if on_progress:
            on_progress(name, answered, seconds)
        loss = log_loss.get() if answered else None
        try:
            memory = model._raw_memory_usage
        except Exception:  # a failed model may not even measure
            memory = None
        result = Result(
            name=name,
            n=answered,
            accuracy=accuracy.get() if answered else None,
            log_loss=(loss if loss is None or math.isfinite(loss) else math.inf),
            seconds=seconds,
            memory_bytes=memory,
            curve=curve,
            macro_f1=macro_f1.get() if macro_f1 is not None and answered else None,
            error=error,
        )
        results.append(result)
        if on_result:
            on_result(result)
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
            label = result.name
            if result.accuracy is not None:
                label += f" ({result.accuracy:.4f})"
            ax.plot(xs, ys, label=label, linewidth=1.2)
    ax.set_xlabel("records")
    ax.set_ylabel("rolling accuracy")
    ax.set_title(title or "progressive validation")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # no curve before `rolling // 5` records
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
