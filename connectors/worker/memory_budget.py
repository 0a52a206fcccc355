"""--max-memory: one ceiling for the whole worker process, and the share of it each part takes.

The worker's memory is the sum of parts that are each bounded (docs/operations.md, "Sizing a
pod"), worker-wide, for `n` assigned input partitions:

    process      the interpreter, the libraries and the compiled modules (PROCESS_BYTES; numba's
                 JIT adds NUMBA_BYTES where the compiled modules are not built, librdkafka
                 LIBRDKAFKA_BYTES)
    fetch        the records fetched and not processed yet: kafka-python holds a fetch response
                 until it is polled and has the next in flight, librdkafka its prefetch queue
                 (queued.max.messages.kbytes) and a response (fetch.max.bytes); a poll then
                 holds as much again as client messages, their values' copies and the decoded
                 events (POLL_COPIES), and max_poll_records x RECORD_OBJECT_BYTES of objects;
                 kafka-python under --model-scope topic at most that of n partitions' stretches
                 (TOPIC_SCOPE_FETCH_BYTES each, or a first batch up to --max-record-bytes)
    outputs      the outputs not acknowledged yet: at most checkpoint_every records' worth, since a
                 checkpoint waits for every output before it (a broker slow to acknowledge blocks
                 the worker there, and its fetching with it): checkpoint_every x OUTPUT_BYTES
    models       each owned partition's model: its ceiling given the classes it holds
                 (`streammargin.memory.memory_bound(model, classes=k)`, k at least 2 and at
                 most its max_classes; a binary model's does not depend on k) + its names'
                 objects (`streammargin.memory.stored_names` x NAME_OBJECT_BYTES), and with
                 --scale the scaler's, `streammargin.scaler.memory_bound`; under
                 --model-scope topic, min(n, TOPIC_SCOPE_MODELS x topics) of the largest
                 shared model, since a topic's tasks share one; + n x TASK_BYTES, each task's
                 own objects
    exchange     --model-scope topic: the models an exchange holds (`exchange_memory_bound`,
                 for the partitions of the topic the worker does not own; none without a
                 peer, but a delta ledger kept from peers it had), each at the shared model's
                 bound at the classes it holds, as the models' term
    schema cache the Schema Registry's schemas (--schema-cache-bytes x SCHEMA_PARSED_FACTOR)
    allocator    1/8 of the ceiling (ALLOCATOR_SHARE): what no term bounds on its own, memory
                 Python's allocator keeps once freed (an arena goes back only once all of it is
                 free) and the records a producer holds while a broker stops acknowledging
    pending      the events waiting for their label: what is left, split evenly between the
                 assigned partitions, each within --label-store-bytes
    checkpoints  a checkpoint of every partition holds what changed in its store and the
                 segments' offsets, a restore the predictions of the waiting events
                 (CHECKPOINT_FACTOR of the store), and its model's and scaler's state (each up
                 to its state's bound, at the classes the model holds); beside them, the
                 largest being encoded ENCODING_STATES times over, or once all are encoded the
                 producer's copies of those sent and not acknowledged (`send_window`: the
                 checkpoint store waits each SEND_WINDOW_BYTES), whichever is more

`fixed` is every part but the pending store: if it leaves less than MIN_PENDING_BYTES at start
(one partition, a fresh model of two classes), the worker exits 2 (`MemoryBudgetError`: the
cause, then the fix). The classes a model holds come from the model itself (its label list;
a restored checkpoint's model brings its own), read once per poll: when a model meets a class
that moves the models' term, the budget grows, the stores' shares shrink, and every partition
is checkpointed in the same turn (`Worker._charge_classes`), so that a share only changes where
a replay starts: a replay restores the classes with the models and the same shares with them
(a share is a function of the owned partitions and of their models' classes). When an
assignment or the classes take the fixed parts past the ceiling (more partitions, more
classes), the worker says so in one ERROR line naming every fix (`overcommit_fixes`), counts it
(`streammargin_memory_overcommitted`) and goes on with the least pending store; it never
exceeds the ceiling silently.
"""

