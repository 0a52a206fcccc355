"""A classifier that picks its own model: a small portfolio scored by progressive validation."""

from __future__ import annotations

import copy
import json
import math
import typing

import numpy as np
from river import base

from streammargin import replay, state, validation
from streammargin.alma import ALMAClassifier
from streammargin.base import binary_target, check_max_features, frame_values, plain_label
from streammargin.budget_svm import BudgetSVMClassifier
from streammargin.convex_polytope import ConvexPolytopeClassifier
from streammargin.errors import InvalidInput, StateError
from streammargin.features import describe_bad_values
from streammargin.multiclass import MAX_CLASSES as MAX_OVR_CLASSES
from streammargin.multiclass import OneVsRestClassifier

__all__ = ["AutoClassifier", "PORTFOLIO"]

#: The members, in the order that breaks ties of their scores (the first one serves until the
#: scores differ): a linear model, a piecewise-linear multiclass one, a kernel one.
PORTFOLIO = ("ALMAClassifier", "ConvexPolytopeClassifier", "BudgetSVMClassifier")
#: The members that are binary models: one-vs-rest on a stream of more than two classes.
BINARY_MEMBERS = ("ALMAClassifier", "BudgetSVMClassifier")
MAX_CLASSES = 100_000  # the CPM's own bound
MAX_WINDOW = 10**9
_STATE_KEYS = ("model", "params", "labels", "members", "scores", "replay")
_PARAMS = ("window", "max_classes", "max_ovr_classes", "max_features")

# The modes of the binary members, a function of the labels seen (`_mode`).
BINARY, ONE_VS_REST, RETIRED = "binary", "one-vs-rest", "retired"
_NATIVE = PORTFOLIO.index("ConvexPolytopeClassifier")  # the member that takes labels as they are
_ALL_MEMBERS = tuple(range(len(PORTFOLIO)))
_NATIVE_ALONE = (_NATIVE,)
_NATIVE_FIRST = (_NATIVE, *(i for i in _ALL_MEMBERS if i != _NATIVE))  # the order of learning


