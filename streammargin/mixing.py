"""Mixing: one model from copies of it that learnt different parts of a stream.

A keyed topic spreads its records over partitions, and a worker trains one model per partition:
each sees a P-th of the stream. `mix` makes one model out of several copies (the partitions'
models, after they learnt their parts), so that the copies can be replaced by it now and then and
learn, between two mixes, as if they were one model (issue 25: "Partitions that learn one model").
Two schemes are built on it:

- *iterative parameter mixing* (McDonald, Hall & Mann 2010; federated averaging):
  `mix(models)`, the weighted mean of the copies' hypotheses, replaces every copy;
- *delta averaging*: `mix(models, weights, base=last)`, the last mixed model plus the weighted
  sum of each copy's change since then, ``base + sum_i w_i (m_i - base)``. With w_i = 1/P it is
  the mean again (all copies start from `base`); with w_i = 1 every copy's updates are all kept,
  as if one model had made them all (Hogwild-like, the scheme that follows drift fastest).

What a mix is, for every model family (the *hypothesis* is combined; counters follow it):

- Features are aligned by *name*, never by column: each model gives a name the column of its
  first appearance (`streammargin.features`), so two copies may hold one feature in different
  columns. The mixed model's feature space is the union of the names (the base's first, then the
  members' in order), bounded by `max_features` as learning bounds it: names beyond the exact
  columns take their hashed column, where a copy that hashed them holds them already.
- ALMA_p: the *dual* vector theta = f(w) is combined, not the primal weights. ALMA's correction
  is additive in the dual space (theta += eta_k y xh, then a scaling into the unit ball), so
  base + the sum of the copies' dual changes is the sum of every correction they made, what one
  model making them would hold; the mix is then projected into the unit p-ball as a correction
  is. (For p = 2, the default, theta = w: the two readings agree.) The averaged hypothesis,
  which ALMA serves, is a statistic: a decayed sum of past primal weights over its weight D. Sums
  and weights are combined like the hypothesis and then divided (pooled: for delta averaging,
  the average over every copy's trials, decayed per trial of the topic; summing the copies'
  averages instead overshot), each coordinate kept in [-1, 1] as a mean of unit-ball weights is.
  The counters k (the learning rate eta_k = C / sqrt(k)) and the trials are combined like the
  hypothesis: their mean for parameter mixing, the total count of the topic for delta averaging
  with weights 1. The calibration (online Platt scaling) is always the
  weighted mean of the copies' (a convex combination keeps its Hessian within its bounds).
- Kernel models (budget perceptrons, kernel ALMA, the budget SVM, the SBP, the MPU): the union of
  the support sets, each vector's coefficient times its model's weight, identical vectors of
  equal label merged (copies that share an ancestor share its vectors: after the first mix the
  union is the last mix's vectors plus each copy's new ones). Then the model's own budget rule
  brings the set back within its budget: the oldest go (Forgetron, the budget SVM's "oldest",
  the SBP's window, the MPU's cache), the smallest (the budget SVM's "smallest"; the
  Crammer-Kandola-Singer rule scored once on the union), a uniform subset ("random"), BSGD's
  merges of the smallest vector with its best partner ("merge"), or the Projectron's projection
  of the removed vectors on the span of those kept ("project"). Coefficients are then kept where
  the model's rule keeps them (the SVM's box [0, C] and its sum <= budget x C, kernel ALMA's unit
  ball, the SBP's unit ball, the perceptrons' unit steps: a perceptron with "random" or
  "smallest" holds one unit per mistake, so its mix is the union of the copies' mistakes) and
  every cached quantity (margins, gradients, responses, Gram matrices) recomputed from the kept
  set. A vector's birth (BORN, what "oldest" goes by) is kept on the base's clock and a newer
  one placed in the share of the mix's trials its copy stands for (`_ages`): with ages kept per
  copy, "oldest" had pruned at random and the budget SVM lost 8 points on RBF drift. Averaged
  coefficients are pooled like ALMA's average (the SBP's, a moving average, are
  their weighted mean). The budget SVM and the MPU hold the solution of a problem over their
  cache: when the budget rule had to remove vectors (the copies' caches did not fit one), they
  re-solve it over the vectors kept, from the combined coefficients (SMO, or the MPU's replay of
  its cache): without it the pruned combination lost 7-12 points on the hyperplane. A model with
  gamma="auto" estimates its width from its first 64 records: copies that are all still in that
  warm-up are mixed by learning their kept records in turn (the width is then estimated on the
  pooled records); copies in the warm-up are left out of a mix with copies past it; copies past
  it take the weighted geometric mean of their widths.
- The Convex Polytope Machine: its K faces per class have no order (ASSIGN gives a face
  whichever instance comes first), so face k of one copy is not face k of another. Each copy's
  faces are matched to a reference polytope (the base's, else the first copy's) by an exact
  assignment (the Hungarian algorithm) on the squared distances of the face weight vectors, and
  matched faces are combined, with their ASSIGN counts. After one mix every copy descends from
  the same faces, so the matching is nearly the identity; it matters at the first mix. Classes
  are aligned by label; a class some copies never saw is combined over those that did.
- `OneVsRestClassifier`: class by class, over the copies that have the class.
- `AutoClassifier`: member by member (ALMA, the CPM, the budget SVM), labels aligned, the scores
  averaged (a member in binary mode whose labels play the other roles is left out).
- `StandardScaler` (this package's and River's): running statistics are not a hypothesis but
  counts, so they are pooled exactly (parallel Welford: counts, means and sums of squared
  deviations add up), whatever the weights: with a base, base + every copy's records since it.
- A `river.compose.Pipeline` of these: step by step.

`mix(models)` of a single model is a copy of it. The mixed model is built as a state and restored
by its class' `from_state`, so it passes every check of a checkpoint (its memory within the same
bound as each copy's, `streammargin.memory`) and round-trips through `streammargin.state`.

References
----------
[^1]: McDonald, R., Hall, K. and Mann, G. (2010). Distributed training strategies for the
structured perceptron. NAACL HLT.
[^2]: Kamp, M., Boley, M., Keren, D., Schuster, A. and Sharfman, I. (2014). Communication-efficient
distributed online prediction by dynamic model synchronization. ECML PKDD.
[^3]: Kamp, M., Bothe, S., Boley, M. and Mock, M. (2016). Communication-efficient distributed online
learning with kernels. ECML PKDD.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import typing

import numpy as np

from streammargin import state
from streammargin.alma import MIN_SCALE as ALMA_MIN_SCALE
from streammargin.alma import ALMAClassifier
from streammargin.auto import BINARY, ONE_VS_REST, PORTFOLIO, AutoClassifier
from streammargin.base import FeatureSpaceClassifier
from streammargin.budget import BudgetKernelClassifier
from streammargin.budget_perceptron import BudgetPerceptron
from streammargin.budget_svm import BudgetSVMClassifier
from streammargin.convex_polytope import ConvexPolytopeClassifier
from streammargin.features import FeatureSpace, name_json
from streammargin.jit import alma as alma_jit
from streammargin.jit import budget as bjit
from streammargin.jit import budget_svm as svm_jit
from streammargin.jit import calibration
from streammargin.jit import convex_polytope as cpm_jit
from streammargin.jit import kernels as kjit
from streammargin.jit import mpu as mpu_jit
from streammargin.jit import sbp as sbp_jit
from streammargin.kernel_alma import KernelALMAClassifier
from streammargin.mpu import KernelMPUClassifier, LinearMPUClassifier
from streammargin.multiclass import OneVsRestClassifier
from streammargin.replay import ReplayBuffer
from streammargin.sbp import SBPClassifier
from streammargin.scaler import StandardScaler
from streammargin.support import MAX_GAMMA, MIN_GAMMA, KernelClassifier

__all__ = ["assignment", "mix", "mix_member"]

# SMO steps per budget slot when a mix re-solves the budget SVM's cached problem (it took 2-3
# per slot to the tolerance on the hyperplane; the cap bounds the cost of a mix).
SVM_RESOLVE_STEPS = 20
# Sweeps over the MPU's replay cache when a mix re-solves it (see `_pack_mpu`).
MPU_RESOLVE_SWEEPS = 3


def mix(
    models: typing.Sequence[typing.Any],
    weights: typing.Sequence[float] | None = None,
    *,
    base: typing.Any = None,
) -> typing.Any:
    """One model from `models`, copies of one model (same class and params) that learnt different
    parts of a stream; the inputs are left as they were.

    Parameters
    ----------
    models
        The copies: streammargin models, `StandardScaler`s (this package's or River's), or River
        pipelines of these with the same steps.
    weights
        Without `base`: the weight of each copy in the weighted mean, non-negative and not all
        zero (normalised to sum 1; default uniform). With `base`: each copy's change since
        `base` is added times its weight (default 1 / len(models): the mean; 1 each: every
        copy's updates kept in full). Statistics (scalers) are pooled whatever the weights.
    base
        The model the copies started from at the last mix (delta averaging), or None.

    Raises `ValueError` for copies of different classes or params, or bad weights.

    Examples
    --------

    >>> from river import datasets
    >>> import streammargin
    >>> from streammargin.mixing import mix

    Two ALMA copies, each trained on every other record of Phishing's first 800, then scored on
    the rest (one model trained on all 800 scores 0.911):

    >>> stream = list(datasets.Phishing())
    >>> copies = [streammargin.ALMAClassifier(), streammargin.ALMAClassifier()]
    >>> for i, (x, y) in enumerate(stream[:800]):
    ...     copies[i % 2].learn_one(x, y)
    >>> def accuracy(model):
    ...     return round(sum(model.predict_one(x) == y for x, y in stream[800:]) / 450, 3)
    >>> [accuracy(copy) for copy in copies]
    [0.907, 0.9]
    >>> one = mix(copies)
    >>> one.n_trials, accuracy(one)
    (400, 0.918)

    """
    models = list(models)
    if not models:
        raise ValueError("mix needs at least one model")
    n = len(models)
    kind = type(models[0])
    for model in (*models, *([] if base is None else [base])):
        if type(model) is not kind:
            raise ValueError(
                f"cannot mix a {type(model).__name__} with a {kind.__name__}: the copies must be "
                "of one class"
            )
    if weights is None:
        w = np.full(n, 1.0 / n)
    else:
        w = np.array([float(v) for v in weights], dtype=np.float64)
        if w.shape != (n,) or not np.isfinite(w).all() or (w < 0.0).any():
            raise ValueError(f"weights must be {n} finite numbers >= 0, got {list(weights)!r}")
    if base is None:
        if not w.sum() > 0.0:
            raise ValueError("the weights of a mix without a base must not all be zero")
        w = w / w.sum()
    if base is None and n == 1:
        return _copy(models[0])
    statistics = isinstance(models[0], StandardScaler)  # (pooled: equal copies add up)
    if not (statistics and base is None) and _all_equal(
        models if base is None else [base, *models]
    ):
        # Copies that are one model (a partition that learnt nothing since the last mix is
        # its base): that model, whatever the weights, bit for bit.
        return _copy(models[0])
    mixing = _Mixing(models, w, base)
    return _mixer(kind)(mixing)


# The combination ----------------------------------------------------------------------------------


class _Mixing:
    """The copies and the coefficients of their affine combination.

    `sources` lists the base first (when there is one), then the copies; `coefs` are the
    coefficients of the combination, summing to 1 (the base's is 1 - sum of the weights), and
    `convex` the copies' weights normalised to sum 1 (the base left out): what must stay a convex
    combination (calibrations, scores, ASSIGN counts) uses those."""

    def __init__(self, models: list, weights: np.ndarray, base: typing.Any):
        self.models = models
        self.weights = weights
        self.base = base
        if base is None:
            self.sources = list(models)
            self.coefs = weights.copy()
        else:
            self.sources = [base, *models]
            self.coefs = np.concatenate([[1.0 - weights.sum()], weights])
        total = weights.sum()
        uniform = np.full(len(models), 1.0 / len(models))
        self.convex_members = weights / total if total > 0.0 else uniform
        # the convex weights over `sources` (the base's 0, or 1 with all-zero weights)
        if base is None:
            self.convex = self.convex_members
        elif total > 0.0:
            self.convex = np.concatenate([[0.0], self.convex_members])
        else:
            self.convex = np.concatenate([[1.0], np.zeros(len(models))])

    def sub(self, keep: typing.Sequence[bool], with_base: bool = True) -> _Mixing:
        """The combination over the copies where `keep` (a flag per copy, at least one set) is
        set, with the base or (`with_base` False) as their weighted mean."""
        chosen = [m for m, k in zip(self.models, keep) if k]
        weights = np.array([w for w, k in zip(self.weights, keep) if k])
        base = self.base if with_base else None
        if base is None:
            total = weights.sum()
            weights = weights / total if total > 0 else np.full(len(chosen), 1.0 / len(chosen))
        return _Mixing(chosen, weights, base)

    def affine(self, values: typing.Sequence[float]) -> float:
        """sum_j coefs_j values_j over `sources`."""
        return float(np.dot(self.coefs, np.asarray(values, dtype=np.float64)))

    def whole(self, values: typing.Sequence[float], low: float = 0.0,
              high: float = 2.0**53) -> float:
        """`affine` for a counter: a whole number within [low, high]."""
        return float(min(max(round(self.affine(values)), low), high))

    def mean(self, values: typing.Sequence[typing.Any]) -> typing.Any:
        """sum_j convex_j values_j over `sources` (arrays or numbers)."""
        total = None
        for weight, value in zip(self.convex, values):
            term = weight * np.asarray(value, dtype=np.float64)
            total = term if total is None else total + term
        return total


def _mixer(kind: type) -> typing.Callable[[_Mixing], typing.Any]:
    for cls, function in _MIXERS:
        if issubclass(kind, cls):
            return function
    if kind.__module__.startswith("river.compose") and kind.__name__ == "Pipeline":
        return _mix_pipeline
    if kind.__module__.startswith("river.preprocessing") and kind.__name__ == "StandardScaler":
        return _mix_river_scaler
    raise ValueError(f"mix does not know how to combine a {kind.__name__}")


def _copy(model: typing.Any) -> typing.Any:
    """A copy of `model`, through its safe state where it has one."""
    if isinstance(model, FeatureSpaceClassifier):
        return type(model).from_state(model.to_state())
    if isinstance(model, (OneVsRestClassifier, AutoClassifier)):
        return type(model).from_state(model.to_state())
    if isinstance(model, StandardScaler):
        return StandardScaler.from_state(model.to_state())
    import copy

    return copy.deepcopy(model)


def _all_equal(models: list) -> bool:
    """Whether the models have one safe state (those that have one)."""
    if not hasattr(models[0], "to_state") or len(models) < 2:
        return False
    try:
        first = state.dumps(models[0].to_state())
        return all(state.dumps(m.to_state()) == first for m in models[1:])
    except (TypeError, ValueError):
        return False


def _same_params(mixing: _Mixing) -> dict:
    """The copies' params, which must all be equal."""
    params = mixing.sources[0]._get_params()
    for model in mixing.sources[1:]:
        if model._get_params() != params:
            raise ValueError(
                f"cannot mix {type(model).__name__}s with different params: {params} and "
                f"{model._get_params()}"
            )
    return params


# Feature spaces -----------------------------------------------------------------------------------


class _Columns:
    """The union of the copies' feature spaces, by name, and each copy's column map into it.

    Names come in the order of the sources (the base's first, then each copy's new ones in its
    own order), so a mix keeps the base's columns where they were. Names beyond the exact
    columns take their hashed column, as learning would place them; the hashed columns of every
    copy are the same columns (same bound, same hash)."""

    def __init__(self, spaces: list[FeatureSpace], mixing: _Mixing):
        first = spaces[0]
        space = FeatureSpace(first.first_column, first.max_features)
        names: dict = {}
        for s in spaces:
            for name in s.names:
                names.setdefault(name, None)
        ordered = list(names)
        exact = ordered[: space.n_exact]
        hashing = any(s.hashing for s in spaces) or len(ordered) > space.n_exact
        space._commit(exact, 1 if hashing else 0)
        space.features_hashed = int(mixing.whole([s.features_hashed for s in spaces], 0, 2**62))
        if space.features_hashed and not space.hashing:
            space._commit([], 1)
        self.space = space
        self.maps = []
        for s in spaces:
            cmap = np.arange(s.n_columns, dtype=np.int64)
            for name, column in s.index.items():
                target = space.index.get(name)
                if target is None:
                    target = space._hashed_column(name_json(name))
                cmap[column] = target
            self.maps.append(cmap)

    @property
    def n_columns(self) -> int:
        return self.space.n_columns

    def align(self, i: int, values: np.ndarray) -> np.ndarray:
        """`values` (last axis: source i's columns, at least its feature space's) over the
        union's columns; entries of columns that share a union column add up."""
        cmap = self.maps[i]
        values = values[..., : cmap.shape[0]]
        out = np.zeros((*values.shape[:-1], self.n_columns))
        if values.ndim == 1:
            np.add.at(out, cmap, values)
        else:
            np.add.at(out, (slice(None), cmap), values)
        return out


def _capacity(n_columns: int, limit: int) -> int:
    """An array width learning could have made for `n_columns` columns (1 for an empty space)."""
    return max(n_columns, min(1, limit))


def _calibrations(mixing: _Mixing, states: list[np.ndarray]) -> np.ndarray:
    """The weighted mean of calibration states (`streammargin.jit.calibration`): a convex
    combination keeps every field in its range and the Hessian's determinant >= 1."""
    out = mixing.mean(states)
    out[calibration.UNSEEN] = min(max(out[calibration.UNSEEN], 0.0), 1.0)
    return out


def _feature_state(columns: _Columns) -> dict:
    return columns.space.to_state()


# ALMA ---------------------------------------------------------------------------------------------


def _alma_vectors(model: ALMAClassifier) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(theta, served averaged weights, the calibration) of an ALMA model over its columns."""
    model._flush()
    st, vectors = model._st, model._vectors
    n = model._features.n_columns
    p = st[alma_jit.P]
    u = vectors[:n, alma_jit.U]
    theta = st[alma_jit.SCALE] * u
    if st[alma_jit.AVERAGE] != 0.0 and st[alma_jit.DECAYED] > 0.0:
        since = st[alma_jit.FACTOR_SUM] - vectors[:n, alma_jit.MARK]
        with np.errstate(over="ignore", invalid="ignore"):
            g = u if p == 2.0 else np.sign(u) * np.abs(u) ** (p - 1.0)
            summed = vectors[:n, alma_jit.ACC] + np.where(since == 0.0, 0.0, g * since)
        averaged = summed / (st[alma_jit.GROWTH] * st[alma_jit.DECAYED])
    else:
        averaged = np.zeros(n)
    return theta, averaged, st[alma_jit.PLATT :].copy()


def _mix_alma(mixing: _Mixing) -> ALMAClassifier:
    params = _same_params(mixing)
    sources = mixing.sources
    columns = _Columns([m._features for m in sources], mixing)
    parts = [_alma_vectors(m) for m in sources]
    theta = sum(
        c * columns.align(i, t) for i, (c, (t, _, _)) in enumerate(zip(mixing.coefs, parts))
    )
    sts = [m._st for m in sources]
    # The averaged hypothesis is a statistic, a decayed sum of past weights over its weight D:
    # sums and weights are combined (pooled), then divided.
    decayed = [s[alma_jit.DECAYED] for s in sts]
    summed = sum(
        c * d * columns.align(i, a)
        for i, (c, d, (_, a, _)) in enumerate(zip(mixing.coefs, decayed, parts))
    )
    pooled = mixing.affine(decayed)
    if pooled > 0.0:
        averaged = summed / pooled
    else:  # (a delta sum whose decay took more than it added: the copies' mean)
        averaged = mixing.mean([columns.align(i, a) for i, (_, a, _) in enumerate(parts)])
    trials = mixing.whole([s[alma_jit.TRIALS] for s in sts])
    k = mixing.whole([s[alma_jit.K] for s in sts], 1.0, trials + 1.0)
    platt = _calibrations(mixing, [s[alma_jit.PLATT :] for s in sts])
    vectors, st = _alma_arrays(sources[0], columns.n_columns, theta, averaged, pooled, trials, k,
                               platt)
    return ALMAClassifier.from_state({
        "model": "ALMAClassifier",
        "params": params,
        "features": _feature_state(columns),
        "arrays": {"_vectors": vectors, "_st": st},
        "values": {},
    })


def _alma_arrays(model: ALMAClassifier, n_columns: int, theta: np.ndarray, averaged: np.ndarray,
                 pooled: float, trials: float, k: float, platt: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """ALMA's `_vectors` and `_st` (the hyper-parameter slots `model`'s) for a combined
    hypothesis over `n_columns` columns: theta, the averaged weights and their pooled weight D,
    the counters (whole numbers) and the calibration."""
    p = float(model.p)
    st = model._st.copy()
    st[alma_jit.TRIALS] = trials
    st[alma_jit.K] = k
    st[alma_jit.SINCE_RECOMPUTE] = 0.0
    # theta into the unit p-ball (a delta sum may leave it), then as scale * u with max |u| = 1,
    # which puts S = sum |u|^p in [1, d] (`jit.alma._renormalise`).
    largest = float(np.max(np.abs(theta), initial=0.0))
    if largest < ALMA_MIN_SCALE * 1e10:
        u, scale, total = np.zeros_like(theta), 1.0, 0.0
    else:
        u = theta / largest
        total = float(np.sum(u * u)) if p == 2.0 else float(np.sum(np.abs(u) ** p))
        norm = largest * total ** (1.0 / p)
        scale = largest / norm if norm > 1.0 else largest
        scale = min(scale, 1.0)
    st[alma_jit.SCALE] = scale
    st[alma_jit.SUM_P] = total
    st[alma_jit.S_PEAK] = total
    vectors = np.zeros((max(n_columns, 1), alma_jit.N_COLUMNS))
    vectors[: u.shape[0], alma_jit.U] = u
    if model.average:
        window = trials if model.average_window is None else min(trials, model.average_window)
        decayed = min(max(pooled, min(trials, 1.0)), window)
        st[alma_jit.DECAYED] = decayed
        st[alma_jit.GROWTH] = 1.0
        st[alma_jit.FACTOR_SUM] = 0.0
        # A weighted mean of weights of the unit ball has coordinates in [-1, 1]; a delta sum
        # is kept there.
        vectors[: averaged.shape[0], alma_jit.ACC] = np.clip(averaged, -1.0, 1.0) * decayed
        factor = scale if p == 2.0 or total <= 0.0 else scale / total ** ((p - 2.0) / p)
        st[alma_jit.FACTOR_BASE] = factor
    st[alma_jit.PLATT :] = platt
    return vectors, st


# Kernel models: support expansions ---------------------------------------------------------------


@dataclasses.dataclass
class _Support:
    """A support set over the union's columns: each vector's row, its label (the example's, +-1),
    its signed coefficient in the last hypothesis and in the served average, its age in trials,
    and model-specific fields."""

    rows: np.ndarray
    label: np.ndarray
    coef: np.ndarray
    avg: np.ndarray
    age: np.ndarray

    def take(self, keep: np.ndarray) -> _Support:
        return _Support(self.rows[keep], self.label[keep], self.coef[keep], self.avg[keep],
                        self.age[keep])

    def __len__(self) -> int:
        return self.rows.shape[0]


class _Unaligned:
    """A copy's support rows in its own columns, aligned over the union's (`_Columns.align`)
    only when `_union` reaches them: a part's `rows` until then."""

    def __init__(self, columns: _Columns, i: int, rows: np.ndarray):
        self.columns, self.i, self.raw = columns, i, rows
        self.shape = (rows.shape[0], columns.n_columns)

    def aligned(self) -> np.ndarray:
        return self.columns.align(self.i, self.raw)


def _union(parts: list[_Support], coefs: np.ndarray, avg_coefs: np.ndarray | None = None
           ) -> _Support:
    """The support sets with their coefficients times `coefs` (the averaged ones times
    `avg_coefs`, by default the same), identical vectors of equal label merged (their
    coefficients added, the youngest age kept), in the order of first appearance. Each part's
    rows are `_Unaligned`.

    Memory: the parts' rows are aligned one part at a time and only the distinct
    ones copied, into one array of the parts' total rows (the result's rows are a view of it).
    Why: concatenating the aligned parts and sorting them for duplicates held six copies of
    every support at once, 38x a budget SVM's ceiling for 12 copies, 416 MiB
    (benchmarks/memory_ceiling.py, section 3). A vector is known by a 128-bit digest of its
    bytes and label (two distinct vectors colliding: 2**-128 a pair)."""
    avg_coefs = coefs if avg_coefs is None else avg_coefs
    label = np.concatenate([p.label for p in parts])
    coef = np.concatenate([p.coef * c for p, c in zip(parts, coefs)])
    avg = np.concatenate([p.avg * c for p, c in zip(parts, avg_coefs)])
    age = np.concatenate([p.age for p in parts])
    total = label.shape[0]
    width = parts[0].rows.shape[1] if parts else 0
    rows = np.empty((total, width))
    group = np.empty(total, dtype=np.int64)
    first_of: dict[bytes, int] = {}  # a vector's key -> its group
    firsts: list[int] = []  # each group's first member
    n = start = 0
    for part in parts:
        part_rows = part.rows.aligned()  # (float64, C order: `_Columns.align`'s own array)
        for j in range(part_rows.shape[0]):
            row = part_rows[j]
            digest = hashlib.blake2b(row.tobytes(), digest_size=16).digest()
            key = digest + label[start + j].tobytes()
            found = first_of.get(key)
            if found is None:
                found = first_of[key] = n
                firsts.append(start + j)
                rows[n] = row
                n += 1
            group[start + j] = found
        start += part_rows.shape[0]
    merged_coef = np.zeros(n)
    merged_avg = np.zeros(n)
    np.add.at(merged_coef, group, coef)
    np.add.at(merged_avg, group, avg)
    merged_age = np.full(n, np.inf)
    np.minimum.at(merged_age, group, age)
    return _Support(rows[:n], label[np.array(firsts, dtype=np.int64)], merged_coef, merged_avg,
                    merged_age)


def _kernel(kp: np.ndarray, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """K(A_i, B_j) in numpy (the same kernels as `streammargin.jit.kernels`, finite values)."""
    kind, gamma, degree, coef0 = kp
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        dot = A @ B.T
        if kind == kjit.RBF:
            sq_a = np.einsum("ij,ij->i", A, A)
            sq_b = np.einsum("ij,ij->i", B, B)
            d2 = np.maximum(sq_a[:, None] + sq_b[None, :] - 2.0 * dot, 0.0)
            out = np.exp(-gamma * d2)
        elif kind == kjit.POLY:
            out = np.clip(np.clip(gamma * dot + coef0, -kjit.BIG, kjit.BIG) ** degree,
                          -kjit.BIG, kjit.BIG)
        else:
            out = np.clip(dot, -kjit.BIG, kjit.BIG)
    return np.nan_to_num(out, nan=0.0, posinf=kjit.BIG, neginf=-kjit.BIG)


def _self_kernels(kp: np.ndarray, sq: np.ndarray) -> np.ndarray:
    """K(s, s) from squared norms, exactly as the models compute it (`kernels.self_kernel`)."""
    if kp[kjit.KIND] == kjit.RBF:
        return np.ones(sq.shape[0])
    return np.array([kjit.self_kernel(kp, float(v)) for v in sq])


def _sq_norms(rows: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.minimum(np.sum(rows * rows, axis=1), kjit.MAX_FINITE)


def _warming(model: KernelClassifier) -> bool:
    return model._estimates_gamma and model._warming_up


def _mix_warm_up(mixing: _Mixing) -> typing.Any:
    """Copies that are all in their warm-up (gamma="auto", fewer than 64 records): a fresh model
    learns their kept records in turn (round robin, each copy's in its order), as one model fed
    the pooled records would; the width is then estimated on those. The base, if any, is a copy
    too: its records come first in every copy, and are learnt once."""
    fresh = mixing.models[0].clone()
    queues = []
    base_rows = 0
    if mixing.base is not None:
        base_rows = int(np.count_nonzero(mixing.base._warmup_y))
    for model in ([mixing.base] if mixing.base is not None else []) + mixing.models:
        n = int(np.count_nonzero(model._warmup_y))
        start = base_rows if model is not mixing.base else 0
        names = model._features.names
        first = model._features.first_column
        records = []
        for r in range(start, n):
            row = model._warmup_x[r]
            x = {name: float(row[first + j]) for j, name in enumerate(names)
                 if first + j < row.shape[0] and row[first + j] != 0.0}
            records.append((x, bool(model._warmup_y[r] > 0.0)))
        queues.append(records)
    position = 0
    while any(position < len(q) for q in queues):
        for q in queues:
            if position < len(q):
                fresh.learn_one(*q[position])
        position += 1
    return type(fresh).from_state(fresh.to_state())


def _mix_kernel(mixing: _Mixing) -> typing.Any:
    """The kernel models: warm-up, then the union of supports and the model's pack."""
    _same_params(mixing)
    kind = type(mixing.sources[0])
    if isinstance(mixing.sources[0], KernelClassifier):
        warming = [_warming(m) for m in mixing.models]
        if all(warming) and (mixing.base is None or _warming(mixing.base)):
            return _mix_warm_up(mixing)
        # The copies past the warm-up only; their weighted mean if the base is still in it.
        base_warming = mixing.base is not None and _warming(mixing.base)
        if any(warming) or base_warming:
            mixing = mixing.sub([not w for w in warming], with_base=not base_warming)
    return _KERNEL_PACKS[kind](mixing)


def _kernel_setup(mixing: _Mixing) -> tuple:
    """What every kernel family's mix starts from: the copies, the first of them (whose params
    the mix keeps), the columns aligned by name, and `_kernel_head`'s state, kernel parameters
    and trials."""
    sources = mixing.sources
    columns = _Columns([m._features for m in sources], mixing)
    st, kp, trials = _kernel_head(mixing, columns)
    return sources, sources[0], columns, st, kp, trials


def _cached_labels(model: typing.Any) -> tuple[int, np.ndarray]:
    """(n, the labels of the n cached examples) of a kernel model's slots."""
    n = int(model._st[kjit.ST_SIZE])
    return n, model._slots[:n, kjit.LABEL].copy()


def _kernel_head(mixing: _Mixing, columns: _Columns) -> tuple[np.ndarray, np.ndarray, float]:
    """A new `st` from the first source's (hyper slots are rewritten by `from_state`), with the
    trials, the calibration and the kernel width mixed; (st, kp, trials)."""
    sts = [m._st for m in mixing.sources]
    st = sts[0].copy()
    trials = mixing.whole([s[kjit.ST_TRIALS] for s in sts])
    st[kjit.ST_TRIALS] = trials
    st[kjit.ST_PLATT : kjit.ST_MODEL] = _calibrations(
        mixing, [s[kjit.ST_PLATT : kjit.ST_MODEL] for s in sts]
    )
    model = mixing.sources[0]
    if isinstance(model, KernelClassifier) and model._estimates_gamma:
        gammas = np.array([s[kjit.ST_KP + kjit.GAMMA] for s in sts])
        gamma = float(np.exp(np.dot(mixing.convex, np.log(np.maximum(gammas, MIN_GAMMA)))))
        st[kjit.ST_KP + kjit.GAMMA] = min(max(gamma, MIN_GAMMA), MAX_GAMMA)
    kp = st[kjit.ST_KP : kjit.ST_KP + kjit.KP_SIZE].copy()
    return st, kp, trials


def _warmup_arrays(model: typing.Any, columns: _Columns) -> dict:
    """The warm-up arrays of a model past its warm-up (gamma="auto"), else none."""
    if isinstance(model, KernelClassifier) and model._estimates_gamma:
        return {"_warmup_x": np.zeros((0, 0)), "_warmup_y": np.zeros(0)}
    return {}


def _cache_arrays(sup: _Support, rows: int, n_fields: int, columns: _Columns, trials: float,
                  limit: int) -> tuple[np.ndarray, np.ndarray]:
    """The support cache (S, slots) of `rows` rows holding `sup`: LABEL, SQ_NORM and BORN set
    (BORN = trials - age), COEF left to the model."""
    width = _capacity(columns.n_columns, limit)
    S = np.zeros((rows, width))
    slots = np.zeros((rows, n_fields))
    n = len(sup)
    S[:n, : sup.rows.shape[1]] = sup.rows
    slots[:n, kjit.LABEL] = sup.label
    slots[:n, kjit.SQ_NORM] = _sq_norms(S[:n])
    slots[:n, kjit.BORN] = np.clip(np.round(trials - sup.age), 0.0, trials)
    return S, slots


def _ages(mixing: _Mixing, j: int, born: np.ndarray, trials: float) -> np.ndarray:
    """The ages, in the mix's trials (`trials`), of source j's vectors born at `born` (its own
    trials: BORN). Without a base, each source's ages are kept. With one, the sources share its
    clock up to its trials: a vector born by then keeps its birth (the copies of a vector of the
    base, pruned or not, keep their order), and one born since takes its place in the share of
    the mix's trials since the base that the source's own trials since the base stand for (an
    age that stays put while the copies that did not learn add nothing would make every vector
    look young, and "oldest" would prune at random)."""
    source = mixing.sources[j]
    t_j = float(source._st[kjit.ST_TRIALS])
    if mixing.base is None:
        return t_j - born
    t_b = float(mixing.base._st[kjit.ST_TRIALS])
    stretch = (trials - t_b) / max(t_j - t_b, 1.0)
    mapped = np.where(born <= t_b, born, t_b + (born - t_b) * stretch)
    return trials - np.clip(mapped, 0.0, trials)


def _budget_support(model: BudgetKernelClassifier, columns: _Columns, i: int,
                    ages: np.ndarray) -> _Support:
    st, slots = model._st, model._slots
    n = int(st[kjit.ST_SIZE])
    label = slots[:n, kjit.LABEL].copy()
    coef = st[bjit.SCALE] * slots[:n, kjit.COEF] * label
    trials = st[kjit.ST_TRIALS]
    if st[bjit.AVERAGE] != 0.0:
        # (the summed coefficients, a statistic: pooled by the union, divided by the pooled
        # trials in `_pack_budget`)
        summed = slots[:n, bjit.AVG_BASE] + slots[:n, kjit.COEF] * (
            st[bjit.CUM_SCALE] - slots[:n, bjit.AVG_MARK]
        )
        avg = summed * label
    else:
        avg = np.zeros(n)
    return _Support(_Unaligned(columns, i, model._support[:n]), label, coef, avg, ages)


def _reduce_budget(sup: _Support, budget: int, policy: str, kp: np.ndarray,
                   rng: np.random.Generator) -> tuple[_Support, int, int]:
    """`sup` within `budget` vectors by a budget policy; (the kept set, vectors removed,
    merges)."""
    n = len(sup)
    if n <= budget:
        return sup, 0, 0
    if policy == "oldest":
        order = np.lexsort((-np.abs(sup.coef), sup.age))
        return sup.take(np.sort(order[:budget])), n - budget, 0
    if policy == "random":
        return sup.take(np.sort(rng.choice(n, budget, replace=False))), n - budget, 0
    if policy == "smallest":
        # Crammer-Kandola-Singer, scored once on the union: remove the vectors whose margin
        # without their own term, y_i (f(s_i) - a_i K_ii), is the largest.
        margins = np.zeros(n)
        for start in range(0, n, 512):
            block = _kernel(kp, sup.rows[start : start + 512], sup.rows)
            margins[start : start + 512] = block @ sup.coef
        own = sup.coef * _self_kernels(kp, _sq_norms(sup.rows))
        score = sup.label * (margins - own)
        return sup.take(np.sort(np.argsort(score, kind="stable")[:budget])), n - budget, 0
    if policy == "merge":
        return _merge_down(sup, budget, kp)
    if policy == "project":
        return _project_down(sup, budget, kp), n - budget, 0
    raise ValueError(f"unknown budget policy {policy!r}")


def _merge_down(sup: _Support, budget: int, kp: np.ndarray) -> tuple[_Support, int, int]:
    """BSGD's merges (`jit.budget.merge_two`, RBF) until `budget` vectors are left: the vector of
    smallest |a| merges with the same-sign partner whose merge loses the least of ||f||."""
    rows = sup.rows.copy()
    coef = sup.coef.copy()
    avg = sup.avg.copy()
    age = sup.age.copy()
    alive = np.ones(len(sup), dtype=bool)
    merges = removed = 0
    gamma = kp[kjit.GAMMA]
    while alive.sum() > budget:
        live = np.flatnonzero(alive)
        m = live[np.argmin(np.abs(coef[live]))]
        a_m = coef[m]
        partners = live[(live != m) & (coef[live] * a_m > 0.0)]
        if partners.shape[0] == 0:
            alive[m] = False
            removed += 1
            continue
        d2 = np.sum((rows[partners] - rows[m]) ** 2, axis=1)
        k_mn = np.exp(-gamma * d2)
        a_n = coef[partners]
        before = a_m * a_m + a_n * a_n + 2.0 * a_m * a_n * k_mn
        larger = np.maximum(np.abs(a_m), np.abs(a_n))
        screen = before - larger * larger
        with np.errstate(divide="ignore", under="ignore"):
            h0 = a_m / (a_m + a_n)
            log_k = np.log(np.maximum(k_mn, 1e-300))
            a_mid = a_m * np.exp(log_k * (1 - h0) ** 2) + a_n * np.exp(log_k * h0**2)
        screen = np.where(k_mn > 0.0, np.minimum(screen, before - a_mid * a_mid), screen)
        best = int(np.argmin(screen))
        n = partners[best]
        h, a_z, _ = bjit._best_merge(float(a_m), float(coef[n]), float(k_mn[best]))
        k = float(k_mn[best])
        if k > 0.0:
            share_m = math.exp(math.log(k) * (1.0 - h) ** 2)
            share_n = math.exp(math.log(k) * h * h)
        else:
            share_m, share_n = float(h == 1.0), float(h == 0.0)
        rows[m] = h * rows[m] + (1.0 - h) * rows[n]
        avg[m] = avg[m] * share_m + avg[n] * share_n
        coef[m] = a_z
        age[m] = min(age[m], age[n])
        alive[n] = False
        merges += 1
    keep = np.flatnonzero(alive)
    out = _Support(rows[keep], sup.label[keep].copy(), coef[keep], avg[keep], age[keep])
    out.label = np.where(out.coef > 0.0, 1.0, np.where(out.coef < 0.0, -1.0, out.label))
    return out, removed, merges


def _project_down(sup: _Support, budget: int, kp: np.ndarray) -> _Support:
    """The Projectron's rule: keep the `budget` vectors of largest |a| sqrt(K_ii) and project the
    others' part of f on the span of those kept (a_kept += K_kk^-1 K_kr a_r)."""
    strength = np.abs(sup.coef) * np.sqrt(np.abs(_self_kernels(kp, _sq_norms(sup.rows))))
    order = np.argsort(-strength, kind="stable")
    keep, drop = np.sort(order[:budget]), order[budget:]
    kept = sup.take(keep)
    K_kk = _kernel(kp, kept.rows, kept.rows)
    K_kr = _kernel(kp, kept.rows, sup.rows[drop])
    inverse = np.linalg.pinv(K_kk, hermitian=True)
    kept.coef = kept.coef + inverse @ (K_kr @ sup.coef[drop])
    kept.avg = kept.avg + inverse @ (K_kr @ sup.avg[drop])
    return kept


def _pack_budget(mixing: _Mixing) -> typing.Any:
    """Budget perceptrons and kernel ALMA (`streammargin.budget`)."""
    sources, model, columns, st, kp, trials = _kernel_setup(mixing)
    params = model._get_params()
    sup = _union([
        _budget_support(m, columns, i, _ages(mixing, i, m._slots[: m.support_size, kjit.BORN],
                                             trials))
        for i, m in enumerate(sources)
    ], mixing.coefs)
    sts = [m._st for m in sources]
    policy = model.eviction
    if policy != "project":  # only the Projectron's coefficients change sign
        sup = sup.take(sup.coef != 0.0)
        sup.label = np.sign(sup.coef)
    rng = np.random.default_rng([int(st[bjit.RNG_KEY]), int(st[bjit.RNG_COUNTER])])
    sup, removed, merges = _reduce_budget(sup, model.budget, policy, kp, rng)
    updates = mixing.whole([s[bjit.UPDATES] for s in sts], 0.0, trials)
    coef = np.abs(sup.coef) if policy != "project" else sup.coef * sup.label
    if isinstance(model, BudgetPerceptron):
        # The perceptron's coefficients are whole updates (one each): "random" and "smallest"
        # keep them at 1 (the mix is the union of the copies' mistakes), the Forgetron within
        # [0, 1], a merge within the updates.
        if policy in ("random", "smallest"):
            coef = np.ones_like(coef)
        elif policy == "oldest":
            coef = _snapped(np.clip(coef, 0.0, 1.0), 1.0)
        elif policy == "merge":
            coef = np.clip(coef, 0.0, max(updates, 1.0))
    S, slots = _cache_arrays(sup, model.budget, model._n_fields, columns, trials,
                             model._max_columns)
    n = len(sup)
    slots[:n, kjit.COEF] = coef
    slots[:n, bjit.SELF] = _self_kernels(kp, slots[:n, kjit.SQ_NORM])
    signed = coef * slots[:n, kjit.LABEL]
    gram = _kernel(kp, S[:n], S[:n]) if n else np.zeros((0, 0))
    if n:
        np.fill_diagonal(gram, slots[:n, bjit.SELF])
    margins = gram @ signed if n else np.zeros(0)
    if isinstance(model, KernelALMAClassifier):
        # ALMA's unit ball: ||w||^2 = sum_i a_i MARGIN_i.
        norm = math.sqrt(max(float(signed @ margins), 0.0))
        if norm > 1.0:
            slots[:n, kjit.COEF] /= norm
            margins = margins / norm
    if st[bjit.TRACK] != 0.0:
        slots[:n, bjit.MARGIN] = margins
    cum = min(max(mixing.affine([s[bjit.CUM_SCALE] for s in sts]), 0.0), trials)
    if model.average and trials > 0.0:
        slots[:n, bjit.AVG_BASE] = sup.avg * slots[:n, kjit.LABEL]
        slots[:n, bjit.AVG_MARK] = cum
    st[bjit.CUM_SCALE] = cum if model.average else 0.0
    st[kjit.ST_SIZE] = n
    st[bjit.SCALE] = 1.0
    st[bjit.RNG_COUNTER] = mixing.whole([s[bjit.RNG_COUNTER] for s in sts])
    st[bjit.UPDATES] = updates
    st[bjit.EVICTIONS] = mixing.whole([s[bjit.EVICTIONS] for s in sts]) + removed
    st[bjit.MERGES] = mixing.whole([s[bjit.MERGES] for s in sts]) + merges
    st[bjit.PROJECTIONS] = mixing.whole([s[bjit.PROJECTIONS] for s in sts])
    st[bjit.CHANGES] = 0.0
    st[bjit.FORGETRON_Q] = min(mixing.affine([s[bjit.FORGETRON_Q] for s in sts]),
                               15.0 / 32.0 * updates)
    if isinstance(model, KernelALMAClassifier):
        from streammargin.jit import kernel_alma as ka_jit

        st[ka_jit.K] = updates + 1.0
    if isinstance(model, BudgetPerceptron):
        from streammargin.jit import budget_perceptron as bp_jit

        high = updates if model.margin > 0.0 else 0.0
        st[bp_jit.MARGIN_UPDATES] = mixing.whole([s[bp_jit.MARGIN_UPDATES] for s in sts], 0.0,
                                                 high)
    side = model.budget if policy == "project" else 0
    gram_inv = np.zeros((side, side))
    if side and n:
        inverse = np.linalg.pinv(gram, hermitian=True)
        inverse = np.clip(0.5 * (inverse + inverse.T), -1e150, 1e150)
        gram_inv[:n, :n] = inverse
    return type(model).from_state({
        "model": type(model).__name__,
        "params": params,
        "features": _feature_state(columns),
        "arrays": {"_support": S, "_slots": slots, "_st": st, "_gram_inv": gram_inv,
                   **_warmup_arrays(model, columns)},
        "values": {},
    })


def _snapped(values: np.ndarray, high: float) -> np.ndarray:
    """`values` in [0, high], those within rounding of a bound put on it: the models compare
    coefficients with their bounds exactly (SMO's box, a perceptron's unit steps), and the mean
    of copies that sit on a bound must sit on it too."""
    tiny = 1e-12 * high
    values = np.where(np.abs(values - high) <= tiny, high, values)
    return np.where(np.abs(values) <= tiny, 0.0, values)


def _pack_svm(mixing: _Mixing) -> BudgetSVMClassifier:
    """The budget SVM: the dual coefficients a_i combined (each kept in the box [0, C], their
    sum within budget x C), examples with a = 0 released first, then `prune`'s rule; the
    gradients G_i = 1 - y_i f(x_i) recomputed."""
    sources, model, columns, st, kp, trials = _kernel_setup(mixing)
    params = model._get_params()
    parts = []
    for i, m in enumerate(sources):
        n, label = _cached_labels(m)
        coef = m._slots[:n, kjit.COEF] * label
        parts.append(_Support(_Unaligned(columns, i, m._support[:n]), label, coef, coef.copy(),
                              _ages(mixing, i, m._slots[:n, kjit.BORN], trials)))
    sup = _union(parts, mixing.coefs)
    C = float(model.C)
    alpha = _snapped(np.clip(sup.coef * sup.label, 0.0, C), C)
    # The vectors kept, chosen on the coefficients and ages, then taken at once: each take
    # copies its rows, and the union's rows are most of a mix's memory.
    kept = np.arange(len(sup))
    released = 0
    if len(kept) > model.budget:
        nonzero = alpha > 0.0
        released = int(len(kept) - nonzero.sum())
        kept, alpha = kept[nonzero], alpha[nonzero]
    pruned = 0
    if len(kept) > model.budget:
        if model.prune == "oldest":
            order = np.lexsort((-alpha, sup.age[kept]))
        else:
            order = np.argsort(-alpha, kind="stable")
        keep = np.sort(order[: model.budget])
        pruned = len(kept) - model.budget
        kept, alpha = kept[keep], alpha[keep]
    sup = sup.take(kept)
    cap = model.budget * C
    if alpha.sum() > cap:
        alpha = alpha * (cap / alpha.sum())
    sts = [m._st for m in sources]
    S, slots = _cache_arrays(sup, model.budget + model._extra_rows, model._n_fields, columns,
                             trials, model._max_columns)
    n = len(sup)
    slots[:n, kjit.COEF] = alpha
    self_k = _self_kernels(kp, slots[:n, kjit.SQ_NORM])
    slots[:n, svm_jit.SELF] = self_k
    gram = _kernel(kp, S[:n], S[:n]) if n else np.zeros((0, 0))
    if n:
        np.fill_diagonal(gram, self_k)
    f = gram @ (alpha * sup.label) if n else np.zeros(0)
    slots[:n, svm_jit.GRAD] = 1.0 - sup.label * f
    st[kjit.ST_SIZE] = n
    st[svm_jit.ALPHA_SUM] = min(float(alpha.sum()), cap)
    high = 1.0 if model.kernel == "rbf" else kjit.BIG
    peak = float(np.max(np.abs(gram), initial=0.0)) if n else 0.0
    largest_self = float(np.max(np.abs(self_k), initial=0.0))
    st[svm_jit.KERNEL_PEAK] = min(max(peak * (1.0 + 1e-9), largest_self), high)
    st[svm_jit.SINCE_REFRESH] = 0.0
    for slot, extra in ((svm_jit.ADDED, 0), (svm_jit.PRUNED, pruned),
                        (svm_jit.RELEASED, released), (svm_jit.SMO_STEPS, 0)):
        st[slot] = mixing.whole([s[slot] for s in sts]) + extra
    mixed = BudgetSVMClassifier.from_state({
        "model": "BudgetSVMClassifier",
        "params": params,
        "features": _feature_state(columns),
        "arrays": {"_support": S, "_slots": slots, "_st": st, **_warmup_arrays(model, columns)},
        "values": {},
    })
    if pruned:
        # The budget rule took support vectors away from the combination, and with them most of
        # f where the copies' caches did not overlap. The SVM's hypothesis is the solution of
        # its cached dual problem: SMO re-solves it over the examples kept, from the combined
        # coefficients (a warm start). Hyperplane, 4000 records: 0.74-0.81 without, 0.81-0.88
        # with, the single model 0.81-0.87 (budget 100 and 500, 4 and 12 copies).
        svm_jit.solve(mixed._slots, mixed._st, mixed._gram, n, SVM_RESOLVE_STEPS * model.budget)
        mixed = BudgetSVMClassifier.from_state(mixed.to_state())
    return mixed


def _pack_sbp(mixing: _Mixing) -> SBPClassifier:
    """The SBP: the window's coefficients and averaged coefficients combined (kept >= 0), the
    most recent `window` points kept (its FIFO), the responses recomputed and w projected on the
    unit ball as a step does."""
    sources, model, columns, st, kp, trials = _kernel_setup(mixing)
    params = model._get_params()
    parts = []
    for i, m in enumerate(sources):
        n, label = _cached_labels(m)
        parts.append(_Support(_Unaligned(columns, i, m._support[:n]), label,
                              m._slots[:n, kjit.COEF] * label, m._slots[:n, sbp_jit.AVG] * label,
                              _ages(mixing, i, m._slots[:n, kjit.BORN], trials)))
    # (the averaged coefficients are a moving average: their weighted mean)
    sup = _union(parts, mixing.coefs, mixing.convex)
    if len(sup) > model.window:
        order = np.lexsort((-np.abs(sup.coef), sup.age))
        sup = sup.take(np.sort(order[: model.window]))
    S, slots = _cache_arrays(sup, model.window, model._n_fields, columns, trials,
                             model._max_columns)
    n = len(sup)
    alpha = np.clip(sup.coef * sup.label, 0.0, None)
    gram = _kernel(kp, S[:n], S[:n]) if n else np.zeros((0, 0))
    signed = alpha * sup.label
    r2 = float(signed @ gram @ signed) if n else 0.0
    if r2 > 1.0:
        alpha = alpha / math.sqrt(r2)
        signed = alpha * sup.label
        r2 = 1.0
    slots[:n, kjit.COEF] = alpha
    slots[:n, sbp_jit.AVG] = np.clip(sup.avg * sup.label, 0.0, None)
    slots[:n, sbp_jit.RESP] = sup.label * (gram @ signed) if n else 0.0
    sts = [m._st for m in sources]
    steps = mixing.whole([s[sbp_jit.STEPS_DONE] for s in sts], 0.0, trials * model.steps)
    st[kjit.ST_SIZE] = n
    st[sbp_jit.R2] = r2
    st[sbp_jit.STEPS_DONE] = steps
    st[sbp_jit.DRAWS] = steps
    return SBPClassifier.from_state({
        "model": "SBPClassifier",
        "params": params,
        "features": _feature_state(columns),
        "arrays": {"_support": S, "_slots": slots, "_st": st, **_warmup_arrays(model, columns)},
        "values": {},
    })


def _whole_counts(values: np.ndarray, cap: float, rng: np.random.Generator) -> np.ndarray:
    """Non-negative real counts as whole numbers, rounded up with probability their fractional
    part (unbiased: a copy's pattern of count 1 at weight 1/P is kept, whole, by one mix in P),
    within [0, cap]."""
    values = np.clip(values, 0.0, cap)
    floors = np.floor(values)
    return np.minimum(floors + (rng.random(values.shape[0]) < values - floors), cap)


def _pack_mpu(mixing: _Mixing) -> typing.Any:
    """The MPU (both forms): the replay caches' counts combined at the largest R (counts scale
    with R^2, as the model rescales them when R grows), as whole numbers (largest remainders)
    within the cap; the oldest pattern with no count leaves first, then the oldest; the weights
    (primal) or margins (dual) recomputed as a = sum_k I_k z_k."""
    sources, model, columns, st, kp, trials = _kernel_setup(mixing)
    params = model._get_params()
    sts = [m._st for m in sources]
    r = max(float(s[mpu_jit.R_NORM]) for s in sts)
    parts = []
    for i, m in enumerate(sources):
        n, label = _cached_labels(m)
        r_i = float(m._st[mpu_jit.R_NORM])
        growth = (r / r_i) ** 2 if r_i > 0.0 else 1.0
        count = m._slots[:n, kjit.COEF] * growth * label
        parts.append(_Support(_Unaligned(columns, i, m._support[:n]), label, count, count.copy(),
                              _ages(mixing, i, m._slots[:n, kjit.BORN], trials)))
    sup = _union(parts, mixing.coefs)
    st[mpu_jit.R_NORM] = r
    cap = float(mpu_jit.cap_for(st, r)) if r > 0.0 else 1.0
    st[mpu_jit.CAP] = cap
    rng = np.random.default_rng([int(trials), len(sup)])
    counts = _whole_counts(sup.coef * sup.label, cap, rng)
    drop = counts > 0.0  # patterns whose count rounded to 0 are not kept
    sup, counts = sup.take(drop), counts[drop]
    pruned = len(sup) > model.budget
    if pruned:
        # (the cache's eviction: the oldest pattern without a count first, then the oldest)
        keep = np.sort(np.lexsort((sup.age, -(counts > 0.0).astype(float)))[: model.budget])
        sup, counts = sup.take(keep), counts[keep]
    S, slots = _cache_arrays(sup, model.budget, model._n_fields, columns, trials,
                             model._max_columns)
    n = len(sup)
    rho = float(st[mpu_jit.RHO])
    slots[:n, kjit.COEF] = counts
    if r > 0.0:
        norms = np.sqrt(slots[:n, kjit.SQ_NORM] + rho * rho)
        slots[:n, mpu_jit.Z_SQ] = np.clip((norms / r) ** 2, 1e-300, 1.0)
    st[kjit.ST_SIZE] = n
    st[mpu_jit.COUNT_SUM] = float(counts.sum())
    st[mpu_jit.SINCE_REFRESH] = 0.0
    # (the replay goes on where the first source's was, the cache's order being its own first)
    st[mpu_jit.CURSOR] = min(float(sts[0][mpu_jit.CURSOR]), float(n))
    for slot in (mpu_jit.LEARN_STEPS, mpu_jit.UNLEARN_STEPS, mpu_jit.EVICTIONS):
        st[slot] = mixing.whole([s[slot] for s in sts], 0.0, 1e300)
    signed = counts * sup.label
    arrays = {"_support": S, "_slots": slots, "_st": st}
    if isinstance(model, LinearMPUClassifier):
        inv = 1.0 / r if r > 0.0 else 0.0
        weights = np.zeros(S.shape[1])
        weights[:] = (signed @ S[:n]) * inv if n else 0.0
        st[mpu_jit.BIAS] = float(signed.sum()) * rho * inv
        arrays["_weights"] = weights
    else:
        gram = np.zeros((model.budget, model.budget))
        mpu_jit.restore_gram(S, slots, st, gram)
        margins = np.zeros(model.budget)
        margins[:n] = gram[:n, :n] @ counts if n else 0.0
        arrays["_margins"] = margins
        arrays.update(_warmup_arrays(model, columns))
    mixed = type(model).from_state({
        "model": type(model).__name__,
        "params": params,
        "features": _feature_state(columns),
        "arrays": arrays,
        "values": {},
    })
    if pruned:
        # As for the budget SVM: the cache could not hold the combination (the copies' counts
        # sit at the cap, so the union does not shrink), and the MPU's own rule re-solves the
        # cached problem: every cached pattern presented again (`replay_cache`). Hyperplane,
        # 4 copies: 0.50 without, 0.77-0.82 after 1-10 sweeps, the single model 0.78.
        mixed.replay_cache(MPU_RESOLVE_SWEEPS)
    return mixed


_KERNEL_PACKS: dict[type, typing.Callable[[_Mixing], typing.Any]] = {
    BudgetPerceptron: _pack_budget,
    KernelALMAClassifier: _pack_budget,
    BudgetSVMClassifier: _pack_svm,
    SBPClassifier: _pack_sbp,
    LinearMPUClassifier: _pack_mpu,
    KernelMPUClassifier: _pack_mpu,
}


# The Convex Polytope Machine ---------------------------------------------------------------------


def assignment(cost: np.ndarray) -> np.ndarray:
    """The permutation `perm` of the columns of a square `cost` matrix that minimises
    sum_i cost[i, perm[i]] (the Hungarian algorithm, O(n^3); Kuhn 1955, Munkres 1957)."""
    n = cost.shape[0]
    INF = np.inf
    u = np.zeros(n + 1)
    v = np.zeros(n + 1)
    p = np.zeros(n + 1, dtype=np.int64)  # p[j]: the row matched to column j (1-based)
    way = np.zeros(n + 1, dtype=np.int64)
    for i in range(1, n + 1):
        p[0] = i
        j0 = 0
        minv = np.full(n + 1, INF)
        used = np.zeros(n + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = p[j0]
            free = ~used[1:]
            cur = cost[i0 - 1] - u[i0] - v[1:]
            better = free & (cur < minv[1:])
            minv[1:][better] = cur[better]
            way[1:][better] = j0
            candidates = np.where(free, minv[1:], INF)
            j1 = int(np.argmin(candidates)) + 1
            delta = candidates[j1 - 1]
            u[p[used]] += delta
            v[used] -= delta
            minv[1:][free] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while True:
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
            if j0 == 0:
                break
    perm = np.zeros(n, dtype=np.int64)
    for j in range(1, n + 1):
        perm[p[j] - 1] = j - 1
    return perm


def _labels_of(model: typing.Any) -> list:
    return list(model._labels)


def _mix_cpm(mixing: _Mixing) -> ConvexPolytopeClassifier:
    params = _same_params(mixing)
    sources = mixing.sources
    model = sources[0]
    K = model.n_faces
    binary = model._binary
    columns = _Columns([m._features for m in sources], mixing)
    sts = [m._st for m in sources]
    labels: dict = {}
    for m in sources:
        for label in _labels_of(m):
            labels.setdefault(label, None)
    labels = [False, True] if binary else list(labels)[: model.max_classes]
    n_poly = 1 if binary else len(labels)
    trials = mixing.whole([s[cpm_jit.TRIALS] for s in sts])
    steps = float(model.steps)
    t_new = trials * steps
    # Each source's faces W = G / (lambda t), over the union's columns (rows of W).
    faces = []
    for i, m in enumerate(sources):
        t = m._st[cpm_jit.SGD_STEPS]
        n = m._features.n_columns
        W = m._weights[:n] / (model.l2 * t) if t > 0.0 else np.zeros_like(m._weights[:n])
        faces.append(columns.align(i, W.T).T)  # (columns, n_poly_i * K)
    rows = max(columns.n_columns, 1)
    G = np.zeros((rows, n_poly * K))
    st = np.zeros(cpm_jit.state_size(K, n_poly))
    st[: cpm_jit.CLASSES] = sts[0][: cpm_jit.CLASSES]
    size = cpm_jit.block_size(K)
    for c, label in enumerate([True] if binary else labels):
        have = [i for i, m in enumerate(sources) if binary or label in m._label_index]
        coefs = np.array([mixing.coefs[i] for i in have])
        convex = np.array([mixing.convex[i] for i in have])
        if abs(coefs.sum()) < 1e-12:
            coefs = convex if convex.sum() > 0 else np.full(len(have), 1.0 / len(have))
        coefs = coefs / coefs.sum()
        convex = convex / convex.sum() if convex.sum() > 0 else np.full(len(have), 1.0 / len(have))
        code = {i: 0 if binary else sources[i]._label_index[label] for i in have}
        reference = faces[have[0]][:, code[have[0]] * K : (code[have[0]] + 1) * K]
        polytope = np.zeros((faces[0].shape[0], K))
        counts = np.zeros(K)
        platt = np.zeros(calibration.SIZE)
        for coef, weight, i in zip(coefs, convex, have):
            W = faces[i][:, code[i] * K : (code[i] + 1) * K]
            # cost[a, b] = ||reference face a - this copy's face b||^2
            cost = (np.sum(reference**2, axis=0)[:, None] + np.sum(W**2, axis=0)[None, :]
                    - 2.0 * reference.T @ W)
            perm = assignment(cost)
            polytope += coef * W[:, perm]
            start_i = cpm_jit.CLASSES + code[i] * size
            block = sts[i][start_i : start_i + size]
            counts += weight * block[:K][perm]
            platt += weight * block[K + cpm_jit.PLATT :]
        G[: polytope.shape[0], c * K : (c + 1) * K] = polytope * (model.l2 * t_new)
        start = cpm_jit.CLASSES + c * size
        counts = np.clip(counts, 0.0, 1.0 / (1.0 - cpm_jit.DECAY))
        st[start : start + K] = counts
        st[start + K + cpm_jit.TOTAL] = counts.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            st[start + K + cpm_jit.SUM_NLOGN] = np.where(counts > 0.0, counts * np.log(counts),
                                                         0.0).sum()
        st[start + K + cpm_jit.SINCE_EXACT] = 0.0
        st[start + K + cpm_jit.PLATT : start + size] = platt
    st[cpm_jit.TRIALS] = trials
    st[cpm_jit.SGD_STEPS] = t_new
    st[cpm_jit.DRAWS] = trials * (steps - 1.0)
    st[cpm_jit.N_ACTIVE] = 0.0 if binary else float(n_poly)
    # The replay window: the sources' most recent rows in turn, identical rows once, the newest
    # at the slot of the last trial.
    width = rows
    window = np.zeros((model.window if model.steps > 1 else 0, width))
    if model.steps > 1 and trials > 0:
        filled = int(min(trials, model.window))
        streams = []
        for i, m in enumerate(sources):
            t_i = int(m._st[cpm_jit.TRIALS])
            have_i = min(t_i, model.window)
            own = []
            for back in range(have_i):
                slot = (t_i - 1 - back) % model.window
                row = m._window[slot]
                code_i = int(row[0])
                label = bool(code_i) if binary else _labels_of(m)[code_i]
                if not binary and label not in labels:
                    continue
                aligned = columns.align(i, row)
                aligned[0] = code_i if binary else labels.index(label)
                own.append(aligned)
            streams.append(own)
        picked: list = []
        seen: set = set()
        depth = 0
        while len(picked) < filled and any(depth < len(s) for s in streams):
            for s in streams:
                if depth < len(s) and len(picked) < filled:
                    key = s[depth].tobytes()
                    if key not in seen:
                        seen.add(key)
                        picked.append(s[depth])
            depth += 1
        while picked and len(picked) < filled:  # (too few distinct rows: repeat them)
            picked.append(picked[len(picked) % max(len(seen), 1)])
        for back, row in enumerate(picked):
            window[(int(trials) - 1 - back) % model.window, : row.shape[0]] = row
    return ConvexPolytopeClassifier.from_state({
        "model": "ConvexPolytopeClassifier",
        "params": params,
        "features": _feature_state(columns),
        "arrays": {"_weights": G, "_window": window, "_st": st},
        "values": {"_encoded_labels": [] if binary else [state.encode_name(x) for x in labels]},
    })


# Wrappers -----------------------------------------------------------------------------------------


def _mix_members(label_models: list[tuple[typing.Any, float, bool]], mixing: _Mixing) -> typing.Any:
    """Mix (model, coefficient, is_base) entries that stand for one member."""
    base = next((m for m, _, is_base in label_models if is_base), None)
    members = [(m, c) for m, c, is_base in label_models if not is_base]
    if not members:
        return _copy(base)
    models = [m for m, _ in members]
    coefs = np.array([c for _, c in members])
    if base is None:
        if coefs.sum() <= 0:
            coefs = np.ones(len(models))
        return mix(models, coefs / coefs.sum())
    return mix(models, coefs, base=base)


def _mix_ovr(mixing: _Mixing) -> OneVsRestClassifier:
    sources = mixing.sources
    first = sources[0]
    for m in sources[1:]:
        if m.classifier._get_params() != first.classifier._get_params() or (
            type(m.classifier) is not type(first.classifier) or m.max_classes != first.max_classes
        ):
            raise ValueError("cannot mix one-vs-rest models of different members or params")
    labels: dict = {}
    for m in sources:
        for label in m.classifiers:
            labels.setdefault(label, None)
    out = OneVsRestClassifier(first.classifier.clone(), max_classes=first.max_classes)
    for label in list(labels)[: first.max_classes]:
        entries = [
            (m.classifiers[label], w, mixing.base is not None and j == 0)
            for j, (m, w) in enumerate(zip(sources, _member_weights(mixing)))
            if label in m.classifiers
        ]
        out.classifiers[label] = _mix_members(entries, mixing)
    return OneVsRestClassifier.from_state(out.to_state())


def _member_weights(mixing: _Mixing) -> list[float]:
    """The weight of each source as `mix` takes it (the base's unused)."""
    if mixing.base is None:
        return list(mixing.weights)
    return [0.0, *mixing.weights]


def _mix_auto(mixing: _Mixing) -> AutoClassifier:
    _same_params(mixing)
    sources = mixing.sources
    first = sources[0]
    labels: dict = {}
    for m in sources:
        for label in m._labels:
            labels.setdefault(label, None)
    out = AutoClassifier(**first._get_params())
    out._labels = list(labels)[: first.max_classes]
    mode = out._mode()
    weights = _member_weights(mixing)
    is_base = [mixing.base is not None and j == 0 for j in range(len(sources))]
    members: dict = {}
    for index, name in enumerate(PORTFOLIO):
        if index == PORTFOLIO.index("ConvexPolytopeClassifier"):
            entries = [(m.members[name], w, b) for m, w, b in zip(sources, weights, is_base)]
            members[name] = _mix_members(entries, mixing)
            continue
        if mode == BINARY:
            # A copy whose labels play the same roles (the same one learnt as True).
            entries = [
                (m.members[name], w, b) for m, w, b in zip(sources, weights, is_base)
                if m._mode() == BINARY and all(m._target(x) == out._target(x) for x in m._labels)
            ]
            members[name] = _mix_members(entries, mixing) if entries else (
                first.members[name].clone()
            )
        elif mode == ONE_VS_REST:
            ovr = OneVsRestClassifier(first.members[name].clone() if first._mode() == BINARY
                                      else first.members[name].classifier.clone(),
                                      max_classes=first.max_ovr_classes)
            for label in out._labels:
                entries = []
                for m, w, b in zip(sources, weights, is_base):
                    member = m.members[name]
                    if m._mode() == ONE_VS_REST and label in member.classifiers:
                        entries.append((member.classifiers[label], w, b))
                    elif m._mode() == BINARY and m._positive_label() == label:
                        entries.append((member, w, b))
                ovr.classifiers[label] = (_mix_members(entries, mixing) if entries
                                          else ovr.classifier.clone())
            members[name] = ovr
        else:
            members[name] = None
    scores = mixing.mean([np.array(m._scores, dtype=np.float64) for m in sources])
    scores[:, 0] = np.minimum(scores[:, 0], scores[:, 1])
    replay = None
    if mode == BINARY and first.max_ovr_classes > 2:
        # The records kept for the switch to one-vs-rest: the heaviest copy's, relabelled.
        donor = max((m for m in sources if m._replay is not None),
                    key=lambda m: mixing.convex[sources.index(m)], default=None)
        buffer = ReplayBuffer()
        if donor is not None:
            for x, index in donor._replay.records():
                buffer.add(x, out._labels.index(donor._labels[index]))
        replay = buffer.to_state()
    return AutoClassifier.from_state({
        "model": "AutoClassifier",
        "params": first._get_params(),
        "labels": [state.encode_name(label) for label in out._labels],
        "members": [None if members[name] is None else members[name].to_state()
                    for name in PORTFOLIO],
        "scores": np.ascontiguousarray(scores),
        "replay": replay,
    })


def mix_member(model: AutoClassifier, name: str, copies: typing.Sequence[typing.Any],
               weights: typing.Sequence[float]) -> None:
    """Replace `model`'s member `name`, in place, by the weighted mean (`mix`) of it and
    `copies`: the same member of copies of `model` (the same params) whose labels played the
    same roles (`AutoClassifier.member_roles`, which the caller compares: a member alone does not
    say what its True stood for). `weights[0]` is `model`'s own member's. The other members, the
    scores and the labels stay as they are, and are not copied: a topic-scope worker mixes the
    member it serves this way when its whole model is beyond the model topic's bytes budget
    (connectors/worker/model_scope.py), where a whole mix would copy and check every member
    again: on the hyperplane, 112 ms for three whole models of 2,700 records each, against
    1.4 ms for their ALMAs alone.

    Raises `ValueError` if `model` is not an AutoClassifier, `name` not one of its members
    taking part, or for copies `mix` refuses."""
    if not isinstance(model, AutoClassifier) or name not in PORTFOLIO:
        raise ValueError(f"mix_member mixes a member of an AutoClassifier, not {name!r:.80} of "
                         f"a {type(model).__name__}")
    own = model.members[name]
    if own is None:
        raise ValueError(f"{name} takes no part in this AutoClassifier (beyond max_ovr_classes)")
    model.members[name] = mix([own, *copies], weights)


# Scalers and pipelines ----------------------------------------------------------------------------


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def _pool(stats: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
          base: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> tuple:
    """Pooled (count, mean, M2) per feature (arrays over one name order), exactly: the parallel
    form of Welford's algorithm (Chan, Golub & LeVeque 1979). With `base`, each copy's statistics
    are the base's plus those of its records since, and the pool is the base's plus all those."""
    if base is not None:
        b_n, b_mean, b_m2 = base
        deltas = []
        for n, mean, m2 in stats:
            # the records since the base: the pooling run backwards
            d_n = np.maximum(n - b_n, 0.0)
            d_mean = _ratio(n * mean - b_n * b_mean, d_n)
            d_m2 = m2 - b_m2 - _ratio(b_n * d_n, n) * (d_mean - b_mean) ** 2
            deltas.append((d_n, d_mean, np.where(d_n > 0, np.maximum(d_m2, 0.0), 0.0)))
        stats = [base, *deltas]
    n_total = sum(n for n, _, _ in stats)
    mean = _ratio(sum(n * m for n, m, _ in stats), n_total)
    m2 = sum(m2_i + n * (m - mean) ** 2 for n, m, m2_i in stats)
    return n_total, mean, np.where(n_total > 0, np.maximum(m2, 0.0), 0.0)


def _scaler_stats(names: list, counts: dict, means: dict, variances: dict) -> tuple:
    n = np.array([counts.get(name, 0) for name in names], dtype=np.float64)
    mean = np.array([means.get(name, 0.0) for name in names], dtype=np.float64)
    m2 = np.array([variances.get(name, 0.0) for name in names], dtype=np.float64) * n
    return n, mean, m2


def _mix_scaler(mixing: _Mixing) -> StandardScaler:
    """This package's `StandardScaler`: pooled statistics (`_pool`) over the union of names, in
    the order of the sources, within `max_features` (names beyond pass through unscaled, as
    learning leaves them)."""
    sources = mixing.sources
    first = sources[0]
    if any(m.max_features != first.max_features for m in sources):
        raise ValueError("cannot mix StandardScalers with different max_features")
    names: dict = {}
    for m in sources:
        for name in m._columns:
            names.setdefault(name, None)
    names = list(names)[: first.max_features]
    stats = [_scaler_stats(names, m.counts, m.means, m.vars) for m in sources]
    base = stats[0] if mixing.base is not None else None
    n, mean, m2 = _pool(stats[1:] if base is not None else stats, base)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.where(n > 0, m2 / np.where(n > 0, n, 1), 0.0)
    counters = {}
    for key in first.counters:
        values = [m.counters[key] for m in sources]
        counters[key] = int(values[0] + sum(v - values[0] for v in values[1:])) if (
            mixing.base is not None) else int(sum(values))
        counters[key] = max(counters[key], 0)
    return StandardScaler.from_state({
        "scaler": "StandardScaler",
        "max_features": first.max_features,
        "names": [state.encode_name(name) for name in names],
        "counts": np.rint(n).astype(np.int64),
        "means": np.where(n > 0, mean, 0.0),
        "vars": np.where(n > 0, var, 0.0),
        "counters": counters,
    })


def _mix_river_scaler(mixing: _Mixing) -> typing.Any:
    """River's `preprocessing.StandardScaler` (with_std, no window): pooled statistics."""
    import collections

    sources = mixing.sources
    first = sources[0]
    if any(getattr(m, "window_size", None) is not None for m in sources):
        raise ValueError("cannot mix River StandardScalers with a window_size")
    names: dict = {}
    for m in sources:
        for name in m.counts:
            names.setdefault(name, None)
    names = list(names)
    stats = [_scaler_stats(names, m.counts, m.means, m.vars) for m in sources]
    base = stats[0] if mixing.base is not None else None
    n, mean, m2 = _pool(stats[1:] if base is not None else stats, base)
    out = first.clone()
    out.counts = collections.Counter({name: int(round(c)) for name, c in zip(names, n) if c > 0})
    out.means = collections.defaultdict(float, {
        name: float(v) for name, v, c in zip(names, mean, n) if c > 0
    })
    out.vars = collections.defaultdict(float, {
        name: float(m / c) for name, m, c in zip(names, m2, n) if c > 0
    })
    return out


def _mix_pipeline(mixing: _Mixing) -> typing.Any:
    from river import compose

    sources = mixing.sources
    keys = list(sources[0].steps)
    for m in sources[1:]:
        if list(m.steps) != keys:
            raise ValueError("cannot mix pipelines with different steps")
    steps = []
    for key in keys:
        members = [m.steps[key] for m in mixing.models]
        base = mixing.base.steps[key] if mixing.base is not None else None
        steps.append((key, mix(members, mixing.weights, base=base)))
    return compose.Pipeline(*[step for _, step in steps])


_MIXERS: tuple[tuple[type, typing.Callable[[_Mixing], typing.Any]], ...] = (
    (ALMAClassifier, _mix_alma),
    (BudgetKernelClassifier, _mix_kernel),
    (BudgetSVMClassifier, _mix_kernel),
    (SBPClassifier, _mix_kernel),
    (LinearMPUClassifier, _mix_kernel),
    (KernelMPUClassifier, _mix_kernel),
    (ConvexPolytopeClassifier, _mix_cpm),
    (OneVsRestClassifier, _mix_ovr),
    (AutoClassifier, _mix_auto),
    (StandardScaler, _mix_scaler),
)
