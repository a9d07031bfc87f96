"""Progress per backend on stderr, fed by a counter the workers share.

On a terminal, one bar redrawn in place. Anywhere else (a pipe, a log file, CI) a plain line
every :data:`LOG_SECONDS`, so a long row is never silent: a redrawn bar there would be
either hundreds of carriage returns or nothing until the row ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Stream(Protocol):
    """Where text goes: a file, sys.stderr, or a management command's output adapter."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


BAR_WIDTH = 30
# Redraw at most this often: a terminal repaint per poll is noise, not information.
REDRAW_SECONDS = 0.2
# One line this often when the stream is not a terminal.
LOG_SECONDS = 10.0


def _duration(seconds: float) -> str:
    if seconds >= 60:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes}m{rest:02d}s"
    return f"{seconds:.0f}s"


class ProgressBar:
    """``name [#####.....]  45%  360000/800000  12.3s`` redrawn in place on a terminal;
    ``name  45%  360000/800000  12s elapsed, about 15s left`` every few seconds elsewhere.
    """

    def __init__(
        self,
        stream: Stream,
        label: str,
        total: int,
        *,
        enabled: bool = True,
        log_seconds: float = LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.label = label
        self.total = max(total, 1)
        self.enabled = enabled
        self.log_seconds = log_seconds
        self._clock = clock
        isatty = getattr(stream, "isatty", None)
        self.live = enabled and bool(isatty and isatty())
        self.started = clock()
        self._last_draw = self.started
        self._done = 0

    def _line(self, done: int, suffix: str = "") -> str:
        fraction = min(done / self.total, 1.0)
        filled = int(BAR_WIDTH * fraction)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        elapsed = self._clock() - self.started
        text = f"{self.label:<18} [{bar}] {fraction:4.0%} {done:>9}/{self.total:<9} {elapsed:6.1f}s"
        return f"{text} {suffix}".rstrip()

    def _log_line(self, done: int) -> str:
        fraction = min(done / self.total, 1.0)
        elapsed = self._clock() - self.started
        counts = f"{fraction:4.0%} {done:>9}/{self.total:<9}"
        text = f"{self.label:<18} {counts} {_duration(elapsed)} elapsed"
        if 0 < done < self.total:
            left = elapsed * (self.total - done) / done
            text += f", about {_duration(left)} left"
        return text

    def update(self, done: int) -> None:
        self._done = done
        if not self.enabled:
            return
        now = self._clock()
        if self.live:
            if now - self._last_draw < REDRAW_SECONDS:
                return
            self._last_draw = now
            self.stream.write("\r" + self._line(done))
        else:
            if now - self._last_draw < self.log_seconds:
                return
            self._last_draw = now
            self.stream.write(self._log_line(done) + "\n")
        self.stream.flush()

    def finish(self, status: str = "done") -> None:
        if not self.enabled:
            return
        prefix = "\r" if self.live else ""
        self.stream.write(prefix + self._line(self._done, status) + "\n")
        self.stream.flush()