@state.register
class AutoClassifier(base.MiniBatchClassifier):
    """Runs a portfolio of models on every record and serves the one that is best lately.

    A user who does not know the stream in advance cannot choose among the models: on a
    20-feature rotating hyperplane the linear ALMA reaches 0.92 where the kernel models reach
    0.76-0.87, on Agrawal's function 2 the linear models reach 0.57 where the Convex Polytope
    Machine reaches 0.92, on Bananas the kernel models lead. This model runs ALMA, the CPM and
    the budget SVM (`PORTFOLIO`, each at its defaults, with this model's `max_features`) on every
    record, scores each by progressive validation (its prediction of a record is compared with
    the label before it learns the record), and serves the member with the highest recent
    accuracy: an exponentially weighted mean of its 0/1 outcomes over about `window` records
    (weight (1 - 1/window) per record), so that after a drift it follows the member that is best
    on the new concept within a few hundred records. Ties go to the earlier member.

    Labels are kept as given (str, int, bool, float, tuples of them; at most `max_classes`): the
    model is natively multiclass through the CPM. The binary members (ALMA, the budget SVM,
    `BINARY_MEMBERS`) take every stream:

    - while at most two labels have been seen, each is one binary model: the first label is its
      True unless it is a negative binary coding (False/0/-1), the second label the other one;
    - at the third label each becomes a `streammargin.OneVsRestClassifier` of its class: the
      model so far is the member of the label it learnt as True (on the two labels seen, "this
      label or not" is what it learnt), the other label gets a fresh clone, and the new label
      its own member, as one-vs-rest adds it. So that the fresh clone does not start cold, the
      model keeps copies of the first records (`streammargin.replay.ReplayBuffer`: at most 100
      records of at most 256 features, names of at most 128 bytes of JSON; a record beyond
      that is not kept), and the clone learns them, from the first one of its label on, before
      the record that brings the third label; the copies are then freed. When the third label
      comes within the first 100 records, all of them kept, and the first label is the True
      one, the members are then exactly one-vs-rest run from the first record (a first label
      False/0/-1 is False, so the model so far, the second label's member, has also learnt the
      records before that label's first);
    - beyond `max_ovr_classes` classes they are dropped (one-vs-rest costs a copy per class in
      time and memory) and the CPM serves alone.

    Cost: every member predicts and learns each labelled record, in one call each (a
    member's `_predict_then_learn`: the budget SVM's is one numba call), so a record costs
    about the members' sum; a prediction costs the served member's. The served member's
    prediction of the record last predicted is reused when that very dict is learnt.

    Memory: the CPM's bound, `max_ovr_classes` x the bound of each binary member (its
    one-vs-rest bound), the labels, the scores, and (when max_ovr_classes > 2) the records kept
    until the third label: `replay.MAX_BYTES` = 100 x (16 + 256 x (16 + 128 + 1)) bytes, 3.5 MiB
    (`streammargin.memory.memory_bound`: 147.7 MiB at the defaults). Having seen k classes,
    the CPM's k polytopes and the binary members in the form k gives them (k = 2: each alone,
    with the records kept, 13.6 MiB at the defaults; `memory_bound(model, classes=k)`).

    Parameters
    ----------
    window
        About how many recent records the members are scored on, an integer in
        [1, 1000000000].
    max_classes
        The most classes, in [2, 100000] (the CPM's bound); a label beyond it raises
        `streammargin.InvalidInput` and changes nothing.
    max_ovr_classes
        The most classes the binary members follow one-vs-rest, in [2, 10000]; from the next
        class on the CPM serves alone.
    max_features
        Every member's bound on feature columns (see `streammargin.features`), an integer in
        [1, 2**30].

    Attributes
    ----------
    members : dict
        Member name -> the member model (a binary member: its model, its
        `OneVsRestClassifier` beyond two classes, None beyond `max_ovr_classes`).
    best : str
        The name of the member served now.
    scores : dict
        Member name -> its recent accuracy (None for a member dropped beyond `max_ovr_classes`).

    Examples
    --------

    >>> from river import datasets, evaluate, metrics, preprocessing
    >>> import streammargin

    >>> model = preprocessing.StandardScaler() | streammargin.AutoClassifier()
    >>> evaluate.progressive_val_score(datasets.Bananas(), model, metrics.Accuracy())
    Accuracy: 88.79%

    >>> auto = model["AutoClassifier"]
    >>> auto.best
    'BudgetSVMClassifier'
    >>> {name: round(score, 3) for name, score in auto.scores.items()}
    {'ALMAClassifier': 0.556, 'ConvexPolytopeClassifier': 0.858, 'BudgetSVMClassifier': 0.891}

    """

    def __init__(
        self,
        window: int = 500,
        max_classes: int = 100,
        max_ovr_classes: int = 10,
        max_features: int = 2048,
    ):
        self._check_params(window, max_classes, max_ovr_classes, max_features)
        self.window = int(window)
        self.max_classes = int(max_classes)
        self.max_ovr_classes = int(max_ovr_classes)
        self.max_features = int(max_features)
        self._reset()

    def _member_params(self) -> dict[str, dict]:
        return {
            "ALMAClassifier": {"max_features": self.max_features},
            "ConvexPolytopeClassifier": {
                "max_features": self.max_features,
                "max_classes": self.max_classes,
            },
            "BudgetSVMClassifier": {"max_features": self.max_features},
        }

    def _reset(self) -> None:
        classes = {cls.__name__: cls for cls in (
            ALMAClassifier, ConvexPolytopeClassifier, BudgetSVMClassifier
        )}
        self.members = {
            name: classes[name](**params) for name, params in self._member_params().items()
        }
        self._labels: list = []  # the classes, in the order first seen
        # per member: decayed number of correct predictions and decayed count
        # [decayed correct, decayed count] per member, as Python floats (the per-record update is
        # float arithmetic either way; numpy scalars cost ~150 ns an operation); the state
        # stores them as float64[3, 2].
        self._scores = [[0.0, 0.0] for _ in PORTFOLIO]
        # (how many labels the binary label map below was made for, {bool: label})
        self._binary_labels: tuple[int, dict] = (0, {})
        self._last: tuple | None = None  # (a copy of x, member index, its prediction)
        # Copies of the first records, for the fresh member at the switch to one-vs-rest (None
        # once the switch is done, or when none is to come: max_ovr_classes == 2).
        self._replay = replay.ReplayBuffer() if self.max_ovr_classes > 2 else None
        self._served = self._best()  # (kept up to date where the scores change)

    @property
    def _multiclass(self) -> bool:
        return True

    @classmethod
    def _unit_test_params(cls) -> typing.Iterator[dict]:
        yield {}
        yield {"window": 20, "max_classes": 7, "max_ovr_classes": 3, "max_features": 64}

    # Labels and members -------------------------------------------------------------------------

    def _mode(self, n_labels: int | None = None) -> str:
        """The binary members' mode with `n_labels` classes (those seen by default)."""
        n = len(self._labels) if n_labels is None else n_labels
        if n <= 2:
            return BINARY
        return ONE_VS_REST if n <= self.max_ovr_classes else RETIRED

    def _active(self, mode: str | None = None) -> tuple[int, ...]:
        """Indices of the members that take part (all, or the CPM alone beyond
        `max_ovr_classes` classes)."""
        if (mode or self._mode()) != RETIRED:
            return _ALL_MEMBERS
        return _NATIVE_ALONE

    @staticmethod
    def _is_native(index: int) -> bool:
        return index == _NATIVE

    def _target(self, label: typing.Any) -> bool:
        """A binary member's target for `label` while at most two labels are known: the first
        label is True unless it is a negative binary coding (False/0/-1), the second the other."""
        first = self._labels[0] if self._labels else label
        return (label == first) == _first_is_positive(first)

    def _positive_label(self) -> typing.Any:
        """The label a binary member learnt as True (None if only the other one is known)."""
        for label in self._labels:
            if self._target(label):
                return label
        return None

    def _member_label(self, index: int, prediction: typing.Any) -> typing.Any:
        """A member's prediction as one of this model's labels (a binary model's True/False
        becomes the label it stands for; None before it is known)."""
        if index == _NATIVE or len(self._labels) > 2:  # (one-vs-rest gives labels)
            return prediction
        known, labels_of = self._binary_labels
        if known != len(self._labels):  # labels are only ever appended
            labels_of = {}
            for label in self._labels:
                labels_of.setdefault(self._target(label), label)
            self._binary_labels = (len(self._labels), labels_of)
        return labels_of.get(bool(prediction))

    def _member_proba(self, index: int, x: dict) -> dict:
        member = self.members[PORTFOLIO[index]]
        proba = member.predict_proba_one(x)
        if self._is_native(index) or self._mode() != BINARY:
            return proba
        out = {label: proba[self._target(label)] for label in self._labels}
        total = math.fsum(out.values())
        return {label: p / total for label, p in out.items()} if total > 0 else out

    def _to_one_vs_rest(self) -> None:
        """The binary members at the third label: each becomes one-vs-rest over the two labels
        known, the model so far the member of its True label, a fresh clone the other's, which
        learns the records kept (`_replay`, then freed) from the first of its label on, as
        one-vs-rest from the first record would have taught it. (Started cold instead, on wine,
        whose third label comes at record 5, ALMA inside this model reached 0.916 against 0.938
        run one-vs-rest from the start.)"""
        positive = self._positive_label()
        kept, self._replay = self._replay, None
        records = list(kept.records()) if kept is not None else []
        for name in BINARY_MEMBERS:
            model = self.members[name]
            ovr = OneVsRestClassifier(model.clone(), max_classes=self.max_ovr_classes)
            for label in self._labels:
                if label == positive:
                    ovr.classifiers[label] = model
                    continue
                member = model.clone()
                first = next(
                    (i for i, (_, index) in enumerate(records) if self._labels[index] == label),
                    len(records),
                )
                for x, index in records[first:]:
                    member.learn_one(x, self._labels[index] == label)
                ovr.classifiers[label] = member
            self.members[name] = ovr

    def _best(self) -> int:
        """The member with the highest recent accuracy (the earliest on a tie): `_served`, which
        is this after every change of the scores or of the members taking part."""
        best, best_score = -1, -1.0
        scores = self._scores
        for i in self._active():
            correct, count = scores[i]
            score = correct / count if count > 0.0 else 0.0
            if score > best_score:
                best, best_score = i, score
        return best

    @property
    def best(self) -> str:
        return PORTFOLIO[self._served]

    @property
    def scores(self) -> dict[str, float | None]:
        active = set(self._active())
        return {
            name: (float(c / n) if n > 0.0 else 0.0) if i in active else None
            for i, (name, (c, n)) in enumerate(zip(PORTFOLIO, self._scores))
        }

    # River API ----------------------------------------------------------------------------------

    def predict_proba_one(self, x: dict, **kwargs: typing.Any) -> dict:
        if not self._labels:
            describe_bad_values(x)
            return {}
        return self._member_proba(self._served, x)

    def predict_one(self, x: dict, **kwargs: typing.Any) -> typing.Any:
        if not self._labels:
            describe_bad_values(x)
            return None
        index = self._served
        label = self._member_label(index, self.members[PORTFOLIO[index]].predict_one(x))
        self._last = (dict(x), index, label)
        return label

    def decision_one(self, x: dict) -> typing.Any:
        """The served member's raw score: a float for a binary member (its sign: the label seen
        with the positive coding), {label: score} for the CPM; {} before any label."""
        if not self._labels:
            describe_bad_values(x)
            return {}
        return self.members[PORTFOLIO[self._served]].decision_one(x)

    # This model's own Python is ~2 us a record beside its members' calls (`plain_label`'s
    # shortcut, `_binary_labels`, the scores as Python floats): its time per record is
    # 0.78x-1.07x the sum of its members' run alone (`benchmarks/model_selection.py --section
    # cost`).
    def learn_one(self, x: dict, y: typing.Any, **kwargs: typing.Any) -> None:
        label = plain_label(y)
        known = label in self._labels
        if not known and len(self._labels) >= self.max_classes:
            raise InvalidInput(
                f"label {label!r:.80} would be class {len(self._labels) + 1}, beyond "
                f"max_classes={self.max_classes}; raise max_classes if the stream has more classes"
            )
        last, self._last = self._last, None
        if known:
            outcomes = self._learn_known_label(x, label, last)
        else:
            outcomes = self._learn_new_label(x, label)
        if self._replay is not None:  # (binary members, a switch to one-vs-rest to come)
            self._replay.add(x, self._labels.index(label))
        keep = 1.0 - 1.0 / self.window
        scores = self._scores
        for i in self._active():
            row = scores[i]
            row[0] = keep * row[0] + outcomes[i]
            row[1] = keep * row[1] + 1.0
        self._served = self._best()

    def _learn_known_label(self, x: dict, label: typing.Any, last: tuple | None) -> list[float]:
        """Progressive validation on a record of a known label (the members keep their form):
        each member predicts x, then learns it, in one call (`_predict_then_learn`); the served
        member's prediction of this very dict is reused. Returns each member's 0/1 outcome, by
        index. The CPM goes first: its calls validate x's values, then its names (what learning
        can refuse beyond prediction, `features.name_json`, is a property of x alone), and its
        learn_one is atomic, so a refused x leaves the model as it was, and once the CPM has
        taken x every member takes it."""
        members = self.members
        mode = self._mode()
        binary = mode == BINARY
        target = self._target(label) if binary else label  # (a binary member's)
        served = last[1] if last is not None and last[0] == x else -1
        outcomes = [0.0] * len(PORTFOLIO)
        for i in _NATIVE_ALONE if mode == RETIRED else _NATIVE_FIRST:
            member = members[PORTFOLIO[i]]
            member_y = label if i == _NATIVE else target
            if i == served:
                predicted = last[2]
                member.learn_one(x, member_y)
            elif binary and i != _NATIVE:
                predicted = self._member_label(i, member._predict_then_learn(x, member_y))
            else:  # (labels as they are)
                predicted = member._predict_then_learn(x, member_y)
            if predicted == label and predicted is not None:
                outcomes[i] = 1.0
        return outcomes

    def _learn_new_label(self, x: dict, label: typing.Any) -> list[float]:
        """Progressive validation on the record of a new label: no member can predict it, so each
        one's outcome is 0. The binary members may change form (`_mode`), the label is added and
        the members learn."""
        mode = self._mode(len(self._labels) + 1)
        active = self._active(mode)  # (beyond max_ovr_classes, the CPM alone from this record)
        describe_bad_values(x)  # (every member validates x's values alike)
        members = self.members
        # The CPM learns first, before anything else changes (see `_learn_known_label`). (No
        # copy of the model for a rollback: at each new label that copy cost more than the
        # members' learning of the first records.)
        members[PORTFOLIO[_NATIVE]].learn_one(x, label)
        if mode != self._mode():  # the binary members change form
            if mode == RETIRED:
                for name in BINARY_MEMBERS:
                    members[name] = None
            elif mode == ONE_VS_REST:
                self._to_one_vs_rest()
        self._labels.append(label)
        target = self._target(label) if mode == BINARY else label  # (a binary member's)
        for i in active:
            if i != _NATIVE:
                members[PORTFOLIO[i]].learn_one(x, target)
        return [0.0] * len(PORTFOLIO)

    # Mini-batches: row by row, the same as learn_one -------------------------------------------

    def learn_many(self, X: typing.Any, y: typing.Any, **kwargs: typing.Any) -> None:
        """`learn_one` over the rows of a DataFrame in order; a refused frame changes nothing."""
        labels = [plain_label(label) for label in y]
        if len(labels) != len(X):
            raise InvalidInput(f"X has {len(X)} rows but y has {len(labels)} labels")
        values = frame_values(X)
        saved = copy.deepcopy(self.__dict__)
        try:
            for row, label in enumerate(labels):
                self.learn_one(_row_dict(X.columns, values[row]), label)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    def predict_proba_many(self, X: typing.Any, **kwargs: typing.Any) -> typing.Any:
        import pandas as pd

        values = frame_values(X)
        rows = [self.predict_proba_one(_row_dict(X.columns, v)) for v in values]
        return pd.DataFrame(rows, index=X.index, columns=list(self._labels)).fillna(0.0)

    def predict_many(self, X: typing.Any, **kwargs: typing.Any) -> typing.Any:
        import pandas as pd

        values = frame_values(X)
        return pd.Series(
            [self.predict_one(_row_dict(X.columns, v)) for v in values], index=X.index,
            dtype=object,
        )

    # Monitoring ---------------------------------------------------------------------------------

    @property
    def counters(self) -> dict[str, int]:
        """The classes, the served member's index in `PORTFOLIO`, and the members' counters
        prefixed by their short names (the Kafka worker's metrics)."""
        out = {"classes": len(self._labels), "best": self._served}
        for name, member in self.members.items():
            if member is None:
                continue
            prefix = name.lower().removesuffix("classifier")
            for key, value in member.counters.items():
                out[f"{prefix}_{key}"] = int(value)
        return out

    # Memory -------------------------------------------------------------------------------------

    def _memory_bound(self, params: dict | None = None, classes: int | None = None) -> int:
        """`streammargin.memory.memory_bound`: the members' bounds (the binary members' as
        one-vs-rest over `max_ovr_classes`) plus the labels, the scores and the records kept
        for the switch to one-vs-rest (`replay.MAX_BYTES`, when max_ovr_classes > 2).
        Binary mode and one-vs-rest never hold their largest at once, but the bound adds them:
        simple, and 2.5% more at the defaults (147.7 MiB). Given the `classes` it holds (at
        least 2), the members in the form those classes give them (`_mode`): two classes, the
        CPM's two polytopes and each binary member alone (13.6 MiB at the defaults)."""
        chosen = {**self._get_params(), **(params or {})}
        return _bound(
            int(chosen["max_classes"]), int(chosen["max_ovr_classes"]),
            int(chosen["max_features"]), classes,
        )

    @property
    def _classes_held(self) -> int:
        """How many classes the model holds (`streammargin.memory.held_classes`)."""
        return len(self._labels)

    def _stored_names(self, params: dict | None = None, classes: int | None = None) -> int:
        """`streammargin.memory.stored_names`: the members', as `_memory_bound` counts them
        (each member keeps its own names; a binary member's one-vs-rest members too)."""
        from streammargin import memory

        chosen = {**self._get_params(), **(params or {})}
        max_classes, max_ovr = int(chosen["max_classes"]), int(chosen["max_ovr_classes"])
        one = memory.stored_names(ALMAClassifier, {"max_features": int(chosen["max_features"])})
        if classes is None:  # the ceiling: one-vs-rest over max_ovr_classes
            return one * (1 + len(BINARY_MEMBERS) * max_ovr)
        held = memory.classes_charged(max_classes, classes)
        members = 1 if held <= 2 else held if held <= max_ovr else 0
        return one * (1 + len(BINARY_MEMBERS) * members)

    def _memory_size(self) -> int:
        from streammargin import memory
        from streammargin.features import name_json

        labels = sum(len(name_json(label)) + 1 for label in self._labels)
        kept = self._replay.memory_size() if self._replay is not None else 0
        return labels + 8 * 2 * len(self._scores) + kept + sum(
            memory.memory_size(m) for m in self.members.values() if m is not None
        )

    # Safe state ---------------------------------------------------------------------------------

    def to_state(self) -> dict:
        """The params, the labels, each member's own state in `PORTFOLIO` order (a binary
        member's model, its one-vs-rest state beyond two classes, None beyond `max_ovr_classes`),
        the scores, and the records kept for the switch to one-vs-rest (`replay.ReplayBuffer`;
        None once it is done, or with max_ovr_classes=2)."""
        return {
            "model": type(self).__name__,
            "params": self._get_params(),
            "labels": [state.encode_name(label) for label in self._labels],
            "members": [
                None if self.members[name] is None else self.members[name].to_state()
                for name in PORTFOLIO
            ],
            "scores": np.array(self._scores, dtype=np.float64),
            "replay": None if self._replay is None else self._replay.to_state(),
        }

    @classmethod
    def from_state(cls, data: typing.Any, max_bytes: int | None = None) -> AutoClassifier:
        """Rebuild a model from `to_state()`; `StateError` for anything malformed.

        Checked before any member is restored: the fields, the params (by the constructor),
        the bound they imply (against `max_bytes`), the labels (valid, distinct, at most
        `max_classes`), the scores (finite, 0 <= correct <= count <= window), the records kept
        (`replay.ReplayBuffer.from_state`: present while a switch to one-vs-rest may come, null
        otherwise; a state saved before they were kept has none and keeps records from then
        on), and that each member has the form the labels imply (`_mode`) with the class and
        parameters this model gives it: a one-vs-rest member over exactly this model's labels,
        in order, wrapping the member's class with `max_ovr_classes`. Each member is then
        restored by its own class' `from_state`, whose refusals become StateError.
        """
        from streammargin import memory

        if type(data) is not dict or data.get("model") != cls.__name__:
            name = data.get("model") if type(data) is dict else None
            raise StateError(f"state of {name!r:.80} cannot restore a {cls.__name__}")
        # (a state saved before the records were kept has no "replay")
        if set(data) not in (set(_STATE_KEYS), set(_STATE_KEYS) - {"replay"}):
            raise StateError(f"{cls.__name__} state: expected the fields {sorted(_STATE_KEYS)}")
        params = data["params"]
        if type(params) is not dict or set(params) != set(_PARAMS):
            raise StateError(f"{cls.__name__} state: params must be {', '.join(_PARAMS)}")
        for name, value in params.items():
            if type(value) is not int:
                raise StateError(f"{cls.__name__} state: parameter {name} must be an int")
        try:
            cls._check_params(**params)
        except ValueError as error:
            raise StateError(f"bad parameter in the state of a {cls.__name__}: {error}") from None
        limit = memory.DEFAULT_MAX_STATE_BYTES if max_bytes is None else max_bytes
        bound = _bound(params["max_classes"], params["max_ovr_classes"], params["max_features"])
        if bound > limit:
            raise StateError(
                f"a saved {cls.__name__} with these params may hold up to {bound:,} bytes, above "
                f"the limit of {limit:,}: pass a larger max_bytes to from_state if this is expected"
            )
        labels = data["labels"]
        decoded = _decoded_labels(labels, params["max_classes"])
        scores = data["scores"]
        window = params["window"]
        if not (
            isinstance(scores, np.ndarray) and scores.dtype == np.float64
            and scores.shape == (len(PORTFOLIO), 2) and np.isfinite(scores).all()
            and np.all(scores >= 0.0) and np.all(scores[:, 0] <= scores[:, 1] * (1 + 1e-12))
            and np.all(scores[:, 1] <= window * (1 + 1e-9))
        ):
            raise StateError(
                f"{cls.__name__} state: scores must be a finite {len(PORTFOLIO)}x2 float64 array "
                "with 0 <= correct <= count <= window"
            )
        members = data["members"]
        if type(members) is not list or len(members) != len(PORTFOLIO):
            raise StateError(f"{cls.__name__} state: members must be the {len(PORTFOLIO)} of "
                             f"{list(PORTFOLIO)}")
        model = cls(**params)
        model._labels = decoded
        mode = model._mode()
        if model._replay is not None and mode == BINARY:  # the switch to one-vs-rest may come
            if "replay" in data:
                model._replay = replay.ReplayBuffer.from_state(data["replay"], len(decoded))
            # else: a state saved before the records were kept: the first ones from now on
        else:
            if data.get("replay") is not None:
                raise StateError(f"{cls.__name__} state: replay must be null beyond two labels "
                                 "or with max_ovr_classes=2")
            model._replay = None
        model.members = {
            name: model._restored_member(name, member_state, labels, limit)
            for name, member_state in zip(PORTFOLIO, members)
        }
        model._scores = np.array(scores, dtype=np.float64).tolist()
        model._served = model._best()
        return model

    def _restored_member(self, name: str, data: typing.Any, labels: list, limit: int
                         ) -> typing.Any:
        """Member `name` of this model (its params and labels set; `labels` encoded, as
        `to_state` gives them) restored from its state `data`, which must have the form this
        model's labels imply (`_mode`): null for a binary member beyond `max_ovr_classes`, a
        one-vs-rest member over exactly these labels, else the member itself, each with the
        parameters this model gives it. StateError otherwise, or from the member's own check."""
        where = f"{type(self).__name__} state: member {name}"
        expected = json.loads(json.dumps(self.members[name]._get_params()))
        binary = name in BINARY_MEMBERS
        mode = self._mode()
        if binary and mode == RETIRED:
            if data is not None:
                raise StateError(f"{where} must be null beyond max_ovr_classes classes")
            return None
        if binary and mode == ONE_VS_REST:
            wanted = {
                "model": "OneVsRestClassifier",
                "params": {"max_classes": self.max_ovr_classes},
                "classifier": {"model": name, "params": expected},
                "labels": labels,
            }
            if type(data) is not dict or any(
                data.get(key) != value for key, value in wanted.items()
            ):
                raise StateError(f"{where} must be a one-vs-rest {name} over this model's "
                                 "labels, with the parameters this model gives it")
            member_cls = OneVsRestClassifier
        else:
            if type(data) is not dict or data.get("model") != name or (
                data.get("params") != expected
            ):
                raise StateError(f"{where} must be a {name} with the parameters this model "
                                 "gives it")
            member_cls = state.registered_models()[name]
        return state.restore_member(member_cls, data, limit, where)

    def member_to_state(self, name: str) -> dict:
        """Member `name` (one taking part) as a state of its own, with what `member_from_state`
        needs to check it and to say what it learnt: `{"member": name, "labels": [...],
        "state": its to_state()}`, the labels encoded as `to_state` encodes them."""
        member = self.members[name]
        if member is None:
            raise ValueError(f"{name} takes no part in this model (beyond max_ovr_classes)")
        return {
            "member": name,
            "labels": [state.encode_name(label) for label in self._labels],
            "state": member.to_state(),
        }

    @classmethod
    def member_from_state(cls, params: dict, data: typing.Any, max_bytes: int | None = None
                          ) -> tuple[typing.Any, tuple]:
        """The member in `data` (`member_to_state` of an AutoClassifier of `params`: checked
        ones, a model's own `_get_params()`) and that model's `member_roles`: what a topic-scope
        peer sends when its whole model is beyond the model topic's bytes budget
        (connectors/worker/model_scope.py). Checked as `from_state` checks a member, against
        `max_bytes` (default `memory.DEFAULT_MAX_STATE_BYTES`); StateError for anything
        malformed or impossible, and nothing else."""
        from streammargin import memory

        if type(data) is not dict or set(data) != {"member", "labels", "state"}:
            raise StateError(f"a member's state of an {cls.__name__} has the fields member, "
                             "labels and state")
        name = data["member"]
        if name not in PORTFOLIO:
            raise StateError(f"{cls.__name__} has no member {str(name)[:80]!r}")
        copy = cls(**params)
        copy._labels = _decoded_labels(data["labels"], copy.max_classes)  # (members still fresh)
        limit = memory.DEFAULT_MAX_STATE_BYTES if max_bytes is None else max_bytes
        member = copy._restored_member(name, data["state"], data["labels"], limit)
        if member is None:
            raise StateError(f"{cls.__name__}: member {name} takes no part beyond "
                             "max_ovr_classes classes")
        return member, copy.member_roles()

    def member_roles(self) -> tuple:
        """What the members learnt the labels as: two copies whose roles are equal hold members
        that mix one for one (`streammargin.mixing.mix_member`). The label set, with the label
        the binary members learn as True while there are at most two (copies that saw the labels
        in another order agree on it for True/False, 0/1 and -1/1), the labels in order with one
        one-vs-rest model each up to `max_ovr_classes`, and the set alone beyond (the CPM alone:
        it aligns classes by label)."""
        mode = self._mode()
        if mode == BINARY:
            return (mode, frozenset(self._labels), self._positive_label())
        if mode == ONE_VS_REST:
            return (mode, tuple(self._labels))
        return (mode, frozenset(self._labels))

    @classmethod
    def _check_params(
        cls, window: int, max_classes: int, max_ovr_classes: int, max_features: int
    ) -> None:
        validation.integer_in("window", window, 1, MAX_WINDOW)
        validation.integer_in("max_classes", max_classes, 2, MAX_CLASSES)
        validation.integer_in("max_ovr_classes", max_ovr_classes, 2, MAX_OVR_CLASSES)
        check_max_features(max_features)


