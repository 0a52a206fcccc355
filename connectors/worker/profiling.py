"""Where the worker's main thread spends its time, by stage, sampled without touching the hot path.

`StageProfiler(thread_id)` starts a daemon thread that looks at the main thread's Python stack
(`sys._current_frames()`) every `interval` seconds and counts each sample in one stage:

    poll        kafka-python's `KafkaConsumer.poll` (fetching, parsing batches, CRC, group
                protocol, waiting for the broker), or the librdkafka transport's (consume,
                and the records built from its messages)
    decode      the codec (`connectors/serializers`: parsing, the Schema Registry, the mapping;
                the batch path's reader)
    scale       the StandardScaler (`streammargin/scaler.py`)
    model       the model (every other `streammargin/` module, River's linear models); on the
                batch path, the compiled call that scales, predicts, learns and counts a run
    metrics     progressive metrics and the drift detector
                (`connectors/observability/metrics.py`, River)
    encode      building the prediction records (the statements of the per-record steps,
                `RecordSteps._records`, that format and append them, `_proba_json`,
                `label_json`; the batch path's `_write`)
    task        the rest of the task's steps (loop, labels, counters)
    produce     handing the outputs to the producer (`Worker._send_output` and everything below)
    checkpoint  flushing outputs, writing checkpoints, committing (`Worker._checkpoint`)
    restore     reading checkpoints at assignment
    other       the rest of the main loop (status hooks, bookkeeping)
    startup     everything before the first record is seen (imports done before the profiler
                started are not in it): connecting, the group join, restoring

Nothing is added to the per-record code: with the profiler off the worker runs exactly as
before; on, it costs the sampling thread's share of the GIL (a sample is a walk of ~30 frames,
each code object classified once). Each sample is weighted by the time since the previous one
(a busy main thread lets the sampler in only every `sys.getswitchinterval()`, a waiting one at
once), so the seconds add up to wall time, and `poll` includes waiting for the broker. While it
samples, the switch interval is the sampling interval: at Python's 5 ms the batch path's long C
calls let the sampler in 4-34 times in half a second, at 0.5 ms ~180 times. The producer's and consumer's IO threads are not sampled (their CPU shows in the
process's CPU time). `streammargin kafka --profile-stages FILE` writes `report()` as JSON at exit;
`benchmarks/kafka_throughput.py` prints it.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import textwrap
import threading
import time
import typing

__all__ = ["StageProfiler", "STAGES", "rss_bytes", "encode_lines"]

STAGES = ("poll", "decode", "scale", "model", "metrics", "encode", "task", "produce",
          "checkpoint", "restore", "other", "startup")
_RECORD_STAGES = frozenset({"decode", "scale", "model", "metrics", "encode", "task"})
# Stages whose callees belong to them whatever they are (a checkpoint serialises the model, a
# poll may run rebalance callbacks, producing goes through kafka-python's record code).
_STICKY = frozenset({"poll", "produce", "checkpoint", "restore"})
_SEP = os.sep

# (path fragment, function name or None for any) -> stage; the first match wins.
_RULES: list[tuple[str, str | None, str]] = [
    (f"connectors{_SEP}worker{_SEP}outputs.py", "_send_output", "produce"),
    (f"connectors{_SEP}worker{_SEP}outputs.py", "_send_predictions", "produce"),
    (f"connectors{_SEP}worker{_SEP}outputs.py", "_send_dead_letters", "produce"),
    (f"connectors{_SEP}worker{_SEP}worker.py", "_publish_metrics", "produce"),
    (f"connectors{_SEP}worker{_SEP}outputs.py", "_checkpoint", "checkpoint"),
    (f"connectors{_SEP}worker{_SEP}outputs.py", "_flush", "checkpoint"),
    (f"connectors{_SEP}worker{_SEP}rebalance.py", "_restore_assigned", "restore"),
    (f"kafka{_SEP}consumer{_SEP}group.py", "poll", "poll"),
    (f"connectors{_SEP}kafka{_SEP}librdkafka_transport.py", "poll", "poll"),
    (f"kafka{_SEP}producer{_SEP}", None, "produce"),
    (f"connectors{_SEP}serializers{_SEP}", None, "decode"),
    (f"connectors{_SEP}codec.py", "label_json", "encode"),
    (f"connectors{_SEP}task{_SEP}records.py", "_proba_json", "encode"),
    (f"connectors{_SEP}task{_SEP}records.py", "_json_id", "encode"),
    (f"connectors{_SEP}task{_SEP}records.py", "_records", "task"),
    (f"connectors{_SEP}task{_SEP}batch.py", "_write", "encode"),
    (f"connectors{_SEP}task{_SEP}batch.py", None, "task"),
    (f"connectors{_SEP}observability{_SEP}metrics.py", None, "metrics"),
    (f"river{_SEP}drift{_SEP}", None, "metrics"),
    (f"river{_SEP}metrics{_SEP}", None, "metrics"),
    (f"streammargin{_SEP}scaler.py", None, "scale"),
    (f"river{_SEP}preprocessing{_SEP}", None, "scale"),
    (f"streammargin{_SEP}", None, "model"),
    (f"river{_SEP}linear_model{_SEP}", None, "model"),
    (f"river{_SEP}compose{_SEP}", None, "model"),
]


def rss_bytes() -> int | None:
    """This process's resident set size now (Linux `/proc/self/statm`; None elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


