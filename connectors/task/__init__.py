"""One input partition's processing, without Kafka: records in, output records out.

- `partition.py`: `PartitionTask`, a partition's model (and scaler), metrics, drift detector and
  delayed-label store; construction, restore and checkpoints;
- `records.py`: its per-record steps, the reference path (`process`);
- `settings.py`: `TaskSettings`, and the checks of a restored model against them;
- `output_records.py`: what a task gives back (`OutputRecords`, `TaskOutput`), dead-letter
  headers, `TaskFailure`;
- `pending_labels.py`: `PendingLabels`, the events waiting for their label.

`from connectors.task import PartitionTask, TaskSettings` reads the names from their modules on
first use, so that importing the package imports nothing heavy (`tests/test_lazy_imports.py`).
"""

from __future__ import annotations

import importlib
import typing

# Name -> the module of this package that defines it.
_MODULES = {
    "PartitionTask": "partition",
    "TaskSettings": "settings",
    "COPY_HEADERS": "settings",
    "check_model_kind": "settings",
    "SettingsMismatch": "settings",
    "restore_part": "settings",
    "OutputRecord": "output_records",
    "OutputRecords": "output_records",
    "TaskOutput": "output_records",
    "TaskFailure": "output_records",
    "bounded_reason": "output_records",
    "qualified_name": "output_records",
    "dead_letter_headers": "output_records",
    "ERROR_HEADER": "output_records",
    "CONNECT_ERRORS": "output_records",
    "MAX_REASON_CHARS": "output_records",
    "STAGE_CODEC": "output_records",
    "STAGE_MODEL": "output_records",
    "STAGE_CONSUME": "output_records",
    "PendingLabels": "pending_labels",
    "pending_entry_bytes": "pending_labels",
    "checked_count": "pending_labels",
    "ENTRY_BYTES": "pending_labels",
    "FEATURE_BYTES": "pending_labels",
    "PROBA_CLASS_BYTES": "pending_labels",
    "PROBA_DICT_BYTES": "pending_labels",
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> typing.Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"connectors.task.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