def _decoded_labels(labels: typing.Any, max_classes: int) -> list:
    """The labels of a state (`to_state`'s encoding): a list of at most `max_classes` distinct
    valid labels; StateError otherwise."""
    if type(labels) is not list or len(labels) > max_classes:
        raise StateError("AutoClassifier state: labels must be a list of at most max_classes")
    decoded = []
    for encoded in labels:
        try:
            decoded.append(plain_label(state.decode_name(encoded)))
        except InvalidInput as error:
            raise StateError(f"AutoClassifier state: {error}") from None
    if len(set(decoded)) != len(decoded):
        raise StateError("AutoClassifier state: a label appears twice")
    return decoded


def _row_dict(columns: typing.Any, row: np.ndarray) -> dict:
    """A frame row as learn_one's dict (NaN: absent)."""
    return {name: float(v) for name, v in zip(columns, row) if not math.isnan(v)}


def _first_is_positive(label: typing.Any) -> bool:
    """Whether the first label is a binary member's True: unless it is a negative binary coding
    (False/0/-1), so that on a 0/1 or True/False stream True means what it says."""
    try:
        return binary_target(label) > 0
    except InvalidInput:
        return True


def _bound(max_classes: int, max_ovr_classes: int, max_features: int,
           classes: int | None = None) -> int:
    """The CPM's bound and the binary members' one-vs-rest bounds at these params, plus
    max_classes labels, the scores and the records kept for the switch to one-vs-rest; given
    the `classes` held (None: the ceiling), the CPM at that many and the binary members in the
    form they have then (alone with the records kept, one-vs-rest, or dropped)."""
    from streammargin import memory

    held = max_classes if classes is None else memory.classes_charged(max_classes, classes)
    total = memory.STATE_OVERHEAD + held * (memory.MAX_LABEL_BYTES + 1) + 8 * 2 * len(
        PORTFOLIO
    )
    binary = classes is not None and held <= 2  # (the ceiling adds every form, see above)
    if max_ovr_classes > 2 and (classes is None or binary):
        # (with 2, the third label retires the binary members; past the switch, none is kept)
        total += replay.MAX_BYTES
    registered = state.registered_models()
    total += memory.memory_bound(
        ConvexPolytopeClassifier, {"max_features": max_features, "max_classes": held}
    ) - memory.STATE_OVERHEAD
    if classes is not None and held > max_ovr_classes:
        return total  # (the binary members retired: the CPM serves alone)
    for name in BINARY_MEMBERS:
        member = {"max_features": max_features}
        if binary:
            total += memory.memory_bound(registered[name], member) - memory.STATE_OVERHEAD
            continue
        # one-vs-rest over max_ovr_classes bounds the binary model too (max_ovr_classes >= 2)
        total += OneVsRestClassifier._class_bound(
            registered[name], member, max_ovr_classes if classes is None else held
        ) - memory.STATE_OVERHEAD
    return total
