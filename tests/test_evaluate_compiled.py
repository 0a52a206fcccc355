"""`streammargin evaluate`'s compiled path (`connectors.evaluate.compiled`): a chunk of records
through a model's compiled steps gives the per-record path's predictions, measures, windows,
results file and model, to the bit; only the time and memory columns (measurements) may differ."""

from __future__ import annotations

import contextlib
import csv
import io
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streammargin
from connectors.evaluate import compiled, runner
from streammargin import state

MEASURED = ("seconds", "memory_bytes", "ram_hours")

MODELS = {
    "alma": lambda: streammargin.ALMAClassifier(),
    "alma-p3": lambda: streammargin.ALMAClassifier(p=3.0, average=False),
    "linearmpu": lambda: streammargin.LinearMPUClassifier(budget=20),
    "cpm-one": lambda: streammargin.ConvexPolytopeClassifier(polytopes="one", n_faces=3),
    "cpm": lambda: streammargin.ConvexPolytopeClassifier(n_faces=2, steps=2, window=20),
}


@contextlib.contextmanager
def per_record_only():
    """The per-record path for every model (no compiled steps)."""
    original = compiled.CompiledRun.of
    compiled.CompiledRun.of = classmethod(lambda cls, model: None)
    try:
        yield
    finally:
        compiled.CompiledRun.of = original


@contextlib.contextmanager
def counting_takes():
    """Counts the compiled path's chunks (that it was taken, not only the per-record path)."""
    original = compiled.CompiledRun.take
    calls = []

    def take(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    compiled.CompiledRun.take = take
    try:
        yield calls
    finally:
        compiled.CompiledRun.take = original


def make_records(seed: int, n: int, labels: list, gaps: bool) -> list[tuple]:
    rng = random.Random(seed)
    names = ["a", "b", "c", "d"]
    weights = {k: rng.gauss(0, 1) for k in names}
    records = []
    for _ in range(n):
        x = {k: rng.choice([rng.gauss(0, 3), float(rng.randrange(-2, 3)), 1e-300])
             for k in names}
        if gaps and rng.random() < 0.2:  # missing values: records of fewer names
            for k in rng.sample(names, rng.randint(1, 3)):
                del x[k]
        if gaps and rng.random() < 0.05:
            x["new" + str(rng.randrange(3))] = rng.gauss(0, 1)  # a name seen later
        score = sum(weights[k] * v for k, v in x.items() if k in weights) + rng.gauss(0, 0.5)
        if labels == [False, True]:
            y = score > 0
        else:
            y = labels[min(int(abs(score)), len(labels) - 1)] if rng.random() < 0.9 \
                else rng.choice(labels)
        records.append((x, y))
    return records


def run(records, name, scale, window, fading, positive):
    model = MODELS[name]()
    built = runner.Scaled(model) if scale else model
    rows = []
    results = runner.evaluate(
        {name: built}, lambda: iter(records), window=window, positive=positive, fading=fading,
        on_window=lambda result, row: rows.append(row),
    )
    return results[0], rows, state.dumps(model.to_state())


@pytest.mark.parametrize("name", sorted(MODELS))
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 90), scale=st.booleans(),
       window=st.integers(1, 25), chunk=st.integers(1, 12), gaps=st.booleans(),
       several=st.booleans(), fading=st.sampled_from([None, 0.9]))
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_compiled_chunks_give_the_per_record_windows_and_model(
        name, seed, n, scale, window, chunk, gaps, several, fading, monkeypatch):
    # (monkeypatch sets the same CHUNK attribute each example: nothing to reset between them)
    multiclass = name == "cpm" and several
    labels = ["a", "b", "c", "d"] if multiclass else [False, True]
    positive = None if multiclass else True
    records = make_records(seed, n, labels, gaps)
    monkeypatch.setattr(runner, "CHUNK", chunk)  # windows smaller and larger than a chunk
    with counting_takes() as takes:
        fast, fast_rows, fast_model = run(records, name, scale, window, fading, positive)
    assert takes, "the compiled path was not taken"
    with per_record_only():
        slow, slow_rows, slow_model = run(records, name, scale, window, fading, positive)
    assert fast_rows == slow_rows
    assert fast_model == slow_model
    for field in ("n", "error", "last", "curve", "window_auc_sum", "window_auc_count"):
        assert getattr(fast, field) == getattr(slow, field), field


def write_csv(path, seed: int, n: int, several: bool) -> None:
    rng = random.Random(seed)
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["x0", "x1", "x2", "label"])
        for _ in range(n):
            x = [rng.gauss(0, 1) for _ in range(3)]
            label = int(x[0] + 0.5 * x[1] > 0) if not several else \
                "abc"[min(int(abs(x[0] * 2)), 2)]
            cells = [f"{v:.4f}" for v in x]
            roll = rng.random()
            if roll < 0.05:
                cells[rng.randrange(3)] = ""  # a missing value
            elif roll < 0.08:
                cells[rng.randrange(3)] = "n/a"  # a bad record
            elif roll < 0.10:
                cells = cells[:2]  # a bad line (too few fields)
            writer.writerow([*cells, label] if len(cells) == 3 else cells)


def evaluate_command(args: list[str]) -> str:
    from connectors.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(args)
    assert code == 0, out.getvalue()
    return out.getvalue()


def results_without_measurements(path) -> list[dict]:
    with open(path, newline="") as file:
        return [{k: v for k, v in row.items() if k not in MEASURED} for row in csv.DictReader(file)]


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(5, 120), scale=st.booleans(),
       window=st.integers(1, 40), several=st.booleans(),
       spec=st.sampled_from(["alma", "linearmpu", "convexpolytope",
                             "convexpolytope(polytopes='one')"]))
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_the_command_writes_the_per_record_results_file(tmp_path, seed, n, scale, window, several,
                                                        spec):
    data = tmp_path / "stream.csv"
    write_csv(data, seed, n, several)
    args = ["evaluate", "--model", spec, "--model", "budgetperceptron", "--csv", str(data),
            "--target", "label", "--window", str(window), "--on-bad-record", "skip"]
    if not scale:
        args.append("--no-scale")
    out_fast, out_slow = tmp_path / "fast.csv", tmp_path / "slow.csv"
    fast = evaluate_command([*args, "--output", str(out_fast)])
    with per_record_only():
        slow = evaluate_command([*args, "--output", str(out_slow)])
    assert results_without_measurements(out_fast) == results_without_measurements(out_slow)
    # The bad records' lines (file:line) and counts are the same.
    assert [line for line in fast.splitlines() if "stream.csv:" in line or "records" in line
            and "bad" in line] == [line for line in slow.splitlines() if "stream.csv:" in line
                                   or "records" in line and "bad" in line]