from __future__ import annotations

import dataclasses
import re
import typing

__all__ = ["MemoryBudget", "MemoryBudgetError", "ModelCeiling", "model_ceiling",
           "overcommit_fixes", "parse_size", "format_size", "PROCESS_BYTES", "MIN_PENDING_BYTES",
           "DEFAULT_MAX_MEMORY"]

# The worker's RSS before its first record on the compiled modules: 61-64 MiB on kafka-python
# (benchmarks/worker_rss.py), 77 MiB on librdkafka with --scale; its allocator's arenas then
# hold more once records flow: 144,000 events of 60 features, each labelled at once (an empty
# pending store), peaked at 103 MiB on kafka-python, its fetch buffers and outputs included.
PROCESS_BYTES = 96 << 20
# librdkafka's library, its threads and their buffers (77 MiB before the first record, against 64
# on kafka-python; more once its broker threads run).
LIBRDKAFKA_BYTES = 24 << 20
# numba's JIT where the compiled modules are not built: LLVM and numba's lowering library
# (189 MiB against 64, benchmarks/worker_rss.py).
NUMBA_BYTES = 128 << 20
# A polled record's Python objects beyond its bytes (its ConsumerRecord or Message, the event's
# dict before the model takes it).
RECORD_OBJECT_BYTES = 2 << 10
# A poll holds its records' bytes this many times over: the client's messages (librdkafka's
# taken off its queue, which refills), their values copied into Python and the decoded events.
# Events of 512 KiB on librdkafka at a 64 MiB queue peaked at 554 MiB against 512 before the
# queue took this into account (benchmarks/memory_budget.py, "largest").
POLL_COPIES = 3
# An output waiting for its acknowledgement: the record in its batch and the send's future.
OUTPUT_BYTES = 1 << 10
# A model at its ceiling in a process, against `memory_bound` (the bytes of its arrays and of its
# names' JSON): each stored name is a str object and a dict and a list entry, ~120 B beyond its
# JSON. ALMA at its ceiling with names of 126 characters held 15.2 MiB against a bound of 8.6
# (57,344 names: 122 B each beyond it; tracemalloc, the worker's task, metrics included); with
# names of 6, 8.2 MiB. Twice the bound was charged before: right for ALMA, whose bound is mostly
# names, twice what the models whose arrays make their bound hold (an AutoClassifier of two
# classes held 27.5 MiB against a bound of 31.0 and 5,376 names; the CPM of 3 classes 33.2 MiB
# against 32.7).
NAME_OBJECT_BYTES = 160
# A task's own objects beside its model: its metrics (the rolling window's outcomes, the drift
# detector), its codec's and feature spaces' caches: 60-80 KiB measured (ALMA of 16 features,
# 400 and 3,000 records).
TASK_BYTES = 96 << 10
# --model-scope topic: the models (and scalers) of one topic a worker holds at once. Its tasks
# share one; a task restored brings its checkpoint's, mixed into the shared one at once
# (`ModelScope.join`): the shared model, the restored one and their mix.
TOPIC_SCOPE_MODELS = 3
SCHEMA_PARSED_FACTOR = 4
# A state being encoded holds this many times its bytes at its peak, itself included (the
# arrays' copies, the JSON of the names, the frame): tracemalloc measured 2.1x for ALMA at its
# ceiling of 65,536 names of 126 characters, 2.3x for the scaler's, 2.4x at 1,024 names
# (tests/test_memory_budget.py).
ENCODING_STATES = 2.5
# A round's states are sent while all are held, and the producer keeps a copy of each record
# until it is acknowledged: at most the checkpoint store's window of them (`CheckpointStore.
# write` waits each SEND_WINDOW_BYTES) and the one record that passes it, a chunk. Before the
# window, a worker on 12 partitions of the CPM of 4 classes held 131 MiB of kafka-python's
# batches beside 154 MiB of payloads (tracemalloc), and peaked at 1,317 MiB under 1,280.
def send_window(chunk_bytes: int) -> int:
    """The most bytes of a round's records the producer holds unacknowledged."""
    from connectors.state.checkpoint import SEND_WINDOW_BYTES

    return SEND_WINDOW_BYTES + chunk_bytes
