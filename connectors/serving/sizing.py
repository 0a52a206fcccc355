"""`--max-memory` of `streammargin serve`: what a server holds, as a formula (docs/serving.md,
"Sizing").

For M models served (partition scope: the partitions of the input topics; topic scope: the
topics), V versions kept (`--versions-kept`), a model's ceiling m (`streammargin.memory.
memory_bound` of the workers' model at every class it may hold, and its stored names' Python
objects, `stored_names` x NAME_OBJECT_BYTES, as the worker charges them, and the shapes its
batches were predicted with, `streammargin.progressive.PredictionShapes.BYTES`) and the scaler's s
(with `--scale`), checkpoints of at most C bytes (`--max-checkpoint-bytes`), request bodies of
at most B bytes (`--max-request-bytes`) and Q requests taken at once (`--max-concurrent-requests`):

    process + fetch + (M x V + 2) x (m + s) + 2 x C + (Q + REQUEST_OBJECTS) x B

- process: the interpreter, the libraries, the compiled modules, the connections' buffers
  (PROCESS_BYTES + SERVER_BYTES; numba's JIT where the compiled modules are not built, as the
  worker's), and
  the record form's skeletons and scratch arrays (`record_rows.RecordRows.BYTES`);
- fetch: the checkpoint reader's fetch buffers (a response held and one in flight);
- M x V + 2: every version kept, one being decoded, and one just evicted that a request in
  flight may still hold;
- 2 x C: a checkpoint read (its chunks, then the payload they make);
- Q x B: the bodies of the requests taken at once; REQUEST_OBJECTS x B: the one being scored,
  decoded into Python objects.

With `--max-memory SIZE` the server reads checkpoints of at most what the ceiling leaves for one
(C, at most `--max-checkpoint-bytes`): a larger one is refused, naming the options. A server
whose other parts take the ceiling for one model does not start (exit 2, the cause and the
fix); once more models come (a topic that grows) than the ceiling holds, it says so in one
ERROR line and `streammargin_serve_memory_overcommitted` is 1.
"""

from __future__ import annotations

import dataclasses
import typing

from connectors.worker.memory_budget import (
    NAME_OBJECT_BYTES,
    NUMBA_BYTES,
    PROCESS_BYTES,
    format_size,
)

__all__ = ["ServingBudget", "budget_of", "READ_COPIES", "REQUEST_OBJECTS", "SERVER_BYTES"]

# The connections uvicorn holds (`app.MAX_CONNECTIONS`, 256), each with a request head of at
# most `app.MAX_HEAD_BYTES` (64 KiB) and uvicorn's 64 KiB of body read ahead before it stops
# reading: 256 x 128 KiB.
SERVER_BYTES = 32 << 20
# A checkpoint being read holds its chunks and the payload they make (CheckpointStore: "peak
# about twice the checkpoint").
READ_COPIES = 2
# A request body decoded into Python objects (msgspec's lists of floats and strings, a table's
# row trees, the features' dicts): this many times its bytes at most.
REQUEST_OBJECTS = 8
# The checkpoint reader's fetches: kafka-python holds a response and has one in flight, each at
# most the store's fetch size (8 MiB, or two chunks).
FETCH_BYTES = 2 * (8 << 20)


@dataclasses.dataclass(frozen=True)
class ServingBudget:
    """The bounds of a server's parts (`parts(models)`) against its ceiling (None: none)."""

    max_memory: int | None
    process: int
    fetch: int
    model: int  # one version's model and scaler in the process
    versions_kept: int
    checkpoint: int  # the largest checkpoint read
    requests: int

    def models(self, n: int) -> int:
        return (max(1, n) * self.versions_kept + 2) * self.model

    def parts(self, n: int) -> dict[str, int]:
        return {"process": self.process, "fetch": self.fetch, "models": self.models(n),
                "checkpoint": READ_COPIES * self.checkpoint, "requests": self.requests}

    def total(self, n: int) -> int:
        return sum(self.parts(n).values())

    def overcommitted(self, n: int) -> bool:
        return self.max_memory is not None and self.total(n) > self.max_memory

    def describe(self, n: int, checkpoint: bool = True) -> str:
        return ", ".join(f"{name} {format_size(size)}" for name, size in self.parts(n).items()
                         if checkpoint or name != "checkpoint")


def budget_of(config: typing.Any, versions_kept: int, max_request_bytes: int,
              concurrent_requests: int, numba: bool = False) -> ServingBudget:
    """The budget of a server of the workers' `config` (its `max_memory`: bytes, "auto" or
    None). `ValueError` (the cause, then the fix) when the parts other than the checkpoint
    read leave less than one checkpoint of the model's state for it."""
    from streammargin import scaler as scaler_module
    from streammargin.memory import memory_bound, stored_names

    settings = config.task_settings()
    # (a served model may hold every class it may: its ceiling, as a checkpoint can bring it)
    model = settings.build_model()
    model_bound = memory_bound(model)
    from connectors.serving.record_rows import RecordRows
    from streammargin.progressive import PredictionShapes

    in_process = (model_bound + NAME_OBJECT_BYTES * stored_names(model)
                  + PredictionShapes.BYTES)
    scaler = scaler_module.memory_bound() if config.scale else 0
    budget = ServingBudget(
        max_memory=config.max_memory if isinstance(config.max_memory, int) else None,
        process=PROCESS_BYTES + SERVER_BYTES + RecordRows.BYTES + (NUMBA_BYTES if numba else 0),
        fetch=FETCH_BYTES, model=in_process + scaler,
        versions_kept=versions_kept, checkpoint=config.max_checkpoint_bytes,
        requests=(concurrent_requests + REQUEST_OBJECTS) * max_request_bytes)
    if budget.max_memory is None:
        return budget
    room = budget.max_memory - (budget.total(1) - READ_COPIES * budget.checkpoint)
    least = model_bound + (scaler_module.state_bound() if config.scale else 0)
    if room // READ_COPIES < least:
        raise ValueError(
            f"--max-memory {format_size(budget.max_memory)} cannot hold one model served: its "
            f"parts take {budget.describe(1, checkpoint=False)}, and reading a checkpoint of "
            f"the model's state needs twice {format_size(least)} more.\n"
            "  fix: raise --max-memory, or lower --versions-kept, --max-request-bytes or "
            "--max-concurrent-requests")
    checkpoint = min(config.max_checkpoint_bytes, room // READ_COPIES)
    return dataclasses.replace(budget, checkpoint=checkpoint)
