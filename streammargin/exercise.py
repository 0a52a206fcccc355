"""Every compiled code path of the package, run on small made-up streams.

What the ahead-of-time module exports (`streammargin.jit.aot`, `exports.json`) is exactly what
`run()` calls from Python, recorded (`python -m streammargin.exercise --write` rewrites the file;
`tests/test_aot.py` fails when it is out of date). So `run()` calls everything a user or the
Kafka worker can reach, with the argument types they produce:

- every registered model class, with each parameter set of its `_unit_test_params` (and at its
  defaults): records with new names, repeated records (the encoders' cached arrays), names beyond
  `max_features` (hashed columns), through predict_one, predict_proba_one,
  predict_with_proba_one, decision_one, learn_one and the one-call trials of AutoClassifier's
  members, a stream long enough for the kernel width's warm-up (`gamma="auto"`);
- mini-batches (learn_many, predict_many, predict_proba_many) of frames in each layout pandas
  makes (column-major, row-major, strided, read-only or not);
- the safe state (`to_state`, `from_state` through bytes) and pickling, then learning again;
- each binary model one-vs-rest, AutoClassifier on binary and multiclass streams, the batch
  solvers (`streammargin.mpu.fit_batch`, `streammargin.budget_svm.budget_svm_dual`) and the
  StandardScaler; every public property of every model (inspection);
- the compiled test-then-train over rows of the models that have one
  (`streammargin.progressive`), with and without a scaler, labelled rows and rows only
  predicted, with a drift detector and without.

`streammargin warmup --jit-cache` runs it to fill numba's cache instead.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import typing

import numpy as np

__all__ = ["record_exports", "run"]

BINARY = (True, False)
MULTICLASS = ("a", "b", "c")
N_RECORDS = 160  # past the kernel width's warm-up (128 records), and a few budget evictions


def _records(labels: tuple, n: int = N_RECORDS, seed: int = 0) -> list[tuple[dict, typing.Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = {f"f{j}": float(v) for j, v in enumerate(rng.normal(size=2 + i % 4))}
        if i % 7 == 3:
            x[f"new{i}"] = 1.0  # a name never seen, learnt or not
        if i % 5 == 1:
            x["flag"] = bool(i % 2)
            x["count"] = i % 3
        label = labels[int(x["f0"] > 0) + (len(labels) > 2) * (i % 2)] if len(labels) > 2 \
            else labels[int(x["f0"] + x["f1"] > 0)]
        out.append((x, label))
    return out


def _frames(records: list[tuple[dict, typing.Any]]) -> typing.Iterator[tuple[typing.Any, typing.Any]]:
    """The records as DataFrames in each layout pandas hands out."""
    import pandas as pd

    X = pd.DataFrame([x for x, _ in records])
    y = pd.Series([label for _, label in records])
    yield X, y  # column-major (read-only under copy-on-write)
    yield X.iloc[1::2], y.iloc[1::2]  # strided rows
    dense = X.fillna(0.0).astype(float)
    yield pd.DataFrame(np.ascontiguousarray(dense.to_numpy()), columns=X.columns), y  # row-major
    yield dense[[dense.columns[0]]], y  # one column
    yield dense[list(reversed(dense.columns))], y  # columns out of the model's order


def _stream(model: typing.Any, records: list) -> None:
    members = getattr(model, "_predict_then_learn", None)
    for i, (x, label) in enumerate(records):
        model.predict_one(x)
        model.predict_proba_one(x)
        if hasattr(model, "predict_with_proba_one"):
            model.predict_with_proba_one(x)
        if hasattr(model, "decision_one"):
            model.decision_one(x)
        if members is not None and i % 3 == 0:
            model._predict_then_learn(x, label)
            if hasattr(model, "_proba_then_learn") and not getattr(model, "_multiclass", False):
                model._proba_then_learn(dict(x), label)
        else:
            model.learn_one(x, label)
        if i % 4 == 0:  # the same dict again (cached encodings)
            model.predict_one(x)
            model.learn_one(x, label)


def _batches(model: typing.Any, records: list) -> None:
    for X, y in _frames(records):
        model.learn_many(X, y)
        model.predict_many(X)
        model.predict_proba_many(X)


def _round_trips(model: typing.Any, records: list) -> typing.Any:
    from streammargin import state

    restored = state.from_state(state.loads(state.dumps(model.to_state())))
    unpickled = pickle.loads(pickle.dumps(model))
    for twin in (restored, unpickled):
        _stream(twin, records[:8])
    return restored


def _inspect(model: typing.Any) -> None:
    """Read every public property (support vectors, weights, margins, counters...)."""
    for name in dir(type(model)):
        if not name.startswith("_") and isinstance(getattr(type(model), name), property):
            getattr(model, name)


def exercise_model(model: typing.Any, labels: tuple) -> None:
    """One model through every path (see the module's doc)."""
    records = _records(labels)
    _stream(model, records)
    _inspect(model)
    _batches(model, records[:40])
    _round_trips(model, records)
    fresh = model.clone()
    _batches(fresh, records[:40])  # mini-batches of a fresh model (new names in a frame)
    _stream(fresh, records[:20])


def _models() -> typing.Iterator[tuple[typing.Any, tuple]]:
    import streammargin
    from streammargin import state

    for cls in sorted(state.registered_models().values(), key=lambda cls: cls.__name__):
        if hasattr(cls, "_forms") or cls is streammargin.OneVsRestClassifier:
            continue  # (MPUClassifier builds the two MPU classes, listed themselves)
        for params in [{}, *cls._unit_test_params()]:
            model = cls(**params)
            labels = MULTICLASS if getattr(model, "_multiclass", False) else BINARY
            yield model, labels
            if labels is BINARY and cls is not streammargin.AutoClassifier:
                yield streammargin.OneVsRestClassifier(cls(**params), max_classes=5), MULTICLASS
            if cls is streammargin.AutoClassifier:
                yield cls(**params), MULTICLASS


def _scaler() -> None:
    from streammargin import state
    from streammargin.scaler import StandardScaler

    for scaler in (StandardScaler(), StandardScaler(max_features=3)):
        for x, _ in _records(BINARY, 40):
            scaler.transform_one(x)
            before, after, update = scaler.transform_learn_one(x)
            scaler.apply_learn(update)
            scaler.learn_one(x)
        twin = StandardScaler.from_state(state.loads(state.dumps(scaler.to_state())))
        twin.transform_learn_one({"f0": 1.0})


def _batch_solvers() -> None:
    from streammargin import budget_svm, mpu

    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 4))
    y = X[:, 0] + 0.3 * rng.normal(size=60) > 0
    mpu.fit_batch(X, y)
    mpu.fit_batch(np.asfortranarray(X), y.tolist(), C=0.5)
    gram = np.exp(-((X[:, None, :] - X[None, :, :]) ** 2).sum(axis=2))
    budget_svm.budget_svm_dual(gram, np.where(y, 1.0, -1.0), 1.0, 30.0)


