"""What to do with feature names beyond a model's bound: the alternatives, on accuracy.

Every model keeps at most `max_features` feature columns (`streammargin.features`). This compares,
by progressive accuracy (predict, then learn, every record), what a model can do with the names
that come once the columns are taken:

- unbounded: no bound (2**20 columns here): the reference, with memory that grows for ever;
- hash 1/8 (the package's behaviour): the first 7/8 of the columns go to the first names, later
  names share the last 1/8 by a CRC-32 of the name; also 1/16, 1/4 and 1/2 hashed for the ALMA
  and kernel families (the choice of the fraction), and 1/8 with a sign hash (a second hash bit
  flips the value's sign, Weinberger et al. 2009: colliding names cancel instead of adding up);
- ignore: the first `max_features` names keep a column, later names are dropped from every record;
- refuse: a record that brings a name beyond the bound is not learnt (a dead letter), though it is
  still predicted; the table gives the share of records learnt;
- LRU (ALMA only): `max_features` slots held by the most recently seen names; a new name evicts
  the least recently seen one, whose weight (and averaged weight) is reset to zero.

Streams (N records each, generated with fixed seeds):
1. hyperplane + ID: River's Hyperplane (10 features, 5% label noise) plus one ID-like name per
   record that is never seen again (a request id put among the features); bound 256.
2. zipf text: 20 words a record drawn from a Zipf(1.1) vocabulary of 5,000 words, counts as
   values; the label is the sign of a random linear function of the counts (5% noise); bound
   1,024 (the frequent words are the early ones).
3. schema change: a Hyperplane over 10 features of which only five, "a*", are sent in the first
   half, plus an ID per record; at N/2 the other five, "b*", start to come; bound 256, long full
   of IDs when the "b*" appear. Accuracy over the second half.
The model families: ALMAClassifier, KernelALMAClassifier (RBF, gamma 0.5, budget 200) and the
ConvexPolytopeClassifier, each with its defaults otherwise.

Run: .venv/bin/python benchmarks/feature_bound_accuracy.py [--records 20000] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import time
import typing
import zlib

import numpy as np
from river.datasets import synth

import streammargin
from streammargin import features as features_module
from streammargin.jit import alma as alma_jit

UNBOUNDED = 2**20


# Streams ------------------------------------------------------------------------------------------


def hyperplane_with_ids(n: int, seed: int = 1) -> list[tuple[dict, bool]]:
    data = []
    generator = synth.Hyperplane(seed=seed, n_features=10, noise_percentage=0.05)
    for i, (x, y) in enumerate(generator.take(n)):
        row = {f"h{k}": v - 0.5 for k, v in x.items()}
        row[f"id-{i:08d}"] = 1.0
        data.append((row, bool(y)))
    return data


def zipf_text(
    n: int, seed: int = 2, vocabulary: int = 5000, words: int = 20
) -> list[tuple[dict, bool]]:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocabulary + 1)
    p = ranks**-1.1
    p /= p.sum()
    w = rng.normal(size=vocabulary)
    data = []
    for _ in range(n):
        counts = collections.Counter(rng.choice(vocabulary, size=words, p=p).tolist())
        x = {f"w{k}": float(c) for k, c in counts.items()}
        score = sum(w[k] * c for k, c in counts.items())
        y = score > 0
        if rng.random() < 0.05:
            y = not y
        data.append((x, bool(y)))
    return data


def schema_change(n: int, seed: int = 3) -> list[tuple[dict, bool]]:
    data = []
    generator = synth.Hyperplane(seed=seed, n_features=10, noise_percentage=0.05)
    for i, (x, y) in enumerate(generator.take(n)):
        # one concept over ten features, of which the last five are only sent from mid-stream
        row = {f"a{k}": x[k] - 0.5 for k in range(5)}
        if i >= n // 2:
            row.update({f"b{k}": x[5 + k] - 0.5 for k in range(5)})
        row[f"id-{i:08d}"] = 1.0  # one name per record, never seen again
        data.append((row, bool(y)))
    return data


STREAMS = {
    "hyperplane + ID": (hyperplane_with_ids, 256),
    "zipf text": (zipf_text, 1024),
    "schema change": (schema_change, 256),
}


# Policies -----------------------------------------------------------------------------------------


class Policy:
    """predict_one/learn_one around a model, with a rule for names beyond the bound."""

    learnt = 0
    seen = 0

    def __init__(self, model):
        self.model = model

    def predict_one(self, x: dict) -> typing.Any:
        return self.model.predict_one(x)

    def learn_one(self, x: dict, y: typing.Any) -> None:
        self.seen += 1
        self.learnt += 1
        self.model.learn_one(x, y)


class Ignore(Policy):
    """The first `bound` names keep a column; later names are dropped from every record."""

    def __init__(self, model, bound: int):
        super().__init__(model)
        self.bound = bound
        self.kept: set = set()

    def _keep(self, x: dict) -> dict:
        return {k: v for k, v in x.items() if k in self.kept}

    def predict_one(self, x):
        return self.model.predict_one(self._keep(x))

    def learn_one(self, x, y):
        for name in x:
            if len(self.kept) >= self.bound:
                break
            self.kept.add(name)
        self.seen += 1
        self.learnt += 1
        self.model.learn_one(self._keep(x), y)


class Refuse(Policy):
    """A record with a name beyond the bound is not learnt (the dead-letter policy)."""

    def __init__(self, model, bound: int):
        super().__init__(model)
        self.bound = bound
        self.kept: set = set()

    def learn_one(self, x, y):
        self.seen += 1
        new = [name for name in x if name not in self.kept]
        if len(self.kept) + len(new) > self.bound:
            return
        self.kept.update(new)
        self.learnt += 1
        self.model.learn_one(x, y)


class LeastRecentlySeen(Policy):
    """`bound` slots held by the most recently seen names (a reused slot's ALMA column is reset)."""

    def __init__(self, model: streammargin.ALMAClassifier, bound: int):
        super().__init__(model)
        self.bound = bound
        self.slots: collections.OrderedDict = collections.OrderedDict()  # name -> slot

    def _mapped(self, x: dict) -> dict:
        return {self.slots[k]: v for k, v in x.items() if k in self.slots}

    def predict_one(self, x):
        return self.model.predict_one(self._mapped(x))

    def learn_one(self, x, y):
        for name in x:
            if name in self.slots:
                self.slots.move_to_end(name)
            elif len(self.slots) < self.bound:
                self.slots[name] = len(self.slots)
            else:
                _, slot = self.slots.popitem(last=False)
                self._reset_column(slot)
                self.slots[name] = slot
        self.seen += 1
        self.learnt += 1
        self.model.learn_one(self._mapped(x), y)

    def _reset_column(self, slot: int) -> None:
        model = self.model
        column = model._features.index.get(slot)
        if column is None:
            return
        model._flush()
        table, st = model._vectors, model._st
        u = table[column, alma_jit.U]
        st[alma_jit.SUM_P] = max(0.0, st[alma_jit.SUM_P] - abs(u) ** st[alma_jit.P])
        table[column, alma_jit.U] = 0.0
        table[column, alma_jit.ACC] = 0.0
        table[column, alma_jit.MARK] = st[alma_jit.FACTOR_SUM]
        model._features._forget_cache()


class SignedSpace(features_module.FeatureSpace):
    """The package's space with a sign hash on hashed names (bit 31 of the CRC flips the value)."""

    def _merged(self, keys, cols, floats):
        start = self.hashed_start
        signed = [
            -v if c >= start and zlib.crc32(features_module.name_json(k).encode()) & 2**31 else v
            for k, c, v in zip(keys, cols, floats)
        ]
        return super()._merged(keys, cols, signed)


def with_hashed_fraction(fraction: int | None, signed: bool = False):
    """Context: the package's FeatureSpace with n_hashed = max_features // fraction (and signs)."""

    class Patch:
        def __enter__(self):
            self.saved = features_module.hashed_columns
            if fraction is not None:
                features_module.hashed_columns = lambda m: max(1, m // fraction)
            return self

        def __exit__(self, *exc):
            features_module.hashed_columns = self.saved

    return Patch()


FAMILIES = {
    "ALMA": lambda m: streammargin.ALMAClassifier(max_features=m),
    "kernel ALMA": lambda m: streammargin.KernelALMAClassifier(gamma=0.5, max_features=m),
    "CPM": lambda m: streammargin.ConvexPolytopeClassifier(max_features=m),
}


def policies(family: str, bound: int) -> dict[str, typing.Callable[[], Policy]]:
    make = FAMILIES[family]

    def hashed(fraction, signed=False):
        def build():
            with with_hashed_fraction(fraction):
                model = make(bound)
            if signed:
                space = SignedSpace(model._features.first_column, bound)
                model._features = space
            return Policy(model)

        return build

    out = {"unbounded": lambda: Policy(make(UNBOUNDED)), "hash 1/8 (default)": hashed(None)}
    if family != "CPM":
        out.update({"hash 1/16": hashed(16), "hash 1/4": hashed(4), "hash 1/2": hashed(2)})
        out["hash 1/8 signed"] = hashed(None, signed=True)
    out["ignore"] = lambda: Ignore(make(UNBOUNDED), bound)
    out["refuse"] = lambda: Refuse(make(UNBOUNDED), bound)
    if family == "ALMA":
        out["LRU eviction"] = lambda: LeastRecentlySeen(make(UNBOUNDED), bound)
    return out


def progressive(policy: Policy, data, second_half: bool) -> tuple[float, float]:
    """Accuracy over all records (or the second half's) and the share of records learnt."""
    correct = counted = 0
    half = len(data) // 2
    for i, (x, y) in enumerate(data):
        if not second_half or i >= half:
            counted += 1
            correct += policy.predict_one(x) == y
        else:
            policy.predict_one(x)
        policy.learn_one(x, y)
    return correct / counted, policy.learnt / max(policy.seen, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="5,000 records a stream")
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    args = parser.parse_args()
    n = 5000 if args.quick else args.records
    print(f"Progressive accuracy, {n:,} records a stream (schema change: the second half).")
    print("In brackets: the share of records learnt, where the policy refuses some.\n")
    for family in args.families:
        results: dict[str, dict[str, str]] = collections.defaultdict(dict)
        names: list[str] = []
        for stream_name, (generate, bound) in STREAMS.items():
            data = generate(n)
            for policy_name, build in policies(family, bound).items():
                if policy_name not in names:
                    names.append(policy_name)
                start = time.perf_counter()
                accuracy, learnt = progressive(build(), data, stream_name == "schema change")
                cell = f"{accuracy:.3f}" + (f" [{learnt:.0%}]" if learnt < 0.999 else "")
                results[policy_name][stream_name] = cell
                print(
                    f"  {family} / {stream_name} / {policy_name}: {cell} "
                    f"({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
        header = f"{family} (bound)".ljust(22) + "".join(
            f"{name} ({bound})".rjust(24) for name, (_, bound) in STREAMS.items()
        )
        print(f"\n{header}\n{'-' * len(header)}")
        for policy_name in names:
            row = results[policy_name]
            print(policy_name.ljust(22) + "".join(row.get(s, "-").rjust(24) for s in STREAMS))
        print()


if __name__ == "__main__":
    main()
