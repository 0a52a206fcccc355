"""Throughput of ALMAClassifier against River's linear models, measured in one run.

Prints three tables:
1. predict_one + learn_one samples/s on dense dicts (d = 10 and 100) and sparse ones (20 of
   1,000 names per record), with the ratio to River's
   ALMAClassifier and to the floor (`ALMAFloor`: the dict's values to an array plus one call of
   ALMA's own numba step per record, what the same arithmetic costs with no Python around it);
   the models take turns on chunks of 1,000 records and the median of the repetitions is
   reported, so load on the machine hits every model alike.
2. learn_many / predict_many rows/s on pandas DataFrames (d = 100).
3. first-call cost: a fresh process on the compiled modules, then on numba's JIT compiling from
   scratch, then one loading that cache.

Run: .venv/bin/python benchmarks/alma_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from common import first_call_costs, interleaved_rates, time_loop


def dense_stream(d: int, n: int, labels: str, seed: int = 0) -> list[tuple[dict, bool]]:
    """'linear': a noisy linear target (the models soon update rarely); 'coin': labels are coin
    flips (every model keeps updating)."""
    rng = np.random.default_rng(seed)
    names = [f"x{i}" for i in range(d)]
    u = rng.normal(size=d)
    X = rng.normal(size=(n, d))
    if labels == "linear":
        y = X @ u + 0.5 * rng.normal(size=n) > 0
    else:
        y = rng.random(n) < 0.5
    return [(dict(zip(names, row.tolist())), bool(label)) for row, label in zip(X, y)]


def sparse_stream(d: int, nnz: int, n: int, labels: str, seed: int = 0) -> list[tuple[dict, bool]]:
    """`nnz` of `d` names per record (drawn anew each record), values and labels as in
    `dense_stream`."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=d)
    stream = []
    for _ in range(n):
        columns = np.sort(rng.choice(d, size=nnz, replace=False))
        values = rng.normal(size=nnz)
        if labels == "linear":
            label = values @ u[columns] + 0.5 * rng.normal() > 0
        else:
            label = rng.random() < 0.5
        stream.append(({f"x{j}": v for j, v in zip(columns.tolist(), values.tolist())},
                       bool(label)))
    return stream


class ALMAFloor:
    """The floor of ALMAClassifier's per-record cost: each dict's values become an array
    (`np.fromiter`) and one call of ALMA's compiled learn-then-predict step learns the previous
    record and scores this one. Dense: the names are assumed fixed and in column order; sparse:
    each name's column comes from a dict (`np.fromiter` over the lookups). The arithmetic is
    ALMA's own (same state, same result); what it leaves out is what the model adds around it in
    Python: checking names and values, new names, the deferred trial's bookkeeping."""

    def __init__(self, d: int, sparse: bool = False):
        import streammargin

        self._model = model = streammargin.ALMAClassifier()
        names = [f"x{i}" for i in range(d)]
        model.learn_one(dict.fromkeys(names, 1.0), True)  # d columns, in order
        model._flush()
        self._column = {name: model._features.index[name] for name in names}
        self._sparse = sparse
        self._idx = np.arange(d, dtype=np.int64)
        self._pending: tuple | None = None
        self._target = 0.0
        self._no_idx = np.zeros(0, dtype=np.int64)

    def predict_one(self, x: dict) -> bool:
        model = self._model
        n = len(x)
        packed = np.fromiter(x.values(), np.float64, n).tobytes()
        idx = (np.fromiter(map(self._column.__getitem__, x), np.int64, n) if self._sparse
               else self._idx)
        pending, self._pending = self._pending, (idx, packed)
        if pending is None:
            return model._learn_then_predict(
                model._vectors, model._st, self._no_idx, b"", 0.0, idx, packed
            ) > 0.0
        return model._learn_then_predict(
            model._vectors, model._st, pending[0], pending[1], self._target, idx, packed
        ) > 0.0

    def learn_one(self, x: dict, y: bool) -> None:
        # predict_one has just converted this x (the benchmark's loop predicts, then learns).
        self._target = 1.0 if y else -1.0


FLOOR = "floor: dict->array + 1 call"


