"""Shared fixtures, and a guard: "no tests collected" can never pass silently."""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def kafka_broker():
    """An embedded Tansu broker (in-memory) on a free port for the whole session; torn down after.

    Its memory storage is shared by the tests: each test uses fresh topic and group names.
    """
    from connectors.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker
