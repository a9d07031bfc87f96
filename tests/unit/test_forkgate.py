"""The fork gate without forking: the fork hook waits for the calls into SQLite in flight
and holds new ones back until the fork is over; a call that meets a fork backs off."""

from __future__ import annotations

import threading
import time

from django_fastcache.disk import forkgate

WAIT = 10.0


def test_the_fork_hook_waits_for_calls_in_flight_and_holds_new_ones_back() -> None:
    inside = threading.Event()
    let_go = threading.Event()

    def reader() -> None:
        forkgate.enter()
        inside.set()
        let_go.wait(WAIT)
        forkgate.leave()

    hooked = threading.Event()
    fork_over = threading.Event()

    def forker() -> None:
        forkgate._before_fork()
        hooked.set()
        fork_over.wait(WAIT)
        forkgate._after_fork_in_parent()

    late_entered = threading.Event()

    def late_reader() -> None:
        forkgate.enter()
        late_entered.set()
        forkgate.leave()

    first = threading.Thread(target=reader)
    first.start()
    assert inside.wait(WAIT)
    fork = threading.Thread(target=forker)
    fork.start()
    deadline = time.monotonic() + WAIT
    while not forkgate._forking:  # the hook began
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert not hooked.is_set()  # the reader is still inside SQLite
    late = threading.Thread(target=late_reader)
    late.start()
    let_go.set()
    first.join(WAIT)
    assert hooked.wait(WAIT)  # the reader left: the fork goes ahead
    assert not late_entered.is_set()  # ... and no new call starts meanwhile
    assert forkgate._in_flight(None) == 0
    fork_over.set()
    fork.join(WAIT)
    assert late_entered.wait(WAIT)  # the fork is over: the held-back call goes ahead
    late.join(WAIT)
    assert forkgate._in_flight(None) == 0


def test_nested_calls_count_once_and_end_with_the_outermost() -> None:
    calls_before = forkgate._in_flight(None)
    done = threading.Event()
    counts: list[int] = []

    def nested() -> None:
        forkgate.enter()
        forkgate.enter()
        forkgate.leave()
        counts.append(forkgate._in_flight(None))
        forkgate.leave()
        counts.append(forkgate._in_flight(None))
        done.set()

    thread = threading.Thread(target=nested)
    thread.start()
    assert done.wait(WAIT)
    thread.join(WAIT)
    assert counts == [calls_before + 1, calls_before]
