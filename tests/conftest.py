"""Shared fixtures, and a guard: "no tests collected" can never pass silently."""

from __future__ import annotations

import functools
import os
import pathlib

import pytest

TESTS = pathlib.Path(__file__).parent.resolve()


def pytest_collection_modifyitems(session, config, items):
    if not items:
        raise pytest.UsageError("the selection collected no tests")
    _start_early(items)
    # On a run over the whole tests folder, every test_*.py module must contribute tests: a
    # module that silently collects nothing (misnamed functions, say) fails the run.
    root = config.invocation_params.dir
    targets = {pathlib.Path(root, arg.split("::")[0]).resolve() for arg in config.args}
    narrowed = any(
        config.getoption(name) for name in ("keyword", "markexpr", "ignore", "ignore_glob", "deselect")
    )
    if TESTS not in targets or narrowed:
        return
    collected = {pathlib.Path(str(item.fspath)).name for item in items}
    empty = sorted(p.name for p in TESTS.glob("test_*.py") if p.name not in collected)
    if empty:
        raise pytest.UsageError(f"test modules that collected no tests: {empty}")


_stop_at_finish: list = []


def _start_early(items: list) -> None:
    """A test marked `started_early(start, stop)` waits on a slow process of its own
    (tests/test_aot.py: numba's JIT compiling every model, ~70 s on CI): `start` launches it
    now, while the rest of the suite runs (mostly waiting on Kafka, a core idle), and the test
    runs last; `stop` ends it after the session if the test did not (-x, an interrupt)."""
    early = [item for item in items if item.get_closest_marker("started_early")]
    for item in early:
        items.remove(item)
        items.append(item)
        marker = item.get_closest_marker("started_early")
        marker.kwargs["start"]()
        _stop_at_finish.append(marker.kwargs["stop"])


def pytest_sessionfinish(session, exitstatus):
    for stop in _stop_at_finish:
        stop()


# The broker under the Kafka tests ----------------------------------------------------------------
#
# Apache Kafka (connectors.kafka.broker.ApacheKafkaBroker: the broker users run) whenever this
# machine has Java and the jars (or Maven to fetch them); otherwise, on a developer's machine, the
# embedded Tansu, said in one line of the report header. Under CI (CI=true) Apache Kafka is
# required: a missing JVM or Maven stops the run. STREAMMARGIN_TEST_BROKER=tansu|apache-kafka
# forces one.


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@functools.cache
def test_broker_kind() -> tuple[str, str]:
    """The broker kind of the Kafka tests and the line saying why."""
    from connectors.kafka.broker import KAFKA_VERSION, apache_kafka_unavailable

    forced = os.environ.get("STREAMMARGIN_TEST_BROKER")
    if forced:
        if forced not in ("tansu", "apache-kafka"):
            raise pytest.UsageError(f"STREAMMARGIN_TEST_BROKER={forced!r}: tansu or apache-kafka")
        return forced, f"Kafka tests on {forced} (STREAMMARGIN_TEST_BROKER)"
    missing = apache_kafka_unavailable()
    if missing is None:
        return "apache-kafka", f"Kafka tests on Apache Kafka {KAFKA_VERSION}"
    if _ci():
        raise pytest.UsageError(
            f"CI=true needs Apache Kafka {KAFKA_VERSION} under the Kafka tests, and {missing}. "
            "Fix: install OpenJDK 17+ and Maven 3.8+ on the CI machine"
        )
    return "tansu", (f"Kafka tests on the embedded Tansu: Apache Kafka {KAFKA_VERSION} is not "
                     f"available ({missing})")


def pytest_report_header(config):
    return [test_broker_kind()[1]]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """The session's broker (see `test_broker_kind`) on free loopback ports; torn down after.

    Its storage is shared by the tests: each test uses fresh topic and group names.
    """
    from connectors.kafka.broker import make_broker

    kind = test_broker_kind()[0]
    options = {}
    if kind == "apache-kafka":
        options["log_path"] = tmp_path_factory.mktemp("apache-kafka") / "broker.log"
    with make_broker(kind, **options) as broker:
        yield broker


@pytest.fixture(scope="session")
def tansu_broker():
    """The embedded Tansu broker, for the conformance subset that the demo's default broker
    must pass (tests/test_tansu_conformance.py)."""
    from connectors.kafka.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker
