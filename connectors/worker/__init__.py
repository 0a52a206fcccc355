"""The Kafka worker, the application on top of the Kafka clients, state and observability.

- `worker.py`: `Worker(WorkerConfig)`, the consumer-group member (its life cycle, polling,
  failures), with `rebalance.py` (restores, revocations), `outputs.py` (sends, checkpoints,
  commits, transactions) and `failures.py` (`WorkerError`); `config.py`: `WorkerConfig`, its
  checks and the clients' settings;
- `outage.py`: broker contact and outages; `profiling.py`: `--profile-stages`;
- `label_topic.py`: `--label-topic`'s merge; `model_scope.py`: `--model-scope topic`;
  `memory_budget.py`: `--max-memory`'s shares;
- `warmup.py`: the per-record path on made-up records, before the first real one.

`from connectors.worker import Worker, WorkerConfig` works as it did when the worker was the
module `connectors.worker`: those names are read from `connectors.worker.worker` (`WorkerConfig`
from `connectors.worker.config`) on first use, so importing `connectors.worker.config` alone
does not import the worker's other modules. A partition's processing, without a broker, is the
package `connectors.task`.
"""

from __future__ import annotations

import importlib
import typing

__all__ = ["Worker", "WorkerConfig", "WorkerError"]


def __getattr__(name: str) -> typing.Any:
    if name in __all__:
        module = "connectors.worker.config" if name == "WorkerConfig" else "connectors.worker.worker"
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
