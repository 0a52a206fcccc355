"""A small conformance subset of the worker's broker tests, always on Tansu.

The Kafka tests run on Apache Kafka (tests/conftest.py), but `streammargin demo` runs on the
embedded Tansu by default: these checks keep the worker right there. They are the worker tests'
own functions (tests/test_kafka_worker.py), given the `tansu_broker` fixture, plus the demo's
flow on the session's Tansu. The demo itself, end to end on its own Tansu, is
tests/test_demo.py; the Tansu behaviours the code works around are tests/test_broker_behaviour.py.
"""

from __future__ import annotations

import threading

import pytest
import test_kafka_worker as w

from connectors.cli import demo
from connectors.kafka.broker import FAST_GROUP_SETTINGS, create_topics
from connectors.worker.worker import Worker

pytestmark = pytest.mark.kafka


def test_a_restart_continues_exactly_on_tansu(tansu_broker):
    w.test_a_stop_finishes_the_record_in_hand_and_a_restart_continues_exactly(tansu_broker)


def test_outputs_follow_kafkas_conventions_on_tansu(tansu_broker):
    w.test_outputs_follow_kafkas_conventions_and_their_json_schemas("kafka-python", tansu_broker)


def test_the_demos_flow_on_tansu(tansu_broker, caplog):
    """What `streammargin demo` does, smaller: its producer (a drifting stream with malformed
    records) runs while the worker, with the demo's settings, consumes until idle. Tansu holds
    the join for half the session timeout: no outage may be reported for it."""
    bootstrap = tansu_broker.bootstrap_servers
    name = w.fresh("demoflow")
    create_topics(bootstrap, [name])
    size, bad_every = 3_000, 200
    produced, errors, change_offsets = threading.Event(), [], {}
    producer = threading.Thread(
        target=demo.produce,
        args=(bootstrap, name, "sea", size, bad_every, produced, errors, change_offsets),
        daemon=True,
    )
    producer.start()
    cfg = w.config(bootstrap, name, metrics_every=500, checkpoint_every=10_000, idle_timeout=3.0,
                   **FAST_GROUP_SETTINGS)
    with caplog.at_level("WARNING", logger="streammargin.kafka"):
        summary = Worker(cfg).run()
    assert not [r.message for r in caplog.records if "lost contact" in r.message]
    producer.join(30)
    assert produced.is_set() and not errors, errors
    n_bad = size // bad_every
    assert summary["reason"] == "idle" and summary["records"] == size + n_bad
    # Every malformed kind was dead-lettered, with its reason.
    reasons = demo.dead_letter_reasons(bootstrap, cfg.dead_letter_topic)
    assert sum(reasons.values()) == n_bad and len(reasons) == 5, reasons
    # The change at record 1,500 is at offset 1,507: 7 malformed records came before it.
    assert change_offsets == {0: 1_507}
    final = summary["partitions"][f"{name}/0"]
    assert final["records"] == size + n_bad and final["dead_letters"] == n_bad
