"""`--model-scope topic`: the partitions of an input topic learn one model (issue 25).

With `--model-scope partition` (the default) each partition's task trains a model of its own, on
a P-th of the stream. With `topic`:

- within a worker, the tasks of a topic share one model object, which learns every record it is
  given, in order, as one model would. A worker that owns every partition trains exactly one
  model of the topic. A poll's batches of the topic are taken by timestamp (`in_time_order`),
  so that the model learns them roughly in the order they were written;
- across workers, the models are exchanged through a compacted topic (`--model-topic`) and mixed
  (`streammargin.mixing.mix`): once a worker's tasks of a topic have processed `--mix-every`
  records since its last exchange, it writes its model (one record, under the checkpoint key of
  the lowest partition it owns, chunked as a checkpoint is when large) with its weight, the
  records it learnt since its last exchange; it reads the latest record of every partition it
  does not own, keeps those it has not mixed in before, and replaces its model by the weighted
  mean of its own and those (federated averaging's weights: a copy that learnt nothing adds
  nothing).

This is *asynchronous iterative parameter mixing* without a coordinator (`--model-exchange
mix`). It needs neither coordinator nor barrier, so a slow or idle worker never holds the others
up. Without a barrier the peers' models are those of their last exchange: which peer models a
mix sees depends on timing.

With `--model-exchange delta`, for a binary ALMA (and the default for one that averages, `auto`:
`resolved_exchange`), a worker writes its *cumulative contribution* instead, what its model holds
beyond what it took from its peers, and adds each peer's new contribution minus the one it added
before (`streammargin.delta.DeltaLedger`; records carry the worker's stream id, which outlives the
key a rebalance changes). Every worker's corrections are then kept in full, where the mean of the
copies brings each at a P-th of its size, and the mixed model lags a drift: in
benchmarks/topic_scope_sim.py (36,000 records, the hyperplane, RBF drift and SEA drift, every 200
records a worker) the gap to one model is -0.3 points on average and -0.7 at worst, against -1.0
and -1.9 for parameter mixing. Why not for every model: the budget SVM and the AutoClassifier
gained nothing from delta averaging on RBF drift (docs/kafka.md), no sum of contributions is built
for the other hypotheses (support sets, the CPM's faces), and the AutoClassifier exchanges the
member it serves. Delta averaging of each peer's change since its last exchange (no ledger),
measured before, lost accuracy where parameter mixing kept it: contributions must be cumulative.

An AutoClassifier whose whole record is beyond `--max-model-bytes-share` (its CPM's replay
window and its budget SVM's support make it 130-314 KB) sends the member it serves instead, the
one its predictions come from (`encode_member_record`). A peer mixes that member alone into its
own model (`streammargin.mixing.mix_member`), if their labels played the same roles
(`AutoClassifier.member_roles`), and keeps its other members as they are.

A restored or new task brings its own model (its checkpoint's, or a fresh one); it joins the
shared model as it is restored (`ModelScope.join`), weighted by the records it learnt, at least
one, so that a restore holds three models of a topic at most, not one per partition. With
`--scale` the tasks share one scaler too (the one that has seen the most records); scalers are
not exchanged between workers.

What a crash does: each task's checkpoint holds the model as it was, and a restart replays the
records since, as in partition scope; but the replay's mixes meet the peers' models of now, not
of then. The model after a SIGKILL is therefore a topic-scope model of the same records, not the
bit-identical model of an uninterrupted run: tests/test_model_scope.py measures the difference.
With delta averaging, a restarted worker begins a new stream, and its checkpoint's model counts
as taken: the peers' records it reads first are adopted, not added again. Two bounded errors
follow, each at most the records of one checkpoint interval (`--checkpoint-every`): what the
peers contributed between its checkpoint and its restart is not added to it, and the
corrections it had published after its checkpoint are published again by the replay. The peers
keep the dead stream's last contribution in their models, as they would keep its corrections.

A record on the model topic is untrusted like a checkpoint: its bytes are bounded before they are
read (twice this worker's model's memory ceiling and a MiB, `Worker._model_exchange`),
`streammargin.state.loads` never runs code, the model's parameters must be this worker's model's
(so its memory ceiling, given to `from_state` before anything is allocated, is this worker's), and
its class, group, topic and partition must be those its key says (a member record: a member of
this worker's AutoClassifier, checked as a checkpoint's member is). A refused record is left out of
the mix, counted (`streammargin_model_records_refused_total`) and logged once; the stream goes on.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import heapq
import logging
import math
import random
import time
import typing

import streammargin
from connectors.models import model_class
from connectors.state import checkpoint as checkpoint_module
from connectors.task.partition import PartitionTask
from connectors.task.pending_labels import checked_count
from connectors.task.settings import TaskSettings, check_model_kind, restore_part
from streammargin import state as state_module
from streammargin.alma import ALMAClassifier
from streammargin.auto import AutoClassifier
from streammargin.delta import MAX_STREAM, DeltaLedger
from streammargin.errors import StateError
from streammargin.memory import memory_bound

log = logging.getLogger("connectors.worker")

MODEL_SCOPES = ("partition", "topic")
MODEL_EXCHANGES = ("auto", "mix", "delta")
MODEL_RECORD_FORMAT = "streammargin-model/1"
DEFAULT_MIX_EVERY = 2_000
DEFAULT_DELTA_EVERY = 200


def default_mix_every(exchange: str) -> int:
    """Records a worker processes between two exchanges, unless `--mix-every` says: parameter
    mixing gains nothing from a shorter period, delta averaging does (docs/kafka.md)."""
    return DEFAULT_DELTA_EVERY if exchange == "delta" else DEFAULT_MIX_EVERY
DEFAULT_MAX_MODEL_BYTES_SHARE = 0.05
# The CPU an exchange may take, a share of the main thread's processing CPU (`ModelScope`'s
# max_cpu_share). An exchange costs a few ms of CPU whatever the model (a record written, the
# peers' read and checked, their models added), so at a fixed period its share grows as records
# get cheaper: ALMA on 3 features, every 200 records, cost 1.2x-1.6x partition scope's CPU per
# record (benchmarks/model_scope_worker.py --processes). The budget makes the period follow the
# cost instead.
DEFAULT_MAX_EXCHANGE_CPU_SHARE = 0.1


def exchange_memory_bound(partitions: int, exchange: str, owned: int = 1,
                          ledger: bool = True) -> int:
    """How many times the model's ceiling (`streammargin.memory.memory_bound`) an exchange on a
    topic of `partitions` partitions may hold at once, for a worker that owns `owned` of them
    (docs/kafka.md, "Memory"). It reads the latest record of each partition it does not own, so
    at most Q = P - owned peer models. `mix`: 2Q + 2, the worker's model, the mix, the peers'
    models and a kernel mix's union of their supports (one support per peer at most). `delta`:
    Q + P + 5, the worker's model, a decoded record's, the peers' models, and the ledger's P + 3
    parts (one contribution per peer stream, its own, the model after its last exchange, a
    fresh model's). A worker that owns every partition reads and mixes nothing: 0 for `mix`,
    and for `delta` the ledger's P + 3 if it keeps one (`ledger`: begun with its first peer)."""
    peers = max(0, partitions - max(1, owned))
    if exchange == "mix":
        return 2 * peers + 2 if peers else 0
    if peers:
        return peers + partitions + 5
    return partitions + 3 if ledger else 0


def encode_model_record(settings: TaskSettings, topic: str, partition: int, serial: int,
                        weight: int, model: typing.Any) -> bytes:
    """A model-topic record: a worker's model of `topic`, under the key of `partition` (the lowest
    it owns), its weight in the peers' next mixes, and a serial number that tells records apart."""
    return _encode_record(settings, topic, partition, serial, weight, "model", model.to_state())


def encode_contribution_record(settings: TaskSettings, topic: str, partition: int, stream: int,
                               serial: int, weight: int, contribution: ALMAClassifier) -> bytes:
    """A model-topic record of `--model-exchange delta`: the cumulative contribution of a worker's
    stream (`streammargin.delta.DeltaLedger`), an ALMA model, and the stream's id; `serial`
    grows along the stream."""
    return _encode_record(settings, topic, partition, serial, weight, "contribution",
                          contribution.to_state(), stream=stream)


def resolved_exchange(exchange: str, settings: TaskSettings) -> str:
    """The scheme `--model-exchange` names for the model of `settings`: "auto" is delta
    averaging for a binary ALMA that serves its average (the default, `average=True`): every
    worker's corrections kept in full, it follows a drift where parameter mixing lags
    (docs/kafka.md). Parameter mixing for the others: the budget SVM and the AutoClassifier
    gained nothing from delta averaging on RBF drift, an AutoClassifier exchanges the member it
    serves, and an ALMA serving its last hypothesis (`average=False`) lost to mixing (-1.2 mean,
    -1.8 worst against -0.7 and -1.2: the peers' stale corrections add up, and only the average
    smooths them). Raises `ValueError` for "delta" with a model other than a binary ALMA."""
    if exchange not in MODEL_EXCHANGES:
        raise ValueError(f"model_exchange must be one of {MODEL_EXCHANGES}, got {exchange!r}")
    linear = model_class(settings.model) is ALMAClassifier and not settings.one_vs_rest
    if exchange == "delta" and not linear:
        raise ValueError(f"model_exchange delta is built for a binary ALMA, not --model "
                         f"{settings.model}{' --one-vs-rest' if settings.one_vs_rest else ''}: "
                         "use mix (or auto)")
    if exchange == "auto":
        averaged = settings.params.get("average", True) is not False
        return "delta" if linear and averaged else "mix"
    return exchange


def encode_member_record(settings: TaskSettings, topic: str, partition: int, serial: int,
                         weight: int, model: typing.Any, member: str) -> bytes:
    """A model-topic record of one member of a worker's AutoClassifier (the one it serves), for
    when the whole model is beyond `--max-model-bytes-share`: `AutoClassifier.member_to_state`
    (the member's state and the model's labels) in place of the model's."""
    return _encode_record(settings, topic, partition, serial, weight, "member",
                          model.member_to_state(member))


def _encode_record(settings: TaskSettings, topic: str, partition: int, serial: int, weight: int,
                   field: str, content: dict, **extra: typing.Any) -> bytes:
    """The fields every model-topic record has (what `decode_model_record` checks first), then
    `field` ("model", "member" or "contribution") and any `extra` fields."""
    return state_module.dumps(
        {
            "format": MODEL_RECORD_FORMAT,
            "group": settings.group_id,
            "topic": topic,
            "partition": partition,
            "serial": serial,
            "weight": weight,
            **extra,
            field: content,
        }
    )


@dataclasses.dataclass(frozen=True)
class PeerModel:
    """A peer's model, read from the model topic and checked; or, for a member record, that
    member (`member` its name) and the `AutoClassifier.member_roles` of the peer's model."""

    topic: str
    partition: int
    serial: int
    weight: int
    model: typing.Any
    member: str | None = None
    roles: tuple | None = None
    stream: int | None = None  # a contribution's (`--model-exchange delta`)


def decode_model_record(payload: bytes, settings: TaskSettings, topic: str, partition: int,
                        params: dict, max_model_bytes: int, exchange: str = "mix") -> PeerModel:
    """The model of a model-topic record under the key of `topic`/`partition` (or the member of
    a member record, `encode_member_record`, or the contribution of a contribution record,
    `encode_contribution_record`); `StateError` (and nothing else) for anything malformed or
    impossible: unreadable bytes, another format, group, topic or partition, another kind of
    model than `settings` build (a member record where they build no AutoClassifier), a record
    of the other `exchange` scheme, a stream id out of range, parameters other than `params`
    (this worker's model's), or a state whose parameters allow more than `max_model_bytes`
    (refused before anything is allocated)."""
    fields = state_module.loads(payload)
    found = fields.get("format")
    if found != MODEL_RECORD_FORMAT:
        raise StateError(f"format {str(found)[:40]!r}, this worker reads {MODEL_RECORD_FORMAT!r}")
    written_for = (fields.get("group"), fields.get("topic"), fields.get("partition"))
    if written_for != (settings.group_id, topic, partition):
        raise StateError(f"it was written for {'/'.join(map(str, written_for))!r:.200}, not "
                         f"{settings.group_id}/{topic}/{partition}")
    serial = checked_count(fields.get("serial"), "serial")
    weight = checked_count(fields.get("weight"), "weight")
    if ("contribution" in fields) != (exchange == "delta"):
        held, other = (("a contribution (--model-exchange delta)", "mixes models")
                       if "contribution" in fields else
                       ("a model to mix (--model-exchange mix)", "adds contributions"))
        raise StateError(f"it holds {held}, and this worker {other}: every worker of group "
                         f"{settings.group_id!r} must run one --model-exchange")
    stream = None
    if exchange == "delta":
        stream = fields.get("stream")
        if type(stream) is not int or not 1 <= stream <= MAX_STREAM:
            raise StateError(f"its stream id must be an integer in [1, 2**63), got "
                             f"{stream!r:.60}")
        if "model" in fields or "member" in fields:
            raise StateError("it holds a contribution and a model")
        fields["model"] = fields.pop("contribution")
    if "member" in fields:
        if "model" in fields or model_class(settings.model) is not AutoClassifier or (
            settings.one_vs_rest
        ):
            raise StateError(f"it holds a member of an AutoClassifier, not the model of --model "
                             f"{settings.model}")
        member, roles = restore_part("member", functools.partial(
            AutoClassifier.member_from_state, params, max_bytes=max_model_bytes), fields["member"])
        return PeerModel(topic, partition, serial, weight, member, fields["member"]["member"],
                         roles)
    saved = fields.get("model")
    if not isinstance(saved, dict):
        raise StateError("it has no model state")
    model = restore_part("model", functools.partial(streammargin.from_state,
                                                    max_bytes=max_model_bytes), saved)
    check_model_kind(model, settings)
    if model._get_params() != params:
        raise StateError(f"its model's parameters differ from this worker's ({params!r:.200})")
    return PeerModel(topic, partition, serial, weight, model, stream=stream)


def _shared_scaler(own: list[PartitionTask]) -> typing.Any:
    """The scaler (`--scale`) a worker's tasks of a topic share with their model: the one that
    has seen the most records. Scalers are not exchanged between workers: each worker's
    statistics are of its own records, a sample of the topic's. (Pooling the tasks' scalers
    instead would count a shared scaler's records once per task that checkpointed it.)"""
    scalers = {id(t.scaler): t.scaler for t in own if t.scaler is not None}
    if not scalers:
        return None
    return max(scalers.values(), key=lambda s: sum(s.counts.values()))


@dataclasses.dataclass
class _Exchange:
    """One exchange between its start (the worker's models encoded, its weight) and its end
    (the peers' records read and checked in the background, then mixed in)."""

    weights: dict[str, int]
    future: concurrent.futures.Future


class ModelScope:
    """A worker's side of `--model-scope topic`: one model per topic shared by its tasks,
    exchanged with its peers' and mixed.

    An exchange has two halves. The main thread encodes the worker's model of each topic (its
    state at that record) and hands the rest to a thread of the scope's own: writing the record,
    reading the model topic, checking the peers' records (`decode_model_record`: numba code and
    waits on the broker, ~150 ms a read measured, which the main thread went on processing
    through). Once that is done, the main thread mixes the peers' models into the worker's model
    as it is then (`step`). `exchange` does both halves at once.

    Parameters
    ----------
    store
        A `CheckpointStore` on the model topic (`Transport.checkpoint_store`): chunking, size
        limits and reading the latest record of each key come with it (`follow`: the records
        since the last exchange's read). Only the scope's thread uses it, one exchange at a
        time.
    settings
        The tasks' settings (what a peer's model must be).
    mix_every
        Records a worker's tasks of a topic process between two exchanges.
    partitions_for
        The partitions of an input topic (the transport's metadata).
    max_bytes_share
        At most this share of the input's bytes (those the worker's tasks read, `read`) goes to
        the model topic: an exchange due by `mix_every` waits until the bytes written, with a
        record as large as the last, stay within it. None: no budget.
    exchange
        "mix" (asynchronous parameter mixing) or "delta" (asynchronous delta averaging of a
        binary ALMA, `streammargin.delta`): `resolved_exchange`.
    max_cpu_share
        The CPU of an exchange (its main-thread halves and the scope's thread, measured with
        `time.thread_time`) is at most this share of the main thread's CPU for everything else
        until the next, the time it waited for records (`waited`) counting as such: an exchange
        due by `mix_every` waits until the one before is paid for. So in a backlog of cheap
        records the period grows until the exchanges cost that share, and the worker's
        throughput stays within it of partition scope's; a worker that waits for its records
        exchanges every `mix_every` records, on time it had spare. Time is not banked: what an
        exchange waits for is counted from the end of the one before. None: no budget. The
        clients' own threads (the model topic's reads and writes on the wire) are not
        counted.

    """

    def __init__(self, store: checkpoint_module.CheckpointStore, settings: TaskSettings,
                 mix_every: int, partitions_for: typing.Callable[[str], typing.Any],
                 max_bytes_share: float | None = None, exchange: str = "mix",
                 max_cpu_share: float | None = None):
        if mix_every < 1:
            raise ValueError(f"mix_every must be >= 1, got {mix_every!r}")
        if exchange not in ("mix", "delta"):
            raise ValueError(f"exchange must be mix or delta, got {exchange!r}")
        self.scheme = resolved_exchange(exchange, settings)
        # --model-exchange delta: per topic, the worker's ledger and the model it follows.
        self._ledgers: dict[str, DeltaLedger] = {}
        self._followed: dict[str, typing.Any] = {}
        # Per topic, the weight of the models `join` mixed into the shared one since the last
        # exchange began (each a task's records since, at least one).
        self._joined: dict[str, int] = {}
        if max_bytes_share is not None and not 0.0 < max_bytes_share:
            raise ValueError(f"max_bytes_share must be > 0, got {max_bytes_share!r}")
        self.max_bytes_share = max_bytes_share
        if max_cpu_share is not None and not 0.0 < max_cpu_share:
            raise ValueError(f"max_cpu_share must be > 0, got {max_cpu_share!r}")
        self.max_cpu_share = max_cpu_share
        self._main_cpu_at_start: float | None = None  # the main thread's, at the first check
        # The last exchange's CPU, and the main thread's CPU and waits when it ended: what the
        # next exchange waits for (`_cpu_short_by`).
        self._last_exchange_cpu = 0.0
        self._spent_before = 0.0  # the exchanges' CPU when the last one ended
        self._paid_from: tuple[float, float] | None = None
        self.input_bytes = 0
        self.input_records = 0
        self.idle_seconds = 0.0  # the main thread's waits for records (`waited`)
        self._last_record_bytes = 0
        self._whole_bytes: dict[str, int] = {}  # the last whole record of a topic's model
        self.store = store
        self.settings = settings
        self.mix_every = mix_every
        self.partitions_for = partitions_for
        self._random = random.Random()
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="streammargin-model-exchange")
        self._exchange: _Exchange | None = None
        # The (stream, serial) of each key's record last mixed in: a record is mixed in once.
        self._mixed_in: dict[tuple[str, int], tuple[int | None, int]] = {}
        # The stream id of each key's latest record: which streams are on the topic now
        # (`DeltaLedger.seen`); `store.follow` gives only the records since. Written by the
        # scope's thread, read by the main thread once that thread's half is done.
        self._key_streams: dict[tuple[str, int], typing.Any] = {}
        # The model-topic offset of each key's last refused record: logged once each.
        self._refused_at: dict[tuple[str, int], int] = {}
        self.exchanges = 0
        self.peer_models = 0
        self.refused = 0
        self.bytes_written = 0
        self.bytes_read = 0
        self.seconds = 0.0  # on the main thread: encoding and mixing
        self.cpu_seconds = 0.0  # the CPU of those seconds
        self.background_seconds = 0.0  # on the scope's thread: writing, reading, checking
        # The scope's thread's CPU (its wall time above is mostly waits on the broker): what an
        # exchange costs the machine besides the main thread's `seconds`.
        self.background_cpu_seconds = 0.0

    @property
    def has_ledger(self) -> bool:
        """Whether a delta ledger is kept (begun at the first exchange with a peer)."""
        return bool(self._ledgers)

    def counters(self) -> dict[str, typing.Any]:
        return {
            "exchanges": self.exchanges,
            "peer_models": self.peer_models,
            "refused": self.refused,
            "bytes_written": self.bytes_written,
            "bytes_read": self.bytes_read,
            "input_bytes": self.input_bytes,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "background_seconds": round(self.background_seconds, 3),
            "background_cpu_seconds": round(self.background_cpu_seconds, 3),
        }

    def read(self, n_bytes: int, n_records: int = 0) -> None:
        """The worker's tasks read `n_bytes` more of input (the budget of `max_bytes_share`; 0
        without it) in `n_records` records (what a record costs, for `max_cpu_share`)."""
        self.input_bytes += n_bytes
        self.input_records += n_records

    def within_budget(self) -> bool:
        """Whether one more record, as large as the last, keeps the bytes written within
        `max_bytes_share` of the input read."""
        return self._affordable(self._last_record_bytes)

    def _affordable(self, size: int) -> bool:
        share = self.max_bytes_share
        return share is None or self.bytes_written + size <= share * self.input_bytes

    def within_cpu_budget(self) -> bool:
        """Whether the last exchange's CPU is within `max_cpu_share` of the main thread's
        processing CPU and waits since (called on the main thread)."""
        return self._cpu_short_by() <= 0.0

    def waited(self, seconds: float) -> None:
        """The main thread waited `seconds` for records (the wait of a poll that could have
        taken more): time the exchanges' CPU budget counts as the processing's, as the worker
        had nothing else to do."""
        if seconds > 0.0:
            self.idle_seconds += seconds

    def _cpu_short_by(self) -> float:
        """The main thread's processing CPU (or wait for records, `waited`) still needed since
        the last exchange ended before its CPU is within `max_cpu_share` of it (<= 0: within
        it). Why not the totals since the start: waits bank time, and a worker idle for a
        minute before a backlog then exchanged through the backlog at the period, whatever it
        cost (113-146 exchanges of ALMA where the budget allows ~33)."""
        if self.max_cpu_share is None:
            return 0.0
        now = time.thread_time()
        if self._main_cpu_at_start is None:
            self._main_cpu_at_start = now
        if self._paid_from is None:
            return 0.0
        cpu_then, waited_then = self._paid_from
        since = (now - cpu_then) + (self.idle_seconds - waited_then)
        return self._last_exchange_cpu / self.max_cpu_share - since

    def records_to_exchange(self, tasks: typing.Iterable[PartitionTask], topic: str) -> int:
        """Records the tasks of `topic` may still process before the next exchange (>= 1)."""
        if self._exchange is not None or not self.within_budget():
            return self.mix_every  # the next one starts once this one has ended
        short = self._cpu_short_by()
        if short > 0.0:
            # Held back by the CPU budget: the records whose processing pays for the next
            # exchange, at what a record has cost so far. Why: slices of --mix-every meanwhile
            # were each a task.process call, its sends and a check; at 200 records they cost
            # the main thread a fifth more than slices of 2,000 (ALMA on SEA, delta averaging).
            processing = time.thread_time() - self._main_cpu_at_start - self.cpu_seconds
            per_record = processing / self.input_records if self.input_records else 0.0
            if per_record <= 0.0:
                return self.mix_every
            return max(self.mix_every, math.ceil(short / per_record))
        done = sum(task.since_mix for task in tasks if task.topic == topic)
        return max(1, self.mix_every - done)

    def due(self, tasks: typing.Iterable[PartitionTask]) -> bool:
        """Whether the tasks of some topic processed `mix_every` records since the last
        exchange, or some task does not share its topic's model yet (new, restored)."""
        since: dict[str, int] = {}
        models: dict[str, set[int]] = {}
        for task in tasks:
            since[task.topic] = since.get(task.topic, 0) + task.since_mix
            models.setdefault(task.topic, set()).add(id(task.model))
        return (any(n >= self.mix_every for n in since.values()) and self.within_budget()
                and self.within_cpu_budget()) or any(len(ids) > 1 for ids in models.values())

    def join(self, task: PartitionTask, tasks: typing.Iterable[PartitionTask]) -> None:
        """A task restored or new on a topic of which the worker has `tasks` already: its
        model (and scaler) is mixed into theirs now, and the tasks share the result.

        Why now and not at the next exchange: twelve tasks restored at once held twelve models
        until then, a model's ceiling each (34 MiB for ALMA with --scale at 126-character
        names). Joined one at a time, a restore holds the shared model, the restored one and
        their mix at most (`memory_budget.TOPIC_SCOPE_MODELS`). The mix is the one the exchange
        would have made: a weighted mean is the same taken in steps, each step's model
        weighted by what it holds (the tasks' records since the last exchange, at least one
        each). A kernel model's union is brought within its budget at each step instead of
        once."""
        # (a task of the same partition is the one this replaces, never a sharer)
        own = [t for t in tasks if t.topic == task.topic and t.partition != task.partition]
        if not own:
            return  # the topic's first task: its model is the shared one
        local, since = self._local_model(own)
        if task.model is local:
            return
        from streammargin.mixing import mix

        weight = max(since, 1) + self._joined.get(task.topic, 0)
        added = max(task.since_mix, 1)
        model = mix([local, task.model], [weight, added])
        self._joined[task.topic] = self._joined.get(task.topic, 0) + added
        if self._followed.get(task.topic) is local:
            # (--model-exchange delta: the merge is not the worker's learning; a ledger that
            # follows another model sees the change at the next exchange, `_ledger`)
            self._ledgers[task.topic].merged(local, model)
            self._followed[task.topic] = model
        scaler = _shared_scaler([*own, task])
        for shared in (*own, task):
            shared.model, shared.scaler = model, scaler

    def step(self, tasks: typing.Sequence[PartitionTask]) -> None:
        """The main loop's call: ends the exchange under way if its reading is done, and
        starts the next one if it is due. Raises `CheckpointError` when the model topic could
        not be written or read."""
        if self._exchange is not None:
            if not self._exchange.future.done():
                return
            self._finish(tasks)
        if self.due(tasks):
            self._start(tasks)

    def exchange(self, tasks: typing.Sequence[PartitionTask]) -> None:
        """A whole exchange now: the one under way ended (waiting for it), then a new one
        started and ended."""
        if self._exchange is not None:
            self._finish(tasks)
        self._start(tasks)
        self._finish(tasks)

    def close(self, timeout: float | None = None) -> None:
        """Wait for the exchange under way (its result is dropped), then close the store."""
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            concurrent.futures.wait([exchange.future], timeout)
        self._thread.shutdown(wait=False, cancel_futures=True)
        self.store.close()

    # The two halves ----------------------------------------------------------------------------

    def _start(self, tasks: typing.Sequence[PartitionTask]) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        by_topic = _by_topic(tasks)
        payloads, weights, wanted = {}, {}, {}
        self._joined.clear()
        for topic, own in by_topic.items():
            model, weight = self._local_model(own)
            scaler = _shared_scaler(own)
            for task in own:
                task.model, task.scaler = model, scaler
            weights[topic] = 0
            owned = {t.partition for t in own}
            partitions = self.partitions_for(topic) or ()
            peer_keys = [(topic, p) for p in sorted(partitions) if p not in owned]
            if not peer_keys:
                # The worker owns every partition: its model is the topic's, and a record would
                # have no reader (one that joins gets a record at the next exchange after it).
                for task in own:
                    task.since_mix = 0
            elif weight > 0:
                lowest = min(t.partition for t in own)
                if self.scheme == "delta":
                    stream, serial, contribution = self._ledger(topic, own, model).publish(model)
                    payload = encode_contribution_record(self.settings, topic, lowest, stream,
                                                         serial, weight, contribution)
                    self._last_record_bytes = len(payload)
                else:
                    payload = self._record(topic, lowest, weight, model)
                if self._affordable(len(payload)):
                    payloads[(topic, lowest)] = payload
                    self.bytes_written += len(payload)
                    weights[topic] = weight
                    for task in own:
                        task.since_mix = 0
                # Else --max-model-bytes-share holds the record back: the records it learnt
                # stay counted, and go out with the next record the budget allows (a
                # contribution is cumulative: the next one holds this one's).
            wanted[topic] = (peer_keys, model._get_params(), memory_bound(model))
        future = self._thread.submit(self._write_and_read, payloads, wanted, dict(self._mixed_in),
                                     dict(self._refused_at))
        self._exchange = _Exchange(weights, future)
        self.seconds += time.perf_counter() - started
        self.cpu_seconds += time.thread_time() - cpu

    def _record(self, topic: str, partition: int, weight: int, model: typing.Any) -> bytes:
        """The record of the worker's model of `topic` (under the key of `partition`); for an
        AutoClassifier whose whole record is beyond the bytes budget, the record of the member
        it serves, which is what its predictions come from. (On the hyperplane, ALMA's 1.4 KB
        against the whole model's 314 KB, most of it the CPM's replay window and the budget
        SVM's support: within 5% of the input, the whole model went out once per ~13,000
        records a worker, its ALMA every 60.) Sets the size the budget waits for: the smaller
        record's."""
        serial = self._random.getrandbits(63)
        auto = isinstance(model, AutoClassifier)
        whole = self._whole_bytes.get(topic)
        # (The whole model's size is known from its last encoding, which costs ~8 ms for this
        # one: it is encoded again only when the budget allows a record that large.)
        if not auto or whole is None or self._affordable(whole):
            payload = encode_model_record(self.settings, topic, partition, serial, weight, model)
            self._whole_bytes[topic] = self._last_record_bytes = len(payload)
            if not auto or self._affordable(len(payload)):
                return payload
        # (The served member always takes part: beyond max_ovr_classes the CPM serves alone.)
        payload = encode_member_record(self.settings, topic, partition, serial, weight, model,
                                       model.best)
        self._last_record_bytes = len(payload)
        return payload

    def _write_and_read(self, payloads: dict, wanted: dict, mixed_in: dict,
                        refused_at: dict) -> dict[str, list[tuple]]:
        """The scope's thread: the worker's records written (acknowledged), then per topic the
        peers' latest records read and checked: (key, offset, PeerModel or the reason it is
        refused, bytes read) for each new one."""
        started, cpu = time.perf_counter(), time.thread_time()
        if payloads:
            self.store.write(payloads)
        found: dict[str, list[tuple]] = {}
        for topic, (keys, params, max_model_bytes) in wanted.items():
            found[topic] = []
            if not keys:
                continue
            records = self.store.follow(keys)
            for key in sorted(records):
                # (each record's payload let go once decoded: P of them at once, beside the P
                # models they decode to, were most of an exchange's memory for kernel models)
                loaded = records.pop(key)
                if isinstance(loaded, checkpoint_module.RefusedCheckpoint):
                    found[topic].append((key, loaded.offset, loaded.reason, 0))
                    continue
                if refused_at.get(key) == loaded.offset:
                    continue  # the record refused before: counted and logged once
                size = len(loaded.payload)
                try:
                    head = state_module.peek(loaded.payload)
                    self._key_streams[key] = head.get("stream")
                    if ((head.get("stream"), head.get("serial")) == mixed_in.get(key)
                            or head.get("weight") == 0):
                        continue  # nothing new since it was mixed in: not decoded again
                    peer = decode_model_record(loaded.payload, self.settings, key[0], key[1],
                                               params, max_model_bytes, self.scheme)
                except StateError as error:
                    found[topic].append((key, loaded.offset, str(error), size))
                    continue
                found[topic].append((key, loaded.offset, peer, size))
        self.background_cpu_seconds += time.thread_time() - cpu
        self.background_seconds += time.perf_counter() - started
        return found

    def _finish(self, tasks: typing.Sequence[PartitionTask]) -> None:
        exchange, self._exchange = self._exchange, None
        found = exchange.future.result()  # CheckpointError from the scope's thread
        started, cpu = time.perf_counter(), time.thread_time()
        for topic, own in _by_topic(tasks).items():
            owned = {t.partition for t in own}
            peers = []
            for key, offset, result, size in found.get(topic, ()):
                self.bytes_read += size
                if isinstance(result, str):
                    self._refuse(key, offset, result)
                elif key[1] not in owned and self._mixed_in.get(key) != (result.stream,
                                                                         result.serial):
                    peers.append(result)  # (a partition taken over since is the worker's own)
            if not peers:
                continue
            # The worker's model as it is now: what it had written, and what it learnt since.
            model, since = self._local_model(own)
            if self.scheme == "delta":
                ledger = self._ledger(topic, own, model)
                ledger.seen(stream for (name, partition), stream in self._key_streams.items()
                            if name == topic and partition not in owned and type(stream) is int)
                self.peer_models += ledger.take_in(
                    model, [(p.stream, p.serial, p.model) for p in peers])  # in place
            else:
                model = self._mixed(model, max(exchange.weights.get(topic, 0) + since, 1), peers)
                self.peer_models += len(peers)
            scaler = _shared_scaler(own)  # (a task taken on since the start shares it too)
            for task in own:
                task.model, task.scaler = model, scaler
            for peer in peers:
                self._mixed_in[(peer.topic, peer.partition)] = (peer.stream, peer.serial)
        self.exchanges += 1
        self.seconds += time.perf_counter() - started
        now = time.thread_time()
        self.cpu_seconds += now - cpu
        spent = self.cpu_seconds + self.background_cpu_seconds
        self._last_exchange_cpu = spent - self._spent_before
        self._spent_before = spent
        self._paid_from = (now, self.idle_seconds)

    @staticmethod
    def _mixed(model: typing.Any, weight: int, peers: list[PeerModel]) -> typing.Any:
        """`--model-exchange mix`: the worker's model (of `weight` records) mixed with the
        peers' new models, and their served members mixed into its own."""
        from streammargin.mixing import mix, mix_member

        wholes = [p for p in peers if p.member is None]
        if wholes:
            model = mix([model, *[p.model for p in wholes]],
                        [weight, *[p.weight for p in wholes]])
            weight += sum(p.weight for p in wholes)
        for name in dict.fromkeys(p.member for p in peers if p.member is not None):
            # A member mixes in only if the peer's labels played the same roles; else it is
            # left out (not refused: the peers saw their labels in other orders).
            # (Equal roles are one mode, so this model's member takes part as the peer's.)
            roles = model.member_roles()
            same = [p for p in peers if p.member == name and p.roles == roles]
            if same:
                mix_member(model, name, [p.model for p in same],
                           [weight, *[p.weight for p in same]])
        return model

    def _ledger(self, topic: str, own: list[PartitionTask], model: typing.Any) -> DeltaLedger:
        """The ledger of `topic` (`--model-exchange delta`), following `model`, the worker's
        model of it now. Begun at the topic's first exchange: a model restored from a
        checkpoint already holds its peers' contributions (the ledger adopts the first it
        reads). A model merged in since (`_local_model`: a task taken over brought its own) is
        not the worker's learning: the ledger takes the merge as taken."""
        ledger = self._ledgers.get(topic)
        followed = self._followed.get(topic)
        if ledger is None:
            ledger = self._ledgers[topic] = DeltaLedger(
                model, max_streams=max(len(self.partitions_for(topic) or ()), 1),
                adopt=any(task.restored for task in own))
        elif model is not followed:
            ledger.merged(followed, model)
        self._followed[topic] = model
        return ledger

    @staticmethod
    def _local_model(own: list[PartitionTask]) -> tuple[typing.Any, int]:
        """The worker's one model of a topic and the records it learnt since the last exchange:
        the tasks' shared model, mixed first with the model of any task that does not share it
        yet (each weighted by the records its tasks learnt, at least one)."""
        models: dict[int, typing.Any] = {}
        weights: dict[int, int] = {}
        for task in own:
            models[id(task.model)] = task.model
            weights[id(task.model)] = weights.get(id(task.model), 0) + task.since_mix
        total = sum(weights.values())
        if len(models) == 1:
            return next(iter(models.values())), total
        from streammargin.mixing import mix

        keys = list(models)
        return mix([models[k] for k in keys], [max(weights[k], 1) for k in keys]), total

    def _refuse(self, key: tuple[str, int], offset: int, reason: str) -> None:
        if self._refused_at.get(key) == offset:
            return  # still the record refused before
        self._refused_at[key] = offset
        self.refused += 1
        log.warning(
            "the model record of %s/%d on %s (offset %d) is refused and left out of the mix: "
            "%s. Fix: only the workers of group %r may write to that topic",
            key[0], key[1], self.store.topic, offset, reason, self.settings.group_id,
        )


