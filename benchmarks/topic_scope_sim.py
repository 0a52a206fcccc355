"""`--model-scope topic` without a broker, at the worker's granularity (issue 25): what the order
a worker learns its partitions' records in, and the exchange period, cost in accuracy.

Twelve partitions (Kafka's default partitioner on the record's index as key), three workers of
four partitions each. A worker's partitions share one `StandardScaler() | model` (the scaler is
the worker's own, as in the worker: scalers are not exchanged). The workers advance in lockstep:
the j-th record a worker learns comes at the same time as every other worker's j-th. Each record
is predicted, then learnt: progressive accuracy over all records, against one model learning the
stream in order. Settings (several per run):

- `runs R`: a worker takes its partitions' records in runs of R records of one partition, in
  turn. A poll without `model_scope.in_time_order` gives runs of what one fetch holds (64 KiB
  in topic scope: some 260 of these records); `in_time_order` gives runs of `MIN_RUN` (32)
  when the partitions' records were written together;
- `mix N`: every N records a worker, the three models are replaced by `streammargin.mixing.mix`
  of them, each weighted by the records it learnt since the last mix and without a base, as the
  worker mixes (here synchronously: the best case of the worker's exchange, which has no
  barrier);
- `delta N`: at the same moments, delta averaging: the last mix plus every worker's change since
  it, in full (`mix(models, [1] * 3, base=last)`; the first mix is `mix`'s). All three start
  each period from one model, which the worker's exchange, without a barrier, cannot give: its
  peers' models come from mixes of their own. On the drifting linear streams it follows one model
  where parameter mixing lags: 36,000 records, ALMA, the hyperplane -2.0 points mixing every
  2,000 records a worker and -1.7 every 200, against -0.4 and -0.0 for delta averaging; the
  hyperplane, RBF drift and SEA drift every 200: mean -0.9, worst -1.7, against -0.2 and -0.6
  (`--records 36000 --models ALMA --settings "runs 32 mix 200" "runs 32 delta 200"`);
- `async-mix N` and `async-delta N`: no barrier, as in the worker. Worker k exchanges every N
  records of its own, a third of a period after worker k - 1, and sees the peers' records of
  their last exchanges. `async-mix` is `--model-exchange mix`: it publishes its model and mixes
  in the peers' new ones, weighted by the records each learnt since its previous record.
  `async-delta` is `--model-exchange delta`, the worker's `streammargin.delta.DeltaLedger`: each
  worker publishes its cumulative contribution (what its model holds beyond what it took from
  its peers) and adds a peer's new contribution minus the one it added before. 36,000 records,
  ALMA on the hyperplane, RBF drift and SEA drift, every 200 records: mean -1.0 points, worst
  -1.9 (the hyperplane) for `async-mix`, against -0.3 and -0.7 for `async-delta`; every 500,
  -1.1 / -2.1 against -0.5 / -1.0; every 2,000 -1.0 / -1.6 for `async-delta` (staleness: the
  peers' corrections come late whatever the scheme)
  (`--records 36000 --models ALMA --settings "runs 32 async-mix 200" "runs 32 async-delta 200"`);
- `share S` (kernel models with a cache, the budget SVM): every S records a worker, the peers
  learn the records that entered its cache since (through their own scaler), the route of
  exchanging support vectors instead of models. `peer/input` is how many records each worker
  learnt from its peers per record of its own: the price of the route. `bytes%` is the least
  this route would write to a model topic, over the input's bytes: each shared record once, as
  a support vector of float32 features plus 12 bytes (its coefficient and its label), against
  the records as JSON (`partition_learning.input_bytes`).

Run: .venv/bin/python benchmarks/topic_scope_sim.py [--records 12000] [--streams ...]
     [--models ...] [--settings "runs 260 mix 2000" "runs 32 delta 2000" ...]
     [--worker-budget B]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import statistics
import sys
import time

from river import compose

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import partition_learning  # (this folder: the script's own)

import streammargin
from streammargin.alma import ALMAClassifier
from streammargin.delta import DeltaLedger
from streammargin.jit import budget_svm as svm_jit
from streammargin.mixing import mix

PARTITIONS = 12
WORKERS = 3
ROUTES = ("mix", "delta", "async-mix", "async-delta", "share")
DEFAULT_SETTINGS = ("runs 260 mix 2000", "runs 32 mix 2000", "runs 1 mix 2000",
                    "runs 32 mix 200", "runs 32 share 200", "runs 32 share 50")


def parse(setting: str) -> tuple[int, str, int]:
    words = setting.split()
    if len(words) != 4 or words[0] != "runs" or words[2] not in ROUTES:
        raise SystemExit(f"a setting is 'runs R <{'|'.join(ROUTES)}> N', not {setting!r}")
    return int(words[1]), words[2], int(words[3])


def worker_orders(n: int, run: int) -> list[list[int]]:
    """Each worker's records, in runs of `run` records of one partition at a time."""
    parts = partition_learning.partitions_of(n, PARTITIONS)
    per_worker = PARTITIONS // WORKERS
    orders = []
    for k in range(WORKERS):
        queues = [collections.deque(parts[p]) for p in range(k * per_worker, (k + 1) * per_worker)]
        order: list[int] = []
        while any(queues):
            for queue in queues:
                for _ in range(min(run, len(queue))):
                    order.append(queue.popleft())
        orders.append(order)
    return orders


