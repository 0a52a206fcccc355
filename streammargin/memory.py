"""The memory ceiling of every model, as a formula in its parameters.

Every model keeps its learnt state in numpy arrays whose sizes depend only on its parameters and
on how much of its bounds the stream has used: the feature columns (`max_features`, see
`streammargin.features`: names beyond it are hashed into shared columns, never stored), the
support vectors (`budget`, `window`) and, for the Convex Polytope Machine, the classes
(`max_classes`). So a model's memory has a ceiling that a formula gives before the model exists:

    memory_bound(model_or_class, params) =  arrays at their largest
                                          + n_exact x (MAX_NAME_BYTES + 1)     feature names
                                          + max_classes x (MAX_LABEL_BYTES + 1)  labels (CPM)
                                          + STATE_OVERHEAD                    header, params

with n_exact = max_features - max(1, max_features // 8) the columns that keep their name. It
bounds `memory_size(model)` (every array the model holds, plus the JSON its names and labels take
in a checkpoint) and the length of the model's checkpoint, `state.dumps(model.to_state())`. The
arrays at their largest, with C = reserved columns + max_features (8 bytes a float):

    ALMAClassifier             C x 3 x 8                                       (24 B a column)
    kernel models              (budget + extra rows) x C x 8                   support vectors
                               + budget-sized slots, Gram matrices and scratch rows
    LinearMPUClassifier        budget x C x 8 + C x 8 weights                  replay cache
    KernelMPUClassifier        budget x C x 8 + budget^2 x 8                   replay cache, Gram
    SBPClassifier              window x C x 8 + window^2 x 8                   window, Gram
    ConvexPolytopeClassifier   C x max_classes x n_faces x 8                   faces
                               + window x C x 8 (steps > 1)                    replay window

A checkpoint holds the arrays of `_state_arrays` only: the budget SVM's and the kernel MPU's Gram
matrices are recomputed on restore (so are the SBP's), so their checkpoints stay near the support
vectors' bytes while the process holds the matrix (counted here).

`memory_bound(cls)` gives each model's figure at its defaults (docs/models.md has the
table). A Python process holds more per stored name than its JSON (the str object, a list slot and
a dict entry: about 120 bytes plus the name's length), which the worker's RSS shows
(`benchmarks/memory_ceiling.py`); `stored_names` counts those names.

A multiclass model's arrays grow by the class (the CPM's polytopes, one-vs-rest's members,
`AutoClassifier`'s members and their form), so what it can hold depends on the classes it has
seen: `memory_bound(model, classes=k)` is its bound given that it holds k classes (at least 2,
at most its `max_classes`), the ceiling it stays under until a further class comes, and
`held_classes(model)` the k it holds now (None for a binary model, whose bound does not depend
on them). The Kafka worker charges each model that (`connectors/worker/memory_budget.py`): a
stream of two classes is charged two, not `max_classes`.

`from_state` refuses, with `StateError` and before it allocates anything, a state whose
parameters imply a bound above `max_bytes` (default `DEFAULT_MAX_STATE_BYTES`, 1 GiB): a
checkpoint read from a topic cannot make a worker allocate beyond what its parameters say. The
params are validated first (by the constructor, with nothing allocated), so the formula never
reads an inf, a bool or a string; then every saved array must fit within the bound's capacity.
"""

from __future__ import annotations

import functools
import inspect
import json
import numbers
import typing

import numpy as np

from streammargin.errors import StateError
from streammargin.features import MAX_NAME_BYTES, FeatureSpace, hashed_columns, name_json

__all__ = [
    "DEFAULT_MAX_STATE_BYTES",
    "MAX_LABEL_BYTES",
    "STATE_OVERHEAD",
    "check_state_bound",
    "classes_charged",
    "held_classes",
    "int_param",
    "memory_bound",
    "memory_size",
    "stored_names",
]

# The largest bound `from_state` accepts unless told otherwise.
DEFAULT_MAX_STATE_BYTES = 2**30
# The longest class label (CPM) in bytes of its JSON encoding; longer labels are refused.
MAX_LABEL_BYTES = 256
# What a checkpoint holds beyond arrays, names and labels: the JSON header's keys, the params and
# the arrays' specs. Measured at 1-2 KiB; the bound leaves room for long parameter values.
STATE_OVERHEAD = 16 * 1024


