"""A network partition between a worker and its broker, on two test hosts (tests/netns_hosts.py).

`run_partition` is the whole scenario, shared by tests/test_outages.py (once per case) and
benchmarks/outage_faults.py (repeated, with the issue's sizes):

1. the broker runs on the broker host; half of the records are produced;
2. the worker (`streammargin kafka`, a process on the worker host) predicts them, and waits
   caught up (`--idle-timeout`);
3. the link is cut for `cut_s` seconds, then healed; a second later the other half is produced;
4. the worker must predict it and exit 0 at idle.

A prober thread inside the worker host reads /readyz and /metrics four times a second. The
outcome holds what the assertions need; `check` makes them.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import test_apache_kafka as ak
import test_kafka_worker as w

from connectors.kafka.broker import create_topics

ROOT = pathlib.Path(__file__).resolve().parents[1]
HTTP_PORT = 9464
SESSION_MS, HEARTBEAT_MS = 6000, 1000
CHECKPOINT_EVERY, MAX_POLL_RECORDS = 500, 200


@dataclasses.dataclass
class Outcome:
    exit_code: int
    log: str
    # (seconds since the cut, /readyz status, body, contact age, outages) per probe
    probes: list
    cut_at: float
    healed_at: float
    predicted: dict
    checkpointed: dict
    n: int
    cut_s: float
    log_lines_in_outage: int = 0
    seconds: float = 0.0  # from the worker's start to its exit
    summary: dict = dataclasses.field(default_factory=dict)
    # Each partition's latest checkpoint, decoded, and the labelled records produced
    final_tasks: dict = dataclasses.field(default_factory=dict)
    data: list = dataclasses.field(default_factory=list)


class Prober(threading.Thread):
    """Reads the worker's /readyz and /metrics from inside the worker host."""

    def __init__(self, hosts, started: float):
        super().__init__(daemon=True)
        self.hosts, self.started = hosts, started
        self.probes: list = []
        self.halted = threading.Event()

    def run(self) -> None:
        base = f"http://127.0.0.1:{HTTP_PORT}"
        with self.hosts.entered(self.hosts.worker_host):
            while not self.halted.wait(0.25):
                try:
                    try:
                        with urllib.request.urlopen(f"{base}/readyz", timeout=1) as answer:
                            code, body = answer.status, answer.read().decode()
                    except urllib.error.HTTPError as error:
                        code, body = error.code, error.read().decode()
                    with urllib.request.urlopen(f"{base}/metrics", timeout=1) as answer:
                        metrics = answer.read().decode()
                except (OSError, http.client.HTTPException):
                    continue  # not listening yet, gone, or cut short by the exit
                age = _metric(metrics, "streammargin_broker_contact_age_seconds")
                outages = _metric(metrics, "streammargin_broker_outages_total")
                self.probes.append((time.monotonic() - self.started, code, body.strip(), age,
                                    outages))


