"""The node states' files removed under the processes that map them: a read from disk
stops trusting them at once when another process moved to the new files, and within
CHECK_INTERVAL by its own check otherwise. (Two NodeStates on one directory stand for two
processes.)"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from django_fastcache.disk import nodestate
from django_fastcache.disk.nodestate import NodeStates
from django_fastcache.logs import RateLimit
from django_fastcache.maintenance import follow_state_files

NODES = ("127.0.0.1:11211",)


def _remove_files(directory: Path) -> None:
    """As a temp cleaner would."""
    for name in os.listdir(directory):
        os.unlink(directory / name)


def test_a_process_on_removed_files_stops_trusting_them_once_another_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No check of its own within the test: only the mark left by the other can tell it.
    monkeypatch.setattr(nodestate, "CHECK_INTERVAL", 3600.0)
    a, b = NodeStates(str(tmp_path), NODES), NodeStates(str(tmp_path), NODES)
    written = time.time()
    assert a.trusts(b"key", written)
    assert b.trusts(b"key", written)
    _remove_files(tmp_path)
    a.reopen(time.time())
    assert a.reopened == 1
    assert not b.trusts(b"key", time.time() + 60)
    # B moves in turn: the mark on the pages it leaves is not carried over to the new ones.
    b.reopen(time.time())
    assert b.reopened == 1
    later = time.time() + 1
    assert a.trusts(b"key", later)
    assert b.trusts(b"key", later)
    assert not b.trusts(b"key", written)  # written before the move: distrusted host-wide


def test_a_removal_nobody_moved_from_yet_is_noticed_by_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodestate, "CHECK_INTERVAL", 0.0)
    states = NodeStates(str(tmp_path), NODES)
    assert states.trusts(b"key", time.time())
    _remove_files(tmp_path)
    assert not states.trusts(b"key", time.time() + 60)
    states.reopen(time.time())
    assert states.trusts(b"key", time.time() + 1)


def test_a_flush_asked_for_is_shared_and_carried_to_the_new_files(tmp_path: Path) -> None:
    a, b = NodeStates(str(tmp_path), NODES), NodeStates(str(tmp_path), NODES)
    a.mark_out(0)
    a.must_flush(0)
    assert b.flush_needed(0)
    _remove_files(tmp_path)
    b.reopen(time.time())  # the new files are made: they ask for the flush too
    assert NodeStates(str(tmp_path), NODES).flush_needed(0)
    b.flushing(0)
    assert NodeStates(str(tmp_path), NODES).flush_needed(0)  # until the flush is done
    b.flush_done(0)
    assert not NodeStates(str(tmp_path), NODES).flush_needed(0)


def test_a_flush_taken_by_a_replay_that_never_finished_is_still_asked(tmp_path: Path) -> None:
    # A replay killed between taking the request and flushing (SIGKILL: no handler runs)
    # leaves it asked, on these files and on new ones made after a removal.
    replaying, other = NodeStates(str(tmp_path), NODES), NodeStates(str(tmp_path), NODES)
    replaying.must_flush(0)
    replaying.flushing(0)  # ...and the process dies here
    assert other.flush_needed(0)
    _remove_files(tmp_path)
    other.reopen(time.time())
    assert NodeStates(str(tmp_path), NODES).flush_needed(0)
    # A request made while a replay flushes stays for the next one.
    other.flushing(0)
    other.must_flush(0)
    other.flush_done(0)
    assert other.flush_needed(0)


def test_moving_onto_files_whose_page_names_another_journal_asks_for_a_flush(
    tmp_path: Path,
) -> None:
    # The directory was removed mid-outage; a process started since journaled the node's
    # writes in the new journal (22), this one in the removed one (11). A replay of 22
    # alone would miss 11's keys: the node's replay flushes it, and the page keeps 11, which
    # this process's carry-over (22 carried from 11) accepts.
    moving = NodeStates(str(tmp_path), NODES)
    moving.mark_out(0)
    moving.journaled_in(0, 11)
    _remove_files(tmp_path)
    started_since = NodeStates(str(tmp_path), NODES)
    started_since.mark_out(0)
    started_since.journaled_in(0, 22)
    assert not started_since.flush_needed(0)
    moving.reopen(time.time())
    assert started_since.flush_needed(0)
    assert started_since.journal_of(0) == 11


def test_moving_onto_files_whose_page_names_no_journal_asks_for_no_flush(
    tmp_path: Path,
) -> None:
    moving = NodeStates(str(tmp_path), NODES)
    moving.mark_out(0)
    moving.journaled_in(0, 11)
    _remove_files(tmp_path)
    moving.reopen(time.time())
    assert not NodeStates(str(tmp_path), NODES).flush_needed(0)


def test_the_journal_of_an_outage_is_shared_carried_to_new_files_and_forgotten_once_up(
    tmp_path: Path,
) -> None:
    a, b = NodeStates(str(tmp_path), NODES), NodeStates(str(tmp_path), NODES)
    assert a.journal_of(0) == 0
    a.mark_out(0)
    a.journaled_in(0, 77)
    assert b.journal_of(0) == 77
    _remove_files(tmp_path)
    b.reopen(time.time())
    assert NodeStates(str(tmp_path), NODES).journal_of(0) == 77
    b.mark_up(0)
    assert NodeStates(str(tmp_path), NODES).journal_of(0) == 0


@pytest.mark.parametrize("lost", ["removed", "truncated"])
def test_a_page_no_process_checked_stays_unchecked_until_one_does(
    tmp_path: Path, lost: str
) -> None:
    # What every starting process asks the journal about (a page lost while no process
    # ran), whether it made the page or another did and died before checking it.
    made = NodeStates(str(tmp_path), NODES)
    assert made.unchecked() == list(range(len(NODES)))
    assert NodeStates(str(tmp_path), NODES).unchecked() == list(range(len(NODES)))
    made.checked(0)
    assert NodeStates(str(tmp_path), NODES).unchecked() == []
    page = next(p for p in tmp_path.iterdir() if p.name != "distrust.state")
    if lost == "removed":
        page.unlink()
    else:
        os.truncate(page, 0)
    states = NodeStates(str(tmp_path), NODES)
    assert states.unchecked() == [0]
    assert not states.is_out(0)


def test_writes_of_one_outage_in_two_journals_ask_for_a_flush(tmp_path: Path) -> None:
    states = NodeStates(str(tmp_path), NODES)
    states.mark_out(0)
    states.journaled_in(0, 11)
    states.journaled_in(0, 11)
    assert not states.flush_needed(0)
    states.journaled_in(0, 22, carried_from=11)  # carried over: nothing lost
    assert not states.flush_needed(0)
    states.journaled_in(0, 33, carried_from=11)  # 22's writes were carried by no one
    assert states.flush_needed(0)
    assert states.journal_of(0) == 33


def test_a_node_out_carried_onto_files_where_it_was_up_goes_out_anew(tmp_path: Path) -> None:
    # A moves first and brings the node back there; B, still on the removed files where it
    # is out, moves next. The node goes out again with a count of its own: an epoch read
    # before B's move is not the epoch once the node is back again.
    a, b = NodeStates(str(tmp_path), NODES), NodeStates(str(tmp_path), NODES)
    a.mark_out(0)
    _remove_files(tmp_path)
    a.reopen(time.time())
    a.mark_up(0)
    before = a.epoch(0)
    b.reopen(time.time())
    assert a.is_out(0)
    a.mark_up(0)
    assert a.epoch(0) != before


def test_a_node_page_removed_after_a_process_made_it_again_is_noticed(tmp_path: Path) -> None:
    # A temp cleaner lists the files, removes the distrust page; A moves at once, making
    # both pages again; the cleaner then removes the node page path it listed, which is
    # A's new one. B moves next and makes another node page beside A's distrust page. A
    # must notice, or the two would never see each other's outages again.
    a, b = NodeStates(str(tmp_path), NODES), NodeStates(str(tmp_path), NODES)
    node_page = next(tmp_path / n for n in os.listdir(tmp_path) if n != "distrust.state")
    os.unlink(tmp_path / "distrust.state")
    a.reopen(time.time())
    os.unlink(node_page)
    b.reopen(time.time())
    assert a.replaced()
    a.reopen(time.time())
    a.mark_out(0)
    assert b.is_out(0)


def test_files_that_were_not_replaced_are_never_marked(tmp_path: Path) -> None:
    a, b = NodeStates(str(tmp_path), NODES), NodeStates(str(tmp_path), NODES)
    a.reopen(time.time())  # nothing replaced: nothing to do
    assert a.reopened == 0
    assert b.trusts(b"key", time.time() + 1)


def test_the_epoch_changes_whenever_the_node_goes_out_or_comes_back(tmp_path: Path) -> None:
    # What a read compares before its request and after its reply (TieredStore.went_out).
    states, other = NodeStates(str(tmp_path), NODES), NodeStates(str(tmp_path), NODES)
    seen = [states.epoch(0)]
    assert not seen[-1] & 1  # up
    for change in (other.mark_out, other.mark_up, other.mark_out, other.mark_up):
        change(0)
        seen.append(states.epoch(0))  # another process's change, seen here
    assert [e & 1 for e in seen] == [0, 1, 0, 1, 0]
    assert len(set(seen)) == len(seen)  # out and back twice: no epoch comes back
    assert states.outages(0) == 2


def test_an_epoch_read_halfway_through_marking_out_reads_out_and_unlike_any_other(
    tmp_path: Path,
) -> None:
    states = NodeStates(str(tmp_path), NODES)
    before = states.epoch(0)
    page = states._maps[0]
    # mark_out sets the state byte first, then the count: read between the two.
    page[0] = nodestate._OUT
    halfway = states.epoch(0)
    nodestate._COUNT.pack_into(page, nodestate._OUTAGES, states.outages(0) + 1)
    out = states.epoch(0)
    states.mark_up(0)
    back = states.epoch(0)
    assert halfway & 1  # out: no request is sent on it
    # A request that read the halfway epoch sees the node's return as a change.
    assert len({before, halfway, out, back}) == 4


def test_an_epoch_read_across_marking_out_is_not_the_epoch_of_the_node_back(
    tmp_path: Path,
) -> None:
    # epoch() makes two reads; the node is marked out between them. What it read must not
    # be the epoch the node has once it is back: a request reading that epoch before and
    # after its reply would miss the outage.
    states = NodeStates(str(tmp_path), NODES)
    page = states._words[0]
    reads: list[int] = []

    class MarkedOutBetweenReads:
        def __getitem__(self, index: int) -> int:
            value = int(page[index])
            reads.append(index)
            if len(reads) == 1:
                states.mark_out(0)
            return value

    states._words[0] = MarkedOutBetweenReads()  # type: ignore[call-overload]
    read_across = states.epoch(0)
    states._words[0] = page
    assert len(reads) == 2
    states.mark_up(0)
    assert read_across != states.epoch(0)


def test_mark_out_sets_the_state_before_the_count(tmp_path: Path) -> None:
    # The order the test above relies on, as mark_out writes it.
    states = NodeStates(str(tmp_path), NODES)
    counts_when_state_set: list[int] = []

    class Page(bytearray):
        def __setitem__(self, index: Any, value: Any) -> None:
            counts_when_state_set.append(nodestate._COUNT.unpack_from(self, nodestate._OUTAGES)[0])
            super().__setitem__(index, value)

    states._maps[0] = Page(bytes(states._maps[0]))  # type: ignore[call-overload]
    assert states.mark_out(0)
    assert counts_when_state_set == [0]
    assert states._maps[0][0] == nodestate._OUT
    assert nodestate._COUNT.unpack_from(states._maps[0], nodestate._OUTAGES)[0] == 1


# -- files that cannot be mapped: never states of the process's own ----------------------------


def test_states_that_cannot_be_mapped_refuse_to_start_naming_the_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "distrust.state").mkdir()  # in the way of the file
    with pytest.raises(OSError, match="cannot be mapped") as raised:
        NodeStates(str(tmp_path), NODES)
    assert str(tmp_path) in str(raised.value)


def test_a_reopen_that_cannot_map_the_new_files_keeps_the_old_and_tries_again(
    tmp_path: Path,
) -> None:
    states, other = NodeStates(str(tmp_path), NODES), NodeStates(str(tmp_path), NODES)
    _remove_files(tmp_path)
    (tmp_path / "distrust.state").mkdir()  # the new files cannot be made now
    assert states.replaced()
    with pytest.raises(OSError, match="cannot be mapped"):
        states.reopen(time.time())
    other.mark_out(0)  # on the old pages, which both still share
    assert states.is_out(0)
    assert states.replaced()  # the next check tries again
    (tmp_path / "distrust.state").rmdir()
    states.reopen(time.time())
    assert not states.replaced()
    assert states.is_out(0)  # what it knew is carried over
    assert states.reopened == 1


def test_the_maintenance_check_survives_a_reopen_that_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Untouched:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"{name} used after a failed reopen")

    class Stamps:
        def replaced(self) -> bool:
            return False  # (the stamps anchor is still checked)

    states = NodeStates(str(tmp_path), NODES)
    store = SimpleNamespace(
        states=states,
        directory=str(tmp_path),
        disk=Untouched(),
        stamps=Stamps(),
        _warnings=RateLimit(),
    )
    _remove_files(tmp_path)
    (tmp_path / "distrust.state").mkdir()
    with caplog.at_level(logging.WARNING, logger="django_fastcache"):
        follow_state_files(store)  # type: ignore[arg-type]
        follow_state_files(store)  # type: ignore[arg-type]
    warnings = [r for r in caplog.records if "cannot be mapped" in r.getMessage()]
    assert len(warnings) == 1  # once, then rate-limited
    assert states.replaced()