# Kept free for what the allocator holds after a burst of frees (a label flood's joins: 519 MiB
# peak on librdkafka at 512 MiB without it) and for a broker that stops acknowledging for 15 s
# (522 MiB on kafka-python with 1/16; benchmarks/memory_budget.py "label-flood",
# "paused-broker").
ALLOCATOR_SHARE = 1 / 8
# What a store's checkpoints hold beside it, as a share of its bytes. A checkpoint writes what
# changed (`PendingLabels.checkpoint_state`): tracemalloc measured 72 B per waiting event at its
# peak and 21 B kept (the segments' offsets) for 100,000 events of 11 features charged 1,661 B
# each (tests/test_pending_labels.py). A restore holds 180 B per waiting event (297 B at its
# peak) while its store is still empty, each event read again replacing its own: within the
# store's share. Before, each checkpoint encoded the whole store, 0.32-0.6 of it (0.75 was
# charged); a checkpoint of that older format is read once, at the upgrade, within
# --max-checkpoint-bytes.
CHECKPOINT_FACTOR = 0.1
# The least the pending stores may have worker-wide, and each partition's: below them the ceiling
# is too low to wait for labels at all.
MIN_PENDING_BYTES = 16 << 20
MIN_SHARE_BYTES = 1 << 20
# The default ceiling (--max-memory auto): this, or what one partition of the model needs where
# that is more (a one-vs-rest ALMA of 100 classes: 100 model ceilings, 3.1 GiB), so that a
# model of a large ceiling still starts by default. A worker on one to a few partitions of the
# default model fits it with a pending store of 256 MiB per partition (today's
# --label-store-bytes); on 12 partitions the stores share what is left, ~650 MiB, where before
# they could take 3 GiB. 1 GiB is the size of a small pod (a Kubernetes node of 4 GiB runs three
# beside the system's own).
DEFAULT_MAX_MEMORY = 1 << 30
AUTO = "auto"
# The fetch buffers' share of the ceiling, and the most they take (today's defaults: kafka-python
# fetches 8 MiB in all, librdkafka queues 64 MiB). Under the share, kafka-python's response is a
# quarter of it (held, in flight, and a poll of it as objects: `budget_of`), librdkafka's queue
# and response each a fifth (the queue, a response, and a poll taken off the queue as it
# refills).
FETCH_SHARE = 1 / 8
KAFKA_PYTHON_FETCH_BYTES = 8 << 20
LIBRDKAFKA_QUEUE_BYTES = 64 << 20
MIN_FETCH_BYTES = 1 << 20

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000 ** 2, "mb": 1000 ** 2,
          "mib": 1 << 20, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1000 ** 4,
          "tb": 1000 ** 4, "tib": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes of a size such as `512MiB`, `2GiB`, `1.5G` or `1000000` (Kubernetes' and IEC's
    units; `Mi`, `Gi` as Kubernetes writes them).

    >>> parse_size("512MiB"), parse_size("2Gi"), parse_size("1.5GB"), parse_size("4096")
    (536870912, 2147483648, 1500000000, 4096)
    """
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if unit in ("ki", "mi", "gi", "ti"):
        unit += "b"
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size: give bytes with a unit, e.g. 512MiB or 2GiB")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(n: float) -> str:
    """`n` bytes in MiB (GiB from 10 GiB on).

    >>> format_size(3 << 30), format_size(96 << 20)
    ('3072 MiB', '96 MiB')
    """
    if n >= 10 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


class ModelCeiling(typing.NamedTuple):
    """What a model can hold: its bound (`streammargin.memory.memory_bound`) and the names its
    feature spaces store by name (`streammargin.memory.stored_names`), given the classes it
    holds (`classes`, the count charged: None for a binary model)."""

    bound: int
    names: int
    classes: int | None = None


class MemoryBudgetError(ValueError):
    """The parts that cannot shrink take the whole ceiling: the cause, then the fix."""


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """The ceiling and the bounds of the parts that do not depend on the partitions.

    `parts(n)` is every part's bound for `n` assigned partitions, `pending_share(n)` what one
    partition's pending store may hold.
    """

    max_memory: int
    process: int
    fetch: int
    outputs: int
    ceiling: ModelCeiling  # a fresh model of one partition (two classes if multiclass)
    exchange_kind: str
    schema_cache: int
    label_store_bytes: int  # one partition's cap (--label-store-bytes)
    scaler: int = 0  # --scale: the scaler in the process (`streammargin.scaler.memory_bound`)
    scaler_state: int = 0  # and as a checkpoint's state
    auto: bool = False  # --max-memory auto (the default)
    shared_topics: int = 0  # --model-scope topic: the input topics (0: partition scope)
    # Topic scope on kafka-python: the fetch buffers of one partition (its responses' stretch
    # of it, TOPIC_SCOPE_FETCH_BYTES or a larger first batch) and the poll's record objects;
    # `fetch` caps their sum (0: `fetch` alone).
    fetch_partition: int = 0
    fetch_objects: int = 0
    # --model-exchange delta: whether the worker keeps a ledger (`ModelScope.has_ledger`: from
    # its first peer on); without a peer and without one, an exchange holds nothing.
    exchange_ledger: bool = True
    # The owned models' ceilings at the classes each holds (`model_ceiling`): one per owned
    # partition, or under topic scope one per shared model; a partition beyond them is charged
    # `ceiling`, a fresh model's.
    held: tuple[ModelCeiling, ...] = ()
    # A checkpoint round's records the producer holds unacknowledged, at most (`send_window`).
    sending: int = 0

    @property
    def model(self) -> int:
        """A fresh model (and scaler) in the process: its bound, its names' objects."""
        return self.in_process(self.ceiling)

    @property
    def state(self) -> int:
        """A fresh model (and scaler) as a checkpoint's state."""
        return self.state_of(self.ceiling)

    @property
    def exchange_model(self) -> int:
        """--model-scope topic: one exchanged model's bound, the largest shared model's (0:
        partition scope)."""
        return self.largest().bound if self.shared_topics else 0

    def in_process(self, model: ModelCeiling) -> int:
        """A model of this ceiling (and the scaler) in the process."""
        return model.bound + NAME_OBJECT_BYTES * model.names + self.scaler

    def state_of(self, model: ModelCeiling) -> int:
        """A model of this ceiling (and the scaler) as a checkpoint's state."""
        return model.bound + self.scaler_state

    def charged(self, n: int) -> list[ModelCeiling]:
        """The models of `n` partitions: those held, then fresh ones."""
        held = list(self.held[:n])
        return held + [self.ceiling] * (max(1, n) - len(held))

    def largest(self) -> ModelCeiling:
        """The largest model held (a fresh one's ceiling if none is larger)."""
        return max((self.ceiling, *self.held), key=lambda model: model.bound)

    @property
    def classes(self) -> int | None:
        """The most classes a model held is charged (None: binary models)."""
        counts = [m.classes for m in (self.ceiling, *self.held) if m.classes is not None]
        return max(counts) if counts else None

    def holding(self, held: typing.Iterable[ModelCeiling]) -> MemoryBudget:
        """This budget with the owned models at these ceilings; under --max-memory auto the
        ceiling gives way to one partition of the largest of them, as it does at start."""
        budget = dataclasses.replace(self, held=tuple(held))
        if budget.auto:
            one = dataclasses.replace(budget, held=(budget.largest(),),
                                      max_memory=DEFAULT_MAX_MEMORY)
            need = one.needed(1) if one.overcommitted(1) else DEFAULT_MAX_MEMORY
            budget = dataclasses.replace(budget, max_memory=-(-need >> 20) << 20)
        return budget

    def exchange(self, topic_partitions: int, n: int = 1) -> int:
        """The models an exchange holds at once, on a topic of this many partitions of which
        the worker owns `n`."""
        if not self.exchange_model:
            return 0
        from connectors.worker.model_scope import exchange_memory_bound

        bound = exchange_memory_bound(topic_partitions, self.exchange_kind, owned=n,
                                      ledger=self.exchange_ledger)
        return bound * self.exchange_model

    def fetched(self, n: int) -> int:
        """The fetched records of `n` partitions (`fetch`, or less where a fetch takes a small
        stretch of each partition)."""
        if not self.fetch_partition:
            return self.fetch
        return min(self.fetch, max(1, n) * self.fetch_partition + self.fetch_objects)

    def models(self, n: int) -> int:
        """The models (and scalers) of `n` partitions' tasks: one each at the classes it holds,
        or under topic scope TOPIC_SCOPE_MODELS per topic at most, of the largest."""
        n = max(1, n)
        if self.shared_topics:
            models = min(n, TOPIC_SCOPE_MODELS * self.shared_topics)
            return models * self.in_process(self.largest()) + n * TASK_BYTES
        return sum(map(self.in_process, self.charged(n))) + n * TASK_BYTES

    def states(self, n: int) -> int:
        """Every partition's checkpointed state, and beside them in a round the largest being
        encoded ENCODING_STATES times over or, once they are encoded, the producer's copies of
        those it has sent and not had acknowledged (`sending`, all of them at most)."""
        n = max(1, n)
        if self.shared_topics:
            states = [self.state_of(self.largest())] * n
        else:
            states = list(map(self.state_of, self.charged(n)))
        total = sum(states)
        return int(total + max((ENCODING_STATES - 1) * max(states), min(total, self.sending)))

    def fixed(self, n: int, topic_partitions: int | None = None) -> int:
        """Every part but the pending stores and their checkpoints' share."""
        n = max(1, n)
        return (self.process + self.fetched(n) + self.outputs + self.models(n) + self.states(n)
                + self.exchange(topic_partitions or n, n) + self.schema_cache + self.allocator)

    @property
    def allocator(self) -> int:
        return int(self.max_memory * ALLOCATOR_SHARE)

    def pending_total(self, n: int, topic_partitions: int | None = None) -> int:
        """The pending stores' share in all (0 when the fixed parts take the ceiling)."""
        room = (self.max_memory - self.fixed(n, topic_partitions)) / (1 + CHECKPOINT_FACTOR)
        return max(0, min(int(room), max(1, n) * self.label_store_bytes))

    def pending_share(self, n: int, topic_partitions: int | None = None) -> int:
        """One partition's pending store (at least MIN_SHARE_BYTES: a store of nothing waits
        for no label, and an overcommitted worker goes on with the least)."""
        return max(MIN_SHARE_BYTES, self.pending_total(n, topic_partitions) // max(1, n))

    def least(self, n: int) -> int:
        """The least the pending stores of `n` partitions take, their checkpoints included."""
        least = max(MIN_PENDING_BYTES, max(1, n) * MIN_SHARE_BYTES)
        return int(least * (1 + CHECKPOINT_FACTOR))

    def needed(self, n: int, topic_partitions: int | None = None) -> int:
        """The least ceiling that holds `n` partitions (the allocator's share grows with it)."""
        rest = self.fixed(n, topic_partitions) - self.allocator + self.least(n)
        return int(-(-rest // (1 - ALLOCATOR_SHARE)))

    def overcommitted(self, n: int, topic_partitions: int | None = None) -> bool:
        """Whether the parts of `n` partitions may exceed the ceiling (the fixed ones leave less
        than the least pending stores)."""
        return self.max_memory - self.fixed(n, topic_partitions) < self.least(n)

    def parts(self, n: int, topic_partitions: int | None = None) -> dict[str, int]:
        pending = self.pending_share(n, topic_partitions) * max(1, n)
        return {
            "process": self.process,
            "fetch": self.fetched(n),
            "outputs": self.outputs,
            "models": self.models(n),
            "exchange": self.exchange(topic_partitions or max(1, n), max(1, n)),
            "schema cache": self.schema_cache,
            "allocator": self.allocator,
            "pending": pending,
            "checkpoints": int(CHECKPOINT_FACTOR * pending) + self.states(n),
        }

    def describe(self, n: int, topic_partitions: int | None = None) -> str:
        """The start line: the ceiling and its largest parts."""
        parts = sorted(((v, k) for k, v in self.parts(n, topic_partitions).items() if v),
                       reverse=True)
        listed = ", ".join(f"{name} {format_size(v)}" for v, name in parts[:5])
        share = format_size(self.pending_share(n, topic_partitions))
        given = "auto, " if self.auto else ""
        classes = self.classes
        held = "" if classes is None else f"; the models charged up to {classes} classes"
        return (f"memory: --max-memory {given}{format_size(self.max_memory)} at {max(1, n)} "
                f"partition{'s' if n != 1 else ''}: {listed} (each partition's pending store "
                f"{share}{held}; docs/operations.md, \"Sizing a pod\")")

    def check_start(self) -> None:
        """`MemoryBudgetError` if the ceiling cannot hold the worker on one partition."""
        if self.overcommitted(1):
            need = self.needed(1)
            parts = {k: v for k, v in self.parts(1).items() if k not in ("pending", "checkpoints")}
            largest = ", ".join(f"{k} {format_size(v)}" for k, v in
                                sorted(parts.items(), key=lambda kv: -kv[1])[:3])
            raise MemoryBudgetError(
                f"--max-memory {format_size(self.max_memory)} is below what the worker needs on "
                f"one partition, {format_size(need)} ({largest}, and a pending store of "
                f"{format_size(MIN_PENDING_BYTES)}).\nFix: give --max-memory "
                f"{-(-need // (1 << 20))}MiB or more, or a model of a lower ceiling "
                "(--param max_features=...)")


def ceiling(max_memory: int | str | None) -> int | None:
    """The ceiling the fetch buffers' share is taken from (auto: the default's)."""
    return DEFAULT_MAX_MEMORY if max_memory == AUTO else max_memory  # type: ignore[return-value]


def fetch_buffers(transport: str) -> int:
    """How many buffers of `fetch_bytes` the fetched records take at most. kafka-python: a
    response held and one in flight, a poll's records out of the one held (POLL_COPIES - 1 more);
    librdkafka: the queue, a response being read into it, a poll taken off the queue as it
    refills (POLL_COPIES more)."""
    return 2 + POLL_COPIES - (1 if transport == "kafka-python" else 0)


def fetch_bytes(max_memory: int | str | None, transport: str) -> int:
    """kafka-python's fetch_max_bytes, or librdkafka's prefetch queue (its response is as
    large), under a ceiling (None: today's defaults; auto: the default's)."""
    max_memory = ceiling(max_memory)
    default = KAFKA_PYTHON_FETCH_BYTES if transport == "kafka-python" else LIBRDKAFKA_QUEUE_BYTES
    if max_memory is None:
        return default
    whole_mib = (int(max_memory * FETCH_SHARE / fetch_buffers(transport)) >> 20) << 20
    return max(MIN_FETCH_BYTES, min(default, whole_mib))


def model_ceiling(model: typing.Any, classes: int | None = None) -> ModelCeiling:
    """A model's `ModelCeiling` given the classes it holds (`streammargin.memory.held_classes`,
    or `classes` where given; a fresh multiclass model is charged two, a binary model its bound,
    which does not depend on them)."""
    from streammargin.memory import (classes_charged, held_classes, memory_bound,
                                     stored_names)

    held = held_classes(model)
    if held is None:
        return ModelCeiling(memory_bound(model), stored_names(model))
    if classes is not None:
        held = classes
    charged = classes_charged(getattr(model, "max_classes", held), held)
    return ModelCeiling(memory_bound(model, classes=held),
                        stored_names(model, classes=held), charged)


def overcommit_fixes(budget: MemoryBudget, n: int, topic_partitions: int | None,
                     capped: typing.Callable[[int], tuple[ModelCeiling, ...]] | None = None,
                     class_option: str = "--max-classes {}") -> list[str]:
    """What fixes an overcommitted budget of `n` partitions, each as the option to give: a
    ceiling that holds them; where the models' classes are the cause (`capped(k)`: the models
    held, each capped at k classes), the most classes that fit, as `class_option` formats
    them; the most partitions a worker that fit; a model of a lower ceiling."""
    fixes = [f"raise --max-memory above {format_size(budget.needed(n, topic_partitions))}"]
    classes = budget.classes
    if capped is not None and classes is not None and classes > 2:
        for k in range(classes - 1, 1, -1):
            if not budget.holding(capped(k)).overcommitted(n, topic_partitions):
                fixes.append(f"{class_option.format(k)} (a record of a further class "
                             "becomes a dead letter)")
                break
    largest = sorted(budget.held, key=lambda model: -budget.in_process(model))
    for m in range(max(1, n) - 1, 0, -1):
        fewer = budget.holding(largest[:m]) if not budget.shared_topics else budget
        if not fewer.overcommitted(m, topic_partitions):
            fixes.append(f"at most {m} partition{'s' if m != 1 else ''} a worker (more workers "
                         "in the group)")
            break
    fixes.append("a model of a lower ceiling (--param max_features=...)")
    return fixes


def budget_of(config: typing.Any, ceiling: ModelCeiling, numba: bool,
              exchange_kind: str = "mix") -> MemoryBudget:
    """The budget of a `WorkerConfig` (its max_memory set, or auto) with a model of this
    ceiling (`exchange_kind`: the resolved --model-exchange of topic scope)."""
    fetch = max(fetch_bytes(config.max_memory, config.transport), config.max_record_bytes)
    fetched = fetch_buffers(config.transport) * fetch
    record_objects = config.max_poll_records * RECORD_OBJECT_BYTES
    schema_cache = 0
    if config.value_format != "json":
        schema_cache = SCHEMA_PARSED_FACTOR * config.schema_cache_bytes
    auto = config.max_memory == AUTO
    scaler = scaler_state = 0
    if config.scale:  # (the worker's scaler: StandardScaler's default max_features)
        from streammargin import scaler as scaler_module

        scaler, scaler_state = scaler_module.memory_bound(), scaler_module.state_bound()
    fetch_partition = fetch_objects = 0
    if config.model_scope == "topic" and config.transport == "kafka-python":
        # (a response holds at most TOPIC_SCOPE_FETCH_BYTES of each partition, or its first
        # batch where larger: KIP-74; librdkafka's prefetch queue is one for all partitions)
        from connectors.worker.config import TOPIC_SCOPE_FETCH_BYTES

        stretch = max(TOPIC_SCOPE_FETCH_BYTES, config.max_record_bytes)
        fetch_partition = fetch_buffers(config.transport) * stretch
        fetch_objects = record_objects
    budget = MemoryBudget(
        max_memory=DEFAULT_MAX_MEMORY if auto else config.max_memory,
        process=(PROCESS_BYTES + (NUMBA_BYTES if numba else 0)
                 + (LIBRDKAFKA_BYTES if config.transport == "librdkafka" else 0)),
        fetch=fetched + record_objects,
        outputs=config.checkpoint_every * OUTPUT_BYTES,
        ceiling=ceiling,
        exchange_kind=exchange_kind,
        schema_cache=schema_cache,
        label_store_bytes=config.label_store_bytes,
        scaler=scaler,
        scaler_state=scaler_state,
        auto=auto,
        shared_topics=len(config.topics) if config.model_scope == "topic" else 0,
        fetch_partition=fetch_partition,
        fetch_objects=fetch_objects,
        sending=send_window(config.checkpoint_chunk_bytes),
    )
    if auto and budget.overcommitted(1):
        # (the default gives way to a model of a larger ceiling: one partition's need, in MiB)
        budget = dataclasses.replace(budget, max_memory=-(-budget.needed(1) >> 20) << 20)
    return budget