# The shortest run of one partition's records `in_time_order` cuts (but a batch's last). Each run
# is a `task.process` call and its sends, so a run of one record a time would cost every record
# that overhead; runs of 32 learn as well as runs of one did (benchmarks/topic_scope_sim.py: the
# budget SVM on RBF drift -7.2 and -7.3 points from one model, runs of 64 -7.8, of 260 -9.7).
MIN_RUN = 32


def in_time_order(batches: typing.Sequence[tuple[typing.Any, typing.Sequence[typing.Any]]]
                  ) -> list[tuple[typing.Any, typing.Sequence[typing.Any], int, int]]:
    """The records of one poll's batches of a topic's partitions as runs `(owner, records,
    start, end)` in the order of their timestamps, as Kafka Streams picks a task's next record
    from the partition with the lowest head timestamp: a worker whose tasks share one model
    learns the stream roughly in the order it was written, not a poll's partition after
    partition (at 64 KiB fetches, some 260 records of each, which spreads a worker's records
    over thousands of the stream's). A run is at least `MIN_RUN` records (or the rest of its
    batch), and carries on while its records are older than every other partition's head:
    equal timestamps (a burst written in one millisecond) take turns. Each batch keeps its
    offset order."""
    if len(batches) < 2:
        return [(owner, records, 0, len(records)) for owner, records in batches if records]
    # (head timestamp, records taken, batch): at equal timestamps the batch that has given
    # the fewest records goes first, so the batches of a burst take turns
    heads = [(_timestamp(records[0]), 0, i) for i, (_, records) in enumerate(batches) if records]
    heapq.heapify(heads)
    runs = []
    while heads:
        _, start, i = heapq.heappop(heads)
        owner, records = batches[i]
        end = min(start + MIN_RUN, len(records))
        if heads:
            limit = heads[0][0]
            while end < len(records) and _timestamp(records[end]) < limit:
                end += 1
        else:
            end = len(records)
        runs.append((owner, records, start, end))
        if end < len(records):
            heapq.heappush(heads, (_timestamp(records[end]), end, i))
    return runs


def _timestamp(record: typing.Any) -> int:
    timestamp = record.timestamp
    return -1 if timestamp is None else timestamp


def _by_topic(tasks: typing.Iterable[PartitionTask]) -> dict[str, list[PartitionTask]]:
    by_topic: dict[str, list[PartitionTask]] = {}
    for task in sorted(tasks, key=lambda t: (t.topic, t.partition)):
        by_topic.setdefault(task.topic, []).append(task)
    return by_topic