def cache_entries(model) -> float:
    """The records that entered a budget SVM's cache so far (its ADDED counter)."""
    return float(model._st[svm_jit.ADDED])


class Published:
    """The three workers' latest model-topic records (`async-mix`, `async-delta`) and what each
    worker took of each peer's. `async-delta` runs the worker's ledger
    (`streammargin.delta.DeltaLedger`)."""

    def __init__(self, fresh):
        self.fresh = fresh
        self.records: list = [None] * WORKERS  # worker -> (serial, weight, model) or C's record
        self.taken = [[None] * WORKERS for _ in range(WORKERS)]  # [k][q]: serial
        self.ledgers = [DeltaLedger(fresh, max_streams=WORKERS, stream=k + 1)
                        for k in range(WORKERS)] if isinstance(fresh, ALMAClassifier) else None

    def exchange(self, k: int, model, since: int, delta: bool):
        """Worker k's exchange: its record published, then its peers' new ones taken in."""
        if delta:
            ledger = self.ledgers[k]
            self.records[k] = ledger.publish(model)
            ledger.take_in(model, [r for q, r in enumerate(self.records)
                                   if q != k and r is not None])
            return model
        serial = (self.records[k] or (0,))[0] + 1
        self.records[k] = (serial, since, _copy(model))
        new = [(q, record) for q, record in enumerate(self.records)
               if q != k and record is not None and self.taken[k][q] != record[0]]
        if new:
            model = mix([model, *[record[2] for _, record in new]],
                        [max(since, 1), *[record[1] for _, record in new]])
            for q, record in new:
                self.taken[k][q] = record[0]
        return model


def _copy(model):
    return type(model).from_state(model.to_state())


def worker_pipeline(model_name: str, budget: int | None):
    """A worker's `StandardScaler() | model`; `budget` (`--worker-budget`) sets a budget SVM's."""
    if budget is not None and model_name == "BudgetSVM":
        return compose.Pipeline(streammargin.StandardScaler(),
                                streammargin.BudgetSVMClassifier(budget=budget))
    return partition_learning.pipeline(model_name)


