"""A one-line progress bar per backend on stderr, fed by a counter the workers share."""

from __future__ import annotations

import time
from typing import Protocol


class Stream(Protocol):
    """Where text goes: a file, sys.stderr, or a management command's output adapter."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


BAR_WIDTH = 30
# Redraw at most this often: a terminal repaint per poll is noise, not information.
REDRAW_SECONDS = 0.2


class ProgressBar:
    """``name [#####.....]  45%  360000/800000  12.3s`` redrawn in place.

    On a stream that is not a terminal (a log, a test's captured stderr) only the final
    line is written: carriage-return repaints would fill it with hundreds of lines.
    """

    def __init__(self, stream: Stream, label: str, total: int, *, enabled: bool = True) -> None:
        self.stream = stream
        self.label = label
        self.total = max(total, 1)
        self.enabled = enabled
        isatty = getattr(stream, "isatty", None)
        self.live = enabled and bool(isatty and isatty())
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._done = 0

    def _line(self, done: int, suffix: str = "") -> str:
        fraction = min(done / self.total, 1.0)
        filled = int(BAR_WIDTH * fraction)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        elapsed = time.monotonic() - self.started
        text = f"{self.label:<18} [{bar}] {fraction:4.0%} {done:>9}/{self.total:<9} {elapsed:6.1f}s"
        return f"{text} {suffix}".rstrip()

    def update(self, done: int) -> None:
        self._done = done
        if not self.live:
            return
        now = time.monotonic()
        if now - self._last_draw < REDRAW_SECONDS:
            return
        self._last_draw = now
        self.stream.write("\r" + self._line(done))
        self.stream.flush()

    def finish(self, status: str = "done") -> None:
        if not self.enabled:
            return
        prefix = "\r" if self.live else ""
        self.stream.write(prefix + self._line(self._done, status) + "\n")
        self.stream.flush()