_ENCODE_CALLS = frozenset({"emit", "emit_key", "emit_headers", "emit_timestamp"})
_ENCODE_TARGETS = frozenset({"id_json", "proba_json", "timestamp"})


def encode_lines(function: typing.Callable) -> frozenset[int]:
    """Line numbers of `function`'s statements that build output records: the calls of
    `emit`/`emit_key`/`emit_headers`/`emit_timestamp` and the assignments of `id_json`,
    `proba_json` and `timestamp` (the names `RecordSteps._records` uses)."""
    lines, first = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    found: set[int] = set()
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            hit = isinstance(func, ast.Name) and func.id in _ENCODE_CALLS
        elif isinstance(node, ast.Assign):
            hit = any(isinstance(t, ast.Name) and t.id in _ENCODE_TARGETS for t in node.targets)
        if hit:
            found.update(range(node.lineno + first - 1, node.end_lineno + first))  # type: ignore[operator]
    return frozenset(found)


class StageProfiler:
    """Samples a thread's stack and counts samples per stage (see the module docstring).

    Parameters
    ----------
    thread_id
        The thread to sample (`threading.get_ident()` of the worker's main thread).
    interval
        Seconds between samples; the sampler also has to wait for the GIL, which a busy main
        thread hands over every `sys.getswitchinterval()`, set to `interval` (at most) from
        `start` to `stop`.

    """

    def __init__(self, thread_id: int | None = None, interval: float = 0.001):
        from connectors.task.partition import PartitionTask

        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        self.interval = interval
        self.counts = dict.fromkeys(STAGES, 0)
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.samples = 0
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self.first_record_at: float | None = None
        self.rss_before_first_record: int | None = None
        self._classified: dict[typing.Any, str | None] = {}
        self._process_code = PartitionTask._records.__code__
        self._encode_lines = encode_lines(PartitionTask._records)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stage-profiler", daemon=True)
        self._switch_interval: float | None = None  # Python's, while this one is set

    def start(self) -> StageProfiler:
        self.started_at = time.perf_counter()
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, self.interval))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None
        self.stopped_at = time.perf_counter()

    def _stage_of(self, code: typing.Any) -> str | None:
        try:
            return self._classified[code]
        except KeyError:
            pass
        stage = None
        filename = code.co_filename
        for fragment, name, rule_stage in _RULES:
            if fragment in filename and (name is None or name == code.co_name):
                stage = rule_stage
                break
        self._classified[code] = stage
        return stage

    def classify(self, frame: typing.Any) -> str:
        """The stage of a stack whose innermost frame is `frame`."""
        chain = []
        while frame is not None:
            chain.append(frame)
            frame = frame.f_back
        stage = "other"
        for frame in reversed(chain):  # outermost first
            found = self._stage_of(frame.f_code)
            if found is None:
                continue
            if stage in _STICKY:
                break
            stage = found
            if found == "task":
                # The task's own lines; those building the outputs are "encode" unless a callee
                # below says otherwise.
                if frame.f_lineno in self._encode_lines:
                    stage = "encode"
        return stage

    def _run(self) -> None:
        stop = self._stop
        interval = self.interval
        seconds = self.seconds
        counts = self.counts
        current_frames = sys._current_frames
        clock = time.perf_counter
        previous = clock()
        while not stop.wait(interval):
            frame = current_frames().get(self.thread_id)
            now = clock()
            if frame is None:
                previous = now
                continue
            stage = self.classify(frame)
            del frame
            if self.first_record_at is None:
                if stage in _RECORD_STAGES:
                    self.first_record_at = time.time()
                else:
                    self.rss_before_first_record = rss_bytes()
                    stage = "startup"
            # Each sample stands for the time since the previous one: a busy main thread hands
            # the GIL over only every switch interval, a waiting one at once, so counting
            # samples alone would over-weight waiting.
            seconds[stage] += now - previous
            previous = now
            counts[stage] += 1
            self.samples += 1

    def report(self) -> dict[str, typing.Any]:
        """Samples and seconds per stage (each sample weighs the time since the previous one)."""
        end = self.stopped_at if self.stopped_at is not None else time.perf_counter()
        wall = end - (self.started_at or end)
        total = sum(self.seconds.values()) or 1.0
        return {
            "samples": self.samples,
            "wall_s": wall,
            "stages": {stage: {"samples": self.counts[stage], "share": self.seconds[stage] / total,
                               "seconds": self.seconds[stage]}
                       for stage in STAGES},
            "first_record_at": self.first_record_at,
            "rss_before_first_record": self.rss_before_first_record,
        }
