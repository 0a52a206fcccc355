"""`streammargin serve`'s memory bound (connectors/serving/sizing.py, docs/serving.md "Sizing"):
a follower holding every version it keeps of models at their ceiling, measured with tracemalloc
(as tests/test_memory_budget.py measures the worker's task), stays within the formula's terms
for them; and the formula the docs give is the one the code computes."""

from __future__ import annotations

import gc
import json
import pathlib
import random
import re
import time
import tracemalloc

import pytest

from test_memory_budget import _Record  # (a record as a task reads it)

from connectors.serving import ModelFollower, sizing
from connectors.serving.record_rows import RecordRows
from connectors.state.checkpoint import LoadedCheckpoint
from connectors.task import PartitionTask
from connectors.worker.config import WorkerConfig
from connectors.worker.memory_budget import PROCESS_BYTES
from streammargin.progressive import PredictionShapes

ROOT = pathlib.Path(__file__).resolve().parents[1]
MiB = 1 << 20
PARTITIONS, VERSIONS_KEPT, LOADS = 2, 3, 5  # 5 checkpoints a partition: 2 evicted from each


class Reader:
    """A checkpoint store that gives the follower the payloads it is handed, one a read, each a
    fresh copy (as a read from Kafka allocates it)."""

    def __init__(self, payloads: list[tuple[int, bytes]]):
        self.payloads = list(payloads)
        self.offset = 0

    def partitions_of(self, topic: str) -> set[int]:
        return set(range(PARTITIONS))

    def follow(self, keys: list) -> dict:
        if not self.payloads:
            time.sleep(0.01)
            return {}
        partition, payload = self.payloads.pop(0)
        self.offset += 1
        return {("t", partition): LoadedCheckpoint("k", bytes(bytearray(payload)), "checkpoints",
                                                   0, self.offset, 0)}

    def close(self) -> None:
        pass


def checkpoints_at_the_ceiling(config: WorkerConfig) -> list[tuple[int, bytes]]:
    """LOADS checkpoints of each partition, each of a model at its ceiling: ALMA's columns full
    of the longest names a feature space stores (126 characters), as in test_memory_budget."""
    settings = config.task_settings()
    rng = random.Random(3)
    out = []
    for partition in range(PARTITIONS):
        task = PartitionTask.new("t", partition, settings)
        offset = 0
        for load in range(LOADS):
            records = []
            for _ in range(400 if load == 0 else 40):
                x = {f"{rng.randrange(10**6):0126d}": rng.gauss(0, 1) for _ in range(20)}
                value = json.dumps({"id": f"e{offset}", "x": x, "y": offset % 2 == 0}).encode()
                records.append(_Record("t", partition, offset, None, value))
                offset += 1
            task.process(records)
            out.append((partition, task.to_checkpoint()))
        assert len(task.model._features) >= config.params["max_features"] * 7 // 8  # (full)
    # (the partitions' checkpoints in turn, as workers write them)
    return [out[p * LOADS + load] for load in range(LOADS) for p in range(PARTITIONS)]


