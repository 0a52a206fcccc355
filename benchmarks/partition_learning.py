"""Partitions that learn one model (issue 25), broker-free: the accuracy a keyed topic's partitions
lose when each trains its own model, and what mixing the partitions' models gives back.

A keyed producer spreads the records of a stream over P partitions by the hash of their key
(Kafka's default partitioner: murmur2 of the key, here the record's index, modulo P). A worker
gives each partition a copy of `StandardScaler() | model` and reads its partitions in turn: polls
of up to `--batch` records, batch / P of each partition (round robin). Each
record is predicted, then learnt, by its partition's copy: progressive (prequential) accuracy over
all records, against one model on the same records in their order (P = 1).

Scopes and schemes (the first mixes of every scheme come after 1, 2, 4, ... records a partition,
up to its period: a young model's copies drift apart soonest, and at 32 partitions this ramp was
worth 2-6 points over 10,000 records):
- `partition`: every copy learns alone (what the worker does today);
- `ipm N`: iterative parameter mixing. Once the partitions have learnt N records each since the
  last mix (N x P records in all), every copy is replaced by `streammargin.mixing.mix` of all
  copies, each weighted by the records it learnt since the last mix (federated averaging's
  weights: a copy that learnt nothing adds nothing);
- `delta N`: delta averaging at the same moments: the last mix plus every copy's change since it,
  in full (`mix(copies, [1] * P, base=last)`): every copy's updates are kept, as one model making
  them all would;
- `dynamic D`: dynamic averaging (Kamp et al. 2014): at the moments of `ipm 50`, the mix happens
  only when some copy has moved away from the last mix by more than D (the mean squared
  difference of their P(True) on the last 64 records): quiet periods exchange nothing.

The scaler's statistics are pooled exactly at every mix (parallel Welford, with the last mix as
the base: counts, means and squared deviations of all the records).

Costs, per scheme: the model-exchange bytes (each partition writes its state,
`streammargin.state.dumps` of the scaler's and the model's `to_state()`, once per mix: P states a
mix; every task then reads them, or a coordinator reads them and writes one mix back) over the
input's bytes (each record as the worker's JSON, `{"id": i, "x": {...}, "y": label}`), and the
time spent mixing (the mix, the copies, the divergence checks) over the whole run.

Run: .venv/bin/python benchmarks/partition_learning.py [--quick] [--records N]
     [--partitions 12 32] [--batch 500] [--streams ...] [--models ...] [--schemes ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time

import numpy as np

from kafka.partitioner.default import murmur2
from river import compose, datasets
from river.datasets import synth

import streammargin
from streammargin import state
from streammargin.mixing import mix

PROBE = 64  # records the dynamic scheme measures the divergence on


def streams(n: int) -> dict[str, tuple[list, bool]]:
    """name -> (records, drifting): the streams of `benchmarks/model_selection.py`."""
    half = n // 2
    made = {
        "Hyperplane 20": (synth.Hyperplane(
            seed=42, n_features=20, n_drift_features=10, mag_change=0.001
        ).take(n), True),
        "RBF drift": (synth.RandomRBFDrift(
            seed_model=7, seed_sample=7, n_classes=2, n_features=10, n_centroids=50,
            change_speed=0.001,
        ).take(n), True),
        "SEA drift": (synth.ConceptDriftStream(
            synth.SEA(variant=0, seed=1), synth.SEA(variant=2, seed=2), position=half,
            width=n // 10, seed=1,
        ).take(n), True),
        "SEA": (synth.SEA(variant=0, seed=1).take(n), False),
        "Agrawal 2": (synth.Agrawal(classification_function=2, seed=42).take(n), False),
        "Phishing": (datasets.Phishing(), False),
    }
    return {name: (list(rows), drifting) for name, (rows, drifting) in made.items()}


MODELS = {
    "ALMA": lambda: streammargin.ALMAClassifier(),
    "BudgetSVM": lambda: streammargin.BudgetSVMClassifier(),
    "Auto": lambda: streammargin.AutoClassifier(),
    "CPM": lambda: streammargin.ConvexPolytopeClassifier(),
    "MPU": lambda: streammargin.MPUClassifier(),
}


def pipeline(name: str):
    return compose.Pipeline(streammargin.StandardScaler(), MODELS[name]())


def state_bytes(model) -> int:
    """The bytes of a pipeline's safe state: what a partition writes to the model topic."""
    steps = list(model.steps.values())
    return len(state.dumps({"scaler": steps[0].to_state(), "model": steps[1].to_state()}))


def _trimmed(array) -> "np.ndarray":
    """`array` without its trailing zero rows (and columns): the capacity learning reserves."""
    while array.ndim and array.shape[0] and not array[-1].any():
        array = array[:-1]
    if array.ndim == 2:
        while array.shape[1] and not array[:, -1].any():
            array = array[:, :-1]
    return array


