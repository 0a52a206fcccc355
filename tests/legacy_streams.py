"""The streams the legacy states in tests/data/ were generated with. A model whose state format
changes must restore those states and continue them exactly as the old code did, on the same
stream: these streams must never change."""

from __future__ import annotations

import typing

import numpy as np


def legacy_stream(
    labels: tuple, seed: int, n_features: int, binary_target: typing.Callable[[dict], float]
) -> list[tuple[dict, object]]:
    """60 records of `n_features` normal features ("f0", ...) and, for 30% of them, a "rare"
    one; labels drawn from `labels` when there are more than two, else `binary_target(x) > 0`."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(60):
        x = {f"f{i}": float(v) for i, v in enumerate(rng.normal(size=n_features))}
        if rng.random() < 0.3:
            x["rare"] = float(rng.normal())
        if len(labels) > 2:
            y = labels[int(rng.integers(len(labels)))]
        else:
            y = bool(binary_target(x) > 0)
        out.append((x, y))
    return out


def probabilities(model: typing.Any, probes: list[dict]) -> list[dict]:
    """`predict_proba_one` of each probe, as the fixtures store them (labels as text)."""
    return [{str(k): float(v) for k, v in model.predict_proba_one(x).items()} for x in probes]


def check_continues_as_saved(model: typing.Any, stream: list, fixture: dict) -> list[dict]:
    """Assert that `model`, restored from a legacy state saved after `stream[:40]`, gives the
    fixture's probabilities on the last 20 records before and after it learns them; returns the
    probes."""
    probes = [x for x, _ in stream[40:]]
    assert probabilities(model, probes) == fixture["before"]
    for x, y in stream[40:]:
        model.learn_one(x, y)
    assert probabilities(model, probes) == fixture["after"]
    return probes
