"""What a metrics record reports: honest records/s, and which drift detector (and settings) fired."""

from __future__ import annotations

import json
import time

import pytest

from connectors.observability.metrics import (
    PartitionMetrics,
    Throughput,
    detector_names,
    make_detector,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_batch_without_its_start_time_reports_no_rate_instead_of_an_absurd_one():
    """The worker's metrics record showed 668,000,000,000 records/s: one batch, a 1e-9 s clock."""
    throughput = Throughput()
    throughput.add(668)
    overall, recent = throughput.rates()
    assert throughput.count == 668
    assert overall == 0.0 and recent == 0.0


def test_the_clock_includes_the_first_batch():
    clock = FakeClock()
    throughput = Throughput(clock=clock)
    started = clock.now
    clock.now += 0.25
    throughput.add(500, started)
    started = clock.now
    clock.now += 0.25
    throughput.add(500, started)
    assert throughput.rates() == (2000.0, 2000.0)  # 1000 records in 0.5 s, not 1000 in 0.25 s


def test_without_start_times_the_first_batch_is_left_out_of_the_rate():
    clock = FakeClock()
    throughput = Throughput(clock=clock)
    clock.now += 0.25
    throughput.add(500)  # how long it took is unknown
    clock.now += 0.25
    throughput.add(500)
    overall, _ = throughput.rates()
    assert overall == 2000.0  # the 500 records of the 0.25 s measured, not 1000 in 0.25 s
    assert throughput.count == 1000


def test_a_report_right_after_another_keeps_the_recent_rate():
    clock = FakeClock()
    throughput = Throughput(clock=clock)
    started = clock.now
    clock.now += 1.0
    throughput.add(3000, started)
    assert throughput.rates() == (3000.0, 3000.0)
    clock.now += 1e-6  # the next partition's metrics record, a microsecond later
    assert throughput.rates() == (3000.0, 3000.0)
    started = clock.now
    clock.now += 1.0
    throughput.add(1000, started)
    overall, recent = throughput.rates()
    assert overall == pytest.approx(4000 / (2.0 + 1e-6))
    assert recent == pytest.approx(1000 / (1.0 + 1e-6))


def test_real_clock_rate_is_within_reason():
    throughput = Throughput()
    started = time.monotonic()
    time.sleep(0.03)
    throughput.add(300, started)
    overall, _ = throughput.rates()
    assert 300 / 5.0 < overall <= 300 / 0.03


@pytest.mark.parametrize("name", sorted(detector_names()))
def test_the_metrics_record_names_the_detector_and_its_settings(name):
    detector = make_detector(name)
    metrics = PartitionMetrics(detector=detector)
    drift = metrics.summary()["drift"]
    assert drift["detector"] == type(detector).__name__
    json.dumps(drift, allow_nan=False)
    for key, value in drift["params"].items():
        assert getattr(detector, key) == value


def test_the_reported_settings_are_the_ones_given():
    metrics = PartitionMetrics(detector=make_detector("PageHinkley", {"threshold": 80.0, "delta": 0.01}))
    params = metrics.summary()["drift"]["params"]
    assert params["threshold"] == 80.0 and params["delta"] == 0.01
    restored = PartitionMetrics.from_state(metrics.to_state())
    assert restored.summary()["drift"]["params"] == params