def _compact(node, base, key: str = "") -> int:
    """Bytes of a delta-encoded exchange record for one state tree against the last mix's:
    arrays without their unused capacity, the example rows (support vectors, replay windows)
    the base does not hold, the feature names it does not know, 8 bytes a number; params and
    class names not counted (the receiver knows them)."""
    if key in ("params", "model", "classifier", "scaler", "max_features"):
        return 0
    if isinstance(node, np.ndarray):
        array = _trimmed(node)
        if key in ("_support", "_window") and isinstance(base, np.ndarray) and array.ndim == 2:
            known = {_trimmed(row).tobytes() for row in base}
            new = sum(_trimmed(row).tobytes() not in known for row in array)
            return 8 * new * array.shape[1]
        return array.nbytes
    if isinstance(node, dict):
        if key in ("features",) or "names" in node and not isinstance(node["names"], np.ndarray):
            known = set(map(json.dumps, base["names"])) if isinstance(base, dict) else set()
            names = sum(len(json.dumps(n)) for n in node["names"] if json.dumps(n) not in known)
            rest = {k: v for k, v in node.items() if k != "names"}
            other = ({k: v for k, v in base.items() if k != "names"}
                     if isinstance(base, dict) else {})
            return names + sum(_compact(v, other.get(k), k) for k, v in rest.items())
        other = base if isinstance(base, dict) else {}
        return sum(_compact(v, other.get(k), k) for k, v in node.items())
    if isinstance(node, list):
        other = base if isinstance(base, list) and len(base) == len(node) else [None] * len(node)
        return sum(_compact(v, b, key) for v, b in zip(node, other))
    return 0 if node is None else 8


def compact_bytes(model, base) -> int:
    """`_compact` of a pipeline against the last mix, plus 64 bytes of header."""
    steps, last = list(model.steps.values()), list(base.steps.values())
    return 64 + sum(_compact(m.to_state(), b.to_state()) for m, b in zip(steps, last))


def copy(model):
    steps = list(model.steps.values())
    return compose.Pipeline(
        streammargin.StandardScaler.from_state(steps[0].to_state()),
        type(steps[1]).from_state(steps[1].to_state()),
    )


def partitions_of(n: int, P: int) -> list[list[int]]:
    """The records' indices per partition, by Kafka's default partitioner on the key str(i)."""
    parts: list[list[int]] = [[] for _ in range(P)]
    for i in range(n):
        parts[(murmur2(str(i).encode()) & 0x7FFFFFFF) % P].append(i)
    return parts


