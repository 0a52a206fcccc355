"""One-vs-rest: any binary streammargin model on a stream of many classes, in bounded memory."""

from __future__ import annotations

import json
import typing

import numpy as np
from river import base

from streammargin import state, validation
from streammargin.base import frame_values, plain_label
from streammargin.errors import InvalidInput, StateError
from streammargin.features import describe_bad_values

__all__ = ["OneVsRestClassifier"]

#: The largest `max_classes` (each class costs one copy of the wrapped model).
MAX_CLASSES = 10_000

_STATE_KEYS = ("model", "params", "classifier", "labels", "members")


@state.register
class OneVsRestClassifier(base.Wrapper, base.MiniBatchClassifier):
    """One-vs-rest: one copy of a binary model per class, each learning "this class or not".

    The same strategy as River's `multiclass.OneVsRestClassifier`, for streammargin's binary
    models, with what a stream processor needs on top: a bound on the number of classes, a safe
    state (no pickle) that `streammargin.from_state` restores, and `counters`.

    A class gets its member, a clone of `classifier`, the first time its label is learnt; from
    then on every labelled example trains every member, the member of its label on True and the
    others on False (a member never sees the examples that came before its class). Labels may be
    str, int, bool, float or tuples of them, kept as given (None and NaN are refused; as in a
    Python dict, 1, 1.0 and True are one class).

    `predict_proba_one` is River's: the members' calibrated probabilities of True
    (`predict_proba_one(x)[True]`), divided by their sum (uniform if they are all 0);
    `predict_one` is the class of highest probability (the first one seen on a tie), None
    before any learning.

    Memory: at most `max_classes` members, each within the wrapped model's own bound, so the
    bound is `max_classes` x the member's bound (plus one label per class); having seen k
    classes, k members (`streammargin.memory.memory_bound(model, classes=k)`). A label beyond
    `max_classes` classes raises `streammargin.InvalidInput` and leaves the model as it was, so a
    stream with unexpected labels (a misrouted topic, an id in the label field) cannot grow it
    without limit.

    `learn_many` equals `learn_one` row by row (a class first seen in row r gets a member that
    learns from row r on), unlike River's one-vs-rest, whose new members learn the whole batch.

    Parameters
    ----------
    classifier
        A binary streammargin model (a registered class whose `_multiclass` is False), used as a
        prototype: each class gets a fresh clone with its parameters.
    max_classes
        The most classes the model takes, in [2, 10000].

    Attributes
    ----------
    classifiers : dict
        Label -> the member model of that class, in the order the labels were first seen.

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    ImageSegments has seven classes; ALMA is binary. One-vs-rest ALMA scores as the natively
    multiclass ConvexPolytopeClassifier (88.39%) and well above River's one-vs-rest
    LogisticRegression (79.60% accuracy, 77.46% macro F1):

    >>> model = preprocessing.StandardScaler() | streammargin.OneVsRestClassifier(
    ...     streammargin.ALMAClassifier()
    ... )
    >>> evaluate.progressive_val_score(
    ...     datasets.ImageSegments(), model, metrics.Accuracy() + metrics.MacroF1()
    ... )
    Accuracy: 88.48%
    MacroF1: 88.50%

    >>> ovr = model["OneVsRestClassifier"]
    >>> list(ovr.classifiers)
    ['path', 'foliage', 'sky', 'grass', 'brickface', 'cement', 'window']
    >>> ovr.counters
    {'classes': 7, 'corrections': 1200, 'trials': 16133, 'features': 126, 'features_hashed': 0}

    Its state restores a model that predicts and learns identically:

    >>> twin = streammargin.from_state(
    ...     streammargin.state.loads(streammargin.state.dumps(ovr.to_state()))
    ... )
    >>> x, y = next(iter(datasets.ImageSegments()))
    >>> x = model["StandardScaler"].transform_one(x)
    >>> twin.predict_proba_one(x) == ovr.predict_proba_one(x)
    True

    """

    def __init__(self, classifier: base.Classifier, max_classes: int = 100):
        _check_prototype(classifier)
        self.classifier = classifier
        self.max_classes = int(validation.integer_in("max_classes", max_classes, 2, MAX_CLASSES))
        self.classifiers: dict[typing.Any, typing.Any] = {}

    @property
    def _wrapped_model(self) -> typing.Any:
        return self.classifier

    @property
    def _multiclass(self) -> bool:
        return True

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        from streammargin.alma import ALMAClassifier
        from streammargin.budget_perceptron import BudgetPerceptron

        yield {"classifier": ALMAClassifier()}
        # River's checker runs ImageSegments (7 classes): max_classes must take them.
        yield {"classifier": BudgetPerceptron(eviction="oldest", budget=4), "max_classes": 7}

    # Labels -------------------------------------------------------------------------------------

    def _new_label(self, y: typing.Any, n_new: int = 1) -> typing.Any:
        """`y` as a plain label, validated, with room for it (`n_new` new labels in all)."""
        label = plain_label(y)
        if len(self.classifiers) + n_new > self.max_classes:
            raise InvalidInput(
                f"label {label!r:.80} would be class {len(self.classifiers) + n_new}, beyond "
                f"max_classes={self.max_classes}; raise max_classes if the stream has more classes"
            )
        return label

    # River API ----------------------------------------------------------------------------------

    def _known(self, y: typing.Any) -> tuple[typing.Any, bool]:
        """`y` as a plain Python value (a numpy scalar's item), and whether it is a class."""
        if isinstance(y, np.generic):
            y = y.item()
        try:
            return y, y in self.classifiers
        except TypeError:  # unhashable: _new_label refuses it
            return y, False

    def learn_one(self, x: dict, y: typing.Any, **kwargs: typing.Any) -> None:
        y, known = self._known(y)
        new = None
        if not known:
            y = self._new_label(y)
            new = self.classifier.clone()
        # The first member validates x before it changes anything (every member validates alike),
        # so a refused example leaves every member, and the label list, as they were.
        for label, member in self.classifiers.items():
            member.learn_one(x, y == label)
        if new is not None:
            new.learn_one(x, True)
            self.classifiers[y] = new

    def _positive_probabilities(self, x: dict) -> dict:
        """Each member's `predict_proba_one(x)[True]` (`MarginClassifier._p_true`: no dict)."""
        return {label: member._p_true(x) for label, member in self.classifiers.items()}

    def predict_proba_one(self, x: dict, **kwargs: typing.Any) -> dict:
        if not self.classifiers:
            describe_bad_values(x)  # refuse a bad x even before any class exists
            return {}
        return _normalised(self._positive_probabilities(x))

    def predict_one(self, x: dict, **kwargs: typing.Any) -> typing.Any:
        proba = self.predict_proba_one(x)
        return max(proba, key=proba.get) if proba else None

    def _predict_then_learn(self, x: dict, y: typing.Any) -> typing.Any:
        """`predict_one(x)` as it is before learning, then `learn_one(x, y)`: AutoClassifier's
        call for a labelled record. With a known label each member predicts and learns in one
        call (`MarginClassifier._proba_then_learn`), and no member's probability dict is built;
        the first member validates x before anything changes, as in `learn_one`."""
        y, known = self._known(y)
        if not known:  # a new class, or a label learn_one refuses: the two calls
            label = self.predict_one(x)
            self.learn_one(x, y)
            return label
        return _most_probable([
            (label, member._proba_then_learn(x, y == label))
            for label, member in self.classifiers.items()
        ])

    def decision_one(self, x: dict, **kwargs: typing.Any) -> dict:
        """Each member's raw score (its sign is that member's "this class or not")."""
        if not self.classifiers:
            describe_bad_values(x)
        return {label: member.decision_one(x) for label, member in self.classifiers.items()}

    # Mini-batches -------------------------------------------------------------------------------

    def learn_many(self, X: typing.Any, y: typing.Any, **kwargs: typing.Any) -> None:
        """`learn_one` over the rows of a DataFrame in order; refused rows change nothing."""
        labels = [label.item() if isinstance(label, np.generic) else label for label in y]
        if len(labels) != len(X):
            raise InvalidInput(f"X has {len(X)} rows but y has {len(labels)} labels")
        first_row: dict = {}  # new label -> the row it first appears in
        for row, label in enumerate(labels):
            try:
                known = label in self.classifiers or label in first_row
            except TypeError:
                known = False
            if not known:
                first_row[self._new_label(label, len(first_row) + 1)] = row
        members = list(self.classifiers.items())
        if not members and not first_row:
            frame_values(X)  # an empty batch before any class: still refuse bad values
            return
        for label, member in members:  # the first one validates X before anything changes
            member.learn_many(X, np.array([y_ == label for y_ in labels], dtype=bool))
        added = {}
        for label, row in first_row.items():
            member = self.classifier.clone()
            member.learn_many(
                X.iloc[row:], np.array([y_ == label for y_ in labels[row:]], dtype=bool)
            )
            added[label] = member
        self.classifiers.update(added)

    def _probability_rows(self, X: typing.Any) -> np.ndarray:
        """Normalised class probabilities of the rows of X, columns in `classifiers` order."""
        if not self.classifiers:
            frame_values(X)
            return np.empty((len(X), 0))
        votes = np.column_stack(
            [
                member.predict_proba_many(X)[True].to_numpy(dtype=np.float64)
                for member in self.classifiers.values()
            ]
        )
        total = np.zeros(len(X))
        for column in votes.T:  # summed in the order of predict_proba_one: the same bits
            total += column
        uniform = np.full_like(votes, 1.0 / votes.shape[1])
        nonzero = total != 0.0
        proba = np.divide(votes, total[:, None], out=uniform, where=nonzero[:, None])
        return proba

    def predict_proba_many(self, X: typing.Any, **kwargs: typing.Any) -> typing.Any:
        import pandas as pd

        proba = self._probability_rows(X)
        return pd.DataFrame(proba, index=X.index, columns=list(self.classifiers))

    def predict_many(self, X: typing.Any, **kwargs: typing.Any) -> typing.Any:
        import pandas as pd

        proba = self._probability_rows(X)
        if not self.classifiers:
            return pd.Series([None] * len(X), index=X.index, dtype=object)
        labels = list(self.classifiers)
        return pd.Series([labels[i] for i in np.argmax(proba, axis=1)], index=X.index)

    # Monitoring ---------------------------------------------------------------------------------

    @property
    def counters(self) -> dict[str, int]:
        """The number of classes and the members' counters, summed (the Kafka worker's metrics)."""
        totals = {"classes": len(self.classifiers)}
        for name in getattr(self.classifier, "counters", {}):  # the keys, even before a class
            totals[name] = 0
        for member in self.classifiers.values():
            for name, value in getattr(member, "counters", {}).items():
                totals[name] = totals.get(name, 0) + value
        return totals

    # Memory -------------------------------------------------------------------------------------

    @classmethod
    def _class_bound(cls, member_cls: type, member_params: dict, max_classes: int) -> int:
        """max_classes members within their own bound, one label each, one header."""
        from streammargin import memory

        member = memory.memory_bound(member_cls, member_params) - memory.STATE_OVERHEAD
        return (
            max_classes * (member + memory.MAX_LABEL_BYTES + 1) + memory.STATE_OVERHEAD
        )

    def _memory_bound(self, params: dict | None = None, classes: int | None = None) -> int:
        """`streammargin.memory.memory_bound` of this model (its params updated with `params`):
        `max_classes` members, or given the `classes` it holds that many (at least 2)."""
        from streammargin import memory

        chosen = {"classifier": self.classifier, "max_classes": self.max_classes, **(params or {})}
        classifier = chosen["classifier"]
        members = int(chosen["max_classes"])
        if classes is not None:
            members = memory.classes_charged(members, classes)
        return self._class_bound(type(classifier), classifier._get_params(), members)

    @property
    def _classes_held(self) -> int:
        """How many classes the model holds (`streammargin.memory.held_classes`)."""
        return len(self.classifiers)

    def _stored_names(self, params: dict | None = None, classes: int | None = None) -> int:
        """`streammargin.memory.stored_names`: each member's, as `_memory_bound` counts them."""
        from streammargin import memory

        chosen = {"classifier": self.classifier, "max_classes": self.max_classes, **(params or {})}
        classifier = chosen["classifier"]
        members = int(chosen["max_classes"])
        if classes is not None:
            members = memory.classes_charged(members, classes)
        return members * memory.stored_names(type(classifier), classifier._get_params())

    def _memory_size(self) -> int:
        """`streammargin.memory.memory_size`: the members' sizes and the labels' JSON."""
        from streammargin import memory
        from streammargin.features import name_json

        labels = sum(len(name_json(label)) + 1 for label in self.classifiers)
        return labels + sum(memory.memory_size(m) for m in self.classifiers.values())

    # Safe state ---------------------------------------------------------------------------------

    def to_state(self) -> dict:
        """The wrapped model's class and parameters, the labels and each member's own state."""
        prototype = self.classifier.clone().to_state()
        return {
            "model": type(self).__name__,
            "params": {"max_classes": self.max_classes},
            "classifier": {"model": prototype["model"], "params": prototype["params"]},
            "labels": [state.encode_name(label) for label in self.classifiers],
            "members": [member.to_state() for member in self.classifiers.values()],
        }

    @classmethod
    def from_state(cls, data: typing.Any, max_bytes: int | None = None) -> OneVsRestClassifier:
        """Rebuild a model from `to_state()`; `StateError` for anything malformed.

        Everything is checked before the members are restored: the fields, `max_classes`, the
        wrapped class (a registered binary model, not a wrapper), the labels (valid, distinct, at
        most `max_classes`, one per member), and that every member is of the wrapped class with
        the wrapped parameters. Each member is then restored by its own class' `from_state`.
        """
        if type(data) is not dict or data.get("model") != cls.__name__:
            name = data.get("model") if type(data) is dict else None
            raise StateError(f"state of {name!r} cannot restore a {cls.__name__}")
        if set(data) != set(_STATE_KEYS):
            raise StateError(f"{cls.__name__} state: expected the fields {sorted(_STATE_KEYS)}")
        params = data["params"]
        if type(params) is not dict or set(params) != {"max_classes"}:
            raise StateError(f"{cls.__name__} state: params must be {{'max_classes': n}}")
        max_classes = params["max_classes"]
        if type(max_classes) is not int or not 2 <= max_classes <= MAX_CLASSES:
            raise StateError(
                f"{cls.__name__} state: max_classes must be an int in [2, {MAX_CLASSES}]"
            )
        wrapped = data["classifier"]
        if type(wrapped) is not dict or set(wrapped) != {"model", "params"}:
            raise StateError(f"{cls.__name__} state: classifier must be {{'model', 'params'}}")
        member_cls = state.registered_models().get(wrapped["model"]) if type(
            wrapped["model"]
        ) is str else None
        if member_cls is None or member_cls is cls:
            raise StateError(
                f"{cls.__name__} state: the wrapped model {wrapped['model']!r:.80} is not a "
                "registered binary model"
            )
        if type(wrapped["params"]) is not dict:
            raise StateError(f"{cls.__name__} state: the wrapped model's params must be an object")
        # The params as the constructor takes them (a state saved before a parameter existed:
        # `FeatureSpaceClassifier._params_of_state`), for the prototype and the members alike.
        params_of_state = getattr(member_cls, "_params_of_state", lambda params: params)
        wrapped_params = params_of_state(wrapped["params"])
        # The bound first: nothing is built for params that imply too much memory.
        from streammargin import memory

        limit = memory.DEFAULT_MAX_STATE_BYTES if max_bytes is None else max_bytes
        try:
            bound = cls._class_bound(member_cls, wrapped_params, max_classes)
        except (ValueError, TypeError) as error:
            raise StateError(f"{cls.__name__} state: the wrapped model's params: {error}") from None
        if bound > limit:
            raise StateError(
                f"a saved {cls.__name__} with these params may hold up to {bound:,} bytes, above "
                f"the limit of {limit:,}: pass a larger max_bytes to from_state if this is expected"
            )
        try:
            prototype = member_cls(**wrapped_params)
            _check_prototype(prototype)
        except (TypeError, ValueError) as error:  # the constructor's own validation
            raise StateError(f"{cls.__name__} state: bad wrapped model: {error}") from None
        labels, members = data["labels"], data["members"]
        if type(labels) is not list or type(members) is not list or len(labels) != len(members):
            raise StateError(
                f"{cls.__name__} state: labels and members must be lists of one length"
            )
        if len(labels) > max_classes:
            raise StateError(f"{cls.__name__} state: {len(labels)} classes, beyond max_classes")
        decoded = []
        for encoded in labels:
            label = state.decode_name(encoded)
            try:
                label = plain_label(label)
            except InvalidInput as error:
                raise StateError(f"{cls.__name__} state: {error}") from None
            decoded.append(label)
        if len(set(decoded)) != len(decoded):
            raise StateError(f"{cls.__name__} state: a label appears twice")
        # The members are clones of the prototype: same class, same parameters. A public name
        # that builds another class (MPUClassifier, `_forms`) is a state saved before that name
        # became one: its members carry that name and the params the wrapper saved, and its
        # `from_state` restores each as the class it builds.
        if type(prototype) is member_cls:
            expected_params = json.loads(json.dumps(prototype._get_params()))
        else:
            expected_params = wrapped_params
        for member_state in members:
            if (
                type(member_state) is not dict
                or member_state.get("model") != wrapped["model"]
                or type(member_state.get("params")) is not dict
                or params_of_state(member_state["params"]) != expected_params
            ):
                raise StateError(
                    f"{cls.__name__} state: every member must be a {wrapped['model']} with the "
                    "wrapped model's parameters"
                )
        model = cls(prototype, max_classes)
        for label, member_state in zip(decoded, members):
            model.classifiers[label] = state.restore_member(
                member_cls, member_state, limit, f"{cls.__name__} state: member {label!r:.80}"
            )
        return model


