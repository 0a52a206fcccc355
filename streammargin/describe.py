"""A model's learnt state by name: `describe_state(model)`.

Every model hands numba its scalars in one float64 array `st` whose layout is declared once, in
its jit module (`streammargin.jit.layout`); this reads the array through that layout, so that a
reader can follow any number of `st` to its name, kind and meaning, and lists the shapes of the
model's other arrays.
"""

from __future__ import annotations

import typing

import numpy as np

from streammargin.jit.layout import CALIBRATION, COUNTER, HYPER, LEARNT

__all__ = ["describe_state"]

# describe_state's key for the slots of each kind
KIND_KEYS = {HYPER: "hyper", COUNTER: "counters", LEARNT: "learnt", CALIBRATION: "calibration"}


def describe_state(model: typing.Any) -> dict[str, typing.Any]:
    """A model's state by name: what each entry of its state array `st` is, and its arrays.

    Returns a dict with
    - `model`: the class name; `layout`: the title of the layout of `st`;
    - `hyper`, `counters`, `learnt`, `calibration`: slot name -> value of `st` (a float, a list
      for a slot of several entries, a dict by name for the calibration's nine numbers);
      hyper-parameters are written from the params (numbers as floats, bools as 0/1, names by
      their code);
    - `slots`: slot name -> `{"offset", "size", "kind", "doc", "param"}`: where each value lives
      in `st` (the slots cover `st` from 0 to its end, without gaps) and what it is (`param`: the
      constructor parameter a hyper-parameter slot holds as it is; empty when it is derived from
      the params, as its `doc` says);
    - `arrays`: name -> `{"shape", "dtype"}` of every learnt array (`st`, the support cache, the
      weights, ...), as `to_state` saves them.

    A `streammargin.OneVsRestClassifier` gives `model`, `classes` and `members`: label ->
    `describe_state` of that class' member; a `streammargin.AutoClassifier` gives `model` and
    `members`: member name -> its `describe_state` (None for a member it dropped). With
    `gamma="auto"` the kernel width's slot holds the estimate (0 until it is made).

    Learning the model deferred (ALMA's pending trial) is applied first, as `to_state` does.

    Examples
    --------

    >>> import streammargin
    >>> model = streammargin.ALMAClassifier(p=2, alpha=0.9)
    >>> for x, y in [({"a": 1.0}, True), ({"a": -1.0, "b": 0.5}, False), ({"b": 2.0}, True)]:
    ...     model.learn_one(x, y)
    >>> state = streammargin.describe_state(model)
    >>> state["counters"]
    {'k': 4.0, 'since_recompute': 3.0, 'trials': 3.0}
    >>> slot = state["slots"]["k"]
    >>> slot["offset"], slot["kind"], slot["doc"]
    (0, 'counter', 'the correction counter k: corrections + 1')
    >>> state["hyper"]["alpha"], state["slots"]["alpha"]["offset"], state["slots"]["alpha"]["param"]
    (0.9, 11, 'alpha')
    >>> list(state["calibration"]["platt"])[:2]
    ['a', 'b']
    >>> state["arrays"]
    {'_vectors': {'shape': (8, 3), 'dtype': 'float64'}, '_st': {'shape': (26,), 'dtype': 'float64'}}

    """
    if not hasattr(model, "_state_layout"):
        # A model made of models: one-vs-rest (members by class) or AutoClassifier (by name; a
        # member it dropped is None).
        classifiers = getattr(model, "classifiers", None)
        if isinstance(classifiers, dict):
            return {
                "model": type(model).__name__,
                "classes": list(classifiers),
                "members": {label: describe_state(m) for label, m in classifiers.items()},
            }
        members = getattr(model, "members", None)
        if isinstance(members, dict):
            return {
                "model": type(model).__name__,
                "members": {
                    name: None if m is None else describe_state(m) for name, m in members.items()
                },
            }
        raise TypeError(f"{type(model).__name__} has no state layout to describe")
    model._flush()
    layout = model._state_layout()
    st = model._st
    if st.shape != (layout.size,):
        raise ValueError(f"{type(model).__name__}: st has shape {st.shape}, its layout {layout}")
    described: dict[str, typing.Any] = {"model": type(model).__name__, "layout": layout.title}
    for kind, key in KIND_KEYS.items():
        described[key] = layout.read(st, kind)
    described["slots"] = {
        slot.name: {
            "offset": layout.offset(slot.name),
            "size": slot.size,
            "kind": slot.kind,
            "doc": slot.doc,
            "param": slot.param,
        }
        for slot in layout.slots
    }
    arrays = {name: getattr(model, name) for name in model._state_arrays}
    described["arrays"] = {
        name: {"shape": tuple(array.shape), "dtype": str(array.dtype)}
        for name, array in arrays.items()
        if isinstance(array, np.ndarray)
    }
    return described
