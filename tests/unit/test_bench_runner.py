"""The parent side of a cachebench row: which worker error it reports."""

from __future__ import annotations

import queue
from typing import Any

import pytest

from django_fastcache.bench import runner
from django_fastcache.bench.workload import Workload


class FakeProcess:
    """Stands for a worker that has already posted its message and exited cleanly."""

    exitcode = 0

    def __init__(self, **_: Any) -> None:
        pass

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass

    def is_alive(self) -> bool:
        return False


class FakeQueue:
    def __init__(self, messages: list[tuple[Any, ...]]) -> None:
        self._messages = list(messages)

    def get(self, timeout: float | None = None) -> tuple[Any, ...]:
        if not self._messages:
            raise queue.Empty
        return self._messages.pop(0)

    def close(self) -> None:
        pass


class FakeValue:
    value = 0


class FakeBarrier:
    def __init__(self, parties: int) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class FakeContext:
    """The parts of a multiprocessing context run_workers uses, with messages queued."""

    def __init__(self, messages: list[tuple[Any, ...]]) -> None:
        self.messages = messages

    def Barrier(self, parties: int) -> FakeBarrier:
        return FakeBarrier(parties)

    def Value(self, kind: str, initial: int) -> FakeValue:
        return FakeValue()

    def Queue(self) -> FakeQueue:
        return FakeQueue(self.messages)

    def Process(self, **kwargs: Any) -> FakeProcess:
        return FakeProcess(**kwargs)


WORKLOAD = Workload(procs=2, ops=1200, keys=10, warmup=1000)


def _run(messages: list[tuple[Any, ...]]) -> None:
    runner.run_workers(FakeContext(messages), {}, None, WORKLOAD, "row")  # type: ignore[arg-type]


def test_the_real_error_is_reported_even_when_a_broken_barrier_arrives_first() -> None:
    # Worker 0 failed and aborted the barrier; worker 1, woken by the abort, posted first.
    messages = [
        ("error", 1, "BrokenBarrierError (at threading.py:737)"),
        ("error", 0, "RuntimeError: boom (at app.py:1)"),
    ]
    with pytest.raises(runner.RowFailed, match=r"^worker 0 failed: RuntimeError: boom"):
        _run(messages)


def test_a_broken_barrier_alone_is_still_reported() -> None:
    messages = [
        ("error", 0, "BrokenBarrierError (at threading.py:737)"),
        ("error", 1, "BrokenBarrierError (at threading.py:737)"),
    ]
    with pytest.raises(runner.RowFailed, match=r"^worker 0 failed: BrokenBarrierError"):
        _run(messages)


def test_the_first_real_error_is_reported_at_once() -> None:
    messages = [
        ("error", 1, "ValueError: bad (at app.py:2)"),
        ("error", 0, "RuntimeError: boom (at app.py:1)"),
    ]
    with pytest.raises(runner.RowFailed, match=r"^worker 1 failed: ValueError: bad"):
        _run(messages)