def worker_order(parts: list[list[int]], batch: int) -> list[tuple[int, int]]:
    """(partition, record) in the order a worker takes them: polls of up to `batch` records
    (kafka-python's max_poll_records), each taking up to batch / P records of every partition
    in turn, round robin. (A poll of `batch` records from each partition would put the
    partitions' records batch x P records of the stream apart: the whole of a 20,000-record
    stream at 32 partitions, a backlog rather than a live stream.)"""
    queues = [collections.deque(part) for part in parts]
    share = max(1, batch // len(parts))
    order = []
    while any(queues):
        for p, queue in enumerate(queues):
            for _ in range(min(share, len(queue))):
                order.append((p, queue.popleft()))
    return order


def divergence(model, reference, probe) -> float:
    """Mean squared difference of P(True) between two pipelines on the probe records."""
    total = 0.0
    for x in probe:
        a = model.predict_proba_one(x)
        b = reference.predict_proba_one(x)
        total += sum((a.get(k, 0.0) - b.get(k, 0.0)) ** 2 for k in set(a) | set(b))
    return total / max(len(probe), 1)


def run(rows: list, model_name: str, P: int, scheme: str, period: int, batch: int,
        threshold: float = 0.0, ramp: bool = True) -> dict:
    """Progressive accuracy of one scope/scheme; exchanged bytes and mixing seconds."""
    copies = [pipeline(model_name) for _ in range(P)]
    last = pipeline(model_name)  # the last mix (fresh: nothing learnt yet)
    since = [0] * P
    order = worker_order(partitions_of(len(rows), P), batch) if P > 1 else [
        (0, i) for i in range(len(rows))
    ]
    correct = 0
    mixing = 0.0
    exchanged = 0
    compact = 0
    mixes = 0
    recent: collections.deque = collections.deque(maxlen=PROBE)
    start = time.perf_counter()
    for p, i in order:
        x, y = rows[i]
        model = copies[p]
        correct += model.predict_one(x) == y
        model.learn_one(x, y)
        since[p] += 1
        recent.append(x)
        # With `ramp`, the first mixes come after 1, 2, 4, ... records a partition, up to the
        # period: the copies of a young model are far apart soonest.
        due = min(period, 2**mixes) if ramp else period
        if scheme == "partition" or sum(since) < due * P:
            continue
        t0 = time.perf_counter()
        if scheme == "dynamic":
            moved = [q for q in range(P) if since[q]]
            if max(divergence(copies[q], last, list(recent)) for q in moved) <= threshold:
                since = [0] * P
                mixing += time.perf_counter() - t0
                continue
        exchanged += sum(state_bytes(copies[q]) for q in range(P) if since[q])
        t1 = time.perf_counter()  # (the compact encoding's estimate is not counted as mixing)
        compact += sum(compact_bytes(copies[q], last) for q in range(P) if since[q])
        t0 += time.perf_counter() - t1
        if scheme == "delta":
            merged = mix(copies, [1.0] * P, base=last)
        else:  # ipm, dynamic: weighted by the records learnt since the last mix
            total = sum(since)
            merged = mix(copies, [s / total for s in since], base=last)
        copies = [copy(merged) for _ in range(P)]
        last = merged
        since = [0] * P
        mixes += 1
        mixing += time.perf_counter() - t0
    total = time.perf_counter() - start
    return {
        "accuracy": correct / len(rows),
        "bytes": exchanged,
        "compact": compact,
        "mixes": mixes,
        "mix_share": mixing / total if total > 0 else 0.0,
        "seconds": total,
    }


def input_bytes(rows: list) -> int:
    return sum(
        len(json.dumps({"id": i, "x": {str(k): v for k, v in x.items()}, "y": y}))
        for i, (x, y) in enumerate(rows)
    )


def schemes(names: list[str]) -> list[tuple[str, str, int, float]]:
    """(label, scheme, period, threshold) for the scheme names asked for."""
    out = []
    for name in names:
        if name == "partition":
            out.append(("partition", "partition", 0, 0.0))
        elif name in ("ipm", "delta"):
            out.extend((f"{name} {n}", name, n, 0.0) for n in (50, 200, 1000))
        elif name == "dynamic":
            out.extend((f"dynamic {d:g}", "dynamic", 50, d) for d in (0.02, 0.1))
        else:
            raise SystemExit(f"unknown scheme {name!r}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, nargs="+", default=[12, 32])
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="10,000 records")
    parser.add_argument("--streams", nargs="+", default=None)
    parser.add_argument("--models", nargs="+", default=["ALMA", "BudgetSVM", "Auto"])
    parser.add_argument("--schemes", nargs="+", default=["partition", "ipm", "delta", "dynamic"])
    args = parser.parse_args(argv)
    n = 10_000 if args.quick else args.records
    data = streams(n)
    chosen = args.streams or list(data)
    plan = schemes(args.schemes)
    Ps = args.partitions
    print(f"progressive accuracy, StandardScaler | model, {n:,} records a stream (Phishing: its "
          f"1,250), keyed partitions, polls of {args.batch} records")
    print("per P: accuracy, gap to one model (points), model-exchange bytes / input bytes "
          "(full states %, delta-encoded estimate %), mixing time / run time %")
    head = (f"{'stream':<14}{'model':<10}{'scope':<15}{'P=1':>6}"
            + "".join(f"{f'P={P}':>8}{'gap':>6}{'full%':>7}{'delta%':>7}{'time%':>6}" for P in Ps))
    print(head)
    gaps: dict = collections.defaultdict(list)  # (scope label, P) -> gaps in points
    ratios: dict = collections.defaultdict(list)
    compacts: dict = collections.defaultdict(list)
    shares: dict = collections.defaultdict(list)
    for stream_name in chosen:
        rows, drifting = data[stream_name]
        size = input_bytes(rows)
        for model_name in args.models:
            one = run(rows, model_name, 1, "partition", 0, args.batch)["accuracy"]
            for label, scheme, period, threshold in plan:
                cells = []
                for P in Ps:
                    result = run(rows, model_name, P, scheme, period, args.batch, threshold)
                    gap = 100 * (result["accuracy"] - one)
                    gaps[label, P].append(gap)
                    ratios[label, P].append(result["bytes"] / size)
                    compacts[label, P].append(result["compact"] / size)
                    shares[label, P].append(result["mix_share"])
                    cells.append(f"{result['accuracy']:>8.3f}{gap:>+6.1f}"
                                 f"{100 * result['bytes'] / size:>7.1f}"
                                 f"{100 * result['compact'] / size:>7.1f}"
                                 f"{100 * result['mix_share']:>6.0f}")
                print(f"{stream_name:<14}{model_name:<10}{label:<15}{one:>6.3f}" + "".join(cells),
                      flush=True)
    print()
    print("summary over the streams and models: gap to one model in points (mean, worst), "
          "bytes % (full, delta-encoded: mean), mixing time % (mean)")
    print(f"{'scope':<15}" + "".join(
        f"{f'P={P} mean':>11}{'worst':>7}{'full%':>7}{'delta%':>7}{'time%':>6}" for P in Ps))
    for label, _, _, _ in plan:
        line = f"{label:<15}"
        for P in Ps:
            g = gaps[label, P]
            line += (f"{statistics.fmean(g):>+11.2f}{min(g):>+7.1f}"
                     f"{100 * statistics.fmean(ratios[label, P]):>7.1f}"
                     f"{100 * statistics.fmean(compacts[label, P]):>7.1f}"
                     f"{100 * statistics.fmean(shares[label, P]):>6.0f}")
        print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
