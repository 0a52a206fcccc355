"""`streammargin serve`: the models the Kafka workers learn, followed on their checkpoint topic
and answered over the Open Inference Protocol (KServe's v2 REST), or in-process.

- `follower.py`: `ModelFollower`, the checkpoints followed (no group, no writes), decoded off
  the request path, swapped in atomically; its `predict` is the in-process API;
- `models.py`: `ServedVersion`, `ServingView` (the models served at one moment, which one
  answers a key), `Scorer` (the worker's mapping and `PartitionTask.predict`);
- `record_rows.py`: `RecordRows`, a request's records read and predicted a batch at a time, as
  the worker's batch path reads a topic;
- `protocol.py`: the protocol's requests and responses as validated structures, limits;
- `partitioner.py`: the input partition of a record key (murmur2, crc32);
- `app.py`: `InferenceApp`, the endpoints, on uvicorn (ASGI); `metrics.py`: Prometheus.

`from connectors.serving import ModelFollower` reads the name from its module on first use, so
that importing the package (or `connectors.serving.protocol` alone) imports no model library.
"""

from __future__ import annotations

import importlib
import typing

_MODULES = {"ModelFollower": "follower", "FollowerError": "follower", "Scored": "models",
            "ServedVersion": "models", "ServingView": "models", "Limits": "protocol",
            "RequestError": "protocol"}
__all__ = list(_MODULES)


def __getattr__(name: str) -> typing.Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"connectors.serving.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