def _metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def run_partition(hosts, bootstrap: str, transport: str, cut_s: float, n: int,
                  workdir: pathlib.Path, idle_timeout: float = 4.0,
                  extra: tuple[str, ...] = ()) -> Outcome:
    """The scenario of the module's docstring; `n` records per partition, two partitions.
    `cut_s` None: the link stays cut until the worker exits (`extra`: --max-outage)."""
    name = w.fresh("partition")
    cfg = w.config(bootstrap, name)
    data = w.labelled_stream(2 * n, seed=71)
    items = [(i % 2, w.event(i, x, y)) for i, (x, y) in enumerate(data)]
    with hosts.entered(hosts.broker_host):
        create_topics(bootstrap, [name], partitions=2)
        ak.create_outputs(bootstrap, cfg, 2)
        w.produce(bootstrap, name, items[:n])
    log_path = workdir / f"worker-{name}.log"
    argv = hosts.command(hosts.worker_host, [
        sys.executable, "-m", "connectors.cli", "kafka",
        "--bootstrap-servers", bootstrap, "--topic", name, "--group-id", cfg.group_id,
        "--predictions-topic", cfg.predictions_topic, "--metrics-topic", cfg.metrics_topic,
        "--dead-letter-topic", cfg.dead_letter_topic,
        "--checkpoint-topic", cfg.checkpoint_topic, "--checkpoint-interval", "none",
        "--session-timeout-ms", str(SESSION_MS), "--heartbeat-interval-ms", str(HEARTBEAT_MS),
        "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--max-poll-records", str(MAX_POLL_RECORDS),
        "--idle-timeout", str(idle_timeout), "--transport", transport,
        "--http-port", str(HTTP_PORT), "--http-host", "127.0.0.1", "--log-level", "INFO",
        # Back within a second of the heal (the clients back off up to 10-30 s by default).
        "--consumer-config", "reconnect_backoff_max_ms=1000",
        "--producer-config", "reconnect_backoff_max_ms=1000", *extra,
    ])
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
    started = time.monotonic()
    prober = Prober(hosts, started)
    prober.start()
    cut_at = healed_at = 0.0
    try:
        with hosts.entered(hosts.broker_host):
            reader = ak.Reader(bootstrap)
            try:
                w.wait_for(lambda: _predicted_count(reader, cfg) >= n or worker.poll() is not None,
                           120, "the first half predicted")
            finally:
                reader.close()
        assert worker.poll() is None, log_path.read_text()[-3000:]
        time.sleep(1.0)  # caught up, waiting: the idle period has begun
        lines_before = _lines(log_path)
        hosts.cut()
        cut_at = time.monotonic() - started
        if cut_s is None:
            code = worker.wait(120)
            hosts.heal()
            return Outcome(exit_code=code, log=log_path.read_text(), probes=prober.probes,
                           cut_at=cut_at, healed_at=time.monotonic() - started, predicted={},
                           checkpointed={}, n=n, cut_s=0.0,
                           seconds=time.monotonic() - started)
        time.sleep(cut_s)
        hosts.heal()
        healed_at = time.monotonic() - started
        time.sleep(1.0)
        with hosts.entered(hosts.broker_host):
            w.produce(bootstrap, name, items[n:])
        # Lines written from the cut until the worker has heard the brokers again (and rejoined).
        time.sleep(5.0)
        outage_lines = _lines(log_path) - lines_before
        code = worker.wait(max(180, 10 * idle_timeout))
        seconds = time.monotonic() - started
    except BaseException:
        hosts.heal()
        worker.kill()
        worker.wait()
        raise
    finally:
        prober.halted.set()
        prober.join(5)
    with hosts.entered(hosts.broker_host):
        reader = ak.Reader(bootstrap)
        try:
            predicted = reader.predicted(cfg.predictions_topic)
            checkpointed = reader.checkpointed(cfg, range(2))
        finally:
            reader.close()
        final_tasks = w.saved_tasks(bootstrap, cfg, range(2))
    text = log_path.read_text()
    outcome = Outcome(exit_code=code, log=text, probes=prober.probes, cut_at=cut_at,
                      healed_at=healed_at, predicted=predicted, checkpointed=checkpointed, n=n,
                      cut_s=cut_s, log_lines_in_outage=outage_lines, seconds=seconds)
    found = re.search(r"^(\{\"reason\".*\})$", text, re.MULTILINE)
    if found:
        outcome.summary = json.loads(found.group(1))
    outcome.final_tasks, outcome.data = final_tasks, data
    return outcome


def _predicted_count(reader, cfg) -> int:
    try:
        return len(reader.records(cfg.predictions_topic, timeout=10))
    except AssertionError:
        return 0


def _lines(path: pathlib.Path) -> int:
    return path.read_bytes().count(b"\n")


def check(outcome: Outcome) -> list[str]:
    """What the outcome breaks of the issue's promises (empty: nothing)."""
    import streammargin

    broken: list[str] = []
    tail = outcome.log[-3000:]
    if outcome.exit_code != 0 or outcome.summary.get("reason") != "idle":
        broken.append(f"exit {outcome.exit_code}, summary {outcome.summary}:\n{tail}")
        return broken
    n = outcome.n
    bound = CHECKPOINT_EVERY + MAX_POLL_RECORDS
    for partition in (0, 1):
        try:
            ak.assert_every_offset_once_but_replays(outcome.predicted.get(partition, [0]), n,
                                                    outcome.checkpointed[partition], bound)
        except AssertionError as error:
            broken.append(f"partition {partition}: {error}")
    for partition in (0, 1):
        task = outcome.final_tasks[partition]
        model, _ = w.straight_run(outcome.data[partition::2], streammargin.ALMAClassifier())
        if task["next_offset"] != n or w.saved_model_bytes(task) != w.model_bytes(model):
            broken.append(f"partition {partition}: the model differs from an uninterrupted run")
    if "lost contact with the brokers" not in outcome.log:
        broken.append("no line said that contact was lost")
    if "contact with the brokers restored after" not in outcome.log:
        broken.append("no line said that contact was restored")
    during = [p for p in outcome.probes if outcome.cut_at <= p[0] <= outcome.healed_at]
    if not during:
        broken.append("no probe answered during the cut")
    session_s = SESSION_MS / 1000
    expired = [p for p in during if p[0] - outcome.cut_at > session_s + 1.5]
    early = [p for p in during if p[0] - outcome.cut_at < session_s - 1.5]
    if expired and any(p[1] != 503 for p in expired):
        broken.append(f"/readyz answered 200 past the session timeout: {expired}")
    if any(p[1] != 200 for p in early):
        broken.append(f"/readyz answered 503 within the session timeout: {early}")
    after = [p for p in outcome.probes if p[0] > outcome.healed_at]
    if not any(p[1] == 200 for p in after):
        broken.append("/readyz never answered 200 again after the heal")
    outages = max((p[4] or 0) for p in outcome.probes) if outcome.probes else 0
    if outages < 1:
        broken.append("streammargin_broker_outages_total never counted the outage")
    return broken
