"""Broker contact and outages without a broker (connectors/worker/outage.py), on a hand-driven
clock: when an outage starts and ends, its lines, --max-outage, readiness past the session
timeout, and the honest rate. tests/test_outages.py shows the same on two test hosts with a real
partition."""

from __future__ import annotations

import logging

import pytest

from connectors.observability.metrics import Throughput
from connectors.observability.observability import WorkerStatus
from connectors.worker.outage import BrokerContact, BrokerOutage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def contact(clock, **options) -> BrokerContact:
    options = {"session_timeout": 10.0, "heartbeat_interval": 3.0,
               "bootstrap_servers": "b:9092", **options}
    return BrokerContact(clock=clock, **options)


def test_an_outage_starts_after_two_heartbeats_and_a_second_as_a_member_later_while_joining(
    caplog
):
    clock = Clock()
    watched = contact(clock)
    assert watched.lost_after(member=True) == 7.0
    assert watched.lost_after(member=False) == 16.0  # a join may wait a session for the dead
    clock.now += 6.9
    watched.turn(member=True)
    assert not watched.in_outage
    clock.now += 0.2
    watched.turn(member=False)  # joining: still within its bound
    assert not watched.in_outage
    with caplog.at_level(logging.INFO, logger="streammargin.kafka"):
        watched.turn(member=True)
    assert watched.in_outage and watched.outages == 1
    [line] = caplog.messages
    assert line.startswith("lost contact with the brokers (b:9092): nothing heard for 7.1 s")


def test_one_line_lost_a_summary_every_30_s_and_one_line_back_with_the_held_back_count(caplog):
    clock = Clock()
    watched = contact(clock)
    with caplog.at_level(logging.INFO, logger="streammargin.kafka"):
        for _ in range(45 * 4):  # a 45 s outage, the main loop turning four times a second
            clock.now += 0.25
            watched.turn(member=True)
            watched.held_back()  # the client complains on every turn
        watched.heard()
        clock.now += 0.25
        watched.turn(member=True)
    lost, summary, back = caplog.messages
    assert lost.startswith("lost contact")
    assert summary.startswith("outage: no broker answered for 37 s;")  # 7 s + 30 s
    assert back.startswith("contact with the brokers restored after 45.0 s; the session "
                           "expired: rejoining the group")
    assert "152 client messages held back" in back  # those after the outage began (7.25 s)
    assert watched.held_back_lines == 180 and not watched.in_outage
    assert watched.quiet_since == clock.now - 0.25 and watched.last_outage_seconds == 45.0


def test_a_short_outage_keeps_the_session_and_says_so(caplog):
    clock = Clock()
    watched = contact(clock)
    clock.now += 8.0
    watched.turn(member=True)
    watched.heard()
    with caplog.at_level(logging.INFO, logger="streammargin.kafka"):
        watched.turn(member=True)
    assert "restored after 8.0 s; the session held: no rejoin" in caplog.messages[-1]


def test_max_outage_stops_with_one_line_naming_the_outage_and_the_fix():
    clock = Clock()
    watched = contact(clock, max_outage=20.0, log_lines=False)
    clock.now += 8.0
    watched.turn(member=True)  # the outage, from the last answer (at 100)
    clock.now += 12.0
    watched.turn(member=True)  # 20 s: at the limit, not beyond
    clock.now += 0.5
    with pytest.raises(BrokerOutage, match=r"no broker answered for 20 s \(--max-outage 20 s; "
                                           r"bootstrap servers b:9092\)\. Fix: restore"):
        watched.turn(member=True)


def test_the_transport_report_counts_and_a_failing_one_is_ignored():
    clock = Clock()
    watched = contact(clock, log_lines=False)
    reports = iter([clock.now + 5.0, None])
    watched.source = lambda: next(reports)
    clock.now += 9.0
    assert watched.age() == 4.0  # the transport heard a broker at +5
    assert watched.age() == 4.0  # None: nothing new
    watched.source = lambda: 1 / 0  # a client's internals changed: the worker's evidence stands
    assert watched.age() == 4.0


def watched_status(clock) -> tuple[WorkerStatus, BrokerContact]:
    """A connected worker's status with its broker contact, on `clock`."""
    status = WorkerStatus("g", "alma", "w", clock=clock)
    status.contact = contact(clock, log_lines=False)
    status.connected(lambda tp: None)
    return status, status.contact


def test_readiness_turns_503_past_the_session_timeout_and_200_after_the_rejoin_and_restore():
    clock = Clock()
    status, watched = watched_status(clock)

    class TP:
        topic, partition = "t", 0

    status.assigned([TP()])
    status.restored([])
    assert status.readiness()[0]
    clock.now += 9.0
    watched.turn(member=True)
    status.watch_session(watched.age())
    assert status.readiness()[0]  # an outage, within the session: still a member
    clock.now += 2.0
    ready, why = status.readiness()
    assert not ready and "past the 10 s session timeout" in why
    status.watch_session(watched.age())
    watched.heard()
    watched.turn(member=True)
    status.watch_session(watched.age())
    assert status.readiness() == (False, "rejoining the consumer group: an outage outlasted the "
                                         "session timeout")
    status.assigned([TP()])  # the rejoin
    assert status.readiness() == (False, "restoring 1 assigned partitions")
    status.restored([])
    assert status.readiness()[0]


def test_readiness_comes_back_without_a_rebalance_when_the_group_kept_the_member():
    clock = Clock()
    status, watched = watched_status(clock)
    status.member = True
    clock.now += 11.0
    status.watch_session(watched.age())
    assert not status.readiness()[0]
    watched.heard()
    for _ in range(12):  # heard all along for more than a session timeout, no rebalance
        clock.now += 1.0
        watched.heard()
        status.watch_session(watched.age())
    assert status.readiness()[0]


def test_the_overall_rate_leaves_out_a_wait_between_batches():
    clock = Clock()
    throughput = Throughput(clock=clock)
    for _ in range(4):
        started = clock.now
        clock.now += 0.5
        throughput.add(1_000, started)
        clock.now += 45.0  # an outage after every batch
    assert throughput.rates()[0] == pytest.approx(2_000.0)
