"""JSON Schemas (draft 2020-12) of the records the Kafka worker writes, shipped with the package.

=========================  =============================================================
name                       record
=========================  =============================================================
``prediction-binary``      a prediction of a binary model (`--predictions-per-message 1`)
``prediction-multiclass``  a prediction of a multiclass model (natively, or one-vs-rest)
``prediction-batch``       `{"predictions": [...]}` (`--predictions-per-message N > 1`)
``metrics``                a metrics record
``dead-letter-headers``    a dead letter's headers, as an object of name -> UTF-8 value
=========================  =============================================================

The files are `connectors/schemas/<name>.schema.json`; each has an `$id`
(`urn:streammargin:schema:<name>:1`) by which the batch schema refers to the others.

>>> sorted(load("prediction-binary")["required"])
['id', 'model', 'offset', 'p_true', 'partition', 'topic', 'y', 'y_pred']
>>> validator("prediction-batch").is_valid({"predictions": []})  # needs the jsonschema package
False
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import typing

__all__ = ["NAMES", "load", "path", "validator"]

NAMES = ("prediction-binary", "prediction-multiclass", "prediction-batch", "metrics",
         "dead-letter-headers")


def path(name: str) -> typing.Any:
    """The schema file of `name` (an importlib.resources Traversable)."""
    if name not in NAMES:
        raise ValueError(f"unknown schema {name!r}; known: {', '.join(NAMES)}")
    return importlib.resources.files(__name__) / f"{name}.schema.json"


@functools.cache
def _text(name: str) -> str:
    return path(name).read_text(encoding="utf-8")


def load(name: str) -> dict:
    """The schema `name` as a dict (a fresh copy)."""
    return json.loads(_text(name))


def validator(name: str) -> typing.Any:
    """A `jsonschema` validator of `name` that resolves the references between the schemas
    (needs the `jsonschema` package, in the test extra)."""
    import jsonschema
    from referencing import Registry, Resource

    registry = Registry().with_resources(
        (schema["$id"], Resource.from_contents(schema))
        for schema in (load(other) for other in NAMES)
    )
    schema = load(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=registry, format_checker=cls.FORMAT_CHECKER)