def int_param(params: dict, name: str, minimum: int = 0) -> int:
    """An integer parameter a bound depends on, or a `ValueError` (the formula needs a number)."""
    value = params.get(name)
    if not isinstance(value, (numbers.Integral, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r:.40}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
    return int(value)


@functools.cache
def init_parameters(cls: type) -> tuple[inspect.Parameter, ...]:
    """The parameters of `cls.__init__` but self, read once per class. Why: `inspect.signature`
    takes ~0.05-0.1 ms a call, and a model's params and defaults are asked for wherever a model
    is checked, copied or bounded (`memory_bound`, `to_state`, `from_state`, a mix; also
    `FeatureSpaceClassifier._get_params`, which River would read it for each call)."""
    return tuple(inspect.signature(cls.__init__).parameters.values())[1:]


def _class_and_params(model_or_class: typing.Any, params: dict | None) -> tuple[type, dict]:
    """The class and its full parameters: the model's own, or the class' defaults updated with
    `params` (unknown names raise `ValueError`)."""
    if isinstance(model_or_class, type):
        cls = model_or_class
        full = {p.name: p.default for p in init_parameters(cls)
                if p.default is not inspect.Parameter.empty}
    else:
        cls = type(model_or_class)
        full = model_or_class._get_params()
    if params:
        unknown = sorted(str(name) for name in params if name not in full)
        if unknown:
            raise ValueError(f"{cls.__name__} has no parameter {', '.join(unknown):.200}")
        full.update(params)
    return cls, full


def memory_bound(model_or_class: typing.Any, params: dict | None = None,
                 classes: int | None = None) -> int:
    """The most bytes a model of these parameters can hold, whatever it learns (see the module's
    docstring). `model_or_class`: a model (its own params, updated with `params`) or a class (its
    defaults, updated with `params`). `classes`: the classes a multiclass model holds (at least 2
    are counted, at most its `max_classes`): its bound until a further class comes; None, its
    ceiling. A binary model's bound does not depend on it. Raises `ValueError` for parameters the
    formula cannot read.

    >>> import streammargin
    >>> from streammargin.memory import memory_bound
    >>> round(memory_bound(streammargin.ALMAClassifier) / 2**20, 2)  # MiB
    8.57
    >>> memory_bound(streammargin.BudgetPerceptron, {"budget": 100, "max_features": 100})
    166912
    >>> model = streammargin.BudgetPerceptron(budget=100, max_features=100)
    >>> memory_bound(model) == memory_bound(model, {"budget": 100})
    True

    One-vs-rest holds a member per class: two classes seen, two members' bounds.

    >>> ovr = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier(), max_classes=100)
    >>> round(memory_bound(ovr) / 2**20), round(memory_bound(ovr, classes=2) / 2**20, 1)
    (856, 17.1)

    """
    if classes is not None and classes < 0:
        raise ValueError(f"classes must be >= 0, got {classes}")
    own = getattr(model_or_class, "_memory_bound", None)
    if own is not None:  # a wrapper: its bound is made of its members' bounds
        if isinstance(model_or_class, type) and getattr(own, "__self__", None) is None:
            # a class whose bound is a method of its models: a model of its defaults and `params`
            # (a classmethod, e.g. MPUClassifier's, takes the params itself)
            try:
                model_or_class = model_or_class(**(params or {}))
            except TypeError as error:  # e.g. a wrapper without the model it wraps
                raise ValueError(f"{model_or_class.__name__}: {error}") from None
            params, own = None, model_or_class._memory_bound
        if classes is not None and getattr(model_or_class, "_multiclass", False):
            return own(params, classes=classes)
        return own(params)
    cls, params = _class_and_params(model_or_class, params)
    max_features = int_param(params, "max_features", minimum=1)
    n_exact = max_features - hashed_columns(max_features)
    if classes is not None and cls._max_labels(params) > 0:  # a natively multiclass model
        params["max_classes"] = classes_charged(int_param(params, "max_classes", 2), classes)
    labels = cls._max_labels(params) * (MAX_LABEL_BYTES + 1)
    return (
        cls._max_array_bytes(params)
        + n_exact * (MAX_NAME_BYTES + 1)
        + labels
        + STATE_OVERHEAD
    )


def stored_names(model_or_class: typing.Any, params: dict | None = None,
                 classes: int | None = None) -> int:
    """The most feature names a model of these parameters stores by name, over its feature
    spaces (a wrapper's members each keep theirs): n_exact a feature space, given the `classes`
    a multiclass model holds as in `memory_bound`. `memory_bound` counts each as its JSON; a
    Python process holds each as a str object and a dict and a list entry besides (the Kafka
    worker's `NAME_OBJECT_BYTES`).

    >>> import streammargin
    >>> stored_names(streammargin.ALMAClassifier)
    57344
    >>> ovr = streammargin.OneVsRestClassifier(streammargin.ALMAClassifier(max_features=1024))
    >>> stored_names(ovr, classes=3), stored_names(ovr)
    (2688, 89600)

    """
    if isinstance(model_or_class, type) and hasattr(model_or_class, "_memory_bound"):
        # (a wrapper, or a name of several forms such as MPUClassifier: a model of the params)
        try:
            model_or_class = model_or_class(**(params or {}))
        except TypeError as error:
            raise ValueError(f"{model_or_class.__name__}: {error}") from None
        params = None
    own = getattr(model_or_class, "_stored_names", None)
    if own is not None:  # a wrapper: its members' names
        return own(params, classes=classes)
    cls, params = _class_and_params(model_or_class, params)
    max_features = int_param(params, "max_features", minimum=1)
    return max_features - hashed_columns(max_features)


def classes_charged(max_classes: int, classes: int) -> int:
    """The classes a bound counts for a model that holds `classes` of at most `max_classes`: at
    least 2 (a binary stream has two), at most `max_classes`."""
    return min(max_classes, max(2, classes))


def held_classes(model: typing.Any) -> int | None:
    """How many classes a multiclass model holds now (what `memory_bound(model, classes=...)`
    takes); None for a binary model. Read from the model's own label list: no copy.

    >>> import streammargin
    >>> cpm = streammargin.ConvexPolytopeClassifier()
    >>> held_classes(cpm), held_classes(streammargin.ALMAClassifier())
    (0, None)
    >>> cpm.learn_one({"a": 1.0}, "cat"); cpm.learn_one({"a": -1.0}, "dog")
    >>> held_classes(cpm)
    2

    """
    if not getattr(model, "_multiclass", False):
        return None
    held = getattr(model, "_classes_held", None)
    return held if isinstance(held, int) else None


def check_state_bound(cls: type, params: typing.Any, max_bytes: int) -> None:
    """Raise `StateError` if a saved state's `params` are unreadable or imply a bound above
    `max_bytes`: what `from_state` runs once the constructor validated the params (with nothing
    allocated), before anything else of the state is read."""
    if not isinstance(params, dict) or not all(isinstance(name, str) for name in params):
        raise StateError(f"the params of a saved {cls.__name__} are not a dict of names")
    try:
        bound = memory_bound(cls, params)
    except (ValueError, TypeError) as error:
        raise StateError(f"the params of a saved {cls.__name__}: {error}") from None
    if bound > max_bytes:
        raise StateError(
            f"a saved {cls.__name__} with these params may hold up to {bound:,} bytes, above the "
            f"limit of {max_bytes:,}: pass a larger max_bytes to from_state if this is expected"
        )


def memory_size(model: typing.Any) -> int:
    """What `memory_bound` bounds (less `STATE_OVERHEAD`): the bytes of every numpy array the model
    holds, plus the JSON its stored feature names (and labels) take in a checkpoint."""
    own = getattr(model, "_memory_size", None)
    if own is not None:  # a wrapper: its members' sizes
        return own()
    model._flush()  # a deferred learning step (ALMA's) first
    arrays = sum(value.nbytes for value in vars(model).values() if isinstance(value, np.ndarray))
    space: FeatureSpace = model._features
    names = sum(len(name_json(name)) + 1 for name in space.names)
    # The labels a checkpoint stores (`_encoded_labels`: a binary model's False/True are not).
    labels = sum(
        len(json.dumps(encoded, separators=(",", ":"))) + 1
        for encoded in getattr(model, "_encoded_labels", ())
    )
    return arrays + names + labels
