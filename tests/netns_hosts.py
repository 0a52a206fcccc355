"""Two test hosts on this machine: network namespaces joined by a veth pair, for network faults.

`TestHosts` makes a broker host and a worker host, each a network namespace of its own with
loopback, one end of a veth pair, and **no default route** (`unreachable default` makes sure of
it: nothing sent from either host can leave the machine). Nothing of the machine's own network
is touched: the veth pair is created inside the broker host's namespace with its peer moved
straight into the worker host's, and both go when the namespaces are deleted.

- `cut()` makes the link silent from the worker's side, as a real partition is: two policy
  rules inside the broker host blackhole what arrives on its end of the link and what it sends
  to the worker. The worker's packets leave and vanish; nothing answers, nothing refuses. (This
  kernel has neither tc actions nor netem, and routes alone would refuse locally: EINVAL.)
- `heal()` deletes the two rules.
- `entered(host)`: the calling thread works inside a host's namespace until the block ends
  (`setns(2)` applies to the calling thread; sockets keep the namespace they were made in, and
  threads started meanwhile inherit it). The test starts its broker, producer and readers in the
  broker host this way, and reads the worker's HTTP endpoints from inside the worker host.
- `command(host, argv)`: `ip netns exec` for a subprocess (the worker).

Needs root (CI runs as root). `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import typing
import uuid

CLONE_NEWNET = 0x40000000
BROKER_ADDRESS = "10.77.0.1"
WORKER_ADDRESS = "10.77.0.2"


def _ip(*args: str, host: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(("netns", "exec", host, "ip") if host else ()), *args]
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why test hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"smprobe-{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


class TestHosts:
    """A broker host and a worker host joined by one link (see the module's docstring)."""

    __test__ = False  # not a test class

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.broker_host = f"sm{tag}-broker"
        self.worker_host = f"sm{tag}-worker"
        self._broker_end, self._worker_end = f"smb{tag}", f"smw{tag}"
        self.is_cut = False

    def __enter__(self) -> TestHosts:
        made = []
        try:
            for host in (self.broker_host, self.worker_host):
                _ip("netns", "add", host)
                made.append(host)
            # Created inside the broker host, its peer moved into the worker host at once.
            _ip("link", "add", self._broker_end, "type", "veth", "peer", "name",
                self._worker_end, "netns", self.worker_host, host=self.broker_host)
            for host, end, address in ((self.broker_host, self._broker_end, BROKER_ADDRESS),
                                       (self.worker_host, self._worker_end, WORKER_ADDRESS)):
                _ip("link", "set", "lo", "up", host=host)
                _ip("addr", "add", f"{address}/24", "dev", end, host=host)
                _ip("link", "set", end, "up", host=host)
                _ip("route", "add", "unreachable", "default", host=host)
                routes = _ip("route", "show", "default", host=host).stdout
                assert routes.strip().startswith("unreachable default"), routes
        except BaseException:
            for host in made:
                _ip("netns", "del", host, check=False)
            raise
        return self

    def __exit__(self, *exc: typing.Any) -> None:
        for host in (self.broker_host, self.worker_host):
            _ip("netns", "del", host, check=False)

    # Faults -----------------------------------------------------------------------------------

    def _rules(self, action: str) -> None:
        _ip("rule", action, "iif", self._broker_end, "blackhole", host=self.broker_host)
        _ip("rule", action, "to", WORKER_ADDRESS, "blackhole", host=self.broker_host)

    def cut(self) -> None:
        """The link goes silent (both directions, from inside the broker host)."""
        self._rules("add")
        self.is_cut = True

    def heal(self) -> None:
        if self.is_cut:
            self._rules("del")
            self.is_cut = False

    # Working inside a host --------------------------------------------------------------------

    @contextlib.contextmanager
    def entered(self, host: str) -> typing.Iterator[None]:
        """The calling thread inside `host`'s namespace for the block."""
        with open("/proc/thread-self/ns/net") as own, open(f"/var/run/netns/{host}") as target:
            _setns(target.fileno())
            try:
                yield
            finally:
                _setns(own.fileno())

    def command(self, host: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", host, *argv]
