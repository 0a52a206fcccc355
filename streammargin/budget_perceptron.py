"""Kernel perceptrons on a budget: Random Budget Perceptron, Forgetron, Crammer-Kandola-Singer,
BSGD-style merging and the Projectron, selected by `eviction`."""

from __future__ import annotations

import typing

import numpy as np

from streammargin import state, validation
from streammargin.base import check_max_features, check_range, check_whole
from streammargin.budget import BudgetKernelClassifier, served_row_entry_points, validate_budget
from streammargin.jit import budget as bjit
from streammargin.jit import budget_perceptron as bp_jit
from streammargin.jit import kernels as kjit

__all__ = ["BudgetPerceptron"]

MAX_MARGIN = 1e6  # margin / SCALE stays finite (SCALE >= 1e-60, see `jit.budget_perceptron`)


@state.register
class BudgetPerceptron(BudgetKernelClassifier):
    """Kernel perceptron whose support cache never holds more than `budget` vectors.

    The kernel perceptron predicts sign f(x), f = sum_i a_i K(s_i, .), and on a mistake,
    y f(x) <= 0, adds y K(x, .) to f, i.e. stores x as a support vector. With a `margin` beta > 0
    it also updates on margin errors, 0 < y f(x) <= beta, the update condition of Crammer,
    Kandola & Singer (2003): correct but unconfident predictions move f too. Its support grows
    with every update; on a budget something must give when the cache is full. `eviction` says
    what:

    - `"random"`: remove a support vector drawn uniformly at random, then add x: the Random
      Budget Perceptron (Cesa-Bianchi & Gentile 2006). Seeded by `seed`.
    - `"oldest"`: the self-tuned Forgetron (Dekel, Shalev-Shwartz & Singer 2008): shrink the
      whole hypothesis by the largest phi in (0, 1] that keeps the accumulated damage
      Q <= 15/32 M (M mistakes so far), then remove the oldest vector. Its mistake bound holds for
      K(x, x) <= 1, e.g. the RBF kernel.
    - `"smallest"`: remove the vector the hypothesis needs least, the one whose own margin
      without its term, y_i (f(s_i) - a_i K(s_i, s_i)), is the largest (Crammer, Kandola & Singer
      2003); x itself is a candidate, and is not stored if it wins.
    - `"merge"`: merge the vector of smallest |a| with the same-label vector that loses the least
      of f into one point between them (Wang, Crammer & Vucetic 2012, BSGD). RBF kernel only.
    - `"project"`: the Projectron (Orabona, Keshet & Caputo 2009): when phi(x) is within
      `projection_threshold` ||phi(x)|| of the span of the cache, add its projection (updating the
      coefficients of the stored vectors) instead of storing x; when the cache is full, always
      project. A margin error makes Projectron++'s update (same paper): f += tau y P phi(x), the
      projection only, with tau = min(l / ||P phi(x)||^2, 1, 2 (l - delta / eta) / ||P phi(x)||^2)
      for the loss l = beta - y f(x) and delta the relative distance of phi(x) to the span, and
      none unless l > delta / eta.

    The margins f(s_i) of the stored vectors that "oldest" and "smallest" need are cached and
    updated in O(budget) per change (see `streammargin.jit.budget`), so a trial costs one kernel
    row of the cache, plus one more on an eviction; memory is budget x features (plus a
    budget x budget inverse Gram matrix for "project"), never more.

    Which policy? On Bananas (budget 200, `benchmarks/kernel_models.py`): "random" 0.85,
    "oldest" 0.86, "smallest" 0.66, "merge" 0.88, "project" 0.88 and "project" with
    `average=True` 0.89 (with 51 support vectors). "smallest" keeps the vectors the others
    misclassify, which under label noise are the mislabelled ones: it suits clean data only.
    "project" keeps an old vector's contribution for ever, so it follows drift badly (0.78 on a
    drifting RandomRBF stream, against 0.91 for "oldest"). The default, "merge", had the best
    mean accuracy over the ten streams of `benchmarks/model_selection.py --section margin`
    (gamma "auto", margin 1): 0.904, against 0.883 for "oldest" (the Forgetron, which forgets
    faster: 0.885 on the drifting RandomRBF stream, "merge" 0.825). "merge" needs the RBF
    kernel: pass another `eviction` with "poly" or "linear".

    Parameters
    ----------
    kernel
        `"rbf"` exp(-gamma ||a - b||^2), `"poly"` (gamma a.b + coef0)^degree or `"linear"` a.b.
    gamma
        Kernel width, a positive finite number, or `"auto"` (the default): 2 / (the sum of the
        features' variances), estimated from the first 64 records and then frozen (2 / d on d
        standardised features; see `streammargin.support.estimate_gamma`). The width in use is
        `gamma_`. A number suits a stream whose scale is known: 1.0 to 4.0 for Bananas' two
        standardised features, about 2 / d for d of them.
    degree
        Degree of the polynomial kernel, an integer in [1, 100].
    coef0
        Constant of the polynomial kernel, a finite number.
    budget
        Maximum number of support vectors, an integer in [1, 100000] (in [1, 10000] with
        `eviction="project"`, whose inverse Gram matrix holds budget x budget floats).
    eviction
        `"random"`, `"oldest"`, `"smallest"`, `"merge"` or `"project"` (see above).
    margin
        The margin beta of the update condition y f(x) <= beta, a real number in [0, 1e6]; 0 is
        the plain perceptron (updates on mistakes only). In units of f, where an update adds
        K(x, x) to y f(x): 1 for the RBF kernel, so the default beta = 1 updates until one
        update's margin is reached (Projectron++'s hinge at 1). Over the ten streams of
        `benchmarks/model_selection.py --section margin` it raised the mean accuracy from 0.881
        (margin 0) to 0.904, most on noisy streams (the 20-feature rotating hyperplane 0.809 ->
        0.874, Bananas 0.864 -> 0.886). Its cost is drift: every margin update adds weight that
        later mistakes must undo, and "merge" never forgets (the drifting RandomRBF 0.835 ->
        0.825; 0.797 -> 0.734 over 10,000 records of faster drift in
        `benchmarks/kernel_models.py`, where "oldest" gains, 0.862 -> 0.914). "smallest" loses
        with it (0.818 -> 0.807 in the mean).
    projection_threshold
        The Projectron's eta, relative, in [0, 1): project when the distance of phi(x) to the
        span of the cache is at most eta ||phi(x)||. Only used by `eviction="project"`.
    average
        Serve the averaged hypothesis (1/T) sum_t f_t instead of the last one (learning is the
        same). It keeps each cached vector's coefficient summed over the trials it survived, so
        an evicted vector takes its history with it: it helps "merge" and "project" on a
        stationary stream, and hurts the policies that evict all the time and drifting streams.
    seed
        Seed of the random stream of `eviction="random"`, an integer in [0, 2**53); `None`
        draws fresh entropy.

    max_features
        The bound on feature columns (see `streammargin.features`), an integer in [1, 2**30]: the
        first 7/8 of them go to the first names learnt, one each; later names (and names longer than
        128 bytes) share the last eighth by a stable hash of the name, and are not stored. Every
        support vector is a dense row of these columns, so memory stays below
        `streammargin.memory.memory_bound`: budget x max_features x 8 bytes plus budget-sized slots
        (and the Projectron's budget x budget inverse Gram matrix, and with gamma="auto" the first
        64 records until the width is frozen), 4.4 MiB at the defaults.

    Attributes
    ----------
    support_size : int
        Number of support vectors held, never more than `budget`.
    n_mistakes : int
        Mistakes made while learning (`counters["updates"]` minus the margin updates).
    counters : dict
        Support size, trials, updates (mistakes and margin errors), margin updates, evictions,
        merges and projections.

    Probabilities come from an online Platt scaling of f(x) (`streammargin.jit.calibration`);
    `decision_one(x)` is f(x) itself.

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    On a stationary stream the Projectron, serving the averaged hypothesis, needs few vectors:

    >>> model = preprocessing.StandardScaler() | streammargin.BudgetPerceptron(
    ...     budget=100, eviction="project", average=True
    ... )
    >>> evaluate.progressive_val_score(datasets.Bananas(), model, metrics.Accuracy())
    Accuracy: 89.64%

    >>> perceptron = model["BudgetPerceptron"]
    >>> perceptron.support_size, perceptron.n_mistakes, perceptron.counters["projections"]
    (52, 666, 1163)

    References
    ----------
    [^1]: Crammer, K., Kandola, J. and Singer, Y. (2003). Online classification on a budget.
    NIPS 16 (the margin beta).
    [^2]: Cesa-Bianchi, N. and Gentile, C. (2006). Tracking the best hyperplane with a simple
    budget perceptron. COLT.
    [^3]: Dekel, O., Shalev-Shwartz, S. and Singer, Y. (2008). The Forgetron: a kernel-based
    perceptron on a budget. SIAM Journal on Computing, 37(5), 1342-1372.
    [^4]: Orabona, F., Keshet, J. and Caputo, B. (2009). Bounded kernel-based online learning.
    JMLR, 10, 2643-2666 (the Projectron and Projectron++).
    [^5]: Wang, Z., Crammer, K. and Vucetic, S. (2012). Breaking the curse of kernelization:
    budgeted stochastic gradient descent for large-scale SVM training. JMLR, 13, 3103-3131.

    """

    _jit = bp_jit
    _layout = bp_jit.LAYOUT
    _entry_points = served_row_entry_points(bp_jit, "_gram_inv")

    def __init__(
        self,
        kernel: str = "rbf",
        gamma: float | str = "auto",
        degree: int = 3,
        coef0: float = 1.0,
        budget: int = 200,
        eviction: str = "merge",
        margin: float = 1.0,
        projection_threshold: float = 0.1,
        average: bool = False,
        seed: int | None = None,
        max_features: int = 2048,
    ):
        validate_budget(
            kernel, gamma, degree, coef0, budget, eviction, projection_threshold, average, seed
        )
        validation.real_in("margin", margin, 0.0, MAX_MARGIN)
        check_max_features(max_features)
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.budget = budget
        self.eviction = eviction
        self.margin = margin
        self.projection_threshold = projection_threshold
        self.average = average
        self.seed = seed
        self.max_features = int(max_features)
        self._reset()

    def _hyper_values(self) -> dict[int, float]:
        return {**super()._hyper_values(), bp_jit.UPDATE_MARGIN: float(self.margin)}

    @classmethod
    def _params_of_state(cls, params: dict) -> dict:
        # A state saved before the margin existed learnt on mistakes only: it continues so.
        return params if "margin" in params else {**params, "margin": 0.0}

    def _checked_arrays(self, arrays: typing.Any, n_columns: int, values: dict) -> dict:
        # A state saved before the slots margin and margin_updates (the last two, so its `st` is
        # two scalars short): no margin update happened; the margin slot is written from the
        # params (`_params_of_state`: 0) by `_check_restored`, as in any state.
        saved = self._state_short_by(arrays, bp_jit.STATE_SIZE, 2)
        if saved is not None:
            arrays = {**arrays, "_st": np.append(saved, [0.0, 0.0])}
        return super()._checked_arrays(arrays, n_columns, values)

    def _check_restored(self) -> None:
        """Beyond the budget cache's invariants, the effective coefficients SCALE a_i of the
        perceptron's rule: each update (a mistake or a margin error) adds one of 1, except
        Projectron++'s projections; "random" and "smallest" never change them (SCALE stays 1),
        the Forgetron only shrinks them, a merge adds two of them up. Margin updates are among
        the updates, and none without a margin."""
        super()._check_restored()
        st, slots = self._st, self._slots
        high = st[bjit.UPDATES] if self.margin > 0.0 else 0.0
        check_whole("margin updates", st[bp_jit.MARGIN_UPDATES], 0.0, high)
        size = int(st[kjit.ST_SIZE])
        coefs = slots[:size, kjit.COEF]
        if self.eviction in ("random", "smallest"):
            check_range("coefficient scale", st[bjit.SCALE], 1.0, 1.0)
            check_range("coefficients", coefs, 1.0, 1.0)
        elif self.eviction == "oldest":
            check_range("effective coefficients", coefs * st[bjit.SCALE], 0.0, 1.0 + 1e-9)
        elif self.eviction == "merge":
            bound = st[bjit.UPDATES] * (1.0 + 1e-9)
            check_range("effective coefficients", coefs * st[bjit.SCALE], 0.0, bound)

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {}
        yield {"eviction": "random", "budget": 3, "seed": 7, "margin": 0.5}
        yield {"eviction": "oldest", "budget": 4, "max_features": 4, "margin": 1.0}
        yield {"eviction": "smallest", "budget": 4, "kernel": "poly", "gamma": 0.5, "margin": 0.0}
        yield {"eviction": "merge", "budget": 4, "average": True, "margin": 0.0}
        yield {
            "eviction": "project",
            "budget": 4,
            "kernel": "linear",
            "projection_threshold": 0.3,
            "margin": 1.0,
        }

    # Inspection -----------------------------------------------------------------------------------

    @property
    def n_mistakes(self) -> int:
        """Mistakes made while learning (each one an update)."""
        return self.n_updates - self.n_margin_updates

    @property
    def n_margin_updates(self) -> int:
        """Updates on margin errors, 0 < y f(x) <= margin (Projectron++'s projections with
        `eviction="project"`)."""
        return int(self._st[bp_jit.MARGIN_UPDATES])

    @property
    def counters(self) -> dict[str, int]:
        return {**super().counters, "margin_updates": self.n_margin_updates}
