"""Kernel ALMA_2 (Gentile 2001) on a bounded support cache."""

from __future__ import annotations

import typing

from streammargin import state, validation
from streammargin.base import check_max_features
from streammargin.budget import BudgetKernelClassifier, served_row_entry_points, validate_budget
from streammargin.jit import budget as bjit
from streammargin.jit import kernel_alma as ka_jit

__all__ = ["KernelALMAClassifier"]

MIN_ALPHA = 1e-6  # alpha's lower bound: the margin scale 1 / alpha stays within MAX_SCALE
MAX_SCALE = 1e6  # upper bound of B and C


@state.register
class KernelALMAClassifier(BudgetKernelClassifier):
    """ALMA_2 with a kernel, in dual form, with at most `budget` support vectors.

    ALMA_2(alpha; B, C) (Gentile 2001) works on normalised instances; with a kernel the
    normalisation is in feature space, xh = phi(x) / sqrt(K(x, x)). With k the number of
    corrections so far plus one, a trial makes a *correction* when the margin is small,

        y w.xh <= (1 - alpha) B / sqrt(k):   w <- w + (C / sqrt(k)) y xh,
                                             w <- w / max(1, ||w||),   k <- k + 1,

    so the hypothesis stays in the unit ball of the kernel's feature space and approaches the
    maximal margin hypothesis within a factor 1 - alpha. w is a weighted sum of the stored
    instances' phi; its scale is kept lazily (the projection divides one number), and ||w|| comes
    from the cached margins of the stored vectors in O(budget) (`streammargin.jit.kernel_alma`).

    When the cache is full, a correction first makes room by `eviction` (see
    `streammargin.BudgetPerceptron` for the policies). The norm stays exact through every
    eviction, merge or projection, so the projection on the unit ball is always the paper's.
    `"oldest"` removes the oldest vector without the Forgetron's shrinking (ALMA's own projection
    keeps the hypothesis bounded). The defaults, `"merge"` and alpha = 0.5, had the best mean
    accuracy over 8 streams, drifting ones included (`benchmarks/model_selection.py`, gamma
    "auto"): 0.900, against 0.864 for "oldest" with alpha 0.9 (the former defaults) and 0.876
    for "oldest" with alpha 0.5; 0.866 on a 20-feature rotating hyperplane (0.774) and 0.883 on
    Bananas (0.839). "oldest" follows a drifting RandomRBF stream slightly better (0.876 at alpha
    0.5, against 0.846). "merge" needs the RBF kernel: pass another `eviction` with "poly" or
    "linear".

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
    alpha
        Degree of approximation to the maximal margin, in [1e-6, 1]; alpha = 1 makes a
        mistake-driven perceptron with a decreasing learning rate.
    B
        Margin scale in (0, 1e6]; `None` means 1 / alpha (the paper's experiments,
        ALMA_2(alpha)).
    C
        Learning-rate scale, in (0, 1e6].
    budget
        Maximum number of support vectors, an integer in [1, 100000] (in [1, 10000] with
        `eviction="project"`, whose inverse Gram matrix holds budget x budget floats).
    eviction
        `"random"`, `"oldest"`, `"smallest"`, `"merge"` (RBF) or `"project"`.
    projection_threshold
        Relative projection error, in [0, 1), under which `eviction="project"` projects instead
        of adding.
    average
        Serve the averaged hypothesis, the mean of the hypotheses after each trial restricted to
        the cached vectors (the paper's most accurate "voted" hypothesis, in bounded memory);
        learning still uses the last one. Helps "merge" and "project" on stationary streams.
    seed
        Seed of `eviction="random"`, an integer in [0, 2**53); `None` draws fresh entropy.

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
    n_corrections : int
        Number of corrections (k - 1).
    support_size : int
        Number of support vectors held, never more than `budget`.

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    >>> model = preprocessing.StandardScaler() | streammargin.KernelALMAClassifier()
    >>> evaluate.progressive_val_score(datasets.Bananas(), model, metrics.Accuracy())
    Accuracy: 88.23%

    >>> alma = model["KernelALMAClassifier"]
    >>> alma.n_corrections, alma.support_size, alma.counters["merges"]
    (1073, 200, 873)

    References
    ----------
    [^1]: Gentile, C. (2001). A new approximate maximal margin classification algorithm.
    Journal of Machine Learning Research, 2, 213-242.

    """

    _layout = ka_jit.LAYOUT
    _jit = ka_jit
    _entry_points = served_row_entry_points(ka_jit, "_gram_inv")

    def __init__(
        self,
        kernel: str = "rbf",
        gamma: float | str = "auto",
        degree: int = 3,
        coef0: float = 1.0,
        alpha: float = 0.5,
        B: float | None = None,
        C: float = 2**0.5,
        budget: int = 200,
        eviction: str = "merge",
        projection_threshold: float = 0.1,
        average: bool = False,
        seed: int | None = None,
        max_features: int = 2048,
    ):
        validate_budget(
            kernel, gamma, degree, coef0, budget, eviction, projection_threshold, average, seed
        )
        validation.real_in("alpha", alpha, MIN_ALPHA, 1.0)
        validation.optional(validation.positive_real, "B", B, MAX_SCALE)
        validation.positive_real("C", C, MAX_SCALE)
        check_max_features(max_features)
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.alpha = alpha
        self.B = B
        self.C = C
        self.budget = budget
        self.eviction = eviction
        self.projection_threshold = projection_threshold
        self.average = average
        self.seed = seed
        self.max_features = int(max_features)
        self._reset()

    def _tracks_margins(self) -> bool:
        return True  # ||w|| comes from the margins

    def _hyper_values(self) -> dict[int, float]:
        values = super()._hyper_values()
        values[ka_jit.ALPHA] = float(self.alpha)
        values[ka_jit.B] = 1.0 / self.alpha if self.B is None else float(self.B)
        values[ka_jit.C] = float(self.C)
        return values

    def _reset(self) -> None:
        super()._reset()
        self._st[ka_jit.K] = 1.0

    def _check_restored(self) -> None:
        """Beyond the budget cache's invariants: k = corrections + 1."""
        super()._check_restored()
        if self._st[ka_jit.K] != self._st[bjit.UPDATES] + 1.0:
            raise state.StateError("state field ALMA k must be the number of corrections + 1")

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {}
        yield {"eviction": "random", "budget": 3, "seed": 5, "kernel": "poly", "gamma": 0.5}
        yield {"eviction": "oldest", "budget": 4, "alpha": 1.0}
        yield {"eviction": "smallest", "budget": 4, "kernel": "linear"}
        yield {"eviction": "merge", "budget": 4, "alpha": 0.5, "max_features": 2}
        yield {"eviction": "project", "budget": 4, "projection_threshold": 0.3, "average": True}

    # Inspection -----------------------------------------------------------------------------------

    @property
    def n_corrections(self) -> int:
        return int(self._st[ka_jit.K]) - 1
