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
