"""Broker contact: when the worker last heard from its brokers, and the outages in between.

Both transports report the monotonic time of the last answer their consumer received
(`Transport.last_broker_contact`): kafka-python from its group coordinator's heartbeat clock
(a heartbeat answered, a coordinator found, a join completed), librdkafka from its statistics
(the smallest `rxidle` of its broker connections: fetches, heartbeats, metadata). The worker adds
its own evidence: records polled, an idle check's round trips. `BrokerContact` turns that into
what an operator reads:

- an **outage** starts when nothing was heard for `lost_after` seconds: two heartbeat intervals
  and a second while a member of the group (a member hears its coordinator every heartbeat
  interval), the session timeout and two heartbeat intervals while joining (a join may wait
  that long for a member that died);
- one line when it starts, one summary at most every `summary_every` seconds, one line when it
  ends, with its length and the client messages held back meanwhile;
- `streammargin_broker_contact_age_seconds` and `streammargin_broker_outages_total`
  (connectors/observability/observability.py), and the readiness rule: not ready once nothing was
  heard for longer than the session timeout (the group has expired the member), ready again once the
  worker has rejoined and restored (see `WorkerStatus.readiness`);
- idleness never counts an outage (the worker's `_idle` starts again after one);
- `max_outage`: an outage longer than this stops the worker (`BrokerOutage`).
"""

from __future__ import annotations

import logging
import threading
import time
import typing

log = logging.getLogger("streammargin.kafka")


class BrokerOutage(RuntimeError):
    """No broker answered for longer than `--max-outage`; the message names the servers."""


class BrokerContact:
    """Outage bookkeeping of one worker, driven by its main loop (`turn`).

    >>> now = [0.0]
    >>> contact = BrokerContact(session_timeout=10.0, heartbeat_interval=3.0,
    ...                         clock=lambda: now[0], log_lines=False)
    >>> contact.lost_after(member=True)
    7.0
    >>> now[0] = 8.0; contact.turn(member=True)       # nothing heard for 8 s: an outage
    8.0
    >>> contact.in_outage, contact.outages, contact.silent
    (True, 1, True)
    >>> contact.heard(); now[0] = 9.0; contact.turn(member=True)
    1.0
    >>> contact.in_outage, round(contact.last_outage_seconds, 1), contact.quiet_since
    (False, 8.0, 8.0)

    """

    def __init__(
        self,
        session_timeout: float,
        heartbeat_interval: float,
        max_outage: float | None = None,
        summary_every: float = 30.0,
        bootstrap_servers: str = "",
        clock: typing.Callable[[], float] = time.monotonic,
        log_lines: bool = True,
    ):
        self.session_timeout = session_timeout
        self.heartbeat_interval = heartbeat_interval
        self.max_outage = max_outage
        self.summary_every = summary_every
        self.bootstrap_servers = bootstrap_servers
        self._clock = clock
        self._log_lines = log_lines
        self._lock = threading.Lock()
        self._heard = clock()  # the worker starts having just reached the brokers (bootstrap)
        self.source: typing.Callable[[], float | None] | None = None
        self.in_outage = False
        self.silent = False  # at the last `turn`: nothing heard for a heartbeat interval + 1 s
        self.outages = 0
        self.outage_started: float | None = None  # the last contact before the current outage
        self.last_outage_seconds: float | None = None
        # Idleness counts from here: the end of the last outage (or the start).
        self.quiet_since = self._heard
        self._next_summary = 0.0
        self._held_back = 0  # client log lines held back (observability.ClientLogFilter)
        self._held_back_at_start = 0

    # Evidence ---------------------------------------------------------------------------------

    def heard(self, at: float | None = None) -> None:
        """A broker answered at `at` (monotonic; default now)."""
        at = self._clock() if at is None else at
        if at > self._heard:
            self._heard = at

    def held_back(self) -> None:
        """A client log line was held back (shown at --log-level DEBUG only)."""
        with self._lock:
            self._held_back += 1

    @property
    def held_back_lines(self) -> int:
        return self._held_back

    def last_heard(self) -> float:
        """The latest contact, the transport's report included (monotonic seconds)."""
        source = self.source
        if source is not None:
            try:
                reported = source()
            except Exception:  # a client's internals changed: the worker's own evidence stands
                reported = None
            if reported is not None:
                self.heard(reported)
        return self._heard

    def age(self, now: float | None = None) -> float:
        """Seconds since a broker last answered."""
        now = self._clock() if now is None else now
        return max(0.0, now - self.last_heard())

    def lost_after(self, member: bool) -> float:
        """Silence longer than this is an outage (see the module's docstring)."""
        if member:
            return 2 * self.heartbeat_interval + 1.0
        return self.session_timeout + 2 * self.heartbeat_interval

    # The main loop ----------------------------------------------------------------------------

    def turn(self, member: bool, now: float | None = None) -> float:
        """Start, summarise or end an outage, and set `silent`; returns the contact's age.
        Raises `BrokerOutage` beyond `max_outage`."""
        now = self._clock() if now is None else now
        age = self.age(now)
        # A heartbeat missed: idleness, which needs the brokers' word all along, starts again.
        self.silent = age > self.heartbeat_interval + 1.0
        if not self.in_outage:
            if age > self.lost_after(member):
                self._start(now, age)
            return age
        if age <= self.lost_after(True):  # heard again (the tighter bound: it is recent)
            self._end(now)
            return age
        lasted = now - self.outage_started  # type: ignore[operator]
        if self.max_outage is not None and lasted > self.max_outage:
            raise BrokerOutage(
                f"no broker answered for {lasted:.0f} s (--max-outage {self.max_outage:g} s; "
                f"bootstrap servers {self.bootstrap_servers}). Fix: restore the network path to "
                "the brokers, or raise --max-outage; the next start resumes from the last "
                "checkpoint")
        if now >= self._next_summary:
            self._next_summary = now + self.summary_every
            self._say(logging.WARNING,
                      "outage: no broker answered for %.0f s; %d client messages held back "
                      "(--log-level DEBUG shows them)", lasted, self._held_since_start(),
                      outage_seconds=round(lasted, 1))
        return age

    def _start(self, now: float, age: float) -> None:
        self.in_outage = True
        self.outages += 1
        self.outage_started = now - age
        self._held_back_at_start = self._held_back
        self._next_summary = now + self.summary_every
        self._say(logging.WARNING,
                  "lost contact with the brokers (%s): nothing heard for %.1f s; waiting for "
                  "them (the group expires this member after %g s without contact)",
                  self.bootstrap_servers, age, self.session_timeout,
                  outage_seconds=round(age, 1))

    def _end(self, now: float) -> None:
        heard = self.last_heard()
        lasted = heard - self.outage_started  # type: ignore[operator]
        self.in_outage = False
        self.last_outage_seconds = lasted
        self.quiet_since = heard
        expired = lasted > self.session_timeout
        self._say(logging.WARNING,
                  "contact with the brokers restored after %.1f s; %s; %d client messages "
                  "held back", lasted,
                  "the session expired: rejoining the group, each partition resumes from its "
                  "last checkpoint" if expired else "the session held: no rejoin",
                  self._held_since_start(), outage_seconds=round(lasted, 1),
                  session_expired=expired)

    def _held_since_start(self) -> int:
        return self._held_back - self._held_back_at_start

    def _say(self, level: int, message: str, *args: typing.Any, **fields: typing.Any) -> None:
        if self._log_lines:
            log.log(level, message, *args, extra=fields)


