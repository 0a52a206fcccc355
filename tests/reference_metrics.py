"""River's MacroF1 as the worker computes it: River's per-class F1, an exactly rounded mean.

River's `metrics.MacroF1.get` adds the per-class F1s over a set of labels, whose order depends on
string hashing (PYTHONHASHSEED), so its last bit differs between processes. The worker's
`PartitionMetrics.macro_f1` sums the same terms with `math.fsum`; this computes that from a River
metric, so tests compare to the last bit.
"""

from __future__ import annotations

import math


def macro_f1(metric) -> float:
    """The exactly rounded macro F1 of a River `MacroF1` (or any metric with a `cm`)."""
    cm = metric.cm
    classes = cm.classes
    b2 = 1.0
    terms = []
    for c in classes:  # River's MacroFBeta.get, term by term
        try:
            p = cm[c][c] / cm.sum_col[c]
        except ZeroDivisionError:
            p = 0
        try:
            r = cm[c][c] / cm.sum_row[c]
        except ZeroDivisionError:
            r = 0
        try:
            terms.append((1 + b2) * p * r / (b2 * p + r))
        except ZeroDivisionError:
            continue
    return math.fsum(terms) / len(classes) if classes else 0.0


def progressive(data, make_model) -> dict:
    """River's progressive validation of fresh models over `data`: accuracy, macro F1 (summed as
    the worker sums it) and log loss (CrossEntropy), as the worker's metrics name them."""
    from river import evaluate, metrics

    def score(metric):
        return evaluate.progressive_val_score(data, make_model(), metric)

    return {"accuracy": score(metrics.Accuracy()).get(),
            "macro_f1": macro_f1(score(metrics.MacroF1())),
            "log_loss": score(metrics.CrossEntropy()).get()}
