"""Live progress lines for the command line: a bar, a rate and free-form fields.

On a terminal the line is redrawn in place (carriage return, at most `refresh` times a second);
when the output is a file or a pipe (CI logs), a plain line is printed every `log_every` seconds
instead, so logs stay readable. A dozen lines of code do not warrant a dependency.

A rate is shown only once it means something: measured over at least `MIN_SECONDS`, else the
rate field stays blank ("-/s") rather than show e.g. 1,000 records over a microsecond.

>>> import io
>>> out = io.StringIO()
>>> line = ProgressLine(1250, label="alma ", stream=out)
>>> line.close(1250, rate=float("nan"))          # no rate measured: none shown
>>> line = ProgressLine(1250, label="alma ", stream=out)
>>> line.close(1250, rate=25_000.0)
>>> print(out.getvalue(), end="")
alma [############################] 100.0%     1,250 rec         -/s
alma [############################] 100.0%     1,250 rec    25,000/s
"""

from __future__ import annotations

import math
import sys
import time
import typing

__all__ = ["ProgressLine", "format_table", "MIN_SECONDS"]

#: The shortest interval a rate is measured over; a shorter one is noise.
MIN_SECONDS = 0.05


class ProgressLine:
    def __init__(
        self,
        total: int | None,
        label: str = "",
        stream: typing.TextIO | None = None,
        refresh: float = 0.1,
        log_every: float = 5.0,
        width: int = 28,
    ):
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.interactive = self.stream.isatty()
        self.interval = refresh if self.interactive else log_every
        self.width = width
        self.start = time.perf_counter()
        self._last = 0.0
        self._drawn = False
        self._closed = False
        self.last_done = 0

    def bar(self, done: int) -> str:
        if not self.total:
            return ""
        fraction = min(1.0, done / self.total)
        filled = int(fraction * self.width)
        return f"[{'#' * filled}{'.' * (self.width - filled)}] {fraction:6.1%} "

    def update(
        self, done: int, fields: str = "", force: bool = False, rate: float | None = None
    ) -> None:
        """Redraw with `done` records.

        `rate` is the records/s to show; None measures it from the line's creation; NaN (a rate
        the caller could not measure) shows none.
        """
        self.last_done = done
        now = time.perf_counter()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        if rate is None:
            elapsed = now - self.start
            rate = done / elapsed if elapsed >= MIN_SECONDS else math.nan
        shown = f"{rate:>9,.0f}" if math.isfinite(rate) else f"{'-':>9}"
        text = f"{self.label}{self.bar(done)}{done:>9,} rec {shown}/s {fields}"
        if self.interactive:
            self.stream.write("\r" + text.ljust(110)[:160])
            self._drawn = True
        else:
            self.stream.write(text.rstrip() + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (an event), without breaking the progress line."""
        if self.interactive and self._drawn:
            self.stream.write("\r" + " " * 110 + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()
        self._last = 0.0  # redraw the bar at the next update

    def close(self, done: int, fields: str = "", rate: float | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self.update(done, fields, force=True, rate=rate)
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()


def format_table(headers: list[str], rows: list[list[typing.Any]], floats: str = ".4f") -> str:
    """A plain-text table with right-aligned numeric columns."""

    def cell(value: typing.Any) -> str:
        if isinstance(value, float):
            return format(value, floats)
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)