class RegistryWait:
    """A Schema Registry that does not answer: an outage of the registry, waited out as one of
    the brokers is (the worker keeps polling its paused partitions, so that it stays in its
    group; nothing is dead-lettered meanwhile).

    The registry is asked again (`due`, then `answered` or `failed`) after 0.5 s, then twice as
    long each time, at most `MAX_PROBE_INTERVAL_S`; one line when the wait starts, a summary at
    most every `summary_every` seconds, one line when it ends. Past `max_outage` seconds,
    `failed` raises `BrokerOutage` (`--max-outage` bounds both kinds of outage).

    >>> now = [0.0]
    >>> wait = RegistryWait("http://registry:8081", "refused", max_outage=None,
    ...                     clock=lambda: now[0], log_lines=False)
    >>> wait.due(), now.__setitem__(0, 0.6), wait.due()
    (False, None, True)
    >>> wait.failed("refused"); wait.next_probe
    1.6
    >>> now[0] = 2.0; round(wait.answered(), 1)
    2.0
    """

    MAX_PROBE_INTERVAL_S = 10.0

    def __init__(self, url: str, reason: str, max_outage: float | None,
                 summary_every: float = 30.0, clock: typing.Callable[[], float] = time.monotonic,
                 log_lines: bool = True):
        self.url = url
        self.reason = reason
        self.max_outage = max_outage
        self.summary_every = summary_every
        self._clock = clock
        self._log_lines = log_lines
        self.since = clock()
        self._interval = 0.5
        self.next_probe = self.since + self._interval
        self._next_summary = self.since + summary_every
        self._say(logging.WARNING,
                  "the Schema Registry at %s does not answer (%s): every partition waits, "
                  "paused, and nothing is dead-lettered meanwhile", url, reason[:300])

    def due(self) -> bool:
        return self._clock() >= self.next_probe

    def failed(self, reason: str) -> None:
        """The registry did not answer again; raises `BrokerOutage` past `max_outage`."""
        now = self._clock()
        self.reason = reason
        lasted = now - self.since
        if self.max_outage is not None and lasted > self.max_outage:
            raise BrokerOutage(
                f"the Schema Registry at {self.url} has not answered for {lasted:.0f} s "
                f"(--max-outage {self.max_outage:g} s; last: {reason[:200]}). Fix: restore the "
                "registry or the network path to it (--schema-registry-url), or raise "
                "--max-outage; the next start resumes from the last checkpoint")
        self._interval = min(2 * self._interval, self.MAX_PROBE_INTERVAL_S)
        self.next_probe = now + self._interval
        if now >= self._next_summary:
            self._next_summary = now + self.summary_every
            self._say(logging.WARNING, "the Schema Registry at %s has not answered for %.0f s "
                      "(%s); still waiting", self.url, lasted, reason[:300],
                      outage_seconds=round(lasted, 1))

    def answered(self) -> float:
        """The registry answers again: the wait's length in seconds (logged)."""
        lasted = self._clock() - self.since
        self._say(logging.WARNING, "the Schema Registry at %s answers again after %.1f s: the "
                  "partitions resume", self.url, lasted, outage_seconds=round(lasted, 1))
        return lasted

    def _say(self, level: int, message: str, *args: typing.Any, **fields: typing.Any) -> None:
        if self._log_lines:
            log.log(level, message, *args, extra=fields)