@pytest.mark.parametrize("scale", [False, True])
def test_a_follower_holding_every_version_at_the_ceiling_stays_within_the_formula(scale):
    base = WorkerConfig(topics=["t"], model="alma", params={"max_features": 1024}, scale=scale)
    payloads = checkpoints_at_the_ceiling(base)
    # C, the checkpoint term: the largest checkpoint read, as --max-memory would make it.
    largest = max(len(p) for _, p in payloads)
    config = WorkerConfig(topics=["t"], model="alma", params={"max_features": 1024}, scale=scale,
                          max_checkpoint_bytes=largest)
    budget = sizing.budget_of(config, VERSIONS_KEPT, 1 << 20, 1)
    reader = Reader(payloads)
    follower = ModelFollower(config, versions_kept=VERSIONS_KEPT, store=reader)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        follower.start()
        deadline = time.monotonic() + 120
        while follower.counters.loaded < len(payloads) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert follower.counters.loaded == len(payloads), follower.counters
        assert follower.counters.refused == 0
        # Each version's shapes of predicted rows filled as hostile requests would: a new set
        # of long names every request, until each holds what its bound lets it.
        for version, served in list(follower.view.versions.items()):
            for r in range(PredictionShapes.MAX_NAMES):
                names = [f"{version}-{r}-{j}-{'n' * 40}" for j in range(30)]
                kept = served.shapes
                if kept is not None and (kept.names + 30 > kept.MAX_NAMES or kept.chars + sum(
                        map(len, names)) > kept.MAX_CHARS):
                    break  # (one more would take it past its bound: it would start again)
                follower.predict([{"x": {name: 1.0 for name in names}}] * 4, version=version)
            assert served.shapes.names > PredictionShapes.MAX_NAMES - 60
        follower.close()
        gc.collect()
        held, peak = (m - before for m in tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()
    view = follower.view
    assert len(view.versions) == PARTITIONS * VERSIONS_KEPT
    # What the formula gives these parts: (M x V + 2) x (m + s), and 2 x C read.
    models = budget.models(PARTITIONS)
    assert peak <= models + sizing.READ_COPIES * budget.checkpoint, (peak, budget.parts(2))
    assert held <= PARTITIONS * VERSIONS_KEPT * budget.model, (held, budget.model)
    if not scale:
        # The versions and their shapes really are at their ceilings: the bound is not met by
        # holding little. (The scaler's term is its ceiling at 65,536 names, far above these
        # 1,024.)
        assert held >= 0.4 * PARTITIONS * VERSIONS_KEPT * (
            budget.model - PredictionShapes.BYTES), (held, budget.model)


def test_the_docs_give_the_formula_the_code_computes():
    text = (ROOT / "docs" / "serving.md").read_text()
    sizing_section = text[text.index("## Sizing"):text.index("## Errors")]
    formula = ("process (138 MiB) + fetch (16 MiB) + (M x V + 2) x (m + s) + 2 x C + "
               "(Q + 8) x B")
    assert formula in sizing_section
    assert PROCESS_BYTES + sizing.SERVER_BYTES + RecordRows.BYTES == 138 * MiB
    # The connections' term: each connection's head and uvicorn's body read-ahead.
    from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT

    from connectors.serving import app

    assert sizing.SERVER_BYTES == app.MAX_CONNECTIONS * (app.MAX_HEAD_BYTES + HIGH_WATER_LIMIT)
    assert sizing.FETCH_BYTES == 16 * MiB
    assert sizing.READ_COPIES == 2 and sizing.REQUEST_OBJECTS == 8
    # Its defaults as the docs state them: B 4 MiB, Q 16, V 3.
    assert "(`--max-request-bytes`, 4 MiB)" in sizing_section
    assert "(`--max-concurrent-requests`, 16)" in sizing_section
    assert "V versions kept" in sizing_section
    from connectors.serving.follower import DEFAULT_VERSIONS_KEPT

    assert DEFAULT_VERSIONS_KEPT == 3
    # The parts, term by term, for M = 12, V = 3, Q = 16, B = 4 MiB.
    config = WorkerConfig(topics=["t"], scale=True)
    budget = sizing.budget_of(config, 3, 4 * MiB, 16)
    assert budget.parts(12) == {"process": 138 * MiB, "fetch": 16 * MiB,
                                "models": (12 * 3 + 2) * budget.model,
                                "checkpoint": 2 * config.max_checkpoint_bytes,
                                "requests": (16 + 8) * 4 * MiB}
    # The docs' example: ALMA on 12 partitions with --scale, V = 3: m + s = 36 MiB, 38
    # versions = 1.3 GiB; without --scale, 0.72 GiB; V = 1, 0.50 GiB.
    example = re.search(r"Example: ALMA.*?V to 1 for [\d.]+ GiB\.", sizing_section, re.S)[0]
    example = " ".join(example.split())
    assert "m + s = 2 x 8.6 + 2 + 17 = 36 MiB, 38 versions = 1.3 GiB" in example
    assert round(budget.model / MiB) == 36
    assert round(budget.models(12) / 2**30, 1) == 1.3
    unscaled = sizing.budget_of(WorkerConfig(topics=["t"]), 3, 4 * MiB, 16)
    assert f"without `--scale`, {unscaled.models(12) / 2**30:.2f} GiB" in example
    one = sizing.budget_of(config, 1, 4 * MiB, 16)
    assert f"Lower V to 1 for {one.models(12) / 2**30:.2f} GiB" in example