def simulate(rows: list, model_name: str, run: int, route: str, period: int,
             budget: int | None = None) -> dict:
    orders = worker_orders(len(rows), run)
    pipes = [worker_pipeline(model_name, budget) for _ in range(WORKERS)]
    since = [0] * WORKERS
    outbox: list[list] = [[] for _ in range(WORKERS)]
    last = None  # the last mix (delta averaging's base)
    published = Published(list(pipes[0].steps.values())[1].clone())
    correct = learnt_from_peers = shared_bytes = 0
    steps = max(len(order) for order in orders)
    for j in range(steps):
        for k in range(WORKERS):
            if j >= len(orders[k]):
                continue
            x, y = rows[orders[k][j]]
            pipe = pipes[k]
            correct += pipe.predict_one(x) == y
            if route == "share":
                model = list(pipe.steps.values())[1]
                before = cache_entries(model)
                pipe.learn_one(x, y)
                if cache_entries(model) != before:
                    outbox[k].append((x, y))
                    shared_bytes += shared_vector_bytes(len(x))
            else:
                pipe.learn_one(x, y)
            since[k] += 1
            if route.startswith("async-"):
                # (worker k a third of a period after worker k - 1: no barrier)
                learnt = j + 1
                if (learnt + k * period // WORKERS) % period:
                    continue
                scaler, model = pipes[k].steps.values()
                model = published.exchange(k, model, since[k], route == "async-delta")
                pipes[k] = compose.Pipeline(scaler, model)
                since[k] = 0
                continue
            if since[k] % period:
                continue
            if route == "share":
                for peer in range(WORKERS):
                    if peer != k:
                        scaler, model = pipes[peer].steps.values()
                        for xs, ys in outbox[k]:
                            model.learn_one(scaler.transform_one(xs), ys)
                        learnt_from_peers += len(outbox[k])
                outbox[k] = []
            elif k == WORKERS - 1:  # the three mix once all have learnt `period` more
                total = sum(since)
                steps = [list(p.steps.values()) for p in pipes]
                models = [model for _, model in steps]
                if route == "delta" and last is not None:
                    merged = mix(models, [1.0] * WORKERS, base=last)
                else:
                    merged = mix(models, [s / total for s in since])
                last = merged
                pipes = [compose.Pipeline(scaler, type(merged).from_state(merged.to_state()))
                         for scaler, _ in steps]
                since = [0] * WORKERS
    return {"accuracy": correct / len(rows), "peer": learnt_from_peers / len(rows),
            "bytes": shared_bytes}


def shared_vector_bytes(features: int) -> int:
    """The least a shared support vector takes: float32 features, a float64 coefficient, a
    label and an age in 4 bytes."""
    return 4 * features + 12



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=12_000)
    parser.add_argument("--streams", nargs="+", default=["RBF drift", "Hyperplane 20",
                                                          "SEA drift"])
    parser.add_argument("--models", nargs="+", default=["ALMA", "BudgetSVM", "Auto"])
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS))
    parser.add_argument("--worker-budget", type=int, default=None,
                        help="the workers' budget SVMs keep this many support vectors (one model"
                        " keeps the default): a third of it holds the same span of the stream")
    args = parser.parse_args()
    settings = [(s, *parse(s)) for s in args.settings]
    made = partition_learning.streams(args.records)
    print(f"{args.records:,} records a stream, {PARTITIONS} partitions over {WORKERS} workers "
          "(lockstep), StandardScaler | model; gap: points of progressive accuracy to one model; "
          "peer/input: records learnt from peers per input record; bytes%: the least a share "
          "writes, over the input's bytes"
          + (f"; the workers' budget SVMs keep {args.worker_budget}" if args.worker_budget
             else ""))
    print(f"{'stream':14} {'model':10} {'one':>6}  {'setting':24} {'accuracy':>8} {'gap':>6} "
          f"{'peer/input':>10} {'bytes%':>6} {'s':>5}")
    gaps: dict[str, list[float]] = {}
    for stream in args.streams:
        rows = made[stream][0]
        size = partition_learning.input_bytes(rows)
        for model_name in args.models:
            one = partition_learning.run(rows, model_name, 1, "partition", 0, 500)["accuracy"]
            for label, run, route, period in settings:
                if route == "share" and model_name != "BudgetSVM":
                    continue
                started = time.perf_counter()
                found = simulate(rows, model_name, run, route, period, args.worker_budget)
                gap = 100 * (found["accuracy"] - one)
                gaps.setdefault(label, []).append(gap)
                print(f"{stream:14} {model_name:10} {one:6.3f}  {label:24} "
                      f"{found['accuracy']:8.3f} {gap:+6.1f} {found['peer']:10.2f} "
                      f"{100 * found['bytes'] / size:6.1f} "
                      f"{time.perf_counter() - started:5.0f}", flush=True)
    for label, values in gaps.items():
        print(f"{label}: mean gap {statistics.mean(values):+.1f} points, worst {min(values):+.1f}")


if __name__ == "__main__":
    main()