def _progressive() -> None:
    import streammargin
    from streammargin.jit import progressive as jit
    from streammargin.progressive import Rows, Score, Shapes, model_steps

    for make, labels in ((streammargin.ALMAClassifier, BINARY),
                         (lambda: streammargin.MPUClassifier(budget=8), BINARY),
                         (lambda: streammargin.ConvexPolytopeClassifier(polytopes="one"), BINARY),
                         (streammargin.ConvexPolytopeClassifier, MULTICLASS)):
        for scaler in (None, streammargin.StandardScaler()):
            model = make()
            records = _records(labels, 40)
            for x, label in records[:10]:
                if scaler is not None:
                    scaler.learn_one(x)
                model.learn_one(x if scaler is None else scaler.transform_one(x), label)
            shapes = Shapes(model, scaler)
            steps = model_steps(model)
            codes = {label: code for code, label in enumerate(
                [False, True] if steps.binary else model._labels)}
            for detector in (jit.NO_DRIFT, jit.DDM):
                names, holes, rows_labels = [], [], []
                for x, label in records:
                    entries = [(name, j, None) for j, name in enumerate(x)]
                    shape = shapes.add(entries) if detector else shapes.add_for_prediction(entries)
                    if shape is None:
                        continue
                    names.append(shape)
                    holes.append([float(v) for v in x.values()])
                    rows_labels.append(codes.get(label, -1) if detector else -1)
                score = Score.fresh(steps.n_classes)
                score.detector[jit.KIND] = detector
                score.detector[jit.DDM_PS_MIN] = np.inf
                steps.run(scaler, shapes, Rows(names, holes, rows_labels), score)


def run(progress: typing.Callable[[str], None] | None = None) -> None:
    """Run every path (see the module's doc)."""
    for model, labels in _models():
        if progress is not None:
            progress(repr(model).splitlines()[0][:100])
        exercise_model(model, labels)
    _scaler()
    _batch_solvers()
    _progressive()


def record_exports() -> set:
    """(module, function, signature) of every call of `run()` into `streammargin.jit`."""
    from streammargin.jit import dispatch

    with dispatch.recording() as calls:
        run()
    return {call for call in calls if call[0].startswith("streammargin.jit.")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="record the calls and rewrite streammargin/jit/exports.json")
    args = parser.parse_args(argv)
    if args.write:
        from streammargin.jit import aot

        exports = aot.write_exports(record_exports())
        count = sum(len(s) for functions in exports.values() for s in functions.values())
        print(f"{aot.EXPORTS_FILE}: {count} compiled versions of "
              f"{sum(len(f) for f in exports.values())} functions", file=sys.stderr)
    else:
        run(progress=lambda line: print(line, file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