def per_record_table(repeats: int, n: int) -> None:
    from river import linear_model

    import streammargin

    factories = {
        "river ALMAClassifier": linear_model.ALMAClassifier,
        "river Perceptron": linear_model.Perceptron,
        "river PAClassifier": linear_model.PAClassifier,
        "streammargin ALMAClassifier": streammargin.ALMAClassifier,
        "streammargin ALMA p=2ln(d)": None,  # filled per d
        FLOOR: None,  # filled per d
    }
    print("predict_one + learn_one, dense dicts, no scaler (samples/s, median of repeats)")
    print("River's ALMA does little when it rarely updates (a learnable target), more when labels")
    print("are coin flips; streammargin's cost hardly depends on it. Both regimes are shown.")
    print("d = 1000: sparse, 20 of the 1,000 names per record.")
    print(f"{'model':<30}{'labels':>8}{'d':>5}{'samples/s':>12}{'vs river ALMA':>15}"
          f"{'vs floor':>10}")
    for d, labels in ((10, "linear"), (10, "coin"), (100, "linear"), (100, "coin"),
                      (1000, "linear"), (1000, "coin")):
        sparse = d == 1000  # 20 of the 1,000 names per record
        data = sparse_stream(d, 20, n, labels) if sparse else dense_stream(d, n, labels)
        factories["streammargin ALMA p=2ln(d)"] = lambda d=d: streammargin.ALMAClassifier(
            p=2 * np.log(d)
        )
        factories[FLOOR] = lambda d=d, sparse=sparse: ALMAFloor(d, sparse)
        rates: dict[str, list[float]] = {name: [] for name in factories}
        for _ in range(repeats):
            models = {name: factory() for name, factory in factories.items()}
            for model in models.values():
                time_loop(model, data[:200])  # warm-up: compile / load numba caches
            for name, rate in interleaved_rates(models, data).items():
                rates[name].append(rate)
        base = statistics.median(rates["river ALMAClassifier"])
        floor = statistics.median(rates[FLOOR])
        for name, values in rates.items():
            rate = statistics.median(values)
            print(f"{name:<30}{labels:>8}{d:>5}{rate:>12,.0f}{rate / base:>14.2f}x"
                  f"{rate / floor:>9.2f}x")
    print()


def batch_table(n: int) -> None:
    import pandas as pd

    import streammargin

    d = 100
    rng = np.random.default_rng(1)
    X = pd.DataFrame(rng.normal(size=(n, d)), columns=[f"x{i}" for i in range(d)])
    y = pd.Series(X.to_numpy() @ rng.normal(size=d) > 0)
    print(f"mini-batches, d = {d}, {n:,} rows in chunks of 10,000 (rows/s, best of 3)")
    for params in ({}, {"average": False}, {"p": 2 * np.log(d)}):
        model = streammargin.ALMAClassifier(**params)
        model.learn_many(X.iloc[:1000], y.iloc[:1000])  # compile
        model.predict_many(X.iloc[:10])
        learn, predict = [], []
        for _ in range(3):
            start = time.perf_counter()
            for i in range(0, n, 10_000):
                model.learn_many(X.iloc[i : i + 10_000], y.iloc[i : i + 10_000])
            learn.append(n / (time.perf_counter() - start))
            start = time.perf_counter()
            for i in range(0, n, 10_000):
                model.predict_many(X.iloc[i : i + 10_000])
            predict.append(n / (time.perf_counter() - start))
        label = ", ".join(f"{k}={v:g}" for k, v in params.items()) or "defaults"
        print(f"  ALMAClassifier({label:<14}) learn_many {max(learn):>12,.0f}/s   "
              f"predict_many {max(predict):>12,.0f}/s")
    print()


def compile_table() -> None:
    print("first-call cost (seconds; fresh processes, a private numba cache directory)")
    print(f"{'':<30}{'import':>8}{'learn_one+predict':>19}{'learn_many+predict':>20}")
    for label, (imported, one, many) in first_call_costs("ALMAClassifier()").items():
        print(f"{label:<30}{imported:>8.2f}{one:>19.2f}{many:>20.2f}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer records and repeats")
    args = parser.parse_args()
    per_record_table(repeats=3 if args.quick else 7, n=5_000 if args.quick else 20_000)
    batch_table(n=100_000 if args.quick else 500_000)
    compile_table()


if __name__ == "__main__":
    main()