def _normalised(votes: dict) -> dict:
    """The members' probabilities of True divided by their sum (uniform if they are all 0)."""
    total = 0.0
    for p in votes.values():
        total += p
    if total:
        return {label: p / total for label, p in votes.items()}
    return {label: 1.0 / len(votes) for label in votes}


def _most_probable(votes: list[tuple[typing.Any, float]]) -> typing.Any:
    """`predict_one`'s label from (label, probability of True) in member order, without the
    dicts: the first label of the highest `_normalised` probability."""
    total = 0.0  # (summed in the order of `_normalised`: the same bits)
    for _, p_true in votes:
        total += p_true
    if not total:  # uniform: the first label
        return votes[0][0]
    best, best_p = votes[0][0], -1.0
    for label, p_true in votes:
        p = p_true / total
        if p > best_p:
            best, best_p = label, p
    return best


def _check_prototype(classifier: typing.Any) -> None:
    """`classifier` must be an instance of a registered binary streammargin model."""
    registered = state.registered_models()
    cls = type(classifier)
    if registered.get(cls.__name__) is not cls or cls is OneVsRestClassifier:
        raise ValueError(
            f"classifier must be an instance of a binary streammargin model, got "
            f"{cls.__qualname__}; for a River model use river.multiclass.OneVsRestClassifier"
        )
    if classifier._multiclass:
        raise ValueError(
            f"{cls.__name__}({classifier._get_params()}) is multiclass already: use it directly"
        )
