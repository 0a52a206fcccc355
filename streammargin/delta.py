"""Asynchronous delta averaging of ALMA: copies of one model that keep every copy's corrections,
without a barrier (issue 25, `--model-scope topic --model-exchange delta`).

Parameter mixing (`streammargin.mixing.mix` without a base) replaces each copy by the mean of the
copies: a worker's correction reaches the mixed model at a P-th of its size, so the mixed model
lags a drift. Delta averaging adds every copy's change in full, as if one model had made them all
(`mix(..., base=last)`), but its copies must all start each period from one model: a barrier,
which workers exchanging through a compacted topic do not have.

Without the barrier, each worker keeps a ledger (`DeltaLedger`) and publishes its *cumulative
contribution* C: its own learning since the ledger began, and nothing it took from its peers.
At each step of the ledger (publishing, or taking the peers' contributions in) the worker's own
learning since the previous step goes into C:

    C = C + (model - B),    then B = the model after the step

B is the model after the ledger's last step: a fresh model's at first (all a fresh worker learns
is its own), or the restored model (a checkpoint holds the peers' contributions up to it; the
ledger *adopts* the first contributions it then reads, not adding them again). A model merged in
(a task taken over in a rebalance) moves B with it: it is not the worker's learning. A peer adds
C - A, A the contribution of that worker it added last (`DeltaLedger.take_in`; none yet: a fresh
model's). C is cumulative, so the latest record of each worker is all a peer needs: what a
compacted topic keeps.

ALMA's correction is additive in its dual vector theta (`streammargin.mixing`), so its hypothesis
read as quantities that add up (`ALMAParts`: theta, the decayed sum of its averaged weights with
that sum's weight D, its counters) is what is added and subtracted, feature by feature name.
The sum is then set into the model as a mix sets it (`mixing._alma_arrays`: theta into the unit
p-ball, the average kept in [-1, 1]); C too is kept as a model is, so that what a peer adds is a
model's. The calibration is the mean of the model's and the added contributions'. A worker's
contribution is published as an ALMA model state, so a peer checks it as it checks a
checkpoint's model.

Why not `mix(..., base=...)`: a mix copies and checks every model it is given (1.1-1.7 ms for an
ALMA of 20 features, most of it River's `_get_params` and `from_state`'s checks), and a worker
exchanging every 200 records would run three per exchange. The ledger works on arrays and sets
the model in place: a whole exchange of ALMA, its contribution encoded and two peers' added,
costs the main thread 0.7-1.1 ms (benchmarks/topic_scope_sim.py's `async-delta` runs the ledger
too).

Streams. A worker's contributions form a *stream*, named by a random 63-bit id (a restarted
worker starts a new one: its checkpoint's model counts as taken) and numbered by `serial`, which
grows. A peer keeps A per stream, not per key: a worker's key is the lowest partition it owns,
which a rebalance changes. A stream may then be read under two keys (its old key's last record,
until the partition's new owner writes there); the higher serial is the latest. The ledger holds
at most `max_streams` peers' A (the topic's partitions: one per live worker at most), forgetting
the stream seen longest ago (a worker that died: its contribution stays in the models).

Measured (`benchmarks/topic_scope_sim.py --records 36000 --models ALMA`, three workers, 12
partitions, the hyperplane, RBF drift and SEA drift, every 200 records a worker): see
docs/kafka.md for the figures against parameter mixing.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import typing

import numpy as np

from streammargin.alma import ALMAClassifier
from streammargin.features import FeatureSpace
from streammargin.jit import alma as alma_jit
from streammargin.mixing import _alma_arrays, _alma_vectors, _Columns, _Mixing

__all__ = ["ALMAParts", "DeltaLedger", "alma_parts"]

MAX_STREAM = 2**63 - 1  # stream ids are random 63-bit numbers
MAX_COUNTER = 2.0**53  # counters stay exact in a float64


@dataclasses.dataclass(frozen=True)
class ALMAParts:
    """An ALMA model's hypothesis as quantities that add up, over the columns of `space` (a copy
    of the model's feature space at the time): the dual vector theta, the decayed sum of its
    averaged weights (`summed`, the average times D) and that sum's weight D (`decayed`), its
    counters (trials and k, the corrections plus one) and its calibration (online Platt
    scaling's state)."""

    space: FeatureSpace
    theta: np.ndarray
    summed: np.ndarray
    decayed: float
    trials: float
    k: float
    platt: np.ndarray


def alma_parts(model: ALMAClassifier) -> ALMAParts:
    """The parts of `model` as it is now (its deferred trial run first)."""
    theta, averaged, platt = _alma_vectors(model)
    st = model._st
    decayed = float(st[alma_jit.DECAYED]) if model.average else 0.0
    return ALMAParts(_copy_space(model._features), theta, averaged * decayed, decayed,
                     float(st[alma_jit.TRIALS]), float(st[alma_jit.K]), platt)


def _copy_space(space: FeatureSpace) -> FeatureSpace:
    copied = FeatureSpace(space.first_column, space.max_features)
    copied._commit(list(space.names), 1 if space.hashing else 0)
    copied.features_hashed = space.features_hashed
    return copied


def _same_columns(a: FeatureSpace, b: FeatureSpace) -> bool:
    return a.hashing == b.hashing and a.names == b.names


def _sum(terms: typing.Sequence[tuple[float, ALMAParts]]) -> ALMAParts:
    """sum_i c_i parts_i, aligned by feature name (`mixing._Columns`) unless the parts share
    their columns, as copies that exchange often do. The calibration is the first term's."""
    parts = [p for _, p in terms]
    # (the combination's arithmetic, mixing's own: `affine` sums, `whole` rounds a counter)
    mixing = _Mixing(parts, np.array([c for c, _ in terms]), None)
    first = parts[0]
    if all(_same_columns(p.space, first.space) for p in parts[1:]):
        space = _copy_space(first.space)
        space.features_hashed = int(mixing.whole([p.space.features_hashed for p in parts],
                                                 0, 2**62))
        n = space.n_columns
        theta = sum(c * p.theta[:n] for c, p in zip(mixing.coefs, parts))
        summed = sum(c * p.summed[:n] for c, p in zip(mixing.coefs, parts))
    else:
        columns = _Columns([p.space for p in parts], mixing)
        space = columns.space
        theta = sum(c * columns.align(i, p.theta) for i, (c, p) in enumerate(terms))
        summed = sum(c * columns.align(i, p.summed) for i, (c, p) in enumerate(terms))
    return ALMAParts(
        space, np.asarray(theta, dtype=np.float64), np.asarray(summed, dtype=np.float64),
        decayed=mixing.affine([p.decayed for p in parts]),
        trials=mixing.affine([p.trials for p in parts]),
        k=mixing.affine([p.k for p in parts]), platt=first.platt)


def _set(model: ALMAClassifier, parts: ALMAParts, platt: np.ndarray,
         fallback: ALMAParts) -> None:
    """Set `model` to the hypothesis of `parts`, in place, as a mix sets it. A sum whose D is not
    positive (decay took more than was added) keeps the average of `fallback` (the model before
    the sum)."""
    space = _copy_space(parts.space)  # (the model grows its space: the parts keep theirs)
    n = space.n_columns
    pooled = parts.decayed
    if pooled > 0.0:
        averaged = parts.summed / pooled
    elif fallback.decayed > 0.0 and _same_columns(fallback.space, space):
        averaged = fallback.summed[:n] / fallback.decayed
    else:
        averaged = np.zeros(n)
    trials = float(min(max(round(parts.trials), 0.0), MAX_COUNTER))
    k = float(min(max(round(parts.k), 1.0), trials + 1.0))
    model._flush()
    vectors, st = _alma_arrays(model, n, parts.theta, averaged, pooled, trials, k, platt)
    model._features = space
    model._vectors = vectors
    model._st = st
    model._bind()


class DeltaLedger:
    """One worker's side of asynchronous delta averaging of an ALMA model (module docstring).

    Parameters
    ----------
    model
        The worker's model when the ledger begins.
    max_streams
        At most this many peer streams' last contributions are kept (the topic's partitions).
    stream
        The ledger's stream id (default: random).
    adopt
        Whether `model` was restored from a checkpoint, and so holds its peers' contributions up
        to it: all it holds counts as taken, and the first `take_in` takes the contributions it
        is given as added, not adding them again. What the peers contributed between the
        checkpoint and now is not added (a bound: the records of a checkpoint interval). False
        (a fresh model): all it learnt is the worker's own, and the peers' whole contributions
        are added.

    Examples
    --------

    Three copies of ALMA take Phishing's records in turn, predicting each before learning it
    (progressive validation), and exchange their contributions every 50 records a copy, each
    taking in the others' latest:

    >>> from river import datasets
    >>> import streammargin
    >>> from streammargin.delta import DeltaLedger
    >>> def progressive(exchange: bool) -> float:
    ...     copies = [streammargin.ALMAClassifier() for _ in range(3)]
    ...     ledgers = [DeltaLedger(m, max_streams=3, stream=k + 1) for k, m in enumerate(copies)]
    ...     published, correct = {}, 0
    ...     for i, (x, y) in enumerate(datasets.Phishing()):
    ...         k = i % 3
    ...         correct += copies[k].predict_one(x) == y
    ...         copies[k].learn_one(x, y)
    ...         if exchange and i // 3 % 50 == 49:
    ...             published[k] = ledgers[k].publish(copies[k])
    ...             others = [p for q, p in published.items() if q != k]
    ...             _ = ledgers[k].take_in(copies[k], others)
    ...     return round(correct / 1250, 3)
    >>> progressive(exchange=True), progressive(exchange=False)
    (0.849, 0.838)

    (One model learning every record: 0.886.)

    """

    def __init__(self, model: ALMAClassifier, max_streams: int,
                 stream: int | None = None, adopt: bool = False):
        if not isinstance(model, ALMAClassifier):
            raise TypeError(f"delta averaging is built for ALMAClassifier, not "
                            f"{type(model).__name__}")
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams!r}")
        self.stream = random.SystemRandom().randint(1, MAX_STREAM) if stream is None else stream
        self.serial = 0
        self.max_streams = max_streams
        fresh = copy.copy(model)
        fresh._reset()
        self._origin = alma_parts(fresh)
        self.own = self._origin  # C
        # B, the model after the ledger's last step: all a restored model holds is taken; all a
        # fresh one learnt is the worker's own.
        self.base = alma_parts(model) if adopt else self._origin
        # peer stream -> (serial, parts of the contribution last added); in the order last seen
        self.applied: dict[int, tuple[int, ALMAParts]] = {}
        self._adopting = adopt

    def _absorb(self, model: ALMAClassifier) -> tuple[ALMAParts, ALMAClassifier]:
        """C += model - B (the worker's own learning since the last step, in the unit ball as a
        model's), B = model. Returns the model's parts and C as a model."""
        now = alma_parts(model)
        contribution = copy.copy(model)
        _set(contribution, _sum([(1.0, self.own), (1.0, now), (-1.0, self.base)]), now.platt,
             self.own)
        self.own, self.base = alma_parts(contribution), now
        return now, contribution

    def publish(self, model: ALMAClassifier) -> tuple[int, int, ALMAClassifier]:
        """The next record of the ledger's stream: (stream, serial, C), C with the worker's own
        learning up to now."""
        _, contribution = self._absorb(model)
        self.serial += 1
        return self.stream, self.serial, contribution

    def merged(self, before: ALMAClassifier, after: ALMAClassifier) -> None:
        """The worker's model went from `before` to `after` by a merge that is not its own
        learning (a task taken over brought its model): the change is not the worker's own."""
        self.base = _sum([(1.0, self.base), (1.0, alma_parts(after)), (-1.0, alma_parts(before))])

    def seen(self, streams: typing.Iterable[int]) -> None:
        """`streams` are on the topic now: they are kept the longest."""
        for stream in streams:
            if stream in self.applied:
                self.applied[stream] = self.applied.pop(stream)

    def take_in(self, model: ALMAClassifier,
                contributions: typing.Iterable[tuple[int, int, ALMAClassifier]]) -> int:
        """Add to `model`, in place, each new contribution (stream, serial, C) of a peer: C - A,
        A the last added of that stream (none yet: a fresh model's). The ledger's own stream and
        serials not above the last added are left out. The worker's own learning since its
        last record goes into its next (C += model - B first). Returns how many were added."""
        terms: list[tuple[float, ALMAParts]] = []
        platts = []
        for stream, serial, contribution in sorted(contributions, key=lambda c: c[1]):
            if stream == self.stream:
                continue
            last = self.applied.pop(stream, None)
            if last is not None and serial <= last[0]:
                self.applied[stream] = last
                continue
            parts = alma_parts(contribution)
            self.applied[stream] = (serial, parts)
            if self._adopting:
                continue  # already in the model
            terms += [(1.0, parts), (-1.0, self._origin if last is None else last[1])]
            platts.append(parts.platt)
        self._adopting = False
        while len(self.applied) > self.max_streams:
            del self.applied[next(iter(self.applied))]  # seen longest ago
        if not terms:
            return 0
        now, _ = self._absorb(model)
        _set(model, _sum([(1.0, now), *terms]), np.mean([now.platt, *platts], axis=0), now)
        self.base = alma_parts(model)
        return len(platts)
