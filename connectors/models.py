"""The models a worker can run, by short name, and `key=value` parameters from the command line.

Every class registered with `streammargin.state.register` gets a short name: the class name in
lower case without a trailing "classifier" (`ALMAClassifier` -> "alma"). Models added to the
package later join the registry by themselves. Wrappers (`streammargin.OneVsRestClassifier`) are
not models one picks by name: they take a model to wrap, and `from_state` restores them.

>>> "alma" in model_names()
True
>>> parse_params(["alpha=0.8", "p=3", "average=false", "B=none", "kernel=rbf"])
{'alpha': 0.8, 'p': 3, 'average': False, 'B': None, 'kernel': 'rbf'}
>>> build_model("alma", {"alpha": 0.8})
ALMAClassifier (
  p=2.
  alpha=0.8
  B=None
  C=1.414214
  fit_intercept=True
  intercept_scale=1.
  average=True
  average_window=10000
  max_features=65536
)

"""

from __future__ import annotations

import typing

__all__ = ["model_names", "short_name", "model_class", "parse_params", "parse_value", "build_model",
           "check_model"]


def short_name(cls: type) -> str:
    """`ALMAClassifier` -> "alma": the class name, lower case, without a trailing "classifier"."""
    name = cls.__name__.lower()
    if name.endswith("classifier") and name != "classifier":
        name = name[: -len("classifier")]
    return name


def model_names() -> dict[str, type]:
    """Short name -> class of every registered model but the wrappers, sorted by name."""
    from river import base

    from streammargin import state

    classes = [c for c in state.registered_models().values() if not issubclass(c, base.Wrapper)]
    return {short_name(cls): cls for cls in sorted(classes, key=short_name)}


def model_class(name: str) -> type:
    """The model class of a short name (or of a full class name, any case)."""
    names = model_names()
    cls = names.get(name.lower())
    if cls is None:
        by_class = {cls.__name__.lower(): cls for cls in names.values()}
        cls = by_class.get(name.lower())
    if cls is None:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(names)}")
    return cls


_WORDS = {"true": True, "false": False, "none": None, "null": None}


def parse_value(text: str) -> typing.Any:
    """A command-line value as int, float, bool, None or (otherwise) the string itself."""
    word = text.strip().lower()
    if word in _WORDS:
        return _WORDS[word]
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_params(items: typing.Iterable[str] | None) -> dict[str, typing.Any]:
    """`["alpha=0.8", "p=3"]` -> `{"alpha": 0.8, "p": 3}` (later items win)."""
    params: dict[str, typing.Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"parameter {item!r} is not of the form key=value")
        params[key.strip()] = parse_value(value.strip())
    return params


def build_model(name: str, params: dict[str, typing.Any] | None = None) -> typing.Any:
    """An instance of a registered model, with a clear error for parameters it does not take."""
    cls = model_class(name)
    params = dict(params or {})
    try:
        return cls(**params)
    except TypeError as error:
        import inspect

        accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
        raise ValueError(
            f"bad parameters {params!r} for {cls.__name__}: {error}; it takes {accepted}"
        ) from None


def check_model(name: str, params: dict[str, typing.Any] | None = None) -> typing.Any:
    """`build_model`'s checks and errors, without loading the model's compiled code: a model to
    read (its params, `_multiclass`), never to run (`streammargin.jit.entry.types_only`).
    Checking a worker's configuration this way leaves numba's code generator unloaded until the
    model first runs (in the worker's warm-up thread)."""
    from streammargin.jit.entry import types_only

    with types_only():
        return build_model(name, params)
